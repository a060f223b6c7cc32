"""One GPU has nothing to all-reduce with: the live step skips it, the judge says so.

The recipe: "nccl-tests (multi-GPU only; a single-card task skips it)". A 1-rank
all_reduce prints busbw 0 and an algbw that is a copy inside the device; neither
may be reported as if it measured a fabric.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator import inventory
from orchestrator.nccltests import BuildDoc
from orchestrator.steps.nccl import step as nccl_step
from orchestrator.steps.nccl.judge import Series, judge_series
from orchestrator.store import Run
from orchestrator.suite import Suite

FIX = Path(__file__).resolve().parents[1] / "fixtures"
ONE = [FIX / "recipe-h200x1" / "nccl-tests" / f"all-reduce-{r}.log" for r in (1, 2, 3)]
TWO = [FIX / "h200x2" / "nccl-tests" / f"all_reduce_8B-128M_g2_round{r}.log" for r in (1, 2, 3)]
SUITE = Suite()


@pytest.fixture
def run(tmp_path: Path) -> Run:
    return Run.create(tmp_path / "results", command="nccl", suite_hash=SUITE.hash,
                      suite=SUITE.model_dump(mode="json"), inventory_path=None)


def inv(tmp_path: Path, gpus: int | None) -> inventory.Inventory:
    expect = f"\n    expect: {{gpus_per_node: {gpus}}}" if gpus else ""
    p = tmp_path / "inv.yaml"
    p.write_text(f"version: 1\nproviders:\n  lab:\n    executor: local{expect}\n    nodes:\n"
                 f"      - {{name: n1, work_dir: {tmp_path / 'w'}}}\n")
    return inventory.load(p)


def test_a_one_gpu_series_is_not_applicable(run: Run, tmp_path: Path) -> None:
    node = inv(tmp_path, 1).nodes[0]
    fs, ms = judge_series(Series("single", [node], [(i, p, False) for i, p in enumerate(ONE, 1)]),
                          run, None, SUITE)
    assert [(f.code, f.severity) for f in fs] == [("NCCL_NOT_APPLICABLE", "INFO")]
    assert fs[0].details["local_copy_gbs"] == pytest.approx(1998.1, abs=0.05)
    assert fs[0].node == "n1" and len(fs[0].evidence) == 3
    assert {m.metric for m in ms} == {"algbw", "time"}
    assert all(m.tags["local_copy"] for m in ms)


def test_two_gpus_are_judged_as_before(run: Run, tmp_path: Path) -> None:
    node = inv(tmp_path, 2).nodes[0]
    fs, ms = judge_series(Series("single", [node], [(i, p, False) for i, p in enumerate(TWO, 1)]),
                          run, None, SUITE)
    assert "NCCL_NOT_APPLICABLE" not in {f.code for f in fs}
    assert "NCCL_BUSBW" in {f.code for f in fs}
    assert "busbw" in {m.metric for m in ms} and not any("local_copy" in m.tags for m in ms)


@pytest.mark.parametrize(("gpus", "expect", "skipped"), [
    (1, None, True), (None, 1, True), (2, 1, False), (None, None, False),
])
def test_the_live_step_skips_the_rounds_of_a_one_gpu_node(
        run: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpus: int | None,
        expect: int | None, skipped: bool) -> None:
    """The build reports the GPUs the node sees; without it, the order says how many."""
    built = BuildDoc(ok=True, gpus=gpus, built_commit="a0b82b2" * 5, binary="/x/all_reduce_perf")
    ran: list[str] = []
    monkeypatch.setattr(nccl_step, "_build_node", lambda ex, run, suite, archive: built)

    def single(ex: object, run: Run, suite: Suite, inv: object, b: BuildDoc,
               collective: str = "all_reduce", mode: str = "normal") -> list[object]:
        ran.append("single")
        return []

    monkeypatch.setattr(nccl_step, "_single", single)
    the_inv = inv(tmp_path, expect)
    nccl_step.run_nccl(the_inv, the_inv.nodes, run, SUITE, multi=False)
    fs = run.findings()
    assert ("NCCL_NOT_APPLICABLE" in {f.code for f in fs}) == skipped
    assert ran == ([] if skipped else ["single"])
    if skipped:
        na = next(f for f in fs if f.code == "NCCL_NOT_APPLICABLE")
        assert na.severity == "INFO" and na.message.startswith("[single] one GPU: nothing to "
                                                               "all-reduce with")
