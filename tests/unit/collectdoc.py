"""Build realistic payload collect documents from fixture files.

A document has the layout `python3 -m payload collect` writes: every command of
payload.commands.COMMANDS with its record (argv, rc, stdout, stderr, ...), plus
env, paths, nccl, mpi, tools and python. Command output is read verbatim from
tests/fixtures; a command given no output is recorded as not installed.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from orchestrator import inventory as inv_mod
from orchestrator.inventory import Inventory
from payload.commands import COMMANDS, COMMANDS_BY_ID

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

# The 2x H200 host's real captures, by payload command id.
H200_FILES: dict[str, str] = {
    "uname": "h200x2/commands/uname.txt",
    "os_release": "h200x2/commands/os-release.txt",
    "nvidia_smi": "h200x2/commands/nvidia-smi.txt",
    "nvidia_smi_version": "h200x2/commands/nvidia-smi-version.txt",
    "nvidia_smi_L": "h200x2/commands/nvidia-smi-L.txt",
    "nvidia_smi_q_xml": "h200x2/commands/nvidia-smi-q.xml",
    "query_gpu": "h200x2/commands/query-gpu.csv",
    "topo_m": "h200x2/commands/topo-m.txt",
    "topo_p2p_n": "h200x2/commands/topo-p2p-n.txt",
    "nvlink_s": "h200x2/commands/nvlink-s.txt",
    "nvcc_version": "h200x2/commands/nvcc-version.txt",
    "ldconfig": "h200x2/commands/ldconfig-nccl.txt",
    "torch": "h200x2/commands/torch-info.txt",
    "lscpu": "h200x2/commands/lscpu.txt",
    "meminfo": "h200x2/commands/meminfo.txt",
    "df": "h200x2/commands/df.txt",
    "mounts": "h200x2/commands/mounts.txt",
    "mpirun_version": "h200x2/commands/mpirun-version.txt",
}

# Build tools as found on that host: CUDA toolkit, pip NCCL with its header, Open MPI.
H200_TOOLS: dict[str, str | None] = {
    "nvcc": "/usr/local/cuda/bin/nvcc", "nvidia-smi": "/usr/bin/nvidia-smi",
    "mpirun": "/usr/bin/mpirun", "mpicc": "/usr/bin/mpicc", "make": "/usr/bin/make",
    "gcc": "/usr/bin/gcc", "g++": "/usr/bin/g++", "git": "/usr/bin/git",
    "ibv_devinfo": None, "torchrun": "/usr/local/bin/torchrun",
}
_PIP_NCCL = "/usr/local/lib/python3.10/dist-packages/nvidia/nccl"
H200_NCCL: dict[str, Any] = {
    "nccl_home": None,
    "pip": [{"root": _PIP_NCCL, "lib_dir": f"{_PIP_NCCL}/lib", "libs": ["libnccl.so.2"],
             "unversioned": False, "so2": True, "header": f"{_PIP_NCCL}/include/nccl.h",
             "header_version": "2.28.9"}],
    "headers": [{"path": "/usr/include/nccl.h", "exists": False, "version": None},
                {"path": "/usr/local/cuda/include/nccl.h", "exists": False, "version": None}],
    "lib_dirs": [],
}
H200_MPI: dict[str, Any] = {
    "mpicc": "/usr/bin/mpicc", "mpirun": "/usr/bin/mpirun", "flavor": "openmpi",
    "mpicc_version": "mpicc: Open MPI 4.1.6 (Language: C)",
    "showme_incdirs": "/usr/lib/x86_64-linux-gnu/openmpi/include",
    "showme_libdirs": "/usr/lib/x86_64-linux-gnu/openmpi/lib",
    "mpi_h": ["/usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h"],
}
NO_NCCL: dict[str, Any] = {"nccl_home": None, "pip": [], "lib_dirs": [],
                           "headers": [{"path": "/usr/include/nccl.h", "exists": False,
                                        "version": None}]}
NO_MPI: dict[str, Any] = {"mpicc": None, "mpirun": None, "flavor": None, "mpicc_version": None,
                          "showme_incdirs": None, "showme_libdirs": None, "mpi_h": []}


def fixture(rel: str) -> str:
    """Text of a fixture file, relative to tests/fixtures."""
    return (FIXTURES / rel).read_text(encoding="utf-8")


def path_info(path: str, fstype: str = "ext4", mount_point: str = "/", *,
              source: str = "/dev/vda", exists: bool = True, writable: bool = True,
              realpath: str | None = None) -> dict[str, Any]:
    """A paths.* entry as payload.collect.path_info writes it."""
    return {"path": path, "realpath": realpath or path, "exists": exists, "is_dir": exists,
            "writable": writable, "stat_path": path if exists else mount_point,
            "free_bytes": 128 << 30, "total_bytes": 252 << 30,
            "mount": {"source": source, "mount_point": mount_point, "fstype": fstype,
                      "options": "rw,relatime"},
            "error": None}


def _record(cid: str, stdout: str, rc: int | None = 0, stderr: str = "", *,
            missing: bool = False, timed_out: bool = False) -> dict[str, Any]:
    spec = COMMANDS_BY_ID.get(cid)
    argv = list(spec.argv) if spec is not None else [cid]
    return {"argv": argv, "path": None if missing else f"/usr/bin/{argv[0].strip('{}')}",
            "rc": None if missing or timed_out else rc, "stdout": stdout, "stderr": stderr,
            "duration_s": 0.05, "missing": missing, "timed_out": timed_out,
            "truncated": False, "error": None, "fallback": False}


def doc_from(files: Mapping[str, str] | None = None, *,
             texts: Mapping[str, str] | None = None,
             missing: Iterable[str] = (),
             failed: Mapping[str, tuple[int, str]] | None = None,
             timed_out: Iterable[str] = (),
             env: Mapping[str, str] | None = None,
             paths: Mapping[str, Any] | None = None,
             tools: Mapping[str, str | None] | None = None,
             nccl: Mapping[str, Any] | None = None,
             mpi: Mapping[str, Any] | None = None,
             node: str = "node-a") -> dict[str, Any]:
    """A collect document.

    files: command id -> fixture path (relative to tests/fixtures), read verbatim.
    texts: command id -> stdout given literally (an edited copy of a fixture).
    missing: ids whose executable is not installed (also every id given no output).
    failed: id -> (rc, stderr) for a command that ran and failed.
    timed_out: ids killed after their timeout.
    """
    outputs = {cid: fixture(rel) for cid, rel in (files or {}).items()}
    outputs.update(texts or {})
    gone = set(missing)
    commands: dict[str, dict[str, Any]] = {}
    for cid in [c.id for c in COMMANDS] + [c for c in outputs if c not in COMMANDS_BY_ID]:
        if cid in (failed or {}):
            rc, err = (failed or {})[cid]
            commands[cid] = _record(cid, outputs.get(cid, ""), rc, err)
        elif cid in timed_out:
            commands[cid] = _record(cid, outputs.get(cid, ""), timed_out=True)
        elif cid in outputs and cid not in gone:
            commands[cid] = _record(cid, outputs[cid])
        else:
            commands[cid] = _record(cid, "", missing=True)
    work = "/home/ubuntu/gpuvet"
    return {
        "schema": 1, "tool": "gpuvet-payload", "payload_version": "0.1.0", "node": node,
        "hostname": node, "started_at": "2025-01-01T00:00:00.000Z",
        "finished_at": "2025-01-01T00:00:05.000Z", "duration_s": 5.0,
        "python": {"executable": "/usr/bin/python3", "version": "3.10.12"},
        "work_dir": work, "ckpt_dir": f"{work}/ckpt",
        "commands": commands,
        "env": dict(env or {"PATH": "/usr/local/bin:/usr/bin:/bin"}),
        "paths": copy.deepcopy(dict(paths)) if paths is not None else {
            "work_dir": path_info(work), "ckpt_dir": path_info(f"{work}/ckpt")},
        "nccl": copy.deepcopy(dict(nccl if nccl is not None else NO_NCCL)),
        "mpi": copy.deepcopy(dict(mpi if mpi is not None else NO_MPI)),
        "tools": dict(tools if tools is not None else {"nvcc": None, "mpirun": None}),
    }


def h200_doc(*, files: Mapping[str, str] | None = None, **kw: Any) -> dict[str, Any]:
    """The real 2x H200 host: its captures, its build tools; ibv_devinfo not installed.

    `files` entries replace (or add to) the host's captures; other keywords go to doc_from.
    """
    kw.setdefault("tools", H200_TOOLS)
    kw.setdefault("nccl", H200_NCCL)
    kw.setdefault("mpi", H200_MPI)
    return doc_from({**H200_FILES, **(files or {})}, **kw)


def h200_text(cid: str) -> str:
    """The H200 host's capture for one command id."""
    return fixture(H200_FILES[cid])


def inventory(expect: Mapping[str, Any], nodes: Iterable[str] = ("node-a",),
              provider: str = "prov") -> Inventory:
    """An in-memory inventory: one provider with this order and these nodes."""
    data = {"version": 1, "providers": {provider: {
        "executor": "local", "expect": dict(expect),
        "nodes": [{"name": n, "ckpt_dir": "/ckpt"} for n in nodes]}}}
    return Inventory(inv_mod.InventoryFile.model_validate(data), Path("<memory>"))


# The order the 2x H200 host was rented as.
H200_ORDER: dict[str, Any] = {"gpu_model": "H200", "gpus_per_node": 2, "memory_per_gpu_gb": 141,
                              "form_factor": "sxm", "interconnect": "nvswitch"}
