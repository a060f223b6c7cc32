"""The datasheet the health step measures each GPU against: the variants of
`data/gpu_peaks.yaml` (the one catalog of cards, which MFU and the order matching of
`gpunames` read too) as typed records, the shipped achievable fractions (measured on one
variant; the others are judged with them as a stand-in and the finding says so), and what a
PCIe link carries per direction.

The table is validated when it is read (unknown keys refused, every figure a
number or null), so a typo in the shipped file fails the tests, not a node.
"""

from __future__ import annotations

import functools
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from orchestrator import gpunames

PRECISIONS = ("bf16", "fp16", "tf32", "fp32", "fp64", "fp8")
# the kernel's GT/s per generation, and the share of the raw rate its encoding leaves:
# 8b/10b up to Gen2, 128b/130b from Gen3, FLIT mode (242 of 256 bytes) from Gen6
PCIE_GT_S = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}
PCIE_EFFICIENCY = {1: 0.8, 2: 0.8, 3: 128 / 130, 4: 128 / 130, 5: 128 / 130, 6: 242 / 256}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Source(_Model):
    title: str
    url: str


class Pcie(_Model):
    gen: int
    width: int


class Peaks(_Model):
    bf16: float | None
    fp16: float | None
    tf32: float | None
    fp32: float | None
    fp64: float | None
    fp8: float | None
    fp4: float | None = None  # Blackwell; not measured by the health step


class Achievable(_Model):
    """Fractions of a datasheet figure a healthy GPU reaches with the health step."""

    memory_copy: float
    memory_read: float
    bf16: float
    bf16_sustained: float
    fp16: float
    tf32: float
    fp32: float
    fp64: float
    fp8: float
    host_copy: float


class Variant(_Model):
    name: str  # e.g. "A100 40 GB PCIe"
    family: str
    board: str | None  # sxm | pcie | nvl | superchip
    label: str  # as orders are matched: "A100 PCIe 40GB" (gpunames)
    memory_gb: float
    memory_gbps: float
    dense_tflops: Peaks
    tdp_w: float
    pcie: Pcie
    nvlink_gbps: float | None
    nvlink_gen: int | None
    nvlink_links: int | None
    fp8: bool
    form_factor: str
    cc: tuple[int, int]
    sources: tuple[Source, ...]
    achievable: Achievable
    # the fractions were measured on this variant; else they are `measured_on`'s, a stand-in
    achievable_measured: bool
    measured_on: str
    mfu_tflops: float | None  # the row's `tflops`, for reference

    def peak(self, precision: str) -> float | None:
        return getattr(self.dense_tflops, precision)

    @property
    def host_gbps(self) -> float:
        """What the host link carries per direction at its generation and width."""
        return pcie_gbps(self.pcie.gen, self.pcie.width)

    @property
    def fraction_note(self) -> str:
        """How the achievable fraction came about, for a finding: empty where measured on
        this variant."""
        if self.achievable_measured:
            return ""
        return (f"; no achievable fraction measured on {self.name} yet: judged against its "
                f"datasheet with the {self.measured_on}'s")


class _Row(_Model):
    name: str
    family: str
    label: str | None = None
    aliases: list[str] | None = None
    memory_gb: float | None = None
    memory_also: list[float] | None = None
    board: str | None = Field(default=None, pattern="^(sxm|pcie|nvl|superchip)$")
    smi_names: list[str] | None = None
    pci_ids: list[str] | None = None
    sms: int | None = None
    tflops: float | None = None
    note: str | None = None
    mfu_only: bool = False
    achievable_measured: bool = False
    memory_gbps: float | None = None
    dense_tflops: Peaks | None = None
    tdp_w: float | None = None
    pcie: Pcie | None = None
    nvlink_gbps: float | None = None
    nvlink_gen: int | None = None
    nvlink_links: int | None = None
    fp8: bool | None = None
    form_factor: str | None = Field(default=None, pattern="^(sxm|pcie)$")
    cc: str | None = Field(default=None, pattern=r"^\d+\.\d+$")
    sources: list[Source] | None = None
    achievable: dict[str, float] | None = None


DATASHEET_KEYS = ("memory_gb", "memory_gbps", "dense_tflops", "tdp_w", "pcie", "fp8",
                  "form_factor", "cc", "sources")


class Datasheet(_Model):
    variants: tuple[Variant, ...]
    achievable: Achievable
    measured_on: str

    def for_name(self, gpu_name: str | None, order: bool = False) -> Variant | None:
        """The variant a name places on, where it places on exactly one with a datasheet
        (gpunames' rules, as MFU and the preflight checks read them); None for a name that
        leaves several open (a bare "A100", an order "H200": SXM or NVL) or none. An order is
        placed as orders are (a bare family leaves the form factor open)."""
        if not gpu_name:
            return None
        return self.for_cards(gpunames.place(gpu_name, strict=order).cards)

    def for_cards(self, cards: tuple[gpunames.Card, ...]) -> Variant | None:
        if len(cards) != 1:
            return None
        return self.variant(cards[0].name)

    def variant(self, name: str) -> Variant | None:
        return next((v for v in self.variants if v.name == name), None)


def pcie_gbps(gen: int, width: int) -> float:
    """GB/s per direction a link of this generation and width carries (before protocol
    overhead: Gen5 x16 is 63.0)."""
    return PCIE_GT_S[gen] * width * PCIE_EFFICIENCY[gen] / 8


def parse_datasheet(doc: dict[str, Any]) -> Datasheet:
    shipped = Achievable.model_validate(doc["achievable"])
    measured_on = str(doc.get("measured_on") or "")
    labels = {c.name: c.label for c in gpunames.parse_catalog(doc).cards}
    variants: list[Variant] = []
    for raw in list(doc.get("variants", [])):
        row = _Row.model_validate(raw)
        if row.mfu_only:
            if not row.sources:
                raise ValueError(f"gpu_peaks.yaml: variant {row.name!r} lacks sources")
            continue
        missing = [k for k in DATASHEET_KEYS if getattr(row, k) is None]
        if missing:
            raise ValueError(f"gpu_peaks.yaml: variant {row.name!r} lacks {', '.join(missing)}")
        frac = shipped.model_copy(update=row.achievable or {})
        major, minor = (int(x) for x in str(row.cc).split("."))
        variants.append(Variant(
            name=row.name, family=row.family, board=row.board, label=labels[row.name],
            memory_gb=float(row.memory_gb or 0),
            memory_gbps=float(row.memory_gbps or 0), dense_tflops=row.dense_tflops or Peaks(
                bf16=None, fp16=None, tf32=None, fp32=None, fp64=None, fp8=None),
            tdp_w=float(row.tdp_w or 0), pcie=row.pcie or Pcie(gen=0, width=0),
            nvlink_gbps=row.nvlink_gbps, nvlink_gen=row.nvlink_gen,
            nvlink_links=row.nvlink_links, fp8=bool(row.fp8), form_factor=str(row.form_factor),
            cc=(major, minor), sources=tuple(row.sources or ()), achievable=frac,
            achievable_measured=row.achievable_measured or row.name == measured_on,
            measured_on=measured_on, mfu_tflops=row.tflops))
    return Datasheet(variants=tuple(variants), achievable=shipped, measured_on=measured_on)


@functools.lru_cache(maxsize=1)
def shipped() -> Datasheet:
    return parse_datasheet(gpunames.catalog_doc())
