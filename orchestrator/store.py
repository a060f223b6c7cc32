"""The results directory and its SQLite index.

Layout of one run:
    results/<run_id>/run.json                     what ran: suite, hash, versions, status
    results/<run_id>/inventory.yaml               the inventory as it was, secrets scrubbed
    results/<run_id>/nodes/<node>/<step>/...      raw outputs, facts, findings of one node
    results/<run_id>/providers/<p>/<step>/...     cross-node outputs of one provider
    results/<run_id>/findings.jsonl, measurements.jsonl   every record of the run
    results/index.sqlite                          runs, findings, measurements across runs

The JSONL files are the record; the index is derived from them and can be
rebuilt (`gpuvet index rebuild`). Files are written atomically (temp file,
fsync, rename); raw outputs stream straight to their file as they arrive, so
a crash loses at most the line in flight, and a torn last JSONL line is
detected, reported and skipped. A unit of work is marked done only after its
records are on disk, which is what `--resume` relies on.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import io
import json
import os
import re
import secrets
import shutil
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError
from ruamel.yaml import YAML

from orchestrator import __version__
from orchestrator.errors import GpuvetError, StoreError, Terminated, UsageError
from orchestrator.records import Finding, Measurement, unit_folder
from payload.scrub import redact_value, scrub_text

SCHEMA_VERSION = 2
DEFAULT_ROOT = Path("results")
RUN_ID_RE = re.compile(r"^\d{8}-\d{6}-[0-9a-f]{4}$")
Status = Literal["running", "passed", "failed", "interrupted", "error"]
R = TypeVar("R", Finding, Measurement, "BaselineRecord")


def _store_error(exc: OSError, path: Path) -> StoreError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        what = f"the results disk is full: cannot write {path}"
        hint = f"free space on the filesystem of {path.parent} (or use --results elsewhere)"
    else:
        what = f"cannot write {path}: {exc.strerror or exc}"
        hint = "check that the results folder is writable (or use --results elsewhere)"
    return StoreError(what, hint=hint + "; the run can be finished with --resume")


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
        raise _store_error(exc, path) from exc
    except BaseException:
        if tmp:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        raise


def write_json(path: Path, obj: Any) -> None:
    atomic_write(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(2)


def warn(message: str) -> None:
    """Store problems that do not stop the work (a torn line, a stale index)."""
    print(f"warning: {message}", file=sys.stderr)


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


def _append_lines(path: Path, lines: list[str]) -> None:
    """Append whole lines; a torn tail left by a crash is cut off first."""
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
            os.fsync(f.fileno())
    except OSError as exc:
        raise _store_error(exc, path) from exc


# --- run metadata ---------------------------------------------------------------------

class RunMeta(BaseModel):
    """run.json: validated whenever a run is opened."""

    model_config = ConfigDict(extra="forbid")
    run_id: str
    started: str
    finished: str | None = None
    command: str
    suite_hash: str
    suite: dict[str, Any]
    gpuvet_version: str
    schema_version: int = SCHEMA_VERSION
    status: Status = "running"
    path: str
    inventory_sha256: str | None = None
    providers: list[str] = []
    nodes: list[str] = []
    source: dict[str, Any] | None = None  # imports: what was read, from where
    index_stale: bool = False
    pid: int | None = None
    host: str | None = None


# --- the index: derived, rebuildable ----------------------------------------------------

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS runs (run_id TEXT PRIMARY KEY, started TEXT, finished TEXT,
    command TEXT, suite_hash TEXT, status TEXT, path TEXT, providers TEXT, nodes TEXT,
    json TEXT);
CREATE TABLE IF NOT EXISTS findings (run_id TEXT, scope TEXT, node TEXT, provider TEXT,
    step TEXT, code TEXT, severity TEXT, message TEXT, unit_key TEXT, json TEXT);
CREATE TABLE IF NOT EXISTS measurements (run_id TEXT, provider TEXT, nodes TEXT, step TEXT,
    scope TEXT, engine TEXT, metric TEXT, size INTEGER, inplace INTEGER, round INTEGER,
    value REAL, unit TEXT, suite_hash TEXT, unit_key TEXT, json TEXT);
CREATE INDEX IF NOT EXISTS findings_run ON findings(run_id);
CREATE INDEX IF NOT EXISTS findings_code ON findings(code, severity);
CREATE INDEX IF NOT EXISTS measurements_run ON measurements(run_id, metric);
CREATE INDEX IF NOT EXISTS measurements_series ON measurements(provider, suite_hash, metric,
    scope, engine, size);
CREATE INDEX IF NOT EXISTS runs_started ON runs(started);
CREATE TABLE IF NOT EXISTS baselines (set_id TEXT, provider TEXT, gpu_model TEXT,
    gpu_count INTEGER, suite_hash TEXT, scope TEXT, engine TEXT, metric TEXT, size INTEGER,
    span TEXT, n INTEGER, mean REAL, std REAL, median REAL, unit TEXT, set_at TEXT,
    set_by TEXT, json TEXT);
CREATE INDEX IF NOT EXISTS baselines_key ON baselines(provider, suite_hash);
"""
BASELINES_FILE = "baselines.jsonl"


