"""Text from users and nodes reaches the terminal inert: an escape sequence in an inventory
value, a PoC file name or a warning is shown as `\\x1b...`, never obeyed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from orchestrator import files
from orchestrator.render import terminal_text
from tests.unit.clirun import gpuvet

FIX = Path(__file__).resolve().parents[1] / "fixtures"
OSC_TITLE = "\x1b]0;pwned\x07"  # sets the terminal's title
CSI_CLEAR = "\x1b[2J\x1b[31m"  # clears the screen, turns the text red


def test_terminal_text_writes_out_every_control_character() -> None:
    assert terminal_text(f"a{OSC_TITLE}b") == "a\\x1b]0;pwned\\x07b"
    assert terminal_text(CSI_CLEAR) == "\\x1b[2J\\x1b[31m"
    # the one-byte CSI of the C1 set, DEL, NUL, a carriage return that would overwrite
    assert terminal_text("x\x9b2Jy\x7f\x00\rz") == "x\\x9b2Jy\\x7f\\x00\\x0dz"
    # bidi controls that make a line read otherwise than it is
    assert terminal_text("ok\u202egnp.exe") == "ok\\u202egnp.exe"
    # what tables and messages need stays: line breaks, tabs, any printable text
    assert terminal_text("line 1\n\tline 2 — H200 ✓") == "line 1\n\tline 2 — H200 ✓"


def _inert(output: str) -> None:
    assert "\x1b" not in output and "\x07" not in output, repr(output)


def test_inventory_check_shows_an_escape_sequence_in_a_value(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inv = tmp_path / "inv.yaml"
    # YAML's own escapes put the control characters into the value; the file is plain text
    inv.write_text('version: 1\nproviders:\n  p:\n    executor: local\n    nodes:\n'
                   '      - {name: n1, work_dir: "/tmp/a\\e]0;pwned\\ab\\e[2J"}\n')
    res = gpuvet(capsys, "inventory", "check", inv)
    assert res.returncode == 0, res.output
    _inert(res.output)
    assert "\\x1b]0;pwned\\x07b\\x1b[2J" in res.output.replace("\n", "")


def test_import_poc_shows_escape_sequences_in_file_names(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "poc"
    folder.mkdir()
    shutil.copy(FIX / "poc" / "h200x2" / "nvidia-smi.txt", folder / f"smi{OSC_TITLE}.txt")
    shutil.copy(FIX / "poc" / "h200x2" / "query-gpu.csv", folder / f"q{CSI_CLEAR}.csv")
    (folder / f"notes{CSI_CLEAR}.txt").write_text(f"nothing gpuvet reads {OSC_TITLE}\n")
    res = gpuvet(capsys, "import", "poc", folder, "-p", "lab", "--results",
                 tmp_path / "results", "--verbose")
    assert res.returncode in (0, 1), res.output
    _inert(res.output)
    assert "\\x1b]0;pwned\\x07" in res.output.replace("\n", "")


def test_warnings_are_escaped(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    gpuvet(capsys, "runs", "--results", tmp_path)  # the CLI hands warnings its console
    files.warn(f"skipped a torn line of {tmp_path}/x{CSI_CLEAR}.jsonl")
    err = capsys.readouterr().err
    _inert(err)
    assert "x\\x1b[2J\\x1b[31m.jsonl" in err


def test_a_name_that_is_not_utf8_is_shown_by_its_bytes() -> None:
    name = b"log-\xff\x1b.txt".decode("utf-8", "surrogateescape")
    assert terminal_text(name) == "log-\\xff\\x1b.txt"
