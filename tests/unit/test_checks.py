"""Every preflight check, proven on real (2x H200) and synthetic rented-fleet outputs.

Documents go through judge_document, the path live and --from runs share, so
the parsers and the checks are exercised together.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from collectdoc import (
    H200_MPI,
    H200_NCCL,
    H200_ORDER,
    H200_TOOLS,
    NO_MPI,
    NO_NCCL,
    doc_from,
    fixture,
    h200_doc,
    h200_text,
    inventory,
    path_info,
)

from orchestrator import gpunames, parsers
from orchestrator import inventory as inv_mod
from orchestrator.errors import ParseError
from orchestrator.records import Finding
from orchestrator.steps.preflight import checks, gpu
from orchestrator.steps.preflight.step import judge_document

REPO = Path(__file__).resolve().parents[2]
SYN = "synthetic/"
DGX_CSV = SYN + "query-gpu_dgx-a100-80gb_r535.csv"
PCIE40_CSV = SYN + "query-gpu_4x-a100-pcie-40gb_r470.csv"
A100_ORDER: dict[str, Any] = {"gpu_model": "A100-SXM4-80GB", "gpus_per_node": 8,
                              "memory_per_gpu_gb": 80, "form_factor": "sxm",
                              "interconnect": "nvswitch"}


def judge(doc: dict[str, Any], expect: dict[str, Any], node: str = "node-a") -> list[Finding]:
    inv = inventory(expect, nodes=[node])
    return judge_document(doc, inv.node(node), inv, "run-1", None).findings


def codes(findings: list[Finding]) -> dict[str, list[Finding]]:
    out: dict[str, list[Finding]] = {}
    for f in findings:
        out.setdefault(f.code, []).append(f)
    return out


def one(findings: list[Finding], code: str) -> Finding:
    got = [f for f in findings if f.code == code]
    assert len(got) == 1, (code, [(f.code, f.severity, f.message) for f in findings])
    return got[0]


def messages(findings: list[Finding], code: str) -> list[str]:
    return [f.message for f in findings if f.code == code]


# --------------------------------------------------------------------------- the real node

def test_real_h200_passes_its_own_order() -> None:
    fs = judge(h200_doc(), H200_ORDER)
    assert [f for f in fs if f.severity == "FAIL"] == []
    assert [f for f in fs if f.severity == "WARN"] == []
    for code in ("GPU_COUNT", "GPU_MODEL", "GPU_MEMORY", "FORM_FACTOR", "INTERCONNECT",
                 "TORCH_SEES_GPUS", "BUILD_TOOLS", "CKPT_DIR"):
        assert one(fs, code).severity == "PASS", code
    assert one(fs, "GPU_COUNT").message == "2 GPU(s) found, 2 ordered"
    assert one(fs, "GPU_MODEL").message == "NVIDIA H200 matches H200 SXM 141GB (ordered H200)"
    assert one(fs, "GPU_MEMORY").message == "every GPU has >= 141 GB"
    assert one(fs, "INTERCONNECT").message == "every GPU pair on NVLink (NV18)"
    assert one(fs, "TORCH_SEES_GPUS").message == "PyTorch 2.11.0+cu130 sees 2 GPU(s), CUDA 13.0"
    # no fabric ordered: no RDMA check at all, although ibv_devinfo is not installed
    assert not {"IB_MISSING", "IB_PORTS"} & set(codes(fs))


def test_real_h200_against_the_shipped_a100_order() -> None:
    inv = inv_mod.load(REPO / "inventories/example-two-providers.yaml")
    node = inv.node("alpha-1")
    fs = judge_document(h200_doc(), node, inv, "run-1", None).findings
    count = one(fs, "GPU_COUNT")
    assert (count.severity, count.message) == ("FAIL", "2 GPU(s) found, 8 ordered")
    assert count.details == {"found": 2, "ordered": 8}
    model = one(fs, "GPU_MODEL")
    assert model.severity == "FAIL"
    assert "(A100-SXM4-80GB)" in model.message
    assert "GPU0 NVIDIA H200" in model.message and "GPU1 NVIDIA H200" in model.message
    assert one(fs, "GPU_MEMORY").severity == "PASS"  # 141 GB >= 80 GB
    assert one(fs, "IB_MISSING").severity == "FAIL"  # ib ordered, no HCA on this host
    assert all(f.node == "alpha-1" and f.provider == "alpha-cloud" for f in fs)


# --------------------------------------------------------------------------- GPUs

def test_a100_40gb_sold_as_80gb() -> None:
    doc = doc_from({"query_gpu": PCIE40_CSV})
    fs = judge(doc, {"gpu_model": "A100 80GB", "gpus_per_node": 4, "memory_per_gpu_gb": 80})
    mem = one(fs, "GPU_MEMORY")
    assert mem.severity == "FAIL"
    assert mem.message.startswith("GPU memory below the 80 GB ordered: GPU0 39.6 GiB, ")
    assert "GPU3 39.6 GiB" in mem.message
    assert one(fs, "GPU_MODEL").severity == "FAIL"
    assert one(fs, "GPU_COUNT").severity == "PASS"


def test_a100_80gb_memory_passes() -> None:
    fs = judge(doc_from({"query_gpu": DGX_CSV}), {"memory_per_gpu_gb": 80})
    assert one(fs, "GPU_MEMORY").severity == "PASS"


def test_form_factor_pcie_delivered_for_sxm() -> None:
    doc = doc_from({"query_gpu": SYN + "query-gpu_2x-a100-80gb-pcie-vm_r550.csv"})
    ff = one(judge(doc, {"form_factor": "sxm"}), "FORM_FACTOR")
    assert ff.severity == "FAIL"
    assert ff.message == "NVIDIA A100 80GB PCIe is PCIE, SXM ordered"


def _mig_csv() -> str:
    """Four DGX A100 GPUs, MIG mode on for GPUs 0 and 1 (as in the -L listing)."""
    lines = fixture(DGX_CSV).splitlines()[:5]
    for i in (1, 2):
        lines[i] = lines[i].replace(", Disabled, Default", ", Enabled, Default")
    return "\n".join(lines) + "\n"


def test_mig_enabled_fails_unless_allowed() -> None:
    doc = doc_from({"nvidia_smi_L": SYN + "nvidia-smi-L_a100-sxm4-80gb-mig_r535.txt"},
                   texts={"query_gpu": _mig_csv()})
    mig = one(judge(doc, {}), "MIG_ENABLED")
    assert mig.severity == "FAIL"
    assert "GPUs [0, 1]" in mig.message and "(5 MIG device(s))" in mig.message
    assert "slices, not whole GPUs" in mig.message
    assert "MIG_ENABLED" not in codes(judge(doc, {"mig_allowed": True}))


def test_no_mig_no_finding() -> None:
    doc = doc_from({"query_gpu": DGX_CSV})
    assert "MIG_ENABLED" not in codes(judge(doc, {}))


# --------------------------------------------------------------------------- topology

def test_pcie_only_topology_with_nvswitch_ordered() -> None:
    doc = doc_from({"query_gpu": DGX_CSV, "topo_m": SYN + "topo-m_8x-a100-pcie_r550.txt"})
    ic = one(judge(doc, {"interconnect": "nvswitch"}), "INTERCONNECT")
    assert ic.severity == "FAIL"
    assert ic.message.startswith("nvswitch ordered but 28 GPU pair(s) do not talk over NVLink: "
                                 "GPU0-GPU1 PIX, GPU0-GPU2 NODE")
    assert "GPU0-GPU4 SYS" in ic.message and ic.message.endswith("(+16 more)")
    assert len(ic.details["pairs"]) == 28 and [0, 1, "PIX"] in ic.details["pairs"]


def test_topo_mp_is_the_pcie_view_not_a_missing_nvlink() -> None:
    # `nvidia-smi topo -mp` prints the PCIe path of every pair, NVLink or not; its legend
    # has no `NV#` line (issue 30: an NVSwitch node's -mp read as -m gave a false FAIL)
    text = (REPO / "tests/fixtures" / SYN / "topo-m_8x-a100-pcie_r550.txt").read_text()
    mp = "".join(ln for ln in text.splitlines(keepends=True) if not ln.lstrip().startswith("NV#"))
    assert parsers.parse("topo-m", mp).pcie_only  # type: ignore[attr-defined]
    doc = doc_from({"query_gpu": DGX_CSV}, texts={"topo_m": mp})
    fs = judge(doc, {"interconnect": "nvswitch"})
    assert "INTERCONNECT" not in codes(fs)
    f = one(fs, "TOPOLOGY_UNKNOWN")
    assert f.severity == "WARN" and "topo -mp" in f.message and "PCIe-only" in f.message
    cmd = "root@node:~# nvidia-smi topo -mp\n" + text  # the command pasted above it says so too
    assert parsers.parse("topo-m", cmd).pcie_only  # type: ignore[attr-defined]
    assert not parsers.parse("topo-m", text).pcie_only  # type: ignore[attr-defined]


def test_a_cut_topo_mp_paste_is_refused_not_failed() -> None:
    text = (REPO / "tests/fixtures/public/topo-mp_8x-gpu-14nic-cut_deepep60.txt").read_text()
    with pytest.raises(ParseError, match=r"no row for GPU4.*topo -mp` paste: the PCIe-only"):
        parsers.parse("topo-m", text)


@pytest.mark.parametrize("topo", ["topo-m_dgx-a100_r535.txt", "topo-m_dgx-a100_r470.txt"])
def test_dgx_a100_topology_passes(topo: str) -> None:
    doc = doc_from({"query_gpu": DGX_CSV, "topo_m": SYN + topo})
    ic = one(judge(doc, {"interconnect": "nvswitch"}), "INTERCONNECT")
    assert (ic.severity, ic.message) == ("PASS", "every GPU pair on NVLink (NV12)")


def test_no_topology_matrix_is_a_warning() -> None:
    doc = doc_from({"query_gpu": DGX_CSV}, failed={"topo_m": (255, "topo not supported")})
    f = one(judge(doc, {"interconnect": "nvlink"}), "TOPOLOGY_UNKNOWN")
    assert f.severity == "WARN" and "NVLink could not be verified" in f.message


def test_p2p_not_supported() -> None:
    text = h200_text("topo_p2p_n").replace("\tOK\t", "\tNS\t")
    fs = judge(h200_doc(texts={"topo_p2p_n": text}), H200_ORDER)
    p2p = one(fs, "P2P_NOT_OK")
    assert (p2p.severity, p2p.message) == (
        "FAIL", "peer-to-peer not OK between 1 GPU pair(s): GPU0-GPU1 NS")


def test_p2p_chipset_not_supported_across_sockets() -> None:
    doc = doc_from({"query_gpu": PCIE40_CSV,
                    "topo_p2p_n": SYN + "topo-p2p-n_4x-a100-pcie_r470.txt"})
    p2p = one(judge(doc, {}), "P2P_NOT_OK")
    assert "4 GPU pair(s)" in p2p.message and "GPU0-GPU2 CNS" in p2p.message
    assert "GPU0-GPU1" not in p2p.message  # OK within a socket


def test_p2p_all_ok_no_finding() -> None:
    doc = doc_from({"query_gpu": DGX_CSV, "topo_p2p_n": SYN + "topo-p2p-n_dgx-a100_r535.txt"})
    assert "P2P_NOT_OK" not in codes(judge(doc, {}))


# --------------------------------------------------------------------------- health

def test_health_of_a_worn_pcie_box() -> None:
    fs = judge(doc_from({"query_gpu": PCIE40_CSV}), {})
    pcie = messages(fs, "PCIE_LINK_DEGRADED")
    assert any(m.startswith("GPU1 PCIe link Gen4 x8, capable of Gen4 x16") for m in pcie)
    assert any(m.startswith("GPU0 PCIe link Gen1 x16, capable of Gen4 x16") for m in pcie)
    assert all(f.severity == "WARN" for f in fs if f.code == "PCIE_LINK_DEGRADED")
    power = one(fs, "POWER_LIMIT_LOW")
    assert power.severity == "WARN"
    assert power.message.startswith("GPU1 power limit 200 W, the card allows 250 W")
    held = {m.split()[0]: m for m in messages(fs, "CLOCKS_HELD_BACK")}
    assert held["GPU1"] == ("GPU1 clocks held back: SwPowerCap, SwThermalSlowdown, "
                            "HwPowerBrakeSlowdown")
    assert held["GPU3"] == "GPU3 clocks held back: HwSlowdown"
    assert "GPU0" not in held  # GpuIdle is not a slowdown
    ecc = one(fs, "ECC_UNCORRECTABLE")
    assert ecc.severity == "FAIL" and ecc.message.startswith("GPU3 has 4 uncorrectable ECC")
    retired = one(fs, "RETIRED_PAGES_PENDING")
    assert retired.severity == "FAIL" and retired.message.startswith("GPU3 has retired pages")


def test_dgx_ecc_and_power_cap() -> None:
    fs = judge(doc_from({"query_gpu": DGX_CSV}), {})
    assert messages(fs, "ECC_UNCORRECTABLE")[0].startswith("GPU6 has 3 uncorrectable")
    assert messages(fs, "CLOCKS_HELD_BACK") == ["GPU5 clocks held back: SwPowerCap"]
    assert "RETIRED_PAGES_PENDING" not in codes(fs)  # [N/A] is unknown, not pending
    assert "PCIE_LINK_DEGRADED" not in codes(fs)


def test_pcie_below_order() -> None:
    fs = judge(doc_from({"query_gpu": DGX_CSV}), {"pcie": {"min_gen": 5}})
    below = messages(fs, "PCIE_BELOW_ORDER")
    assert len(below) == 8
    assert below[0] == "GPU0 PCIe Gen4 max, Gen5 ordered: the link can never reach it"
    assert {f.severity for f in fs if f.code == "PCIE_BELOW_ORDER"} == {"FAIL"}


def test_hot_gpu() -> None:
    csv = fixture(PCIE40_CSV).replace(", 82, 1005 MHz", ", 91, 1005 MHz")
    temp = one(judge(doc_from(texts={"query_gpu": csv}), {}), "TEMPERATURE_HIGH")
    assert temp.severity == "WARN" and temp.message.startswith("GPU1 at 91 C (> 85 C)")


def test_remapped_rows_pending_on_real_xml() -> None:
    xml = h200_text("nvidia_smi_q_xml").replace(
        "<remapped_row_pending>No</remapped_row_pending>",
        "<remapped_row_pending>Yes</remapped_row_pending>", 1)
    fs = judge(h200_doc(texts={"nvidia_smi_q_xml": xml}), H200_ORDER)
    rr = one(fs, "REMAPPED_ROWS")
    assert (rr.severity, rr.message) == ("FAIL", "GPU0 memory: row remapping pending")
    assert "REMAPPED_ROWS" not in codes(judge(h200_doc(), H200_ORDER))


def test_remapping_failure_on_old_driver_xml() -> None:
    """The XML's one GPU is bus 00000000:41:00.0, which the query CSV calls GPU1."""
    doc = doc_from({"query_gpu": PCIE40_CSV,
                    "nvidia_smi_q_xml": SYN + "nvidia-smi-q_a100-pcie-40gb_r470.xml"})
    fs = judge(doc, {"gpus_per_node": 4})
    rr = one(fs, "REMAPPED_ROWS")
    assert (rr.severity, rr.message) == ("FAIL", "GPU1 memory: a remapping failure")
    assert one(fs, "GPU_COUNT").message == "4 GPU(s) found, 4 ordered"  # merged, not 5


