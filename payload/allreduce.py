"""A torch.distributed collective benchmark that prints nccl-tests' columns.

``python3 -m torch.distributed.run ... -m payload allreduce-bench -b 8 -e 128M -f 2``

``--op`` picks the collective: all_reduce (the default), all_gather, reduce_scatter or
all_to_all (printed as nccl-tests names it, ``alltoall_perf``). Sizes are nccl-tests'
own: the whole buffer (all_gather's output, reduce_scatter's input, all_to_all's buffer
of every peer's chunk), and busbw is nccl-tests' factor for the collective
(``BUSBW_FACTORS``). gloo has no reduce_scatter in some torch versions: the table then
says so in one ``# gpuvet skipped:`` line and holds no rows.

A second opinion on nccl-tests (the two should agree within a few percent at
large sizes) and the fallback where nccl-tests cannot be built. Rank 0
prints a table in nccl-tests' own layout, so the same parser reads both.
torch's all_reduce works in place, so both column groups time the in-place operation,
on separate buffers; the other collectives time the out-of-place call in both.

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


# nccl-tests' busbw: algbw times this factor of the rank count n (src/*.cu, *GetBw), so a
# collective's busbw is comparable with the links' bandwidth whatever the collective
BUSBW_FACTORS = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / float(n),
    "reduce_scatter": lambda n: (n - 1) / float(n),
    "alltoall": lambda n: (n - 1) / float(n),
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "sendrecv": lambda n: 1.0,
}
# the torch engine's names for them; all_to_all is nccl-tests' alltoall
TORCH_OPS = {"all_reduce": "all_reduce", "all_gather": "all_gather",
             "reduce_scatter": "reduce_scatter", "all_to_all": "alltoall",
             "alltoall": "alltoall"}
SKIPPED = "# gpuvet skipped: "


def busbw_factor(op: str, n: int) -> float:
    """nccl-tests' factor from algbw to busbw for `op` (its log name) over `n` ranks."""
    if n < 1:
        raise ValueError("a collective needs at least one rank")
    return BUSBW_FACTORS[op](n)


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
    p.add_argument("--op", default="all_reduce", choices=sorted(TORCH_OPS),
                   help="the collective: all_reduce, all_gather, reduce_scatter or all_to_all")
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
         wrong: int, op: str = "all_reduce") -> str:
    def grp(t: float) -> str:
        algbw = size / t / 1e3 if t > 0 else 0.0
        busbw = algbw * busbw_factor(op, n)
        return "%8.2f %7.2f %7.2f %7d" % (t, algbw, busbw, wrong)

    redop = "sum" if op in ("all_reduce", "reduce_scatter") else "none"
    return "%12d %13d %9s %7s %7d %s %s" % (size, count, dtype, redop, -1, grp(t_us), grp(t2_us))


def _collective(dist: Any, torch: Any, op: str, world: int, rank: int, count: int,
                dtype: Any, device: Any) -> Tuple[Any, Any]:
    """(run, check): `run()` does the collective once on buffers made here, `check()`
    counts the output values that are not what it should give (nccl-tests' #wrong)."""
    if op == "all_reduce":
        buf = torch.full((count,), float(rank + 1), dtype=dtype, device=device)
        return (lambda: dist.all_reduce(buf)), (
            lambda: int((buf != world * (world + 1) / 2.0).sum().item()))
    chunk = count // world
    # every rank's chunk holds its rank + 1: the output says which rank each came from
    want = torch.cat([torch.full((chunk,), float(i + 1), dtype=dtype, device=device)
                      for i in range(world)])
    if op == "all_gather":
        mine = torch.full((chunk,), float(rank + 1), dtype=dtype, device=device)
        out = torch.empty((chunk * world,), dtype=dtype, device=device)
        parts = list(out.split(chunk))

        def gather() -> None:
            dist.all_gather(parts, mine)
        return gather, (lambda: int((out != want).sum().item()))
    if op == "reduce_scatter":
        inp = torch.full((chunk * world,), float(rank + 1), dtype=dtype, device=device)
        res = torch.empty((chunk,), dtype=dtype, device=device)
        parts = list(inp.split(chunk))

        def scatter() -> None:
            dist.reduce_scatter(res, parts)
        return scatter, (lambda: int((res != world * (world + 1) / 2.0).sum().item()))
    # alltoall: chunk i of every rank goes to rank i
    inp = torch.full((chunk * world,), float(rank + 1), dtype=dtype, device=device)
    got = torch.empty((chunk * world,), dtype=dtype, device=device)

    def a2a() -> None:
        dist.all_to_all_single(got, inp)
    return a2a, (lambda: int((got != want).sum().item()))


def unsupported(exc: BaseException) -> bool:
    """gloo's answer to a collective it does not implement (reduce_scatter in torch 2.x)."""
    text = str(exc).lower()
    return "not support" in text or "unsupported" in text or "not implemented" in text


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
    op = TORCH_OPS[args.op]
    todo = sizes(parse_size(args.minbytes), parse_size(args.maxbytes), args.stepfactor, elem)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def timed(fn: Any) -> float:
        for _ in range(args.warmup_iters):
            fn()
        sync()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(args.iters):
            fn()
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
        out.write("# gpuvet torch.distributed %s benchmark, torch %s, backend %s\n"
                  % (op, torch.__version__, backend))
        out.write("# Collective test starting: %s_perf\n" % op)
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
    skipped = None
    for size in todo:
        count = size // elem
        if op != "all_reduce":
            count -= count % world  # every rank's chunk alike, as nccl-tests rounds it
            if not count:
                continue
            size = count * elem
        wrong = 0
        run_a, check_a = _collective(dist, torch, op, world, rank, count, dtype, device)
        try:
            run_a()
        except RuntimeError as exc:
            if not unsupported(exc):
                raise
            skipped = "%s is not supported by the %s backend in torch %s (%s)" % (
                args.op, backend, torch.__version__, str(exc).strip().splitlines()[0][:160])
            break
        if args.check:
            wrong = check_a()
            t = torch.tensor([wrong], dtype=torch.int64, device=device)
            dist.all_reduce(t)
            wrong = int(t.item())
            total_wrong += wrong
        run_b, _ = _collective(dist, torch, op, world, rank, count, dtype, device)
        t_out, t_in = timed(run_a), timed(run_b)
        for t_us in (t_out, t_in):
            busbws.append(size / t_us / 1e3 * busbw_factor(op, world) if t_us > 0 else 0.0)
        if rank == 0:
            sys.stdout.write(_row(size, count, args.dtype, t_out, t_in, world, wrong, op) + "\n")
            sys.stdout.flush()
        del run_a, run_b, check_a
    if skipped is not None:
        if rank == 0:
            sys.stdout.write(SKIPPED + skipped + "\n# Collective test concluded: %s_perf\n" % op)
            sys.stdout.flush()
        dist.destroy_process_group()
        return 0
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
                         "# Collective test concluded: %s_perf\n" % (avg, op))
        sys.stdout.flush()
    dist.destroy_process_group()
    return 0
