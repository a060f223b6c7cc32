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


# ------------------------------------------------------------------ dcgmi

def test_a_dcgmi_cell_cut_at_a_space_gets_its_space_back() -> None:
    from orchestrator.parsers.dcgmi import parse_dcgmi_diag
    # DCGM cuts a message every 45 characters and pads each piece to its column: a piece
    # that ends in a space loses it to the padding (`drain ` + `the GPU`)
    msg = "GPU 1 had uncorrectable memory errors: drain the GPU and then reset it, or reboot it."
    pieces = [msg[i:i + 45] for i in range(0, len(msg), 45)]
    assert pieces[0].endswith(" ") and not pieces[1].startswith(" ")
    rule = "+" + "-" * 27 + "+" + "-" * 48 + "+\n"
    rows = [f"|{name:<27}| {piece:<47}|\n" for name, piece in
            zip([" Page Retirement", " Error", *[""] * (len(pieces) - 1)], ["Fail", *pieces],
                strict=True)]
    table = rule + f"|{' Diagnostic':<27}| {'Result':<47}|\n" + rule.replace("-", "=") + \
        "".join(rows) + rule
    (err,) = parse_dcgmi_diag(table).errors
    assert err.text == msg
    # the public tables, cut mid-word or at a piece that starts with its space, are unchanged
    mle = parse_dcgmi_diag((PUBLIC / "dcgmi-diag_deployment-error_mle.txt").read_text())
    assert [m.text for m in mle.errors] == ["GPU 3 has uncorrectable memory errors and row "
                                            "remappings are pending"]


@pytest.mark.parametrize(("name", "failed"), [
    ("dcgmi-diag-j_deployment-fail-warn_gcm.json", ["Persistence Mode"]),
    ("dcgmi-diag-j_deployment-pass_gcm.json", [])])
def test_dcgmi_diag_json_is_read_and_judged(tmp_path: Path, name: str, failed: list[str]) -> None:
    from orchestrator.parsers.dcgmi import parse_dcgmi_diag
    facts = parse_dcgmi_diag((PUBLIC / name).read_text())
    assert len(facts.tests) == 9 and {t.section for t in facts.tests} == {"Deployment"}
    assert [t.name for t in facts.failed] == failed
    f = read(PUBLIC / name, "diag.txt")
    assert (f.kind, f.status) == ("dcgmi-diag", "recognised"), f.reason
    by = _import(tmp_path, "nvidia-smi_8x-h100-80gb-hbm3_r550.txt", name)
    assert [s for s, _ in by["DCGM_DIAG"]] == ["FAIL" if failed else "PASS"]


def test_dcgmi_diag_json_of_another_shape_is_refused() -> None:
    from orchestrator.errors import ParseError
    from orchestrator.parsers.dcgmi import parse_dcgmi_diag
    with pytest.raises(ParseError, match="DCGM GPU Diagnostic"):
        parse_dcgmi_diag('{"args": {"nthreads": 1}}')


@pytest.mark.parametrize(("name", "down"), [
    ("dcgmi-nvlink-s-grep_2gpu-down-disabled_gcm.txt", {0: [3], 1: [6]}),
    ("dcgmi-nvlink-s-grep_2gpu-up_gcm.txt", {})])
def test_dcgmi_nvlink_link_status(tmp_path: Path, name: str, down: dict[int, list[int]]) -> None:
    from orchestrator.parsers.dcgmi import parse_dcgmi_nvlink_status
    facts = parse_dcgmi_nvlink_status((PUBLIC / name).read_text())
    assert sorted(facts.gpus) == [0, 1] and all(len(v) == 12 for v in facts.gpus.values())
    assert facts.down() == down
    f = read(PUBLIC / name, "links.txt")
    assert (f.kind, f.status) == ("dcgmi-nvlink-s", "recognised"), f.reason
    by = _import(tmp_path, "nvidia-smi_8x-h100-80gb-hbm3_r550.txt", name)
    assert [s for s, _ in by["NVLINK_LINK_DOWN"]] == (["FAIL", "FAIL"] if down else ["PASS"])


def test_dcgmi_nvlink_link_status_whole_output() -> None:
    from orchestrator.parsers.dcgmi import parse_dcgmi_nvlink_status
    text = ("+----------------------+\n|  NvLink Link Status  |\n+----------------------+\n"
            "GPUs:\n    gpuId 0:\n        U U D X\nNvSwitches:\n    physicalId 8:\n"
            "        U _ U\n\nKey: Up=U, Down=D, Disabled=X, Not Supported=_\n")
    facts = parse_dcgmi_nvlink_status(text)
    assert facts.gpus == {0: ["up", "up", "down", "disabled"]}
    assert facts.switches == {8: ["up", "not supported", "up"]}


# ------------------------------------------------------------------ perftest

@pytest.mark.parametrize(("name", "device", "gpu_name", "pcie", "buffer"), [
    ("ib_write_bw_use-cuda-a30-server-cut_perftest241.txt", 0, "NVIDIA A30", "17:00", 67108864),
    ("ib_write_bw_use-cuda-v100-cut_perftest-pr21.txt", 0, "Tesla V100-SXM2-32GB", None, 131072),
    ("ib_write_bw_use-cuda-dmabuf-h100-cut_perftest280.txt", 1, None, "29:00", None)])
