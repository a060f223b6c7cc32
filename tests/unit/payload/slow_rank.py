"""`allreduce-bench` with one rank made slow: a straggler planted for the tests.

Run under torchrun like the payload itself; the rank named by GPUVET_SLOW_RANK
sleeps GPUVET_SLOW_S seconds in every matrix product, which is the local work
of each barrier iteration (payload/allreduce.py `barrier_times`).
"""

import os
import sys
import time

import torch

if os.environ.get("RANK") == os.environ.get("GPUVET_SLOW_RANK"):
    _mm = torch.mm
    _delay = float(os.environ.get("GPUVET_SLOW_S", "0.02"))

    def _slow_mm(*args, **kwargs):  # type: ignore[no-untyped-def]
        time.sleep(_delay)
        return _mm(*args, **kwargs)

    torch.mm = _slow_mm

from payload.__main__ import main  # noqa: E402

sys.exit(main(sys.argv[1:]))
