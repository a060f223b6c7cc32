"""nvidia-smi outputs: `--query-gpu` CSV, `-L`, and `-q -x`.

Rented nodes run anything from driver 470 to 580, so fields are found by name
(CSV header, XML tag) and both the old `throttle` and new `event` spellings are
accepted. A value nvidia-smi could not read (`[N/A]`, `[Not Supported]`, ...)
becomes None: a check must see "unknown", never a zero that looks healthy.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import NoReturn

from pydantic import BaseModel, ConfigDict

from orchestrator.errors import ParseError
from orchestrator.parsers import register

# What nvidia-smi prints when it has no value; compared without brackets.
_NA = {"n/a", "not supported", "unknown error", "insufficient permissions", ""}

# NVML nvmlClocksEventReason* bits (formerly nvmlClocksThrottleReason*).
CLOCK_EVENT_BITS: dict[int, str] = {
    0x1: "GpuIdle",
    0x2: "ApplicationsClocksSetting",
    0x4: "SwPowerCap",
    0x8: "HwSlowdown",
    0x10: "SyncBoost",
    0x20: "SwThermalSlowdown",
    0x40: "HwThermalSlowdown",
    0x80: "HwPowerBrakeSlowdown",
    0x100: "DisplayClockSetting",
}
# Reasons that mean the GPU runs slower than it should under load.
SLOWDOWN_REASONS = frozenset(
    {"SwPowerCap", "HwSlowdown", "SwThermalSlowdown", "HwThermalSlowdown", "HwPowerBrakeSlowdown"}
)


def is_na(value: str) -> bool:
    return value.strip().strip("[]").strip().lower() in _NA


def number(value: str, unit: str | None = None) -> float | None:
    """Parse `700.00 W` / `700.00` / `[N/A]`; a different unit is an error, not a guess."""
    if is_na(value):
        return None
    m = re.fullmatch(r"\s*(-?\d+(?:\.\d+)?)\s*([A-Za-z%/]+)?\s*", value)
    if not m or (m.group(2) is not None and m.group(2) != unit):
        raise ValueError(f"expected a number{f' in {unit}' if unit else ''}, got {value.strip()!r}")
    return float(m.group(1))


def integer(value: str, unit: str | None = None) -> int | None:
    v = number(value, unit)
    if v is None:
        return None
    if v != int(v):
        raise ValueError(f"expected a whole number, got {value.strip()!r}")
    return int(v)


def yes_no(value: str) -> bool | None:
    """Enabled/Disabled, Yes/No, On/Off, Active/Not Active -> bool."""
    v = value.strip().lower()
    if is_na(v):
        return None
    if v in ("enabled", "yes", "on", "active"):
        return True
    if v in ("disabled", "no", "off", "not active"):
        return False
    raise ValueError(f"expected Enabled/Disabled or Yes/No, got {value.strip()!r}")


def text_or_none(value: str) -> str | None:
    return None if is_na(value) else value.strip()


class ClockEventReasons(BaseModel):
    """Why clocks are below max; `mask` is NVML's bitmask, `active` its decoded names."""

    model_config = ConfigDict(extra="forbid")
    mask: int
    active: list[str]

    @property
    def slowdown(self) -> list[str]:
        return [r for r in self.active if r in SLOWDOWN_REASONS]

    @classmethod
    def from_mask(cls, mask: int) -> ClockEventReasons:
        names = [name for bit, name in CLOCK_EVENT_BITS.items() if mask & bit]
        unknown = mask & ~sum(CLOCK_EVENT_BITS)
        names += [f"0x{1 << b:x}" for b in range(64) if unknown & (1 << b)]
        return cls(mask=mask, active=names)


# --------------------------------------------------------------------------- query-gpu

