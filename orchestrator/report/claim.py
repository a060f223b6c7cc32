"""`gpuvet claim`: what a provider's support team needs to act on a bad node.

For each FAIL on the provider's side (`verdict.provider_side_fail`; a setup-side
finding, TRAIN_OOM or a ckpt_dir the user chose, is never in a claim) of the runs
named (else each step's latest complete run, as `compare` picks them): the node and
the GPU (index, UUID, serial, PCI bus id, from preflight's facts, `analysis/history.py`),
the finding, expected against measured with the datasheet or band and its source,
when, the evidence files copied beside it (through `payload.scrub.scrub_text`, as
everything gpuvet writes) with their sha256, the billed hours of the node's GPUs and
their price, and for an Xid the action NVIDIA's Xid catalog recommends.

The bundle: `claim.md` and `claim.html` (one page), `claim.json`, `evidence/<run>/...`.
It is made in a temporary folder beside the destination and renamed into place:
nothing half-written is left.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.analysis import compare, frames, goodhours, history, verdict
from orchestrator.errors import UsageError, shown
from orchestrator.records import Finding
from orchestrator.report import _env
from orchestrator.store import atomic_write
from payload.scrub import scrub_text

MAX_EVIDENCE_BYTES = 32 << 20  # a larger file is named, not copied

# NVIDIA's Xid catalog (Ampere and newer), "Resolution Bucket (Immediate Action)", for the
# Xids seen most on rented nodes. Source: https://docs.nvidia.com/deploy/xid-errors/
# analyzing-xid-catalog.html, as NVIDIA's NVSentinel ships it (NVIDIA/NVSentinel,
# distros/kubernetes/nvsentinel/charts/gpu-health-monitor/xiderrorsmapping.csv, commit
# 6f8b0fcfa8e502bdda78fabf96facef729a9285b; its UNEXPECTED_ERR_REPORT_ISSUE is the catalog's
# CONTACT_SUPPORT, as for the catalog's unused Xids 1-7).
XID_CATALOG_URL = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
XID_ACTIONS: dict[int, tuple[str, str]] = {
    13: ("ROBUST_CHANNEL_GR_EXCEPTION", "RESTART_APP"),
    31: ("ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "RESTART_APP"),
    43: ("ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "IGNORE"),
    45: ("ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", "WORKFLOW_XID_45"),
    48: ("ROBUST_CHANNEL_GPU_ECC_DBE", "WORKFLOW_XID_48"),
    61: ("PMU_BREAKPOINT", "CONTACT_SUPPORT"),
    62: ("PMU_HALT_ERROR", "RESET_GPU"),
    63: ("INFOROM_DRAM_RETIREMENT_EVENT", "IGNORE"),
    64: ("INFOROM_DRAM_RETIREMENT_FAILURE", "RESET_GPU"),
    74: ("NVLINK_ERROR", "WORKFLOW_NVLINK_ERR"),
    79: ("ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "RESTART_BM"),
    92: ("EXCESSIVE_SBE_INTERRUPTS", "IGNORE"),
    94: ("ROBUST_CHANNEL_CONTAINED_ERROR", "RESTART_APP"),
    95: ("ROBUST_CHANNEL_UNCONTAINED_ERROR", "RESET_GPU"),
    119: ("GSP_RPC_TIMEOUT", "RESET_GPU"),
    120: ("GSP_ERROR", "RESET_GPU"),
}
ACTION_WORDS = {
    "RESTART_APP": "restart the application",
    "RESET_GPU": "reset the GPU (nvidia-smi -r, or a node reboot)",
    "RESTART_BM": "reboot the machine (a cold restart of the bare metal)",
    "IGNORE": "no action by itself (informational)",
    "CONTACT_SUPPORT": "report it to support",
    "WORKFLOW_XID_45": "follow the catalog's workflow for Xid 45 (look at the Xid it follows)",
    "WORKFLOW_XID_48": "follow the catalog's workflow for Xid 48 (a double-bit ECC error: "
                       "reset the GPU, replace it if it recurs)",
    "WORKFLOW_NVLINK_ERR": "follow the catalog's NVLink workflow (reset the GPU, check the "
                           "link; replace the part if it recurs)",
}
# what the expected-against-measured line reads from a finding's details
FIGURES = ("value", "expected", "ratio", "datasheet", "achievable", "variant", "reference",
           "lower", "upper", "unit", "limit", "limit_w", "count", "grew", "ordered", "found",
           "matched", "measured", "wrong")


def xid_action(xid: int) -> dict[str, str]:
    name, bucket = XID_ACTIONS.get(xid, ("", ""))
    if not bucket:
        return {"xid": str(xid), "mnemonic": "", "action": "", "words": "not in gpuvet's "
                "table of common Xids: look it up in the catalog", "source": XID_CATALOG_URL}
    return {"xid": str(xid), "mnemonic": name, "action": bucket,
            "words": ACTION_WORDS.get(bucket, bucket), "source": XID_CATALOG_URL}


@dataclass
class Evidence:
    path: str  # in the bundle: evidence/<run>/<path in the run>
    sha256: str | None  # of the bundle's copy; None where it was not copied
    note: str = ""  # "scrubbed", "not copied: ..."


@dataclass
class Item:
    finding: Finding
    node: str | None
    host: str | None
    gpu: history.Card | None
    started: str
    finished: str
    figures: dict[str, Any]
    source: str  # where the expected figure comes from
    xid: dict[str, str] | None
    hours: str  # the billed hours affected with their price, or "not known: ..."
    evidence: list[Evidence] = field(default_factory=list)
    cards: list[history.Card] = field(default_factory=list)  # the node's, as preflight saw

    def as_json(self) -> dict[str, Any]:
        f = self.finding
        return {"run_id": f.run_id, "step": f.step, "code": f.code, "severity": f.severity,
                "message": f.message, "node": self.node, "host": self.host,
                "gpu": self.gpu.__dict__ if self.gpu else None,
                "node_gpus": [c.__dict__ for c in self.cards],
                "started": self.started, "finished": self.finished,
                "expected_vs_measured": self.figures, "source": self.source, "xid": self.xid,
                "billed": self.hours, "evidence": [e.__dict__ for e in self.evidence]}


@dataclass
class Claim:
    provider: str
    runs: list[str]
    items: list[Item]
    billed: str  # the window and price the hours come from
    left_out: int  # setup-side FAILs of these runs, never claimed
    per_node: dict[str, str] = field(default_factory=dict)  # node -> its billed hours, once


def _runs(root: Path, provider: str, run_ids: Sequence[str]) -> list[str]:
    sel = compare.select(root, [provider], run_ids)  # unknown provider or run: exit 2
    if not run_ids:
        return sel.run_ids(provider)
    every = frames.runs(root, run_ids=list(run_ids))
    mine = {str(r) for r, ps in zip(every["run_id"], every["providers"], strict=True)
            if provider in ps}
    other = [r for r in run_ids if r not in mine]
    if other:
        raise UsageError(f"run {', '.join(other)} has no records of provider {shown(provider)}",
                         hint=f"see `gpuvet runs -p {provider} --results {root}`")
    return list(dict.fromkeys(run_ids))


def _source(d: dict[str, Any]) -> str:
    if d.get("datasheet") is not None:
        return (f"the datasheet of {d.get('variant') or 'the card'} "
                "(orchestrator/data/gpu_peaks.yaml) x the fraction a healthy card reaches")
    if d.get("reference") is not None or d.get("lower") is not None:
        return "the reference band (orchestrator/data/references.yaml or expect.nccl_busbw)"
    if d.get("xid") is not None:
        return f"the kernel log ({d.get('source') or 'dmesg'}), line {d.get('line_no', '?')}"
    return "the order in the inventory (expect) and the check's own rule (docs/checks)"


def build(root: Path, provider: str, run_ids: Sequence[str] = ()) -> Claim:
    ids = _runs(root, provider, run_ids)
    runs = frames.runs(root, run_ids=ids)
    paths = {str(r): Path(str(p)) for r, p in zip(runs["run_id"], runs["path"], strict=True)}
    times = {str(r): (str(s), f if isinstance(f, str) else "") for r, s, f in
             zip(runs["run_id"], runs["started"], runs["finished"], strict=True)}
    fs = [f for f in frames.finding_records(root, ids) if f.provider == provider]
    mounts = verdict.persistent_mounts(paths, fs)
    claimed = [f for f in fs if verdict.provider_side_fail(f, mounts)]
    left_out = sum(f.severity == "FAIL" for f in fs) - len(claimed)
    h = history.history(root, provider)
    rows = {(r.run_id, r.node): r for r in h.runs}
    # the billed window and price, as compare finds them
    billed, per_node = _billed(root, provider, ids)
    items = []
    for f in claimed:
        row = rows.get((f.run_id, f.node or ""))
        src = row.cards_from if row else None
        card = history.card_of(f, src.cards if src else []) if f.node else None
        figures = {k: f.details[k] for k in FIGURES if k in f.details}
        xid = xid_action(int(f.details["xid"])) if isinstance(f.details.get("xid"), int) \
            else None
        items.append(Item(f, f.node, src.host if src else None, card, *times[f.run_id],
                          figures, _source(f.details), xid,
                          per_node(f.node) if f.node else "the provider as a whole: see "
                          "the billed window", cards=list(src.cards) if src else []))
    nodes = sorted({it.node for it in items if it.node})
    return Claim(provider, ids, items, billed, left_out, {n: per_node(n) for n in nodes})


def _billed(root: Path, provider: str, ids: Sequence[str]) -> tuple[str, Any]:
    """The window's words, and node -> its billed GPU-hours with their price."""
    try:
        c = compare.build(root, [provider], ids)
    except UsageError as exc:
        why = f"not known: {exc.what.splitlines()[0]}"
        return why, lambda node: why
    poc = goodhours.billed_window(c.costs, provider)
    if poc is None or poc.billed_hours is None or poc.pricing is None:
        why = "not known: " + (poc.why if poc is not None and poc.why else "no billed window "
                               "or no pricing in the inventory")
        return why, lambda node: why
    env = c.env
    sel = env[(env["provider"] == provider) & (env["key"] == "gpu_count")] if not env.empty \
        else env
    gpus = {str(n): int(v) for n, v in zip(sel["node"], sel["value"], strict=True)} \
        if not sel.empty else {}
    p = poc.pricing
    words = (f"{poc.billed_hours:g} h billed ({poc.window.name}: {poc.window.source}), "
             f"{p.gpu_hour:g} {p.currency} per GPU-hour, billed per {p.billing_granularity}")

    def per_node(node: str) -> str:
        if node not in gpus:
            return f"not known: {node} reported no GPU count"
        gh = poc.billed_hours * gpus[node]
        return (f"{gh:g} GPU-hours ({gpus[node]} GPU(s) x {poc.billed_hours:g} h), "
                f"{gh * p.gpu_hour:,.2f} {p.currency}")
    return words, per_node


