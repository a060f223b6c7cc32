"""What every fault scenario asserts afterwards: nothing completed is lost, all agrees."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def tmpfs(path: Path, kib: int) -> Iterator[Path]:
    """A disk that really fills up: a tmpfs of `kib` KiB mounted at `path` (made if
    missing), unmounted afterwards."""
    path.mkdir(exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", str(path)],
                             capture_output=True, text=True)
    assert mounted.returncode == 0, mounted.stderr
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)])


def only_run(results: Path) -> Path:
    runs = [p for p in results.iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


def jsonl(path: Path) -> list[dict[str, object]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def assert_consistent(results: Path, run_dir: Path, nodes: list[str], step: str) -> None:
    """The index is intact and holds exactly what the JSONL files hold; every node of the
    step has an outcome: done, or a FAIL finding that says why."""
    with sqlite3.connect(results / "index.sqlite") as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        idx_f = [r[0] for r in db.execute("SELECT json FROM findings WHERE run_id=?",
                                          (run_dir.name,))]
        idx_m = [r[0] for r in db.execute("SELECT json FROM measurements WHERE run_id=?",
                                          (run_dir.name,))]
        status = db.execute("SELECT status FROM runs WHERE run_id=?",
                            (run_dir.name,)).fetchone()[0]
    findings = jsonl(run_dir / "findings.jsonl")
    measurements = jsonl(run_dir / "measurements.jsonl")
    canon = lambda rows: Counter(json.dumps(r, sort_keys=True) for r in rows)  # noqa: E731
    assert canon(findings) == canon(json.loads(x) for x in idx_f)
    assert canon(measurements) == canon(json.loads(x) for x in idx_m)
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["status"] == status != "running"
    for node in nodes:
        done = (run_dir / "nodes" / node / step / "done.json").is_file()
        failed = [f for f in findings if f.get("node") == node and f["severity"] == "FAIL"
                  and f["step"] == step]
        assert done or failed, f"{node}: no outcome recorded"
