"""Regression verdicts: is this run still what its baseline was?

Per series (provider, scope, engine, metric, message size) the run's samples
(rounds x nodes) are tested against the baseline's samples (rounds x nodes x
runs), all of a run's tests corrected together (`significance.py`: the test,
the Benjamini-Hochberg correction, the minimum effect, the confidence interval
and the smallest detectable change).

A node is judged with the same test as its provider: its own samples against
the provider's baseline. A node that regressed while its provider's other
nodes did not is "node X regressed"; every node regressed is the provider.
The change points of each judged series' history come from `changepoint.py`,
the reference bands beside them from `baseline.py`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pandas as pd

from orchestrator.analysis import changepoint, frames, significance
from orchestrator.analysis.baseline import (
    DEFAULT_LAST,
    METRICS,
    MIN_SIZE,
    BaselineSource,
    MachineClass,
    Sample,
    SeriesKey,
    band_for,
    human_size,
    resolve,
    sample_frame,
    to_samples,
)
from orchestrator.analysis.changepoint import detect
from orchestrator.analysis.significance import (
    Comparison,
    Settings,
    Verdict,
    compare_all,
)
from orchestrator.errors import UsageError, did_you_mean, shown
from orchestrator.records import subject_key, subject_label
from orchestrator.verdicts import Table


def preload() -> None:
    """The libraries the verdict's statistics load late (ruptures, scipy.stats: seconds),
    loaded now: `gpuvet pipeline` calls it on a thread while the training step runs, so
    the verdict starts at once when the last step ends."""
    changepoint.preload()
    significance.preload()

if TYPE_CHECKING:
    from orchestrator.bands import Band

# --- verdicts per series, per node, per provider -------------------------------------------

@dataclass(frozen=True)
class Row:
    """A verdict about one node, or the provider as a whole, in one series."""

    key: SeriesKey
    node: str | None  # None: the provider (key.provider) as a whole
    result: Comparison

    @property
    def is_node(self) -> bool:
        return self.node is not None

    @property
    def subject(self) -> str:  # the key of --json and Prometheus output
        return subject_key(self.key.provider, self.node)

    @property
    def label(self) -> str:  # as tables show it
        return subject_label(self.key.provider, self.node)


@dataclass(frozen=True)
class ProviderVerdict:
    provider: str
    verdict: Verdict
    attribution: Literal["provider", "node", "none"]
    nodes: tuple[str, ...]  # the nodes that regressed alone
    summary: str


@dataclass
class Report:
    run_id: str
    settings: Settings
    rows: list[Row] = field(default_factory=list)
    providers: list[ProviderVerdict] = field(default_factory=list)

    @property
    def regressed(self) -> bool:
        return any(p.verdict == "REGRESSED" for p in self.providers)


def judge(run_id: str, current: Sequence[Sample], baseline: Sequence[Sample],
          settings: Settings = Settings(), providers: Sequence[str] = ()) -> Report:
    """Test every series of the run, and each node in its single-node series."""
    base_by_key: dict[SeriesKey, list[float]] = {}
    for s in baseline:
        base_by_key.setdefault(s.key, []).append(s.value)
    cur_by_key: dict[SeriesKey, list[Sample]] = {}
    for s in current:
        cur_by_key.setdefault(s.key, []).append(s)
    plan: list[tuple[SeriesKey, str | None, list[float], list[float]]] = []
    for key in sorted(cur_by_key):
        samples = cur_by_key[key]
        base = base_by_key.get(key, [])
        plan.append((key, None, base, [s.value for s in samples]))
        nodes = sorted({s.node for s in samples if s.node is not None})
        if key.span == "single" and len(nodes) > 1:
            for n in nodes:
                plan.append((key, n, base, [s.value for s in samples if s.node == n]))
    results = compare_all([(b, c, METRICS.get(k.metric, 1)) for k, _, b, c in plan], settings)
    report = Report(run_id, settings, [Row(k, node, r) for (k, node, _, _), r in
                                       zip(plan, results, strict=True)])
    wanted = list(dict.fromkeys([*providers, *(k.provider for k in cur_by_key)]))
    report.providers = [provider_verdict(p, [r for r in report.rows if r.key.provider == p],
                                         settings.min_effect) for p in wanted]
    return report


def provider_verdict(provider: str, rows: Sequence[Row], min_effect: float = 0.03
                     ) -> ProviderVerdict:
    """One verdict per provider, telling a lone node apart from the provider as a whole."""
    judged = [r for r in rows if r.result.verdict != "NOT ENOUGH DATA"]
    if not judged:
        why = rows[0].result.reason if rows else "no comparable measurements in this run"
        return ProviderVerdict(provider, "NOT ENOUGH DATA", "none", (), why)
    lone: set[str] = set()
    whole: list[Row] = []
    for key in dict.fromkeys(r.key for r in rows):
        series = [r for r in rows if r.key == key]
        node_rows = [r for r in series if r.is_node]
        bad = {r.node for r in node_rows if r.node is not None and r.result.verdict == "REGRESSED"}
        prov_row = next(r for r in series if not r.is_node)
        if bad and len(bad) < len(node_rows):
            lone |= bad
        elif bad or prov_row.result.verdict == "REGRESSED":
            whole.append(prov_row)
    if whole:
        worst = min(whole, key=lambda r: (r.result.change or 0) * METRICS.get(r.key.metric, 1))
        extra = f"; nodes {', '.join(sorted(lone))} also alone" if lone else ""
        return ProviderVerdict(provider, "REGRESSED", "provider", tuple(sorted(lone)),
                               f"provider {provider} regressed as a whole in {len(whole)} "
                               f"series, worst {worst.key.label} {_change(worst.result)}{extra}")
    if lone:
        bad_rows = [r for r in rows if r.node in lone and r.result.verdict == "REGRESSED"]
        worst = min(bad_rows, key=lambda r: (r.result.change or 0) * METRICS.get(r.key.metric, 1))
        names = ", ".join(sorted(lone))
        return ProviderVerdict(provider, "REGRESSED", "node", tuple(sorted(lone)),
                               f"node{'s' if len(lone) > 1 else ''} {names} regressed alone (the "
                               f"provider's other nodes did not), worst {worst.node} "
                               f"{worst.key.label} {_change(worst.result)}")
    better = [r for r in judged if r.result.verdict == "IMPROVED"]
    mdes = [r.result.mde for r in judged if not r.is_node and r.result.mde is not None]
    could = _could(mdes)
    if better:
        return ProviderVerdict(provider, "IMPROVED", "provider", (),
                               f"{len(better)} series improved, none regressed{could}")
    return ProviderVerdict(provider, "UNCHANGED", "none", (),
                           f"{len(judged)} test(s), no significant change of at least "
                           f"{min_effect:.0%}{could}")


def _could(mdes: Sequence[float]) -> str:
    """What the tests could have seen: the range of their smallest detectable changes; a
    test whose samples are too few to ever reach significance (an infinite one) is counted,
    never printed as "inf%"."""
    finite = [m for m in mdes if math.isfinite(m)]
    blind = len(mdes) - len(finite)
    parts = []
    if finite:
        lo, hi = min(finite), max(finite)
        parts.append(f"could have detected {lo:.1%}" + (f" to {hi:.1%}" if hi != lo else ""))
    if blind:
        parts.append(f"{blind} test(s) with too few samples to detect any change")
    return "".join(f"; {p}" for p in parts)


def _signed(v: float | None) -> str:
    """A relative change as a percentage; one from or to nothing (infinite, undefined) is
    "n/a", never "inf%" or "nan%"."""
    return f"{v:+.1%}" if v is not None and math.isfinite(v) else "n/a"


def _change(c: Comparison) -> str:
    if c.change is None:
        return "(not tested)"
    ci = f" [{_signed(c.ci_low)}, {_signed(c.ci_high)}]" if c.ci_low is not None else ""
    return f"{_signed(c.change)}{ci}"


# --- a run (or the latest per provider) against its baseline, from the store ---------------

@dataclass(frozen=True)
class ShiftRow:
    """A change point in a series' history: its level moved at `run_id`."""

    key: SeriesKey
    run_id: str
    started: str
    before: float
    after: float
    change: float
    runs: int  # length of the history looked at


