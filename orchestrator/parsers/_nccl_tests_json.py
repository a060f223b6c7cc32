"""Read the -J JSON of nccl-tests (file versions 1-3, nccl-tests 2.17.6 onwards).

The JSON holds full-precision figures, so it is the better source when both
exist; it also embeds the node's whole environment, which gpuvet never keeps.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from orchestrator.errors import ParseError
from orchestrator.parsers._nccl_common import (
    Failure,
    NcclOutOfBounds,
    NcclPerIter,
    NcclRank,
    NcclResult,
    NcclRow,
    NcclTestsRun,
    check_avg,
    decode_version_code,
    recompute_avg,
)

KIND = "nccl-tests-json"
_KNOWN_VERSIONS = (1, 2, 3)
# JSON config key -> the key the text parameters line yields, so both agree.
_CONFIG_KEYS = {
    "nthreads": "n_thread", "ngpus": "n_gpus", "minimum_bytes": "min_bytes",
    "maximum_bytes": "max_bytes", "warmup_iters": "warmup_iters", "iterations": "iters",
    "aggregated_iterations": "agg_iters", "validation": "validation", "graph": "graph",
}


def _fail(what: str, source: str | None) -> ParseError:
    return ParseError(KIND, what, source=source)


def _result(obj: Any, key: str, source: str | None) -> NcclResult:
    if not isinstance(obj, dict):
        raise _fail(f"result field {key!r} is not an object", source)
    time: Any = obj.get("time", obj.get("cpu_time"))
    per = obj.get("per_iter")
    try:
        per_iter = None
        if isinstance(per, dict):
            per_iter = NcclPerIter(min_us=per["min_us"], max_us=per["max_us"],
                                   p99_us=per["p99_us"], cv_pct=per["cv_pct"])
        nwrong = obj["nwrong"]
        return NcclResult(time_us=float(time), algbw_gbs=float(obj["alg_bw"]),
                          busbw_gbs=float(obj["bus_bw"]),
                          wrong=None if nwrong is None else int(nwrong), per_iter=per_iter)
    except (KeyError, TypeError, ValueError) as exc:
        raise _fail(f"result field {key!r} lacks or mangles {exc}", source) from None


def _row(obj: Any, source: str | None) -> NcclRow:
    if not isinstance(obj, dict):
        raise _fail("a results entry is not an object", source)
    try:
        root = int(str(obj["root"]).strip())
        out = obj["out_of_place"]
        inp = obj["in_place"]
        if isinstance(out, dict) and "out_of_place_per_iter" in obj:
            out = {**out, "per_iter": obj["out_of_place_per_iter"]}
        if isinstance(inp, dict) and "in_place_per_iter" in obj:
            inp = {**inp, "per_iter": obj["in_place_per_iter"]}
        return NcclRow(
            line_no=None, size_bytes=int(obj["size"]), count=int(obj["count"]),
            type=str(obj["type"]), redop=None if obj["redop"] == "none" else str(obj["redop"]),
            root=None if root == -1 else root, out_of_place=_result(out, "out_of_place", source),
            in_place=_result(inp, "in_place", source))
    except (KeyError, ValueError) as exc:
        raise _fail(f"a results entry lacks or mangles {exc}", source) from None


def _params(config: dict[str, Any]) -> dict[str, int | str]:
    out: dict[str, int | str] = {}
    for key, value in config.items():
        if key == "devices":
            continue
        if key in ("step_factor", "step_bytes"):
            out["step"] = int(value)
            out["step_mode"] = key.removeprefix("step_")
        elif isinstance(value, (int, str)) and not isinstance(value, bool):
            out[_CONFIG_KEYS.get(key, key)] = value
    return out


def _ranks(config: dict[str, Any]) -> list[NcclRank]:
    ranks = []
    for dev in config.get("devices") or []:
        ranks.append(NcclRank(rank=dev["rank"], group=dev.get("group"), pid=dev.get("pid"),
                              host=dev["hostname"], device=dev["device"],
                              bus_id=dev["device_hex"], name=dev["device_info"]))
    return ranks


def parse_json_run(text: str, source: str | None,
                   op_of: Callable[[str | None], str | None]) -> NcclTestsRun:
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        msg = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
        raise ParseError(KIND, f"not valid JSON ({msg}); a run killed before it finished "
                         "leaves the file unclosed",
                         line_no=getattr(exc, "lineno", None), source=source) from None
    try:
        return _run(doc, source, op_of)
    except (KeyError, IndexError, TypeError, ValueError, OverflowError, AttributeError) as exc:
        # a value of the wrong type or shape anywhere in the document (pydantic's
        # ValidationError is a ValueError): refused, with what broke
        what = str(exc).splitlines()[0][:200]
        raise ParseError(KIND, f"unexpected JSON structure ({type(exc).__name__}: {what}); "
                         "is this the -J output of nccl-tests?", source=source) from None


def _run(doc: Any, source: str | None, op_of: Callable[[str | None], str | None]) -> NcclTestsRun:
    if not isinstance(doc, dict) or doc.get("version") not in _KNOWN_VERSIONS:
        version = doc.get("version") if isinstance(doc, dict) else None
        raise _fail(f"unknown nccl-tests JSON version {version!r} (known: 1-3)", source)
    config = doc.get("config") or {}
    args = doc.get("args") or []
    binary = str(args[0]).rsplit("/", 1)[-1] if args else None
    results = doc.get("results")
    rows = [_row(r, source) for r in results] if isinstance(results, list) else []
    oob_doc = doc.get("out_of_bounds")
    oob = None
    failures: list[Failure] = []
    if isinstance(oob_doc, dict):
        oob = NcclOutOfBounds(count=int(oob_doc["count"]), ok=oob_doc["okay"] == "true")
        if not oob.ok:
            failures.append(Failure(line_no=None, kind="out-of-bounds",
                                    text=f"Out of bounds values : {oob.count} FAILED"))
    # Files from nccl-tests before 2.17.9 spell the key "bandwidith".
    avg_doc = doc.get("average_bus_bandwidth", doc.get("average_bus_bandwidith"))
    avg = check = None
    if isinstance(avg_doc, dict):
        bw: Any = avg_doc.get("bandwidth", avg_doc.get("bandwidith"))
        if not isinstance(bw, (int, float)):
            raise _fail("average_bus_bandwidth has no number", source)
        avg = float(bw)
        okay = avg_doc.get("okay")
        check = None if okay == "unchecked" else ("OK" if okay == "true" else "FAILED")
        if check == "FAILED":
            failures.append(Failure(line_no=None, kind="min-bw", text=f"Avg bus bandwidth {avg}"))
    for row in rows:
        if row.out_of_place.wrong or row.in_place.wrong:
            failures.append(Failure(line_no=None, kind="wrong",
                                    text=f"{row.size_bytes} bytes: wrong elements"))
    for err in doc.get("errors") or []:
        if err:
            failures.append(Failure(line_no=None, kind="nccl-error", text=str(err)))
    code = doc.get("nccl_version")
    env = doc.get("env")
    run = NcclTestsRun(
        format="json", binary=binary, op=op_of(binary), tests_version=None,
        tests_git_hash=None, nccl_version=decode_version_code(code) if code else None,
        nccl_cuda=None, nccl_headers=None, params=_params(config), header_notes=[],
        time_kind="cputime" if rows and _has_cputime(results) else "time",
        ranks=_ranks(config), rows=rows, out_of_bounds=oob, avg_busbw_reported=avg,
        avg_busbw_check=check, avg_busbw_recomputed=recompute_avg(rows),
        avg_busbw_agrees=None, failures=failures, truncated=avg_doc is None,
        env_count=len(env) if isinstance(env, list) else None,
        start_time=doc.get("start_time"), end_time=doc.get("end_time"))
    run.avg_busbw_agrees = check_avg(run, tol=1e-5)
    return run


def _has_cputime(results: Any) -> bool:
    first = results[0].get("in_place") if isinstance(results, list) else None
    return isinstance(first, dict) and "cpu_time" in first
