"""GPU telemetry: the samples a node took while a job ran, and what they say.

The payload's sampler (payload/train/telemetry.py) leaves one file per node,
`nvidia-smi dmon -s pucvmet -o T` output or a `--query-gpu` loop, and a
document that says which (`source`, `file`, `started`, `interval_s`, `note`,
and the GPUs' clock and power `limits`). A step's judge hands this module the
sink, the window of time its work ran in, and those files: per GPU the
medians of the samples inside the window become measurements, and findings
say where a GPU sat idle or was throttled, where there were too few samples to
tell, and where there was no telemetry at all. The codes carry the step's
prefix (TRAIN_GPU_IDLE, TRAIN_THROTTLED, ...) and the messages its words.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.errors import ParseError
from orchestrator.judging.sink import Sink
from orchestrator.parsers.dmon import parse_dmon
from orchestrator.parsers.nvidia_smi import parse_query_gpu
from orchestrator.records import Severity

# a handful of 1 s samples around a few seconds of training (compile, a checkpoint) says
# nothing about idleness: below this many the idle verdict is withheld
MIN_IDLE_SAMPLES = 5
# a power-capped GPU whose SM clock stays at or above this share of its maximum runs at its
# rated power: dense bf16 training holds an H200 at its 700 W limit at 1600-1900 of 1980 MHz;
# a step whose load is a deliberate power stress sets its own share (TelemetryRules)
POWER_CAPPED_CLOCK_SHARE = 0.8
_POWER_ONLY = {"SwPowerCap"}


@dataclass(frozen=True)
class TelemetryRules:
    """How one step judges its GPUs' samples, and how its findings read.

    `idle_util_pct`: a median SM utilisation below it is an idle GPU (0 turns the idle
    verdict off); `power_violation_pct`: a sample with more power violation than this
    is throttled. `prefix` starts every code; `during` ends the messages' "... samples
    {during}", `span` names the window ("none of N samples fell inside {span}") and
    `more` says how to get more samples. `capped_clock_share`: a GPU held only by its
    full, default power limit with a median SM clock at or above this share of its
    maximum runs at its rated power (INFO, not a fault)."""

    idle_util_pct: float
    power_violation_pct: float
    prefix: str = "TRAIN"
    during: str = "while training"
    span: str = "the training steps"
    more: str = "run more steps"
    capped_clock_share: float = POWER_CAPPED_CLOCK_SHARE

    def code(self, what: str) -> str:
        return f"{self.prefix}_{what}"


def _time_of_day(text: str | None) -> int | None:
    """dmon -o T prints the node's wall clock as HH:MM:SS: seconds since midnight."""
    if not text:
        return None
    try:
        h, m, sec = (int(x) for x in text.split(":"))
    except ValueError:
        return None
    return h * 3600 + m * 60 + sec


def sample_times(samples: list[dict[str, Any]], started: float, interval: float) -> list[float]:
    """Each sample's time on the node's clock.

    dmon prints the time of day of every sample; counting samples times the interval
    drifts (dmon skips and repeats seconds under load). The first sample is taken as
    the sampler's start, and later ones are placed by their printed time relative to
    it, which needs no time zone. Samples without a time fall back to the count."""
    first = next((s["tod"] for s in samples if s.get("tod") is not None), None)
    out = []
    for k, s in enumerate(samples):
        tod = s.get("tod")
        if first is None or tod is None:
            out.append(started + (k + 1) * interval)
        else:
            out.append(started + (tod - first) % 86400)
    return out