@dataclass
class ProviderEvaluation:
    provider: str
    run_id: str | None
    source: BaselineSource | None
    verdict: ProviderVerdict
    shifts: list[ShiftRow] = field(default_factory=list)
    bands: dict[SeriesKey, tuple[Band, str]] = field(default_factory=dict)


@dataclass
class Evaluation:
    settings: Settings
    reports: list[Report]
    providers: list[ProviderEvaluation]

    @property
    def regressed(self) -> bool:
        return any(p.verdict.verdict == "REGRESSED" for p in self.providers)

    @property
    def rows(self) -> list[Row]:
        return [r for rep in self.reports for r in rep.rows]


def evaluate(root: Path, run_id: str | None = None, providers: Sequence[str] = (), *,
             settings: Settings = Settings(), last: int = DEFAULT_LAST,
             min_size: int = MIN_SIZE) -> Evaluation:
    """Judge `run_id` (default: each provider's latest measured run) against its baseline.

    Raises UsageError for a run or provider that is not in the store; a provider
    without baseline data is NOT ENOUGH DATA, not an error.
    """
    runs = frames.runs(root)
    if run_id is not None:
        if run_id not in set(runs["run_id"]):
            raise UsageError(f"no run {shown(run_id)} under {root}"
                             f"{did_you_mean(run_id, runs['run_id'])}",
                             hint=f"see `gpuvet runs --results {root}`")
        in_run = list(runs.loc[runs["run_id"] == run_id, "providers"].iloc[0])
        unknown = [p for p in providers if p not in in_run]
        if unknown:
            raise UsageError(f"run {run_id} has no provider {', '.join(unknown)} (it has "
                             f"{', '.join(in_run) or 'none'})")
        wanted = list(providers) or in_run
    else:
        seen = list(dict.fromkeys(p for ps in runs["providers"] for p in ps))
        unknown = [p for p in providers if p not in seen]
        if unknown:
            raise UsageError(f"no runs of provider "
                             f"{', '.join(shown(p) + did_you_mean(p, seen) for p in unknown)}"
                             f" under {root}" + (f" (providers: {', '.join(seen)})" if seen else ""))
        wanted = list(providers) or seen
    if not wanted:
        raise UsageError(f"no runs under {root} to judge")
    order = list(runs["run_id"])
    finished = set(runs.loc[runs["status"].isin(["passed", "failed"]), "run_id"])
    started = dict(zip(runs["run_id"], runs["started"], strict=True))
    per_run: dict[str, list[tuple[str, list[Sample], list[Sample], BaselineSource | None,
                                  pd.DataFrame]]] = {}
    evals: dict[str, ProviderEvaluation] = {}
    for p in wanted:
        df = sample_frame(root, p, min_size=min_size)
        judged = run_id
        if judged is None:  # the latest run that measured something and is not still running
            have = set(df["run_id"]) - set(runs.loc[runs["status"] == "running", "run_id"])
            judged = next((r for r in reversed(order) if r in have), None)
        if judged is None or judged not in set(df["run_id"]):
            why = ("no comparable measurements in this run" if judged else
                   "no measured run of this provider")
            largest = frames.largest_size(root, p, "busbw", run_id)
            if largest is not None and largest < min_size:  # measured, all below --min-size
                why = (f"no busbw measured at or above --min-size {human_size(min_size)} (the "
                       f"largest message size measured is {human_size(largest)}): lower "
                       "--min-size to judge smaller sizes")
            evals[p] = ProviderEvaluation(p, judged, None,
                                          ProviderVerdict(p, "NOT ENOUGH DATA", "none", (), why))
            continue
        source = resolve(root, p, judged, df, runs, last)
        cur = to_samples(df[df["run_id"] == judged])
        # a run is never its own baseline (a set made from runs that include it)
        base = to_samples(df[df["run_id"].isin(source.runs) & (df["run_id"] != judged)])
        per_run.setdefault(judged, []).append((p, cur, base, source, df))
        history = [r for r in order[:order.index(judged) + 1]
                   if r in finished or r == judged]
        evals[p] = ProviderEvaluation(p, judged, source, ProviderVerdict(p, "NOT ENOUGH DATA",
                                                                         "none", (), ""),
                                      _shifts(df, judged, history, source.suite_hash, started,
                                              settings.min_effect),
                                      _bands(root, judged, p, {s.key for s in cur},
                                             source.machine, df))
    reports = []
    for judged, parts in per_run.items():
        rep = judge(judged, [s for _, c, _, _, _ in parts for s in c],
                    [s for _, _, b, _, _ in parts for s in b], settings,
                    [p for p, *_ in parts])
        reports.append(rep)
        for pv in rep.providers:
            ev = evals[pv.provider]
            if not ev.source or not ev.source.runs:
                why = ev.source.describe if ev.source else pv.summary
                pv = ProviderVerdict(pv.provider, "NOT ENOUGH DATA", "none", (),
                                     f"no baseline: {why}")
            ev.verdict = pv
    return Evaluation(settings, reports, [evals[p] for p in wanted])


