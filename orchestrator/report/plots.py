"""The report's plots: matplotlib figures rendered to inline SVG strings.

Text is drawn as paths, so the SVG needs no font and no network when opened;
the SVG's date metadata is left out, so a report of the same data is the same
file. Each function returns None when there is nothing to draw: the report
leaves a plot out rather than show an empty frame.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from orchestrator.analysis.compare import busbw_values, ratio_ci, size_label
from orchestrator.errors import ParseError, UsageError, escaped
from orchestrator.parsers.dmon import parse_dmon
from payload.train import protocol

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")


def _plt() -> Any:
    try:
        import matplotlib  # imported late: only a report draws
    except ImportError:
        raise UsageError("the report's plots need matplotlib, a dependency of gpuvet missing "
                         "from this Python environment",
                         hint="pip install 'matplotlib>=3.8,<4'") from None

    matplotlib.use("Agg")  # before pyplot: no display, no GUI backend
    import matplotlib.pyplot as plt  # as above

    plt.rcParams.update({"svg.fonttype": "path", "font.size": 10, "axes.grid": True,
                         "grid.alpha": 0.3, "figure.dpi": 100})
    return plt


def _svg(fig: Any) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    _plt().close(fig)
    text = buf.getvalue()
    text = text[text.index("<svg"):]  # the XML prolog and doctype have no place inside HTML
    # the RDF metadata block only names its vocabularies (purl.org, creativecommons.org);
    # the comments repeat the labels drawn as paths
    text = re.sub(r"\s*<metadata>.*?</metadata>", "", text, count=1, flags=re.S)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    # as wide as its box (a phone's screen, a column of the page), the height from the
    # viewBox's aspect ratio
    head, rest = text.split(">", 1)
    head = re.sub(r'\s(width|height)="[^"]*"', "", head)
    return escaped(f'{head} width="100%">{rest}', keep_lines=True)


MAX_TICKS = 32  # a sweep of 8 B to 16 GiB by factors of two has 32 sizes, each labelled
MAX_MARKERS = 64  # past this many points a line is drawn without a marker at each


def size_ticks(sizes: Sequence[int]) -> list[int]:
    """The sizes the x axis labels: every measured size when there are at most MAX_TICKS
    (a sweep by factors of two), else the powers of two within their range, thinned to at
    most MAX_TICKS: a log of 10,000 sizes would otherwise lay out 10,000 labels (minutes)."""
    if len(sizes) <= MAX_TICKS:
        return list(sizes)
    lo, hi = min(sizes), max(sizes)
    powers = [1 << k for k in range(max(lo, 1).bit_length() - 1, hi.bit_length() + 1)
              if lo <= 1 << k <= hi] or [lo, hi]
    step = -(-len(powers) // MAX_TICKS)
    return powers[::step]


def busbw(ms: pd.DataFrame, providers: Sequence[str]) -> str | None:
    """busbw vs message size per provider (median line, min-max band, log x with every size
    labelled, y from 0), and under it each other provider's ratio to the first per size
    with its 95% bootstrap interval: the question is "how much faster, where"."""
    scopes = [s for s in ("single", "multi")
              if any(busbw_values(ms, p, s) for p in providers)]
    if not scopes:
        return None
    plt = _plt()
    from matplotlib.ticker import NullLocator  # after _plt(), which chose the backend

    ratio = len(providers) > 1
    # the scopes one under the other: one column reads on a phone as on a screen
    per = 2 if ratio else 1
    fig, axes = plt.subplots(per * len(scopes), 1,
                             figsize=(6.4, (6.4 if ratio else 3.8) * len(scopes)), squeeze=False,
                             gridspec_kw={"height_ratios": ([3, 2] if ratio else [1])
                                          * len(scopes)})
    base = providers[0]
    for col, scope in enumerate(scopes):
        ax = axes[per * col][0]
        vals = {p: busbw_values(ms, p, scope) for p in providers}
        sizes_all = sorted({s for v in vals.values() for s in v})
        for i, p in enumerate(providers):
            if not vals[p]:
                continue
            sizes = sorted(vals[p])
            med = [float(np.median(vals[p][s])) for s in sizes]
            ax.fill_between(sizes, [vals[p][s].min() for s in sizes],
                            [vals[p][s].max() for s in sizes], color=COLORS[i % len(COLORS)],
                            alpha=0.25, linewidth=0)
            ax.plot(sizes, med, marker="." if len(sizes) <= MAX_MARKERS else None,
                    color=COLORS[i % len(COLORS)], label=p)
        ax.set_xscale("log", base=2)
        ax.set_ylim(bottom=0)
        ax.set_title(f"all_reduce busbw, {scope}-node (median, min-max band)")
        ax.set_ylabel("busbw GB/s")
        ax.legend()
        last = ax
        if ratio:
            rx = axes[per * col + 1][0]
            rx.sharex(ax)
            rx.set_xscale("log", base=2)  # sharex shares the limits; the scale is set here
            ax.tick_params(labelbottom=False)
            rx.set_gid(f"ratio-panel-{scope}")  # the SVG group's id: found by the browser test
            for i, p in enumerate(providers[1:], start=1):
                pts = [(s, *ratio_ci(vals[base][s], vals[p][s])) for s in sizes_all
                       if s in vals[base] and s in vals[p]]
                if not pts:
                    continue
                xs = [x[0] for x in pts]
                rx.plot(xs, [x[1] for x in pts], marker="o" if len(xs) <= MAX_MARKERS else None,
                        markersize=3,
                        color=COLORS[i % len(COLORS)], label=f"{p}/{base}")
                lo = [x[2] if x[2] == x[2] else x[1] for x in pts]
                hi = [x[3] if x[3] == x[3] else x[1] for x in pts]
                rx.fill_between(xs, lo, hi, color=COLORS[i % len(COLORS)], alpha=0.2,
                                linewidth=0)
            rx.axhline(1.0, color="#555", linewidth=0.8)
            rx.set_ylabel(f"ratio to {base} (95% CI)")
            rx.set_title(f"{scope}-node: each provider's busbw / {base}'s, per size")
            if rx.get_legend_handles_labels()[0]:  # no pair of providers shares a size
                rx.legend(fontsize=7)
            last = rx
        ticks = size_ticks(sizes_all)
        last.set_xticks(ticks, [size_label(t) for t in ticks], rotation=90, fontsize=7)
        last.xaxis.set_minor_locator(NullLocator())
        last.set_xlabel("message size")
    return _svg(fig)


def stability(ms: pd.DataFrame, providers: Sequence[str]) -> str | None:
    """Each round's busbw as its ratio to the series' median, at the largest size of every
    series (named in the legend): 1% and 10% apart look different."""
    sel = ms[(ms["metric"] == "busbw") & (ms["engine"] == "nccl-tests")
             & (ms["inplace"] == False) & ms["size"].notna()]  # noqa: E712
    if sel.empty or sel["round"].nunique() < 2:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    spread = 0.0
    for i, p in enumerate(providers):
        mine = sel[sel["provider"] == p]
        for (scope, nodes), g in mine.groupby(["scope", "nodes"]):
            size = g["size"].max()
            top = g[g["size"] == size].groupby("round")["value"].median().sort_index()
            med = float(top.median())
            if med <= 0:
                continue
            r = top / med
            spread = max(spread, float((r - 1).abs().max()))
            ax.plot(list(top.index), list(r), marker="o", color=COLORS[i % len(COLORS)],
                    linestyle="-" if scope == "single" else "--",
                    label=f"{p} {scope} {nodes} at {size_label(int(size))}")
    ax.axhline(1.0, color="#555", linewidth=0.8)
    pad = max(0.02, spread * 1.3)
    ax.set_ylim(1 - pad, 1 + pad)
    ax.set_xlabel("round")
    ax.set_ylabel("busbw / the series' median")
    ax.set_title("round-to-round stability (ratio to the median round)")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend(fontsize=7)
    return _svg(fig)


def _events(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                ev = json.loads(line)
            except ValueError:
                continue  # a torn line of a killed process
            if isinstance(ev, dict):
                out.append(ev)
    return out


def train_steps(run_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Rank 0's step events per phase (reference, kill, restore) of a training run, and
    the reference's steps on the fastest kernels as "throughput"."""
    found: dict[str, list[dict[str, Any]]] = {}
    patterns = ("nodes/*/train/*/*/rank0.jsonl", "providers/*/train/multi/*/*/rank0.jsonl")
    for pat in patterns:
        for f in sorted(run_dir.glob(pat)):
            phase = f.parent.parent.name
            events = _events(f)
            for name, kind in ((phase, protocol.STEP), ("throughput", protocol.TSTEP)):
                steps = [e for e in events if e.get("event") == kind and "loss" in e]
                if steps and name not in found:
                    found[name] = steps
    return found


