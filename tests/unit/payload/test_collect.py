"""payload.collect: real runs on this machine (no GPU here), timeouts, scrubbing,
the query-gpu fallback, the CLI and Python 3.8 safety."""

import ast
import json
import os
import platform
import random
import shutil
import socket
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import payload.collect as collect_mod  # noqa: E402
from payload.__main__ import main as payload_main  # noqa: E402
from payload.collect import (  # noqa: E402
    collect,
    find_mount,
    find_nccl,
    find_nvcc,
    parse_mounts,
    run_command,
    select_env,
)
from payload.commands import COMMANDS, COMMANDS_BY_ID, Command  # noqa: E402
from tests.unit.testkeys import aws_key_pair  # noqa: E402

PAYLOAD_DIR = ROOT / "payload"
RECORD_KEYS = {
    "argv", "rc", "stdout", "stderr", "duration_s", "missing", "timed_out", "error", "fallback",
}
NVIDIA_SMI_IDS = [c.id for c in COMMANDS if c.argv[0] == "nvidia-smi"]


def _python38() -> str | None:
    """A Python 3.8 (the oldest the payload supports): $GPUVET_PYTHON38, pyenv's, or on PATH."""
    import glob

    candidates = [os.environ.get("GPUVET_PYTHON38", "")]
    candidates += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.8*/bin/python3")))
    for pinned in candidates:
        if pinned and os.access(pinned, os.X_OK):
            return pinned
    found = shutil.which("python3.8")
    if found:
        try:
            out = subprocess.run([found, "-c", "import sys; print(sys.version_info[:2])"],
                                 capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        if out.returncode == 0 and out.stdout.strip() == "(3, 8)":
            return found
    return None


PY38 = _python38()
needs_py38 = pytest.mark.skipif(PY38 is None, reason="no python3.8 interpreter on this machine")


def _procs_with(needle: str) -> list[int]:
    """PIDs whose command line contains needle (zombies have an empty one)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if needle in cmdline and int(entry) != os.getpid():
            pids.append(int(entry))
    return pids


def _write_exe(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


# ---------------------------------------------------------------- real run


@pytest.fixture(scope="module")
def real_doc(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("collect")
    work = base / "work"
    ckpt = base / "ckpt"
    work.mkdir()
    ckpt.mkdir()
    t0 = time.monotonic()
    doc = collect(str(work), str(ckpt), "node-a", 8)
    doc["_test_elapsed"] = time.monotonic() - t0
    doc["_test_work"] = str(work)
    return doc


def test_real_document_shape(real_doc: dict[str, Any]) -> None:
    doc = dict(real_doc)
    elapsed = doc.pop("_test_elapsed")
    doc.pop("_test_work")
    assert json.loads(json.dumps(doc)) == doc
    assert doc["schema"] == 1
    assert doc["tool"] == "gpuvet-payload"
    assert doc["node"] == "node-a"
    assert doc["hostname"] == socket.gethostname()
    assert doc["started_at"].endswith("Z") and doc["finished_at"] >= doc["started_at"]
    assert doc["python"]["executable"] == sys.executable
    assert doc["python"]["version"] == platform.python_version()
    assert list(doc["commands"]) == [c.id for c in COMMANDS]
    for cid, rec in doc["commands"].items():
        assert set(rec) >= RECORD_KEYS, cid
        assert rec["error"] is None, (cid, rec["error"])
        assert not rec["timed_out"], cid
    for key in ("env", "paths", "nccl", "mpi", "tools"):
        assert isinstance(doc[key], dict), key
    # seconds, not minutes (the torch probe is the slowest)
    assert elapsed < 60


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has nvidia-smi")
def test_real_nvidia_smi_missing(real_doc: dict[str, Any]) -> None:
    assert NVIDIA_SMI_IDS
    for cid in NVIDIA_SMI_IDS:
        rec = real_doc["commands"][cid]
        assert rec["missing"] is True, cid
        assert rec["rc"] is None, cid
        assert rec["error"] is None, cid
        assert rec["fallback"] is False, cid
    assert real_doc["tools"]["nvidia-smi"] is None


def test_real_uname(real_doc: dict[str, Any]) -> None:
    rec = real_doc["commands"]["uname"]
    assert rec["rc"] == 0 and not rec["missing"]
    assert platform.system() in rec["stdout"]
    assert platform.release() in rec["stdout"]


def test_real_df_and_paths(real_doc: dict[str, Any]) -> None:
    work = real_doc["_test_work"]
    info = real_doc["paths"]["work_dir"]
    assert info["exists"] is True and info["is_dir"] is True
    assert info["writable"] is True
    assert info["free_bytes"] > 0 and info["total_bytes"] >= info["free_bytes"]
    assert real_doc["paths"]["ckpt_dir"]["exists"] is True
    # the write probe leaves nothing behind
    assert os.listdir(work) == []
    mount = info["mount"]
    assert mount is not None
    rec = real_doc["commands"]["df"]
    assert rec["rc"] == 0
    assert work in rec["argv"]
    lines = rec["stdout"].splitlines()
    assert lines[0].startswith("Filesystem")
    # df -PT: Filesystem Type blocks Used Available Capacity Mounted-on
    fields = lines[1].split()
    assert fields[-1] == mount["mount_point"]
    assert fields[1] == mount["fstype"]


def test_real_placeholders_filled(real_doc: dict[str, Any]) -> None:
    for cid, rec in real_doc["commands"].items():
        assert not any(a in ("{python}", "{nvcc}", "{work_dir}", "{ckpt_dir}", "{torch_probe}")
                       for a in rec["argv"]), cid
    torch_rec = real_doc["commands"]["torch"]
    assert torch_rec["argv"][0] == sys.executable
    assert "torch.cuda" in torch_rec["argv"][2]


def test_real_tools_and_mpi(real_doc: dict[str, Any]) -> None:
    tools = real_doc["tools"]
    assert set(tools) == set(collect_mod.TOOL_NAMES)
    assert tools["gcc"] == shutil.which("gcc")
    mpi = real_doc["mpi"]
    assert mpi["mpicc"] == collect_mod.which("mpicc")
    if mpi["flavor"] == "openmpi":
        assert mpi["showme_incdirs"]
        assert mpi["mpi_h"], "Open MPI present but no mpi.h found"


# ---------------------------------------------------------------- run_command


def test_missing_executable_is_not_an_error() -> None:
    rec = run_command(["gpuvet-no-such-binary-" + uuid.uuid4().hex], 5)
    assert rec["missing"] is True
    assert rec["rc"] is None
    assert rec["error"] is None
    rec = run_command(["/nonexistent/dir/tool", "--version"], 5)
    assert rec["missing"] is True and rec["rc"] is None


def test_rc_stdout_stderr() -> None:
    rec = run_command(["sh", "-c", "echo out; echo err >&2; exit 3"], 10)
    assert rec["rc"] == 3
    assert rec["stdout"] == "out\n"
    assert rec["stderr"] == "err\n"
    assert rec["timed_out"] is False and rec["missing"] is False


def test_killed_by_signal_on_its_own() -> None:
    rec = run_command(["sh", "-c", "kill -9 $$"], 10)
    assert rec["rc"] == -9
    assert rec["timed_out"] is False


def test_output_is_decoded_with_replacement() -> None:
    rec = run_command(["sh", "-c", r"printf 'ok\377\n'"], 10)
    assert rec["rc"] == 0
    assert rec["stdout"] == "ok\ufffd\n"


def test_output_cap() -> None:
    rec = run_command(["sh", "-c", "head -c 100000 /dev/zero | tr '\\0' a"], 10, cap=1000)
    assert rec["rc"] == 0
    assert rec["truncated"] is True
    assert rec["stdout"].startswith("a" * 1000)
    assert "a" * 1001 not in rec["stdout"]
    assert "kept 1000 of 100000 bytes" in rec["stdout"]


def test_timeout_kills_the_process_group() -> None:
    marker = "gpuvet-test-" + uuid.uuid4().hex
    secs = f"30.{random.randrange(10**6):06d}"
    cmd = Command("slow", ["sh", "-c", f"echo early-{marker}; sleep {secs}; echo late"],
                  None, 0.5)
    t0 = time.monotonic()
    doc = collect(commands=[cmd], jobs=2)
    elapsed = time.monotonic() - t0
    rec = doc["commands"]["slow"]
    assert rec["timed_out"] is True
    assert rec["rc"] is None
    assert rec["missing"] is False
    assert "early-" + marker in rec["stdout"]
    assert "late" not in rec["stdout"]
    assert 0.4 <= rec["duration_s"] < 10
    assert elapsed < 15
    # both the shell and its sleep child are gone
    deadline = time.monotonic() + 3
    while (_procs_with(marker) or _procs_with("sleep " + secs)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _procs_with(marker) == []
    assert _procs_with("sleep " + secs) == []


def test_commands_run_in_parallel() -> None:
    cmds = [Command(f"s{i}", ["sleep", "1"], None, 10) for i in range(6)]
    t0 = time.monotonic()
    doc = collect(commands=cmds, jobs=6)
    assert time.monotonic() - t0 < 4
    assert all(doc["commands"][f"s{i}"]["rc"] == 0 for i in range(6))


# ---------------------------------------------------------------- paths / nvcc / nccl


def test_missing_ckpt_dir_is_reported_not_created(tmp_path: Path) -> None:
    ckpt = tmp_path / "no" / "such" / "ckpt"
    doc = collect(str(tmp_path), str(ckpt), commands=[COMMANDS_BY_ID["df"]])
    assert not ckpt.exists() and not (tmp_path / "no").exists()
    rec = doc["commands"]["df"]
    assert rec["rc"] != 0
    assert str(ckpt) in rec["stderr"]
    info = doc["paths"]["ckpt_dir"]
    assert info["exists"] is False and info["writable"] is False
    assert info["stat_path"] == str(tmp_path.resolve())
    assert info["free_bytes"] is not None
    assert doc["paths"]["work_dir"]["exists"] is True


def test_find_nvcc_fallbacks(tmp_path: Path) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    nvcc = _write_exe(tmp_path / "cuda" / "bin" / "nvcc", "#!/bin/sh\necho fake\n")
    assert find_nvcc({"PATH": str(empty), "CUDA_HOME": str(tmp_path / "cuda")}) == str(nvcc)
    on_path = _write_exe(tmp_path / "pbin" / "nvcc", "#!/bin/sh\n")
    env = {"PATH": str(on_path.parent), "CUDA_HOME": str(tmp_path / "cuda")}
    assert find_nvcc(env) == str(on_path)
    default = "/usr/local/cuda/bin/nvcc"
    expected = default if os.access(default, os.X_OK) else None
    assert find_nvcc({"PATH": str(empty), "CUDA_HOME": str(tmp_path / "nope")}) == expected


def test_nvcc_not_found_is_recorded_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setattr(collect_mod, "find_nvcc", lambda env=None: None)
    monkeypatch.setenv("PATH", str(empty))
    doc = collect(str(tmp_path), str(tmp_path), commands=[COMMANDS_BY_ID["nvcc_version"]])
    rec = doc["commands"]["nvcc_version"]
    assert rec["argv"] == ["nvcc", "--version"]
    assert rec["missing"] is True and rec["rc"] is None


def test_parse_mounts_and_find_mount() -> None:
    text = (
        "/dev/vda / ext4 rw,relatime 0 0\n"
        "tmpfs /tmp tmpfs rw 0 0\n"
        "server:/export /mnt/my\\040data nfs4 rw,vers=4.2 0 0\n"
        "/dev/vdb /mnt/my\\040data/ckpt xfs rw 0 0\n"
        "overlay /tmp overlay rw 0 0\n"
        "short\n"
    )
    mounts = parse_mounts(text)
    assert len(mounts) == 5
    assert mounts[2]["mount_point"] == "/mnt/my data"
    assert find_mount("/mnt/my data/ckpt/run1", mounts)["fstype"] == "xfs"  # type: ignore[index]
    assert find_mount("/mnt/my data/other", mounts)["source"] == "server:/export"  # type: ignore[index]
    assert find_mount("/mnt/my datax", mounts)["mount_point"] == "/"  # type: ignore[index]
    # the later of two mounts on the same point wins
    assert find_mount("/tmp/x", mounts)["fstype"] == "overlay"  # type: ignore[index]
    assert find_mount("/tmp/x", []) is None


def test_find_nccl(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    (site / "nvidia" / "nccl" / "lib").mkdir(parents=True)
    (site / "nvidia" / "nccl" / "lib" / "libnccl.so.2").write_bytes(b"")
    (site / "nvidia" / "nccl" / "include").mkdir()
    (site / "nvidia" / "nccl" / "include" / "nccl.h").write_text(
        "#define NCCL_MAJOR 2\n#define NCCL_MINOR 21\n#define NCCL_PATCH 5\n"
        '#define NCCL_SUFFIX ""\n'
    )
    home = tmp_path / "nccl-home"
    (home / "lib").mkdir(parents=True)
    (home / "lib" / "libnccl.so.2").write_bytes(b"")
    (home / "lib" / "libnccl.so").symlink_to("libnccl.so.2")
    (home / "include").mkdir()
    (home / "include" / "nccl.h").write_text("#define NCCL_MAJOR 2\n#define NCCL_MINOR 28\n")

    info = find_nccl([str(site), str(site), "", str(tmp_path / "nothing")],
                     {"NCCL_HOME": str(home)})
    assert info["nccl_home"] == str(home)
    assert len(info["pip"]) == 1
    pip = info["pip"][0]
    assert pip["libs"] == ["libnccl.so.2"]
    assert pip["so2"] is True and pip["unversioned"] is False
    assert pip["header"] == str(site / "nvidia" / "nccl" / "include" / "nccl.h")
    assert pip["header_version"] == "2.21.5"
    headers = {h["path"]: h for h in info["headers"]}
    assert headers[str(home / "include" / "nccl.h")]["exists"] is True
    assert headers[str(home / "include" / "nccl.h")]["version"] == "2.28.0"
    assert "/usr/include/nccl.h" in headers
    dirs = {d["dir"]: d for d in info["lib_dirs"]}
    assert dirs[str(home / "lib")]["unversioned"] is True
    assert dirs[str(home / "lib")]["so2"] is True
    assert "/usr/local/cuda/lib64" in dirs and "/usr/lib/x86_64-linux-gnu" in dirs


# ---------------------------------------------------------------- query-gpu fallback

FAKE_SMI = """#!/bin/sh
echo "$*" >> "{log}"
case "$*" in
  *--query-gpu=*)
    case "$*" in
      *{reject}*)
        echo 'Field "{reject}" is not a valid field to query.'
        echo
        echo 'Run "nvidia-smi --help-query-gpu" for more info.'
        exit 2 ;;
    esac
    {fail}
    echo "index, name, uuid"
    echo "0, Fake GPU, GPU-00000000-0000-0000-0000-000000000000"
    exit 0 ;;