def _shifts(df: pd.DataFrame, judged: str, history: list[str], suite_hash: str,
            started: dict[str, str], min_effect: float) -> list[ShiftRow]:
    """Change points of each of the judged run's series over the provider's history."""
    if "collective" not in df.columns:
        df = df.assign(collective="")
    h = df[df["run_id"].isin(history)]
    h = h[h["suite_hash"] == suite_hash]
    keys = {s.key for s in to_samples(df[df["run_id"] == judged])}
    pos = {r: i for i, r in enumerate(history)}
    med = (h.groupby(["scope", "engine", "metric", "size_key", "span", "collective",
                      "run_id"])["value"].median().reset_index())
    out = []
    for (scope, engine, metric, size, span, coll), g in med.groupby(
            ["scope", "engine", "metric", "size_key", "span", "collective"]):
        key = SeriesKey(str(df["provider"].iloc[0]), str(scope), str(engine), str(metric),
                        int(str(size)), str(span), str(coll))
        if key not in keys:
            continue
        g = g.assign(pos=g["run_id"].map(pos)).sort_values("pos")
        ids, values = list(g["run_id"]), list(g["value"])
        for s in detect(values, min_effect=min_effect):
            r = ids[s.index]
            out.append(ShiftRow(key, r, started.get(r, ""), s.before, s.after, s.change,
                                len(values)))
    return sorted(out, key=lambda s: (s.key, s.started))