def losses(train: dict[str, dict[str, list[dict[str, Any]]]]) -> str | None:
    """Reference and restored loss curves overlaid, one panel per provider."""
    provs = [p for p, ph in train.items() if "reference" in ph]
    if not provs:
        return None
    plt = _plt()
    fig, axes = plt.subplots(len(provs), 1, figsize=(6.4, 3.0 * len(provs)), squeeze=False)
    for ax, p in zip(axes[:, 0], provs, strict=True):
        for phase, style in (("reference", "-"), ("restore", "--")):
            steps = train[p].get(phase) or []
            if steps:
                ax.plot([int(s["step"]) for s in steps], [float(s["loss"]) for s in steps],
                        linestyle=style, marker="." if phase == "restore" else None,
                        label="restored" if phase == "restore" else phase)
        ax.set_title(f"{p}: loss, reference vs restored")
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        ax.legend()
    fig.tight_layout()
    return _svg(fig)


def step_time_samples(train: dict[str, dict[str, list[dict[str, Any]]]]
                      ) -> dict[str, list[float]]:
    """Step times per provider: the steps on the fastest kernels where the run has them
    (the figures the measurements give), else the reference phase's."""
    data = {p: [float(s["step_time_s"]) for s in ph.get("throughput") or ph.get("reference", [])
                if s.get("step_time_s") is not None] for p, ph in train.items()}
    return {p: v for p, v in data.items() if v}


