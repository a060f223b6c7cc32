"""Links against the order: NVLink and peer-to-peer between the GPUs, and the RDMA fabric.

The fabric's ports are read from ibv_devinfo, with the rate ibstat prints where
ibv_devinfo has none; ibstat alone is enough where it is all a node gave.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.inventory import Expectations
from orchestrator.steps.preflight.facts import NodeFacts, Result, gpu_views
from orchestrator.suite import PreflightParams


def check_topology(nf: NodeFacts, ex: Expectations, p: PreflightParams) -> list[Result]:
    out: list[Result] = []
    topo = nf.get("topo_m")
    if ex.interconnect in ("nvswitch", "nvlink") and gpu_views(nf):
        if topo is None:
            out.append(Result("TOPOLOGY_UNKNOWN", "WARN", "nvidia-smi topo -m gave no matrix; "
                              "NVLink could not be verified", nf.ev("topo_m")))
        elif topo.pcie_only:
            out.append(Result("TOPOLOGY_UNKNOWN", "WARN", "the topology is `nvidia-smi topo -mp`, "
                              "the PCIe-only view (its legend has no NV#): it shows the PCIe "
                              "path of every pair, NVLink or not, so NVLink could not be "
                              "verified; save `nvidia-smi topo -m`", nf.ev("topo_m")))
        else:
            bad = topo.non_nvlink_pairs()
            if bad:
                shown = ", ".join(f"GPU{i}-GPU{j} {rel}" for i, j, rel in bad[:12])
                more = f" (+{len(bad) - 12} more)" if len(bad) > 12 else ""
                out.append(Result("INTERCONNECT", "FAIL",
                                  f"{ex.interconnect} ordered but {len(bad)} GPU pair(s) do not "
                                  f"talk over NVLink: {shown}{more}", nf.ev("topo_m"),
                                  {"pairs": [[i, j, r] for i, j, r in bad]}))
            elif topo.pairs():
                kinds = sorted({rel for _, _, rel in topo.pairs()})
                out.append(Result("INTERCONNECT", "PASS",
                                  f"every GPU pair on NVLink ({', '.join(kinds)})", nf.ev("topo_m")))
        nvl = nf.get("nvlink_s")
        if nvl is not None and nvl.unknown:
            out.append(Result("NVLINK_UNKNOWN", "INFO", "NVLink speeds not read for every GPU: "
                              + "; ".join(nvl.unknown), nf.ev("nvlink_s")))
    p2p = nf.get("topo_p2p_n")
    if p2p is not None:
        bad_p2p = [(i, j, s) for i, j, s in p2p.not_ok_pairs() if i < j]
        if bad_p2p:
            shown = ", ".join(f"GPU{i}-GPU{j} {s}" for i, j, s in bad_p2p[:12])
            out.append(Result("P2P_NOT_OK", "FAIL", f"peer-to-peer not OK between "
                              f"{len(bad_p2p)} GPU pair(s): {shown}", nf.ev("topo_p2p_n")))
    return out


# ibstat's port states in ibv_devinfo's words, so both read the same
_IBSTAT_STATE = {"Active": "PORT_ACTIVE", "Down": "PORT_DOWN", "Initializing": "PORT_INIT",
                 "Init": "PORT_INIT", "Armed": "PORT_ARMED"}


@dataclass
class _Port:
    hca: str
    port: int
    state: str | None
    link_layer: str | None
    rate_gbps: float | None


def _rdma_ports(nf: NodeFacts) -> list[_Port]:
    """Ports from ibv_devinfo, with the rate ibstat prints where ibv_devinfo has none."""
    ports: dict[tuple[str, int], _Port] = {}
    ib = nf.get("ibv_devinfo")
    for d in (ib.devices if ib is not None else []):
        for pt in d.ports:
            ports[(d.hca_id, pt.port)] = _Port(d.hca_id, pt.port, pt.state, pt.link_layer,
                                               pt.rate_gbps)
    st = nf.get("ibstat")
    for name, pt in (st.ports if st is not None else []):
        known = ports.get((name, pt.port))
        if known is None:
            ports[(name, pt.port)] = _Port(name, pt.port, _IBSTAT_STATE.get(pt.state or "",
                                                                           pt.state),
                                           pt.link_layer, pt.rate_gbps)
        elif known.rate_gbps is None:
            known.rate_gbps = pt.rate_gbps
    return list(ports.values())


def check_fabric(nf: NodeFacts, ex: Expectations, p: PreflightParams) -> list[Result]:
    if ex.fabric.type not in ("ib", "roce"):
        return []
    all_ports = _rdma_ports(nf)
    ev = nf.ev("ibv_devinfo", "ibstat")
    if not all_ports:
        return [Result("IB_MISSING", "FAIL", f"{ex.fabric.type} ordered but no RDMA device found "
                       "(ibv_devinfo missing or empty): NCCL will fall back to TCP sockets", ev)]
    want_layer = "InfiniBand" if ex.fabric.type == "ib" else "Ethernet"
    ports = [pt for pt in all_ports if pt.link_layer in (None, want_layer)]
    out: list[Result] = []
    down = [f"{pt.hca}:{pt.port} {pt.state}" for pt in ports if pt.state != "PORT_ACTIVE"]
    if down:
        out.append(Result("IB_PORT_DOWN", "FAIL", "RDMA ports not ACTIVE: " + ", ".join(down), ev))
    active = [pt for pt in ports if pt.state == "PORT_ACTIVE"]
    if ex.fabric.nics is not None and len(active) < ex.fabric.nics:
        out.append(Result("IB_PORT_COUNT", "FAIL", f"{len(active)} active {want_layer} port(s), "
                          f"{ex.fabric.nics} ordered", ev))
    if ex.fabric.rate_gbps:
        slow = [f"{pt.hca}:{pt.port} {pt.rate_gbps:g} Gb/s" for pt in active
                if pt.rate_gbps is not None and pt.rate_gbps < ex.fabric.rate_gbps * 0.95]
        unknown = [f"{pt.hca}:{pt.port}" for pt in active if pt.rate_gbps is None]
        if slow:
            out.append(Result("IB_RATE_LOW", "FAIL", f"ports slower than the "
                              f"{ex.fabric.rate_gbps:g} Gb/s ordered: " + ", ".join(slow), ev))
        elif unknown and len(unknown) == len(active):
            out.append(Result("IB_RATE_UNKNOWN", "WARN", f"no output gave the rate of "
                              f"{', '.join(unknown)} (plain ibv_devinfo prints none; ibstat or "
                              f"ibv_devinfo -v do): {ex.fabric.rate_gbps:g} Gb/s unverified", ev))
    st = nf.get("ibstat")
    if st is not None and st.errors:
        out.append(Result("IB_LISTING_INCOMPLETE", "WARN", "ibstat stopped with "
                          f"`{st.errors[0].text}`: adapters after it were not listed",
                          nf.ev("ibstat")))
    if not [r for r in out if r.severity == "FAIL"]:
        out.append(Result("IB_PORTS", "PASS", f"{len(active)} {want_layer} port(s) ACTIVE", ev))
    return out

