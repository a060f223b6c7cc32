"""One phase's launches on the nodes: a job is one `train-supervise` on one node, a phase
runs its jobs at once (a multi-node job needs every node running), and `Ahead` starts the
next phase's jobs while the current one runs, each held at its gate until the phase
before it is judged (docs/training.md, "Launches started ahead"). The step (`step.py`)
plans the units and judges the phases."""

from __future__ import annotations

import json
import re
import secrets
import shlex
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator import nccltests
from orchestrator import payload as payload_mod
from orchestrator.errors import GpuvetError, StepError
from orchestrator.executors import ExecutorPool, fanout
from orchestrator.inventory import Node
from orchestrator.store import Run, atomic_write
from orchestrator.suite import Suite, TrainParams
from payload.scrub import scrub_doc, scrub_text

_TEXT_FILES = ("torchrun.stdout", "torchrun.stderr", "command.stdout", "command.stderr")


@dataclass
class Job:
    unit: str  # slug of the protocol run: a node name, or multi-<provider>
    node: Node  # where it runs
    phase: str
    local_dir: Path
    ckpt_root: str  # on this node
    node_rank: int = 0
    nnodes: int = 1
    master: str = "127.0.0.1"
    port: int = 29500
    extra: list[str] = field(default_factory=list)
    gate: str | None = None  # started ahead of its turn: held until this file says go
    gate_at: str = "ready"  # where it holds: ready (CUDA and process group up) or start
    gate_timeout_s: float | None = None  # how long it may hold (default: the phase's timeout)
    stop: str | None = None  # a multi-node job's part: killed once this file exists

    def remote_out(self, run: Run) -> str:
        return f"{self.node.work_dir.rstrip('/')}/train-runs/{run.run_id}/{self.unit}/{self.phase}"

    def gate_path(self, run: Run) -> str:
        # one of this attempt's own: a launch an earlier attempt left waiting (its
        # controller killed outright) never sees this attempt's go
        return f"{self.remote_out(run)}.gate-{secrets.token_hex(4)}"

    def gate_wait_s(self, params: TrainParams) -> float:
        """How long it may hold at its gate (0 without one)."""
        if not self.gate:
            return 0.0
        return self.gate_timeout_s if self.gate_timeout_s is not None else float(
            params.timeout_s)


def _supervise_args(job: Job, run: Run, params: TrainParams) -> list[str]:
    args = ["train-supervise", "--out", job.remote_out(run), "--phase", job.phase,
            "--ckpt-dir", job.ckpt_root, "--nnodes", str(job.nnodes),
            "--node-rank", str(job.node_rank), "--master-addr", job.master,
            "--master-port", str(job.port), "--cpu-procs", str(params.cpu_procs_per_node),
            "--timeout", str(params.timeout_s),
            "--telemetry-interval", str(params.telemetry_interval_s)]
    if params.command:
        # `=`: values that start with a dash must not read as options
        return [*args, f"--command={params.command}",
                *([f"--resume-flag={params.resume_flag}"] if params.resume_flag else []),
                *job.extra]
    gate = (["--gate", job.gate, "--gate-at", job.gate_at, "--gate-timeout",
             str(job.gate_wait_s(params))] if job.gate else [])
    stop = ["--stop-file", job.stop] if job.stop else []
    return [*args, "--params", json.dumps(params.payload_params(), sort_keys=True), *gate,
            *stop, *job.extra]


def phase_extra(params: TrainParams, phase: str) -> list[str]:
    """The kill phase saves at K (and at the kill step when the kill is inside a save)."""
    if phase != "kill":
        return []
    if params.command:
        return ["--kill-after-step", str(params.command_kill_after_step)]
    out = ["--save-at", str(params.ckpt_step)]
    k = params.kill_step
    if params.kill == "after-step":
        return [*out, "--kill-after-step", str(k)]
    flag = "--kill-at-save" if params.kill == "mid-save" else "--kill-at-commit"
    return [*out, "--save-at", str(k), flag, str(k)]


