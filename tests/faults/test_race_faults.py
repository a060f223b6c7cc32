"""Commands that race on one results folder, with the real locking code and real processes:
`index rebuild` while another process resumes a run, and the same import started twice.

The interleavings are forced, not hoped for: the rebuild is held just after it has read the
resuming run's files and lets the resumer go on, then waits until the resumer has either
finished or is blocked on the store's lock (seen in /proc/locks), then swaps its index in.
No cluster: only the controller's results folder is involved.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchestrator import rebuild, store
from orchestrator.files import IMPORT_LOCK, STORE_LOCK
from orchestrator.rebuild import rebuild_index
from orchestrator.records import finding
from orchestrator.steps.nccl import importer
from orchestrator.store import Index, Run
from tests.faults.consistency import assert_consistent, only_run

REPO = Path(__file__).resolve().parents[2]
GPUVET = Path(sys.executable).with_name("gpuvet")
FIX = REPO / "tests" / "fixtures"
ROUNDS = [FIX / "h200x2" / "nccl-tests" / f"all_reduce_8B-128M_g2_round{r}.log" for r in (1, 2, 3)]

# A resume as `_steps.open_run` and the step driver make it: lock, status running, retract the
# step's unfinished units, then (after "go" on stdin) the new units' records and the finish.
RESUMER = """
import sys
from pathlib import Path
from orchestrator.records import Measurement, finding
from orchestrator.store import Run
run = Run.open(Path(sys.argv[1]), sys.argv[2])
with run.locked():
    run.meta.status, run.meta.finished = "running", None
    run.save_meta()
    run.retract({"node:a"}, "nccl")
    print("retracted", flush=True)
    sys.stdin.readline()
    run.add_findings([finding(run.run_id, "nccl", provider="p", node=n, code="NEW",
                              severity="PASS", message=n, unit_key="node:" + n)
                      for n in ("b", "c", "d", "e")])
    run.add_measurements([Measurement(run_id=run.run_id, provider="p", nodes=[n], step="nccl",
                                      metric="busbw", value=float(v), unit="GB/s",
                                      suite_hash="h", scope="single", size=1024, round=v,
                                      unit_key="node:" + n)
                          for n in ("b", "c", "d", "e") for v in (1, 2)])
    run.finish("passed")
