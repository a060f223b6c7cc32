"""Exact-value pins of the nvlink -e and --query-compute-apps parse functions.

Each test starts from a capture (tests/fixtures) and edits one thing, then asserts
the whole parsed record or the exact error: message, line number, line.
"""
from __future__ import annotations

import pytest

from orchestrator.parsers.nvidia_smi_health import parse_compute_apps, parse_nvlink_errors
from tests.unit.parsers.refusal import is_refusal, refused

NVLINK_WHAT = "not a `GPU N:` or `Link L: <counter>: <count>` line"




# ----------------------------------------------------------------- nvlink -e


def test_nvlink_e_whole_record(synth) -> None:
    text = "\n" + synth("nvlink-e_2x-a100-crc_r535.txt").replace(
        "A100-SXM4-80GB (UUID: GPU-11111111-2222-3333-4444-555555555501)", "A100-SXM4-80GB  ")
    facts = parse_nvlink_errors(text)
    zero = {"Replay Errors": 0, "Recovery Errors": 0, "CRC Errors": 0}
    assert facts.model_dump() == {"elided": False, "gpus": [
        {"index": 0, "name": "NVIDIA A100-SXM4-80GB",
         "uuid": "GPU-11111111-2222-3333-4444-555555555500",
         "links": {0: zero, 1: {"Replay Errors": 12, "Recovery Errors": 1, "CRC Errors": 4}},
         "messages": [], "line_no": 2},
        {"index": 1, "name": "NVIDIA A100-SXM4-80GB", "uuid": None,
         "links": {0: {**zero, "CRC Errors": None}, 1: zero}, "messages": [], "line_no": 9},
        {"index": 2, "name": "NVIDIA A100-PCIE-40GB",
         "uuid": "GPU-11111111-2222-3333-4444-555555555502", "links": {},
         "messages": ["NVML: Unable to retrieve NVLink information as all links are inActive"],
         "line_no": 16}]}


@pytest.mark.parametrize("cut", ["[...]", "...", "[snip]"])
def test_nvlink_e_elision(public, cut: str) -> None:
    facts = parse_nvlink_errors(public("nvlink-e_h100_mle.txt").replace("[...]", cut))
    assert facts.elided is True and sorted(facts.gpus[0].links) == [0, 1, 17]


def test_nvlink_e_fragment_starting_inside_the_links(synth) -> None:
    lines = synth("nvlink-e_2x-a100-crc_r535.txt").splitlines()
    facts = parse_nvlink_errors("\n".join(["", lines[4], lines[5]]))
    assert facts.model_dump()["gpus"] == [
        {"index": -1, "name": "", "uuid": None, "messages": [], "line_no": 2,
         "links": {1: {"Replay Errors": 12, "Recovery Errors": 1}}}]
    facts = parse_nvlink_errors("\n" + lines[15] + "\n" + lines[4])
    assert facts.model_dump()["gpus"] == [
        {"index": -1, "name": "", "uuid": None, "line_no": 2, "links": {1: {"Replay Errors": 12}},
         "messages": ["NVML: Unable to retrieve NVLink information as all links are inActive"]}]


def test_nvlink_e_an_indented_gpu_line_is_not_a_gpu(synth) -> None:
    lines = synth("nvlink-e_2x-a100-crc_r535.txt").splitlines()
    bad = "\n".join([lines[0], "\t" + lines[7]])
    is_refusal(refused(parse_nvlink_errors, bad), "nvlink-e", NVLINK_WHAT, 2, "\t" + lines[7])


def test_nvlink_e_counter_errors(synth) -> None:
    lines = synth("nvlink-e_2x-a100-crc_r535.txt").splitlines()
    bad = "\n".join([lines[0], "\t Link 0: CRC Errors: many"])
    is_refusal(refused(parse_nvlink_errors, bad), "nvlink-e", "CRC Errors is not a count", 2,
        "\t Link 0: CRC Errors: many")
    bad = "\n".join([lines[0], "\t Link 0: CRC Errors: 1.5"])
    is_refusal(refused(parse_nvlink_errors, bad), "nvlink-e", "CRC Errors is not a count", 2,
        "\t Link 0: CRC Errors: 1.5")
    is_refusal(refused(parse_nvlink_errors, "\n\nsomething"), "nvlink-e", NVLINK_WHAT, 3, "something")


