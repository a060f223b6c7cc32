"""Exact-value pins of the topo -m, topo -p2p and nvlink -s parse functions.

Each test starts from a real capture (tests/fixtures) and edits one thing, then
asserts the whole parsed record or the exact error: message, line number, line.
"""
from __future__ import annotations

import pytest

from orchestrator.parsers.topology import parse_nvlink_s, parse_topo_m, parse_topo_p2p
from tests.unit.parsers.refusal import is_refusal, refused

# ----------------------------------------------------------------- topo -m

A10 = "topo-m_4x-a10-2nic.txt"


def test_topo_m_a10_with_nics_whole_record(public) -> None:
    facts = parse_topo_m(public(A10), source="f.txt")
    sys4 = {f"GPU{k}": "SYS" for k in range(4)}
    assert facts.model_dump() == {
        "gpus": [{"name": f"GPU{k}", "index": k, "cpu_affinity": "0-127", "numa_affinity": "0",
                  "gpu_numa_id": None} for k in range(4)],
        "nics": ["mlx5_0", "mlx5_1"],
        "nic_legend": {"NIC0": "mlx5_0", "NIC1": "mlx5_1"},
        "matrix": {
            **{f"GPU{k}": {**sys4, f"GPU{k}": "X", "mlx5_0": "SYS", "mlx5_1": "SYS"}
               for k in range(4)},
            "mlx5_0": {**sys4, "mlx5_0": "X", "mlx5_1": "PIX"},
            "mlx5_1": {**sys4, "mlx5_0": "PIX", "mlx5_1": "X"},
        },
        "pcie_only": False,
    }


def test_topo_m_h200_whole_record_after_leading_blank_lines(real) -> None:
    facts = parse_topo_m("\n  \n" + real("topo-m.txt"))
    assert facts.model_dump() == {
        "gpus": [{"name": f"GPU{k}", "index": k, "cpu_affinity": "0-31", "numa_affinity": "0",
                  "gpu_numa_id": None} for k in range(2)],
        "nics": [], "nic_legend": {},
        "matrix": {"GPU0": {"GPU0": "X", "GPU1": "NV18"}, "GPU1": {"GPU0": "NV18", "GPU1": "X"}},
        "pcie_only": False,
    }


def test_topo_m_gpu_numa_id_kept_when_not_na(real) -> None:
    text = real("topo-m.txt").replace("0\t\tN/A", "0\t\t7", 1)
    g0, g1 = parse_topo_m(text).gpus
    assert (g0.gpu_numa_id, g1.gpu_numa_id) == ("7", None)


def test_topo_m_nic_legend_only_after_its_title(public) -> None:
    # a `NICn: name` line before "NIC Legend:" is not the legend
    text = public(A10).replace("NIC Legend:\n", "")
    text = text.replace("Legend:\n", "Legend:\n\n  NIC5: mlx5_9\n\nNIC Legend:\n", 1)
    text = text.replace("  NIC1: mlx5_1\n", "  NIC1: mlx5_1\n  not a nic\n  NIC2:   ib7\n")
    facts = parse_topo_m(text)
    assert facts.nic_legend == {"NIC0": "mlx5_0", "NIC1": "mlx5_1", "NIC2": "ib7"}
    assert facts.nics == ["mlx5_0", "mlx5_1"]


def test_topo_m_empty_and_blank(real) -> None:
    is_refusal(refused(parse_topo_m, " \n\t\n"), "topo-m", "empty output", None, None)
    is_refusal(refused(parse_topo_m, ""), "topo-m", "empty output", None, None)


@pytest.mark.parametrize("header", [
    "\tNIC0\tGPU0\tCPU Affinity",
    "\tCPU Affinity\tNUMA Affinity",
    "\tGPU0\tCPU Affinity\tGPU1",
    "\tGPUx\tGPU1",
])
def test_topo_m_header_not_gpus(header: str) -> None:
    e = refused(parse_topo_m, "\n" + header + "\nGPU0\t X \n")
    is_refusal(e, "topo-m", "header does not start with GPU columns", 2, header)


def test_topo_m_row_shapes(real) -> None:
    text = real("topo-m.txt")
    what = "row does not match the header (2 devices, 3 affinity columns)"
    for old, new in [("GPU1\tNV18\t X ", "GPU7\tNV18\t X "),          # label not a device
                     ("GPU1\tNV18\t X \t0-31\t0\t\tN/A", "GPU1\tNV18"),          # too few values
                     ("GPU1\tNV18\t X \t0-31\t0\t\tN/A", "GPU1\tNV18\t X \t0-31\t0\t\tN/A\t9")]:
        bad = text.replace(old, new)
        is_refusal(refused(parse_topo_m, bad), "topo-m", what, 3, bad.splitlines()[2])


