"""Exact-value pins of the nvidia-smi -q text parse function (its top level).

Each test starts from a published capture (tests/fixtures/public) and edits one
thing, then asserts the top-level record or the exact error.
"""
from __future__ import annotations

import pytest

from orchestrator.errors import ParseError
from orchestrator.parsers.nvidia_smi_q import parse_nvidia_smi_q
from tests.unit.parsers.refusal import is_refusal, refused

I0 = "nvidia-smi-q-i0_a100-sxm4-40gb_r535.txt"
KIND = "nvidia-smi-q"


def _err(text: str) -> ParseError:
    return refused(parse_nvidia_smi_q, text)


def _is(e: ParseError, what: str, line_no: int | None, line: str | None) -> None:
    is_refusal(e, KIND, what, line_no, line)


def test_q_top_level_of_an_i0_run(public) -> None:
    facts = parse_nvidia_smi_q(public(I0))
    assert (facts.timestamp, facts.driver_version, facts.cuda_version) == (
        "Thu Jan  4 14:45:46 2024", "535.129.03", "12.2")
    assert (facts.attached_gpus, len(facts.gpus), facts.elided_gpus) == (8, 1, 7)
    assert (facts.ignored_lines, facts.edits) == ([], [])


@pytest.mark.parametrize("attached,elided", [("1", None), ("2", 1), ("0", None)])
def test_q_elided_gpus_on_the_limit(public, attached: str, elided: int | None) -> None:
    text = public(I0).replace(": 8\n", f": {attached}\n", 1)
    facts = parse_nvidia_smi_q(text)
    assert (facts.attached_gpus, facts.elided_gpus) == (int(attached), elided)


def test_q_top_level_na_and_absent_values(public) -> None:
    text = public(I0).replace(": 12.2\n", ": N/A\n", 1)
    text = text.replace("Timestamp                                 : Thu Jan  4 14:45:46 2024\n",
                        "")
    facts = parse_nvidia_smi_q(text)
    assert (facts.timestamp, facts.driver_version, facts.cuda_version) == (None, "535.129.03",
                                                                            None)


def test_q_without_attached_gpus(public) -> None:
    text = public(I0).replace("Attached GPUs                             : 8\n", "")
    facts = parse_nvidia_smi_q(text)
    assert (facts.attached_gpus, facts.elided_gpus, len(facts.gpus)) == (None, None, 1)


def test_q_noise_is_passed_on(public) -> None:
    text = "$ nvidia-smi -q -i 0\n" + public(I0).replace("Attached GPUs", "[...]\nAttached GPUs",
                                                          1)
    facts = parse_nvidia_smi_q(text)
    assert [(i.line_no, i.kind) for i in facts.ignored_lines][-1][0] == 9
    assert len(facts.ignored_lines) == 2
    assert [e.line_no for e in facts.edits] == [9]


def test_q_top_level_only_is_read() -> None:
    facts = parse_nvidia_smi_q("Driver Version : 535.129.03\nAttached GPUs : 2\n")
    assert facts.model_dump() == {
        "timestamp": None, "driver_version": "535.129.03", "cuda_version": None,
        "attached_gpus": 2, "gpus": [], "elided_gpus": 2, "ignored_lines": [], "edits": []}


def test_q_errors(public) -> None:
    _is(_err(" \n\n"), "empty output", None, None)
    _is(_err(""), "empty output", None, None)
    _is(_err("\n==============NVSMI LOG==============\n\n"), "no `Key : value` line", None, None)
    for value in ("eight", "", "-1", "8.0"):
        line = f"Attached GPUs                             : {value}"
        text = public(I0).replace("Attached GPUs                             : 8", line)
        _is(_err(text), "Attached GPUs is not a count", 8, line)
    _is(_err("\nProduct Name : H200\nDriver Version : 1\n"),
        "no GPU section and no known top-level key", 2, None)


def test_q_known_top_level_keys_alone_are_read() -> None:
    facts = parse_nvidia_smi_q("Timestamp : Thu Jan  4 14:45:46 2024\n")
    assert facts.timestamp == "Thu Jan  4 14:45:46 2024"
    facts = parse_nvidia_smi_q("CUDA Version : 12.2\n")
    assert facts.cuda_version == "12.2"
    facts = parse_nvidia_smi_q("Timestamp :\nDriver Version : 535.129.03\n")
    assert (facts.timestamp, facts.driver_version) == (None, "535.129.03")


def test_q_source_reaches_the_tree_and_gpu_errors(public) -> None:
    e = _err("Driver Version : 1\n\tAttached GPUs : 1\n")
    _is(e, "tab in the indentation (not nvidia-smi -q text)", 2, "\tAttached GPUs : 1")
    text = public(I0)
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("Total") and "MiB" in ln)
    bad = text.replace(line, line.replace(" MiB", " lots"), 1)
    e = _err(bad)
    assert (e.source, e.line) == ("f.txt", line.replace(" MiB", " lots"))
