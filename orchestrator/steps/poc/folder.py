"""A PoC folder read one file at a time: walked by file descriptors (paths of any length),
its size and file count bounded before anything is read, each file recognised and kept (its
scrubbed copy in the import's staging folder) before the next, names made unique where
scrubbing made two alike, files of several ranks split, the folder's hostname. The
importer (`importer.py`) assembles what was read and judges it."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from orchestrator.errors import StoreError, UsageError, shown
from orchestrator.files import store_error
from orchestrator.steps.poc.files import (
    MAX_FOLDER_BYTES,
    MAX_FOLDER_FILES,
    Identity,
    PocFile,
    keep,
    read_all,
)
from payload.scrub import scrub_text


def _natural(name: str) -> list[Any]:
    return [int(p) if p.isdigit() else p.lower() for p in re.split(r"(\d+)", name)]


def _path_max(where: Path) -> int:
    """The longest path the system takes in one call, in bytes (PATH_MAX less its NUL)."""
    try:
        return int(os.pathconf(where, "PC_PATH_MAX")) - 1
    except (OSError, ValueError):
        return 4095


def _nbytes(path: Path | str) -> int:
    return len(os.fsencode(str(path)))


def _too_long(source: str, results: Path | None, limit: int) -> UsageError:
    """A path past the system's limit: exit 2 naming it, never exit 3. `results`: the path
    is a file's copy under that results folder."""
    if results is None:
        return UsageError(f"{shown(source)}: too long ({_nbytes(source):,} bytes, more than the "
                          f"{limit:,} a path may have here)",
                          hint="give the folder by a shorter path (cd into its parent first)")
    return UsageError(f"{shown(source)}: too long to keep: its copy under {shown(str(results))} "
                      f"would pass the {limit:,} bytes a path may have here",
                      hint="give a shorter --results path, or move the file up into a "
                           "shallower folder; nothing was stored")


_AGAIN = "nothing of this import was stored: run the same `gpuvet import poc` again"


def _store_failed(exc: OSError, path: Path) -> StoreError:
    """gpuvet's own disk refused a write of an import: nothing of it is kept, so the hint
    is to run the same import again (it has no --resume)."""
    return _restated(store_error(exc, path))


def _restated(base: StoreError) -> StoreError:
    hint = (base.hint or "").split("; the run can be finished with --resume")[0]
    error = StoreError(base.what, hint=f"{hint}; {_AGAIN}" if hint else _AGAIN)
    error.full = base.full
    return error


def _walk(topfd: int, errors: list[PocFile]
          ) -> Iterator[tuple[str, list[str], int, list[str], bool]]:
    """The folder top-down, by file descriptors (`os.fwalk`: a path of any length is walked
    and read, each name opened in its own folder); a source checkout's `.git` is left out,
    a linked folder listed as a file (never followed). Yields (folder relative to the top,
    names, its fd, the checkouts seen so far, whether it is one)."""
    checkouts: list[str] = []

    def unlisted(exc: OSError) -> None:
        name = f"{exc.filename}/" if isinstance(exc.filename, str) else "(a folder)/"
        errors.append(PocFile(name=shown(name), path=Path(name),
                              status="unreadable",
                              reason=f"a folder that cannot be listed: {exc.strerror or exc}"))

    for top, dirs, names, dirfd in os.fwalk(".", dir_fd=topfd, onerror=unlisted):
        rel = os.path.normpath(top)
        rel = "." if rel == "." else rel.removeprefix("./")
        has_git = ".git" in dirs or ".git" in names
        if has_git:
            checkouts.append(rel)
            (dirs if ".git" in dirs else names).remove(".git")
        for d in list(dirs):
            with contextlib.suppress(OSError):
                if stat.S_ISLNK(os.stat(d, dir_fd=dirfd, follow_symlinks=False).st_mode):
                    dirs.remove(d)
                    names.append(d)
        yield rel, names, dirfd, checkouts, has_git


def _size(n: int) -> str:
    for shift, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if n >= 1 << shift:
            return f"{n / (1 << shift):g} {unit}"
    return f"{n} bytes"


def _measure(folder: Path, topfd: int) -> None:
    """The folder against the stated limits, from its listing alone, before a file is read."""
    total = count = 0
    for _, names, dirfd, _, _ in _walk(topfd, []):
        count += len(names)
        for n in names:
            with contextlib.suppress(OSError):
                st = os.stat(n, dir_fd=dirfd, follow_symlinks=False)
                if stat.S_ISREG(st.st_mode):
                    total += st.st_size
        if count > MAX_FOLDER_FILES or total > MAX_FOLDER_BYTES:
            raise UsageError(f"{shown(str(folder))} holds more than "
                             + (f"{MAX_FOLDER_FILES:,} files" if count > MAX_FOLDER_FILES else
                                f"{_size(MAX_FOLDER_BYTES)} of files")
                             + ", more than one import reads",
                             hint="import the folder the outputs were saved in, without what "
                                  "else lies beside them; see docs/reliability.md (limits)")


