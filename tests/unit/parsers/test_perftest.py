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
    # perftest's own failure is read as a failure (issue 30), a line it never prints is not
    failed = parse_perftest_bw(text.replace(" Data ex. method : Ethernet",
                                            " Couldn't connect to 10.0.0.1:18515"))
    assert failed.failed and [(e.line_no, e.text) for e in failed.errors] == [
        (15, "Couldn't connect to 10.0.0.1:18515")]
    with pytest.raises(ParseError) as exc:
        parse_perftest_bw(text.replace(" Data ex. method : Ethernet", " a line of prose here"))
    assert exc.value.line_no == 15
    with pytest.raises(ParseError):
        parse_perftest_bw(" #bytes     #iterations\n 8  10  1.0 1.0 1.0\n")
    rows = (" #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n"
            " 8  10  1.0  1.0  1.0\n 8  10  2.0  2.0  1.0\n")
    with pytest.raises(ParseError) as exc:
        parse_perftest_bw(" RDMA_Write BW Test\n" + rows)
    assert exc.value.line_no == 4


HEAD_MB = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"


def _error(text: str) -> tuple[object, ...]:
    with pytest.raises(ParseError) as exc:
        parse_perftest_bw(text, source="raw/ib_write_bw.txt")
    e = exc.value
    return e.kind, e.what, e.line_no, e.line, e.source


def _what(line_no: int | None, what: str, line: str | None = None) -> str:
    at = "raw/ib_write_bw.txt" + ("" if line_no is None else f":{line_no}")
    return f"cannot parse perftest-bw output at {at}: {what}" + (
        "" if line is None else f"\n  line: {line.rstrip()!r}")


def test_a_post_list_run_whole(public) -> None:
    facts = parse_perftest_bw(public("ib_write_bw_post-list-8B_perftest273.txt"))
    assert facts.model_dump() == {
        "test": "RDMA_Write Post List BW Test",
        "settings": {"dual_port": "OFF", "device": "ib0", "qps": "1", "transport": "IB",
                     "connection": "RC", "srq": "OFF", "pcie_relax_order": "Unsupported",
                     "ibv_wr_api": "OFF", "tx_depth": "256", "post_list": "128",
                     "cq_moderation": "128", "mtu": "4096[B]", "link_type": "Ethernet",
                     "gid_index": "2", "max_inline": "0[B]", "rdma_cm": "OFF",
                     "exchange": "Ethernet"},
        "unit": "Gb/sec",
        "rows": [{"line_no": 18, "bytes": 8, "iterations": 224958464, "bw_peak": 0.0,
                  "bw_average": 0.48, "msg_rate_mpps": 7.498617}],
        "repeated": 0, "gpu": None, "errors": [], "failed_status": None, "syndrome": None}
    assert facts.largest is not None and facts.largest.line_no == 18
    assert facts.average_at(8) == 0.48 and facts.average_at(16) is None


def test_the_first_title_and_setting_stand_and_unknown_settings_keep_their_name() -> None:
    text = ("                    Send Bidirectional BW Test\n"
            "                    RDMA_Read BW Test\n"
            " TX depth        : 128\n TX depth        : 256\n"
            " Some New Knob   : 3 ways\n" + HEAD_MB + "\n"
            " 65536   5000   11000.50   10999.25   0.167834\n"
            " 2       5000   10.00      9.50       4.9\n"
            " 65536   5000   11001.00   10999.25   0.167900\n"
            " 2       5000   10.00      9.50       4.9\n")
    facts = parse_perftest_bw(text)
    assert facts.test == "Send Bidirectional BW Test" and facts.bidirectional
    assert facts.settings == {"tx_depth": "128", "Some New Knob": "3 ways"}
    assert [(r.bytes, r.line_no, r.bw_peak) for r in facts.rows] == [(65536, 7, 11000.5),
                                                                    (2, 8, 10.0)]
    assert facts.repeated == 2 and facts.unit == "MB/sec"
    assert facts.largest is not None and facts.largest.bytes == 65536
    assert facts.average_at(2) == 9.5
    assert parse_perftest_bw(" RDMA_Write BW Test\n").largest is None
    assert not parse_perftest_bw(" RDMA_Write BW Test\n").bidirectional
    rows_only = parse_perftest_bw(HEAD_MB + "\n 8  10  1.0  1.0  1.0\n")
    assert (rows_only.test, len(rows_only.rows)) == (None, 1)


def test_a_second_heading_in_the_same_unit_is_the_same_table() -> None:
    text = " RDMA_Write BW Test\n" + HEAD_MB + "\n\n" + HEAD_MB + "\n 8  10  1.0  1.0  1.0\n"
    facts = parse_perftest_bw(text)
    assert (facts.unit, [(r.bytes, r.line_no) for r in facts.rows]) == ("MB/sec", [(8, 5)])


def test_every_error_names_the_kind_the_file_and_the_line() -> None:
    mixed = " #bytes  #iterations  BW peak[Gb/sec]  BW average[MB/sec]  MsgRate[Mpps]"
    head_gb = HEAD_MB.replace("MB/sec", "Gb/sec")
    cases = [
        (" RDMA_Write BW Test\n" + mixed + "\n", 2, "peak and average in different units",
         mixed),
        (" RDMA_Write BW Test\n" + HEAD_MB + "\n" + head_gb + "\n", 3,
         "a second table in another unit", head_gb),
        (" RDMA_Write BW Test\n 8  10  1.0  1.0  1.0\n", 2,
         "a result row before the table's heading", " 8  10  1.0  1.0  1.0"),
        (" RDMA_Write BW Test\n" + HEAD_MB + "\n 8  10  1.0  1.0  1.0\n 8  10  1.0  2.0  1.0\n",
         4, "two different results for 8 bytes", " 8  10  1.0  2.0  1.0"),
        (" RDMA_Write BW Test\n" + HEAD_MB + "\n 8  10  1.0  1.0  1.0\n 8  11  1.0  1.0  1.0\n",
         4, "two different results for 8 bytes", " 8  11  1.0  1.0  1.0"),
        (" RDMA_Write BW Test\n Dual-port : OFF   ???\n", 2,
         "not a perftest setting, heading or result row", " Dual-port : OFF   ???"),
        (" RDMA_Write BW Test\n connection refused!\n", 2,
         "not a perftest setting, heading or result row", " connection refused!"),
    ]
    for text, line_no, what, line in cases:
        assert _error(text) == ("perftest-bw", _what(line_no, what, line), line_no, line,
                                "raw/ib_write_bw.txt"), what
    assert _error("\n\n") == ("perftest-bw", _what(None, "empty output"), None, None,
                              "raw/ib_write_bw.txt")
    assert _error(" TX depth : 128\n") == (
        "perftest-bw", _what(None, "no `... BW Test` title and no results: not perftest's output"),
        None, None, "raw/ib_write_bw.txt")
