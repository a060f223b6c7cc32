"""How one fleet job (a pair, a group, the whole fleet) runs on its nodes.

Two engines, chosen with `--engine`:

- **nccl-tests**: one `mpirun` with an application context per node of the job,
  started on the job's first node (orchestrator.nccltests, as the nccl step's
  multi-node run); nccl-tests is built on every node first, once per run.
- **torch**: the payload's `allreduce-bench` under `torch.distributed.run` on
  every node of the job at once, the first node the rendezvous master (gloo on
  CPU nodes, NCCL on GPUs). The whole-fleet job also writes every rank's
  barrier times (`--rank-times`) for the straggler analysis.

A job runs each of the suite's `fleet.collectives` in turn: one run per collective
(the collective's own `<name>_perf` binary in the same mpirun, or the benchmark with
its `--op`), each its own log (`collective_label`) under its own stall bound.
Each run's rank-0 output streams into one log in the run directory; its stderr
is kept beside it when there is any. Which node failed is told apart from
why: a node the controller cannot reach is named in `JobFailed.unreachable`.
"""

from __future__ import annotations

import shlex
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from orchestrator import nccltests
from orchestrator import payload as payload_mod
from orchestrator.errors import GpuvetError, StepError
from orchestrator.executors import ExecutorPool, fanout
from orchestrator.executors.base import EnvCommand, is_unreachable
from orchestrator.files import scrub_in_place
from orchestrator.inventory import Node
from orchestrator.nccltests import BuildDoc
from orchestrator.store import Run
from orchestrator.suite import FleetParams, NcclParams
from payload.scrub import scrub_text

EngineName = Literal["nccl-tests", "torch"]
ENGINES: tuple[EngineName, ...] = ("nccl-tests", "torch")
STEP = "fleet"


class JobFailed(StepError):
    """A job gave no result; `unreachable`: the nodes of it the controller lost."""

    def __init__(self, what: str, *, unreachable: Sequence[str] = (),
                 evidence: Sequence[str] = (), hint: str | None = None) -> None:
        self.unreachable = tuple(unreachable)
        self.evidence = list(evidence)
        super().__init__(what, hint=hint)


@dataclass
class JobOutput:
    log: Path  # rank 0's output: nccl-tests' table (and NCCL INFO lines)
    stderr: Path | None = None
    rank_times: Path | None = None  # the whole-fleet job of the torch engine
    files: list[Path] = field(default_factory=list)  # everything kept, log first


class StallWatch:
    """Kills a job whose rank-0 log has stopped growing for `stall_s` (fleet
    `stall_timeout_s`): a collective, or the set-up, waiting on a peer that will never
    answer prints nothing more, and would otherwise hold its round until the job's own
    `timeout_s`. The job's commands are killed through their executors' `cancel` (in a
    round each node runs one job only), so the job returns and is recorded failed, and
    the plan goes on."""

    POLL_S = 0.5

    def __init__(self, log: Path, executors: Sequence[object], stall_s: float) -> None:
        self.log, self.executors, self.stall_s = log, list(executors), stall_s
        self.hung = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True,
                                        name=f"gpuvet-stall-{log.name}")

    def __enter__(self) -> StallWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _size(self) -> int:
        try:
            return self.log.stat().st_size
        except OSError:
            return -1

    def _watch(self) -> None:
        size, since = self._size(), time.monotonic()
        while not self._done.wait(self.POLL_S):
            now, grown = time.monotonic(), self._size()
            if grown != size:
                size, since = grown, now
            elif now - since >= self.stall_s:
                self.hung = True
                for ex in self.executors:
                    cancel = getattr(ex, "cancel", None)
                    if cancel is not None:
                        cancel()
                return

    def why(self) -> str:
        return (f"no output for {self.stall_s:.0f} s (fleet.stall_timeout_s): hung, killed")


