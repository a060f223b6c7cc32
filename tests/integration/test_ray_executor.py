"""The Ray executor against a real local Ray head.

The head is started with `ray start --head` in its own session and a private
temp dir; teardown kills exactly that session's processes (never a global
`ray stop`, which would take down any other Ray on the machine). Its workers
get a PYTHONPATH whose `orchestrator` package refuses to import, like a Ray
cluster on which gpuvet is not installed: everything below must work with
gpuvet on the controller only.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from orchestrator import inventory as inv_mod  # noqa: E402
from orchestrator.errors import ConnectionFailed, StepError  # noqa: E402
from orchestrator.executors import make_executor, options_for  # noqa: E402
from orchestrator.executors.base import Executor, get_verified, put_verified  # noqa: E402

BIN = Path(sys.executable).parent
RAY = str(BIN / "ray")
GPUVET = str(BIN / "gpuvet")
NOT_INSTALLED = "gpuvet is not installed on this Ray node"
NODE_ENV = {"GV_RAY_TEST": "from-the-inventory"}


@dataclass
class Head:
    address: str
    node_ip: str
    dir: Path  # temp dir: Ray's session files, inventories, work dirs


def _free_port() -> int:
    # an ephemeral port: never inside Ray's own worker port range (10002-19999)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _session_pids(sid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid:
            pids.append(int(entry))
    return pids


def _kill_session(sid: int) -> None:
    """TERM, then KILL, every process of the session the head was started in."""
    for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 3.0)):
        pids = _session_pids(sid)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while _session_pids(sid) and time.monotonic() < deadline:
            time.sleep(0.1)


def _pids_with(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in cmd:
            found.append(int(entry))
    return found


@pytest.fixture(scope="module")
def head() -> Iterator[Head]:
    # short path: Ray's unix sockets live under the temp dir (108-byte limit)
    d = Path(tempfile.mkdtemp(prefix="gvray-", dir="/tmp"))
    shadow = d / "shadow" / "orchestrator"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(f"raise ImportError({NOT_INSTALLED!r})\n")
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(d / "shadow"), "RAY_USAGE_STATS_ENABLED": "0"}
    argv = [RAY, "start", "--head", "--num-cpus=1", f"--port={port}", "--include-dashboard=false",
            "--disable-usage-stats", f"--temp-dir={d / 'ray'}",
            "--object-store-memory=100000000"]
    proc = subprocess.Popen(argv, cwd=d, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # its daemons stay in this session
    old_cwd = os.getcwd()
    try:
        out, _ = proc.communicate(timeout=90)
        if proc.returncode != 0:
            pytest.fail(f"`ray start --head` failed (rc={proc.returncode}):\n{out[-3000:]}")
        # the drivers (this process, the CLI) must not hand their checkout to the workers
        # either: Ray puts a driver's cwd on its workers' sys.path
        os.chdir(d)
        address = f"127.0.0.1:{port}"
        # Ray names its node by the machine's own IP (a loopback --node-ip-address is
        # replaced by it too): ask the cluster. This process stays connected, as a
        # controller does; the executors below must reuse that connection.
        ray.init(address=address, log_to_driver=False, include_dashboard=False,
                 configure_logging=False)
        ips = [n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")]
        assert len(ips) == 1, ips
        yield Head(address=address, node_ip=ips[0], dir=d)
    finally:
        os.chdir(old_cwd)
        try:
            if ray.is_initialized():
                ray.shutdown()
        finally:
            if proc.poll() is None:
                proc.kill()
            _kill_session(proc.pid)
            shutil.rmtree(d, ignore_errors=True)


def _inventory(head: Head, host: str, name: str = "r1") -> Path:
    work = head.dir / "work" / name
    doc = {"version": 1, "providers": {"raylab": {
        "executor": "ray", "ray": {"address": head.address},
        "access": {"python": "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK)
                   else sys.executable, "env": NODE_ENV},
        "nodes": [{"name": name, "host": host, "work_dir": str(work)}]}}}
    path = head.dir / f"inv-{name}.yaml"
    path.write_text(json.dumps(doc))  # JSON is YAML
    return path


def _executor(inv_path: Path) -> Executor:
    inv = inv_mod.load(inv_path)
    return make_executor(inv.nodes[0], options_for(inv))


@pytest.fixture(scope="module")
def ex(head: Head) -> Executor:
    return _executor(_inventory(head, head.node_ip))


def test_executors_share_one_ray_connection(head: Head, ex: Executor) -> None:
    before = ray.get_runtime_context().get_job_id()
    ex.run("true", timeout=60).raise_for_status("first task")
    _executor(_inventory(head, head.node_ip, name="r2")).run("true", timeout=60)
    assert ray.is_initialized() and ray.get_runtime_context().get_job_id() == before


def test_run_returns_output_rc_and_env(head: Head, ex: Executor) -> None:
    res = ex.run('echo "$GV_RAY_TEST"; echo "$EXTRA"; pwd; echo oops >&2; exit 3',
                 env={"EXTRA": "per-call"}, timeout=60)
    assert res.rc == 3 and not res.timed_out and not res.ok
    assert res.stdout.splitlines() == ["from-the-inventory", "per-call", ex.node.work_dir]
    assert res.stderr.strip() == "oops"
    assert res.node == "r1" and res.duration_s >= 0


def test_workers_cannot_import_gpuvet(ex: Executor) -> None:
    # proves the setup: a task that needed gpuvet on the node would fail here
    res = ex.run(f"{sys.executable} -c 'import orchestrator'", timeout=60)
    assert res.rc != 0 and NOT_INSTALLED in res.stderr


def test_timeout_kills_the_whole_process_group(ex: Executor) -> None:
    marker = f"300.{os.getpid()}{random.randrange(10**6):06d}"
    # everything ignores TERM: the executor must go on to KILL the group
    t0 = time.monotonic()
    res = ex.run(f"trap '' TERM; sleep {marker} & sleep {marker}; echo never", timeout=1.5)
    elapsed = time.monotonic() - t0
    assert res.timed_out and res.rc is None and not res.ok
    assert "never" not in res.stdout
    assert elapsed < 15, elapsed
    deadline = time.monotonic() + 5
    while _pids_with(f"sleep {marker}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _pids_with(f"sleep {marker}") == []


def test_put_get_verified_round_trip(head: Head, ex: Executor) -> None:
    src = head.dir / "blob.bin"
    src.write_bytes(os.urandom(3_000_000))
    want = hashlib.sha256(src.read_bytes()).hexdigest()
    remote = str(head.dir / "remote" / "sub" / "blob.bin")
    assert put_verified(ex, src, remote) == want
    back = head.dir / "back" / "blob.bin"
    assert get_verified(ex, remote, back) == want
    assert back.read_bytes() == src.read_bytes()


def test_task_error_becomes_a_step_error(ex: Executor) -> None:
    with pytest.raises(StepError) as info:
        ex.run("true", cwd="/proc/gpuvet-no-such-dir", timeout=30)  # cannot be created
    assert info.value.node == "r1" and "Ray task failed" in info.value.what
    assert "Error" in info.value.what  # the worker's exception type is named


def test_unknown_node_ip_lists_live_nodes(head: Head, ex: Executor) -> None:
    other = _executor(_inventory(head, "192.0.2.254", name="ghost"))
    with pytest.raises(ConnectionFailed) as info:
        other.run("true", timeout=30)
    err = info.value
    assert err.node == "ghost" and "192.0.2.254" in err.what
    assert err.hint is not None and head.node_ip in err.hint


def _cli(head: Head, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([GPUVET, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=head.dir, env={**os.environ, "COLUMNS": "250"})


def test_cli_ping_through_ray(head: Head) -> None:
    res = _cli(head, "ping", "-i", str(_inventory(head, head.node_ip)))
    assert res.returncode == 0, res.stdout + res.stderr
    rows = [line for line in res.stdout.splitlines() if line.startswith("│ r1")]
    assert len(rows) == 1
    name, prov, hostname, latency, key, python, error = (
        c.strip() for c in rows[0].strip("│").split("│"))
    assert (name, prov, key, error) == ("r1", "raylab", "n/a", "")
    assert hostname == socket.gethostname() and float(latency) > 0
    assert python.startswith("3.")
    assert "SIGTERM handler" not in res.stderr


def test_cli_preflight_through_ray(head: Head) -> None:
    inv = _inventory(head, head.node_ip)
    results = head.dir / "results"
    res = _cli(head, "preflight", "-i", str(inv), "--results", str(results))
    # no NVIDIA driver here: a FAIL, but the payload was pushed, run and judged
    assert res.returncode == 1, res.stdout + res.stderr
    runs = [p for p in results.iterdir() if p.is_dir()]
    assert len(runs) == 1
    codes = {json.loads(line)["code"] for line in
             (runs[0] / "findings.jsonl").read_text().splitlines() if line.strip()}
    assert "NVIDIA_DRIVER_MISSING" in codes
    assert not codes & {"NODE_UNREACHABLE", "PREFLIGHT_FAILED"}, codes


# The fleet plan through the Ray executor: 4 inventory nodes are four work dirs on the
# head's one Ray node, each job's ranks Ray tasks that meet over loopback (torch engine,
# gloo). Fleets that outgrow SSH fan-out run Ray; the same `gpuvet fleet` must work there.
FLEET_SUITE = """name: fleet-ray
fleet:
  engine: torch
  plan: pairs
  min_bytes: 256K
  max_bytes: 1M
  step_factor: 4
  iters: 2
  warmup_iters: 1
  check: 1
  min_judged_bytes: 256K
  tolerance: 0.95
  timeout_s: 120
