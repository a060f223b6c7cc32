"""The decision table pinned on exact values: every reason's outcome, text and
evidence, the selection of findings, measurements and MIG rows per provider,
and the tables `compare` prints (the survivors of `make mutation` on
orchestrator/analysis/verdict.py)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from orchestrator.analysis import answer as A
from orchestrator.analysis import verdict as V
from orchestrator.records import Finding, finding

EMPTY = pd.DataFrame()


def _f(code: str, sev: str = "PASS", step: str = "preflight", *, node: str | None = "n1",
       run: str = "r", provider: str = "p", ev: Sequence[str] = ("nodes/n1/x.txt",),
       msg: str | None = None) -> Finding:
    return finding(run, step, provider=provider, node=node, code=code,
                   severity=sev,  # type: ignore[arg-type]
                   message=msg or f"{code} said so", evidence=list(ev))


def _m(*, run: str = "r", provider: str = "p", nodes: str = "n1", step: str = "nccl",
       scope: str = "single", engine: str = "nccl-tests", metric: str = "busbw",
       rnd: int = 1) -> dict[str, Any]:
    return {"run_id": run, "provider": provider, "nodes": nodes, "step": step, "scope": scope,
            "engine": engine, "metric": metric, "size": 1 << 30, "inplace": False,
            "round": rnd, "value": 100.0}


def _ms(*rows: dict[str, Any]) -> pd.DataFrame:
    return pd.DataFrame(list(rows))


def _three(**kw: Any) -> list[dict[str, Any]]:
    return [_m(rnd=r, **kw) for r in (1, 2, 3)]


def _env(*rows: tuple[str, str, str, str, str]) -> pd.DataFrame:
    return pd.DataFrame([{"run_id": r, "provider": p, "node": n, "key": k, "value": v,
                          "evidence": f"nodes/{n}/preflight/raw/query_gpu.txt"}
                         for r, p, n, k, v in rows])


ENV = _env(("r", "p", "n1", "mig", "off"))
GOOD = [_f("GPU_MODEL"), _f("GPU_MEMORY"), _f("GPU_COUNT"), _f("INTERCONNECT"),
        _f("NCCL_BUSBW", "INFO", "nccl"), _f("TRAIN_REFERENCE", "INFO", "train"),
        _f("TRAIN_RESTORE_OK", "PASS", "train"), _f("CKPT_DIR")]
EV = ("r/nodes/n1/x.txt",)


def _table(v: V.ProviderVerdict) -> list[tuple[str, str, str, tuple[str, ...]]]:
    return [(r.check, r.outcome, r.text, r.evidence) for r in v.reasons]


def _one(v: V.ProviderVerdict, check: str) -> tuple[str, str, tuple[str, ...]]:
    r = {r.check: r for r in v.reasons}[check]
    return (r.outcome, r.text, r.evidence)


def test_nothing_at_all_is_every_line_missing_with_its_own_words() -> None:
    v = V.provider_verdict("p", [], EMPTY, EMPTY)
    assert v.provider == "p" and v.verdict == "NOT ENOUGH EVIDENCE"
    assert _table(v) == [
        ("card and memory as ordered", "missing", "no preflight checked the card and memory "
         "against an order (no GPU_MODEL or GPU_MEMORY finding)", ()),
        ("MIG as ordered", "missing",
         "no node reported its MIG mode (nvidia-smi --query-gpu was not read)", ()),
        ("GPU count as ordered", "missing",
         "no preflight checked the GPU count against an order (no GPU_COUNT finding)", ()),
        ("topology as ordered", "missing", "no topology was checked against an order "
         "(set expect.interconnect) (no INTERCONNECT finding)", ()),
        ("NCCL stable over three rounds", "missing", "no nccl-tests busbw measured", ()),
        ("the real task ran", "missing", "no training run of this provider", ()),
        ("checkpoint restored", "missing", "no checkpoint was saved, killed and restored", ()),
        ("storage persistent", "missing", "the checkpoint directory was never probed (no "
         "ckpt_dir in the inventory, or no training run)", ()),
    ]


def test_all_evidence_is_go_with_every_text_and_file() -> None:
    v = V.provider_verdict("p", GOOD, _ms(*_three()), ENV)
    assert v.verdict == "GO"
    assert _table(v) == [
        ("card and memory as ordered", "ok", "GPU_MODEL said so; GPU_MEMORY said so", EV),
        ("MIG as ordered", "ok", "n1: MIG off", ("r/nodes/n1/preflight/raw/query_gpu.txt",)),
        ("GPU count as ordered", "ok", "GPU_COUNT said so", EV),
        ("topology as ordered", "ok", "INTERCONNECT said so", EV),
        ("NCCL stable over three rounds", "ok", "n1: NCCL_BUSBW said so", EV),
        ("the real task ran", "ok", "TRAIN_REFERENCE said so", EV),
        ("checkpoint restored", "ok", "TRAIN_RESTORE_OK said so", EV),
        ("storage persistent", "ok", "CKPT_DIR said so", EV),
    ]


def test_one_missing_line_and_one_no_go_line_decide_the_verdict() -> None:
    no_restore = [f for f in GOOD if f.code != "TRAIN_RESTORE_OK"]
    assert V.provider_verdict("p", no_restore, _ms(*_three()), ENV).verdict \
        == "NOT ENOUGH EVIDENCE"
    both = no_restore + [_f("GPU_COUNT", "FAIL")]
    assert V.provider_verdict("p", both, _ms(*_three()), ENV).verdict == "NO-GO"


def test_only_the_providers_own_findings_rows_and_mig_modes_count() -> None:
    other = [_f(f.code, f.severity, f.step, provider="q") for f in GOOD]
    other += [_f("GPU_COUNT", "FAIL", provider="q"), _f("MIG_ENABLED", "FAIL", provider="q")]
    ms = _ms(*_three(), *_three(provider="q", nodes="m1"), _m(provider="q", nodes="m2"))
    env = _env(("r", "p", "n1", "mig", "off"), ("r", "q", "m1", "mig", "on"),
               ("r", "p", "n1", "ecc", "on"))
    v = V.provider_verdict("p", GOOD + other, ms, env)
    assert v.verdict == "GO"
    assert _one(v, "MIG as ordered") == ("ok", "n1: MIG off",
                                         ("r/nodes/n1/preflight/raw/query_gpu.txt",))
    q = V.provider_verdict("q", GOOD + other, ms, env)
    assert q.provider == "q" and q.verdict == "NO-GO"
    assert _one(q, "MIG as ordered") == ("no-go", "n1: MIG_ENABLED said so", EV)
    assert _one(q, "GPU count as ordered") == ("no-go", "n1: GPU_COUNT said so", EV)
    # q's m2 has one round: its rows are q's, not p's
    assert _one(q, "NCCL stable over three rounds") == (
        "missing", "fewer than 3 rounds: single on m2: 1 round(s)", ())


def test_mig_lists_every_node_with_its_own_evidence() -> None:
    env = _env(("r", "p", "n1", "mig", "off"), ("s", "p", "n2", "mig", "on"),
               ("r", "p", "n1", "ecc", "on"))
    v = V.provider_verdict("p", GOOD, _ms(*_three()), env)
    assert _one(v, "MIG as ordered") == (
        "ok", "n1: MIG off, n2: MIG on",
        ("r/nodes/n1/preflight/raw/query_gpu.txt", "s/nodes/n2/preflight/raw/query_gpu.txt"))
    v = V.provider_verdict("p", GOOD, _ms(*_three()), _env(("r", "p", "n1", "ecc", "on")))
    assert _one(v, "MIG as ordered")[0] == "missing"
    two = [_f("MIG_ENABLED", "FAIL"), _f("MIG_ENABLED", "FAIL", node="n2", ev=("n2.txt",))]
    v = V.provider_verdict("p", GOOD + two, _ms(*_three()), env)
    assert _one(v, "MIG as ordered") == (
        "no-go", "n1: MIG_ENABLED said so; n2: MIG_ENABLED said so", (*EV, "r/n2.txt"))
    v = V.provider_verdict("p", GOOD + [_f("MIG_ENABLED", "WARN")], _ms(*_three()), ENV)
    assert _one(v, "MIG as ordered")[0] == "ok"  # only a FAIL of MIG_ENABLED is no-go


def test_bad_findings_are_joined_and_their_evidence_kept_once_in_order() -> None:
    bad = [_f("GPU_MEMORY", "FAIL", ev=("nodes/n1/b.txt", "nodes/n1/a.txt")),
           _f("GPU_MODEL", "FAIL", node="n2", run="s", ev=("nodes/n2/a.txt",)),
           _f("TORCH_ORDER", "FAIL", ev=("nodes/n1/a.txt",))]
    v = V.provider_verdict("p", GOOD + bad, _ms(*_three()), ENV)
    assert _one(v, "card and memory as ordered") == (
        "no-go", "n1: GPU_MEMORY said so; n2: GPU_MODEL said so; n1: TORCH_ORDER said so",
        ("r/nodes/n1/b.txt", "r/nodes/n1/a.txt", "s/nodes/n2/a.txt"))


@pytest.mark.parametrize("code", ["GPU_MODEL", "GPU_MEMORY", "GPU_DETAILS_MISSING",
                                  "NVIDIA_DRIVER_MISSING", "TORCH_ORDER"])
def test_each_card_fault_is_no_go_but_only_as_a_fail(code: str) -> None:
    v = V.provider_verdict("p", GOOD + [_f(code, "FAIL")], _ms(*_three()), ENV)
    assert _one(v, "card and memory as ordered") == ("no-go", f"n1: {code} said so", EV)
    v = V.provider_verdict("p", GOOD + [_f(code, "WARN")], _ms(*_three()), ENV)
    assert _one(v, "card and memory as ordered")[0] == "ok"


@pytest.mark.parametrize("code", ["GPU_COUNT", "TORCH_GPU_COUNT", "TORCH_ORDER"])
def test_each_count_fault_is_no_go(code: str) -> None:
    v = V.provider_verdict("p", GOOD + [_f(code, "FAIL")], _ms(*_three()), ENV)
    assert _one(v, "GPU count as ordered") == ("no-go", f"n1: {code} said so", EV)


@pytest.mark.parametrize("code", ["INTERCONNECT", "FORM_FACTOR", "IB_MISSING", "IB_PORT_DOWN",
                                  "IB_PORT_COUNT", "IB_RATE_LOW", "NCCL_SOCKET_FALLBACK",
                                  "FABRIC_STATE", "RDMA_PKEY_MISMATCH", "RDMA_ROCE_NO_V2",
                                  "RDMA_PORT_STATE", "RDMA_PORT_GONE"])
def test_each_topology_fault_is_no_go(code: str) -> None:
    v = V.provider_verdict("p", GOOD + [_f(code, "FAIL", "links")], _ms(*_three()), ENV)
    assert _one(v, "topology as ordered") == ("no-go", f"n1: {code} said so", EV)


def test_card_and_count_read_preflight_only_and_topology_every_step() -> None:
    other_step = [_f("GPU_MODEL", "FAIL", "nccl"), _f("GPU_COUNT", "FAIL", "train")]
    v = V.provider_verdict("p", GOOD + other_step, _ms(*_three()), ENV)
    assert _one(v, "card and memory as ordered")[0] == "ok"
    assert _one(v, "GPU count as ordered")[0] == "ok"
    fs = [f for f in GOOD if f.code != "INTERCONNECT"] + [_f("INTERCONNECT", step="train")]
    assert _one(V.provider_verdict("p", fs, _ms(*_three()), ENV), "topology as ordered")[0] \
        == "ok"
    fs = [f for f in GOOD if f.code != "GPU_COUNT"] + [_f("GPU_COUNT", step="train")]
    # preflight ran but checked no count: the order did not say one (the setup's side)
    r = {r.check: r for r in V.provider_verdict("p", fs, _ms(*_three()), ENV).reasons}[
        "GPU count as ordered"]
    assert (r.outcome, r.text, r.evidence, r.side) == (
        "not proven", "no preflight checked the GPU count against an order (no GPU_COUNT "
        "finding)", (), "setup")
    assert r.fix == "set expect.gpus_per_node in the inventory and rerun `gpuvet preflight`"


def test_an_ok_code_that_did_not_pass_is_missing_not_ok() -> None:
    fs = [f for f in GOOD if f.code not in ("GPU_MODEL", "GPU_MEMORY")] + [_f("GPU_MODEL", "INFO")]
    v = V.provider_verdict("p", fs, _ms(*_three()), ENV)
    assert _one(v, "card and memory as ordered") == (
        "missing", "no preflight checked the card and memory against an order "
        "(no GPU_MODEL or GPU_MEMORY finding)", ())


def test_the_card_is_proven_by_either_of_its_findings() -> None:
    """GPU_MODEL alone (no memory ordered) or GPU_MEMORY alone is the card's evidence: the
    line is missing only when neither ran."""
    for code in ("GPU_MODEL", "GPU_MEMORY"):
        fs = [f for f in GOOD if f.code not in ("GPU_MODEL", "GPU_MEMORY")] + [_f(code)]
        assert _one(V.provider_verdict("p", fs, _ms(*_three()), ENV),
                    "card and memory as ordered") == ("ok", f"{code} said so", EV)


def test_the_count_cites_only_what_pytorch_saw_wrong_about_the_count() -> None:
    """TORCH_ORDER names each thing PyTorch saw wrong: a wrong card is the card's line,
    never the count's, and a wrong count is the count's."""
    def torch(*wrong: str) -> Finding:
        return finding("r", "preflight", provider="p", node="n1", code="TORCH_ORDER",
                       severity="FAIL", message="torch said so", evidence=["t.txt"],
                       count=1, wrong=list(wrong))
    card = torch("GPU0 is NVIDIA H100 80GB HBM3, H200 ordered")
    v = V.provider_verdict("p", GOOD + [card], _ms(*_three()), ENV)
    assert _one(v, "GPU count as ordered")[0] == "ok"
    assert _one(v, "card and memory as ordered") == ("no-go", "n1: torch said so", ("r/t.txt",))
    count = torch("1 GPU(s), 8 ordered")
    v = V.provider_verdict("p", GOOD + [count], _ms(*_three()), ENV)
    assert _one(v, "GPU count as ordered")[0] == "no-go"
    assert _one(v, "card and memory as ordered")[0] == "ok"
    cuda = torch("CUDA is not available to PyTorch")
    assert _one(V.provider_verdict("p", GOOD + [cuda], _ms(*_three()), ENV),
                "GPU count as ordered")[0] == "no-go"


def test_every_pass_without_a_file_is_named() -> None:
    fs = [f for f in GOOD if f.code not in ("GPU_MODEL", "GPU_MEMORY")]
    fs += [_f("GPU_MODEL", ev=()), _f("GPU_MEMORY", node="n2", ev=())]
    v = V.provider_verdict("p", fs, _ms(*_three()), ENV)
    assert v.verdict == "NOT ENOUGH EVIDENCE"
    assert _one(v, "card and memory as ordered") == (
        "missing", "GPU_MODEL on n1 has no evidence file: a claim, not a measurement; "
        "GPU_MEMORY on n2 has no evidence file: a claim, not a measurement", ())
    # one bare PASS beside one with a file is still a claim
    fs = [f for f in GOOD if f.code != "GPU_MODEL"] + [_f("GPU_MODEL"), _f("GPU_MODEL", ev=())]
    assert _one(V.provider_verdict("p", fs, _ms(*_three()), ENV),
                "card and memory as ordered")[0] == "missing"


def test_the_same_message_twice_is_said_once() -> None:
    fs = GOOD + [_f("GPU_COUNT", node="n2", ev=("nodes/n2/x.txt",))]
    v = V.provider_verdict("p", fs, _ms(*_three()), ENV)
    assert _one(v, "GPU count as ordered") == ("ok", "GPU_COUNT said so",
                                               ("r/nodes/n1/x.txt", "r/nodes/n2/x.txt"))


def test_nccl_no_go_on_any_warn_or_fail_of_the_nccl_step_with_codes() -> None:
    fs = GOOD + [_f("NCCL_ROUND_DROP", "WARN", "nccl"),
                 _f("NCCL_WRONG", "FAIL", "nccl", node=None, ev=("nccl/a.log",)),
                 _f("NCCL_INFO", "INFO", "nccl"), _f("GPU_MODEL", "WARN", "preflight")]
    v = V.provider_verdict("p", fs, _ms(*_three()), ENV)
    assert _one(v, "NCCL stable over three rounds") == (
        "no-go", "n1: NCCL_ROUND_DROP: NCCL_ROUND_DROP said so; provider p (all nodes): "
        "NCCL_WRONG: NCCL_WRONG said so", ("r/nodes/n1/x.txt", "r/nccl/a.log"))


def test_nccl_counts_only_nccl_tests_busbw_rows_of_the_nccl_step() -> None:
    fs = GOOD
    for rows in (_three(step="train"), _three(metric="algbw"), _three(engine="torch"),
                 _three(provider="q")):
        v = V.provider_verdict("p", fs, _ms(*rows), ENV)
        assert _one(v, "NCCL stable over three rounds") == (
            "missing", "no nccl-tests busbw measured", ())
    # busbw rows beside rows of other metrics: the other rows are not counted as rounds
    rows = [_m(rnd=1), _m(rnd=2), _m(rnd=3, metric="algbw"), _m(rnd=4, engine="torch"),
            _m(rnd=5, step="train"), _m(rnd=6, provider="q")]
    v = V.provider_verdict("p", fs, _ms(*rows), ENV)
    assert _one(v, "NCCL stable over three rounds") == (
        "missing", "fewer than 3 rounds: single on n1: 2 round(s)", ())


def test_rounds_are_counted_per_run_scope_and_nodes() -> None:
    rows = [*_three(), *_three(scope="multi", nodes="n1,n2"), _m(run="s", rnd=1),
            _m(run="s", rnd=2), _m(scope="multi", nodes="n3", rnd=1),
            _m(scope="multi", nodes="n3", rnd=1)]
    v = V.provider_verdict("p", GOOD, _ms(*rows), ENV)
    assert _one(v, "NCCL stable over three rounds") == (
        "missing", "fewer than 3 rounds: multi on n3: 1 round(s), single on n1: 2 round(s)", ())
    four = [_m(rnd=r) for r in (1, 2, 3, 4)]
    assert _one(V.provider_verdict("p", GOOD, _ms(*four), ENV),
                "NCCL stable over three rounds")[0] == "ok"


def test_rounds_without_a_busbw_finding_with_logs_are_missing() -> None:
    fs = [f for f in GOOD if f.code != "NCCL_BUSBW"]
    want = ("missing", "no NCCL_BUSBW finding with its logs", ())
    assert _one(V.provider_verdict("p", fs, _ms(*_three()), ENV),
                "NCCL stable over three rounds") == want
    fs2 = fs + [_f("NCCL_BUSBW", "INFO", "nccl", ev=())]
    assert _one(V.provider_verdict("p", fs2, _ms(*_three()), ENV),
                "NCCL stable over three rounds") == want
    fs3 = fs + [_f("NCCL_BUSBW", "INFO", "preflight")]
    assert _one(V.provider_verdict("p", fs3, _ms(*_three()), ENV),
                "NCCL stable over three rounds") == want


def test_one_gpu_is_not_applicable_only_with_its_evidence() -> None:
    fs = [f for f in GOOD if f.code != "NCCL_BUSBW"]
    na = _f("NCCL_NOT_APPLICABLE", "INFO", "nccl", msg="one GPU: nothing to all-reduce")
    v = V.provider_verdict("p", fs + [na], EMPTY, ENV)
    assert v.verdict == "GO"
    assert _one(v, "NCCL stable over three rounds") == (
        "not applicable", "n1: one GPU: nothing to all-reduce", EV)
    v = V.provider_verdict("p", fs + [_f("NCCL_NOT_APPLICABLE", "INFO", "nccl", ev=())],
                           EMPTY, ENV)
    assert _one(v, "NCCL stable over three rounds") == (
        "missing", "no nccl-tests busbw measured", ())
    two = [na, _f("NCCL_NOT_APPLICABLE", "INFO", "nccl", node="n2", msg="one GPU here too",
                  ev=("n2.txt",))]
    v = V.provider_verdict("p", fs + two, EMPTY, ENV)
    assert _one(v, "NCCL stable over three rounds") == (
        "not applicable", "n1: one GPU: nothing to all-reduce; n2: one GPU here too",
        (*EV, "r/n2.txt"))
    # measured rows win over a not-applicable finding
    v = V.provider_verdict("p", fs + [na], _ms(*_three()), ENV)
    assert _one(v, "NCCL stable over three rounds")[0] == "missing"


@pytest.mark.parametrize("code", V.TRAIN_BROKE)
def test_each_broken_training_is_no_go(code: str) -> None:
    v = V.provider_verdict("p", GOOD + [_f(code, "FAIL", "train")], _ms(*_three()), ENV)
    if code in V.SETUP_CODES:  # the user's own command, a preset too large: the setup's side
        r = {r.check: r for r in v.reasons}["the real task ran"]
        assert (r.outcome, r.text, r.evidence, r.side, r.fix) == (
            "not proven", f"n1: {code} said so", EV, "setup", V.SETUP_CODES[code])
        assert v.verdict == "NOT ENOUGH EVIDENCE"
    else:
        assert _one(v, "the real task ran") == ("no-go", f"n1: {code} said so", EV)
        assert v.verdict == "NO-GO"
    v = V.provider_verdict("p", GOOD + [_f(code, "WARN", "train")], _ms(*_three()), ENV)
    assert _one(v, "the real task ran")[0] == "ok"


def test_the_task_ran_on_a_reference_or_a_command_with_its_files() -> None:
    fs = [f for f in GOOD if f.code != "TRAIN_REFERENCE"]
    v = V.provider_verdict("p", fs + [_f("TRAIN_COMMAND_OK", "INFO", "train"),
                                      _f("TRAIN_REFERENCE", "INFO", "train", node="n2",
                                         ev=("nodes/n2/t.jsonl",))], _ms(*_three()), ENV)
    assert _one(v, "the real task ran") == (
        "ok", "TRAIN_COMMAND_OK said so; TRAIN_REFERENCE said so",
        ("r/nodes/n1/x.txt", "r/nodes/n2/t.jsonl"))
    v = V.provider_verdict("p", fs + [_f("TRAIN_COMMAND_OK", "INFO", "train", ev=())],
                           _ms(*_three()), ENV)
    assert _one(v, "the real task ran") == ("missing", "no training run of this provider", ())


def test_a_restore_the_setup_broke_is_not_proven_with_its_fix() -> None:
    """The checkpoint folder the inventory chose filled during the save: not the
    provider's no-go, the setup's, with what to do."""
    assert "TRAIN_CKPT_NO_SPACE" in V.RESTORE_BROKE
    v = V.provider_verdict("p", GOOD + [_f("TRAIN_CKPT_NO_SPACE", "FAIL", "train")],
                           _ms(*_three()), ENV)
    (r,) = [r for r in v.reasons if r.check == "checkpoint restored"]
    assert (r.outcome, r.side) == ("not proven", "setup")
    assert r.fix is not None and "room for two checkpoints" in r.fix


@pytest.mark.parametrize("code", [c for c in V.RESTORE_BROKE if c not in V.SETUP_CODES])
def test_each_broken_restore_is_no_go(code: str) -> None:
    v = V.provider_verdict("p", GOOD + [_f(code, "FAIL", "train")], _ms(*_three()), ENV)
    assert _one(v, "checkpoint restored") == ("no-go", f"n1: {code} said so", EV)
    v = V.provider_verdict("p", GOOD + [_f(code, "WARN", "train")], _ms(*_three()), ENV)
    assert _one(v, "checkpoint restored")[0] == "ok"


def test_a_restore_without_its_files_is_missing() -> None:
    fs = [f for f in GOOD if f.code != "TRAIN_RESTORE_OK"]
    v = V.provider_verdict("p", fs + [_f("TRAIN_RESTORE_OK", "PASS", "train", ev=())],
                           _ms(*_three()), ENV)
    assert _one(v, "checkpoint restored") == (
        "missing", "no checkpoint was saved, killed and restored", ())
    two = fs + [_f("TRAIN_RESTORE_OK", "PASS", "train", msg="a"),
                _f("TRAIN_RESTORE_OK", "PASS", "train", node="n2", msg="b",
                   ev=("nodes/n2/r.jsonl",))]
    assert _one(V.provider_verdict("p", two, _ms(*_three()), ENV), "checkpoint restored") == (
        "ok", "a; b", ("r/nodes/n1/x.txt", "r/nodes/n2/r.jsonl"))


@pytest.mark.parametrize("sev", ["WARN", "FAIL"])
@pytest.mark.parametrize("code", V.NOT_PERSISTENT)
def test_ephemeral_storage_is_no_go_as_a_warn_or_a_fail(code: str, sev: str) -> None:
    v = V.provider_verdict("p", GOOD + [_f(code, sev)], _ms(*_three()), ENV)
    assert _one(v, "storage persistent") == ("no-go", f"n1: {code} said so", EV)


def test_storage_is_ok_on_a_passed_dir_or_share_with_files_and_probes(tmp_path: Path) -> None:
    base = [f for f in GOOD if f.code != "CKPT_DIR"]
    v = V.provider_verdict("p", base + [_f("CKPT_SHARED", msg="shared")], _ms(*_three()), ENV)
    assert _one(v, "storage persistent") == ("ok", "shared", EV)
    for bad in (_f("CKPT_DIR", "WARN"), _f("CKPT_DIR", ev=()), _f("CKPT_SHARED", "INFO")):
        v = V.provider_verdict("p", base + [bad], _ms(*_three()), ENV)
        assert _one(v, "storage persistent")[0] == "missing"
    for n in ("n2", "n1"):
        (tmp_path / "nodes" / n / "train").mkdir(parents=True)
        (tmp_path / "nodes" / n / "train" / "probe.json").write_text("{}")
    v = V.provider_verdict("p", GOOD, _ms(*_three()), ENV, {"r": tmp_path})
    assert _one(v, "storage persistent") == (
        "ok", "CKPT_DIR said so; training probe of the checkpoint directory found nothing "
        "ephemeral (r/nodes/n1/train/probe.json); training probe of the checkpoint directory "
        "found nothing ephemeral (r/nodes/n2/train/probe.json)",
        ("r/nodes/n1/x.txt", "r/nodes/n1/train/probe.json", "r/nodes/n2/train/probe.json"))


def test_probes_are_read_for_the_training_runs_known_by_path_only(tmp_path: Path) -> None:
    for run in ("r", "s", "t"):
        (tmp_path / run / "nodes" / "n1" / "train").mkdir(parents=True)
        (tmp_path / run / "nodes" / "n1" / "train" / "probe.json").write_text("{}")
    fs = [_f("X", step="train", run="s"), _f("X", step="preflight", run="t"),
          _f("X", step="train", run="u"), _f("X", step="train", run="r"),
          _f("X", step="train", run="s")]
    paths = {k: tmp_path / k for k in ("r", "s", "t")}
    assert V.train_probes(fs, paths) == ["s/nodes/n1/train/probe.json",
                                         "r/nodes/n1/train/probe.json"]
    assert V.train_probes(fs, {}) == []


def test_the_tables_compare_prints() -> None:
    vs = [V.provider_verdict("p", GOOD, _ms(*_three()), ENV),
          V.provider_verdict("q", [_f("GPU_COUNT", "FAIL", provider="q")], EMPTY, EMPTY)]
    t = A.verdicts_table(vs)
    assert t.title == "verdict per provider"
    assert t.columns == ("provider", "verdict", "why", "no-go", "not proven", "missing", "ok")
    assert t.rows[0][:2] == ("p", "GO") and t.rows[0][3:] == (0, 0, 0, 8)
    assert t.rows[1][:2] == ("q", "NO-GO") and t.rows[1][3:] == (1, 2, 5, 0)
    assert t.rows[1][2] == "GPU count as ordered: n1: GPU_COUNT said so (GPU_COUNT)"
    r = A.reasons_table(vs)
    assert r.title == "verdict reasons"
    assert r.columns == ("provider", "check", "outcome", "side", "reason", "fix", "evidence")
    # only the lines that are not ok, no-go first, evidence relative to its run
    assert r.rows[0] == ("q", "GPU count as ordered", "no-go", "provider",
                         "n1: GPU_COUNT said so", "claim it: `gpuvet claim -p q -o DIR` (the "
                         "FAILs, their evidence and sha256, the billed hours)", "nodes/n1/x.txt")
    assert [row[2] for row in r.rows] == ["no-go"] + ["not proven"] * 2 + ["missing"] * 5
    assert all(row[0] == "q" for row in r.rows)
    folded = A.folded_table(vs)
    assert folded.rows == [("p", ", ".join(V.CHECKS), "-")]
    many = A.reasons_table([V.ProviderVerdict("p", "NO-GO", [
        V.Reason("c", "no-go", "t", ("r/a", "r/b", "r/c", "r/d")), V.Reason("d", "ok", "t")])])
    assert many.rows == [("p", "c", "no-go", "provider", "t", "", "a, b, c (+1 more)")]


def test_run_verdicts_is_each_runs_worst_finding() -> None:
    assert V.run_verdicts(pd.DataFrame()) == {}
    df = pd.DataFrame([{"run_id": r, "severity": s, "code": "X"} for r, s in [
        ("a", "PASS"), ("a", "FAIL"), ("a", "WARN"), ("b", "WARN"), ("b", "INFO"),
        ("c", "INFO"), ("c", "PASS"), ("d", "FAIL"), ("e", "INFO")]])
    # e judged nothing: its findings are all INFO (a health step on a node without a GPU)
    assert V.run_verdicts(df) == {"a": "FAIL", "b": "WARN", "c": "PASS", "d": "FAIL",
                                  "e": "NOT MEASURED"}
    df = pd.DataFrame([{"run_id": "a", "severity": s, "code": "X"} for s in ("WARN", "FAIL",
                                                                             "WARN")])
    assert V.run_verdicts(df) == {"a": "FAIL"}
    # a PASS or INFO before the WARN ranks below it, whatever the order
    df = pd.DataFrame([{"run_id": "a", "severity": s, "code": "X"} for s in ("PASS", "INFO",
                                                                             "WARN")])
    assert V.run_verdicts(df) == {"a": "WARN"}
    # a run whose worst findings are all the setup's says so
    df = pd.DataFrame([{"run_id": "a", "severity": s, "code": c} for s, c in (
        ("PASS", "GPU_MODEL"), ("WARN", "CKPT_DIR_UNUSABLE"))])
    assert V.run_verdicts(df) == {"a": "WARN (setup)"}
    df.loc[len(df)] = {"run_id": "a", "severity": "WARN", "code": "GPU_BUSY"}
    assert V.run_verdicts(df) == {"a": "WARN"}


def test_every_line_joins_two_findings_with_a_semicolon() -> None:
    def two(code: str, sev: str, step: str) -> list[Finding]:
        return [_f(code, sev, step, msg="one"),
                _f(code, sev, step, node="n2", msg="two", ev=("n2.txt",))]

    both = (*EV, "r/n2.txt")
    base = [f for f in GOOD if f.code not in ("NCCL_BUSBW", "TRAIN_REFERENCE",
                                              "TRAIN_RESTORE_OK", "CKPT_DIR")]
    ok = base + two("NCCL_BUSBW", "INFO", "nccl") + two("TRAIN_REFERENCE", "INFO", "train") \
        + two("TRAIN_RESTORE_OK", "PASS", "train") + two("CKPT_DIR", "PASS", "preflight")
    v = V.provider_verdict("p", ok, _ms(*_three()), ENV)
    assert v.verdict == "GO"
    assert _one(v, "NCCL stable over three rounds") == ("ok", "n1: one; n2: two", both)
    assert _one(v, "the real task ran") == ("ok", "one; two", both)
    assert _one(v, "checkpoint restored") == ("ok", "one; two", both)
    assert _one(v, "storage persistent") == ("ok", "one; two", both)
    bad = GOOD + two("TRAIN_FAILED", "FAIL", "train") \
        + two("TRAIN_RESTORE_FAILED", "FAIL", "train") \
        + two("CKPT_DIR_EPHEMERAL", "WARN", "preflight")
    v = V.provider_verdict("p", bad, _ms(*_three()), ENV)
    for check in ("the real task ran", "checkpoint restored", "storage persistent"):
        assert _one(v, check) == ("no-go", "n1: one; n2: two", both), check
