"""Fault injection on the real cluster: break things on purpose, then prove nothing is lost.

Each scenario ends with `assert_consistent`: PRAGMA integrity_check, the JSONL files and
the index hold the same records, the run has a final status, and every node's outcome
is recorded. The scenario table with outcomes is in docs/reliability.md.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from cluster import Cluster

from tests.faults.consistency import assert_consistent, jsonl, only_run, tmpfs

GPUVET = Path(sys.executable).with_name("gpuvet")
NODES = ["node1", "node2", "node3"]


def gpuvet(*args: str | Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "250", "NO_COLOR": "1"}
    return subprocess.run([str(GPUVET), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env)


def spawn(*args: str | Path) -> subprocess.Popen[str]:
    env = {**os.environ, "COLUMNS": "250", "NO_COLOR": "1"}
    return subprocess.Popen([str(GPUVET), *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def wait_for(pred: Callable[[], bool], timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} not reached in {timeout:.0f} s")


def slow_python(tmp_path: Path, seconds: float, tag: str) -> Path:
    """A node python that hangs before running the payload (not before unpacking it).

    The nodes share this machine's filesystem, so the script is visible on them; the
    nodes' unprivileged user must be able to reach it (pytest's tmp_path is 0700)."""
    shared = Path(tempfile.mkdtemp(prefix="gpuvet-faults-", dir="/tmp"))
    shared.chmod(0o755)
    _SHARED.append(shared)
    path = shared / f"slowpy-{tag}"
    path.write_text('#!/bin/sh\ncase "$*" in *"-m payload"*) sleep ' + str(seconds)
                    + ' ;; esac\nexec python3 "$@"\n')
    path.chmod(0o755)
    return path


_SHARED: list[Path] = []


@pytest.fixture(autouse=True)
def _cleanup_shared() -> Iterator[None]:
    yield
    while _SHARED:
        shutil.rmtree(_SHARED.pop(), ignore_errors=True)


def node_procs(cluster: Cluster, name: str, pattern: str) -> list[str]:
    res = cluster.netns_exec(name, ["pgrep", "-f", pattern])
    return res.stdout.split()


@pytest.fixture
def inv(cluster: Cluster, tmp_path: Path) -> Path:
    return cluster.write_inventory(tmp_path / "inv.yaml")


@contextmanager
def sshd_down(cluster: Cluster, name: str) -> Iterator[None]:
    cluster.stop_sshd(name)
    try:
        yield
    finally:
        cluster.start_sshd(name)


def test_node_unreachable_at_start(cluster: Cluster, inv: Path, tmp_path: Path) -> None:
    results = tmp_path / "results"
    with sshd_down(cluster, "node2"):
        res = gpuvet("preflight", "-i", inv, "--results", results)
    assert res.returncode == 1
    run = only_run(results)
    f = [x for x in jsonl(run / "findings.jsonl") if x["node"] == "node2"]
    assert [x["code"] for x in f] == ["NODE_UNREACHABLE"] and f[0]["stage"] == "execute"
    assert (run / "nodes" / "node1" / "preflight" / "done.json").is_file()
    assert_consistent(results, run, NODES, "preflight")


def test_sshd_killed_mid_preflight(cluster: Cluster, tmp_path: Path) -> None:
    slow = slow_python(tmp_path, 20, "mid")
    inv = cluster.write_inventory(
        tmp_path / "inv.yaml",
        extra_node_fields=lambda n: {"python": str(slow)} if n.name == "node2" else {})
    results = tmp_path / "results"
    proc = spawn("preflight", "-i", inv, "--results", results)
    try:
        wait_for(lambda: bool(node_procs(cluster, "node2", "sleep 20")) or proc.poll() is not None,
                 what="payload running")
        assert proc.poll() is None, [(x["node"], x["message"]) for x in
                                     jsonl(only_run(results) / "findings.jsonl")
                                     if x["severity"] == "FAIL"]
        # the node's sshd dies with every session it holds: the connection drops mid-command
        cluster.stop_sshd("node2")
        cluster.netns_exec("node2", ["pkill", "-KILL", "-f", "sshd"])
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        cluster.start_sshd("node2")
    assert proc.returncode == 1, out + err
    run = only_run(results)
    f2 = [x for x in jsonl(run / "findings.jsonl") if x["node"] == "node2"]
    assert f2 and f2[0]["code"] == "NODE_UNREACHABLE", [(x["code"], x["message"]) for x in f2]
    for name in ("node1", "node3"):
        assert (run / "nodes" / name / "preflight" / "done.json").is_file()
    assert_consistent(results, run, NODES, "preflight")
    # and the run can be finished: only node2 is tried again
    kept = (run / "nodes" / "node1" / "preflight" / "collect.json").stat().st_mtime_ns
    other = cluster.write_inventory(tmp_path / "other.yaml")  # node2 without its python
    res = gpuvet("preflight", "-i", other, "--results", results, "--resume", run.name)
    assert res.returncode == 2 and "not the inventory" in res.stderr  # another inventory
    slow.write_text('#!/bin/sh\nexec python3 "$@"\n')  # the node is healthy again
    res = gpuvet("preflight", "-i", inv, "--results", results, "--resume", run.name)
    assert res.returncode == 1, res.stdout + res.stderr  # no NVIDIA driver on test nodes
    assert (run / "nodes" / "node1" / "preflight" / "collect.json").stat().st_mtime_ns == kept
    assert (run / "nodes" / "node2" / "preflight" / "done.json").is_file()
    assert_consistent(results, run, NODES, "preflight")


def test_hung_command_killed_at_timeout_with_its_group(cluster: Cluster, inv: Path) -> None:
    res = gpuvet("exec", "-i", inv, "-n", "node1", "--timeout", "2", "--",
                 "sh", "-c", "sleep 313 & sleep 314; wait")
    assert res.returncode == 1
    assert "timed out" in res.stdout
    wait_for(lambda: not node_procs(cluster, "node1", "sleep 31[34]"), timeout=15,
             what="remote group gone")


def test_link_down_mid_multinode_collective(cluster: Cluster, inv: Path, tmp_path: Path) -> None:
    """A node's link goes down while a torch.distributed all_reduce spans two nodes (the
    test nodes have no GPUs: gloo stands in for NCCL). The collective hangs; the run ends
    at its timeout instead of waiting forever, the failure is recorded against the
    provider's multi-node series, and once the link is back no rank is left on any node."""
    import threading

    from orchestrator import inventory
    from orchestrator.executors import ExecutorPool, options_for
    from orchestrator.steps.nccl import step as nccl_step
    from orchestrator.store import Run
    from orchestrator.suite import NcclParams, Suite

    suite = Suite(nccl=NcclParams(min_bytes="64M", max_bytes="64M", iters=5000, warmup_iters=1,
                                  timeout_s=5))
    loaded = inventory.load(inv)
    nodes = [n for n in loaded.nodes if n.name in ("node1", "node2")]
    results = tmp_path / "results"
    run = Run.create(results, command="nccl", suite_hash=suite.hash,
                     suite=suite.model_dump(mode="json"), inventory_path=inv,
                     providers=["testlab"], nodes=[n.name for n in nodes])

    def flap() -> None:
        wait_for(lambda: bool(node_procs(cluster, "node2", "allreduce-bench")), timeout=90,
                 what="benchmark running")
        time.sleep(3)
        cluster.netns_exec("node2", ["ip", "link", "set", "eth0", "down"])
        time.sleep(15)  # longer than the run's timeout
        cluster.netns_exec("node2", ["ip", "link", "set", "eth0", "up"])

    t = threading.Thread(target=flap)
    t.start()
    start = time.monotonic()
    outcome = nccl_step.NcclOutcome()
    try:
        with ExecutorPool(options_for(loaded)) as pool:
            nccl_step._torch_series(outcome, pool, nodes, run, suite, loaded, {},
                                    run.provider_dir("testlab", "nccl"), "multi")
    finally:
        t.join()
    elapsed = time.monotonic() - start
    # bounded: the process group's timeout (the suite's) ends a collective that waits on
    # a dead peer; one stuck in a send is killed at the command's bound (timeout_s + 60 s)
    assert elapsed < suite.nccl.timeout_s + 60 + 30, elapsed
    (failed,) = [f for f in outcome.findings if f.severity == "FAIL"]
    assert failed.code == "TORCH_BENCH_FAILED" and failed.scope == "provider", failed
    # the cause: the command's bound, or the exception a rank died of (never torchrun's
    # footer)
    assert "ChildFailedError" not in failed.message and "error_file" not in failed.message
    assert "timed out" in failed.message or "timeout" in failed.message, failed.message
    wait_for(lambda: not node_procs(cluster, "node1", "allreduce-bench"), timeout=60,
             what="ranks on node1 gone")
    wait_for(lambda: not node_procs(cluster, "node2", "allreduce-bench"), timeout=90,
             what="ranks on node2 gone")


