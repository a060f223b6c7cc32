"""Go / no-go / not enough evidence, per provider, from the acceptance recipe.

The decision table: the card and memory as ordered, MIG as ordered, the GPU
count, the topology as ordered, the GPUs' health under load (where the health
step ran), NCCL stable over three rounds with no WARN, no #wrong and no
timeout, the real task ran, the checkpoint restored, the storage persistent.
Each line is decided from findings of the provider's runs and carries the
files they were judged from.

Every line also says whose side its outcome is on (docs/report.md, "The outcome
rule"):

- **provider**: what the provider delivered (card, memory, count, MIG, topology,
  fabric, health, NCCL, a busy GPU, storage when the node has nothing persistent).
  A FAIL there (a WARN for NCCL and storage, as the recipe asks) is "no-go".
- **setup**: what the inventory or the suite chose (a `ckpt_dir` on a scratch path
  while the node mounts a persistent filesystem, an `expect` key not set, the
  user's own training command). The line is "not proven", with the exact fix.
- **not measured**: nothing was measured ("missing"), or a PASS has no evidence
  file: a claim, not a measurement.

One "no-go" line makes the provider NO-GO; otherwise one "missing" or "not proven"
line makes it NOT ENOUGH EVIDENCE. A line that does not apply to the order ("not
applicable": nccl-tests on a one-GPU node, which the recipe skips; the topology of
one GPU on one node) neither blocks nor counts as evidence.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pandas as pd

from orchestrator.analysis.persistence import Persistent, persistent_mounts, train_probes, where_to
from orchestrator.records import SEVERITY_ORDER, Finding, subject_label

Outcome = Literal["ok", "no-go", "not proven", "missing", "not applicable"]
Side = Literal["provider", "setup", "not measured", ""]
Verdict = Literal["GO", "NO-GO", "NOT ENOUGH EVIDENCE"]
ROUNDS_NEEDED = 3
NOT_OK = ("no-go", "not proven", "missing")

CHECKS = ("card and memory as ordered", "MIG as ordered", "GPU count as ordered",
          "topology as ordered", "NCCL stable over three rounds", "the real task ran",
          "checkpoint restored", "storage persistent")
HEALTH_CHECK = "GPU health under load"

# Findings whose cause is the inventory or the suite, not what the provider delivered.
SETUP_CODES = {
    "CKPT_DIR_UNUSABLE": "create the checkpoint directory (or point ckpt_dir at one that "
                         "exists) and rerun `gpuvet preflight`",
    "TRAIN_COMMAND_FAILED": "fix the training command in the suite (train.command) and rerun "
                            "`gpuvet train`",
    "TRAIN_CKPT_NO_SPACE": "point ckpt_dir at a filesystem with room for two checkpoints "
                           "(CKPT_SPACE_LOW says how much) and rerun `gpuvet train`",
    "TRAIN_OOM": "choose a smaller preset (train.preset in the suite) or more GPUs, and rerun "
                 "`gpuvet train`",
    "SLURM_JOB_TIMEOUT": "raise slurm.time_limit in the inventory and rerun with --resume "
                         "(the Slurm allocation reached its time limit)",
    "SLURM_JOB_PREEMPTED": "rerun with --resume (the Slurm allocation was preempted), or ask "
                           "for a qos that is not preempted",
    "SLURM_JOB_ENDED": "rerun with --resume (the Slurm allocation ended under the run)",
}


@dataclass(frozen=True)
class Reason:
    check: str
    outcome: Outcome
    text: str
    evidence: tuple[str, ...] = ()  # "<run_id>/<path in the run>"
    side: Side = ""  # whose side the outcome is on; "" for ok and not applicable
    fix: str = ""  # for "not proven" and "missing": what to do
    codes: tuple[str, ...] = ()  # the findings that decided it

    def __post_init__(self) -> None:
        if not self.side and self.outcome in NOT_OK:
            object.__setattr__(self, "side", {"no-go": "provider", "not proven": "setup",
                                              "missing": "not measured"}[self.outcome])


@dataclass
class ProviderVerdict:
    provider: str
    verdict: Verdict
    reasons: list[Reason] = field(default_factory=list)
    decisive: list[str] = field(default_factory=list)  # one to three reasons in words

    @property
    def headline(self) -> str:
        why = "; ".join(self.decisive)
        return f"{self.provider}: {self.verdict}" + (f": {why}" if why else "")


def _ev(fs: Iterable[Finding]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(f"{f.run_id}/{e}" for f in fs for e in f.evidence))


def _codes(fs: Iterable[Finding]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(f.code for f in fs))


def _bad(fs: Sequence[Finding], codes: Iterable[str], levels: tuple[str, ...] = ("FAIL",)
         ) -> list[Finding]:
    want = set(codes)
    return [f for f in fs if f.code in want and f.severity in levels]


# TORCH_ORDER says in one finding what PyTorch saw wrong against the order: each part
# belongs to its own line of the table (the card, or the count).
_TORCH_PART = {"card": re.compile(r"^GPU\d+ (is|has) "),
               "count": re.compile(r"GPU\(s\), .* ordered$|^CUDA is not available")}


def _torch_about(f: Finding, what: str) -> bool:
    wrong = f.details.get("wrong")
    if not isinstance(wrong, list) or not wrong:
        return True  # an older record without its parts: it concerns every line it may
    return any(_TORCH_PART[what].search(str(w)) for w in wrong)


def _split(bad: list[Finding]) -> tuple[list[Finding], list[Finding]]:
    """(provider side, setup side) of the bad findings of a line."""
    return ([f for f in bad if f.code not in SETUP_CODES],
            [f for f in bad if f.code in SETUP_CODES])


def _no_go(check: str, bad: Sequence[Finding], with_code: bool = False) -> Reason:
    return Reason(check, "no-go", "; ".join(
        f"{f.label}: {f.code + ': ' if with_code else ''}{f.message}" for f in bad),
        _ev(bad), "provider", codes=_codes(bad))


def _setup(check: str, bad: Sequence[Finding]) -> Reason:
    fixes = dict.fromkeys(SETUP_CODES[f.code] for f in bad)
    return Reason(check, "not proven", "; ".join(f"{f.label}: {f.message}" for f in bad),
                  _ev(bad), "setup", "; ".join(fixes), _codes(bad))


def _decide(check: str, fs: Sequence[Finding], ok_codes: Sequence[str], bad: list[Finding],
            nothing: str, *, any_ok: bool = False, unset: str = "", ran: bool = False
            ) -> Reason:
    """no-go on any bad finding of the provider's side; ok when every wanted code (or,
    `any_ok`, one of them) PASSed with evidence. Nothing measured is "missing"; where the
    step ran but the order did not say what to check (`ran`), "not proven" with `unset`."""
    mine, setup = _split(bad)
    if mine:
        return _no_go(check, mine)
    if setup:
        return _setup(check, setup)
    goods = [f for f in fs if f.code in ok_codes and f.severity == "PASS"]
    missing = [c for c in ok_codes if not any(f.code == c for f in goods)]
    if missing and (not any_ok or len(missing) == len(ok_codes)):
        codes = " or ".join(missing) if any_ok else ", ".join(missing)
        text = f"{nothing} (no {codes} finding)"
        if ran and unset and not any(f.code in ok_codes for f in fs):
            return Reason(check, "not proven", text, (), "setup", unset)
        return Reason(check, "missing", text, (), "not measured", "run `gpuvet preflight` "
                      "with the order in the inventory's expect")
    bare = [f for f in goods if not f.evidence]
    if bare:
        return Reason(check, "missing", "; ".join(
            f"{f.code} on {f.label} has no evidence file: a claim, not a measurement"
            for f in bare), (), "not measured")
    return Reason(check, "ok", "; ".join(dict.fromkeys(f.message for f in goods)), _ev(goods),
                  codes=_codes(goods))


def _mig(fs: Sequence[Finding], env: pd.DataFrame, provider: str) -> Reason:
    check = "MIG as ordered"
    bad = _bad(fs, ["MIG_ENABLED"])
    if bad:
        return _no_go(check, bad)
    rows = env[(env["provider"] == provider) & (env["key"] == "mig")] if not env.empty else env
    if rows.empty:
        return Reason(check, "missing", "no node reported its MIG mode (nvidia-smi "
                      "--query-gpu was not read)", fix="run `gpuvet preflight`")
    ev = tuple(f"{r}/{e}" for r, e in zip(rows["run_id"], rows["evidence"], strict=True))
    text = ", ".join(f"{n}: MIG {v}" for n, v in zip(rows["node"], rows["value"], strict=True))
    return Reason(check, "ok", text, ev)


def _one_gpu_one_node(env: pd.DataFrame, provider: str) -> bool:
    if env.empty:
        return False
    sel = env[(env["provider"] == provider) & (env["key"] == "gpu_count")]
    nodes = set(env[env["provider"] == provider]["node"])
    return len(nodes) == 1 and not sel.empty and set(map(str, sel["value"])) == {"1"}


def _topology(fs: Sequence[Finding], env: pd.DataFrame, provider: str, ran: bool) -> Reason:
    check = CHECKS[3]
    bad = _bad(fs, ["INTERCONNECT", "FORM_FACTOR", "IB_MISSING", "IB_PORT_DOWN",
                    "IB_PORT_COUNT", "IB_RATE_LOW", "NCCL_SOCKET_FALLBACK", "FABRIC_STATE",
                    # the fabric's ports from sysfs (judging/fabric.py)
                    "RDMA_PKEY_MISMATCH", "RDMA_ROCE_NO_V2", "RDMA_PORT_STATE",
                    "RDMA_PORT_GONE"])
    if not bad and not any(f.code == "INTERCONNECT" for f in fs) \
            and _one_gpu_one_node(env, provider):
        return Reason(check, "not applicable", "one GPU on one node: no link between GPUs or "
                      "nodes to check")
    return _decide(check, fs, ["INTERCONNECT"], bad,
                   "no topology was checked against an order (set expect.interconnect)",
                   unset="set expect.interconnect (nvswitch, nvlink or pcie) in the inventory "
                         "and rerun `gpuvet preflight`", ran=ran)


def _nccl(fs: Sequence[Finding], ms: pd.DataFrame, provider: str) -> Reason:
    check = "NCCL stable over three rounds"
    nccl = [f for f in fs if f.step == "nccl"]
    bad = [f for f in nccl if f.severity in ("WARN", "FAIL")]
    if bad:
        return _no_go(check, bad, with_code=True)
    sel = ms[(ms["provider"] == provider) & (ms["step"] == "nccl") & (ms["metric"] == "busbw")
              & (ms["engine"] == "nccl-tests")] if not ms.empty else ms
    if sel.empty:
        single = [f for f in nccl if f.code == "NCCL_NOT_APPLICABLE" and f.evidence]
        if single:  # one GPU: nothing to all-reduce, as the recipe says a single card skips it
            return Reason(check, "not applicable", "; ".join(
                f"{f.subject}: {f.message}" for f in single), _ev(single))
        return Reason(check, "missing", "no nccl-tests busbw measured", fix="run `gpuvet nccl`")
    rounds = sel.groupby(["run_id", "scope", "nodes"])["round"].nunique()
    few = rounds[rounds < ROUNDS_NEEDED]
    if len(few):
        # a series whose nodes were never named (an imported log) is the provider's
        shown = ", ".join(f"{scope} on {subject_label(provider, str(nodes) or None)}: {n} "
                          "round(s)" for scope, nodes, n in zip(
                              few.index.get_level_values("scope"),
                              few.index.get_level_values("nodes").fillna(""), few, strict=True))
        return Reason(check, "missing", f"fewer than {ROUNDS_NEEDED} rounds: {shown}",
                      fix=f"run {ROUNDS_NEEDED} rounds with identical parameters "
                          "(the suite's nccl.rounds)")
    busbw = [f for f in nccl if f.code == "NCCL_BUSBW"]
    if not busbw or not _ev(busbw):
        return Reason(check, "missing", "no NCCL_BUSBW finding with its logs")
    return Reason(check, "ok", "; ".join(f"{f.label}: {f.message}" for f in busbw), _ev(busbw),
                  codes=("NCCL_BUSBW",))


TRAIN_BROKE = ("TRAIN_FAILED", "TRAIN_OOM", "TRAIN_NAN", "TRAIN_TIMEOUT", "TRAIN_NCCL_TIMEOUT",
               "TRAIN_COMMAND_FAILED", "TRAIN_PROBE_FAILED")
RESTORE_BROKE = ("TRAIN_RESTORE_MISMATCH", "TRAIN_RESTORE_FAILED", "TRAIN_CKPT_SAVE_FAILED",
                 "TRAIN_KILL_MISSED", "TRAIN_CKPT_NO_SPACE")
NOT_PERSISTENT = ("CKPT_NOT_PERSISTENT", "CKPT_DIR_EPHEMERAL")
# the health step's findings that are about the card itself (GPU_BUSY: another process)
HEALTH_NOT_CARD = ("HEALTH_NO_GPU", "HEALTH_NOT_RUN", "DCGM_DIAG")


def _ran(fs: Sequence[Finding]) -> Reason:
    check = "the real task ran"
    mine, setup = _split(_bad(fs, TRAIN_BROKE))
    if mine:
        return _no_go(check, mine)
    if setup:
        return _setup(check, setup)
    ran = [f for f in fs if f.code in ("TRAIN_REFERENCE", "TRAIN_COMMAND_OK") and f.evidence]
    if not ran:
        return Reason(check, "missing", "no training run of this provider",
                      fix="run `gpuvet train`")
    return Reason(check, "ok", "; ".join(f.message for f in ran), _ev(ran), codes=_codes(ran))


def _restored(fs: Sequence[Finding]) -> Reason:
    check = "checkpoint restored"
    mine, setup = _split(_bad(fs, RESTORE_BROKE))
    if mine:
        return _no_go(check, mine)
    if setup:
        return _setup(check, setup)
    ok = [f for f in fs if f.code == "TRAIN_RESTORE_OK" and f.evidence]
    if not ok:
        return Reason(check, "missing", "no checkpoint was saved, killed and restored",
                      fix="run `gpuvet train` (it saves, kills and restores)")
    return Reason(check, "ok", "; ".join(f.message for f in ok), _ev(ok),
                  codes=("TRAIN_RESTORE_OK",))


def _health(fs: Sequence[Finding]) -> Reason:
    check = HEALTH_CHECK
    health = [f for f in fs if f.step == "health"]
    bad = [f for f in health if f.severity == "FAIL"]
    if bad:
        return _no_go(check, bad, with_code=True)
    measured = [f for f in health if f.code not in HEALTH_NOT_CARD
                and f.severity in ("PASS", "WARN") and f.evidence]
    if not measured:
        return Reason(check, "missing", "no GPU was measured under load (no GPU, or the "
                      "health step did not run)", fix="run `gpuvet health` on the GPU nodes")
    warns = [f for f in measured if f.severity == "WARN"]
    text = f"{sum(f.severity == 'PASS' for f in measured)} check(s) passed" + (
        "; WARN: " + "; ".join(f"{f.label}: {f.code}: {f.message}" for f in warns)
        if warns else "")
    return Reason(check, "ok", text, _ev(measured), codes=_codes(warns))


def _storage(fs: Sequence[Finding], probes: Sequence[str],
             mounts: Mapping[str, list[Persistent]] | None = None) -> Reason:
    """Persistent when a node-side look at the checkpoint filesystem found nothing
    ephemeral: preflight's CKPT_DIR, the training step's probe (which reports
    CKPT_NOT_PERSISTENT when the directory dies with the instance), or a directory
    another node sees (CKPT_SHARED). A directory that would not survive on a node that
    mounts a persistent filesystem is the setup's choice ("not proven", with the
    filesystem to use); on a node with nothing persistent, the provider's."""
    check = "storage persistent"
    mounts = mounts or {}
    bad = _bad(fs, NOT_PERSISTENT, ("WARN", "FAIL"))
    setup, fixes, provider = [], [], []
    for f in bad:
        to = where_to(f.node, mounts) if f.node else None
        if to is not None:
            setup.append(f)
            fixes.append(f"point ckpt_dir of {f.node} at a directory on {to} and rerun "
                         "`gpuvet train`" if to.mount_point != "/" else
                         f"point ckpt_dir of {f.node} at a directory outside /tmp on {to} "
                         "and rerun `gpuvet train`")
        else:
            provider.append(f)
    if provider:
        known = [f for f in provider if f.node in mounts]
        why = " (the node mounts no persistent filesystem)" if known else ""
        r = _no_go(check, provider)
        return Reason(r.check, r.outcome, r.text + why, r.evidence, r.side, codes=r.codes)
    if setup:
        return Reason(check, "not proven", "; ".join(f"{f.label}: {f.message}" for f in setup),
                      _ev(setup), "setup", "; ".join(dict.fromkeys(fixes)), _codes(setup))
    ok = [f for f in fs if f.code in ("CKPT_DIR", "CKPT_SHARED") and f.severity == "PASS"
          and f.evidence]
    if ok or probes:
        text = "; ".join([f.message for f in ok] + [
            f"training probe of the checkpoint directory found nothing ephemeral ({p})"
            for p in probes])
        return Reason(check, "ok", text, _ev(ok) + tuple(probes), codes=_codes(ok))
    return Reason(check, "missing", "the checkpoint directory was never probed (no ckpt_dir in "
                  "the inventory, or no training run)",
                  fix="set ckpt_dir on the nodes (a persistent filesystem) and run "
                      "`gpuvet train`")


