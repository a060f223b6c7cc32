"""The rewritten PoC cost (orchestrator/analysis/cost.py) pinned on exact values:
every term's figure and its words, the unit costs, and each table's rows (the
survivors of `make mutation` on cost.py)."""

from __future__ import annotations

import pytest

from orchestrator.analysis import cost as C
from orchestrator.inventory import Pricing


def _w(hours: float | None, failed: float = 0.0, attempts: int = 0) -> C.Window:
    return C.Window("w", hours, "from x", failed, attempts)


def test_storage_term_in_words() -> None:
    assert C.storage_term(None, 1.0, 1.0) == C.Term(None,
                                                    "not priced (no pricing.storage_gb_month)")
    p = Pricing(gpu_hour=1.0, storage_gb_month=0.5)
    assert C.storage_term(Pricing(gpu_hour=1.0), 1.0, 1.0).amount is None
    assert C.storage_term(p, 146.0, 73.0) == C.Term(
        0.5 * 146 * 73 / 730, "checkpoint 146 GB (measured) x 0.5/GB-month x the window's "
        "73 h (no retention stated)")
    p = Pricing(gpu_hour=1.0, storage_gb_month=0.25, dataset_gb=10, retention_days=30)
    assert C.storage_term(p, 2.5, 5.0) == C.Term(
        0.25 * 12.5 * 720 / 730, "checkpoint 2.5 GB (measured) + dataset 10 GB "
        "(pricing.dataset_gb) x 0.25/GB-month x 30 days (pricing.retention_days)")
    assert C.storage_term(p, None, None).amount == 0.25 * 10 * 720 / 730
    p = Pricing(gpu_hour=1.0, storage_gb_month=0.25)
    assert C.storage_term(p, 1.0, None) == C.Term(
        None, "not priced: no retention stated and no window known")
    assert C.storage_term(p, 0.0, 2.0) == C.Term(
        0.0, "nothing kept: no checkpoint measured, no pricing.dataset_gb")
    p = Pricing(gpu_hour=1.0, storage_gb_month=0.25, retention_days=0)
    assert C.storage_term(p, 1.0, 5.0) == C.Term(
        0.0, "checkpoint 1 GB (measured) x 0.25/GB-month x 0 days (pricing.retention_days)")


def test_transfer_term_in_words() -> None:
    assert C.transfer_term(None) == C.Term(None, "not priced (no pricing.egress_gb)")
    assert C.transfer_term(Pricing(gpu_hour=1.0, dataset_gb=5)).amount is None
    assert C.transfer_term(Pricing(gpu_hour=1.0, egress_gb=0.5)) == C.Term(
        0.0, "no transfer named (pricing.dataset_gb, pricing.download_gb)")
    p = Pricing(gpu_hour=1.0, egress_gb=0.5, dataset_gb=10, download_gb=2.5)
    assert C.transfer_term(p) == C.Term(6.25, "dataset 10 GB + downloads 2.5 GB (inventory) "
                                              "x 0.5/GB")
    p = Pricing(gpu_hour=1.0, egress_gb=0.5, download_gb=2.5)
    assert C.transfer_term(p) == C.Term(1.25, "downloads 2.5 GB (inventory) x 0.5/GB")


def test_poc_cost_and_why_not() -> None:
    p = Pricing(gpu_hour=2.0, currency="EUR", billing_granularity="hour")
    c = C.poc_cost("x", p, 4, _w(2.5, 0.75, 2))
    assert (c.billed_hours, c.compute, c.reruns) == (3.0, 2.0 * 4 * 2, 2.0 * 4 * 1)
    assert c.total == 24.0 and c.currency == "EUR" and c.why is None
    assert c.unpriced == ["storage", "transfer"]
    for args, why in [((None, 4, _w(1.0)), C.NOT_PRICED),
                      ((p, None, _w(1.0)), "GPU count unknown (no node reported it)"),
                      ((p, 4, _w(None)), "window unknown: from x")]:
        c = C.poc_cost("x", *args)
        assert (c.billed_hours, c.compute, c.reruns, c.total, c.why) == (
            None, None, None, None, why)
    c = C.poc_cost("x", Pricing(gpu_hour=1.0, storage_gb_month=1.0, egress_gb=1.0,
                                download_gb=3.0), 1, _w(1.0), ckpt_gb=73.0)
    assert c.total == pytest.approx(1.0 + 0.1 + 3.0) and c.unpriced == []


