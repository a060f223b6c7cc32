"""Providers side by side, measured under identical parameters.

Which runs: each provider's latest complete run of every step (preflight, nccl,
train), or the runs named. The identical-parameters gate comes first: runs whose
suite hashes differ are different experiments, and the comparison stops with
the parameters that differ. Then the numbers, next to the environment they
were measured in:

- busbw per message size and scope: median, min and max over rounds and nodes,
  and the ratio of each provider to the first with a 95% bootstrap interval
  (resampling each side's rounds x nodes, ratio of medians, fixed seed);
- stability: coefficient of variation per size, round drops, timeouts, #wrong;
- transports NCCL used, torch.distributed vs nccl-tests agreement;
- from the health step where it ran: memory bandwidth, products, host and peer
  bandwidth (the median of every GPU), the variant the GPUs measure like, FAILs;
- from the training step where it ran: step time, tokens/s/GPU, MFU, peak memory,
  restore, restart time, checkpoint persistence.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from orchestrator.analysis import answer, billing, cost, environment, frames, goodhours, verdict
from orchestrator.analysis.billing import train_value
from orchestrator.bands import size_text
from orchestrator.errors import UsageError, did_you_mean, shown
from orchestrator.records import Finding
from orchestrator.verdicts import Table, rails_table

STEPS = ("preflight", "health", "nccl", "train")
COMPLETE = ("passed", "failed")  # finished runs; running/interrupted/error ones are attempts
BOOTSTRAP = 2000
SEED = 20250101
STABLE_FROM = 16 << 20  # as the nccl judge: below 16 MiB round-to-round noise is latency
# tables of the decision that are empty when everything passed (nothing is missing then)
FOLDED = ("verdict reasons", "checks that passed")


class SuiteMismatch(UsageError):
    """Runs of different suites: not the same experiment (exit 2)."""


@dataclass
class Selection:
    providers: list[str]
    runs: pd.DataFrame  # the selected runs
    chosen: dict[str, dict[str, str]]  # provider -> step -> run id
    all_runs: pd.DataFrame  # every run of these providers (cost: failed attempts)

    def run_ids(self, provider: str | None = None) -> list[str]:
        ps = [provider] if provider else self.providers
        return list(dict.fromkeys(r for p in ps for r in self.chosen.get(p, {}).values()))

    @property
    def paths(self) -> dict[str, Path]:
        return {str(r): Path(str(p)) for r, p in zip(self.runs["run_id"], self.runs["path"],
                                                      strict=True)}


def _unknown(root: Path, want: Sequence[str], have: Sequence[str]) -> None:
    missing = [r for r in want if r not in set(have)]
    if missing:
        raise UsageError(f"no run {', '.join(shown(m) + did_you_mean(m, have) for m in missing)}"
                         f" under {root}", hint=f"see `gpuvet runs --results {root}`")


def select(root: Path, providers: Sequence[str] = (), run_ids: Sequence[str] = ()
           ) -> Selection:
    """Each provider's latest complete run per step (or the latest of the runs named)."""
    everything = frames.runs(root)
    if everything.empty:
        raise UsageError(f"the results store {root} holds no runs",
                         hint="run `gpuvet preflight` / `gpuvet nccl` first")
    if run_ids:
        _unknown(root, run_ids, list(everything["run_id"]))
        pool = everything[everything["run_id"].isin(list(run_ids))]
    else:
        pool = everything[everything["status"].isin(COMPLETE)]
    twice = sorted({p for p in providers if list(providers).count(p) > 1})
    if twice:
        raise UsageError(f"provider {', '.join(twice)} is named twice: a provider is not "
                         "compared with itself", hint="name two different providers with -p")
    if not providers:
        providers = sorted({p for ps in pool["providers"] for p in ps})
    known = sorted({p for ps in everything["providers"] for p in ps})
    unknown = [p for p in providers if p not in known]
    if unknown:
        raise UsageError(f"no runs of provider "
                         f"{', '.join(shown(p) + did_you_mean(p, known) for p in unknown)}"
                         f" under {root} (providers with runs: {', '.join(known) or 'none'})",
                         hint=f"see `gpuvet runs --results {root}`")
    pool = pool[pool["providers"].map(lambda ps: bool(set(ps) & set(providers)))]
    steps = frames.steps_of(root, list(pool["run_id"])) if not pool.empty else \
        pd.DataFrame(columns=["run_id", "provider", "step"])
    order = {r: i for i, r in enumerate(pool["run_id"])}  # oldest first
    chosen: dict[str, dict[str, str]] = {}
    for p in providers:
        mine = steps[steps["provider"] == p]
        chosen[p] = {}
        for step in STEPS:
            ids = sorted(set(mine[mine["step"] == step]["run_id"]), key=order.__getitem__)
            if ids:
                chosen[p][step] = ids[-1]
        if not chosen[p]:
            what = "run among the runs named" if run_ids else "complete (passed or failed) run"
            raise UsageError(f"provider {p} has no {what} with records under {root}",
                             hint="finish a run (`--resume`) or name runs with --runs")
    picked = {r for c in chosen.values() for r in c.values()}
    runs = everything[everything["run_id"].isin(picked)].reset_index(drop=True)
    mine_all = everything[everything["providers"].map(lambda ps: bool(set(ps) & set(providers)))]
    return Selection(list(providers), runs, chosen, mine_all.reset_index(drop=True))


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): d}


