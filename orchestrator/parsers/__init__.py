"""Parsers: pure functions from raw command output to typed facts.

Each parser module registers its kinds here with `register(...)(parse_x)` after
the function (mutmut leaves decorated functions unmutated), with the
command whose output it reads (`gpuvet parse --list` shows both). A parser
takes the text (and optionally the name of the file it came from, for
messages) and returns a pydantic model. Unknown formats raise ParseError naming the
line; a parser never returns a guessed fact.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel

from orchestrator.errors import UsageError, did_you_mean, shown

ParserFunc = Callable[..., BaseModel]


@dataclass(frozen=True)
class ParserSpec:
    kind: str
    func: ParserFunc
    description: str
    example: str  # a command line whose output this kind reads


_REGISTRY: dict[str, ParserSpec] = {}

# Modules that register parsers; imported lazily so `import orchestrator.parsers`
# stays cheap and a broken parser module names itself.
_MODULES = (
    "orchestrator.parsers.nvidia_smi",
    "orchestrator.parsers.nvidia_smi_xml",
    "orchestrator.parsers.nvidia_smi_table",
    "orchestrator.parsers.nvidia_smi_q",
    "orchestrator.parsers.topology",
    "orchestrator.parsers.system",
    "orchestrator.parsers.nccl_tests",
    "orchestrator.parsers.nccl_debug",
    "orchestrator.parsers.ibstat",
    "orchestrator.parsers.rdma",
    "orchestrator.parsers.dmon",
    "orchestrator.parsers.recipe",
    "orchestrator.parsers.kernel_log",
    "orchestrator.parsers.dcgmi",
    "orchestrator.parsers.nvidia_smi_health",
    "orchestrator.parsers.lspci",
    "orchestrator.parsers.perftest",
    "orchestrator.parsers.fabric",
    "orchestrator.parsers.nvbandwidth",
    "orchestrator.parsers.p2p_latency",
    "orchestrator.parsers.slurm",
)
_loaded = False


F = TypeVar("F", bound=ParserFunc)


def register(kind: str, description: str, *, example: str) -> Callable[[F], F]:
    """Register a parser by kind for `gpuvet parse`; the function keeps its own type, so
    the library calls it directly and typed."""

    def deco(func: F) -> F:
        if kind in _REGISTRY and _REGISTRY[kind].func is not func:
            raise RuntimeError(f"parser kind {kind!r} registered twice")
        _REGISTRY[kind] = ParserSpec(kind, func, description, example)
        return func

    return deco


def _load() -> None:
    global _loaded
    if _loaded:
        return
    for mod in _MODULES:
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as exc:  # a module not written yet is not an error
            if exc.name != mod:
                raise
    _loaded = True


def kinds() -> list[ParserSpec]:
    _load()
    return [_REGISTRY[k] for k in sorted(_REGISTRY)]


def get(kind: str) -> ParserSpec:
    _load()
    try:
        return _REGISTRY[kind]
    except KeyError:
        raise UsageError(
            f"unknown parser kind {shown(kind)!r}{did_you_mean(kind, _REGISTRY)}",
            hint=f"`gpuvet parse --list` names all {len(_REGISTRY)} kinds, each with a "
                 "command whose output it reads",
        ) from None


def parse(kind: str, text: str, source: str | None = None) -> BaseModel:
    return get(kind).func(text, source=source)


def to_jsonable(facts: BaseModel) -> Any:
    return facts.model_dump(mode="json")
