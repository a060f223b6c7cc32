"""Verdict rows: what a person reads after a run, and what decides the exit code.

The terminal, --json and the report all render these rows, so a wrong sort,
a dropped headline or a miscounted column is wrong everywhere at once.
"""

from __future__ import annotations

import json

import pytest

from orchestrator.records import Finding, finding
from orchestrator.verdicts import (
    HEADLINE_CODES,
    Table,
    failed,
    findings_table,
    run_status,
    shown,
    subjects,
    verdict_table,
    verdicts,
)


def f(node: str | None, code: str, severity: str, message: str = "m") -> Finding:
    return finding("r1", "preflight", provider="alpha", node=node, code=code,
                   severity=severity, message=message)  # type: ignore[arg-type]


FINDINGS = [
    f("n2", "GPU_COUNT", "PASS"),
    f("n1", "DRIVER", "PASS"),
    f("n1", "PCIE_LINK", "WARN", "gen 3 below the order"),
    f("n1", "GPU_MODEL", "FAIL", "40 GB cards"),
    f("n1", "NCCL_BUSBW", "INFO", "busbw 280 GB/s"),
    f("n1", "KERNEL", "INFO"),
    f(None, "NCCL_MULTI", "WARN", "across nodes"),
]


def test_table_rows_as_dicts_and_json() -> None:
    t = Table("t", ("a", "b"), [(1, "x"), (2, "y")])
    assert t.as_dicts() == [{"a": 1, "b": "x"}, {"a": 2, "b": "y"}]
    assert json.loads(json.dumps(t.as_json())) == {
        "title": "t", "columns": ["a", "b"], "rows": [{"a": 1, "b": "x"}, {"a": 2, "b": "y"}]}
    assert Table("empty", ("a",)).rows == []
    with pytest.raises(ValueError):  # a row with a missing cell is a bug, not a short row
        Table("t", ("a", "b"), [(1,)]).as_dicts()


def test_default_table_shows_problems_and_headlines_only() -> None:
    codes = [x.code for x in shown(FINDINGS, verbose=False)]
    assert codes == ["PCIE_LINK", "GPU_MODEL", "NCCL_BUSBW", "NCCL_MULTI"]
    assert [x.code for x in shown(FINDINGS, verbose=True)] == [x.code for x in FINDINGS]
    assert "NCCL_BUSBW" in HEADLINE_CODES and "DRIVER" not in HEADLINE_CODES


def test_findings_table_sorts_by_subject_then_worst_first_then_code() -> None:
    t = findings_table(FINDINGS, "preflight")
    assert t.title == "preflight"
    assert t.columns == ("node", "severity", "code", "message")
    assert t.rows == [
        ("n1", "FAIL", "GPU_MODEL", "40 GB cards"),
        ("n1", "WARN", "PCIE_LINK", "gen 3 below the order"),
        ("n1", "INFO", "NCCL_BUSBW", "busbw 280 GB/s"),
        ("provider alpha (all nodes)", "WARN", "NCCL_MULTI", "across nodes"),
    ]
    verbose = findings_table(FINDINGS, "preflight", verbose=True)
    assert [r[:3] for r in verbose.rows] == [
        # PASS and INFO weigh the same: by code among themselves
        ("n1", "FAIL", "GPU_MODEL"), ("n1", "WARN", "PCIE_LINK"), ("n1", "PASS", "DRIVER"),
        ("n1", "INFO", "KERNEL"), ("n1", "INFO", "NCCL_BUSBW"), ("n2", "PASS", "GPU_COUNT"),
        ("provider alpha (all nodes)", "WARN", "NCCL_MULTI"),
    ]


def test_subjects_asked_for_come_first_in_order_without_repeats() -> None:
    assert subjects(FINDINGS) == ["n1", "n2", "provider:alpha"]
    assert subjects(FINDINGS, ["n2", "n3", "n2"]) == ["n2", "n3", "n1", "provider:alpha"]


def test_verdict_per_node_is_the_worst_and_a_silent_node_is_not_measured() -> None:
    """A node asked for that produced no finding is listed (NOT MEASURED: nothing was judged,
    never PASS with 0 checks), never dropped; a node with only INFO findings too."""
    assert verdicts(FINDINGS, ["n3"]) == {"n3": "NOT MEASURED", "n1": "FAIL", "n2": "PASS",
                                          "provider:alpha": "WARN"}
    info = finding("r", "health", provider="alpha", node="n4", code="HEALTH_NO_GPU",
                   severity="INFO", message="no GPU")
    assert verdicts([info]) == {"n4": "NOT MEASURED"}
    assert verdict_table([info]).rows == [("n4", "NOT MEASURED", 0, 0, 0)]
    t = verdict_table(FINDINGS, ["n2"])
    assert t.title == "verdict per node"
    assert t.columns == ("node", "verdict", "FAIL", "WARN", "PASS")
    assert t.rows == [("n2", "PASS", 0, 0, 1), ("n1", "FAIL", 1, 1, 1),
                      ("provider alpha (all nodes)", "WARN", 0, 1, 0)]


def test_run_status_fails_on_any_fail_only() -> None:
    assert failed(FINDINGS) and run_status(FINDINGS) == "failed"
    no_fail = [x for x in FINDINGS if x.severity != "FAIL"]
    assert not failed(no_fail) and run_status(no_fail) == "passed"
    assert run_status([]) == "passed"
