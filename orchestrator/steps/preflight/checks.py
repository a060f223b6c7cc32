"""Expectations versus facts: findings a person can act on.

Each check reads parsed facts of one node (or of all nodes of a provider),
compares them with what was ordered, and emits findings with a stable code,
a severity, a message that says what is wrong and where, and the evidence
files it read. A check whose facts are missing says so instead of passing.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from orchestrator.inventory import Expectations
from orchestrator.judging.storage import EPHEMERAL_FSTYPES, EPHEMERAL_PATH
from orchestrator.parsers.gpus import GpuView, merge_gpus
from orchestrator.parsers.nvidia_smi import NvidiaSmiLFacts, QueryGpuFacts
from orchestrator.parsers.nvidia_smi_q import NvidiaSmiQFacts
from orchestrator.parsers.nvidia_smi_table import NvidiaSmiTableFacts
from orchestrator.parsers.nvidia_smi_xml import NvidiaSmiXmlFacts
from orchestrator.records import Severity
from orchestrator.suite import PreflightParams
from payload.ncclbuild import nccl_wheel
from payload.probes import count_visible


@dataclass
class NodeFacts:
    """Everything preflight learnt about one node."""

    node: str
    provider: str
    doc: dict[str, Any]  # the payload's collect document
    facts: dict[str, BaseModel] = field(default_factory=dict)  # by command id
    parse_errors: dict[str, str] = field(default_factory=dict)
    evidence: dict[str, str] = field(default_factory=dict)  # command id -> run-relative path
    stderr_evidence: dict[str, str] = field(default_factory=dict)  # where a stderr was kept
    document_evidence: str | None = None  # collect.json itself
    # what the inventory itself sets: a deliberate CUDA_VISIBLE_DEVICES is not a fault,
    # and storage is judged only where the inventory names a checkpoint directory
    inventory_env: dict[str, str] = field(default_factory=dict)
    ckpt_configured: bool = True

    def command(self, cid: str) -> dict[str, Any]:
        return dict(self.doc.get("commands", {}).get(cid) or {})

    def get(self, cid: str) -> Any:
        return self.facts.get(cid)

    def ev(self, *cids: str) -> list[str]:
        return [self.evidence[c] for c in cids if c in self.evidence]

    def ev_failed(self, cid: str) -> list[str]:
        """The file that says why a command failed: its stderr, else its output, else the
        collect document (which records a command that was missing or timed out)."""
        rec = self.command(cid)
        if cid in self.stderr_evidence:
            return [self.stderr_evidence[cid]]
        if (rec.get("stdout") or "").strip() and cid in self.evidence:
            return [self.evidence[cid]]
        return [self.document_evidence] if self.document_evidence else self.ev(cid)


@dataclass
class Result:
    code: str
    severity: Severity
    message: str
    evidence: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)


_MAKER = re.compile("nvidia|tesla")  # the maker's words say nothing about the model


def _norm(s: str) -> str:
    return re.sub(r"[^a-z0-9]", "", _MAKER.sub("", s.lower()))


def model_matches(expected: str, actual: str) -> bool:
    """Every token of the order ("A100 SXM4 80GB") must appear in the GPU's name.

    A token that starts or ends with a digit must not run on into more digits there:
    "L4" is not "L40S", "A10" is not "A100", "80GB" is not "180GB".
    """
    spaced, squashed = actual.lower(), _norm(actual)
    # the maker's words go, also where they run on into the model ("TeslaV100")
    tokens = [t for t in re.split(r"[^a-z0-9]+", _MAKER.sub(" ", expected.lower())) if t]

    def found(t: str) -> bool:
        pat = ((r"(?<![0-9])" if t[0].isdigit() else "") + re.escape(t)
               + (r"(?![0-9])" if t[-1].isdigit() else ""))
        return re.search(pat, spaced) is not None or re.search(pat, squashed) is not None

    return bool(tokens) and all(found(t) for t in tokens)


def form_factor_of(name: str) -> str | None:
    n = name.lower()
    if "pcie" in n or " nvl" in n:
        return "pcie"
    if "sxm" in n or re.search(r"\bh(100|200|20)\b.*hbm3|^nvidia h200$|^nvidia gh200|^nvidia b200",
                               n):
        return "sxm"
    return None


# Delivered memory below this share of the order is a different card, not rounding:
# an "80 GB" A100 reports 79.2 GiB (81920 MiB minus ECC and reserve); a 40 GB one 39.6.
MEMORY_TOLERANCE = 0.93

# Outputs that describe GPUs, most trusted first; the default table and ibstat have
# no parser in the collect command list yet, so they are read here when present.
_GPU_OUTPUT_ORDER = (QueryGpuFacts, NvidiaSmiXmlFacts, NvidiaSmiQFacts, NvidiaSmiTableFacts,
                     NvidiaSmiLFacts)
_NVSMI_IDS = ("query_gpu", "nvidia_smi_L", "nvidia_smi_q_xml", "nvidia_smi")


def gpu_outputs(nf: NodeFacts) -> list[tuple[str, BaseModel]]:
    found = [(cid, f) for cid, f in nf.facts.items() if isinstance(f, _GPU_OUTPUT_ORDER)]
    return sorted(found, key=lambda cf: next(k for k, t in enumerate(_GPU_OUTPUT_ORDER)
                                             if isinstance(cf[1], t)))


def gpu_views(nf: NodeFacts) -> list[GpuView]:
    return merge_gpus(gpu_outputs(nf))


def _gpu_ev(nf: NodeFacts, views: list[GpuView], *facts: str) -> list[str]:
    told = {c for v in views for c in (v.source(*facts) if facts else v.sources)}
    return nf.ev(*[cid for cid, _ in gpu_outputs(nf) if cid in told])


def _attached(nf: NodeFacts) -> int | None:
    counts = [f.attached_gpus for _, f in gpu_outputs(nf)
              if isinstance(f, (NvidiaSmiXmlFacts, NvidiaSmiQFacts)) and f.attached_gpus is not None]
    return max(counts, default=None)


def driver_present(nf: NodeFacts) -> bool:
    return bool(gpu_views(nf))


def check_driver(nf: NodeFacts, ex: Expectations, p: PreflightParams) -> list[Result]:
    outputs = gpu_outputs(nf)
    if outputs:
        if all(isinstance(f, NvidiaSmiLFacts) for _, f in outputs):
            # nvidia-smi -L answered, nothing with details did: say so, never pass silently
            smi = nf.command("query_gpu")
            why = nf.parse_errors.get("query_gpu") or (
                (smi.get("stderr") or smi.get("stdout") or "no output").strip()[-200:])
            return [Result("GPU_DETAILS_MISSING", "FAIL", "nvidia-smi lists GPUs but "
                           f"--query-gpu gave nothing usable ({why}): count, model, memory and "
                           "health were not checked", nf.ev("query_gpu", "nvidia_smi_L"))]
        return []
    smi = nf.command("query_gpu")
    unread = {c: m for c, m in nf.parse_errors.items() if c in _NVSMI_IDS}
    if smi.get("missing"):
        why = "nvidia-smi is not installed or not on PATH: no NVIDIA driver on this node"
    elif smi.get("timed_out"):
        why = "nvidia-smi hung (timed out): the driver or a GPU is in a bad state"
    elif unread:
        # nvidia-smi ran and printed something: the driver is there, gpuvet could not read it
        shown = "; ".join(f"{c}: {m}" for c, m in unread.items())
        return [Result("NVIDIA_SMI_UNREADABLE", "FAIL", "nvidia-smi answered but its output "
                       f"could not be read ({shown}): model, count, memory, MIG and health were "
                       "not checked; the raw output is kept as evidence", nf.ev(*unread),
                       {"unreadable": unread})]
    else:
        tail = (smi.get("stderr") or smi.get("stdout") or "").strip().splitlines()[-1:] or [""]
        why = f"nvidia-smi failed (exit {smi.get('rc')}): {tail[0]}"
    return [Result("NVIDIA_DRIVER_MISSING", "FAIL", why + "; GPU checks skipped",
                   nf.ev_failed("query_gpu"))]


def check_gpus(nf: NodeFacts, ex: Expectations, p: PreflightParams) -> list[Result]:
    views = gpu_views(nf)
    if not views:
        return []
    if all(isinstance(f, NvidiaSmiLFacts) for _, f in gpu_outputs(nf)):
        return _mig(nf, views, ex)  # a bare listing still shows MIG devices
    out: list[Result] = []
    listed = [c for c in ("query_gpu", "nvidia_smi_L") if c in nf.facts]
    ev = nf.ev(*listed) if listed else _gpu_ev(nf, views)
    names = sorted({v.name or "?" for v in views})
    if ex.gpus_per_node is not None:
        found = max(len(views), _attached(nf) or 0)
        ok = found == ex.gpus_per_node
        out.append(Result("GPU_COUNT", "PASS" if ok else "FAIL",
                          f"{found} GPU(s) found, {ex.gpus_per_node} ordered", ev,
                          {"found": found, "ordered": ex.gpus_per_node}))
    if ex.gpu_model:
        bad = [f"GPU{v.index} {v.name}" for v in views
               if v.name is not None and not model_matches(ex.gpu_model, v.name)]
        unnamed = [v.index for v in views if v.name is None]
        if bad or not unnamed:
            out.append(Result("GPU_MODEL", "FAIL" if bad else "PASS",
                              (f"GPU model differs from the order ({ex.gpu_model}): "
                               + ", ".join(bad)) if bad else
                              f"{', '.join(names)} matches {ex.gpu_model}", ev))
        else:
            out.append(Result("GPU_MODEL", "WARN", f"GPU model not reported in full for GPUs "
                              f"{unnamed} (a shortened table name): {ex.gpu_model} unverified", ev))
    if ex.memory_per_gpu_gb:
        out += _memory(nf, views, ex.memory_per_gpu_gb)
    if ex.form_factor:
        got = {form_factor_of(n) for n in names}
        if got == {ex.form_factor}:
            out.append(Result("FORM_FACTOR", "PASS", f"{ex.form_factor.upper()} as ordered", ev))
        elif None in got:
            out.append(Result("FORM_FACTOR", "INFO", f"form factor not evident from the name "
                              f"({', '.join(names)}); see the topology checks", ev))
        else:
            out.append(Result("FORM_FACTOR", "FAIL", f"{', '.join(names)} is "
                              f"{'/'.join(sorted(str(g) for g in got)).upper()}, "
                              f"{ex.form_factor.upper()} ordered", ev))
    out += _mig(nf, views, ex)
    return out


def _memory(nf: NodeFacts, views: list[GpuView], want_gib: float) -> list[Result]:
    ev = _gpu_ev(nf, views, "memory_total_mib")
    small = [f"GPU{v.index} {v.memory_total_mib / 1024:.1f} GiB" for v in views
             if v.memory_total_mib is not None
             and v.memory_total_mib / 1024 < want_gib * MEMORY_TOLERANCE]
    unknown = [v.index for v in views if v.memory_total_mib is None]
    if small:
        return [Result("GPU_MEMORY", "FAIL", f"GPU memory below the {want_gib:g} GB ordered: "
                       + ", ".join(small), ev)]
    if unknown:
        return [Result("GPU_MEMORY", "WARN", f"memory not reported for GPUs {unknown}", ev)]
    return [Result("GPU_MEMORY", "PASS", f"every GPU has >= {want_gib:g} GB", ev)]


def _mig(nf: NodeFacts, views: list[GpuView], ex: Expectations) -> list[Result]:
    out: list[Result] = []
    ev = _gpu_ev(nf, views, "mig_enabled", "mig_devices")
    mig_on = [v.index for v in views if v.mig_enabled]
    devices = sum(v.mig_devices or 0 for v in views)
    if mig_on and not ex.mig_allowed:
        out.append(Result("MIG_ENABLED", "FAIL",
                          f"MIG is enabled on GPUs {mig_on} ({devices} MIG device(s)): "
                          "you get slices, not whole GPUs", ev,
                          {"gpus": mig_on, "mig_devices": devices}))
    empty = [v.index for v in views if v.mig_enabled and v.mig_devices == 0]
    if empty:
        out.append(Result("MIG_NO_DEVICES", "FAIL", f"MIG mode is on for GPUs {empty} but no MIG "
                          "device exists there: CUDA cannot use those GPUs at all until GPU and "
                          "compute instances are created (nvidia-smi mig -cgi ... -C) or MIG is "
                          "turned off", ev, {"gpus": empty}))
    return out


def check_topology(nf: NodeFacts, ex: Expectations, p: PreflightParams) -> list[Result]:
    out: list[Result] = []
    topo = nf.get("topo_m")
    if ex.interconnect in ("nvswitch", "nvlink") and gpu_views(nf):
        if topo is None:
            out.append(Result("TOPOLOGY_UNKNOWN", "WARN", "nvidia-smi topo -m gave no matrix; "
                              "NVLink could not be verified", nf.ev("topo_m")))
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


def _pcie(nf: NodeFacts, v: GpuView, ex: Expectations) -> list[Result]:
    out: list[Result] = []
    g, ev = f"GPU{v.index}", nf.ev(*v.source("pcie_gen_current", "pcie_gen_max",
                                            "pcie_width_current", "pcie_width_max",
                                            "pcie_gen_host_max"))
    cap_gen = v.pcie_gen_max
    if cap_gen is not None and v.pcie_gen_host_max is not None:
        cap_gen = min(cap_gen, v.pcie_gen_host_max)
    host = (f"; the slot allows only Gen{v.pcie_gen_host_max}" if v.pcie_gen_host_max is not None
            and v.pcie_gen_max is not None and v.pcie_gen_host_max < v.pcie_gen_max else "")
    width_low = (v.pcie_width_current is not None and v.pcie_width_max is not None
                 and v.pcie_width_current < v.pcie_width_max)
    gen_low = (v.pcie_gen_current is not None and v.pcie_gen_max is not None
               and v.pcie_gen_current < v.pcie_gen_max)
    if width_low or gen_low:
        out.append(Result("PCIE_LINK_DEGRADED", "WARN",
                          f"{g} PCIe link Gen{v.pcie_gen_current} x{v.pcie_width_current}, "
                          f"capable of Gen{v.pcie_gen_max} x{v.pcie_width_max} (an idle GPU may "
                          "lower its generation to save power; a narrower width is not that)"
                          + host, ev))
    if ex.pcie.min_gen and cap_gen is not None and cap_gen < ex.pcie.min_gen:
        out.append(Result("PCIE_BELOW_ORDER", "FAIL", f"{g} PCIe Gen{cap_gen} max, "
                          f"Gen{ex.pcie.min_gen} ordered{host}: the link can never reach it", ev))
    if ex.pcie.min_width:
        width = v.pcie_width_current if v.pcie_width_current is not None else v.pcie_width_max
        if width is not None and width < ex.pcie.min_width:
            out.append(Result("PCIE_BELOW_ORDER", "FAIL", f"{g} PCIe x{width}"
                              f"{' max' if v.pcie_width_current is None else ''}, "
                              f"x{ex.pcie.min_width} ordered", ev))
    return out


def check_health(nf: NodeFacts, ex: Expectations, p: PreflightParams) -> list[Result]:
    out: list[Result] = []
    for v in gpu_views(nf):
        g = f"GPU{v.index}"
        out += _pcie(nf, v, ex)
        if (v.power_limit_w is not None and v.power_max_limit_w is not None
                and v.power_limit_w < v.power_max_limit_w * 0.99):
            share = 100 * v.power_limit_w / v.power_max_limit_w
            out.append(Result("POWER_LIMIT_LOW", "WARN", f"{g} power limit {v.power_limit_w:g} W, "
                              f"the card allows {v.power_max_limit_w:g} W: expect lower clocks. "
                              f"Under sustained load the GPU is held at {share:.0f}% of its "
                              "power, so long jobs run slower than on a full-power card of the "
                              "same model; ask for the limit to be raised or price it in",
                              nf.ev(*v.source("power_limit_w", "power_max_limit_w")),
                              {"limit_w": v.power_limit_w, "max_w": v.power_max_limit_w}))
        if v.temperature_c is not None and v.temperature_c > p.max_temperature_c:
            out.append(Result("TEMPERATURE_HIGH", "WARN", f"{g} at {v.temperature_c} C "
                              f"(> {p.max_temperature_c:g} C) before any load",
                              nf.ev(*v.source("temperature_c"))))
        if v.clocks_event_reasons is not None and v.clocks_event_reasons.slowdown:
            out.append(Result("CLOCKS_HELD_BACK", "WARN", f"{g} clocks held back: "
                              + ", ".join(v.clocks_event_reasons.slowdown),
                              nf.ev(*v.source("clocks_event_reasons"))))
        if v.ecc_uncorrected:
            out.append(Result("ECC_UNCORRECTABLE", "FAIL", f"{g} has {v.ecc_uncorrected} "
                              "uncorrectable ECC error(s): ask the provider for another node",
                              nf.ev(*v.source("ecc_uncorrected"))))
        if v.retired_pages_pending:
            out.append(Result("RETIRED_PAGES_PENDING", "FAIL", f"{g} has retired pages pending: "
                              "the GPU needs a reset before its memory can be trusted",
                              nf.ev(*v.source("retired_pages_pending"))))
        if v.remapped_pending or v.remapped_failure or (v.remapped_uncorrectable or 0) > 0:
            what = ("a remapping failure" if v.remapped_failure else "row remapping pending"
                    if v.remapped_pending else f"{v.remapped_uncorrectable} uncorrectable "
                    "remapped row(s)")
            out.append(Result("REMAPPED_ROWS", "FAIL", f"{g} memory: {what}", nf.ev(
                *v.source("remapped_pending", "remapped_failure", "remapped_uncorrectable"))))
        if v.errors:
            out.append(Result("GPU_ERROR_STATE", "FAIL", f"{g} reported errors instead of "
                              f"values ({'; '.join(v.errors)}): the GPU may need a reset",
                              nf.ev(*v.sources)))
    return out


def check_torch(nf: NodeFacts, ex: Expectations, p: PreflightParams) -> list[Result]:
    rows = gpu_views(nf)
    torch = nf.get("torch")
    cmd = nf.command("torch")
    if torch is None:
        if not rows:
            return []
        err = (cmd.get("stderr") or "").strip().splitlines()[-1:] or ["no output"]
        return [Result("TORCH_UNAVAILABLE", "WARN", f"PyTorch could not be imported with "
                       f"{(nf.doc.get('python') or {}).get('executable') or 'python'}: {err[0]}",
                       nf.ev("torch"))]
    if not rows:
        return []
    wanted = len(rows)
    chosen = nf.inventory_env.get("CUDA_VISIBLE_DEVICES")
    if chosen is not None:
        wanted = count_visible(chosen)
    if torch.count >= wanted:
        shown = (f" (CUDA_VISIBLE_DEVICES={chosen} from the inventory)" if chosen is not None
                 else "")
        return [Result("TORCH_SEES_GPUS", "PASS", f"PyTorch {torch.torch} sees {torch.count} "
                       f"GPU(s){shown}, CUDA {torch.cuda}", nf.ev("torch", "query_gpu"))]
    causes = []
    visible = (nf.doc.get("env") or {}).get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        causes.append(f"CUDA_VISIBLE_DEVICES={visible} hides GPUs")
    if torch.cuda is None:
        causes.append("this PyTorch is a CPU-only build")
    elif not torch.available:
        causes.append(f"driver/runtime mismatch: PyTorch was built for CUDA {torch.cuda}; check "
                      "that the driver supports it")
    causes.append("the container mounts only some GPUs (check --gpus / NVIDIA_VISIBLE_DEVICES)")
    return [Result("TORCH_GPU_COUNT", "FAIL", f"PyTorch sees {torch.count} GPU(s), nvidia-smi "
                   f"{len(rows)}. Likely causes: " + "; ".join(causes),
                   nf.ev("torch", "query_gpu"), {"torch": torch.count, "nvidia_smi": len(rows)})]


def nccl_header_found(doc: dict[str, Any]) -> bool:
    nccl = doc.get("nccl") or {}
    return any(h.get("exists") for h in nccl.get("headers") or []) or any(
        p.get("header") for p in nccl.get("pip") or [])


def check_build_tools(nf: NodeFacts, ex: Expectations, p: PreflightParams) -> list[Result]:
    if not gpu_views(nf):
        return []
    missing = []
    tools = nf.doc.get("tools") or {}
    if not tools.get("nvcc"):
        missing.append("nvcc (install the CUDA toolkit, e.g. cuda-toolkit-12-x)")
    if not nccl_header_found(nf.doc):
        nvcc, xml = nf.get("nvcc_version"), nf.get("nvidia_smi_q_xml")
        # the toolkit's CUDA, else the newest the driver supports
        cuda = nvcc.release if nvcc is not None else xml.cuda_version if xml is not None else None
        wheel = nccl_wheel(cuda)
        missing.append(f"NCCL headers (libnccl-dev, or pip {wheel})")
    mpi = nf.doc.get("mpi") or {}
    if not mpi.get("mpi_h") or not tools.get("mpirun"):
        missing.append("MPI for multi-node runs (openmpi-bin libopenmpi-dev)")
    if not missing:
        return [Result("BUILD_TOOLS", "PASS", "nvcc, NCCL headers and MPI present",
                       nf.ev("nvcc_version", "ldconfig"))]
    return [Result("BUILD_TOOLS", "WARN", "nccl-tests cannot build (multi-node) without: "
                   + "; ".join(missing), nf.ev("nvcc_version", "ldconfig"))]


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


def check_storage(nf: NodeFacts, ex: Expectations, p: PreflightParams) -> list[Result]:
    paths = nf.doc.get("paths") or {}
    info = paths.get("ckpt_dir")
    if not info or not nf.ckpt_configured:
        return []
    ev = nf.ev("df")
    path = info.get("path") or "?"
    if not info.get("exists") or not info.get("writable"):
        return [Result("CKPT_DIR_UNUSABLE", "WARN", f"checkpoint directory {path} "
                       f"{'is not writable' if info.get('exists') else 'does not exist'}",
                       nf.ev_failed("df"))]
    mount = info.get("mount") or {}
    fstype = mount.get("fstype")
    where = f"on {fstype or '?'} ({mount.get('mount_point') or '?'})"
    if fstype in EPHEMERAL_FSTYPES:
        why = f"is {where}"
    elif EPHEMERAL_PATH.search(info.get("realpath") or path):
        why = f"is under a scratch path, {where}"
    else:
        return [Result("CKPT_DIR", "PASS", f"checkpoint directory {path} {where}", ev)]
    return [Result("CKPT_DIR_EPHEMERAL", "WARN", f"checkpoint directory {path} {why}: it "
                   "vanishes with the instance; point ckpt_dir at persistent storage", ev)]


NODE_CHECKS: list[Callable[[NodeFacts, Expectations, PreflightParams], list[Result]]] = [
    check_driver, check_gpus, check_topology, check_health, check_torch, check_build_tools,
    check_fabric, check_storage,
]


# PyTorch's view and the NVLink fabric are judged in their own module, which adds its
# checks to NODE_CHECKS and reads the records above: imported after them.
from orchestrator.steps.preflight import gpu_state  # noqa: E402,F401


def node_results(nf: NodeFacts, ex: Expectations, p: PreflightParams) -> list[Result]:
    out: list[Result] = []
    for check in NODE_CHECKS:
        out.extend(check(nf, ex, p))
    for cid, msg in nf.parse_errors.items():
        out.append(Result("PARSE_ERROR", "WARN", f"output of {cid} not understood: {msg}",
                          nf.ev(cid)))
    return out


def versions(nf: NodeFacts) -> dict[str, str | None]:
    views = gpu_views(nf)
    nvcc, torch = nf.get("nvcc_version"), nf.get("torch")
    cuda = next((f.cuda_version for _, f in gpu_outputs(nf) if isinstance(
        f, (NvidiaSmiXmlFacts, NvidiaSmiQFacts, NvidiaSmiTableFacts)) and f.cuda_version), None)
    return {
        "driver": views[0].driver_version if views else None,
        "cuda_driver": cuda,
        "nvcc": nvcc.release if nvcc is not None else None,
        "nccl": torch.nccl if torch is not None else None,
        "torch": torch.torch if torch is not None else None,
    }


def provider_results(nodes: list[NodeFacts]) -> list[Result]:
    """Nodes of one provider should be the same machine: any version drift is a WARN."""
    if len(nodes) < 2:
        return []
    table = {nf.node: versions(nf) for nf in nodes}
    out = []
    for key in ("driver", "cuda_driver", "nvcc", "nccl", "torch"):
        seen = {node: v[key] for node, v in table.items()}
        if len({v for v in seen.values()}) > 1:
            shown = ", ".join(f"{n}={v or 'missing'}" for n, v in seen.items())
            out.append(Result("VERSION_DRIFT", "WARN", f"nodes differ in {key}: {shown}",
                              [e for nf in nodes for e in nf.ev("query_gpu", "torch")],
                              {"component": key, "versions": seen}))
    return out
