"""Turn nccl-tests (or torch benchmark) logs into measurements and findings.

Shared by live runs and `gpuvet import nccl-tests`: whatever produced a log,
the same rules judge it. Nothing here reads anything but the saved logs.

One GPU has nothing to all-reduce with: its busbw is 0 by definition and its
algbw is the rate of a copy inside the device. Such a series says so
(NCCL_NOT_APPLICABLE), keeps the algbw as the local copy rate it is, and is
never judged against bandwidth bands or for stability. A log a person edited
says which line shows it (NCCL_LOG_EDITED); the lines read past as launcher or
shell noise are counted (NCCL_LOG_NOISE).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator import bands, stats
from orchestrator.errors import ParseError
from orchestrator.inventory import Fabric, Inventory, Node
from orchestrator.nccltests import BuildDoc
from orchestrator.parsers._nccl_common import (
    NcclTestsRun,
    count_ranks,
    footer_not_pasted,
    harmless_warning,
    max_bytes,
)
from orchestrator.parsers.nccl_debug import parse_nccl_debug
from orchestrator.parsers.nccl_tests import parse_nccl_tests
from orchestrator.records import Finding, Measurement, MeasureScope, Severity, finding
from orchestrator.steps.nccl.network import judge_network
from orchestrator.steps.nccl.traits import series_traits
from orchestrator.store import Run
from orchestrator.suite import Suite
from payload.allreduce import BUSBW_FACTORS, busbw_factor

STEP = "nccl"
NCCL_MSG = re.compile(r"\bNCCL WARN (.*)$")
# Below 16 MiB a round takes tens of microseconds on NVLink: round-to-round
# differences there are latency jitter, not bandwidth, and are not judged.
SMALLEST_JUDGED = 16 << 20


@dataclass
class Series:
    """One scope's rounds: (round, log path, timed out).

    `nodes` are the inventory nodes the series ran on; an imported series has
    none (it names `provider` and how many nodes it spanned in `n_nodes`).
    """

    scope: MeasureScope  # single | multi
    nodes: list[Node]
    logs: list[tuple[int, Path, bool]]
    build: BuildDoc | None = None
    engine: str = "nccl-tests"  # nccl-tests | torch
    provider: str | None = None
    n_nodes: int | None = None
    imported: bool = False
    # the collective the live step ran (an import reads it from each log's binary)
    collective: str | None = None
    # normal, or network: P2P and SHM off, every rank through the NICs (network.py)
    mode: str = "normal"

    @property
    def node(self) -> str | None:
        """The node a single-node live series is about; None for provider-wide ones."""
        if self.scope == "single" and len(self.nodes) == 1 and not self.imported:
            return self.nodes[0].name
        return None

    @property
    def prov(self) -> str:
        return self.provider or self.nodes[0].provider

    @property
    def label(self) -> str:
        base = self.scope if self.engine == "nccl-tests" else f"{self.engine} {self.scope}"
        if self.mode != "normal":
            base = f"{base} {self.mode}"
        return base if self.collective in (None, "all_reduce") else f"{base} {self.collective}"

    @property
    def node_count(self) -> int:
        return self.n_nodes or len(self.nodes) or 1


def judge_series(s: Series, run: Run, inv: Inventory | None, suite: Suite,
                 suite_hash: str | None = None) -> tuple[list[Finding], list[Measurement]]:
    findings: list[Finding] = []
    ms: list[Measurement] = []

    def add(code: str, sev: Severity, msg: str, ev: list[str] | None = None,
            **details: Any) -> None:
        findings.append(finding(run.run_id, STEP, provider=s.prov, node=s.node, code=code,
                                severity=sev, message=f"[{s.label}] {msg}", evidence=ev or [],
                                scope=s.scope, engine=s.engine, **details))

    parsed: list[tuple[int, NcclTestsRun, str]] = []
    one_gpu = False
    first: tuple[str, str] | None = None  # the first readable round's text and path
    for rnd, path, timed_out in s.logs:
        rel = _rel(run, path)
        if timed_out:
            add("NCCL_TIMEOUT", "FAIL", f"round {rnd} hung and was killed after "
                f"{suite.nccl.timeout_s:.0f} s", [rel])
        text = path.read_text(errors="replace") if path.is_file() else ""
        try:
            res = parse_nccl_tests(text, source=rel)
        except ParseError as exc:
            add("NCCL_OUTPUT_UNREADABLE", "FAIL", f"round {rnd}: {exc.what}", [rel])
            continue
        if s.collective is not None and res.op is not None and res.op != s.collective:
            add("NCCL_WRONG_COLLECTIVE", "FAIL", f"round {rnd}: the log is of {res.op}, "
                f"{s.collective} was run", [rel], op=res.op, collective=s.collective)
            continue
        parsed.append((rnd, res, rel))
        if first is None:
            first = (text, rel)
        one_gpu = one_gpu or is_one_gpu(res)
        _paste(res, rnd, rel, add)
        for fl in res.failures:
            add("NCCL_TEST_FAILURE", "FAIL", f"round {rnd}, line {fl.line_no}: {fl.kind}: "
                f"{fl.text.strip()[:200]}", [rel], line=fl.line_no, kind=fl.kind)
        if footer_not_pasted(res):
            add("NCCL_FOOTER_NOT_PASTED", "INFO", f"round {rnd}: the table reaches its last "
                f"size ({bands.size_text(max_bytes(res) or 0)}, maxBytes) and stops there: the footer "
                "(out-of-bounds count, average) was not pasted; the rows are read", [rel])
        elif res.truncated:
            add("NCCL_TRUNCATED", "FAIL", f"round {rnd}: output ends inside the table "
                "(the run crashed or was killed)", [rel])
        if not res.rows and res.rows_elided and not res.failures:
            avg = (f"the footer after the cut says avg busbw {res.avg_busbw_reported}"
                   if res.avg_busbw_reported is not None else "only the footer is left")
            add("NCCL_ROWS_ELIDED", "INFO", f"round {rnd}: the table was cut out by hand "
                f"({avg}): nothing to measure", [rel],
                avg_busbw_reported=res.avg_busbw_reported)
        elif not res.rows and not res.failures and not timed_out:
            add("NCCL_NO_RESULTS", "FAIL", f"round {rnd}: no result rows", [rel])
        if res.rows and res.rows_elided and res.avg_busbw_reported is not None:
            add("NCCL_AVG_NOT_CHECKED", "INFO", f"round {rnd}: rows were cut out by hand, so "
                f"the reported average bus bandwidth {res.avg_busbw_reported} is not checked "
                "against the rows shown", [rel])
        elif res.avg_busbw_agrees is False:
            add("NCCL_AVG_MISMATCH", "WARN", f"round {rnd}: reported average bus bandwidth "
                f"{res.avg_busbw_reported} differs from the rows' mean "
                f"{res.avg_busbw_recomputed:.3f}", [rel])
        ms += _measurements(s, run, suite_hash or suite.hash, rnd, res, one_gpu)
        if s.engine == "nccl-tests":
            _transports(s, text, rnd, rel, inv, add)
    top = None
    if parsed and one_gpu:
        _not_applicable(parsed, add)
    elif parsed:
        top = _stability(s, parsed, suite, inv, add, _traits(s, run, parsed[0][1], first))
    if s.mode == "network" and parsed and not one_gpu and first is not None:
        _network(s, inv, first, parsed[0][1], top, add)
    return findings, ms


def _traits(s: Series, run: Run, res: NcclTestsRun,
            first: tuple[str, str] | None) -> bands.NodeTraits:
    """What the series' log and, for a live run, preflight's facts say of the machine."""
    text = first[0] if first else ""
    try:
        dbg = parse_nccl_debug(text) if "NCCL INFO" in text else None
    except ParseError:
        dbg = None
    gpus = gpu_count(res) or len(res.ranks) or None
    return series_traits(
        gpu=res.ranks[0].name if res.ranks else None,
        gpus=gpus // s.node_count if gpus else None, nodes=s.node_count,
        live=not s.imported and bool(s.nodes), node_names=[n.name for n in s.nodes],
        run_dir=run.dir, text=text, dbg=dbg, node_env={n.name: n.env for n in s.nodes})


TORCH_HEADER = re.compile(r"^# gpuvet torch\.distributed \S+ benchmark, torch \S+, "
                          r"backend (?P<backend>\w+)", re.M)


def _network(s: Series, inv: Inventory | None, first: tuple[str, str], res: NcclTestsRun,
             top: stats.SizeStats | None, add: Any) -> None:
    """The network mode's judge (network.py) on the first round's NCCL INFO lines and the
    busbw at the largest size."""
    text, rel = first
    if s.engine == "torch":
        m = TORCH_HEADER.search(text)
        if m and m["backend"] != "nccl":
            add("NCCL_NETWORK_NOT_MEASURED", "INFO",
                f"the transport, GPUDirect RDMA and busbw per NIC are GPU-only and not "
                f"measured: the torch engine ran on {m['backend']} (CPU tensors over TCP), "
                "which has no NCCL transport, no GPU memory for a NIC to reach, and its "
                "bandwidth is the host's, not the NICs'", [rel], backend=m["backend"])
            return
    try:
        dbg = parse_nccl_debug(text, source=rel)
    except ParseError:
        dbg = None
    fabric = inv.provider_of(s.nodes[0]).expect.fabric if inv is not None and s.nodes \
        else Fabric()
    gpus = gpu_count(res)
    per_node = gpus // s.node_count if gpus else None
    for r in judge_network(dbg, fabric, busbw=top.median if top else None,
                           size=bands.size_text(top.size_bytes) if top else None,
                           ranks_per_node=per_node):
        add(r.code, r.severity, r.message, [rel], **r.details)


def gpu_count(res: NcclTestsRun) -> int | None:
    """How many GPUs the run spanned: at least what any source in the log says (rank lines,
    the highest rank, NCCL INFO, the launcher); None when no rank line, NCCL INFO line or
    launcher says (`nGpus 1` is per process, and mpirun may have started eight)."""
    rc = res.ranks_total or count_ranks(res)
    return rc.count if rc.shown or rc.nccl or rc.launched else None


def is_one_gpu(res: NcclTestsRun) -> bool:
    """One GPU only when the log shows exactly one rank and no source says more."""
    return (res.ranks_total or count_ranks(res)).one_gpu


def _not_applicable(parsed: list[tuple[int, NcclTestsRun, str]], add: Any) -> None:
    res = parsed[0][1]
    rounds = [{row.size_bytes: row.out_of_place.algbw_gbs for row in r.rows} for _, r, _ in parsed]
    table = stats.stability(rounds)
    gpu = f" ({res.ranks[0].host}, {res.ranks[0].name})" if res.ranks else ""
    copy = (f"; algbw {table[-1].median:.1f} GB/s at {bands.size_text(table[-1].size_bytes)} (median of "
            f"{len(table[-1].values)} round(s)) is the device-local copy rate, kept as such"
            if table else "")
    add("NCCL_NOT_APPLICABLE", "INFO", f"one GPU{gpu}: nothing to {res.op or 'communicate'} "
        f"with, busbw is 0 by definition and is not judged{copy}",
        [rel for _, _, rel in parsed], gpus=1,
        local_copy_gbs=table[-1].median if table else None)


def _paste(res: NcclTestsRun, rnd: int, rel: str, add: Any) -> None:
    """What a person's editing and the launcher's chatter did to the log, said once each."""
    if res.edits:
        first = res.edits[0]
        where = f"line {first.line_no}: " if first.line_no is not None else ""
        add("NCCL_LOG_EDITED", "WARN", f"round {rnd}: the log was edited by hand ({where}"
            f"{first.what}{f'; {len(res.edits) - 1} more' if len(res.edits) > 1 else ''}): "
            "what it holds is read, what was cut is unknown", [rel],
            line=first.line_no, edits=[e.model_dump() for e in res.edits])
    harmless = [i for i in res.ignored_lines if i.kind == "nccl-warn-harmless"]
    if harmless:
        m = NCCL_MSG.search(harmless[0].text)
        why = harmless_warning(m[1]) if m else None
        add("NCCL_WARN_HARMLESS", "INFO", f"round {rnd}: {len(harmless)} NCCL WARN line(s) "
            f"report no fault (first, line {harmless[0].line_no}: "
            f"{harmless[0].text.strip()[:100]!r}): {why or 'a known harmless message'}",
            [rel], lines=[i.line_no for i in harmless][:50])
    # known launcher and shell noise is listed in the parsed facts; text nobody knows is
    # said here, since it may be what a person pasted in
    unknown = [i for i in res.ignored_lines if i.kind == "unknown"]
    if unknown:
        add("NCCL_LOG_NOISE", "INFO", f"round {rnd}: {len(unknown)} line(s) are neither "
            f"nccl-tests output nor known launcher noise, read past (first, line "
            f"{unknown[0].line_no}: {unknown[0].text.strip()[:80]!r})", [rel],
            lines=[i.line_no for i in unknown][:50])


def _rel(run: Run, path: Path) -> str:
    try:
        return run.rel(path)
    except ValueError:
        return str(path)


def _measurements(s: Series, run: Run, suite_hash: str, rnd: int, res: NcclTestsRun,
                  one_gpu: bool = False) -> list[Measurement]:
    """The rows as printed; on one GPU only algbw and time, tagged as a local copy."""
    out = []
    tags_base: dict[str, Any] = {"op": res.op or s.collective, "nccl_version": res.nccl_version,
                 "nccl_tests_commit": s.build.built_commit if s.build else None,
                 "nccl_tests_version": res.tests_version,
                 "gpus": gpu_count(res), "n_nodes": s.node_count}
    if s.imported:
        tags_base["imported"] = True
    if s.mode != "normal":
        tags_base["mode"] = s.mode  # compare and regress keep its series apart
    if one_gpu:
        tags_base["local_copy"] = True
    nodes = [n.name for n in s.nodes]
    for row in res.rows:
        for inplace, r in ((False, row.out_of_place), (True, row.in_place)):
            for metric, value, unit in (("busbw", r.busbw_gbs, "GB/s"),
                                        ("algbw", r.algbw_gbs, "GB/s"),
                                        ("time", r.time_us, "us")):
                if one_gpu and metric == "busbw":
                    continue
                out.append(Measurement(
                    run_id=run.run_id, provider=s.prov, nodes=nodes, step=STEP,
                    metric=metric, value=value, unit=unit, suite_hash=suite_hash,
                    scope=s.scope, engine=s.engine, size=row.size_bytes, inplace=inplace,
                    round=rnd, tags={**tags_base, "type": row.type, "wrong": r.wrong}))
    return out


def _transports(s: Series, text: str, rnd: int, rel: str, inv: Inventory | None,
                add: Any) -> None:
    try:
        dbg = parse_nccl_debug(text, source=rel)
    except ParseError:
        return  # no NCCL INFO lines in this log: nothing to say about transports
    if rnd == 1:
        add("NCCL_TRANSPORTS", "INFO", dbg.summary(), [rel], transports=dbg.used,
            n_nodes=dbg.n_nodes, interfaces=dbg.nics, networks=dbg.networks)
    if s.scope != "multi" or inv is None or not s.nodes or s.mode == "network":
        return  # the network mode says it in its own judge (network.py)
    fabric = inv.provider_of(s.nodes[0]).expect.fabric.type
    sockets = [c for c in dbg.connections
               if c.transport == "NET" and (c.net or "").lower() == "socket"]
    if fabric in ("ib", "roce", "efa") and sockets:
        lines = sorted({c.line_no for c in sockets})[:5]
        add("NCCL_SOCKET_FALLBACK", "FAIL",
            f"round {rnd}: {fabric} was ordered but NCCL talks between nodes over TCP sockets "
            f"(NET/Socket, log lines {', '.join(map(str, lines))}); check the RDMA devices, "
            "NCCL_IB_HCA and the network plugin", [rel], lines=lines)


def _stability(s: Series, parsed: list[tuple[int, NcclTestsRun, str]], suite: Suite,
               inv: Inventory | None, add: Any,
               traits: bands.NodeTraits | None = None) -> stats.SizeStats | None:
    """Round-to-round drops, the busbw at the largest size and the bands; returns that
    largest size's figures (None when no row)."""
    rounds = [{row.size_bytes: row.out_of_place.busbw_gbs for row in res.rows}
              for _, res, _ in parsed]
    evidence = [rel for _, _, rel in parsed]
    table = stats.stability(rounds)
    if len(parsed) > 1:
        for st in table:
            if st.size_bytes < SMALLEST_JUDGED:
                continue
            drops = st.drops(suite.nccl.drop_tolerance)
            if drops:
                add("NCCL_ROUND_DROP", "WARN",
                    f"{bands.size_text(st.size_bytes)}: round(s) {drops} more than "
                    f"{suite.nccl.drop_tolerance:.0%} below the median {st.median:.1f} GB/s "
                    f"({', '.join(f'{v:.1f}' for v in st.values)})", evidence,
                    size=st.size_bytes, values=list(st.values))
    if not table:
        return None
    top = table[-1]
    add("NCCL_BUSBW", "INFO", f"busbw at {bands.size_text(top.size_bytes)}: median {top.median:.1f} GB/s "
        f"over {len(top.values)} round(s) (min {top.min:.1f}, max {top.max:.1f}, "
        f"cv {top.cv:.1%})", evidence, size=top.size_bytes, median=top.median)
    if s.engine != "nccl-tests" or s.mode == "network":
        return top  # the network mode is judged per NIC against the fabric (network.py)
    choice = _bands(s, parsed[0][1], inv, traits)
    source, every = choice.source, choice.bands
    coll = collective_of(s, parsed[0][1])
    if coll is None:
        add("NCCL_REFERENCE_NONE", "INFO",
            "no reference band applies to this run: the log does not name its collective "
            "(no `Collective test starting` line) and its busbw is not all_reduce's "
            "2(n-1)/n of algbw, so it is judged against no collective's band", evidence)
        return top
    candidates = bands.of_collective(every, coll)
    by_size = {st.size_bytes: st for st in table}
    judged = bands.applicable(candidates, list(by_size), coll)
    if not judged:
        sizes = ", ".join(b.size for b in candidates)
        others = sorted({b.collective for b in every} - {coll})
        mine = "" if coll == "all_reduce" else f" {coll}"
        why: dict[str, Any] = {} if coll == "all_reduce" else {"collective": coll}
        unsure = [a for a in choice.ambiguous if a.startswith(f"{coll} at ")]
        if candidates:
            text = f"the {source}{mine} bands are for {sizes}, which this run did not measure"
        elif unsure:
            text = "; ".join(unsure)
            why["ambiguous"] = unsure
        elif choice.differing:
            text = ("the shipped bands of this GPU assume another machine: "
                    + "; ".join(choice.differing))
            why["assumptions_differ"] = choice.differing
        elif others:
            text = f"the {source} bands are for {', '.join(others)}, never for {coll}"
        else:
            text = (f"none is shipped for{mine or ' this GPU,'}{' on this GPU,' if mine else ''} "
                    f"count and node count, and the inventory sets no{mine} expect.nccl_busbw")
        add("NCCL_REFERENCE_NONE", "INFO", "no reference band applies to this run: " + text,
            evidence, **why)
        return top
    for band in judged:
        st = by_size[band.size_bytes]
        j = band.judge(st.median)
        sev: Severity = "WARN" if j.result == "below" else "PASS" if j.result == "within" \
            else "INFO"
        what = {"below": "below the reference band",
                "within": "within the reference band",
                "above": "above the reference band (faster than the band expects: check "
                         "that the band describes this machine)"}[j.result]
        extra: dict[str, Any] = {} if coll == "all_reduce" else {"collective": coll}
        if band.source:
            extra["reference_source"] = band.source
        if choice.unverified:
            extra["unverified"] = choice.unverified
        add("NCCL_REFERENCE", sev, f"busbw {st.median:.1f} GB/s at {bands.size_text(st.size_bytes)} is "
            f"{what} {band.lower:g}-{band.upper:g} GB/s (expected about {band.value:g}, "
            f"{source}{'; ' + band.note if band.note else ''}"
            f"{'; source: ' + band.source if band.source else ''}"
            f"{'; unverified: ' + ', '.join(choice.unverified) if choice.unverified else ''})",
            evidence, size=st.size_bytes, judged=j.model_dump(), source=source, **extra)
    return top