# --------------------------------------------------------------------------- torch

def _torch_json(count: int, cuda: str | None = "12.1", available: bool = True,
                version: str = "2.3.1+cu121") -> str:
    devs = [{"index": i, "name": "NVIDIA A100-SXM4-80GB", "memory_bytes": 85_100_000_000,
             "cc": [8, 0]} for i in range(count)]
    return json.dumps({"torch": version, "cuda": cuda, "nccl": "2.18.1" if cuda else None,
                       "available": available, "count": count, "devices": devs}) + "\n"


def test_torch_sees_fewer_gpus_than_nvidia_smi() -> None:
    doc = doc_from({"query_gpu": DGX_CSV}, texts={"torch": _torch_json(4)},
                   env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    f = one(judge(doc, {}), "TORCH_GPU_COUNT")
    assert f.severity == "FAIL"
    assert f.message.startswith("PyTorch sees 4 GPU(s), nvidia-smi 8. Likely causes: ")
    assert "CUDA_VISIBLE_DEVICES=0,1,2,3 hides GPUs" in f.message
    assert "the container mounts only some GPUs" in f.message
    assert f.details == {"torch": 4, "nvidia_smi": 8}


def test_a_gpu_hidden_by_cuda_visible_devices_is_the_only_cause_named() -> None:
    """CUDA_VISIBLE_DEVICES=8 in the shell on an 8-GPU node (indices 0..7): torch sees
    none and says it is not available, as it does whenever no device is visible; the
    finding names the variable alone, not a driver mismatch or the container."""
    doc = doc_from({"query_gpu": DGX_CSV},
                   texts={"torch": _torch_json(0, available=False)},
                   env={"CUDA_VISIBLE_DEVICES": "8"})
    f = one(judge(doc, {}), "TORCH_GPU_COUNT")
    assert f.severity == "FAIL"
    assert f.message == ("PyTorch sees 0 GPU(s), nvidia-smi 8. Likely cause: "
                         "CUDA_VISIBLE_DEVICES=8 hides every GPU (this node's are 0..7): "
                         "unset it, or name the GPUs in the node's env in the inventory")
    for hidden in ("", "-1", "9,0"):
        doc = doc_from({"query_gpu": DGX_CSV}, texts={"torch": _torch_json(0, available=False)},
                       env={"CUDA_VISIBLE_DEVICES": hidden})
        assert "hides every GPU" in one(judge(doc, {}), "TORCH_GPU_COUNT").message, hidden
    doc = doc_from({"query_gpu": DGX_CSV}, texts={"torch": _torch_json(0, available=False)},
                   env={"CUDA_VISIBLE_DEVICES": "0,1"})
    msg = one(judge(doc, {}), "TORCH_GPU_COUNT").message
    assert "hides GPUs" in msg and "driver/runtime mismatch" in msg


def test_torch_built_for_a_newer_cuda_than_the_driver() -> None:
    doc = doc_from({"query_gpu": DGX_CSV, "torch": SYN + "torch-info_no-cuda.txt"})
    f = one(judge(doc, {}), "TORCH_GPU_COUNT")
    assert "PyTorch sees 0 GPU(s), nvidia-smi 8" in f.message
    assert "driver/runtime mismatch: PyTorch was built for CUDA 12.1" in f.message
    assert "CUDA_VISIBLE_DEVICES" not in f.message and "CPU-only" not in f.message


def test_cpu_only_torch() -> None:
    doc = doc_from({"query_gpu": DGX_CSV},
                   texts={"torch": _torch_json(0, cuda=None, available=False,
                                               version="2.3.1+cpu")})
    f = one(judge(doc, {}), "TORCH_GPU_COUNT")
    assert f.severity == "FAIL" and "this PyTorch is a CPU-only build" in f.message


def test_torch_not_importable() -> None:
    doc = doc_from({"query_gpu": DGX_CSV},
                   failed={"torch": (1, "Traceback (most recent call last):\n"
                                        "ModuleNotFoundError: No module named 'torch'\n")})
    f = one(judge(doc, {}), "TORCH_UNAVAILABLE")
    assert f.severity == "WARN"
    assert f.message == ("PyTorch could not be imported with /usr/bin/python3: "
                         "ModuleNotFoundError: No module named 'torch'")


# --------------------------------------------------------------------------- build tools

def test_build_tools_all_missing() -> None:
    doc = doc_from({"query_gpu": DGX_CSV}, tools={"nvcc": None, "mpirun": None},
                   nccl=NO_NCCL, mpi=NO_MPI)
    f = one(judge(doc, {}), "BUILD_TOOLS")
    assert f.severity == "WARN"
    assert f.message.startswith("nccl-tests cannot build (multi-node) without: ")
    assert "nvcc (install the CUDA toolkit" in f.message
    # no nvcc and no driver CUDA version seen: the wheel's CUDA major cannot be named
    assert "NCCL headers (libnccl-dev, or pip nvidia-nccl-cu<CUDA major>)" in f.message
    assert "MPI for multi-node runs" in f.message


def test_build_tools_only_mpi_header_missing() -> None:
    doc = doc_from({"query_gpu": DGX_CSV}, tools=H200_TOOLS, nccl=H200_NCCL,
                   mpi={**H200_MPI, "mpi_h": []})
    f = one(judge(doc, {}), "BUILD_TOOLS")
    assert f.severity == "WARN" and "MPI" in f.message
    assert "nvcc" not in f.message and "NCCL headers" not in f.message


def test_build_tools_present() -> None:
    system_header = {**NO_NCCL, "headers": [{"path": "/usr/include/nccl.h", "exists": True,
                                             "version": "2.21.5"}]}
    for nccl in (H200_NCCL, system_header):
        doc = doc_from({"query_gpu": DGX_CSV}, tools=H200_TOOLS, nccl=nccl, mpi=H200_MPI)
        f = one(judge(doc, {}), "BUILD_TOOLS")
        assert (f.severity, f.message) == ("PASS", "nvcc, NCCL headers and MPI present")


# --------------------------------------------------------------------------- fabric

def test_ib_port_in_init() -> None:
    doc = doc_from({"query_gpu": DGX_CSV, "ibv_devinfo": SYN + "ibv_devinfo_dgx-a100.txt"})
    fs = judge(doc, {"fabric": {"type": "ib", "nics": 10}})
    down = one(fs, "IB_PORT_DOWN")
    assert (down.severity, down.message) == ("FAIL", "RDMA ports not ACTIVE: mlx5_3:1 PORT_INIT")
    count = one(fs, "IB_PORT_COUNT")
    assert count.message == "9 active InfiniBand port(s), 10 ordered"


def test_ib_all_active_passes() -> None:
    text = fixture(SYN + "ibv_devinfo_dgx-a100.txt").replace("PORT_INIT (2)", "PORT_ACTIVE (4)")
    fs = judge(doc_from({"query_gpu": DGX_CSV}, texts={"ibv_devinfo": text}),
               {"fabric": {"type": "ib", "nics": 10}})
    assert (one(fs, "IB_PORTS").severity, one(fs, "IB_PORTS").message) == (
        "PASS", "10 InfiniBand port(s) ACTIVE")


@pytest.mark.parametrize("how", ["none", "missing"])
def test_ib_ordered_but_no_devices(how: str) -> None:
    if how == "none":
        doc = doc_from({"query_gpu": DGX_CSV, "ibv_devinfo": SYN + "ibv_devinfo_none.txt"})
    else:
        doc = doc_from({"query_gpu": DGX_CSV}, missing=["ibv_devinfo"])
    f = one(judge(doc, {"fabric": {"type": "ib"}}), "IB_MISSING")
    assert f.severity == "FAIL"
    assert f.message.startswith("ib ordered but no RDMA device found")
    assert "fall back to TCP sockets" in f.message


def test_ib_rate_below_order() -> None:
    doc = doc_from({"query_gpu": DGX_CSV, "ibv_devinfo": SYN + "ibv_devinfo-v_hdr-roce.txt"})
    fs = judge(doc, {"fabric": {"type": "ib", "rate_gbps": 400}})
    rate = one(fs, "IB_RATE_LOW")
    assert (rate.severity, rate.message) == (
        "FAIL", "ports slower than the 400 Gb/s ordered: mlx5_0:1 200 Gb/s")
    assert one(fs, "IB_PORT_DOWN").message == "RDMA ports not ACTIVE: mlx5_1:1 PORT_DOWN"
    # HDR as ordered: no rate finding
    assert "IB_RATE_LOW" not in codes(judge(doc, {"fabric": {"type": "ib", "rate_gbps": 200}}))


def test_roce_looks_only_at_ethernet_ports() -> None:
    doc = doc_from({"query_gpu": DGX_CSV, "ibv_devinfo": SYN + "ibv_devinfo-v_hdr-roce.txt"})
    fs = judge(doc, {"fabric": {"type": "roce", "nics": 1, "rate_gbps": 100}})
    assert (one(fs, "IB_PORTS").severity, one(fs, "IB_PORTS").message) == (
        "PASS", "1 Ethernet port(s) ACTIVE")
    assert "IB_PORT_DOWN" not in codes(fs)  # the down port is InfiniBand


# --------------------------------------------------------------------------- storage

def _ckpt(info: dict[str, Any]) -> list[Finding]:
    doc = doc_from({"query_gpu": DGX_CSV, "df": "h200x2/commands/df.txt"},
                   paths={"work_dir": path_info("/home/ubuntu/gpuvet"), "ckpt_dir": info})
    return [f for f in judge(doc, {}) if f.code.startswith("CKPT_DIR")]


@pytest.mark.parametrize("info,where", [
    (path_info("/mnt/ckpt", "tmpfs", "/mnt", source="tmpfs"), "on tmpfs (/mnt)"),
    (path_info("/workspace/ckpt", "overlay", "/", source="overlay"), "on overlay (/)"),
    (path_info("/tmp/ckpt", "ext4", "/"), "under a scratch path, on ext4 (/)"),
    (path_info("/data/ckpt", "ext4", "/", realpath="/dev/shm/ckpt"),
     "under a scratch path, on ext4 (/)"),
])
def test_ckpt_dir_ephemeral(info: dict[str, Any], where: str) -> None:
    (f,) = _ckpt(info)
    assert (f.code, f.severity) == ("CKPT_DIR_EPHEMERAL", "WARN")
    assert f.message.startswith(f"checkpoint directory {info['path']} is {where}: it vanishes")
    assert f.evidence == []  # judged without an out_dir: no evidence files


def test_ckpt_dir_missing_or_read_only() -> None:
    (f,) = _ckpt(path_info("/mnt/persistent/ckpt", exists=False, writable=False))
    assert (f.code, f.severity) == ("CKPT_DIR_UNUSABLE", "WARN")
    assert f.message == "checkpoint directory /mnt/persistent/ckpt does not exist"
    (f,) = _ckpt(path_info("/mnt/persistent/ckpt", writable=False))
    assert f.message == "checkpoint directory /mnt/persistent/ckpt is not writable"


def test_a_missing_ckpt_dir_is_judged_by_where_it_would_be_made() -> None:
    """ckpt_dir on /dev/shm, not made yet (the training step makes it): preflight says the
    checkpoints would vanish with the instance, not only that the folder is missing."""
    info = dict(path_info("/dev/shm/gpuvet-ckpt", "tmpfs", "/dev/shm", source="tmpfs",
                          exists=False, writable=False), creatable=True,
                stat_path="/dev/shm")
    (f,) = _ckpt(info)
    assert (f.code, f.severity) == ("CKPT_DIR_EPHEMERAL", "WARN")
    assert f.message == ("checkpoint directory /dev/shm/gpuvet-ckpt (to be made by the "
                         "training step) is on tmpfs (/dev/shm): it vanishes with the "
                         "instance; point ckpt_dir at persistent storage")
    (f,) = _ckpt(dict(info, creatable=False))
    assert (f.code, f.message) == ("CKPT_DIR_UNUSABLE", "checkpoint directory "
                                   "/dev/shm/gpuvet-ckpt does not exist and cannot be "
                                   "created under /dev/shm")


def test_ckpt_dir_persistent() -> None:
    (f,) = _ckpt(path_info("/mnt/persistent/ckpt", "ext4", "/mnt/persistent"))
    assert (f.code, f.severity, f.message) == (
        "CKPT_DIR", "PASS", "checkpoint directory /mnt/persistent/ckpt on ext4 (/mnt/persistent)")


# --------------------------------------------------------------------------- driver

NVSMI_IDS = ["nvidia_smi", "nvidia_smi_version", "nvidia_smi_L", "nvidia_smi_q_xml",
             "query_gpu", "topo_m", "topo_p2p_n", "nvlink_s"]
GPU_CODES = {"GPU_COUNT", "GPU_MODEL", "GPU_MEMORY", "FORM_FACTOR", "INTERCONNECT",
             "TOPOLOGY_UNKNOWN", "MIG_ENABLED", "TORCH_SEES_GPUS", "TORCH_GPU_COUNT",
             "TORCH_UNAVAILABLE", "BUILD_TOOLS", "PCIE_LINK_DEGRADED", "POWER_LIMIT_LOW"}


def test_nvidia_smi_missing() -> None:
    fs = judge(h200_doc(missing=NVSMI_IDS), H200_ORDER)
    f = one(fs, "NVIDIA_DRIVER_MISSING")
    assert f.severity == "FAIL"
    assert f.message == ("nvidia-smi is not installed or not on PATH: no NVIDIA driver on this "
                         "node; GPU checks skipped")
    assert not GPU_CODES & set(codes(fs))
    assert one(fs, "CKPT_DIR").severity == "PASS"  # non-GPU checks still run


def test_nvidia_smi_hung_or_failing() -> None:
    hung = one(judge(h200_doc(timed_out=NVSMI_IDS), H200_ORDER), "NVIDIA_DRIVER_MISSING")
    assert hung.message.startswith("nvidia-smi hung (timed out)")
    msg = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
           "Make sure that the latest NVIDIA driver is installed and running.")
    doc = h200_doc(failed={c: (9, "") for c in NVSMI_IDS})
    for c in NVSMI_IDS:
        doc["commands"][c]["stdout"] = msg + "\n"
    f = one(judge(doc, H200_ORDER), "NVIDIA_DRIVER_MISSING")
    assert f.message == f"nvidia-smi failed (exit 9): {msg}; GPU checks skipped"


