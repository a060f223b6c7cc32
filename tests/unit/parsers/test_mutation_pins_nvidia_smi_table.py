"""Exact-value pins of the default nvidia-smi table parse function (its top level).

Each test starts from a real capture (tests/fixtures) and edits one thing, then
asserts the top-level record or the exact error: message, line number, line.
"""
from __future__ import annotations

from orchestrator.errors import ParseError
from orchestrator.parsers.nvidia_smi_table import parse_nvidia_smi_table
from tests.unit.parsers.refusal import is_refusal, refused

KIND = "nvidia-smi-table"
MIG_ONLY = "nvidia-smi_a100-mig-devices-only_r450-guide.txt"


def _err(text: str) -> ParseError:
    return refused(parse_nvidia_smi_table, text)


def _is(e: ParseError, what: str, line_no: int | None, line: str | None) -> None:
    is_refusal(e, KIND, what, line_no, line)


def _top(facts) -> tuple:
    return (facts.timestamp, facts.smi_version, facts.driver_version, facts.cuda_version,
            facts.layout, len(facts.gpus), len(facts.mig_devices), facts.processes,
            facts.missing)


def test_table_real_h200_top_level_after_a_prompt(real) -> None:
    facts = parse_nvidia_smi_table("\n$ nvidia-smi\n" + real("nvidia-smi.txt"))
    assert _top(facts) == ("Mon Nov 30 04:53:05 2026", "580.159.04", "580.159.04", "13.0",
                           "3-row", 2, 0, [], [])
    assert [(i.line_no, i.text) for i in facts.ignored_lines] == [(2, "$ nvidia-smi")]
    assert facts.edits == []


def test_table_without_timestamp_and_cuda(real) -> None:
    lines = real("nvidia-smi.txt").splitlines()
    text = "\n".join(lines[1:]).replace("     CUDA Version: 13.0", "                   ")
    assert _top(parse_nvidia_smi_table(text)) == (None, "580.159.04", "580.159.04", None, "3-row",
                                                  2, 0, [], [])


def test_table_two_row_layout(public) -> None:
    facts = parse_nvidia_smi_table(public("nvidia-smi_4x-v100-pcie_r410.txt"))
    assert facts.layout == "2-row" and len(facts.gpus) == 4


def test_table_missing_processes_and_gpu_rows(real) -> None:
    lines = real("nvidia-smi.txt").splitlines()
    facts = parse_nvidia_smi_table("\n".join(lines[:17]))
    assert _top(facts)[5:] == (2, 0, None, ["processes table"])
    facts = parse_nvidia_smi_table("\n".join(lines[:8]))
    assert _top(facts)[5:] == (0, 0, None, ["processes table", "GPU rows"])


def test_table_cut_inside_the_last_gpu_block(real) -> None:
    lines = real("nvidia-smi.txt").splitlines()
    facts = parse_nvidia_smi_table("\n".join(lines[:14]))
    assert facts.missing == ["the rest of the GPU block at line 13 (text cut off)",
                             "processes table"]
    assert [g.index for g in facts.gpus] == [0]
    facts = parse_nvidia_smi_table("\n".join(lines[:15]))
    assert [g.index for g in facts.gpus] == [0, 1]
    assert facts.missing == ["processes table"]


def test_table_paste_starting_at_the_mig_table(public) -> None:
    facts = parse_nvidia_smi_table(public(MIG_ONLY))
    assert _top(facts)[:5] == (None, None, None, None, "3-row")
    assert (len(facts.gpus), len(facts.mig_devices), facts.processes) == (0, 2, [])
    assert facts.missing == ["the GPU table (the paste starts at the MIG devices table)"]
    lines = public(MIG_ONLY).splitlines()
    facts = parse_nvidia_smi_table("\n".join(lines[12:]))
    assert facts.missing == ["the GPU table (the paste starts at the Processes table)"]


def test_table_errors(real) -> None:
    text = real("nvidia-smi.txt")
    lines = text.splitlines()
    _is(_err(" \n\n"), "empty output", None, None)
    _is(_err(lines[0]), "not an nvidia-smi table (no box above the NVIDIA-SMI banner)", None,
        None)
    # a paste whose top rule was cut (it starts at the banner row) is read, and says so
    cut = parse_nvidia_smi_table("\n".join(lines[:1] + lines[2:]))
    assert cut.missing[:1] == ["the rule above the banner (the paste starts at the banner row)"]
    assert cut.count == parse_nvidia_smi_table(text).count
    _is(_err("\n".join(lines[:1] + lines[4:])),
        "not an nvidia-smi table (no box above the NVIDIA-SMI banner)", 2, lines[4])
    _is(_err("\n".join(lines[:2] + lines[3:])), "no `NVIDIA-SMI ... Driver Version:` banner", 3,
        lines[3])
    _is(_err("\n".join(lines[:2])), "no `NVIDIA-SMI ... Driver Version:` banner", None, None)
    bad = "\n".join(lines[:17] + ["| not a rule |"] + lines[18:])
    _is(_err(bad), "expected the MIG devices or processes table", 18, "| not a rule |")
    bad = "\n".join(lines[:18] + ["| Clocks:    |"] + lines[19:])
    _is(_err(bad), "unknown table after the GPU table", 19, "| Clocks:    |")
    bad = "\n".join(lines[:18])
    _is(_err(bad), "unknown table after the GPU table", None, None)


def test_table_banner_on_the_last_line(real) -> None:
    lines = real("nvidia-smi.txt").splitlines()
    _is(_err("\n".join(lines[:3])), "the text ends inside a table header", 3, lines[2])


def test_table_two_row_layout_cut_after_a_whole_block(public) -> None:
    lines = public("nvidia-smi_4x-v100-pcie_r410.txt").splitlines()
    facts = parse_nvidia_smi_table("\n".join(lines[:17]))
    assert [g.index for g in facts.gpus] == [0, 1, 2, 3]
    assert facts.missing == ["processes table"]
    facts = parse_nvidia_smi_table("\n".join(lines[:16]))
    assert [g.index for g in facts.gpus] == [0, 1, 2]
    assert facts.missing == ["the rest of the GPU block at line 16 (text cut off)",
                             "processes table"]


def test_table_elision_between_tables_is_an_edit(real) -> None:
    lines = real("nvidia-smi.txt").splitlines()
    facts = parse_nvidia_smi_table("\n".join(lines[:17] + ["[...]"] + lines[17:]))
    assert [(e.line_no, e.what) for e in facts.edits] == [
        (18, "an elision mark ('[...]'): lines were cut out here")]
    assert [(i.line_no, i.kind) for i in facts.ignored_lines] == [(18, "elision")]