def test_nvlink_e_counter_value_spaces_and_na(synth) -> None:
    lines = synth("nvlink-e_2x-a100-crc_r535.txt").splitlines()
    facts = parse_nvlink_errors("\n".join([lines[0], "\t Link 3: Replay Errors: 7   ",
                                           "\t Link 3: CRC Errors: [N/A]"]))
    assert facts.gpus[0].links == {3: {"Replay Errors": 7, "CRC Errors": None}}


# ----------------------------------------------------------------- compute apps


def test_compute_apps_whole_record_every_column() -> None:
    text = ("\n gpu_name, gpu_bus_id, gpu_uuid, pid, name, used_memory [MiB]\n"
            "NVIDIA H200, 00000000:18:00.0, GPU-aaaa, 4242, python3, 30000 MiB\n"
            "\n"
            "NVIDIA H200, 00000000:2A:00.0, GPU-bbbb, 77, [N/A], [N/A]\n")
    facts = parse_compute_apps(text)
    assert facts.model_dump() == {
        "fields": ["gpu_name", "gpu_bus_id", "gpu_uuid", "pid", "process_name", "used_mib"],
        "apps": [{"line_no": 3, "pid": 4242, "process_name": "python3", "used_mib": 30000,
                  "gpu_uuid": "GPU-aaaa", "gpu_bus_id": "00000000:18:00.0",
                  "gpu_name": "NVIDIA H200"},
                 {"line_no": 5, "pid": 77, "process_name": None, "used_mib": None,
                  "gpu_uuid": "GPU-bbbb", "gpu_bus_id": "00000000:2A:00.0",
                  "gpu_name": "NVIDIA H200"}]}


def test_compute_apps_pid_only_and_no_processes_line() -> None:
    facts = parse_compute_apps("pid\n  No running processes found  \n12\n")
    assert facts.model_dump() == {"fields": ["pid"], "apps": [
        {"line_no": 3, "pid": 12, "process_name": None, "used_mib": None, "gpu_uuid": None,
         "gpu_bus_id": None, "gpu_name": None}]}


def test_compute_apps_errors() -> None:
    kind = "nvidia-smi-compute-apps"
    is_refusal(refused(parse_compute_apps, " \n\n"), kind, "empty output", None, None)
    for hdr, col in [("\npid, index", "index"), ("\npid, Used_memory", "Used_memory"),
                     ("\npid, 3", "3")]:
        is_refusal(refused(parse_compute_apps, hdr), kind, f"header column {col!r} is not a compute-apps "
            "field (the query must use --format=csv with its header)", 2, hdr.strip())
    is_refusal(refused(parse_compute_apps, "\nprocess_name, used_memory [MiB]\nx, 1 MiB\n"), kind,
        "the query has no pid column", 2, "process_name, used_memory [MiB]")
    is_refusal(refused(parse_compute_apps, "pid, name\n12\n"), kind, "1 columns, header has 2", 2, "12")
    is_refusal(refused(parse_compute_apps, "pid, name\n12, a, b\n"), kind, "3 columns, header has 2", 2,
        "12, a, b")
    is_refusal(refused(parse_compute_apps, "pid, name\nx, a\n"), kind,
        "invalid literal for int() with base 10: 'x'", 2, "x, a")
    is_refusal(refused(parse_compute_apps, "pid, used_memory [MiB]\n1, 3 GiB\n"), kind,
        str(_value_error("3 GiB")), 2, "1, 3 GiB")


def _value_error(cell: str) -> ValueError:
    from orchestrator.parsers.nvidia_smi import integer
    try:
        integer(cell, "MiB")
    except ValueError as exc:
        return exc
    raise AssertionError("no error")