def _shown(v: Any, width: int = 40) -> str:
    """A parameter's value for a table cell: JSON (never a Python repr), cut to width."""
    text = "(not set)" if v is None else v if isinstance(v, str) else \
        json.dumps(v, sort_keys=True, default=str)
    return text if len(text) <= width else text[:width - 3] + "..."


def suite_gate(sel: Selection, docs: dict[str, dict[str, Any]], max_rows: int = 12) -> None:
    """Refuse runs of different suites with a table of the parameters that differ."""
    hashes = dict(zip(sel.runs["run_id"], sel.runs["suite_hash"], strict=True))
    if len(set(hashes.values())) <= 1:
        return
    by_hash: dict[str, str] = {}
    for rid in sel.runs["run_id"]:
        by_hash.setdefault(hashes[rid], rid)
    flat = {h: _flatten((docs.get(rid) or {}).get("suite") or {}) for h, rid in by_hash.items()}
    keys = sorted(set().union(*flat.values()))
    differ = [k for k in keys if len({json.dumps(f.get(k), sort_keys=True, default=str)
                                      for f in flat.values()}) > 1]
    heads = list(flat)
    owner = {h: ", ".join(dict.fromkeys(p for p in sel.providers for rid in sel.run_ids(p)
                                        if hashes.get(rid) == h)) or h for h in heads}
    cols = ["parameter", *(f"{owner[h]} (suite {h[:12]})" for h in heads)]
    rows = [[k, *(_shown(flat[h].get(k)) for h in heads)] for k in differ[:max_rows]]
    if len(differ) > max_rows:
        rows.append([f"... and {len(differ) - max_rows} more", *("" for _ in heads)])
    if not differ:
        rows.append(["(the suites hash differently but no parameter reads differently)",
                     *("" for _ in heads)])
    widths = [max(len(str(r[i])) for r in [cols, *rows]) for i in range(len(cols))]
    table = "\n".join("  " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True))
                      .rstrip() for r in [cols, *rows])
    raise SuiteMismatch("the runs were measured with different suites, so they are not "
                        f"compared; the parameters that differ:\n{table}",
                        hint="run every provider with the same --suite, or pick runs of one "
                             "suite with --runs")


# --- busbw side by side --------------------------------------------------------------------

