"""Which machine a recognised output describes, from what it prints.

Hostnames, GPU UUIDs, PCI bus ids and InfiniBand node GUIDs: a file pasted
from another node is told apart by these, never by its name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel


@dataclass
class Identity:
    """What names the machine a file came from; empty where the output says nothing."""

    hosts: set[str] = field(default_factory=set)
    uuids: set[str] = field(default_factory=set)
    guids: set[str] = field(default_factory=set)
    buses: set[tuple[int, int | None]] = field(default_factory=set)

    # UUIDs and GUIDs name one device each: they alone decide where both files print
    # them. Bus ids repeat on machines of one model and hostnames on cloud images
    # (`ubuntu`): agreeing on those is weak, disagreeing on either is not.
    ORDER = (("uuids", "GPU UUIDs"), ("guids", "InfiniBand node GUIDs"),
             ("buses", "GPU PCI bus ids"), ("hosts", "hostname"))

    def __bool__(self) -> bool:
        return bool(self.hosts or self.uuids or self.guids or self.buses)

    def _overlap(self, other: Identity, attr: str) -> bool:
        mine, theirs = getattr(self, attr), getattr(other, attr)
        if attr == "buses" and any(d is None for _, d in mine | theirs):
            return bool({b for b, _ in mine} & {b for b, _ in theirs})
        return bool(mine & theirs)

    def differs(self, other: Identity) -> str | None:
        """The attribute that shows `other` is another machine, or None."""
        for attr in ("uuids", "guids"):
            if getattr(self, attr) and getattr(other, attr):
                return None if self._overlap(other, attr) else attr
        return next((a for a in ("buses", "hosts") if getattr(self, a) and getattr(other, a)
                     and not self._overlap(other, a)), None)

    def relation(self, other: Identity) -> int:
        """+1 the same machine as far as both tell, -1 another, 0 nothing to compare."""
        if self.differs(other) is not None:
            return -1
        both = any(getattr(self, a) and getattr(other, a) for a, _ in self.ORDER)
        return 1 if both else 0

    def add(self, other: Identity) -> None:
        for a, _ in self.ORDER:
            getattr(self, a).update(getattr(other, a))

    def shown(self, attr: str) -> str:
        vals = getattr(self, attr)
        if attr == "buses":
            return ", ".join(f"{b:02x}:{d:02x}" if d is not None else f"{b:02x}"
                             for b, d in sorted(vals, key=lambda x: (x[0], x[1] or 0))[:4])
        return ", ".join(sorted(vals)[:4]) + (" ..." if len(vals) > 4 else "")


def bus_key(bus: str | None) -> tuple[int, int | None] | None:
    """`00000000:19:00.0`, `0000:19:00` (nccl-tests 2.16+) and `0x19` (older) as (bus, device)."""
    s = (bus or "").strip().lower()
    m = re.fullmatch(r"(?:[0-9a-f]+:)?([0-9a-f]{1,2}):([0-9a-f]{1,2})(?:\.[0-7])?", s)
    if m:
        return int(m.group(1), 16), int(m.group(2), 16)
    m = re.fullmatch(r"0x([0-9a-f]{1,2})", s)
    return (int(m.group(1), 16), None) if m else None


def _guid(g: str | None) -> str | None:
    digits = re.sub(r"[^0-9a-f]", "", (g or "").lower().removeprefix("0x"))
    return digits.lstrip("0") or None


def identity(facts: Any) -> Identity:
    ident = Identity()
    d = facts.model_dump() if isinstance(facts, BaseModel) else {}
    if "hostname" in d and "kernel_release" in d:  # uname
        ident.hosts.add(d["hostname"].lower().split(".")[0])
    for r in d.get("ranks") or []:  # nccl-tests, text or -J
        ident.hosts.add(str(r["host"]).lower().split(".")[0])
        if (k := bus_key(r.get("bus_id"))) is not None:
            ident.buses.add(k)
    for g in d.get("gpus") or []:
        if not isinstance(g, dict):
            continue
        u = str(g.get("uuid") or "").lower()
        if u.startswith("gpu-"):
            ident.uuids.add(u)
        for key in ("bus_id", "pci_bus_id"):
            if (k := bus_key(g.get(key))) is not None:
                ident.buses.add(k)
    for dev in (d.get("devices") or []) + (d.get("cas") or []):
        if isinstance(dev, dict) and (g := _guid(dev.get("node_guid"))):
            ident.guids.add(g)
    return ident
