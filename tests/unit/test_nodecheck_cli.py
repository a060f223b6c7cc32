"""`gpuvet nodecheck`: the node check run here, and written out as one file that Slurm's
HealthCheckProgram or Prolog runs with its options built in (slurm.conf takes no
arguments there)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cli._common import ExitCode
from payload import nodecheck as N
from tests.unit.clirun import gpuvet


@pytest.fixture
def no_driver(tmp_path: Path) -> Path:
    if any(os.access(os.path.join(d, "nvidia-smi"), os.X_OK) for d in N.SYSTEM_PATH):
        pytest.skip("this machine has nvidia-smi")
    sysfs = tmp_path / "sysfs"
    sysfs.mkdir()
    return sysfs


def test_here_without_a_driver_it_says_so_in_one_line(
        no_driver: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert ExitCode.NOTHING_CHECKED == N.EXIT_NO_DRIVER == 4
    r = gpuvet(capsys, "nodecheck", "--sysfs", no_driver)
    assert (r.returncode, r.stderr) == (4, "")
    assert r.stdout == ("no NVIDIA driver (nvidia-smi not found) and no NVIDIA GPU on the PCI "
                        "bus: nothing checked (exit 4)\n")
    r = gpuvet(capsys, "nodecheck", "--sysfs", no_driver, "--gpus", "4", "--skip", "xid")
    assert r.returncode == 1
    assert r.stdout == ("NVIDIA_DRIVER_MISSING: nvidia-smi not found: no NVIDIA driver, and 4 "
                        "GPU(s) expected\n")


def test_the_written_script_runs_with_its_options_and_drains_its_node(
        no_driver: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "gpuvet-nodecheck"
    r = gpuvet(capsys, "nodecheck", "--write-script", script, "--gpus", "8", "--drain",
               "--skip", "xid", "--node", "gpu5", "--sysfs", no_driver)
    assert r.returncode == 0, r.output
    assert r.stdout.startswith(f"wrote {script} (runs: python3 {script} --gpus 8 --skip xid "
                               f"--drain --node gpu5 --sysfs {no_driver});")
    assert stat.S_IMODE(script.stat().st_mode) == 0o755
    # Slurm's scontrol, as a script that answers `show node` and records `update`
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "scontrol.calls"
    fake = bin_dir / "scontrol"
    fake.write_text("#!/bin/sh\n"
                    f'if [ "$2" = show ]; then echo "NodeName=$4 State=IDLE"; exit 0; fi\n'
                    f'printf "%s|" "$@" >> {calls}\n')
    fake.chmod(0o755)
    python3 = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
    res = subprocess.run([python3, str(script)], env={"PATH": f"{bin_dir}:/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert res.returncode == 1, res.stderr
    assert res.stdout.splitlines() == [
        "NVIDIA_DRIVER_MISSING: nvidia-smi not found: no NVIDIA driver, and 8 GPU(s) expected",
        "drained gpu5: gpuvet NVIDIA_DRIVER_MISSING"]
    assert calls.read_text() == "update|nodename=gpu5|state=drain|reason=gpuvet " \
                                "NVIDIA_DRIVER_MISSING|"


def test_a_script_path_that_cannot_be_written_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    r = gpuvet(capsys, "nodecheck", "--write-script", tmp_path / "nowhere" / "check")
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr.splitlines()[0] == (f"error: --write-script {tmp_path}/nowhere/check: no "
                                        f"folder {tmp_path}/nowhere")
