"""Reading one phase of the training protocol back from its files.

Each node leaves its rank event files (payload/train/protocol.py), the
supervisor's document and torchrun's output in one folder per phase; a
`PhaseOutput` is those folders read, in node-rank order. `Earlier` is what the
judged phases of one protocol run left for the later ones.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.judging.telemetry import NodeTelemetry
from payload.train import protocol

STDOUT, STDERR = "torchrun.stdout", "torchrun.stderr"


@dataclass
class NodeOutput:
    """One node's files of one phase."""

    node: str
    dir: Path
    supervise: dict[str, Any]
    events: dict[int, list[dict[str, Any]]]  # global rank -> events

    def file(self, name: str) -> Path:
        return self.dir / name

    def telemetry(self) -> NodeTelemetry:
        """The GPU telemetry its supervisor sampled, as the telemetry judge reads it."""
        return NodeTelemetry(self.node, self.supervise.get("telemetry") or {}, self.dir,
                             self.file("supervise.json"))


@dataclass
class PhaseOutput:
    phase: str
    nodes: list[NodeOutput]  # in node-rank order

    @property
    def ranks(self) -> dict[int, list[dict[str, Any]]]:
        out: dict[int, list[dict[str, Any]]] = {}
        for n in self.nodes:
            out.update(n.events)
        return dict(sorted(out.items()))

    def node_of(self, rank: int) -> str:
        for n in self.nodes:
            if rank in n.events:
                return n.node
        return "?"

    def rank0(self) -> list[dict[str, Any]]:
        return self.ranks.get(0, [])

    def steps(self, rank: int = 0) -> dict[int, dict[str, Any]]:
        return {int(e["step"]): e for e in self.ranks.get(rank, [])
                if e.get("event") == protocol.STEP}

    def first(self, kind: str, rank: int = 0) -> dict[str, Any] | None:
        return next((e for e in self.ranks.get(rank, []) if e.get("event") == kind), None)

    def all(self, kind: str) -> list[dict[str, Any]]:
        return [e for evs in self.ranks.values() for e in evs if e.get("event") == kind]

    def rank_file(self, rank: int) -> Path:
        """The event file of `rank`: on the node that wrote it, else where it would be."""
        for n in self.nodes:
            if rank in n.events:
                return n.file(f"rank{rank}.jsonl")
        return self.nodes[0].file(f"rank{rank}.jsonl") if self.nodes else Path("?")


@dataclass
class Earlier:
    """What the phases judged so far left for the later ones."""

    ref: PhaseOutput | None = None
    kill_out: PhaseOutput | None = None
    saved_step: int | None = None  # the newest save the killed run completed
    inexact: list[str] = field(default_factory=list)  # why losses may not match bit for bit
    echoes: list[str] = field(default_factory=list)  # ranks that saw the kill land elsewhere


def read_node(node: str, folder: Path) -> NodeOutput:
    sup: dict[str, Any] = {}
    doc = folder / "supervise.json"
    if doc.is_file():
        try:
            loaded = json.loads(doc.read_text())
            sup = loaded if isinstance(loaded, dict) else {}
        except ValueError:
            sup = {}
    events: dict[int, list[dict[str, Any]]] = {}
    for path in sorted(folder.glob("rank*.jsonl")):
        m = re.fullmatch(r"rank(\d+)\.jsonl", path.name)
        if m:
            events[int(m.group(1))] = list(protocol.parse_lines(
                path.read_text(errors="replace")))
    return NodeOutput(node, folder, sup, events)


def read_phase(phase: str, folders: list[tuple[str, Path]]) -> PhaseOutput:
    return PhaseOutput(phase, [read_node(n, d) for n, d in folders])


def tail(path: Path, n: int = 3) -> str:
    """The last `n` lines of a log that say something, for a message."""
    if not path.is_file():
        return ""
    lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines()
             if ln.strip() and not ln.startswith("*")]
    return " | ".join(lines[-n:])[-400:]
