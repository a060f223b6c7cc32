"""The pipeline's order of work: the nccl-tests build runs beside the health step (it
needs only the CPU while health loads the GPUs) and is finished before the nccl step
starts, so the step's own build is a cache hit and never races it in one cache."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from orchestrator import pipeline as P


class Steps:
    def __init__(self) -> None:
        self.events: list[str] = []
        self.lock = threading.Lock()

    def say(self, what: str) -> None:
        with self.lock:
            self.events.append(what)


@pytest.fixture
def steps(monkeypatch: pytest.MonkeyPatch) -> Steps:
    s = Steps()
    built = threading.Event()

    def preflight(*a: Any, **k: Any) -> None:
        s.say("preflight")

    def health(*a: Any, **k: Any) -> None:
        s.say("health start")
        assert built.wait(5), "the build did not run beside health"
        s.say("health end")

    def warm(*a: Any, **k: Any) -> dict[str, str]:
        s.say("build start")
        built.set()
        time.sleep(0.2)  # outlasts health: the nccl step must still wait for it
        s.say("build end")
        return {"n1": "no nvcc"}

    def nccl(*a: Any, **k: Any) -> None:
        s.say("nccl")

    monkeypatch.setattr(P.preflight_step, "run_preflight", preflight)
    monkeypatch.setattr(P.health_step, "run_health", health)
    monkeypatch.setattr(P.nccl_step, "warm_builds", warm)
    monkeypatch.setattr(P.nccl_step, "run_nccl", nccl)
    monkeypatch.setattr(P, "judge", lambda *a, **k: (None, []))
    return s


class _Inv:
    class settings:  # noqa: N801 - the inventory's attribute
        concurrency = 4


def pipeline(*, health: bool = True, train: bool = False) -> Any:
    """The pipeline over no nodes, its steps replaced by the fixture's recorders."""
    return P.run_pipeline(_Inv(), [], None, object(), pool=None, progress=None,  # type: ignore[arg-type]
                          settings=None, health=health, train=train, fleet=False)  # type: ignore[arg-type]


def test_the_build_runs_beside_health_and_ends_before_nccl(steps: Steps) -> None:
    out = pipeline()
    ev = steps.events
    assert ev[0] == "preflight"
    assert ev.index("build start") < ev.index("health end")  # overlapped
    assert ev.index("build end") < ev.index("nccl")  # joined before the step
    assert out.steps == ["preflight", "health", "nccl", "regress"]
    assert out.warm_failures == {"n1": "no nvcc"}


def test_without_health_nothing_is_built_ahead(steps: Steps) -> None:
    pipeline(health=False)
    assert steps.events == ["preflight", "nccl"]


def test_an_interrupt_in_health_waits_for_the_build_a_bounded_time(
        steps: Steps, monkeypatch: pytest.MonkeyPatch) -> None:
    def health(*a: Any, **k: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(P.health_step, "run_health", health)
    with pytest.raises(KeyboardInterrupt):
        pipeline()
    assert "nccl" not in steps.events


class _Pre:
    def __init__(self, steps: Steps | None = None) -> None:
        self.released: list[bool] = []
        self.steps = steps

    def warm(self) -> None:
        if self.steps is not None:
            self.steps.say("references warm")

    def release(self, wait: bool = True) -> None:
        self.released.append(wait)


def test_the_training_reference_starts_after_preflight_and_an_interrupt_stops_it(
        steps: Steps, monkeypatch: pytest.MonkeyPatch) -> None:
    """The references start when preflight is done (before health), make their CUDA
    contexts when health is over (before nccl) and are handed to the training step; an
    interrupt before it tells them to stop, without waiting."""
    pre = _Pre(steps)

    def start(*a: Any, **k: Any) -> _Pre:
        steps.say("references start")
        return pre

    def train(*a: Any, **k: Any) -> None:
        assert k["pre"] is pre
        steps.say("train")

    monkeypatch.setattr(P.train_step.Prelaunch, "start", start)
    monkeypatch.setattr(P.train_step, "run_train", train)
    monkeypatch.setattr(P, "wants_train", lambda suite, train: True)
    pipeline(train=True)
    ev = steps.events
    assert ev.index("preflight") < ev.index("references start") < ev.index("health start")
    assert ev.index("health end") < ev.index("references warm") < ev.index("nccl")
    assert ev[-1] == "train" and pre.released == []  # the step itself releases what it leaves

    def health(*a: Any, **k: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(P.health_step, "run_health", health)
    with pytest.raises(KeyboardInterrupt):
        pipeline(train=True)
    assert pre.released == [False]
