"""Nodes and cards across runs: which came back, which failed again, which were replaced.

Every preflight records each GPU's index, UUID, serial and PCI bus id and the node's
host name (`nodes/<n>/preflight/facts.json`: `--query-gpu`, else `nvidia-smi -q -x`).
A run without a preflight (health, training) is read against the cards of the node's
latest preflight at or before it (else the first after it).

A FAIL counts when it is on the provider's side (`verdict.provider_side_fail`); it is
a card's when the finding names the GPU (its index, UUID or bus id: `details.gpu`,
`details.pci`), else the node's. A card (by serial, else UUID) or a node that FAILed
with the same code in two or more runs is a repeat, named with its runs; a node whose
cards differ from its previous preflight's came back with other cards (a replacement).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.analysis import frames, verdict
from orchestrator.analysis.environment import preflight_docs
from orchestrator.records import SEVERITY_ORDER, Finding
from orchestrator.verdicts import Table


@dataclass(frozen=True)
class Card:
    index: int | None
    uuid: str | None
    serial: str | None
    pci_bus_id: str | None

    @property
    def key(self) -> str:
        """How the card is known across runs: its serial, else its UUID."""
        return f"serial {self.serial}" if self.serial else f"UUID {self.uuid}" if self.uuid \
            else f"GPU {self.index} (no serial or UUID)"


@dataclass
class NodeFacts:
    run_id: str
    node: str
    host: str | None
    cards: list[Card]
    evidence: str  # "<run>/nodes/<n>/preflight/facts.json"


def _text(v: Any) -> str | None:
    s = str(v).strip() if v is not None else ""
    return s if s and s.upper() not in ("N/A", "[N/A]", "NONE") else None


def cards_of(doc: dict[str, Any]) -> list[Card]:
    """Each GPU of a facts.json: index, UUID, serial, bus id, merged by index from
    `--query-gpu` and `nvidia-smi -q -x` (the first that has a value)."""
    facts = doc.get("facts") or {}
    merged: dict[int, dict[str, Any]] = {}
    for cid in ("query_gpu", "nvidia_smi_q_xml", "nvidia_smi_L"):
        gpus = (facts.get(cid) or {}).get("gpus") or []
        for pos, g in enumerate(gpus):
            if not isinstance(g, dict):
                continue
            i = g.get("index")
            i = int(i) if isinstance(i, int) or (isinstance(i, str) and i.isdigit()) else pos
            m = merged.setdefault(i, {})
            for k in ("uuid", "serial", "pci_bus_id"):
                if not m.get(k) and _text(g.get(k)):
                    m[k] = _text(g.get(k))
    return [Card(i, m.get("uuid"), m.get("serial"), m.get("pci_bus_id"))
            for i, m in sorted(merged.items())]


def read_facts(run_dir: Path, run_id: str, provider: str) -> dict[str, NodeFacts]:
    """node -> what its preflight in this run recorded (the provider's nodes only)."""
    out: dict[str, NodeFacts] = {}
    for node, f, doc in preflight_docs(run_dir, provider):
        host = _text(((doc.get("facts") or {}).get("uname") or {}).get("hostname"))
        out[node] = NodeFacts(run_id, node, host, cards_of(doc),
                              f"{run_id}/{f.relative_to(run_dir)}")
    return out


_BUS = re.compile(r"([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.[0-7])?\s*$")


def bus_key(bus: str | None) -> str | None:
    """"00000000:19:00.0", "0000:19:00" and "19:00.0" are one bus id: "19:00"."""
    m = _BUS.search(bus or "")
    return f"{m.group(1)}:{m.group(2)}".lower() if m else None


def card_of(f: Finding, cards: Sequence[Card]) -> Card | None:
    """The card a finding names (details.gpu: an index or a UUID; details.pci: a bus id)."""
    g = f.details.get("gpu")
    for c in cards:
        if g is not None and (str(g) == str(c.index) or (c.uuid and str(g) == c.uuid)):
            return c
    pci = bus_key(str(f.details.get("pci") or "")) if f.details.get("pci") else None
    if pci:
        for c in cards:
            if bus_key(c.pci_bus_id) == pci:
                return c
    return None


@dataclass
class RunOfNode:
    run_id: str
    started: str
    command: str
    node: str
    verdict: str  # FAIL | FAIL (setup) | WARN | PASS | NOT MEASURED
    cards_from: NodeFacts | None
    card_fails: dict[str, list[str]] = field(default_factory=dict)  # card key -> codes
    node_fails: list[str] = field(default_factory=list)  # codes naming no card


@dataclass
class History:
    provider: str
    runs: list[RunOfNode]
    cards: dict[str, Card]  # key -> the card as last seen
    card_nodes: dict[str, list[tuple[str, str]]]  # key -> [(run, node)]
    repeats: list[str]
    replacements: list[str]

    def as_json(self) -> dict[str, Any]:
        return {"provider": self.provider,
                "runs": [{"run_id": r.run_id, "started": r.started, "command": r.command,
                          "node": r.node, "verdict": r.verdict,
                          "host": r.cards_from.host if r.cards_from else None,
                          "cards": [c.__dict__ for c in r.cards_from.cards]
                          if r.cards_from else [],
                          "cards_from": r.cards_from.evidence if r.cards_from else None,
                          "card_fails": r.card_fails, "node_fails": r.node_fails}
                         for r in self.runs],
                "repeats": self.repeats, "replacements": self.replacements}


def _node_verdict(fs: Sequence[Finding]) -> str:
    if any(verdict.provider_side_fail(f) for f in fs):
        return "FAIL"
    if any(f.severity == "FAIL" for f in fs):
        return "FAIL (setup)"
    top = max((f.severity for f in fs), key=lambda s: SEVERITY_ORDER.get(s, 0), default="")
    return top if top in ("WARN", "PASS") else "NOT MEASURED"


def _day(t: str) -> str:
    return t[:10]


def history(root: Path, provider: str) -> History:
    """Every run of the provider, oldest first, node by node (see the module's text)."""
    runs = frames.runs(root, providers=[provider])
    ids = [str(r) for r in runs["run_id"]]
    fs = [f for f in frames.finding_records(root, ids) if f.provider == provider] if ids else []
    facts: dict[str, dict[str, NodeFacts]] = {}
    for rid, path in zip(ids, runs["path"], strict=True):
        facts[rid] = read_facts(Path(str(path)), rid, provider)
    order = {rid: i for i, rid in enumerate(ids)}
    seen_in: dict[str, list[str]] = {}  # node -> the runs whose preflight saw it, in order
    for rid in ids:
        for node in facts[rid]:
            seen_in.setdefault(node, []).append(rid)

    def cards_for(node: str, rid: str) -> NodeFacts | None:
        runs_of = seen_in.get(node, [])
        before = [r for r in runs_of if order[r] <= order[rid]]
        pick = before[-1] if before else runs_of[0] if runs_of else None
        return facts[pick][node] if pick else None

    rows: list[RunOfNode] = []
    started = dict(zip(ids, map(str, runs["started"]), strict=True))
    command = dict(zip(ids, map(str, runs["command"]), strict=True))
    grouped: dict[str, dict[str, list[Finding]]] = {}  # run -> node -> findings
    for f in fs:
        if f.node is not None:
            grouped.setdefault(f.run_id, {}).setdefault(f.node, []).append(f)
    for rid in ids:
        mine = grouped.get(rid, {})
        for n in sorted(set(mine) | set(facts[rid])):
            nf = mine.get(n, [])
            src = cards_for(n, rid)
            row = RunOfNode(rid, started[rid], command[rid], n, _node_verdict(nf), src)
            for f in nf:
                if not verdict.provider_side_fail(f):
                    continue
                c = card_of(f, src.cards if src else [])
                if c is None:
                    row.node_fails.append(f.code)
                else:
                    row.card_fails.setdefault(c.key, []).append(f.code)
            rows.append(row)

    cards: dict[str, Card] = {}
    card_nodes: dict[str, list[tuple[str, str]]] = {}
    for r in rows:
        for c in (r.cards_from.cards if r.cards_from else []):
            cards[c.key] = c
            if r.verdict != "NOT MEASURED":
                card_nodes.setdefault(c.key, []).append((r.run_id, r.node))
    repeats: list[str] = []
    fails: dict[str, dict[str, list[str]]] = {}  # card key -> code -> runs
    for r in rows:
        for key, codes in r.card_fails.items():
            for code in dict.fromkeys(codes):
                fails.setdefault(key, {}).setdefault(code, []).append(r.run_id)
    for key, seen in card_nodes.items():
        runs_seen = list(dict.fromkeys(rid for rid, _ in seen))
        by_code = fails.get(key, {})
        for code, failed in sorted(by_code.items()):
            failed = list(dict.fromkeys(failed))
            if len(failed) < 2:
                continue
            c = cards[key]
            where = ", ".join(dict.fromkeys(f"{n} GPU {c.index}" for _, n in seen))
            repeats.append(f"GPU {key} (UUID {c.uuid or '?'}, {where}) FAILed {code} in "
                           f"{len(failed)} of its {len(runs_seen)} runs since "
                           f"{_day(started[runs_seen[0]])}: {', '.join(failed)}")
    rows_of: dict[str, list[RunOfNode]] = {}
    for r in rows:
        rows_of.setdefault(r.node, []).append(r)
    for n in sorted(rows_of):
        judged = [x for x in rows_of[n] if x.verdict != "NOT MEASURED"]
        by_code = {}
        for x in judged:
            for code in dict.fromkeys(x.node_fails):
                by_code.setdefault(code, []).append(x.run_id)
        host = next((x.cards_from.host for x in reversed(judged) if x.cards_from
                     and x.cards_from.host), None)
        for code, failed in sorted(by_code.items()):
            failed = list(dict.fromkeys(failed))
            if len(failed) >= 2:
                runs_seen = list(dict.fromkeys(x.run_id for x in judged))
                repeats.append(f"node {n}{f' ({host})' if host else ''} FAILed {code} in "
                               f"{len(failed)} of its {len(runs_seen)} runs since "
                               f"{_day(started[runs_seen[0]])}: {', '.join(failed)}")
    replacements: list[str] = []
    for n in sorted({r.node for r in rows}):
        pre = [facts[rid][n] for rid in seen_in.get(n, [])]
        for a, b in zip(pre, pre[1:], strict=False):
            old = {c.key for c in a.cards}
            new = {c.key for c in b.cards}
            if old != new:
                gone = [c for c in a.cards if c.key not in new]
                came = [c for c in b.cards if c.key not in old]
                replacements.append(
                    f"node {n} came back with other cards in run {b.run_id} (since "
                    f"{a.run_id}): " + "; ".join(
                        [f"GPU {c.index} {c.key} gone" for c in gone]
                        + [f"GPU {c.index} {c.key} new" for c in came]))
    return History(provider, rows, cards, card_nodes, repeats, replacements)


def nodes_table(h: History) -> Table:
    return Table(f"nodes of {h.provider} across runs",
                 ("node", "host", "run", "started", "step", "verdict", "FAILed (provider's side)",
                  "cards (serial)"),
                 [(r.node, r.cards_from.host if r.cards_from and r.cards_from.host else "-",
                   r.run_id, r.started, r.command, r.verdict,
                   ", ".join(dict.fromkeys(r.node_fails + [
                       f"{c}: {k}" for k, cs in r.card_fails.items() for c in cs])) or "-",
                   ", ".join(f"{c.index}: {c.serial or c.uuid or '?'}"
                             for c in r.cards_from.cards) if r.cards_from else "not known")
                  for r in h.runs])


def cards_table(h: History) -> Table:
    rows = []
    at = {(x.run_id, x.node): x for x in h.runs}
    for key, c in sorted(h.cards.items(), key=lambda kc: kc[0]):
        seen = h.card_nodes.get(key, [])
        verdicts = []
        for rid, node in seen:
            r = at[(rid, node)]
            codes = r.card_fails.get(key)
            shown = ("FAIL " + ", ".join(codes) if codes else
                     "node FAIL " + ", ".join(r.node_fails) if r.node_fails else
                     "PASS (another GPU of the node FAILed)" if r.verdict == "FAIL" else
                     r.verdict)
            verdicts.append(f"{rid}: {shown}")
        rows.append((c.serial or "-", c.uuid or "-", ", ".join(dict.fromkeys(
            f"{n} GPU {c.index}" for _, n in seen)) or "-", c.pci_bus_id or "-",
            len(dict.fromkeys(r for r, _ in seen)), "; ".join(verdicts) or "not judged"))
    return Table(f"cards of {h.provider} across runs", ("serial", "UUID", "where", "bus id",
                                                        "runs", "verdict per run"), rows)
