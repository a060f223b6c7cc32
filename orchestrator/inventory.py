"""The inventory: providers, their nodes, what was ordered and what it costs.

A YAML file becomes pydantic models with unknown keys forbidden. Every
problem is reported with file, line and key path, all at once, before
anything connects: a typo found after an hour of provisioning is an hour lost.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MarkedYAMLError

from orchestrator.bands import Band
from orchestrator.errors import InventoryError

ExecutorName = Literal["ssh", "local", "ray"]
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Access(_Model):
    """How to reach a node; set per provider (defaults) and per node (overrides)."""

    host: str | None = None
    port: int | None = Field(default=None, ge=1, le=65535)
    user: str | None = None
    identity_file: str | None = None
    ssh_alias: str | None = None
    proxy_jump: str | None = None
    python: str | None = None
    work_dir: str | None = None
    ckpt_dir: str | None = None
    env: dict[str, str] | None = None
    connect_timeout_s: float | None = Field(default=None, gt=0)


class Fabric(_Model):
    type: Literal["ib", "roce", "efa", "ethernet", "none"] = "none"
    nics: int | None = Field(default=None, ge=0)
    rate_gbps: float | None = Field(default=None, gt=0)


class PcieExpectation(_Model):
    min_gen: int | None = Field(default=None, ge=1, le=6)
    min_width: int | None = Field(default=None, ge=1, le=32)


class Expectations(_Model):
    """What was ordered. Every field is optional: unset means 'not checked'."""

    gpu_model: str | None = None
    gpus_per_node: int | None = Field(default=None, ge=1)
    memory_per_gpu_gb: float | None = Field(default=None, gt=0)
    form_factor: Literal["sxm", "pcie"] | None = None
    interconnect: Literal["nvswitch", "nvlink", "pcie"] | None = None
    mig_allowed: bool = False
    fabric: Fabric = Fabric()
    pcie: PcieExpectation = PcieExpectation()
    # overrides the shipped reference bands: one band or a list, each for one message size
    nccl_busbw: Band | list[Band] | None = None


class Pricing(_Model):
    gpu_hour: float = Field(ge=0)
    currency: str = Field(default="USD", pattern=r"^[A-Z]{3}$")
    billing_granularity: Literal["second", "minute", "hour", "day", "month"] = "hour"
    node_month: float | None = Field(default=None, ge=0)
    storage_gb_month: float | None = Field(default=None, ge=0)
    egress_gb: float | None = Field(default=None, ge=0)


class RayOptions(_Model):
    address: str = "auto"


class NodeSpec(Access):
    name: str = Field(pattern=NAME_PATTERN)


class Provider(_Model):
    name: str = Field(pattern=NAME_PATTERN)
    executor: ExecutorName = "ssh"
    access: Access = Access()
    expect: Expectations = Expectations()
    pricing: Pricing | None = None
    ray: RayOptions | None = None
    nodes: list[NodeSpec] = Field(min_length=1)


class JumpHost(_Model):
    host: str
    port: int = Field(default=22, ge=1, le=65535)
    user: str | None = None
    identity_file: str | None = None


class Settings(_Model):
    known_hosts: str = "~/.ssh/known_hosts"
    ssh_config: str | None = None
    concurrency: int = Field(default=32, ge=1, le=1024)


class InventoryFile(_Model):
    """The document as written: providers keyed by name."""

    version: Literal[1] = 1
    settings: Settings = Settings()
    jump_hosts: dict[str, JumpHost] = {}
    providers: dict[str, Provider]

    @model_validator(mode="before")
    @classmethod
    def _names_from_keys(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("providers"), dict):
            provs = {}
            for key, prov in data["providers"].items():
                if isinstance(prov, dict) and "name" not in prov:
                    prov = {"name": key, **prov}
                provs[key] = prov
            data = {**data, "providers": provs}
        return data

    @field_validator("providers")
    @classmethod
    def _not_empty(cls, v: dict[str, Provider]) -> dict[str, Provider]:
        if not v:
            raise ValueError("at least one provider is needed")
        return v


class Node(_Model):
    """A node with its provider's access defaults merged in: what executors use."""

    name: str
    provider: str
    executor: ExecutorName
    host: str | None
    port: int
    user: str | None
    identity_file: str | None
    ssh_alias: str | None
    proxy_jump: str | None
    python: str
    work_dir: str
    ckpt_dir: str | None
    env: dict[str, str]
    connect_timeout_s: float

    @property
    def target(self) -> str:
        """What to show a person: user@host:port or the alias."""
        if self.ssh_alias:
            return self.ssh_alias
        host = self.host or "localhost"
        prefix = f"{self.user}@" if self.user else ""
        suffix = f":{self.port}" if self.port != 22 else ""
        return f"{prefix}{host}{suffix}"


