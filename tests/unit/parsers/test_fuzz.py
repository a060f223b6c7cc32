"""Every parser, fed random text and damaged copies of real outputs: a result or a ParseError.

A parser that throws anything else (IndexError, ValueError, a pydantic
ValidationError) turns one odd line on a rented node into a crashed preflight.
The examples are derandomized so the suite is stable; when changing a parser,
explore further with GPUVET_FUZZ_EXAMPLES=2000 and GPUVET_FUZZ_RANDOM=1 (new
examples on every run).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from orchestrator.errors import ParseError
from orchestrator.parsers import kinds, parse

FIX = Path(__file__).resolve().parents[2] / "fixtures"
EXAMPLES = int(os.environ.get("GPUVET_FUZZ_EXAMPLES", "30"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                derandomize=not os.environ.get("GPUVET_FUZZ_RANDOM"),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# Real outputs per parser kind: the mutations start from these.
SEEDS: dict[str, list[str]] = {
    "nvidia-smi-query-gpu": ["h200x2/commands/query-gpu.csv",
                             "synthetic/query-gpu_4x-a100-pcie-40gb_r470.csv",
                             "public/query-gpu_l40s_r595.csv"],
    "nvidia-smi-L": ["h200x2/commands/nvidia-smi-L.txt", "public/nvidia-smi-L_h200-mig_r590.txt"],
    "nvidia-smi-q-xml": ["synthetic/nvidia-smi-q_a100-sxm4-40gb-mig_r535.xml",
                         "synthetic/nvidia-smi-q_a100-pcie-40gb_r470.xml"],
    "nvidia-smi-table": ["h200x2/commands/nvidia-smi.txt", "public/nvidia-smi_h200-mig-load_r590.txt",
                         "public/nvidia-smi_4x-v100-pcie_r410.txt"],
    "nvidia-smi-q": ["public/nvidia-smi-q_h200-mig-load_r590.txt",
                     "public/nvidia-smi-q_titan-v_r560.txt",
                     "public/nvidia-smi-q_fabric-in-progress_gpu-operator.txt"],
    "topo-m": ["h200x2/commands/topo-m.txt", "public/topo-m_4x-a10-2nic.txt",
               "public/topo-m_dgx1-v100.txt"],
    "topo-p2p": ["h200x2/commands/topo-p2p-n.txt", "synthetic/topo-p2p-n_4x-a100-pcie_r470.txt"],
    "nvlink-s": ["h200x2/commands/nvlink-s.txt", "public/nvlink-status_dgx1-v100_snip.txt",
                 "public/nvlink-s_h200-mig_r590.txt"],
    "uname": ["h200x2/commands/uname.txt"],
    "os-release": ["h200x2/commands/os-release.txt"],
    "nvcc-version": ["h200x2/commands/nvcc-version.txt"],
    "ldconfig-nccl": ["synthetic/ldconfig-p_full.txt"],
    "torch-info": ["h200x2/commands/torch-info.txt", "synthetic/torch-info_no-cuda.txt"],
    "ibv-devinfo": ["synthetic/ibv_devinfo-v_hdr-roce.txt"],
    "lscpu": ["h200x2/commands/lscpu.txt"],
    "meminfo": ["synthetic/meminfo_dgx-a100.txt"],
    "df": ["h200x2/commands/df.txt", "synthetic/df-hT_wrapped.txt"],
    "mpirun-version": ["h200x2/commands/mpirun-version.txt", "synthetic/mpirun-version_mpich.txt"],
    "nccl-tests": ["h200x2/nccl-tests/all_reduce_8B-128M_g2_round1.log",
                   "nccl-tests/all_reduce_2.19.6_per-iter_h100.log",
                   "public/all_reduce_2node-h100_srun-label.log",
                   "public/all_reduce_hash-lost_a100-sxm4-40gb_nccl-583.log",
                   "public/all_gather_rows-only_error-0e+00_nccl-644.log"],
    "nccl-tests-json": ["h200x2/nccl-tests/all_reduce_1G-4G_g2_nccl-debug-info.json",
                        "nccl-tests/alltoall_2.17.6_json-v1.json"],
    "nccl-debug": ["h200x2/nccl-tests/all_reduce_mpi_np2_simulated-2node-socket.log"],
    "ibstat": ["public/ibstat_8x-cx6_ibpanic.txt"],
    "dmon": ["h200x2/commands/dmon.txt", "public/dmon_s-mutc_o-TD.txt"],
    "nvidia-smi-query-gpu-noheader": ["recipe-h200x1/gpus-noheader.csv"],
    "torch-check": ["recipe-h200x1/torch.txt"],
    "mounts": ["recipe-h200x1/mounts.txt", "h200x2/commands/mounts.txt"],
    "nccl-tests-build": ["recipe-h200x1/nccl-tests/make-plain.log"],
    "nvidia-smi-version": ["recipe-h200x1/nvidia-smi-version.txt"],
    "commit": ["recipe-h200x1/nccl-tests/commit.txt"],
    "checked-at": ["recipe-h200x1/checked-at.txt"],
    "pip-list": ["poc/samples/pip-list_torch-2.6.0-cu126.txt"],
    "command-not-found": ["h200x2/commands/ibv_devinfo.txt"],
    "xid": ["public/dmesg-T_h100-xid119-gsp_gpud.log", "h200x1-health/dmesg.txt",
            "public/journal-grep_xid45-after-149_ogkm1150.txt"],
    "pcie-bandwidth": ["public/dmesg_limited-by_8x-h100_mle.txt"],
    "dcgmi-diag": ["synthetic/dcgmi-diag-r1_4gpu-complete_3.3.txt",
                   "public/dcgmi-diag-r2_gpu-memory-fail_mle.txt",
                   "public/dcgmi-diag-j_deployment-fail-warn_gcm.json"],
    "dcgmi-nvlink-s": ["public/dcgmi-nvlink-s-grep_2gpu-down-disabled_gcm.txt"],
    "ibdev2netdev": ["public/ibdev2netdev-column-t_h100-12hca-notes_imbue4.txt"],
    "rdma-link": ["public/rdma-link_2x-cx6dx-roce_3fs283.txt",
                  "public/rdma-link_ib-down-polling_rccl1423.txt"],
    "ibstatus": ["public/ibstatus_8x-a100-hdr-active_gpud.txt"],
    "nvidia-smi-pmon": ["public/pmon_h200-mig-load_r590.txt", "public/pmon_l40s-load_r595.txt"],
    "nvidia-smi-compute-apps-noheader": [
        "public/query-compute-apps-noheader_h200-mig-load_r590-derived.csv"],
    "nvlink-e": ["public/nvlink-e_h100_mle.txt", "synthetic/nvlink-e_2x-a100-crc_r535.txt"],
    "nvidia-smi-compute-apps": ["h200x1-health/compute-apps.csv"],
    "lspci-vvv": ["synthetic/lspci-vvv_h100-x8-a100-gen3_lspci-3.7-3.10.txt",
                  "public/lspci-vvv_quadro-rtx8000-x1-fragment_rpi480.txt"],
    "perftest-bw": ["public/ib_write_bw_loopback-interleaved_superbench.log",
                    "public/ib_write_bw_post-list-8B_perftest273.txt"],
    "nvbandwidth": ["public/nvbandwidth_v0.6_gh200_superbench.txt",
                    "public/nvbandwidth_v0.7_8x-a100-pattern-assert_nvbw34.txt"],
    "p2pBandwidthLatencyTest": ["synthetic/p2pBandwidthLatencyTest_2x-h100-nvlink-complete.txt",
                                "public/p2pBandwidthLatencyTest_2x-rtx4090-cut_tinygrad44.txt"],
    "sysfs-fabric": ["synthetic/sysfs-fabric_h100-8x-ndr-roce.json"],
    "scontrol-show-hostnames": ["slurm/scontrol_show_hostnames.txt"],
    "scontrol-show-job": ["slurm/scontrol_show_job_running.txt",
                          "slurm/scontrol_show_job_running_oneliner.txt",
                          "slurm/scontrol_show_job_timeout.txt"],
    "squeue": ["slurm/squeue_jobs.txt", "slurm/squeue_steps.txt"],
    "sacct": ["slurm/sacct_ended.txt"],
}
_TEXT: dict[str, str] = {}


def _seed(rel: str) -> str:
    if rel not in _TEXT:
        _TEXT[rel] = (FIX / rel).read_text()
    return _TEXT[rel]


def _check(kind: str, text: str) -> None:
    try:
        facts = parse(kind, text, source="fuzz")
    except ParseError:
        return
    assert isinstance(facts, BaseModel)
    facts.model_dump(mode="json")  # every fact must also serialise into facts.json


def test_every_registered_kind_has_seeds() -> None:
    assert {k.kind for k in kinds()} == set(SEEDS)
    for rels in SEEDS.values():
        for rel in rels:
            _check(next(k for k, v in SEEDS.items() if rel in v), _seed(rel))


KINDS = sorted(SEEDS)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


@st.composite
def mutated(draw: st.DrawFn, kind: str) -> str:
    text = _seed(draw(st.sampled_from(SEEDS[kind])))
    lines = text.splitlines(keepends=True)
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["truncate", "drop", "dup", "number", "swap", "garbage",
                                   "bytes", "blank", "case"]))
        if not lines:
            break
        k = draw(st.integers(0, len(lines) - 1))
        if op == "truncate":
            joined = "".join(lines)
            lines = [joined[:draw(st.integers(0, len(joined)))]]
        elif op == "drop":
            del lines[k]
        elif op == "dup":
            lines.insert(k, lines[k])
        elif op == "number":
            nums = list(_NUMBER.finditer(lines[k]))
            if nums:
                m = draw(st.sampled_from(nums))
                new = draw(st.sampled_from(["9" * 40, "-1", "-12345", "N/A", "[N/A]", "-",
                                            "1e309", "nan", "0x", "", "4294967296"]))
                lines[k] = lines[k][:m.start()] + new + lines[k][m.end():]
        elif op == "swap":
            sep = "," if "," in lines[k] else None
            toks = lines[k].rstrip("\n").split(sep)
            if len(toks) > 1:
                i, j = draw(st.integers(0, len(toks) - 1)), draw(st.integers(0, len(toks) - 1))
                toks[i], toks[j] = toks[j], toks[i]
                lines[k] = ("," if sep else " ").join(toks) + "\n"
        elif op == "garbage":
            lines.insert(k, draw(st.text(max_size=40)) + "\n")
        elif op == "bytes":
            raw = bytearray(lines[k].encode())
            for _ in range(draw(st.integers(1, 4))):
                if raw:
                    raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0x80, 0xff))
            lines[k] = raw.decode("utf-8", errors="replace")
        elif op == "blank":
            lines[k] = "\n"
        else:
            lines[k] = lines[k].swapcase()
    return "".join(lines)


@pytest.mark.parametrize("kind", KINDS)
@FUZZ
@given(data=st.data())
def test_mutated_real_outputs(kind: str, data: st.DataObject) -> None:
    _check(kind, data.draw(mutated(kind)))


@pytest.mark.parametrize("kind", KINDS)
@FUZZ
@given(text=st.text(max_size=200) | st.binary(max_size=200).map(
    lambda b: b.decode("utf-8", errors="replace")))
def test_random_text(kind: str, text: str) -> None:
    _check(kind, text)


# --------------------------------------------------------------------------- JSON

_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-(2 ** 70), 2 ** 70),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=10),
                    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=5),
                                                                          st.integers(), max_size=2))


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:4]):
            out += _paths(v, (*prefix, i))
    return out


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    parent = doc
    for step in path[:-1]:
        parent = parent[step]
    parent[path[-1]] = value
    return doc


@FUZZ
@given(data=st.data())
def test_nccl_tests_json_wrong_types_anywhere(data: st.DataObject) -> None:
    rel = data.draw(st.sampled_from(SEEDS["nccl-tests-json"]))
    doc = json.loads(_seed(rel))
    for _ in range(data.draw(st.integers(1, 3))):
        paths = _paths(doc)
        path = data.draw(st.sampled_from(paths))
        doc = _set(doc, path, data.draw(_VALUES))
    _check("nccl-tests-json", json.dumps(doc))
