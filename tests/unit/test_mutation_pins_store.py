"""The store's contracts that its other tests left open (found by mutation testing).

What a person reads when the store refuses something (message and what to do),
the exact layout of files others read (run.json, done.json, the index columns),
and the edges of the torn-line repair and the atomic write.
"""

from __future__ import annotations

import errno
import json
import os
import re
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import files, index, store
from orchestrator.errors import UsageError
from orchestrator.rebuild import rebuild_index
from orchestrator.records import Finding, Measurement, finding
from orchestrator.store import Index, Run, RunMeta, StoreError, read_jsonl


def new_run(root: Path, **kw: object) -> Run:
    args: dict[str, object] = {"command": "preflight", "suite_hash": "h" * 16, "suite": {},
                               "inventory_path": None}
    args.update(kw)
    return Run.create(root, **args)  # type: ignore[arg-type]


def f(run: Run, node: str | None, code: str, message: str = "m") -> Finding:
    return finding(run.run_id, "preflight", provider="p", node=node, code=code,
                   severity="PASS", message=message)


def m(run: Run, nodes: list[str], inplace: bool | None) -> Measurement:
    return Measurement(run_id=run.run_id, provider="p", nodes=nodes, step="nccl", metric="busbw",
                       value=1.5, unit="GB/s", suite_hash="h", scope="multi", size=1024,
                       inplace=inplace, round=1)


@pytest.fixture
def far_timezone() -> Iterator[None]:
    """Local time 12 hours off UTC: a timestamp taken in local time shows."""
    old = os.environ.get("TZ")
    os.environ["TZ"] = "XXX-12"
    time.tzset()
    try:
        yield
    finally:
        if old is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = old
        time.tzset()


# --- errors a person reads ------------------------------------------------------------

def test_store_error_names_the_path_the_cause_and_the_way_out(tmp_path: Path) -> None:
    p = tmp_path / "run.json"
    err = files.store_error(OSError(errno.EACCES, "Permission denied"), p)
    assert err.what == f"cannot write {p}: Permission denied"
    assert err.hint == ("check that the results folder is writable (or use --results elsewhere)"
                        "; the run can be finished with --resume")
    bare = files.store_error(OSError("no strerror"), p)
    assert bare.what == f"cannot write {p}: no strerror"
    full = files.store_error(OSError(errno.EDQUOT, "Disk quota exceeded"), p)
    assert full.what == f"the results disk is full: cannot write {p}"
    assert full.hint == (f"free space on the filesystem of {tmp_path} (or use --results "
                         "elsewhere); the run can be finished with --resume")


