"""ExecutorPool against real sshd nodes: a bounded number of open connections and
transport threads, reconnecting where it closed one, never closing one in use."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import paramiko
from cluster import Cluster

from orchestrator import inventory
from orchestrator.executors import ExecutorPool, fanout, options_for


def transports() -> int:
    return sum(isinstance(t, paramiko.Transport) and t.is_alive() for t in threading.enumerate())


def join_transports(closed_only: bool = False) -> None:
    """A closed transport's thread ends on its own shortly after the close."""
    for t in threading.enumerate():
        if isinstance(t, paramiko.Transport) and not (closed_only and t.active):
            t.join(10)


def connected(pool: ExecutorPool) -> int:
    return sum(getattr(ex, "_conn", None) is not None for ex in pool._executors.values())


def test_idle_connections_beyond_the_limit_are_closed_and_reopened(cluster: Cluster,
                                                                   tmp_path: Path) -> None:
    inv = inventory.load(cluster.write_inventory(tmp_path / "inv.yaml"))
    options = dataclasses.replace(options_for(inv), keep_open=1)
    join_transports()
    before = transports()
    with ExecutorPool(options) as pool:
        for n in inv.nodes:
            res = pool(n).run("hostname", timeout=60)
            assert res.ok and res.stdout.strip() == cluster.node(n.name).hostname
            assert connected(pool) == 1
            join_transports(closed_only=True)
            assert transports() - before == 1  # one socket and one thread, not one per node
        # the first node's connection was closed; its executor opens a new one
        again = pool(inv.nodes[0]).run("hostname", timeout=60)
        assert again.ok and again.stdout.strip() == cluster.node("node1").hostname
        # all at once: connections in use are never closed, however low the limit
        group = fanout(inv.nodes, lambda n: pool(n).run("sleep 1; hostname", timeout=60),
                       concurrency=len(inv.nodes))
        assert group.ok, group.failures
        assert [r.stdout.strip() for r in group.results.values()] == [
            cluster.node(n.name).hostname for n in inv.nodes]
    join_transports()
    assert transports() == before == 0
