"""The loader reads what the steps stored, with typed columns."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.analysis import frames
from orchestrator.errors import UsageError
from orchestrator.steps.nccl.importer import import_logs

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "h200x2" / "nccl-tests"
ROUNDS = [FIX / f"all_reduce_8B-128M_g2_round{r}.log" for r in (1, 2, 3)]


def test_frames_hold_the_imported_run(tmp_path: Path) -> None:
    root = tmp_path / "results"
    run, findings, ms = import_logs(ROUNDS, "lab", 1, root)
    run.finish("passed")
    f = frames.load(root)
    assert list(f.runs["run_id"]) == [run.run_id]
    assert f.runs.loc[0, "providers"] == ["lab"] and f.runs.loc[0, "status"] == "passed"
    assert len(f.measurements) == len(ms) == 450
    busbw = f.measurements[(f.measurements.metric == "busbw") & (f.measurements["size"] == 128 << 20)
                           & (f.measurements.inplace == False)]  # noqa: E712
    assert sorted(busbw["round"]) == [1, 2, 3]
    assert set(busbw["scope"]) == {"single"} and set(busbw["engine"]) == {"nccl-tests"}
    want = sorted(m.value for m in ms if m.metric == "busbw" and m.size == 128 << 20
                  and not m.inplace)
    assert sorted(busbw["value"]) == want
    assert set(f.findings["code"]) == {x.code for x in findings}
    assert frames.runs(root, providers=["other"]).empty
    assert frames.runs(root, since="2999-01-01").empty


def test_no_store_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no results under"):
        frames.load(tmp_path / "nothing")
