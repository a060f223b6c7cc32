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
from orchestrator.errors import UsageError
from orchestrator.verdicts import Table

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


def runs_table(root: Path, providers: Sequence[str] = (), since: str | None = None) -> Table:
    """One row per run, oldest first: what `gpuvet runs` prints."""
    from orchestrator.analysis import frames, verdict

    r = frames.runs(root, providers=providers or None, since=since)
    ids = list(r["run_id"])
    docs = frames.run_documents(root, ids) if ids else {}
    verdicts = verdict.run_verdicts(frames.findings(root, ids)) if ids else {}
    rows = []
    for rid, started, command, suite_hash, status, provs, nodes in zip(
            r["run_id"], r["started"], r["command"], r["suite_hash"], r["status"],
            r["providers"], r["nodes"], strict=True):
        inv = (docs.get(rid) or {}).get("inventory_sha256")
        # a run that did not finish (interrupted, error, or still running) has no verdict:
        # the findings it holds are a part, and a part with no FAIL is not a PASS
        shown = verdicts.get(rid, "-") if status in ("passed", "failed") else "-"
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
    """Per series (step, scope, engine, nodes, metric): the largest message size's median,
    min and max over rounds; training metrics as they are."""
    import pandas as pd  # a second to import: `gpuvet --help` and the SSH commands never do

    rows: list[tuple[Any, ...]] = []
    if not ms.empty:
        df = ms[(ms["inplace"] != True)]  # noqa: E712 - out-of-place, or no such notion
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


def export_tables(root: Path, run_ids: Sequence[str]) -> dict[str, pd.DataFrame]:
    """Tidy tables of these runs: one row per observation."""
    import pandas as pd  # a second to import: `gpuvet --help` and the SSH commands never do

    from orchestrator.analysis import environment, frames

    runs = frames.runs(root, run_ids=run_ids)
    fs = frames.finding_records(root, run_ids)
    findings = pd.DataFrame([{**f.model_dump(exclude={"details", "evidence"}),
                              "evidence": ";".join(f.evidence),
                              "details": json.dumps(f.details, sort_keys=True, default=str)}
                             for f in fs])
    ms = frames.measurements_tagged(root, run_ids)
    ms["tags"] = ms["tags"].map(lambda t: json.dumps(t, sort_keys=True, default=str))
    env = environment.environment(runs)
    runs = runs.assign(providers=runs["providers"].map(",".join),
                       nodes=runs["nodes"].map(",".join))
    return {"runs": runs, "findings": findings, "measurements": ms, "environment": env}


def write_export(tables: dict[str, pd.DataFrame], fmt: str, dest: Path) -> list[Path]:
    """All or nothing: files are made in a temporary place and moved in at the end."""
    if fmt == "json":
        from orchestrator.store import atomic_write

        doc = {k: json.loads(v.to_json(orient="records")) for k, v in tables.items()}
        atomic_write(dest, json.dumps(doc, indent=1) + "\n")
        return [dest]
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise UsageError(f"{dest} exists and is not an empty folder; a {fmt} export writes "
                         "one file per table into a new folder", hint="choose another -o")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        for name, df in tables.items():
            if fmt == "csv":
                df.to_csv(tmp / f"{name}.csv", index=False)
            else:
                df.to_parquet(tmp / f"{name}.parquet", index=False)
        with contextlib.suppress(FileNotFoundError):
            dest.rmdir()
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return sorted(dest.iterdir())


def register(root: click.Group) -> None:
    @root.command("runs")
    @results_option
    @click.option("-p", "--provider", "providers", multiple=True, metavar="NAME",
                  help="Only runs that touched this provider (repeatable).")
    @click.option("--since", metavar="DATE", help="Only runs started on or after DATE (UTC).")
    @json_option
    def runs_cmd(results: Path, providers: tuple[str, ...], since: str | None,
                 as_json: bool) -> int:
        """List the runs in the store, oldest first."""
        table = runs_table(results, providers, _since(since))
        if as_json:
            emit_json(table.as_json()["rows"])
        else:
            out.print(lines(table))
        return 0

    @root.command("show")
    @results_option
    @click.argument("run_id", metavar="RUN")
    @verbose_option
    @json_option
    def show(results: Path, run_id: str, verbose: bool, as_json: bool) -> int:
        """Show a run's findings, verdicts and measurements again (read only)."""
        from orchestrator.analysis import frames
        from orchestrator.verdicts import findings_table, verdict_table, verdicts

        r = frames.runs(results, run_ids=[run_id])
        if r.empty:
            raise UsageError(f"no run {run_id} under {results}",
                             hint=f"see `gpuvet runs --results {results}`")
        row: dict[Any, Any] = r.iloc[0].to_dict()
        fs = frames.finding_records(results, [run_id])
        nodes = [str(n) for n in row["nodes"]]
        summary = measurement_summary(frames.measurements(results, [run_id]))
        if as_json:
            emit_json({"run_id": run_id, "status": row["status"], "command": row["command"],
                       "started": row["started"], "finished": row["finished"],
                       "suite_hash": row["suite_hash"], "results": row["path"],
                       "verdicts": verdicts(fs, nodes),
                       "findings": [f.model_dump(mode="json") for f in fs],
                       "measurements": summary.as_json()["rows"]})
            return 0
        out.print(f"run {run_id}: {row['command']}, {row['status']}, started "
                  f"{row['started']}, suite {row['suite_hash']}")
        render(findings_table(fs, f"findings — run {run_id}", verbose))
        render(verdict_table(fs, nodes))
        render(summary)
        return 0

    @root.command("export")
    @results_option
    @click.argument("run_ids", metavar="RUN...", nargs=-1, required=True)
    @click.option("--format", "fmt", type=click.Choice(FORMATS), default="csv",
                  show_default=True, help="csv and parquet: a folder of one file per table; "
                                          "json: one file.")
    @click.option("-o", "--output", type=click.Path(path_type=Path), required=True,
                  help="Where to write (a new folder for csv/parquet, a file for json).")
    def export(results: Path, run_ids: tuple[str, ...], fmt: str, output: Path) -> int:
        """Export runs' findings, measurements and environment facts as tidy tables."""
        from orchestrator.analysis import frames

        known = set(frames.runs(results, run_ids=list(run_ids))["run_id"])
        missing = [r for r in run_ids if r not in known]
        if missing:
            raise UsageError(f"no run {', '.join(missing)} under {results}",
                             hint=f"see `gpuvet runs --results {results}`")
        if fmt == "parquet":
            try:
                import pyarrow  # noqa: F401 - optional (gpuvet[report]), for Parquet only
            except ImportError:
                raise UsageError("--format parquet needs pyarrow",
                                 hint="pip install 'gpuvet[report]'") from None
        tables = export_tables(results, list(dict.fromkeys(run_ids)))
        files = output_written(lambda: write_export(tables, fmt, output), output)
        for f in files:
            out.print(str(f))
        return 0