def busbw_values(ms: pd.DataFrame, provider: str, scope: str, collective: str = "all_reduce"
                 ) -> dict[int, np.ndarray]:
    """busbw (out-of-place, nccl-tests) of one collective per size: every round of every
    node, of the nccl step (the fleet step's pair jobs are its own series, never rounds of
    the provider's multi-node run). An all_gather is never a value of all_reduce's sizes."""
    sel = ms[(ms["provider"] == provider) & (ms["metric"] == "busbw") & (ms["scope"] == scope)
             & (ms["engine"] == "nccl-tests") & (ms["inplace"] == False)]  # noqa: E712
    if "step" in sel.columns:
        sel = sel[sel["step"].fillna("nccl") == "nccl"]
    sel = sel[_collective_column(sel) == ("" if collective == "all_reduce" else collective)]
    # split by size on sorted arrays (a groupby of 10,000 sizes costs a second per call);
    # the stable sort keeps each size's values in the order they were stored
    sizes = pd.to_numeric(sel["size"], errors="coerce").to_numpy(dtype=float)
    vals = sel["value"].to_numpy(dtype=float)
    keep = ~np.isnan(sizes)
    sizes, vals = sizes[keep].astype(np.int64), vals[keep]
    if not len(sizes):
        return {}
    order = np.argsort(sizes, kind="stable")
    sizes, vals = sizes[order], vals[order]
    uniq, starts = np.unique(sizes, return_index=True)
    return {int(s): v for s, v in zip(uniq, np.split(vals, starts[1:]), strict=True)}


def _collective_column(ms: pd.DataFrame) -> pd.Series:
    """The frame's collective per row ("" for all_reduce); a frame without the column (made
    by hand, or before there were collectives) is all_reduce throughout."""
    if "collective" not in ms.columns:
        return pd.Series("", index=ms.index, dtype=object)
    return ms["collective"].fillna("").astype(str)


def collectives_measured(ms: pd.DataFrame) -> list[str]:
    """The collectives with busbw in the frame: all_reduce first, the others by name."""
    busbw = ms[ms["metric"] == "busbw"]
    others = sorted({c for c in _collective_column(busbw) if c})
    return ["all_reduce", *others]


def ratio_ci(a: np.ndarray, b: np.ndarray, *, n: int = BOOTSTRAP, seed: int = SEED
             ) -> tuple[float, float, float]:
    """median(b)/median(a) and its 95% percentile-bootstrap interval: each side's values
    (rounds x nodes) resampled with replacement, the ratio of medians recomputed."""
    ma = float(np.median(a))
    point = float(np.median(b)) / ma if ma > 0 else float("nan")
    if len(a) < 2 or len(b) < 2 or ma <= 0:
        return point, float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    ra = np.median(a[rng.integers(0, len(a), (n, len(a)))], axis=1)
    rb = np.median(b[rng.integers(0, len(b), (n, len(b)))], axis=1)
    ok = ra > 0
    ratios = rb[ok] / ra[ok]
    lo, hi = np.percentile(ratios, [2.5, 97.5])
    return point, float(lo), float(hi)


size_label = size_text  # a message size as people write it


def _r(v: float, nd: int = 3) -> float | None:
    return None if v != v else round(v, nd)  # NaN -> None (JSON, tables)


def busbw_tables(ms: pd.DataFrame, providers: Sequence[str], *, min_size: int = 1 << 20
                 ) -> list[Table]:
    """One block per collective: all_reduce's always (it says when there is none), then
    each other collective the runs measured."""
    return [busbw_table(ms, providers, min_size=min_size, collective=c)
            for c in collectives_measured(ms)]


def busbw_table(ms: pd.DataFrame, providers: Sequence[str], *, min_size: int = 1 << 20,
                collective: str = "all_reduce") -> Table:
    """Per scope and size: each provider's median [min-max] busbw of one collective, and
    each other provider's ratio to the first with its interval."""
    base = providers[0]
    cols: list[str] = ["scope", "size"]
    for p in providers:
        cols += [f"{p} median GB/s", f"{p} min-max"]
    for p in providers[1:]:
        cols += [f"{p}/{base}", f"{p}/{base} 95% CI"]
    rows = []
    for scope in ("single", "multi"):
        vals = {p: busbw_values(ms, p, scope, collective) for p in providers}
        sizes = sorted({s for v in vals.values() for s in v if s >= min_size})
        for s in sizes:
            row: list[Any] = [scope, size_label(s)]
            for p in providers:
                v = vals[p].get(s)
                row += [None, None] if v is None else [
                    round(float(np.median(v)), 2), f"{v.min():.2f}-{v.max():.2f}"]
            for p in providers[1:]:
                a, b = vals[base].get(s), vals[p].get(s)
                if a is None or b is None:
                    row += [None, None]
                    continue
                point, lo, hi = ratio_ci(a, b)
                row += [_r(point), "-" if lo != lo else f"{lo:.3f}-{hi:.3f}"]
            rows.append(tuple(row))
    return Table(f"busbw ({collective}, out-of-place)", tuple(cols), rows)


