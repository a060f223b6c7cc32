"""Imports on a real full disk (a small tmpfs): a cut-short import is never recorded as done.

No cluster: an import touches only the controller's results disk.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.consistency import jsonl, only_run, tmpfs

GPUVET = Path(sys.executable).with_name("gpuvet")
FIX = Path(__file__).resolve().parents[1] / "fixtures"
ROUNDS = [FIX / "h200x2" / "nccl-tests" / f"all_reduce_8B-128M_g2_round{r}.log" for r in (1, 2, 3)]
SIZE_K = 8192
# Free space left for the import: run.json, the copies, the findings and the index fit;
# the 450 measurements (~186 KB) do not (about 300 of them reach the disk).
FREE_K = 200


def gpuvet(*args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "250", "NO_COLOR": "1"}
    return subprocess.run([str(GPUVET), *map(str, args)], capture_output=True, text=True,
                          timeout=120, env=env)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "small", SIZE_K) as disk:
        yield disk


def test_import_onto_a_full_disk_is_completed_by_the_same_import(small_disk: Path) -> None:
    results = small_disk
    filler = results / "filler"
    filler.write_bytes(b"\0" * ((SIZE_K - FREE_K) << 10))
    cut = gpuvet("import", "nccl-tests", *ROUNDS, "-p", "lab", "--results", results)
    assert cut.returncode == 3, cut.stdout + cut.stderr
    assert "results disk is full" in cut.stderr
    run = only_run(results)
    # a torn last line at most (the reader skips it, the next append cuts it off)
    whole = (run / "measurements.jsonl").read_bytes().split(b"\n")[:-1]
    assert 0 < len(whole) < 450
    assert all(json.loads(line) for line in whole)
    assert not (run / "providers" / "lab" / "imported" / "done.json").exists()
    listed = gpuvet("runs", "--results", results, "--json")
    (row,) = json.loads(listed.stdout)
    assert row["status"] != "passed" and row["verdict"] == "-", row  # never PASS

    filler.unlink()  # space is free again: the same import finishes the run
    again = gpuvet("import", "nccl-tests", *ROUNDS, "-p", "lab", "--results", results)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "450 measurements" in again.stdout
    assert only_run(results) == run
    assert len(jsonl(run / "measurements.jsonl")) == 450
    assert json.loads((run / "run.json").read_text())["status"] == "passed"
    with sqlite3.connect(results / "index.sqlite") as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        n = db.execute("SELECT count(*) FROM measurements WHERE run_id=?",
                       (run.name,)).fetchone()[0]
        status = db.execute("SELECT status FROM runs WHERE run_id=?", (run.name,)).fetchone()[0]
    assert n == 450 and status == "passed"
    listed = gpuvet("runs", "--results", results, "--json")
    (row,) = json.loads(listed.stdout)
    assert row["status"] == "passed" and row["verdict"] != "-"
    third = gpuvet("import", "nccl-tests", *ROUNDS, "-p", "lab", "--results", results)
    assert third.returncode == 0 and "already imported" in third.stdout
