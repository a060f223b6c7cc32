"""nvidia-smi as people paste it: excerpts, MIG boxes, the NVLink fabric, interleaved hosts.

Every file is a public fixture (tests/fixtures/public/README.md) or the recipe's
capture (tests/fixtures/README-recipe-h200x1.md); the facts read from each are pinned.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import ParseError
from orchestrator.parsers.nvidia_smi import (
    CELSIUS,
    FLAG,
    INT,
    MIB,
    REASONS,
    TEXT,
    WATTS,
    FabricState,
    parse_query_gpu_noheader,
)
from orchestrator.parsers.nvidia_smi_q import parse_nvidia_smi_q
from orchestrator.parsers.nvidia_smi_table import parse_nvidia_smi_table
from orchestrator.parsers.nvidia_smi_xml import parse_nvidia_smi_xml

FIX = Path(__file__).resolve().parents[2] / "fixtures"
PUBLIC = FIX / "public"
RECIPE = FIX / "recipe-h200x1"


@pytest.mark.parametrize(("name", "state", "status", "summary", "problem"), [
    ("nvidia-smi-q_fabric-insufficient-resources_azhpc.txt", "Completed",
     "Insufficient Resources", None, "Status Insufficient Resources"),
    ("nvidia-smi-q_fabric-in-progress_gpu-operator.txt", "In Progress", None, None,
     "State In Progress"),
    ("nvidia-smi-q_fabric-grep-C3-unhealthy_dra-driver.txt", "Completed", "Success", "Unhealthy",
     "Health Summary Unhealthy"),
])
def test_the_fabric_block_as_pasted(name: str, state: str, status: str | None,
                                    summary: str | None, problem: str) -> None:
    (gpu,) = parse_nvidia_smi_q((PUBLIC / name).read_text()).gpus
    assert gpu.bus_id is None and gpu.sections == ["Fabric"]  # an excerpt: no `GPU ...` line
    f = gpu.fabric
    assert f is not None and (f.state, f.status, f.health_summary) == (state, status, summary)
    assert f.problem == problem and f.line_no == 1


def test_a_fabric_the_gpu_has_none_of_is_not_a_problem() -> None:
    gpu = parse_nvidia_smi_q((PUBLIC / "nvidia-smi-q_titan-v_r560.txt").read_text()).gpus[0]
    assert gpu.fabric is not None and not gpu.fabric.known and gpu.fabric.problem is None


def test_the_xml_fabric_of_a_registered_gpu() -> None:
    xml = parse_nvidia_smi_xml((FIX / "h200x2" / "commands" / "nvidia-smi-q.xml").read_text())
    assert [(g.fabric.state, g.fabric.status, g.fabric.clique_id) for g in xml.gpus
            if g.fabric] == [("Completed", "Success", "0")] * 2
    assert all(g.fabric is not None and g.fabric.problem is None for g in xml.gpus)


@pytest.mark.parametrize(("state", "status", "summary", "problem"), [
    ("Completed", "Success", None, None), ("Completed", "Success", "Healthy", None),
    ("Completed", "Success", "Not Supported", None),
    ("Not Started", None, None, "State Not Started"),
    ("Completed", "Failure", None, "Status Failure"),
    ("Completed", "Success", "Limited Capacity", "Health Summary Limited Capacity"),
])
def test_what_a_fabric_problem_is(state: str, status: str | None, summary: str | None,
                                  problem: str | None) -> None:
    assert FabricState(state=state, status=status, health_summary=summary).problem == problem


def test_an_excerpt_that_starts_inside_a_gpu() -> None:
    (gpu,) = parse_nvidia_smi_q((PUBLIC / "nvidia-smi-q_excerpt-mid-gpu_nvidia-docker-1753.txt")
                                .read_text()).gpus
    assert (gpu.pcie_gen_max, gpu.pcie_gen_current, gpu.product_name) == (2, 1, None)
    assert "Product Name" in gpu.missing


def test_the_recipe_s_mig_lines() -> None:
    (plus2,) = parse_nvidia_smi_q((RECIPE / "mig-plus2.txt").read_text()).gpus
    assert (plus2.mig_enabled, plus2.mig_pending_enabled) == (False, False)
    (head,) = parse_nvidia_smi_q((RECIPE / "mig.txt").read_text()).gpus
    assert head.sections == ["MIG Mode"] and head.mig_enabled is None
    assert "MIG mode" in head.missing


def test_an_elided_q_paste_is_read_and_says_where_it_was_cut() -> None:
    text = (FIX / "h200x2" / "commands" / "nvidia-smi-q.txt").read_text()
    lines = text.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.strip().startswith("Clocks Event Reasons"))
    cut = [*lines[:at], "    [...]", *lines[at:]]
    facts = parse_nvidia_smi_q("\n".join(cut))
    assert [g.product_name for g in facts.gpus] == ["NVIDIA H200", "NVIDIA H200"]
    assert [(e.line_no, e.what.split(" (")[0]) for e in facts.edits] == [(at + 1,
                                                                          "an elision mark")]


def test_two_q_outputs_in_one_text_are_refused() -> None:
    text = (FIX / "h200x2" / "commands" / "nvidia-smi-q.txt").read_text()
    with pytest.raises(ParseError) as exc:
        parse_nvidia_smi_q(text + text)
    assert "a second `NVSMI LOG` banner" in exc.value.what


def test_a_mig_box_saying_no_mig_devices_found() -> None:
    t = parse_nvidia_smi_table((PUBLIC / "nvidia-smi_a100-pcie-mig-no-devices_r510.txt").read_text())
    (gpu,) = t.gpus
    assert (gpu.name, gpu.mig_mode, gpu.ecc_cell, gpu.memory_total_mib) == (
        "NVIDIA A100-PCI...", "Enabled", "On", 40960)
    assert t.mig_devices == [] and t.processes == [] and t.missing == []


def test_a_paste_from_the_mig_devices_box_on() -> None:
    t = parse_nvidia_smi_table((PUBLIC / "nvidia-smi_a100-mig-devices-only_r450-guide.txt")
                               .read_text())
    assert t.gpus == [] and t.driver_version is None
    assert [(m.gpu, m.gpu_instance_id, m.mig_device, m.memory_total_mib, m.sm_count,
             m.bar1_total_mib) for m in t.mig_devices] == [(0, 1, 0, 20224, 42, None),
                                                          (0, 2, 1, 20096, 42, None)]
    assert t.missing == ["the GPU table (the paste starts at the MIG devices table)"]


def test_interleaved_outputs_of_several_hosts_are_refused_saying_so() -> None:
    with pytest.raises(ParseError) as exc:
        parse_nvidia_smi_table((PUBLIC / "nvidia-smi_interleaved-banners_open-clip-614.txt")
                               .read_text())
    assert exc.value.line_no == 13
    assert exc.value.what.split(": ", 1)[1].startswith(
        "2 nvidia-smi banners (lines 5, 13): several outputs in one text, interleaved")
    assert "--tag-output" in exc.value.what


def test_a_table_with_its_prompt_and_command() -> None:
    text = (RECIPE / "nvidia-smi.txt").read_text()
    t = parse_nvidia_smi_table("root@vm:~/a100-poc# nvidia-smi | tee nvidia-smi.txt\n" + text)
    assert [g.name for g in t.gpus] == ["NVIDIA H200"]
    assert [(i.line_no, i.kind) for i in t.ignored_lines] == [(1, "shell-prompt")]


def test_the_recipe_s_noheader_csv() -> None:
    facts = parse_query_gpu_noheader((RECIPE / "gpus-noheader.csv").read_text())
    (g,) = facts.gpus
    assert (g.index, g.name, g.memory_total_mib, g.power_limit_w, g.driver_version) == (
        0, "NVIDIA H200", 143771, 700.0, "580.159.04")
    assert g.uuid == "GPU-724d78fc-1a5e-f6d9-e6c2-cb697e0fe053"
    assert facts.header_assumed == "index,name,uuid,memory.total,power.limit,driver_version"


@pytest.mark.parametrize("text", [
    "0, NVIDIA H200, GPU-724d78fc, 143771\n",  # four fields: another query
    "NVIDIA H200, 0, GPU-724d78fc-1a5e, 143771, 700.00, 580.159.04\n",  # another order
    "0, NVIDIA H200, GPU-724d78fc-1a5e, 143771 GiB, 700.00, 580.159.04\n",
])
def test_a_headerless_csv_of_another_query_is_refused(text: str) -> None:
    with pytest.raises(ParseError) as exc:
        parse_query_gpu_noheader(text)
    assert "only with the acceptance recipe's fields" in exc.value.what


def test_the_typed_readers() -> None:
    assert (INT("8"), MIB("81920 MiB"), MIB("[N/A]"), WATTS("700.00 W"), CELSIUS("34 C")) == (
        8, 81920, None, 700.0, 34)
    assert (FLAG("Enabled"), FLAG("Not Active"), TEXT(" H200 "), TEXT("N/A")) == (
        True, False, "H200", None)
    reasons = REASONS("0x0000000000000004")
    assert reasons is not None and reasons.active == ["SwPowerCap"]
    for conv, raw in ((MIB, "80 GiB"), (INT, "8.5"), (FLAG, "maybe"), (REASONS, "4")):
        with pytest.raises(ValueError):
            conv(raw)