class BaselineRecord(BaseModel):
    """One series' baseline: what a provider measured in the runs someone accepted.

    Not derived from any run's files, so it has its own record, `baselines.jsonl`
    under the results root (append-only: every `baseline set` adds its rows, the
    latest set for a provider, machine class and suite wins); the index table is
    rebuilt from it like the rest.
    """

    model_config = ConfigDict(extra="forbid")
    set_id: str
    provider: str
    gpu_model: str
    gpu_count: int
    suite_hash: str
    scope: str
    engine: str
    metric: str
    size: int  # bytes; -1 where the metric has no message size
    span: str  # single | multi
    n: int
    mean: float
    std: float
    median: float
    min: float
    max: float
    unit: str
    runs: list[str]
    set_at: str
    set_by: str
    how: str  # "runs RUN..." or "last N"


def _finding_row(f: Finding) -> tuple[Any, ...]:
    return (f.run_id, f.scope, f.node, f.provider, f.step, f.code, f.severity, f.message,
            f.unit_key, f.model_dump_json())


def _measurement_row(m: Measurement) -> tuple[Any, ...]:
    return (m.run_id, m.provider, ",".join(m.nodes), m.step, m.scope, m.engine, m.metric,
            m.size, None if m.inplace is None else int(m.inplace), m.round, m.value, m.unit,
            m.suite_hash, m.unit_key, m.model_dump_json())


def _run_row(meta: RunMeta) -> tuple[Any, ...]:
    return (meta.run_id, meta.started, meta.finished, meta.command, meta.suite_hash,
            meta.status, meta.path, ",".join(meta.providers), ",".join(meta.nodes),
            meta.model_dump_json())


