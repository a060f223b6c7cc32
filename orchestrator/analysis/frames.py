"""The one loader: the results store as pandas DataFrames.

Every command that reads history (runs, show, export, compare, report,
baseline, regress) goes through here. It reads the SQLite index's typed
columns, so a filter by provider, suite hash, metric, scope, engine or size is
a query, not a scan of JSON. Tidy frames: one row per observation.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from orchestrator.errors import UsageError
from orchestrator.index import damaged_index, parse_row
from orchestrator.records import Finding
from orchestrator.store import Index
from payload.allreduce import BUSBW_FACTORS

RUN_COLUMNS = ["run_id", "started", "finished", "command", "suite_hash", "status", "path",
               "providers", "nodes"]
FINDING_COLUMNS = ["run_id", "scope", "node", "provider", "step", "code", "severity",
                   "message", "unit_key"]
MEASUREMENT_COLUMNS = ["run_id", "provider", "nodes", "step", "scope", "engine", "metric",
                       "size", "inplace", "round", "value", "unit", "suite_hash", "unit_key"]
# the collective of the nccl and fleet steps (their `op` tag) as a column: "" for all_reduce
# and for every measurement that is not of another collective, so all_reduce series keep the
# keys they had; the network mode's (its `mode` tag) are "<collective> network", a series of
# their own
_OTHER_COLLECTIVES = ", ".join(f"'{c}'" for c in sorted(BUSBW_FACTORS) if c != "all_reduce")
COLLECTIVE_SQL = ("CASE WHEN step = 'nccl' AND json_extract(json, '$.tags.mode') = 'network' "
                  "THEN coalesce(json_extract(json, '$.tags.op'), 'all_reduce') || ' network' "
                  f"WHEN step IN ('nccl', 'fleet') AND json_extract(json, '$.tags.op') IN "
                  f"({_OTHER_COLLECTIVES}) THEN json_extract(json, '$.tags.op') ELSE '' END "
                  "AS collective")


@dataclass
class Frames:
    runs: pd.DataFrame
    findings: pd.DataFrame
    measurements: pd.DataFrame


def _where(column: str, values: Sequence[str] | None, args: list[str]) -> str:
    if not values:
        return ""
    args.extend(values)
    return f" AND {column} IN ({','.join('?' * len(values))})"


def _connect(root: Path) -> sqlite3.Connection:
    if not (root / "index.sqlite").is_file():
        raise UsageError(f"no results under {root} (no index.sqlite)",
                         hint="run a step first, or point --results at a results folder; "
                              "`gpuvet index rebuild` recreates a lost index")
    Index(root)  # refuses an index of another schema with its own message
    return sqlite3.connect(f"file:{root / 'index.sqlite'}?mode=ro", uri=True)


def runs(root: Path, *, run_ids: Sequence[str] | None = None,
         providers: Sequence[str] | None = None, since: str | None = None) -> pd.DataFrame:
    """One row per run, oldest first; `providers` keeps runs that touched any of them."""
    args: list[str] = []
    q = f"SELECT {', '.join(RUN_COLUMNS)} FROM runs WHERE 1=1" + _where("run_id", run_ids, args)
    if since:
        q += " AND started >= ?"
        args.append(since)
    q += " ORDER BY started, run_id"
    with _connect(root) as db:
        df = pd.read_sql_query(q, db, params=args)
    df["providers"] = df["providers"].fillna("").map(lambda s: [p for p in s.split(",") if p])
    df["nodes"] = df["nodes"].fillna("").map(lambda s: [p for p in s.split(",") if p])
    # a run's folder is <root>/<run_id> wherever the store was written from: the stored path
    # is relative to the directory of whoever wrote it when --results was relative
    df["path"] = [str(root / str(r)) for r in df["run_id"]]
    if providers:
        want = set(providers)
        df = df[df["providers"].map(lambda ps: bool(want & set(ps)))]
    return df.reset_index(drop=True)


def findings(root: Path, run_ids: Sequence[str] | None = None) -> pd.DataFrame:
    args: list[str] = []
    q = (f"SELECT {', '.join(FINDING_COLUMNS)} FROM findings WHERE 1=1"
         + _where("run_id", run_ids, args))
    with _connect(root) as db:
        return pd.read_sql_query(q, db, params=args)


def measurements(root: Path, run_ids: Sequence[str] | None = None, *,
                 providers: Sequence[str] | None = None,
                 metrics: Sequence[str] | None = None) -> pd.DataFrame:
    args: list[str] = []
    q = (f"SELECT {', '.join(MEASUREMENT_COLUMNS)}, {COLLECTIVE_SQL} FROM measurements "
         "WHERE 1=1" + _where("run_id", run_ids, args) + _where("provider", providers, args)
         + _where("metric", metrics, args))
    with _connect(root) as db:
        try:
            df = pd.read_sql_query(q, db, params=args)
        except (sqlite3.DatabaseError, pd.errors.DatabaseError) as exc:
            # a row whose JSON is damaged fails the collective's json_extract: named (exit
            # 2, with the rebuild hint), never a traceback
            raise damaged_index(root / "index.sqlite", "measurements", None,
                                str(exc).rsplit(": ", 1)[-1]) from None
    df["inplace"] = df["inplace"].map(lambda v: None if pd.isna(v) else bool(v))
    return df


def load(root: Path, run_ids: Sequence[str] | None = None, *,
         providers: Sequence[str] | None = None, since: str | None = None) -> Frames:
    r = runs(root, run_ids=run_ids, providers=providers, since=since)
    ids = list(r["run_id"])
    if not ids:
        empty = Frames(r, pd.DataFrame(columns=FINDING_COLUMNS),
                       pd.DataFrame(columns=[*MEASUREMENT_COLUMNS, "collective"]))
        return empty
    return Frames(r, findings(root, ids), measurements(root, ids))


# --- what the typed columns leave out: evidence, details, tags, run documents ----------------

def finding_records(root: Path, run_ids: Sequence[str] | None = None) -> list[Finding]:
    """The findings as records, with their evidence files and details (for verdicts and
    reports, which cite evidence); oldest run first, in the order they were written."""
    args: list[str] = []
    q = ("SELECT json, run_id FROM findings WHERE 1=1" + _where("run_id", run_ids, args)
         + " ORDER BY rowid")
    with _connect(root) as db:
        rows = db.execute(q, args).fetchall()
    path = root / "index.sqlite"
    return [parse_row(Finding, r[0], path, "findings", r[1]) for r in rows]


def run_documents(root: Path, run_ids: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
    """run.json as indexed (suite, inventory hash, source, ...), by run id."""
    args: list[str] = []
    q = "SELECT run_id, json FROM runs WHERE 1=1" + _where("run_id", run_ids, args)
    with _connect(root) as db:
        rows = db.execute(q, args).fetchall()
    return {r[0]: _document(root, "runs", r[0], r[1]) for r in rows}


def _document(root: Path, table: str, run_id: str, text: Any) -> dict[str, Any]:
    """An index row's JSON object; a damaged one is named (exit 2), never a traceback."""
    try:
        doc = json.loads(text)
    except (TypeError, ValueError) as exc:
        raise damaged_index(root / "index.sqlite", table, run_id, str(exc)) from None
    if not isinstance(doc, dict):
        raise damaged_index(root / "index.sqlite", table, run_id, "not a JSON object")
    return doc


