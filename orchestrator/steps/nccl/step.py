"""The nccl step: build nccl-tests at the suite's commit, run its collectives, judge them.

The suite's `nccl.collectives` (all_reduce unless it says more) run one after the other,
each with the same rounds and parameters, from the one build (every `<collective>_perf`
is made beside all_reduce_perf).

Per node: build (cached), then the suite's rounds on its own GPUs; a node with
one GPU has nothing to all-reduce with, so its single-node rounds are skipped
(NCCL_NOT_APPLICABLE) and its GPU still takes part across nodes. Per
provider with two or more nodes: the same rounds across nodes with mpirun.
Optionally the torch.distributed benchmark as a second opinion. Raw logs are
streamed into the run directory; everything else is derived from them. The fabric's
ports are read from sysfs before and after each node's load (`judging.fabric.Around`):
an error counter that grew, a port that went down, is a finding naming the port.
"""

from __future__ import annotations

import functools
import re
import shlex
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator import nccltests
from orchestrator.errors import CommandFailed, GpuvetError
from orchestrator.executors import ExecutorPool, fanout
from orchestrator.executors.base import Executor, ProgressHook
from orchestrator.files import scrub_in_place
from orchestrator.inventory import Inventory, Node
from orchestrator.judging.fabric import Around
from orchestrator.nccltests import BuildDoc
from orchestrator.records import (
    Finding,
    Measurement,
    MeasureScope,
    Severity,
    finding,
    node_unit_key,
    provider_unit_key,
)
from orchestrator.steps.driver import (
    Driven,
    StageTracker,
    UnitFailed,
    UnitResult,
    drive,
    node_unit,
    provider_unit,
    step_pool,
)
from orchestrator.steps.nccl.judge import Series, judge_series
from orchestrator.steps.nccl.torchbench import (
    bench_failure_cause,
    run_bench,
    timed_out,
    torch_skipped,
)
from orchestrator.steps.nccl.torchbench import gpus as _gpus
from orchestrator.store import Run
from orchestrator.suite import Suite
from payload.scrub import scrub_text

STEP = "nccl"


@dataclass
class NcclOutcome:
    findings: list[Finding] = field(default_factory=list)
    measurements: list[Measurement] = field(default_factory=list)


def _f(run: Run, node: str | None, provider: str, code: str, sev: Severity, msg: str,
       evidence: list[str] | None = None, **details: Any) -> Finding:
    return finding(run.run_id, STEP, provider=provider, node=node, code=code, severity=sev,
                   message=msg, evidence=evidence or [], **details)


def _build_node(ex: Executor, run: Run, suite: Suite, archive: Path | None) -> BuildDoc:
    out_dir = run.node_dir(ex.node.name, STEP)
    try:
        doc = nccltests.build(ex, suite.nccl, archive, run.dir / ".staging", out_dir)
    except GpuvetError as exc:
        raise UnitFailed(exc.what, "NCCL_BUILD_FAILED", _evidence(run, out_dir, "build.json",
                                                                 "build.stderr.log"),
                         node=ex.node.name, hint=exc.hint) from exc
    if not doc.ok:
        raise UnitFailed(f"nccl-tests build failed: {doc.diagnosis or 'unknown cause'}",
                         "NCCL_BUILD_FAILED", _evidence(run, out_dir, "build.json", "build.log"),
                         node=ex.node.name, hint=f"see {run.rel(out_dir / 'build.log')}"
                         if (out_dir / "build.log").is_file() else None)
    return doc


def _evidence(run: Run, out_dir: Path, *names: str) -> list[str]:
    return [run.rel(out_dir / n) for n in names if (out_dir / n).is_file()]


