"""Stability over rounds.

Three rounds with identical parameters are the acceptance recipe: a fabric
that gives 280 GB/s once and 150 the next is not ready for a long job, even
if its best round looks good. Per message size we keep median, min, max and
the coefficient of variation; a round more than the suite's tolerance below
the median is an unexplained drop.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from payload.allreduce import parse_size

__all__ = ["SizeStats", "parse_size", "stability"]


@dataclass(frozen=True)
class SizeStats:
    size_bytes: int
    values: tuple[float, ...]  # busbw per round, in round order
    median: float
    min: float
    max: float
    cv: float  # stdev / mean; 0 with fewer than two rounds

    def drops(self, tolerance: float) -> list[int]:
        """1-based rounds below the median by more than `tolerance` (a fraction)."""
        if self.median <= 0:
            return []
        return [i + 1 for i, v in enumerate(self.values) if v < self.median * (1 - tolerance)]


def stability(rounds: list[dict[int, float]]) -> list[SizeStats]:
    """rounds: one {size: busbw} per round -> stats per size present in every round."""
    if not rounds:
        return []
    common = sorted(set.intersection(*(set(r) for r in rounds)))
    out = []
    for size in common:
        vals = tuple(r[size] for r in rounds)
        mean = statistics.fmean(vals)
        cv = statistics.stdev(vals) / mean if len(vals) > 1 and mean > 0 else 0.0
        out.append(SizeStats(size, vals, statistics.median(vals), min(vals), max(vals), cv))
    return out