def test_unit_cost() -> None:
    assert C.unit_cost("x", None, 8, 8, 100.0, "H200") == C.UnitCost(
        "x", None, None, None, None, None, None, "H200")
    p = Pricing(gpu_hour=3.6, currency="USD", node_month=8 * 1460.0)
    u = C.unit_cost("x", p, 16, 8, 1000.0, "H200")
    assert (u.provider, u.currency, u.per_job_hour, u.per_gpu_month, u.hourly_month,
            u.gpu_model) == ("x", "USD", 3.6 * 16, 1460.0, 3.6 * 730, "H200")
    assert u.per_1m_tokens == pytest.approx(1.0)
    assert u.breakeven_hours == pytest.approx(1460.0 / 3.6)
    u = C.unit_cost("x", p, None, None, 0.0)
    assert (u.per_1m_tokens, u.per_job_hour, u.per_gpu_month, u.breakeven_hours) == (
        None, None, None, None)
    free = C.unit_cost("x", Pricing(gpu_hour=0.0, node_month=10.0), 1, 1, None)
    assert free.per_gpu_month == 10.0 and free.breakeven_hours is None


def test_convert_and_money() -> None:
    assert C.convert(None, "USD", "USD", {}) is None
    assert C.convert(1.0, None, "USD", {}) is None
    assert C.convert(2.0, "USD", "USD", {"USD": 5.0}) == 2.0
    assert C.convert(2.0, "CNY", "USD", {"CNY": 0.25}) == 0.5
    assert C.convert(2.0, "CNY", "USD", {"EUR": 1.0}) is None
    assert C._money(None, "USD") == "-" and C._money(1.0, None, "n") == "n"
    assert C._money(1234.5, "USD") == "1,234.50 USD"
    assert C._money(0.12345, "USD") == "0.1235 USD"
    assert C._money(-0.5, "USD") == "-0.5000 USD"
    assert C._money(1.0, "USD") == "1.00 USD" and C._money(0.0, "USD") == "0.00 USD"


def test_cost_table_rows() -> None:
    usd = Pricing(gpu_hour=2.0, currency="USD", storage_gb_month=1.0, retention_days=7.3)
    cny = Pricing(gpu_hour=10.0, currency="CNY", egress_gb=1.0)
    eur = Pricing(gpu_hour=1.0, currency="EUR")
    costs = [C.poc_cost("a", usd, 2, _w(1.5, 0.5, 1), ckpt_gb=100.0),
             C.poc_cost("b", cny, 1, C.Window("w2", 0.25, "s", 0.0, 0)),
             C.poc_cost("c", eur, None, _w(1.0)), C.poc_cost("d", None, 4, _w(None)),
             C.poc_cost("e", eur, 1, _w(2.0))]
    t = C.cost_table(costs, {"CNY": 0.125})
    assert t.title == "PoC cost"
    assert t.columns == ("provider", "window", "hours", "failed attempts", "billed h", "GPUs",
                         "compute", "failed attempts cost", "storage", "transfer", "total",
                         "total in USD")
    assert t.rows == [
        ("a", "w", 1.5, "1 (0.5 h)", 2.0, 2, "4.00 USD", "4.00 USD", "24.00 USD",
         "not priced", "32.00 USD + transfer not priced", "32.00 USD"),
        ("b", "w2", 0.25, 0, 1.0, 1, "10.00 CNY", "0.00 CNY", "not priced", "0.00 CNY",
         "10.00 CNY + storage not priced", "1.25 USD"),
        ("c", "w", 1.0, 0, "-", "unknown", "-", "-", "-", "-",
         "GPU count unknown (no node reported it)", "-"),
        ("d", "w", "unknown", 0, "-", 4, "-", "-", "-", "-", "not priced", "-"),
        ("e", "w", 2.0, 0, 2.0, 1, "2.00 EUR", "0.00 EUR", "not priced", "not priced",
         "2.00 EUR + storage, transfer not priced", "no EUR->USD rate: shown apart")]
    assert C.cost_table([costs[3]]).columns[-1] == "total in USD"
    assert C.cost_table([costs[3], costs[1]]).columns[-1] == "total in CNY"
    assert C.currencies_apart(costs, {"CNY": 0.125}) == ["EUR"]
    assert C.currencies_apart(costs, {}) == ["CNY", "EUR"]


