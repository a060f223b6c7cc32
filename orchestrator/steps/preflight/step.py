"""Preflight: record each node's environment and judge it against the order.

One payload round trip per node collects every command's output; the
controller keeps each raw output as evidence, parses it, and runs the checks.
A node that cannot be reached or whose payload fails is a finding of its own;
the other nodes go on.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator import collectdoc, parsers
from orchestrator import payload as payload_mod
from orchestrator.errors import GpuvetError, ParseError, StepError
from orchestrator.executors import ExecutorPool
from orchestrator.executors.base import ProgressHook
from orchestrator.inventory import Inventory, Node
from orchestrator.parsers.fabric import from_document
from orchestrator.records import Finding, finding, node_unit_key, provider_unit_key
from orchestrator.steps.driver import Driven, StageTracker, UnitResult, drive, node_unit, step_pool
from orchestrator.steps.preflight import checks
from orchestrator.store import Run, atomic_write
from orchestrator.suite import Suite
from payload.commands import COMMANDS_BY_ID
from payload.scrub import scrub_text

STEP = "preflight"


@dataclass
class NodeReport:
    facts: checks.NodeFacts
    findings: list[Finding]


def judge_document(doc: dict[str, Any], node: Node, inv: Inventory, run_id: str,
                   out_dir: Path | None, rel: Callable[[Path], str] | None = None,
                   suite: Suite | None = None) -> NodeReport:
    """Parse a collect document and check it: the same path for live and --from runs."""
    doc = collectdoc.validate(doc, node=node.name)
    nf = checks.NodeFacts(node=node.name, provider=node.provider, doc=doc,
                          inventory_env=dict(node.env), ckpt_configured=node.ckpt_dir is not None)
    if out_dir is not None:
        whole = out_dir / "collect.json"
        nf.document_evidence = rel(whole) if rel else str(whole)
    for cid, rec in doc["commands"].items():
        if out_dir is not None:
            raw = out_dir / "raw" / f"{cid}.txt"
            # cut out of collect.json, which is already on disk: no fsync per file
            atomic_write(raw, rec.get("stdout") or "", durable=False)
            if rec.get("stderr"):
                err = out_dir / "raw" / f"{cid}.stderr.txt"
                atomic_write(err, scrub_text(rec["stderr"]), durable=False)
                nf.stderr_evidence[cid] = rel(err) if rel else str(err)
            nf.evidence[cid] = rel(raw) if rel else str(raw)
        spec = COMMANDS_BY_ID.get(cid)
        if spec is None or spec.parser is None or rec.get("missing") or rec.get("timed_out"):
            continue
        if rec.get("rc") != 0 and cid != "ldconfig":
            continue
        try:
            nf.facts[cid] = parsers.parse(spec.parser, rec.get("stdout") or "",
                                          source=nf.evidence.get(cid, cid))
        except ParseError as exc:
            nf.parse_errors[cid] = exc.what
    _fabric(nf, doc, out_dir, rel)
    if out_dir is not None:
        # derived from collect.json, which is on disk already: no fsync; one line, as
        # json's C encoder writes it (indented output takes the pure-Python encoder, a
        # tenth of preflight's CPU per node)
        facts = {"facts": {k: parsers.to_jsonable(v) for k, v in nf.facts.items()},
                 "parse_errors": nf.parse_errors, "versions": checks.versions(nf),
                 "boot_time": doc.get("boot_time"), "collected_at": doc.get("finished_at")}
        atomic_write(out_dir / "facts.json",
                     json.dumps(facts, sort_keys=True, default=str) + "\n", durable=False)
    expect = inv.provider_of(node).expect
    results = checks.node_results(nf, expect, (suite or Suite()).preflight)
    findings = [_finding(r, run_id, node.name, node.provider) for r in results]
    return NodeReport(nf, findings)


def _fabric(nf: checks.NodeFacts, doc: dict[str, Any], out_dir: Path | None,
            rel: Callable[[Path], str] | None) -> None:
    """The payload's sysfs snapshot of the fabric (absent from older payloads)."""
    snap = doc.get("fabric")
    if snap is None:
        return
    if out_dir is not None:
        raw = out_dir / "raw" / "fabric.json"
        atomic_write(raw, json.dumps(snap, indent=1) + "\n", durable=False)
        nf.evidence["fabric"] = rel(raw) if rel else str(raw)
    try:
        nf.facts["fabric"] = from_document(snap, source=nf.evidence.get("fabric", "fabric"))
    except ParseError as exc:
        nf.parse_errors["fabric"] = exc.what


