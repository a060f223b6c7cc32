"""The fleet step's findings, from one provider's typed results.

Suspect nodes are node findings (FAIL once confirmed by the re-pairs, WARN
while unconfirmed or unclear); a suspect link is a provider finding naming
both ends, so neither node is blamed for a cable. Every finding carries the
pair table (`pairs.json`: each pair job at every judged size against the
median pair) and the logs of the jobs it rests on.

Each of `fleet.collectives` is judged on its own, with a pair table of its own
(`pairs.json` for all_reduce, `pairs_alltoall.json`, ...); its findings say the
collective (`[fleet alltoall] ...`, details `collective`), all_reduce's keep `[fleet]`.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from orchestrator.bands import size_text
from orchestrator.errors import ParseError
from orchestrator.files import write_json
from orchestrator.inventory import Inventory
from orchestrator.records import Finding, Severity, finding
from orchestrator.steps.fleet import localise as L
from orchestrator.steps.fleet import stragglers as S
from orchestrator.steps.fleet.state import JobRecord, ProviderFleet
from orchestrator.store import Run

STEP = "fleet"
SOCKET_FABRICS = ("ib", "roce", "efa")


def _row(v: L.PairVerdict) -> str:
    s = max(v.sizes, key=lambda x: x.size)
    return f"{v.key} {s.value:.3g} GB/s ({s.ratio:.0%} of the median pair at {size_text(s.size)})"


def _evidence(table: str, pairs: Iterable[L.PairVerdict]) -> list[str]:
    out: dict[str, None] = {table: None}
    for p in pairs:
        out.update(dict.fromkeys(p.evidence))
    return list(out)


def table_name(collective: str) -> str:
    """The pair table's file: all_reduce keeps `pairs.json`, as runs on disk have it."""
    return "pairs.json" if collective == "all_reduce" else f"pairs_{collective}.json"


def pair_table(loc: L.Localisation, jobs: Sequence[JobRecord],
               dropped: Mapping[str, str], collective: str = "all_reduce") -> dict[str, Any]:
    transport = {(j.job.nodes, j.stage, j.round): j.transport for j in jobs
                 if j.collective == collective}
    return {
        "collective": collective,
        "tolerance": loc.tolerance,
        "references": [{"size": r.size, "median": r.median, "pairs": r.pairs,
                        "band": r.band.model_dump() if r.band else None}
                       for r in loc.references],
        "pairs": [{"nodes": list(v.nodes), "collective": collective, "stage": v.stage,
                   "round": v.round, "slow": v.slow,
                   "transport": transport.get((v.nodes, v.stage, v.round)),
                   "sizes": [{"size": s.size, "busbw": s.value, "reference": s.reference,
                              "ratio": s.ratio, "slow": s.slow,
                              "band": s.band.result if s.band else None} for s in v.sizes],
                   "evidence": list(v.evidence)} for v in loc.table],
        "suspects": [{"node": s.node, "status": s.status} for s in loc.suspects],
        "links": [{"nodes": list(lk.nodes), "status": lk.status} for lk in loc.links],
        "passed": [n for n in loc.passed if n not in dropped],
        "dropped": dict(dropped),
    }


def judge(run: Run, inv: Inventory, pf: ProviderFleet) -> list[Finding]:
    prov = pf.provider
    fs: list[Finding] = []

    def add(code: str, sev: Severity, msg: str, *, node: str | None = None,
            evidence: Iterable[str] = (), collective: str | None = None,
            **details: Any) -> None:
        label = "fleet" if collective in (None, "all_reduce") else f"fleet {collective}"
        if collective is not None:
            details["collective"] = collective
        fs.append(finding(run.run_id, STEP, provider=prov, node=node, code=code, severity=sev,
                          message=f"[{label}] {msg}", evidence=evidence, **details))

    for n, why in pf.dropped.items():
        add("FLEET_NODE_DROPPED", "FAIL", f"{n} was left out of the fleet plan ({why}); the "
            "plan was recomputed and went on without it", node=n, reason=why)
    if pf.final is None:
        add("FLEET_NOT_RUN", "FAIL", f"fewer than two nodes of {prov} were left to pair "
            f"({len(pf.alive)} of {len(pf.nodes)})")
        return fs
    rel = None
    for coll in pf.params.collectives:
        if coll in pf.skipped:
            why, files = pf.skipped[coll]
            add("FLEET_COLLECTIVE_SKIPPED", "INFO", f"not run: {why}", evidence=files,
                collective=coll)
        loc = pf.final.get(coll)
        if loc is not None:
            here = _collective(run, pf, loc, coll, add)
            rel = rel or here
    if rel is not None:
        _transports(inv, pf, add, rel)
    _groups(pf, add)
    _stragglers(run, pf, add)
    return [*fs, *pf.extra]


