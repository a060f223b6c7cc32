"""``python3 -m payload train``: the rank program, run under torchrun.

    python -m torch.distributed.run ... -m payload train --phase reference|kill|restore \\
        --out DIR --ckpt-dir DIR --params JSON [--save-at K ...]

Every rank appends its events (``protocol``) to ``DIR/rank<R>.jsonl``; rank 0
also prints them. A step's loss is the mean over ranks and micro-batches,
written as ``float.hex`` (exact) and ``repr``.

Deterministic mode (``deterministic: true``, the default for the
verification) sets ``torch.use_deterministic_algorithms(True)`` (strict: cuDNN
attention's backward, for one, only picks its deterministic algorithm then; if
an op has no deterministic kernel the discarded warm-up pass raises, the reason
is logged and the run goes on with ``warn_only=True``),
``CUBLAS_WORKSPACE_CONFIG=:4096:8`` (the supervisor exports it before any CUDA
call), ``cudnn.deterministic=True`` and ``cudnn.benchmark=False``, and seeds
python and torch from the suite's seed. An operation with no deterministic
kernel then still runs; its warning is logged as a ``nondeterministic`` event,
the reason the controller gives when it falls back to a tolerance.

DDP rebuilds its gradient buckets after the first backward, in the order
gradients became ready; a restored process would otherwise reduce its first
step through different buckets than the uninterrupted run did at that step.
Every phase therefore starts with one discarded forward/backward (RNG forked,
gradients dropped, no optimizer step), which also moves torch.compile's
compilation out of the timed steps.

Speed. Determinism has a price: PyTorch runs no cuDNN attention then, and flash
attention's deterministic backward is slower (on an H200, causal attention of the
1b preset's shape took 2.5 ms forward and backward deterministically, 1.1 ms with
cuDNN). So the figures a training job would see come from a throughput segment:
after the reference's N verified steps, the reference phase turns deterministic
mode off and runs ``throughput_steps`` more steps on the fastest kernels (one
discarded step first: the kernels change, so torch.compile compiles again). Those
steps are ``throughput_step`` events, never compared with anything; the
deterministic steps keep their own timings.

torch.compile compiles regions (``startup.compile_regions``): each block on its
own (the blocks share one compiled graph), the embeddings, and the head with its
loss. A launch compiles one block instead of the whole model, and DDP's gradient
hooks fire block by block as in eager mode. ``startup`` holds the rest of a
rank's set-up (determinism, process group, DDP or FSDP2, optimizer, start-up laps).

torch is imported inside :func:`main`.
"""

import errno
import json
import math
import os
import random
import sys
import time
import warnings
from typing import Any, Callable, Dict, List, Optional

from payload.train import config, protocol, startup


def add_arguments(p: Any) -> None:
    p.add_argument("--phase", choices=protocol.PHASES, required=True)
    p.add_argument("--out", required=True, help="folder for this node's rank files")
    p.add_argument("--ckpt-dir", default="", help="checkpoint root of this run unit")
    p.add_argument("--params", default="{}", help="the run configuration as JSON")
    p.add_argument("--save-at", type=int, action="append", default=[],
                   help="save a checkpoint after this step (repeatable)")


class Log:
    def __init__(self, out_dir: str, rank: int) -> None:
        os.makedirs(out_dir, exist_ok=True)
        self.rank = rank
        self._f = open(protocol.rank_file(out_dir, rank), "a", encoding="utf-8")  # noqa: SIM115
        self._seen: set = set()

    def __call__(self, event: str, **fields: Any) -> None:
        rec = {"event": event, "rank": self.rank, "t": time.time()}
        rec.update(fields)
        line = json.dumps(rec, sort_keys=True, default=str)
        self._f.write(line + "\n")
        self._f.flush()
        if self.rank == 0:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    def once(self, event: str, key: str, **fields: Any) -> None:
        if key not in self._seen:
            self._seen.add(key)
            self(event, **fields)

    def close(self) -> None:
        self._f.close()


