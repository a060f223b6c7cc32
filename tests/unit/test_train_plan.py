"""Planning the training step: suite validation, share groups, what each phase asks of
the supervisor; and the whole step driven on local nodes with a command of the
user's own (no torch needed), restore contract included."""

from __future__ import annotations

import json
import shlex
import stat
import sys
import types
import typing
from pathlib import Path

import pytest
from pydantic import ValidationError

from orchestrator import inventory
from orchestrator.inventory import Node
from orchestrator.steps.train import launch, storage
from orchestrator.steps.train import step as train
from orchestrator.store import Run
from orchestrator.suite import Suite, TrainParams, load_suite
from payload.train.protocol import KILL_POINTS

ROOT = Path(__file__).resolve().parents[2]


def test_suite_train_section_is_checked() -> None:
    assert typing.get_args(TrainParams.model_fields["kill"].annotation) == KILL_POINTS
    with pytest.raises(ValidationError, match="must stay below steps"):
        TrainParams(steps=10, ckpt_step=8, kill_offset=2)
    with pytest.raises(ValidationError, match="multiple of n_heads"):
        TrainParams(model="tiny", n_heads=3)
    with pytest.raises(ValidationError, match="restore contract needs both"):
        TrainParams(command="x", resume_flag="--resume")
    s = load_suite(ROOT / "suites" / "train-cpu.yaml")
    assert s.train.model == "tiny" and s.train.kill_step == 7
    assert s.hash != Suite().hash
    other = s.model_copy(update={"train": s.train.model_copy(update={"seed": 1})})
    assert other.hash != s.hash  # every training parameter is part of the hash


def _nodes(tmp_path: Path, *names: str) -> dict[str, Node]:
    path = tmp_path / "inv.yaml"
    path.write_text("version: 1\nproviders:\n  p:\n    executor: local\n    nodes:\n" + "".join(
        f"      - {{name: {n}, work_dir: '/w/{n} x'}}\n" for n in names))
    return {n.name: n for n in inventory.load(path).nodes}


def test_share_groups_need_mutual_sight_and_equal_gpus(tmp_path: Path) -> None:
    nodes = _nodes(tmp_path, "a", "b", "c", "d", "e", "f")

    def probe(name: str, sees: set[str], gpus: int = 0) -> storage.Probe:
        return storage.Probe(nodes[name], {"gpus": gpus}, Path("probe.json"), sees)

    a, b, c = probe("a", {"b"}), probe("b", {"a"}), probe("c", {"a", "b"})
    d = probe("d", set(), 0)
    assert [[p.node.name for p in g] for g in storage.share_groups([a, b, c, d])] == [
        ["a", "b"], ["c"], ["d"]]
    e, f = probe("e", {"f"}, 8), probe("f", {"e"}, 4)
    assert len(storage.share_groups([e, f])) == 2


@pytest.mark.parametrize("kill,flags", [
    ("after-step", ["--save-at", "8", "--kill-after-step", "10"]),
    ("mid-save", ["--save-at", "8", "--save-at", "10", "--kill-at-save", "10"]),
    ("before-manifest", ["--save-at", "8", "--save-at", "10", "--kill-at-commit", "10"]),
])
def test_the_kill_phase_saves_at_k_and_kills_where_the_suite_says(kill: str,
                                                                  flags: list[str]) -> None:
    params = TrainParams(kill=kill)  # type: ignore[arg-type]
    assert train.phase_extra(params, "kill") == flags
    assert train.phase_extra(params, "reference") == []
    assert train.phase_extra(params, "restore") == []


