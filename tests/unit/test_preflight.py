"""judge_document (evidence, facts, parse errors) and `gpuvet preflight --from`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from collectdoc import H200_ORDER, fixture, h200_doc, h200_text, inventory

from orchestrator.errors import UsageError
from orchestrator.steps.preflight.step import judge_document
from payload.commands import COMMANDS

GPUVET = Path(sys.executable).with_name("gpuvet")


def _judge(doc: dict[str, Any], out: Path | None, expect: dict[str, Any] | None = None) -> Any:
    inv = inventory(H200_ORDER if expect is None else expect)
    rel = (lambda p: str(p.relative_to(out))) if out is not None else None
    return judge_document(doc, inv.node("node-a"), inv, "run-1", out, rel)


def test_evidence_and_facts_written(tmp_path: Path) -> None:
    doc = h200_doc(failed={"ibstat": (127, "ibstat: command not found\n")})
    report = _judge(doc, tmp_path)
    for c in COMMANDS:
        raw = tmp_path / "raw" / f"{c.id}.txt"
        assert raw.is_file(), c.id
        assert raw.read_text() == doc["commands"][c.id]["stdout"]
    assert (tmp_path / "raw" / "topo_m.txt").read_text() == h200_text("topo_m")
    assert (tmp_path / "raw" / "ibstat.stderr.txt").read_text() == "ibstat: command not found\n"
    assert not (tmp_path / "raw" / "topo_m.stderr.txt").exists()
    assert report.facts.evidence["query_gpu"] == "raw/query_gpu.txt"

    facts = json.loads((tmp_path / "facts.json").read_text())
    assert facts["parse_errors"] == {}
    assert {"query_gpu", "topo_m", "torch", "nvidia_smi_q_xml", "nvcc_version"} <= set(
        facts["facts"])
    assert "ibv_devinfo" not in facts["facts"]  # not installed: nothing parsed
    assert [g["name"] for g in facts["facts"]["query_gpu"]["gpus"]] == ["NVIDIA H200"] * 2
    assert facts["facts"]["topo_m"]["matrix"]["GPU0"]["GPU1"] == "NV18"
    assert facts["versions"]["driver"] == "580.159.04"
    assert facts["versions"]["torch"] == "2.11.0+cu130"

    assert report.findings and all(f.run_id == "run-1" and f.node == "node-a"
                                   and f.step == "preflight" for f in report.findings)
    evidence = [e for f in report.findings for e in f.evidence]
    assert "raw/topo_m.txt" in evidence and "raw/torch.txt" in evidence
    for e in evidence:
        assert (tmp_path / e).is_file(), e
    count = next(f for f in report.findings if f.code == "GPU_COUNT")
    assert count.evidence == ["raw/query_gpu.txt", "raw/nvidia_smi_L.txt"]


def test_evidence_paths_are_absolute_without_rel(tmp_path: Path) -> None:
    inv = inventory(H200_ORDER)
    report = judge_document(h200_doc(), inv.node("node-a"), inv, "r", tmp_path)
    ev = next(f for f in report.findings if f.code == "INTERCONNECT").evidence
    assert ev == [str(tmp_path / "raw" / "topo_m.txt")]


def test_stderr_evidence_is_scrubbed(tmp_path: Path) -> None:
    doc = h200_doc(failed={"ibstat": (1, "NCCL_IB_PASSWORD=hunter2\n")})
    _judge(doc, tmp_path)
    assert "hunter2" not in (tmp_path / "raw" / "ibstat.stderr.txt").read_text()


@pytest.mark.parametrize("doc", [
    {"tool": "something-else", "commands": {}},
    {"tool": "gpuvet-payload"},
    {"commands": {}},
])
def test_not_a_collect_document(doc: dict[str, Any], tmp_path: Path) -> None:
    with pytest.raises(UsageError) as ei:
        _judge(doc, tmp_path)
    assert ei.value.exit_code == 2
    assert "not a gpuvet collect document" in ei.value.what
    assert ei.value.node == "node-a"
    assert not (tmp_path / "facts.json").exists()


def test_unparseable_output_is_a_warning_not_a_crash(tmp_path: Path) -> None:
    doc = h200_doc(texts={"topo_m": "topo: something went sideways\n"})
    report = _judge(doc, tmp_path)
    pe = [f for f in report.findings if f.code == "PARSE_ERROR"]
    assert len(pe) == 1 and pe[0].severity == "WARN"
    assert pe[0].message.startswith("output of topo_m not understood: cannot parse topo-m "
                                    "output at raw/topo_m.txt:1")
    assert pe[0].evidence == ["raw/topo_m.txt"]
    # the ordered NVLink is then unverified, not passed
    unknown = [f for f in report.findings if f.code == "TOPOLOGY_UNKNOWN"]
    assert len(unknown) == 1 and unknown[0].severity == "WARN"
    assert not any(f.code == "INTERCONNECT" for f in report.findings)
    # every other check still ran
    assert any(f.code == "GPU_COUNT" and f.severity == "PASS" for f in report.findings)
    facts = json.loads((tmp_path / "facts.json").read_text())
    assert list(facts["parse_errors"]) == ["topo_m"] and "topo_m" not in facts["facts"]


def test_every_parsed_command_survives_garbage() -> None:
    """Garbage in every parsed command: findings, never an exception."""
    from payload.commands import COMMANDS_BY_ID

    garbage = {c: "\x00\x1b[31m<<not the output you expect>>\n{" for c, spec in
               COMMANDS_BY_ID.items() if spec.parser is not None}
    report = _judge(h200_doc(texts=garbage), None)
    codes = {f.code for f in report.findings}
    # nvidia-smi answered: unreadable output is never reported as a missing driver
    assert "PARSE_ERROR" in codes and "NVIDIA_DRIVER_MISSING" not in codes
    assert all(f.severity == "WARN" for f in report.findings if f.code == "PARSE_ERROR")


def test_failed_command_is_not_parsed(tmp_path: Path) -> None:
    doc = h200_doc(failed={"topo_m": (255, "Failed to initialize NVML\n")})
    report = _judge(doc, tmp_path)
    assert "topo_m" not in report.facts.facts and report.facts.parse_errors == {}
    assert any(f.code == "TOPOLOGY_UNKNOWN" for f in report.findings)


# --------------------------------------------------------------------------- the CLI

INVENTORY = """\
version: 1
providers:
  lab:
    executor: local
    expect:
{expect}
    nodes:
      - name: node-a
