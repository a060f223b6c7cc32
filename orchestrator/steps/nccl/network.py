"""The nccl step's network mode judged against the order's fabric.

In the network mode NCCL runs with NCCL_P2P_DISABLE=1 and NCCL_SHM_DISABLE=1, so every
rank's bytes cross the NICs, between GPUs of one node too. What its NCCL INFO lines and
its busbw say about the network, each a result of its own:

- the transport NCCL chose per channel (NET/IB, NET/Socket, a plugin's), a fact; TCP
  sockets where the order says ib, roce or efa is a FAIL (NCCL_SOCKET_FALLBACK), and
  on sockets the per-NIC line-rate judge does not apply (it is for RDMA NICs);
- GPUDirect RDMA: `GDRDMA` on the NET channels (NIC reads and writes GPU memory) or
  not; with `expect.fabric.gpudirect: true` its absence is a FAIL that names the
  likely causes, otherwise a fact;
- busbw per NIC against the line rate (`rate_gbps` / 8 GB/s). Every rank sends at its
  busbw (that is what busbw is, for every collective nccl-tests runs), and in this
  mode every rank sends through a NIC, so a node's NICs carry ranks-per-node x busbw
  between them: per NIC, busbw x ranks per node / NICs used. Judged against
  ACHIEVABLE_FRACTION of the line rate, the share NVIDIA's NCCL engineers quote.

Pure functions over parsed facts; the judge (judge.py) writes the results as findings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.inventory import Fabric
from orchestrator.parsers.nccl_debug import NcclConnection, NcclDebugFacts
from orchestrator.records import Severity

# What NCCL reaches on a healthy RDMA NIC, as a share of its line rate: "For NDR @ 400Gbps
# you should see 46-48GB/s per NIC" (NVIDIA/nccl-tests issue 290, two nodes with
# NCCL_ALGO=RING; 46/50 = 0.92), "the peak for 200G HDR is 24GB/s" (NVIDIA/nccl issue 412;
# 24/25 = 0.96). The lower figure is the one expected.
ACHIEVABLE_FRACTION = 0.92
# Below this share of the line rate a NIC is slow: a WARN naming the figure. GPUDirect
# RDMA off about halves a NIC's rate ("~20 GB/s bandwidth (about half of what we should see
# if we enable GPU Direct RDMA)", NVIDIA/nccl issue 214), which this catches too.
SLOW_FRACTION = 0.75
RDMA_FABRICS = ("ib", "roce", "efa")
GPUDIRECT_CAUSES = (
    "the peer-memory module is not loaded (`lsmod | grep nvidia_peermem`; or a driver and "
    "kernel with DMA-BUF), PCIe ACS is enabled on the switches between GPU and NIC "
    "(`lspci -vvv | grep ACSCtl` shows SrcValid+; disable it outside VMs), the IOMMU is on "
    "(intel_iommu/amd_iommu; use iommu=pt), or the NIC is too far from the GPU for "
    "NCCL_NET_GDR_LEVEL (NCCL says `distance N >= M`)")


@dataclass(frozen=True)
class NetResult:
    code: str
    severity: Severity
    message: str
    details: dict[str, Any] = field(default_factory=dict)


def line_rate_gbs(rate_gbps: float) -> float:
    """A NIC's line rate in GB/s (bytes), as busbw is printed."""
    return rate_gbps / 8


def per_nic_gbs(busbw: float, ranks_per_node: int, nics: int) -> float:
    """The busbw each NIC carries when every rank sends through the NICs: a node's ranks
    each send at busbw, spread over the NICs the node uses."""
    return busbw * ranks_per_node / nics


def nics_used(conns: list[NcclConnection]) -> dict[str, list[str]]:
    """Per host, the NET devices (NCCL's index, `NET/IB/<dev>`) its channels went through."""
    out: dict[str, set[str]] = {}
    for c in conns:
        if c.transport != "NET":
            continue
        parts = c.detail.split("/")
        dev = parts[1] if len(parts) > 1 and parts[1].isdigit() else "?"
        out.setdefault(c.host, set()).add(dev)
    return {h: sorted(d, key=lambda x: (not x.isdigit(), int(x) if x.isdigit() else 0))
            for h, d in sorted(out.items())}


def _socket(net: str | None) -> bool:
    return (net or "").lower() == "socket"


