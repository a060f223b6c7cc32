"""`lspci -vv` / `lspci -vvv`: each PCI device's link, as capable (`LnkCap`) and as
trained (`LnkSta`), to find GPUs running at a lower speed or width than they can.

lspci 3.8 and later mark the status `(downgraded)` or `(ok)`; older ones do not,
and the status is compared with the capability instead. A GPU that idles at Gen1
is downgraded by power management, not by its slot: the status has to be read
under load (the health step does) before a downgrade means a bad slot. An excerpt
that starts inside a device's capabilities (no device line) is read as a device of
unknown address. Lines that are not a device line and not indented are errors.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

from orchestrator.errors import ParseError
from orchestrator.parsers import register

KIND = "lspci-vvv"

_DEVICE = re.compile(r"^(?P<bdf>(?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]) "
                     r"(?P<cls>[^:]+?)(?: \[(?P<clsid>[0-9a-f]{4})\])?: (?P<desc>.*)$")
_LNKCAP = re.compile(r"^LnkCap:\s*(?:Port #\d+, )?Speed (?P<speed>[\d.]+GT/s|unknown), "
                     r"Width x(?P<width>\d+)")
_LNKSTA = re.compile(r"^LnkSta:\s*Speed (?P<speed>[\d.]+GT/s|unknown)(?: \((?P<smark>ok|downgraded)\))?"
                     r", Width x(?P<width>\d+)(?: \((?P<wmark>ok|downgraded)\))?")
_DRIVER = re.compile(r"^Kernel driver in use: (?P<driver>\S+)")
GEN_OF_GTS = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Link(_Model):
    speed_gts: float | None  # None: "unknown"
    gen: int | None
    width: int
    line_no: int


class LinkStatus(Link):
    speed_marked: str | None  # "ok" | "downgraded" as lspci printed it; None on older lspci
    width_marked: str | None


class PciDevice(_Model):
    bdf: str | None  # None: an excerpt that starts inside a device
    device_class: str | None
    description: str | None
    link_cap: Link | None
    link_status: LinkStatus | None
    driver: str | None
    line_no: int

    @property
    def nvidia_gpu(self) -> bool:
        return bool(self.description and "NVIDIA" in self.description and self.device_class
                    and re.search(r"VGA|3D|Display", self.device_class))

    @property
    def speed_downgraded(self) -> bool | None:
        st, cap = self.link_status, self.link_cap
        if st is None:
            return None
        if st.speed_marked is not None:
            return st.speed_marked == "downgraded"
        if cap is None or cap.speed_gts is None or st.speed_gts is None:
            return None
        return st.speed_gts < cap.speed_gts

    @property
    def width_downgraded(self) -> bool | None:
        st, cap = self.link_status, self.link_cap
        if st is None:
            return None
        if st.width_marked is not None:
            return st.width_marked == "downgraded"
        if cap is None:
            return None
        return st.width < cap.width


class LspciFacts(_Model):
    devices: list[PciDevice]

    @property
    def gpus(self) -> list[PciDevice]:
        return [d for d in self.devices if d.nvidia_gpu]

    @property
    def downgraded(self) -> list[PciDevice]:
        return [d for d in self.devices if d.speed_downgraded or d.width_downgraded]


def _speed(text: str) -> tuple[float | None, int | None]:
    if text == "unknown":
        return None, None
    v = float(text.removesuffix("GT/s"))
    return v, GEN_OF_GTS.get(v)


def parse_lspci(text: str, source: str | None = None) -> LspciFacts:
    devices: list[PciDevice] = []
    seen = False
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip()
        if not line.strip():
            continue
        seen = True
        if not line[:1].isspace():
            m = _DEVICE.match(line)
            if not m:
                raise ParseError(KIND, "not a device line (`BB:DD.F class: description`)",
                                 line_no=no, line=line, source=source)
            devices.append(PciDevice(bdf=m["bdf"].lower(), device_class=m["cls"].strip(),
                                     description=m["desc"].strip(), link_cap=None,
                                     link_status=None, driver=None, line_no=no))
            continue
        if not devices:
            devices.append(PciDevice(bdf=None, device_class=None, description=None,
                                     link_cap=None, link_status=None, driver=None, line_no=no))
        dev = devices[-1]
        s = line.strip()
        if s.startswith("LnkCap:"):
            m = _LNKCAP.match(s)
            if not m:
                raise ParseError(KIND, "LnkCap without `Speed <n>GT/s, Width x<n>`", line_no=no,
                                 line=line, source=source)
            speed, gen = _speed(m["speed"])
            dev.link_cap = Link(speed_gts=speed, gen=gen, width=int(m["width"]), line_no=no)
        elif s.startswith("LnkSta:"):
            m = _LNKSTA.match(s)
            if not m:
                raise ParseError(KIND, "LnkSta without `Speed <n>GT/s, Width x<n>`", line_no=no,
                                 line=line, source=source)
            speed, gen = _speed(m["speed"])
            dev.link_status = LinkStatus(speed_gts=speed, gen=gen, width=int(m["width"]),
                                         line_no=no, speed_marked=m["smark"],
                                         width_marked=m["wmark"])
        elif m := _DRIVER.match(s):
            dev.driver = m["driver"]
    if not seen:
        raise ParseError(KIND, "empty output", source=source)
    return LspciFacts(devices=devices)


# Registered without decorating, as dmon is: mutmut leaves decorated functions alone,
# so the parser itself would go unmeasured.
register(KIND, "lspci -vvv: PCI devices, link capability and trained status (downgraded links)",
         example='sudo lspci -vvv -d 10de:')(parse_lspci)