def test_supervisor_arguments_carry_the_suite(tmp_path: Path) -> None:
    run = Run.create(tmp_path / "r", command="train", suite_hash="h", suite={},
                     inventory_path=None)
    node = _nodes(tmp_path, "n1")["n1"]
    job = train.Job("n1", node, "kill", tmp_path, "/ck/x", extra=["--save-at", "8"])
    args = launch._supervise_args(job, run, TrainParams(model="350m", seed=7))
    assert args[args.index("--out") + 1] == f"/w/n1 x/train-runs/{run.run_id}/n1/kill"
    params = json.loads(args[args.index("--params") + 1])
    assert params["model"] == "350m" and params["seed"] == 7
    assert args[-2:] == ["--save-at", "8"]
    assert storage.ckpt_root(node, run, "n1") == f"/w/n1 x/ckpt/gpuvet-train/{run.run_id}/n1"
    own = launch._supervise_args(job, run, TrainParams(command="-x run.sh", resume_flag="-r",
                                                      command_kill_after_step=3))
    assert "--command=-x run.sh" in own and "--resume-flag=-r" in own


FAKE_TRAINER = """#!/bin/sh
# A user's trainer: step lines, a checkpoint at step 4 in $GPUVET_CKPT_DIR, --resume.
start=1
if [ "$1" = "--resume" ] && [ -f "$GPUVET_CKPT_DIR/state" ]; then
  start=$(( $(cat "$GPUVET_CKPT_DIR/state") + 1 ))
  echo "resuming at $start"
fi
i=$start
while [ $i -le 8 ]; do
  echo "step=$i"
  if [ $i -eq 4 ]; then echo $i > "$GPUVET_CKPT_DIR/state"; echo "saved step=$i"; fi
  sleep 0.2
  i=$(( i + 1 ))
done
"""


def test_your_command_on_two_local_nodes_restores_on_the_other(tmp_path: Path) -> None:
    script = tmp_path / "trainer.sh"
    script.write_text(FAKE_TRAINER)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    inv_path = tmp_path / "inv.yaml"
    shared = tmp_path / "shared"
    inv_path.write_text(
        "version: 1\nproviders:\n  lab:\n    executor: local\n"
        f"    access: {{python: {sys.executable}, ckpt_dir: {shared}}}\n    nodes:\n"
        + "".join(f"      - {{name: {n}, work_dir: {tmp_path / n}}}\n" for n in ("n1", "n2")))
    inv = inventory.load(inv_path)
    suite = Suite(train=TrainParams(command=shlex.quote(str(script)), resume_flag="--resume",
                                    command_kill_after_step=6, timeout_s=60))
    run = Run.create(tmp_path / "results", command="train", suite_hash=suite.hash,
                     suite=suite.model_dump(mode="json"), inventory_path=inv_path)
    seen: list[tuple[str, str]] = []
    driven = train.run_train(inv, inv.nodes, run, suite,
                             progress=lambda who, state: seen.append((who, state)))
    assert not driven.failed, driven.failed
    assert list(driven.done) == ["provider:lab/single-n1+n2"]
    # progress: the unit queued, then each phase as it begins, each restore on the other node
    unit = "provider:lab/single-n1+n2"
    assert [state for who, state in seen if who == unit and state != "start"] == [
        "queued", "reference on n1, n2", "kill on n1, n2",
        "restore on n2 (n1's checkpoint), n1 (n2's checkpoint)", "done"]
    fs = run.findings()
    oks = {f.node: f for f in fs if f.code == "TRAIN_RESTORE_OK"}
    assert set(oks) == {"n1", "n2"}, [f.message for f in fs]
    assert "resumed at step=5 (last saved 4)" in oks["n1"].message
    assert {f.node for f in fs if f.code == "CKPT_SHARED"} == {"n1", "n2"}
    # n1's run was restored on n2: its files came back under n1's unit
    assert (run.dir / "nodes/n1/train/restore/n2/command.stdout").read_text().startswith(
        "resuming at 5")
    assert not (shared / "gpuvet-train" / run.run_id).exists() or not any(
        (shared / "gpuvet-train" / run.run_id).iterdir())  # checkpoints removed afterwards
    ms = {(m.metric, m.nodes[0]) for m in run.measurements()}
    assert ("steps_lost", "n1") in ms and ("command_wall_s", "n2") in ms


