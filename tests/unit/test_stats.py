"""Stability over rounds, size parsing and the shipped reference bands."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator import stats
from orchestrator.stats import Reference, find_reference, parse_size, shipped_references, stability


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


def test_shipped_references_load() -> None:
    refs = shipped_references()
    assert len(refs) >= 5
    for r in refs:
        assert isinstance(r, Reference)
        assert r.lower <= r.value <= r.upper
        assert r.gpu and r.gpus and r.nodes
        assert r.min_size_bytes == parse_size(r.min_size)


def test_find_reference_matches_gpu_count_and_nodes() -> None:
    a100 = find_reference("NVIDIA A100-SXM4-80GB", 8, 1)
    assert a100 is not None
    assert (a100.value, a100.lower, a100.upper) == (230, 185, 265)
    h200 = find_reference("NVIDIA H200", 2, 1)
    assert h200 is not None and h200.value == 285
    assert find_reference("NVIDIA H200", 8, 1).value == 450  # type: ignore[union-attr]


@pytest.mark.parametrize(("gpu", "gpus", "nodes"), [
    ("NVIDIA A100-SXM4-80GB", 4, 1),  # unknown GPU count
    ("NVIDIA A100-SXM4-80GB", 8, 2),  # unknown node count
    ("NVIDIA H200", 1, 2),
    ("Tesla V100-SXM2-32GB", 8, 1),  # unknown GPU
    ("NVIDIA H100 PCIe", 8, 1),  # H100 band is for HBM3 (SXM5) only
])
def test_find_reference_no_match(gpu: str, gpus: int, nodes: int) -> None:
    assert find_reference(gpu, gpus, nodes) is None


def test_reference_verdict_and_bounds() -> None:
    ref = Reference(value=285, lower=250, upper=360)
    assert ref.verdict(249.9) == "below"
    assert ref.verdict(250) == "within"
    assert ref.verdict(285.3) == "within"
    assert ref.verdict(360) == "within"
    assert ref.verdict(360.1) == "above"
    assert ref.min_size_bytes == 128 << 20


def test_reference_rejects_unknown_keys_and_nonpositive_value() -> None:
    with pytest.raises(ValueError):
        Reference(value=0, lower=0, upper=1)
    with pytest.raises(ValueError):
        Reference.model_validate({"value": 1, "lower": 0, "upper": 2, "typo": 1})
    assert stats.Reference(value=1, lower=0, upper=2).gpu is None


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
