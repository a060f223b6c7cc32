"""A run left "running" by a process that is gone is shown interrupted; a live one never."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import store
from orchestrator.store import Run


def new_run(root: Path, suite: dict[str, object] | None = None) -> Run:
    return Run.create(root, command="pipeline", suite_hash="h", suite=suite or {},
                      inventory_path=None)


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def write_lock(run: Run, pid: int, start: int | None, host: str | None = None) -> None:
    (run.dir / ".lock").write_text(json.dumps({"pid": pid, "host": host or os.uname().nodename,
                                               "start": start}))


def test_a_lock_naming_a_dead_process_is_gone(tmp_path: Path) -> None:
    run = new_run(tmp_path)
    write_lock(run, dead_pid(), 12345)
    assert store.holder_gone(run.dir, run.meta)


def test_a_reused_pid_is_no_alibi(tmp_path: Path) -> None:
    run = new_run(tmp_path)
    # our own pid, alive, but not the process that took the lock: another start time
    start = store.proc_start(os.getpid())
    assert start is not None
    write_lock(run, os.getpid(), start - 1)
    assert store.holder_gone(run.dir, run.meta)
    write_lock(run, os.getpid(), start)
    assert not store.holder_gone(run.dir, run.meta)


def test_a_held_lock_or_another_host_or_a_run_not_yet_locked_is_never_gone(
        tmp_path: Path) -> None:
    run = new_run(tmp_path)
    assert not store.holder_gone(run.dir, run.meta)  # created, not locked: its creator lives
    with run.locked():
        holder = json.loads((run.dir / ".lock").read_text())
        assert holder["pid"] == os.getpid() and holder["start"] == store.proc_start(os.getpid())
        assert not store.holder_gone(run.dir, run.meta)
    write_lock(run, dead_pid(), 1, host="another-host")
    assert not store.holder_gone(run.dir, run.meta)
    # a lock written by an older gpuvet: pid and host, no start time
    (run.dir / ".lock").write_text(f"pid {dead_pid()} on {os.uname().nodename}")
    assert store.holder_gone(run.dir, run.meta)


def test_reap_marks_only_abandoned_running_runs(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    abandoned, live, done = new_run(tmp_path), new_run(tmp_path), new_run(tmp_path)
    write_lock(abandoned, dead_pid(), 7)
    done.finish("passed")
    write_lock(done, dead_pid(), 7)
    assert store.reap_stale(tmp_path) == [abandoned.run_id]
    assert Run.open(tmp_path, abandoned.run_id).meta.status == "interrupted"
    assert Run.open(tmp_path, live.run_id).meta.status == "running"
    assert Run.open(tmp_path, done.run_id).meta.status == "passed"
    err = capsys.readouterr().err
    assert f"gpuvet pipeline --resume {abandoned.run_id}" in err
    # the index says so too
    assert {m.run_id: m.status for m in store.Index(tmp_path).runs()}[abandoned.run_id] == \
        "interrupted"
    assert store.reap_stale(tmp_path) == []
    assert store.reap_stale(tmp_path / "none") == [] and not (tmp_path / "none").exists()


def test_the_suite_and_source_a_run_keeps_are_scrubbed(tmp_path: Path) -> None:
    token = "tok" + "9f8e7d6c5b4a" * 3
    suite = {"nccl": {"source": {"url": f"https://{token}@github.com/NVIDIA/nccl-tests.git"}},
             "train": {"command": f"env WANDB_API_KEY={token[::-1]} python t.py"}}
    run = Run.create(tmp_path, command="train", suite_hash="h", suite=suite,
                     inventory_path=None, source={"url": f"https://x/?sig={token}"})
    assert run.meta.suite_hash == "h"  # the hash is the suite's, taken before
    for path in (run.dir / "run.json", tmp_path / "index.sqlite"):
        data = path.read_bytes()
        assert token.encode() not in data and token[::-1].encode() not in data, path
    assert run.meta.suite["train"]["command"] == "env WANDB_API_KEY=*** python t.py"
