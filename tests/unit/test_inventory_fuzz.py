"""An inventory edited badly anywhere is a list of problems, never a crash or a hang."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator import inventory
from orchestrator.errors import InventoryError

BASE = (Path(__file__).resolve().parents[1] / "fixtures/inventories/fleet-32.yaml").read_text()
PIECES = list("[]{}:,-&*!|>'\"#?<% \n\t") + [
    "<<: *x", "&x ", "*x", "!!set ", "? ", "---\n", "\\0", "true", ".nan", "~", "- ",
    "env: {A_KEY: |\n  x\n  y\n}", 'PASSWORD: &x "a\\nb"', "proxy_jump: gamma-01"]


@st.composite
def edited(draw: st.DrawFn) -> str:
    text = BASE
    for _ in range(draw(st.integers(1, 6))):
        at = draw(st.integers(0, len(text)))
        how = draw(st.sampled_from(["insert", "delete", "copy"]))
        if how == "insert":
            text = text[:at] + draw(st.sampled_from(PIECES)) + text[at:]
        elif how == "delete":
            text = text[:at] + text[at + draw(st.integers(1, 8)):]
        else:
            src = draw(st.integers(0, len(text)))
            text = text[:at] + text[src:src + draw(st.integers(1, 40))] + text[at:]
    return text


@pytest.mark.timeout(120)
@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(text=edited())
def test_edits_anywhere_are_problems_and_the_copy_stays_equivalent(tmp_path: Path, text: str) -> None:
    p = tmp_path / "inv.yaml"
    p.write_text(text)
    try:
        inv: inventory.Inventory | None = inventory.load(p)
    except InventoryError as exc:
        assert exc.problems and all(pr.startswith(str(p)) for pr in exc.problems)
        inv = None
    try:
        copy = inventory.scrubbed_copy(p)
    except InventoryError:
        assert inv is None  # a file that loads can always be copied
        return
    assert copy.count("\n") == text.count("\n")
    if inv is not None:
        q = tmp_path / "copy.yaml"
        q.write_text(copy)
        assert [n.name for n in inventory.load(q).nodes] == [n.name for n in inv.nodes]
