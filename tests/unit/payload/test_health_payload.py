"""The node side of the health step: the entry point end to end with torch on CPU
(two processes standing in for two GPUs), the levels, a node without a GPU, GPUs
listed by nvidia-smi that torch cannot use, interrupts, and the pieces (plan,
discovery, counter reads) on their own."""

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

from payload.health import counters, node, protocol

ROOT = Path(__file__).resolve().parents[3]
HEALTH_DIR = ROOT / "payload" / "health"
GIB = 1 << 30


def _python38() -> str | None:
    for cand in [os.environ.get("GPUVET_PYTHON38", ""),
                 *sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.8*/bin/python3")))]:
        if cand and os.access(cand, os.X_OK):
            return cand
    return shutil.which("python3.8")


PY38 = _python38()


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1", **extra)
    return env


def _run(out: Path, *args: str, python: str = sys.executable, env: dict[str, str] | None = None,
         timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([python, "-m", "payload", "health", "--out", str(out), *args],
                          cwd=ROOT, env=env or _env(), capture_output=True, text=True,
                          timeout=timeout)


def _events(path: Path) -> list[dict[str, Any]]:
    return list(protocol.read_events(str(path)))


def _write_exe(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


# --------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def standard_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    out = tmp_path_factory.mktemp("health") / "out"
    res = _run(out, "--level", "standard", "--device", "cpu", "--gpus", "0,1")
    return out, res


def test_standard_level_on_cpu_runs_every_gpu_phase_in_two_processes(standard_run: Any) -> None:
    out, res = standard_run
    assert res.returncode == 0, res.stderr
    doc = json.loads((out / protocol.NODE_DOC).read_text())
    assert (doc["tool"], doc["schema"], doc["status"], doc["level"]) == (
        protocol.TOOL, protocol.SCHEMA, "ok", "standard")
    assert doc["gpus"] == ["cpu0", "cpu1"]
    pids = set()
    for label in ("cpu0", "cpu1"):
        evs = _events(out / protocol.gpu_events(label))
        hello = evs[0]
        assert hello["event"] == protocol.HELLO and hello["gpu"] == label
        pids.add(hello["pid"])
        assert evs[-1]["event"] == protocol.BYE and evs[-1]["rc"] == 0
        ends = protocol.last_by_phase(evs)
        assert list(ends) == list(protocol.GPU_PHASES)  # in the order they ran
        assert all(e["event"] == protocol.DONE for e in ends.values())
        starts = [e["phase"] for e in evs if e["event"] == protocol.START]
        assert starts == list(protocol.GPU_PHASES)
        for e in evs:
            assert e["event"] in protocol.EVENTS and isinstance(e["t"], float)
            for k, v in e.get("values", {}).items():
                assert isinstance(v, (int, float)) or v is None, (k, v)
        assert doc["results"][label] == ends
    assert len(pids) == 2  # one process per GPU
    r = doc["results"]["cpu0"]
    assert r["memcopy"]["values"]["copy_gbps"] > 0
    assert r["memcopy"]["units"]["copy_gbps"] == "GB/s"
    assert r["memcopy"]["params"]["counted"] == "read + written"
    assert r["memcopy"]["check"]["copy_equal"] is True
    assert r["memread"]["values"]["read_gbps"] > 0
    mm = r["matmul"]
    for prec in ("bf16", "fp16", "fp32", "fp64"):
        assert mm["values"][prec + "_tflops"] > 0
        assert mm["values"][prec + "_rows_bad"] == mm["values"][prec + "_cols_bad"] == 0
        assert mm["values"][prec + "_repeat_mismatches"] == 0
        assert mm["checks"][prec]["finite"] is True
    assert set(mm["skipped"]) == {"tf32", "fp8"}
    assert "compute capability 8.9" in mm["skipped"]["fp8"]
    sus = r["sustained"]
    assert sus["params"]["precision"] == "bf16" and sus["values"]["products"] > 0
    assert sus["values"]["burst_tflops"] == mm["values"]["bf16_tflops"]
    assert sus["intervals"] and sus["window"]["t1"] >= sus["window"]["t0"]
    mt = r["memtest"]["values"]
    assert mt["mismatches"] == 0 and mt["passes"] >= 1 and mt["bytes_tested"] == 16 << 20
    assert set(r["memtest"]["params"]["patterns"]) >= {"random", "address", "zeros"}
    progress = [e for e in _events(out / protocol.gpu_events("cpu0"))
                if e["event"] == protocol.PROGRESS]
    assert {e["phase"] for e in progress} == {"matmul", "sustained", "memtest"}


def test_node_phases_links_and_counters_are_recorded(standard_run: Any) -> None:
    out, _ = standard_run
    doc = json.loads((out / protocol.NODE_DOC).read_text())
    for phase in protocol.LINK_PHASES:
        assert doc["links"][phase]["event"] == protocol.SKIP
        assert "device cpu" in doc["links"][phase]["reason"]
    assert doc["node_phases"]["dcgmi"]["reason"] == "device cpu"
    assert doc["node_phases"]["busy"]["event"] == protocol.SKIP
    for when in ("before", "after"):
        index = json.loads((out / "counters" / when / "index.json").read_text())
        assert index["query-gpu"]["skipped"] is True
        for src in ("dmesg", "journalctl-k"):
            rec = index[src]
            # either the log itself or the reason it could not be read
            assert rec["readable"] or rec["note"].startswith("not readable")
            assert (out / rec["file"]).is_file()
    nodes = _events(out / protocol.NODE_EVENTS)
    assert nodes[0]["event"] == protocol.HELLO and nodes[-1]["event"] == protocol.BYE
    assert nodes[-1]["status"] == "ok"
    phases = [e["phase"] for e in nodes if e.get("phase") and e["event"] != protocol.START]
    assert phases == ["counters_before", "busy", "pcie", "pcie_all", "peer", "dcgmi",
                      "counters_after"]
    assert "gpucpu0.jsonl" in doc["files"] and "counters/before/dmesg.txt" in doc["files"]
    assert doc["workers"]["gpucpu0"]["rc"] == 0


def test_progress_reaches_stdout_as_the_events_come(standard_run: Any) -> None:
    _, res = standard_run
    lines = [json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")]
    assert {e.get("gpu") for e in lines} >= {"cpu0", "cpu1", None}
    assert lines[-1]["event"] == protocol.BYE and lines[-1]["doc"] == protocol.NODE_DOC


def test_quick_level_runs_one_copy_and_one_product(tmp_path: Path) -> None:
    res = _run(tmp_path / "q", "--level", "quick", "--device", "cpu")
    assert res.returncode == 0, res.stderr
    doc = json.loads((tmp_path / "q" / protocol.NODE_DOC).read_text())
    ends = doc["results"]["cpu0"]
    assert {p for p, e in ends.items() if e["event"] == protocol.DONE} == {"memcopy", "matmul"}
    assert ends["memread"]["reason"] == "not part of level quick"
    assert list(ends["matmul"]["checks"]) == ["bf16"]
    assert doc["links"]["peer"]["event"] == protocol.SKIP


# --------------------------------------------------------------------------- no GPU


def test_a_node_without_nvidia_smi_says_no_gpu_and_exits_0(tmp_path: Path) -> None:
    res = _run(tmp_path / "n", env=_env(PATH="/usr/bin:/bin"))
    assert res.returncode == 0, res.stderr
    doc = json.loads((tmp_path / "n" / protocol.NODE_DOC).read_text())
    assert (doc["status"], doc["reason"]) == ("no-gpu", "no GPU: nvidia-smi not found")
    assert not list((tmp_path / "n").glob("gpu*.jsonl"))


FAKE_SMI = """#!/bin/sh
echo "$*" >> {log}
case "$*" in
  *--query-gpu=index,uuid\\ *)
    printf '0, GPU-aaaaaaaa-0000-0000-0000-000000000000\\n1, GPU-bbbbbbbb-0000-0000-0000-000000000000\\n'
    exit 0 ;;
  *--query-gpu=*{reject}*)
    echo 'Field "{reject}" is not a valid field to query.'
    exit 2 ;;
  *--query-gpu=*)
    echo "index, uuid, pci.bus_id, memory.used [MiB]"
    echo "0, GPU-aaaaaaaa-0000-0000-0000-000000000000, 00000000:3B:00.0, 10 MiB"
    echo "1, GPU-bbbbbbbb-0000-0000-0000-000000000000, 00000000:86:00.0, 10 MiB"
    exit 0 ;;
  *--query-compute-apps*)
    echo "gpu_uuid, pid, process_name, used_gpu_memory [MiB]"
    echo "GPU-aaaaaaaa-0000-0000-0000-000000000000, 4242, python3, 30000 MiB"
    exit 0 ;;
  *"-q -x"*) echo "<nvidia_smi_log/>"; exit 0 ;;
  *"nvlink -e"*) exit 0 ;;
  dmon*)
    trap 'echo "dmon stopped" >> {log}; exit 0' TERM
    while :; do sleep 0.05 & wait $!; done ;;
esac
exit 0
"""


def _fake_smi(tmp_path: Path, reject: str = "no-such-field") -> tuple[Path, Path]:
    log = tmp_path / "calls.log"
    _write_exe(tmp_path / "bin" / "nvidia-smi", FAKE_SMI.format(log=log, reject=reject))
    return tmp_path / "bin", log


def test_discovery_follows_cuda_visible_devices_and_gpus(tmp_path: Path) -> None:
    bindir, _ = _fake_smi(tmp_path)
    env = {"PATH": str(bindir) + os.pathsep + "/usr/bin:/bin"}
    assert node.discover(env, None) == (["0", "1"], None)
    assert node.discover(dict(env, CUDA_VISIBLE_DEVICES="1"), None) == (["1"], None)
    assert node.discover(env, ["1"]) == (["1"], None)
    entries, why = node.discover(dict(env, CUDA_VISIBLE_DEVICES=""), None)
    assert entries == [] and why is not None and "hides every GPU" in why
    entries, why = node.discover(env, ["3"])
    assert entries == [] and why is not None and "--gpus names 3" in why


def test_gpus_torch_cannot_use_fail_their_processes_not_the_node(tmp_path: Path) -> None:
    """nvidia-smi lists two GPUs, torch (the CPU build) sees none: each GPU's process says
    so, the links process too, the counters are read with the listed tools."""
    bindir, log = _fake_smi(tmp_path, reject="retired_pages.double_bit.count")
    env = _env(PATH=str(bindir) + os.pathsep + os.environ["PATH"])
    out = tmp_path / "out"
    res = _run(out, "--level", "standard", env=env)
    assert res.returncode == 0, res.stderr
    doc = json.loads((out / protocol.NODE_DOC).read_text())
    assert doc["status"] == "failed" and doc["gpus"] == ["0", "1"]
    assert doc["reason"] == "processes that failed: gpu0, gpu1, links"
    for label in ("0", "1"):
        evs = _events(out / protocol.gpu_events(label))
        assert evs[0]["event"] == protocol.ERROR
        assert evs[0]["error"] == f"torch sees no CUDA device (CUDA_VISIBLE_DEVICES={label})"
        assert evs[-1] == dict(evs[-1], event=protocol.BYE, rc=3)
    links = _events(out / protocol.LINKS_EVENTS)
    assert "expected 2" in links[0]["error"]
    # the links process was started with the GPU processes (its interpreter and torch
    # load meanwhile) and held at its gate until they were done: it made its first CUDA
    # call after their last event
    gpu_done = max(_events(out / protocol.gpu_events(x))[-1]["t"] for x in ("0", "1"))
    assert doc["workers"]["links"]["started"] < gpu_done <= links[0]["t"]
    assert not (out / ".links.gate").exists()
    # the samplers cover the GPU phases: told to stop when the GPUs were done, they ended
    # while the links were measured, not after them
    dmon = doc["telemetry"]["dmon"]
    assert dmon["source"] == "dmon" and log.read_text().count("dmon stopped") == 1
    assert gpu_done <= dmon["stop_requested"] <= links[0]["t"]
    before = doc["counters"]["before"]
    assert before["query-gpu"]["dropped"] == ["retired_pages.double_bit.count"]
    assert "retired_pages.double_bit.count" not in before["query-gpu"]["fields"]
    assert before["compute-apps"]["processes"] == 1
    assert doc["node_phases"]["busy"]["values"] == {"processes": 1}
    sysfs = json.loads((out / "counters" / "before" / "pcie-sysfs.json").read_text())
    assert set(sysfs) == {"00000000:3B:00.0", "00000000:86:00.0"}
    assert sysfs["00000000:3B:00.0"]["path"].endswith("/0000:3b:00.0")
    assert doc["node_phases"]["dcgmi"]["reason"] == "dcgmi not found"
    assert "nvlink -e" in log.read_text()


# --------------------------------------------------------------------------- interrupts


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_for(pred: Any, limit_s: float = 120.0) -> None:
    deadline = time.monotonic() + limit_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.1)


def _started(out: Path, phase: str) -> list[int]:
    pids = []
    for label in ("cpu0", "cpu1"):
        evs = _events(out / protocol.gpu_events(label)) if (
            out / protocol.gpu_events(label)).is_file() else []
        if not any(e.get("phase") == phase and e["event"] == protocol.START for e in evs):
            return []
        pids.append(evs[0]["pid"])
    return pids


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_kills_every_gpu_process_and_leaves_none(tmp_path: Path, sig: int) -> None:
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "payload", "health", "--out", str(out),
                             "--level", "burn", "--device", "cpu", "--gpus", "0,1",
                             "--sustain-s", "600"], cwd=ROOT, env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_for(lambda: bool(_started(out, "sustained")))
        pids = _started(out, "sustained")
        assert all(_alive(p) for p in pids)
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == 128 + sig
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not any(_alive(p) for p in pids)
    doc = json.loads((out / protocol.NODE_DOC).read_text())
    assert (doc["status"], doc["reason"]) == ("interrupted", f"signal {sig}")


def test_gpu_processes_die_with_a_killed_entry_point(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "payload", "health", "--out", str(out),
                             "--level", "burn", "--device", "cpu", "--gpus", "0,1",
                             "--sustain-s", "600"], cwd=ROOT, env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(lambda: bool(_started(out, "sustained")))
        pids = _started(out, "sustained")
        proc.kill()  # SIGKILL: no handler runs; the kernel's parent-death signal does
        proc.wait()
        _wait_for(lambda: not any(_alive(p) for p in pids), 60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# --------------------------------------------------------------------------- pieces


def test_sizes_scale_with_the_gpus_memory() -> None:
    h200 = protocol.plan("standard", "cuda", 141 * GIB)
    a100_40 = protocol.plan("standard", "cuda", 40 * GIB)
    small = protocol.plan("standard", "cuda", 8 * GIB)
    assert h200["copy_bytes"] == 2 * GIB and h200["matmul_n"] == 8192
    assert a100_40["copy_bytes"] == 40 * GIB // 32 and a100_40["matmul_n"] == 8192
    assert small["copy_bytes"] == 256 << 20 and small["matmul_n"] == 4096
    assert protocol.plan("standard", "cuda", 2 * GIB)["matmul_n"] == 2048
    assert protocol.plan("standard", "cuda", 141 * GIB, n_gpus=8,
                         host_avail_bytes=16 * GIB)["pcie_bytes"] == 512 << 20
    quick, burn = protocol.plan("quick", "cuda", 80 * GIB), protocol.plan("burn", "cuda", 80 * GIB)
    assert quick["phases"] == ["memcopy", "matmul"] and quick["precisions"] == ["bf16"]
    assert quick["link_phases"] == [] and quick["dcgmi_level"] is None
    assert (h200["sustain_s"], h200["memtest_s"], h200["dcgmi_level"]) == (15.0, 5.0, 1)
    assert burn["sustain_s"] >= 120 and burn["memtest_s"] >= 120 and burn["dcgmi_level"] == 2
    assert protocol.worker_timeout_s(burn) > burn["sustain_s"] + burn["memtest_s"]
    with pytest.raises(ValueError, match="unknown level"):
        protocol.plan("soak", "cuda", GIB)


def test_labels_are_file_safe_and_last_events_win() -> None:
    assert protocol.label_of("0") == "0"
    assert protocol.label_of("GPU-1a2b/3") == "GPU-1a2b_3"
    evs = [{"event": "start", "phase": "a"}, {"event": "error", "phase": "a", "error": "x"},
           {"event": "done", "phase": "b"}, {"event": "progress", "phase": "b"}]
    assert protocol.last_by_phase(evs) == {"a": evs[1], "b": evs[2]}


def test_health_query_swaps_in_the_old_reason_name_then_drops(tmp_path: Path) -> None:
    bindir, log = _fake_smi(tmp_path, reject="clocks_event_reasons.active")
    env = {"PATH": str(bindir) + os.pathsep + "/usr/bin:/bin"}
    rec, fields = counters.run_health_query(env)
    assert rec["rc"] == 0 and rec["dropped"] == ["clocks_event_reasons.active"]
    assert "clocks_throttle_reasons.active" in fields
    assert len(log.read_text().splitlines()) == 2


def test_sysfs_links_and_bus_ids(tmp_path: Path) -> None:
    dev = tmp_path / "0000:3b:00.0"
    dev.mkdir()
    (dev / "current_link_speed").write_text("8.0 GT/s PCIe\n")
    (dev / "current_link_width").write_text("8\n")
    (dev / "max_link_speed").write_text("16.0 GT/s PCIe\n")
    (dev / "max_link_width").write_text("16\n")
    (dev / "aer_dev_correctable").write_text("RxErr 3\nBadTLP 0\nTOTAL_ERR_COR 3\n")
    got = counters.read_sysfs_links(["00000000:3B:00.0"], root=str(tmp_path))["00000000:3B:00.0"]
    assert (got["current_link_speed"], got["current_link_width"]) == ("8.0 GT/s PCIe", "8")
    assert got["aer_dev_correctable"].endswith("TOTAL_ERR_COR 3")
    assert got["aer_dev_fatal"] is None and len(got["unreadable"]) == 2
    assert counters.sysfs_bus_id("0000:86:00.0") == "0000:86:00.0"
    csv_text = "index, pci.bus_id, memory.used [MiB]\n0, 00000000:3B:00.0, 1 MiB\n"
    assert counters.csv_column(csv_text, "pci.bus_id") == ["00000000:3B:00.0"]
    assert counters.csv_column(csv_text, "memory.used") == ["1 MiB"]
    assert counters.csv_column(csv_text, "uuid") == []


# --------------------------------------------------------------------------- python 3.8


def test_health_payload_parses_with_python38_grammar() -> None:
    import ast

    for path in sorted(HEALTH_DIR.glob("*.py")):
        ast.parse(path.read_text(), filename=str(path), feature_version=(3, 8))


@pytest.mark.skipif(PY38 is None, reason="no python3.8 interpreter on this machine")
def test_under_python38_without_torch(tmp_path: Path) -> None:
    """The node's own python 3.8 without torch: no GPU is a clean exit; on CPU each
    process says torch is missing and the document is still written."""
    assert PY38 is not None
    for path in sorted(HEALTH_DIR.glob("*.py")):
        res = subprocess.run([PY38, "-c", "import py_compile, sys; py_compile.compile("
                              "sys.argv[1], cfile=sys.argv[2], doraise=True)", str(path),
                              str(tmp_path / (path.name + "c"))], capture_output=True,
                             text=True, timeout=60)
        assert res.returncode == 0, (path.name, res.stderr)
    res = _run(tmp_path / "n", python=PY38, env=_env(PATH="/usr/bin:/bin"))
    assert res.returncode == 0, res.stderr
    assert json.loads((tmp_path / "n" / protocol.NODE_DOC).read_text())["status"] == "no-gpu"
    res = _run(tmp_path / "c", "--level", "quick", "--device", "cpu", python=PY38)
    assert res.returncode == 0, res.stderr
    doc = json.loads((tmp_path / "c" / protocol.NODE_DOC).read_text())
    assert doc["status"] == "failed" and doc["python"].startswith("3.8.")
    evs = _events(tmp_path / "c" / protocol.gpu_events("cpu0"))
    assert evs[0]["error"].startswith("torch is not importable")