def measurements_tagged(root: Path, run_ids: Sequence[str] | None = None, *,
                        metrics: Sequence[str] | None = None) -> pd.DataFrame:
    """`measurements` plus a `tags` column (dicts): read from each record, so keep the
    selection small (one run's training metrics, an export)."""
    args: list[str] = []
    q = (f"SELECT {', '.join(MEASUREMENT_COLUMNS)}, json FROM measurements WHERE 1=1"
         + _where("run_id", run_ids, args) + _where("metric", metrics, args))
    with _connect(root) as db:
        df = pd.read_sql_query(q, db, params=args)
    df["inplace"] = df["inplace"].map(lambda v: None if pd.isna(v) else bool(v))
    tags: list[Any] = [_document(root, "measurements", rid, s).get("tags") or {}
                       for rid, s in zip(df["run_id"], df.pop("json"), strict=True)]
    df["tags"] = pd.Series(tags, index=df.index, dtype=object)
    return df


def steps_of(root: Path, run_ids: Sequence[str] | None = None) -> pd.DataFrame:
    """(run_id, provider, step) of every record: which runs measured what, without loading
    the records (a compare picks each provider's latest run per step from this)."""
    args: list[str] = []
    w = _where("run_id", run_ids, args)
    q = (f"SELECT DISTINCT run_id, provider, step FROM findings WHERE 1=1{w} UNION "
         f"SELECT DISTINCT run_id, provider, step FROM measurements WHERE 1=1{w}")
    with _connect(root) as db:
        return pd.read_sql_query(q, db, params=args + args)


def largest_size(root: Path, provider: str, metric: str, run_id: str | None = None) -> int | None:
    """The largest message size of a provider's `metric` (in one run, or any); None if none."""
    args: list[str] = [provider, metric]
    q = "SELECT max(size) FROM measurements WHERE provider=? AND metric=?"
    if run_id:
        q += " AND run_id=?"
        args.append(run_id)
    with _connect(root) as db:
        row = db.execute(q, args).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def index_behind(root: Path, docs: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Finished runs whose index rows are not what their run.json says they wrote, by run id,
    each with why: an index write that failed (`index_stale`), or fewer findings or
    measurements indexed than the run counted (`records`). Such a run's verdict is not read
    from the index until `gpuvet index rebuild` has made it whole again."""
    finished = {rid: d for rid, d in docs.items()
                if d.get("status") in ("passed", "failed") and not d.get("damage")}
    out = {rid: "an index write failed while it ran" for rid, d in finished.items()
           if d.get("index_stale")}
    stated = {rid: d["records"] for rid, d in finished.items()
              if isinstance(d.get("records"), dict) and rid not in out}
    if not stated:
        return out
    counts: dict[tuple[str, str], int] = {}
    with _connect(root) as db:
        for table in ("findings", "measurements"):
            for rid, n in db.execute(f"SELECT run_id, count(*) FROM {table} GROUP BY run_id"):
                counts[(table, rid)] = int(n)
    for rid, rec in stated.items():
        short = [f"{counts.get((t, rid), 0)} of the {int(rec.get(t) or 0)} {t}"
                 for t in ("findings", "measurements")
                 if counts.get((t, rid), 0) < int(rec.get(t) or 0)]
        if short:
            out[rid] = f"the index holds {' and '.join(short)} the run wrote"
    return out
