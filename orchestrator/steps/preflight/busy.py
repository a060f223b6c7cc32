"""A GPU someone else is using: processes and memory on the rented GPUs before gpuvet ran.

A rented GPU should be free when it is handed over. Preflight reads the processes on
every GPU (`nvidia-smi --query-compute-apps`, the CSV collected beside the default table,
whose process rows are read too) and the memory each GPU has in use (`--query-gpu`):
a process of another tenant, or memory held by one the container cannot see, is the
provider's problem (GPU_BUSY) and every figure measured on that GPU is not the card's.

Thresholds (docs/health.md, "A busy GPU"): FAIL when a GPU has more than
`BUSY_FAIL_MIB` in use by processes or, with no process visible, in memory used; WARN
for a process holding less (a monitoring agent's context); nothing below
`IDLE_USED_MIB` of memory used with no process (the driver's own reserve). The rule is
the payload's (`payload.nodecheck.busy_severity`), which the node check runs on the node
itself, so preflight, health and `gpuvet nodecheck` judge a busy GPU alike.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.inventory import Expectations
from orchestrator.parsers.nvidia_smi import QueryGpuFacts
from orchestrator.parsers.nvidia_smi_health import ComputeAppsFacts
from orchestrator.parsers.nvidia_smi_table import NvidiaSmiTableFacts
from orchestrator.steps.preflight.facts import NodeFacts, Result
from orchestrator.suite import PreflightParams
from payload.nodecheck import BUSY_FAIL_MIB, IDLE_USED_MIB, busy_severity  # noqa: F401


@dataclass(frozen=True)
class Proc:
    gpu: str  # "GPU 0" or the UUID/bus id where no index is known
    pid: int
    name: str
    mib: int | None  # None: not shown (a truncated table cell, [N/A])


def _index(nf: NodeFacts) -> dict[str, int]:
    """UUID and bus id -> GPU index, from --query-gpu."""
    q = nf.get("query_gpu")
    out: dict[str, int] = {}
    if isinstance(q, QueryGpuFacts):
        for g in q.gpus:
            if g.index is None:
                continue
            for key in (g.uuid, g.pci_bus_id):
                if key:
                    out[key] = g.index
    return out


def processes(nf: NodeFacts) -> tuple[list[Proc], list[str]]:
    """The processes on the GPUs and the outputs they were read from: the compute-apps CSV
    first (its memory is never truncated), else the default table's process rows."""
    idx = _index(nf)
    apps = nf.get("compute_apps")
    if isinstance(apps, ComputeAppsFacts):
        out = []
        for a in apps.apps:
            key = a.gpu_uuid or a.gpu_bus_id or "?"
            gpu = f"GPU {idx[key]}" if key in idx else key
            out.append(Proc(gpu, a.pid, a.process_name or "?", a.used_mib))
        return out, nf.ev("compute_apps")
    table = nf.get("nvidia_smi")
    if isinstance(table, NvidiaSmiTableFacts) and table.processes is not None:
        return [Proc(f"GPU {p.gpu}", p.pid, p.name, p.memory_mib) for p in table.processes], \
            nf.ev("nvidia_smi")
    return [], []


def _used(nf: NodeFacts) -> dict[str, int]:
    """Memory in use per GPU ("GPU i" -> MiB), from --query-gpu or the table."""
    q = nf.get("query_gpu")
    if isinstance(q, QueryGpuFacts):
        return {f"GPU {g.index}": g.memory_used_mib for g in q.gpus
                if g.index is not None and g.memory_used_mib is not None}
    table = nf.get("nvidia_smi")
    if isinstance(table, NvidiaSmiTableFacts):
        return {f"GPU {g.index}": g.memory_used_mib for g in table.gpus
                if g.memory_used_mib is not None}
    return {}


SAVED = "gpuvet import poc"  # the collect document's source for outputs saved by hand


def check_busy(nf: NodeFacts, ex: Expectations, p: PreflightParams) -> list[Result]:
    """GPU_BUSY per GPU in use before gpuvet ran. In outputs saved by hand (`import poc`)
    the processes may be the tester's own load, so there it is a WARN that says so."""
    return _busy(nf, saved=nf.doc.get("source") == SAVED)


def _busy(nf: NodeFacts, *, saved: bool) -> list[Result]:
    procs, ev = processes(nf)
    when = "when these outputs were saved" if saved else "before gpuvet ran"
    used = _used(nf)
    used_ev = nf.ev("query_gpu") or nf.ev("nvidia_smi")
    out: list[Result] = []
    gpus = sorted({pr.gpu for pr in procs} | {g for g, mib in used.items()
                                              if mib > IDLE_USED_MIB},
                  key=lambda g: (len(g), g))
    for gpu in gpus:
        mine = [pr for pr in procs if pr.gpu == gpu]
        held = sum(pr.mib or 0 for pr in mine)
        in_use = used.get(gpu)
        shown = "; ".join(f"pid {pr.pid} {pr.name} "
                          f"({f'{pr.mib} MiB' if pr.mib is not None else 'memory not shown'})"
                          for pr in mine)
        of = f" ({in_use} MiB in use)" if in_use is not None else ""
        details = {"gpu": gpu, "processes": [{"pid": pr.pid, "name": pr.name,
                                              "used_mib": pr.mib} for pr in mine],
                   "held_mib": held, "memory_used_mib": in_use}
        severity = busy_severity(held, in_use, len(mine), any(pr.mib is None for pr in mine))
        if mine:
            big = severity == "FAIL"
            why = ("the tester's own load or another job's: figures saved then are not the "
                   "card's alone" if saved else
                   "another job holds this GPU; every figure measured on it is not the "
                   "card's. Ask the provider for a free GPU, or stop the process if it is "
                   "yours" if big else "a small process (a monitoring agent?) holds memory "
                   "on it")
            out.append(Result("GPU_BUSY", "FAIL" if big and not saved else "WARN",
                              f"{gpu} is in use {when}: {shown}{of}: {why}", ev + used_ev,
                              details))
        elif severity == "FAIL":
            out.append(Result(
                "GPU_BUSY", "WARN" if saved else "FAIL", f"{gpu} has {in_use} MiB in use "
                f"{when} and no process this node can see holds it (another container's "
                "job?): every figure measured on it is not the card's"
                + ("" if saved else ". Ask the provider for a free GPU"), used_ev, details))
    return out