def test_open_refusals_say_what_and_where_to_look(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as bad_id:
        Run.open(tmp_path, "latest")
    assert bad_id.value.hint == f"see `gpuvet runs --results {tmp_path}`"
    with pytest.raises(UsageError) as missing:
        Run.open(tmp_path, "20261130-201500-ab12")
    assert missing.value.what == f"no run 20261130-201500-ab12 under {tmp_path}"
    assert missing.value.hint == f"see `gpuvet runs --results {tmp_path}`"
    run = new_run(tmp_path)
    (run.dir / "run.json").write_text('{"run_id": ')
    with pytest.raises(UsageError) as torn:
        Run.open(tmp_path, run.run_id)
    assert torn.value.hint == ("the run's records are in its JSONL files; restore run.json "
                               "from a backup to use the run again")


def test_old_and_foreign_run_documents_name_their_schema_and_writer(tmp_path: Path) -> None:
    run = new_run(tmp_path)
    path = run.dir / "run.json"
    path.write_text(json.dumps({"schema": 1, "gpuvet_version": "0.0.9"}))  # the first layout
    with pytest.raises(UsageError) as old:
        Run.open(tmp_path, run.run_id)
    assert "with record schema 1;" in old.value.what
    assert old.value.hint == "read it with the gpuvet version that wrote it (0.0.9)"
    path.write_text(json.dumps({"schema_version": 7}))
    with pytest.raises(UsageError) as unknown:
        Run.open(tmp_path, run.run_id)
    assert "schema 7;" in unknown.value.what and str(unknown.value.hint).endswith("(?)")


def test_a_run_document_that_is_not_a_mapping_is_refused(tmp_path: Path) -> None:
    run = new_run(tmp_path)
    (run.dir / "run.json").write_text("[1, 2]")  # JSON, but not a run document at all
    with pytest.raises(UsageError, match="not a run document .a JSON list, not an object"):
        Run.open(tmp_path, run.run_id)


def test_an_invalid_run_document_names_its_first_bad_field(tmp_path: Path) -> None:
    run = new_run(tmp_path)
    data = json.loads((run.dir / "run.json").read_text())
    data["status"] = "exploded"
    (run.dir / "run.json").write_text(json.dumps(data))
    with pytest.raises(UsageError) as info:
        Run.open(tmp_path, run.run_id)
    assert info.value.what.startswith(f"{run.dir / 'run.json'} is not a valid run document: "
                                      "('status',): Input should be 'running'")


def test_index_refusals_say_how_to_rebuild(tmp_path: Path) -> None:
    Index(tmp_path)
    with sqlite3.connect(tmp_path / "index.sqlite") as db:
        db.execute("UPDATE meta SET value='1' WHERE key='schema'")
    with pytest.raises(UsageError) as other:
        Index(tmp_path)
    path = tmp_path / "index.sqlite"
    assert other.value.what == f"{path} has schema 1, this gpuvet reads {store.SCHEMA_VERSION}"
    assert other.value.hint == f"move {path} aside and run `gpuvet index rebuild --results {tmp_path}`"
    path.write_bytes(b"this is not a database, it only has the name of one" * 40)
    with pytest.raises(UsageError) as garbage:
        Index(tmp_path)
    assert garbage.value.what.startswith(f"{path} is not a readable index: ")
    assert garbage.value.hint == f"run `gpuvet index rebuild --results {tmp_path}`"


def test_an_index_that_cannot_be_made_is_the_controllers_error(tmp_path: Path) -> None:
    root = tmp_path / "results"
    root.write_text("a file where the results folder should be")
    with pytest.raises(StoreError) as info:
        Index(root)
    assert info.value.what.startswith(f"cannot write {root / 'index.sqlite'}: ")


def test_a_bad_jsonl_line_tells_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "findings.jsonl"
    path.write_text("{}\n{}\n")
    with pytest.raises(UsageError) as info:
        read_jsonl(path, Finding)
    assert info.value.what.startswith(f"{path}:1 is not a valid Finding record: ")
    assert info.value.hint == "the file was edited or damaged; restore it from a backup"


# --- files others read ------------------------------------------------------------------

def test_write_json_layout_is_stable_for_diffs(tmp_path: Path) -> None:
    p = tmp_path / "a" / "b" / "x.json"  # folders made as needed
    store.write_json(p, {"b": 1, "a": {"path": tmp_path}})
    assert p.read_text() == f'{{\n  "a": {{\n    "path": "{tmp_path}"\n  }},\n  "b": 1\n}}\n'
    assert p.stat().st_mode & 0o777 == 0o644


def test_atomic_write_takes_bytes_and_modes_and_renames_within_the_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "deep" / "er" / "key.bin"
    renames: list[tuple[str, str]] = []
    real = os.replace

    def spy(src: str, dst: str) -> None:
        renames.append((str(src), str(dst)))
        real(src, dst)

    monkeypatch.setattr(store.os, "replace", spy)
    store.atomic_write(target, b"\x00\xff raw", mode=0o600)
    assert target.read_bytes() == b"\x00\xff raw"
    assert target.stat().st_mode & 0o777 == 0o600
    ((src, dst),) = renames
    # a rename is atomic only within one filesystem: the temp file sits beside the target
    assert Path(src).parent == target.parent and Path(src).name.startswith(".key.bin.")
    assert dst == str(target)


@pytest.mark.parametrize("exc", [OSError(errno.ENOSPC, "No space left on device"),
                                 KeyboardInterrupt()])
def test_atomic_write_cleans_up_even_when_the_temp_file_is_already_gone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exc: BaseException) -> None:
    def vanish_then_fail(src: str, dst: str) -> None:
        os.unlink(src)
        raise exc

    monkeypatch.setattr(store.os, "replace", vanish_then_fail)
    with pytest.raises(StoreError if isinstance(exc, OSError) else KeyboardInterrupt):
        store.atomic_write(tmp_path / "x.txt", "data")
    assert list(tmp_path.iterdir()) == []


