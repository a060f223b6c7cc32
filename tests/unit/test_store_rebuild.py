"""`index rebuild` keeps what can be read: a bad JSONL line costs that line, a damaged
run.json is read as far as it goes, and an emptied index is refused with the way out."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from orchestrator.errors import UsageError
from orchestrator.index import BASELINES_FILE, BaselineRecord, add_baselines
from orchestrator.rebuild import rebuild_index
from orchestrator.store import Index, Run
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
        "expected value at line 1 column 1: skipped, the rest of the run indexed",
        # a record the run wrote is gone: no verdict is read from what is left
        f"{run.run_id}: damaged: measurements.jsonl holds 2 of the 3 measurements the run "
        "wrote; indexed as damaged (no verdict)"]
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


# --- damage is named, never silent (issue 34) --------------------------------------------------

def _finished(tmp_path: Path) -> Run:
    run = new_run(tmp_path, command="nccl", providers=["p"])
    run.add_findings([f(run, "a", "ONE"), f(run, "a", "TWO")])
    run.add_measurements([m(run, v, "node:a") for v in (1.0, 2.0, 3.0)])
    run.finish("passed")
    return run


def _status(root: Path, run_id: str) -> str:
    with sqlite3.connect(root / "index.sqlite") as db:
        return str(db.execute("SELECT status FROM runs WHERE run_id=?", (run_id,)).fetchone()[0])


def test_run_json_counts_the_records_the_run_wrote(tmp_path: Path) -> None:
    run = _finished(tmp_path)
    assert json.loads((run.dir / "run.json").read_text())["records"] == {
        "findings": 2, "measurements": 3}
    assert "damage" not in json.loads((run.dir / "run.json").read_text())


def test_a_deleted_run_json_is_listed_and_the_run_indexed_damaged(tmp_path: Path) -> None:
    run = _finished(tmp_path)
    (run.dir / "run.json").unlink()
    n, problems = rebuild_index(tmp_path)
    assert n == 1  # before: dropped without a word ("indexed 0 run(s)")
    assert problems == [f"{run.run_id}: run.json is missing: indexed from what could be read "
                        "(command 'unknown', status error, 2 finding(s), 3 measurement(s)) as damaged "
                        "(no verdict)"]
    assert _status(tmp_path, run.run_id) == "damaged"
    assert Index(tmp_path).counts(run.run_id) == (2, 3)


def test_a_run_folder_with_nothing_left_is_listed(tmp_path: Path) -> None:
    run = _finished(tmp_path)
    for name in ("run.json", "findings.jsonl", "measurements.jsonl"):
        (run.dir / name).unlink()
    (tmp_path / "notes").mkdir()  # not a run's folder: not a run, nothing to say
    n, problems = rebuild_index(tmp_path)
    assert n == 0
    assert problems == [f"{run.run_id}: skipped: run.json is missing and the run has no records"]


@pytest.mark.parametrize("how", ["deleted", "emptied", "replaced", "unreadable"])
@pytest.mark.parametrize("name", ["findings.jsonl", "measurements.jsonl"])
def test_a_record_file_lost_makes_the_run_damaged_never_a_pass(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, how: str) -> None:
    run = _finished(tmp_path)
    other = _finished(tmp_path)
    path = run.dir / name
    if how == "deleted":
        path.unlink()
    elif how == "emptied":
        path.write_text("")
    elif how == "replaced":  # another run's file copied over this one's
        path.write_bytes((other.dir / name).read_bytes())
    else:
        path.unlink()
        path.mkdir()  # reading it fails: not a file gpuvet can read
    n, problems = rebuild_index(tmp_path)
    assert n == 2
    kind, stated = ("findings", 2) if name == "findings.jsonl" else ("measurements", 3)
    said = [p for p in problems if p.startswith(f"{run.run_id}: damaged: ")]
    if how == "replaced":
        assert said == [f"{run.run_id}: damaged: its record files hold records of run "
                        f"{other.run_id}: not this run's, left out (a file was replaced); "
                        "indexed as damaged (no verdict)",
                        f"{run.run_id}: damaged: {name} holds 0 of the {stated} {kind} the run "
                        "wrote; indexed as damaged (no verdict)"]
    else:
        what = "is missing: the run wrote" if how in ("deleted", "unreadable") else \
            "holds 0 of the"
        assert len(said) == 1 and f"damaged: {name} {what} {stated} {kind}" in said[0], problems
    assert _status(tmp_path, run.run_id) == "damaged"
    assert _status(tmp_path, other.run_id) == "passed"  # the other run is untouched
    listed = gpuvet(capsys, "runs", "--results", tmp_path, "--json")
    rows = {r["run"]: r for r in json.loads(listed.stdout)}
    assert rows[run.run_id]["status"] == "damaged" and rows[run.run_id]["verdict"] == "-"
    assert rows[other.run_id]["verdict"] == "PASS"
    shown = gpuvet(capsys, "show", run.run_id, "--results", tmp_path)
    assert shown.returncode == 0, shown.output
    assert f"run {run.run_id}: nccl, damaged" in shown.stdout
    assert f"damaged: {name}" in shown.stdout
    doc = json.loads(gpuvet(capsys, "show", run.run_id, "--results", tmp_path, "--json").stdout)
    assert doc["status"] == "damaged" and doc["verdicts"] == {} and doc["damage"]


def test_a_bad_baseline_line_costs_that_line(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    run = _finished(tmp_path)
    keep = [BaselineRecord(set_id=s, provider=p, gpu_model="H200", gpu_count=2, suite_hash="h",
                           scope="single", engine="nccl-tests", metric="busbw", size=1024,
                           span="single", n=3, mean=1.0, std=0.1, median=1.0, min=0.9, max=1.1,
                           unit="GB/s", runs=[run.run_id], set_at="2026-12-01T00:00:00Z",
                           set_by="t", how="last 1")
            for s, p in (("s1", "p"), ("s2", "q"))]
    add_baselines(tmp_path, keep[:1])
    with (tmp_path / BASELINES_FILE).open("a") as fh:
        fh.write("{not a record\n")
    add_baselines(tmp_path, keep[1:])
    proc = gpuvet(capsys, "index", "rebuild", "--results", tmp_path)
    assert proc.returncode == 0, proc.output  # before: exit 2 for the whole store
    assert proc.stderr.splitlines() == [
        "baselines.jsonl:2: not a valid BaselineRecord record: Invalid JSON: key must be a "
        "string at line 1 column 2: skipped, the other baselines indexed"]
    assert sorted(b.provider for b in Index(tmp_path).baselines()) == ["p", "q"]


def test_an_index_row_of_bad_json_is_named_not_a_crash(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    run = _finished(tmp_path)
    with sqlite3.connect(tmp_path / "index.sqlite") as db:
        db.execute("UPDATE findings SET json='{bad' WHERE run_id=? AND code='ONE'",
                   (run.run_id,))
    for args in (["show", run.run_id], ["export", "--format", "json", "-o",
                                         tmp_path / "x.json", run.run_id]):
        proc = gpuvet(capsys, *args, "--results", tmp_path)
        assert proc.returncode == 2, proc.output  # before: exit 3, a pydantic traceback
        assert (f"index.sqlite: a row of its findings table of run {run.run_id} is damaged"
                in proc.stderr)
        assert "gpuvet index rebuild --results" in proc.stderr
    with pytest.raises(UsageError, match="a row of its findings table"):
        Index(tmp_path).findings(run.run_id)
    with sqlite3.connect(tmp_path / "index.sqlite") as db:
        db.execute("UPDATE runs SET json='[1]' WHERE run_id=?", (run.run_id,))
    proc = gpuvet(capsys, "runs", "--results", tmp_path)
    assert proc.returncode == 2 and "a row of its runs table" in proc.stderr, proc.output
    assert gpuvet(capsys, "index", "rebuild", "--results", tmp_path).returncode == 0
    assert gpuvet(capsys, "show", run.run_id, "--results", tmp_path).returncode == 0


@pytest.mark.parametrize("table", ["findings", "measurements", "runs", "baselines"])
def test_an_index_that_lost_a_table_is_named_not_recreated_empty(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], table: str) -> None:
    run = _finished(tmp_path)
    (tmp_path / BASELINES_FILE).write_text("")  # baselines were set here
    with sqlite3.connect(tmp_path / "index.sqlite") as db:
        db.execute(f"DROP TABLE {table}")
    proc = gpuvet(capsys, "runs", "--results", tmp_path)
    assert proc.returncode == 2, proc.output
    assert f"index.sqlite has lost its {table} table: it no longer matches" in proc.stderr
    with sqlite3.connect(tmp_path / "index.sqlite") as db:  # nothing made up behind the back
        have = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert table not in have
    assert gpuvet(capsys, "index", "rebuild", "--results", tmp_path).returncode == 0
    assert Index(tmp_path).counts(run.run_id) == (2, 3)


def test_a_resume_retract_keeps_the_counts_true(tmp_path: Path) -> None:
    run = _finished(tmp_path)
    run.retract(keep_units=set(), step="nccl")  # the measurements' step: all retracted
    assert json.loads((run.dir / "run.json").read_text())["records"] == {
        "findings": 2, "measurements": 0}
    _, problems = rebuild_index(tmp_path)
    assert problems == [] and _status(tmp_path, run.run_id) == "passed"


def test_an_index_behind_a_finished_run_is_named_and_gives_no_verdict(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _finished(tmp_path)
    with sqlite3.connect(tmp_path / "index.sqlite") as db:  # the rows a lost write never made
        db.execute("DELETE FROM findings WHERE run_id=? AND code='TWO'", (run.run_id,))
    listed = gpuvet(capsys, "runs", "--results", tmp_path, "--json")
    assert listed.returncode == 0, listed.output
    (row,) = json.loads(listed.stdout)
    assert row["status"] == "passed" and row["verdict"] == "-"  # before: PASS from 1 of 2
    assert (f"warning: run {run.run_id}: the index holds 1 of the 2 findings the run wrote: "
            "its verdict is not shown until `gpuvet index rebuild") in listed.stderr
    shown = gpuvet(capsys, "show", run.run_id, "--results", tmp_path, "--json")
    doc = json.loads(shown.stdout)
    assert doc["verdicts"] == {} and doc["damage"] == [
        "index: the index holds 1 of the 2 findings the run wrote"]
    assert gpuvet(capsys, "index", "rebuild", "--results", tmp_path).returncode == 0
    listed = gpuvet(capsys, "runs", "--results", tmp_path, "--json")
    assert json.loads(listed.stdout)[0]["verdict"] == "PASS" and listed.stderr == ""


def test_a_run_whose_index_write_failed_is_named_until_rebuilt(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _finished(tmp_path)
    run.meta.index_stale = True
    run.save_meta()
    listed = gpuvet(capsys, "runs", "--results", tmp_path, "--json")
    assert json.loads(listed.stdout)[0]["verdict"] == "-"
    assert f"run {run.run_id}: an index write failed while it ran" in listed.stderr
    assert gpuvet(capsys, "index", "rebuild", "--results", tmp_path).returncode == 0
    assert json.loads(gpuvet(capsys, "runs", "--results", tmp_path, "--json").stdout
                      )[0]["verdict"] == "PASS"


def test_a_run_of_an_older_gpuvet_keeps_its_document_and_is_not_called_damaged(
        tmp_path: Path) -> None:
    run = _finished(tmp_path)
    doc = json.loads((run.dir / "run.json").read_text())
    del doc["records"]  # as gpuvet wrote run.json before it counted records
    (run.dir / "run.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    old = Run.open(tmp_path, run.run_id)
    old.retract(keep_units=set(), step="nccl")
    old.finish("passed")
    assert "records" not in json.loads((run.dir / "run.json").read_text())
    _, problems = rebuild_index(tmp_path)
    assert problems == [] and _status(tmp_path, run.run_id) == "passed"
