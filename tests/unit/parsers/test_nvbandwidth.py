"""nvbandwidth v0.6 to v0.10: matrices, SUM, variation, waived tests, an elided
preamble, and a run that asserted on a corrupted copy."""

from __future__ import annotations

import pytest

from orchestrator.errors import ParseError
from orchestrator.parsers import get, parse
from orchestrator.parsers.nvbandwidth import parse_nvbandwidth


def test_registered() -> None:
    assert get("nvbandwidth").func is parse_nvbandwidth


def test_v0_10_without_preamble(public) -> None:
    facts = parse("nvbandwidth", public("nvbandwidth_v0.10_2gpu_aznhc.txt"))
    assert facts.version is None and [t.name for t in facts.tests] == [
        "host_to_device_memcpy_ce", "device_to_host_memcpy_ce", "device_to_device_memcpy_read_ce"]
    h2d = facts.test("host_to_device_memcpy_ce")
    assert h2d is not None and (h2d.sum, h2d.cv, h2d.unit, h2d.columns) == (51.97, 0.01, "GB/s",
                                                                             [0, 1])
    assert h2d.rows == {0: [26.03, 25.94]} and h2d.complete
    d2d = facts.test("device_to_device_memcpy_read_ce")
    assert d2d is not None and d2d.value(0, 0) is None and d2d.value(1, 0) == 276.19
    assert d2d.title == "memcpy CE GPU(row) <- GPU(column)"


def test_v0_6_on_gh200_with_waived_tests_and_a_latency(public) -> None:
    facts = parse_nvbandwidth(public("nvbandwidth_v0.6_gh200_superbench.txt"))
    assert (facts.version, facts.driver, facts.cuda_runtime) == ("v0.6", "550.54.15", "12040")
    assert [(d.index, d.name, d.bus_id) for d in facts.devices] == [
        (0, "NVIDIA GH200 480GB", "00000009:01:00")]
    assert facts.waived == 17 and len(facts.tests) == 15
    lat = facts.test("host_device_latency_sm")
    assert lat is not None and lat.unit == "ns" and lat.sum == 772.58


def test_an_elided_preamble_and_a_six_gpu_matrix(public) -> None:
    facts = parse_nvbandwidth(public("nvbandwidth_v0.8_6x-a6000-read-ce_nvbw50.txt"))
    assert facts.elided is True
    (t,) = facts.tests
    assert t.name == "device_to_device_memcpy_read_ce" and t.sum == 715.53
    assert len(t.rows) == 6 and t.value(0, 3) == 21.95 and t.value(5, 5) is None


def test_a_single_host_copy(public) -> None:
    facts = parse_nvbandwidth(public("nvbandwidth_v0.8_a100-h2d-sm_nvbw42.txt"))
    (t,) = facts.tests
    assert (t.name, t.value(0, 0), t.complete) == ("host_to_device_memcpy_sm", 25.13, True)
    assert facts.devices[0].name == "NVIDIA A100-SXM4-40GB"


def test_a_copy_that_failed_its_pattern_check(public) -> None:
    facts = parse_nvbandwidth(public("nvbandwidth_v0.7_8x-a100-pattern-assert_nvbw34.txt"))
    (t,) = facts.tests
    assert t.name == "device_to_device_memcpy_read_ce" and not t.complete and t.sum is None
    assert t.errors[0] == "Invalid value when checking the pattern at 0x70a640000000"
    assert t.errors[-1].startswith("ASSERT in expression h_errorFlag == 0")
    assert len(facts.devices) == 8 and facts.errors == t.errors


def test_lines_out_of_shape(public) -> None:
    text = public("nvbandwidth_v0.10_2gpu_aznhc.txt")
    with pytest.raises(ParseError) as exc:
        parse_nvbandwidth(text.replace("0     26.03     25.94", "0     26.03"))
    assert exc.value.line_no == 4
    with pytest.raises(ParseError) as exc:
        parse_nvbandwidth(text.replace("SUM host_to_device_memcpy_ce 51.97",
                                       "SUM device_to_host_memcpy_ce 51.97"))
    assert exc.value.line_no == 6
    with pytest.raises(ParseError):
        parse_nvbandwidth("hello\n")


