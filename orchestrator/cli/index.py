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

        What can be read is indexed: a damaged line of findings.jsonl or
        measurements.jsonl is skipped and listed (file and line), the rest of its run
        kept; a damaged run.json is read as far as it goes and completed from the run's
        records (its status, unless readable, becomes "error"). Each thing skipped is
        listed on stderr, one line each. A zero-byte index beside runs is refused by
        every other command with a hint to run this.
        """
        from orchestrator.store import rebuild_index

        n, problems = rebuild_index(results)
        for p in problems:
            err.print(p)
        out.print(f"indexed {n} run(s) under {results}")
        return 0
