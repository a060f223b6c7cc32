"""The rank program itself, one rank on gloo: reference, a run that saves twice, a
restore that must skip the half-written checkpoint and continue bit for bit.

The three phases run in one subprocess (torch is imported once); the
multi-rank, multi-node protocol with torchrun and a real SIGKILL is
tests/integration/test_train.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from payload.train import manifest, protocol
from payload.train.loop import lr_factor

ROOT = Path(__file__).resolve().parents[3]

DRIVER = r"""
import argparse, json, os, socket, sys
from payload.train import loop

def port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

spec = json.loads(sys.argv[1])
for phase, out, saves in spec["phases"]:
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port()))
    ns = argparse.Namespace(phase=phase, out=out, ckpt_dir=spec["ckpt"],
                            params=json.dumps(spec["params"]), save_at=saves)
    rc = loop.main(ns)
    print("RC", phase, rc, flush=True)
    if phase == "kill":
        last = os.path.join(spec["ckpt"], sorted(
            d for d in os.listdir(spec["ckpt"]) if d.startswith("step-"))[-1])
        if spec.get("damage") == "bytes":  # complete, then a data file changed on disk
            name = sorted(n for n in os.listdir(last) if n.endswith(".distcp"))[0]
            with open(os.path.join(last, name), "r+b") as f:
                f.seek(os.path.getsize(f.name) // 2)
                b = f.read(1)
                f.seek(-1, 1)
                f.write(bytes([b[0] ^ 0x40]))
        else:  # what a kill during the second save leaves: no manifest
            os.unlink(os.path.join(last, "manifest.json"))
"""


def _steps(path: Path) -> dict[int, dict[str, Any]]:
    return {e["step"]: e for e in protocol.read_events(str(path)) if e["event"] == "step"}


def _run(tmp_path: Path, params: dict[str, Any], phases: list[tuple[str, str, list[int]]],
         damage: str = "manifest") -> subprocess.CompletedProcess[str]:
    pytest.importorskip("torch")
    spec = {"params": params, "ckpt": str(tmp_path / "ckpt"), "phases": phases,
            "damage": damage}
    env = dict(os.environ, OMP_NUM_THREADS="1", CUBLAS_WORKSPACE_CONFIG=":4096:8")
    return subprocess.run([sys.executable, "-c", DRIVER, json.dumps(spec)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240)


PARAMS = {"model": "tiny", "steps": 8, "ckpt_step": 3, "dropout": 0.1, "warmup_steps": 2,
          "lr": 0.003}


def test_restore_skips_the_half_written_checkpoint_and_continues_exactly(tmp_path: Path
                                                                         ) -> None:
    res = _run(tmp_path, dict(PARAMS, manifest_behind=True),
               [("reference", str(tmp_path / "ref"), []),
                ("kill", str(tmp_path / "kill"), [3, 5]),
                ("restore", str(tmp_path / "restore"), [])])
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert "RC restore 0" in res.stdout
    ref, restored = _steps(tmp_path / "ref" / "rank0.jsonl"), _steps(
        tmp_path / "restore" / "rank0.jsonl")
    assert sorted(restored) == [4, 5, 6, 7, 8]
    assert [restored[k]["loss_hex"] for k in restored] == [ref[k]["loss_hex"] for k in restored]
    assert float(ref[8]["loss"]) < float(ref[1]["loss"])  # it learns
    events = protocol.read_events(str(tmp_path / "restore" / "rank0.jsonl"))
    skip = next(e for e in events if e["event"] == "skip_ckpt")
    assert skip["step"] == 5 and "no manifest" in skip["reasons"][0]
    loaded = next(e for e in events if e["event"] == "loaded")
    assert loaded["step"] == 3 and loaded["match"] is True
    assert loaded["hashes_saved"] == loaded["hashes_loaded"]
    assert loaded["lr_last"] == ref[3]["lr"] and loaded["lr_next"] == ref[4]["lr"]
    assert loaded["data_position"] == 3
    saved = [e for e in protocol.read_events(str(tmp_path / "kill" / "rank0.jsonl"))
             if e["event"] == "saved"]
    assert [s["step"] for s in saved] == [3, 5]
    assert saved[0]["hashes"] == loaded["hashes_saved"]
    kill = [(e["event"], e.get("step")) for e in protocol.read_events(
        str(tmp_path / "kill" / "rank0.jsonl")) if e["event"] != "warmup"]
    # step 3's files are hashed for its manifest while steps 4 and 5 train and step 5's
    # files are written; its manifest is on disk before step 5's commit, where a
    # before-manifest kill lands
    assert kill[kill.index(("saving", 3)):kill.index(("commit", 5)) + 1] == [
        ("saving", 3), ("commit", 3), ("step", 4), ("step", 5), ("saving", 5), ("saved", 3),
        ("commit", 5)]
    assert saved[0]["behind"] is True and saved[1]["behind"] is False
    assert saved[0]["save_s"] >= saved[0]["write_s"] + saved[0]["hash_s"]
    doc, _ = manifest.read_manifest(manifest.step_dir(str(tmp_path / "ckpt"), 3))
    assert doc is not None and doc["world_size"] == 1
    # the reference alone goes on past its verified steps, out of deterministic mode
    ref_events = protocol.read_events(str(tmp_path / "ref" / "rank0.jsonl"))
    kinds = [e["event"] for e in ref_events]
    switch = next(e for e in ref_events if e["event"] == protocol.THROUGHPUT)
    assert kinds.index(protocol.THROUGHPUT) == kinds.index("step") + 8  # after step 8
    assert switch["deterministic"]["use_deterministic_algorithms"] is False
    assert switch["first_step"] == 9 and switch["steps"] == 10
    fast = [e for e in ref_events if e["event"] == protocol.TSTEP]
    assert [e["step"] for e in fast] == list(range(10, 20))
    assert all(e["tokens"] == ref[1]["tokens"] and e["step_time_s"] > 0 for e in fast)
    assert kinds[-1] == "end"
    for phase in ("kill", "restore"):
        assert not [e for e in protocol.read_events(str(tmp_path / phase / "rank0.jsonl"))
                    if e["event"] in (protocol.THROUGHPUT, protocol.TSTEP)], phase


def test_a_checkpoint_whose_bytes_changed_is_skipped_and_the_older_one_loaded_over_it(
        tmp_path: Path) -> None:
    """The newest checkpoint has its manifest but a data file changed after it was written:
    it is hashed while it loads, fails, and the older one is loaded in its place; the run
    continues from the older step bit for bit (nothing of the bad one stays)."""
    res = _run(tmp_path, PARAMS, [("reference", str(tmp_path / "ref"), []),
                                  ("kill", str(tmp_path / "kill"), [3, 5]),
                                  ("restore", str(tmp_path / "restore"), [])], damage="bytes")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    # without manifest_behind (a kill at a step or at a save's start) each save's
    # manifest is written before the training goes on
    kill = [(e["event"], e.get("step")) for e in protocol.read_events(
        str(tmp_path / "kill" / "rank0.jsonl")) if e["event"] != "warmup"]
    assert kill[kill.index(("saving", 3)):kill.index(("step", 4)) + 1] == [
        ("saving", 3), ("commit", 3), ("saved", 3), ("step", 4)]
    events = protocol.read_events(str(tmp_path / "restore" / "rank0.jsonl"))
    (skip,) = [e for e in events if e["event"] == "skip_ckpt"]
    assert skip["step"] == 5 and "sha256" in skip["reasons"][0], skip
    loaded = next(e for e in events if e["event"] == "loaded")
    assert loaded["step"] == 3 and loaded["match"] is True and loaded["skipped"] == 1
    assert 0 < loaded["verify_s"] <= loaded["load_s"]
    ref, restored = _steps(tmp_path / "ref" / "rank0.jsonl"), _steps(
        tmp_path / "restore" / "rank0.jsonl")
    assert sorted(restored) == [4, 5, 6, 7, 8]
    assert [restored[k]["loss_hex"] for k in restored] == [ref[k]["loss_hex"] for k in restored]


def test_no_throughput_segment_when_the_verified_steps_are_not_deterministic(
        tmp_path: Path) -> None:
    """deterministic: false already times the fastest kernels; throughput_steps: 0 asks
    for none."""
    res = _run(tmp_path, {**PARAMS, "deterministic": False},
               [("reference", str(tmp_path / "a"), [])])
    res2 = _run(tmp_path, {**PARAMS, "throughput_steps": 0},
                [("reference", str(tmp_path / "b"), [])])
    for r, out in ((res, "a"), (res2, "b")):
        assert "RC reference 0" in r.stdout, r.stderr[-2000:]
        kinds = [e["event"] for e in protocol.read_events(str(tmp_path / out / "rank0.jsonl"))]
        assert protocol.TSTEP not in kinds and protocol.THROUGHPUT not in kinds
        assert kinds.count("step") == 8 and kinds[-1] == "end"


def test_nan_stops_the_run_with_its_step(tmp_path: Path) -> None:
    res = _run(tmp_path, {**PARAMS, "inject_nan_at_step": 2},
               [("reference", str(tmp_path / "ref"), [])])
    assert f"RC reference {protocol.RC_NONFINITE}" in res.stdout, res.stderr[-2000:]
    events = protocol.read_events(str(tmp_path / "ref" / "rank0.jsonl"))
    err = next(e for e in events if e["event"] == "error")
    assert err["kind"] == "nonfinite" and err["step"] == 2
    assert sorted(_steps(tmp_path / "ref" / "rank0.jsonl")) == [1, 2]


def test_restore_without_a_complete_checkpoint_says_so(tmp_path: Path) -> None:
    (tmp_path / "ckpt" / "step-00000004").mkdir(parents=True)
    res = _run(tmp_path, PARAMS, [("restore", str(tmp_path / "restore"), [])])
    assert f"RC restore {protocol.RC_NO_CHECKPOINT}" in res.stdout, res.stderr[-2000:]
    events = protocol.read_events(str(tmp_path / "restore" / "rank0.jsonl"))
    assert [e["event"] for e in events][-2:] == ["skip_ckpt", "error"]


def test_lr_schedule_warms_up_then_decays_to_the_floor() -> None:
    cfg = {"warmup_steps": 4, "steps": 20, "min_lr_ratio": 0.1}
    f = [lr_factor(cfg, i) for i in range(20)]
    assert f[:4] == [0.25, 0.5, 0.75, 1.0]
    assert all(a >= b for a, b in zip(f[3:], f[4:], strict=False))
    assert f[-1] > 0.1 and abs(lr_factor(cfg, 20) - 0.1) < 1e-12


def test_a_rank_that_dies_of_a_checkpoint_exception_records_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """DCP wraps a writer thread's OSError in a CheckpointException, a BaseException: the
    rank's handler must still record it (kind, type and the cause's last line) and exit 1,
    or the judge is left with a traceback and no record."""
    pytest.importorskip("torch")
    import argparse

    from payload.train import loop

    class CheckpointException(BaseException):
        pass

    def run(*_: Any) -> int:
        raise CheckpointException("CheckpointException ranks:dict_keys([0])\nTraceback "
                                  "(most recent call last):\nOSError: [Errno 28] No space "
                                  "left on device")

    monkeypatch.setattr(loop, "run", run)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv(loop.FAST_EXIT_ENV, raising=False)
    ns = argparse.Namespace(out=str(tmp_path), params=json.dumps({"model": "tiny"}))
    assert loop.main(ns) == 1
    (err,) = [e for e in protocol.read_events(str(tmp_path / "rank0.jsonl"))
              if e["event"] == protocol.ERROR]
    assert (err["kind"], err["type"]) == ("no_space", "CheckpointException")
    assert err["cause"] == "OSError: [Errno 28] No space left on device"