esac
echo fake
"""


def _fake_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reject: str, fail: str = "") -> Path:
    log = tmp_path / "calls.log"
    _write_exe(tmp_path / "bin" / "nvidia-smi",
               FAKE_SMI.format(log=log, reject=reject, fail=fail))
    monkeypatch.setenv("PATH", str(tmp_path / "bin") + os.pathsep + os.environ.get("PATH", ""))
    return log


def test_query_gpu_falls_back_to_old_field_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = _fake_smi(tmp_path, monkeypatch, reject="clocks_event_reasons.active")
    doc = collect(str(tmp_path), str(tmp_path), commands=[COMMANDS_BY_ID["query_gpu"]])
    rec = doc["commands"]["query_gpu"]
    assert rec["rc"] == 0
    assert rec["fallback"] is True
    assert "clocks_throttle_reasons.active" in rec["argv"][1]
    assert "clocks_event_reasons.active" not in rec["argv"][1]
    assert "Fake GPU" in rec["stdout"]
    first = rec["first_attempt"]
    assert first["rc"] == 2
    assert "is not a valid field" in first["stdout"]
    assert "clocks_event_reasons.active" in first["argv"][1]
    assert len(log.read_text().splitlines()) == 2


def test_query_gpu_no_fallback_when_accepted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = _fake_smi(tmp_path, monkeypatch, reject="clocks_throttle_reasons.active")
    doc = collect(str(tmp_path), str(tmp_path), commands=[COMMANDS_BY_ID["query_gpu"]])
    rec = doc["commands"]["query_gpu"]
    assert rec["rc"] == 0 and rec["fallback"] is False
    assert "first_attempt" not in rec
    assert "clocks_event_reasons.active" in rec["argv"][1]
    assert len(log.read_text().splitlines()) == 1


def test_query_gpu_no_fallback_on_other_failures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fail = ("echo 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA "
            "driver.'; exit 9")
    log = _fake_smi(tmp_path, monkeypatch, reject="no-such-thing", fail=fail)
    doc = collect(str(tmp_path), str(tmp_path), commands=[COMMANDS_BY_ID["query_gpu"]])
    rec = doc["commands"]["query_gpu"]
    assert rec["rc"] == 9 and rec["fallback"] is False
    assert len(log.read_text().splitlines()) == 1


# ---------------------------------------------------------------- secrets

HF = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz01234567"
_, AWS_SECRET = aws_key_pair()  # made when the tests run


def test_secrets_never_reach_the_document(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secrets = {
        "FOO_TOKEN": "foo-token-" + uuid.uuid4().hex[:8],
        "AWS_SECRET_ACCESS_KEY": AWS_SECRET,
        "HF_TOKEN": HF,
        "NCCL_SOCKET_TOKEN": "nccl-tok-" + uuid.uuid4().hex[:8],
    }
    url_pw = "pw-" + uuid.uuid4().hex[:10]
    for k, v in secrets.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("UCX_PROXY_URL", f"https://alice:{url_pw}@proxy.example:3128")
    monkeypatch.setenv("HTTPS_PROXY", f"https://alice:{url_pw}@proxy.example:3128")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    monkeypatch.setenv("NCCL_IB_PKEY", "0x8001")
    # commands that print the environment: their output is scrubbed too
    cmds = [c for c in COMMANDS if c.id in ("uname", "date")] + [
        Command("env_dump", ["env"], None),
        Command("echo_url", ["sh", "-c", 'echo "$UCX_PROXY_URL"; echo "$HF_TOKEN" >&2'], None),
    ]
    monkeypatch.setattr(collect_mod, "COMMANDS", cmds)
    out = tmp_path / "doc.json"
    rc = payload_main(["collect", "--out", str(out), "--node", "n1",
                       "--work-dir", str(tmp_path), "--ckpt-dir", str(tmp_path)])
    assert rc == 0
    text = out.read_text()
    for value in list(secrets.values()) + [url_pw]:
        assert value not in text
    doc = json.loads(text)
    assert doc["env"]["CUDA_VISIBLE_DEVICES"] == "0"
    assert doc["env"]["NCCL_DEBUG"] == "INFO"
    assert doc["env"]["NCCL_IB_PKEY"] == "0x8001"
    assert doc["env"]["NCCL_SOCKET_TOKEN"] == "***"
    assert doc["env"]["UCX_PROXY_URL"] == "https://alice:***@proxy.example:3128"
    assert "HF_TOKEN" not in doc["env"] and "HTTPS_PROXY" not in doc["env"]
    assert "CUDA_VISIBLE_DEVICES=0" in doc["commands"]["env_dump"]["stdout"]
    assert "FOO_TOKEN=***" in doc["commands"]["env_dump"]["stdout"]
    assert doc["commands"]["echo_url"]["stdout"] == "https://alice:***@proxy.example:3128\n"


def test_select_env_picks_and_scrubs() -> None:
    env = {
        "CUDA_VISIBLE_DEVICES": "0,1",
        "CUDA_HOME": "/usr/local/cuda",
        "NCCL_DEBUG": "INFO",
        "UCX_TLS": "rc,sm",
        "OMPI_COMM_WORLD_RANK": "0",
        "OMPI_MCA_orte_precondition_transports": "0123456789abcdef-fedcba9876543210",
        "PMIX_RANK": "0",
        "PATH": "/usr/bin",
        "LD_LIBRARY_PATH": "/usr/local/cuda/lib64",
        "HOME": "/root",
        "HF_TOKEN": HF,
        "SSH_AUTH_SOCK": "/tmp/ssh-x/agent.1",
    }
    out = select_env(env)
    assert set(out) == {
        "CUDA_VISIBLE_DEVICES", "CUDA_HOME", "NCCL_DEBUG", "UCX_TLS", "OMPI_COMM_WORLD_RANK",
        "OMPI_MCA_orte_precondition_transports", "PMIX_RANK", "PATH", "LD_LIBRARY_PATH",
    }
    assert out["OMPI_MCA_orte_precondition_transports"] == "***"
    assert out["CUDA_VISIBLE_DEVICES"] == "0,1"


# ---------------------------------------------------------------- CLI and output


def _small_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(collect_mod, "COMMANDS", [COMMANDS_BY_ID["uname"]])


def test_cli_writes_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _small_commands(monkeypatch)
    outdir = tmp_path / "out"
    outdir.mkdir()
    out = outdir / "collect.json"
    out.write_text("previous")
    assert payload_main(["collect", "--out", str(out), "--jobs", "2", "--node", "n9",
                         "--work-dir", str(tmp_path)]) == 0
    doc = json.loads(out.read_text())
    assert doc["node"] == "n9"
    assert doc["work_dir"] == str(tmp_path)
    assert doc["ckpt_dir"] == os.getcwd()
    assert os.listdir(outdir) == ["collect.json"]

    # a failure while writing leaves the previous file intact and no temp file
    def broken_replace(src: str, dst: str) -> None:
        raise OSError("disk on fire")

    monkeypatch.setattr(collect_mod.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk on fire"):
        payload_main(["collect", "--out", str(out), "--node", "other"])
    assert json.loads(out.read_text())["node"] == "n9"
    assert os.listdir(outdir) == ["collect.json"]


def test_cli_stdout(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    _small_commands(monkeypatch)
    assert payload_main(["collect", "--node", "n2"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["node"] == "n2" and doc["commands"]["uname"]["rc"] == 0


def test_cli_without_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    assert payload_main([]) == 2
    assert "collect" in capsys.readouterr().err


# ---------------------------------------------------------------- Python 3.8 safety


def test_payload_parses_with_python38_grammar() -> None:
    for path in sorted(PAYLOAD_DIR.glob("*.py")):
        ast.parse(path.read_text(), filename=str(path), feature_version=(3, 8))


@needs_py38
def test_payload_byte_compiles_with_python38(tmp_path: Path) -> None:
    assert PY38 is not None
    files = sorted(PAYLOAD_DIR.glob("*.py"))
    assert files
    for path in files:
        proc = subprocess.run(
            [PY38, "-c", "import py_compile, sys; py_compile.compile(sys.argv[1], "
             "cfile=sys.argv[2], doraise=True)", str(path), str(tmp_path / (path.name + "c"))],
            capture_output=True, text=True, timeout=60,
        )
        assert proc.returncode == 0, (path.name, proc.stderr)


@needs_py38
def test_collect_runs_under_python38(tmp_path: Path) -> None:
    assert PY38 is not None
    out = tmp_path / "doc.json"
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        [PY38, "-m", "payload", "collect", "--node", "py38", "--work-dir", str(tmp_path),
         "--ckpt-dir", str(tmp_path), "--out", str(out), "--jobs", "8"],
        cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert doc["python"]["version"].startswith("3.8.")
    assert doc["node"] == "py38"
    assert list(doc["commands"]) == [c.id for c in COMMANDS]
    assert doc["commands"]["uname"]["rc"] == 0
    assert doc["paths"]["work_dir"]["exists"] is True
    assert all(rec["error"] is None for rec in doc["commands"].values())


def test_the_torch_probe_reads_a_cpu_build_without_importing_it(tmp_path: Path) -> None:
    """A CPU-only build sees no GPU: its version.py says so, and torch (2-5 s) is not
    imported; a CUDA build is imported and asked (here its import fails, as it says)."""
    import json as _json
    import subprocess
    import sys

    from payload.commands import TORCH_PROBE

    def probe(cuda: str, hip: str = "None") -> subprocess.CompletedProcess[str]:
        pkg = tmp_path / f"{cuda}-{hip}".replace("'", "") / "torch"
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").write_text("raise ImportError('imported')\n")
        (pkg / "version.py").write_text(
            "from typing import Optional\n__version__ = '2.13.0+x'\n"
            f"cuda: Optional[str] = {cuda}\nhip: Optional[str] = {hip}\n")
        return subprocess.run([sys.executable, "-c", TORCH_PROBE], capture_output=True,
                              text=True, timeout=60, cwd=tmp_path,
                              env={"PYTHONPATH": str(pkg.parent), "PATH": "/usr/bin:/bin"})

    cpu = probe("None")
    assert cpu.returncode == 0, cpu.stderr
    assert _json.loads(cpu.stdout) == {"torch": "2.13.0+x", "cuda": None, "nccl": None,
                                       "available": False, "count": 0, "devices": []}
    for built in (probe("'13.0'"), probe("None", hip="'6.2'")):  # CUDA, ROCm: imported
        assert built.returncode != 0 and "ImportError: imported" in built.stderr


def test_a_missing_directory_says_whether_it_can_be_made(tmp_path: Path) -> None:
    """Preflight judges a ckpt_dir that is not there yet by the filesystem it would be
    made on, when it can be made; a path under a file cannot."""
    from payload.probes import path_info

    info = path_info(str(tmp_path / "a" / "b"))
    assert (info["exists"], info["stat_path"], info["creatable"]) == (False, str(tmp_path), True)
    (tmp_path / "f").write_text("x")
    info = path_info(str(tmp_path / "f" / "ckpt"))
    assert (info["stat_path"], info["creatable"]) == (str(tmp_path / "f"), False)
    assert "creatable" not in path_info(str(tmp_path))  # there: nothing to make


def test_visible_gpus_are_counted_as_asked_and_as_cuda_reads_them() -> None:
    """Asked: every entry but -1. As CUDA reads it on a node of N GPUs: up to the first
    entry that names none of them, so `1` on a one-GPU node leaves nothing visible."""
    from payload.probes import count_visible

    assert [count_visible(v) for v in ("", "-1", "0,1", "1", "9,0")] == [0, 0, 2, 1, 2]
    assert [count_visible(v, 1) for v in ("", "-1", "0", "1", "0,1", "x")] == [0, 0, 1, 0, 1, 0]
    assert count_visible("3,0,9,1", 8) == 2 and count_visible("GPU-ab,1", 2) == 2