def _bands(root: Path, run_id: str, provider: str, keys: set[SeriesKey], machine: MachineClass,
           df: pd.DataFrame) -> dict[SeriesKey, tuple[Band, str]]:
    out: dict[SeriesKey, tuple[Band, str]] = {}
    for key in keys:
        nodes = 1
        if key.span == "multi":
            rows = df[(df["run_id"] == run_id) & (df["scope"] == key.scope)]
            nodes = max((len(str(n).split(",")) for n in rows["nodes"]), default=1)
        found = band_for(root, run_id, provider, key, machine, nodes)
        if found is not None:
            out[key] = found
    return out


# --- rows for the terminal, --json and reports ------------------------------------------------

def _pct(v: float | None) -> str | None:
    return None if v is None else _signed(v)


def _num(v: float | None) -> float | None:
    return None if v is None else float(f"{v:.4g}")


def verdict_table(ev: Evaluation) -> Table:
    rows = [(p.provider, p.run_id, p.source.describe if p.source else None, p.verdict.verdict,
             p.verdict.attribution if p.verdict.verdict == "REGRESSED" else None,
             p.verdict.summary) for p in ev.providers]
    return Table("regression verdict per provider",
                 ("provider", "run", "baseline", "verdict", "who", "summary"), rows)


def tests_table(ev: Evaluation, verbose: bool = False) -> Table:
    """Provider rows always; a node's row when it says something, or with -v."""
    bands = {k: b for p in ev.providers for k, b in p.bands.items()}
    rows = []
    for r in sorted(ev.rows, key=lambda r: (r.key, r.is_node, r.node or "")):
        c = r.result
        if r.is_node and not verbose and c.verdict in ("UNCHANGED", "NOT ENOUGH DATA"):
            continue
        ci = None if c.ci_low is None else f"[{_signed(c.ci_low)}, {_signed(c.ci_high)}]"
        band = bands.get(r.key)
        shown = None if band is None else (f"{band[0].value:g} ({band[0].lower:g}-"
                                           f"{band[0].upper:g}, {band[1]})")
        mde = None if c.mde is None else ("none" if not math.isfinite(c.mde) else f"{c.mde:.1%}")
        rows.append((r.key.provider, r.label, r.key.label, c.verdict, _pct(c.change), ci,
                     None if c.q is None else float(f"{c.q:.2g}"), mde,
                     f"{c.n_cur}/{c.n_base}", _num(c.base_mean), _num(c.cur_mean), shown))
    return Table(f"regression tests ({ev.settings.test}, FDR {ev.settings.alpha:g}, minimum "
                 f"effect {ev.settings.min_effect:.0%})",
                 ("provider", "subject", "series", "verdict", "change", "95% CI", "q",
                  "detectable", "n run/base", "baseline", "this run", "band"), rows)


