"""Baselines: what a provider measured when it was accepted, per series.

A baseline is per (provider, GPU model, GPU count, suite hash, metric,
message size or training preset): the preset is part of the suite, so of its
hash. It is built from accepted history: runs someone named (`gpuvet baseline
set --runs`), the provider's last N complete runs (`--last N`), or, when none
was set by hand, the last N complete runs before the judged one, with failed
runs and runs with a FAIL finding of that provider left out (a known-bad run
is not what "normal" looks like).

Samples are read through the one loader (analysis/frames.py): for nccl the
out-of-place busbw of every (round, node) at each message size from
`MIN_SIZE` up (below it a round lasts microseconds and differences are
latency jitter, as the round-stability judge says too); for training the
step time, throughput, MFU and checkpoint timings.

The machine class (GPU model, GPUs per node) comes from the run's own
preflight facts, never from the inventory: the inventory says what was
ordered, and a node swapped for another model is exactly what a baseline
must not absorb. A run without preflight facts has an unknown class, which
matches any.
"""

from __future__ import annotations

import getpass
import json
import socket
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from ruamel.yaml import YAML

from orchestrator import bands as bands_mod
from orchestrator.analysis import frames
from orchestrator.bands import Band
from orchestrator.errors import UsageError, did_you_mean, shown
from orchestrator.index import BaselineRecord, Index, add_baselines
from orchestrator.verdicts import Table

MIN_SIZE = 16 << 20
DEFAULT_LAST = 10
UNKNOWN = "unknown"

# metric -> +1 when higher is better, -1 when lower is better
METRICS: dict[str, int] = {
    "busbw": +1,
    "step_time_s": -1,
    "step_time_p90_s": -1,
    "tokens_per_s_per_gpu": +1,
    "tokens_per_s_per_rank": +1,
    "mfu": +1,
    "deterministic_step_time_s": -1,
    "deterministic_tokens_per_s_per_gpu": +1,
    "deterministic_mfu": +1,
    "ckpt_save_s": -1,
    "ckpt_load_s": -1,
    "ckpt_write_gbs": +1,
    "restart_s": -1,
    # the health step, per GPU (tags.gpu): each GPU of a node is a sample of the series
    "health.membw.copy_gbps": +1,
    "health.membw.read_gbps": +1,
    "health.matmul.bf16_tflops": +1,
    "health.matmul.fp16_tflops": +1,
    "health.matmul.tf32_tflops": +1,
    "health.matmul.fp32_tflops": +1,
    "health.matmul.fp64_tflops": +1,
    "health.matmul.fp8_tflops": +1,
    "health.sustained.tflops": +1,
    "health.pcie.h2d_gbps": +1,
    "health.pcie.d2h_gbps": +1,
    "health.peer.min_gbps": +1,
}


@dataclass(frozen=True, order=True)
class SeriesKey:
    """One comparable series of a provider."""

    provider: str
    scope: str  # single | multi | train
    engine: str
    metric: str
    size: int  # bytes; -1 where the metric has no message size
    span: str  # "single" (one node's GPUs) or "multi" (across nodes)
    # the nccl collective; "" for all_reduce (the keys series had before there were others)
    # and for metrics of no collective
    collective: str = ""

    @property
    def label(self) -> str:
        size = "" if self.size < 0 else f" {human_size(self.size)}"
        where = self.scope if self.scope != "train" else f"train {self.span}"
        eng = "" if self.engine in ("nccl-tests", "train") else f" ({self.engine})"
        coll = f" {self.collective}" if self.collective else ""
        return f"{self.metric}{coll} {where}{eng}{size}"

    def as_json(self) -> dict[str, object]:
        """The key's fields; `collective` only where there is one other than all_reduce, so
        the JSON of an all_reduce series reads as it did before there were others."""
        out: dict[str, object] = asdict(self)
        if not self.collective:
            del out["collective"]
        return out


@dataclass(frozen=True)
class Sample:
    key: SeriesKey
    value: float
    node: str | None  # the one node it was measured on; None across nodes
    run_id: str


