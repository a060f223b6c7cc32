"""Go / no-go / not enough evidence, per provider, from the acceptance recipe.

The decision table: the card and memory as ordered, MIG as ordered, the GPU
count, the topology as ordered, NCCL stable over three rounds with no WARN,
no #wrong and no timeout, the real task ran, the checkpoint restored, the
storage persistent. Each line is decided from findings of the provider's runs
and carries the files they were judged from. A PASS with no evidence file is a
claim, not evidence (the inventory saying "SXM4" is what was sold, not what was
delivered): it makes a line "missing", never "ok". One "no-go" line makes the
provider NO-GO; otherwise one "missing" line makes it NOT ENOUGH EVIDENCE.
A line that does not apply to the order ("not applicable": nccl-tests on a
one-GPU node, which the recipe skips) neither blocks nor counts as evidence.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pandas as pd

from orchestrator.records import Finding, subject_label
from orchestrator.verdicts import Table

Outcome = Literal["ok", "no-go", "missing", "not applicable"]
Verdict = Literal["GO", "NO-GO", "NOT ENOUGH EVIDENCE"]
ROUNDS_NEEDED = 3

CHECKS = ("card and memory as ordered", "MIG as ordered", "GPU count as ordered",
          "topology as ordered", "NCCL stable over three rounds", "the real task ran",
          "checkpoint restored", "storage persistent")


@dataclass(frozen=True)
class Reason:
    check: str
    outcome: Outcome
    text: str
    evidence: tuple[str, ...] = ()  # "<run_id>/<path in the run>"


@dataclass
class ProviderVerdict:
    provider: str
    verdict: Verdict
    reasons: list[Reason] = field(default_factory=list)


def _ev(fs: Iterable[Finding]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(f"{f.run_id}/{e}" for f in fs for e in f.evidence))


def _bad(fs: Sequence[Finding], codes: Iterable[str], levels: tuple[str, ...] = ("FAIL",)
         ) -> list[Finding]:
    want = set(codes)
    return [f for f in fs if f.code in want and f.severity in levels]


def _decide(check: str, fs: Sequence[Finding], ok_codes: Sequence[str], bad_codes: Sequence[str],
            nothing: str, bad_levels: tuple[str, ...] = ("FAIL",)) -> Reason:
    """no-go on any bad finding; ok when every wanted code PASSed with evidence."""
    bad = _bad(fs, bad_codes, bad_levels)
    if bad:
        return Reason(check, "no-go", "; ".join(f"{f.label}: {f.message}" for f in bad),
                      _ev(bad))
    goods = [f for f in fs if f.code in ok_codes and f.severity == "PASS"]
    missing = [c for c in ok_codes if not any(f.code == c for f in goods)]
    if missing:
        return Reason(check, "missing", f"{nothing} (no {', '.join(missing)} finding)")
    bare = [f for f in goods if not f.evidence]
    if bare:
        return Reason(check, "missing", "; ".join(
            f"{f.code} on {f.label} has no evidence file: a claim, not a measurement"
            for f in bare))
    return Reason(check, "ok", "; ".join(dict.fromkeys(f.message for f in goods)), _ev(goods))


def _mig(fs: Sequence[Finding], env: pd.DataFrame, provider: str) -> Reason:
    check = "MIG as ordered"
    bad = _bad(fs, ["MIG_ENABLED"])
    if bad:
        return Reason(check, "no-go", "; ".join(f"{f.label}: {f.message}" for f in bad),
                      _ev(bad))
    rows = env[(env["provider"] == provider) & (env["key"] == "mig")] if not env.empty else env
    if rows.empty:
        return Reason(check, "missing", "no node reported its MIG mode (nvidia-smi "
                      "--query-gpu was not read)")
    ev = tuple(f"{r}/{e}" for r, e in zip(rows["run_id"], rows["evidence"], strict=True))
    text = ", ".join(f"{n}: MIG {v}" for n, v in zip(rows["node"], rows["value"], strict=True))
    return Reason(check, "ok", text, ev)


def _nccl(fs: Sequence[Finding], ms: pd.DataFrame, provider: str) -> Reason:
    check = "NCCL stable over three rounds"
    nccl = [f for f in fs if f.step == "nccl"]
    bad = [f for f in nccl if f.severity in ("WARN", "FAIL")]
    if bad:
        return Reason(check, "no-go", "; ".join(f"{f.label}: {f.code}: {f.message}"
                                                for f in bad), _ev(bad))
    sel = ms[(ms["provider"] == provider) & (ms["step"] == "nccl") & (ms["metric"] == "busbw")
              & (ms["engine"] == "nccl-tests")] if not ms.empty else ms
    if sel.empty:
        single = [f for f in nccl if f.code == "NCCL_NOT_APPLICABLE" and f.evidence]
        if single:  # one GPU: nothing to all-reduce, as the recipe says a single card skips it
            return Reason(check, "not applicable", "; ".join(
                f"{f.subject}: {f.message}" for f in single), _ev(single))
        return Reason(check, "missing", "no nccl-tests busbw measured")
    rounds = sel.groupby(["run_id", "scope", "nodes"])["round"].nunique()
    few = rounds[rounds < ROUNDS_NEEDED]
    if len(few):
        # a series whose nodes were never named (an imported log) is the provider's
        shown = ", ".join(f"{scope} on {subject_label(provider, str(nodes) or None)}: {n} "
                          "round(s)" for scope, nodes, n in zip(
                              few.index.get_level_values("scope"),
                              few.index.get_level_values("nodes").fillna(""), few, strict=True))
        return Reason(check, "missing", f"fewer than {ROUNDS_NEEDED} rounds: {shown}")
    busbw = [f for f in nccl if f.code == "NCCL_BUSBW"]
    if not busbw or not _ev(busbw):
        return Reason(check, "missing", "no NCCL_BUSBW finding with its logs")
    return Reason(check, "ok", "; ".join(f"{f.label}: {f.message}" for f in busbw), _ev(busbw))


TRAIN_BROKE = ("TRAIN_FAILED", "TRAIN_OOM", "TRAIN_NAN", "TRAIN_TIMEOUT", "TRAIN_NCCL_TIMEOUT",
               "TRAIN_COMMAND_FAILED", "TRAIN_PROBE_FAILED")
RESTORE_BROKE = ("TRAIN_RESTORE_MISMATCH", "TRAIN_RESTORE_FAILED", "TRAIN_CKPT_SAVE_FAILED",
                 "TRAIN_KILL_MISSED")
NOT_PERSISTENT = ("CKPT_NOT_PERSISTENT", "CKPT_DIR_EPHEMERAL")


def _ran(fs: Sequence[Finding]) -> Reason:
    check = "the real task ran"
    bad = _bad(fs, TRAIN_BROKE)
    if bad:
        return Reason(check, "no-go", "; ".join(f"{f.label}: {f.message}" for f in bad),
                      _ev(bad))
    ran = [f for f in fs if f.code in ("TRAIN_REFERENCE", "TRAIN_COMMAND_OK") and f.evidence]
    if not ran:
        return Reason(check, "missing", "no training run of this provider")
    return Reason(check, "ok", "; ".join(f.message for f in ran), _ev(ran))


def _restored(fs: Sequence[Finding]) -> Reason:
    check = "checkpoint restored"
    bad = _bad(fs, RESTORE_BROKE)
    if bad:
        return Reason(check, "no-go", "; ".join(f"{f.label}: {f.message}" for f in bad),
                      _ev(bad))
    ok = [f for f in fs if f.code == "TRAIN_RESTORE_OK" and f.evidence]
    if not ok:
        return Reason(check, "missing", "no checkpoint was saved, killed and restored")
    return Reason(check, "ok", "; ".join(f.message for f in ok), _ev(ok))


def _storage(fs: Sequence[Finding], probes: Sequence[str]) -> Reason:
    """Persistent when a node-side look at the checkpoint filesystem found nothing
    ephemeral: preflight's CKPT_DIR, the training step's probe (which reports
    CKPT_NOT_PERSISTENT when the directory dies with the instance), or a directory
    another node sees (CKPT_SHARED)."""
    check = "storage persistent"
    bad = _bad(fs, NOT_PERSISTENT, ("WARN", "FAIL"))
    if bad:
        return Reason(check, "no-go", "; ".join(f"{f.label}: {f.message}" for f in bad),
                      _ev(bad))
    ok = [f for f in fs if f.code in ("CKPT_DIR", "CKPT_SHARED") and f.severity == "PASS"
          and f.evidence]
    if ok or probes:
        text = "; ".join([f.message for f in ok] + [
            f"training probe of the checkpoint directory found nothing ephemeral ({p})"
            for p in probes])
        return Reason(check, "ok", text, _ev(ok) + tuple(probes))
    return Reason(check, "missing", "the checkpoint directory was never probed (no ckpt_dir in "
                  "the inventory, or no training run)")


def train_probes(fs: Sequence[Finding], run_paths: dict[str, Path]) -> list[str]:
    """The training step's probe documents (nodes/<n>/train/probe.json) of the provider's
    training runs: the node-side record of where checkpoints went."""
    out = []
    for run_id in dict.fromkeys(f.run_id for f in fs if f.step == "train"):
        path = run_paths.get(run_id)
        if path is None:
            continue
        for p in sorted((path / "nodes").glob("*/train/probe.json")):
            out.append(f"{run_id}/{p.relative_to(path)}")
    return out


def provider_verdict(provider: str, findings: Sequence[Finding], measurements: pd.DataFrame,
                     env: pd.DataFrame, run_paths: dict[str, Path] | None = None
                     ) -> ProviderVerdict:
    """The decision table for one provider, over the findings of its selected runs."""
    fs = [f for f in findings if f.provider == provider]
    pre = [f for f in fs if f.step == "preflight"]
    reasons = [
        _decide(CHECKS[0], pre, ["GPU_MODEL", "GPU_MEMORY"],
                ["GPU_MODEL", "GPU_MEMORY", "GPU_DETAILS_MISSING", "NVIDIA_DRIVER_MISSING",
                 "TORCH_ORDER"],
                "no preflight checked the card and memory against an order"),
        _mig(pre, env, provider),
        _decide(CHECKS[2], pre, ["GPU_COUNT"], ["GPU_COUNT", "TORCH_GPU_COUNT", "TORCH_ORDER"],
                "no preflight checked the GPU count against an order"),
        _decide(CHECKS[3], fs, ["INTERCONNECT"],
                ["INTERCONNECT", "FORM_FACTOR", "IB_MISSING", "IB_PORT_DOWN", "IB_PORT_COUNT",
                 "IB_RATE_LOW", "NCCL_SOCKET_FALLBACK", "FABRIC_STATE"],
                "no topology was checked against an order (set expect.interconnect)"),
        _nccl(fs, measurements, provider),
        _ran(fs),
        _restored(fs),
        _storage(fs, train_probes(fs, run_paths or {})),
    ]
    outcomes = {r.outcome for r in reasons}
    verdict: Verdict = "NO-GO" if "no-go" in outcomes else \
        "NOT ENOUGH EVIDENCE" if "missing" in outcomes else "GO"
    return ProviderVerdict(provider, verdict, reasons)


def verdicts_table(vs: Sequence[ProviderVerdict]) -> Table:
    return Table("verdict per provider", ("provider", "verdict", "no-go", "missing", "ok"),
                 [(v.provider, v.verdict, *(sum(r.outcome == o for r in v.reasons)
                                            for o in ("no-go", "missing", "ok"))) for v in vs])


def reasons_table(vs: Sequence[ProviderVerdict]) -> Table:
    return Table("verdict reasons", ("provider", "check", "outcome", "reason", "evidence"),
                 [(v.provider, r.check, r.outcome, r.text, ", ".join(r.evidence))
                  for v in vs for r in v.reasons])


def run_verdicts(findings: pd.DataFrame) -> dict[str, str]:
    """Per run: its worst finding (FAIL over WARN over PASS), as `gpuvet runs` lists it."""
    out: dict[str, str] = {}
    if findings.empty:
        return out
    order = {"FAIL": 2, "WARN": 1}
    for run_id, sev in findings.groupby("run_id")["severity"]:
        top = max(sev, key=lambda s: order.get(str(s), 0))
        out[str(run_id)] = str(top) if top in order else "PASS"
    return out