def _finding(r: checks.Result, run_id: str, node: str | None, provider: str) -> Finding:
    return finding(run_id, STEP, provider=provider, node=node, code=r.code,
                   severity=r.severity, message=r.message, evidence=r.evidence, **r.details)


def collect_args(node: Node, suite: Suite) -> list[str]:
    args = ["collect", "--node", node.name, "--work-dir", node.work_dir,
            "--jobs", str(suite.preflight.jobs)]
    if node.ckpt_dir:
        args += ["--ckpt-dir", node.ckpt_dir]
    return args


def run_node(pool: ExecutorPool, node: Node, inv: Inventory, run: Run, suite: Suite,
             stage: StageTracker, reports: dict[str, NodeReport] | None = None) -> UnitResult:
    out_dir = run.node_dir(node.name, STEP)
    ex = pool(node)
    with stage("execute"):
        res = payload_mod.run(ex, collect_args(node, suite), staging=run.dir / ".staging",
                              timeout=suite.preflight.timeout_s,
                              stdout_path=out_dir / "collect.json")
        if not res.ok:
            atomic_write(out_dir / "collect.stderr.txt", scrub_text(res.stderr))
            res.raise_for_status("payload collect")
    with stage("judge"):
        try:
            doc = json.loads(res.stdout)
        except (json.JSONDecodeError, RecursionError) as exc:
            why = exc if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
            raise StepError(f"payload printed invalid JSON ({why})", node=node.name,
                            command=shlex.join(collect_args(node, suite)),
                            hint=f"see {out_dir / 'collect.json'}") from None
        report = judge_document(doc, node, inv, run.run_id, out_dir, run.rel, suite)
    if reports is not None:
        # kept for the cross-node checks, which read parsed facts only: without the
        # collect document (~0.2 MB in memory per node) what stays is small
        reports[node.name] = NodeReport(dataclasses.replace(report.facts, doc={}),
                                        report.findings)
    return UnitResult(findings=report.findings, summary={"findings": len(report.findings)})


def run_preflight(inv: Inventory, nodes: list[Node], run: Run, suite: Suite, *,
                  pool: ExecutorPool | None = None, accept_new_host_keys: bool = False,
                  progress: ProgressHook | None = None) -> Driven:
    """All nodes in parallel; then the cross-node checks per provider.

    Nodes this run already finished (a resumed run) are not contacted again: their
    saved documents are judged from disk for the cross-node checks, which are always
    computed anew.
    """
    reports: dict[str, NodeReport] = {}
    with step_pool(inv, pool, accept_new_host_keys) as p:
        units = [node_unit(n, functools.partial(run_node, p, n, inv, run, suite, reports=reports))
                 for n in nodes]
        run.retract(keep_units={u.key for u in units if run.is_done(u.key, STEP)}, step=STEP)
        driven = drive(run, STEP, units, concurrency=inv.settings.concurrency,
                       progress=progress)
    facts: dict[str, list[checks.NodeFacts]] = {}
    for n in nodes:
        path = run.node_dir(n.name, STEP) / "collect.json"
        if n.name in reports:
            facts.setdefault(n.provider, []).append(reports[n.name].facts)
            continue
        if node_unit_key(n.name) in driven.failed or not path.is_file():
            continue
        try:
            saved = json.loads(path.read_text())
            report = judge_document(saved, n, inv, run.run_id, None, suite=suite)
        except (json.JSONDecodeError, GpuvetError):
            continue
        facts.setdefault(n.provider, []).append(report.facts)
    cross = []
    for prov in dict.fromkeys(n.provider for n in nodes):
        for r in checks.provider_results(facts.get(prov, [])):
            f = _finding(r, run.run_id, None, prov)
            f.unit_key = provider_unit_key(prov, "cross")
            cross.append(f)
    run.add_findings(cross)
    return driven
