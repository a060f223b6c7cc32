"""The measurements of one GPU, as plain torch: a timer, memory bandwidth, matrix
products per precision with their checks, and the memory test's patterns.

Every function takes the device and works on CPU too (the tests run them there at
small sizes). torch is imported inside the functions: importing this module
needs only the standard library.

Python 3.8 compatible.
"""

import math
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

# unit roundoff of what limits each product's accuracy: the output format for bf16,
# fp16 and fp8 (bf16 out), the inputs' tf32 rounding, the accumulation for fp32/fp64
# (scaled by sqrt(k) in tolerance())
UNIT_ROUNDOFF = {"bf16": 2.0 ** -8, "fp16": 2.0 ** -11, "tf32": 2.0 ** -11,
                 "fp32": 2.0 ** -24, "fp64": 2.0 ** -53, "fp8": 2.0 ** -8}
# FP8 tensor cores accumulate with about 14 bits on Hopper: that error grows with k
FP8_ACCUMULATE = 2.0 ** -14
# how many times the expected rounding noise a checksum may differ before it counts
CHECK_FACTOR = 16.0

# memory test patterns (32-bit words): fixed ones, the word's own index, a seeded stream
PATTERNS = ("zeros", "ones", "checker", "inverse", "address", "random")
_FIXED = {"zeros": 0, "ones": -1, "checker": 0x55555555, "inverse": -0x55555556}
SUBCHUNK_WORDS = 32 << 20  # words compared per kernel: bounds the temporaries


class Timer:
    """Seconds per call of ``fn``: CUDA events around each call on a GPU, the
    wall clock on CPU; ``warmup`` calls first, untimed."""

    def __init__(self, device: Any) -> None:
        import torch

        self.torch = torch
        self.device = device
        self.cuda = getattr(device, "type", str(device)) == "cuda"

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize(self.device)

    def times(self, fn: Callable[[], Any], reps: int, warmup: int = 1,
              after: Optional[Callable[[Any], None]] = None) -> List[float]:
        """``after`` sees each timed call's result, outside the timed span."""
        for _ in range(warmup):
            fn()
        self.sync()
        out = []
        for _ in range(reps):
            if self.cuda:
                s = self.torch.cuda.Event(enable_timing=True)
                e = self.torch.cuda.Event(enable_timing=True)
                s.record()
                res = fn()
                e.record()
                e.synchronize()
                out.append(s.elapsed_time(e) / 1e3)
            else:
                t0 = time.perf_counter()
                res = fn()
                out.append(time.perf_counter() - t0)
            if after is not None:
                after(res)
        return out


def median(values: List[float]) -> float:
    s = sorted(values)
    n = len(s)
    if not n:
        return float("nan")
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


# --------------------------------------------------------------------------- matrices


def supported(precision: str, device: Any, cc: Optional[Tuple[int, int]]) -> Optional[str]:
    """None when the precision can run here, else why not."""
    import torch

    cpu = getattr(device, "type", str(device)) != "cuda"
    if precision == "tf32" and cpu:
        return "TF32 is a tensor-core format: no TF32 on CPU"
    if precision == "fp8":
        if cpu:
            return "FP8 products need a GPU with compute capability 8.9 or more"
        if cc is None or tuple(cc) < (8, 9):
            return "compute capability %s: FP8 needs 8.9 or more" % (
                "%d.%d" % tuple(cc) if cc else "unknown")
        if not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "_scaled_mm"):
            return "torch %s has no float8_e4m3fn/_scaled_mm" % torch.__version__
    if precision == "bf16" and not cpu and cc is not None and tuple(cc) < (8, 0):
        return "compute capability %d.%d: BF16 tensor cores need 8.0 or more" % tuple(cc)
    return None


