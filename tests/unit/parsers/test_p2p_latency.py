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