def test_perftest_on_gpu_memory_is_read(tmp_path: Path, name: str, device: int,
                                        gpu_name: str | None, pcie: str | None,
                                        buffer: int | None) -> None:
    from orchestrator.parsers.perftest import parse_perftest_bw
    facts = parse_perftest_bw((PUBLIC / name).read_text())
    assert facts.gpu is not None and not facts.failed
    g = facts.gpu
    assert (g.device, g.name, g.pcie, g.buffer_bytes) == (device, gpu_name, pcie, buffer)
    f = read(PUBLIC / name, "ib.txt")
    assert (f.kind, f.status) == ("perftest-bw", "recognised"), f.reason
    by = _import(tmp_path, "nvidia-smi_8x-h100-80gb-hbm3_r550.txt", name)
    ((sev, msg),) = by["HEALTH_IB_BW"]
    assert sev == "INFO" and f"on GPU memory (CUDA device {device}" in msg


def test_perftest_dmabuf_line_is_kept() -> None:
    from orchestrator.parsers.perftest import parse_perftest_bw
    text = (PUBLIC / "ib_write_bw_use-cuda-a30-server-cut_perftest241.txt").read_text()
    text = text.replace("allocated GPU buffer address at 00007f3fa4000000 pointer=0x7f3fa4000000",
                        "using DMA-BUF for GPU buffer address at 0x7f3fa4000000 aligned at "
                        "0x7f3fa4000000 with aligned size 67108864")
    gpu = parse_perftest_bw(text).gpu
    assert gpu is not None and gpu.dmabuf


@pytest.mark.parametrize(("name", "status", "syndrome"), [
    ("ib_write_bw_completion-error-status4_perftest173.txt", 4, "0x51"),
    ("ib_send_bw_completion-error-status12_softiwarp27.txt", 12, "0x81")])
def test_a_failed_perftest_is_a_failure_with_its_status(tmp_path: Path, name: str, status: int,
                                                        syndrome: str) -> None:
    from orchestrator.parsers.perftest import parse_perftest_bw
    facts = parse_perftest_bw((PUBLIC / name).read_text())
    assert facts.failed and (facts.failed_status, facts.syndrome) == (status, syndrome)
    assert facts.errors[0].text == "Completion with error at client"
    by = _import(tmp_path, "nvidia-smi_8x-h100-80gb-hbm3_r550.txt", name)
    ((sev, msg),) = by["HEALTH_IB_BW"]
    assert sev == "FAIL" and f"status {status} (syndrome {syndrome})" in msg


# ------------------------------------------------------------------ multi-node nvbandwidth

def test_multinode_nvbandwidth_is_read(tmp_path: Path) -> None:
    from orchestrator.parsers.nvbandwidth import parse_nvbandwidth
    name = "nvbandwidth_v0.7_multinode-2x4-gb200_dra-docs-derived.txt"
    facts = parse_nvbandwidth((PUBLIC / name).read_text())
    assert facts.multinode and facts.mpi is not None and facts.mpi.startswith("Open MPI v4.1.4")
    assert facts.hosts == ["nvbandwidth-test-worker-0", "nvbandwidth-test-worker-1"]
    assert [(d.rank, d.index, d.name) for d in facts.devices][4] == (4, 0, "HGX GB200")
    (t,) = facts.tests
    assert (t.name, t.sum, t.columns) == ("multinode_device_to_device_memcpy_read_ce", 44685.29,
                                          list(range(8)))
    assert t.value(0, 1) == 798.02 and t.value(7, 7) is None
    f = read(PUBLIC / name, "nvbw.txt")
    assert (f.kind, f.status) == ("nvbandwidth", "recognised"), f.reason
    by = _import(tmp_path, "nvidia-smi_8x-h100-80gb-hbm3_r550.txt", name)
    ((sev, msg),) = by["HEALTH_NVBANDWIDTH"]
    assert sev == "INFO" and "multi-node: 8 rank(s) on 2 host(s)" in msg
    assert "between ranks 797.65 to 798.25 GB/s" in msg


def test_a_multinode_run_cut_after_its_start_is_read_as_started(tmp_path: Path) -> None:
    from orchestrator.parsers.nvbandwidth import parse_nvbandwidth
    name = "nvbandwidth_v0.8_multinode-4x-h200-cut_nvbw39.txt"
    facts = parse_nvbandwidth((PUBLIC / name).read_text())
    assert facts.multinode and facts.hosts == ["tensorflow-benchmarks-worker-0"]
    assert [t.sum for t in facts.tests] == [None]
    err = parse_nvbandwidth((PUBLIC / name).read_text() + "[CUDA_ERROR_NOT_PERMITTED] operation "
                            "not permitted in expression cuMemCreate(&handle) on w-0, rank = 0\n")
    assert len(err.errors) == 1 and err.tests[0].errors == err.errors
