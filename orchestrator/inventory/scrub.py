"""The copy of an inventory a run keeps: the file as written, with its secrets scrubbed.

A run keeps its inventory so that a result can be explained later, but an
inventory's ``env`` blocks may hand tokens, passwords or keys to the nodes,
and nothing secret may reach a result. The copy is made by editing the text
where each ``env`` value is written (the spans ``reader.Source`` keeps), not
by dumping the data again: comments, layout and every line number stay, so
a problem reported against the copy points at the same line as in the
original. The text is read with the same limits as ``load()``. The rules are
payload.scrub's, the one scrubber of everything gpuvet stores.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from orchestrator.errors import InventoryError
from orchestrator.inventory.reader import Refused, Source, Span, read_text
from orchestrator.inventory.render import render
from payload.scrub import REDACTED, redact_value, scrub_lines


def _env_maps(data: Any) -> Iterator[dict[Any, Any]]:
    """Every ``env`` mapping in the data, each once: an alias shares its container."""
    seen: set[int] = set()
    todo: list[tuple[Any, Any]] = [(None, data)]
    while todo:
        key, node = todo.pop()
        if not isinstance(node, (dict, list)) or id(node) in seen:
            continue
        seen.add(id(node))
        if key == "env" and isinstance(node, dict):
            yield node
        children = node.items() if isinstance(node, dict) else ((None, v) for v in node)
        todo.extend(children)


def scrubbed_copy(inv_path: str | os.PathLike[str]) -> str:
    """The inventory text as a run may keep it: every `env` value passed through payload.scrub.

    Values whose name looks secret, or that hold tokens, URL passwords or PEM
    blocks, become "***" (quoted, so the copy is still YAML). A replaced value
    keeps its line breaks, so every other line keeps its number. Comments and
    other lines go through scrub_text line by line.
    """
    p = Path(inv_path)
    try:
        text = read_text(p)
        source = Source(text)
    except Refused as exc:
        raise InventoryError(str(p), render(p, [exc.problem])) from None
    edits: dict[Span, tuple[str, set[str]]] = {}
    for env in _env_maps(source.data):
        for name, value in env.items():
            span = source.span_of(env, name)
            if span is not None and isinstance(value, str):
                original, names = edits.setdefault(span, (value, set()))
                names.add(str(name))
    out = text
    for (start, end, anchor), (value, names) in sorted(edits.items(), reverse=True):
        redacted = [redact_value(n, value) for n in sorted(names)]
        changed = [r for r in redacted if r != value]
        if not changed:
            continue
        new = REDACTED if REDACTED in changed else str(changed[0])
        old = text[start:end]
        repl = (f"&{anchor} " if anchor else "") + json.dumps(new, ensure_ascii=False)
        breaks = old.count("\n")
        if breaks:
            tail = old[old.rfind("\n") + 1:]
            repl += "\n" * breaks + (tail if not tail.strip() else "")
        out = out[:start] + repl + out[end:]
    return scrub_lines(out)
