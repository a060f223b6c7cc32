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


# ----------------------------------------------------------------- other fleets, by meaning


@pytest.mark.parametrize("name,gpus,nics,non_nv", [
    ("topo-m_8x-a100-17nic.txt", 8, 17, 0),
    ("topo-m_4x-a10-2nic.txt", 4, 2, 6),
    ("topo-m_2x-gtx1080ti.txt", 2, 0, 1),
    ("topo-m_dgx1-v100.txt", 8, 4, 12),
    ("topo-m_h200-mig_r590.txt", 1, 0, 0),
])
def test_topo_m_published(public, name: str, gpus: int, nics: int, non_nv: int) -> None:
    facts = parse_topo_m(public(name))
    assert (len(facts.gpus), len(facts.nics), len(facts.non_nvlink_pairs())) == (gpus, nics, non_nv)


def test_topo_m_space_aligned_paste_with_bond_nic(public) -> None:
    facts = parse_topo_m(public("topo-m_8x-a100-17nic.txt"))
    assert facts.nic_legend["NIC16"] == "mlx5_bond_0" and facts.nics[-1] == "mlx5_bond_0"
    assert facts.gpus[7].cpu_affinity == "0-103" and facts.gpus[7].numa_affinity == "0"
    assert facts.nic_affinity["mlx5_2"] == NicAffinity(best="PXB", gpus=["GPU0", "GPU1"])


def test_topo_m_dgx1_nic_rows_with_empty_affinity(public) -> None:
    facts = parse_topo_m(public("topo-m_dgx1-v100.txt"))
    assert facts.nvlink_count(0, 3) == 2 and facts.link(0, 5) == "SYS"
    assert facts.gpus[4].cpu_affinity == "20-39,60-79" and facts.gpus[4].numa_affinity is None


@pytest.mark.parametrize("row,cpu,numa", [
    ("GPU1\tNV18\t X \t\t0\t\tN/A", None, "0"),  # CPU affinity empty
    ("GPU1\tNV18\t X \t0-31\t\t\tN/A", "0-31", None),  # NUMA affinity empty
    ("GPU1\tNV18\t X \t\t\t\tN/A", None, None),  # both empty
])
def test_topo_m_empty_affinity_cells_read_by_position(real, row: str, cpu, numa) -> None:
    """Rejected before as `row does not match the header`: interconnect was then unknown."""
    text = real("topo-m.txt").replace("GPU1\tNV18\t X \t0-31\t0\t\tN/A", row)
    facts = parse_topo_m(text)
    assert facts.link(0, 1) == "NV18"
    assert (facts.gpus[1].cpu_affinity, facts.gpus[1].numa_affinity) == (cpu, numa)
    assert facts.gpus[0].cpu_affinity == "0-31"


def test_topo_m_empty_cell_in_a_space_aligned_paste_by_meaning(public) -> None:
    text = public("topo-m_4x-a10-2nic.txt").replace(
        "GPU3    SYS     SYS     SYS      X      SYS     SYS     0-127   0               N/A",
        "GPU3    SYS     SYS     SYS      X      SYS     SYS     0-127                   N/A")
    facts = parse_topo_m(text)
    assert (facts.gpus[3].cpu_affinity, facts.gpus[3].numa_affinity) == ("0-127", None)
    assert facts.gpus[3].gpu_numa_id is None and facts.gpus[2].numa_affinity == "0"
    # off the full rows' columns, "0-127 N/A" fits two placements: refused, not guessed
    shifted = text.replace("0-127                   N/A", "0-127    N/A")
    with pytest.raises(ParseError) as exc:
        parse_topo_m(shifted)
    assert "affinity" in str(exc.value) and exc.value.line_no == 5


def test_topo_m_missing_gpu_row_is_rejected_not_a_smaller_machine(public) -> None:
    lines = public("topo-m_8x-a100-17nic.txt").splitlines()
    text = "\n".join(ln for ln in lines if not ln.startswith("GPU5 ")) + "\n"
    with pytest.raises(ParseError) as exc:
        parse_topo_m(text)
    assert "no row for GPU5" in str(exc.value)
    real_lines = public("topo-m_dgx1-v100.txt").splitlines()
    with pytest.raises(ParseError):
        parse_topo_m("\n".join(ln for ln in real_lines if not ln.startswith("GPU7")))


def test_topo_m_duplicated_row_is_rejected(real) -> None:
    lines = real("topo-m.txt").splitlines()
    with pytest.raises(ParseError) as exc:
        parse_topo_m("\n".join([lines[0], lines[1], lines[1], lines[2]]))
    assert exc.value.line_no == 3


# ----------------------------------------------------------------- nvlink, what is there


def test_nvlink_mig_mode_says_why_links_are_unknown(public) -> None:
    facts = parse_nvlink_s(public("nvlink-s_h200-mig_r590.txt"))
    (g,) = facts.gpus
    assert g.links == [] and g.links_unknown and not facts.has_nvlink
    assert facts.unknown == ["GPU 0: Nvlink queries are not supported for Devices in MIG mode"]


def test_nvlink_card_without_nvlink_is_known_none(public) -> None:
    facts = parse_nvlink_s(public("nvlink-s_l40s_r595.txt"))
    assert facts.gpus[0].message == "Device does not have or support Nvlink"
    assert not facts.gpus[0].links_unknown and facts.unknown == []


def test_nvlink_snipped_excerpt_without_uuids(public) -> None:
    facts = parse_nvlink_s(public("nvlink-status_dgx1-v100_snip.txt"))
    assert [(g.index, g.name, g.uuid, g.active_links) for g in facts.gpus] == [
        (0, "Tesla V100-SXM2-32GB", None, 6), (7, "Tesla V100-SXM2-32GB", None, 6)]
    assert facts.elided and facts.unknown == ["the text leaves GPUs out (only GPUs 0, 7 shown)"]
    assert facts.gpus[1].total_gbs == pytest.approx(6 * 25.781)


def test_nvlink_gap_in_gpu_numbers_is_an_elision(real) -> None:
    text = "\n".join(real("nvlink-s.txt").splitlines()[:3]) + "\n...\n"
    facts = parse_nvlink_s(text)
    assert facts.elided and [g.index for g in facts.gpus] == [0]
    assert not parse_nvlink_s(real("nvlink-s.txt")).elided


def test_topo_m_off_the_columns_one_placement_fits_and_is_taken(public) -> None:
    """`0-1` can be a NUMA affinity but not a GPU NUMA ID: only one placement fits."""
    full = "GPU3    SYS     SYS     SYS      X      SYS     SYS     0-127   0               N/A"
    text = public("topo-m_4x-a10-2nic.txt").replace(
        full, "GPU3    SYS     SYS     SYS      X      SYS     SYS     0-127  0-1")
    g3 = parse_topo_m(text).gpus[3]
    assert g3.model_dump() == {"name": "GPU3", "index": 3, "cpu_affinity": "0-127",
                               "numa_affinity": "0-1", "gpu_numa_id": None}
    # one value alone fits every column it could stand in: refused, not guessed
    alone = public("topo-m_4x-a10-2nic.txt").replace(
        full, "GPU3    SYS     SYS     SYS      X      SYS     SYS       0-1")
    with pytest.raises(ParseError) as exc:
        parse_topo_m(alone, source="topo.txt")
    assert exc.value.what == (
        "cannot parse topo-m output at topo.txt:5: cannot tell which of the 3 affinity columns "
        "the 1 value(s) of GPU3 belong to\n  line: "
        "'GPU3    SYS     SYS     SYS      X      SYS     SYS       0-1'")
