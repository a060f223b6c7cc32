"""`gpuvet import poc`: a folder of outputs collected by hand, judged like a live preflight.

A PoC is often checked by hand before gpuvet can reach the machine: someone
runs the acceptance recipe and saves what it printed. The import turns that
folder into the same collect document the payload writes and judges it
through `preflight.judge_document` (so the finding codes are the live ones),
and judges the nccl-tests logs like `import nccl-tests` does. Outputs the
payload does not collect (`nvidia-smi -q` as text) join the node's facts by
type; outputs no check reads (dmon, `nvidia-smi --version`, pip, the commit
and the date) are kept and recorded. What the folder did not hold is said to
be unchecked, never taken for a missing driver or a missing tool.

Every file gets one status: judged, recorded, duplicate, other node, not
recognised, unreadable, split (several ranks' outputs, read one part per rank)
or skipped (the nccl-tests checkout beside the logs: sources, `.git/`, builds).
None of them stops the others; only a folder in which nothing at all could be
judged is bad input.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from orchestrator import inventory as inventory_mod
from orchestrator import parsers
from orchestrator.errors import StoreError, UsageError, shown
from orchestrator.nccltests import BuildDoc
from orchestrator.parsers.gpus import GPU_FACTS
from orchestrator.parsers.nvidia_smi_q import NvidiaSmiQFacts, QGpu
from orchestrator.records import Finding, Measurement, MeasureScope, Severity, finding
from orchestrator.steps.nccl.importer import experiment, experiment_hash
from orchestrator.steps.nccl.judge import Series, judge_series
from orchestrator.steps.poc import health as poc_health
from orchestrator.steps.poc.files import (
    PocFile,
    as_json,
    describe,
)
from orchestrator.steps.poc.folder import (  # noqa: F401 - scan, split_nodes: importer's API
    _AGAIN,
    _check_folder,
    _natural,
    _nbytes,
    _path_max,
    _restated,
    _store_failed,
    _too_long,
    hostname,
    scan,
    split_nodes,
)
from orchestrator.steps.poc.kinds import HEALTH_KIND_NAMES
from orchestrator.steps.poc.origin import folder_uuids, folder_window, inventory_node
from orchestrator.steps.preflight import checks
from orchestrator.steps.preflight import step as pf
from orchestrator.store import Run, atomic_write, new_run_id, write_json
from orchestrator.suite import Suite
from orchestrator.verdicts import Table
from payload.commands import COMMANDS, COMMANDS_BY_ID
from payload.scrub import scrub_text

STEP = "import"
COMMAND = "import poc"

# parser kind -> the collect command whose output it reads
COMMAND_OF: dict[str, str] = {c.parser: c.id for c in COMMANDS if c.parser}
COMMAND_OF["nvidia-smi-version"] = "nvidia_smi_version"  # kept as evidence, as live
COMMAND_OF["mounts"] = "mounts"
# outputs the payload does not collect in this form, judged as facts of their own
# (checks pick GPU facts up by type; the recipe's PyTorch check stands for the probe)
EXTRA_OF = {"nvidia-smi-q": "nvidia_smi_q", "nvidia-smi-query-gpu-noheader": "query_gpu_noheader",
            "torch-check": "torch"}
# outputs no check reads: parsed, kept and recorded
RECORDED = frozenset({"dmon", "nccl-tests-json", "commit", "checked-at", "pip-list",
                      "nccl-tests-build"})
# a program missing on the node -> the command whose absence the checks understand
_MISSING_OF = {"nvidia-smi": "query_gpu", "nvcc": "nvcc_version", "python": "torch",
               "python3": "torch"}
for _c in COMMANDS:
    _MISSING_OF.setdefault(_c.argv[0], _c.id)

# Live findings whose premise is "the payload ran this and it was absent": in a
# folder, an absent file means nobody saved that output, not that it failed.
_PREMISES: dict[str, tuple[tuple[str, ...], str]] = {
    "NVIDIA_DRIVER_MISSING": (("query_gpu",), "GPUs (model, count, memory, MIG, health): "
                              "no nvidia-smi output in the folder"),
    "TORCH_UNAVAILABLE": (("torch",), "PyTorch's view of the GPUs: no torch probe output"),
    "BUILD_TOOLS": ((), "build tools: only a live preflight probes nvcc, NCCL headers and MPI"),
    "TOPOLOGY_UNKNOWN": (("topo_m",), "NVLink: no `nvidia-smi topo -m` output"),
    "IB_MISSING": (("ibv_devinfo", "ibstat"), "RDMA ports: no ibv_devinfo or ibstat output"),
}


@dataclass
class PocResult:
    run: Run
    node: str
    files: list[PocFile]
    findings: list[Finding] = field(default_factory=list)
    measurements: list[Measurement] = field(default_factory=list)


# --------------------------------------------------------------------------- the document

@dataclass
class Assembled:
    doc: dict[str, Any]
    extras: dict[str, tuple[BaseModel, PocFile]] = field(default_factory=dict)
    nccl: list[PocFile] = field(default_factory=list)
    health: list[PocFile] = field(default_factory=list)
    recorded: dict[str, PocFile] = field(default_factory=dict)


def assemble(files: list[PocFile], node: str) -> Assembled:
    """The collect document of the recognised files, in the payload's shape."""
    a = Assembled({"tool": "gpuvet-payload", "node": node, "commands": {},
                   "source": "gpuvet import poc"})
    cmds: dict[str, Any] = a.doc["commands"]
    taken_by: dict[str, PocFile] = {}
    live = [f for f in files if f.status == "recognised"]
    # the payload's own outputs first, then what stands in for them, then what is missing
    order = {"command-not-found": 2}
    for f in sorted(live, key=lambda f: order.get(f.kind or "", 0 if f.kind in COMMAND_OF else 1)):
        kind = f.kind or ""
        if kind == "nccl-tests":
            a.nccl.append(f)
            f.status = "judged"
            continue
        if kind in HEALTH_KIND_NAMES:
            a.health.append(f)
            f.status = "judged"
            continue
        if kind in RECORDED:
            a.recorded[f.name] = f
            f.status = "recorded"
            continue
        if kind == "command-not-found":
            cid = _MISSING_OF.get(f.facts.command)
            if cid is None:
                f.status, f.reason = "recorded", (f"{f.facts.command} is not a command the "
                                                  "checks read")
                a.recorded[f.name] = f
                continue
            if cid in taken_by:
                f.status = "duplicate"
                f.reason = f"{taken_by[cid].name} holds the output of {f.facts.command}"
                continue
            cmds[cid] = {"argv": COMMANDS_BY_ID[cid].argv, "rc": 127, "stdout": "",
                         "stderr": f.facts.text, "missing": True, "file": f.name}
            taken_by[cid] = f
            f.target, f.status = cid, "judged"
            continue
        cid = COMMAND_OF.get(kind) or EXTRA_OF.get(kind)
        empty = _says_nothing(f)
        if cid is None or empty:  # a kind with nowhere to go, or nothing to judge: kept
            a.recorded[f.name] = f
            f.status, f.reason = "recorded", empty
            continue
        if cid not in taken_by and kind in COMMAND_OF:
            cmds[cid] = {"argv": COMMANDS_BY_ID[cid].argv, "rc": 0,
                         "stdout": scrub_text(f.content() or ""),
                         "stderr": "", "file": f.name}
            taken_by[cid] = f
            f.target = cid
            f.status = "judged" if COMMANDS_BY_ID[cid].parser else "recorded"
            continue
        if isinstance(f.facts, GPU_FACTS) or (kind in EXTRA_OF and cid not in taken_by):
            # a GPU listing (merged with the others by bus id), or an output that stands
            # for one the payload would collect (the recipe's PyTorch check)
            n = 1
            while (eid := cid if n == 1 else f"{cid}_{n}") in taken_by:
                n += 1
            a.extras[eid] = (f.facts, f)
            taken_by[eid] = f
            f.target, f.status = eid, "judged"
            continue
        f.status = "duplicate"
        f.reason = f"{taken_by[cid].name} is judged as the {kind} output; this one is kept only"
    return a


