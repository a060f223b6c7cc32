"""How each kind of output shows itself, and what reads it: the recognition table.

A parser is tried only where a signature of its output is seen, strongest
signature first, because several parsers accept more than they should on
their own (`uname` reads any line of five words, `lscpu` any `Key: value`
text). The first parser that reads a file names its kind.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchestrator import parsers
from orchestrator.errors import ParseError
from orchestrator.parsers._noise import strip_launcher_prefix
from orchestrator.parsers._smi_warnings import smi_warning
from orchestrator.parsers.nvidia_smi import noheader_fits
from orchestrator.parsers.nvidia_smi_q import Q_KEYS
from orchestrator.parsers.recipe import (
    FREEZE_ROW,
    PIP_HEADER,
    parse_checked_at,
    parse_commit,
    parse_pip,
)

_QUERY_FIELD = re.compile(r"[A-Za-z_][\w.]*(?: \[[^\]]+\])?")


_DCGMI_ROWS = (r"^\|\s*(?:Diagnostic|Deployment|Hardware|Integration|Stress|GPU Memory|Memory|"
               r"Software|Denylist|Blacklist|NVML Library|CUDA Main Library|PCIe|Targeted "
               r"Stress|Targeted Power|Memory Bandwidth|SM Stress|Diagnostic|Memtest|Pulse Test|"
               r"Permissions and OS Blocks|Persistence Mode|Environment Variables|Page "
               r"Retirement|Graphics Processes|Inforom)\s+\|")

# the health outputs people collect with other tools (steps/poc/health.py judges them):
# (kind, pattern, score, anywhere in the file)
HEALTH_SIGNATURES: tuple[tuple[str, str, int, bool], ...] = (
    ("p2pBandwidthLatencyTest", r"P2P Connectivity Matrix|P2P=(?:Enabled|Disabled) \w* ?"
     r"Bandwidth|\[P2P \(Peer-to-Peer\) GPU Bandwidth Latency Test\]", 93, True),
    ("nvbandwidth", r"^Running \w+_(?:ce|sm)\.|^nvbandwidth Version|^SUM \w+_(?:ce|sm) |"
     r"^Process \d+ \([^)]*\): device \d+: ", 92,
     True),
    ("nvlink-e", r"Link \d+: (?:Replay|Recovery|CRC|Rx|Tx|Data|Flit|Effective)\w*[ \w]* "
     r"(?:Errors?|Counter)", 94, True),
    ("xid", r"NVRM: Xid \(|NVRM: .*fallen off the bus", 93, True),
    ("pcie-bandwidth", r"available PCIe bandwidth", 91, True),
    ("dcgmi-diag", _DCGMI_ROWS, 89, True),
    ("dcgmi-diag", r'^\s*\{?\s*"DCGM (?:GPU )?Diagnostic"\s*:', 90, True),  # dcgmi diag -j
    ("dcgmi-nvlink-s", r"^\s*gpuId \d+:\s*$", 90, True),
    ("ibdev2netdev", r"^\S+(?:\s+\([^)]*\))?(?:\s+fw\s+\S+)?\s+port\s+\d+(?:\s+\([A-Z_]+\))?\s+"
     r"==>\s+\S+\s+\((?:Up|Down)\)", 95, False),
    ("rdma-link", r"^link \S+/\d+ .*\bstate \w+", 95, False),
    ("ibstatus", r"^Infiniband device '[^']+' port \d+ status:$", 95, False),
    ("lspci-vvv", r"^\s+Lnk(?:Sta|Cap):", 88, True),
    ("perftest-bw", r"#bytes\s+#iterations\s+BW peak|RDMA_\w+ .*BW Test|Send BW Test|"
     r"Completion with error at (?:client|server)|cuMemAlloc\(\) of a \d+ bytes GPU buffer|"
     r"^Picking device No\. \d+$", 90, True),
    ("nvidia-smi-compute-apps", r"^\s*(?:timestamp,\s*)?(?:gpu_name,\s*)?(?:gpu_bus_id,\s*)?"
     r"(?:gpu_serial,\s*)?(?:gpu_uuid,\s*|gpu_bus_id,\s*)?pid,\s*(?:process_name|name)\b", 93,
     False),
    ("nvidia-smi-compute-apps-noheader", r"^(?!.*%)(?:[^,\n]*,){2,}\s*(?:\d+ MiB|\[N/A\])\s*$", 80,
     False),
    ("nvidia-smi-pmon", r"^#\s*(?:Date\s+)?(?:Time\s+)?gpu\s+pid\b", 96, False),
)
HEALTH_KIND_NAMES = frozenset(k for k, *_ in HEALTH_SIGNATURES)

def _q_score(text: str, head: list[str]) -> int:
    if re.search(r"^=+NVSMI LOG=+\s*$", text[:2000], re.M):
        return 95
    if head and head[0].strip() == "MIG Mode":
        return 70  # the recipe's `nvidia-smi -q | sed -n '/MIG Mode/,3p'` (or `,+2p`)
    keys = {m.group(1) for ln in head
            for m in [re.match(r"\s*([A-Za-z][\w ()/-]*?)\s*(?::|$)", ln)] if m}
    known = keys & Q_KEYS
    if any(re.match(r"GPU [0-9A-Fa-f]+:[0-9A-Fa-f]+:", ln) for ln in head) and known:
        return 85
    return 60 if len(known) >= 2 else 0


def _past_warnings(head: list[str]) -> list[str]:
    """The first lines without nvidia-smi's own warnings (infoROM, a GPU it cannot reach)."""
    return [ln for ln in head if smi_warning(0, ln) is None]