def read_telemetry(path: Path, source: str, rel: str) -> dict[int, list[dict[str, Any]]]:
    """Per GPU, its samples in order: dmon column names (sm, pwr, gtemp, pclk, mclk, pviol,
    tviol, rxpci, txpci) and `line`; the query loop's fields mapped onto them."""
    text = path.read_text(errors="replace")
    out: dict[int, list[dict[str, Any]]] = {}
    if source == "dmon":
        facts = parse_dmon(text, source=rel)
        for s in facts.samples:
            out.setdefault(s.gpu, []).append({**s.values, "line": s.line_no,
                                              "tod": _time_of_day(s.time)})
        return out
    query = parse_query_gpu(text, source=rel)
    for i, g in enumerate(query.gpus, 2):
        reasons = g.clocks_event_reasons
        out.setdefault(g.index if g.index is not None else 0, []).append({
            "sm": g.utilization_gpu_pct, "pwr": g.power_draw_w, "gtemp": g.temperature_gpu_c,
            "pclk": g.clocks_sm_mhz, "mclk": g.clocks_mem_mhz, "line": i,
            "slowdown": reasons.slowdown if reasons is not None else []})
    return out


def gpu_limits(tele: Mapping[str, Any]) -> dict[int, dict[str, Any]]:
    """Each GPU's maximum SM clock and power limits, as the supervisor read them (by index)."""
    rows = (tele.get("limits") or {}).get("gpus") or []
    return {int(r["index"]): r for r in rows if isinstance(r, dict)
            and isinstance(r.get("index"), int)}


def throttle_verdict(throttled: list[dict[str, Any]], limits: Mapping[str, Any] | None,
                     capped_clock_share: float = POWER_CAPPED_CLOCK_SHARE
                     ) -> tuple[Severity, str, dict[str, Any]]:
    """WARN, or INFO for a GPU that only sat at its full power limit with its clock near the
    maximum (its rated power, not a fault); the message's tail and the details that say so.
    Thermal or hardware slowdown, a lowered power limit, a clock held far below its maximum,
    or limits that could not be read stay WARN."""
    power_only = all((s.get("tviol") or 0) <= 0 and set(s.get("slowdown") or []) <= _POWER_ONLY
                     for s in throttled)
    if not limits or not power_only:
        return "WARN", "", {}
    top, limit, default = (limits.get(k) for k in ("max_sm_clock_mhz", "power_limit_w",
                                                  "default_power_limit_w"))
    clocks = [float(s["pclk"]) for s in throttled if s.get("pclk") is not None]
    if not top or not limit or not clocks:
        return "WARN", "", {}
    clock = statistics.median(clocks)
    known = {"sm_clock_mhz": clock, "max_sm_clock_mhz": top, "power_limit_w": limit,
             "default_power_limit_w": default}
    if default and limit < 0.99 * default:
        return "WARN", (f"; its power limit is {limit:.0f} W, below its default "
                        f"{default:.0f} W"), known
    if clock >= capped_clock_share * top:
        return "INFO", (f"; at its full power limit ({limit:.0f} W) with the SM clock at "
                        f"{clock:.0f} of {top:.0f} MHz: its rated power, not a fault"), known
    return "WARN", (f"; held at its {limit:.0f} W power limit with the SM clock at "
                    f"{clock:.0f} of {top:.0f} MHz"), known


@dataclass(frozen=True)
class NodeTelemetry:
    """One node's telemetry as the sampler left it: its document `doc` (source, file,
    started, interval_s, note, limits), read from `doc_file` (the evidence where there is
    no telemetry), and the folder its samples file lies in."""

    node: str
    doc: Mapping[str, Any]
    folder: Path
    doc_file: Path


def judge_window(sink: Sink, rules: TelemetryRules, nodes: Iterable[NodeTelemetry],
                 t_first: float, t_last: float) -> None:
    """Every node's telemetry over the window [t_first, t_last], in order."""
    for nt in nodes:
        judge_node(sink, rules, nt, t_first, t_last)


