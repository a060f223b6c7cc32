"""Each GPU against its own physics: memory bandwidth (copy and read-only), matrix
throughput per precision (burst), the sustained rate and its ratio to the burst with
the reason for a drop, and the variant the measurements fit next to what was ordered.

The expectation of a figure is the datasheet figure of the GPU's variant times the
shipped achievable fraction (``data/gpu_peaks.yaml``): what a healthy card reaches
with these same measurements. A figure under FAIL_BELOW of its expectation is FAIL,
under WARN_BELOW WARN. The sustained rate is judged by its ratio to the burst against
the ratio a healthy card holds (bf16_sustained / bf16); a drop with thermal or hardware
slowdown among the clock event reasons is FAIL (the card cannot hold its clock: cooling
or hardware), with the power cap alone WARN.
"""

from __future__ import annotations

from orchestrator.gpunames import BY_NAME, Identified
from orchestrator.judging.sink import Sink
from orchestrator.records import Severity
from orchestrator.steps.health.counters import GpuCounters
from orchestrator.steps.health.datasheet import Variant
from orchestrator.steps.health.output import GpuOutput, NodeOutput
from orchestrator.steps.health.variant import Measured, Naming, name_variant

FAIL_BELOW = 0.85
WARN_BELOW = 0.93
THERMAL = frozenset({"SwThermalSlowdown", "HwThermalSlowdown", "HwSlowdown",
                     "HwPowerBrakeSlowdown"})
PRECISION_NAMES = {"bf16": "BF16", "fp16": "FP16", "tf32": "TF32", "fp32": "FP32",
                   "fp64": "FP64", "fp8": "FP8"}


def grade(ratio: float) -> Severity:
    return "FAIL" if ratio < FAIL_BELOW else "WARN" if ratio < WARN_BELOW else "PASS"


def _judge_figure(sink: Sink, code: str, who: str, what: str, value: float, unit: str,
                  paper: float, fraction: float, variant: Variant, g: GpuOutput,
                  busy: str | None = None, **extra: object) -> None:
    """A figure against what a healthy card reaches. Measured while another process used
    the GPU (`busy`: the processes in words, GPU_BUSY), a low figure is that process's
    load, not the card's: WARN, naming the process, never a FAIL of the card."""
    expected = paper * fraction
    ratio = value / expected if expected else 0.0
    sev = grade(ratio)
    text = (f"{who}: {what} {value:.1f} {unit}, {ratio:.2f} of the {expected:.1f} {unit} a "
            f"healthy {variant.name} reaches ({fraction:.3f} of its datasheet {paper:g}"
            f"{variant.fraction_note})")
    if busy and sev != "PASS":
        sev = "WARN"
        text += (f", measured while another process used the GPU ({busy}): not the card's "
                 "figure (GPU_BUSY); measure again on a free GPU")
        extra = {**extra, "busy": busy}
    sink.add(code, sev, text, [g.events_file], gpu=g.entry, value=round(value, 3),
             expected=round(expected, 3), ratio=round(ratio, 4), datasheet=paper, achievable=fraction,
             achievable_measured=variant.achievable_measured, variant=variant.name, **extra)


def judge_memory(sink: Sink, out: NodeOutput, g: GpuOutput, v: Variant | None,
                 busy: str | None = None) -> None:
    who = f"{out.node} GPU {g.entry}"
    copy, read = g.values("memcopy"), g.values("memread")
    ev = g.done("memcopy")
    for key, metric in (("copy_gbps", "health.membw.copy_gbps"),
                        ("read_gbps", "health.membw.read_gbps")):
        val = (copy if key == "copy_gbps" else read).get(key)
        if isinstance(val, (int, float)):
            sink.measure(metric, val, "GB/s", node=out.node, gpu=g.entry)
    if v is None or ev is None or _on_cpu(out):
        return
    if isinstance(copy.get("copy_gbps"), (int, float)):
        _judge_figure(sink, "HEALTH_MEMBW", who, "device copy (read + written)",
                      float(copy["copy_gbps"]), "GB/s", v.memory_gbps,
                      v.achievable.memory_copy, v, g, busy, measure="copy")
    if isinstance(read.get("read_gbps"), (int, float)):
        _judge_figure(sink, "HEALTH_MEMBW", who, "read-only pass",
                      float(read["read_gbps"]), "GB/s", v.memory_gbps,
                      v.achievable.memory_read, v, g, busy, measure="read")


def judge_matmul(sink: Sink, out: NodeOutput, g: GpuOutput, v: Variant | None,
                 busy: str | None = None) -> None:
    who = f"{out.node} GPU {g.entry}"
    vals = g.values("matmul")
    ev = g.done("matmul")
    for prec in PRECISION_NAMES:
        val = vals.get(f"{prec}_tflops")
        if not isinstance(val, (int, float)):
            continue
        sink.measure(f"health.matmul.{prec}_tflops", val, "TFLOP/s", node=out.node,
                     gpu=g.entry, precision=prec)
        if v is None or _on_cpu(out):
            continue
        paper = v.peak(prec)
        if not paper:
            continue
        _judge_figure(sink, "HEALTH_MATMUL", who, f"{PRECISION_NAMES[prec]} products "
                      f"(burst, n={((ev or {}).get('params') or {}).get('n')})", float(val),
                      "TFLOP/s", paper, getattr(v.achievable, prec), v, g, busy,
                      precision=prec)