def _query_score(text: str, head: list[str]) -> int:
    head = _past_warnings(head)
    cells = [c.strip() for c in head[0].split(",")] if head else []
    if len(cells) < 2 or not all(_QUERY_FIELD.fullmatch(c) for c in cells):
        return 0
    names = {c.split(" [")[0] for c in cells}
    return 90 if names & {"index", "name", "uuid", "pci.bus_id", "memory.total",
                          "driver_version", "gpu_name", "gpu_uuid"} or any("." in n for n in names) \
        else 0


def _l_score(text: str, head: list[str]) -> int:
    if not head or not re.match(r"GPU \d+: .*\(UUID: ", head[0]):
        return 0
    if re.search(r"^\s+Link \d+:|nvlink", text, re.M | re.I):
        return 40  # nvidia-smi nvlink prints the same GPU lines, then its links
    return 90


def _nvlink_score(text: str, head: list[str]) -> int:
    if head and re.match(r"NVML: .*NVLink", head[0], re.I):
        return 80  # a card whose links are all inactive or absent says only that
    if not head or not re.match(r"GPU \d+: ", head[0]):
        return 0
    return 92 if re.search(r"^\s+Link \d+:|nvlink", text, re.M | re.I) else 0


def _has(pattern: str, score: int, *, whole: bool = False) -> Callable[[str, list[str]], int]:
    """A pattern in the first lines, or anywhere (`whole`: launchers and NCCL print first)."""
    rx = re.compile(pattern, re.M)
    return lambda text, head: score if rx.search(text if whole else "\n".join(head)) else 0


def _uname_score(text: str, head: list[str]) -> int:
    if len(head) != 1:
        return 0
    tok = head[0].split()
    return 85 if len(tok) >= 5 and tok[0] in ("Linux", "GNU/Linux") and tok[2][:1].isdigit() else 0


def _one_line(parse: Callable[..., Any], score: int) -> Callable[[str, list[str]], int]:
    def sig(text: str, head: list[str]) -> int:
        if not 1 <= len(head) <= 8 or len(text) > 4096:
            return 0
        try:
            parse(text)
        except ParseError:
            return 0
        return score
    return sig


def _pip_score(text: str, head: list[str]) -> int:
    if head and PIP_HEADER.fullmatch(head[0].strip()):
        return 90
    freeze = [ln for ln in head if FREEZE_ROW.fullmatch(ln.strip())]
    return 70 if len(freeze) >= 3 and len(freeze) * 2 >= len(head) else 0


_NCCL_TESTS = re.compile(r"^#?\s*nThread \d+ nGpus|# Collective test starting|nccl-tests version "
                         r"|^#?\s*Using devices|# Avg bus bandwidth|^#?\s+size\s+count\s+type",
                         re.M)
_ROW = re.compile(r"\s*\d+\s+\d+\s+[A-Za-z]\w*\s")


def _nccl_score(text: str, head: list[str]) -> int:
    """nccl-tests' own header lines anywhere (launchers and NCCL print first), under a
    launcher's prefix too, with or without their `#`."""
    lines, _ = strip_launcher_prefix(text.splitlines())
    return 95 if _NCCL_TESTS.search("\n".join(lines)) else 0


def _rows_score(text: str, head: list[str]) -> int:
    """nccl-tests rows pasted without the lines above them (a table cut from a thread)."""
    rows = [ln for ln in head[:8] if _ROW.match(ln) and 11 <= len(ln.split()) <= 15]
    return 70 if len(rows) >= 2 and len(rows) * 2 >= len(head[:8]) else 0


_MOUNT = re.compile(r"\S+ /\S* \S+ \S+ \d+ \d+")


def _mounts_score(text: str, head: list[str]) -> int:
    hits = sum(1 for ln in head if _MOUNT.fullmatch(ln.strip()))
    return 80 if head and hits * 4 >= len(head) * 3 else 0


def _json_score(key: str, score: int) -> Callable[[str, list[str]], int]:
    """A JSON document holding `key` near its start, or a JSON line holding it (torch's probe
    prints warnings before its line)."""
    def sig(text: str, head: list[str]) -> int:
        if text.lstrip().startswith("{") and key in text[:4096]:
            return score
        return score if any(ln.lstrip().startswith("{") and key in ln for ln in head) else 0
    return sig


def parse_collect_doc(text: str, source: str | None = None) -> Any:
    """gpuvet's own collect document: recognised so the message can say what to do with it."""
    raise ParseError("gpuvet-collect", "this is a gpuvet collect document, not a command output: "
                     "judge it with `gpuvet preflight --from FILE -i INVENTORY --node NAME`",
                     source=source)




