"""Every finding the preflight checks make, whole, for documents from rented-fleet shapes.

The findings are what a person reads about a node (and what comparisons group
by): each scenario pins the complete list (code, severity, message, evidence,
details). A deliberate change of wording changes EXPECTED with it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from collectdoc import H200_ORDER, NO_MPI, NO_NCCL, doc_from, fixture, h200_doc, h200_text, inventory

from orchestrator.records import Finding
from orchestrator.steps.preflight.step import judge_document

SYN = "synthetic/"
DGX_CSV = SYN + "query-gpu_dgx-a100-80gb_r535.csv"
PCIE40_CSV = SYN + "query-gpu_4x-a100-pcie-40gb_r470.csv"
A100_ORDER: dict[str, Any] = {"gpu_model": "A100-SXM4-80GB", "gpus_per_node": 8,
                              "memory_per_gpu_gb": 80, "form_factor": "sxm",
                              "interconnect": "nvswitch"}
TORCH_4 = ('{"torch": "2.3.1+cu121", "cuda": "12.1", "nccl": "2.18.1", "available": true, '
           '"count": 4, "devices": []}\n')


def judge(doc: dict[str, Any], expect: dict[str, Any]) -> list[Finding]:
    inv = inventory(expect, nodes=["node-a"])
    return judge_document(doc, inv.node("node-a"), inv, "run-1", None).findings


def mig_csv() -> str:
    lines = fixture(DGX_CSV).splitlines()[:5]
    for i in (1, 2):
        lines[i] = lines[i].replace(", Disabled, Default", ", Enabled, Default")
    return "\n".join(lines) + "\n"


SCENARIOS: dict[str, Callable[[], list[Finding]]] = {
    "h200_own_order": lambda: judge(h200_doc(), H200_ORDER),
    "h200_for_a100_order": lambda: judge(h200_doc(), A100_ORDER),
    "a100_40gb_sold_as_80gb": lambda: judge(doc_from({"query_gpu": PCIE40_CSV}), {
        "gpu_model": "A100 80GB", "gpus_per_node": 4, "memory_per_gpu_gb": 80,
        "form_factor": "sxm", "pcie": {"min_gen": 4, "min_width": 16}}),
    "pcie_vm_for_sxm": lambda: judge(doc_from(
        {"query_gpu": SYN + "query-gpu_2x-a100-80gb-pcie-vm_r550.csv"}), {"form_factor": "sxm"}),
    "dgx_gen5_ordered": lambda: judge(doc_from({"query_gpu": DGX_CSV}), {"pcie": {"min_gen": 5}}),
    "mig": lambda: judge(doc_from({"nvidia_smi_L": SYN + "nvidia-smi-L_a100-sxm4-80gb-mig_r535.txt"},
                                  texts={"query_gpu": mig_csv()}), {}),
    "pcie_topology_for_nvswitch": lambda: judge(doc_from(
        {"query_gpu": DGX_CSV, "topo_m": SYN + "topo-m_8x-a100-pcie_r550.txt"}),
        {"interconnect": "nvswitch"}),
    "no_topology": lambda: judge(doc_from({"query_gpu": DGX_CSV},
                                          failed={"topo_m": (255, "topo not supported")}),
                                 {"interconnect": "nvlink"}),
    "p2p_ns": lambda: judge(h200_doc(texts={"topo_p2p_n": h200_text("topo_p2p_n").replace(
        "\tOK\t", "\tNS\t")}), H200_ORDER),
    "torch_sees_four": lambda: judge(doc_from({"query_gpu": DGX_CSV}, texts={"torch": TORCH_4},
                                              env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"}), {}),
    "torch_missing": lambda: judge(doc_from({"query_gpu": DGX_CSV}, failed={"torch": (
        1, "Traceback (most recent call last):\nModuleNotFoundError: No module named 'torch'\n")}),
        {}),
    "no_build_tools": lambda: judge(doc_from({"query_gpu": DGX_CSV},
                                             tools={"nvcc": None, "mpirun": None},
                                             nccl=NO_NCCL, mpi=NO_MPI), {}),
}


def described(findings: list[Finding]) -> list[dict[str, Any]]:
    return [{"code": f.code, "severity": f.severity, "message": f.message,
             "evidence": f.evidence, "details": f.details} for f in findings]


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_findings_are_exactly(name: str) -> None:
    assert described(SCENARIOS[name]()) == EXPECTED[name]


EXPECTED: dict[str, list[dict[str, Any]]] = {'h200_own_order': [{'code': 'GPU_COUNT',
                     'severity': 'PASS',
                     'message': '2 GPU(s) found, 2 ordered',
                     'evidence': [],
                     'details': {'found': 2, 'ordered': 2}},
                    {'code': 'GPU_MODEL',
                     'severity': 'PASS',
                     'message': 'NVIDIA H200 matches H200 SXM 141GB (ordered H200)',
                     'evidence': [],
                     'details': {'ordered': ['H200 NVL 141GB', 'H200 SXM 141GB'],
                                 'matched': ['H200 SXM 141GB']}},
                    {'code': 'GPU_MEMORY',
                     'severity': 'PASS',
                     'message': 'every GPU has >= 141 GB',
                     'evidence': [],
                     'details': {}},
                    {'code': 'FORM_FACTOR',
                     'severity': 'PASS',
                     'message': 'SXM as ordered',
                     'evidence': [],
                     'details': {}},
                    {'code': 'INTERCONNECT',
                     'severity': 'PASS',
                     'message': 'every GPU pair on NVLink (NV18)',
                     'evidence': [],
                     'details': {}},
                    {'code': 'TORCH_SEES_GPUS',
                     'severity': 'PASS',
                     'message': 'PyTorch 2.11.0+cu130 sees 2 GPU(s), CUDA 13.0',
                     'evidence': [],
                     'details': {}},
                    {'code': 'BUILD_TOOLS',
                     'severity': 'PASS',
                     'message': 'nvcc, NCCL headers and MPI present',
                     'evidence': [],
                     'details': {}},
                    {'code': 'CKPT_DIR',
                     'severity': 'PASS',
                     'message': 'checkpoint directory /home/ubuntu/gpuvet/ckpt on ext4 (/)',
                     'evidence': [],
                     'details': {}},
                    {'code': 'TORCH_ORDER',
                     'details': {'count': 2, 'wrong': []},
                     'evidence': [],
                     'message': 'PyTorch 2.11.0+cu130 sees GPU0 NVIDIA H200 139.8 GiB, GPU1 '
                                'NVIDIA H200 139.8 GiB as ordered (2 GPU(s), H200, >= 141 GB)',
                     'severity': 'PASS'},
                    {'code': 'FABRIC_STATE',
                     'details': {},
                     'evidence': [],
                     'message': 'every GPU registered with the NVLink fabric (2 GPU(s): State '
                                'Completed, Status Success)',
                     'severity': 'PASS'}],
 'h200_for_a100_order': [{'code': 'GPU_COUNT',
                          'severity': 'FAIL',
                          'message': '2 GPU(s) found, 8 ordered',
                          'evidence': [],
                          'details': {'found': 2, 'ordered': 8}},
                         {'code': 'GPU_MODEL',
                          'severity': 'FAIL',
                          'message': 'GPU model differs from the order (A100-SXM4-80GB): GPU0 '
                                     'NVIDIA H200 (H200 SXM 141GB), GPU1 NVIDIA H200 (H200 '
                                     'SXM 141GB); the order allows A100 SXM 80GB',
                          'evidence': [],
                          'details': {'ordered': ['A100 SXM 80GB'], 'matched': []}},
                         {'code': 'GPU_MEMORY',
                          'severity': 'PASS',
                          'message': 'every GPU has >= 80 GB',
                          'evidence': [],
                          'details': {}},
                         {'code': 'FORM_FACTOR',
                          'severity': 'PASS',
                          'message': 'SXM as ordered',
                          'evidence': [],
                          'details': {}},
                         {'code': 'INTERCONNECT',
                          'severity': 'PASS',
                          'message': 'every GPU pair on NVLink (NV18)',
                          'evidence': [],
                          'details': {}},
                         {'code': 'TORCH_SEES_GPUS',
                          'severity': 'PASS',
                          'message': 'PyTorch 2.11.0+cu130 sees 2 GPU(s), CUDA 13.0',
                          'evidence': [],
                          'details': {}},
                         {'code': 'BUILD_TOOLS',
                          'severity': 'PASS',
                          'message': 'nvcc, NCCL headers and MPI present',
                          'evidence': [],
                          'details': {}},
                         {'code': 'CKPT_DIR',
                          'severity': 'PASS',
                          'message': 'checkpoint directory /home/ubuntu/gpuvet/ckpt on ext4 '
                                     '(/)',
                          'evidence': [],
                          'details': {}},
                         {'code': 'TORCH_ORDER',
                          'details': {'count': 2,
                                      'wrong': ['2 GPU(s), 8 ordered',
                                                'GPU0 is NVIDIA H200, A100-SXM4-80GB ordered',
                                                'GPU1 is NVIDIA H200, A100-SXM4-80GB '
                                                'ordered']},
                          'evidence': [],
                          'message': 'PyTorch 2.11.0+cu130 does not see what was ordered: 2 '
                                     'GPU(s), 8 ordered; GPU0 is NVIDIA H200, A100-SXM4-80GB '
                                     'ordered; GPU1 is NVIDIA H200, A100-SXM4-80GB ordered '
                                     '(it sees GPU0 NVIDIA H200 139.8 GiB, GPU1 NVIDIA H200 '
                                     '139.8 GiB)',
                          'severity': 'FAIL'},
                         {'code': 'FABRIC_STATE',
                          'details': {},
                          'evidence': [],
                          'message': 'every GPU registered with the NVLink fabric (2 GPU(s): '
                                     'State Completed, Status Success)',
                          'severity': 'PASS'}],
 'a100_40gb_sold_as_80gb': [{'code': 'GPU_COUNT',
                             'severity': 'PASS',
                             'message': '4 GPU(s) found, 4 ordered',
                             'evidence': [],
                             'details': {'found': 4, 'ordered': 4}},
                            {'code': 'GPU_MODEL',
                             'severity': 'FAIL',
                             'message': 'GPU model differs from the order (A100 80GB): GPU0 '
                                        'NVIDIA A100-PCIE-40GB (A100 PCIe 40GB), GPU1 NVIDIA '
                                        'A100-PCIE-40GB (A100 PCIe 40GB), GPU2 NVIDIA '
                                        'A100-PCIE-40GB (A100 PCIe 40GB), GPU3 NVIDIA '
                                        'A100-PCIE-40GB (A100 PCIe 40GB); the order allows '
                                        'A100 SXM 80GB, A100 PCIe 80GB',
                             'evidence': [],
                             'details': {'ordered': ['A100 SXM 80GB', 'A100 PCIe 80GB'],
                                         'matched': []}},
                            {'code': 'GPU_MEMORY',
                             'severity': 'FAIL',
                             'message': 'GPU memory below the 80 GB ordered: GPU0 39.6 GiB, '
                                        'GPU1 39.6 GiB, GPU2 39.6 GiB, GPU3 39.6 GiB',
                             'evidence': [],
                             'details': {}},
                            {'code': 'FORM_FACTOR',
                             'severity': 'FAIL',
                             'message': 'NVIDIA A100-PCIE-40GB is PCIE, SXM ordered',
                             'evidence': [],
                             'details': {}},
                            {'code': 'PCIE_LINK_DEGRADED',
                             'severity': 'WARN',
                             'message': 'GPU0 PCIe link Gen1 x16, capable of Gen4 x16 (an '
                                        'idle GPU may lower its generation to save power; a '
                                        'narrower width is not that)',
                             'evidence': [],
                             'details': {}},
                            {'code': 'PCIE_LINK_DEGRADED',
                             'severity': 'WARN',
                             'message': 'GPU1 PCIe link Gen4 x8, capable of Gen4 x16 (an idle '
                                        'GPU may lower its generation to save power; a '
                                        'narrower width is not that)',
                             'evidence': [],
                             'details': {}},
                            {'code': 'PCIE_BELOW_ORDER',
                             'severity': 'FAIL',
                             'message': 'GPU1 PCIe x8, x16 ordered',
                             'evidence': [],
                             'details': {}},
                            {'code': 'POWER_LIMIT_LOW',
                             'severity': 'WARN',
                             'message': 'GPU1 power limit 200 W, the card allows 250 W: '
                                        'expect lower clocks. Under sustained load the GPU is '
                                        'held at 80% of its power, so long jobs run slower '
                                        'than on a full-power card of the same model; ask for '
                                        'the limit to be raised or price it in',
                             'evidence': [],
                             'details': {'limit_w': 200.0, 'max_w': 250.0}},
                            {'code': 'CLOCKS_HELD_BACK',
                             'severity': 'WARN',
                             'message': 'GPU1 clocks held back: SwPowerCap, '
                                        'SwThermalSlowdown, HwPowerBrakeSlowdown',
                             'evidence': [],
                             'details': {}},
                            {'code': 'CLOCKS_HELD_BACK',
                             'severity': 'WARN',
                             'message': 'GPU3 clocks held back: HwSlowdown',
                             'evidence': [],
                             'details': {}},
                            {'code': 'ECC_UNCORRECTABLE',
                             'severity': 'FAIL',
                             'message': 'GPU3 has 4 uncorrectable ECC error(s): ask the '
                                        'provider for another node',
                             'evidence': [],
                             'details': {}},
                            {'code': 'RETIRED_PAGES_PENDING',
                             'severity': 'FAIL',
                             'message': 'GPU3 has retired pages pending: the GPU needs a '
                                        'reset before its memory can be trusted',
                             'evidence': [],
                             'details': {}},
                            {'code': 'TORCH_UNAVAILABLE',
                             'severity': 'WARN',
                             'message': 'PyTorch could not be imported with /usr/bin/python3: '
                                        'no output',
                             'evidence': [],
                             'details': {}},
                            {'code': 'BUILD_TOOLS',
                             'severity': 'WARN',
                             'message': 'nccl-tests cannot build (multi-node) without: nvcc '
                                        '(install the CUDA toolkit, e.g. cuda-toolkit-12-x); '
                                        'NCCL headers (libnccl-dev, or pip '
                                        'nvidia-nccl-cu<CUDA major>); MPI for multi-node runs '
                                        '(openmpi-bin libopenmpi-dev)',
                             'evidence': [],
                             'details': {}},
                            {'code': 'CKPT_DIR',
                             'severity': 'PASS',
                             'message': 'checkpoint directory /home/ubuntu/gpuvet/ckpt on '
                                        'ext4 (/)',
                             'evidence': [],
                             'details': {}},
                            {'code': 'GPU_BUSY',
                             'severity': 'FAIL',
                             'message': 'GPU 1 has 37412 MiB in use before gpuvet ran and no '
                                        'process this node can see holds it (another '
                                        "container's job?): every figure measured on it is "
                                        "not the card's. Ask the provider for a free GPU",
                             'evidence': [],
                             'details': {'gpu': 'GPU 1',
                                         'processes': [],
                                         'held_mib': 0,
                                         'memory_used_mib': 37412}}],
 'pcie_vm_for_sxm': [{'code': 'FORM_FACTOR',
                      'severity': 'FAIL',
                      'message': 'NVIDIA A100 80GB PCIe is PCIE, SXM ordered',
                      'evidence': [],
                      'details': {}},
                     {'code': 'GPU_ERROR_STATE',
                      'severity': 'FAIL',
                      'message': 'GPU1 reported errors instead of values (power.draw: '
                                 '[Unknown Error]): the GPU may need a reset',
                      'evidence': [],
                      'details': {}},
                     {'code': 'TORCH_UNAVAILABLE',
                      'severity': 'WARN',
                      'message': 'PyTorch could not be imported with /usr/bin/python3: no '
                                 'output',
                      'evidence': [],
                      'details': {}},
                     {'code': 'BUILD_TOOLS',
                      'severity': 'WARN',
                      'message': 'nccl-tests cannot build (multi-node) without: nvcc (install '
                                 'the CUDA toolkit, e.g. cuda-toolkit-12-x); NCCL headers '
                                 '(libnccl-dev, or pip nvidia-nccl-cu<CUDA major>); MPI for '
                                 'multi-node runs (openmpi-bin libopenmpi-dev)',
                      'evidence': [],
                      'details': {}},
                     {'code': 'CKPT_DIR',
                      'severity': 'PASS',
                      'message': 'checkpoint directory /home/ubuntu/gpuvet/ckpt on ext4 (/)',
                      'evidence': [],
                      'details': {}}],
 'dgx_gen5_ordered': [{'code': 'PCIE_BELOW_ORDER',
                       'severity': 'FAIL',
                       'message': 'GPU0 PCIe Gen4 max, Gen5 ordered: the link can never reach '
                                  'it',
                       'evidence': [],
                       'details': {}},
                      {'code': 'PCIE_BELOW_ORDER',
                       'severity': 'FAIL',
                       'message': 'GPU1 PCIe Gen4 max, Gen5 ordered: the link can never reach '
                                  'it',
                       'evidence': [],
                       'details': {}},
                      {'code': 'PCIE_BELOW_ORDER',
                       'severity': 'FAIL',
                       'message': 'GPU2 PCIe Gen4 max, Gen5 ordered: the link can never reach '
                                  'it',
                       'evidence': [],
                       'details': {}},
                      {'code': 'PCIE_BELOW_ORDER',
                       'severity': 'FAIL',
                       'message': 'GPU3 PCIe Gen4 max, Gen5 ordered: the link can never reach '
                                  'it',
                       'evidence': [],
                       'details': {}},
                      {'code': 'PCIE_BELOW_ORDER',
                       'severity': 'FAIL',
                       'message': 'GPU4 PCIe Gen4 max, Gen5 ordered: the link can never reach '
                                  'it',
                       'evidence': [],
                       'details': {}},
                      {'code': 'PCIE_BELOW_ORDER',
                       'severity': 'FAIL',
                       'message': 'GPU5 PCIe Gen4 max, Gen5 ordered: the link can never reach '
                                  'it',
                       'evidence': [],
                       'details': {}},
                      {'code': 'CLOCKS_HELD_BACK',
                       'severity': 'WARN',
                       'message': 'GPU5 clocks held back: SwPowerCap',
                       'evidence': [],
                       'details': {}},
                      {'code': 'PCIE_BELOW_ORDER',
                       'severity': 'FAIL',
                       'message': 'GPU6 PCIe Gen4 max, Gen5 ordered: the link can never reach '
                                  'it',
                       'evidence': [],
                       'details': {}},
                      {'code': 'ECC_UNCORRECTABLE',
                       'severity': 'FAIL',
                       'message': 'GPU6 has 3 uncorrectable ECC error(s): ask the provider '
                                  'for another node',
                       'evidence': [],
                       'details': {}},
                      {'code': 'PCIE_BELOW_ORDER',
                       'severity': 'FAIL',
                       'message': 'GPU7 PCIe Gen4 max, Gen5 ordered: the link can never reach '
                                  'it',
                       'evidence': [],
                       'details': {}},
                      {'code': 'TORCH_UNAVAILABLE',
                       'severity': 'WARN',
                       'message': 'PyTorch could not be imported with /usr/bin/python3: no '
                                  'output',
                       'evidence': [],
                       'details': {}},
                      {'code': 'BUILD_TOOLS',
                       'severity': 'WARN',
                       'message': 'nccl-tests cannot build (multi-node) without: nvcc '
                                  '(install the CUDA toolkit, e.g. cuda-toolkit-12-x); NCCL '
                                  'headers (libnccl-dev, or pip nvidia-nccl-cu<CUDA major>); '
                                  'MPI for multi-node runs (openmpi-bin libopenmpi-dev)',
                       'evidence': [],
                       'details': {}},
                      {'code': 'CKPT_DIR',
                       'severity': 'PASS',
                       'message': 'checkpoint directory /home/ubuntu/gpuvet/ckpt on ext4 (/)',
                       'evidence': [],
                       'details': {}},
                      {'code': 'GPU_BUSY',
                       'severity': 'FAIL',
                       'message': 'GPU 5 has 60211 MiB in use before gpuvet ran and no '
                                  "process this node can see holds it (another container's "
                                  "job?): every figure measured on it is not the card's. Ask "
                                  'the provider for a free GPU',
                       'evidence': [],
                       'details': {'gpu': 'GPU 5',
                                   'processes': [],
                                   'held_mib': 0,
                                   'memory_used_mib': 60211}}],
 'mig': [{'code': 'MIG_ENABLED',
          'severity': 'FAIL',
          'message': 'MIG is enabled on GPUs [0, 1] (5 MIG device(s)): you get slices, not '
                     'whole GPUs',
          'evidence': [],
          'details': {'gpus': [0, 1], 'mig_devices': 5}},
         {'code': 'TORCH_UNAVAILABLE',
          'severity': 'WARN',
          'message': 'PyTorch could not be imported with /usr/bin/python3: no output',
          'evidence': [],
          'details': {}},
         {'code': 'BUILD_TOOLS',
          'severity': 'WARN',
          'message': 'nccl-tests cannot build (multi-node) without: nvcc (install the CUDA '
                     'toolkit, e.g. cuda-toolkit-12-x); NCCL headers (libnccl-dev, or pip '
                     'nvidia-nccl-cu<CUDA major>); MPI for multi-node runs (openmpi-bin '
                     'libopenmpi-dev)',
          'evidence': [],
          'details': {}},
         {'code': 'CKPT_DIR',
          'severity': 'PASS',
          'message': 'checkpoint directory /home/ubuntu/gpuvet/ckpt on ext4 (/)',
          'evidence': [],
          'details': {}}],
 'pcie_topology_for_nvswitch': [{'code': 'INTERCONNECT',
                                 'severity': 'FAIL',
                                 'message': 'nvswitch ordered but 28 GPU pair(s) do not talk '
                                            'over NVLink: GPU0-GPU1 PIX, GPU0-GPU2 NODE, '
                                            'GPU0-GPU3 NODE, GPU0-GPU4 SYS, GPU0-GPU5 SYS, '
                                            'GPU0-GPU6 SYS, GPU0-GPU7 SYS, GPU1-GPU2 NODE, '
                                            'GPU1-GPU3 NODE, GPU1-GPU4 SYS, GPU1-GPU5 SYS, '
                                            'GPU1-GPU6 SYS (+16 more)',
                                 'evidence': [],
                                 'details': {'pairs': [[0, 1, 'PIX'],
                                                       [0, 2, 'NODE'],
                                                       [0, 3, 'NODE'],
                                                       [0, 4, 'SYS'],
                                                       [0, 5, 'SYS'],
                                                       [0, 6, 'SYS'],
                                                       [0, 7, 'SYS'],
                                                       [1, 2, 'NODE'],
                                                       [1, 3, 'NODE'],
                                                       [1, 4, 'SYS'],
                                                       [1, 5, 'SYS'],
                                                       [1, 6, 'SYS'],
                                                       [1, 7, 'SYS'],
                                                       [2, 3, 'PIX'],
                                                       [2, 4, 'SYS'],
                                                       [2, 5, 'SYS'],
                                                       [2, 6, 'SYS'],
                                                       [2, 7, 'SYS'],
                                                       [3, 4, 'SYS'],
                                                       [3, 5, 'SYS'],
                                                       [3, 6, 'SYS'],
                                                       [3, 7, 'SYS'],
                                                       [4, 5, 'PIX'],
                                                       [4, 6, 'NODE'],
                                                       [4, 7, 'NODE'],
                                                       [5, 6, 'NODE'],
                                                       [5, 7, 'NODE'],
                                                       [6, 7, 'PIX']]}},
                                {'code': 'CLOCKS_HELD_BACK',
                                 'severity': 'WARN',
                                 'message': 'GPU5 clocks held back: SwPowerCap',
                                 'evidence': [],
                                 'details': {}},
                                {'code': 'ECC_UNCORRECTABLE',
                                 'severity': 'FAIL',
                                 'message': 'GPU6 has 3 uncorrectable ECC error(s): ask the '
                                            'provider for another node',
                                 'evidence': [],
                                 'details': {}},
                                {'code': 'TORCH_UNAVAILABLE',
                                 'severity': 'WARN',
                                 'message': 'PyTorch could not be imported with '
                                            '/usr/bin/python3: no output',
                                 'evidence': [],
                                 'details': {}},
                                {'code': 'BUILD_TOOLS',
                                 'severity': 'WARN',
                                 'message': 'nccl-tests cannot build (multi-node) without: '
                                            'nvcc (install the CUDA toolkit, e.g. '
                                            'cuda-toolkit-12-x); NCCL headers (libnccl-dev, '
                                            'or pip nvidia-nccl-cu<CUDA major>); MPI for '
                                            'multi-node runs (openmpi-bin libopenmpi-dev)',
                                 'evidence': [],
                                 'details': {}},
                                {'code': 'CKPT_DIR',
                                 'severity': 'PASS',
                                 'message': 'checkpoint directory /home/ubuntu/gpuvet/ckpt on '
                                            'ext4 (/)',
                                 'evidence': [],
                                 'details': {}},
                                {'code': 'GPU_BUSY',
                                 'severity': 'FAIL',
                                 'message': 'GPU 5 has 60211 MiB in use before gpuvet ran and '
                                            'no process this node can see holds it (another '
                                            "container's job?): every figure measured on it "
                                            "is not the card's. Ask the provider for a free "
                                            'GPU',
                                 'evidence': [],
                                 'details': {'gpu': 'GPU 5',
                                             'processes': [],
                                             'held_mib': 0,
                                             'memory_used_mib': 60211}}],
 'no_topology': [{'code': 'TOPOLOGY_UNKNOWN',
                  'severity': 'WARN',
                  'message': 'nvidia-smi topo -m gave no matrix; NVLink could not be verified',
                  'evidence': [],
                  'details': {}},
                 {'code': 'CLOCKS_HELD_BACK',
                  'severity': 'WARN',
                  'message': 'GPU5 clocks held back: SwPowerCap',
                  'evidence': [],
                  'details': {}},
                 {'code': 'ECC_UNCORRECTABLE',
                  'severity': 'FAIL',
                  'message': 'GPU6 has 3 uncorrectable ECC error(s): ask the provider for '
                             'another node',
                  'evidence': [],
                  'details': {}},
                 {'code': 'TORCH_UNAVAILABLE',
                  'severity': 'WARN',
                  'message': 'PyTorch could not be imported with /usr/bin/python3: no output',
                  'evidence': [],
                  'details': {}},
                 {'code': 'BUILD_TOOLS',
                  'severity': 'WARN',
                  'message': 'nccl-tests cannot build (multi-node) without: nvcc (install the '
                             'CUDA toolkit, e.g. cuda-toolkit-12-x); NCCL headers '
                             '(libnccl-dev, or pip nvidia-nccl-cu<CUDA major>); MPI for '
                             'multi-node runs (openmpi-bin libopenmpi-dev)',
                  'evidence': [],
                  'details': {}},
                 {'code': 'CKPT_DIR',
                  'severity': 'PASS',
                  'message': 'checkpoint directory /home/ubuntu/gpuvet/ckpt on ext4 (/)',
                  'evidence': [],
                  'details': {}},
                 {'code': 'GPU_BUSY',
                  'severity': 'FAIL',
                  'message': 'GPU 5 has 60211 MiB in use before gpuvet ran and no process '
                             "this node can see holds it (another container's job?): every "
                             "figure measured on it is not the card's. Ask the provider for a "
                             'free GPU',
                  'evidence': [],
                  'details': {'gpu': 'GPU 5',
                              'processes': [],
                              'held_mib': 0,
                              'memory_used_mib': 60211}}],
 'p2p_ns': [{'code': 'GPU_COUNT',
             'severity': 'PASS',
             'message': '2 GPU(s) found, 2 ordered',
             'evidence': [],
             'details': {'found': 2, 'ordered': 2}},
            {'code': 'GPU_MODEL',
             'severity': 'PASS',
             'message': 'NVIDIA H200 matches H200 SXM 141GB (ordered H200)',
             'evidence': [],
             'details': {'ordered': ['H200 NVL 141GB', 'H200 SXM 141GB'],
                         'matched': ['H200 SXM 141GB']}},
            {'code': 'GPU_MEMORY',
             'severity': 'PASS',
             'message': 'every GPU has >= 141 GB',
             'evidence': [],
             'details': {}},
            {'code': 'FORM_FACTOR',
             'severity': 'PASS',
             'message': 'SXM as ordered',
             'evidence': [],
             'details': {}},
            {'code': 'INTERCONNECT',
             'severity': 'PASS',
             'message': 'every GPU pair on NVLink (NV18)',
             'evidence': [],
             'details': {}},
            {'code': 'P2P_NOT_OK',
             'severity': 'FAIL',
             'message': 'peer-to-peer not OK between 1 GPU pair(s): GPU0-GPU1 NS',
             'evidence': [],
             'details': {}},
            {'code': 'TORCH_SEES_GPUS',
             'severity': 'PASS',
             'message': 'PyTorch 2.11.0+cu130 sees 2 GPU(s), CUDA 13.0',
             'evidence': [],
             'details': {}},
            {'code': 'BUILD_TOOLS',
             'severity': 'PASS',
             'message': 'nvcc, NCCL headers and MPI present',
             'evidence': [],
             'details': {}},
            {'code': 'CKPT_DIR',
             'severity': 'PASS',
             'message': 'checkpoint directory /home/ubuntu/gpuvet/ckpt on ext4 (/)',
             'evidence': [],
             'details': {}},
            {'code': 'TORCH_ORDER',
             'details': {'count': 2, 'wrong': []},
             'evidence': [],
             'message': 'PyTorch 2.11.0+cu130 sees GPU0 NVIDIA H200 139.8 GiB, GPU1 NVIDIA '
                        'H200 139.8 GiB as ordered (2 GPU(s), H200, >= 141 GB)',
             'severity': 'PASS'},
            {'code': 'FABRIC_STATE',
             'details': {},
             'evidence': [],
             'message': 'every GPU registered with the NVLink fabric (2 GPU(s): State '
                        'Completed, Status Success)',
             'severity': 'PASS'}],
 'torch_sees_four': [{'code': 'CLOCKS_HELD_BACK',
                      'severity': 'WARN',
                      'message': 'GPU5 clocks held back: SwPowerCap',
                      'evidence': [],
                      'details': {}},
                     {'code': 'ECC_UNCORRECTABLE',
                      'severity': 'FAIL',
                      'message': 'GPU6 has 3 uncorrectable ECC error(s): ask the provider for '
                                 'another node',
                      'evidence': [],
                      'details': {}},
                     {'code': 'TORCH_GPU_COUNT',
                      'severity': 'FAIL',
                      'message': 'PyTorch sees 4 GPU(s), nvidia-smi 8. Likely causes: '
                                 'CUDA_VISIBLE_DEVICES=0,1,2,3 hides GPUs; the container '
                                 'mounts only some GPUs (check --gpus / '
                                 'NVIDIA_VISIBLE_DEVICES)',
                      'evidence': [],
                      'details': {'torch': 4, 'nvidia_smi': 8}},
                     {'code': 'BUILD_TOOLS',
                      'severity': 'WARN',
                      'message': 'nccl-tests cannot build (multi-node) without: nvcc (install '
                                 'the CUDA toolkit, e.g. cuda-toolkit-12-x); NCCL headers '
                                 '(libnccl-dev, or pip nvidia-nccl-cu<CUDA major>); MPI for '
                                 'multi-node runs (openmpi-bin libopenmpi-dev)',
                      'evidence': [],
                      'details': {}},
                     {'code': 'CKPT_DIR',
                      'severity': 'PASS',
                      'message': 'checkpoint directory /home/ubuntu/gpuvet/ckpt on ext4 (/)',
                      'evidence': [],
                      'details': {}},
                     {'code': 'GPU_BUSY',
                      'severity': 'FAIL',
                      'message': 'GPU 5 has 60211 MiB in use before gpuvet ran and no process '
                                 "this node can see holds it (another container's job?): "
                                 "every figure measured on it is not the card's. Ask the "
                                 'provider for a free GPU',
                      'evidence': [],
                      'details': {'gpu': 'GPU 5',
                                  'processes': [],
                                  'held_mib': 0,
                                  'memory_used_mib': 60211}}],
 'torch_missing': [{'code': 'CLOCKS_HELD_BACK',
                    'severity': 'WARN',
                    'message': 'GPU5 clocks held back: SwPowerCap',
                    'evidence': [],
                    'details': {}},
                   {'code': 'ECC_UNCORRECTABLE',
                    'severity': 'FAIL',
                    'message': 'GPU6 has 3 uncorrectable ECC error(s): ask the provider for '
                               'another node',
                    'evidence': [],
                    'details': {}},
                   {'code': 'TORCH_UNAVAILABLE',
                    'severity': 'WARN',
                    'message': 'PyTorch could not be imported with /usr/bin/python3: '
                               "ModuleNotFoundError: No module named 'torch'",
                    'evidence': [],
                    'details': {}},
                   {'code': 'BUILD_TOOLS',
                    'severity': 'WARN',
                    'message': 'nccl-tests cannot build (multi-node) without: nvcc (install '
                               'the CUDA toolkit, e.g. cuda-toolkit-12-x); NCCL headers '
                               '(libnccl-dev, or pip nvidia-nccl-cu<CUDA major>); MPI for '
                               'multi-node runs (openmpi-bin libopenmpi-dev)',
                    'evidence': [],
                    'details': {}},
                   {'code': 'CKPT_DIR',
                    'severity': 'PASS',
                    'message': 'checkpoint directory /home/ubuntu/gpuvet/ckpt on ext4 (/)',
                    'evidence': [],
                    'details': {}},
                   {'code': 'GPU_BUSY',
                    'severity': 'FAIL',
                    'message': 'GPU 5 has 60211 MiB in use before gpuvet ran and no process '
                               "this node can see holds it (another container's job?): every "
                               "figure measured on it is not the card's. Ask the provider for "
                               'a free GPU',
                    'evidence': [],
                    'details': {'gpu': 'GPU 5',
                                'processes': [],
                                'held_mib': 0,
                                'memory_used_mib': 60211}}],
 'no_build_tools': [{'code': 'CLOCKS_HELD_BACK',
                     'severity': 'WARN',
                     'message': 'GPU5 clocks held back: SwPowerCap',
                     'evidence': [],
                     'details': {}},
                    {'code': 'ECC_UNCORRECTABLE',
                     'severity': 'FAIL',
                     'message': 'GPU6 has 3 uncorrectable ECC error(s): ask the provider for '
                                'another node',
                     'evidence': [],
                     'details': {}},
                    {'code': 'TORCH_UNAVAILABLE',
                     'severity': 'WARN',
                     'message': 'PyTorch could not be imported with /usr/bin/python3: no '
                                'output',
                     'evidence': [],
                     'details': {}},
                    {'code': 'BUILD_TOOLS',
                     'severity': 'WARN',
                     'message': 'nccl-tests cannot build (multi-node) without: nvcc (install '
                                'the CUDA toolkit, e.g. cuda-toolkit-12-x); NCCL headers '
                                '(libnccl-dev, or pip nvidia-nccl-cu<CUDA major>); MPI for '
                                'multi-node runs (openmpi-bin libopenmpi-dev)',
                     'evidence': [],
                     'details': {}},
                    {'code': 'CKPT_DIR',
                     'severity': 'PASS',
                     'message': 'checkpoint directory /home/ubuntu/gpuvet/ckpt on ext4 (/)',
                     'evidence': [],
                     'details': {}},
                    {'code': 'GPU_BUSY',
                     'severity': 'FAIL',
                     'message': 'GPU 5 has 60211 MiB in use before gpuvet ran and no process '
                                "this node can see holds it (another container's job?): every "
                                "figure measured on it is not the card's. Ask the provider "
                                'for a free GPU',
                     'evidence': [],
                     'details': {'gpu': 'GPU 5',
                                 'processes': [],
                                 'held_mib': 0,
                                 'memory_used_mib': 60211}}]}
