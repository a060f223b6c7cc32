"""`nvidia-smi -q` / `-a` as text: what people paste and what `-q -d X` and `sed` give.

The text is an indented tree of `Key : value` lines and section titles. It is
read as a tree first (indentation only), then facts are looked up by section
and key name, so a driver that adds, renames or drops a section costs only
that fact, never the file. Excerpts are accepted: `-i 0` (one GPU of many),
`-d MEMORY` (some sections), a `sed`/`grep` cut holding only the MIG section
with no `GPU ...` line at all. Every fact the parser looks for and does not
find is listed per GPU in `missing`, so a check can say "not reported" instead
of "fine".
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TypeVar

from pydantic import BaseModel, ConfigDict

from orchestrator.errors import ParseError
from orchestrator.parsers import register
from orchestrator.parsers._noise import Edit, IgnoredLine
from orchestrator.parsers._smi_tree import KIND, Node, Tree, read_tree
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
from orchestrator.parsers.nvidia_smi_xml import EccCounts, RemappedRows, RetiredPages

T = TypeVar("T")
_BIT_OF = {name: bit for bit, name in CLOCK_EVENT_BITS.items()}

# `-q` reason titles -> the names the query CSV and XML parsers use.
_REASONS = {
    "idle": "GpuIdle", "applications clocks setting": "ApplicationsClocksSetting",
    "sw power cap": "SwPowerCap", "hw slowdown": "HwSlowdown", "sync boost": "SyncBoost",
    "sw thermal slowdown": "SwThermalSlowdown", "hw thermal slowdown": "HwThermalSlowdown",
    "hw power brake slowdown": "HwPowerBrakeSlowdown",
    "display clock setting": "DisplayClockSetting",
}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class QMigDevice(_Model):
    index: int | None
    gpu_instance_id: int | None
    compute_instance_id: int | None
    multiprocessor_count: int | None
    memory_total_mib: int | None


class QProcess(_Model):
    gpu_instance_id: int | None
    compute_instance_id: int | None
    pid: int
    type: str | None
    name: str | None
    used_memory_mib: int | None


class QGpu(_Model):
    """One GPU section; bus_id is None for an excerpt that lost its `GPU ...` line."""

    bus_id: str | None
    line_no: int
    product_name: str | None = None
    product_brand: str | None = None
    product_architecture: str | None = None
    serial: str | None = None
    uuid: str | None = None
    vbios_version: str | None = None
    persistence_mode: bool | None = None
    mig_enabled: bool | None = None
    mig_pending_enabled: bool | None = None
    mig_devices: list[QMigDevice] = []
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    memory_reserved_mib: int | None = None
    pcie_gen_current: int | None = None
    pcie_gen_max: int | None = None
    pcie_gen_device_current: int | None = None
    pcie_gen_device_max: int | None = None
    pcie_gen_host_max: int | None = None
    pcie_width_current: int | None = None
    pcie_width_max: int | None = None
    performance_state: str | None = None
    clocks_event_reasons: ClockEventReasons | None = None
    ecc_enabled: bool | None = None
    ecc_pending_enabled: bool | None = None
    ecc_volatile: EccCounts = EccCounts()
    ecc_aggregate: EccCounts = EccCounts()
    retired_pages: RetiredPages = RetiredPages()
    remapped_rows: RemappedRows | None = None
    temperature_gpu_c: int | None = None
    power_draw_w: float | None = None
    power_limit_w: float | None = None
    power_requested_limit_w: float | None = None
    power_default_limit_w: float | None = None
    power_min_limit_w: float | None = None
    power_max_limit_w: float | None = None
    clocks_graphics_mhz: int | None = None
    clocks_sm_mhz: int | None = None
    clocks_mem_mhz: int | None = None
    clocks_max_graphics_mhz: int | None = None
    clocks_max_sm_mhz: int | None = None
    clocks_max_mem_mhz: int | None = None
    compute_mode: str | None = None
    fabric: FabricState | None = None
    processes: list[QProcess] | None = None  # None: the section was not in the text
    sections: list[str] = []  # top-level section and key names present, in order
    missing: list[str] = []  # facts this parser reads that the text did not hold


class NvidiaSmiQFacts(_Model):
    timestamp: str | None
    driver_version: str | None
    cuda_version: str | None
    attached_gpus: int | None
    gpus: list[QGpu]
    # `Attached GPUs : 8` with fewer GPU sections: an `-i N` run or an excerpt
    elided_gpus: int | None
    ignored_lines: list[IgnoredLine] = []  # prompts, command lines, `[...]` read past
    edits: list[Edit] = []  # `[...]` and the like: what a person cut out

    @property
    def count(self) -> int:
        return len(self.gpus)


class _Gpu:
    """Looks facts up in one GPU's tree; a bad value names its line."""

    def __init__(self, root: Node, source: str | None) -> None:
        self.root, self.source = root, source
        self.missing: list[str] = []

    def node(self, *paths: tuple[str, ...]) -> Node | None:
        for path in paths:
            n = self.root.find(*path)
            if n is not None and n.value is not None:
                return n
        return None

    def get(self, conv: Callable[[str], T], *paths: tuple[str, ...], fact: str | None = None,
            required: bool = True) -> T | None:
        n = self.node(*paths)
        if n is None:
            if required:
                self.missing.append(fact or " / ".join(paths[0]))
            return None
        return self.conv(conv, n)

    def conv(self, conv: Callable[[str], T], n: Node) -> T:
        try:
            return conv(n.value or "")
        except ValueError as exc:
            raise ParseError(KIND, f"{n.key}: {exc}", line_no=n.line_no, line=n.line,
                             source=self.source) from None

    def ecc(self, section: str) -> EccCounts:
        sect = self.root.find("ECC Errors", section)
        if sect is None:
            return EccCounts()
        sums: dict[str, int | None] = {"correctable": None, "uncorrectable": None}
        for sub, key in (("Single Bit", "correctable"), ("Double Bit", "uncorrectable")):
            total = sect.find(sub, "Total")
            if total is not None:
                sums[key] = self.conv(INT, total)
        if sect.find("Single Bit") is None:
            for leaf in sect.children:
                k = leaf.key.lower()
                if leaf.value is None or "correctable" not in k:
                    continue
                v = self.conv(INT, leaf)
                key = "uncorrectable" if "uncorrectable" in k else "correctable"
                if isinstance(v, int):
                    sums[key] = (sums[key] or 0) + v
        return EccCounts.model_validate(sums)

    def reasons(self) -> ClockEventReasons | None:
        sect = self.root.find("Clocks Event Reasons") or self.root.find("Clocks Throttle Reasons")
        if sect is None:
            self.missing.append("clocks event reasons")
            return None
        mask, names, known = 0, [], False
        for leaf in [sect, *sect.walk()][1:]:
            if leaf.value is None:
                continue
            state = self.conv(FLAG, leaf)
            if state is None:
                continue
            known = True
            if state:
                name = _REASONS.get(leaf.key.lower(), leaf.key)
                names.append(name)
                mask |= _BIT_OF.get(name, 0)
        return ClockEventReasons(mask=mask, active=names) if known else None

    def retired(self) -> RetiredPages:
        sect = self.root.find("Retired Pages")
        if sect is None or sect.value is not None:
            if sect is None:
                self.missing.append("retired pages")
            return RetiredPages()

        def count(name: str) -> int | None:
            n = sect.find(name)
            if n is None:
                return None
            if n.value is None:  # drivers before ~450: a sub-section with `Retired count`
                n = n.find("Retired Count")
                if n is None or n.value is None:
                    return None
            return self.conv(INT, n)

        pend = sect.find("Pending Page Blacklist") or sect.find("Pending Page Retirement") \
            or sect.find("Pending")
        return RetiredPages(single_bit=count("Single Bit ECC"), double_bit=count("Double Bit ECC"),
                            pending=None if pend is None else self.conv(FLAG, pend))

    def remapped(self) -> RemappedRows | None:
        sect = self.root.find("Remapped Rows")
        if sect is None:
            self.missing.append("remapped rows")
            return None
        if sect.value is not None:  # `Remapped Rows : N/A` on GPUs without row remapping
            return None
        g = self.get
        return RemappedRows.model_validate({
            "correctable": g(INT, ("Remapped Rows", "Correctable Error"), required=False),
            "uncorrectable": g(INT, ("Remapped Rows", "Uncorrectable Error"), required=False),
            "pending": g(FLAG, ("Remapped Rows", "Pending"), fact="remapped rows pending"),
            "failure": g(FLAG, ("Remapped Rows", "Remapping Failure Occurred"),
                         required=False)})

    def migs(self) -> list[QMigDevice]:
        out = []
        holders = self.root.all("MIG Device") + [
            d for sect in self.root.all("MIG Devices") for d in sect.all("MIG Device")]
        for dev in holders:
            sub = _Gpu(dev, self.source)
            out.append(QMigDevice.model_validate({
                "index": sub.get(INT, ("Index",), required=False),
                "gpu_instance_id": sub.get(INT, ("GPU Instance ID",), required=False),
                "compute_instance_id": sub.get(INT, ("Compute Instance ID",), required=False),
                "multiprocessor_count": sub.get(
                    INT, ("Device Attributes", "Shared", "Multiprocessor count"), required=False),
                "memory_total_mib": sub.get(MIB, ("Shared FB Memory Usage", "Total"),
                                            ("FB Memory Usage", "Total"), required=False)}))
        return out

    def fabric(self) -> FabricState | None:
        sect = self.root.find("Fabric")
        if sect is None:
            return None

        def val(*names: str) -> str | None:
            n = sect.first(*names)
            return None if n is None else self.conv(TEXT, n)

        health = sect.find("Health")
        summary = health.find("Summary") if health is not None else None
        return FabricState(state=val("State"), status=val("Status"),
                           clique_id=val("CliqueId", "Clique ID"),
                           cluster_uuid=val("ClusterUUID", "Cluster UUID"),
                           health_summary=None if summary is None else self.conv(TEXT, summary),
                           line_no=sect.line_no)

    def processes(self) -> list[QProcess] | None:
        sect = self.root.find("Processes")
        if sect is None:
            self.missing.append("processes")
            return None
        out: list[QProcess] = []
        gi: int | None = None
        ci: int | None = None
        for child in sect.children:
            k = child.key.lower()
            if k == "gpu instance id":
                gi = self.conv(INT, child)
            elif k == "compute instance id":
                ci = self.conv(INT, child)
            elif k == "process id":
                sub = _Gpu(child, self.source)
                pid = self.conv(INT, child)
                if pid is None:
                    raise ParseError(KIND, "process without a PID", line_no=child.line_no,
                                     source=self.source)
                out.append(QProcess(
                    gpu_instance_id=gi, compute_instance_id=ci, pid=pid,
                    type=sub.get(TEXT, ("Type",), required=False),
                    name=sub.get(TEXT, ("Name",), required=False),
                    used_memory_mib=sub.get(MIB, ("Used GPU Memory",), required=False)))
                gi = ci = None
        return out

    def facts(self) -> QGpu:
        g, i, s, b = self.get, INT, TEXT, FLAG
        link = ("PCI", "GPU Link Info")
        power = ("GPU Power Readings",) if self.root.find("GPU Power Readings") else (
            "Power Readings",)
        data = {
            "bus_id": self.root.value, "line_no": self.root.line_no,
            "product_name": g(s, ("Product Name",)),
            "product_brand": g(s, ("Product Brand",), required=False),
            "product_architecture": g(s, ("Product Architecture",), required=False),
            "serial": g(s, ("Serial Number",), required=False),
            "uuid": g(s, ("GPU UUID",), required=False),
            "vbios_version": g(s, ("VBIOS Version",), required=False),
            "persistence_mode": g(b, ("Persistence Mode",), required=False),
            "mig_enabled": g(b, ("MIG Mode", "Current"), fact="MIG mode"),
            "mig_pending_enabled": g(b, ("MIG Mode", "Pending"), required=False),
            "mig_devices": self.migs(),
            "memory_total_mib": g(MIB, ("FB Memory Usage", "Total"), fact="memory total"),
            "memory_used_mib": g(MIB, ("FB Memory Usage", "Used"), required=False),
            "memory_reserved_mib": g(MIB, ("FB Memory Usage", "Reserved"), required=False),
            "pcie_gen_current": g(i, (*link, "PCIe Generation", "Current"), fact="PCIe generation"),
            "pcie_gen_max": g(i, (*link, "PCIe Generation", "Max"), required=False),
            "pcie_gen_device_current": g(i, (*link, "PCIe Generation", "Device Current"),
                                         required=False),
            "pcie_gen_device_max": g(i, (*link, "PCIe Generation", "Device Max"), required=False),
            "pcie_gen_host_max": g(i, (*link, "PCIe Generation", "Host Max"), required=False),
            "pcie_width_current": g(LANES, (*link, "Link Width", "Current"),
                                    fact="PCIe link width"),
            "pcie_width_max": g(LANES, (*link, "Link Width", "Max"), required=False),
            "performance_state": g(s, ("Performance State",), required=False),
            "clocks_event_reasons": self.reasons(),
            "ecc_enabled": g(b, ("ECC Mode", "Current"), fact="ECC mode"),
            "ecc_pending_enabled": g(b, ("ECC Mode", "Pending"), required=False),
            "ecc_volatile": self.ecc("Volatile"), "ecc_aggregate": self.ecc("Aggregate"),
            "retired_pages": self.retired(), "remapped_rows": self.remapped(),
            "temperature_gpu_c": g(CELSIUS, ("Temperature", "GPU Current Temp"),
                                   ("Temperature", "Gpu"), fact="temperature"),
            "power_draw_w": g(WATTS, (*power, "Power Draw"), (*power, "Average Power Draw"),
                              (*power, "Instantaneous Power Draw"), fact="power draw"),
            "power_limit_w": g(WATTS, (*power, "Current Power Limit"),
                               (*power, "Power Limit"), (*power, "Enforced Power Limit"),
                               fact="power limit"),
            "power_requested_limit_w": g(WATTS, (*power, "Requested Power Limit"),
                                         required=False),
            "power_default_limit_w": g(WATTS, (*power, "Default Power Limit"), required=False),
            "power_min_limit_w": g(WATTS, (*power, "Min Power Limit"), required=False),
            "power_max_limit_w": g(WATTS, (*power, "Max Power Limit"),
                                   fact="max power limit"),
            "clocks_graphics_mhz": g(MHZ, ("Clocks", "Graphics"), required=False),
            "clocks_sm_mhz": g(MHZ, ("Clocks", "SM"), fact="clocks"),
            "clocks_mem_mhz": g(MHZ, ("Clocks", "Memory"), required=False),
            "clocks_max_graphics_mhz": g(MHZ, ("Max Clocks", "Graphics"), required=False),
            "clocks_max_sm_mhz": g(MHZ, ("Max Clocks", "SM"), fact="max clocks"),
            "clocks_max_mem_mhz": g(MHZ, ("Max Clocks", "Memory"), required=False),
            "compute_mode": g(s, ("Compute Mode",), required=False),
            "fabric": self.fabric(),
            "processes": self.processes(),
            "sections": [c.key for c in self.root.children],
        }
        return QGpu.model_validate({**data, "missing": self.missing})