def _copy(run_dir: Path, run_id: str, rel: str, dest: Path) -> Evidence:
    """One evidence file into the bundle, through the scrubber; its sha256."""
    name = f"evidence/{run_id}/{rel}"
    src = run_dir / rel
    try:
        src.resolve().relative_to(run_dir.resolve())
    except ValueError:
        return Evidence(name, None, "not copied: outside its run's folder")
    if not src.is_file():
        return Evidence(name, None, "not copied: not in the run's folder")
    if src.stat().st_size > MAX_EVIDENCE_BYTES:
        return Evidence(name, None, f"not copied: larger than {MAX_EVIDENCE_BYTES >> 20} MiB "
                        "(it stays in the run's folder)")
    raw = src.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return Evidence(name, None, "not copied: not text (it stays in the run's folder)")
    clean = scrub_text(text).encode("utf-8")
    out = dest / name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(clean)
    return Evidence(name, hashlib.sha256(clean).hexdigest(),
                    "scrubbed (differs from the run's copy)" if clean != raw else "")


def _context(c: Claim) -> dict[str, Any]:
    return {"provider": c.provider, "runs": c.runs, "items": c.items, "billed": c.billed,
            "left_out": c.left_out, "catalog": XID_CATALOG_URL, "per_node": c.per_node}


