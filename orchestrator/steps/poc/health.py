"""The health outputs people collect with other tools, in a PoC folder: what gpuvet judges in
each (how each shows itself is `kinds.HEALTH_SIGNATURES`).

`dcgmi diag` tables (a failed test FAIL, a warning WARN), kernel logs with Xid lines
(an Xid that means a bad GPU, memory or link FAIL, the others WARN; a GPU fallen off
the bus FAIL; the PCI core's "limited by" lines WARN), `nvidia-smi nvlink -e`
(counters above zero WARN), `lspci -vvv` (an NVIDIA GPU whose link trained narrower
than it can WARN; a slower speed INFO, as GPUs lower it when idle), the processes
already on the GPUs (GPU_BUSY WARN), and the bandwidth tools (perftest `ib_write_bw`,
`nvbandwidth`, cuda-samples `p2pBandwidthLatencyTest`: their figures as INFO, peer
access missing between GPUs WARN, nvbandwidth's own errors WARN). The codes are the
health step's where the same thing is judged.
"""

from __future__ import annotations

from collections.abc import Callable

from orchestrator.errors import ParseError
from orchestrator.inventory import Node
from orchestrator.judging.sink import Sink
from orchestrator.parsers.dcgmi import DcgmiDiagFacts, NvlinkStatusFacts
from orchestrator.parsers.kernel_log import KernelLogFacts, PcieBandwidthFacts, parse_pcie_bandwidth
from orchestrator.parsers.lspci import LspciFacts
from orchestrator.parsers.nvbandwidth import NvbandwidthFacts
from orchestrator.parsers.nvidia_smi_health import ComputeAppsFacts, NvlinkErrorsFacts, PmonFacts
from orchestrator.parsers.p2p_latency import P2pFacts
from orchestrator.parsers.perftest import PerftestBwFacts
from orchestrator.parsers.rdma import RdmaPortsFacts
from orchestrator.records import Finding
from orchestrator.steps.poc.files import PocFile

STEP = "import"



def judge(files: list[PocFile], copies: dict[str, str], node: Node, run_id: str
          ) -> list[Finding]:
    """What each health output says, one sink for the node."""
    sink = Sink(run_id=run_id, step=STEP, suite_hash="", provider=node.provider, node=node.name,
                nodes=[node.name], label="", rel=lambda p: str(p), scope="health",
                engine="import")
    for f in files:
        judge_one = _JUDGES.get(f.kind or "")
        if judge_one is None:
            continue
        before = len(sink.findings)
        judge_one(sink, f, node.name)
        for x in sink.findings[before:]:
            x.evidence = [copies[f.name]] if f.name in copies else []
            x.details.setdefault("file", f.name)
    return sink.findings


def _dcgmi(sink: Sink, f: PocFile, node: str) -> None:
    facts: DcgmiDiagFacts = f.facts
    errors = facts.errors
    if facts.failed or errors:
        names = [t.name for t in facts.failed] or ["(deployment)"]
        first = errors[0].text if errors else ""
        sink.add("DCGM_DIAG", "FAIL", f"{f.name}: dcgmi diag failed: {', '.join(names)}"
                 + (f": {first[:200]}" if first else ""), failed=names)
        return
    warned = [t.name for t in facts.tests if any(r.status == "Warn" for r in t.results)]
    if warned:
        sink.add("DCGM_DIAG", "WARN", f"{f.name}: dcgmi diag warns: {', '.join(warned)}",
                 warned=warned)
    else:
        sink.add("DCGM_DIAG", "PASS", f"{f.name}: dcgmi diag passed ({len(facts.tests)} tests)")


def _nvlink_status(sink: Sink, f: PocFile, node: str) -> None:
    facts: NvlinkStatusFacts = f.facts
    down = facts.down()
    for gpu, links in down.items():
        sink.add("NVLINK_LINK_DOWN", "FAIL", f"{f.name}: GPU {gpu} has {len(links)} NVLink "
                 f"link(s) down (link {', '.join(map(str, links))}): the GPUs talk slower or "
                 "not at all over NVLink", gpu=gpu, links=links)
    if not down:
        up = sum(st == "up" for links in facts.gpus.values() for st in links)
        sink.add("NVLINK_LINK_DOWN", "PASS", f"{f.name}: no NVLink link down ({up} up on "
                 f"{len(facts.gpus)} GPU(s))")


