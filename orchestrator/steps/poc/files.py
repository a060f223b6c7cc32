"""The files of a PoC folder, recognised by what they hold rather than by their names.

People name the outputs of an acceptance recipe as they like (`kernel.txt`,
`gpu.txt`, `all-reduce-1.log`), so a file's name decides nothing: each is
tried against the recognition table (`kinds.py`) and the first parser that
reads it names its kind. A file no parser accepts is "not recognised", with
the reason the closest parser gave. One file may hold several hosts' outputs
(`mpirun --tag-output nvidia-smi`, `srun -l`): it is split by rank and each
part read on its own. The nccl-tests checkout people leave beside their logs
(sources, `.git/`, `build/`) is passed over quietly: skipped, not reported
one file at a time.

Each recognised file also says which machine it describes where it can
(`identity.py`): a file pasted from another node is told apart by that.

A folder is read one file at a time: a file's bytes and text live only while it
is read, recognised and its copy kept (`keep`); what is judged later reads that
copy again (`PocFile.content`). What stays in memory is each file's status,
digest and parsed facts, so the memory of an import does not grow with the
bytes of the folder. A file is at most `MAX_BYTES`, a folder at most
`MAX_FOLDER_BYTES` in `MAX_FOLDER_FILES` files (docs/reliability.md, limits).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from orchestrator.errors import ParseError, shown
from orchestrator.files import not_regular, open_regular
from orchestrator.parsers._noise import split_by_rank
from orchestrator.steps.poc import kinds
from orchestrator.steps.poc.identity import Identity, bus_key, identity
from payload.scrub import scrub_text

__all__ = ["MAX_BYTES", "MAX_FOLDER_BYTES", "MAX_FOLDER_FILES", "Identity", "PocFile",
           "bus_key", "describe", "keep", "read", "read_all"]

# Larger than any command output of a node (an 8-GPU `nvidia-smi -q` is ~80 KB,
# an NCCL_DEBUG=INFO log of a big job a few MB): a bigger file is something else.
MAX_BYTES = 16 << 20
# A folder of outputs: a recipe's files are a few MB, a source checkout's build beside them a
# few hundred (its .git/ is not read). Past these nothing is read (exit 2).
MAX_FOLDER_BYTES = 1 << 30
MAX_FOLDER_FILES = 10_000
HEAD_LINES = 60  # signatures look at the start of a file only
# What compiled programs and objects start with: never a command's text output.
_BINARY_MAGIC = (b"\x7fELF", b"!<arch>\n", b"PK\x03\x04", b"\x1f\x8b")


# judged | recorded | not recognised | unreadable | other node | duplicate | skipped | split
Status = str


@dataclass
class PocFile:
    name: str  # relative to the folder, with `/`
    path: Path
    data: bytes = b""
    sha256: str | None = None
    text: str | None = None
    kind: str | None = None
    facts: Any = None
    status: Status = "not recognised"
    reason: str | None = None
    ident: Identity = field(default_factory=Identity)
    target: str | None = None  # the command id or fact id it fills
    copy: str | None = None  # where the run keeps it (run-relative)
    scrubbed: bool = False  # the copy had secrets taken out
    kept: Path | None = None  # the copy on disk, read again when the text is needed
    mtime: float | None = None  # of a regular file, for the folder's time window

    def content(self) -> str | None:
        """The text, from memory while the file is being read, else from its kept copy (the
        scrubbed text the run stores); None for a file without text."""
        if self.text is not None or self.kept is None:
            return self.text
        try:
            return self.kept.read_bytes().decode("utf-8", errors="replace")
        except OSError:
            return None

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "sha256": self.sha256, "status": self.status}
        if self.target:
            out["as"] = self.target
        out["copy"] = self.copy
        if self.scrubbed:
            out["scrubbed"] = True
        if self.reason:
            out["reason"] = self.reason
        return out


def _decode(data: bytes) -> tuple[str | None, str | None]:
    """The text, or why the bytes are not a command's text output."""
    if not data.strip():
        return None, "empty file"
    if b"\x00" in data:
        return None, f"binary content ({data.count(0)} NUL byte(s)): not a command's text output"
    text = data.decode("utf-8", errors="replace")
    bad = text.count("\ufffd")
    ctrl = sum(1 for c in text if ord(c) < 32 and c not in "\t\n\r\x1b\x0c")
    if bad > max(3, len(text) // 100) or ctrl > max(3, len(text) // 100):
        return None, (f"binary content ({bad} byte(s) that are not UTF-8, {ctrl} control "
                      "character(s)): not a command's text output")
    return text, None


def read(path: Path, name: str, checkout: str | None = None, dir_fd: int | None = None
         ) -> PocFile:
    """Read and recognise one file; every outcome is a status, never an exception.

    `checkout` names the source checkout the file lies in: what is not a command
    output there is the checkout's own (skipped), not a file someone saved. With
    `dir_fd` the file is opened by its name in that folder, so a path of any length
    is read (a folder nested past PATH_MAX).
    """
    f = PocFile(name=scrub_text(shown(name)), path=path)  # a name may hold a token too
    where = path.name if dir_fd is not None else str(path)
    try:
        st = os.stat(where, dir_fd=dir_fd, follow_symlinks=False)
    except OSError as exc:
        f.status, f.reason = "unreadable", f"cannot read it: {exc.strerror or exc}"
        return f
    if stat.S_ISLNK(st.st_mode):
        f.status, f.reason = "unreadable", "a symbolic link: not followed"
        return f
    kind = not_regular(st.st_mode)
    if kind is not None:  # opening a FIFO blocks, a device never ends: never opened
        f.status, f.reason = "unreadable", f"not a regular file ({kind}): not read"
        return f
    f.mtime = st.st_mtime
    if st.st_size > MAX_BYTES:
        f.status, f.reason = "unreadable", (f"{st.st_size} bytes, more than {MAX_BYTES >> 20} "
                                            "MiB: not a command output this import reads")
        return f
    try:
        with os.fdopen(open_regular(where, dir_fd=dir_fd, follow=False), "rb") as fh:
            f.data = fh.read(MAX_BYTES + 1)
    except OSError as exc:
        f.status, f.reason = "unreadable", f"cannot read it: {exc.strerror or exc}"
        return f
    if len(f.data) > MAX_BYTES:  # it grew since the stat
        f.status, f.reason, f.data = "unreadable", (f"more than {MAX_BYTES >> 20} MiB: not a "
                                                    "command output this import reads"), b""
        return f
    f.sha256 = hashlib.sha256(f.data).hexdigest()
    if f.data.startswith(_BINARY_MAGIC):
        f.status, f.reason = "skipped", "a compiled program, object or archive"
        return f
    text, why = _decode(f.data)
    if text is None:
        f.status, f.reason = ("skipped", f"in the source checkout {checkout}/: {why}") \
            if checkout else ("unreadable", why)
        return f
    f.text = scrub_text(text)  # read, judged and kept scrubbed, line for line
    f.scrubbed = f.text != text
    recognise(f)
    if f.status == "not recognised" and checkout:
        f.status, f.reason = "skipped", f"part of the source checkout {checkout}/"
    return f


def read_all(path: Path, name: str, checkout: str | None = None, dir_fd: int | None = None
             ) -> list[PocFile]:
    """The file, and when it holds several ranks' outputs one part per rank after it."""
    f = read(path, name, checkout, dir_fd)
    if f.status != "not recognised" or f.text is None:
        return [f]
    split = split_by_rank(f.text)
    if split is None:
        return [f]
    launcher, texts = split
    parts = []
    for rank, text in texts.items():
        part = PocFile(name=f"{f.name}.rank{rank}", path=path, data=text.encode(),
                       sha256=hashlib.sha256(text.encode()).hexdigest(), text=text,
                       mtime=f.mtime)
        recognise(part)
        parts.append(part)
    f.status = "split"
    f.reason = (f"holds the output of ranks {', '.join(texts)} ({launcher} prefixes): read as "
                + ", ".join(p.name for p in parts))
    return [f, *parts]


def keep(f: PocFile, folder: Path | None) -> None:
    """Write the file's copy under `folder` (the import's staging folder, moved into the run
    whole) and let go of its bytes and text: the next file is read only after this one is
    kept. The copy is scrubbed of secrets like every output gpuvet stores, kept byte for
    byte unless scrubbing changed it; content that is not text cannot be scrubbed and is not
    kept (its sha256 is, in run.json), nor is a source checkout's own file."""
    try:
        if folder is None or f.status == "skipped":
            return
        if f.text is None:
            if f.sha256 is None or f.data.strip():
                return  # never read (a link, too large), or binary
            data = f.data
        else:  # scrubbed when it was read (`read`), line for line
            data = f.text.encode() if f.scrubbed else f.data
        dest = folder / f.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        with dest.open("wb") as out:  # the staging folder is the import's alone
            out.write(data)
        f.kept = dest
    finally:
        f.data, f.text = b"", None


def recognise(f: PocFile) -> None:
    """Try the parsers whose signature fits, strongest first; the first that reads it wins."""
    assert f.text is not None
    head = [ln for ln in f.text.splitlines() if ln.strip()][:HEAD_LINES]
    scored = sorted(((k.signature(f.text, head), i, k) for i, k in enumerate(kinds.KINDS)),
                    key=lambda s: (-s[0], s[1]))
    tried: list[tuple[str, str]] = []
    for score, _, kind in scored:
        if score <= 0:
            break
        try:
            f.facts = kind.parse(f.text, source=f.name)
        except ParseError as exc:
            tried.append((kind.name, _why(exc)))
            continue
        f.kind = kind.name
        f.ident = identity(f.facts)
        f.status, f.reason = "recognised", None
        return
    first = head[0].strip()[:80] if head else ""
    f.reason = (f"read as {tried[0][0]}: {tried[0][1]}" if tried else
                f"no known command output starts like this ({first!r})")


def _why(exc: ParseError) -> str:
    """The parser's reason without its `cannot parse ... at FILE:LINE` frame, with the line."""
    where = (exc.source or "<text>") + (f":{exc.line_no}" if exc.line_no is not None else "")
    frame = f"cannot parse {exc.kind} output at {where}: "
    what = exc.what.split("\n")[0]
    what = what[len(frame):] if what.startswith(frame) else what
    if exc.line_no is not None:
        what += f" (line {exc.line_no}" + (f": {exc.line.strip()[:60]!r})" if exc.line else ")")
    return what


def describe(f: PocFile) -> str:
    """One line for messages: the file and what it was taken for."""
    return f"{f.name} ({f.kind})" if f.kind else f.name


def as_json(facts: Any) -> Any:
    if isinstance(facts, BaseModel):
        return facts.model_dump(mode="json")
    return json.loads(json.dumps(facts, default=str))
