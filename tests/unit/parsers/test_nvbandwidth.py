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
