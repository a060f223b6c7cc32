"""The files and JSON-lines events of ``python3 -m payload health``, and what each
level runs at which size. One place for the names, so the node side and the
controller cannot drift apart.

Every process appends one JSON object per line to its own file and flushes it:
the node entry point to ``node.jsonl``, each per-GPU process to ``gpu<ID>.jsonl``,
the process that measures the links between GPUs to ``links.jsonl``. An event::

    {"event": "done", "phase": "memcopy", "gpu": "0", "t": 1767300000.123,
     "values": {"copy_gbps": 4211.0, ...}, "units": {"copy_gbps": "GB/s", ...},
     "params": {"bytes": 2147483648, "reps": 20}, "wall_s": 0.41}

``event`` is one of EVENTS; a phase is started (``start``), reports along the way
(``progress``, e.g. each second of the sustained window), and ends ``done``,
``skip`` (with a ``reason``) or ``error`` (with an ``error``). A line that does not
parse (a process killed mid-write) is skipped by readers, never guessed at.

Standard library only, Python 3.8 compatible.
"""

import json
import os
import time
from typing import Any, Dict, List, Optional

from payload.train.protocol import Follower, parse_lines, read_events  # noqa: F401 (re-exported)

SCHEMA = 1
TOOL = "gpuvet-health"

# events
HELLO = "hello"  # a process started: pid, device name, UUID, compute capability, memory
START = "start"
PROGRESS = "progress"
DONE = "done"
SKIP = "skip"
ERROR = "error"
BYE = "bye"  # the process finished its phases
EVENTS = (HELLO, START, PROGRESS, DONE, SKIP, ERROR, BYE)

LEVELS = ("quick", "standard", "burn")
DEVICES = ("cuda", "cpu")

# phases, in the order they run
NODE_BEFORE = ("counters_before", "busy")
GPU_PHASES = ("memcopy", "memread", "matmul", "sustained", "memtest")
LINK_PHASES = ("pcie", "pcie_all", "peer")
NODE_AFTER = ("dcgmi", "counters_after")
PHASES = NODE_BEFORE + GPU_PHASES + LINK_PHASES + NODE_AFTER

# precisions of the matrix phase; fp8 needs compute capability 8.9 (Ada, Hopper) or more
PRECISIONS = ("bf16", "fp16", "tf32", "fp32", "fp64", "fp8")
FP8_MIN_CC = (8, 9)

# files in the output folder
NODE_DOC = "health.json"
NODE_EVENTS = "node.jsonl"
LINKS_EVENTS = "links.jsonl"
COUNTERS_DIR = "counters"  # counters/before/<name>.txt, counters/after/<name>.txt, index.json
DCGMI_FILE = "dcgmi-diag.txt"
REASONS_FILE = "gpu-reasons.csv"

GIB = 1 << 30
MIB = 1 << 20


def gpu_events(label: str) -> str:
    return "gpu%s.jsonl" % label


def label_of(entry: str) -> str:
    """A file-safe name for a GPU as CUDA_VISIBLE_DEVICES names it (an index or a UUID)."""
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in entry) or "x"


# --------------------------------------------------------------------------- levels


