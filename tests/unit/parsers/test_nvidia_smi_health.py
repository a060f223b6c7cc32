"""`nvidia-smi nvlink -e` (error counters per link) and `--query-compute-apps`."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import ParseError
from orchestrator.parsers import get, parse
from orchestrator.parsers.nvidia_smi_health import parse_compute_apps, parse_nvlink_errors

H200 = Path(__file__).resolve().parents[2] / "fixtures" / "h200x1-health"


def test_registered() -> None:
    assert get("nvlink-e").func is parse_nvlink_errors
    assert get("nvidia-smi-compute-apps").func is parse_compute_apps


def test_an_h100s_counters_with_elided_links(public) -> None:
    facts = parse("nvlink-e", public("nvlink-e_h100_mle.txt"))
    (gpu,) = facts.gpus
    assert (gpu.index, gpu.name, gpu.uuid) == (0, "NVIDIA H100 80GB HBM3",
                                               "GPU-abcdefab-cdef-abdc-abcd-abababababab")
    assert sorted(gpu.links) == [0, 1, 17] and facts.elided is True
    assert gpu.links[17] == {"Replay Errors": 0, "Recovery Errors": 0, "CRC Errors": 0}
    assert gpu.total() == 0


def test_a_single_gpu_without_nvlink_prints_nothing() -> None:
    facts = parse_nvlink_errors((H200 / "nvlink-e.txt").read_text())
    assert facts.empty and not facts.elided


def test_counters_with_errors_na_and_a_gpu_without_links(synth) -> None:
    facts = parse_nvlink_errors(synth("nvlink-e_2x-a100-crc_r535.txt"))
    g0, g1, g2 = facts.gpus
    assert g0.links[1] == {"Replay Errors": 12, "Recovery Errors": 1, "CRC Errors": 4}
    assert (g0.total(), g0.total("CRC Errors")) == (17, 4)
    assert g1.links[0]["CRC Errors"] is None and g1.total() == 0
    assert g2.links == {} and "all links are inActive" in g2.messages[0]


def test_a_counter_that_is_not_a_count() -> None:
    with pytest.raises(ParseError) as exc:
        parse_nvlink_errors("GPU 0: X (UUID: GPU-1)\n\t Link 0: CRC Errors: many\n")
    assert exc.value.line_no == 2
    with pytest.raises(ParseError) as exc:
        parse_nvlink_errors("GPU 0: X (UUID: GPU-1)\nsomething else\n")
    assert exc.value.line_no == 2


def test_compute_apps_of_an_idle_h200_and_a_busy_gpu() -> None:
    idle = parse("nvidia-smi-compute-apps", (H200 / "compute-apps.csv").read_text())
    assert idle.apps == [] and idle.fields == ["pid", "process_name", "used_mib"]
    busy = parse_compute_apps(
        "gpu_uuid, pid, process_name, used_gpu_memory [MiB]\n"
        "GPU-aaaa, 4242, /usr/bin/python3, 30000 MiB\n"
        "GPU-bbbb, 77, vllm, [N/A]\n")
    a, b = busy.apps
    assert (a.pid, a.process_name, a.used_mib, a.gpu_uuid) == (4242, "/usr/bin/python3", 30000,
                                                               "GPU-aaaa")
    assert b.used_mib is None and busy.on("GPU-bbbb") == [b]
    with pytest.raises(ParseError) as exc:
        parse_compute_apps("gpu_uuid, pid, process_name\nGPU-a, x, y\n")
    assert exc.value.line_no == 2
    with pytest.raises(ParseError):
        parse_compute_apps("index, name\n0, H200\n")