def test_a_failed_rename_leaves_no_temp_file(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(src: str, dst: str) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(store.os, "replace", fail)
    with pytest.raises(StoreError, match="Input/output error"):
        store.atomic_write(tmp_path / "x.txt", "data")
    assert list(tmp_path.iterdir()) == []


def test_run_json_records_who_ran_what_and_when_in_utc(tmp_path: Path, far_timezone: None) -> None:
    before = time.strftime("%Y%m%d-%H%M", time.gmtime())
    run = new_run(tmp_path, nodes=["b", "a", "b"], providers=["q", "p", "q"])
    after = time.strftime("%Y%m%d-%H%M", time.gmtime())
    assert store.RUN_ID_RE.match(run.run_id)
    assert run.run_id[:13] in (before, after)
    meta = Run.open(tmp_path, run.run_id).meta
    assert meta.pid == os.getpid() and meta.host == os.uname().nodename
    assert meta.nodes == ["b", "a", "b"] and meta.providers == ["p", "q"]
    assert meta.path == str(run.dir) and meta.inventory_sha256 is None
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", meta.started)
    assert meta.started[:13] in (time.strftime("%Y-%m-%dT%H", time.gmtime()),
                                 before[:4] + "-" + before[4:6] + "-" + before[6:8] + "T"
                                 + before[9:11])
    run.finish("passed")
    meta = Run.open(tmp_path, run.run_id).meta
    assert meta.finished is not None and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ",
                                                      meta.finished)
    assert meta.finished >= meta.started


def test_two_runs_never_share_a_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = new_run(tmp_path)
    monkeypatch.setattr(store, "new_run_id", lambda: first.run_id)
    with pytest.raises(StoreError) as info:
        new_run(tmp_path)
    assert info.value.what.startswith(f"cannot write {first.dir}: ")


def test_unit_folders_and_done_markers(tmp_path: Path) -> None:
    run = new_run(tmp_path)
    d = run.node_dir("gpu-1", "preflight")
    assert d == run.dir / "nodes" / "gpu-1" / "preflight" and d.is_dir()
    assert run.node_dir("gpu-1", "preflight") == d  # a second call is fine
    p = run.provider_dir("alpha", "nccl")
    assert p == run.dir / "providers" / "alpha" / "nccl" and p.is_dir()
    assert run.provider_dir("alpha", "nccl") == p
    assert run.rel(d / "nvidia-smi.txt") == "nodes/gpu-1/preflight/nvidia-smi.txt"
    assert not run.is_done("node:gpu-1", "preflight")
    run.mark_done("node:gpu-1", "preflight", {"ok": True, "findings": 3})
    run.mark_done("provider:alpha/multi", "nccl", {"ok": False})
    assert (d / "done.json").is_file()
    assert (run.dir / "providers" / "alpha__multi" / "nccl" / "done.json").is_file()
    assert run.is_done("node:gpu-1", "preflight") and run.is_done("provider:alpha/multi", "nccl")
    assert not run.is_done("node:gpu-2", "preflight") and not run.is_done("node:gpu-1", "nccl")
    assert run.done_summary("node:gpu-1", "preflight") == {"ok": True, "findings": 3}
    assert run.done_summary("provider:alpha/multi", "nccl") == {"ok": False}


