"""Where a training unit's checkpoints live: each node's checkpoint directory probed
twice (payload `train-probe`: a token left, then the tokens each node sees, which tells
which nodes share storage and where the directory is), the share groups that follow, each
unit's folder under it, and its removal once the unit is judged. The step (`step.py`)
plans its units from these."""

from __future__ import annotations

import json
import re
import secrets
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator import payload as payload_mod
from orchestrator.errors import GpuvetError, StepError
from orchestrator.executors import ExecutorPool, fanout
from orchestrator.inventory import Inventory, Node
from orchestrator.store import Run
from orchestrator.suite import TrainParams

STEP = "train"


@dataclass
class Probe:
    node: Node
    doc: dict[str, Any]
    file: Path
    sees: set[str] = field(default_factory=set)  # nodes whose token this node saw

    @property
    def gpus(self) -> int:
        return int(self.doc.get("gpus") or 0)


def ckpt_base(node: Node) -> str:
    return node.ckpt_dir or f"{node.work_dir.rstrip('/')}/ckpt"


def _token(run: Run, node: Node) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", f"gpuvet-{run.run_id}-{node.name}")[:128]


def probe_nodes(pool: ExecutorPool, inv: Inventory, nodes: list[Node], run: Run, *,
                need_torch: bool = True) -> tuple[dict[str, Probe], dict[str, GpuvetError]]:
    """Leave a token; list what each node sees; take the tokens back."""

    def call(n: Node, extra: list[str], name: str) -> dict[str, Any]:
        out = run.node_dir(n.name, STEP) / name
        res = payload_mod.run(pool(n), ["train-probe", "--ckpt-dir", ckpt_base(n), *extra],
                              staging=run.dir / ".staging", timeout=120, stdout_path=out)
        res.raise_for_status("payload train-probe")
        try:
            doc = json.loads(res.stdout)
        except json.JSONDecodeError as exc:
            raise StepError(f"train-probe printed invalid JSON ({exc})", node=n.name) from None
        if name == "probe.json" and need_torch and not doc.get("torch"):
            raise StepError(f"torch is not importable with {n.python} on this node",
                            node=n.name, hint="install PyTorch for that python, or point the "
                            "inventory's `python` at one that has it")
        if doc.get("error"):
            raise StepError(f"checkpoint directory {ckpt_base(n)} is unusable: {doc['error']}",
                            node=n.name, hint="create it, or set ckpt_dir in the inventory to "
                            "a writable directory")
        return dict(doc)

    first = fanout(nodes, lambda n: call(n, ["--token", _token(run, n)], "probe-write.json"),
                   concurrency=inv.settings.concurrency)
    ok = [n for n in nodes if n.name in first.results]
    second = fanout(ok, lambda n: call(n, [], "probe.json"), concurrency=inv.settings.concurrency)
    fanout(ok, lambda n: call(n, ["--remove", _token(run, n)], "probe-cleanup.json"),
           concurrency=inv.settings.concurrency)
    probes: dict[str, Probe] = {}
    for n in ok:
        if n.name not in second.results:
            continue
        doc = second.results[n.name]
        seen = set(doc.get("tokens") or [])
        sees = {m.name for m in ok if _token(run, m) in seen and m.name != n.name}
        probes[n.name] = Probe(n, doc, run.node_dir(n.name, STEP) / "probe.json", sees)
    return probes, {**first.failures, **second.failures}


def share_groups(probes: list[Probe]) -> list[list[Probe]]:
    """Nodes that see each other's tokens and have as many GPUs: one restore rotation each."""
    groups: list[list[Probe]] = []
    for p in probes:
        for g in groups:
            if all(p.node.name in q.sees and q.node.name in p.sees and q.gpus == p.gpus
                   for q in g):
                g.append(p)
                break
        else:
            groups.append([p])
    return groups


def ckpt_root(node: Node, run: Run, unit: str) -> str:
    return f"{ckpt_base(node).rstrip('/')}/gpuvet-train/{run.run_id}/{unit}"


def removal_command(node: Node, root: str, run: Run) -> str:
    """Remove one unit's checkpoints: renamed aside at once (nothing of them stays at its
    path), then deleted in the background on the node. Deleting the two 12.6 GB
    checkpoints of a 1b unit took 7 s of an H100 pipeline's training step on an ext4
    disk with online discard. A removal that could not finish (the node restarted, or a
    Slurm job step, whose processes end with it: there the deletion runs in the step) is
    swept by the next one under the same checkpoint directory."""
    unit_dir = root.rstrip("/")
    run_dir = unit_dir.rsplit("/", 1)[0]
    base = run_dir.rsplit("/", 1)[0]  # <ckpt_dir>/gpuvet-train
    aside = f"{base}/.removing-{run.run_id}-{unit_dir.rsplit('/', 1)[1]}-{secrets.token_hex(3)}"
    q = shlex.quote
    delete = f"rm -rf {q(base)}/.removing-*"
    if node.executor != "slurm":
        delete = f"nohup {delete} >/dev/null 2>&1 </dev/null &"
    return (f"if [ -e {q(unit_dir)} ]; then mv -f {q(unit_dir)} {q(aside)}; fi; "
            f"rmdir {q(run_dir)} 2>/dev/null; {delete}")


def _cleanup(pool: ExecutorPool, run: Run, params: TrainParams, where: list[tuple[Node, str]]
             ) -> None:
    if params.keep_checkpoints:
        return
    for node, root in where:
        try:
            pool(node).run(removal_command(node, root, run), timeout=300)
        except GpuvetError:
            pass  # a node that went away keeps its files; the verdict stands
