"""The counters the health step reads before and after its load, and what changed.

The node side keeps each read as raw files (``payload/health/counters.py``); here
they become typed per-GPU counters (ECC volatile and aggregate, retired pages and
remapped rows with their pending flags, PCIe replays, clock event reasons and their
counters, the link) plus the NVLink error counters, the kernel log's Xid events and
the processes on the GPUs. ``delta`` says what grew between the two reads; judging
what a growth means is the judge's. A source that could not be read is carried as
such, so "no new Xid" is never claimed from a log nobody could read.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from orchestrator.errors import ParseError
from orchestrator.parsers.kernel_log import BusEvent, KernelLogFacts, XidEvent, parse_kernel_log
from orchestrator.parsers.nvidia_smi import QueryGpu, parse_query_gpu
from orchestrator.parsers.nvidia_smi_health import (
    ComputeAppsFacts,
    NvlinkErrorsFacts,
    parse_compute_apps,
    parse_nvlink_errors,
)

KERNEL_SOURCES = ("dmesg", "journalctl-k")
_INT = re.compile(r"^\s*(\d+)(?:\s*\w+)?\s*$")


@dataclass(frozen=True)
class GpuCounters:
    key: str  # the UUID where known, else the bus id, else the index
    index: int | None
    uuid: str | None
    bus_id: str | None
    ecc_corrected_volatile: int | None = None
    ecc_uncorrected_volatile: int | None = None
    ecc_corrected_aggregate: int | None = None
    ecc_uncorrected_aggregate: int | None = None
    retired_single: int | None = None
    retired_double: int | None = None
    retired_pending: bool | None = None
    remapped_correctable: int | None = None
    remapped_uncorrectable: int | None = None
    remapped_pending: bool | None = None
    remapped_failure: bool | None = None
    replays: int | None = None
    replay_rollovers: int | None = None
    clock_reasons: tuple[str, ...] | None = None
    reason_counters_us: dict[str, int] = field(default_factory=dict)
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    memory_used_mib: int | None = None
    memory_total_mib: int | None = None
    power_limit_w: float | None = None
    temperature_c: int | None = None


@dataclass
class Snapshot:
    gpus: dict[str, GpuCounters]
    nvlink: NvlinkErrorsFacts | None
    kernel: dict[str, KernelLogFacts]  # per readable source
    apps: ComputeAppsFacts | None
    unreadable: dict[str, str]  # source -> why it could not be read


def _int(raw: str | None) -> int | None:
    m = _INT.match(raw or "")
    return int(m.group(1)) if m else None


def from_query(row: QueryGpu) -> dict[str, Any]:
    """The counters one row of the health query carries."""
    other = {k.lower(): v for k, v in row.other.items()}
    counters = {k.rsplit(".", 1)[1]: _int(v) for k, v in other.items()
                if k.startswith("clocks_event_reasons_counters.") and _int(v) is not None}
    reasons = row.clocks_event_reasons
    return {
        "ecc_corrected_volatile": row.ecc_corrected_volatile,
        "ecc_uncorrected_volatile": row.ecc_uncorrected_volatile,
        "ecc_corrected_aggregate": row.ecc_corrected_aggregate,
        "ecc_uncorrected_aggregate": row.ecc_uncorrected_aggregate,
        "retired_single": _int(other.get("retired_pages.single_bit_ecc.count")),
        "retired_double": _int(other.get("retired_pages.double_bit.count")),
        "retired_pending": row.retired_pages_pending,
        "remapped_correctable": row.remapped_rows_correctable,
        "remapped_uncorrectable": row.remapped_rows_uncorrectable,
        "remapped_pending": row.remapped_rows_pending,
        "remapped_failure": row.remapped_rows_failure,
        "clock_reasons": tuple(reasons.active) if reasons is not None else None,
        "reason_counters_us": counters,
        "pcie_gen": row.pcie_gen_current, "pcie_gen_max": row.pcie_gen_max,
        "pcie_width": row.pcie_width_current, "pcie_width_max": row.pcie_width_max,
        "memory_used_mib": row.memory_used_mib, "memory_total_mib": row.memory_total_mib,
        "power_limit_w": row.power_limit_w, "temperature_c": row.temperature_gpu_c,
    }


def replays_from_xml(text: str) -> dict[str, tuple[int | None, int | None]]:
    """PCIe replays and their rollovers per GPU (by UUID, else bus id) from `-q -x`."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise ParseError("nvidia-smi-q-xml", f"not XML: {exc}") from None
    out: dict[str, tuple[int | None, int | None]] = {}
    for gpu in root.iter("gpu"):
        key = (gpu.findtext("uuid") or gpu.get("id") or "").strip()
        out[key] = (_int(gpu.findtext("pci/replay_counter")),
                    _int(gpu.findtext("pci/replay_rollover_counter")))
    return out


def snapshot_from(texts: dict[str, str], unreadable: dict[str, str] | None = None) -> Snapshot:
    """A snapshot from the raw outputs by name (query-gpu, nvidia-smi-q, nvlink-e,
    compute-apps, dmesg, journalctl-k); a name that is absent is not read."""
    gpus: dict[str, GpuCounters] = {}
    if "query-gpu" in texts:
        for row in parse_query_gpu(texts["query-gpu"], source="query-gpu").gpus:
            key = row.uuid or row.pci_bus_id or str(row.index)
            gpus[key] = GpuCounters(key=key, index=row.index, uuid=row.uuid,
                                    bus_id=row.pci_bus_id, **from_query(row))
    if "nvidia-smi-q" in texts and texts["nvidia-smi-q"].strip():
        for key, (replays, rollovers) in replays_from_xml(texts["nvidia-smi-q"]).items():
            match = next((g for g in gpus.values() if key in (g.uuid, g.bus_id)), None)
            if match is not None:
                gpus[match.key] = _replace(match, replays=replays, replay_rollovers=rollovers)
    kernel = {}
    for src in KERNEL_SOURCES:
        if src in texts:
            kernel[src] = parse_kernel_log(texts[src], source=src)
    return Snapshot(
        gpus=gpus,
        nvlink=parse_nvlink_errors(texts["nvlink-e"], source="nvlink-e")
        if "nvlink-e" in texts else None,
        kernel=kernel,
        apps=parse_compute_apps(texts["compute-apps"], source="compute-apps")
        if texts.get("compute-apps", "").strip() else None,
        unreadable=dict(unreadable or {}))


