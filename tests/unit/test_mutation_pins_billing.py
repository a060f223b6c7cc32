"""billing.py pinned on exact values: the windows a provider is billed over
(gpuvet's steps with their failed attempts, the boot time, billed-since, a PoC
folder's window, the command line's), which other runs count as attempts, the
command line's checks and the training values (the survivors of `make
mutation` on orchestrator/analysis/billing.py). Selections are built by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from orchestrator.analysis import billing as B
from orchestrator.analysis.compare import Selection
from orchestrator.analysis.cost import Pricing, Window
from orchestrator.errors import UsageError


def _run(rid: str, started: str, finished: str | None, status: str = "passed",
         providers: tuple[str, ...] = ("p",), command: str = "nccl", path: str = "/none"
         ) -> dict[str, Any]:
    return {"run_id": rid, "started": started, "finished": finished, "status": status,
            "providers": list(providers), "command": command, "path": path,
            "suite_hash": "h"}


def _sel(chosen: list[str], runs: list[dict[str, Any]], provider: str = "p") -> Selection:
    df = pd.DataFrame(runs)
    return Selection([provider], df[df["run_id"].isin(chosen)].reset_index(drop=True),
                     {provider: {f"step{i}": r for i, r in enumerate(chosen)}}, df)


def _t(h: float, m: int = 0) -> str:
    return f"2026-01-02T{int(h):02}:{m:02}:00Z"


RUNS = [_run("r0", _t(6), _t(6, 30), "passed"),        # complete: ends the line back
        _run("r1", _t(7), _t(7, 30), "interrupted"),   # unfinished just before: counted
        _run("r2", _t(8), _t(8, 15), "error"),         # the same
        _run("r3", _t(9), _t(10), "passed"),           # selected
        _run("r4", _t(10), _t(10, 30), "failed"),      # a rerun inside the span
        _run("r5", _t(10, 30), _t(11), "passed"),      # selected
        _run("r6", _t(11, 30), _t(12), "passed"),      # after the end: not counted
        _run("q1", _t(9, 30), _t(10), "failed", ("q",))]


def test_steps_window_is_the_runs_with_the_attempts_back_to_the_last_complete_run() -> None:
    sel = _sel(["r3", "r5"], RUNS)
    ws = B.windows(sel, "p", {}, None, B.Override())
    assert ws == [Window("gpuvet's steps", 1.5 + 1.25, "the runs' started/finished (run.json)",
                         1.25, 3)]


def test_attempts_without_a_start_and_with_one() -> None:
    sel = _sel(["r3", "r5"], RUNS)
    end = B.cost.parse_time(_t(11))
    assert list(B._attempts(sel, "p", ["r3", "r5"], None, end)["run_id"]) == ["r1", "r2", "r4"]
    start = B.cost.parse_time(_t(7))
    assert list(B._attempts(sel, "p", ["r3", "r5"], start, end)["run_id"]) == ["r1", "r2", "r4"]
    start = B.cost.parse_time(_t(8))  # a run starting exactly at the start counts
    assert list(B._attempts(sel, "p", ["r3", "r5"], start, end)["run_id"]) == ["r2", "r4"]
    end = B.cost.parse_time(_t(11, 30))  # ... and one starting exactly at the end
    assert list(B._attempts(sel, "p", ["r3", "r5"], start, end)["run_id"]) == ["r2", "r4", "r6"]
    # a run starting exactly with the first selected one is inside the span (a rerun,
    # not a complete run that would end the line of attempts before it)
    runs = [*RUNS, _run("r7", _t(9), _t(9, 6), "failed")]
    sel = _sel(["r3", "r5"], runs)
    assert list(B._attempts(sel, "p", ["r3", "r5"], None, B.cost.parse_time(_t(11)))
                ["run_id"]) == ["r1", "r2", "r7", "r4"]


def test_a_complete_run_between_attempts_restarts_the_line() -> None:
    runs = [_run("a", _t(5), _t(5, 30), "error"), _run("b", _t(6), _t(6, 30), "passed"),
            _run("c", _t(7), _t(7, 30), "error"), _run("d", _t(8), _t(9), "passed")]
    sel = _sel(["d"], runs)
    assert list(B._attempts(sel, "p", ["d"], None, B.cost.parse_time(_t(9)))["run_id"]) == ["c"]
    runs[2] = _run("c", _t(7), _t(7, 30), "failed")
    sel = _sel(["d"], runs)
    assert list(B._attempts(sel, "p", ["d"], None, B.cost.parse_time(_t(9)))["run_id"]) == []


def test_the_boot_window_from_the_earliest_boot_of_the_providers_nodes(tmp_path: Path) -> None:
    run = tmp_path / "r3"
    for node, bt in (("n1", _t(8, 30)), ("n2", _t(8)), ("n3", None), ("n4", 5)):
        d = run / "nodes" / node / "preflight"
        d.mkdir(parents=True)
        (d / "facts.json").write_text(json.dumps({"boot_time": bt}))
    (run / "nodes" / "n5" / "preflight").mkdir(parents=True)
    (run / "nodes" / "n5" / "preflight" / "facts.json").write_text("{not json")
    (run / "nodes" / "n6" / "preflight").mkdir(parents=True)
    (run / "nodes" / "n6" / "preflight" / "facts.json").write_text("[1]")
    runs = [dict(r, path=str(run)) if r["run_id"] == "r3" else r for r in RUNS]
    sel = _sel(["r3", "r5"], runs)
    assert B.boot_times(sel, "p") == [_t(8, 30), _t(8)]
    ws = B.windows(sel, "p", {}, None, B.Override())
    assert ws[1] == Window("instance up since boot", 3.0,
                           "the nodes' boot time (/proc/stat btime, preflight): "
                           "2026-01-02T08:00:00Z to the last run's end 2026-01-02T11:00:00Z",
                           0.25 + 0.5, 2)


def test_billed_since_from_the_command_line_or_the_pricing() -> None:
    sel = _sel(["r3", "r5"], RUNS)
    pr = Pricing(gpu_hour=2.0, currency="USD", billed_since=_t(7))
    ws = B.windows(sel, "p", {}, pr, B.Override())
    assert ws[1] == Window("billed since", 4.0, "pricing.billed_since: 2026-01-02T07:00:00Z "
                           "to the last run's end 2026-01-02T11:00:00Z", 0.5 + 0.25 + 0.5, 3)
    ws = B.windows(sel, "p", {}, pr, B.Override(billed_since=_t(10)))
    assert ws[1] == Window("billed since", 1.0, "--billed-since: 2026-01-02T10:00:00Z to the "
                           "last run's end 2026-01-02T11:00:00Z", 0.5, 1)
    # the failed hours never exceed the window; a start after the end is 0 hours
    ws = B.windows(sel, "p", {}, pr, B.Override(billed_since=_t(12)))
    assert ws[1].hours == 0.0 and ws[1].failed_hours == 0.0 and ws[1].attempts == 0
    ws = B.windows(sel, "p", {}, pr, B.Override(billed_since=_t(10, 15)))
    assert ws[1].hours == 0.75 and ws[1].failed_hours == 0.0


def test_the_failed_hours_are_capped_at_the_window() -> None:
    runs = [_run("a", _t(9), _t(12), "error"), _run("d", _t(10), _t(11), "passed")]
    sel = _sel(["d"], runs)
    ws = B.windows(sel, "p", {}, None, B.Override(billed_since=_t(9)))
    assert ws[1].hours == 2.0 and ws[1].failed_hours == 2.0 and ws[1].attempts == 1


def test_the_command_line_window_replaces_every_other() -> None:
    sel = _sel(["r3", "r5"], RUNS)
    assert B.windows(sel, "p", {}, None, B.Override(hours=7.5)) == [
        Window("--hours", 7.5, "given on the command line")]
    w = (_t(8), _t(11, 30))
    assert B.windows(sel, "p", {}, None, B.Override(hours=1.0, window=w)) == [
        Window("--hours", 1.0, "given on the command line")]
    assert B.windows(sel, "p", {}, None, B.Override(window=w)) == [
        Window("--window", 3.5, "given on the command line (2026-01-02T08:00:00Z/"
               "2026-01-02T11:30:00Z)")]


def test_a_run_without_an_end_ends_at_its_latest_start() -> None:
    runs = [_run("a", _t(9), None, "running"), _run("b", _t(10), None, "running")]
    sel = _sel(["a", "b"], runs)
    ws = B.windows(sel, "p", {}, None, B.Override(billed_since=_t(8)))
    assert ws[0] == Window("gpuvet's steps", 0.0, "the runs' started/finished (run.json)", 0.0,
                           0)
    assert ws[1].hours == 2.0


def _poc(window: Any) -> dict[str, Any]:
    return {"source": {"kind": "poc", "window": window}}


def test_a_poc_folders_window() -> None:
    runs = [_run("a", _t(9), _t(9, 1), command="import poc"),
            _run("b", _t(10), _t(10, 1), command="import poc")]
    sel = _sel(["a", "b"], runs)
    docs = {"a": _poc({"start": _t(1), "end": _t(2), "start_from": "checked-at.txt",
                       "end_from": "the newest file"}),
            "b": _poc({"start": _t(1, 30), "end": _t(3), "start_from": "x", "end_from": "y"})}
    assert B.windows(sel, "p", docs, None, B.Override()) == [
        Window("PoC folder", 2.0, "checked-at.txt to the newest file")]
    docs = {"a": _poc({"why": "no file has a time"}), "b": _poc(None)}
    assert B.windows(sel, "p", docs, None, B.Override()) == [
        Window("PoC folder", None, "no file has a time: pass --hours or --window")]
    docs = {"a": _poc({"start": _t(1)}), "b": {"source": {"kind": "poc"}}}
    assert B.windows(sel, "p", docs, None, B.Override()) == [
        Window("PoC folder", None, "the folder tells no time: pass --hours or --window")]


def test_imported_logs_carry_no_rental_time_but_a_live_run_beside_them_does() -> None:
    runs = [_run("a", _t(9), _t(9, 1), command="import nccl-tests"),
            _run("b", _t(10), _t(11), command="nccl")]
    assert B.windows(_sel(["a"], runs), "p", {}, None, B.Override()) == [
        Window("gpuvet's steps", None, "imported logs carry no rental time (their run only "
               "read them): pass --hours or --window")]
    ws = B.windows(_sel(["a", "b"], runs), "p", {}, None, B.Override())
    assert ws == [Window("gpuvet's steps", 1.0 + 1 / 60, "the runs' started/finished (run.json)",
                         0.0, 0)]
    # a PoC folder beside a live run: both windows
    runs = [_run("a", _t(9), _t(9, 1), command="import poc"), _run("b", _t(10), _t(11))]
    docs = {"a": _poc({"start": _t(1), "end": _t(2), "start_from": "s", "end_from": "e"})}
    ws = B.windows(_sel(["a", "b"], runs), "p", docs, None, B.Override())
    assert [w.name for w in ws] == ["PoC folder", "gpuvet's steps"]


def test_override_and_window_checks() -> None:
    with pytest.raises(UsageError, match=r"^--hours -1 is negative"):
        B.Override(hours=-1)
    assert B.Override(hours=0).hours == 0
    with pytest.raises(UsageError, match="ends before it starts"):
        B.Override(window=(_t(2), _t(1)))
    assert B.Override(window=(_t(1), _t(1))).window == (_t(1), _t(1))
    with pytest.raises(UsageError, match="is not a date and time"):
        B.Override(billed_since="yesterday")
    assert B.parse_window(None) is None
    assert B.parse_window("a/b") == ("a", "b")
    for bad in ("a", "a/b/c", "/b", "a/"):
        with pytest.raises(UsageError, match=r"is not START/END"):
            B.parse_window(bad)


def _tm(provider: str, metric: str, value: float, scope: str = "train") -> dict[str, Any]:
    return {"provider": provider, "scope": scope, "metric": metric, "value": value}


def test_train_value() -> None:
    ms = pd.DataFrame([_tm("p", "m", 1.0), _tm("p", "m", 5.0), _tm("p", "m", 2.0),
                       _tm("q", "m", 9.0), _tm("p", "m", 9.0, "single"),
                       _tm("p", "x_bytes", 3e9), _tm("p", "x_bytes", 1e9)])
    assert B.train_value(ms, "p", "m") == 2.0
    assert B.train_value(ms, "p", "m", "max") == 5.0
    assert B.train_value(ms, "p", "x_bytes") == 2.0
    assert B.train_value(ms, "p", "x_bytes", "max") == 3.0
    assert B.train_value(ms, "p", "other") is None
    assert B.train_value(pd.DataFrame(), "p", "m") is None


def test_the_refusals_say_what_to_do() -> None:
    with pytest.raises(UsageError) as e:
        B.Override(hours=-1.5)
    assert (e.value.what, e.value.hint) == ("--hours -1.5 is negative", "give the hours billed")
    with pytest.raises(UsageError) as e:
        B.Override(window=(_t(2), _t(1)))
    assert (e.value.what, e.value.hint) == (
        f"--window {_t(2)}/{_t(1)} ends before it starts", "--window START/END, START first")
    with pytest.raises(UsageError) as e:
        B.parse_window("a/b/c")
    assert (e.value.what, e.value.hint) == (
        "--window 'a/b/c' is not START/END",
        "e.g. --window 2026-01-02T08:00:00Z/2026-01-02T11:30:00Z")


INVENTORY = """
providers:
  p:
    pricing: {gpu_hour: 2.0, currency: EUR, billing_granularity: hour, node_month: 800,
              storage_gb_month: 1.0, billed_since: "2026-01-02T05:00:00Z"}
  q:
    nodes: []
