"""nvidia-smi -q -x: per-GPU health, MIG, ECC, PCIe, power and clocks.

Tags are found by name and both the old `throttle` and new `event` spellings
of the clock reasons are accepted; values nvidia-smi could not read become None.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Callable
from typing import NoReturn, TypeVar

from pydantic import BaseModel, ConfigDict

from orchestrator.errors import ParseError
from orchestrator.parsers import register
from orchestrator.parsers.nvidia_smi import (
    CELSIUS,
    CLOCK_EVENT_BITS,
    FLAG,
    INT,
    LANES,
    MHZ,
    MIB,
    TEXT,
    WATTS,
    ClockEventReasons,
    FabricState,
    text_or_none,
)

T = TypeVar("T")

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


class ProcessXml(BaseModel):
    model_config = ConfigDict(extra="forbid")
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    pid: int | None = None
    type: str | None = None
    name: str | None = None
    used_memory_mib: int | None = None


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
    pcie_gen_device_max: int | None = None
    pcie_gen_host_max: int | None = None  # the root port's max: a GPU cannot link faster
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
    fabric: FabricState | None = None
    performance_state: str | None = None
    compute_mode: str | None = None
    processes: list[ProcessXml] | None = None  # None when the element is absent


class NvidiaSmiXmlFacts(BaseModel):
    model_config = ConfigDict(extra="forbid")
    driver_version: str | None
    cuda_version: str | None
    gpus: list[GpuXml]
    attached_gpus: int | None = None  # what the driver counts; more than len(gpus) in an `-i` run

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

    def get(self, conv: Callable[[str], T], *paths: str) -> T | None:
        raw = self.raw(*paths)
        if raw is None:
            return None
        try:
            return conv(raw)
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
                "correctable": self.get(INT, f"ecc_errors/{section}/single_bit/total"),
                "uncorrectable": self.get(INT, f"ecc_errors/{section}/double_bit/total")})
        sums: dict[str, int | None] = {"correctable": None, "uncorrectable": None}
        for leaf in el:
            key = "uncorrectable" if "uncorrectable" in leaf.tag else (
                "correctable" if "correctable" in leaf.tag else None)
            if key is None:
                continue
            v = self.get(INT, f"ecc_errors/{section}/{leaf.tag}")
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
            state = self.get(FLAG, f"{sect.tag}/{leaf.tag}")
            if state is None:
                continue
            known = True
            name = _REASON_TAGS.get(suffix, suffix)
            if state:
                names.append(name)
                mask |= _BIT_OF.get(name, 0)
        return ClockEventReasons(mask=mask, active=names) if known else None

    def gpu_facts(self, index: int) -> GpuXml:
        g, i, s, b = self.get, INT, TEXT, FLAG
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
            "memory_total_mib": g(MIB, "fb_memory_usage/total"),
            "memory_used_mib": g(MIB, "fb_memory_usage/used"),
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
            "pcie_gen_device_max": g(i, f"{link}/pcie_gen/max_device_link_gen"),
            "pcie_gen_host_max": g(i, f"{link}/pcie_gen/max_host_link_gen"),
            "pcie_width_current": g(LANES, f"{link}/link_widths/current_link_width"),
            "pcie_width_max": g(LANES, f"{link}/link_widths/max_link_width"),
            "power_draw_w": g(WATTS, f"{power}/power_draw", f"{power}/instant_power_draw",
                              f"{power}/average_power_draw"),
            "power_limit_w": g(WATTS, f"{power}/current_power_limit",
                               f"{power}/enforced_power_limit", f"{power}/power_limit"),
            "power_default_limit_w": g(WATTS, f"{power}/default_power_limit"),
            "power_min_limit_w": g(WATTS, f"{power}/min_power_limit"),
            "power_max_limit_w": g(WATTS, f"{power}/max_power_limit"),
            "temperature_gpu_c": g(CELSIUS, "temperature/gpu_temp"),
            "clocks_sm_mhz": g(MHZ, "clocks/sm_clock"),
            "clocks_max_sm_mhz": g(MHZ, "max_clocks/sm_clock"),
            "clocks_event_reasons": self.reasons(), "fabric": self.fabric(),
            "performance_state": g(s, "performance_state"), "compute_mode": g(s, "compute_mode"),
            "processes": self.processes(),
        })

    def fabric(self) -> FabricState | None:
        if self.gpu.find("fabric") is None:
            return None
        g = self.get
        return FabricState(state=g(TEXT, "fabric/state"), status=g(TEXT, "fabric/status"),
                           clique_id=g(TEXT, "fabric/cliqueId"),
                           cluster_uuid=g(TEXT, "fabric/clusterUuid"),
                           health_summary=g(TEXT, "fabric/health/summary"))

    def processes(self) -> list[ProcessXml] | None:
        el = self.gpu.find("processes")
        if el is None:
            return None
        return [_Sub(self, p).process() for p in el.findall("process_info")]


class _Sub(_Reader):
    def __init__(self, parent: _Reader, el: ET.Element) -> None:
        super().__init__(parent.text, el, parent.source)

    def process(self) -> ProcessXml:
        return ProcessXml.model_validate({
            "gpu_instance_id": self.get(INT, "gpu_instance_id"),
            "compute_instance_id": self.get(INT, "compute_instance_id"),
            "pid": self.get(INT, "pid"), "type": self.get(TEXT, "type"),
            "name": self.get(TEXT, "process_name"),
            "used_memory_mib": self.get(MIB, "used_memory")})

    def mig(self) -> MigDeviceXml:
        return MigDeviceXml.model_validate({
            "index": self.get(INT, "index"),
            "gpu_instance_id": self.get(INT, "gpu_instance_id"),
            "compute_instance_id": self.get(INT, "compute_instance_id"),
            "multiprocessor_count": self.get(INT, "device_attributes/shared/multiprocessor_count"),
            "memory_total_mib": self.get(MIB, "fb_memory_usage/total"),
        })


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
    attached = top("attached_gpus")
    if attached is not None and not attached.isdigit():
        _Reader(text, root, source).fail(f"<attached_gpus> is not a count: {attached!r}",
                                         f"<attached_gpus>{attached}</attached_gpus>")
    return NvidiaSmiXmlFacts(driver_version=top("driver_version"),
                             cuda_version=top("cuda_version"), gpus=gpus,
                             attached_gpus=int(attached) if attached is not None else None)


register("nvidia-smi-q-xml", "nvidia-smi -q -x: per-GPU health, MIG, ECC, PCIe, power",
         example="nvidia-smi -q -x > smi-q.xml")(parse_nvidia_smi_xml)
