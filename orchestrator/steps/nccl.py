"""The nccl step: build nccl-tests at the suite's commit, run all_reduce, judge it.

Per node: build (cached), then the suite's rounds on its own GPUs. Per
provider with two or more nodes: the same rounds across nodes with mpirun.
Optionally the torch.distributed benchmark as a second opinion. Raw logs are
streamed into the run directory; everything else is derived from them.
"""

from __future__ import annotations

import shlex
import socket
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator import nccltests
from orchestrator import payload as payload_mod
from orchestrator.errors import GpuvetError, StepError
from orchestrator.executors import ExecutorPool, fanout, options_for
from orchestrator.executors.base import Executor, ProgressHook
from orchestrator.inventory import Inventory, Node
from orchestrator.records import Finding, Measurement
from orchestrator.steps.nccl_judge import Series, judge_series
from orchestrator.store import Run
from orchestrator.suite import Suite

STEP = "nccl"


@dataclass
class NcclOutcome:
    findings: list[Finding] = field(default_factory=list)
    measurements: list[Measurement] = field(default_factory=list)


def _f(run: Run, node: str, provider: str, code: str, sev: str, msg: str,
       evidence: list[str] | None = None, **details: Any) -> Finding:
    return Finding(run_id=run.run_id, node=node, provider=provider, step=STEP, code=code,
                   severity=sev, message=msg, evidence=evidence or [], details=details)  # type: ignore[arg-type]


def _build_node(ex: Executor, run: Run, suite: Suite, archive: Path | None) -> dict[str, Any]:
    out_dir = run.node_dir(ex.node.name, STEP)
    doc = nccltests.build(ex, suite.nccl, archive, run.dir / ".staging", out_dir)
    if not doc.get("ok"):
        raise StepError(f"nccl-tests build failed: {doc.get('diagnosis') or 'unknown cause'}",
                        node=ex.node.name,
                        hint=f"see {run.rel(out_dir / 'build.log')}" if doc.get("log_local")
                        else None)
    return doc


def _gpus(node: Node, inv: Inventory, build: dict[str, Any]) -> int:
    return int(build.get("gpus") or inv.provider_of(node).expect.gpus_per_node or 1)


def _rounds(ex: Executor, run: Run, suite: Suite, out_dir: Path, label: str,
            command: Callable[[int], tuple[str, str | None]]) -> list[tuple[int, Path, bool]]:
    """Run the suite's rounds back to back; each log streams to its own file."""
    done = []
    for r in range(1, suite.nccl.rounds + 1):
        cmd, remote_json = command(r)
        log = out_dir / f"{label}_round{r}.log"
        res = ex.run(cmd, env=nccltests.run_env(suite.nccl), timeout=suite.nccl.timeout_s + 60,
                     stdout_path=log)
        if res.stderr:
            (out_dir / f"{label}_round{r}.stderr.log").write_text(res.stderr)
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
            build: dict[str, Any]) -> list[tuple[int, Path, bool]]:
    out_dir = run.node_dir(ex.node.name, STEP)
    gpus = _gpus(ex.node, inv, build)
    flags = set(build.get("flags") or [])

    def cmd(r: int) -> tuple[str, str | None]:
        remote_json = f"{nccltests.cache_dir(ex.node)}/runs/{run.run_id}/single_r{r}.json"
        plan = nccltests.perf_argv(build["binary"], suite.nccl, gpus, flags, remote_json)
        prefix = f"mkdir -p {shlex.quote(str(Path(remote_json).parent))} && " if plan.json_path \
            else ""
        return prefix + shlex.join(plan.argv), plan.json_path

    return _rounds(ex, run, suite, out_dir, "single", cmd)


def _multi(pool: ExecutorPool, nodes: list[Node], run: Run, suite: Suite, inv: Inventory,
           builds: dict[str, dict[str, Any]]) -> list[tuple[int, Path, bool]]:
    head = pool(nodes[0])
    local = nodes[0].executor == "local"
    out_dir = run.dir / "providers" / nodes[0].provider / STEP
    out_dir.mkdir(parents=True, exist_ok=True)

    def cmd(r: int) -> tuple[str, str | None]:
        contexts = []
        for n in nodes:
            b = builds[n.name]
            g = _gpus(n, inv, b)
            plan = nccltests.perf_argv(b["binary"], suite.nccl, 1, set(b.get("flags") or []),
                                       None)
            contexts.append((n, plan.argv, g))
        return nccltests.mpirun_command(contexts, nccltests.run_env(suite.nccl),
                                        local=local), None

    return _rounds(head, run, suite, out_dir, "multi", cmd)


