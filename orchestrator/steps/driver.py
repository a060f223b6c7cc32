"""The step driver: units of work, fanned out, each recorded and marked done alone.

Every step (preflight, health, nccl, train) is a list of units: one per node, and
some per provider (a multi-node run). A unit goes through prepare → execute →
judge; the driver runs units in parallel, writes each unit's records the
moment it finishes, marks it done only after they are on disk, and turns a
failure into a finding that names the stage that failed and when. On
`--resume` units already done are skipped and the records of the others are
retracted, so every step gets resume for free (as ReFrame's task wrapper
records the stage a test failed in).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from orchestrator.errors import AllocationEnded, GpuvetError, StepError, StoreError
from orchestrator.executors import ExecutorPool, fanout, options_for
from orchestrator.executors.base import ProgressHook, interrupted, is_unreachable
from orchestrator.inventory import Inventory, Node
from orchestrator.records import (
    Finding,
    Stage,
    UnitResult,
    finding,
    node_unit_key,
    provider_unit_key,
)
from orchestrator.store import Run


class StageTracker:
    """Which stage a unit is in: a failure is reported with it. `note` tells the
    progress display what a long unit is doing (a training phase, say)."""

    def __init__(self, note: Callable[[str], None] | None = None) -> None:
        self.stage: Stage = "prepare"
        self.started = time.time()
        self._note = note

    @contextmanager
    def __call__(self, stage: Stage) -> Iterator[None]:
        self.stage = stage
        yield

    def note(self, text: str) -> None:
        if self._note is not None:
            self._note(text)


@dataclass
class Unit:
    """One piece of a step, keyed by `records.node_unit_key` or `provider_unit_key`."""

    key: str
    provider: str
    node: str | None
    work: Callable[[StageTracker], UnitResult]

    @property
    def name(self) -> str:  # fanout keys its results by name
        return self.key


def node_unit(node: Node, work: Callable[[StageTracker], UnitResult]) -> Unit:
    return Unit(node_unit_key(node.name), node.provider, node.name, work)


def provider_unit(provider: str, what: str, work: Callable[[StageTracker], UnitResult]) -> Unit:
    return Unit(provider_unit_key(provider, what), provider, None, work)


class UnitFailed(StepError):
    """A unit's failure with its own finding code and the files that show it."""

    def __init__(self, what: str, code: str, evidence: list[str], *, node: str | None = None,
                 hint: str | None = None) -> None:
        self.code = code
        self.evidence = evidence
        super().__init__(what, node=node, hint=hint)


@dataclass
class Driven:
    # this invocation's units, each with its summary: its records are on disk (run.findings(),
    # run.measurements()), not kept here, so a step's memory does not grow with its records
    done: dict[str, UnitResult] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)  # done by an earlier invocation
    failed: dict[str, Finding] = field(default_factory=dict)


@contextlib.contextmanager
def step_pool(inv: Inventory, pool: ExecutorPool | None,
          accept_new_host_keys: bool) -> Iterator[ExecutorPool]:
    """The caller's pool (the CLI's fleet), or one for this step alone."""
    if pool is not None:
        yield pool
        return
    with ExecutorPool(options_for(inv, accept_new_host_keys)) as own:
        yield own


def failure_code(step: str, exc: GpuvetError) -> str:
    if isinstance(exc, AllocationEnded):
        return exc.code
    if isinstance(exc, UnitFailed):
        return exc.code
    if is_unreachable(exc):
        return "NODE_UNREACHABLE"
    return f"{step.upper()}_FAILED"


def drive(run: Run, step: str, units: Sequence[Unit], *, concurrency: int,
          progress: ProgressHook | None = None) -> Driven:
    """Run the units not yet done; record each as it finishes."""
    out = Driven()
    out.skipped = [u.key for u in units if run.is_done(u.key, step)]
    todo = [u for u in units if u.key not in out.skipped]
    trackers: dict[str, StageTracker] = {}
    if progress is not None:
        for u in todo:
            progress(u.key, "queued")

    def one(u: Unit) -> UnitResult:
        note = (lambda text, key=u.key: progress(key, text)) if progress is not None else None
        tracker = trackers.setdefault(u.key, StageTracker(note))
        res = u.work(tracker)
        if interrupted():
            # what the unit judged was cut short by the interrupt (its commands killed):
            # no records, not done, so --resume runs it again
            raise StepError("interrupted: the unit's results are not recorded")
        for f in res.findings:
            f.unit_key = u.key
        for m in res.measurements:
            m.unit_key = u.key
        run.add_findings(res.findings)
        run.add_measurements(res.measurements)
        run.mark_done(u.key, step, res.summary)
        return UnitResult(summary=res.summary)

    group = fanout(todo, one, concurrency=concurrency, progress=progress)
    for u in todo:
        if u.key in group.results:
            out.done[u.key] = group.results[u.key]
            continue
        exc = group.failures[u.key]
        if isinstance(exc, StoreError):
            raise exc  # the controller's own disk, not the node: stop, say so
        tracker = trackers.get(u.key) or StageTracker()
        # a Slurm allocation ended under the unit (time limit, preemption): the scheduler's
        # doing, filed on the provider with Slurm's state, never as the node's FAIL
        ended = isinstance(exc, AllocationEnded)
        f = finding(run.run_id, step, provider=u.provider, node=None if ended else u.node,
                    code=failure_code(step, exc), severity="FAIL", message=exc.what,
                    evidence=getattr(exc, "evidence", ()), stage=tracker.stage, unit_key=u.key,
                    failed_after_s=round(time.time() - tracker.started, 1),
                    **({"hint": exc.hint} if exc.hint else {}))
        run.add_findings([f])
        out.failed[u.key] = f
    return out
