"""The suite's identity (Suite.hash), which baselines and regress compare runs by."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.suite import Suite

FIXTURES = Path(__file__).parent.parent / "fixtures"


def test_a_section_added_later_leaves_the_hash_alone_at_its_defaults() -> None:
    """Runs stored before the health section existed keep their baseline: the default
    suite's hash is the one those runs stored (tests/fixtures/h200x1-train, the default
    suite with the one-GPU train parameters), and a changed health level changes it."""
    meta = next(json.loads(p.read_text()) for p in (FIXTURES / "h200x1-train").rglob("run.json"))
    stored = Suite.model_validate({k: v for k, v in meta["suite"].items() if k != "health"})
    assert stored.hash == meta["suite_hash"]
    assert Suite.model_validate({**meta["suite"], "health": {"level": "quick"}}).hash \
        != meta["suite_hash"]
