"""Every problem of an inventory, located at the line that causes it.

Two kinds, found in one pass and reported together, because a typo found
after an hour of provisioning is an hour lost:

- structural problems: pydantic's ValidationError turned into lines. Its
  locations are paths in the models, with the tags it inserts for union
  members; ``_data_loc`` maps them back to paths in the data, so a value is
  reported where it is written. A key set in a provider's ``access`` is
  reported there, once, not once per node. Unknown keys say "did you mean".
- problems between values, which no single field can see: duplicate node
  names, a node named like a jump host, a provider whose ``name`` is not its
  key, an ordered ``gpu_model`` no variant of the GPU catalog answers to
  (``gpunames``: the known variants listed), unknown jump hosts ("did you
  mean"), proxy_jump loops, nodes without a host, and the files the
  inventory names.

Files named by the inventory are checked only for providers that use ssh, so
the local-executor demo runs on a machine without ``~/.ssh``:

- ``identity_file`` and ``settings.ssh_config`` must be existing regular files of bounded
  size (``files.MAX_KEY_BYTES``, ``MAX_SSH_FILE_BYTES``): a FIFO would block the connection
  and a device such as /dev/zero never ends, so both are refused here, unopened;
- ``settings.known_hosts`` may be missing, because ``--accept-new-host-keys``
  creates it (without that option every node reports its unknown key and
  the remedy); when it exists it is held to the same kind and size; else
  its directory must exist, so a typo in the path is not silently created.
  OpenSSH's own ``~/.ssh/known_hosts`` is exempt: like ssh, gpuvet creates
  ``~/.ssh`` on a fresh machine.

The checks between values read the data as written, not the models: they run
even when pydantic refused the document, so both kinds come out at once.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from orchestrator import gpunames
from orchestrator.files import MAX_KEY_BYTES, MAX_SSH_FILE_BYTES, user_file_problem
from orchestrator.inventory.model import (
    DEFAULT_KNOWN_HOSTS,
    NAME_PATTERN,
    InventoryFile,
    JumpHost,
    NodeSpec,
    Provider,
    path_like,
)
from orchestrator.inventory.reader import Loc, Problem, Source

# --- problems pydantic finds ---------------------------------------------------------------

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
        if isinstance(part, int):  # an item of a list of models
            i += 1
            continue
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return None
        ann = field.annotation
        candidates = [ann, *getattr(ann, "__args__", ())]
        candidates += [a for c in candidates for a in getattr(c, "__args__", ())]
        nxt = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)),
                   None)
        if nxt is None:
            return None
        model = nxt
        i += 1
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _data_loc(source: Source, loc: Loc) -> tuple[Loc, bool]:
    """pydantic's loc as a path in the data, without the union tags it inserts.

    Returns the path and whether a tag was dropped (the error is about one member of a union).
    """
    out: list[Any] = []
    node = source.data
    tagged = False
    for i, part in enumerate(loc):
        in_map = isinstance(node, dict) and part in node and not isinstance(part, bool)
        if in_map or (isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)):
            out.append(part)
            node = node[part]
        elif i == len(loc) - 1 and isinstance(part, str) and (
                (model := _model_at(tuple(out))) is not None and part in model.model_fields):
            out.append(part)  # a missing key, or one filled in before validation
        else:
            tagged = True
    return tuple(out), tagged


def _got(value: Any) -> str:
    """What the value was, in YAML's words rather than Python's: "got a boolean (true)"."""
    if isinstance(value, bool):
        return f"got a boolean ({str(value).lower()})"
    if value is None:
        return "got nothing (null)"
    if isinstance(value, dict):
        return "got a mapping"
    if isinstance(value, list):
        return "got a list"
    if isinstance(value, (int, float)):
        return f"got {value!r}"
    if isinstance(value, str):
        return f"got {value[:80]!r}"
    return f"got a {type(value).__name__} ({str(value)[:80]!r}; quote it to make it text)"


def validation_problems(exc: ValidationError, source: Source) -> list[Problem]:
    """pydantic's errors as problems at the line of the value each is about, in its order.

    Its messages are kept, with what was found added to type and range errors;
    an unknown key gets "did you mean". Of a union, the members whose type does
    not fit keep quiet when another member explains the value.
    """
    items: list[tuple[Loc, bool, str, Any]] = []
    for err in exc.errors(include_url=False):
        loc, tagged = _data_loc(source, tuple(err["loc"]))
        kind = err["type"]
        msg = err["msg"].removeprefix("Value error, ")
        if kind == "extra_forbidden":
            model = _model_at(loc[:-1])
            msg = f"unknown key {loc[-1]!r}"
            if model is not None:
                known = list(model.model_fields)
                close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
                msg += f", did you mean {close[0]!r}?" if close else f" (allowed: {', '.join(known)})"
        elif kind == "missing":
            msg = "required key is missing"
        elif kind == "string_pattern_mismatch" and err.get("ctx", {}).get("pattern") == NAME_PATTERN:
            msg = (f"{err.get('input')!r} is not a name: letters, digits, '_', '.', '-', starting "
                   "with a letter or digit, at most 63 characters")
        elif kind.endswith("_type") or kind in ("literal_error", "finite_number") or \
                kind.startswith(("greater_than", "less_than", "string_pattern")):
            msg = f"{msg}; {_got(err.get('input'))}"
        items.append((loc, tagged and kind.endswith("_type"), msg, err.get("input")))
    # A union member whose type does not fit says nothing when another member explains
    # the value; when no member fits, one line says what would.
    out: list[Problem] = []
    members: dict[Loc, list[str]] = {}
    for loc, member_type, msg, value in items:
        if not member_type:
            out.append(Problem(source.line_of(loc), loc, msg))
        elif not any(not other[1] and other[0][:len(loc)] == loc for other in items):
            base = msg.split("; got ")[0]
            if loc not in members:
                members[loc] = []
                out.append(Problem(source.line_of(loc), loc, _got(value)))
            members[loc].append(base)
    return [Problem(pr.line, pr.loc, f"{' or '.join(members[pr.loc])}; {pr.msg}")
            if pr.loc in members else pr for pr in out]


# --- problems between values ---------------------------------------------------------------

# The checks between values read the data as written, which pydantic may have refused:
# a key is used only when it holds what the schema wants, else pydantic reports it.

def _str(m: Any, key: str) -> str | None:
    v = m.get(key) if isinstance(m, dict) else None
    return v if isinstance(v, str) else None


def _dict(m: Any, key: str) -> dict[Any, Any]:
    v = m.get(key) if isinstance(m, dict) else None
    return v if isinstance(v, dict) else {}


def _list(m: Any, key: str) -> list[Any]:
    v = m.get(key) if isinstance(m, dict) else None
    return v if isinstance(v, list) else []


def _valid(check: Any, value: str | None) -> bool:
    """Whether a model validator accepts the value: a path is looked up only when it is one."""
    if value is None:
        return False
    try:
        check(value)
    except ValueError:
        return False
    return True


def _file_problem(value: str, max_bytes: int) -> str | None:
    """A file ssh reads: a regular file of bounded size (a FIFO would block the connection,
    /dev/zero be read until memory runs out), looked at without opening it."""
    why = user_file_problem(Path(os.path.expanduser(value)), max_bytes)
    return None if why is None else f"{value} {why}"


def _known_hosts_problem(value: str) -> str | None:
    p = Path(os.path.expanduser(value))
    if p.is_dir():
        return f"{value} is a directory; name the known_hosts file"
    if os.path.lexists(p) and (why := user_file_problem(p, MAX_SSH_FILE_BYTES)):
        return f"{value} {why}"
    if p.exists() or p == Path(os.path.expanduser(DEFAULT_KNOWN_HOSTS)):
        return None
    if not p.parent.is_dir():
        return (f"neither {value} nor its directory {p.parent} exists; --accept-new-host-keys "
                "records new host keys there: create the directory or fix the path")
    return None


def semantic_problems(source: Source) -> Iterator[Problem]:
    """Problems no single field can show, in the order of the file's sections.

    Names first, because the later checks look nodes up by name; then each
    provider's access and nodes, proxy_jump loops, and the files that ssh
    providers need.
    """
    data = source.data
    providers, jump_hosts, settings = (_dict(data, k) for k in ("providers", "jump_hosts",
                                                                 "settings"))
    ssh_providers = [k for k, v in providers.items()
                     if isinstance(v, dict) and v.get("executor", "ssh") == "ssh"]
    # executor slurm providers whose client commands run on a login node over SSH
    slurm_logins = {k: _dict(_dict(v, "slurm"), "login") for k, v in providers.items()
                    if isinstance(v, dict) and _dict(_dict(v, "slurm"), "login")}

    specs: list[tuple[Any, int, dict[Any, Any]]] = []  # every node as written: provider, index
    nodes: dict[str, tuple[Any, int, dict[Any, Any]]] = {}  # each name's first node
    for pkey, prov in providers.items():
        if not isinstance(prov, dict):
            continue
        explicit = prov.get("name", pkey)
        if isinstance(explicit, str) and explicit != pkey:
            msg = (f"name {explicit!r} differs from its key {pkey!r}: a provider is known by its "
                   f"key; drop `name:` or write {pkey!r}")
            twin = next((k for k, v in providers.items() if k != pkey and (
                k == explicit or (isinstance(v, dict) and v.get("name") == explicit))), None)
            if twin is not None:
                msg += (f"; {explicit!r} is also the name of provider {twin!r} "
                        f"(line {source.line_of(('providers', twin))})")
            yield Problem(source.line_of(("providers", pkey, "name")), ("providers", pkey, "name"),
                          msg)
        for i, spec in enumerate(_list(prov, "nodes")):
            if not isinstance(spec, dict):
                continue
            specs.append((pkey, i, spec))
            name = _str(spec, "name")
            if name is None:
                continue
            loc: Loc = ("providers", pkey, "nodes", i, "name")
            if name in nodes:
                first = nodes[name]
                yield Problem(source.line_of(loc), loc, f"duplicate node name {name!r} (first at "
                              f"line {source.line_of(('providers', first[0], 'nodes', first[1]))})")
            elif name in jump_hosts:
                yield Problem(source.line_of(loc), loc, f"node {name!r} has the name of a jump host "
                              f"(line {source.line_of(('jump_hosts', name))}): proxy_jump would be "
                              "ambiguous; rename one")
            else:
                nodes[name] = (pkey, i, spec)

    for pkey, prov in providers.items():
        if not isinstance(prov, dict):
            continue
        model = _str(_dict(prov, "expect"), "gpu_model")
        if model is not None and (why := gpunames.order_problem(model)):
            loc = ("providers", pkey, "expect", "gpu_model")
            yield Problem(source.line_of(loc), loc, why)
        access = _dict(prov, "access")
        executor = prov.get("executor", "ssh")
        if pkey in ssh_providers:
            yield from _ssh_values(source, ("providers", pkey, "access"), access, nodes,
                                   jump_hosts)
        if pkey in slurm_logins:
            yield from _ssh_values(source, ("providers", pkey, "slurm", "login"),
                                   slurm_logins[pkey], nodes, jump_hosts)
        for nkey, i, spec in specs:
            if nkey != pkey:
                continue
            loc = ("providers", pkey, "nodes", i)
            name = _str(spec, "name") or f"#{i + 1}"
            if pkey in ssh_providers:
                yield from _ssh_values(source, loc, spec, nodes, jump_hosts)
                if not any(_str(spec, k) or _str(access, k) for k in ("host", "ssh_alias")):
                    yield Problem(source.line_of(loc), loc,
                                  f"node {name!r} has neither host nor ssh_alias")
            elif executor == "ray" and not (_str(spec, "host") or _str(access, "host")):
                yield Problem(source.line_of(loc), loc,
                              f"ray node {name!r} needs host (its Ray node IP)")
    yield from _jump_cycles(source, providers, nodes, jump_hosts)

    if not ssh_providers and not slurm_logins:
        return
    for jname, jump in jump_hosts.items():
        ident = _str(jump, "identity_file")
        if _valid(path_like, ident) and (why := _file_problem(str(ident), MAX_KEY_BYTES)):
            loc = ("jump_hosts", jname, "identity_file")
            yield Problem(source.line_of(loc), loc, why)
    ssh_config = _str(settings, "ssh_config")
    if _valid(path_like, ssh_config) and (
            why := _file_problem(str(ssh_config), MAX_SSH_FILE_BYTES)):
        yield Problem(source.line_of(("settings", "ssh_config")), ("settings", "ssh_config"), why)
    known = _str(settings, "known_hosts") if "known_hosts" in settings else DEFAULT_KNOWN_HOSTS
    if _valid(path_like, known) and (why := _known_hosts_problem(str(known))):
        yield Problem(source.line_of(("settings", "known_hosts")), ("settings", "known_hosts"), why)


def _ssh_values(source: Source, loc: Loc, m: dict[Any, Any], nodes: dict[str, Any],
                jump_hosts: dict[Any, Any]) -> Iterator[Problem]:
    """Checks of values an ssh provider's access block or node sets, reported where set."""
    ident = _str(m, "identity_file")
    if _valid(path_like, ident) and (why := _file_problem(str(ident), MAX_KEY_BYTES)):
        yield Problem(source.line_of((*loc, "identity_file")), (*loc, "identity_file"), why)
    jump = _str(m, "proxy_jump")
    if jump and jump not in jump_hosts and jump not in nodes:
        known = sorted({str(k) for k in jump_hosts} | set(nodes))
        close = difflib.get_close_matches(jump, known, n=1)
        hint = f", did you mean {close[0]!r}?" if close else (
            f" (define it under jump_hosts; known: {', '.join(known) or 'none'})")
        yield Problem(source.line_of((*loc, "proxy_jump")), (*loc, "proxy_jump"),
                      f"unknown jump host {jump!r}{hint}")


