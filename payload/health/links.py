"""``python3 -m payload health-links``: the links of a node's GPUs, measured by one
process that sees them all, after the per-GPU processes are done (so nothing else
loads the links).

pcie: pinned host-to-device and device-to-host copies of 1 GiB per GPU, one GPU
at a time. pcie_all: the same on every GPU at once (a shared switch or root port
shows up as the sum falling short of the parts). peer: between every ordered pair
of GPUs, whether peer access is possible, the copy bandwidth one way and both
ways at once (the sum of the two directions), and the latency of a 4-byte copy.

torch is imported inside main(). Python 3.8 compatible.
"""

import functools
import os
import time
from typing import Any, Dict, List, Tuple

from payload.health import kernels, protocol
from payload.health.gpu import die_with_parent


def add_arguments(p: Any) -> None:
    p.add_argument("--out", required=True, help="the node's output folder")
    p.add_argument("--labels", required=True,
                   help="comma-separated names of the GPUs, in CUDA device order")
    p.add_argument("--level", choices=protocol.LEVELS, default="standard")
    p.add_argument("--host-avail-bytes", type=int, default=0)
    p.add_argument("--gate", default=None,
                   help="a file: after `import torch`, wait until it says go (or stop)")


def host_available_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


class Links:
    def __init__(self, torch: Any, labels: List[str], plan: Dict[str, Any],
                 w: protocol.EventWriter) -> None:
        self.torch = torch
        self.labels = labels
        self.plan = plan
        self.w = w
        self.n = len(labels)

    def _sync_all(self) -> None:
        for i in range(self.n):
            self.torch.cuda.synchronize(i)

    def phase_pcie(self) -> Dict[str, Any]:
        torch = self.torch
        nb, reps = int(self.plan["pcie_bytes"]), int(self.plan["pcie_reps"])
        values: Dict[str, float] = {}
        for i, label in enumerate(self.labels):
            dev = torch.device("cuda", i)
            h = torch.empty(nb, dtype=torch.uint8, pin_memory=True)
            d = torch.empty(nb, dtype=torch.uint8, device=dev)
            with torch.cuda.device(dev):
                timer = kernels.Timer(dev)
                t_h2d = timer.times(functools.partial(d.copy_, h, non_blocking=True), reps, 2)
                t_d2h = timer.times(functools.partial(h.copy_, d, non_blocking=True), reps, 2)
            values["%s_h2d_gbps" % label] = nb / kernels.median(t_h2d) / 1e9
            values["%s_d2h_gbps" % label] = nb / kernels.median(t_d2h) / 1e9
            self.w.emit(protocol.PROGRESS, "pcie", gpu_label=label,
                        values={"h2d_gbps": values["%s_h2d_gbps" % label],
                                "d2h_gbps": values["%s_d2h_gbps" % label]})
        return {"values": values, "units": {k: "GB/s" for k in values},
                "params": {"bytes": nb, "reps": reps, "memory": "pinned"}}

    def phase_pcie_all(self) -> Dict[str, Any]:
        torch = self.torch
        nb, reps = int(self.plan["pcie_bytes"]), int(self.plan["pcie_reps"])
        hs = [torch.empty(nb, dtype=torch.uint8, pin_memory=True) for _ in range(self.n)]
        ds = [torch.empty(nb, dtype=torch.uint8, device=torch.device("cuda", i))
              for i in range(self.n)]
        streams = [torch.cuda.Stream(device=i) for i in range(self.n)]

        def once(h2d: bool) -> Tuple[float, List[float]]:
            self._sync_all()
            t0 = time.perf_counter()
            evs = []
            for i in range(self.n):
                with torch.cuda.stream(streams[i]):
                    s = torch.cuda.Event(enable_timing=True)
                    e = torch.cuda.Event(enable_timing=True)
                    s.record()
                    if h2d:
                        ds[i].copy_(hs[i], non_blocking=True)
                    else:
                        hs[i].copy_(ds[i], non_blocking=True)
                    e.record()
                    evs.append((s, e))
            self._sync_all()
            return time.perf_counter() - t0, [s.elapsed_time(e) / 1e3 for s, e in evs]

        values: Dict[str, float] = {}
        for name, h2d in (("h2d", True), ("d2h", False)):
            once(h2d)  # warm-up
            walls, per = [], []
            for _ in range(reps):
                wall, each = once(h2d)
                walls.append(wall)
                per.append(each)
            values["sum_%s_gbps" % name] = self.n * nb / kernels.median(walls) / 1e9
            for i, label in enumerate(self.labels):
                values["%s_%s_gbps" % (label, name)] = nb / kernels.median(
                    [p[i] for p in per]) / 1e9
        return {"values": values, "units": {k: "GB/s" for k in values},
                "params": {"bytes": nb, "reps": reps, "gpus": self.n,
                           "sum": "bytes of all GPUs over the wall time of the slowest"}}

    def phase_peer(self) -> Dict[str, Any]:
        torch = self.torch
        n = self.n
        nb, reps = int(self.plan["peer_bytes"]), int(self.plan["peer_reps"])
        lreps = int(self.plan["latency_reps"])
        devs = [torch.device("cuda", i) for i in range(n)]
        src = [torch.empty(nb, dtype=torch.uint8, device=d).random_(0, 255) for d in devs]
        dst = [torch.empty(nb, dtype=torch.uint8, device=d) for d in devs]
        one = [torch.zeros(1, dtype=torch.float32, device=d) for d in devs]
        access = [[i == j or bool(torch.cuda.can_device_access_peer(i, j)) for j in range(n)]
                  for i in range(n)]
        oneway = [[None] * n for _ in range(n)]  # type: List[List[Any]]
        both = [[None] * n for _ in range(n)]  # type: List[List[Any]]
        latency = [[None] * n for _ in range(n)]  # type: List[List[Any]]

        def timed(fn: Any, k: int) -> float:
            fn()
            self._sync_all()
            t0 = time.perf_counter()
            for _ in range(k):
                fn()
            self._sync_all()
            return (time.perf_counter() - t0) / k

        for i in range(n):
            for j in range(n):
                if i == j:
                    continue
                a, b = src[i], dst[j]
                back_a, back_b = src[j], dst[i]
                oneway[i][j] = nb / timed(lambda a=a, b=b: b.copy_(a, non_blocking=True),
                                          reps) / 1e9

                def pair(a: Any = a, b: Any = b, c: Any = back_a, d: Any = back_b) -> None:
                    b.copy_(a, non_blocking=True)
                    d.copy_(c, non_blocking=True)
                both[i][j] = 2 * nb / timed(pair, reps) / 1e9
                x, y = one[i], one[j]
                latency[i][j] = timed(lambda x=x, y=y: y.copy_(x, non_blocking=True),
                                      lreps) * 1e6
                same = bool(torch.equal(dst[j][:4096].cpu(), src[i][:4096].cpu()))
                self.w.emit(protocol.PROGRESS, "peer", src=self.labels[i], dst=self.labels[j],
                            values={"gbps": oneway[i][j], "both_gbps": both[i][j],
                                    "latency_us": latency[i][j]},
                            can_access_peer=access[i][j], copy_equal=same)
        off = [oneway[i][j] for i in range(n) for j in range(n) if i != j]
        values = {"min_gbps": min(off), "max_gbps": max(off),
                  "median_gbps": kernels.median(off),
                  "pairs_without_peer_access": sum(1 for i in range(n) for j in range(n)
                                                   if i != j and not access[i][j])}
        return {"values": values,
                "units": {"min_gbps": "GB/s", "max_gbps": "GB/s", "median_gbps": "GB/s",
                          "pairs_without_peer_access": "count"},
                "matrix": {"labels": self.labels, "can_access_peer": access,
                           "gbps": oneway, "both_gbps": both, "latency_us": latency},
                "params": {"bytes": nb, "reps": reps, "latency_bytes": 4,
                           "latency_reps": lreps, "both": "sum of the two directions"}}