def judge_node(sink: Sink, rules: TelemetryRules, nt: NodeTelemetry, t_first: float,
               t_last: float) -> None:
    """One node's samples inside the window [t_first, t_last] (the node's clock, one
    sampling interval of slack either side), GPU by GPU."""
    tele = nt.doc
    if not tele.get("file"):
        sink.add(rules.code("NO_TELEMETRY"), "INFO", f"{nt.node}: "
                 f"{tele.get('note') or 'no GPU telemetry'}", [nt.doc_file],
                 node_of_sample=nt.node)
        return
    path = nt.folder / str(tele["file"])
    try:
        series = read_telemetry(path, str(tele.get("source")), sink.rel(path))
    except (ParseError, OSError) as exc:
        what = exc.what if isinstance(exc, ParseError) else str(exc)
        sink.add(rules.code("TELEMETRY_UNREADABLE"), "WARN", f"{nt.node}: {what}", [path])
        return
    started = float(tele.get("started") or 0)
    interval = float(tele.get("interval_s") or 1)
    limits = gpu_limits(tele)
    for gpu, samples in series.items():
        times = sample_times(samples, started, interval)
        window = [s for s, t in zip(samples, times, strict=True)
                  if t_first - interval <= t <= t_last + interval]
        judge_gpu(sink, rules, nt.node, gpu, window, path, len(samples), limits.get(gpu))


def judge_gpu(sink: Sink, rules: TelemetryRules, node: str, gpu: int,
              window: list[dict[str, Any]], path: Path, total: int,
              limits: Mapping[str, Any] | None = None) -> None:
    """One GPU's samples inside the window (`total` of them in all, read from `path`):
    medians and maxima as measurements, an idle or throttled GPU as a finding."""
    if not window:
        sink.add(rules.code("TELEMETRY_SHORT"), "INFO", f"{node} GPU {gpu}: none of {total} "
                 f"telemetry samples fell inside {rules.span} (a run shorter than the "
                 "sampling interval)", [path])
        return

    def med(key: str) -> float | None:
        vals = [float(s[key]) for s in window if s.get(key) is not None]
        return statistics.median(vals) if vals else None

    for key, metric, unit in (("sm", "gpu_util_pct", "%"), ("pwr", "gpu_power_w", "W"),
                              ("pclk", "sm_clock_mhz", "MHz"),
                              ("mclk", "mem_clock_mhz", "MHz"),
                              ("rxpci", "pcie_rx_mbs", "MB/s"),
                              ("txpci", "pcie_tx_mbs", "MB/s")):
        v = med(key)
        if v is not None:
            sink.measure(metric, v, unit, stat="median", node=node, gpu=gpu,
                         samples=len(window))
    for key, metric, unit in (("gtemp", "gpu_temp_max_c", "C"),
                              ("fb", "gpu_mem_used_max_mb", "MB")):
        vals = [float(s[key]) for s in window if s.get(key) is not None]
        if vals:
            sink.measure(metric, max(vals), unit, stat="max", node=node, gpu=gpu)
    util = med("sm")
    if util is not None and util < rules.idle_util_pct and len(window) < MIN_IDLE_SAMPLES:
        sink.add(rules.code("TELEMETRY_SHORT"), "INFO", f"{node} GPU {gpu}: SM utilisation "
                 f"{util:.0f}% over only {len(window)} sample(s) {rules.during}: too few "
                 f"to call the GPU idle (at least {MIN_IDLE_SAMPLES}; {rules.more})",
                 [path], gpu=gpu, util_pct=util)
    elif util is not None and util < rules.idle_util_pct:
        sink.add(rules.code("GPU_IDLE"), "WARN", f"{node} GPU {gpu}: SM utilisation "
                 f"{util:.0f}% (median of {len(window)} samples {rules.during})", [path],
                 gpu=gpu, util_pct=util)
    throttled = [s for s in window
                 if (s.get("pviol") or 0) > rules.power_violation_pct or (s.get("tviol") or 0) > 0
                 or s.get("slowdown")]
    if throttled:
        s = throttled[0]
        why = s.get("slowdown") or [k for k in ("pviol", "tviol") if (s.get(k) or 0) > 0]
        severity, more, known = throttle_verdict(throttled, limits, rules.capped_clock_share)
        sink.add(rules.code("THROTTLED"), severity, f"{node} GPU {gpu}: throttled in "
                 f"{len(throttled)} of {len(window)} samples {rules.during} "
                 f"({', '.join(map(str, why))}, line {s.get('line')}){more}", [path],
                 gpu=gpu, samples=len(throttled), line=s.get("line"), **known)
