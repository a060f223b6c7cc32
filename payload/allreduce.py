"""A torch.distributed all_reduce benchmark that prints nccl-tests' columns.

``python3 -m torch.distributed.run ... -m payload allreduce-bench -b 8 -e 128M -f 2``

A second opinion on nccl-tests (the two should agree within a few percent at
large sizes) and the fallback where nccl-tests cannot be built. Rank 0
prints a table in nccl-tests' own layout, so the same parser reads both.
busbw uses nccl-tests' all_reduce factor 2(n-1)/n. torch's all_reduce works
in place, so both column groups time the in-place operation, on separate
buffers.

With ``--rank-times PATH`` it then times every rank at a barrier, so a
straggler can be told in a run of many nodes: each of ``--straggler-iters``
iterations does the same local work on every rank (a matrix product), notes
when the rank arrives at the barrier and how long it waits there. The rank
that arrives last waits least; clocks of different nodes are never compared.
Rank 0 writes every rank's times to PATH as JSON (stdout is unchanged).

torch is imported inside main(): the payload package stays importable
without it. Python 3.8 compatible.
"""

import datetime
import json
import os
import re
import socket
import sys
import time
from typing import Any, Dict, List, Tuple, Union

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: Union[str, int]) -> int:
    """nccl-tests' size notation (8, 64K, 128M, 4G); the controller uses it too."""
    m = re.fullmatch(r"(\d+)([KMGT]?)B?", str(text).strip().upper())
    if not m:
        raise ValueError("bad size %r (use e.g. 8, 64K, 128M, 1G)" % (text,))
    return int(m.group(1)) * UNITS[m.group(2)]


def sizes(min_bytes: int, max_bytes: int, factor: int, elem: int) -> List[int]:
    out = []
    size = max(min_bytes, elem)
    while size <= max_bytes:
        out.append(size - size % elem)
        size *= factor
    return out


def add_arguments(p: Any) -> None:
    p.add_argument("-b", "--minbytes", default="8")
    p.add_argument("-e", "--maxbytes", default="128M")
    p.add_argument("-f", "--stepfactor", type=int, default=2)
    p.add_argument("-n", "--iters", type=int, default=20)
    p.add_argument("-w", "--warmup-iters", type=int, default=5)
    p.add_argument("-c", "--check", type=int, default=1)
    p.add_argument("--backend", default="auto", help="nccl, gloo or auto (nccl with CUDA)")
    p.add_argument("--dtype", default="float", choices=["float", "half", "bfloat16", "double"])
    p.add_argument("--pg-timeout", type=float, default=0.0, metavar="SECONDS",
                   help="give up on a peer that does not answer (rendezvous and every "
                        "collective) after this long; 0: torch's default")
    p.add_argument("--rank-times", metavar="PATH",
                   help="also time each rank's arrival at a barrier; rank 0 writes JSON here")
    p.add_argument("--straggler-iters", type=int, default=20,
                   help="barrier iterations for --rank-times")
    p.add_argument("--straggler-dim", type=int, default=0,
                   help="side of the square matrix product each rank computes per iteration "
                        "(0: 4096 on a GPU, 256 on a CPU)")


RANK_TIMES_KIND = "gpuvet-rank-times"
RANK_TIMES_VERSION = 1


def barrier_times(dist: Any, torch: Any, device: Any, sync: Any, iters: int, dim: int,
                  warmup: int = 2) -> Tuple[List[float], List[float]]:
    """(work_us, wait_us) per iteration of this rank: the local work, then the barrier."""
    a = torch.ones((dim, dim), dtype=torch.float32, device=device)
    b = torch.ones((dim, dim), dtype=torch.float32, device=device)
    work, wait = [], []
    for i in range(warmup + iters):
        t0 = time.perf_counter()
        torch.mm(a, b)
        sync()
        t1 = time.perf_counter()
        dist.barrier()
        sync()
        t2 = time.perf_counter()
        if i >= warmup:
            work.append(round((t1 - t0) * 1e6, 1))
            wait.append(round((t2 - t1) * 1e6, 1))
    return work, wait


