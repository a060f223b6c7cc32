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
from orchestrator.records import Severity
from orchestrator.suite import PreflightParams
from payload.probes import count_visible

EPHEMERAL_FSTYPES = {"tmpfs", "ramfs", "overlay", "overlayfs", "devtmpfs", "squashfs"}
EPHEMERAL_PATH = re.compile(r"^/(tmp|dev/shm|run)(/|$)|^/(mnt/)?(ephemeral\d*|local_disk\d*|"
                            r"mnt/resource|mnt/local|nvme\d*)(/|$)")


@dataclass
class NodeFacts:
    """Everything preflight learnt about one node."""

    node: str
    provider: str
    doc: dict[str, Any]  # the payload's collect document
    facts: dict[str, BaseModel] = field(default_factory=dict)  # by command id
    parse_errors: dict[str, str] = field(default_factory=dict)
    evidence: dict[str, str] = field(default_factory=dict)  # command id -> run-relative path
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


@dataclass
class Result:
    code: str
    severity: Severity
    message: str
    evidence: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)


def _norm(s: str) -> str:
    return re.sub(r"[^a-z0-9]", "", s.lower().replace("nvidia", "").replace("tesla", ""))


def model_matches(expected: str, actual: str) -> bool:
    """Every token of the order ("A100 SXM4 80GB") must appear in the GPU's name.

    A token that starts or ends with a digit must not run on into more digits there:
    "L4" is not "L40S", "A10" is not "A100", "80GB" is not "180GB".
    """
    spaced, squashed = actual.lower(), _norm(actual)
    tokens = [t for t in re.split(r"[^a-z0-9]+", expected.lower()) if t and t != "nvidia"]

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


def _gpu_rows(nf: NodeFacts) -> list[Any]:
    q = nf.get("query_gpu")
    return list(q.gpus) if q is not None else []


def driver_present(nf: NodeFacts) -> bool:
    return nf.get("query_gpu") is not None or nf.get("nvidia_smi_L") is not None


def check_driver(nf: NodeFacts, ex: Expectations, p: PreflightParams) -> list[Result]:
    if driver_present(nf):
        if nf.get("query_gpu") is None:
            # nvidia-smi -L answered, the detailed query did not: say so, never pass silently
            smi = nf.command("query_gpu")
            why = nf.parse_errors.get("query_gpu") or (
                (smi.get("stderr") or smi.get("stdout") or "no output").strip()[-200:])
            return [Result("GPU_DETAILS_MISSING", "FAIL", "nvidia-smi lists GPUs but "
                           f"--query-gpu gave nothing usable ({why}): model, memory, MIG and "
                           "health were not checked", nf.ev("query_gpu", "nvidia_smi_L"))]
        return []
    smi = nf.command("query_gpu")
    if smi.get("missing"):
        why = "nvidia-smi is not installed or not on PATH: no NVIDIA driver on this node"
    elif smi.get("timed_out"):
        why = "nvidia-smi hung (timed out): the driver or a GPU is in a bad state"
    else:
        tail = (smi.get("stderr") or smi.get("stdout") or "").strip().splitlines()[-1:] or [""]
        why = f"nvidia-smi failed (exit {smi.get('rc')}): {tail[0]}"
        if "query_gpu" in nf.parse_errors:
            why = f"nvidia-smi output could not be parsed: {nf.parse_errors['query_gpu']}"
    return [Result("NVIDIA_DRIVER_MISSING", "FAIL", why + "; GPU checks skipped",
                   nf.ev("query_gpu"))]


def check_gpus(nf: NodeFacts, ex: Expectations, p: PreflightParams) -> list[Result]:
    rows = _gpu_rows(nf)
    if not rows:
        return []
    out: list[Result] = []
    ev = nf.ev("query_gpu", "nvidia_smi_L")
    names = sorted({r.name or "?" for r in rows})
    if ex.gpus_per_node is not None:
        ok = len(rows) == ex.gpus_per_node
        out.append(Result("GPU_COUNT", "PASS" if ok else "FAIL",
                          f"{len(rows)} GPU(s) found, {ex.gpus_per_node} ordered", ev,
                          {"found": len(rows), "ordered": ex.gpus_per_node}))
    if ex.gpu_model:
        bad = [f"GPU{r.index} {r.name}" for r in rows if not model_matches(ex.gpu_model, r.name or "")]
        out.append(Result("GPU_MODEL", "FAIL" if bad else "PASS",
                          (f"GPU model differs from the order ({ex.gpu_model}): " + ", ".join(bad))
                          if bad else f"{', '.join(names)} matches {ex.gpu_model}", ev))
    if ex.memory_per_gpu_gb:
        want_gib = ex.memory_per_gpu_gb
        small = [f"GPU{r.index} {r.memory_total_mib / 1024:.1f} GiB" for r in rows
                 if r.memory_total_mib is not None and r.memory_total_mib / 1024 < want_gib * 0.93]
        unknown = [r.index for r in rows if r.memory_total_mib is None]
        if small:
            out.append(Result("GPU_MEMORY", "FAIL", f"GPU memory below the {want_gib:g} GB ordered: "
                              + ", ".join(small), ev))
        elif unknown:
            out.append(Result("GPU_MEMORY", "WARN", f"memory not reported for GPUs {unknown}", ev))
        else:
            out.append(Result("GPU_MEMORY", "PASS", f"every GPU has >= {want_gib:g} GB", ev))
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
    mig_on = [r.index for r in rows if r.mig_enabled]
    listing = nf.get("nvidia_smi_L")
    mig_devices = listing.mig_device_count if listing is not None else 0
    if (mig_on or mig_devices) and not ex.mig_allowed:
        out.append(Result("MIG_ENABLED", "FAIL",
                          f"MIG is enabled on GPUs {mig_on or '?'} ({mig_devices} MIG device(s)): "
                          "you get slices, not whole GPUs", nf.ev("query_gpu", "nvidia_smi_L")))
    return out


