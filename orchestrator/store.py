"""The results directory and its SQLite index.

Layout of one run:
    results/<run_id>/run.json                     what ran: suite, hash, versions, status
    results/<run_id>/inventory.yaml               the inventory as it was, secrets scrubbed
    results/<run_id>/nodes/<node>/<step>/...      raw outputs, facts, findings of one node
    results/<run_id>/providers/<p>/<step>/...     cross-node outputs of one provider
    results/<run_id>/findings.jsonl, measurements.jsonl   every record of the run
    results/index.sqlite                          runs, findings, measurements across runs

The JSONL files are the record; the index (`index.py`) is derived from them
and can be rebuilt (`gpuvet index rebuild`). Files are written atomically and
records appended durably (`files.py`); raw outputs stream straight to their
file as they arrive, so a crash loses at most the line in flight. A unit of
work is marked done only after its records are on disk, which is what
`--resume` relies on.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import re
import secrets
import shutil
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from orchestrator import __version__
from orchestrator.errors import GpuvetError, InventoryError, StoreError, Terminated, UsageError, shown
from orchestrator.files import (
    append_lines,
    atomic_write,
    file_sha256,
    fsync_file,
    read_jsonl,
    store_error,
    store_lock,
    warn,
    write_json,
)
from orchestrator.index import SCHEMA_VERSION, Index, RunMeta, Status
from orchestrator.inventory import checked_name, scrubbed_copy
from orchestrator.records import Finding, Measurement, unit_folder
from payload.scrub import scrub_doc, scrub_lines

DEFAULT_ROOT = Path("results")
_CHUNK = 2_000  # records serialised and written at a time
RUN_ID_RE = re.compile(r"^\d{8}-\d{6}-[0-9a-f]{4}$")


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(2)


class RunBusy(UsageError):
    """Another process holds the run's lock (works on it now)."""


class DamagedRunFile(UsageError):
    """run.json cannot be read as a run document (truncated, not JSON, invalid)."""


def _inventory_copy(path: Path) -> str:
    """The inventory as it was, secrets scrubbed (`inventory.scrubbed_copy`: layout,
    comments and line numbers kept). A file the inventory reader refuses (it was read
    before the run began; this is belt and braces) is kept line by line, scrubbed."""
    try:
        return scrubbed_copy(path)
    except InventoryError:
        return scrub_lines(path.read_text(encoding="utf-8", errors="replace"))


