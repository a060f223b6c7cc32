"""Baselines set by hand: stored with where they came from, kept by an index rebuild."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from orchestrator.analysis import baseline, regress
from orchestrator.errors import UsageError
from orchestrator.index import BASELINES_FILE, Index
from orchestrator.rebuild import rebuild_index
from tests.bench.regress_bench import SIZES, busbw_values, make_history, write_run


def test_set_from_named_runs_records_series_runs_and_who(tmp_path: Path) -> None:
    root = tmp_path / "results"
    ids = make_history(root, 4, nodes=("n1", "n2"), rounds=3, multi=True)
    recs = baseline.set_baseline(root, "lab", runs=ids[:2], who="ops@ctl")
    keys = {(r.scope, r.size, r.span) for r in recs}
    assert keys == {(s, z, s) for s in ("single", "multi") for z in SIZES}
    single = next(r for r in recs if r.scope == "single" and r.size == SIZES[0])
    assert single.n == 2 * 2 * 3  # runs x nodes x rounds, out-of-place only
    assert single.mean == pytest.approx(300, rel=0.02) and single.std > 0
    assert single.gpu_model == "NVIDIA H200" and single.gpu_count == 2
    assert single.runs == ids[:2] and single.set_by == "ops@ctl"
    assert single.how == f"runs {ids[0]} {ids[1]}" and single.unit == "GB/s"
    stored = Index(root).baselines("lab")
    assert sorted(r.model_dump_json() for r in stored) == sorted(r.model_dump_json()
                                                                 for r in recs)
    lines = (root / BASELINES_FILE).read_text().splitlines()
    assert len(lines) == len(recs) and json.loads(lines[0])["set_id"] == recs[0].set_id


def test_regress_uses_the_stored_baseline_instead_of_the_last_runs(tmp_path: Path) -> None:
    """Accepted history wins: the last runs were already slow, the baseline was not."""
    root = tmp_path / "results"
    ids = make_history(root, 8, shift_at=3, shift=0.85)
    auto = regress.evaluate(root).providers[0]
    assert auto.verdict.verdict == "UNCHANGED"  # slow like the runs before it
    baseline.set_baseline(root, "lab", runs=ids[:3], who="ops@ctl")
    (p,) = regress.evaluate(root).providers
    assert p.source is not None and p.source.kind == "stored"
    assert p.source.runs == tuple(ids[:3]) and p.source.set_by == "ops@ctl"
    assert p.verdict.verdict == "REGRESSED"


def test_a_later_set_replaces_the_earlier_and_a_rebuild_keeps_it(tmp_path: Path) -> None:
    root = tmp_path / "results"
    ids = make_history(root, 6)
    baseline.set_baseline(root, "lab", runs=ids[:2])
    second = baseline.set_baseline(root, "lab", last=3)
    assert {tuple(r.runs) for r in Index(root).baselines("lab")} == {tuple(ids[3:])}
    (root / "index.sqlite").unlink()
    n, problems = rebuild_index(root)
    assert n == 6 and not problems
    again = Index(root).baselines("lab")
    assert sorted(r.model_dump_json() for r in again) == sorted(r.model_dump_json()
                                                                for r in second)


def test_last_n_takes_only_complete_runs(tmp_path: Path) -> None:
    root = tmp_path / "results"
    rng = np.random.default_rng(1)
    good = [write_run(root, i, "lab", busbw_values(rng, ["n1"], 3, 300, 0.01))
            for i in range(2)]
    write_run(root, 2, "lab", busbw_values(rng, ["n1"], 3, 100, 0.01), fail=True)
    write_run(root, 3, "lab", busbw_values(rng, ["n1"], 3, 100, 0.01), status="interrupted")
    recs = baseline.set_baseline(root, "lab", last=5)
    assert recs[0].runs == good


def test_bad_requests_are_refused(tmp_path: Path) -> None:
    root = tmp_path / "results"
    rng = np.random.default_rng(2)
    a = write_run(root, 0, "lab", busbw_values(rng, ["n1"], 3, 300, 0.01))
    b = write_run(root, 1, "lab", busbw_values(rng, ["n1"], 3, 300, 0.01), suite_hash="other")
    c = write_run(root, 2, "lab", busbw_values(rng, ["n1"], 3, 300, 0.01),
                  gpu=("NVIDIA H100 80GB HBM3", 8))
    with pytest.raises(UsageError, match="either --runs"):
        baseline.set_baseline(root, "lab")
    with pytest.raises(UsageError, match="either --runs"):
        baseline.set_baseline(root, "lab", runs=[a], last=2)
    with pytest.raises(UsageError, match="no run 20990101-000000-0000"):
        baseline.set_baseline(root, "lab", runs=["20990101-000000-0000"])
    with pytest.raises(UsageError, match="different suites"):
        baseline.set_baseline(root, "lab", runs=[a, b])
    with pytest.raises(UsageError, match="different machines"):
        baseline.set_baseline(root, "lab", runs=[a, c])
    with pytest.raises(UsageError, match="no measurements of provider other"):
        baseline.set_baseline(root, "other", runs=[a])
    with pytest.raises(UsageError, match="--last needs"):
        baseline.set_baseline(root, "lab", last=0)
    assert not (root / BASELINES_FILE).exists()


def test_machine_class_comes_from_preflight_facts(tmp_path: Path) -> None:
    root = tmp_path / "results"
    rng = np.random.default_rng(3)
    known = write_run(root, 0, "lab", busbw_values(rng, ["n1", "n2"], 1, 300, 0.01))
    bare = write_run(root, 1, "lab", busbw_values(rng, ["n1"], 1, 300, 0.01), gpu=None)
    h200 = baseline.machine_class(root, known, ["n1", "n2"])
    assert (h200.gpu_model, h200.gpu_count, str(h200)) == ("NVIDIA H200", 2, "2 x NVIDIA H200")
    unknown = baseline.machine_class(root, bare, ["n1"])
    assert not unknown.known and unknown.matches(h200) and h200.matches(unknown)
    assert not h200.matches(baseline.MachineClass("NVIDIA H100", 8))


def test_a_run_is_never_judged_against_itself(tmp_path: Path) -> None:
    root = tmp_path / "results"
    ids = make_history(root, 3, shift_at=2, shift=0.8)
    baseline.set_baseline(root, "lab", runs=ids)  # the slow last run is part of the set
    (p,) = regress.evaluate(root).providers
    assert p.verdict.verdict == "REGRESSED"
    row = next(r for r in regress.evaluate(root).rows if not r.is_node)
    assert row.result.n_base == 2 * 2 * 3  # the two other runs only
