"""The windows a provider's PoC is billed over, and its prices, found in the store.

For each provider of a comparison (`analysis/cost.py` does the arithmetic):

- **gpuvet's steps**: the selected runs' own `started`/`finished`, plus every
  other run of the provider in that time (reruns, interrupted and errored
  attempts), and the attempts just before the first selected run (the
  unbroken line of unfinished runs before it);
- **instance up since boot**: from the earliest boot time the provider's nodes
  reported in preflight (`/proc/stat` btime) to the last selected run's end;
- **billed since**: `pricing.billed_since` in the inventory or `--billed-since`
  (overrides the start of the instance window);
- an imported PoC folder's window (checked-at.txt or the oldest file's time,
  to the newest file's time), recorded by `gpuvet import poc`;
- `--hours H` or `--window START/END`: the whole window, as given.

A provider without a price, or whose GPU count no node reported, is still
compared: its cost says why it has no figure.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd

from orchestrator.analysis import cost
from orchestrator.analysis.environment import gpu_total, preflight_docs, provider_values
from orchestrator.errors import UsageError

COMPLETE = ("passed", "failed")
STEPS_WINDOW = "gpuvet's steps"
BOOT_WINDOW = "instance up since boot"


@dataclass(frozen=True)
class Override:
    """What the command line says about the billed window."""

    hours: float | None = None  # --hours
    billed_since: str | None = None  # --billed-since
    window: tuple[str, str] | None = None  # --window START/END

    def __post_init__(self) -> None:
        if self.hours is not None and self.hours < 0:
            raise UsageError(f"--hours {self.hours:g} is negative", hint="give the hours billed")
        if self.window is not None:
            a, b = (cost.parse_time(t) for t in self.window)
            if b < a:
                raise UsageError(f"--window {'/'.join(self.window)} ends before it starts",
                                 hint="--window START/END, START first")
        if self.billed_since is not None:
            cost.parse_time(self.billed_since)


def parse_window(value: str | None) -> tuple[str, str] | None:
    if value is None:
        return None
    parts = value.split("/")
    if len(parts) != 2 or not all(parts):
        raise UsageError(f"--window {value!r} is not START/END",
                         hint="e.g. --window 2026-01-02T08:00:00Z/2026-01-02T11:30:00Z")
    return parts[0], parts[1]


def pricing(sel: Any, provider: str, inventory_text: str | None, inventory_name: str
            ) -> tuple[cost.Pricing | None, str]:
    """The provider's pricing (None when it has none) and where it was looked for."""
    if inventory_text is not None:
        return cost.pricing_of(inventory_text, provider, inventory_name), inventory_name
    newest = sel.runs[sel.runs["run_id"].isin(sel.run_ids(provider))].iloc[-1]
    return (cost.run_pricing(Path(str(newest["path"])), provider),
            f"the inventory copy of run {newest['run_id']}")


def _iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def boot_times(sel: Any, provider: str) -> list[str]:
    """The boot times the provider's nodes reported in the selected runs' preflight."""
    out = []
    for rid in sel.run_ids(provider):
        run_dir = sel.paths.get(rid)
        if run_dir is None:
            continue
        for _node, _f, doc in preflight_docs(run_dir, provider):
            bt = doc.get("boot_time")
            if isinstance(bt, str):
                out.append(bt)
    return out


def _attempts(sel: Any, provider: str, ids: list[str], start: datetime | None, end: datetime
              ) -> pd.DataFrame:
    """The provider's other runs in the window: reruns and interrupted attempts; without a
    known start, those in the selected runs' span and the unfinished ones just before."""
    mine = sel.all_runs[sel.all_runs["providers"].map(lambda ps: provider in ps)]
    mine = mine.sort_values(["started", "run_id"])
    first = min(cost.parse_time(str(s)) for s in mine[mine["run_id"].isin(ids)]["started"])
    keep = []
    before: list[Any] = []
    for _, r in mine.iterrows():
        if r["run_id"] in ids:
            continue
        t = cost.parse_time(str(r["started"]))
        if t > end:
            continue
        if start is not None:
            if t >= start:
                keep.append(r["run_id"])
        elif t >= first:
            keep.append(r["run_id"])
        else:  # before the first selected run: counted back to the last complete run
            before = [] if r["status"] in COMPLETE else [*before, r["run_id"]]
    return mine[mine["run_id"].isin(keep + ([] if start is not None else before))]


def _hours(runs: pd.DataFrame) -> float:
    return sum(cost.hours_between(str(s), f if isinstance(f, str) else None)
               for s, f in zip(runs["started"], runs["finished"], strict=True))