def judge_network(dbg: NcclDebugFacts | None, fabric: Fabric, *, busbw: float | None,
                  size: str | None, ranks_per_node: int | None) -> list[NetResult]:
    """The network mode's results from one log's NCCL INFO facts and the busbw at the
    largest size (median over rounds)."""
    if dbg is None or not dbg.connections:
        why = ("the log has no NCCL INFO lines" if dbg is None else
               "NCCL INFO shows no channel connections (run with NCCL_DEBUG=INFO and "
               "NCCL_DEBUG_SUBSYS including INIT)")
        return [NetResult("NCCL_NETWORK_NOT_MEASURED", "INFO",
                          f"the transport NCCL chose, GPUDirect RDMA and busbw per NIC are not "
                          f"judged: {why}")]
    out: list[NetResult] = []
    net = [c for c in dbg.connections if c.transport == "NET"]
    local = sorted({c.transport for c in dbg.connections if c.transport in ("P2P", "SHM")})
    used = dbg.used
    if local:
        out.append(NetResult(
            "NCCL_NETWORK_NOT_ISOLATED", "WARN",
            f"{'/'.join(local)} connections in the log although the network mode turns peer "
            "access and shared memory off: part of the traffic did not cross the NICs, so "
            "the busbw is not the network's alone", {"transports": used}))
    if not net:
        out.append(NetResult("NCCL_NETWORK_NOT_MEASURED", "INFO",
                             f"no NET channel in the log (transports: {', '.join(used)}): "
                             "nothing went through the NICs"))
        return out
    devs = nics_used(net)
    shown = "; ".join(f"{h}: {', '.join(d)}" for h, d in devs.items())
    sockets = [c for c in net if _socket(c.net)]
    kinds = sorted({f"NET/{c.net}" for c in net})
    out.append(NetResult(
        "NCCL_NET_TRANSPORT", "INFO",
        f"transport through the NICs: {', '.join(kinds)} on {len(net)} channel "
        f"connection(s), NET devices per host {shown}", {"transports": kinds, "devices": devs}))
    if sockets:
        lines = sorted({c.line_no for c in sockets})[:5]
        if fabric.type in RDMA_FABRICS:
            out.append(NetResult(
                "NCCL_SOCKET_FALLBACK", "FAIL",
                f"{fabric.type} was ordered but NCCL sent through TCP sockets (NET/Socket, "
                f"log lines {', '.join(map(str, lines))}); check the RDMA devices, NCCL_IB_HCA "
                "and the network plugin", {"lines": lines}))
        out.append(NetResult(
            "NCCL_NET_SOCKET", "INFO",
            "NCCL used TCP sockets (NET/Socket): the bytes went through the kernel's TCP "
            "stack and host memory, so GPUDirect RDMA is not judged and the per-NIC "
            "line-rate judge does not apply (it is for RDMA NICs; sockets are what a host "
            "without them, or simulated nodes sharing one host, use)",
            {"lines": lines}))
        return out
    out += _gpudirect(net, dbg, fabric)
    out += _per_nic(devs, fabric, busbw=busbw, size=size, ranks_per_node=ranks_per_node)
    return out


def _gpudirect(net: list[NcclConnection], dbg: NcclDebugFacts,
               fabric: Fabric) -> list[NetResult]:
    direct = [c for c in net if c.gdrdma]
    without = [c for c in net if not c.gdrdma]
    disabled = [g for g in dbg.gdr_notes if not g.enabled]
    said = (f"; NCCL says: GPU Direct RDMA Disabled for {disabled[0].what} (line "
            f"{disabled[0].line_no}{f', and {len(disabled) - 1} more' if len(disabled) > 1 else ''})"
            if disabled else "")
    details: dict[str, Any] = {"channels": len(net), "gdrdma": len(direct),
                               "disabled_lines": [g.line_no for g in disabled][:20]}
    if not without:
        sev: Severity = "PASS" if fabric.gpudirect else "INFO"
        return [NetResult("NCCL_GPUDIRECT", sev, f"GPUDirect RDMA on every NET channel "
                          f"({len(net)}, GDRDMA): the NICs read and write GPU memory",
                          details)]
    lines = sorted({c.line_no for c in without})[:5]
    details["lines"] = lines
    part = (f"on {len(without)} of {len(net)} NET channel(s)" if direct else
            f"on none of the {len(net)} NET channel(s)")
    what = (f"no GPUDirect RDMA {part} (no GDRDMA, log lines {', '.join(map(str, lines))}): "
            f"the bytes are staged through host memory{said}" if not direct else
            f"GPUDirect RDMA missing {part} (no GDRDMA, log lines "
            f"{', '.join(map(str, lines))}){said}")
    if fabric.gpudirect:
        return [NetResult("NCCL_GPUDIRECT", "FAIL", f"{what}; GPUDirect RDMA was ordered. "
                          f"Likely causes: {GPUDIRECT_CAUSES}", details)]
    return [NetResult("NCCL_GPUDIRECT", "INFO", what, details)]


def _per_nic(devs: dict[str, list[str]], fabric: Fabric, *, busbw: float | None,
             size: str | None, ranks_per_node: int | None) -> list[NetResult]:
    out: list[NetResult] = []
    seen = max((len(d) for d in devs.values()), default=0)
    if fabric.nics and seen and seen < fabric.nics:
        out.append(NetResult(
            "NCCL_NET_NICS", "WARN",
            f"NCCL sent through {seen} NET device(s) per node at most, {fabric.nics} NICs were "
            f"ordered: the others carried nothing (down, filtered by NCCL_IB_HCA, or not "
            "found near the GPUs)", {"used": seen, "ordered": fabric.nics}))
    nics = seen or fabric.nics
    if busbw is None or not ranks_per_node or not nics:
        return out
    each = per_nic_gbs(busbw, ranks_per_node, nics)
    how = (f"busbw {busbw:.1f} GB/s at {size} x {ranks_per_node} rank(s) per node / "
           f"{nics} NIC(s) = {each:.1f} GB/s per NIC")
    details: dict[str, Any] = {"busbw": busbw, "ranks_per_node": ranks_per_node, "nics": nics,
                               "per_nic_gbs": each}
    if fabric.rate_gbps is None:
        out.append(NetResult("NCCL_NET_PER_NIC", "INFO",
                             f"{how}; the order states no rate_gbps, so it is not judged",
                             details))
        return out
    line = line_rate_gbs(fabric.rate_gbps)
    share = each / line
    details.update(line_rate_gbs=line, fraction=share, expected_fraction=ACHIEVABLE_FRACTION,
                   slow_fraction=SLOW_FRACTION)
    against = (f"{share:.0%} of the {fabric.rate_gbps:g} Gb/s line rate ({line:g} GB/s; about "
               f"{ACHIEVABLE_FRACTION:.0%} is what NCCL reaches on a healthy NIC)")
    if share < SLOW_FRACTION:
        out.append(NetResult("NCCL_NET_PER_NIC", "WARN",
                             f"{how}: {against}, below {SLOW_FRACTION:.0%}", details))
    else:
        out.append(NetResult("NCCL_NET_PER_NIC", "PASS", f"{how}: {against}", details))
    return out
