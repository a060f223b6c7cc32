"""The training step's judge (orchestrator/steps/train/*.py) on exact inputs, written for
the mutants `make mutation` found surviving test_train_judge.py."""

from __future__ import annotations

from orchestrator.steps.train.throughput import p90


def test_p90_of_ten_is_the_ninth() -> None:
    assert p90([float(v) for v in range(10, 0, -1)]) == 9.0
    assert p90([3.0]) == 3.0
