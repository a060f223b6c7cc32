"""The training step: a real small training job, a checkpoint, a SIGKILL, a
verified restore.

First every node is probed twice (payload `train-probe`): each leaves a token
in its checkpoint directory, then each lists the tokens it sees, which tells
which nodes share storage, and where the directory lives. Then, per unit of
the step driver:

- single-node: the protocol on each node's own GPUs. Nodes that share a
  checkpoint directory form one unit and run each phase together; the restore
  of node i's checkpoint runs on the next node of the group, so no node runs
  two jobs at once. A node that shares with nobody is a unit of its own and
  restores on itself.
- multi-node: per provider with two or more nodes, torchrun across them
  (static rendezvous on the first node); the restore runs with the node order
  rotated, so every rank resumes on another node. Without a shared directory
  only the reference runs: a multi-node checkpoint would be split across the
  nodes' disks.

Each phase is one `train-supervise` per node (payload/train/supervise.py); its
files come back into the run directory and judge.py judges them.
"""

from __future__ import annotations

import functools
import re
import socket
import threading
import zlib
from pathlib import Path

from orchestrator.errors import ConnectionFailed, GpuvetError
from orchestrator.executors import ExecutorPool
from orchestrator.executors.base import ProgressHook
from orchestrator.inventory import Inventory, Node
from orchestrator.judging.sink import combined
from orchestrator.judging.storage import storage_findings
from orchestrator.records import node_unit_key
from orchestrator.steps.driver import (
    Driven,
    StageTracker,
    Unit,
    UnitFailed,
    UnitResult,
    drive,
    node_unit,
    provider_unit,
    step_pool,
)
from orchestrator.steps.train.judge import Judge, Subject
from orchestrator.steps.train.launch import Ahead, AheadGroup, Job, phase_extra, run_phase
from orchestrator.steps.train.reading import PhaseOutput, read_phase
from orchestrator.steps.train.storage import (
    Probe,
    _cleanup,
    ckpt_base,
    ckpt_root,
    probe_nodes,
    share_groups,
)
from orchestrator.store import Run
from orchestrator.suite import Suite, TrainParams
from payload.train.config import param_count, resolve

STEP = "train"


# --------------------------------------------------------------------------- launching


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port(nodes: list[Node], run: Run, unit: str, phase: str) -> int:
    if nodes[0].executor == "local":
        return _free_port()
    return 29500 + zlib.crc32(f"{run.run_id}/{unit}/{phase}".encode()) % 2000


def _master(nodes: list[Node]) -> str:
    return "127.0.0.1" if nodes[0].executor == "local" else (nodes[0].host or nodes[0].name)


def _launch_failed(judge: Judge, phase: str, node: str, exc: GpuvetError,
                   folder: Path) -> None:
    judge.add("TRAIN_FAILED", "FAIL", f"{phase}: could not run on {node}: {exc.what}",
              [folder / "supervise.stderr", folder / "supervise.json"], phase=phase)


# --------------------------------------------------------------------------- units


def unit_job(run: Run, params: TrainParams, owner: str, runner: Node, phase: str) -> Job:
    """One phase of the single-node unit of `owner`'s checkpoints, run on `runner` (the
    owner itself, or its restore's other node); its files come back under the owner."""
    return Job(owner, runner, phase, run.node_dir(owner, STEP) / phase / runner.name,
               ckpt_root(runner, run, owner), extra=phase_extra(params, phase))


# how long a reference started before the step may wait for it: the steps before it
# (health, nccl, fleet) run meanwhile
PRELAUNCH_GATE_S = 7200.0


