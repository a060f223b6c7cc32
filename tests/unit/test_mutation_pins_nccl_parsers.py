"""Every nccl-tests and NCCL debug capture read whole, and the shared helpers on exact values.

The parsed record of each capture (text, -J JSON, NCCL_DEBUG=INFO lines) is compared with
the one kept in tests/fixtures/golden/nccl/, field by field: rows, ranks, parameters,
failures, every line read past and why, the edits found. A capture the parser refuses is
kept as its refusal (kind, message, line number, line). After a deliberate change of what
the parsers read, rewrite the records with

    GPUVET_GOLDEN=write .venv/bin/python -m pytest tests/unit/test_mutation_pins_nccl_parsers.py

and read the diff before committing it: it is the change in behaviour.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import ParseError
from orchestrator.parsers.nccl_debug import parse_nccl_debug
from orchestrator.parsers.nccl_tests import parse_nccl_tests, parse_nccl_tests_json

FIX = Path(__file__).resolve().parents[1] / "fixtures"
GOLDEN = FIX / "golden" / "nccl"
WRITE = os.environ.get("GPUVET_GOLDEN") == "write"

TEXT_LOGS = sorted(
    [*(FIX / "nccl-tests").glob("*.log"), *(FIX / "h200x2" / "nccl-tests").glob("*.log"),
     *(FIX / "recipe-h200x1-extras").glob("*.log"), *(FIX / "public").glob("*.log"),
     *(FIX / "h200x2-gpuvet").glob("*.log")],
    key=lambda p: str(p.relative_to(FIX)))
TEXT_LOGS = [p for p in TEXT_LOGS if "nThread" in p.read_text() or "NCCL" in p.read_text()
             or p.parent.name == "public" and p.name.startswith(("all_", "alltoall", "broadcast",
                                                                  "reduce"))]
JSON_LOGS = sorted([*(FIX / "nccl-tests").glob("*.json"), *(FIX / "h200x2" / "nccl-tests").glob("*.json")])
DEBUG_LOGS = [p for p in TEXT_LOGS if "NCCL INFO" in p.read_text()] + sorted(
    (FIX / "h200x2-train" / "sim-run" / "providers").rglob("torchrun.stdout"))


def _name(path: Path) -> str:
    return str(path.relative_to(FIX)).replace("/", "__")


def _refusal(exc: ParseError) -> dict[str, Any]:
    return {"refused": {"kind": exc.kind, "message": str(exc), "line_no": exc.line_no,
                        "line": exc.line, "source": exc.source}}


def _compare(kind: str, path: Path, got: dict[str, Any]) -> None:
    golden = GOLDEN / kind / (_name(path) + ".json")
    # through JSON and back, as the stored record is read: floats and tuples alike
    got = json.loads(json.dumps(got))
    if WRITE:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    want = json.loads(golden.read_text())
    assert got == want


def _text_record(path: Path) -> dict[str, Any]:
    src = path.name
    try:
        return parse_nccl_tests(path.read_text(), source=src).model_dump(mode="json")
    except ParseError as exc:
        return _refusal(exc)


@pytest.mark.parametrize("path", TEXT_LOGS, ids=_name)
def test_an_nccl_tests_log_is_read_whole(path: Path) -> None:
    _compare("text", path, _text_record(path))


@pytest.mark.parametrize("path", JSON_LOGS, ids=_name)
def test_an_nccl_tests_json_is_read_whole(path: Path) -> None:
    try:
        got = parse_nccl_tests_json(path.read_text(), source=path.name).model_dump(mode="json")
    except ParseError as exc:
        got = _refusal(exc)
    _compare("json", path, got)


@pytest.mark.parametrize("path", DEBUG_LOGS, ids=_name)
def test_the_nccl_debug_lines_of_a_log_are_read_whole(path: Path) -> None:
    try:
        facts = parse_nccl_debug(path.read_text(), source=path.name)
        got: dict[str, Any] = facts.model_dump(mode="json")
        got["derived"] = {"used": facts.used, "nics": facts.nics, "summary": facts.summary(),
                          "versions_by_host": facts.versions_by_host,
                          "version_mismatch": facts.version_mismatch}
    except ParseError as exc:
        got = _refusal(exc)
    _compare("debug", path, got)