def test_index_columns_are_typed_for_queries(tmp_path: Path) -> None:
    run = new_run(tmp_path, nodes=["a", "b"], providers=["p", "q"])
    run.add_measurements([m(run, ["a", "b"], True), m(run, ["a"], False), m(run, ["a"], None)])
    with sqlite3.connect(tmp_path / "index.sqlite") as db:
        rows = db.execute("SELECT nodes, inplace FROM measurements WHERE run_id=?",
                          (run.run_id,)).fetchall()
        runs = db.execute("SELECT providers, nodes FROM runs").fetchall()
    assert rows == [("a,b", 1), ("a", 0), ("a", None)]
    assert runs == [("p,q", "a,b")]
    idx = Index(tmp_path)
    assert len(idx.measurements(run.run_id)) == 3
    assert idx.counts(run.run_id) == (0, 3)
    run.add_findings([f(run, "a", "X"), f(run, None, "Y")])
    assert idx.counts(run.run_id) == (2, 3)
    other = new_run(tmp_path)
    other.add_measurements([m(other, ["c"], None)])
    assert idx.counts(other.run_id) == (0, 1)
    assert len(idx.measurements()) == 4  # every run's when none is named


# --- the JSONL record ---------------------------------------------------------------------

def test_blank_lines_and_spaces_inside_records_are_read(tmp_path: Path) -> None:
    run = new_run(tmp_path)
    path = run.dir / "findings.jsonl"
    one, two = f(run, "a", "ONE", "GPU 0 has 40 GB"), f(run, "b", "TWO", "a b c")
    path.write_text(one.model_dump_json() + "\n\n" + two.model_dump_json() + "\n")
    assert [(x.code, x.message) for x in run.findings()] == [("ONE", "GPU 0 has 40 GB"),
                                                             ("TWO", "a b c")]


def test_a_clean_append_warns_of_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = new_run(tmp_path)
    run.add_findings([f(run, "a", "ONE")])
    run.add_findings([f(run, "a", "TWO"), f(run, "b", "THREE")])
    assert [x.code for x in run.findings()] == ["ONE", "TWO", "THREE"]
    assert capsys.readouterr().err == ""


def test_the_repair_of_a_torn_tail_is_reported_with_the_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = new_run(tmp_path)
    run.add_findings([f(run, "a", "ONE")])
    path = run.dir / "findings.jsonl"
    with path.open("ab") as fh:
        fh.write(b'{"run_id": "torn')
    run.add_findings([f(run, "a", "TWO")])
    err = capsys.readouterr().err
    assert f"warning: {path}: cut off an incomplete last line left by an earlier crash" in err
    assert [x.code for x in run.findings()] == ["ONE", "TWO"]


def test_measurements_reach_the_index(tmp_path: Path) -> None:
    run = new_run(tmp_path)
    run.add_measurements([m(run, ["a"], None)])
    assert [x.nodes for x in Index(tmp_path).measurements(run.run_id)] == [["a"]]
    run.add_measurements([])
    assert len(run.measurements()) == 1


# --- rebuilding the index ------------------------------------------------------------------

