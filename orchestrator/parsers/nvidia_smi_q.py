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
from collections.abc import Iterator

from pydantic import BaseModel, ConfigDict

from orchestrator.errors import ParseError
from orchestrator.parsers import register
from orchestrator.parsers.nvidia_smi import (
    CLOCK_EVENT_BITS,
    ClockEventReasons,
    convert_value,
    text_or_none,
)
from orchestrator.parsers.nvidia_smi_xml import EccCounts, RemappedRows, RetiredPages

KIND = "nvidia-smi-q"

_KV = re.compile(r"^(?P<ind> *)(?P<key>\S(?:.*?\S)?)\s*:(?: (?P<val>.*?))?\s*$")
_TITLE = re.compile(r"^(?P<ind> *)(?P<key>\S(?:.*\S)?)\s*$")
_GPU = re.compile(r"^GPU (?P<bus>[0-9A-Fa-f]+:[0-9A-Fa-f:.]+)\s*$")
_BANNER = re.compile(r"^=+NVSMI LOG=+$")
_BIT_OF = {name: bit for bit, name in CLOCK_EVENT_BITS.items()}

# `-q` reason titles -> the names the query CSV and XML parsers use.
_REASONS = {
    "idle": "GpuIdle", "applications clocks setting": "ApplicationsClocksSetting",
    "sw power cap": "SwPowerCap", "hw slowdown": "HwSlowdown", "sync boost": "SyncBoost",
    "sw thermal slowdown": "SwThermalSlowdown", "hw thermal slowdown": "HwThermalSlowdown",
    "hw power brake slowdown": "HwPowerBrakeSlowdown",
    "display clock setting": "DisplayClockSetting",
}


class _Node:
    """One line of the tree: a title (value None) or a `Key : value` leaf."""

    __slots__ = ("children", "key", "line", "line_no", "value")

    def __init__(self, key: str, value: str | None, line_no: int, line: str = "") -> None:
        self.key, self.value, self.line_no, self.line = key, value, line_no, line
        self.children: list[_Node] = []

    def find(self, *path: str) -> _Node | None:
        node: _Node | None = self
        for name in path:
            if node is None:
                return None
            want = name.lower()
            node = next((c for c in node.children if c.key.lower() == want), None)
        return node

    def all(self, name: str) -> list[_Node]:
        return [c for c in self.children if c.key.lower() == name.lower()]

    def walk(self) -> Iterator[_Node]:
        for c in self.children:
            yield c
            yield from c.walk()


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

    @property
    def count(self) -> int:
        return len(self.gpus)


def _tree(text: str, source: str | None) -> tuple[dict[str, _Node], list[_Node]]:
    """Top-level `Key : value` lines, and one root per GPU section (or per excerpt block)."""
    top: dict[str, _Node] = {}
    roots: list[_Node] = []
    stack: list[tuple[int, _Node]] = []
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip("\r")
        s = line.strip()
        if not s or _BANNER.fullmatch(s) or s == "--":  # `--`: grep's context separator
            continue
        indent = len(line) - len(line.lstrip(" "))
        if "\t" in line[:indent + 1]:
            raise ParseError(KIND, "tab in the indentation (not nvidia-smi -q text)", line_no=no,
                             line=line, source=source)
        if indent == 0:
            if m := _GPU.fullmatch(s):
                root = _Node("GPU", m["bus"], no)
                roots.append(root)
                stack = [(-1, root)]
                continue
            kv = _KV.match(line)
            if kv is None:
                raise ParseError(KIND, "top-level line is neither `Key : value` nor `GPU <bus id>`",
                                 line_no=no, line=line, source=source)
            top.setdefault(kv["key"].lower(), _Node(kv["key"], kv["val"] or "", no, line))
            stack = []
            continue
        kv = _KV.match(line)
        title = _TITLE.match(line) if kv is None else None
        if kv is None and title is None:
            raise ParseError(KIND, "not a `Key : value` line or a section title", line_no=no,
                             line=line, source=source)
        m2 = kv or title
        assert m2 is not None
        node = _Node(m2["key"], (kv["val"] or "") if kv else None, no, line)
        if not stack:
            # an excerpt without its `GPU ...` line: one anonymous GPU per block
            root = _Node("GPU", None, no)
            roots.append(root)
            stack = [(-1, root)]
        while len(stack) > 1 and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1]
        if (len(stack) == 1 and parent.value is None and parent.children
                and parent.find(node.key) is not None and node.key.lower() not in _REPEATABLE):
            # the same top-level section again in a `GPU`-less excerpt: the next GPU's
            root = _Node("GPU", None, no)
            roots.append(root)
            stack = [(-1, root)]
            parent = root
        parent.children.append(node)
        stack.append((indent, node))
    return top, roots


