"""What the nccl-tests text and JSON parsers share: version codes, print rounding, the average."""

from __future__ import annotations

import pytest

from orchestrator.parsers._nccl_common import (
    NcclResult,
    NcclRow,
    NcclTestsRun,
    busbw_rounding,
    check_avg,
    decode_version_code,
    recompute_avg,
)


@pytest.mark.parametrize(("code", "version"), [
    (2804, "2.8.4"),  # NCCL 2.8.4, the last of the old encoding (major*1000 + minor*100 + patch)
    (2708, "2.7.8"),
    (2700, "2.7.0"),
    (2000, "2.0.0"),
    (9999, "9.9.99"),  # the largest old code
    (10000, "1.0.0"),  # the smallest new one (major*10000 + minor*100 + patch)
    (20000, "2.0.0"),
    (20903, "2.9.3"),
    (21801, "2.18.1"),
    (22703, "2.27.3"),
    (22809, "2.28.9"),
])
def test_version_codes_of_both_encodings(code: int, version: str) -> None:
    assert decode_version_code(code) == version


def _res(busbw: float, text: str | None) -> NcclResult:
    return NcclResult(time_us=1.0, algbw_gbs=busbw, busbw_gbs=busbw, wrong=0, busbw_text=text)


def _row(out: NcclResult, inp: NcclResult) -> NcclRow:
    return NcclRow(line_no=1, size_bytes=8, count=2, type="float", redop="sum", root=None,
                   out_of_place=out, in_place=inp)


@pytest.mark.parametrize(("out", "inp", "rounding"), [
    (_res(100.0, None), _res(100.0, None), 0.0),  # JSON: full precision
    (_res(285.63, "285.63"), _res(150.0, "1.5e+02"), (0.005 + 7.5) / 2),
    (_res(285.63, "285.63"), _res(150.0, "1.5E+02"), (0.005 + 7.5) / 2),
    (_res(-150.0, "-1.5e+02"), _res(100.0, None), 7.5 / 2),
    (_res(285.0, "285"), _res(285.63, "285.63"), (0.5 + 0.005) / 2),
    (_res(285.6, "285.6"), _res(285.0, "285"), (0.05 + 0.5) / 2),
    (_res(0.0, "0.00"), _res(0.0, "0.000"), (0.005 + 0.0005) / 2),
])
def test_busbw_rounding_is_half_the_last_printed_digit_averaged_over_both_halves(
        out: NcclResult, inp: NcclResult, rounding: float) -> None:
    assert busbw_rounding(_row(out, inp)) == pytest.approx(rounding, rel=1e-12, abs=1e-15)


def _run(rows: list[NcclRow], reported: float | None) -> NcclTestsRun:
    return NcclTestsRun(
        format="text", binary=None, op=None, tests_version=None, tests_git_hash=None,
        nccl_version=None, nccl_cuda=None, nccl_headers=None, params={}, header_notes=[],
        time_kind="time", ranks=[], rows=rows, out_of_bounds=None, avg_busbw_reported=reported,
        avg_busbw_check=None, avg_busbw_recomputed=recompute_avg(rows), avg_busbw_agrees=None,
        failures=[], truncated=False)


def test_the_average_agrees_exactly_at_the_tolerance_and_not_one_step_past() -> None:
    # full-precision rows (no rounding) and a reported 0, so the limit is exactly `tol`
    on = _run([_row(_res(0.25, None), _res(0.25, None))], 0.0)
    assert on.avg_busbw_recomputed == 0.25
    assert check_avg(on, tol=0.25) is True
    assert check_avg(on, tol=0.2499999) is False
    assert check_avg(_run([_row(_res(0.25, None), _res(0.25, None))], 0.0)) is False


def test_the_rows_print_rounding_widens_what_agrees() -> None:
    # each busbw printed as an integer: half a unit either way, so 0.75 off still agrees
    run = _run([_row(_res(0.75, "1"), _res(0.75, "1"))], 0.0)
    assert check_avg(run, tol=0.25) is True
    assert check_avg(run, tol=0.2499) is False


def test_the_reported_average_s_own_six_digits_widen_it_too() -> None:
    run = _run([_row(_res(100000.0, None), _res(100000.0, None))], 100000.5)
    assert check_avg(run, tol=0.0) is True  # 100000.5 x 5e-6 = 0.5000025
    assert check_avg(run, tol=-0.0001) is False
    assert check_avg(_run([], 1.0)) is None
    assert check_avg(_run([_row(_res(1.0, None), _res(1.0, None))], None)) is None
