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
        if "\n" not in t and (PUBLIC / t).exists():
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


def test_a_second_public_table_with_its_infoROM_warning(tmp_path: Path) -> None:
    name = "nvidia-smi_quadro-p4000-inforom-corrupted_r418_nyu-ai-03.txt"
    facts = parse_nvidia_smi_table((PUBLIC / name).read_text())
    assert [(g.name, g.bus_id) for g in facts.gpus] == [("Quadro P4000", "00000000:00:05.0")]
    assert facts.processes is not None and [p.pid for p in facts.processes] == [1393, 1589]
    assert [(w.kind, w.pci, w.line_no) for w in facts.warnings] == [
        ("inforom-corrupted", "0000:00:05.0", 19)]
    by = _import(tmp_path, name)
    assert [s for s, _ in by["GPU_INFOROM_CORRUPTED"]] == ["WARN"]


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


# ------------------------------------------------------------------ RDMA port views

@pytest.mark.parametrize(("name", "kind", "ports", "down", "verdict"), [
    ("ibdev2netdev-column-t_h100-12hca-notes_imbue4.txt", "ibdev2netdev", 12, 0, "INFO"),
    ("ibdev2netdev_sriov-vf-down_sriov382.txt", "ibdev2netdev", 1, 0, "INFO"),
    ("rdma-link_2x-cx6dx-roce_3fs283.txt", "rdma-link", 2, 0, "PASS"),
    ("rdma-link_rxe_3fs263.txt", "rdma-link", 1, 0, "PASS"),
    ("rdma-link_ib-down-polling_rccl1423.txt", "rdma-link", 1, 1, "WARN"),
    ("ibstatus_8x-a100-hdr-active_gpud.txt", "ibstatus", 9, 0, "PASS"),
    ("ibstatus_rxe-cut_rxedev52.txt", "ibstatus", 1, 0, "INFO")])
def test_rdma_port_views(tmp_path: Path, name: str, kind: str, ports: int, down: int,
                         verdict: str) -> None:
    from orchestrator import parsers
    facts = parsers.parse(kind, (PUBLIC / name).read_text())
    assert len(facts.ports) == ports and len(facts.down) == down  # type: ignore[attr-defined]
    f = read(PUBLIC / name, "ports.txt")
    assert (f.kind, f.status) == (kind, "recognised"), f.reason
    by = _import(tmp_path, "nvidia-smi_8x-h100-80gb-hbm3_r550.txt", name)
    assert [s for s, _ in by["RDMA_PORT_DOWN"]] == [verdict]


def test_rdma_port_facts() -> None:
    from orchestrator.parsers.rdma import parse_ibdev2netdev, parse_ibstatus, parse_rdma_link
    imbue = parse_ibdev2netdev((PUBLIC / "ibdev2netdev-column-t_h100-12hca-notes_imbue4.txt")
                               .read_text())
    p1 = imbue.ports[1]
    assert (p1.device, p1.port, p1.netdev, p1.netdev_state, p1.state) == (
        "mlx5_1", 1, "enp27s0f0np0", "Up", None)
    verbose = parse_ibdev2netdev("0000:0c:00.0 mlx5_0 (MT4123 - MCX653105A-HDAT) fw 20.31.1014 "
                                 "port 1 (ACTIVE) ==> ib0 (Up)\n")
    (v,) = verbose.ports
    assert (v.pci, v.state, v.extra["fw"]) == ("0000:0c:00.0", "ACTIVE", "20.31.1014")
    rccl = parse_rdma_link((PUBLIC / "rdma-link_ib-down-polling_rccl1423.txt").read_text())
    (r,) = rccl.ports
    assert (r.device, r.state, r.physical_state, r.extra["lid"]) == ("mlx5_7", "DOWN", "POLLING",
                                                                    "3403")
    gpud = parse_ibstatus((PUBLIC / "ibstatus_8x-a100-hdr-active_gpud.txt").read_text())
    g = gpud.ports[0]
    assert (g.device, g.state, g.physical_state, g.rate_gbps, g.width, g.link_layer) == (
        "mlx5_0", "ACTIVE", "LinkUp", 200.0, "4X HDR", "InfiniBand")


