"""Judging the training step's outputs: a real CPU run (tests/fixtures/train), then
the same files with one thing broken at a time, each of which must produce its
finding."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchestrator.judging.storage import storage_findings
from orchestrator.records import Finding
from orchestrator.steps.train.command import command_steps
from orchestrator.steps.train.judge import Judge, Subject
from orchestrator.steps.train.reading import PhaseOutput, read_phase
from orchestrator.steps.train.throughput import p90, peak_tflops
from orchestrator.suite import Suite, TrainParams, load_suite

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "train" / "cpu-2node-gloo"
H200_DMON = ROOT / "tests" / "fixtures" / "h200x2" / "commands" / "dmon.txt"
SUITE = load_suite(ROOT / "suites" / "train-cpu.yaml")
ORDER = {"reference": ["a", "b"], "kill": ["a", "b"], "restore": ["b", "a"]}


@pytest.fixture()
def fx(tmp_path: Path) -> Path:
    return Path(shutil.copytree(FIX, tmp_path / "fx"))


def phase(root: Path, name: str) -> PhaseOutput:
    return read_phase(name, [(n, root / name / n) for n in ORDER[name]])


def judge(root: Path, suite: Suite = SUITE, *, through: str = "restore") -> Judge:
    j = Judge("run-1", suite, Subject("cpu", None, ["a", "b"], "multi"),
              rel=lambda p: str(p.relative_to(root)))
    if not j.reference(phase(root, "reference")) or through == "reference":
        return j
    if not j.kill(phase(root, "kill")) or through == "kill":
        return j
    j.restore(phase(root, "restore"), saved_on=["a", "b"], restored_on=["b", "a"])
    return j


def edit(path: Path, fn: Callable[[dict[str, Any]], dict[str, Any] | None]) -> None:
    out = []
    for line in path.read_text().splitlines():
        ev = fn(json.loads(line))
        if ev is not None:
            out.append(json.dumps(ev))
    path.write_text("\n".join(out) + "\n")


def codes(j: Judge) -> dict[str, Finding]:
    return {f.code: f for f in j.findings}


def metrics(j: Judge) -> dict[str, float]:
    return {m.metric: m.value for m in j.measurements}


# --------------------------------------------------------------------------- the real run


def test_captured_cpu_run_restores_bit_for_bit(fx: Path) -> None:
    j = judge(fx)
    c = codes(j)
    ok = c["TRAIN_RESTORE_OK"]
    assert ok.severity == "PASS" and ok.details["exact"] is True
    assert "losses of steps 6..12 equal the reference bit for bit" in ok.message
    assert "saved on a+b, restored on b+a" in ok.message
    assert not [f for f in j.findings if f.severity in ("FAIL", "WARN")], j.findings
    assert c["TRAIN_CKPT_SKIPPED"].details["ckpt_step"] == 7
    assert "no manifest" in c["TRAIN_CKPT_SKIPPED"].message
    m = metrics(j)
    assert m["steps_lost"] == 2
    assert 0 < m["restart_s"] < 60
    assert m["ckpt_size_bytes"] > 1e6 and m["ckpt_write_gbs"] > 0
    assert m["step_time_p90_s"] >= m["step_time_s"] > 0
    assert "mfu" not in m  # a CPU run has no MFU
    assert {mm.tags.get("rank") for mm in j.measurements if mm.metric == "peak_rss_bytes"} == {0, 1}
    assert all(mm.scope == "train" and mm.suite_hash == SUITE.hash for mm in j.measurements)
    # every evidence path is relative and exists
    for f in j.findings:
        assert f.evidence and all((fx / e).is_file() for e in f.evidence), f


def test_the_restart_time_says_where_its_seconds_went(fx: Path) -> None:
    def stamp(ev: dict[str, Any]) -> dict[str, Any]:
        if ev["event"] == "start":  # what the rank program logs since the start-up was timed
            ev.update(launch_s=2.5, init_s={"import_torch": 1.25, "cuda_context": 0.0,
                                            "process_group": 0.5, "model": 0.125})
        return ev

    edit(fx / "restore" / "b" / "rank0.jsonl", stamp)  # b holds rank 0 in the restore
    [r] = [m for m in judge(fx).measurements if m.metric == "restart_s"]
    loaded = next(e for e in map(json.loads, (fx / "restore" / "b" / "rank0.jsonl").open())
                  if e["event"] == "loaded")
    warm = next(e for e in map(json.loads, (fx / "restore" / "b" / "rank0.jsonl").open())
                if e["event"] == "warmup")
    assert {k: r.tags[k] for k in ("launch_s", "init_s", "warmup_s", "verify_s", "load_s")} == {
        "launch_s": 2.5, "init_s": 1.875, "warmup_s": warm["seconds"],
        "verify_s": loaded["verify_s"], "load_s": loaded["load_s"]}
    # a run from before the start-up was timed: no launch or init part, nothing invented
    [old] = [m for m in judge(Path(shutil.copytree(FIX, fx.parent / "old"))).measurements
             if m.metric == "restart_s"]
    assert "launch_s" not in old.tags and "init_s" not in old.tags
    assert old.tags["warmup_s"] == warm["seconds"]


def test_a_changed_loss_after_restore_names_the_first_differing_step(fx: Path) -> None:
    def bump(ev: dict[str, Any]) -> dict[str, Any]:
        if ev["event"] == "step" and ev["step"] in (9, 11):
            v = float(ev["loss"]) + 1e-6
            ev.update(loss=repr(v), loss_hex=v.hex())
        return ev

    edit(fx / "restore" / "b" / "rank0.jsonl", bump)
    f = codes(judge(fx))["TRAIN_RESTORE_MISMATCH"]
    assert f.severity == "FAIL"
    assert "first differing step 9: reference loss" in f.message
    ref9 = next(json.loads(ln) for ln in (fx / "reference/a/rank0.jsonl").read_text().splitlines()
                if '"step": 9,' in ln and '"event": "step"' in ln)
    assert ref9["loss_hex"] in f.message


def test_tolerance_applies_only_where_the_run_cannot_be_exact(fx: Path) -> None:
    def nudge(ev: dict[str, Any]) -> dict[str, Any]:
        if ev["event"] == "step" and ev["step"] == 9:
            v = float(ev["loss"]) * (1 + 1e-7)
            ev.update(loss=repr(v), loss_hex=v.hex())
        return ev

    edit(fx / "restore" / "b" / "rank0.jsonl", nudge)
    tolerant = SUITE.model_copy(update={"train": SUITE.train.model_copy(
        update={"loss_tolerance": 1e-4})})
    assert "TRAIN_RESTORE_MISMATCH" in codes(judge(fx, tolerant))  # deterministic: no excuse
    with (fx / "reference" / "a" / "rank0.jsonl").open("a") as f:
        f.write(json.dumps({"event": "nondeterministic", "rank": 0, "t": 0,
                            "message": "scatter_add_ has no deterministic kernel"}) + "\n")
    ok = codes(judge(fx, tolerant))["TRAIN_RESTORE_OK"]
    assert ok.severity == "WARN" and ok.details["exact"] is False
    assert "scatter_add_" in ok.message


@pytest.mark.parametrize("part", ["model", "optimizer", "rng"])
def test_a_loaded_state_that_differs_from_the_saved_one_fails(fx: Path, part: str) -> None:
    def spoil(ev: dict[str, Any]) -> dict[str, Any]:
        if ev["event"] == "loaded":
            ev["hashes_loaded"][part] = "0" * 64
        return ev

    edit(fx / "restore" / "a" / "rank1.jsonl", spoil)
    f = codes(judge(fx))["TRAIN_RESTORE_MISMATCH"]
    assert f"rank 1: {part} state after load" in f.message


def test_a_checkpoint_whose_recorded_hashes_differ_from_the_save_fails(fx: Path) -> None:
    def spoil(ev: dict[str, Any]) -> dict[str, Any]:
        if ev["event"] == "saved" and ev["step"] == 5:
            ev["hashes"]["model"] = "f" * 64
        return ev

    edit(fx / "kill" / "a" / "rank0.jsonl", spoil)
    assert "the checkpoint's recorded hashes differ" in codes(judge(fx))[
        "TRAIN_RESTORE_MISMATCH"].message


def test_restoring_the_half_written_checkpoint_fails(fx: Path) -> None:
    def later(ev: dict[str, Any]) -> dict[str, Any] | None:
        if ev["event"] == "skip_ckpt":
            return None
        if ev["event"] == "loaded":
            ev["step"] = 7
        return ev

    for r, n in ((0, "b"), (1, "a")):
        edit(fx / "restore" / n / f"rank{r}.jsonl", later)
    f = codes(judge(fx))["TRAIN_RESTORE_MISMATCH"]
    assert "restored step 7, the last complete save was step 5" in f.message


def test_an_lr_that_is_not_the_references_fails(fx: Path) -> None:
    def lr(ev: dict[str, Any]) -> dict[str, Any]:
        if ev["event"] == "loaded":
            ev["lr_next"] = ev["lr_next"] * 2
        return ev

    edit(fx / "restore" / "b" / "rank0.jsonl", lr)
    assert "LR for step 6" in codes(judge(fx))["TRAIN_RESTORE_MISMATCH"].message


def test_no_complete_checkpoint_is_a_failed_restore(fx: Path) -> None:
    for r, n in ((0, "b"), (1, "a")):
        edit(fx / "restore" / n / f"rank{r}.jsonl",
             lambda ev: None if ev["event"] not in ("start", "warmup", "skip_ckpt") else ev)
        with (fx / "restore" / n / f"rank{r}.jsonl").open("a") as f:
            f.write(json.dumps({"event": "error", "kind": "no_checkpoint", "rank": r, "t": 0,
                                "message": "no complete checkpoint under /ck"}) + "\n")
    f = codes(judge(fx))["TRAIN_RESTORE_FAILED"]
    assert f.severity == "FAIL" and "no complete checkpoint" in f.message


# --------------------------------------------------------------------------- failures


@pytest.mark.parametrize("kind,code", [("nonfinite", "TRAIN_NAN"), ("oom", "TRAIN_OOM"),
                                       ("exception", "TRAIN_FAILED")])
def test_an_error_event_stops_the_protocol_with_its_code(fx: Path, kind: str, code: str
                                                         ) -> None:
    ref = fx / "reference" / "a" / "rank0.jsonl"
    edit(ref, lambda ev: None if ev["event"] == "end" or ev.get("step", 0) > 3 else ev)
    with ref.open("a") as f:
        f.write(json.dumps({"event": "error", "kind": kind, "rank": 0, "t": 0, "step": 3,
                            "type": "RuntimeError", "message": "loss is nan at step 3"}) + "\n")
    j = judge(fx)
    f = codes(j)[code]
    assert f.severity == "FAIL" and f.evidence == ["reference/a/rank0.jsonl"]
    assert "TRAIN_KILLED" not in codes(j)  # no kill or restore after a broken reference


def test_a_checkpoint_directory_that_fills_during_the_save_is_named(fx: Path) -> None:
    """The kill phase's first save runs out of space (a small tmpfs): the finding says
    which save, which directory and the error, not a traceback's first line, and the
    verdict puts it on the setup's side."""
    from orchestrator.analysis.verdict import SETUP_CODES

    kill = fx / "kill" / "a" / "rank0.jsonl"
    edit(kill, lambda ev: None if ev["event"] not in ("start", "warmup", "step", "saving")
         or ev.get("step", 0) > 5 else ev)
    with kill.open("a") as f:
        f.write(json.dumps({
            "event": "error", "kind": "no_space", "rank": 0, "t": 0,
            "type": "CheckpointException",
            "message": "CheckpointException ranks:dict_keys([0])\nTraceback (most recent "
                       "call last): (RANK 0)\n  File ...\nOSError: [Errno 28] No space left "
                       "on device",
            "cause": "OSError: [Errno 28] No space left on device"}) + "\n")
    argv = json.loads((fx / "kill" / "a" / "supervise.json").read_text())["argv"]
    where = argv[argv.index("--ckpt-dir") + 1]
    f = codes(judge(fx))["TRAIN_CKPT_NO_SPACE"]
    assert f.severity == "FAIL" and f.evidence == ["kill/a/rank0.jsonl"]
    assert f.message == (f"[multi] kill: no space left while saving step "
                         f"{SUITE.train.ckpt_step} to {where} (rank 0 on a: OSError: [Errno "
                         "28] No space left on device); the protocol keeps two checkpoints "
                         "there (CKPT_SPACE_LOW says how much they take)")
    assert "TRAIN_CKPT_NO_SPACE" in SETUP_CODES