class Inventory:
    """The parsed inventory plus the merged view of every node."""

    def __init__(self, doc: InventoryFile, path: Path) -> None:
        self.doc = doc
        self.path = path
        self.nodes: list[Node] = [
            _merge(prov, spec) for prov in doc.providers.values() for spec in prov.nodes
        ]

    @property
    def providers(self) -> dict[str, Provider]:
        return self.doc.providers

    @property
    def settings(self) -> Settings:
        return self.doc.settings

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        known = ", ".join(n.name for n in self.nodes)
        raise InventoryError(str(self.path), [f"no node named {name!r} (nodes: {known})"])

    def provider_of(self, node: Node) -> Provider:
        return self.doc.providers[node.provider]

    def select(self, names: list[str] | None = None, provider: str | None = None) -> list[Node]:
        nodes = self.nodes
        if provider is not None:
            if provider not in self.doc.providers:
                known = ", ".join(self.doc.providers)
                raise InventoryError(str(self.path), [f"no provider named {provider!r} "
                                                      f"(providers: {known})"])
            nodes = [n for n in nodes if n.provider == provider]
        if names:
            nodes = [self.node(n) for n in names]
        return nodes


def _merge(prov: Provider, spec: NodeSpec) -> Node:
    base = prov.access.model_dump()
    over = {k: v for k, v in spec.model_dump().items() if v is not None and k != "name"}
    m = {**base, **over}
    env = {**(prov.access.env or {}), **(spec.env or {})}
    work_dir = m.get("work_dir") or ("/tmp/gpuvet" if prov.executor != "local"
                                     else f"/tmp/gpuvet-local/{spec.name}")
    return Node(
        name=spec.name,
        provider=prov.name,
        executor=prov.executor,
        host=m.get("host"),
        port=m.get("port") or 22,
        user=m.get("user"),
        identity_file=m.get("identity_file"),
        ssh_alias=m.get("ssh_alias"),
        proxy_jump=m.get("proxy_jump"),
        python=m.get("python") or "python3",
        work_dir=work_dir,
        ckpt_dir=m.get("ckpt_dir"),
        env=env,
        connect_timeout_s=m.get("connect_timeout_s") or 10.0,
    )


# --- loading with line numbers ------------------------------------------------

Loc = tuple[Any, ...]


def _plain(node: Any, loc: Loc, lines: dict[Loc, int]) -> Any:
    """ruamel's round-trip tree -> plain python, remembering each key's line."""
    if isinstance(node, CommentedMap):
        out = {}
        for key in node:
            kloc = (*loc, key)
            try:
                lines[kloc] = node.lc.key(key)[0] + 1
            except (KeyError, TypeError):
                pass
            out[key] = _plain(node[key], kloc, lines)
        return out
    if isinstance(node, CommentedSeq):
        items = []
        for i, item in enumerate(node):
            iloc = (*loc, i)
            try:
                lines[iloc] = node.lc.item(i)[0] + 1
            except (KeyError, TypeError):
                pass
            items.append(_plain(item, iloc, lines))
        return items
    return node


def _line_for(loc: Loc, lines: dict[Loc, int]) -> int | None:
    for end in range(len(loc), 0, -1):
        if loc[:end] in lines:
            return lines[loc[:end]]
    return None


def _fmt_loc(loc: Loc) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "<top>"


def _model_at(loc: Loc) -> type[BaseModel] | None:
    """The model class whose fields are valid keys at `loc` (for 'did you mean')."""
    model: Any = InventoryFile
    i = 0
    while i < len(loc):
        part = loc[i]
        if model is InventoryFile and part in ("providers", "jump_hosts"):
            model = Provider if part == "providers" else JumpHost
            i += 2  # skip the mapping key
            continue
        if model is Provider and part == "nodes":
            model = NodeSpec
            i += 2  # skip the index
            continue
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return None
        ann = field.annotation
        candidates = [ann, *getattr(ann, "__args__", ())]
        nxt = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)),
                   None)
        if nxt is None:
            return None
        model = nxt
        i += 1
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _friendly_loc(loc: Loc) -> Loc:
    """pydantic's loc, minus the union/type tags it inserts."""
    return tuple(p for p in loc if not (isinstance(p, str) and ("[" in p or p in {
        "function-after", "function-before", "function-wrap"})))