def stability_table(ms: pd.DataFrame, findings: Sequence[Finding], providers: Sequence[str]
                    ) -> Table:
    """Round-to-round stability per provider and scope, from 16 MiB up."""
    rows = []
    for p in providers:
        fs = [f for f in findings if f.provider == p and f.step == "nccl"]
        for scope in ("single", "multi"):
            sel = ms[(ms["provider"] == p) & (ms["metric"] == "busbw") & (ms["scope"] == scope)
                     & (ms["engine"] == "nccl-tests") & (ms["inplace"] == False)  # noqa: E712
                     & (ms["size"] >= STABLE_FROM)]
            if sel.empty:
                continue
            g = sel.groupby(["nodes", "size"])["value"]
            cv = (g.std(ddof=1) / g.mean()).dropna()
            scoped = [f for f in fs if (f.details.get("scope") or scope) == scope]
            count = {c: sum(f.code == c for f in scoped) for c in
                     ("NCCL_ROUND_DROP", "NCCL_TIMEOUT", "NCCL_TEST_FAILURE")}
            rows.append((p, scope, int(sel["round"].nunique()), int(sel["nodes"].nunique()),
                         _r(float(cv.median()) if len(cv) else float("nan"), 4),
                         _r(float(cv.max()) if len(cv) else float("nan"), 4),
                         count["NCCL_ROUND_DROP"], count["NCCL_TIMEOUT"],
                         count["NCCL_TEST_FAILURE"]))
    return Table("stability (busbw from 16 MiB)", ("provider", "scope", "rounds", "series",
                                                   "cv median", "cv max", "round drops",
                                                   "timeouts", "failures/#wrong"), rows)


def transports_table(findings: Sequence[Finding], providers: Sequence[str]) -> Table:
    rows = []
    for p in providers:
        for f in findings:
            if f.provider == p and f.code == "NCCL_TRANSPORTS":
                rows.append((p, f.label, ", ".join(f.details.get("transports") or []) or "-",
                             f.message))
    return Table("transports NCCL used", ("provider", "where", "transports", "message"), rows)


def fleet_rails_table(findings: Sequence[Finding], providers: Sequence[str]) -> Table:
    """The fleet step's rail table where a selected run (a pipeline with --fleet) has one;
    left out of the comparison, not shown empty, where none has."""
    return rails_table(findings, providers, "fleet: rails, one HCA at a time")


def agreement_table(findings: Sequence[Finding], providers: Sequence[str]) -> Table:
    rows = [(f.provider, f.label, f.severity, f.message) for f in findings
            if f.provider in providers and f.code == "TORCH_VS_NCCL_TESTS"]
    return Table("torch.distributed vs nccl-tests", ("provider", "where", "severity", "message"),
                 rows)


# --- training ------------------------------------------------------------------------------

TRAIN_METRICS = (("step_time_s", "step time (median)", "s", "median"),
                 ("step_time_p90_s", "step time (p90)", "s", "median"),
                 ("tokens_per_s_per_gpu", "tokens/s per GPU", "tokens/s", "median"),
                 ("mfu", "MFU", "ratio", "median"),
                 ("deterministic_mfu", "MFU of the verified, deterministic steps", "ratio",
                  "median"),
                 ("peak_mem_allocated_bytes", "peak memory allocated", "GB", "max"),
                 ("peak_mem_reserved_bytes", "peak memory reserved", "GB", "max"),
                 ("ckpt_size_bytes", "checkpoint size", "GB", "max"),
                 ("ckpt_save_s", "checkpoint save", "s", "median"),
                 ("ckpt_load_s", "checkpoint load", "s", "median"),
                 ("restart_s", "restart (kill to first step)", "s", "median"),
                 ("steps_lost", "steps lost", "steps", "max"))
RESTORE_CODES = ("TRAIN_RESTORE_OK", "TRAIN_RESTORE_MISMATCH", "TRAIN_RESTORE_FAILED")
PERSIST_CODES = ("CKPT_NOT_PERSISTENT", "CKPT_SHARED", "CKPT_DIR", "CKPT_DIR_EPHEMERAL")


