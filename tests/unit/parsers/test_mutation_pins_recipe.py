"""Exact-value pins for the recipe's small outputs (orchestrator/parsers/recipe.py).

Each parse function's whole record, and each error's kind, place, line and message, so a
changed argument, bound or branch in them fails here.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.errors import ParseError
from orchestrator.parsers._noise import IgnoredLine
from orchestrator.parsers.recipe import (
    BuildLogFacts,
    CheckedAtFacts,
    CommitFacts,
    MissingCommandFacts,
    Mount,
    MountsFacts,
    PipFacts,
    SmiVersionFacts,
    TorchCheckFacts,
    parse_build_log,
    parse_checked_at,
    parse_commit,
    parse_missing_command,
    parse_mounts,
    parse_pip,
    parse_smi_version,
    parse_torch_check,
)
from orchestrator.parsers.system import TorchDevice

RECIPE = Path(__file__).resolve().parents[2] / "fixtures" / "recipe-h200x1"
TORCH = (RECIPE / "torch.txt").read_text()
SSH = "Warning: Permanently added 'n1' (ED25519) to the list of known hosts."


def _err(fn: Callable[..., object], text: str) -> tuple[str, int | None, str | None]:
    """The error's rendered message (kind, source, line number, line) and its fields."""
    with pytest.raises(ParseError) as exc:
        fn(text, source="f.txt")
    e = exc.value
    return e.what, e.line_no, e.line


def _empty(fn: Callable[..., object], kind: str) -> None:
    with pytest.raises(ParseError) as exc:
        fn(" \n\n", source="f.txt")
    assert exc.value.what == f"cannot parse {kind} output at f.txt: empty output"
    assert (exc.value.kind, exc.value.source, exc.value.line_no) == (kind, "f.txt", None)


# --------------------------------------------------------------------------- PyTorch check

_H200 = TorchDevice(index=0, name="NVIDIA H200", memory_bytes=round(139.8 * 2**30), cc=[9, 0])


def test_torch_check_records() -> None:
    assert parse_torch_check(TORCH) == TorchCheckFacts(
        torch="2.11.0+cu130", cuda="13.0", nccl=None, available=True, count=1,
        devices=[_H200], ignored_lines=[])
    # a device line printed indented is still one
    indented = TORCH.replace("\n{", "\n   {")
    assert parse_torch_check(indented).devices == [_H200]
    text = (SSH + "\nsome warning\n  torch_version:  2.4.0  \ntorch_cuda: None\n"
            "cuda_available: False\ndevice_count: 0\n")
    assert parse_torch_check(text) == TorchCheckFacts(
        torch="2.4.0", cuda=None, nccl=None, available=False, count=0, devices=[],
        ignored_lines=[IgnoredLine(line_no=1, kind="ssh", text=SSH),
                       IgnoredLine(line_no=2, kind="unknown", text="some warning")])


def test_torch_check_errors() -> None:
    _empty(parse_torch_check, "torch-check")
    m = "cannot parse torch-check output at f.txt{}: {}"
    assert _err(parse_torch_check, TORCH + "\ntorch_cuda: 12.1\n") == (
        m.format(":7", "torch_cuda after the device lines\n  line: 'torch_cuda: 12.1'"),
        7, "torch_cuda: 12.1")
    assert _err(parse_torch_check, "torch_version: 2.1\nstray\n") == (
        m.format(":2", "not a line of the PyTorch check\n  line: 'stray'"), 2, "stray")
    assert _err(parse_torch_check, "torch_version: 2\ndevice_count: 0\ncuda_available: True\n"
                ) == (m.format("", "no `torch_cuda:` line"), None, None)
    assert _err(parse_torch_check, "torch_cuda: 2\n")[0] == m.format(
        "", "no `torch_version:` line")
    assert _err(parse_torch_check, TORCH.replace("device_count: 1", "device_count: one"))[0] == (
        m.format("", "cuda_available is True/False and device_count a count"))
    assert _err(parse_torch_check, TORCH.replace("True", "true"))[0] == (
        m.format("", "cuda_available is True/False and device_count a count"))
    assert _err(parse_torch_check, TORCH.replace("device_count: 1", "device_count: 2"))[0] == (
        m.format("", "device_count is 2 but 1 device line(s) follow: the output was cut"))
    assert _err(parse_torch_check, TORCH.replace("'index': 0", "'index': x"))[:2] == (
        m.format(":5", "not a Python dict literal\n  line: " + repr(
            TORCH.splitlines()[4].replace("'index': 0", "'index': x"))), 5)


# --------------------------------------------------------------------------- /proc/mounts

