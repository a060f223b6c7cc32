"""Two scheduled pipeline runs on the real cluster, the second over a slower fabric.

The test nodes have no GPUs, so nccl-tests cannot be built there; the pipeline
then measures the fabric between the nodes with the torch.distributed benchmark
(gloo over the namespaces' veth links). Between the runs the link of node2 is
throttled with a token bucket (tc tbf inside its namespace): a re-cabled or
slower fabric. The second run must end REGRESSED with exit 1, and a pipeline
started while it runs must be refused by the lock.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cluster import Cluster

GPUVET = str(Path(sys.executable).with_name("gpuvet"))
SUITE = """name: pipeline-test
nccl:
  min_bytes: 256K
  max_bytes: 1M
  step_factor: 2
  iters: 5
  warmup_iters: 1
  rounds: 4
"""


def gpuvet(*args: str | Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([GPUVET, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "COLUMNS": "250"})


@pytest.fixture()
def setup(cluster: Cluster, tmp_path: Path) -> tuple[Path, Path, Path]:
    inv = cluster.write_inventory(
        tmp_path / "inv.yaml", nodes=["node1", "node2"],
        extra_node_fields={"env": {"GLOO_SOCKET_IFNAME": "eth0"}})
    suite = tmp_path / "suite.yaml"
    suite.write_text(SUITE)
    return inv, suite, tmp_path / "results"


def _throttle(cluster: Cluster, on: bool) -> None:
    # 50 Mbit/s (6 MB/s): a baseline round slowed by a loaded test host fell to 20 MB/s,
    # among the rounds of a 200 Mbit/s throttle, and the regression was not significant
    argv = (["tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", "50mbit",
             "burst", "64kb", "latency", "200ms"] if on else
            ["tc", "qdisc", "del", "dev", "eth0", "root"])
    res = cluster.netns_exec("node2", argv)
    assert res.returncode == 0 or not on, res.stderr


def test_second_run_over_a_throttled_link_regresses_and_a_concurrent_one_is_refused(
        cluster: Cluster, setup: tuple[Path, Path, Path], tmp_path: Path) -> None:
    inv, suite, results = setup
    common = ["-i", inv, "--suite", suite, "--results", results, "--torch", "--min-size",
              "256K"]
    first = gpuvet("pipeline", *common, "--json")
    assert first.returncode == 1, first.stderr[-3000:]  # no NVIDIA driver on the test nodes
    doc = json.loads(first.stdout)
    assert doc["steps"] == ["preflight", "health", "nccl", "regress"]
    (prov,) = doc["regress"]["providers"]
    assert prov["verdict"] == "NOT ENOUGH DATA"  # nothing to compare with yet
    codes = {f["code"] for f in doc["findings"]}
    assert {"NCCL_BUILD_FAILED", "NCCL_TORCH_ONLY", "NVIDIA_DRIVER_MISSING"} <= codes
    # progress on stderr (not a terminal: plain lines), each line naming its step, the
    # torch fallback's multi-node unit included
    lines = first.stderr.splitlines()
    assert lines[0] == "pipeline: 2 node(s)"
    assert {"  preflight node:node1: done", "  preflight node:node2: done",
            "  nccl provider:testlab/torch-multi: done"} <= set(lines), lines
    tests = doc["regress"]["tests"]
    assert {t["size"] for t in tests} == {256 << 10, 512 << 10, 1 << 20}
    assert {(t["engine"], t["verdict"], t["n_cur"], t["n_base"]) for t in tests} == {
        ("torch", "NOT ENOUGH DATA", 4, 0)}
    # every run of the test cluster FAILs (no driver): the baseline is accepted by hand
    res = gpuvet("baseline", "set", "-p", "testlab", "--runs", doc["run_id"], "--min-size",
                 "256K", "--results", results, "--json")
    assert res.returncode == 0, res.stderr
    recs = json.loads(res.stdout)["baseline"]
    assert {r["size"] for r in recs} == {256 << 10, 512 << 10, 1 << 20}
    assert all(r["engine"] == "torch" and r["span"] == "multi" and r["n"] == 4 for r in recs)

    prom_file = tmp_path / "gpuvet.prom"
    _throttle(cluster, True)
    try:
        second = subprocess.Popen(
            [GPUVET, "pipeline", *map(str, common), "--json", "--prom-file", str(prom_file)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "COLUMNS": "250"})
        try:
            lock = results / "pipeline.lock"
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # until the second run holds the lock
                text = lock.read_text() if lock.is_file() else ""
                if f'"pid": {second.pid}' in text:
                    break
                assert second.poll() is None, second.communicate()
                time.sleep(0.1)
            else:
                pytest.fail("the second pipeline never took the lock")
            third = gpuvet("pipeline", *common, timeout=60)
            assert third.returncode == 2, third.stdout + third.stderr
            assert "in use by another pipeline" in third.stderr
            assert f"pid {second.pid} on " in third.stderr
            out, err = second.communicate(timeout=300)
        finally:
            if second.poll() is None:
                second.kill()
                second.communicate()
    finally:
        _throttle(cluster, False)
    assert second.returncode == 1, err[-3000:]
    doc2 = json.loads(out)
    (prov,) = doc2["regress"]["providers"]
    assert prov["verdict"] == "REGRESSED", json.dumps(doc2["regress"], indent=1)[:4000]
    assert prov["baseline"]["kind"] == "stored" and prov["baseline"]["runs"] == [doc["run_id"]]
    worst = min(t["change"] for t in doc2["regress"]["tests"])
    assert worst < -0.3
    assert any(f["code"] == "REGRESS_VERDICT" and f["severity"] == "FAIL"
               for f in doc2["findings"])
    assert 'gpuvet_regress_regressed{provider="testlab"} 1.0' in prom_file.read_text()
    assert json.loads((results / doc2["run_id"] / "run.json").read_text())["status"] == "failed"
    assert (results / "pipeline.lock").read_text() == ""  # released
    # the standalone command says the same about the stored run
    again = gpuvet("regress", doc2["run_id"], "--results", results, "--min-size", "256K")
    assert again.returncode == 1 and "REGRESSED" in again.stdout
