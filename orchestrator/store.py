"""The results directory and its SQLite index.

Layout of one run:
    results/<run_id>/run.json                     what ran: suite, hash, versions, status
    results/<run_id>/inventory.yaml               the inventory as it was
    results/<run_id>/nodes/<node>/<step>/...      raw outputs, facts, findings of one node
    results/<run_id>/findings.jsonl, measurements.jsonl   every record of the run
    results/index.sqlite                          runs, findings, measurements across runs

Files are written atomically (temp file, fsync, rename); raw outputs stream
straight to their file as they arrive, so a crash loses at most the line in
flight. A step marks a node done only after its records are on disk, which
is what `--resume` relies on.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import sqlite3
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from orchestrator import __version__
from orchestrator.errors import UsageError
from orchestrator.records import Finding, Measurement

SCHEMA_VERSION = 1
DEFAULT_ROOT = Path("results")


def atomic_write(path: Path, data: str | bytes, *, durable: bool = True) -> None:
    """Temp file and rename: readers never see half a file. `durable=False` skips the
    fsync, for files derived from one already on disk (raw outputs cut out of a
    payload document): a crash loses nothing that cannot be made again."""
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_json(path: Path, obj: Any) -> None:
    atomic_write(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(2)


_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS runs (run_id TEXT PRIMARY KEY, started TEXT, finished TEXT,
    command TEXT, suite_hash TEXT, status TEXT, path TEXT);
CREATE TABLE IF NOT EXISTS findings (run_id TEXT, node TEXT, provider TEXT, step TEXT,
    code TEXT, severity TEXT, message TEXT, json TEXT);
CREATE TABLE IF NOT EXISTS measurements (run_id TEXT, provider TEXT, nodes TEXT, step TEXT,
    metric TEXT, value REAL, unit TEXT, suite_hash TEXT, round INTEGER, json TEXT);
CREATE INDEX IF NOT EXISTS findings_run ON findings(run_id);
CREATE INDEX IF NOT EXISTS measurements_run ON measurements(run_id, metric);
"""


class Index:
    """SQLite index over every run under one results root."""

    def __init__(self, root: Path) -> None:
        self.path = root / "index.sqlite"
        self._lock = threading.Lock()
        root.mkdir(parents=True, exist_ok=True)
        with self._connect() as db:
            db.executescript(_SCHEMA)
            row = db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            if row is None:
                db.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
            elif int(row[0]) != SCHEMA_VERSION:
                raise UsageError(f"{self.path} has schema {row[0]}, this gpuvet reads "
                                 f"{SCHEMA_VERSION}", hint="use a matching gpuvet version")

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            db = sqlite3.connect(self.path, timeout=30)
            try:
                with db:
                    yield db
            finally:
                db.close()

    def upsert_run(self, run: dict[str, Any]) -> None:
        with self._connect() as db:
            db.execute("INSERT OR REPLACE INTO runs VALUES (?,?,?,?,?,?,?)",
                       (run["run_id"], run.get("started"), run.get("finished"),
                        run.get("command"), run.get("suite_hash"), run.get("status"),
                        run.get("path")))

    def add_findings(self, findings: Iterable[Finding]) -> None:
        rows = [(f.run_id, f.node, f.provider, f.step, f.code, f.severity, f.message,
                 f.model_dump_json()) for f in findings]
        with self._connect() as db:
            db.executemany("INSERT INTO findings VALUES (?,?,?,?,?,?,?,?)", rows)

    def add_measurements(self, ms: Iterable[Measurement]) -> None:
        rows = [(m.run_id, m.provider, ",".join(m.nodes), m.step, m.metric, m.value, m.unit,
                 m.suite_hash, m.round, m.model_dump_json()) for m in ms]
        with self._connect() as db:
            db.executemany("INSERT INTO measurements VALUES (?,?,?,?,?,?,?,?,?,?)", rows)

    def replace_findings(self, run_id: str, findings: list[Finding]) -> None:
        rows = [(f.run_id, f.node, f.provider, f.step, f.code, f.severity, f.message,
                 f.model_dump_json()) for f in findings]
        with self._connect() as db:
            db.execute("DELETE FROM findings WHERE run_id=?", (run_id,))
            db.executemany("INSERT INTO findings VALUES (?,?,?,?,?,?,?,?)", rows)

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