def test_a_node_whose_rank_was_killed_from_outside_is_named_not_its_peer(fx: Path) -> None:
    """A multi-node reference where b's rank was SIGKILLed from outside (a node that died):
    b says nothing, a's rank fails with "connection reset by peer". The finding names b and
    the signal, with a's error as what followed."""
    ref = fx / "reference"
    edit(ref / "b" / "rank1.jsonl", lambda ev: None if ev["event"] == "end"
         or ev.get("step", 0) > 3 else ev)
    edit(ref / "a" / "rank0.jsonl", lambda ev: None if ev["event"] == "end"
         or ev.get("step", 0) > 3 else ev)
    with (ref / "a" / "rank0.jsonl").open("a") as f:
        f.write(json.dumps(dict(PEER_GONE, rank=0, cause="RuntimeError: [gloo] Read error: "
                                "Connection reset by peer")) + "\n")
    for node, rc in (("a", 1), ("b", -9)):
        sup = json.loads((ref / node / "supervise.json").read_text())
        (ref / node / "supervise.json").write_text(json.dumps(dict(sup, rc=rc)))
    fs = [f for f in judge(fx).findings if f.code == "TRAIN_FAILED"]
    assert len(fs) == 1 and fs[0].details["died"] == ["b"]
    assert fs[0].message.startswith("[multi] reference: the job on b died of signal 9 "
                                     "(SIGKILL) without an error of its own")
    assert fs[0].message.endswith("; then rank 0 on a: RuntimeError: [gloo] Read error: "
                                  "Connection reset by peer")
    assert fs[0].evidence == ["reference/b/torchrun.stderr"]