"""


def test_costs_of_every_window_and_the_unit_cost(tmp_path: Path) -> None:
    runs = [dict(r, path=str(tmp_path / r["run_id"])) for r in RUNS]
    (tmp_path / "r5").mkdir()
    (tmp_path / "r5" / "inventory.yaml").write_text(INVENTORY)
    sel = _sel(["r3", "r5"], runs)
    env = pd.DataFrame([{"provider": pr, "node": n, "key": k, "value": v}
                        for pr, n, k, v in [("p", "n1", "gpu_count", "8"),
                                            ("p", "n2", "gpu_count", "8"),
                                            ("p", "n1", "gpu_model", "NVIDIA H200"),
                                            ("p", "n2", "gpu_model", "NVIDIA H200"),
                                            ("q", "m1", "gpu_count", "4")]])
    ms = pd.DataFrame([_tm("p", "tokens_per_s_per_gpu", 1000.0),
                       _tm("p", "tokens_per_s_per_gpu", 3000.0),
                       _tm("p", "ckpt_size_bytes", 2e9), _tm("p", "ckpt_size_bytes", 4e9)])
    ov = B.Override(billed_since=_t(7))
    pocs, units = B.costs_of(sel, ms, env, {}, None, "-i", ov)
    assert [(c.provider, c.gpus, c.window.name, c.window.hours, c.currency) for c in pocs] == [
        ("p", 16, "gpuvet's steps", 2.75, "EUR"), ("p", 16, "billed since", 4.0, "EUR")]
    assert [c.compute for c in pocs] == [2.0 * 16 * 2, 2.0 * 16 * 3]
    # the largest checkpoint kept over each window
    assert [c.storage.amount for c in pocs] == [pytest.approx(4 * 2.75 / 730),
                                                 pytest.approx(4 * 4.0 / 730)]
    # without --billed-since the pricing's own start is the billed window's
    pocs_p, _ = B.costs_of(sel, ms, env, {}, None)
    assert [(c.window.name, c.window.hours) for c in pocs_p] == [
        ("gpuvet's steps", 2.75), ("billed since", 6.0)]
    assert pocs_p[1].window.source.startswith("pricing.billed_since: 2026-01-02T05:00:00Z")
    (u,) = units
    assert (u.provider, u.currency, u.per_job_hour, u.per_gpu_month, u.gpu_model) == (
        "p", "EUR", 32.0, 100.0, "NVIDIA H200")
    assert u.per_1m_tokens == pytest.approx(2.0 / 3600 * 1e6 / 2000.0)
    # the file given with -i wins over the run's copy; a provider without pricing: no price
    pocs, units = B.costs_of(sel, ms, env, {}, INVENTORY.replace("2.0", "3.0"), "inv.yaml",
                             ov)
    assert pocs[0].compute == 3.0 * 16 * 2
    assert B.pricing(sel, "p", None, "-i")[1] == "the inventory copy of run r5"
    assert B.pricing(sel, "p", "providers: {}", "inv.yaml") == (None, "inv.yaml")
    pr, where = B.pricing(sel, "p", INVENTORY, "inv.yaml")
    assert where == "inv.yaml" and pr is not None and pr.gpu_hour == 2.0
    # two GPU models or per-node counts: no single one for the unit cost
    env2 = pd.concat([env, pd.DataFrame([{"provider": "p", "node": "n3", "key": k, "value": v}
                                         for k, v in (("gpu_count", "4"),
                                                      ("gpu_model", "NVIDIA H100"))])])
    _, (u2,) = B.costs_of(sel, ms, env2, {}, None, "-i", ov)
    assert u2.gpu_model is None and u2.per_gpu_month is None and u2.per_job_hour == 40.0


def test_boot_times_skip_other_providers_nodes_and_unreadable_facts(tmp_path: Path) -> None:
    (tmp_path / "r3").mkdir()  # a selected run without nodes/: the next one is still read
    run = tmp_path / "r5"
    facts = {"n1": _t(8, 30), "n2": _t(7), "n3": _t(8)}
    for node, bt in facts.items():
        d = run / "nodes" / node / "preflight"
        d.mkdir(parents=True)
        (d / "facts.json").write_text(json.dumps({"boot_time": bt}))
    (run / "nodes" / "a" / "preflight" / "facts.json").mkdir(parents=True)  # not a file
    (run / "nodes" / "b" / "preflight").mkdir(parents=True)
    (run / "nodes" / "b" / "preflight" / "facts.json").write_text("{")
    # n2 is q's; n3 is named by no provider of the run's inventory: taken as p's
    (run / "inventory.yaml").write_text("providers:\n  p: {nodes: [{name: n1}]}\n"
                                        "  q: {nodes: [{name: n2}]}\n")
    runs = [dict(r, path=str(tmp_path / r["run_id"])) for r in RUNS]
    sel = _sel(["r3", "r5"], runs)
    assert B.boot_times(sel, "p") == [_t(8, 30), _t(8)]
    ws = B.windows(sel, "p", {}, None, B.Override())
    assert ws[1].name == "instance up since boot" and ws[1].hours == 3.0


def test_each_provider_of_a_selection_has_its_own_runs_boots_and_price(tmp_path: Path) -> None:
    runs = [dict(r, path=str(tmp_path / r["run_id"])) for r in RUNS]
    runs.append(_run("q2", _t(10, 45), _t(11, 30), providers=("q",),
                     path=str(tmp_path / "q2")))
    for rid, node, bt in (("r5", "n1", _t(8)), ("q2", "m1", _t(6))):
        d = tmp_path / rid / "nodes" / node / "preflight"
        d.mkdir(parents=True)
        (d / "facts.json").write_text(json.dumps({"boot_time": bt}))
    (tmp_path / "r5" / "inventory.yaml").write_text(INVENTORY)
    df = pd.DataFrame(runs)
    chosen = {"p": {"nccl": "r3", "train": "r5"}, "q": {"nccl": "q2"}}
    sel = Selection(["p", "q"], df[df["run_id"].isin(["r3", "r5", "q2"])]
                    .reset_index(drop=True), chosen, df)
    # q2 has no inventory copy: its nodes are q's alone, never p's
    assert B.boot_times(sel, "p") == [_t(8)]
    assert B.boot_times(sel, "q") == [_t(6)]
    pr, where = B.pricing(sel, "p", None, "-i")
    assert where == "the inventory copy of run r5" and pr is not None and pr.currency == "EUR"
    assert B.pricing(sel, "q", None, "-i") == (None, "the inventory copy of run q2")
    assert B.windows(sel, "p", {}, None, B.Override()) == [
        Window("gpuvet's steps", 2.75, "the runs' started/finished (run.json)", 1.25, 3),
        Window("instance up since boot", 3.0, "the nodes' boot time (/proc/stat btime, "
               "preflight): 2026-01-02T08:00:00Z to the last run's end 2026-01-02T11:00:00Z",
               0.75, 2)]


def test_the_price_is_read_from_the_newest_selected_run(tmp_path: Path) -> None:
    runs = [dict(r, path=str(tmp_path / r["run_id"])) for r in RUNS]
    (tmp_path / "r5").mkdir()
    (tmp_path / "r5" / "inventory.yaml").write_text(INVENTORY)
    pr, where = B.pricing(_sel(["r3", "r4", "r5"], runs), "p", None, "-i")
    assert where == "the inventory copy of run r5" and pr is not None and pr.gpu_hour == 2.0


def test_a_bad_price_is_refused_naming_where_it_was_given() -> None:
    sel = _sel(["r3", "r5"], RUNS)
    bad = "providers:\n  p: {pricing: {gpu_hour: -1}}\n"
    with pytest.raises(UsageError) as e:
        B.pricing(sel, "p", bad, "inv.yaml")
    assert e.value.what.startswith("inv.yaml: providers.p.pricing.gpu_hour: ")
    with pytest.raises(UsageError) as e:
        B.costs_of(sel, pd.DataFrame(), pd.DataFrame(), {}, bad)
    assert e.value.what.startswith("-i: providers.p.pricing.gpu_hour: ")
    with pytest.raises(UsageError) as e:
        B.costs_of(sel, pd.DataFrame(), pd.DataFrame(), {}, bad, "inv.yaml")
    assert e.value.what.startswith("inv.yaml: providers.p.pricing.gpu_hour: ")


def test_an_attempt_without_a_recorded_end_adds_no_hours() -> None:
    # a value missing from some rows reads as NaN in pandas, not None
    runs = [dict(r, finished=float("nan")) if r["run_id"] == "r4" else r for r in RUNS]
    ws = B.windows(_sel(["r3", "r5"], runs), "p", {}, None, B.Override())
    assert ws == [Window("gpuvet's steps", 1.5 + 0.75, "the runs' started/finished (run.json)",
                         0.75, 3)]
