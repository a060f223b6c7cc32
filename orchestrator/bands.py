"""Reference bands: what a number is expected to be, per message size.

One model for the shipped bands (`data/references.yaml`) and the ones an
inventory sets (`expect.nccl_busbw`). A band belongs to one message size: a
4 GiB result is never judged against a 128 MiB figure, and to one collective
(`collective`, all_reduce unless it says): an all_gather is never judged against an
all_reduce figure. A judged number
travels with its band as (value, reference, lower, upper, unit, result), as
ReFrame stores a performance variable.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)
from ruamel.yaml import YAML

from orchestrator.gpunames import model_matches
from payload.allreduce import BUSBW_FACTORS, parse_size

Result = Literal["below", "within", "above"]


class Band(BaseModel):
    """An expected value with its acceptable range, at one message size."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    value: float = Field(gt=0)
    lower: float = Field(ge=0)
    upper: float = Field(gt=0)
    unit: str = "GB/s"
    size: str = "128M"  # the message size this band is for
    note: str | None = None
    collective: str = "all_reduce"  # the nccl-tests collective (its log name) it is for
    # where the figure comes from: a public page or thread (URL) or a capture of this
    # repository; every shipped band has one (ShippedBands), an inventory's may
    source: str | None = None

    @field_validator("size")
    @classmethod
    def _size(cls, v: str) -> str:
        parse_size(v)
        return v

    @field_validator("collective")
    @classmethod
    def _collective(cls, v: str) -> str:
        if v not in BUSBW_FACTORS:
            raise ValueError(f"unknown collective {v!r} (one of {', '.join(BUSBW_FACTORS)})")
        return v

    @model_validator(mode="after")
    def _ordered(self) -> Band:
        if not self.lower <= self.value <= self.upper:
            raise ValueError(f"a band needs lower <= value <= upper, got {self.lower:g} <= "
                             f"{self.value:g} <= {self.upper:g}")
        return self

    @property
    def size_bytes(self) -> int:
        return parse_size(self.size)

    def judge(self, measured: float) -> Judged:
        result: Result = ("below" if measured < self.lower else
                          "above" if measured > self.upper else "within")
        return Judged(value=measured, reference=self.value, lower=self.lower, upper=self.upper,
                      unit=self.unit, size=self.size_bytes, result=result, note=self.note,
                      **({} if self.collective == "all_reduce" else
                         {"collective": self.collective}))


