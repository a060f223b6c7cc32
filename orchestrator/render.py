"""What reaches a terminal: text from users and nodes made inert and free of secrets
(`terminal_text`), and parser facts rendered for `gpuvet parse`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from orchestrator.errors import escaped
from payload.scrub import scrub_text

if TYPE_CHECKING:  # a type only: the CLI's consoles import this module, --help stays light
    from pydantic import BaseModel

def terminal_text(text: str) -> str:
    """Text as it may be shown on a terminal: every control character written out as
    `\\x1b`, `\\x07`, `\\u202e`, so an escape sequence in an inventory value, a file name
    or a node's output is seen, never obeyed. Tabs and line breaks stay. A secret in it
    (a path naming a token, a line an error quotes) is scrubbed (`payload.scrub`)."""
    return escaped(scrub_text(text), keep_lines=True)


def scrubbed(obj: Any, text: Callable[[str], str] = scrub_text) -> Any:
    """A JSON-like document with every string, keys too, through `text` (`scrub_text`, or
    `terminal_text` for a CSV cell); numbers and the document's shape stay. Strings seen
    before are not scrubbed again (an export repeats its providers, nodes and metrics)."""
    memo: dict[str, str] = {}

    def walk(o: Any) -> Any:
        if isinstance(o, str):
            if o not in memo:
                memo[o] = text(o)
            return memo[o]
        if isinstance(o, dict):
            return {walk(k): walk(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return [walk(v) for v in o]
        return o

    return walk(obj)


def _scalar(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:g}"
    return terminal_text(str(v))


def _flat(row: dict[str, Any]) -> dict[str, Any] | None:
    """A record whose values are scalars, lists of scalars and at most one flat dict, as a row.

    dmon samples (`values: {pwr: 80, ...}`) and errors lists read far better as columns;
    records with several sub-records (nccl-tests rows) stay nested.
    """
    if sum(isinstance(v, dict) for v in row.values()) > 1:
        return None
    out: dict[str, Any] = {}
    for k, v in row.items():
        if isinstance(v, dict):
            if any(isinstance(x, (dict, list)) for x in v.values()):
                return None
            out.update({(sub if sub not in row else f"{k}.{sub}"): x for sub, x in v.items()})
        elif isinstance(v, list):
            if any(isinstance(x, (dict, list)) for x in v):
                return None
            out[k] = ", ".join(_scalar(x) for x in v)
        else:
            out[k] = v
    return out


def _is_table(rows: Any) -> bool:
    return (isinstance(rows, list) and bool(rows) and all(isinstance(r, dict) for r in rows)
            and all(_flat(r) is not None for r in rows))


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
            rows = [_flat(r) or {} for r in value]
            cols = list(dict.fromkeys(c for r in rows for c in r))
            for c in cols:
                table.add_column(c)
            for row in rows:
                table.add_row(*(_scalar(row.get(c)) for c in cols))
            console.print(table)
        elif isinstance(value, dict):
            console.print(f"{indent}{terminal_text(str(key))}:", markup=False)
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