def _says_nothing(f: PocFile) -> str | None:
    """Why a recognised `-q` excerpt holds no fact a check reads, or None when it holds one."""
    facts = f.facts
    if not isinstance(facts, NvidiaSmiQFacts) or facts.driver_version or facts.attached_gpus:
        return None
    skip = {"bus_id", "line_no", "sections", "missing"}
    blank = QGpu(bus_id=None, line_no=0).model_dump(exclude=skip)
    if any(g.model_dump(exclude=skip) != blank for g in facts.gpus):
        return None
    if all(g.sections == ["MIG Mode"] for g in facts.gpus):
        return ("holds only the `MIG Mode` heading (the recipe's `sed -n '/MIG Mode/,3p'` stops "
                "at line 3 of the output): the MIG state is not in it; `sed -n '/MIG Mode/,+2p'` "
                "prints the Current and Pending lines")
    return "holds no fact a check reads"


# --------------------------------------------------------------------------- judging

def _premise_ok(code: str, a: Assembled) -> bool:
    need = _PREMISES.get(code)
    return need is None or any(c in a.doc["commands"] or c in a.extras for c in need[0])


def judge_preflight(a: Assembled, node: inventory_mod.Node, inv: inventory_mod.Inventory,
                    run: Run, out_dir: Path, suite: Suite) -> list[Finding]:
    """The live judge on the document; then the extra facts by type, and premises."""
    report = pf.judge_document(a.doc, node, inv, run.run_id, out_dir, run.rel, suite)
    nf = report.facts
    findings = report.findings
    if a.extras:
        for eid, (facts, f) in a.extras.items():
            raw = out_dir / "raw" / f"{eid}.txt"
            atomic_write(raw, scrub_text(f.content() or ""), durable=False)
            nf.facts[eid] = facts
            nf.evidence[eid] = run.rel(raw)
        results = checks.node_results(nf, inv.provider_of(node).expect, suite.preflight)
        findings = [finding(run.run_id, pf.STEP, provider=node.provider, node=node.name,
                            code=r.code, severity=r.severity, message=r.message,
                            evidence=r.evidence, **r.details) for r in results]
    write_json(out_dir / "facts.json", {
        "facts": {k: parsers.to_jsonable(v) for k, v in nf.facts.items()},
        "parse_errors": nf.parse_errors, "versions": checks.versions(nf),
        "recorded": {name: {"kind": f.kind, "facts": as_json(f.facts)}
                     for name, f in a.recorded.items()}})
    kept = [f for f in findings if _premise_ok(f.code, a)]
    unchecked = sorted({_PREMISES[f.code][1] for f in findings if not _premise_ok(f.code, a)})
    if unchecked:
        kept.append(finding(run.run_id, STEP, provider=node.provider, node=node.name,
                            code="POC_NOT_CHECKED", severity="INFO",
                            message="not checked, the folder does not hold the output: "
                                    + "; ".join(unchecked), unchecked=unchecked))
    return kept