def check_topology(nf: NodeFacts, ex: Expectations, p: PreflightParams) -> list[Result]:
    out: list[Result] = []
    topo = nf.get("topo_m")
    if ex.interconnect in ("nvswitch", "nvlink") and _gpu_rows(nf):
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
    p2p = nf.get("topo_p2p_n")
    if p2p is not None:
        bad_p2p = [(i, j, s) for i, j, s in p2p.not_ok_pairs() if i < j]
        if bad_p2p:
            shown = ", ".join(f"GPU{i}-GPU{j} {s}" for i, j, s in bad_p2p[:12])
            out.append(Result("P2P_NOT_OK", "FAIL", f"peer-to-peer not OK between "
                              f"{len(bad_p2p)} GPU pair(s): {shown}", nf.ev("topo_p2p_n")))
    return out


def check_health(nf: NodeFacts, ex: Expectations, p: PreflightParams) -> list[Result]:
    out: list[Result] = []
    ev = nf.ev("query_gpu")
    for r in _gpu_rows(nf):
        g = f"GPU{r.index}"
        width_low = (r.pcie_width_current is not None and r.pcie_width_max is not None
                     and r.pcie_width_current < r.pcie_width_max)
        gen_low = (r.pcie_gen_current is not None and r.pcie_gen_max is not None
                   and r.pcie_gen_current < r.pcie_gen_max)
        if width_low or gen_low:
            out.append(Result("PCIE_LINK_DEGRADED", "WARN",
                              f"{g} PCIe link Gen{r.pcie_gen_current} x{r.pcie_width_current}, "
                              f"capable of Gen{r.pcie_gen_max} x{r.pcie_width_max} (an idle GPU may "
                              "lower its generation to save power; a narrower width is not that)",
                              ev))
        if ex.pcie.min_gen and r.pcie_gen_max is not None and r.pcie_gen_max < ex.pcie.min_gen:
            out.append(Result("PCIE_BELOW_ORDER", "WARN", f"{g} PCIe Gen{r.pcie_gen_max} max, "
                              f"Gen{ex.pcie.min_gen} ordered", ev))
        if ex.pcie.min_width and r.pcie_width_max is not None and (
                r.pcie_width_max < ex.pcie.min_width):
            out.append(Result("PCIE_BELOW_ORDER", "WARN", f"{g} PCIe x{r.pcie_width_max} max, "
                              f"x{ex.pcie.min_width} ordered", ev))
        if (r.power_limit_w is not None and r.power_max_limit_w is not None
                and r.power_limit_w < r.power_max_limit_w * 0.99):
            out.append(Result("POWER_LIMIT_LOW", "WARN", f"{g} power limit {r.power_limit_w:g} W, "
                              f"the card allows {r.power_max_limit_w:g} W: expect lower clocks", ev))
        if r.temperature_gpu_c is not None and r.temperature_gpu_c > p.max_temperature_c:
            out.append(Result("TEMPERATURE_HIGH", "WARN", f"{g} at {r.temperature_gpu_c} C "
                              f"(> {p.max_temperature_c:g} C) before any load", ev))
        if r.clocks_event_reasons is not None and r.clocks_event_reasons.slowdown:
            out.append(Result("CLOCKS_HELD_BACK", "WARN", f"{g} clocks held back: "
                              + ", ".join(r.clocks_event_reasons.slowdown), ev))
        ecc = [v for v in (r.ecc_uncorrected_volatile, r.ecc_uncorrected_aggregate) if v]
        if ecc:
            out.append(Result("ECC_UNCORRECTABLE", "FAIL", f"{g} has {max(ecc)} uncorrectable "
                              "ECC error(s): ask the provider for another node", ev))
        if r.retired_pages_pending:
            out.append(Result("RETIRED_PAGES_PENDING", "FAIL", f"{g} has retired pages pending: "
                              "the GPU needs a reset before its memory can be trusted", ev))
    xml = nf.get("nvidia_smi_q_xml")
    for g in (xml.gpus if xml is not None else []):
        rr = g.remapped_rows
        if rr is not None and (rr.pending or rr.failure or (rr.uncorrectable or 0) > 0):
            what = ("a remapping failure" if rr.failure else "row remapping pending"
                    if rr.pending else f"{rr.uncorrectable} uncorrectable remapped row(s)")
            out.append(Result("REMAPPED_ROWS", "FAIL", f"GPU{g.index} memory: {what}",
                              nf.ev("nvidia_smi_q_xml")))
    return out


