"""The health step broken on purpose, on simulated local nodes running the CPU stand-in
(GPUVET_HEALTH_DEVICE=cpu): SIGINT while the GPUs are loaded, then --resume; a node
whose work_dir is full beside one that is fine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.faults.consistency import assert_consistent, jsonl, only_run, tmpfs

GPUVET = Path(sys.executable).with_name("gpuvet")
SUITE = "health:\n  level: standard\n  sustain_s: 2\n  memtest_s: 0.1\n  timeout_s: 120\n"
QUICK = "health:\n  level: quick\n  timeout_s: 120\n"


def _inventory(tmp_path: Path, names: list[str], suite: str = SUITE) -> Path:
    inv = tmp_path / "inv.yaml"
    lines = ["version: 1", "providers:", "  p:", "    executor: local", "    nodes:"]
    for n in names:
        lines.append(f"      - {{name: {n}, python: {sys.executable}, work_dir: {tmp_path}/{n}, "
                     "env: {GPUVET_HEALTH_DEVICE: cpu, OMP_NUM_THREADS: '1'}}")
    inv.write_text("\n".join(lines) + "\n")
    (tmp_path / "suite.yaml").write_text(suite)
    return inv


def _workers(tmp_path: Path) -> list[str]:
    out = subprocess.run(["pgrep", "-f", f"payload health.* --out {tmp_path}"],
                         capture_output=True, text=True)
    return out.stdout.split()


def _wait(pred: object, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError("condition not reached")


def test_sigint_while_the_gpus_are_loaded_then_resume(tmp_path: Path) -> None:
    inv = _inventory(tmp_path, ["n1"])
    results = tmp_path / "results"
    argv = [str(GPUVET), "health", "-i", str(inv), "--suite", str(tmp_path / "suite.yaml"),
            "--results", str(results)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def sustaining() -> bool:
            evs = list((tmp_path / "n1").glob("health-runs/*/gpucpu0.jsonl"))
            return bool(evs) and '"phase": "sustained"' in evs[0].read_text()

        _wait(sustaining)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (out, err)
    _wait(lambda: not _workers(tmp_path), timeout=15)  # every process group of the node
    run = only_run(results)
    assert json.loads((run / "run.json").read_text())["status"] == "interrupted"
    assert not (run / "nodes" / "n1" / "health" / "done.json").exists()
    assert not [f for f in jsonl(run / "findings.jsonl") if f["step"] == "health"]
    res = subprocess.run([*argv, "--resume", run.name], capture_output=True, text=True,
                         timeout=180, env={**os.environ, "COLUMNS": "200"})
    assert res.returncode == 0, res.stdout + res.stderr
    codes = [f["code"] for f in jsonl(run / "findings.jsonl")]
    assert codes.count("GPU_SDC") == 1 and "HEALTH_INTERRUPTED" not in codes, codes
    assert (run / "nodes" / "n1" / "health" / "done.json").is_file()
    assert_consistent(results, run, ["n1"], "health")


def test_a_full_work_dir_fails_that_node_only(tmp_path: Path) -> None:
    inv = _inventory(tmp_path, ["full", "fine"], QUICK)
    results = tmp_path / "results"
    with tmpfs(tmp_path / "full", 64) as work:
        subprocess.run(["sh", "-c", f"head -c 64k /dev/zero > {work}/fill"], check=False)
        res = subprocess.run([str(GPUVET), "health", "-i", str(inv), "--suite",
                              str(tmp_path / "suite.yaml"), "--results", str(results)],
                             capture_output=True, text=True, timeout=180)
    assert res.returncode == 1, res.stdout + res.stderr
    run = only_run(results)
    full = [f for f in jsonl(run / "findings.jsonl") if f["node"] == "full"]
    assert [(f["code"], f["severity"]) for f in full] == [("HEALTH_FAILED", "FAIL")], full
    assert "no space left" in full[0]["message"].lower(), full[0]["message"]
    assert (run / "nodes" / "fine" / "health" / "done.json").is_file()
    assert_consistent(results, run, ["full", "fine"], "health")
