"""The pipeline lock: one pipeline per results folder; a dead holder's lock is taken over."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import pipeline
from orchestrator.pipeline import LOCK_NAME, LockHeld, pipeline_lock
from tests.unit.clirun import gpuvet

HOLDER = """
import fcntl, json, os, socket, sys
f = open(sys.argv[1], "a+")
fcntl.flock(f.fileno(), fcntl.LOCK_EX)
f.seek(0); f.truncate()
f.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                    "started": "2026-01-01T00:00:00Z", "command": "gpuvet pipeline -i x"}))
f.flush()
print("held", flush=True)
sys.stdin.read()  # hold until told
"""


@pytest.fixture()
def holder(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process holding the lock, as a running pipeline would."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / LOCK_NAME)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.communicate()


def test_the_lock_names_its_holder_and_is_released(tmp_path: Path) -> None:
    with pipeline_lock(tmp_path, "gpuvet pipeline -i inv.yaml") as path:
        doc = json.loads(path.read_text())
        assert doc["pid"] == os.getpid() and doc["host"] == socket.gethostname()
        assert doc["command"] == "gpuvet pipeline -i inv.yaml" and doc["started"]
    assert path.read_text() == ""
    with pipeline_lock(tmp_path, "again"):  # free again
        pass


def test_a_second_pipeline_is_refused_with_who_holds_it(tmp_path: Path,
                                                        holder: subprocess.Popen[str]) -> None:
    with pytest.raises(LockHeld) as exc, pipeline_lock(tmp_path, "second"):
        pytest.fail("entered a held lock")
    assert exc.value.exit_code == 2
    assert f"pid {holder.pid} on {socket.gethostname()}" in exc.value.what
    assert "gpuvet pipeline -i x" in exc.value.what and exc.value.hint


def test_the_command_exits_2_while_another_pipeline_holds_the_lock(
        tmp_path: Path, holder: subprocess.Popen[str], capsys: pytest.CaptureFixture[str]
) -> None:
    res = gpuvet(capsys, "pipeline", "-i", tmp_path / "inv.yaml", "--results", tmp_path)
    assert res.returncode == 2, res.output
    assert "in use by another pipeline" in res.stderr and f"pid {holder.pid}" in res.stderr
    assert "Traceback" not in res.stderr
    assert not [p for p in tmp_path.iterdir() if p.name != LOCK_NAME]  # no run was started


def test_the_lock_of_a_killed_pipeline_is_taken_over_with_a_warning(
        tmp_path: Path, holder: subprocess.Popen[str], capsys: pytest.CaptureFixture[str]
) -> None:
    holder.kill()  # SIGKILL: no cleanup, the file still names it; the kernel drops the flock
    holder.communicate()
    assert str(holder.pid) in (tmp_path / LOCK_NAME).read_text()
    capsys.readouterr()
    with pipeline_lock(tmp_path, "mine") as path:
        assert json.loads(path.read_text())["pid"] == os.getpid()
    err = capsys.readouterr().err
    assert "took over the stale pipeline lock" in err and f"pid {holder.pid}" in err
    assert "no longer running" in err


def test_a_lock_left_by_another_host_is_refused(tmp_path: Path) -> None:
    (tmp_path / LOCK_NAME).write_text(json.dumps(
        {"pid": 1, "host": "other-controller", "started": "2026-01-01T00:00:00Z",
         "command": "gpuvet pipeline"}))
    with pytest.raises(LockHeld, match="another host") as exc, pipeline_lock(tmp_path, "mine"):
        pass
    assert exc.value.hint and f"remove {tmp_path / LOCK_NAME}" in exc.value.hint


def test_an_unreadable_lock_file_does_not_stop_a_free_lock(tmp_path: Path) -> None:
    (tmp_path / LOCK_NAME).write_text("garbage")
    with pipeline_lock(tmp_path, "mine") as path:
        assert json.loads(path.read_text())["command"] == "mine"


def test_the_suite_asks_for_training_by_having_a_train_section(tmp_path: Path) -> None:
    from orchestrator.suite import Suite, load_suite

    assert not pipeline.wants_train(Suite(), None)
    if "train" in Suite.model_fields:
        p = tmp_path / "s.yaml"
        p.write_text("train: {model: tiny}\n")
        assert pipeline.wants_train(load_suite(p), None)
        assert not pipeline.wants_train(load_suite(p), False)
    assert pipeline.wants_train(Suite(), True) == ("train" in Suite.model_fields)


def test_the_verdict_becomes_findings_of_the_run(tmp_path: Path) -> None:
    """One run, one verdict: a regression is a FAIL of the run; a lone node is the node's."""
    from orchestrator.analysis.regress import Settings
    from orchestrator.store import Run
    from tests.bench.regress_bench import make_history

    root = tmp_path / "results"
    ids = make_history(root, 12, nodes=("n1", "n2", "n3"), rounds=5, cv=0.005,
                       node_factor=lambda i: {"n2": 0.8} if i == 11 else {})
    run = Run.open(root, ids[-1])
    ev, fs = pipeline.judge(run, Settings(), last=10, min_size=16 << 20)
    assert ev.regressed
    by_code = {(f.code, f.node): f for f in fs}
    prov = by_code[("REGRESS_VERDICT", None)]
    assert prov.severity == "INFO" and prov.details["attribution"] == "node"
    node = by_code[("REGRESS_NODE", "n2")]
    assert node.severity == "FAIL" and node.evidence == ["regress.json"]
    assert json.loads((run.dir / "regress.json").read_text())["providers"][0]["nodes"] == ["n2"]
    assert {(f.code, f.node) for f in run.findings() if f.step == "regress"} == set(by_code)

    whole = make_history(tmp_path / "r2", 12, shift_at=11, shift=0.8)
    _, fs2 = pipeline.judge(Run.open(tmp_path / "r2", whole[-1]), Settings(), last=10,
                            min_size=16 << 20)
    assert [(f.code, f.severity) for f in fs2] == [("REGRESS_VERDICT", "FAIL")]
    first = make_history(tmp_path / "r3", 1)
    _, fs3 = pipeline.judge(Run.open(tmp_path / "r3", first[0]), Settings(), last=10,
                            min_size=16 << 20)
    assert [(f.code, f.severity) for f in fs3] == [("REGRESS_VERDICT", "INFO")]
    assert "NOT ENOUGH DATA" in fs3[0].message