@dataclass(frozen=True)
class MachineClass:
    gpu_model: str = UNKNOWN
    gpu_count: int = 0  # GPUs per node

    @property
    def known(self) -> bool:
        return self.gpu_model != UNKNOWN

    def matches(self, other: MachineClass) -> bool:
        return not (self.known and other.known) or self == other

    def __str__(self) -> str:
        return f"{self.gpu_count} x {self.gpu_model}" if self.known else UNKNOWN


def human_size(n: int) -> str:
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= f and n % f == 0:
            return f"{n // f} {unit}"
    return f"{n} B"


# --- samples ---------------------------------------------------------------------------------

def sample_frame(root: Path, provider: str, *, min_size: int = MIN_SIZE,
                 run_ids: Sequence[str] | None = None) -> pd.DataFrame:
    """The provider's judged measurements, one row per sample, with series columns."""
    df = frames.measurements(root, run_ids, providers=[provider], metrics=list(METRICS))
    if df.empty:
        return df.assign(size_key=pd.Series(dtype=int), span=pd.Series(dtype=str),
                         node=pd.Series(dtype=object), collective=pd.Series(dtype=str))
    busbw = df["metric"] == "busbw"
    keep = ~busbw | ((df["inplace"] == False) & (df["size"].fillna(-1) >= min_size))  # noqa: E712
    # the fleet step's pairs and groups are judged against each other, not as a series of
    # the provider: a pair's busbw is not its provider's multi-node all_reduce
    keep &= df["step"] != "fleet"
    df = df[keep & df["value"].notna()].copy()
    df["size_key"] = df["size"].fillna(-1).astype(int)
    many = df["nodes"].fillna("").str.contains(",")
    df["span"] = np.where((df["scope"] == "multi") | many, "multi", "single")
    single = (df["span"] == "single") & (df["nodes"].fillna("") != "")
    df["node"] = df["nodes"].where(single, None)
    df["collective"] = df["collective"].fillna("").astype(str)
    return df


def to_samples(df: pd.DataFrame) -> list[Sample]:
    cols = ["provider", "scope", "engine", "metric", "size_key", "span", "value", "node",
            "run_id", "collective"]
    if "collective" not in df.columns:
        df = df.assign(collective="")
    return [Sample(SeriesKey(p, sc, e, m, int(sz), sp, str(c or "")), float(v),
                   None if nd is None or (isinstance(nd, float) and np.isnan(nd)) else str(nd),
                   r)
            for p, sc, e, m, sz, sp, v, nd, r, c in df[cols].itertuples(index=False,
                                                                         name=None)]


# --- machine class ---------------------------------------------------------------------------

