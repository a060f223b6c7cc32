"""The training step's judge (orchestrator/steps/train/*.py) on exact inputs, written for
the mutants `make mutation` found surviving test_train_judge.py: the captured CPU run's
every finding and measurement whole, its numbers worked out from the fixture's own files,
then one thing changed at a time."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchestrator.steps.train.throughput import p90
from orchestrator.suite import Suite, TrainParams
from tests.unit.test_train_judge import FIX, SUITE, codes, edit, fx, judge, metrics

__all__ = ["fx"]  # the fixture, imported for pytest


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def _sup(phase: str, node: str) -> dict[str, Any]:
    return dict(json.loads((FIX / phase / node / "supervise.json").read_text()))


def test_p90_of_ten_is_the_ninth() -> None:
    assert p90([float(v) for v in range(10, 0, -1)]) == 9.0
    assert p90([3.0]) == 3.0


def test_the_captured_run_whole(fx: Path) -> None:
    j = judge(fx)
    saved = next(e for e in _events(FIX / "kill/a/rank0.jsonl")
                 if e["event"] == "saved" and e["step"] == 5)
    loaded = next(e for e in _events(FIX / "restore/b/rank0.jsonl") if e["event"] == "loaded")
    warm = next(e for e in _events(FIX / "restore/b/rank0.jsonl") if e["event"] == "warmup")
    step6 = next(e for e in _events(FIX / "restore/b/rank0.jsonl")
                 if e["event"] == "step" and e["step"] == 6)
    deaths = [_sup("kill", n)["end_time"] - _sup("kill", n)["kill_time"] for n in ("a", "b")]
    relaunch = step6["t"] - _sup("restore", "b")["start_time"]
    done = max(e["step"] for e in _events(FIX / "kill/a/rank0.jsonl") if e["event"] == "step")
    m = {mm.metric: mm for mm in j.measurements}
    assert m["ckpt_size_bytes"].value == saved["bytes"] and m["ckpt_size_bytes"].tags == {
        "files": saved["files"]}
    assert m["ckpt_save_s"].value == saved["save_s"] and m["ckpt_save_s"].unit == "s"
    assert m["ckpt_write_gbs"].value == saved["bytes"] / saved["write_s"] / 1e9
    assert m["ckpt_write_gbs"].tags == {"write_s": saved["write_s"]}
    assert m["ckpt_load_s"].value == loaded["load_s"]
    assert m["ckpt_load_s"].tags == {"verify_s": loaded["verify_s"]}
    assert m["restart_s"].value == pytest.approx(max(deaths) + relaunch, abs=1e-9)
    assert m["restart_s"].tags == pytest.approx({
        "dying_s": max(deaths), "relaunch_to_first_step_s": relaunch,
        "warmup_s": warm["seconds"], "verify_s": loaded["verify_s"], "load_s": loaded["load_s"]})
    assert m["steps_lost"].value == done - 5 == 2 and m["steps_lost"].unit == "steps"
    rss = {(mm.tags["rank"], mm.tags["node"]): mm.value for mm in j.measurements
           if mm.metric == "peak_rss_bytes"}
    last = {r: [e for e in _events(FIX / f"reference/{n}/rank{r}.jsonl")
                if e["event"] in ("end", "step")][-1]["rss_peak"] for r, n in ((0, "a"), (1, "b"))}
    assert rss == {(0, "a"): last[0], (1, "b"): last[1]}
    c = codes(j)
    kill = c["TRAIN_KILLED"]
    size = saved["bytes"]
    assert kill.message == (
        f"[multi] kill: checkpoint of step 5 saved ({size / 1e6:.1f} MB in "
        f"{saved['save_s']:.3g} s, written at {size / saved['write_s'] / 1e9:.2f} GB/s); "
        "SIGKILLed on a, b at commit of step 7")
    assert kill.evidence == ["kill/a/rank0.jsonl", "kill/a/supervise.json"]
    assert kill.severity == "INFO" and kill.details == {}
    ok = c["TRAIN_RESTORE_OK"]
    assert ok.message == (
        "[multi] restore verified (saved on a+b, restored on b+a): step 5 restored, "
        "model/optimizer/RNG state hashes equal on every rank, LR equal, losses of steps "
        f"6..12 equal the reference bit for bit; restart {m['restart_s'].value:.1f} s, 2 "
        "step(s) of work lost")
    assert ok.evidence == ["restore/b/rank0.jsonl"]
    assert ok.details == {"exact": True, "inexact": [], "saved_on": ["a", "b"],
                          "restored_on": ["b", "a"]}
    skip = c["TRAIN_CKPT_SKIPPED"]
    assert skip.message == ("[multi] restore: checkpoint of step 7 skipped: no manifest: the "
                            "save did not finish")
    assert skip.evidence == ["restore/b/rank0.jsonl"] and skip.severity == "INFO"


def test_restored_on_the_node_that_saved_says_so(fx: Path) -> None:
    from orchestrator.steps.train.judge import Judge, Subject
    from tests.unit.test_train_judge import phase

    j = Judge("run-1", SUITE, Subject("cpu", None, ["a", "b"], "multi"),
              rel=lambda p: str(p.relative_to(fx)))
    assert j.reference(phase(fx, "reference")) and j.kill(phase(fx, "kill"))
    j.restore(phase(fx, "restore"), saved_on=["a", "b"], restored_on=["a", "b"])
    assert "(saved on a+b, restored on a+b (the same node)): step 5" in codes(j)[
        "TRAIN_RESTORE_OK"].message


def test_a_save_with_problems_is_a_failed_save_naming_three(fx: Path) -> None:
    def spoil(ev: dict[str, Any]) -> dict[str, Any]:
        if ev["event"] == "saved" and ev["step"] == 5:
            ev["problems"] = ["p1", "p2", "p3", "p4"]
        return ev

    edit(fx / "kill" / "a" / "rank0.jsonl", spoil)
    f = codes(judge(fx))["TRAIN_CKPT_SAVE_FAILED"]
    assert f.severity == "FAIL" and f.message == (
        "[multi] kill: no complete checkpoint of step 5 before the kill: ['p1', 'p2', 'p3']")
    assert f.evidence == ["kill/a/rank0.jsonl"]
    assert "TRAIN_RESTORE_OK" not in codes(judge(fx))


def test_no_save_of_the_checkpoint_step_is_a_failed_save(fx: Path) -> None:
    edit(fx / "kill" / "a" / "rank0.jsonl", lambda ev: None if ev["event"] == "saved" else ev)
    f = codes(judge(fx))["TRAIN_CKPT_SAVE_FAILED"]
    assert f.message == "[multi] kill: no complete checkpoint of step 5 before the kill"


def test_a_save_of_rank_1_only_is_not_rank_0s(fx: Path) -> None:
    """Only rank 0's record of the save counts (rank 1's is on another node's disk)."""
    edit(fx / "kill" / "a" / "rank0.jsonl", lambda ev: None if ev["event"] == "saved" else ev)
    with (fx / "kill" / "a" / "rank0.jsonl").open("a") as f:
        saved = next(e for e in _events(FIX / "kill/b/rank1.jsonl") if e["event"] == "saved")
        f.write(json.dumps(saved) + "\n")  # rank 1's record, under rank 0's file
    assert "TRAIN_CKPT_SAVE_FAILED" in codes(judge(fx))


def test_a_killed_run_that_differs_from_the_reference_is_not_deterministic(fx: Path) -> None:
    def bump(ev: dict[str, Any]) -> dict[str, Any]:
        if ev["event"] == "step" and ev["step"] in (3, 4):
            v = float(ev["loss"]) + 1e-3
            ev.update(loss=repr(v), loss_hex=v.hex())
        return ev

    edit(fx / "kill" / "a" / "rank0.jsonl", bump)
    ref3 = next(e for e in _events(FIX / "reference/a/rank0.jsonl")
                if e["event"] == "step" and e["step"] == 3)
    got3 = next(e for e in _events(fx / "kill/a/rank0.jsonl")
                if e["event"] == "step" and e["step"] == 3)
    j = judge(fx)
    f = codes(j)["TRAIN_RESTORE_OK"]
    assert f.details["inexact"] == [  # noted, though the restore itself matched
        f"two uninterrupted runs from the same seed differ at step 3 ({ref3['loss']} vs "
        f"{got3['loss']})"]


def test_an_lr_at_the_checkpoint_step_that_is_not_the_references_fails(fx: Path) -> None:
    ref5 = next(e for e in _events(FIX / "reference/a/rank0.jsonl")
                if e["event"] == "step" and e["step"] == 5)

    def lr(ev: dict[str, Any]) -> dict[str, Any]:
        if ev["event"] == "loaded":
            ev["lr_last"] = 0.5
        return ev

    edit(fx / "restore" / "b" / "rank0.jsonl", lr)
    f = codes(judge(fx))["TRAIN_RESTORE_MISMATCH"]
    assert f.message == (f"[multi] restore (saved on a+b, restored on b+a): LR at step 5: "
                         f"restored 0.5, reference {ref5['lr']!r}")
    assert f.evidence == ["restore/b/rank0.jsonl", "reference/a/rank0.jsonl"]
    assert f.details["problems"] == [f"LR at step 5: restored 0.5, reference {ref5['lr']!r}"]


def test_a_loaded_state_names_the_rank_and_both_hashes(fx: Path) -> None:
    def spoil(ev: dict[str, Any]) -> dict[str, Any]:
        if ev["event"] == "loaded":
            ev["hashes_loaded"]["optimizer"] = "abcdef0123456789" * 4
        return ev

    edit(fx / "restore" / "a" / "rank1.jsonl", spoil)
    want = next(e for e in _events(FIX / "restore/a/rank1.jsonl")
                if e["event"] == "loaded")["hashes_saved"]["optimizer"]
    f = codes(judge(fx))["TRAIN_RESTORE_MISMATCH"]
    assert (f"rank 1: optimizer state after load abcdef012345 differs from the saved "
            f"{want[:12]}") in f.message


def test_a_restore_that_loaded_nothing_fails_with_the_logs(fx: Path) -> None:
    for r, n in ((0, "b"), (1, "a")):
        edit(fx / "restore" / n / f"rank{r}.jsonl",
             lambda ev: None if ev["event"] == "loaded" else ev)
    f = [f for f in judge(fx).findings if f.code == "TRAIN_RESTORE_FAILED"]
    assert f and f[0].message == ("[multi] restore: no checkpoint was loaded (saved on a+b, "
                                  "restored on b+a)")
    assert f[0].evidence == ["restore/b/rank0.jsonl", "restore/b/torchrun.stderr",
                             "restore/a/torchrun.stderr"]