def _series_hash(exps: list[dict[str, Any]]) -> str:
    hashes = sorted({experiment_hash(e) for e in exps})
    if len(hashes) == 1:
        return hashes[0]
    blob = json.dumps({"imported-poc": hashes}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _experiments(logs: list[PocFile]) -> list[tuple[dict[str, Any], list[PocFile]]]:
    """The logs grouped into experiments (the parameters they print), rounds in name order."""
    groups: dict[str, tuple[dict[str, Any], list[PocFile]]] = {}
    for f in logs:
        hosts = {r.host for r in f.facts.ranks}
        exp = experiment(f.facts, max(1, len(hosts)))
        key = json.dumps(exp, sort_keys=True)
        groups.setdefault(key, (exp, []))[1].append(f)
    return list(groups.values())


def judge_nccl(groups: list[tuple[dict[str, Any], list[PocFile]]], copies: dict[str, str],
               node: inventory_mod.Node, inv: inventory_mod.Inventory, run: Run,
               commit: str | None) -> tuple[list[Finding], list[Measurement]]:
    findings: list[Finding] = []
    ms: list[Measurement] = []
    suite = Suite()
    for exp, logs in groups:
        scope: MeasureScope = "single" if exp["nodes"] == 1 else "multi"
        series = Series(scope, [node], [(i, run.dir / copies[f.name], False)
                                        for i, f in enumerate(logs, 1)],
                        build=BuildDoc(built_commit=commit) if commit else None,
                        provider=node.provider, n_nodes=exp["nodes"], imported=True)
        fs, m = judge_series(series, run, inv, suite, suite_hash=experiment_hash(exp))
        findings += fs
        ms += m
    return findings, ms


_MESSAGES: dict[str, tuple[str, Severity, str]] = {
    "not recognised": ("POC_FILE_UNRECOGNISED", "WARN", "not recognised: {reason}; kept, not "
                       "judged"),
    "unreadable": ("POC_FILE_UNREADABLE", "WARN", "unreadable: {reason}"),
    "other node": ("POC_OTHER_NODE", "WARN", "from another machine: {reason}; kept, not judged "
                   "with {node}"),
    "duplicate": ("POC_DUPLICATE", "INFO", "{reason}"),
    "split": ("POC_FILE_SPLIT", "INFO", "{reason}"),
}


def _file_findings(files: list[PocFile], copies: dict[str, str], node: inventory_mod.Node,
                   run_id: str) -> list[Finding]:
    out = []
    for f in files:
        if f.status not in _MESSAGES:
            continue
        code, sev, text = _MESSAGES[f.status]
        out.append(finding(run_id, STEP, provider=node.provider, node=node.name, code=code,
                           severity=sev, message=f"{describe(f)}: " + text.format(
                               reason=f.reason, node=node.name),
                           evidence=[copies[f.name]] if f.name in copies else [],
                           file=f.name, kind=f.kind))
    skipped = [f.name for f in files if f.status == "skipped"]
    if skipped:  # one line for a whole checkout, not one warning per source file
        listed = ", ".join(skipped[:5]) + (f" and {len(skipped) - 5} more" if len(skipped) > 5
                                           else "")
        out.append(finding(run_id, STEP, provider=node.provider, node=node.name,
                           code="POC_FILES_SKIPPED", severity="INFO",
                           message=f"{len(skipped)} file(s) skipped, no command output: a source "
                                   f"checkout's own files and compiled programs ({listed})",
                           files=skipped))
    return out


# --------------------------------------------------------------------------- the target

def target(inventory: Path | None, provider: str, node_name: str
           ) -> tuple[inventory_mod.Inventory, inventory_mod.Node]:
    """The order to judge against: the provider's `expect`, or none without an inventory."""
    if inventory is not None:
        inv = inventory_mod.load(inventory)
        inv.select(providers=[provider])  # an unknown provider: UsageError naming the known
        for n in inv.nodes:
            if n.name == node_name and n.provider == provider:
                return inv, n
    else:
        inventory_mod.checked_name(provider, "provider")
        doc = inventory_mod.InventoryFile.model_validate(
            {"providers": {provider: {"executor": "local", "nodes": [{"name": node_name}]}}})
        inv = inventory_mod.Inventory(doc, Path("(no inventory: nothing ordered)"))
    node = inventory_mod.Node(name=node_name, provider=provider, executor="local", host=None,
                              port=22, user=None, identity_file=None, ssh_alias=None,
                              proxy_jump=None, python="python3", work_dir=".", ckpt_dir=None,
                              env={}, connect_timeout_s=10.0)
    return inv, node


def _stage(results: Path) -> Path:
    """The import's private staging folder in the results folder (the run's filesystem, so
    it is moved into the run by one rename); a dot name, never taken for a run."""
    try:
        results.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=".import-poc-", dir=results))
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            raise _too_long(str(results), None, _path_max(Path("/"))) from None
        raise _store_failed(exc, results) from exc