def run_job(pool: ExecutorPool, run: Run, suite: Suite, job: Job) -> dict[str, Any]:
    """One supervisor on one node; its files come back into job.local_dir. Returns the
    supervisor's document."""
    params = suite.train
    ex = pool(job.node)
    # an earlier attempt's files (a run resumed after an interrupt or a full disk) must not
    # be judged with this one's: the supervisor clears the node's folder, this clears ours
    shutil.rmtree(job.local_dir, ignore_errors=True)
    job.local_dir.mkdir(parents=True, exist_ok=True)
    doc_path = job.local_dir / "supervise.json"
    res = payload_mod.run(ex, _supervise_args(job, run, params), staging=run.dir / ".staging",
                          timeout=params.timeout_s + job.gate_wait_s(params) + 180,
                          env=dict(nccltests.RUN_ENV),
                          stdout_path=doc_path)
    if res.stderr:
        atomic_write(job.local_dir / "supervise.stderr", scrub_text(res.stderr), durable=False)
    res.raise_for_status(f"train-supervise ({job.phase})")
    try:
        doc = json.loads(res.stdout)
    except json.JSONDecodeError as exc:
        atomic_write(doc_path, scrub_text(res.stdout), durable=False)
        raise StepError(f"train-supervise printed invalid JSON ({exc})", node=job.node.name,
                        hint=f"see {run.rel(doc_path)}") from None
    # the argv holds the user's command and its env (a supervisor of an older payload
    # did not scrub it)
    atomic_write(doc_path, json.dumps(scrub_doc(doc), indent=1, sort_keys=True) + "\n",
                 durable=False)
    for name in doc.get("files") or []:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", name) or name == doc_path.name:
            continue
        local = job.local_dir / name
        ex.get(f"{job.remote_out(run)}/{name}", local)
        if name in _TEXT_FILES:
            atomic_write(local, scrub_text(local.read_text(errors="replace")), durable=False)
    return dict(doc)


# After one node's part of a multi-node job failed, the others cannot finish (their
# collectives wait for a rank that is gone): each gets this long to end by itself (its
# transport's error names the cause better than a kill), then it is stopped. The failed
# attempt ends within this bound of its first failure, not at the job's own timeout.
PEER_GRACE_S = 20.0


def _part_failed(doc: dict[str, Any]) -> bool:
    """A node's part ended badly: torchrun's non-zero status, not the kill phase's own
    SIGKILL (the supervisor's trigger) and not our stop."""
    rc = doc.get("rc")
    return rc not in (0, None) and not doc.get("kill_event") and not doc.get("stopped")


class _Peers:
    """The parts of one multi-node job: when one fails, stop the rest after the grace."""

    def __init__(self, pool: ExecutorPool, run: Run, jobs: list[Job], grace_s: float) -> None:
        self.pool, self.jobs, self.grace_s = pool, jobs, grace_s
        self.running = {j.node.name for j in jobs}
        self.lock = threading.Lock()
        self.first: str | None = None
        self.timer: threading.Timer | None = None
        nonce = secrets.token_hex(4)  # an earlier attempt's stop file never stops this one
        for j in jobs:
            j.stop = f"{j.remote_out(run)}.stop-{nonce}"

    def ended(self, node: str, failed: bool) -> None:
        with self.lock:
            self.running.discard(node)
            if not failed or self.first is not None or not self.running:
                return
            self.first = node
            self.timer = threading.Timer(self.grace_s, self._stop)
            self.timer.daemon = True
            self.timer.start()

    def _stop(self) -> None:
        with self.lock:
            left = [j for j in self.jobs if j.node.name in self.running]
        why = (f"the part on {self.first} failed; this part could not finish without it "
               f"and was stopped {self.grace_s:.0f} s later")

        def one(n: Node) -> None:
            job = next(j for j in left if j.node.name == n.name)
            assert job.stop is not None
            tmp = shlex.quote(job.stop + ".tmp")
            self.pool(n).run(f"mkdir -p {shlex.quote(str(Path(job.stop).parent))} && "
                             f"printf %s {shlex.quote(why)} > {tmp} && "
                             f"mv -f {tmp} {shlex.quote(job.stop)}", timeout=60)
        fanout([j.node for j in left], one, concurrency=max(1, len(left)))

    def close(self) -> None:
        # a stop file written is removed by its supervisor when the job ends
        if self.timer is not None:
            self.timer.cancel()