def windows(sel: Any, provider: str, docs: dict[str, dict[str, Any]],
            pr: cost.Pricing | None, ov: Override) -> list[cost.Window]:
    """The windows shown for one provider: gpuvet's steps, then the billed one."""
    ids = sel.run_ids(provider)
    mine = sel.runs[sel.runs["run_id"].isin(ids)]
    ends = [cost.parse_time(f) for f in mine["finished"] if isinstance(f, str)]
    starts = [cost.parse_time(str(s)) for s in mine["started"]]
    end = max(ends) if ends else max(starts)
    if ov.hours is not None:
        return [cost.Window("--hours", ov.hours, "given on the command line")]
    if ov.window is not None:
        a, b = (cost.parse_time(t) for t in ov.window)
        return [cost.Window("--window", (b - a).total_seconds() / 3600,
                            f"given on the command line ({'/'.join(ov.window)})")]
    out: list[cost.Window] = []
    poc = [((docs.get(r) or {}).get("source") or {}) for r in ids]
    poc = [s for s in poc if s.get("kind") == "poc"]
    if poc:
        w: list[dict[str, str]] = [s["window"] for s in poc if isinstance(s.get("window"), dict)
                                   and s["window"].get("start") and s["window"].get("end")]
        if not w:
            why = next((s["window"].get("why") for s in poc if isinstance(s.get("window"), dict)
                        and s["window"].get("why")), "the folder tells no time")
            out.append(cost.Window("PoC folder", None, f"{why}: pass --hours or --window"))
        else:
            a = min(cost.parse_time(x["start"]) for x in w)
            b = max(cost.parse_time(x["end"]) for x in w)
            out.append(cost.Window("PoC folder", (b - a).total_seconds() / 3600,
                                   f"{w[0]['start_from']} to {w[0]['end_from']}"))
    live = mine[~mine["run_id"].isin([r for r in ids if ((docs.get(r) or {}).get("source") or {})
                                      .get("kind") == "poc"])]
    imported = live[live["command"].astype(str).str.startswith("import")]
    if not imported.empty and len(imported) == len(live):
        out.append(cost.Window(STEPS_WINDOW, None, "imported logs carry no rental time (their "
                               "run only read them): pass --hours or --window"))
    elif not live.empty or not poc:
        others = _attempts(sel, provider, ids, None, end)
        useful, failed = _hours(mine), _hours(others)
        out.append(cost.Window(STEPS_WINDOW, useful + failed,
                               "the runs' started/finished (run.json)", failed, len(others)))
    since = ov.billed_since or (pr.billed_since if pr else None)
    boots = boot_times(sel, provider)
    if since is not None:
        start = cost.parse_time(since)
        label = "--billed-since" if ov.billed_since else "pricing.billed_since"
        name = "billed since"
    elif boots:
        start = min(cost.parse_time(b) for b in boots)
        label, name = "the nodes' boot time (/proc/stat btime, preflight)", BOOT_WINDOW
    else:
        return out
    others = _attempts(sel, provider, ids, start, end)
    hours = max(0.0, (end - start).total_seconds() / 3600)
    out.append(cost.Window(name, hours, f"{label}: {_iso(start)} to the last run's end "
                                        f"{_iso(end)}", min(hours, _hours(others)), len(others)))
    return out


def train_value(ms: pd.DataFrame, provider: str, metric: str, how: str = "median"
                ) -> float | None:
    """A training metric of the provider (bytes as GB): median, or max with how="max"."""
    if ms.empty:
        return None
    sel = ms[(ms["provider"] == provider) & (ms["scope"] == "train") & (ms["metric"] == metric)]
    if sel.empty:
        return None
    v = float(sel["value"].max() if how == "max" else sel["value"].median())
    return v / 1e9 if metric.endswith("_bytes") else v


def costs_of(sel: Any, ms: pd.DataFrame, env: pd.DataFrame, docs: dict[str, dict[str, Any]],
             inventory_text: str | None = None, inventory_name: str = "-i",
             override: Override | None = None) -> tuple[list[Any], list[Any]]:
    """PoC cost of every selected provider over each of its windows, and per unit."""
    ov = override or Override()
    pocs, units = [], []
    for p in sel.providers:
        pr, _where = pricing(sel, p, inventory_text, inventory_name)
        gpus = gpu_total(env, p)
        per_node = provider_values(env, p, "gpu_count")
        models = provider_values(env, p, "gpu_model")
        ckpt = train_value(ms, p, "ckpt_size_bytes", "max")
        for w in windows(sel, p, docs, pr, ov):
            pocs.append(cost.poc_cost(p, pr, gpus, w, ckpt))
        units.append(cost.unit_cost(p, pr, gpus, int(per_node[0]) if len(per_node) == 1
                                    else None,
                                    train_value(ms, p, "tokens_per_s_per_gpu"),
                                    models[0] if len(models) == 1 else None))
    return pocs, units