class Index:
    """SQLite index over every run under one results root."""

    def __init__(self, root: Path, *, path: Path | None = None) -> None:
        self.root = root
        self.path = path or root / "index.sqlite"
        self._lock = threading.Lock()
        try:
            root.mkdir(parents=True, exist_ok=True)
            with self._connect() as db:
                db.executescript(_SCHEMA)
                row = db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
                if row is None:
                    db.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
                elif int(row[0]) != SCHEMA_VERSION:
                    raise UsageError(
                        f"{self.path} has schema {row[0]}, this gpuvet reads {SCHEMA_VERSION}",
                        hint=f"move {self.path} aside and run `gpuvet index rebuild "
                             f"--results {root}`")
        except sqlite3.DatabaseError as exc:
            raise UsageError(f"{self.path} is not a readable index: {exc}",
                             hint=f"run `gpuvet index rebuild --results {root}`") from None
        except OSError as exc:
            raise _store_error(exc, self.path) from exc

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            db = sqlite3.connect(self.path, timeout=30)
            try:
                with db:
                    yield db
            finally:
                db.close()

    def upsert_run(self, meta: RunMeta) -> None:
        with self._connect() as db:
            db.execute("INSERT OR REPLACE INTO runs VALUES (?,?,?,?,?,?,?,?,?,?)",
                       _run_row(meta))

    def add_findings(self, findings: Iterable[Finding]) -> None:
        rows = [_finding_row(f) for f in findings]
        with self._connect() as db:
            db.executemany("INSERT INTO findings VALUES (?,?,?,?,?,?,?,?,?,?)", rows)

    def add_measurements(self, ms: Iterable[Measurement]) -> None:
        rows = [_measurement_row(m) for m in ms]
        with self._connect() as db:
            db.executemany("INSERT INTO measurements VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                           rows)

    def replace_records(self, run_id: str, findings: list[Finding],
                        ms: list[Measurement]) -> None:
        """Make the index hold exactly these records of the run (after a retract)."""
        with self._connect() as db:
            db.execute("DELETE FROM findings WHERE run_id=?", (run_id,))
            db.execute("DELETE FROM measurements WHERE run_id=?", (run_id,))
            db.executemany("INSERT INTO findings VALUES (?,?,?,?,?,?,?,?,?,?)",
                           [_finding_row(f) for f in findings])
            db.executemany("INSERT INTO measurements VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                           [_measurement_row(m) for m in ms])

    def findings(self, run_id: str) -> list[Finding]:
        with self._connect() as db:
            rows = db.execute("SELECT json FROM findings WHERE run_id=?", (run_id,)).fetchall()
        return [Finding.model_validate_json(r[0]) for r in rows]

    def measurements(self, run_id: str | None = None) -> list[Measurement]:
        q, args = "SELECT json FROM measurements", tuple[str, ...]()
        if run_id:
            q, args = q + " WHERE run_id=?", (run_id,)
        with self._connect() as db:
            rows = db.execute(q, args).fetchall()
        return [Measurement.model_validate_json(r[0]) for r in rows]

    def runs(self) -> list[RunMeta]:
        with self._connect() as db:
            rows = db.execute("SELECT json FROM runs ORDER BY started, run_id").fetchall()
        return [RunMeta.model_validate_json(r[0]) for r in rows]

    def replace_baselines(self, records: list[BaselineRecord]) -> None:
        """A new set replaces every earlier row of its provider, machine class and suite."""
        with self._connect() as db:
            for key in {(r.provider, r.gpu_model, r.gpu_count, r.suite_hash) for r in records}:
                db.execute("DELETE FROM baselines WHERE provider=? AND gpu_model=? AND "
                           "gpu_count=? AND suite_hash=?", key)
            db.executemany("INSERT INTO baselines VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                           [(r.set_id, r.provider, r.gpu_model, r.gpu_count, r.suite_hash,
                             r.scope, r.engine, r.metric, r.size, r.span, r.n, r.mean, r.std,
                             r.median, r.unit, r.set_at, r.set_by, r.model_dump_json())
                            for r in records])

    def baselines(self, provider: str | None = None,
                  suite_hash: str | None = None) -> list[BaselineRecord]:
        q, args = "SELECT json FROM baselines WHERE 1=1", []
        for col, val in (("provider", provider), ("suite_hash", suite_hash)):
            if val is not None:
                q += f" AND {col}=?"
                args.append(val)
        with self._connect() as db:
            rows = db.execute(q + " ORDER BY provider, suite_hash, metric, size", args).fetchall()
        return [BaselineRecord.model_validate_json(r[0]) for r in rows]

    def counts(self, run_id: str) -> tuple[int, int]:
        with self._connect() as db:
            nf = db.execute("SELECT count(*) FROM findings WHERE run_id=?", (run_id,)).fetchone()
            nm = db.execute("SELECT count(*) FROM measurements WHERE run_id=?",
                            (run_id,)).fetchone()
        return int(nf[0]), int(nm[0])