def proc_start(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since boot (field 22 of /proc/PID/stat);
    None when there is no such process. With the pid it names one process: a pid is
    reused once its process is gone, a start time is not."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes().decode("ascii", "replace")
        return int(stat[stat.rfind(")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _holder(text: str) -> dict[str, Any] | None:
    """Who a run's lock file names: {"pid", "host", "start"} (a lock written by an older
    gpuvet says "pid N on HOST", without a start time)."""
    try:
        doc = json.loads(text)
        if isinstance(doc, dict) and isinstance(doc.get("pid"), int):
            return doc
    except ValueError:
        m = re.fullmatch(r"pid (\d+) on (\S+)", text.strip())
        if m:
            return {"pid": int(m.group(1)), "host": m.group(2), "start": None}
    return None


def _lock_free(path: Path) -> bool:
    """Nobody holds the flock of `path` (the kernel drops a flock when its holder dies,
    however it dies)."""
    try:
        with path.open("r") as f:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
            return True
    except OSError:
        return False


def _in_flight(run_dir: Path) -> bool:
    """The process the run's lock file names runs now, on this host (its pid with the same
    start time). Read from the file, never by taking the flock: a rebuild must not make a
    resume starting at that moment find the run "in use"."""
    try:
        found = _holder((run_dir / ".lock").read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return False
    if not found or found.get("host") != os.uname().nodename or found.get("start") is None:
        return False
    return proc_start(int(found["pid"])) == found["start"]


def holder_gone(run_dir: Path, meta: RunMeta) -> bool:
    """A "running" run whose process is gone (killed with SIGKILL, the machine rebooted):
    its lock is free and the process it names no longer runs, or its pid now belongs to
    another process. A run of another host cannot be checked from here: never gone."""
    lock = run_dir / ".lock"
    try:
        found = _holder(lock.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        found = None
    if found is None:  # created, not yet locked: the creator's pid from run.json
        found = {"pid": meta.pid, "host": meta.host, "start": None}
    if found.get("pid") is None or found.get("host") != os.uname().nodename:
        return False
    if lock.exists() and not _lock_free(lock):
        return False
    start = proc_start(int(found["pid"]))
    return start is None or (found.get("start") is not None and start != found["start"])


def reap_stale(root: Path) -> list[str]:
    """Runs left "running" by a process that is gone are marked "interrupted", so that
    `runs` says so and `--resume` takes them up. Returns their ids."""
    if not (root / "index.sqlite").is_file():
        return []
    try:
        running = [m for m in Index(root).runs() if m.status == "running"]
    except (sqlite3.Error, GpuvetError, ValidationError):
        return []  # an index that cannot be read is reported by whoever reads it next
    out = []
    for m in running:
        try:
            run = Run.open(root, m.run_id)
        except GpuvetError:
            continue
        if run.meta.status != "running" or not holder_gone(run.dir, run.meta):
            continue
        run.meta.status = "interrupted"
        try:
            run.save_meta()
        except GpuvetError as exc:  # a full results disk: list the runs all the same
            warn(f"run {m.run_id} ({run.meta.command}) was left running by a process that is "
                 f"gone, but could not be marked interrupted: {exc.what}")
            continue
        warn(f"run {m.run_id} ({run.meta.command}) was left running by a process that is "
             f"gone: marked interrupted; resume it with `gpuvet {run.meta.command} --resume "
             f"{m.run_id}`")
        out.append(m.run_id)
    return out


class Run:
    """One run's directory: create, write records, mark units done, resume."""

    meta: RunMeta

    def __init__(self, root: Path, run_id: str) -> None:
        self.root = root
        self.run_id = run_id
        self.dir = root / run_id
        self._index: Index | None = None
        self._lock = threading.Lock()
        self._lockfile: Any = None

    @property
    def index(self) -> Index:
        if self._index is None:
            self._index = Index(self.root)
        return self._index

    @classmethod
    def create(cls, root: Path, *, command: str, suite_hash: str, suite: dict[str, Any],
               inventory_path: Path | None, providers: Iterable[str] = (),
               nodes: Iterable[str] = (), source: dict[str, Any] | None = None) -> Run:
        reap_stale(root)
        run = cls(root, new_run_id())
        run.index  # noqa: B018 - a broken index or results root fails before the run exists
        # folder and run.json together: `index rebuild` never sees a run without its run.json
        with store_lock(root):
            try:
                run.dir.mkdir(parents=True, exist_ok=False)
            except OSError as exc:
                raise store_error(exc, run.dir) from exc
            inv_sha = None
            if inventory_path is not None:
                atomic_write(run.dir / "inventory.yaml", _inventory_copy(inventory_path))
                inv_sha = file_sha256(inventory_path)
            # the suite and the source are the user's text (a token in a URL, a command's env)
            run.meta = RunMeta(run_id=run.run_id, started=_now(), command=command,
                               suite_hash=suite_hash, suite=scrub_doc(suite),
                               gpuvet_version=__version__, path=str(run.dir),
                               inventory_sha256=inv_sha, providers=sorted(set(providers)),
                               nodes=list(nodes),
                               source=None if source is None else scrub_doc(source),
                               pid=os.getpid(), host=os.uname().nodename,
                               records={"findings": 0, "measurements": 0})
            run._save_meta()
        return run

    @classmethod
    def open(cls, root: Path, run_id: str) -> Run:
        if not RUN_ID_RE.fullmatch(run_id):
            raise UsageError(f"'{shown(run_id)}' is not a run id (they look like 20261130-201500-ab12)",
                             hint=f"see `gpuvet runs --results {root}`")
        run = cls(root, run_id)
        meta_path = run.dir / "run.json"
        if not meta_path.is_file():
            raise UsageError(f"no run {run_id} under {root}",
                             hint=f"see `gpuvet runs --results {root}`")
        try:
            data = json.loads(meta_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise DamagedRunFile(f"{meta_path} is unreadable ({exc}): truncated or damaged",
                             hint="the run's records are in its JSONL files; restore run.json "
                                  "from a backup to use the run again") from None
        if not isinstance(data, dict):
            raise DamagedRunFile(f"{meta_path} is not a run document (a JSON "
                                 f"{type(data).__name__}, not an object)",
                                 hint="restore run.json from a backup to use the run again; "
                                      "its records are in its JSONL files")
        version = data.get("schema_version", data.get("schema"))
        if version != SCHEMA_VERSION:
            raise UsageError(f"run {run_id} was written by a gpuvet with record schema "
                             f"{version}; this gpuvet reads schema {SCHEMA_VERSION}",
                             hint="read it with the gpuvet version that wrote it "
                                  f"({data.get('gpuvet_version', '?')})")
        try:
            run.meta = RunMeta.model_validate(data)
        except ValidationError as exc:
            raise DamagedRunFile(f"{meta_path} is not a valid run document: "
                             f"{exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}") from None
        return run

    def save_meta(self) -> None:
        with store_lock(self.root):
            self._save_meta()

    def _save_meta(self) -> None:
        """run.json, then the index's row; the caller holds the store's lock."""
        self._write_meta()
        self._index_write(lambda: self.index.upsert_run(self.meta), mark=False)

    def _write_meta(self) -> None:
        # `damage` is the index's note about the run's files, not part of the run's document
        # a run of an older gpuvet keeps its document as it was: no "records" key added
        skip = {"damage"} | ({"records"} if self.meta.records is None else set())
        write_json(self.dir / "run.json", self.meta.model_dump(mode="json", exclude=skip))

    def _count(self, kind: str, n: int, *, exact: bool = False) -> None:
        """How many records the run has written (saved with run.json); `exact` sets it (a
        retract). A count unknown (a run of an older gpuvet) stays unknown."""
        if self.meta.records is None:
            return
        records = dict(self.meta.records or {})
        records[kind] = n if exact else records.get(kind, 0) + n
        self.meta.records = records

    def _index_write(self, fn: Any, *, mark: bool = True) -> None:
        """The JSONL files are the record: an index that cannot be written is stale, not fatal."""
        try:
            fn()
        except (sqlite3.Error, StoreError) as exc:
            warn(f"the index {self.index.path} was not updated ({exc}); the run's JSONL files "
                 f"hold every record: run `gpuvet index rebuild --results {self.root}`")
            if mark and not self.meta.index_stale:
                self.meta.index_stale = True
                self._write_meta()

    def finish(self, status: Status) -> None:
        # archives pushed to nodes are staged in the run while it works; none stays behind
        shutil.rmtree(self.dir / ".staging", ignore_errors=True)
        self.meta.finished = _now()
        self.meta.status = status
        self.save_meta()

    @contextlib.contextmanager
    def guard(self) -> Iterator[Run]:
        """A run that dies records why: status "interrupted" or "error", never "running"."""
        try:
            yield self
        except (KeyboardInterrupt, Terminated, SystemExit):
            with contextlib.suppress(Exception):
                self.finish("interrupted")
            raise
        except BrokenPipeError:
            with contextlib.suppress(Exception):
                self.finish("interrupted")
            raise
        except BaseException:
            with contextlib.suppress(Exception):
                self.finish("error")
            raise

    def last_holder(self) -> str:
        """Who last held the run's lock, in words (read before this process takes it)."""
        try:
            found = _holder((self.dir / ".lock").read_text())
        except OSError:
            found = None
        return f"pid {found['pid']} on {found['host']}" if found else "a gpuvet process"

    @contextlib.contextmanager
    def locked(self, *, wait: bool = False) -> Iterator[Run]:
        """Only one process works on a run at a time: a second is refused (`RunBusy`), or
        with `wait` waits until the first is done (an import of the same files)."""
        path = self.dir / ".lock"
        f = path.open("a+")
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            f.seek(0)
            found = _holder(f.read())
            holder = (f"pid {found['pid']} on {found['host']}" if found else "another process")
            f.close()
            raise RunBusy(f"run {self.run_id} is in use by {holder}",
                          hint="wait for it to finish, or stop it first") from None
        except BaseException:
            f.close()
            raise
        f.seek(0)
        f.truncate()
        f.write(json.dumps({"pid": os.getpid(), "host": os.uname().nodename,
                            "start": proc_start(os.getpid())}))
        f.flush()
        try:
            yield self
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
            f.close()

    def node_dir(self, node: str, step: str) -> Path:
        d = self.dir / "nodes" / checked_name(node, "node") / step
        d.mkdir(parents=True, exist_ok=True)
        return d

    def provider_dir(self, provider: str, step: str) -> Path:
        d = self.dir / "providers" / checked_name(provider, "provider") / step
        d.mkdir(parents=True, exist_ok=True)
        return d

    def rel(self, path: Path) -> str:
        return str(path.relative_to(self.dir))

    def add_findings(self, findings: list[Finding]) -> None:
        if not findings:
            return
        rows, path = [f.model_dump_json() for f in findings], self.dir / "findings.jsonl"
        with store_lock(self.root):  # the file and the index together (`index rebuild`)
            with self._lock:
                append_lines(path, rows, sync=False)
                self._count("findings", len(findings))
            self._index_write(lambda: self.index.add_findings(findings))
        fsync_file(path)  # durable before the caller marks its unit done

    def add_measurements(self, ms: list[Measurement]) -> None:
        """Append and index the records a chunk at a time: an import of 10,000 rows makes
        60,000, and their JSON is never held all at once (twice: the file's, the index's)."""
        if not ms:
            return
        path = self.dir / "measurements.jsonl"
        for i in range(0, len(ms), _CHUNK):
            chunk = ms[i:i + _CHUNK]
            rows = [m.model_dump_json() for m in chunk]
            with store_lock(self.root):  # the file and the index together (`index rebuild`)
                with self._lock:
                    append_lines(path, rows, sync=False)
                    self._count("measurements", len(chunk))
                del rows
                self._index_write(functools.partial(self.index.add_measurements, chunk))
        fsync_file(path)

    def retract(self, keep_units: set[str], step: str) -> None:
        """Before resuming a step: drop its records except those of finished units.

        Failures of units that are about to be tried again, and cross-node records
        that will be recomputed, must not stand beside the new ones. Each file is
        written anew and renamed over the old one, never rewritten in place.
        """
        with store_lock(self.root), self._lock:
            fs = [f for f in self.findings() if f.step != step or f.unit_key in keep_units]
            ms = [m for m in self.measurements() if m.step != step or m.unit_key in keep_units]
            # the smaller counts first: a crash between leaves more records than stated
            # (a run cut short), never fewer (which `index rebuild` would call damage)
            if self.meta.records is not None:
                self._count("findings", len(fs), exact=True)
                self._count("measurements", len(ms), exact=True)
                self._write_meta()
            atomic_write(self.dir / "findings.jsonl",
                         "".join(f.model_dump_json() + "\n" for f in fs))
            atomic_write(self.dir / "measurements.jsonl",
                         "".join(m.model_dump_json() + "\n" for m in ms))
            self._index_write(lambda: self.index.replace_records(self.run_id, fs, ms))
            self._index_write(lambda: self.index.upsert_run(self.meta), mark=False)

    def clear_records(self) -> None:
        """Drop every record of the run (an import cut short is stored again, whole)."""
        with store_lock(self.root), self._lock:
            if self.meta.records is not None:
                self._count("findings", 0, exact=True)
                self._count("measurements", 0, exact=True)
                self._write_meta()
            for name in ("findings.jsonl", "measurements.jsonl"):
                atomic_write(self.dir / name, "")
            self._index_write(lambda: self.index.replace_records(self.run_id, [], []))
            self._index_write(lambda: self.index.upsert_run(self.meta), mark=False)

    def _done_path(self, unit: str, step: str) -> Path:
        kind, name = unit_folder(unit)
        return self.dir / kind / name / step / "done.json"

    def mark_done(self, unit: str, step: str, summary: dict[str, Any]) -> None:
        write_json(self._done_path(unit, step), summary)

    def clear_done(self, unit: str, step: str) -> None:
        self._done_path(unit, step).unlink(missing_ok=True)

    def is_done(self, unit: str, step: str) -> bool:
        return self._done_path(unit, step).is_file()

    def done_summary(self, unit: str, step: str) -> dict[str, Any]:
        data = json.loads(self._done_path(unit, step).read_text())
        return data if isinstance(data, dict) else {}

    def findings(self) -> list[Finding]:
        return read_jsonl(self.dir / "findings.jsonl", Finding)

    def measurements(self) -> list[Measurement]:
        return read_jsonl(self.dir / "measurements.jsonl", Measurement)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
