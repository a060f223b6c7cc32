"""`gpuvet import nccl-tests`: manual runs into the results store, judged like live ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
ROUNDS = [FIXTURES / "h200x2" / "nccl-tests" / f"all_reduce_8B-128M_g2_round{r}.log"
          for r in (1, 2, 3)]
CRASH = FIXTURES / "nccl-tests" / "all_reduce_2node-h100_crash-truncated.log"
GPUVET = Path(sys.executable).with_name("gpuvet")


def gpuvet(*args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "250", "NO_COLOR": "1", "TERM": "dumb"}
    return subprocess.run([str(GPUVET), *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=60)


def the_run(results: Path) -> Path:
    runs = [d for d in results.iterdir() if d.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


def test_import_three_rounds(tmp_path: Path) -> None:
    results = tmp_path / "results"
    proc = gpuvet("import", "nccl-tests", *ROUNDS, "-p", "lab", "--results", results)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "busbw at 128 MiB: median 285.3 GB/s over 3 round(s)" in proc.stdout
    assert "450 measurements" in proc.stdout
    run_dir = the_run(results)
    lines = (run_dir / "measurements.jsonl").read_text().splitlines()
    assert len(lines) == 450
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["status"] == "passed"
    assert meta["command"] == "import nccl-tests"
    first = json.loads(lines[0])
    assert first["provider"] == "lab" and first["suite_hash"] == meta["suite_hash"]
    assert {json.loads(ln)["round"] for ln in lines} == {1, 2, 3}
    # the logs are copied into the run, as evidence
    copies = sorted(p.name for p in (run_dir / "providers" / "lab" / "imported").iterdir())
    assert copies == [f"round{i}_{p.name}" for i, p in enumerate(ROUNDS, 1)]
    findings = [json.loads(ln) for ln in (run_dir / "findings.jsonl").read_text().splitlines()]
    assert {f["code"] for f in findings} >= {"NCCL_BUSBW", "NCCL_REFERENCE"}
    assert all(f["node"] == "provider:lab" for f in findings)
    assert not [f for f in findings if f["severity"] == "FAIL"]


def test_import_crash_exits_1(tmp_path: Path) -> None:
    results = tmp_path / "results"
    proc = gpuvet("import", "nccl-tests", CRASH, "-p", "lab", "--results", results)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "NCCL_TRUNCATED" in proc.stdout
    meta = json.loads((the_run(results) / "run.json").read_text())
    assert meta["status"] == "failed"


def test_import_missing_file_exits_2(tmp_path: Path) -> None:
    results = tmp_path / "results"
    missing = tmp_path / "nope.log"
    proc = gpuvet("import", "nccl-tests", ROUNDS[0], missing, "-p", "lab", "--results", results)
    assert proc.returncode == 2
    assert "no such file" in proc.stdout + proc.stderr
    assert str(missing) in proc.stdout + proc.stderr
    assert not results.exists() or not [d for d in results.iterdir() if d.is_dir()]
