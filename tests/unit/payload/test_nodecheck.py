"""The node check Slurm calls (`python3 -m payload nodecheck`): its judging on outputs
captured on real hosts and in public threads, the controller's parsers judging the same
outputs alike, the drain it does with `--drain`, and the real entry point on this machine,
which has no NVIDIA driver."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.parsers.kernel_log import parse_kernel_log
from orchestrator.parsers.nvidia_smi_q import parse_nvidia_smi_q
from payload import nodecheck as N

REPO = Path(__file__).resolve().parents[3]
FIX = REPO / "tests" / "fixtures"
PUBLIC = FIX / "public"
BUSY = FIX / "h100x1-busy" / "20261206-035152-9323" / "nodes" / "h100-n1" / "health" / \
    "counters" / "before"
H200 = FIX / "h200x1-health"
H200X2_Q = FIX / "h200x2" / "commands" / "nvidia-smi-q.txt"


def ok(text: str) -> N.Ran:
    return N.Ran(0, text, "")


def inputs(query: str | None, apps: str | None = None, smi_q: str | None = None,
           log: str | None = None, pci: Sequence[str] = (),
           ports: Sequence[N.IbPort] = ()) -> N.Inputs:
    return N.Inputs(ok(query) if query is not None else None,
                    ok(apps) if apps is not None else None,
                    ok(smi_q) if smi_q is not None else None,
                    ("dmesg", log) if log is not None else None, "dmesg: not permitted",
                    list(pci), list(ports))


def codes(problems: Sequence[N.Problem]) -> list[str]:
    return [p.code for p in problems]


# ------------------------------------------------------------------- busy GPUs


def test_a_gpu_another_process_holds_62_gib_of_is_busy() -> None:
    """The H100 captured while another process held 62 GiB (tests/fixtures/h100x1-busy):
    the same verdict preflight and health give it (tests/unit/test_busy_gpu.py)."""
    problems, _ = N.judge(inputs((BUSY / "query-gpu.csv").read_text(),
                                 (BUSY / "compute-apps.csv").read_text()))
    assert codes(problems) == ["GPU_BUSY"]
    assert problems[0].message == ("GPU 0 is in use before the job: pid 4416 python3 "
                                   "(62314 MiB) (62323 MiB in use)")


def test_in_a_prolog_only_the_job_s_own_gpus_are_judged_busy() -> None:
    """On a node shared by jobs, a Prolog sees SLURM_JOB_GPUS: another job's GPU is not
    this job's problem."""
    q, apps = (BUSY / "query-gpu.csv").read_text(), (BUSY / "compute-apps.csv").read_text()
    assert N.job_gpus({"SLURM_JOB_GPUS": "1,2"}) == [1, 2]
    assert N.job_gpus({}) is None
    assert codes(N.judge(inputs(q, apps), job_gpus=[1])[0]) == []
    assert codes(N.judge(inputs(q, apps), job_gpus=[0])[0]) == ["GPU_BUSY"]


@pytest.mark.parametrize(("held", "in_use", "procs", "unknown", "want"), [
    (62314, 62323, 1, False, "FAIL"),  # the captured case
    (300, 310, 1, False, "WARN"),  # a monitoring agent
    (300, 2000, 1, False, "FAIL"),  # more in use than the visible process holds
    (0, None, 1, True, "FAIL"),  # a cell that did not show the memory
    (0, 4000, 0, False, "FAIL"),  # memory held by a process this node cannot see
    (0, 1024, 0, False, None),  # at the threshold, not above it
    (0, 0, 0, False, None),
])
def test_the_busy_rule_preflight_health_and_the_node_check_share(
        held: int, in_use: int | None, procs: int, unknown: bool, want: str | None) -> None:
    from orchestrator.steps.preflight import busy

    assert busy.busy_severity is N.busy_severity  # preflight judges with this very rule
    assert N.busy_severity(held, in_use, procs, unknown) == want


# ------------------------------------------------------------------- GPUs, memory


def test_a_clean_h200_passes_every_check() -> None:
    problems, notes = N.judge(inputs((H200 / "step-standard/counters/before/query-gpu.csv")
                                     .read_text(), (H200 / "compute-apps.csv").read_text(),
                                     H200X2_Q.read_text(), (H200 / "dmesg.txt").read_text()),
                              expected_gpus=1)
    assert problems == []
    said = {n.check: n.message for n in notes}
    assert said["gpus"] == "1 GPU(s), as expected"
    assert said["fabric"] == "every GPU registered with the NVLink fabric"
    assert said["ib"] == "no InfiniBand port"


