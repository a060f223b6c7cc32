"""ExecutorPool keeps a bounded number of connections open; SshExecutor releases only idle ones."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from orchestrator.executors import base
from orchestrator.executors.base import ExecutorOptions, ExecutorPool, options_for
from orchestrator.executors.ssh import SshExecutor
from orchestrator.inventory import Node


def node(name: str, executor: str = "local") -> Node:
    return Node(name=name, provider="p", executor=executor, host="10.0.0.1", port=22,  # type: ignore[arg-type]
                user=None, identity_file=None, ssh_alias=None, proxy_jump=None,
                python="python3", work_dir="/tmp/w", ckpt_dir=None, env={}, connect_timeout_s=5)


class Fake:
    """Connects on first use, like the SSH executor; busy while `hold` is set."""

    def __init__(self, n: Node, options: ExecutorOptions) -> None:
        self.node = n
        self.connected = False
        self.busy = False
        self.releases = 0

    def run(self, command: str, **kw: Any) -> None:
        self.connected = True

    def release_if_idle(self) -> bool:
        if self.busy:
            return False
        self.releases += 1
        self.connected = False
        return True

    def close(self) -> None:
        self.connected = False


@pytest.fixture
def fake_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(base._REGISTRY, "local", f"{__name__}:Fake")


def test_at_most_keep_open_connections_stay_open(fake_backend: None) -> None:
    with ExecutorPool(ExecutorOptions(keep_open=3)) as pool:
        exs = []
        for i in range(10):
            ex = pool(node(f"n{i}"))
            ex.run("true")  # type: ignore[call-arg]
            exs.append(ex)
            assert pool.open_count <= 3
            assert sum(e.connected for e in exs) <= 3  # type: ignore[attr-defined]
        # the least recently handed out went first; the executor object stays the same
        assert [e.connected for e in exs] == [False] * 7 + [True] * 3  # type: ignore[attr-defined]
        assert pool(node("n0")) is exs[0]


def test_a_busy_connection_is_never_closed(fake_backend: None) -> None:
    with ExecutorPool(ExecutorOptions(keep_open=2)) as pool:
        first = pool(node("a"))
        first.run("true")  # type: ignore[call-arg]
        first.busy = True  # type: ignore[attr-defined]
        for name in ("b", "c", "d"):
            pool(node(name)).run("true")  # type: ignore[call-arg]
        assert first.connected and first.releases == 0  # type: ignore[attr-defined]
        first.busy = False  # type: ignore[attr-defined]
        pool(node("e"))
        assert not first.connected  # released once it was idle and oldest again  # type: ignore[attr-defined]


def test_recently_used_nodes_stay_open(fake_backend: None) -> None:
    with ExecutorPool(ExecutorOptions(keep_open=2)) as pool:
        a = pool(node("a"))
        a.run("x")  # type: ignore[call-arg]
        pool(node("b")).run("x")  # type: ignore[call-arg]
        pool(node("a"))  # a is the most recent now
        pool(node("c")).run("x")  # type: ignore[call-arg]
        assert a.connected and not pool(node("b")).connected  # type: ignore[attr-defined]


def test_the_limit_follows_the_concurrency(tmp_path: Path) -> None:
    from orchestrator import inventory

    path = tmp_path / "inv.yaml"
    path.write_text("version: 1\nsettings: {concurrency: 200}\nproviders:\n  p:\n"
                    "    executor: local\n    nodes: [{name: a}]\n")
    assert options_for(inventory.load(path)).keep_open == 400
    path.write_text(path.read_text().replace("concurrency: 200", "concurrency: 4"))
    assert options_for(inventory.load(path)).keep_open == base.KEEP_OPEN_MIN


class FakeConn:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_ssh_releases_its_connection_only_when_nothing_uses_it() -> None:
    ex = SshExecutor(node("s", "ssh"), ExecutorOptions())
    conn = FakeConn()
    ex._conn = conn  # type: ignore[assignment]
    entered, leave = threading.Event(), threading.Event()

    def busy() -> None:
        with ex._in_use():
            entered.set()
            leave.wait(10)

    t = threading.Thread(target=busy)
    t.start()
    entered.wait(10)
    assert ex.release_if_idle() is False and not conn.closed
    leave.set()
    t.join()
    assert ex.release_if_idle() is True and conn.closed and ex._conn is None
    assert ex.release_if_idle() is True  # nothing open: nothing to do


def test_ssh_counts_a_command_as_in_use_before_it_connects(monkeypatch: pytest.MonkeyPatch) -> None:
    ex = SshExecutor(node("s", "ssh"), ExecutorOptions())
    seen: list[int] = []

    def connection() -> Any:
        seen.append(ex._users)
        raise RuntimeError("stop here")

    monkeypatch.setattr(ex, "connection", connection)
    with pytest.raises(RuntimeError):
        ex.run("true")
    assert seen == [1] and ex._users == 0