def _byo_setup(tmp_path: Path) -> tuple[Path, Path]:
    script = tmp_path / "trainer.sh"
    script.write_text(FAKE_TRAINER)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    inv_path = tmp_path / "inv.yaml"
    inv_path.write_text(
        "version: 1\nproviders:\n  lab:\n    executor: local\n"
        f"    access: {{python: {sys.executable}}}\n    nodes:\n"
        f"      - {{name: n1, work_dir: {tmp_path / 'n1'}}}\n")
    suite = tmp_path / "suite.yaml"
    suite.write_text(f"train:\n  command: {shlex.quote(str(script))}\n  resume_flag: --resume\n"
                     "  command_kill_after_step: 6\n  timeout_s: 60\n")
    return inv_path, suite


def test_gpuvet_train_command_runs_the_step(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    from clirun import gpuvet

    inv_path, suite = _byo_setup(tmp_path)
    res = gpuvet(capsys, "train", "-i", inv_path, "--suite", suite, "--results",
                 tmp_path / "results", "--json")
    assert res.returncode == 0, res.output
    doc = json.loads(res.stdout)
    codes = {f["code"] for f in doc["findings"]}
    # one node sharing with nobody: its checkpoint directory is its own, restored in place
    assert {"TRAIN_RESTORE_OK", "CKPT_DIR_DEFAULT"} <= codes
    assert doc["status"] == "passed" and doc["measurements"] >= 3
    assert "--no-multi" in gpuvet(capsys, "train", "--help").stdout


def test_too_little_room_for_the_checkpoints_is_said(tmp_path: Path) -> None:
    nodes = _nodes(tmp_path, "a", "b")
    run = Run.create(tmp_path / "r", command="train", suite_hash="h", suite={},
                     inventory_path=None)
    suite = Suite(train=TrainParams(model="1b"))
    step = train.Step(None, run, suite, None, {})  # type: ignore[arg-type]
    doc = {"ckpt_dir": "/ck", "path": {"free_bytes": 30e9, "mount": {"fstype": "ext4"}}}
    a = storage.Probe(nodes["a"], doc, tmp_path / "probe.json", {"b"})
    b = storage.Probe(nodes["b"], doc, tmp_path / "probe.json", {"a"})
    j = step.judge("p", "a", ["a"], "single")
    step.storage(j, a, [b])
    low = [f for f in j.findings if f.code == "CKPT_SPACE_LOW"]
    assert len(low) == 1 and low[0].details["need_bytes"] > 45e9  # 2 saves x 2 nodes x 12 GB
    j2 = step.judge("p", "a", ["a"], "single")
    step.storage(j2, a, [])
    assert not [f for f in j2.findings if f.code == "CKPT_SPACE_LOW"]  # 24 GB fit in 30


class _Recorder:
    """A pool whose executors record the commands they are asked to run."""

    def __init__(self) -> None:
        import threading

        self.lock = threading.Lock()
        self.commands: list[tuple[str, str]] = []

    def __call__(self, node: Node) -> _Recorder._Ex:
        return _Recorder._Ex(self, node)

    class _Ex:
        def __init__(self, rec: _Recorder, node: Node) -> None:
            self.rec, self.node = rec, node

        def run(self, command: str, **_: object) -> None:
            with self.rec.lock:
                self.rec.commands.append((self.node.name, command))


def test_a_failed_part_of_a_multi_node_job_stops_the_others(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A multi-node job cannot finish without one of its nodes: once a part fails, the
    others get the grace period and are then stopped through their stop files, so the
    attempt ends within that bound of the failure, not at the job's own timeout."""
    import time

    nodes = _nodes(tmp_path, "a", "b", "c")
    run = typing.cast(Run, types.SimpleNamespace(run_id="20261206-000000-abcd"))
    pool = _Recorder()

    def fake_job(_pool: object, _run: Run, _suite: Suite, job: launch.Job) -> dict:
        if job.node.name == "a":
            return {"rc": 1}  # torchrun failed on a
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the others wait for a peer that is gone
            with pool.lock:
                told = [c for n, c in pool.commands if n == job.node.name and "printf" in c]
            if told:
                assert job.stop is not None and shlex.quote(job.stop) in told[0]
                return {"rc": -9, "killed": True, "stopped": told[0]}
            time.sleep(0.01)
        return {"rc": -9, "killed": True, "timed_out": True}

    monkeypatch.setattr(launch, "run_job", fake_job)
    jobs = [launch.Job("multi-p", n, "reference", tmp_path / n.name, "/ckpt", node_rank=i,
                       nnodes=3) for i, n in enumerate(nodes.values())]
    done, failures = launch.run_phase(pool, run, Suite(), jobs, grace_s=0.05)  # type: ignore[arg-type]
    assert not failures and [j.node.name for j in done] == ["a", "b", "c"]
    stops = [(n, c) for n, c in pool.commands if "printf" in c]
    assert sorted(n for n, _ in stops) == ["b", "c"]  # never the node that failed
    assert all("the part on a failed" in c for _, c in stops)
    # nothing else was asked of the nodes (the supervisors remove the stop files)
    assert len(pool.commands) == 2
    # the stop files are the attempt's own: another attempt gets other names
    first = {j.stop for j in jobs}
    launch.run_phase(pool, run, Suite(), jobs, grace_s=0.05)  # type: ignore[arg-type]
    assert not first & {j.stop for j in jobs}


def test_parts_that_end_well_stop_nobody(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    nodes = _nodes(tmp_path, "a", "b")
    run = typing.cast(Run, types.SimpleNamespace(run_id="20261206-000000-abcd"))
    pool = _Recorder()
    # the kill phase: both parts SIGKILLed by their own supervisors at the kill point
    monkeypatch.setattr(launch, "run_job", lambda *_a: {"rc": -9, "killed": True,
                                                       "kill_event": {"step": 7}})
    jobs = [launch.Job("multi-p", n, "kill", tmp_path / n.name, "/ckpt", node_rank=i,
                       nnodes=2) for i, n in enumerate(nodes.values())]
    launch.run_phase(pool, run, Suite(), jobs, grace_s=0.0)  # type: ignore[arg-type]
    import time

    time.sleep(0.2)
    assert not [c for _, c in pool.commands if "printf" in c]


@pytest.mark.parametrize("executor", ["local", "slurm"])
def test_checkpoints_leave_their_path_at_once_and_a_stale_removal_is_swept(
        tmp_path: Path, executor: str) -> None:
    """The unit's checkpoints are renamed aside before the command returns and deleted in
    the background (in the job step itself under Slurm, whose steps end their processes);
    what an earlier removal left is swept by this one."""
    import subprocess
    import time

    run = Run.create(tmp_path / "r", command="train", suite_hash="h", suite={},
                     inventory_path=None)
    node = _nodes(tmp_path, "n1")["n1"].model_copy(update={"executor": executor})
    base = tmp_path / "ck x" / "gpuvet-train"
    unit = base / run.run_id / "n1"
    (unit / "step-000008").mkdir(parents=True)
    (unit / "step-000008" / "__0_0.distcp").write_bytes(b"x" * 4096)
    stale = base / ".removing-20261201-000000-aaaa-n1-abcdef"
    (stale / "step-000010").mkdir(parents=True)
    keep = base / "other-run" / "n1"
    keep.mkdir(parents=True)
    cmd = storage.removal_command(node, str(unit), run)
    res = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert not unit.exists() and not (base / run.run_id).exists()  # gone from its path
    deadline = time.monotonic() + 30
    while list(base.glob(".removing-*")) and time.monotonic() < deadline:
        assert executor != "slurm"  # in the step: done before the command returns
        time.sleep(0.05)
    assert not list(base.glob(".removing-*")), list(base.iterdir())
    assert keep.is_dir()  # another run's checkpoints are not touched
    # a unit whose folder is already gone (a node that never wrote one) is no error
    res = subprocess.run(["sh", "-c", storage.removal_command(node, str(unit), run)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
