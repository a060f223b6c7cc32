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
    """Bands for one machine class: GPU model tokens, GPUs per node, node count."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    gpu: str
    gpus: int = Field(ge=1)
    nodes: int = Field(ge=1)
    note: str | None = None
    bands: tuple[Band, ...] = Field(min_length=1)


@lru_cache(maxsize=1)
def shipped() -> tuple[ShippedBands, ...]:
    text = resources.files("orchestrator").joinpath("data/references.yaml").read_text()
    return tuple(ShippedBands.model_validate(r) for r in YAML(typ="safe").load(text))


def find_shipped(gpu_name: str, gpus: int, nodes: int) -> ShippedBands | None:
    for ref in shipped():
        if model_matches(ref.gpu, gpu_name) and ref.gpus == gpus and ref.nodes == nodes:
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
