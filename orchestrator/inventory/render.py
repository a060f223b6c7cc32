"""The problem lines as the user reads them: ``FILE:LINE: key.path[0]: message``.

Sorted by line, so the file can be fixed top down, and each once: a value
shared through a YAML alias or merge key is validated at every place that
uses it, but it is reported where it is written. The lines become an
``InventoryError`` (exit 2), which adds the count and the remedy around them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.inventory.reader import Loc, Problem


def render(p: Path, problems: list[Problem]) -> list[str]:
    """Sorted by line, each once: a value shared through an alias is reported where it is written."""
    seen: set[tuple[Any, ...]] = set()
    out: list[tuple[int, int, str]] = []
    for i, prob in enumerate(problems):
        key = (prob.line, prob.loc[-1:], prob.msg)
        if key in seen:
            continue
        seen.add(key)
        where = f"{p}:{prob.line}" if prob.line is not None else str(p)
        text = f"{where}: {_fmt_loc(prob.loc)}: {prob.msg}" if prob.loc else f"{where}: {prob.msg}"
        out.append((prob.line or 0, i, text))
    return [text for _, _, text in sorted(out)]


def _fmt_loc(loc: Loc) -> str:
    """A key path as the user would write it: ``providers.p.nodes[0].host``."""
    out = ""
    for part in loc:
        if isinstance(part, int) and not isinstance(part, bool):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "<top>"