def test_node_work_dir_full(cluster: Cluster, inv: Path, tmp_path: Path) -> None:
    node = cluster.node("node3")
    work = node.work_dir
    cluster.netns_exec("node3", ["mkdir", "-p", work])
    mounted = cluster.netns_exec("node3", ["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs",
                                           work])
    assert mounted.returncode == 0, mounted.stderr
    results = tmp_path / "results"
    try:
        cluster.netns_exec("node3", ["sh", "-c", f"head -c 16k /dev/zero > {work}/fill || true"])
        res = gpuvet("preflight", "-i", inv, "--results", results)
    finally:
        cluster.netns_exec("node3", ["umount", "-l", work])
    assert res.returncode == 1
    run = only_run(results)
    f3 = [x for x in jsonl(run / "findings.jsonl") if x["node"] == "node3"]
    assert f3 and f3[0]["code"] == "PREFLIGHT_FAILED", f3
    assert "no space left on the node's filesystem" in f3[0]["message"], f3[0]["message"]
    for name in ("node1", "node2"):
        assert (run / "nodes" / name / "preflight" / "done.json").is_file()
    assert_consistent(results, run, NODES, "preflight")


def test_results_disk_full(cluster: Cluster, inv: Path, tmp_path: Path) -> None:
    with tmpfs(tmp_path / "small", 256) as results:
        res = gpuvet("preflight", "-i", inv, "--results", results)
        assert res.returncode == 3, res.stdout + res.stderr
        assert "results disk is full" in res.stderr or "cannot write" in res.stderr
        assert "FAIL" not in res.stdout  # nothing blamed on the nodes
        runs = [p for p in results.iterdir() if p.is_dir()]
        if (results / "index.sqlite").is_file():
            import sqlite3

            with sqlite3.connect(results / "index.sqlite") as db:
                assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        for run in runs:
            # whatever reached the disk is whole: every JSONL line parses
            jsonl(run / "findings.jsonl")
            assert not [p for p in run.rglob(".*.json.*")]  # no temp files left behind


