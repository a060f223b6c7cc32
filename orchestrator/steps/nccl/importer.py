"""`gpuvet import nccl-tests`: logs of earlier manual runs, judged like a live run.

An imported series gets a suite hash derived from what its logs print (the
binary, sizes, GPUs, iterations, check, datatype, op, node count): imports of
different experiments never share a hash, and logs of different experiments
are never mixed into one series. A log already imported is recognised by its
content hash.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path
from typing import Any

from orchestrator.errors import ParseError, UsageError, shown
from orchestrator.files import (
    IMPORT_LOCK,
    MAX_INPUT_BYTES,
    atomic_write,
    read_user_file,
    store_lock,
    warn,
)
from orchestrator.inventory import checked_name
from orchestrator.parsers._nccl_common import NcclTestsRun, count_nodes
from orchestrator.parsers.nccl_tests import parse_nccl_tests
from orchestrator.records import Finding, Measurement, MeasureScope
from orchestrator.steps.nccl.judge import Series, judge_series
from orchestrator.store import Index, Run, RunBusy
from orchestrator.suite import Suite
from orchestrator.verdicts import run_status
from payload.scrub import scrub_text

_NOT_PARAMS: frozenset[str] = frozenset()  # every printed parameter makes the experiment


def experiment(run: Any, n_nodes: int) -> dict[str, Any]:
    """The parameters a log prints that make it one experiment."""
    types = sorted({r.type for r in run.rows})
    redops = sorted({r.redop for r in run.rows if getattr(r, "redop", None)})
    return {"binary": run.binary, "op": run.op,
            "params": {k: v for k, v in sorted(run.params.items()) if k not in _NOT_PARAMS},
            "datatype": types, "redop": redops, "ranks": _ranks(run), "nodes": n_nodes}


def _ranks(run: Any) -> int:
    total = getattr(run, "ranks_total", None)
    return total.count if total is not None and total.count and total.shown else len(run.ranks)


def experiment_hash(exp: dict[str, Any]) -> str:
    blob = json.dumps({"imported-nccl-tests": exp}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def log_nodes(run: NcclTestsRun, name: str, n_nodes: int | None) -> int:
    """The node count to file a log under: `--nodes` where given and the log does not
    contradict it, else what the log shows (hosts in its rank lines, NCCL INFO's nNodes).

    A log whose ranks run on more hosts than `--nodes` says is refused with both counts;
    one whose rank list is cut to one host cannot tell and needs `--nodes`.
    """
    shown, hosts = count_nodes(run)
    listed = ", ".join(hosts[:4]) + (" ..." if len(hosts) > 4 else "")
    if n_nodes is not None:
        if (shown is not None and shown > n_nodes) or (run.nccl_nodes or n_nodes) != n_nodes:
            where = (f"its ranks run on {len(hosts)} hosts ({listed})" if len(hosts) > n_nodes
                     else f"NCCL INFO says nNodes {run.nccl_nodes}")
            raise UsageError(f"--nodes {n_nodes} disagrees with {name}: {where}",
                             hint=f"leave --nodes out to take the count from the log, or give "
                                  f"--nodes {shown}")
        return n_nodes
    if shown is None:
        total = run.ranks_total.count if run.ranks_total else None
        raise UsageError(f"{name} shows {total} ranks but rank lines of one host only "
                         f"({listed}): how many nodes the run spanned is not in the paste",
                         hint="give --nodes N (the node count of that run)")
    return shown


def check_log(path: Path, n_nodes: int | None) -> tuple[str, str, dict[str, Any], int]:
    """The log's text, sha256, experiment and node count; a file that is no nccl-tests log,
    or whose hosts contradict `--nodes`, is a UsageError."""
    name = shown(str(path))
    data = read_user_file(path, MAX_INPUT_BYTES, "nccl-tests log")
    digest = hashlib.sha256(data).hexdigest()
    text = data.decode("utf-8", errors="replace")
    del data
    if text.lstrip()[:1] == "{":
        raise UsageError(f"{name} is an nccl-tests JSON (-J) file, not a text log",
                         hint=f"read it with `gpuvet parse nccl-tests-json {name}`; import the "
                              "text logs of the same rounds")
    try:
        run = parse_nccl_tests(text, source=name)
    except ParseError as exc:  # the line it quotes, scrubbed as the text around it says
        raise UsageError(f"{name} is not an nccl-tests log: {exc.scrubbed(text).what}",
                         hint="give the text output of an nccl-tests binary (all_reduce_perf)"
                         ) from None
    nodes = log_nodes(run, name, n_nodes)
    # the copy the run keeps, judged and cited by the findings: scrubbed line for line
    return scrub_text(text), digest, experiment(run, nodes), nodes


UNIT = "imported"  # the step folder of an import's copies, and its done marker


def _already_imported(root: Path, digests: list[str]) -> tuple[str, bool, list[str]] | None:
    """The run that imported any of these logs, whether it finished, and its providers.

    A run is finished (passed or failed) only after `import_logs` returned, that is
    after every record was durable and the done marker written; a run cut short by a
    full disk, exit 3 or Ctrl-C is `running`, `error` or `interrupted` and is imported
    again. The status is read from run.json (the index may be stale after a full disk)."""
    if not (root / "index.sqlite").is_file():
        return None
    for meta in Index(root).runs():
        src = meta.source or {}
        if set(src.get("sha256") or []) & set(digests):
            try:
                status = Run.open(root, meta.run_id).meta.status
            except UsageError:
                status = meta.status
            return meta.run_id, status in ("passed", "failed"), list(meta.providers)
    return None


class AlreadyImported(Exception):
    """These logs are in the store already: nothing new to record."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(run_id)


def import_logs(logs: list[Path], provider: str, n_nodes: int | None,
                results: Path) -> tuple[Run, list[Finding], list[Measurement]]:
    """Judge and store the logs as one series; AlreadyImported when they are stored.

    `n_nodes` None takes the node count from the logs (their rank lines' hosts)."""
    checked_name(provider, "provider")  # it names a folder of the run
    parsed = [check_log(p, n_nodes) for p in logs]
    exps = [e for _, _, e, _ in parsed]
    n_nodes = parsed[0][3]
    for p, e in zip(logs[1:], exps[1:], strict=True):
        if e != exps[0]:
            diff = sorted(k for k in set(e) | set(exps[0]) if e.get(k) != exps[0].get(k))
            detail = "; ".join(f"{k}: {exps[0].get(k)} vs {e.get(k)}" for k in diff)
            raise UsageError(f"{shown(str(p))} is another experiment than "
                             f"{shown(str(logs[0]))} ({detail})",
                             hint="import each experiment's rounds on their own")
    digests = [d for _, d, _, _ in parsed]
    if len(set(digests)) != len(digests):
        raise UsageError("the same log is given twice (identical content)",
                         hint="give each round's log once")
    with contextlib.ExitStack() as stack:
        run, redo = _claim(stack, logs, digests, provider, results, exps[0])
        stack.enter_context(run.guard())
        if redo:  # what the cut-short import stored is stored again, whole
            run.clear_records()
            run.clear_done(f"provider:{provider}", UNIT)
            run.meta.status, run.meta.finished = "running", None
            run.save_meta()
        suite, exp_hash = Suite(), run.meta.suite_hash
        dest = run.provider_dir(provider, UNIT)
        series_logs = []
        for i, (p, (text, _, _, _)) in enumerate(zip(logs, parsed, strict=True), 1):
            copy = dest / f"round{i}_{_file_name(p)}"
            atomic_write(copy, text)  # what the run keeps, scrubbed by check_log
            series_logs.append((i, copy, False))
        scope: MeasureScope = "single" if n_nodes == 1 else "multi"
        series = Series(scope, [], series_logs, provider=provider, n_nodes=n_nodes,
                        imported=True)
        findings, ms = judge_series(series, run, None, suite, suite_hash=exp_hash)
        run.add_findings(findings)
        run.add_measurements(ms)
        # only now, with every record durable, is the import done
        run.mark_done(f"provider:{provider}", UNIT, {"findings": len(findings),
                                                     "measurements": len(ms)})
        # finished under the run's lock: an import of the same logs waiting for the lock
        # then finds the run finished, never "running"
        run.finish(run_status(findings))
    return run, findings, ms


def _claim(stack: contextlib.ExitStack, logs: list[Path], digests: list[str], provider: str,
           results: Path, exp: dict[str, Any]) -> tuple[Run, bool]:
    """The run these logs go into, locked (its lock entered on `stack`), and whether it is an
    earlier import of them cut short (to be stored again); AlreadyImported when stored.

    Looking for an earlier run and making a new one happen under the results root's import
    lock, so the same import started twice makes one run: the second finds the first's run,
    waits for its lock (saying so) and then finds it finished."""
    with store_lock(results, exclusive=True, name=IMPORT_LOCK):
        earlier = _already_imported(results, digests)
        if earlier is not None and earlier[2] and provider not in earlier[2]:
            # one log measures one platform: filed under two providers it would be
            # compared with itself
            theirs = ", ".join(shown(p) for p in earlier[2])
            raise UsageError(f"these logs were already imported under provider {theirs} "
                             f"(run {earlier[0]}), not {shown(provider)}",
                             hint="a log measures one platform; to file it under "
                                  f"{shown(provider)}, import it into another --results folder")
        if earlier is not None and earlier[1]:
            raise AlreadyImported(earlier[0])
        if earlier is None:
            source = {"kind": "nccl-tests", "files": [shown(str(p)) for p in logs],
                      "sha256": digests}
            run = Run.create(results, command="import nccl-tests", suite_hash=experiment_hash(exp),
                             suite={"imported": exp}, inventory_path=None,
                             providers=[provider], source=source)
            stack.enter_context(run.locked())
            return run, False
        run = _reopen(results, earlier[0])
        try:
            stack.enter_context(run.locked())
            busy = None
        except RunBusy as exc:
            busy = exc
    if busy is not None:  # being imported now: wait for it, outside the import lock
        warn(f"{busy.what}, which is importing these logs now: waiting for it to finish")
        stack.enter_context(run.locked(wait=True))
        run.meta = Run.open(results, run.run_id).meta
        if run.meta.status in ("passed", "failed"):
            raise AlreadyImported(run.run_id)
    warn(f"run {run.run_id} imported these logs but did not finish ({run.meta.status}): "
         "importing them again into it")
    return run, True


def _file_name(path: Path) -> str:
    """The log's name for its copy: bytes that are not UTF-8 written as `\\xNN`, a secret
    in it (`hf_<token>.log`) scrubbed."""
    return scrub_text(shown(path.name)).replace("/", "_")


def _reopen(results: Path, run_id: str) -> Run:
    run = Run.open(results, run_id)
    if run.meta.command != "import nccl-tests":
        raise UsageError(f"run {run_id} holds these logs but is a {run.meta.command!r} run",
                         hint="import the logs into another --results folder")
    return run