def _error(text: str) -> tuple[object, ...]:
    with pytest.raises(ParseError) as exc:
        parse_nvbandwidth(text, source="raw/nvbandwidth.txt")
    e = exc.value
    return e.kind, e.what, e.line_no, e.line, e.source


def _what(line_no: int | None, what: str, line: str | None = None) -> str:
    at = "raw/nvbandwidth.txt" + ("" if line_no is None else f":{line_no}")
    return f"cannot parse nvbandwidth output at {at}: {what}" + (
        "" if line is None else f"\n  line: {line.rstrip()!r}")


def test_a_single_host_copy_whole(public) -> None:
    facts = parse_nvbandwidth(public("nvbandwidth_v0.8_a100-h2d-sm_nvbw42.txt"))
    assert facts.model_dump() == {
        "version": "v0.8", "cuda_runtime": "12060", "cuda_driver": "12060",
        "driver": "560.35.05",
        "devices": [{"index": 0, "name": "NVIDIA A100-SXM4-40GB", "bus_id": "00000000:99:00",
                     "rank": None, "host": None}],
        "tests": [{"name": "host_to_device_memcpy_sm",
                   "title": "memcpy SM CPU(row) -> GPU(column)", "unit": "GB/s",
                   "columns": [0], "rows": {0: [25.13]}, "sum": 25.13, "cv": None,
                   "errors": [], "line_no": 10}],
        "waived": 0, "errors": [], "elided": False, "mpi": None}


def test_variation_goes_to_the_test_it_names(public) -> None:
    facts = parse_nvbandwidth(public("nvbandwidth_v0.10_2gpu_aznhc.txt"))
    assert [(t.name, t.sum, t.cv, t.line_no) for t in facts.tests] == [
        ("host_to_device_memcpy_ce", 51.97, 0.01, 1),
        ("device_to_host_memcpy_ce", 51.97, 0.02, 11),
        ("device_to_device_memcpy_read_ce", 552.26, 0.01, 19)]
    d2d = facts.tests[2]
    assert d2d.rows == {0: [None, 276.07], 1: [276.19, None]}
    assert (d2d.value(0, 1), d2d.value(2, 0), d2d.value(0, 2)) == (276.07, None, None)
    assert facts.test("host_to_device_memcpy_sm") is None
    text = public("nvbandwidth_v0.10_2gpu_aznhc.txt") + (
        "Running host_to_device_memcpy_ce.\nmemcpy CE CPU(row) -> GPU(column) bandwidth (GB/s)\n"
        "          0         1\n0     26.00     25.00\nSUM host_to_device_memcpy_ce 51.00\n"
        "COEFFICIENT_OF_VARIATION host_to_device_memcpy_ce 0.03\n")
    again = parse_nvbandwidth(text)
    assert [t.cv for t in again.tests if t.name == "host_to_device_memcpy_ce"] == [0.01, 0.03]


def test_two_matrices_with_their_running_lines_elided() -> None:
    text = ("...\nDriver Version:550.54.15  \nmemcpy CE GPU(row) -> GPU(column) bandwidth (GB/s)\n"
            "   0     1\n 0   N/A  20.5\n 1  20.25  N/A\nSUM device_to_device_memcpy_write_ce 40.75\n"
            "memcpy CE GPU(row) <- GPU(column) bandwidth (GB/s)\n   0     1\n 0   N/A  21\n"
            "Waived: device_local_copy\nWaived: host_to_device_memcpy_sm\n")
    facts = parse_nvbandwidth(text)
    assert (facts.elided, facts.driver, facts.version, facts.waived) == (
        True, "550.54.15", None, 2)
    write, read = facts.tests
    assert (write.name, write.line_no, write.complete, write.rows) == (
        "device_to_device_memcpy_write_ce", 3, True, {0: [None, 20.5], 1: [20.25, None]})
    assert (read.name, read.title, read.line_no, read.sum, read.complete, read.rows) == (
        None, "memcpy CE GPU(row) <- GPU(column)", 8, None, False, {0: [None, 21.0]})


