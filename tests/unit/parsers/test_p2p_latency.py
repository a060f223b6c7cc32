"""cuda-samples p2pBandwidthLatencyTest: 2, 4, 6 and 8 GPUs over PCIe and NVLink,
whole and cut short."""

from __future__ import annotations

import pytest

from orchestrator.errors import ParseError
from orchestrator.parsers import get, parse
from orchestrator.parsers.p2p_latency import parse_p2p


def test_registered() -> None:
    assert get("p2pBandwidthLatencyTest").func is parse_p2p


def test_two_4090s_over_pcie_cut_in_the_last_matrix(public) -> None:
    facts = parse("p2pBandwidthLatencyTest",
                  public("p2pBandwidthLatencyTest_2x-rtx4090-cut_tinygrad44.txt"))
    assert [(d.index, d.name, d.pci_bus) for d in facts.devices] == [
        (0, "NVIDIA GeForce RTX 4090", 2), (1, "NVIDIA GeForce RTX 4090", 0x17)]
    assert facts.access == {"0->1": True, "1->0": True}
    uni = facts.matrix("bandwidth", p2p=True, direction="unidirectional")
    assert uni is not None and uni.method == "writes" and uni.values[0][1] == 6.60
    last = facts.matrix("bandwidth", p2p=True, direction="bidirectional")
    assert last is not None and not last.complete and last.values == [[1016.92, 12.88]]
    conn = facts.matrix("connectivity")
    assert conn is not None and conn.values == [[1.0, 1.0], [1.0, 1.0]]


def test_eight_h100s_behind_nvswitch_all_alike(public) -> None:
    facts = parse_p2p(public("p2pBandwidthLatencyTest_8x-h100-sxm-cut_nccl1264.txt"))
    off = facts.matrix("bandwidth", p2p=False).off_diagonal()  # type: ignore[union-attr]
    assert len(off) == 56 and min(off) > 36.0 and max(off) < 38.1


def test_six_gpus_where_peer_writes_are_slower_than_staged_copies(public) -> None:
    facts = parse_p2p(public("p2pBandwidthLatencyTest_6gpu-pcie-cut_nccl814.txt"))
    off = facts.matrix("bandwidth", p2p=False).off_diagonal()  # type: ignore[union-attr]
    writes = facts.matrix("bandwidth", p2p=True, method="writes")
    reads = facts.matrix("bandwidth", p2p=True, method="reads")
    assert writes is not None and reads is not None and reads.values[3][2] == 10.45
    assert max(writes.off_diagonal()) < min(off)


def test_device_list_and_access_of_four_v100s(public) -> None:
    facts = parse_p2p(public("p2pBandwidthLatencyTest_4x-v100-sxm2-header_ginkgo164.txt"))
    assert len(facts.devices) == 4 and len(facts.access) == 12 and all(facts.access.values())
    assert facts.devices[2].pci_bus == 0x88


def test_latency_tables_gpu_and_cpu(public) -> None:
    facts = parse_p2p(public("p2pBandwidthLatencyTest_4gpu-latency_cudasamples230-derived.txt"))
    gpu = facts.matrix("latency", p2p=True, side="GPU")
    cpu = facts.matrix("latency", p2p=False, side="CPU")
    assert gpu is not None and gpu.unit == "us" and gpu.values[2][0] == 1.81
    assert cpu is not None and cpu.values[3][3] == 2.49


def test_a_whole_run_with_one_way_peer_access(synth) -> None:
    facts = parse_p2p(synth("p2pBandwidthLatencyTest_2x-h100-nvlink-complete.txt"))
    assert facts.access == {"0->1": True, "1->0": False}
    assert all(m.complete for m in facts.matrices) and len(facts.matrices) == 9
    lat = facts.matrix("latency", p2p=True, side="GPU")
    assert lat is not None and lat.values[0][1] == 2.61 and lat.values[1][0] == 21.38


