"""The fabric's ports from sysfs: what each node has (ports, counters already counting,
RoCE GIDs and MTU) and, across a provider's nodes, P_Keys that must be the same.

The judgement itself is `judging.fabric`'s, shared with the nccl and fleet steps (which
read the counters before and after their load).
"""

from __future__ import annotations

from orchestrator.inventory import Expectations
from orchestrator.judging import fabric as F
from orchestrator.parsers.fabric import FabricFacts
from orchestrator.steps.preflight.facts import NodeFacts, Result
from orchestrator.suite import PreflightParams


def check_fabric_sysfs(nf: NodeFacts, ex: Expectations, p: PreflightParams) -> list[Result]:
    facts = nf.get("fabric")
    if not isinstance(facts, FabricFacts):
        return []  # a payload before the snapshot, or a PoC folder without it
    return [Result(v.code, v.severity, v.message, nf.ev("fabric"), v.details)
            for v in F.describe(facts, ex.fabric.type)]


def provider_pkeys(nodes: list[NodeFacts]) -> list[Result]:
    """P_Keys that differ between the nodes of one provider: a FAIL before anything runs."""
    facts = {nf.node: f for nf in nodes if isinstance(f := nf.get("fabric"), FabricFacts)}
    return [Result(v.code, v.severity, v.message,
                   [e for nf in nodes for e in nf.ev("fabric")], v.details)
            for v in F.pkey_mismatch(facts)]