def test_rows_of_whole_numbers_are_rows_not_columns() -> None:
    text = ("Running device_to_device_memcpy_write_ce.\n"
            "memcpy CE GPU(row) -> GPU(column) bandwidth (GB/s)\n   0   1\n 0   0  26\n 1  25   0\n"
            "SUM device_to_device_memcpy_write_ce 51\n")
    (t,) = parse_nvbandwidth(text).tests
    assert (t.columns, t.rows, t.sum) == ([0, 1], {0: [0.0, 26.0], 1: [25.0, 0.0]}, 51.0)


def test_a_latency_matrix_and_an_error_outside_any_test() -> None:
    text = ("nvbandwidth Version: v0.7\nCUDA_ERROR_NO_DEVICE: no CUDA-capable device\n"
            "Running host_device_latency_sm.\nmemory latency SM CPU(row) <-> GPU(column) (ns)\n"
            "   0\n 0   772.58\nSUM host_device_latency_sm 772.58\n")
    facts = parse_nvbandwidth(text)
    assert facts.errors == ["CUDA_ERROR_NO_DEVICE: no CUDA-capable device"]
    (lat,) = facts.tests
    assert (lat.title, lat.unit, lat.errors, lat.complete) == (
        "memory latency SM CPU(row) <-> GPU(column)", "ns", [], True)
    assert parse_nvbandwidth("nvbandwidth Version: v0.7\n").tests == []


def test_every_error_names_the_kind_the_file_and_the_line(public) -> None:
    one = ("Running host_to_device_memcpy_ce.\n"
           "memcpy CE CPU(row) -> GPU(column) bandwidth (GB/s)\n          0         1\n")
    cases = [
        (one + "0     26.03  \n", 4, "1 values, the matrix has 2 columns", "0     26.03  "),
        (one + "0 1 2\nSUM device_to_host_memcpy_ce 51.97\n", 5,
         "SUM for 'device_to_host_memcpy_ce' outside its test",
         "SUM device_to_host_memcpy_ce 51.97"),
        ("nvbandwidth Version: v0.7\nSUM host_to_device_memcpy_ce 51.97\n", 2,
         "SUM for 'host_to_device_memcpy_ce' outside its test",
         "SUM host_to_device_memcpy_ce 51.97"),
        (one + "0 1 2\nCOEFFICIENT_OF_VARIATION device_to_host_memcpy_ce 0.01\n", 5,
         "a coefficient of variation for a test not run",
         "COEFFICIENT_OF_VARIATION device_to_host_memcpy_ce 0.01"),
        # a line of numbers before any title, a line of words where the columns should be,
        # a line of words after a matrix
        ("Running host_to_device_memcpy_ce.\n0 1\n", 2,
         "not an nvbandwidth line (preamble, test, matrix, SUM)", "0 1"),
        (one.rsplit("\n", 2)[0] + "\nhello\n", 3,
         "not an nvbandwidth line (preamble, test, matrix, SUM)", "hello"),
        (one + "0 1 2\n  hello\n", 5,
         "not an nvbandwidth line (preamble, test, matrix, SUM)", "  hello"),
        ("nvbandwidth Version: v0.7\n  hello  \n", 2,
         "not an nvbandwidth line (preamble, test, matrix, SUM)", "  hello  "),
        ("nvbandwidth Version: v0.7\n0 1 2\n", 2,
         "not an nvbandwidth line (preamble, test, matrix, SUM)", "0 1 2"),
    ]
    for text, line_no, what, line in cases:
        assert _error(text) == ("nvbandwidth", _what(line_no, what, line), line_no, line,
                                "raw/nvbandwidth.txt"), what
    assert _error("\n \n") == ("nvbandwidth", _what(None, "empty output"), None, None,
                               "raw/nvbandwidth.txt")
    assert _error("Driver Version: 550\n") == (
        "nvbandwidth",
        _what(None, "no `nvbandwidth Version` and no test: not nvbandwidth's output"), None, None,
        "raw/nvbandwidth.txt")


def test_a_test_with_its_sum_and_an_error_is_not_complete() -> None:
    text = ("Running host_to_device_memcpy_ce.\nmemcpy CE CPU(row) -> GPU(column) bandwidth (GB/s)\n"
            "   0\n 0   25.13\nCUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access\n"
            "SUM host_to_device_memcpy_ce 25.13\n")
    (t,) = parse_nvbandwidth(text).tests
    assert (t.sum, t.errors, t.complete) == (
        25.13, ["CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access"], False)
