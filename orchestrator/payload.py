"""Build the payload archive, push it to a node once, and run it there.

The archive holds payload/ (standard library only, so it runs on the node's
own python, 3.8 and newer). Its name carries a content hash: a node that has
this exact payload already runs it in one round trip; a node that lacks it
answers with exit code 99 and gets it pushed, verified and unpacked first.
"""

from __future__ import annotations

import gzip
import hashlib
import inspect
import io
import shlex
import tarfile
import threading
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

from orchestrator.executors.base import CommandResult, Executor, put_verified, shell_path
from orchestrator.store import atomic_write
from payload import ncclbuild

PAYLOAD_DIR = Path(__file__).resolve().parent.parent / "payload"
NEED_PAYLOAD_RC = 99
NEED_PAYLOAD_MARK = "GPUVET_NEED_PAYLOAD"
_push_locks: dict[str, threading.Lock] = {}
_push_guard = threading.Lock()


def _files() -> list[Path]:
    return sorted(p for p in PAYLOAD_DIR.rglob("*.py") if "__pycache__" not in p.parts)


_archive_lock = threading.Lock()


def archive() -> tuple[str, bytes]:
    """(content hash, deterministic .tar.gz bytes) of the payload package.

    Made once per process: the first node's thread builds it, the others wait for
    it instead of each compressing the package again (an lru_cache alone let 19 of 32
    threads start at once build it, 0.4 s of CPU)."""
    with _archive_lock:
        return _build_archive()


@lru_cache(maxsize=1)
def _build_archive() -> tuple[str, bytes]:
    h = hashlib.sha256()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path in _files():
            rel = "payload/" + path.relative_to(PAYLOAD_DIR).as_posix()
            data = path.read_bytes()
            h.update(rel.encode() + b"\0" + data + b"\0")
            info = tarfile.TarInfo(rel)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
    # gzip with a fixed header time: the same payload gives the same bytes whenever
    # it is built ("w:gz" stamps the current second into the header)
    return h.hexdigest()[:12], gzip.compress(buf.getvalue(), compresslevel=6, mtime=0)


def remote_dir(work_dir: str) -> str:
    return f"{work_dir.rstrip('/')}/payload-{archive()[0]}"


def command(ex: Executor, args: Sequence[str], launcher: Sequence[str] = ()) -> str:
    """`python [LAUNCHER] -m payload ARGS` in the pushed copy, or exit 99 when it is absent.

    LAUNCHER runs the payload under another module, e.g. torch.distributed.run.
    """
    d = shell_path(remote_dir(ex.node.work_dir))  # a work_dir under ~/ stays under the home
    py = shlex.quote(ex.node.python)
    argv = " ".join(shlex.quote(a) for a in [*launcher, "-m", "payload", *args])
    return (f"if [ -f {d}/.complete ]; then cd {d} && exec {py} {argv}; "
            f"else echo {NEED_PAYLOAD_MARK}; exit {NEED_PAYLOAD_RC}; fi")


def push(ex: Executor, staging: Path) -> None:
    """Copy the archive, check its sha256, unpack it next to the work dir atomically."""
    digest, data = archive()
    local = staging / f"payload-{digest}.tar.gz"
    if not local.is_file():
        atomic_write(local, data)
    target = remote_dir(ex.node.work_dir)
    tgz = f"{target}.tar.gz"
    put_verified(ex, local, tgz)
    q, qt = shell_path(target), shell_path(tgz)
    unpack = unpack_command(ex.node.python, tgz, f"{target}.tmp")
    ex.run(f"rm -rf {q}.tmp && mkdir -p {q}.tmp && {unpack} && "
           f"touch {q}.tmp/.complete && rm -rf {q} && mv {q}.tmp {q} && rm -f {qt}",
           timeout=120).raise_for_status("unpacking the payload")


def unpack_command(python: str, tgz: str, dest: str) -> str:
    """Unpack with the node's python and the payload's own checked extraction.

    Not `tar -x`: tar implementations differ in what they let through (symlinks
    out of the directory, `..` names); this refuses them the same way everywhere,
    on Python 3.8 too. The function's source is sent, as the payload is not there yet.
    """
    program = (inspect.getsource(ncclbuild.safe_extract)
               + "\nimport sys\nsafe_extract(sys.argv[1], sys.argv[2])\n")
    return " ".join([shlex.quote(python), "-c", shlex.quote(program), shell_path(tgz),
                     shell_path(dest)])


def _locked_push(ex: Executor, staging: Path) -> None:
    with _push_guard:
        lock = _push_locks.setdefault(ex.node.name, threading.Lock())
    with lock:
        push(ex, staging)


def run(ex: Executor, args: Sequence[str], *, staging: Path, timeout: float,
        stdout_path: Path | None = None, launcher: Sequence[str] = (),
        env: dict[str, str] | None = None) -> CommandResult:
    """Run the payload, pushing it first if the node does not have this version."""
    cmd = command(ex, args, launcher)
    res = ex.run(cmd, timeout=timeout, stdout_path=stdout_path, env=env)
    if res.rc == NEED_PAYLOAD_RC and NEED_PAYLOAD_MARK in res.stdout:
        _locked_push(ex, staging)
        res = ex.run(cmd, timeout=timeout, stdout_path=stdout_path, env=env)
    return res
