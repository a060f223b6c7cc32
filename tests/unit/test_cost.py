"""PoC cost arithmetic, billing granularity, per-unit cost, break-even, currencies."""

from __future__ import annotations

import pytest

from orchestrator.analysis import cost
from orchestrator.errors import UsageError
from orchestrator.inventory import Pricing


def test_the_recipe_example_compute_alone() -> None:
    p = Pricing(gpu_hour=9.8, currency="USD", billing_granularity="minute")
    c = cost.poc_cost("x", p, gpus=4, useful_hours=0.5)
    assert c.compute == pytest.approx(19.6)
    assert c.reruns == 0 and c.storage == 0 and c.transfer == 0
    assert c.total == pytest.approx(19.6)


@pytest.mark.parametrize(("hours", "gran", "billed"), [
    (0.5, "minute", 0.5), (0.5, "hour", 1.0), (1.0, "hour", 1.0), (1.0001, "hour", 2.0),
    (61 / 3600, "minute", 2 / 60), (0.2, "day", 24.0), (10.0, "month", 730.0),
    (1 / 3600, "second", 1 / 3600), (0.0, "hour", 0.0)])
def test_measured_hours_round_up_to_the_billing_unit(hours: float, gran: str,
                                                      billed: float) -> None:
    assert cost.billed_hours(hours, gran) == pytest.approx(billed)


def test_failed_attempts_are_what_they_add_to_the_bill() -> None:
    p = Pricing(gpu_hour=2.0, billing_granularity="hour", storage_gb_month=0.1, egress_gb=0.5)
    c = cost.poc_cost("x", p, gpus=8, useful_hours=1.5, failed_hours=0.75, storage_gb=100,
                      window_hours=73.0, transfer_gb=2.0)
    assert c.compute == pytest.approx(2.0 * 8 * 2)  # 1.5 h billed as 2
    assert c.reruns == pytest.approx(2.0 * 8 * 1)  # 2.25 h billed as 3: one more hour
    assert c.storage == pytest.approx(0.1 * 100 * 73 / 730)
    assert c.transfer == pytest.approx(1.0)
    assert c.total == pytest.approx(32 + 16 + 1 + 1)


def test_per_unit_cost_and_break_even() -> None:
    p = Pricing(gpu_hour=2.5, node_month=12000, currency="EUR")
    u = cost.unit_cost("x", p, gpus=16, gpus_per_node=8, tokens_per_s_per_gpu=10000)
    assert u.per_1m_tokens == pytest.approx(2.5 / 3600 * 100)  # 100 GPU-seconds per 1M tokens
    assert u.per_job_hour == pytest.approx(40.0)
    assert u.per_gpu_month == pytest.approx(1500.0)
    assert u.breakeven_hours == pytest.approx(600.0)
    row = cost.unit_table([u]).rows[0]
    assert row[3] == "1,500.00 EUR" and row[4] == "monthly above 600 h/month"
    never = cost.unit_cost("y", Pricing(gpu_hour=1.0, node_month=8000), 8, 8, None)
    assert never.per_1m_tokens is None
    assert cost.unit_table([never]).rows[0][4].startswith("hourly always")


def test_currencies_are_never_mixed_silently() -> None:
    a = cost.poc_cost("a", Pricing(gpu_hour=2.0, currency="USD"), 2, 1.0)
    b = cost.poc_cost("b", Pricing(gpu_hour=2.0, currency="EUR"), 2, 1.0)
    assert cost.currencies_apart([a, b], {}) == ["EUR"]
    row = cost.cost_table([a, b]).rows[1]
    assert row[-2] == "4.00 EUR" and row[-1] == "no EUR->USD rate: shown apart"
    assert cost.currencies_apart([a, b], {"EUR": 1.1}) == []
    assert cost.cost_table([a, b], {"EUR": 1.1}).rows[1][-1] == "4.40 USD"
    assert cost.convert(5.0, "GBP", "USD", {"EUR": 1.1}) is None


def test_pricing_read_from_an_inventory_document() -> None:
    doc = "providers:\n  a: {pricing: {gpu_hour: 3, currency: EUR}}\n  b: {nodes: []}\n"
    assert cost.pricing_of(doc, "a", "inv.yaml").currency == "EUR"  # type: ignore[union-attr]
    assert cost.pricing_of(doc, "b", "inv.yaml") is None
    with pytest.raises(UsageError, match="providers.a.pricing.gpu_hour"):
        cost.pricing_of("providers:\n  a: {pricing: {gpu_hour: -1}}\n", "a", "inv.yaml")
