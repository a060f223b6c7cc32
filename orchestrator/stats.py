"""Stability over rounds, and reference bands.

Three rounds with identical parameters are the acceptance recipe: a fabric
that gives 280 GB/s once and 150 the next is not ready for a long job, even
if its best round looks good. Per message size we keep median, min, max and
the coefficient of variation; a round more than the suite's tolerance below
the median is an unexplained drop.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.checks import model_matches
from payload.allreduce import parse_size

__all__ = ["Reference", "SizeStats", "find_reference", "parse_size", "shipped_references",
           "stability"]


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


class Reference(BaseModel):
    """A (value, lower, upper) band in GB/s, as ReFrame keeps reference values."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    value: float = Field(gt=0)
    lower: float = Field(ge=0)
    upper: float = Field(gt=0)
    gpu: str | None = None
    gpus: int | None = None
    nodes: int | None = None
    min_size: str = "128M"
    note: str | None = None

    @property
    def min_size_bytes(self) -> int:
        return parse_size(self.min_size)

    def verdict(self, measured: float) -> str:
        if measured < self.lower:
            return "below"
        if measured > self.upper:
            return "above"
        return "within"


@lru_cache(maxsize=1)
def shipped_references() -> tuple[Reference, ...]:
    from ruamel.yaml import YAML

    text = resources.files("orchestrator").joinpath("data/references.yaml").read_text()
    return tuple(Reference.model_validate(r) for r in YAML(typ="safe").load(text))


def find_reference(gpu_name: str, gpus: int, nodes: int) -> Reference | None:
    for ref in shipped_references():
        if (ref.gpu and model_matches(ref.gpu, gpu_name) and ref.gpus == gpus
                and ref.nodes == nodes):
            return ref
    return None
