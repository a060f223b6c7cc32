"""The payload's collect document, validated where it enters the controller.

A document comes from a node's payload, or from a person (`preflight --from`),
so every field is checked for its type before any check reads it: a wrong
type anywhere is bad input with its location, never a crash in a check.
Unknown keys are kept (a newer payload may add some).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.errors import UsageError


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class CommandRecord(_Open):
    argv: list[str] = Field(default_factory=list)
    path: str | None = None
    rc: int | None = None
    stdout: str = ""
    stderr: str = ""
    duration_s: float = 0.0
    missing: bool = False
    timed_out: bool = False
    truncated: bool = False
    error: str | None = None
    fallback: bool = False


class CollectDocument(_Open):
    tool: str
    commands: dict[str, CommandRecord]
    schema_: int | None = Field(default=None, alias="schema")
    node: str | None = None
    hostname: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    python: dict[str, Any] = Field(default_factory=dict)
    paths: dict[str, Any] = Field(default_factory=dict)
    nccl: dict[str, Any] = Field(default_factory=dict)
    mpi: dict[str, Any] = Field(default_factory=dict)
    tools: dict[str, Any] = Field(default_factory=dict)


def validate(doc: Any, *, node: str) -> dict[str, Any]:
    """The document as plain, type-checked data; UsageError naming the first bad field."""
    if not isinstance(doc, dict) or doc.get("tool") != "gpuvet-payload" or "commands" not in doc:
        raise UsageError("not a gpuvet collect document (no 'tool: gpuvet-payload')", node=node,
                         hint="produce it with `python3 -m payload collect`")
    try:
        model = CollectDocument.model_validate(doc)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise UsageError(f"not a valid collect document: {loc}: {first['msg']} "
                         f"({exc.error_count()} problem(s))", node=node,
                         hint="use the unedited output of `python3 -m payload collect`") from None
    return model.model_dump(by_alias=True)