@dataclass(frozen=True)
class Kind:
    """One kind of output: how it shows itself and what reads it."""

    name: str
    signature: Callable[[str, list[str]], int]  # 0: does not look like it; higher: stronger
    parse: Callable[..., Any]


def _registered(kind: str) -> Callable[..., Any]:
    return lambda text, source=None: parsers.parse(kind, text, source=source)


KINDS: tuple[Kind, ...] = (
    Kind("nvidia-smi-q-xml", _has(r"<nvidia_smi_log\b", 100), _registered("nvidia-smi-q-xml")),
    Kind("nvidia-smi-table", _has(r"^\|\s*NVIDIA-SMI \d", 95), _registered("nvidia-smi-table")),
    Kind("nvidia-smi-table", _has(r"^\|\s*(?:MIG devices|Processes):\s*\|", 75),
         _registered("nvidia-smi-table")),  # a paste that starts below the GPU table
    Kind("nvidia-smi-table", _has(r"^\s*(?:WARNING: infoROM is corrupted at gpu|Unable to "
                                  r"(?:determine|detect) the device handle for GPU)", 80),
         _registered("nvidia-smi-table")),  # nvidia-smi printed only what it could not do
    Kind("nvidia-smi-q", _q_score, _registered("nvidia-smi-q")),
    Kind("nvidia-smi-version", _has(r"^NVIDIA-SMI version\s*:", 95),
         _registered("nvidia-smi-version")),
    Kind("nvidia-smi-query-gpu", _query_score, _registered("nvidia-smi-query-gpu")),
    Kind("nvidia-smi-query-gpu-noheader",
         lambda text, head: 85 if _past_warnings(head) and noheader_fits(_past_warnings(head)[0])
         else 0,
         _registered("nvidia-smi-query-gpu-noheader")),
    Kind("gpuvet-collect", _json_score('"tool": "gpuvet-payload"', 99), parse_collect_doc),
    Kind("nvidia-smi-L", _l_score, _registered("nvidia-smi-L")),
    Kind("nvlink-s", _nvlink_score, _registered("nvlink-s")),
    Kind("topo-m", _has(r"CPU Affinity|= Connection traversing", 90), _registered("topo-m")),
    Kind("topo-p2p", _has(r"= Status Ok|= Chipset not supported", 90), _registered("topo-p2p")),
    Kind("dmon", _has(r"^#\s*(?:Date\s+)?(?:Time\s+)?gpu\b", 95), _registered("dmon")),
    Kind("nccl-tests", _nccl_score, _registered("nccl-tests")),
    Kind("nccl-tests", _rows_score, _registered("nccl-tests")),  # rows pasted alone
    Kind("nccl-tests-json", _json_score('"args"', 90), _registered("nccl-tests-json")),
    Kind("torch-info", _json_score('"torch"', 90), _registered("torch-info")),
    Kind("torch-check", _has(r"^torch_version:\s*\S", 95), _registered("torch-check")),
    Kind("mounts", _mounts_score, _registered("mounts")),
    Kind("nccl-tests-build", _has(r"^make(?:\[\d+\])?: |^Compiling +\S|^Linking +\S", 80),
         _registered("nccl-tests-build")),
    Kind("nvcc-version", _has(r"Cuda compilation tools, release|nvcc: NVIDIA \(R\)", 95),
         _registered("nvcc-version")),
    Kind("uname", _uname_score, _registered("uname")),
    Kind("os-release", _has(r"^ID=", 85), _registered("os-release")),
    Kind("lscpu", _has(r"^Architecture:", 85), _registered("lscpu")),
    Kind("meminfo", _has(r"^MemTotal:\s+\d+ kB", 90), _registered("meminfo")),
    Kind("df", _has(r"^Filesystem\s.*Mounted on", 85), _registered("df")),
    Kind("ldconfig-nccl", _has(r"libnccl\S* \(.*\) => |libs found in cache", 85),
         _registered("ldconfig-nccl")),
    Kind("mpirun-version", _has(r"\(Open MPI\)|HYDRA build details|Intel\(R\) MPI Library", 90),
         _registered("mpirun-version")),
    Kind("ibstat", _has(r"^CA '", 95), _registered("ibstat")),
    Kind("ibv-devinfo", _has(r"^hca_id:|^No IB devices found", 95), _registered("ibv-devinfo")),
    Kind("pip-list", _pip_score, parse_pip),
    Kind("commit", _one_line(parse_commit, 80), parse_commit),
    Kind("checked-at", _one_line(parse_checked_at, 80), parse_checked_at),
    Kind("command-not-found", _has(r": (?:command )?not found\s*$", 90),
         _registered("command-not-found")),
    # the health outputs people collect with other tools (steps/poc/health.py judges them)
    *(Kind(kind, _has(pattern, score, whole=whole), _registered(kind))
      for kind, pattern, score, whole in HEALTH_SIGNATURES),
)
