"""RDMA per NIC: `ib_write_bw` per HCA between pair partners, where perftest exists.

For every pair of the first round whose two nodes both have perftest and
HCAs (found by the prepare probe), each HCA of the first node is tested
against the HCA of the same position on its partner: the partner runs the
server, the node the client, one HCA after the other. The client's average
bandwidth at its largest message is judged against the order's
`expect.fabric.rate_gbps` (FAIL below 90% of it). Where no node has perftest,
one INFO says so and nothing runs. The results make the rail table (`rails.py`,
`rails.json`): every HCA against the median rail, a slow one named with its port,
netdev and the GPUs near it (FLEET_RAIL_SLOW, WARN).
"""

from __future__ import annotations

import functools
import shlex
import time
from pathlib import Path
from typing import Any

from orchestrator.errors import GpuvetError, ParseError
from orchestrator.executors import ExecutorPool, fanout
from orchestrator.executors.base import ProgressHook
from orchestrator.files import write_json
from orchestrator.inventory import Inventory, Node
from orchestrator.parsers.fabric import FabricFacts
from orchestrator.parsers.nccl_tests import parse_nccl_tests
from orchestrator.parsers.perftest import parse_perftest_bw
from orchestrator.records import Finding, UnitResult, finding
from orchestrator.steps.driver import StageTracker, drive, provider_unit
from orchestrator.steps.fleet import engines
from orchestrator.steps.fleet.rails import MIN_RAILS, TOOLS, RailResult, rail_table, rail_words
from orchestrator.steps.fleet.state import ProviderFleet
from orchestrator.store import Run
from orchestrator.suite import NcclParams

STEP = "fleet"
RATE_SHARE = 0.9  # below 90% of the ordered rate a NIC is slow
SERVER_START_S = 1.0  # the client starts this long after the server


def _hcas(pf: ProviderFleet, node: str) -> list[str]:
    info = pf.prepared.get(node) or {}
    hcas = info.get("hcas")
    return [str(h) for h in hcas] if isinstance(hcas, list) and info.get("perftest") else []


def rdma_command(hca: str, seconds: int, server: str | None = None) -> str:
    argv = ["ib_write_bw", "-d", hca, "--report_gbits", "-D", str(seconds)]
    if server is not None:
        argv.append(server)
    return shlex.join(argv)


def run_rdma(inv: Inventory, run: Run, pool: ExecutorPool, pf: ProviderFleet,
             progress: ProgressHook | None) -> None:
    first = next((r for r in pf.executed if r.stage in ("pairs", "ring")), None)
    with_perftest = [n for n in pf.alive if _hcas(pf, n)]
    prov = pf.provider

    def note(code: str, msg: str, **details: Any) -> Finding:
        return finding(run.run_id, STEP, provider=prov, node=None, code=code,
                       severity="INFO", message=f"[fleet rdma] {msg}", **details)

    if not with_perftest or first is None:
        pf.extra.append(note("FLEET_RDMA_SKIPPED", "perftest (ib_write_bw) or an HCA was not "
                             f"found on any of the {len(pf.alive)} nodes: RDMA per NIC was not "
                             "measured"))
        return
    pairs = [j.nodes for j in first.jobs if len(j.nodes) == 2
             and all(n in with_perftest for n in j.nodes)]
    rate = inv.providers[prov].expect.fabric.rate_gbps
    by_name = {n.name: n for n in pf.nodes}
    out_dir = run.provider_dir(prov, STEP)

    def work(a: str, b: str, stage: StageTracker) -> UnitResult:
        fs: list[Finding] = []
        for i, hca in enumerate(_hcas(pf, a)):
            peer = _hcas(pf, b)
            if i >= len(peer):
                break
            log = out_dir / f"rdma_{a}+{b}_{hca}.log"
            with stage("execute"):
                gbps = _one(pool, by_name[a], by_name[b], hca, peer[i], pf.params.rdma_seconds,
                            log)
            ev = [run.rel(log)] if log.is_file() else []
            if gbps is None:
                fs.append(finding(run.run_id, STEP, provider=prov, node=a,
                                  code="FLEET_RDMA_FAILED", severity="FAIL",
                                  message=f"[fleet rdma] ib_write_bw {a}:{hca} -> {b}:{peer[i]} "
                                          "gave no result", evidence=ev, hca=hca, peer=b))
                continue
            with pf.lock:
                pf.rails.append(RailResult(a, hca, b, peer[i], gbps, tuple(ev)))
            slow = rate is not None and gbps < RATE_SHARE * rate
            want = f" (ordered {rate:g} Gb/s)" if rate is not None else ""
            fs.append(finding(run.run_id, STEP, provider=prov, node=a,
                              code="FLEET_RDMA_SLOW" if slow else "FLEET_RDMA",
                              severity="FAIL" if slow else "PASS" if rate else "INFO",
                              message=f"[fleet rdma] {a}:{hca} -> {b}:{peer[i]} "
                                      f"{gbps:.1f} Gb/s{want}", evidence=ev, hca=hca, peer=b,
                              gbps=gbps, rate_gbps=rate))
        return UnitResult(findings=fs)

    units = [provider_unit(prov, f"fleet/rdma/{a}+{b}", functools.partial(work, a, b))
             for a, b in pairs]
    drive(run, STEP, units, concurrency=inv.settings.concurrency, progress=progress)
    if len(with_perftest) < len(pf.alive):
        missing = [n for n in pf.alive if n not in with_perftest]
        pf.extra.append(note("FLEET_RDMA_PARTIAL", f"perftest or HCAs missing on "
                             f"{len(missing)} node(s) ({', '.join(missing[:20])}): their NICs "
                             "were not measured", nodes=missing))


