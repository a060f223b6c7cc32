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

Severity = Literal["PASS", "WARN", "FAIL", "INFO"]
SEVERITY_ORDER = {"PASS": 0, "INFO": 0, "WARN": 1, "FAIL": 2}
FindingScope = Literal["node", "provider"]
# where a measurement was taken: one node's GPUs, across a provider's nodes, or the
# training step (single- or multi-node, told apart by `nodes`)
MeasureScope = Literal["single", "multi", "train"]
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
    unit_key: str | None = None  # the unit of work that made it ("node:N", "provider:P/multi")

    @model_validator(mode="after")
    def _node_iff_node_scope(self) -> Finding:
        if (self.scope == "node") != (self.node is not None):
            raise ValueError("a node finding names its node; a provider finding names none")
        return self

    @property
    def subject(self) -> str:
        """What the finding is about, as tables show it."""
        return self.node if self.node is not None else f"provider:{self.provider}"


def finding(run_id: str, step: str, *, provider: str, node: str | None, code: str,
            severity: Severity, message: str, evidence: Iterable[str] = (),
            stage: Stage | None = None, unit_key: str | None = None, **details: Any) -> Finding:
    """The one constructor: `node=None` makes a provider-wide finding."""
    return Finding(run_id=run_id, scope="node" if node is not None else "provider", node=node,
                   provider=provider, step=step, code=code, severity=severity, message=message,
                   evidence=list(evidence), details=details, stage=stage, unit_key=unit_key)


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
