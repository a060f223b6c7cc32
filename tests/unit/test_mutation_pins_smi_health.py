"""`nvidia-smi nvlink -e` and `--query-compute-apps`: parsed records whole, refusals word for word.

Pins `orchestrator/parsers/nvidia_smi_health.py` on exact values.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import ParseError
from orchestrator.parsers.nvidia_smi_health import (
    ComputeApp,
    parse_compute_apps,
    parse_nvlink_errors,
)

FIX = Path(__file__).resolve().parents[1] / "fixtures"
H100_E = FIX / "public" / "nvlink-e_h100_mle.txt"
A100_E = FIX / "synthetic" / "nvlink-e_2x-a100-crc_r535.txt"
HINT = "\n  what to do: check that the file is the unedited output of the command; report the line if it is"


def refusal(parse, text: str, source: str | None = "x.txt") -> ParseError:  # type: ignore[no-untyped-def]
    with pytest.raises(ParseError) as exc:
        parse(text, source)
    assert exc.value.source == source
    assert str(exc.value) == exc.value.what + HINT
    return exc.value


# ------------------------------------------------------------------ nvlink -e

def test_two_a100s_with_errors_na_and_a_gpu_without_links_whole() -> None:
    facts = parse_nvlink_errors(A100_E.read_text())
    assert facts.model_dump() == {"elided": False, "gpus": [
        {"index": 0, "name": "NVIDIA A100-SXM4-80GB",
         "uuid": "GPU-11111111-2222-3333-4444-555555555500", "line_no": 1, "messages": [],
         "links": {0: {"Replay Errors": 0, "Recovery Errors": 0, "CRC Errors": 0},
                   1: {"Replay Errors": 12, "Recovery Errors": 1, "CRC Errors": 4}}},
        {"index": 1, "name": "NVIDIA A100-SXM4-80GB",
         "uuid": "GPU-11111111-2222-3333-4444-555555555501", "line_no": 8, "messages": [],
         "links": {0: {"Replay Errors": 0, "Recovery Errors": 0, "CRC Errors": None},
                   1: {"Replay Errors": 0, "Recovery Errors": 0, "CRC Errors": 0}}},
        {"index": 2, "name": "NVIDIA A100-PCIE-40GB",
         "uuid": "GPU-11111111-2222-3333-4444-555555555502", "line_no": 15, "links": {},
         "messages": ["NVML: Unable to retrieve NVLink information as all links are inActive"]},
    ]}
    g0, g1, _ = facts.gpus
    assert (g0.total(), g0.total("CRC Errors"), g0.total("Replay Errors"), g0.total("crc")) == (
        17, 4, 12, 0)
    assert (g1.total(), g1.total("CRC Errors")) == (0, 0)
    assert not facts.empty


@pytest.mark.parametrize("mark", ["[...]", "...", "[snip]"])
def test_an_elision_mark_between_links(mark: str) -> None:
    text = H100_E.read_text().replace("[...]", mark)
    facts = parse_nvlink_errors(text)
    assert facts.elided is True
    (gpu,) = facts.gpus
    assert (gpu.index, gpu.name, gpu.uuid, gpu.line_no, gpu.messages) == (
        0, "NVIDIA H100 80GB HBM3", "GPU-abcdefab-cdef-abdc-abcd-abababababab", 1, [])
    assert gpu.links == {k: {"Replay Errors": 0, "Recovery Errors": 0, "CRC Errors": 0}
                         for k in (0, 1, 17)}


def test_a_fragment_that_starts_inside_the_links() -> None:
    facts = parse_nvlink_errors("\n\t Link 3: CRC Errors: 2\n\t Link 3: Replay Errors: N/A\n")
    assert facts.model_dump() == {"elided": False, "gpus": [
        {"index": -1, "name": "", "uuid": None, "line_no": 2, "messages": [],
         "links": {3: {"CRC Errors": 2, "Replay Errors": None}}}]}


def test_a_message_before_any_gpu_and_a_gpu_without_its_uuid() -> None:
    facts = parse_nvlink_errors("NVML: Unable to determine the device handle\n"
                                "GPU 1: Tesla V100-SXM2-16GB  (UUID: GPU-9)\n"
                                "GPU 2: Tesla V100-SXM2-16GB\n"
                                "\t failed to query the links\n")
    assert facts.model_dump() == {"elided": False, "gpus": [
        {"index": -1, "name": "", "uuid": None, "line_no": 1, "links": {},
         "messages": ["NVML: Unable to determine the device handle"]},
        {"index": 1, "name": "Tesla V100-SXM2-16GB", "uuid": "GPU-9", "line_no": 2, "links": {},
         "messages": []},
        {"index": 2, "name": "Tesla V100-SXM2-16GB", "uuid": None, "line_no": 3, "links": {},
         "messages": ["failed to query the links"]},
    ]}


def test_a_counter_that_is_not_a_count_is_refused_by_name() -> None:
    err = refusal(parse_nvlink_errors, "GPU 0: X (UUID: GPU-1)\n\t Link 0: Data Tx: 1.5\n")
    assert (err.kind, err.line_no, err.line) == ("nvlink-e", 2, "\t Link 0: Data Tx: 1.5")
    assert err.what == ("cannot parse nvlink-e output at x.txt:2: Data Tx is not a count\n"
                        "  line: '\\t Link 0: Data Tx: 1.5'")


def test_an_indented_gpu_line_is_not_a_gpu() -> None:
    err = refusal(parse_nvlink_errors, " GPU 0: X (UUID: GPU-1)\n")
    assert (err.line_no, err.line) == (1, " GPU 0: X (UUID: GPU-1)")
    err = refusal(parse_nvlink_errors, "  GPU 0: X (UUID: GPU-1)\n")
    assert (err.kind, err.line_no, err.line) == ("nvlink-e", 1, "  GPU 0: X (UUID: GPU-1)")
    assert err.what == ("cannot parse nvlink-e output at x.txt:1: not a `GPU N:` or "
                        "`Link L: <counter>: <count>` line\n  line: '  GPU 0: X (UUID: GPU-1)'")


# ------------------------------------------------------------------ compute apps

def test_compute_apps_every_column_by_its_names() -> None:
    facts = parse_compute_apps(
        "gpu_bus_id, gpu_name, gpu_uuid, pid, name, used_memory [MiB]\n"
        "00000000:01:00.0, NVIDIA H200, GPU-aaaa, 4242, python3, 30000 MiB\n"
        "No running processes found\n"
        "00000000:02:00.0, NVIDIA H200, GPU-bbbb, 77, [N/A], [N/A]\n", "apps.csv")
    assert facts.fields == ["gpu_bus_id", "gpu_name", "gpu_uuid", "pid", "process_name",
                            "used_mib"]
    assert facts.apps == [
        ComputeApp(line_no=2, pid=4242, process_name="python3", used_mib=30000,
                   gpu_uuid="GPU-aaaa", gpu_bus_id="00000000:01:00.0", gpu_name="NVIDIA H200"),
        ComputeApp(line_no=4, pid=77, process_name=None, used_mib=None, gpu_uuid="GPU-bbbb",
                   gpu_bus_id="00000000:02:00.0", gpu_name="NVIDIA H200"),
    ]
    assert facts.on("GPU-bbbb") == [facts.apps[1]] and facts.on("GPU-cccc") == []


def test_compute_apps_with_only_the_pid() -> None:
    facts = parse_compute_apps("pid\n\n12\n")
    assert facts.fields == ["pid"]
    assert facts.apps == [ComputeApp(line_no=3, pid=12, process_name=None, used_mib=None,
                                     gpu_uuid=None, gpu_bus_id=None, gpu_name=None)]


def test_compute_apps_refusals_word_for_word() -> None:
    err = refusal(parse_compute_apps, " \n")
    assert (err.kind, err.line_no, err.line) == ("nvidia-smi-compute-apps", None, None)
    assert err.what == "cannot parse nvidia-smi-compute-apps output at x.txt: empty output"
    err = refusal(parse_compute_apps, "pid, index\n1, 0\n")
    assert (err.line_no, err.line) == (1, "pid, index")
    assert err.what == ("cannot parse nvidia-smi-compute-apps output at x.txt:1: header column "
                        "'index' is not a compute-apps field (the query must use --format=csv "
                        "with its header)\n  line: 'pid, index'")
    err = refusal(parse_compute_apps, "\nPID, name\n", source=None)
    assert err.what.startswith("cannot parse nvidia-smi-compute-apps output at <text>:2: header "
                               "column 'PID' is not")
    err = refusal(parse_compute_apps, "gpu_uuid, name\nGPU-a, x\n")
    assert (err.line_no, err.line) == (1, "gpu_uuid, name")
    assert err.what == ("cannot parse nvidia-smi-compute-apps output at x.txt:1: the query has "
                        "no pid column\n  line: 'gpu_uuid, name'")
    err = refusal(parse_compute_apps, "pid, name\n1, a, b\n")
    assert (err.line_no, err.line) == (2, "1, a, b")
    assert err.what == ("cannot parse nvidia-smi-compute-apps output at x.txt:2: 3 columns, "
                        "header has 2\n  line: '1, a, b'")
    err = refusal(parse_compute_apps, "pid, name\nx, y\n")
    assert (err.line_no, err.line) == (2, "x, y")
    assert err.what == ("cannot parse nvidia-smi-compute-apps output at x.txt:2: invalid literal "
                        "for int() with base 10: 'x'\n  line: 'x, y'")
    err = refusal(parse_compute_apps, "pid, used_memory\n1, 2 GiB\n")
    assert (err.line_no, err.line) == (2, "1, 2 GiB")
    assert err.what == ("cannot parse nvidia-smi-compute-apps output at x.txt:2: expected a "
                        "number in MiB, got '2 GiB'\n  line: '1, 2 GiB'")