print("finished", flush=True)
"""


def _blocked_on(path: Path) -> bool:
    """Someone waits for the flock of `path` (a `->` line of /proc/locks names its inode)."""
    ino = f":{path.stat().st_ino} "
    return any("->" in line and ino in line for line in Path("/proc/locks").read_text().splitlines())


def _wait_until(cond: Callable[[], bool]) -> None:
    for _ in range(3000):  # a bound, never reached unless something hangs
        if cond():
            return
        threading.Event().wait(0.01)
    raise AssertionError("the other process neither finished nor blocked")


def _interrupted_run(root: Path) -> Run:
    run = Run.create(root, command="nccl", suite_hash="h", suite={}, inventory_path=None,
                     providers=["p"], nodes=["a", "b", "c", "d", "e"])
    with run.locked():
        run.add_findings([finding(run.run_id, "nccl", provider="p", node=n, code="OLD",
                                  severity="PASS", message=n, unit_key="node:" + n)
                          for n in ("a", "b")])
        run.mark_done("node:a", "nccl", {})
        run.finish("interrupted")
    return run


def test_rebuild_while_a_resume_writes_leaves_the_index_equal_to_the_jsonl(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
        ) -> None:
    root = tmp_path / "results"
    run = _interrupted_run(root)
    resumer = subprocess.Popen([sys.executable, "-c", RESUMER, str(root), run.run_id],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                               cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert resumer.stdin is not None and resumer.stdout is not None
    try:
        assert resumer.stdout.readline().strip() == "retracted"
        original = rebuild.read_jsonl_salvage

        def read_then_let_the_resume_go(path: Path, model: Any) -> Any:
            got = original(path, model)
            if path == run.dir / "measurements.jsonl":
                # the rebuild has read this run's files: the resume writes its new units now
                assert resumer.stdin is not None
                resumer.stdin.write("go\n")
                resumer.stdin.flush()
                _wait_until(lambda: resumer.poll() is not None
                            or _blocked_on(root / STORE_LOCK))
            return got

        monkeypatch.setattr(rebuild, "read_jsonl_salvage", read_then_let_the_resume_go)
        _, problems = rebuild_index(root)
        assert resumer.wait(timeout=60) == 0
    finally:
        resumer.kill()
    # the rebuild said the run was in flight; the resume's records reached the new index
    assert problems == [f"{run.run_id}: in progress (nccl, pid {run.meta.pid}): indexed as it "
                        "stands; its command goes on writing into the new index"]
    assert_consistent(root, run.dir, [], "nccl")
    assert Index(root).counts(run.run_id) == (5, 8)  # node a's OLD, four NEW; 4 x 2 rounds
    (meta,) = Index(root).runs()
    assert meta.status == "passed"


def test_rebuild_waits_for_a_writer_mid_write_and_says_so(tmp_path: Path) -> None:
    root = tmp_path / "results"
    run = _interrupted_run(root)
    said: list[str] = []
    done = threading.Event()
    with store.store_lock(root):  # a command between its JSONL append and its index write
        rebuilding = threading.Thread(
            target=lambda: (rebuild_index(root, waiting=lambda: said.append("waiting")),
                            done.set()))
        rebuilding.start()
        _wait_until(lambda: _blocked_on(root / STORE_LOCK))
        assert not done.is_set() and said == ["waiting"]
    rebuilding.join(timeout=60)
    assert done.is_set()
    assert Index(root).counts(run.run_id) == (2, 0)


# --- the same import started twice --------------------------------------------------------------

def test_an_import_of_logs_being_imported_waits_and_makes_one_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "results"
    release = threading.Event()
    original = importer.judge_series
    calls: list[str] = []

    def held_first(*args: Any, **kw: Any) -> Any:
        calls.append(threading.current_thread().name)
        if len(calls) == 1:
            release.wait(60)  # the first import is in the middle of its work
        return original(*args, **kw)

    monkeypatch.setattr(importer, "judge_series", held_first)
    outcome: dict[str, Any] = {}

    def one(name: str) -> None:
        try:
            outcome[name] = importer.import_logs(ROUNDS, "lab", 1, root)[0].run_id
        except importer.AlreadyImported as exc:
            outcome[name] = f"already {exc.run_id}"

    first = threading.Thread(target=one, args=("first",), name="first")
    first.start()
    _wait_until(lambda: calls == ["first"])
    second = threading.Thread(target=one, args=("second",), name="second")
    second.start()
    run_dir = only_run(root)
    _wait_until(lambda: _blocked_on(run_dir / ".lock"))  # the second waits for the first
    release.set()
    first.join(60)
    second.join(60)
    assert outcome == {"first": run_dir.name, "second": f"already {run_dir.name}"}
    assert calls == ["first"]  # judged once
    assert "which is importing these logs now: waiting for it to finish" in capsys.readouterr().err
    assert only_run(root) == run_dir
    assert_consistent(root, run_dir, [], "imported")


def test_two_imports_looking_for_an_earlier_run_at_once_make_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first import has looked for an earlier run and found none; the second looks now.
    It must not find none too (and make a second run): it waits for the import lock."""
    root = tmp_path / "results"
    original = importer._already_imported
    looked: list[str] = []

    def first_looks_then_pauses(results: Path, digests: list[str]) -> Any:
        got = original(results, digests)
        looked.append(threading.current_thread().name)
        if len(looked) == 1:
            _wait_until(lambda: len(looked) > 1 or _blocked_on(root / IMPORT_LOCK))
        return got

    monkeypatch.setattr(importer, "_already_imported", first_looks_then_pauses)
    outcome: dict[str, Any] = {}

    def one(name: str) -> None:
        try:
            outcome[name] = importer.import_logs(ROUNDS, "lab", 1, root)[0].run_id
        except importer.AlreadyImported as exc:
            outcome[name] = f"already {exc.run_id}"

    threads = [threading.Thread(target=one, args=(n,), name=n) for n in ("first", "second")]
    threads[0].start()
    _wait_until(lambda: looked == ["first"])
    threads[1].start()
    for t in threads:
        t.join(60)
    run_dir = only_run(root)  # before: a second run with the same 450 measurements
    assert outcome == {"first": run_dir.name, "second": f"already {run_dir.name}"}


def test_the_same_import_started_twice_at_once_makes_one_run(tmp_path: Path) -> None:
    root = tmp_path / "results"
    env = {**os.environ, "COLUMNS": "250", "NO_COLOR": "1", "PYTHONPATH": str(REPO)}
    cmd = [str(GPUVET), "import", "nccl-tests", *map(str, ROUNDS), "-p", "lab",
           "--results", str(root), "--json"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env, cwd=REPO) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    run_dir = only_run(root)  # before: two runs with the same 450 measurements, now and then
    assert_consistent(root, run_dir, [], "imported")
    assert len([json.loads(x) for x in (run_dir / "measurements.jsonl").read_text().splitlines()
                ]) == 450
