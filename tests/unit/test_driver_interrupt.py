"""An interrupt while units run: the unit that was cut short writes no records and is not
marked done (so --resume runs it again), and nothing new starts."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from orchestrator.executors import fanout
from orchestrator.executors.base import interrupted
from orchestrator.records import finding
from orchestrator.steps.driver import StageTracker, Unit, UnitResult, drive
from orchestrator.store import Run


def test_a_unit_still_running_when_the_interrupt_came_records_nothing(tmp_path: Path) -> None:
    run = Run.create(tmp_path / "r", command="train", suite_hash="h", suite={},
                     inventory_path=None)
    b_started = threading.Event()

    def a(stage: StageTracker) -> UnitResult:  # the main thread's Ctrl-C, as it reaches a unit
        b_started.wait(10)
        raise KeyboardInterrupt

    def b(stage: StageTracker) -> UnitResult:
        b_started.set()
        deadline = time.monotonic() + 10
        while not interrupted() and time.monotonic() < deadline:
            time.sleep(0.01)
        # its commands were killed: what it would judge now is the interrupt's doing
        return UnitResult([finding(run.run_id, "train", provider="p", node="b",
                                   code="TRAIN_FAILED", severity="FAIL",
                                   message="could not run", evidence=[])])

    units = [Unit("node:a", "p", "a", a), Unit("node:b", "p", "b", b)]
    with pytest.raises(KeyboardInterrupt):
        drive(run, "train", units, concurrency=2)
    assert interrupted()
    assert run.findings() == []
    assert not run.is_done("node:b", "train") and not run.is_done("node:a", "train")
    # a new operation starts clean
    got = fanout([Unit("node:c", "p", "c", b)], lambda u: u.key)
    assert got.results == {"node:c": "node:c"} and not interrupted()


def test_nothing_starts_inside_a_unit_once_the_interrupt_is_on() -> None:
    from orchestrator.executors.base import cancel_all

    started: list[str] = []

    def inner(stage: StageTracker) -> UnitResult:
        cancel_all()  # the interrupt lands while this unit runs
        group = fanout([Unit("node:x", "p", "x", inner)], lambda u: started.append(u.key))
        assert group.results == {} and group.failures == {}
        return UnitResult()

    group = fanout([Unit("node:y", "p", "y", inner)], lambda u: u.work(StageTracker()))
    assert not group.failures, group.failures
    assert started == []