def test_a_kill_after_the_step_has_nothing_to_skip(fx: Path) -> None:
    after = SUITE.model_copy(update={"train": SUITE.train.model_copy(
        update={"kill": "after-step"})})
    for r, n in ((0, "b"), (1, "a")):
        edit(fx / "restore" / n / f"rank{r}.jsonl",
             lambda ev: None if ev["event"] == "skip_ckpt" else ev)
    assert "TRAIN_CKPT_SKIPPED" not in codes(judge(fx, after))
    f = codes(judge(fx))["TRAIN_CKPT_SKIPPED"]
    k = SUITE.train.kill_step
    assert f.message == (f"[multi] restore: nothing to skip: the kill landed before the save "
                         f"of step {k} wrote its directory")
    assert f.details == {"late": False} and f.evidence == ["restore/b/rank0.jsonl"]


# --------------------------------------------------------------------------- throughput


def test_peak_table_lookups_and_their_sources() -> None:
    from orchestrator.steps.train.throughput import peak_tflops
    from orchestrator.suite import TrainParams

    plain = TrainParams()
    assert peak_tflops("NVIDIA H200", "lab", plain) == (989.0, "gpu_peaks.yaml 'H200'")
    assert peak_tflops("nvidia h100 80gb hbm3", "lab", plain)[1] == "gpu_peaks.yaml 'H100'"
    assert peak_tflops("NVIDIA A10G", "lab", plain) == (
        None, "gpu_peaks.yaml lists 'A10G' without a figure")
    assert peak_tflops("Tesla K80", "lab", plain) == (None, "'Tesla K80' is not in gpu_peaks.yaml")
    # variants, never substrings: a GB200 is not a B200, and its own figure is used
    assert peak_tflops("NVIDIA GB200", "lab", plain) == (2500.0, "gpu_peaks.yaml 'GB200'")
    assert peak_tflops("NVIDIA B200", "lab", plain) == (2250.0, "gpu_peaks.yaml 'B200'")
    assert peak_tflops("Tesla V100-SXM2-32GB", "lab", plain) == (
        None, "gpu_peaks.yaml lists 'V100' without a figure")  # Volta has no BF16
    assert peak_tflops(None, "lab", plain) == (None, "no GPU")
    assert peak_tflops("", "lab", plain) == (None, "no GPU")
    own = TrainParams(peak_tflops={"lab": 500})
    assert peak_tflops(None, "lab", own) == (500.0, "suite train.peak_tflops.lab")
    assert peak_tflops("NVIDIA H200", "other", own)[0] == 989.0


def test_p90_is_nearest_rank_at_each_count() -> None:
    assert p90([1.0, 2.0]) == 2.0
    assert p90([float(v) for v in range(1, 21)]) == 18.0
    assert p90([float(v) for v in range(1, 12)]) == 10.0


def test_the_reference_speed_measurements_whole(fx: Path) -> None:
    from tests.unit.test_train_judge import as_gpu, idle_dmon

    as_gpu(fx, idle_dmon(2))
    j = judge(fx, through="reference")
    start = _events(fx / "reference/a/rank0.jsonl")[0]
    m = {mm.metric: mm for mm in j.measurements}
    skip = SUITE.train.stats_skip_steps
    steps = SUITE.train.steps
    assert m["step_time_s"].value == 1.0 and m["step_time_p90_s"].value == 1.0
    want = {"world": 2, "gpu": "NVIDIA H200", "parallel": start["parallel"],
            "compiled": start["compiled"], "model": SUITE.train.model,
            "params": start["params"], "torch": start["versions"]["torch"],
            "peak_tflops": 989.0, "peak_source": "gpu_peaks.yaml 'H200'",
            "timed_in": "reference", "deterministic": True, "steps_timed": steps - skip}
    assert m["step_time_s"].tags == {**want, "stat": "median"}
    assert m["step_time_p90_s"].tags == {**want, "stat": "p90"}
    assert m["tokens_per_s_per_gpu"].tags == want and m["tokens_per_s_per_gpu"].unit == "tokens/s"
    achieved = start["flops_per_token"] * 16384 / 1e12
    assert m["mfu"].value == achieved / 989 and m["mfu"].unit == "ratio"
    assert m["mfu"].tags == {**want, "achieved_tflops": achieved}
    ref = codes(j)["TRAIN_REFERENCE"]
    assert ref.message.endswith(
        f"; step 1 s median (p90 1 s), 16,384 tokens/s per gpu, MFU {achieved / 989:.1%} "
        f"({achieved:.0f} of 989 TFLOP/s)")


def test_the_fastest_kernels_are_the_headline_beside_the_verified_steps(fx: Path) -> None:
    from tests.unit.test_train_judge import as_gpu, idle_dmon

    as_gpu(fx, idle_dmon(2))
    with (fx / "reference/a/rank0.jsonl").open("a") as f:
        for k in range(4):
            f.write(json.dumps({"event": "throughput_step", "rank": 0, "t": 2000 + k, "step": 13 + k,
                                "step_time_s": 0.5, "tokens": 16384}) + "\n")
    j = judge(fx, through="reference")
    m = {mm.metric: mm for mm in j.measurements}
    assert m["step_time_s"].value == 0.5 and m["step_time_s"].tags["timed_in"] == "throughput"
    assert m["step_time_s"].tags["deterministic"] is False
    assert m["step_time_s"].tags["steps_timed"] == 4
    assert m["deterministic_step_time_s"].value == 1.0
    assert m["deterministic_step_time_s"].tags["timed_in"] == "reference"
    assert m["deterministic_step_time_s"].tags["deterministic"] is True
    assert "deterministic_mfu" in m and m["tokens_per_s_per_gpu"].value == 16384 / 0.5
    assert " on the fastest kernels (4 steps after the verified ones); the verified, " \
        "deterministic steps: step 1 s median" in codes(j)["TRAIN_REFERENCE"].message


def test_an_unknown_gpu_has_no_mfu_and_says_how_to_give_one(fx: Path) -> None:
    from tests.unit.test_train_judge import as_gpu, idle_dmon

    as_gpu(fx, idle_dmon(2))
    edit(fx / "reference/a/rank0.jsonl", lambda ev: {
        **ev, "versions": {**ev["versions"], "gpu_name": "Tesla K80"}} if ev["event"] == "start"
        else ev)
    f = codes(judge(fx, through="reference"))["TRAIN_NO_MFU"]
    assert f.message == ("[multi] no MFU: 'Tesla K80' is not in gpu_peaks.yaml; set "
                         "train.peak_tflops.cpu in the suite")
    assert f.severity == "INFO" and f.details == {"gpu": "Tesla K80"}
    assert f.evidence == ["reference/a/rank0.jsonl"]


def test_the_input_pipeline_share_at_the_limit_is_not_input_bound(fx: Path) -> None:
    share = SUITE.train.thresholds.input_bound_share

    def wait(ev: dict[str, Any], s: float) -> dict[str, Any]:
        if ev["event"] == "step":
            ev.update(step_time_s=0.5, data_wait_s=0.5 * s)
        return ev

    edit(fx / "reference/a/rank0.jsonl", lambda ev: wait(ev, share))
    assert "TRAIN_INPUT_BOUND" not in codes(judge(fx, through="reference"))
    edit(fx / "reference/a/rank0.jsonl", lambda ev: wait(ev, share * 1.01))
    f = codes(judge(fx, through="reference"))["TRAIN_INPUT_BOUND"]
    assert f.details["share"] == pytest.approx(share * 1.01) and f.severity == "WARN"
    assert f.message == (f"[multi] input pipeline: waiting for data takes "
                         f"{share * 1.01:.0%} of a step (median)")


def test_the_first_steps_are_left_out_of_the_timing(fx: Path) -> None:
    skip = SUITE.train.stats_skip_steps

    def slow_start(ev: dict[str, Any]) -> dict[str, Any]:
        if ev["event"] == "step":
            ev["step_time_s"] = 100.0 if ev["step"] <= skip else 0.25
            ev["data_wait_s"] = 50.0 if ev["step"] <= skip else 0.0
        return ev

    edit(fx / "reference/a/rank0.jsonl", slow_start)
    j = judge(fx, through="reference")
    m = {mm.metric: mm.value for mm in j.measurements}
    assert m["step_time_s"] == 0.25 and m["step_time_p90_s"] == 0.25
    assert "TRAIN_INPUT_BOUND" not in codes(j)


def test_deterministic_mode_off_is_a_reason_once(fx: Path) -> None:
    for r, n in ((0, "b"), (1, "a")):
        edit(fx / "restore" / n / f"rank{r}.jsonl", lambda ev: {
            **ev, "deterministic": {}} if ev["event"] == "start" else ev)
    ok = codes(judge(fx))["TRAIN_RESTORE_OK"]
    assert ok.details["inexact"] == [
        "deterministic mode is off (suite train.deterministic: false)"]


def test_each_kernel_without_a_deterministic_form_is_named_once(fx: Path) -> None:
    for _ in range(2):
        with (fx / "restore" / "b" / "rank0.jsonl").open("a") as f:
            f.write(json.dumps({"event": "nondeterministic", "rank": 0, "t": 0,
                                "message": "scatter_add_"}) + "\n")
    ok = codes(judge(fx))["TRAIN_RESTORE_OK"]
    assert ok.details["inexact"] == [
        "an operation without a deterministic kernel: scatter_add_"]


def test_memory_is_each_ranks_last_record(fx: Path) -> None:
    def peaks(ev: dict[str, Any]) -> dict[str, Any]:
        if ev["event"] == "step":
            ev.update(mem_alloc_peak=ev["step"] * 1e9, mem_reserved_peak=None)
        if ev["event"] == "end":
            ev.update(mem_alloc_peak=42e9)  # the last record, though not the largest
        return ev

    edit(fx / "reference/b/rank1.jsonl", peaks)
    j = judge(fx, through="reference")
    got = {(mm.metric, mm.tags["rank"], mm.tags["node"]): (mm.value, mm.unit)
           for mm in j.measurements if mm.metric.startswith("peak_")}
    last1 = [e for e in _events(fx / "reference/b/rank1.jsonl")
             if e["event"] in ("end", "step")][-1]
    assert got[("peak_mem_allocated_bytes", 1, "b")] == (42e9, "bytes") == (
        float(last1["mem_alloc_peak"]), "bytes")
    assert ("peak_mem_reserved_bytes", 1, "b") not in got
    assert ("peak_mem_allocated_bytes", 0, "a") not in got
    assert got[("peak_rss_bytes", 1, "b")][0] == float(last1["rss_peak"])


# --------------------------------------------------------------------------- losses after a restore


def _set_loss(root: Path, phase: str, file: str, values: dict[int, float]) -> None:
    def put(ev: dict[str, Any]) -> dict[str, Any]:
        if ev["event"] == "step" and ev["step"] in values:
            v = values[ev["step"]]
            ev.update(loss=repr(v), loss_hex=v.hex())
        return ev

    edit(root / phase / file, put)


def _inexact(root: Path, tol: float) -> Any:
    with (root / "reference" / "a" / "rank0.jsonl").open("a") as f:
        for op in ("index_add_", "scatter_add_"):
            f.write(json.dumps({"event": "nondeterministic", "rank": 0, "t": 0,
                                "message": op}) + "\n")
    return SUITE.model_copy(update={"train": SUITE.train.model_copy(
        update={"loss_tolerance": tol})})