def test_rows_that_do_not_fit(public) -> None:
    text = public("p2pBandwidthLatencyTest_2x-rtx4090-cut_tinygrad44.txt")
    with pytest.raises(ParseError) as exc:
        parse_p2p(text.replace("     1   6.34 926.75 ", "     1   6.34 "))
    assert exc.value.line_no == 17
    with pytest.raises(ParseError):
        parse_p2p("   D\\D     0      1\n     0 1.0 2.0\n")
    with pytest.raises(ParseError):
        parse_p2p("")


WHOLE = "p2pBandwidthLatencyTest_2x-h100-nvlink-complete.txt"


def _error(text: str) -> tuple[object, ...]:
    with pytest.raises(ParseError) as exc:
        parse_p2p(text, source="raw/p2p.txt")
    e = exc.value
    return e.kind, e.what, e.line_no, e.line, e.source


def _what(line_no: int | None, what: str, line: str | None = None) -> str:
    at = "raw/p2p.txt" + ("" if line_no is None else f":{line_no}")
    return f"cannot parse p2pBandwidthLatencyTest output at {at}: {what}" + (
        "" if line is None else f"\n  line: {line.rstrip()!r}")


def test_a_whole_run_whole(synth) -> None:
    facts = parse_p2p(synth(WHOLE))
    h100 = "NVIDIA H100 80GB HBM3"
    assert [d.model_dump() for d in facts.devices] == [
        {"index": 0, "name": h100, "pci_bus": 0x18, "pci_device": 0, "pci_domain": 0},
        {"index": 1, "name": h100, "pci_bus": 0x2a, "pci_device": 0, "pci_domain": 0}]
    uni = "Unidirectional P2P="
    assert [(m.title, m.measure, m.direction, m.p2p, m.method, m.unit, m.side, m.columns,
             m.line_no) for m in facts.matrices] == [
        ("P2P Connectivity Matrix", "connectivity", None, None, None, None, None, [0, 1], 11),
        (uni + "Disabled Bandwidth Matrix (GB/s)", "bandwidth", "unidirectional", False, None,
         "GB/s", None, [0, 1], 15),
        (uni + "Enabled Bandwidth (P2P Writes) Matrix (GB/s)", "bandwidth", "unidirectional",
         True, "writes", "GB/s", None, [0, 1], 19),
        ("Bidirectional P2P=Disabled Bandwidth Matrix (GB/s)", "bandwidth", "bidirectional",
         False, None, "GB/s", None, [0, 1], 23),
        ("Bidirectional P2P=Enabled Bandwidth Matrix (GB/s)", "bandwidth", "bidirectional",
         True, None, "GB/s", None, [0, 1], 27),
        ("P2P=Disabled Latency Matrix (us)", "latency", None, False, None, "us", "GPU", [0, 1],
         31),
        ("P2P=Disabled Latency Matrix (us)", "latency", None, False, None, "us", "CPU", [0, 1],
         35),
        ("P2P=Enabled Latency (P2P Writes) Matrix (us)", "latency", None, True, "writes", "us",
         "GPU", [0, 1], 39),
        ("P2P=Enabled Latency (P2P Writes) Matrix (us)", "latency", None, True, "writes", "us",
         "CPU", [0, 1], 43)]
    assert [m.values for m in facts.matrices] == [
        [[1.0, 1.0], [0.0, 1.0]], [[2495.12, 37.21], [36.90, 2503.44]],
        [[2497.80, 376.02], [36.95, 2501.10]], [[2510.33, 52.40], [52.61, 2512.04]],
        [[2509.91, 517.36], [517.40, 2511.88]], [[2.26, 21.15], [21.40, 2.28]],
        [[2.81, 7.33], [7.21, 2.75]], [[2.25, 2.61], [21.38, 2.27]], [[2.79, 2.05], [7.19, 2.74]]]
    assert facts.matrices[2].off_diagonal() == [376.02, 36.95]


