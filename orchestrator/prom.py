"""A run's key figures and verdicts in the Prometheus text format, for node_exporter.

Scheduled runs are watched by whatever already watches the fleet: node_exporter's
textfile collector reads `*.prom` files from one directory at every scrape, so
alerting on "provider X regressed" or "busbw at 128 MiB fell below 300" needs no
new service. The collector may read at any moment: the file is written to a
temporary name in the same directory and renamed over the old one, so a scrape
sees the old file or the new one, never half of either.

The text is written by prometheus_client's exposition. Every name starts with
`gpuvet_` and ends in its base unit (`_bytes_per_second`, `_seconds`, `_ratio`;
busbw's GB/s become bytes per second), so no series carries a unit label; a
series names its provider and node once each (`node` empty for the provider as
a whole). Every family has HELP and TYPE lines (all gauges: each value
describes the latest run, none counts up forever). The run id is a label of
`gpuvet_run_info` only: on every other series it would start a new series at
every run.
"""

from __future__ import annotations

import calendar
import re
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily

from orchestrator.errors import UsageError
from orchestrator.store import atomic_write

if TYPE_CHECKING:
    from orchestrator.analysis.regress import Evaluation
    from orchestrator.records import Finding
    from orchestrator.store import RunMeta

NAME_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
LABEL_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
VERDICTS = ("REGRESSED", "IMPROVED", "UNCHANGED", "NOT ENOUGH DATA")


@dataclass
class Family:
    name: str
    help: str
    samples: list[tuple[dict[str, str], float]] = field(default_factory=list)
    type: str = "gauge"

    def add(self, value: float, **labels: object) -> None:
        self.samples.append(({k: str(v) for k, v in labels.items() if v is not None},
                             float(value)))


def check_path(path: Path, *, here: bool = True) -> Path:
    """Before a run starts: a file the textfile collector would never read is bad input
    (`here=False`: a path for a schedule, whose directory need not exist yet)."""
    if path.suffix != ".prom":
        raise UsageError(f"--prom-file {path}: node_exporter's textfile collector reads only "
                         "files ending in .prom", hint=f"use {path.with_suffix('.prom')}")
    if here and not path.parent.is_dir():
        raise UsageError(f"--prom-file {path}: no such directory {path.parent}",
                         hint="point it at node_exporter's --collector.textfile.directory")
    return path


def _check(families: Sequence[Family]) -> None:
    seen: set[str] = set()
    for fam in families:
        if not NAME_RE.match(fam.name) or not fam.name.startswith("gpuvet_"):
            raise ValueError(f"not a gpuvet metric name: {fam.name!r}")
        if fam.name in seen:
            raise ValueError(f"metric family {fam.name} given twice")
        seen.add(fam.name)
        for labels, _ in fam.samples:
            for k in labels:
                if not LABEL_RE.match(k) or k.startswith("__"):
                    raise ValueError(f"not a label name: {k!r}")


class _Families:
    """The families as a prometheus_client collector: its exposition writes the text."""

    def __init__(self, families: Sequence[Family]) -> None:
        self.families = families

    def collect(self) -> Iterator[Any]:
        for fam in self.families:
            keys = sorted({k for labels, _ in fam.samples for k in labels})
            g = GaugeMetricFamily(fam.name, fam.help, labels=keys)
            for labels, value in fam.samples:
                g.add_metric([labels.get(k, "") for k in keys], value)
            yield g


def render(families: Iterable[Family]) -> str:
    """The text exposition format (version 0.0.4), written by prometheus_client."""
    fams = list(families)
    _check(fams)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(fams))
    return generate_latest(registry).decode("utf-8")


def write(path: Path, families: Iterable[Family]) -> None:
    atomic_write(path, render(families), mode=0o644)