def test_topo_m_row_with_exactly_the_affinity_columns_is_read(real) -> None:
    # the real rows hold exactly the three affinity values after the device cells
    text = real("topo-m.txt")
    assert parse_topo_m(text).gpus[1].cpu_affinity == "0-31"


def test_topo_m_second_row_for_a_device(real) -> None:
    text = real("topo-m.txt")
    row = text.splitlines()[2]
    bad = text.replace(row, row + "\n" + row)
    is_refusal(refused(parse_topo_m, bad), "topo-m", "a second row for GPU1", 4, row)


def test_topo_m_unknown_value_and_diagonal(real) -> None:
    text = real("topo-m.txt")
    bad = text.replace("GPU1\tNV18\t X ", "GPU1\tNV18\t Q ")
    is_refusal(refused(parse_topo_m, bad), "topo-m", "unknown value 'Q'", 3, bad.splitlines()[2])
    bad = text.replace("GPU1\tNV18\t X ", "GPU1\tNV18\tNV18")
    is_refusal(refused(parse_topo_m, bad), "topo-m", "diagonal is not X", 3, bad.splitlines()[2])
    bad = text.replace("GPU0\t X \tNV18", "GPU0\tNV18\t X ")
    is_refusal(refused(parse_topo_m, bad), "topo-m", "diagonal is not X", 2, bad.splitlines()[1])


def test_topo_m_missing_row_before_the_legend_and_at_the_end(real) -> None:
    lines = real("topo-m.txt").splitlines()
    bad = "\n".join(lines[:2] + lines[3:])
    is_refusal(refused(parse_topo_m, bad), "topo-m", "no row for GPU1: the header names 2 devices", 3, "")
    bad = "\n".join(lines[:2])
    is_refusal(refused(parse_topo_m, bad), "topo-m", "no row for GPU1: the header names 2 devices", 3, None)
    bad = "\n".join(lines[:1])
    is_refusal(refused(parse_topo_m, bad), "topo-m", "no row for GPU0, GPU1: the header names 2 devices",
        2, None)
    bad = "\n".join(lines[:2] + ["Legend:"])
    is_refusal(refused(parse_topo_m, bad), "topo-m", "no row for GPU1: the header names 2 devices", 3,
        "Legend:")


def test_topo_m_affinity_cannot_be_placed(real) -> None:
    text = real("topo-m.txt")
    # one value that could be CPU or NUMA affinity, and no full row to place it by
    bad = text.replace("\t0-31\t0\t\tN/A", "\t0")
    row = bad.splitlines()[1]
    is_refusal(refused(parse_topo_m, bad), "topo-m",
        "cannot tell which of the 3 affinity columns the 1 value(s) of GPU0 belong to", 2, row)


def test_topo_m_nic_not_in_legend(public) -> None:
    bad = public(A10).replace("  NIC1: mlx5_1\n", "")
    is_refusal(refused(parse_topo_m, bad), "topo-m", "NIC1 is not in the NIC Legend", None, None)


# ----------------------------------------------------------------- topo -p2p


def test_p2p_whole_record_and_status_after_leading_blanks(real) -> None:
    facts = parse_topo_p2p("\n \n" + real("topo-p2p-n.txt"))
    assert facts.model_dump() == {"gpus": ["GPU0", "GPU1"],
                                  "matrix": {"GPU0": {"GPU0": "X", "GPU1": "OK"},
                                             "GPU1": {"GPU0": "OK", "GPU1": "X"}}}


def test_p2p_rows_end_at_the_legend_without_a_blank_line(real) -> None:
    text = real("topo-p2p-n.txt").replace("\n\nLegend:", "\nLegend:")
    assert parse_topo_p2p(text).matrix["GPU1"] == {"GPU0": "OK", "GPU1": "X"}