def _torch(pool: ExecutorPool, nodes: list[Node], run: Run, suite: Suite, inv: Inventory,
           builds: dict[str, dict[str, Any]], label: str, out_dir: Path) -> Path:
    """torch.distributed benchmark across `nodes` (one node: single-node run)."""
    master = "127.0.0.1" if nodes[0].executor == "local" or len(nodes) == 1 else (
        nodes[0].host or nodes[0].name)
    port = _free_port() if nodes[0].executor == "local" else 29500 + (hash(run.run_id) % 1000)
    log = out_dir / f"{label}.log"

    def one(n: Node) -> Any:
        i = nodes.index(n)
        launcher = nccltests.torchrun_launcher(len(nodes), i, _gpus(n, inv, builds.get(n.name, {})),
                                               master, port)
        return payload_mod.run(pool(n), nccltests.torch_bench_args(suite.nccl),
                               staging=run.dir / ".staging", timeout=suite.nccl.timeout_s + 120,
                               launcher=launcher, env=nccltests.run_env(suite.nccl),
                               stdout_path=log if i == 0 else None)

    group = fanout(nodes, one, concurrency=len(nodes))
    if group.failures:
        raise next(iter(group.failures.values()))
    first = group.results[nodes[0].name]
    if not first.ok:
        (out_dir / f"{label}.stderr.log").write_text(first.stderr)
        first.raise_for_status("torch.distributed all_reduce benchmark")
    return log


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_nccl(inv: Inventory, nodes: list[Node], run: Run, suite: Suite, *,
             single: bool = True, multi: bool = True, torch: bool = False,
             accept_new_host_keys: bool = False,
             progress: ProgressHook | None = None) -> NcclOutcome:
    outcome = NcclOutcome()
    params = suite.nccl
    archive = nccltests.source_archive(params, run.dir / ".staging")
    with ExecutorPool(options_for(inv, accept_new_host_keys)) as pool:
        builds = fanout(nodes, lambda n: _build_node(pool(n), run, suite, archive),
                        concurrency=inv.settings.concurrency, progress=progress)
        for name, exc in builds.failures.items():
            n = inv.node(name)
            ev = [run.rel(p) for p in [run.node_dir(name, STEP) / "build.log"] if p.is_file()]
            outcome.findings.append(_f(run, name, n.provider, "NCCL_BUILD_FAILED", "FAIL",
                                       exc.what, ev))
        ok = [n for n in nodes if n.name in builds.results]
        for n in ok:
            b = builds.results[n.name]
            how = "cached" if b.get("cached") else f"built in {b.get('build_s')} s"
            outcome.findings.append(_f(
                run, n.name, n.provider, "NCCL_TESTS_BUILT", "PASS",
                f"nccl-tests {b['built_commit'][:12]} ({how}), CUDA {b.get('cuda_version')}, NCCL "
                f"{(b.get('nccl') or {}).get('version')}, MPI {'yes' if b.get('mpi') else 'no'}",
                [run.rel(run.node_dir(n.name, STEP) / "build.json")], build=b))
        if single:
            res = fanout(ok, lambda n: _single(pool(n), run, suite, inv, builds.results[n.name]),
                         concurrency=inv.settings.concurrency, progress=progress)
            for n in ok:
                if n.name in res.failures:
                    outcome.findings.append(_f(run, n.name, n.provider, "NCCL_RUN_FAILED", "FAIL",
                                               res.failures[n.name].what))
                    continue
                b = builds.results[n.name]
                _judge(outcome, run, inv, suite, Series("single", [n], res.results[n.name], b))
                if torch:
                    _torch_series(outcome, pool, [n], run, suite, inv, builds.results,
                                  run.node_dir(n.name, STEP), "torch_single")
                    _compare_engines(outcome, run, [n], "single", "torch_single")
        if multi:
            for prov in dict.fromkeys(n.provider for n in ok):
                members = [n for n in ok if n.provider == prov]
                if len(members) < 2:
                    continue
                mpi = all(builds.results[n.name].get("mpi") for n in members)
                out_dir = run.dir / "providers" / prov / STEP
                if mpi:
                    try:
                        logs = _multi(pool, members, run, suite, inv, builds.results)
                        _judge(outcome, run, inv, suite,
                               Series("multi", members, logs, builds.results[members[0].name]))
                    except GpuvetError as exc:
                        outcome.findings.append(_f(run, f"provider:{prov}", prov,
                                                   "NCCL_RUN_FAILED", "FAIL", exc.what))
                else:
                    outcome.findings.append(_f(
                        run, f"provider:{prov}", prov, "NCCL_MULTI_NO_MPI", "WARN",
                        "nccl-tests was built without MPI: multi-node measured with the "
                        "torch.distributed benchmark instead"))
                if torch or not mpi:
                    out_dir.mkdir(parents=True, exist_ok=True)
                    _torch_series(outcome, pool, members, run, suite, inv, builds.results,
                                  out_dir, "torch_multi")
                    if mpi:
                        _compare_engines(outcome, run, members, "multi", "torch_multi")
    run.add_findings(outcome.findings)
    run.add_measurements(outcome.measurements)
    return outcome


