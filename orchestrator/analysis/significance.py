"""Significance: one run's samples against its baseline's, corrected together.

Every p-value of a run, for all metrics, sizes, the provider and each node,
goes through one Benjamini-Hochberg correction, so a suite of fifty numbers
does not cry wolf at alpha fifty times. A change is called only when it is
significant after that correction AND at least the minimum effect (3% by
default): a 0.5% shift measured very precisely is real but not what anyone
schedules a vetting for.

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
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

Verdict = Literal["REGRESSED", "IMPROVED", "UNCHANGED", "NOT ENOUGH DATA"]
TestName = Literal["welch", "mwu"]
TESTS: dict[str, TestName] = {"mwu": "mwu", "welch": "welch"}  # by the name a user types
VERDICT_ORDER: dict[Verdict, int] = {"NOT ENOUGH DATA": 0, "UNCHANGED": 1, "IMPROVED": 2,
                                     "REGRESSED": 3}
# Asymptotic relative efficiency of Mann-Whitney U to the t-test under normal noise.
MWU_ARE = 3 / math.pi
# A run with one sample (one training run) is judged against a baseline of at least this many.
PREDICTION_MIN_BASE = 3


def _stats() -> Any:
    """scipy.stats, loaded when a test is computed: importing it takes 1-2 s, which
    `gpuvet pipeline` would otherwise spend before its first node is contacted."""
    from scipy import stats  # seconds to import; --help and the SSH commands never need it

    return stats


def preload() -> None:
    """Load scipy.stats now, on a thread of the caller's choosing."""
    _stats()


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
    p = float(2 * _stats().t.sf(abs(diff / se), df))
    return p, se, df


def _prediction(base: np.ndarray, value: float) -> tuple[float, float, float]:
    """One new value against the baseline: a t prediction interval (the run has the
    baseline's spread), which is Welch's test with the current variance taken as known."""
    nb = len(base)
    se = float(np.std(base, ddof=1)) * math.sqrt(1 + 1 / nb)
    diff = value - float(np.mean(base))
    if se == 0:
        return (0.0 if diff else 1.0), 0.0, float(nb - 1)
    return float(2 * _stats().t.sf(abs(diff / se), nb - 1)), se, float(nb - 1)


def _enough(nb: int, nc: int, settings: Settings) -> bool:
    return (nb >= settings.min_samples and nc >= settings.min_samples) or (
        nc == 1 and nb >= max(PREDICTION_MIN_BASE, settings.min_samples))


def _mwu_p(base: np.ndarray, cur: np.ndarray) -> float:
    if np.ptp(np.concatenate([base, cur])) == 0:
        return 1.0
    return float(_stats().mannwhitneyu(cur, base, alternative="two-sided").pvalue)


def _mwu_min_p(nb: int, nc: int) -> float:
    """The smallest two-sided p-value Mann-Whitney can give at these counts."""
    return min(1.0, 2 / math.comb(nb + nc, nb))


def bh(ps: Sequence[float]) -> list[float]:
    """Benjamini-Hochberg adjusted p-values (q), in the given order."""
    if not ps:
        return []
    return [float(q) for q in _stats().false_discovery_control(np.asarray(ps, dtype=float),
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
        tcrit = float(_stats().t.ppf(1 - settings.alpha / 2, r.df)) if r.se else 0.0
        diff = cm - bm
        ci = ((diff - tcrit * r.se) / bm, (diff + tcrit * r.se) / bm)
        if r.se == 0:
            mde_stat = 0.0
        else:
            mde_stat = (float(_stats().t.ppf(1 - threshold / 2, r.df))
                        + float(_stats().t.ppf(settings.power, r.df))) * r.se / bm
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