def test_a_gpu_missing_from_nvidia_smi_is_named_against_the_pci_bus() -> None:
    q = (H200 / "step-standard/counters/before/query-gpu.csv").read_text()
    problems, _ = N.judge(inputs(q, pci=["0000:00:06.0", "0000:00:07.0"]))
    assert problems == [N.Problem("GPU_COUNT", "nvidia-smi sees 1 GPU(s), 2 on the PCI bus (a "
                                  "GPU lost by the driver or fallen off the bus)")]
    problems, _ = N.judge(inputs(q), expected_gpus=8)
    assert problems == [N.Problem("GPU_COUNT", "nvidia-smi sees 1 GPU(s), 8 expected")]


def _edited(name: str, value: str) -> str:
    """The clean H200 capture with one field's value changed (the rest as captured)."""
    text = (H200 / "step-standard/counters/before/query-gpu.csv").read_text()
    head, row = text.splitlines()[:2]
    cols = [c.strip().split(" [")[0] for c in head.split(",")]
    cells = row.split(", ")
    cells[cols.index(name)] = value
    return head + "\n" + ", ".join(cells) + "\n"


@pytest.mark.parametrize(("field", "value", "code", "words"), [
    ("ecc.errors.uncorrected.volatile.total", "2", "ECC_UNCORRECTABLE",
     "GPU 0 has 2 uncorrectable ECC error(s) since the driver loaded"),
    ("remapped_rows.pending", "Yes", "REMAPPED_ROWS",
     "GPU 0 memory: row remapping pending (takes effect at the next GPU reset)"),
    ("remapped_rows.failure", "Yes", "REMAPPED_ROWS", "GPU 0 memory: a row remapping failed"),
    ("retired_pages.pending", "Yes", "RETIRED_PAGES_PENDING",
     "GPU 0 has retired pages pending: the GPU needs a reset before its memory can be "
     "trusted"),
])
def test_memory_errors_are_problems(field: str, value: str, code: str, words: str) -> None:
    problems, _ = N.judge(inputs(_edited(field, value)))
    assert problems == [N.Problem(code, words)]


def test_rows_remapped_without_a_failure_are_not_a_problem() -> None:
    """A row remapped for an uncorrectable error and working is the card's normal wear."""
    assert N.judge(inputs(_edited("remapped_rows.uncorrectable", "3")))[0] == []


def test_a_field_the_driver_refuses_is_dropped_and_the_query_repeated() -> None:
    asked: list[list[str]] = []

    def runner(argv: Sequence[str], timeout: float) -> N.Ran:
        asked.append(list(argv))
        if "remapped_rows.pending" in argv[1]:
            return N.Ran(2, 'Field "remapped_rows.pending" is not a valid field to query.\n', "")
        return ok("index, uuid\n0, GPU-1\n")

    ran = N.query_gpus(runner, 5.0)
    assert ran.rc == 0 and len(asked) == 2
    assert "remapped_rows.pending" not in asked[1][1] and "remapped_rows.failure" in asked[1][1]


def test_a_hung_or_failing_nvidia_smi_is_a_problem() -> None:
    hung = N.Inputs(N.Ran(None, "", "", timed_out=True), None, None, None, "", [], [])
    assert codes(N.judge(hung)[0]) == ["NVIDIA_SMI_HUNG"]
    bad = N.Inputs(N.Ran(15, "", "Unable to determine the device handle for GPU "
                         "0000:3B:00.0: Unknown Error\n"), None, None, None, "", [], [])
    assert N.judge(bad)[0] == [N.Problem("NVIDIA_SMI_FAILED", "nvidia-smi failed (exit 15): "
                                         "Unable to determine the device handle for GPU "
                                         "0000:3B:00.0: Unknown Error")]


# ------------------------------------------------------------------- Xid