def test_the_first_step_after_the_checkpoint_is_compared(fx: Path) -> None:
    _set_loss(fx, "restore", "b/rank0.jsonl", {6: 9.0})
    f = codes(judge(fx))["TRAIN_RESTORE_MISMATCH"]
    ref6 = next(e for e in _events(FIX / "reference/a/rank0.jsonl")
                if e["event"] == "step" and e["step"] == 6)
    # deterministic: the message says nothing about determinism
    assert f.message == (f"[multi] restore (saved on a+b, restored on b+a): first differing "
                         f"step 6: reference loss {ref6['loss']} ({ref6['loss_hex']}), "
                         f"restored 9.0 ({(9.0).hex()})")


def test_a_loss_exactly_at_the_tolerance_is_within_it(fx: Path) -> None:
    """4.0 against 4.0 + 4 x 2^-10 with a relative tolerance of 2^-10: exact in binary."""
    suite = _inexact(fx, 2 ** -10)
    _set_loss(fx, "reference", "a/rank0.jsonl", {6: 4.0})
    _set_loss(fx, "kill", "a/rank0.jsonl", {6: 4.0})  # the killed run repeats the reference
    _set_loss(fx, "restore", "b/rank0.jsonl", {6: 4.0 + 4 * 2 ** -10})
    ok = codes(judge(fx, suite))["TRAIN_RESTORE_OK"]
    assert ok.severity == "WARN" and ok.details["exact"] is False
    _set_loss(fx, "restore", "b/rank0.jsonl", {6: 4.0 + 5 * 2 ** -10})
    f = codes(judge(fx, suite))["TRAIN_RESTORE_MISMATCH"]
    assert "first differing step 6" in f.message
    assert f.message.endswith("; not deterministic here: an operation without a "
                              "deterministic kernel: index_add_; an operation without a "
                              "deterministic kernel: scatter_add_")


def test_the_tolerance_of_a_loss_below_one_is_relative_to_it(fx: Path) -> None:
    suite = _inexact(fx, 2 ** -10)
    _set_loss(fx, "reference", "a/rank0.jsonl", {6: 0.5})
    _set_loss(fx, "kill", "a/rank0.jsonl", {6: 0.5})  # the killed run repeats the reference
    _set_loss(fx, "restore", "b/rank0.jsonl", {6: 0.5 + 0.75 * 2 ** -10})  # 1.5 x tolerance
    assert "TRAIN_RESTORE_MISMATCH" in codes(judge(fx, suite))


def test_a_step_within_the_tolerance_does_not_end_the_comparison(fx: Path) -> None:
    suite = _inexact(fx, 1e-4)
    _set_loss(fx, "restore", "b/rank0.jsonl", {6: float(next(
        e for e in _events(FIX / "reference/a/rank0.jsonl")
        if e["event"] == "step" and e["step"] == 6)["loss"]) * (1 + 1e-7), 9: 9.0})
    f = codes(judge(fx, suite))["TRAIN_RESTORE_MISMATCH"]
    assert "first differing step 9" in f.message


def test_restart_parts_leave_out_what_was_not_timed(fx: Path) -> None:
    def stamp(ev: dict[str, Any]) -> dict[str, Any] | None:
        if ev["event"] == "start":
            ev.update(launch_s="soon", init_s={})
        if ev["event"] == "warmup":
            ev.pop("seconds")
        return ev

    edit(fx / "restore" / "b" / "rank0.jsonl", stamp)
    [r] = [m for m in judge(fx).measurements if m.metric == "restart_s"]
    assert not {"launch_s", "init_s", "warmup_s"} & set(r.tags)
    assert {"verify_s", "load_s"} <= set(r.tags)


def test_restart_init_is_summed_to_four_places(fx: Path) -> None:
    edit(fx / "restore" / "b" / "rank0.jsonl", lambda ev: {
        **ev, "init_s": {"a": 1.00004, "b": 1.00002}} if ev["event"] == "start" else ev)
    [r] = [m for m in judge(fx).measurements if m.metric == "restart_s"]
    assert r.tags["init_s"] == 2.0001


def test_a_rank_without_a_step_record_is_passed_over(fx: Path) -> None:
    from orchestrator.judging.sink import Sink
    from orchestrator.steps.train.memory import memory
    from tests.unit.test_train_judge import phase

    edit(fx / "reference/a/rank0.jsonl", lambda ev: ev if ev["event"] == "start" else None)
    sink = Sink("r", "train", "h", "cpu", None, ["a", "b"], "", lambda p: p.name, "train",
                "train")
    memory(sink, phase(fx, "reference"))  # rank 0 (read first) has no step: rank 1 still counts
    assert [(m.metric, m.tags) for m in sink.measurements] == [
        ("peak_rss_bytes", {"rank": 1, "node": "b"})]


# --------------------------------------------------------------------------- your own command


def _cmd_judge(**train: Any) -> Any:
    from orchestrator.steps.train.judge import Judge, Subject
    from orchestrator.suite import Suite, TrainParams

    return Judge("r", Suite(train=TrainParams(command="python train.py", **train)),
                 Subject("p", "n1", ["n1"], "single"), rel=lambda p: p.name)


def _cmd_phase(root: Path, phase: str, lines: str, stderr: str = "", sup: Any = None,
               **more: Any) -> Any:
    from orchestrator.steps.train.reading import read_phase

    d = root / phase / "n1"
    d.mkdir(parents=True)
    (d / "command.stdout").write_text(lines)
    (d / "command.stderr").write_text(stderr)
    doc = {"rc": 0, "wall_s": 3.5, "start_time": 0, "end_time": 3, "killed": False,
           "telemetry": {"note": "no GPU telemetry: nvidia-smi not found"}, **more}
    (d / "supervise.json").write_text(json.dumps(doc if sup is None else sup))
    return read_phase(phase, [("n1", d)])


_RESUME = {"resume_flag": "--resume", "command_kill_after_step": 6}


def test_command_steps_reads_step_and_save_lines(tmp_path: Path) -> None:
    from orchestrator.steps.train.command import command_steps

    log = tmp_path / "out"
    log.write_bytes(b"step=1\nstep = 2 \xff\nsaved step=3\nSAVING at step=4\nsave step=5\n"
                    b"saves step=6\nno step here\nsaved, no number\nstep=7\n")
    assert command_steps(log) == ([1, 2, 6, 7], [3, 4, 5])
    # "unsaved" is no save; "autosaved" is one
    log.write_text("unsaved step=8\nautosaved step=9\nsaved step=10\nUnsaved step=11\n")
    assert command_steps(log) == ([8, 11], [9, 10])


def test_a_command_without_a_supervisor_document_fails(tmp_path: Path) -> None:
    j = _cmd_judge()
    assert not j.command(_cmd_phase(tmp_path, "reference", "step=1\n", sup=[1]))
    [f] = j.findings
    assert (f.code, f.severity, f.message) == (
        "TRAIN_FAILED", "FAIL", "[single] reference: no supervisor document from n1")
    assert f.evidence == ["command.stdout", "command.stderr", "supervise.json"]
    assert f.details == {"phase": "reference"} and j.measurements == []


def test_a_commands_wall_time_and_status_are_measured(tmp_path: Path) -> None:
    j = _cmd_judge()
    assert j.command(_cmd_phase(tmp_path, "reference", "step=1\nstep=2\nsaved step=2\n"))
    [m] = [m for m in j.measurements if m.metric == "command_wall_s"]
    assert (m.value, m.unit, m.tags) == (3.5, "s", {"phase": "reference", "rc": 0})
    [ok] = [f for f in j.findings if f.code == "TRAIN_COMMAND_OK"]
    assert ok.severity == "INFO" and ok.message == (
        "[single] your command finished in 3.5 s (2 step lines)")
    assert ok.evidence == ["command.stdout", "command.stderr", "supervise.json"]
    j2 = _cmd_judge()
    j2.command(_cmd_phase(tmp_path / "2", "reference", "", wall_s=None))
    assert [m.value for m in j2.measurements if m.metric == "command_wall_s"] == [0.0]


def test_a_command_that_ran_past_its_time_fails(tmp_path: Path) -> None:
    j = _cmd_judge(timeout_s=12.6)
    assert not j.command(_cmd_phase(tmp_path, "kill", "step=1\n", timed_out=True, killed=True))
    [f] = [f for f in j.findings if f.code == "TRAIN_TIMEOUT"]
    assert f.severity == "FAIL" and f.message == (
        "[single] kill: your command ran past 13 s and was killed")
    assert f.details == {"phase": "kill"} and j.earlier.kill_out is None
    assert f.evidence == ["command.stdout", "command.stderr", "supervise.json"]


def test_a_command_that_ended_before_its_kill_fails(tmp_path: Path) -> None:
    j = _cmd_judge(**_RESUME)
    assert not j.command(_cmd_phase(tmp_path, "kill", "step=1\n"))
    [f] = [f for f in j.findings if f.code == "TRAIN_KILL_MISSED"]
    assert (f.code, f.severity, f.message) == (
        "TRAIN_KILL_MISSED", "FAIL", "[single] kill: your command ended before it logged step=6")
    assert f.evidence == ["command.stdout", "command.stderr", "supervise.json"]
    assert j.earlier.kill_out is None


def test_the_kill_of_a_command_says_its_last_step_and_save(tmp_path: Path) -> None:
    j = _cmd_judge(**_RESUME)
    out = _cmd_phase(tmp_path, "kill", "step=7\nsaved step=4\nstep=6\nsaved step=2\n",
                     killed=True, rc=-9)
    assert j.command(out) and j.earlier.kill_out is out
    [f] = [f for f in j.findings if f.code == "TRAIN_KILLED"]
    assert f.severity == "INFO" and f.message == (
        "[single] kill: SIGKILLed after step=7; last save logged at step=4")
    assert f.evidence == ["command.stdout", "command.stderr", "supervise.json"]
    assert f.details == {}
    j2 = _cmd_judge(**_RESUME)
    assert j2.command(_cmd_phase(tmp_path / "2", "kill", "", killed=True))
    assert [f.message for f in j2.findings if f.code == "TRAIN_KILLED"] == [
        "[single] kill: SIGKILLed after step=0; no `saved ... step=N` line seen"]


def test_a_command_that_exits_nonzero_fails_with_its_stderr(tmp_path: Path) -> None:
    j = _cmd_judge()
    assert not j.command(_cmd_phase(tmp_path, "reference", "step=1\n", rc=3,
                                    stderr="a\nb\nc\nTraceback: boom\n"))
    [f] = [f for f in j.findings if f.code == "TRAIN_COMMAND_FAILED"]
    assert f.severity == "FAIL" and f.message == (
        "[single] reference: your command exited with status 3: b | c | Traceback: boom")
    assert f.evidence == ["command.stdout", "command.stderr", "supervise.json"]
    assert f.details == {}
    assert not [f for f in j.findings if f.code == "TRAIN_COMMAND_OK"]


