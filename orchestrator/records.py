"""The typed records every step emits: findings and measurements.

A finding names its evidence: the raw output files (relative to the run
directory) it was judged from. Measurements carry the run id and the suite
hash, so anything compared later can prove it was measured under identical
parameters. Every field the analysis groups by (scope, engine, message size,
round, in-place) is a field and an index column, not a key in `tags`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from payload.scrub import scrub_doc, scrub_text

Severity = Literal["PASS", "WARN", "FAIL", "INFO"]
SEVERITY_ORDER = {"PASS": 0, "INFO": 0, "WARN": 1, "FAIL": 2}
FindingScope = Literal["node", "provider"]
# where a measurement was taken: one node's GPUs, across a provider's nodes, or the
# training step (single- or multi-node, told apart by `nodes`)
MeasureScope = Literal["single", "multi", "train", "health"]
Stage = Literal["prepare", "execute", "judge"]


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Finding(_Record):
    run_id: str
    scope: FindingScope = "node"
    node: str | None = None  # set exactly when scope is "node"
    provider: str
    step: str
    code: str  # stable, e.g. GPU_COUNT_MISMATCH
    severity: Severity
    message: str
    evidence: list[str] = Field(default_factory=list)
    details: dict[str, Any] = Field(default_factory=dict)
    stage: Stage | None = None  # for failures: the stage of the step that failed
    unit_key: str | None = None  # the unit of work that made it (`node_unit_key`, ...)

    @model_validator(mode="after")
    def _node_iff_node_scope(self) -> Finding:
        if (self.scope == "node") != (self.node is not None):
            raise ValueError("a node finding names its node; a provider finding names none")
        return self

    @property
    def subject(self) -> str:
        """What the finding is about, as a key of machine output (see `subject_key`)."""
        return subject_key(self.provider, self.node)

    @property
    def label(self) -> str:
        """What the finding is about, as tables and messages show it."""
        return subject_label(self.provider, self.node)


def finding(run_id: str, step: str, *, provider: str, node: str | None, code: str,
            severity: Severity, message: str, evidence: Iterable[str] = (),
            stage: Stage | None = None, unit_key: str | None = None, **details: Any) -> Finding:
    """The one constructor: `node=None` makes a provider-wide finding. Its message and
    details may quote a node's output or a user's command: scrubbed like every text
    gpuvet stores."""
    return Finding(run_id=run_id, scope="node" if node is not None else "provider", node=node,
                   provider=provider, step=step, code=code, severity=severity,
                   message=scrub_text(message), evidence=[scrub_text(e) for e in evidence],
                   details=scrub_doc(details), stage=stage, unit_key=unit_key)


class Measurement(_Record):
    run_id: str
    provider: str
    nodes: list[str]
    step: str
    metric: str  # busbw, algbw, time, step_time_s, mfu, ...
    value: float
    unit: str
    suite_hash: str
    scope: MeasureScope
    engine: str = "nccl-tests"  # nccl-tests | torch | train
    size: int | None = None  # message size in bytes, where the metric has one
    inplace: bool | None = None
    round: int | None = None
    unit_key: str | None = None  # the unit of work that made it, for resume
    tags: dict[str, Any] = Field(default_factory=dict)  # op, type, versions, ...


# --- scope as text -------------------------------------------------------------------------
# Records hold their scope as fields (provider, node, unit_key); these functions are the
# only code that turns a scope into text, and nothing turns text back into a scope.

def subject_label(provider: str, node: str | None) -> str:
    """A scope as people read it: the node's name, or "provider P (all nodes)"."""
    return node if node is not None else f"provider {provider} (all nodes)"


def subject_key(provider: str, node: str | None) -> str:
    """A scope as a key of machine output (`--json` verdicts, Prometheus labels,
    regress.json): the node's name, or "provider:P". Stable for the programs that read
    it; gpuvet never reads it back."""
    return node if node is not None else f"provider:{provider}"


def node_unit_key(node: str) -> str:
    """The key of a node's unit of work: stored in done.json's path and in every record
    the unit made, so its form ("node:NAME") stays what runs on disk already use."""
    return f"node:{node}"


def provider_unit_key(provider: str, what: str) -> str:
    """The key of a provider's unit of work ("provider:NAME/WHAT", as stored)."""
    return f"provider:{provider}/{what}"


def unit_folder(key: str) -> tuple[Literal["nodes", "providers"], str]:
    """Where a unit's files are kept in its run: ("nodes", NAME) for a node's unit,
    ("providers", "NAME__WHAT") for a provider's."""
    kind, _, name = key.partition(":")
    if kind == "node":
        return "nodes", name
    return "providers", name.replace("/", "__")


def worst(findings: Iterable[Finding]) -> Severity:
    """FAIL over WARN over PASS; INFO alone counts as PASS."""
    levels = {f.severity for f in findings}
    for sev in ("FAIL", "WARN"):
        if sev in levels:
            return sev
    return "PASS"


@dataclass
class UnitResult:
    """What one unit of a step produced: its records, and a summary that later units
    read back from its done.json."""

    findings: list[Finding] = field(default_factory=list)
    measurements: list[Measurement] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
