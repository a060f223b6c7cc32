"""One view per GPU, merged from every nvidia-smi output a node gave.

A node may answer `--query-gpu` but not `-q -x`, or only the default table (a
pasted report, a locked-down container), or a query CSV whose fields another
tool chose. Checks ask one question per fact ("how much memory has GPU 3?")
and must get the answer from whichever output holds it, never "no data, so
fine". Outputs are merged by PCI bus id where they print one, else by index;
the first output that knows a fact wins, in the order given (the query CSV
first: it is what gpuvet asks for explicitly).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any

from pydantic import BaseModel

from orchestrator.parsers.nvidia_smi import (
    ClockEventReasons,
    FabricState,
    NvidiaSmiLFacts,
    QueryGpuFacts,
)
from orchestrator.parsers.nvidia_smi_q import NvidiaSmiQFacts, QGpu
from orchestrator.parsers.nvidia_smi_table import NvidiaSmiTableFacts
from orchestrator.parsers.nvidia_smi_xml import GpuXml, NvidiaSmiXmlFacts

GPU_FACTS = (QueryGpuFacts, NvidiaSmiXmlFacts, NvidiaSmiQFacts, NvidiaSmiTableFacts,
             NvidiaSmiLFacts)


@dataclass
class GpuView:
    """What is known of one GPU; None is "no output said", never a default."""

    index: int
    bus_id: str | None = None
    name: str | None = None
    pci_device_id: str | None = None  # how a card the driver cannot name is still told
    driver_version: str | None = None
    memory_total_mib: int | None = None
    mig_enabled: bool | None = None
    mig_devices: int | None = None
    pcie_gen_current: int | None = None
    pcie_gen_max: int | None = None
    pcie_gen_host_max: int | None = None
    pcie_width_current: int | None = None
    pcie_width_max: int | None = None
    power_limit_w: float | None = None
    power_max_limit_w: float | None = None
    temperature_c: int | None = None
    clocks_event_reasons: ClockEventReasons | None = None
    ecc_uncorrected: int | None = None
    retired_pages_pending: bool | None = None
    remapped_pending: bool | None = None
    remapped_failure: bool | None = None
    remapped_uncorrectable: int | None = None
    fabric: FabricState | None = None  # NVLink fabric registration (-q, -q -x)
    errors: list[str] = field(default_factory=list)
    # which output (command id) told each fact, for the evidence of a finding
    told_by: dict[str, str] = field(default_factory=dict)

    def source(self, *facts: str) -> list[str]:
        return sorted({self.told_by[f] for f in facts if f in self.told_by})

    @property
    def sources(self) -> list[str]:
        return sorted(set(self.told_by.values()))


_FIELDS = [f.name for f in fields(GpuView) if f.name not in ("index", "errors", "told_by")]
# A "yes" from any output beats a "no" from a more trusted one: MIG devices listed by
# `-L` prove MIG is on whatever a mode column says, and a pending retirement or row
# remap that one output shows is not undone by another that missed it.
_TRUE_WINS = {"mig_enabled", "retired_pages_pending", "remapped_pending", "remapped_failure"}


def norm_bus(bus: str | None) -> str | None:
    """`00000000:19:00.0` and `0000:19:00.0` name the same device."""
    if not bus:
        return None
    try:
        dom, b, devfn = bus.strip().split(":")
        dev, fn = devfn.split(".")
        return f"{int(dom, 16):x}:{int(b, 16):02x}:{int(dev, 16):02x}.{int(fn, 16):x}"
    except ValueError:
        return bus.strip().lower()


def _max(*vals: int | None) -> int | None:
    known = [v for v in vals if v is not None]
    return max(known) if known else None


def _rows(facts: BaseModel) -> Iterable[dict[str, Any]]:
    """Each GPU of one output as GpuView fields (None where the output is silent)."""
    if isinstance(facts, QueryGpuFacts):
        for pos, g in enumerate(facts.gpus):
            yield {"index": g.index if g.index is not None else pos, "bus_id": g.pci_bus_id,
                   "name": g.name, "pci_device_id": g.pci_device_id,
                   "driver_version": g.driver_version,
                   "memory_total_mib": g.memory_total_mib, "mig_enabled": g.mig_enabled,
                   "pcie_gen_current": g.pcie_gen_current, "pcie_gen_max": g.pcie_gen_max,
                   "pcie_gen_host_max": g.pcie_gen_host_max,
                   "pcie_width_current": g.pcie_width_current,
                   "pcie_width_max": g.pcie_width_max, "power_limit_w": g.power_limit_w,
                   "power_max_limit_w": g.power_max_limit_w,
                   "temperature_c": g.temperature_gpu_c,
                   "clocks_event_reasons": g.clocks_event_reasons,
                   "ecc_uncorrected": _max(g.ecc_uncorrected_volatile, g.ecc_uncorrected_aggregate),
                   "retired_pages_pending": g.retired_pages_pending,
                   "remapped_pending": g.remapped_rows_pending,
                   "remapped_failure": g.remapped_rows_failure,
                   "remapped_uncorrectable": g.remapped_rows_uncorrectable, "errors": g.errors}
    elif isinstance(facts, NvidiaSmiXmlFacts):
        for pos, x in enumerate(facts.gpus):
            yield _detailed(x, pos, x.pci_bus_id, facts.driver_version)
    elif isinstance(facts, NvidiaSmiQFacts):
        for pos, q in enumerate(facts.gpus):
            yield _detailed(q, pos, q.bus_id, facts.driver_version)
    elif isinstance(facts, NvidiaSmiTableFacts):
        per_gpu: dict[int, int] = {}
        for d in facts.mig_devices:
            per_gpu[d.gpu] = per_gpu.get(d.gpu, 0) + 1
        for t in facts.gpus:
            mig = None if t.mig_mode in (None, "N/A") else t.mig_mode == "Enabled"
            yield {"index": t.index, "bus_id": t.bus_id,
                   "name": None if t.name_truncated else t.name,
                   "driver_version": facts.driver_version, "memory_total_mib": t.memory_total_mib,
                   "mig_enabled": mig, "mig_devices": per_gpu.get(t.index, 0) if mig else None,
                   "power_limit_w": t.power_cap_w, "temperature_c": t.temperature_c,
                   "ecc_uncorrected": t.ecc_uncorrected,
                   "errors": [f"{c}: ERR!" for c in t.errors]}
    elif isinstance(facts, NvidiaSmiLFacts):
        for lg in facts.gpus:
            # MIG lines under a GPU mean MIG is on, whatever the mode columns say
            yield {"index": lg.index, "name": lg.name,
                   "mig_enabled": True if lg.mig_devices else None,
                   "mig_devices": len(lg.mig_devices)}


def _detailed(x: GpuXml | QGpu, pos: int, bus: str | None, driver: str | None) -> dict[str, Any]:
    """`-q -x` and `-q` text carry the same facts under the same names."""
    rr = x.remapped_rows
    return {"index": pos, "bus_id": bus, "name": x.product_name, "driver_version": driver,
            "memory_total_mib": x.memory_total_mib, "mig_enabled": x.mig_enabled,
            "mig_devices": len(x.mig_devices) if x.mig_enabled else None,
            "pcie_gen_current": x.pcie_gen_current, "pcie_gen_max": x.pcie_gen_max,
            "pcie_gen_host_max": x.pcie_gen_host_max, "pcie_width_current": x.pcie_width_current,
            "pcie_width_max": x.pcie_width_max, "power_limit_w": x.power_limit_w,
            "power_max_limit_w": x.power_max_limit_w, "temperature_c": x.temperature_gpu_c,
            "clocks_event_reasons": x.clocks_event_reasons,
            "ecc_uncorrected": _max(x.ecc_volatile.uncorrectable, x.ecc_aggregate.uncorrectable),
            "retired_pages_pending": x.retired_pages.pending,
            "remapped_pending": rr.pending if rr else None,
            "remapped_failure": rr.failure if rr else None,
            "remapped_uncorrectable": rr.uncorrectable if rr else None,
            "fabric": x.fabric if x.fabric is not None and x.fabric.known else None}


def merge_gpus(outputs: Iterable[tuple[str, BaseModel]]) -> list[GpuView]:
    """GPU views from (command id, parsed facts) pairs, most trusted output first."""
    views: list[GpuView] = []
    for cid, facts in outputs:
        for row in _rows(facts):
            bus = norm_bus(row.get("bus_id"))
            view = next((v for v in views if bus and norm_bus(v.bus_id) == bus), None)
            if view is None and not (bus and any(norm_bus(v.bus_id) for v in views)):
                view = next((v for v in views if v.index == row["index"]), None)
            if view is None:
                view = GpuView(index=row["index"])
                views.append(view)
            for name in _FIELDS:
                val = row.get(name)
                have = getattr(view, name)
                if val is not None and (have is None or (
                        name in _TRUE_WINS and val is True and have is False)):
                    setattr(view, name, val)
                    view.told_by[name] = cid
            view.errors += [e for e in row.get("errors", []) if e not in view.errors]
    return sorted(views, key=lambda v: v.index)
