"""Regression verdicts: the statistics on seeded samples, and a run judged from the store."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from orchestrator.analysis import regress
from orchestrator.analysis.baseline import Sample, SeriesKey
from orchestrator.analysis.regress import Settings, compare_all
from orchestrator.errors import UsageError
from tests.bench.regress_bench import SIZES, busbw_values, make_history, write_run


def _drop_pairs(rng: np.random.Generator, nb: int, nc: int, m: int, drop: float,
                cv: float = 0.02) -> list[tuple[np.ndarray, np.ndarray, int]]:
    pairs = [(rng.normal(100, 100 * cv, nb), rng.normal(100 * (1 - drop), 100 * cv, nc), 1)]
    return pairs + [(rng.normal(100, 100 * cv, nb), rng.normal(100, 100 * cv, nc), 1)
                    for _ in range(m - 1)]


def test_a_5_percent_drop_at_2_percent_cv_is_detected_with_the_stated_counts() -> None:
    """10 samples of the run (5 rounds x 2 nodes) against 30 of the baseline (10 runs x 3
    rounds), among 50 series judged together: found in at least 90% of seeds (the bench
    measures 98%)."""
    seeds = 60
    found = sum(compare_all(_drop_pairs(np.random.default_rng(s), 30, 10, 50, 0.05))[0].verdict
                == "REGRESSED" for s in range(seeds))
    assert found / seeds >= 0.90, found
    one = compare_all(_drop_pairs(np.random.default_rng(1), 30, 10, 50, 0.05))[0]
    assert one.mde is not None and one.mde < 0.05  # it says so itself: 5% was detectable


def _alarm_rate(n_run: int, seeds: int, settings: Settings, tests: int = 20) -> float:
    alarms = 0
    for s in range(seeds):
        rng = np.random.default_rng(50_000 + s)
        pairs = [(rng.normal(100, 2, 30), rng.normal(100, 2, n_run), 1) for _ in range(tests)]
        alarms += any(r.verdict != "UNCHANGED" for r in compare_all(pairs, settings))
    return alarms / seeds


def test_stationary_runs_raise_false_alarms_below_alpha() -> None:
    """20 unchanged series per run (2% cv), the default settings: the share of runs with
    any verdict but UNCHANGED stays below alpha = 5%."""
    assert _alarm_rate(6, 150, Settings()) <= 0.05


@pytest.mark.parametrize("n_run", [3, 10])
def test_without_a_minimum_effect_bh_alone_holds_alpha(n_run: int) -> None:
    """Nothing to hide behind: BH keeps the per-run false-alarm rate at alpha, within the
    sampling error of 150 seeds (three binomial standard errors)."""
    seeds = 150
    rate = _alarm_rate(n_run, seeds, Settings(min_effect=0.0))
    assert rate <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / seeds), rate


def test_welch_is_liberal_with_three_samples_which_is_why_it_is_not_the_default() -> None:
    assert _alarm_rate(3, 100, Settings(test="welch", min_effect=0.0)) > 0.15
    assert Settings().test == "mwu"


def test_without_correction_the_same_runs_would_cry_wolf() -> None:
    """Why BH is there: twenty tests at 5% each flag most stationary runs somewhere."""
    from scipy import stats

    seeds, raw = 100, 0
    for s in range(seeds):
        rng = np.random.default_rng(50_000 + s)
        ps = [stats.ttest_ind(rng.normal(100, 2, 6), rng.normal(100, 2, 30),
                              equal_var=False).pvalue for _ in range(20)]
        raw += min(ps) < 0.05
    assert raw / seeds > 0.4


def test_a_verdict_states_change_interval_and_detectable_change() -> None:
    rng = np.random.default_rng(3)
    base, cur = rng.normal(300, 3, 30), rng.normal(270, 3, 6)
    (c,) = compare_all([(base, cur, 1)])
    assert c.verdict == "REGRESSED"
    assert c.change == pytest.approx(cur.mean() / base.mean() - 1)
    assert c.ci_low is not None and c.ci_high is not None
    assert c.ci_low < -0.10 < c.ci_high and c.ci_high < 0
    # 1% cv, 36 samples: about 1% was detectable; the verdict cannot call under 3%
    assert c.mde_stat is not None and 0.005 < c.mde_stat < 0.02 and c.mde == 0.03
    assert c.n_base == 30 and c.n_cur == 6 and c.q is not None and c.q < 1e-4


def test_direction_and_minimum_effect() -> None:
    rng = np.random.default_rng(4)
    base = rng.normal(100, 0.5, 30)
    faster = rng.normal(110, 0.5, 6)
    tiny = rng.normal(99, 0.5, 6)  # -1%: significant, below the 3% minimum
    res = compare_all([(base, faster, 1), (base, faster, -1), (base, tiny, 1)])
    assert [r.verdict for r in res] == ["IMPROVED", "REGRESSED", "UNCHANGED"]
    assert "minimum effect" in res[2].reason and res[2].q is not None and res[2].q < 0.05


def test_a_q_value_exactly_at_alpha_is_significant() -> None:
    """`q <= alpha`: three against three, fully apart, gives Mann-Whitney's smallest p
    (2 / C(6, 3) = 0.1); with alpha set to that p the change is called, just above not."""
    from scipy import stats

    base, cur = [1.0, 1.1, 1.2], [0.5, 0.6, 0.7]
    p = float(stats.mannwhitneyu(cur, base, alternative="two-sided").pvalue)
    (c,) = compare_all([(base, cur, 1)], Settings(alpha=p, min_effect=0.0))
    assert c.q == p and c.verdict == "REGRESSED", c
    (c,) = compare_all([(base, cur, 1)], Settings(alpha=p * 0.999, min_effect=0.0))
    assert c.verdict == "UNCHANGED" and "not significant" in c.reason


def test_a_change_exactly_at_the_minimum_effect_is_called() -> None:
    """`abs(change) >= min_effect`: a significant change equal to the minimum effect is a
    verdict, not "below the minimum effect"; both directions."""
    base = np.asarray([100.0, 101.0, 99.0, 100.5, 99.5] * 6)
    for cur, direction, verdict in ((base[:10] * 0.9 + 0.25, 1, "REGRESSED"),
                                    (base[:10] * 1.1 - 0.25, 1, "IMPROVED")):
        change = float(np.mean(cur)) / float(np.mean(base)) - 1  # as compare_all computes it
        (c,) = compare_all([(base, cur, direction)], Settings(min_effect=abs(change)))
        assert c.change == change and c.verdict == verdict, c
        (c,) = compare_all([(base, cur, direction)],
                           Settings(min_effect=abs(change) * (1 + 1e-9)))
        assert c.verdict == "UNCHANGED" and "below the" in c.reason


def test_too_few_samples_is_not_enough_data() -> None:
    res = compare_all([([300.0], [250.0], 1), ([300.0, 301.0], [], 1), ([], [1.0, 2.0], 1)])
    assert [r.verdict for r in res] == ["NOT ENOUGH DATA"] * 3
    assert "samples" in res[0].reason


def test_one_sample_is_judged_against_the_baseline_spread() -> None:
    """A training run gives one step time: a prediction interval from the baseline's runs."""
    base = [0.420, 0.424, 0.418, 0.421, 0.423]
    slow, same = compare_all([(base, [0.50], -1), (base, [0.4215], -1)])
    assert slow.verdict == "REGRESSED" and slow.change == pytest.approx(0.50 / 0.4212 - 1, 1e-3)
    assert same.verdict == "UNCHANGED"


