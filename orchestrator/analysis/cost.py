"""What a PoC cost, and what a useful unit of work costs, per provider.

The hourly price is not the answer: a platform is chosen on what a task costs
there. The PoC cost is the acceptance recipe's formula:

    gpu_hour x GPUs x actual hours (rounded up to the billing granularity)
    + persistent storage + data transfer + failed attempts and reruns

A rental bills the instance's time, not only the minutes gpuvet's own steps
ran, so the hours are counted over a window, each named with where it came
from (`analysis/billing.py` finds them in the store): "gpuvet's steps" (the
runs' own timestamps), "instance up since boot" (the nodes' boot time), "billed
since" (`pricing.billed_since` or `--billed-since`), an imported PoC folder's
own window (checked-at.txt or file times), or `--hours`/`--window`. The useful
hours and the failed attempts' are rounded up once together, as one rental is
billed; the "failed attempts" column is what the attempts add on top.

Cost is never a gate: a provider without a price is compared like any other,
its cost cells say "not priced", and an unpriced storage or transfer term is
"not priced" too, never a 0.00 inside a total. Amounts in different currencies
are never added or compared unless a rate is given.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from orchestrator.errors import UsageError
from orchestrator.gpunames import model_matches
from orchestrator.inventory import Pricing
from orchestrator.verdicts import Table

GRANULARITY_H = {"second": 1 / 3600, "minute": 1 / 60, "hour": 1.0, "day": 24.0,
                 "month": 730.0}
HOURS_PER_MONTH = 730.0  # 365 * 24 / 12, as cloud price sheets count a month
NOT_PRICED = ("not priced (add pricing: {gpu_hour: ..., currency: ...} to the provider in "
              "the inventory and pass it with -i)")
# the acceptance recipe's sources: an A100 80G server card rents for 3000-4500 CNY a month
REFERENCES = (("A100 80GB", "A100 80G", 3000.0, 4500.0, "CNY"),)


def billed_hours(hours: float, granularity: str) -> float:
    """Hours rounded up to whole billing units (a started minute is a paid minute)."""
    unit = GRANULARITY_H[granularity]
    if hours <= 0:
        return 0.0
    # a float a hair above a whole unit (0.5000000001 h) is not another unit
    return math.ceil(round(hours / unit, 9)) * unit


def parse_time(value: str) -> datetime:
    """An ISO 8601 time (`2026-01-02T03:04:05Z`, `+08:00`, `date -Iseconds`) in UTC; a time
    without a zone is UTC, as run times are recorded."""
    try:
        t = datetime.fromisoformat(value.strip().replace("Z", "+00:00").replace(",", "."))
    except ValueError:
        raise UsageError(f"{value!r} is not a date and time",
                         hint="use ISO 8601, e.g. 2026-01-02T03:04:05Z or "
                              "2026-01-02T11:04:05+08:00") from None
    return t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t.astimezone(timezone.utc)


def hours_between(started: str | None, finished: str | None) -> float:
    if not started or not finished:
        return 0.0
    return max(0.0, (parse_time(finished) - parse_time(started)).total_seconds() / 3600)


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


def price_words(pricing: Pricing | None) -> str:
    """The price as people say it: "2.49 USD per GPU-hour, billed per second"."""
    if pricing is None:
        return NOT_PRICED
    return (f"{pricing.gpu_hour:g} {pricing.currency} per GPU-hour, billed per "
            f"{pricing.billing_granularity}")


def run_inventory(run_dir: Path) -> dict[str, Any] | None:
    """A run's inventory copy as plain data; None where it has none or it is unreadable."""
    path = run_dir / "inventory.yaml"
    try:
        doc = YAML(typ="safe").load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, YAMLError):
        return None
    return doc if isinstance(doc, dict) else None


def run_pricing(run_dir: Path, provider: str) -> Pricing | None:
    path = run_dir / "inventory.yaml"
    if not path.is_file():
        return None
    return pricing_of(path.read_text(encoding="utf-8"), provider, str(path))