def nccl_params(p: FleetParams, base: NcclParams | None = None) -> NcclParams:
    """The nccl-tests parameters of one fleet job: the suite's (source, datatype, op),
    one round at the fleet's sizes."""
    return (base or NcclParams()).model_copy(update={
        "min_bytes": p.min_bytes, "max_bytes": p.max_bytes, "step_factor": p.step_factor,
        "iters": p.iters, "warmup_iters": p.warmup_iters, "check": p.check, "rounds": 1,
        "timeout_s": p.timeout_s})


def collective_label(label: str, collective: str) -> str:
    """The log name of one collective's run of a job: all_reduce keeps the job's own
    (`pairs-r0_a+b`, as runs on disk have it), another collective's ends in its name
    (`pairs-r0_a+b_alltoall`)."""
    return nccltests.log_label(label, collective)


def torch_args(p: FleetParams, collective: str = "all_reduce") -> list[str]:
    args = ["allreduce-bench", "-b", p.min_bytes, "-e", p.max_bytes, "-f", str(p.step_factor),
            "-n", str(p.iters), "-w", str(p.warmup_iters), "-c", str(p.check),
            "--pg-timeout", f"{p.collective_timeout_s:g}"]
    if collective != "all_reduce":
        args += ["--op", collective]
    return args


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _keep_stderr(path: Path, text: str) -> Path | None:
    if not text.strip():
        return None
    path.write_text(scrub_text(text))
    return path


def run_torch(pool: ExecutorPool, nodes: Sequence[Node], run: Run, p: FleetParams,
              out_dir: Path, label: str, *, port: int, gpus: Mapping[str, int],
              rank_times: bool = False, collective: str = "all_reduce") -> JobOutput:
    """allreduce-bench of `collective` across `nodes`, one torchrun per node, all at once;
    `label` is the job's, the log's name says the collective."""
    local = nodes[0].executor == "local"
    master = "127.0.0.1" if local else (nodes[0].host or nodes[0].name)
    label = collective_label(label, collective)
    log = out_dir / f"{label}.log"
    args = torch_args(p, collective)
    rel_times = f"../fleet-runs/{run.run_id}/{label}.rank-times.json"  # from the payload dir
    if rank_times:
        args += ["--rank-times", rel_times, "--straggler-iters", str(p.straggler_iters)]
    env = dict(nccltests.RUN_ENV)

    def one(n: Node) -> tuple[int | None, str]:
        i = nodes.index(n)
        procs = gpus.get(n.name, 1)
        launcher, rendezvous = nccltests.rank_launch(
            len(nodes), i, procs, master, port,
            one_each=all(gpus.get(x.name, 1) == 1 for x in nodes))
        own = {**env, "GPUVET_NODE": n.name, **rendezvous}
        res = payload_mod.run(pool(n), args, staging=run.dir / ".staging",
                              timeout=p.timeout_s, launcher=launcher, env=own,
                              stdout_path=log if i == 0 else None)
        if res.timed_out:
            return None, res.stderr
        return res.rc, res.stderr

    with StallWatch(log, [pool(n) for n in nodes], p.stall_timeout_s) as watch:
        group = fanout(list(nodes), one, concurrency=len(nodes))
    lost = [n for n, exc in group.failures.items() if is_unreachable(exc)]
    errs = "".join(f"== {n} ==\n{group.results[n][1]}" for n in group.results
                   if group.results[n][1].strip())
    scrub_in_place(log)  # streamed as it came: scrubbed once complete, like the nccl step's
    stderr = _keep_stderr(out_dir / f"{label}.stderr.log", errs)
    files = [f for f in (log, stderr) if f is not None and f.is_file()]
    evidence = [run.rel(f) for f in files]
    if group.failures:
        name, exc = next(iter(group.failures.items()))
        raise JobFailed(f"{label}: {name}: {exc.what}", unreachable=lost, evidence=evidence,
                        hint=exc.hint)
    bad = {n: rc for n, (rc, _) in group.results.items() if rc != 0}
    if watch.hung:
        raise JobFailed(f"{label}: torch.distributed {collective}: {watch.why()}",
                        evidence=evidence)
    if bad:
        shown = ", ".join(f"{n} {'timed out' if rc is None else f'rc={rc}'}"
                          for n, rc in bad.items())
        raise JobFailed(f"{label}: torch.distributed {collective} failed ({shown})",
                        evidence=evidence)
    out = JobOutput(log=log, stderr=stderr, files=files)
    if rank_times:
        head = pool(nodes[0])
        remote = f"{payload_mod.remote_dir(head.node.work_dir)}/{rel_times}"
        local_times = out_dir / f"{label}.rank-times.json"
        try:
            head.get(remote, local_times)
            head.run(f"rm -f {shlex.quote(remote)}", timeout=60)
            out.rank_times = local_times
            out.files.append(local_times)
        except GpuvetError:
            local_times.unlink(missing_ok=True)  # the straggler analysis says it is missing
    return out


