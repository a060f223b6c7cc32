"""The scheduled pipeline: preflight, health, nccl, fleet and train where asked, then regress.

A timer runs this every few hours against the nodes a team rents. Two timers
(or a timer and a person) must never work on the same results at once: the
second would judge a half-written run, or measure a fabric the first one is
loading. The lock is a file in the results root, taken with flock; it holds
who took it (pid, host, start, command), so a refused start can say who holds
it. The kernel releases a flock when its process dies however it dies, so a
lock file still naming a process that is gone (killed with SIGKILL, a power
cut) is stale: it is taken over with a warning. A lock file naming another
host cannot be checked from here and is refused (a results folder on NFS).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.analysis import regress
from orchestrator.analysis.regress import Evaluation, Settings
from orchestrator.errors import UsageError
from orchestrator.executors import ExecutorPool
from orchestrator.executors.base import ProgressHook
from orchestrator.inventory import Inventory, Node
from orchestrator.records import Finding, Severity, finding
from orchestrator.steps.driver import UnitResult, drive, provider_unit
from orchestrator.steps.fleet import step as fleet_step
from orchestrator.steps.health import step as health_step
from orchestrator.steps.nccl import step as nccl_step
from orchestrator.steps.nccl import torchbench
from orchestrator.steps.nccl.judge import Series, judge_series
from orchestrator.steps.preflight import step as preflight_step
from orchestrator.steps.train import step as train_step
from orchestrator.store import Run, warn, write_json
from orchestrator.suite import Suite

LOCK_NAME = "pipeline.lock"
STEP = "regress"


# --- the lock ---------------------------------------------------------------------------------

class LockHeld(UsageError):
    """Another pipeline works on these results (exit 2: try again later)."""


@dataclass(frozen=True)
class Holder:
    pid: int | None
    host: str | None
    started: str | None
    command: str | None

    @classmethod
    def parse(cls, text: str) -> Holder | None:
        if not text.strip():
            return None
        try:
            d = json.loads(text)
            return cls(int(d["pid"]), str(d["host"]), d.get("started"), d.get("command"))
        except (ValueError, KeyError, TypeError):
            return cls(None, None, None, text.strip()[:200])

    def describe(self) -> str:
        if self.pid is None:
            return f"an unknown process (lock file says {self.command!r})"
        return (f"pid {self.pid} on {self.host}, started {self.started or '?'}"
                + (f" ({self.command})" if self.command else ""))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


@contextlib.contextmanager
def pipeline_lock(root: Path, command: str) -> Iterator[Path]:
    """Hold the results root's pipeline lock for the `with` body, or raise LockHeld."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / LOCK_NAME
    f = open(path, "a+", encoding="utf-8")  # noqa: SIM115 - held for the whole body
    try:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = Holder.parse(f.read())
            raise LockHeld(
                f"the results in {root} are in use by another pipeline: "
                f"{holder.describe() if holder else 'a process that is starting'}",
                hint="wait for it to finish (a scheduled run will try again at its next "
                     "time); stop that process first if it hangs") from None
        f.seek(0)
        previous = Holder.parse(f.read())
        here = socket.gethostname()
        if previous is not None and previous.pid is not None:
            if previous.host != here:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)
                raise LockHeld(
                    f"the results in {root} are locked by {previous.describe()}: another host, "
                    "whose process cannot be checked from here",
                    hint=f"if no pipeline runs on {previous.host}, remove {path}")
            if previous.pid != os.getpid():
                state = "no longer running" if not _alive(previous.pid) else \
                    "running but not holding the lock (its id was reused)"
                warn(f"took over the stale pipeline lock {path} of {previous.describe()}: that "
                     f"process is {state}")
        f.seek(0)
        f.truncate()
        f.write(json.dumps({"pid": os.getpid(), "host": here,
                            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                            "command": command}) + "\n")
        f.flush()
        os.fsync(f.fileno())
        try:
            yield path
        finally:
            f.seek(0)
            f.truncate()
            f.flush()
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
    finally:
        f.close()


# --- the sequence -----------------------------------------------------------------------------

@dataclass
class Outcome:
    steps: list[str] = field(default_factory=list)
    evaluation: Evaluation | None = None
    findings: list[Finding] = field(default_factory=list)  # the regress findings
    warm_failures: dict[str, str] = field(default_factory=dict)  # builds beside health


