"""The progress display: nodes until a step queues units, then units; notes say what a
long unit is doing."""

from __future__ import annotations

import pytest

from orchestrator.cli._common import ProgressCount, progress


def test_the_bar_counts_nodes_then_the_units_steps_queue() -> None:
    seen: list[tuple[int, int, str | None]] = []
    hook = ProgressCount(2, lambda c, last: seen.append((c.done, c.total, last)))
    hook("a", "start")
    hook("a", "done")
    assert (hook.done, hook.total) == (1, 2)  # a fleet command: one of two nodes
    # a step queues its units: the count starts over, in units
    hook("node:a", "queued")
    hook("node:b", "queued")
    assert (hook.done, hook.total) == (0, 2)
    hook("node:a", "reference on a")  # a note: shown, not counted
    assert (hook.done, hook.total) == (0, 2) and seen[-1][2] == "node:a reference on a"
    hook("node:a", "done")
    hook("node:b", "failed")
    # the multi-node unit comes after the single-node ones: the total grows
    hook("provider:p/multi", "queued")
    assert (hook.done, hook.total) == (2, 3)
    hook("provider:p/multi", "done")
    assert (hook.done, hook.total) == (3, 3)
    assert [s[2] for s in seen if s[2]] == ["a done", "node:a reference on a", "node:a done",
                                            "node:b failed", "provider:p/multi done"]


def test_plain_lines_when_stderr_is_not_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    with progress("train", 2) as hook:
        hook("node:a", "queued")
        hook("node:a", "start")
        hook("node:a", "kill on a")
        hook("node:a", "done")
    lines = [line for line in capsys.readouterr().err.splitlines() if line]
    # as written: "node:a: done" once came out as "node🅰 done" (rich's emoji codes)
    assert lines == ["train: 2 node(s)", "  node:a: kill on a", "  node:a: done"]