# header name (units stripped) -> (field, converter). Aliases cover the spellings that
# nvidia-smi prints back (`clocks.current.sm` for `clocks.sm`) and older drivers.
_Conv = tuple[str, str]  # (field name, kind)
_COLUMNS: dict[str, _Conv] = {
    "index": ("index", "int"),
    "name": ("name", "str"),
    "uuid": ("uuid", "str"),
    "serial": ("serial", "str"),
    "pci.bus_id": ("pci_bus_id", "str"),
    "memory.total": ("memory_total_mib", "int:MiB"),
    "memory.used": ("memory_used_mib", "int:MiB"),
    "power.limit": ("power_limit_w", "float:W"),
    "power.max_limit": ("power_max_limit_w", "float:W"),
    "power.default_limit": ("power_default_limit_w", "float:W"),
    "enforced.power.limit": ("enforced_power_limit_w", "float:W"),
    "power.draw": ("power_draw_w", "float:W"),
    "driver_version": ("driver_version", "str"),
    "vbios_version": ("vbios_version", "str"),
    "pcie.link.gen.current": ("pcie_gen_current", "int"),
    "pcie.link.gen.max": ("pcie_gen_max", "int"),
    "pcie.link.width.current": ("pcie_width_current", "int"),
    "pcie.link.width.max": ("pcie_width_max", "int"),
    "temperature.gpu": ("temperature_gpu_c", "int"),
    "temperature.memory": ("temperature_memory_c", "int"),
    "clocks.sm": ("clocks_sm_mhz", "int:MHz"),
    "clocks.current.sm": ("clocks_sm_mhz", "int:MHz"),
    "clocks.max.sm": ("clocks_max_sm_mhz", "int:MHz"),
    "clocks.mem": ("clocks_mem_mhz", "int:MHz"),
    "clocks.current.memory": ("clocks_mem_mhz", "int:MHz"),
    "clocks_event_reasons.active": ("clocks_event_reasons", "reasons"),
    "clocks_throttle_reasons.active": ("clocks_event_reasons", "reasons"),
    "ecc.mode.current": ("ecc_enabled", "bool"),
    "ecc.errors.uncorrected.volatile.total": ("ecc_uncorrected_volatile", "int"),
    "ecc.errors.uncorrected.aggregate.total": ("ecc_uncorrected_aggregate", "int"),
    "ecc.errors.corrected.volatile.total": ("ecc_corrected_volatile", "int"),
    "ecc.errors.corrected.aggregate.total": ("ecc_corrected_aggregate", "int"),
    "retired_pages.pending": ("retired_pages_pending", "bool"),
    "mig.mode.current": ("mig_enabled", "bool"),
    "mig.mode.pending": ("mig_pending_enabled", "bool"),
    "compute_mode": ("compute_mode", "str"),
    "persistence_mode": ("persistence_mode", "bool"),
    "utilization.gpu": ("utilization_gpu_pct", "int:%"),
}


class QueryGpu(BaseModel):
    """One row of `--query-gpu`; a field is None when not queried or not available."""

    model_config = ConfigDict(extra="forbid")
    index: int | None = None
    name: str | None = None
    uuid: str | None = None
    serial: str | None = None
    pci_bus_id: str | None = None
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    power_limit_w: float | None = None
    power_max_limit_w: float | None = None
    power_default_limit_w: float | None = None
    enforced_power_limit_w: float | None = None
    power_draw_w: float | None = None
    driver_version: str | None = None
    vbios_version: str | None = None
    pcie_gen_current: int | None = None
    pcie_gen_max: int | None = None
    pcie_width_current: int | None = None
    pcie_width_max: int | None = None
    temperature_gpu_c: int | None = None
    temperature_memory_c: int | None = None
    clocks_sm_mhz: int | None = None
    clocks_max_sm_mhz: int | None = None
    clocks_mem_mhz: int | None = None
    clocks_event_reasons: ClockEventReasons | None = None
    ecc_enabled: bool | None = None
    ecc_uncorrected_volatile: int | None = None
    ecc_uncorrected_aggregate: int | None = None
    ecc_corrected_volatile: int | None = None
    ecc_corrected_aggregate: int | None = None
    retired_pages_pending: bool | None = None
    mig_enabled: bool | None = None
    mig_pending_enabled: bool | None = None
    compute_mode: str | None = None
    persistence_mode: bool | None = None
    utilization_gpu_pct: int | None = None
    # Queried fields this parser has no name for, kept verbatim (None for N/A).
    other: dict[str, str | None] = {}