_OWN_FILES = 64  # the longest name of a file a run writes in a node's folder, with its temp name


def _check_lengths(files: list[PocFile], results: Path, node: str) -> None:
    """Every copy fits the system's path limit where the run will keep it, or nothing is
    stored: a folder nested deep, or a long --results, is exit 2 naming the file."""
    where = results / new_run_id() / "nodes" / node / pf.STEP / "raw" / "poc"
    limit = _path_max(results)
    # the run's own files beside the copies (raw/query_gpu_noheader_2.txt, their temp names)
    if _nbytes(where.parent) + _OWN_FILES > limit:
        raise UsageError(f"--results {shown(str(results))}: too long ({_nbytes(results):,} "
                         f"bytes): the run's files under it would pass the {limit:,} bytes a "
                         "path may have here", hint="give a shorter --results path; nothing "
                                                    "was stored")
    for f in files:
        if f.kept is not None and _nbytes(where / f.name) > limit:
            raise _too_long(str(f.path), results, limit)


def import_poc(folder: Path, provider: str, node_name: str | None, inventory: Path | None,
               results: Path) -> PocResult:
    """Read, recognise, judge and store one PoC folder as one run.

    The folder is read file by file into a staging folder (the copies the run keeps);
    the run is made only once every file is read and every copy fits, and an import cut
    short after that (a full disk, Ctrl-C) takes its run away again: an import is stored
    whole or not at all, and the same command run again does it."""
    inventory_mod.checked_name(provider, "provider")
    if node_name is not None:
        inventory_mod.checked_name(node_name, "node")
    _check_folder(folder)  # before anything is made in the results folder
    made = not os.path.lexists(results)
    stage = _stage(results)
    try:
        return _import(folder, stage, provider, node_name, inventory, results)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        if made:  # refused before a run was made: no empty results folder either
            with contextlib.suppress(OSError):
                results.rmdir()


