"""Outputs people share beside gpuvet's (issue threads, vendors' pages), read and judged:
each public file's parsed facts and the verdict `import poc` gives it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from orchestrator.parsers.kernel_log import parse_kernel_log
from orchestrator.parsers.nvidia_smi_table import parse_nvidia_smi_table
from orchestrator.steps.poc.files import read
from orchestrator.steps.poc.importer import import_poc

PUBLIC = Path(__file__).resolve().parents[1] / "fixtures" / "public"


def _import(tmp_path: Path, *texts: str) -> dict[str, list[tuple[str, str]]]:
    folder = tmp_path / "poc"
    folder.mkdir(parents=True)
    for i, t in enumerate(texts):
        if (PUBLIC / t).exists():
            shutil.copy(PUBLIC / t, folder / f"out{i}.txt")
        else:
            (folder / f"out{i}.txt").write_text(t)
    res = import_poc(folder, "p", "n1", None, tmp_path / "results")
    by: dict[str, list[tuple[str, str]]] = {}
    for f in res.findings:
        by.setdefault(f.code, []).append((f.severity, f.message))
    return by


# ------------------------------------------------------------------ nvidia-smi's warnings

INFOROM = "nvidia-smi_p100-inforom-corrupted-rc14_gpu-operator-docs-derived.txt"


def test_the_table_is_read_past_its_trailing_infoROM_warning() -> None:
    facts = parse_nvidia_smi_table((PUBLIC / INFOROM).read_text())
    (g,) = facts.gpus
    assert (g.name, g.bus_id, g.memory_total_mib) == ("Tesla P100-PCIE...", "00000000:0B:00.0",
                                                      16280)
    assert (facts.driver_version, facts.processes, facts.exit_status) == ("470.82.01", [], 14)
    (w,) = facts.warnings
    assert (w.kind, w.pci, w.line_no) == ("inforom-corrupted", "0000:0B:00.0", 19)


def test_the_warning_before_the_table_is_read_too() -> None:
    text = (PUBLIC / "nvidia-smi_8x-h100-80gb-hbm3_r550.txt").read_text()
    facts = parse_nvidia_smi_table("WARNING: infoROM is corrupted at gpu 0000:9B:00.0\n" + text)
    assert facts.count == 8 and [w.kind for w in facts.warnings] == ["inforom-corrupted"]


@pytest.mark.parametrize(("name", "pci"), [
    ("nvidia-smi_device-handle-unknown-error_xxd3vin19.txt", "0000:0B:00.0"),
    ("nvidia-smi_device-handle-no-space_syno22.txt", "0000:07:00.0")])
def test_a_gpu_nvidia_smi_cannot_reach(name: str, pci: str) -> None:
    facts = parse_nvidia_smi_table((PUBLIC / name).read_text())
    (w,) = facts.warnings
    assert (w.kind, w.pci, w.reason, facts.gpus) == ("device-handle", pci, "Unknown Error", [])
    f = read(PUBLIC / name, "gpu.txt")
    assert (f.kind, f.status) == ("nvidia-smi-table", "recognised"), f.reason


def test_a_gpu_that_requires_a_reset() -> None:
    facts = parse_nvidia_smi_table("Unable to determine the device handle for GPU "
                                   "0000:3B:00.0: GPU requires reset\n")
    assert [(w.kind, w.pci) for w in facts.warnings] == [("reset-required", "0000:3B:00.0")]


def test_import_judges_the_warnings(tmp_path: Path) -> None:
    by = _import(tmp_path, INFOROM)
    assert [s for s, _ in by["GPU_INFOROM_CORRUPTED"]] == ["WARN"]
    assert "0000:0B:00.0" in by["GPU_INFOROM_CORRUPTED"][0][1]
    assert not any(s == "FAIL" for v in by.values() for s, _ in v), by
    by = _import(tmp_path / "2", "nvidia-smi_device-handle-unknown-error_xxd3vin19.txt")
    assert [s for s, _ in by["GPU_UNREACHABLE"]] == ["FAIL"]
    by = _import(tmp_path / "3", "Unable to determine the device handle for GPU 0000:3B:00.0: "
                 "GPU requires reset\n")
    assert [s for s, _ in by["GPU_RESET_REQUIRED"]] == ["FAIL"]


# ------------------------------------------------------------------ kernel log forms

def test_the_one_line_fallen_off_the_bus_keeps_its_address() -> None:
    # the form issue 30 quotes (a GB200's domain 0018), with the printk caller id
    facts = parse_kernel_log("[ 2855.144540] [ T131119] NVRM: GPU 0018:06:00.0: GPU has fallen "
                             "off the bus.\n")
    (b,) = facts.fallen_off_bus
    assert (b.pci, b.line_no, b.stamp.uptime_s) == ("0018:06:00", 1, 2855.14454)
    journal = parse_kernel_log("Nov 07 18:17:15 server kernel: NVRM: GPU 0000:01:00.0: GPU has "
                               "fallen off the bus.\n")
    assert [(b.pci, b.stamp.raw) for b in journal.fallen_off_bus] == [("0000:01:00",
                                                                      "Nov 07 18:17:15")]


def test_dmesg_iso_time_stamps_are_read() -> None:
    facts = parse_kernel_log("2025-03-01T10:11:12,123456+00:00 NVRM: Xid (PCI:0000:3b:00): 79, "
                             "pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n")
    (e,) = facts.events
    assert (e.xid, e.pci, e.stamp.raw) == (79, "0000:3b:00", "2025-03-01T10:11:12,123456+00:00")


def test_import_fails_a_gpu_fallen_off_the_bus_on_one_line(tmp_path: Path) -> None:
    by = _import(tmp_path, "nvidia-smi_8x-h100-80gb-hbm3_r550.txt",
                 "[ 2855.144540] NVRM: GPU 0018:06:00.0: GPU has fallen off the bus.\n")
    ((sev, msg),) = by["GPU_FELL_OFF_BUS"]
    assert sev == "FAIL" and "0018:06:00.0" in msg
