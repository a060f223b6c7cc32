"""`gpuvet import poc` on the health outputs people collect with other tools (public
examples from DCGM, nvbandwidth, cuda-samples, perftest and cluster tooling threads,
tests/fixtures/public): each recognised by content whatever its name, and judged."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from orchestrator.steps.poc.files import read
from orchestrator.steps.poc.importer import import_poc

FIX = Path(__file__).resolve().parents[1] / "fixtures"
PUBLIC = FIX / "public"

KINDS = [
    ("dcgmi-diag-r2_gpu-memory-fail_mle.txt", "dcgmi-diag"),
    ("dcgmi-diag-r2_3.3.1_t4-cut_godcgm52.txt", "dcgmi-diag"),
    ("dcgmi-diag_deployment-error_mle.txt", "dcgmi-diag"),
    ("syslog-grep_a100-xid63_mle.txt", "xid"),
    ("xid79-quoted_nvsentinel155.txt", "xid"),
    ("dmesg-T_h100-xid119-gsp_gpud.log", "xid"),
    ("dmesg_fallen-off-bus-no-xid_nvsentinel155.txt", "xid"),
    ("dmesg_limited-by_8x-h100_mle.txt", "pcie-bandwidth"),
    ("nvlink-e_h100_mle.txt", "nvlink-e"),
    ("lspci-vvv_rtx4090-riser-lnk_jan183.txt", "lspci-vvv"),
    ("lspci-vvv_quadro-rtx8000-x1-fragment_rpi480.txt", "lspci-vvv"),
    ("ib_write_bw_post-list-8B_perftest273.txt", "perftest-bw"),
    ("ib_read_bw_all-sizes-cut_ucx8851.txt", "perftest-bw"),
    ("nvbandwidth_v0.10_2gpu_aznhc.txt", "nvbandwidth"),
    ("nvbandwidth_v0.8_6x-a6000-read-ce_nvbw50.txt", "nvbandwidth"),
    ("p2pBandwidthLatencyTest_8x-h100-sxm-cut_nccl1264.txt", "p2pBandwidthLatencyTest"),
    ("p2pBandwidthLatencyTest_6gpu-pcie-cut_nccl814.txt", "p2pBandwidthLatencyTest"),
]


@pytest.mark.parametrize(("name", "kind"), KINDS)
def test_health_outputs_are_recognised_by_content(name: str, kind: str) -> None:
    f = read(PUBLIC / name, "renamed.txt")
    assert (f.kind, f.status) == (kind, "recognised"), f.reason


def _import(tmp_path: Path, *names: str, apps: str | None = None) -> dict[str, list[tuple[str,
                                                                                         str]]]:
    folder = tmp_path / "poc"
    folder.mkdir()
    for i, n in enumerate(names):
        shutil.copy(PUBLIC / n, folder / f"out{i}.txt")
    if apps is not None:
        (folder / "apps.csv").write_text(apps)
    res = import_poc(folder, "p", "n1", None, tmp_path / "results")
    by: dict[str, list[tuple[str, str]]] = {}
    for f in res.findings:
        by.setdefault(f.code, []).append((f.severity, f.message))
        assert f.code.startswith("POC_") or f.evidence, f  # the file, copied into the run
    return by


def test_failures_in_the_collected_health_outputs(tmp_path: Path) -> None:
    by = _import(tmp_path, "dcgmi-diag-r2_gpu-memory-fail_mle.txt",
                 "syslog-grep_a100-xid63_mle.txt", "xid79-quoted_nvsentinel155.txt",
                 "dmesg_limited-by_8x-h100_mle.txt", "nvlink-e_h100_mle.txt",
                 apps="pid, process_name, used_gpu_memory [MiB]\n77, python, 1024 MiB\n")
    assert [s for s, _ in by["DCGM_DIAG"]] == ["FAIL"]
    assert "GPU Memory" in by["DCGM_DIAG"][0][1]
    xids = sorted(m.split(": Xid ")[1].split(" ")[0] for _, m in by["GPU_XID"])
    assert xids == ["63", "79"] and {s for s, _ in by["GPU_XID"]} == {"FAIL"}
    assert {s for s, _ in by["HEALTH_PCIE_LINK"]} == {"WARN"}
    assert "limited by" in by["HEALTH_PCIE_LINK"][0][1]
    assert by["GPU_BUSY"][0][0] == "WARN" and "pid 77" in by["GPU_BUSY"][0][1]
    assert "NVLINK_ERRORS" not in by  # every counter of that capture is 0


def test_figures_of_the_bandwidth_tools_and_an_idle_link(tmp_path: Path) -> None:
    by = _import(tmp_path, "ib_write_bw_post-list-8B_perftest273.txt",
                 "nvbandwidth_v0.10_2gpu_aznhc.txt",
                 "p2pBandwidthLatencyTest_8x-h100-sxm-cut_nccl1264.txt",
                 "lspci-vvv_rtx4090-riser-lnk_jan183.txt")
    assert by["HEALTH_IB_BW"][0][0] == "INFO"
    assert "host_to_device_memcpy_ce 51.97 GB/s" in by["HEALTH_NVBANDWIDTH"][0][1]
    assert {s for s, _ in by["HEALTH_PEER"]} == {"INFO"}
    assert by["HEALTH_PCIE_LINK"] == [("INFO", by["HEALTH_PCIE_LINK"][0][1])]
    assert "2.5 of 16.0 GT/s" in by["HEALTH_PCIE_LINK"][0][1]


def test_a_narrower_link_and_nvlink_errors_warn(tmp_path: Path) -> None:
    folder = tmp_path / "poc"
    folder.mkdir()
    (folder / "lspci.txt").write_text(
        "3b:00.0 3D controller: NVIDIA Corporation GH100 [H100 SXM5 80GB] (rev a1)\n"
        "\t\tLnkCap:\tPort #0, Speed 32GT/s, Width x16, ASPM not supported\n"
        "\t\tLnkSta:\tSpeed 32GT/s (ok), Width x8 (downgraded)\n")
    (folder / "nvlink.txt").write_text((PUBLIC / "nvlink-e_h100_mle.txt").read_text().replace(
        "Link 1: CRC Errors: 0", "Link 1: CRC Errors: 12", 1))
    res = import_poc(folder, "p", "n1", None, tmp_path / "results")
    got = {(f.code, f.severity): f.message for f in res.findings}
    assert "x8 of x16" in got[("HEALTH_PCIE_LINK", "WARN")]
    assert "link 1/" in got[("NVLINK_ERRORS", "WARN")].lower()