KERNEL_LOGS = ["dmesg-T_h100-xid119-gsp_gpud.log", "dmesg-decode-iso_nccl-segfault_gpud.log",
               "dmesg_fallen-off-bus-no-xid_nvsentinel155.txt",
               "dmesg_xid79-fallen-off-bus-sxid_gpud-readme-derived.txt",
               "journal-grep_xid45-after-149_ogkm1150.txt", "syslog-grep_a100-xid63_mle.txt",
               "xid-one-line-fallen-off-bus_gpud-kmsg-test.txt"]


@pytest.mark.parametrize("name", KERNEL_LOGS)
def test_the_node_and_the_controller_read_the_same_xids(name: str) -> None:
    text = (PUBLIC / name).read_text()
    events, gone = N.xid_events(text)
    facts = parse_kernel_log(text)
    assert [(e.xid, e.pci, e.bad) for e in events] == [(e.xid, e.pci, e.bad)
                                                       for e in facts.events]
    assert len(gone) == len(facts.fallen_off_bus)


def test_a_bad_xid_since_boot_is_one_line_per_gpu_and_xid() -> None:
    problems, _ = N.judge(inputs(None, log=(PUBLIC / "dmesg-T_h100-xid119-gsp_gpud.log")
                                 .read_text()))
    assert codes(problems) == ["GPU_XID"]
    assert problems[0].message.startswith("Xid 119 (GSP RPC timeout) on 0000:")
    assert "times)" in problems[0].message


def test_an_xid_caused_by_a_link_error_is_the_link_s() -> None:
    """Xid 45 is an application's cleanup, unless it says it cleans up after Xid 149."""
    problems, _ = N.judge(inputs(None, log=(PUBLIC / "journal-grep_xid45-after-149_ogkm1150"
                                            ".txt").read_text()))
    assert set(codes(problems)) == {"GPU_XID"}
    assert all(p.message.startswith("Xid 45 ") for p in problems)


def test_a_gpu_fallen_off_the_bus_without_an_xid_is_a_problem() -> None:
    problems, _ = N.judge(inputs(None, log=(PUBLIC / "dmesg_fallen-off-bus-no-xid_"
                                            "nvsentinel155.txt").read_text()))
    assert codes(problems) == ["GPU_FELL_OFF_BUS"]


def test_an_application_xid_and_an_unreadable_log_are_not_problems() -> None:
    log = "[  812.3] NVRM: Xid (PCI:0000:3b:00): 13, pid=4242, name=python, Graphics Exception\n"
    problems, notes = N.judge(inputs(None, log=log))
    assert problems == [] and N.Note("xid", "application or driver Xid(s) since boot, not "
                                            "the GPU's: 13") in notes
    problems, notes = N.judge(inputs(None))
    assert problems == [] and N.Note("xid", "not checked: the kernel log is not readable "
                                            "(dmesg: not permitted)") in notes


# ------------------------------------------------------------------- NVLink fabric


@pytest.mark.parametrize(("path", "problem"), [
    (PUBLIC / "nvidia-smi-q_fabric-in-progress_gpu-operator.txt", "State In Progress"),
    (PUBLIC / "nvidia-smi-q_fabric-grep-C3-unhealthy_dra-driver.txt",
     "Health Summary Unhealthy"),
    (H200X2_Q, None),
])
def test_the_fabric_is_judged_as_preflight_judges_it(path: Path, problem: str | None) -> None:
    text = path.read_text()
    fabrics = N.fabric_of(text)
    assert fabrics and {N.fabric_problem(f.state, f.status, f.summary) for f in fabrics} == \
        {problem}
    controller = parse_nvidia_smi_q(text)
    assert {g.fabric.problem for g in controller.gpus if g.fabric is not None} == {problem}


def test_a_fabric_not_registered_is_a_problem_naming_the_gpu() -> None:
    q = (H200 / "step-standard/counters/before/query-gpu.csv").read_text()
    smi_q = H200X2_Q.read_text().replace("Completed", "In Progress", 1)
    problems, _ = N.judge(inputs(q, smi_q=smi_q))
    assert problems == [N.Problem("FABRIC_STATE", "GPU 0 not registered with the NVLink "
                                  "fabric: State In Progress, Status Success (check "
                                  "nvidia-fabricmanager)")]


# ------------------------------------------------------------------- sysfs


def _port(root: Path, hca: str, port: str, state: str, layer: str) -> None:
    d = root / "class" / "infiniband" / hca / "ports" / port
    d.mkdir(parents=True)
    (d / "state").write_text(state + "\n")  # as the kernel writes it: "4: ACTIVE"
    (d / "link_layer").write_text(layer + "\n")