def _rdma_ports(sink: Sink, f: PocFile, node: str) -> None:
    facts: RdmaPortsFacts = f.facts
    down = facts.down
    if down:
        shown = ", ".join(f"{p.device}/{p.port} {p.state}" + (f" ({p.physical_state})"
                                                               if p.physical_state else "")
                          for p in down[:8])
        sink.add("RDMA_PORT_DOWN", "WARN", f"{f.name}: {len(down)} of {len(facts.ports)} RDMA "
                 f"port(s) not active ({facts.tool}): {shown}",
                 ports=[f"{p.device}/{p.port}" for p in down])
        return
    known = [p for p in facts.ports if p.active is not None]
    if known:
        rates = sorted({p.rate_gbps for p in known if p.rate_gbps is not None})
        sink.add("RDMA_PORT_DOWN", "PASS", f"{f.name}: {len(known)} RDMA port(s) active "
                 f"({facts.tool})" + (f" at {', '.join(f'{r:g}' for r in rates)} Gb/s"
                                      if rates else ""))
        return
    if facts.tool != "ibdev2netdev":
        sink.add("RDMA_PORT_DOWN", "INFO", f"{f.name}: {len(facts.ports)} RDMA port(s) listed "
                 f"without their state ({facts.tool}, cut before it)")
        return
    netdown = [p for p in facts.ports if p.netdev_state and p.netdev_state.lower() != "up"]
    sink.add("RDMA_PORT_DOWN", "INFO", f"{f.name}: {len(facts.ports)} HCA port(s) mapped to "
             f"network interfaces, {len(netdown)} interface(s) down ({facts.tool} shows the "
             "interface, not the InfiniBand port: read ibstat or ibstatus for the port)",
             netdevs_down=[p.netdev for p in netdown])


def _xid(sink: Sink, f: PocFile, node: str) -> None:
    facts: KernelLogFacts = f.facts
    for ev in facts.events:
        what = f"Xid {ev.xid} ({ev.meaning or 'not in the catalog'}) on {ev.pci}"
        sink.add("GPU_XID", "FAIL" if ev.bad else "WARN", f"{f.name}: {what}: "
                 f"{ev.line.strip()}", xid=ev.xid, pci=ev.pci, line_no=ev.line_no)
    for b in facts.fallen_off_bus:
        sink.add("GPU_FELL_OFF_BUS", "FAIL", f"{f.name}: {b.text.strip()}", line_no=b.line_no)
    try:  # a whole dmesg also holds the PCI core's link lines
        _pcie_limited(sink, f, parse_pcie_bandwidth(f.content() or "", source=f.name))
    except ParseError:
        pass


def _pcie(sink: Sink, f: PocFile, node: str) -> None:
    _pcie_limited(sink, f, f.facts)


def _pcie_limited(sink: Sink, f: PocFile, facts: PcieBandwidthFacts) -> None:
    for link in facts.links:
        if link.limited:
            sink.add("HEALTH_PCIE_LINK", "WARN", f"{f.name}: {link.bdf} gets "
                     f"{link.available_gbps:g} Gb/s, limited by {link.limited_at or '?'} "
                     f"(capable of {link.capable_gbps or '?'} Gb/s)", bdf=link.bdf,
                     line_no=link.line_no)


def _nvlink_e(sink: Sink, f: PocFile, node: str) -> None:
    facts: NvlinkErrorsFacts = f.facts
    for g in facts.gpus:
        grown = {f"link {ln}/{name}": v for ln, counters in g.links.items()
                 for name, v in counters.items() if v}
        if grown:
            top = sorted(grown.items(), key=lambda kv: -kv[1])[:4]
            sink.add("NVLINK_ERRORS", "WARN", f"{f.name}: GPU {g.index} has NVLink error "
                     "counts above zero (" + ", ".join(f"{k} {v}" for k, v in top) + ")",
                     gpu=g.index, counts=grown)


def _lspci(sink: Sink, f: PocFile, node: str) -> None:
    facts: LspciFacts = f.facts
    for d in facts.devices:
        if d.link_cap is None or d.link_status is None or not (d.nvidia_gpu or d.bdf is None):
            continue
        cap, sta = d.link_cap, d.link_status
        where = d.bdf or "a device"
        if d.width_downgraded:
            sink.add("HEALTH_PCIE_LINK", "WARN", f"{f.name}: {where} trained x{sta.width} of "
                     f"x{cap.width} (LnkSta, line {sta.line_no})", bdf=d.bdf,
                     width=sta.width, width_cap=cap.width)
        elif d.speed_downgraded:
            sink.add("HEALTH_PCIE_LINK", "INFO", f"{f.name}: {where} runs at "
                     f"{sta.speed_gts} of {cap.speed_gts} GT/s (GPUs lower the speed when "
                     "idle: read it under load)", bdf=d.bdf)


def _apps(sink: Sink, f: PocFile, node: str) -> None:
    facts: ComputeAppsFacts = f.facts
    if facts.apps:
        total = sum(a.used_mib or 0 for a in facts.apps)
        sink.add("GPU_BUSY", "WARN", f"{f.name}: {len(facts.apps)} process(es) on the GPUs "
                 f"holding {total} MiB: " + ", ".join(
                     f"pid {a.pid} {a.process_name or '?'}" for a in facts.apps[:8]),
                 used_mib=total)


def _pmon(sink: Sink, f: PocFile, node: str) -> None:
    facts: PmonFacts = f.facts
    procs = facts.processes
    if procs:
        sink.add("GPU_BUSY", "WARN", f"{f.name}: nvidia-smi pmon saw {len(procs)} process(es) on "
                 "the GPUs: " + ", ".join(f"pid {pid} {cmd or '?'} on GPU {gpu}"
                                          for gpu, pid, cmd in procs[:8]),
                 pids=[pid for _, pid, _ in procs])