def _rounds(ex: Executor, run: Run, suite: Suite, out_dir: Path, label: str,
            command: Callable[[int], tuple[str, str | None]],
            env: dict[str, str] | None = None) -> list[tuple[int, Path, bool]]:
    """Run the suite's rounds back to back; each log streams to its own file."""
    done = []
    for r in range(1, suite.nccl.rounds + 1):
        cmd, remote_json = command(r)
        log = out_dir / f"{label}_round{r}.log"
        res = ex.run(cmd, env=env if env is not None else nccltests.run_env(suite.nccl),
                     timeout=suite.nccl.timeout_s + 60, stdout_path=log)
        scrub_in_place(log)
        if res.stderr:
            (out_dir / f"{label}_round{r}.stderr.log").write_text(scrub_text(res.stderr))
        if remote_json and res.ok:
            local_json = out_dir / f"{label}_round{r}.json"
            try:
                # fetched beside the log, then cut down: it holds the node's whole env
                ex.get(remote_json, local_json)
                nccltests.scrub_json_env(local_json)
                ex.run(f"rm -f {shlex.quote(remote_json)}", timeout=60)
            except GpuvetError:
                local_json.unlink(missing_ok=True)  # the text log is the primary record
        done.append((r, log, res.timed_out))
    return done


def _single(ex: Executor, run: Run, suite: Suite, inv: Inventory,
            build: BuildDoc, collective: str = "all_reduce",
            mode: str = "normal") -> list[tuple[int, Path, bool]]:
    out_dir = run.node_dir(ex.node.name, STEP)
    gpus = _gpus(ex.node, inv, build)
    flags = set(build.flags)
    label = nccltests.log_label("single", collective, mode)
    binary = nccltests.collective_binary(str(build.binary), collective)

    def cmd(r: int) -> tuple[str, str | None]:
        remote_json = f"{nccltests.cache_dir(ex.node)}/runs/{run.run_id}/{label}_r{r}.json"
        plan = nccltests.perf_argv(binary, suite.nccl, gpus, flags, remote_json)
        prefix = f"mkdir -p {shlex.quote(str(Path(remote_json).parent))} && " if plan.json_path \
            else ""
        return prefix + shlex.join(plan.argv), plan.json_path

    return _rounds(ex, run, suite, out_dir, label, cmd,
                   nccltests.run_env(suite.nccl, mode=mode))


def slurm_launcher(head: Executor) -> str:
    """How the ranks of a multi-node run start in a Slurm allocation: `srun --mpi=pmix`
    where the cluster's srun has PMIx (Slurm starts and wires every rank), else mpirun
    from the first node. Asked of srun on that node (`srun --mpi=list`)."""
    res = head.run("srun --mpi=list 2>&1", timeout=60)
    return "srun --mpi=pmix" if res.ok and re.search(r"\bpmix\b", res.stdout) else "mpirun"


def _multi(pool: ExecutorPool, nodes: list[Node], run: Run, suite: Suite, inv: Inventory,
           builds: Mapping[str, BuildDoc], collective: str = "all_reduce",
           mode: str = "normal", launcher: str = "mpirun") -> list[tuple[int, Path, bool]]:
    head = pool(nodes[0])
    local = nodes[0].executor == "local"
    out_dir = run.provider_dir(nodes[0].provider, STEP)
    env = nccltests.run_env(suite.nccl, mode=mode, multi=True)

    def cmd(r: int) -> tuple[str, str | None]:
        contexts = []
        for n in nodes:
            b = builds[n.name]
            g = _gpus(n, inv, b)
            plan = nccltests.perf_argv(nccltests.collective_binary(str(b.binary), collective),
                                       suite.nccl, 1, set(b.flags), None)
            contexts.append((n, plan.argv, g))
        if launcher.startswith("srun"):
            step = nccltests.srun_mpi_command(contexts, env)
            if step is not None:
                return step, None
        return nccltests.mpirun_command(contexts, env, local=local), None

    return _rounds(head, run, suite, out_dir, nccltests.log_label("multi", collective, mode),
                   cmd, env)