def test_a_step_resuming_a_pipeline_run_points_to_pipeline_resume_which_exists(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.store import Run
    from orchestrator.suite import Suite

    inv = tmp_path / "inv.yaml"
    inv.write_text("version: 1\nproviders:\n  p:\n    executor: local\n    nodes:\n"
                   f"      - {{name: n1, work_dir: {tmp_path}/w}}\n")
    results = tmp_path / "results"
    suite = Suite()
    run = Run.create(results, command="pipeline", suite_hash=suite.hash,
                     suite=suite.model_dump(mode="json"), inventory_path=inv)
    run.finish("interrupted")
    res = gpuvet(capsys, "preflight", "-i", inv, "--results", results, "--resume", run.run_id)
    assert res.returncode == 2
    assert f"gpuvet pipeline --resume {run.run_id}" in res.stderr
    assert "--resume RUN_ID" in gpuvet(capsys, "pipeline", "--help").stdout
    # and the other way round: pipeline --resume of a step's run names that step
    other = Run.create(results, command="nccl", suite_hash=suite.hash,
                       suite=suite.model_dump(mode="json"), inventory_path=inv)
    other.finish("interrupted")
    res = gpuvet(capsys, "pipeline", "-i", inv, "--results", results, "--resume", other.run_id)
    assert res.returncode == 2 and f"gpuvet nccl --resume {other.run_id}" in res.stderr