# --- the decisive reasons in words ---------------------------------------------------------

def _delivered(env: pd.DataFrame, provider: str, key: str) -> str:
    if env.empty:
        return ""
    sel = env[(env["provider"] == provider) & (env["key"] == key)]
    return " | ".join(sorted(set(map(str, sel["value"]))))


def _likes(fs: Sequence[Finding]) -> list[str]:
    """The variants the health step says the GPUs measure like, where that is not the
    order (HEALTH_VARIANT WARN)."""
    return sorted({str(f.details.get("variant")) for f in fs if f.code == "HEALTH_VARIANT"
                   and f.severity == "WARN" and f.details.get("variant")})


def _short(text: str, width: int = 160) -> str:
    return text if len(text) <= width else text[:width - 3].rstrip() + "..."


def _in_words(r: Reason, fs: Sequence[Finding], env: pd.DataFrame, provider: str,
              order: Mapping[str, Any]) -> str:
    codes = ", ".join(r.codes)
    if r.outcome == "no-go" and r.check == CHECKS[0]:
        got = _delivered(env, provider, "gpu_model")
        want = order.get("gpu_model")
        like = _likes(fs)
        if got and want and any(c in r.codes for c in ("GPU_MODEL", "TORCH_ORDER")):
            text = f"delivered {got}, ordered {want} ({codes})"
            if like:
                text += f", and it measures like {' and '.join(like)} (HEALTH_VARIANT)"
            return text
    if r.outcome == "no-go":
        return f"{r.check}: {_short(r.text)}" + (f" ({codes})" if codes else "")
    if r.outcome in ("not proven", "missing"):
        return f"{r.check} {r.outcome}" + (f": {r.fix}" if r.fix else f" ({_short(r.text)})")
    return r.check


