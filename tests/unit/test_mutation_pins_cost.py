"""The PoC cost (orchestrator/analysis/cost.py) on exact inputs: every cell of both
tables, the JSON, and the limits of each rule, for the mutants `make mutation` found
surviving test_cost.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.analysis import cost
from orchestrator.errors import UsageError
from orchestrator.inventory import Pricing


def test_a_cost_table_row_whole() -> None:
    p = Pricing(gpu_hour=2.0, currency="EUR", billing_granularity="hour",
                storage_gb_month=0.1, egress_gb=0.5)
    c = cost.poc_cost("lab", p, gpus=8, useful_hours=1.5, failed_hours=0.75, storage_gb=100,
                      window_hours=73.0, transfer_gb=0.5)
    assert (c.provider, c.currency, c.gpu_hour, c.granularity, c.gpus) == (
        "lab", "EUR", 2.0, "hour", 8)
    assert (c.useful_hours, c.failed_hours, c.billed_hours) == (1.5, 0.75, 3.0)
    t = cost.cost_table([c])
    assert t.title == "PoC cost"
    assert t.columns == ("provider", "price", "GPUs", "useful h", "failed/rerun h", "billed h",
                         "compute", "failed attempts", "storage", "transfer", "total",
                         "total in EUR")
    assert t.rows == [("lab", "2 EUR/GPU-h per hour", 8, 1.5, 0.75, 3.0, "32.00 EUR",
                       "16.00 EUR", "1.00 EUR", "0.2500 EUR", "49.25 EUR", "49.25 EUR")]
    assert cost.as_json([c], [])["poc"] == [{**c.__dict__, "total": 49.25}]
    assert cost.as_json([], [])["per_unit"] == []


def test_money_shows_four_places_below_one_only() -> None:
    p = Pricing(gpu_hour=1.0, egress_gb=1.0)
    row = cost.cost_table([cost.poc_cost("x", p, 1, 0.0, transfer_gb=1.0)]).rows[0]
    assert row[6] == "0.00 USD" and row[9] == "1.00 USD"  # 0 and 1 are not "below one"
    row = cost.cost_table([cost.poc_cost("x", p, 1, 0.0, transfer_gb=0.999)]).rows[0]
    assert row[9] == "0.9990 USD"
    row = cost.cost_table([cost.poc_cost("x", p, 1, 0.0, transfer_gb=1234.5)]).rows[0]
    assert row[9] == "1,234.50 USD"


def test_the_hours_rounded_once_and_a_float_hair_is_not_another_unit() -> None:
    assert cost.billed_hours(0.5000000001, "hour") == 1.0
    assert cost.billed_hours(1.0000000001, "hour") == 1.0
    assert cost.billed_hours(1.000001, "hour") == 2.0
    assert cost.billed_hours(-1.0, "hour") == 0.0
    assert cost.billed_hours(1e-9, "minute") == pytest.approx(1 / 60)
    assert cost.GRANULARITY_H == {"second": 1 / 3600, "minute": 1 / 60, "hour": 1.0,
                                  "day": 24.0, "month": 730.0}


def test_storage_lasts_the_window_or_the_runs_whichever_is_longer() -> None:
    p = Pricing(gpu_hour=0.0, storage_gb_month=7.3)
    assert cost.poc_cost("x", p, 1, 5.0, 5.0, storage_gb=10, window_hours=1.0).storage == \
        pytest.approx(7.3 * 10 * 10 / 730)
    assert cost.poc_cost("x", p, 1, 5.0, 5.0, storage_gb=10, window_hours=20.0).storage == \
        pytest.approx(7.3 * 10 * 20 / 730)
    free = cost.poc_cost("x", Pricing(gpu_hour=1.0), 1, 1.0, storage_gb=10, window_hours=9,
                         transfer_gb=10)
    assert free.storage == 0.0 and free.transfer == 0.0


def test_hours_between_timestamps() -> None:
    assert cost.hours_between("2026-01-01T00:00:00Z", "2026-01-01T01:30:00Z") == 1.5
    assert cost.hours_between("2026-01-01T02:00:00Z", "2026-01-01T01:00:00Z") == 0.0
    assert cost.hours_between("2026-01-01T00:00:00Z", None) == 0.0
    assert cost.hours_between("2026-01-01T00:00:00Z", "") == 0.0


def test_unit_cost_limits() -> None:
    p = Pricing(gpu_hour=2.0, node_month=1460.0, currency="EUR")
    u = cost.unit_cost("x", p, gpus=8, gpus_per_node=1, tokens_per_s_per_gpu=0.0)
    assert (u.provider, u.currency, u.per_1m_tokens, u.per_job_hour) == ("x", "EUR", None, 16.0)
    assert u.per_gpu_month == 1460.0 and u.breakeven_hours == 730.0
    # exactly a month of hours: hourly is never dearer
    assert cost.unit_table([u]).rows == [
        ("x", "-", "16.00 EUR", "1,460.00 EUR",
         "hourly always (monthly costs more than a full month of hours)")]
    just = cost.unit_cost("x", Pricing(gpu_hour=2.0, node_month=1459.0), 8, 1, None)
    assert cost.unit_table([just]).rows[0][4] == "monthly above 730 h/month"
    free = cost.unit_cost("x", Pricing(gpu_hour=0.0, node_month=100.0), 8, 4, 10.0)
    assert free.per_gpu_month == 25.0 and free.breakeven_hours is None
    assert free.per_1m_tokens == 0.0
    none = cost.unit_cost("x", Pricing(gpu_hour=1.0, node_month=100.0), 8, None, -1.0)
    assert none.per_gpu_month is None and none.breakeven_hours is None
    assert none.per_1m_tokens is None
    assert cost.unit_table([none]).rows[0][4] == "no monthly price"
    t = cost.unit_table([])
    assert t.title == "cost per useful unit" and t.columns == (
        "provider", "per 1M training tokens", "per hour of the job", "per GPU-month",
        "break-even")


def test_conversion_needs_a_rate_and_keeps_the_base() -> None:
    assert cost.convert(None, "EUR", "USD", {"EUR": 2.0}) is None
    assert cost.convert(3.0, "USD", "USD", {"USD": 2.0}) == 3.0
    assert cost.convert(3.0, "EUR", "USD", {"EUR": 2.0}) == 6.0
    assert cost.currencies_apart([], {}) == []
    a = cost.poc_cost("a", Pricing(gpu_hour=1.0, currency="GBP"), 1, 1.0)
    b = cost.poc_cost("b", Pricing(gpu_hour=1.0, currency="GBP"), 1, 1.0)
    assert cost.currencies_apart([a, b], {}) == []
    assert cost.cost_table([]).columns[-1] == "total in USD"


def test_pricing_errors_name_the_file_and_the_key(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as exc:
        cost.pricing_of("providers: [\n", "a", "inv.yaml")
    assert str(exc.value).startswith("inv.yaml is not readable YAML: ")
    with pytest.raises(UsageError) as exc:
        cost.pricing_of("providers:\n  a: {pricing: {gpu_hour: 1, currency: usd}}\n", "a",
                        "inv.yaml")
    assert str(exc.value).startswith("inv.yaml: providers.a.pricing.currency: ")
    assert cost.pricing_of("[1, 2]\n", "a", "x") is None
    assert cost.pricing_of("", "a", "x") is None
    assert cost.pricing_of("providers:\n  a: [1]\n", "a", "x") is None
    assert cost.pricing_of("providers:\n", "a", "x") is None
    assert cost.run_pricing(tmp_path, "a") is None
    (tmp_path / "inventory.yaml").write_text(
        "providers:\n  a: {pricing: {gpu_hour: 4.5, currency: EUR}}\n", encoding="utf-8")
    got = cost.run_pricing(tmp_path, "a")
    assert got is not None and (got.gpu_hour, got.currency) == (4.5, "EUR")
    (tmp_path / "inventory.yaml").write_text("providers: {a: {pricing: {gpu_hour: -1}}}\n")
    with pytest.raises(UsageError, match=str(tmp_path / "inventory.yaml")):
        cost.run_pricing(tmp_path, "a")


def test_defaults_add_no_storage_transfer_or_window() -> None:
    p = Pricing(gpu_hour=1.0, storage_gb_month=1.0, egress_gb=1.0)
    c = cost.poc_cost("x", p, 1, 1.0)
    assert (c.storage, c.transfer, c.reruns) == (0.0, 0.0, 0.0)
    half = cost.poc_cost("x", p, 1, 0.5, storage_gb=73)
    assert half.storage == pytest.approx(73 * 0.5 / 730)  # the runs' own half hour


def test_hours_in_the_table_keep_four_places() -> None:
    p = Pricing(gpu_hour=1.0, billing_granularity="second")
    c = cost.poc_cost("x", p, 1, 1.23456, failed_hours=2.34567)
    row = cost.cost_table([c]).rows[0]
    assert row[3:6] == (1.2346, 2.3457, round(cost.billed_hours(1.23456 + 2.34567, "second"), 4))
    assert row[5] == 3.5803


def test_per_unit_row_whole_with_a_slow_model() -> None:
    u = cost.unit_cost("x", Pricing(gpu_hour=3.6, currency="EUR"), 2, None, 0.5)
    assert u.per_1m_tokens == pytest.approx(2e6 / 1e3)  # 3.6/3600 per s, 2e6 s per 1M tokens
    assert cost.unit_table([u]).rows == [("x", "2,000.00 EUR", "7.20 EUR", "-",
                                          "no monthly price")]