def train_table(ms: pd.DataFrame, findings: Sequence[Finding], providers: Sequence[str]
                ) -> Table:
    """Training results side by side; empty (no rows) where no provider trained."""
    rows: list[tuple[Any, ...]] = []
    if ms.empty or not (ms["scope"] == "train").any():
        return Table("training", ("what", *providers), rows)
    for metric, label, unit, how in TRAIN_METRICS:
        vals = [train_value(ms, p, metric, how) for p in providers]
        if all(v is None for v in vals):
            continue
        rows.append((f"{label} ({unit})", *(None if v is None else round(v, 4) for v in vals)))
    for label, codes in (("restore", RESTORE_CODES), ("checkpoint storage", PERSIST_CODES)):
        cells = []
        for p in providers:
            fs = [f for f in findings if f.provider == p and f.code in codes]
            cells.append("; ".join(f"{f.severity} {f.code}" for f in fs) or "not measured")
        rows.append((label, *cells))
    return Table("training", ("what", *providers), rows)


# --- health --------------------------------------------------------------------------------

HEALTH_METRICS = (("health.membw.copy_gbps", "memory copy (read + written)", "GB/s"),
                  ("health.membw.read_gbps", "memory read", "GB/s"),
                  ("health.matmul.bf16_tflops", "bf16 products, burst", "TFLOP/s"),
                  ("health.sustained.tflops", "bf16 products, sustained", "TFLOP/s"),
                  ("health.matmul.fp64_tflops", "fp64 products", "TFLOP/s"),
                  ("health.matmul.fp8_tflops", "fp8 products", "TFLOP/s"),
                  ("health.pcie.h2d_gbps", "host to device (pinned)", "GB/s"),
                  ("health.pcie.d2h_gbps", "device to host (pinned)", "GB/s"),
                  ("health.peer.min_gbps", "slowest peer pair, one way", "GB/s"))


def health_table(ms: pd.DataFrame, findings: Sequence[Finding], providers: Sequence[str]
                 ) -> Table:
    """The health step side by side: the median over every GPU measured, what the GPUs
    measure like, and the GPUs that failed; empty (no rows) where the step did not run."""
    rows: list[tuple[Any, ...]] = []
    if ms.empty or not (ms["scope"] == "health").any():
        return Table("GPU health", ("what", *providers), rows)
    sel = ms[ms["scope"] == "health"]
    for metric, label, unit in HEALTH_METRICS:
        vals = []
        for p in providers:
            v = sel[(sel["provider"] == p) & (sel["metric"] == metric)]["value"]
            vals.append(None if v.empty else round(float(v.median()), 1))
        if any(v is not None for v in vals):
            rows.append((f"{label} ({unit}, median of the GPUs)", *vals))
    like, bad = [], []
    for p in providers:
        mine = [f for f in findings if f.provider == p and f.step == "health"]
        names = sorted({str(f.details.get("variant")) for f in mine
                        if f.code == "HEALTH_VARIANT" and f.details.get("variant")})
        ordered = sorted({str(f.details.get("ordered")) for f in mine
                          if f.code == "HEALTH_VARIANT" and f.details.get("ordered")
                          and f.details.get("ordered") not in names})
        like.append((", ".join(names) or "not measured")
                    + (f" (ordered {', '.join(ordered)}: NOT AS ORDERED)" if ordered else ""))
        fails = sorted({f.code for f in mine if f.severity == "FAIL"})
        warns = sorted({f.code for f in mine if f.severity == "WARN"})
        bad.append("; ".join([f"FAIL {', '.join(fails)}"] * bool(fails)
                             + [f"WARN {', '.join(warns)}"] * bool(warns)) or "none")
    rows += [("measures like", *like), ("FAIL and WARN findings", *bad)]
    return Table("GPU health", ("what", *providers), rows)


# --- the whole comparison ------------------------------------------------------------------

