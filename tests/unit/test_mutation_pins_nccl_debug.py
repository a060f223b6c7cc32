"""NCCL debug lines the captures do not hold, each read on exact values.

tests/unit/test_mutation_pins_nccl_parsers.py pins every capture's facts whole; these are
the shapes around them: a log with no version line, a version without its CUDA suffix, the
ABORT and ERROR levels, a bootstrap interface with an IPv6 address, connection lines cut
short, a comm line printed twice, an elision, and the refusal of a log without INFO lines.
"""

from __future__ import annotations

import pytest

from orchestrator.errors import ParseError
from orchestrator.parsers.nccl_debug import NcclInterface, parse_nccl_debug

H = "gpu-a:4100:4100 [0] NCCL INFO "


def test_a_log_without_any_version_line() -> None:
    f = parse_nccl_debug(H + "comm 0x5 rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0 MNNVL 0\n")
    assert (f.nccl_version, f.nccl_cuda, f.versions) == (None, None, [])
    assert f.summary() == "NCCL ?, 2 rank(s) on 1 node(s), transports: none seen"


@pytest.mark.parametrize(("line", "version", "cuda"), [
    (H + "NCCL version 2.18.5", "2.18.5", None),
    (H + "NCCL version 2.18.5-1", "2.18.5", None),
    (H + "NCCL version 2.18.5+cuda12.2", "2.18.5", "12.2"),
    ("NCCL version 2.18.5", "2.18.5", None),
    ("NCCL version 2.18.5-1", "2.18.5", None),
    ("NCCL version 2.18.5+cuda12.2", "2.18.5", "12.2"),
])
def test_a_version_with_or_without_its_cuda_suffix(line: str, version: str,
                                                    cuda: str | None) -> None:
    f = parse_nccl_debug(line + "\n" + H + "Using network Socket\n")
    assert (f.nccl_version, f.nccl_cuda) == (version, cuda)
    assert [(v.version, v.cuda) for v in f.versions] == [(version, cuda)]


def test_abort_and_error_lines_are_warnings_and_trace_is_not() -> None:
    text = "\n".join([
        H + "Using network IB",
        "gpu-a:4100:4190 [0] NCCL ABORT transport/net_ib.cc:1696 NCCL ABORT cqe error",
        "gpu-a:4100:4190 [0] NCCL ERROR init.cc:1120 -> 3",
        "gpu-a:4100:4190 [0] NCCL TRACE proxy.cc:77 progress",
        "gpu-a:4100:4190 [0] misc/socket.cc:484 NCCL WARN socketStartConnect: timed out",
    ])
    f = parse_nccl_debug(text)
    assert [(w.line_no, w.kind, w.text.split(" [0] ")[1]) for w in f.warnings] == [
        (2, "nccl-abort", "NCCL ABORT transport/net_ib.cc:1696 NCCL ABORT cqe error"),
        (3, "nccl-error", "NCCL ERROR init.cc:1120 -> 3"),
        (5, "nccl-warn", "misc/socket.cc:484 NCCL WARN socketStartConnect: timed out")]
    assert f.info_lines == 1


def test_a_bootstrap_interface_with_an_ipv6_address() -> None:
    f = parse_nccl_debug(H + "Bootstrap : Using eth0:fe80::a00:27ff:fe4e:66a1%eth0<0>\n")
    assert f.interfaces == [NcclInterface(host="gpu-a", kind="Bootstrap", index=None,
                                          name="eth0", address="fe80::a00:27ff:fe4e:66a1%eth0<0>")]


def test_connection_lines_cut_short_of_their_details() -> None:
    text = "\n".join([
        H + "Channel 00/0 : 0[0] -> 1[1] via NET",
        H + "Channel 01/0 : 0[0] -> 1[1] [send] via NET/IBext",
        H + "Channel 02/0 : 0[0] -> 1[1] [receive] via NET/IBext/GDRDMA",
        H + "Channel 03/0 : 0[0] -> 1[1] via NVLS",
    ])
    f = parse_nccl_debug(text)
    assert [(c.channel, c.direction, c.transport, c.detail, c.net, c.gdrdma)
            for c in f.connections] == [
        (0, None, "NET", "", None, False), (1, "send", "NET", "IBext", "IBext", False),
        (2, "receive", "NET", "IBext/GDRDMA", "IBext", True), (3, None, "NVLS", "", None, False)]
    assert f.used == ["NET", "NET/IBext", "NVLS"] and f.gdrdma


def test_a_comm_line_printed_twice_is_one_comm() -> None:
    line = H + "comm 0x5 rank 0 nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0"
    f = parse_nccl_debug("\n".join([line, line]))
    assert [(c.host, c.comm, c.rank, c.n_ranks, c.n_nodes, c.local_ranks, c.local_rank)
            for c in f.comms] == [("gpu-a", "0x5", 0, 2, 2, 1, 0)]
    assert (f.n_ranks, f.n_nodes, f.info_lines) == (2, 2, 2)


def test_an_elision_is_an_edit() -> None:
    f = parse_nccl_debug("\n".join([H + "Using network Socket", "[...]", "some other text"]))
    assert [(e.line_no, e.what) for e in f.edits] == [
        (2, "an elision mark ('[...]'): lines were cut out here")]
    assert [(i.line_no, i.kind) for i in f.ignored_lines] == [(2, "elision")]
    assert f.other_lines == 1


def test_a_log_without_info_lines_is_refused() -> None:
    with pytest.raises(ParseError) as info:
        parse_nccl_debug("gpu-a:4100:4100 [0] NCCL WARN no GPU\n", source="run.log")
    exc = info.value
    assert (exc.kind, str(exc).splitlines()[0], exc.line_no, exc.line, exc.source) == (
        "nccl-debug", "cannot parse nccl-debug output at run.log: no `NCCL INFO` line: was the "
        "run made with NCCL_DEBUG=INFO?", None, None, "run.log")