@dataclass(frozen=True)
class Window:
    """The hours a rental is billed over, and where they came from."""

    name: str  # "gpuvet's steps", "instance up since boot", "billed since", ...
    hours: float | None  # None: not known (the cost says why, never 0)
    source: str
    failed_hours: float = 0.0  # inside `hours`: the failed attempts and reruns
    attempts: int = 0  # how many of them


@dataclass(frozen=True)
class Term:
    """One added term of the bill (storage, transfer): None when not priced."""

    amount: float | None
    source: str


@dataclass(frozen=True)
class PocCost:
    provider: str
    pricing: Pricing | None
    gpus: int | None
    window: Window
    billed_hours: float | None  # the window rounded up once
    compute: float | None  # the useful hours alone, rounded up
    reruns: float | None  # what the failed attempts and reruns added
    storage: Term
    transfer: Term
    why: str | None = None  # why there is no compute figure

    @property
    def currency(self) -> str | None:
        return self.pricing.currency if self.pricing else None

    @property
    def total(self) -> float | None:
        """The priced terms added; None when the compute itself is not priced."""
        if self.compute is None or self.reruns is None:
            return None
        return self.compute + self.reruns + sum(t.amount for t in (self.storage, self.transfer)
                                                if t.amount is not None)

    @property
    def unpriced(self) -> list[str]:
        return [n for n, t in (("storage", self.storage), ("transfer", self.transfer))
                if t.amount is None]


def storage_term(pricing: Pricing | None, ckpt_gb: float | None, window_hours: float | None
                 ) -> Term:
    """Checkpoint (measured) and dataset (inventory) bytes x the stated retention (or the
    window) x storage_gb_month."""
    if pricing is None or pricing.storage_gb_month is None:
        return Term(None, "not priced (no pricing.storage_gb_month)")
    parts = []
    gb = 0.0
    if ckpt_gb:
        gb += ckpt_gb
        parts.append(f"checkpoint {ckpt_gb:.3g} GB (measured)")
    if pricing.dataset_gb:
        gb += pricing.dataset_gb
        parts.append(f"dataset {pricing.dataset_gb:g} GB (pricing.dataset_gb)")
    if pricing.retention_days is not None:
        hours, kept = pricing.retention_days * 24, f"{pricing.retention_days:g} days " \
                                                    "(pricing.retention_days)"
    elif window_hours is not None:
        hours, kept = window_hours, f"the window's {window_hours:.3g} h (no retention stated)"
    else:
        return Term(None, "not priced: no retention stated and no window known")
    if not parts:
        return Term(0.0, "nothing kept: no checkpoint measured, no pricing.dataset_gb")
    return Term(pricing.storage_gb_month * gb * hours / HOURS_PER_MONTH,
                f"{' + '.join(parts)} x {pricing.storage_gb_month:g}/GB-month x {kept}")


def transfer_term(pricing: Pricing | None) -> Term:
    """Dataset and model downloads named in the inventory x egress_gb (gpuvet's own result
    files are not the rental's traffic)."""
    if pricing is None or pricing.egress_gb is None:
        return Term(None, "not priced (no pricing.egress_gb)")
    named = [(n, v) for n, v in (("dataset", pricing.dataset_gb),
                                 ("downloads", pricing.download_gb)) if v]
    if not named:
        return Term(0.0, "no transfer named (pricing.dataset_gb, pricing.download_gb)")
    gb = sum(v for _, v in named)
    return Term(pricing.egress_gb * gb, " + ".join(f"{n} {v:g} GB" for n, v in named)
                + f" (inventory) x {pricing.egress_gb:g}/GB")


