"""A rank's start-up, before its first step: deterministic mode or the fastest
kernels, the process group, DDP or FSDP2, regional torch.compile, the optimizer,
and the clock that says where a (re)start's seconds went.

Deterministic mode (``deterministic: true``, the default for the verification)
sets ``torch.use_deterministic_algorithms(True)`` (strict: cuDNN attention's
backward, for one, only picks its deterministic algorithm then),
``cudnn.deterministic=True`` and ``cudnn.benchmark=False``; the throughput
segment leaves it for the fastest kernels (:func:`fastest_kernels`).

torch.compile compiles regions (:func:`compile_regions`): each block on its own
(the blocks share one compiled graph), the embeddings, and the head with its loss.

Every function takes torch as an argument: nothing here imports it at module
level (standard library only, Python 3.8 compatible).
"""

import os
import socket
import sys
import time
from typing import Any, Dict, Optional, Tuple

from payload.train import config


def determinism(torch: Any, on: bool) -> Dict[str, Any]:
    """Enter or leave deterministic mode; the settings now in force."""
    if on:
        # strict: kernels that have a deterministic variant only use it when it is
        # asked for this way (cuDNN attention's backward, for one); an op that has none
        # raises, and the warm-up falls back to warn_only (see Job.warm_up)
        torch.use_deterministic_algorithms(True, warn_only=False)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    else:
        fastest_kernels(torch)
    return {"use_deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "CUBLAS_WORKSPACE_CONFIG": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
            "cudnn.deterministic": torch.backends.cudnn.deterministic,
            "cudnn.benchmark": torch.backends.cudnn.benchmark}


def versions(torch: Any, device: Any) -> Dict[str, Any]:
    out: Dict[str, Any] = {"torch": torch.__version__, "python": sys.version.split()[0],
                           "cuda": torch.version.cuda, "host": socket.gethostname()}
    if device.type == "cuda":
        out["gpu_name"] = torch.cuda.get_device_name(device)
        out["gpus_visible"] = torch.cuda.device_count()
        try:
            v = torch.cuda.nccl.version()
            out["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception:  # a build without NCCL
            out["nccl"] = None
    return out


def parallel_mode(cfg: Dict[str, Any], torch: Any, device: Any) -> str:
    mode = cfg["parallel"]
    if mode != "auto":
        return mode
    if device.type != "cuda":
        return "ddp"
    # weights, gradients and AdamW's two moments in fp32: 16 bytes a parameter per replica
    need = 16 * config.param_count(cfg)
    total = torch.cuda.get_device_properties(device).total_memory
    return "fsdp" if need > 0.5 * total else "ddp"


def wrap(model: Any, mode: str, torch: Any, device: Any) -> Any:
    if mode == "fsdp":
        try:
            from torch.distributed.fsdp import fully_shard
        except ImportError:  # torch 2.4 and 2.5
            from torch.distributed._composable.fsdp import fully_shard
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    # gradients live in the buckets (no copy in and out); 100 MB buckets: fewer, larger
    # all-reduces, about a point of MFU over 25 MB on 2 x H200 with the 1b preset
    return DDP(model, device_ids=[device.index] if device.type == "cuda" else None,
               bucket_cap_mb=100, gradient_as_bucket_view=True)


def compile_regions(model: Any, torch: Any) -> None:
    """torch.compile per region, before DDP or FSDP wraps the model: every block (one
    compiled graph serves them all: same code, parameters as inputs), the embeddings,
    and the head with the loss (the fp32 logits never reach memory whole)."""
    for block in model.blocks:
        block.compile()
    model.embed = torch.compile(model.embed)
    model.head_loss = torch.compile(model.head_loss)


def prepare_compile(torch: Any) -> None:
    """Import torch.compile's machinery (dynamo, inductor's compiler entry) before the gate:
    about 2.7 s of imports on an H100 host that `compile_regions` and the first compiled
    step would otherwise pay after the gate opens, on every launch's critical path. CPU
    work only; an older torch without these modules compiles as before."""
    try:
        import torch._dynamo  # noqa: F401
        import torch._inductor.compile_fx  # noqa: F401
    except ImportError:
        pass


def fastest_kernels(torch: Any) -> None:
    """Leave deterministic mode: cuDNN attention and atomics-based backward kernels."""
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.deterministic = False


def optimizer(model: Any, cfg: Dict[str, Any], torch: Any, device: Any) -> Any:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg["weight_decay"]},
              {"params": rest, "weight_decay": 0.0}]
    kwargs: Dict[str, Any] = {"lr": cfg["lr"], "betas": (cfg["beta1"], cfg["beta2"])}
    if device.type == "cuda":
        kwargs["fused"] = True
    return torch.optim.AdamW(groups, **kwargs)


