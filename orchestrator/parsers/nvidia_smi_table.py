"""The default `nvidia-smi` table: the one output every rented node answers.

People paste it everywhere and some providers only let you see this, so it is
a source of GPU facts in its own right. The layout changed over the years (two
rows per GPU before R450, a `MIG M.` row after; `KMD`/`CUDA UMD Version` in the
banner since R610; wider columns since R530), so cells are found by the box
drawing, not by character offsets. Every cell is read by meaning; a row that
fits no known shape raises ParseError with its line.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

from orchestrator.errors import ParseError
from orchestrator.parsers import register
from orchestrator.parsers.nvidia_smi import integer, is_na, number, text_or_none

KIND = "nvidia-smi-table"

_TIMESTAMP = re.compile(r"\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}")
_BANNER = re.compile(
    r"NVIDIA-SMI (?P<smi>\S+)\s+(?:Driver|KMD) Version: (?P<driver>\S+)"
    r"(?:\s+CUDA(?: UMD)? Version: (?P<cuda>\S+))?")
_RULE = re.compile(r"[+|][-+]+[+|]")  # +-----+----+ and |-----+----| box rules
_MIB = re.compile(r"\s*(\d+)MiB\s*/\s*(\d+)MiB\s*")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TableGpu(_Model):
    """One GPU block; None where nvidia-smi printed N/A or the layout has no such cell."""

    index: int
    name: str
    name_truncated: bool  # nvidia-smi cuts long names to `NVIDIA GeForce ...`
    persistence_mode: bool | None
    bus_id: str
    display_active: str | None
    ecc_uncorrected: int | None  # the `Volatile Uncorr. ECC` count
    ecc_cell: str | None  # the cell as printed when it is not a count (On/Off in MIG mode)
    fan_pct: int | None
    temperature_c: int | None
    performance_state: str | None
    power_draw_w: float | None
    power_cap_w: float | None
    memory_used_mib: int | None
    memory_total_mib: int | None
    utilization_pct: int | None
    compute_mode: str | None
    mig_mode: str | None  # Enabled/Disabled/N/A; None in the two-row layout
    errors: list[str] = []  # cells nvidia-smi printed as ERR!
    line_no: int


class TableMigDevice(_Model):
    gpu: int
    gpu_instance_id: int
    compute_instance_id: int
    mig_device: int
    memory_used_mib: int | None
    memory_total_mib: int | None
    bar1_used_mib: int | None
    bar1_total_mib: int | None
    sm_count: int | None
    ecc_uncorrected: int | None
    engines: dict[str, int | None]  # CE, ENC, DEC, OFA, JPG as the header names them
    line_no: int


class TableProcess(_Model):
    gpu: int
    gpu_instance_id: int | None
    compute_instance_id: int | None
    pid: int
    type: str
    name: str
    memory_mib: int | None
    line_no: int


class NvidiaSmiTableFacts(_Model):
    timestamp: str | None
    smi_version: str | None
    driver_version: str | None
    cuda_version: str | None
    layout: str  # "2-row" (before R450) or "3-row" (with the MIG M. row)
    gpus: list[TableGpu]
    mig_devices: list[TableMigDevice]
    processes: list[TableProcess] | None  # None when the processes table is absent
    missing: list[str]  # sections the text does not hold (a cut-off or grepped paste)

    @property
    def count(self) -> int:
        return len(self.gpus)

    @property
    def mig_device_count(self) -> int:
        return len(self.mig_devices)


def _cells(line: str) -> list[str] | None:
    """The cells of a `| a | b |` row, or None when the line is not one."""
    s = line.rstrip()
    if not (s.startswith("|") and s.endswith("|")) or len(s) < 2:
        return None
    return s[1:-1].split("|")


class _Reader:
    def __init__(self, text: str, source: str | None) -> None:
        self.lines = text.replace("\r\n", "\n").split("\n")
        self.source = source
        self.i = 0

    def fail(self, what: str, n: int | None = None) -> ParseError:
        n = self.i if n is None else n
        line = self.lines[n] if 0 <= n < len(self.lines) else None
        return ParseError(KIND, what, line_no=n + 1 if line is not None else None, line=line,
                          source=self.source)

    def skip_blank(self) -> None:
        while self.i < len(self.lines) and not self.lines[self.i].strip():
            self.i += 1

    def at_end(self) -> bool:
        return self.i >= len(self.lines)

    def cur(self) -> str:
        return self.lines[self.i]


def _num(r: _Reader, n: int, raw: str, unit: str | None, kind: str = "int") -> float | int | None:
    try:
        return integer(raw, unit) if kind == "int" else number(raw, unit)
    except ValueError as exc:
        raise r.fail(str(exc), n) from None


def _gpu_rows(r: _Reader, rows: list[tuple[int, list[str]]], three_rows: bool) -> TableGpu:
    if len(rows) < 2:
        raise r.fail("GPU block has one row; the header announces two or three", rows[0][0])
    (n1, c1), (n2, c2) = rows[0], rows[1]
    if len(c1) != 3 or len(c2) != 3:
        raise r.fail("GPU row does not have the three cells of the header", n1)
    m = re.fullmatch(r"\s*(\d+)\s+(.*?)\s+(On|Off|N/A)\s*", c1[0])
    if not m:
        raise r.fail("first GPU cell is not `index  name  persistence`", n1)
    name = m.group(2).strip()
    bus = c1[1].split()
    if len(bus) != 2:
        raise r.fail("second GPU cell is not `bus-id  display`", n1)
    ecc_raw = c1[2].strip()
    ecc: int | None = None
    ecc_cell: str | None = None
    if re.fullmatch(r"\d+", ecc_raw):
        ecc = int(ecc_raw)
    elif not is_na(ecc_raw):
        ecc_cell = ecc_raw
    m2 = re.fullmatch(r"\s*(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s*/\s*(\S+)\s*", c2[0])
    if not m2:
        raise r.fail("GPU cell is not `fan  temp  perf  usage / cap`", n2)
    errors: list[str] = []
    fan_raw, temp_raw, perf, draw_raw, cap_raw = m2.groups()
    vals: dict[str, int | float | None] = {}
    for key, raw, unit, kind in (("fan", fan_raw, "%", "int"), ("temp", temp_raw, "C", "int"),
                                 ("draw", draw_raw, "W", "float"), ("cap", cap_raw, "W", "float")):
        if raw.strip() == "ERR!":
            errors.append(key)
            vals[key] = None
        else:
            vals[key] = _num(r, n2, raw, unit, kind)
    mem = _MIB.fullmatch(c2[1])
    if mem is None and not is_na(c2[1]):
        raise r.fail("memory cell is not `used MiB / total MiB`", n2)
    util_cm = c2[2].split(None, 1)
    if len(util_cm) != 2:
        raise r.fail("cell is not `GPU-util  compute mode`", n2)
    mig: str | None = None
    if three_rows:
        if len(rows) != 3 or len(rows[2][1]) != 3:
            raise r.fail("GPU block lacks its MIG M. row", n2)
        mig = rows[2][1][2].strip() or None
    elif len(rows) != 2:
        raise r.fail("GPU block has more rows than the header announces", rows[2][0])
    return TableGpu(
        index=int(m.group(1)), name=name, name_truncated=name.endswith("..."),
        persistence_mode=None if m.group(3) == "N/A" else m.group(3) == "On",
        bus_id=bus[0], display_active=text_or_none(bus[1]), ecc_uncorrected=ecc,
        ecc_cell=ecc_cell, fan_pct=vals["fan"],  # type: ignore[arg-type]
        temperature_c=vals["temp"],  # type: ignore[arg-type]
        performance_state=text_or_none(perf), power_draw_w=vals["draw"], power_cap_w=vals["cap"],
        memory_used_mib=int(mem.group(1)) if mem else None,
        memory_total_mib=int(mem.group(2)) if mem else None,
        utilization_pct=_num(r, n2, util_cm[0], "%"),  # type: ignore[arg-type]
        compute_mode=text_or_none(util_cm[1]), mig_mode=mig, errors=errors, line_no=n1 + 1)


_Block = list[tuple[int, list[str]]]


def _blocks(r: _Reader, closed: list[bool] | None = None) -> list[_Block]:
    """Rows of a box table after its `|===|` rule, grouped by `+---+` rules, to its end.

    `closed` (when given) gets False if the text ended inside the last block.
    """
    blocks: list[_Block] = []
    cur: list[tuple[int, list[str]]] = []
    while not r.at_end():
        line = r.cur()
        if not line.strip():
            break
        if _RULE.fullmatch(line.strip()):
            if cur:
                blocks.append(cur)
            cur = []
            r.i += 1
            continue
        cells = _cells(line)
        if cells is None:
            raise r.fail("line inside a table is neither a row nor a rule")
        cur.append((r.i, cells))
        r.i += 1
    if cur:
        blocks.append(cur)  # the text ended inside a block
        if closed is not None:
            closed.append(False)
    return blocks


def _header(r: _Reader) -> list[str]:
    """The header rows of a box table up to and including its `|===|` rule."""
    rows: list[str] = []
    while not r.at_end():
        line = r.cur().strip()
        r.i += 1
        if line.startswith("|=") and line.endswith("=|"):
            return rows
        if _RULE.fullmatch(line):
            continue
        if _cells(line) is None:
            raise r.fail("table header row expected", r.i - 1)
        rows.append(line)
    raise r.fail("the text ends inside a table header", len(r.lines) - 1)


def _mig_devices(r: _Reader, header: list[str]) -> list[TableMigDevice]:
    names = (_cells(header[1]) or ["", "", "", ""])[-1].split() if len(header) > 1 else []
    out: list[TableMigDevice] = []
    for block in _blocks(r):
        n1, c1 = block[0]
        if len(c1) != 4:
            raise r.fail("MIG device row does not have four cells", n1)
        ids = c1[0].split()
        if len(ids) != 4 or not all(t.isdigit() for t in ids):
            raise r.fail("MIG device row does not start with `GPU GI CI MIG`", n1)
        mem = _MIB.fullmatch(c1[1])
        sm_ecc = c1[2].split()
        eng = c1[3].split()
        if mem is None or len(sm_ecc) != 2 or (names and len(eng) != len(names)):
            raise r.fail("MIG device row does not match its header", n1)
        bar1 = _MIB.fullmatch(block[1][1][1]) if len(block) > 1 and len(block[1][1]) == 4 else None
        out.append(TableMigDevice(
            gpu=int(ids[0]), gpu_instance_id=int(ids[1]), compute_instance_id=int(ids[2]),
            mig_device=int(ids[3]), memory_used_mib=int(mem.group(1)),
            memory_total_mib=int(mem.group(2)),
            bar1_used_mib=int(bar1.group(1)) if bar1 else None,
            bar1_total_mib=int(bar1.group(2)) if bar1 else None,
            sm_count=_num(r, n1, sm_ecc[0], None),  # type: ignore[arg-type]
            ecc_uncorrected=_num(r, n1, sm_ecc[1], None),  # type: ignore[arg-type]
            engines={k: _num(r, n1, v, None) for k, v in  # type: ignore[misc]
                     zip(names or [f"engine{k}" for k in range(len(eng))], eng, strict=True)},
            line_no=n1 + 1))
    return out


_PROC = re.compile(r"\s*(?P<gpu>\d+)\s+(?:(?P<gi>\S+)\s+(?P<ci>\S+)\s+)?(?P<pid>\d+)\s+"
                   r"(?P<type>[A-Z+]+)\s+(?P<name>.*?)\s+(?P<mem>\d+MiB|N/A)\s*")


def _processes(r: _Reader, header: list[str]) -> list[TableProcess]:
    with_ids = any(re.search(r"\bGI\b", h) for h in header)
    out: list[TableProcess] = []
    for block in _blocks(r):
        for n, cells in block:
            text = "|".join(cells)
            if text.strip() == "No running processes found":
                continue
            m = _PROC.fullmatch(text)
            if not m or bool(m["gi"]) != with_ids:
                raise r.fail("process row does not match the processes header", n)

            def opt(v: str | None) -> int | None:
                return int(v) if v is not None and v.isdigit() else None

            out.append(TableProcess(
                gpu=int(m["gpu"]), gpu_instance_id=opt(m["gi"]), compute_instance_id=opt(m["ci"]),
                pid=int(m["pid"]), type=m["type"], name=m["name"],
                memory_mib=None if m["mem"] == "N/A" else int(m["mem"][:-3]), line_no=n + 1))
    return out


@register(KIND, "the default nvidia-smi table: driver, CUDA, GPUs, MIG devices, processes")
def parse_nvidia_smi_table(text: str, source: str | None = None) -> NvidiaSmiTableFacts:
    r = _Reader(text, source)
    r.skip_blank()
    if r.at_end():
        raise ParseError(KIND, "empty output", source=source)
    timestamp = None
    if _TIMESTAMP.fullmatch(r.cur().strip()):
        timestamp = r.cur().strip()
        r.i += 1
    if r.at_end() or not _RULE.fullmatch(r.cur().strip()):
        raise r.fail("not an nvidia-smi table (no box above the NVIDIA-SMI banner)")
    r.i += 1
    banner = _BANNER.search(r.cur()) if not r.at_end() else None
    if banner is None:
        raise r.fail("no `NVIDIA-SMI ... Driver Version:` banner")
    r.i += 1
    header = _header(r)
    three_rows = any("MIG M." in h for h in header)
    gpus: list[TableGpu] = []
    missing: list[str] = []
    cut: list[bool] = []
    blocks = _blocks(r, cut)
    for k, block in enumerate(blocks):
        if cut and k == len(blocks) - 1 and len(block) < (3 if three_rows else 2):
            missing.append(f"the rest of the GPU block at line {block[0][0] + 1} (text cut off)")
            continue
        gpus.append(_gpu_rows(r, block, three_rows))
    mig: list[TableMigDevice] = []
    procs: list[TableProcess] | None = None
    while True:
        r.skip_blank()
        if r.at_end():
            break
        if not _RULE.fullmatch(r.cur().strip()):
            raise r.fail("expected the MIG devices or processes table")
        r.i += 1
        title = (_cells(r.cur()) or [""])[0].split(":")[0].strip() if not r.at_end() else ""
        if title not in ("MIG devices", "Processes"):
            raise r.fail("unknown table after the GPU table")
        r.i += 1
        sub_header = _header(r)
        if title == "MIG devices":
            mig = _mig_devices(r, sub_header)
        else:
            procs = _processes(r, sub_header)
    if procs is None:
        missing.append("processes table")
    if not gpus:
        missing.append("GPU rows")
    return NvidiaSmiTableFacts(
        timestamp=timestamp, smi_version=banner["smi"], driver_version=banner["driver"],
        cuda_version=banner["cuda"], layout="3-row" if three_rows else "2-row", gpus=gpus,
        mig_devices=mig, processes=procs, missing=missing)