def step_time_words(data: dict[str, list[float]]) -> str:
    """The medians and how far each provider's is from the first's, in percent: the box
    plot's axis starts at zero, so a 0.2% difference looks as small as it is, and the
    words say it."""
    meds = {p: float(np.median(v)) for p, v in data.items() if v}
    if not meds:
        return ""
    base, mb = next(iter(meds.items()))
    parts = [f"median step time {base} {mb:.5g} s"]
    for p, m in list(meds.items())[1:]:
        d = (m - mb) / mb * 100 if mb > 0 else float("nan")
        if d != d:
            parts.append(f"{p} {m:.5g} s")
        elif abs(d) < 0.05:
            parts.append(f"{p} {m:.5g} s, the same as {base}'s within 0.1%")
        else:
            parts.append(f"{p} {m:.5g} s, {abs(d):.1f}% {'below' if d < 0 else 'above'} "
                         f"{base}'s")
    return "; ".join(parts)


def step_times(train: dict[str, dict[str, list[dict[str, Any]]]]) -> str | None:
    """Step times per provider as box plots on an axis from zero, the difference of the
    medians in the title."""
    data = step_time_samples(train)
    if not data:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 1.4 + 0.6 * len(data)))
    ax.boxplot(list(data.values()), orientation="horizontal")
    ax.set_yticks(range(1, len(data) + 1), list(data))
    ax.set_xlim(left=0, right=max(max(v) for v in data.values()) * 1.1)
    ax.set_xlabel("step time s, axis from zero (fastest kernels, else the reference phase)",
                  fontsize=8)
    ax.set_title(step_time_words(data).replace("; ", "\n"), fontsize=9)
    return _svg(fig)