def test_the_rank_names_the_error_it_died_of() -> None:
    """DCP wraps a writer thread's OSError in a CheckpointException (a BaseException)
    whose text is the thread's traceback: the kind and the cause come from its last line."""
    from payload.train.loop import error_kind

    class CheckpointException(BaseException):
        pass

    wrapped = CheckpointException("CheckpointException ranks:dict_keys([0])\nTraceback "
                                  "(most recent call last):\n  File \"x.py\", line 1\n"
                                  "OSError: [Errno 28] No space left on device\n")
    assert error_kind(wrapped) == ("no_space", "OSError: [Errno 28] No space left on device")
    assert error_kind(OSError(28, "No space left on device"))[0] == "no_space"
    assert error_kind(RuntimeError("CUDA out of memory. Tried to allocate 2 GiB"))[0] == "oom"
    assert error_kind(RuntimeError("boom")) == ("exception", "boom")
    assert error_kind(RuntimeError()) == ("exception", "RuntimeError")


def test_nccl_warn_and_collective_timeout_lines(fx: Path) -> None:
    (fx / "reference" / "b" / "torchrun.stderr").write_text(
        "node2:1:1 [0] NCCL INFO Bootstrap\n"
        "node2:1:9 [0] transport/net_socket.cc:474 NCCL WARN NET/Socket : peer closed\n"
        "[rank1]:[E] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, "
        "OpType=ALLREDUCE) ran for 300000 milliseconds before timing out.\n")
    c = codes(judge(fx, through="reference"))
    assert c["TRAIN_NCCL_WARN"].severity == "WARN" and c["TRAIN_NCCL_WARN"].details["line"] == 2
    assert c["TRAIN_NCCL_TIMEOUT"].severity == "FAIL"
    assert "torchrun.stderr:3" in c["TRAIN_NCCL_TIMEOUT"].message


