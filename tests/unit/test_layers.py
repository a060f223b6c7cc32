"""The layers of orchestrator/: every import points down its layer list, or stays level.

`LAYERS` is the list docs/architecture.md gives, lowest first. Every module
under orchestrator/ is parsed with `ast` (nothing is imported) and each import,
at module level, inside a function or under TYPE_CHECKING alike, must point to
its own layer or a lower one: an upward import hidden in a function is still a
circle, only one that shows at run time. Imports inside a function are allowed
in two cases only:

- a heavy optional library (`HEAVY`), with a comment on the line or the line
  above saying why it is late: `gpuvet --help` and the SSH commands must not
  load it (tests/unit/test_lazy_imports.py measures that);
- the CLI importing a lower layer inside a command, so `--help` stays fast.

Every other import sits at the top of its module, where a reader sees it.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Lowest first. "pkg.*" is a package and everything in it; a bare name is one module.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("payload", ("payload.*",)),
    ("base", ("orchestrator", "orchestrator.command", "orchestrator.errors",
              "orchestrator.records", "orchestrator.gpunames")),
    ("parsers", ("orchestrator.parsers.*",)),
    ("model", ("orchestrator.suite", "orchestrator.bands", "orchestrator.stats",
               "orchestrator.collectdoc", "orchestrator.inventory.*", "orchestrator.files",
               "orchestrator.index", "orchestrator.store.*", "orchestrator.rebuild",
               "orchestrator.verdicts")),
    ("executors", ("orchestrator.executors.*", "orchestrator.payload", "orchestrator.nccltests",
                   "orchestrator.testing")),
    ("judging", ("orchestrator.judging.*",)),
    ("steps", ("orchestrator.steps.*",)),
    ("analysis", ("orchestrator.analysis.*",)),
    ("answers", ("orchestrator.report.*", "orchestrator.render", "orchestrator.prom",
                 "orchestrator.pipeline.*", "orchestrator.schedule",
                 "orchestrator.drain")),
    ("cli", ("orchestrator.cli.*", "orchestrator.__main__")),
)
NAMES = [name for name, _ in LAYERS]

# Libraries that may be imported late, and why they are worth it.
HEAVY = {
    "torch": "seconds to import; only the training and all_reduce entry points need it",
    "ray": "optional (gpuvet[ray]); only the ray executor needs it",
    "matplotlib": "optional (gpuvet[report]); only the report's plots need it",
    "pyarrow": "optional (gpuvet[report]); only the Parquet export needs it",
    "jinja2": "optional (gpuvet[report]); only the HTML report needs it",
    "pandas": "about a second to import; --help and the SSH commands never need it",
    "scipy": "seconds to import; --help and the SSH commands never need it",
    "ruptures": "loads scipy.stats: seconds; only the regression verdict needs it",
}

# Modules being rewritten elsewhere right now, whose function-level imports of light
# modules move to the top there; listed here until then. Only the function-level rule
# is waived: an upward import fails them like any other module.
PENDING: dict[str, str] = {}

Where = Literal["module", "function", "type-checking"]


@dataclass(frozen=True)
class Import:
    line: int
    module: str  # what it names, resolved: `from orchestrator import store` is orchestrator.store
    where: Where
    reason: bool  # a comment on the line or the line above


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> int | None:
    """The layer of a module, by its most specific entry in LAYERS."""
    best: tuple[int, int] | None = None  # (length of the entry, layer)
    for i, (_, entries) in enumerate(LAYERS):
        for e in entries:
            if e.endswith(".*"):
                pkg = e[:-2]
                hit = module == pkg or module.startswith(pkg + ".")
                size = len(pkg)
            else:
                hit, size = module == e, len(e) + 1  # an exact entry beats its package
            if hit and (best is None or size > best[0]):
                best = (size, i)
    return None if best is None else best[1]


def _is_module(name: str) -> bool:
    base = ROOT.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


# tool pragmas (noqa, type: ignore) say nothing about why on their own
_PRAGMA = re.compile(r"noqa(:\s*[A-Z]+[0-9]+(,\s*[A-Z]+[0-9]+)*)?|type:\s*ignore(\[[^]]*\])?|"
                     r"pragma:[^#]*")


def _comment_lines(text: str) -> set[int]:
    """Lines with a comment that says something besides a tool pragma."""
    return {tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(text).readline)
            if tok.type == tokenize.COMMENT
            and re.search(r"[a-z]{2}", _PRAGMA.sub("", tok.string[1:]), flags=re.I)}


def imports(module: str, text: str, *, package: bool = False) -> list[Import]:
    """Every import in a module's text, with where it stands and whether it says why."""
    comments = _comment_lines(text)
    here = module.split(".") if package else module.split(".")[:-1]
    out: list[Import] = []

    def add(node: ast.stmt, name: str, where: Where) -> None:
        reason = node.lineno in comments or (node.lineno - 1) in comments
        out.append(Import(node.lineno, name, where, reason))

    def visit(node: ast.AST, where: Where) -> None:
        for child in ast.iter_child_nodes(node):
            inner = where
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                inner = "function"
            elif (isinstance(child, ast.If) and where == "module"
                  and _is_type_checking(child.test)):
                inner = "type-checking"
                for stmt in child.orelse:  # the `else:` of a TYPE_CHECKING block runs
                    visit(ast.Module(body=[stmt], type_ignores=[]), where)
                for stmt in child.body:
                    visit(ast.Module(body=[stmt], type_ignores=[]), inner)
                continue
            if isinstance(child, ast.Import):
                for alias in child.names:
                    add(child, alias.name, inner)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    up = here[:len(here) - (child.level - 1)] if child.level > 1 else here
                    base = ".".join([*up, *([base] if base else [])])
                for alias in child.names:
                    full = f"{base}.{alias.name}"
                    add(child, full if _is_module(full) else base, inner)
            visit(child, inner)

    visit(ast.parse(text), "module")
    return out


