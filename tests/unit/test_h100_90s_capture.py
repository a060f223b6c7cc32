"""The fourth measurement on one H100 (tests/fixtures/README-h100x1.md): the whole pipeline
in 85 s (h100x1-90s/), the faults a user meets (h100x1-faults/) and `gpuvet pipeline
--fleet` over two simulated nodes with the references started ahead, interrupted and
resumed (h100x1-sims/20261206-142603-172d). Each is judged from its files here."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from orchestrator.judging.sink import Sink
from orchestrator.steps.train.failures import failed
from orchestrator.steps.train.reading import Earlier, read_phase
from orchestrator.steps.train.restore import restart
from orchestrator.suite import TrainParams
from payload.health import protocol as hp
from payload.train import protocol
from tests.unit.clirun import gpuvet

FIX = Path(__file__).resolve().parents[1] / "fixtures"
PIPE = FIX / "h100x1-90s" / "20261206-141635-2d02"
NODE = PIPE / "nodes" / "gpu1"
FAULTS = FIX / "h100x1-faults"
SIMS = FIX / "h100x1-sims" / "20261206-142603-172d"


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _phase(run: Path, node: str, name: str) -> Any:
    return read_phase(name, [(node, run / "nodes" / node / "train" / name / node)])


def _sink(step: str = "train") -> Sink:
    return Sink(run_id="r", step=step, suite_hash="h", provider="one", node="gpu1",
                nodes=["gpu1"], label="", rel=str, scope=step, engine=step)


def _findings(run: Path) -> list[dict[str, Any]]:
    return _lines(run / "findings.jsonl")


def _wall(run: Path) -> float:
    meta = json.loads((run / "run.json").read_text())
    t = [datetime.fromisoformat(meta[k].replace("Z", "+00:00")) for k in ("started", "finished")]
    return (t[1] - t[0]).total_seconds()


# --------------------------------------------------------------------------- 85 s


def test_the_pipeline_took_at_most_90_s_with_the_restore_verified_and_mfu_kept() -> None:
    assert _wall(PIPE) <= 90
    meta = json.loads((PIPE / "run.json").read_text())
    assert meta["status"] == "passed" and meta["suite"]["train"]["model"] == "1b"
    assert meta["suite"]["health"]["level"] == "standard"
    assert meta["suite"]["nccl"]["max_bytes"] == "128M"
    ok = [f for f in _findings(PIPE) if f["code"] == "TRAIN_RESTORE_OK"]
    assert len(ok) == 1 and "bit for bit" in ok[0]["message"]
    m = {x["metric"]: x["value"] for x in _lines(PIPE / "measurements.jsonl")
         if x["step"] == "train"}
    assert m["mfu"] >= 0.54 and m["deterministic_mfu"] >= 0.48  # 54.0% / 48.3% at 156 s
    kill, rest = _phase(PIPE, "gpu1", "kill"), _phase(PIPE, "gpu1", "restore")
    got = {int(s["step"]): s for s in rest.ranks[0] if s.get("event") == protocol.STEP}
    sink = _sink()
    restart(sink, Earlier(kill_out=kill), rest, got, 8)
    assert {x.metric: x.value for x in sink.measurements}["restart_s"] < 10


def test_the_kept_save_was_hashed_behind_the_training_and_complete_before_the_kill() -> None:
    ev = [(e["event"], e.get("step")) for e in _phase(PIPE, "gpu1", "kill").ranks[0]
          if e["event"] not in ("start", "warmup")]
    at = ev.index(("commit", 8))
    assert ev[at:] == [("commit", 8), ("step", 9), ("step", 10), ("saving", 10),
                       ("saved", 8), ("commit", 10)]
    saved = [e for e in _phase(PIPE, "gpu1", "kill").ranks[0] if e["event"] == "saved"][0]
    assert saved["behind"] is True and saved["problems"] == []
    sup = _phase(PIPE, "gpu1", "kill").nodes[0].supervise
    assert sup["kill_event"] == dict(sup["kill_event"], event="commit", step=10)


def test_every_sampler_was_told_to_stop_when_its_work_was_done_not_after() -> None:
    """health: when the GPU processes were done, before the links were measured; each
    training phase: at its last step or its kill, before the supervisor's end."""
    doc = json.loads((NODE / "health" / "health.json").read_text())
    gpu_bye = [e for e in _lines(NODE / "health" / hp.gpu_events("0"))
               if e["event"] == hp.BYE][0]["t"]
    links = _lines(NODE / "health" / hp.LINKS_EVENTS)
    for sampler in ("dmon", "reasons"):
        assert gpu_bye <= doc["telemetry"][sampler]["stop_requested"] <= links[0]["t"]
    for name in ("reference", "kill", "restore"):
        sup = _phase(PIPE, "gpu1", name).nodes[0].supervise
        told = sup["telemetry"]["stop_requested"]
        end = [e for e in _phase(PIPE, "gpu1", name).ranks[0]
               if e["event"] == protocol.END]
        assert (sup["kill_time"] if sup["killed"] else end[0]["t"]) <= told < sup["end_time"]


# --------------------------------------------------------------------------- faults


