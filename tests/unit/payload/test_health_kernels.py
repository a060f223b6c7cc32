"""The checks of the health step's GPU phases, on CPU tensors: a product's row and
column sums against fp64, repeats bit for bit, the memory test's patterns, and the
precisions a device can run."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from payload.health import kernels  # noqa: E402

CPU = torch.device("cpu")


def _product(prec: str, n: int = 96, seed: int = 7) -> tuple[object, object, object]:
    x, y, fn = kernels.operands(prec, n, CPU, seed)
    return x, y, fn()


@pytest.mark.parametrize("prec", ["bf16", "fp16", "fp32", "fp64"])
def test_a_correct_product_passes_its_checksums(prec: str) -> None:
    x, y, c = _product(prec)
    got = kernels.checksums(x, y, c, prec)
    assert (got["rows_bad"], got["cols_bad"], got["finite"]) == (0, 0, True)
    # the rounding noise is well inside the tolerance, not at its edge
    assert got["worst_ratio"] < 0.5


def _flip_bit(c: object, i: int, j: int, bit: int) -> None:
    """Flip one bit of element (i, j), as a memory or datapath fault would."""
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[c.element_size()]  # type: ignore[attr-defined]
    v = c.view(ints)  # type: ignore[attr-defined]
    v[i, j] ^= 1 << bit


# the top exponent bit: a value below 2 in magnitude becomes enormous
TOP_EXPONENT_BIT = {"bf16": 14, "fp16": 14, "fp32": 30, "fp64": 62}


@pytest.mark.parametrize("prec", ["bf16", "fp16", "fp32", "fp64"])
def test_one_flipped_exponent_bit_is_found_in_its_row_and_column(prec: str) -> None:
    x, y, c = _product(prec)
    small = (c.float().abs() < 1.0).nonzero()
    i, j = (int(v) for v in small[len(small) // 2])
    _flip_bit(c, i, j, TOP_EXPONENT_BIT[prec])
    got = kernels.checksums(x, y, c, prec)
    assert (got["rows_bad"], got["cols_bad"]) == (1, 1)
    assert (got["bad_rows"], got["bad_cols"]) == ([i], [j])


@pytest.mark.parametrize("prec", ["bf16", "fp16", "fp32", "fp64"])
def test_a_sign_flip_of_a_large_element_is_found(prec: str) -> None:
    x, y, c = _product(prec)
    j = int(c[3].float().abs().argmax())
    c[3, j] = -c[3, j]
    got = kernels.checksums(x, y, c, prec)
    assert 3 in got["bad_rows"] and j in got["bad_cols"]


def test_the_last_mantissa_bit_is_below_the_checksums_but_not_the_repeat() -> None:
    """The limit of a sum check: a flip smaller than the rounding noise of a row
    passes it; the bit-for-bit comparison of repeats is what sees it."""
    x, y, c = _product("bf16")
    ref = c.clone()
    _flip_bit(c, 3, 5, 0)
    assert kernels.checksums(x, y, c, "bf16")["rows_bad"] == 0
    assert kernels.mismatches(c, ref) == 1


def test_a_wrong_tile_and_a_nan_are_mismatches() -> None:
    x, y, c = _product("bf16")
    c[8:16, 8:16] += 1000  # a tile holding something else than the product
    got = kernels.checksums(x, y, c, "bf16")
    assert got["rows_bad"] == 8 and got["cols_bad"] == 8
    assert got["bad_rows"] == list(range(8, 16))
    x, y, c = _product("fp32")
    c[0, 0] = float("nan")
    got = kernels.checksums(x, y, c, "fp32")
    assert got["finite"] is False and got["rows_bad"] == 1 and got["cols_bad"] == 1


def test_tolerance_grows_with_the_inner_size_only_where_accumulation_limits() -> None:
    assert kernels.tolerance_unit("bf16", 8192) == kernels.tolerance_unit("bf16", 64) == 2 ** -8
    assert kernels.tolerance_unit("fp32", 8192) == pytest.approx(2 ** -24 * 8192 ** 0.5)
    assert kernels.tolerance_unit("fp8", 8192) == pytest.approx(2 ** -14 * 8192 ** 0.5)
    assert kernels.tolerance_unit("fp8", 16) == 2 ** -8


def test_repeats_are_compared_bit_for_bit() -> None:
    _, _, ref = _product("bf16")
    again = ref.clone()
    assert kernels.mismatches(again, ref) == 0
    _flip_bit(again, 0, 1, 0)  # the last mantissa bit: below any checksum, not below this
    _flip_bit(again, 2, 2, 0)
    assert kernels.mismatches(again, ref) == 2
    assert kernels.mismatches(ref.float(), ref) == ref.numel()


@pytest.mark.parametrize("pattern", kernels.PATTERNS)
def test_every_memory_pattern_reads_back_and_counts_one_bad_word(pattern: str) -> None:
    words = torch.empty(5000, dtype=torch.int32)
    kernels.fill(words, pattern, base=1000, seed=3)
    assert kernels.verify(words, pattern, 1000, 3) == (0, [])
    good = int(words[1234].item())
    words[1234] = good ^ (1 << 17)
    bad, examples = kernels.verify(words, pattern, 1000, 3)
    assert bad == 1
    assert examples == [{"index": 2234, "expected": good, "got": good ^ (1 << 17)}]


def test_patterns_are_what_they_say() -> None:
    w = torch.empty(8, dtype=torch.int32)
    kernels.fill(w, "address", base=2 ** 32 - 2, seed=0)  # wraps at 2^32
    assert w.tolist() == [-2, -1, 0, 1, 2, 3, 4, 5]
    kernels.fill(w, "checker", 0, 0)
    assert {v & 0xFFFFFFFF for v in w.tolist()} == {0x55555555}
    kernels.fill(w, "inverse", 0, 0)
    assert {v & 0xFFFFFFFF for v in w.tolist()} == {0xAAAAAAAA}
    a, b = torch.empty(1000, dtype=torch.int32), torch.empty(1000, dtype=torch.int32)
    kernels.fill(a, "random", 0, seed=1)
    kernels.fill(b, "random", 0, seed=2)
    assert not torch.equal(a, b)  # seeded: another seed, other words
    assert int((a < 0).sum()) > 0  # the top bit is exercised too


def test_a_region_larger_than_one_compare_is_checked_in_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels, "SUBCHUNK_WORDS", 64)
    words = torch.empty(1000, dtype=torch.int32)
    kernels.fill(words, "random", 0, 9)
    words[70] += 1
    words[999] += 1
    bad, examples = kernels.verify(words, "random", 0, 9)
    assert bad == 2 and [e["index"] for e in examples] == [70, 999]


def test_precisions_a_device_cannot_run_say_why() -> None:
    assert kernels.supported("bf16", CPU, None) is None
    assert "no TF32 on CPU" in str(kernels.supported("tf32", CPU, None))
    cuda = torch.device("cuda", 0)
    assert "8.9 or more" in str(kernels.supported("fp8", cuda, (8, 0)))  # A100
    assert kernels.supported("fp8", cuda, (9, 0)) is None  # H100, H200
    assert kernels.supported("fp8", cuda, (8, 9)) is None  # L40S, L4
    assert "8.0 or more" in str(kernels.supported("bf16", cuda, (7, 0)))  # V100
    assert kernels.supported("fp64", cuda, (7, 0)) is None


def test_timer_and_median() -> None:
    t = kernels.Timer(CPU).times(lambda: None, reps=4, warmup=1)
    assert len(t) == 4 and all(x >= 0 for x in t)
    assert kernels.median([3.0, 1.0, 2.0]) == 2.0
    assert kernels.median([4.0, 1.0, 2.0, 3.0]) == 2.5