def test_sources_table_rows() -> None:
    usd = Pricing(gpu_hour=2.5, currency="USD", billing_granularity="minute")
    costs = [C.poc_cost("a", usd, 2, _w(1.0)), C.poc_cost("z", None, 2, _w(1.0)),
             C.poc_cost("b", None, 2, _w(1.0)), C.poc_cost("b", None, 2, _w(2.0))]
    t = C.sources_table(costs)
    assert t.title == "PoC cost: where each number came from"
    assert t.columns == ("provider", "window", "price", "window from", "storage from",
                         "transfer from")
    assert t.rows == [("a", "w", "2.5 USD per GPU-hour, billed per minute", "from x",
                       "not priced (no pricing.storage_gb_month)",
                       "not priced (no pricing.egress_gb)"),
                      ("b, z", "-", C.NOT_PRICED, "-", "-", "-")]
    assert C.sources_table(costs[:1]).rows[-1][0] == "a"


def test_unit_table_rows() -> None:
    p = Pricing(gpu_hour=3.6, currency="USD", node_month=8 * 1460.0)
    units = [C.unit_cost("a", p, 16, 8, 1000.0, "H200"),
             C.unit_cost("b", Pricing(gpu_hour=1.0, currency="EUR"), 1, 1, None,
                         "NVIDIA A100 80GB PCIe"),
             C.unit_cost("c", Pricing(gpu_hour=1.0, node_month=730.0), 1, 1, None),
             C.unit_cost("d", Pricing(gpu_hour=1.0, node_month=729.0), 1, 1, None,
                         "A100-SXM4-80GB"),
             C.unit_cost("e", None, 1, 1, None)]
    t = C.unit_table(units)
    assert t.title == "cost per useful unit"
    assert t.columns == ("provider", "per 1M training tokens", "per hour of the job",
                         "per GPU-month (monthly plan)", "GPU-month at the hourly price (x 730)",
                         "break-even")
    assert t.rows == [
        ("a", "1.00 USD", "57.60 USD", "1,460.00 USD", "2,628.00 USD",
         "monthly above 406 h/month"),
        ("b", "-", "1.00 EUR", "-", "730.00 EUR", "no monthly price (pricing.node_month)"),
        ("c", "-", "1.00 USD", "730.00 USD", "730.00 USD",
         "hourly always (monthly costs more than a full month of hours)"),
        ("d", "-", "1.00 USD", "729.00 USD", "730.00 USD", "monthly above 729 h/month"),
        ("e", "not priced", "-", "-", "-", "-"),
        ("INFO reference: A100 80G", "-", "-", "3,000-4,500 CNY per card-month (the "
         "acceptance recipe's sources)", "-", "per-hour instances win for short work, "
         "monthly plans above some hours")]
    assert C.references(None) == [] and C.references("H200") == []


