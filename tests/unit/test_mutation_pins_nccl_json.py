"""The -J JSON of nccl-tests edited one thing at a time: what each edit changes in the run read,
or the exact refusal (kind, message, line, source) it earns.

The base document is the nccl-tests 2.19.6 `-I 1 -J` sample (file version 3, per-iteration
objects); tests/unit/test_mutation_pins_nccl_parsers.py pins every JSON capture whole.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import ParseError
from orchestrator.parsers.nccl_tests import NcclTestsRun, parse_nccl_tests_json

FIX = Path(__file__).resolve().parents[1] / "fixtures"
BASE: dict[str, Any] = json.loads(
    (FIX / "nccl-tests" / "all_reduce_2.19.6_per-iter_h100.json").read_text())
SRC = "edited.json"


def _doc(edit: Callable[[dict[str, Any]], Any] | None = None) -> dict[str, Any]:
    d = copy.deepcopy(BASE)
    if edit is not None:
        edit(d)
    return d


def _read(d: Any) -> NcclTestsRun:
    return parse_nccl_tests_json(json.dumps(d), source=SRC)


def _refusal(text: str) -> tuple[str, str, int | None, str | None, str | None]:
    with pytest.raises(ParseError) as info:
        parse_nccl_tests_json(text, source=SRC)
    exc = info.value
    return exc.kind, str(exc).splitlines()[0], exc.line_no, exc.line, exc.source


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """An edit that sets (or, with value ..., deletes) the key at a `/`-separated path."""
    def edit(d: dict[str, Any]) -> None:
        *parents, last = path.split("/")
        node: Any = d
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        key: Any = int(last) if isinstance(node, list) else last
        if value is ...:
            del node[key]
        else:
            node[key] = value
    return edit


def test_the_base_document_as_read() -> None:
    run = _read(_doc())
    assert (run.format, run.binary, run.op, run.nccl_version, run.time_kind) == (
        "json", "all_reduce_perf", "all_reduce", "2.28.9", "time")
    assert (run.start_time, run.end_time, run.env_count, run.truncated) == (
        "2026-07-14 09:12:40", "2026-07-14 09:12:47", len(BASE["env"]), False)
    assert (run.avg_busbw_reported, run.avg_busbw_check, run.avg_busbw_agrees) == (
        422.185854, None, True)
    assert run.out_of_bounds is not None
    assert (run.out_of_bounds.count, run.out_of_bounds.ok) == (0, True)
    assert run.failures == []
    first = run.rows[0]
    assert (first.line_no, first.size_bytes, first.count, first.type, first.redop, first.root) == (
        None, 16777216, 4194304, "float", "sum", None)
    assert first.out_of_place.per_iter is not None and first.in_place.per_iter is not None
    assert (first.in_place.per_iter.min_us, first.in_place.per_iter.cv_pct) == (86.378551, 2.231731)
    assert (first.in_place.time_us, first.in_place.algbw_gbs, first.in_place.busbw_gbs,
            first.in_place.wrong) == (90.24746, 185.902363, 325.329135, 0)
    assert [(r.rank, r.group, r.pid, r.host, r.device, r.bus_id, r.name) for r in run.ranks] == [
        (0, 0, 5521, "h100-sxm-12", 0, "0000:18:00", "NVIDIA H100 80GB HBM3")]
    assert run.params == {
        "n_thread": 1, "n_gpus": 8, "min_bytes": 16777216, "max_bytes": 1073741824, "step": 4,
        "step_mode": "factor", "warmup_iters": 5, "iters": 10, "agg_iters": 1, "validation": 1,
        "graph": 0, "blocking_collectives": "false", "per_iter_timing": "true",
        "per_iter_skip": 0, "parallel_init": "false"}


def _each_half(d: dict[str, Any], fn: Callable[[dict[str, Any]], None]) -> None:
    for r in d["results"]:
        fn(r["out_of_place"])
        fn(r["in_place"])


def _cputime(half: dict[str, Any]) -> None:
    half["cpu_time"] = half.pop("time")


def test_a_run_with_cpu_times_is_read_as_cputime() -> None:
    run = _read(_doc(lambda d: _each_half(d, _cputime)))
    assert run.time_kind == "cputime"
    assert [r.in_place.time_us for r in run.rows] == [r["in_place"]["cpu_time"] for r in
                                                      _doc(lambda d: _each_half(d, _cputime))["results"]]
    one = _doc(lambda d: _each_half(d, _cputime))
    one["results"] = one["results"][:1]
    run = _read(one)
    assert (run.time_kind, run.rows[0].out_of_place.time_us) == ("cputime", 89.521937)


def test_a_run_without_results_has_no_rows_and_no_average() -> None:
    run = _read(_doc(_set("results", [])))
    assert (run.rows, run.time_kind, run.avg_busbw_recomputed, run.avg_busbw_agrees) == (
        [], "time", None, None)
    assert _read(_doc(_set("results", ...))).rows == []


def test_what_each_optional_part_left_out_leaves_unknown() -> None:
    d = _doc()
    for key in ("nccl_version", "env", "args", "out_of_bounds", "average_bus_bandwidth", "errors",
                "start_time", "end_time", "config"):
        del d[key]
    run = _read(d)
    assert (run.nccl_version, run.env_count, run.binary, run.op, run.out_of_bounds) == (
        None, None, None, None, None)
    assert (run.avg_busbw_reported, run.avg_busbw_check, run.truncated, run.failures) == (
        None, None, True, [])
    assert (run.start_time, run.end_time, run.params, run.ranks) == (None, None, {}, [])
    dev = _read(_doc(lambda d: [d["config"]["devices"][0].pop(k) for k in ("group", "pid")]))
    assert (dev.ranks[0].group, dev.ranks[0].pid) == (None, None)


def test_the_binary_is_the_last_part_of_the_first_argument() -> None:
    assert _read(_doc(_set("args/0", "all_gather_perf"))).binary == "all_gather_perf"
    run = _read(_doc(_set("args", ["/opt/nccl-tests/build/all_gather_perf", "-g", "8"])))
    assert (run.binary, run.op) == ("all_gather_perf", "all_gather")


def test_step_bytes_and_values_params_cannot_hold() -> None:
    def step_bytes(d: dict[str, Any]) -> None:
        d["config"]["step_bytes"] = 1048576
        del d["config"]["step_factor"]
    params = _read(_doc(step_bytes)).params
    assert (params["step"], params["step_mode"]) == (1048576, "bytes")
    params = _read(_doc(_set("config/graph", True))).params
    assert "graph" not in params
    params = _read(_doc(_set("config/extra", [1, 2]))).params
    assert "extra" not in params

    def devices_first(d: dict[str, Any]) -> None:
        d["config"] = {"devices": d["config"].pop("devices"), **d["config"]}
    assert _read(_doc(devices_first)).params == _read(_doc()).params


def test_the_average_s_check_and_its_failure() -> None:
    ok = _read(_doc(_set("average_bus_bandwidth/okay", "true")))
    assert (ok.avg_busbw_check, ok.failures) == ("OK", [])
    bad = _read(_doc(_set("average_bus_bandwidth/okay", "false")))
    assert bad.avg_busbw_check == "FAILED"
    assert [f.model_dump() for f in bad.failures] == [
        {"line_no": None, "kind": "min-bw", "text": "Avg bus bandwidth 422.185854"}]
    off = _read(_doc(_set("average_bus_bandwidth/bandwidth", 422.190854)))  # 0.005 off
    assert off.avg_busbw_agrees is False
    near = _read(_doc(_set("average_bus_bandwidth/bandwidth", 422.185858)))
    assert near.avg_busbw_agrees is True

    def old_spelling(d: dict[str, Any]) -> None:
        d["average_bus_bandwidith"] = {"bandwidith": 1.5, "okay": "unchecked"}
        del d["average_bus_bandwidth"]
    assert _read(_doc(old_spelling)).avg_busbw_reported == 1.5


def test_out_of_bounds_wrong_elements_and_errors_are_failures() -> None:
    oob = _read(_doc(_set("out_of_bounds", {"count": 3, "okay": "false"})))
    assert oob.out_of_bounds is not None
    assert (oob.out_of_bounds.count, oob.out_of_bounds.ok) == (3, False)
    assert [f.model_dump() for f in oob.failures] == [
        {"line_no": None, "kind": "out-of-bounds", "text": "Out of bounds values : 3 FAILED"}]
    wrong = _read(_doc(_set("results/1/in_place/nwrong", 5.0)))
    assert (wrong.rows[1].in_place.wrong, wrong.rows[1].out_of_place.wrong) == (5, 0)
    assert [f.model_dump() for f in wrong.failures] == [
        {"line_no": None, "kind": "wrong", "text": f"{BASE['results'][1]['size']} bytes: wrong elements"}]
    na = _read(_doc(_set("results/0/out_of_place/nwrong", None)))
    assert (na.rows[0].out_of_place.wrong, na.failures) == (None, [])
    errs = _read(_doc(_set("errors", ["", "NCCL failure common.cu:1234 'unhandled system error'"])))
    assert [f.model_dump() for f in errs.failures] == [
        {"line_no": None, "kind": "nccl-error",
         "text": "NCCL failure common.cu:1234 'unhandled system error'"}]


def test_redop_root_and_per_iteration_objects() -> None:
    run = _read(_doc(lambda d: d["results"][0].update(redop="none", root=" 0")))
    assert (run.rows[0].redop, run.rows[0].root) == (None, 0)
    run = _read(_doc(_set("results/0/in_place_per_iter", ...)))
    assert run.rows[0].in_place.per_iter is None and run.rows[0].out_of_place.per_iter is not None
    run = _read(_doc(_set("results/0/out_of_place_per_iter", ...)))
    assert run.rows[0].out_of_place.per_iter is None and run.rows[0].in_place.per_iter is not None


@pytest.mark.parametrize("version", [1, 2, 3])
def test_every_known_file_version_is_read(version: int) -> None:
    assert len(_read(_doc(_set("version", version))).rows) == 4


KIND = "nccl-tests-json"
AT = f"cannot parse {KIND} output at {SRC}: "

REFUSALS: list[tuple[str, Any, str]] = [
    ("a list", [], "unknown nccl-tests JSON version None (known: 1-3)"),
    ("version 9", _doc(_set("version", 9)), "unknown nccl-tests JSON version 9 (known: 1-3)"),
    ("version as text", _doc(_set("version", "3")),
     "unknown nccl-tests JSON version '3' (known: 1-3)"),
    ("no version", _doc(_set("version", ...)), "unknown nccl-tests JSON version None (known: 1-3)"),
    ("a number for a row", _doc(_set("results/0", 5)), "a results entry is not an object"),
    ("a list for a half", _doc(_set("results/0/out_of_place", [])),
     "result field 'out_of_place' is not an object"),
    ("text for a half", _doc(_set("results/2/in_place", "x")),
     "result field 'in_place' is not an object"),
    ("no alg_bw", _doc(_set("results/0/out_of_place/alg_bw", ...)),
     "result field 'out_of_place' lacks or mangles 'alg_bw'"),
    ("no time", _doc(_set("results/0/in_place/time", ...)),
     "result field 'in_place' lacks or mangles float() argument must be a string or a real "
     "number, not 'NoneType'"),
    ("busbw as a word", _doc(_set("results/0/in_place/bus_bw", "fast")),
     "result field 'in_place' lacks or mangles could not convert string to float: 'fast'"),
    ("half a per-iteration object", _doc(_set("results/0/in_place_per_iter/p99_us", ...)),
     "result field 'in_place' lacks or mangles 'p99_us'"),
    ("no size", _doc(_set("results/0/size", ...)), "a results entry lacks or mangles 'size'"),
    ("a word for the root", _doc(_set("results/0/root", "x")),
     "a results entry lacks or mangles invalid literal for int() with base 10: 'x'"),
    ("an average without a number", _doc(_set("average_bus_bandwidth/bandwidth", "fast")),
     "average_bus_bandwidth has no number"),
    ("an out-of-bounds count of 300 letters", _doc(_set("out_of_bounds/count", "x" * 300)),
     "unexpected JSON structure (ValueError: "
     + ("invalid literal for int() with base 10: '" + "x" * 300)[:200]
     + "); is this the -J output of nccl-tests?"),
    ("a device without its host", _doc(_set("config/devices/0/hostname", ...)),
     "unexpected JSON structure (KeyError: 'hostname'); is this the -J output of nccl-tests?"),
    ("a device rank as a word", _doc(_set("config/devices/0/rank", "zero")),
     "unexpected JSON structure (ValidationError: 1 validation error for NcclRank); "
     "is this the -J output of nccl-tests?"),
]


@pytest.mark.parametrize(("what", "doc", "message"), REFUSALS, ids=[r[0] for r in REFUSALS])
def test_a_broken_document_is_refused_with_what_broke(what: str, doc: Any, message: str) -> None:
    assert _refusal(json.dumps(doc)) == (KIND, AT + message, None, None, SRC)


def test_text_that_is_no_json_is_refused_with_where_it_stopped() -> None:
    text = json.dumps(BASE, indent=1)
    cut = text[:text.index('"results"')]
    line = cut.count("\n") + 1
    assert _refusal(cut) == (
        KIND, f"cannot parse {KIND} output at {SRC}:{line}: not valid JSON (Expecting property "
        "name enclosed in double quotes); a run killed before it finished leaves the file "
        "unclosed", line, None, SRC)
    assert _refusal("[" * 100_000) == (
        KIND, f"{AT}not valid JSON (nested too deeply); a run killed before it finished leaves "
        "the file unclosed", None, None, SRC)
