"""`gpuvet index rebuild`: the index made anew from the runs' record files, under the store's
lock held exclusive from the first read to the swap (a command writing records waits), each
run counted against what its run.json says it wrote (fewer: indexed `damaged`), a damaged
or missing run.json completed from the records, every skip listed."""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from orchestrator.errors import GpuvetError, UsageError
from orchestrator.files import (
    read_jsonl_salvage,
    store_error,
    store_lock,
)
from orchestrator.index import SCHEMA_VERSION, Index, RunMeta, baseline_sets
from orchestrator.records import Finding, Measurement
from orchestrator.store import RUN_ID_RE, DamagedRunFile, Run, _in_flight


def rebuild_index(root: Path, *,
                  waiting: Callable[[], None] | None = None) -> tuple[int, list[str]]:
    """Build the index anew from every run's JSONL files; swap it in atomically.

    Returns (runs indexed, problems), one problem a line. What can be read is indexed:
    a damaged JSONL line is skipped and named (file and line), the rest of the run
    kept; a damaged or missing run.json is read as far as it goes and the rest taken
    from the records (`_salvaged_meta`). A run whose record files hold fewer records
    than it wrote (deleted, emptied, replaced, unreadable) or records of another run is
    indexed as "damaged" (no verdict) and named. A run with nothing readable, or written
    by another record schema, is left out and named, never guessed at.

    The store's lock is held exclusive from the first read to the swap (`files.store_lock`):
    a command writing records waits for the swap and then writes into the new index, so
    no record lands in the index being replaced; `waiting` is called if one is mid-write.
    A run in flight is indexed as it stands and named."""
    if not root.is_dir():
        raise UsageError(f"no results folder {root}")
    tmp = root / f".index.sqlite.{os.getpid()}.tmp"
    problems: list[str] = []
    n = 0
    try:
        with store_lock(root, exclusive=True, waiting=waiting):
            tmp.unlink(missing_ok=True)
            idx = Index(root, path=tmp)
            for run_dir in sorted(p for p in root.iterdir() if p.is_dir()):
                got = _indexed_run(root, run_dir, problems)
                if got is None:
                    continue
                meta, findings, ms = got
                idx.upsert_run(meta)
                idx.add_findings(findings)
                idx.add_measurements(ms)
                n += 1
            sets, bad = baseline_sets(root)
            problems += [f"{line}: skipped, the other baselines indexed" for line in bad]
            for group in sets:
                idx.replace_baselines(group)
            os.replace(tmp, root / "index.sqlite")
    except OSError as exc:
        raise store_error(exc, root / "index.sqlite") from exc
    finally:
        tmp.unlink(missing_ok=True)
    return n, problems


_RECORD_FILES = (("findings", "findings.jsonl"), ("measurements", "measurements.jsonl"))


