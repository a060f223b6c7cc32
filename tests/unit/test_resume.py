"""--resume finishes the run it names, with the run's own inventory and suite, alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator import inventory
from orchestrator.cli._steps import open_run
from orchestrator.errors import UsageError
from orchestrator.store import Run
from orchestrator.suite import NcclParams, Suite

INV = "version: 1\nproviders:\n  p:\n    executor: local\n    nodes:\n      - {name: a}\n"


def started(tmp_path: Path) -> tuple[Path, Path, str]:
    inv = tmp_path / "inv.yaml"
    inv.write_text(INV)
    nodes = inventory.load(inv).nodes
    root = tmp_path / "results"
    with pytest.raises(KeyboardInterrupt), open_run(root, "preflight", Suite(), inv, nodes) as run:
        raise KeyboardInterrupt
    return root, inv, run.run_id


def test_resume_reopens_the_interrupted_run(tmp_path: Path) -> None:
    root, inv, run_id = started(tmp_path)
    assert Run.open(root, run_id).meta.status == "interrupted"
    with open_run(root, "preflight", Suite(), inv, [], resume=run_id) as run:
        assert run.run_id == run_id and run.meta.status == "running"
        run.finish("passed")
    assert Run.open(root, run_id).meta.status == "passed"


def test_resume_refuses_another_inventory(tmp_path: Path) -> None:
    root, inv, run_id = started(tmp_path)
    inv.write_text(INV.replace("{name: a}", "{name: a, work_dir: /elsewhere}"))
    with pytest.raises(UsageError, match="not the inventory run"), \
            open_run(root, "preflight", Suite(), inv, [], resume=run_id):
        pass
    assert Run.open(root, run_id).meta.status == "interrupted"  # untouched


def test_resume_refuses_another_suite_or_step(tmp_path: Path) -> None:
    root, inv, run_id = started(tmp_path)
    other = Suite(nccl=NcclParams(iters=50))
    with pytest.raises(UsageError, match="used suite"), \
            open_run(root, "preflight", other, inv, [], resume=run_id):
        pass
    with pytest.raises(UsageError, match="is a 'preflight' run, not 'nccl'"), \
            open_run(root, "nccl", Suite(), inv, [], resume=run_id):
        pass
    assert Run.open(root, run_id).meta.status == "interrupted"


def test_the_run_copy_of_the_inventory_has_no_secrets(tmp_path: Path) -> None:
    inv = tmp_path / "inv.yaml"
    token = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
    inv.write_text(INV.replace("{name: a}", "{name: a, env: {HF_TOKEN: " + token
                               + ", MY_PASSWORD: hunter2hunter2}}"))
    nodes = inventory.load(inv).nodes
    with open_run(tmp_path / "r", "preflight", Suite(), inv, nodes) as run:
        run.finish("passed")
    copy = (run.dir / "inventory.yaml").read_text()
    assert token not in copy and "hunter2hunter2" not in copy
    assert "HF_TOKEN" in copy and "name: a" in copy