def test_controller_killed_then_resumed(cluster: Cluster, tmp_path: Path) -> None:
    slow = slow_python(tmp_path, 30, "kill9")
    inv = cluster.write_inventory(
        tmp_path / "inv.yaml",
        extra_node_fields=lambda n: {"python": str(slow)} if n.name == "node3" else {})
    results = tmp_path / "results"
    proc = spawn("preflight", "-i", inv, "--results", results)
    try:
        wait_for(lambda: results.is_dir() and any(results.iterdir())
                 and len(list(results.glob("*/nodes/*/preflight/done.json"))) == 2,
                 what="two nodes done")
        proc.send_signal(signal.SIGKILL)  # no handler runs: power cut of the controller
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    run = only_run(results)
    assert json.loads((run / "run.json").read_text())["status"] == "running"
    slow.write_text('#!/bin/sh\nexec python3 "$@"\n')
    res = gpuvet("preflight", "-i", inv, "--results", results, "--resume", run.name)
    assert res.returncode == 1, res.stdout + res.stderr
    codes = [(x["node"], x["code"]) for x in jsonl(run / "findings.jsonl")]
    assert sum(c == ("node3", "NVIDIA_DRIVER_MISSING") for c in codes) == 1
    assert sum(c == ("node1", "NVIDIA_DRIVER_MISSING") for c in codes) == 1
    assert_consistent(results, run, NODES, "preflight")


def test_sigterm_mid_run_then_two_resumes_at_once(cluster: Cluster, tmp_path: Path) -> None:
    slow = slow_python(tmp_path, 30, "term")
    inv = cluster.write_inventory(
        tmp_path / "inv.yaml",
        extra_node_fields=lambda n: {"python": str(slow)} if n.name == "node1" else {})
    results = tmp_path / "results"
    proc = spawn("preflight", "-i", inv, "--results", results)
    try:
        wait_for(lambda: bool(node_procs(cluster, "node1", "sleep 30")), what="payload running")
        wait_for(lambda: len(list(results.glob("*/nodes/*/preflight/done.json"))) == 2,
                 what="two nodes done")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, out + err
    wait_for(lambda: not node_procs(cluster, "node1", "sleep 30"), timeout=15,
             what="remote payload killed")
    run = only_run(results)
    assert json.loads((run / "run.json").read_text())["status"] == "interrupted"
    assert_consistent(results, run, ["node2", "node3"], "preflight")
    # two resumes at once: the second is refused while the first holds the run
    slow.write_text('#!/bin/sh\ncase "$*" in *"-m payload"*) sleep 5 ;; esac\n'
                    'exec python3 "$@"\n')
    first = spawn("preflight", "-i", inv, "--results", results, "--resume", run.name)
    try:
        wait_for(lambda: bool(node_procs(cluster, "node1", "sleep 5")), what="resume running")
        second = gpuvet("preflight", "-i", inv, "--results", results, "--resume", run.name)
        assert second.returncode == 2 and "is in use by pid" in second.stderr, second.stderr
        out, err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 1, out + err
    assert_consistent(results, run, NODES, "preflight")
