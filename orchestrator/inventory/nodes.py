"""The loaded inventory: every node with its provider's defaults merged in, and selection.

Executors and steps never look at a provider's ``access`` block: they get a
``Node`` whose every field is settled (a node's own key wins over its
provider's, then the built-in default), so "where does this value come from"
is answered in one place, ``_merge``.

Choosing nodes (``-n``/``-p``) is the caller's doing, not the file's: an
unknown name there is a ``UsageError`` with "did you mean", not an inventory
problem.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from orchestrator.errors import UsageError, shown
from orchestrator.inventory.model import (
    NAME_PATTERN,
    ExecutorName,
    InventoryFile,
    NodeSpec,
    Provider,
    Settings,
)

_NAME_RE = re.compile(NAME_PATTERN)


def checked_name(value: str, what: str) -> str:
    """A provider, node or run name that becomes one folder of the results: the inventory's
    name rule, so `../x`, `/tmp/x`, `a/b` and names with control characters never reach a
    path. Every place a user string becomes a path goes through here."""
    if not _NAME_RE.fullmatch(value):
        raise UsageError(f"{what} '{shown(value)}' is not a name gpuvet can file results under",
                         hint="letters, digits, '_', '.', '-' (up to 63), starting with a "
                              "letter or digit")
    return value


class Node(BaseModel):
    """A node with its provider's access defaults merged in: what executors use."""

    model_config = ConfigDict(extra="forbid", frozen=True)

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
    # the Slurm job whose allocation holds this node (executor slurm), else None
    slurm_job: str | None = None

    @property
    def target(self) -> str:
        """What to show a person: user@host:port or the alias."""
        if self.ssh_alias:
            return self.ssh_alias
        host = self.host or "localhost"
        prefix = f"{self.user}@" if self.user else ""
        suffix = f":{self.port}" if self.port != 22 else ""
        if suffix and ":" in host:  # an IPv6 address
            host = f"[{host}]"
        return f"{prefix}{host}{suffix}"


class Inventory:
    """The parsed inventory plus the merged view of every node."""

    def __init__(self, doc: InventoryFile, path: Path,
                 allocated: Mapping[str, tuple[str, Sequence[str]]] | None = None) -> None:
        self.doc = doc
        self.path = path
        # provider -> (job id, node names) of executor slurm providers, once allocated
        self.allocated: dict[str, tuple[str, list[str]]] = {
            k: (job, list(names)) for k, (job, names) in (allocated or {}).items()}
        self.nodes: list[Node] = []
        for prov in doc.providers.values():
            if prov.name in self.allocated:
                job, names = self.allocated[prov.name]
                self.nodes += [allocated_node(prov, job, name) for name in names]
            else:
                self.nodes += [_merge(prov, spec) for spec in prov.nodes]
        seen: dict[str, str] = {}
        for n in self.nodes:
            if n.name in seen:
                raise UsageError(f"node {n.name!r} of provider {n.provider} (its Slurm "
                                 f"allocation) has the name of a node of {seen[n.name]}",
                                 hint="rename the inventory's node, or run the providers "
                                      "apart with -p")
            seen[n.name] = n.provider

    def with_allocations(self, allocated: Mapping[str, tuple[str, Sequence[str]]]
                         ) -> Inventory:
        """This inventory with the nodes of the executor slurm providers' allocations
        (provider -> job id and node names, as `scontrol show hostnames` gives them)."""
        return Inventory(self.doc, self.path, {**self.allocated, **allocated})

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
        raise UsageError(_no_such("node", [name], [n.name for n in self.nodes], self.path),
                         hint=f"`gpuvet inventory check {self.path}` lists the nodes")

    def provider_of(self, node: Node) -> Provider:
        return self.doc.providers[node.provider]

    def select(self, names: Sequence[str] | None = None,
               providers: str | Sequence[str] | None = None, *,
               provider: str | None = None) -> list[Node]:
        """The nodes named (-n) that belong to one of the providers (-p): both optional.

        With both, the intersection; an empty intersection is an error rather than a
        run on nothing. Nodes come in inventory order, each once however often named.
        Unknown names are the caller's mistake, not the inventory's: UsageError.
        `provider=` is the single-provider spelling of earlier callers.
        """
        nodes = self.nodes
        if isinstance(providers, str):
            providers = [providers]
        if provider is not None:
            providers = [*(providers or []), provider]
        if providers:
            unknown = [p for p in dict.fromkeys(providers) if p not in self.doc.providers]
            if unknown:
                raise UsageError(_no_such("provider", unknown, list(self.doc.providers), self.path),
                                 hint=f"`gpuvet inventory check {self.path}` lists the providers")
            chosen = set(providers)
            nodes = [n for n in nodes if n.provider in chosen]
        if names:
            known = [n.name for n in self.nodes]
            unknown = [n for n in dict.fromkeys(names) if n not in known]
            if unknown:
                raise UsageError(_no_such("node", unknown, known, self.path),
                                 hint=f"`gpuvet inventory check {self.path}` lists the nodes")
            wanted = set(names)
            picked = [n for n in nodes if n.name in wanted]
            if not picked:
                raise UsageError(
                    f"none of the nodes {', '.join(dict.fromkeys(names))} belongs to provider "
                    f"{', '.join(dict.fromkeys(providers or []))}; nothing to run on",
                    hint="drop -p, or name nodes of the chosen providers with -n")
            nodes = picked
        return list(nodes)


def _no_such(kind: str, unknown: list[str], known: list[str], path: Path) -> str:
    parts = []
    for name in unknown:
        close = difflib.get_close_matches(name, known, n=1)
        parts.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    listed = ", ".join(known[:20]) + (f", ... ({len(known)} in all)" if len(known) > 20 else "")
    return f"no {kind} named {', '.join(parts)} in {path} ({kind}s: {listed})"


def allocated_node(prov: Provider, job: str, name: str) -> Node:
    """A node of a Slurm allocation: its name is Slurm's (a folder of the results, so
    held to the inventory's name rule), the rest the provider's access defaults."""
    checked_name(name, f"node of Slurm job {job}")
    return _merge(prov, NodeSpec(name=name)).model_copy(
        update={"slurm_job": job, "host": name})


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