def decisive(v: ProviderVerdict, fs: Sequence[Finding], env: pd.DataFrame,
             order: Mapping[str, Any], most: int = 3) -> list[str]:
    """One to three reasons in words: the provider's no-go lines for NO-GO; what is not
    proven or missing, and on whose side, for NOT ENOUGH EVIDENCE; what passed for GO."""
    no_go = [r for r in v.reasons if r.outcome == "no-go"]
    if no_go:
        words = [_in_words(r, fs, env, v.provider, order) for r in no_go]
        return words[:most] + ([f"and {len(words) - most} more"] if len(words) > most else [])
    if v.verdict == "NOT ENOUGH EVIDENCE":
        open_ = [r for r in v.reasons if r.outcome in ("not proven", "missing")]
        head = "nothing failed on the provider's side" if any(
            r.outcome == "ok" for r in v.reasons) else "nothing was measured"
        words = [_in_words(r, fs, env, v.provider, order) for r in open_]
        return [head, *words[:most - 1]] + (
            [f"and {len(words) - most + 1} more"] if len(words) > most - 1 else [])
    ok = [r.check for r in v.reasons if r.outcome == "ok"]
    return [f"every check passed ({', '.join(ok)})"]


def provider_verdict(provider: str, findings: Sequence[Finding], measurements: pd.DataFrame,
                     env: pd.DataFrame, run_paths: Mapping[str, Path] | None = None,
                     order: Mapping[str, Any] | None = None, with_health: bool | None = None
                     ) -> ProviderVerdict:
    """The decision table for one provider, over the findings of its selected runs.
    `order`: the provider's `expect` as the inventory wrote it (for the words of the
    headline); `with_health`: whether the health line is in the table (None: where this
    provider's health step ran)."""
    fs = [f for f in findings if f.provider == provider]
    pre = [f for f in fs if f.step == "preflight"]
    ran = bool(pre)
    paths = run_paths or {}
    torch = [f for f in _bad(pre, ["TORCH_ORDER"])]
    card_bad = _bad(pre, ["GPU_MODEL", "GPU_MEMORY", "GPU_DETAILS_MISSING",
                          "NVIDIA_DRIVER_MISSING"]) + [f for f in torch if _torch_about(f, "card")]
    count_bad = _bad(pre, ["GPU_COUNT", "TORCH_GPU_COUNT"]) + [
        f for f in torch if _torch_about(f, "count")]
    reasons = [
        _decide(CHECKS[0], pre, ["GPU_MODEL", "GPU_MEMORY"], card_bad,
                "no preflight checked the card and memory against an order", any_ok=True,
                unset="set expect.gpu_model (and memory_per_gpu_gb) in the inventory and "
                      "rerun `gpuvet preflight`", ran=ran),
        _mig(pre, env, provider),
        _decide(CHECKS[2], pre, ["GPU_COUNT"], count_bad,
                "no preflight checked the GPU count against an order",
                unset="set expect.gpus_per_node in the inventory and rerun `gpuvet preflight`",
                ran=ran),
        _topology(fs, env, provider, ran),
    ]
    if with_health or (with_health is None and any(f.step == "health" for f in fs)):
        reasons.append(_health(fs))
    reasons += [
        _nccl(fs, measurements, provider),
        _ran(fs),
        _restored(fs),
        _storage(fs, train_probes(fs, paths), persistent_mounts(paths, fs)),
    ]
    outcomes = {r.outcome for r in reasons}
    verdict: Verdict = "NO-GO" if "no-go" in outcomes else \
        "NOT ENOUGH EVIDENCE" if outcomes & {"missing", "not proven"} else "GO"
    # a provider-side FAIL has one thing to do about it: claim it, with its evidence
    reasons = [dataclasses.replace(r, fix=f"claim it: `gpuvet claim -p {provider} -o DIR` "
                                   "(the FAILs, their evidence and sha256, the billed hours)")
               if r.side == "provider" and r.outcome == "no-go" and not r.fix else r
               for r in reasons]
    v = ProviderVerdict(provider, verdict, reasons)
    v.decisive = decisive(v, fs, env, order or {})
    return v


