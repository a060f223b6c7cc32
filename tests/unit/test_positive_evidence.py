"""A verdict only from a file that shows the tool's own lines: a kernel log's `NVRM`/`Xid`
lines in their place, nvidia-smi -q's banner or keys. A phrase inside prose or code is
"not recognised" by `import poc` and refused by `gpuvet parse` (exit 2, one line naming the
file and what was expected), never read as a clean or a failing log."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from orchestrator.errors import ParseError
from orchestrator.parsers.kernel_log import parse_kernel_log, parse_pcie_bandwidth
from orchestrator.parsers.nvidia_smi_q import parse_nvidia_smi_q
from orchestrator.steps.poc.files import read
from orchestrator.steps.poc.importer import import_poc
from tests.unit.clirun import gpuvet

REPO = Path(__file__).resolve().parents[2]
PUBLIC = REPO / "tests" / "fixtures" / "public"

XID_LINE = ("NVRM: Xid (PCI:0000:3b:00): 79, pid=48213, name=python3, GPU has fallen off "
            "the bus.")
PY_SOURCE = ('"""Watch the kernel log for a GPU that fell off the bus."""\n'
             "import re\n\n"
             f'SAMPLE = "{XID_LINE}"\n'
             'PATTERN = re.compile(r"NVRM: Xid \\(PCI:(\\S+)\\): (\\d+)")\n')
MARKDOWN = ("# Node check, 2026-03-01\n\n"
            "- Xid errors: none seen in dmesg\n"
            "- fallen off the bus: none\n"
            "- NVRM: nothing unusual\n")


def _random_bytes(tmp: Path) -> Path:
    p = tmp / "random.bin"
    p.write_bytes(random.Random(7).randbytes(100 * 1024))
    return p


@pytest.fixture
def hostile(tmp_path: Path) -> dict[str, Path]:
    files = {"README.md": REPO / "README.md", "source.py": tmp_path / "watch.py",
             "random": _random_bytes(tmp_path), "utf16": tmp_path / "utf16.txt",
             "note.md": tmp_path / "note.md"}
    files["source.py"].write_text(PY_SOURCE)
    files["utf16"].write_bytes(("[ 1.0] NVRM: loading\n" + MARKDOWN).encode("utf-16"))
    files["note.md"].write_text(MARKDOWN)
    if os.path.exists("/etc/passwd"):
        files["passwd"] = Path("/etc/passwd")
    return files


@pytest.mark.parametrize("kind", ["xid", "pcie-bandwidth", "nvidia-smi-q"])
def test_parse_refuses_files_that_are_not_the_output(capsys: pytest.CaptureFixture[str],
                                                     hostile: dict[str, Path], kind: str) -> None:
    for name, path in hostile.items():
        r = gpuvet(capsys, "parse", kind, path)
        assert r.returncode == 2, (name, r.output)
        first = r.stderr.strip().splitlines()[0]
        assert str(path) in first and kind in first, (name, first)
        assert "events: 0" not in r.stdout and "gpus:" not in r.stdout


def test_a_python_string_holding_an_xid_is_not_a_kernel_log() -> None:
    with pytest.raises(ParseError, match="not a kernel log"):
        parse_kernel_log(PY_SOURCE, source="watch.py")
    with pytest.raises(ParseError, match="not a kernel log"):
        parse_pcie_bandwidth("note: 252.048 Gb/s available PCIe bandwidth is plenty\n")


def test_a_note_saying_fallen_off_the_bus_none_is_not_a_clean_log() -> None:
    with pytest.raises(ParseError, match="not a kernel log"):
        parse_kernel_log(MARKDOWN, source="note.md")


def test_a_quoted_line_inside_a_real_log_is_not_an_event() -> None:
    log = ("[ 10.5] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  570.86.15\n"
           f'[ 11.0] audit: cmd="grep {XID_LINE}"\n')
    facts = parse_kernel_log(log)
    assert facts.events == [] and facts.fallen_off_bus == []
    facts = parse_kernel_log(log + f"[ 12.0] {XID_LINE}\n")
    assert [(e.xid, e.pci) for e in facts.events] == [(79, "0000:3b:00")]


def test_nvidia_smi_q_needs_its_banner_or_its_keys() -> None:
    with pytest.raises(ParseError, match="not nvidia-smi -q output"):
        parse_nvidia_smi_q((REPO / "README.md").read_text(), source="README.md")
    with pytest.raises(ParseError, match="not nvidia-smi -q output"):
        parse_nvidia_smi_q("# config\nfabric:\n  type : ib\n  nics : 8\n")
    facts = parse_nvidia_smi_q("MIG Mode\n    Current : Disabled\n    Pending : Disabled\n")
    assert facts.gpus[0].mig_enabled is False


@pytest.mark.parametrize("name", ["watch.py", "notes.md"])
def test_import_poc_does_not_judge_prose_or_code(tmp_path: Path, name: str) -> None:
    folder = tmp_path / "poc"
    folder.mkdir()
    (folder / name).write_text(PY_SOURCE if name.endswith(".py") else MARKDOWN)
    (folder / "smi.txt").write_bytes((PUBLIC / "nvidia-smi_8x-h100-80gb-hbm3_r550.txt").read_bytes())
    f = read(folder / name, name)
    assert (f.kind, f.status) == (None, "not recognised"), f.reason
    res = import_poc(folder, "p", "n1", None, tmp_path / "results")
    codes = {x.code for x in res.findings}
    assert not codes & {"GPU_XID", "GPU_FELL_OFF_BUS", "HEALTH_PCIE_LINK"}, codes


def test_real_kernel_logs_are_still_read() -> None:
    for name, n in (("syslog-grep_a100-xid63_mle.txt", 1), ("xid79-quoted_nvsentinel155.txt", 1),
                    ("journal-grep_xid45-after-149_ogkm1150.txt", None)):
        facts = parse_kernel_log((PUBLIC / name).read_text())
        assert facts.events and (n is None or len(facts.events) == n), name
    clean = parse_kernel_log("[    0.000000] Linux version 6.8.0-45-generic\n")
    assert clean.events == [] and clean.lines == 1