def test_a_matrix_is_found_by_every_filter(synth) -> None:
    facts = parse_p2p(synth(WHOLE))
    m = facts.matrices
    assert facts.matrix("bandwidth") is m[1]
    assert facts.matrix("bandwidth", p2p=True) is m[2]
    assert facts.matrix("bandwidth", direction="bidirectional") is m[3]
    assert facts.matrix("bandwidth", p2p=True, direction="bidirectional") is m[4]
    assert facts.matrix("latency", side="CPU") is m[6]
    assert facts.matrix("latency", p2p=True, side="CPU") is m[8]
    assert facts.matrix("latency", method="writes") is m[7]
    assert facts.matrix("bandwidth", method="reads") is None
    assert facts.matrix("connectivity", p2p=False) is None
    assert facts.matrix("throughput") is None


def test_ids_are_hexadecimal_and_a_cut_matrix_is_incomplete() -> None:
    text = ("Device: 3, NVIDIA A100-SXM4-80GB, pciBusID: c1, pciDeviceID: 1f, pciDomainID:1a\n"
            "Unidirectional P2P=Enabled Bandwidth (P2P Reads) Matrix (GB/s)\n"
            "   D\\D     0      1      2\n     0 1.5 2 3\n     1 4 5.25 6\n")
    facts = parse_p2p(text)
    assert facts.devices[0].model_dump() == {"index": 3, "name": "NVIDIA A100-SXM4-80GB",
                                             "pci_bus": 0xc1, "pci_device": 0x1f,
                                             "pci_domain": 0x1a}
    (m,) = facts.matrices
    assert (m.method, m.complete, m.values) == ("reads", False, [[1.5, 2.0, 3.0], [4.0, 5.25, 6.0]])
    assert m.off_diagonal() == [2.0, 3.0, 4.0, 6.0]
    assert parse_p2p(text.splitlines()[0]).matrices == []


def test_every_error_names_the_kind_the_file_and_the_line(synth) -> None:
    title = "P2P=Disabled Latency Matrix (us)\n   GPU     0      1 \n"
    cases = [
        ("   D\\D     0      1 \n", 1, "a matrix heading without a title above it",
         "   D\\D     0      1 "),
        (title + "     0   2.26 \n", 3, "row 0 does not fit a matrix of 2 columns",
         "     0   2.26 "),
        (title + "     1   2.26  21.15 \n", 3, "row 1 does not fit a matrix of 2 columns",
         "     1   2.26  21.15 "),
        (title + "     0   2.26  21.15 \n     0   2.26  21.15 \n", 4,
         "row 0 does not fit a matrix of 2 columns", "     0   2.26  21.15 "),
        ("     0   2.26  21.15 \n", 1, "not a p2pBandwidthLatencyTest line",
         "     0   2.26  21.15 "),
        # a row under a title with no heading, under the connectivity title, after a matrix
        ("P2P=Disabled Latency Matrix (us)\n     0   2.26  21.15\n", 2,
         "not a p2pBandwidthLatencyTest line", "     0   2.26  21.15"),
        (title + "     0   2.26  21.15\nP2P Connectivity Matrix\n     0\t     1     1\n", 5,
         "not a p2pBandwidthLatencyTest line", "     0\t     1     1"),
        (title + "     0   2.26  21.15\n   GPU 0 1 (us)\n", 4,
         "not a p2pBandwidthLatencyTest line", "   GPU 0 1 (us)"),
        ("P2P Connectivity Matrix\n  Device=0 MAYBE Access Peer Device=1  \n", 2,
         "not a p2pBandwidthLatencyTest line", "  Device=0 MAYBE Access Peer Device=1  "),
    ]
    for text, line_no, what, line in cases:
        assert _error(text) == ("p2pBandwidthLatencyTest", _what(line_no, what, line), line_no,
                                line, "raw/p2p.txt"), what
    assert _error("\n\n") == ("p2pBandwidthLatencyTest", _what(None, "empty output"), None,
                              None, "raw/p2p.txt")
    assert _error("[P2P (Peer-to-Peer) GPU Bandwidth Latency Test]\nDevice=0 CAN Access Peer "
                  "Device=1\n") == (
        "p2pBandwidthLatencyTest",
        _what(None, "no devices and no matrix: not p2pBandwidthLatencyTest's output"), None,
        None, "raw/p2p.txt")
