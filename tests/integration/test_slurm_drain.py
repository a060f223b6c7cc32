"""--drain-on-fail on a real Slurm cluster (slurm_cluster.py): the failing node drained
with the reason `sinfo -R` shows, and `gpuvet slurm resume` undoing it.

The session's cluster has node3 for this test alone (the step tests allocate node1 and
node2): an allocation of node3 made outside gpuvet, a preflight there (no NVIDIA driver
on the test nodes: NVIDIA_DRIVER_MISSING, a FAIL on the provider's side), the drain,
then the resume, and node3 idle again."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from slurm_cluster import SlurmCluster

ROOT = Path(__file__).resolve().parents[2]
PYTHON3 = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else None


def gpuvet(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator", *map(str, args)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "COLUMNS": "250", "PYTHONPATH": str(ROOT)})


def _reasons(c: SlurmCluster) -> dict[str, str]:
    out = c.client("sinfo", "-R", "--noheader", "-o", "%n|%E").stdout
    return dict(line.split("|", 1) for line in out.splitlines() if "|" in line)


def test_drain_on_fail_drains_the_failing_node_and_resume_undoes_it(
        slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    c = slurm_cluster
    err = c.client("salloc", "--no-shell", "-N1", "-w", "node3", "--job-name=drain-lab").stderr
    m = re.search(r"Granted job allocation (\d+)", err)
    assert m, err
    job = m.group(1)
    results = tmp_path / "r"
    try:
        # the system's python3 (no torch to import: the collect takes a second less)
        inv = c.write_inventory(tmp_path / "inv.yaml", slurm={"job_id": job, "nodes": None,
                                                               "time_limit": None},
                                access={"python": PYTHON3 or c.python})
        res = gpuvet("preflight", "-i", inv, "--results", results, "--drain-on-fail", "--json")
        assert res.returncode == 1, res.stderr[-3000:]  # no NVIDIA driver on node3
        doc = json.loads(res.stdout)
        run_id = doc["run_id"]
        assert len(doc["drains"]) == 1, (doc["drain_notes"], doc["findings"])
        (drained,) = doc["drains"]
        assert (drained["node"], drained["outcome"]) == ("node3", "drained")
        reason = drained["reason"]
        assert reason.startswith("gpuvet ") and reason.endswith(f" run {run_id}")
        assert "NVIDIA_DRIVER_MISSING" in reason
        assert _reasons(c) == {"node3": reason}  # only the failing node, as Slurm shows it
    finally:
        c.client("scancel", job)
    res = gpuvet("slurm", "resume", run_id, "--results", results)
    assert res.returncode == 0, res.stderr
    assert res.stdout == f"resumed node3 (drained by this run: {reason})\n"
    c.wait_idle(["node3"], time.monotonic() + 15)
    assert _reasons(c) == {}
    again = gpuvet("slurm", "resume", run_id, "--results", results)
    assert (again.returncode, again.stdout) == (0, f"run {run_id} has no drain left to undo\n")