def test_rebuild_of_a_missing_folder_names_it(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as info:
        rebuild_index(tmp_path / "nowhere")
    assert info.value.what == f"no results folder {tmp_path / 'nowhere'}"


def test_rebuild_walks_past_strays_and_damage_to_every_run(tmp_path: Path) -> None:
    good1 = new_run(tmp_path)
    good2 = new_run(tmp_path)
    (tmp_path / "00-notes").mkdir()  # sorted before the runs: not a run, skipped
    (tmp_path / "00-broken").mkdir()
    (tmp_path / "00-broken" / "run.json").write_text("{}")  # a run folder that cannot be read
    good1.add_findings([f(good1, "a", "X")])
    good1.meta.index_stale = True
    good1.save_meta()
    n, problems = rebuild_index(tmp_path)
    assert n == 2 and len(problems) == 1 and problems[0].startswith("00-broken: ")
    runs = {r.run_id: r for r in Index(tmp_path).runs()}
    assert set(runs) == {good1.run_id, good2.run_id}
    assert runs[good1.run_id].index_stale is False  # the rebuilt index is current again
    assert Index(tmp_path).counts(good1.run_id) == (1, 0)


def test_rebuild_that_cannot_swap_the_index_in_says_so(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    new_run(tmp_path)

    def full(src: str, dst: str) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store.os, "replace", full)
    with pytest.raises(StoreError) as info:
        rebuild_index(tmp_path)
    assert info.value.what == f"the results disk is full: cannot write {tmp_path / 'index.sqlite'}"
    assert not list(tmp_path.glob(".index.sqlite.*"))


# --- the inventory copy -------------------------------------------------------------------

def test_inventory_copy_keeps_plain_values_and_nulls_and_reads_bad_bytes(tmp_path: Path) -> None:
    inv = tmp_path / "inv.yaml"
    token = "ghp_" + "Zx9Yw8Vu7" * 4
    inv.write_bytes(b"# caf\xe9 (latin-1 in a comment)\nproviders:\n  p:\n    access:\n"
                    b"      env: {NCCL_DEBUG: INFO, EMPTY: null, HF_TOKEN: " + token.encode()
                    + b", COUNT: 8}\n")
    copy = store._inventory_copy(inv)
    assert "caf\ufffd" in copy
    # a file the reader refuses is kept as written, line by line, scrubbed
    assert "NCCL_DEBUG: INFO" in copy and "COUNT: 8" in copy
    assert "EMPTY: null" in copy and "None" not in copy
    assert token not in copy and "HF_TOKEN: ***" in copy


def test_inventory_copy_of_a_refused_file_drops_plain_secret_values(tmp_path: Path) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_bytes(b"# caf\xe9\nproviders:\n  p:\n    access:\n      env:\n"
                    b"        DB_PASSWORD: hunter2-plain\n        NOTE: kept\n"
                    b"      flow: {API_KEY: 'x y', COUNT: 8}\n")
    copy = store._inventory_copy(inv)
    assert "hunter2" not in copy and "x y" not in copy
    assert "DB_PASSWORD: ***" in copy and "NOTE: kept" in copy and "COUNT: 8" in copy
    assert copy.count("\n") == 8


def test_inventory_copy_of_text_yaml_cannot_read_is_still_scrubbed(tmp_path: Path) -> None:
    inv = tmp_path / "inv.yaml"
    token = "ghp_" + "Zx9Yw8Vu7" * 4
    inv.write_text(f"providers: [unclosed\n  token: {token}\n")
    copy = store._inventory_copy(inv)
    assert copy.startswith("providers: [unclosed\n") and token not in copy


def test_run_meta_round_trips_through_run_json(tmp_path: Path) -> None:
    run = new_run(tmp_path, source={"files": ["a.log"]})
    assert RunMeta.model_validate_json((run.dir / "run.json").read_text()) == run.meta


def test_index_and_baselines_make_their_results_folder(tmp_path: Path) -> None:
    Index(tmp_path / "a" / "b")
    assert (tmp_path / "a" / "b" / "index.sqlite").is_file()
    record = index.BaselineRecord(
        set_id="s1", provider="p", gpu_model="H200", gpu_count=2, suite_hash="h", scope="single",
        engine="nccl-tests", metric="busbw", size=1 << 27, span="single", n=3, mean=285.0, std=1.0,
        median=285.3, min=284.4, max=285.8, unit="GB/s", runs=["r1"], set_at="t", set_by="me",
        how="last 3")
    root = tmp_path / "c" / "d"
    index.add_baselines(root, [record])
    assert Index(root).baselines() == [record]
    index.add_baselines(tmp_path / "e", [])
    assert not (tmp_path / "e").exists()


def test_a_done_marker_that_is_not_a_mapping_summarises_as_nothing(tmp_path: Path) -> None:
    run = new_run(tmp_path)
    run.mark_done("node:a", "preflight", {"ok": True})
    (run.node_dir("a", "preflight") / "done.json").write_text("[1, 2]\n")
    assert run.is_done("node:a", "preflight") and run.done_summary("node:a", "preflight") == {}