def write(c: Claim, root: Path, dest: Path) -> list[Path]:
    """The bundle into `dest`, a folder that does not exist or is empty: made beside it and
    renamed into place. Returns the files written."""
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise UsageError(f"-o {shown(str(dest))} exists and is not an empty folder",
                         hint="name a new folder: a claim is never written over another")
    parent = dest.resolve().parent
    if not parent.is_dir():
        raise UsageError(f"-o {shown(str(dest))}: its folder {shown(str(parent))} does not "
                         "exist", hint="create it, or name a folder in one that exists")
    runs = frames.runs(root, run_ids=c.runs)
    paths = {str(r): Path(str(p)) for r, p in zip(runs["run_id"], runs["path"], strict=True)}
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=parent))
    try:
        for it in c.items:
            f = it.finding
            it.evidence = [_copy(paths[f.run_id], f.run_id, e, tmp) for e in f.evidence]
        ctx = _context(c)
        atomic_write(tmp / "claim.md", _env(markdown=True).get_template("claim.md.j2")
                     .render(**ctx))
        atomic_write(tmp / "claim.html", _env().get_template("claim.html.j2").render(**ctx))
        doc = {"provider": c.provider, "runs": c.runs, "billed": c.billed,
               "billed_per_node": c.per_node,
               "setup_side_fails_left_out": c.left_out, "xid_catalog": XID_CATALOG_URL,
               "items": [it.as_json() for it in c.items]}
        atomic_write(tmp / "claim.json", scrub_text(json.dumps(doc, indent=2, default=str))
                     + "\n")
        if dest.exists():
            dest.rmdir()
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return sorted(p for p in dest.rglob("*") if p.is_file())