def write_rank_times(path: str, doc: Dict[str, Any]) -> None:
    """Atomically: a reader never sees half a document."""
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d):
        os.makedirs(d)
    tmp = "%s.tmp-%d" % (path, os.getpid())
    with open(tmp, "w") as f:
        json.dump(doc, f, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def _row(size: int, count: int, dtype: str, t_us: float, t2_us: float, n: int,
         wrong: int) -> str:
    def grp(t: float) -> str:
        algbw = size / t / 1e3 if t > 0 else 0.0
        busbw = algbw * 2.0 * (n - 1) / n
        return "%8.2f %7.2f %7.2f %7d" % (t, algbw, busbw, wrong)

    return "%12d %13d %9s %7s %7d %s %s" % (size, count, dtype, "sum", -1, grp(t_us), grp(t2_us))


def main(args: Any) -> int:
    import torch
    import torch.distributed as dist

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    backend = args.backend if args.backend != "auto" else ("nccl" if cuda else "gloo")
    device = torch.device("cuda", local) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if args.pg_timeout > 0:
        # a rank whose peer died (a node lost mid-run) fails after this, not after 30 min
        dist.init_process_group(backend=backend,
                                timeout=datetime.timedelta(seconds=args.pg_timeout))
    else:
        dist.init_process_group(backend=backend)
    dtype = {"float": torch.float32, "half": torch.float16, "bfloat16": torch.bfloat16,
             "double": torch.float64}[args.dtype]
    elem = torch.tensor([], dtype=dtype).element_size()
    todo = sizes(parse_size(args.minbytes), parse_size(args.maxbytes), args.stepfactor, elem)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def timed(buf: Any) -> float:
        for _ in range(args.warmup_iters):
            dist.all_reduce(buf)
        sync()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(args.iters):
            dist.all_reduce(buf)
        sync()
        return (time.perf_counter() - t0) / max(args.iters, 1) * 1e6

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    bus = "0000:00:00"
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        bus = "%04x:%02x:%02x" % (getattr(props, "pci_domain_id", 0),
                                  getattr(props, "pci_bus_id", 0),
                                  getattr(props, "pci_device_id", 0))
    line = "#  Rank %2d Group  0 Pid %6d on %10s device %2d [%s] %s" % (
        rank, os.getpid(), socket.gethostname(), local, bus, name)
    lines = [None] * world if rank == 0 else None
    dist.gather_object(line, lines, dst=0)
    if rank == 0:
        out = sys.stdout
        out.write("# gpuvet torch.distributed all_reduce benchmark, torch %s, backend %s\n"
                  % (torch.__version__, backend))
        out.write("# Collective test starting: all_reduce_perf\n")
        out.write("# nThread 1 nGpus 1 minBytes %d maxBytes %d step: %d(factor) warmup iters: %d "
                  "iters: %d agg iters: 1 validation: %d graph: 0\n"
                  % (todo[0] if todo else 0, todo[-1] if todo else 0, args.stepfactor,
                     args.warmup_iters, args.iters, args.check))
        out.write("#\n# Using devices\n")
        for item in lines or []:
            out.write("%s\n" % item)
        out.write("#\n#%59s%35s\n" % ("out-of-place", "in-place"))
        out.write("#       size         count      type   redop    root     time   algbw   busbw "
                  " #wrong     time   algbw   busbw  #wrong\n")
        out.write("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)  "
                  "           (us)  (GB/s)  (GB/s)         \n")
        out.flush()
    busbws = []
    total_wrong = 0
    for size in todo:
        count = size // elem
        wrong = 0
        a = torch.full((count,), float(rank + 1), dtype=dtype, device=device)
        if args.check:
            dist.all_reduce(a)
            expect = world * (world + 1) / 2.0
            wrong = int((a != expect).sum().item())
            t = torch.tensor([wrong], dtype=torch.int64, device=device)
            dist.all_reduce(t)
            wrong = int(t.item())
            total_wrong += wrong
        b = torch.full((count,), float(rank + 1), dtype=dtype, device=device)
        t_out, t_in = timed(a), timed(b)
        for t_us in (t_out, t_in):
            busbws.append(size / t_us / 1e3 * 2.0 * (world - 1) / world if t_us > 0 else 0.0)
        if rank == 0:
            sys.stdout.write(_row(size, count, args.dtype, t_out, t_in, world, wrong) + "\n")
            sys.stdout.flush()
        del a, b
    if args.rank_times:
        dim = args.straggler_dim or (4096 if device.type == "cuda" else 256)
        work, wait = barrier_times(dist, torch, device, sync, args.straggler_iters, dim)
        mine = {"rank": rank, "local_rank": local, "host": socket.gethostname(),
                "node": os.environ.get("GPUVET_NODE", ""), "work_us": work, "wait_us": wait}
        everyone = [None] * world if rank == 0 else None
        dist.gather_object(mine, everyone, dst=0)
        if rank == 0:
            write_rank_times(args.rank_times, {
                "kind": RANK_TIMES_KIND, "version": RANK_TIMES_VERSION, "backend": backend,
                "world": world, "iters": args.straggler_iters, "dim": dim,
                "ranks": everyone})
    if rank == 0:
        avg = sum(busbws) / len(busbws) if busbws else 0.0
        # as nccl-tests: the values found wrong by the check, summed over sizes
        sys.stdout.write("# Out of bounds values : %d %s\n" % (total_wrong,
                                                               "OK" if not total_wrong else "FAILED"))
        sys.stdout.write("# Avg bus bandwidth    : %g \n#\n"
                         "# Collective test concluded: all_reduce_perf\n" % avg)
        sys.stdout.flush()
    dist.destroy_process_group()
    return 0
