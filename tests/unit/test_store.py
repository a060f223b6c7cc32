"""The store: JSONL is the record, the index agrees with it, and damage is reported, not fatal."""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import threading
from pathlib import Path

import pytest

from orchestrator import store
from orchestrator.errors import UsageError
from orchestrator.rebuild import rebuild_index
from orchestrator.records import Finding, Measurement, finding
from orchestrator.store import Index, Run, StoreError, read_jsonl


def new_run(root: Path, **kw: object) -> Run:
    args: dict[str, object] = {"command": "preflight", "suite_hash": "h" * 16, "suite": {},
                               "inventory_path": None}
    args.update(kw)
    return Run.create(root, **args)  # type: ignore[arg-type]


def f(run: Run, node: str | None, code: str, unit: str | None = None) -> Finding:
    return finding(run.run_id, "preflight", provider="p", node=node, code=code,
                   severity="PASS", message=code, unit_key=unit)


def m(run: Run, value: float, unit: str) -> Measurement:
    return Measurement(run_id=run.run_id, provider="p", nodes=["a"], step="nccl", metric="busbw",
                       value=value, unit="GB/s", suite_hash="h", scope="single", size=1024,
                       inplace=False, round=1, unit_key=unit)


def index_rows(root: Path, table: str, run_id: str) -> int:
    with sqlite3.connect(root / "index.sqlite") as db:
        return int(db.execute(f"SELECT count(*) FROM {table} WHERE run_id=?",
                              (run_id,)).fetchone()[0])