def judge_sustained(sink: Sink, out: NodeOutput, g: GpuOutput, v: Variant | None,
                    counters: GpuCounters | None, busy: str | None = None) -> None:
    vals = g.values("sustained")
    if not vals:
        return
    who = f"{out.node} GPU {g.entry}"
    rate, ratio = vals.get("tflops"), vals.get("ratio_to_burst")
    if isinstance(rate, (int, float)):
        sink.measure("health.sustained.tflops", rate, "TFLOP/s", node=out.node, gpu=g.entry)
    if not isinstance(ratio, (int, float)):
        return
    sink.measure("health.sustained.ratio", ratio, "ratio", node=out.node, gpu=g.entry)
    if _on_cpu(out):
        return
    f = v.achievable if v is not None else None
    healthy = f.bf16_sustained / f.bf16 if f is not None else 0.867
    rel = ratio / healthy
    index = counters.index if counters is not None else (
        int(g.entry) if g.entry.isdigit() else None)
    seen = out.reasons.get(index, {}) if index is not None else {}
    grew = counters_reasons(out, counters)
    reasons = sorted(set(seen) | set(grew))
    hot = [r for r in reasons if r in THERMAL]
    sev: Severity = "PASS" if rel >= WARN_BELOW else ("FAIL" if hot and not busy else "WARN")
    why = (f"clock event reasons during the load: {', '.join(reasons)}" if reasons
           else "no clock event reason recorded" if out.reason_samples.get(index or -1)
           else "the clock event reasons were not sampled")
    sink.add("HEALTH_SUSTAINED", sev, f"{who}: sustained bf16 {float(rate or 0):.1f} TFLOP/s "
             f"over {((g.done('sustained') or {}).get('params') or {}).get('window_s')} s, "
             f"{ratio:.2f} of the burst (a healthy card holds {healthy:.2f}"
             f"{v.fraction_note if v is not None else ''}); {why}",
             [out.folder / "gpu-reasons.csv", g.events_file], gpu=g.entry,
             ratio=round(ratio, 4), healthy_ratio=round(healthy, 4), reasons=reasons,
             thermal=bool(hot), min_tflops=vals.get("min_tflops"),
             last_tflops=vals.get("last_tflops"))


def counters_reasons(out: NodeOutput, c: GpuCounters | None) -> dict[str, int]:
    """Clock-reason counters (microseconds) that grew between the reads, by reason name."""
    if c is None or out.before is None or out.after is None:
        return {}
    a = out.after.gpus.get(c.key)
    b = out.before.gpus.get(c.key)
    if a is None or b is None:
        return {}
    names = {"sw_power_cap": "SwPowerCap", "sw_thermal_slowdown": "SwThermalSlowdown",
             "hw_thermal_slowdown": "HwThermalSlowdown",
             "hw_power_brake_slowdown": "HwPowerBrakeSlowdown"}
    return {names[k]: v - b.reason_counters_us.get(k, 0) for k, v in a.reason_counters_us.items()
            if k in names and v > b.reason_counters_us.get(k, 0)}


def measured(g: GpuOutput, counters: GpuCounters | None) -> Measured:
    copy, read, mm = g.values("memcopy"), g.values("memread"), g.values("matmul")
    total = g.hello.get("total_bytes")
    mib = (counters.memory_total_mib if counters is not None and counters.memory_total_mib
           else total / (1 << 20) if isinstance(total, (int, float)) and total else None)

    def num(d: dict[str, object], k: str) -> float | None:
        x = d.get(k)
        return float(x) if isinstance(x, (int, float)) else None

    return Measured(memory_mib=mib, copy_gbps=num(copy, "copy_gbps"),
                    read_gbps=num(read, "read_gbps"),
                    power_limit_w=counters.power_limit_w if counters is not None else None,
                    bf16_tflops=num(mm, "bf16_tflops"), fp64_tflops=num(mm, "fp64_tflops"),
                    fp8_ran=num(mm, "fp8_tflops") is not None, cc=g.cc)


def judge_variant(sink: Sink, out: NodeOutput, g: GpuOutput, counters: GpuCounters | None,
                  ordered: str | None, identified: Identified | None = None) -> Naming | None:
    """`measures like <variant>` next to the order; WARN when it fits another variant. A GPU
    the driver could not name says how it was identified (memory and SM count)."""
    if _on_cpu(out):
        return None
    m = measured(g, counters)
    naming = name_variant(m, ordered)
    who = f"{out.node} GPU {g.entry}"
    if naming.best is None:
        sink.add("HEALTH_VARIANT", "INFO", f"{who}: {naming.text}", [out.doc_file],
                 gpu=g.entry)
        return naming
    order = (f"ordered {naming.ordered.name}" if naming.ordered is not None
             else f"ordered {ordered}" if ordered else "no model in the order")
    sev: Severity = "WARN" if naming.matches_order is False else "INFO"
    told = (f", identified {identified.how} as {identified.labels}"
            if identified is not None and identified.cards and identified.how != BY_NAME else "")
    sink.add("HEALTH_VARIANT", sev, f"{who}: {naming.text} ({order}; reports "
             f"{g.name or '?'}{told})", [out.doc_file], gpu=g.entry,
             variant=naming.best.variant.name,
             ordered=naming.ordered.name if naming.ordered else ordered,
             distance=round(naming.best.distance, 4),
             runner_up=naming.runner_up.variant.name if naming.runner_up else None)
    return naming


def _on_cpu(out: NodeOutput) -> bool:
    return out.doc.get("device") == "cpu"