class Judged(BaseModel):
    """A measured value and the band it was judged against."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    value: float
    reference: float
    lower: float
    upper: float
    unit: str
    size: int
    result: Result
    note: str | None = None
    # set for a collective other than all_reduce (a judged all_reduce reads as it always has)
    collective: str | None = None

    @model_serializer(mode="wrap")
    def _without_default_collective(self, handler: SerializerFunctionWrapHandler
                                    ) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        if out.get("collective") is None:
            out.pop("collective", None)
        return out


class ShippedBands(BaseModel):
    """Bands for one machine class and what they assume of it: GPU model, GPUs per node,
    node count, NVLink links per GPU pair (`nvidia-smi topo -m`'s NV#) and generation, NICs
    per node and their rate, NVLink SHARP (NVLS) on or off. An assumption left unset is
    not one (a single-node band says nothing of NICs). Every band carries its source."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    gpu: str
    gpus: int = Field(ge=1)
    nodes: int = Field(ge=1)
    nvlink: int | None = Field(default=None, ge=0)  # links between each GPU pair (NV18)
    nvlink_gen: int | None = Field(default=None, ge=1)
    nics: int | None = Field(default=None, ge=1)  # RDMA NICs per node
    nic_rate_gbps: float | None = Field(default=None, gt=0)
    nvls: bool | None = None
    # every shipped figure was measured with NVLink peer access on: a run with
    # NCCL_P2P_DISABLE=1 (or NCCL_P2P_LEVEL=LOC) measures something else
    p2p: bool = True
    note: str | None = None
    bands: tuple[Band, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _sourced(self) -> ShippedBands:
        missing = [f"{b.collective} {b.size}" for b in self.bands if not b.source]
        if missing:
            raise ValueError(f"{self.gpu} x{self.gpus}, {self.nodes} node(s): a shipped band "
                             f"needs its source ({', '.join(missing)})")
        return self

    @property
    def shape(self) -> str:
        return f"{self.gpus}x {self.gpu} on {self.nodes} node{'s' if self.nodes > 1 else ''}"

    @property
    def label(self) -> str:
        """The class as a person tells it apart: shape, NICs, NVLS."""
        nics = (f", {self.nics}x {self.nic_rate_gbps:g}G NICs" if self.nics and
                self.nic_rate_gbps else f", {self.nics} NICs" if self.nics else "")
        nvls = "" if self.nvls is None else f", NVLS {'on' if self.nvls else 'off'}"
        return f"{self.shape}{nics}{nvls}"


@dataclass(frozen=True)
class Trait:
    """One fact about the machine a run measured and where it was read."""

    value: Any
    where: str


@dataclass(frozen=True)
class NodeTraits:
    """What is known of the machine a series ran on, for a band's assumptions: each
    trait None where nothing said (a log without NCCL INFO, a run without preflight)."""

    gpu: Trait | None = None
    gpus: Trait | None = None
    nodes: Trait | None = None
    nvlink: Trait | None = None
    nics: Trait | None = None
    nic_rate_gbps: Trait | None = None
    nvls: Trait | None = None
    p2p: Trait | None = None


# (assumption, what it is called in a message)
ASSUMPTIONS = (("gpus", "GPUs per node"), ("nodes", "nodes"), ("nvlink", "NVLink links per "
               "GPU pair"), ("nics", "NICs per node"), ("nic_rate_gbps", "NIC rate (Gb/s)"),
               ("nvls", "NVLS"), ("p2p", "peer access (P2P)"))


def _shown(name: str, value: Any) -> str:
    if name in ("nvls", "p2p"):
        return "on" if value else "off"
    if name == "nvlink":
        return f"NV{value}"
    return f"{value:g}" if isinstance(value, float) else str(value)


def differing(ref: ShippedBands, traits: NodeTraits) -> list[str]:
    """The assumptions of `ref` the machine is known to break, each with both values and
    where the machine's was read; empty when the band may judge it."""
    out = []
    for name, words in ASSUMPTIONS:
        want = getattr(ref, name)
        have: Trait | None = getattr(traits, name)
        if want is None or have is None or have.value is None:
            continue
        # a port's rate is lanes x lane speed as the driver prints it (4X x 53.125 for
        # HDR): a tenth apart is another rate, less is rounding
        if (abs(float(have.value) - float(want)) > 0.1 * float(want)
                if name == "nic_rate_gbps" else have.value != want):
            out.append(f"{words}: the band assumes {_shown(name, want)}, this run "
                       f"{_shown(name, have.value)} ({have.where})")
    return out


def unverified(ref: ShippedBands, traits: NodeTraits) -> list[str]:
    """The assumptions of `ref` nothing in the run could check."""
    return [words for name, words in ASSUMPTIONS
            if name != "p2p"  # on unless something says it was turned off: not a doubt
            and getattr(ref, name) is not None and (getattr(traits, name) is None
                                                    or getattr(traits, name).value is None)]


@lru_cache(maxsize=1)
def shipped() -> tuple[ShippedBands, ...]:
    text = resources.files("orchestrator").joinpath("data/references.yaml").read_text()
    return tuple(ShippedBands.model_validate(r) for r in YAML(typ="safe").load(text))


def of_gpu(gpu_name: str) -> list[ShippedBands]:
    """Every shipped machine class of this GPU model, whatever its other assumptions."""
    return [ref for ref in shipped() if model_matches(ref.gpu, gpu_name)]


def find_shipped(gpu_name: str, gpus: int, nodes: int) -> ShippedBands | None:
    """The shipped class of this GPU, count and node count for a caller that knows nothing
    else of the machine (the fleet step's pairs, a baseline's band): only a class that
    assumes no NICs and NVLS off or unsaid, which is how gpuvet runs. The nccl step checks
    every assumption instead (`of_gpu`, `differing`)."""
    for ref in of_gpu(gpu_name):
        if ref.gpus == gpus and ref.nodes == nodes and ref.nics is None \
                and ref.nic_rate_gbps is None and not ref.nvls:
            return ref
    return None


def applicable(bands: Iterable[Band], sizes: Sequence[int],
               collective: str = "all_reduce") -> list[Band]:
    """The bands of this collective whose message size the run measured, smallest first."""
    have = set(sizes)
    return sorted((b for b in bands if b.size_bytes in have and b.collective == collective),
                  key=lambda b: b.size_bytes)


def of_collective(bands: Iterable[Band], collective: str) -> list[Band]:
    return [b for b in bands if b.collective == collective]


@dataclass
class BandChoice:
    """The bands a series is judged against, and why others were not applied."""

    source: str  # shipped | inventory
    bands: list[Band]
    differing: list[str]  # per shipped class not applied: the assumptions the run breaks
    ambiguous: list[str]  # (collective, size) two fitting classes disagree on, and why
    unverified: list[str]  # assumptions of the applied classes nothing could check


def choose(gpu_name: str, traits: NodeTraits) -> BandChoice:
    """The shipped bands of this GPU that apply to a run of these traits: a class of
    another shape (GPUs per node, nodes) is said in one line, one whose assumptions the
    run breaks names them, and where two fitting classes disagree on a band neither is
    applied."""
    fits: list[ShippedBands] = []
    broken: list[str] = []
    mine = of_gpu(gpu_name)
    # GPUs per node and nodes first: a class of another shape is said in one line
    shaped = [r for r in mine if (traits.gpus is None or traits.gpus.value == r.gpus)
              and (traits.nodes is None or traits.nodes.value == r.nodes)]
    if mine and not shaped:
        have = (f"{traits.gpus.value if traits.gpus else '?'} GPU(s) per node on "
                f"{traits.nodes.value if traits.nodes else '?'} node(s)")
        broken.append(f"they are for {', '.join(dict.fromkeys(r.shape for r in mine))}; "
                         f"this run has {have} (the log)")
    for ref in shaped:
        why = differing(ref, traits)
        if why:
            broken.append(f"{ref.label}: {'; '.join(why)}")
        else:
            fits.append(ref)
    by_key: dict[tuple[str, int], list[tuple[ShippedBands, Band]]] = {}
    for ref in fits:
        for b in ref.bands:
            by_key.setdefault((b.collective, b.size_bytes), []).append((ref, b))
    chosen: list[Band] = []
    ambiguous: list[str] = []
    unchecked: list[str] = []
    for (coll, size), pairs in by_key.items():
        if len({(b.value, b.lower, b.upper) for _, b in pairs}) > 1:
            unknown = sorted({u for ref, _ in pairs for u in unverified(ref, traits)})
            ambiguous.append(f"{coll} at {size_text(size)}: " + " and ".join(
                f"{ref.label} ({b.value:g})" for ref, b in pairs)
                + f" both fit, as {', '.join(unknown) or 'nothing'} is not known for this run")
            continue
        ref, b = pairs[0]
        chosen.append(b if b.note else b.model_copy(update={"note": ref.note}))
        unchecked += [u for u in unverified(ref, traits) if u not in unchecked]
    return BandChoice("shipped", chosen, broken, ambiguous, unchecked)


def size_text(n: int) -> str:
    """A message size as people write it: 128 MiB, 4 GiB, 8 B."""
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= f and n % f == 0:
            return f"{n // f} {unit}"
    return f"{n} B"