def _epoch(ts: str | None) -> float | None:
    if not ts:
        return None
    try:
        return float(calendar.timegm(time.strptime(ts, "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return None


def run_families(meta: RunMeta, findings: Sequence[Finding]) -> list[Family]:
    """What one run did: its identity, times, status, and findings counted by severity."""
    info = Family("gpuvet_run_info", "The run these figures come from (value is always 1).")
    info.add(1, run_id=meta.run_id, command=meta.command, suite_hash=meta.suite_hash,
             status=meta.status)
    fams = [info]
    started, finished = _epoch(meta.started), _epoch(meta.finished)
    if started is not None:
        f = Family("gpuvet_run_start_timestamp_seconds", "When the run started (Unix time).")
        f.add(started)
        fams.append(f)
        if finished is not None:
            d = Family("gpuvet_run_duration_seconds", "Wall time of the run.")
            d.add(finished - started)
            fams.append(d)
    ok = Family("gpuvet_run_success", "1 when no finding of the run FAILed, else 0.")
    ok.add(0 if any(f.severity == "FAIL" for f in findings) else 1)
    fams.append(ok)
    counts: dict[tuple[str, str], int] = {}
    for fd in findings:
        counts[(fd.provider, fd.severity)] = counts.get((fd.provider, fd.severity), 0) + 1
    c = Family("gpuvet_findings", "Findings of the run by provider and severity.")
    for prov in sorted({p for p, _ in counts}):
        for sev in ("FAIL", "WARN", "PASS", "INFO"):
            c.add(counts.get((prov, sev), 0), provider=prov, severity=sev)
    fams.append(c)
    return fams


def regress_families(ev: Evaluation) -> list[Family]:
    """Verdicts per provider (one-hot over the four), nodes that regressed alone, and per
    series this run's mean, the baseline's, the change and the smallest detectable change."""
    verdict = Family("gpuvet_regress_verdict",
                     "Regression verdict per provider: 1 for the verdict it got, 0 for the "
                     "others.")
    regressed = Family("gpuvet_regress_regressed", "1 when the provider regressed, else 0.")
    node = Family("gpuvet_regress_node_regressed",
                  "1 for each node that regressed while its provider's other nodes did not.")
    base_runs = Family("gpuvet_regress_baseline_runs", "Runs in the baseline a run was judged "
                       "against (0: no baseline).")
    for p in ev.providers:
        for v in VERDICTS:
            verdict.add(1 if p.verdict.verdict == v else 0, provider=p.provider, verdict=v)
        regressed.add(1 if p.verdict.verdict == "REGRESSED" else 0, provider=p.provider)
        for n in p.verdict.nodes:
            node.add(1, provider=p.provider, node=n)
        base_runs.add(len(p.source.runs) if p.source else 0, provider=p.provider)
    change = Family("gpuvet_series_change_ratio", "This run against the baseline: mean / "
                    "baseline mean - 1.")
    mde = Family("gpuvet_series_min_detectable_ratio",
                 "Smallest relative change these samples could have called (power 0.8).")
    series_verdict = Family("gpuvet_series_regressed", "1 when this series regressed, else 0.")
    means: dict[str, tuple[Family, Family]] = {}
    for rep in ev.reports:
        for r in rep.rows:
            labels: Mapping[str, object] = {
                "provider": r.key.provider, "node": r.node, "metric": r.key.metric,
                "scope": r.key.scope, "engine": r.key.engine, "span": r.key.span,
                "size_bytes": r.key.size if r.key.size >= 0 else None,
                "collective": r.key.collective or None}
            suffix, factor = base_unit(r.key.metric)
            if suffix not in means:
                means[suffix] = (
                    Family(f"gpuvet_series_mean_{suffix}",
                           f"This run's mean of a series, in {suffix.replace('_', ' ')}."),
                    Family(f"gpuvet_series_baseline_mean_{suffix}",
                           f"The baseline's mean of a series, in {suffix.replace('_', ' ')}."))
            cur, base = means[suffix]
            c = r.result
            if c.cur_mean is not None:
                cur.add(c.cur_mean * factor, **labels)
            if c.base_mean is not None:
                base.add(c.base_mean * factor, **labels)
            if c.change is not None:
                change.add(c.change, **labels)
            if c.mde is not None:
                mde.add(c.mde, **labels)
            series_verdict.add(1 if c.verdict == "REGRESSED" else 0, **labels)
    return [verdict, regressed, node, base_runs,
            *(f for pair in sorted(means.items()) for f in pair[1]), change, mde,
            series_verdict]


# a measurement's unit -> the metric name's base-unit suffix and the factor into it
# (Prometheus names carry their unit; values are in base units: bytes, seconds)
UNITS = {"GB/s": ("bytes_per_second", 1e9), "s": ("seconds", 1.0), "ratio": ("ratio", 1.0),
         "tokens/s": ("tokens_per_second", 1.0), "bytes": ("bytes", 1.0),
         "steps": ("steps", 1.0)}
METRIC_UNITS = {"busbw": "GB/s", "algbw": "GB/s", "time_us": "us", "step_time_s": "s",
                "step_time_p90_s": "s", "mfu": "ratio", "tokens_per_s_per_gpu": "tokens/s",
                "tokens_per_s_per_rank": "tokens/s", "ckpt_save_s": "s", "ckpt_load_s": "s",
                "ckpt_write_gbs": "GB/s", "restart_s": "s", "deterministic_step_time_s": "s",
                "deterministic_tokens_per_s_per_gpu": "tokens/s", "deterministic_mfu": "ratio",
                "steps_lost": "steps"}


def base_unit(metric: str) -> tuple[str, float]:
    """The base-unit suffix of a metric's family and the factor its values take."""
    unit = METRIC_UNITS.get(metric)
    if unit == "us":
        return "seconds", 1e-6
    if unit in UNITS:
        return UNITS[unit]
    if metric.endswith("_bytes"):
        return "bytes", 1.0
    return "value", 1.0


def written_family() -> Family:
    f = Family("gpuvet_textfile_written_timestamp_seconds",
               "When gpuvet wrote this file (Unix time): a stale file means the timer stopped.")
    f.add(time.time())
    return f
