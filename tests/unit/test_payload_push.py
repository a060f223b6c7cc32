"""The payload is pushed once per node and version; after that one command runs it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator import payload
from orchestrator.executors.base import CommandResult
from orchestrator.executors.local import LocalExecutor
from orchestrator.inventory import Node


class CountingExecutor(LocalExecutor):
    """A real local executor that counts what it is asked to do."""

    def __init__(self, node: Node) -> None:
        super().__init__(node)
        self.runs: list[str] = []
        self.puts: list[str] = []

    def run(self, command: str, *, env: Mapping[str, str] | None = None, cwd: str | None = None,
            timeout: float | None = None, stdout_path: Path | None = None) -> CommandResult:
        self.runs.append(command)
        return super().run(command, env=env, cwd=cwd, timeout=timeout, stdout_path=stdout_path)

    def put(self, local: Path, remote: str) -> None:
        self.puts.append(remote)
        super().put(local, remote)


def node(tmp_path: Path) -> Node:
    return Node(name="n1", provider="p", executor="local", host=None, port=22, user=None,
                identity_file=None, ssh_alias=None, proxy_jump=None, python="python3",
                work_dir=str(tmp_path / "work"), ckpt_dir=None, env={}, connect_timeout_s=5)


def collect(ex: CountingExecutor, tmp_path: Path) -> dict[str, Any]:
    res = payload.run(ex, ["collect", "--node", "n1", "--work-dir", str(tmp_path / "work")],
                      staging=tmp_path / "staging", timeout=300)
    assert res.ok, res.stderr
    doc: dict[str, Any] = json.loads(res.stdout)
    return doc


def test_pushed_once_then_one_round_trip(tmp_path: Path) -> None:
    digest, _ = payload.archive()
    first = CountingExecutor(node(tmp_path))
    assert collect(first, tmp_path)["node"] == "n1"
    assert first.puts == [f"{tmp_path}/work/payload-{digest}.tar.gz"]
    assert (Path(payload.remote_dir(str(tmp_path / "work"))) / ".complete").is_file()
    assert not Path(first.puts[0]).exists()  # the archive is removed once unpacked

    second = CountingExecutor(node(tmp_path))
    assert collect(second, tmp_path)["node"] == "n1"
    assert second.puts == [] and len(second.runs) == 1


def test_archive_is_deterministic_and_names_its_content() -> None:
    payload.archive.cache_clear()
    a = payload.archive()
    payload.archive.cache_clear()
    assert payload.archive() == a and len(a[0]) == 12