# Keys and titles only `nvidia-smi -q` prints (an excerpt holds at least two of them).
Q_KEYS = frozenset({
    "Product Name", "Product Brand", "Product Architecture", "GPU UUID", "MIG Mode",
    "MIG Device", "FB Memory Usage", "BAR1 Memory Usage", "Persistence Mode", "Bus Id",
    "Retired Pages", "Remapped Rows", "GPU Current Temp", "GPU Power Readings", "Power Readings",
    "Max Clocks", "Compute Mode", "Attached GPUs", "GPU instance ID", "Compute instance ID",
    "Device Attributes", "Multiprocessor count", "ECC Errors", "Clocks Event Reasons",
    "Clocks Throttle Reasons", "GPU Link Info", "VBIOS Version", "Minor Number",
    "Fabric", "CliqueId", "ClusterUUID", "Clique ID", "Cluster UUID",
})
_Q_KEYS_LOWER = frozenset(k.lower() for k in Q_KEYS) | {"timestamp", "driver version",
                                                        "cuda version", "attached gpus"}


def _shows_smi(tree: Tree) -> bool:
    """Positive evidence of nvidia-smi -q: its banner, a `GPU 0000:..` section, two of the keys
    only it prints, or an excerpt that starts at one (`sed -n '/MIG Mode/,+2p'`); a
    `Key: value` text alone (a README, a config) is not its output."""
    if tree.banner or any(r.value is not None for r in tree.roots):
        return True
    nodes = sorted([*tree.top.values(), *(n for r in tree.roots for n in r.walk())],
                   key=lambda n: n.line_no)
    known = {n.key.strip().lower() for n in nodes if n.key.strip().lower() in _Q_KEYS_LOWER}
    return len(known) >= 2 or bool(nodes and nodes[0].key.strip().lower() in _Q_KEYS_LOWER)


