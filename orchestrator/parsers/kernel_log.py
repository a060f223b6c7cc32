"""The kernel log, as `dmesg`, `dmesg -T`, `journalctl -k` (any `-o` form) or a syslog
file prints it, or lines grepped out of one: NVIDIA's Xid events, GPUs that fell off
the bus without one, and the PCI core's "available PCIe bandwidth, limited by" line.

A kernel log is free text: lines that are none of these are counted, not parsed.
A line that says `NVRM: Xid` or `available PCIe bandwidth` but does not have the
driver's or the kernel's layout is an error naming the line: a changed format must
not pass for a clean log. The stamp in front of a line (seconds since boot, a wall
clock, a syslog time) is kept as printed, and as seconds where it is seconds since
boot, so two reads of one boot can be told apart (`new_since`).
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

from orchestrator.errors import ParseError
from orchestrator.parsers import register
from payload.nodecheck import XID_CATALOG as NODE_XID_CATALOG
from payload.nodecheck import xid_is_bad

XID_KIND = "xid"
PCIE_KIND = "pcie-bandwidth"

# What NVIDIA's Xid catalog says each common Xid means, and whether it points at the GPU,
# its memory or its links: the payload's (`payload.nodecheck`), so the node check judges an
# Xid on the node as this parser does on the controller.
XID_CATALOG: dict[int, tuple[str, str, bool]] = NODE_XID_CATALOG

_MONO = re.compile(r"\[\s*(\d+\.\d+)\]")
_WALL = re.compile(r"\[([A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4})\]")
_SYSLOG = re.compile(r"([A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d)\s+\S+\s+kernel:")
_ISO = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[.,]?\d*(?:[+-]\d\d:?\d\d|Z)?)\s+\S+\s+kernel:")
# `dmesg --time-format=iso`: the stamp first on the line, no host or `kernel:`
_DMESG_ISO = re.compile(r"^\s*(?:<\d>)?(?:[a-z]+ *:[a-z]+ *: )?"  # `dmesg -x`'s `kern  :warn  : `
                        r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[.,]\d+(?:[+-]\d\d:?\d\d|Z))\s")
# What stands in front of a kernel message in each of those forms (a printk level, `dmesg
# -x`'s facility, a stamp, a syslog or journal `host kernel:`), or nothing (`dmesg -t`, a
# grep); a message behind anything else (a quote, code, prose) is not the kernel's.
_STAMPS = (r"\[\s*\d+\.\d+\](?:\s*\[\s*[TC]\d+\])?"  # [ 12.3] [ T131119] (the printk caller)
           r"|\[[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}\]"
           r"|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[.,]\d+(?:[+-]\d\d:?\d\d|Z)")
_SYSLOG_HEAD = (r"(?:(?:[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d(?:\.\d+)?"
                r"|\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d[.,]?\d*(?:[+-]\d\d:?\d\d|Z)?)"
                r"\s+[\w.-]+\s+)?kernel:")
_PREFIX = re.compile(r"\s*(?:<\d>)?(?:[a-z]+ *:[a-z]+ *: )?(?:(?:" + _STAMPS + "|" + _SYSLOG_HEAD
                     + r")\s*)*")
_STAMPED = re.compile(r"\s*(?:<\d>)?(?:[a-z]+ *:[a-z]+ *: )?(?:" + _STAMPS + "|" + _SYSLOG_HEAD
                      + ")")
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}"
                  r"(?:\.[0-7])?)\): (?P<xid>\d+)(?:, (?P<rest>.*?))?\s*$")
_PID = re.compile(r"pid=(?P<pid>'?<unknown>'?|\d+), (?:name=(?P<name>'?<unknown>'?|[^,]*), )?")
_GPU_AT = re.compile(r"NVRM: GPU at PCI:(?P<pci>[0-9a-fA-F:.]+): (?P<uuid>GPU-[0-9a-fA-F-]+)")
_THE_GPU = re.compile(r"NVRM: The NVIDIA GPU (?P<pci>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}"
                      r"\.[0-7])")
_CAUSE = re.compile(r"caused by previous Xid (\d+)")
_ELISION = re.compile(r"^\s*(?:\[\.\.\.\]|\.\.\.|\[snip\])\s*$")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Stamp(_Model):
    raw: str | None  # as printed; None for a line without one
    uptime_s: float | None  # seconds since boot, where that is what the line carries


def stamp_of(prefix: str) -> Stamp:
    """The time in front of a kernel message (whatever printed it)."""
    for rx in (_ISO, _SYSLOG, _WALL, _DMESG_ISO):
        m = rx.search(prefix)
        if m:
            mono = _MONO.search(prefix[m.end():])
            return Stamp(raw=m.group(1), uptime_s=float(mono.group(1)) if mono else None)
    m = _MONO.search(prefix)
    if m:
        return Stamp(raw=m.group(0), uptime_s=float(m.group(1)))
    return Stamp(raw=None, uptime_s=None)


def pci_key(pci: str) -> str:
    """`0000:9B:00.0` / `0000:9b:00` -> `0000:9b:00`: how the driver names a GPU in an Xid."""
    return pci.lower().split(".")[0]


class XidEvent(_Model):
    line_no: int
    xid: int
    pci: str  # domain:bus:device, lower case
    pid: int | None
    process: str | None
    message: str
    stamp: Stamp
    meaning: str | None  # from XID_CATALOG; None for an Xid it does not list
    category: str | None  # memory | link | bus | firmware | driver | application
    bad: bool  # the GPU, its memory or a link, not the application (itself or its cause)
    caused_by: int | None  # "caused by previous Xid N" (Xid 45 names the one it cleans up)
    line: str


class BusEvent(_Model):
    """A GPU that fell off the bus (the driver's multi-line message, with or without Xid 79)."""

    line_no: int
    pci: str | None
    stamp: Stamp
    text: str


class KernelLogFacts(_Model):
    lines: int
    events: list[XidEvent]
    fallen_off_bus: list[BusEvent]
    gpus: dict[str, str]  # pci (domain:bus:device) -> GPU UUID, from "NVRM: GPU at PCI:..."
    last_uptime_s: float | None  # the latest seconds-since-boot stamp of any line
    elided: bool  # the text leaves lines out ([...])

    @property
    def bad(self) -> list[XidEvent]:
        return [e for e in self.events if e.bad]

    def count(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for e in self.events:
            out[e.xid] = out.get(e.xid, 0) + 1
        return out

    def new_since(self, before: KernelLogFacts) -> list[XidEvent]:
        """Events of this read that the earlier read of the same log did not have: by
        seconds since boot where both reads have them, else by their text."""
        if before.last_uptime_s is not None and all(e.stamp.uptime_s is not None
                                                    for e in self.events):
            return [e for e in self.events if e.stamp.uptime_s is not None
                    and e.stamp.uptime_s > before.last_uptime_s]
        seen: dict[str, int] = {}
        for e in before.events:
            seen[e.line] = seen.get(e.line, 0) + 1
        out = []
        for e in self.events:
            if seen.get(e.line, 0):
                seen[e.line] -= 1
            else:
                out.append(e)
        return out


def _xid_event(no: int, line: str, idx: int) -> XidEvent:
    m = _XID.search(line, idx)
    if not m:
        raise ParseError(XID_KIND, "an `NVRM: Xid` line without `Xid (PCI:<bus id>): <number>`",
                         line_no=no, line=line)
    rest = m.group("rest") or ""
    pid = process = None
    pm = _PID.match(rest)
    if pm:
        raw_pid = pm.group("pid").strip("'")
        pid = None if raw_pid == "<unknown>" else int(raw_pid)
        name = (pm.group("name") or "").strip("'")
        process = None if name in ("", "<unknown>") else name
        rest = rest[pm.end():]
    xid = int(m.group("xid"))
    meaning, category, _ = XID_CATALOG.get(xid, (None, None, False))
    cause = _CAUSE.search(rest)
    caused_by = int(cause.group(1)) if cause else None
    bad = xid_is_bad(xid, caused_by)
    return XidEvent(line_no=no, xid=xid, pci=pci_key(m.group("pci")), pid=pid, process=process,
                    message=rest.strip(), stamp=stamp_of(line[:idx]), meaning=meaning,
                    category=category, bad=bad, caused_by=caused_by, line=line.strip())


def kernels(line: str, at: int) -> bool:
    """Whether the message at `at` stands where the kernel's does: behind nothing, a stamp,
    a printk level or a syslog/journal `host kernel:` (not inside a quote, code or prose)."""
    return _PREFIX.fullmatch(line, 0, at) is not None


def _evidence(lines: list[str], kind: str, source: str | None) -> None:
    """Positive evidence that the text is a kernel log: a line of the kernel's shape (a
    dmesg, journal or syslog stamp, or an `NVRM:`/`pci` message at the start of a line).
    A phrase inside prose or code is not a log, and a file without one line of a log is
    refused rather than read as a clean one."""
    for line in lines:
        if _STAMPED.match(line) or _JOURNAL_MARK.match(line.strip()):
            return
        m = _DRIVER_LINE.search(line)
        if m and kernels(line, m.start()):
            return
    raise ParseError(kind, "not a kernel log: no line has the kernel's shape (a dmesg, "
                     "journalctl or syslog time stamp, or an `NVRM:` or `pci` message at the "
                     "start of a line); save `sudo dmesg -T` or `journalctl -k` as printed",
                     source=source)


# journalctl's own lines: an empty journal (`-- No entries --`) is a log with no events
_JOURNAL_MARK = re.compile(r"^-- (?:No entries|Logs begin at .*|Journal begins at .*|Boot "
                           r"[0-9a-f]+) --$")
_DRIVER_LINE = re.compile(r"NVRM: |\bpci [0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]: ")
_GPU_GONE = re.compile(r"NVRM: GPU (?:at PCI:)?(?P<pci>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:"
                       r"[0-9a-fA-F]{2}(?:\.[0-7])?):? .*fallen off the bus")


def parse_kernel_log(text: str, source: str | None = None) -> KernelLogFacts:
    events: list[XidEvent] = []
    bus: list[BusEvent] = []
    gpus: dict[str, str] = {}
    last: float | None = None
    elided = False
    lines = text.splitlines()
    if not any(ln.strip() for ln in lines):
        raise ParseError(XID_KIND, "empty output", source=source)
    _evidence(lines, XID_KIND, source)
    pending_gpu: tuple[int, str | None, Stamp] | None = None
    for no, raw in enumerate(lines, 1):
        line = raw.rstrip("\r")
        if _ELISION.match(line):
            elided = True
            continue
        st = stamp_of(line)
        if st.uptime_s is not None:
            last = st.uptime_s if last is None else max(last, st.uptime_s)
        nvrm = line.find("NVRM:")
        if nvrm < 0 or not kernels(line, nvrm):
            continue  # not the driver's message (another subsystem, or a quote of one)
        idx = line.find("NVRM: Xid")
        if idx >= 0:
            try:
                events.append(_xid_event(no, line, idx))
            except ParseError as exc:
                raise ParseError(XID_KIND, "an `NVRM: Xid` line without `Xid (PCI:<bus id>): "
                                 "<number>`", line_no=no, line=line, source=source) from exc
            continue
        if m := _GPU_AT.search(line):
            gpus[pci_key(m["pci"])] = m["uuid"]
            continue
        if m := _GPU_GONE.search(line):  # `NVRM: GPU 0018:06:00.0: GPU has fallen off the bus.`
            bus.append(BusEvent(line_no=no, pci=pci_key(m["pci"]), stamp=st, text=line.strip()))
            pending_gpu = None
            continue
        if m := _THE_GPU.search(line):
            pending_gpu = (no, pci_key(m["pci"]), st)
        if "fallen off the bus" in line:
            where = pending_gpu if pending_gpu and no - pending_gpu[0] <= 3 else (no, None, st)
            bus.append(BusEvent(line_no=where[0], pci=where[1], stamp=where[2],
                                text=line.strip()))
            pending_gpu = None
    return KernelLogFacts(lines=len(lines), events=events, fallen_off_bus=bus, gpus=gpus,
                          last_uptime_s=last, elided=elided)


register(XID_KIND, "kernel log (dmesg, dmesg -T, journalctl -k, syslog): NVIDIA Xid events, "
         "GPUs fallen off the bus",
         example='sudo dmesg -T | grep -i xid  (or journalctl -k)')(parse_kernel_log)


# --------------------------------------------------------------------------- PCIe links

_PCIE = re.compile(
    r"(?P<bdf>[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]): (?P<avail>\d+\.\d+) Gb/s available "
    r"PCIe bandwidth, limited by (?P<speed>\d+(?:\.\d+)?) GT/s PCIe x(?P<width>\d+) link at "
    r"(?P<at>\S+) \(capable of (?P<cap>\d+\.\d+) Gb/s with (?P<cap_speed>\d+(?:\.\d+)?) GT/s "
    r"PCIe x(?P<cap_width>\d+) link\)")
_PCIE_FULL = re.compile(
    r"(?P<bdf>[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]): (?P<avail>\d+\.\d+) Gb/s available "
    r"PCIe bandwidth \((?P<speed>\d+(?:\.\d+)?) GT/s PCIe x(?P<width>\d+) link\)")
GEN_OF_GTS = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}


class PcieLink(_Model):
    line_no: int
    bdf: str
    available_gbps: float  # Gb/s, as the kernel computes it (encoding overhead removed)
    speed_gts: float
    width: int
    gen: int | None
    limited: bool  # False: the line says the device gets what it is capable of
    limited_at: str | None  # the device whose link limits it (a bridge, a switch port)
    capable_gbps: float | None
    capable_speed_gts: float | None
    capable_width: int | None
    capable_gen: int | None
    stamp: Stamp


class PcieBandwidthFacts(_Model):
    links: list[PcieLink]
    lines: int
    elided: bool

    @property
    def limited(self) -> list[PcieLink]:
        return [x for x in self.links if x.limited]


def parse_pcie_bandwidth(text: str, source: str | None = None) -> PcieBandwidthFacts:
    links: list[PcieLink] = []
    lines = text.splitlines()
    if not any(ln.strip() for ln in lines):
        raise ParseError(PCIE_KIND, "empty output", source=source)
    _evidence(lines, PCIE_KIND, source)
    elided = False
    for no, raw in enumerate(lines, 1):
        line = raw.rstrip("\r")
        if _ELISION.match(line):
            elided = True
            continue
        if "available PCIe bandwidth" not in line:
            continue
        idx = line.find("available PCIe bandwidth")
        head = line[:idx]
        at = re.search(r"[\w-]+ [0-9a-f]{4}:[0-9a-f]{2}:", head)
        if at is None or not kernels(line, at.start()):
            continue  # the phrase, not the PCI core's line

        m = _PCIE.search(line)
        if m:
            cap_speed = float(m["cap_speed"])
            links.append(PcieLink(
                line_no=no, bdf=m["bdf"], available_gbps=float(m["avail"]),
                speed_gts=float(m["speed"]), width=int(m["width"]),
                gen=GEN_OF_GTS.get(float(m["speed"])), limited=True, limited_at=m["at"],
                capable_gbps=float(m["cap"]), capable_speed_gts=cap_speed,
                capable_width=int(m["cap_width"]), capable_gen=GEN_OF_GTS.get(cap_speed),
                stamp=stamp_of(head)))
            continue
        m = _PCIE_FULL.search(line)
        if m:
            links.append(PcieLink(
                line_no=no, bdf=m["bdf"], available_gbps=float(m["avail"]),
                speed_gts=float(m["speed"]), width=int(m["width"]),
                gen=GEN_OF_GTS.get(float(m["speed"])), limited=False, limited_at=None,
                capable_gbps=None, capable_speed_gts=None, capable_width=None,
                capable_gen=None, stamp=stamp_of(head)))
            continue
        raise ParseError(PCIE_KIND, "an `available PCIe bandwidth` line not in the kernel's "
                         "layout", line_no=no, line=line, source=source)
    return PcieBandwidthFacts(links=links, lines=len(lines), elided=elided)


register(PCIE_KIND, "kernel log: the PCI core's `available PCIe bandwidth, limited by` lines",
         example="sudo dmesg | grep 'available PCIe bandwidth'")(parse_pcie_bandwidth)
