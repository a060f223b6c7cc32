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
        """Rebuild the index from every run's JSONL files (they are the record)."""
        from orchestrator.store import rebuild_index

        n, problems = rebuild_index(results)
        for p in problems:
            err.print(f"skipped {p}")
        out.print(f"indexed {n} run(s) under {results}")
        return 0
