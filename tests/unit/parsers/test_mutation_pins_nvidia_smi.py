"""Exact-value pins of the --query-gpu (with and without header) and -L parse functions.

Each test starts from a real capture (tests/fixtures) and edits one thing, then
asserts the whole parsed record or the exact error: message, line number, line.
"""
from __future__ import annotations

from orchestrator.parsers.nvidia_smi import (
    parse_nvidia_smi_l,
    parse_query_gpu,
    parse_query_gpu_noheader,
)
from tests.unit.parsers.refusal import is_refusal, refused

Q = "nvidia-smi-query-gpu"
QN = "nvidia-smi-query-gpu-noheader"




# ----------------------------------------------------------------- --query-gpu


def test_query_gpu_whole_record_small_query() -> None:
    text = ("\n Index , name, memory.total [MiB], power.draw [W], fan.speed [%]\n"
            "\n0, NVIDIA H200, 143771 MiB, 80.61 W, [N/A]\n"
            "1, NVIDIA H200, [N/A], 80.92 W, 30 %\n")
    facts = parse_query_gpu(text)
    assert facts.fields == ["Index", "name", "memory.total", "power.draw", "fan.speed"]
    assert facts.header_assumed is None
    dumped = [g.model_dump(exclude_defaults=True) for g in facts.gpus]
    assert dumped == [
        {"index": 0, "name": "NVIDIA H200", "memory_total_mib": 143771, "power_draw_w": 80.61,
         "other": {"fan.speed": None}},
        {"index": 1, "name": "NVIDIA H200", "power_draw_w": 80.92,
         "other": {"fan.speed": "30 %"}}]


def test_query_gpu_alias_after_a_value_is_kept_as_other_and_after_na_is_read() -> None:
    facts = parse_query_gpu("name, gpu_name, power.draw, power.draw.average\n"
                            "H200, Other, [N/A], 81.5\n")
    (g,) = facts.gpus
    assert (g.name, g.power_draw_w) == ("H200", 81.5)
    assert g.other == {"gpu_name": "Other"}


def test_query_gpu_error_cells_are_recorded() -> None:
    facts = parse_query_gpu("index, memory.used [MiB], temperature.gpu, power.draw [W]\n"
                            "0, [GPU requires reset], [Unknown Error], GPU is lost\n")
    (g,) = facts.gpus
    assert g.errors == ["memory.used: [GPU requires reset]", "temperature.gpu: [Unknown Error]",
                        "power.draw: GPU is lost"]
    assert (g.index, g.memory_used_mib, g.temperature_gpu_c, g.power_draw_w) == (0, None, None,
                                                                               None)


def test_query_gpu_errors(real) -> None:
    is_refusal(refused(parse_query_gpu, "\n  \n"), Q, "empty output", None, None)
    for hdr, col in [("\nindex, 0", "0"), ("\nindex, -1.5", "-1.5"),
                     ("\nindex, GPU-0000-aa", "GPU-0000-aa"), ("\nindex, 1abc", "1abc"),
                     ("\nindex, power.draw [W", "power.draw [W")]:
        is_refusal(refused(parse_query_gpu, hdr), Q, f"header column {col!r} is not a field name (the "
            "query must use --format=csv with its header)", 2, hdr.strip("\n"))
    is_refusal(refused(parse_query_gpu, "\nindex, Name, name\n"), Q, "a field appears twice in the header",
        2, "index, Name, name")
    is_refusal(refused(parse_query_gpu, "index, name\n\n0\n"), Q, "1 columns, header has 2", 3, "0")
    is_refusal(refused(parse_query_gpu, "index, name\n0, a, b\n"), Q, "3 columns, header has 2", 2,
        "0, a, b")
    is_refusal(refused(parse_query_gpu, "index, name\nzero, a\n"), Q, _conv_message("index", "zero"), 2,
        "zero, a")


def _conv_message(name: str, cell: str) -> str:
    from orchestrator.parsers.nvidia_smi import _COLUMNS
    try:
        _COLUMNS[name.lower()][1](cell)
    except ValueError as exc:
        return f"{name}: {exc}"
    raise AssertionError("no error")


def test_query_gpu_real_h200_first_gpu(real) -> None:
    facts = parse_query_gpu(real("query-gpu.csv"))
    g = facts.gpus[0].model_dump(exclude_defaults=True)
    reasons = g.pop("clocks_event_reasons")
    assert reasons["mask"] == 1
    assert g == {
        "index": 0, "name": "NVIDIA H200", "uuid": "GPU-00000000-1111-2222-3333-000000000000",
        "serial": "1650000000000", "pci_bus_id": "00000000:00:06.0",
        "memory_total_mib": 143771, "memory_used_mib": 0, "power_limit_w": 700.0,
        "power_max_limit_w": 700.0, "power_draw_w": 80.61, "enforced_power_limit_w": 700.0,
        "driver_version": "580.159.04", "vbios_version": "96.00.A5.00.1A",
        "pcie_gen_current": 5, "pcie_gen_max": 5, "pcie_width_current": 16,
        "pcie_width_max": 16, "temperature_gpu_c": 34, "temperature_memory_c": 39,
        "clocks_sm_mhz": 345, "clocks_max_sm_mhz": 1980, "clocks_mem_mhz": 3201,
        "ecc_enabled": True, "ecc_uncorrected_volatile": 0, "ecc_corrected_volatile": 0,
        "mig_enabled": False, "compute_mode": "Default", "persistence_mode": True,
        "utilization_gpu_pct": 0}


