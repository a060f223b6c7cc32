"""nvidia-smi outputs: `--query-gpu` CSV and `-L` (`-q -x` is in nvidia_smi_xml).

Rented nodes run anything from driver 470 to 580, so fields are found by name
(CSV header, XML tag) and both the old `throttle` and new `event` spellings are
accepted. A value nvidia-smi could not read (`[N/A]`, `[Not Supported]`, ...)
becomes None: a check must see "unknown", never a zero that looks healthy.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from pydantic import BaseModel, ConfigDict

from orchestrator.errors import ParseError
from orchestrator.parsers import register
from orchestrator.parsers._smi_warnings import SmiWarning, split_warnings
from payload.nodecheck import fabric_problem

# What nvidia-smi prints when it has no value; compared without brackets.
_NA = {"n/a", "not supported", "unknown error", "insufficient permissions", "",
       "requested functionality has been deprecated", "not available", "no permission"}
# What nvidia-smi prints in place of a value when the GPU itself is in trouble.
GPU_ERROR_CELLS = {"gpu requires reset", "gpu is lost", "unknown error"}

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


def to_int(unit: str | None = None) -> Callable[[str], int | None]:
    """A reader of whole numbers in `unit` (`81920 MiB`, `x16`-less `16`), N/A -> None."""
    return lambda value: integer(value, unit)


def to_float(unit: str | None = None) -> Callable[[str], float | None]:
    return lambda value: number(value, unit)


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


class FabricState(BaseModel):
    """The GPU's registration with the NVLink fabric (`-q` "Fabric", `-q -x` <fabric>).

    On NVSwitch systems (HGX, GH200/GB200) the fabric manager must finish
    (`State: Completed`) and succeed (`Status: Success`) before CUDA can use the
    NVLink fabric; anything else means jobs fail at init or run without NVLink.
    None where nvidia-smi printed N/A (a GPU with no fabric to join).
    """

    model_config = ConfigDict(extra="forbid")
    state: str | None = None
    status: str | None = None
    clique_id: str | None = None
    cluster_uuid: str | None = None
    health_summary: str | None = None
    line_no: int | None = None  # where `Fabric` stands in the text (None for XML)

    @property
    def known(self) -> bool:
        return self.state is not None or self.status is not None

    @property
    def problem(self) -> str | None:
        """What is wrong, in nvidia-smi's own words; None when registration succeeded. The
        rule is the node check's (`payload.nodecheck.fabric_problem`)."""
        return fabric_problem(self.state, self.status, self.health_summary)


def reasons_mask(value: str) -> ClockEventReasons | None:
    """`0x0000000000000004` (the query's bitmask) as decoded reasons; N/A -> None."""
    if is_na(value):
        return None
    if not re.fullmatch(r"0x[0-9a-fA-F]+", value.strip()):
        raise ValueError(f"expected a hex bitmask, got {value.strip()!r}")
    return ClockEventReasons.from_mask(int(value.strip(), 16))


# The typed readers every nvidia-smi parser uses: each turns one printed value into
# its type or None (N/A), and raises ValueError naming what it expected.
TEXT: Callable[[str], str | None] = text_or_none
FLAG: Callable[[str], bool | None] = yes_no
INT = to_int()
MIB = to_int("MiB")
MHZ = to_int("MHz")
CELSIUS = to_int("C")
LANES = to_int("x")
PERCENT = to_int("%")
WATTS = to_float("W")
REASONS: Callable[[str], ClockEventReasons | None] = reasons_mask


# --------------------------------------------------------------------------- query-gpu

