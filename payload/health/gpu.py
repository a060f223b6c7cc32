"""``python3 -m payload health-gpu``: the phases of one GPU, in a process of its own
(started by ``payload health``, one per GPU, all at once; CUDA_VISIBLE_DEVICES
names its GPU).

memcopy, memread: device-to-device copy and a read-only sum over buffers of up
to 2 GiB. matmul: a burst per precision the GPU supports, each product checked
(row and column sums against fp64, repeats bit for bit against the first).
sustained: bf16 products for the level's window, the rate each second (the
controller lines it up with the telemetry). memtest: most of the free memory,
every pattern at least once. Each phase ends done, skip (why) or error; an error
in one phase (out of memory, an unsupported kernel) does not stop the others.

torch is imported inside main(). Python 3.8 compatible.
"""

import ctypes
import os
import signal
import sys
import time
import traceback
from typing import Any, Dict, List, Optional, Tuple

from payload.health import kernels, protocol

_PR_SET_PDEATHSIG = 1


def add_arguments(p: Any) -> None:
    p.add_argument("--out", required=True, help="the node's output folder")
    p.add_argument("--label", required=True, help="this GPU's name in file names and events")
    p.add_argument("--level", choices=protocol.LEVELS, default="standard")
    p.add_argument("--device", choices=protocol.DEVICES, default="cuda")
    p.add_argument("--sustain-s", type=float, help="override the level's sustained window")
    p.add_argument("--memtest-s", type=float, help="override the level's memory test time")
    p.add_argument("--seed", type=int, default=1234)


