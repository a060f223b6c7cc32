"""The fabric's ports judged: error counters around a load, P_Keys across nodes, RoCE GIDs.

Shared by preflight (the snapshot of each node, the P_Keys of a provider's nodes), the
nccl step and the fleet step (a snapshot before and after their load on each node). The
facts are `parsers.fabric.FabricFacts`, read by the payload from sysfs.

Thresholds (docs/fleet.md, "Fabric counters"): a counter's growth between the snapshot
before a load and the one after it is a finding when it is above `GROWTH_LIMITS`:

| counter | allowed growth | above it |
| --- | --- | --- |
| link_downed | 0 | FAIL: the link went down during the load |
| link_error_recovery | 0 | WARN: the link retrained |
| symbol_error | 10 | WARN: bit errors on the wire (cable, transceiver) |
| port_rcv_errors | 10 | WARN: malformed packets received |
| port_rcv_remote_physical_errors | 10 | WARN: errors the far end marked |
| local_link_integrity_errors | 0 | WARN: the link's error threshold was crossed |
| excessive_buffer_overrun_errors | 0 | WARN: the receive buffer overran |
| port_xmit_discards | 100 | WARN: packets dropped on send (congestion, a link down) |

`port_xmit_wait` (time the port had data and no credit: congestion) is stated, never
judged. A counter that went back (after < before) was cleared or wrapped during the load:
said as such, never a negative delta. The port counters of the PMA are narrow and stop
at their maximum (`WIDTH_BITS`: link_downed at 255, symbol_error at 65535): a counter
at its maximum cannot show growth, which is said too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator import payload as payload_mod
from orchestrator.errors import GpuvetError, ParseError
from orchestrator.executors.base import Executor, ExecutorPool, fanout
from orchestrator.inventory import Node
from orchestrator.parsers.fabric import FabricFacts, FabricPort, parse_fabric
from orchestrator.records import Finding, Severity, finding
from orchestrator.store import Run, atomic_write

# counter -> (growth allowed during a load, severity above it, what it means)
GROWTH_LIMITS: dict[str, tuple[int, Severity, str]] = {
    "link_downed": (0, "FAIL", "the link went down"),
    "link_error_recovery": (0, "WARN", "the link retrained"),
    "symbol_error": (10, "WARN", "bit errors on the wire (cable, transceiver)"),
    "port_rcv_errors": (10, "WARN", "malformed packets received"),
    "port_rcv_remote_physical_errors": (10, "WARN", "packets the far end marked bad"),
    "local_link_integrity_errors": (0, "WARN", "the link's error threshold was crossed"),
    "excessive_buffer_overrun_errors": (0, "WARN", "the receive buffer overran"),
    "port_xmit_discards": (100, "WARN", "packets dropped on send (congestion, a link down)"),
}
# the PMA PortCounters widths: a counter stops at 2**bits - 1
WIDTH_BITS: dict[str, int] = {
    "symbol_error": 16, "link_downed": 8, "port_rcv_errors": 16, "link_error_recovery": 8,
    "port_xmit_discards": 16, "port_rcv_remote_physical_errors": 16,
    "local_link_integrity_errors": 4, "excessive_buffer_overrun_errors": 4,
    "port_xmit_wait": 32,
}
ROCE_V2 = "RoCE v2"
SNAPSHOT_TIMEOUT_S = 60.0


@dataclass
class Verdict:
    """What a fabric check says; a step turns it into a finding of its own."""

    code: str
    severity: Severity
    message: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Delta:
    device: str
    port: int
    counter: str
    before: int
    after: int
    kind: str  # "growth", "went_back", "saturated"

    @property
    def grew(self) -> int:
        return self.after - self.before if self.kind == "growth" else 0


def saturated(counter: str, value: int) -> bool:
    bits = WIDTH_BITS.get(counter)
    return bits is not None and value >= (1 << bits) - 1


def deltas(before: FabricFacts, after: FabricFacts) -> list[Delta]:
    """Every counter of every port seen in both snapshots, before and after."""
    out: list[Delta] = []
    for a in after.ports:
        b = before.port(a.device, a.port)
        if b is None:
            continue
        for counter, now in a.counters.items():
            then = b.counters.get(counter)
            if then is None:
                continue
            if now < then:
                kind = "went_back"
            elif saturated(counter, then):
                kind = "saturated"
            else:
                kind = "growth"
            out.append(Delta(a.device, a.port, counter, then, now, kind))
    return out


def _where(p: FabricPort | Delta) -> str:
    return f"{p.device} port {p.port}"


def judge_load(before: FabricFacts, after: FabricFacts) -> list[Verdict]:
    """The counters and port states after a load against those before it."""
    out: list[Verdict] = []
    if not before.present or not (before.ports or after.ports):
        return [Verdict("RDMA_NONE", "INFO", "no InfiniBand/RoCE devices "
                        f"({before.root} absent or empty): no fabric counters around the load")]
    for b in before.ports:
        a = after.port(b.device, b.port)
        if a is None:
            out.append(Verdict("RDMA_PORT_GONE", "FAIL", f"{_where(b)} was there before the "
                               "load and is gone after it", {"device": b.device, "port": b.port}))
        elif b.active and not a.active:
            out.append(Verdict("RDMA_PORT_STATE", "FAIL", f"{_where(b)} was ACTIVE before the "
                               f"load and is {a.state or 'unknown'} ({a.phys_state or '?'}) after "
                               "it", {"device": b.device, "port": b.port, "before": b.state,
                                      "after": a.state}))
    ds = deltas(before, after)
    stuck: list[Delta] = []
    for d in ds:
        limit = GROWTH_LIMITS.get(d.counter)
        if d.kind == "went_back":
            out.append(Verdict("RDMA_COUNTER_WENT_BACK", "INFO", f"{_where(d)} {d.counter} went "
                               f"back from {d.before} to {d.after} during the load: the counters "
                               "were cleared (perfquery -R) or the counter wrapped, so its growth "
                               "is not known", _details(d)))
        elif d.kind == "saturated" and limit is not None:
            stuck.append(d)
        elif limit is not None and d.grew > limit[0]:
            allowed, sev, meaning = limit
            out.append(Verdict("RDMA_COUNTER_GREW", sev, f"{_where(d)} {d.counter} grew by "
                               f"{d.grew} during the load ({d.before} -> {d.after}; more than "
                               f"{allowed} allowed): {meaning}", _details(d, allowed=allowed)))
    if stuck:
        out.append(Verdict("RDMA_COUNTER_SATURATED", "INFO", f"{len(stuck)} counter(s) at "
                           "their maximum cannot show growth during the load: "
                           + ", ".join(f"{d.device}:{d.port} {d.counter}={d.before}"
                                       for d in stuck[:12])
                           + (" ..." if len(stuck) > 12 else "")
                           + "; clear the ports' counters (perfquery -x -R) to read them again",
                           {"counters": [[f"{d.device}:{d.port}", d.counter, d.before]
                                         for d in stuck]}))
    wait = sum(d.grew for d in ds if d.counter == "port_xmit_wait")
    if not [v for v in out if v.severity in ("WARN", "FAIL")]:
        ports = [p for p in after.ports if before.port(p.device, p.port) is not None]
        out.append(Verdict("RDMA_COUNTERS_CLEAN", "PASS", f"no error counter of {len(ports)} "
                           "port(s) grew beyond its threshold during the load"
                           + (f"; port_xmit_wait grew by {wait} (congestion, not judged)"
                              if wait else ""),
                           {"ports": [p.key for p in ports], "port_xmit_wait": wait}))
    return out


def _details(d: Delta, **more: Any) -> dict[str, Any]:
    return {"device": d.device, "port": d.port, "counter": d.counter, "before": d.before,
            "after": d.after, **more}


def describe(facts: FabricFacts, fabric_type: str | None = None) -> list[Verdict]:
    """One node's snapshot as facts: its ports, counters already counting, RoCE GIDs."""
    if not facts.present or not facts.ports:
        return [Verdict("RDMA_NONE", "INFO", f"no InfiniBand/RoCE devices ({facts.root} "
                        "absent or empty)", {"present": facts.present})]
    out: list[Verdict] = []
    shown = ", ".join(f"{p.key} {p.link_layer or '?'} {p.state or '?'} {_rate(p)}"
                      for p in facts.ports[:24])
    more = f" (+{len(facts.ports) - 24} more)" if len(facts.ports) > 24 else ""
    out.append(Verdict("RDMA_PORTS", "INFO", f"{len(facts.ports)} port(s) in sysfs: "
                       f"{shown}{more}", {"ports": [p.key for p in facts.ports]}))
    counting = [(p.key, c, v) for p in facts.ports for c, v in p.counters.items()
                if c in GROWTH_LIMITS and v > 0]
    if counting:
        sat = [(k, c, v) for k, c, v in counting if saturated(c, v)]
        text = ", ".join(f"{k} {c}={v}{' (at its maximum)' if saturated(c, v) else ''}"
                         for k, c, v in counting[:16])
        out.append(Verdict("RDMA_COUNTERS_NONZERO", "INFO", "error counters not zero (since "
                           f"they were last cleared, not necessarily now): {text}"
                           + (f"; {len(sat)} at their maximum cannot show growth under load "
                              "(perfquery -x -R clears them)" if sat else ""),
                           {"counters": [[k, c, v] for k, c, v in counting]}))
    unread = sorted({f"{p.key} ({next(iter(p.counters_unreadable.values()))})"
                     for p in facts.ports if p.counters_unreadable})
    if unread:
        out.append(Verdict("RDMA_COUNTERS_UNREADABLE", "INFO", "port counters not readable on "
                           + ", ".join(unread), {"ports": unread}))
    for p in facts.ports:
        if p.bad_pkeys:
            out.append(Verdict("RDMA_PKEY_UNREADABLE", "WARN", f"{p.key} P_Key entries that "
                               f"are not 16-bit values: {', '.join(p.bad_pkeys[:8])}",
                               {"port": p.key}))
    out += _roce(facts, fabric_type)
    if facts.truncated:
        out.append(Verdict("RDMA_SNAPSHOT_CUT", "WARN", "the fabric snapshot reached its "
                           "bound (devices, ports or table entries) and is incomplete"))
    return out


