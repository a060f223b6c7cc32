"""The SQLite index across runs: derived from the runs' JSONL files, rebuildable.

It holds runs (their `run.json`, `RunMeta`), findings, measurements and
baselines as typed columns beside each record's JSON. Baselines are the one
thing no run's files hold: `baselines.jsonl` under the results root is their
record (append-only), replayed into the index when it is rebuilt
(`rebuild.rebuild_index`).
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from orchestrator.errors import UsageError
from orchestrator.files import append_lines, read_jsonl_salvage, store_error, store_lock
from orchestrator.records import Finding, Measurement

SCHEMA_VERSION = 2
Status = Literal["running", "passed", "failed", "interrupted", "error"]


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
    # how many records the run had written when run.json was last saved (None: a run of an
    # older gpuvet): a record file holding fewer is damaged (deleted, emptied, replaced)
    records: dict[str, int] | None = None
    # the index's own note, never written to run.json: what `index rebuild` found missing
    # or unreadable in the run's files; such a run is "damaged" in the index, with no verdict
    damage: list[str] = []


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
RECORD_TABLES = ("runs", "findings", "measurements")
T = TypeVar("T", bound=BaseModel)


def damaged_index(path: Path, table: str, run_id: str | None, why: str) -> UsageError:
    """A row of the index that is not what it claims: named, with the way out (the index
    is derived; the runs' files are the record)."""
    whose = f" of run {run_id}" if run_id else ""
    return UsageError(f"{path}: a row of its {table} table{whose} is damaged ({why}): the "
                      "index no longer matches the runs' records",
                      hint=f"run `gpuvet index rebuild --results {path.parent}`")


def parse_row(model: type[T], text: Any, path: Path, table: str, run_id: str | None) -> T:
    """One record from an index row's JSON; a damaged row is `damaged_index` (exit 2)."""
    try:
        return model.model_validate_json(text)
    except (ValidationError, TypeError, ValueError) as exc:
        why = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
        raise damaged_index(path, table, run_id, why) from None


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
    collective: str = ""  # the nccl collective; "" for all_reduce and non-collective metrics
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
    # the typed status column says "damaged" where records are missing: no verdict is read
    # from such a run (`runs`, compare, regress and baseline take finished runs only)
    return (meta.run_id, meta.started, meta.finished, meta.command, meta.suite_hash,
            "damaged" if meta.damage else meta.status, meta.path, ",".join(meta.providers),
            ",".join(meta.nodes), meta.model_dump_json())


class Index:
    """SQLite index over every run under one results root."""

    def __init__(self, root: Path, *, path: Path | None = None) -> None:
        self.root = root
        self.path = path or root / "index.sqlite"
        self._lock = threading.Lock()
        try:
            root.mkdir(parents=True, exist_ok=True)
            _refuse_emptied(self.path, root)
            with self._connect() as db:
                self._refuse_lost_tables(db)
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
            raise store_error(exc, self.path) from exc

    def _refuse_lost_tables(self, db: sqlite3.Connection) -> None:
        """An index that has lost a table is not made whole by creating it empty: that would
        be a store without findings, every run a PASS. Named, with the way out."""
        have = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "meta" not in have:
            return  # a new index
        lost = [t for t in RECORD_TABLES if t not in have]
        if "baselines" not in have and (self.root / BASELINES_FILE).is_file():
            lost.append("baselines")
        if lost:
            raise UsageError(f"{self.path} has lost its {', '.join(lost)} "
                             f"table{'s' if len(lost) > 1 else ''}: it no longer "
                             "matches the runs' records",
                             hint=f"run `gpuvet index rebuild --results {self.root}`")

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            db = sqlite3.connect(self.path, timeout=30)
            # derived and rebuildable: no fsync per commit (each cost ~20 ms, serialised
            # under the lock, 20 s over 1,000 nodes). A crash of gpuvet cannot corrupt it
            # (the journal still makes every commit atomic); after a power loss it may need
            # `gpuvet index rebuild`, which a damaged index already asks for
            db.execute("PRAGMA synchronous=OFF")
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

    def delete_run(self, run_id: str) -> None:
        """Forget a run whose folder was taken away (an import cut short stores nothing)."""
        with self._connect() as db:
            for table in ("findings", "measurements", "runs"):
                db.execute(f"DELETE FROM {table} WHERE run_id=?", (run_id,))  # noqa: S608

    def findings(self, run_id: str) -> list[Finding]:
        with self._connect() as db:
            rows = db.execute("SELECT json FROM findings WHERE run_id=?", (run_id,)).fetchall()
        return [parse_row(Finding, r[0], self.path, "findings", run_id) for r in rows]

    def measurements(self, run_id: str | None = None) -> list[Measurement]:
        q, args = "SELECT json, run_id FROM measurements", tuple[str, ...]()
        if run_id:
            q, args = q + " WHERE run_id=?", (run_id,)
        with self._connect() as db:
            rows = db.execute(q, args).fetchall()
        return [parse_row(Measurement, r[0], self.path, "measurements", r[1]) for r in rows]

    def runs(self) -> list[RunMeta]:
        with self._connect() as db:
            rows = db.execute("SELECT json, run_id FROM runs ORDER BY started, run_id").fetchall()
        return [parse_row(RunMeta, r[0], self.path, "runs", r[1]) for r in rows]

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
        return [parse_row(BaselineRecord, r[0], self.path, "baselines", None) for r in rows]

    def counts(self, run_id: str) -> tuple[int, int]:
        with self._connect() as db:
            nf = db.execute("SELECT count(*) FROM findings WHERE run_id=?", (run_id,)).fetchone()
            nm = db.execute("SELECT count(*) FROM measurements WHERE run_id=?",
                            (run_id,)).fetchone()
        return int(nf[0]), int(nm[0])


def _refuse_emptied(path: Path, root: Path) -> None:
    """A zero-byte index beside runs was emptied (a full disk, a copy cut short): SQLite
    would read it as an empty store and every command would say "no runs". It is not
    rebuilt behind the user's back: the error says how to."""
    if not path.is_file() or path.stat().st_size != 0 or path.name != "index.sqlite":
        return
    if any((d / "run.json").is_file() for d in root.iterdir() if d.is_dir()):
        raise UsageError(f"{path} is empty (0 bytes) while runs are under {root}: the index "
                         "was lost", hint=f"run `gpuvet index rebuild --results {root}` "
                                          "(the runs' JSONL files are the record)")


def add_baselines(root: Path, records: list[BaselineRecord]) -> None:
    """Record a baseline set: the JSONL file first (the record), then the index."""
    if not records:
        return
    root.mkdir(parents=True, exist_ok=True)
    idx = Index(root)
    with store_lock(root):  # the file and the index together (`index rebuild` waits)
        append_lines(root / BASELINES_FILE, [r.model_dump_json() for r in records])
        idx.replace_baselines(records)


def baseline_sets(root: Path) -> tuple[list[list[BaselineRecord]], list[str]]:
    """Every baseline set in the order it was made (replaying them rebuilds the table), and
    one line per line of baselines.jsonl that cannot be read: a bad line costs that line."""
    sets: dict[str, list[BaselineRecord]] = {}
    records, bad = read_jsonl_salvage(root / BASELINES_FILE, BaselineRecord)
    for r in records:
        sets.setdefault(r.set_id, []).append(r)
    return list(sets.values()), bad
