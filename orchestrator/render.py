"""Human-readable rendering of parser facts for `gpuvet parse`."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from rich.console import Console
from rich.table import Table


def _scalar(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def _is_table(rows: Any) -> bool:
    return (isinstance(rows, list) and bool(rows) and all(isinstance(r, dict) for r in rows)
            and all(not isinstance(v, (dict, list)) for r in rows for v in r.values()))


def render_facts(console: Console, kind: str, facts: BaseModel) -> None:
    """Scalars as `key: value` lines, lists of flat records as tables, the rest nested."""
    data = facts.model_dump(mode="json")
    console.print(f"[bold]{kind}[/bold]", markup=True)
    _render(console, data, "")


def _render(console: Console, data: Any, indent: str) -> None:
    if not isinstance(data, dict):
        console.print(f"{indent}{_scalar(data)}", markup=False)
        return
    for key, value in data.items():
        if _is_table(value):
            table = Table(title=key, title_justify="left")
            cols = list(value[0])
            for c in cols:
                table.add_column(c)
            for row in value:
                table.add_row(*(_scalar(row.get(c)) for c in cols))
            console.print(table)
        elif isinstance(value, dict):
            console.print(f"{indent}{key}:", markup=False)
            _render(console, value, indent + "  ")
        elif isinstance(value, list):
            console.print(f"{indent}{key}: ({len(value)})", markup=False)
            for item in value:
                if isinstance(item, dict):
                    console.print(f"{indent}  -", markup=False)
                    _render(console, item, indent + "    ")
                else:
                    console.print(f"{indent}  - {_scalar(item)}", markup=False)
        else:
            console.print(f"{indent}{key}: {_scalar(value)}", markup=False)
