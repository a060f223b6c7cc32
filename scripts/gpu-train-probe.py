"""Where the training step's time goes on a GPU host: the rank program's own step
(payload/train/loop.py, the 1b preset, bf16, DDP) under several settings, one process
per GPU, each variant built, compiled, warmed up and timed in turn.

    NCCL_NVLS_ENABLE=0 CUBLAS_WORKSPACE_CONFIG=:4096:8 OUT=/tmp/probe [SDPA=1] \
      [VARIANTS=r_whole_base,r_regional_b100] [STEPS=16] \
      python3 -m torch.distributed.run --standalone --nproc-per-node 2 \
      scripts/gpu-train-probe.py

Per variant: deterministic or not, which attention kernels may run (default: PyTorch's
choice; flash: flash attention only), DDP's settings, whole-model or regional
torch.compile, and with flip=True, after the timed steps, deterministic mode off and
the same number of steps again (the throughput segment of the reference phase). SDPA=1
first times causal attention of the preset's shape forward and backward per kernel,
deterministic or not, and checks whether four repeats give the same gradients bit
for bit. Prints a table last; $OUT/probe.json has every figure. Results:
docs/benchmarks.md ("Training step on 2 x H200").
"""
import gc
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.getcwd())
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from payload.train import config, data, loop, model, startup  # noqa: E402

OUT = os.environ.get("OUT", "/tmp/probe")
os.makedirs(OUT, exist_ok=True)
PEAK = 989e12

# name: deterministic, attention kernels, DDP keyword arguments, compile mode (whole |
# regional), flip (the throughput segment after the timed steps)
VARIANTS = {
    "r_whole_base": dict(det=True, sdpa="default", ddp={"bucket_cap_mb": 100}, comp="whole",
                         flip=True),
    "r_regional_b25": dict(det=True, sdpa="default", ddp={"gradient_as_bucket_view": True},
                           comp="regional", flip=True),
    "r_regional_b100": dict(det=True, sdpa="default", ddp={"bucket_cap_mb": 100,
                            "gradient_as_bucket_view": True}, comp="regional"),
    "r_regional_nogbv": dict(det=True, sdpa="default", ddp={}, comp="regional"),
    "base": dict(det=True, sdpa="default", ddp={"bucket_cap_mb": 100}, comp="whole"),
    "nondet": dict(det=False, sdpa="default", ddp={"bucket_cap_mb": 100}, comp="whole"),
    "flash": dict(det=True, sdpa="flash", ddp={"bucket_cap_mb": 100}, comp="whole"),
    "gbv": dict(det=True, sdpa="default", ddp={"bucket_cap_mb": 100,
                                               "gradient_as_bucket_view": True}, comp="whole"),
    "flash_gbv": dict(det=True, sdpa="flash", ddp={"bucket_cap_mb": 100,
                                                   "gradient_as_bucket_view": True},
                      comp="whole"),
    "flash_gbv_static": dict(det=True, sdpa="flash",
                             ddp={"bucket_cap_mb": 100, "gradient_as_bucket_view": True,
                                  "static_graph": True}, comp="whole"),
    "flash_gbv_b250": dict(det=True, sdpa="flash", ddp={"bucket_cap_mb": 250,
                                                        "gradient_as_bucket_view": True},
                           comp="whole"),
    "flash_gbv_b25": dict(det=True, sdpa="flash", ddp={"bucket_cap_mb": 25,
                                                       "gradient_as_bucket_view": True},
                          comp="whole"),
}


class NullLog:
    def __call__(self, event, **fields):
        print("LOG", event, json.dumps(fields, default=str)[:300], flush=True)

    def once(self, event, key, **fields):
        self(event, **fields)


def sdpa_bench(rank):
    if rank != 0:
        return []
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    rows = []
    B, H, T, D = 8, 16, 2048, 128
    for det in (True, False):
        torch.use_deterministic_algorithms(det, warn_only=False)
        for name, be in (("flash", SDPBackend.FLASH_ATTENTION),
                         ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                         ("cudnn", SDPBackend.CUDNN_ATTENTION)):
            g = torch.Generator(device="cuda").manual_seed(7)
            q, k, v = (torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16,
                                   generator=g).requires_grad_() for _ in range(3))
            do = torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16, generator=g)
            try:
                grads = []
                times = []
                for i in range(25):
                    q.grad = k.grad = v.grad = None
                    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
                        enable_timing=True)
                    e0.record()
                    with sdpa_kernel(be):
                        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                    o.backward(do)
                    e1.record()
                    torch.cuda.synchronize()
                    if i >= 5:
                        times.append(e0.elapsed_time(e1))
                    if i < 4:
                        grads.append(torch.cat([q.grad.flatten(), k.grad.flatten(),
                                                v.grad.flatten()]).clone())
                same = all(torch.equal(grads[0], x) for x in grads[1:])
                ms = statistics.median(times)
                # causal fwd+bwd: 2*2*B*H*T*T*D/2 fwd, 2.5x that bwd
                fl = 3.5 * 2 * B * H * T * T * D
                rows.append(dict(det=det, backend=name, ms=round(ms, 3),
                                 tflops=round(fl / ms / 1e9, 1), bitwise_repeat=same))
            except Exception as exc:  # noqa: BLE001
                rows.append(dict(det=det, backend=name, error=str(exc)[:200]))
            print("SDPA", rows[-1], flush=True)
    torch.use_deterministic_algorithms(False)
    return rows


