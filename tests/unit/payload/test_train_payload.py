"""The node side of the training step: configuration, data, checkpoint manifest,
progress events, the supervisor's trigger and kill, telemetry, the probe."""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from payload.train import ckpt, config, manifest, probe, protocol, supervise, telemetry

ROOT = Path(__file__).resolve().parents[3]
TRAIN_DIR = ROOT / "payload" / "train"


def _python38() -> str | None:
    for cand in [os.environ.get("GPUVET_PYTHON38", ""),
                 *sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.8*/bin/python3")))]:
        if cand and os.access(cand, os.X_OK):
            return cand
    return shutil.which("python3.8")


PY38 = _python38()


# --------------------------------------------------------------------------- config


def test_presets_resolve_and_overrides_win() -> None:
    cfg = config.resolve({"model": "1b"})
    assert (cfg["d_model"], cfg["n_layers"], cfg["seq_len"], cfg["micro_batch"]) == (
        2048, 18, 2048, 8)
    assert config.resolve({"model": "1b", "seq_len": 512})["seq_len"] == 512
    with pytest.raises(ValueError, match="unknown model preset"):
        config.resolve({"model": "7b"})
    with pytest.raises(ValueError, match="multiple of n_heads"):
        config.resolve({"model": "tiny", "n_heads": 5})


def test_param_counts_match_the_presets_names() -> None:
    """The 1b preset is the reference figures' 1.01B model, 350m about 354M."""
    assert 1.00e9 < config.param_count(config.resolve({"model": "1b"})) < 1.02e9
    assert 3.50e8 < config.param_count(config.resolve({"model": "350m"})) < 3.60e8
    # 6N + 12 L d T for the 1b preset
    cfg = config.resolve({"model": "1b"})
    assert config.flops_per_token(cfg) == 6 * config.param_count(cfg) + 12 * 18 * 2048 * 2048


def test_param_count_equals_the_model_it_describes() -> None:
    pytest.importorskip("torch")
    from payload.train import model

    cfg = config.resolve({"model": "tiny", "n_layers": 3})
    m = model.build(cfg, "cpu")
    total = sum(p.numel() for p in m.parameters())  # tied weights counted once
    assert total - m.pos.weight.numel() == config.param_count(cfg)


# --------------------------------------------------------------------------- data


def test_batches_are_a_function_of_position_and_rank() -> None:
    pytest.importorskip("torch")
    from payload.train.data import SyntheticTokens

    a = SyntheticTokens(7, 0, 256, 16, 2)
    b = SyntheticTokens(7, 0, 256, 16, 2)
    a.next()
    x1, y1 = a.next()
    b.load_state_dict({"position": 1, "seed": 7, "rank": 0})
    x2, y2 = b.next()
    assert x1.equal(x2) and y1.equal(y2)
    assert not SyntheticTokens(7, 1, 256, 16, 2).batch_at(1)[0].equal(x1)
    assert x1[:, 1:].equal(y1[:, :-1])  # targets are the next tokens
    assert int(x1.max()) < 256 and int(x1.min()) >= 0
    with pytest.raises(ValueError, match="seed"):
        b.load_state_dict({"position": 0, "seed": 8, "rank": 0})


# --------------------------------------------------------------------------- manifest


def _fake_ckpt(root: Path, step: int, *, complete: bool = True) -> Path:
    d = Path(manifest.step_dir(str(root), step))
    d.mkdir(parents=True)
    (d / "__0_0.distcp").write_bytes(b"a" * 100)
    (d / ".metadata").write_bytes(b"meta")
    (d / "extra-rank0.pt").write_bytes(b"extra")
    if complete:
        files = manifest.hash_share(str(d), manifest.data_files(str(d)), 0, 1)
        manifest.write_manifest(str(d), {"format": manifest.FORMAT, "step": step,
                                         "world_size": 1, "files": files, "hashes": []})
    return d


def test_manifest_lists_every_file_and_verifies(tmp_path: Path) -> None:
    d = _fake_ckpt(tmp_path, 5)
    doc, why = manifest.read_manifest(str(d))
    assert why is None and doc is not None
    assert sorted(doc["files"]) == [".metadata", "__0_0.distcp", "extra-rank0.pt"]
    assert manifest.check_share(str(d), doc, 0, 1) == []
    assert not list(d.glob(".*.tmp"))  # the temporary manifest was renamed


def test_a_changed_missing_or_extra_file_is_a_problem(tmp_path: Path) -> None:
    d = _fake_ckpt(tmp_path, 5)
    doc, _ = manifest.read_manifest(str(d))
    assert doc is not None
    (d / "__0_0.distcp").write_bytes(b"b" * 100)  # same size, other bytes
    assert any("sha256" in p for p in manifest.check_share(str(d), doc, 0, 1))
    (d / "__0_0.distcp").write_bytes(b"a" * 99)
    assert any("99 bytes" in p for p in manifest.check_share(str(d), doc, 0, 1))
    (d / "__0_0.distcp").unlink()
    assert any("FileNotFoundError" in p for p in manifest.check_share(str(d), doc, 0, 1))
    d2 = _fake_ckpt(tmp_path, 6)
    doc2, _ = manifest.read_manifest(str(d2))
    (d2 / "stray.bin").write_bytes(b"x")
    assert any("not in the manifest" in p for p in manifest.check_share(str(d2), doc2, 0, 1))


def test_ranks_split_the_hashing(tmp_path: Path) -> None:
    d = _fake_ckpt(tmp_path, 5)
    names = manifest.data_files(str(d))
    shares = [manifest.hash_share(str(d), names, r, 2) for r in range(2)]
    assert sorted([*shares[0], *shares[1]]) == names
    assert not set(shares[0]) & set(shares[1])


def test_threaded_hashing_agrees_with_one_thread(tmp_path: Path) -> None:
    import hashlib

    d = tmp_path / "c"
    d.mkdir()
    for i in range(7):
        (d / f"__0_{i}.distcp").write_bytes(bytes([i]) * (1000 + 37 * i))
    names = manifest.data_files(str(d)) + ["gone.distcp"]
    for rank, world in ((0, 1), (1, 2)):
        one = manifest.hash_share(str(d), names, rank, world, threads=1)
        many = manifest.hash_share(str(d), names, rank, world, threads=4)
        assert many == one
        assert list(many) == [n for i, n in enumerate(names) if i % world == rank]
    both = manifest.hash_share(str(d), names, 0, 1, threads=4)
    assert both["__0_3.distcp"] == {"sha256": hashlib.sha256(b"\x03" * 1111).hexdigest(),
                                    "bytes": 1111}
    assert "FileNotFoundError" in both["gone.distcp"]["error"]


def test_a_checkpoint_without_manifest_is_incomplete(tmp_path: Path) -> None:
    d = _fake_ckpt(tmp_path, 7, complete=False)
    doc, why = manifest.read_manifest(str(d))
    assert doc is None and why is not None and "no manifest" in why
    (d / manifest.MANIFEST).write_text("{not json")
    assert "unreadable" in (manifest.read_manifest(str(d))[1] or "")
    _fake_ckpt(tmp_path, 12)
    assert [s for s, _ in manifest.step_dirs(str(tmp_path))] == [12, 7]  # newest first


def test_digest_sees_a_single_bit_and_ignores_nothing() -> None:
    torch = pytest.importorskip("torch")
    t = torch.randn(1000)
    base = ckpt.digest({"w": t, "step": 3})
    flipped = t.clone()
    flipped.view(torch.int32)[417] ^= 1
    assert ckpt.digest({"w": flipped, "step": 3}) != base
    assert ckpt.digest({"w": t.clone(), "step": 3}) == base
    assert ckpt.digest({"w": t, "step": 4}) != base
    assert ckpt.digest({"w": t.to(torch.bfloat16)}) != ckpt.digest({"w": t.to(torch.float16)})
    odd = torch.ones(3, dtype=torch.bfloat16)  # 6 bytes: padded to whole words
    assert ckpt.digest({"w": odd}) != ckpt.digest({"w": torch.ones(2, dtype=torch.bfloat16)})


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_the_threaded_reader_loads_every_file_bit_for_bit(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    import threading

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

    from payload.train import model

    cfg = config.resolve({"model": "tiny"})
    torch.manual_seed(1)
    m = model.build(cfg, "cpu")
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    x = torch.randint(0, cfg["vocab_size"], (2, cfg["seq_len"]))
    m(x, x).backward()
    opt.step()  # AdamW's moments exist
    state = {"model": m.state_dict(), "optim": opt.state_dict()}
    saved = ckpt.digest(state)
    dcp.save(state, storage_writer=FileSystemWriter(str(tmp_path), thread_count=4))
    assert len(list(tmp_path.glob("*.distcp"))) == 4

    calls: list[tuple[int, int]] = []
    stock = FileSystemReader.read_data

    def spy(self: Any, plan: Any, planner: Any) -> Any:
        calls.append((threading.get_ident(), len(plan.items)))
        return stock(self, plan, planner)

    monkeypatch.setattr(FileSystemReader, "read_data", spy)
    torch.manual_seed(2)  # other weights, no moments: everything must come from the files
    m2 = model.build(cfg, "cpu")
    opt2 = torch.optim.AdamW(m2.parameters(), lr=1e-3)
    m2(x, x).backward()
    opt2.step()
    target = {"model": m2.state_dict(), "optim": opt2.state_dict()}
    assert ckpt.digest(target) != saved
    dcp.load(target, storage_reader=ckpt.reader(str(tmp_path), threads=4))
    m2.load_state_dict(target["model"])
    opt2.load_state_dict(target["optim"])
    assert ckpt.digest({"model": m2.state_dict(), "optim": opt2.state_dict()}) == saved
    # one call of DCP's reader per file, none on the calling thread
    assert len(calls) == 4 and sum(n for _, n in calls) == len(
        dcp.FileSystemReader(str(tmp_path)).read_metadata().storage_data)
    assert threading.get_ident() not in {t for t, _ in calls}


# --------------------------------------------------------------------------- events


def test_follower_returns_only_whole_lines(tmp_path: Path) -> None:
    path = tmp_path / "rank0.jsonl"
    f = protocol.Follower(str(path))
    assert f.poll() == []
    with path.open("w") as w:
        w.write('{"event": "step", "step": 1}\n{"event": "sav')
    assert [e["step"] for e in f.poll()] == [1]
    with path.open("a") as w:
        w.write('ing", "step": 5}\nnot json\n')
    assert f.poll() == [{"event": "saving", "step": 5}]


def test_trigger_points() -> None:
    after = supervise.Trigger(after_step=7)
    assert not after.hit({"event": "step", "step": 6})
    assert after.hit({"event": "step", "step": 7})
    assert not after.hit({"event": "saving", "step": 7})
    at_save = supervise.Trigger(at_save=7)
    assert not at_save.hit({"event": "saving", "step": 5})
    assert at_save.hit({"event": "saving", "step": 7})
    assert not at_save.hit({"event": "commit", "step": 7})
    assert supervise.Trigger(at_commit=7).hit({"event": "commit", "step": 7})
    assert not supervise.Trigger()


def test_step_lines_of_a_users_command(tmp_path: Path) -> None:
    out = tmp_path / "command.stdout"
    out.write_text("epoch 0 step=1 loss=3\nstep = 2\nstepper=9\n")
    assert [e["step"] for e in supervise.StepLines(str(out)).poll()] == [1, 2]


_KILL_TREE_PROBE = """
import json, os, subprocess, sys, time
from payload.train import supervise
job = ("import subprocess, sys, time\\n"
       "for _ in range(2):\\n"
       "    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
       " start_new_session=True)\\n"
       "time.sleep(60)\\n")
reaper = supervise._set_subreaper()
proc = subprocess.Popen([sys.executable, "-c", job], start_new_session=True)
deadline = time.monotonic() + 20
def settled():
    # a worker is seen right after its fork, before its setsid: wait for its own session
    kids = supervise.descendants(proc.pid)
    try:
        return len(kids) >= 2 and all(os.getsid(k) == k for k in kids)
    except OSError:
        return False
while not settled() and time.monotonic() < deadline:
    time.sleep(0.05)
kids = supervise.descendants(proc.pid)
groups = supervise.kill_tree(proc)
proc.wait(timeout=10)
deadline = time.monotonic() + 10
while time.monotonic() < deadline:
    supervise._reap_orphans()
    if not supervise.descendants(os.getpid()):
        break
    time.sleep(0.05)
print(json.dumps({"reaper": reaper, "kids": kids, "groups": groups}))
"""


def test_kill_tree_reaches_workers_in_their_own_sessions(tmp_path: Path) -> None:
    """torchrun starts each worker with start_new_session: killing torchrun's group misses
    them; the supervisor kills every descendant's group.

    kill_tree kills every descendant of the process that calls it, as the supervisor
    means to: it runs here in a process of its own, never inside pytest (whose other
    children, such as the test cluster, are not the job's)."""
    res = subprocess.run([sys.executable, "-c", _KILL_TREE_PROBE], capture_output=True,
                         text=True, timeout=90, cwd=str(ROOT))
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["reaper"] in (True, False)
    assert len(out["kids"]) == 2
    assert len(out["groups"]) == 3  # the leader's group and each worker's session
    assert not any(_alive(p) for p in out["kids"])


_SESSIONS_JOB = (
    "import os, subprocess, sys, time\n"
    "kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'],"
    " start_new_session=True) for _ in range(2)]\n"
    "open(sys.argv[1] + '.tmp', 'w').write(' '.join(str(k.pid) for k in kids))\n"
    "os.replace(sys.argv[1] + '.tmp', sys.argv[1])\n"
    "time.sleep(120)\n")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_supervisor_told_to_stop_takes_its_whole_job_with_it(tmp_path: Path,
                                                               sig: signal.Signals) -> None:
    """The controller's interrupt TERMs the supervisor's process group (a dropped SSH
    session HUPs it); the job's processes live in sessions of their own, out of that
    group's reach, and must die with the supervisor rather than go on holding the GPUs."""
    job = tmp_path / "job.py"
    job.write_text(_SESSIONS_JOB)
    pids = tmp_path / "pids"
    cmd = f"{sys.executable} {job} {pids}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "payload", "train-supervise", "--out", str(tmp_path / "out"),
         "--phase", "reference", f"--command={cmd}", "--timeout", "120"],
        cwd=str(ROOT), start_new_session=True, env={**os.environ, "PATH": "/usr/bin:/bin"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not pids.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        kids = [int(p) for p in pids.read_text().split()]
        assert len(kids) == 2 and all(_alive(k) for k in kids)
        os.killpg(proc.pid, sig)
        assert proc.wait(timeout=20) == 128 + sig.value
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(_alive(k) for k in kids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(k) for k in kids)


def test_a_stop_file_ends_the_job_with_its_reason(tmp_path: Path) -> None:
    """One node's part of a multi-node job whose peer failed: the controller writes the
    stop file; the supervisor kills the job and keeps the reason (the part is then read
    as stopped, not as a failure of its own)."""
    stop = tmp_path / "reference.stop-1"
    proc = subprocess.Popen(
        [sys.executable, "-m", "payload", "train-supervise", "--out", str(tmp_path / "out"),
         "--phase", "reference", "--command=sleep 120", "--timeout", "300",
         "--stop-file", str(stop)],
        cwd=str(ROOT), env={**os.environ, "PATH": "/usr/bin:/bin"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)
        assert proc.poll() is None  # no stop file yet: the job runs
        stop.write_text("the part on b failed")
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    doc = json.loads(out)
    assert doc["stopped"] == "the part on b failed" and doc["killed"] is True
    assert doc["rc"] != 0 and not doc["timed_out"] and doc["kill_event"] is None
    assert not stop.exists()  # read and removed: it does not stay on the node


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# --------------------------------------------------------------------------- telemetry


def _fake_smi(bin_dir: Path, dmon_ok: bool) -> None:
    bin_dir.mkdir()
    script = bin_dir / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        'echo "$@" >> "$(dirname "$0")/calls"\n'
        'case "$1" in --query-gpu=index,clocks.max.sm*)\n'
        '  echo "1, 1980, 700.00, 700.00"; echo "2, 1980, [N/A], 700.00"; exit 0;; esac\n'
        'if [ "$1" = dmon ]; then\n'
        + ('  echo "#Time gpu sm"; echo "#HH:MM:SS Idx %"; while true; do '
           'echo "12:00:00 0 97"; sleep 0.2; done\n' if dmon_ok else
           '  echo "Not supported" >&2; exit 3\n')
        + "fi\n"
        'echo "index, utilization.gpu [%]"; while true; do echo "0, 97 %"; sleep 0.2; done\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


@pytest.mark.parametrize("dmon_ok", [True, False])
def test_telemetry_prefers_dmon_and_falls_back_to_a_query_loop(tmp_path: Path,
                                                               dmon_ok: bool) -> None:
    _fake_smi(tmp_path / "bin", dmon_ok)
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": "1"}
    t = telemetry.Telemetry(str(tmp_path), 1, env)
    desc = t.start()
    time.sleep(0.3)
    t.stop()
    assert desc["source"] == ("dmon" if dmon_ok else "query")
    text = (tmp_path / desc["file"]).read_text()
    assert "97" in text
    calls = (tmp_path / "bin" / "calls").read_text()
    assert "dmon -s pucvmet -d 1 -o T -i 1" in calls  # only this node's GPU
    if not dmon_ok:
        assert "exited with 3: Not supported" in (t.note or "")
    # each GPU's clock and power limits, read once beside the samples
    assert "--query-gpu=index,clocks.max.sm,power.limit,power.default_limit " \
        "--format=csv,noheader,nounits -i 1" in calls
    assert desc["limits"] == {"error": None, "gpus": [
        {"index": 1, "max_sm_clock_mhz": 1980.0, "power_limit_w": 700.0,
         "default_power_limit_w": 700.0},
        {"index": 2, "max_sm_clock_mhz": 1980.0, "power_limit_w": None,
         "default_power_limit_w": 700.0}]}


def test_the_sampler_is_told_to_stop_when_the_job_is_killed_not_after_it(
        tmp_path: Path) -> None:
    """nvidia-smi takes its last sample (about 1 s) after SIGTERM: a sampler told to stop
    only once the job's processes are gone adds that second to every phase, before the
    controller can open the next one's gate. It is told at the kill (and at the ranks'
    last step), and waited for after the job is gone."""
    _fake_smi(tmp_path / "bin", dmon_ok=True)
    res = subprocess.run(
        [sys.executable, "-m", "payload", "train-supervise", "--out", str(tmp_path / "out"),
         "--phase", "kill", "--command=echo step=1; echo step=2; sleep 60",
         "--kill-after-step", "2", "--timeout", "120"],
        cwd=str(ROOT), env={**os.environ, "PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"},
        capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["killed"] is True and doc["telemetry"]["source"] == "dmon"
    assert doc["kill_time"] <= doc["telemetry"]["stop_requested"] < doc["end_time"]


def test_no_nvidia_smi_is_said_not_guessed(tmp_path: Path) -> None:
    t = telemetry.Telemetry(str(tmp_path), 1, {"PATH": str(tmp_path)})
    desc = t.start()
    t.stop()
    assert desc["source"] is None and desc["note"] == "no GPU telemetry: nvidia-smi not found"
    assert desc["limits"] is None


def test_limits_that_cannot_be_read_say_why(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text('#!/bin/sh\necho "NVIDIA-SMI has failed" >&2; exit 9\n')
    (bin_dir / "nvidia-smi").chmod(0o755)
    got = telemetry.read_limits({"PATH": str(bin_dir)})
    assert got == {"gpus": [], "error": "exit 9: NVIDIA-SMI has failed"}
    assert telemetry.parse_limits("0, 1980, 700.00\nGPU 0: bad\n") == []  # short rows skipped


# --------------------------------------------------------------------------- probe


def test_probe_sees_tokens_of_nodes_sharing_the_directory(tmp_path: Path) -> None:
    shared = tmp_path / "ckpt"
    a = probe.probe(str(shared), "gpuvet-r-a", None)
    b = probe.probe(str(shared), "gpuvet-r-b", None)
    assert a["error"] is None and "gpuvet-r-a" in b["tokens"]
    assert probe.probe(str(shared), None, "gpuvet-r-a")["tokens"] == ["gpuvet-r-a", "gpuvet-r-b"]
    assert probe.probe(str(shared), None, None)["tokens"] == ["gpuvet-r-b"]
    assert a["path"]["mount"]["fstype"]
    bad = probe.probe(str(shared), "../escape", None)
    assert bad["error"] and "bad token" in bad["error"]


def test_probe_reports_an_unusable_directory(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    doc = probe.probe(str(blocker / "ckpt"), "t", None)
    assert doc["error"] and "NotADirectoryError" in doc["error"]


def test_block_model_ignores_what_is_not_a_device() -> None:
    assert probe.block_model("overlay") is None
    assert probe.block_model(None) is None


# --------------------------------------------------------------------------- python 3.8


@pytest.mark.skipif(PY38 is None, reason="no python3.8 interpreter on this machine")
def test_train_payload_compiles_and_probes_under_python38(tmp_path: Path) -> None:
    assert PY38 is not None
    for path in sorted(TRAIN_DIR.glob("*.py")):
        res = subprocess.run([PY38, "-c", "import py_compile, sys; py_compile.compile("
                              "sys.argv[1], cfile=sys.argv[2], doraise=True)", str(path),
                              str(tmp_path / (path.name + "c"))], capture_output=True,
                             text=True, timeout=60)
        assert res.returncode == 0, (path.name, res.stderr)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    res = subprocess.run([PY38, "-m", "payload", "train-probe", "--ckpt-dir",
                          str(tmp_path / "ck"), "--token", "t1"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    doc: dict[str, Any] = json.loads(res.stdout)
    assert doc["tokens"] == ["t1"] and doc["torch"] is False


def _supervise(out: Path, phase: str, ckpt: Path) -> dict[str, Any]:
    res = subprocess.run(
        [sys.executable, "-m", "payload", "train-supervise", "--out", str(out), "--phase", phase,
         "--ckpt-dir", str(ckpt), "--command=echo step=1", "--timeout", "60"],
        cwd=str(ROOT), env={**os.environ, "PATH": "/usr/bin:/bin"}, capture_output=True,
        text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return dict(json.loads(res.stdout))


@pytest.mark.parametrize("phase", ["kill", "reference"])
def test_an_attempt_sees_nothing_of_the_one_before(tmp_path: Path, phase: str) -> None:
    """A run resumed after an interrupt or a full disk runs each phase again in the same
    folder: the first attempt's progress files (appended to by the ranks) and, from the
    reference phase on, its checkpoints must be gone before the job starts."""
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    (out / "sub").mkdir(parents=True)
    (out / "rank0.jsonl").write_text('{"event": "commit", "step": 7}\n')
    (out / "supervise.json").write_text("{}")
    (out / "sub" / "x").write_text("x")
    (ckpt / "step-00000005").mkdir(parents=True)
    (ckpt / "step-00000005" / "manifest.json").write_text("{}")
    doc = _supervise(out, phase, ckpt)
    assert doc["removed_stale"] == (4 if phase == "reference" else 3)
    assert "rank0.jsonl" not in doc["files"] and not (out / "rank0.jsonl").exists()
    assert not (out / "sub").exists()
    # the kill and restore phases use the checkpoints the reference attempt began with
    assert (ckpt / "step-00000005").exists() == (phase != "reference")
    assert doc["argv"] == ["/bin/sh", "-c", "echo step=1"] and doc["last_step"] == 1


def test_a_launch_leaves_nothing_in_the_temp_dir(tmp_path: Path) -> None:
    """torchrun's elastic agent makes a `torchelastic_*` folder per launch with mkdtemp and
    leaves it (eight empty ones in /tmp after each `train` on local nodes): the launch gets
    a TMPDIR of its own under the phase's folder, removed after the job; the compile cache
    stays where torch puts it by default, so it stays warm across phases."""
    system_tmp = tmp_path / "system-tmp"
    system_tmp.mkdir()
    out = tmp_path / "out"
    job = ("import os, tempfile; d = tempfile.mkdtemp(prefix='torchelastic_'); "
           "open(os.path.join(d, 'error.json'), 'w').write('{}'); "
           "print('step=1', d, os.environ.get('TORCHINDUCTOR_CACHE_DIR', '-'))")
    res = subprocess.run(
        [sys.executable, "-m", "payload", "train-supervise", "--out", str(out), "--phase",
         "reference", f"--command={sys.executable} -c \"{job}\"", "--timeout", "60"],
        cwd=str(ROOT), env={**{k: v for k, v in os.environ.items()
                               if k != "TORCHINDUCTOR_CACHE_DIR"},
                            "PATH": "/usr/bin:/bin", "TMPDIR": str(system_tmp)},
        capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    _, made, cache = (out / "command.stdout").read_text().split()
    assert Path(made).parent == out / ".tmp"  # the job's temp dir was the launch's own
    assert not (out / ".tmp").exists()  # and is gone
    assert list(system_tmp.iterdir()) == []  # nothing left where the node keeps temp files
    assert Path(cache).parent == system_tmp and Path(cache).name.startswith("torchinductor_")
    assert ".tmp" not in doc["files"]


def test_one_rank_on_one_node_starts_without_torchrun() -> None:
    """torchrun's agent imports torch a second time and runs a rendezvous for nothing when
    one rank runs on a node: that rank is started directly, with torchrun's environment;
    several ranks on a node keep torchrun."""
    import argparse

    from payload.train import supervise

    def args(nnodes: int) -> argparse.Namespace:
        return argparse.Namespace(nnodes=nnodes, node_rank=0, master_addr="10.0.0.1",
                                  master_port=29500, phase="reference", out="/o",
                                  ckpt_dir="/c", params="{}", save_at=[5])
    one = supervise.train_argv(args(1), 1)
    assert one[1:] == ["-m", "payload", "train", "--phase", "reference", "--out", "/o",
                       "--ckpt-dir", "/c", "--params", "{}", "--save-at", "5"]
    env = supervise.rank_env()
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == ("0", "1", "0")
    assert env["MASTER_ADDR"] == "127.0.0.1" and int(env["MASTER_PORT"]) > 0
    # one rank on each of several nodes: started directly too, meeting at the first
    # node's store as torchrun's static rendezvous would
    assert supervise.train_argv(args(2), 1)[1:] == one[1:]
    two = args(2)
    two.node_rank = 1
    env = supervise.rank_env(two)
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == ("1", "2", "0")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.1", "29500")
    for a in (args(1), args(2)):  # several ranks on a node keep torchrun
        argv = supervise.train_argv(a, 2)
        assert argv[1:3] == ["-m", "torch.distributed.run"] and argv[-len(one) + 1:] == one[1:]


def test_a_launch_started_ahead_has_its_timeout_counted_from_its_gate(tmp_path: Path) -> None:
    """A reference started while health runs waits, shut, as long as health takes: its
    --timeout starts when the gate opens; a gate never opened ends it after
    --gate-timeout plus --timeout."""
    import argparse

    from payload.train.supervise import JobClock

    gate = tmp_path / "reference.gate-0a1b2c3d"
    args = argparse.Namespace(gate=str(gate), timeout=10.0, gate_timeout=100.0)
    clock = JobClock(args, start=1000.0)
    assert not clock.expired(1050.0)  # shut: well within its gate's bound
    assert clock.expired(1111.0)  # shut past gate_timeout + timeout
    clock = JobClock(args, start=1000.0)
    gate.write_text("go")
    assert not clock.expired(1050.0) and clock.opened == 1050.0
    assert not clock.expired(1059.0) and clock.expired(1061.0)  # counted from the opening
    # without a gate, from the start, as before
    plain = JobClock(argparse.Namespace(timeout=10.0), start=1000.0)
    assert not plain.expired(1009.0) and plain.expired(1011.0)


def test_a_share_whose_hashing_broke_leaves_no_manifest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kept save hashed behind the training: an error in the hashing thread becomes a
    problem every rank sees in finish() (which gathers on the main thread), so no manifest
    is written and no rank is left waiting in a collective the others skipped."""
    pytest.importorskip("torch")
    import socket

    import torch.distributed as dist

    d = _fake_ckpt(tmp_path, 4, complete=False)

    def broken(*_: Any, **__: Any) -> dict[str, Any]:
        raise RuntimeError("thread pool gone")

    monkeypatch.setattr(ckpt, "hash_share", broken)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1)
    try:
        written = ckpt.Written(str(d), 4, manifest.data_files(str(d)), {"model": "h"}, 0, 1,
                               1.0, 0.0, behind=True)
        saved = written.finish()
    finally:
        dist.destroy_process_group()
    assert saved["problems"] == ["(rank 0's share): RuntimeError: thread pool gone"]
    assert saved["behind"] is True and not (d / manifest.MANIFEST).exists()