def _collective(run: Run, pf: ProviderFleet, loc: L.Localisation, coll: str,
                add: Any) -> str:
    """One collective's findings, from its own localisation; its pair table's path."""
    table = run.provider_dir(pf.provider, STEP) / table_name(coll)
    write_json(table, pair_table(loc, pf.jobs, pf.dropped, coll))
    rel = run.rel(table)
    refs = ", ".join(f"{size_text(r.size)} {r.median:.3g} GB/s" for r in loc.references)
    add("FLEET_PAIRS", "INFO", f"{len(loc.table)} pair jobs over {len(pf.alive)} nodes "
        f"({pf.params.engine}, plan {pf.params.plan}); the median pair: {refs}",
        evidence=[rel], references={str(r.size): r.median for r in loc.references},
        tolerance=loc.tolerance, collective=coll)
    for r in loc.fleet_below_band:
        add("FLEET_BELOW_BAND", "WARN", f"the median pair itself is below the band at "
            f"{size_text(r.size)} ({r.median:.3g} < {r.band.lower if r.band else 0:g} GB/s): "
            "the whole fleet is slow, no one node to blame", evidence=[rel], collective=coll)
    sev_of: dict[str, Severity] = {"confirmed": "FAIL", "unclear": "WARN",
                                   "unconfirmed": "WARN", "cleared": "INFO"}
    for s in loc.suspects:
        slow = "; ".join(_row(p) for p in s.pairs)
        again = "; ".join(_row(p) for p in s.repairs) or "none could be run"
        add("FLEET_SUSPECT_NODE" if s.status != "cleared" else "FLEET_SUSPECT_CLEARED",
            sev_of[s.status], f"{s.node} is slow with every partner: {slow}; re-paired with "
            f"nodes that passed: {again} ({s.status})", node=s.node,
            evidence=_evidence(rel, [*s.pairs, *s.repairs]), status=s.status,
            partners=[_other(p, s.node) for p in s.pairs],
            repaired_with=[_other(p, s.node) for p in s.repairs], collective=coll)
    for lk in loc.links:
        a, b = lk.nodes
        fine = "; ".join(_row(p) for p in lk.fine) or "no other pair"
        again = "; ".join(_row(p) for p in lk.repairs) or "not run again"
        add("FLEET_SUSPECT_LINK" if lk.status != "cleared" else "FLEET_SUSPECT_CLEARED",
            sev_of[lk.status], f"link {a} <-> {b} is slow only together: {_row(lk.pair)}, "
            f"while both are fine with others ({fine}); run again: {again} ({lk.status})",
            evidence=_evidence(rel, [lk.pair, *lk.fine, *lk.repairs]), link=[a, b],
            status=lk.status, collective=coll)
    if not loc.suspects and not loc.links and not loc.fleet_below_band:
        passed = [n for n in loc.passed if n not in pf.dropped]
        add("FLEET_NO_SUSPECT", "PASS", f"no slow node or link among {len(passed)} nodes "
            f"(every pair within {loc.tolerance:.0%} of the median pair)", evidence=[rel],
            collective=coll)
    elif loc.suspects or loc.links:
        # a suspect named: say which nodes the plan cleared, so each has its own verdict
        # (a node measured in good pairs is not "not measured")
        named = {s.node for s in loc.suspects if s.status != "cleared"}
        for n in loc.passed:
            if n in pf.dropped or n in named:
                continue
            add("FLEET_NODE_CLEARED", "PASS", f"{n}: its pairs with nodes other than the "
                f"suspects are within {loc.tolerance:.0%} of the median pair", node=n,
                evidence=[rel], collective=coll)
    return rel


def _other(v: L.PairVerdict, node: str) -> str:
    a, b = v.nodes
    return b if a == node else a