def lr_factor(cfg: Dict[str, Any], it: int) -> float:
    """Linear warm-up, then cosine down to min_lr_ratio at the last step (it: 0-based)."""
    warm = int(cfg["warmup_steps"])
    if it < warm:
        return (it + 1) / float(warm)
    progress = min(1.0, (it - warm) / float(max(1, int(cfg["steps"]) - warm)))
    floor = float(cfg["min_lr_ratio"])
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


class Job:
    """One rank's state: model, optimizer, schedule, data, and how to step them."""

    def __init__(self, args: Any, cfg: Dict[str, Any], log: Log,
                 clock: Optional[startup.Laps] = None) -> None:
        import torch
        import torch.distributed as dist

        from payload.train import data, model

        laps = clock if clock is not None else startup.Laps(time.time())
        self.laps = laps
        self.torch, self.dist, self.cfg, self.log = torch, dist, cfg, log
        self.rank = int(os.environ.get("RANK", "0"))
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        local = int(os.environ.get("LOCAL_RANK", "0"))
        env = dict(os.environ)
        gate = startup.gate_at(env)
        self.gate_t: Optional[float] = None
        if gate == "start":
            # started while another step measures the GPUs: nothing of CUDA before the
            # gate says "cuda" (or "go"); the ready gate below holds it after that
            if cfg["compile"] and torch.version.cuda is not None:  # no CUDA call: the build
                startup.prepare_compile(torch)
                laps.lap("compile_import")
            startup.wait_gate(env, startup.gate_timeout(env), (startup.CUDA_WORD, "go"))
            laps.lap("gate_cuda_wait")
        cuda = torch.cuda.is_available() and torch.cuda.device_count() > 0
        self.device = torch.device("cuda", local) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(self.device)
            torch.zeros(1, device=self.device)  # the CUDA context, timed on its own
        self.det = startup.determinism(torch, bool(cfg["deterministic"]))
        laps.lap("cuda_context")
        self.backend = "nccl" if cuda else "gloo"
        startup.init_group(dist, self.backend, self.device if cuda else None,
                    float(cfg["collective_timeout_s"]))
        laps.lap("process_group")
        self.compiled = bool(cfg["compile"]) and cuda
        if self.compiled and gate != "start":
            startup.prepare_compile(torch)
            laps.lap("compile_import")
        if gate is not None:
            # started ahead of its turn: hold here until the phase before it is over
            self.gate_t = startup.wait_gate(env, startup.gate_timeout(env))
            laps.lap("gate_wait")
        self.autocast = cuda and cfg["dtype"] == "bf16"
        random.seed(int(cfg["seed"]) + self.rank)
        torch.manual_seed(int(cfg["seed"]))  # identical initial weights on every rank
        self.model = model.build(cfg, self.device)
        torch.manual_seed(int(cfg["seed"]) * 1000 + self.rank + 1)  # per-rank dropout masks
        laps.lap("model")
        self.mode = startup.parallel_mode(cfg, torch, self.device)
        if self.compiled:
            startup.compile_regions(self.model, torch)
            laps.lap("compile_setup")
        self.wrapped = startup.wrap(self.model, self.mode, torch, self.device)
        laps.lap("wrap")
        self.opt = startup.optimizer(self.model, cfg, torch, self.device)
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lambda it: lr_factor(cfg, it))
        laps.lap("optimizer")
        self.data = data.SyntheticTokens(int(cfg["seed"]), self.rank, int(cfg["vocab_size"]),
                                         int(cfg["seq_len"]), int(cfg["micro_batch"]))
        self.step = 0
        self.ckpt_dir = args.ckpt_dir

    # ------------------------------------------------------------------ stepping

    def _sync_ctx(self, last: bool) -> Any:
        import contextlib

        if self.mode == "fsdp":
            self.wrapped.set_requires_gradient_sync(last)
            return contextlib.nullcontext()
        return contextlib.nullcontext() if last else self.wrapped.no_sync()

    def _micro(self, x: Any, y: Any, accum: int) -> Any:
        torch = self.torch
        with torch.autocast(device_type=self.device.type, dtype=torch.bfloat16,
                            enabled=self.autocast):
            loss = self.wrapped(x, y)
        return loss / accum

    def warm_up(self) -> float:
        """The discarded first pass: DDP buckets and compilation, no state change."""
        torch = self.torch
        t0 = time.time()
        devices = [self.device.index] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            x, y = self.data.batch_at(-1)
            try:
                loss = self._micro(x.to(self.device), y.to(self.device), 1)
                loss.backward()
            except RuntimeError as exc:
                if "determinis" not in str(exc) or torch.is_deterministic_algorithms_warn_only_enabled():
                    raise
                # an op with no deterministic kernel: go on without the guarantee, say why
                self.log.once("nondeterministic", str(exc)[:200], message=str(exc)[:500])
                torch.use_deterministic_algorithms(True, warn_only=True)
                self.opt.zero_grad(set_to_none=True)
                loss = self._micro(x.to(self.device), y.to(self.device), 1)
                loss.backward()
        self.opt.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.dist.barrier()
        return time.time() - t0

    def train_step(self) -> Dict[str, Any]:
        torch, cfg = self.torch, self.cfg
        accum = int(cfg["grad_accum"])
        cuda = self.device.type == "cuda"
        t0 = time.perf_counter()
        wait = fwd = 0.0
        total = torch.zeros((), device=self.device)
        lr = self.opt.param_groups[0]["lr"]
        self.step += 1
        fwd_events = []
        for i in range(accum):
            d0 = time.perf_counter()
            x, y = self.data.next()
            x = x.to(self.device, non_blocking=True)
            y = y.to(self.device, non_blocking=True)
            wait += time.perf_counter() - d0
            with self._sync_ctx(i == accum - 1):
                f0 = time.perf_counter()
                if cuda:
                    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
                        enable_timing=True)
                    e0.record()
                loss = self._micro(x, y, accum)
                if cfg.get("inject_nan_at_step") == self.step:
                    loss = loss * float("nan")
                if cuda:
                    e1.record()
                    fwd_events.append((e0, e1))
                else:
                    fwd += time.perf_counter() - f0
                loss.backward()
            total += loss.detach().float()
        if cfg["grad_clip"]:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), float(cfg["grad_clip"]))
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        self.dist.all_reduce(total)
        value = float(total.item()) / self.world
        if cuda:
            fwd = sum(a.elapsed_time(b) for a, b in fwd_events) / 1000.0
        rec = {"step": self.step, "loss": repr(value), "loss_hex": value.hex(), "lr": lr,
               "step_time_s": round(time.perf_counter() - t0, 6), "data_wait_s": round(wait, 6),
               "fwd_s": round(fwd, 6), "tokens": config.tokens_per_step(cfg)}
        rec.update(self.memory())
        return rec

    def memory(self) -> Dict[str, Any]:
        torch = self.torch
        if self.device.type == "cuda":
            return {"mem_alloc_peak": torch.cuda.max_memory_allocated(self.device),
                    "mem_reserved_peak": torch.cuda.max_memory_reserved(self.device)}
        import resource

        return {"rss_peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}

    # ------------------------------------------------------------------ checkpoints

    def progress(self, lr_last: float) -> Dict[str, Any]:
        return {"step": self.step, "data": self.data.state_dict(),
                "scheduler": self.sched.state_dict(), "lr_last": lr_last}

    def save(self, lr_last: float, manifest_delay_s: float, behind: bool = False,
             before_commit: Optional[Callable[[], None]] = None) -> Any:
        """The checkpoint of this step, written (a ckpt.Written: its finish() returns
        what the SAVED event reports)."""
        from payload.train import ckpt

        progress = self.progress(lr_last)
        rng = ckpt.rng_state(self.device)
        hashes = ckpt.state_hashes(self.model, self.opt, rng, progress)
        extra = {"progress": progress, "rng": rng, "hashes": hashes}
        return ckpt.save(self.ckpt_dir, self.step, self.model, self.opt, extra, self.rank,
                         self.world, manifest_delay_s,
                         on_commit=lambda: self.log(protocol.COMMIT, step=self.step),
                         behind=behind, before_commit=before_commit)

    def restore(self) -> Optional[Dict[str, Any]]:
        from payload.train import ckpt

        t0 = time.time()
        found, skipped = ckpt.find_and_load(self.ckpt_dir, self.model, self.opt, self.rank,
                                            self.world)
        for s in skipped:
            self.log(protocol.SKIP_CKPT, **s)
        if found is None:
            return None
        path, extra = found["path"], found["extra"]
        progress = extra["progress"]
        self.sched.load_state_dict(progress["scheduler"])
        self.data.load_state_dict(progress["data"])
        self.step = int(progress["step"])
        ckpt.set_rng_state(extra["rng"], self.device)
        loaded = ckpt.state_hashes(self.model, self.opt, ckpt.rng_state(self.device),
                                   self.progress(progress["lr_last"]))
        saved = extra["hashes"]
        # verify_s: hashing this rank's share of the files, beside the load (load_s)
        return {"step": self.step, "path": path, "verify_s": found["verify_s"],
                "load_s": round(time.time() - t0, 4), "hashes_saved": saved,
                "hashes_loaded": loaded, "match": saved == loaded,
                "lr_last": progress["lr_last"], "lr_next": self.opt.param_groups[0]["lr"],
                "data_position": self.data.position, "skipped": len(skipped)}


def _capture_warnings(log: Log) -> None:
    def show(message: Any, category: Any, filename: str, lineno: int, file: Any = None,
             line: Optional[str] = None) -> None:
        text = str(message)
        if "determinis" in text:
            log.once("nondeterministic", text[:200], message=text[:500])
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))

    warnings.showwarning = show


