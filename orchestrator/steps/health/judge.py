"""Judge one node's health output (``output.NodeOutput``) into findings and measurements.

The concerns live in their own modules, all writing through one record sink: the
counters before and after and the processes already on the GPUs
(``judge_counters``), each GPU against its datasheet and the variant it measures
like (``judge_perf``), corruption, the memory test, phase errors, FP8 and DCGM
(``judge_checks``), the host links and peers (``judge_links``), and throttling from
the GPU telemetry through the judgement the training step uses too
(``orchestrator.judging.telemetry``, codes HEALTH_THROTTLED, ...).

Every code is stable (docs/health.md lists them). A node without a GPU says so
(HEALTH_NO_GPU, INFO) and nothing else is judged.
"""

from __future__ import annotations

from typing import Any

from orchestrator import gpunames
from orchestrator.inventory.model import Expectations
from orchestrator.judging import telemetry
from orchestrator.judging.sink import Sink
from orchestrator.steps.health import judge_checks, judge_counters, judge_links, judge_perf
from orchestrator.steps.health.datasheet import pcie_gbps, shipped
from orchestrator.steps.health.output import NodeOutput

# The health load is a power stress (8192^3 products back to back, FP64 among them): on a
# healthy H200 at its 700 W limit the SM clock sat at 1500-1508 of 1980 MHz (0.76) in both
# measured runs (docs/benchmarks.md), where training holds 0.8 and more. What the cap costs
# is judged by the sustained rate (judge_perf), so the clock alone warns only below 0.65.
RULES = telemetry.TelemetryRules(idle_util_pct=0.0, power_violation_pct=5.0, prefix="HEALTH",
                                 during="under the health load", span="the GPU phases",
                                 more="run a longer level", capped_clock_share=0.65)


def gpu_window(out: NodeOutput) -> tuple[float, float] | None:
    """The span of the GPU phases on the node's clock: first start to last end."""
    ts = []
    for g in out.gpus:
        for ev in g.phases.values():
            t = ev.get("t")
            if isinstance(t, (int, float)):
                ts.append(float(t))
                wall = ev.get("wall_s")
                if isinstance(wall, (int, float)):
                    ts.append(float(t) - float(wall))
    return (min(ts), max(ts)) if ts else None


def judge_node(sink: Sink, out: NodeOutput, expect: Expectations) -> dict[str, Any]:
    """Every concern of one node, in the order a person reads them; the unit's summary."""
    node = out.node
    summary: dict[str, Any] = {"status": out.status, "gpus": len(out.gpus),
                               "level": out.doc.get("level")}
    if out.status == "no-gpu":
        sink.add("HEALTH_NO_GPU", "INFO", f"{node}: {out.doc.get('reason') or 'no GPU'}: the "
                 "health step has nothing to measure here", [out.doc_file])
        return summary
    if out.status == "interrupted":
        sink.add("HEALTH_INTERRUPTED", "FAIL", f"{node}: the health run was interrupted "
                 f"({out.doc.get('reason')})", [out.doc_file])
    want_fp8 = expect.needs_fp8
    for g in out.gpus:
        judge_checks.fp8_findings(sink, node, want_fp8, g.name, g.cc, f"GPU {g.entry}",
                                  [g.events_file])
    busy = judge_counters.judge_busy(sink, out)
    judge_counters.judge_counters(sink, out)
    sheet = shipped()
    host_gbps = None
    for g in out.gpus:
        c = out.counters_of(g, out.before)
        mib = (c.memory_total_mib if c is not None and c.memory_total_mib else
               g.hello["total_bytes"] / 2**20
               if isinstance(g.hello.get("total_bytes"), (int, float)) else None)
        sms = g.hello.get("sms") if isinstance(g.hello.get("sms"), int) else None
        ident = gpunames.identify(g.name, None, mib, sms)
        v = sheet.for_cards(ident.cards) or sheet.for_name(expect.gpu_model, order=True)
        judge_checks.judge_phase_errors(sink, out, g)
        judge_checks.judge_sdc(sink, out, g)
        judge_checks.judge_memtest(sink, out, g)
        # another process on this GPU: its figures are not the card's (GPU_BUSY)
        on = next((busy[k] for k in (g.hello.get("uuid"), c.uuid if c else None,
                                     c.bus_id if c else None, g.entry) if k and k in busy), None)
        judge_perf.judge_memory(sink, out, g, v, on)
        judge_perf.judge_matmul(sink, out, g, v, on)
        judge_perf.judge_sustained(sink, out, g, v, c, on)
        judge_links.judge_pcie(sink, out, g, c, v, expect.pcie)
        gen, width = judge_links.expected_link(c, v, expect.pcie)
        if gen in (1, 2, 3, 4, 5, 6) and width:
            host_gbps = max(host_gbps or 0.0, pcie_gbps(gen, width))
        judge_perf.judge_variant(sink, out, g, c, expect.gpu_model, ident)
    judge_links.judge_pcie_all(sink, out)
    judge_links.judge_peers(sink, out, host_gbps)
    judge_checks.judge_dcgmi(sink, out)
    _telemetry(sink, out)
    if out.status == "failed":
        sink.add("HEALTH_FAILED", "FAIL", f"{node}: {out.doc.get('reason')}", [out.doc_file])
    summary["wall_s"] = out.doc.get("wall_s")
    return summary


def _telemetry(sink: Sink, out: NodeOutput) -> None:
    tele = out.doc.get("telemetry")
    dmon = tele.get("dmon") if isinstance(tele, dict) else None
    window = gpu_window(out)
    if not isinstance(dmon, dict) or window is None or out.doc.get("device") != "cuda":
        return
    nt = telemetry.NodeTelemetry(out.node, dmon, out.folder, out.doc_file)
    telemetry.judge_node(sink, RULES, nt, window[0], window[1])

