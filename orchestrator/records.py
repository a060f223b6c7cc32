"""The typed records every step emits: findings and measurements.

A finding names its evidence: the raw output files (relative to the run
directory) it was judged from. Measurements carry the run id and the suite
hash, so anything compared later can prove it was measured under identical
parameters.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Severity = Literal["PASS", "WARN", "FAIL", "INFO"]
SEVERITY_ORDER = {"PASS": 0, "INFO": 0, "WARN": 1, "FAIL": 2}


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Finding(_Record):
    run_id: str
    node: str  # a node name, or "provider:<name>" for cross-node findings
    provider: str
    step: str
    code: str  # stable, e.g. GPU_COUNT_MISMATCH
    severity: Severity
    message: str
    evidence: list[str] = Field(default_factory=list)
    details: dict[str, Any] = Field(default_factory=dict)


class Measurement(_Record):
    run_id: str
    provider: str
    nodes: list[str]
    step: str
    metric: str  # e.g. busbw
    value: float
    unit: str
    suite_hash: str
    round: int | None = None
    tags: dict[str, Any] = Field(default_factory=dict)


def worst(findings: list[Finding]) -> Severity:
    """FAIL over WARN over PASS; INFO alone counts as PASS."""
    levels = {f.severity for f in findings}
    for sev in ("FAIL", "WARN"):
        if sev in levels:
            return sev
    return "PASS"