def _nonfinite(log: Log, rec: Dict[str, Any]) -> bool:
    if math.isfinite(float(rec["loss"])):
        return False
    log(protocol.ERROR, kind="nonfinite", step=rec["step"],
        message="loss is %s at step %d" % (rec["loss"], rec["step"]))
    return True


def throughput(job: Job, log: Log, count: int) -> int:
    """`count` timed steps on the fastest kernels, after one discarded step (the kernels
    change, so torch.compile compiles again); they go on from the reference's state."""
    settings = startup.determinism(job.torch, False)
    t0 = time.time()
    first = job.train_step()
    log(protocol.THROUGHPUT, steps=count, first_step=first["step"],
        first_step_s=round(time.time() - t0, 4), deterministic=settings)
    if _nonfinite(log, first):
        return protocol.RC_NONFINITE
    for _ in range(count):
        rec = job.train_step()
        log(protocol.TSTEP, **rec)
        if _nonfinite(log, rec):
            return protocol.RC_NONFINITE
    return 0


def run(args: Any, cfg: Dict[str, Any], log: Log, clock: Optional[startup.Laps] = None) -> int:
    import torch

    job = Job(args, cfg, log, clock)
    versions = startup.versions(torch, job.device)
    log(protocol.START, phase=args.phase, world=job.world, backend=job.backend,
        launch_s=startup.launch_seconds(job.laps.t0, dict(os.environ)), init_s=job.laps.laps,
        init_order=list(job.laps.laps),  # the record sorts init_s by name
        device=str(job.device), parallel=job.mode, compiled=job.compiled,
        autocast_bf16=job.autocast, deterministic=job.det, versions=versions, config=cfg,
        params=config.param_count(cfg), flops_per_token=config.flops_per_token(cfg),
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        node_hostid=os.environ.get("NCCL_HOSTID"), gate_open_t=job.gate_t)
    log(protocol.WARMUP, seconds=round(job.warm_up(), 4))
    if args.phase == "restore":
        info = job.restore()
        if info is None:
            log(protocol.ERROR, kind="no_checkpoint",
                message="no complete checkpoint under %s" % args.ckpt_dir)
            return protocol.RC_NO_CHECKPOINT
        log(protocol.LOADED, **info)
    saves = sorted(set(args.save_at))
    first_save = saves[0] if saves else None
    # a save the kill does not come at may have its manifest hashed behind the training
    # (cfg manifest_behind: the kill lands at a later save's commit), finished before
    # that later save's commit
    pending: List[Any] = []

    def settle() -> None:
        while pending:
            step, written = pending.pop()
            log(protocol.SAVED, step=step, **written.finish())

    while job.step < int(cfg["steps"]):
        rec = job.train_step()
        log(protocol.STEP, **rec)
        if _nonfinite(log, rec):
            return protocol.RC_NONFINITE
        if job.step in saves:
            log(protocol.SAVING, step=job.step)
            delay = float(cfg["manifest_delay_s"]) if job.step != first_save else 0.0
            behind = bool(cfg.get("manifest_behind")) and job.step != saves[-1]
            written = job.save(rec["lr"], delay, behind=behind, before_commit=settle)
            if behind:
                pending.append((job.step, written))
            else:
                log(protocol.SAVED, step=job.step, **written.finish())
    settle()
    count = int(cfg.get("throughput_steps") or 0)
    if args.phase == "reference" and count > 0 and job.det["use_deterministic_algorithms"]:
        rc = throughput(job, log, count)
        if rc:
            return rc
    log(protocol.END, steps=job.step, **job.memory())
    return 0


