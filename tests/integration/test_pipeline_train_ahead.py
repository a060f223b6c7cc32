"""The pipeline's order of work on a local CPU node, as it runs on a GPU host: the
training reference starts when preflight is done and holds before any CUDA call while
health runs (its interpreter, torch and compile imports off the training step's path),
makes its context and process group when health is over, its last gate opens when the
step reaches the node, and the restore is still verified bit for bit. Real processes:
the local executor, train-supervise, the rank program on gloo."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

GPUVET = str(Path(sys.executable).with_name("gpuvet"))
ROOT = Path(__file__).resolve().parents[2]


def test_the_reference_starts_during_health_and_holds_before_cuda(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    inv = tmp_path / "inv.yaml"
    inv.write_text(f"""version: 1
providers:
  lab:
    executor: local
    nodes:
      - {{name: n1, work_dir: {tmp_path / 'w'}, ckpt_dir: {tmp_path / 'ck'},
         python: {sys.executable}, env: {{GPUVET_HEALTH_DEVICE: cpu}}}}
""")  # health's CPU stand-in: a health step that measures, as on a GPU node, not "no GPU"
    suite = tmp_path / "suite.yaml"
    # the CPU protocol, shorter: the order of work is what is tested here
    suite.write_text((ROOT / "suites" / "train-cpu.yaml").read_text()
                     .replace("steps: 12", "steps: 8").replace("ckpt_step: 5", "ckpt_step: 4")
                     .replace("manifest_delay_s: 2.0", "manifest_delay_s: 0.5")
                     + "  throughput_steps: 0\n"
                     + "nccl: {min_bytes: 1K, max_bytes: 4K, rounds: 1}\n")
    results = tmp_path / "r"
    res = subprocess.run([GPUVET, "pipeline", "-i", str(inv), "--suite", str(suite),
                          "--results", str(results), "--json"], capture_output=True, text=True,
                         timeout=400, env={**os.environ, "COLUMNS": "250"})
    doc = json.loads(res.stdout)
    assert doc["steps"] == ["preflight", "health", "nccl", "train", "regress"], res.stderr[-2000:]
    codes = {f["code"] for f in doc["findings"]}
    assert "TRAIN_RESTORE_OK" in codes, sorted(codes)
    run = results / doc["run_id"]
    ref = run / "nodes" / "n1" / "train" / "reference" / "n1"
    sup = json.loads((ref / "supervise.json").read_text())
    health_done = (run / "nodes" / "n1" / "health" / "done.json").stat().st_mtime
    # started before health was over, opened when the training step reached the node
    assert sup["start_time"] < health_done < sup["gate_opened"], sup
    assert sup["rc"] == 0

    def laps(phase: str) -> list[str]:
        rank = run / "nodes" / "n1" / "train" / phase / "n1" / "rank0.jsonl"
        start = next(e for e in map(json.loads, rank.read_text().splitlines())
                     if e["event"] == "start")
        assert start["init_s"]["gate_wait"] > 0, start["init_s"]
        assert sorted(start["init_order"]) == sorted(start["init_s"])
        return list(start["init_order"])

    # the reference: torch imported before its first gate, the CUDA context (here: the
    # device check) and the process group after it (health was over), then held again
    ref_laps = laps("reference")
    assert ref_laps.index("import_torch") < ref_laps.index("gate_cuda_wait") < ref_laps.index(
        "cuda_context") < ref_laps.index("process_group") < ref_laps.index("gate_wait"), ref_laps
    # the kill and the restore, started while the phase before them ran, held at the later
    # gate (after the device and the process group)
    for phase in ("kill", "restore"):
        got = laps(phase)
        assert got.index("process_group") < got.index("gate_wait"), (phase, got)
    # the checkpoints left their place with the step
    assert not list((tmp_path / "ck" / "gpuvet-train").glob(f"{doc['run_id']}/*"))