def run_nccl(inv: Inventory, nodes: list[Node], run: Run, suite: Suite, *,
             single: bool = True, multi: bool = True, torch: bool = False,
             pool: ExecutorPool | None = None, accept_new_host_keys: bool = False,
             progress: ProgressHook | None = None) -> Driven:
    """Per node: build, then single-node rounds; per provider: the multi-node rounds.

    Each is a unit of the step driver: a resumed run keeps the units it finished
    and does the others again.
    """
    archive = nccltests.source_archive(suite.nccl, run.dir / ".staging")
    builds: dict[str, BuildDoc] = {}

    def node_work(pool: ExecutorPool, n: Node, stage: StageTracker) -> UnitResult:
        outcome = NcclOutcome()
        with stage("prepare"):
            b = _build_node(pool(n), run, suite, archive)
        builds[n.name] = b
        how = "cached" if b.cached else f"built in {b.build_s} s"
        outcome.findings.append(_f(
            run, n.name, n.provider, "NCCL_TESTS_BUILT", "PASS",
            f"nccl-tests {(b.built_commit or '?')[:12]} ({how}), CUDA {b.cuda_version}, NCCL "
            f"{b.nccl.version}, MPI {'yes' if b.mpi else 'no'}",
            [run.rel(run.node_dir(n.name, STEP) / "build.json")], build=b.model_dump(mode="json")))
        known = b.gpus if b.gpus is not None else inv.provider_of(n).expect.gpus_per_node
        if single and known == 1:
            outcome.findings.append(_f(
                run, n.name, n.provider, "NCCL_NOT_APPLICABLE", "INFO",
                "[single] one GPU: nothing to all-reduce with, the single-node rounds are "
                "skipped (a one-GPU all_reduce measures a copy inside the device); the GPU "
                "still takes part in the multi-node rounds",
                [run.rel(run.node_dir(n.name, STEP) / "build.json")], gpus=1, scope="single"))
        elif single:
            fabric = Around(run, STEP, "single")
            with stage("execute"):
                fabric.take(pool, [n], "before")
            for mode, coll in series_plan(suite):
                if _several(suite):
                    stage.note(_what(mode, coll))
                with stage("execute"):
                    try:
                        logs = _single(pool(n), run, suite, inv, b, coll, mode)
                    except GpuvetError as exc:
                        raise UnitFailed(exc.what, "NCCL_RUN_FAILED", [], node=n.name,
                                         hint=exc.hint) from exc
                with stage("judge"):
                    _judge(outcome, run, inv, suite,
                           Series("single", [n], logs, b, collective=coll, mode=mode))
            if torch:
                tcs = _torch_collectives(outcome, run, suite, n.provider, n.name)
                for mode in suite.nccl.modes:
                    for tc in tcs:
                        _torch_series(outcome, pool, [n], run, suite, inv, builds,
                                      run.node_dir(n.name, STEP), "single", tc, mode)
                        _compare_engines(outcome, run, [n], "single", tc, mode)
            with stage("execute"):
                fabric.take(pool, [n], "after")
            outcome.findings += fabric.findings([n])
        return UnitResult(outcome.findings, outcome.measurements,
                          {"build": b.model_dump(mode="json")})

    def multi_work(pool: ExecutorPool, members: list[Node], stage: StageTracker) -> UnitResult:
        outcome = NcclOutcome()
        prov = members[0].provider
        mpi = all(builds[n.name].mpi for n in members)
        out_dir = run.provider_dir(prov, STEP)
        fabric = Around(run, STEP, "multi")
        with stage("execute"):
            fabric.take(pool, members, "before")
        launcher = "mpirun"
        if members[0].slurm_job is not None:
            launcher = slurm_launcher(pool(members[0])) if mpi else "srun"
            how = (f"ranks started with {launcher} across the nodes of Slurm job "
                   f"{members[0].slurm_job}" if mpi else
                   f"each node's torch ranks a job step (srun) of Slurm job "
                   f"{members[0].slurm_job}")
            outcome.findings.append(_f(run, None, prov, "NCCL_LAUNCHER", "INFO",
                                       f"[multi] {how}", launcher=launcher))
        if mpi:
            for mode, coll in series_plan(suite):
                if _several(suite):
                    stage.note(_what(mode, coll))
                with stage("execute"):
                    try:
                        logs = _multi(pool, members, run, suite, inv, builds, coll, mode,
                                      launcher)
                    except GpuvetError as exc:
                        raise UnitFailed(exc.what, "NCCL_RUN_FAILED", [],
                                         hint=exc.hint) from exc
                with stage("judge"):
                    _judge(outcome, run, inv, suite,
                           Series("multi", members, logs, builds[members[0].name],
                                  collective=coll, mode=mode))
        else:
            outcome.findings.append(_f(
                run, None, prov, "NCCL_MULTI_NO_MPI", "WARN",
                "nccl-tests was built without MPI: multi-node measured with the "
                "torch.distributed benchmark instead"))
        if torch or not mpi:
            tcs = _torch_collectives(outcome, run, suite, prov, None)
            for mode in suite.nccl.modes:
                for tc in tcs:
                    _torch_series(outcome, pool, members, run, suite, inv, builds, out_dir,
                                  "multi", tc, mode)
                    if mpi:
                        _compare_engines(outcome, run, members, "multi", tc, mode)
        with stage("execute"):
            fabric.take(pool, members, "after")
        outcome.findings += fabric.findings(members)
        return UnitResult(outcome.findings, outcome.measurements)

    with step_pool(inv, pool, accept_new_host_keys) as p:
        units = [node_unit(n, functools.partial(node_work, p, n)) for n in nodes]
        done = {u.key for u in units if run.is_done(u.key, STEP)}
        for n in nodes:
            if node_unit_key(n.name) in done:
                builds[n.name] = BuildDoc.model_validate(
                    run.done_summary(node_unit_key(n.name), STEP).get("build") or {})
        provs = list(dict.fromkeys(n.provider for n in nodes))
        done |= {k for k in (provider_unit_key(p, "multi") for p in provs) if run.is_done(k, STEP)}
        run.retract(keep_units=done, step=STEP)
        driven = drive(run, STEP, units, concurrency=inv.settings.concurrency, progress=progress)
        if multi:
            groups = {p: [n for n in nodes if n.provider == p and n.name in builds] for p in provs}
            punits = [provider_unit(prov, "multi", functools.partial(multi_work, p, m))
                      for prov, m in groups.items() if len(m) >= 2]
            more = drive(run, STEP, punits, concurrency=inv.settings.concurrency,
                         progress=progress)
            driven.done.update(more.done)
            driven.failed.update(more.failed)
            driven.skipped += more.skipped
    return driven


