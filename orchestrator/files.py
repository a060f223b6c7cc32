"""The controller's own files: written atomically, appended durably, read back strictly.

Files are written atomically (temp file, fsync, rename), so readers never see
half a file; JSONL records are appended whole and fsynced, a torn tail left by
a crash is cut off before the next append, and a torn last line is skipped
with a warning when read (a bad line anywhere else is corruption and is named).
A disk that refuses a write is `StoreError`: gpuvet's own disk (exit 3), not a
node's fault.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from orchestrator.errors import StoreError, UsageError, shown
from payload.scrub import scrub_text

R = TypeVar("R", bound=BaseModel)


def store_error(exc: OSError, path: Path) -> StoreError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        what = f"the results disk is full: cannot write {path}"
        hint = f"free space on the filesystem of {path.parent} (or use --results elsewhere)"
    else:
        what = f"cannot write {path}: {exc.strerror or exc}"
        hint = "check that the results folder is writable (or use --results elsewhere)"
    error = StoreError(what, hint=hint + "; the run can be finished with --resume")
    error.full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
    return error


def atomic_write(path: Path, data: str | bytes, *, durable: bool = True,
                 mode: int | None = None) -> None:
    """Temp file and rename: readers never see half a file. `durable=False` skips the
    fsync, for files derived from one already on disk (raw outputs cut out of a
    payload document): a crash loses nothing that cannot be made again."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, mode if mode is not None else 0o644)
        os.replace(tmp, path)
    except OSError as exc:
        if tmp:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        raise store_error(exc, path) from exc
    except BaseException:
        if tmp:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        raise


def write_json(path: Path, obj: Any) -> None:
    atomic_write(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def scrub_in_place(path: Path) -> None:
    """A node's output streamed to `path` as it arrived, scrubbed once it is complete
    (`payload.scrub`, the scrubber of everything gpuvet stores): rewritten, atomically,
    only where a secret was found."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    except OSError as exc:
        raise store_error(exc, path) from exc
    text = data.decode("utf-8", errors="replace")
    clean = scrub_text(text)
    if clean != text:
        atomic_write(path, clean, durable=False)


_warn_sink: Callable[[str], None] | None = None


def set_warn_sink(sink: Callable[[str], None] | None) -> None:
    """Where warnings go: the CLI hands its stderr console, which escapes control
    characters (a warning may name a file or a value from a node)."""
    global _warn_sink
    _warn_sink = sink


def warn(message: str) -> None:
    """Store problems that do not stop the work (a torn line, a stale index)."""
    if _warn_sink is not None:
        _warn_sink(f"warning: {message}")
    else:
        print(f"warning: {message}", file=sys.stderr)


# --- the store's lock: records and index written together ------------------------------------

STORE_LOCK = ".store.lock"
IMPORT_LOCK = ".import.lock"  # imports look for an earlier run of their files and make one


def _store_lock(root: Path, *, exclusive: bool = False, waiting: Callable[[], None] | None = None,
               name: str = STORE_LOCK) -> Iterator[None]:
    """The results root's reader/writer lock (`.store.lock`, a flock, dropped by the kernel
    when its holder dies). A command that writes a run's records holds it shared around
    each write of a record file together with the index write that follows it, so the two
    are never seen apart; `index rebuild` holds it exclusive from its first read to the
    swap of the new index, so no write lands in the index it replaces. Held briefly by
    writers (one chunk of records), so a rebuild waits milliseconds for them, and they
    wait for a rebuild. `waiting` is called once when the lock is busy, before waiting.
    `name` picks another lock file of the root (`IMPORT_LOCK`)."""
    path = root / name
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise store_error(exc, path) from exc
    try:
        op = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        try:
            fcntl.flock(fd, op | fcntl.LOCK_NB)
        except BlockingIOError:
            if waiting is not None:
                waiting()
            fcntl.flock(fd, op)
        yield
    finally:
        os.close(fd)  # closing the last descriptor drops the flock


# a context manager, wrapped after its definition so mutation testing reaches its body
store_lock = contextlib.contextmanager(_store_lock)


# --- JSONL: the record ----------------------------------------------------------------

def read_jsonl(path: Path, model: type[R]) -> list[R]:
    """Every record of a JSONL file. A torn last line (a crash mid-write) is skipped with a
    warning; a bad line anywhere else is corruption and is reported with its number."""
    if not path.is_file():
        return []
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    out: list[R] = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        last = i == len(lines)  # no newline after it: the write never finished
        try:
            out.append(model.model_validate_json(line))
        except ValidationError as exc:
            if last:
                warn(f"{path}: the last line is incomplete (a write was cut off); ignored")
                continue
            raise UsageError(f"{path}:{i} is not a valid {model.__name__} record: "
                             f"{exc.errors()[0]['msg']}",
                             hint="the file was edited or damaged; restore it from a backup"
                             ) from None
    return out


def read_jsonl_salvage(path: Path, model: type[R]) -> tuple[list[R], list[str]]:
    """Every record of a JSONL file that can be read, and one line per line that cannot
    ("measurements.jsonl:17: not a valid Measurement record: ..."): what `index rebuild`
    uses, so one damaged line costs that line, never the run."""
    if not path.is_file():
        return [], []
    out: list[R] = []
    skipped: list[str] = []
    try:
        lines = path.read_bytes().split(b"\n")
    except OSError as exc:  # unreadable (permissions, an I/O error): named, never fatal
        return [], [f"{path.name}: unreadable ({exc.strerror or exc})"]
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append(model.model_validate_json(line))
        except ValidationError as exc:
            why = ("incomplete (a write was cut off)" if i == len(lines)
                   else f"not a valid {model.__name__} record: {exc.errors()[0]['msg']}")
            skipped.append(f"{path.name}:{i}: {why}")
    return out, skipped


def append_lines(path: Path, lines: list[str], *, sync: bool = True) -> None:
    """Append whole lines; a torn tail left by a crash is cut off first. `sync=False`
    leaves the fsync to the caller (`fsync_file`), outside whatever lock serialises
    the appends."""
    try:
        with path.open("a+b") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            if size:
                f.seek(size - 1)
                if f.read(1) != b"\n":
                    f.seek(0)
                    data = f.read()
                    keep = data.rfind(b"\n") + 1
                    f.truncate(keep)
                    warn(f"{path}: cut off an incomplete last line left by an earlier crash")
            f.seek(0, os.SEEK_END)
            f.write("".join(line + "\n" for line in lines).encode("utf-8"))
            f.flush()
            if sync:
                os.fsync(f.fileno())
    except OSError as exc:
        raise store_error(exc, path) from exc


def fsync_file(path: Path) -> None:
    """Make what was appended to path durable. Threads that append one after another
    under a lock sync here side by side, and the filesystem commits their writes
    together, instead of one fsync after another inside the lock."""
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise store_error(exc, path) from exc


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- files a user names: logs to parse or import -------------------------------------------

# The largest output a parser or an import reads: an NCCL_DEBUG=INFO log of a large job
# is a few MB; past this a file is something else. docs/reliability.md (limits).
MAX_INPUT_BYTES = 64 << 20

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


def not_regular(mode: int) -> str | None:
    """What a file that is no regular file is ("a FIFO (named pipe)"), or None."""
    if stat.S_ISREG(mode):
        return None
    return next((what for test, what in _KINDS if test(mode)), "not a regular file")


# Files an inventory names, read by ssh (paramiko, fabric) rather than by gpuvet: a private
# key is a few KB (a 16384-bit RSA key about 13 KB), an ssh_config or known_hosts of a large
# fleet a few MB. docs/reliability.md (limits).
MAX_KEY_BYTES = 1 << 20
MAX_SSH_FILE_BYTES = 64 << 20


def _limit(max_bytes: int) -> str:
    return f"{max_bytes >> 20} MiB" if max_bytes >= 1 << 20 else f"{max_bytes >> 10} KiB"


def user_file_problem(path: Path, max_bytes: int) -> str | None:
    """Why a file the user names cannot be read as one (None: it can), looked at without
    opening it: "does not exist", "is a FIFO (named pipe), not a file" (opening it would block),
    "is a character device, not a file" (/dev/zero never ends), or its size past the limit."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return "does not exist"
    except OSError as exc:
        return f"cannot be read: {exc.strerror or exc}"
    kind = not_regular(st.st_mode)
    if kind == "a folder":
        return "is a directory, not a file"
    if kind is not None:
        return f"is {kind}, not a file"
    if st.st_size > max_bytes:
        return f"is {st.st_size:,} bytes, more than the {_limit(max_bytes)} limit"
    return None