def _rate(p: FabricPort) -> str:
    return f"{p.rate_gbps:g} Gb/s" if p.rate_gbps is not None else "rate ?"


def _roce(facts: FabricFacts, fabric_type: str | None) -> list[Verdict]:
    out: list[Verdict] = []
    for p in facts.ports:
        if not p.roce:
            continue
        types = [g.type or "?" for g in p.gids]
        v2 = [g.index for g in p.gids if g.type == ROCE_V2]
        counts = ", ".join(f"{t} x{types.count(t)}" for t in dict.fromkeys(types)) or "none"
        mtu = f"MTU {p.mtu}" if p.mtu is not None else "MTU not read"
        base = {"port": p.key, "netdev": p.netdev, "mtu": p.mtu, "roce_v2_gids": v2}
        out.append(Verdict("RDMA_ROCE", "INFO", f"{p.key} RoCE over {p.netdev or 'no netdev'}"
                           f", {mtu}; GIDs: {counts}", base))
        if not v2:
            sev: Severity = "FAIL" if fabric_type == "roce" and p.active else "WARN"
            out.append(Verdict("RDMA_ROCE_NO_V2", sev, f"{p.key} ({p.netdev or 'no netdev'}) "
                               "has no RoCE v2 GID entry: NCCL and perftest use RoCE v2 by default "
                               "(routable, UDP); give the netdev an IP address, or check the "
                               "port's RoCE mode (cma_roce_mode)", base))
    return out


