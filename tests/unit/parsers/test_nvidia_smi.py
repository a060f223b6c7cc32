from __future__ import annotations

import pytest

from orchestrator.errors import ParseError
from orchestrator.parsers import get, parse
from orchestrator.parsers.nvidia_smi import (
    ClockEventReasons,
    NvidiaSmiLFacts,
    QueryGpuFacts,
    parse_nvidia_smi_l,
    parse_query_gpu,
)
from orchestrator.parsers.nvidia_smi_xml import NvidiaSmiXmlFacts, parse_nvidia_smi_xml


def test_registered() -> None:
    for kind in ("nvidia-smi-query-gpu", "nvidia-smi-L", "nvidia-smi-q-xml"):
        assert get(kind).func is not None


# ----------------------------------------------------------------- query-gpu

def test_query_gpu_real_h200(real) -> None:
    facts = parse("nvidia-smi-query-gpu", real("query-gpu.csv"))
    assert isinstance(facts, QueryGpuFacts)
    assert facts.count == 2
    g0 = facts.gpus[0]
    assert g0.name == "NVIDIA H200"
    assert g0.memory_total_mib == 143771
    assert g0.power_limit_w == 700.0 and g0.power_max_limit_w == 700.0
    assert g0.power_draw_w == 80.61
    assert g0.driver_version == "580.159.04"
    assert (g0.pcie_gen_current, g0.pcie_gen_max) == (5, 5)
    assert (g0.pcie_width_current, g0.pcie_width_max) == (16, 16)
    assert g0.clocks_sm_mhz == 345 and g0.clocks_max_sm_mhz == 1980 and g0.clocks_mem_mhz == 3201
    assert g0.clocks_event_reasons == ClockEventReasons(mask=1, active=["GpuIdle"])
    assert g0.clocks_event_reasons.slowdown == []
    assert g0.retired_pages_pending is None  # [N/A], not False
    assert g0.mig_enabled is False and g0.ecc_enabled is True and g0.persistence_mode is True
    assert g0.ecc_uncorrected_volatile == 0
    assert g0.utilization_gpu_pct == 0
    assert facts.gpus[1].temperature_gpu_c == 33


def test_query_gpu_noheader_is_refused(real) -> None:
    with pytest.raises(ParseError) as exc:
        parse_query_gpu(real("query-gpu-nounits.csv"), source="q.csv")
    assert exc.value.line_no == 1


def test_query_gpu_dgx_a100(synth) -> None:
    facts = parse_query_gpu(synth("query-gpu_dgx-a100-80gb_r535.csv"))
    assert facts.count == 8
    assert {g.name for g in facts.gpus} == {"NVIDIA A100-SXM4-80GB"}
    assert all(g.memory_total_mib == 81920 for g in facts.gpus)
    assert facts.gpus[5].clocks_event_reasons is not None
    assert facts.gpus[5].clocks_event_reasons.slowdown == ["SwPowerCap"]
    assert facts.gpus[6].ecc_uncorrected_volatile == 2
    assert facts.gpus[6].ecc_uncorrected_aggregate == 3


def test_query_gpu_old_throttle_name_and_na(synth) -> None:
    facts = parse_query_gpu(synth("query-gpu_4x-a100-pcie-40gb_r470.csv"))
    g0, g1, g2, g3 = facts.gpus
    assert g0.name == "NVIDIA A100-PCIE-40GB" and g0.driver_version == "470.182.03"
    assert (g0.pcie_gen_current, g0.pcie_gen_max) == (1, 4)
    assert (g1.pcie_width_current, g1.pcie_width_max) == (8, 16)
    assert g1.power_limit_w == 200.0 and g1.power_max_limit_w == 250.0
    assert g1.clocks_event_reasons is not None
    assert g1.clocks_event_reasons.mask == 0xA4
    assert g1.clocks_event_reasons.active == [
        "SwPowerCap", "SwThermalSlowdown", "HwPowerBrakeSlowdown"]
    assert g2.clocks_event_reasons == ClockEventReasons(mask=0, active=[])
    assert g2.ecc_uncorrected_volatile is None and g2.mig_enabled is None
    assert g3.power_limit_w is None and g3.power_max_limit_w is None  # [Not Supported]
    assert g3.retired_pages_pending is True
    assert g3.clocks_event_reasons is not None
    assert g3.clocks_event_reasons.active == ["HwSlowdown"]


def test_query_gpu_any_order_and_unknown_field(synth) -> None:
    facts = parse_query_gpu(synth("query-gpu_2x-a100-80gb-pcie-vm_r550.csv"))
    g0, g1 = facts.gpus
    assert g0.index == 0 and g0.name == "NVIDIA A100 80GB PCIe" and g0.memory_total_mib == 81920
    assert g0.power_draw_w == 61.27
    assert g1.power_draw_w is None  # [Unknown Error]
    assert g1.clocks_event_reasons is None
    assert g0.other == {"fan.speed": None}
    assert g0.uuid is None  # not queried


