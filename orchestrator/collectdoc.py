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


class Mount(_Open):
    source: str | None = None
    mount_point: str | None = None
    fstype: str | None = None
    options: str | None = None


class PathInfo(_Open):
    path: str | None = None
    realpath: str | None = None
    exists: bool = False
    is_dir: bool = False
    writable: bool = False
    stat_path: str | None = None
    free_bytes: int | None = None
    total_bytes: int | None = None
    mount: Mount | None = None
    error: str | None = None


class NcclHeader(_Open):
    path: str | None = None
    exists: bool = False
    version: str | None = None


class NcclPip(_Open):
    root: str | None = None
    lib_dir: str | None = None
    libs: list[str] = Field(default_factory=list)
    header: str | None = None
    header_version: str | None = None


class NcclLibDir(_Open):
    dir: str | None = None
    exists: bool = False
    libs: list[str] = Field(default_factory=list)


class NcclInstall(_Open):
    nccl_home: str | None = None
    pip: list[NcclPip] = Field(default_factory=list)
    headers: list[NcclHeader] = Field(default_factory=list)
    lib_dirs: list[NcclLibDir] = Field(default_factory=list)


class MpiInstall(_Open):
    mpicc: str | None = None
    mpirun: str | None = None
    flavor: str | None = None
    mpi_h: list[str] = Field(default_factory=list)


class PythonInfo(_Open):
    executable: str | None = None
    version: str | None = None


class CollectDocument(_Open):
    tool: str
    commands: dict[str, CommandRecord]
    schema_: int | None = Field(default=None, alias="schema")
    node: str | None = None
    hostname: str | None = None
    boot_time: str | None = None  # /proc/stat btime, UTC: where a rental's billing begins
    finished_at: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    python: PythonInfo = Field(default_factory=PythonInfo)
    paths: dict[str, PathInfo | None] = Field(default_factory=dict)
    nccl: NcclInstall = Field(default_factory=NcclInstall)
    mpi: MpiInstall = Field(default_factory=MpiInstall)
    tools: dict[str, str | None] = Field(default_factory=dict)
    # `payload.fabric.snapshot`: read by parsers/fabric.py (absent from older payloads)
    fabric: dict[str, Any] | None = None


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