"""


def test_the_pairs_plan_runs_through_ray(head: Head) -> None:
    names = [f"r{i}" for i in range(1, 5)]
    doc = {"version": 1, "providers": {"raylab": {
        "executor": "ray", "ray": {"address": head.address},
        "access": {"python": sys.executable},
        "nodes": [{"name": n, "host": head.node_ip, "work_dir": str(head.dir / "fleet" / n)}
                  for n in names]}}}
    inv = head.dir / "inv-fleet.yaml"
    inv.write_text(json.dumps(doc))
    suite = head.dir / "suite-fleet.yaml"
    suite.write_text(FLEET_SUITE)
    res = _cli(head, "fleet", "-i", str(inv), "--suite", str(suite), "--results",
               str(head.dir / "results"), "--json", timeout=240)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = json.loads(res.stdout)
    codes = {f["code"] for f in out["findings"]}
    assert "FLEET_NO_SUSPECT" in codes and not codes & {"FLEET_JOB_FAILED",
                                                         "FLEET_NODE_DROPPED"}, codes
    (pairs,) = [f for f in out["findings"] if f["code"] == "FLEET_PAIRS"]
    table = json.loads((Path(out["results"]) / pairs["evidence"][0]).read_text())
    met: dict[str, set[str]] = {}
    for p in table["pairs"]:
        a, b = p["nodes"]
        met.setdefault(a, set()).add(b)
        met.setdefault(b, set()).add(a)
    assert sorted(met) == names and all(len(v) == 2 for v in met.values()), met
    assert out["measurements"] == 4 * 2 * 2 * 3  # pairs x sizes x (out/in place) x metrics