@dataclass
class Comparison:
    root: Path
    selection: Selection
    findings: list[Finding]
    measurements: pd.DataFrame
    env: pd.DataFrame  # latest environment facts of the selected runs
    verdicts: list[Any]  # verdict.ProviderVerdict
    costs: list[Any]  # cost.PocCost (empty with --no-cost)
    units: list[Any]  # cost.UnitCost
    currencies_apart: list[str]
    tables: list[Table]
    orders: dict[str, dict[str, Any]] = field(default_factory=dict)  # provider -> expect
    headlines: list[answer.Headline] = field(default_factory=list)  # one per provider, first shown
    good_hours: list[Any] = field(default_factory=list)  # goodhours.GoodHours (with cost)

    @property
    def providers(self) -> list[str]:
        return self.selection.providers

    @property
    def empty_sections(self) -> list[str]:
        """The tables with nothing to show (a store of PoC folders has no busbw, ...)."""
        return [t.title for t in self.tables if not t.rows and t.title not in FOLDED]

    def as_json(self) -> dict[str, Any]:
        return {"providers": self.providers, "runs": self.selection.chosen,
                "headlines": [h.as_json() for h in self.headlines],
                "orders": self.orders,
                "verdicts": [{"provider": v.provider, "verdict": v.verdict,
                              "decisive": v.decisive,
                              "reasons": [r.__dict__ for r in v.reasons]} for v in self.verdicts],
                "currencies_apart": self.currencies_apart,
                "good_gpu_hours": [g.as_json() for g in self.good_hours],
                "empty_sections": self.empty_sections,
                "tables": [t.as_json() for t in self.tables]}


def build(root: Path, providers: Sequence[str] = (), run_ids: Sequence[str] = (), *,
          with_cost: bool = True, inventory: Path | None = None,
          rates: dict[str, float] | None = None,
          override: billing.Override | None = None) -> Comparison:
    """Select, gate, load, and make every table the terminal, JSON and report show."""
    sel = select(root, providers, run_ids)
    ids = list(sel.runs["run_id"])
    docs = frames.run_documents(root, ids)
    suite_gate(sel, docs)
    inv_text = None
    if inventory is not None:
        try:
            inv_text = inventory.read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"cannot read {inventory}: {exc.strerror}") from None
    # each provider's records from its own chosen runs only
    allowed = {(p, r) for p in sel.providers for r in sel.run_ids(p)}
    fs = [f for f in frames.finding_records(root, ids) if (f.provider, f.run_id) in allowed]
    ms = frames.measurements(root, ids)
    # a boolean Series, not a list: an empty list would select no columns of an empty frame
    ms = ms[pd.Series([(p, r) in allowed for p, r in zip(ms["provider"], ms["run_id"],
                                                          strict=True)], index=ms.index,
                      dtype=bool)]
    env = environment.latest(environment.environment(sel.runs), sel.runs)
    pocs: list[Any] = []
    units: list[Any] = []
    if with_cost:
        pocs, units = billing.costs_of(sel, ms, env, docs, inv_text, str(inventory), override)
    orders = {p: answer.orders_of(sel, p) for p in sel.providers}
    health = any(f.step == "health" for f in fs)
    vs = [verdict.provider_verdict(p, fs, ms, env, sel.paths, orders[p], health)
          for p in sel.providers]
    apart = cost.currencies_apart(pocs, rates or {})
    tables = [answer.verdicts_table(vs), answer.reasons_table(vs), answer.folded_table(vs),
              environment.diff_table(env, sel.providers, orders),
              *busbw_tables(ms, sel.providers),
              stability_table(ms, fs, sel.providers), transports_table(fs, sel.providers),
              *[t for t in [fleet_rails_table(fs, sel.providers)] if t.rows],
              agreement_table(fs, sel.providers), health_table(ms, fs, sel.providers),
              train_table(ms, fs, sel.providers)]
    good: list[Any] = []
    if with_cost:
        good = goodhours.all_good_hours(sel, fs, env, pocs, units)
        tables += [cost.cost_table(pocs, rates or {}), cost.sources_table(pocs),
                   cost.unit_table(units), goodhours.table(good)]
    heads = answer.headlines(vs, pocs)
    return Comparison(root, sel, fs, ms, env, vs, pocs, units, apart, tables, orders, heads,
                      good)
