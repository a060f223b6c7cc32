"""The fleet step: which node, which link, on 2 to 1,000 nodes of a provider.

Per provider with two or more nodes:

1. *prepare*, one unit per node: the payload pushed (torch) or nccl-tests built
   (nccl-tests), and whether perftest and HCAs are there. A node that fails it
   is left out of the plan.
2. *pairs* (or the *ring*): `plan.fleet_plan`'s rounds, each round's disjoint
   jobs at once (at most `settings.concurrency`), each job one mpirun or one
   torchrun per node for each of `fleet.collectives` in turn, every job a unit of
   the step driver whose records reach the run as it finishes. A node the
   controller loses is dropped and the rest of the plan is recomputed without it
   (`plan.replan`).
3. *localise* each collective on its own against its own median pair and band,
   then *re-pair* every suspect of any collective with nodes that passed them all
   and run every suspect link again; localise again: confirmed suspects are named,
   with the collective they are slow in.
4. *groups* (`--plan groups`) of 4/8/16 and the whole fleet over the nodes
   that passed; the whole-fleet torch run times every rank at a barrier for
   the straggler analysis.
5. *RDMA*: `ib_write_bw` per HCA between first-round partners where perftest
   is installed on both (`rdma.py`), and the rail table from its results
   (`rails.py`: each HCA against the median rail, with the GPUs near it).

The InfiniBand/RoCE ports of every node with HCAs are read from sysfs before the
plan and after it (`judging.fabric.Around`): error counters that grew during the
load are findings naming the node, device and port.

Findings are made by `verdict.py` from the typed results.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from orchestrator import bands as bands_mod
from orchestrator import nccltests
from orchestrator import payload as payload_mod
from orchestrator.errors import GpuvetError, ParseError, StepError
from orchestrator.executors import ExecutorPool
from orchestrator.executors.base import ProgressHook, is_unreachable
from orchestrator.inventory import Inventory, Node
from orchestrator.judging.fabric import Around
from orchestrator.nccltests import BuildDoc
from orchestrator.parsers.nccl_debug import parse_nccl_debug
from orchestrator.parsers.nccl_tests import parse_nccl_tests
from orchestrator.parsers.topology import parse_topo_m
from orchestrator.records import Finding, Measurement, UnitResult, finding
from orchestrator.steps.driver import (
    StageTracker,
    UnitFailed,
    drive,
    node_unit,
    provider_unit,
    step_pool,
)
from orchestrator.steps.fleet import engines, rdma, resume, verdict
from orchestrator.steps.fleet import localise as L
from orchestrator.steps.fleet import plan as P
from orchestrator.steps.fleet.state import JobRecord, ProviderFleet
from orchestrator.store import Run, atomic_write
from orchestrator.suite import Suite
from payload.allreduce import SKIPPED, busbw_factor, parse_size
from payload.allreduce import sizes as size_list
from payload.scrub import scrub_text

STEP = engines.STEP
TOPO_MARK = "GPUVET_TOPO_M"
# perftest, the HCAs, and the topology (which GPUs sit near each NIC, for the rail table)
PROBE = ("command -v ib_write_bw >/dev/null 2>&1 && echo perftest=yes || echo perftest=no; "
         "ls /sys/class/infiniband 2>/dev/null | sed 's/^/hca=/'; "
         f"echo {TOPO_MARK}; nvidia-smi topo -m 2>/dev/null || true")


@dataclass
class FleetRun:
    findings: list[Finding] = field(default_factory=list)
    providers: list[ProviderFleet] = field(default_factory=list)


def _gpus(inv: Inventory, n: Node, build: BuildDoc | None) -> int:
    if build is not None and build.gpus:
        return int(build.gpus)
    return int(inv.provider_of(n).expect.gpus_per_node or 1)


def _transport(text: str) -> str | None:
    """NET/IB, NET/Socket, ... from NCCL INFO lines; None when the log has none."""
    try:
        facts = parse_nccl_debug(text)
    except ParseError:
        return None
    nets = sorted({c.net for c in facts.connections if c.transport == "NET" and c.net})
    if nets:
        return ", ".join(f"NET/{x}" for x in nets)
    if facts.networks:
        return ", ".join(f"NET/{x}" for x in facts.networks)
    return None


def run_fleet(inv: Inventory, nodes: list[Node], run: Run, suite: Suite, *,
              pool: ExecutorPool | None = None, accept_new_host_keys: bool = False,
              progress: ProgressHook | None = None) -> FleetRun:
    """The fleet step over `nodes`, provider by provider; records go to `run`."""
    params = suite.fleet_params
    out = FleetRun()
    provs = list(dict.fromkeys(n.provider for n in nodes))
    complete = resume.restart_unfinished(run, nodes)
    with step_pool(inv, pool, accept_new_host_keys) as p:
        for prov in provs:
            if prov in complete:
                continue  # judged in full before the run was interrupted: its records stand
            members = [n for n in nodes if n.provider == prov]
            if len(members) < 2:
                out.findings.append(one := finding(
                    run.run_id, STEP, provider=prov, node=None, code="FLEET_NOT_APPLICABLE",
                    severity="INFO", message=f"[fleet] provider {prov} has {len(members)} node "
                    "selected: pairs need two or more nodes, the fleet step is skipped"))
                run.add_findings([one])
                continue
            pf = ProviderFleet(prov, members, params)
            _Runner(inv, run, suite, p, pf, progress).go()
            out.providers.append(pf)
            judged = verdict.judge(run, inv, pf)
            for f in judged:
                f.unit_key = f.unit_key or resume.judged_key(prov)
            run.add_findings(judged)
            run.mark_done(resume.judged_key(prov), STEP, {"findings": len(judged)})
            out.findings += judged
    return out


class _Runner:
    def __init__(self, inv: Inventory, run: Run, suite: Suite, pool: ExecutorPool,
                 pf: ProviderFleet, progress: ProgressHook | None) -> None:
        self.inv, self.run, self.suite, self.pool, self.pf = inv, run, suite, pool, pf
        self.p = pf.params
        self.progress = progress
        self.out_dir = run.provider_dir(pf.provider, STEP)
        self.by_name = {n.name: n for n in pf.nodes}
        self.nccl = engines.nccl_params(self.p, suite.nccl)
        self.sizes = size_list(parse_size(self.p.min_bytes), parse_size(self.p.max_bytes),
                               self.p.step_factor, 4)
        self.port_seq = 0

    # --- the phases ---------------------------------------------------------------------

    def go(self) -> None:
        self.prepare()
        alive = self.pf.alive
        if len(alive) < 2:
            return
        self.fabric("before")
        plan = P.fleet_plan(alive, "ring" if self.p.plan == "ring" else "pairs",
                            partners=self.p.partners, seed=self.p.seed)
        self.rounds(plan)
        self.pf.first = self.localise()
        sus, passed, links = L.repair_inputs_all(self.pf.first)
        passed = [n for n in passed if n not in self.pf.dropped]
        sus = [n for n in sus if n not in self.pf.dropped]
        links = [lk for lk in links if not set(lk) & set(self.pf.dropped)]
        if (sus or links) and passed:
            met = P.partners_of(r.job for r in self.pf.jobs)
            rep = P.repair_rounds(sus, passed, met=met, partners=self.p.repair_partners,
                                  links=links, seed=self.p.seed, start=self._next_index())
            self.rounds(P.Plan(plan.kind, plan.nodes, plan.seed, 0, rep), top_up=False)
        self.pf.final = self.localise()
        if self.p.plan == "groups":
            ok = [n for n in L.healthy_all(self.pf.final) if n not in self.pf.dropped]
            if len(ok) >= 3:
                self.rounds(P.Plan("groups", tuple(ok), plan.seed, 0,
                                   P.group_rounds(ok, start=self._next_index())), top_up=False)
        if self.p.rdma:
            rdma.run_rdma(self.inv, self.run, self.pool, self.pf, self.progress)
        if self.p.rails_nccl:
            if self.p.engine == "nccl-tests":
                rdma.run_nccl_rails(self.inv, self.run, self.pool, self.pf, self.nccl,
                                    self.progress)
            else:
                self.pf.extra.append(finding(
                    self.run.run_id, STEP, provider=self.pf.provider, node=None,
                    code="FLEET_RAILS_NCCL_SKIPPED", severity="INFO",
                    message="[fleet rails nccl] each rail through NCCL needs the nccl-tests "
                            "engine (NCCL_IB_HCA per node); the torch engine ran"))
        rdma.rail_findings(self.run, self.pf)
        self.fabric("after")
        if self.pf.fabric is not None:
            measured = [self.by_name[n] for n in self.pf.alive]
            self.pf.extra += self.pf.fabric.findings(measured)

    def _next_index(self) -> int:
        return (self.pf.executed[-1].index + 1) if self.pf.executed else 0

    def localise(self) -> dict[str, L.Localisation]:
        """Each collective on its own: its pairs against its own median pair and the bands
        of that collective only (an all_reduce band says nothing of an alltoall)."""
        inv_bands = self.inv.providers[self.pf.provider].expect.nccl_busbw
        given = [] if inv_bands is None else (
            inv_bands if isinstance(inv_bands, list) else [inv_bands])
        out: dict[str, L.Localisation] = {}
        for coll in self.p.collectives:
            samples = self.pf.samples.get(coll)
            if samples:
                out[coll] = L.localise(
                    samples, bands=bands_mod.of_collective(given or self.pf.shipped, coll),
                    tolerance=self.p.tolerance, min_size=parse_size(self.p.min_judged_bytes))
        return out

    def prepare(self) -> None:
        archive = (nccltests.source_archive(self.nccl, self.run.dir / ".staging")
                   if self.p.engine == "nccl-tests" else None)

        def work(n: Node, stage: StageTracker) -> UnitResult:
            ex = self.pool(n)
            with stage("prepare"):
                if self.p.engine == "nccl-tests":
                    self.pf.builds[n.name] = engines.build_nccl_tests(
                        self.pool, n, self.run, self.nccl, archive)
                else:
                    res = payload_mod.run(ex, ["allreduce-bench", "--help"],
                                          staging=self.run.dir / ".staging", timeout=300)
                    res.raise_for_status("the payload on the node")
                probe = ex.run(PROBE, timeout=60)
            head, _, topo = (probe.stdout if probe.ok else "").partition(TOPO_MARK + "\n")
            lines = head.splitlines()
            self._topology(n, topo)
            info: dict[str, object] = {
                "perftest": "perftest=yes" in lines,
                "hcas": [x[4:] for x in lines if x.startswith("hca=") and x[4:].strip()]}
            self.pf.prepared[n.name] = info
            return UnitResult(summary={"probe": info})

        units = [node_unit(n, functools.partial(work, n)) for n in self.pf.nodes]
        driven = drive(self.run, STEP, units, concurrency=self.inv.settings.concurrency,
                       progress=self.progress)
        for key, f in driven.failed.items():
            name = key.partition(":")[2]
            self.pf.dropped[name] = f"{f.code}: {f.message}"

    def _topology(self, n: Node, text: str) -> None:
        """The node's `nvidia-smi topo -m`, kept as evidence; parsed for the rail table."""
        if not text.strip():
            return
        path = self.run.node_dir(n.name, STEP) / "topo_m.txt"
        atomic_write(path, scrub_text(text), durable=False)
        try:
            topo = parse_topo_m(text, source=self.run.rel(path))
        except ParseError:
            return
        with self.pf.lock:
            self.pf.topo[n.name] = topo

    def fabric(self, when: str) -> None:
        """The ports of the nodes that have HCAs, before the plan and after it (RDMA too)."""
        if self.pf.fabric is None:
            self.pf.fabric = Around(self.run, STEP, "fleet",
                                    concurrency=self.inv.settings.concurrency)
        nodes = [self.by_name[n] for n in self.pf.alive if _hcas_of(self.pf, n)]
        if nodes:
            self.pf.fabric.take(self.pool, nodes, when)

    def rounds(self, plan: P.Plan, *, top_up: bool = True) -> None:
        """Run a plan's rounds; when nodes drop out, recompute the rest without them."""
        rest = list(plan.rounds)
        done: list[P.Round] = []
        while rest:
            r = rest.pop(0)
            lost = self.round(r)
            done.append(r)
            if lost and (rest or top_up):
                new_drop = set(self.pf.dropped)
                whole = P.Plan(plan.kind, plan.nodes, plan.seed, plan.partners if top_up else 0,
                               (*done, *rest))
                done_jobs = [j.job for j in self.pf.jobs if j.failed is None]
                rest = list(P.replan(whole, len(done), new_drop, completed=done_jobs)) \
                    if top_up else [_without(x, new_drop) for x in rest]
                rest = [x for x in rest if x.jobs]

    def round(self, r: P.Round) -> set[str]:
        """One round's jobs at once; the nodes lost in it, now dropped."""
        lost: set[str] = set()
        units = [provider_unit(self.pf.provider, f"fleet/{r.stage}-r{r.index}/{j.key}",
                               functools.partial(self.job, r, j, lost)) for j in r.jobs]
        drive(self.run, STEP, units, concurrency=self.inv.settings.concurrency,
              progress=self.progress)
        self.pf.executed.append(r)
        for n in sorted(lost):
            self.pf.dropped.setdefault(n, "unreachable during the plan")
        return lost

    # --- one job ------------------------------------------------------------------------

    def job(self, r: P.Round, j: P.Job, lost: set[str], stage: StageTracker) -> UnitResult:
        """Each of the suite's collectives in turn on the job's nodes, each its own run and
        log under its own stall bound. A node lost fails the whole job (it is dropped and
        the plan recomputed); a collective that failed while every node still answers is
        that collective's failure (0 GB/s in its table), and the others still count."""
        label = f"{r.stage}-r{r.index}_{j.key}"
        members = [self.by_name[x] for x in j.nodes]
        done: list[_Judged] = []
        failed: list[tuple[str, engines.JobFailed]] = []
        for i, coll in enumerate(self.p.collectives):
            try:
                with stage("execute"):
                    out = self._engine(members, label, r.stage == "whole" and i == 0, coll)
                with stage("judge"):
                    done.append(self._judge(r, j, out, coll))
            except engines.JobFailed as exc:
                gone = set(exc.unreachable) | self._unreachable(members)
                if gone:
                    with self.pf.lock:
                        lost |= gone
                    raise UnitFailed(f"{exc.what}; unreachable: {', '.join(sorted(gone))}",
                                     "FLEET_JOB_FAILED", exc.evidence, hint=exc.hint) from exc
                failed.append((coll, exc))
        with self.pf.lock:
            for d in done:
                self._keep(j, d)
            for c, e in failed:
                self._record_failed(r, j, c, e.what, e.evidence)
        if failed and not done:
            raise UnitFailed("; ".join(e.what for _, e in failed), "FLEET_JOB_FAILED",
                             [x for _, e in failed for x in e.evidence], hint=failed[0][1].hint)
        fs = [finding(self.run.run_id, STEP, provider=self.pf.provider, node=None,
                      code="FLEET_JOB_FAILED", severity="FAIL", message=e.what,
                      evidence=e.evidence, stage="execute", collective=c,
                      **({"hint": e.hint} if e.hint else {}))
              for c, e in failed]
        first = next((d for d in done if d.skipped is None), done[0])
        return UnitResult(findings=fs, measurements=[m for d in done for m in d.measurements],
                          summary={"log": first.log, "transport": first.record.transport,
                                   "collectives": {d.record.collective: d.log for d in done},
                                   **({"failed": [c for c, _ in failed]} if failed else {})})

    def _engine(self, members: Sequence[Node], label: str, whole: bool,
                collective: str) -> engines.JobOutput:
        if self.p.engine == "nccl-tests":
            return engines.run_nccl_tests(self.pool, members, self.run, self.nccl, self.out_dir,
                                          label, builds=self.pf.builds,
                                          stall_s=self.p.stall_timeout_s,
                                          collective=collective)
        with self.pf.lock:
            self.port_seq += 1
            seq = self.port_seq
        port = engines.free_port() if members[0].executor == "local" else \
            self.p.master_port + seq % 2000
        gpus = {n.name: _gpus(self.inv, n, None) for n in members}
        return engines.run_torch(self.pool, members, self.run, self.p, self.out_dir, label,
                                 port=port, gpus=gpus, rank_times=whole,
                                 collective=collective)

    def _unreachable(self, members: Sequence[Node]) -> set[str]:
        """After a failed job: which of its nodes still answer."""
        gone = set()
        for n in members:
            try:
                self.pool(n).run("true", timeout=30).raise_for_status("a liveness check")
            except GpuvetError as exc:
                if is_unreachable(exc) or isinstance(exc, StepError):
                    gone.add(n.name)
        return gone

    def _record_failed(self, r: P.Round, j: P.Job, collective: str, why: str,
                       evidence: list[str]) -> None:
        """A pair whose nodes both answer but whose collective failed: 0 GB/s at every
        size, so a node all of whose pairs fail is a suspect like a slow one."""
        rec = JobRecord(j, r.stage, r.index, evidence, failed=why, collective=collective)
        self.pf.jobs.append(rec)
        if len(j.nodes) == 2:
            self.pf.samples.setdefault(collective, []).extend(
                L.PairSample((j.nodes[0], j.nodes[1]), r.stage, r.index, size, 0.0,
                             evidence=tuple(evidence)) for size in self.sizes)

    def _keep(self, j: P.Job, d: _Judged) -> None:
        """One collective's judged run of a job into the provider's state (under its lock)."""
        rec = d.record
        self.pf.jobs.append(rec)
        if d.skipped is not None:
            self.pf.skipped.setdefault(rec.collective, (d.skipped, list(rec.files)))
            return
        if len(j.nodes) == 2:
            self.pf.samples.setdefault(rec.collective, []).extend(
                L.PairSample((j.nodes[0], j.nodes[1]), rec.stage, rec.round, size, value,
                             evidence=tuple(rec.files)) for size, value in rec.busbw.items())
            if not self.pf.shipped and d.gpu_name and self.p.engine == "nccl-tests":
                ref = bands_mod.find_shipped(d.gpu_name, max(1, d.ranks // 2), 2)
                self.pf.shipped = list(ref.bands) if ref is not None else []

    def _judge(self, r: P.Round, j: P.Job, out: engines.JobOutput,
               collective: str) -> _Judged:
        # the pairs are compared on busbw from each row's time: nccl-tests prints busbw
        # with two decimals, which at the rates of a TCP fallback or a loaded link
        # (0.02 against 0.04 GB/s) leaves the ratio to rounding
        rel = self.run.rel(out.log)
        text = out.log.read_text(errors="replace") if out.log.is_file() else ""
        files = [self.run.rel(f) for f in out.files]
        skipped = _skipped(text)
        if skipped is not None:  # the torch backend has no such collective (gloo's
            # reduce_scatter in some torch versions): said once, never a slow pair
            return _Judged(JobRecord(j, r.stage, r.index, files, collective=collective), rel,
                           skipped=skipped)
        try:
            parsed = parse_nccl_tests(text, source=rel)
        except ParseError as exc:
            raise engines.JobFailed(f"{j.key}: {exc.what}", evidence=[rel]) from exc
        if parsed.op and parsed.op != collective:
            raise engines.JobFailed(f"{j.key}: the log is of {parsed.op}, not of the "
                                    f"{collective} that was run", evidence=[rel])
        if not parsed.rows:
            raise engines.JobFailed(f"{j.key}: no result rows in the log", evidence=[rel])
        odd = [row.size_bytes for row in parsed.rows if not all(
            math.isfinite(x) and x >= 0 for x in (row.out_of_place.busbw_gbs,
                                                  row.in_place.busbw_gbs))]
        if odd:
            raise engines.JobFailed(f"{j.key}: bandwidth that is not a number at "
                                    f"{len(odd)} size(s) of the log", evidence=[rel])
        extra = out.stderr.read_text(errors="replace") if out.stderr is not None else ""
        rec = JobRecord(j, r.stage, r.index, files, transport=_transport(text + "\n" + extra),
                        rank_times=out.rank_times, collective=collective)
        engine = self.p.engine
        ms: list[Measurement] = []
        ranks = len(parsed.ranks) or len(j.nodes)
        for row in parsed.rows:
            rec.busbw[row.size_bytes] = _busbw_from_time(row.size_bytes, row.out_of_place.time_us,
                                                         ranks, row.out_of_place.busbw_gbs,
                                                         collective)
            for inplace, half in ((False, row.out_of_place), (True, row.in_place)):
                for metric, value, unit in (("busbw", half.busbw_gbs, "GB/s"),
                                            ("algbw", half.algbw_gbs, "GB/s"),
                                            ("time", half.time_us, "us")):
                    ms.append(Measurement(
                        run_id=self.run.run_id, provider=self.pf.provider, nodes=list(j.nodes),
                        step=STEP, metric=metric, value=value, unit=unit,
                        suite_hash=self.suite.hash, scope="multi", engine=engine,
                        size=row.size_bytes, inplace=inplace, round=r.index,
                        # the collective in the nccl step's tag: compare and regress keep
                        # each collective's series apart
                        tags={"stage": r.stage, "job": j.key, "op": collective}))
        return _Judged(rec, rel, measurements=ms,
                       gpu_name=parsed.ranks[0].name if parsed.ranks else None,
                       ranks=len(parsed.ranks))


@dataclass
class _Judged:
    """One collective's run of a job, judged: kept in the provider's state once the job's
    every collective has run."""

    record: JobRecord
    log: str
    measurements: list[Measurement] = field(default_factory=list)
    skipped: str | None = None  # why the benchmark did not run this collective
    gpu_name: str | None = None
    ranks: int = 0


def _skipped(text: str) -> str | None:
    """The torch benchmark's reason for not running its collective, else None."""
    for line in text.splitlines():
        if line.startswith(SKIPPED):
            return line[len(SKIPPED):].strip()
    return None


def _hcas_of(pf: ProviderFleet, node: str) -> list[str]:
    hcas = (pf.prepared.get(node) or {}).get("hcas")
    return [str(h) for h in hcas] if isinstance(hcas, list) else []


def _without(r: P.Round, drop: set[str]) -> P.Round:
    keep = tuple(j for j in r.jobs if not drop & set(j.nodes))
    return P.Round(r.stage, r.index, keep, tuple(n for n in r.idle if n not in drop))


def _busbw_from_time(size: int, time_us: float, ranks: int, printed: float,
                     collective: str = "all_reduce") -> float:
    """A collective's bus bandwidth, GB/s, from the size and the time of one iteration
    (busbw = size / time x the collective's factor, as nccl-tests computes it: 2(n-1)/n
    for all_reduce, (n-1)/n for all_gather, reduce_scatter and alltoall), to more digits
    than the table prints; the printed figure where the time is not usable."""
    if not (math.isfinite(time_us) and time_us > 0) or ranks < 2:
        return printed
    return size / (time_us * 1e3) * busbw_factor(collective, ranks)