def operands(precision: str, n: int, device: Any, seed: int) -> Tuple[Any, Any, Callable[[], Any]]:
    """(A, B as the product sees them, the call that computes A @ B)."""
    import torch

    g = torch.Generator(device=device)
    g.manual_seed(seed)
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32,
          "fp32": torch.float32, "fp64": torch.float64}
    if precision == "fp8":
        x = torch.randn(n, n, device=device, generator=g).to(torch.float8_e4m3fn)
        # _scaled_mm wants its second operand column-major
        y = torch.randn(n, n, device=device, generator=g).to(torch.float8_e4m3fn).t()
        one = torch.tensor(1.0, device=device)

        def fp8() -> Any:
            return torch._scaled_mm(x, y, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        return x, y, fp8
    x = torch.randn(n, n, device=device, dtype=dt[precision], generator=g)
    y = torch.randn(n, n, device=device, dtype=dt[precision], generator=g)
    return x, y, lambda: torch.matmul(x, y)


def set_tf32(precision: str) -> None:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"


def tolerance_unit(precision: str, k: int) -> float:
    """The relative rounding noise expected in a product with inner size ``k``."""
    u = UNIT_ROUNDOFF[precision]
    if precision in ("fp32", "fp64"):
        return u * math.sqrt(k)
    if precision == "fp8":
        return max(u, FP8_ACCUMULATE * math.sqrt(k))
    return u


def checksums(a: Any, b: Any, c: Any, precision: str) -> Dict[str, Any]:
    """Row and column sums of C = A @ B against (A 1) and (1^T B) products computed in
    fp64 from the same inputs: a row or column whose sum is off by more than
    CHECK_FACTOR times its expected rounding noise counts as a mismatch.

    The noise of a row's sum is about the unit roundoff times the row's norm, so
    the check catches corrupted tiles and high-bit flips; a flip in the last bits of
    one element is below it (the repeat comparison catches that).
    """
    import torch

    f64 = torch.float64
    norm = torch.linalg.vector_norm
    k = a.shape[1]
    u = tolerance_unit(precision, k) * CHECK_FACTOR
    a64 = a.to(f64)
    b64 = b.to(f64)
    row_ref = a64 @ b64.sum(1)
    col_ref = a64.sum(0) @ b64
    # what a row's norm should be for these inputs: a corrupted element must not widen
    # its own row's tolerance (an overflowed one would make it infinite)
    row_est = norm(a64, dim=1) * norm(b64) / math.sqrt(k)
    col_est = norm(a64) * norm(b64, dim=0) / math.sqrt(k)
    del a64, b64
    row_got = c.sum(1, dtype=f64)
    col_got = c.sum(0, dtype=f64)
    row_tol = torch.minimum(norm(c, dim=1, dtype=f64), 4 * row_est) * u
    col_tol = torch.minimum(norm(c, dim=0, dtype=f64), 4 * col_est) * u
    tiny = torch.finfo(f64).tiny
    row_ratio = (row_got - row_ref).abs() / row_tol.clamp_min(tiny)
    col_ratio = (col_got - col_ref).abs() / col_tol.clamp_min(tiny)
    finite = bool(torch.isfinite(c).all().item())
    rows_bad = int((~(row_ratio <= 1.0)).sum().item())  # NaN counts as bad
    cols_bad = int((~(col_ratio <= 1.0)).sum().item())
    worst = max(float(torch.nan_to_num(row_ratio, nan=float("inf")).max().item()),
                float(torch.nan_to_num(col_ratio, nan=float("inf")).max().item()))
    out: Dict[str, Any] = {"rows_bad": rows_bad, "cols_bad": cols_bad, "worst_ratio": worst,
                           "finite": finite, "tolerance_unit": u}
    if rows_bad or cols_bad:
        out["bad_rows"] = [int(i) for i in torch.nonzero(~(row_ratio <= 1.0)).flatten()[:8]]
        out["bad_cols"] = [int(i) for i in torch.nonzero(~(col_ratio <= 1.0)).flatten()[:8]]
    return out


def mismatches(c: Any, ref: Any) -> int:
    """Elements of a repeated product that differ from the first one, bit for bit
    (cuBLAS gives the same bits for the same call on one stream)."""
    import torch

    if c.dtype != ref.dtype or c.shape != ref.shape:
        return int(ref.numel())
    if c.element_size() == 2:
        return int((c.view(torch.int16) != ref.view(torch.int16)).sum().item())
    if c.element_size() == 4:
        return int((c.view(torch.int32) != ref.view(torch.int32)).sum().item())
    return int((c.view(torch.int64) != ref.view(torch.int64)).sum().item())


# --------------------------------------------------------------------------- memory test


def _words(t: Any) -> int:
    return int(t.numel())


def fill(view: Any, pattern: str, base: int, seed: int) -> None:
    """Write ``pattern`` into a 1-D int32 tensor; ``base`` is its first word's index in
    the whole tested region (the address pattern and the random stream use it)."""
    n = _words(view)
    for off in range(0, n, SUBCHUNK_WORDS):
        part = view[off:off + SUBCHUNK_WORDS]
        if pattern in _FIXED:
            part.fill_(_FIXED[pattern])
        else:
            part.copy_(expected(pattern, base + off, _words(part), seed, part.device))


def expected(pattern: str, base: int, n: int, seed: int, device: Any) -> Any:
    """The words ``pattern`` puts at indices [base, base + n)."""
    import torch

    if pattern in _FIXED:
        return torch.full((n,), _FIXED[pattern], dtype=torch.int32, device=device)
    if pattern == "address":
        idx = torch.arange(base, base + n, dtype=torch.int64, device=device)
        # the index modulo 2^32, as a signed 32-bit word
        return ((idx + 2 ** 31) % 2 ** 32 - 2 ** 31).to(torch.int32)
    if pattern == "random":
        g = torch.Generator(device=device)
        g.manual_seed((seed * 1000003 + base) % (2 ** 63))
        return torch.randint(-2 ** 31, 2 ** 31, (n,), dtype=torch.int32, device=device,
                             generator=g)
    raise ValueError("unknown memory test pattern %r" % pattern)


def verify(view: Any, pattern: str, base: int, seed: int) -> Tuple[int, List[Dict[str, int]]]:
    """(words that differ from what ``fill`` wrote, up to 8 examples: index, expected, got).

    The counts stay on the device until the end (one synchronisation per call); only
    a region with mismatches is looked at again for its examples.
    """
    import torch

    n = _words(view)
    counts = []
    for off in range(0, n, SUBCHUNK_WORDS):
        part = view[off:off + SUBCHUNK_WORDS]
        if pattern in _FIXED:
            counts.append((part != _FIXED[pattern]).sum())
        else:
            counts.append((part != expected(pattern, base + off, _words(part), seed,
                                            part.device)).sum())
    if not counts:
        return 0, []
    per = [int(x) for x in torch.stack(counts).cpu().tolist()]
    examples: List[Dict[str, int]] = []
    for k, bad in enumerate(per):
        if not bad or len(examples) >= 8:
            continue
        off = k * SUBCHUNK_WORDS
        part = view[off:off + SUBCHUNK_WORDS]
        want = expected(pattern, base + off, _words(part), seed, part.device)
        for i in torch.nonzero(part != want).flatten()[:8 - len(examples)].tolist():
            examples.append({"index": base + off + int(i), "expected": int(want[i].item()),
                             "got": int(part[i].item())})
    return sum(per), examples