PEER_GONE = {"event": "error", "kind": "exception", "rank": 1, "t": 0, "type": "RuntimeError",
             "message": "[gloo/transport/tcp/pair.cc:553] Connection closed by peer"}


def test_a_peer_that_saw_the_kill_land_on_the_other_node_is_no_failure(fx: Path) -> None:
    # rank 1 (node b) had logged the kill point, the commit of step 7, when rank 0's node was
    # killed first: its collective failed before its own supervisor's SIGKILL
    with (fx / "kill" / "b" / "rank1.jsonl").open("a") as f:
        f.write(json.dumps(PEER_GONE) + "\n")
    (fx / "kill" / "b" / "torchrun.stdout").write_text(
        "b:1:9 [0] misc/socket.cc:72 NCCL WARN socketProgress: Connection closed by remote "
        "peer\n")
    c = codes(judge(fx))
    assert "TRAIN_FAILED" not in c and "TRAIN_NCCL_WARN" not in c
    assert c["TRAIN_RESTORE_OK"].severity == "PASS"
    assert c["TRAIN_KILLED"].details["peers_saw_kill"] == ["rank 1 on b saw it (RuntimeError)"]
    assert c["TRAIN_KILLED"].message.endswith("; rank 1 on b saw it (RuntimeError) before its "
                                              "own kill")
    # the same line outside the kill phase is a warning
    (fx / "reference" / "b" / "torchrun.stdout").write_text(
        (fx / "kill" / "b" / "torchrun.stdout").read_text())
    assert codes(judge(fx, through="reference"))["TRAIN_NCCL_WARN"].severity == "WARN"


def test_an_error_before_the_kill_point_is_a_failure(fx: Path) -> None:
    # the same error logged before rank 1 reached the commit of step 7: the job broke by itself
    edit(fx / "kill" / "b" / "rank1.jsonl",
         lambda ev: None if ev["event"] in ("commit", "saving", "saved") or
         ev.get("step", 0) > 6 else ev)
    with (fx / "kill" / "b" / "rank1.jsonl").open("a") as f:
        f.write(json.dumps(PEER_GONE) + "\n")
    f = codes(judge(fx))["TRAIN_FAILED"]
    assert f.severity == "FAIL" and "kill: RuntimeError on rank 1 on b" in f.message


# rank 1's last event before its error: at the kill point (an echo), or one event short of
# it (the job broke by itself); the kill is at step 7 (K=5, kill_offset 2)
KILL_POINTS = [("after-step", ("step", 7), ("step", 6)),
               ("mid-save", ("saving", 7), ("step", 7)),
               ("before-manifest", ("commit", 7), ("saving", 7))]


@pytest.mark.parametrize("kill,at,short", KILL_POINTS)
def test_each_kill_point_tells_an_echo_from_a_failure(fx: Path, kill: str,
                                                      at: tuple[str, int],
                                                      short: tuple[str, int]) -> None:
    suite = SUITE.model_copy(update={"train": SUITE.train.model_copy(update={"kill": kill})})
    rank1 = fx / "kill" / "b" / "rank1.jsonl"
    original = rank1.read_text()
    for last, echo in ((at, True), (short, False)):
        evs = [json.loads(line) for line in original.splitlines()]
        cut = next(i for i, e in enumerate(evs) if (e["event"], e.get("step")) == last)
        rank1.write_text("".join(json.dumps(e) + "\n" for e in [*evs[:cut + 1], PEER_GONE]))
        c = codes(judge(fx, suite, through="kill"))
        assert ("TRAIN_FAILED" not in c) is echo, (kill, last)
        assert ("peers_saw_kill" in c["TRAIN_KILLED"].details if echo else
                "TRAIN_KILLED" not in c), (kill, last)


def test_an_error_past_the_kill_point_with_no_kill_is_a_failure(fx: Path) -> None:
    # nobody was SIGKILLed: an error after the kill point is the job's own
    for n in ("a", "b"):
        sup = json.loads((fx / "kill" / n / "supervise.json").read_text())
        sup.update(killed=False, kill_time=None, kill_event=None, rc=1)
        (fx / "kill" / n / "supervise.json").write_text(json.dumps(sup))
    with (fx / "kill" / "b" / "rank1.jsonl").open("a") as f:
        f.write(json.dumps(PEER_GONE) + "\n")
    f = codes(judge(fx))["TRAIN_FAILED"]
    assert "kill: RuntimeError on rank 1 on b: [gloo" in f.message


