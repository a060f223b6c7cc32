"""PoC cost arithmetic, billing granularity, per-unit cost, break-even, currencies."""

from __future__ import annotations

import pytest

from orchestrator.analysis import cost
from orchestrator.errors import UsageError
from orchestrator.inventory import Pricing


def W(hours: float | None, failed: float = 0.0) -> cost.Window:  # noqa: N802
    return cost.Window("test", hours, "given", failed, 1 if failed else 0)


@pytest.mark.parametrize(("gran", "compute"), [("second", 19.6), ("minute", 19.6),
                                               ("hour", 39.2)])
def test_the_recipe_worked_example(gran: str, compute: float) -> None:
    """RECIPE.md: 4 cards for 30 minutes at 9.8 CNY per card-hour is 19.6 CNY for compute
    alone, billed per second; a per-hour bill makes the half hour a whole one: 39.2."""
    p = Pricing(gpu_hour=9.8, currency="CNY", billing_granularity=gran)
    c = cost.poc_cost("x", p, gpus=4, window=W(0.5))
    assert c.compute == pytest.approx(compute) and c.reruns == 0
    assert c.total == pytest.approx(compute)  # storage and transfer not priced: not added
    assert c.storage.amount is None and c.transfer.amount is None
    assert c.unpriced == ["storage", "transfer"]
    row = dict(zip(cost.cost_table([c]).columns, cost.cost_table([c]).rows[0], strict=True))
    assert row["storage"] == "not priced" and row["transfer"] == "not priced"
    assert row["total"] == f"{compute:.2f} CNY + storage, transfer not priced"


def test_no_price_is_not_a_refusal() -> None:
    c = cost.poc_cost("x", None, gpus=4, window=W(0.5))
    assert c.compute is None and c.total is None and c.why == cost.NOT_PRICED
    row = dict(zip(cost.cost_table([c]).columns, cost.cost_table([c]).rows[0], strict=True))
    assert row["total"] == "not priced" and row["compute"] == "-"
    assert "0.00" not in " ".join(map(str, row.values()))
    src = cost.sources_table([c]).rows
    assert src == [("x", "-", cost.NOT_PRICED, "-", "-", "-")]
    unknown = cost.poc_cost("x", Pricing(gpu_hour=1.0), gpus=4, window=W(None))
    assert unknown.compute is None and unknown.why is not None
    assert unknown.why.startswith("window unknown")
    u = cost.unit_cost("x", None, 4, 4, 1000.0)
    assert cost.unit_table([u]).rows[0][1] == "not priced"


@pytest.mark.parametrize(("hours", "gran", "billed"), [
    (0.5, "minute", 0.5), (0.5, "hour", 1.0), (1.0, "hour", 1.0), (1.0001, "hour", 2.0),
    (61 / 3600, "minute", 2 / 60), (0.2, "day", 24.0), (10.0, "month", 730.0),
    (1 / 3600, "second", 1 / 3600), (0.0, "hour", 0.0)])
def test_measured_hours_round_up_to_the_billing_unit(hours: float, gran: str,
                                                      billed: float) -> None:
    assert cost.billed_hours(hours, gran) == pytest.approx(billed)


def test_failed_attempts_are_what_they_add_to_the_bill() -> None:
    p = Pricing(gpu_hour=2.0, billing_granularity="hour", storage_gb_month=0.1, egress_gb=0.5,
                download_gb=2.0)
    c = cost.poc_cost("x", p, gpus=8, window=W(2.25, failed=0.75), ckpt_gb=100)
    assert c.compute == pytest.approx(2.0 * 8 * 2)  # 1.5 h billed as 2
    assert c.reruns == pytest.approx(2.0 * 8 * 1)  # 2.25 h billed as 3: one more hour
    # no retention stated: the checkpoint is kept for the window
    assert c.storage.amount == pytest.approx(0.1 * 100 * 2.25 / 730)
    assert "checkpoint 100 GB (measured)" in c.storage.source
    assert c.transfer.amount == pytest.approx(1.0) and "downloads 2 GB" in c.transfer.source
    assert c.total == pytest.approx(32 + 16 + 1 + 0.1 * 100 * 2.25 / 730)