# header name (units stripped) -> (field, converter). Aliases cover the spellings that
# nvidia-smi prints back (`clocks.current.sm` for `clocks.sm`) and older drivers.
_Conv = tuple[str, Callable[[str], object]]  # (field name, reader)
_COLUMNS: dict[str, _Conv] = {
    "index": ("index", INT),
    "name": ("name", TEXT),
    "gpu_name": ("name", TEXT),
    "uuid": ("uuid", TEXT),
    "gpu_uuid": ("uuid", TEXT),
    "serial": ("serial", TEXT),
    "gpu_serial": ("serial", TEXT),
    "pci.bus_id": ("pci_bus_id", TEXT),
    "pci.device_id": ("pci_device_id", TEXT),
    "gpu_bus_id": ("pci_bus_id", TEXT),
    "memory.total": ("memory_total_mib", MIB),
    "memory.used": ("memory_used_mib", MIB),
    "memory.reserved": ("memory_reserved_mib", MIB),
    "power.limit": ("power_limit_w", WATTS),
    "power.max_limit": ("power_max_limit_w", WATTS),
    "power.default_limit": ("power_default_limit_w", WATTS),
    "power.min_limit": ("power_min_limit_w", WATTS),
    "enforced.power.limit": ("enforced_power_limit_w", WATTS),
    "power.draw": ("power_draw_w", WATTS),
    "power.draw.average": ("power_draw_w", WATTS),
    "driver_version": ("driver_version", TEXT),
    "vbios_version": ("vbios_version", TEXT),
    "pcie.link.gen.current": ("pcie_gen_current", INT),
    "pcie.link.gen.gpucurrent": ("pcie_gen_current", INT),
    "pcie.link.gen.max": ("pcie_gen_max", INT),
    "pcie.link.gen.gpumax": ("pcie_gen_device_max", INT),
    "pcie.link.gen.hostmax": ("pcie_gen_host_max", INT),
    "pcie.link.width.current": ("pcie_width_current", INT),
    "pcie.link.width.max": ("pcie_width_max", INT),
    "temperature.gpu": ("temperature_gpu_c", INT),
    "temperature.memory": ("temperature_memory_c", INT),
    "clocks.sm": ("clocks_sm_mhz", MHZ),
    "clocks.current.sm": ("clocks_sm_mhz", MHZ),
    "clocks.max.sm": ("clocks_max_sm_mhz", MHZ),
    "clocks.mem": ("clocks_mem_mhz", MHZ),
    "clocks.current.memory": ("clocks_mem_mhz", MHZ),
    "clocks_event_reasons.active": ("clocks_event_reasons", REASONS),
    "clocks_throttle_reasons.active": ("clocks_event_reasons", REASONS),
    "ecc.mode.current": ("ecc_enabled", FLAG),
    "ecc.errors.uncorrected.volatile.total": ("ecc_uncorrected_volatile", INT),
    "ecc.errors.uncorrected.aggregate.total": ("ecc_uncorrected_aggregate", INT),
    "ecc.errors.corrected.volatile.total": ("ecc_corrected_volatile", INT),
    "ecc.errors.corrected.aggregate.total": ("ecc_corrected_aggregate", INT),
    "retired_pages.pending": ("retired_pages_pending", FLAG),
    "remapped_rows.correctable": ("remapped_rows_correctable", INT),
    "remapped_rows.uncorrectable": ("remapped_rows_uncorrectable", INT),
    "remapped_rows.pending": ("remapped_rows_pending", FLAG),
    "remapped_rows.failure": ("remapped_rows_failure", FLAG),
    "mig.mode.current": ("mig_enabled", FLAG),
    "mig.mode.pending": ("mig_pending_enabled", FLAG),
    "compute_mode": ("compute_mode", TEXT),
    "persistence_mode": ("persistence_mode", FLAG),
    "utilization.gpu": ("utilization_gpu_pct", PERCENT),
}


class QueryGpu(BaseModel):
    """One row of `--query-gpu`; a field is None when not queried or not available."""

    model_config = ConfigDict(extra="forbid")
    index: int | None = None
    name: str | None = None
    uuid: str | None = None
    serial: str | None = None
    pci_bus_id: str | None = None
    pci_device_id: str | None = None  # 0x233010DE: the device id, then NVIDIA's vendor id
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    memory_reserved_mib: int | None = None
    power_limit_w: float | None = None
    power_max_limit_w: float | None = None
    power_default_limit_w: float | None = None
    power_min_limit_w: float | None = None
    enforced_power_limit_w: float | None = None
    power_draw_w: float | None = None
    driver_version: str | None = None
    vbios_version: str | None = None
    pcie_gen_current: int | None = None
    pcie_gen_max: int | None = None
    pcie_gen_device_max: int | None = None
    pcie_gen_host_max: int | None = None
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
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    mig_enabled: bool | None = None
    mig_pending_enabled: bool | None = None
    compute_mode: str | None = None
    persistence_mode: bool | None = None
    utilization_gpu_pct: int | None = None
    # Queried fields this parser has no name for, kept verbatim (None for N/A).
    other: dict[str, str | None] = {}
    # Cells where nvidia-smi printed a GPU error instead of a value ([GPU requires reset])
    errors: list[str] = []


class QueryGpuFacts(BaseModel):
    model_config = ConfigDict(extra="forbid")
    fields: list[str]
    gpus: list[QueryGpu]
    # `--format=csv,noheader`: the field list the values were read against, which the
    # file itself does not say (only a list whose every value has its own shape is read)
    header_assumed: str | None = None
    warnings: list[SmiWarning] = []  # nvidia-smi's own lines about a GPU (2>&1), read past

    @property
    def count(self) -> int:
        return len(self.gpus)