def rebuild_index(root: Path) -> tuple[int, list[str]]:
    """Build the index anew from every run's JSONL files; swap it in atomically.

    Returns (runs indexed, problems): a run whose files cannot be read is left out
    and named, never guessed at."""
    if not root.is_dir():
        raise UsageError(f"no results folder {root}")
    tmp = root / f".index.sqlite.{os.getpid()}.tmp"
    tmp.unlink(missing_ok=True)
    problems: list[str] = []
    n = 0
    try:
        idx = Index(root, path=tmp)
        for run_dir in sorted(p for p in root.iterdir() if p.is_dir()):
            if not (run_dir / "run.json").is_file():
                continue
            try:
                run = Run.open(root, run_dir.name)
                findings = run.findings()
                ms = run.measurements()
            except GpuvetError as exc:
                problems.append(f"{run_dir.name}: {exc.what}")
                continue
            run.meta.index_stale = False
            idx.upsert_run(run.meta)
            idx.add_findings(findings)
            idx.add_measurements(ms)
            n += 1
        for group in _baseline_sets(root):
            idx.replace_baselines(group)
        os.replace(tmp, root / "index.sqlite")
    except OSError as exc:
        raise _store_error(exc, root / "index.sqlite") from exc
    finally:
        tmp.unlink(missing_ok=True)
    return n, problems


def add_baselines(root: Path, records: list[BaselineRecord]) -> None:
    """Record a baseline set: the JSONL file first (the record), then the index."""
    if not records:
        return
    root.mkdir(parents=True, exist_ok=True)
    _append_lines(root / BASELINES_FILE, [r.model_dump_json() for r in records])
    Index(root).replace_baselines(records)