def _killed(j: Any, root: Path, lines: str) -> None:
    assert j.command(_cmd_phase(root, "kill", lines, killed=True, rc=-9))


def test_a_restore_that_logged_no_step_expects_the_first(tmp_path: Path) -> None:
    j = _cmd_judge(**_RESUME)
    assert j.command(_cmd_phase(tmp_path, "restore", "resuming\n"))
    [f] = [f for f in j.findings if f.code == "TRAIN_RESTORE_MISMATCH"]
    assert f.severity == "FAIL" and f.message == (
        "[single] restore: your command logged no step, expected step=1 or later "
        "(it started over)")
    assert f.details == {"first_step": None, "expected": 1}
    assert f.evidence == ["command.stdout", "command.stderr", "supervise.json"]


def test_a_restore_without_a_save_must_go_past_the_first_killed_step(tmp_path: Path) -> None:
    j = _cmd_judge(**_RESUME)
    _killed(j, tmp_path, "step=3\nstep=4\nstep=5\n")
    assert j.command(_cmd_phase(tmp_path, "restore", "step=3\nstep=4\n"))
    [f] = [f for f in j.findings if f.code == "TRAIN_RESTORE_MISMATCH"]
    assert f.message == ("[single] restore: your command started again at step=3, expected "
                         "step=4 or later (it started over)")
    assert f.details == {"first_step": 3, "expected": 4}
    j2 = _cmd_judge(**_RESUME)
    _killed(j2, tmp_path / "2", "step=3\nstep=4\nstep=5\n")
    assert j2.command(_cmd_phase(tmp_path / "2", "restore", "step=5\nstep=4\n"))
    [ok] = [f for f in j2.findings if f.code == "TRAIN_RESTORE_OK"]
    assert ok.severity == "PASS" and ok.message == (
        "[single] restore: your command resumed at step=4 (last saved unknown); finished "
        "in 3.5 s")
    assert ok.details == {"first_step": 4}
    assert ok.evidence == ["command.stdout", "command.stderr", "supervise.json"]
    assert [(m.value, m.unit, m.tags) for m in j2.measurements if m.metric == "steps_lost"] == [
        (1.0, "steps", {})]


def test_a_restore_at_its_last_save_is_ok_and_one_before_it_is_not(tmp_path: Path) -> None:
    j = _cmd_judge(**_RESUME)
    _killed(j, tmp_path, "step=1\nsaved step=2\nsaved step=4\nstep=5\n")
    assert j.command(_cmd_phase(tmp_path, "restore", "step=4\nstep=5\n"))
    [ok] = [f for f in j.findings if f.code == "TRAIN_RESTORE_OK"]
    assert "resumed at step=4 (last saved 4)" in ok.message
    assert [m.value for m in j.measurements if m.metric == "steps_lost"] == [1.0]
    j2 = _cmd_judge(**_RESUME)
    _killed(j2, tmp_path / "2", "step=1\nsaved step=2\nsaved step=4\nstep=5\n")
    assert j2.command(_cmd_phase(tmp_path / "2", "restore", "step=3\nstep=5\n"))
    [f] = [f for f in j2.findings if f.code == "TRAIN_RESTORE_MISMATCH"]
    assert f.message == ("[single] restore: your command started again at step=3, expected "
                         "step=4 or later (the last saved step)")
    assert f.details == {"first_step": 3, "expected": 4}
    assert not [m for m in j2.measurements if m.metric == "steps_lost"]


def test_a_restore_past_the_killed_runs_last_step_loses_nothing(tmp_path: Path) -> None:
    j = _cmd_judge(**_RESUME)
    _killed(j, tmp_path, "saved step=4\nstep=5\n")
    assert j.command(_cmd_phase(tmp_path, "restore", "step=7\n"))
    assert [m.value for m in j.measurements if m.metric == "steps_lost"] == [0.0]
    j2 = _cmd_judge(**_RESUME)
    _killed(j2, tmp_path / "2", "saved step=4\n")  # saves alone: nothing to count from
    assert j2.command(_cmd_phase(tmp_path / "2", "restore", "step=5\n"))
    assert not [m for m in j2.measurements if m.metric == "steps_lost"]


# --------------------------------------------------------------------------- reading a phase


def test_a_node_folder_read_back(tmp_path: Path) -> None:
    from orchestrator.judging.telemetry import NodeTelemetry
    from orchestrator.steps.train.reading import read_node

    d = tmp_path / "n"
    d.mkdir()
    (d / "supervise.json").write_text(json.dumps({"rc": 0, "telemetry": {"source": "dmon"}}))
    (d / "rank3.jsonl").write_bytes(b'{"event": "start", "rank": 3}\ntorn {\n\xff\n'
                                    b'{"event": "step", "step": 1}\n')
    (d / "rank10.jsonl").write_text('{"event": "end"}\n')
    (d / "rankx.jsonl").write_text('{"event": "end"}\n')
    (d / "rank2.jsonl.bak").write_text('{"event": "end"}\n')
    n = read_node("a", d)
    assert (n.node, n.dir, n.supervise) == ("a", d, {"rc": 0, "telemetry": {"source": "dmon"}})
    assert n.events == {3: [{"event": "start", "rank": 3}, {"event": "step", "step": 1}],
                        10: [{"event": "end"}]}
    assert list(n.events) == [10, 3]  # the files in name order
    assert n.file("x.txt") == d / "x.txt"
    assert n.telemetry() == NodeTelemetry("a", {"source": "dmon"}, d, d / "supervise.json")
    (d / "supervise.json").write_text(json.dumps({"rc": 0, "telemetry": None}))
    assert read_node("a", d).telemetry().doc == {}
    for bad in ("[1, 2]", "{torn", ""):
        (d / "supervise.json").write_text(bad)
        assert read_node("a", d).supervise == {}
    (d / "supervise.json").unlink()
    assert read_node("a", d).supervise == {}


def test_a_phase_read_back_in_rank_order(tmp_path: Path) -> None:
    from orchestrator.steps.train.reading import read_phase

    for node, ranks in (("b", (2, 0)), ("a", (1,))):
        (tmp_path / node).mkdir()
        for r in ranks:
            (tmp_path / node / f"rank{r}.jsonl").write_text("".join(
                json.dumps(e) + "\n" for e in (
                    {"event": "start", "rank": r, "n": 1}, {"event": "step", "step": "2", "r": r},
                    {"event": "start", "rank": r, "n": 2}, {"event": "step", "step": 1, "r": r})))
    out = read_phase("kill", [("b", tmp_path / "b"), ("a", tmp_path / "a")])
    assert out.phase == "kill" and [n.node for n in out.nodes] == ["b", "a"]
    assert list(out.ranks) == [0, 1, 2]
    assert [out.node_of(r) for r in (0, 1, 2, 7)] == ["b", "a", "b", "?"]
    assert out.rank0() == out.ranks[0] and len(out.rank0()) == 4
    assert out.steps(1) == {2: {"event": "step", "step": "2", "r": 1},
                            1: {"event": "step", "step": 1, "r": 1}}
    assert out.steps() == {2: {"event": "step", "step": "2", "r": 0},
                           1: {"event": "step", "step": 1, "r": 0}}
    assert out.steps(9) == {}
    assert out.first("start", 2) == {"event": "start", "rank": 2, "n": 1}
    assert out.first("start") == {"event": "start", "rank": 0, "n": 1}
    assert out.first("end") is None and out.first("start", 9) is None
    assert [(e["rank"], e["n"]) for e in out.all("start")] == [(0, 1), (0, 2), (1, 1), (1, 2),
                                                              (2, 1), (2, 2)]
    assert out.rank_file(1) == tmp_path / "a" / "rank1.jsonl"
    assert out.rank_file(2) == tmp_path / "b" / "rank2.jsonl"
    assert out.rank_file(5) == tmp_path / "b" / "rank5.jsonl"  # where it would be
    empty = read_phase("kill", [])
    assert empty.rank_file(0) == Path("?") and empty.rank0() == [] and empty.ranks == {}


def test_a_logs_tail_for_a_message(tmp_path: Path) -> None:
    from orchestrator.steps.train.reading import tail

    log = tmp_path / "err"
    assert tail(log) == ""
    log.write_bytes(b"one\n  two  \n\n*** banner\n   \nthree \xff\nfour\n")
    assert tail(log) == "two | three \ufffd | four"
    assert tail(log, 1) == "four" and tail(log, 5) == "one | two | three \ufffd | four"
    log.write_text("".join(f"{k:03d}" + "x" * 200 + "\n" for k in range(3)))
    got = tail(log)
    assert len(got) == 400 and got.endswith("002" + "x" * 200)
    assert got == (" | ".join(f"{k:03d}" + "x" * 200 for k in range(3)))[-400:]


# --------------------------------------------------------------------------- failures


def _fsink() -> Any:
    from orchestrator.judging.sink import Sink

    return Sink("r", "train", "h", "p", None, ["a", "b"], "", lambda p: p.name, "train", "train")


def _fnode(root: Path, name: str, sup: dict[str, Any] | None,
           events: dict[int, list[dict[str, Any]]], **logs: str) -> Any:
    from orchestrator.steps.train.reading import NodeOutput

    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    for r in events:
        (d / f"rank{r}.jsonl").write_text("")
    if sup is not None:
        (d / "supervise.json").write_text("{}")
    for log, text in logs.items():
        (d / f"torchrun.{log}").write_text(text)
    return NodeOutput(name, d, sup or {}, events)


def _fphase(phase: str, *nodes: Any) -> Any:
    from orchestrator.steps.train.reading import PhaseOutput

    return PhaseOutput(phase, list(nodes))


_END = {"event": "end"}
_OK = {"rc": 0}


def _err(rank: int, kind: str, **more: Any) -> dict[str, Any]:
    return {"event": "error", "rank": rank, "kind": kind, "type": "RuntimeError",
            "message": f"boom {rank}", **more}


def test_an_oom_of_one_rank_is_reported_once(tmp_path: Path) -> None:
    from orchestrator.steps.train.failures import failed

    sink = _fsink()
    long = "x" * 400
    out = _fphase("reference", _fnode(tmp_path, "a", _OK, {0: [_END]}),
                  _fnode(tmp_path, "b", _OK, {1: [_err(1, "oom", message=long)],
                                              2: [_err(2, "oom")]}))
    assert failed(sink, TrainParams(), out) is True
    [f] = sink.findings
    assert (f.code, f.severity, f.message) == (
        "TRAIN_OOM", "FAIL", f"reference: CUDA out of memory on rank 1 on b: {'x' * 300}")
    assert f.evidence == ["rank1.jsonl"] and f.details == {"phase": "reference"}


def test_a_nonfinite_loss_names_its_rank_and_step(tmp_path: Path) -> None:
    from orchestrator.steps.train.failures import failed

    sink = _fsink()
    out = _fphase("kill", _fnode(tmp_path, "a", _OK, {
        0: [_END], 3: [_err(3, "nonfinite", message="loss is nan", step=4),
                       _err(3, "exception")]}))
    assert failed(sink, TrainParams(), out)
    [f] = sink.findings
    assert (f.code, f.message, f.details) == (
        "TRAIN_NAN", "kill: loss is nan (rank 3 on a)", {"phase": "kill", "first_step": 4})
    assert f.evidence == ["rank3.jsonl"]