def open_regular(path: Path | str, *, dir_fd: int | None = None, follow: bool = True) -> int:
    """A file descriptor of `path`, opened without blocking and checked to be a regular file
    after the open, so a FIFO put in its place between a check and the open cannot block
    (O_NONBLOCK opens a FIFO at once; fstat then names it). `dir_fd`: `path` is a name in
    that folder (a path of any length is opened step by step); `follow=False`: a symbolic
    link is refused (ELOOP). OSError for the caller to word."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags | (0 if follow else os.O_NOFOLLOW), dir_fd=dir_fd)
    try:
        kind = not_regular(os.fstat(fd).st_mode)
    except OSError:
        os.close(fd)
        raise
    if kind is not None:
        os.close(fd)
        raise OSError(errno.EINVAL, f"not a regular file ({kind})")
    return fd


def read_user_file(path: Path, max_bytes: int, what: str = "file") -> bytes:
    """The bytes of a file the user named, checked before it is opened: a missing file, a
    FIFO or a device (which would block or never end), or one over `max_bytes` is a
    UsageError with one line saying which. The open itself never blocks (`open_regular`)."""

    name = shown(str(path))
    try:
        st = path.stat()
    except FileNotFoundError:
        raise UsageError(f"no such file: {name}") from None
    except OSError as exc:
        raise UsageError(f"cannot read {name}: {exc.strerror or exc}") from None
    kind = not_regular(st.st_mode)
    if kind is not None:
        raise UsageError(f"{name} is not a regular file ({kind})",
                         hint=f"give the {what} itself, saved to a file")
    if st.st_size > max_bytes:
        raise UsageError(f"{name} is {st.st_size:,} bytes, more than the {_limit(max_bytes)} "
                         f"limit for one {what}", hint="split it, or keep the part with the "
                         "results; see docs/reliability.md (limits)")
    try:
        with os.fdopen(open_regular(path), "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise UsageError(f"cannot read {name}: {exc.strerror or exc}") from None
    if len(data) > max_bytes:  # it grew while we looked
        raise UsageError(f"{name} is more than the {_limit(max_bytes)} limit for one {what}")
    return data
