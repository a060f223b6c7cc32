"""The payload is pushed once per node and version; after that one command runs it."""

from __future__ import annotations

import glob
import io
import json
import os
import sys
import tarfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from orchestrator import payload
from orchestrator.errors import CommandFailed
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


def node(tmp_path: Path, python: str = "python3") -> Node:
    return Node(name="n1", provider="p", executor="local", host=None, port=22, user=None,
                identity_file=None, ssh_alias=None, proxy_jump=None, python=python,
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
    payload._build_archive.cache_clear()
    a = payload.archive()
    payload._build_archive.cache_clear()
    assert payload.archive() == a and len(a[0]) == 12


def test_archive_is_built_once_however_many_threads_ask() -> None:
    import threading
    from unittest import mock

    payload._build_archive.cache_clear()
    real = payload._build_archive.__wrapped__
    with mock.patch.object(payload.tarfile, "open", wraps=payload.tarfile.open) as opened:
        start = threading.Barrier(16)

        def ask() -> None:
            start.wait()
            payload.archive()

        threads = [threading.Thread(target=ask) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert opened.call_count == 1
    assert payload.archive() == real()


def test_the_archive_is_the_same_bytes_whenever_it_is_built() -> None:
    # a gzip header stamped with the build's second made two builds differ
    from unittest import mock

    real = payload._build_archive.__wrapped__
    with mock.patch("time.time", return_value=1_700_000_000.0):
        first = real()
    with mock.patch("time.time", return_value=1_800_000_000.0):
        second = real()
    assert first == second


def _python38() -> str | None:
    """The oldest Python the payload runs on: $GPUVET_PYTHON38 or pyenv's."""
    for cand in [os.environ.get("GPUVET_PYTHON38", ""),
                 *sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.8*/bin/python3")))]:
        if cand and os.access(cand, os.X_OK):
            return cand
    return None


PY38 = _python38()
PYTHONS = [pytest.param(sys.executable, id="controller-python"),
           pytest.param(PY38, id="python3.8",
                        marks=pytest.mark.skipif(PY38 is None, reason="no python3.8 here"))]


def tampered(members: list[tuple[str, bytes, str]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, kind, link in members:
            info = tarfile.TarInfo(name)
            info.type, info.linkname = kind, link
            data = b"print('hi')\n" if kind == tarfile.REGTYPE else b""
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data else None)
    return buf.getvalue()


@pytest.mark.parametrize("python", PYTHONS)
@pytest.mark.parametrize(("members", "why"), [
    ([("payload/__init__.py", tarfile.REGTYPE, ""), ("../../escape.py", tarfile.REGTYPE, "")],
     "absolute or '..' path"),
    ([("payload/etc", tarfile.SYMTYPE, "/etc"), ("payload/etc/gpuvet-x", tarfile.REGTYPE, "")],
     "symlink to '/etc'"),
    ([("payload/pw", tarfile.LNKTYPE, "/etc/passwd")], "hardlink to '/etc/passwd'"),
])
def test_unpack_refuses_members_that_leave_the_payload_dir(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, python: str,
        members: list[tuple[str, bytes, str]], why: str) -> None:
    """The node unpacks with its own python (3.8 included) and refuses what tar may let by."""
    monkeypatch.setattr(payload, "archive", lambda: ("0123456789ab", tampered(members)))
    ex = CountingExecutor(node(tmp_path, python))
    with pytest.raises(CommandFailed, match="unpacking the payload failed") as info:
        payload.push(ex, tmp_path / "staging")
    assert why in info.value.result.stderr and info.value.result.rc != 0
    target = Path(payload.remote_dir(str(tmp_path / "work")))
    assert not target.exists() and not (target.parent / (target.name + ".tmp") / ".complete").exists()
    assert not (tmp_path / "escape.py").exists() and not Path("/etc/gpuvet-x").exists()


@pytest.mark.parametrize("python", PYTHONS)
def test_unpack_with_the_nodes_python(tmp_path: Path, python: str) -> None:
    ex = CountingExecutor(node(tmp_path, python))
    payload.push(ex, tmp_path / "staging")
    target = Path(payload.remote_dir(str(tmp_path / "work")))
    assert (target / ".complete").is_file() and (target / "payload" / "ncclbuild.py").is_file()
