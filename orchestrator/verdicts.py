"""Verdicts and table rows: data first, rendering last.

The terminal, `--json`, and the HTML/Markdown report all read these rows
(as ReFrame's reporting returns header + rows for a printer, and pytest's
terminal and junitxml read one report stream); the exit code is computed
from the same verdicts. Nothing here prints.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from orchestrator.records import SEVERITY_ORDER, Finding, worst

# Shown in the default findings table whatever their severity: the results a
# person ran the step for, not only what went wrong.
HEADLINE_CODES = frozenset({
    "NCCL_BUSBW", "NCCL_TRANSPORTS", "NCCL_REFERENCE", "NCCL_REFERENCE_NONE", "NCCL_NOT_APPLICABLE",
    # the nccl step's network mode: the transport, GPUDirect RDMA, each NIC's share
    "NCCL_NET_TRANSPORT", "NCCL_GPUDIRECT", "NCCL_NET_PER_NIC", "NCCL_NET_SOCKET",
    "NCCL_NETWORK_NOT_MEASURED",
    "TORCH_VS_NCCL_TESTS", "TRAIN_SUMMARY", "TRAIN_RESTORE_OK", "TRAIN_RESTORE_MISMATCH",
    "CKPT_NOT_PERSISTENT",
    # health: what each GPU measures like, and a node that had nothing to measure
    "HEALTH_VARIANT", "HEALTH_NO_GPU", "HEALTH_NOT_RUN",
    # fleet: the pairs table, the outcome of localisation, a provider too small for it, the
    # rail table, a collective asked for that the backend could not run
    "FLEET_PAIRS", "FLEET_NO_SUSPECT", "FLEET_SUSPECT_CLEARED", "FLEET_NOT_APPLICABLE",
    "FLEET_NOT_RUN", "FLEET_RAILS", "FLEET_COLLECTIVE_SKIPPED",
})


@dataclass(frozen=True)
class Table:
    """A titled table of plain values; `severity` and `verdict` columns get colour."""

    title: str
    columns: tuple[str, ...]
    rows: list[tuple[Any, ...]] = field(default_factory=list)

    def as_dicts(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, r, strict=True)) for r in self.rows]

    def as_json(self) -> dict[str, Any]:
        return {"title": self.title, "columns": list(self.columns), "rows": self.as_dicts()}


def shown(findings: Iterable[Finding], verbose: bool) -> list[Finding]:
    return [f for f in findings
            if verbose or f.severity in ("WARN", "FAIL") or f.code in HEADLINE_CODES]


def findings_table(findings: Iterable[Finding], title: str, verbose: bool = False) -> Table:
    fs = sorted(shown(findings, verbose),
                key=lambda f: (f.subject, -SEVERITY_ORDER[f.severity], f.code))
    return Table(title, ("node", "severity", "code", "message"),
                 [(f.label, f.severity, f.code, f.message) for f in fs])


def subjects(findings: Iterable[Finding], nodes: Sequence[str] = ()) -> list[str]:
    """The nodes asked for, in order, then every other subject the findings name (as
    `Finding.subject` keys)."""
    out = list(dict.fromkeys(nodes))
    out += sorted({f.subject for f in findings} - set(out))
    return out


def by_subject(findings: Iterable[Finding]) -> dict[str, list[Finding]]:
    """Findings grouped by subject in one pass (filtering them once per subject made a
    verdict table of 1,000 nodes quadratic: 2 s)."""
    out: dict[str, list[Finding]] = {}
    for f in findings:
        out.setdefault(f.subject, []).append(f)
    return out


NOT_MEASURED = "NOT MEASURED"


def subject_verdict(findings: Sequence[Finding]) -> str:
    """A subject's worst finding; NOT MEASURED when nothing was judged (no PASS, WARN or
    FAIL: a health step on a node without a GPU says only INFO), never PASS with 0 checks."""
    if not any(f.severity in ("PASS", "WARN", "FAIL") for f in findings):
        return NOT_MEASURED
    return worst(findings)


def verdicts(findings: Sequence[Finding], nodes: Sequence[str] = ()) -> dict[str, str]:
    groups = by_subject(findings)
    return {s: subject_verdict(groups.get(s, ())) for s in subjects(findings, nodes)}


def verdict_table(findings: Sequence[Finding], nodes: Sequence[str] = ()) -> Table:
    labels = {f.subject: f.label for f in findings}  # a node asked for is its own label
    groups = by_subject(findings)
    rows = []
    for s, v in verdicts(findings, nodes).items():
        fs = groups.get(s, [])
        rows.append((labels.get(s, s), v, *(sum(f.severity == sev for f in fs) for sev in ("FAIL", "WARN",
                                                                           "PASS"))))
    return Table("verdict per node", ("node", "verdict", "FAIL", "WARN", "PASS"), rows)


def failed(findings: Iterable[Finding]) -> bool:
    return any(f.severity == "FAIL" for f in findings)


def run_status(findings: Iterable[Finding]) -> Literal["passed", "failed"]:
    return "failed" if failed(findings) else "passed"


RAIL_COLUMNS = ("provider", "tool", "node", "HCA", "port", "netdev", "link Gb/s",
                "measured Gb/s", "GB/s", "vs median", "GPUs near", "partner", "slow")


def rails_table(findings: Iterable[Finding], providers: Sequence[str] = (),
                title: str = "rails, one HCA at a time") -> Table:
    """The fleet step's rail tables (FLEET_RAILS' rows): every HCA measured on its own
    between partners (`tool`: ib_write_bw, or nccl-tests with NCCL_IB_HCA, each against
    the median rail of its own tool); a slow rail says so in its last column."""
    rows: list[tuple[Any, ...]] = []
    for f in findings:
        if f.code != "FLEET_RAILS" or (providers and f.provider not in providers):
            continue
        for r in f.details.get("rails") or []:
            ratio = r.get("ratio")
            rows.append((f.provider, f.details.get("tool") or "ib_write_bw", r.get("node"),
                         r.get("hca"), r.get("port"), r.get("netdev"), r.get("rate_gbps"),
                         round(float(r.get("gbps", 0)), 1), round(float(r.get("gbs", 0)), 2),
                         f"{ratio:.0%}" if isinstance(ratio, (int, float)) else "-",
                         ", ".join(r.get("gpus") or []) or "-",
                         f"{r.get('peer')}:{r.get('peer_hca')}", "SLOW" if r.get("slow") else ""))
    return Table(title, RAIL_COLUMNS, rows)