class QueryGpuFacts(BaseModel):
    model_config = ConfigDict(extra="forbid")
    fields: list[str]
    gpus: list[QueryGpu]

    @property
    def count(self) -> int:
        return len(self.gpus)


def _convert(kind: str, raw: str) -> object:
    base, _, unit = kind.partition(":")
    if base == "str":
        return text_or_none(raw)
    if base == "int":
        return integer(raw, unit or None)
    if base == "float":
        return number(raw, unit or None)
    if base == "bool":
        return yes_no(raw)
    if is_na(raw):  # reasons
        return None
    if not re.fullmatch(r"0x[0-9a-fA-F]+", raw.strip()):
        raise ValueError(f"expected a hex bitmask, got {raw.strip()!r}")
    return ClockEventReasons.from_mask(int(raw.strip(), 16))


@register("nvidia-smi-query-gpu", "nvidia-smi --query-gpu=... --format=csv (with header)")
def parse_query_gpu(text: str, source: str | None = None) -> QueryGpuFacts:
    kind = "nvidia-smi-query-gpu"
    lines = [(n, ln) for n, ln in enumerate(text.splitlines(), 1) if ln.strip()]
    if not lines:
        raise ParseError(kind, "empty output", source=source)
    hdr_no, hdr = lines[0]
    names: list[str] = []
    for col in hdr.split(","):
        m = re.fullmatch(r"\s*([a-z_][a-z0-9_.]*)(?:\s+\[[^\]]+\])?\s*", col)
        if not m:
            raise ParseError(kind, f"header column {col.strip()!r} is not a field name "
                             "(the query must use --format=csv with its header)",
                             line_no=hdr_no, line=hdr, source=source)
        names.append(m.group(1))
    gpus: list[QueryGpu] = []
    for no, line in lines[1:]:
        cells = line.split(",")
        if len(cells) != len(names):
            raise ParseError(kind, f"{len(cells)} columns, header has {len(names)}",
                             line_no=no, line=line, source=source)
        values: dict[str, object] = {}
        other: dict[str, str | None] = {}
        for name, cell in zip(names, cells, strict=True):
            if name not in _COLUMNS:
                other[name] = text_or_none(cell)
                continue
            field, conv = _COLUMNS[name]
            try:
                values[field] = _convert(conv, cell)
            except ValueError as exc:
                raise ParseError(kind, f"{name}: {exc}", line_no=no, line=line,
                                 source=source) from None
        gpus.append(QueryGpu.model_validate({**values, "other": other}))
    return QueryGpuFacts(fields=names, gpus=gpus)


# --------------------------------------------------------------------------- -L

class MigDeviceL(BaseModel):
    model_config = ConfigDict(extra="forbid")
    profile: str  # e.g. 3g.40gb
    index: int
    uuid: str


class GpuL(BaseModel):
    model_config = ConfigDict(extra="forbid")
    index: int
    name: str
    uuid: str
    mig_devices: list[MigDeviceL] = []


class NvidiaSmiLFacts(BaseModel):
    model_config = ConfigDict(extra="forbid")
    gpus: list[GpuL]

    @property
    def count(self) -> int:
        return len(self.gpus)

    @property
    def mig_device_count(self) -> int:
        return sum(len(g.mig_devices) for g in self.gpus)


_GPU_L = re.compile(r"GPU (\d+): (.+?) \(UUID: (GPU-[0-9A-Fa-f-]+)\)")
_MIG_L = re.compile(r"\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: (MIG-[^)\s]+)\)")