"""
MATCHING = """\
      gpu_model: H200
      gpus_per_node: 2
      memory_per_gpu_gb: 141
      form_factor: sxm
      interconnect: nvswitch
"""
MISMATCHING = """\
      gpu_model: A100-SXM4-80GB
      gpus_per_node: 8
      memory_per_gpu_gb: 80
"""


def _write(tmp_path: Path, expect: str) -> tuple[Path, Path]:
    inv = tmp_path / "inv.yaml"
    inv.write_text(INVENTORY.format(expect=expect))
    doc = tmp_path / "collect.json"
    doc.write_text(json.dumps(h200_doc()))
    return inv, doc


def gpuvet(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(GPUVET), *map(str, args)], capture_output=True, text=True,
                          timeout=60, env={"PATH": "/usr/bin:/bin", "COLUMNS": "200"})


def _only_run(results: Path) -> Path:
    runs = [p for p in results.iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


def test_cli_from_matching_order(tmp_path: Path) -> None:
    inv, doc = _write(tmp_path, MATCHING)
    res = tmp_path / "results"
    r = gpuvet("preflight", "--from", doc, "-i", inv, "--node", "node-a", "--results", res)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    run = _only_run(res)
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "passed" and meta["command"] == "preflight"
    assert meta["run_id"] == run.name and meta["finished"]
    findings = [json.loads(x) for x in (run / "findings.jsonl").read_text().splitlines()]
    assert {f["code"] for f in findings} >= {"GPU_COUNT", "GPU_MODEL", "INTERCONNECT"}
    assert all(f["severity"] != "FAIL" and f["node"] == "node-a" for f in findings)
    node_dir = run / "nodes" / "node-a" / "preflight"
    assert json.loads((node_dir / "collect.json").read_text())["tool"] == "gpuvet-payload"
    assert (node_dir / "facts.json").is_file()
    for f in findings:
        for e in f["evidence"]:
            assert (run / e).is_file(), e
    assert f"results: {run}" in r.stdout.replace("\n", "")


def test_cli_from_mismatching_order(tmp_path: Path) -> None:
    inv, doc = _write(tmp_path, MISMATCHING)
    res = tmp_path / "results"
    r = gpuvet("preflight", "--from", doc, "-i", inv, "--node", "node-a", "--results", res)
    assert r.returncode == 1, r.stdout + r.stderr
    run = _only_run(res)
    assert json.loads((run / "run.json").read_text())["status"] == "failed"
    findings = [json.loads(x) for x in (run / "findings.jsonl").read_text().splitlines()]
    count = next(f for f in findings if f["code"] == "GPU_COUNT")
    assert (count["severity"], count["message"]) == ("FAIL", "2 GPU(s) found, 8 ordered")
    assert "GPU_COUNT" in r.stdout and "8 ordered" in r.stdout


def test_cli_from_needs_one_node(tmp_path: Path) -> None:
    """A one-node inventory needs no --node; with two nodes, --from must name one and
    nothing is written."""
    inv, doc = _write(tmp_path, MATCHING)
    r = gpuvet("preflight", "--from", doc, "-i", inv, "--results", tmp_path / "one")
    assert r.returncode == 0, r.stderr
    assert (_only_run(tmp_path / "one") / "nodes" / "node-a" / "preflight" /
            "collect.json").is_file()
    inv.write_text(inv.read_text() + "      - name: node-b\n")
    r = gpuvet("preflight", "--from", doc, "-i", inv, "--results", tmp_path / "two")
    assert r.returncode == 2
    assert "--from judges one node's document: give exactly one --node" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "two").exists()


def test_cli_from_not_json(tmp_path: Path) -> None:
    inv, _ = _write(tmp_path, MATCHING)
    bad = tmp_path / "collect.txt"
    bad.write_text(fixture("h200x2/commands/topo-m.txt"))
    r = gpuvet("preflight", "--from", bad, "-i", inv, "--node", "node-a",
               "--results", tmp_path / "results")
    assert r.returncode == 2
    assert f"cannot read {bad}" in r.stderr and "Traceback" not in r.stderr


def test_cli_from_not_a_collect_document(tmp_path: Path) -> None:
    inv, _ = _write(tmp_path, MATCHING)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"hello": "world"}))
    r = gpuvet("preflight", "--from", other, "-i", inv, "--node", "node-a",
               "--results", tmp_path / "results")
    assert r.returncode == 2
    assert "not a gpuvet collect document" in r.stderr
    assert "python3 -m payload collect" in r.stderr  # the hint


def test_payload_archive_collected_by_hand_then_judged(tmp_path: Path) -> None:
    """The path for nodes the controller cannot reach: archive, collect there, judge here."""
    import tarfile

    archive = tmp_path / "payload.tar.gz"
    res = subprocess.run([str(GPUVET), "payload", str(archive)], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    node_dir = tmp_path / "node"
    with tarfile.open(archive) as tar:
        tar.extractall(node_dir)
    doc_path = tmp_path / "collected.json"
    res = subprocess.run([sys.executable, "-m", "payload", "collect", "--out", str(doc_path),
                          "--node", "far-away", "--work-dir", str(node_dir)], cwd=node_dir,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    inv = tmp_path / "inv.yaml"
    inv.write_text("providers:\n  p:\n    executor: local\n    nodes:\n      - name: far-away\n")
    res = subprocess.run([str(GPUVET), "preflight", "--from", str(doc_path), "-i", str(inv),
                          "--node", "far-away", "--results", str(tmp_path / "r")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode in (0, 1), res.stderr  # 1 where this machine has no NVIDIA driver
    (run,) = [p for p in (tmp_path / "r").iterdir() if p.is_dir()]
    assert (run / "nodes" / "far-away" / "preflight" / "raw" / "uname.txt").read_text()


def test_failure_evidence_points_at_the_file_that_says_so(tmp_path: Path) -> None:
    """A FAIL's evidence is the stderr that explains it, never an empty stdout."""
    msg = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n"
    smi = ("query_gpu", "nvidia_smi_L", "nvidia_smi_q_xml", "nvidia_smi")
    doc = h200_doc(failed={cid: (9, msg) for cid in smi})
    for cid in smi:
        doc["commands"][cid]["stdout"] = ""
    report = _judge(doc, tmp_path)
    missing = next(f for f in report.findings if f.code == "NVIDIA_DRIVER_MISSING")
    assert missing.evidence == ["raw/query_gpu.stderr.txt"]
    assert "couldn't communicate" in (tmp_path / missing.evidence[0]).read_text()
    # a command that was not there at all: the document that records it is the evidence
    gone = h200_doc(missing=list(smi))
    out = tmp_path / "gone"
    report = _judge(gone, out)
    missing = next(f for f in report.findings if f.code == "NVIDIA_DRIVER_MISSING")
    assert missing.evidence == ["collect.json"]


