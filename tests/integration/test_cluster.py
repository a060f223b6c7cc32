"""The test cluster itself: names, reachability, sshd stop/start, host-key changes."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest
from cluster import Cluster, cleanup_stale
from ruamel.yaml import YAML


def test_each_node_has_its_own_hostname(cluster: Cluster) -> None:
    assert len(cluster.nodes) == 3
    for node in cluster.nodes:
        r = cluster.ssh(node.name, "hostname; id -un")
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == [node.name, cluster.user]
        assert cluster.netns_exec(node.name, ["hostname"]).stdout.strip() == node.hostname


def test_ssh_by_ip_uses_known_hosts(cluster: Cluster) -> None:
    node = cluster.nodes[1]
    known = cluster.known_hosts.read_text().splitlines()
    assert f"{node.ip} {node.host_key_pub}" in known
    assert oct(cluster.client_key.stat().st_mode & 0o777) == "0o600"
    r = cluster.ssh(node.ip, "hostname")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == node.name


def test_nodes_reach_each_other_as_the_test_user(cluster: Cluster) -> None:
    n1, n2, n3 = cluster.nodes
    # what mpirun does: node1 starts a command on node2 (by IP and by name) over ssh
    cmd = f"ssh {n2.ip} hostname && ssh {n3.name} hostname"
    r = cluster.ssh(n1.name, cmd)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [n2.name, n3.name]
    # and plain TCP from inside the namespace as the test user
    probe = f"import socket; socket.create_connection(({n2.ip!r}, 22), 5).close(); print('ok')"
    r = cluster.netns_exec(n1.name, [cluster.node_python, "-c", probe], user=cluster.user)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_each_node_sees_only_its_own_processes(cluster: Cluster) -> None:
    # one sshd listener per node: its own, not the other nodes' (sessions that earlier
    # tests left open are sshd processes too, so only the listener is counted)
    for node in cluster.nodes:
        r = cluster.netns_exec(node.name, ["pgrep", "-c", "-f", r"^sshd: .*\[listener\]"])
        assert r.stdout.strip() == "1", (node.name, r.stdout, r.stderr)


def test_work_dirs_python_and_sftp(cluster: Cluster, tmp_path: Path) -> None:
    node = cluster.nodes[0]
    r = cluster.ssh(node.name, f"touch {node.work_dir}/w {node.ckpt_dir}/c && "
                               f"{shlex.quote(cluster.node_python)} -c 'import sys; print(1)'")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "1"
    src = tmp_path / "payload.txt"
    src.write_text("hello\n")
    scp = ["scp", "-F", str(cluster.ssh_config), "-q", str(src), f"{node.name}:{node.work_dir}/"]
    r2 = subprocess.run(scp, capture_output=True, text=True, timeout=30)
    assert r2.returncode == 0, r2.stderr
    assert (Path(node.work_dir) / "payload.txt").read_text() == "hello\n"


def test_stopped_sshd_refuses_connections(cluster: Cluster) -> None:
    name = cluster.nodes[2].name
    cluster.stop_sshd(name)
    try:
        r = cluster.ssh(name, "true")
        assert r.returncode == 255
        assert "Connection refused" in r.stderr
    finally:
        cluster.start_sshd(name)
    r = cluster.ssh(name, "hostname")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == name


def test_changed_host_key_is_refused(cluster: Cluster) -> None:
    node = cluster.nodes[2]
    old = node.host_key_pub
    try:
        new = cluster.new_host_key(node.name)
        assert new.startswith("ssh-ed25519 ") and new != old
        assert node.host_key_pub == new
        r = cluster.ssh(node.name, "true")
        assert r.returncode == 255
        assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in r.stderr
        assert "Host key verification failed" in r.stderr
        # node-to-node ssh is just as strict
        r = cluster.ssh(cluster.nodes[0].name, f"ssh {node.ip} true")
        assert r.returncode != 0
        assert "Host key verification failed" in r.stderr
    finally:
        cluster.update_known_hosts()
    r = cluster.ssh(node.name, "hostname")
    assert r.returncode == 0, r.stderr


def test_write_inventory(cluster: Cluster, tmp_path: Path) -> None:
    path = cluster.write_inventory(tmp_path / "inv.yaml",
                                   extra_node_fields=lambda n: {"env": {"NODE": n.name}})
    doc = YAML(typ="safe").load(path.read_text())
    prov = doc["providers"]["testlab"]
    assert prov["executor"] == "ssh"
    assert [n["host"] for n in prov["nodes"]] == [n.ip for n in cluster.nodes]
    assert prov["nodes"][0]["env"] == {"NODE": "node1"}
    assert prov["access"]["identity_file"] == str(cluster.client_key)
    assert doc["settings"]["known_hosts"] == str(cluster.known_hosts)
    try:
        from orchestrator import inventory
    except ImportError:  # the inventory module is optional for this test
        return
    inv = inventory.load(path)
    assert [n.host for n in inv.nodes] == [n.ip for n in cluster.nodes]
    assert inv.nodes[1].work_dir == cluster.nodes[1].work_dir
    assert inv.nodes[0].python == cluster.node_python


def test_leftovers_of_a_dead_session_are_removed(cluster: Cluster) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale_ns = f"gv-{dead.pid}-1-node1"
    live_ns = f"gv-{os.getpid()}-999-node1"
    stale_dir = Path(f"/var/tmp/gpuvet-cluster-{dead.pid}-1")
    for ns in (stale_ns, live_ns):
        subprocess.run(["ip", "netns", "add", ns], check=True)
    stale_dir.mkdir()
    try:
        removed = cleanup_stale()
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert f"netns {stale_ns}" in removed
        assert stale_ns not in names
        assert live_ns in names
        assert not stale_dir.exists()
        for node in cluster.nodes:  # the live session is untouched
            assert node.netns in names
    finally:
        for ns in (stale_ns, live_ns):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@pytest.mark.parametrize("n", [1])
def test_a_second_cluster_runs_beside_the_first(cluster: Cluster, n: int) -> None:
    with Cluster.start(n) as other:
        assert other.subnet != cluster.subnet
        assert other.bridge != cluster.bridge
        r = other.ssh("node1", "hostname")
        assert r.returncode == 0, r.stderr
        base = other.base
    assert not base.exists()
    r = cluster.ssh("node1", "hostname")
    assert r.returncode == 0, r.stderr
