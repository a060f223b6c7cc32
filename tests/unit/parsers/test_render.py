"""`gpuvet parse` rendering of every parser's facts: tables where records are flat enough."""

from __future__ import annotations

import pytest
from rich.console import Console
from test_fuzz import SEEDS, _seed

from orchestrator.parsers import parse
from orchestrator.render import render_facts


def _render(kind: str, text: str) -> str:
    console = Console(record=True, width=400)
    render_facts(console, kind, parse(kind, text))
    return console.export_text()


@pytest.mark.parametrize("kind", sorted(SEEDS))
def test_every_kind_renders(kind: str) -> None:
    out = _render(kind, _seed(SEEDS[kind][0]))
    assert out.splitlines()[0] == kind


def test_dmon_samples_are_one_table_with_a_column_per_metric(real) -> None:
    out = _render("dmon", real("dmon.txt"))
    header = next(ln for ln in out.splitlines() if "line_no" in ln)
    assert all(f" {c} " in header for c in ("gpu", "pwr", "gtemp", "rxpci", "txpci"))
    assert "values" not in header