def run_verdicts(findings: pd.DataFrame) -> dict[str, str]:
    """Per run: its worst finding (FAIL over WARN over PASS), as `gpuvet runs` lists it;
    "(setup)" after it when every finding of that severity is on the setup's side, so the
    list and `compare` never disagree without the reason shown; NOT MEASURED for a run
    whose findings are all INFO (nothing was judged)."""
    out: dict[str, str] = {}
    if findings.empty:
        return out
    for run_id, g in findings.groupby("run_id"):
        sev = [str(s) for s in g["severity"]]
        top = max(sev, key=lambda s: SEVERITY_ORDER.get(s, 0))
        if top in ("FAIL", "WARN"):
            codes = {str(c) for c, s in zip(g["code"], sev, strict=True) if s == top} \
                if "code" in g else set()
            setup = bool(codes) and codes <= set(SETUP_CODES)
            out[str(run_id)] = top + (" (setup)" if setup else "")
        else:
            out[str(run_id)] = "PASS" if "PASS" in sev else "NOT MEASURED"
    return out


def provider_side_fail(f: Finding, mounts: Mapping[str, list[Persistent]] | None = None
                       ) -> bool:
    """Whether a finding is a FAIL on the provider's side (the outcome rule): not one of the
    setup's codes (`SETUP_CODES`), and a checkpoint directory that would not survive only
    where the node mounts nothing persistent (else ckpt_dir is the setup's choice). What a
    cost of good GPU-hours, a node's history and a claim to the provider count."""
    if f.severity != "FAIL" or f.code in SETUP_CODES:
        return False
    return not (f.code in NOT_PERSISTENT and f.node is not None
                and where_to(f.node, mounts or {}) is not None)
