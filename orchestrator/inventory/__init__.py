"""The inventory: providers, their nodes, what was ordered and what it costs.

A YAML file becomes pydantic models with unknown keys forbidden. Every
problem is reported with file, line and key path, all at once and sorted by
line, before anything connects: a typo found after an hour of provisioning is
an hour lost. A value is reported where it is written: a key set in a
provider's ``access`` is reported there, once, not once per node.

The file is read defensively, because an inventory may come from anyone:
at most ``MAX_BYTES``, UTF-8 without NUL or control characters, nesting at
most ``MAX_DEPTH`` deep and at most ``MAX_VALUES`` values once aliases are
expanded (a "billion laughs" file is refused in milliseconds). YAML is read
as an event stream with ruamel's pure safe parser, whose time is linear in
the length of comments and whose nesting does not recurse; the round-trip
loader is quadratic on long comments.

Numbers are strict: ``port: true`` is not port 1 and ``gpu_hour: .nan`` is
not a price. Hosts must be a hostname, an IPv4/IPv6 address or an ssh_config
alias, never something ssh would read as an option.

Files named by the inventory are checked only for providers that use ssh, so
the local-executor demo runs on a machine without ``~/.ssh``:

- ``identity_file`` and ``settings.ssh_config`` must be existing files;
- ``settings.known_hosts`` may be missing, because ``--accept-new-host-keys``
  creates it (without that option every node reports its unknown key and
  the remedy); then its directory must exist, so a typo in the path is not
  silently created. OpenSSH's own ``~/.ssh/known_hosts`` is exempt: like ssh,
  gpuvet creates ``~/.ssh`` on a fresh machine.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from orchestrator.errors import InventoryError
from orchestrator.inventory.model import (
    DEFAULT_KNOWN_HOSTS,
    NAME_PATTERN,
    Access,
    EnvName,
    ExecutorName,
    Expectations,
    Fabric,
    HostStr,
    InventoryFile,
    JumpHost,
    Name,
    NodeSpec,
    PathStr,
    PcieExpectation,
    Pricing,
    Provider,
    RayOptions,
    Settings,
    UserStr,
)
from orchestrator.inventory.nodes import Inventory, Node
from orchestrator.inventory.problems import semantic_problems, validation_problems
from orchestrator.inventory.reader import (
    MAX_BYTES,
    MAX_DEPTH,
    MAX_VALUES,
    Loc,
    Problem,
    Refused,
    Source,
    Span,
    read_text,
)
from orchestrator.inventory.render import render
from payload.scrub import REDACTED, redact_value, scrub_text

__all__ = [
    "DEFAULT_KNOWN_HOSTS", "MAX_BYTES", "MAX_DEPTH", "MAX_VALUES", "NAME_PATTERN", "Access",
    "EnvName", "ExecutorName", "Expectations", "Fabric", "HostStr", "Inventory", "InventoryFile",
    "JumpHost", "Loc", "Name", "Node", "NodeSpec", "PathStr", "PcieExpectation", "Pricing",
    "Problem", "Provider", "RayOptions", "Settings", "Source", "Span", "UserStr", "load",
    "scrubbed_copy",
]

# --- loading -------------------------------------------------------------------------------

def load(path: str | os.PathLike[str]) -> Inventory:
    """Parse and validate an inventory; raise InventoryError listing every problem."""
    p = Path(path)
    try:
        source = Source(read_text(p))
    except Refused as exc:
        raise InventoryError(str(p), render(p, [exc.problem])) from None
    problems = list(source.problems)
    if not isinstance(source.data, dict):
        problems.append(Problem(source.root_line, (), "expected a mapping with a 'providers' key"))
        raise InventoryError(str(p), render(p, problems))
    doc: InventoryFile | None = None
    try:
        doc = InventoryFile.model_validate(source.data, strict=True)
    except ValidationError as exc:
        problems.extend(validation_problems(exc, source))
    problems.extend(semantic_problems(source))
    if problems or doc is None:
        raise InventoryError(str(p), render(p, problems))
    return Inventory(doc, p)


# --- the copy a run keeps ------------------------------------------------------------------

_PEM_RE = re.compile(
    r"-----BEGIN ([A-Z0-9 ]*PRIVATE KEY[A-Z0-9 ]*)-----.*?(?:-----END [A-Z0-9 ]*-----|\Z)",
    re.DOTALL)


def _scrub_lines(text: str) -> str:
    """payload.scrub's text rules, without changing the number of lines."""
    text = _PEM_RE.sub(lambda m: REDACTED + "\n" * m.group(0).count("\n"), text)
    return "".join(scrub_text(line) for line in text.splitlines(keepends=True))


def _env_maps(data: Any) -> Iterator[dict[Any, Any]]:
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
    return _scrub_lines(out)