def node_pkeys(facts: FabricFacts) -> set[str]:
    """The P_Keys of a node's InfiniBand ports (RoCE ports carry only the default)."""
    return {k for p in facts.ports if not p.roce for k in p.pkeys}


def pkey_mismatch(nodes: Mapping[str, FabricFacts | None]) -> list[Verdict]:
    """Nodes of one provider whose InfiniBand P_Keys differ: NCCL across them hangs or
    fails. The most common table is taken as the provider's; every other node is named
    with the keys it lacks and the keys it has beyond it."""
    tables = {n: node_pkeys(f) for n, f in nodes.items() if f is not None and f.present
              and any(not p.roce for p in f.ports)}
    if len(tables) < 2:
        return []
    groups: dict[frozenset[str], list[str]] = {}
    for n, table in tables.items():
        groups.setdefault(frozenset(table), []).append(n)
    if len(groups) == 1:
        same = sorted(next(iter(groups)))
        return [Verdict("RDMA_PKEYS_SAME", "PASS", f"the {len(tables)} nodes with InfiniBand "
                        f"ports have the same P_Keys: {', '.join(same) or 'none'}",
                        {"pkeys": same, "nodes": sorted(tables)})]
    common = max(groups, key=lambda k: (len(groups[k]), sorted(k)))
    parts = []
    odd: dict[str, dict[str, list[str]]] = {}
    for keys, members in groups.items():
        if keys == common:
            continue
        lacks, extra = sorted(common - keys), sorted(keys - common)
        for n in members:
            odd[n] = {"lacks": lacks, "extra": extra}
        said = "; ".join(x for x in (f"lacks {', '.join(lacks)}" if lacks else "",
                                     f"has {', '.join(extra)} beyond them" if extra else "") if x)
        parts.append(f"{', '.join(sorted(members))}: {said}")
    return [Verdict("RDMA_PKEY_MISMATCH", "FAIL", "P_Keys differ between nodes: "
                    f"{', '.join(sorted(groups[common]))} have {', '.join(sorted(common)) or 'none'}"
                    f"; {' | '.join(parts)}. NCCL between nodes of different partitions hangs "
                    "or fails: the subnet manager's partition config must give every node "
                    "the same P_Keys", {"pkeys": sorted(common),
                                        "nodes_with_them": sorted(groups[common]),
                                        "differing": odd})]


