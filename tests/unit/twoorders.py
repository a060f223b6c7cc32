"""The two-orders fixture (tests/fixtures/h100x1-two-orders): two whole pipelines on one
H100 host, provider h100 ordered an H100, provider h200 ordered an H200 and was given the
same H100. Copied into a results folder and indexed, as a user would after copying runs."""

from __future__ import annotations

import shutil
import stat
from pathlib import Path

from orchestrator.rebuild import rebuild_index

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "h100x1-two-orders"
RUNS = ("20261206-034503-cf89", "20261206-034827-e3ef")


def two_orders_store(root: Path) -> Path:
    """The two runs under `root` (a new results folder), indexed; returns root."""
    root.mkdir(parents=True)
    for run in RUNS:
        shutil.copytree(FIXTURE / run, root / run)
    for path in root.rglob("*"):  # a read-only checkout's modes are not the store's
        path.chmod(path.stat().st_mode | stat.S_IWUSR)
    rebuild_index(root)
    return root