def _perftest(sink: Sink, f: PocFile, node: str) -> None:
    facts: PerftestBwFacts = f.facts
    on = ""
    if facts.gpu is not None:
        g = facts.gpu
        on = (f" on GPU memory (CUDA device {g.device if g.device is not None else '?'}"
              + (f" {g.name}" if g.name else "") + (", DMA-BUF" if g.dmabuf else "") + ")")
    if facts.failed:
        status = (f" with status {facts.failed_status} (syndrome {facts.syndrome})"
                  if facts.failed_status is not None else "")
        sink.add("HEALTH_IB_BW", "FAIL", f"{f.name}: {facts.test or 'perftest'}{on} failed"
                 f"{status}: " + "; ".join(e.text for e in facts.errors[:3]),
                 status=facts.failed_status, syndrome=facts.syndrome)
        return
    row = facts.largest
    if row is not None:
        sink.add("HEALTH_IB_BW", "INFO", f"{f.name}: {facts.test or 'perftest'}{on} "
                 f"{row.bw_average:g} {facts.unit or ''} average at {row.bytes} bytes",
                 bytes=row.bytes, average=row.bw_average, unit=facts.unit,
                 gpu_memory=facts.gpu is not None)
    elif facts.gpu is not None:
        sink.add("HEALTH_IB_BW", "INFO", f"{f.name}: {facts.test or 'perftest'}{on}: no result "
                 "rows in the file (cut before its table)", gpu_memory=True)


def _nvbandwidth(sink: Sink, f: PocFile, node: str) -> None:
    facts: NvbandwidthFacts = f.facts
    if facts.errors:
        sink.add("HEALTH_NVBANDWIDTH", "WARN", f"{f.name}: nvbandwidth reported "
                 f"{len(facts.errors)} error(s): {facts.errors[0][:200]}")
    sums = [f"{t.name} {t.sum:g} {t.unit or ''}".strip() for t in facts.tests
            if t.name and t.sum is not None]
    where = ""
    if facts.multinode:
        where = (f" (multi-node: {len(facts.devices)} rank(s) on {len(facts.hosts)} host(s): "
                 f"{', '.join(facts.hosts[:4])})")
        for t in facts.tests:
            pairs = [v for r, vals in t.rows.items() for c, v in zip(t.columns, vals, strict=True)
                     if r != c and v is not None]
            if pairs and t.unit == "GB/s":
                sums.append(f"{t.name} between ranks {min(pairs):g} to {max(pairs):g} GB/s")
        unfinished = [t.name for t in facts.tests if t.sum is None and not t.errors and t.name]
        if unfinished and not sums:
            sums.append(f"{', '.join(unfinished)} started, no result in the file")
    if sums:
        sink.add("HEALTH_NVBANDWIDTH", "INFO", f"{f.name}{where}: " + "; ".join(sums[:6]),
                 sums={t.name: t.sum for t in facts.tests if t.name and t.sum is not None},
                 hosts=facts.hosts)


def _p2p(sink: Sink, f: PocFile, node: str) -> None:
    facts: P2pFacts = f.facts
    denied = sorted(k for k, ok in facts.access.items() if not ok)
    conn = facts.matrix("connectivity")
    if not facts.access and conn is not None:
        denied = [f"{conn.columns[i]}->{conn.columns[j]}" for i, row in enumerate(conn.values)
                  for j, v in enumerate(row) if i != j and j < len(conn.columns)
                  and i < len(conn.columns) and not v]
    if denied:
        sink.add("HEALTH_PEER", "WARN", f"{f.name}: no peer access between "
                 f"{len(denied)} GPU pair(s) ({', '.join(denied[:6])})", pairs=denied)
    m = facts.matrix("bandwidth", p2p=True, direction="unidirectional") or facts.matrix(
        "bandwidth", direction="unidirectional")
    vals = m.off_diagonal() if m is not None else []
    if m is not None and vals:
        on = "on" if m is not None and m.p2p else "off"
        sink.add("HEALTH_PEER", "INFO", f"{f.name}: peer bandwidth (P2P {on}, one way) "
                 f"{min(vals):g} to {max(vals):g} {m.unit or ''}", min=min(vals),
                 max=max(vals))


_JUDGES: dict[str, Callable[[Sink, PocFile, str], None]] = {
    "dcgmi-diag": _dcgmi, "xid": _xid, "pcie-bandwidth": _pcie, "nvlink-e": _nvlink_e,
    "lspci-vvv": _lspci, "nvidia-smi-compute-apps": _apps, "perftest-bw": _perftest,
    "nvbandwidth": _nvbandwidth, "p2pBandwidthLatencyTest": _p2p,
    "dcgmi-nvlink-s": _nvlink_status, "ibdev2netdev": _rdma_ports, "rdma-link": _rdma_ports,
    "ibstatus": _rdma_ports, "nvidia-smi-compute-apps-noheader": _apps, "nvidia-smi-pmon": _pmon,
}