class Laps:
    """Durations of the start-up stages, in order: where a (re)start's seconds go."""

    def __init__(self, t0: float) -> None:
        self.t0 = self.t = t0
        self.laps: Dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = time.time()
        self.laps[name] = round(now - self.t, 4)
        self.t = now


def launch_seconds(t_main: float, env: Dict[str, str]) -> Optional[float]:
    """From the supervisor starting torchrun to this rank's main(): torchrun, the
    interpreter, imports before torch. None when not started by the supervisor."""
    try:
        return round(t_main - float(env["GPUVET_LAUNCH_T"]), 4)
    except (KeyError, ValueError):
        return None


def init_group(dist: Any, backend: str, device: Any, timeout_s: float) -> None:
    """init_process_group; on a GPU bound to its device, so NCCL connects now (an eager
    init, timed here rather than inside the first collective)."""
    from datetime import timedelta

    kwargs: Dict[str, Any] = {"timeout": timedelta(seconds=timeout_s)}
    if device is not None:
        try:
            dist.init_process_group(backend, device_id=device, **kwargs)
            return
        except TypeError:  # torch before 2.3 has no device_id
            pass
    dist.init_process_group(backend, **kwargs)


GATE_ENV = "GPUVET_TRAIN_GATE"  # a file: the launch waits for it to say "go" (or "stop")
GATE_TIMEOUT_ENV = "GPUVET_TRAIN_GATE_TIMEOUT"  # seconds the gate may stay shut
# where the gate stands: "ready" (after the CUDA context, the process group and the
# compile imports: the next phase of a unit, started while the phase before it trains) or
# "start": a reference started while another step, health say, still measures the GPUs,
# held after import torch and the compile imports, before any CUDA call, until the gate
# says "cuda" (the GPUs' measurements are over: it may make its context and process
# group) and then at the ready gate until "go"
GATE_AT_ENV = "GPUVET_TRAIN_GATE_AT"
CUDA_WORD = "cuda"
GATE_POLL_S = 0.02


def gate_at(env: Dict[str, str]) -> Optional[str]:
    """Where this launch's gate stands, or None without one."""
    if not env.get(GATE_ENV):
        return None
    return "start" if env.get(GATE_AT_ENV) == "start" else "ready"


def gate_timeout(env: Dict[str, str]) -> float:
    return float(env.get(GATE_TIMEOUT_ENV, "3600"))


class GateStopped(Exception):
    """The launch was started ahead and then told not to run (the phase before it failed),
    or its gate was never opened in time."""


def wait_gate(env: Dict[str, str], timeout_s: float, words: Tuple[str, ...] = ("go",)
              ) -> Optional[float]:
    """A launch started ahead of its turn holds here, before it allocates anything of its
    own: the GPU cannot hold two jobs. The next phase of a unit (started while the phase
    before it runs) holds after the interpreter, torch, the CUDA context and the process
    group; a reference started while another step measures the GPUs holds before any CUDA
    call (`gate_at`). The controller writes "go" into the gate file when the GPU is free,
    or "stop". Returns when it opened (None without a gate); `words` are what opens it
    (the start gate also opens on "cuda")."""
    path = env.get(GATE_ENV)
    if not path:
        return None
    deadline = time.time() + timeout_s
    while True:
        try:
            with open(path) as f:
                said = f.read().strip()
        except OSError:
            said = ""
        if said in words:
            return time.time()
        if said == "stop":
            raise GateStopped("told to stop before it ran (the phase before it failed)")
        if time.time() > deadline:
            raise GateStopped("its gate was not opened within %.0f s" % timeout_s)
        time.sleep(GATE_POLL_S)
