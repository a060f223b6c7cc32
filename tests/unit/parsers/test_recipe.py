"""The recipe's small outputs: its PyTorch check, /proc/mounts, the build log, and the rest."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator import parsers
from orchestrator.errors import ParseError
from orchestrator.parsers.recipe import (
    parse_build_log,
    parse_checked_at,
    parse_commit,
    parse_missing_command,
    parse_mounts,
    parse_pip,
    parse_smi_version,
    parse_torch_check,
)
from orchestrator.parsers.system import TorchInfoFacts

FIX = Path(__file__).resolve().parents[2] / "fixtures"
RECIPE = FIX / "recipe-h200x1"
TORCH = (RECIPE / "torch.txt").read_text()


def test_the_recipe_s_pytorch_check() -> None:
    t = parse_torch_check(TORCH)
    assert isinstance(t, TorchInfoFacts)  # the checks read it as the payload's probe
    assert (t.torch, t.cuda, t.available, t.count, t.nccl) == ("2.11.0+cu130", "13.0", True, 1,
                                                                None)
    (d,) = t.devices
    assert (d.index, d.name, d.cc) == (0, "NVIDIA H200", [9, 0])
    assert round(d.memory_bytes / 2**30, 2) == 139.8


def test_warnings_before_the_check_are_listed() -> None:
    warn = ("/usr/lib/python3/dist-packages/torch/cuda/__init__.py:138: UserWarning: CUDA "
            "initialization: The NVIDIA driver on your system is too old\n")
    t = parse_torch_check(warn + TORCH.replace("cuda_available: True", "cuda_available: False")
                          .replace("device_count: 1", "device_count: 0").splitlines()[0] + "\n"
                          "torch_cuda: None\ncuda_available: False\ndevice_count: 0\n")
    assert (t.available, t.count, t.cuda, t.devices) == (False, 0, None, [])
    assert [(i.line_no, i.kind) for i in t.ignored_lines] == [(1, "unknown")]


@pytest.mark.parametrize(("text", "why"), [
    (TORCH.replace("device_count: 1", "device_count: 2"), "device_count is 2 but 1 device"),
    (TORCH.replace("'memory_gib': 139.8", "'memory_gib': __import__('os')"),
     "not a Python dict literal"),
    (TORCH.replace("'compute_capability': (9, 0)", "'cc': (9, 0)"), "a device line holds"),
    ("torch_version: 2.3.1\n", "no `torch_cuda:` line"),
    (TORCH + "torch_version: 2.1.0\n", "torch_version after the device lines"),
    (TORCH.replace("cuda_available: True", "cuda_available: yes"), "cuda_available is True"),
])
def test_a_damaged_check_is_refused(text: str, why: str) -> None:
    with pytest.raises(ParseError) as exc:
        parse_torch_check(text)
    assert why in exc.value.what


def test_proc_mounts() -> None:
    m = parse_mounts((RECIPE / "mounts.txt").read_text())
    assert len(m.mounts) == 10
    root = m.of("/home/ubuntu/ckpt")
    assert root is not None and (root.device, root.fstype) == ("/dev/vda", "ext4")
    shm = m.of("/dev/shm/x")
    assert shm is not None and shm.fstype == "tmpfs" and "relatime" in shm.options
    with pytest.raises(ParseError):
        parse_mounts("proc on /proc type proc (rw)\n")  # `mount`, not /proc/mounts


def test_the_build_log() -> None:
    b = parse_build_log((RECIPE / "nccl-tests" / "make-plain.log").read_text())
    assert b.compiled == 16 and b.errors == []
    assert b.binaries[:3] == ["all_reduce_perf", "all_gather_perf", "broadcast_perf"]
    assert len(b.binaries) == 11
    assert [i.text for i in b.ignored_lines] == ["plain make rc=0"]
    failed = parse_build_log("make -C src build BUILDDIR=/x/build\n/bin/sh: 1: nvcc: not found\n"
                             "make[1]: *** [Makefile:89: /x/build/common.o] Error 127\n")
    assert failed.binaries == [] and len(failed.errors) == 2


def test_the_other_small_outputs_of_the_folder() -> None:
    assert parse_commit((RECIPE / "nccl-tests" / "commit.txt").read_text()).commit == \
        "a0b82b2260cf5152b9f8c061bbf7eaf0ba096432"
    assert parse_checked_at((RECIPE / "checked-at.txt").read_text()).iso == \
        "2026-12-01T20:12:28+00:00"
    v = parse_smi_version((RECIPE / "nvidia-smi-version.txt").read_text())
    assert (v.nvidia_smi, v.driver, v.cuda) == ("580.159.04", "580.159.04", "13.0")


def test_every_kind_names_a_command_to_run() -> None:
    for spec in parsers.kinds():
        assert spec.example.strip() and spec.description.strip(), spec.kind
    assert {"torch-check", "mounts", "nvidia-smi-query-gpu-noheader", "nccl-tests-build",
            "commit", "checked-at", "pip-list", "nvidia-smi-version"} <= {
        s.kind for s in parsers.kinds()}


# ------------------------------------------------ whole records, limits, the error of each refusal

def _refused(func, text: str, what: str, line_no: int | None = None,
             line: str | None = None, *, kind: str) -> None:
    with pytest.raises(ParseError) as exc:
        func(text, source="f.txt")
    e = exc.value
    msg = f"cannot parse {kind} output at f.txt{'' if line_no is None else f':{line_no}'}: {what}"
    if line is not None:
        msg += f"\n  line: {line!r}"
    assert (e.kind, e.what, e.line_no, e.line, e.source) == (kind, msg, line_no, line, "f.txt")


def test_the_pytorch_check_whole_with_two_gpus() -> None:
    text = TORCH.replace("device_count: 1", "device_count: 2") + (
        "{'index': 1, 'name': 'NVIDIA H200', 'memory_gib': 1, 'compute_capability': (9, 0)}\n")
    t = parse_torch_check("  torch_version:   2.11.0+cu130  \n" + text.split("\n", 1)[1])
    assert t.model_dump() == {
        "torch": "2.11.0+cu130", "cuda": "13.0", "nccl": None, "available": True, "count": 2,
        "devices": [
            {"index": 0, "name": "NVIDIA H200", "memory_bytes": round(139.8 * 2**30), "cc": [9, 0]},
            {"index": 1, "name": "NVIDIA H200", "memory_bytes": 2**30, "cc": [9, 0]}],
        "ignored_lines": []}
    # an ssh warning before the check is known noise, and said so
    warned = parse_torch_check("Warning: Permanently added 'n1' (ED25519) to the list of known "
                               "hosts.\n" + TORCH)
    assert [(i.line_no, i.kind) for i in warned.ignored_lines] == [(1, "ssh")]


@pytest.mark.parametrize(("old", "new", "what"), [
    ("'index': 0", "'index': '0'", "a device value has the wrong type"),
    ("'name': 'NVIDIA H200'", "'name': 7", "a device value has the wrong type"),
    ("'memory_gib': 139.8", "'memory_gib': '139.8'", "a device value has the wrong type"),
    ("(9, 0)", "[9, 0]", "a device value has the wrong type"),
    ("(9, 0)", "(9, 0, 1)", "a device value has the wrong type"),
    ("(9, 0)", "(9, '0')", "a device value has the wrong type"),
    ("(9, 0)", "('9', 0)", "a device value has the wrong type"),
    ("{'index': 0, 'name': 'NVIDIA H200', 'memory_gib': 139.8, 'compute_capability': (9, 0)}",
     "{'index': 0}", "a device line holds compute_capability, index, memory_gib, name"),
    ("{'index': 0, 'name': 'NVIDIA H200', 'memory_gib': 139.8, 'compute_capability': (9, 0)}",
     "{0, 1}", "a device line holds compute_capability, index, memory_gib, name"),
    ("'memory_gib': 139.8", "'memory_gib': 139.8,,", "not a Python dict literal"),
])
def test_a_device_line_of_the_wrong_shape_names_the_line(old: str, new: str, what: str) -> None:
    text = TORCH.replace(old, new)
    _refused(parse_torch_check, text, what, 5, text.splitlines()[4], kind="torch-check")


def test_the_pytorch_check_s_own_refusals() -> None:
    _refused(parse_torch_check, TORCH.replace("torch_cuda: 13.0\n", ""), "no `torch_cuda:` line",
             kind="torch-check")
    _refused(parse_torch_check, TORCH.replace("device_count: 1", "device_count: one"),
             "cuda_available is True/False and device_count a count", kind="torch-check")
    _refused(parse_torch_check, TORCH.replace("device_count: 1", "device_count: 2"),
             "device_count is 2 but 1 device line(s) follow: the output was cut",
             kind="torch-check")
    _refused(parse_torch_check, TORCH + "torch_cuda: 12.1\n", "torch_cuda after the device lines",
             6, "torch_cuda: 12.1", kind="torch-check")
    _refused(parse_torch_check, TORCH.replace("cuda_available: True\n",
                                              "cuda_available: True\nsegfault\n"),
             "not a line of the PyTorch check", 4, "segfault", kind="torch-check")
    _refused(parse_torch_check, "\n \n", "empty output", kind="torch-check")


def test_mounts_whole_and_the_deepest_wins() -> None:
    m = parse_mounts("/dev/vda / ext4 rw,relatime 0 0\n"
                     "//nas/my\\040share /mnt/my\\040share cifs rw 0 0\n"
                     "tmpfs /mnt tmpfs rw,nosuid 0 0\nover /mnt overlay ro 0 0\n")
    assert m.model_dump()["mounts"][1] == {"device": "//nas/my\\040share",
                                           "mount_point": "/mnt/my share", "fstype": "cifs",
                                           "options": ["rw"]}
    assert [(p, getattr(m.of(p), "fstype", None)) for p in (
        "/mnt/my share/x", "/mnt/my share", "/mnt/other", "/mnt", "/mntx", "/", "/home")] == [
        ("/mnt/my share/x", "cifs"), ("/mnt/my share", "cifs"), ("/mnt/other", "overlay"),
        ("/mnt", "overlay"), ("/mntx", "ext4"), ("/", "ext4"), ("/home", "ext4")]
    assert parse_mounts("tmpfs /dev/shm tmpfs rw 0 0\n").of("/home") is None
    _refused(parse_mounts, "/dev/vda / ext4 rw 0 0\nproc on /proc type proc (rw)\n",
             "not a /proc/mounts line (device, mount point, type, options, 0, 0)", 2,
             "proc on /proc type proc (rw)", kind="mounts")


def test_nvidia_smi_version_whole() -> None:
    v = parse_smi_version((RECIPE / "nvidia-smi-version.txt").read_text())
    assert v.model_dump() == {"nvidia_smi": "580.159.04", "driver": "580.159.04", "cuda": "13.0",
                              "fields": {"nvidia-smi version": "580.159.04",
                                         "nvml version": "580.159", "driver version": "580.159.04",
                                         "cuda version": "13.0"}}
    assert parse_smi_version("NVIDIA-SMI version  : 535.54\n").model_dump() == {
        "nvidia_smi": "535.54", "driver": None, "cuda": None,
        "fields": {"nvidia-smi version": "535.54"}}
    _refused(parse_smi_version, "NVML version : 580\n", "no `NVIDIA-SMI version :` line",
             kind="nvidia-smi-version")
    _refused(parse_smi_version, "NVML version : 580\nFailed to initialize NVML\n",
             "not `Key : value`", 2, "Failed to initialize NVML", kind="nvidia-smi-version")


def test_commit_from_rev_parse_and_git_log() -> None:
    log = ("commit a0b82b2 (HEAD -> master, tag: v2.13.10)\nMerge: 1a2b3c4 5d6e7f8\n"
           "Author: A <a@b>\nDate:   Mon Jan 1 00:00:00 2026 +0000\n\n    Fix the build\n")
    assert parse_commit(log).commit == "a0b82b2"
    assert parse_commit("  a0b82b2260cf5152b9f8c061bbf7eaf0ba096432\n").commit == (
        "a0b82b2260cf5152b9f8c061bbf7eaf0ba096432")
    for bad in ("1234567", "a0b82b", "A0B82B2", "a0b82b2260cf5152b9f8c061bbf7eaf0ba0964321",
                "fatal: not a git repository"):
        _refused(parse_commit, bad + "\n", "not a git commit hash", 1, bad, kind="commit")
    _refused(parse_commit, "a0b82b2\nb1c93c3\n", "more than one commit line", 2, "b1c93c3",
             kind="commit")


@pytest.mark.parametrize(("text", "iso"), [
    ("2026-12-01T20:12:28+00:00", "2026-12-01T20:12:28+00:00"),
    ("2026-12-01T20:12:28Z", "2026-12-01T20:12:28+00:00"),
    ("2026-12-01T20:12:28,123456+01:00", "2026-12-01T20:12:28.123456+01:00"),
    ("Tue Dec  1 20:12:28 UTC 2026", "2026-12-01T20:12:28"),  # `date` in the C locale
    ("Tue Dec  1 20:12:28 2026", "2026-12-01T20:12:28"),
    ("Tue 01 Dec 2026 08:12:28 PM UTC", "2026-12-01T20:12:28"),  # en_US: %c is 12-hour
    ("Tue 01 Dec 2026 08:12:28 PM", "2026-12-01T20:12:28"),
    ("Tue 01 Dec 2026 12:05:00 AM CET", "2026-12-01T00:05:00"),
    ("Tue 01 Dec 20:12:28 GMT 2026", "2026-12-01T20:12:28"),  # en_GB
    ("2026-12-01 20:12:28", "2026-12-01T20:12:28"),
])
def test_checked_at_in_every_form_date_prints(text: str, iso: str) -> None:
    assert parse_checked_at(text + "\n").model_dump() == {"text": text, "iso": iso}


def test_checked_at_refusals() -> None:
    _refused(parse_checked_at, "yesterday\n", "not a date and time (`date` or `date -Iseconds`)",
             1, "yesterday", kind="checked-at")
    _refused(parse_checked_at, "20:12:28\n", "not a date and time (`date` or `date -Iseconds`)",
             1, "20:12:28", kind="checked-at")
    _refused(parse_checked_at, "2026-12-01T20:12:28Z\n2026-12-02T20:12:28Z\n",
             "more than one line", 2, "2026-12-02T20:12:28Z", kind="checked-at")


def test_pip_list_and_freeze_whole() -> None:
    listed = parse_pip("Package            Version     Editable project location\n"
                       "------------------ ----------- -------------------------\n"
                       "torch              2.11.0+cu130\nnvidia_nccl_cu12   2.28.9\n"
                       "gpuvet             0.1         /src/gpuvet\n")
    assert listed.packages == {"torch": "2.11.0+cu130", "nvidia-nccl-cu12": "2.28.9",
                               "gpuvet": "0.1"}
    assert (listed.torch, listed.nccl) == ("2.11.0+cu130", "2.28.9")
    frozen = parse_pip("# generated\nTorch==2.3.1\nnvidia-nccl-cu11==2.19.3\n"
                       "nvidia-nccl-cu12 == 2.21.5\nfoo @ file:///tmp/foo\n-e git+https://x#egg=y\n")
    assert frozen.packages == {"torch": "2.3.1", "nvidia-nccl-cu11": "2.19.3",
                               "nvidia-nccl-cu12": "2.21.5"}
    assert frozen.nccl == "2.19.3"  # the first by name
    assert parse_pip("numpy==2.0\n").model_dump() == {"packages": {"numpy": "2.0"}}
    assert (parse_pip("numpy==2.0\n").torch, parse_pip("numpy==2.0\n").nccl) == (None, None)


def test_pip_refusals() -> None:
    _refused(parse_pip, "Package Version\ntorch 2.3.1\n",
             "no `----` line under the `Package Version` header", 1, "Package Version",
             kind="pip-list")
    _refused(parse_pip, "Package Version\n", "no `----` line under the `Package Version` header",
             1, "Package Version", kind="pip-list")
    _refused(parse_pip, "Package Version\n------- -------\n", "no package listed", kind="pip-list")
    _refused(parse_pip, "# only a comment\n", "no package listed", kind="pip-list")
    _refused(parse_pip, "torch==2.3.1\ntorch 2.3.1\n", "not a package and its version", 2,
             "torch 2.3.1", kind="pip-list")
    _refused(parse_pip, "Package Version\n------- -------\n# x\n", "not a package and its version",
             3, "# x", kind="pip-list")


def test_command_not_found_in_every_shell() -> None:
    for text in ("bash: ibv_devinfo: command not found", "sh: 1: ibv_devinfo: not found",
                 ".scratch/capture.sh: line 2: ibv_devinfo: command not found",
                 "ibv_devinfo: command not found"):
        assert parse_missing_command(text + "\n\n").model_dump() == {
            "command": "ibv_devinfo", "text": text}
    twice = "bash: nvcc: command not found\nbash: nvcc: command not found\n"
    assert parse_missing_command(twice).command == "nvcc"
    _refused(parse_missing_command, "bash: nvcc: command not found\nbash: make: command not found\n",
             "several commands missing (nvcc, make): cannot tell which output this file "
             "stands for", kind="command-not-found")
    _refused(parse_missing_command, "bash: nvcc: command not found\nPermission denied\n",
             "not a `command not found` message", 2, "Permission denied",
             kind="command-not-found")


def test_the_build_log_counts_and_lines() -> None:
    b = parse_build_log((RECIPE / "nccl-tests" / "make-plain.log").read_text())
    assert b.binaries == ["all_reduce_perf", "all_gather_perf", "broadcast_perf",
                          "reduce_scatter_perf", "reduce_perf", "alltoall_perf", "alltoallv_perf",
                          "scatter_perf", "gather_perf", "sendrecv_perf", "hypercube_perf"]
    assert [(i.line_no, i.kind, i.text) for i in b.ignored_lines] == [
        (34, "unknown", "plain make rc=0")]
    log = ("Compiling  all_reduce.cu   > build/all_reduce.o\n"
           "common.cu(12): error: identifier \"ncclBfloat16\" is undefined\n"
           "Linking  build/all_reduce.o > build/all_reduce_perf\n"
           "/usr/bin/ld: cannot find -lnccl\nmake: *** [Makefile:3: all] Error 2\n"
           "Warning: Permanently added 'n1' to the list of known hosts.\nsomething else\n")
    f = parse_build_log(log)
    assert f.model_dump() == {
        "binaries": ["all_reduce_perf"], "compiled": 1,
        "errors": ["common.cu(12): error: identifier \"ncclBfloat16\" is undefined",
                   "/usr/bin/ld: cannot find -lnccl", "make: *** [Makefile:3: all] Error 2"],
        "ignored_lines": [{"line_no": 6, "kind": "ssh",
                           "text": "Warning: Permanently added 'n1' to the list of known hosts."},
                          {"line_no": 7, "kind": "unknown", "text": "something else"}]}
    _refused(parse_build_log, "make -C src build\nnvcc -o x\n",
             "no Compiling, Linking or error line of a make", kind="nccl-tests-build")
    _refused(parse_build_log, "\n", "empty output", kind="nccl-tests-build")


def test_a_mount_point_is_matched_by_its_whole_name() -> None:
    """Only the trailing `/` is ignored: a folder beside `/mnt/BOX` or `/mnt/x ` is not in it."""
    m = parse_mounts("/dev/vda / ext4 rw 0 0\nnas:/b /mnt/BOX nfs4 rw 0 0\n"
                     "nas:/s /mnt/x\\040 nfs4 rw 0 0\n")
    assert [m.of(p).device for p in ("/mnt/BOX/a", "/mnt/BO/a", "/mnt/x /a", "/mnt/x/a")] == [
        "nas:/b", "/dev/vda", "nas:/s", "/dev/vda"]
