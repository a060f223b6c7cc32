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

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from orchestrator import inventory as inventory_mod
from orchestrator import parsers
from orchestrator.errors import UsageError, shown
from orchestrator.nccltests import BuildDoc
from orchestrator.parsers.gpus import GPU_FACTS
from orchestrator.parsers.nvidia_smi_q import NvidiaSmiQFacts, QGpu
from orchestrator.records import Finding, Measurement, MeasureScope, Severity, finding
from orchestrator.steps.nccl.importer import experiment, experiment_hash
from orchestrator.steps.nccl.judge import Series, judge_series
from orchestrator.steps.poc import health as poc_health
from orchestrator.steps.poc.files import Identity, PocFile, as_json, describe, read_all
from orchestrator.steps.poc.kinds import HEALTH_KIND_NAMES
from orchestrator.steps.poc.origin import folder_uuids, folder_window, inventory_node
from orchestrator.steps.preflight import checks
from orchestrator.steps.preflight import step as pf
from orchestrator.store import Run, atomic_write, write_json
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


# --------------------------------------------------------------------------- the folder

def _natural(name: str) -> list[Any]:
    return [int(p) if p.isdigit() else p.lower() for p in re.split(r"(\d+)", name)]


def scan(folder: Path) -> list[PocFile]:
    """Every file under the folder, read and recognised; links are listed, not followed.

    A directory holding `.git` is a source checkout (people clone nccl-tests into
    the PoC folder and save logs beside its sources): its `.git/` is skipped whole
    and what in it is no command output is skipped, not reported.
    """
    if not folder.is_dir():
        raise UsageError(f"{shown(str(folder))} is not a folder",
                         hint="give the folder the PoC outputs were saved in")
    found: list[tuple[Path, str, str | None]] = []
    checkouts: list[str] = []
    out: list[PocFile] = []
    for top, dirs, names in os.walk(folder):
        base = Path(top)
        rel = base.relative_to(folder).as_posix()
        if ".git" in dirs or ".git" in names:
            checkouts.append(rel)
            if ".git" in dirs:
                dirs.remove(".git")
            else:
                names.remove(".git")
            name = ".git/" if rel == "." else f"{scrub_text(shown(rel))}/.git/"
            out.append(PocFile(name=name, path=base / ".git", status="skipped",
                               reason="the git metadata of a source checkout"))
        for d in list(dirs):
            if (base / d).is_symlink():
                dirs.remove(d)
                names.append(d)
        inside = next((c for c in sorted(checkouts, key=len, reverse=True)
                       if c == "." or rel == c or rel.startswith(c + "/")), None)
        for n in names:
            where = None if inside is None else (folder.name if inside == "." else inside)
            found.append((base / n, (base / n).relative_to(folder).as_posix(),
                          None if where is None else scrub_text(shown(where))))
    if not found and not out:
        raise UsageError(f"{shown(str(folder))} holds no files",
                         hint="give the folder the PoC outputs were saved in")
    found.sort(key=lambda pn: _natural(pn[1]))
    for p, name, checkout in found:
        out += read_all(p, name, checkout)
    return sorted(_unique_names(out), key=lambda f: _natural(f.name))


def _unique_names(files: list[PocFile]) -> list[PocFile]:
    """Names made unique again where scrubbing made two alike (`hf_<one token>.txt` and
    `hf_<another>.txt` are both `***.txt`): the second is `***.txt (2)`."""
    seen: set[str] = set()
    for f in files:
        name, n = f.name, 1
        while name in seen:
            n += 1
            name = f"{f.name} ({n})"
        f.name = name
        seen.add(name)
    return files


def split_nodes(files: list[PocFile]) -> None:
    """Mark files that describe another machine than most of the folder: "other node".

    The file most others agree with comes first; each file in turn joins the node
    unless what it prints contradicts everything the node's files print together
    (a `-i 0` excerpt and a `-i 3` excerpt both join a full listing). Files that
    name no machine (nvcc, dmon, topo) stay with the node.
    """
    named = [f for f in files if f.status == "recognised" and f.ident]

    def support(f: PocFile) -> int:
        return sum(f.ident.relation(g.ident) for g in named if g is not f)

    node = Identity()
    told: dict[str, list[str]] = {}
    for f in sorted(named, key=lambda f: (-support(f), -len(f.ident.uuids), _natural(f.name))):
        attr = node.differs(f.ident)
        if attr is None:
            node.add(f.ident)
            for a, _ in Identity.ORDER:
                if getattr(f.ident, a):
                    told.setdefault(a, []).append(f.name)
            continue
        label = dict(Identity.ORDER)[attr]
        f.status = "other node"
        f.reason = (f"its {label} ({f.ident.shown(attr)}) are not among those the rest of the "
                    f"folder prints ({node.shown(attr)}, in {', '.join(told[attr][:3])})")


def hostname(files: list[PocFile]) -> str | None:
    """The node's hostname as uname, or else single-host nccl-tests logs, print it."""
    for kinds in (("uname",), ("nccl-tests", "nccl-tests-json")):
        hosts = {h for f in files if f.status == "recognised" and f.kind in kinds
                 for h in f.ident.hosts}
        if len(hosts) == 1:
            return hosts.pop()
    return None


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
                         "stdout": f.text or "",  # scrubbed when read (`files.read`)
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

def _copy(run: Run, out_dir: Path, f: PocFile) -> str | None:
    """Keep the file as evidence, scrubbed of secrets like every output gpuvet stores.

    Text is kept byte for byte unless scrubbing changed it; content that is not text
    cannot be scrubbed and is not kept (its sha256 is, in run.json).
    """
    if f.status == "skipped":
        return None  # a source checkout's own file: its digest is recorded, that is enough
    if f.text is None:
        if f.sha256 is None or f.data.strip():
            return None  # never read (a link, too large), or binary
        data = f.data
    else:  # scrubbed when it was read (`files.read`)
        data = f.text.encode() if f.scrubbed else f.data
    dest = out_dir / "raw" / "poc" / f.name
    atomic_write(dest, data, durable=False)
    f.copy = run.rel(dest)
    return f.copy


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
            atomic_write(raw, f.text or "", durable=False)  # scrubbed when read
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


def import_poc(folder: Path, provider: str, node_name: str | None, inventory: Path | None,
               results: Path) -> PocResult:
    """Read, recognise, judge and store one PoC folder as one run."""
    inventory_mod.checked_name(provider, "provider")
    if node_name is not None:
        inventory_mod.checked_name(node_name, "node")
    files = scan(folder)
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
    with run.locked(), run.guard():
        out_dir = run.node_dir(name, pf.STEP)
        copies = {f.name: rel for f in files if (rel := _copy(run, out_dir, f)) is not None}
        assert run.meta.source is not None
        run.meta.source["files"] = {f.name: f.summary() for f in files}  # now with the copies
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
    return result


def files_table(files: list[PocFile], folder: Path) -> Table:
    """What became of each file, for the terminal (run.json's `source.files` holds the same)."""
    return Table(f"files of {shown(str(folder))}", ("file", "kind", "status", "note"),
                 [(f.name, f.kind or "-", f.status, f.target or f.reason or "") for f in files])