class Prelaunch:
    """Each node's reference launch, started before the training step (the pipeline starts
    it when preflight is done, while health measures the GPUs): the supervisor, the
    interpreter, torch and torch.compile's imports are ready when health ends; the ranks
    hold before any CUDA call until then (`warm`), then make their CUDA context and process
    group and hold again until the step reaches the node's unit, whose reference opens
    the gate (docs/training.md, "Launches started ahead"). What the step does not use (a
    node that failed its probe, a unit already done, a gate that gave up) is told to stop
    by `release`."""

    def __init__(self, pool: ExecutorPool, run: Run, suite: Suite, nodes: list[Node]) -> None:
        self.lock = threading.Lock()
        self.parts: dict[str, Ahead] = {}
        for n in nodes:
            job = unit_job(run, suite.train, n.name, n, "reference")
            self.parts[n.name] = Ahead(pool, run, suite, [job], at="start",
                                       gate_timeout_s=PRELAUNCH_GATE_S)

    @classmethod
    def start(cls, pool: ExecutorPool, run: Run, suite: Suite, nodes: list[Node]
              ) -> Prelaunch | None:
        """The references of the nodes whose training unit is still to run, or None where
        the suite's training has no reference of ours (the user's own command)."""
        if suite.train.command:
            return None
        todo = [n for n in nodes if not run.is_done(node_unit_key(n.name), STEP)]
        return cls(pool, run, suite, todo) if todo else None

    def warm(self) -> None:
        """The GPUs' measurements are over: each launch may make its CUDA context and
        process group now, and holds at its ready gate until the step takes it."""
        with self.lock:
            parts = list(self.parts.values())
        for a in parts:
            try:
                a.warm()
            except GpuvetError:
                pass  # a node gone away: its unit fails in the step, which says so

    def take(self, names: list[str]) -> AheadGroup | None:
        """The references of these nodes, if each is still waiting at its gate."""
        with self.lock:
            if not all(n in self.parts and self.parts[n].waiting for n in names):
                return None
            return AheadGroup([self.parts.pop(n) for n in names])

    def release(self, wait: bool = True) -> None:
        """Tell every launch not taken to stop, and (unless interrupted) wait for it."""
        with self.lock:
            left = list(self.parts.values())
            self.parts.clear()
        for a in left:
            try:
                a.open(set())
            except GpuvetError:
                pass  # a node gone away: its launch gives up at its gate's bound
        for a in left if wait else []:
            try:
                a.wait()
            except GpuvetError:
                pass


