"""nvidia-smi -q text: the H200 capture, other fleets' pastes, excerpts and cut-off files."""

from __future__ import annotations

import pytest

from orchestrator.errors import ParseError
from orchestrator.parsers import get, parse
from orchestrator.parsers.nvidia_smi import ClockEventReasons
from orchestrator.parsers.nvidia_smi_q import NvidiaSmiQFacts, parse_nvidia_smi_q
from orchestrator.parsers.nvidia_smi_xml import parse_nvidia_smi_xml


def test_registered() -> None:
    assert get("nvidia-smi-q").func is parse_nvidia_smi_q


def test_real_h200_agrees_with_its_xml(real) -> None:
    facts = parse("nvidia-smi-q", real("nvidia-smi-q.txt"))
    assert isinstance(facts, NvidiaSmiQFacts)
    assert (facts.driver_version, facts.cuda_version, facts.attached_gpus, facts.count) == (
        "580.159.04", "13.0", 2, 2)
    assert facts.elided_gpus is None
    xml = parse_nvidia_smi_xml(real("nvidia-smi-q.xml"))
    for q, x in zip(facts.gpus, xml.gpus, strict=True):
        assert q.bus_id == x.pci_bus_id and q.uuid == x.uuid
        for field in ("product_name", "memory_total_mib", "memory_used_mib", "mig_enabled",
                      "pcie_gen_current", "pcie_gen_max", "pcie_width_current", "pcie_width_max",
                      "power_limit_w", "power_max_limit_w", "power_min_limit_w",
                      "clocks_max_sm_mhz", "clocks_event_reasons", "ecc_volatile",
                      "retired_pages", "remapped_rows", "temperature_gpu_c"):
            assert getattr(q, field) == getattr(x, field), field
    g = facts.gpus[0]
    assert g.pcie_gen_host_max is None and g.memory_reserved_mib == 616
    assert g.processes == [] and g.missing == []


def test_h100_r535_host_max_and_hw_slowdown(public) -> None:
    facts = parse_nvidia_smi_q(public("nvidia-smi-q_8x-h100-80gb-hbm3_r535.txt"))
    assert facts.count == 8 and facts.gpus[2].bus_id == "00000000:4C:00.0"
    g = facts.gpus[0]
    assert (g.pcie_gen_current, g.pcie_gen_max, g.pcie_gen_host_max) == (5, 5, 5)
    assert g.clocks_event_reasons == ClockEventReasons(
        mask=0x88, active=["HwSlowdown", "HwPowerBrakeSlowdown"])
    assert g.clocks_event_reasons.slowdown == ["HwSlowdown", "HwPowerBrakeSlowdown"]
    assert g.remapped_rows is not None and g.remapped_rows.pending is False
    assert g.retired_pages.pending is None  # N/A on a GPU that remaps rows


def test_a100_dash_a_r535_host_below_device(public) -> None:
    facts = parse_nvidia_smi_q(public("nvidia-smi-a_8x-a100-sxm4-40gb_r535.txt"))
    assert facts.count == 8
    g = facts.gpus[0]
    assert g.product_name == "NVIDIA A100-SXM4-40GB" and g.memory_total_mib == 40960
    assert (g.pcie_gen_current, g.pcie_gen_host_max, g.pcie_width_max) == (4, 3, 16)


def test_one_gpu_of_eight_is_an_elided_excerpt(public) -> None:
    facts = parse_nvidia_smi_q(public("nvidia-smi-q-i0_a100-sxm4-40gb_r535.txt"))
    assert (facts.attached_gpus, facts.count, facts.elided_gpus) == (8, 1, 7)


def test_titan_v_old_ecc_layout_power_cap_and_idle_link(public) -> None:
    (g,) = parse_nvidia_smi_q(public("nvidia-smi-q_titan-v_r560.txt")).gpus
    assert (g.pcie_gen_current, g.pcie_gen_max) == (1, 3)
    assert (g.power_limit_w, g.power_default_limit_w, g.power_max_limit_w) == (250.0, 250.0, 300.0)
    assert g.mig_enabled is None and g.remapped_rows is None  # N/A on Volta
    assert g.ecc_volatile.uncorrectable is None  # Single/Double Bit totals are N/A


def test_mig_devices_and_processes_h200(public) -> None:
    (g,) = parse_nvidia_smi_q(public("nvidia-smi-q_h200-mig-load_r590.txt")).gpus
    assert g.mig_enabled is True and g.mig_pending_enabled is True
    assert [(d.index, d.gpu_instance_id, d.compute_instance_id, d.multiprocessor_count,
             d.memory_total_mib) for d in g.mig_devices][:3] == [
        (0, 2, 0, 16, 71424), (1, 2, 1, 32, 71424), (2, 3, 0, 32, 33280)]
    assert len(g.mig_devices) == 5
    assert g.processes is not None
    assert [(p.gpu_instance_id, p.compute_instance_id, p.pid, p.name, p.used_memory_mib)
            for p in g.processes][0] == (2, 1, 12249, "/root/tools/memhog", 2194)


