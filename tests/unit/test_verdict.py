"""The decision table per provider: evidence, not claims."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from orchestrator.analysis import compare
from orchestrator.analysis import verdict as V
from orchestrator.records import finding
from tests.unit.comparestore import build_store


@pytest.fixture(scope="module")
def comparison(tmp_path_factory: pytest.TempPathFactory) -> compare.Comparison:
    root = tmp_path_factory.mktemp("verdict") / "results"
    build_store(root)
    return compare.build(root, ["h200", "beta"])


def _reasons(v: V.ProviderVerdict) -> dict[str, V.Reason]:
    return {r.check: r for r in v.reasons}


def test_h200_capture_is_go_with_evidence_files_that_exist(comparison) -> None:
    h200 = comparison.verdicts[0]
    assert h200.provider == "h200" and h200.verdict == "GO"
    assert [r.check for r in h200.reasons] == list(V.CHECKS)
    for r in h200.reasons:
        assert r.outcome == "ok" and r.evidence, r
        for e in r.evidence:
            assert (comparison.root / e).is_file(), e


def test_beta_is_no_go_for_its_known_faults(comparison) -> None:
    beta = comparison.verdicts[1]
    assert beta.verdict == "NO-GO"
    rs = _reasons(beta)
    assert rs["checkpoint restored"].outcome == "no-go"
    assert "TRAIN_RESTORE_MISMATCH" not in rs["checkpoint restored"].text  # the message, not code
    assert any("restore/beta-1/rank0.jsonl" in e for e in rs["checkpoint restored"].evidence)
    assert rs["NCCL stable over three rounds"].outcome == "no-go"  # lower busbw: below band
    assert "below the reference band" in rs["NCCL stable over three rounds"].text
    assert rs["card and memory as ordered"].outcome == "ok"


def _ms(rounds: int) -> pd.DataFrame:
    return pd.DataFrame([{"run_id": "r", "provider": "p", "nodes": "n1", "step": "nccl",
                          "scope": "single", "engine": "nccl-tests", "metric": "busbw",
                          "size": 1 << 30, "inplace": False, "round": r, "value": 100.0}
                         for r in range(1, rounds + 1)])


ENV = pd.DataFrame([{"run_id": "r", "provider": "p", "node": "n1", "key": "mig",
                     "value": "off", "evidence": "nodes/n1/preflight/raw/query_gpu.txt"}])


def _f(code: str, sev: str = "PASS", step: str = "preflight", ev: bool = True, **kw):  # type: ignore[no-untyped-def]
    return finding("r", step, provider="p", node="n1", code=code, severity=sev,  # type: ignore[arg-type]
                   message=f"{code} said so", evidence=["nodes/n1/x.txt"] if ev else [], **kw)


GOOD = [_f("GPU_MODEL"), _f("GPU_MEMORY"), _f("GPU_COUNT"), _f("INTERCONNECT"),
        _f("NCCL_BUSBW", "INFO", "nccl"), _f("TRAIN_REFERENCE", "INFO", "train"),
        _f("TRAIN_RESTORE_OK", "PASS", "train"), _f("CKPT_DIR")]


def test_all_evidence_is_go_and_each_missing_piece_is_not_enough() -> None:
    assert V.provider_verdict("p", GOOD, _ms(3), ENV).verdict == "GO"
    v = V.provider_verdict("p", GOOD, _ms(2), ENV)
    assert v.verdict == "NOT ENOUGH EVIDENCE"
    assert "fewer than 3 rounds" in _reasons(v)["NCCL stable over three rounds"].text
    v = V.provider_verdict("p", [f for f in GOOD if f.step != "train"], _ms(3), ENV)
    assert v.verdict == "NOT ENOUGH EVIDENCE"
    assert _reasons(v)["checkpoint restored"].outcome == "missing"
    v = V.provider_verdict("p", GOOD, _ms(3), ENV.iloc[0:0])
    assert _reasons(v)["MIG as ordered"].outcome == "missing"


def test_a_pass_without_evidence_is_a_claim_not_evidence() -> None:
    fs = [f for f in GOOD if f.code != "INTERCONNECT"] + [_f("INTERCONNECT", ev=False)]
    v = V.provider_verdict("p", fs, _ms(3), ENV)
    assert v.verdict == "NOT ENOUGH EVIDENCE"
    r = _reasons(v)["topology as ordered"]
    assert r.outcome == "missing" and "no evidence file" in r.text


@pytest.mark.parametrize(("bad", "check"), [
    (_f("GPU_MEMORY", "FAIL"), "card and memory as ordered"),
    (_f("MIG_ENABLED", "FAIL"), "MIG as ordered"),
    (_f("GPU_COUNT", "FAIL"), "GPU count as ordered"),
    (_f("INTERCONNECT", "FAIL"), "topology as ordered"),
    (_f("NCCL_SOCKET_FALLBACK", "FAIL", "nccl"),
     ("topology as ordered", "NCCL stable over three rounds")),
    (_f("NCCL_ROUND_DROP", "WARN", "nccl"), "NCCL stable over three rounds"),
    (_f("NCCL_TIMEOUT", "FAIL", "nccl"), "NCCL stable over three rounds"),
    (_f("NCCL_TEST_FAILURE", "FAIL", "nccl"), "NCCL stable over three rounds"),
    (_f("TRAIN_FAILED", "FAIL", "train"), "the real task ran"),
    (_f("TRAIN_RESTORE_FAILED", "FAIL", "train"), "checkpoint restored"),
    (_f("CKPT_NOT_PERSISTENT", "WARN", "train"), "storage persistent"),
    (_f("CKPT_DIR_EPHEMERAL", "WARN"), "storage persistent"),
])
def test_each_fault_is_no_go_on_its_line(bad, check) -> None:  # type: ignore[no-untyped-def]
    v = V.provider_verdict("p", GOOD + [bad], _ms(3), ENV)
    checks = [check] if isinstance(check, str) else list(check)
    assert v.verdict == "NO-GO"
    assert [r.check for r in v.reasons if r.outcome == "no-go"] == checks
    assert _reasons(v)[checks[0]].evidence == ("r/nodes/n1/x.txt",)


def test_a_training_probe_is_storage_evidence(tmp_path: Path) -> None:
    (tmp_path / "nodes" / "n1" / "train").mkdir(parents=True)
    (tmp_path / "nodes" / "n1" / "train" / "probe.json").write_text("{}")
    fs = [f for f in GOOD if f.code != "CKPT_DIR"]
    assert V.provider_verdict("p", fs, _ms(3), ENV).verdict == "NOT ENOUGH EVIDENCE"
    v = V.provider_verdict("p", fs, _ms(3), ENV, {"r": tmp_path})
    assert v.verdict == "GO"
    assert _reasons(v)["storage persistent"].evidence == ("r/nodes/n1/train/probe.json",)


def test_run_verdicts_worst_finding_per_run() -> None:
    df = pd.DataFrame({"run_id": ["a", "a", "b", "c"], "severity": ["PASS", "FAIL", "INFO",
                                                                    "WARN"]})
    # b judged nothing (INFO alone): not measured, never PASS with 0 checks
    assert V.run_verdicts(df) == {"a": "FAIL", "b": "NOT MEASURED", "c": "WARN"}


def test_too_few_rounds_names_each_series_scope_and_nodes() -> None:
    ms = pd.concat([_ms(2), _ms(1).assign(scope="multi", nodes="n1,n2")])
    text = _reasons(V.provider_verdict("p", GOOD, ms, ENV))["NCCL stable over three rounds"].text
    assert text == "fewer than 3 rounds: multi on n1,n2: 1 round(s), single on n1: 2 round(s)"


def test_provider_side_fail_is_the_outcome_rule() -> None:
    """What the good-GPU-hour cost, the history and the claim count: a FAIL not of the
    setup's codes, and a checkpoint directory that dies with the instance only where the
    node mounts nothing persistent."""
    assert V.provider_side_fail(_f("GPU_MODEL", "FAIL"))
    assert not V.provider_side_fail(_f("GPU_MODEL", "WARN"))
    assert not V.provider_side_fail(_f("TRAIN_OOM", "FAIL", step="train"))
    ckpt = _f("CKPT_NOT_PERSISTENT", "FAIL", step="train")
    assert V.provider_side_fail(ckpt)  # nothing known of the node's mounts
    mounts = {str(ckpt.node): [V.Persistent(str(ckpt.node), "/data", "ext4", "/dev/nvme1n1")]}
    assert not V.provider_side_fail(ckpt, mounts)  # ckpt_dir could have gone to /data