def test_mounts_record() -> None:
    text = ("  /dev/vda / ext4 rw,relatime 0 0  \n\n"
            "server:/export /mnt/my\\040ckpt nfs4 rw,vers=4.2 0 0\n")
    assert parse_mounts(text) == MountsFacts(mounts=[
        Mount(device="/dev/vda", mount_point="/", fstype="ext4", options=["rw", "relatime"]),
        Mount(device="server:/export", mount_point="/mnt/my ckpt", fstype="nfs4",
              options=["rw", "vers=4.2"])])


def test_mounts_errors() -> None:
    _empty(parse_mounts, "mounts")
    assert _err(parse_mounts, "proc /proc proc rw 0 0\nproc on /proc type proc (rw)\n") == (
        "cannot parse mounts output at f.txt:2: not a /proc/mounts line (device, mount point, "
        "type, options, 0, 0)\n  line: 'proc on /proc type proc (rw)'", 2,
        "proc on /proc type proc (rw)")


# --------------------------------------------------------------------------- nvidia-smi --version

def test_smi_version_record() -> None:
    assert parse_smi_version((RECIPE / "nvidia-smi-version.txt").read_text()) == SmiVersionFacts(
        nvidia_smi="580.159.04", driver="580.159.04", cuda="13.0",
        fields={"nvidia-smi version": "580.159.04", "nvml version": "580.159",
                "driver version": "580.159.04", "cuda version": "13.0"})
    assert parse_smi_version("  NVIDIA-SMI version :  535.1  \ncuda version: 12.2\n") == (
        SmiVersionFacts(nvidia_smi="535.1", driver=None, cuda="12.2",
                        fields={"nvidia-smi version": "535.1", "cuda version": "12.2"}))


def test_smi_version_errors() -> None:
    _empty(parse_smi_version, "nvidia-smi-version")
    assert _err(parse_smi_version, "NVML version : 1\n\n580.1\n") == (
        "cannot parse nvidia-smi-version output at f.txt:3: not `Key : value`\n  line: '580.1'",
        3, "580.1")
    assert _err(parse_smi_version, "NVML version : 1\n") == (
        "cannot parse nvidia-smi-version output at f.txt: no `NVIDIA-SMI version :` line",
        None, None)


# --------------------------------------------------------------------------- commit

_HASH = "a0b82b2260cf5152b9f8c061bbf7eaf0ba096432"


def test_commit_records() -> None:
    assert parse_commit(f"\n  {_HASH}  \n") == CommitFacts(commit=_HASH)
    log = (f"commit {_HASH} (HEAD -> master)\nMerge: 1a2b3c4 5d6e7f8\nAuthor: A <a@b>\n"
           "AuthorDate: x\nCommit: C <c@d>\nCommitDate: y\nDate:   Mon Dec 1 2026\n\n"
           "    Fix the build\n")
    assert parse_commit(log) == CommitFacts(commit=_HASH)


def test_commit_errors() -> None:
    _empty(parse_commit, "commit")
    assert _err(parse_commit, "\nfatal: not a git repository\n") == (
        "cannot parse commit output at f.txt:2: not a git commit hash\n"
        "  line: 'fatal: not a git repository'", 2, "fatal: not a git repository")
    assert _err(parse_commit, f"{_HASH}\n\nabc1234def\n") == (
        "cannot parse commit output at f.txt:3: more than one commit line\n"
        "  line: 'abc1234def'", 3, "abc1234def")


# --------------------------------------------------------------------------- checked-at

@pytest.mark.parametrize(("text", "iso"), [
    ("2026-12-01T20:12:28+00:00", "2026-12-01T20:12:28+00:00"),
    ("2026-12-01T20:12:28Z", "2026-12-01T20:12:28+00:00"),
    ("2026-12-01T20:12:28,5+01:00", "2026-12-01T20:12:28.500000+01:00"),
    ("Tue Dec  1 20:12:28 UTC 2026", "2026-12-01T20:12:28"),
    ("Tue 01 Dec 2026 08:12:28 PM", "2026-12-01T20:12:28"),
    ("Tue 01 Dec 2026 08:12:28 AM UTC", "2026-12-01T08:12:28"),
    ("Tue 01 Dec 20:12:28 CET 2026", "2026-12-01T20:12:28"),
    ("2026-12-01  20:12:28", "2026-12-01T20:12:28"),
])
def test_checked_at_records(text: str, iso: str) -> None:
    assert parse_checked_at(f"\n  {text}  \n") == CheckedAtFacts(text=text, iso=iso)


