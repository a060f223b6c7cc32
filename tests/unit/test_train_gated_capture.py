"""The training step with its launches started ahead, on one H100 (tests/fixtures/
h100x1-gated, the second of two pipelines in one call on the device: see
tests/fixtures/README-h100x1.md). The kill and restore launches were started while the
phase before them ran and held at their gates; the restart counts from the restore's gate
opening, and what ran before the gate is not in it."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.judging.sink import Sink
from orchestrator.steps.train.reading import Earlier, read_phase
from orchestrator.steps.train.restore import restart
from payload.train import protocol

RUN = Path(__file__).resolve().parents[1] / "fixtures" / "h100x1-gated" / "20261206-064323-0dc9"
TRAIN = RUN / "nodes" / "gpu1" / "train"


def _stored(metric: str) -> dict:
    for line in (RUN / "measurements.jsonl").read_text().splitlines():
        m = json.loads(line)
        if m["metric"] == metric:
            return m
    raise AssertionError(metric)


def test_the_kill_and_the_restore_were_started_ahead_and_held() -> None:
    ref = read_phase("reference", [("gpu1", TRAIN / "reference" / "gpu1")])
    kill = read_phase("kill", [("gpu1", TRAIN / "kill" / "gpu1")])
    rest = read_phase("restore", [("gpu1", TRAIN / "restore" / "gpu1")])
    assert (ref.first(protocol.START) or {}).get("gate_open_t") is None
    for phase, before in ((kill, ref), (rest, kill)):
        start = phase.first(protocol.START) or {}
        # launched while the phase before ran, held until it was over
        assert phase.nodes[0].supervise["start_time"] < before.nodes[0].supervise["end_time"]
        assert start["gate_open_t"] >= before.nodes[0].supervise["end_time"]
        assert start["init_s"]["gate_wait"] > 10


def test_the_restart_is_judged_from_the_gate_as_stored() -> None:
    kill = read_phase("kill", [("gpu1", TRAIN / "kill" / "gpu1")])
    rest = read_phase("restore", [("gpu1", TRAIN / "restore" / "gpu1")])
    got = {int(s["step"]): s for s in rest.ranks[0] if s.get("event") == protocol.STEP}
    sink = Sink(run_id="r", step="train", suite_hash="h", provider="one", node="gpu1",
                nodes=["gpu1"], label="", rel=str, scope="train", engine="train")
    restart(sink, Earlier(kill_out=kill), rest, got, 8)
    mine = {m.metric: m for m in sink.measurements}
    stored = _stored("restart_s")
    assert round(mine["restart_s"].value, 6) == round(stored["value"], 6)
    assert 10 < stored["value"] < 12  # 19.1 s when each launch started cold
    assert mine["restart_s"].tags["ahead_s"] > 10 and "launch_s" not in mine["restart_s"].tags
