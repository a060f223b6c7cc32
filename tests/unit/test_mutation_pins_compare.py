"""compare.py's tables pinned on exact values, from frames built by hand: which
measurements each table reads (provider, metric, scope, engine, in-place, the
16 MiB floor), every cell, and the suite gate's table of differing parameters
(the survivors of `make mutation` on orchestrator/analysis/compare.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
import pytest

from orchestrator.analysis import compare as C
from orchestrator.errors import UsageError
from orchestrator.records import Finding, finding

MIB = 1 << 20


def _m(provider: str, value: float, *, size: int = 64 * MIB, scope: str = "single",
       metric: str = "busbw", engine: str = "nccl-tests", inplace: bool = False,
       nodes: str = "n1", rnd: int = 1, run: str = "r") -> dict[str, Any]:
    return {"run_id": run, "provider": provider, "nodes": nodes, "step": "nccl",
            "scope": scope, "engine": engine, "metric": metric, "size": size,
            "inplace": inplace, "round": rnd, "value": value}


def _f(provider: str, code: str, sev: str = "INFO", step: str = "nccl", node: str | None = "n1",
       msg: str = "said", run: str = "r", **details: Any) -> Finding:
    return finding(run, step, provider=provider, node=node, code=code,
                   severity=sev,  # type: ignore[arg-type]
                   message=msg, evidence=["x.txt"], **details)


def test_busbw_values_reads_out_of_place_nccl_tests_busbw_of_one_scope() -> None:
    ms = pd.DataFrame([_m("a", 1.0), _m("a", 2.0, rnd=2), _m("a", 3.0, size=128 * MIB),
                       _m("b", 9.0), _m("a", 9.0, metric="algbw"), _m("a", 9.0, scope="multi"),
                       _m("a", 9.0, engine="torch"), _m("a", 9.0, inplace=True)])
    got = C.busbw_values(ms, "a", "single")
    assert list(got) == [64 * MIB, 128 * MIB]
    assert got[64 * MIB].tolist() == [1.0, 2.0] and got[128 * MIB].tolist() == [3.0]
    assert all(isinstance(k, int) for k in got)


def test_ratio_ci_point_and_interval() -> None:
    a = np.array([100.0, 101.0, 99.0, 100.0])
    b = np.array([90.0, 91.0, 89.0, 90.0])
    point, lo, hi = C.ratio_ci(a, b)
    assert point == 0.9
    assert lo <= point <= hi and lo > 0.87 and hi < 0.93
    assert C.ratio_ci(a, b) == C.ratio_ci(a, b, seed=C.SEED)  # the fixed seed
    assert C.ratio_ci(a, b, n=200, seed=1) != C.ratio_ci(a, b, n=200, seed=2)
    p, lo1, hi1 = C.ratio_ci(np.array([100.0]), b)
    assert p == 0.9 and lo1 != lo1 and hi1 != hi1
    p, lo1, hi1 = C.ratio_ci(a, np.array([90.0]))
    assert p == 0.9 and lo1 != lo1 and hi1 != hi1
    p, lo1, hi1 = C.ratio_ci(np.array([0.0, 0.0]), b)
    assert p != p and lo1 != lo1 and hi1 != hi1
    # two values on each side are enough for an interval
    p, lo1, hi1 = C.ratio_ci(np.array([100.0, 100.0]), np.array([50.0, 50.0]))
    assert (p, lo1, hi1) == (0.5, 0.5, 0.5)


def test_ratio_ci_leaves_out_resamples_with_a_zero_median() -> None:
    a = np.array([0.0, 0.0, 10.0])  # median 0: no ratio at all
    assert np.isnan(C.ratio_ci(a, np.array([5.0, 5.0]))[0])
    a = np.array([0.0, 10.0, 10.0])  # some resamples have a median of 0
    point, lo, hi = C.ratio_ci(a, np.array([5.0, 5.0]))
    assert point == 0.5 and (lo, hi) == (0.5, 0.5)


@pytest.mark.parametrize(("n", "label"), [(1 << 30, "1 GiB"), (3 << 20, "3 MiB"),
                                           (1 << 10, "1 KiB"), (1023, "1023 B"),
                                           (1536, "1536 B"), ((1 << 30) + (1 << 20), "1025 MiB"),
                                           (0, "0 B")])
def test_size_label(n: int, label: str) -> None:
    assert C.size_label(n) == label


def test_busbw_table_cells() -> None:
    ms = pd.DataFrame([_m("a", 100.0), _m("a", 102.0, rnd=2), _m("a", 101.0, rnd=3),
                       _m("b", 50.0), _m("b", 51.0, rnd=2), _m("b", 49.0, rnd=3),
                       _m("a", 10.0, size=MIB), _m("b", 5.0, size=MIB, rnd=1),
                       _m("a", 1.0, size=MIB - 1),
                       _m("a", 7.0, size=2 * MIB, scope="multi", nodes="n1,n2"),
                       _m("c", 8.0, size=2 * MIB, scope="multi", nodes="m1,m2")])
    t = C.busbw_table(ms, ["a", "b", "c"])
    assert t.title == "busbw (all_reduce, out-of-place)"
    assert t.columns == ("scope", "size", "a median GB/s", "a min-max", "b median GB/s",
                         "b min-max", "c median GB/s", "c min-max", "b/a", "b/a 95% CI",
                         "c/a", "c/a 95% CI")
    a, b = np.array([100.0, 102.0, 101.0]), np.array([50.0, 51.0, 49.0])
    _, lo, hi = C.ratio_ci(a, b)
    assert t.rows == [
        ("single", "1 MiB", 10.0, "10.00-10.00", 5.0, "5.00-5.00", None, None, 0.5, "-",
         None, None),
        ("single", "64 MiB", 101.0, "100.00-102.00", 50.0, "49.00-51.00", None, None,
         0.495, f"{lo:.3f}-{hi:.3f}", None, None),
        ("multi", "2 MiB", 7.0, "7.00-7.00", None, None, 8.0, "8.00-8.00", None, None,
         1.143, "-"),
    ]
    assert [r[:2] for r in C.busbw_table(ms, ["a", "b"], min_size=1).rows] == [
        ("single", "1048575 B"), ("single", "1 MiB"), ("single", "64 MiB"), ("multi", "2 MiB")]
    assert C.busbw_table(ms, ["a", "b"], min_size=2 * MIB).rows[0][:2] == ("single", "64 MiB")
    assert C._r(1.23456) == 1.235 and C._r(float("nan")) is None and C._r(1.23456, 1) == 1.2


def test_stability_table_from_16_mib_per_scope_with_the_nccl_faults() -> None:
    big = 16 * MIB
    ms = pd.DataFrame([
        _m("a", 100.0, size=big), _m("a", 110.0, size=big, rnd=2),
        _m("a", 90.0, size=big, rnd=3),
        _m("a", 50.0, size=32 * MIB), _m("a", 50.0, size=32 * MIB, rnd=2),
        _m("a", 50.0, size=32 * MIB, rnd=3),
        _m("a", 1.0, size=big - 1, rnd=4), _m("a", 1.0, size=big, rnd=5, inplace=True),
        _m("a", 1.0, size=big, rnd=6, metric="algbw"), _m("a", 1.0, size=big, rnd=7,
                                                          engine="torch"),
        _m("a", 200.0, size=big, scope="multi", nodes="n1,n2"),
        _m("b", 1.0, size=big, rnd=9)])
    fs = [_f("a", "NCCL_ROUND_DROP", scope="single"), _f("a", "NCCL_ROUND_DROP"),
          _f("a", "NCCL_TIMEOUT", scope="multi"), _f("a", "NCCL_TEST_FAILURE", scope="single"),
          _f("a", "NCCL_TEST_FAILURE", scope="single"), _f("b", "NCCL_TIMEOUT"),
          _f("a", "NCCL_TIMEOUT", step="train")]
    t = C.stability_table(ms, fs, ["a", "c"])
    assert t.title == "stability (busbw from 16 MiB)"
    assert t.columns == ("provider", "scope", "rounds", "series", "cv median", "cv max",
                         "round drops", "timeouts", "failures/#wrong")
    assert t.rows == [("a", "single", 3, 1, 0.05, 0.1, 2, 0, 2),
                      ("a", "multi", 1, 1, None, None, 1, 1, 0)]


def test_transports_and_agreement_tables() -> None:
    fs = [_f("a", "NCCL_TRANSPORTS", transports=["NVLS", "P2P"], msg="m1"),
          _f("a", "NCCL_TRANSPORTS", node=None, msg="m2"),
          _f("b", "NCCL_TRANSPORTS", transports=["NET"], msg="m3"),
          _f("a", "TORCH_VS_NCCL_TESTS", "WARN", msg="m4"),
          _f("c", "TORCH_VS_NCCL_TESTS", "PASS", msg="m5"), _f("a", "OTHER", msg="m6")]
    t = C.transports_table(fs, ["b", "a"])
    assert (t.title, t.columns) == ("transports NCCL used",
                                    ("provider", "where", "transports", "message"))
    assert t.rows == [("b", "n1", "NET", "m3"), ("a", "n1", "NVLS, P2P", "m1"),
                      ("a", "provider a (all nodes)", "-", "m2")]
    t = C.agreement_table(fs, ["a", "b"])
    assert (t.title, t.columns) == ("torch.distributed vs nccl-tests",
                                    ("provider", "where", "severity", "message"))
    assert t.rows == [("a", "n1", "WARN", "m4")]


def _t(provider: str, metric: str, value: float, scope: str = "train") -> dict[str, Any]:
    return {"run_id": "r", "provider": provider, "nodes": "n1", "step": "train",
            "scope": scope, "engine": "train", "metric": metric, "size": None,
            "inplace": None, "round": None, "value": value}


def test_train_table_rows() -> None:
    ms = pd.DataFrame([_t("a", "step_time_s", 0.5), _t("a", "step_time_s", 0.7),
                       _t("a", "step_time_s", 0.65), _t("b", "step_time_s", 0.123456),
                       _t("a", "peak_mem_allocated_bytes", 2e9),
                       _t("a", "peak_mem_allocated_bytes", 3e9),
                       _t("b", "mfu", 0.4), _t("a", "mfu", 9.0, scope="single")])
    fs = [_f("a", "TRAIN_RESTORE_OK", "PASS", "train"),
          _f("a", "TRAIN_RESTORE_MISMATCH", "FAIL", "train"),
          _f("b", "CKPT_DIR", "PASS", "preflight"), _f("b", "CKPT_SHARED", "PASS", "train"),
          _f("a", "TRAIN_OOM", "FAIL", "train")]
    t = C.train_table(ms, fs, ["a", "b"])
    assert (t.title, t.columns) == ("training", ("what", "a", "b"))
    assert t.rows == [("step time (median) (s)", 0.65, 0.1235),
                      ("MFU (ratio)", None, 0.4),
                      ("peak memory allocated (GB)", 3.0, None),
                      ("restore", "PASS TRAIN_RESTORE_OK; FAIL TRAIN_RESTORE_MISMATCH",
                       "not measured"),
                      ("checkpoint storage", "not measured", "PASS CKPT_DIR; PASS CKPT_SHARED")]
    assert C.train_table(pd.DataFrame([_t("a", "mfu", 1.0, scope="single")]), fs, ["a"]).rows \
        == []
    assert C.train_table(pd.DataFrame(), fs, ["a"]).rows == []


def _h(provider: str, metric: str, value: float, scope: str = "health") -> dict[str, Any]:
    return {**_t(provider, metric, value, scope), "step": "health", "engine": "health"}


def test_health_table_rows() -> None:
    ms = pd.DataFrame([_h("a", "health.membw.copy_gbps", 4000.04),
                       _h("a", "health.membw.copy_gbps", 4100.0),
                       _h("a", "health.membw.copy_gbps", 3000.0),
                       _h("b", "health.peer.min_gbps", 55.55),
                       _h("a", "health.peer.min_gbps", 1.0, scope="train")])
    fs = [_f("a", "HEALTH_VARIANT", "INFO", "health", variant="H200 SXM"),
          _f("a", "HEALTH_VARIANT", "INFO", "health", node="n2", variant="H100 SXM"),
          _f("a", "HEALTH_VARIANT", "INFO", "health", node="n3", variant="H200 SXM"),
          _f("a", "HEALTH_VARIANT", "INFO", "health", node="n4"),
          _f("b", "HEALTH_VARIANT", "INFO", "train", variant="X"),
          _f("a", "HEALTH_MEMBW", "FAIL", "health"), _f("a", "HEALTH_ECC", "FAIL", "health"),
          _f("a", "HEALTH_ECC", "FAIL", "health", node="n2"),
          _f("b", "HEALTH_PEER", "WARN", "health"), _f("b", "GPU_COUNT", "FAIL", "preflight")]
    t = C.health_table(ms, fs, ["a", "b"])
    assert (t.title, t.columns) == ("GPU health", ("what", "a", "b"))
    assert t.rows == [("memory copy (read + written) (GB/s, median of the GPUs)", 4000.0, None),
                      ("slowest peer pair, one way (GB/s, median of the GPUs)", None, 55.5),
                      ("measures like", "H100 SXM, H200 SXM", "not measured"),
                      ("FAIL and WARN findings", "FAIL HEALTH_ECC, HEALTH_MEMBW",
                       "WARN HEALTH_PEER")]
    assert C.health_table(pd.DataFrame([_h("a", "x", 1.0, scope="train")]), fs, ["a"]).rows \
        == []
    assert C.health_table(pd.DataFrame(), fs, ["a"]).rows == []


def test_flatten_and_shown() -> None:
    assert C._flatten({"a": {"b": 1, "c": {"d": [1, 2]}}, "e": None}) == {
        "a.b": 1, "a.c.d": [1, 2], "e": None}
    assert C._flatten(5) == {"": 5}
    assert C._shown(None) == "(not set)"
    assert C._shown("text") == "text"
    assert C._shown({"b": 1, "a": [1, "x"]}) == '{"a": [1, "x"], "b": 1}'
    assert C._shown("x" * 40) == "x" * 40
    assert C._shown("x" * 41) == "x" * 37 + "..."
    assert C._shown("abcdef", width=5) == "ab..."


def _sel(rows: list[tuple[str, str, str]]) -> C.Selection:
    runs = pd.DataFrame([{"run_id": r, "provider": p, "suite_hash": h, "path": f"/x/{r}"}
                         for r, p, h in rows])
    chosen = {p: {"nccl": r} for r, p, _ in rows}
    return C.Selection(list(chosen), runs, chosen, runs)


def test_the_suite_gate_passes_one_suite_and_shows_what_differs() -> None:
    C.suite_gate(_sel([("r1", "a", "h1"), ("r2", "b", "h1")]), {})
    docs = {"r1": {"suite": {"nccl": {"iters": 20, "sizes": [1, 2]}, "name": "x",
                             "train": {"steps": 5}}},
            "r2": {"suite": {"nccl": {"iters": 50, "sizes": [1, 2]}, "name": "x"}}}
    with pytest.raises(C.SuiteMismatch) as e:
        C.suite_gate(_sel([("r1", "a", "0123456789abcdef"), ("r2", "b", "fedcba9876543210")]),
                     docs)
    assert e.value.what == (
        "the runs were measured with different suites, so they are not compared; the "
        "parameters that differ:\n"
        "  parameter   | a (suite 0123456789ab) | b (suite fedcba987654)\n"
        "  nccl.iters  | 20                     | 50\n"
        "  train.steps | 5                      | (not set)")
    assert e.value.hint == ("run every provider with the same --suite, or pick runs of one "
                            "suite with --runs")


def test_the_suite_gate_cuts_long_lists_and_says_when_nothing_reads_differently() -> None:
    docs = {"r1": {"suite": {f"k{i:02}": 1 for i in range(14)}},
            "r2": {"suite": {f"k{i:02}": 2 for i in range(14)}}}
    with pytest.raises(C.SuiteMismatch) as e:
        C.suite_gate(_sel([("r1", "a", "h1"), ("r2", "b", "h2")]), docs, max_rows=12)
    lines = e.value.what.split("\n")
    assert lines[1] == "  parameter      | a (suite h1) | b (suite h2)"
    assert lines[2] == "  k00            | 1            | 2"
    assert lines[13] == "  k11            | 1            | 2"
    assert lines[14] == "  ... and 2 more |              |"
    assert len(lines) == 15
    with pytest.raises(C.SuiteMismatch) as e:
        C.suite_gate(_sel([("r1", "a", "h1"), ("r2", "b", "h2")]), docs, max_rows=14)
    assert len(e.value.what.split("\n")) == 16
    with pytest.raises(C.SuiteMismatch) as e:
        C.suite_gate(_sel([("r1", "a", "h1"), ("r2", "b", "h2"), ("r3", "c", "h1")]),
                     {"r1": {"suite": {"x": 1}}, "r2": {"suite": {"x": 1}}})
    none = "(the suites hash differently but no parameter reads differently)"
    assert e.value.what.split("\n")[1:] == [
        f"  {'parameter'.ljust(len(none))} | a, c (suite h1) | b (suite h2)",
        f"  {none} |                 |"]


# --- select, on a hand-built runs frame (no results store) -----------------------------------

# oldest first; the ids do not sort in time order
_RUNS = [("x3", ["a"], "passed"), ("x1", ["a", "b"], "failed"), ("x4", ["b"], "running"),
         ("x2", ["a"], "passed"), ("x0", ["c"], "interrupted"), ("x5", [], "passed")]
# (run_id, provider, step) of every record, in no particular order
_STEPS = [("x2", "a", "preflight"), ("x3", "a", "nccl"), ("x1", "a", "nccl"),
          ("x3", "a", "preflight"), ("x2", "a", "health"), ("x1", "b", "train"),
          ("x1", "b", "nccl"), ("x4", "b", "nccl"), ("x4", "b", "train"),
          ("x0", "c", "nccl"), ("x5", "a", "nccl")]


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> tuple[Any, list[list[str]]]:
    runs = pd.DataFrame([{"run_id": r, "providers": ps, "status": st, "suite_hash": "s",
                          "path": f"/there/{r}"} for r, ps, st in _RUNS])
    asked: list[list[str]] = []

    def steps_of(root: Any, ids: list[str]) -> pd.DataFrame:
        assert root == tmp_path and ids, "steps_of is asked about some runs"
        asked.append(list(ids))
        return pd.DataFrame([s for s in _STEPS if s[0] in ids],
                            columns=["run_id", "provider", "step"])

    def all_runs(root: Any) -> pd.DataFrame:
        assert root == tmp_path
        return runs.copy()

    monkeypatch.setattr(C.frames, "runs", all_runs)
    monkeypatch.setattr(C.frames, "steps_of", steps_of)
    return tmp_path, asked


def test_select_takes_each_providers_latest_complete_run_per_step(store) -> None:
    root, asked = store
    sel = C.select(root, ["b", "a"])
    assert asked == [["x3", "x1", "x2"]]  # the complete runs of a or b, oldest first
    assert sel.providers == ["b", "a"]
    assert sel.chosen == {"b": {"nccl": "x1", "train": "x1"},
                          "a": {"preflight": "x2", "health": "x2", "nccl": "x1"}}
    assert [list(c) for c in sel.chosen.values()] == [["nccl", "train"],
                                                      ["preflight", "health", "nccl"]]
    assert sel.run_ids("a") == ["x2", "x1"] and sel.run_ids("b") == ["x1"]
    assert sel.run_ids() == ["x1", "x2"] and sel.run_ids("c") == []
    assert list(sel.runs["run_id"]) == ["x1", "x2"] and list(sel.runs.index) == [0, 1]
    assert sel.paths == {"x1": Path("/there/x1"), "x2": Path("/there/x2")}
    # every run of these providers, the running one too (cost counts attempts)
    assert list(sel.all_runs["run_id"]) == ["x3", "x1", "x4", "x2"]
    assert list(sel.all_runs.index) == [0, 1, 2, 3]
    cols = ["run_id", "providers", "status", "suite_hash", "path"]
    assert list(sel.runs.columns) == cols and list(sel.all_runs.columns) == cols
    # no providers named: those of the complete runs (c has none), sorted
    assert C.select(root).providers == ["a", "b"]


def test_select_of_named_runs_takes_them_whatever_their_status(store) -> None:
    root, asked = store
    sel = C.select(root, [], ["x4", "x3"])
    assert asked == [["x3", "x4"]]
    assert sel.providers == ["a", "b"]
    assert sel.chosen == {"a": {"preflight": "x3", "nccl": "x3"},
                          "b": {"nccl": "x4", "train": "x4"}}
    assert list(sel.runs["run_id"]) == ["x3", "x4"]
    sel = C.select(root, ["b"], ["x1", "x4"])
    assert sel.chosen == {"b": {"nccl": "x4", "train": "x4"}}  # the later of the two


def test_select_refusals_in_words(store) -> None:
    root, asked = store
    with pytest.raises(UsageError) as e:
        C.select(root, [], ["x1", "zz", "yy", "x2"])
    assert (e.value.what, e.value.hint) == (f"no run zz, yy under {root}",
                                            f"see `gpuvet runs --results {root}`")
    with pytest.raises(UsageError) as e:
        C.select(root, ["q", "b", "q", "a", "b"])  # named twice comes before unknown
    assert (e.value.what, e.value.hint) == (
        "provider b, q is named twice: a provider is not compared with itself",
        "name two different providers with -p")
    with pytest.raises(UsageError) as e:
        C.select(root, ["a", "r", "q"])
    assert e.value.what == (f"no runs of provider r, q under {root} "
                            "(providers with runs: a, b, c)")
    with pytest.raises(UsageError) as e:
        C.select(root, ["a", "c"])  # c has runs, none complete
    assert (e.value.what, e.value.hint) == (
        f"provider c has no complete (passed or failed) run with records under {root}",
        "finish a run (`--resume`) or name runs with --runs")
    with pytest.raises(UsageError) as e:
        C.select(root, ["a"], ["x4"])  # a run of b only
    assert e.value.what == (f"provider a has no run among the runs named with records "
                            f"under {root}")
    assert asked == [["x3", "x1", "x2"]]  # only the pool with runs was asked about


def test_select_of_a_store_without_runs_or_providers(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Any) -> None:
    empty = pd.DataFrame(columns=["run_id", "providers", "status", "suite_hash", "path"])
    monkeypatch.setattr(C.frames, "runs", lambda root: empty)
    with pytest.raises(UsageError) as e:
        C.select(tmp_path)
    assert (e.value.what, e.value.hint) == (
        f"the results store {tmp_path} holds no runs",
        "run `gpuvet preflight` / `gpuvet nccl` first")
    bare = pd.DataFrame([{"run_id": "x1", "providers": [], "status": "passed",
                          "suite_hash": "s", "path": "/p"}])
    monkeypatch.setattr(C.frames, "runs", lambda root: bare)
    with pytest.raises(UsageError) as e:
        C.select(tmp_path, ["q"])
    assert e.value.what == f"no runs of provider q under {tmp_path} (providers with runs: none)"


# --- build, with the store's readers and the other modules' parts replaced ------------------

class GoodStub:
    def as_json(self) -> dict[str, Any]:
        return {"good": 1}


@pytest.fixture
def parts(store, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    root, _ = store
    calls: dict[str, list[Any]] = {}

    def rec(name: str, out: Any) -> Any:
        def f(*args: Any) -> Any:
            calls.setdefault(name, []).append(args)
            return out(*args) if callable(out) else out
        return f

    docs = {"x1": {"suite": {"nccl": {"iters": 20}}}, "x2": {"suite": {"nccl": {"iters": 20}}}}
    found = [_f("a", "NCCL_TRANSPORTS", run="x1", transports=["NVLS"]),
             _f("a", "HEALTH_MEMBW", "FAIL", step="health", run="x2"),
             _f("b", "TRAIN_RESTORE_OK", "PASS", step="train", run="x1"),
             _f("b", "NCCL_TRANSPORTS", run="x2", transports=["IB"]),  # b's x2 is not chosen
             _f("b", "NCCL_TRANSPORTS", run="x1", transports=["P2P"])]
    ms = pd.DataFrame([_m("a", 100.0, run="x1"), _m("b", 1.0, run="x2"),
                       _m("b", 80.0, run="x1"),
                       {**_h("a", "health.membw.copy_gbps", 3000.0), "run_id": "x2"},
                       {**_t("b", "mfu", 0.5), "run_id": "x1"}],
                      index=[10, 11, 12, 13, 14])  # a frame as filtered, not from 0
    env = pd.DataFrame({"provider": ["a"], "key": ["k"], "value": ["v"]})

    def pv(p: str, *_: Any) -> SimpleNamespace:
        return SimpleNamespace(provider=p, verdict="GO", decisive=["fine"], reasons=[
            SimpleNamespace(check="c", outcome="ok", text="fine", evidence=["e"])])

    monkeypatch.setattr(C.frames, "run_documents", rec("docs", docs))
    monkeypatch.setattr(C.frames, "finding_records", rec("findings", found))
    monkeypatch.setattr(C.frames, "measurements", rec("ms", lambda *a: ms.copy()))
    monkeypatch.setattr(C.environment, "environment", rec("env", "every fact"))
    monkeypatch.setattr(C.environment, "latest", rec("latest", env))
    monkeypatch.setattr(C.environment, "diff_table", rec("diff", C.Table("environment", ())))
    monkeypatch.setattr(C.billing, "costs_of", rec("costs", (["poc"], ["unit"])))
    monkeypatch.setattr(C.verdict, "provider_verdict", rec("verdict", pv))
    monkeypatch.setattr(C.answer, "headlines", rec("headlines", ["the headlines"]))
    monkeypatch.setattr(C.cost, "currencies_apart", rec("apart", ["JPY"]))
    monkeypatch.setattr(C.cost, "cost_table", rec("cost", C.Table("cost", ())))
    monkeypatch.setattr(C.cost, "sources_table", rec("sources", C.Table("sources", ())))
    monkeypatch.setattr(C.cost, "unit_table", rec("units", C.Table("units", ())))
    monkeypatch.setattr(C.goodhours, "all_good_hours", rec("good", [GoodStub()]))
    monkeypatch.setattr(C.goodhours, "table", rec("goodtable", C.Table("good", ())))
    return {"root": root, "calls": calls, "docs": docs, "found": found, "env": env}


TABLES = ["verdict per provider", "verdict reasons", "checks that passed", "environment",
          "busbw (all_reduce, out-of-place)", "stability (busbw from 16 MiB)",
          "transports NCCL used", "torch.distributed vs nccl-tests", "GPU health", "training"]


def test_build_reads_each_providers_own_chosen_runs(parts, tmp_path: Any) -> None:
    root, calls, found = parts["root"], parts["calls"], parts["found"]
    inv = tmp_path / "inv.yaml"
    inv.write_text("providers: {}\n", encoding="utf-8")
    override = object()
    c = C.build(root, ["b", "a"], inventory=inv, rates={"EUR": 1.1},
                override=override)  # type: ignore[arg-type]
    assert c.root == root and c.providers == ["b", "a"]
    sel = c.selection
    assert sel.chosen == {"b": {"nccl": "x1", "train": "x1"},
                          "a": {"preflight": "x2", "health": "x2", "nccl": "x1"}}
    assert calls["docs"] == [(root, ["x1", "x2"])] and calls["findings"] == [(root, ["x1", "x2"])]
    assert calls["ms"] == [(root, ["x1", "x2"])]
    assert c.findings == [found[0], found[1], found[2], found[4]]
    assert [(p, r) for p, r in zip(c.measurements["provider"], c.measurements["run_id"],
                                   strict=True)] == [("a", "x1"), ("b", "x1"), ("a", "x2"),
                                                     ("b", "x1")]
    assert list(c.measurements.index) == [10, 12, 13, 14]
    assert calls["env"][0][0] is sel.runs and calls["latest"] == [("every fact", sel.runs)]
    assert c.env is parts["env"] and calls["diff"] == [(parts["env"], ["b", "a"], c.orders)]
    assert c.orders == {"b": {}, "a": {}}  # the stores' runs have no inventory copies
    ((s, ms, env, docs, text, name, ov),) = calls["costs"]
    assert (s, env, docs, text, name, ov) == (sel, parts["env"], parts["docs"],
                                              "providers: {}\n", str(inv), override)
    assert ms.equals(c.measurements)
    assert [a[0] for a in calls["verdict"]] == ["b", "a"]
    for _, fs, m, e, paths, order, health in calls["verdict"]:
        assert fs == c.findings and m.equals(c.measurements) and e is parts["env"]
        assert paths == sel.paths and order == {} and health is True
    assert calls["headlines"] == [(c.verdicts, ["poc"])] and c.headlines == ["the headlines"]
    assert (c.costs, c.units, c.currencies_apart) == (["poc"], ["unit"], ["JPY"])
    assert calls["apart"] == [(["poc"], {"EUR": 1.1})] and calls["cost"] == [(["poc"],
                                                                              {"EUR": 1.1})]
    assert calls["sources"] == [(["poc"],)] and calls["units"] == [(["unit"],)]
    assert calls["good"] == [(sel, c.findings, parts["env"], ["poc"], ["unit"])]
    assert calls["goodtable"] == [(c.good_hours,)] and len(c.good_hours) == 1
    assert [t.title for t in c.tables] == [*TABLES, "cost", "sources", "units", "good"]
    busbw = c.tables[4]
    assert busbw.rows[0][:6] == ("single", "64 MiB", 80.0, "80.00-80.00", 100.0, "100.00-100.00")
    assert c.tables[6].rows == [("b", "n1", "P2P", "said"), ("a", "n1", "NVLS", "said")]
    health = {r[0]: r[1:] for r in c.tables[8].rows}
    assert health["FAIL and WARN findings"] == ("none", "FAIL HEALTH_MEMBW")
    train = {r[0]: r[1:] for r in c.tables[9].rows}
    assert train["MFU (ratio)"] == (0.5, None)
    assert train["restore"] == ("PASS TRAIN_RESTORE_OK", "not measured")
    assert c.tables[0].rows == [("b", "GO", "fine", 0, 0, 0, 1), ("a", "GO", "fine", 0, 0, 0, 1)]
    assert c.empty_sections == ["environment", "torch.distributed vs nccl-tests", "cost",
                                "sources", "units", "good"]
    c.headlines = []
    assert c.as_json() == {
        "providers": ["b", "a"], "runs": sel.chosen, "headlines": [], "orders": c.orders,
        "verdicts": [{"provider": p, "verdict": "GO", "decisive": ["fine"],
                      "reasons": [{"check": "c", "outcome": "ok", "text": "fine",
                                   "evidence": ["e"]}]} for p in "ba"],
        "currencies_apart": ["JPY"], "good_gpu_hours": [{"good": 1}],
        "empty_sections": c.empty_sections,
        "tables": [t.as_json() for t in c.tables]}


def test_build_without_cost_and_with_an_unreadable_inventory(parts, tmp_path: Any) -> None:
    root, calls = parts["root"], parts["calls"]
    c = C.build(root, [], ["x1"], with_cost=False)
    assert "costs" not in calls and "cost" not in calls and "good" not in calls
    assert c.good_hours == []
    assert (c.costs, c.units) == ([], [])
    assert calls["apart"] == [([], {})]
    assert [t.title for t in c.tables] == TABLES
    assert c.providers == ["a", "b"] and c.selection.chosen == {"a": {"nccl": "x1"},
                                                                "b": {"nccl": "x1", "train": "x1"}}
    C.build(root, ["a"])
    ((*_, text, name, ov),) = calls["costs"]
    assert (text, name, ov) == (None, "None", None)
    assert calls["cost"] == [(["poc"], {})]
    with pytest.raises(UsageError) as e:
        C.build(root, ["a"], inventory=tmp_path / "nope.yaml")
    assert e.value.what == f"cannot read {tmp_path / 'nope.yaml'}: No such file or directory"
    assert e.value.__cause__ is None and e.value.__suppress_context__


def test_build_of_runs_without_measurements(parts, monkeypatch: pytest.MonkeyPatch) -> None:
    cols = ["run_id", "provider", "nodes", "step", "scope", "engine", "metric", "size",
            "inplace", "round", "value"]
    monkeypatch.setattr(C.frames, "measurements",
                        lambda root, ids: pd.DataFrame(columns=cols))
    c = C.build(parts["root"], ["a"], with_cost=False)
    assert c.measurements.empty and list(c.measurements.columns) == cols


# --- the pins' survivors: values below 1, digits kept, empty tables -------------------------

def test_ratio_ci_of_values_below_one_and_its_bootstrap() -> None:
    a, b = np.array([0.5, 0.4, 0.6]), np.array([0.25, 0.2, 0.3, 0.35])
    point, lo, hi = C.ratio_ci(a, b)
    assert point == 0.55  # 0.275 / 0.5: a median under 1 is still a median
    rng = np.random.default_rng(3)
    a, b = 0.5 * rng.normal(1, 0.1, 12), 0.4 * rng.normal(1, 0.1, 9)
    point, lo, hi = C.ratio_ci(a, b)
    draw = np.random.default_rng(C.SEED)
    ra = np.median(a[draw.integers(0, 12, (C.BOOTSTRAP, 12))], axis=1)
    rb = np.median(b[draw.integers(0, 9, (C.BOOTSTRAP, 9))], axis=1)
    assert (lo, hi) == tuple(float(x) for x in np.percentile(rb / ra, [2.5, 97.5]))
    point, lo, hi = C.ratio_ci(np.array([0.5, 0.5]), np.array([0.25, 0.25]))
    assert (point, lo, hi) == (0.5, 0.5, 0.5)


def test_busbw_values_are_floats_and_medians_keep_two_digits() -> None:
    ms = pd.DataFrame([_m("a", 3), _m("a", 4, rnd=2)])
    assert ms["value"].dtype.kind == "i"
    assert C.busbw_values(ms, "a", "single")[64 * MIB].dtype == np.float64
    ms = pd.DataFrame([_m("a", 100.123456), _m("a", 100.123456, rnd=2)])
    assert C.busbw_table(ms, ["a"]).rows == [("single", "64 MiB", 100.12, "100.12-100.12")]


def test_stability_of_a_provider_measured_on_several_nodes_only() -> None:
    big = 16 * MIB
    ms = pd.DataFrame([_m("a", v, size=big, scope="multi", nodes="n1,n2", rnd=i)
                       for i, v in enumerate((100.0, 101.0, 103.0))]
                      + [_m("a", v, size=2 * big, scope="multi", nodes="n1,n2", rnd=i)
                         for i, v in enumerate((100.0, 100.0, 107.0))])
    t = C.stability_table(ms, [], ["a"])
    cvs = [float(np.std(v, ddof=1) / np.mean(v)) for v in ((100.0, 101.0, 103.0),
                                                           (100.0, 100.0, 107.0))]
    assert t.rows == [("a", "multi", 3, 1, round(float(np.median(cvs)), 4),
                       round(max(cvs), 4), 0, 0, 0)]
    assert t.rows[0][4:6] == (0.0273, 0.0395)


def test_empty_training_and_health_tables_keep_their_title_and_columns() -> None:
    for ms in (pd.DataFrame(), pd.DataFrame([_h("a", "x", 1.0, scope="single")])):
        assert C.train_table(ms, [], ["a", "b"]) == C.Table("training", ("what", "a", "b"), [])
        assert C.health_table(ms, [], ["a", "b"]) == C.Table("GPU health", ("what", "a", "b"),
                                                             [])


def test_flatten_and_shown_of_odd_keys_and_values() -> None:
    assert C._flatten({"nccl": {"maX": 1}, "X": 2}) == {"nccl.maX": 1, "X": 2}
    assert C._shown({"path": Path("/a")}) == '{"path": "/a"}'  # anything else as its text


def test_the_suite_gate_shows_twelve_parameters_unless_told() -> None:
    docs = {"r1": {"suite": {f"k{i:02}": 1 for i in range(13)}},
            "r2": {"suite": {f"k{i:02}": 2 for i in range(13)}}}
    with pytest.raises(C.SuiteMismatch) as e:
        C.suite_gate(_sel([("r1", "a", "h1"), ("r2", "b", "h2")]), docs)
    lines = e.value.what.split("\n")
    assert len(lines) == 15 and lines[-1].startswith("  ... and 1 more |")


def test_build_refuses_runs_of_different_suites(parts, monkeypatch: pytest.MonkeyPatch) -> None:
    runs = pd.DataFrame([{"run_id": r, "providers": ps, "status": st,
                          "suite_hash": "t" if r == "x2" else "s", "path": f"/there/{r}"}
                         for r, ps, st in _RUNS])
    monkeypatch.setattr(C.frames, "runs", lambda root: runs)
    with pytest.raises(C.SuiteMismatch) as e:
        C.build(parts["root"], ["b", "a"])
    assert "(the suites hash differently but no parameter reads differently)" in e.value.what
    assert "findings" not in parts["calls"]  # refused before anything is read
