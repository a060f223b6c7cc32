"""The links: pinned host copies per GPU against the PCIe link (its generation and
width, and the order's ``pcie`` expectation), all GPUs at once against the sum of
each alone (a shared switch), and the peer matrix against the topology class.

A pair that ``nvidia-smi topo -m`` calls NV# but that measures like PCIe (under
PCIE_LIKE times what the GPU's own host link carries) is FAIL, as is an NV# pair
without peer access; NV# pairs far below the others (an NVSwitch system means
every pair alike) are WARN.
"""

from __future__ import annotations

import statistics
from typing import Any

from orchestrator.inventory.model import PcieExpectation
from orchestrator.judging.sink import Sink
from orchestrator.steps.health.counters import GpuCounters
from orchestrator.steps.health.datasheet import Variant, pcie_gbps
from orchestrator.steps.health.judge_perf import grade
from orchestrator.steps.health.output import GpuOutput, NodeOutput

PCIE_LIKE = 1.5  # an NV# pair under this times the host link's figure measures like PCIe
UNEVEN = 0.8  # an NV# pair under this share of the NV# median
SHARED = 0.75  # all GPUs at once under this share of the sum of each alone


def _link_text(gen: int | None, width: int | None) -> str:
    return f"Gen{gen or '?'} x{width or '?'}"


def expected_link(c: GpuCounters | None, v: Variant | None, want: PcieExpectation
                  ) -> tuple[int | None, int | None]:
    """The link a GPU should have: the order's, else what GPU and slot can do, else the
    datasheet's."""
    gen = want.min_gen or (c.pcie_gen_max if c is not None else None) or (
        v.pcie.gen if v is not None else None)
    width = want.min_width or (c.pcie_width_max if c is not None else None) or (
        v.pcie.width if v is not None else None)
    return gen, width


def judge_pcie(sink: Sink, out: NodeOutput, g: GpuOutput, c: GpuCounters | None,
               v: Variant | None, want: PcieExpectation) -> None:
    ev = out.links.get("pcie")
    vals = (ev or {}).get("values") or {} if (ev or {}).get("event") == "done" else {}
    who = f"{out.node} GPU {g.entry}"
    links = out.folder / "links.jsonl"
    cur = _link_text(c.pcie_gen if c else None, c.pcie_width if c else None)
    top = _link_text(c.pcie_gen_max if c else None, c.pcie_width_max if c else None)
    if c is not None and (
            (want.min_width and c.pcie_width and c.pcie_width < want.min_width)
            or (want.min_gen and c.pcie_gen_max and c.pcie_gen_max < want.min_gen)
            or (want.min_width and c.pcie_width_max and c.pcie_width_max < want.min_width)):
        sink.add("HEALTH_PCIE_LINK", "FAIL", f"{who}: the host link is {cur} (at most {top}), "
                 f"the order says {_link_text(want.min_gen, want.min_width)}",
                 [out.folder / "counters" / "before" / "query-gpu.csv"], gpu=g.entry,
                 gen=c.pcie_gen, width=c.pcie_width, gen_max=c.pcie_gen_max,
                 width_max=c.pcie_width_max, order_gen=want.min_gen,
                 order_width=want.min_width)
    gen, width = expected_link(c, v, want)
    frac = v.achievable.host_copy if v is not None else 0.873
    for way in ("h2d", "d2h"):
        val = vals.get(f"{g.label}_{way}_gbps")
        if not isinstance(val, (int, float)):
            continue
        sink.measure(f"health.pcie.{way}_gbps", val, "GB/s", node=out.node, gpu=g.entry)
        if not gen or not width or gen not in (1, 2, 3, 4, 5, 6):
            continue
        expected = pcie_gbps(gen, width) * frac
        ratio = val / expected
        sev = grade(ratio)
        sink.add("HEALTH_PCIE", sev, f"{who}: pinned {way.upper()} {val:.1f} GB/s, "
                 f"{ratio:.2f} of the {expected:.1f} GB/s a {_link_text(gen, width)} link "
                 f"gives ({frac:.3f} of {pcie_gbps(gen, width):.1f}"
                 f"{v.fraction_note if v is not None else ''}); the link reads {cur} "
                 f"(at most {top})", [links], gpu=g.entry, way=way, value=round(val, 3),
                 expected=round(expected, 3), ratio=round(ratio, 4), gen=gen, width=width)


