"""Each rail on its own: the per-HCA RDMA results of the fleet step as a rail table.

A rail is one HCA of a node and the HCA of the same position on its partner
(`rdma.py` runs `ib_write_bw` over each, one after the other). Every measured rail
is a row: the node, the HCA, its port, netdev and link rate (from the node's fabric
snapshot), the bandwidth measured, its share of the median rail of the provider, and
the GPUs nearest the HCA (`nvidia-smi topo -m`'s NIC legend and matrix, the closest
relation any GPU has to it). A rail more than the fleet's `tolerance` below the median
rail is slow and named with its NIC, port and GPUs: a NIC, its cable or its switch port
(on either end: the partner's HCA is named too). With fewer than three rails there is
no "the others" to compare with, which the table says.

With `fleet.rails_nccl` each rail is also measured through NCCL: one nccl-tests run per
HCA between the same partners, `NCCL_IB_HCA` set to that HCA on each node, its busbw at
the largest size (in Gb/s here, busbw x 8); those rails make a table of their own (a
NCCL busbw is never compared with an ib_write_bw figure).

Pure functions: the step gathers the inputs (one table per tool: `rail_table` is given
one tool's results).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.parsers.fabric import FabricFacts, FabricPort
from orchestrator.parsers.topology import TopoMFacts

MIN_RAILS = 3  # fewer: no median of "the others" to judge a rail against


@dataclass(frozen=True)
class RailResult:
    """One HCA's measurement between two nodes (client `node`, server `peer`)."""

    node: str
    hca: str
    peer: str
    peer_hca: str
    gbps: float
    evidence: tuple[str, ...] = ()
    tool: str = "ib_write_bw"  # or "nccl": nccl-tests' busbw with NCCL_IB_HCA on that HCA


TOOLS = {"ib_write_bw": "ib_write_bw per HCA", "nccl": "nccl-tests per HCA (NCCL_IB_HCA)"}


@dataclass
class Rail:
    node: str
    hca: str
    port: int | None
    netdev: str | None
    rate_gbps: float | None
    gbps: float
    peer: str
    peer_hca: str
    gpus: list[str] = field(default_factory=list)  # nearest the HCA on `node`
    peer_gpus: list[str] = field(default_factory=list)
    ratio: float | None = None  # of the median rail
    slow: bool = False
    evidence: tuple[str, ...] = ()
    tool: str = "ib_write_bw"

    @property
    def name(self) -> str:
        port = f" port {self.port}" if self.port is not None else ""
        return f"{self.node}:{self.hca}{port}"

    def as_json(self) -> dict[str, Any]:
        return {"node": self.node, "hca": self.hca, "port": self.port, "netdev": self.netdev,
                "rate_gbps": self.rate_gbps, "gbps": self.gbps, "gbs": self.gbps / 8,
                "ratio": self.ratio, "slow": self.slow, "gpus": self.gpus, "peer": self.peer,
                "peer_hca": self.peer_hca, "peer_gpus": self.peer_gpus, "tool": self.tool,
                "evidence": list(self.evidence)}


@dataclass
class RailTable:
    rails: list[Rail]
    median_gbps: float | None
    tolerance: float

    @property
    def slow(self) -> list[Rail]:
        return [r for r in self.rails if r.slow]

    def as_json(self) -> dict[str, Any]:
        return {"median_gbps": self.median_gbps, "tolerance": self.tolerance,
                "min_rails": MIN_RAILS, "rails": [r.as_json() for r in self.rails]}


def _port(facts: FabricFacts | None, hca: str) -> FabricPort | None:
    """The HCA's port ib_write_bw used (its default, port 1, where the snapshot has it;
    else the HCA's first ACTIVE port)."""
    if facts is None:
        return None
    ports = [p for p in facts.ports if p.device == hca]
    return next((p for p in ports if p.port == 1), None) or next(
        (p for p in ports if p.active), ports[0] if ports else None)


def near(topo: TopoMFacts | None, hca: str) -> list[str]:
    """The GPUs nearest the HCA in the node's topology; empty where it is not known."""
    if topo is None:
        return []
    aff = topo.nic_affinity.get(hca)
    return list(aff.gpus) if aff is not None else []


def rail_table(results: Sequence[RailResult], *, tolerance: float,
               topo: Mapping[str, TopoMFacts | None] | None = None,
               fabric: Mapping[str, FabricFacts | None] | None = None) -> RailTable:
    topo = topo or {}
    fabric = fabric or {}
    rails: list[Rail] = []
    for r in results:
        p = _port(fabric.get(r.node), r.hca)
        rails.append(Rail(node=r.node, hca=r.hca, port=p.port if p else None,
                          netdev=p.netdev if p else None, rate_gbps=p.rate_gbps if p else None,
                          gbps=r.gbps, peer=r.peer, peer_hca=r.peer_hca,
                          gpus=near(topo.get(r.node), r.hca),
                          peer_gpus=near(topo.get(r.peer), r.peer_hca), evidence=r.evidence,
                          tool=r.tool))
    med = statistics.median(r.gbps for r in rails) if rails else None
    for rail in rails:
        if med:
            rail.ratio = rail.gbps / med
            rail.slow = len(rails) >= MIN_RAILS and rail.gbps < (1 - tolerance) * med
    rails.sort(key=lambda x: (x.node, x.hca))
    return RailTable(rails, med, tolerance)


def rail_words(r: Rail) -> str:
    """A rail for a message: the NIC, port, netdev, link rate and the GPUs near it, and
    the partner's end."""
    bits = [x for x in (r.netdev, f"{r.rate_gbps:g} Gb/s link" if r.rate_gbps else None,
                        f"near {', '.join(r.gpus)}" if r.gpus else None) if x]
    peer = f"{r.peer}:{r.peer_hca}" + (f" (near {', '.join(r.peer_gpus)})" if r.peer_gpus
                                       else "")
    said = " (" + ", ".join(bits) + ")" if bits else ""
    return f"{r.name}{said} -> {peer}"