def test_a_kill_that_never_came_fails(fx: Path) -> None:
    for n in ("a", "b"):
        doc = json.loads((fx / "kill" / n / "supervise.json").read_text())
        doc.update(killed=False, kill_time=None, rc=0)
        (fx / "kill" / n / "supervise.json").write_text(json.dumps(doc))
    assert "the job ended without finishing" in codes(judge(fx))["TRAIN_FAILED"].message
    for n, r in (("a", 0), ("b", 1)):  # it ran to the end: the kill point was never reached
        with (fx / "kill" / n / f"rank{r}.jsonl").open("a") as f:
            f.write(json.dumps({"event": "end", "rank": r, "t": 0, "steps": 12}) + "\n")
    assert codes(judge(fx))["TRAIN_KILL_MISSED"].severity == "FAIL"


def test_a_missing_supervisor_document_fails(fx: Path) -> None:
    (fx / "reference" / "b" / "supervise.json").unlink()
    assert "no supervisor document from b" in codes(judge(fx))["TRAIN_FAILED"].message


def test_a_loss_that_does_not_fall(fx: Path) -> None:
    def flat(ev: dict[str, Any]) -> dict[str, Any]:
        if ev["event"] == "step":
            ev.update(loss="5.5", loss_hex=(5.5).hex())
        return ev

    edit(fx / "reference" / "a" / "rank0.jsonl", flat)
    assert codes(judge(fx, through="reference"))["TRAIN_LOSS_NOT_DECREASING"].severity == "WARN"


def test_an_input_pipeline_that_eats_the_step(fx: Path) -> None:
    def slow(ev: dict[str, Any]) -> dict[str, Any]:
        if ev["event"] == "step":
            ev["data_wait_s"] = ev["step_time_s"] * 0.4
        return ev

    edit(fx / "reference" / "a" / "rank0.jsonl", slow)
    f = codes(judge(fx, through="reference"))["TRAIN_INPUT_BOUND"]
    assert "40%" in f.message


# --------------------------------------------------------------------------- GPU runs


def as_gpu(root: Path, dmon: str | None) -> None:
    """Make the captured reference look like a GPU run sampled by dmon."""
    t0 = 1000.0
    for n, r in (("a", 0), ("b", 1)):
        path = root / "reference" / n / f"rank{r}.jsonl"

        def gpu(ev: dict[str, Any], r: int = r) -> dict[str, Any]:
            if ev["event"] == "start":
                ev.update(device="cuda:0", versions={**ev["versions"], "gpu_name": "NVIDIA H200"})
            if ev["event"] == "step":
                ev.update(t=t0 + ev["step"], step_time_s=1.0, data_wait_s=0.001, tokens=16384,
                          fwd_s=0.30 if r == 1 else 0.15)
            if ev["event"] in ("step", "end"):
                ev.pop("rss_peak", None)
                ev.update(mem_alloc_peak=40e9, mem_reserved_peak=50e9)
            return ev

        edit(path, gpu)
        doc = json.loads((root / "reference" / n / "supervise.json").read_text())
        doc["telemetry"] = ({"source": "dmon", "file": "dmon.txt", "started": t0,
                             "interval_s": 1, "note": None} if dmon is not None else
                            {"source": None, "file": None, "note": "dmon exited with 3: x"})
        (root / "reference" / n / "supervise.json").write_text(json.dumps(doc))
        if dmon is not None:
            (root / "reference" / n / "dmon.txt").write_text(dmon)


def idle_dmon(repeat: int) -> str:
    """The capture (two idle H200s, 4 samples each), its sample rows repeated."""
    lines = H200_DMON.read_text().splitlines()
    head = [ln for ln in lines if ln.startswith("#")]
    body = [ln for ln in lines if ln.strip() and not ln.startswith("#")]
    return "\n".join(head + body * repeat) + "\n"


def test_gpu_run_gets_mfu_from_the_peak_table_and_idle_gpus_are_named(fx: Path) -> None:
    as_gpu(fx, idle_dmon(2))  # 8 samples per GPU inside the steps
    j = judge(fx, through="reference")
    m = {mm.metric: mm for mm in j.measurements}
    tps = 16384 / 1.0
    flops = json.loads((fx / "reference/a/rank0.jsonl").read_text().splitlines()[0])[
        "flops_per_token"]
    assert m["tokens_per_s_per_gpu"].value == tps
    assert m["mfu"].value == pytest.approx(flops * tps / 989e12)
    assert m["mfu"].tags["peak_source"] == "gpu_peaks.yaml 'H200'"
    assert m["peak_mem_allocated_bytes"].value == 40e9
    idle = [f for f in j.findings if f.code == "TRAIN_GPU_IDLE"]
    assert {f.details["gpu"] for f in idle} == {0, 1}
    assert all(f.evidence[0].endswith("dmon.txt") for f in idle)
    assert m["gpu_power_w"].value == 80 and m["gpu_temp_max_c"].value in (33, 34)
    strag = codes(j)["TRAIN_STRAGGLER"]
    assert strag.details["rank"] == 1 and strag.details["node_of_rank"] == "b"


