"""Secrets on the wire, against the real sshd cluster.

Environment values (a node's `env`, a run's environment) must never appear on
a process's command line on a node: any user there reads command lines with
`ps`. The check reads every /proc/*/cmdline on the node as another user
(`nobody`) while the command is still running, and then looks for leftovers.
"""

from __future__ import annotations

import os
import pwd
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cluster import Cluster

from orchestrator import inventory, nccltests
from orchestrator.executors import ExecutorPool, options_for
from orchestrator.executors.base import CommandResult

WAIT_S = 60


def wait_for(what: str, ready: Callable[[], bool]) -> None:
    """Poll a condition (a file the remote command creates), never a fixed sleep."""
    deadline = time.monotonic() + WAIT_S
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def cmdlines(cluster: Cluster, name: str) -> str:
    """Every command line on the node, read as an unprivileged other user."""
    res = cluster.netns_exec(name, ["sh", "-c", "for f in /proc/[0-9]*/cmdline; do "
                                    "tr '\\000' ' ' < $f 2>/dev/null; echo; done"],
                             user="nobody")
    assert res.returncode == 0, res.stderr
    return res.stdout


@pytest.fixture()
def shared_dir(cluster: Cluster) -> Iterator[Path]:
    """A directory on the nodes' (shared) filesystem where the test user may write."""
    d = Path(cluster.node("node1").work_dir) / f"secrets-{uuid.uuid4().hex[:8]}"
    d.mkdir()
    d.chmod(0o777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def files_holding(text: str, roots: list[Path], since: float, skip: Path) -> list[str]:
    found = []
    for root in roots:
        for dirpath, _dirs, names in os.walk(root):
            if Path(dirpath).is_relative_to(skip):
                continue
            for n in names:
                p = Path(dirpath) / n
                try:
                    st = p.stat()
                    if st.st_mtime < since or st.st_size > 1 << 20 or not p.is_file():
                        continue
                    if text.encode() in p.read_bytes():
                        found.append(str(p))
                except OSError:
                    continue
    return found


def test_env_values_never_on_a_command_line(cluster: Cluster, tmp_path: Path,
                                            shared_dir: Path) -> None:
    node_secret = f"node-{uuid.uuid4().hex}"
    run_secret = f"run-{uuid.uuid4().hex}"
    inv = inventory.load(cluster.write_inventory(
        tmp_path / "inv.yaml", nodes=["node1"],
        extra_node_fields={"env": {"NODE_TOKEN": node_secret}}))
    started, go = shared_dir / "started", shared_dir / "go"
    command = (f'echo "seen $NODE_TOKEN $RUN_TOKEN"; touch {started}; '
               f"while [ ! -e {go} ]; do sleep 0.1; done")
    t0 = time.time() - 1
    out: dict[str, CommandResult] = {}
    with ExecutorPool(options_for(inv)) as pool:
        ex = pool(inv.nodes[0])
        worker = threading.Thread(target=lambda: out.update(
            res=ex.run(command, env={"RUN_TOKEN": run_secret}, timeout=WAIT_S * 2)))
        worker.start()
        try:
            wait_for("the command to start", started.exists)
            lines = cmdlines(cluster, "node1")
        finally:
            go.touch()
            worker.join(WAIT_S * 2)
    assert str(started) in lines  # the running command was visible to the reader
    assert node_secret not in lines and run_secret not in lines
    res = out["res"]
    assert res.ok, res.stderr
    assert res.stdout.splitlines()[0] == f"seen {node_secret} {run_secret}"
    # nothing holding a value is left on the node's disk
    home = Path(pwd.getpwnam(cluster.user).pw_dir)
    roots = [Path("/tmp"), Path("/var/tmp"), home, Path(inv.nodes[0].work_dir)]
    assert files_holding(run_secret, roots, t0, skip=tmp_path) == []


def test_mpirun_values_never_on_a_command_line(cluster: Cluster, tmp_path: Path,
                                               shared_dir: Path) -> None:
    """One value per node (per-context copies) and one shared value (forwarded by name)."""
    tokens = {"node1": f"n1-{uuid.uuid4().hex}", "node2": f"n2-{uuid.uuid4().hex}"}
    shared = f"shared-{uuid.uuid4().hex}"
    inv = inventory.load(cluster.write_inventory(
        tmp_path / "inv.yaml", nodes=["node1", "node2"],
        extra_node_fields=lambda n: {"env": {"TOKEN": tokens[n.name], "SHARED": shared}}))
    go = shared_dir / "go"
    probe = ["sh", "-c", 'echo "R $OMPI_COMM_WORLD_RANK $(hostname) $TOKEN $SHARED"; '
             f'touch {shared_dir}/started.$OMPI_COMM_WORLD_RANK; '
             f"while [ ! -e {go} ]; do sleep 0.1; done"]
    cmd = nccltests.mpirun_command([(n, probe, 1) for n in inv.nodes], {}, local=False)
    assert not any(v in cmd for v in [*tokens.values(), shared])
    out: dict[str, CommandResult] = {}
    with ExecutorPool(options_for(inv)) as pool:
        head = pool(inv.nodes[0])
        worker = threading.Thread(target=lambda: out.update(res=head.run(cmd, timeout=WAIT_S * 2)))
        worker.start()
        try:
            wait_for("both ranks to start", lambda: all(
                (shared_dir / f"started.{r}").exists() for r in (0, 1)))
            seen = {name: cmdlines(cluster, name) for name in ("node1", "node2")}
        finally:
            go.touch()
            worker.join(WAIT_S * 2)
    assert "mpirun" in seen["node1"] and "orted" in seen["node2"]  # the launch was visible
    for name, lines in seen.items():
        for secret in [*tokens.values(), shared]:
            assert secret not in lines, f"{secret} on a command line on {name}"
    res = out["res"]
    assert res.ok, res.stdout + res.stderr
    ranks = sorted(line.split()[1:] for line in res.stdout.splitlines() if line.startswith("R "))
    assert ranks == [["0", "node1", tokens["node1"], shared],
                     ["1", "node2", tokens["node2"], shared]]