def judge_pcie_all(sink: Sink, out: NodeOutput) -> None:
    ev = out.links.get("pcie_all")
    alone = out.links.get("pcie")
    if not ev or ev.get("event") != "done" or not alone or alone.get("event") != "done":
        return
    vals, one = ev.get("values") or {}, alone.get("values") or {}
    for way in ("h2d", "d2h"):
        total = vals.get(f"sum_{way}_gbps")
        each = [float(x) for k, x in one.items() if k.endswith(f"_{way}_gbps")
                and isinstance(x, (int, float))]
        if not isinstance(total, (int, float)) or not each:
            continue
        sink.measure(f"health.pcie_all.{way}_gbps", total, "GB/s", node=out.node)
        share = total / sum(each)
        if share < SHARED:
            sink.add("HEALTH_PCIE_SHARED", "WARN", f"{out.node}: all {len(each)} GPUs at once "
                     f"move {total:.1f} GB/s {way.upper()}, {share:.2f} of the "
                     f"{sum(each):.1f} GB/s they move one at a time: they share a switch "
                     "or host link", [out.folder / "links.jsonl"], way=way,
                     share=round(share, 4))


def _topo_names(out: NodeOutput, labels: list[str]) -> dict[str, str]:
    """Each label's name in topo -m (GPU<index>)."""
    names = {}
    for g in out.gpus:
        if g.label not in labels:
            continue
        c = out.counters_of(g, out.before)
        idx = c.index if c is not None and c.index is not None else (
            int(g.entry) if g.entry.isdigit() else None)
        if idx is not None:
            names[g.label] = f"GPU{idx}"
    return names


def judge_peers(sink: Sink, out: NodeOutput, host_gbps: float | None) -> None:
    ev = out.links.get("peer")
    if not ev or ev.get("event") != "done":
        return
    m = ev.get("matrix") or {}
    labels = [str(x) for x in m.get("labels") or []]
    gbps: list[list[Any]] = m.get("gbps") or []
    access: list[list[Any]] = m.get("can_access_peer") or []
    n = len(labels)
    if n < 2 or len(gbps) != n:
        return
    evidence = [out.folder / "links.jsonl", out.folder / "counters" / "before" / "topo-m.txt"]
    names = _topo_names(out, labels)
    topo = out.topo.matrix if out.topo is not None else {}
    vals = ev.get("values") or {}
    for k in ("min_gbps", "median_gbps"):
        if isinstance(vals.get(k), (int, float)):
            sink.measure(f"health.peer.{k}", vals[k], "GB/s", node=out.node)
    nv: list[tuple[int, int, float, str]] = []
    for i in range(n):
        for j in range(n):
            if i == j or not isinstance(gbps[i][j], (int, float)):
                continue
            cls = topo.get(names.get(labels[i], ""), {}).get(names.get(labels[j], ""), "")
            if cls.startswith("NV"):
                nv.append((i, j, float(gbps[i][j]), cls))
    floor = PCIE_LIKE * host_gbps if host_gbps else None
    bad = []
    for i, j, val, cls in nv:
        no_access = bool(access) and not access[i][j]
        if no_access or (floor is not None and val < floor):
            bad.append((i, j, val, cls, no_access))
    for i, j, val, cls, no_access in bad:
        what = ("without peer access" if no_access else
                f"{val:.1f} GB/s, like PCIe (under {floor:.0f} GB/s)")
        sink.add("HEALTH_PEER", "FAIL", f"{out.node}: GPU {labels[i]} -> GPU {labels[j]}: "
                 f"topo says {cls} but the pair measures {what}", evidence, src=labels[i],
                 dst=labels[j], topo=cls, gbps=round(val, 3), can_access_peer=not no_access)
    if len(nv) >= 2:
        med = statistics.median(v for _, _, v, _ in nv)
        slow = [(i, j, v, c) for i, j, v, c in nv if v < UNEVEN * med
                and not any(b[0] == i and b[1] == j for b in bad)]
        for i, j, val, cls in slow:
            sink.add("HEALTH_PEER", "WARN", f"{out.node}: GPU {labels[i]} -> GPU {labels[j]} "
                     f"({cls}) measures {val:.1f} GB/s, {val / med:.2f} of the NV# pairs' "
                     f"median {med:.1f}", evidence, src=labels[i], dst=labels[j], topo=cls,
                     gbps=round(val, 3))
        if not bad and not slow:
            sink.add("HEALTH_PEER", "PASS", f"{out.node}: {len(nv)} NV# pair(s) measure like "
                     f"NVLink (median {med:.1f} GB/s one way)", evidence, pairs=len(nv))
    elif not topo:
        sink.add("HEALTH_PEER", "INFO", f"{out.node}: no topology to judge the peer matrix "
                 f"against (min {vals.get('min_gbps')}, median {vals.get('median_gbps')} "
                 "GB/s one way)", evidence)