class Step:
    """The step's context: one run, one suite, the probes, the references started before
    it (if any)."""

    def __init__(self, inv: Inventory, run: Run, suite: Suite, pool: ExecutorPool,
                 probes: dict[str, Probe], pre: Prelaunch | None = None) -> None:
        self.inv, self.run, self.suite, self.pool, self.probes = inv, run, suite, pool, probes
        self.pre = pre

    @property
    def params(self) -> TrainParams:
        return self.suite.train

    def judge(self, provider: str, node: str | None, nodes: list[str], label: str) -> Judge:
        return Judge(self.run.run_id, self.suite, Subject(provider, node, nodes, label),
                     self.run.rel)

    def storage(self, judge: Judge, p: Probe, others: list[Probe]) -> None:
        storage_findings(judge.sink, p.node.name, p.doc, p.file, p.node.ckpt_dir is not None)
        free = (p.doc.get("path") or {}).get("free_bytes")
        # fp32 weights and AdamW's two moments; the kill phase may write two checkpoints,
        # and nodes sharing the directory write theirs at the same time
        need = 12 * param_count(resolve(self.params.payload_params())) * 2 * (1 + len(
            [o for o in others if o.node.name in p.sees]))
        if not self.params.command and free is not None and free < need:
            judge.add("CKPT_SPACE_LOW", "WARN", f"{p.node.name}: {free / 1e9:.1f} GB free under "
                      f"{ckpt_base(p.node)}, the protocol may write {need / 1e9:.1f} GB of "
                      "checkpoints there", [p.file], free_bytes=free, need_bytes=need)
        apart = [o.node.name for o in others if o.node.name not in p.sees]
        if apart:
            judge.add("CKPT_NOT_PERSISTENT", "WARN", f"{p.node.name}: ckpt_dir "
                      f"{ckpt_base(p.node)} is node-local: {', '.join(apart)} cannot see its "
                      "files, so a checkpoint would not survive the loss of this node and its "
                      "restore ran here", [p.file], reason="not-shared", apart=apart)
        elif others:
            judge.add("CKPT_SHARED", "PASS", f"{p.node.name}: ckpt_dir {ckpt_base(p.node)} is "
                      f"shared with {', '.join(o.node.name for o in others)}", [p.file])

    def single(self, group: list[Probe], stage: StageTracker) -> UnitResult:
        """The protocol on each node of a share group, phase by phase, restores rotated."""
        run, params = self.run, self.params
        names = [p.node.name for p in group]
        judges = {p.node.name: self.judge(p.node.provider, p.node.name, [p.node.name], "single")
                  for p in group}
        provider_nodes = [q for q in self.probes.values() if q.node.provider == group[0].node.provider]
        for p in group:
            self.storage(judges[p.node.name], p, [q for q in provider_nodes if q is not p])
        alive = list(names)
        saved_on: dict[str, Node] = {}
        phases: tuple[str, ...] = ("reference", "kill", "restore")
        if params.command and params.resume_flag is None:
            phases = ("reference",)
        # the user's own command holds at no gate: its phases run one after the other
        ahead_ok = not params.command

        def jobs_of(phase: str) -> list[Job]:
            jobs = []
            for i, owner in enumerate(names):
                if owner not in alive:
                    continue
                runner = group[(i + 1) % len(group)].node if phase == "restore" else group[i].node
                jobs.append(unit_job(run, params, owner, runner, phase))
            return jobs

        ahead: Ahead | AheadGroup | None = None
        if ahead_ok and self.pre is not None:
            ahead = self.pre.take(names)  # the references started before the step
            if ahead is not None:
                ahead.open(set(alive))
        for k, phase in enumerate(phases):
            jobs = ahead.jobs if ahead is not None else jobs_of(phase)
            stage.note(f"{phase} on " + ", ".join(
                j.node.name if j.unit == j.node.name else f"{j.node.name} ({j.unit}'s checkpoint)"
                for j in jobs))
            with stage("execute"):
                current = ahead
                nxt = phases[k + 1] if k + 1 < len(phases) else None
                if current is None:
                    # the next phase's launches start now and hold at their gates
                    ahead = Ahead(self.pool, run, self.suite, jobs_of(nxt)) \
                        if nxt and ahead_ok else None
                    try:
                        done, failures = run_phase(self.pool, run, self.suite, jobs)
                    except BaseException:
                        if ahead is not None:
                            ahead.open(set())
                        raise
                else:
                    ahead = Ahead(self.pool, run, self.suite, jobs_of(nxt)) \
                        if nxt and ahead_ok else None
                    try:
                        done, failures = current.wait()
                    except BaseException:
                        if ahead is not None:
                            ahead.open(set())
                        raise
            with stage("judge"):
                for j in jobs:
                    if j.unit not in alive:  # started ahead, then told to stop: not run
                        continue
                    jd = judges[j.unit]
                    if j.node.name in failures:
                        _launch_failed(jd, phase, j.node.name, failures[j.node.name], j.local_dir)
                        alive.remove(j.unit)
                        continue
                    out = read_phase(phase, [(j.node.name, j.local_dir)])
                    if not self._judge_phase(jd, phase, out, [saved_on.get(j.unit, j.node).name],
                                             [j.node.name]):
                        alive.remove(j.unit)
                    if phase == "kill":
                        saved_on[j.unit] = j.node
            if ahead is not None:
                ahead.open(set(alive))
        _cleanup(self.pool, run, params, [(p.node, ckpt_root(p.node, run, p.node.name))
                                          for p in group])
        return combined([jd.sink for jd in judges.values()], {"nodes": names})

    def _judge_phase(self, jd: Judge, phase: str, out: PhaseOutput, saved_on: list[str],
                     restored_on: list[str]) -> bool:
        if self.params.command:
            return jd.command(out)
        if phase == "reference":
            return jd.reference(out)
        if phase == "kill":
            return jd.kill(out)
        jd.restore(out, saved_on=saved_on, restored_on=restored_on)
        return True

    def multi(self, members: list[Probe], stage: StageTracker) -> UnitResult:
        run, params = self.run, self.params
        prov = members[0].node.provider
        names = [p.node.name for p in members]
        jd = self.judge(prov, None, names, "multi")
        unit = f"multi-{re.sub(r'[^A-Za-z0-9_.-]', '_', prov)}"
        shared = all(a.node.name in b.sees for a in members for b in members if a is not b)
        order = [p.node for p in members]
        for phase in ("reference", "kill", "restore"):
            if phase != "reference" and not shared:
                jd.add("TRAIN_MULTI_RESTORE_SKIPPED", "WARN", "the nodes do not share a "
                       "checkpoint directory: a multi-node checkpoint would be split across "
                       "their disks, so only the reference ran", [p.file for p in members])
                break
            if phase == "restore":
                order = order[1:] + order[:1]  # every rank resumes on another node
            port, master = _port(order, run, unit, phase), _master(order)
            folder = run.provider_dir(prov, STEP) / "multi" / phase
            jobs = [Job(unit, n, phase, folder / n.name, ckpt_root(n, run, unit), node_rank=i,
                        nnodes=len(order), master=master, port=port,
                        extra=phase_extra(params, phase)) for i, n in enumerate(order)]
            stage.note(f"{phase} on {'+'.join(n.name for n in order)}")
            with stage("execute"):
                _done, failures = run_phase(self.pool, run, self.suite, jobs)
            with stage("judge"):
                for name, exc in failures.items():
                    _launch_failed(jd, phase, name, exc, folder / name)
                out = read_phase(phase, [(j.node.name, j.local_dir) for j in jobs
                                         if j.node.name not in failures])
                if failures or not self._judge_phase(jd, phase, out, names,
                                                     [n.name for n in order]):
                    break
        _cleanup(self.pool, run, params, [(p.node, ckpt_root(p.node, run, unit))
                                          for p in members])
        return jd.sink.result({"nodes": names, "shared": shared})