def test_a_torn_last_line_is_skipped_with_a_warning(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    run = new_run(tmp_path)
    run.add_findings([f(run, "a", "ONE"), f(run, "b", "TWO")])
    path = run.dir / "findings.jsonl"
    with path.open("ab") as fh:  # power loss in the middle of the third record
        fh.write(f(run, "c", "THREE").model_dump_json().encode()[:40])
    assert [x.code for x in run.findings()] == ["ONE", "TWO"]
    assert "last line is incomplete" in capsys.readouterr().err
    # the next append repairs the file instead of gluing a record to the torn one
    run.add_findings([f(run, "d", "FOUR")])
    assert [x.code for x in run.findings()] == ["ONE", "TWO", "FOUR"]
    assert path.read_bytes().endswith(b"\n")


def test_a_bad_line_in_the_middle_is_corruption_named_by_line(tmp_path: Path) -> None:
    run = new_run(tmp_path)
    run.add_findings([f(run, "a", "ONE")])
    path = run.dir / "findings.jsonl"
    path.write_text(path.read_text() + "{not json}\n" + f(run, "b", "TWO").model_dump_json()
                    + "\n")
    with pytest.raises(UsageError, match=r"findings.jsonl:2 is not a valid Finding"):
        read_jsonl(path, Finding)


def test_truncated_run_json_is_reported(tmp_path: Path) -> None:
    run = new_run(tmp_path)
    meta = run.dir / "run.json"
    meta.write_text(meta.read_text()[:25])
    with pytest.raises(UsageError, match="unreadable .*truncated or damaged"):
        Run.open(tmp_path, run.run_id)


def test_a_run_of_another_schema_is_refused(tmp_path: Path) -> None:
    run = new_run(tmp_path)
    data = json.loads((run.dir / "run.json").read_text())
    data["schema_version"] = 1
    (run.dir / "run.json").write_text(json.dumps(data))
    with pytest.raises(UsageError, match="record schema 1"):
        Run.open(tmp_path, run.run_id)


@pytest.mark.parametrize("bad", ["../etc", "..", "/tmp/x", "20261130-201500-ab12/../../x",
                                 "nope"])
def test_run_ids_outside_the_root_are_refused(tmp_path: Path, bad: str) -> None:
    with pytest.raises(UsageError, match="not a run id"):
        Run.open(tmp_path, bad)


def test_retract_keeps_finished_units_and_the_index_agrees(tmp_path: Path) -> None:
    run = new_run(tmp_path)
    run.add_findings([f(run, "a", "A_DONE", "node:a"), f(run, "b", "B_FAILED", "node:b"),
                      f(run, None, "CROSS", "provider:p/cross")])
    other_step = finding(run.run_id, "nccl", provider="p", node="b", code="NCCL_OTHER",
                         severity="PASS", message="x", unit_key="node:b")
    run.add_findings([other_step])
    run.add_measurements([m(run, 1.0, "node:a"), m(run, 2.0, "node:b")])
    run.retract(keep_units={"node:a"}, step="preflight")
    # the step's unfinished units go; another step's records stay whatever their unit
    assert [x.code for x in run.findings()] == ["A_DONE", "NCCL_OTHER"]
    # measurements of another step are not touched by a preflight retract
    assert len(run.measurements()) == 2
    run.retract(keep_units={"node:a"}, step="nccl")
    assert [x.value for x in run.measurements()] == [1.0]
    assert [x.code for x in run.findings()] == ["A_DONE"]
    assert index_rows(tmp_path, "findings", run.run_id) == 1
    assert index_rows(tmp_path, "measurements", run.run_id) == 1
    assert Index(tmp_path).findings(run.run_id)[0].code == "A_DONE"


def test_retract_writes_a_new_file_and_renames_it(tmp_path: Path) -> None:
    run = new_run(tmp_path)
    run.add_findings([f(run, "a", "A", "node:a")])
    before = os.stat(run.dir / "findings.jsonl").st_ino
    run.retract(keep_units={"node:a"}, step="preflight")
    assert os.stat(run.dir / "findings.jsonl").st_ino != before


def test_index_rebuild_recreates_what_the_jsonl_holds(tmp_path: Path) -> None:
    a, b = new_run(tmp_path), new_run(tmp_path, command="nccl")
    a.add_findings([f(a, "n", "X")])
    b.add_measurements([m(b, 3.5, "node:n")])
    b.finish("passed")
    (tmp_path / "index.sqlite").unlink()
    n, problems = rebuild_index(tmp_path)
    assert (n, problems) == (2, [])
    idx = Index(tmp_path)
    assert {r.run_id: r.status for r in idx.runs()} == {a.run_id: "running", b.run_id: "passed"}
    assert [x.code for x in idx.findings(a.run_id)] == ["X"]
    assert [x.value for x in idx.measurements(b.run_id)] == [3.5]


def test_rebuild_names_a_damaged_run_and_keeps_the_others(tmp_path: Path) -> None:
    good, bad = new_run(tmp_path), new_run(tmp_path)
    (bad.dir / "run.json").write_text("{")
    n, problems = rebuild_index(tmp_path)
    assert n == 1 and len(problems) == 1 and bad.run_id in problems[0]
    assert [r.run_id for r in Index(tmp_path).runs()] == [good.run_id]


def test_a_failed_index_write_leaves_the_jsonl_and_marks_the_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    run = new_run(tmp_path)

    def broken(self: Index, findings: object) -> None:
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(Index, "add_findings", broken)
    run.add_findings([f(run, "a", "KEPT")])
    assert [x.code for x in run.findings()] == ["KEPT"]
    assert "gpuvet index rebuild" in capsys.readouterr().err
    assert json.loads((run.dir / "run.json").read_text())["index_stale"] is True


def test_a_full_disk_is_the_controllers_error(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    run = new_run(tmp_path)

    def full(*a: object, **k: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store.os, "fsync", full)
    with pytest.raises(StoreError, match="results disk is full") as info:
        run.add_findings([f(run, "a", "X")])
    assert info.value.exit_code == 3
    with pytest.raises(StoreError, match="results disk is full"):
        store.write_json(run.dir / "x.json", {})
    assert not [p for p in run.dir.iterdir() if p.name.startswith(".x.json")]


def test_a_second_holder_of_a_run_is_refused(tmp_path: Path) -> None:
    run = new_run(tmp_path)
    other = Run.open(tmp_path, run.run_id)
    entered = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with run.locked():
            entered.set()
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    assert entered.wait(10)
    try:
        with pytest.raises(UsageError, match=f"run {run.run_id} is in use by pid {os.getpid()}"), \
                other.locked():
            pass
    finally:
        release.set()
        t.join()
    with other.locked():  # free again
        pass


def test_guard_records_why_a_run_died(tmp_path: Path) -> None:
    run = new_run(tmp_path)
    with pytest.raises(KeyboardInterrupt), run.guard():
        raise KeyboardInterrupt
    assert Run.open(tmp_path, run.run_id).meta.status == "interrupted"
    run2 = new_run(tmp_path)
    with pytest.raises(RuntimeError), run2.guard():
        raise RuntimeError("bug")
    assert Run.open(tmp_path, run2.run_id).meta.status == "error"


def test_a_finished_run_keeps_no_staged_archives(tmp_path: Path) -> None:
    run = new_run(tmp_path)
    (run.dir / ".staging").mkdir()
    (run.dir / ".staging" / "payload-abc.tar.gz").write_bytes(b"x")
    run.finish("passed")
    assert not (run.dir / ".staging").exists()
    assert oct((run.dir / "run.json").stat().st_mode & 0o777) == "0o644"


def test_the_index_commits_without_fsync_it_is_rebuilt_from_the_jsonl(tmp_path: Path) -> None:
    # derived data: an fsync per commit cost ~20 ms under the index lock, serialised
    idx = Index(tmp_path)
    with idx._connect() as db:
        assert db.execute("PRAGMA synchronous").fetchone()[0] == 0  # OFF


def test_appends_are_synced_before_returning_but_outside_the_run_lock(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = new_run(tmp_path)
    synced: list[tuple[str, bool]] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append((os.readlink(f"/proc/self/fd/{fd}"), run._lock.locked()))
        real(fd)

    monkeypatch.setattr(store.os, "fsync", fsync)
    run.add_findings([f(run, "a", "X", "node:a")])
    run.add_measurements([m(run, 1.0, "node:a")])
    jsonl = [(Path(p).name, held) for p, held in synced if p.endswith(".jsonl")]
    # each append made durable before add_* returned, with the lock already let go
    assert jsonl == [("findings.jsonl", False), ("measurements.jsonl", False)]
    assert [x.code for x in run.findings()] == ["X"]
