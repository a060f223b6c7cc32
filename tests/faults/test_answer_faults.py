"""The answer layer (`report`, `export`) writing onto a real full disk (a small tmpfs): exit 2
with one line naming the -o and what to do, and nothing left under the name asked for,
nor a temporary file beside it.

No cluster: the store is built by hand (tests/unit/comparestore.py), the outputs are
written in-process."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

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
