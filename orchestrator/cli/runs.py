"""`gpuvet runs`, `gpuvet show RUN`, `gpuvet export RUN...`: runs you can find again.

All three read the store through the one loader (orchestrator.analysis.frames)
and never write into a run.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from orchestrator.cli._common import (
    emit_json,
    json_option,
    out,
    output_written,
    render,
    results_option,
    verbose_option,
)
from orchestrator.errors import UsageError, did_you_mean, shown
from orchestrator.files import warn
from orchestrator.render import scrubbed
from orchestrator.verdicts import Table
from payload.scrub import scrub_text

if TYPE_CHECKING:
    import pandas as pd

DATE_RE = re.compile(r"^\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2})?Z?)?$")
FORMATS = ("csv", "parquet", "json")


def _since(value: str | None) -> str | None:
    if value is None:
        return None
    if not DATE_RE.match(value):
        raise UsageError(f"--since {value!r} is not a date", hint="use YYYY-MM-DD or "
                         "YYYY-MM-DDTHH:MM:SSZ (UTC, as run times are recorded)")
    return value.replace(" ", "T")


LATEST = "latest"


def known_providers(root: Path, providers: Sequence[str]) -> None:
    """-p names providers with runs in the store: an unknown one is a typo (exit 2, the
    nearest name suggested), never an empty table."""
    from orchestrator.analysis import frames

    if not providers:
        return
    have = sorted({p for ps in frames.runs(root)["providers"] for p in ps})
    for p in providers:
        if p not in have:
            raise UsageError(f"no runs of provider {shown(p)} under {root}"
                             f"{did_you_mean(p, have)} (providers with runs: "
                             f"{', '.join(have) or 'none'})",
                             hint=f"see `gpuvet runs --results {root}`")


def resolve_runs(root: Path, run_ids: Sequence[str]) -> list[str]:
    """The runs named, each once, `latest` standing for the newest run in the store; an
    unknown id is exit 2 with the nearest id suggested."""
    from orchestrator.analysis import frames

    every = frames.runs(root)
    have = list(every["run_id"])
    out: list[str] = []
    for rid in run_ids:
        if rid == LATEST and rid not in have:
            if not have:
                raise UsageError(f"no runs under {root}: `{LATEST}` names none",
                                 hint="run a step first")
            rid = str(every.sort_values(["started", "run_id"])["run_id"].iloc[-1])
        elif rid not in have:
            raise UsageError(f"no run {shown(rid)} under {root}{did_you_mean(rid, have)}",
                             hint=f"see `gpuvet runs --results {root}`; `{LATEST}` names the "
                                  "newest run")
        out.append(rid)
    return list(dict.fromkeys(out))


def runs_table(root: Path, providers: Sequence[str] = (), since: str | None = None) -> Table:
    """One row per run, oldest first: what `gpuvet runs` prints."""
    from orchestrator.analysis import frames, verdict

    r = frames.runs(root, providers=providers or None, since=since)
    ids = list(r["run_id"])
    docs = frames.run_documents(root, ids) if ids else {}
    verdicts = verdict.run_verdicts(frames.findings(root, ids)) if ids else {}
    behind = frames.index_behind(root, docs)
    for rid, why in behind.items():  # named, and no verdict read from it
        warn(f"run {rid}: {why}: its verdict is not shown until `gpuvet index rebuild "
             f"--results {root}`")
    rows = []
    for rid, started, command, suite_hash, status, provs, nodes in zip(
            r["run_id"], r["started"], r["command"], r["suite_hash"], r["status"],
            r["providers"], r["nodes"], strict=True):
        inv = (docs.get(rid) or {}).get("inventory_sha256")
        # a run that did not finish (interrupted, error, or still running) has no verdict:
        # the findings it holds are a part, and a part with no FAIL is not a PASS
        shown = verdicts.get(rid, "-") if status in ("passed", "failed") and \
            rid not in behind else "-"
        rows.append((rid, started, command, inv[:12] if inv else "-", ",".join(provs),
                     len(nodes), suite_hash, status, shown))
    return Table(f"runs under {root}", ("run", "started", "step", "inventory", "providers",
                                        "nodes", "suite", "status", "verdict"), rows)


def lines(table: Table) -> str:
    """One plain line per run, columns aligned: a store of a thousand runs prints in
    milliseconds (a boxed table of that size takes seconds) and greps well."""
    cells = [list(table.columns)] + [["-" if v is None else str(v) for v in r]
                                     for r in table.rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(table.columns))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                     for row in cells)


def measurement_summary(ms: pd.DataFrame) -> Table:
    """Per series (step, scope, engine, nodes, metric; a collective other than all_reduce
    beside its metric, `busbw (alltoall)`): the largest message size's median, min and max
    over rounds; training metrics as they are."""
    import pandas as pd  # a second to import: `gpuvet --help` and the SSH commands never do

    rows: list[tuple[Any, ...]] = []
    if not ms.empty:
        df = ms[(ms["inplace"] != True)]  # noqa: E712 - out-of-place, or no such notion
        if "collective" in df.columns:  # another collective than all_reduce is its own series
            df = df.assign(metric=[m if not c or pd.isna(c) else f"{m} ({c})"
                                   for m, c in zip(df["metric"], df["collective"], strict=True)])
        keys = ["step", "scope", "engine", "nodes", "metric"]
        for key, g in df.groupby(keys, dropna=False, sort=True):
            sized = g[g["size"].notna()]
            if not sized.empty:
                top = sized["size"].max()
                g = sized[sized["size"] == top]
            vals = g["value"]
            size = None if pd.isna(g["size"].iloc[0]) else int(g["size"].iloc[0])
            rows.append((*key, size, len(vals), round(float(vals.median()), 4),
                         round(float(vals.min()), 4), round(float(vals.max()), 4),
                         str(g["unit"].iloc[0])))
    return Table("measurements (largest size per series)",
                 ("step", "scope", "engine", "nodes", "metric", "size", "n", "median", "min",
                  "max", "unit"), rows)


def _flat(prefix: str, d: Any) -> dict[str, Any]:
    """A tags/details dict as columns `prefix.key` (nested keys joined with dots)."""
    out: dict[str, Any] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(_flat(f"{prefix}.{k}", v) if isinstance(v, dict) else {f"{prefix}.{k}": v})
    return out


def _columns(df: pd.DataFrame, column: str) -> pd.DataFrame:
    """A column of dicts spread into typed columns; a column whose values mix kinds (a
    number here, a text there) is text, so every file format can hold it."""
    import pandas as pd  # a second to import: `gpuvet --help` and the SSH commands never do

    if column not in df.columns:
        return df
    flats = [_flat(column, d) for d in df[column]]
    wide = pd.DataFrame(flats, index=df.index)
    for c in wide.columns:
        raw = [f.get(c) for f in flats]  # as recorded: the frame made 8 of an int column 8.0
        vals = [v for v in raw if v is not None and not (isinstance(v, float) and v != v)]
        kinds = {type(v) for v in vals}
        if kinds <= {list, tuple} and all(isinstance(x, str) for v in vals for x in v):
            continue  # a list of names stays a list (Parquet list<string>)
        if kinds == {int}:  # a count stays an integer where some rows have none (not 8.0)
            wide[c] = pd.array([v if isinstance(v, int) else None for v in raw], dtype="Int64")
            continue
        if len(kinds - {int, float}) > 0 and len(kinds) > 1 or kinds & {list, tuple}:
            wide[c] = wide[c].map(lambda v: None if v is None else
                                  json.dumps(v, default=str) if isinstance(v, (list, tuple))
                                  else str(v))
    return pd.concat([df.drop(columns=[column]), wide], axis=1)


def export_tables(root: Path, run_ids: Sequence[str]) -> dict[str, pd.DataFrame]:
    """Tidy tables of these runs: one row per observation. Times are timestamps (UTC),
    lists are lists (evidence, providers, nodes), tags and details are dicts (spread
    into columns by `typed`), all-null columns are left out."""
    import pandas as pd  # a second to import: `gpuvet --help` and the SSH commands never do

    from orchestrator.analysis import environment, frames

    runs = frames.runs(root, run_ids=run_ids)
    fs = frames.finding_records(root, run_ids)
    findings = pd.DataFrame([f.model_dump(mode="json") for f in fs])
    ms = frames.measurements_tagged(root, run_ids)
    # integers stay integers where some rows have none (training metrics have no size), and
    # a measurement's nodes are a list as a run's are, not the index's joined text
    for col in ("size", "round"):
        if col in ms.columns:
            ms[col] = ms[col].astype("Int64")
    ms["nodes"] = ms["nodes"].map(lambda s: [n for n in str(s or "").split(",") if n])
    env = environment.with_units(environment.environment(runs))
    for col in ("started", "finished"):
        runs[col] = pd.to_datetime(runs[col], utc=True, errors="coerce")
    tables = {"runs": runs, "findings": findings, "measurements": ms, "environment": env}
    return {k: v.dropna(axis=1, how="all") if not v.empty else v for k, v in tables.items()}


def typed(tables: dict[str, pd.DataFrame], fmt: str) -> dict[str, pd.DataFrame]:
    """The tables as a format holds them: JSON keeps dicts and lists as they are; Parquet
    spreads tags/details into columns and keeps lists; CSV also joins lists with ';'."""
    if fmt == "json":
        return tables
    out = {}
    for name, df in tables.items():
        df = _columns(_columns(df, "tags"), "details")
        if fmt == "csv":  # a CSV cell holds text: lists joined with ';'
            for c in df.columns:
                if df[c].map(lambda v: isinstance(v, (list, tuple))).any():
                    df[c] = df[c].map(lambda v: ";".join(map(str, v))
                                      if isinstance(v, (list, tuple)) else v)
        out[name] = df.dropna(axis=1, how="all") if not df.empty else df
    return out


def inert(tables: dict[str, pd.DataFrame], fmt: str) -> dict[str, pd.DataFrame]:
    """Every text cell and column name scrubbed of secrets (`payload.scrub`: what the store
    holds is scrubbed already; a run stored before a form was known is too); a CSV cell
    also shows control characters escaped, as the terminal does (`render.terminal_text`:
    an ESC or U+202E in a GPU name is seen as `\\x1b`, `\\u202e`); Parquet keeps them."""
    from pandas.api import types  # a second to import: --help and the SSH commands never do

    from orchestrator.render import terminal_text

    text = terminal_text if fmt == "csv" else scrub_text
    out = {}
    for name, df in tables.items():
        df = df.rename(columns={c: text(c) for c in df.columns if isinstance(c, str)})
        for c in df.columns:
            col = df[c]
            if (types.is_numeric_dtype(col) or types.is_bool_dtype(col)
                    or types.is_datetime64_any_dtype(col)):
                continue
            memo: dict[str, str] = {}

            def cell(v: Any, memo: dict[str, str] = memo) -> Any:
                if isinstance(v, str):
                    if v not in memo:
                        memo[v] = text(v)
                    return memo[v]
                if hasattr(v, "tolist"):  # a Parquet list held as an array
                    v = v.tolist()
                return scrubbed(v, text) if isinstance(v, (list, tuple, dict)) else v

            df[c] = col.map(cell)
        out[name] = df
    return out


def export_paths(tables: Sequence[str], fmt: str, dest: Path) -> dict[str, Path]:
    """`-o x.parquet`: x.runs.parquet, x.measurements.parquet, ... beside it; `-o x` (no
    file suffix): a new folder x of runs.parquet, measurements.parquet, ..."""
    if dest.suffix == f".{fmt}":
        return {t: dest.with_name(f"{dest.stem}.{t}.{fmt}") for t in tables}
    return {t: dest / f"{t}.{fmt}" for t in tables}


def write_export(tables: dict[str, pd.DataFrame], fmt: str, dest: Path) -> list[Path]:
    """All or nothing: files are made in a temporary place and moved in at the end."""
    if fmt == "json":
        from orchestrator.store import atomic_write

        doc = scrubbed({k: json.loads(v.to_json(orient="records", date_format="iso"))
                        for k, v in tables.items()})
        atomic_write(dest, json.dumps(doc, indent=1) + "\n")
        return [dest]
    tables = inert(typed(tables, fmt), fmt)
    paths = export_paths(list(tables), fmt, dest)
    beside = dest.suffix == f".{fmt}"
    taken = [p for p in paths.values() if p.exists()] if beside else \
        ([dest] if dest.exists() and (not dest.is_dir() or any(dest.iterdir())) else [])
    if taken:
        raise UsageError(f"{taken[0]} exists; an export never overwrites",
                         hint="choose another -o")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        for name, df in tables.items():
            part = tmp / paths[name].name
            if fmt == "csv":
                df.to_csv(part, index=False)
            else:
                df.to_parquet(part, index=False)
        if beside:
            for name in tables:
                os.replace(tmp / paths[name].name, paths[name])
            tmp.rmdir()
        else:
            with contextlib.suppress(FileNotFoundError):
                dest.rmdir()
            os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return sorted(paths.values())


def register(root: click.Group) -> None:
    @root.command("runs")
    @results_option
    @click.option("-p", "--provider", "providers", multiple=True, metavar="NAME",
                  help="Only runs that touched this provider (repeatable).")
    @click.option("--since", metavar="DATE", help="Only runs started on or after DATE (UTC).")
    @json_option
    def runs_cmd(results: Path, providers: tuple[str, ...], since: str | None,
                 as_json: bool) -> int:
        """List the runs in the store, oldest first.

        A run left "running" by a process that is gone (killed with SIGKILL, a reboot)
        is marked "interrupted" first, and can be resumed with its command's --resume.
        A run that `gpuvet index rebuild` found missing records (a record file deleted,
        emptied, replaced or unreadable; run.json lost) is "damaged", with no verdict.
        """
        from orchestrator.store import reap_stale

        reap_stale(results)
        known_providers(results, providers)
        table = runs_table(results, providers, _since(since))
        if as_json:
            rows = table.as_json()["rows"]
            if rows:
                from orchestrator.analysis import frames

                r = frames.runs(results, providers=providers or None, since=_since(since))
                lists = {rid: (list(ps), list(ns)) for rid, ps, ns in
                         zip(r["run_id"], r["providers"], r["nodes"], strict=True)}
                for row in rows:
                    row["providers"], row["nodes"] = lists.get(row["run"], ([], []))
            emit_json(rows)
        else:
            out.print(lines(table))
        return 0

    @root.command("show")
    @results_option
    @click.argument("run_id", metavar="RUN")
    @verbose_option
    @json_option
    def show(results: Path, run_id: str, verbose: bool, as_json: bool) -> int:
        """Show a run's findings, verdicts and measurements again (read only). RUN is a
        run id from `gpuvet runs`, or `latest` for the newest run."""
        from orchestrator.analysis import frames
        from orchestrator.verdicts import findings_table, verdict_table, verdicts

        (run_id,) = resolve_runs(results, [run_id])
        r = frames.runs(results, run_ids=[run_id])
        row: dict[Any, Any] = r.iloc[0].to_dict()
        fs = frames.finding_records(results, [run_id])
        nodes = [str(n) for n in row["nodes"]]
        summary = measurement_summary(frames.measurements(results, [run_id]))
        # what `index rebuild` found missing in the run's files, or an index behind them:
        # either way the records shown are a part, and no verdict is made from them
        docs = frames.run_documents(results, [run_id])
        damage = [str(d) for d in docs.get(run_id, {}).get("damage") or []]
        behind = frames.index_behind(results, docs).get(run_id)
        if behind:
            warn(f"run {run_id}: {behind}: no verdict until `gpuvet index rebuild --results "
                 f"{results}`")
            damage.append(f"index: {behind}")
        if as_json:
            emit_json({"run_id": run_id, "status": row["status"], "damage": damage,
                       "command": row["command"],
                       "started": row["started"], "finished": row["finished"],
                       "suite_hash": row["suite_hash"], "results": row["path"],
                       "verdicts": {} if damage else verdicts(fs, nodes),
                       "findings": [f.model_dump(mode="json") for f in fs],
                       "measurements": summary.as_json()["rows"]})
            return 0
        out.print(f"run {run_id}: {row['command']}, {row['status']}, started "
                  f"{row['started']}, suite {row['suite_hash']}")
        for d in damage:
            out.print(f"damaged: {d}: the findings below are a part, no verdict is made")
        render(findings_table(fs, f"findings — run {run_id}", verbose))
        if not damage:
            render(verdict_table(fs, nodes))
        render(summary)
        return 0

    @root.command("export")
    @results_option
    @click.argument("run_ids", metavar="RUN...", nargs=-1, required=True)
    @click.option("--format", "fmt", type=click.Choice(FORMATS), default="csv",
                  show_default=True, help="csv and parquet: one file per table (runs, "
                                          "findings, measurements, environment); json: one "
                                          "file of all four.")
    @click.option("-o", "--output", type=click.Path(path_type=Path), required=True,
                  help="json: the file. csv/parquet: `-o x.parquet` writes x.runs.parquet, "
                       "x.findings.parquet, x.measurements.parquet and x.environment.parquet "
                       "beside it (read one with pandas.read_parquet('x.measurements.parquet'));"
                       " `-o x` (no suffix) a new folder x of runs.parquet, ...")
    def export(results: Path, run_ids: tuple[str, ...], fmt: str, output: Path) -> int:
        """Export runs' findings, measurements and environment facts as tidy tables: times
        as timestamps, integers as integers (empty where a row has none), lists as lists
        (joined with ';' in CSV), tags and details as columns (dicts in JSON), an
        environment fact's value beside its unit. Text is scrubbed of secrets; a CSV cell
        shows control characters escaped (`\\x1b`), as the terminal does, Parquet and JSON
        keep them. RUN is a run id from `gpuvet runs`, or `latest` for the newest run."""
        ids = resolve_runs(results, run_ids)
        if fmt == "parquet":
            try:
                import pyarrow  # noqa: F401 - imported late, for Parquet only
            except ImportError:
                raise UsageError("--format parquet needs pyarrow, a dependency of gpuvet "
                                 "missing from this Python environment",
                                 hint="pip install 'pyarrow>=15,<27'") from None
        tables = export_tables(results, ids)
        files = output_written(lambda: write_export(tables, fmt, output), output)
        for f in files:
            out.print(str(f))
        return 0