# --------------------------------------------------------------------------- provider

def _facts(doc: dict[str, Any], name: str) -> checks.NodeFacts:
    inv = inventory(H200_ORDER, nodes=["node-a", "node-b"])
    return judge_document(doc, inv.node(name), inv, "run-1", None).facts


def test_version_drift_between_nodes() -> None:
    csv = h200_text("query_gpu").replace("580.159.04", "570.86.15")
    a = _facts(h200_doc(), "node-a")
    b = _facts(h200_doc(texts={"query_gpu": csv}), "node-b")
    (f,) = checks.provider_results([a, b])
    assert (f.code, f.severity) == ("VERSION_DRIFT", "WARN")
    assert f.message == "nodes differ in driver: node-a=580.159.04, node-b=570.86.15"
    assert f.details["versions"] == {"node-a": "580.159.04", "node-b": "570.86.15"}


def test_version_drift_names_a_missing_component() -> None:
    a = _facts(h200_doc(), "node-a")
    b = _facts(h200_doc(missing=["nvcc_version"]), "node-b")
    (f,) = checks.provider_results([a, b])
    assert f.message == "nodes differ in nvcc: node-a=13.0, node-b=missing"


def test_identical_nodes_no_drift() -> None:
    a, b = _facts(h200_doc(), "node-a"), _facts(h200_doc(), "node-b")
    assert checks.versions(a) == {"driver": "580.159.04", "cuda_driver": "13.0", "nvcc": "13.0",
                                  "nccl": "2.28.9", "torch": "2.11.0+cu130"}
    assert checks.provider_results([a, b]) == []
    assert checks.provider_results([a]) == []