def run_train(inv: Inventory, nodes: list[Node], run: Run, suite: Suite, *,
              single: bool = True, multi: bool = True, pool: ExecutorPool | None = None,
              accept_new_host_keys: bool = False,
              progress: ProgressHook | None = None, pre: Prelaunch | None = None) -> Driven:
    """Probe, then the single-node units, then the multi-node ones (never both at once on
    the same GPUs); each unit recorded as it ends. `pre`: the references started before
    the step (`Prelaunch`), used where they fit and stopped where not."""
    try:
        return _run_train(inv, nodes, run, suite, single=single, multi=multi, pool=pool,
                          accept_new_host_keys=accept_new_host_keys, progress=progress, pre=pre)
    except BaseException:
        if pre is not None:
            pre.release(wait=False)
        raise


def _run_train(inv: Inventory, nodes: list[Node], run: Run, suite: Suite, *, single: bool,
               multi: bool, pool: ExecutorPool | None, accept_new_host_keys: bool,
               progress: ProgressHook | None, pre: Prelaunch | None) -> Driven:
    params = suite.train
    with step_pool(inv, pool, accept_new_host_keys) as p:
        probes, failures = probe_nodes(p, inv, nodes, run, need_torch=not params.command)
        step = Step(inv, run, suite, p, probes, pre if single else None)
        singles: list[Unit] = []
        multis: list[Unit] = []
        for prov in dict.fromkeys(n.provider for n in nodes):
            members = [probes[n.name] for n in nodes if n.provider == prov and n.name in probes]
            if single or params.command:
                for g in share_groups(members):
                    work = functools.partial(_single, step, g)
                    singles.append(node_unit(g[0].node, work) if len(g) == 1 else provider_unit(
                        prov, "single-" + "+".join(q.node.name for q in g), work))
            if multi and not params.command and len(members) >= 2 \
                    and len({m.gpus for m in members}) == 1:
                multis.append(provider_unit(prov, "multi", functools.partial(_multi, step, members)))
        for name, exc in failures.items():
            code = "NODE_UNREACHABLE" if _unreachable(exc) else "TRAIN_PROBE_FAILED"
            err = UnitFailed(exc.what, code, [], node=name, hint=exc.hint)
            singles.append(node_unit(inv.node(name), functools.partial(_raise, err)))
        done = {u.key for u in singles + multis if run.is_done(u.key, STEP)}
        run.retract(keep_units=done, step=STEP)
        driven = drive(run, STEP, singles, concurrency=inv.settings.concurrency,
                       progress=progress)
        if pre is not None:  # before the multi-node units: none of them stays waiting
            pre.release()
        more = drive(run, STEP, multis, concurrency=inv.settings.concurrency,
                     progress=progress)
        driven.done.update(more.done)
        driven.failed.update(more.failed)
        driven.skipped += more.skipped
        return driven


def _single(step: Step, group: list[Probe], stage: StageTracker) -> UnitResult:
    return step.single(group, stage)


def _multi(step: Step, members: list[Probe], stage: StageTracker) -> UnitResult:
    return step.multi(members, stage)


def _raise(exc: GpuvetError, stage: StageTracker) -> UnitResult:
    raise exc


def _unreachable(exc: GpuvetError) -> bool:
    return isinstance(exc, ConnectionFailed) or isinstance(exc.__cause__, ConnectionFailed)