def rail_findings(run: Run, pf: ProviderFleet) -> None:
    """The rail tables (`rails.json`, `rails_nccl.json`) from the per-HCA results, one per
    tool: FLEET_RAILS says each, a rail below the others by more than the fleet's
    tolerance is FLEET_RAIL_SLOW."""
    for tool in TOOLS:
        results = [r for r in pf.rails if r.tool == tool]
        if results:
            _rail_findings(run, pf, tool, results)


def _rail_findings(run: Run, pf: ProviderFleet, tool: str, results: list[RailResult]) -> None:
    fabric = pf.fabric.before if pf.fabric is not None else {}
    table = rail_table(results, tolerance=pf.params.tolerance, topo=pf.topo,
                       fabric={n: s for n, s in fabric.items() if isinstance(s, FabricFacts)})
    path = run.provider_dir(pf.provider, STEP) / (
        "rails.json" if tool == "ib_write_bw" else f"rails_{tool}.json")
    write_json(path, table.as_json() | {"tool": tool})
    rel = run.rel(path)
    prov = pf.provider
    med = table.median_gbps or 0.0
    judged = len(table.rails) >= MIN_RAILS
    slow = table.slow
    worst = min(table.rails, key=lambda r: r.gbps)
    said = (f"median rail {med:.1f} Gb/s ({med / 8:.1f} GB/s); slowest {worst.name} "
            f"{worst.gbps:.1f} Gb/s ({worst.ratio or 0:.0%})" if judged else
            f"fewer than {MIN_RAILS} rails: none judged against the others")
    label = f"[fleet rails {tool}]"
    pf.extra.append(finding(
        run.run_id, STEP, provider=prov, node=None, code="FLEET_RAILS", severity="INFO",
        message=f"{label} {len(table.rails)} rail(s) measured one at a time "
                f"({TOOLS[tool]}): {said}; {len(slow)} more than "
                f"{table.tolerance:.0%} below the median", evidence=[rel],
        rails=[r.as_json() for r in table.rails], median_gbps=table.median_gbps,
        tolerance=table.tolerance, tool=tool))
    for r in slow:
        pf.extra.append(finding(
            run.run_id, STEP, provider=prov, node=r.node, code="FLEET_RAIL_SLOW",
            severity="WARN",
            message=f"{label} rail {rail_words(r)}: {r.gbps:.1f} Gb/s, {r.ratio or 0:.0%} "
                    f"of the median rail ({med:.1f} Gb/s): this NIC, its cable or switch port "
                    "(or the partner's) is slow; NCCL traffic of the GPUs near it crosses it",
            evidence=[rel, *r.evidence], hca=r.hca, port=r.port, netdev=r.netdev,
            gpus=r.gpus, peer=r.peer, peer_hca=r.peer_hca, gbps=r.gbps, ratio=r.ratio,
            tool=tool))