def test_mann_whitney_cannot_detect_anything_with_three_against_three() -> None:
    """Its smallest p-value there is 0.1: it says so instead of pretending; Welch can."""
    (c,) = compare_all([([1.0, 1.1, 1.2], [0.5, 0.6, 0.7], 1)])
    assert c.verdict == "UNCHANGED" and c.mde is not None and math.isinf(c.mde)
    (w,) = compare_all([([1.0, 1.1, 1.2], [0.5, 0.6, 0.7], 1)], Settings(test="welch"))
    assert w.verdict == "REGRESSED" and w.mde is not None and not math.isinf(w.mde)


# --- node against provider ------------------------------------------------------------------------

KEY = SeriesKey("lab", "single", "nccl-tests", "busbw", 128 << 20, "single")


def _samples(rng: np.random.Generator, nodes: list[str], rounds: int, runs: int,
             factor: dict[str, float]) -> list[Sample]:
    return [Sample(KEY, float(300 * factor.get(n, 1.0) * rng.normal(1, 0.01)), n, f"r{k}")
            for k in range(runs) for n in nodes for _ in range(rounds)]


def test_a_lone_bad_node_is_attributed_to_the_node() -> None:
    rng = np.random.default_rng(8)
    nodes = ["n1", "n2", "n3", "n4"]
    base = _samples(rng, nodes, 3, 8, {})
    cur = _samples(rng, nodes, 5, 1, {"n3": 0.85})
    rep = regress.judge("now", cur, base)
    (pv,) = rep.providers
    assert pv.verdict == "REGRESSED" and pv.attribution == "node" and pv.nodes == ("n3",)
    assert "n3 regressed alone" in pv.summary
    verdicts = {r.subject: r.result.verdict for r in rep.rows}
    assert verdicts["n3"] == "REGRESSED"
    assert {verdicts[n] for n in ("n1", "n2", "n4")} == {"UNCHANGED"}


