"""A busy GPU, as a renter meets it: another process holding 62 GiB and computing on the
one H100 (tests/fixtures/h100x1-busy, captured on the GPU host: see its README).

Preflight names it (GPU_BUSY with pid, name and MiB, FAIL above the threshold), and the
health figures measured beside it are not blamed on the card."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.inventory.model import Expectations
from orchestrator.judging.sink import Sink
from orchestrator.parsers.nvidia_smi_table import parse_nvidia_smi_table
from orchestrator.steps.health.judge import judge_node
from orchestrator.steps.health.output import read_output
from orchestrator.steps.preflight import busy as B
from tests.unit.clirun import gpuvet

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "h100x1-busy"
PRE = FIX / "20261206-035148-341d"
HEALTH = FIX / "20261206-035152-9323" / "nodes" / "h100-n1" / "health"


def test_preflight_of_the_busy_gpu_says_gpu_busy_with_the_process(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    r = gpuvet(capsys, "preflight", "-i", PRE / "inventory.yaml", "-n", "h100-n1", "--from",
               PRE / "nodes/h100-n1/preflight/collect.json", "--results", tmp_path, "--json")
    assert r.returncode == 1, r.output
    doc = json.loads(r.stdout)
    busy = [f for f in doc["findings"] if f["code"] == "GPU_BUSY"]
    assert len(busy) == 1 and busy[0]["severity"] == "FAIL"
    assert "pid 4416 python3 (62314 MiB)" in busy[0]["message"]
    assert busy[0]["details"]["processes"] == [{"pid": 4416, "name": "python3",
                                                "used_mib": 62314}]
    assert busy[0]["details"]["memory_used_mib"] == 62323


def _sink() -> Sink:
    return Sink(run_id="r1", step="health", suite_hash="s", provider="h100", node="h100-n1",
                nodes=["h100-n1"], label="", rel=lambda p: str(p), scope="health",
                engine="health")


def test_health_beside_a_busy_process_does_not_fail_the_card() -> None:
    sink = _sink()
    judge_node(sink, read_output(HEALTH, "h100-n1"), Expectations(gpu_model="H100"))
    busy = [f for f in sink.findings if f.code == "GPU_BUSY"]
    assert [f.severity for f in busy] == ["FAIL"]
    mm = [f for f in sink.findings if f.code == "HEALTH_MATMUL" and f.details.get(
        "precision") == "bf16"]
    assert mm and mm[0].severity == "WARN", [(f.severity, f.message) for f in mm]
    assert "pid 4416 python3 (62314 MiB)" in mm[0].message
    assert "not the card's figure" in mm[0].message and mm[0].details["ratio"] < 0.5
    # no figure measured beside the process is a FAIL of the card
    card = [f for f in sink.findings if f.code.startswith("HEALTH_") and f.severity == "FAIL"]
    assert not card, [(f.code, f.message) for f in card]


TABLE = """\
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 580.95.05              Driver Version: 580.95.05      CUDA Version: 13.0     |
+-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |
|                                         |                        |               MIG M. |
|=========================================+========================+======================|
|   0  NVIDIA H200                    On  |   00000000:19:00.0 Off |                    0 |
| N/A   45C    P0            650W /  700W |  128610MiB / 143771MiB |    100%      Default |
|                                         |                        |             Disabled |
+-----------------------------------------+------------------------+----------------------+

+-----------------------------------------------------------------------------------------+
| Processes:                                                                              |
|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |
|        ID   ID                                                               Usage      |
|=========================================================================================|
|    0   N/A  N/A         1234567      C   python3                               12861... |
+-----------------------------------------------------------------------------------------+
"""


def test_a_truncated_memory_cell_reads_as_truncated() -> None:
    """Driver 580 cuts a process's memory that does not fit its column (`12861...`): the
    row is read, its memory unknown and marked so, and the table is not refused."""
    facts = parse_nvidia_smi_table(TABLE)
    (p,) = facts.processes or []
    assert (p.pid, p.name, p.memory_mib, p.memory_truncated) == (1234567, "python3", None, True)


def test_thresholds_as_documented() -> None:
    assert B.BUSY_FAIL_MIB == 1024 and B.IDLE_USED_MIB == 512
    doc = (Path(__file__).resolve().parents[2] / "docs" / "health.md").read_text()
    assert "1024 MiB" in doc and "GPU_BUSY" in doc


GATED = Path(__file__).resolve().parents[1] / "fixtures" / "h100x1-gated"


def test_the_busy_capture_after_the_change_judges_the_same() -> None:
    """The quick health run on the device beside a process holding 62 GiB, captured with
    this version: the same judgement from its own folder."""
    sink = _sink()
    folder = GATED / "20261206-064546-d500" / "nodes" / "gpu1" / "health"
    judge_node(sink, read_output(folder, "h100-n1"), Expectations(gpu_model="H100"))
    assert [f.severity for f in sink.findings if f.code == "GPU_BUSY"] == ["FAIL"]
    assert not [f for f in sink.findings if f.code.startswith("HEALTH_") and f.severity == "FAIL"]
    assert any(f.code == "HEALTH_MATMUL" and f.severity == "WARN" and "pid 3542 python3"
               in f.message for f in sink.findings)
