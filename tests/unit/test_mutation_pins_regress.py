"""regress.py pinned on exact values: which series and nodes `judge` tests,
how `provider_verdict` tells a lone node from the provider, every summary's
words, and the rows of the three tables and of --json (the survivors of
`make mutation` on orchestrator/analysis/regress.py). Comparisons are built
by hand here, so the verdict logic is pinned apart from the statistics
(`test_mutation_pins_significance.py` pins those)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from orchestrator.analysis import regress as R
from orchestrator.analysis.baseline import BaselineSource, MachineClass, Sample, SeriesKey
from orchestrator.analysis.significance import Comparison, Settings
from orchestrator.bands import Band
from orchestrator.errors import UsageError

BUS = SeriesKey("p", "single", "nccl-tests", "busbw", 1 << 30, "single")
BUS2 = SeriesKey("p", "single", "nccl-tests", "busbw", 2 << 30, "single")
STEP = SeriesKey("p", "train", "train", "step_time_s", -1, "multi")


def _c(verdict: str, change: float | None = None, *, mde: float | None = 0.05,
       ci: tuple[float, float] | None = None, reason: str = "why", q: float | None = None,
       n: tuple[int, int] = (3, 9), means: tuple[float | None, float | None] = (None, None)
       ) -> Comparison:
    return Comparison(verdict, reason, n_base=n[1], n_cur=n[0],  # type: ignore[arg-type]
                      base_mean=means[0], cur_mean=means[1], change=change,
                      ci_low=ci[0] if ci else None, ci_high=ci[1] if ci else None, q=q, mde=mde)


def _row(key: SeriesKey, node: str | None, c: Comparison) -> R.Row:
    return R.Row(key, node, c)


def test_rows_name_their_subject() -> None:
    r = _row(BUS, "n1", _c("UNCHANGED"))
    assert r.is_node and r.subject == "n1" and r.label == "n1"
    r = _row(BUS, None, _c("UNCHANGED"))
    assert not r.is_node and r.subject == "provider:p" and r.label == "provider p (all nodes)"


def test_no_judged_row_is_not_enough_data_with_the_first_rows_reason() -> None:
    pv = R.provider_verdict("p", [_row(BUS, None, _c("NOT ENOUGH DATA", reason="first")),
                                  _row(BUS2, None, _c("NOT ENOUGH DATA", reason="second"))])
    assert pv == R.ProviderVerdict("p", "NOT ENOUGH DATA", "none", (), "first")
    assert R.provider_verdict("p", []) == R.ProviderVerdict(
        "p", "NOT ENOUGH DATA", "none", (), "no comparable measurements in this run")


def test_unchanged_says_how_many_tests_and_what_could_have_been_seen() -> None:
    rows = [_row(BUS, None, _c("UNCHANGED", mde=0.04)), _row(BUS, "n1", _c("UNCHANGED", mde=0.5)),
            _row(BUS2, None, _c("UNCHANGED", mde=0.125)),
            _row(STEP, None, _c("NOT ENOUGH DATA", mde=0.9))]
    assert R.provider_verdict("p", rows, 0.07) == R.ProviderVerdict(
        "p", "UNCHANGED", "none", (),
        "3 test(s), no significant change of at least 7%; could have detected 4.0% to 12.5%")
    rows = [_row(BUS, None, _c("UNCHANGED", mde=None))]
    assert R.provider_verdict("p", rows).summary == \
        "1 test(s), no significant change of at least 3%"


def test_improved_counts_the_improved_series() -> None:
    rows = [_row(BUS, None, _c("IMPROVED", 0.1, mde=0.02)), _row(BUS, "n1", _c("IMPROVED", 0.1)),
            _row(BUS2, None, _c("UNCHANGED", mde=0.03))]
    assert R.provider_verdict("p", rows) == R.ProviderVerdict(
        "p", "IMPROVED", "provider", (),
        "2 series improved, none regressed; could have detected 2.0% to 3.0%")


def test_one_node_of_two_regressed_is_that_node() -> None:
    rows = [_row(BUS, None, _c("UNCHANGED")), _row(BUS, "n1", _c("UNCHANGED")),
            _row(BUS, "n2", _c("REGRESSED", -0.125, ci=(-0.25, -0.0625)))]
    assert R.provider_verdict("p", rows) == R.ProviderVerdict(
        "p", "REGRESSED", "node", ("n2",),
        "node n2 regressed alone (the provider's other nodes did not), worst n2 "
        "busbw single 1 GiB -12.5% [-25.0%, -6.2%]")


def test_two_nodes_of_three_are_named_and_the_worst_one_given() -> None:
    rows = [_row(BUS, None, _c("REGRESSED", -0.5)), _row(BUS, "n1", _c("UNCHANGED")),
            _row(BUS, "n3", _c("REGRESSED", -0.0625)), _row(BUS, "n2", _c("REGRESSED", -0.25)),
            _row(STEP, None, _c("REGRESSED", 0.375))]
    pv = R.provider_verdict("p", rows[:4])
    assert pv == R.ProviderVerdict(
        "p", "REGRESSED", "node", ("n2", "n3"),
        "nodes n2, n3 regressed alone (the provider's other nodes did not), worst n2 "
        "busbw single 1 GiB -25.0%")
    # a step time that went up is worse than a bandwidth that went down less
    pv = R.provider_verdict("p", rows)
    assert pv == R.ProviderVerdict(
        "p", "REGRESSED", "provider", ("n2", "n3"),
        "provider p regressed as a whole in 1 series, worst step_time_s train multi +37.5%; "
        "nodes n2, n3 also alone")


def test_every_node_regressed_is_the_provider_even_if_its_own_row_is_not() -> None:
    rows = [_row(BUS, None, _c("UNCHANGED", -0.01)), _row(BUS, "n1", _c("REGRESSED", -0.25)),
            _row(BUS, "n2", _c("REGRESSED", -0.125))]
    assert R.provider_verdict("p", rows) == R.ProviderVerdict(
        "p", "REGRESSED", "provider", (),
        "provider p regressed as a whole in 1 series, worst busbw single 1 GiB -1.0%")


def test_the_worst_of_several_whole_series_is_the_largest_loss() -> None:
    rows = [_row(BUS, None, _c("REGRESSED", -0.125)), _row(BUS2, None, _c("REGRESSED", -0.25)),
            _row(STEP, None, _c("REGRESSED", 0.0625)),
            _row(SeriesKey("p", "multi", "nccl-tests", "busbw", 1 << 30, "multi"), None,
                 _c("REGRESSED", None))]
    assert R.provider_verdict("p", rows).summary == (
        "provider p regressed as a whole in 4 series, worst busbw single 2 GiB -25.0%")
    # a metric without a direction counts as higher-is-better
    odd = SeriesKey("p", "single", "nccl-tests", "odd", -1, "single")
    rows = [_row(odd, None, _c("REGRESSED", -0.5)), _row(BUS, None, _c("REGRESSED", -0.25))]
    assert R.provider_verdict("p", rows).summary.endswith("worst odd single -50.0%")
    rows = [_row(odd, None, _c("REGRESSED", None)), _row(BUS, None, _c("REGRESSED", 0.25))]
    assert R.provider_verdict("p", rows).summary.endswith("worst odd single (not tested)")


def test_change_text() -> None:
    assert R._change(_c("UNCHANGED", None)) == "(not tested)"
    assert R._change(_c("UNCHANGED", 0.0125)) == "+1.2%"
    assert R._change(_c("UNCHANGED", -0.5, ci=(-0.75, 0.25))) == "-50.0% [-75.0%, +25.0%]"


def _s(key: SeriesKey, value: float, node: str | None, run: str = "cur") -> Sample:
    return Sample(key, value, node, run)


def test_judge_tests_each_series_and_each_node_of_a_single_node_series() -> None:
    multi = SeriesKey("p", "multi", "nccl-tests", "busbw", 1 << 30, "multi")
    one = SeriesKey("p", "single", "nccl-tests", "busbw", 4 << 30, "single")
    base = [_s(k, v, n, "b") for k in (BUS, multi, one) for v in (100.0, 101.0, 99.0)
            for n in ("n1", "n2")]
    cur = ([_s(BUS, v, n) for v in (100.0, 100.5) for n in ("n2", "n1")]
           + [_s(multi, 100.0, None), _s(multi, 100.0, None)]
           + [_s(one, v, "n1") for v in (100.0, 100.5)]
           + [_s(SeriesKey("q", "single", "nccl-tests", "busbw", 1 << 30, "single"), 1.0, "m1")])
    rep = R.judge("cur", cur, base, Settings(), providers=["z", "p"])
    assert rep.run_id == "cur" and rep.settings == Settings()
    assert [(r.key.provider, r.key.scope, r.key.size, r.node) for r in rep.rows] == [
        ("p", "multi", 1 << 30, None),
        ("p", "single", 1 << 30, None), ("p", "single", 1 << 30, "n1"),
        ("p", "single", 1 << 30, "n2"),
        ("p", "single", 4 << 30, None),
        ("q", "single", 1 << 30, None)]
    counts = [(r.result.n_cur, r.result.n_base) for r in rep.rows]
    assert counts == [(2, 6), (4, 6), (2, 6), (2, 6), (2, 6), (1, 0)]
    assert [p.provider for p in rep.providers] == ["z", "p", "q"]
    assert rep.providers[0].verdict == "NOT ENOUGH DATA"
    assert rep.providers[2].verdict == "NOT ENOUGH DATA"
    assert not rep.regressed


def test_judge_passes_each_metrics_direction() -> None:
    base = [_s(STEP, v, None, "b") for v in (1.0, 1.01, 0.99, 1.0, 1.01, 0.99)]
    slower = [_s(STEP, v, None) for v in (1.5, 1.51, 1.49)]
    rep = R.judge("cur", slower, base, Settings(test="welch"))
    assert rep.rows[0].result.verdict == "REGRESSED" and rep.regressed
    assert rep.providers[0].verdict == "REGRESSED"
    rep = R.judge("cur", [_s(STEP, v, None) for v in (0.5, 0.51, 0.49)], base,
                  Settings(test="welch"))
    assert rep.rows[0].result.verdict == "IMPROVED" and not rep.regressed


def _ev(providers: list[R.ProviderEvaluation], rows: list[R.Row],
        settings: Settings = Settings()) -> R.Evaluation:
    return R.Evaluation(settings, [R.Report("r2", settings, rows)], providers)


SRC = BaselineSource("automatic", ("r0", "r1"), MachineClass("H200", 8), "abc")
BAND = Band(value=100.0, lower=90.0, upper=110.5)


def _pe(provider: str, verdict: str, attribution: str = "none", **kw: Any) -> R.ProviderEvaluation:
    return R.ProviderEvaluation(provider, kw.pop("run", "r2"), kw.pop("source", SRC),
                                R.ProviderVerdict(provider, verdict,  # type: ignore[arg-type]
                                                  attribution,  # type: ignore[arg-type]
                                                  kw.pop("nodes", ()), f"{verdict} words"),
                                **kw)


def test_verdict_table_shows_who_only_for_a_regression() -> None:
    ev = _ev([_pe("p", "REGRESSED", "node", nodes=("n1",)), _pe("q", "UNCHANGED"),
              _pe("s", "NOT ENOUGH DATA", run=None, source=None)], [])
    t = R.verdict_table(ev)
    assert t.title == "regression verdict per provider"
    assert t.columns == ("provider", "run", "baseline", "verdict", "who", "summary")
    assert t.rows == [
        ("p", "r2", "the last 2 complete run(s) before this one", "REGRESSED", "node",
         "REGRESSED words"),
        ("q", "r2", "the last 2 complete run(s) before this one", "UNCHANGED", None,
         "UNCHANGED words"),
        ("s", None, None, "NOT ENOUGH DATA", None, "NOT ENOUGH DATA words")]
    assert ev.regressed
    assert not _ev([_pe("q", "UNCHANGED"), _pe("s", "IMPROVED", "provider")], []).regressed


def test_tests_table_rows_and_what_is_left_out_without_verbose() -> None:
    rows = [_row(BUS, "n2", _c("UNCHANGED")), _row(BUS, "n1", _c("NOT ENOUGH DATA", mde=None)),
            _row(BUS, "n3", _c("REGRESSED", -0.123456, ci=(-0.2, -0.05), q=0.012345,
                               mde=0.0345, means=(123.456789, 108.2))),
            _row(BUS, None, _c("UNCHANGED", 0.0, mde=math.inf, q=0.5, means=(100.0, 100.0))),
            _row(STEP, None, _c("IMPROVED", -math.inf, mde=None, n=(1, 0)))]
    pe = _pe("p", "REGRESSED", bands={BUS: (BAND, "H200 x8")})
    ev = _ev([pe], rows, Settings(test="welch", alpha=0.1, min_effect=0.05))
    t = R.tests_table(ev)
    assert t.title == "regression tests (welch, FDR 0.1, minimum effect 5%)"
    assert t.columns == ("provider", "subject", "series", "verdict", "change", "95% CI", "q",
                         "detectable", "n run/base", "baseline", "this run", "band")
    assert t.rows == [
        ("p", "provider p (all nodes)", "busbw single 1 GiB", "UNCHANGED", "+0.0%", None, 0.5,
         "none", "3/9", 100.0, 100.0, "100 (90-110.5, H200 x8)"),
        ("p", "n3", "busbw single 1 GiB", "REGRESSED", "-12.3%", "[-20.0%, -5.0%]", 0.012,
         "3.5%", "3/9", 123.5, 108.2, "100 (90-110.5, H200 x8)"),
        ("p", "provider p (all nodes)", "step_time_s train multi", "IMPROVED", "n/a", None,
         None, None, "1/0", None, None, None)]
    v = R.tests_table(ev, verbose=True)
    assert [r[1] for r in v.rows] == ["provider p (all nodes)", "n1", "n2", "n3",
                                      "provider p (all nodes)"]
    assert v.rows[1][3:9] == ("NOT ENOUGH DATA", None, None, None, None, "3/9")


def test_shifts_table() -> None:
    shift = R.ShiftRow(BUS, "r1", "2026-01-02", 100.123456, 80.0, -0.2, 5)
    ev = _ev([_pe("p", "REGRESSED", shifts=[shift]), _pe("q", "UNCHANGED")], [])
    t = R.shifts_table(ev)
    assert t.title == "change points in the history (PELT, l2)"
    assert t.columns == ("provider", "series", "from run", "started", "before", "after",
                         "change")
    assert t.rows == [("p", "busbw single 1 GiB", "r1", "2026-01-02", 100.1, 80.0, "-20.0%")]


def test_as_json_whole() -> None:
    shift = R.ShiftRow(BUS, "r1", "2026-01-02", 100.0, 80.0, -0.2, 5)
    stored = BaselineSource("stored", ("r0",), MachineClass("H200", 8), "abc", "t0", "me",
                            "runs r0", ("r9: failed",))
    pe = _pe("p", "REGRESSED", "node", nodes=("n1",), source=stored, shifts=[shift],
             bands={BUS: (BAND, "H200 x8")})
    c = _c("UNCHANGED", 0.0, mde=math.inf, q=0.5)
    ev = _ev([pe, _pe("q", "NOT ENOUGH DATA", run=None, source=None)], [_row(BUS, None, c)])
    key = {"provider": "p", "scope": "single", "engine": "nccl-tests", "metric": "busbw",
           "size": 1 << 30, "span": "single"}
    assert R.as_json(ev) == {
        "settings": {"test": "mwu", "alpha": 0.05, "min_effect": 0.03, "power": 0.8,
                     "min_samples": 2},
        "regressed": True,
        "providers": [
            {"provider": "p", "run_id": "r2", "verdict": "REGRESSED", "attribution": "node",
             "nodes": ["n1"], "summary": "REGRESSED words",
             "baseline": {"kind": "stored", "runs": ["r0"], "suite_hash": "abc",
                          "gpu_model": "H200", "gpu_count": 8, "set_at": "t0", "set_by": "me",
                          "how": "runs r0", "left_out": ["r9: failed"]},
             "change_points": [{**key, "run_id": "r1", "started": "2026-01-02", "before": 100.0,
                                "after": 80.0, "change": -0.2, "history_runs": 5}],
             "bands": [{**key, "band": BAND.model_dump(), "source": "H200 x8"}]},
            {"provider": "q", "run_id": None, "verdict": "NOT ENOUGH DATA",
             "attribution": "none", "nodes": [], "summary": "NOT ENOUGH DATA words",
             "baseline": None, "change_points": [], "bands": []}],
        "tests": [{"run_id": "r2", **key, "subject": "provider:p", "series": "busbw single 1 GiB",
                   "verdict": "UNCHANGED", "reason": "why", "n_base": 9, "n_cur": 3,
                   "base_mean": None, "cur_mean": None, "change": 0.0, "ci_low": None,
                   "ci_high": None, "p": None, "q": 0.5, "mde": None, "mde_stat": None}],
    }


def _runs(monkeypatch: pytest.MonkeyPatch, rows: list[tuple[str, list[str]]]) -> None:
    df = pd.DataFrame([{"run_id": r, "providers": ps, "status": "passed",
                        "started": "2026-01-02T00:00:00Z"} for r, ps in rows])
    monkeypatch.setattr(R.frames, "runs", lambda root: df)


def test_evaluate_refuses_unknown_runs_and_providers_in_words(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _runs(monkeypatch, [("r1", ["lab", "zed"]), ("r2", ["lab"]), ("r3", [])])
    with pytest.raises(UsageError) as e:
        R.evaluate(tmp_path, "r9")
    assert (e.value.what, e.value.hint) == (f"no run r9 under {tmp_path}",
                                            f"see `gpuvet runs --results {tmp_path}`")
    with pytest.raises(UsageError) as e:
        R.evaluate(tmp_path, "r1", ["lab", "x", "y"])
    assert e.value.what == "run r1 has no provider x, y (it has lab, zed)"
    with pytest.raises(UsageError) as e:
        R.evaluate(tmp_path, "r3", ["x"])
    assert e.value.what == "run r3 has no provider x (it has none)"
    with pytest.raises(UsageError) as e:
        R.evaluate(tmp_path, None, ["x", "zed", "y"])
    assert e.value.what == f"no runs of provider x, y under {tmp_path} (providers: lab, zed)"
    with pytest.raises(UsageError) as e:
        R.evaluate(tmp_path, "r3")
    assert e.value.what == f"no runs under {tmp_path} to judge"
    _runs(monkeypatch, [("r3", [])])
    with pytest.raises(UsageError) as e:
        R.evaluate(tmp_path, None, ["x"])
    assert e.value.what == f"no runs of provider x under {tmp_path}"
    with pytest.raises(UsageError) as e:
        R.evaluate(tmp_path)
    assert e.value.what == f"no runs under {tmp_path} to judge"



def _hist_row(run: str, value: float, *, scope: str = "single", size: int = 1 << 30,
              span: str = "single", suite: str = "s1", nodes: str = "n1") -> dict[str, Any]:
    return {"run_id": run, "provider": "p", "scope": scope, "engine": "nccl-tests",
            "metric": "busbw", "size_key": size, "span": span, "value": value,
            "node": "n1" if span == "single" else None, "suite_hash": suite, "nodes": nodes}


def test_shifts_of_the_judged_series_over_the_history_in_its_order() -> None:
    runs = [f"r{i * 5 % 12:02}" for i in range(12)]  # ids that do not sort in time order
    wiggle = (0.2, -0.2, 0.1, -0.1)
    rows = []
    for i, r in enumerate(runs):
        w = wiggle[i % 4]
        rows.append(_hist_row(r, (100.0 if i < 8 else 80.0) + w))
        rows.append(_hist_row(r, 100.0 + w, size=2 << 30) if i < 8 else
                    _hist_row(r, 98.5 + w, size=2 << 30))
        rows.append(_hist_row(r, 500.0 + w, suite="other"))  # another suite: left out
        if i < 11:  # a series the judged run does not have: never shown
            rows.append(_hist_row(r, (50.0 if i < 6 else 25.0) + w, scope="multi",
                                  span="multi"))
    df = pd.DataFrame(rows[::-1])  # stored order is not the history's order
    started = {r: f"2026-01-{i + 1:02}T00:00:00Z" for i, r in enumerate(runs)}
    del started[runs[8]]
    out = R._shifts(df, runs[11], runs, "s1", started, 0.03)
    assert [(s.key, s.run_id, s.started, s.runs) for s in out] == [(BUS, runs[8], "", 12)]
    (s,) = out
    assert s.before == pytest.approx(100.0, abs=0.1) and s.after == pytest.approx(80.0, abs=0.1)
    assert s.change == pytest.approx(-0.2, abs=0.002)
    # the minimum effect is passed on: without it the 1.5% step is a change point too
    assert {x.key.size for x in R._shifts(df, runs[11], runs, "s1", started, 0.0)} == {
        1 << 30, 2 << 30}
    started[runs[8]] = "t8"
    assert R._shifts(df, runs[11], runs, "s1", started, 0.03)[0].started == "t8"


def test_bands_are_looked_up_per_key_with_the_runs_node_count(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls: list[tuple[Any, ...]] = []
    band = (BAND, "shipped")

    def band_for(root: Path, run_id: str, provider: str, key: SeriesKey,
                 machine: MachineClass, nodes: int) -> tuple[Band, str] | None:
        calls.append((root, run_id, provider, key.scope, key.size, machine, nodes))
        return None if key.size == 4 << 30 else band

    monkeypatch.setattr(R, "band_for", band_for)
    multi = SeriesKey("p", "multi", "nccl-tests", "busbw", 1 << 30, "multi")
    none = SeriesKey("p", "multi", "nccl-tests", "busbw", 4 << 30, "multi")
    df = pd.DataFrame([_hist_row("r2", 1.0, scope="multi", span="multi", nodes="n1,n2,n3"),
                       _hist_row("r2", 1.0, scope="multi", span="multi", nodes="n1,n2"),
                       _hist_row("r1", 1.0, scope="multi", span="multi", nodes="a,b,c,d"),
                       _hist_row("r2", 1.0, scope="single", nodes="a,b,c,d,e")])
    m = MachineClass("H200", 8)
    got = R._bands(tmp_path, "r2", "p", {BUS, multi, none}, m, df)
    assert got == {BUS: band, multi: band}
    assert sorted(calls, key=lambda c: (c[3], c[4])) == [
        (tmp_path, "r2", "p", "multi", 1 << 30, m, 3), (tmp_path, "r2", "p", "multi", 4 << 30, m, 3),
        (tmp_path, "r2", "p", "single", 1 << 30, m, 1)]
    calls.clear()
    R._bands(tmp_path, "r9", "p", {multi}, m, df)  # no rows of the run: one node
    assert [c[-1] for c in calls] == [1]


def test_a_provider_with_nothing_measured_is_not_enough_data_in_words(tmp_path: Path) -> None:
    from tests.bench.regress_bench import make_history, write_run

    root = tmp_path / "results"
    make_history(root, 2, rounds=2)
    empty = write_run(root, 5, "zed", {})
    ev = R.evaluate(root)
    assert [p.provider for p in ev.providers] == ["lab", "zed"]
    zed = ev.providers[1]
    assert (zed.provider, zed.run_id, zed.source, zed.shifts, zed.bands) == (
        "zed", None, None, [], {})
    assert zed.verdict == R.ProviderVerdict("zed", "NOT ENOUGH DATA", "none", (),
                                            "no measured run of this provider")
    (zed,) = R.evaluate(root, empty, ["zed"]).providers
    assert (zed.run_id, zed.source) == (empty, None)
    assert zed.verdict == R.ProviderVerdict("zed", "NOT ENOUGH DATA", "none", (),
                                            "no comparable measurements in this run")


def test_the_worst_series_weighs_each_metrics_direction() -> None:
    odd = SeriesKey("p", "single", "nccl-tests", "odd", -1, "single")
    rows = [_row(BUS, None, _c("REGRESSED", -0.25)), _row(STEP, None, _c("REGRESSED", 0.375))]
    assert R.provider_verdict("p", rows).summary.endswith("worst step_time_s train multi +37.5%")
    rows = [_row(odd, None, _c("REGRESSED", -0.2)), _row(BUS, None, _c("REGRESSED", -0.3))]
    assert R.provider_verdict("p", rows).summary.endswith("worst busbw single 1 GiB -30.0%")


def test_lone_nodes_of_several_series_are_all_named() -> None:
    rows = [_row(BUS, None, _c("UNCHANGED")), _row(BUS, "n1", _c("REGRESSED", -0.25)),
            _row(BUS, "n2", _c("UNCHANGED")),
            _row(BUS2, None, _c("UNCHANGED")), _row(BUS2, "n1", _c("UNCHANGED")),
            _row(BUS2, "n2", _c("REGRESSED", -0.125))]
    pv = R.provider_verdict("p", rows)
    assert (pv.attribution, pv.nodes) == ("node", ("n1", "n2"))
    assert pv.summary.startswith("nodes n1, n2 regressed alone")
    assert pv.summary.endswith("worst n1 busbw single 1 GiB -25.0%")


def test_judge_gives_each_node_its_own_samples_and_the_settings() -> None:
    base = [_s(BUS, v, n, "b") for v in (100.0, 101.0, 99.0) for n in ("n1", "n2")]
    cur = [_s(BUS, v, "n1") for v in (100.0, 100.5, 99.5)] + [_s(BUS, 100.0, "n2")] * 2
    rep = R.judge("cur", cur, base)
    assert [(r.node, r.result.n_cur) for r in rep.rows] == [(None, 5), ("n1", 3), ("n2", 2)]
    base = [_s(STEP, v, None, "b") for v in (1.0, 1.01, 0.99, 1.0, 1.01, 0.99)]
    slower = [_s(STEP, v, None) for v in (1.5, 1.51, 1.49)]
    rep = R.judge("cur", slower, base, Settings(test="welch", min_effect=0.6))
    assert rep.rows[0].result.verdict == "UNCHANGED"
    assert "at least 60%" in rep.providers[0].summary
    odd = SeriesKey("p", "single", "nccl-tests", "odd", -1, "single")
    rep = R.judge("cur", [_s(odd, v, None) for v in (0.5, 0.51, 0.49)],
                  [_s(odd, v, None, "b") for v in (1.0, 1.01, 0.99, 1.0, 1.01, 0.99)],
                  Settings(test="welch"))
    assert rep.rows[0].result.verdict == "REGRESSED"  # no direction known: higher is better


# --- evaluate, on hand-built frames (no results store) --------------------------------------

_EV_RUNS = [("q1", ["p", "z"], "passed"), ("q2", ["p", "z"], "failed"),
            ("q3", ["p"], "interrupted"), ("q4", ["p"], "passed"), ("q5", ["z"], "passed"),
            ("q6", ["p", "z", "y"], "running")]
BUS_TAIL = ("single", "nccl-tests", "busbw", 1 << 30, "single")
_EV_COLS = ["run_id", "provider", "scope", "engine", "metric", "size_key", "span", "value",
            "node"]


def _ev_frame(provider: str, values: dict[str, tuple[float, ...]]) -> pd.DataFrame:
    return pd.DataFrame([(r, provider, "single", "nccl-tests", "busbw", 1 << 30, "single", v,
                          "n1") for r, vs in values.items() for v in vs], columns=_EV_COLS)


@pytest.fixture
def ev_store(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, Any]:
    runs = pd.DataFrame([{"run_id": r, "providers": ps, "status": st,
                          "started": f"2026-01-0{r[1]}T00:00:00Z"} for r, ps, st in _EV_RUNS])
    base = (100.0, 101.0, 99.0, 100.5, 99.5, 100.0)
    dfs = {"p": _ev_frame("p", {"q1": base, "q2": base, "q3": base,
                                "q4": tuple(v - 20 for v in base), "q6": (50.0, 50.0)}),
           "z": _ev_frame("z", {"q2": base, "q6": base}),
           "y": pd.DataFrame(columns=_EV_COLS)}
    machine = MachineClass("H200", 8)
    sources = {"p": BaselineSource("automatic", ("q1", "q4"), machine, "s1"),
               "z": BaselineSource("automatic", (), machine, "s2")}
    calls: dict[str, list[Any]] = {"frame": [], "resolve": [], "shifts": [], "bands": []}

    def sample_frame(root: Path, provider: str, *, min_size: int) -> pd.DataFrame:
        calls["frame"].append((root, provider, min_size))
        return dfs[provider]

    def resolve(root: Path, provider: str, judged: str, df: pd.DataFrame, rs: pd.DataFrame,
                last: int) -> BaselineSource:
        assert df is dfs[provider] and rs is runs
        calls["resolve"].append((root, provider, judged, last))
        return sources[provider]

    def shifts(df: pd.DataFrame, judged: str, history: list[str], suite_hash: str,
               started: dict[str, str], min_effect: float) -> list[Any]:
        assert df is dfs[str(df["provider"].iloc[0])]
        calls["shifts"].append((judged, history, suite_hash, started, min_effect))
        return [("shift", judged)]

    def bands(root: Path, judged: str, provider: str, keys: set[SeriesKey],
              machine: MachineClass, df: pd.DataFrame) -> dict[Any, Any]:
        assert df is dfs[provider]
        calls["bands"].append((root, judged, provider, keys, machine))
        return {"band": judged}

    monkeypatch.setattr(R.frames, "runs", lambda root: runs)
    monkeypatch.setattr(R, "sample_frame", sample_frame)
    monkeypatch.setattr(R, "resolve", resolve)
    monkeypatch.setattr(R, "_shifts", shifts)
    monkeypatch.setattr(R, "_bands", bands)
    # no busbw below --min-size either: a provider without a judged run has none measured
    monkeypatch.setattr(R.frames, "largest_size", lambda root, p, metric, run_id: None)
    return {"root": tmp_path, "calls": calls, "sources": sources, "machine": machine}


def test_evaluate_judges_each_providers_latest_finished_measured_run(ev_store) -> None:
    root, calls, sources = ev_store["root"], ev_store["calls"], ev_store["sources"]
    settings = Settings(test="welch", min_effect=0.05)
    ev = R.evaluate(root, settings=settings, last=7, min_size=1 << 20)
    assert calls["frame"] == [(root, "p", 1 << 20), (root, "z", 1 << 20), (root, "y", 1 << 20)]
    # the running q6 is never the latest; z's latest measured run is the failed q2
    assert calls["resolve"] == [(root, "p", "q4", 7), (root, "z", "q2", 7)]
    started = {r: f"2026-01-0{r[1]}T00:00:00Z" for r, _, _ in _EV_RUNS}
    # the history: finished runs (passed or failed) up to the judged one, in store order
    assert calls["shifts"] == [("q4", ["q1", "q2", "q4"], "s1", started, 0.05),
                               ("q2", ["q1", "q2"], "s2", started, 0.05)]
    bus = SeriesKey("p", *BUS_TAIL)
    assert calls["bands"] == [(root, "q4", "p", {bus}, ev_store["machine"]),
                              (root, "q2", "z", {SeriesKey("z", *BUS_TAIL)}, ev_store["machine"])]
    assert ev.settings == settings
    assert [(rep.run_id, rep.settings) for rep in ev.reports] == [("q4", settings),
                                                                  ("q2", settings)]
    (row,) = ev.reports[0].rows
    # the judged run's samples against the baseline's, the judged run left out of those
    assert (row.key, row.node, row.result.n_cur, row.result.n_base) == (bus, None, 6, 6)
    assert row.result.verdict == "REGRESSED" and ev.regressed
    p, z, y = ev.providers
    assert (p.provider, p.run_id, p.source, p.shifts, p.bands) == (
        "p", "q4", sources["p"], [("shift", "q4")], {"band": "q4"})
    assert (p.verdict.verdict, p.verdict.attribution) == ("REGRESSED", "provider")
    assert p.verdict.summary.startswith("provider p regressed as a whole in 1 series")
    assert (z.provider, z.run_id, z.source, z.shifts, z.bands) == (
        "z", "q2", sources["z"], [("shift", "q2")], {"band": "q2"})
    assert z.verdict == R.ProviderVerdict(
        "z", "NOT ENOUGH DATA", "none", (),
        "no baseline: none: no complete earlier run of this suite and machine class")
    assert (y.provider, y.run_id, y.source, y.shifts, y.bands) == ("y", None, None, [], {})
    assert y.verdict == R.ProviderVerdict("y", "NOT ENOUGH DATA", "none", (),
                                          "no measured run of this provider")


def test_evaluate_of_a_named_run_and_the_defaults(ev_store) -> None:
    root, calls = ev_store["root"], ev_store["calls"]
    (p,) = R.evaluate(root, "q3").providers  # an interrupted run, named: judged all the same
    assert calls["frame"] == [(root, "p", R.MIN_SIZE)]
    assert calls["resolve"] == [(root, "p", "q3", R.DEFAULT_LAST)]
    assert [c[:3] + c[4:] for c in calls["shifts"]] == [("q3", ["q1", "q2", "q3"], "s1", 0.03)]
    assert p.run_id == "q3"
    assert [(r.result.n_cur, r.result.n_base) for r in R.evaluate(root, "q3").rows] == [(6, 12)]
    for c in calls.values():
        c.clear()
    ev = R.evaluate(root, "q2", ["z", "p"])
    assert [(e.provider, e.run_id) for e in ev.providers] == [("z", "q2"), ("p", "q2")]
    assert [rep.run_id for rep in ev.reports] == ["q2"]  # one report for the run
    assert [r.key.provider for r in ev.reports[0].rows] == ["p", "z"]
    assert calls["resolve"] == [(root, "z", "q2", R.DEFAULT_LAST),
                                (root, "p", "q2", R.DEFAULT_LAST)]
    (z,) = R.evaluate(root, "q5").providers  # z measured nothing in q5
    assert (z.provider, z.run_id, z.source) == ("z", "q5", None)
    assert z.verdict.summary == "no comparable measurements in this run"
    (z,) = R.evaluate(root, None, ["z"]).providers
    assert z.run_id == "q2"
    # a provider with nothing measured does not end the others' evaluation
    ev = R.evaluate(root, None, ["y", "p"])
    assert [(e.provider, e.run_id) for e in ev.providers] == [("y", None), ("p", "q4")]


def test_the_worst_lone_node_weighs_each_metrics_direction() -> None:
    odd = SeriesKey("p", "single", "nccl-tests", "odd", -1, "single")

    def lone(key: SeriesKey, change: float, node: str = "n2") -> list[R.Row]:
        return [_row(key, None, _c("UNCHANGED")), _row(key, "n1", _c("UNCHANGED")),
                _row(key, node, _c("REGRESSED", change))]

    pv = R.provider_verdict("p", lone(BUS, -0.25) + lone(STEP, 0.375, "n3"))
    assert (pv.attribution, pv.nodes) == ("node", ("n2", "n3"))
    assert pv.summary.endswith("worst n3 step_time_s train multi +37.5%")
    pv = R.provider_verdict("p", lone(odd, -0.2, "n3") + lone(BUS, -0.3))
    assert pv.summary.endswith("worst n2 busbw single 1 GiB -30.0%")
    pv = R.provider_verdict("p", lone(BUS, -0.3) + lone(odd, -0.375, "n3"))
    assert pv.summary.endswith("worst n3 odd single -37.5%")