@register("nvidia-smi-L", "nvidia-smi -L: GPUs and MIG devices")
def parse_nvidia_smi_l(text: str, source: str | None = None) -> NvidiaSmiLFacts:
    kind = "nvidia-smi-L"
    gpus: list[GpuL] = []
    seen_any = False
    for no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        seen_any = True
        if line.strip() == "No devices were found" and not gpus:
            continue
        if m := _GPU_L.fullmatch(line.rstrip()):
            gpus.append(GpuL(index=int(m.group(1)), name=m.group(2), uuid=m.group(3)))
        elif (m := _MIG_L.fullmatch(line.rstrip())) and gpus:
            gpus[-1].mig_devices.append(
                MigDeviceL(profile=m.group(1), index=int(m.group(2)), uuid=m.group(3)))
        else:
            raise ParseError(kind, "not a GPU or MIG device line", line_no=no, line=line,
                             source=source)
    if not seen_any:
        raise ParseError(kind, "empty output", source=source)
    return NvidiaSmiLFacts(gpus=gpus)


# --------------------------------------------------------------------------- -q -x

_REASON_TAGS = {
    "gpu_idle": "GpuIdle", "applications_clocks_setting": "ApplicationsClocksSetting",
    "sw_power_cap": "SwPowerCap", "hw_slowdown": "HwSlowdown", "sync_boost": "SyncBoost",
    "sw_thermal_slowdown": "SwThermalSlowdown", "hw_thermal_slowdown": "HwThermalSlowdown",
    "hw_power_brake_slowdown": "HwPowerBrakeSlowdown",
    "display_clocks_setting": "DisplayClockSetting",
}
_BIT_OF = {name: bit for bit, name in CLOCK_EVENT_BITS.items()}


class EccCounts(BaseModel):
    model_config = ConfigDict(extra="forbid")
    correctable: int | None = None
    uncorrectable: int | None = None


class RetiredPages(BaseModel):
    model_config = ConfigDict(extra="forbid")
    single_bit: int | None = None
    double_bit: int | None = None
    pending: bool | None = None


class RemappedRows(BaseModel):
    model_config = ConfigDict(extra="forbid")
    correctable: int | None = None
    uncorrectable: int | None = None
    pending: bool | None = None
    failure: bool | None = None


class MigDeviceXml(BaseModel):
    model_config = ConfigDict(extra="forbid")
    index: int | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    multiprocessor_count: int | None = None
    memory_total_mib: int | None = None


class GpuXml(BaseModel):
    """One `<gpu>` of `nvidia-smi -q -x`; index is its position, as nvidia-smi numbers it."""

    model_config = ConfigDict(extra="forbid")
    index: int
    pci_bus_id: str | None = None
    product_name: str | None = None
    product_brand: str | None = None
    product_architecture: str | None = None
    board_part_number: str | None = None
    serial: str | None = None
    uuid: str | None = None
    vbios_version: str | None = None
    persistence_mode: bool | None = None
    mig_enabled: bool | None = None
    mig_pending_enabled: bool | None = None
    mig_devices: list[MigDeviceXml] = []
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    ecc_enabled: bool | None = None
    ecc_pending_enabled: bool | None = None
    ecc_volatile: EccCounts = EccCounts()
    ecc_aggregate: EccCounts = EccCounts()
    retired_pages: RetiredPages = RetiredPages()
    remapped_rows: RemappedRows | None = None
    pcie_gen_current: int | None = None
    pcie_gen_max: int | None = None
    pcie_width_current: int | None = None
    pcie_width_max: int | None = None
    power_draw_w: float | None = None
    power_limit_w: float | None = None
    power_default_limit_w: float | None = None
    power_min_limit_w: float | None = None
    power_max_limit_w: float | None = None
    temperature_gpu_c: int | None = None
    clocks_sm_mhz: int | None = None
    clocks_max_sm_mhz: int | None = None
    clocks_event_reasons: ClockEventReasons | None = None
    performance_state: str | None = None
    compute_mode: str | None = None


class NvidiaSmiXmlFacts(BaseModel):
    model_config = ConfigDict(extra="forbid")
    driver_version: str | None
    cuda_version: str | None
    gpus: list[GpuXml]

    @property
    def count(self) -> int:
        return len(self.gpus)