def test_throttling_in_the_training_window_is_reported(fx: Path) -> None:
    dmon = ("#Time        gpu    pwr  gtemp     sm   pclk   mclk  pviol  tviol\n"
            "#HH:MM:SS    Idx      W      C      %    MHz    MHz      %   bool\n"
            + "".join(f"12:00:{k:02d}      0    690     71     99   1980   3201      "
                      f"{40 if k == 4 else 0}      0\n" for k in range(14)))
    as_gpu(fx, dmon)
    c = codes(judge(fx, through="reference"))
    assert "TRAIN_GPU_IDLE" not in c
    f = c["TRAIN_THROTTLED"]
    assert "pviol" in f.message and f.details["line"] == 7


def throttled_dmon(pclk: int, tviol: int = 0) -> str:
    """14 samples of GPU 0; three (lines 7-9) at the power limit (pviol 40), their SM
    clocks pclk - 100, pclk + 300, pclk: a median of pclk."""
    clocks = {4: pclk - 100, 5: pclk + 300, 6: pclk}
    return ("#Time        gpu    pwr  gtemp     sm   pclk   mclk  pviol  tviol\n"
            "#HH:MM:SS    Idx      W      C      %    MHz    MHz      %   bool\n"
            + "".join(f"12:00:{k:02d}      0    690     71     99   "
                      f"{clocks.get(k, 1980)}   3201      "
                      f"{40 if 4 <= k <= 6 else 0}      {tviol if k == 5 else 0}\n"
                      for k in range(14)))


def with_limits(root: Path, limits: dict[str, Any] | None) -> None:
    for n in ("a", "b"):
        doc = json.loads((root / "reference" / n / "supervise.json").read_text())
        doc["telemetry"]["limits"] = limits
        (root / "reference" / n / "supervise.json").write_text(json.dumps(doc))


H200_LIMITS = {"index": 0, "max_sm_clock_mhz": 1980.0, "power_limit_w": 700.0,
               "default_power_limit_w": 700.0}


@pytest.mark.parametrize("pclk,tviol,limit,severity,tail", [
    # at its full limit, the clock near its maximum: the rated power of dense work
    (1800, 0, {}, "INFO", "; at its full power limit (700 W) with the SM clock at 1800 of 1980 "
                          "MHz: its rated power, not a fault"),
    (1584, 0, {}, "INFO", "at 1584 of 1980 MHz"),  # exactly 80% of the maximum
    (1583, 0, {}, "WARN", "; held at its 700 W power limit with the SM clock at 1583 of 1980 MHz"),
    (1800, 0, {"power_limit_w": 500.0}, "WARN",
     "; its power limit is 500 W, below its default 700 W"),
    (1800, 1, {}, "WARN", "(pviol, line 7)"),  # thermal: always a warning
    (1800, 0, None, "WARN", "(pviol, line 7)"),  # limits unknown: as before
])
def test_a_power_limit_alone_is_told_from_a_gpu_held_back(
        fx: Path, pclk: int, tviol: int, limit: dict[str, float] | None, severity: str,
        tail: str) -> None:
    as_gpu(fx, throttled_dmon(pclk, tviol))
    with_limits(fx, None if limit is None else {"error": None,
                                                "gpus": [{**H200_LIMITS, **limit}]})
    f = codes(judge(fx, through="reference"))["TRAIN_THROTTLED"]
    assert f.severity == severity and tail in f.message, f.message
    assert f.details["samples"] == 3 and f.details["line"] == 7
    if limit is not None and not tviol:
        assert f.details["sm_clock_mhz"] == pclk and f.details["max_sm_clock_mhz"] == 1980
    else:
        assert "sm_clock_mhz" not in f.details


def test_no_telemetry_is_said_and_an_unknown_gpu_gets_no_mfu(fx: Path) -> None:
    as_gpu(fx, None)
    for n, r in (("a", 0), ("b", 1)):
        edit(fx / "reference" / n / f"rank{r}.jsonl", lambda ev: {
            **ev, "versions": {**ev["versions"], "gpu_name": "Tesla K80"}}
            if ev["event"] == "start" else ev)
    j = judge(fx, through="reference")
    assert "mfu" not in metrics(j)
    c = codes(j)
    assert "not in gpu_peaks.yaml" in c["TRAIN_NO_MFU"].message
    assert "dmon exited with 3" in c["TRAIN_NO_TELEMETRY"].message


def test_peak_table() -> None:
    p = TrainParams()
    assert peak_tflops("NVIDIA H100 80GB HBM3", "x", p)[0] == 989
    assert peak_tflops("NVIDIA H100 PCIe", "x", p)[0] == 756
    assert peak_tflops("NVIDIA H100 NVL", "x", p)[0] == 835
    assert peak_tflops("NVIDIA H200", "x", p)[0] == 989
    assert peak_tflops("NVIDIA A100-SXM4-80GB", "x", p)[0] == 312
    assert peak_tflops("NVIDIA L40S", "x", p)[0] == 362
    assert peak_tflops("NVIDIA L4", "x", p)[0] == 121
    assert peak_tflops("NVIDIA A10G", "x", p)[0] is None
    assert peak_tflops("Tesla V100-SXM2-16GB", "x", p)[0] is None
    own = TrainParams(peak_tflops={"x": 500.0})
    assert peak_tflops("NVIDIA H200", "x", own) == (500.0, "suite train.peak_tflops.x")