# --------------------------------------------------------------------------- name tables

@pytest.mark.parametrize("expected,actual,ok", [
    ("A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", True),
    ("A100-SXM4-80GB", "NVIDIA A100-SXM4-40GB", False),
    ("A100 80GB", "NVIDIA A100 80GB PCIe", True),
    ("A100 80GB", "NVIDIA A100-PCIE-40GB", False),
    ("H100", "NVIDIA H100 80GB HBM3", True),
    ("H200", "NVIDIA H200", True),
    ("H100", "NVIDIA H200", False),
    ("A100", "A100-SXM4-40GB", True),  # R450 names have no NVIDIA prefix
    ("nvidia a100", "NVIDIA A100-SXM4-80GB", True),
    ("RTX 4090", "NVIDIA GeForce RTX 4090", True),
    ("RTX4090", "NVIDIA GeForce RTX 4090", True),
    ("L4", "NVIDIA L40S", False),
    ("L40S", "NVIDIA L40S", True),
    ("A10", "NVIDIA A100-SXM4-80GB", False),
    ("A10", "NVIDIA A10", True),
    ("", "NVIDIA H200", False),
    # the maker run on into the model, as orders are sometimes written
    ("TeslaV100", "Tesla V100-SXM2-16GB", True),
    ("Tesla V100", "Tesla V100-SXM2-16GB", True),
    ("NVIDIAA100", "NVIDIA A100-SXM4-80GB", True),
    ("TeslaV100", "Tesla P100-PCIE-16GB", False),
    ("Tesla", "Tesla V100-SXM2-16GB", False),  # no model at all
])
def test_model_matches(expected: str, actual: str, ok: bool) -> None:
    assert gpunames.model_matches(expected, actual) is ok