def _baseline_sets(root: Path) -> list[list[BaselineRecord]]:
    """Every baseline set in the order it was made; replaying them rebuilds the table."""
    sets: dict[str, list[BaselineRecord]] = {}
    for r in read_jsonl(root / BASELINES_FILE, BaselineRecord):
        sets.setdefault(r.set_id, []).append(r)
    return list(sets.values())


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _inventory_copy(path: Path) -> str:
    """The inventory as it was, with every `env` value scrubbed the way collect.json is.

    The values (tokens, passwords, PEM keys handed to nodes) are replaced in place, so
    the copy keeps the file's layout, comments and line numbers."""
    text = path.read_text(encoding="utf-8", errors="replace")
    yaml = YAML()  # round trip: comments and layout stay
    try:
        doc = yaml.load(text)
    except Exception:  # the inventory loaded before; this is only belt and braces
        return scrub_text(text)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "env" and isinstance(value, dict):
                    for name in list(value):
                        value[name] = redact_value(str(name), None if value[name] is None
                                                   else str(value[name]))
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(doc)
    buf = io.StringIO()
    yaml.dump(doc, buf)
    return scrub_text(buf.getvalue())


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
        run = cls(root, new_run_id())
        run.index  # noqa: B018 - a broken index or results root fails before the run exists
        try:
            run.dir.mkdir(parents=True, exist_ok=False)
        except OSError as exc:
            raise _store_error(exc, run.dir) from exc
        inv_sha = None
        if inventory_path is not None:
            atomic_write(run.dir / "inventory.yaml", _inventory_copy(inventory_path))
            inv_sha = file_sha256(inventory_path)
        run.meta = RunMeta(run_id=run.run_id, started=_now(), command=command,
                           suite_hash=suite_hash, suite=suite, gpuvet_version=__version__,
                           path=str(run.dir), inventory_sha256=inv_sha,
                           providers=sorted(set(providers)), nodes=list(nodes), source=source,
                           pid=os.getpid(), host=os.uname().nodename)
        run.save_meta()
        return run

    @classmethod
    def open(cls, root: Path, run_id: str) -> Run:
        if not RUN_ID_RE.match(run_id):
            raise UsageError(f"{run_id!r} is not a run id (they look like 20261130-201500-ab12)",
                             hint=f"see `gpuvet runs --results {root}`")
        run = cls(root, run_id)
        meta_path = run.dir / "run.json"
        if not meta_path.is_file():
            raise UsageError(f"no run {run_id} under {root}",
                             hint=f"see `gpuvet runs --results {root}`")
        try:
            data = json.loads(meta_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise UsageError(f"{meta_path} is unreadable ({exc}): truncated or damaged",
                             hint="the run's records are in its JSONL files; restore run.json "
                                  "from a backup to use the run again") from None
        if not isinstance(data, dict):
            raise UsageError(f"{meta_path} is not a run document (a JSON {type(data).__name__}, "
                             "not an object)", hint="restore run.json from a backup to use the "
                             "run again; its records are in its JSONL files")
        version = data.get("schema_version", data.get("schema"))
        if version != SCHEMA_VERSION:
            raise UsageError(f"run {run_id} was written by a gpuvet with record schema "
                             f"{version}; this gpuvet reads schema {SCHEMA_VERSION}",
                             hint="read it with the gpuvet version that wrote it "
                                  f"({data.get('gpuvet_version', '?')})")
        try:
            run.meta = RunMeta.model_validate(data)
        except ValidationError as exc:
            raise UsageError(f"{meta_path} is not a valid run document: "
                             f"{exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}") from None
        return run

    def save_meta(self) -> None:
        write_json(self.dir / "run.json", self.meta.model_dump(mode="json"))
        self._index_write(lambda: self.index.upsert_run(self.meta), mark=False)

    def _index_write(self, fn: Any, *, mark: bool = True) -> None:
        """The JSONL files are the record: an index that cannot be written is stale, not fatal."""
        try:
            fn()
        except (sqlite3.Error, StoreError) as exc:
            warn(f"the index {self.index.path} was not updated ({exc}); the run's JSONL files "
                 f"hold every record: run `gpuvet index rebuild --results {self.root}`")
            if mark and not self.meta.index_stale:
                self.meta.index_stale = True
                write_json(self.dir / "run.json", self.meta.model_dump(mode="json"))

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

    @contextlib.contextmanager
    def locked(self) -> Iterator[Run]:
        """Only one process works on a run at a time (a second resume is refused)."""
        path = self.dir / ".lock"
        f = path.open("a+")
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            f.close()
            raise UsageError(f"run {self.run_id} is in use by {holder}",
                             hint="wait for it to finish, or stop it first") from None
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} on {os.uname().nodename}")
        f.flush()
        try:
            yield self
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
            f.close()

    def node_dir(self, node: str, step: str) -> Path:
        d = self.dir / "nodes" / node / step
        d.mkdir(parents=True, exist_ok=True)
        return d

    def provider_dir(self, provider: str, step: str) -> Path:
        d = self.dir / "providers" / provider / step
        d.mkdir(parents=True, exist_ok=True)
        return d

    def rel(self, path: Path) -> str:
        return str(path.relative_to(self.dir))

    def add_findings(self, findings: list[Finding]) -> None:
        if not findings:
            return
        with self._lock:
            _append_lines(self.dir / "findings.jsonl", [f.model_dump_json() for f in findings])
        self._index_write(lambda: self.index.add_findings(findings))

    def add_measurements(self, ms: list[Measurement]) -> None:
        if not ms:
            return
        with self._lock:
            _append_lines(self.dir / "measurements.jsonl", [m.model_dump_json() for m in ms])
        self._index_write(lambda: self.index.add_measurements(ms))

    def retract(self, keep_units: set[str], step: str) -> None:
        """Before resuming a step: drop its records except those of finished units.

        Failures of units that are about to be tried again, and cross-node records
        that will be recomputed, must not stand beside the new ones. Each file is
        written anew and renamed over the old one, never rewritten in place.
        """
        with self._lock:
            fs = [f for f in self.findings() if f.step != step or f.unit_key in keep_units]
            ms = [m for m in self.measurements() if m.step != step or m.unit_key in keep_units]
            atomic_write(self.dir / "findings.jsonl",
                         "".join(f.model_dump_json() + "\n" for f in fs))
            atomic_write(self.dir / "measurements.jsonl",
                         "".join(m.model_dump_json() + "\n" for m in ms))
        self._index_write(lambda: self.index.replace_records(self.run_id, fs, ms))

    def _done_path(self, unit: str, step: str) -> Path:
        kind, name = unit_folder(unit)
        return self.dir / kind / name / step / "done.json"

    def mark_done(self, unit: str, step: str, summary: dict[str, Any]) -> None:
        write_json(self._done_path(unit, step), summary)

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