def die_with_parent() -> None:
    """SIGKILL this process when the node entry point dies, however it dies."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _gbps(nbytes: float, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 else float("nan")


class Worker:
    def __init__(self, args: Any, torch: Any, w: protocol.EventWriter) -> None:
        self.args = args
        self.torch = torch
        self.w = w
        self.cuda = args.device == "cuda"
        self.results: Dict[str, Dict[str, Any]] = {}
        self.cc: Optional[Tuple[int, int]] = None

    # ------------------------------------------------------------------ setup
    def open(self) -> bool:
        torch = self.torch
        info: Dict[str, Any] = {"pid": os.getpid(), "torch": torch.__version__,
                                "cuda": getattr(torch.version, "cuda", None),
                                "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}
        if self.cuda:
            if not torch.cuda.is_available() or torch.cuda.device_count() < 1:
                self.w.emit(protocol.ERROR, error="torch sees no CUDA device "
                            "(CUDA_VISIBLE_DEVICES=%s)" % info["visible"], **info)
                return False
            self.dev = torch.device("cuda", 0)
            torch.cuda.set_device(self.dev)
            props = torch.cuda.get_device_properties(self.dev)
            self.cc = (int(props.major), int(props.minor))
            free, total = torch.cuda.mem_get_info(self.dev)
            info.update(name=torch.cuda.get_device_name(self.dev), cc=list(self.cc),
                        total_bytes=int(total), free_bytes=int(free),
                        sms=int(props.multi_processor_count),
                        uuid=str(getattr(props, "uuid", "")) or None,
                        pci="%04x:%02x:%02x" % (getattr(props, "pci_domain_id", 0),
                                                getattr(props, "pci_bus_id", 0),
                                                getattr(props, "pci_device_id", 0)))
            self.total = int(total)
        else:
            self.dev = torch.device("cpu")
            self.cc = None
            info.update(name="cpu", cc=None, total_bytes=None)
            self.total = 0
        self.plan = protocol.plan(self.args.level, self.args.device, self.total)
        if self.args.sustain_s is not None:
            self.plan["sustain_s"] = float(self.args.sustain_s)
        if self.args.memtest_s is not None:
            self.plan["memtest_s"] = float(self.args.memtest_s)
        torch.manual_seed(self.args.seed)
        self.w.emit(protocol.HELLO, plan=self.plan, **info)
        return True

    def free(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize(self.dev)
            self.torch.cuda.empty_cache()

    # ------------------------------------------------------------------ phases
    def run(self) -> int:
        for phase in protocol.GPU_PHASES:
            if phase not in self.plan["phases"]:
                self.w.emit(protocol.SKIP, phase, reason="not part of level %s" % self.args.level)
                continue
            if phase == "sustained" and self.plan["sustain_s"] <= 0:
                self.w.emit(protocol.SKIP, phase, reason="sustained window is 0 s")
                continue
            if phase == "memtest" and self.plan["memtest_s"] <= 0:
                self.w.emit(protocol.SKIP, phase, reason="memory test time is 0 s")
                continue
            self.w.emit(protocol.START, phase)
            t0 = time.time()
            try:
                ev = getattr(self, "phase_" + phase)()
            except Exception as exc:  # one phase failing must not stop the others
                oom = "out of memory" in str(exc).lower()
                self.w.emit(protocol.ERROR, phase, error="%s: %s" % (type(exc).__name__,
                                                                     str(exc)[:500]),
                            kind="oom" if oom else "exception",
                            traceback=traceback.format_exc()[-2000:],
                            wall_s=round(time.time() - t0, 3))
                self.free()
                continue
            ev["wall_s"] = round(time.time() - t0, 3)
            self.results[phase] = self.w.emit(protocol.DONE, phase, **ev)
            self.free()
        return 0

    def phase_memcopy(self) -> Dict[str, Any]:
        torch, p = self.torch, self.plan
        nb = int(p["copy_bytes"])
        timer = kernels.Timer(self.dev)
        a = torch.empty(nb, dtype=torch.uint8, device=self.dev).random_(0, 255)
        b = torch.empty_like(a)
        t = timer.times(lambda: b.copy_(a), int(p["copy_reps"]), int(p["copy_warmup"]))
        same = bool(torch.equal(a, b))
        return {"values": {"copy_gbps": _gbps(2 * nb, kernels.median(t)),
                           "copy_gbps_best": _gbps(2 * nb, min(t))},
                "units": {"copy_gbps": "GB/s", "copy_gbps_best": "GB/s"},
                "check": {"copy_equal": same},
                "params": {"bytes": nb, "reps": p["copy_reps"], "counted": "read + written"},
                "times_s": t}

    def phase_memread(self) -> Dict[str, Any]:
        torch, p = self.torch, self.plan
        nb = int(p["copy_bytes"])
        timer = kernels.Timer(self.dev)
        a = torch.empty(nb, dtype=torch.uint8, device=self.dev).random_(0, 255).view(
            torch.float32)
        t = timer.times(lambda: a.sum(), int(p["copy_reps"]), int(p["copy_warmup"]))
        return {"values": {"read_gbps": _gbps(nb, kernels.median(t)),
                           "read_gbps_best": _gbps(nb, min(t))},
                "units": {"read_gbps": "GB/s", "read_gbps_best": "GB/s"},
                "params": {"bytes": nb, "reps": p["copy_reps"], "counted": "read"},
                "times_s": t}

    def phase_matmul(self) -> Dict[str, Any]:
        p = self.plan
        n = int(p["matmul_n"])
        values: Dict[str, Any] = {}
        units: Dict[str, str] = {}
        checks: Dict[str, Any] = {}
        skipped: Dict[str, str] = {}
        for i, prec in enumerate(p["precisions"]):
            why = kernels.supported(prec, self.dev, self.cc)
            if why:
                skipped[prec] = why
                self.w.emit(protocol.PROGRESS, "matmul", precision=prec, skipped=why)
                continue
            r = self._burst(prec, n, int(p["matmul_reps"][prec]), self.args.seed + i)
            checks[prec] = r.pop("check")
            for k, v in r.items():
                values["%s_%s" % (prec, k)] = v
                units["%s_%s" % (prec, k)] = "TFLOP/s" if k.startswith("tflops") else "count"
            self.w.emit(protocol.PROGRESS, "matmul", precision=prec, values=r,
                        check=checks[prec])
            self.free()
        kernels.set_tf32("none")
        return {"values": values, "units": units, "checks": checks, "skipped": skipped,
                "params": {"n": n, "reps": p["matmul_reps"], "warmup": p["matmul_warmup"],
                           "check_factor": kernels.CHECK_FACTOR}}

    def _burst(self, prec: str, n: int, reps: int, seed: int) -> Dict[str, Any]:
        kernels.set_tf32(prec)
        x, y, fn = kernels.operands(prec, n, self.dev, seed)
        ref = fn()
        timer = kernels.Timer(self.dev)
        timer.sync()
        check = kernels.checksums(x, y, ref, prec)
        bad = [0]

        def after(c: Any) -> None:
            bad[0] += kernels.mismatches(c, ref)

        t = timer.times(fn, reps, int(self.plan["matmul_warmup"]), after=after)
        flop = 2.0 * n ** 3
        return {"tflops": flop / kernels.median(t) / 1e12, "tflops_best": flop / min(t) / 1e12,
                "rows_bad": check["rows_bad"], "cols_bad": check["cols_bad"],
                "repeat_mismatches": bad[0], "check": check}

    def phase_sustained(self) -> Dict[str, Any]:
        p = self.plan
        prec = "bf16" if kernels.supported("bf16", self.dev, self.cc) is None else "fp16"
        n = int(p["matmul_n"])
        kernels.set_tf32(prec)
        x, y, fn = kernels.operands(prec, n, self.dev, self.args.seed)
        ref = fn()
        timer = kernels.Timer(self.dev)
        timer.sync()
        window = float(p["sustain_s"])
        batch = int(p["sustain_batch"])
        flop = 2.0 * n ** 3
        intervals: List[Dict[str, float]] = []
        bad = 0
        done = 0
        t_start = time.time()
        t_int, k_int = t_start, 0
        while True:
            c = None
            for _ in range(batch):
                c = fn()
            timer.sync()
            done += batch
            k_int += batch
            bad += kernels.mismatches(c, ref)
            now = time.time()
            if now - t_int >= 1.0 or now - t_start >= window:
                rate = flop * k_int / (now - t_int) / 1e12
                intervals.append({"t0": round(t_int, 6), "t1": round(now, 6),
                                  "tflops": rate})
                self.w.emit(protocol.PROGRESS, "sustained", values={"tflops": rate},
                            elapsed_s=round(now - t_start, 3))
                t_int, k_int = now, 0
            if now - t_start >= window:
                break
        elapsed = time.time() - t_start
        del x, y, ref, c
        mean = flop * done / elapsed / 1e12
        burst = self.results.get("matmul", {}).get("values", {}).get(prec + "_tflops")
        rates = [iv["tflops"] for iv in intervals]
        values = {"tflops": mean, "first_tflops": rates[0], "last_tflops": rates[-1],
                  "min_tflops": min(rates), "max_tflops": max(rates),
                  "burst_tflops": burst, "ratio_to_burst": mean / burst if burst else None,
                  "repeat_mismatches": bad, "products": done}
        units = {k: "TFLOP/s" for k in values if k.endswith("tflops")}
        units.update(ratio_to_burst="ratio", repeat_mismatches="count", products="count")
        return {"values": values, "units": units, "intervals": intervals,
                "params": {"precision": prec, "n": n, "window_s": window, "batch": batch},
                "window": {"t0": round(t_start, 6), "t1": round(t_start + elapsed, 6)}}

    def phase_memtest(self) -> Dict[str, Any]:
        torch, p = self.torch, self.plan
        self.free()
        chunk_words = (1 << 30) // 4
        if p.get("memtest_bytes"):
            target = int(p["memtest_bytes"])
            free = total = None
        else:
            free, total = torch.cuda.mem_get_info(self.dev)
            reserve = 512 * protocol.MIB + 16 * kernels.SUBCHUNK_WORDS  # temporaries
            target = max(0, int(free * float(p["memtest_fraction"])) - reserve)
        chunks: List[Any] = []
        words = target // 4
        alloc_error: Optional[str] = None
        while words > 0:
            n = min(chunk_words, words)
            try:
                chunks.append(torch.empty(n, dtype=torch.int32, device=self.dev))
            except RuntimeError as exc:  # what the allocator could not give is not tested
                alloc_error = str(exc)[:300]
                break
            words -= n
        tested = sum(int(c.numel()) * 4 for c in chunks)
        per_pattern = {pat: 0 for pat in kernels.PATTERNS}
        examples: List[Dict[str, Any]] = []
        passes = 0
        t0 = time.time()
        timer = kernels.Timer(self.dev)
        while True:
            seed = int(p["memtest_seed"]) + passes
            for pat in kernels.PATTERNS:
                ts = time.time()
                base = 0
                for c in chunks:
                    kernels.fill(c, pat, base, seed)
                    base += int(c.numel())
                timer.sync()
                base = 0
                bad = 0
                for c in chunks:
                    k, ex = kernels.verify(c, pat, base, seed)
                    bad += k
                    for e in ex[:max(0, 8 - len(examples))]:
                        examples.append(dict(e, pattern=pat, passno=passes))
                    base += int(c.numel())
                per_pattern[pat] += bad
                self.w.emit(protocol.PROGRESS, "memtest", pattern=pat, passno=passes,
                            values={"mismatches": bad}, seconds=round(time.time() - ts, 3))
            passes += 1
            if time.time() - t0 >= float(p["memtest_s"]):
                break
        del chunks
        values: Dict[str, Any] = {"mismatches": sum(per_pattern.values()), "passes": passes,
                                  "bytes_tested": tested}
        values.update({"%s_mismatches" % k: v for k, v in per_pattern.items()})
        if free:
            values["fraction_of_free"] = tested / float(free)
        units = {k: "count" for k in values}
        units.update(bytes_tested="B", fraction_of_free="ratio")
        out = {"values": values, "units": units, "examples": examples,
               "params": {"patterns": list(kernels.PATTERNS), "seed": p["memtest_seed"],
                          "budget_s": p["memtest_s"], "free_bytes": free,
                          "total_bytes": total, "word_bytes": 4}}
        if alloc_error:
            out["alloc_error"] = alloc_error
        return out


def main(args: Any) -> int:
    die_with_parent()
    os.makedirs(args.out, exist_ok=True)
    w = protocol.EventWriter(os.path.join(args.out, protocol.gpu_events(args.label)),
                             gpu=args.label)
    t0 = time.time()
    try:
        import torch
    except Exception as exc:  # a node without torch: the GPU phases cannot run
        w.emit(protocol.ERROR, error="torch is not importable: %s: %s" % (
            type(exc).__name__, exc), pid=os.getpid(), python=sys.version.split()[0])
        w.emit(protocol.BYE, rc=3, wall_s=round(time.time() - t0, 3))
        return 3
    worker = Worker(args, torch, w)
    if not worker.open():
        w.emit(protocol.BYE, rc=3, wall_s=round(time.time() - t0, 3))
        return 3
    rc = worker.run()
    w.emit(protocol.BYE, rc=rc, wall_s=round(time.time() - t0, 3))
    w.close()
    return rc
