"""What the counters say: what grew between the read before the load and the read
after (ECC, remapped rows, retired pages, PCIe replays, NVLink errors, Xid events,
GPUs gone), and what was already on the GPUs when the step began (GPU_BUSY).

An uncorrectable error, a new remap pending or failure, a new double-bit retirement,
a GPU that fell off the bus or is gone, or an Xid that means a bad GPU, memory or link
(``kernel_log.XID_CATALOG``: 48, 63, 64, 74, 79, 92, 94, 95, ...) is FAIL with the
kernel log lines as evidence. A kernel log nobody could read is INFO: "no new Xid" is
never claimed from it.
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.judging.sink import Sink
from orchestrator.steps.health.counters import CountersDelta, delta
from orchestrator.steps.health.output import NodeOutput
from payload.health import protocol
from payload.nodecheck import BUSY_FAIL_MIB


def _files(out: NodeOutput, *names: str) -> list[Path]:
    base = out.folder / protocol.COUNTERS_DIR
    paths = []
    for when in ("before", "after"):
        for n in names:
            paths += sorted((base / when).glob(n + ".*"))
    return [p for p in paths if not p.name.endswith(".stderr")]


def judge_counters(sink: Sink, out: NodeOutput) -> CountersDelta | None:
    """The before/after delta of every GPU of the node, as findings."""
    node = out.node
    for problem in out.problems:
        sink.add("HEALTH_COUNTERS_UNREADABLE", "WARN", f"{node}: {problem}", [out.doc_file])
    if out.before is None or out.after is None:
        if out.status not in ("no-gpu",):
            sink.add("HEALTH_COUNTERS_UNREADABLE", "WARN", f"{node}: the counters were not "
                     "read both before and after the load: nothing can be said about what "
                     "grew", [out.doc_file])
        return None
    d = delta(out.before, out.after)
    _kernel_log(sink, out, d)
    q = _files(out, "query-gpu")
    for key, g in sorted(d.gpus.items()):
        who = _who(out, key)
        for what, grew in (("uncorrectable volatile ECC", g.ecc_uncorrected_volatile),
                           ("uncorrectable aggregate ECC", g.ecc_uncorrected_aggregate)):
            if grew and grew > 0:
                sink.add("GPU_ECC_UNCORRECTABLE", "FAIL", f"{node} {who}: {grew} new {what} "
                         "error(s) during the load", q, gpu=key, grew=grew, counter=what)
                break
        if g.ecc_corrected_volatile and g.ecc_corrected_volatile > 0:
            sink.add("GPU_ECC_CORRECTED", "WARN", f"{node} {who}: "
                     f"{g.ecc_corrected_volatile} new correctable ECC error(s) during the "
                     "load (corrected, but a card that collects them under load is wearing)",
                     q, gpu=key, grew=g.ecc_corrected_volatile)
        if g.new_remap_pending or g.new_remap_failure or (g.remapped_uncorrectable or 0) > 0:
            why = ("a row remap failed" if g.new_remap_failure else
                   "a row remap is now pending (takes effect at the next GPU reset)"
                   if g.new_remap_pending else
                   f"{g.remapped_uncorrectable} row(s) remapped for uncorrectable errors")
            sink.add("GPU_REMAP", "FAIL", f"{node} {who}: {why} during the load", q, gpu=key,
                     pending=g.new_remap_pending, failure=g.new_remap_failure,
                     remapped=g.remapped_uncorrectable)
        if g.new_retired_pending or (g.retired_double or 0) > 0:
            sink.add("GPU_PAGES_RETIRED", "FAIL", f"{node} {who}: "
                     + (f"{g.retired_double} page(s) retired for double-bit errors"
                        if g.retired_double else "a page retirement is now pending")
                     + " during the load", q, gpu=key, retired_double=g.retired_double)
        if g.replays and g.replays > 0:
            sink.add("PCIE_REPLAYS", "WARN", f"{node} {who}: {g.replays} PCIe replay(s) "
                     "during the load (the link retransmits: a marginal slot, riser or "
                     "cable)", _files(out, "nvidia-smi-q"), gpu=key, replays=g.replays)
        if g.nvlink:
            top = sorted(g.nvlink.items(), key=lambda kv: -kv[1])[:4]
            sink.add("NVLINK_ERRORS", "WARN", f"{node} {who}: NVLink error counters grew "
                     "during the load (" + ", ".join(f"link {k} +{v}" for k, v in top) + ")",
                     _files(out, "nvlink-e"), gpu=key, grew=dict(g.nvlink))
    for key in d.missing_after:
        sink.add("GPU_GONE", "FAIL", f"{node} {_who(out, key)}: read before the load and "
                 "absent after it (fallen off the bus, or the driver lost it)", q, gpu=key)
    return d


def _who(out: NodeOutput, key: str) -> str:
    g = (out.before.gpus.get(key) if out.before else None) or (
        out.after.gpus.get(key) if out.after else None)
    return f"GPU {g.index}" if g is not None and g.index is not None else f"GPU {key}"


def _kernel_log(sink: Sink, out: NodeOutput, d: CountersDelta) -> None:
    node = out.node
    if d.kernel_log is None:
        notes = {**(out.before.unreadable if out.before else {}),
                 **(out.after.unreadable if out.after else {})}
        why = "; ".join(f"{k}: {v}" for k, v in sorted(notes.items())
                        if k in ("dmesg", "journalctl-k")) or "neither dmesg nor journalctl -k"
        sink.add("KERNEL_LOG_UNREADABLE", "INFO", f"{node}: the kernel log is not readable "
                 f"({why}): Xid events during the load cannot be seen", [out.doc_file],
                 reasons=notes)
        return
    log = _files(out, d.kernel_log)
    for ev in d.new_xids:
        what = f"Xid {ev.xid} ({ev.meaning or 'not in the catalog'}) on {ev.pci}"
        line = ev.line.strip()
        if ev.bad:
            sink.add("GPU_XID", "FAIL", f"{node}: {what} during the load: {line}", log,
                     xid=ev.xid, pci=ev.pci, category=ev.category, line=line,
                     line_no=ev.line_no, source=d.kernel_log)
        else:
            sink.add("GPU_XID", "WARN", f"{node}: {what} during the load (an application "
                     f"or driver event, not the GPU itself): {line}", log, xid=ev.xid,
                     pci=ev.pci, category=ev.category, line=line, line_no=ev.line_no,
                     source=d.kernel_log)
    for b in d.new_bus_events:
        sink.add("GPU_FELL_OFF_BUS", "FAIL", f"{node}: {b.text.strip()}", log, pci=b.pci,
                 line_no=b.line_no)


def judge_busy(sink: Sink, out: NodeOutput) -> dict[str, str]:
    """Processes already holding GPU memory when the step began: another job on the GPU
    (FAIL above `BUSY_FAIL_MIB` on a GPU, as preflight judges it; WARN below: a monitoring
    agent), the usual cause of out-of-memory and of figures that are not the card's.
    Returns, per GPU (its UUID, bus id and index as text), the processes in words, so the
    figures measured beside them say whose they are."""
    snap = out.before
    if snap is None or snap.apps is None:
        return {}
    apps = list(snap.apps.apps)
    if not apps:
        return {}
    by_gpu: dict[str, list[str]] = {}
    held: dict[str, int] = {}
    keys: dict[str, list[str]] = {}
    for a in apps:
        gpu = a.gpu_uuid or a.gpu_bus_id or "?"
        g = snap.gpus.get(gpu) or next((x for x in snap.gpus.values()
                                        if gpu in (x.uuid, x.bus_id)), None)
        name = f"GPU {g.index}" if g is not None and g.index is not None else gpu
        mib = f"{a.used_mib} MiB" if a.used_mib is not None else "memory unknown"
        by_gpu.setdefault(name, []).append(f"pid {a.pid} {a.process_name or '?'} ({mib})")
        held[name] = held.get(name, 0) + (a.used_mib or 0)
        keys[name] = [k for k in (gpu, g.uuid if g else None, g.bus_id if g else None,
                                  str(g.index) if g is not None and g.index is not None
                                  else None) if k]
    total = sum(a.used_mib or 0 for a in apps)
    big = any(v > BUSY_FAIL_MIB for v in held.values()) or any(a.used_mib is None for a in apps)
    sink.add("GPU_BUSY", "FAIL" if big else "WARN",
             f"{out.node}: {len(apps)} process(es) already on the GPUs "
             f"before gpuvet started, holding {total} MiB: " + "; ".join(
                 f"{k}: {', '.join(v)}" for k, v in sorted(by_gpu.items()))
             + (": another job holds the GPU; the figures measured beside it are not the "
                "card's. Ask the provider for a free GPU" if big else
                " (the usual cause of out-of-memory on a card of the full size)"),
             _files(out, "compute-apps"), processes=[{"pid": a.pid, "name": a.process_name,
                                                      "used_mib": a.used_mib,
                                                      "gpu": a.gpu_uuid or a.gpu_bus_id}
                                                     for a in apps], used_mib=total)
    if not big:
        return {}
    return {k: f"{name}: {', '.join(by_gpu[name])}" for name, ks in keys.items() for k in ks}