def run_phase(pool: ExecutorPool, run: Run, suite: Suite, jobs: list[Job], *,
              grace_s: float = PEER_GRACE_S) -> tuple[list[Job], dict[str, GpuvetError]]:
    """All jobs of one phase at once (a multi-node job needs every node running). The
    parts of a multi-node job are linked: one that fails stops the others after
    `grace_s` (their documents say `stopped`, with the reason)."""
    by_node = {j.node.name: j for j in jobs}
    peers = _Peers(pool, run, jobs, grace_s) if len(jobs) > 1 and all(
        j.nnodes > 1 for j in jobs) else None

    def one(n: Node) -> None:
        failed = True
        try:
            failed = _part_failed(run_job(pool, run, suite, by_node[n.name]))
        finally:
            if peers is not None:
                peers.ended(n.name, failed)

    try:
        group = fanout([j.node for j in jobs], one, concurrency=max(1, len(jobs)))
    finally:
        if peers is not None:
            peers.close()
    return [j for j in jobs if j.node.name in group.results], group.failures


class Ahead:
    """The jobs of the next phase started while the current one still runs: torchrun, the
    interpreter, torch, the CUDA context and the process group are ready when the GPU
    frees, and each job's ranks hold at their gate until `open` says go (or stop, for a
    unit whose phase before failed). About 12 s of every relaunch on an H100 (torchrun
    3 s, import torch 3 s, the CUDA context 4 s, compile set-up 2 s) leave the critical
    path (docs/training.md, "Launches started ahead")."""

    def __init__(self, pool: ExecutorPool, run: Run, suite: Suite, jobs: list[Job], *,
                 at: str = "ready", gate_timeout_s: float | None = None) -> None:
        self.pool, self.run, self.jobs = pool, run, jobs
        for j in jobs:
            j.gate = j.gate_path(run)
            j.gate_at, j.gate_timeout_s = at, gate_timeout_s
        self.result: tuple[list[Job], dict[str, GpuvetError]] | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, args=(suite,), daemon=True,
                                        name="gpuvet-train-ahead")
        self._thread.start()

    def _work(self, suite: Suite) -> None:
        try:
            self.result = run_phase(self.pool, self.run, suite, self.jobs)
        except BaseException as exc:  # handed to the caller in wait()
            self.error = exc

    @property
    def waiting(self) -> bool:
        """Its launches have not ended (a gate that gave up ends them)."""
        return self._thread.is_alive()

    def open(self, go: set[str]) -> None:
        """Say go to the jobs of the units in `go`, stop to the others."""
        self._say(lambda j: "go" if j.unit in go else "stop")

    def warm(self) -> None:
        """Jobs held at the start gate may make their CUDA context and process group now
        (what measured the GPUs is over); they hold again at the ready gate."""
        self._say(lambda j: "cuda")

    def _say(self, word_of: Callable[[Job], str]) -> None:
        def one(n: Node) -> None:
            for j in self.jobs:
                if j.node.name != n.name or not j.gate:
                    continue
                word = word_of(j)
                gate, tmp = shlex.quote(j.gate), shlex.quote(j.gate + ".tmp")
                self.pool(n).run(f"mkdir -p {shlex.quote(str(Path(j.gate).parent))} && "
                                 f"printf {word} > {tmp} && mv -f {tmp} {gate}", timeout=60)
        nodes = list({j.node.name: j.node for j in self.jobs}.values())
        fanout(nodes, one, concurrency=max(1, len(nodes)))

    def wait(self) -> tuple[list[Job], dict[str, GpuvetError]]:
        self._thread.join()
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


class AheadGroup:
    """Several `Ahead`s (one per node, started before the step) seen as one phase's."""

    def __init__(self, parts: list[Ahead]) -> None:
        self.parts = parts
        self.jobs = [j for a in parts for j in a.jobs]

    def open(self, go: set[str]) -> None:
        for a in self.parts:
            a.open(go)

    def wait(self) -> tuple[list[Job], dict[str, GpuvetError]]:
        done: list[Job] = []
        failures: dict[str, GpuvetError] = {}
        error: BaseException | None = None
        for a in self.parts:
            try:
                d, f = a.wait()
            except BaseException as exc:  # the others are waited for all the same
                error = error or exc
                continue
            done += d
            failures.update(f)
        if error is not None:
            raise error
        return done, failures