def test_p2p_errors(real) -> None:
    text = real("topo-p2p-n.txt")
    is_refusal(refused(parse_topo_p2p, "\n \n"), "topo-p2p", "empty output", None, None)
    is_refusal(refused(parse_topo_p2p, ""), "topo-p2p", "empty output", None, None)
    for hdr in ("\nGPU0 NIC0\n", "\nGPU0 GPUx\n", "\nLegend\n"):
        is_refusal(refused(parse_topo_p2p, hdr), "topo-p2p", "header is not a list of GPUs", 2,
            hdr.strip("\n"))
    lines = text.splitlines()
    what = "row does not have 2 GPU cells"
    for row in (" GPU1\tOK", " GPU1\tOK\tX\tX", " GPU2\tOK\tX"):
        bad = "\n".join([lines[0], lines[1], row])
        is_refusal(refused(parse_topo_p2p, bad), "topo-p2p", what, 3, row)
    bad = "\n".join([lines[0], lines[1], " GPU1\tOK\tXX"])
    is_refusal(refused(parse_topo_p2p, bad), "topo-p2p", "unknown status 'XX'", 3, " GPU1\tOK\tXX")
    bad = "\n".join([lines[0], lines[1], "", "Legend:"])
    is_refusal(refused(parse_topo_p2p, bad), "topo-p2p", "not every GPU has a row", 3, "")
    bad = "\n".join([lines[0], lines[1]])
    is_refusal(refused(parse_topo_p2p, bad), "topo-p2p", "not every GPU has a row", 3, None)


@pytest.mark.parametrize("status", ["CNS", "GNS", "TNS", "NS", "DR", "U"])
def test_p2p_every_status_is_read(real, status: str) -> None:
    text = real("topo-p2p-n.txt").replace("GPU0\tX\tOK", f"GPU0\tX\t{status}")
    assert parse_topo_p2p(text).matrix["GPU0"]["GPU1"] == status


# ----------------------------------------------------------------- nvlink -s


def test_nvlink_whole_record_with_notes_and_inactive_link(real) -> None:
    lines = real("nvlink-s.txt").splitlines()
    text = "\n".join([
        "", "NVML: Unable to retrieve NVLink information as all links are inActive",
        lines[0], lines[1], "\t Link 1: <inactive>", "   ",
        "GPU 1: NVIDIA H200",
        "NVML: Unable to retrieve NVLink information as all links are inactive",
        "\t Link 0: 25 GB/s"])
    facts = parse_nvlink_s(text)
    assert facts.model_dump() == {
        "gpus": [{"index": 0, "name": "NVIDIA H200",
                  "uuid": "GPU-00000000-1111-2222-3333-000000000000",
                  "links": [{"link": 0, "active": True, "speed_gbs": 26.562},
                            {"link": 1, "active": False, "speed_gbs": None}],
                  "message": None},
                 {"index": 1, "name": "NVIDIA H200", "uuid": None,
                  "links": [{"link": 0, "active": True, "speed_gbs": 25.0}], "message": None}],
        "elided": False,
        "notes": ["NVML: Unable to retrieve NVLink information as all links are inActive",
                  "NVML: Unable to retrieve NVLink information as all links are inactive"]}


@pytest.mark.parametrize("cut", ["...", "[snip]", "…", "[3 GPUs omitted]"])
def test_nvlink_elision_line(real, cut: str) -> None:
    lines = real("nvlink-s.txt").splitlines()
    facts = parse_nvlink_s("\n".join(lines[:2] + [cut] + lines[19:21]))
    assert facts.elided is True
    assert [(g.index, len(g.links)) for g in facts.gpus] == [(0, 1), (1, 1)]


def test_nvlink_gaps_and_first_gpu_not_zero(real) -> None:
    lines = real("nvlink-s.txt").splitlines()
    gpu1 = lines[19:21]
    assert parse_nvlink_s("\n".join(gpu1)).elided is True
    assert parse_nvlink_s("\n".join(lines[:2] + gpu1)).elided is False
    skip = "\n".join(lines[:2] + [gpu1[0].replace("GPU 1:", "GPU 2:"), gpu1[1]])
    assert parse_nvlink_s(skip).elided is True
    back = "\n".join(lines[:2] + gpu1 + [lines[0].replace("GPU 0:", "GPU 1:")])
    assert parse_nvlink_s(back).elided is True


def test_nvlink_message_only_before_the_links(real) -> None:
    lines = real("nvlink-s.txt").splitlines()
    msg = "\tNvlink queries are not supported for Devices in MIG mode"
    facts = parse_nvlink_s("\n".join([lines[0], msg]))
    assert facts.gpus[0].message == msg.strip()
    assert facts.gpus[0].links == []
    is_refusal(refused(parse_nvlink_s, "\n".join([lines[0], lines[1], msg])), "nvlink-s",
        "not a GPU or Link line", 3, msg)
    is_refusal(refused(parse_nvlink_s, msg), "nvlink-s", "not a GPU or Link line", 1, msg)
    is_refusal(refused(parse_nvlink_s, "\n" + lines[1]), "nvlink-s", "not a GPU or Link line", 2, lines[1])
