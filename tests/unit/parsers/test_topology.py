from __future__ import annotations

import pytest

from orchestrator.errors import ParseError
from orchestrator.parsers import parse
from orchestrator.parsers.topology import (
    NicAffinity,
    TopoMFacts,
    parse_nvlink_s,
    parse_topo_m,
    parse_topo_p2p,
)

# ----------------------------------------------------------------- topo -m


def test_topo_m_real_h200(real) -> None:
    facts = parse("topo-m", real("topo-m.txt"))
    assert isinstance(facts, TopoMFacts)
    assert facts.gpu_names == ["GPU0", "GPU1"]
    assert facts.nic_names == []
    assert facts.link(0, 1) == "NV18" and facts.link("GPU1", "GPU0") == "NV18"
    assert facts.nvlink_count(0, 1) == 18
    assert facts.pairs() == [(0, 1, "NV18")]
    assert facts.non_nvlink_pairs() == []
    g0 = facts.gpus[0]
    assert (g0.cpu_affinity, g0.numa_affinity, g0.gpu_numa_id) == ("0-31", "0", None)


def test_topo_m_dgx_a100_nic_legend(synth) -> None:
    facts = parse_topo_m(synth("topo-m_dgx-a100_r535.txt"))
    assert len(facts.gpus) == 8
    assert len(facts.pairs()) == 28
    assert {link for _, _, link in facts.pairs()} == {"NV12"}
    assert facts.non_nvlink_pairs() == []
    assert facts.nic_names == [f"mlx5_{k}" for k in range(10)]
    assert facts.nic_legend["NIC9"] == "mlx5_9"
    assert facts.link("GPU0", "mlx5_0") == "PXB"
    assert facts.link("GPU0", "mlx5_2") == "SYS"
    aff = facts.nic_affinity
    assert aff["mlx5_0"] == NicAffinity(best="PXB", gpus=["GPU0", "GPU1"])
    assert aff["mlx5_7"] == NicAffinity(best="PXB", gpus=["GPU6", "GPU7"])
    assert aff["mlx5_8"].best == "SYS" and len(aff["mlx5_8"].gpus) == 8
    assert facts.link("mlx5_8", "mlx5_9") == "PIX"
    assert facts.gpus[4].cpu_affinity == "112-127,240-255"
    assert facts.gpus[4].numa_affinity == "7"


def test_topo_m_dgx_a100_r470_same_facts(synth) -> None:
    old = parse_topo_m(synth("topo-m_dgx-a100_r470.txt"))
    new = parse_topo_m(synth("topo-m_dgx-a100_r535.txt"))
    assert old.matrix == new.matrix
    assert old.nic_legend == {}
    assert old.nic_affinity == new.nic_affinity


def test_topo_m_pcie_only(synth) -> None:
    facts = parse_topo_m(synth("topo-m_8x-a100-pcie_r550.txt"))
    assert len(facts.non_nvlink_pairs()) == 28
    assert facts.link(0, 1) == "PIX" and facts.link(0, 2) == "NODE" and facts.link(3, 4) == "SYS"
    assert facts.nvlink_count(0, 1) is None
    assert facts.nic_affinity["mlx5_1"] == NicAffinity(best="PIX", gpus=["GPU4", "GPU5"])
    four = parse_topo_m(synth("topo-m_4x-a100-pcie_r470.txt"))
    assert four.pairs() == [(0, 1, "PHB"), (0, 2, "SYS"), (0, 3, "SYS"), (1, 2, "SYS"),
                            (1, 3, "SYS"), (2, 3, "PHB")]


def test_topo_m_unknown_cell(real) -> None:
    text = real("topo-m.txt").replace("GPU1\tNV18", "GPU1\tXYZ")
    with pytest.raises(ParseError) as exc:
        parse_topo_m(text, source="topo.txt")
    assert exc.value.line_no == 3
    assert "XYZ" in str(exc.value)


def test_topo_m_short_row_and_empty(real) -> None:
    text = real("topo-m.txt").replace("GPU0\t X \tNV18\t0-31", "GPU0\t X \t0-31")
    with pytest.raises(ParseError) as exc:
        parse_topo_m(text)
    assert exc.value.line_no == 2
    with pytest.raises(ParseError):
        parse_topo_m("\n\n")
    with pytest.raises(ParseError) as exc:
        parse_topo_m("Legend:\n")
    assert exc.value.line_no == 1


def test_topo_m_nic_missing_from_legend(synth) -> None:
    text = synth("topo-m_dgx-a100_r535.txt").replace("  NIC9: mlx5_9\n", "")
    with pytest.raises(ParseError):
        parse_topo_m(text)


# ----------------------------------------------------------------- topo -p2p


@pytest.mark.parametrize("name", ["topo-p2p-n.txt", "topo-p2p-r.txt", "topo-p2p-w.txt"])
def test_p2p_real_h200(real, name: str) -> None:
    facts = parse_topo_p2p(real(name))
    assert facts.gpus == ["GPU0", "GPU1"]
    assert facts.status(0, 1) == "OK" and facts.status(1, 0) == "OK"
    assert facts.not_ok_pairs() == []


def test_p2p_pcie(synth) -> None:
    facts = parse_topo_p2p(synth("topo-p2p-n_4x-a100-pcie_r470.txt"))
    assert facts.status(0, 1) == "OK"
    assert (0, 2, "CNS") in facts.not_ok_pairs()
    assert len(facts.not_ok_pairs()) == 8
    dgx = parse_topo_p2p(synth("topo-p2p-n_dgx-a100_r535.txt"))
    assert len(dgx.pairs()) == 56 and dgx.not_ok_pairs() == []


def test_p2p_unknown_status(real) -> None:
    text = real("topo-p2p-n.txt").replace(" GPU1\tOK", " GPU1\tMAYBE")
    with pytest.raises(ParseError) as exc:
        parse_topo_p2p(text)
    assert exc.value.line_no == 3


# ----------------------------------------------------------------- nvlink -s


def test_nvlink_real_h200(real) -> None:
    facts = parse_nvlink_s(real("nvlink-s.txt"))
    assert [g.active_links for g in facts.gpus] == [18, 18]
    assert facts.gpus[0].links[17].speed_gbs == 26.562
    assert facts.gpus[0].total_gbs == pytest.approx(18 * 26.562)
    assert facts.has_nvlink


def test_nvlink_inactive_link(synth) -> None:
    facts = parse_nvlink_s(synth("nvlink-s_dgx-a100_r535.txt"))
    assert len(facts.gpus) == 8
    assert [g.active_links for g in facts.gpus] == [12, 12, 12, 11, 12, 12, 12, 12]
    bad = facts.gpus[3].links[7]
    assert bad.active is False and bad.speed_gbs is None


def test_nvlink_none(synth) -> None:
    assert parse_nvlink_s(synth("nvlink-s_a100-pcie-no-nvlink_r550.txt")).gpus == []
    assert parse_nvlink_s("").has_nvlink is False


def test_nvlink_garbage() -> None:
    with pytest.raises(ParseError) as exc:
        parse_nvlink_s("GPU 0: NVIDIA H200 (UUID: GPU-0000)\n\t Link 0: fast\n")
    assert exc.value.line_no == 2
