"""`gpuvet index rebuild`: the SQLite index anew from the runs' JSONL files."""

from __future__ import annotations

from pathlib import Path

import click

from orchestrator.cli._common import Group, err, out, results_option


def register(root: click.Group) -> None:
    @root.group("index", cls=Group)
    def index() -> None:
        """The results index (results/index.sqlite)."""

    @index.command("rebuild")
    @results_option
    def rebuild(results: Path) -> int:
        """Rebuild the index from every run's JSONL files (they are the record).

        What can be read is indexed: a damaged line of findings.jsonl,
        measurements.jsonl or baselines.jsonl is skipped and listed (file and line),
        the rest kept; a damaged or missing run.json is read as far as it goes and
        completed from the run's records (its status, unless readable, becomes "error").
        A run whose record files are missing, emptied, replaced or unreadable (fewer
        records than the run wrote) is indexed as "damaged", with no verdict. Each thing
        skipped or damaged is listed on stderr, one line each. A zero-byte index, or one
        that lost a table or holds a damaged row, is refused by every other command with
        a hint to run this.

        A command writing records at the same time (a run, a resume, an import) is
        waited for while it writes, and waits for the rebuild, so neither loses a record;
        a run in progress is indexed as it stands, listed, and its command goes on
        writing into the new index.
        """
        from orchestrator.rebuild import rebuild_index

        def waiting() -> None:
            err.print(f"waiting for a command that is writing records under {results}")

        n, problems = rebuild_index(results, waiting=waiting)
        for p in problems:
            err.print(p)
        out.print(f"indexed {n} run(s) under {results}")
        return 0