def nccl_command(nodes: Sequence[Node], params: NcclParams, builds: Mapping[str, BuildDoc],
                 collective: str = "all_reduce") -> EnvCommand:
    """The mpirun of one collective across `nodes`: a context per node running the
    collective's own binary beside the node's all_reduce_perf (one build makes them all)."""
    contexts = []
    for n in nodes:
        b = builds[n.name]
        binary = nccltests.collective_binary(str(b.binary), collective)
        plan = nccltests.perf_argv(binary, params, 1, set(b.flags), None)
        contexts.append((n, plan.argv, int(b.gpus or 1)))
    return nccltests.mpirun_command(contexts, nccltests.run_env(params),
                                    local=nodes[0].executor == "local")


def run_nccl_tests(pool: ExecutorPool, nodes: Sequence[Node], run: Run, params: NcclParams,
                   out_dir: Path, label: str, *, builds: Mapping[str, BuildDoc],
                   stall_s: float | None = None, collective: str = "all_reduce") -> JobOutput:
    """One mpirun of `collective` across `nodes` (one context per node), started on the
    first; killed when its output stops growing for `stall_s`. `label` is the job's, the
    log's name says the collective."""
    head = pool(nodes[0])
    cmd = nccl_command(nodes, params, builds, collective)
    label = collective_label(label, collective)
    log = out_dir / f"{label}.log"
    watch = StallWatch(log, [head], stall_s if stall_s is not None else params.timeout_s)
    try:
        with watch:
            res = head.run(cmd, env=nccltests.run_env(params), timeout=params.timeout_s,
                           stdout_path=log)
    except GpuvetError as exc:
        raise JobFailed(f"{label}: {exc.what}",
                        unreachable=[nodes[0].name] if is_unreachable(exc) else [],
                        hint=exc.hint) from exc
    scrub_in_place(log)
    stderr = _keep_stderr(out_dir / f"{label}.stderr.log", res.stderr)
    files = [f for f in (log, stderr) if f is not None and f.is_file()]
    if watch.hung or res.timed_out or res.rc != 0:
        why = watch.why() if watch.hung else "timed out" if res.timed_out else f"rc={res.rc}"
        raise JobFailed(f"{label}: mpirun {collective}_perf failed ({why})",
                        evidence=[run.rel(f) for f in files])
    return JobOutput(log=log, stderr=stderr, files=files)


def build_nccl_tests(pool: ExecutorPool, node: Node, run: Run, params: NcclParams,
                     archive: Path | None) -> BuildDoc:
    """nccl-tests on one node (cached across runs), as the nccl step builds it."""
    out_dir = run.node_dir(node.name, STEP)
    doc = nccltests.build(pool(node), params, archive, run.dir / ".staging", out_dir)
    if not doc.ok:
        raise StepError(f"nccl-tests build failed: {doc.diagnosis or 'unknown cause'}",
                        node=node.name, hint="run `gpuvet nccl` on the node for the build "
                        "log, or use --engine torch")
    return doc