def test_every_node_down_is_the_provider() -> None:
    rng = np.random.default_rng(9)
    nodes = ["n1", "n2", "n3", "n4"]
    base = _samples(rng, nodes, 3, 8, {})
    cur = _samples(rng, nodes, 5, 1, dict.fromkeys(nodes, 0.9))
    (pv,) = regress.judge("now", cur, base).providers
    assert pv.verdict == "REGRESSED" and pv.attribution == "provider" and pv.nodes == ()
    assert "as a whole" in pv.summary


def test_unchanged_provider_says_what_it_could_have_seen() -> None:
    rng = np.random.default_rng(10)
    nodes = ["n1", "n2"]
    (pv,) = regress.judge("now", _samples(rng, nodes, 3, 1, {}),
                          _samples(rng, nodes, 3, 10, {})).providers
    assert pv.verdict == "UNCHANGED" and "could have detected" in pv.summary


# --- from the store -----------------------------------------------------------------------------

def test_the_latest_run_is_judged_against_the_last_complete_runs(tmp_path: Path) -> None:
    root = tmp_path / "results"
    ids = make_history(root, 12, shift_at=11, shift=0.9, rounds=3)
    ev = regress.evaluate(root)
    (p,) = ev.providers
    assert p.run_id == ids[-1] and p.verdict.verdict == "REGRESSED"
    assert p.verdict.attribution == "provider" and ev.regressed
    assert p.source is not None and p.source.kind == "automatic"
    assert p.source.runs == tuple(ids[1:11])  # the last 10 before it
    rows = [r for r in ev.rows if not r.is_node]
    assert {r.key.size for r in rows} == set(SIZES)
    for r in rows:  # out-of-place only: the in-place rows are stored at half the value
        assert r.result.n_cur == 6 and r.result.n_base == 60
        assert r.result.base_mean == pytest.approx(300, rel=0.02)
    # an earlier run of the same history is unchanged
    assert regress.evaluate(root, ids[10]).providers[0].verdict.verdict == "UNCHANGED"


def test_failed_and_foreign_runs_are_left_out_of_the_automatic_baseline(tmp_path: Path) -> None:
    root = tmp_path / "results"
    rng = np.random.default_rng(0)
    good = [write_run(root, i, "lab", busbw_values(rng, ["n1"], 3, 300, 0.01))
            for i in range(3)]
    # slower runs that must not count: failed, a FAIL finding, another suite, another GPU
    write_run(root, 3, "lab", busbw_values(rng, ["n1"], 3, 200, 0.01), status="failed")
    write_run(root, 4, "lab", busbw_values(rng, ["n1"], 3, 200, 0.01), fail=True)
    write_run(root, 5, "lab", busbw_values(rng, ["n1"], 3, 200, 0.01), suite_hash="other")
    write_run(root, 6, "lab", busbw_values(rng, ["n1"], 3, 200, 0.01), gpu=("NVIDIA H100", 8))
    now = write_run(root, 7, "lab", busbw_values(rng, ["n1"], 3, 300, 0.01))
    (p,) = regress.evaluate(root, now).providers
    assert p.source is not None and p.source.runs == tuple(good)
    assert len(p.source.left_out) == 4
    assert p.verdict.verdict == "UNCHANGED"


def test_change_points_mark_the_run_where_the_history_shifted(tmp_path: Path) -> None:
    root = tmp_path / "results"
    ids = make_history(root, 30, shift_at=20, shift=0.9, cv=0.01, rounds=2)
    (p,) = regress.evaluate(root).providers
    assert p.shifts and {s.run_id for s in p.shifts} == {ids[20]}
    assert all(s.change == pytest.approx(-0.10, abs=0.02) for s in p.shifts)
    table = regress.shifts_table(regress.evaluate(root))
    assert table.rows and table.rows[0][2] == ids[20]