def wants_train(suite: Suite, flag: bool | None) -> bool:
    """--train/--no-train decide; otherwise a suite that has a `train:` section asks for it."""
    if flag is not None:
        return flag
    return getattr(suite, "train", None) is not None and "train" in suite.model_fields_set


def wants_fleet(suite: Suite, flag: bool | None) -> bool:
    """--fleet/--no-fleet decide; otherwise a suite with a `fleet:` section asks for it."""
    if flag is not None:
        return flag
    return suite.fleet is not None


class Warm:
    """Work started beside a step in a thread of its own (the nccl-tests builds beside the
    health step); `join` waits for it and returns what failed per node, never raises:
    the step that needs the work does it again and judges its failure."""

    def __init__(self, fn: Callable[[], dict[str, str]]) -> None:
        self.failures: dict[str, str] = {}
        self._fn = fn
        self._thread = threading.Thread(target=self._run, name="gpuvet-warm", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.failures = self._fn()
        except Exception as exc:  # the step itself builds again and says why it failed
            self.failures = {"*": f"{type(exc).__name__}: {exc}"}

    def join(self, timeout: float | None = None) -> dict[str, str]:
        self._thread.join(timeout)
        return self.failures


def run_pipeline(inv: Inventory, nodes: list[Node], run: Run, suite: Suite, *,
                 pool: ExecutorPool, progress: ProgressHook | None, settings: Settings,
                 torch: bool = False, train: bool | None = None, health: bool = True,
                 fleet: bool | None = None,
                 last: int = 10, min_size: int = 16 << 20) -> Outcome:
    """The steps through their library functions, one after the other, then the verdict.

    A resumed run goes through the same sequence: each step keeps the units it finished
    and runs the rest (its own resume), and the verdict is judged anew."""
    def shown(step: str) -> ProgressHook | None:  # one display: each line says its step
        if progress is None:
            return None
        hook = progress
        return lambda who, state: hook(f"{step} {who}", state)

    out = Outcome()
    preflight_step.run_preflight(inv, nodes, run, suite, pool=pool, progress=shown("preflight"))
    out.steps.append("preflight")
    # each node's training reference starts now and holds before any CUDA call while
    # health measures the GPUs, then makes its CUDA context and process group: its
    # interpreter, torch, compile imports and context (about 15 s on an H100 host) are off
    # the training step's path
    trains = wants_train(suite, train)
    pre = train_step.Prelaunch.start(pool, run, suite, nodes) if trains else None
    try:
        _measure(out, inv, nodes, run, suite, pool=pool, shown=shown, torch=torch,
                 health=health, fleet=fleet, pre=pre)
        # the verdict's libraries (ruptures, scipy.stats: 2-4 s of imports) load while the
        # training step runs, where the controller waits on the nodes: not before the first
        # node is contacted, nor beside preflight and health
        threading.Thread(target=regress.preload, daemon=True, name="gpuvet-preload").start()
        if trains:
            train_step.run_train(inv, nodes, run, suite, pool=pool, progress=shown("train"),
                                 pre=pre)
            out.steps.append("train")
    except BaseException:
        if pre is not None:
            pre.release(wait=False)
        raise
    out.evaluation, out.findings = judge(run, settings, last=last, min_size=min_size)
    out.steps.append("regress")
    return out


def _measure(out: Outcome, inv: Inventory, nodes: list[Node], run: Run, suite: Suite, *,
             pool: ExecutorPool, shown: Callable[[str], ProgressHook | None], torch: bool,
             health: bool, fleet: bool | None, pre: train_step.Prelaunch | None) -> None:
    """Health (the nccl-tests builds beside it), nccl, fleet; the references started
    before them make their CUDA contexts when health is over."""
    if health:
        # nccl-tests builds on the CPU while health loads the GPUs; the nccl step then
        # finds its build in the node's cache (joined before the step: never two builds
        # of one commit in one cache at once)
        warm = Warm(lambda: nccl_step.warm_builds(nodes, run, suite, pool,
                                                  concurrency=inv.settings.concurrency))
        try:
            health_step.run_health(inv, nodes, run, suite, pool=pool, progress=shown("health"))
        except BaseException:  # an interrupt killed the builds with every command in flight
            warm.join(timeout=60)
            raise
        out.warm_failures = warm.join()
        out.steps.append("health")
    if pre is not None:
        pre.warm()
    nccl_step.run_nccl(inv, nodes, run, suite, torch=torch, pool=pool, progress=shown("nccl"))
    out.steps.append("nccl")
    if torch:
        torch_without_builds(inv, nodes, run, suite, pool, shown("nccl"))
    if wants_fleet(suite, fleet):
        # a provider with one selected node is skipped by the step itself (INFO)
        fleet_step.run_fleet(inv, nodes, run, suite, pool=pool, progress=shown("fleet"))
        out.steps.append("fleet")


def torch_without_builds(inv: Inventory, nodes: list[Node], run: Run, suite: Suite,
                         pool: ExecutorPool, progress: ProgressHook | None = None) -> None:
    """Measure the fabric with torch.distributed where nccl-tests measured nothing across
    a provider's nodes because it could not be built there (no CUDA toolkit, no NCCL,
    CPU nodes): the suite's rounds, each a fresh launch, judged like any torch series."""
    measured = {m.provider for m in run.measurements()
                if m.step == nccl_step.STEP and m.scope == "multi"}
    units = []
    for prov in dict.fromkeys(n.provider for n in nodes):
        members = [n for n in nodes if n.provider == prov]
        if len(members) < 2 or prov in measured:
            continue

        def work(stage: Any, members: list[Node] = members, prov: str = prov) -> UnitResult:
            out_dir = run.provider_dir(prov, nccl_step.STEP)
            logs = []
            with stage("execute"):
                for r in range(1, suite.nccl.rounds + 1):
                    log = torchbench.run_bench(pool, members, run, suite, inv, {},
                                           f"torch_multi_round{r}", out_dir)
                    logs.append((r, log, False))
            with stage("judge"):
                fs, ms = judge_series(Series("multi", members, logs, engine="torch"), run, inv,
                                      suite)
            job = members[0].slurm_job
            how = (f"; each node's ranks a job step (srun) of Slurm job {job}" if job else "")
            fs.append(finding(run.run_id, nccl_step.STEP, provider=prov, node=None,
                              code="NCCL_TORCH_ONLY", severity="WARN",
                              message="[torch multi] nccl-tests could not run across the nodes "
                                      "(no build): the fabric was measured with the "
                                      f"torch.distributed benchmark only, {len(logs)} round(s)"
                                      + how,
                              evidence=[run.rel(p) for _, p, _ in logs]))
            return UnitResult(fs, ms)

        units.append(provider_unit(prov, "torch-multi", work))
    if units:
        drive(run, nccl_step.STEP, units, concurrency=inv.settings.concurrency,
              progress=progress)


def judge(run: Run, settings: Settings, *, last: int, min_size: int
          ) -> tuple[Evaluation, list[Finding]]:
    """Regress this run against its baseline; the verdicts become findings of the run,
    with the whole evaluation as their evidence."""
    if any(f.step == STEP for f in run.findings()):  # a resumed run's verdict, judged anew
        run.retract(keep_units=set(), step=STEP)
    ev = regress.evaluate(run.root, run.run_id, settings=settings, last=last, min_size=min_size)
    doc = run.dir / "regress.json"
    write_json(doc, regress.as_json(ev))
    evidence = [run.rel(doc)]
    fs: list[Finding] = []
    for p in ev.providers:
        v = p.verdict
        lone = v.attribution == "node"
        sev: Severity = ("FAIL" if v.verdict == "REGRESSED" and not lone else
                         "INFO" if v.verdict == "NOT ENOUGH DATA" or lone else "PASS")
        fs.append(finding(run.run_id, STEP, provider=p.provider, node=None,
                          code="REGRESS_VERDICT", severity=sev,
                          message=f"[regress] {v.verdict}: {v.summary}", evidence=evidence,
                          verdict=v.verdict, attribution=v.attribution,
                          baseline=p.source.describe if p.source else None,
                          baseline_runs=list(p.source.runs) if p.source else []))
        for n in v.nodes:
            fs.append(finding(run.run_id, STEP, provider=p.provider, node=n,
                              code="REGRESS_NODE", severity="FAIL",
                              message=f"[regress] node {n} regressed while the other nodes of "
                                      f"{p.provider} did not", evidence=evidence, verdict=v.verdict))
    run.add_findings(fs)
    return ev, fs
