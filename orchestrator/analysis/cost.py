"""What a PoC cost, and what a useful unit of work costs, per provider.

The hourly price is not the answer: a platform is chosen on what a task costs
there. The PoC cost is the recipe's formula:

    gpu_hour x GPUs x measured hours (rounded up to the billing granularity)
    + persistent storage + data transfer
    + the failed attempts and reruns (runs of the provider in the same window)

Measured hours come from the runs' own timestamps (run.json started/finished).
The provider's useful runs are summed and rounded up once to the billing
granularity, as one rental would be billed; the failed attempts and reruns are
what rounding the useful and the wasted hours together adds on top. Storage is
the largest checkpoint kept for the length of the window; transfer is what came
back from the nodes (the runs' directories).

Amounts in different currencies are never added or compared unless a rate is
given; without one the tables keep each currency apart.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from orchestrator.errors import UsageError
from orchestrator.inventory import Pricing
from orchestrator.verdicts import Table

GRANULARITY_H = {"second": 1 / 3600, "minute": 1 / 60, "hour": 1.0, "day": 24.0,
                 "month": 730.0}
HOURS_PER_MONTH = 730.0  # 365 * 24 / 12, as cloud price sheets count a month


class NoPrice(UsageError):
    """A provider without a price cannot have a cost: say which and where to add it."""


def billed_hours(hours: float, granularity: str) -> float:
    """Hours rounded up to whole billing units (a started minute is a paid minute)."""
    unit = GRANULARITY_H[granularity]
    if hours <= 0:
        return 0.0
    # a float a hair above a whole unit (0.5000000001 h) is not another unit
    return math.ceil(round(hours / unit, 9)) * unit


def hours_between(started: str, finished: str | None) -> float:
    if not finished:
        return 0.0
    fmt = "%Y-%m-%dT%H:%M:%SZ"
    delta = datetime.strptime(finished, fmt) - datetime.strptime(started, fmt)
    return max(0.0, delta.total_seconds() / 3600)


def pricing_of(inventory_text: str, provider: str, source: str) -> Pricing | None:
    """The provider's pricing block from an inventory document (a run's copy or the file
    given with -i); None when the provider has none."""
    try:
        doc = YAML(typ="safe").load(inventory_text)
    except YAMLError as exc:
        raise UsageError(f"{source} is not readable YAML: {exc}") from None
    prov = ((doc or {}).get("providers") or {}).get(provider) if isinstance(doc, dict) else None
    block = prov.get("pricing") if isinstance(prov, dict) else None
    if block is None:
        return None
    try:
        return Pricing.model_validate(block)
    except ValidationError as exc:
        e = exc.errors()[0]
        raise UsageError(f"{source}: providers.{provider}.pricing."
                         f"{'.'.join(map(str, e['loc']))}: {e['msg']}") from None


def run_pricing(run_dir: Path, provider: str) -> Pricing | None:
    path = run_dir / "inventory.yaml"
    if not path.is_file():
        return None
    return pricing_of(path.read_text(encoding="utf-8"), provider, str(path))


@dataclass(frozen=True)
class PocCost:
    provider: str
    currency: str
    gpu_hour: float
    granularity: str
    gpus: int
    useful_hours: float  # measured, the provider's selected runs
    failed_hours: float  # measured, the other runs in the window
    billed_hours: float  # useful + failed, rounded up once
    compute: float  # the useful runs alone, rounded up
    reruns: float  # what the failed attempts and reruns added
    storage: float
    transfer: float

    @property
    def total(self) -> float:
        return self.compute + self.reruns + self.storage + self.transfer


def poc_cost(provider: str, pricing: Pricing, gpus: int, useful_hours: float,
             failed_hours: float = 0.0, storage_gb: float = 0.0, window_hours: float = 0.0,
             transfer_gb: float = 0.0) -> PocCost:
    g = pricing.billing_granularity
    useful = billed_hours(useful_hours, g)
    both = billed_hours(useful_hours + failed_hours, g)
    months = max(window_hours, useful_hours + failed_hours) / HOURS_PER_MONTH
    return PocCost(
        provider=provider, currency=pricing.currency, gpu_hour=pricing.gpu_hour, granularity=g,
        gpus=gpus, useful_hours=useful_hours, failed_hours=failed_hours, billed_hours=both,
        compute=pricing.gpu_hour * gpus * useful,
        reruns=pricing.gpu_hour * gpus * (both - useful),
        storage=(pricing.storage_gb_month or 0.0) * storage_gb * months,
        transfer=(pricing.egress_gb or 0.0) * transfer_gb)


@dataclass(frozen=True)
class UnitCost:
    provider: str
    currency: str
    per_1m_tokens: float | None  # training throughput at gpu_hour
    per_job_hour: float  # an hour of a job on the PoC's GPUs
    per_gpu_month: float | None  # node_month / GPUs per node: how rentals are quoted
    breakeven_hours: float | None  # hours per month above which the monthly price wins


def unit_cost(provider: str, pricing: Pricing, gpus: int, gpus_per_node: int | None,
              tokens_per_s_per_gpu: float | None) -> UnitCost:
    per_tokens = None
    if tokens_per_s_per_gpu and tokens_per_s_per_gpu > 0:
        per_tokens = pricing.gpu_hour / 3600 * 1e6 / tokens_per_s_per_gpu
    per_month = breakeven = None
    if pricing.node_month is not None and gpus_per_node:
        per_month = pricing.node_month / gpus_per_node
        breakeven = per_month / pricing.gpu_hour if pricing.gpu_hour > 0 else None
    return UnitCost(provider, pricing.currency, per_tokens, pricing.gpu_hour * gpus, per_month,
                    breakeven)


def convert(amount: float | None, currency: str, base: str,
            rates: Mapping[str, float]) -> float | None:
    """amount in `base`; None when no rate says how (never a silent 1:1)."""
    if amount is None:
        return None
    if currency == base:
        return amount
    if currency in rates:
        return amount * rates[currency]
    return None


def _money(v: float | None, cur: str) -> str:
    if v is None:
        return "-"
    return f"{v:,.4f} {cur}" if 0 < abs(v) < 1 else f"{v:,.2f} {cur}"


def cost_table(costs: Sequence[PocCost], rates: Mapping[str, float] | None = None) -> Table:
    """One row per provider, each in its own currency; the last column puts the totals
    in the first provider's currency only where a rate says how."""
    base = costs[0].currency if costs else "USD"
    rows = []
    for c in costs:
        conv = convert(c.total, c.currency, base, rates or {})
        rows.append((c.provider, f"{c.gpu_hour:g} {c.currency}/GPU-h per {c.granularity}",
                     c.gpus, round(c.useful_hours, 4), round(c.failed_hours, 4),
                     round(c.billed_hours, 4), _money(c.compute, c.currency),
                     _money(c.reruns, c.currency), _money(c.storage, c.currency),
                     _money(c.transfer, c.currency), _money(c.total, c.currency),
                     _money(conv, base) if conv is not None
                     else f"no {c.currency}->{base} rate: shown apart"))
    return Table("PoC cost", ("provider", "price", "GPUs", "useful h", "failed/rerun h",
                              "billed h", "compute", "failed attempts", "storage", "transfer",
                              "total", f"total in {base}"), rows)


def unit_table(units: Sequence[UnitCost]) -> Table:
    rows = []
    for u in units:
        if u.breakeven_hours is None:
            wins = "no monthly price"
        elif u.breakeven_hours >= HOURS_PER_MONTH:
            wins = "hourly always (monthly costs more than a full month of hours)"
        else:
            wins = f"monthly above {u.breakeven_hours:,.0f} h/month"
        rows.append((u.provider, _money(u.per_1m_tokens, u.currency),
                     _money(u.per_job_hour, u.currency), _money(u.per_gpu_month, u.currency),
                     wins))
    return Table("cost per useful unit", ("provider", "per 1M training tokens",
                                          "per hour of the job", "per GPU-month", "break-even"),
                 rows)


def currencies_apart(costs: Sequence[PocCost], rates: Mapping[str, float]) -> list[str]:
    """The currencies that cannot be put next to the first one (no rate given)."""
    if not costs:
        return []
    base = costs[0].currency
    return sorted({c.currency for c in costs if c.currency != base and c.currency not in rates})


def as_json(costs: Sequence[PocCost], units: Sequence[UnitCost]) -> dict[str, Any]:
    return {"poc": [{**c.__dict__, "total": c.total} for c in costs],
            "per_unit": [u.__dict__ for u in units]}