def run_nccl_rails(inv: Inventory, run: Run, pool: ExecutorPool, pf: ProviderFleet,
                   nccl: NcclParams, progress: ProgressHook | None) -> None:
    """Each rail through NCCL: between first-round partners, one nccl-tests run per HCA
    with `NCCL_IB_HCA` set to that HCA on each node (`=` before the name: that HCA only,
    not every name it starts), all the node's GPUs on the one NIC."""
    first = next((r for r in pf.executed if r.stage in ("pairs", "ring")), None)
    prov = pf.provider
    ready = [n for n in pf.alive if _hcas_any(pf, n) and n in pf.builds]
    pairs = [j.nodes for j in first.jobs if len(j.nodes) == 2
             and all(n in ready for n in j.nodes)] if first is not None else []
    if not pairs:
        pf.extra.append(finding(run.run_id, STEP, provider=prov, node=None,
                                code="FLEET_RAILS_NCCL_SKIPPED", severity="INFO",
                                message="[fleet rails nccl] no first-round pair whose nodes both "
                                        "have HCAs and nccl-tests: no rail measured through "
                                        "NCCL"))
        return
    by_name = {n.name: n for n in pf.nodes}
    out_dir = run.provider_dir(prov, STEP)

    def on(node: Node, hca: str) -> Node:
        return node.model_copy(update={"env": {**node.env, "NCCL_IB_HCA": f"={hca}"}})

    def work(a: str, b: str, stage: StageTracker) -> UnitResult:
        fs: list[Finding] = []
        for hca, peer in zip(_hcas_any(pf, a), _hcas_any(pf, b), strict=False):
            label = f"rail-{hca}_{a}+{b}"
            try:
                with stage("execute"):
                    out = engines.run_nccl_tests(pool, [on(by_name[a], hca),
                                                        on(by_name[b], peer)],
                                                 run, nccl, out_dir, label, builds=pf.builds)
                busbw = _largest_busbw(out.log)
            except GpuvetError as exc:  # the job failed, its log unreadable, a bad context
                what = exc.reason if isinstance(exc, ParseError) else exc.what
                fs.append(finding(run.run_id, STEP, provider=prov, node=a,
                                  code="FLEET_RAIL_NCCL_FAILED", severity="WARN",
                                  message=f"[fleet rails nccl] {a}:{hca} -> {b}:{peer} gave "
                                          f"no result: {what}", hca=hca, peer=b,
                                  evidence=[run.rel(f) for f in out_dir.glob(f"{label}*")]))
                continue
            ev = tuple(run.rel(f) for f in sorted(out_dir.glob(f"{label}*")))
            with pf.lock:
                pf.rails.append(RailResult(a, hca, b, peer, busbw * 8, ev, tool="nccl"))
        return UnitResult(findings=fs)

    units = [provider_unit(prov, f"fleet/rails-nccl/{a}+{b}", functools.partial(work, a, b))
             for a, b in pairs]
    drive(run, STEP, units, concurrency=inv.settings.concurrency, progress=progress)


def _hcas_any(pf: ProviderFleet, node: str) -> list[str]:
    hcas = (pf.prepared.get(node) or {}).get("hcas")
    return [str(h) for h in hcas] if isinstance(hcas, list) else []


def _largest_busbw(log: Path) -> float:
    """nccl-tests' out-of-place busbw at its largest size, GB/s."""
    parsed = parse_nccl_tests(log.read_text(errors="replace") if log.is_file() else "",
                              source=str(log))
    if not parsed.rows:
        raise ParseError("nccl-tests", "no result rows in the log", source=str(log))
    return max(parsed.rows, key=lambda r: r.size_bytes).out_of_place.busbw_gbs


def _one(pool: ExecutorPool, a: Node, b: Node, hca: str, peer_hca: str, seconds: int,
         log: Path) -> float | None:
    """Server on b, client on a; the client's average Gb/s at its largest size."""
    timeout = seconds + 60

    def side(n: Node) -> str:
        if n is b:
            return pool(b).run(rdma_command(peer_hca, seconds), timeout=timeout).stdout
        time.sleep(SERVER_START_S)
        res = pool(a).run(rdma_command(hca, seconds, server=b.host or b.name), timeout=timeout,
                          stdout_path=log)
        return res.stdout if res.ok else ""

    group = fanout([b, a], side, concurrency=2)
    text = group.results.get(a.name, "")
    if not text:
        return None
    try:
        facts = parse_perftest_bw(text)
    except (ParseError, GpuvetError):
        return None
    row = facts.largest
    if row is None:
        return None
    return row.bw_average if facts.unit == "Gb/sec" else row.bw_average * 8 / 1000
