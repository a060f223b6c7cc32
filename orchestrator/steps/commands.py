"""CLI commands of the steps (preflight, nccl, ...), attached to the main app."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Attach step commands; each step module adds its own."""