_REPEATABLE = {"mig device"}


class _Gpu:
    """Looks facts up in one GPU's tree; a bad value names its line."""

    def __init__(self, root: _Node, source: str | None) -> None:
        self.root, self.source = root, source
        self.missing: list[str] = []

    def node(self, *paths: tuple[str, ...]) -> _Node | None:
        for path in paths:
            n = self.root.find(*path)
            if n is not None and n.value is not None:
                return n
        return None

    def get(self, conv: str, *paths: tuple[str, ...], fact: str | None = None,
            required: bool = True) -> object:
        n = self.node(*paths)
        if n is None:
            if required:
                self.missing.append(fact or " / ".join(paths[0]))
            return None
        return self.conv(conv, n)

    def conv(self, conv: str, n: _Node) -> object:
        try:
            return convert_value(conv, n.value or "")
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
                sums[key] = self.conv("int", total)  # type: ignore[assignment]
        if sect.find("Single Bit") is None:
            for leaf in sect.children:
                k = leaf.key.lower()
                if leaf.value is None or "correctable" not in k:
                    continue
                v = self.conv("int", leaf)
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
            state = self.conv("bool", leaf)
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
            return self.conv("int", n)  # type: ignore[return-value]

        pend = sect.find("Pending Page Blacklist") or sect.find("Pending Page Retirement") \
            or sect.find("Pending")
        return RetiredPages(single_bit=count("Single Bit ECC"), double_bit=count("Double Bit ECC"),
                            pending=None if pend is None else self.conv("bool", pend))  # type: ignore[arg-type]

    def remapped(self) -> RemappedRows | None:
        sect = self.root.find("Remapped Rows")
        if sect is None:
            self.missing.append("remapped rows")
            return None
        if sect.value is not None:  # `Remapped Rows : N/A` on GPUs without row remapping
            return None
        g = self.get
        return RemappedRows.model_validate({
            "correctable": g("int", ("Remapped Rows", "Correctable Error"), required=False),
            "uncorrectable": g("int", ("Remapped Rows", "Uncorrectable Error"), required=False),
            "pending": g("bool", ("Remapped Rows", "Pending"), fact="remapped rows pending"),
            "failure": g("bool", ("Remapped Rows", "Remapping Failure Occurred"),
                         required=False)})

    def migs(self) -> list[QMigDevice]:
        out = []
        holders = self.root.all("MIG Device") + [
            d for sect in self.root.all("MIG Devices") for d in sect.all("MIG Device")]
        for dev in holders:
            sub = _Gpu(dev, self.source)
            out.append(QMigDevice.model_validate({
                "index": sub.get("int", ("Index",), required=False),
                "gpu_instance_id": sub.get("int", ("GPU Instance ID",), required=False),
                "compute_instance_id": sub.get("int", ("Compute Instance ID",), required=False),
                "multiprocessor_count": sub.get(
                    "int", ("Device Attributes", "Shared", "Multiprocessor count"), required=False),
                "memory_total_mib": sub.get("int:MiB", ("Shared FB Memory Usage", "Total"),
                                            ("FB Memory Usage", "Total"), required=False)}))
        return out

    def processes(self) -> list[QProcess] | None:
        sect = self.root.find("Processes")
        if sect is None:
            self.missing.append("processes")
            return None
        out: list[QProcess] = []
        gi = ci = None
        for child in sect.children:
            k = child.key.lower()
            if k == "gpu instance id":
                gi = self.conv("int", child)
            elif k == "compute instance id":
                ci = self.conv("int", child)
            elif k == "process id":
                sub = _Gpu(child, self.source)
                pid = self.conv("int", child)
                if not isinstance(pid, int):
                    raise ParseError(KIND, "process without a PID", line_no=child.line_no,
                                     source=self.source)
                out.append(QProcess(
                    gpu_instance_id=gi, compute_instance_id=ci, pid=pid,  # type: ignore[arg-type]
                    type=sub.get("str", ("Type",), required=False),  # type: ignore[arg-type]
                    name=sub.get("str", ("Name",), required=False),  # type: ignore[arg-type]
                    used_memory_mib=sub.get("int:MiB", ("Used GPU Memory",),  # type: ignore[arg-type]
                                            required=False)))
                gi = ci = None
        return out

    def facts(self) -> QGpu:
        g, i, s, b = self.get, "int", "str", "bool"
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
            "memory_total_mib": g("int:MiB", ("FB Memory Usage", "Total"), fact="memory total"),
            "memory_used_mib": g("int:MiB", ("FB Memory Usage", "Used"), required=False),
            "memory_reserved_mib": g("int:MiB", ("FB Memory Usage", "Reserved"), required=False),
            "pcie_gen_current": g(i, (*link, "PCIe Generation", "Current"), fact="PCIe generation"),
            "pcie_gen_max": g(i, (*link, "PCIe Generation", "Max"), required=False),
            "pcie_gen_device_current": g(i, (*link, "PCIe Generation", "Device Current"),
                                         required=False),
            "pcie_gen_device_max": g(i, (*link, "PCIe Generation", "Device Max"), required=False),
            "pcie_gen_host_max": g(i, (*link, "PCIe Generation", "Host Max"), required=False),
            "pcie_width_current": g("int:x", (*link, "Link Width", "Current"),
                                    fact="PCIe link width"),
            "pcie_width_max": g("int:x", (*link, "Link Width", "Max"), required=False),
            "performance_state": g(s, ("Performance State",), required=False),
            "clocks_event_reasons": self.reasons(),
            "ecc_enabled": g(b, ("ECC Mode", "Current"), fact="ECC mode"),
            "ecc_pending_enabled": g(b, ("ECC Mode", "Pending"), required=False),
            "ecc_volatile": self.ecc("Volatile"), "ecc_aggregate": self.ecc("Aggregate"),
            "retired_pages": self.retired(), "remapped_rows": self.remapped(),
            "temperature_gpu_c": g("int:C", ("Temperature", "GPU Current Temp"),
                                   ("Temperature", "Gpu"), fact="temperature"),
            "power_draw_w": g("float:W", (*power, "Power Draw"), (*power, "Average Power Draw"),
                              (*power, "Instantaneous Power Draw"), fact="power draw"),
            "power_limit_w": g("float:W", (*power, "Current Power Limit"),
                               (*power, "Power Limit"), (*power, "Enforced Power Limit"),
                               fact="power limit"),
            "power_requested_limit_w": g("float:W", (*power, "Requested Power Limit"),
                                         required=False),
            "power_default_limit_w": g("float:W", (*power, "Default Power Limit"), required=False),
            "power_min_limit_w": g("float:W", (*power, "Min Power Limit"), required=False),
            "power_max_limit_w": g("float:W", (*power, "Max Power Limit"),
                                   fact="max power limit"),
            "clocks_graphics_mhz": g("int:MHz", ("Clocks", "Graphics"), required=False),
            "clocks_sm_mhz": g("int:MHz", ("Clocks", "SM"), fact="clocks"),
            "clocks_mem_mhz": g("int:MHz", ("Clocks", "Memory"), required=False),
            "clocks_max_graphics_mhz": g("int:MHz", ("Max Clocks", "Graphics"), required=False),
            "clocks_max_sm_mhz": g("int:MHz", ("Max Clocks", "SM"), fact="max clocks"),
            "clocks_max_mem_mhz": g("int:MHz", ("Max Clocks", "Memory"), required=False),
            "compute_mode": g(s, ("Compute Mode",), required=False),
            "processes": self.processes(),
            "sections": [c.key for c in self.root.children],
        }
        return QGpu.model_validate({**data, "missing": self.missing})


@register(KIND, "nvidia-smi -q / -a as text (whole, -i N, -d SECTION, or a sed/grep excerpt)")
def parse_nvidia_smi_q(text: str, source: str | None = None) -> NvidiaSmiQFacts:
    if not text.strip():
        raise ParseError(KIND, "empty output", source=source)
    top, roots = _tree(text, source)
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
    gpus = [_Gpu(r, source).facts() for r in roots]

    def topv(key: str) -> str | None:
        n = top.get(key)
        return None if n is None else text_or_none(n.value or "")

    return NvidiaSmiQFacts(
        timestamp=topv("timestamp"), driver_version=topv("driver version"),
        cuda_version=topv("cuda version"), attached_gpus=attached, gpus=gpus,
        elided_gpus=(attached - len(gpus)) if attached is not None and attached > len(gpus)
        else None)