def main(args: Any) -> int:
    clock = startup.Laps(time.time())
    cfg = config.from_json(args.params)
    rank = int(os.environ.get("RANK", "0"))
    log = Log(args.out, rank)
    _capture_warnings(log)
    import torch

    clock.lap("import_torch")
    oom = getattr(torch.cuda, "OutOfMemoryError", None)
    try:
        rc = run(args, cfg, log, clock)
    except startup.GateStopped as exc:  # started ahead and not needed: not a failure
        log(protocol.ERROR, kind="gate_stopped", message=str(exc))
        rc = protocol.RC_GATE_STOPPED
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # the record says why; torchrun reports the exit status
        # (DCP's CheckpointException derives from BaseException, not Exception)
        kind, cause = error_kind(exc, oom)
        detail: Dict[str, Any] = {}
        if kind == "oom" and torch.cuda.is_available():
            detail = {"mem_alloc": torch.cuda.memory_allocated(),
                      "mem_reserved": torch.cuda.memory_reserved()}
        log(protocol.ERROR, kind=kind, type=type(exc).__name__, message=str(exc)[:2000],
            cause=cause, **detail)
        sys.stderr.write("%s: %s\n" % (type(exc).__name__, exc))
        rc = protocol.RC_OOM if kind == "oom" else 1
    finally:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # a group broken by a dead peer cannot be torn down cleanly
                pass
        log.close()
    if os.environ.get(FAST_EXIT_ENV) == "1":
        fast_exit(rc)
    return rc


def error_kind(exc: BaseException, oom: Any = None) -> "tuple[str, str]":
    """(kind, cause) of the exception a rank died of: oom, no_space (ENOSPC, on a save:
    the checkpoint directory filled), or exception; the cause is its last line (DCP wraps
    a writer thread's error in a CheckpointException whose text is that thread's
    traceback)."""
    text = str(exc)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    cause = lines[-1][:500] if lines else type(exc).__name__
    if (oom is not None and isinstance(exc, oom)) or "out of memory" in text:
        return "oom", cause
    if getattr(exc, "errno", None) == errno.ENOSPC or "[Errno %d]" % errno.ENOSPC in text \
            or "No space left on device" in text:
        return "no_space", cause
    return "exception", cause


# Set by train-supervise for the ranks it starts: once a rank's record is closed and its
# process group destroyed, nothing of the interpreter's own teardown is needed (freeing
# the CUDA caching allocator's memory block by block, the compile workers' shutdown, the
# module finalisers: about 2-3 s of a 1B run on an H100), and the next phase's gate opens
# when this process is gone. The driver frees the GPU memory with the process.
FAST_EXIT_ENV = "GPUVET_TRAIN_FAST_EXIT"


def fast_exit(rc: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(rc)
