"""The torch.distributed benchmark (payload `allreduce-bench`) across a set of nodes: how
its ranks start (`nccltests.rank_launch`), its bound, and what its output and its failure
say. The nccl step (`step.py`) and the pipeline's torch fallback run it and judge its
logs like nccl-tests'."""

from __future__ import annotations

import re
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator import nccltests
from orchestrator import payload as payload_mod
from orchestrator.executors import ExecutorPool, fanout
from orchestrator.files import scrub_in_place
from orchestrator.inventory import Inventory, Node
from orchestrator.nccltests import BuildDoc
from orchestrator.store import Run
from orchestrator.suite import Suite
from payload.allreduce import SKIPPED
from payload.scrub import scrub_text


def gpus(node: Node, inv: Inventory, build: BuildDoc) -> int:
    return int(build.gpus or inv.provider_of(node).expect.gpus_per_node or 1)


# the torch benchmark's start-up beyond the suite's timeout_s: its process group ends a
# collective waiting on a dead peer at timeout_s; one stuck in a send ends here
TORCH_MARGIN_S = 60.0


def run_bench(pool: ExecutorPool, nodes: list[Node], run: Run, suite: Suite, inv: Inventory,
           builds: Mapping[str, BuildDoc], label: str, out_dir: Path,
           collective: str = "all_reduce", mode: str = "normal") -> Path:
    """torch.distributed benchmark across `nodes` (one node: single-node run)."""
    master = "127.0.0.1" if nodes[0].executor == "local" or len(nodes) == 1 else (
        nodes[0].host or nodes[0].name)
    port = _free_port() if nodes[0].executor == "local" else 29500 + (hash(run.run_id) % 1000)
    log = out_dir / f"{label}.log"

    procs = {n.name: gpus(n, inv, builds.get(n.name) or BuildDoc()) for n in nodes}

    def one(n: Node) -> Any:
        i = nodes.index(n)
        launcher, rendezvous = nccltests.rank_launch(
            len(nodes), i, procs[n.name], master, port,
            one_each=all(v == 1 for v in procs.values()))
        env = {**nccltests.run_env(suite.nccl, mode=mode, multi=len(nodes) > 1), **rendezvous}
        return payload_mod.run(pool(n), nccltests.torch_bench_args(suite.nccl, collective),
                               staging=run.dir / ".staging",
                               timeout=suite.nccl.timeout_s + TORCH_MARGIN_S,
                               launcher=launcher, env=env, stdout_path=log if i == 0 else None)

    group = fanout(nodes, one, concurrency=len(nodes))
    if group.failures:
        raise next(iter(group.failures.values()))
    first = group.results[nodes[0].name]
    scrub_in_place(log)
    if not first.ok:
        (out_dir / f"{label}.stderr.log").write_text(scrub_text(first.stderr))
        first.raise_for_status(f"torch.distributed {collective} benchmark")
    return log


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# the exception a rank died of, in torchrun's output (its own ChildFailedError says nothing)
_EXC_RE = re.compile(r"^\s*(?:[A-Za-z_][\w.]*\.)?(\w*(?:Error|Exception)): (\S.*)$")


def bench_failure_cause(stderr: str) -> str | None:
    """`Type: message` of the last exception a rank raised, or None."""
    found = None
    for line in stderr.splitlines():
        m = _EXC_RE.match(line)
        if m and m.group(1) != "ChildFailedError":
            found = f"{m.group(1)}: {m.group(2).strip()}"[:300]
    return found


def timed_out(cause: str) -> bool:
    return bool(re.search(r"time(d)? ?out", cause, re.IGNORECASE))


def torch_skipped(log: Path) -> str | None:
    """The reason the torch benchmark gave for not running its collective (a backend
    without it: gloo's reduce_scatter in some torch versions), else None."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(SKIPPED):
            return line[len(SKIPPED):].strip()
    return None