def series_plan(suite: Suite) -> list[tuple[str, str]]:
    """(mode, collective) in the order they run: each mode runs every collective."""
    return [(m, c) for m in suite.nccl.modes for c in suite.nccl.collectives]


def _several(suite: Suite) -> bool:
    return len(series_plan(suite)) > 1


def _what(mode: str, collective: str) -> str:
    return collective if mode == "normal" else f"{mode} {collective}"


def _torch_collectives(outcome: NcclOutcome, run: Run, suite: Suite, provider: str,
                       node: str | None) -> list[str]:
    """The suite's collectives the torch engine has; the others said once (INFO)."""
    have: list[str] = [c for c in suite.nccl.collectives if c in nccltests.TORCH_COLLECTIVES]
    missing = [c for c in suite.nccl.collectives if c not in nccltests.TORCH_COLLECTIVES]
    if missing:
        outcome.findings.append(_f(
            run, node, provider, "TORCH_OP_SKIPPED", "INFO",
            f"[torch] {', '.join(missing)}: the torch benchmark has no such collective "
            f"(it runs {', '.join(nccltests.TORCH_COLLECTIVES)}); measured by nccl-tests only",
            collectives=missing))
    return have


def _torch_series(outcome: NcclOutcome, pool: ExecutorPool, nodes: list[Node], run: Run,
                  suite: Suite, inv: Inventory, builds: Mapping[str, BuildDoc],
                  out_dir: Path, scope: MeasureScope, collective: str = "all_reduce",
                  mode: str = "normal") -> None:
    where = nodes[0].name if scope == "single" else None
    label = nccltests.log_label(f"torch_{scope}", collective, mode)
    try:
        log = run_bench(pool, nodes, run, suite, inv, builds, label, out_dir, collective, mode)
    except GpuvetError as exc:
        cause = bench_failure_cause(exc.result.stderr if isinstance(exc, CommandFailed) else "")
        msg = exc.what if cause is None else (
            f"torch.distributed {collective} benchmark failed on {exc.node or where}: {cause}"
            + (f" (a collective waited longer than nccl.timeout_s, {suite.nccl.timeout_s:g} s: "
               "a peer or a link stopped answering)" if timed_out(cause) else ""))
        outcome.findings.append(_f(run, where, nodes[0].provider, "TORCH_BENCH_FAILED", "FAIL",
                                   msg, collective=collective))
        return
    skipped = torch_skipped(log)
    if skipped is not None:
        outcome.findings.append(_f(
            run, where, nodes[0].provider, "TORCH_OP_SKIPPED", "INFO",
            f"[torch {scope} {_what(mode, collective)}] skipped: {skipped}", [run.rel(log)],
            collectives=[collective]))
        return
    series = Series(scope, nodes, [(1, log, False)], builds.get(nodes[0].name) or BuildDoc(),
                    engine="torch", collective=collective, mode=mode)
    _judge(outcome, run, inv, suite, series)


