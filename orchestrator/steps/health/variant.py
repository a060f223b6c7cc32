"""Which variant a GPU's measurements fit, whatever its name says, and whether the
order's need for FP8 can be met.

A 40 GB A100 that reports the 80 GB name still runs its memory at HBM2 speed, still
has 40 GB and usually still sits at its 250 W or 400 W limit: each measurement is
compared with what each variant of the datasheet would give (its datasheet figure
times the shipped achievable fraction), the differences taken as ratios on a log
scale and weighted, and the nearest variant named, with the runner-up and how far
each was. Compute capability, where known, only keeps variants of the same chip
(8.0 is GA100, 8.6 the other Amperes, 8.9 Ada, 9.0 Hopper); a GPU that ran FP8
products is not a variant without FP8.

Pure functions: the datasheet is passed in (the shipped one by default).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from orchestrator import gpunames
from orchestrator.steps.health.datasheet import Datasheet, Variant, shipped

FP8_MIN_CC = (8, 9)
# nvidia-smi's memory.total as a share of the datasheet's GB (ECC and the driver's
# reserve: an A100 80GB shows 80 GiB, an H200 141GB 140.4 GiB, an L40S 48GB 45 GiB)
REPORTED_MEMORY = 0.97
WEIGHTS = {"memory": 3.0, "memory_gbps": 2.0, "power_limit_w": 1.0, "bf16_tflops": 1.0,
           "fp64_tflops": 1.0}


def fp8_supported(cc: tuple[int, int] | None) -> bool | None:
    """FP8 tensor cores: compute capability 8.9 (Ada) or more (Hopper, Blackwell)."""
    if cc is None:
        return None
    return tuple(cc) >= FP8_MIN_CC


def fp8_problem(needs_fp8: bool | None, cc: tuple[int, int] | None) -> str | None:
    """Why an order that needs FP8 cannot have it on this GPU; None when it can, when it
    does not need it, or when the compute capability is unknown (nothing to judge yet)."""
    if not needs_fp8 or cc is None or fp8_supported(cc):
        return None
    return (f"compute capability {cc[0]}.{cc[1]}: FP8 needs {FP8_MIN_CC[0]}.{FP8_MIN_CC[1]} or "
            "more (Ada, Hopper), and the order needs FP8")


@dataclass(frozen=True)
class Measured:
    """What the health step measured on one GPU (None: not measured)."""

    memory_mib: float | None = None  # memory.total as nvidia-smi reports it
    copy_gbps: float | None = None  # device copy, bytes read plus written
    read_gbps: float | None = None  # read-only pass
    power_limit_w: float | None = None  # the enforced limit
    bf16_tflops: float | None = None  # burst
    fp64_tflops: float | None = None
    fp8_ran: bool | None = None  # FP8 products ran
    cc: tuple[int, int] | None = None


@dataclass(frozen=True)
class Term:
    metric: str
    value: float
    expected: float  # what this variant would give
    ratio: float  # value / expected
    weight: float

    @property
    def cost(self) -> float:
        return self.weight * math.log(self.ratio) ** 2


@dataclass(frozen=True)
class Fit:
    variant: Variant
    terms: tuple[Term, ...]

    @property
    def distance(self) -> float:
        return math.sqrt(sum(t.cost for t in self.terms) / max(1.0, sum(t.weight
                                                                        for t in self.terms)))


@dataclass(frozen=True)
class Naming:
    best: Fit | None
    runner_up: Fit | None
    text: str
    ordered: Variant | None = None
    candidates: tuple[str, ...] = field(default=())
    allowed: tuple[str, ...] = field(default=())  # the variants the order allows

    @property
    def matches_order(self) -> bool | None:
        if self.best is None or not self.allowed:
            return None
        return self.best.variant.name in self.allowed


def _terms(m: Measured, v: Variant) -> list[Term]:
    out: list[Term] = []
    f = v.achievable

    def add(metric: str, value: float | None, expected: float | None) -> None:
        if value is not None and value > 0 and expected:
            out.append(Term(metric, value, expected, value / expected, WEIGHTS[metric]))

    add("memory", m.memory_mib / 1024 if m.memory_mib else None, v.memory_gb * REPORTED_MEMORY)
    if m.read_gbps:
        add("memory_gbps", m.read_gbps, v.memory_gbps * f.memory_read)
    elif m.copy_gbps:
        add("memory_gbps", m.copy_gbps, v.memory_gbps * f.memory_copy)
    add("power_limit_w", m.power_limit_w, v.tdp_w)
    bf16 = v.peak("bf16")
    add("bf16_tflops", m.bf16_tflops, bf16 * f.bf16 if bf16 else None)
    fp64 = v.peak("fp64")
    add("fp64_tflops", m.fp64_tflops, fp64 * f.fp64 if fp64 else None)
    return out


def name_variant(m: Measured, ordered: str | None = None,
                 sheet: Datasheet | None = None) -> Naming:
    """The datasheet variant these measurements fit best, and a line that says so."""
    sheet = sheet or shipped()
    want = sheet.for_name(ordered, order=True) if ordered else None
    allowed = tuple(c.name for c in gpunames.place(ordered).cards
                    if sheet.variant(c.name) is not None) if ordered else ()
    candidates = list(sheet.variants)
    if m.cc is not None:
        candidates = [v for v in candidates if v.cc == tuple(m.cc)]
    if m.fp8_ran:
        candidates = [v for v in candidates if v.fp8]
    fits = sorted((Fit(v, tuple(_terms(m, v))) for v in candidates),
                  key=lambda f: (f.distance, f.variant.name))
    fits = [f for f in fits if f.terms]
    if not fits:
        return Naming(best=None, runner_up=None, ordered=want,
                      text="measures like no variant in the datasheet: nothing comparable "
                      "was measured", candidates=tuple(v.name for v in candidates),
                      allowed=allowed)
    best = fits[0]
    return Naming(best=best, runner_up=fits[1] if len(fits) > 1 else None, ordered=want,
                  text=describe(best, m), candidates=tuple(v.name for v in candidates),
                  allowed=allowed)


def describe(fit: Fit, m: Measured) -> str:
    """`measures like A100 40 GB PCIe: 1.49 TB/s memory, 40 GiB, 250 W limit`."""
    parts = []
    if m.read_gbps:
        parts.append(f"{m.read_gbps / 1000:.2f} TB/s memory read")
    elif m.copy_gbps:
        parts.append(f"{m.copy_gbps / 1000:.2f} TB/s memory copy")
    if m.memory_mib:
        parts.append(f"{m.memory_mib / 1024:.0f} GiB")
    if m.power_limit_w:
        parts.append(f"{m.power_limit_w:.0f} W limit")
    if m.bf16_tflops:
        parts.append(f"{m.bf16_tflops:.0f} TFLOP/s bf16")
    return f"measures like {fit.variant.name}: " + ", ".join(parts)