def parse_query_gpu(text: str, source: str | None = None) -> QueryGpuFacts:
    kind = "nvidia-smi-query-gpu"
    lines, warnings = split_warnings(text)
    if not lines:
        raise ParseError(kind, "empty output", source=source)
    hdr_no, hdr = lines[0]
    names: list[str] = []
    for col in hdr.split(","):
        # Field names are matched without case: newer drivers echo `pci.baseClass`,
        # `fabric.cliqueId`; tools that wrap nvidia-smi print `Name` or `GPU_NAME`.
        m = re.fullmatch(r"\s*([A-Za-z_][A-Za-z0-9_.]*)(?:\s+\[[^\]]+\])?\s*", col)
        if not m or re.fullmatch(r"-?\d+(?:\.\d+)?|GPU-[0-9a-fA-F-]+", col.strip()):
            raise ParseError(kind, f"header column {col.strip()!r} is not a field name "
                             "(the query must use --format=csv with its header)",
                             line_no=hdr_no, line=hdr, source=source)
        names.append(m.group(1))
    if len(set(n.lower() for n in names)) != len(names):
        raise ParseError(kind, "a field appears twice in the header", line_no=hdr_no, line=hdr,
                         source=source)
    gpus: list[QueryGpu] = []
    for no, line in lines[1:]:
        cells = line.split(",")
        if len(cells) != len(names):
            raise ParseError(kind, f"{len(cells)} columns, header has {len(names)}",
                             line_no=no, line=line, source=source)
        values: dict[str, object] = {}
        other: dict[str, str | None] = {}
        errors: list[str] = []
        for name, cell in zip(names, cells, strict=True):
            spec = _COLUMNS.get(name.lower())
            if spec is None or (spec[0] in values and values[spec[0]] is not None):
                other[name] = text_or_none(cell)  # unknown, or an alias already read
                continue
            field, conv = spec
            if cell.strip().strip("[]").strip().lower() in GPU_ERROR_CELLS:
                errors.append(f"{name}: {cell.strip()}")
                values[field] = None
                continue
            try:
                values[field] = conv(cell)
            except ValueError as exc:
                raise ParseError(kind, f"{name}: {exc}", line_no=no, line=line,
                                 source=source) from None
        gpus.append(QueryGpu.model_validate({**values, "other": other, "errors": errors}))
    return QueryGpuFacts(fields=names, gpus=gpus, warnings=warnings)


register("nvidia-smi-query-gpu", "nvidia-smi --query-gpu=... --format=csv (with header)",
         example="nvidia-smi --query-gpu=index,name,uuid,memory.total,power.limit,driver_version"
                 " --format=csv")(parse_query_gpu)


# `--format=csv,noheader[,nounits]` prints no field names. A CSV without them is read
# only against a field list people run (the acceptance recipe's), and only when every
# cell has the shape of its field: an index, a name, a GPU UUID, a MiB count, watts, a
# driver version. Anything else is refused rather than guessed.
RECIPE_QUERY_FIELDS = ("index", "name", "uuid", "memory.total", "power.limit", "driver_version")
_RECIPE_SHAPES = (r"\d+", r"(?!GPU-)[^,]*[A-Za-z][^,]*", r"GPU-[0-9a-fA-F-]+",
                  r"\d+(?: MiB)?", r"(?:\d+(?:\.\d+)?(?: W)?|\[N/A\])", r"\d+\.\d+(?:\.\d+)?")
_RECIPE_HEADER = "index, name, uuid, memory.total [MiB], power.limit [W], driver_version"


def noheader_fits(line: str) -> bool:
    cells = [c.strip() for c in line.split(",")]
    return len(cells) == len(_RECIPE_SHAPES) and all(
        re.fullmatch(shape, cell) for shape, cell in zip(_RECIPE_SHAPES, cells, strict=True))


def parse_query_gpu_noheader(text: str, source: str | None = None) -> QueryGpuFacts:
    kind = "nvidia-smi-query-gpu-noheader"
    lines, warnings = split_warnings(text)
    if not lines:
        raise ParseError(kind, "empty output", source=source)
    for no, line in lines:
        if not noheader_fits(line):
            raise ParseError(kind, "a CSV without its header is read only with the acceptance "
                             f"recipe's fields ({','.join(RECIPE_QUERY_FIELDS)}), each value of "
                             "its field's shape; save other queries with --format=csv (with the "
                             "header)", line_no=no, line=line, source=source)
    facts = parse_query_gpu("\n".join([_RECIPE_HEADER] + [ln for _, ln in lines]),
                            source=source)
    return facts.model_copy(update={"header_assumed": ",".join(RECIPE_QUERY_FIELDS),
                                    "warnings": warnings})


register("nvidia-smi-query-gpu-noheader", "nvidia-smi --query-gpu with the recipe's fields, "
         "--format=csv,noheader[,nounits]",
         example="nvidia-smi --query-gpu=index,name,uuid,memory.total,power.limit,driver_version"
                 " --format=csv,noheader,nounits")(parse_query_gpu_noheader)


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


register("nvidia-smi-L", "nvidia-smi -L: GPUs and MIG devices",
         example="nvidia-smi -L | tee gpu-list.txt")(parse_nvidia_smi_l)