def plan(level: str, device: str, total_bytes: int, n_gpus: int = 1,
         host_avail_bytes: Optional[int] = None) -> Dict[str, Any]:
    """What a level runs and at which sizes, for one GPU of ``total_bytes`` memory.

    quick: a copy and one bf16 product (seconds). standard: every phase, sized so a
    node is done in about a minute on the GPUs. burn: the same with minutes of
    sustained load and memory test. On CPU (tests) the sizes are tiny and windows
    short; the phases that need a GPU are skipped with their reason elsewhere.
    """
    if level not in LEVELS:
        raise ValueError("unknown level %r (use one of %s)" % (level, ", ".join(LEVELS)))
    cpu = device == "cpu"
    p: Dict[str, Any] = {"level": level, "device": device}
    p["phases"] = {
        "quick": ["memcopy", "matmul"],
        "standard": list(GPU_PHASES),
        "burn": list(GPU_PHASES),
    }[level]
    p["link_phases"] = [] if level == "quick" else list(LINK_PHASES)
    # memory bandwidth: 2 GiB buffers (the plain-torch reference), less on small cards
    p["copy_bytes"] = 8 * MIB if cpu else max(64 * MIB, min(2 * GIB, _mib(total_bytes // 32)))
    p["copy_reps"], p["copy_warmup"] = (5, 1) if cpu else (20, 3)
    # matrix products: 8192^3 (the reference) where memory allows
    if cpu:
        p["matmul_n"] = 128
    else:
        p["matmul_n"] = 8192 if total_bytes >= 12 * GIB else (4096 if total_bytes >= 3 * GIB
                                                               else 2048)
    p["precisions"] = ["bf16"] if level == "quick" else list(PRECISIONS)
    p["matmul_reps"] = {"bf16": 10, "fp16": 10, "tf32": 10, "fp8": 10, "fp32": 3, "fp64": 3}
    if cpu:
        p["matmul_reps"] = {k: 3 for k in p["matmul_reps"]}
    p["matmul_warmup"] = 1 if cpu else 2
    p["sustain_s"] = {"quick": 0.0, "standard": 15.0, "burn": 180.0}[level]
    if cpu:
        p["sustain_s"] = {"quick": 0.0, "standard": 1.0, "burn": 3.0}[level]
    p["sustain_batch"] = 4 if cpu else 20  # products between synchronisations
    # memory test over most of the free memory: one pass of every pattern at least
    p["memtest_fraction"] = 0.9
    p["memtest_bytes"] = 16 * MIB if cpu else None  # None: the fraction of what is free
    p["memtest_s"] = {"quick": 0.0, "standard": 5.0, "burn": 180.0}[level]
    if cpu:
        p["memtest_s"] = {"quick": 0.0, "standard": 0.5, "burn": 2.0}[level]
    p["memtest_seed"] = 20240611
    # host copies: 1 GiB pinned per GPU (the reference), within what the host can pin
    pcie = 1 * GIB
    if host_avail_bytes:
        pcie = min(pcie, _mib(host_avail_bytes // (4 * max(1, n_gpus))))
    p["pcie_bytes"] = max(64 * MIB, pcie)
    p["pcie_reps"] = 10
    p["peer_bytes"] = 512 * MIB if total_bytes >= 8 * GIB else 128 * MIB
    p["peer_reps"] = 10
    p["latency_reps"] = 100
    p["dcgmi_level"] = {"quick": None, "standard": 1, "burn": 2}[level]
    return p


def _mib(n: int) -> int:
    return max(MIB, n - n % MIB)


def worker_timeout_s(p: Dict[str, Any]) -> float:
    """How long a per-GPU process may run before it is killed as hung."""
    return 120.0 + 3.0 * (float(p["sustain_s"]) + float(p["memtest_s"]))


# --------------------------------------------------------------------------- writing


class EventWriter:
    """Appends events to one file, flushed per line; optionally echoes them to stdout."""

    def __init__(self, path: str, gpu: Optional[str] = None, echo: Any = None) -> None:
        self.path = path
        self.gpu = gpu
        self.echo = echo
        self._f = open(path, "a", encoding="utf-8")  # noqa: SIM115 (open for the run)

    def emit(self, event: str, phase: Optional[str] = None, **fields: Any) -> Dict[str, Any]:
        ev: Dict[str, Any] = {"event": event}
        if phase is not None:
            ev["phase"] = phase
        if self.gpu is not None:
            ev["gpu"] = self.gpu
        ev["t"] = round(time.time(), 6)
        ev.update(fields)
        line = json.dumps(ev, sort_keys=True, default=str)
        self._f.write(line + "\n")
        self._f.flush()
        if self.echo is not None:
            self.echo.write(line + "\n")
            self.echo.flush()
        return ev

    def close(self) -> None:
        try:
            self._f.close()
        except OSError:
            pass


def last_by_phase(events: List[Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """The final event (done, skip or error) of each phase, in the order phases ended."""
    out: Dict[str, Dict[str, Any]] = {}
    for ev in events:
        if ev.get("event") in (DONE, SKIP, ERROR) and ev.get("phase"):
            out[str(ev["phase"])] = ev
    return out


def write_json_atomic(path: str, doc: Dict[str, Any]) -> None:
    tmp = os.path.join(os.path.dirname(path) or ".", "." + os.path.basename(path) + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps(doc, indent=1, sort_keys=True, default=str) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