def _transports(inv: Inventory, pf: ProviderFleet, add: Any, rel: str) -> None:
    # one transport per pair job: the first of its collectives that ran and said one
    per_job: dict[tuple[tuple[str, ...], str, int], JobRecord] = {}
    for j in pf.jobs:
        if len(j.job.nodes) == 2 and j.failed is None and j.busbw:
            key = (j.job.nodes, j.stage, j.round)
            if key not in per_job or (per_job[key].transport is None and j.transport):
                per_job[key] = j
    pairs = list(per_job.values())
    by: dict[str, list[str]] = {}
    for j in pairs:
        by.setdefault(j.transport or "unknown", []).append(j.job.key)
    if not by:
        return
    shown = "; ".join(f"{t}: {len(keys)} pair(s)" for t, keys in sorted(by.items()))
    fabric = inv.providers[pf.provider].expect.fabric.type
    socket = [k for t, keys in by.items() if "Socket" in t for k in keys]
    if fabric in SOCKET_FABRICS and socket:
        add("FLEET_TRANSPORT_SOCKET", "WARN", f"{len(socket)} pair(s) ran over NET/Socket "
            f"though the order is a {fabric} fabric: {', '.join(socket[:20])}",
            evidence=[rel], pairs=socket)
    elif pf.params.engine == "torch" and set(by) == {"unknown"}:
        shown = f"{len(pairs)} pair(s) over torch.distributed (no NCCL INFO in the logs)"
    add("FLEET_TRANSPORT", "INFO", f"transport per pair (NCCL INFO): {shown}", evidence=[rel],
        transports={t: len(k) for t, k in by.items()})


def _groups(pf: ProviderFleet, add: Any) -> None:
    groups = [j for j in pf.jobs if len(j.job.nodes) > 2 and j.failed is None and j.busbw]
    by_stage: dict[tuple[str, str], list[JobRecord]] = {}
    for j in groups:  # each collective's groups against the median group of its own
        by_stage.setdefault((j.collective, j.stage), []).append(j)
    tol = pf.params.tolerance
    for (coll, stage), jobs in by_stage.items():
        size = max(jobs[0].busbw)
        vals = [j.busbw.get(size, 0.0) for j in jobs]
        med = statistics.median(vals)
        slow = [j for j, v in zip(jobs, vals, strict=True) if len(jobs) >= 3
                and v < (1 - tol) * med]
        for j in slow:
            add("FLEET_GROUP_SLOW", "WARN", f"group of {len(j.job.nodes)} "
                f"({', '.join(j.job.nodes)}) at {j.busbw[size]:.3g} GB/s, more than {tol:.0%} "
                f"below the median group ({med:.3g} GB/s at {size_text(size)}): rail or switch "
                "trouble among these nodes", evidence=j.files, nodes=list(j.job.nodes),
                collective=coll)
        what = "the whole fleet" if stage == "whole" else f"{len(jobs)} group(s) ({stage})"
        add("FLEET_GROUPS", "INFO", f"{what}: busbw at {size_text(size)} "
            + ", ".join(f"{v:.3g}" for v in vals[:16]) + (" ..." if len(vals) > 16 else "")
            + " GB/s", evidence=[f for j in jobs[:16] for f in j.files[:1]],
            plan_stage=stage, busbw=vals, collective=coll)


def _stragglers(run: Run, pf: ProviderFleet, add: Any) -> None:
    whole = [j for j in pf.jobs if j.stage == "whole" and j.failed is None]
    if not whole:
        return
    j = next((x for x in whole if x.rank_times is not None), whole[0])
    if j.rank_times is None:
        if pf.params.engine == "torch":
            add("FLEET_RANK_TIMES_MISSING", "WARN", "the whole-fleet run wrote no rank times: "
                "stragglers were not looked for", evidence=j.files)
        else:
            add("FLEET_STRAGGLERS_NOT_CHECKED", "INFO", "stragglers are timed by the torch "
                "engine's whole-fleet run (--engine torch); nccl-tests does not time ranks")
        return
    rel = run.rel(j.rank_times)
    try:
        report = S.stragglers(S.load_rank_times(j.rank_times.read_text(), source=rel))
    except ParseError as exc:
        add("FLEET_RANK_TIMES_UNREADABLE", "WARN", exc.what, evidence=[rel])
        return
    for r in report.stragglers:
        who = r.node or r.host
        add("FLEET_STRAGGLER", "WARN", f"rank {r.rank} on {who} is late at the barrier in "
            f"{r.late_share:.0%} of {report.iters} iterations by {r.late_us:.0f} us (median; "
            f"threshold {report.threshold_us:.0f} us)", node=r.node if r.node in
            {n.name for n in pf.nodes} else None, evidence=[rel], rank=r.rank,
            late_us=r.late_us)
    if not report.stragglers:
        add("FLEET_NO_STRAGGLER", "PASS", f"no rank of {len(report.ranks)} consistently late "
            f"at the barrier ({report.iters} iterations)", evidence=[rel])
