"""The cost of a good GPU-hour, per provider, over the runs compared.

The hourly price is what was paid for every GPU of the instances; a renter gets
work only out of the GPUs that passed. Per provider:

- **billed GPU-hours**: the billed window `analysis/billing.py` finds (the widest
  one, as the PoC cost headline uses) x the GPUs the nodes reported;
- **good GPU-hours**: the same window x the GPUs of the nodes that passed on the
  provider's side (a PASS and no provider-side FAIL, `verdict.provider_side_fail`);
  a node with a provider-side FAIL counts all its GPUs as lost, a node with no
  judged finding is neither good nor lost and is named;
- **cost of a good GPU-hour**: the compute billed / the good GPU-hours;
- **hours lost to failed nodes**: their GPU-hours, priced at the GPU-hour price;
- **dead on arrival**: the share of nodes with a provider-side FAIL in their first
  preflight or health run among the runs compared;
- **time to a healthy node**: from a node's boot (preflight's `/proc/stat` btime) to
  the end of its first run with a PASS and no provider-side FAIL;
- **per 1M training tokens**: the unit cost `analysis/cost.py` already computes.

Each figure carries its inputs and where they came from; a figure the runs cannot
give says "not known: ..." and why, never 0.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from orchestrator.analysis import cost, verdict
from orchestrator.analysis.environment import preflight_docs
from orchestrator.records import Finding
from orchestrator.verdicts import Table

JUDGED_STEPS = ("preflight", "health")
TITLE = "cost of a good GPU-hour"


@dataclass(frozen=True)
class Figure:
    name: str
    value: float | None  # None: not known (`text` says why)
    text: str  # the value as people read it, or "not known: ..."
    inputs: str
    source: str

    def as_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class GoodHours:
    provider: str
    figures: list[Figure] = field(default_factory=list)
    good_nodes: list[str] = field(default_factory=list)
    failed_nodes: list[str] = field(default_factory=list)
    unjudged_nodes: list[str] = field(default_factory=list)
    dead_on_arrival: list[str] = field(default_factory=list)

    def figure(self, name: str) -> Figure:
        return next(f for f in self.figures if f.name == name)

    def as_json(self) -> dict[str, Any]:
        return {"provider": self.provider, "good_nodes": self.good_nodes,
                "failed_nodes": self.failed_nodes, "unjudged_nodes": self.unjudged_nodes,
                "dead_on_arrival": self.dead_on_arrival,
                "figures": [f.as_json() for f in self.figures]}


def node_boot_times(run_paths: Mapping[str, Path], run_ids: Sequence[str], provider: str
                    ) -> dict[str, tuple[str, str]]:
    """node -> (boot time, evidence "<run>/nodes/<n>/preflight/facts.json"): the earliest
    boot each node reported in these runs' preflight."""
    out: dict[str, tuple[str, str]] = {}
    for rid in run_ids:
        run_dir = run_paths.get(rid)
        if run_dir is None:
            continue
        for node, f, doc in preflight_docs(run_dir, provider):
            bt = doc.get("boot_time")
            if not isinstance(bt, str):
                continue
            try:
                t = cost.parse_time(bt)
            except Exception:  # noqa: BLE001 - a damaged facts.json tells no boot time
                continue
            if node not in out or t < cost.parse_time(out[node][0]):
                out[node] = (bt, f"{rid}/{f.relative_to(run_dir)}")
    return out


def _some(items: Sequence[str], most: int = 3) -> str:
    """A list in a table cell: the first `most` named, the rest counted."""
    return ", ".join(items[:most]) + (f" (+{len(items) - most} more)" if len(items) > most
                                      else "")


def _hours(h: float) -> str:
    return f"{h:.2f} h" if h >= 1 else f"{h * 60:.0f} min"


def _money(v: float, cur: str) -> str:
    return f"{v:,.4f} {cur}" if 0 < abs(v) < 1 else f"{v:,.2f} {cur}"