def load(path: str | os.PathLike[str]) -> Inventory:
    """Parse and validate an inventory; raise InventoryError listing every problem."""
    p = Path(path)
    if not p.is_file():
        raise InventoryError(str(p), [f"{p}: no such file"])
    text = p.read_text(encoding="utf-8")
    try:
        tree = YAML(typ="rt").load(text)
    except MarkedYAMLError as exc:
        mark = exc.problem_mark
        line = mark.line + 1 if mark is not None else "?"
        raise InventoryError(str(p), [f"{p}:{line}: YAML syntax: {exc.problem}"]) from None
    if not isinstance(tree, CommentedMap):
        raise InventoryError(str(p), [f"{p}:1: expected a mapping with a 'providers' key"])
    lines: dict[Loc, int] = {}
    data = _plain(tree, (), lines)
    try:
        doc = InventoryFile.model_validate(data)
    except ValidationError as exc:
        raise InventoryError(str(p), _describe(exc, p, lines)) from None
    inv = Inventory(doc, p)
    problems = list(_semantic_problems(inv, p, lines))
    if problems:
        raise InventoryError(str(p), problems)
    return inv


def _describe(exc: ValidationError, p: Path, lines: dict[Loc, int]) -> list[str]:
    out = []
    for err in exc.errors():
        loc = _friendly_loc(tuple(err["loc"]))
        line = _line_for(loc, lines)
        where = f"{p}:{line}" if line else str(p)
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            model = _model_at(loc[:-1])
            msg = f"unknown key {loc[-1]!r}"
            if model is not None:
                known = list(model.model_fields)
                close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
                msg += f", did you mean {close[0]!r}?" if close else (
                    f" (allowed: {', '.join(known)})")
        elif err["type"] == "missing":
            msg = "required key is missing"
        elif err["type"] == "literal_error":
            msg = f"{msg}; got {err.get('input')!r}"
        out.append(f"{where}: {_fmt_loc(loc)}: {msg}")
    return out


def _semantic_problems(inv: Inventory, p: Path, lines: dict[Loc, int]) -> Iterator[str]:
    seen: dict[str, Loc] = {}
    for pkey, prov in inv.doc.providers.items():
        for i, spec in enumerate(prov.nodes):
            loc: Loc = ("providers", pkey, "nodes", i)
            where = f"{p}:{_line_for(loc, lines) or '?'}"
            if spec.name in seen:
                first = _line_for(seen[spec.name], lines)
                yield (f"{where}: {_fmt_loc(loc)}.name: duplicate node name {spec.name!r} "
                       f"(first at line {first})")
            else:
                seen[spec.name] = loc
    node_names = set(seen)
    for node in inv.nodes:
        prov = inv.doc.providers[node.provider]
        idx = next(i for i, s in enumerate(prov.nodes) if s.name == node.name)
        loc = ("providers", node.provider, "nodes", idx)
        where = f"{p}:{_line_for(loc, lines) or '?'}"
        if node.executor == "ssh":
            if not node.host and not node.ssh_alias:
                yield f"{where}: {_fmt_loc(loc)}: node {node.name!r} has neither host nor ssh_alias"
            if node.identity_file:
                key = Path(os.path.expanduser(node.identity_file))
                if not key.is_file():
                    yield (f"{where}: {_fmt_loc(loc)}.identity_file: {node.identity_file} "
                           f"does not exist (node {node.name!r})")
            if node.proxy_jump and node.proxy_jump not in inv.doc.jump_hosts and (
                    node.proxy_jump not in node_names):
                known = sorted(set(inv.doc.jump_hosts) | node_names - {node.name})
                close = difflib.get_close_matches(node.proxy_jump, known, n=1)
                hint = f", did you mean {close[0]!r}?" if close else (
                    f" (define it under jump_hosts; known: {', '.join(known) or 'none'})")
                yield (f"{where}: {_fmt_loc(loc)}.proxy_jump: unknown jump host "
                       f"{node.proxy_jump!r}{hint}")
            if node.proxy_jump == node.name:
                yield (f"{where}: {_fmt_loc(loc)}.proxy_jump: node {node.name!r} "
                       "jumps through itself")
        if node.executor == "ray" and not node.host:
            yield f"{where}: {_fmt_loc(loc)}: ray node {node.name!r} needs host (its node IP)"
    for jname, jump in inv.doc.jump_hosts.items():
        if jump.identity_file and not Path(os.path.expanduser(jump.identity_file)).is_file():
            line = _line_for(("jump_hosts", jname, "identity_file"), lines)
            yield (f"{p}:{line or '?'}: jump_hosts.{jname}.identity_file: "
                   f"{jump.identity_file} does not exist")