def test_a_gpu_hidden_by_cuda_visible_devices_is_named_by_preflight(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = FAULTS / "20261206-141803-6c91"
    r = gpuvet(capsys, "preflight", "-i", run / "inventory.yaml", "--from",
               run / "nodes/gpu1/preflight/collect.json", "--results", tmp_path, "--json")
    assert r.returncode == 1, r.output
    (f,) = [f for f in json.loads(r.stdout)["findings"] if f["code"] == "TORCH_GPU_COUNT"]
    assert f["severity"] == "FAIL"
    assert f["message"] == ("PyTorch sees 0 GPU(s), nvidia-smi 1. Likely cause: "
                            "CUDA_VISIBLE_DEVICES=1 hides every GPU (this node's are 0): unset "
                            "it, or name the GPUs in the node's env in the inventory")


def test_a_checkpoint_folder_on_tmpfs_is_named_before_and_by_the_training(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pre = FAULTS / "20261206-142330-713c"
    r = gpuvet(capsys, "preflight", "-i", pre / "inventory.yaml", "--from",
               pre / "nodes/gpu1/preflight/collect.json", "--results", tmp_path, "--json")
    (f,) = [f for f in json.loads(r.stdout)["findings"] if f["code"].startswith("CKPT_DIR")]
    assert (f["code"], f["severity"]) == ("CKPT_DIR_EPHEMERAL", "WARN")
    assert "/dev/shm/gpuvet-ckpt (to be made by the training step) is on tmpfs" in f["message"]
    train = _findings(FAULTS / "20261206-142337-698f")
    (np,) = [f for f in train if f["code"] == "CKPT_NOT_PERSISTENT"]
    assert "is on tmpfs" in np["message"] and np["details"]["reason"] == "ephemeral-fs"
    assert [f["code"] for f in train if f["code"] == "TRAIN_RESTORE_OK"]


def test_a_checkpoint_folder_that_fills_during_the_save_is_named() -> None:
    run = FAULTS / "20261206-142423-2ead"
    params = TrainParams.model_validate(
        json.loads((run / "run.json").read_text())["suite"]["train"])
    sink = _sink()
    kill = _phase(run, "gpu1", "kill")
    assert failed(sink, params, kill, killed_ok=True) is True
    (f,) = [f for f in sink.findings if f.code == "TRAIN_CKPT_NO_SPACE"]
    assert f.severity == "FAIL" and f.details["ckpt_step"] == 5
    assert "no space left while saving step 5 to /tmp/gpuvet-faults/small/" in f.message
    assert "OSError: [Errno 28] No space left on device" in f.message
    assert not [f for f in sink.findings if f.code == "TRAIN_FAILED"]


def test_a_controller_killed_while_it_trained_is_finished_by_resume() -> None:
    run = FAULTS / "20261206-142452-819a"
    first = (FAULTS / "out" / "kill1.txt").read_text()
    assert "reference on gpu1" in first and "done" not in first.split("reference")[-1]
    assert json.loads((run / "run.json").read_text())["status"] == "passed"
    ok = [f for f in _findings(run) if f["code"] == "TRAIN_RESTORE_OK"]
    assert len(ok) == 1 and "losses of steps 6..12 equal the reference bit for bit" in \
        ok[0]["message"]
    table = (FAULTS / "table.txt").read_text()
    assert "left running after the resume: 0" in table


# --------------------------------------------------------------------------- pipe


def test_pipeline_fleet_interrupted_in_training_is_finished_by_resume() -> None:
    first = (SIMS.parent / "pipe-ahead-interrupted-console.txt").read_text()
    assert first.rstrip().endswith("interrupted")
    assert "processes of the training step left: 0" in (
        SIMS.parent / "table-pipe-ahead.txt").read_text()
    assert json.loads((SIMS / "run.json").read_text())["status"] == "passed"
    ok = {f["unit_key"]: f for f in _findings(SIMS) if f["code"] == "TRAIN_RESTORE_OK"}
    assert set(ok) == {"provider:sim/single-s1+s2", "provider:sim/multi"} or len(ok) == 3
    multi = [f for f in ok.values() if f["details"].get("saved_on") == ["s1", "s2"]]
    assert multi and multi[0]["details"]["restored_on"] == ["s2", "s1"]
    assert any(f["code"] == "FLEET_NO_SUSPECT" for f in _findings(SIMS))


def test_a_node_killed_in_the_multi_node_reference_is_named_and_the_step_ends() -> None:
    """`STEPS=trainfail scripts/gpu-sims.sh`: s2's rank of the multi-node reference was
    SIGKILLed from outside once it trained (a node that dies). The finding names s2 and
    the signal, s1's NCCL error is what followed, and s1's part ended within the linked
    stop's bound of s2's end; the single-node units were verified before."""
    from orchestrator.steps.train.launch import PEER_GRACE_S

    run = SIMS.parent / "20261206-150518-dbdc"
    multi = run / "providers" / "sim" / "train" / "multi" / "reference"
    out = read_phase("reference", [(n, multi / n) for n in ("s1", "s2")])
    params = TrainParams.model_validate(
        json.loads((run / "run.json").read_text())["suite"]["train"])
    sink = _sink()
    assert failed(sink, params, out) is True
    (f,) = [f for f in sink.findings if f.code == "TRAIN_FAILED"]
    assert f.details["died"] == ["s2"]
    assert f.message.startswith("reference: the job on s2 died of signal 9 (SIGKILL) without "
                                "an error of its own")
    assert "; then rank 0 on s1: " in f.message and "Connection closed by remote peer" in \
        f.message
    ends = {n.node: n.supervise["end_time"] for n in out.nodes}
    assert abs(ends["s1"] - ends["s2"]) < PEER_GRACE_S
    ok = [x for x in _findings(run) if x["code"] == "TRAIN_RESTORE_OK"]
    assert len(ok) == 2  # each single-node unit, before the multi-node one
    assert "processes of the step left: 0" in (SIMS.parent / "table-trainfail.txt").read_text()
