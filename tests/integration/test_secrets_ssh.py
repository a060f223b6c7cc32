"""Secrets on the wire, hops, host keys and copies: the SSH executor against real sshd.

Environment values (a node's `env`, a run's environment) must never appear on
a process's command line on a node: any user there reads command lines with
`ps`. The check reads every /proc/*/cmdline on the node as another user
(`nobody`) while the command is still running, and then looks for leftovers.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cluster import Cluster

from orchestrator import inventory, nccltests
from orchestrator.errors import GpuvetError, HostKeyError, NodeUnreachable, StepError
from orchestrator.executors import ExecutorPool, make_executor, options_for
from orchestrator.executors.base import CommandResult, get_verified, is_unreachable, put_verified
from orchestrator.executors.ssh import SshExecutor
from tests.unit.test_secret_forms import PLANTED, all_planted_text

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


# --- hops, host keys and copies over real SSH -------------------------------------------

def executor(inv: inventory.Inventory, name: str) -> SshExecutor:
    node = next(n for n in inv.nodes if n.name == name)
    ex = make_executor(node, options_for(inv))
    assert isinstance(ex, SshExecutor)
    return ex


def failure(inv: inventory.Inventory, name: str) -> GpuvetError:
    ex = executor(inv, name)
    try:
        with pytest.raises(GpuvetError) as info:
            ex.run("hostname", timeout=60)
    finally:
        ex.close()
    return info.value


def test_each_hop_is_named_when_it_fails(cluster: Cluster, tmp_path: Path) -> None:
    """node1 is reached through node2 (a node serving as jump host)."""
    inv = inventory.load(cluster.write_inventory(
        tmp_path / "inv.yaml", nodes=["node1", "node2"],
        extra_node_fields=lambda n: {"proxy_jump": "node2"} if n.name == "node1" else {}))
    n1, n2 = cluster.node("node1"), cluster.node("node2")
    ex = executor(inv, "node1")
    assert ex.run("hostname", timeout=60).stdout.strip() == "node1"
    ex.close()

    cluster.stop_sshd("node1")
    try:
        behind = failure(inv, "node1")
    finally:
        cluster.start_sshd("node1")
    assert isinstance(behind, NodeUnreachable) and is_unreachable(behind)
    assert (behind.hop, behind.cause) == ("node1", "refused")
    assert behind.what == (f"cannot connect to node1 ({n1.ip}:{n1.port}) through jump host "
                           "node2: connection refused")

    cluster.stop_sshd("node2")
    try:
        jump = failure(inv, "node1")
    finally:
        cluster.start_sshd("node2")
    assert isinstance(jump, NodeUnreachable)
    assert (jump.hop, jump.cause) == ("node2", "refused")
    assert jump.what == (f"cannot connect to jump host node2 ({n2.ip}:{n2.port}) on the way "
                         "to node1: connection refused")
    assert str(jump).count("refused") == 1


def test_wrong_key_is_an_auth_failure_of_that_node(cluster: Cluster, tmp_path: Path) -> None:
    key = tmp_path / "not_authorized"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True,
                   timeout=60)
    inv = inventory.load(cluster.write_inventory(
        tmp_path / "inv.yaml", nodes=["node3"], extra_node_fields={"identity_file": str(key)}))
    exc = failure(inv, "node3")
    assert isinstance(exc, NodeUnreachable) and (exc.hop, exc.cause) == ("node3", "auth")
    assert exc.what.startswith("cannot connect to node3 (")
    assert "identity_file of node3" in (exc.hint or "")


def ssh_keygen_fingerprint(pub: str, tmp_path: Path) -> str:
    f = tmp_path / "k.pub"
    f.write_text(pub + "\n")
    return subprocess.run(["ssh-keygen", "-l", "-f", str(f)], check=True, capture_output=True,
                          text=True, timeout=60).stdout.split()[1]


def test_changed_host_key_shows_both_fingerprints(cluster: Cluster, tmp_path: Path) -> None:
    inv = inventory.load(cluster.write_inventory(tmp_path / "inv.yaml", nodes=["node3"]))
    old = ssh_keygen_fingerprint(cluster.node("node3").host_key_pub, tmp_path)
    new_pub = cluster.new_host_key("node3")
    try:
        exc = failure(inv, "node3")
    finally:
        cluster.update_known_hosts()
    new = ssh_keygen_fingerprint(new_pub, tmp_path)
    assert isinstance(exc, HostKeyError) and old != new
    assert f"has ssh-ed25519 {old}, the host offers ssh-ed25519 {new}" in exc.what
    assert "ssh-keygen -R" in (exc.hint or "")


def test_a_malformed_known_hosts_line_does_not_block_other_hosts(cluster: Cluster,
                                                                 tmp_path: Path) -> None:
    kh = tmp_path / "known_hosts"
    kh.write_text("10.0.0.1 ssh-ed25519 !!!damaged!!!\n" + cluster.known_hosts.read_text())
    inv = inventory.load(cluster.write_inventory(tmp_path / "inv.yaml", nodes=["node1"],
                                                 settings={"known_hosts": str(kh)}))
    ex = executor(inv, "node1")
    try:
        assert ex.run("hostname", timeout=60).stdout.strip() == "node1"
    finally:
        ex.close()
    # a host whose line is the damaged one is refused, and the line is named
    kh.write_text("\n".join(f"{ln.split()[0]} ssh-ed25519 !!!damaged!!!"
                            for ln in cluster.known_hosts.read_text().splitlines()) + "\n")
    exc = failure(inv, "node1")
    assert isinstance(exc, HostKeyError) and f"{kh}:1: InvalidHostKey" in exc.what


def test_copies_resolve_relative_paths_and_say_what_failed(cluster: Cluster,
                                                           tmp_path: Path) -> None:
    inv = inventory.load(cluster.write_inventory(tmp_path / "inv.yaml", nodes=["node1"]))
    work = Path(cluster.node("node1").work_dir)
    src = tmp_path / "src.txt"
    src.write_text("payload\n")
    ex = executor(inv, "node1")
    try:
        put_verified(ex, src, "copies/a.txt")
        assert (work / "copies" / "a.txt").read_text() == "payload\n"
        get_verified(ex, "copies/a.txt", tmp_path / "back.txt")
        assert (tmp_path / "back.txt").read_text() == "payload\n"
        with pytest.raises(StepError) as missing:
            ex.get("copies/none.txt", tmp_path / "none.txt")
        assert str(missing.value).startswith(f"[node1] cannot copy node1:{work}/copies/none.txt "
                                             f"to {tmp_path / 'none.txt'}: no such file")
        assert not (tmp_path / "none.txt.part").exists()
        with pytest.raises(StepError) as denied:
            ex.put(src, "/etc/gpuvet-test-denied.txt")
        assert "cannot copy" in str(denied.value) and "node1:/etc/gpuvet-test-denied.txt" in \
            str(denied.value) and "permission denied" in str(denied.value)
        with pytest.raises(StepError, match="cannot create /proc/gpuvet"):
            ex.put(src, "/proc/gpuvet/x.txt")
    finally:
        ex.close()
    assert not list(Path("/etc").glob("gpuvet-test-denied.txt*"))


TRAINER = """#!/bin/sh
# a user's trainer that prints what its environment hands it, as real ones do in banners
echo "storage: $AZURE_STORAGE_CONNECTION_STRING"
echo "upload to $UPLOAD_URL"
echo "Authorization: Bearer $API_HEADER" >&2
echo "Server=db;User Id=app;Password=$DB_PW;" >&2
echo "wandb: WANDB_API_KEY=$WANDB_API_KEY HF_TOKEN=$HF_TOKEN"
cat "$(dirname "$0")/planted.txt"
cat "$(dirname "$0")/planted.txt" >&2
for i in 1 2 3 4 5; do echo "step=$i"; sleep 0.2; done
"""


def test_no_secret_of_any_kind_reaches_the_results(cluster: Cluster, tmp_path: Path,
                                                   shared_dir: Path) -> None:
    """Each kind planted where a user or a node puts it; the step runs; the whole results
    folder, its index and the command's output are searched for every value."""
    u = uuid.uuid4().hex
    secrets = {
        "account_key": f"Zq{u[:20]}Xy/{u[20:]}+Kw==",  # a storage connection string's key
        "url_user_token": f"tok{u}",  # nccl.source.url with a token as its user
        "url_password": f"pw{u[:12]}",  # a mirror URL with user:password
        "sas_sig": f"sig{u[:16]}%2B",  # a SAS URL's signature
        "wandb": f"wandb{u}",  # train.command: env WANDB_API_KEY=...
        "hf": "hf_" + u[:24] + "AbCdEf",  # train.command: HF_TOKEN=hf_...
        "bearer": f"{u}Tk",  # printed by the command on stderr after "Bearer"
        "odbc_password": f"odbc{u[:10]}",  # Password= inside a connection string
    }
    # and every form of tests/unit/test_secret_forms.py's table, printed by the trainer
    (shared_dir / "planted.txt").write_text(all_planted_text())
    trainer = shared_dir / "trainer.sh"
    trainer.write_text(TRAINER)
    trainer.chmod(0o755)
    conn = (f"DefaultEndpointsProtocol=https;AccountName=gpuvetci;"
            f"AccountKey={secrets['account_key']};EndpointSuffix=core.windows.net")
    inv = cluster.write_inventory(tmp_path / "inv.yaml", nodes=["node1"], extra_node_fields={
        "env": {"AZURE_STORAGE_CONNECTION_STRING": conn,
                "UPLOAD_URL": f"https://acct.blob.core.windows.net/c?sv=2022-11-02&sp=rw&sig="
                              f"{secrets['sas_sig']}",
                "PIP_INDEX_URL": f"https://ci:{secrets['url_password']}@mirror.example.com/s",
                "API_HEADER": secrets["bearer"], "DB_PW": secrets["odbc_password"]}})
    suite = tmp_path / "suite.yaml"
    suite.write_text(
        "nccl:\n  source:\n    url: https://" + secrets["url_user_token"]
        + "@github.com/NVIDIA/nccl-tests.git\n"
        f"train:\n  command: env WANDB_API_KEY={secrets['wandb']} HF_TOKEN={secrets['hf']} "
        f"sh {trainer}\n  resume_flag: --resume\n  command_kill_after_step: 3\n"
        "  timeout_s: 60\n")
    results = tmp_path / "results"
    res = subprocess.run([str(Path(sys.executable).with_name("gpuvet")), "train", "-i", str(inv),
                          "--suite", str(suite), "--results", str(results), "--no-multi",
                          "--json"], capture_output=True, text=True, timeout=300)
    assert res.returncode in (0, 1), res.stderr[-3000:]
    (run,) = [p for p in results.iterdir() if p.is_dir()]
    # the command ran and its output was kept (scrubbed): the test looks where it should
    stdout = (run / "nodes" / "node1" / "train" / "reference" / "node1" / "command.stdout")
    assert "step=5" in stdout.read_text() and "AccountKey=***" in stdout.read_text()
    pieces = [*secrets.items(), *((p.kind, piece) for p in PLANTED for piece in p.pieces)]
    for kind, value in pieces:
        found = [str(p) for p in results.rglob("*") if p.is_file()
                 and value.encode() in p.read_bytes()]
        assert found == [], (kind, found)
        assert value not in res.stdout + res.stderr, kind
    # the stored outputs keep their lines: the key blocks' too
    assert stdout.read_text().count("\n") >= all_planted_text().count("\n")
