"""perftest bandwidth outputs: Gb/sec and MB/sec, a post-list test, a loopback run
whose server and client wrote into one stream."""

from __future__ import annotations

import pytest

from orchestrator.errors import ParseError
from orchestrator.parsers import get, parse
from orchestrator.parsers.perftest import parse_perftest_bw


def test_registered() -> None:
    assert get("perftest-bw").func is parse_perftest_bw


def test_a_post_list_write_test_in_gbits(public) -> None:
    facts = parse("perftest-bw", public("ib_write_bw_post-list-8B_perftest273.txt"))
    assert facts.test == "RDMA_Write Post List BW Test" and facts.unit == "Gb/sec"
    s = facts.settings
    assert (s["device"], s["link_type"], s["qps"], s["post_list"], s["rdma_cm"]) == (
        "ib0", "Ethernet", "1", "128", "OFF")
    (row,) = facts.rows
    assert (row.bytes, row.iterations, row.bw_average, row.msg_rate_mpps) == (
        8, 224958464, 0.48, 7.498617)


def test_a_read_test_in_mbytes_cut_short(public) -> None:
    facts = parse_perftest_bw(public("ib_read_bw_all-sizes-cut_ucx8851.txt"))
    assert facts.test == "RDMA_Read BW Test" and facts.unit == "MB/sec"
    assert facts.settings["outstanding_reads"] == "16" and facts.settings["mtu"] == "4096[B]"
    assert [r.bytes for r in facts.rows] == [2, 4, 8] and facts.average_at(8) == 19.50


def test_a_loopback_run_interleaved(public) -> None:
    facts = parse_perftest_bw(public("ib_write_bw_loopback-interleaved_superbench.log"))
    assert facts.test == "RDMA_Write BW Test" and not facts.bidirectional
    assert len(facts.rows) == 23 and facts.repeated == 1
    assert facts.largest is not None and facts.largest.bw_average == 23240.68
    assert facts.settings["link_type"] == "IB"


def test_what_is_not_perftest(public) -> None:
    text = public("ib_write_bw_post-list-8B_perftest273.txt")
    with pytest.raises(ParseError) as exc:
        parse_perftest_bw(text.replace(" Data ex. method : Ethernet",
                                       " Couldn't connect to 10.0.0.1:18515"))
    assert exc.value.line_no == 15
    with pytest.raises(ParseError):
        parse_perftest_bw(" #bytes     #iterations\n 8  10  1.0 1.0 1.0\n")
    rows = (" #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n"
            " 8  10  1.0  1.0  1.0\n 8  10  2.0  2.0  1.0\n")
    with pytest.raises(ParseError) as exc:
        parse_perftest_bw(" RDMA_Write BW Test\n" + rows)
    assert exc.value.line_no == 4
