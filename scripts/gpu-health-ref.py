#!/usr/bin/env python3
"""The plain torch reference the health scripts compare gpuvet with: no gpuvet code, what
a user would measure by hand. A copy of 2 GiB buffers (bytes read plus written), a
read-only sum, an 8192^3 bf16 product (median of 10, CUDA events) and 15 s of them back
to back, pinned 1 GiB host copies each way; tiny sizes with DEVICE=cpu.

    DEVICE=cuda python3 scripts/gpu-health-ref.py OUT.json
"""

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

CUDA = os.environ.get("DEVICE", "cuda") == "cuda"
DEV = torch.device("cuda", 0) if CUDA else torch.device("cpu")


def sync() -> None:
    if CUDA:
        torch.cuda.synchronize(DEV)


def median_s(fn: Callable[[], Any], reps: int, warm: int) -> float:
    for _ in range(warm):
        fn()
    sync()
    times = []
    for _ in range(reps):
        if CUDA:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) / 1e3)
        else:
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    times.sort()
    return times[len(times) // 2]


def memory(out: dict[str, Any], nbytes: int) -> None:
    a = torch.empty(nbytes, dtype=torch.uint8, device=DEV).random_(0, 255)
    b = torch.empty_like(a)
    out["copy_gbps"] = 2 * nbytes / median_s(lambda: b.copy_(a), 20, 3) / 1e9
    af = a.view(torch.float32)
    out["read_gbps"] = nbytes / median_s(lambda: af.sum(), 20, 3) / 1e9


def matmul(out: dict[str, Any], n: int, window: float) -> None:
    x = torch.randn(n, n, device=DEV, dtype=torch.bfloat16)
    y = torch.randn(n, n, device=DEV, dtype=torch.bfloat16)
    out["bf16_tflops"] = 2 * n ** 3 / median_s(lambda: x @ y, 10, 2) / 1e12
    sync()
    t, k = time.time(), 0
    while time.time() - t < window:
        for _ in range(20):
            x @ y
        sync()
        k += 20
    out["bf16_sustained_tflops"] = 2 * n ** 3 * k / (time.time() - t) / 1e12


def host(out: dict[str, Any]) -> None:
    h = torch.empty(1 << 30, dtype=torch.uint8, pin_memory=True)
    d = torch.empty(1 << 30, dtype=torch.uint8, device=DEV)
    out["h2d_gbps"] = (1 << 30) / median_s(lambda: d.copy_(h, non_blocking=True), 10, 2) / 1e9
    out["d2h_gbps"] = (1 << 30) / median_s(lambda: h.copy_(d, non_blocking=True), 10, 2) / 1e9


def main(path: str) -> None:
    nbytes, n, window = (2 << 30, 8192, 15.0) if CUDA else (8 << 20, 128, 1.0)
    out: dict[str, Any] = {"device": torch.cuda.get_device_name(DEV) if CUDA else "cpu",
                           "torch": torch.__version__}
    memory(out, nbytes)
    matmul(out, n, window)
    if CUDA:
        host(out)
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