def _check_folder(folder: Path) -> None:
    """The folder given is one, and its path one the system takes (exit 2 otherwise)."""
    try:
        st = os.stat(folder)
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            raise _too_long(str(folder), None, _path_max(Path("/"))) from None
        st = None
    if st is None or not stat.S_ISDIR(st.st_mode):
        raise UsageError(f"{shown(str(folder))} is not a folder",
                         hint="give the folder the PoC outputs were saved in")


def scan(folder: Path, stage: Path | None = None) -> list[PocFile]:
    """Every file under the folder, read and recognised; links are listed, not followed.

    A directory holding `.git` is a source checkout (people clone nccl-tests into
    the PoC folder and save logs beside its sources): its `.git/` is skipped whole
    and what in it is no command output is skipped, not reported.

    Files are read one at a time: each is kept under `stage` (`files.keep`: its
    scrubbed copy written, its bytes and text let go) before the next is read.
    """
    _check_folder(folder)
    try:
        topfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise UsageError(f"cannot read {shown(str(folder))}: {exc.strerror or exc}") from None
    out: list[PocFile] = []
    seen: set[str] = set()
    try:
        _measure(folder, topfd)
        for rel, names, dirfd, checkouts, has_git in _walk(topfd, out):
            base = folder if rel == "." else folder / rel
            if has_git:
                name = ".git/" if rel == "." else f"{scrub_text(shown(rel))}/.git/"
                out.append(PocFile(name=name, path=base / ".git", status="skipped",
                                   reason="the git metadata of a source checkout"))
            inside = next((c for c in sorted(checkouts, key=len, reverse=True)
                           if c == "." or rel == c or rel.startswith(c + "/")), None)
            where = None if inside is None else scrub_text(shown(
                folder.name if inside == "." else inside))
            for n in sorted(names, key=_natural):
                name = n if rel == "." else f"{rel}/{n}"
                for f in read_all(base / n, name, where, dir_fd=dirfd):
                    _unique_name(f, seen)  # before its copy is written under that name
                    try:
                        keep(f, stage)
                    except OSError as exc:
                        if exc.errno == errno.ENAMETOOLONG and stage is not None:
                            raise _too_long(str(base / n), stage.parent,
                                            _path_max(stage)) from None
                        raise _store_failed(exc, stage / f.name if stage else base) from exc
                    out.append(f)
    finally:
        os.close(topfd)
    if not out:
        raise UsageError(f"{shown(str(folder))} holds no files",
                         hint="give the folder the PoC outputs were saved in")
    return sorted(out, key=lambda f: _natural(f.name))


def _unique_name(f: PocFile, seen: set[str]) -> None:
    """A name made unique again where scrubbing made two alike (`hf_<one token>.txt` and
    `hf_<another>.txt` are both `***.txt`): the second is `***.txt (2)`."""
    name, n = f.name, 1
    while name in seen:
        n += 1
        name = f"{f.name} ({n})"
    f.name = name
    seen.add(name)


def split_nodes(files: list[PocFile]) -> None:
    """Mark files that describe another machine than most of the folder: "other node".

    The file most others agree with comes first; each file in turn joins the node
    unless what it prints contradicts everything the node's files print together
    (a `-i 0` excerpt and a `-i 3` excerpt both join a full listing). Files that
    name no machine (nvcc, dmon, topo) stay with the node.
    """
    named = [f for f in files if f.status == "recognised" and f.ident]

    def support(f: PocFile) -> int:
        return sum(f.ident.relation(g.ident) for g in named if g is not f)

    node = Identity()
    told: dict[str, list[str]] = {}
    for f in sorted(named, key=lambda f: (-support(f), -len(f.ident.uuids), _natural(f.name))):
        attr = node.differs(f.ident)
        if attr is None:
            node.add(f.ident)
            for a, _ in Identity.ORDER:
                if getattr(f.ident, a):
                    told.setdefault(a, []).append(f.name)
            continue
        label = dict(Identity.ORDER)[attr]
        f.status = "other node"
        f.reason = (f"its {label} ({f.ident.shown(attr)}) are not among those the rest of the "
                    f"folder prints ({node.shown(attr)}, in {', '.join(told[attr][:3])})")


def hostname(files: list[PocFile]) -> str | None:
    """The node's hostname as uname, or else single-host nccl-tests logs, print it."""
    for kinds in (("uname",), ("nccl-tests", "nccl-tests-json")):
        hosts = {h for f in files if f.status == "recognised" and f.kind in kinds
                 for h in f.ident.hosts}
        if len(hosts) == 1:
            return hosts.pop()
    return None
