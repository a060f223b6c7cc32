"""Whether a GPU computes and stores what it is given: the products' checks (GPU_SDC),
the memory test (GPU_MEMTEST), a phase that could not run, FP8 where the order needs it,
and DCGM's own diagnostic where the node has it.

A product's row or column sum off by more than its tolerance, a repeat of a product
that differs bit for bit from the first, or a device copy that does not equal its
source is silent data corruption: FAIL, with the events file that carries the counts.
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.errors import ParseError
from orchestrator.judging.sink import Sink
from orchestrator.parsers.dcgmi import parse_dcgmi_diag
from orchestrator.steps.health.datasheet import shipped
from orchestrator.steps.health.output import GpuOutput, NodeOutput
from orchestrator.steps.health.variant import fp8_problem
from payload.health import protocol

PRECISIONS = ("bf16", "fp16", "tf32", "fp32", "fp64", "fp8")


def judge_sdc(sink: Sink, out: NodeOutput, g: GpuOutput) -> None:
    who = f"{out.node} GPU {g.entry}"
    bad: list[str] = []
    detail: dict[str, int] = {}
    mm = g.values("matmul")
    for prec in PRECISIONS:
        for k, what in (("rows_bad", "row sums"), ("cols_bad", "column sums"),
                        ("repeat_mismatches", "repeats")):
            n = mm.get(f"{prec}_{k}")
            if isinstance(n, (int, float)) and n > 0:
                bad.append(f"{prec} {what} off: {int(n)}")
                detail[f"{prec}_{k}"] = int(n)
    sus = g.values("sustained").get("repeat_mismatches")
    if isinstance(sus, (int, float)) and sus > 0:
        bad.append(f"sustained bf16 products differing from the first: {int(sus)}")
        detail["sustained_repeat_mismatches"] = int(sus)
    ev = g.done("memcopy")
    if ev is not None and (ev.get("check") or {}).get("copy_equal") is False:
        bad.append("a device copy differs from its source")
        detail["copy_unequal"] = 1
    if bad:
        sink.add("GPU_SDC", "FAIL", f"{who}: silent data corruption: " + "; ".join(bad),
                 [g.events_file], gpu=g.entry, **detail)
    elif g.done("matmul") is not None:
        sink.add("GPU_SDC", "PASS", f"{who}: every product checked (row and column sums, "
                 "repeats bit for bit)", [g.events_file], gpu=g.entry)


def judge_memtest(sink: Sink, out: NodeOutput, g: GpuOutput) -> None:
    ev = g.done("memtest")
    if ev is None:
        return
    who = f"{out.node} GPU {g.entry}"
    v = ev.get("values") or {}
    n = int(v.get("mismatches") or 0)
    frac = v.get("fraction_of_free")
    tested = float(v.get("bytes_tested") or 0) / (1 << 30)
    span = (f"{tested:.1f} GiB ({float(frac) * 100:.0f}% of the free memory)"
            if isinstance(frac, (int, float)) else f"{tested:.2f} GiB")
    sink.measure("health.memtest.mismatches", n, "words", node=out.node, gpu=g.entry)
    if n > 0:
        per = {k[:-len("_mismatches")]: int(x) for k, x in v.items()
               if k.endswith("_mismatches") and isinstance(x, (int, float)) and x}
        ex = (ev.get("examples") or [])[:3]
        sink.add("GPU_MEMTEST", "FAIL", f"{who}: {n} mismatching word(s) in the memory test "
                 f"over {span}, {v.get('passes')} pass(es): " + ", ".join(
                     f"{k} {x}" for k, x in sorted(per.items())) + (
                     f"; first at word {ex[0]}" if ex else ""), [g.events_file], gpu=g.entry,
                 mismatches=n, patterns=per, examples=ex)
    else:
        sink.add("GPU_MEMTEST", "PASS", f"{who}: no mismatch over {span}, "
                 f"{v.get('passes')} pass(es) of every pattern", [g.events_file], gpu=g.entry)


def judge_phase_errors(sink: Sink, out: NodeOutput, g: GpuOutput) -> None:
    """A GPU phase that ended in an error, or a process that died or hung."""
    who = f"{out.node} GPU {g.entry}"
    stderr = out.folder / f"gpu{g.label}.stderr"
    for phase, ev in g.phases.items():
        if ev.get("event") != protocol.ERROR:
            continue
        oom = ev.get("kind") == "oom"
        sink.add("HEALTH_PHASE_ERROR", "FAIL", f"{who}: {phase} failed: "
                 f"{str(ev.get('error'))[:300]}" + (" (out of memory: see GPU_BUSY)"
                                                    if oom else ""),
                 [g.events_file, stderr], gpu=g.entry, phase=phase, oom=oom)
    w = g.worker
    if w.get("timed_out"):
        sink.add("HEALTH_PHASE_ERROR", "FAIL", f"{who}: the GPU's process hung and was "
                 "killed", [g.events_file, stderr], gpu=g.entry, phase="timeout")
    elif w.get("rc") not in (None, 0):
        why = "; ".join(g.errors)[:300] or str(w.get("stderr_tail") or "").strip()[-300:]
        sink.add("HEALTH_PHASE_ERROR", "FAIL", f"{who}: the GPU's process exited "
                 f"{w.get('rc')}: {why or 'no message'}",
                 [g.events_file, stderr], gpu=g.entry, phase="exit", rc=w.get("rc"))


def fp8_findings(sink: Sink, node: str, needs_fp8: bool, name: str | None,
                 cc: tuple[int, int] | None, who: str, evidence: list[Path]) -> bool:
    """expect.needs_fp8 on a GPU without FP8: FAIL. The compute capability comes from the
    GPU (or the datasheet row its name matches). True when it failed."""
    if not needs_fp8:
        return False
    if cc is None and name:
        v = shipped().for_name(name)
        cc = v.cc if v is not None else None
    why = fp8_problem(needs_fp8, cc)
    if why is None:
        return False
    sink.add("GPU_NO_FP8", "FAIL", f"{node} {who}: {why} ({name or 'GPU'})", evidence,
             cc=f"{cc[0]}.{cc[1]}" if cc else None)
    return True


def judge_dcgmi(sink: Sink, out: NodeOutput) -> None:
    ev = out.doc.get("node_phases", {}).get("dcgmi") if isinstance(
        out.doc.get("node_phases"), dict) else None
    if not ev:
        return
    if ev.get("event") == protocol.SKIP:
        reason = str(ev.get("reason") or "")
        if "not found" in reason:
            sink.add("DCGM_DIAG", "INFO", f"{out.node}: {reason}: the DCGM diagnostic did "
                     "not run (gpuvet's own measurements stand)", [out.doc_file])
        return
    path = out.file(ev.get("file")) or out.folder / protocol.DCGMI_FILE
    text = path.read_text(errors="replace") if path.is_file() else ""
    if ev.get("timed_out"):
        argv = ev.get("argv") or ["dcgmi"]
        sink.add("DCGM_DIAG", "WARN", f"{out.node}: {' '.join(map(str, argv))} timed out and "
                 "was killed", [path])
        return
    try:
        facts = parse_dcgmi_diag(text, source=str(path))
    except ParseError as exc:
        sink.add("DCGM_DIAG", "WARN", f"{out.node}: dcgmi diag exited {ev.get('rc')} and its "
                 f"output is not a diagnostic table ({exc.what})", [path], rc=ev.get("rc"))
        return
    failed = facts.failed
    errors = facts.errors
    warned = [t for t in facts.tests if any(r.status == "Warn" for r in t.results)]
    if failed or errors:
        names = [t.name for t in failed] or ["(deployment)"]
        first = errors[0].text if errors else ""
        sink.add("DCGM_DIAG", "FAIL", f"{out.node}: dcgmi diag failed: {', '.join(names)}"
                 + (f": {first[:200]}" if first else ""), [path], failed=names,
                 errors=[m.text for m in errors][:10])
    elif warned:
        sink.add("DCGM_DIAG", "WARN", f"{out.node}: dcgmi diag warns: "
                 f"{', '.join(t.name for t in warned)}", [path],
                 warned=[t.name for t in warned])
    else:
        sink.add("DCGM_DIAG", "PASS", f"{out.node}: dcgmi diag passed "
                 f"({len(facts.tests)} tests)", [path], tests=len(facts.tests))
