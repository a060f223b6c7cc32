"""Stability over rounds, size parsing and the shipped reference bands."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.stats import parse_size, stability


def test_stability_per_size_on_hand_computed_rounds() -> None:
    rounds = [{1024: 10.0, 2048: 100.0}, {1024: 20.0, 2048: 90.0}, {1024: 30.0, 2048: 95.0}]
    table = stability(rounds)
    assert [s.size_bytes for s in table] == [1024, 2048]
    small, big = table
    assert small.values == (10.0, 20.0, 30.0)
    assert (small.median, small.min, small.max) == (20.0, 10.0, 30.0)
    # sample stdev of 10, 20, 30 is 10; mean 20 -> cv 0.5
    assert small.cv == pytest.approx(0.5)
    assert big.values == (100.0, 90.0, 95.0)
    assert (big.median, big.min, big.max) == (95.0, 90.0, 100.0)
    assert big.cv == pytest.approx(5.0 / 95.0)


def test_stability_keeps_only_sizes_present_in_every_round() -> None:
    table = stability([{8: 1.0, 16: 2.0}, {16: 3.0, 32: 4.0}])
    assert [s.size_bytes for s in table] == [16]
    assert table[0].values == (2.0, 3.0)


def test_stability_single_round_has_zero_cv_and_empty_input_nothing() -> None:
    (only,) = stability([{64: 7.5}])
    assert (only.median, only.min, only.max, only.cv) == (7.5, 7.5, 7.5, 0.0)
    assert stability([]) == []


def test_drops_respects_tolerance() -> None:
    (st,) = stability([{1: 100.0}, {1: 50.0}, {1: 95.0}])
    assert st.median == 95.0
    assert st.drops(0.10) == [2]  # 50 < 85.5
    assert st.drops(0.50) == []  # 50 >= 47.5
    (two,) = stability([{1: 80.0}, {1: 100.0}, {1: 100.0}, {1: 60.0}])
    assert two.median == 90.0
    assert two.drops(0.05) == [1, 4]  # rounds are 1-based, in round order
    assert two.drops(0.20) == [4]


def test_drops_with_zero_median_is_empty() -> None:
    (st,) = stability([{1: 0.0}, {1: 0.0}, {1: 0.0}])
    assert st.drops(0.1) == []


@pytest.mark.parametrize(("text", "expected"), [
    ("8", 8), ("64K", 64 << 10), ("128M", 128 << 20), ("4G", 4 << 30), ("1GB", 1 << 30),
    ("64k", 64 << 10), (" 2M ", 2 << 20), (1024, 1024),
])
def test_parse_size(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["x", "", "1.5M", "M", "-8", "12Q"])
def test_parse_size_rejects(bad: str) -> None:
    with pytest.raises(ValueError, match="bad size"):
        parse_size(bad)


def test_suite_refuses_a_bad_size_before_any_node_runs(tmp_path: Path) -> None:
    from orchestrator.errors import UsageError
    from orchestrator.suite import load_suite

    bad = tmp_path / "suite.yaml"
    bad.write_text("nccl:\n  max_bytes: 128X\n")
    with pytest.raises(UsageError, match="bad size"):
        load_suite(bad)
    good = tmp_path / "good.yaml"
    good.write_text("nccl:\n  max_bytes: 4G\n")
    assert parse_size(load_suite(good).nccl.max_bytes) == 4 << 30


def test_a_round_exactly_at_the_tolerance_is_not_a_drop() -> None:
    """Only a round more than the tolerance below the median is a drop."""
    (st,) = stability([{1: 100.0}, {1: 75.0}, {1: 100.0}])
    assert st.drops(0.25) == []  # 75 is exactly 25 % below: not more
    assert st.drops(0.24) == [2]


def test_drops_are_judged_on_a_fabric_slower_than_one_gbps() -> None:
    """A TCP fallback measures well under 1 GB/s; its drops still count."""
    (st,) = stability([{1: 0.8}, {1: 0.2}, {1: 0.8}])
    assert st.median == 0.8
    assert st.drops(0.1) == [2]


def test_cv_of_two_rounds_and_of_a_slow_fabric() -> None:
    (two,) = stability([{1: 90.0}, {1: 110.0}])
    assert two.cv == pytest.approx(14.142135 / 100.0)
    (slow,) = stability([{1: 0.5}, {1: 1.0}, {1: 0.0}])  # mean 0.5, sample stdev 0.5
    assert slow.cv == pytest.approx(1.0)
