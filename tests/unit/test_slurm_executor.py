"""The Slurm client, executor and allocation against the shipped scripted Slurm
(`orchestrator.testing.SlurmDouble`): the commands built, every inventory value one argv
word, the outputs parsed, what is cancelled and what is never cancelled."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from orchestrator import inventory
from orchestrator.errors import AllocationEnded, InventoryError, UsageError
from orchestrator.executors import ExecutorOptions, options_for
from orchestrator.executors.base import CommandResult, get_verified, put_verified
from orchestrator.executors.slurm import SlurmExecutor, allocations
from orchestrator.executors.slurm_client import SlurmClient, allocation_args
from orchestrator.parsers import slurm as sp
from orchestrator.records import Finding
from orchestrator.steps.driver import drive, node_unit
from orchestrator.store import Run
from orchestrator.testing import SlurmDouble
from tests.unit.clirun import gpuvet

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
RUNNING = (FIX / "scontrol_show_job_running_oneliner.txt").read_text()
TIMEOUT = (FIX / "scontrol_show_job_timeout.txt").read_text()


@pytest.fixture()
def slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SlurmDouble:
    double = SlurmDouble(tmp_path / "slurm")
    monkeypatch.setenv("PATH", double.env(os.environ)["PATH"])
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    return double


def _inv(tmp_path: Path, block: str, access: str = "") -> inventory.Inventory:
    p = tmp_path / "inv.yaml"
    p.write_text(f"providers:\n  lab:\n    executor: slurm\n{access}    slurm:\n{block}")
    return inventory.load(p)


def _allocated(slurm: SlurmDouble) -> None:
    slurm.on("salloc", stderr="salloc: Granted job allocation 1\n")
    slurm.on("scontrol show job", stdout=RUNNING)
    slurm.on("scontrol show hostnames", stdout="node1\nnode2\n")


# --- parsers ------------------------------------------------------------------------------

def test_parsers_read_the_captured_outputs() -> None:
    job = sp.parse_job((FIX / "scontrol_show_job_running.txt").read_text()).jobs[0]
    assert (job.job_id, job.name, job.state, job.node_list, job.num_nodes, job.time_limit) == (
        "1", "gpuvet-test run", "RUNNING", "node[1-2]", 2, "00:10:00")
    assert sp.parse_job(RUNNING).jobs[0] == job
    ended = sp.parse_job(TIMEOUT).jobs[0]
    assert (ended.state, ended.reason, ended.ended) == ("TIMEOUT", "TimeLimit", True)
    assert sp.parse_hostnames((FIX / "scontrol_show_hostnames.txt").read_text()).names == [
        "node1", "node2", "node3", "node7"]
    steps = sp.parse_squeue((FIX / "squeue_steps.txt").read_text()).rows
    assert [(r.id, r.columns) for r in steps] == [("1.0", ["gpuvet-step-abc", "node2"]),
                                                  ("1.batch", ["batch", "node1"])]
    acct = sp.parse_sacct((FIX / "sacct_ended.txt").read_text()).rows
    assert [(r.job_id, r.state) for r in acct][:2] == [("4101", "TIMEOUT"),
                                                       ("4101.batch", "CANCELLED")]
    assert acct[2].state_text == "CANCELLED by 0" and acct[3].state == "PREEMPTED"


@pytest.mark.parametrize("kind, text", [
    ("scontrol-show-hostnames", "node1\nnode1\n"),
    ("scontrol-show-hostnames", "node 1\n"),
    ("scontrol-show-hostnames", ""),
    ("scontrol-show-job", "slurm_load_jobs error: Invalid job id specified\n"),
    ("scontrol-show-job", "JobId=12 JobName=x\n"),
    ("squeue", "12.0|a\nnot-an-id|b\n"),
    ("sacct", "4101|timeout|0:15\n"),
])
def test_parsers_refuse_what_the_format_does_not_allow(kind: str, text: str) -> None:
    from orchestrator.errors import ParseError
    from orchestrator.parsers import parse

    with pytest.raises(ParseError):
        parse(kind, text)


# --- the inventory ------------------------------------------------------------------------

def test_every_value_reaches_salloc_as_one_word(tmp_path: Path, slurm: SlurmDouble) -> None:
    inv = _inv(tmp_path, "      partition: gpu-a,gpu-b\n      account: proj_1\n"
                         "      qos: high\n      reservation: maint.2\n"
                         "      constraint: a100&(ib|roce)*2\n      nodes: 2\n"
                         "      gpus_per_node: 8\n      time_limit: 1-02:00\n")
    _allocated(slurm)
    with allocations(inv, options_for(inv)) as got:
        assert [(n.name, n.executor, n.slurm_job) for n in got.nodes] == [
            ("node1", "slurm", "1"), ("node2", "slurm", "1")]
    (salloc,) = slurm.calls("salloc")
    assert salloc.argv[1] == "--no-shell" and salloc.argv[2].startswith("--job-name=gpuvet-")
    assert salloc.argv[3:] == ["--partition=gpu-a,gpu-b", "--account=proj_1", "--qos=high",
                               "--reservation=maint.2", "--constraint=a100&(ib|roce)*2",
                               "--nodes=2", "--gpus-per-node=8", "--time=1-02:00"]
    assert [c.argv for c in slurm.calls("scancel")] == [["scancel", "1"]]


@pytest.mark.parametrize("line, message", [
    ("      partition: 'gpu;rm -rf /'\n", "is not a Slurm name"),
    ("      account: -x\n", "is not a Slurm name"),
    ("      constraint: 'a100 && $(id)'\n", "is not a Slurm constraint"),
    ("      time_limit: 2h\n", "is not a Slurm time limit"),
    ("      job_id: '12; true'\n", "String should match pattern"),
    ("      partiton: gpu\n", "did you mean 'partition'?"),
    ("      job_id: '12'\n      nodes: 2\n", "job_id names an existing allocation; nodes"),
    ("      login: {host: '-oProxyCommand=x'}\n", "starts with '-'"),
])
def test_inventory_check_refuses_bad_slurm_values(tmp_path: Path, line: str,
                                                  message: str) -> None:
    with pytest.raises(InventoryError) as exc:
        _inv(tmp_path, line)
    assert message in str(exc.value) and "inv.yaml:" in str(exc.value)


def test_a_slurm_provider_needs_no_nodes_and_refuses_them(tmp_path: Path) -> None:
    inv = _inv(tmp_path, "      nodes: 2\n")
    assert inv.nodes == [] and inv.providers["lab"].slurm is not None
    p = tmp_path / "bad.yaml"
    p.write_text("providers:\n  lab:\n    executor: slurm\n    slurm: {}\n"
                 "    nodes: [{name: a, host: h}]\n")
    with pytest.raises(InventoryError, match="come from its allocation"):
        inventory.load(p)
    p.write_text("providers:\n  lab:\n    slurm: {}\n    nodes: [{name: a, host: h}]\n")
    with pytest.raises(InventoryError, match="needs `executor: slurm`"):
        inventory.load(p)


# --- the allocation -----------------------------------------------------------------------

def test_an_allocation_is_cancelled_when_the_block_fails(tmp_path: Path,
                                                          slurm: SlurmDouble) -> None:
    inv = _inv(tmp_path, "      nodes: 2\n")
    _allocated(slurm)
    with pytest.raises(KeyboardInterrupt), allocations(inv, options_for(inv)):
        raise KeyboardInterrupt
    assert [c.argv for c in slurm.calls("scancel")] == [["scancel", "1"]]


def test_a_refused_request_cancels_its_named_job(tmp_path: Path, slurm: SlurmDouble) -> None:
    inv = _inv(tmp_path, "      partition: nope\n")
    slurm.on("salloc", stderr="salloc: error: invalid partition specified: nope\n", rc=1)
    with pytest.raises(UsageError, match="invalid partition specified"), \
            allocations(inv, options_for(inv)):
        pass
    (scancel,) = slurm.calls("scancel")
    assert scancel.argv[1].startswith("--name=gpuvet-alloc-")


@pytest.mark.parametrize("how", ["job_id", "SLURM_JOB_ID"])
def test_an_allocation_gpuvet_did_not_make_is_never_cancelled(
        tmp_path: Path, slurm: SlurmDouble, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    if how == "job_id":
        inv = _inv(tmp_path, "      job_id: '1'\n")
    else:
        monkeypatch.setenv("SLURM_JOB_ID", "1")
        inv = _inv(tmp_path, "      time_limit: '5'\n")
    _allocated(slurm)
    with pytest.raises(RuntimeError), allocations(inv, options_for(inv)) as got:
        assert [n.name for n in got.nodes] == ["node1", "node2"]
        raise RuntimeError("the run failed")
    assert slurm.calls("salloc") == [] and slurm.calls("scancel") == []


# --- the executor -------------------------------------------------------------------------

def _executor(tmp_path: Path, slurm: SlurmDouble) -> SlurmExecutor:
    inv = _inv(tmp_path, "      nodes: 2\n",
               access=f"    access:\n      work_dir: {tmp_path / 'work'}\n"
                      "      env: {HF_TOKEN: s3cr3t-value}\n")
    _allocated(slurm)
    got = inv.with_allocations({"lab": ("1", ["node1", "node2"])})
    return SlurmExecutor(got.nodes[1], options_for(got))


def test_a_command_is_a_job_step_and_its_environment_stays_off_the_command_line(
        tmp_path: Path, slurm: SlurmDouble) -> None:
    ex = _executor(tmp_path, slurm)
    res = ex.run("echo $HF_TOKEN $EXTRA", env={"EXTRA": "x y"}, cwd=str(tmp_path / "c"))
    assert res.ok and res.stdout == "s3cr3t-value x y\n" and res.node == "node2"
    (srun,) = slurm.calls("srun")
    assert srun.argv[1:7] == ["--jobid=1", "--overlap", "--nodes=1", "--ntasks=1",
                              "--nodelist=node2", srun.argv[6]]
    assert srun.argv[6].startswith("--job-name=gpuvet-") and srun.argv[-3:-1] == ["/bin/sh",
                                                                                  "-c"]
    assert not any("s3cr3t" in a for a in srun.argv)
    # all the CPUs the job holds on the node (NumCPUs=2 over NumNodes=2), not one core
    assert "--cpus-per-task=1" in srun.argv
    assert (tmp_path / "c").is_dir()


def test_files_travel_over_the_step_and_are_verified(tmp_path: Path,
                                                     slurm: SlurmDouble) -> None:
    ex = _executor(tmp_path, slurm)
    local = tmp_path / "blob.bin"
    local.write_bytes(bytes(range(256)) * 64)
    digest = put_verified(ex, local, "in/blob.bin")
    assert (tmp_path / "work" / "in" / "blob.bin").read_bytes() == local.read_bytes()
    assert get_verified(ex, "in/blob.bin", tmp_path / "back.bin") == digest
    assert (tmp_path / "back.bin").read_bytes() == local.read_bytes()
    assert not list((tmp_path / "work" / "in").glob("*.part-*"))


def test_a_timed_out_command_is_cancelled_with_its_step(tmp_path: Path,
                                                        slurm: SlurmDouble) -> None:
    ex = _executor(tmp_path, slurm)
    t0 = time.monotonic()
    res = ex.run("sleep 30", timeout=0.5)
    assert res.timed_out and time.monotonic() - t0 < 10
    step_name = slurm.calls("srun")[0].argv[6].split("=", 1)[1]
    scancels = [c.argv for c in slurm.calls("scancel")]
    assert ["scancel", "1.0"] in scancels, (step_name, scancels)


def test_a_step_failing_after_the_time_limit_is_the_schedulers_doing(
        tmp_path: Path, slurm: SlurmDouble) -> None:
    ex = _executor(tmp_path, slurm)
    slurm.on("srun", stderr="srun: error: Slurm job 1 has expired\n", rc=1)
    slurm.on("scontrol show job", stdout=TIMEOUT)
    with pytest.raises(AllocationEnded) as exc:
        ex.run("true")
    assert (exc.value.state, exc.value.code) == ("TIMEOUT", "SLURM_JOB_TIMEOUT")
    assert "slurm.time_limit" in (exc.value.hint or "")
    # the step driver files it on the provider, not as the node's FAIL
    run = Run.create(tmp_path / "results", command="preflight", suite_hash="x", suite={},
                     inventory_path=None)
    from orchestrator.records import UnitResult

    def work(stage: object) -> UnitResult:
        ex.run("true")
        return UnitResult()

    driven = drive(run, "preflight", [node_unit(ex.node, work)], concurrency=1)
    (f,) = driven.failed.values()
    assert isinstance(f, Finding)
    assert (f.code, f.node, f.provider, f.severity) == ("SLURM_JOB_TIMEOUT", None, "lab",
                                                        "FAIL")


def test_a_failing_command_in_a_running_allocation_is_the_commands_own(
        tmp_path: Path, slurm: SlurmDouble) -> None:
    ex = _executor(tmp_path, slurm)
    res = ex.run("exit 3")
    assert res.rc == 3 and not res.timed_out


def test_the_client_names_what_it_cannot_run(tmp_path: Path) -> None:
    client = SlurmClient("lab", inventory.SlurmOptions(), ExecutorOptions())
    with pytest.raises(UsageError):
        client.run(["--version"])
    assert allocation_args(inventory.SlurmOptions(nodes=3)) == ["--nodes=3"]


def test_through_a_login_node_the_argv_is_quoted_for_its_shell(tmp_path: Path) -> None:
    import shlex

    from orchestrator.executors.slurm_client import _login_node
    from orchestrator.testing import ScriptedExecutor

    inv = _inv(tmp_path, "      login: {host: login1, user: alice, port: 2222}\n"
                         "      constraint: a100&(ib|roce)\n      partition: gpu\n"
                         "      slurm_conf: /etc/slurm-b/slurm.conf\n")
    slurm = inv.providers["lab"].slurm
    assert slurm is not None and slurm.login is not None
    login = _login_node("lab", slurm)
    assert (login.host, login.user, login.port, login.executor) == ("login1", "alice", 2222,
                                                                    "ssh")
    hop = ScriptedExecutor(login).on(lambda c: c.startswith("salloc"),
                                     stderr="salloc: Granted job allocation 9\n")
    client = SlurmClient("lab", slurm, options_for(inv))
    client._hop = hop
    assert client.allocate("gpuvet-alloc-x") == "9"
    (call,) = hop.calls
    assert shlex.split(call.command) == ["salloc", "--no-shell", "--job-name=gpuvet-alloc-x",
                                         "--partition=gpu", "--constraint=a100&(ib|roce)"]
    assert call.env == {"SLURM_CONF": "/etc/slurm-b/slurm.conf"}  # on the channel, not argv


def test_inventory_check_shows_a_slurm_provider_and_a_bad_value_exits_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _inv(tmp_path, "      login: {host: login1, user: alice}\n      nodes: 4\n")
    ok = gpuvet(capsys, "inventory", "check", tmp_path / "inv.yaml", "--json")
    assert ok.returncode == 0, ok.stderr
    (row,) = json.loads(ok.stdout)["rows"]
    assert [row[k] for k in ("provider", "node", "executor", "target")] == [
        "lab", "(salloc: 4 node(s))", "slurm", "slurm via alice@login1"]
    (tmp_path / "inv.yaml").write_text("providers:\n  lab:\n    executor: slurm\n"
                                       "    slurm:\n      qos: 'a b'\n")
    bad = gpuvet(capsys, "inventory", "check", tmp_path / "inv.yaml")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "inv.yaml:5: providers.lab.slurm.qos: 'a b' is not a Slurm name" in bad.stderr


def test_multi_node_nccl_tests_is_one_srun_pmix_step_across_the_allocation(
        tmp_path: Path) -> None:
    import shlex

    from orchestrator import nccltests

    inv = _inv(tmp_path, "      nodes: 2\n", access="    access:\n      env: {A: '1 2'}\n")
    n1, n2 = inv.with_allocations({"lab": ("7", ["node1", "node2"])}).nodes
    argv = ["/w/nccl-tests/build/all_reduce_perf", "-b", "8", "-e", "128M", "-g", "1"]
    step = nccltests.srun_mpi_command([(n1, argv, 8), (n2, argv, 8)], {"NCCL_DEBUG": "INFO"})
    assert step is not None and step.env == {"NCCL_DEBUG": "INFO", "A": "1 2"}
    words = shlex.split(step.split("done; ", 1)[1])
    assert words == ["srun", "--jobid=7", "--overlap", "--mpi=pmix", "--nodes=2",
                     "--ntasks=16", "--ntasks-per-node=8", "--nodelist=node1,node2",
                     "--kill-on-bad-exit=1", "--quiet", *argv]
    # the step it runs in must not shape it: its SLURM_* variables are dropped first
    assert step.startswith(nccltests.STEP_ENV_RESET)
    # nodes needing other programs or rank counts: mpirun's MPMD instead
    assert nccltests.srun_mpi_command([(n1, argv, 8), (n2, argv, 4)], {}) is None
    assert nccltests.srun_mpi_command([(n1, argv, 8), (n2, [*argv, "-c", "1"], 8)], {}) is None
    ssh_node = n1.model_copy(update={"slurm_job": None})
    assert nccltests.srun_mpi_command([(ssh_node, argv, 8), (n2, argv, 8)], {}) is None


def test_a_step_asks_for_every_cpu_the_job_holds_on_its_node(tmp_path: Path,
                                                              slurm: SlurmDouble) -> None:
    ex = _executor(tmp_path, slurm)
    slurm.on("scontrol show job", stdout=RUNNING.replace("NumCPUs=2", "NumCPUs=64"))
    ex.run("true")
    ex.run("true")
    assert [a for a in slurm.calls("srun")[0].argv if a.startswith("--cpus")] == [
        "--cpus-per-task=32"]
    assert len(slurm.calls("scontrol")) == 1  # asked once per job


def test_a_preemption_slurmctld_forgot_is_read_from_accounting(
        tmp_path: Path, slurm: SlurmDouble) -> None:
    ex = _executor(tmp_path, slurm)
    ex.client.cpus_per_node("1")  # asked while the job ran
    slurm.on("srun", stderr="srun: error: Unable to confirm allocation for job 1\n", rc=1)
    slurm.on("scontrol show job", stderr="slurm_load_jobs error: Invalid job id specified\n",
             rc=1)
    slurm.on("sacct", stdout="1|PREEMPTED|0:15|None\n")
    with pytest.raises(AllocationEnded) as exc:
        ex.run("true")
    assert (exc.value.state, exc.value.code) == ("PREEMPTED", "SLURM_JOB_PREEMPTED")
    (sacct,) = slurm.calls("sacct")
    assert sacct.argv[-2:] == ["-j", "1"] and "--parsable2" in sacct.argv


def test_a_job_still_completing_is_an_ended_allocation(
        tmp_path: Path, slurm: SlurmDouble, monkeypatch: pytest.MonkeyPatch) -> None:
    import orchestrator.executors.slurm as mod

    monkeypatch.setattr(mod, "COMPLETING_WAIT_S", 0.3)
    ex = _executor(tmp_path, slurm)
    ex.client.cpus_per_node("1")
    slurm.on("srun", stderr="srun: error: node2: task 0: Terminated\n", rc=143)
    slurm.on("scontrol show job", stdout=RUNNING.replace("JobState=RUNNING",
                                                         "JobState=COMPLETING"))
    with pytest.raises(AllocationEnded) as exc:
        ex.run("true")
    assert (exc.value.state, exc.value.code) == ("COMPLETING", "SLURM_JOB_ENDED")
    assert len(slurm.calls("scontrol")) > 2  # it waited for a final state


def test_no_slurm_client_here_is_the_setups_mistake(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    inv = _inv(tmp_path, "      nodes: 2\n")
    with pytest.raises(UsageError, match="cannot run salloc on this machine") as exc, \
            allocations(inv, options_for(inv)):
        pass
    assert "slurm.login" in (exc.value.hint or "")


def test_a_scheduler_that_does_not_answer_is_exit_2_before_anything_runs(
        tmp_path: Path, slurm: SlurmDouble) -> None:
    inv = _inv(tmp_path, "      job_id: '1'\n")
    slurm.on("scontrol show job", stdout=RUNNING)
    slurm.on("scontrol show hostnames",
             stderr="slurm_load_partitions: Unable to contact slurm controller\n", rc=1)
    with pytest.raises(UsageError, match="provider lab: scontrol show hostnames node.1-2. "
                                         "failed on this machine: slurm_load_partitions"), \
            allocations(inv, options_for(inv)):
        pass


def test_an_interrupt_while_the_request_waits_cancels_it_by_name(
        tmp_path: Path, slurm: SlurmDouble, monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess

    inv = _inv(tmp_path, "      nodes: 2\n")
    real = subprocess.Popen.communicate

    def interrupted(self: subprocess.Popen[bytes], *a: object, **k: object) -> object:
        if self.args[0] == "salloc":
            raise KeyboardInterrupt  # Ctrl-C while the job is pending
        return real(self, *a, **k)

    monkeypatch.setattr(subprocess.Popen, "communicate", interrupted)
    with pytest.raises(KeyboardInterrupt), allocations(inv, options_for(inv)):
        pass
    (scancel,) = slurm.calls("scancel")  # the job of that unique name, pending or granted
    assert scancel.argv[1].startswith("--name=gpuvet-alloc-")


def test_through_a_login_node_files_are_staged_there_and_the_steps_read_and_write_them(
        tmp_path: Path) -> None:
    import shlex

    from orchestrator.executors.slurm_client import _login_node
    from orchestrator.testing import Call, Reply, ScriptedExecutor

    inv = _inv(tmp_path, "      login: {host: login1}\n      job_id: '5'\n")
    got = inv.with_allocations({"lab": ("5", ["gpu-1"])})
    slurm = got.providers["lab"].slurm
    assert slurm is not None
    hop = ScriptedExecutor(_login_node("lab", slurm))
    staged: list[str] = []

    def step(call: Call) -> Reply:
        words = shlex.split(call.command.replace('"$HOME"/', "HOME/"))
        if "<" in words:  # a put: the step reads the staged copy on its stdin
            staged.append(words[words.index("<") + 1])
        elif ">" in words:  # a get: the step writes into the login node's stage folder
            hop.files["~/" + words[words.index(">") + 1][len("HOME/"):]] = b"result"
        return Reply(stdout="NumNodes=1\n" if words[0] == "scontrol" else "")

    hop.on(lambda c: True, reply=step)
    options = options_for(got)
    ex = SlurmExecutor(got.nodes[0], options)
    ex.client._hop = hop
    local = tmp_path / "in.bin"
    local.write_bytes(b"payload")
    ex.put(local, "/w/in.bin")
    (put,) = hop.puts
    assert put.startswith("~/.gpuvet-stage/") and staged == ["HOME/" + put[2:]]
    assert any(c.command == f"rm -f \"$HOME\"/{shlex.quote(put[2:])}" for c in hop.calls)
    ex.get("/w/out.bin", tmp_path / "out.bin")
    assert (tmp_path / "out.bin").read_bytes() == b"result"
    srun = [shlex.split(c.command[c.command.index("srun "):].replace('"$HOME"/', "HOME/"))
            for c in hop.calls if "srun " in c.command]
    assert len(srun) == 2
    assert all("--jobid=5" in w and "--nodelist=gpu-1" in w for w in srun), srun


def test_a_job_id_and_a_time_limit_may_be_written_as_numbers(tmp_path: Path) -> None:
    slurm = _inv(tmp_path, "      job_id: 123456\n").providers["lab"].slurm
    assert slurm is not None and slurm.job_id == "123456"
    slurm = _inv(tmp_path, "      time_limit: 90\n").providers["lab"].slurm
    assert slurm is not None and allocation_args(slurm) == ["--time=90"]
    with pytest.raises(InventoryError, match="job_id"):
        _inv(tmp_path, "      job_id: true\n")


def test_a_login_nodes_key_file_and_jump_host_are_checked_as_a_nodes(tmp_path: Path) -> None:
    with pytest.raises(InventoryError) as exc:
        _inv(tmp_path, f"      login: {{host: login1, identity_file: {tmp_path / 'nokey'},"
                       " proxy_jump: bastoin}\n")
    text = str(exc.value)
    assert "providers.lab.slurm.login.identity_file" in text and "nokey" in text
    assert "unknown jump host 'bastoin'" in text


def test_a_copy_that_differs_from_the_nodes_file_is_fetched_again_then_refused(
        tmp_path: Path, slurm: SlurmDouble, monkeypatch: pytest.MonkeyPatch) -> None:
    """The file's sha256 is taken on the node in the same step: a copy that came back
    different (seen once over srun under load) is fetched once more; twice different is
    an error with both digests, never a wrong file."""
    import hashlib

    from orchestrator.errors import StepError

    ex = _executor(tmp_path, slurm)
    good = bytes(range(256)) * 64
    digest = hashlib.sha256(good).hexdigest()
    replies = [good[:-1], good]  # the first copy lost its last byte

    def step(script: str, *, stdout_path: Path, **_: object) -> CommandResult:
        assert "sha256sum" in script and script.endswith("blob.bin")
        stdout_path.write_bytes(replies.pop(0))
        return CommandResult(node="node2", command=script, rc=0, stdout="",
                             stderr=f"{digest}  /w/blob.bin\n", duration_s=0.1)
    monkeypatch.setattr(ex, "_step", step)
    ex.get("blob.bin", tmp_path / "back.bin")
    assert (tmp_path / "back.bin").read_bytes() == good and replies == []
    replies[:] = [good[:-1], good[:-2]]
    with pytest.raises(StepError, match="gave a different file twice"):
        ex.get("blob.bin", tmp_path / "again.bin")
    assert not list(tmp_path.glob("again.bin*"))  # nothing half-copied stays
