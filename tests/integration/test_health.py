"""`gpuvet health` end to end on real parts: two local nodes run the payload's health
entry point with torch on CPU at small sizes (GPUVET_HEALTH_DEVICE=cpu in their env),
one sshd node in a network namespace has no GPU at all. The node without a GPU says
so (INFO) and skips; the other nodes are measured and judged, their progress shown
per node and phase, their folders brought back into the run; a resume of the
finished run contacts no node again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from cluster import Cluster
from ruamel.yaml import YAML

GPUVET = str(Path(sys.executable).with_name("gpuvet"))
SUITE = """name: health-cpu
health:
  level: standard
  sustain_s: 0.5
  memtest_s: 0.3
  timeout_s: 120
"""


def gpuvet(*args: str | Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([GPUVET, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "COLUMNS": "250"})


def _inventory(cluster: Cluster, tmp_path: Path) -> Path:
    path = cluster.write_inventory(tmp_path / "inv.yaml", nodes=["node3"])
    yaml = YAML(typ="safe")
    doc = yaml.load(path.read_text())
    doc["providers"]["bench"] = {
        "executor": "local", "expect": {"gpu_model": "H200"},
        "nodes": [{"name": f"cpu-{k}", "work_dir": str(tmp_path / k / "work"),
                   "python": sys.executable, "env": {"GPUVET_HEALTH_DEVICE": "cpu",
                                                     "OMP_NUM_THREADS": "1"}}
                  for k in ("a", "b")]}
    with path.open("w") as f:
        yaml.dump(doc, f)
    return path


def test_health_on_cpu_nodes_and_a_node_without_a_gpu(cluster: Cluster, tmp_path: Path) -> None:
    inv = _inventory(cluster, tmp_path)
    suite = tmp_path / "suite.yaml"
    suite.write_text(SUITE)
    results = tmp_path / "results"
    res = gpuvet("health", "-i", inv, "--suite", suite, "--results", results, "--json")
    assert res.returncode == 0, (res.stdout[-3000:], res.stderr[-3000:])
    doc = json.loads(res.stdout)
    by_node: dict[str, list[tuple[str, str]]] = {}
    for f in doc["findings"]:
        by_node.setdefault(f["node"], []).append((f["code"], f["severity"]))
    assert by_node["node3"] == [("HEALTH_NO_GPU", "INFO")]
    # the node without a GPU had nothing to measure: not measured, never PASS with 0 checks
    assert doc["verdicts"] == {"cpu-a": "PASS", "cpu-b": "PASS", "node3": "NOT MEASURED"}, \
        doc["verdicts"]
    for k in ("a", "b"):
        assert ("GPU_SDC", "PASS") in by_node[f"cpu-{k}"]
        assert ("GPU_MEMTEST", "PASS") in by_node[f"cpu-{k}"]
        folder = Path(doc["results"]) / "nodes" / f"cpu-{k}" / "health"
        node_doc = json.loads((folder / "health.json").read_text())
        assert node_doc["status"] == "ok" and node_doc["device"] == "cpu"
        assert (folder / "gpucpu0.jsonl").is_file()
        assert (folder / "counters" / "after" / "index.json").is_file()
    no_gpu = json.loads((Path(doc["results"]) / "nodes" / "node3" / "health" /
                         "health.json").read_text())
    assert no_gpu["status"] == "no-gpu" and "nvidia-smi not found" in no_gpu["reason"]
    # the measurements are series, per GPU
    rows = [json.loads(line) for line in (Path(doc["results"]) / "measurements.jsonl")
            .read_text().splitlines()]
    copy = [r for r in rows if r["metric"] == "health.membw.copy_gbps"]
    assert sorted(r["nodes"][0] for r in copy) == ["cpu-a", "cpu-b"]
    assert {r["tags"]["gpu"] for r in copy} == {"cpu0"} and copy[0]["scope"] == "health"
    # progress per node and phase
    lines = res.stderr.splitlines()
    assert "  node:cpu-a: GPU cpu0 sustained" in lines, lines
    assert "  node:node3: done" in lines, lines
    # nothing left on the nodes; a resume of the finished run runs nothing again
    assert not list((tmp_path / "a" / "work").glob("health-runs/*"))
    again = gpuvet("health", "-i", inv, "--suite", suite, "--results", results, "--json",
                   "--resume", doc["run_id"])
    assert again.returncode == 0, again.stderr[-3000:]
    assert "GPU cpu0" not in again.stderr
    assert sorted(f["code"] for f in json.loads(again.stdout)["findings"]) == sorted(
        f["code"] for f in doc["findings"])
