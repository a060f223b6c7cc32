"""The answer layer (`report`, `export`) writing onto a real full disk (a small tmpfs): exit 2
with one line naming the -o and what to do, and nothing left under the name asked for,
nor a temporary file beside it. And every reading command on a damaged store (an index row
of bad JSON, a lost table, a lost run.json or record file, a bad baseline line): the damage
named, exit 2 at most, never a verdict from missing records.

No cluster: the store is built by hand (tests/unit/comparestore.py), the outputs are
written in-process."""

from __future__ import annotations

import json
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.index import BaselineRecord, add_baselines
from tests.faults.consistency import tmpfs
from tests.unit.clirun import gpuvet
from tests.unit.comparestore import build_store

SIZE_K = 64  # the report (about 200 KB with its inline plots) and the exports do not fit


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("answer") / "results"
    build_store(root, failed_attempt=True)
    return root


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "small", SIZE_K) as disk:
        yield disk


def _runs(capsys: pytest.CaptureFixture[str], results: Path) -> list[str]:
    listed = gpuvet(capsys, "runs", "--results", results, "--json")
    return [row["run"] for row in json.loads(listed.stdout)]


@pytest.mark.parametrize("how", [
    ["report", "-p", "h200", "-p", "beta", "-o", "{disk}/r.html"],
    ["export", "--format", "parquet", "-o", "{disk}/out", "{runs}"],
    ["export", "--format", "csv", "-o", "{disk}/out", "{runs}"],
    ["export", "--format", "json", "-o", "{disk}/out.json", "{runs}"],
], ids=["report", "parquet", "csv", "json"])
def test_an_output_onto_a_full_disk_is_one_line_and_leaves_nothing(
        how: list[str], results: Path, small_disk: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    args: list[str | Path] = []
    for a in how:
        if a == "{runs}":
            args += _runs(capsys, results)
        else:
            args.append(a.format(disk=small_disk))
    proc = gpuvet(capsys, *args, "--results", results)
    assert proc.returncode == 2, proc.output
    named = args[args.index("-o") + 1]
    lines = proc.stderr.strip().splitlines()
    assert lines[0] == f"error: -o {named}: no space left on its filesystem", proc.stderr
    assert "choose another -o" in lines[1]
    assert list(small_disk.iterdir()) == []  # no half file, no temporary one


# --- a damaged store: every reading command names the damage, none exits 3 (issue 34) -----------

def _sql(results: Path, statement: str) -> None:
    with sqlite3.connect(results / "index.sqlite") as db:
        db.execute(statement)


def _damage(results: Path, how: str, ids: dict[str, dict[str, str]],
            capsys: pytest.CaptureFixture[str]) -> None:
    beta_nccl = results / ids["beta"]["nccl"]
    if how.startswith("row:"):
        _sql(results, f"UPDATE {how[4:]} SET json='{{bad' WHERE run_id='{ids['beta']['nccl']}'")
    elif how.startswith("drop:"):
        _sql(results, f"DROP TABLE {how[5:]}")
    elif how == "not-sqlite":
        (results / "index.sqlite").write_bytes(b"not an index, but not empty either\n" * 100)
    else:
        if how == "no-run-json":
            (beta_nccl / "run.json").unlink()
        elif how == "no-findings":
            (beta_nccl / "findings.jsonl").unlink()
        elif how == "empty-measurements":
            (beta_nccl / "measurements.jsonl").write_text("")
        elif how == "bad-baseline-line":
            with (results / "baselines.jsonl").open("a") as fh:
                fh.write("{not a record\n")
        rebuilt = gpuvet(capsys, "index", "rebuild", "--results", results)
        assert rebuilt.returncode == 0, rebuilt.output
        if how != "bad-baseline-line":  # the damaged run is listed, never dropped in silence
            assert f"{ids['beta']['nccl']}: " in rebuilt.stderr
            assert "indexed 7 run(s)" in rebuilt.stdout


DAMAGE = ["row:findings", "row:measurements", "row:runs", "drop:findings", "drop:measurements",
          "drop:runs", "not-sqlite", "no-run-json", "no-findings", "empty-measurements",
          "bad-baseline-line"]
COMMANDS = {
    "runs": ["runs"], "show": ["show", "{beta_nccl}"], "compare": ["compare", "-p", "h200", "-p",
                                                                   "beta"],
    "report": ["report", "-p", "h200", "-p", "beta", "-o", "{out}/r.html"],
    "export": ["export", "--format", "json", "-o", "{out}/x.json", "{beta_nccl}"],
    "regress": ["regress", "-p", "beta"], "baseline": ["baseline", "show"]}


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, str]]]:
    """A store of two providers and a baseline, built once; each test damages a copy."""
    results = tmp_path_factory.mktemp("whole") / "results"
    ids = build_store(results, failed_attempt=True)
    add_baselines(results, [BaselineRecord(
        set_id="s1", provider="h200", gpu_model="H200", gpu_count=2, suite_hash="x",
        scope="single", engine="nccl-tests", metric="busbw", size=1 << 30, span="single", n=3,
        mean=1.0, std=0.1, median=1.0, min=0.9, max=1.1, unit="GB/s", runs=[ids["h200"]["nccl"]],
        set_at="2026-12-01T00:00:00Z", set_by="t", how="last 1")])
    return results, ids


@pytest.mark.parametrize("how", DAMAGE)
def test_a_damaged_store_is_named_never_exit_3(
        how: str, whole: tuple[Path, dict[str, dict[str, str]]], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    results, ids = tmp_path / "results", whole[1]
    shutil.copytree(whole[0], results)
    before = gpuvet(capsys, "compare", "-p", "h200", "-p", "beta", "--results", results)
    _damage(results, how, ids, capsys)
    for name, args in COMMANDS.items():
        argv = [a.format(beta_nccl=ids["beta"]["nccl"], out=tmp_path) for a in args]
        proc = gpuvet(capsys, *argv, "--results", results)
        assert proc.returncode in (0, 1, 2), (name, proc.output)
        assert "Traceback" not in proc.output and "internal error" not in proc.output, name
        if proc.returncode == 2:
            assert "index rebuild" in proc.stderr or "no run" in proc.stderr, (name, proc.output)
        if how.startswith("drop:") or how == "not-sqlite":
            assert proc.returncode == 2 and "gpuvet index rebuild" in proc.stderr, (name, how)
    if how in ("no-findings", "empty-measurements", "no-run-json"):
        listed = gpuvet(capsys, "runs", "--results", results, "--json")
        (row,) = [r for r in json.loads(listed.stdout) if r["run"] == ids["beta"]["nccl"]]
        assert row["verdict"] == "-" and row["status"] in ("damaged",), row  # never PASS
    if how == "bad-baseline-line":
        shown = gpuvet(capsys, "baseline", "show", "--results", results)
        assert shown.returncode == 0 and "h200" in shown.stdout, shown.output
        assert before.returncode == gpuvet(capsys, "compare", "-p", "h200", "-p", "beta",
                                           "--results", results).returncode
