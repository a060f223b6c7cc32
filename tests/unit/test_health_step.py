"""The health step on a scripted node: the payload's command, the folder brought back
(a hostile file list kept out), the unit judged and recorded, progress per phase, a
node that wrote no document, and resume keeping a finished unit."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from orchestrator import inventory
from orchestrator.records import node_unit_key
from orchestrator.steps.driver import StageTracker
from orchestrator.steps.health import step
from orchestrator.store import Run
from orchestrator.suite import HealthParams, Suite
from orchestrator.testing import Script, scripted_pool
from tests.unit.clirun import gpuvet
from tests.unit.healthnode import write_node

SUITE = Suite(health=HealthParams(level="quick"))
INV = """version: 1
providers:
  p:
    executor: ssh
    expect: {gpu_model: H200}
    nodes:
      - {name: n1, host: n1.example, work_dir: /w/n1}
"""


def _setup(tmp_path: Path) -> tuple[inventory.Inventory, Run]:
    p = tmp_path / "inv.yaml"
    p.write_text(INV)
    inv = inventory.load(p)
    run = Run.create(tmp_path / "results", command="health", suite_hash=SUITE.hash,
                     suite=SUITE.model_dump(mode="json"), inventory_path=p,
                     providers=["p"], nodes=["n1"])
    return inv, run


def _node_files(tmp_path: Path, run: Run, extra: list[str] | None = None) -> dict[str, bytes]:
    folder = write_node(tmp_path / "node")
    doc = json.loads((folder / "health.json").read_text())
    names = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    doc["files"] = names + (extra or [])
    (folder / "health.json").write_text(json.dumps(doc))
    remote = f"/w/n1/health-runs/{run.run_id}"
    return {f"{remote}/{n}": (folder / n).read_bytes() for n in names}


def test_the_unit_runs_fetches_and_records(tmp_path: Path) -> None:
    inv, run = _setup(tmp_path)
    files = _node_files(tmp_path, run, extra=["../../etc/passwd", "/etc/shadow", "a/../../b"])
    events = "\n".join(json.dumps(e) for e in [
        {"event": "start", "phase": "memcopy", "gpu": "0"},
        {"event": "done", "phase": "memcopy", "gpu": "0"}]) + "\n"
    script = (Script().on(re.compile(r"^rm -rf "), rc=0)
              .on(re.compile(r"-m payload health --out /w/n1/health-runs/\S+ --level quick"),
                  stdout=events))
    with scripted_pool({"n1": script}, files={"n1": files}) as pool:
        driven = step.run_health(inv, inv.nodes, run, SUITE, pool=pool)
        ex = pool(inv.nodes[0])
        assert not any("passwd" in g or "shadow" in g or g.endswith("/b") for g in ex.gets)
        assert [c for c in ex.commands if c.startswith("rm -rf")] == [
            f"rm -rf /w/n1/health-runs/{run.run_id}"] * 2  # before, and after judging
    assert node_unit_key("n1") in driven.done
    codes = {(f.code, f.severity) for f in run.findings()}
    assert ("HEALTH_MEMBW", "PASS") in codes and ("GPU_SDC", "PASS") in codes
    assert {m.metric for m in run.measurements()} >= {"health.membw.copy_gbps",
                                                       "health.matmul.bf16_tflops"}
    assert (run.node_dir("n1", "health") / "gpu0.jsonl").is_file()
    # resumed: the finished unit is kept, the node not contacted
    with scripted_pool({"n1": Script()}) as pool:
        again = step.run_health(inv, inv.nodes, run, SUITE, pool=pool)
        assert pool(inv.nodes[0]).commands == []
    assert again.skipped == [node_unit_key("n1")]


def test_a_node_that_wrote_no_document_is_a_failed_unit(tmp_path: Path) -> None:
    inv, run = _setup(tmp_path)
    script = (Script().on(re.compile(r"^rm -rf "), rc=0)
              .on(re.compile(r"-m payload health"), rc=1, stderr="Traceback: boom"))
    with scripted_pool({"n1": script}) as pool:
        driven = step.run_health(inv, inv.nodes, run, SUITE, pool=pool)
    f = driven.failed[node_unit_key("n1")]
    assert f.code == "HEALTH_FAILED" and f.severity == "FAIL" and f.stage == "execute"
    assert not run.is_done(node_unit_key("n1"), "health")


def test_progress_names_the_gpu_and_the_phase() -> None:
    assert step.describe({"event": "start", "phase": "sustained", "gpu": "0"}) == \
        "GPU 0 sustained"
    assert step.describe({"event": "done", "phase": "peer"}) == "links peer done"
    assert step.describe({"event": "skip", "phase": "dcgmi"}) == "dcgmi skip"
    assert step.describe({"event": "progress", "phase": "sustained", "gpu": "0"}) is None
    notes: list[str] = []
    StageTracker(notes.append).note("x")
    assert notes == ["x"]


def test_an_order_that_needs_fp8_fails_an_a100_before_anything_runs(tmp_path: Path) -> None:
    p = tmp_path / "inv.yaml"
    p.write_text(INV.replace("{gpu_model: H200}", "{gpu_model: A100, needs_fp8: true}"))
    inv = inventory.load(p)
    run = Run.create(tmp_path / "results", command="health", suite_hash=SUITE.hash,
                     suite=SUITE.model_dump(mode="json"), inventory_path=p)
    script = Script().on(step.FP8_QUERY, stdout="0, NVIDIA A100-SXM4-80GB, 8.0\n"
                                                "1, NVIDIA A100-SXM4-80GB, 8.0\n")
    with scripted_pool({"n1": script}) as pool:
        step.run_health(inv, inv.nodes, run, SUITE, pool=pool)
        assert pool(inv.nodes[0]).commands == [step.FP8_QUERY]  # nothing else ran
    got = [(f.code, f.severity) for f in run.findings()]
    assert got == [("GPU_NO_FP8", "FAIL"), ("GPU_NO_FP8", "FAIL"), ("HEALTH_NOT_RUN", "INFO")]
    assert run.is_done(node_unit_key("n1"), "health")
    # an H100 has FP8: the run goes on
    run2 = Run.create(tmp_path / "results", command="health", suite_hash=SUITE.hash,
                      suite=SUITE.model_dump(mode="json"), inventory_path=p)
    script = (Script().on(step.FP8_QUERY, stdout="0, NVIDIA H100 80GB HBM3, 9.0\n")
              .on(re.compile(r"^rm -rf "), rc=0)
              .on(re.compile(r"-m payload health"), rc=1, stderr="boom"))
    with scripted_pool({"n1": script}) as pool:
        driven = step.run_health(inv, inv.nodes, run2, SUITE, pool=pool)
    assert node_unit_key("n1") in driven.failed  # it ran (and failed): no FP8 finding
    assert "GPU_NO_FP8" not in [f.code for f in run2.findings()]


def test_a_node_without_a_gpu_says_so_in_the_default_output(tmp_path: Path, capsys) -> None:
    """`gpuvet health` on the demo's local nodes of a machine without GPUs: the default
    findings table (no -v) says there was nothing to measure, rather than an empty table
    under a PASS."""
    if shutil.which("nvidia-smi"):
        pytest.skip("this machine has nvidia-smi: its local nodes have GPUs to measure")
    inv = tmp_path / "local.yaml"
    inv.write_text((Path(__file__).parents[2] / "inventories" / "local.yaml").read_text()
                   .replace("/tmp/gpuvet-local", str(tmp_path / "nodes")))
    r = gpuvet(capsys, "health", "-i", inv, "--results", tmp_path / "results")
    assert r.returncode == 0, r.output
    assert r.stdout.count("HEALTH_NO_GPU") == 2, r.stdout