def test_rtx4090_processes_and_no_mig(public) -> None:
    facts = parse_nvidia_smi_q(public("nvidia-smi-q_8x-rtx4090_r535.txt"))
    g = facts.gpus[0]
    assert g.product_name == "NVIDIA GeForce RTX 4090" and g.mig_enabled is None
    assert g.processes is not None and len(g.processes) == 1
    assert g.processes[0].type == "C"


def test_file_cut_short_reports_what_is_missing(public) -> None:
    facts = parse_nvidia_smi_q(public("nvidia-smi-q_h100-cut-short_r535.txt"))
    assert (facts.attached_gpus, facts.count, facts.elided_gpus) == (8, 1, 7)
    (g,) = facts.gpus
    assert g.product_name == "NVIDIA H100 80GB HBM3" and g.pcie_gen_current == 5
    assert g.memory_total_mib is None
    assert {"memory total", "remapped rows", "max power limit", "processes"} <= set(g.missing)
    assert "Invalid HW Slowdown" not in g.clocks_event_reasons.active  # type: ignore[union-attr]


def test_sed_excerpt_of_only_the_mig_section(real) -> None:
    """`nvidia-smi -q | sed -n '/MIG Mode/,/Pending/p'`: no banner, no GPU lines."""
    lines = real("nvidia-smi-q.txt").splitlines()
    text = "".join("\n".join(lines[i:i + 3]) + "\n" for i, ln in enumerate(lines)
                   if ln.strip() == "MIG Mode")
    facts = parse_nvidia_smi_q(text.replace("Current                                        : "
                                            "Disabled", "Current : Enabled", 1))
    assert facts.attached_gpus is None and facts.count == 2
    assert [g.bus_id for g in facts.gpus] == [None, None]
    assert [g.mig_enabled for g in facts.gpus] == [True, False]
    assert "memory total" in facts.gpus[0].missing and "MIG mode" not in facts.gpus[0].missing


def test_grep_excerpt_with_separators(real) -> None:
    lines = real("nvidia-smi-q.txt").splitlines()
    blocks = ["\n".join(lines[i:i + 5]) for i, ln in enumerate(lines)
              if ln.strip() == "FB Memory Usage"]
    facts = parse_nvidia_smi_q("\n--\n".join(blocks) + "\n")
    assert [g.memory_total_mib for g in facts.gpus] == [143771, 143771]


def test_bad_value_names_its_line(real) -> None:
    text = real("nvidia-smi-q.txt").replace("143771 MiB", "lots", 1)
    with pytest.raises(ParseError) as exc:
        parse_nvidia_smi_q(text)
    assert exc.value.line_no == 112 and "Total" in str(exc.value)


def test_not_q_text() -> None:
    with pytest.raises(ParseError):
        parse_nvidia_smi_q("")
    with pytest.raises(ParseError) as exc:
        parse_nvidia_smi_q("GPU 0: NVIDIA H200 (UUID: GPU-0)\n")
    assert exc.value.line_no == 1
    with pytest.raises(ParseError):
        parse_nvidia_smi_q("Attached GPUs : many\n")


def test_xml_attached_count_processes_and_host_max(real) -> None:
    xml = real("nvidia-smi-q.xml")
    facts = parse_nvidia_smi_xml(xml)
    assert facts.attached_gpus == 2 and facts.gpus[0].processes == []
    assert (facts.gpus[0].pcie_gen_device_max, facts.gpus[0].pcie_gen_host_max) == (5, None)
    proc = ("<process_info><gpu_instance_id>N/A</gpu_instance_id>"
            "<compute_instance_id>N/A</compute_instance_id><pid>4242</pid><type>C</type>"
            "<process_name>python3</process_name><used_memory>1536 MiB</used_memory>"
            "</process_info>")
    changed = xml.replace("<processes>", "<processes>" + proc, 1).replace(
        "<max_host_link_gen>N/A</max_host_link_gen>", "<max_host_link_gen>4</max_host_link_gen>", 1)
    g = parse_nvidia_smi_xml(changed).gpus[0]
    assert g.pcie_gen_host_max == 4
    assert g.processes is not None and [(p.pid, p.type, p.name, p.used_memory_mib,
                                         p.gpu_instance_id) for p in g.processes] == [
        (4242, "C", "python3", 1536, None)]
    with pytest.raises(ParseError):
        parse_nvidia_smi_xml(xml.replace("<attached_gpus>2<", "<attached_gpus>two<"))