def test_infiniband_ports_not_active_are_problems(tmp_path: Path) -> None:
    _port(tmp_path, "mlx5_0", "1", "4: ACTIVE", "InfiniBand")
    _port(tmp_path, "mlx5_1", "1", "1: DOWN", "InfiniBand")
    _port(tmp_path, "mlx5_2", "1", "1: DOWN", "Ethernet")  # an unused Ethernet port
    ports = N.ib_ports(str(tmp_path))
    assert ports[0] == N.IbPort("mlx5_0", "1", "ACTIVE", "InfiniBand")
    assert N.judge(inputs(None, ports=ports))[0] == [
        N.Problem("IB_PORT_DOWN", "mlx5_1 port 1 is DOWN, not ACTIVE")]
    assert codes(N.judge(inputs(None, ports=ports), ib_expected=2)[0]) == [
        "IB_PORT_DOWN", "IB_PORT_COUNT"]


def test_gpus_on_the_pci_bus_leave_nvswitches_and_others_out(tmp_path: Path) -> None:
    for dev, vendor, klass in (("0000:18:00.0", "0x10de", "0x030200"),  # H100 SXM: 3D
                               ("0000:3b:00.0", "0x10de", "0x030000"),  # a VGA-class card
                               ("0000:05:00.0", "0x10de", "0x068000"),  # NVSwitch: a bridge
                               ("0000:00:1f.0", "0x8086", "0x060100")):
        d = tmp_path / "bus" / "pci" / "devices" / dev
        d.mkdir(parents=True)
        (d / "vendor").write_text(vendor + "\n")
        (d / "class").write_text(klass + "\n")
    assert N.pci_gpus(str(tmp_path)) == ["0000:18:00.0", "0000:3b:00.0"]


# ------------------------------------------------------------------- drain


class Scontrol:
    """scontrol as the check calls it: `show node` answers the state, `update` records."""

    def __init__(self, state: str = "IDLE", reason: str | None = None, rc: int = 0) -> None:
        self.state, self.reason, self.rc = state, reason, rc
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], timeout: float) -> N.Ran:
        self.calls.append(list(argv))
        if argv[:3] == ["scontrol", "-o", "show"]:
            why = f" Reason={self.reason} [root@2026-12-06T08:00:00]" if self.reason else ""
            return ok(f"NodeName={argv[4]} Arch=x86_64 CoresPerSocket=1 State={self.state} "
                      f"ThreadsPerCore=1{why}\n")
        return N.Ran(self.rc, "", "" if self.rc == 0 else "slurm_update error: Access denied\n")


def test_drain_sets_the_reason_with_the_codes() -> None:
    sc = Scontrol()
    said = N.drain("gpu7", ["GPU_XID", "GPU_BUSY", "GPU_XID"], sc, 5.0)
    assert sc.calls[-1] == ["scontrol", "update", "nodename=gpu7", "state=drain",
                            "reason=gpuvet GPU_XID GPU_BUSY"]
    assert said == "drained gpu7: gpuvet GPU_XID GPU_BUSY"


def test_a_node_someone_else_drained_keeps_its_reason() -> None:
    sc = Scontrol("IDLE+DRAIN", "disk replaced, burn-in")
    said = N.drain("gpu7", ["GPU_XID"], sc, 5.0)
    assert [c[1] for c in sc.calls] == ["-o"]  # asked, never updated
    assert said == "not drained: gpu7 is already IDLE+DRAIN with the reason " \
                   "'disk replaced, burn-in'"
    again = Scontrol("IDLE+DRAIN", "gpuvet GPU_BUSY")  # its own earlier drain: updated
    N.drain("gpu7", ["GPU_XID"], again, 5.0)
    assert again.calls[-1][-1] == "reason=gpuvet GPU_XID"


def test_a_drain_refused_is_said() -> None:
    assert N.drain("gpu7", ["GPU_XID"], Scontrol(rc=1), 5.0) == \
        "could not drain gpu7: slurm_update error: Access denied"