def test_errors_of_other_ranks_are_each_reported_until_rank_0s(tmp_path: Path) -> None:
    from orchestrator.steps.train.failures import failed

    sink = _fsink()
    out = _fphase("reference", _fnode(tmp_path, "a", _OK, {
        0: [_END, _err(0, "exception", type=None, message="y" * 301)],
        1: [_err(1, "exception")], 2: [_err(2, "exception")]}),
        _fnode(tmp_path, "b", _OK, {3: [{"event": "error", "message": "no rank"}]}))
    assert failed(sink, TrainParams(), out)
    assert [(f.code, f.message, f.evidence) for f in sink.findings] == [
        ("TRAIN_FAILED", f"reference: None on rank 0 on a: {'y' * 300}", ["rank0.jsonl"])]
    sink = _fsink()
    out = _fphase("reference", _fnode(tmp_path / "2", "a", _OK, {
        0: [_END], 1: [_err(1, "exception")], 2: [_err(2, "exception")]}),
        _fnode(tmp_path / "2", "b", _OK, {3: [{"event": "error", "message": "no rank"}]}))
    assert failed(sink, TrainParams(), out)
    assert [(f.message, f.evidence) for f in sink.findings] == [
        ("reference: RuntimeError on rank 1 on a: boom 1", ["rank1.jsonl"]),
        ("reference: RuntimeError on rank 2 on a: boom 2", ["rank2.jsonl"]),
        ("reference: None on rank -1 on ?: no rank", []),
    ] and all(f.details == {"phase": "reference"} for f in sink.findings)


def test_no_checkpoint_is_left_to_the_restore(tmp_path: Path) -> None:
    from orchestrator.steps.train.failures import failed

    sink = _fsink()
    out = _fphase("restore", _fnode(tmp_path, "a", _OK, {
        0: [_err(0, "no_checkpoint"), _END], 1: [_err(1, "exception")]}))
    assert failed(sink, TrainParams(), out)  # rank 0's no_checkpoint does not stop the loop
    assert [f.message for f in sink.findings] == [
        "restore: RuntimeError on rank 1 on a: boom 1"]
    sink = _fsink()
    out = _fphase("restore", _fnode(tmp_path / "2", "a", _OK, {0: [_err(0, "no_checkpoint"),
                                                                  _END]}))
    assert failed(sink, TrainParams(), out) is False and sink.findings == []


def _kill_events(rank: int, upto: list[tuple[str, int]], error: bool = True
                 ) -> list[dict[str, Any]]:
    evs: list[dict[str, Any]] = [{"event": k, "step": s} for k, s in upto]
    return evs + ([_err(rank, "peer", type=None)] if error else [])


@pytest.mark.parametrize("kill,at,short", [
    ("after-step", [("step", 6), ("step", 8)], [("step", 6), ("saving", 7), ("commit", 7)]),
    ("mid-save", [("saving", 7)], [("saving", 6), ("saving", 8), ("step", 7), ("commit", 7)]),
    ("before-manifest", [("commit", 7)], [("commit", 6), ("commit", 8), ("saving", 7),
                                          ("step", 7)]),
])
def test_the_kill_point_of_each_kind_exactly(kill: str, at: list[tuple[str, int]],
                                             short: list[tuple[str, int]]) -> None:
    from orchestrator.steps.train.failures import past_kill_point

    params = TrainParams(ckpt_step=5, kill_offset=2, kill=kill)  # type: ignore[arg-type]
    for upto, want in ((at, True), (short, False)):
        evs = _kill_events(1, upto)
        out = _fphase("kill")
        out.nodes.append(type("N", (), {"events": {1: evs}})())
        assert past_kill_point(params, out, 1, evs[-1]) is want, (kill, upto)
    evs = _kill_events(1, [])
    later = at + [("end", 0)]
    out = _fphase("kill")
    out.nodes.append(type("N", (), {"events": {1: evs + [{"event": k, "step": s}
                                                         for k, s in later]}})())
    assert past_kill_point(params, out, 1, evs[-1]) is False  # only what came before it
    assert past_kill_point(params, out, 1, {"event": "error"}) is True  # not among them
    assert past_kill_point(params, out, 2, evs[-1]) is False


def test_a_step_record_without_a_step_is_not_past_the_kill() -> None:
    from orchestrator.steps.train.failures import past_kill_point

    params = TrainParams(ckpt_step=1, kill_offset=1, kill="after-step")
    out = _fphase("kill")
    err = _err(1, "exception")
    out.nodes.append(type("N", (), {"events": {1: [{"event": "step"}, err]}})())
    assert past_kill_point(params, out, 1, err) is False


def test_an_echo_of_the_kill_is_noted_not_failed(tmp_path: Path) -> None:
    from orchestrator.steps.train.failures import failed

    params = TrainParams(ckpt_step=5, kill_offset=2, kill="before-manifest")
    evs = _kill_events(1, [("commit", 7)])
    evs2 = _kill_events(2, [("commit", 7)])
    evs2[-1]["type"] = "DistBackendError"
    nodes = (_fnode(tmp_path, "a", {"killed": True}, {0: [{"event": "commit", "step": 7}]}),
             _fnode(tmp_path, "b", {"killed": False}, {1: evs, 2: evs2}))
    echoes: list[str] = []
    sink = _fsink()
    assert failed(sink, params, _fphase("kill", *nodes), killed_ok=True, echoes=echoes) is False
    assert sink.findings == []
    assert echoes == ["rank 1 on b saw it (peer)", "rank 2 on b saw it (DistBackendError)"]
    assert failed(sink, params, _fphase("kill", *nodes), killed_ok=True) is False
    # not the kill phase's judging: the same errors fail
    sink = _fsink()
    assert failed(sink, params, _fphase("kill", *nodes), echoes=echoes)
    assert [f.message for f in sink.findings] == ["kill: None on rank 1 on b: boom 1",
                                                  "kill: DistBackendError on rank 2 on b: boom 2"]
    assert len(echoes) == 2


def test_no_supervisor_document_ends_the_check(tmp_path: Path) -> None:
    from orchestrator.steps.train.failures import failed

    sink = _fsink()
    out = _fphase("reference", _fnode(tmp_path, "a", None, {0: [_END]}),
                  _fnode(tmp_path, "b", {"timed_out": True}, {1: []}, stderr=""))
    assert failed(sink, TrainParams(), out) is True
    [f] = sink.findings
    assert (f.code, f.severity, f.message, f.evidence, f.details) == (
        "TRAIN_FAILED", "FAIL", "reference: no supervisor document from a", [],
        {"phase": "reference"})


def test_a_phase_that_ran_past_its_time_fails_on_each_node(tmp_path: Path) -> None:
    from orchestrator.steps.train.failures import failed

    sink = _fsink()
    out = _fphase("kill", _fnode(tmp_path, "a", {"timed_out": True}, {0: [_END]}, stderr="x"),
                  _fnode(tmp_path, "b", {"timed_out": 1}, {1: []}))
    assert failed(sink, TrainParams(timeout_s=59.5), out) is True
    assert [(f.code, f.severity, f.message, f.evidence, f.details) for f in sink.findings] == [
        ("TRAIN_TIMEOUT", "FAIL", "kill: still running on a after 60 s; killed",
         ["torchrun.stderr"], {"phase": "kill"}),
        ("TRAIN_TIMEOUT", "FAIL", "kill: still running on b after 60 s; killed", [],
         {"phase": "kill"})]


def test_a_job_that_ended_without_finishing(tmp_path: Path) -> None:
    from orchestrator.steps.train.failures import failed

    sink = _fsink()
    out = _fphase("reference", _fnode(tmp_path, "a", {"rc": 1}, {0: []},
                                      stderr="Traceback\n  File x\nValueError: bad\n"),
                  _fnode(tmp_path, "b", {"rc": None}, {1: [_END]}, stderr=""))
    assert failed(sink, TrainParams(), out) is True
    [f] = sink.findings
    assert (f.code, f.severity, f.message, f.details) == (
        "TRAIN_FAILED", "FAIL", "reference: the job ended without finishing (exit status "
        "{'a': 1, 'b': None}); on a: Traceback | File x | ValueError: bad",
        {"phase": "reference"})
    assert f.evidence == ["torchrun.stderr", "torchrun.stderr"]
    sink = _fsink()
    out = _fphase("reference", _fnode(tmp_path / "2", "a", {"rc": 1}, {0: []}))
    assert failed(sink, TrainParams(), out)
    assert [f.message for f in sink.findings] == [
        "reference: the job ended without finishing (exit status {'a': 1})"]
    # a multi-node part stopped after its peer failed: said, and the cause is the peer's
    sink = _fsink()
    why = "the part on b failed; this part could not finish without it and was stopped 20 s later"
    out = _fphase("reference", _fnode(tmp_path / "5", "a", {"rc": -9, "killed": True,
                                                             "stopped": why}, {0: []},
                                      stderr="waiting for rendezvous\n"),
                  _fnode(tmp_path / "6", "b", {"rc": 1}, {1: []},
                         stderr="RuntimeError: connect() timed out\n"))
    assert failed(sink, TrainParams(), out) is True
    got = {f.code: f for f in sink.findings}
    assert got["TRAIN_PART_STOPPED"].severity == "INFO"
    assert got["TRAIN_PART_STOPPED"].message == f"reference: a stopped: {why}"
    assert got["TRAIN_FAILED"].message.endswith(
        "; on b: RuntimeError: connect() timed out")
    # in the kill phase too, a stopped part is no kill: the phase failed
    out = _fphase("kill", _fnode(tmp_path / "7", "a", {"rc": -9, "killed": True,
                                                        "stopped": why}, {0: []}),
                  _fnode(tmp_path / "8", "b", {"rc": 1}, {1: []}))
    assert failed(_fsink(), TrainParams(), out, killed_ok=True) is True
    # the kill phase that was killed need not end; one that was not must
    killed = _fphase("kill", _fnode(tmp_path / "3", "a", {"killed": True}, {0: []}))
    assert failed(_fsink(), TrainParams(), killed, killed_ok=True) is False
    assert failed(_fsink(), TrainParams(), killed) is True
    unkilled = _fphase("kill", _fnode(tmp_path / "4", "a", {"rc": 0}, {0: []}))
    assert failed(_fsink(), TrainParams(), unkilled, killed_ok=True) is True
    # rank 0's end is the one that counts
    other = _fphase("reference", _fnode(tmp_path / "5", "a", {"rc": 0}, {0: [], 1: [_END]}))
    assert failed(_fsink(), TrainParams(), other) is True


