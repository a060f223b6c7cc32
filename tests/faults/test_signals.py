"""SIGINT and SIGTERM mid-run: no new node starts, running commands die, the run says so.

Real processes: the gpuvet CLI as a subprocess, simulated nodes (local executor)
whose python is a wrapper that hangs, so the signal lands while the payload runs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

GPUVET = Path(sys.executable).with_name("gpuvet")


def slow_inventory(tmp_path: Path, marker: str, nodes: int = 3) -> Path:
    slow = tmp_path / "slowpy"
    # the payload hangs; the archive is unpacked by the real python. The marker (a
    # fraction of a second) lets the test find, and prove dead, exactly these processes.
    slow.write_text('#!/bin/sh\ncase "$*" in *"-m payload"*) exec sleep ' + marker + ' ;; esac\n'
                    f'exec {sys.executable} "$@"\n')
    slow.chmod(0o755)
    inv = tmp_path / "inv.yaml"
    lines = ["version: 1", "settings: {concurrency: 2}", "providers:", "  p:",
             "    executor: local", "    nodes:"]
    for i in range(nodes):
        lines.append(f"      - {{name: n{i}, python: {slow}, work_dir: {tmp_path}/w{i}}}")
    inv.write_text("\n".join(lines) + "\n")
    return inv


def sleepers(marker: str) -> list[int]:
    out = subprocess.run(["pgrep", "-f", f"sleep {marker}$"], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def wait_for(pred: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached")


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_mid_preflight(tmp_path: Path, sig: signal.Signals, code: int) -> None:
    marker = f"300.{os.getpid()}{sig.value:02d}"
    inv = slow_inventory(tmp_path, marker)
    results = tmp_path / "results"
    proc = subprocess.Popen([str(GPUVET), "preflight", "-i", str(inv), "--results",
                             str(results)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        # concurrency 2: two nodes are running their (hanging) payload, the third waits
        wait_for(lambda: len(sleepers(marker)) == 2)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, (out, err)
    assert ("terminated" if sig == signal.SIGTERM else "interrupted") in err
    wait_for(lambda: not sleepers(marker), timeout=10)  # the remote groups were killed
    (run,) = [p for p in results.iterdir() if p.is_dir()]
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "interrupted"
    # the third node was never started
    assert not (run / "nodes" / "n2").exists()
    assert not (run / "nodes" / "n2" / "preflight" / "done.json").exists()


def test_closed_stdout_does_not_leave_a_run_running(tmp_path: Path) -> None:
    fix = Path(__file__).resolve().parents[1] / "fixtures" / "h200x2" / "nccl-tests"
    results = tmp_path / "results"
    cmd = (f"{GPUVET} import nccl-tests -p lab --results {results} "
           + " ".join(str(fix / f"all_reduce_8B-128M_g2_round{r}.log") for r in (1, 2, 3))
           + " --verbose | head -c 10")
    res = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True,
                         errors="replace",
                         timeout=60)
    assert "Traceback" not in res.stderr
    (run,) = [p for p in results.iterdir() if p.is_dir()]
    assert json.loads((run / "run.json").read_text())["status"] == "passed"


SLOW_TRAINER = """#!/bin/sh
# a user's trainer, slow enough to be interrupted: step lines, a checkpoint at step 4,
# --resume; the marker lets the test prove this very process gone
start=1
if [ "$1" = "--resume" ] && [ -f "$GPUVET_CKPT_DIR/state" ]; then
  start=$(( $(cat "$GPUVET_CKPT_DIR/state") + 1 ))
fi
i=$start
while [ $i -le 8 ]; do
  echo "step=$i"
  if [ $i -eq 4 ]; then echo $i > "$GPUVET_CKPT_DIR/state"; fi
  sleep $DELAY
  i=$(( i + 1 ))
