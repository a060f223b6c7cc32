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


def test_a_run_whose_controller_died_says_so_when_resumed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A controller SIGKILLed mid-run leaves its run "running" and its lock free: the
    resume says who left it and that its finished units are kept. An interrupted run,
    which recorded how it ended, resumes without the warning."""
    root, inv, run_id = started(tmp_path)
    run = Run.open(root, run_id)
    run.meta.status = "running"
    run.save_meta()
    (run.dir / ".lock").write_text('{"pid": 4837, "host": "gpu-7", "start": 1}')
    with open_run(root, "preflight", Suite(), inv, [], resume=run_id) as again:
        again.finish("passed")
    err = capsys.readouterr().err
    assert f"warning: run {run_id} was left running by pid 4837 on gpu-7, which ended " \
        "without finishing it" in err
    (tmp_path / "b").mkdir()
    root2, inv2, run2 = started(tmp_path / "b")
    with open_run(root2, "preflight", Suite(), inv2, [], resume=run2) as again:
        again.finish("passed")
    assert "left running" not in capsys.readouterr().err


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