@pytest.mark.parametrize("name,ff", [
    ("NVIDIA A100-SXM4-80GB", "sxm"),
    ("A100-SXM4-40GB", "sxm"),
    ("NVIDIA A100 80GB PCIe", "pcie"),
    ("NVIDIA A100-PCIE-40GB", "pcie"),
    ("NVIDIA H100 PCIe", "pcie"),
    ("NVIDIA H100 NVL", "pcie"),
    ("NVIDIA H100 80GB HBM3", "sxm"),
    ("NVIDIA H200", "sxm"),
    ("NVIDIA L40S", "pcie"),  # a PCIe-only card: its variant says so
    ("NVIDIA GB200", "sxm"),
    ("NVIDIA Graphics Device", None),
    ("NVIDIA A800-SXM4-80GB", "sxm"),  # a variant open on its board: the name says it
])
def test_form_factor_of(name: str, ff: str | None) -> None:
    assert gpunames.form_factor_of(name) == ff


def test_ckpt_dir_not_in_inventory_is_not_judged() -> None:
    doc = doc_from({"query_gpu": DGX_CSV},
                   paths={"ckpt_dir": path_info("/tmp/payload-cwd", "ext4", "/")})
    inv = inventory({})
    node = inv.nodes[0].model_copy(update={"ckpt_dir": None})
    report = judge_document(doc, node, inv, "run-1", None)
    assert not [f for f in report.findings if f.code.startswith("CKPT_DIR")]


