"""Selection, the identical-parameters gate, busbw ratios and the cost of a real pair."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from orchestrator.analysis import compare
from orchestrator.errors import UsageError
from orchestrator.store import Index
from orchestrator.suite import Suite
from tests.bench.synthetic_store import make_store
from tests.unit.comparestore import build_store


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, str]]]:
    root = tmp_path_factory.mktemp("cmp") / "results"
    return root, build_store(root, failed_attempt=True)


def test_latest_complete_run_per_step_is_chosen(pair) -> None:
    root, ids = pair
    sel = compare.select(root, ["h200", "beta"])
    for p in ("h200", "beta"):
        assert sel.chosen[p] == {k: ids[p][k] for k in ("preflight", "nccl", "train")}
    assert ids["beta"]["failed"] not in sel.run_ids()  # interrupted: an attempt, not a result
    named = compare.select(root, [], [ids["beta"]["failed"], ids["h200"]["nccl"]])
    assert named.chosen == {"beta": {"nccl": ids["beta"]["failed"]},
                            "h200": {"nccl": ids["h200"]["nccl"]}}


def test_bad_selections_say_what_is_wrong(pair, tmp_path) -> None:
    root, _ = pair
    with pytest.raises(UsageError, match="no run 20990101-000000-beef"):
        compare.select(root, [], ["20990101-000000-beef"])
    with pytest.raises(UsageError, match=r"no runs of provider gamma .*providers with runs: "
                                         r"beta, h200"):
        compare.select(root, ["h200", "gamma"])
    with pytest.raises(UsageError, match="no results under"):
        compare.select(tmp_path / "nothing")
    Index(tmp_path / "empty")
    with pytest.raises(UsageError, match="holds no runs"):
        compare.select(tmp_path / "empty")


def test_different_suites_are_refused_with_the_parameters_that_differ(tmp_path) -> None:
    root = tmp_path / "results"
    build_store(root, providers=("h200",))
    other = Suite().model_copy(update={"nccl": Suite().nccl.model_copy(
        update={"max_bytes": "1G", "iters": 50})})
    build_store(root, providers=("beta",), suite=other)
    with pytest.raises(compare.SuiteMismatch) as exc:
        compare.build(root, ["h200", "beta"], with_cost=False)
    text = str(exc.value)
    assert exc.value.exit_code == 2
    lines = text.splitlines()
    head = next(ln for ln in lines if ln.strip().startswith("parameter"))
    assert "h200 (suite" in head and "beta (suite" in head  # name, value A, value B
    rows = {ln.split("|")[0].strip(): [c.strip() for c in ln.split("|")[1:]] for ln in lines
            if "|" in ln}
    assert rows["nccl.max_bytes"] == ["128M", "1G"] and rows["nccl.iters"] == ["20", "50"]
    assert "nccl.rounds" not in rows  # only what differs
    assert "'" not in text and "{" not in text  # JSON cells, never Python reprs


def test_ratio_interval_is_reproducible_and_brackets_the_truth() -> None:
    rng = np.random.default_rng(1)
    a = 300 * rng.normal(1, 0.01, 6)
    b = 240 * rng.normal(1, 0.01, 6)
    p1 = compare.ratio_ci(a, b)
    assert p1 == compare.ratio_ci(a, b)  # fixed seed
    point, lo, hi = p1
    assert lo < 0.8 < hi and lo <= point <= hi and hi - lo < 0.05
    point, lo, hi = compare.ratio_ci(a[:1], b)
    assert np.isnan(lo) and np.isnan(hi)


def test_ratio_interval_is_the_central_95_percent_of_the_bootstrap() -> None:
    """The documented interval: each side resampled with replacement (the module's seed,
    2000 draws), the ratio of medians; 2.5% of the draws below it and 2.5% above. A 90%
    interval (5-95) would be visibly narrower."""
    rng = np.random.default_rng(7)
    a, b = 300 * rng.normal(1, 0.05, 12), 240 * rng.normal(1, 0.05, 9)
    point, lo, hi = compare.ratio_ci(a, b)
    draw = np.random.default_rng(compare.SEED)
    ra = np.median(a[draw.integers(0, len(a), (compare.BOOTSTRAP, len(a)))], axis=1)
    rb = np.median(b[draw.integers(0, len(b), (compare.BOOTSTRAP, len(b)))], axis=1)
    ratios = rb / ra
    assert point == float(np.median(b) / np.median(a))
    assert (lo, hi) == (float(np.percentile(ratios, 2.5)), float(np.percentile(ratios, 97.5)))
    assert np.mean(ratios < lo) == pytest.approx(0.025, abs=0.006)  # medians tie
    assert np.mean(ratios > hi) == pytest.approx(0.025, abs=0.006)  # medians tie
    narrow = np.percentile(ratios, [5, 95])
    assert hi - lo > 1.1 * (narrow[1] - narrow[0])


def test_busbw_side_by_side_from_the_capture(pair) -> None:
    root, _ = pair
    c = compare.build(root, ["h200", "beta"])
    t = next(t for t in c.tables if t.title.startswith("busbw"))
    rows = {(r[0], r[1]): dict(zip(t.columns, r, strict=True)) for r in t.rows}
    top = rows[("single", "4 GiB")]
    assert top["h200 median GB/s"] == pytest.approx(346.69)  # the capture's rounds 348.44/345.33/346.69
    assert top["h200 min-max"] == "345.33-348.44"
    assert top["beta/h200"] == pytest.approx(0.8, abs=0.002)  # beta is x 0.8 by construction
    lo, hi = map(float, top["beta/h200 95% CI"].split("-"))
    assert lo <= 0.8 <= hi
    stab = next(t for t in c.tables if t.title.startswith("stability"))
    assert {(r[0], r[1], r[2]) for r in stab.rows} == {("h200", "single", 3),
                                                      ("beta", "single", 3)}
    tr = next(t for t in c.tables if t.title == "training")
    by = {r[0]: r[1:] for r in tr.rows}
    assert by["tokens/s per GPU (tokens/s)"] == (159068.0, 130290.0)
    assert by["restore"] == ("PASS TRAIN_RESTORE_OK", "FAIL TRAIN_RESTORE_MISMATCH")


def test_cost_of_the_pair_from_their_own_timestamps(pair) -> None:
    root, _ = pair
    c = compare.build(root, ["h200", "beta"])
    by = {(x.provider, x.window.name): x for x in c.costs}
    h200, beta = by[("h200", "gpuvet's steps")], by[("beta", "gpuvet's steps")]
    # h200: 1 + 30 + 30 minutes, 2 GPUs, 9.8 per GPU-hour, billed per minute
    assert h200.window.hours == pytest.approx(61 / 60) and h200.gpus == 2
    assert h200.compute == pytest.approx(9.8 * 2 * 61 / 60)
    assert h200.reruns == 0 and h200.window.attempts == 0
    # beta: 61 minutes billed per started hour = 2 h; the interrupted 6-minute attempt
    # fits in the same second hour, so it adds nothing to the bill
    assert beta.window.hours == pytest.approx(61 / 60 + 0.1)
    assert beta.window.failed_hours == pytest.approx(0.1) and beta.window.attempts == 1
    assert beta.compute == pytest.approx(2.9 * 2 * 2) and beta.reruns == 0
    assert c.units[0].per_gpu_month == pytest.approx(6000.0)
    assert c.units[0].breakeven_hours == pytest.approx(6000 / 9.8)
    assert c.units[1].per_1m_tokens == pytest.approx(2.9 / 3600 * 1e6 / 130290.0)
    assert c.currencies_apart == []


def test_the_synthetic_store_compares_at_scale(tmp_path) -> None:
    root = tmp_path / "syn"
    make_store(root, 24, shift={"beta": 0.5})
    c = compare.build(root, ["alpha", "beta"])
    assert {v.provider for v in c.verdicts} == {"alpha", "beta"}
    t = next(t for t in c.tables if t.title.startswith("busbw"))
    multi = [r for r in t.rows if r[0] == "multi"]
    assert multi and all(r[6] == pytest.approx(410 / 470 * 0.5, rel=0.05) for r in multi[-3:])


def test_training_table_shows_both_mfus() -> None:
    """The headline MFU (fastest kernels) and the verified, deterministic steps' MFU, each
    on its own row; a row no provider has is left out."""
    import pandas as pd

    ms = pd.DataFrame([
        {"provider": p, "scope": "train", "metric": m, "value": v}
        for p, m, v in (("a", "mfu", 0.538), ("a", "deterministic_mfu", 0.487),
                        ("b", "mfu", 0.50))])
    rows = {r[0]: r[1:] for r in compare.train_table(ms, [], ["a", "b"]).rows}
    assert rows["MFU (ratio)"] == (0.538, 0.5)
    assert rows["MFU of the verified, deterministic steps (ratio)"] == (0.487, None)
    assert "step time (median) (s)" not in rows


def test_the_fleet_steps_pairs_are_not_rounds_of_the_multi_node_run() -> None:
    """A pipeline with the fleet step stores its pair jobs' busbw too (scope multi, engine
    nccl-tests): the provider's multi-node figure is the nccl step's rounds alone."""
    import pandas as pd

    from orchestrator.analysis.compare import busbw_values

    def row(step: str, value: float) -> dict:
        return {"run_id": "r", "provider": "p", "step": step, "scope": "multi",
                "engine": "nccl-tests", "metric": "busbw", "size": 1 << 24, "inplace": False,
                "value": value, "collective": None}
    ms = pd.DataFrame([row("nccl", 40.0), row("nccl", 42.0), row("fleet", 3.0)])
    got = busbw_values(ms, "p", "multi")
    assert list(got) == [1 << 24] and sorted(got[1 << 24]) == [40.0, 42.0]