def shifts_table(ev: Evaluation) -> Table:
    rows = [(p.provider, s.key.label, s.run_id, s.started, _num(s.before), _num(s.after),
             _pct(s.change)) for p in ev.providers for s in p.shifts]
    return Table("change points in the history (PELT, l2)",
                 ("provider", "series", "from run", "started", "before", "after", "change"),
                 rows)


def as_json(ev: Evaluation) -> dict[str, Any]:
    def comp(c: Comparison) -> dict[str, Any]:
        d = asdict(c)
        return {k: (None if isinstance(v, float) and math.isinf(v) else v)
                for k, v in d.items()}

    return {
        "settings": asdict(ev.settings),
        "regressed": ev.regressed,
        "providers": [{
            "provider": p.provider, "run_id": p.run_id, "verdict": p.verdict.verdict,
            "attribution": p.verdict.attribution, "nodes": list(p.verdict.nodes),
            "summary": p.verdict.summary,
            "baseline": None if p.source is None else {
                "kind": p.source.kind, "runs": list(p.source.runs),
                "suite_hash": p.source.suite_hash, "gpu_model": p.source.machine.gpu_model,
                "gpu_count": p.source.machine.gpu_count, "set_at": p.source.set_at,
                "set_by": p.source.set_by, "how": p.source.how,
                "left_out": list(p.source.left_out)},
            "change_points": [{**s.key.as_json(), "run_id": s.run_id, "started": s.started,
                               "before": s.before, "after": s.after, "change": s.change,
                               "history_runs": s.runs} for s in p.shifts],
            "bands": [{**k.as_json(), "band": b.model_dump(), "source": src}
                      for k, (b, src) in p.bands.items()],
        } for p in ev.providers],
        "tests": [{"run_id": rep.run_id, **r.key.as_json(), "subject": r.subject,
                   "series": r.key.label, **comp(r.result)}
                  for rep in ev.reports for r in rep.rows],
    }
