"""`gpuvet import nccl-tests`: logs of earlier manual runs, judged like a live run.

An imported series gets a suite hash derived from what its logs print (the
binary, sizes, GPUs, iterations, check, datatype, op, node count): imports of
different experiments never share a hash, and logs of different experiments
are never mixed into one series. A log already imported is recognised by its
content hash.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from orchestrator.errors import ParseError, UsageError
from orchestrator.parsers.nccl_tests import parse_nccl_tests
from orchestrator.records import Finding, Measurement, MeasureScope
from orchestrator.steps.nccl.judge import Series, judge_series
from orchestrator.store import Index, Run
from orchestrator.suite import Suite
from payload.scrub import scrub_text

_NOT_PARAMS: frozenset[str] = frozenset()  # every printed parameter makes the experiment


def experiment(run: Any, n_nodes: int) -> dict[str, Any]:
    """The parameters a log prints that make it one experiment."""
    types = sorted({r.type for r in run.rows})
    redops = sorted({r.redop for r in run.rows if getattr(r, "redop", None)})
    return {"binary": run.binary, "op": run.op,
            "params": {k: v for k, v in sorted(run.params.items()) if k not in _NOT_PARAMS},
            "datatype": types, "redop": redops, "ranks": len(run.ranks), "nodes": n_nodes}


def experiment_hash(exp: dict[str, Any]) -> str:
    blob = json.dumps({"imported-nccl-tests": exp}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _check_log(path: Path) -> tuple[str, Any]:
    if not path.is_file():
        raise UsageError(f"no such file: {path}")
    text = path.read_text(encoding="utf-8", errors="replace")
    if text.lstrip().startswith("{"):
        raise UsageError(f"{path} is an nccl-tests JSON (-J) file, not a text log",
                         hint=f"read it with `gpuvet parse nccl-tests-json {path}`; import the "
                              "text logs of the same rounds")
    try:
        run = parse_nccl_tests(text, source=str(path))
    except ParseError as exc:
        raise UsageError(f"{path} is not an nccl-tests log: {exc.what}",
                         hint="give the text output of an nccl-tests binary (all_reduce_perf)"
                         ) from None
    return text, run


def _already_imported(root: Path, digests: list[str]) -> str | None:
    if not (root / "index.sqlite").is_file():
        return None
    for meta in Index(root).runs():
        src = meta.source or {}
        if set(src.get("sha256") or []) & set(digests):
            return meta.run_id
    return None


class AlreadyImported(Exception):
    """These logs are in the store already: nothing new to record."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(run_id)


def import_logs(logs: list[Path], provider: str, n_nodes: int,
                results: Path) -> tuple[Run, list[Finding], list[Measurement]]:
    """Judge and store the logs as one series; AlreadyImported when they are stored."""
    parsed = [_check_log(p) for p in logs]
    exps = [experiment(r, n_nodes) for _, r in parsed]
    for p, e in zip(logs[1:], exps[1:], strict=True):
        if e != exps[0]:
            diff = sorted(k for k in set(e) | set(exps[0]) if e.get(k) != exps[0].get(k))
            detail = "; ".join(f"{k}: {exps[0].get(k)} vs {e.get(k)}" for k in diff)
            raise UsageError(f"{p} is another experiment than {logs[0]} ({detail})",
                             hint="import each experiment's rounds on their own")
    digests = [hashlib.sha256(p.read_bytes()).hexdigest() for p in logs]
    if len(set(digests)) != len(digests):
        raise UsageError("the same log is given twice (identical content)",
                         hint="give each round's log once")
    earlier = _already_imported(results, digests)
    if earlier is not None:
        raise AlreadyImported(earlier)
    suite = Suite()
    exp_hash = experiment_hash(exps[0])
    run = Run.create(results, command="import nccl-tests", suite_hash=exp_hash,
                     suite={"imported": exps[0]}, inventory_path=None, providers=[provider],
                     source={"kind": "nccl-tests", "files": [str(p) for p in logs],
                             "sha256": digests})
    with run.locked(), run.guard():
        dest = run.provider_dir(provider, "imported")
        series_logs = []
        for i, (p, (text, _)) in enumerate(zip(logs, parsed, strict=True), 1):
            copy = dest / f"round{i}_{p.name}"
            copy.write_text(scrub_text(text), encoding="utf-8")  # what the run keeps
            series_logs.append((i, copy, False))
        scope: MeasureScope = "single" if n_nodes == 1 else "multi"
        series = Series(scope, [], series_logs, provider=provider, n_nodes=n_nodes,
                        imported=True)
        findings, ms = judge_series(series, run, None, suite, suite_hash=exp_hash)
        run.add_findings(findings)
        run.add_measurements(ms)
    return run, findings, ms
