"""--drain-on-fail and `gpuvet slurm resume`, on a scripted Slurm that keeps each node's
state and reason as slurmctld does and answers `scontrol -o show node` in the layout the
test cluster printed (tests/fixtures/slurm/scontrol_show_node_*.txt).

A node is drained for a FAIL on the provider's side only: never for a setup problem, a
node that was not measured, or when the controller does not answer; `resume` undoes
exactly the run's own drains."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

import pytest

from orchestrator import drain as D
from orchestrator import inventory as inv_mod
from orchestrator.command import CommandResult
from orchestrator.inventory import Node
from orchestrator.records import Finding, finding
from tests.unit.clirun import gpuvet

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
RUN = "20261206-083000-ab12"
IDLE = (FIX / "scontrol_show_node_idle.txt").read_text()


class Slurm:
    """scontrol as slurmctld answers it: nodes with a state and a reason."""

    def __init__(self, *names: str, down: bool = False) -> None:
        self.nodes: dict[str, tuple[str, str | None]] = {n: ("IDLE", None) for n in names}
        self.down = down
        self.calls: list[list[str]] = []

    def _res(self, argv: Sequence[str], rc: int, out: str = "", err: str = "") -> CommandResult:
        return CommandResult(node="slurm", command=" ".join(argv), rc=rc, stdout=out,
                             stderr=err, duration_s=0.0)

    def run(self, argv: Sequence[str], *, timeout: float | None = None) -> CommandResult:
        self.calls.append(list(argv))
        if self.down:
            return self._res(argv, 1, err="slurm_load_node error: Unable to contact slurm "
                                          "controller (connect failure)\n")
        if list(argv[:4]) == ["scontrol", "-o", "show", "node"]:
            name = argv[4]
            if name not in self.nodes:
                return self._res(argv, 1, f"Node {name} not found\n")
            state, why = self.nodes[name]
            text = IDLE.replace("NodeName=node2", f"NodeName={name}").replace(
                "State=IDLE", f"State={state}")
            if why is not None:
                text = text.rstrip("\n") + f" Reason={why} [root@2026-12-06T08:35:41]\n"
            return self._res(argv, 0, text)
        if list(argv[:2]) == ["scontrol", "update"]:
            words = dict(a.split("=", 1) for a in argv[2:])
            name, state = words["NodeName"], words["State"]
            if state == "DRAIN":
                self.nodes[name] = ("IDLE+DRAIN", words["Reason"])
            elif state == "RESUME":
                self.nodes[name] = ("IDLE", None)
            return self._res(argv, 0)
        return self._res(argv, 2, err=f"unexpected {argv}")

    def drains(self) -> list[list[str]]:
        return [c for c in self.calls if c[:2] == ["scontrol", "update"]]


def _nodes(tmp_path: Path, names: Sequence[str] = ("node1", "node2")) -> list[Node]:
    path = tmp_path / "inv.yaml"
    path.write_text("version: 1\nproviders:\n  lab:\n    executor: slurm\n    slurm:\n"
                    "      nodes: 2\n  boxes:\n    nodes:\n      - {name: ssh1, host: 10.0.0.9}\n")
    inv = inv_mod.load(path).with_allocations({"lab": ("42", list(names))})
    return list(inv.nodes)


def fail(node: str, code: str, severity: str = "FAIL", step: str = "health",
         provider: str = "lab") -> Finding:
    return finding(RUN, step, provider=provider, node=node, code=code,
                   severity=severity, message=f"{code} on {node}")  # type: ignore[arg-type]


def _drain(tmp_path: Path, findings: Sequence[Finding], slurm: D.SlurmRunner
           ) -> D.DrainReport:
    return D.drain_failed(RUN, tmp_path, findings, _nodes(tmp_path), lambda p: slurm,
                          {"lab": {"nodes": 2}})


def test_a_node_with_a_provider_side_fail_is_drained_with_the_code_and_the_run(
        tmp_path: Path) -> None:
    slurm = Slurm("node1", "node2")
    report = _drain(tmp_path, [fail("node1", "GPU_COUNT", "PASS"), fail("node2", "GPU_XID"),
                               fail("node2", "GPU_BUSY", step="preflight"),
                               fail("node2", "GPU_XID", step="preflight")], slurm)
    assert slurm.drains() == [["scontrol", "update", "NodeName=node2", "State=DRAIN",
                               f"Reason=gpuvet GPU_XID,GPU_BUSY run {RUN}"]]
    assert report.lines == [f"drained node2: gpuvet GPU_XID,GPU_BUSY run {RUN}"]
    assert slurm.nodes["node1"] == ("IDLE", None)
    # recorded in the run as it was done: another process reads it back
    saved = json.loads((tmp_path / D.DRAINS_FILE).read_text())
    assert saved["run_id"] == RUN and [d["node"] for d in saved["drains"]] == ["node2"]
    assert D.read(tmp_path)[0].outcome == "drained" and D.read(tmp_path)[0].slurm == {"nodes": 2}


@pytest.mark.parametrize("code", ["TRAIN_OOM", "CKPT_DIR_UNUSABLE", "TRAIN_COMMAND_FAILED"])
def test_a_setup_problem_drains_nothing(tmp_path: Path, code: str) -> None:
    slurm = Slurm("node1", "node2")
    report = _drain(tmp_path, [fail("node2", code, step="train")], slurm)
    assert slurm.drains() == []
    assert report.lines == ["not drained: node2: no FAIL on the provider's side there (a "
                            "setup problem, or the node was not measured)"]


@pytest.mark.parametrize(("code", "step"), [("NODE_UNREACHABLE", "health"),
                                            ("FLEET_NODE_DROPPED", "fleet"),
                                            ("HEALTH_FAILED", "health"),
                                            ("PREFLIGHT_FAILED", "preflight")])
def test_a_node_that_was_not_measured_is_not_drained(tmp_path: Path, code: str,
                                                     step: str) -> None:
    slurm = Slurm("node1", "node2")
    _drain(tmp_path, [fail("node2", code, step=step)], slurm)
    assert slurm.drains() == []


def test_not_measured_and_provider_wide_findings_drain_nothing(tmp_path: Path) -> None:
    slurm = Slurm("node1", "node2")
    report = _drain(tmp_path, [fail("node1", "HEALTH_NO_GPU", "INFO"),
                               finding(RUN, "health", provider="lab", node=None,
                                       code="SLURM_JOB_TIMEOUT", severity="FAIL",
                                       message="the allocation reached its time limit")],
                    slurm)
    assert slurm.calls == [] and report.lines == []
    assert not (tmp_path / D.DRAINS_FILE).exists()


def test_an_unreachable_controller_is_said_and_nothing_breaks(tmp_path: Path) -> None:
    slurm = Slurm("node1", "node2", down=True)
    report = _drain(tmp_path, [fail("node2", "GPU_XID")], slurm)
    assert [c[:3] for c in slurm.calls] == [["scontrol", "-o", "show"]]  # no update tried
    assert report.lines == ["not drained: node2 (GPU_XID): Slurm did not answer: scontrol "
                            "show node node2: slurm_load_node error: Unable to contact slurm "
                            "controller (connect failure)"]
    assert D.read(tmp_path)[0].outcome == "failed"


def test_nodes_outside_slurm_are_never_drained(tmp_path: Path) -> None:
    slurm = Slurm("node1", "node2")
    nodes = [n for n in _nodes(tmp_path) if n.executor != "slurm"]
    report = D.drain_failed(RUN, tmp_path, [fail("ssh1", "GPU_XID", provider="boxes")], nodes,
                            lambda p: slurm)
    assert slurm.calls == []
    assert report.notes == ["--drain-on-fail: no node of an executor slurm provider here, "
                            "nothing to drain"]


def test_a_node_someone_else_drained_keeps_its_reason(tmp_path: Path) -> None:
    slurm = Slurm("node1", "node2")
    slurm.nodes["node2"] = ("MIXED+DRAIN", "disk replaced, burn-in")
    report = _drain(tmp_path, [fail("node2", "GPU_XID")], slurm)
    assert slurm.drains() == []
    assert report.lines == ["not drained: node2 (GPU_XID) is already MIXED+DRAIN with another "
                            "reason, kept: 'disk replaced, burn-in'"]


def test_the_reason_fits_and_never_cuts_the_run_id() -> None:
    codes = ["REMAPPED_ROWS", "ECC_UNCORRECTABLE", "RETIRED_PAGES_PENDING", "FABRIC_STATE"]
    text = D.reason(codes, RUN)
    assert len(text) <= D.REASON_MAX and text.endswith(f" run {RUN}")
    assert text == f"gpuvet REMAPPED_ROWS+3 run {RUN}"
    assert D.reason(codes[:2], RUN) == f"gpuvet REMAPPED_ROWS,ECC_UNCORRECTABLE run {RUN}"
    assert D.reason(["GPU_XID", "GPU_XID"], RUN) == f"gpuvet GPU_XID run {RUN}"
    assert D.reason(["X" * 80], RUN) == f"gpuvet +1 run {RUN}"


@pytest.mark.parametrize(("name", "state", "why"), [
    ("idle", "IDLE", None),
    ("drained_gpuvet", "IDLE+DRAIN", f"gpuvet GPU_XID,GPU_BUSY run {RUN}"),
    ("draining_other", "MIXED+DRAIN", "disk replaced, burn-in"),
])
def test_state_and_reason_are_read_from_scontrol_as_printed(name: str, state: str,
                                                            why: str | None) -> None:
    text = (FIX / f"scontrol_show_node_{name}.txt").read_text()

    class One:
        def run(self, argv: Sequence[str], *, timeout: float | None = None) -> CommandResult:
            return CommandResult(node="x", command="", rc=0, stdout=text, stderr="",
                                 duration_s=0.0)

    assert D.node_state(One(), "node2") == (state, why)


# ------------------------------------------------------------------------- resume


def test_resume_undoes_the_run_s_drains_once(tmp_path: Path) -> None:
    slurm = Slurm("node1", "node2")
    _drain(tmp_path, [fail("node1", "GPU_BUSY"), fail("node2", "GPU_XID")], slurm)
    assert slurm.nodes["node1"][0] == slurm.nodes["node2"][0] == "IDLE+DRAIN"
    fresh = Slurm("node1", "node2")  # another process, another day: only the run's file
    fresh.nodes = dict(slurm.nodes)
    done = D.resume(RUN, tmp_path, lambda p: fresh)
    assert [d.resumed["said"] for d in done if d.resumed] == [
        f"resumed node1 (drained by this run: gpuvet GPU_BUSY run {RUN})",
        f"resumed node2 (drained by this run: gpuvet GPU_XID run {RUN})"]
    assert fresh.nodes == {"node1": ("IDLE", None), "node2": ("IDLE", None)}
    assert D.resume(RUN, tmp_path, lambda p: fresh) == []  # nothing left to undo


def test_resume_leaves_a_node_drained_since_by_someone_else(tmp_path: Path) -> None:
    slurm = Slurm("node1", "node2")
    _drain(tmp_path, [fail("node1", "GPU_BUSY"), fail("node2", "GPU_XID")], slurm)
    slurm.nodes["node2"] = ("IDLE+DRAIN", "PSU swap, ticket 4711")  # an admin's drain
    slurm.nodes["node1"] = ("IDLE", None)  # resumed by hand already
    done = D.resume(RUN, tmp_path, lambda p: slurm)
    said = {d.node: d.resumed for d in done}
    assert said["node2"] is not None and said["node2"]["outcome"] == "left"
    assert said["node2"]["said"] == ("left alone: node2 is IDLE+DRAIN with another reason "
                                     "since ('PSU swap, ticket 4711'), not this run's")
    assert said["node1"] is not None and said["node1"]["said"] == (
        "node1 is IDLE, no longer drained: nothing to undo")
    assert [c for c in slurm.drains() if "State=RESUME" in c] == []
    assert slurm.nodes["node2"] == ("IDLE+DRAIN", "PSU swap, ticket 4711")


def test_gpuvet_slurm_resume_works_from_the_run_alone(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CLI on a run whose drains file names a slurm block; Slurm's commands are the
    scripted ones (SlurmClient.run swapped for the double's)."""
    from orchestrator.executors.slurm_client import SlurmClient
    from orchestrator.store import Run
    from orchestrator.suite import load_suite

    suite = load_suite(None)
    run = Run.create(tmp_path / "results", command="health", suite_hash=suite.hash,
                     suite=suite.model_dump(mode="json"), inventory_path=None,
                     providers=["lab"], nodes=["node2"])
    run.finish("failed")
    slurm = Slurm("node2")
    D.drain_failed(run.run_id, run.dir, [finding(run.run_id, "health", provider="lab",
                                                 node="node2", code="GPU_XID",
                                                 severity="FAIL", message="Xid 79")],
                   _nodes(tmp_path, ["node2"]), lambda p: slurm, {"lab": {"nodes": 2}})
    monkeypatch.setattr(SlurmClient, "run", lambda self, argv, **kw: slurm.run(argv))
    r = gpuvet(capsys, "slurm", "resume", run.run_id, "--results", tmp_path / "results")
    assert r.returncode == 0, r.output
    assert r.stdout == (f"resumed node2 (drained by this run: gpuvet GPU_XID run "
                        f"{run.run_id})\n")
    r = gpuvet(capsys, "slurm", "resume", run.run_id, "--results", tmp_path / "results")
    assert (r.returncode, r.stdout) == (0, f"run {run.run_id} has no drain left to undo\n")
    r = gpuvet(capsys, "slurm", "resume", "20990101-000000-ab99", "--results",
               tmp_path / "results")
    assert r.returncode == 2 and re.match(r"error: no run 20990101-000000-ab99", r.stderr)


def test_through_the_real_client_the_reason_reaches_scontrol_as_one_word(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SlurmClient running the shipped scripted Slurm (fake scontrol on PATH): the reason,
    spaces and all, is one argument of `scontrol update`."""
    import os

    from orchestrator.executors import ExecutorOptions
    from orchestrator.executors.slurm_client import SlurmClient
    from orchestrator.inventory import SlurmOptions
    from orchestrator.testing import SlurmDouble

    double = SlurmDouble(tmp_path / "slurm").on("scontrol -o show", stdout=IDLE)
    monkeypatch.setenv("PATH", double.env(dict(os.environ))["PATH"])
    client = SlurmClient("lab", SlurmOptions(), ExecutorOptions())
    report = _drain(tmp_path, [fail("node2", "GPU_XID")], client)
    assert report.lines == [f"drained node2: gpuvet GPU_XID run {RUN}"]
    assert [c.argv for c in double.calls("scontrol")] == [
        ["scontrol", "-o", "show", "node", "node2"],
        ["scontrol", "update", "NodeName=node2", "State=DRAIN",
         f"Reason=gpuvet GPU_XID run {RUN}"]]
