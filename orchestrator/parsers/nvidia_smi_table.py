"""The default `nvidia-smi` table: the one output every rented node answers.

People paste it everywhere and some providers only let you see this, so it is
a source of GPU facts in its own right. The layout changed over the years (two
rows per GPU before R450, a `MIG M.` row after; `KMD`/`CUDA UMD Version` in the
banner since R610; wider columns since R530), so cells are found by the box
drawing, not by character offsets. Every cell is read by meaning; a row that
fits no known shape raises ParseError with its line. Lines around the boxes
(a prompt, the command, an ssh warning) are read past by the shared noise
reader and listed; a paste that starts at the MIG devices or processes box
reads what it holds and says the GPU table is missing; a second banner means
several outputs in one text (interleaved by `mpirun nvidia-smi`, or appended)
and is refused with that reason.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TypeVar

from pydantic import BaseModel, ConfigDict

from orchestrator.errors import ParseError
from orchestrator.parsers import register
from orchestrator.parsers._noise import Edit, IgnoredLine, NoiseReader
from orchestrator.parsers._smi_warnings import SmiWarning, smi_warning
from orchestrator.parsers.nvidia_smi import (
    CELSIUS,
    INT,
    PERCENT,
    WATTS,
    is_na,
    text_or_none,
)

KIND = "nvidia-smi-table"
T = TypeVar("T")

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
    memory_mib: int | None  # None: N/A, or a cell nvidia-smi cut short (`memory_truncated`)
    line_no: int
    memory_truncated: bool = False  # the cell read `12861...`: too wide for the column


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
    ignored_lines: list[IgnoredLine] = []  # prompts and launcher lines around the boxes
    edits: list[Edit] = []  # `[...]` and the like between the boxes
    warnings: list[SmiWarning] = []  # infoROM corrupted, a GPU it cannot reach or must reset
    exit_status: int | None = None  # a last line `14` (`nvidia-smi; echo $?`), as printed

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
        self.noise = NoiseReader()

    def fail(self, what: str, n: int | None = None) -> ParseError:
        n = self.i if n is None else n
        line = self.lines[n] if 0 <= n < len(self.lines) else None
        return ParseError(KIND, what, line_no=n + 1 if line is not None else None, line=line,
                          source=self.source)

    def skip_blank(self) -> None:
        """Past blank lines and known noise (a prompt, the command, launcher lines)."""
        while self.i < len(self.lines) and (not self.lines[self.i].strip() or (
                not self.lines[self.i].lstrip().startswith(("|", "+"))
                and self.noise.skip(self.i + 1, self.lines[self.i]))):
            self.i += 1

    def at_end(self) -> bool:
        return self.i >= len(self.lines)

    def cur(self) -> str:
        return self.lines[self.i]


def _read(r: _Reader, n: int, raw: str, conv: Callable[[str], T]) -> T:
    """One cell through its typed reader; a cell it cannot read names its line."""
    try:
        return conv(raw)
    except ValueError as exc:
        raise r.fail(str(exc), n) from None


def _reading(r: _Reader, n: int, raw: str, conv: Callable[[str], T],
             errors: list[str], key: str) -> T | None:
    """A cell nvidia-smi printed as `ERR!` is an error to report, not a value."""
    if raw.strip() == "ERR!":
        errors.append(key)
        return None
    return _read(r, n, raw, conv)


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
    fan = _reading(r, n2, fan_raw, PERCENT, errors, "fan")
    temp = _reading(r, n2, temp_raw, CELSIUS, errors, "temp")
    draw = _reading(r, n2, draw_raw, WATTS, errors, "draw")
    cap = _reading(r, n2, cap_raw, WATTS, errors, "cap")
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
        ecc_cell=ecc_cell, fan_pct=fan, temperature_c=temp,
        performance_state=text_or_none(perf), power_draw_w=draw, power_cap_w=cap,
        memory_used_mib=int(mem.group(1)) if mem else None,
        memory_total_mib=int(mem.group(2)) if mem else None,
        utilization_pct=_read(r, n2, util_cm[0], PERCENT),
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
            if not cur and blocks:
                break  # the box was closed by its rule: what follows is not the table's
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
        if len(block) == 1 and "|".join(c1).strip() == "No MIG devices found":
            continue  # MIG mode is on, but no GPU instance was created
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
            sm_count=_read(r, n1, sm_ecc[0], INT),
            ecc_uncorrected=_read(r, n1, sm_ecc[1], INT),
            engines={k: _read(r, n1, v, INT) for k, v in
                     zip(names or [f"engine{k}" for k in range(len(eng))], eng, strict=True)},
            line_no=n1 + 1))
    return out


_PROC = re.compile(r"\s*(?P<gpu>\d+)\s+(?:(?P<gi>\S+)\s+(?P<ci>\S+)\s+)?(?P<pid>\d+)\s+"
                   r"(?P<type>[A-Z+]+)\s+(?P<name>.*?)\s+(?P<mem>\d+MiB|N/A|\d*\.\.\.)\s*")


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
                memory_mib=int(m["mem"][:-3]) if m["mem"].endswith("MiB") else None,
                line_no=n + 1, memory_truncated=m["mem"].endswith("...")))
    return out


def parse_nvidia_smi_table(text: str, source: str | None = None) -> NvidiaSmiTableFacts:
    r = _Reader(text, source)
    _one_output(r)
    warnings: list[SmiWarning] = []
    for n, line in enumerate(r.lines):
        w = smi_warning(n + 1, line)
        if w is not None:
            warnings.append(w)
            r.lines[n] = ""  # read past: the table around it is still the table
    r.skip_blank()
    if r.at_end() and warnings:  # nvidia-smi printed only what it could not do
        return NvidiaSmiTableFacts(
            timestamp=None, smi_version=None, driver_version=None, cuda_version=None,
            layout="3-row", gpus=[], mig_devices=[], processes=None,
            missing=["the GPU table (nvidia-smi printed only its warnings)"],
            ignored_lines=r.noise.ignored, edits=r.noise.edits, warnings=warnings)
    if r.at_end():
        raise ParseError(KIND, "empty output", source=source)
    timestamp = None
    if _TIMESTAMP.fullmatch(r.cur().strip()):
        timestamp = r.cur().strip()
        r.i += 1
    gpus: list[TableGpu] = []
    missing: list[str] = []
    if not r.at_end() and _cells(r.cur().strip()) is not None and _BANNER.search(r.cur()):
        # a paste that starts at the banner row, its top rule cut off: read it from there
        missing.append("the rule above the banner (the paste starts at the banner row)")
        r.i -= 1
    elif r.at_end() or not _RULE.fullmatch(r.cur().strip()):
        raise r.fail("not an nvidia-smi table (no box above the NVIDIA-SMI banner)")
    banner = _BANNER.search(r.lines[r.i + 1]) if r.i + 1 < len(r.lines) else None
    three_rows = True
    if banner is not None:
        r.i += 2
        header = _header(r)
        three_rows = any("MIG M." in h for h in header)
        cut: list[bool] = []
        blocks = _blocks(r, cut)
        for k, block in enumerate(blocks):
            if cut and k == len(blocks) - 1 and len(block) < (3 if three_rows else 2):
                missing.append(f"the rest of the GPU block at line {block[0][0] + 1} "
                               "(text cut off)")
                continue
            gpus.append(_gpu_rows(r, block, three_rows))
    elif _title(r, r.i + 1) in _SUB_TABLES:
        missing.append("the GPU table (the paste starts at the "
                       f"{_title(r, r.i + 1)} table)")
    else:
        raise r.fail("no `NVIDIA-SMI ... Driver Version:` banner", r.i + 1)
    mig: list[TableMigDevice] = []
    procs: list[TableProcess] | None = None
    exit_status: int | None = None
    while True:
        r.skip_blank()
        if r.at_end():
            break
        if re.fullmatch(r"\d{1,3}", r.cur().strip()) and not any(
                ln.strip() for ln in r.lines[r.i + 1:]):
            exit_status = int(r.cur().strip())  # `nvidia-smi; echo $?` (14: infoROM corrupted)
            break
        if not _RULE.fullmatch(r.cur().strip()):
            raise r.fail("expected the MIG devices or processes table")
        title = _title(r, r.i + 1)
        if title not in _SUB_TABLES:
            raise r.fail("unknown table after the GPU table", r.i + 1)
        r.i += 2
        sub_header = _header(r)
        if title == "MIG devices":
            mig = _mig_devices(r, sub_header)
        else:
            procs = _processes(r, sub_header)
    if procs is None:
        missing.append("processes table")
    if not gpus and banner is not None:
        missing.append("GPU rows")
    return NvidiaSmiTableFacts(
        timestamp=timestamp, smi_version=banner["smi"] if banner else None,
        driver_version=banner["driver"] if banner else None,
        cuda_version=banner["cuda"] if banner else None,
        layout="3-row" if three_rows else "2-row", gpus=gpus, mig_devices=mig, processes=procs,
        missing=missing, ignored_lines=r.noise.ignored, edits=r.noise.edits, warnings=warnings,
        exit_status=exit_status)


register(KIND, "the default nvidia-smi table: driver, CUDA, GPUs, MIG devices, processes",
         example="nvidia-smi | tee nvidia-smi.txt")(parse_nvidia_smi_table)


_SUB_TABLES = ("MIG devices", "Processes")


def _title(r: _Reader, n: int) -> str:
    """The title of the box whose first row is line `n` (`MIG devices`, `Processes`)."""
    if n >= len(r.lines):
        return ""
    return (_cells(r.lines[n]) or [""])[0].split(":")[0].strip()


def _one_output(r: _Reader) -> None:
    """Refuse a text that holds several tables: one host's facts would mix with another's."""
    at = [n for n, ln in enumerate(r.lines) if _BANNER.search(ln)]
    if len(at) > 1:
        shown = ", ".join(str(n + 1) for n in at[:6])
        raise r.fail(f"{len(at)} nvidia-smi banners (lines {shown}): several outputs in one "
                     "text, interleaved (mpirun or srun running nvidia-smi on several hosts) "
                     "or appended; keep one host's output per file, or run it with "
                     "`mpirun --tag-output` / `srun -l` so the lines say whose they are",
                     at[1])
