"""Benchmark: `gpuvet runs`, `gpuvet compare` and `gpuvet report` over a synthetic
store of 1,000 runs (tests/bench/synthetic_store.py).

Each command runs in a fresh interpreter, as a user runs it: the wall time covers
imports, and the peak resident memory is the child's own (getrusage in that
process). Targets: compare and report under 10 s and 1 GB each, runs under 1 s.

    python -m tests.bench.compare_bench [--runs 1000] [--repeat 3] [--out docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGETS = {"runs": (1.0, 1024), "compare": (10.0, 1024), "report": (10.0, 1024)}
BEGIN, END = "<!-- compare-bench:begin -->", "<!-- compare-bench:end -->"

CHILD = """
import json, resource, sys, time
t = time.perf_counter()
from orchestrator.cli import run
rc = run(sys.argv[1:])
print(json.dumps({"rc": rc, "s": time.perf_counter() - t,
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}),
      file=sys.stderr)
"""


def measure(args: list[str]) -> dict[str, float]:
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True,
                       check=False)
    wall = time.perf_counter() - t
    doc = json.loads(p.stderr.strip().splitlines()[-1])
    if doc["rc"] not in (0, 1):
        raise SystemExit(f"gpuvet {' '.join(args)} exited {doc['rc']}:\n{p.stderr[-2000:]}")
    return {"wall_s": wall, "rss_mb": doc["rss_mb"]}


def machine() -> str:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} CPU(s) ({cpu}), Python {platform.python_version()}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    from tests.bench.synthetic_store import make_store

    with tempfile.TemporaryDirectory(prefix="gpuvet-compare-bench.") as tmp:
        root = Path(tmp) / "results"
        t = time.perf_counter()
        make_store(root, a.runs)
        made = time.perf_counter() - t
        cmds = {"runs": ["runs", "--results", str(root)],
                "compare": ["compare", "--results", str(root), "-p", "alpha", "-p", "beta"],
                "report": ["report", "--results", str(root), "-p", "alpha", "-p", "beta",
                           "-o", str(Path(tmp) / "report.html")]}
        results = {}
        for name, args in cmds.items():
            samples = [measure(args) for _ in range(a.repeat)]
            results[name] = {"wall_s": statistics.median(s["wall_s"] for s in samples),
                             "max_wall_s": max(s["wall_s"] for s in samples),
                             "rss_mb": max(s["rss_mb"] for s in samples)}
    rows = ["| command | median wall s | slowest s | peak RSS MB | target | met |",
            "| --- | --- | --- | --- | --- | --- |"]
    for name, r in results.items():
        lim_s, lim_mb = TARGETS[name]
        ok = r["wall_s"] < lim_s and r["rss_mb"] < lim_mb
        rows.append(f"| `gpuvet {name}` | {r['wall_s']:.2f} | {r['max_wall_s']:.2f} | "
                    f"{r['rss_mb']:.0f} | < {lim_s:g} s, < {lim_mb} MB | "
                    f"{'yes' if ok else 'NO'} |")
    section = "\n".join([
        BEGIN, "## compare, report and runs over 1,000 runs", "",
        f"`python -m tests.bench.compare_bench --runs {a.runs} --repeat {a.repeat}` on "
        f"{machine()}, {time.strftime('%Y-%m-%d', time.gmtime())}. A synthetic store of "
        f"{a.runs} runs of two providers (preflight facts, nccl-tests busbw for 14 sizes x 3 "
        f"rounds single- and multi-node, training results; made in {made:.0f} s). Each "
        "command in a fresh interpreter (imports included); peak RSS is the process's own.",
        "", *rows, END])
    print(section)
    if a.out:
        text = a.out.read_text() if a.out.is_file() else "# Benchmarks\n"
        if BEGIN in text:
            text = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: section, text,
                          flags=re.S)
        else:
            text = text.rstrip("\n") + "\n\n" + section + "\n"
        a.out.write_text(text)


if __name__ == "__main__":
    main()