def test_no_history_is_not_enough_data_and_bad_input_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "results"
    (only,) = make_history(root, 1)
    ev = regress.evaluate(root)
    assert ev.providers[0].verdict.verdict == "NOT ENOUGH DATA" and not ev.regressed
    assert "no baseline" in ev.providers[0].verdict.summary
    with pytest.raises(UsageError, match="no run 20990101-000000-abcd"):
        regress.evaluate(root, "20990101-000000-abcd")
    with pytest.raises(UsageError, match="no provider nope"):
        regress.evaluate(root, only, ["nope"])
    with pytest.raises(UsageError, match="no runs of provider nope"):
        regress.evaluate(root, None, ["nope"])
    with pytest.raises(UsageError, match="no results under"):
        regress.evaluate(tmp_path / "empty")


# --- the command ----------------------------------------------------------------------------------

def test_regress_command_exit_codes_json_and_textfile(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from tests.unit.clirun import gpuvet

    root = tmp_path / "results"
    ids = make_history(root, 12, shift_at=11, shift=0.9)
    res = gpuvet(capsys, "regress", "--results", root)
    assert res.returncode == 1, res.output
    assert "REGRESSED" in res.stdout and "as a whole" in res.stdout
    res = gpuvet(capsys, "regress", ids[10], "--results", root, "--json",
                 "--prom-file", tmp_path / "g.prom")
    assert res.returncode == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["providers"][0]["verdict"] == "UNCHANGED" and doc["regressed"] is False
    assert doc["providers"][0]["baseline"]["runs"] == ids[:10]
    assert {t["subject"] for t in doc["tests"]} == {"provider:lab", "n1", "n2"}
    assert all(t["mde"] is not None and t["ci_low"] is not None for t in doc["tests"])
    assert 'gpuvet_regress_verdict{provider="lab",verdict="UNCHANGED"} 1.0' in \
        (tmp_path / "g.prom").read_text()
    res = gpuvet(capsys, "regress", "--results", root, "--test", "welch", "--min-effect",
                 "0.5", "--json")
    assert res.returncode == 0 and json.loads(res.stdout)["settings"]["test"] == "welch"


def test_regress_command_bad_input_is_exit_2(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    from tests.unit.clirun import gpuvet

    root = tmp_path / "results"
    (only,) = make_history(root, 1)
    res = gpuvet(capsys, "regress", "--results", root)
    assert res.returncode == 0 and "NOT ENOUGH DATA" in res.stdout  # no baseline yet
    for args, msg in ((["20990101-000000-0000"], "no run 20990101-000000-0000"),
                      (["not-a-run"], "no run not-a-run"),
                      (["-p", "nope"], "no runs of provider nope"),
                      (["--prom-file", tmp_path / "x.txt"], "ending in .prom"),
                      (["--alpha", "2"], "--alpha"),
                      (["--min-size", "lots"], "--min-size")):
        res = gpuvet(capsys, "regress", "--results", root, *args)
        assert res.returncode == 2, (args, res.output)
        assert msg in res.stderr and "Traceback" not in res.stderr
    res = gpuvet(capsys, "regress", "--results", tmp_path / "none")
    assert res.returncode == 2 and "no results under" in res.stderr
    help_text = gpuvet(capsys, "regress", "--help").stdout
    assert "NOT ENOUGH DATA" in help_text and "1 REGRESSED" in help_text


def test_baseline_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from tests.unit.clirun import gpuvet

    root = tmp_path / "results"
    ids = make_history(root, 5)
    res = gpuvet(capsys, "baseline", "show", "--results", root)
    assert res.returncode == 0 and "no baseline set by hand" in res.stdout
    res = gpuvet(capsys, "baseline", "set", "-p", "lab", "--runs", ids[0], ids[1],
                 "--results", root)  # several values after one --runs, as the docs write it
    assert res.returncode == 0, res.output
    assert f"2 series from 2 run(s): {ids[0]}, {ids[1]}" in res.stdout
    from orchestrator.analysis.baseline import records_table
    from orchestrator.store import Index

    table = records_table(root, Index(root).baselines(), "t").as_dicts()
    band = {r["series"]: r["band"] for r in table}
    assert band == {"busbw single 64 MiB": None,  # no shipped band at that size
                    "busbw single 128 MiB": "285 (250-320, shipped)"}
    res = gpuvet(capsys, "baseline", "show", "--results", root, "--json")
    recs = json.loads(res.stdout)["baselines"]
    assert {r["size"] for r in recs} == set(SIZES) and recs[0]["runs"] == ids[:2]
    res = gpuvet(capsys, "baseline", "set", "-p", "lab", "--results", root)
    assert res.returncode == 2 and "either --runs" in res.stderr
    res = gpuvet(capsys, "regress", "--results", root, "--json")
    assert json.loads(res.stdout)["providers"][0]["baseline"]["kind"] == "stored"


def test_rows_keep_the_node_as_a_field_and_tables_name_the_provider_in_words() -> None:
    rng = np.random.default_rng(8)
    nodes = ["n1", "n2", "n3", "n4"]
    rep = regress.judge("now", _samples(rng, nodes, 5, 1, {"n3": 0.85}),
                        _samples(rng, nodes, 3, 8, {}))
    ev = regress.Evaluation(Settings(), [rep], [])
    prov = [r for r in rep.rows if not r.is_node]
    assert [(r.node, r.subject, r.label) for r in prov] == [
        (None, f"provider:{KEY.provider}", f"provider {KEY.provider} (all nodes)")]
    assert sorted(r.node for r in rep.rows if r.is_node) == nodes
    rows = regress.tests_table(ev, verbose=True).rows
    assert [r[1] for r in rows] == [f"provider {KEY.provider} (all nodes)", *nodes]
    assert [r[1] for r in regress.tests_table(ev).rows] == [
        f"provider {KEY.provider} (all nodes)", "n3"]
    assert {t["subject"] for t in regress.as_json(ev)["tests"]} == {f"provider:{KEY.provider}",
                                                                   *nodes}


def test_a_baseline_never_holds_the_run_it_judges(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """`baseline set --last 1` takes the newest run; `regress` then judges that run: it is
    left out of the baseline, with a note, never compared with itself (UNCHANGED)."""
    import json

    from tests.unit.clirun import gpuvet

    root = tmp_path / "results"
    ids = make_history(root, 4)
    res = gpuvet(capsys, "baseline", "set", "-p", "lab", "--last", "1", "--results", root)
    assert res.returncode == 0, res.output
    assert f"note: the baseline holds {ids[-1]}, lab's newest measured run" in res.stderr
    doc = json.loads(gpuvet(capsys, "regress", "--results", root, "--json").stdout)
    (p,) = doc["providers"]
    assert p["run_id"] == ids[-1] and p["verdict"] == "NOT ENOUGH DATA"
    assert p["baseline"]["runs"] == []
    assert p["baseline"]["left_out"] == [
        f"{ids[-1]} left out: the run judged is never its own baseline"]
    assert "left out: the run judged is never its own baseline" in p["summary"]
    # two runs set: the newest is judged against the other one alone
    gpuvet(capsys, "baseline", "set", "-p", "lab", "--last", "2", "--results", root)
    doc = json.loads(gpuvet(capsys, "regress", "--results", root, "--json").stdout)
    assert doc["providers"][0]["baseline"]["runs"] == [ids[-2]]
    assert {t["n_base"] for t in doc["tests"]} == {6}  # one run: rounds x nodes
    # an older run judged by name keeps the whole baseline, no note
    doc = json.loads(gpuvet(capsys, "regress", ids[0], "--results", root, "--json").stdout)
    assert doc["providers"][0]["baseline"]["runs"] == ids[-2:]
    assert doc["providers"][0]["baseline"]["left_out"] == []
    res = gpuvet(capsys, "baseline", "set", "-p", "lab", "--runs", ids[0], "--results", root)
    assert "note:" not in res.stderr


def test_regress_and_baseline_suggest_the_nearest_provider_and_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.unit.clirun import gpuvet

    root = tmp_path / "results"
    ids = make_history(root, 2)
    typo = ids[0][:-1] + ("9" if not ids[0].endswith("9") else "8")
    for argv in (["regress", typo], ["baseline", "set", "-p", "lab", "--runs", typo]):
        res = gpuvet(capsys, *argv, "--results", root)
        assert res.returncode == 2, res.output
        assert f"no run {typo}" in res.stderr and "(did you mean '" in res.stderr, res.stderr
    res = gpuvet(capsys, "regress", "-p", "lbb", "--results", root)
    assert res.returncode == 2 and "provider lbb (did you mean 'lab'?)" in res.stderr
