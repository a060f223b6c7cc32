"""A results store of two providers built from tests/fixtures/compare through the
real judging code: preflight judges the collect documents, the nccl judge reads the
nccl-tests logs, the training records are the step's own (see the fixture README).

Each provider gets a preflight, an nccl and a train run with fixed timestamps, so
cost arithmetic can be checked by hand; `failed_attempt` adds an interrupted nccl
run of beta before its good one (a rerun the PoC paid for).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from orchestrator import inventory as inv_mod
from orchestrator.nccltests import BuildDoc
from orchestrator.records import Finding, Measurement, finding
from orchestrator.steps.nccl.judge import Series, judge_series
from orchestrator.steps.preflight.checks import provider_results
from orchestrator.steps.preflight.step import judge_document
from orchestrator.store import Run, write_json
from orchestrator.suite import Suite
from orchestrator.verdicts import run_status

FIX = Path(__file__).resolve().parents[1] / "fixtures"
COMPARE = FIX / "compare"
INVENTORY = COMPARE / "inventory.yaml"
SOURCES = {
    "h200": {"node": "h200-host", "collect": FIX / "h200x2-gpuvet" / "collect_h200-host.json",
             "build": FIX / "h200x2-gpuvet" / "build_h200-host.json",
             "logs": [FIX / "h200x2-gpuvet" / f"single_4G_g2_round{r}.log" for r in (1, 2, 3)]},
    "beta": {"node": "beta-1", "collect": COMPARE / "beta" / "collect_beta-1.json",
             "build": COMPARE / "beta" / "build_beta-1.json",
             "logs": [COMPARE / "beta" / f"single_4G_g2_round{r}.log" for r in (1, 2, 3)]},
}
# (started, finished) of each run, by provider and command
TIMES = {
    "h200": {"preflight": ("2026-11-30T05:42:00Z", "2026-11-30T05:43:00Z"),
             "nccl": ("2026-11-30T05:44:00Z", "2026-11-30T06:14:00Z"),
             "train": ("2026-11-30T06:20:00Z", "2026-11-30T06:50:00Z")},
    "beta": {"preflight": ("2026-11-30T07:00:00Z", "2026-11-30T07:01:00Z"),
             "nccl": ("2026-11-30T07:10:00Z", "2026-11-30T07:40:00Z"),
             "train": ("2026-11-30T07:45:00Z", "2026-11-30T08:15:00Z")},
}
FAILED_ATTEMPT = ("2026-11-30T07:02:00Z", "2026-11-30T07:08:00Z")


def _run(root: Path, command: str, suite: Suite, provider: str, node: str,
         inventory: Path) -> Run:
    return Run.create(root, command=command, suite_hash=suite.hash,
                      suite=suite.model_dump(mode="json"), inventory_path=inventory,
                      providers=[provider], nodes=[node])


def _close(run: Run, times: tuple[str, str], status: str | None = None) -> None:
    run.meta.started, run.meta.finished = times
    run.meta.status = status or run_status(run.findings())  # type: ignore[assignment]
    run.save_meta()


def preflight(root: Path, provider: str, suite: Suite, inventory: Path = INVENTORY) -> Run:
    inv = inv_mod.load(inventory)
    src = SOURCES[provider]
    node = inv.node(str(src["node"]))
    run = _run(root, "preflight", suite, provider, node.name, inventory)
    out = run.node_dir(node.name, "preflight")
    doc = json.loads(Path(src["collect"]).read_text())  # type: ignore[arg-type]
    shutil.copy(src["collect"], out / "collect.json")  # type: ignore[arg-type]
    report = judge_document(doc, node, inv, run.run_id, out, run.rel, suite)
    cross = [finding(run.run_id, "preflight", provider=provider, node=None, code=r.code,
                     severity=r.severity, message=r.message, evidence=r.evidence)
             for r in provider_results([report.facts])]
    run.add_findings(report.findings + cross)
    run.mark_done(f"node:{node.name}", "preflight", {"findings": len(report.findings)})
    return run


def nccl(root: Path, provider: str, suite: Suite, inventory: Path = INVENTORY,
         rounds: int = 3) -> Run:
    inv = inv_mod.load(inventory)
    src = SOURCES[provider]
    node = inv.node(str(src["node"]))
    run = _run(root, "nccl", suite, provider, node.name, inventory)
    out = run.node_dir(node.name, "nccl")
    build = json.loads(Path(src["build"]).read_text())  # type: ignore[arg-type]
    write_json(out / "build.json", build)
    logs = []
    for r, path in enumerate(src["logs"][:rounds], 1):  # type: ignore[index]
        dest = out / f"single_round{r}.log"
        shutil.copy(path, dest)
        logs.append((r, dest, False))
    fs = [finding(run.run_id, "nccl", provider=provider, node=node.name,
                  code="NCCL_TESTS_BUILT", severity="PASS",
                  message=f"nccl-tests {build['built_commit'][:12]}, CUDA "
                          f"{build.get('cuda_version')}, NCCL {build['nccl']['version']}",
                  evidence=[run.rel(out / "build.json")], build=build)]
    judged, ms = judge_series(Series("single", [node], logs, BuildDoc.model_validate(build)),
                              run, inv, suite)
    run.add_findings(fs + judged)
    run.add_measurements(ms)
    run.mark_done(f"node:{node.name}", "nccl", {"build": build})
    return run


def train(root: Path, provider: str, suite: Suite, inventory: Path = INVENTORY) -> Run:
    inv = inv_mod.load(inventory)
    node = inv.node(str(SOURCES[provider]["node"]))
    run = _run(root, "train", suite, provider, node.name, inventory)
    src = COMPARE / "train" / provider
    base = run.node_dir(node.name, "train")
    for phase in ("reference", "restore"):
        shutil.copytree(src / phase, base / phase / node.name)
    # the step's probe of the checkpoint directory, as recorded (ext4, not ephemeral)
    write_json(base / "probe.json", {"ckpt_dir": node.ckpt_dir, "path": {
        "path": node.ckpt_dir, "exists": True, "writable": True,
        "mount": {"source": "/dev/vda", "mount_point": "/", "fstype": "ext4"}}})
    records: dict[str, Any] = json.loads((src / "records.json").read_text())

    def rel(p: str) -> str:
        phase, name = p.split("/", 1)
        return run.rel(base / phase / node.name / name)

    fs: list[Finding] = [finding(run.run_id, "train", provider=provider, node=node.name,
                                 code=f["code"], severity=f["severity"], message=f["message"],
                                 evidence=[rel(e) for e in f["evidence"]])
                         for f in records["findings"]]
    ms = [Measurement(run_id=run.run_id, provider=provider, nodes=[node.name], step="train",
                      metric=m["metric"], value=m["value"], unit=m["unit"],
                      suite_hash=suite.hash, scope="train", engine="train", tags=m["tags"])
          for m in records["measurements"]]
    run.add_findings(fs)
    run.add_measurements(ms)
    return run


def build_store(root: Path, *, suite: Suite | None = None, failed_attempt: bool = False,
                providers: tuple[str, ...] = ("h200", "beta"),
                inventory: Path = INVENTORY) -> dict[str, dict[str, str]]:
    """Write the runs; returns run ids by provider and command."""
    suite = suite or Suite()
    ids: dict[str, dict[str, str]] = {}
    for p in providers:
        ids[p] = {}
        run = preflight(root, p, suite, inventory)
        _close(run, TIMES[p]["preflight"])
        ids[p]["preflight"] = run.run_id
        if failed_attempt and p == "beta":
            bad = nccl(root, p, suite, inventory, rounds=1)
            _close(bad, FAILED_ATTEMPT, "interrupted")
            ids[p]["failed"] = bad.run_id
        run = nccl(root, p, suite, inventory)
        _close(run, TIMES[p]["nccl"])
        ids[p]["nccl"] = run.run_id
        run = train(root, p, suite, inventory)
        _close(run, TIMES[p]["train"])
        ids[p]["train"] = run.run_id
    return ids