def collective_of(s: Series, res: NcclTestsRun) -> str | None:
    """The collective a series measured: the log's binary says, else what the step ran.
    A log that names neither (rows pasted without the banner) is read as all_reduce, as
    before, unless its busbw is not all_reduce's: then it is unknown (None)."""
    named = res.op or s.collective
    if named is not None:
        return named
    return None if busbw_fits(res, "all_reduce") is False else "all_reduce"


def busbw_fits(res: NcclTestsRun, op: str) -> bool | None:
    """Whether every row's busbw is `op`'s factor of its algbw, as nccl-tests computes it
    for the run's rank count; None where the factor needs a rank count the log does not
    say, or no row is above
    1 GB/s (below that the printed digits cannot tell the factors apart)."""
    if op not in BUSBW_FACTORS:
        return None
    n = gpu_count(res)
    if n is None and busbw_factor(op, 1) != busbw_factor(op, 2):
        return None  # a factor of the rank count, which the log does not say
    factor = busbw_factor(op, n or 1)
    seen = [r for row in res.rows for r in (row.out_of_place, row.in_place)
            if r.algbw_gbs >= 1.0]
    if not seen:
        return None
    return all(abs(r.busbw_gbs - r.algbw_gbs * factor) <= 0.011 + 0.001 * r.busbw_gbs
               for r in seen)


def _bands(s: Series, res: NcclTestsRun, inv: Inventory | None,
           traits: bands.NodeTraits | None = None) -> bands.BandChoice:
    """The inventory's bands for this provider win over the shipped ones; a shipped class
    of this GPU applies only where the run breaks none of its assumptions."""
    if inv is not None and s.nodes:
        own = inv.provider_of(s.nodes[0]).expect.nccl_busbw
        if own is not None:
            return bands.BandChoice("inventory", list(own) if isinstance(own, (list, tuple))
                                    else [own], [], [], [])
    if not res.ranks:
        return bands.BandChoice("shipped", [], [], [], [])
    if traits is None:
        n_nodes = s.node_count
        traits = bands.NodeTraits(
            gpus=bands.Trait((gpu_count(res) or len(res.ranks)) // n_nodes, "the log"),
            nodes=bands.Trait(n_nodes, "the log"))
    return bands.choose(res.ranks[0].name, traits)