def _torch_series(outcome: NcclOutcome, pool: ExecutorPool, nodes: list[Node], run: Run,
                  suite: Suite, inv: Inventory, builds: dict[str, dict[str, Any]],
                  out_dir: Path, label: str) -> None:
    where = nodes[0].name if len(nodes) == 1 else f"provider:{nodes[0].provider}"
    try:
        log = _torch(pool, nodes, run, suite, inv, builds, label, out_dir)
    except GpuvetError as exc:
        outcome.findings.append(_f(run, where, nodes[0].provider, "TORCH_BENCH_FAILED", "FAIL",
                                   exc.what))
        return
    series = Series(label, nodes, [(1, log, False)], builds.get(nodes[0].name, {}),
                    engine="torch")
    _judge(outcome, run, inv, suite, series)


AGREE_MIN_SIZE = 256 << 20
AGREE_TOLERANCE = 0.05


def _compare_engines(outcome: NcclOutcome, run: Run, nodes: list[Node], ref_scope: str,
                     other_scope: str) -> None:
    """torch.distributed should land within 5% of nccl-tests at 256 MiB and above."""
    names = [n.name for n in nodes]

    def medians(scope: str) -> dict[int, float]:
        by_size: dict[int, list[float]] = {}
        for m in outcome.measurements:
            if (m.metric == "busbw" and m.nodes == names and m.tags.get("scope") == scope
                    and not m.tags.get("inplace")):
                by_size.setdefault(int(m.tags["size"]), []).append(m.value)
        return {k: statistics.median(v) for k, v in by_size.items()}

    ref, other = medians(ref_scope), medians(other_scope)
    sizes = sorted(k for k in set(ref) & set(other) if k >= AGREE_MIN_SIZE and ref[k] > 0)
    where = names[0] if len(names) == 1 else f"provider:{nodes[0].provider}"
    if not sizes:
        return
    devs = {k: (other[k] - ref[k]) / ref[k] for k in sizes}
    worst = max(devs.values(), key=abs)
    shown = ", ".join(f"{k >> 20} MiB {ref[k]:.1f} vs {other[k]:.1f} GB/s ({devs[k]:+.1%})"
                      for k in sizes)
    ok = abs(worst) <= AGREE_TOLERANCE
    outcome.findings.append(_f(
        run, where, nodes[0].provider, "TORCH_VS_NCCL_TESTS", "PASS" if ok else "WARN",
        f"[{other_scope}] torch.distributed vs nccl-tests busbw: {shown}"
        + ("" if ok else f"; differs by more than {AGREE_TOLERANCE:.0%}"),
        deviations={str(k): v for k, v in devs.items()}))


def _judge(outcome: NcclOutcome, run: Run, inv: Inventory, suite: Suite, s: Series) -> None:
    fs, ms = judge_series(s, run, inv, suite)
    outcome.findings += fs
    outcome.measurements += ms
