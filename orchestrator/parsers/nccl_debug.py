"""Extract what NCCL_DEBUG=INFO says about the fabric a run really used.

A slow all_reduce on a rented node is most often a transport problem (IB not
found, GPUDirect RDMA off, a fallback to sockets), and only NCCL's own INFO
lines show it. They arrive mixed into any log, from many processes and ranks,
so this parser scans for the lines it knows. What it reads past is counted:
launcher and shell noise (the shared `_noise` reader) is listed in
`ignored_lines`, the other tools' output beside it only counted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict

from orchestrator.errors import ParseError
from orchestrator.parsers import register
from orchestrator.parsers._nccl_common import NCCL_LINE, NCCL_VERSION, Failure, harmless_warning
from orchestrator.parsers._noise import Edit, IgnoredLine, NoiseReader, stream_without_prefix

KIND = "nccl-debug"

Transport = Literal["P2P", "SHM", "NET", "COLLNET", "NVLS"]
Direction = Literal["send", "receive"]
# the words as NCCL prints them, typed: a `via` family not listed is no transport
_TRANSPORTS: dict[str, Transport] = {"P2P": "P2P", "SHM": "SHM", "NET": "NET",
                                     "COLLNET": "COLLNET", "NVLS": "NVLS"}
_DIRECTIONS: dict[str, Direction] = {"send": "send", "receive": "receive"}

_COMM = re.compile(
    r"\bcomm (?P<comm>0x[0-9a-f]+) rank (?P<rank>\d+) nRanks (?P<nranks>\d+) nNodes (?P<nnodes>\d+)"
    r" localRanks (?P<lranks>\d+) localRank (?P<lrank>\d+)")
_INIT = re.compile(r"\bcomm (?P<comm>0x[0-9a-f]+) rank (?P<rank>\d+) nranks (?P<nranks>\d+) "
                   r"(?:.*?\bcommId (?P<cid>0x[0-9a-f]+))?.*Init (?P<phase>START|COMPLETE)")
_CONN = re.compile(
    r"^(?:Channel|Ring) (?P<ch>\d+)(?:/\d+)? : (?P<src>\d+)(?:\[[0-9a-fx]+\])? -> "
    r"(?P<dst>\d+)(?:\[[0-9a-fx]+\])?(?: \[(?P<dir>send|receive)\])? via (?P<via>.+?)\s*$")
_USING = re.compile(r"^(?:NET/(?P<net>[\w ]+?)|Bootstrap) ?: Using (?P<list>.*)$")
_IFACE = re.compile(r"\[(?P<idx>\d+)\](?P<name>[^\s:\[]+)(?::(?P<addr>\S+))?")
_NETWORK = re.compile(r"^Using network (?P<name>.+?)\s*$")
# `NET/IB : GPU Direct RDMA Disabled for HCA 0 'mlx5_0'` (2.2x), `... for GPU 2[2] / HCA 0
# (distance 3 >= 2)` (2.4-2.x): why a NET connection has no GDRDMA, as NCCL says it
_GDR = re.compile(r"GPU Direct RDMA (?P<state>Enabled|Disabled) for (?P<what>.+?)\s*$")
_PLUGIN = re.compile(r"NET/Plugin|NET/OFI|Initialized NET plugin|Assigned NET plugin|IBext"
                     r"|Using network|NCCL_NET_PLUGIN|Failed to initialize NET plugin")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NcclComm(_Model):
    """One `comm ... nRanks .. nNodes ..` init line (NCCL 2.9+): one rank of a communicator."""

    host: str
    comm: str | None = None  # the rank's handle, 0x...; communicators are told apart by commId
    comm_id: str | None = None  # shared by every rank of one communicator (NCCL 2.18+)
    rank: int
    n_ranks: int
    n_nodes: int | None
    local_ranks: int | None
    local_rank: int | None


class NcclHostVersion(_Model):
    """An `NCCL version` line with the host and process that printed it."""

    host: str | None  # None for the bare `NCCL version ...` line rank 0 prints
    pid: int | None
    version: str
    cuda: str | None
    line_no: int


class NcclCommunicator(_Model):
    """The ranks of one communicator, as far as the log shows them."""

    comm_id: str | None  # None when NCCL printed no commId (before 2.18)
    n_ranks: int
    n_nodes: int | None
    ranks: list[int]
    hosts: list[str]


class NcclInterface(_Model):
    """One interface NCCL said it uses; kind is Socket, IB, a plugin, or Bootstrap."""

    host: str
    kind: str
    index: int | None
    name: str
    address: str | None  # ip<port> for sockets, port/link layer (1/IB, 1/RoCE) for IB


class NcclConnection(_Model):
    line_no: int
    host: str
    channel: int
    from_rank: int
    to_rank: int
    direction: Direction | None
    transport: Transport
    detail: str  # everything after the family: CUMEM/read, Socket/0, IB/0/GDRDMA
    net: str | None  # Socket, IB, IBext, AWS Libfabric ... for NET and COLLNET
    gdrdma: bool


class GdrNote(_Model):
    """One `GPU Direct RDMA Enabled/Disabled for ...` line: NCCL's word on GPUDirect RDMA
    between a GPU and a NIC."""

    line_no: int
    host: str
    enabled: bool
    what: str  # HCA 0 'mlx5_0', GPU 2[2] / HCA 0 (distance 3 >= 2)


class NcclDebugFacts(_Model):
    nccl_version: str | None  # the first one printed; see versions for every host
    nccl_cuda: str | None
    hosts: list[str]  # as NCCL names them in its line prefix
    comms: list[NcclComm]
    versions: list[NcclHostVersion] = []
    communicators: list[NcclCommunicator] = []
    n_ranks: int | None
    n_nodes: int | None
    interfaces: list[NcclInterface]
    networks: list[str]  # from `Using network X`: Socket, IB, IBext_v8, AWS Libfabric
    plugin_lines: list[str]
    connections: list[NcclConnection]
    transports: list[Transport]
    gdrdma: bool  # any NET connection went GPU-direct
    gdr_notes: list[GdrNote] = []  # NCCL's own GPU Direct RDMA Enabled/Disabled lines
    warnings: list[Failure]
    info_lines: int
    # WARN lines that report no fault (`Could not find a path for pattern ...`), kept apart
    # from `warnings` with why in `kind` ("harmless: ...")
    notices: list[Failure] = []
    ignored_lines: list[IgnoredLine] = []  # launcher and shell noise read past
    edits: list[Edit] = []  # `[...]` and the like: lines a person cut out
    other_lines: int = 0  # lines of other tools (nccl-tests' table, a trainer's log)

    @property
    def used(self) -> list[str]:
        """The transports connections used, `NET/IB` style: the one summary every caller shows."""
        return sorted({f"{c.transport}/{c.net}" if c.net else c.transport
                       for c in self.connections})

    @property
    def nics(self) -> list[str]:
        return sorted({f"{i.kind}:{i.name}" for i in self.interfaces if i.kind != "Bootstrap"})

    def summary(self) -> str:
        """One line: version, ranks and nodes, transports, GPUDirect, NICs."""
        return (f"NCCL {self.nccl_version or '?'}, {self.n_ranks or '?'} rank(s) on "
                f"{self.n_nodes or '?'} node(s), transports: {', '.join(self.used) or 'none seen'}"
                f"{', GPUDirect RDMA' if self.gdrdma else ''}"
                f"{'; NICs ' + ', '.join(self.nics) if self.nics else ''}")

    @property
    def versions_by_host(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for v in self.versions:
            key = v.host or "?"
            if v.version not in out.setdefault(key, []):
                out[key].append(v.version)
        return out

    @property
    def version_mismatch(self) -> bool:
        """Ranks of one job loaded different NCCL builds: a cause of hangs and wrong results."""
        return len({v.version for v in self.versions}) > 1


def _interfaces(host: str, kind: str, listing: str) -> list[NcclInterface]:
    found = []
    for m in _IFACE.finditer(listing.split(";")[0]):
        found.append(NcclInterface(host=host, kind=kind, index=int(m["idx"]), name=m["name"],
                                   address=m["addr"]))
    if not found and kind == "Bootstrap":
        name, _, addr = listing.strip().partition(":")
        found.append(NcclInterface(host=host, kind=kind, index=None, name=name,
                                   address=addr or None))
    return found


def _connection(m: re.Match[str], host: str, line_no: int) -> NcclConnection | None:
    parts = m["via"].split("/")
    family = _TRANSPORTS.get(parts[0].upper())
    if family is None:
        return None
    is_net = family in ("NET", "COLLNET")
    return NcclConnection(
        line_no=line_no, host=host, channel=int(m["ch"]), from_rank=int(m["src"]),
        to_rank=int(m["dst"]), direction=_DIRECTIONS.get(m["dir"] or ""), transport=family,
        detail="/".join(parts[1:]), net=parts[1] if is_net and len(parts) > 1 else None,
        gdrdma=is_net and "GDRDMA" in parts[2:])


def parse_nccl_debug(text: str, source: str | None = None) -> NcclDebugFacts:
    version = cuda = None
    hosts: dict[str, None] = {}
    comms: list[NcclComm] = []
    seen_comm: set[tuple[str, str, int, int]] = set()
    init_ranks: list[int] = []
    comm_ids: dict[tuple[str, str], str] = {}  # (host, handle) -> commId
    init_seen: list[tuple[str, str | None, int, int, str | None]] = []
    versions: list[NcclHostVersion] = []
    ifaces: dict[tuple[str, str, str], NcclInterface] = {}
    networks: dict[str, None] = {}
    plugins: dict[str, None] = {}
    conns: list[NcclConnection] = []
    gdr: list[GdrNote] = []
    warnings: list[Failure] = []
    notices: list[Failure] = []
    info = other = 0
    noise = NoiseReader()
    lines, _prefix = stream_without_prefix(text)
    for line_no, raw in enumerate(lines, start=1):
        m = NCCL_LINE.match(raw.rstrip("\r"))
        if not m:
            v = NCCL_VERSION.match(raw.strip())
            if v:
                versions.append(NcclHostVersion(host=None, pid=None, version=v["ver"],
                                                cuda=_cuda(v["suffix"]), line_no=line_no))
                if version is None:
                    version, cuda = v["ver"], v["suffix"]
            elif raw.strip() and not noise.skip(line_no, raw):
                other += 1
            continue
        host, level, msg = m["host"], m["level"], m["msg"].strip()
        hosts[host] = None
        if level != "INFO":
            if level == "WARN" and (why := harmless_warning(msg)):
                notices.append(Failure(line_no=line_no, kind=f"harmless: {why}",
                                       text=raw.strip()))
            elif level in ("WARN", "ABORT", "ERROR"):
                warnings.append(Failure(line_no=line_no, kind=f"nccl-{level.lower()}",
                                        text=raw.strip()))
            continue
        info += 1
        if v := NCCL_VERSION.match(msg):
            versions.append(NcclHostVersion(host=host, pid=int(m["pid"]), version=v["ver"],
                                            cuda=_cuda(v["suffix"]), line_no=line_no))
            if version is None:
                version, cuda = v["ver"], v["suffix"]
        elif c := _CONN.match(msg):
            conn = _connection(c, host, line_no)
            if conn is not None:
                conns.append(conn)
        elif c := _COMM.search(msg):
            key = (host, c["comm"], int(c["rank"]), int(c["nranks"]))
            if key not in seen_comm:
                seen_comm.add(key)
                comms.append(NcclComm(host=host, comm=c["comm"], rank=key[2], n_ranks=key[3],
                                      n_nodes=int(c["nnodes"]), local_ranks=int(c["lranks"]),
                                      local_rank=int(c["lrank"])))
        elif c := _INIT.search(msg):
            if c["cid"]:
                comm_ids[(host, c["comm"])] = c["cid"]
            if c["phase"] == "COMPLETE":
                init_ranks.append(int(c["nranks"]))
            init_seen.append((host, c["cid"], int(c["rank"]), int(c["nranks"]), c["comm"]))
        elif u := _USING.match(msg):
            kind = (u["net"] or "Bootstrap").strip()
            for iface in _interfaces(host, kind, u["list"]):
                ifaces.setdefault((host, kind, iface.name), iface)
        if g := _GDR.search(msg):
            gdr.append(GdrNote(line_no=line_no, host=host, enabled=g["state"] == "Enabled",
                               what=g["what"]))
        if n := _NETWORK.match(msg):
            networks[n["name"]] = None
        if _PLUGIN.search(msg):
            plugins[msg] = None
    if info == 0:
        raise ParseError(KIND, "no `NCCL INFO` line: was the run made with NCCL_DEBUG=INFO?",
                         source=source)
    used = {c.transport for c in conns}
    for comm in comms:
        comm.comm_id = comm_ids.get((comm.host, comm.comm or ""))
    return NcclDebugFacts(
        versions=versions, communicators=_communicators(comms, init_seen),
        nccl_version=version,
        nccl_cuda=cuda[4:] if cuda and cuda.startswith("cuda") else None,
        hosts=list(hosts), comms=comms,
        n_ranks=max([c.n_ranks for c in comms] + init_ranks, default=None),
        n_nodes=max((c.n_nodes for c in comms if c.n_nodes is not None), default=None),
        interfaces=list(ifaces.values()), networks=list(networks), plugin_lines=list(plugins),
        connections=conns, transports=[t for t in _TRANSPORTS.values() if t in used],
        gdrdma=any(c.gdrdma for c in conns), gdr_notes=gdr, warnings=warnings, notices=notices,
        info_lines=info,
        ignored_lines=noise.ignored, edits=noise.edits, other_lines=other)


def _cuda(suffix: str | None) -> str | None:
    return suffix[4:] if suffix and suffix.startswith("cuda") else None


@dataclass
class _Group:
    nodes: int | None
    ranks: dict[int, None] = field(default_factory=dict)  # dicts keep first-seen order
    hosts: dict[str, None] = field(default_factory=dict)


def _communicators(comms: list[NcclComm],
                   inits: list[tuple[str, str | None, int, int, str | None]]) -> list[NcclCommunicator]:
    """Group ranks into communicators: by commId where NCCL printed one, else by size.

    The `comm ... nRanks` lines carry the node count; the `Init START/COMPLETE`
    lines carry the commId. A log may hold several communicators (a framework
    builds one per process group), and each is reported.
    """
    groups: dict[tuple[str | None, int], _Group] = {}
    for c in comms:
        g = groups.setdefault((c.comm_id, c.n_ranks), _Group(c.n_nodes))
        g.ranks[c.rank] = None
        g.hosts[c.host] = None
    for host, cid, rank, nranks, _handle in inits:
        g = groups.setdefault((cid, nranks), _Group(None))
        g.ranks[rank] = None
        g.hosts[host] = None
    # the same communicator seen with and without its commId: keep the one with it
    with_id = {n for (cid, n) in groups if cid is not None}
    return [NcclCommunicator(comm_id=cid, n_ranks=n, n_nodes=g.nodes, ranks=sorted(g.ranks),
                             hosts=list(g.hosts))
            for (cid, n), g in groups.items() if cid is not None or n not in with_id]


_NVLS_ENV = re.compile(r"\bNCCL_NVLS_ENABLE set by environment to (?P<v>\d+)")
_NVLS_CHANNEL = re.compile(r"\bvia NVLS\b|\bNVLS multicast support is available\b")
_NVLS_NONE = re.compile(r"\bNVLS multicast support is not available\b")


def nvls_state(text: str) -> tuple[bool, str] | None:
    """Whether NVLink SHARP was on in a log, and which line says so: the environment
    NCCL echoes, NVLS channels or NCCL's multicast line; None where nothing does."""
    for line_no, line in enumerate(text.splitlines(), start=1):
        if m := _NVLS_ENV.search(line):
            return m["v"] != "0", f"NCCL_NVLS_ENABLE={m['v']}, log line {line_no}"
    for line_no, line in enumerate(text.splitlines(), start=1):
        if _NVLS_CHANNEL.search(line):
            return True, f"NVLS in NCCL INFO, log line {line_no}"
        if _NVLS_NONE.search(line):
            return False, f"NVLS multicast not available, log line {line_no}"
    return None


_P2P_ENV = re.compile(r"\b(?P<name>NCCL_P2P_DISABLE|NCCL_P2P_LEVEL) set by environment to "
                      r"(?P<v>\w+)")


def p2p_state(text: str) -> tuple[bool, str] | None:
    """False where NCCL echoes that peer access was turned off (NCCL_P2P_DISABLE=1, or
    NCCL_P2P_LEVEL LOC/0: never use it), with the line; None where it says nothing."""
    for line_no, line in enumerate(text.splitlines(), start=1):
        m = _P2P_ENV.search(line)
        if m and ((m["name"] == "NCCL_P2P_DISABLE" and m["v"] == "1")
                  or (m["name"] == "NCCL_P2P_LEVEL" and m["v"] in ("LOC", "0"))):
            return False, f"{m['name']}={m['v']}, log line {line_no}"
    return None


# Registered without decorating, so callers keep the precise return type.
register(KIND, "NCCL_DEBUG=INFO lines from any log: version, ranks, nodes, NICs, transports",
          example="NCCL_DEBUG=INFO ./build/all_reduce_perf -b 8 -e 128M -f 2 -g 8")(
    parse_nccl_debug)
