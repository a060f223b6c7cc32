"""What one provider's fleet run keeps while it runs: the typed state the verdict reads.

Shared by the step (which fills it), the RDMA phase and the verdict (which read it).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.bands import Band
from orchestrator.inventory import Node
from orchestrator.judging.fabric import Around
from orchestrator.nccltests import BuildDoc
from orchestrator.parsers.topology import TopoMFacts
from orchestrator.records import Finding
from orchestrator.steps.fleet import localise as L
from orchestrator.steps.fleet import plan as P
from orchestrator.steps.fleet.rails import RailResult
from orchestrator.suite import FleetParams


@dataclass
class JobRecord:
    """What one finished job left: its samples (pairs) and evidence, kept for judging."""

    job: P.Job
    stage: str
    round: int
    files: list[str]
    transport: str | None = None
    busbw: dict[int, float] = field(default_factory=dict)  # size -> out-of-place busbw
    rank_times: Path | None = None
    failed: str | None = None  # why the job gave no result, the nodes still reachable
    collective: str = "all_reduce"  # a job runs each of fleet.collectives: one record each


@dataclass
class ProviderFleet:
    """The state of one provider's fleet run, and what the verdict is made from."""

    provider: str
    nodes: list[Node]
    params: FleetParams
    prepared: dict[str, dict[str, object]] = field(default_factory=dict)  # node -> probe
    builds: dict[str, BuildDoc] = field(default_factory=dict)
    dropped: dict[str, str] = field(default_factory=dict)  # node -> why
    # per collective: each is localised on its own, against its own median pair
    samples: dict[str, list[L.PairSample]] = field(default_factory=dict)
    jobs: list[JobRecord] = field(default_factory=list)
    executed: list[P.Round] = field(default_factory=list)
    first: dict[str, L.Localisation] | None = None  # collective -> after the first pass
    final: dict[str, L.Localisation] | None = None  # collective -> after the re-pairs
    # collective -> (why, evidence): the torch benchmark's backend has no such collective
    skipped: dict[str, tuple[str, list[str]]] = field(default_factory=dict)
    shipped: list[Band] = field(default_factory=list)
    extra: list[Finding] = field(default_factory=list)  # the RDMA phase's notes
    topo: dict[str, TopoMFacts] = field(default_factory=dict)  # node -> nvidia-smi topo -m
    rails: list[RailResult] = field(default_factory=list)  # the RDMA phase's per-HCA results
    fabric: Around | None = None  # the ports' snapshots before and after the plan
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def alive(self) -> list[str]:
        return [n.name for n in self.nodes if n.name in self.prepared
                and n.name not in self.dropped]