def test_cuda_visible_devices_from_the_inventory_is_deliberate() -> None:
    doc = doc_from({"query_gpu": "h200x2/commands/query-gpu.csv"},
                   texts={"torch": '{"torch": "2.11.0+cu130", "cuda": "13.0", "nccl": "2.28.9", '
                          '"available": true, "count": 1, "devices": []}'},
                   env={"CUDA_VISIBLE_DEVICES": "1"})
    inv = inventory({})
    sim = inv.nodes[0].model_copy(update={"env": {"CUDA_VISIBLE_DEVICES": "1"}})
    (f,) = [f for f in judge_document(doc, sim, inv, "run-1", None).findings
            if f.code.startswith("TORCH")]
    assert (f.code, f.severity) == ("TORCH_SEES_GPUS", "PASS")
    assert "CUDA_VISIBLE_DEVICES=1 from the inventory" in f.message
    # the same count without the inventory asking for it is a fault
    (g,) = [f for f in judge_document(doc, inv.nodes[0], inv, "run-1", None).findings
            if f.code.startswith("TORCH")]
    assert (g.code, g.severity) == ("TORCH_GPU_COUNT", "FAIL")


def test_listing_without_details_is_a_fail_not_a_silent_pass() -> None:
    doc = doc_from({"nvidia_smi_L": "h200x2/commands/nvidia-smi-L.txt"},
                   texts={"query_gpu": "garbage that is not CSV\n1,2\n"})
    findings = judge(doc, H200_ORDER)
    (f,) = [f for f in findings if f.code == "GPU_DETAILS_MISSING"]
    assert f.severity == "FAIL" and "were not checked" in f.message
    assert not [f for f in findings if f.code == "GPU_COUNT"]


# --------------------------------------------------------------------------- any source

PUB = "public/"


