"""What `make mutation` measures is what its scores claim: mutmut leaves decorated
functions unmutated, so a module in scripts/mutation.sh registers its parsers (or
anything else) by calling `register(...)(func)` after the definition. Only a cache
wrapper is allowed: it guards a file read, and a mutated copy would defeat it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ALLOWED = {"functools.lru_cache", "functools.cache", "lru_cache", "cache"}


def _modules() -> list[str]:
    text = (ROOT / "scripts" / "mutation.sh").read_text()
    return sorted(set(re.findall(r"^\s*\[([\w/]+\.py)\]=", text, re.M)))


def _name(node: ast.expr) -> str:
    node = node.func if isinstance(node, ast.Call) else node
    return ast.unparse(node)


def test_the_script_lists_the_modules_of_the_issue() -> None:
    mods = _modules()
    assert "orchestrator/parsers/system.py" in mods and "orchestrator/analysis/cost.py" in mods
    assert len(mods) > 40


def test_no_top_level_function_in_scope_is_decorated() -> None:
    found = []
    for mod in _modules():
        for node in ast.parse((ROOT / mod).read_text()).body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                found += [f"{mod}:{node.lineno} {node.name} @{_name(d)}"
                          for d in node.decorator_list if _name(d) not in ALLOWED]
    assert found == []