def problems(path: str, text: str) -> list[str]:
    """What is wrong with the imports of one file (path relative to the repository)."""
    module = module_name(ROOT / path)
    mine = layer_of(module)
    if mine is None:
        return [f"{path}: module {module} is in no layer: add it to the layer map "
                "(tests/unit/test_layers.py LAYERS and docs/architecture.md)"]
    out: list[str] = []
    for imp in imports(module, text, package=path.endswith("__init__.py")):
        top = imp.module.split(".")[0]
        ours = top in ("orchestrator", "payload")
        theirs = layer_of(imp.module) if ours else None
        if ours and theirs is None:
            out.append(f"{path}:{imp.line}: imports {imp.module}, which is in no layer: add it "
                       "to the layer map")
            continue
        if theirs is not None and theirs > mine:
            out.append(f"{path}:{imp.line}: {module} (layer {NAMES[mine]}) imports "
                       f"{imp.module} (layer {NAMES[theirs]}), a higher layer"
                       + ("" if imp.where == "module" else f" ({imp.where})"))
        if imp.where != "function" or path in PENDING:
            continue
        if ours:
            if not (NAMES[mine] == "cli" and theirs is not None and theirs < mine):
                out.append(f"{path}:{imp.line}: imports {imp.module} inside a function: "
                           "move it to the top of the module (only the CLI imports lower "
                           "layers inside its commands)")
        elif top not in HEAVY:
            out.append(f"{path}:{imp.line}: imports {imp.module} inside a function: move it to "
                       f"the top of the module (late imports are for {', '.join(HEAVY)})")
        elif not imp.reason:
            out.append(f"{path}:{imp.line}: imports {imp.module} inside a function without a "
                       f"comment saying why (e.g. {HEAVY[top]})")
    return list(dict.fromkeys(out))  # one line per import, not per name it imports


def _files() -> list[Path]:
    return sorted((ROOT / "orchestrator").rglob("*.py"))


def _rel(p: Path) -> str:
    return str(p.relative_to(ROOT))


def test_every_import_points_down_and_late_imports_say_why() -> None:
    found = [msg for p in _files() for msg in problems(_rel(p), p.read_text(encoding="utf-8"))]
    assert not found, "\n".join(found)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of a module graph: its strongly connected parts of two or more."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                out.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle_even_within_a_layer() -> None:
    """Layers allow imports sideways; a circle there (in any import, late or typing-only)
    still means two modules that cannot be read or loaded one without the other."""
    graph = {module_name(p): {i.module for i in imports(module_name(p),
                                                          p.read_text(encoding="utf-8"),
                                                          package=p.name == "__init__.py")}
             for p in _files()}
    assert cycles(graph) == []
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_payload_never_imports_the_controller() -> None:
    """The payload runs on the node with the node's python, without gpuvet installed."""
    found = [f"{_rel(p)}:{imp.line}: imports {imp.module}"
             for p in sorted((ROOT / "payload").rglob("*.py"))
             for imp in imports(module_name(p), p.read_text(encoding="utf-8"),
                                package=p.name == "__init__.py")
             if imp.module.split(".")[0] == "orchestrator"]
    assert not found, "\n".join(found)


def test_pending_exemptions_are_still_needed() -> None:
    """An entry whose module has no late import left (or is gone) is removed, not kept."""
    for path in PENDING:
        p = ROOT / path
        if not p.is_file():
            pytest.fail(f"{path} is gone: remove it from PENDING")
        late = [i for i in imports(module_name(p), p.read_text(encoding="utf-8"))
                if i.where == "function" and i.module.split(".")[0] not in HEAVY]
        assert late, f"{path} has no function-level import left: remove it from PENDING"


