"""The RDMA port views people save beside ibstat: `ibdev2netdev` (Mellanox OFED's map of
each HCA port to its network interface), iproute2's `rdma link` and infiniband-diags'
`ibstatus`. Each gives one line or block per port; all three are read into one shape
(device, port, state, physical state, netdev, rate) so a port down reads the same
whichever tool showed it.

`ibdev2netdev`'s `(Up)`/`(Down)` is the network interface's state (IPoIB or the
Ethernet side), not the InfiniBand port's: on a pure InfiniBand fabric every interface
may be down while the ports are active, so it is kept as `netdev_state` and the port's
own state only where `-v` prints it. A line that is not the tool's is an error naming it.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

from orchestrator.errors import ParseError
from orchestrator.parsers import register

IBDEV2NETDEV_KIND = "ibdev2netdev"
RDMA_LINK_KIND = "rdma-link"
IBSTATUS_KIND = "ibstatus"

# `mlx5_0 port 1 ==> ib0 (Up)`; `-v`: `0000:0c:00.0 mlx5_0 (MT4123 - MCX653105A) fw 20.31
# port 1 (ACTIVE) ==> ib0 (Up)`; `column -t` and an author's trailing `# note` read past
_IBDEV = re.compile(r"^(?:(?P<pci>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s+)?"
                    r"(?P<dev>[\w.-]+)(?:\s+\((?P<desc>[^)]*)\))?(?:\s+fw\s+(?P<fw>\S+))?"
                    r"\s+port\s+(?P<port>\d+)(?:\s+\((?P<pstate>[A-Z_]+)\))?\s+==>\s+"
                    r"(?P<netdev>\S+)\s+\((?P<state>[A-Za-z]+)\)(?:\s+#.*)?$")
_LINK = re.compile(r"^link\s+(?P<dev>[\w.-]+)/(?P<port>\d+)(?P<rest>(?:\s+\S+\s+\S+)*)\s*$")
_IBSTATUS_HEAD = re.compile(r"^Infiniband device '(?P<dev>[^']+)' port (?P<port>\d+) status:$")
_IBSTATUS_KV = re.compile(r"^\s+(?P<key>[a-z_ ]+):\s+(?P<value>.*?)\s*$")
_RATE = re.compile(r"^(?P<gbps>\d+(?:\.\d+)?) Gb/sec(?: \((?P<width>[^)]*)\))?$")
_STATE = re.compile(r"^\d+:\s*(?P<name>\S+)$")  # ibstatus' `4: ACTIVE`


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RdmaPort(_Model):
    line_no: int
    device: str  # mlx5_0
    port: int
    state: str | None  # the port's: ACTIVE, DOWN, INIT, ARMED (None: the tool does not say)
    physical_state: str | None  # LINK_UP / LinkUp, POLLING, DISABLED
    netdev: str | None  # the network interface on the port (ib0, ens1f0np0)
    netdev_state: str | None  # ibdev2netdev's Up/Down of that interface
    rate_gbps: float | None = None
    width: str | None = None  # `4X HDR`
    link_layer: str | None = None  # InfiniBand / Ethernet
    pci: str | None = None
    extra: dict[str, str] = {}  # what else the line said, by the tool's key

    @property
    def active(self) -> bool | None:
        """The port is up: its own state where the tool prints one."""
        if self.state is None:
            return None
        return self.state.upper() == "ACTIVE"


class RdmaPortsFacts(_Model):
    tool: str  # ibdev2netdev | rdma link | ibstatus
    ports: list[RdmaPort]

    @property
    def down(self) -> list[RdmaPort]:
        return [p for p in self.ports if p.active is False]


def _lines(text: str, kind: str, source: str | None) -> list[tuple[int, str]]:
    rows = [(n, ln.rstrip()) for n, ln in enumerate(text.splitlines(), 1) if ln.strip()]
    if not rows:
        raise ParseError(kind, "empty output", source=source)
    return rows


def parse_ibdev2netdev(text: str, source: str | None = None) -> RdmaPortsFacts:
    ports: list[RdmaPort] = []
    for no, line in _lines(text, IBDEV2NETDEV_KIND, source):
        m = _IBDEV.match(line.strip())
        if m is None:
            raise ParseError(IBDEV2NETDEV_KIND, "not an `<hca> port <n> ==> <netdev> (Up|Down)` "
                             "line", line_no=no, line=line, source=source)
        extra = {k: m[k] for k in ("desc", "fw") if m[k]}
        ports.append(RdmaPort(line_no=no, device=m["dev"], port=int(m["port"]),
                              state=m["pstate"], physical_state=None, netdev=m["netdev"],
                              netdev_state=m["state"], pci=m["pci"], extra=extra))
    return RdmaPortsFacts(tool="ibdev2netdev", ports=ports)


def parse_rdma_link(text: str, source: str | None = None) -> RdmaPortsFacts:
    ports: list[RdmaPort] = []
    for no, line in _lines(text, RDMA_LINK_KIND, source):
        m = _LINK.match(line.strip())
        if m is None:
            raise ParseError(RDMA_LINK_KIND, "not a `link <dev>/<port> state ...` line",
                             line_no=no, line=line, source=source)
        words = m["rest"].split()
        pairs = dict(zip(words[::2], words[1::2], strict=True))
        if "state" not in pairs:
            raise ParseError(RDMA_LINK_KIND, "a link without its state", line_no=no, line=line,
                             source=source)
        ports.append(RdmaPort(
            line_no=no, device=m["dev"], port=int(m["port"]), state=pairs.pop("state"),
            physical_state=pairs.pop("physical_state", None), netdev=pairs.pop("netdev", None),
            netdev_state=None, extra=pairs))
    return RdmaPortsFacts(tool="rdma link", ports=ports)


def parse_ibstatus(text: str, source: str | None = None) -> RdmaPortsFacts:
    ports: list[RdmaPort] = []
    cur: dict[str, str] | None = None
    head: tuple[int, str, int] | None = None

    def close() -> None:
        if head is None or cur is None:
            return
        state = _STATE.match(cur.pop("state", ""))
        phys = _STATE.match(cur.pop("phys state", ""))
        rate = _RATE.match(cur.get("rate", ""))
        if rate is not None:
            cur.pop("rate")
        ports.append(RdmaPort(
            line_no=head[0], device=head[1], port=head[2],
            state=state["name"] if state else None, physical_state=phys["name"] if phys else None,
            netdev=None, netdev_state=None, rate_gbps=float(rate["gbps"]) if rate else None,
            width=rate["width"] if rate else None, link_layer=cur.pop("link_layer", None),
            extra=cur))

    for no, line in _lines(text, IBSTATUS_KIND, source):
        if m := _IBSTATUS_HEAD.match(line.strip()):
            close()
            head, cur = (no, m["dev"], int(m["port"])), {}
            continue
        kv = _IBSTATUS_KV.match(line)
        if kv is None or cur is None:
            raise ParseError(IBSTATUS_KIND, "not an `Infiniband device '<hca>' port <n> status:` "
                             "block", line_no=no, line=line, source=source)
        cur[kv["key"].strip()] = kv["value"]
    close()
    return RdmaPortsFacts(tool="ibstatus", ports=ports)


register(IBDEV2NETDEV_KIND, "ibdev2netdev (-v): each HCA port's network interface and its "
         "Up/Down", example="ibdev2netdev -v")(parse_ibdev2netdev)
register(RDMA_LINK_KIND, "rdma link (iproute2): each RDMA port's state, physical state and "
         "netdev", example="rdma link show")(parse_rdma_link)
register(IBSTATUS_KIND, "ibstatus: each InfiniBand port's state, physical state, rate and link "
         "layer", example="ibstatus")(parse_ibstatus)