def test_as_json() -> None:
    p = Pricing(gpu_hour=2.0, currency="USD")
    c = C.poc_cost("a", p, 2, _w(1.0))
    u = C.unit_cost("a", p, 2, 2, None)
    assert C.as_json([c], [u]) == {
        "poc": [{"provider": "a", "currency": "USD", "gpus": 2,
                 "window": {"name": "w", "hours": 1.0, "source": "from x", "failed_hours": 0.0,
                            "attempts": 0},
                 "billed_hours": 1.0, "compute": 4.0, "reruns": 0.0,
                 "storage": {"amount": None,
                             "source": "not priced (no pricing.storage_gb_month)"},
                 "transfer": {"amount": None, "source": "not priced (no pricing.egress_gb)"},
                 "total": 4.0, "not_priced": None}],
        "per_unit": [{"provider": "a", "currency": "USD", "per_1m_tokens": None,
                      "per_job_hour": 4.0, "per_gpu_month": None, "hourly_month": 1460.0,
                      "breakeven_hours": None, "gpu_model": None}]}


def test_cost_table_rounds_hours_to_four_places_and_names_only_what_is_unpriced() -> None:
    full = Pricing(gpu_hour=1.0, currency="USD", billing_granularity="minute",
                   storage_gb_month=1.0, egress_gb=1.0, download_gb=2.0)
    cny = Pricing(gpu_hour=1.0, currency="CNY")
    costs = [C.poc_cost("a", full, 1, _w(1.0123456, 0.1234567, 3), ckpt_gb=7.3),
             C.poc_cost("b", cny, 1, _w(1.0)),
             C.poc_cost("c", Pricing(gpu_hour=1.0), None, _w(2.3456789, 0.5, 2))]
    rows = C.cost_table(costs).rows  # no rates given: none is used
    assert rows[0][:6] == ("a", "w", 1.0123, "3 (0.123 h)", 1.0167, 1)
    assert rows[0][10:] == ("3.03 USD", "3.03 USD")
    assert rows[1][10:] == ("1.00 CNY + storage, transfer not priced",
                            "no CNY->USD rate: shown apart")
    assert rows[2] == ("c", "w", 2.3457, 2, "-", "unknown", "-", "-", "-", "-",
                       "GPU count unknown (no node reported it)", "-")


def test_poc_cost_without_a_figure_keeps_its_terms() -> None:
    p = Pricing(gpu_hour=1.0, storage_gb_month=0.5, egress_gb=1.0, download_gb=2.0,
                retention_days=73)
    c = C.poc_cost("x", p, None, _w(1.0), ckpt_gb=10.0)
    assert c.why == "GPU count unknown (no node reported it)" and c.total is None
    assert c.storage == C.Term(0.5 * 10 * 73 * 24 / 730, "checkpoint 10 GB (measured) x "
                               "0.5/GB-month x 73 days (pricing.retention_days)")
    assert c.transfer == C.Term(2.0, "downloads 2 GB (inventory) x 1/GB")
    c = C.poc_cost("x", None, 1, _w(1.0))
    assert (c.storage, c.transfer) == (C.storage_term(None, None, 1.0), C.transfer_term(None))


def test_a_throughput_below_one_token_a_second_is_still_priced() -> None:
    u = C.unit_cost("x", Pricing(gpu_hour=3.6), 1, 1, 0.5)
    assert u.per_1m_tokens == pytest.approx(2000.0)
    assert C.unit_cost("x", Pricing(gpu_hour=3.6), 1, 1, -1.0).per_1m_tokens is None


def test_convert_nothing_at_a_rate_is_nothing() -> None:
    assert C.convert(None, "CNY", "USD", {"CNY": 0.25}) is None


def test_a_priced_provider_after_an_unpriced_one_keeps_its_rows() -> None:
    usd = Pricing(gpu_hour=2.5, currency="USD")
    costs = [C.poc_cost("z", None, 2, _w(1.0)), C.poc_cost("a", usd, 2, _w(1.0))]
    assert [r[0] for r in C.sources_table(costs).rows] == ["a", "z"]
    units = [C.unit_cost("z", None, 1, 1, None), C.unit_cost("a", usd, 1, 1, None)]
    assert [r[0] for r in C.unit_table(units).rows] == ["z", "a"]
