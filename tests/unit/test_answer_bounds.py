"""The answer layer on a run of many sizes, and the words it prints (issue 34): the busbw plot
labels a bounded number of sizes, per-size values are split without a groupby per size,
regress never prints "inf%" nor "no measured run" for a run it has, compare never names an
empty host. Timings are in docs/benchmarks.md (tests/bench/import_bench.py), not here."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from orchestrator.analysis import regress as R
from orchestrator.analysis import verdict
from orchestrator.analysis.compare import busbw_values
from orchestrator.analysis.significance import Comparison
from orchestrator.records import finding
from orchestrator.report import plots
from tests.unit.clirun import gpuvet

FIX = Path(__file__).resolve().parents[1] / "fixtures"
ROUNDS = [FIX / "h200x2" / "nccl-tests" / f"all_reduce_8B-128M_g2_round{r}.log" for r in (1, 2, 3)]


def _busbw(sizes: list[int], provider: str = "p", rounds: int = 1,
           nodes: str = "") -> pd.DataFrame:
    rows = [{"run_id": "r", "provider": provider, "nodes": nodes, "step": "nccl",
             "scope": "single", "engine": "nccl-tests", "metric": "busbw", "size": s,
             "inplace": False, "round": r, "value": float(i % 97 + r), "unit": "GB/s"}
            for r in range(1, rounds + 1) for i, s in enumerate(sizes)]
    return pd.DataFrame(rows)


def test_size_ticks_label_every_size_of_a_sweep_and_thin_a_long_one() -> None:
    sweep = [8 << k for k in range(32)]  # 8 B .. 16 GiB by factors of two: 32 sizes
    assert plots.size_ticks(sweep) == sweep
    many = [64 * (i + 1) for i in range(10_000)]
    ticks = plots.size_ticks(many)
    assert 2 <= len(ticks) <= plots.MAX_TICKS
    assert all(t & (t - 1) == 0 and many[0] <= t <= many[-1] for t in ticks)  # powers of two
    wide = [1 << k for k in range(64)] + [3 << k for k in range(40)]
    assert len(plots.size_ticks(wide)) <= plots.MAX_TICKS


def test_the_busbw_plot_of_thousands_of_sizes_labels_a_bounded_number() -> None:
    ms = _busbw([64 * (i + 1) for i in range(300)])
    svg = plots.busbw(ms, ["p"])
    assert svg is not None
    # before: one labelled tick per size (300 here; 10,000 took minutes to lay out)
    assert len(re.findall(r'id="xtick_\d+"', svg)) <= plots.MAX_TICKS


def test_busbw_values_per_size_keep_their_stored_order() -> None:
    ms = _busbw([1 << 20, 1 << 10, 1 << 30], rounds=3)
    ms = pd.concat([ms, _busbw([1 << 20], provider="q"), ms.assign(size=np.nan).head(1),
                    ms.assign(metric="algbw")])
    got = busbw_values(ms, "p", "single")
    assert list(got) == [1 << 10, 1 << 20, 1 << 30]
    want = ms[(ms["provider"] == "p") & (ms["metric"] == "busbw") & ms["size"].notna()]
    for size, vals in got.items():
        assert vals.tolist() == want.loc[want["size"] == size, "value"].tolist()
    assert busbw_values(ms, "nobody", "single") == {}


def _row(mde: float | None, verdict: str = "UNCHANGED", change: float | None = 0.0,
         ci: tuple[float, float] | None = None) -> R.Row:
    from orchestrator.analysis.baseline import SeriesKey

    key = SeriesKey("p", "single", "nccl-tests", "busbw", 1 << 30, "single")
    return R.Row(key, None, Comparison(verdict, "why", n_base=3, n_cur=3,  # type: ignore[arg-type]
                                       base_mean=1.0, cur_mean=1.0, change=change,
                                       ci_low=ci[0] if ci else None,
                                       ci_high=ci[1] if ci else None, q=0.5, mde=mde))


def test_regress_never_prints_inf_percent() -> None:
    # before: "could have detected inf% to inf%"
    only_blind = R.provider_verdict("p", [_row(math.inf), _row(math.inf)])
    assert only_blind.summary == ("2 test(s), no significant change of at least 3%; 2 test(s) "
                                  "with too few samples to detect any change")
    mixed = R.provider_verdict("p", [_row(0.05), _row(math.inf), _row(0.2)])
    assert mixed.summary.endswith("; could have detected 5.0% to 20.0%; 1 test(s) with too few "
                                  "samples to detect any change")
    one = R.provider_verdict("p", [_row(0.05)])
    assert one.summary.endswith("; could have detected 5.0%")
    worst = R.provider_verdict("p", [_row(0.05, "REGRESSED", -math.inf, (-math.inf, -0.5))])
    assert "inf" not in worst.summary and worst.summary.endswith("n/a [n/a, -50.0%]")


def test_regress_of_a_run_below_min_size_says_so(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results"
    assert gpuvet(capsys, "import", "nccl-tests", *ROUNDS, "-p", "lab", "--results",
                  results).returncode == 0
    proc = gpuvet(capsys, "regress", "-p", "lab", "--min-size", "1G", "--results", results,
                  "--json")
    assert proc.returncode == 0, proc.output
    (p,) = __import__("json").loads(proc.stdout)["providers"]
    # before: "no measured run of this provider" for a provider with a measured run
    assert p["summary"] == ("no busbw measured at or above --min-size 1 GiB (the largest "
                            "message size measured is 128 MiB): lower --min-size to judge "
                            "smaller sizes")


def test_too_few_rounds_of_a_series_without_nodes_names_the_provider() -> None:
    ms = _busbw([1 << 30], provider="lab", nodes="")
    fs = [finding("r", "nccl", provider="lab", node=None, code="NCCL_BUSBW", severity="PASS",
                  message="m", evidence=["x.log"])]
    reason = verdict._nccl(fs, ms, "lab")
    # before: "single on : 1 round(s)"
    assert reason.text == "fewer than 3 rounds: single on provider lab (all nodes): 1 round(s)"
    reason = verdict._nccl(fs, _busbw([1 << 30], provider="lab", nodes="n1"), "lab")
    assert reason.text == "fewer than 3 rounds: single on n1: 1 round(s)"
