"""Exact values for the statistics of `regress` (orchestrator/analysis/significance.py),
written for the mutants `make mutation` found surviving the seeded tests of
test_regress.py. Each pins one decision on numbers worked out by hand."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.analysis.significance import Settings, bh


def test_bh_adjusts_in_the_given_order() -> None:
    # sorted 0.01, 0.03, 0.04 (m = 3): 0.03, min(0.045, 0.04) = 0.04, 0.04
    assert bh([0.04, 0.01, 0.03]) == pytest.approx([0.04, 0.03, 0.04])
    assert bh([]) == []


@pytest.mark.parametrize("bad, match", [({"alpha": 0.0}, "alpha"), ({"alpha": 1.0}, "alpha"),
                                        ({"min_effect": -0.01}, "minimum effect"),
                                        ({"min_effect": 1.0}, "minimum effect"),
                                        ({"power": 1.0}, "power"), ({"power": 0.0}, "power"),
                                        ({"min_samples": 1}, "at least 2 samples")])
def test_settings_out_of_range_are_refused(bad: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Settings(**bad)
