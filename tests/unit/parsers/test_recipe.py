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
    parse_mounts,
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