class _Reader:
    """Reads leaves of one `<gpu>`; a bad value names its line in the original text."""

    def __init__(self, text: str, gpu: ET.Element, source: str | None) -> None:
        self.text, self.gpu, self.source = text, gpu, source

    def raw(self, *paths: str) -> str | None:
        for path in paths:
            el = self.gpu.find(path)
            if el is not None and len(el) == 0:
                return (el.text or "").strip()
        return None

    def get(self, conv: str, *paths: str) -> object:
        raw = self.raw(*paths)
        if raw is None:
            return None
        try:
            return _convert(conv, raw)
        except ValueError as exc:
            tag = paths[0].rsplit("/", 1)[-1]
            self.fail(f"<{tag}>: {exc}", f"<{tag}>{raw}</{tag}>")

    def fail(self, what: str, needle: str) -> NoReturn:
        line_no = line = None
        pos = self.text.find(needle)
        if pos >= 0:
            line_no = self.text.count("\n", 0, pos) + 1
            line = self.text.splitlines()[line_no - 1]
        raise ParseError("nvidia-smi-q-xml", what, line_no=line_no, line=line,
                         source=self.source)

    def ecc(self, section: str) -> EccCounts:
        el = self.gpu.find(f"ecc_errors/{section}")
        if el is None:
            return EccCounts()
        if el.find("double_bit") is not None:  # drivers before ~510
            return EccCounts.model_validate({
                "correctable": self.get("int", f"ecc_errors/{section}/single_bit/total"),
                "uncorrectable": self.get("int", f"ecc_errors/{section}/double_bit/total")})
        sums: dict[str, int | None] = {"correctable": None, "uncorrectable": None}
        for leaf in el:
            key = "uncorrectable" if "uncorrectable" in leaf.tag else (
                "correctable" if "correctable" in leaf.tag else None)
            if key is None:
                continue
            v = self.get("int", f"ecc_errors/{section}/{leaf.tag}")
            if isinstance(v, int):
                sums[key] = (sums[key] or 0) + v
        return EccCounts.model_validate(sums)

    def reasons(self) -> ClockEventReasons | None:
        sect = self.gpu.find("clocks_event_reasons")
        if sect is None:
            sect = self.gpu.find("clocks_throttle_reasons")
        if sect is None:
            return None
        mask, names, known = 0, [], False
        for leaf in sect:
            suffix = re.sub(r"^clocks_(event|throttle)_reason_", "", leaf.tag)
            state = self.get("bool", f"{sect.tag}/{leaf.tag}")
            if state is None:
                continue
            known = True
            name = _REASON_TAGS.get(suffix, suffix)
            if state:
                names.append(name)
                mask |= _BIT_OF.get(name, 0)
        return ClockEventReasons(mask=mask, active=names) if known else None

    def gpu_facts(self, index: int) -> GpuXml:
        g, i, s, b = self.get, "int", "str", "bool"
        power = "gpu_power_readings" if self.gpu.find("gpu_power_readings") is not None \
            else "power_readings"
        migs = [_Sub(self, m).mig() for m in self.gpu.findall("mig_devices/mig_device")]
        remap = self.gpu.find("remapped_rows")
        rows = None
        if remap is not None and len(remap):
            rows = RemappedRows.model_validate({
                "correctable": g(i, "remapped_rows/remapped_row_corr"),
                "uncorrectable": g(i, "remapped_rows/remapped_row_unc"),
                "pending": g(b, "remapped_rows/remapped_row_pending"),
                "failure": g(b, "remapped_rows/remapped_row_failure")})
        link = "pci/pci_gpu_link_info"
        return GpuXml.model_validate({
            "index": index, "pci_bus_id": self.gpu.get("id") or g(s, "pci/pci_bus_id"),
            "product_name": g(s, "product_name"), "product_brand": g(s, "product_brand"),
            "product_architecture": g(s, "product_architecture"),
            "board_part_number": g(s, "board_part_number"), "serial": g(s, "serial"),
            "uuid": g(s, "uuid"), "vbios_version": g(s, "vbios_version"),
            "persistence_mode": g(b, "persistence_mode"),
            "mig_enabled": g(b, "mig_mode/current_mig"),
            "mig_pending_enabled": g(b, "mig_mode/pending_mig"), "mig_devices": migs,
            "memory_total_mib": g("int:MiB", "fb_memory_usage/total"),
            "memory_used_mib": g("int:MiB", "fb_memory_usage/used"),
            "ecc_enabled": g(b, "ecc_mode/current_ecc"),
            "ecc_pending_enabled": g(b, "ecc_mode/pending_ecc"),
            "ecc_volatile": self.ecc("volatile"), "ecc_aggregate": self.ecc("aggregate"),
            "retired_pages": {
                "single_bit": g(i, "retired_pages/multiple_single_bit_retirement/retired_count"),
                "double_bit": g(i, "retired_pages/double_bit_retirement/retired_count"),
                "pending": g(b, "retired_pages/pending_retirement",
                             "retired_pages/pending_blacklist")},
            "remapped_rows": rows,
            "pcie_gen_current": g(i, f"{link}/pcie_gen/current_link_gen"),
            "pcie_gen_max": g(i, f"{link}/pcie_gen/max_link_gen"),
            "pcie_width_current": g("int:x", f"{link}/link_widths/current_link_width"),
            "pcie_width_max": g("int:x", f"{link}/link_widths/max_link_width"),
            "power_draw_w": g("float:W", f"{power}/power_draw", f"{power}/instant_power_draw",
                              f"{power}/average_power_draw"),
            "power_limit_w": g("float:W", f"{power}/current_power_limit",
                               f"{power}/enforced_power_limit", f"{power}/power_limit"),
            "power_default_limit_w": g("float:W", f"{power}/default_power_limit"),
            "power_min_limit_w": g("float:W", f"{power}/min_power_limit"),
            "power_max_limit_w": g("float:W", f"{power}/max_power_limit"),
            "temperature_gpu_c": g("int:C", "temperature/gpu_temp"),
            "clocks_sm_mhz": g("int:MHz", "clocks/sm_clock"),
            "clocks_max_sm_mhz": g("int:MHz", "max_clocks/sm_clock"),
            "clocks_event_reasons": self.reasons(),
            "performance_state": g(s, "performance_state"), "compute_mode": g(s, "compute_mode"),
        })


