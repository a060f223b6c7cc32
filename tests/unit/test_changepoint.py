"""Change points over a run history: found where they are, not where they are not."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.analysis import changepoint


@pytest.mark.parametrize("n", [8, 12, 30, 200])
def test_stationary_histories_rarely_show_a_change(n: int) -> None:
    """The penalty's calibration: at most 5% of stationary histories at 2% cv show any
    change (fixed seeds, so the rate is a measured number, not a hope)."""
    seeds = 600
    alarms = sum(bool(changepoint.detect(np.random.default_rng(s).normal(100, 2, n)))
                 for s in range(seeds))
    assert alarms / seeds <= 0.05, f"{alarms} of {seeds} stationary histories of {n} runs"


def test_a_step_change_is_placed_at_the_run_where_it_happened() -> None:
    x = np.random.default_rng(7).normal(300, 6, 30)  # 2% cv
    x[18:] *= 0.90
    (shift,) = changepoint.detect(x, min_effect=0.03)
    assert shift.index == 18
    assert shift.change == pytest.approx(-0.10, abs=0.02)
    assert shift.before == pytest.approx(300, rel=0.02)
    placed = 0
    for s in range(200):
        y = np.random.default_rng(1000 + s).normal(300, 6, 30)
        y[18:] *= 0.90
        found = changepoint.detect(y, min_effect=0.03)
        placed += len(found) == 1 and found[0].index == 18
    assert placed >= 190, placed


def test_two_steps_are_both_found_in_order() -> None:
    x = np.random.default_rng(3).normal(100, 1, 60)
    x[20:] *= 0.9
    x[40:] *= 0.9
    found = changepoint.detect(x)
    assert [f.index for f in found] == [20, 40]
    assert all(f.change < -0.08 for f in found)


def test_a_slow_drift_is_caught_and_adds_up() -> None:
    """8% lost over 60 runs, a fraction of a percent per run: no two neighbours differ
    by more than the noise, and still the history has moved."""
    rng = np.random.default_rng(11)
    x = 100 * np.linspace(1.0, 0.92, 60) * rng.normal(1, 0.005, 60)
    found = changepoint.detect(x, min_effect=0.01)
    assert found
    total = changepoint.drift(x, found)
    assert total is not None and total == pytest.approx(-0.07, abs=0.025)


def test_small_changes_below_the_minimum_effect_are_not_reported() -> None:
    x = np.random.default_rng(5).normal(100, 0.2, 40)
    x[20:] *= 0.99  # real (5 sd) but 1%
    assert [f.index for f in changepoint.detect(x)] == [20]
    assert changepoint.detect(x, min_effect=0.03) == []


def test_short_flat_or_broken_histories_give_nothing() -> None:
    assert changepoint.detect([1.0] * 5) == []
    assert changepoint.detect([5.0] * 40) == []
    assert changepoint.detect([1.0, 2.0] * 3) == []
    assert changepoint.detect([1.0] * 10 + [float("nan")] + [1.0] * 10) == []
    assert changepoint.drift([1.0], []) is None


def test_noise_estimate_ignores_a_level_shift() -> None:
    x = np.random.default_rng(2).normal(0, 1, 400)
    x[200:] += 50
    assert changepoint.noise_sigma(x) == pytest.approx(1.0, rel=0.15)


def test_a_change_in_the_last_runs_is_placed_there() -> None:
    """The search keeps three runs a side; a change it finds is then placed to the run
    (not two runs early, which would mix the old level into the new one)."""
    for seed in range(20):
        x = np.random.default_rng(seed).normal(300, 3, 20)
        x[18:] *= 0.85
        (shift,) = changepoint.detect(x)
        assert shift.index == 18 and shift.change == pytest.approx(-0.15, abs=0.02)
