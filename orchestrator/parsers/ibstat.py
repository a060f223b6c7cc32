"""`ibstat`: InfiniBand/RoCE adapters and the state and rate of every port.

ibstat walks the adapters one by one and dies on the first it cannot stat
(`ibpanic: ... stat of IB device 'mlx5_8' failed`), so a node with one broken
HCA prints the healthy ones and then the error. The adapters before the error
are kept and the error is a fact of its own: losing them would hide which
ports work. `ibwarn:` lines (libibumad's debug chatter) are kept as warnings.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

from orchestrator.errors import ParseError
from orchestrator.parsers import register

KIND = "ibstat"

_CA = re.compile(r"CA '(?P<name>[^']+)'")
_KV = re.compile(r"(?P<key>[A-Za-z][A-Za-z ]*?):\s*(?P<val>.*?)\s*")
_PORT = re.compile(r"Port (?P<n>\d+):")
_ERROR = re.compile(r"(?:ibpanic|ibstat|iberror): .*|.*\bfailed\b.*")
_WARN = re.compile(r"ibwarn: .*")

_CA_KEYS = {"ca type": "ca_type", "number of ports": "num_ports",
            "firmware version": "firmware", "hardware version": "hardware_version",
            "node guid": "node_guid", "system image guid": "system_image_guid"}
_PORT_KEYS = {"state": "state", "physical state": "physical_state", "rate": "rate_gbps",
              "base lid": "base_lid", "lmc": "lmc", "sm lid": "sm_lid",
              "capability mask": "capability_mask", "port guid": "port_guid",
              "link layer": "link_layer"}
_INTS = {"num_ports", "base_lid", "lmc", "sm_lid"}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class IbstatPort(_Model):
    port: int
    state: str | None = None  # Active, Down, Initializing, Armed
    physical_state: str | None = None  # LinkUp, Disabled, Polling
    rate_gbps: float | None = None  # as printed: 400, 200, 2.5
    base_lid: int | None = None
    lmc: int | None = None
    sm_lid: int | None = None
    capability_mask: str | None = None
    port_guid: str | None = None
    link_layer: str | None = None  # InfiniBand / Ethernet
    other: dict[str, str] = {}


class IbstatCa(_Model):
    name: str
    ca_type: str | None = None  # MT4129 = ConnectX-7, MT4123 = ConnectX-6
    num_ports: int | None = None
    firmware: str | None = None
    hardware_version: str | None = None
    node_guid: str | None = None
    system_image_guid: str | None = None
    ports: list[IbstatPort] = []
    other: dict[str, str] = {}
    line_no: int


class IbstatMessage(_Model):
    line_no: int
    text: str


class IbstatFacts(_Model):
    cas: list[IbstatCa]
    errors: list[IbstatMessage]  # the adapters after the first error were not listed
    warnings: list[IbstatMessage]

    @property
    def ports(self) -> list[tuple[str, IbstatPort]]:
        return [(ca.name, p) for ca in self.cas for p in ca.ports]


def parse_ibstat(text: str, source: str | None = None) -> IbstatFacts:
    cas: list[IbstatCa] = []
    errors: list[IbstatMessage] = []
    warnings: list[IbstatMessage] = []
    port: IbstatPort | None = None
    port_indent = -1
    seen = False
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip("\r")
        s = line.strip()
        if not s:
            continue
        seen = True
        if _WARN.fullmatch(s):
            warnings.append(IbstatMessage(line_no=no, text=s))
            continue
        if m := _CA.fullmatch(s):
            if line[:1].isspace():
                raise ParseError(KIND, "indented `CA` line", line_no=no, line=line, source=source)
            cas.append(IbstatCa(name=m["name"], line_no=no))
            port, port_indent = None, -1
            continue
        if not line[:1].isspace():
            if _ERROR.fullmatch(s):
                errors.append(IbstatMessage(line_no=no, text=s))
                port = None
                continue
            raise ParseError(KIND, "not a `CA '<name>'` line or a known error", line_no=no,
                             line=line, source=source)
        if not cas:
            raise ParseError(KIND, "adapter details before the first `CA` line", line_no=no,
                             line=line, source=source)
        indent = len(line) - len(line.lstrip())
        if m := _PORT.fullmatch(s):
            port = IbstatPort(port=int(m["n"]))
            port_indent = indent
            cas[-1].ports.append(port)
            continue
        kv = _KV.fullmatch(s)
        if kv is None:
            raise ParseError(KIND, "not a `Key: value` line", line_no=no, line=line, source=source)
        key, val = kv["key"].lower(), kv["val"]
        in_port = port is not None and indent > port_indent
        try:
            if in_port and key in _PORT_KEYS:
                field = _PORT_KEYS[key]
                value: object = val
                if field == "rate_gbps":
                    value = float(val)
                elif field in _INTS:
                    value = int(val)
                setattr(port, field, value)
            elif in_port:
                assert port is not None
                port.other[kv["key"]] = val
            elif key in _CA_KEYS:
                field = _CA_KEYS[key]
                setattr(cas[-1], field, int(val) if field in _INTS else val)
            else:
                cas[-1].other[kv["key"]] = val
        except ValueError:
            raise ParseError(KIND, f"{kv['key']} is not a number", line_no=no, line=line,
                             source=source) from None
    if not seen:
        raise ParseError(KIND, "empty output", source=source)
    return IbstatFacts(cas=cas, errors=errors, warnings=warnings)


# Registered without decorating, as dmon is: mutmut leaves decorated functions alone,
# so the parser itself would go unmeasured.
register(KIND, "ibstat: HCAs (type, firmware, GUID) and ports (state, rate, link layer, LIDs)",
         example="ibstat")(parse_ibstat)
