"""The inventory: providers, their nodes, what was ordered and what it costs.

A YAML file becomes pydantic models with unknown keys forbidden. Every
problem is reported with file, line and key path, all at once and sorted by
line, before anything connects: a typo found after an hour of provisioning is
an hour lost. ``load()`` is the one way in; the rest of gpuvet imports the
names it needs from here, never from the modules below, which are:

- ``reader``: bytes to plain data that remembers the line of every key, read
  defensively (size, encoding, alias bombs, nesting);
- ``model``: the pydantic schema and the checks of values that reach ssh or
  a shell;
- ``nodes``: ``Node`` (provider defaults merged in) and ``Inventory`` with
  its ``-n``/``-p`` selection;
- ``problems``: pydantic's errors located at their line, and the checks
  between values (names, jump hosts, files);
- ``render``: the problem lines the user reads;
- ``scrub``: the copy of the file a run keeps, secrets scrubbed.

They depend on each other in that order only (``model`` and ``reader``
know nothing of each other), so each can be read and tested on its own.
"""

from __future__ import annotations

import os
from pathlib import Path

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
    SlurmLogin,
    SlurmOptions,
    UserStr,
)
from orchestrator.inventory.nodes import Inventory, Node, allocated_node, checked_name
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
from orchestrator.inventory.scrub import scrubbed_copy

__all__ = [
    "DEFAULT_KNOWN_HOSTS", "MAX_BYTES", "MAX_DEPTH", "MAX_VALUES", "NAME_PATTERN", "Access",
    "EnvName", "ExecutorName", "Expectations", "Fabric", "HostStr", "Inventory", "InventoryFile",
    "JumpHost", "Loc", "Name", "Node", "NodeSpec", "PathStr", "PcieExpectation", "Pricing",
    "Problem", "Provider", "RayOptions", "Settings", "SlurmLogin", "SlurmOptions", "Source",
    "Span", "UserStr", "load",
    "allocated_node", "checked_name", "scrubbed_copy",
]


def load(path: str | os.PathLike[str]) -> Inventory:
    """Parse and validate an inventory; raise InventoryError listing every problem.

    A text that cannot be read at all is one problem. Otherwise what the reader
    found, pydantic's problems and the checks between values are reported
    together: the checks between values run even when pydantic refused the
    document, so one `gpuvet inventory check` shows everything to fix.
    """
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