def _replace(g: GpuCounters, **changes: Any) -> GpuCounters:
    return replace(g, **changes)


def read_snapshot(folder: Path) -> Snapshot:
    """One read as the payload wrote it: ``<out>/counters/<when>/index.json`` and its files."""
    index = json.loads((folder / "index.json").read_text())
    texts: dict[str, str] = {}
    unreadable: dict[str, str] = {}
    root = folder.parent.parent
    for name, rec in index.items():
        if not rec.get("readable") or not rec.get("file"):
            unreadable[name] = rec.get("note") or f"exit {rec.get('rc')}"
            continue
        if name == "pcie-sysfs":
            continue
        texts[name] = (root / rec["file"]).read_text(errors="replace")
    for src in KERNEL_SOURCES:  # an empty log that could be read says nothing new
        if src in texts and not texts[src].strip():
            del texts[src]
            unreadable[src] = "empty output"
    return snapshot_from(texts, unreadable)


# --------------------------------------------------------------------------- deltas


@dataclass(frozen=True)
class GpuDelta:
    key: str
    ecc_uncorrected_volatile: int | None  # after - before; None: not readable both times
    ecc_corrected_volatile: int | None
    ecc_uncorrected_aggregate: int | None
    remapped_uncorrectable: int | None
    retired_double: int | None
    replays: int | None
    new_remap_pending: bool  # pending after, not before
    new_remap_failure: bool
    new_retired_pending: bool
    nvlink: dict[str, int]  # "link/counter" -> growth, only counters that grew
    reasons_after: tuple[str, ...] | None
    reason_counters_us: dict[str, int]  # growth of each clock-reason counter


@dataclass
class CountersDelta:
    gpus: dict[str, GpuDelta]
    new_xids: list[XidEvent]
    new_bus_events: list[BusEvent]
    kernel_log: str | None  # the source the Xid comparison read; None: none readable twice
    missing_after: list[str]  # GPUs read before and absent after (fallen off the bus?)


def _diff(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else b - a


def _nvlink_growth(before: NvlinkErrorsFacts | None, after: NvlinkErrorsFacts | None,
                   g: GpuCounters) -> dict[str, int]:
    def find(f: NvlinkErrorsFacts | None) -> dict[int, dict[str, int | None]]:
        if f is None:
            return {}
        for x in f.gpus:
            if (g.uuid and x.uuid == g.uuid) or (x.uuid is None and x.index == g.index):
                return x.links
        return {}

    b, a = find(before), find(after)
    out = {}
    for link, counters in a.items():
        for name, value in counters.items():
            old = b.get(link, {}).get(name)
            if value is not None and value > (old or 0):
                out[f"{link}/{name}"] = value - (old or 0)
    return out


def delta(before: Snapshot, after: Snapshot) -> CountersDelta:
    gpus = {}
    for key, b in before.gpus.items():
        a = after.gpus.get(key)
        if a is None:
            continue
        gpus[key] = GpuDelta(
            key=key,
            ecc_uncorrected_volatile=_diff(b.ecc_uncorrected_volatile, a.ecc_uncorrected_volatile),
            ecc_corrected_volatile=_diff(b.ecc_corrected_volatile, a.ecc_corrected_volatile),
            ecc_uncorrected_aggregate=_diff(b.ecc_uncorrected_aggregate,
                                            a.ecc_uncorrected_aggregate),
            remapped_uncorrectable=_diff(b.remapped_uncorrectable, a.remapped_uncorrectable),
            retired_double=_diff(b.retired_double, a.retired_double),
            replays=_diff(b.replays, a.replays),
            new_remap_pending=bool(a.remapped_pending) and not b.remapped_pending,
            new_remap_failure=bool(a.remapped_failure) and not b.remapped_failure,
            new_retired_pending=bool(a.retired_pending) and not b.retired_pending,
            nvlink=_nvlink_growth(before.nvlink, after.nvlink, b),
            reasons_after=a.clock_reasons,
            reason_counters_us={k: v - b.reason_counters_us.get(k, 0)
                                for k, v in a.reason_counters_us.items()
                                if v > b.reason_counters_us.get(k, 0)})
    source = next((s for s in KERNEL_SOURCES if s in before.kernel and s in after.kernel), None)
    xids: list[XidEvent] = []
    bus: list[BusEvent] = []
    if source is not None:
        xids = after.kernel[source].new_since(before.kernel[source])
        old_bus = {e.text for e in before.kernel[source].fallen_off_bus}
        bus = [e for e in after.kernel[source].fallen_off_bus if e.text not in old_bus
               or (e.stamp.uptime_s or 0) > (before.kernel[source].last_uptime_s or 0)]
    return CountersDelta(gpus=gpus, new_xids=xids, new_bus_events=bus, kernel_log=source,
                         missing_after=sorted(k for k in before.gpus if k not in after.gpus))