# ----------------------------------------------------------------- noheader


RECIPE_LINE = "0, NVIDIA H200, GPU-00000000-1111-2222-3333-000000000000, 143771, 700.00, 580.159.04"


def test_noheader_whole_record() -> None:
    text = "\n" + RECIPE_LINE + "\n\n" + RECIPE_LINE.replace("0, ", "1, ", 1) + "\n"
    facts = parse_query_gpu_noheader(text)
    assert facts.header_assumed == "index,name,uuid,memory.total,power.limit,driver_version"
    assert facts.fields == ["index", "name", "uuid", "memory.total", "power.limit",
                            "driver_version"]
    assert [g.model_dump(exclude_defaults=True) for g in facts.gpus] == [
        {"index": k, "name": "NVIDIA H200", "uuid": "GPU-00000000-1111-2222-3333-000000000000",
         "memory_total_mib": 143771, "power_limit_w": 700.0, "driver_version": "580.159.04"}
        for k in (0, 1)]


def test_noheader_errors(real) -> None:
    is_refusal(refused(parse_query_gpu_noheader, " \n\n"), QN, "empty output", None, None)
    what = ("a CSV without its header is read only with the acceptance recipe's fields "
            "(index,name,uuid,memory.total,power.limit,driver_version), each value of its "
            "field's shape; save other queries with --format=csv (with the header)")
    lines = real("query-gpu-nounits.csv").splitlines()
    is_refusal(refused(parse_query_gpu_noheader, "\n" + RECIPE_LINE + "\n" + lines[1]), QN, what, 3,
        lines[1])


def test_noheader_memory_with_its_unit_and_na_power_are_read() -> None:
    bad = RECIPE_LINE.replace("143771", "143771 MiB").replace("700.00", "[N/A]")
    assert parse_query_gpu_noheader(bad).gpus[0].power_limit_w is None


# ----------------------------------------------------------------- -L


def test_l_whole_record_with_mig(public) -> None:
    facts = parse_nvidia_smi_l("\n" + public("nvidia-smi-L_h200-mig_r590.txt"))
    assert facts.model_dump() == {"gpus": [{
        "index": 0, "name": "NVIDIA H200", "uuid": "GPU-00000000-0000-0000-0000-000000000000",
        "mig_devices": [
            {"profile": p, "index": k, "uuid": f"MIG-0000000{k}-0000-0000-0000-00000000000{k}"}
            for k, p in enumerate(["1c.3g.71gb", "2c.3g.71gb", "2g.35gb", "1g.18gb",
                                   "1g.18gb"])]}]}


def test_l_real_two_gpus_with_trailing_spaces(real) -> None:
    text = real("nvidia-smi-L.txt").replace(")\n", ")   \n")
    facts = parse_nvidia_smi_l(text)
    assert [(g.index, g.name, g.uuid[-1], g.mig_devices) for g in facts.gpus] == [
        (0, "NVIDIA H200", "0", []), (1, "NVIDIA H200", "1", [])]


def test_l_no_devices_and_errors(real) -> None:
    assert parse_nvidia_smi_l("\n  No devices were found \n").gpus == []
    kind = "nvidia-smi-L"
    is_refusal(refused(parse_nvidia_smi_l, "\n \n"), kind, "empty output", None, None)
    is_refusal(refused(parse_nvidia_smi_l, ""), kind, "empty output", None, None)
    lines = real("nvidia-smi-L.txt").splitlines()
    what = "not a GPU or MIG device line"
    is_refusal(refused(parse_nvidia_smi_l, lines[0] + "\nNo devices were found"), kind, what, 2,
        "No devices were found")
    mig = "  MIG 1g.18gb     Device  3: (UUID: MIG-00000003-0000-0000-0000-000000000003)"
    is_refusal(refused(parse_nvidia_smi_l, "\n" + mig), kind, what, 2, mig)
    is_refusal(refused(parse_nvidia_smi_l, lines[0] + "\nGPU 1: H200"), kind, what, 2, "GPU 1: H200")


def test_l_gpus_after_no_devices_are_read(real) -> None:
    facts = parse_nvidia_smi_l("No devices were found\n" + real("nvidia-smi-L.txt"))
    assert [g.index for g in facts.gpus] == [0, 1]
