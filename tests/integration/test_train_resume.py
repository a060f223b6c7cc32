"""`gpuvet train` interrupted (SIGINT) while its restore phase runs, then `--resume`: the
resumed attempt must not read the first attempt's files on the node (issue 20: it used to
fail with TRAIN_RESTORE_FAILED "no complete checkpoint"). A file of its own, so that
pytest-xdist can run it beside the other training tests (files are handed out whole)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from cluster import Cluster
from test_train import ENV, ROOT, _no_workers_left


def test_sigint_during_restore_then_resume_passes(cluster: Cluster, tmp_path: Path) -> None:
    """The ranks append to their progress files: a resumed attempt that found the first
    attempt's events there would be killed by the old "commit" event and fail its restore."""
    path = cluster.write_inventory(tmp_path / "inv.yaml", nodes=["node1"],
                                   extra_node_fields={"env": ENV})
    results = tmp_path / "results"
    argv = [str(Path(sys.executable).with_name("gpuvet")), "train", "-i", str(path), "--suite",
            str(ROOT / "suites" / "train-cpu.yaml"), "--results", str(results), "--no-multi"]
    work = Path(cluster.node("node1").work_dir)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not any(p.stat().st_size for p in
                      work.glob("train-runs/*/node1/restore/rank0.jsonl")):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out + err
    (run_dir,) = [p for p in results.iterdir() if p.is_dir()]
    res = subprocess.run([*argv, "--resume", run_dir.name], capture_output=True, text=True,
                         timeout=600)
    codes = [json.loads(line)["code"] for line in
             (run_dir / "findings.jsonl").read_text().splitlines()]
    assert res.returncode == 0, res.stdout + res.stderr
    assert "TRAIN_RESTORE_OK" in codes and "TRAIN_RESTORE_FAILED" not in codes, codes
    sup = json.loads((run_dir / "nodes" / "node1" / "train" / "kill" / "node1" /
                      "supervise.json").read_text())
    assert sup["removed_stale"] > 0  # the first attempt's files were there, and went
    _no_workers_left(cluster)