def test_query_gpu_column_count_mismatch() -> None:
    text = "index, name, memory.total [MiB]\n0, NVIDIA H200, 143771 MiB\n1, NVIDIA H200\n"
    with pytest.raises(ParseError) as exc:
        parse_query_gpu(text)
    assert exc.value.line_no == 3
    assert "2 columns" in str(exc.value)


def test_query_gpu_wrong_unit_and_bad_reasons() -> None:
    with pytest.raises(ParseError) as exc:
        parse_query_gpu("index, memory.total [MiB]\n0, 80 GiB\n")
    assert exc.value.line_no == 2
    with pytest.raises(ParseError):
        parse_query_gpu("index, clocks_event_reasons.active\n0, Idle\n")
    with pytest.raises(ParseError):
        parse_query_gpu("")


def test_clock_event_reasons_unknown_bit_kept() -> None:
    r = ClockEventReasons.from_mask(0x1 | 0x400)
    assert r.active == ["GpuIdle", "0x400"]


# ----------------------------------------------------------------- -L

def test_l_real_h200(real) -> None:
    facts = parse("nvidia-smi-L", real("nvidia-smi-L.txt"))
    assert isinstance(facts, NvidiaSmiLFacts)
    assert facts.count == 2
    assert facts.gpus[1].name == "NVIDIA H200"
    assert facts.gpus[1].uuid == "GPU-00000000-1111-2222-3333-000000000001"
    assert facts.mig_device_count == 0


