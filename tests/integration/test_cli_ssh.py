"""The gpuvet CLI over real SSH against the namespace cluster."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cluster import Cluster

GPUVET = str(Path(sys.executable).with_name("gpuvet"))


def gpuvet(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([GPUVET, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "250"})


@pytest.fixture()
def inv(cluster: Cluster, tmp_path: Path) -> Path:
    return cluster.write_inventory(tmp_path / "inv.yaml")


def test_inventory_check_and_ping(cluster: Cluster, inv: Path) -> None:
    res = gpuvet("inventory", "check", str(inv))
    assert res.returncode == 0, res.stderr
    for n in cluster.nodes:
        assert n.name in res.stdout and n.ip in res.stdout
    res = gpuvet("ping", "-i", str(inv))
    assert res.returncode == 0, res.stdout + res.stderr
    rows = [line for line in res.stdout.splitlines() if line.startswith("│ node")]
    assert len(rows) == len(cluster.nodes)
    for row in rows:
        cells = [c.strip() for c in row.strip("│").split("│")]
        name, _prov, hostname, latency, key, python, error = cells
        assert hostname == name  # each node answers with its own UTS hostname
        assert float(latency) > 0 and key == "known" and python.startswith("3.") and not error


def test_parallel_exec_runs_at_once(cluster: Cluster, inv: Path) -> None:
    """Not one after another: every node's command was running while each other's was
    (the nodes share this host's clock); timed on the nodes, so a loaded host's start-up
    delays do not decide it."""
    res = gpuvet("exec", "-i", str(inv), "--", "sh", "-c",
                 "echo start $(date +%s.%N); sleep 2; echo end $(date +%s.%N); hostname")
    assert res.returncode == 0, res.stderr
    for n in cluster.nodes:
        assert f"--- {n.name} (rc=0" in res.stdout
        assert res.stdout.count(f"\n{n.name}\n") + res.stdout.startswith(n.name) >= 1
    starts = [float(line.split()[1]) for line in res.stdout.splitlines()
              if line.startswith("start ")]
    ends = [float(line.split()[1]) for line in res.stdout.splitlines() if line.startswith("end ")]
    assert len(starts) == len(ends) == len(cluster.nodes)
    assert max(starts) < min(ends), (starts, ends)


def test_exec_quotes_arguments(cluster: Cluster, inv: Path, tmp_path: Path) -> None:
    evil = "$(touch /tmp/gpuvet-pwned); `id`; 'quote"
    res = gpuvet("exec", "-i", str(inv), "-n", "node1", "--", "printf", "%s\\n", evil)
    assert res.returncode == 0, res.stderr
    assert evil in res.stdout and not Path("/tmp/gpuvet-pwned").exists()


def test_put_get_with_checksum(cluster: Cluster, inv: Path, tmp_path: Path) -> None:
    src = tmp_path / "blob.bin"
    src.write_bytes(os.urandom(2_000_000))
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    remote = f"/var/tmp/gpuvet-put-test-{os.getpid()}/blob.bin"
    res = gpuvet("put", "-i", str(inv), str(src), remote)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count(f"sha256 {digest} verified") == len(cluster.nodes)
    res = gpuvet("get", "-i", str(inv), remote, str(tmp_path / "back"))
    assert res.returncode == 0, res.stderr
    for n in cluster.nodes:
        assert (tmp_path / "back" / n.name / "blob.bin").read_bytes() == src.read_bytes()
    cluster.ssh("node1", f"rm -rf /var/tmp/gpuvet-put-test-{os.getpid()}")


def test_stopped_node_fails_alone(cluster: Cluster, inv: Path) -> None:
    cluster.stop_sshd("node2")
    try:
        res = gpuvet("ping", "-i", str(inv))
    finally:
        cluster.start_sshd("node2")
    assert res.returncode == 1
    lines = {line.split("│")[1].strip(): line for line in res.stdout.splitlines()
             if line.startswith("│ node")}
    assert "cannot connect" in lines["node2"]
    assert "known" in lines["node1"] and "known" in lines["node3"]
    assert "what to do:" in res.stderr


def test_changed_host_key_is_refused(cluster: Cluster, inv: Path, tmp_path: Path) -> None:
    cluster.new_host_key("node3")
    try:
        res = gpuvet("ping", "-i", str(inv), "-n", "node3")
        # accept-new must not paper over a changed key either
        res2 = gpuvet("ping", "-i", str(inv), "-n", "node3", "--accept-new-host-keys")
    finally:
        cluster.update_known_hosts()
    for r in (res, res2):
        assert r.returncode == 1
        assert "CHANGED" in r.stdout + r.stderr and "ssh-keygen -R" in r.stderr


def test_unknown_host_key_refused_then_accepted_new(cluster: Cluster, tmp_path: Path) -> None:
    kh = tmp_path / "known_hosts"
    kh.write_text("")
    inv = cluster.write_inventory(tmp_path / "inv.yaml", settings={"known_hosts": str(kh)})
    res = gpuvet("ping", "-i", str(inv), "-n", "node1")
    assert res.returncode == 1 and "not in" in res.stdout + res.stderr
    res = gpuvet("ping", "-i", str(inv), "-n", "node1", "--accept-new-host-keys")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "accepted-new" in res.stdout
    node1 = cluster.node("node1")
    assert node1.host_key_pub.split()[1] in kh.read_text()
    res = gpuvet("ping", "-i", str(inv), "-n", "node1")  # now known
    assert res.returncode == 0 and "known" in res.stdout


def test_hanging_command_is_killed_on_the_node(cluster: Cluster, inv: Path) -> None:
    marker = f"300.{os.getpid()}"  # a unique sleep argument to find leftovers by
    t0 = time.monotonic()
    res = gpuvet("exec", "-i", str(inv), "-n", "node2", "--timeout", "2", "--",
                 "sh", "-c", f"(trap '' TERM; sleep {marker}) & sleep {marker}")
    assert time.monotonic() - t0 < 30
    assert res.returncode == 1 and "timed out" in res.stdout
    running = cluster.netns_exec("node2", ["pgrep", "-f", "sleep"])
    assert running.returncode in (0, 1)
    left = cluster.netns_exec("node2", ["pgrep", "-f", f"sleep {marker}"])
    assert left.returncode == 1, f"left running on node2: {left.stdout}"


def test_preflight_reports_missing_driver(cluster: Cluster, inv: Path, tmp_path: Path) -> None:
    results = tmp_path / "results"
    res = gpuvet("preflight", "-i", str(inv), "--results", str(results), "-v", timeout=180)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    runs = [p for p in results.iterdir() if p.is_dir()]
    assert len(runs) == 1
    run = runs[0]
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "failed" and meta["command"] == "preflight"
    findings = [json.loads(line) for line in (run / "findings.jsonl").read_text().splitlines()]
    by_node = {n.name: [f for f in findings if f["node"] == n.name] for n in cluster.nodes}
    for name, fs in by_node.items():
        codes = {f["code"] for f in fs}
        assert "NVIDIA_DRIVER_MISSING" in codes, (name, codes)
        doc = json.loads((run / "nodes" / name / "preflight" / "collect.json").read_text())
        assert doc["hostname"] == name and doc["commands"]["uname"]["rc"] == 0
        assert (run / "nodes" / name / "preflight" / "raw" / "uname.txt").read_text().startswith(
            "Linux")
    # the payload was pushed once per node and reused by a second run
    from orchestrator import payload

    marks = {n.name: Path(payload.remote_dir(n.work_dir)) / ".complete" for n in cluster.nodes}
    stamps = {name: m.stat().st_mtime_ns for name, m in marks.items()}
    res2 = gpuvet("preflight", "-i", str(inv), "--results", str(results), timeout=180)
    assert res2.returncode == 1
    assert {name: m.stat().st_mtime_ns for name, m in marks.items()} == stamps
    shutil.rmtree(results)


def test_ssh_config_alias_is_honoured(cluster: Cluster, tmp_path: Path) -> None:
    """A node given only as a Host of the user's ssh_config: HostName, User and key come from it."""
    inv = tmp_path / "alias.yaml"
    inv.write_text(f"""version: 1
settings: {{known_hosts: {cluster.known_hosts}, ssh_config: {cluster.ssh_config}}}
providers:
  lab:
    access: {{python: {cluster.node_python}}}
    nodes:
      - {{name: first, ssh_alias: node1, work_dir: {cluster.node('node1').work_dir}}}
""")
    res = gpuvet("ping", "-i", str(inv))
    assert res.returncode == 0, res.stdout + res.stderr
    row = next(line for line in res.stdout.splitlines() if line.startswith("│ first"))
    assert "node1" in row and "known" in row


def test_preflight_resume_retries_only_failed_nodes(cluster: Cluster, inv: Path,
                                                    tmp_path: Path) -> None:
    results = tmp_path / "results"
    cluster.stop_sshd("node2")
    try:
        first = gpuvet("preflight", "-i", str(inv), "--results", str(results), timeout=180)
    finally:
        cluster.start_sshd("node2")
    assert first.returncode == 1
    (run,) = [p for p in results.iterdir() if p.is_dir()]
    codes = [json.loads(line) for line in (run / "findings.jsonl").read_text().splitlines()]
    assert any(f["node"] == "node2" and f["code"] == "NODE_UNREACHABLE" for f in codes)
    kept = (run / "nodes" / "node1" / "preflight" / "collect.json").stat().st_mtime_ns
    res = gpuvet("preflight", "-i", str(inv), "--results", str(results), "--resume", run.name,
                 timeout=180)
    assert res.returncode == 1, res.stdout + res.stderr  # still no NVIDIA driver here
    after = [json.loads(line) for line in (run / "findings.jsonl").read_text().splitlines()]
    assert not [f for f in after if f["code"] == "NODE_UNREACHABLE"]
    for name in ("node1", "node2", "node3"):
        assert sum(f["node"] == name and f["code"] == "NVIDIA_DRIVER_MISSING" for f in after) == 1
    assert (run / "nodes" / "node1" / "preflight" / "collect.json").stat().st_mtime_ns == kept
    assert (run / "nodes" / "node2" / "preflight" / "done.json").is_file()
    assert json.loads((run / "run.json").read_text())["status"] == "failed"
    bad = gpuvet("preflight", "-i", str(inv), "--results", str(results), "--resume", "nope")
    assert bad.returncode == 2 and "'nope' is not a run id" in bad.stderr


def test_nccl_resume_retries_the_units_not_done(cluster: Cluster, inv: Path,
                                                 tmp_path: Path) -> None:
    """The test nodes cannot build nccl-tests (no nvcc): every node unit fails, is not
    marked done, and a resume tries each again, its old failure replaced, not doubled."""
    results = tmp_path / "results"
    first = gpuvet("nccl", "-i", str(inv), "--results", str(results), timeout=240)
    assert first.returncode == 1, first.stdout + first.stderr
    (run,) = [p for p in results.iterdir() if p.is_dir()]

    def failures() -> list[dict[str, object]]:
        return [f for f in (json.loads(line) for line in
                            (run / "findings.jsonl").read_text().splitlines())
                if f["code"] == "NCCL_BUILD_FAILED"]

    assert sorted(f["node"] for f in failures()) == ["node1", "node2", "node3"]
    assert all(f["stage"] == "prepare" for f in failures())
    assert not list(run.glob("nodes/*/nccl/done.json"))
    again = gpuvet("nccl", "-i", str(inv), "--results", str(results), "--resume", run.name,
                   timeout=240)
    assert again.returncode == 1, again.stdout + again.stderr
    assert sorted(f["node"] for f in failures()) == ["node1", "node2", "node3"]
    other = gpuvet("preflight", "-i", str(inv), "--results", str(results), "--resume", run.name)
    assert other.returncode == 2 and "is a 'nccl' run, not 'preflight'" in other.stderr