def set_sdpa(kind):
    torch.backends.cuda.enable_flash_sdp(True)
    torch.backends.cuda.enable_mem_efficient_sdp(kind == "default")
    torch.backends.cuda.enable_cudnn_sdp(kind == "default")
    torch.backends.cuda.enable_math_sdp(True)


def make_job(cfg, v, rank, world, device):
    job = loop.Job.__new__(loop.Job)
    job.torch, job.dist, job.cfg, job.log = torch, dist, cfg, NullLog()
    job.rank, job.world, job.device = rank, world, device
    job.det = startup.determinism(torch, v["det"])
    if not v["det"]:
        startup.fastest_kernels(torch)
    job.backend = "nccl"
    job.autocast = True
    torch.manual_seed(int(cfg["seed"]))
    job.model = model.build(cfg, device)
    torch.manual_seed(int(cfg["seed"]) * 1000 + rank + 1)
    job.mode = "ddp"
    if v["comp"] == "regional":
        startup.compile_regions(job.model, torch)
    from torch.nn.parallel import DistributedDataParallel as DDP
    job.wrapped = DDP(job.model, device_ids=[device.index], **v["ddp"])
    job.compiled = True
    job.step_fn = torch.compile(job.wrapped) if v["comp"] == "whole" else job.wrapped
    job.opt = startup.optimizer(job.model, cfg, torch, device)
    job.sched = torch.optim.lr_scheduler.LambdaLR(job.opt, lambda it: loop.lr_factor(cfg, it))
    job.data = data.SyntheticTokens(int(cfg["seed"]), rank, int(cfg["vocab_size"]),
                                    int(cfg["seq_len"]), int(cfg["micro_batch"]))
    job.step = 0
    job.ckpt_dir = ""
    return job


def main():
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl")
    results = {"sdpa": sdpa_bench(rank) if os.environ.get("SDPA") else [], "variants": []}
    dist.barrier()
    names = os.environ.get("VARIANTS", ",".join(VARIANTS)).split(",")
    steps = int(os.environ.get("STEPS", "16"))
    for name in names:
        v = VARIANTS[name]
        cfg = config.resolve({"model": "1b", "steps": 100, "ckpt_step": 50})
        set_sdpa(v["sdpa"])
        t0 = time.time()
        try:
            job = make_job(cfg, v, rank, world, device)
            warm = job.warm_up()
            warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
            recs, gpu = [], []
            for i in range(4 + steps):
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
                    enable_timing=True)
                e0.record()
                rec = job.train_step()
                e1.record()
                torch.cuda.synchronize()
                if i >= 4:
                    recs.append(rec)
                    gpu.append(e0.elapsed_time(e1) / 1000)
            flip = {}
            if v.get("flip"):
                startup.fastest_kernels(torch)
                f0 = time.time()
                job.train_step()
                torch.cuda.synchronize()
                flip["first_s"] = round(time.time() - f0, 2)
                ft = [job.train_step()["step_time_s"] for _ in range(steps)]
                flip["step_s"] = round(statistics.median(ft), 4)
                flip["mfu"] = round(100 * config.flops_per_token(cfg) * config.tokens_per_step(cfg)
                                    / flip["step_s"] / PEAK, 2)
            st = statistics.median(r["step_time_s"] for r in recs)
            tok = config.tokens_per_step(cfg)
            mfu = config.flops_per_token(cfg) * tok / st / PEAK
            row = dict(variant=name, warm_s=round(warm, 1), step_s=round(st, 4),
                       p90=round(sorted(r["step_time_s"] for r in recs)[int(0.9 * steps)], 4),
                       gpu_s=round(statistics.median(gpu), 4),
                       fwd_s=round(statistics.median(r["fwd_s"] for r in recs), 4),
                       tok_s_gpu=round(tok / st), mfu=round(100 * mfu, 2),
                       warn_only=warn_only, det=v["det"],
                       mem_gb=round(recs[-1]["mem_alloc_peak"] / 1e9, 1),
                       loss3=recs[0]["loss"], flip=flip, wall=round(time.time() - t0, 1))
        except Exception as exc:  # noqa: BLE001
            import traceback
            traceback.print_exc()
            row = dict(variant=name, error=str(exc)[:300], wall=round(time.time() - t0, 1))
        job = None
        gc.collect()
        torch._dynamo.reset()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        torch.use_deterministic_algorithms(False)
        results["variants"].append(row)
        if rank == 0:
            print("ROW", json.dumps(row), flush=True)
            with open(os.path.join(OUT, "probe.json"), "w") as f:
                json.dump(results, f, indent=1)
        dist.barrier()
    if rank == 0:
        print("\nvariant              step_s  gpu_s   fwd_s   tok/s/GPU  MFU%   warn_only mem")
        for r in results["variants"]:
            if "error" in r:
                print(f"{r['variant']:20} ERROR {r['error'][:120]}")
            else:
                print(f"{r['variant']:20} {r['step_s']:.4f} {r['gpu_s']:.4f} {r['fwd_s']:.4f} "
                      f"{r['tok_s_gpu']:9d} {r['mfu']:6.2f} {r['warn_only']!s:9} {r['mem_gb']} "
                      f"warm {r['warm_s']} flip {r['flip']}")
        for r in results["sdpa"]:
            print("SDPA", r)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
