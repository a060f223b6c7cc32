"""GPU names: which card does an order name, which card does a node report, are they the same?

Shared by the preflight checks (the order against every GPU), the shipped reference bands
(which bands belong to this machine), MFU, the health datasheets, the inventory check and
the environment comparison (form factor per provider), so it sits below all of them and
imports nothing of gpuvet. It reads the one catalog of cards, `data/gpu_peaks.yaml`.

A name is placed on the catalog's variants by what it says, never by substring: the family
("H100", "GB200", "RTX PRO 6000 Blackwell", a whole word, so "GB200" is not "B200" and "A10"
not "A100"), the memory size ("80GB", "80G", "80 GB") and the form factor ("SXM5", "PCIe",
"NVL"). What a name leaves out matches every variant of its family; a name nvidia-smi prints
(`smi_names`, "NVIDIA H100 80GB HBM3") is its one variant exactly. An order is placed
strictly: a word gpuvet does not read makes it unplaceable, an `inventory check` error
listing the known variants. A reported name is placed leniently (a driver's extra words,
"SXM6 AC", are read past). The order matches the GPU when every variant the GPU can be is
one the order allows. A card the driver cannot name ("NVIDIA Graphics Device": a driver
older than the card) is identified by its PCI device id, or by its memory and SM count.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

from ruamel.yaml import YAML

_MAKER = re.compile("nvidia|tesla|geforce|quadro")  # the maker's words say nothing of the model
# words an order or a name may carry that say nothing more about the variant
_NOISE = frozenset({
    "gpu", "gpus", "tensor", "core", "cores", "accelerator", "card", "module", "edition",
    "server", "datacenter", "superchip", "grace", "hopper", "blackwell", "ampere", "volta",
    "ultra", "hbm", "hbm2", "hbm2e", "hbm3", "hbm3e", "gddr6", "gddr7", "ecc", "of", "with"})
_RACK_OR_COUNT = re.compile(r"^(nvl\d+|\d+x|x\d+)$")  # GB200 NVL72, "8x H100"
_MEMORY = re.compile(r"^(\d+(?:\.\d+)?)(gb|g|gib)$")
_UNIT = {"gb", "g", "gib"}
_BOARDS = {"sxm": "sxm", "pcie": "pcie", "pci": "pcie", "nvl": "nvl"}
_SXM = re.compile(r"^sxm\d?$")
BOARD_WORDS = {"sxm": "SXM", "pcie": "PCIe", "nvl": "NVL", "superchip": "superchip"}
BY_NAME = "by its name"
GENERIC = re.compile(r"^\s*(nvidia\s+)?(graphics\s+)?device(\s+[0-9a-f]{4})?\s*$", re.I)


def _squash(s: str) -> str:
    return re.sub(r"[^a-z0-9]", "", _MAKER.sub("", s.lower()))


def _tokens(s: str) -> list[str]:
    return [t.strip(".") for t in re.split(r"[^a-z0-9.]+", _MAKER.sub(" ", s.lower()))
            if t.strip(".")]


@dataclass(frozen=True)
class Card:
    """One variant of the catalog as names see it."""

    name: str  # the datasheet's name ("H100 SXM")
    family: str
    memory_gb: float | None
    board: str | None
    label: str  # family, form factor (PCIe where the family has others), memory: "H100 SXM 80GB"
    memory_also: tuple[float, ...] = ()
    aliases: tuple[str, ...] = ()
    smi_names: tuple[str, ...] = ()
    pci_ids: tuple[str, ...] = ()
    sms: int | None = None
    tflops: float | None = None  # the dense bf16 peak, MFU's denominator


@dataclass(frozen=True)
class Placement:
    """The variants a name can be; `problem` says why there are none."""

    text: str
    cards: tuple[Card, ...]
    problem: str | None = None
    exact: bool = False  # a name nvidia-smi prints, one variant

    @property
    def labels(self) -> str:
        return ", ".join(c.label for c in self.cards)


@dataclass(frozen=True)
class Identified:
    """The variants a GPU is, and how that was told."""

    cards: tuple[Card, ...]
    how: str  # "by its name", "by its PCI device id 10de:2901", ...

    @property
    def labels(self) -> str:
        return ", ".join(c.label for c in self.cards)


@dataclass(frozen=True)
class Catalog:
    cards: tuple[Card, ...]

    @functools.cached_property
    def _exact(self) -> dict[str, Card]:
        """The names nvidia-smi prints, and the labels gpuvet writes (an order may copy one
        from the inventory check's list), each its one variant."""
        return {_squash(n): c for c in self.cards for n in (*c.smi_names, c.label)}

    @functools.cached_property
    def _families(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for c in self.cards:
            for spelling in (c.family, *c.aliases):
                out[_squash(spelling)] = c.family
        return out

    def family_cards(self, family: str) -> tuple[Card, ...]:
        return tuple(c for c in self.cards if c.family == family)

    def known(self) -> str:
        return ", ".join(c.label for c in self.cards)

    def place(self, text: str | None, strict: bool = True) -> Placement:
        """The variants `text` names (see the module's rules)."""
        text = (text or "").strip()
        if not _squash(text):
            return Placement(text, (), "names no card")
        exact = self._exact.get(_squash(text))
        # a name nvidia-smi prints is its one variant; an order that is the bare family
        # ("H200", which nvidia-smi prints for the SXM) leaves the form factor open
        if exact is not None and (not strict or _squash(text) != _squash(exact.family)):
            return Placement(text, (exact,), exact=True)
        toks = _tokens(text)
        best: tuple[int, int, int, str] | None = None  # (spelling length, start, end, family)
        for i in range(len(toks)):
            for j in range(i + 1, min(len(toks), i + 4) + 1):
                spelled = "".join(toks[i:j]).replace(".", "")
                fam = self._families.get(spelled)
                if fam is not None and (best is None or len(spelled) > best[0]):
                    best = (len(spelled), i, j, fam)
        if best is None:
            return Placement(text, (), "no card family gpuvet knows in it")
        _, i, j, family = best
        memory: float | None = None
        board: str | None = None
        rest = toks[:i] + toks[j:]
        k = 0
        while k < len(rest):
            t = rest[k]
            m = _MEMORY.match(t)
            if m is None and re.fullmatch(r"\d+(\.\d+)?", t) and k + 1 < len(rest) \
                    and rest[k + 1] in _UNIT:
                m = re.match(r"(\d+(?:\.\d+)?)", t)
                k += 1
            if m is not None:
                size = float(m.group(1))
                if memory is not None and size != memory:
                    return Placement(text, (), f"two memory sizes ({memory:g} and {size:g} GB)")
                memory = size
            elif _SXM.match(t) or t in _BOARDS:
                b = "sxm" if _SXM.match(t) else _BOARDS[t]
                if board is not None and b != board:
                    return Placement(text, (), f"two form factors ({board} and {b})")
                board = b
            elif strict and t not in _NOISE and not _RACK_OR_COUNT.match(t):
                return Placement(text, (), f"{t!r} is not a memory size, form factor or model "
                                 "word gpuvet reads")
            k += 1
        cards = tuple(c for c in self.family_cards(family)
                      if (memory is None or c.memory_gb is None or abs(c.memory_gb - memory) < 0.5
                          or memory in c.memory_also)
                      and (board is None or c.board is None or c.board == board))
        if not cards:
            said = " ".join(x for x in (BOARD_WORDS.get(board or "", ""),
                                        f"{memory:g}GB" if memory else "") if x)
            return Placement(text, (), f"no {family} variant is {said} ({family} variants: "
                             f"{', '.join(c.label for c in self.family_cards(family))})")
        return Placement(text, cards)

    def identify(self, name: str | None, pci_device_id: str | None = None,
                 memory_mib: float | None = None, sms: int | None = None) -> Identified:
        """What a GPU is: by its name, else by its PCI device id, else by memory and SMs."""
        if name and not GENERIC.match(name):
            p = self.place(name, strict=False)
            if p.cards:
                return Identified(p.cards, BY_NAME)
        dev = pci_device(pci_device_id)
        if dev is not None:
            cards = tuple(c for c in self.cards if dev in c.pci_ids)
            if cards:
                return Identified(cards, f"by its PCI device id 10de:{dev}")
        if memory_mib and sms:
            gb = memory_mib * 1.048576 / 1000  # MiB as the datasheet's GB
            cards = tuple(c for c in self.cards if c.sms == sms and any(
                0.97 <= gb / size <= 1.1 for size in (c.memory_gb or 0, *c.memory_also) if size))
            if cards:
                return Identified(cards, f"by its memory ({memory_mib / 1024:.0f} GiB) and SM "
                                  f"count ({sms})")
        return Identified((), "not identified: " + (
            "the driver does not name it and no PCI device id or SM count told it"
            if not name or GENERIC.match(name) else f"{name!r} is no card gpuvet knows"))


def pci_device(value: str | None) -> str | None:
    """The device half of a PCI id as four hex digits: nvidia-smi's `0x233010DE`, lspci's
    `10de:2330`, or `0x2330`."""
    if not value:
        return None
    v = value.strip().lower()
    if ":" in v:
        vendor, _, v = v.partition(":")
        if vendor != "10de":
            return None
    v = v.removeprefix("0x")
    if len(v) == 8 and v.endswith("10de"):
        v = v[:4]
    return v if re.fullmatch(r"[0-9a-f]{4}", v) else None


def _label(row: dict[str, Any], boards: set[str | None]) -> str:
    if row.get("label"):
        return str(row["label"])
    parts = [str(row["family"])]
    board = row.get("board")
    if board in ("sxm", "nvl") or (board == "pcie" and len(boards) > 1):
        parts.append(BOARD_WORDS[board])
    if row.get("memory_gb"):
        parts.append(f"{float(row['memory_gb']):g}GB")
    return " ".join(parts)


def parse_catalog(doc: dict[str, Any]) -> Catalog:
    rows = list(doc.get("variants") or [])
    boards: dict[str, set[str | None]] = {}
    for r in rows:
        boards.setdefault(str(r["family"]), set()).add(r.get("board"))
    cards = []
    for r in rows:
        cards.append(Card(
            name=str(r["name"]), family=str(r["family"]),
            memory_gb=float(r["memory_gb"]) if r.get("memory_gb") else None,
            board=r.get("board"), label=_label(r, boards[str(r["family"])]),
            memory_also=tuple(float(x) for x in r.get("memory_also") or ()),
            aliases=tuple(str(x) for x in r.get("aliases") or ()),
            smi_names=tuple(str(x) for x in r.get("smi_names") or ()),
            pci_ids=tuple(str(x).lower() for x in r.get("pci_ids") or ()),
            sms=int(r["sms"]) if r.get("sms") else None,
            tflops=float(r["tflops"]) if r.get("tflops") is not None else None))
    return Catalog(tuple(cards))


@functools.lru_cache(maxsize=1)
def catalog_doc() -> dict[str, Any]:
    """The shipped `data/gpu_peaks.yaml`, read once."""
    text = resources.files("orchestrator").joinpath("data/gpu_peaks.yaml").read_text()
    doc = YAML(typ="safe").load(text)
    assert isinstance(doc, dict)
    return doc


@functools.lru_cache(maxsize=1)
def catalog() -> Catalog:
    return parse_catalog(catalog_doc())


def place(text: str | None, strict: bool = True) -> Placement:
    return catalog().place(text, strict)


def identify(name: str | None, pci_device_id: str | None = None,
             memory_mib: float | None = None, sms: int | None = None) -> Identified:
    return catalog().identify(name, pci_device_id, memory_mib, sms)


def order_problem(order: str) -> str | None:
    """Why gpuvet cannot place an order's `gpu_model`, with the variants it knows; None when
    it can."""
    p = place(order)
    if p.cards:
        return None
    known = "" if "variants:" in (p.problem or "") else f"; known variants: {catalog().known()}"
    return (f"gpuvet cannot place the GPU model {order!r}: {p.problem}{known}; write the "
            "family with the memory and form factor ordered, e.g. 'H100 SXM 80GB'")


def matches(order: str, cards: tuple[Card, ...]) -> bool:
    """Every variant the GPU can be is one the order allows."""
    want = place(order).cards
    return bool(want) and bool(cards) and set(cards) <= set(want)


def model_matches(expected: str, actual: str) -> bool:
    """Whether the card `actual` names (a reported name, or another order) is one `expected`
    (an order) allows: variants, never substrings."""
    return matches(expected, place(actual, strict=False).cards)


def form_factor_of(name: str) -> str | None:
    """"pcie" or "sxm" where the name's variants say so (NVL boards are PCIe cards,
    superchips SXM modules); None where they do not (the topology checks decide then)."""
    boards = {c.board for c in place(name, strict=False).cards}
    if len(boards) == 1 and None not in boards:
        return "pcie" if boards <= {"pcie", "nvl"} else "sxm"
    n = name.lower()  # a variant open on its form factor (A800), or none: the name's words
    if "pcie" in n or " nvl" in n:
        return "pcie"
    if "sxm" in n:
        return "sxm"
    return None