def test_the_architecture_doc_lists_the_same_layers_in_order() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = doc.split("## Layers", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^\d+\. \*\*([a-z]+)\*\*", section, flags=re.M)
    assert listed == NAMES


# --- the checker itself, on planted imports ---------------------------------------------------

@pytest.mark.parametrize(("path", "text", "expected"), [
    # bands (model) reaching up into the preflight judge inside a function: the old circle
    ("orchestrator/bands.py",
     "def f():\n    from orchestrator.steps.preflight.checks import model_matches\n",
     ["orchestrator/bands.py:2: orchestrator.bands (layer model) imports "
      "orchestrator.steps.preflight.checks (layer steps), a higher layer (function)",
      "orchestrator/bands.py:2: imports orchestrator.steps.preflight.checks inside a function: "
      "move it to the top of the module (only the CLI imports lower layers inside its "
      "commands)"]),
    # errors (base) typing with an executor's class under TYPE_CHECKING
    ("orchestrator/errors.py",
     "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
     "    from orchestrator.executors.base import CommandResult\n",
     ["orchestrator/errors.py:3: orchestrator.errors (layer base) imports "
      "orchestrator.executors.base (layer executors), a higher layer (type-checking)"]),
    # `from package import module` names the module, and a relative import resolves
    ("orchestrator/store.py", "from orchestrator import pipeline\n",
     ["orchestrator/store.py:1: orchestrator.store (layer model) imports "
      "orchestrator.pipeline (layer answers), a higher layer"]),
    ("orchestrator/parsers/gpus.py", "from ..analysis import frames\n",
     ["orchestrator/parsers/gpus.py:1: orchestrator.parsers.gpus (layer parsers) imports "
      "orchestrator.analysis.frames (layer analysis), a higher layer"]),
    # level and downward imports are fine anywhere at module level, and in the CLI late
    ("orchestrator/steps/driver.py", "from orchestrator.records import finding\n", []),
    ("orchestrator/cli/nccl.py", "def cmd():\n    from orchestrator.steps.nccl import step\n",
     []),
    # ... but not level ones inside a CLI function, nor anything late elsewhere
    ("orchestrator/cli/nccl.py", "def cmd():\n    from orchestrator.cli._steps import x\n",
     ["orchestrator/cli/nccl.py:2: imports orchestrator.cli._steps inside a function: move it "
      "to the top of the module (only the CLI imports lower layers inside its commands)"]),
    ("orchestrator/store.py", "def f():\n    import json\n",
     ["orchestrator/store.py:2: imports json inside a function: move it to the top of the "
      "module (late imports are for " + ", ".join(HEAVY) + ")"]),
    # a heavy library late needs its reason next to it
    ("orchestrator/report/plots.py", "def f():\n    import matplotlib\n",
     ["orchestrator/report/plots.py:2: imports matplotlib inside a function without a comment "
      f"saying why (e.g. {HEAVY['matplotlib']})"]),
    ("orchestrator/report/plots.py", "def f():\n    # optional: gpuvet[report]\n"
     "    import matplotlib\n", []),
    ("orchestrator/report/plots.py", "def f():\n    import matplotlib  # optional\n", []),
    ("orchestrator/report/plots.py", "def f():\n    import matplotlib  # noqa: F401\n",
     ["orchestrator/report/plots.py:2: imports matplotlib inside a function without a comment "
      f"saying why (e.g. {HEAVY['matplotlib']})"]),
    # the CLI may not reach into a layer above it (there is none) nor into an unmapped one
    ("orchestrator/cli/nccl.py", "import orchestrator.nowhere\n",
     ["orchestrator/cli/nccl.py:1: imports orchestrator.nowhere, which is in no layer: add it "
      "to the layer map"]),
    ("orchestrator/newthing.py", "",
     ["orchestrator/newthing.py: module orchestrator.newthing is in no layer: add it to the "
      "layer map (tests/unit/test_layers.py LAYERS and docs/architecture.md)"]),
])
def test_the_checker_catches_what_is_planted(path: str, text: str, expected: list[str]) -> None:
    assert problems(path, text) == expected


def test_exact_entries_beat_their_package_and_the_root_package_is_exact() -> None:
    assert NAMES[layer_of("orchestrator") or 0] == "base"
    assert layer_of("orchestrator.newthing") is None
    assert NAMES[layer_of("orchestrator.steps.preflight.checks") or 0] == "steps"
    assert NAMES[layer_of("payload.train.supervise") or 0] == "payload"