def _jump_cycles(source: Source, providers: dict[Any, Any], nodes: dict[str, Any],
                 jump_hosts: dict[Any, Any]) -> Iterator[Problem]:
    """proxy_jump loops of any length, reported once, where the first hop of the loop is set."""
    hop: dict[str, tuple[str, Loc]] = {}  # node -> (next node, where that is set)
    for name, (pkey, i, spec) in nodes.items():
        access = _dict(providers[pkey], "access")
        own = _str(spec, "proxy_jump")
        target = own or _str(access, "proxy_jump")
        if target is None or target in jump_hosts or target not in nodes:
            continue  # a jump host ends the chain; unknown names are reported elsewhere
        where = (("providers", pkey, "nodes", i, "proxy_jump") if own
                 else ("providers", pkey, "access", "proxy_jump"))
        hop[name] = (target, where)
    reported: set[frozenset[str]] = set()
    order = {name: k for k, name in enumerate(nodes)}
    for start in hop:
        path: list[str] = []
        cur: str | None = start
        while cur is not None and cur in hop and cur not in path:
            path.append(cur)
            cur = hop[cur][0]
        if cur is None or cur not in path:
            continue
        cycle = path[path.index(cur):]
        first = min(range(len(cycle)), key=lambda k: order[cycle[k]])  # as written, top down
        cycle = cycle[first:] + cycle[:first]
        if frozenset(cycle) in reported:
            continue
        reported.add(frozenset(cycle))
        where = hop[cycle[0]][1]
        if len(cycle) == 1:
            msg = f"node {cycle[0]!r} jumps through itself"
        else:
            msg = (f"proxy_jump loop {' -> '.join([*cycle, cycle[0]])}: none of these nodes can "
                   "be reached")
        yield Problem(source.line_of(where), where, msg)