def test_collective_timeouts_are_found_in_either_log(tmp_path: Path) -> None:
    from orchestrator.steps.train.failures import scan_logs

    line = "  [E] Watchdog caught collective operation timeout: " + "z" * 300 + "  "
    for text, hit in (("NCCL op Timeout", True), ("NCCL timeout", True),
                      ("collective operation timeout", True),
                      ("DistBackendError: ... Timed out", True), ("DistBackendError", False),
                      ("timeout NCCL", False), ("a Timeout", False)):
        sink = _fsink()
        out = _fphase("reference", _fnode(tmp_path / text, "a", _OK, {}, stdout=text))
        assert scan_logs(sink, out) is hit, text
        assert [f.code for f in sink.findings] == (["TRAIN_NCCL_TIMEOUT"] if hit else [])
    sink = _fsink()
    out = _fphase("reference", _fnode(tmp_path, "a", _OK, {}, stderr=f"ok\n{line}\n{line}\n",
                                      stdout="NCCL timeout"),
                  _fnode(tmp_path, "b", _OK, {}))
    assert scan_logs(sink, out) is True
    assert [(f.code, f.severity, f.message, f.evidence, f.details) for f in sink.findings] == [
        ("TRAIN_NCCL_TIMEOUT", "FAIL", "reference: collective timeout on a (torchrun.stderr:2): "
         + line.strip()[:240], ["torchrun.stderr"], {"phase": "reference", "line": 2}),
        ("TRAIN_NCCL_TIMEOUT", "FAIL", "reference: collective timeout on a (torchrun.stdout:1): "
         "NCCL timeout", ["torchrun.stdout"], {"phase": "reference", "line": 1})]


def test_nccl_warn_lines_are_counted_and_a_lost_peer_after_the_kill_is_not_one(
        tmp_path: Path) -> None:
    from orchestrator.steps.train.failures import scan_logs

    lost = ["x NCCL WARN Connection closed by remote peer", "x NCCL WARN connection RESET by peer",
            "x NCCL WARN Broken pipe", "x NCCL WARN remote process exited",
            "x NCCL WARN Connection refused"]
    warn = "  y NCCL WARN net: " + "w" * 300
    text = "\n".join(["info", *lost, warn, "z NCCL WARN again"]) + "\n"
    sink = _fsink()
    out = _fphase("kill", _fnode(tmp_path, "a", {"killed": True}, {}, stderr=text))
    assert scan_logs(sink, out) is False
    [f] = sink.findings
    assert (f.code, f.severity, f.message, f.evidence, f.details) == (
        "TRAIN_NCCL_WARN", "WARN", "kill: 2 NCCL WARN line(s) on a, first at torchrun.stderr:7: "
        + warn.strip()[:240], ["torchrun.stderr"], {"phase": "kill", "line": 7, "count": 2})
    for phase, sup in (("kill", {"killed": False}), ("reference", {"killed": True})):
        sink = _fsink()
        out = _fphase(phase, _fnode(tmp_path / phase, "a", sup, {}, stdout=text))
        assert scan_logs(sink, out) is False
        [f] = sink.findings
        assert f.message == (f"{phase}: 7 NCCL WARN line(s) on a, first at torchrun.stdout:2: "
                             + lost[0]) and f.details == {"phase": phase, "line": 2, "count": 7}
    sink = _fsink()
    out = _fphase("kill", _fnode(tmp_path / "k2", "a", {"killed": False}, {}),
                  _fnode(tmp_path / "k2", "b", {"killed": True}, {}, stdout=lost[0]))
    assert scan_logs(sink, out) is False and sink.findings == []  # any node's kill counts


def test_an_oom_in_the_logs_counts_where_no_rank_said_so(tmp_path: Path) -> None:
    from orchestrator.steps.train.failures import scan_logs

    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried " + "m" * 300
    sink = _fsink()
    out = _fphase("restore", _fnode(tmp_path, "a", _OK, {0: [_END]},
                                    stdout=f"a\nb\n {oom}\nCUDA out of memory\n"))
    assert scan_logs(sink, out) is True
    [f] = sink.findings
    assert (f.code, f.severity, f.message, f.evidence, f.details) == (
        "TRAIN_OOM", "FAIL", "restore: CUDA out of memory on a (torchrun.stdout:3): "
        + oom[:240], ["torchrun.stdout"], {"phase": "restore", "line": 3})
    sink = _fsink()
    out = _fphase("restore", _fnode(tmp_path / "2", "a", _OK, {0: [_err(0, "no_checkpoint")]},
                                    stdout="OutOfMemoryError\n"))
    assert scan_logs(sink, out) is False and sink.findings == []


# --------------------------------------------------------------------------- the reference


def test_the_judges_records_are_stamped_with_the_run_and_subject() -> None:
    from orchestrator.judging.telemetry import TelemetryRules
    from orchestrator.steps.train.judge import Judge, Subject, telemetry_rules

    j = Judge("run-9", SUITE, Subject("lab", "n1", ["n1", "n2"], "single"), rel=lambda p: p.name)
    s = j.sink
    assert (s.run_id, s.step, s.suite_hash, s.provider, s.node, s.nodes, s.label, s.scope,
            s.engine) == ("run-9", "train", SUITE.hash, "lab", "n1", ["n1", "n2"], "single",
                          "train", "train")
    assert j.params is SUITE.train
    j.add("X", "WARN", "m", [Path("/nonexistent")], k=1)
    j.measure("y", 2, "s", t=3)
    assert [(f.code, f.severity, f.message, f.evidence, f.details) for f in j.findings] == [
        ("X", "WARN", "[single] m", [], {"k": 1})]
    assert [(m.metric, m.value, m.unit, m.tags) for m in j.measurements] == [("y", 2.0, "s",
                                                                             {"t": 3})]
    th = TrainParams().thresholds.model_copy(update={"gpu_idle_util_pct": 7.5,
                                                     "power_violation_pct": 2.5})
    assert telemetry_rules(TrainParams(thresholds=th)) == TelemetryRules(
        idle_util_pct=7.5, power_violation_pct=2.5)


def test_the_reference_line_of_the_captured_run(fx: Path) -> None:
    j = judge(fx, through="reference")
    ref = codes(j)["TRAIN_REFERENCE"]
    assert (ref.severity, ref.evidence, ref.details) == ("INFO", ["reference/a/rank0.jsonl"], {})
    assert ref.message == (
        "[multi] reference: 12 steps on 2 rank(s) (cpu, ddp), loss 5.5378 -> 4.7290; step "
        "0.05697 s median (p90 0.07482 s), 4,494 tokens/s per rank")
    assert {m.tags["steps_timed"] for m in j.measurements if m.metric.startswith("step_")} == {10}
    edit(fx / "reference/a/rank0.jsonl", lambda ev: {**ev, "compiled": True}
         if ev["event"] == "start" else ev)
    assert ", ddp, compiled), loss" in codes(judge(fx, through="reference"))[
        "TRAIN_REFERENCE"].message


def _losses(root: Path, values: list[float]) -> None:
    """Rank 0's reference steps 1..len(values) with these losses, the later steps dropped."""
    def put(ev: dict[str, Any]) -> dict[str, Any] | None:
        if ev["event"] == "step":
            if ev["step"] > len(values):
                return None
            v = values[ev["step"] - 1]
            ev.update(loss=repr(v), loss_hex=v.hex())
        return ev

    edit(root / "reference/a/rank0.jsonl", put)


def _drop(tol: float) -> Suite:
    th = SUITE.train.thresholds.model_copy(update={"loss_drop_min": tol})
    return SUITE.model_copy(update={"train": SUITE.train.model_copy(update={"thresholds": th})})


def test_a_loss_that_fell_exactly_the_minimum_has_not_fallen(fx: Path) -> None:
    """First and last quarter (3 of 12 steps each): 2.0 and 1.5, a drop of exactly 0.5
    (two or four steps each would give other means)."""
    _losses(fx, [1.5, 2.0, 2.5, 9.0, 1.75, 1.75, 1.75, 1.75, 1.75, 1.75, 1.5, 1.25])
    f = codes(judge(fx, _drop(0.5), through="reference"))["TRAIN_LOSS_NOT_DECREASING"]
    assert (f.severity, f.evidence, f.details) == ("WARN", ["reference/a/rank0.jsonl"],
                                                   {"first": 2.0, "last": 1.5})
    assert f.message == ("[multi] loss did not fall: first quarter mean 2.0000, last quarter "
                         "1.5000")
    assert "TRAIN_LOSS_NOT_DECREASING" not in codes(judge(fx, _drop(0.4375),
                                                          through="reference"))


def test_three_steps_compare_the_first_with_the_last(fx: Path) -> None:
    _losses(fx, [2.0, 1.0, 2.0])
    j = judge(fx, through="reference")
    assert codes(j)["TRAIN_LOSS_NOT_DECREASING"].details == {"first": 2.0, "last": 2.0}
    assert {m.tags["steps_timed"] for m in j.measurements if m.metric.startswith("step_")} == {3}
    assert "reference: 3 steps on 2 rank(s)" in codes(j)["TRAIN_REFERENCE"].message
    assert "loss 2.0000 -> 2.0000;" in codes(j)["TRAIN_REFERENCE"].message


def test_five_steps_leave_out_two(fx: Path) -> None:
    _losses(fx, [5.0, 4.0, 3.0, 2.0, 1.0])
    j = judge(fx, through="reference")
    assert {m.tags["steps_timed"] for m in j.measurements if m.metric.startswith("step_")} == {3}
    assert "TRAIN_LOSS_NOT_DECREASING" not in codes(j)


def test_a_slow_rank_on_cpus_is_no_straggler(fx: Path) -> None:
    from tests.unit.test_train_judge import _fwd

    _fwd(fx, 1.0)
    assert "TRAIN_STRAGGLER" not in codes(judge(fx, through="reference"))


# --------------------------------------------------------------------------- speed, exactly


def _gpu_steps(root: Path, fn: Any) -> None:
    """The GPU reference (as_gpu) with `fn(rank, ev)` applied to each step of each rank."""
    from tests.unit.test_train_judge import as_gpu, idle_dmon

    as_gpu(root, idle_dmon(2))
    for n, r in (("a", 0), ("b", 1)):
        edit(root / "reference" / n / f"rank{r}.jsonl",
             lambda ev, r=r: fn(r, ev) if ev["event"] == "step" else ev)


def test_a_straggler_whole_and_the_steps_it_is_timed_on(fx: Path) -> None:
    skip = SUITE.train.stats_skip_steps

    def fwd(r: int, ev: dict[str, Any]) -> dict[str, Any]:
        # the skipped steps: rank 0 slow; after them rank 1 is 1.5x; one step without a time
        ev["fwd_s"] = (9.0 if r == 0 else 0.25) if ev["step"] <= skip else (
            0.375 if r == 1 else 0.25)
        if ev["step"] == skip + 1 and r == 1:
            ev["fwd_s"] = None
        return ev

    _gpu_steps(fx, fwd)
    f = codes(judge(fx, through="reference"))["TRAIN_STRAGGLER"]
    assert (f.severity, f.evidence) == ("WARN", ["reference/b/rank1.jsonl"])
    assert f.details == {"rank": 1, "node_of_rank": "b", "ratio": 1.5}
    assert f.message == ("[multi] rank 1 on b is slow: forward 0.375 s median vs 0.25 s on "
                         "the other ranks (1.50x)")