def test_a_long_reason_is_cut_to_fit_and_counts_what_it_left_out() -> None:
    many = ["REMAPPED_ROWS", "ECC_UNCORRECTABLE", "RETIRED_PAGES_PENDING", "FABRIC_STATE",
            "IB_PORT_DOWN", "GPU_XID"]
    reason = N.drain_reason(many)
    assert len(reason) <= N.REASON_MAX
    assert reason == "gpuvet REMAPPED_ROWS ECC_UNCORRECTABLE RETIRED_PAGES_PENDING +3"
    assert N.drain_reason(["GPU_XID"]) == "gpuvet GPU_XID"


def _args(**kw: object) -> SimpleNamespace:
    base: dict[str, object] = {"gpus": None, "ib_ports": None, "skip": [], "drain": False,
                               "node": None, "timeout": 5.0, "sysfs": "/nonexistent",
                               "verbose": False}
    base.update(kw)
    return SimpleNamespace(**base)


def test_the_whole_check_on_the_busy_h100_drains_its_node(tmp_path: Path) -> None:
    """gather -> judge -> print -> drain, with the node's commands answering as the busy
    H100 did."""
    sc = Scontrol()
    answers = {"--query-gpu": (BUSY / "query-gpu.csv").read_text(),
               "--query-compute-apps": (BUSY / "compute-apps.csv").read_text(),
               "-q": H200X2_Q.read_text().split("GPU 00000000:00:07.0")[0],
               "dmesg": (BUSY / "dmesg.txt").read_text()}

    def runner(argv: Sequence[str], timeout: float) -> N.Ran:
        if argv[0] == "scontrol":
            return sc(argv, timeout)
        key = "dmesg" if argv[0] == "dmesg" else argv[1].split("=")[0]
        return ok(answers[key]) if key in answers else N.Ran(None, "", "", missing=True)

    lines: list[str] = []
    rc = N.check(_args(drain=True, sysfs=str(tmp_path)), runner=runner,
                 environ={"SLURMD_NODENAME": "gpu3"}, write=lines.append)
    assert rc == N.EXIT_PROBLEM
    assert lines == ["GPU_BUSY: GPU 0 is in use before the job: pid 4416 python3 (62314 MiB) "
                     "(62323 MiB in use)", "drained gpu3: gpuvet GPU_BUSY"]
    assert sc.calls[-1][-1] == "reason=gpuvet GPU_BUSY"


# ------------------------------------------------------------------- the real entry point


def _no_driver_path(tmp_path: Path) -> dict[str, str]:
    if any(os.access(os.path.join(d, "nvidia-smi"), os.X_OK) for d in N.SYSTEM_PATH):
        pytest.skip("this machine has nvidia-smi")
    empty = tmp_path / "sysfs"
    empty.mkdir()
    return {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}


def test_on_a_machine_without_gpus_it_says_so_in_one_line_and_exits_4(tmp_path: Path) -> None:
    env = _no_driver_path(tmp_path)
    python3 = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
    res = subprocess.run([python3, "-m", "payload", "nodecheck", "--sysfs",
                          str(tmp_path / "sysfs")], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == N.EXIT_NO_DRIVER == 4, res.stderr
    assert res.stdout.splitlines() == [
        "no NVIDIA driver (nvidia-smi not found) and no NVIDIA GPU on the PCI bus: nothing "
        "checked (exit 4)"]
    assert res.stderr == ""


def test_the_file_runs_on_its_own_and_a_gpu_expected_without_a_driver_fails(
        tmp_path: Path) -> None:
    """Copied alone (as `gpuvet nodecheck --write-script` does), it imports nothing else."""
    env = _no_driver_path(tmp_path)
    script = tmp_path / "gpuvet-nodecheck"
    shutil.copy(REPO / "payload" / "nodecheck.py", script)
    python3 = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
    res = subprocess.run([python3, str(script), "--gpus", "8", "--sysfs",
                          str(tmp_path / "sysfs"), "--skip", "xid"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == N.EXIT_PROBLEM, res.stderr
    assert res.stdout == "NVIDIA_DRIVER_MISSING: nvidia-smi not found: no NVIDIA driver, " \
                         "and 8 GPU(s) expected\n"
    bad = subprocess.run([python3, str(script), "--gpus", "eight"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60)
    assert (bad.returncode, bad.stdout) == (N.EXIT_USAGE, "")
    assert bad.stderr == "gpuvet-nodecheck: argument --gpus: 'eight' is not a count " \
                         "(0, 1, 8 ...)\n"