def poc_cost(provider: str, pricing: Pricing | None, gpus: int | None, window: Window,
             ckpt_gb: float | None = None) -> PocCost:
    storage = storage_term(pricing, ckpt_gb, window.hours)
    transfer = transfer_term(pricing)
    why = (NOT_PRICED if pricing is None else
           "GPU count unknown (no node reported it)" if gpus is None else
           f"window unknown: {window.source}" if window.hours is None else None)
    if why is not None or pricing is None or gpus is None or window.hours is None:
        return PocCost(provider, pricing, gpus, window, None, None, None, storage, transfer, why)
    g = pricing.billing_granularity
    useful = billed_hours(window.hours - window.failed_hours, g)
    both = billed_hours(window.hours, g)
    return PocCost(provider, pricing, gpus, window, both, pricing.gpu_hour * gpus * useful,
                   pricing.gpu_hour * gpus * (both - useful), storage, transfer)


@dataclass(frozen=True)
class UnitCost:
    provider: str
    currency: str | None  # None: not priced
    per_1m_tokens: float | None  # training throughput at gpu_hour
    per_job_hour: float | None  # an hour of a job on the PoC's GPUs
    per_gpu_month: float | None  # node_month / GPUs per node: how rentals are quoted
    hourly_month: float | None  # gpu_hour x 730: a card's month at the hourly price
    breakeven_hours: float | None  # hours per month above which the monthly price wins
    gpu_model: str | None = None


def unit_cost(provider: str, pricing: Pricing | None, gpus: int | None,
              gpus_per_node: int | None, tokens_per_s_per_gpu: float | None,
              gpu_model: str | None = None) -> UnitCost:
    if pricing is None:
        return UnitCost(provider, None, None, None, None, None, None, gpu_model)
    per_tokens = None
    if tokens_per_s_per_gpu and tokens_per_s_per_gpu > 0:
        per_tokens = pricing.gpu_hour / 3600 * 1e6 / tokens_per_s_per_gpu
    per_month = breakeven = None
    if pricing.node_month is not None and gpus_per_node:
        per_month = pricing.node_month / gpus_per_node
        breakeven = per_month / pricing.gpu_hour if pricing.gpu_hour > 0 else None
    return UnitCost(provider, pricing.currency, per_tokens,
                    None if gpus is None else pricing.gpu_hour * gpus, per_month,
                    pricing.gpu_hour * HOURS_PER_MONTH, breakeven, gpu_model)


def convert(amount: float | None, currency: str | None, base: str,
            rates: Mapping[str, float]) -> float | None:
    """amount in `base`; None when no rate says how (never a silent 1:1)."""
    if amount is None or currency is None:
        return None
    if currency == base:
        return amount
    if currency in rates:
        return amount * rates[currency]
    return None


def _money(v: float | None, cur: str | None, none: str = "-") -> str:
    if v is None or cur is None:
        return none
    return f"{v:,.4f} {cur}" if 0 < abs(v) < 1 else f"{v:,.2f} {cur}"


def _base(costs: Sequence[PocCost]) -> str:
    return next((c.currency for c in costs if c.currency), "USD")


def cost_table(costs: Sequence[PocCost], rates: Mapping[str, float] | None = None) -> Table:
    """One row per provider and window, each in its own currency; the last column puts
    the totals in the first priced provider's currency only where a rate says how. An
    unpriced provider is one row whose total says why; `sources_table` says where each
    number came from."""
    base = _base(costs)
    rows: list[tuple[Any, ...]] = []
    for c in costs:
        w, cur = c.window, c.currency
        if c.total is None:
            why = "not priced" if c.pricing is None else (c.why or "not priced")
            rows.append((c.provider, w.name, "unknown" if w.hours is None else round(w.hours, 4),
                         w.attempts, "-", "unknown" if c.gpus is None else c.gpus, "-", "-",
                         "-", "-", why, "-"))
            continue
        total = _money(c.total, cur) + (f" + {', '.join(c.unpriced)} not priced"
                                        if c.unpriced else "")
        cv = convert(c.total, cur, base, rates or {})
        conv = _money(cv, base) if cv is not None else f"no {cur}->{base} rate: shown apart"
        rows.append((c.provider, w.name, "unknown" if w.hours is None else round(w.hours, 4),
                     f"{w.attempts} ({w.failed_hours:.3g} h)" if w.attempts else 0,
                     "-" if c.billed_hours is None else round(c.billed_hours, 4), c.gpus,
                     _money(c.compute, cur), _money(c.reruns, cur),
                     _money(c.storage.amount, cur, "not priced"),
                     _money(c.transfer.amount, cur, "not priced"), total, conv))
    return Table("PoC cost", ("provider", "window", "hours", "failed attempts", "billed h",
                              "GPUs", "compute", "failed attempts cost", "storage", "transfer",
                              "total", f"total in {base}"), rows)


