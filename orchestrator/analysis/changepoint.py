"""When did a series shift, and by how much: change points over a run history.

A regression test compares one run with its baseline; a slow drift (a
fabric degrading over weeks, a noisy neighbour moving in) can stay inside
every week-to-week test and still add up. Change-point detection looks at
the whole history of one series (one value per run: the median of its
samples) and marks the runs where its mean moved.

Method: PELT with the least-squares (l2) cost, which is exact where binary
segmentation is greedy, through ruptures' `KernelCPD(kernel="linear")`: the
same cost and search as `Pelt(model="l2")` in compiled code (1,000 runs in
about a millisecond, against seconds for the pure-Python `Pelt`). The series
is standardised by a noise estimate that a shift does not inflate (the median
absolute deviation of successive differences), and the penalty per change is
`PENALTY_BASE + PENALTY_PER_LOG_N * ln(n) + PENALTY_SMALL_N / n`: the BIC-like
log term for long histories, the last term because the noise estimate of a
short history is itself noisy. The constants were calibrated on stationary
Gaussian series of 8 to 1,000 runs so that at most 5% of them show any change
(tests/unit/test_changepoint.py checks it over seeds; the figures are in
docs/benchmarks.md). A change smaller than the
minimum effect is not reported: it is noise the regression test would not
call either.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

PENALTY_BASE = 10.0
PENALTY_PER_LOG_N = 2.0
PENALTY_SMALL_N = 60.0
MIN_SEGMENT = 3  # runs on each side of a change
MIN_RUNS = 2 * MIN_SEGMENT + 2  # fewer runs than this cannot place a change reliably


@dataclass(frozen=True)
class Shift:
    """The mean of the series moved at `index` (the first run of the new level)."""

    index: int
    before: float  # mean of the segment that ends here
    after: float  # mean of the segment that starts here

    @property
    def change(self) -> float:
        """Relative change, after / before - 1."""
        return self.after / self.before - 1 if self.before else math.inf


def noise_sigma(values: np.ndarray) -> float:
    """Robust noise of a series that may contain level shifts.

    Successive differences cancel the level; a shift spoils one difference,
    which the median ignores. 1.4826 makes MAD a standard deviation for
    Gaussian noise; the difference of two values has sqrt(2) times the noise.
    """
    if len(values) < 3:
        return 0.0
    d = np.diff(values)
    mad = float(np.median(np.abs(d - np.median(d))))
    return 1.4826 * mad / math.sqrt(2)


def preload() -> None:
    """Load ruptures (and the scipy.stats it imports) now, on a thread of the caller's
    choosing: `gpuvet pipeline` does it while the training step runs."""
    import ruptures  # noqa: F401  # seconds to import (scipy.stats); loaded ahead


def penalty(n: int) -> float:
    return PENALTY_BASE + PENALTY_PER_LOG_N * math.log(n) + PENALTY_SMALL_N / n


def detect(values: Sequence[float], *, min_effect: float = 0.0) -> list[Shift]:
    """Change points of a series, oldest first; empty when it is too short or flat."""
    x = np.asarray(values, dtype=float)
    if len(x) < MIN_RUNS or not np.all(np.isfinite(x)):
        return []
    sigma = noise_sigma(x)
    if sigma <= 0:
        sigma = float(np.std(x))
        if sigma <= 0:
            return []
    z = ((x - np.median(x)) / sigma).reshape(-1, 1)
    import ruptures  # loads scipy.stats: seconds; only the regression verdict needs it

    ends = ruptures.KernelCPD(kernel="linear", min_size=MIN_SEGMENT).fit(z).predict(
        pen=penalty(len(x)))
    bounds = _refine([0, *(int(e) for e in ends)], x)
    means = [float(np.mean(x[a:b])) for a, b in zip(bounds, bounds[1:], strict=False)]
    shifts = [Shift(bounds[i], means[i - 1], means[i]) for i in range(1, len(means))]
    return [s for s in shifts if abs(s.change) >= min_effect]


def _refine(bounds: list[int], x: np.ndarray) -> list[int]:
    """Place each change at the best split between its neighbours, down to one run.

    The search keeps MIN_SEGMENT runs on each side so that noise does not make
    changes; that also means a change in the last two runs would be placed up to
    two runs early, mixing old and new level. Once a change is found, its place
    is the split of the two neighbouring segments with the least squared error,
    whatever their length.
    """
    out = list(bounds)
    for i in range(1, len(out) - 1):
        a, b = out[i - 1], out[i + 1]
        best, cost = out[i], math.inf
        for j in range(a + 1, b):
            left, right = x[a:j], x[j:b]
            c = float(((left - left.mean()) ** 2).sum() + ((right - right.mean()) ** 2).sum())
            if c < cost:
                best, cost = j, c
        out[i] = best
    return out


def drift(values: Sequence[float], shifts: Sequence[Shift]) -> float | None:
    """Level of the last segment against the first: what several small steps add up to."""
    if not shifts:
        return None
    first, last = shifts[0].before, shifts[-1].after
    return last / first - 1 if first else None
