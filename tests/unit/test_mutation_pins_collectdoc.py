"""The collect document's gate: what is refused, how it is said, and what passes through.

A document comes from a node or from a person (`preflight --from`); the refusal
must name the node, the first bad field and the number of problems, and say
what to do.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.collectdoc import validate
from orchestrator.errors import UsageError

DOC = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "h200x2-gpuvet"
                  / "collect_h200-host.json").read_text())


@pytest.mark.parametrize("doc", [
    [DOC], None, {**DOC, "tool": "something-else"}, {k: v for k, v in DOC.items() if k != "tool"},
    {k: v for k, v in DOC.items() if k != "commands"},
])
def test_what_is_not_a_collect_document_says_how_to_make_one(doc: Any) -> None:
    with pytest.raises(UsageError) as info:
        validate(doc, node="gpu-7")
    err = info.value
    assert (err.what, err.node, err.hint) == (
        "not a gpuvet collect document (no 'tool: gpuvet-payload')", "gpu-7",
        "produce it with `python3 -m payload collect`")


def test_the_first_bad_field_is_named_with_the_count_of_problems() -> None:
    doc = copy.deepcopy(DOC)
    doc["nccl"]["headers"] = 1
    with pytest.raises(UsageError) as one:
        validate(doc, node="gpu-7")
    assert one.value.what == ("not a valid collect document: nccl.headers: Input should be a "
                              "valid list (1 problem(s))")
    assert one.value.node == "gpu-7"
    assert one.value.hint == "use the unedited output of `python3 -m payload collect`"
    doc["mpi"]["mpi_h"] = "one"
    with pytest.raises(UsageError) as two:
        validate(doc, node="gpu-7")
    assert two.value.what.endswith("valid list (2 problem(s))")


def test_a_valid_document_comes_back_as_plain_data_with_its_own_keys() -> None:
    doc = copy.deepcopy(DOC)
    doc["added_by_a_newer_payload"] = {"x": 1}
    out = validate(doc, node="gpu-7")
    assert out["schema"] == DOC["schema"] and "schema_" not in out
    assert out["added_by_a_newer_payload"] == {"x": 1}
    assert out["commands"].keys() == DOC["commands"].keys()
    assert json.loads(json.dumps(out))["tool"] == "gpuvet-payload"
