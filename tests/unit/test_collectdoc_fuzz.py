"""A collect document with wrong types anywhere is bad input with its location, never a crash."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.errors import UsageError
from orchestrator.steps.preflight.step import judge_document
from tests.unit.collectdoc import H200_ORDER, inventory

DOC = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "h200x2-gpuvet"
                  / "collect_h200-host.json").read_text())

WEIRD = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10 ** 30), max_value=10 ** 30),
                  st.floats(allow_nan=True), st.text(max_size=20),
                  st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=5),
                                                                        st.integers(), max_size=2))


def paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:3]):
            out += paths(v, (*prefix, i))
    return out


ALL_PATHS = paths(DOC)


def put(doc: Any, path: tuple[Any, ...], value: Any) -> None:
    for p in path[:-1]:
        doc = doc[p]
    doc[path[-1]] = value


@pytest.fixture(scope="module")
def inv_node() -> Any:
    inv = inventory(H200_ORDER)
    return inv, inv.nodes[0]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(ALL_PATHS), WEIRD), min_size=1, max_size=4))
def test_mutated_documents_parse_or_are_bad_input(inv_node: Any, edits: list[Any]) -> None:
    inv, node = inv_node
    doc = copy.deepcopy(DOC)
    for path, value in edits:
        try:
            put(doc, path, value)
        except (TypeError, KeyError, IndexError):
            continue  # an earlier edit replaced a parent: nothing to put into
    try:
        judge_document(doc, node, inv, "r", None)
    except UsageError as exc:
        assert exc.exit_code == 2
        assert exc.node == node.name


def test_a_wrong_type_names_its_place(inv_node: Any) -> None:
    inv, node = inv_node
    doc = copy.deepcopy(DOC)
    doc["commands"]["uname"]["rc"] = "zero"
    with pytest.raises(UsageError, match=r"commands\.uname\.rc"):
        judge_document(doc, node, inv, "r", None)
