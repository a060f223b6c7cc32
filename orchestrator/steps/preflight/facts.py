"""What preflight learnt about one node, and the result a check gives.

Every check module (`gpu`, `links`, `checks`) reads a `NodeFacts` and returns
`Result`s; the GPU outputs are merged here once, most trusted first, so every
check sees the same view of each GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from orchestrator.parsers.gpus import GpuView, merge_gpus
from orchestrator.parsers.nvidia_smi import NvidiaSmiLFacts, QueryGpuFacts
from orchestrator.parsers.nvidia_smi_q import NvidiaSmiQFacts
from orchestrator.parsers.nvidia_smi_table import NvidiaSmiTableFacts
from orchestrator.parsers.nvidia_smi_xml import NvidiaSmiXmlFacts
from orchestrator.records import Severity


@dataclass
class NodeFacts:
    """Everything preflight learnt about one node."""

    node: str
    provider: str
    doc: dict[str, Any]  # the payload's collect document
    facts: dict[str, BaseModel] = field(default_factory=dict)  # by command id
    parse_errors: dict[str, str] = field(default_factory=dict)
    evidence: dict[str, str] = field(default_factory=dict)  # command id -> run-relative path
    stderr_evidence: dict[str, str] = field(default_factory=dict)  # where a stderr was kept
    document_evidence: str | None = None  # collect.json itself
    # what the inventory itself sets: a deliberate CUDA_VISIBLE_DEVICES is not a fault,
    # and storage is judged only where the inventory names a checkpoint directory
    inventory_env: dict[str, str] = field(default_factory=dict)
    ckpt_configured: bool = True

    def command(self, cid: str) -> dict[str, Any]:
        return dict(self.doc.get("commands", {}).get(cid) or {})

    def get(self, cid: str) -> Any:
        return self.facts.get(cid)

    def ev(self, *cids: str) -> list[str]:
        return [self.evidence[c] for c in cids if c in self.evidence]

    def ev_failed(self, cid: str) -> list[str]:
        """The file that says why a command failed: its stderr, else its output, else the
        collect document (which records a command that was missing or timed out)."""
        rec = self.command(cid)
        if cid in self.stderr_evidence:
            return [self.stderr_evidence[cid]]
        if (rec.get("stdout") or "").strip() and cid in self.evidence:
            return [self.evidence[cid]]
        return [self.document_evidence] if self.document_evidence else self.ev(cid)


@dataclass
class Result:
    code: str
    severity: Severity
    message: str
    evidence: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)


# Outputs that describe GPUs, most trusted first; the default table and ibstat have
# no parser in the collect command list yet, so they are read here when present.
_GPU_OUTPUT_ORDER = (QueryGpuFacts, NvidiaSmiXmlFacts, NvidiaSmiQFacts, NvidiaSmiTableFacts,
                     NvidiaSmiLFacts)


def gpu_outputs(nf: NodeFacts) -> list[tuple[str, BaseModel]]:
    found = [(cid, f) for cid, f in nf.facts.items() if isinstance(f, _GPU_OUTPUT_ORDER)]
    return sorted(found, key=lambda cf: next(k for k, t in enumerate(_GPU_OUTPUT_ORDER)
                                             if isinstance(cf[1], t)))


def gpu_views(nf: NodeFacts) -> list[GpuView]:
    return merge_gpus(gpu_outputs(nf))


def driver_present(nf: NodeFacts) -> bool:
    return bool(gpu_views(nf))