done
"""


def test_sigint_mid_training_records_nothing_of_the_unit_and_resume_runs_it(
        tmp_path: Path) -> None:
    delay = f"0.3{os.getpid()}"  # also the marker of the trainer's sleeps
    trainer = tmp_path / "trainer.sh"
    trainer.write_text(SLOW_TRAINER.replace("$DELAY", delay))
    trainer.chmod(0o755)
    inv = tmp_path / "inv.yaml"
    inv.write_text("version: 1\nproviders:\n  p:\n    executor: local\n    nodes:\n"
                   f"      - {{name: n1, python: {sys.executable}, work_dir: {tmp_path}/w1}}\n")
    suite = tmp_path / "suite.yaml"
    suite.write_text(f"train:\n  command: {trainer}\n  resume_flag: --resume\n"
                     "  command_kill_after_step: 6\n  timeout_s: 120\n")
    results = tmp_path / "results"
    argv = [str(GPUVET), "train", "-i", str(inv), "--suite", str(suite), "--results",
            str(results)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def stepping() -> bool:  # the reference phase is under way
            out = list((tmp_path / "w1" / "train-runs").glob("*/n1/reference/command.stdout"))
            return bool(out) and "step=2" in out[0].read_text()

        wait_for(stepping)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (out, err)
    wait_for(lambda: not sleepers(delay), timeout=10)  # the trainer was killed
    (run,) = [p for p in results.iterdir() if p.is_dir()]
    assert json.loads((run / "run.json").read_text())["status"] == "interrupted"
    # the phase the interrupt cut short is not judged: no failure of the user's command,
    # and the unit is not done
    text = (run / "findings.jsonl").read_text() if (run / "findings.jsonl").exists() else ""
    assert "TRAIN_" not in text, text
    assert not (run / "nodes" / "n1" / "train" / "done.json").exists()
    # --resume runs the unit again, from its reference phase, to the end
    res = subprocess.run([*argv, "--resume", run.name], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    codes = [json.loads(line)["code"] for line in (run / "findings.jsonl").read_text()
             .splitlines()]
    assert "TRAIN_RESTORE_OK" in codes and "TRAIN_COMMAND_FAILED" not in codes, codes
    assert (run / "nodes" / "n1" / "train" / "done.json").exists()


def test_pipeline_killed_with_sigkill_is_shown_interrupted_and_resumed(tmp_path: Path) -> None:
    """kill -9 leaves no chance to record anything: the next `runs` finds the run's holder
    gone and says "interrupted"; `pipeline --resume` keeps preflight and finishes."""
    marker = f"300.{os.getpid()}77"
    stop = tmp_path / "hang-nccl"
    stop.touch()
    wrapper = tmp_path / "py"
    # the nccl step's payload hangs while the stop file exists; everything else runs
    wrapper.write_text(f'#!/bin/sh\ncase "$*" in *"-m payload nccl"*) [ -f {stop} ] && '
                       f"exec sleep {marker} ;; esac\nexec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    inv = tmp_path / "inv.yaml"
    inv.write_text("version: 1\nproviders:\n  p:\n    executor: local\n    nodes:\n"
                   f"      - {{name: n1, python: {wrapper}, work_dir: {tmp_path}/w1}}\n")
    suite = tmp_path / "suite.yaml"
    suite.write_text("nccl: {min_bytes: 1K, max_bytes: 4K, rounds: 1}\n")
    results = tmp_path / "results"
    argv = [str(GPUVET), "pipeline", "-i", str(inv), "--suite", str(suite), "--results",
            str(results), "--no-health"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: bool(sleepers(marker)), timeout=120)  # preflight done, nccl under way
        proc.kill()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in sleepers(marker):  # the killed controller could not kill its command
            os.kill(pid, signal.SIGKILL)
    (run,) = [p for p in results.iterdir() if p.is_dir()]
    assert json.loads((run / "run.json").read_text())["status"] == "running"
    listed = subprocess.run([str(GPUVET), "runs", "--results", str(results), "--json"],
                            capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)
    assert row["status"] == "interrupted", row
    assert f"pipeline --resume {run.name}" in listed.stderr
    collected = (run / "nodes" / "n1" / "preflight" / "collect.json").stat().st_mtime_ns
    stop.unlink()
    res = subprocess.run([*argv, "--resume", run.name, "--json"], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 1, res.stderr[-2000:]  # no NVIDIA driver: a FAIL, recorded
    doc = json.loads(res.stdout)
    assert doc["run_id"] == run.name and doc["steps"] == ["preflight", "nccl", "regress"]
    assert json.loads((run / "run.json").read_text())["status"] == "failed"
    # preflight's finished unit was kept, not collected again
    assert (run / "nodes" / "n1" / "preflight" / "collect.json").stat().st_mtime_ns == collected
    codes = [f["code"] for f in doc["findings"]]
    # each step judged once: the nccl step ran to its end (no CUDA here: its build fails)
    # (RDMA_NONE: preflight states that the node has no InfiniBand or RoCE port)
    assert sorted(codes) == ["NCCL_BUILD_FAILED", "NVIDIA_DRIVER_MISSING", "RDMA_NONE",
                            "REGRESS_VERDICT"]