def _nf(facts: dict[str, Any]) -> checks.NodeFacts:
    """Facts a collect document does not produce (e.g. pasted `nvidia-smi -q` text)."""
    return checks.NodeFacts(node="node-a", provider="prov", doc={"commands": {}}, facts=facts)


def _results(nf: checks.NodeFacts, expect: dict[str, Any]) -> list[checks.Result]:
    from orchestrator.inventory import Expectations
    from orchestrator.suite import Suite
    return checks.node_results(nf, Expectations.model_validate(expect), Suite().preflight)


def test_memory_tolerance_pinned_48gb_order_40gb_card() -> None:
    """39.6 GiB is not a 48 GB card: a tolerance loosened to 0.80 would pass it."""
    mem = one(judge(doc_from({"query_gpu": PCIE40_CSV}), {"memory_per_gpu_gb": 48}), "GPU_MEMORY")
    assert mem.severity == "FAIL" and "GPU0 39.6 GiB" in mem.message
    assert gpu.MEMORY_TOLERANCE == 0.93


def test_memory_from_the_default_table_when_there_is_no_query() -> None:
    doc = doc_from({"nvidia_smi": PUB + "nvidia-smi_8x-h100-80gb-hbm3_r550.txt"})
    fs = judge(doc, {"memory_per_gpu_gb": 141, "gpus_per_node": 8, "gpu_model": "H100"})
    mem = one(fs, "GPU_MEMORY")
    assert mem.severity == "FAIL" and mem.message.startswith(
        "GPU memory below the 141 GB ordered: GPU0 79.6 GiB")
    assert one(fs, "GPU_COUNT").severity == "PASS" and one(fs, "GPU_MODEL").severity == "PASS"
    assert "NVIDIA_DRIVER_MISSING" not in codes(fs)


def test_memory_from_the_xml_and_from_q_text() -> None:
    doc = doc_from({"nvidia_smi_q_xml": SYN + "nvidia-smi-q_a100-sxm4-40gb-mig_r535.xml"})
    assert one(judge(doc, {"memory_per_gpu_gb": 80}), "GPU_MEMORY").severity == "FAIL"
    q = parsers.parse("nvidia-smi-q", fixture(PUB + "nvidia-smi-a_8x-a100-sxm4-40gb_r535.txt"))
    rs = _results(_nf({"nvidia_smi_q": q}), {"memory_per_gpu_gb": 80, "gpus_per_node": 8})
    mem = next(r for r in rs if r.code == "GPU_MEMORY")
    assert mem.severity == "FAIL" and mem.message.endswith("GPU7 40.0 GiB")
    assert next(r for r in rs if r.code == "GPU_COUNT").severity == "PASS"


def test_excerpt_of_one_gpu_counts_every_attached_gpu() -> None:
    q = parsers.parse("nvidia-smi-q", fixture(PUB + "nvidia-smi-q-i0_a100-sxm4-40gb_r535.txt"))
    rs = _results(_nf({"nvidia_smi_q": q}), {"gpus_per_node": 8})
    assert next(r for r in rs if r.code == "GPU_COUNT").message == "8 GPU(s) found, 8 ordered"


def test_mig_seen_only_in_the_listing_is_reported() -> None:
    """No query CSV at all: the MIG lines of `nvidia-smi -L` alone must raise MIG_ENABLED."""
    doc = doc_from({"nvidia_smi_L": SYN + "nvidia-smi-L_a100-sxm4-80gb-mig_r535.txt"})
    fs = judge(doc, {})
    mig = one(fs, "MIG_ENABLED")
    assert mig.severity == "FAIL" and "GPUs [0, 1]" in mig.message and "(5 MIG" in mig.message
    assert one(fs, "GPU_DETAILS_MISSING").severity == "FAIL"
    # and with a query CSV whose MIG column says nothing useful ([N/A])
    doc = doc_from({"nvidia_smi_L": SYN + "nvidia-smi-L_a100-sxm4-80gb-mig_r535.txt",
                    "query_gpu": PCIE40_CSV})
    assert "GPUs [0, 1]" in one(judge(doc, {}), "MIG_ENABLED").message


def test_mig_from_a_published_table_and_mig_without_devices() -> None:
    doc = doc_from({"nvidia_smi": PUB + "nvidia-smi_h200-mig-load_r590.txt"})
    fs = judge(doc, {"gpus_per_node": 1})
    assert one(fs, "MIG_ENABLED").message.startswith("MIG is enabled on GPUs [0] (5 MIG device")
    assert "MIG_NO_DEVICES" not in codes(fs)
    xml = h200_text("nvidia_smi_q_xml").replace("<current_mig>Disabled</current_mig>",
                                                "<current_mig>Enabled</current_mig>", 1)
    fs = judge(h200_doc(texts={"nvidia_smi_q_xml": xml}), {**H200_ORDER, "mig_allowed": True})
    empty = one(fs, "MIG_NO_DEVICES")
    assert empty.severity == "FAIL" and "GPUs [0]" in empty.message
    assert "MIG_ENABLED" not in codes(fs)  # allowed, but still unusable without instances


def test_remapped_rows_pending_from_q_text() -> None:
    pending = "        Pending                           : "
    text = fixture(PUB + "nvidia-smi-q_8x-h100-80gb-hbm3_r535.txt").replace(
        pending + "No", pending + "Yes", 1)
    q = parsers.parse("nvidia-smi-q", text)
    rs = [r for r in _results(_nf({"nvidia_smi_q": q}), {}) if r.code == "REMAPPED_ROWS"]
    assert [(r.severity, r.message) for r in rs] == [("FAIL", "GPU0 memory: row remapping pending")]


def test_retired_pages_pending_from_the_xml_without_a_query() -> None:
    xml = h200_text("nvidia_smi_q_xml").replace(
        "<pending_retirement>N/A</pending_retirement>", "<pending_retirement>Yes</pending_retirement>",
        1)
    doc = h200_doc(texts={"nvidia_smi_q_xml": xml}, missing=["query_gpu"])
    rp = one(judge(doc, H200_ORDER), "RETIRED_PAGES_PENDING")
    assert rp.severity == "FAIL" and rp.message.startswith("GPU0 has retired pages pending")