def test_l_mig(synth) -> None:
    facts = parse_nvidia_smi_l(synth("nvidia-smi-L_a100-sxm4-80gb-mig_r535.txt"))
    assert facts.count == 4
    assert [m.profile for m in facts.gpus[0].mig_devices] == [
        "3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    assert facts.gpus[0].mig_devices[3].index == 3
    assert facts.gpus[1].mig_devices[0].uuid == "MIG-d5a46a2e-1d77-575d-99e3-1f96c8555a2e"
    assert facts.gpus[2].mig_devices == []
    assert facts.mig_device_count == 5


def test_l_mig_r450(synth) -> None:
    facts = parse_nvidia_smi_l(synth("nvidia-smi-L_a100-sxm4-40gb-mig_r450.txt"))
    assert facts.gpus[0].name == "A100-SXM4-40GB"
    assert facts.gpus[0].mig_devices[1].uuid.endswith("/2/0")


def test_l_pcie_names(synth) -> None:
    facts = parse_nvidia_smi_l(synth("nvidia-smi-L_8x-a100-80gb-pcie_r550.txt"))
    assert facts.count == 8 and facts.gpus[7].name == "NVIDIA A100 80GB PCIe"


def test_l_errors() -> None:
    with pytest.raises(ParseError):
        parse_nvidia_smi_l("")
    bad = ("GPU 0: NVIDIA H200 (UUID: GPU-00000000-1111-2222-3333-000000000000)\n"
           "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n")
    with pytest.raises(ParseError) as exc:
        parse_nvidia_smi_l(bad)
    assert exc.value.line_no == 2
    assert parse_nvidia_smi_l("No devices were found\n").count == 0


# ----------------------------------------------------------------- -q -x

def test_xml_real_h200(real) -> None:
    facts = parse("nvidia-smi-q-xml", real("nvidia-smi-q.xml"))
    assert isinstance(facts, NvidiaSmiXmlFacts)
    assert facts.driver_version == "580.159.04" and facts.cuda_version == "13.0"
    assert facts.count == 2
    g = facts.gpus[0]
    assert g.product_name == "NVIDIA H200" and g.product_brand == "NVIDIA"
    assert g.product_architecture == "Hopper" and g.board_part_number == "692-2G520-0282-001"
    assert g.pci_bus_id == "00000000:00:06.0"
    assert g.memory_total_mib == 143771
    assert g.mig_enabled is False and g.mig_pending_enabled is False and g.mig_devices == []
    assert g.persistence_mode is True
    assert g.remapped_rows is not None
    assert g.remapped_rows.pending is False and g.remapped_rows.failure is False
    assert g.remapped_rows.uncorrectable == 0
    assert g.retired_pages.pending is None
    assert g.ecc_volatile.uncorrectable == 0 and g.ecc_aggregate.correctable == 0
    assert (g.pcie_gen_current, g.pcie_gen_max, g.pcie_width_current, g.pcie_width_max) == (
        5, 5, 16, 16)
    assert g.power_limit_w == 700.0 and g.power_max_limit_w == 700.0
    assert g.power_min_limit_w == 200.0
    assert g.temperature_gpu_c == 34
    assert g.clocks_event_reasons == ClockEventReasons(mask=1, active=["GpuIdle"])
    assert g.clocks_max_sm_mhz == 1980


def test_xml_mig_r535(synth) -> None:
    facts = parse_nvidia_smi_xml(synth("nvidia-smi-q_a100-sxm4-40gb-mig_r535.xml"))
    g0, g1 = facts.gpus
    assert facts.driver_version == "535.129.03"
    assert g0.product_name == "NVIDIA A100-SXM4-40GB" and g0.mig_enabled is True
    assert [(m.gpu_instance_id, m.multiprocessor_count, m.memory_total_mib)
            for m in g0.mig_devices] == [(1, 42, 19968), (2, 42, 19968)]
    assert g1.mig_enabled is False and g1.mig_pending_enabled is True
    assert g1.ecc_volatile.uncorrectable == 1 and g1.ecc_aggregate.correctable == 3
    assert g1.remapped_rows is not None and g1.remapped_rows.pending is True
    assert g1.clocks_event_reasons is not None
    assert g1.clocks_event_reasons.active == ["SwPowerCap", "HwSlowdown"]
    assert g1.clocks_event_reasons.mask == 0xC
    assert (g1.pcie_gen_current, g1.pcie_width_current) == (3, 8)
    assert g0.power_limit_w == 400.0 and g0.power_draw_w == 54.21


def test_xml_r470_old_layout(synth) -> None:
    facts = parse_nvidia_smi_xml(synth("nvidia-smi-q_a100-pcie-40gb_r470.xml"))
    (g,) = facts.gpus
    assert facts.cuda_version == "11.4"
    assert g.product_architecture is None  # not printed by 470
    assert g.power_limit_w == 200.0 and g.power_default_limit_w == 250.0
    assert g.power_max_limit_w == 250.0 and g.power_draw_w == 199.82
    assert g.clocks_event_reasons is not None
    assert g.clocks_event_reasons.mask == 0xA4
    assert g.ecc_aggregate.correctable == 12 and g.ecc_aggregate.uncorrectable == 2
    assert g.ecc_volatile.uncorrectable == 0
    assert g.remapped_rows is not None and g.remapped_rows.failure is True
    assert g.persistence_mode is False


def test_xml_bad_value_names_line(real) -> None:
    text = real("nvidia-smi-q.xml").replace("<total>143771 MiB</total>", "<total>lots</total>", 1)
    with pytest.raises(ParseError) as exc:
        parse_nvidia_smi_xml(text)
    assert exc.value.line_no == 129
    assert exc.value.line is not None and "lots" in exc.value.line


def test_xml_not_xml() -> None:
    with pytest.raises(ParseError) as exc:
        parse_nvidia_smi_xml("<nvidia_smi_log>\n<gpu>\n</nvidia_smi_log>\n")
    assert exc.value.line_no == 3
    with pytest.raises(ParseError):
        parse_nvidia_smi_xml("   \n")


# ----------------------------------------------------------------- other fleets' CSV


def test_query_gpu_mixed_case_fields_r590(public) -> None:
    """212 fields from driver 590: `pci.baseClass`, `fabric.cliqueId`... were refused before."""
    facts = parse_query_gpu(public("query-gpu_h200-mig-load_r590.csv"))
    assert len(facts.fields) == 212 and "encoder.stats.sessionCount" in facts.fields
    (g,) = facts.gpus
    assert (g.name, g.memory_total_mib, g.memory_reserved_mib) == ("NVIDIA H200", 143771, 614)
    assert g.mig_enabled is True and g.mig_pending_enabled is True
    assert (g.pcie_gen_current, g.pcie_gen_max, g.pcie_gen_host_max) == (5, 5, None)
    assert (g.power_limit_w, g.power_max_limit_w, g.power_min_limit_w) == (700.0, 700.0, 200.0)
    assert g.utilization_gpu_pct is None  # [N/A] in MIG mode
    assert g.remapped_rows_pending is None  # [N/A]
    assert g.other["pci.baseClass"] == "0x3" and g.other["fabric.cliqueId"] == "0"
    assert g.other["power.management"] is None  # [Requested functionality has been deprecated]
    assert g.other["pcie.link.gen.gpucurrent"] == "5"  # an alias of a field already read
    assert g.errors == []


def test_query_gpu_l40s_r595(public) -> None:
    (g,) = parse_query_gpu(public("query-gpu_l40s_r595.csv")).gpus
    assert (g.name, g.memory_total_mib, g.pcie_gen_current, g.mig_enabled) == (
        "NVIDIA L40S", 46068, 4, None)
    assert g.remapped_rows_pending is False and g.remapped_rows_uncorrectable == 0


def test_query_gpu_headers_by_meaning() -> None:
    text = ("GPU_Name, Memory.Total [MiB], gpu_bus_id, Index\n"
            "NVIDIA A100-SXM4-80GB, 81920 MiB, 00000000:07:00.0, 3\n")
    (g,) = parse_query_gpu(text).gpus
    assert (g.name, g.memory_total_mib, g.pci_bus_id, g.index) == (
        "NVIDIA A100-SXM4-80GB", 81920, "00000000:07:00.0", 3)
    with pytest.raises(ParseError):
        parse_query_gpu("name, Name\nx, y\n")


def test_query_gpu_error_cells_are_kept_as_errors(real) -> None:
    text = real("query-gpu.csv").replace("143771 MiB, 0 MiB", "[GPU requires reset], 0 MiB", 1)
    g = parse_query_gpu(text).gpus[0]
    assert g.memory_total_mib is None and g.errors == ["memory.total: [GPU requires reset]"]