def _import(folder: Path, stage: Path, provider: str, node_name: str | None,
            inventory: Path | None, results: Path) -> PocResult:
    files = scan(folder, stage)
    split_nodes(files)
    found = hostname(files)
    name = node_name or inventory_node(inventory, provider, found) or (
        found if found and re.match(inventory_mod.NAME_PATTERN, found) else "poc")
    inv, node = target(inventory, provider, name)
    a = assemble(files, name)
    if not [f for f in files if f.status == "judged"]:
        listed = "; ".join(f"{f.name}: {f.status}" + (f" ({f.reason})" if f.reason else "")
                           for f in files[:20])
        raise UsageError(f"nothing in {shown(str(folder))} could be judged: {listed}",
                         hint="save the outputs of the acceptance recipe there (nvidia-smi, "
                              "nvidia-smi -q, topo -m, the nccl-tests logs, ...)")
    _check_lengths(files, results, name)
    groups = _experiments(a.nccl)
    commit = next((f.facts.commit for f in a.recorded.values() if f.kind == "commit"), None)
    checked_at = next((f.facts.iso for f in a.recorded.values() if f.kind == "checked-at"), None)
    run = Run.create(results, command=COMMAND, suite_hash=_series_hash([e for e, _ in groups]),
                     suite={"imported": [e for e, _ in groups]}, inventory_path=inventory,
                     providers=[provider], nodes=[name],
                     source={"kind": "poc", "dir": shown(str(folder.resolve())), "node": name,
                             "hostname": found, "gpu_uuids": folder_uuids(files),
                             "checked_at": checked_at,
                             "window": folder_window(files, checked_at),
                             "nccl_tests_commit": commit,
                             "files": {f.name: f.summary() for f in files}})
    result = PocResult(run, name, files)
    try:
        with run.locked():
            out_dir = run.node_dir(name, pf.STEP)
            kept = out_dir / "raw" / "poc"
            try:
                kept.parent.mkdir(parents=True, exist_ok=True)
                os.rename(stage, kept)  # every copy at once
            except OSError as exc:
                raise _store_failed(exc, kept) from exc
            copies = {}
            for f in files:
                if f.kept is not None:
                    f.kept = kept / f.name
                    f.copy = copies[f.name] = run.rel(f.kept)
            assert run.meta.source is not None
            run.meta.source["files"] = {f.name: f.summary() for f in files}  # with the copies
            run.save_meta()
            atomic_write(out_dir / "collect.json", json.dumps(a.doc, indent=1))
            result.findings += _file_findings(files, copies, node, run.run_id)
            result.findings += judge_preflight(a, node, inv, run, out_dir, Suite())
            result.findings += poc_health.judge(a.health, copies, node, run.run_id)
            fs, ms = judge_nccl(groups, copies, node, inv, run, commit)
            result.findings += fs
            result.measurements = ms
            run.add_findings(result.findings)
            run.add_measurements(ms)
    except BaseException as exc:
        _discard(run)
        if isinstance(exc, StoreError):
            cause = exc.__cause__
            if isinstance(cause, OSError) and cause.errno == errno.ENAMETOOLONG:
                path = os.fsdecode(cause.filename) if cause.filename else str(run.dir)
                raise _too_long(path, None, _path_max(results)) from None
            if _AGAIN not in (exc.hint or ""):
                raise _restated(exc) from exc
        raise
    return result


def _discard(run: Run) -> None:
    """An import cut short leaves no run behind: its folder and its index rows go."""
    shutil.rmtree(run.dir, ignore_errors=True)
    with contextlib.suppress(Exception):
        run.index.delete_run(run.run_id)


def files_table(files: list[PocFile], folder: Path) -> Table:
    """What became of each file, for the terminal (run.json's `source.files` holds the same)."""
    return Table(f"files of {shown(str(folder))}", ("file", "kind", "status", "note"),
                 [(f.name, f.kind or "-", f.status, f.target or f.reason or "") for f in files])
