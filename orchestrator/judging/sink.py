"""The record sink: findings and measurements about one subject, with their evidence.

A step's judge says what it found (`add`) and what it measured (`measure`); the
sink stamps every record with the run, the step, the suite hash and the subject
(a node, or a provider as a whole with the nodes that were measured), keeps the
evidence that exists as paths relative to the run directory, and hands the
step driver the unit's result (`result`). Records are built only through
`records.finding()` and `Measurement`, so a judge never spells a record's
fields itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.records import Finding, Measurement, MeasureScope, Severity, UnitResult, finding


@dataclass
class Sink:
    """Records about one subject of one step.

    `node` is the node the findings are about, or None for a provider-wide subject
    (a multi-node run); `nodes` are the nodes its measurements were taken on;
    `label` prefixes every message ("[single] ...") where it is not empty; `rel`
    turns an evidence file into its path relative to the run directory. `scope`
    and `engine` are those of every measurement (the training step: "train",
    "train")."""

    run_id: str
    step: str
    suite_hash: str
    provider: str
    node: str | None
    nodes: list[str]
    label: str
    rel: Callable[[Path], str]
    scope: MeasureScope
    engine: str
    findings: list[Finding] = field(default_factory=list)
    measurements: list[Measurement] = field(default_factory=list)

    def evidence(self, paths: Iterable[Path]) -> list[str]:
        """The files among `paths` that exist, relative to the run; the others are dropped
        (a phase that died early leaves some of its files unwritten)."""
        return [self.rel(p) for p in paths if p.is_file()]

    def add(self, code: str, severity: Severity, message: str,
            evidence: Iterable[Path] | None = None, **details: Any) -> Finding:
        """A finding with the evidence files that exist; `details` become its details."""
        f = finding(self.run_id, self.step, provider=self.provider, node=self.node, code=code,
                    severity=severity, message=f"[{self.label}] {message}" if self.label
                    else message, evidence=self.evidence(evidence or []), **details)
        self.findings.append(f)
        return f

    def measure(self, metric: str, value: float, unit: str, **tags: Any) -> Measurement:
        """A measurement of the subject's nodes; `tags` say how it was taken."""
        m = Measurement(run_id=self.run_id, provider=self.provider, nodes=self.nodes,
                        step=self.step, metric=metric, value=float(value), unit=unit,
                        suite_hash=self.suite_hash, scope=self.scope, engine=self.engine,
                        tags=tags)
        self.measurements.append(m)
        return m

    def last(self, metric: str) -> float | None:
        """The value of the newest measurement of `metric`, None where there is none."""
        return next((m.value for m in reversed(self.measurements) if m.metric == metric), None)

    def result(self, summary: dict[str, Any] | None = None) -> UnitResult:
        """The unit's result for the step driver: these records and `summary`."""
        return UnitResult(list(self.findings), list(self.measurements), dict(summary or {}))


def combined(sinks: Iterable[Sink], summary: dict[str, Any] | None = None) -> UnitResult:
    """One unit's result from several subjects' sinks (a unit that runs on a group of
    nodes judges each node on its own), in the order given."""
    out = UnitResult(summary=dict(summary or {}))
    for s in sinks:
        out.findings += s.findings
        out.measurements += s.measurements
    return out
