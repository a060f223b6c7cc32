"""cuda-samples' `p2pBandwidthLatencyTest`: which GPUs can reach each other directly,
and bandwidth and latency matrices with peer access off and on, one way and both
ways (newer samples add a P2P Reads matrix beside the Writes one).

Each latency matrix has a GPU table and a CPU table (the time the host saw). The
output is often pasted cut short: a matrix with fewer rows than columns is kept and
marked incomplete, never padded.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict

from orchestrator.errors import ParseError
from orchestrator.parsers import register

KIND = "p2pBandwidthLatencyTest"

_BANNER = re.compile(r"^\[P2P \(Peer-to-Peer\) GPU Bandwidth Latency Test\]$")
_DEVICE = re.compile(r"^Device: (?P<i>\d+), (?P<name>.+?), pciBusID: (?P<bus>[0-9a-fA-F]+), "
                     r"pciDeviceID: (?P<dev>[0-9a-fA-F]+), pciDomainID:\s*(?P<dom>[0-9a-fA-F]+)$")
_ACCESS = re.compile(r"^Device=(?P<i>\d+) (?P<can>CAN|CANNOT) Access Peer Device=(?P<j>\d+)$")
_TITLE = re.compile(r"^(?P<dir>Unidirectional |Bidirectional )?P2P=(?P<p2p>Enabled|Disabled) "
                    r"(?P<what>Bandwidth|Latency)(?: \(P2P (?P<method>Writes|Reads)\))? "
                    r"Matrix \((?P<unit>GB/s|us)\)$")
_CONNECTIVITY = "P2P Connectivity Matrix"
_HEADER = re.compile(r"^(?P<side>D\\D|GPU|CPU)\s+(?P<cols>\d+(?:\s+\d+)*)$")
_ROW = re.compile(r"^(?P<label>\d+)\s+(?P<values>\d+(?:\.\d+)?(?:\s+\d+(?:\.\d+)?)*)$")
_NOTES = ("***NOTE: In case a device doesn't have P2P access",
          "So you can see lesser Bandwidth (GB/s) and unstable Latency (us)",
          "NOTE: The CUDA Samples are not meant for performance measurements")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class P2pDevice(_Model):
    index: int
    name: str
    pci_bus: int
    pci_device: int
    pci_domain: int


class P2pMatrix(_Model):
    title: str
    measure: str  # bandwidth | latency | connectivity
    direction: str | None  # unidirectional | bidirectional (bandwidth only)
    p2p: bool | None
    method: str | None  # writes | reads, where the title names one
    unit: str | None  # GB/s | us
    side: str | None  # GPU | CPU for latency tables, None for the others
    columns: list[int]
    values: list[list[float]]
    line_no: int

    @property
    def complete(self) -> bool:
        return len(self.values) == len(self.columns)

    def off_diagonal(self) -> list[float]:
        return [v for i, row in enumerate(self.values) for j, v in enumerate(row) if i != j]


class P2pFacts(_Model):
    devices: list[P2pDevice]
    access: dict[str, bool]  # "i->j" -> can access peer
    matrices: list[P2pMatrix]

    def matrix(self, measure: str, p2p: bool | None = None, direction: str | None = None,
               side: str | None = None, method: str | None = None) -> P2pMatrix | None:
        for m in self.matrices:
            if m.measure != measure:
                continue
            if p2p is not None and m.p2p != p2p:
                continue
            if direction is not None and m.direction != direction:
                continue
            if side is not None and m.side != side:
                continue
            if method is not None and m.method != method:
                continue
            return m
        return None


def parse_p2p(text: str, source: str | None = None) -> P2pFacts:
    devices: list[P2pDevice] = []
    access: dict[str, bool] = {}
    matrices: list[P2pMatrix] = []
    block: dict[str, Any] | None = None  # the title a following table belongs to
    cur: P2pMatrix | None = None
    seen = False
    for no, raw in enumerate(text.splitlines(), 1):
        s = raw.strip()
        if not s:
            continue
        seen = True
        if _BANNER.match(s) or s.startswith(_NOTES):
            continue
        if m := _DEVICE.match(s):
            devices.append(P2pDevice(index=int(m["i"]), name=m["name"], pci_bus=int(m["bus"], 16),
                                     pci_device=int(m["dev"], 16), pci_domain=int(m["dom"], 16)))
            continue
        if m := _ACCESS.match(s):
            access[f"{m['i']}->{m['j']}"] = m["can"] == "CAN"
            continue
        if s == _CONNECTIVITY:
            block = {"title": s, "measure": "connectivity", "direction": None, "p2p": None,
                     "method": None, "unit": None}
            cur = None
            continue
        if m := _TITLE.match(s):
            measure = m["what"].lower()
            block = {"title": s, "measure": measure,
                     "direction": (m["dir"] or "").strip().lower() or None,
                     "p2p": m["p2p"] == "Enabled",
                     "method": m["method"].lower() if m["method"] else None, "unit": m["unit"]}
            cur = None
            continue
        if m := _HEADER.match(s):
            if block is None:
                raise ParseError(KIND, "a matrix heading without a title above it", line_no=no,
                                 line=raw, source=source)
            side = None if m["side"] == "D\\D" else m["side"]
            cur = P2pMatrix(title=str(block["title"]), measure=str(block["measure"]),
                            direction=block["direction"],
                            p2p=block["p2p"],
                            method=block["method"],
                            unit=block["unit"],
                            side=side, columns=[int(x) for x in m["cols"].split()], values=[],
                            line_no=no)
            matrices.append(cur)
            continue
        if (m := _ROW.match(s)) and cur is not None:
            vals = [float(v) for v in m["values"].split()]
            if len(vals) != len(cur.columns) or int(m["label"]) != len(cur.values):
                raise ParseError(KIND, f"row {m['label']} does not fit a matrix of "
                                 f"{len(cur.columns)} columns", line_no=no, line=raw,
                                 source=source)
            cur.values.append(vals)
            continue
        raise ParseError(KIND, "not a p2pBandwidthLatencyTest line", line_no=no, line=raw,
                         source=source)
    if not seen:
        raise ParseError(KIND, "empty output", source=source)
    if not devices and not matrices:
        raise ParseError(KIND, "no devices and no matrix: not p2pBandwidthLatencyTest's output",
                         source=source)
    return P2pFacts(devices=devices, access=access, matrices=matrices)


# Registered without decorating, as dmon is: mutmut leaves decorated functions alone,
# so the parser itself would go unmeasured.
register(KIND, "cuda-samples p2pBandwidthLatencyTest: peer access, bandwidth and latency matrices",
         example='./p2pBandwidthLatencyTest  (cuda-samples Samples/5_Domain_Specific)')(parse_p2p)