def _indexed_run(root: Path, run_dir: Path, problems: list[str]
                 ) -> tuple[RunMeta, list[Finding], list[Measurement]] | None:
    """One run as `rebuild_index` indexes it (its meta, with any damage noted), or None when
    it is no run or nothing of it can be read; every problem appended to `problems`."""
    name = run_dir.name
    has_meta = (run_dir / "run.json").is_file()
    if not has_meta and not RUN_ID_RE.fullmatch(name):
        return None  # not a run's folder
    findings, bad_f = read_jsonl_salvage(run_dir / "findings.jsonl", Finding)
    ms, bad_m = read_jsonl_salvage(run_dir / "measurements.jsonl", Measurement)
    damage: list[str] = []
    try:
        if not has_meta:
            raise DamagedRunFile("")
        meta = Run.open(root, name).meta
    except DamagedRunFile as exc:
        why = f"damaged ({exc.what})" if has_meta else "missing"
        salvaged = _salvaged_meta(run_dir, findings, ms)
        if salvaged is None:
            problems.append(f"{name}: skipped: {exc.what}" if has_meta else
                            f"{name}: skipped: run.json is missing and the run has no records")
            return None
        meta = salvaged
        meta.damage = [f"run.json is {'damaged' if has_meta else 'missing'}"]
        problems.append(f"{name}: run.json is {why}: indexed from what "
                        f"could be read (command {meta.command!r}, status "
                        f"{meta.status}, {len(findings)} finding(s), {len(ms)} "
                        "measurement(s)) as damaged (no verdict)")
    except GpuvetError as exc:
        problems.append(f"{name}: skipped: {exc.what}")
        return None
    problems += [f"{name}: {line}: skipped, the rest of the run indexed"
                 for line in bad_f + bad_m]
    theirs = sorted({f.run_id for f in findings if f.run_id != name}
                    | {m.run_id for m in ms if m.run_id != name})
    if theirs:
        damage.append(f"its record files hold records of run {', '.join(theirs)}: not this "
                      "run's, left out (a file was replaced)")
        findings = [f for f in findings if f.run_id == name]
        ms = [m for m in ms if m.run_id == name]
    for kind, file in _RECORD_FILES:
        stated = (meta.records or {}).get(kind, 0)
        have = len(findings) if kind == "findings" else len(ms)
        if have < stated:
            damage.append(f"{file} is missing: the run wrote {stated} {kind}"
                          if not (run_dir / file).is_file() else
                          f"{file} holds {have} of the {stated} {kind} the run wrote")
    if meta.status == "running" and _in_flight(run_dir):  # a command works on it now
        problems.append(f"{name}: in progress ({meta.command}, pid {meta.pid}): indexed as "
                        "it stands; its command goes on writing into the new index")
    meta.damage = [*meta.damage, *damage]
    problems += [f"{name}: damaged: {d}; indexed as damaged (no verdict)" for d in damage]
    meta.index_stale = False
    return meta, findings, ms


# run.json is written with indent=2 and sorted keys: a top-level scalar is one line
_TOP_SCALAR = re.compile(r'^  "(?P<key>[a-z_]+)": '
                         r'(?P<val>"(?:[^"\\]|\\.)*"|-?\d+|true|false|null),?$', re.M)
_SALVAGED = ("started", "finished", "command", "suite_hash", "gpuvet_version", "status",
             "inventory_sha256", "pid", "host")


def _salvaged_meta(run_dir: Path, findings: list[Finding],
                   ms: list[Measurement]) -> RunMeta | None:
    """A damaged run.json read as far as it goes, the rest taken from the run's records:
    providers and nodes from its findings and measurements, the suite hash from its
    measurements, the start from its id. A status that cannot be read is "error" (never
    a verdict). None when nothing can be read, or another record schema wrote it."""
    if not RUN_ID_RE.fullmatch(run_dir.name):
        return None
    try:
        text = (run_dir / "run.json").read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    found: dict[str, Any] = {}
    for m in _TOP_SCALAR.finditer(text):
        with contextlib.suppress(ValueError):
            found[m["key"]] = json.loads(m["val"])
    if found.get("schema_version", SCHEMA_VERSION) != SCHEMA_VERSION:
        return None
    if not findings and not ms and "command" not in found:
        return None
    rid = run_dir.name
    fields = {k: found[k] for k in _SALVAGED if k in found}
    fields.setdefault("started", f"{rid[:4]}-{rid[4:6]}-{rid[6:8]}T{rid[9:11]}:{rid[11:13]}:"
                                 f"{rid[13:15]}Z")
    fields.setdefault("command", "unknown")
    fields.setdefault("suite_hash", ms[0].suite_hash if ms else "unknown")
    fields.setdefault("gpuvet_version", "unknown")
    if fields.get("status") not in ("running", "passed", "failed", "interrupted", "error"):
        fields["status"] = "error"
    providers = {f.provider for f in findings} | {m.provider for m in ms}
    nodes = {f.node for f in findings if f.node} | {n for m in ms for n in m.nodes}
    try:
        return RunMeta(run_id=rid, suite={}, path=str(run_dir), providers=sorted(providers),
                       nodes=sorted(nodes), **fields)
    except ValidationError:
        return None