# --- reading a node -------------------------------------------------------------------------

def take_snapshot(ex: Executor, staging: Path, out: Path,
                  timeout: float = SNAPSHOT_TIMEOUT_S) -> FabricFacts | str:
    """One `python3 -m payload fabric` on the node, kept at `out`: its facts, or why not."""
    try:
        res = payload_mod.run(ex, ["fabric"], staging=staging, timeout=timeout)
    except GpuvetError as exc:
        return exc.what
    if not res.ok:
        tail = (res.stderr or res.stdout or "").strip().splitlines()[-1:] or [f"rc {res.rc}"]
        return f"the payload's fabric snapshot failed: {tail[0][:200]}"
    try:
        facts = parse_fabric(res.stdout, source=str(out))
    except ParseError as exc:
        return exc.reason
    atomic_write(out, json.dumps(json.loads(res.stdout), indent=1) + "\n", durable=False)
    return facts


def around(before: FabricFacts | str | None, after: FabricFacts | str | None
           ) -> list[Verdict]:
    """The verdicts of one node's load from its two snapshots, either of which may have
    failed (a string saying why): then the counters were not compared, which is said."""
    if isinstance(before, FabricFacts) and isinstance(after, FabricFacts):
        return judge_load(before, after)
    if isinstance(before, FabricFacts) and (not before.present or not before.ports):
        return judge_load(before, before)
    why = next((x for x in (before, after) if isinstance(x, str)), "no snapshot taken")
    # INFO: the load itself is judged apart; what could not be read is said, not blamed
    return [Verdict("RDMA_NOT_READ", "INFO", f"fabric counters not compared around the "
                    f"load: {why}")]



# --- before and after a step's load, on each of its nodes ------------------------------------

Snapshot = FabricFacts | str  # the facts, or why there are none


@dataclass
class Around:
    """A step's snapshots of its nodes' fabric before its load (then after it): one
    payload call per node each time. A node without InfiniBand/RoCE is not read again."""

    run: Run
    step: str
    label: str  # "single", "multi", "fleet": in each snapshot's file name and message
    before: dict[str, Snapshot] = field(default_factory=dict)
    after: dict[str, Snapshot] = field(default_factory=dict)
    concurrency: int = 32  # nodes read at once (a fleet of 1,000 is not 1,000 threads)

    def path(self, node: Node, when: str) -> Path:
        return self.run.node_dir(node.name, self.step) / f"fabric_{when}_{self.label}.json"

    def take(self, pool: ExecutorPool, nodes: Sequence[Node], when: str) -> None:
        into = self.before if when == "before" else self.after
        todo = [n for n in nodes if when == "before" or _has_ports(self.before.get(n.name))]
        got = fanout(todo, lambda n: take_snapshot(pool(n), self.run.dir / ".staging",
                                                   self.path(n, when)),
                     concurrency=max(1, min(len(todo), self.concurrency)))
        for n in todo:
            if n.name in got.results:
                into[n.name] = got.results[n.name]
            else:
                exc = got.failures.get(n.name)
                into[n.name] = exc.what if isinstance(exc, GpuvetError) else str(exc)

    def findings(self, nodes: Sequence[Node]) -> list[Finding]:
        out: list[Finding] = []
        for n in nodes:
            if n.name not in self.before:
                continue
            ev = [self.run.rel(p) for w in ("before", "after")
                  if (p := self.path(n, w)).is_file()]
            for v in around(self.before.get(n.name), self.after.get(n.name)):
                out.append(finding(self.run.run_id, self.step, provider=n.provider,
                                   node=n.name, code=v.code, severity=v.severity,
                                   message=f"[{self.label}] {v.message}", evidence=ev,
                                   **v.details))
        return out


def _has_ports(s: Snapshot | None) -> bool:
    return isinstance(s, FabricFacts) and s.present and bool(s.ports)