def check_torch(nf: NodeFacts, ex: Expectations, p: PreflightParams) -> list[Result]:
    rows = _gpu_rows(nf)
    torch = nf.get("torch")
    cmd = nf.command("torch")
    if torch is None:
        if not rows:
            return []
        err = (cmd.get("stderr") or "").strip().splitlines()[-1:] or ["no output"]
        return [Result("TORCH_UNAVAILABLE", "WARN", f"PyTorch could not be imported with "
                       f"{nf.doc.get('python', {}).get('executable', 'python')}: {err[0]}",
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
    if not _gpu_rows(nf):
        return []
    missing = []
    tools = nf.doc.get("tools") or {}
    if not tools.get("nvcc"):
        missing.append("nvcc (install the CUDA toolkit, e.g. cuda-toolkit-12-x)")
    if not nccl_header_found(nf.doc):
        missing.append("NCCL headers (libnccl-dev, or pip nvidia-nccl-cu12)")
    mpi = nf.doc.get("mpi") or {}
    if not mpi.get("mpi_h") or not tools.get("mpirun"):
        missing.append("MPI for multi-node runs (openmpi-bin libopenmpi-dev)")
    if not missing:
        return [Result("BUILD_TOOLS", "PASS", "nvcc, NCCL headers and MPI present",
                       nf.ev("nvcc_version", "ldconfig"))]
    return [Result("BUILD_TOOLS", "WARN", "nccl-tests cannot build (multi-node) without: "
                   + "; ".join(missing), nf.ev("nvcc_version", "ldconfig"))]


def check_fabric(nf: NodeFacts, ex: Expectations, p: PreflightParams) -> list[Result]:
    if ex.fabric.type not in ("ib", "roce"):
        return []
    ib = nf.get("ibv_devinfo")
    ev = nf.ev("ibv_devinfo")
    if ib is None or not ib.devices:
        return [Result("IB_MISSING", "FAIL", f"{ex.fabric.type} ordered but no RDMA device found "
                       "(ibv_devinfo missing or empty): NCCL will fall back to TCP sockets", ev)]
    ports = [(d.hca_id, pt) for d in ib.devices for pt in d.ports]
    want_layer = "InfiniBand" if ex.fabric.type == "ib" else "Ethernet"
    ports = [(h, pt) for h, pt in ports if pt.link_layer in (None, want_layer)]
    out: list[Result] = []
    down = [f"{h}:{pt.port} {pt.state}" for h, pt in ports if pt.state != "PORT_ACTIVE"]
    if down:
        out.append(Result("IB_PORT_DOWN", "FAIL", "RDMA ports not ACTIVE: " + ", ".join(down), ev))
    active = [(h, pt) for h, pt in ports if pt.state == "PORT_ACTIVE"]
    if ex.fabric.nics is not None and len(active) < ex.fabric.nics:
        out.append(Result("IB_PORT_COUNT", "FAIL", f"{len(active)} active {want_layer} port(s), "
                          f"{ex.fabric.nics} ordered", ev))
    if ex.fabric.rate_gbps:
        slow = [f"{h}:{pt.port} {pt.rate_gbps:g} Gb/s" for h, pt in active
                if pt.rate_gbps is not None and pt.rate_gbps < ex.fabric.rate_gbps * 0.95]
        if slow:
            out.append(Result("IB_RATE_LOW", "FAIL", f"ports slower than the "
                              f"{ex.fabric.rate_gbps:g} Gb/s ordered: " + ", ".join(slow), ev))
    if not out:
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
                       f"{'is not writable' if info.get('exists') else 'does not exist'}", ev)]
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


def node_results(nf: NodeFacts, ex: Expectations, p: PreflightParams) -> list[Result]:
    out: list[Result] = []
    for check in NODE_CHECKS:
        out.extend(check(nf, ex, p))
    for cid, msg in nf.parse_errors.items():
        out.append(Result("PARSE_ERROR", "WARN", f"output of {cid} not understood: {msg}",
                          nf.ev(cid)))
    return out


def versions(nf: NodeFacts) -> dict[str, str | None]:
    rows = _gpu_rows(nf)
    nvcc, torch = nf.get("nvcc_version"), nf.get("torch")
    xml = nf.get("nvidia_smi_q_xml")
    return {
        "driver": rows[0].driver_version if rows else None,
        "cuda_driver": xml.cuda_version if xml is not None else None,
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
