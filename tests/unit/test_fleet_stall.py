"""A fleet job that hangs ends within `fleet.stall_timeout_s` of its last output: its
commands are killed through the executors' cancel, the job is recorded failed with that
reason, and the plan goes on (steps/fleet/engines.StallWatch)."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from orchestrator import inventory
from orchestrator.executors.local import LocalExecutor
from orchestrator.nccltests import BuildDoc
from orchestrator.steps.fleet import engines
from orchestrator.store import Run
from orchestrator.suite import FleetParams, NcclParams, Suite


def _node(tmp_path: Path, name: str) -> inventory.Node:
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"version: 1\nproviders:\n  p:\n    executor: local\n    nodes:\n"
                    f"      - {{name: {name}, work_dir: '{tmp_path / name}'}}\n")
    return inventory.load(path).nodes[0]


def test_a_log_that_stops_growing_is_a_hang_and_its_command_is_killed(tmp_path: Path) -> None:
    ex = LocalExecutor(_node(tmp_path, "a"))
    log = tmp_path / "job.log"
    t0 = time.monotonic()
    with engines.StallWatch(log, [ex], 1.0) as watch:
        res = ex.run("echo header; sleep 0.4; echo row; sleep 300", stdout_path=log,
                     timeout=600)
    assert watch.hung and res.rc != 0 and not res.timed_out
    assert time.monotonic() - t0 < 120  # killed at the stall, long before its own end
    assert log.read_text() == "header\nrow\n"
    assert "no output for 1 s" in watch.why()


def test_a_job_that_keeps_printing_is_not_a_hang(tmp_path: Path) -> None:
    ex = LocalExecutor(_node(tmp_path, "a"))
    log = tmp_path / "job.log"
    with engines.StallWatch(log, [ex], 1.0) as watch:
        res = ex.run("for i in 1 2 3 4 5 6; do echo $i; sleep 0.4; done", stdout_path=log,
                     timeout=60)
    assert res.rc == 0 and not watch.hung


@pytest.mark.parametrize("collective", ["all_reduce", "alltoall"])
def test_a_hung_nccl_tests_pair_is_a_failed_job_naming_the_stall(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, collective: str) -> None:
    """mpirun prints nccl-tests' header and then waits for ever on a peer: the job is
    killed at the stall and JobFailed says why, with its log as evidence. Each
    collective's run of a job is watched on its own log."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "mpirun"
    fake.write_text("#!/bin/sh\necho '# nThread 1 nGpus 1 minBytes 8 maxBytes 128'\n"
                    "exec sleep 300\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    a, b = _node(tmp_path, "a"), _node(tmp_path, "b")
    run = Run.create(tmp_path / "results", command="fleet", suite_hash=Suite().hash,
                     suite={}, inventory_path=None, providers=["p"], nodes=["a", "b"])
    pool = {n.name: LocalExecutor(n) for n in (a, b)}
    builds = {n: BuildDoc(ok=True, binary="/x/all_reduce_perf", gpus=1) for n in pool}
    params = engines.nccl_params(FleetParams(), NcclParams())
    out = run.provider_dir("p", "fleet")
    out.mkdir(parents=True, exist_ok=True)
    with pytest.raises(engines.JobFailed) as err:
        engines.run_nccl_tests(lambda n: pool[n.name], [a, b], run, params,  # type: ignore[arg-type]
                               out, "pairs-r0_a-b", builds=builds, stall_s=1.0,
                               collective=collective)
    assert "no output for 1 s (fleet.stall_timeout_s): hung, killed" in err.value.what
    assert f"mpirun {collective}_perf failed" in err.value.what
    name = "pairs-r0_a-b.log" if collective == "all_reduce" else f"pairs-r0_a-b_{collective}.log"
    assert err.value.evidence and err.value.evidence[0].endswith(name)


def test_the_stall_bound_keeps_the_hash_of_suites_that_leave_it_alone() -> None:
    fleet = Suite(fleet=FleetParams(partners=3))
    assert fleet.hash == Suite(fleet=FleetParams(partners=3, stall_timeout_s=120)).hash
    assert fleet.hash != Suite(fleet=FleetParams(partners=3, stall_timeout_s=30)).hash
    assert Suite().hash == Suite(fleet=None).hash


def test_the_fleet_collectives_keep_the_hash_of_suites_that_leave_them_alone() -> None:
    """fleet.collectives left at [all_reduce] keeps the hash runs stored before it existed
    (pinned: the hashes of the commit before the key)."""
    assert Suite().hash == "719fcba1d20e5499"
    assert Suite(fleet=FleetParams()).hash == "4e4113d0e0f6422c"
    assert Suite(fleet=FleetParams(partners=3)).hash == "9e8cd215068738b4"
    assert Suite(fleet=FleetParams(partners=3, collectives=("all_reduce",))).hash \
        == "9e8cd215068738b4"
    assert Suite(fleet=FleetParams(partners=3, collectives=("all_reduce", "alltoall"))).hash \
        != "9e8cd215068738b4"
    # the order is the order they run in: another suite
    assert Suite(fleet=FleetParams(collectives=("alltoall", "all_reduce"))).hash != Suite(
        fleet=FleetParams(collectives=("all_reduce", "alltoall"))).hash


@pytest.mark.parametrize("bad", [[], ["alltoall", "alltoall"], ["sendrecv"]])
def test_fleet_collectives_are_named_once_each_from_those_both_engines_have(
        bad: list[str]) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        FleetParams.model_validate({"collectives": bad})
