"""How fast the reference trained: step time, tokens/s and MFU against the GPU's
dense bf16 peak (`data/gpu_peaks.yaml`, or the suite's own figure), the input
pipeline's share of a step, ranks slower than the others, and the reasons the
losses of two runs may not match bit for bit.
"""

from __future__ import annotations

import statistics
from typing import Any

from orchestrator import gpunames
from orchestrator.judging.sink import Sink
from orchestrator.steps.train.reading import PhaseOutput
from orchestrator.suite import TrainParams
from payload.train import protocol


def peak_tflops(gpu_name: str | None, provider: str,
                params: TrainParams) -> tuple[float | None, str]:
    """(dense bf16 peak, where it came from); None where the GPU is not known. The name is
    placed on the catalog's variants as the preflight checks place it (never by substring:
    a GB200 is not a B200); a name several variants share gets their figure only when they
    agree on it."""
    if provider in params.peak_tflops:
        return float(params.peak_tflops[provider]), f"suite train.peak_tflops.{provider}"
    if not gpu_name:
        return None, "no GPU"
    cards = gpunames.place(gpu_name, strict=False).cards
    if not cards:
        return None, f"{gpu_name!r} is not in gpu_peaks.yaml"
    named = cards[0].family  # the catalog entry as the stored records have always named it
    figures = {c.tflops for c in cards}
    if figures == {None}:
        return None, f"gpu_peaks.yaml lists {named!r} without a figure"
    if len(figures) > 1:
        return None, (f"{gpu_name!r} could be {', '.join(c.label for c in cards)} in "
                      "gpu_peaks.yaml, with different figures")
    return float(next(iter(figures))), f"gpu_peaks.yaml {named!r}"  # type: ignore[arg-type]


def p90(values: list[float]) -> float:
    """Nearest-rank 90th percentile."""
    ordered = sorted(values)
    return ordered[max(0, -(-9 * len(ordered) // 10) - 1)]


def reference_speed(sink: Sink, params: TrainParams, out: PhaseOutput, skip: int) -> str:
    """The reference's speed as measurements (the fastest kernels' throughput segment as
    the headline where it ran, the verified steps' beside it); the line for people."""
    steps = out.steps()
    start = out.first(protocol.START) or {}
    timed = [s for k, s in sorted(steps.items()) if k > skip]
    fast = [e for e in out.rank0() if e.get("event") == protocol.TSTEP]
    gpu = (start.get("versions") or {}).get("gpu_name")
    cuda = str(start.get("device", "")).startswith("cuda")
    tags = {"world": start.get("world"), "gpu": gpu, "parallel": start.get("parallel"),
            "compiled": start.get("compiled"), "model": params.model,
            "params": start.get("params"), "torch": (start.get("versions") or {}).get("torch")}
    peak: float | None = None
    if cuda:
        peak, source = peak_tflops(gpu, sink.provider, params)
        if peak is None:
            sink.add("TRAIN_NO_MFU", "INFO", f"no MFU: {source}; set "
                     f"train.peak_tflops.{sink.provider} in the suite", [out.rank_file(0)],
                     gpu=gpu)
        else:
            tags.update(peak_tflops=peak, peak_source=source)
    det = bool((start.get("deterministic") or {}).get("use_deterministic_algorithms"))
    if not fast:
        return speed(sink, timed, "", start, peak, tags, timed_in="reference",
                     deterministic=det)
    headline = speed(sink, fast, "", start, peak, tags, timed_in="throughput",
                     deterministic=False)
    verified = speed(sink, timed, "deterministic_", start, peak, tags,
                     timed_in="reference", deterministic=det)
    return (f"{headline} on the fastest kernels ({len(fast)} steps after the "
            f"verified ones); the verified, deterministic steps: {verified}")


def speed(sink: Sink, steps: list[dict[str, Any]], prefix: str, start: dict[str, Any],
          peak: float | None, tags: dict[str, Any], **more: Any) -> str:
    """Step time, tokens/s and MFU of these steps as measurements; a line for people."""
    times = [float(s["step_time_s"]) for s in steps]
    med, tail90 = statistics.median(times), p90(times)
    tps = int(steps[0]["tokens"]) / med
    tags = {**tags, **more, "steps_timed": len(times)}
    per = "gpu" if str(start.get("device", "")).startswith("cuda") else "rank"
    sink.measure(f"{prefix}step_time_s", med, "s", stat="median", **tags)
    sink.measure(f"{prefix}step_time_p90_s", tail90, "s", stat="p90", **tags)
    sink.measure(f"{prefix}tokens_per_s_per_{per}", tps, "tokens/s", **tags)
    text = f"step {med:.4g} s median (p90 {tail90:.4g} s), {tps:,.0f} tokens/s per {per}"
    if peak is not None:
        achieved = float(start.get("flops_per_token") or 0) * tps / 1e12
        sink.measure(f"{prefix}mfu", achieved / peak, "ratio", achieved_tflops=achieved,
                     **tags)
        text += f", MFU {achieved / peak:.1%} ({achieved:.0f} of {peak:.0f} TFLOP/s)"
    return text


def input_bound(sink: Sink, params: TrainParams, out: PhaseOutput, skip: int) -> None:
    """Waiting for data takes more of a step than the suite allows."""
    timed = [s for k, s in sorted(out.steps().items()) if k > skip]
    shares = [float(s["data_wait_s"]) / float(s["step_time_s"]) for s in timed
              if float(s["step_time_s"]) > 0]
    if shares and statistics.median(shares) > params.thresholds.input_bound_share:
        sink.add("TRAIN_INPUT_BOUND", "WARN", f"input pipeline: waiting for data takes "
                 f"{statistics.median(shares):.0%} of a step (median)", [out.rank_file(0)],
                 share=statistics.median(shares))


def nondeterministic(out: PhaseOutput, inexact: list[str]) -> None:
    """Why this phase's losses may not repeat bit for bit, added to `inexact` once each."""
    for ev in out.all("nondeterministic"):
        reason = f"an operation without a deterministic kernel: {ev.get('message')}"
        if reason not in inexact:
            inexact.append(reason)
    start = out.first(protocol.START) or {}
    if not (start.get("deterministic") or {}).get("use_deterministic_algorithms"):
        reason = "deterministic mode is off (suite train.deterministic: false)"
        if reason not in inexact:
            inexact.append(reason)


def stragglers(sink: Sink, params: TrainParams, out: PhaseOutput, skip: int) -> None:
    """The rank whose forward pass is slowest, where it is slower than the others by the
    suite's straggler ratio."""
    fwd: dict[int, float] = {}
    for rank in out.ranks:
        vals = [float(s["fwd_s"]) for k, s in sorted(out.steps(rank).items())
                if k > skip and s.get("fwd_s") is not None]
        if vals:
            fwd[rank] = statistics.median(vals)
    if len(fwd) < 2:
        return
    slow = max(fwd, key=lambda r: fwd[r])
    others = statistics.median([v for r, v in fwd.items() if r != slow])
    if others > 0 and fwd[slow] / others >= params.thresholds.straggler_ratio:
        sink.add("TRAIN_STRAGGLER", "WARN", f"rank {slow} on {out.node_of(slow)} is slow: "
                 f"forward {fwd[slow]:.4g} s median vs {others:.4g} s on the other ranks "
                 f"({fwd[slow] / others:.2f}x)", [out.rank_file(slow)], rank=slow,
                 node_of_rank=out.node_of(slow), ratio=fwd[slow] / others)