GATE_TIMEOUT_S = 3600.0
GATE_POLL_S = 0.02


def wait_gate(path: str, timeout_s: float) -> bool:
    """Started with the GPU processes, the links process holds here (torch imported, no
    CUDA call made: it takes no GPU memory while the GPUs are measured) until the node
    writes "go" (True) or "stop" (False) into the gate file."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            with open(path) as f:
                said = f.read().strip()
        except OSError:
            said = ""
        if said in ("go", "stop"):
            return said == "go"
        time.sleep(GATE_POLL_S)
    return False


def main(args: Any) -> int:
    die_with_parent()
    os.makedirs(args.out, exist_ok=True)
    w = protocol.EventWriter(os.path.join(args.out, protocol.LINKS_EVENTS))
    labels = [x for x in args.labels.split(",") if x]
    t0 = time.time()
    try:
        import torch
    except Exception as exc:
        w.emit(protocol.ERROR, error="torch is not importable: %s: %s" % (type(exc).__name__,
                                                                          exc))
        w.emit(protocol.BYE, rc=3)
        return 3
    if args.gate and not wait_gate(args.gate, GATE_TIMEOUT_S):
        w.emit(protocol.BYE, rc=0, stopped="told to stop at its gate")
        return 0
    if not torch.cuda.is_available() or torch.cuda.device_count() != len(labels):
        w.emit(protocol.ERROR, error="torch sees %d CUDA devices, expected %d (%s)" % (
            torch.cuda.device_count() if torch.cuda.is_available() else 0, len(labels),
            os.environ.get("CUDA_VISIBLE_DEVICES")))
        w.emit(protocol.BYE, rc=3)
        return 3
    totals = [int(torch.cuda.get_device_properties(i).total_memory) for i in range(len(labels))]
    plan = protocol.plan(args.level, "cuda", min(totals), n_gpus=len(labels),
                         host_avail_bytes=args.host_avail_bytes or host_available_bytes())
    w.emit(protocol.HELLO, pid=os.getpid(), labels=labels, plan=plan,
           names=[torch.cuda.get_device_name(i) for i in range(len(labels))])
    links = Links(torch, labels, plan, w)
    for phase in protocol.LINK_PHASES:
        if phase not in plan["link_phases"]:
            w.emit(protocol.SKIP, phase, reason="not part of level %s" % args.level)
            continue
        if phase in ("pcie_all", "peer") and len(labels) < 2:
            w.emit(protocol.SKIP, phase, reason="one GPU: nothing to measure between GPUs"
                   if phase == "peer" else "one GPU: all at once is the same as alone")
            continue
        w.emit(protocol.START, phase)
        ts = time.time()
        try:
            ev = getattr(links, "phase_" + phase)()
        except Exception as exc:
            w.emit(protocol.ERROR, phase, error="%s: %s" % (type(exc).__name__, str(exc)[:500]),
                   wall_s=round(time.time() - ts, 3))
            torch.cuda.empty_cache()
            continue
        ev["wall_s"] = round(time.time() - ts, 3)
        w.emit(protocol.DONE, phase, **ev)
        torch.cuda.empty_cache()
    w.emit(protocol.BYE, rc=0, wall_s=round(time.time() - t0, 3))
    w.close()
    return 0