def parse_nvidia_smi_q(text: str, source: str | None = None) -> NvidiaSmiQFacts:
    if not text.strip():
        raise ParseError(KIND, "empty output", source=source)
    tree = read_tree(text, source)
    top, roots = tree.top, tree.roots
    if not roots and not top:
        raise ParseError(KIND, "no `Key : value` line", source=source)
    attached = None
    if "attached gpus" in top:
        n = top["attached gpus"]
        if not re.fullmatch(r"\d+", (n.value or "").strip()):
            raise ParseError(KIND, "Attached GPUs is not a count", line_no=n.line_no, line=n.line,
                             source=source)
        attached = int((n.value or "").strip())
    unknown = [n for k, n in top.items() if k not in ("timestamp", "driver version", "cuda version",
                                                      "attached gpus")]
    if unknown and not roots:
        raise ParseError(KIND, "no GPU section and no known top-level key", line_no=unknown[0].line_no,
                         source=source)
    if not _shows_smi(tree):
        raise ParseError(KIND, "not nvidia-smi -q output: no `==NVSMI LOG==` banner, no "
                         "`GPU 0000:..:..` section and none of the keys nvidia-smi -q prints "
                         "(Product Name, GPU UUID, FB Memory Usage, ...)", source=source)
    gpus = [_Gpu(r, source).facts() for r in roots]

    def topv(key: str) -> str | None:
        n = top.get(key)
        return None if n is None else text_or_none(n.value or "")

    return NvidiaSmiQFacts(
        timestamp=topv("timestamp"), driver_version=topv("driver version"),
        cuda_version=topv("cuda version"), attached_gpus=attached, gpus=gpus,
        elided_gpus=(attached - len(gpus)) if attached is not None and attached > len(gpus)
        else None, ignored_lines=tree.noise.ignored, edits=tree.noise.edits)


register(KIND, "nvidia-smi -q / -a as text (whole, -i N, -d SECTION, or a sed/grep excerpt)",
         example="nvidia-smi -q | tee smi-q.txt  (or -q -d FABRIC, or | sed -n '/MIG Mode/,+2p')")(
    parse_nvidia_smi_q)