def sources_table(costs: Sequence[PocCost]) -> Table:
    """Where each number of the cost came from: the price, the window, storage, transfer."""
    rows = []
    unpriced = sorted({c.provider for c in costs if c.pricing is None})
    for c in costs:
        if c.pricing is None:
            continue
        rows.append((c.provider, c.window.name, price_words(c.pricing), c.window.source, c.storage.source,
                     c.transfer.source))
    if unpriced:
        rows.append((", ".join(unpriced), "-", NOT_PRICED, "-", "-", "-"))
    return Table("PoC cost: where each number came from", ("provider", "window", "price",
                                                          "window from", "storage from",
                                                          "transfer from"), rows)


def references(model: str | None) -> list[tuple[str, float, float, str]]:
    """The recipe's reference monthly prices for a GPU model (INFO lines)."""
    return [(label, lo, hi, cur) for order, label, lo, hi, cur in REFERENCES
            if model and model_matches(order, model)]


def unit_table(units: Sequence[UnitCost]) -> Table:
    rows: list[tuple[Any, ...]] = []
    for u in units:
        if u.currency is None:
            rows.append((u.provider, "not priced", "-", "-", "-", "-"))
            continue
        if u.breakeven_hours is None:
            wins = "no monthly price (pricing.node_month)"
        elif u.breakeven_hours >= HOURS_PER_MONTH:
            wins = "hourly always (monthly costs more than a full month of hours)"
        else:
            wins = f"monthly above {u.breakeven_hours:,.0f} h/month"
        rows.append((u.provider, _money(u.per_1m_tokens, u.currency),
                     _money(u.per_job_hour, u.currency), _money(u.per_gpu_month, u.currency),
                     _money(u.hourly_month, u.currency), wins))
    seen = set()
    for u in units:
        for label, lo, hi, cur in references(u.gpu_model):
            if label not in seen:
                seen.add(label)
                rows.append((f"INFO reference: {label}", "-", "-",
                             f"{lo:,.0f}-{hi:,.0f} {cur} per card-month (the acceptance "
                             "recipe's sources)", "-", "per-hour instances win for short "
                                                        "work, monthly plans above some hours"))
    return Table("cost per useful unit", ("provider", "per 1M training tokens",
                                          "per hour of the job", "per GPU-month (monthly plan)",
                                          "GPU-month at the hourly price (x 730)",
                                          "break-even"), rows)


def currencies_apart(costs: Sequence[PocCost], rates: Mapping[str, float]) -> list[str]:
    """The currencies that cannot be put next to the first one (no rate given)."""
    base = _base(costs)
    return sorted({c.currency for c in costs if c.currency and c.currency != base
                   and c.currency not in rates})


def as_json(costs: Sequence[PocCost], units: Sequence[UnitCost]) -> dict[str, Any]:
    return {"poc": [{"provider": c.provider, "currency": c.currency, "gpus": c.gpus,
                     "window": c.window.__dict__, "billed_hours": c.billed_hours,
                     "compute": c.compute, "reruns": c.reruns,
                     "storage": c.storage.__dict__, "transfer": c.transfer.__dict__,
                     "total": c.total, "not_priced": c.why} for c in costs],
            "per_unit": [u.__dict__ for u in units]}