def test_idle_downtraining_is_a_warning_that_says_so() -> None:
    q = parsers.parse("nvidia-smi-q", fixture(PUB + "nvidia-smi-q_titan-v_r560.txt"))
    rs = _results(_nf({"nvidia_smi_q": q}), {"pcie": {"min_gen": 3}})
    (deg,) = [r for r in rs if r.code == "PCIE_LINK_DEGRADED"]
    assert deg.severity == "WARN" and "an idle GPU may lower its generation" in deg.message
    assert deg.message.startswith("GPU0 PCIe link Gen1 x16, capable of Gen3 x16")
    assert not [r for r in rs if r.code == "PCIE_BELOW_ORDER"]  # Gen3 capable, Gen3 ordered


def test_slot_below_the_order_is_a_fail() -> None:
    q = parsers.parse("nvidia-smi-q", fixture(PUB + "nvidia-smi-a_8x-a100-sxm4-40gb_r535.txt"))
    rs = [r for r in _results(_nf({"nvidia_smi_q": q}), {"pcie": {"min_gen": 4}})
          if r.code == "PCIE_BELOW_ORDER"]
    assert len(rs) == 8 and {r.severity for r in rs} == {"FAIL"}
    assert rs[0].message == ("GPU0 PCIe Gen3 max, Gen4 ordered; the slot allows only Gen3: "
                             "the link can never reach it")


def test_narrow_link_below_the_order_is_a_fail() -> None:
    fs = judge(doc_from({"query_gpu": PCIE40_CSV}), {"pcie": {"min_width": 16}})
    below = [f for f in fs if f.code == "PCIE_BELOW_ORDER"]
    assert [(f.severity, f.message) for f in below] == [("FAIL", "GPU1 PCIe x8, x16 ordered")]


def test_power_cap_says_what_it_means_for_sustained_load() -> None:
    q = parsers.parse("nvidia-smi-q", fixture(PUB + "nvidia-smi-q_titan-v_r560.txt"))
    (pw,) = [r for r in _results(_nf({"nvidia_smi_q": q}), {}) if r.code == "POWER_LIMIT_LOW"]
    assert pw.severity == "WARN"
    assert pw.message.startswith("GPU0 power limit 250 W, the card allows 300 W")
    assert "Under sustained load the GPU is held at 83% of its power" in pw.message
    assert pw.details == {"limit_w": 250.0, "max_w": 300.0}


def test_unreadable_nvidia_smi_is_not_a_missing_driver() -> None:
    doc = doc_from(texts={"query_gpu": "GPU 0: fine, thanks\n"})
    fs = judge(doc, {})
    f = one(fs, "NVIDIA_SMI_UNREADABLE")
    assert f.severity == "FAIL" and f.message.startswith("nvidia-smi answered but its output "
                                                         "could not be read (query_gpu: ")
    assert "NVIDIA_DRIVER_MISSING" not in codes(fs)
    assert f.details["unreadable"].keys() == {"query_gpu"}


def test_gpu_error_cells_fail() -> None:
    csv = fixture(DGX_CSV).replace(", 81920 MiB,", ", [GPU requires reset],", 1)
    err = one(judge(doc_from(texts={"query_gpu": csv}), {}), "GPU_ERROR_STATE")
    assert err.severity == "FAIL" and err.message.startswith(
        "GPU0 reported errors instead of values (memory.total: [GPU requires reset])")


def test_nvlink_unknown_in_mig_mode_is_said() -> None:
    doc = h200_doc(files={"nvlink_s": PUB + "nvlink-s_h200-mig_r590.txt"})
    info = one(judge(doc, H200_ORDER), "NVLINK_UNKNOWN")
    assert info.severity == "INFO" and "not supported for Devices in MIG mode" in info.message


# --------------------------------------------------------------------------- ibstat

IBSTAT_DOWN = PUB + "ibstat_12x-cx7-cx6_some-down.txt"
IBSTAT_PANIC = PUB + "ibstat_8x-cx6_ibpanic.txt"


def test_ibstat_alone_feeds_the_fabric_checks() -> None:
    doc = doc_from({"query_gpu": DGX_CSV, "ibstat": IBSTAT_DOWN})
    fs = judge(doc, {"fabric": {"type": "ib", "nics": 8, "rate_gbps": 400}})
    assert (one(fs, "IB_PORTS").severity, one(fs, "IB_PORTS").message) == (
        "PASS", "8 InfiniBand port(s) ACTIVE")
    roce = judge(doc, {"fabric": {"type": "roce", "nics": 2, "rate_gbps": 100}})
    assert one(roce, "IB_PORT_DOWN").message == (
        "RDMA ports not ACTIVE: mlx5_2:1 PORT_DOWN, mlx5_7:1 PORT_DOWN, mlx5_8:1 PORT_DOWN")
    assert one(roce, "IB_PORT_COUNT").message == "1 active Ethernet port(s), 2 ordered"


def test_ibstat_rate_below_the_order_and_a_listing_cut_short() -> None:
    doc = doc_from({"query_gpu": DGX_CSV, "ibstat": IBSTAT_PANIC})
    fs = judge(doc, {"fabric": {"type": "ib", "nics": 8, "rate_gbps": 400}})
    rate = one(fs, "IB_RATE_LOW")
    assert rate.severity == "FAIL" and rate.message.startswith(
        "ports slower than the 400 Gb/s ordered: mlx5_0:1 200 Gb/s")
    cut = one(fs, "IB_LISTING_INCOMPLETE")
    assert cut.severity == "WARN" and "stat of IB device 'mlx5_8' failed" in cut.message
    assert "IB_PORTS" not in codes(fs)


def test_ibv_devinfo_without_rate_takes_it_from_ibstat() -> None:
    doc = doc_from({"query_gpu": DGX_CSV, "ibv_devinfo": SYN + "ibv_devinfo_dgx-a100.txt"})
    fs = judge(doc, {"fabric": {"type": "ib", "rate_gbps": 200}})
    assert one(fs, "IB_RATE_UNKNOWN").severity == "WARN"
    assert "IB_RATE_LOW" not in codes(fs)