def machine_class(root: Path, run_id: str, nodes: Sequence[str]) -> MachineClass:
    """GPU model and GPUs per node from the run's preflight facts of these nodes."""
    names: Counter[str] = Counter()
    counts: Counter[int] = Counter()
    for node in nodes:
        path = root / run_id / "nodes" / node / "preflight" / "facts.json"
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            gpus = doc["facts"]["query_gpu"]["gpus"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not isinstance(gpus, list) or not gpus:
            continue
        names.update(str(g.get("name")) for g in gpus if isinstance(g, dict) and g.get("name"))
        counts[len(gpus)] += 1
    if not names:
        return MachineClass()
    return MachineClass(names.most_common(1)[0][0], counts.most_common(1)[0][0])


def provider_nodes(root: Path, run_id: str, provider: str, df: pd.DataFrame) -> list[str]:
    """The provider's nodes in a run: from its single-node samples and its findings."""
    nodes = set(df.loc[(df["run_id"] == run_id) & df["node"].notna(), "node"])
    f = frames.findings(root, [run_id])
    nodes |= set(f.loc[(f["provider"] == provider) & f["node"].notna(), "node"])
    return sorted(str(n) for n in nodes)


# --- which runs are the baseline ------------------------------------------------------------

JUDGED_LEFT_OUT = " left out: the run judged is never its own baseline"


@dataclass(frozen=True)
class BaselineSource:
    kind: str  # "stored" | "automatic"
    runs: tuple[str, ...]
    machine: MachineClass
    suite_hash: str
    set_at: str | None = None
    set_by: str | None = None
    how: str | None = None
    left_out: tuple[str, ...] = ()  # candidate runs skipped, with why

    @property
    def describe(self) -> str:
        if self.kind == "stored":
            judged = [w for w in self.left_out if w.endswith(JUDGED_LEFT_OUT)]
            note = f"; {judged[0]}" if judged else ""
            return (f"set by {self.set_by} at {self.set_at} ({self.how}; {len(self.runs)} "
                    f"run(s){note})")
        if not self.runs:
            return "none: no complete earlier run of this suite and machine class"
        return f"the last {len(self.runs)} complete run(s) before this one"


def complete_runs(root: Path, provider: str, suite_hash: str, candidates: Sequence[str],
                  runs: pd.DataFrame) -> tuple[list[str], list[str]]:
    """Candidates that finished as passed with no FAIL finding of this provider."""
    status = dict(zip(runs["run_id"], runs["status"], strict=True))
    hashes = dict(zip(runs["run_id"], runs["suite_hash"], strict=True))
    ok, left = [], []
    for r in candidates:
        if hashes.get(r) != suite_hash:
            left.append(f"{r}: another suite ({hashes.get(r)})")
        elif status.get(r) != "passed":
            left.append(f"{r}: status {status.get(r)}")
        else:
            ok.append(r)
    if ok:
        f = frames.findings(root, ok)
        bad = set(f.loc[(f["severity"] == "FAIL") & (f["provider"] == provider), "run_id"])
        left += [f"{r}: has FAIL findings" for r in ok if r in bad]
        ok = [r for r in ok if r not in bad]
    return ok, left


def automatic(root: Path, provider: str, judged: str, df: pd.DataFrame, runs: pd.DataFrame,
              machine: MachineClass, last: int = DEFAULT_LAST) -> BaselineSource:
    """The last `last` complete runs before `judged` of the same suite and machine class."""
    order = list(runs["run_id"])
    suite_hash = str(runs.loc[runs["run_id"] == judged, "suite_hash"].iloc[0])
    # runs that measured what the judged run measured (an nccl run says nothing of training)
    kinds = ["scope", "engine", "metric", "size_key", "span", "collective"]
    judged_kinds = df.loc[df["run_id"] == judged, kinds].drop_duplicates()
    with_samples = set(df.merge(judged_kinds, on=kinds)["run_id"])
    earlier = [r for r in order[:order.index(judged)] if r in with_samples]
    ok, left = complete_runs(root, provider, suite_hash, earlier, runs)
    chosen: list[str] = []
    for r in reversed(ok):
        if len(chosen) == last:
            break
        other = machine_class(root, r, provider_nodes(root, r, provider, df))
        if machine.matches(other):
            chosen.append(r)
        else:
            left.append(f"{r}: another machine class ({other})")
    return BaselineSource("automatic", tuple(reversed(chosen)), machine, suite_hash,
                          how=f"last {last}", left_out=tuple(left))


def stored(root: Path, provider: str, suite_hash: str,
           machine: MachineClass) -> list[BaselineRecord]:
    """The baseline set by hand for this provider, suite and a matching machine class."""
    recs = [r for r in Index(root).baselines(provider, suite_hash)
            if machine.matches(MachineClass(r.gpu_model, r.gpu_count))]
    if not recs:
        return []
    latest = max(r.set_at for r in recs)
    return [r for r in recs if r.set_at == latest]


def resolve(root: Path, provider: str, judged: str, df: pd.DataFrame, runs: pd.DataFrame,
            last: int = DEFAULT_LAST) -> BaselineSource:
    """The baseline a run is judged against: set by hand, or else the automatic one."""
    machine = machine_class(root, judged, provider_nodes(root, judged, provider, df))
    suite_hash = str(runs.loc[runs["run_id"] == judged, "suite_hash"].iloc[0])
    recs = stored(root, provider, suite_hash, machine)
    if recs:
        r = recs[0]
        # a baseline set from the runs that include the one judged (`baseline set --last 1`,
        # then `regress`) holds it; a run is never judged against itself: it is left out
        kept = tuple(x for x in r.runs if x != judged)
        left = (f"{judged}{JUDGED_LEFT_OUT}",) if len(kept) < len(r.runs) else ()
        return BaselineSource("stored", kept, machine, suite_hash, r.set_at, r.set_by,
                              r.how, left)
    return automatic(root, provider, judged, df, runs, machine, last)


# --- reference bands, shown beside ------------------------------------------------------------

def band_for(root: Path, run_id: str, provider: str, key: SeriesKey, machine: MachineClass,
             n_nodes: int) -> tuple[Band, str] | None:
    """The reference band of a busbw series at its own size: the run's inventory's, else the
    shipped one for the machine class. An expectation, shown beside the measured baseline."""
    if key.metric != "busbw" or key.engine != "nccl-tests":
        return None
    own = _inventory_bands(root / run_id / "inventory.yaml", provider)
    if own is not None:
        cands, src = own, "inventory"
    elif machine.known:
        ref = bands_mod.find_shipped(machine.gpu_model, machine.gpu_count, n_nodes)
        cands, src = (list(ref.bands) if ref else []), "shipped"
    else:
        return None
    band = next((b for b in cands if b.size_bytes == key.size
                 and b.collective == (key.collective or "all_reduce")), None)
    return None if band is None else (band, src)


def _inventory_bands(path: Path, provider: str) -> list[Band] | None:
    try:
        doc = YAML(typ="safe").load(path.read_text(encoding="utf-8"))
        raw = doc["providers"][provider]["expect"]["nccl_busbw"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if raw is None:
        return None
    try:
        return [Band.model_validate(b) for b in (raw if isinstance(raw, list) else [raw])]
    except ValueError:
        return None


# --- baseline set / show ----------------------------------------------------------------------

def summarize(samples: Sequence[Sample], units: dict[tuple[str, str], str], *, set_id: str,
              machine: MachineClass, suite_hash: str, runs: Sequence[str], set_at: str,
              set_by: str, how: str) -> list[BaselineRecord]:
    by_key: dict[SeriesKey, list[float]] = {}
    for s in samples:
        by_key.setdefault(s.key, []).append(s.value)
    out = []
    for key in sorted(by_key):
        v = np.asarray(by_key[key])
        out.append(BaselineRecord(
            set_id=set_id, provider=key.provider, gpu_model=machine.gpu_model,
            gpu_count=machine.gpu_count, suite_hash=suite_hash, scope=key.scope,
            engine=key.engine, metric=key.metric, size=key.size, span=key.span,
            collective=key.collective, n=len(v),
            mean=float(v.mean()), std=float(v.std(ddof=1)) if len(v) > 1 else 0.0,
            median=float(np.median(v)), min=float(v.min()), max=float(v.max()),
            unit=units.get((key.provider, key.metric), ""), runs=list(runs), set_at=set_at,
            set_by=set_by, how=how))
    return out


def set_baseline(root: Path, provider: str, *, runs: Sequence[str] = (), last: int | None = None,
                 min_size: int = MIN_SIZE, who: str | None = None) -> list[BaselineRecord]:
    """Record the provider's baseline from named runs or its last N complete runs."""
    if bool(runs) == (last is not None):
        raise UsageError("give either --runs RUN... or --last N")
    all_runs = frames.runs(root)
    df = sample_frame(root, provider, min_size=min_size)
    known = set(all_runs["run_id"])
    if runs:
        missing = [r for r in runs if r not in known]
        if missing:
            raise UsageError(f"no run {', '.join(shown(m) + did_you_mean(m, known) for m in missing)}"
                             f" under {root}",
                             hint=f"see `gpuvet runs --results {root}`")
        empty = [r for r in runs if r not in set(df["run_id"])]
        if empty:
            raise UsageError(f"run(s) {', '.join(empty)} have no measurements of provider "
                             f"{provider} that a baseline uses (busbw from "
                             f"{human_size(min_size)}, training metrics)")
        chosen = list(dict.fromkeys(runs))
        how = "runs " + " ".join(chosen)
    else:
        assert last is not None
        if last < 1:
            raise UsageError(f"--last needs at least 1 run, got {last}")
        order = [r for r in all_runs["run_id"] if r in set(df["run_id"])]
        if not order:
            raise UsageError(f"provider {provider} has no measured runs under {root}")
        suite_hash = str(all_runs.loc[all_runs["run_id"] == order[-1], "suite_hash"].iloc[0])
        ok, _ = complete_runs(root, provider, suite_hash, order, all_runs)
        if not ok:
            raise UsageError(f"provider {provider} has no complete run (passed, no FAIL "
                             f"finding) of suite {suite_hash}",
                             hint="name the runs to accept with --runs RUN...")
        chosen = ok[-last:]
        how = f"last {last}"
    hashes = {r: str(all_runs.loc[all_runs["run_id"] == r, "suite_hash"].iloc[0]) for r in chosen}
    if len(set(hashes.values())) > 1:
        listed = ", ".join(f"{r}={h}" for r, h in hashes.items())
        raise UsageError(f"the runs were measured with different suites ({listed}): a baseline "
                         "holds runs of one suite", hint="choose runs of one suite hash")
    classes = {r: machine_class(root, r, provider_nodes(root, r, provider, df)) for r in chosen}
    known_classes = {c for c in classes.values() if c.known}
    if len(known_classes) > 1:
        listed = ", ".join(f"{r}={c}" for r, c in classes.items())
        raise UsageError(f"the runs were measured on different machines ({listed})",
                         hint="a baseline is per GPU model and count: choose runs of one")
    machine = next(iter(known_classes), MachineClass())
    sub = df[df["run_id"].isin(chosen)]
    units = {(p, m): u for p, m, u in sub[["provider", "metric", "unit"]].itertuples(
        index=False, name=None)}
    records = summarize(to_samples(sub), units, set_id=uuid.uuid4().hex[:12], machine=machine,
                        suite_hash=next(iter(hashes.values())), runs=chosen,
                        set_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                        set_by=who or _who(), how=how)
    add_baselines(root, records)
    return records


def newest_measured(root: Path, provider: str, min_size: int = MIN_SIZE) -> str | None:
    """The provider's newest run with measurements a baseline uses and not still running:
    the run `gpuvet regress` judges by default."""
    runs = frames.runs(root)
    have = set(sample_frame(root, provider, min_size=min_size)["run_id"])
    have -= set(runs.loc[runs["status"] == "running", "run_id"])
    return next((str(r) for r in reversed(list(runs["run_id"])) if r in have), None)


def _who() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def records_table(root: Path, records: Sequence[BaselineRecord], title: str) -> Table:
    """Baselines with the reference band of the same size beside: history and expectation."""
    rows = []
    for r in sorted(records, key=lambda r: (r.provider, r.suite_hash, r.scope, r.engine,
                                            r.metric, r.size)):
        key = SeriesKey(r.provider, r.scope, r.engine, r.metric, r.size, r.span, r.collective)
        nodes = 1 if r.span == "single" else _multi_nodes(root, r)
        band = band_for(root, r.runs[-1], r.provider, key, MachineClass(r.gpu_model, r.gpu_count),
                        nodes) if r.runs else None
        shown = None if band is None else (f"{band[0].value:g} ({band[0].lower:g}-"
                                           f"{band[0].upper:g}, {band[1]})")
        rows.append((r.provider, str(MachineClass(r.gpu_model, r.gpu_count)), r.suite_hash,
                     key.label, r.n, float(f"{r.mean:.4g}"), float(f"{r.std:.3g}"),
                     f"{r.std / r.mean:.1%}" if r.mean else None, r.unit, shown,
                     len(r.runs), r.set_by, r.set_at))
    return Table(title, ("provider", "machine", "suite", "series", "n", "mean", "sd", "cv",
                         "unit", "band", "runs", "set by", "set at"), rows)


def _multi_nodes(root: Path, r: BaselineRecord) -> int:
    ms = frames.measurements(root, r.runs[-1:], providers=[r.provider], metrics=[r.metric])
    ms = ms[ms["scope"] == r.scope]
    return max((len(str(n).split(",")) for n in ms["nodes"]), default=1)