AGREE_MIN_SIZE = 256 << 20
AGREE_TOLERANCE = 0.05


def _compare_engines(outcome: NcclOutcome, run: Run, nodes: list[Node],
                     scope: MeasureScope, collective: str = "all_reduce",
                     mode: str = "normal") -> None:
    """torch.distributed should land within 5% of nccl-tests at 256 MiB and above, for
    the same collective in the same mode."""
    names = [n.name for n in nodes]

    def medians(engine: str) -> dict[int, float]:
        by_size: dict[int, list[float]] = {}
        for m in outcome.measurements:
            if (m.metric == "busbw" and m.nodes == names and m.scope == scope
                    and m.engine == engine and not m.inplace and m.size is not None
                    and (m.tags.get("op") or "all_reduce") == collective
                    and (m.tags.get("mode") or "normal") == mode):
                by_size.setdefault(m.size, []).append(m.value)
        return {k: statistics.median(v) for k, v in by_size.items()}

    ref, other = medians("nccl-tests"), medians("torch")
    sizes = sorted(k for k in set(ref) & set(other) if k >= AGREE_MIN_SIZE and ref[k] > 0)
    where = names[0] if scope == "single" else None
    if not sizes:
        return
    devs = {k: (other[k] - ref[k]) / ref[k] for k in sizes}
    worst = max(devs.values(), key=abs)
    shown = ", ".join(f"{k >> 20} MiB {ref[k]:.1f} vs {other[k]:.1f} GB/s ({devs[k]:+.1%})"
                      for k in sizes)
    ok = abs(worst) <= AGREE_TOLERANCE
    outcome.findings.append(_f(
        run, where, nodes[0].provider, "TORCH_VS_NCCL_TESTS", "PASS" if ok else "WARN",
        f"[torch {scope}{'' if mode == 'normal' else ' ' + mode}"
        f"{'' if collective == 'all_reduce' else ' ' + collective}] "
        f"torch.distributed vs nccl-tests busbw: {shown}"
        + ("" if ok else f"; differs by more than {AGREE_TOLERANCE:.0%}"),
        deviations={str(k): v for k, v in devs.items()}, collective=collective,
        **_mode_detail(mode)))


def _mode_detail(mode: str) -> dict[str, Any]:
    return {} if mode == "normal" else {"mode": mode}


def _judge(outcome: NcclOutcome, run: Run, inv: Inventory, suite: Suite, s: Series) -> None:
    fs, ms = judge_series(s, run, inv, suite)
    outcome.findings += fs
    outcome.measurements += ms


def warm_builds(nodes: list[Node], run: Run, suite: Suite, pool: ExecutorPool, *,
                concurrency: int = 32) -> dict[str, str]:
    """Build nccl-tests on every node into its cache (the same build the step makes, keyed
    by commit, CUDA, NCCL, MPI and GPU arch), so the step's own build is then a cache hit.

    The pipeline runs this beside the health step: a build needs only the CPU, while
    health loads the GPUs. A node whose build fails here is built (and its failure
    judged) again by the step itself; what went wrong is returned per node for the
    log, never judged here. The build documents are kept as
    `nodes/<node>/nccl/prebuild/build.json`."""
    if not nodes:
        return {}
    archive = nccltests.source_archive(suite.nccl, run.dir / ".staging")

    def one(n: Node) -> None:
        out_dir = run.node_dir(n.name, STEP) / "prebuild"
        out_dir.mkdir(parents=True, exist_ok=True)
        nccltests.build(pool(n), suite.nccl, archive, run.dir / ".staging", out_dir)

    res = fanout(nodes, one, concurrency=concurrency)
    return {name: str(exc) for name, exc in res.failures.items()}
