"""The payload's fabric snapshot (`python3 -m payload fabric`): typed InfiniBand/RoCE ports.

The snapshot is JSON the payload wrote from sysfs (`/sys/class/infiniband/<dev>/ports/<n>/`);
here every port becomes a `FabricPort` with its state and rate read as sysfs prints them
("4: ACTIVE", "400 Gb/sec (4X NDR)"), its error counters as integers, its non-zero P_Keys
normalised to `0xffff` form, and for a RoCE port its GID types, netdev and MTU. A node
without `/sys/class/infiniband` gives `present: false` and no ports: a fact, not an error.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from orchestrator.errors import ParseError
from orchestrator.parsers import register

KIND = "sysfs-fabric"

_RATE = re.compile(r"^\s*(?P<v>\d+(?:\.\d+)?)\s*Gb/sec")
_STATE = re.compile(r"^\s*\d+:\s*(?P<s>\S.*?)\s*$")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Gid(_Model):
    index: int
    gid: str
    type: str | None = None  # "RoCE v2", "IB/RoCE v1"
    ndev: str | None = None


class FabricPort(_Model):
    device: str
    port: int
    state: str | None = None  # ACTIVE, DOWN, INIT, ARMED (the number before ':' dropped)
    phys_state: str | None = None  # LinkUp, Disabled, Polling
    rate: str | None = None  # as sysfs prints it: "400 Gb/sec (4X NDR)"
    rate_gbps: float | None = None
    link_layer: str | None = None  # InfiniBand, Ethernet
    counters: dict[str, int] = {}
    counters_unreadable: dict[str, str] = {}  # "N/A (no PMA)"
    pkeys: list[str] = []  # non-zero entries, table order, "0xffff"
    bad_pkeys: list[str] = []  # entries that are not a 16-bit hex value, as read
    gids: list[Gid] = []  # RoCE ports: the populated GID entries
    netdev: str | None = None
    mtu: int | None = None

    @property
    def key(self) -> str:
        return f"{self.device}:{self.port}"

    @property
    def roce(self) -> bool:
        return (self.link_layer or "").lower() == "ethernet"

    @property
    def active(self) -> bool:
        return self.state == "ACTIVE"


class FabricFacts(_Model):
    present: bool  # /sys/class/infiniband exists
    root: str = "/sys/class/infiniband"
    taken_at: str | None = None
    monotonic_s: float | None = None
    ports: list[FabricPort] = []
    devices_without_ports: list[str] = []
    truncated: bool = False

    def port(self, device: str, number: int) -> FabricPort | None:
        return next((p for p in self.ports if p.device == device and p.port == number), None)


def _state(text: Any) -> str | None:
    if not isinstance(text, str) or not text.strip():
        return None
    m = _STATE.match(text)
    return m["s"] if m else text.strip()


def _rate(text: Any) -> float | None:
    m = _RATE.match(text) if isinstance(text, str) else None
    return float(m["v"]) if m else None


def _pkey(text: str) -> str | None:
    try:
        v = int(text, 16)
    except ValueError:
        return None
    return f"0x{v:04x}" if 0 <= v <= 0xFFFF else None


def _port(device: str, rec: dict[str, Any]) -> FabricPort:
    pkeys: list[str] = []
    bad: list[str] = []
    for _, text in sorted((rec.get("pkeys") or {}).items(), key=lambda kv: int(kv[0])
                          if str(kv[0]).isdigit() else 1 << 30):
        v = _pkey(str(text))
        if v is None:
            bad.append(str(text))
        elif int(v, 16) & 0x7FFF:
            pkeys.append(v)
    gids = [Gid(index=int(i), gid=str(g.get("gid")), type=g.get("type"), ndev=g.get("ndev"))
            for i, g in sorted((rec.get("gids") or {}).items(), key=lambda kv: int(kv[0]))]
    return FabricPort(
        device=device, port=int(rec["port"]), state=_state(rec.get("state")),
        phys_state=_state(rec.get("phys_state")), rate=rec.get("rate"),
        rate_gbps=_rate(rec.get("rate")), link_layer=rec.get("link_layer"),
        counters={str(k): int(v) for k, v in (rec.get("counters") or {}).items()},
        counters_unreadable={str(k): str(v) for k, v in
                             (rec.get("counters_unreadable") or {}).items()},
        pkeys=pkeys, bad_pkeys=bad, gids=gids, netdev=rec.get("netdev"), mtu=rec.get("mtu"))


def from_document(doc: Any, source: str | None = None) -> FabricFacts:
    """The snapshot as typed facts; ParseError naming what is wrong."""
    if not isinstance(doc, dict) or "present" not in doc or "devices" not in doc:
        raise ParseError(KIND, "not a fabric snapshot (no 'present' and 'devices')",
                         source=source)
    try:
        ports: list[FabricPort] = []
        empty: list[str] = []
        for d in doc["devices"]:
            name = str(d["name"])
            got = [_port(name, p) for p in d.get("ports") or []]
            ports += got
            if not got:
                empty.append(name)
        return FabricFacts(present=bool(doc["present"]), root=str(doc.get("root") or
                                                                  "/sys/class/infiniband"),
                           taken_at=doc.get("taken_at"), monotonic_s=doc.get("monotonic_s"),
                           ports=ports, devices_without_ports=empty,
                           truncated=bool(doc.get("truncated")))
    except (KeyError, TypeError, ValueError, AttributeError, ValidationError) as exc:
        raise ParseError(KIND, f"fabric snapshot not understood: {type(exc).__name__}: "
                         f"{str(exc).splitlines()[0][:200]}", source=source) from None


def parse_fabric(text: str, source: str | None = None) -> FabricFacts:
    """`python3 -m payload fabric`'s JSON."""
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        raise ParseError(KIND, "not JSON: expected the output of `python3 -m payload fabric`",
                         source=source) from None
    return from_document(doc, source)


register(KIND, "the payload's sysfs snapshot of InfiniBand/RoCE ports: state, rate, error "
         "counters, P_Keys, RoCE GID types and MTU",
         example="python3 -m payload fabric")(parse_fabric)