def test_no_straggler_where_the_others_took_no_time_or_one_rank_was_timed(fx: Path) -> None:
    _gpu_steps(fx, lambda r, ev: {**ev, "fwd_s": 0.5 if r == 1 else 0.0})
    assert "TRAIN_STRAGGLER" not in codes(judge(fx, through="reference"))
    _gpu_steps(fx, lambda r, ev: {**ev, "fwd_s": 0.5 if r == 1 else None})
    assert "TRAIN_STRAGGLER" not in codes(judge(fx, through="reference"))


def test_a_step_of_no_time_is_left_out_of_the_input_share(fx: Path) -> None:
    skip = SUITE.train.stats_skip_steps

    def wait(ev: dict[str, Any]) -> dict[str, Any]:
        if ev["event"] == "step":
            # the skipped steps wait for everything; one timed step took no time
            ev.update(step_time_s=1.0, data_wait_s=1.0 if ev["step"] <= skip else 0.0)
            if ev["step"] == skip + 1:
                ev.update(step_time_s=0.0, data_wait_s=5.0)
            if ev["step"] in (skip + 2, skip + 3, skip + 4, skip + 5, skip + 6):
                ev["data_wait_s"] = 0.5
        return ev

    edit(fx / "reference/a/rank0.jsonl", wait)
    # the 9 timed steps with a time: 5 at 0.5, 4 at 0: the median is 0.5
    f = codes(judge(fx, through="reference"))["TRAIN_INPUT_BOUND"]
    assert f.details == {"share": 0.5} and f.evidence == ["reference/a/rank0.jsonl"]
    assert f.message == "[multi] input pipeline: waiting for data takes 50% of a step (median)"
    # 4 at 0.5 and 5 at 0: the median is 0 (the skipped step's 1.0 would make it 0.25)
    edit(fx / "reference/a/rank0.jsonl", lambda ev: {**ev, "data_wait_s": 0.0}
         if ev["event"] == "step" and ev["step"] == skip + 6 else ev)
    assert "TRAIN_INPUT_BOUND" not in codes(judge(fx, through="reference"))


def test_tokens_per_second_are_the_first_timed_steps_tokens(fx: Path) -> None:
    skip = SUITE.train.stats_skip_steps

    def tokens(r: int, ev: dict[str, Any]) -> dict[str, Any]:
        ev["tokens"] = 8192 if ev["step"] == skip + 1 else 4096
        return ev

    _gpu_steps(fx, tokens)
    edit(fx / "reference/a/rank0.jsonl", lambda ev: {k: v for k, v in ev.items()
                                                     if k != "flops_per_token"})
    m = {mm.metric: mm for mm in judge(fx, through="reference").measurements}
    assert m["tokens_per_s_per_gpu"].value == 8192.0
    assert m["mfu"].value == 0.0 and m["mfu"].tags["achieved_tflops"] == 0.0


# --------------------------------------------------------------------------- the kill and the restore


def _sup_edit(root: Path, phase: str, fn: Any) -> None:
    for n in ("a", "b"):
        p = root / phase / n / "supervise.json"
        p.write_text(json.dumps(fn(json.loads(p.read_text()))))


def test_a_kill_that_never_came_says_where_it_was_due(fx: Path) -> None:
    _sup_edit(fx, "kill", lambda d: {**d, "killed": False, "kill_time": None, "rc": 0})
    for n, r in (("a", 0), ("b", 1)):
        with (fx / "kill" / n / f"rank{r}.jsonl").open("a") as f:
            f.write(json.dumps({"event": "end", "rank": r, "t": 0, "steps": 12}) + "\n")
    f = codes(judge(fx))["TRAIN_KILL_MISSED"]
    assert f.message == ("[multi] kill: the job finished before the kill point "
                         "(before-manifest at step 7)")
    assert f.evidence == ["kill/a/supervise.json", "kill/b/supervise.json"]
    assert f.details == {}


def test_a_save_written_in_no_time_has_no_write_speed(fx: Path) -> None:
    edit(fx / "kill/a/rank0.jsonl", lambda ev: {**ev, "write_s": 0}
         if ev["event"] == "saved" else ev)
    j = judge(fx)
    assert "ckpt_write_gbs" not in metrics(j)
    saved = next(e for e in _events(FIX / "kill/a/rank0.jsonl") if e["event"] == "saved")
    assert (f"written at {saved['bytes'] / 1e-9 / 1e9:.2f} GB/s)"
            in codes(j)["TRAIN_KILLED"].message)


def test_the_newest_complete_save_of_rank_0_is_the_one_to_restore(fx: Path) -> None:
    kill = fx / "kill" / "a" / "rank0.jsonl"
    saved5 = next(e for e in _events(kill) if e["event"] == "saved")
    with kill.open("a") as f:
        for extra in ({**saved5, "step": 9, "problems": ["torn"]}, {**saved5, "step": 8, "rank": 1}):
            f.write(json.dumps(extra) + "\n")
    c = codes(judge(fx))
    assert "TRAIN_RESTORE_OK" in c and "step 5 restored" in c["TRAIN_RESTORE_OK"].message


def test_a_restored_lr_for_the_next_step_that_differs_fails(fx: Path) -> None:
    ref6 = next(e for e in _events(FIX / "reference/a/rank0.jsonl")
                if e["event"] == "step" and e["step"] == 6)
    edit(fx / "restore/b/rank0.jsonl", lambda ev: {**ev, "lr_next": 0.25}
         if ev["event"] == "loaded" else ev)
    f = codes(judge(fx))["TRAIN_RESTORE_MISMATCH"]
    assert f.details["problems"] == [f"LR for step 6: restored 0.25, reference {ref6['lr']!r}"]


def test_a_restored_run_that_broke_without_a_difference_did_not_finish(fx: Path) -> None:
    (fx / "restore" / "a" / "torchrun.stderr").write_text("NCCL timeout\n")
    j = judge(fx)
    f = codes(j)["TRAIN_RESTORE_MISMATCH"]
    assert f.message == ("[multi] restore (saved on a+b, restored on b+a): the restored run "
                         "did not finish")
    assert f.details == {"problems": []} and f.severity == "FAIL"
    assert f.evidence == ["restore/b/rank0.jsonl", "reference/a/rank0.jsonl"]
    assert "TRAIN_RESTORE_OK" not in codes(j) and "ckpt_load_s" in metrics(j)


def test_a_restore_within_the_tolerance_says_so_whole(fx: Path) -> None:
    suite = _inexact(fx, 2 ** -10)
    _set_loss(fx, "reference", "a/rank0.jsonl", {6: 4.0})
    _set_loss(fx, "kill", "a/rank0.jsonl", {6: 4.0})
    _set_loss(fx, "restore", "b/rank0.jsonl", {6: 4.0 + 2 ** -10})
    j = judge(fx, suite)
    ok = codes(j)["TRAIN_RESTORE_OK"]
    reasons = ("an operation without a deterministic kernel: index_add_; an operation without "
               "a deterministic kernel: scatter_add_")
    assert ok.message == (
        "[multi] restore verified (saved on a+b, restored on b+a): step 5 restored, "
        "model/optimizer/RNG state hashes equal on every rank, LR equal, losses of steps "
        f"6..12 within 0.000976562 of the reference (not exact: {reasons}); restart "
        f"{metrics(j)['restart_s']:.1f} s, 2 step(s) of work lost")
    assert ok.severity == "WARN" and ok.details["inexact"] == reasons.split("; ")


def test_a_kill_that_came_after_the_save_completed_has_nothing_to_skip(fx: Path) -> None:
    kill = fx / "kill" / "a" / "rank0.jsonl"
    saved5 = next(e for e in _events(kill) if e["event"] == "saved")
    with kill.open("a") as f:
        f.write(json.dumps({**saved5, "step": 7}) + "\n")
    for r, n in ((0, "b"), (1, "a")):
        edit(fx / "restore" / n / f"rank{r}.jsonl",
             lambda ev: None if ev["event"] == "skip_ckpt" else ev)
    [f] = [f for f in judge(fx).findings if f.code == "TRAIN_CKPT_SKIPPED"]
    assert f.message == ("[multi] restore: nothing to skip: the kill landed after the save of "
                         "step 7 completed (raise train.manifest_delay_s to catch it open)")
    assert f.details == {"late": True} and f.evidence == ["restore/b/rank0.jsonl"]


def test_a_skipped_checkpoint_without_reasons(fx: Path) -> None:
    edit(fx / "restore/b/rank0.jsonl", lambda ev: {**ev, "reasons": None}
         if ev["event"] == "skip_ckpt" else ev)
    f = codes(judge(fx))["TRAIN_CKPT_SKIPPED"]
    assert f.message == "[multi] restore: checkpoint of step 7 skipped: "


def test_no_restart_time_without_the_kill_or_the_relaunch_clock(fx: Path) -> None:
    _sup_edit(fx, "kill", lambda d: {**d, "kill_time": None})
    m = metrics(judge(fx))
    assert "restart_s" not in m and "steps_lost" not in m and "ckpt_load_s" in m
    fx2 = Path(__import__("shutil").copytree(FIX, fx.parent / "fx2"))
    _sup_edit(fx2, "restore", lambda d: {**d, "start_time": 0})
    assert "restart_s" not in metrics(judge(fx2))
    fx3 = Path(__import__("shutil").copytree(FIX, fx.parent / "fx3"))
    _sup_edit(fx3, "kill", lambda d: {**d, "end_time": None} if d.get("node") != "x" else d)
    assert "restart_s" not in metrics(judge(fx3))


def test_the_restart_is_the_slowest_death_plus_the_relaunch(fx: Path) -> None:
    sups = {n: _sup("kill", n) for n in ("a", "b")}
    _sup_edit(fx, "kill", lambda d: {**d, "end_time": d["kill_time"] + (
        3.0 if d["kill_time"] == sups["a"]["kill_time"] else 1.0)})
    start = _sup("restore", "b")["start_time"]
    step6 = next(e for e in _events(FIX / "restore/b/rank0.jsonl")
                 if e["event"] == "step" and e["step"] == 6)
    [r] = [m for m in judge(fx).measurements if m.metric == "restart_s"]
    dying = max(3.0 if sups[n]["kill_time"] == sups["a"]["kill_time"] else 1.0 for n in "ab")
    assert r.tags["dying_s"] == pytest.approx(dying)
    assert r.value == pytest.approx(dying + step6["t"] - start)
    assert r.unit == "s"


def test_an_error_before_the_kill_point_fails_though_the_point_came_after(tmp_path: Path) -> None:
    from orchestrator.steps.train.failures import failed

    params = TrainParams(ckpt_step=5, kill_offset=2, kill="before-manifest")
    evs = [{"event": "step", "step": 6}, _err(1, "exception"), {"event": "commit", "step": 7}]
    nodes = (_fnode(tmp_path, "a", {"killed": True}, {0: []}),
             _fnode(tmp_path, "b", {"killed": False}, {1: evs}))
    sink = _fsink()
    echoes: list[str] = []
    assert failed(sink, params, _fphase("kill", *nodes), killed_ok=True, echoes=echoes)
    assert [f.message for f in sink.findings] == ["kill: RuntimeError on rank 1 on b: boom 1"]
    assert echoes == []


