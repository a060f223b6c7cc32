"""The verdict written back to Slurm: `--drain-on-fail` drains each node with a FAIL on
the provider's side, and `gpuvet slurm resume RUN_ID` undoes exactly those drains.

Only nodes of `executor: slurm` providers (their names are Slurm's, from the allocation)
and only a FAIL the outcome rule puts on the provider's side (`provider_side_fail`: never
a setup code, such as an allocation that reached its time limit) drain a node. A FAIL
that says the node was not measured (gpuvet could not reach it, or a step could not run
there: `NODE_UNREACHABLE`, `FLEET_NODE_DROPPED`, `<STEP>_FAILED`) drains nothing, and a controller that does
not answer drains nothing: each is said, the run's verdict stands.

The reason is `gpuvet <CODE>[,<CODE>...] run <RUN_ID>`, the codes cut (with `+N` for
those left out) so it stays within `REASON_MAX`; the run id is never cut, because it is
how `resume` knows its own drains. A node someone else took out of service (drained,
down or failed with a reason that is not gpuvet's) keeps it. What was done is written to
the run's `slurm-drains.json` as it is done, so `resume` works from another process, a
day later; `resume` undoes a drain only while the node still carries that run's reason,
and says what it left alone.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from orchestrator.analysis.persistence import persistent_mounts
from orchestrator.analysis.verdict import provider_side_fail
from orchestrator.command import CommandResult
from orchestrator.errors import GpuvetError, UsageError
from orchestrator.files import atomic_write
from orchestrator.inventory import Node
from orchestrator.records import Finding

DRAINS_FILE = "slurm-drains.json"
REASON_MAX = 64  # the same cap as the node check's (payload.nodecheck.REASON_MAX)
# FAILs that say the node was not measured, not that it is faulty: gpuvet could not reach
# it, or the fleet plan went on without it (unreachable or killed mid-plan)
NOT_MEASURED_CODES = frozenset({"NODE_UNREACHABLE", "FLEET_NODE_DROPPED"})
TIMEOUT_S = 30.0
_STATE = re.compile(r"\bState=(\S+)")
_REASON = re.compile(r"\bReason=(.*?)(?: \[[^\]]*\])?\s*$")
_OUT_OF_SERVICE = re.compile(r"DRAIN|DOWN|FAIL", re.I)


class SlurmRunner(Protocol):
    """What the write-back needs of Slurm: its client commands (`SlurmClient.run`)."""

    def run(self, argv: Sequence[str], *, timeout: float | None = ...) -> CommandResult: ...


@dataclass
class Drain:
    """One node's drain by one run, and what became of it."""

    node: str
    provider: str
    codes: list[str]
    reason: str
    outcome: str  # drained | left (another's reason kept) | failed (Slurm did not do it)
    said: str
    at: str
    state_before: str | None = None
    reason_before: str | None = None
    resumed: dict[str, str] | None = None  # outcome (resumed | left | failed), said, at
    slurm: dict[str, Any] | None = None  # the provider's slurm: block, for `resume`


@dataclass
class DrainReport:
    drains: list[Drain] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what drained nothing, and why

    @property
    def lines(self) -> list[str]:
        return [d.said for d in self.drains] + self.notes

    def as_json(self) -> dict[str, Any]:
        return {"drains": [asdict(d) for d in self.drains], "drain_notes": self.notes}


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def reason(codes: Sequence[str], run_id: str) -> str:
    """`gpuvet GPU_XID,GPU_BUSY run <RUN_ID>`, the codes cut to fit REASON_MAX."""
    tail = f" run {run_id}"
    codes = list(dict.fromkeys(codes))
    for keep in range(len(codes), 0, -1):
        left = len(codes) - keep
        text = "gpuvet " + ",".join(codes[:keep]) + (f"+{left}" if left else "") + tail
        if len(text) <= REASON_MAX:
            return text
    return f"gpuvet +{len(codes)}{tail}"


def to_drain(findings: Iterable[Finding], nodes: Mapping[str, Node],
             run_dir: Path | None = None) -> dict[str, list[str]]:
    """Per Slurm node: the codes of its FAILs on the provider's side, in order, each once."""
    fs = list(findings)
    mounts = persistent_mounts({fs[0].run_id: run_dir}, fs) if fs and run_dir else {}
    out: dict[str, list[str]] = {}
    for f in fs:
        node = nodes.get(f.node) if f.node is not None else None
        if node is None or node.executor != "slurm" or not provider_side_fail(f, mounts):
            continue
        if f.code in NOT_MEASURED_CODES or f.code == f"{f.step.upper()}_FAILED":
            continue
        codes = out.setdefault(node.name, [])
        if f.code not in codes:
            codes.append(f.code)
    return out


def node_state(client: SlurmRunner, name: str) -> tuple[str | None, str | None]:
    """(State, Reason) of a node from `scontrol -o show node`; a ConnectionFailed-like
    GpuvetError when Slurm does not answer."""
    res = client.run(["scontrol", "-o", "show", "node", name], timeout=TIMEOUT_S)
    if not res.ok:
        tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or [f"exit {res.rc}"]
        raise GpuvetError(f"scontrol show node {name}: {tail[0]}")
    state = _STATE.search(res.stdout)
    why = _REASON.search(res.stdout)
    return (state.group(1) if state else None), (why.group(1).strip() if why else None)