class _Sub(_Reader):
    def __init__(self, parent: _Reader, el: ET.Element) -> None:
        super().__init__(parent.text, el, parent.source)

    def mig(self) -> MigDeviceXml:
        return MigDeviceXml.model_validate({
            "index": self.get("int", "index"),
            "gpu_instance_id": self.get("int", "gpu_instance_id"),
            "compute_instance_id": self.get("int", "compute_instance_id"),
            "multiprocessor_count": self.get("int", "device_attributes/shared/multiprocessor_count"),
            "memory_total_mib": self.get("int:MiB", "fb_memory_usage/total"),
        })


@register("nvidia-smi-q-xml", "nvidia-smi -q -x: per-GPU health, MIG, ECC, PCIe, power")
def parse_nvidia_smi_xml(text: str, source: str | None = None) -> NvidiaSmiXmlFacts:
    kind = "nvidia-smi-q-xml"
    if not text.strip():
        raise ParseError(kind, "empty output", source=source)
    # The DOCTYPE names a DTD file that is not shipped; drop it before parsing.
    body = re.sub(r"<!DOCTYPE[^>]*>", "", text, count=1)
    try:
        root = ET.fromstring(body)
    except ET.ParseError as exc:
        line_no = exc.position[0]
        lines = body.splitlines()
        raise ParseError(kind, f"not well-formed XML ({exc})", line_no=line_no,
                         line=lines[line_no - 1] if 0 < line_no <= len(lines) else None,
                         source=source) from None
    if root.tag != "nvidia_smi_log":
        raise ParseError(kind, f"root element is <{root.tag}>, not <nvidia_smi_log>",
                         line_no=1, line=text.splitlines()[0], source=source)

    def top(tag: str) -> str | None:
        el = root.find(tag)
        return None if el is None else text_or_none(el.text or "")

    gpus = [_Reader(text, g, source).gpu_facts(n) for n, g in enumerate(root.findall("gpu"))]
    return NvidiaSmiXmlFacts(driver_version=top("driver_version"),
                             cuda_version=top("cuda_version"), gpus=gpus)