def test_p90_is_nearest_rank() -> None:
    assert p90([float(i) for i in range(1, 11)]) == 9.0
    assert p90([3.0]) == 3.0


# --------------------------------------------------------------------------- storage


def _probe_doc(fstype: str, source: str, model: str | None = None,
               real: str = "/ck") -> dict[str, Any]:
    return {"ckpt_dir": "/ck", "block_model": model,
            "path": {"realpath": real,
                     "mount": {"fstype": fstype, "source": source, "mount_point": "/"}}}


@pytest.mark.parametrize("doc,reason", [
    (_probe_doc("overlay", "overlay"), "ephemeral-fs"),
    (_probe_doc("tmpfs", "tmpfs"), "ephemeral-fs"),
    (_probe_doc("aufs", "none"), "ephemeral-fs"),
    # a scratch path on a disk (the real path counts: /ck may be a link into /tmp)
    (_probe_doc("ext4", "/dev/vda", real="/tmp/ckpt"), "scratch-path"),
    (_probe_doc("xfs", "/dev/sdb1", real="/mnt/resource/ck"), "scratch-path"),
    (_probe_doc("ext4", "/dev/vda", real="/var/tmp/ckpt"), None),  # kept across reboots
    (_probe_doc("ext4", "/dev/vda", real="/home/u/tmp/ckpt"), None),
    (_probe_doc("xfs", "/dev/nvme1n1", "Amazon EC2 NVMe Instance Storage"), "instance-store"),
    (_probe_doc("ext4", "/dev/vda"), None),
    (_probe_doc("nfs4", "fs:/export"), None),
])
def test_checkpoint_directories_that_die_with_the_instance(tmp_path: Path, doc: dict[str, Any],
                                                           reason: str | None) -> None:
    probe = tmp_path / "probe.json"
    probe.write_text("{}")
    j = Judge("r", SUITE, Subject("p", "n1", ["n1"], "single"), rel=lambda p: p.name)
    storage_findings(j, "n1", doc, probe, configured=True)
    got = [f for f in j.findings if f.code == "CKPT_NOT_PERSISTENT"]
    assert [f.details["reason"] for f in got] == ([reason] if reason else [])
    if reason:
        assert got[0].evidence == ["probe.json"] and doc["path"]["mount"]["fstype"] in \
            got[0].message
    storage_findings(j, "n1", doc, probe, configured=False)
    assert any(f.code == "CKPT_DIR_DEFAULT" for f in j.findings)


# --------------------------------------------------------------------------- your own command


def _command_phase(root: Path, phase: str, lines: str, **sup: Any) -> PhaseOutput:
    d = root / phase / "n1"
    d.mkdir(parents=True)
    (d / "command.stdout").write_text(lines)
    (d / "command.stderr").write_text("")
    doc = {"rc": 0, "wall_s": 3.0, "start_time": 0, "end_time": 3, "killed": False,
           "telemetry": {"note": "no GPU telemetry: nvidia-smi not found"}, **sup}
    (d / "supervise.json").write_text(json.dumps(doc))
    return read_phase(phase, [("n1", d)])


def test_your_command_resumes_at_the_last_saved_step(tmp_path: Path) -> None:
    suite = Suite(train=TrainParams(command="python train.py", resume_flag="--resume",
                                    command_kill_after_step=6))
    j = Judge("r", suite, Subject("p", "n1", ["n1"], "single"), rel=lambda p: p.name)
    assert j.command(_command_phase(tmp_path, "reference", "step=1\nstep=2\n"))
    assert j.command(_command_phase(tmp_path, "kill", "step=1\nsaved step=4\nstep=5\nstep=6\n",
                                    killed=True, rc=-9))
    assert j.command(_command_phase(tmp_path, "restore", "resuming\nstep=5\nstep=6\n"))
    ok = codes(j)["TRAIN_RESTORE_OK"]
    assert "resumed at step=5 (last saved 4)" in ok.message
    assert metrics(j)["steps_lost"] == 1
    j2 = Judge("r", suite, Subject("p", "n1", ["n1"], "single"), rel=lambda p: p.name)
    j2.command(_command_phase(tmp_path / "2", "kill", "saved step=4\nstep=6\n", killed=True))
    j2.command(_command_phase(tmp_path / "2", "restore", "step=1\nstep=2\n"))
    assert "started again at step=1, expected step=4" in codes(j2)[
        "TRAIN_RESTORE_MISMATCH"].message
    assert command_steps(tmp_path / "nope") == ([], [])


def test_a_kill_that_came_after_the_second_save_expects_that_save(fx: Path) -> None:
    """The kill meant for the open save came late: that save is complete, and a correct
    restore loads it, not step K."""
    kill = fx / "kill" / "a" / "rank0.jsonl"
    saved5 = next(json.loads(ln) for ln in kill.read_text().splitlines()
                  if '"event": "saved"' in ln)
    with kill.open("a") as f:
        f.write(json.dumps({**saved5, "step": 7}) + "\n")
    c = codes(judge(fx))
    assert "restored step 5, the last complete save was step 7" in c[
        "TRAIN_RESTORE_MISMATCH"].message
    late = [f for f in judge(fx).findings if f.code == "TRAIN_CKPT_SKIPPED"]
    assert any(f.details.get("ckpt_step") == 7 for f in late)  # the fixture's own skip