def test_rdma_views_refuse_other_text() -> None:
    from orchestrator.errors import ParseError
    from orchestrator.parsers.rdma import parse_ibdev2netdev, parse_ibstatus, parse_rdma_link
    for fn in (parse_ibdev2netdev, parse_ibstatus, parse_rdma_link):
        with pytest.raises(ParseError):
            fn("# notes\nall ports fine\n")


# ------------------------------------------------------------------ who is on the GPUs

@pytest.mark.parametrize(("name", "pids"), [
    ("pmon_h200-mig-load_r590.txt", [12249, 12250, 12267]),
    ("pmon_l40s-load_r595.txt", [20037, 20038]),
    ("pmon_h100-idle_r590.txt", [])])
def test_nvidia_smi_pmon(tmp_path: Path, name: str, pids: list[int]) -> None:
    from orchestrator.parsers.nvidia_smi_health import parse_pmon
    facts = parse_pmon((PUBLIC / name).read_text())
    assert [pid for _, pid, _ in facts.processes] == pids
    assert facts.columns[:3] == ["gpu", "pid", "type"] and facts.columns[-1] == "command"
    f = read(PUBLIC / name, "pmon.txt")
    assert (f.kind, f.status) == ("nvidia-smi-pmon", "recognised"), f.reason
    by = _import(tmp_path, "nvidia-smi_8x-h100-80gb-hbm3_r550.txt", name)
    assert [s for s, _ in by.get("GPU_BUSY", [])] == (["WARN"] if pids else [])


def test_pmon_values() -> None:
    from orchestrator.parsers.nvidia_smi_health import parse_pmon
    s = parse_pmon((PUBLIC / "pmon_l40s-load_r595.txt").read_text()).samples[1]
    assert (s.gpu, s.pid, s.type, s.command) == (0, 20038, "C", "ffmpeg")
    assert (s.values["sm"], s.values["enc"], s.values["jpg"]) == (6.0, 40.0, None)


@pytest.mark.parametrize(("name", "pids", "mib"), [
    ("query-compute-apps-noheader_h200-mig-load_r590-derived.csv", [12249, 12250, 12267], 16890),
    ("query-compute-apps-noheader_l40s-load_r595-derived.csv", [20037, 20038], 1219)])
def test_compute_apps_without_header(tmp_path: Path, name: str, pids: list[int],
                                     mib: int) -> None:
    from orchestrator.parsers.nvidia_smi_health import parse_compute_apps_noheader
    facts = parse_compute_apps_noheader((PUBLIC / name).read_text())
    assert [a.pid for a in facts.apps] == pids
    assert sum(a.used_mib or 0 for a in facts.apps) == mib
    f = read(PUBLIC / name, "apps.csv")
    assert (f.kind, f.status) == ("nvidia-smi-compute-apps-noheader", "recognised"), f.reason
    by = _import(tmp_path, "nvidia-smi_8x-h100-80gb-hbm3_r550.txt", name)
    ((sev, msg),) = by["GPU_BUSY"]
    assert sev == "WARN" and f"holding {mib} MiB" in msg


def test_compute_apps_without_header_is_not_a_gpu_listing() -> None:
    from orchestrator.errors import ParseError
    from orchestrator.parsers.nvidia_smi_health import parse_compute_apps_noheader
    simple = parse_compute_apps_noheader("48213, python3, 70211 MiB\n")
    assert [(a.pid, a.process_name, a.used_mib) for a in simple.apps] == [(48213, "python3",
                                                                           70211)]
    for gpu_row in ("0, NVIDIA H100 80GB HBM3, 81559 MiB\n",
                    "1, NVIDIA A100-SXM4-80GB, 40 MiB, 90 %\n"):
        with pytest.raises(ParseError):
            parse_compute_apps_noheader(gpu_row)


