"""The decision on real runs: two whole pipelines on one H100 host, provider `h100`
ordered an H100 and `h200` ordered an H200 and was given the same H100
(tests/fixtures/h100x1-two-orders, captured on the GPU host: see its README).

The comparison must say at the top that h200 delivered the wrong card, and that
h100's only open line is the tester's own checkpoint folder under /tmp, with the fix."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from orchestrator.analysis import compare as C
from orchestrator.analysis import verdict as V
from orchestrator.rebuild import rebuild_index
from tests.unit.clirun import gpuvet

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "h100x1-two-orders"
H100_RUN, H200_RUN = "20261206-034827-e3ef", "20261206-034503-cf89"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("two-orders")
    for run in (H100_RUN, H200_RUN):
        shutil.copytree(FIXTURE / run, root / run)
    rebuild_index(root)
    return root


@pytest.fixture(scope="module")
def comparison(store: Path) -> C.Comparison:
    return C.build(store, ["h100", "h200"])


def _reasons(c: C.Comparison, provider: str) -> dict[str, V.Reason]:
    v = next(v for v in c.verdicts if v.provider == provider)
    return {r.check: r for r in v.reasons}


def test_the_headline_says_h200_delivered_the_wrong_card(comparison: C.Comparison) -> None:
    first = comparison.headlines[0]
    assert (first.provider, first.verdict) == ("h200", "NO-GO")
    assert first.reasons == (
        "delivered NVIDIA H100 80GB HBM3, ordered H200 (GPU_MODEL, TORCH_ORDER), and it "
        "measures like H100 SXM (HEALTH_VARIANT)",)
    assert first.cost == ("PoC cost 0.21 USD over 0.06 h (instance up since boot; storage "
                          "and transfer not priced), 3.79 USD per GPU-hour, billed per second")
    # what to do about a provider-side FAIL: claim it, with its evidence
    card = _reasons(comparison, "h200")["card and memory as ordered"]
    assert (card.outcome, card.side) == ("no-go", "provider")
    assert card.fix.startswith("claim it: `gpuvet claim -p h200 -o DIR`")


def test_h100_is_not_no_go_on_the_testers_scratch_checkpoint(comparison: C.Comparison) -> None:
    h = comparison.headlines[1]
    assert (h.provider, h.verdict) == ("h100", "NOT ENOUGH EVIDENCE")
    assert h.reasons[0] == "nothing failed on the provider's side"
    storage = _reasons(comparison, "h100")["storage persistent"]
    assert (storage.outcome, storage.side) == ("not proven", "setup")
    assert storage.fix == ("point ckpt_dir of h100-n1 at a directory outside /tmp on / "
                           "(ext4, /dev/vda) and rerun `gpuvet train`")
    assert storage.codes == ("CKPT_NOT_PERSISTENT",)
    assert not [r for r in _reasons(comparison, "h100").values() if r.outcome == "no-go"]


def test_each_check_cites_its_own_evidence(comparison: C.Comparison) -> None:
    card = _reasons(comparison, "h100")["card and memory as ordered"]
    assert (card.outcome, card.codes) == ("ok", ("GPU_MODEL",))
    assert card.evidence and all(e.startswith(H100_RUN + "/") for e in card.evidence)
    # h200's count is GPU_COUNT's 1 of 1: the TORCH_ORDER finding is about the card
    count = _reasons(comparison, "h200")["GPU count as ordered"]
    assert (count.outcome, count.text, count.codes) == ("ok", "1 GPU(s) found, 1 ordered",
                                                        ("GPU_COUNT",))
    h200card = _reasons(comparison, "h200")["card and memory as ordered"]
    assert (h200card.outcome, h200card.side) == ("no-go", "provider")
    assert h200card.codes == ("GPU_MODEL", "TORCH_ORDER")
    # one GPU on one node: nothing to check between GPUs or nodes, not "missing"
    assert _reasons(comparison, "h100")["topology as ordered"].outcome == "not applicable"


def test_the_order_stands_beside_what_was_delivered(comparison: C.Comparison) -> None:
    env = next(t for t in comparison.tables if t.title == "environment")
    assert env.columns == ("what", "h100 ordered", "h100", "h200 ordered", "h200", "flag")
    rows = {r[0]: r[1:] for r in env.rows}
    assert rows["GPU model"] == ("H100", "NVIDIA H100 80GB HBM3", "H200",
                                 "NVIDIA H100 80GB HBM3", "NOT AS ORDERED (h200)")
    assert rows["GPUs per node"][-1] == "same"
    health = {r[0]: r[1:] for r in next(t for t in comparison.tables
                                         if t.title == "GPU health").rows}
    assert health["measures like"] == ("H100 SXM", "H100 SXM (ordered H200 SXM: NOT AS ORDERED)")
    assert health["FAIL and WARN findings"] == ("none", "WARN HEALTH_VARIANT")


def test_the_terminal_opens_with_the_headlines(store: Path, capsys: pytest.CaptureFixture[str]
                                               ) -> None:
    r = gpuvet(capsys, "compare", "--results", store, "-p", "h100", "-p", "h200")
    assert r.returncode == 1
    lines = r.stdout.splitlines()
    assert lines[0] == "h200: NO-GO"
    assert lines[1].startswith("  - delivered NVIDIA H100 80GB HBM3, ordered H200")
    assert lines[3] == "h100: NOT ENOUGH EVIDENCE"
    j = gpuvet(capsys, "compare", "--results", store, "-p", "h100", "-p", "h200", "--json")
    doc = json.loads(j.stdout)
    assert [h["verdict"] for h in doc["headlines"]] == ["NO-GO", "NOT ENOUGH EVIDENCE"]
    assert doc["orders"]["h200"]["gpu_model"] == "H200"


def test_runs_and_compare_agree_with_the_reason_shown(store: Path,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    r = gpuvet(capsys, "runs", "--results", store)
    line = next(x for x in r.stdout.splitlines() if x.startswith(H100_RUN))
    # WARN: the scratch checkpoint (the setup's) and nothing of the provider's FAILed
    assert line.split()[-1] == "WARN" and " passed " in f" {line} "
