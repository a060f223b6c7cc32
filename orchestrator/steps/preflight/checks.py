"""Expectations versus facts: findings a person can act on.

Each check reads parsed facts of one node (or of all nodes of a provider),
compares them with what was ordered, and emits findings with a stable code,
a severity, a message that says what is wrong and where, and the evidence
files it read. A check whose facts are missing says so instead of passing.

The GPU checks are in `gpu`, the links (NVLink, P2P, RDMA) in `links`, the
facts they read in `facts`; here are the software and storage checks, the list
every node goes through (`NODE_CHECKS`) and the cross-node comparison.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from orchestrator.inventory import Expectations
from orchestrator.judging.storage import EPHEMERAL_FSTYPES, EPHEMERAL_PATH
from orchestrator.parsers.nvidia_smi_q import NvidiaSmiQFacts
from orchestrator.parsers.nvidia_smi_table import NvidiaSmiTableFacts
from orchestrator.parsers.nvidia_smi_xml import NvidiaSmiXmlFacts
from orchestrator.steps.preflight.busy import check_busy
from orchestrator.steps.preflight.fabric import check_fabric_sysfs, provider_pkeys
from orchestrator.steps.preflight.facts import NodeFacts, Result, gpu_outputs, gpu_views
from orchestrator.steps.preflight.gpu import check_driver, check_gpus, check_health
from orchestrator.steps.preflight.gpu_state import check_fabric_state, check_torch_order
from orchestrator.steps.preflight.links import check_fabric, check_topology
from orchestrator.suite import PreflightParams
from payload.ncclbuild import nccl_wheel
from payload.probes import count_visible


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
    visible = (nf.doc.get("env") or {}).get("CUDA_VISIBLE_DEVICES")
    if visible is not None and count_visible(visible, len(rows)) == 0:
        # torch.cuda.is_available() is False whenever no device is visible: that alone
        # is the cause, no driver mismatch or container suggested
        last = f"0..{len(rows) - 1}" if len(rows) > 1 else "0"
        causes = [f"CUDA_VISIBLE_DEVICES={visible} hides every GPU (this node's are {last}): "
                  "unset it, or name the GPUs in the node's env in the inventory"]
    else:
        causes = [f"CUDA_VISIBLE_DEVICES={visible} hides GPUs"] if visible is not None else []
        if torch.cuda is None:
            causes.append("this PyTorch is a CPU-only build")
        elif not torch.available:
            causes.append(f"driver/runtime mismatch: PyTorch was built for CUDA {torch.cuda}; "
                          "check that the driver supports it")
        causes.append("the container mounts only some GPUs (check --gpus / "
                      "NVIDIA_VISIBLE_DEVICES)")
    return [Result("TORCH_GPU_COUNT", "FAIL", f"PyTorch sees {torch.count} GPU(s), nvidia-smi "
                   f"{len(rows)}. Likely cause{'s' if len(causes) > 1 else ''}: " + "; ".join(causes),
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


def check_storage(nf: NodeFacts, ex: Expectations, p: PreflightParams) -> list[Result]:
    paths = nf.doc.get("paths") or {}
    info = paths.get("ckpt_dir")
    if not info or not nf.ckpt_configured:
        return []
    ev = nf.ev("df")
    path = info.get("path") or "?"
    # a missing directory that can be made (the training step makes it) is judged by the
    # filesystem it would be made on; payloads before `creatable` only said it was missing
    if info.get("exists") and not info.get("writable"):
        return [Result("CKPT_DIR_UNUSABLE", "WARN", f"checkpoint directory {path} is not "
                       "writable", nf.ev_failed("df"))]
    if not info.get("exists") and info.get("creatable") is not True:
        cannot = (f" and cannot be created under {info.get('stat_path')}"
                  if info.get("creatable") is False else "")
        return [Result("CKPT_DIR_UNUSABLE", "WARN", f"checkpoint directory {path} does not "
                       f"exist{cannot}", nf.ev_failed("df"))]
    mount = info.get("mount") or {}
    fstype = mount.get("fstype")
    where = f"on {fstype or '?'} ({mount.get('mount_point') or '?'})"
    if not info.get("exists"):
        path = f"{path} (to be made by the training step)"
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
    check_fabric, check_storage, check_torch_order, check_fabric_state, check_busy,
    check_fabric_sysfs,
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
    """Nodes of one provider should be the same machine: any version drift is a WARN,
    P_Keys that differ a FAIL."""
    if len(nodes) < 2:
        return []
    out = provider_pkeys(nodes)
    table = {nf.node: versions(nf) for nf in nodes}
    for key in ("driver", "cuda_driver", "nvcc", "nccl", "torch"):
        seen = {node: v[key] for node, v in table.items()}
        if len({v for v in seen.values()}) > 1:
            shown = ", ".join(f"{n}={v or 'missing'}" for n, v in seen.items())
            out.append(Result("VERSION_DRIFT", "WARN", f"nodes differ in {key}: {shown}",
                              [e for nf in nodes for e in nf.ev("query_gpu", "torch")],
                              {"component": key, "versions": seen}))
    return out