def test_the_headered_query_with_timestamp_and_serial_is_read() -> None:
    from orchestrator.parsers.nvidia_smi_health import parse_compute_apps
    facts = parse_compute_apps((PUBLIC / "query-compute-apps_h200-mig-load_r590.csv").read_text())
    assert [a.pid for a in facts.apps] == [12249, 12250, 12267]
    f = read(PUBLIC / "query-compute-apps_h200-mig-load_r590.csv", "apps.csv")
    assert (f.kind, f.status) == ("nvidia-smi-compute-apps", "recognised"), f.reason


def test_dmesg_decode_iso_stamps_are_read() -> None:
    # `dmesg --decode --time-format=iso`: facility and level, then the ISO stamp
    facts = parse_kernel_log((PUBLIC / "dmesg-decode-iso_nccl-segfault_gpud.log").read_text())
    assert facts.lines == 2 and facts.events == [] and facts.fallen_off_bus == []
    from orchestrator.parsers.kernel_log import stamp_of
    first = (PUBLIC / "dmesg-decode-iso_nccl-segfault_gpud.log").read_text().splitlines()[0]
    assert stamp_of(first).raw == "2025-01-21T04:41:44,285060+00:00"
    xid = parse_kernel_log(first.split(" pt_main")[0] + " NVRM: Xid (PCI:0000:38:00): 13, "
                           "pid='<unknown>', name=<unknown>, Graphics SM Global Exception\n")
    assert [(e.xid, e.stamp.raw) for e in xid.events] == [(13, "2025-01-21T04:41:44,285060+00:00")]


@pytest.mark.parametrize(("name", "xids", "gone"), [
    ("dmesg_xid79-fallen-off-bus-sxid_gpud-readme-derived.txt", [(79, "0000:91:00")],
     [("0000:91:00", 4)]),
    ("xid-one-line-fallen-off-bus_gpud-kmsg-test.txt", [], [("0000:29:00", 1)])])
def test_public_one_line_fallen_off_the_bus(tmp_path: Path, name: str,
                                            xids: list[tuple[int, str]],
                                            gone: list[tuple[str, int]]) -> None:
    facts = parse_kernel_log((PUBLIC / name).read_text())
    assert [(e.xid, e.pci) for e in facts.events] == xids
    assert [(b.pci, b.line_no) for b in facts.fallen_off_bus] == gone
    f = read(PUBLIC / name, "kern.log")
    assert (f.kind, f.status) == ("xid", "recognised"), f.reason
    by = _import(tmp_path, "nvidia-smi_8x-h100-80gb-hbm3_r550.txt", name)
    assert [s for s, _ in by["GPU_FELL_OFF_BUS"]] == ["FAIL"]
    assert gone[0][0] in by["GPU_FELL_OFF_BUS"][0][1]


def test_the_gpu_uuid_line_beside_the_fall() -> None:
    facts = parse_kernel_log((PUBLIC / "dmesg_xid79-fallen-off-bus-sxid_gpud-readme-derived.txt")
                             .read_text())
    assert facts.gpus == {"0000:91:00": "GPU-b6c3b2be-c55b-d076-fa0e-d464e4c7e08b"}
    assert facts.last_uptime_s == 6781753.409792


def test_a_query_gpu_csv_with_the_warning_is_read_and_judged(tmp_path: Path) -> None:
    from orchestrator.parsers.nvidia_smi import parse_query_gpu
    csv = (PUBLIC / "query-gpu_l40s_r595.csv").read_text()
    warned = "WARNING: infoROM is corrupted at gpu 0000:01:00.0\n" + csv
    facts = parse_query_gpu(warned)
    assert facts.count == 1 and [w.kind for w in facts.warnings] == ["inforom-corrupted"]
    f = read(PUBLIC / "query-gpu_l40s_r595.csv", "q.csv")
    (tmp_path / "q.csv").write_text(warned)
    f = read(tmp_path / "q.csv", "q.csv")
    assert (f.kind, f.status) == ("nvidia-smi-query-gpu", "recognised"), f.reason
    by = _import(tmp_path / "imp", warned)
    assert [s for s, _ in by["GPU_INFOROM_CORRUPTED"]] == ["WARN"]
