"""Two looks at the GPUs beyond nvidia-smi's rows: what PyTorch sees, and the NVLink fabric.

The acceptance recipe's central point is that PyTorch sees every GPU of the
order with the ordered memory (a container that mounts some GPUs, a CPU build,
a driver too old for the wheel all pass nvidia-smi and fail here), so PyTorch's
own list is judged against the order, device by device. On NVSwitch systems
(HGX, GH200/GB200) the fabric manager registers each GPU with the NVLink
fabric; until `State` is `Completed` and `Status` is `Success`, CUDA jobs fail
at start or run without NVLink, whatever `topo -m` shows.
"""

from __future__ import annotations

from orchestrator.gpunames import GENERIC, model_matches
from orchestrator.inventory import Expectations
from orchestrator.steps.preflight.facts import NodeFacts, Result, gpu_views
from orchestrator.steps.preflight.gpu import MEMORY_TOLERANCE
from orchestrator.suite import PreflightParams


def check_torch_order(nf: NodeFacts, ex: Expectations, p: PreflightParams) -> list[Result]:
    """PyTorch's devices against the order: count, model and memory (TORCH_ORDER)."""
    torch = nf.get("torch")
    if torch is None or not (ex.gpus_per_node or ex.gpu_model or ex.memory_per_gpu_gb):
        return []
    wrong: list[str] = []
    if not torch.available:
        wrong.append("CUDA is not available to PyTorch" + (
            " (a CPU-only build)" if torch.cuda is None else f" (built for CUDA {torch.cuda})"))
    if ex.gpus_per_node is not None and torch.count != ex.gpus_per_node:
        wrong.append(f"{torch.count} GPU(s), {ex.gpus_per_node} ordered")
    floor = ex.memory_per_gpu_gb * MEMORY_TOLERANCE if ex.memory_per_gpu_gb else None
    for d in torch.devices:
        gib = d.memory_bytes / 2**30
        # a driver older than the card names it "NVIDIA Graphics Device": GPU_MODEL tells it
        # by its PCI device id
        if ex.gpu_model and not GENERIC.match(d.name) and not model_matches(ex.gpu_model,
                                                                            d.name):
            wrong.append(f"GPU{d.index} is {d.name}, {ex.gpu_model} ordered")
        if floor is not None and gib < floor:
            wrong.append(f"GPU{d.index} has {gib:.1f} GiB, {ex.memory_per_gpu_gb:g} GB ordered")
    shown = ", ".join(f"GPU{d.index} {d.name} {d.memory_bytes / 2**30:.1f} GiB"
                      for d in torch.devices) or "no GPU"
    details = {"count": torch.count, "wrong": wrong}
    if wrong:
        return [Result("TORCH_ORDER", "FAIL", f"PyTorch {torch.torch} does not see what was "
                       f"ordered: {'; '.join(wrong)} (it sees {shown})", nf.ev("torch"), details)]
    ordered = ", ".join(x for x in (
        f"{ex.gpus_per_node} GPU(s)" if ex.gpus_per_node else "",
        ex.gpu_model or "", f">= {ex.memory_per_gpu_gb:g} GB" if ex.memory_per_gpu_gb else "") if x)
    return [Result("TORCH_ORDER", "PASS", f"PyTorch {torch.torch} sees {shown} as ordered "
                   f"({ordered})", nf.ev("torch"), details)]


def check_fabric_state(nf: NodeFacts, ex: Expectations, p: PreflightParams) -> list[Result]:
    """Every GPU registered with the NVLink fabric, where NVLink or NVSwitch was ordered."""
    if ex.interconnect not in ("nvswitch", "nvlink"):
        return []
    views = [v for v in gpu_views(nf) if v.fabric is not None and v.fabric.known]
    if not views:
        return []  # N/A everywhere: no fabric to join (PCIe cards, drivers before R535)
    ev = nf.ev(*sorted({c for v in views for c in v.source("fabric")}))
    bad = [(v, v.fabric.problem) for v in views if v.fabric is not None and v.fabric.problem]
    if bad:
        shown = "; ".join(f"GPU{v.index}: {why}" for v, why in bad[:8])
        return [Result("FABRIC_STATE", "FAIL", f"{ex.interconnect} ordered but the NVLink fabric "
                       f"has not registered {len(bad)} GPU(s) ({shown}): CUDA jobs fail at start "
                       "or run without NVLink; check nvidia-fabricmanager and its log", ev,
                       {"gpus": {str(v.index): why for v, why in bad}})]
    return [Result("FABRIC_STATE", "PASS", f"every GPU registered with the NVLink fabric "
                   f"({len(views)} GPU(s): State Completed, Status Success)", ev)]