def test_too_few_samples_do_not_make_an_idle_verdict(fx: Path) -> None:
    as_gpu(fx, idle_dmon(1))  # 4 samples per GPU: compile or a save can fill them
    j = judge(fx, through="reference")
    assert not [f for f in j.findings if f.code == "TRAIN_GPU_IDLE"]
    short = [f for f in j.findings if f.code == "TRAIN_TELEMETRY_SHORT"]
    assert {f.details["gpu"] for f in short} == {0, 1}


def test_samples_are_placed_by_the_time_dmon_printed() -> None:
    from orchestrator.judging.telemetry import sample_times

    # dmon skipped 10:00:03 and printed 10:00:05 twice: counting would drift by a second
    tods = [36001, 36002, 36004, 36005, 36005, 36007]
    samples = [{"tod": t} for t in tods]
    assert sample_times(samples, 500.0, 1.0) == [500.0, 501.0, 503.0, 504.0, 504.0, 506.0]
    # across midnight the printed clock wraps; the samples do not go back in time
    wrap = [{"tod": 86399}, {"tod": 0}, {"tod": 1}]
    assert sample_times(wrap, 10.0, 1.0) == [10.0, 11.0, 12.0]
    # no printed time (dmon without -o T): one interval per sample
    assert sample_times([{}, {}], 10.0, 2.0) == [12.0, 14.0]


def _fwd(root: Path, slow: float, fast: float = 0.25) -> None:
    """Every step's forward time: rank 1 (node b) `slow`, rank 0 `fast`."""
    for n, r in (("a", 0), ("b", 1)):
        def fwd(ev: dict[str, Any], r: int = r) -> dict[str, Any]:
            if ev["event"] == "step":
                ev["fwd_s"] = slow if r == 1 else fast
            return ev

        edit(root / "reference" / n / f"rank{r}.jsonl", fwd)


def test_a_rank_exactly_at_the_straggler_ratio_is_a_straggler(fx: Path) -> None:
    """The suite's ratio is the first one reported (`>=`), and just under it is not."""
    ratio = SUITE.train.thresholds.straggler_ratio
    as_gpu(fx, idle_dmon(2))
    _fwd(fx, 0.25 * ratio)  # x 1/4 and / 1/4 are exact: the ratio is the suite's to the bit
    strag = codes(judge(fx, through="reference"))["TRAIN_STRAGGLER"]
    assert strag.details["ratio"] == ratio and strag.details["rank"] == 1
    assert f"({ratio:.2f}x)" in strag.message and "rank 1 on b is slow" in strag.message
    _fwd(fx, 0.25 * ratio * (1 - 1e-9))
    assert "TRAIN_STRAGGLER" not in codes(judge(fx, through="reference"))


def _bump_restored(root: Path, steps: tuple[int, ...], factor: float) -> None:
    def bump(ev: dict[str, Any]) -> dict[str, Any]:
        if ev["event"] == "step" and ev["step"] in steps:
            v = float(ev["loss"]) * factor
            ev.update(loss=repr(v), loss_hex=v.hex())
        return ev

    edit(root / "restore" / "b" / "rank0.jsonl", bump)


def test_the_last_step_after_a_restore_is_compared_too(fx: Path) -> None:
    """Step N (the suite's last, 12) is the one a `range(K + 1, N)` would never look at."""
    n = SUITE.train.steps
    _bump_restored(fx, (n,), 1 + 1e-6)
    f = codes(judge(fx))["TRAIN_RESTORE_MISMATCH"]
    assert f.severity == "FAIL" and f"first differing step {n}: reference loss" in f.message


def test_a_restored_run_that_stops_before_the_last_step_is_a_mismatch(fx: Path) -> None:
    n = SUITE.train.steps
    edit(fx / "restore" / "b" / "rank0.jsonl",
         lambda ev: None if ev["event"] == "step" and ev["step"] == n else ev)
    f = codes(judge(fx))["TRAIN_RESTORE_MISMATCH"]
    assert f"the restored run stopped before step {n}" in f.message


def test_a_last_step_within_the_tolerance_is_not_called_exact(fx: Path) -> None:
    """Only the last step differs, within the tolerance, on a run that cannot be exact: a
    WARN that says so, never a PASS "bit for bit"."""
    _bump_restored(fx, (SUITE.train.steps,), 1 + 1e-7)
    tolerant = SUITE.model_copy(update={"train": SUITE.train.model_copy(
        update={"loss_tolerance": 1e-4})})
    with (fx / "reference" / "a" / "rank0.jsonl").open("a") as f:
        f.write(json.dumps({"event": "nondeterministic", "rank": 0, "t": 0,
                            "message": "index_add_ has no deterministic kernel"}) + "\n")
    ok = codes(judge(fx, tolerant))["TRAIN_RESTORE_OK"]
    assert ok.severity == "WARN" and ok.details["exact"] is False
    assert "within 0.0001 of the reference" in ok.message
