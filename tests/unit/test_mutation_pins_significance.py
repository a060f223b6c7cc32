"""Exact values for the statistics of `regress` (orchestrator/analysis/significance.py),
written for the mutants `make mutation` found surviving the seeded tests of
test_regress.py. Each pins one decision on numbers worked out by hand."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from scipy import stats

from orchestrator.analysis.significance import Settings, bh, compare_all


def test_bh_adjusts_in_the_given_order() -> None:
    # sorted 0.01, 0.03, 0.04 (m = 3): 0.03, min(0.045, 0.04) = 0.04, 0.04
    assert bh([0.04, 0.01, 0.03]) == pytest.approx([0.04, 0.03, 0.04])
    assert bh([]) == []


@pytest.mark.parametrize("bad, message", [
    ({"alpha": 0.0}, "alpha must be between 0 and 1, got 0.0"),
    ({"alpha": 1.0}, "alpha must be between 0 and 1, got 1.0"),
    ({"min_effect": -0.01}, "the minimum effect must be between 0 and 1, got -0.01"),
    ({"min_effect": 1.0}, "the minimum effect must be between 0 and 1, got 1.0"),
    ({"power": 1.0}, "power must be between 0 and 1, got 1.0"),
    ({"power": 0.0}, "power must be between 0 and 1, got 0.0"),
    ({"min_samples": 1}, "a test needs at least 2 samples on each side")])
def test_settings_out_of_range_are_refused(bad: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as exc:
        Settings(**bad)
    assert str(exc.value) == message
    Settings(min_effect=0.0, min_samples=2)  # the lowest allowed


# --- each test's numbers, against scipy and the formulas the module's docstring states ------

BASE = [100.0, 102.0, 98.0, 101.0, 99.0, 100.5]
CUR = [95.0, 96.5, 94.0, 95.5]


def _welch_by_hand(base: list[float], cur: list[float]) -> tuple[float, float, float]:
    b, c = np.asarray(base), np.asarray(cur)
    vb, vc = b.var(ddof=1) / len(b), c.var(ddof=1) / len(c)
    se = math.sqrt(vb + vc)
    df = (vb + vc) ** 2 / (vb ** 2 / (len(b) - 1) + vc ** 2 / (len(c) - 1))
    return float(stats.ttest_ind(c, b, equal_var=False).pvalue), se, df


def test_welch_p_interval_and_detectable_change_are_the_stated_formulas() -> None:
    s = Settings(test="welch")
    (c,) = compare_all([(BASE, CUR, 1)], s)
    p, se, df = _welch_by_hand(BASE, CUR)
    bm, cm = float(np.mean(BASE)), float(np.mean(CUR))
    assert (c.n_base, c.n_cur, c.base_mean, c.cur_mean) == (6, 4, bm, cm)
    assert c.p == pytest.approx(p, rel=1e-9) and c.q == c.p  # one test: q = p
    assert c.change == pytest.approx(cm / bm - 1, rel=1e-12)
    t = stats.t.ppf(0.975, df)
    assert c.ci_low == pytest.approx((cm - bm - t * se) / bm, rel=1e-9)
    assert c.ci_high == pytest.approx((cm - bm + t * se) / bm, rel=1e-9)
    mde = (stats.t.ppf(1 - 0.05 / 2, df) + stats.t.ppf(0.8, df)) * se / bm
    assert c.mde_stat == pytest.approx(mde, rel=1e-9)
    assert c.mde == pytest.approx(max(mde, 0.03), rel=1e-9)
    assert c.verdict == "REGRESSED"
    assert c.reason == f"{c.change:+.1%} is significant (q={c.q:.2g}) and at least 3%"


def test_the_interval_follows_alpha_and_the_detectable_change_follows_power_and_m() -> None:
    (c1,) = compare_all([(BASE, CUR, 1)], Settings(test="welch", alpha=0.1, power=0.9))
    _, se, df = _welch_by_hand(BASE, CUR)
    bm = float(np.mean(BASE))
    t = stats.t.ppf(0.95, df)
    assert c1.ci_high - c1.ci_low == pytest.approx(2 * t * se / bm, rel=1e-9)
    # two testable series and one that is not: the threshold is alpha / 2
    c2, _, _ = compare_all([(BASE, CUR, 1), (BASE, BASE, 1), ([1.0], [1.0], 1)],
                           Settings(test="welch", alpha=0.1, power=0.9))
    mde = (stats.t.ppf(1 - 0.1 / 2 / 2, df) + stats.t.ppf(0.9, df)) * se / bm
    assert c2.mde_stat == pytest.approx(mde, rel=1e-9)


def test_mann_whitney_p_and_its_detectable_change() -> None:
    (c,) = compare_all([(BASE, CUR, 1)])
    assert c.p == pytest.approx(float(stats.mannwhitneyu(CUR, BASE,
                                                         alternative="two-sided").pvalue))
    _, se, df = _welch_by_hand(BASE, CUR)
    bm = float(np.mean(BASE))
    welch = (stats.t.ppf(1 - 0.05 / 2, df) + stats.t.ppf(0.8, df)) * se / bm
    assert c.mde_stat == pytest.approx(welch / math.sqrt(3 / math.pi), rel=1e-9)
    # 4 against 6: the smallest p is 2 / C(10, 4) = 1/105, below alpha: detectable;
    # with 20 series judged together the threshold is 0.0025: nothing is
    many = compare_all([(BASE, CUR, 1)] * 20)
    assert many[0].mde is not None and math.isinf(many[0].mde)


def test_identical_samples_are_unchanged_and_a_constant_shift_is_called() -> None:
    for test in ("mwu", "welch"):
        s = Settings(test="mwu" if test == "mwu" else "welch")
        (same,) = compare_all([([5.0, 5.0, 5.0], [5.0, 5.0], 1)], s)
        assert same.p == 1.0 and same.verdict == "UNCHANGED" and same.mde_stat in (0.0, math.inf)
    (up,) = compare_all([([5.0, 5.0, 5.0], [6.0, 6.0], 1)], Settings(test="welch"))
    assert up.p == 0.0 and up.verdict == "IMPROVED" and up.mde_stat == 0.0
    assert (up.ci_low, up.ci_high) == pytest.approx((0.2, 0.2))


def test_one_sample_against_the_baseline_is_a_prediction_interval() -> None:
    base = [0.420, 0.424, 0.418, 0.421, 0.423]
    (c,) = compare_all([(base, [0.43], -1)])
    sd = float(np.std(base, ddof=1)) * math.sqrt(1 + 1 / 5)
    p = 2 * stats.t.sf(abs(0.43 - float(np.mean(base))) / sd, 4)
    assert c.p == pytest.approx(p, rel=1e-9) and c.n_cur == 1
    t = stats.t.ppf(0.975, 4)
    assert c.ci_high - c.ci_low == pytest.approx(2 * t * sd / float(np.mean(base)), rel=1e-9)
    assert not math.isinf(c.mde or 0)  # the Mann-Whitney limit is not applied to one sample
    (flat,) = compare_all([([2.0, 2.0, 2.0], [2.0], 1)])
    assert flat.p == 1.0 and flat.verdict == "UNCHANGED"
    (off,) = compare_all([([2.0, 2.0, 2.0], [1.0], 1)])
    assert off.p == 0.0 and off.verdict == "REGRESSED"
    assert (off.ci_low, off.ci_high, off.mde_stat) == (-0.5, -0.5, 0.0)  # no spread: no width


@pytest.mark.parametrize("nb, nc, min_samples, enough", [
    (2, 2, 2, True), (1, 2, 2, False), (2, 1, 2, False), (3, 1, 2, True), (4, 4, 4, True),
    (3, 4, 4, False), (4, 3, 4, False), (3, 1, 4, False), (4, 1, 4, True), (2, 0, 2, False),
    (0, 2, 2, False)])
def test_how_many_samples_a_test_needs(nb: int, nc: int, min_samples: int, enough: bool
                                       ) -> None:
    base = [100.0 + k for k in range(nb)]
    cur = [50.0 + k for k in range(nc)]
    (c,) = compare_all([(base, cur, 1)], Settings(min_samples=min_samples))
    assert (c.verdict != "NOT ENOUGH DATA") is enough, c
    if not enough:
        assert c.reason == (f"needs at least {min_samples} samples on each side, or "
                            f"3 in the baseline against one (baseline {nb}, this run {nc})")
        assert c.base_mean == (float(np.mean(base)) if nb else None)
        assert c.cur_mean == (float(np.mean(cur)) if nc else None)
        assert (c.n_base, c.n_cur, c.p, c.q, c.change) == (nb, nc, None, None, None)


def test_a_baseline_mean_that_is_not_positive_is_not_tested() -> None:
    for base in ([0.0, 0.0, 0.0], [-1.0, -2.0, -3.0]):
        (c,) = compare_all([(base, [1.0, 2.0], 1)])
        assert c.verdict == "NOT ENOUGH DATA" and c.reason == "the baseline mean is not positive"
        assert c.base_mean == float(np.mean(base)) and c.cur_mean == 1.5


def test_only_the_tested_series_are_corrected_together() -> None:
    """q values come from one BH over the tested series only, in their order; a series
    without enough data takes no share of alpha."""
    rs = compare_all([(BASE, CUR, 1), ([1.0], [2.0], 1), (BASE, [100.0, 101.0, 99.5], 1)],
                     Settings(test="welch"))
    ps = [rs[0].p, rs[2].p]
    assert rs[1].q is None
    assert [rs[0].q, rs[2].q] == pytest.approx(bh([p for p in ps if p is not None]))


def test_a_significant_change_below_the_minimum_effect_says_so() -> None:
    base = [100.0, 100.1, 99.9, 100.05, 99.95, 100.0]
    cur = [99.0, 99.1, 98.9, 99.05]
    (c,) = compare_all([(base, cur, 1)], Settings(test="welch"))
    assert c.verdict == "UNCHANGED"
    assert c.reason == (f"{c.change:+.1%} is significant (q={c.q:.2g}) but below the 3% "
                        "minimum effect")
    (n,) = compare_all([(base, [99.0, 101.0], 1)], Settings(test="welch"))
    assert n.reason == f"{n.change:+.1%} is not significant (q={n.q:.2g})"


def test_direction_decides_improved_or_regressed() -> None:
    lower, higher = compare_all([(BASE, CUR, -1), ([c * 0.9 for c in BASE], BASE, 1)])
    assert lower.verdict == "IMPROVED" and higher.verdict == "IMPROVED"
    assert compare_all([(BASE, CUR, 1)])[0].verdict == "REGRESSED"


def test_mann_whitney_smallest_p() -> None:
    from orchestrator.analysis.significance import _mwu_min_p

    assert _mwu_min_p(3, 3) == 0.1 and _mwu_min_p(1, 1) == 1.0 and _mwu_min_p(4, 6) == 2 / 210


def test_welch_with_two_on_each_side_and_a_standard_error_of_exactly_one() -> None:
    s = Settings(test="welch")
    (c,) = compare_all([([99.0, 101.0], [90.0, 93.0], 1)], s)
    p, se, df = _welch_by_hand([99.0, 101.0], [90.0, 93.0])
    assert c.p == pytest.approx(p, rel=1e-9)
    t = stats.t.ppf(0.975, df)
    assert c.ci_high - c.ci_low == pytest.approx(2 * t * se / 100, rel=1e-9)
    # base variance 2 over 2 samples, none in the run: se is exactly 1, df 1
    (one,) = compare_all([([9.0, 11.0], [10.0, 10.0], 1)], s)
    assert one.p == pytest.approx(1.0) and one.verdict == "UNCHANGED"
    assert one.mde_stat == pytest.approx((stats.t.ppf(0.975, 1) + stats.t.ppf(0.8, 1)) / 10)
    (off,) = compare_all([([9.0, 11.0], [14.0, 14.0], 1)], s)
    assert off.p == pytest.approx(2 * stats.t.sf(4.0, 1)) and off.change == pytest.approx(0.4)


def test_mann_whitney_with_a_range_of_exactly_one_is_tested() -> None:
    """Only samples that are all equal skip the test (p = 1)."""
    (c,) = compare_all([([10.0] * 6, [11.0] * 4, 1)])
    p = float(stats.mannwhitneyu([11.0] * 4, [10.0] * 6, alternative="two-sided").pvalue)
    assert c.p == p < 0.05 and c.verdict == "IMPROVED"


def test_the_mann_whitney_limit_at_and_around_the_threshold() -> None:
    """Three against three: the smallest p (0.1) equal to alpha is still detectable; two
    in the run against six (2 / 28) is not at alpha 0.05."""
    (at,) = compare_all([([1.0, 1.1, 1.2], [0.5, 0.6, 0.7], 1)], Settings(alpha=0.1))
    assert at.mde is not None and not math.isinf(at.mde)
    (two,) = compare_all([(BASE, [95.0, 96.0], 1)])
    assert two.mde is not None and math.isinf(two.mde)


def test_the_prediction_intervals_detectable_change() -> None:
    base = [0.420, 0.424, 0.418, 0.421, 0.423]
    (c,) = compare_all([(base, [0.43], -1)])
    sd = float(np.std(base, ddof=1)) * math.sqrt(1 + 1 / 5)
    mde = (stats.t.ppf(1 - 0.05 / 2, 4) + stats.t.ppf(0.8, 4)) * sd / float(np.mean(base))
    assert c.mde_stat == pytest.approx(mde, rel=1e-9)
    assert c.change == pytest.approx(0.43 / float(np.mean(base)) - 1)
    assert c.cur_mean == 0.43 and c.base_mean == pytest.approx(float(np.mean(base)))
