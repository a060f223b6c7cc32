"""`restore.restart` and `restore.steps_lost` on hand-built phase outputs: the guard that
needs the first restored step (K + 1) and nothing later, and a killed run that logged no
step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.judging.sink import Sink
from orchestrator.steps.train.reading import Earlier, NodeOutput, PhaseOutput
from orchestrator.steps.train.restore import restart, steps_lost
from payload.train import protocol

K = 5


def _sink() -> Sink:
    return Sink(run_id="r", step="train", suite_hash="h", provider="p", node=None,
                nodes=["a"], label="", rel=str, scope="train", engine="train")


def _phase(phase: str, supervise: dict[str, Any], events: list[dict[str, Any]]) -> PhaseOutput:
    return PhaseOutput(phase, [NodeOutput("a", Path("/nonexistent"), supervise, {0: events})])


def _killed(steps: list[int]) -> Earlier:
    events = [{"event": protocol.STEP, "step": s, "t": 10.0 + s} for s in steps]
    return Earlier(kill_out=_phase("kill", {"kill_time": 50.0, "end_time": 51.5}, events))


def _restored() -> PhaseOutput:
    return _phase("restore", {"start_time": 100.0}, [])


def test_a_killed_run_that_logged_no_step_lost_none() -> None:
    assert steps_lost(_killed([]), K) is None
    assert steps_lost(_killed([6, 7]), K) == 2
    assert steps_lost(Earlier(), K) is None


def test_no_restart_time_without_the_first_restored_step() -> None:
    sink = _sink()
    restart(sink, _killed([6, 7]), _restored(), {K + 2: {"t": 104.0}}, K)
    assert sink.measurements == [] and sink.findings == []


def test_the_first_restored_step_alone_times_the_restart() -> None:
    sink = _sink()
    restart(sink, _killed([6, 7]), _restored(), {K + 1: {"t": 103.0}}, K)
    got = {m.metric: (m.value, m.tags) for m in sink.measurements}
    assert got["restart_s"][0] == 1.5 + 3.0
    assert got["restart_s"][1]["dying_s"] == 1.5
    assert got["restart_s"][1]["relaunch_to_first_step_s"] == 3.0
    assert got["steps_lost"][0] == 2


def test_a_restore_started_ahead_relaunches_from_its_gate() -> None:
    """A restore launched while the kill phase ran held at its gate: its relaunch counts
    from the gate opening (torchrun, torch and the CUDA context were ready), and its wait
    is not start-up time."""
    start = {"event": protocol.START, "gate_open_t": 101.0,
             "init_s": {"import_torch": 2.0, "compile_import": 1.25, "gate_wait": 30.0,
                        "model": 0.5}}
    out = _phase("restore", {"start_time": 70.0}, [start])
    sink = _sink()
    restart(sink, _killed([6, 7]), out, {K + 1: {"t": 104.0}}, K)
    got = {m.metric: (m.value, m.tags) for m in sink.measurements}
    assert got["restart_s"][0] == 1.5 + 3.0
    assert got["restart_s"][1]["relaunch_to_first_step_s"] == 3.0
    # torch's and torch.compile's imports ran ahead, before the gate; only the model after
    # it is on the path
    assert got["restart_s"][1]["init_s"] == 0.5 and got["restart_s"][1]["gate_wait_s"] == 30.0
    assert got["restart_s"][1]["ahead_s"] == 3.25 and "launch_s" not in got["restart_s"][1]
    # a gate that opened before the supervisor's start (a clock step) is not used
    early = _phase("restore", {"start_time": 100.0}, [{**start, "gate_open_t": 90.0}])
    sink = _sink()
    restart(sink, _killed([6, 7]), early, {K + 1: {"t": 103.0}}, K)
    assert sink.measurements[0].value == 1.5 + 3.0
