"""Wall time of `gpuvet preflight` against the real test cluster.

    python -m tests.bench.preflight_bench [--out docs/benchmarks.md] [--sizes 1,8,32]
                                          [--repeats 3]

For each size a fresh cluster of sshd nodes (tests/integration/cluster.py) is
started, and the real CLI runs against it as a subprocess: one cold run (the
payload is pushed, checked and unpacked on every node) and then ``--repeats``
warm runs (the payload is already there: one round trip per node). The test
nodes have no NVIDIA driver, so every run must exit 1 with a
NVIDIA_DRIVER_MISSING finding on every node and no NODE_UNREACHABLE; anything
else fails the benchmark.

The nodes run the distribution's python3 (no torch): all nodes share the
controller's CPU cores here, and importing torch would cost seconds of that
shared CPU per node, which a real node pays on its own CPUs.

Needs what the integration tests need (root, `ip netns`, sshd). Exits 1 when
a target is missed, 2 when the benchmark itself cannot run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "integration"))

from cluster import Cluster, missing_prerequisites  # noqa: E402

GPUVET = str(Path(sys.executable).with_name("gpuvet"))
START = "<!-- bench:preflight:start -->"
END = "<!-- bench:preflight:end -->"
TARGETS = {8: 5.0, 32: 10.0}  # nodes -> seconds of wall time (the speed target)
INTRO = ("# Benchmarks\n\n"
         "Measured on the real test cluster (tests/integration/cluster.py: one network\n"
         "namespace with its own sshd per node). Each section is rewritten by the command\n"
         "it names; the rest of this file is left alone.\n")


class BenchError(RuntimeError):
    """The benchmark could not measure what it claims to measure."""


@dataclass
class SizeResult:
    size: int
    cold_s: float
    warm_s: list[float] = field(default_factory=list)
    cluster_start_s: float = 0.0

    @property
    def target(self) -> float | None:
        return TARGETS.get(self.size)

    @property
    def met(self) -> bool | None:
        if self.target is None:
            return None
        return statistics.median(self.warm_s) < self.target and self.cold_s < self.target


def _results_dir(stdout: str, root: Path, before: set[str]) -> Path:
    m = re.search(r"results: (\S+)", stdout)
    if m and Path(m.group(1)).is_dir():
        return Path(m.group(1))
    new = sorted(p for p in root.iterdir() if p.is_dir() and p.name not in before)
    if len(new) != 1:
        raise BenchError(f"cannot tell which run directory under {root} this run wrote")
    return new[0]


def _check_findings(run_dir: Path, nodes: list[str]) -> None:
    path = run_dir / "findings.jsonl"
    if not path.is_file():
        raise BenchError(f"{path} is missing")
    by_node: dict[str, set[str]] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            f = json.loads(line)
            by_node.setdefault(f["node"], set()).add(f["code"])
    problems = []
    for n in nodes:
        codes = by_node.get(n, set())
        if "NODE_UNREACHABLE" in codes or "PREFLIGHT_FAILED" in codes:
            problems.append(f"{n}: {sorted(codes)}")
        elif "NVIDIA_DRIVER_MISSING" not in codes:
            problems.append(f"{n}: no NVIDIA_DRIVER_MISSING finding (codes: {sorted(codes)})")
    if problems:
        raise BenchError("unexpected findings: " + "; ".join(problems))


def _one_run(inv: Path, root: Path, nodes: list[str]) -> float:
    before = {p.name for p in root.iterdir()} if root.is_dir() else set()
    argv = [GPUVET, "preflight", "-i", str(inv), "--results", str(root)]
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "COLUMNS": "200"})
    wall = time.perf_counter() - t0
    if proc.returncode != 1:
        raise BenchError(f"{shlex.join(argv)} exited with {proc.returncode}, expected 1 "
                         f"(no NVIDIA driver on the test nodes):\n{proc.stdout[-3000:]}\n"
                         f"{proc.stderr[-3000:]}")
    _check_findings(_results_dir(proc.stdout, root, before), nodes)
    return wall


def bench_size(size: int, repeats: int, tmp: Path) -> SizeResult:
    t0 = time.perf_counter()
    cluster = Cluster.start(size)
    started = time.perf_counter() - t0
    try:
        if cluster.system_python is None:
            raise BenchError("the nodes have no /usr/bin/python3")
        inv = tmp / f"inv-{size}.yaml"
        # the nodes' python is the system one, without torch: see the module docstring
        access = {"user": cluster.user, "identity_file": str(cluster.client_key),
                  "python": cluster.system_python}
        cluster.write_inventory(inv, extra_provider_fields={"access": access})
        root = tmp / f"results-{size}"
        names = [n.name for n in cluster.nodes]
        res = SizeResult(size=size, cold_s=_one_run(inv, root, names), cluster_start_s=started)
        for _ in range(repeats):
            res.warm_s.append(_one_run(inv, root, names))
        return res
    finally:
        cluster.stop()


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _node_python_version() -> str:
    try:
        out = subprocess.run(["/usr/bin/python3", "-c", "import platform; "
                              "print(platform.python_version())"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() or "unknown"


def _fmt_met(r: SizeResult) -> str:
    return "—" if r.met is None else ("yes" if r.met else "**no**")


def table(results: list[SizeResult]) -> str:
    rows = ["| nodes | cold s | warm median s | warm min–max s | target | met? |",
            "|---:|---:|---:|---:|---:|:---:|"]
    for r in results:
        target = f"< {r.target:g} s" if r.target is not None else "—"
        rows.append(f"| {r.size} | {r.cold_s:.2f} | {statistics.median(r.warm_s):.2f} | "
                    f"{min(r.warm_s):.2f}–{max(r.warm_s):.2f} | {target} | {_fmt_met(r)} |")
    return "\n".join(rows)


def section(results: list[SizeResult], command: str) -> str:
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return "\n".join([
        START,
        "## Preflight wall time",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {os.cpu_count()} CPU cores ({_cpu_model()}), {platform.system()} "
        f"{platform.release()}; controller Python {platform.python_version()}, node Python "
        f"{_node_python_version()} (/usr/bin/python3); measured {now}.",
        "",
        "Each size gets a fresh cluster of sshd nodes; `gpuvet preflight -i INV --results "
        "DIR` runs as a subprocess, so the times include interpreter start-up, inventory "
        "loading, SSH connects, the payload run on every node, judging and writing the "
        "results. *Cold* is the first run (the payload is pushed, checked by sha256 and "
        "unpacked on each node); *warm* runs find the payload in place and need one round "
        "trip per node. Every run exits 1 with NVIDIA_DRIVER_MISSING on every node (the "
        "test nodes have no GPU) and no NODE_UNREACHABLE or PREFLIGHT_FAILED; otherwise the "
        "benchmark fails.",
        "",
        "All nodes share this machine's cores with the controller, so on the CPU side the "
        "figures are an upper bound for real nodes, which run the payload on their own CPUs. "
        "For the same reason the nodes use the system python3 without torch: importing torch "
        "costs seconds of CPU per node, which real nodes pay on their own CPUs in parallel but "
        "which would be serialised here. The network is a local bridge with near-zero "
        "latency: over a real network add a few round trips per node (SSH handshake and one "
        "payload run when warm; the push and its checks when cold).",
        "",
        table(results),
        "",
        "Target (the issue's speed goal): a met target means both the cold run and the "
        "warm median are under it.",
        END,
    ])


def write_section(path: Path, text: str) -> None:
    doc = path.read_text(encoding="utf-8") if path.is_file() else INTRO
    if START in doc and END in doc:
        head, rest = doc.split(START, 1)
        _, tail = rest.split(END, 1)
        doc = head + text + tail
    else:
        doc = doc.rstrip("\n") + "\n\n" + text + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(doc, encoding="utf-8")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.bench.preflight_bench",
                                 description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--out", type=Path, help="rewrite the preflight section of this file")
    ap.add_argument("--sizes", default="1,8,32", help="comma-separated node counts")
    ap.add_argument("--repeats", type=int, default=3, help="warm runs per size")
    args = ap.parse_args(argv)
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        ap.error(f"--sizes must be comma-separated integers, got {args.sizes!r}")
    if not sizes or min(sizes) < 1 or args.repeats < 1:
        ap.error("need at least one size >= 1 and --repeats >= 1")
    problems = missing_prerequisites()
    if problems:
        print("cannot run the benchmark: " + "; ".join(problems), file=sys.stderr)
        return 2

    shown = ["python", "-m", "tests.bench.preflight_bench"]
    if args.out:
        shown += ["--out", str(args.out)]
    shown += ["--sizes", ",".join(map(str, sizes)), "--repeats", str(args.repeats)]
    command = shlex.join(shown)

    results: list[SizeResult] = []
    with tempfile.TemporaryDirectory(prefix="gpuvet-bench-") as tmp:
        for size in sizes:
            print(f"preflight on {size} node(s) ...", file=sys.stderr, flush=True)
            try:
                r = bench_size(size, args.repeats, Path(tmp))
            except BenchError as exc:
                print(f"benchmark failed at {size} node(s): {exc}", file=sys.stderr)
                return 2
            print(f"  cluster up in {r.cluster_start_s:.1f} s; cold {r.cold_s:.2f} s, warm "
                  + ", ".join(f"{w:.2f}" for w in r.warm_s) + " s", file=sys.stderr)
            results.append(r)

    print(table(results))
    if args.out:
        write_section(args.out, section(results, command))
        print(f"wrote {args.out}", file=sys.stderr)
    missed = [r for r in results if r.met is False]
    for r in missed:
        print(f"target missed: {r.size} nodes must finish in < {r.target:g} s", file=sys.stderr)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