class Run:
    """One run's directory: create, write records, mark nodes done, resume."""

    def __init__(self, root: Path, run_id: str) -> None:
        self.root = root
        self.run_id = run_id
        self.dir = root / run_id
        self.index = Index(root)
        self._lock = threading.Lock()

    @classmethod
    def create(cls, root: Path, *, command: str, suite_hash: str, suite: dict[str, Any],
               inventory_path: Path | None) -> Run:
        run = cls(root, new_run_id())
        run.dir.mkdir(parents=True, exist_ok=False)
        if inventory_path is not None:
            shutil.copyfile(inventory_path, run.dir / "inventory.yaml")
        run.meta = {"run_id": run.run_id, "started": _now(), "finished": None,
                    "command": command, "suite_hash": suite_hash, "suite": suite,
                    "gpuvet_version": __version__, "schema": SCHEMA_VERSION,
                    "status": "running", "path": str(run.dir)}
        run.save_meta()
        return run

    @classmethod
    def open(cls, root: Path, run_id: str) -> Run:
        run = cls(root, run_id)
        meta_path = run.dir / "run.json"
        if not meta_path.is_file():
            raise UsageError(f"no run {run_id} under {root}",
                             hint=f"see the folders in {root}/")
        run.meta = json.loads(meta_path.read_text())
        return run

    meta: dict[str, Any]

    def save_meta(self) -> None:
        write_json(self.dir / "run.json", self.meta)
        self.index.upsert_run(self.meta)

    def finish(self, status: str) -> None:
        self.meta.update(finished=_now(), status=status)
        self.save_meta()

    @contextlib.contextmanager
    def guard(self) -> Iterator[Run]:
        """A run that dies records why: status "interrupted" or "error", never "running"."""
        try:
            yield self
        except KeyboardInterrupt:
            self.finish("interrupted")
            raise
        except BaseException:
            self.finish("error")
            raise

    def node_dir(self, node: str, step: str) -> Path:
        d = self.dir / "nodes" / node / step
        d.mkdir(parents=True, exist_ok=True)
        return d

    def rel(self, path: Path) -> str:
        return str(path.relative_to(self.dir))

    def add_findings(self, findings: list[Finding]) -> None:
        self._append("findings.jsonl", [f.model_dump_json() for f in findings])
        self.index.add_findings(findings)

    def add_measurements(self, ms: list[Measurement]) -> None:
        self._append("measurements.jsonl", [m.model_dump_json() for m in ms])
        self.index.add_measurements(ms)

    def _append(self, name: str, lines: list[str]) -> None:
        if not lines:
            return
        with self._lock, (self.dir / name).open("a", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines))
            f.flush()
            os.fsync(f.fileno())

    def retract(self, keep_nodes: set[str], step: str) -> None:
        """Before resuming a step: drop its findings except those of finished nodes.

        Failures of nodes that are about to be tried again, and cross-node
        findings that will be recomputed, must not stand beside the new ones.
        """
        path = self.dir / "findings.jsonl"
        kept = [f for f in self.findings() if f.step != step or f.node in keep_nodes]
        with self._lock:
            atomic_write(path, "".join(f.model_dump_json() + "\n" for f in kept))
        self.index.replace_findings(self.run_id, kept)

    def mark_done(self, node: str, step: str, summary: dict[str, Any]) -> None:
        write_json(self.node_dir(node, step) / "done.json", summary)

    def is_done(self, node: str, step: str) -> bool:
        return (self.dir / "nodes" / node / step / "done.json").is_file()

    def findings(self) -> list[Finding]:
        path = self.dir / "findings.jsonl"
        if not path.is_file():
            return []
        return [Finding.model_validate_json(line) for line in path.read_text().splitlines()
                if line.strip()]


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
