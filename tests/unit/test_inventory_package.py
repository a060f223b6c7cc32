"""The inventory package's layering, and the reader's limits at their exact edges."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from orchestrator.inventory import reader
from orchestrator.inventory.reader import MAX_BYTES, MAX_DEPTH, MAX_VALUES, Refused, Source

PACKAGE = Path(__file__).resolve().parents[2] / "orchestrator" / "inventory"

# each module may use only those before it: the schema and the YAML reader know nothing
# of each other, and nothing imports the package (__init__) back
ALLOWED = {
    "reader": set(),
    "model": set(),
    "nodes": {"model"},
    "problems": {"model", "reader"},
    "render": {"reader"},
    "scrub": {"reader", "render"},
}


def _siblings(module: str) -> set[str]:
    tree = ast.parse((PACKAGE / f"{module}.py").read_text(encoding="utf-8"))
    out: set[str] = set()
    for node in ast.walk(tree):
        names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                 else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
        for name in names:
            if name == "orchestrator.inventory" or name.startswith("orchestrator.inventory."):
                out.add(name.removeprefix("orchestrator.inventory").lstrip(".") or "__init__")
        if isinstance(node, ast.ImportFrom) and node.level:
            out.add(node.module or "__init__")
    return out


def test_every_module_of_the_package_is_listed() -> None:
    assert {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"} == set(ALLOWED)


@pytest.mark.parametrize("module", sorted(ALLOWED))
def test_modules_import_only_those_below_them(module: str) -> None:
    assert _siblings(module) <= ALLOWED[module]


def test_nesting_as_deep_as_the_limit_is_read() -> None:
    assert Source("[" * MAX_DEPTH + "]" * MAX_DEPTH).problems == []


def test_one_level_deeper_is_refused() -> None:
    with pytest.raises(Refused, match=f"nested deeper than {MAX_DEPTH} levels"):
        Source("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1))


def test_as_many_values_as_the_limit_are_read() -> None:
    # the list is a value too
    assert len(Source("[" + "1, " * (MAX_VALUES - 1) + "]").data) == MAX_VALUES - 1


def test_one_value_more_is_refused() -> None:
    with pytest.raises(Refused, match=f"more than {MAX_VALUES} values"):
        Source("[" + "1, " * MAX_VALUES + "]")


def test_a_file_of_exactly_the_limit_is_read_one_byte_more_is_not(tmp_path: Path) -> None:
    p = tmp_path / "inv.yaml"
    p.write_bytes(b"#" * (MAX_BYTES - 1) + b"\n")
    assert len(reader.read_text(p)) == MAX_BYTES
    p.write_bytes(b"#" * MAX_BYTES + b"\n")
    with pytest.raises(Refused, match="larger than 128 KiB"):
        reader.read_text(p)
