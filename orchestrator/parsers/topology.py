"""GPU/NIC topology: `nvidia-smi topo -m`, `topo -p2p`, `nvlink -s`.

Rented nodes are sold as "8x A100 NVLink" whether or not every pair really is
NV#, and whether or not the NICs sit next to the GPUs; these facts let a check
name the exact pair or NIC that is wrong. Cell values are a closed set: a new
one raises ParseError rather than being read as "probably fine".
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

from orchestrator.errors import ParseError
from orchestrator.parsers import register
from orchestrator.parsers.nvidia_smi import is_na

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# PCIe relations from nearest to farthest; SOC is what drivers before ~384 called SYS.
PCIE_ORDER = ("PIX", "PXB", "PHB", "NODE", "SYS", "SOC")
_AFFINITY_COLS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
_NV = re.compile(r"NV(\d+)")


def _cell_ok(value: str) -> bool:
    return value == "X" or value in PCIE_ORDER or bool(_NV.fullmatch(value))


class TopoGpu(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str  # GPU0
    index: int
    cpu_affinity: str | None = None  # e.g. "48-63,176-191"
    numa_affinity: str | None = None
    gpu_numa_id: str | None = None


class NicAffinity(BaseModel):
    """The closest relation a NIC has to any GPU, and which GPUs share it."""

    model_config = ConfigDict(extra="forbid")
    best: str
    gpus: list[str]


class TopoMFacts(BaseModel):
    model_config = ConfigDict(extra="forbid")
    gpus: list[TopoGpu]
    nics: list[str]  # real device names (mlx5_0), the NIC Legend applied
    nic_legend: dict[str, str]  # NIC0 -> mlx5_0; empty on drivers that print names
    matrix: dict[str, dict[str, str]]  # row device -> column device -> X/NV#/PIX/...
    # `nvidia-smi topo -mp`: the PCIe paths only (its legend has no `NV#` line), so a pair
    # that talks over NVLink still shows its PCIe path: no NVLink verdict from this view
    pcie_only: bool = False

    @property
    def gpu_names(self) -> list[str]:
        return [g.name for g in self.gpus]

    @property
    def nic_names(self) -> list[str]:
        return list(self.nics)

    def link(self, a: int | str, b: int | str) -> str:
        """Relation between two devices; ints are GPU indices."""
        ka = f"GPU{a}" if isinstance(a, int) else a
        kb = f"GPU{b}" if isinstance(b, int) else b
        return self.matrix[ka][kb]

    def pairs(self) -> list[tuple[int, int, str]]:
        """Every GPU pair (i < j) with its relation."""
        idx = [g.index for g in self.gpus]
        return [(i, j, self.link(i, j)) for i in idx for j in idx if i < j]

    def non_nvlink_pairs(self) -> list[tuple[int, int, str]]:
        return [p for p in self.pairs() if not _NV.fullmatch(p[2])]

    def nvlink_count(self, a: int, b: int) -> int | None:
        m = _NV.fullmatch(self.link(a, b))
        return int(m.group(1)) if m else None

    @property
    def nic_affinity(self) -> dict[str, NicAffinity]:
        out: dict[str, NicAffinity] = {}
        for nic in self.nics:
            rel = {g: self.matrix[g][nic] for g in self.gpu_names}
            known = [r for r in rel.values() if r in PCIE_ORDER]
            if not known:
                continue
            best = min(known, key=PCIE_ORDER.index)
            out[nic] = NicAffinity(best=best, gpus=[g for g, r in rel.items() if r == best])
        return out


def _split_header(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"\t| {2,}", line) if c.strip()]


# What a value of each affinity column looks like, to place a row whose other
# affinity cells are empty (a GPU on a CPU-less NUMA node, a VM that hides NUMA).
_AFF_PATTERN = {
    "CPU Affinity": re.compile(r"\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*|N/A"),
    "NUMA Affinity": re.compile(r"\d+(?:[-,]\d+)*|N/A"),
    "GPU NUMA ID": re.compile(r"\d+|N/A"),
}


def _rest_columns(line: str, n_devices: int) -> list[int]:
    """Start columns (tabs expanded) of the tokens after the device cells."""
    wide = line.expandtabs(8)
    starts = [m.start() for m in re.finditer(r"\S+", wide)]
    return starts[1 + n_devices:]


def _place_affinity(line: str, rest: list[str], aff_cols: list[str], n_devices: int,
                    template: list[int] | None) -> dict[str, str | None] | None:
    """Affinity cells by column, read by meaning; None when they cannot be told apart.

    A full row is read in order. A row with empty cells is placed by where its
    values start compared with a full row of the same output (nvidia-smi pads
    with tabs, so counting cells is not enough, and a paste may have turned the
    tabs into spaces), and failing that by what each value looks like, accepted
    only when exactly one placement fits.
    """
    if len(rest) == len(aff_cols):
        return dict(zip(aff_cols, rest, strict=True))
    if len(rest) > len(aff_cols):
        return None
    if template is not None:
        cols = _rest_columns(line, n_devices)
        if all(c in template for c in cols):
            placed: dict[str, str | None] = dict.fromkeys(aff_cols)
            for c, v in zip(cols, rest, strict=True):
                placed[aff_cols[template.index(c)]] = v
            return placed
    fits: list[dict[str, str | None]] = []
    for chosen in _combinations(aff_cols, len(rest)):
        if all(_AFF_PATTERN.get(c, re.compile(r"\S+")).fullmatch(v) for c, v in
               zip(chosen, rest, strict=True)):
            fit: dict[str, str | None] = dict.fromkeys(aff_cols)
            fit.update(zip(chosen, rest, strict=True))
            fits.append(fit)
    return fits[0] if len(fits) == 1 else None


def _combinations(items: list[str], k: int) -> list[list[str]]:
    if k == 0:
        return [[]]
    if len(items) < k:
        return []
    head, tail = items[0], items[1:]
    return [[head, *rest] for rest in _combinations(tail, k - 1)] + _combinations(tail, k)


def _template(line: str, aff_cols: list[str], n_devices: int) -> list[int] | None:
    """Where the affinity values of a full row start."""
    cols = _rest_columns(line, n_devices)
    return cols if len(cols) == len(aff_cols) else None


def parse_topo_m(text: str, source: str | None = None) -> TopoMFacts:
    kind = "topo-m"
    lines = _ANSI.sub("", text).splitlines()
    start = next((n for n, ln in enumerate(lines) if ln.strip()), None)
    if start is None:
        raise ParseError(kind, "empty output", source=source)
    asked_pcie = False
    cmd = _COMMAND.search(lines[start])
    if cmd is not None:  # the prompt and command pasted above the matrix
        asked_pcie = bool(re.search(r"\s-mp\b|\s-m\s+-p\b|--matrix_pci\b", cmd.group(0)))
        start = next((n for n in range(start + 1, len(lines)) if lines[n].strip()), None)
        if start is None:
            raise ParseError(kind, "only the command line, no matrix", source=source)
    header = _split_header(lines[start])
    devices = [h for h in header if h not in _AFFINITY_COLS]
    aff_cols = [h for h in header if h in _AFFINITY_COLS]
    if not devices or not re.fullmatch(r"GPU\d+", devices[0]) or \
            header[: len(devices)] != devices:
        raise ParseError(kind, "header does not start with GPU columns", line_no=start + 1,
                         line=lines[start], source=source)
    rows: list[tuple[int, str, list[str], list[str]]] = []
    n = start + 1
    while n < len(lines) and lines[n].strip() and lines[n].strip() != "Legend:":
        line = lines[n]
        cells = line.split()
        label, values, rest = cells[0], cells[1 : 1 + len(devices)], cells[1 + len(devices) :]
        if label not in devices or len(values) < len(devices) or len(rest) > len(aff_cols):
            raise ParseError(kind, f"row does not match the header ({len(devices)} devices, "
                             f"{len(aff_cols)} affinity columns)", line_no=n + 1, line=line,
                             source=source)
        if label in (r[1] for r in rows):
            raise ParseError(kind, f"a second row for {label}", line_no=n + 1, line=line,
                             source=source)
        bad = [v for v in values if not _cell_ok(v)]
        if bad or values[devices.index(label)] != "X":
            what = f"unknown value {bad[0]!r}" if bad else "diagonal is not X"
            raise ParseError(kind, what, line_no=n + 1, line=line, source=source)
        rows.append((n, label, values, rest))
        n += 1
    missing = [d for d in devices if d not in {r[1] for r in rows}]
    if missing:
        # a matrix without a row for a device in its header is a damaged output, not
        # a smaller machine: the GPU is there (the header names it) but unread
        raise ParseError(kind, f"no row for {', '.join(missing)}: the header names "
                         f"{len(devices)} devices" + (" (a `topo -mp` paste: the PCIe-only view, "
                                                      "no NVLink verdict comes from it)"
                                                      if asked_pcie else ""), line_no=n + 1,
                         line=lines[n] if n < len(lines) else None, source=source)
    template = next((t for ln, label, _v, rest in rows
                     if len(rest) == len(aff_cols) and re.fullmatch(r"GPU\d+", label)
                     and (t := _template(lines[ln], aff_cols, len(devices))) is not None), None)
    gpus: list[TopoGpu] = []
    matrix: dict[str, dict[str, str]] = {}
    for n, label, values, rest in rows:
        matrix[label] = dict(zip(devices, values, strict=True))
        if not re.fullmatch(r"GPU\d+", label):
            continue  # a NIC row's affinity cells are empty on most drivers
        aff = _place_affinity(lines[n], rest, aff_cols, len(devices), template)
        if aff is None:
            raise ParseError(kind, f"cannot tell which of the {len(aff_cols)} affinity columns "
                             f"the {len(rest)} value(s) of {label} belong to", line_no=n + 1,
                             line=lines[n], source=source)
        aff = {k: (None if v is None or is_na(v) else v) for k, v in aff.items()}
        gpus.append(TopoGpu(name=label, index=int(label[3:]),
                            cpu_affinity=aff.get("CPU Affinity"),
                            numa_affinity=aff.get("NUMA Affinity"),
                            gpu_numa_id=aff.get("GPU NUMA ID")))
    n = rows[-1][0] + 1
    legend: dict[str, str] = {}
    in_nic_legend = False
    for m_no in range(n, len(lines)):
        s = lines[m_no].strip()
        if s == "NIC Legend:":
            in_nic_legend = True
        elif in_nic_legend and (m := re.fullmatch(r"(NIC\d+):\s*(\S+)", s)):
            legend[m.group(1)] = m.group(2)
    unnamed = [d for d in devices if d.startswith("NIC") and d not in legend
               and re.fullmatch(r"NIC\d+", d)]
    if unnamed:
        raise ParseError(kind, f"{unnamed[0]} is not in the NIC Legend", source=source)
    ren = {d: legend.get(d, d) for d in devices}
    matrix = {ren[r]: {ren[c]: v for c, v in row.items()} for r, row in matrix.items()}
    nics = [ren[d] for d in devices if not re.fullmatch(r"GPU\d+", d)]
    return TopoMFacts(gpus=gpus, nics=nics, nic_legend=legend, matrix=matrix,
                      pcie_only=asked_pcie or _pcie_view(lines[n:], matrix))


_COMMAND = re.compile(r"^\S*[$#>] +(?:sudo +)?nvidia-smi +topo\b.*$")


def _pcie_view(tail: list[str], matrix: dict[str, dict[str, str]]) -> bool:
    """`topo -mp`: the legend is there and names no `NV#` (topo -m's always does since R361),
    and no cell is one."""
    legend = [ln.strip() for ln in tail if ln.strip()]
    if "Legend:" not in legend or any(ln.startswith("NV#") for ln in legend):
        return False
    return not any(_NV.fullmatch(v) for row in matrix.values() for v in row.values())


register("topo-m", "nvidia-smi topo -m (and -mp, the PCIe-only view): GPU/NIC connection "
         "matrix and affinities",
         example="nvidia-smi topo -m | tee topo.txt")(parse_topo_m)


# --------------------------------------------------------------------------- -p2p

P2P_STATUS = {"X": "Self", "OK": "Status Ok", "CNS": "Chipset not supported",
              "GNS": "GPU not supported", "TNS": "Topology not supported",
              "NS": "Not supported", "DR": "Disabled by regkey", "U": "Unknown"}


class TopoP2PFacts(BaseModel):
    model_config = ConfigDict(extra="forbid")
    gpus: list[str]
    matrix: dict[str, dict[str, str]]  # GPU0 -> GPU1 -> OK/NS/...

    def status(self, a: int, b: int) -> str:
        return self.matrix[f"GPU{a}"][f"GPU{b}"]

    def pairs(self) -> list[tuple[int, int, str]]:
        idx = [int(g[3:]) for g in self.gpus]
        return [(i, j, self.status(i, j)) for i in idx for j in idx if i != j]

    def not_ok_pairs(self) -> list[tuple[int, int, str]]:
        return [p for p in self.pairs() if p[2] != "OK"]


def parse_topo_p2p(text: str, source: str | None = None) -> TopoP2PFacts:
    kind = "topo-p2p"
    lines = _ANSI.sub("", text).splitlines()
    start = next((n for n, ln in enumerate(lines) if ln.strip()), None)
    if start is None:
        raise ParseError(kind, "empty output", source=source)
    gpus = lines[start].split()
    if not gpus or not all(re.fullmatch(r"GPU\d+", g) for g in gpus):
        raise ParseError(kind, "header is not a list of GPUs", line_no=start + 1,
                         line=lines[start], source=source)
    matrix: dict[str, dict[str, str]] = {}
    n = start + 1
    while n < len(lines) and lines[n].strip() and lines[n].strip() != "Legend:":
        cells = lines[n].split()
        if len(cells) != len(gpus) + 1 or cells[0] not in gpus:
            raise ParseError(kind, f"row does not have {len(gpus)} GPU cells", line_no=n + 1,
                             line=lines[n], source=source)
        bad = [c for c in cells[1:] if c not in P2P_STATUS]
        if bad:
            raise ParseError(kind, f"unknown status {bad[0]!r}", line_no=n + 1, line=lines[n],
                             source=source)
        matrix[cells[0]] = dict(zip(gpus, cells[1:], strict=True))
        n += 1
    if set(matrix) != set(gpus):
        raise ParseError(kind, "not every GPU has a row", line_no=n + 1,
                         line=lines[n] if n < len(lines) else None, source=source)
    return TopoP2PFacts(gpus=gpus, matrix=matrix)


register("topo-p2p", "nvidia-smi topo -p2p n|r|w|a|p: peer-to-peer status matrix",
         example="nvidia-smi topo -p2p n | tee p2p.txt")(parse_topo_p2p)


# --------------------------------------------------------------------------- nvlink -s

class NvLink(BaseModel):
    model_config = ConfigDict(extra="forbid")
    link: int
    active: bool
    speed_gbs: float | None  # GB/s per direction; None when inactive


class NvlinkGpu(BaseModel):
    model_config = ConfigDict(extra="forbid")
    index: int
    name: str
    uuid: str | None  # drivers before ~418 print no UUID
    links: list[NvLink]
    # What nvidia-smi said instead of listing links (MIG mode, no NVLink on this card)
    message: str | None = None

    @property
    def links_unknown(self) -> bool:
        """A message that withholds the links; a card without NVLink is known to have none."""
        return self.message is not None and "does not have" not in self.message

    @property
    def active_links(self) -> int:
        return sum(1 for link in self.links if link.active)

    @property
    def total_gbs(self) -> float:
        return sum(link.speed_gbs or 0.0 for link in self.links)


class NvlinkFacts(BaseModel):
    model_config = ConfigDict(extra="forbid")
    gpus: list[NvlinkGpu]
    # The text leaves GPUs out (`[snip]`, `...` in a pasted excerpt): their links are unknown
    elided: bool = False
    notes: list[str] = []

    @property
    def has_nvlink(self) -> bool:
        return any(g.active_links for g in self.gpus)

    @property
    def unknown(self) -> list[str]:
        """Why some links are unknown: per GPU reasons and elisions, empty when all are read."""
        out = [f"GPU {g.index}: {g.message}" for g in self.gpus if g.links_unknown]
        if self.elided:
            shown = ", ".join(str(g.index) for g in self.gpus) or "none"
            out.append(f"the text leaves GPUs out (only GPUs {shown} shown)")
        return out


_NVL_GPU = re.compile(r"GPU (\d+): (.+?)(?: \(UUID: (GPU-[0-9A-Fa-f-]+)\))?")
_NVL_LINK = re.compile(r"Link (\d+): (?:(\d+(?:\.\d+)?) GB/s|(<inactive>))")
_NVL_NONE = ("NVML: Unable to retrieve NVLink information as all links are inActive",
             "NVML: Unable to retrieve NVLink information as all links are inactive")
# Per-GPU messages that say why no Link lines follow.
_NVL_UNKNOWN = re.compile(r"Nvlink queries are not supported for Devices in MIG mode|"
                          r"Device does not have or support Nvlink|"
                          r"Unable to retrieve NVLink information.*|.*[Nn]ot [Ss]upported.*")
_ELISION = re.compile(r"\.{3,}|…|\[(?:snip|\.\.\.|[^\]]*omitted[^\]]*)\]", re.I)


def parse_nvlink_s(text: str, source: str | None = None) -> NvlinkFacts:
    """Empty output and NVML's "all links are inActive" both mean: no NVLink.

    A GPU in MIG mode or without NVLink says so instead of listing links: that is
    kept as the reason its links are unknown. An excerpt with GPUs cut out
    (`[snip]`) is read as far as it goes and marked elided.
    """
    kind = "nvlink-s"
    gpus: list[NvlinkGpu] = []
    notes: list[str] = []
    elided = False
    for no, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or s in _NVL_NONE:
            if s:
                notes.append(s)
            continue
        if _ELISION.fullmatch(s):
            elided = True
            continue
        if m := _NVL_GPU.fullmatch(s):
            if gpus and int(m.group(1)) != gpus[-1].index + 1:
                elided = True  # GPU 0 then GPU 7: the ones between were cut out
            gpus.append(NvlinkGpu(index=int(m.group(1)), name=m.group(2), uuid=m.group(3),
                                  links=[]))
        elif (m := _NVL_LINK.fullmatch(s)) and gpus:
            speed = float(m.group(2)) if m.group(2) else None
            gpus[-1].links.append(NvLink(link=int(m.group(1)), active=speed is not None,
                                         speed_gbs=speed))
        elif _NVL_UNKNOWN.fullmatch(s) and gpus and not gpus[-1].links:
            gpus[-1].message = s
        else:
            raise ParseError(kind, "not a GPU or Link line", line_no=no, line=line,
                             source=source)
    if gpus and gpus[0].index != 0:
        elided = True
    return NvlinkFacts(gpus=gpus, elided=elided, notes=notes)


register("nvlink-s", "nvidia-smi nvlink -s: per-GPU NVLink speeds",
         example="nvidia-smi nvlink -s")(parse_nvlink_s)