def test_storage_over_the_stated_retention_with_the_dataset() -> None:
    p = Pricing(gpu_hour=2.0, storage_gb_month=0.1, retention_days=30, dataset_gb=50)
    c = cost.poc_cost("x", p, gpus=1, window=W(1.0), ckpt_gb=10)
    assert c.storage.amount == pytest.approx(0.1 * 60 * 30 * 24 / 730)
    assert "30 days (pricing.retention_days)" in c.storage.source
    assert "dataset 50 GB" in c.storage.source
    assert c.transfer.amount is None  # no egress price: not priced, never 0


def test_per_unit_cost_and_break_even() -> None:
    p = Pricing(gpu_hour=2.5, node_month=12000, currency="EUR")
    u = cost.unit_cost("x", p, gpus=16, gpus_per_node=8, tokens_per_s_per_gpu=10000)
    assert u.per_1m_tokens == pytest.approx(2.5 / 3600 * 100)  # 100 GPU-seconds per 1M tokens
    assert u.per_job_hour == pytest.approx(40.0)
    assert u.per_gpu_month == pytest.approx(1500.0)
    assert u.breakeven_hours == pytest.approx(600.0)
    assert u.hourly_month == pytest.approx(2.5 * 730)
    row = cost.unit_table([u]).rows[0]
    assert row[3] == "1,500.00 EUR" and row[4] == "1,825.00 EUR"
    assert row[5] == "monthly above 600 h/month"
    never = cost.unit_cost("y", Pricing(gpu_hour=1.0, node_month=8000), 8, 8, None)
    assert never.per_1m_tokens is None
    assert cost.unit_table([never]).rows[0][5].startswith("hourly always")


def test_the_a100_80g_reference_month() -> None:
    a100 = cost.unit_cost("a", Pricing(gpu_hour=5.0, currency="CNY"), 8, 8, None,
                          "NVIDIA A100-SXM4-80GB")
    rows = cost.unit_table([a100]).rows
    assert rows[-1][0] == "INFO reference: A100 80G" and "3,000-4,500 CNY" in rows[-1][3]
    h100 = cost.unit_cost("h", Pricing(gpu_hour=5.0), 8, 8, None, "NVIDIA H100 80GB HBM3")
    a40 = cost.unit_cost("h", Pricing(gpu_hour=5.0), 8, 8, None, "NVIDIA A100-SXM4-40GB")
    assert len(cost.unit_table([h100, a40]).rows) == 2


def test_currencies_are_never_mixed_silently() -> None:
    a = cost.poc_cost("a", Pricing(gpu_hour=2.0, currency="USD"), 2, W(1.0))
    b = cost.poc_cost("b", Pricing(gpu_hour=2.0, currency="EUR"), 2, W(1.0))
    assert cost.currencies_apart([a, b], {}) == ["EUR"]
    row = cost.cost_table([a, b]).rows[1]
    assert row[-2].startswith("4.00 EUR") and row[-1] == "no EUR->USD rate: shown apart"
    assert cost.currencies_apart([a, b], {"EUR": 1.1}) == []
    assert cost.cost_table([a, b], {"EUR": 1.1}).rows[1][-1] == "4.40 USD"
    assert cost.convert(5.0, "GBP", "USD", {"EUR": 1.1}) is None
    # an unpriced provider first: the base currency is the first priced one
    assert cost.cost_table([cost.poc_cost("n", None, 2, W(1.0)), b]).columns[-1] == \
        "total in EUR"


def test_pricing_read_from_an_inventory_document() -> None:
    doc = "providers:\n  a: {pricing: {gpu_hour: 3, currency: EUR}}\n  b: {nodes: []}\n"
    assert cost.pricing_of(doc, "a", "inv.yaml").currency == "EUR"  # type: ignore[union-attr]
    assert cost.pricing_of(doc, "b", "inv.yaml") is None
    with pytest.raises(UsageError, match="providers.a.pricing.gpu_hour"):
        cost.pricing_of("providers:\n  a: {pricing: {gpu_hour: -1}}\n", "a", "inv.yaml")
