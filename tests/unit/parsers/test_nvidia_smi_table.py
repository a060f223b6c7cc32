"""The default nvidia-smi table, on the H200 capture and on tables other fleets published."""

from __future__ import annotations

import pytest

from orchestrator.errors import ParseError
from orchestrator.parsers import get, parse
from orchestrator.parsers.nvidia_smi_table import NvidiaSmiTableFacts, parse_nvidia_smi_table


def test_registered() -> None:
    assert get("nvidia-smi-table").func is parse_nvidia_smi_table


def test_real_h200(real) -> None:
    facts = parse("nvidia-smi-table", real("nvidia-smi.txt"))
    assert isinstance(facts, NvidiaSmiTableFacts)
    assert (facts.timestamp, facts.smi_version, facts.driver_version, facts.cuda_version) == (
        "Mon Nov 30 04:53:05 2026", "580.159.04", "580.159.04", "13.0")
    assert facts.layout == "3-row" and facts.count == 2
    g0, g1 = facts.gpus
    assert (g0.index, g0.name, g0.name_truncated, g0.persistence_mode) == (0, "NVIDIA H200", False,
                                                                          True)
    assert (g0.bus_id, g0.display_active, g0.ecc_uncorrected) == ("00000000:00:06.0", "Off", 0)
    assert (g0.fan_pct, g0.temperature_c, g0.performance_state) == (None, 34, "P0")
    assert (g0.power_draw_w, g0.power_cap_w) == (80.0, 700.0)
    assert (g0.memory_used_mib, g0.memory_total_mib) == (0, 143771)
    assert (g0.utilization_pct, g0.compute_mode, g0.mig_mode) == (0, "Default", "Disabled")
    assert g1.bus_id == "00000000:00:07.0" and g1.temperature_c == 33
    assert facts.processes == [] and facts.mig_devices == [] and facts.missing == []


def test_eight_h100_r550(public) -> None:
    facts = parse_nvidia_smi_table(public("nvidia-smi_8x-h100-80gb-hbm3_r550.txt"))
    assert facts.count == 8 and facts.cuda_version == "12.4"
    assert {g.name for g in facts.gpus} == {"NVIDIA H100 80GB HBM3"}
    assert [g.memory_total_mib for g in facts.gpus] == [81559] * 8
    assert facts.gpus[7].bus_id == "00000000:DB:00.0" and facts.gpus[7].power_draw_w == 72.0


def test_mig_devices_and_processes_h200(public) -> None:
    facts = parse_nvidia_smi_table(public("nvidia-smi_h200-mig-load_r590.txt"))
    (g,) = facts.gpus
    assert (g.mig_mode, g.ecc_uncorrected, g.ecc_cell, g.utilization_pct) == (
        "Enabled", None, "On", None)
    assert facts.mig_device_count == 5
    d0, d4 = facts.mig_devices[0], facts.mig_devices[4]
    assert (d0.gpu, d0.gpu_instance_id, d0.compute_instance_id, d0.mig_device) == (0, 2, 0, 0)
    assert (d0.memory_used_mib, d0.memory_total_mib, d0.bar1_total_mib) == (16925, 71424, 59237)
    assert (d0.sm_count, d0.ecc_uncorrected) == (16, 0)
    assert d0.engines == {"CE": 3, "ENC": 0, "DEC": 3, "OFA": 0, "JPG": 3}
    assert (d4.gpu_instance_id, d4.memory_total_mib) == (10, 16384)
    assert facts.processes is not None and len(facts.processes) == 3
    p = facts.processes[2]
    assert (p.gpu, p.gpu_instance_id, p.compute_instance_id, p.pid, p.type, p.name,
            p.memory_mib) == (0, 2, 1, 12267, "C", "./gpu_burn", 13526)


def test_mig_h100(public) -> None:
    facts = parse_nvidia_smi_table(public("nvidia-smi_h100-mig-load_r590.txt"))
    assert [d.memory_total_mib for d in facts.mig_devices] == [40448, 20096, 9984, 9984]


def test_old_two_row_layout_r410(public) -> None:
    facts = parse_nvidia_smi_table(public("nvidia-smi_4x-v100-pcie_r410.txt"))
    assert facts.layout == "2-row" and facts.cuda_version is None
    assert facts.count == 4
    g = facts.gpus[0]
    assert (g.name, g.name_truncated, g.mig_mode, g.utilization_pct) == (
        "Tesla V100-PCIE...", True, None, 44)
    assert (g.memory_used_mib, g.memory_total_mib) == (31194, 32480)
    assert facts.processes is not None
    (p,) = facts.processes
    assert (p.gpu, p.gpu_instance_id, p.pid, p.name, p.memory_mib) == (
        0, None, 305892, "/usr/bin/python", 31181)


def test_fan_err_truncated_name_no_processes_r525(public) -> None:
    facts = parse_nvidia_smi_table(public("nvidia-smi_rtx4090-fan-err_r525.txt"))
    (g,) = facts.gpus
    assert g.errors == ["fan"] and g.fan_pct is None  # ERR! is an error, not a number
    assert g.name == "NVIDIA GeForce ..." and g.name_truncated
    assert g.compute_mode == "E. Process" and g.performance_state == "P5"
    assert facts.processes is None and facts.missing == ["processes table"]


def test_kmd_umd_banner_r610(public) -> None:
    facts = parse_nvidia_smi_table(public("nvidia-smi_rtx2080s-kmd-umd_r610.txt"))
    assert (facts.driver_version, facts.cuda_version) == ("610.57.04", "13.3")
    assert facts.gpus[0].ecc_uncorrected is None and facts.gpus[0].ecc_cell is None  # N/A
    assert facts.processes is not None
    assert [(p.gpu_instance_id, p.type, p.name) for p in facts.processes] == [
        (None, "G", "/usr/bin/gnome-shell"), (None, "G", "/usr/bin/Xwayland")]


def test_cut_off_inside_a_gpu_block_keeps_the_rest(real) -> None:
    text = "\n".join(real("nvidia-smi.txt").splitlines()[:14]) + "\n"
    facts = parse_nvidia_smi_table(text)
    assert facts.count == 1 and facts.gpus[0].bus_id == "00000000:00:06.0"
    assert facts.missing[0].startswith("the rest of the GPU block at line 13")
    assert "processes table" in facts.missing


@pytest.mark.parametrize("bad,line_no", [
    ("|   0  NVIDIA H200                    On  |", 9),
    ("| N/A   34C    P0             80W /  700W |       0MiB / 143771MiB |      0%      Default |",
     9),
])
def test_malformed_gpu_row_names_its_line(real, bad: str, line_no: int) -> None:
    lines = real("nvidia-smi.txt").splitlines()
    lines[line_no - 1] = bad
    with pytest.raises(ParseError) as exc:
        parse_nvidia_smi_table("\n".join(lines), source="t.txt")
    assert exc.value.line_no == line_no


def test_bad_value_and_foreign_text(real) -> None:
    with pytest.raises(ParseError) as exc:
        parse_nvidia_smi_table(real("nvidia-smi.txt").replace("34C", "hotC"))
    assert exc.value.line_no == 10
    with pytest.raises(ParseError):
        parse_nvidia_smi_table("NVIDIA-SMI has failed because it couldn't communicate with the "
                               "NVIDIA driver.\n")
    with pytest.raises(ParseError):
        parse_nvidia_smi_table("")
    with pytest.raises(ParseError) as exc:
        parse_nvidia_smi_table(real("nvidia-smi.txt") + "extra words\n")
    assert exc.value.line_no == 25