def telemetry_series(run_dir: Path) -> dict[str, list[float | None]] | None:
    """GPU 0's dmon samples of the first training unit that kept telemetry."""
    for sup in sorted(run_dir.glob("nodes/*/train/reference/*/supervise.json")):
        try:
            tele = (json.loads(sup.read_text()) or {}).get("telemetry") or {}
        except ValueError:
            continue
        path = sup.parent / str(tele.get("file") or "")
        if tele.get("source") != "dmon" or not path.is_file():
            continue
        try:
            facts = parse_dmon(path.read_text(errors="replace"), source=str(path))
        except ParseError:
            continue
        gpu = min(facts.gpus) if facts.gpus else None
        if gpu is None:
            continue
        return {c: facts.series(gpu, c)
                for c in ("pwr", "pclk", "gtemp", "pviol", "tviol")}
    return None


def telemetry(series: dict[str, dict[str, list[float | None]]]) -> str | None:
    if not series:
        return None
    plt = _plt()
    panels = (("pwr", "power W"), ("pclk", "SM clock MHz"), ("gtemp", "temperature C"),
              ("pviol", "throttle: power violation % / thermal"))
    # four panels one under the other, sharing the time axis: readable on a phone
    fig, axes = plt.subplots(4, 1, figsize=(6.4, 8.0), sharex=True)
    for ax, (col, label) in zip(axes, panels, strict=True):
        for i, (p, s) in enumerate(series.items()):
            ys = s.get(col) or []
            if col == "pviol":
                ys = [(a or 0) + 100 * (b or 0) for a, b in zip(ys, s.get("tviol") or [0] * len(ys),
                                                              strict=False)]
            ax.plot(range(len(ys)), [np.nan if v is None else v for v in ys],
                    color=COLORS[i % len(COLORS)], label=p)
        ax.set_title(label)
    axes[-1].set_xlabel("seconds (GPU 0)")
    axes[0].legend()
    fig.tight_layout()
    return _svg(fig)


def cost_bars(units: Sequence[Any]) -> str | None:
    """Cost per 1M training tokens and per job-hour, one group per currency: amounts in
    different currencies never share an axis, and a measure no provider has (no training
    run: no tokens) is left out, never drawn as zero bars."""
    rows = [u for u in units if u.currency is not None
            and (u.per_1m_tokens is not None or u.per_job_hour)]
    if not rows:
        return None
    measures = [(a, t) for a, t in (("per_1m_tokens", "per 1M training tokens"),
                                     ("per_job_hour", "per hour of the job"))
                if any(getattr(u, a) for u in rows)]
    currencies = sorted({u.currency for u in rows})
    plt = _plt()
    # every panel one under the other: one column reads on a phone as on a screen
    n = len(currencies) * len(measures)
    fig, axes = plt.subplots(n, 1, figsize=(6.4, (1.1 + 0.35 * len(rows)) * n), squeeze=False)
    panels = iter(axes[:, 0])
    for cur in currencies:
        for (attr, title), ax in zip(measures, panels, strict=False):
            mine = [u for u in rows if u.currency == cur and getattr(u, attr)]
            vals = [float(getattr(u, attr)) for u in mine]
            ax.barh([u.provider for u in mine], vals,
                    color=[COLORS[i % len(COLORS)] for i in range(len(mine))])
            ax.set_xlim(left=0, right=max(vals) * 1.25 if vals else 1)
            for y, v in enumerate(vals):
                ax.annotate(f"{v:,.4g}", (v, y), xytext=(3, 0), textcoords="offset points",
                            va="center", fontsize=8)
            ax.set_title(f"{title} ({cur})")
    fig.tight_layout()
    return _svg(fig)


WHY_LEFT_OUT = {
    "busbw vs message size": "no nccl-tests busbw in the runs compared",
    "round-to-round stability": "fewer than two rounds of nccl-tests",
    "loss: reference and restored run": "no training run with a reference phase",
    "step-time distribution": "no training steps timed",
    "GPU telemetry while training": "no dmon samples kept by a training run",
    "cost per useful unit": "no provider priced (or nothing measured to price)",
}