def test_checked_at_errors() -> None:
    _empty(parse_checked_at, "checked-at")
    m = ("cannot parse checked-at output at f.txt:{}: not a date and time (`date` or "
         "`date -Iseconds`)\n  line: {!r}")
    assert _err(parse_checked_at, "\nyesterday 2026\n") == (
        m.format(2, "yesterday 2026"), 2, "yesterday 2026")
    assert _err(parse_checked_at, "2026-12-01\n\n2026-12-02\n") == (
        "cannot parse checked-at output at f.txt:3: more than one line\n  line: '2026-12-02'",
        3, "2026-12-02")


# --------------------------------------------------------------------------- pip

def test_pip_records() -> None:
    listed = ("Package   Version  Editable project location\n-------   -------  ----\n"
              "Torch_Audio  2.6.0\nnvidia-nccl-cu12 2.21.5  /src\n")
    assert parse_pip(listed) == PipFacts(packages={"torch-audio": "2.6.0",
                                                   "nvidia-nccl-cu12": "2.21.5"})
    frozen = ("# comment\ntorch==2.6.0\n-e git+https://x#egg=y\nfoo @ file:///tmp/foo\n"
              "Numpy == 1.26.4 \n")
    assert parse_pip(frozen) == PipFacts(packages={"torch": "2.6.0", "numpy": "1.26.4"})


def test_pip_errors() -> None:
    _empty(parse_pip, "pip-list")
    hdr = ("cannot parse pip-list output at f.txt:2: no `----` line under the `Package Version` "
           "header\n  line: 'Package Version'")
    assert _err(parse_pip, "\nPackage Version\n") == (hdr, 2, "Package Version")
    assert _err(parse_pip, "\nPackage Version\ntorch 2.6\n") == (hdr, 2, "Package Version")
    assert _err(parse_pip, "Package Version\n------- -------\n") == (
        "cannot parse pip-list output at f.txt: no package listed", None, None)
    assert _err(parse_pip, "# only a comment\n")[0] == (
        "cannot parse pip-list output at f.txt: no package listed")
    assert _err(parse_pip, "torch==2.6\n\ntorch 2.6\n") == (
        "cannot parse pip-list output at f.txt:3: not a package and its version\n"
        "  line: 'torch 2.6'", 3, "torch 2.6")
    assert _err(parse_pip, "Package Version\n--- ---\n# c\n")[1] == 3


# --------------------------------------------------------------------------- command not found

def test_missing_command_records() -> None:
    assert parse_missing_command("\nsh: 1: ibv_devinfo: not found\n") == MissingCommandFacts(
        command="ibv_devinfo", text="sh: 1: ibv_devinfo: not found")
    two = "bash: line 2: nvcc: command not found\nnvcc: command not found\n"
    assert parse_missing_command(two) == MissingCommandFacts(command="nvcc", text=two.strip())


def test_missing_command_errors() -> None:
    _empty(parse_missing_command, "command-not-found")
    assert _err(parse_missing_command, "nvcc: command not found\nhello\n") == (
        "cannot parse command-not-found output at f.txt:2: not a `command not found` message\n"
        "  line: 'hello'", 2, "hello")
    assert _err(parse_missing_command, "a: not found\nb: not found\n") == (
        "cannot parse command-not-found output at f.txt: several commands missing (a, b): "
        "cannot tell which output this file stands for", None, None)


# --------------------------------------------------------------------------- the build log

def test_build_log_record() -> None:
    text = ("make -C src build BUILDDIR=/b\n" + SSH + "\nCompiling  a.cu > /b/a.o\n"
            "Compiling  b.cu > /b/b.o\nLinking  /b/a.o > ../b/x/all_reduce_perf\n"
            "Linking  /b/b.o > gather_perf\nsomething odd\n"
            "  /b/c.cu(3): error: identifier undefined  \n")
    assert parse_build_log(text) == BuildLogFacts(
        binaries=["all_reduce_perf", "gather_perf"], compiled=2,
        errors=["/b/c.cu(3): error: identifier undefined"],
        ignored_lines=[IgnoredLine(line_no=2, kind="ssh", text=SSH),
                       IgnoredLine(line_no=7, kind="unknown", text="something odd")])
    assert parse_build_log("make: *** Error 2\n") == BuildLogFacts(
        binaries=[], compiled=0, errors=["make: *** Error 2"], ignored_lines=[])
    # a make cut short after compiling: no program linked yet, no error
    assert parse_build_log("Compiling  a.cu > /b/a.o\n") == BuildLogFacts(
        binaries=[], compiled=1, errors=[], ignored_lines=[])


def test_build_log_errors() -> None:
    _empty(parse_build_log, "nccl-tests-build")
    assert _err(parse_build_log, "make -C src\nmkdir -p x\n") == (
        "cannot parse nccl-tests-build output at f.txt: no Compiling, Linking or error line of "
        "a make", None, None)
