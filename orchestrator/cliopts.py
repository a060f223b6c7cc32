"""Options and console helpers shared by every CLI command."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from orchestrator.executors.base import ProgressHook

# Piped output (logs, CI) gets wide tables instead of rich's 80-column default.
_WIDTH = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160
out = Console(highlight=False, soft_wrap=True, width=_WIDTH)
err = Console(stderr=True, highlight=False, soft_wrap=True)

InventoryOpt = Annotated[Path, typer.Option("--inventory", "-i", help="Inventory YAML file.")]
NodeOpt = Annotated[list[str] | None, typer.Option("--node", "-n",
                                                   help="Only this node (repeatable).")]
ProviderOpt = Annotated[str | None, typer.Option("--provider", "-p",
                                                 help="Only nodes of this provider.")]
AcceptOpt = Annotated[bool, typer.Option(
    "--accept-new-host-keys",
    help="Trust host keys seen for the first time and record them in known_hosts "
         "(like OpenSSH accept-new). A changed key is always refused.")]


@contextlib.contextmanager
def progress(label: str, total: int) -> Iterator[ProgressHook]:
    """A live per-node progress bar on stderr; plain lines when stderr is not a terminal."""
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), TextColumn("{task.fields[last]}"), console=err,
                   transient=True)
    task = bar.add_task(label, total=total, last="")
    if not err.is_terminal:
        err.print(f"{label}: {total} node(s)")

    def hook(node: str, state: str) -> None:
        if state != "start":
            bar.update(task, advance=1, last=f"{node} {state}")
            if not err.is_terminal:
                err.print(f"  {node}: {state}")

    with bar:
        yield hook
