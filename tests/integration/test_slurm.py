"""gpuvet through a real Slurm cluster (slurm_cluster.py): every command a job step.

One 4-node cluster for the module; the tests ask for 2 nodes, the fleet test for 4.
Each test's gpuvet asks for its own allocation
(`salloc --no-shell`, unique job name) and must leave `squeue` empty however it ends:
success, a FAIL, a usage error after the allocation, SIGINT, SIGTERM. An allocation
made outside gpuvet (`job_id`) is used and left running. The nodes have no GPU: health
is NOT MEASURED and nccl falls back to the torch benchmark over gloo (`--torch`).
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
from slurm_cluster import SlurmCluster

GPUVET = [sys.executable, "-m", "orchestrator"]
ROOT = Path(__file__).resolve().parents[2]
SUITE = """name: slurm-test
nccl:
  min_bytes: 256K
  max_bytes: 512K
  step_factor: 2
  iters: 3
  warmup_iters: 1
  rounds: 1
health:
  level: quick
"""
TRAIN = (ROOT / "suites" / "train-cpu.yaml").read_text().split("train:", 1)[1]


def gpuvet(*args: str | Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*GPUVET, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT,
                          env={**os.environ, "COLUMNS": "250", "PYTHONPATH": str(ROOT)})


@pytest.fixture(scope="module")
def lab(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
        ) -> tuple[SlurmCluster, Path, Path]:
    d = tmp_path_factory.mktemp("slurm")
    # one checkpoint folder every node sees (the shared filesystem stands in for NFS)
    ckpt = slurm_cluster.base / "ckpt"
    ckpt.mkdir(exist_ok=True)
    inv = slurm_cluster.write_inventory(d / "inv.yaml", access={"ckpt_dir": str(ckpt)})
    suite = d / "suite.yaml"
    suite.write_text(SUITE + "train:" + TRAIN)
    return slurm_cluster, inv, suite


def _no_jobs_left(c: SlurmCluster) -> None:
    assert c.wait_no_jobs() == [], c.client("squeue").stdout


def test_pipeline_runs_every_step_through_the_scheduler_and_releases_the_allocation(
        lab: tuple[SlurmCluster, Path, Path], tmp_path: Path) -> None:
    c, inv, suite = lab
    res = gpuvet("pipeline", "-i", inv, "--suite", suite, "--results", tmp_path / "r",
                 "--torch", "--min-size", "256K", "--no-train", "--json")
    assert res.returncode == 1, res.stderr[-3000:]  # no NVIDIA driver on the test nodes
    doc = json.loads(res.stdout)
    assert doc["steps"] == ["preflight", "health", "nccl", "regress"]
    found = {(f["code"], f["node"]): f for f in doc["findings"]}
    # the nodes are named as Slurm allocated them
    assert {("NVIDIA_DRIVER_MISSING", "node1"), ("NVIDIA_DRIVER_MISSING", "node2")} <= set(found)
    torch_only = found[("NCCL_TORCH_ONLY", None)]["message"]
    assert "each node's ranks a job step (srun) of Slurm job" in torch_only
    health = [f for f in doc["findings"] if f["step"] == "health"]
    assert health and not any(f["code"].endswith("_FAILED") for f in health), health
    assert not any(f["code"] in ("PREFLIGHT_FAILED", "HEALTH_FAILED", "NCCL_FAILED")
                   for f in doc["findings"]), sorted(found)
    run = json.loads((tmp_path / "r" / doc["run_id"] / "run.json").read_text())
    assert run["nodes"] == ["node1", "node2"] and run["status"] == "failed"
    _no_jobs_left(c)
    assert c.steps() == []


def test_train_restores_each_nodes_checkpoint_on_the_other_allocated_node(
        lab: tuple[SlurmCluster, Path, Path], tmp_path: Path) -> None:
    c, inv, suite = lab
    res = gpuvet("train", "-i", inv, "--suite", suite, "--results", tmp_path / "r",
                 "--no-multi", "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    found = {(f["code"], f["node"]): f for f in json.loads(res.stdout)["findings"]}
    # torchrun on each node through srun, the supervisor's SIGKILL inside the step
    for saved, restored in (("node1", "node2"), ("node2", "node1")):
        ok = found[("TRAIN_RESTORE_OK", saved)]
        assert ok["details"]["exact"] is True, ok["message"]
        assert ok["details"]["restored_on"] == [restored]
        assert ("TRAIN_KILLED", saved) in found
    _no_jobs_left(c)
    assert c.steps() == []


def test_an_existing_allocation_is_used_and_left_running(
        lab: tuple[SlurmCluster, Path, Path], tmp_path: Path) -> None:
    c, _, _ = lab
    job = c.hold(2, name="not-gpuvet")
    try:
        inv = c.write_inventory(tmp_path / "inv.yaml", slurm={"job_id": job, "nodes": None,
                                                               "time_limit": None})
        res = gpuvet("exec", "-i", inv, "--", "echo $SLURM_JOB_ID on $(hostname)")
        assert res.returncode == 0, res.stderr
        assert f"{job} on node1" in res.stdout and f"{job} on node2" in res.stdout
        # files over the steps' stdin and stdout, every byte value, sha256-verified
        blob = tmp_path / "blob.bin"
        blob.write_bytes(bytes(range(256)) * 4096 + b"\r\n\x00")
        put = gpuvet("put", "-i", inv, blob, "blob.bin")
        assert put.returncode == 0, put.stderr
        back = gpuvet("get", "-i", inv, "blob.bin", tmp_path / "back")
        assert back.returncode == 0, back.stderr
        for node in ("node1", "node2"):
            assert (tmp_path / "back" / node / "blob.bin").read_bytes() == blob.read_bytes()
            assert (c.node_tmp(node) / "gpuvet" / "blob.bin").is_file()  # its own /tmp
        assert c.jobs() == [job]
        assert c.steps() == []
        # the launcher of multi-node nccl-tests here: one srun --mpi=pmix step from the
        # first node across both (nccltests.srun_mpi_command; the nodes cannot build
        # nccl-tests, so the ranks are `hostname`)
        from orchestrator import nccltests
        from orchestrator.inventory import load

        nodes = load(inv).with_allocations({"slurmlab": (job, ["node1", "node2"])}).nodes
        step = nccltests.srun_mpi_command([(n, ["hostname"], 1) for n in nodes], {})
        assert step is not None
        pmix = gpuvet("exec", "-i", inv, "-n", "node1", "--",
                      f"srun --mpi=list 2>&1 | grep -qw pmix && {step}")
        assert pmix.returncode == 0, pmix.stderr
        assert sorted(pmix.stdout.split()[-2:]) == ["node1", "node2"], pmix.stdout
    finally:
        c.client("scancel", job)
    _no_jobs_left(c)


def test_a_usage_error_after_the_allocation_still_releases_it(
        lab: tuple[SlurmCluster, Path, Path]) -> None:
    c, inv, _ = lab
    res = gpuvet("exec", "-i", inv, "-n", "node9", "--", "true")
    assert res.returncode == 2, res.stderr
    assert "no node named 'node9'" in res.stderr and "Traceback" not in res.stderr
    _no_jobs_left(c)


def test_a_timed_out_command_is_killed_with_its_step(
        lab: tuple[SlurmCluster, Path, Path]) -> None:
    c, inv, _ = lab
    res = gpuvet("exec", "-i", inv, "-n", "node2", "--timeout", "1", "--", "sleep 60")
    assert res.returncode == 1, res.stderr
    assert "--- node2 (timed out" in res.stdout
    _no_jobs_left(c)
    assert not c.netns_exec("node2", ["pgrep", "-f", "sleep 60"]).stdout.strip()


def _slow_node2(c: SlurmCluster, tmp_path: Path, name: str) -> tuple[Path, Path]:
    """A flag file and an inventory whose python waits on node2 while the flag exists."""
    flag = c.base / f"slow-{name}"
    flag.touch()
    wrapper = c.base / f"python-{name}"
    wrapper.write_text(f"#!/bin/sh\nif [ \"$(hostname)\" = node2 ]; then\n"
                       f"  while [ -e {flag} ]; do sleep 0.1; done\nfi\n"
                       f"exec {c.python} \"$@\"\n")
    wrapper.chmod(0o755)
    return flag, c.write_inventory(tmp_path / "inv.yaml", access={"python": str(wrapper)})


def _preflight_in_flight_on_node2(c: SlurmCluster, inv: Path, suite: Path,
                                  results: Path) -> subprocess.Popen[str]:
    """`gpuvet preflight`, once node1 is done and node2's step runs."""
    proc = subprocess.Popen([*GPUVET, "preflight", "-i", str(inv), "--suite", str(suite),
                             "--results", str(results), "--json"], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "250"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done = list(results.glob("*/nodes/node1/preflight/facts.json"))
        if done and any(s.split(".")[-1].isdigit() for s in c.steps()):
            return proc
        time.sleep(0.1)
    proc.kill()
    proc.wait()
    pytest.fail(f"node2's preflight step never ran; squeue: {c.steps()}")


def test_an_allocation_ended_by_slurm_is_a_finding_on_the_provider_not_a_node_fail(
        lab: tuple[SlurmCluster, Path, Path], tmp_path: Path) -> None:
    c, _, suite = lab
    flag, inv = _slow_node2(c, tmp_path, "ended")
    proc = _preflight_in_flight_on_node2(c, inv, suite, tmp_path / "r")
    try:
        (job,) = c.jobs()
        c.client("scancel", job)  # an operator, a preemption: the job ends under the run
        out, err = proc.communicate(timeout=60)
    finally:
        flag.unlink()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, err[-3000:]
    doc = json.loads(out)
    ended = [f for f in doc["findings"] if f["code"].startswith("SLURM_JOB_")]
    assert [(f["code"], f["node"], f["provider"]) for f in ended] == [
        ("SLURM_JOB_ENDED", None, "slurmlab")], [(f["code"], f["node"], f["message"])
                                                 for f in doc["findings"]]
    assert f"Slurm job {job} ended as CANCELLED" in ended[0]["message"]
    # node2 itself is not failed: its one finding is the scheduler's
    assert not [f for f in doc["findings"] if f["node"] == "node2"]
    assert "warning" not in err  # the ended job needs no scancel: no complaint
    _no_jobs_left(c)


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupted_run_releases_its_allocation_and_resume_asks_for_a_new_one(
        lab: tuple[SlurmCluster, Path, Path], tmp_path: Path, sig: signal.Signals,
        code: int) -> None:
    c, _, suite = lab
    flag, inv = _slow_node2(c, tmp_path, sig.name)
    results = tmp_path / "r"
    proc = _preflight_in_flight_on_node2(c, inv, suite, results)
    try:
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == code, err[-3000:]
    _no_jobs_left(c)
    (run_dir,) = results.glob("*/run.json")
    run = json.loads(run_dir.read_text())
    assert run["status"] == "interrupted"
    flag.unlink()
    if sig == signal.SIGTERM:
        return  # the resume is the same after either signal: once is enough
    again = gpuvet("preflight", "-i", inv, "--suite", suite, "--results", results,
                   "--resume", run["run_id"], "--json")
    assert again.returncode == 1, again.stderr[-3000:]  # no NVIDIA driver
    assert "node:node1" not in again.stderr  # node1's unit was kept, not run again
    doc = json.loads(again.stdout)
    assert {f["node"] for f in doc["findings"] if f["code"] == "NVIDIA_DRIVER_MISSING"} == {
        "node1", "node2"}
    _no_jobs_left(c)


FLEET = """name: slurm-fleet
fleet:
  engine: torch
  plan: pairs
  partners: 1
  repair_partners: 1
  min_bytes: 4M
  max_bytes: 4M
  iters: 3
  warmup_iters: 1
  check: 0
  min_judged_bytes: 4M
  # slow below 20% of the median pair: the shaped node's pairs are at 2%; a loaded 2-core
  # host was seen to slow a healthy pair to 35%
  tolerance: 0.8
  timeout_s: 90
  collective_timeout_s: 20
"""


def test_fleet_pairs_are_job_steps_of_one_allocation_and_name_the_slowed_node(
        lab: tuple[SlurmCluster, Path, Path], tmp_path: Path) -> None:
    c, _, _ = lab
    inv = c.write_inventory(tmp_path / "inv.yaml", slurm={"nodes": 4})
    suite = tmp_path / "fleet.yaml"
    suite.write_text(FLEET)
    bad = "node3"
    shaped = c.netns_exec(bad, ["tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate",
                                "50mbit", "burst", "32kbit", "latency", "50ms"])
    assert shaped.returncode == 0, shaped.stderr
    try:
        res = gpuvet("fleet", "-i", inv, "--suite", suite, "--results", tmp_path / "r",
                     "--json")
    finally:
        c.netns_exec(bad, ["tc", "qdisc", "del", "dev", "eth0", "root"])
    assert res.returncode == 1, res.stderr[-3000:]
    doc = json.loads(res.stdout)
    shown = "\n".join(f"{f['severity']} {f['code']} {f['node']}: {f['message']}"
                      for f in doc["findings"])
    sus = [f for f in doc["findings"] if f["code"] == "FLEET_SUSPECT_NODE"]
    assert [(f["node"], f["severity"]) for f in sus] == [(bad, "FAIL")], shown
    assert sus[0]["details"]["status"] == "confirmed", shown
    assert all(v != "FAIL" for n, v in doc["verdicts"].items() if n != bad), doc["verdicts"]
    _no_jobs_left(c)