def test_unusable_checkpoint_dir_points_at_dfs_stderr(tmp_path: Path) -> None:
    doc = h200_doc(failed={"df": (1, "df: /ckpt: No such file or directory\n")})
    doc["paths"]["ckpt_dir"]["exists"] = False
    report = _judge(doc, tmp_path)
    f = next(f for f in report.findings if f.code == "CKPT_DIR_UNUSABLE")
    assert f.evidence == ["raw/df.stderr.txt"]


def test_a_live_run_judges_each_node_then_the_drift_between_them(tmp_path: Path) -> None:
    import copy
    import re

    from orchestrator.steps.preflight.step import run_preflight
    from orchestrator.store import Run
    from orchestrator.suite import Suite
    from orchestrator.testing import Reply, Script, scripted_pool

    inv = inventory(H200_ORDER, nodes=("node-a", "node-b", "node-c"))
    docs = {n: h200_doc() for n in ("node-a", "node-b", "node-c")}
    for n, d in docs.items():
        d["node"] = n
    newer = copy.deepcopy(docs["node-c"]["commands"]["torch"])
    newer["stdout"] = newer["stdout"].replace('"2.11.0+cu130"', '"2.12.0+cu130"')
    docs["node-c"]["commands"]["torch"] = newer

    def reply(call: Any) -> Reply:
        name = re.search(r"--node (\S+)", call.command)
        assert name is not None
        return Reply(stdout=json.dumps(docs[name.group(1)]))

    pool = scripted_pool(default=Script().on(lambda c: "-m payload collect" in c, reply=reply))
    run = Run.create(tmp_path, command="preflight", suite_hash="h", suite={}, inventory_path=None)
    driven = run_preflight(inv, inv.nodes, run, Suite(), pool=pool)  # type: ignore[arg-type]
    pool.check()
    assert sorted(driven.done) == ["node:node-a", "node:node-b", "node:node-c"]
    drift = [f for f in run.findings() if f.code == "VERSION_DRIFT"]
    assert [(f.scope, f.details["component"]) for f in drift] == [("provider", "torch")]
    assert drift[0].details["versions"] == {"node-a": "2.11.0+cu130", "node-b": "2.11.0+cu130",
                                            "node-c": "2.12.0+cu130"}
    assert "nodes/node-c/preflight/raw/torch.txt" in drift[0].evidence