def test_an_unreadable_supervisor_document_is_the_evidence(tmp_path: Path) -> None:
    from orchestrator.steps.train.failures import failed

    sink = _fsink()
    node = _fnode(tmp_path, "a", {}, {0: [_END]})  # the file is there, its document is not
    assert failed(sink, TrainParams(), _fphase("reference", node))
    [f] = sink.findings
    assert f.message == "reference: no supervisor document from a"
    assert f.evidence == ["supervise.json"]


def test_a_log_with_bytes_that_are_not_utf8_is_still_read(tmp_path: Path) -> None:
    from orchestrator.steps.train.failures import scan_logs

    d = tmp_path / "a"
    node = _fnode(tmp_path, "a", _OK, {})
    (d / "torchrun.stderr").write_bytes(b"\xff\xfe NCCL timeout\n")
    sink = _fsink()
    assert scan_logs(sink, _fphase("reference", node)) is True
    assert [f.message for f in sink.findings] == [
        "reference: collective timeout on a (torchrun.stderr:1): \ufffd\ufffd NCCL timeout"]


def test_recorded_hashes_that_differ_name_the_rank(fx: Path) -> None:
    edit(fx / "kill/b/rank1.jsonl", lambda ev: {**ev, "hashes": {**ev["hashes"], "rng": "0"}}
         if ev["event"] == "saved" and ev["step"] == 5 else ev)
    f = codes(judge(fx))["TRAIN_RESTORE_MISMATCH"]
    assert f.details["problems"] == [
        "rank 1: the checkpoint's recorded hashes differ from those the saving run logged"]


def test_no_checkpoint_to_load_says_the_ranks_words(fx: Path) -> None:
    with (fx / "restore/a/rank1.jsonl").open("a") as f:
        f.write(json.dumps({"event": "error", "kind": "no_checkpoint", "rank": 1, "t": 0,
                            "message": "nothing under /ck"}) + "\n")
    j = judge(fx)
    [f] = [f for f in j.findings if f.code == "TRAIN_RESTORE_FAILED"]
    assert f.message == ("[multi] restore: nothing under /ck (saved on a+b, restored on b+a)")
    assert f.evidence == ["restore/b/rank0.jsonl"] and f.severity == "FAIL"
    assert "TRAIN_RESTORE_OK" not in codes(j) and "TRAIN_CKPT_SKIPPED" in codes(j)


def test_a_skip_gives_each_of_its_reasons(fx: Path) -> None:
    edit(fx / "restore/b/rank0.jsonl", lambda ev: {**ev, "reasons": ["r1", "r2"]}
         if ev["event"] == "skip_ckpt" else ev)
    f = codes(judge(fx))["TRAIN_CKPT_SKIPPED"]
    assert f.message == "[multi] restore: checkpoint of step 7 skipped: r1; r2"
    assert f.details == {"ckpt_step": 7}


def test_a_kill_judged_without_a_reference_compares_nothing(fx: Path) -> None:
    from orchestrator.steps.train import restore
    from orchestrator.steps.train.reading import Earlier
    from tests.unit.test_train_judge import phase

    sink = _fsink()
    earlier = Earlier()
    assert restore.kill(sink, SUITE.train, earlier, phase(fx, "kill"))
    assert earlier.inexact == [] and earlier.saved_step == 5
    assert earlier.kill_out is not None and earlier.kill_out.phase == "kill"


def test_a_restore_judged_without_the_kill_restores_the_suites_step(fx: Path) -> None:
    from orchestrator.steps.train import restore
    from orchestrator.steps.train.reading import Earlier
    from tests.unit.test_train_judge import phase

    sink = _fsink()
    earlier = Earlier(ref=phase(fx, "reference"))
    restore.restore(sink, SUITE.train, earlier, phase(fx, "restore"), saved_on=["a"],
                    restored_on=["b"])
    [ok] = [f for f in sink.findings if f.code == "TRAIN_RESTORE_OK"]
    assert ok.message == (
        "restore verified (saved on a, restored on b): step 5 restored, model/optimizer/RNG "
        "state hashes equal on every rank, LR equal, losses of steps 6..12 equal the "
        "reference bit for bit")
    assert [m.metric for m in sink.measurements] == ["ckpt_load_s"]


def test_the_slowest_rank_may_be_rank_0_and_the_last_skipped_step_is_left_out(
        fx: Path) -> None:
    skip = SUITE.train.stats_skip_steps

    def fwd(r: int, ev: dict[str, Any]) -> dict[str, Any]:
        # rank 0 timed once after the skipped steps (0.375), and slow on the last skipped one
        if r == 0:
            ev["fwd_s"] = {skip: 9.0, skip + 1: 0.375}.get(ev["step"])
        else:
            ev["fwd_s"] = 0.25
        return ev

    _gpu_steps(fx, fwd)
    f = codes(judge(fx, through="reference"))["TRAIN_STRAGGLER"]
    assert f.details == {"rank": 0, "node_of_rank": "a", "ratio": 1.5}
    assert f.evidence == ["reference/a/rank0.jsonl"]


def test_the_suites_own_peak_and_the_headlines_mfu(fx: Path) -> None:
    from tests.unit.test_train_judge import as_gpu, idle_dmon

    as_gpu(fx, idle_dmon(2))
    with (fx / "reference/a/rank0.jsonl").open("a") as f:
        for k in range(2):
            f.write(json.dumps({"event": "throughput_step", "rank": 0, "t": 2000 + k,
                                "step": 13 + k, "step_time_s": 0.5, "tokens": 16384}) + "\n")
    own = SUITE.model_copy(update={"train": SUITE.train.model_copy(
        update={"peak_tflops": {"cpu": 500.0}})})
    j = judge(fx, own, through="reference")
    m = {mm.metric: mm for mm in j.measurements}
    flops = _events(fx / "reference/a/rank0.jsonl")[0]["flops_per_token"]
    assert m["mfu"].value == flops * 16384 / 0.5 / 1e12 / 500.0
    assert m["mfu"].tags["peak_source"] == "suite train.peak_tflops.cpu"
    assert m["deterministic_mfu"].value == flops * 16384 / 1e12 / 500.0
    assert "of 500 TFLOP/s) on the fastest kernels" in codes(j)["TRAIN_REFERENCE"].message


def test_a_reference_that_ran_past_its_time_says_the_suites_limit(fx: Path) -> None:
    p = fx / "reference/a/supervise.json"
    p.write_text(json.dumps({**json.loads(p.read_text()), "timed_out": True}))
    j = judge(fx)
    [f] = [f for f in j.findings if f.code == "TRAIN_TIMEOUT"]
    assert f.message == (f"[multi] reference: still running on a after "
                         f"{SUITE.train.timeout_s:.0f} s; killed")
    assert "TRAIN_REFERENCE" not in codes(j) and "TRAIN_KILLED" not in codes(j)


def test_the_telemetry_window_opens_when_the_first_step_began(fx: Path) -> None:
    """as_gpu's steps end at 1001..1012 s after a second each: the window opens at 1000 s
    (one interval of slack before it); dmon started at 998 s, its samples at 999..1006 s."""
    from tests.unit.test_train_judge import as_gpu, idle_dmon

    as_gpu(fx, idle_dmon(2))
    for n in ("a", "b"):
        p = fx / "reference" / n / "supervise.json"
        doc = json.loads(p.read_text())
        doc["telemetry"]["started"] = 998.0
        p.write_text(json.dumps(doc))
    j = judge(fx, through="reference")
    assert [m.tags["samples"] for m in j.measurements if m.metric == "gpu_util_pct"] == [8] * 4


def test_step_times_are_in_seconds(fx: Path) -> None:
    m = {mm.metric: mm for mm in judge(fx, through="reference").measurements}
    assert (m["step_time_s"].unit, m["step_time_p90_s"].unit) == ("s", "s")
    assert m["tokens_per_s_per_rank"].unit == "tokens/s"


def test_the_checkpoint_measurements_carry_their_units(fx: Path) -> None:
    m = {x.metric: x for x in judge(fx).measurements}
    assert {k: m[k].unit for k in ("ckpt_size_bytes", "ckpt_write_gbs", "ckpt_load_s")} == {
        "ckpt_size_bytes": "bytes", "ckpt_write_gbs": "GB/s", "ckpt_load_s": "s"}


def test_a_failed_or_missed_kill_stops_the_judging_there(fx: Path) -> None:
    # kill() says whether the restore can be judged: not after a failed kill phase, nor
    # after a kill that never came (the restore's findings would then be noise)
    from tests.unit.test_train_judge import phase

    def kill_of(root: Path) -> tuple[bool, set[str]]:
        j = judge(root, through="reference")
        return j.kill(phase(root, "kill")), {f.code for f in j.sink.findings}

    for n in ("a", "b"):
        doc = json.loads((fx / "kill" / n / "supervise.json").read_text())
        doc.update(killed=False, kill_time=None, rc=0)
        (fx / "kill" / n / "supervise.json").write_text(json.dumps(doc))
    ok, found = kill_of(fx)
    assert ok is False and "TRAIN_FAILED" in found
    for n, r in (("a", 0), ("b", 1)):
        with (fx / "kill" / n / f"rank{r}.jsonl").open("a") as f:
            f.write(json.dumps({"event": "end", "rank": r, "t": 0, "steps": 12}) + "\n")
    ok, found = kill_of(fx)
    assert ok is False and "TRAIN_KILL_MISSED" in found and "TRAIN_KILLED" not in found


def test_two_spoiled_states_are_both_named_each_hash_cut_at_twelve(fx: Path) -> None:
    def spoil(part: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
        def edit_loaded(ev: dict[str, Any]) -> dict[str, Any]:
            if ev["event"] == "loaded":
                ev["hashes_loaded"][part] = "abcdef0123456789" * 4
            return ev
        return edit_loaded

    edit(fx / "restore" / "b" / "rank0.jsonl", spoil("model"))
    edit(fx / "restore" / "a" / "rank1.jsonl", spoil("optimizer"))
    saved = {r: next(e for e in _events(FIX / f"restore/{n}/rank{r}.jsonl")
                     if e["event"] == "loaded")["hashes_saved"] for r, n in ((0, "b"), (1, "a"))}
    f = codes(judge(fx))["TRAIN_RESTORE_MISMATCH"]
    want = [f"rank 0: model state after load abcdef012345 differs from the saved "
            f"{saved[0]['model'][:12]}",
            f"rank 1: optimizer state after load abcdef012345 differs from the saved "
            f"{saved[1]['optimizer'][:12]}"]
    assert f.details["problems"] == want
    assert f.message.endswith(": " + "; ".join(want))
