"""`index rebuild` keeps what can be read: a bad JSONL line costs that line, a damaged
run.json is read as far as it goes, and an emptied index is refused with the way out."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import UsageError
from orchestrator.store import Index, rebuild_index
from tests.unit.clirun import gpuvet
from tests.unit.test_store import f, m, new_run


def test_a_bad_line_in_the_middle_costs_that_line_not_the_run(tmp_path: Path) -> None:
    run = new_run(tmp_path, command="nccl")
    run.add_findings([f(run, "a", "KEPT")])
    run.add_measurements([m(run, v, "node:a") for v in (1.0, 2.0, 3.0)])
    run.finish("passed")
    path = run.dir / "measurements.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], '{"run_id": "x", "value": "not a number"}',
                               lines[2], "garbage", ""]))
    n, problems = rebuild_index(tmp_path)
    assert n == 1
    assert problems == [
        f"{run.run_id}: measurements.jsonl:2: not a valid Measurement record: Field required: "
        "skipped, the rest of the run indexed",
        f"{run.run_id}: measurements.jsonl:4: not a valid Measurement record: Invalid JSON: "
        "expected value at line 1 column 1: skipped, the rest of the run indexed"]
    idx = Index(tmp_path)
    assert [r.run_id for r in idx.runs()] == [run.run_id]
    assert sorted(x.value for x in idx.measurements(run.run_id)) == [1.0, 3.0]
    assert [x.code for x in idx.findings(run.run_id)] == ["KEPT"]  # findings included


def test_a_truncated_run_json_is_rebuilt_from_what_can_be_read(tmp_path: Path) -> None:
    run = new_run(tmp_path, command="nccl", providers=["p"])
    run.add_findings([f(run, "a", "KEPT")])
    run.add_measurements([m(run, 7.0, "node:a")])
    run.finish("passed")
    meta = run.dir / "run.json"
    text = meta.read_text()
    meta.write_text(text[:text.index('"pid"')])  # cut off in the middle
    n, problems = rebuild_index(tmp_path)
    assert n == 1 and len(problems) == 1
    assert problems[0].startswith(f"{run.run_id}: run.json is damaged (")
    assert "indexed from what could be read (command 'nccl', status error, 1 finding(s), " \
           "1 measurement(s))" in problems[0]
    (got,) = Index(tmp_path).runs()
    assert got.run_id == run.run_id and got.command == "nccl"
    assert got.started == run.meta.started  # read from the part that survived
    assert got.status == "error"  # its status was cut off: no verdict is made up
    assert got.providers == ["p"] and got.nodes == ["a"] and got.suite_hash == "h"
    assert Index(tmp_path).counts(run.run_id) == (1, 1)


def test_a_run_json_with_nothing_readable_and_no_records_is_skipped(tmp_path: Path) -> None:
    run = new_run(tmp_path)
    (run.dir / "run.json").write_text("")
    n, problems = rebuild_index(tmp_path)
    assert n == 0 and problems == [f"{run.run_id}: skipped: {run.dir / 'run.json'} is "
                                   "unreadable (Expecting value: line 1 column 1 (char 0)): "
                                   "truncated or damaged"]


def test_rebuild_lists_each_skipped_line_on_stderr(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    run = new_run(tmp_path)
    run.add_findings([f(run, "a", "ONE"), f(run, "b", "TWO"), f(run, "c", "THREE")])
    path = run.dir / "findings.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], "{", lines[2], "}"]) + "\n")
    proc = gpuvet(capsys, "index", "rebuild", "--results", tmp_path)
    assert proc.returncode == 0, proc.output
    err = proc.stderr.splitlines()
    assert len(err) == 2
    assert err[0].startswith(f"{run.run_id}: findings.jsonl:2: ")
    assert err[1].startswith(f"{run.run_id}: findings.jsonl:4: ")
    assert "indexed 1 run(s)" in proc.stdout
    assert [x.code for x in Index(tmp_path).findings(run.run_id)] == ["ONE", "THREE"]


def test_a_zero_byte_index_beside_runs_is_refused_with_the_way_out(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = new_run(tmp_path)
    run.finish("passed")
    (tmp_path / "index.sqlite").write_bytes(b"")
    with pytest.raises(UsageError) as info:
        Index(tmp_path)
    assert "is empty (0 bytes) while runs are under" in info.value.what
    assert info.value.hint == (f"run `gpuvet index rebuild --results {tmp_path}` (the runs' "
                               "JSONL files are the record)")
    proc = gpuvet(capsys, "runs", "--results", tmp_path)
    assert proc.returncode == 2 and "gpuvet index rebuild" in proc.output
    assert (tmp_path / "index.sqlite").stat().st_size == 0  # nothing rebuilt behind the back
    assert gpuvet(capsys, "index", "rebuild", "--results", tmp_path).returncode == 0
    proc = gpuvet(capsys, "runs", "--results", tmp_path)
    assert proc.returncode == 0 and run.run_id in proc.stdout


def test_a_zero_byte_index_in_a_fresh_folder_is_a_new_index(tmp_path: Path) -> None:
    (tmp_path / "index.sqlite").write_bytes(b"")
    assert Index(tmp_path).runs() == []