def _unknown(name: str, why: str, inputs: str = "-", source: str = "-") -> Figure:
    return Figure(name, None, f"not known: {why}", inputs, source)


def billed_window(pocs: Sequence[Any], provider: str) -> Any | None:
    """The provider's widest window (as the headline's PoC cost)."""
    mine = [c for c in pocs if c.provider == provider and c.window.hours is not None]
    if not mine:
        return None
    return max(mine, key=lambda c: (c.billed_hours if c.billed_hours is not None
                                    else c.window.hours) or 0.0)


def good_hours(provider: str, run_ids: Sequence[str], runs: pd.DataFrame,
               findings: Sequence[Finding], env: pd.DataFrame, pocs: Sequence[Any],
               units: Sequence[Any], run_paths: Mapping[str, Path]) -> GoodHours:
    """Every figure of one provider (see the module's text)."""
    fs = [f for f in findings if f.provider == provider and f.run_id in set(run_ids)]
    mounts = verdict.persistent_mounts(run_paths, fs)
    gpus: dict[str, int] = {}
    gpu_src: dict[str, str] = {}
    if not env.empty:
        sel = env[(env["provider"] == provider) & (env["key"] == "gpu_count")]
        for n, v, r, e in zip(sel["node"], sel["value"], sel["run_id"], sel["evidence"],
                              strict=True):
            gpus[str(n)] = int(v)
            gpu_src[str(n)] = f"{r}/{e}"
    by_node: dict[str, list[Finding]] = {}
    for f in fs:
        if f.node is not None:
            by_node.setdefault(f.node, []).append(f)
    nodes = sorted(set(gpus) | set(by_node))
    bad = {n for n in nodes if any(verdict.provider_side_fail(f, mounts)
                                   for f in by_node.get(n, []))}
    good = [n for n in nodes if n not in bad and any(f.severity == "PASS"
                                                     for f in by_node.get(n, []))]
    unjudged = [n for n in nodes if n not in bad and n not in good]
    out = GoodHours(provider, good_nodes=good, failed_nodes=sorted(bad), unjudged_nodes=unjudged)

    # --- the hours and their price
    c = billed_window(pocs, provider)
    price = c.pricing if c is not None else None
    if c is None:
        why = next((p.window.source for p in pocs if p.provider == provider), "no window found")
        hours = None
        hours_words = f"no billed window ({why})"
    elif c.billed_hours is not None:
        hours = float(c.billed_hours)
        hours_words = (f"{hours:g} h billed ({c.window.name}: {c.window.source}, rounded up "
                       f"per {c.pricing.billing_granularity})")
    else:
        hours = float(c.window.hours)
        hours_words = f"{hours:.4g} h ({c.window.name}: {c.window.source}; not rounded: " \
                      f"{c.why or 'not priced'})"
    no_count = [n for n in nodes if n not in gpus]
    count_src = "nvidia-smi --query-gpu of each node's preflight (" + _some(
        sorted(set(gpu_src.values()))) + ")" if gpu_src else "-"
    total_gpus = sum(gpus.values())
    good_gpus = sum(gpus.get(n, 0) for n in good)
    lost_gpus = sum(gpus.get(n, 0) for n in bad)
    node_words = (f"{len(nodes)} node(s): {len(good)} passed ({', '.join(good) or 'none'}), "
                  f"{len(bad)} with a provider-side FAIL ({', '.join(sorted(bad)) or 'none'})"
                  + (f", {len(unjudged)} not judged ({', '.join(unjudged)})" if unjudged else ""))
    fails_src = "the provider-side FAIL findings of the runs compared (" + _some(
        sorted({f"{n}: {f.code}" for n in bad for f in by_node[n]
                if verdict.provider_side_fail(f, mounts)}), 10) + ")" if bad else \
        "the findings of the runs compared (no provider-side FAIL)"
    if hours is None:
        for name in ("billed GPU-hours", "good GPU-hours", "cost of a good GPU-hour",
                     "GPU-hours lost to failed nodes"):
            out.figures.append(_unknown(name, hours_words))
    elif no_count or not nodes:
        why = (f"no GPU count reported by {', '.join(no_count)}" if no_count
               else "no node reported its GPUs (no preflight)")
        for name in ("billed GPU-hours", "good GPU-hours", "cost of a good GPU-hour",
                     "GPU-hours lost to failed nodes"):
            out.figures.append(_unknown(name, why, hours_words))
    else:
        billed_gh = hours * total_gpus
        good_gh = hours * good_gpus
        lost_gh = hours * lost_gpus
        out.figures.append(Figure("billed GPU-hours", billed_gh, f"{billed_gh:.4g} GPU-h",
                                  f"{hours_words} x {total_gpus} GPU(s)", count_src))
        out.figures.append(Figure("good GPU-hours", good_gh, f"{good_gh:.4g} GPU-h",
                                  f"{hours:g} h x {good_gpus} GPU(s) of the nodes that passed; "
                                  + node_words, fails_src))
        if price is None or c is None or c.compute is None:
            why = c.why if c is not None and c.why else cost.NOT_PRICED
            out.figures.append(_unknown("cost of a good GPU-hour", why,
                                        f"{good_gh:g} good GPU-h"))
            out.figures.append(Figure("GPU-hours lost to failed nodes", None,
                                      f"{lost_gh:.4g} GPU-h, " + (
                                          why if why.startswith("not priced")
                                          else f"not priced: {why}"),
                                      f"{hours:g} h x {lost_gpus} GPU(s) of "
                                      f"{', '.join(sorted(bad)) or 'no node'}", fails_src))
        else:
            compute = float(c.compute + (c.reruns or 0.0))
            cur = price.currency
            if good_gh > 0:
                per = compute / good_gh
                out.figures.append(Figure(
                    "cost of a good GPU-hour", per, f"{_money(per, cur)} per good GPU-hour",
                    f"compute billed {_money(compute, cur)} ({price.gpu_hour:g} {cur} x "
                    f"{total_gpus} GPU(s) x {hours:g} h) / {good_gh:g} good GPU-h; the price "
                    f"is {price.gpu_hour:g} {cur} per GPU-hour",
                    f"pricing of the inventory; {c.window.name}"))
            else:
                out.figures.append(_unknown("cost of a good GPU-hour",
                                            "no GPU passed on the provider's side",
                                            node_words, fails_src))
            lost = lost_gh * price.gpu_hour
            out.figures.append(Figure("GPU-hours lost to failed nodes", lost,
                                      f"{lost_gh:.4g} GPU-h, {_money(lost, cur)}",
                                      f"{hours:g} h x {lost_gpus} GPU(s) of "
                                      f"{', '.join(sorted(bad)) or 'no node'} x "
                                      f"{price.gpu_hour:g} {cur}", fails_src))

    # --- dead on arrival: a provider-side FAIL at the node's first preflight or health run
    order = {str(r): i for i, r in enumerate(runs.sort_values(["started", "run_id"])["run_id"])}
    judged = [f for f in fs if f.step in JUDGED_STEPS and f.node is not None]
    judged_by_node: dict[str, list[Finding]] = {}
    for f in judged:
        judged_by_node.setdefault(str(f.node), []).append(f)
    first: dict[str, dict[str, str]] = {}  # node -> step -> its first run of that step
    for f in sorted(judged, key=lambda f: order.get(f.run_id, 0)):
        first.setdefault(str(f.node), {}).setdefault(f.step, f.run_id)
    if not first:
        out.figures.append(_unknown("dead on arrival", "no preflight or health run judged a "
                                    "node of this provider"))
    else:
        doa_codes: dict[str, list[str]] = {}
        for n, steps in first.items():
            codes = sorted({f.code for f in judged_by_node[n] if f.run_id in steps.values()
                            and verdict.provider_side_fail(f, mounts)})
            if codes:
                doa_codes[n] = codes
        doa = sorted(doa_codes)
        out.dead_on_arrival = doa
        share = len(doa) / len(first)
        out.figures.append(Figure(
            "dead on arrival", share, f"{len(doa)} of {len(first)} node(s) ({share:.0%})",
            "a provider-side FAIL in the node's first preflight or first health run: "
            + (", ".join(f"{n} ({', '.join(doa_codes[n])})" for n in doa) or "none"),
            "the nodes' first runs: " + "; ".join(
                f"{s} {rid} ({n} node(s))" for (s, rid), n in sorted(Counter(
                    (s, rid) for steps in first.values() for s, rid in steps.items()).items()))))

    # --- time from boot to the first run with a PASS and no provider-side FAIL
    boots = node_boot_times(run_paths, list(run_ids), provider)
    finished = {str(r): f for r, f in zip(runs["run_id"], runs["finished"], strict=True)
                if isinstance(f, str)}
    times: dict[str, float] = {}
    never: list[str] = []
    for n in nodes:
        mine = judged_by_node.get(n, [])
        ok_runs = [rid for rid in dict.fromkeys(f.run_id for f in mine)
                   if any(f.run_id == rid and f.severity == "PASS" for f in mine)
                   and not any(f.run_id == rid and verdict.provider_side_fail(f, mounts)
                               for f in mine) and rid in finished]
        if not ok_runs or n in bad:  # a node that FAILed on the provider's side is not healthy
            never.append(n)
            continue
        if n not in boots:
            continue
        at = min(cost.parse_time(finished[r]) for r in ok_runs)
        times[n] = max(0.0, (at - cost.parse_time(boots[n][0])).total_seconds() / 3600)
    no_boot = [n for n in nodes if n not in boots and n not in never]
    never_words = f"; never healthy in these runs: {', '.join(never)}" if never else ""
    if times:
        med = statistics.median(times.values())
        out.figures.append(Figure(
            "time to a healthy node", med,
            f"median {_hours(med)}, longest {_hours(max(times.values()))}",
            "boot to the end of the first run with a PASS and no provider-side FAIL: "
            + ", ".join(f"{n} {_hours(h)}" for n, h in sorted(times.items())) + never_words
            + (f"; boot time not reported by {', '.join(no_boot)}" if no_boot else ""),
            "boot: /proc/stat btime in preflight (" + _some([boots[n][1] for n in sorted(times)])
            + "); the run's end: run.json finished"))
    else:
        why = ("no node passed on the provider's side" if not nodes or len(never) == len(nodes)
               else "no boot time (preflight's /proc/stat btime) for " + ", ".join(no_boot))
        out.figures.append(_unknown("time to a healthy node", why + never_words))

    # --- the unit cost already shown
    u = next((u for u in units if u.provider == provider), None)
    if u is None or u.currency is None:
        out.figures.append(_unknown("per 1M training tokens", "not priced", "-", "cost per "
                                    "useful unit"))
    elif u.per_1m_tokens is None:
        out.figures.append(_unknown("per 1M training tokens", "no training throughput "
                                    "measured (run `gpuvet train`)", "-", "cost per useful unit"))
    else:
        out.figures.append(Figure("per 1M training tokens", u.per_1m_tokens,
                                  _money(u.per_1m_tokens, u.currency),
                                  "GPU-hour price / 3600 x 1e6 / tokens/s per GPU",
                                  "cost per useful unit (training step's throughput)"))
    return out


def all_good_hours(sel: Any, findings: Sequence[Finding], env: pd.DataFrame,
                   pocs: Sequence[Any], units: Sequence[Any]) -> list[GoodHours]:
    return [good_hours(p, sel.run_ids(p), sel.runs, findings, env, pocs, units, sel.paths)
            for p in sel.providers]


def table(gh: Sequence[GoodHours]) -> Table:
    """One row per provider and figure: its value, its inputs, where they came from."""
    return Table(TITLE, ("provider", "figure", "value", "inputs", "from"),
                 [(g.provider, f.name, f.text, f.inputs, f.source) for g in gh
                  for f in g.figures])
