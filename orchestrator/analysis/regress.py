"""Regression verdicts: is this run still what its baseline was?

Per series (provider, scope, engine, metric, message size) the run's samples
(rounds x nodes) are tested against the baseline's samples (rounds x nodes x
runs). Every p-value of the run, for all metrics, sizes, the provider and
each node, goes through one Benjamini-Hochberg correction, so a suite of
fifty numbers does not cry wolf at alpha fifty times. A change is called
only when it is significant after that correction AND at least the minimum
effect (3% by default): a 0.5% shift measured very precisely is real but not
what anyone schedules a vetting for.

The test is Mann-Whitney U by default, Welch's t on request. A run has few
samples (three rounds on a node), and BH looks far into the tail (alpha / m
for the first step): there Welch's approximate degrees of freedom make it
liberal. Measured on stationary Gaussian series, 20 tests per run, no
minimum effect: Welch flags 30% of runs with 3 samples of the run against 30,
8.5% with 6; Mann-Whitney 1.8% and 4.8% (tests/unit/test_regress.py). A run
with a single sample (one training run) is judged with a t prediction
interval from the baseline's spread, which is exact for normal noise.

Every verdict carries the change with its 95% confidence interval (Welch's,
on the difference of means, divided by the baseline mean) and the smallest
change these samples could have detected: power 0.8 at the threshold a lone
change must clear after the correction (alpha / m, the first BH step), from
the measured spread and counts (for Mann-Whitney scaled by its asymptotic
relative efficiency, and "none" when its smallest attainable p-value at these
counts is above that threshold). "UNCHANGED" with a detectable change of 40%
means the samples were too few or too noisy to say much.

A node is judged with the same test as its provider: its own samples against
the provider's baseline. A node that regressed while its provider's other
nodes did not is "node X regressed"; every node regressed is the provider.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pandas as pd
from scipy import stats

from orchestrator.analysis import frames
from orchestrator.analysis.baseline import (
    DEFAULT_LAST,
    METRICS,
    MIN_SIZE,
    BaselineSource,
    MachineClass,
    Sample,
    SeriesKey,
    band_for,
    resolve,
    sample_frame,
    to_samples,
)
from orchestrator.analysis.changepoint import detect
from orchestrator.errors import UsageError
from orchestrator.records import subject_key, subject_label
from orchestrator.verdicts import Table

if TYPE_CHECKING:
    from orchestrator.bands import Band

Verdict = Literal["REGRESSED", "IMPROVED", "UNCHANGED", "NOT ENOUGH DATA"]
TestName = Literal["welch", "mwu"]
TESTS: dict[str, TestName] = {"mwu": "mwu", "welch": "welch"}  # by the name a user types
VERDICT_ORDER: dict[Verdict, int] = {"NOT ENOUGH DATA": 0, "UNCHANGED": 1, "IMPROVED": 2,
                                     "REGRESSED": 3}
# Asymptotic relative efficiency of Mann-Whitney U to the t-test under normal noise.
MWU_ARE = 3 / math.pi
# A run with one sample (one training run) is judged against a baseline of at least this many.
PREDICTION_MIN_BASE = 3


@dataclass(frozen=True)
class Settings:
    test: TestName = "mwu"
    alpha: float = 0.05  # false discovery rate over all tests of a run
    min_effect: float = 0.03  # smallest relative change that is called
    power: float = 0.8  # for the minimum detectable change
    min_samples: int = 2  # on each side

    def __post_init__(self) -> None:
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha must be between 0 and 1, got {self.alpha}")
        if not 0 <= self.min_effect < 1:
            raise ValueError(f"the minimum effect must be between 0 and 1, got {self.min_effect}")
        if not 0 < self.power < 1:
            raise ValueError(f"power must be between 0 and 1, got {self.power}")
        if self.min_samples < 2:
            raise ValueError("a test needs at least 2 samples on each side")


@dataclass(frozen=True)
class Comparison:
    """One test: this run's samples against the baseline's."""

    verdict: Verdict
    reason: str
    n_base: int
    n_cur: int
    base_mean: float | None = None
    cur_mean: float | None = None
    change: float | None = None  # relative: cur / base - 1
    ci_low: float | None = None  # relative, 95%
    ci_high: float | None = None
    p: float | None = None
    q: float | None = None  # after Benjamini-Hochberg over the run
    mde: float | None = None  # smallest relative change these samples could call (>= min_effect)
    mde_stat: float | None = None  # the same from the statistics alone


@dataclass
class _Raw:
    base: np.ndarray
    cur: np.ndarray
    direction: int  # +1: higher is better; -1: lower is better
    p: float | None = None
    se: float = 0.0
    df: float = 0.0


def _welch(base: np.ndarray, cur: np.ndarray) -> tuple[float, float, float]:
    """(p, standard error of the difference, Welch-Satterthwaite df)."""
    nb, nc = len(base), len(cur)
    vb, vc = float(np.var(base, ddof=1)) / nb, float(np.var(cur, ddof=1)) / nc
    se = math.sqrt(vb + vc)
    diff = float(np.mean(cur) - np.mean(base))
    if se == 0:
        return (0.0 if diff else 1.0), 0.0, float(nb + nc - 2)
    df = (vb + vc) ** 2 / ((vb * vb / (nb - 1) if nb > 1 else 0) + (vc * vc / (nc - 1)
                                                                    if nc > 1 else 0))
    p = float(2 * stats.t.sf(abs(diff / se), df))
    return p, se, df


def _prediction(base: np.ndarray, value: float) -> tuple[float, float, float]:
    """One new value against the baseline: a t prediction interval (the run has the
    baseline's spread), which is Welch's test with the current variance taken as known."""
    nb = len(base)
    se = float(np.std(base, ddof=1)) * math.sqrt(1 + 1 / nb)
    diff = value - float(np.mean(base))
    if se == 0:
        return (0.0 if diff else 1.0), 0.0, float(nb - 1)
    return float(2 * stats.t.sf(abs(diff / se), nb - 1)), se, float(nb - 1)


def _enough(nb: int, nc: int, settings: Settings) -> bool:
    return (nb >= settings.min_samples and nc >= settings.min_samples) or (
        nc == 1 and nb >= max(PREDICTION_MIN_BASE, settings.min_samples))


def _mwu_p(base: np.ndarray, cur: np.ndarray) -> float:
    if np.ptp(np.concatenate([base, cur])) == 0:
        return 1.0
    return float(stats.mannwhitneyu(cur, base, alternative="two-sided").pvalue)


def _mwu_min_p(nb: int, nc: int) -> float:
    """The smallest two-sided p-value Mann-Whitney can give at these counts."""
    return min(1.0, 2 / math.comb(nb + nc, nb))


def bh(ps: Sequence[float]) -> list[float]:
    """Benjamini-Hochberg adjusted p-values (q), in the given order."""
    if not ps:
        return []
    return [float(q) for q in stats.false_discovery_control(np.asarray(ps, dtype=float),
                                                            method="bh")]


def compare_all(pairs: Sequence[tuple[Sequence[float], Sequence[float], int]],
                settings: Settings = Settings()) -> list[Comparison]:
    """Test every (baseline, current, direction) of one run, corrected together."""
    raws = [_Raw(np.asarray(b, dtype=float), np.asarray(c, dtype=float), d) for b, c, d in pairs]
    testable = [r for r in raws if _enough(len(r.base), len(r.cur), settings)
                and float(np.mean(r.base)) > 0]
    for r in testable:
        if len(r.cur) == 1:
            r.p, r.se, r.df = _prediction(r.base, float(r.cur[0]))
        else:
            r.p, r.se, r.df = _welch(r.base, r.cur)
            if settings.test == "mwu":
                r.p = _mwu_p(r.base, r.cur)
    qs = dict(zip(map(id, testable), bh([r.p for r in testable if r.p is not None]),
                  strict=True))
    m = max(1, len(testable))
    threshold = settings.alpha / m  # what a lone change must clear at BH's first step
    out = []
    for r in raws:
        nb, nc = len(r.base), len(r.cur)
        if id(r) not in qs:
            if not _enough(nb, nc, settings):
                why = (f"needs at least {settings.min_samples} samples on each side, or "
                       f"{PREDICTION_MIN_BASE} in the baseline against one "
                       f"(baseline {nb}, this run {nc})")
            else:
                why = "the baseline mean is not positive"
            out.append(Comparison("NOT ENOUGH DATA", why, nb, nc,
                                  base_mean=float(np.mean(r.base)) if nb else None,
                                  cur_mean=float(np.mean(r.cur)) if nc else None))
            continue
        bm, cm = float(np.mean(r.base)), float(np.mean(r.cur))
        change = cm / bm - 1
        tcrit = float(stats.t.ppf(1 - settings.alpha / 2, r.df)) if r.se else 0.0
        diff = cm - bm
        ci = ((diff - tcrit * r.se) / bm, (diff + tcrit * r.se) / bm)
        if r.se == 0:
            mde_stat = 0.0
        else:
            mde_stat = (float(stats.t.ppf(1 - threshold / 2, r.df))
                        + float(stats.t.ppf(settings.power, r.df))) * r.se / bm
        if settings.test == "mwu" and nc > 1:
            mde_stat = math.inf if _mwu_min_p(nb, nc) > threshold else mde_stat / math.sqrt(
                MWU_ARE)
        q = qs[id(r)]
        significant = q <= settings.alpha
        verdict: Verdict = "UNCHANGED"
        if significant and abs(change) >= settings.min_effect:
            verdict = "IMPROVED" if change * r.direction > 0 else "REGRESSED"
            why = f"{change:+.1%} is significant (q={q:.2g}) and at least {settings.min_effect:.0%}"
        elif significant:
            why = f"{change:+.1%} is significant (q={q:.2g}) but below the {settings.min_effect:.0%} " \
                  "minimum effect"
        else:
            why = f"{change:+.1%} is not significant (q={q:.2g})"
        out.append(Comparison(verdict, why, nb, nc, bm, cm, change, ci[0], ci[1], r.p, q,
                              max(mde_stat, settings.min_effect), mde_stat))
    return out


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
    could = f"; could have detected {min(mdes):.1%} to {max(mdes):.1%}" if mdes else ""
    if better:
        return ProviderVerdict(provider, "IMPROVED", "provider", (),
                               f"{len(better)} series improved, none regressed{could}")
    return ProviderVerdict(provider, "UNCHANGED", "none", (),
                           f"{len(judged)} test(s), no significant change of at least "
                           f"{min_effect:.0%}{could}")


def _change(c: Comparison) -> str:
    if c.change is None:
        return "(not tested)"
    ci = f" [{c.ci_low:+.1%}, {c.ci_high:+.1%}]" if c.ci_low is not None else ""
    return f"{c.change:+.1%}{ci}"


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
            raise UsageError(f"no run {run_id} under {root}",
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
            raise UsageError(f"no runs of provider {', '.join(unknown)} under {root}"
                             + (f" (providers: {', '.join(seen)})" if seen else ""))
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
    h = df[df["run_id"].isin(history)]
    h = h[h["suite_hash"] == suite_hash]
    keys = {s.key for s in to_samples(df[df["run_id"] == judged])}
    pos = {r: i for i, r in enumerate(history)}
    med = (h.groupby(["scope", "engine", "metric", "size_key", "span", "run_id"])["value"]
           .median().reset_index())
    out = []
    for (scope, engine, metric, size, span), g in med.groupby(
            ["scope", "engine", "metric", "size_key", "span"]):
        key = SeriesKey(str(df["provider"].iloc[0]), str(scope), str(engine), str(metric),
                        int(str(size)), str(span))
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
    if v is None:
        return None
    return "inf" if math.isinf(v) else f"{v:+.1%}"


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
        ci = None if c.ci_low is None else f"[{c.ci_low:+.1%}, {c.ci_high:+.1%}]"
        band = bands.get(r.key)
        shown = None if band is None else (f"{band[0].value:g} ({band[0].lower:g}-"
                                           f"{band[0].upper:g}, {band[1]})")
        mde = None if c.mde is None else ("none" if math.isinf(c.mde) else f"{c.mde:.1%}")
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
            "change_points": [{**asdict(s.key), "run_id": s.run_id, "started": s.started,
                               "before": s.before, "after": s.after, "change": s.change,
                               "history_runs": s.runs} for s in p.shifts],
            "bands": [{**asdict(k), "band": b.model_dump(), "source": src}
                      for k, (b, src) in p.bands.items()],
        } for p in ev.providers],
        "tests": [{"run_id": rep.run_id, **asdict(r.key), "subject": r.subject,
                   "series": r.key.label, **comp(r.result)}
                  for rep in ev.reports for r in rep.rows],
    }