def _tail(res: CommandResult) -> str:
    lines = (res.stderr or res.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit code {res.rc}"


def drain_one(client: SlurmRunner, node: str, provider: str, codes: Sequence[str],
              run_id: str) -> Drain:
    text = reason(codes, run_id)
    try:
        state, before = node_state(client, node)
    except GpuvetError as exc:
        return Drain(node, provider, list(codes), text, "failed",
                     f"not drained: {node} ({', '.join(codes)}): Slurm did not answer: "
                     f"{exc.what}", _now())
    if state and _OUT_OF_SERVICE.search(state) and before and not before.startswith("gpuvet "):
        return Drain(node, provider, list(codes), text, "left",
                     f"not drained: {node} ({', '.join(codes)}) is already {state} with "
                     f"another reason, kept: {before!r}", _now(), state, before)
    try:
        res = client.run(["scontrol", "update", f"NodeName={node}", "State=DRAIN",
                          f"Reason={text}"], timeout=TIMEOUT_S)
    except GpuvetError as exc:
        return Drain(node, provider, list(codes), text, "failed",
                     f"not drained: {node}: {exc.what}", _now(), state, before)
    if not res.ok:
        return Drain(node, provider, list(codes), text, "failed",
                     f"not drained: {node}: scontrol update failed: {_tail(res)}", _now(),
                     state, before)
    return Drain(node, provider, list(codes), text, "drained", f"drained {node}: {text}",
                 _now(), state, before)


def drain_failed(run_id: str, run_dir: Path, findings: Sequence[Finding],
                 nodes: Sequence[Node], clients: Callable[[str], SlurmRunner],
                 settings: Mapping[str, Mapping[str, Any]] | None = None) -> DrainReport:
    """Drain every Slurm node with a FAIL on the provider's side; each drain recorded in
    the run as it is done, with its provider's slurm: block (`settings`) for `resume`."""
    report = DrainReport()
    by_name = {n.name: n for n in nodes}
    wanted = to_drain(findings, by_name, run_dir)
    others = sorted({f.node for f in findings if f.severity == "FAIL" and f.node in by_name
                     and by_name[f.node].executor == "slurm" and f.node not in wanted})
    if others:
        report.notes.append(f"not drained: {', '.join(others)}: no FAIL on the provider's "
                            "side there (a setup problem, or the node was not measured)")
    if not any(n.executor == "slurm" for n in nodes):
        report.notes.append("--drain-on-fail: no node of an executor slurm provider here, "
                            "nothing to drain")
    for name, codes in wanted.items():
        node = by_name[name]
        try:
            client = clients(node.provider)
        except GpuvetError as exc:
            d = Drain(name, node.provider, codes, reason(codes, run_id), "failed",
                      f"not drained: {name}: {exc.what}", _now())
        else:
            d = drain_one(client, name, node.provider, codes, run_id)
        block = (settings or {}).get(node.provider)
        d.slurm = dict(block) if block is not None else None
        report.drains.append(d)
        record(run_dir, run_id, [d])
    return report


def record(run_dir: Path, run_id: str, drains: Sequence[Drain]) -> None:
    """Write the drains into the run's file, a node's entry replacing its earlier one."""
    known = {d.node: d for d in read(run_dir)}
    known.update({d.node: d for d in drains})
    atomic_write(run_dir / DRAINS_FILE, json.dumps(
        {"run_id": run_id, "drains": [asdict(d) for d in known.values()]}, indent=2) + "\n")


def read(run_dir: Path) -> list[Drain]:
    path = run_dir / DRAINS_FILE
    if not path.is_file():
        return []
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        return [Drain(**d) for d in doc["drains"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"{path} is damaged ({exc}): the drains of this run are not known",
                         hint="scontrol show node NODE shows each node's reason") from None


def resume(run_id: str, run_dir: Path, clients: Callable[[str], SlurmRunner]
           ) -> list[Drain]:
    """Undo the drains this run made, where the node still carries its reason."""
    done: list[Drain] = []
    for d in read(run_dir):
        if d.outcome != "drained" or (d.resumed or {}).get("outcome") == "resumed":
            continue
        d.resumed = _resume_one(clients, d)
        done.append(d)
        record(run_dir, run_id, [d])
    return done


def _resume_one(clients: Callable[[str], SlurmRunner], d: Drain) -> dict[str, str]:
    def out(outcome: str, said: str) -> dict[str, str]:
        return {"outcome": outcome, "said": said, "at": _now()}

    try:
        client = clients(d.provider)
    except GpuvetError as exc:
        return out("failed", f"not resumed: {d.node}: {exc.what}")
    try:
        state, now = node_state(client, d.node)
    except GpuvetError as exc:
        return out("failed", f"not resumed: {d.node}: Slurm did not answer: {exc.what}")
    if not state or not _OUT_OF_SERVICE.search(state):
        return out("left", f"{d.node} is {state or 'unknown to Slurm'}, no longer drained: "
                           "nothing to undo")
    if now != d.reason:
        return out("left", f"left alone: {d.node} is {state} with another reason since "
                           f"({now!r}), not this run's")
    try:
        res = client.run(["scontrol", "update", f"NodeName={d.node}", "State=RESUME"],
                         timeout=TIMEOUT_S)
    except GpuvetError as exc:
        return out("failed", f"not resumed: {d.node}: {exc.what}")
    if not res.ok:
        return out("failed", f"not resumed: {d.node}: scontrol update failed: {_tail(res)}")
    return out("resumed", f"resumed {d.node} (drained by this run: {d.reason})")
