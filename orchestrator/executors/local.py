"""Run on this machine, presenting one or more simulated nodes.

Each simulated node has its own name, work directory and environment (e.g.
CUDA_VISIBLE_DEVICES=1 and NCCL_HOSTID=<name>), which is how one multi-GPU
host stands in for several nodes in demos and single-machine validation.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from orchestrator.errors import StepError
from orchestrator.executors.base import CommandResult, ExecutorOptions, command_env, remote_path
from orchestrator.inventory import Node

KILL_GRACE_S = 2.0


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """TERM the process group, then KILL what is left after a grace period."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=KILL_GRACE_S)
            # the leader is gone; members that ignored TERM may remain
        except subprocess.TimeoutExpired:
            continue
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def wait_bounded(proc: subprocess.Popen[bytes], timeout: float | None,
                 on_timeout: Callable[[], None] | None = None
                 ) -> tuple[bytes | None, bytes | None, bool]:
    """Wait for a command started in a session of its own: (stdout, stderr, timed out).
    Past `timeout`, `on_timeout` runs (best effort: a scheduler told to end the step) and
    the whole group is killed; an interrupt while waiting kills it too."""
    try:
        out, err = proc.communicate(timeout=timeout)
        return out, err, False
    except subprocess.TimeoutExpired:
        if on_timeout is not None:
            with contextlib.suppress(Exception):
                on_timeout()
        kill_group(proc)
        out, err = proc.communicate()
        return out, err, True
    except BaseException:
        kill_group(proc)
        raise


class LocalExecutor:
    host_key_status = "n/a"

    def __init__(self, node: Node, options: ExecutorOptions | None = None) -> None:
        self.node = node
        self._lock = threading.Lock()
        self._inflight: set[subprocess.Popen[bytes]] = set()

    def cancel(self) -> None:
        """Kill every command this executor has running (an interrupt of the run)."""
        with self._lock:
            procs = list(self._inflight)
        for proc in procs:
            kill_group(proc)

    def _env(self, command: str, env: Mapping[str, str] | None) -> dict[str, str]:
        return {**os.environ, **command_env(self.node, command, env)}

    def run(self, command: str, *, env: Mapping[str, str] | None = None, cwd: str | None = None,
            timeout: float | None = None, stdout_path: Path | None = None) -> CommandResult:
        workdir = cwd or self.node.work_dir
        Path(workdir).mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        out_f = stdout_path.open("wb") if stdout_path else None
        try:
            proc = subprocess.Popen(
                ["/bin/sh", "-c", str(command)], cwd=workdir, env=self._env(command, env),
                stdin=subprocess.DEVNULL, stdout=out_f or subprocess.PIPE,
                stderr=subprocess.PIPE, start_new_session=True,
            )
            with self._lock:
                self._inflight.add(proc)
            try:
                out, err, timed_out = wait_bounded(proc, timeout)
            finally:
                with self._lock:
                    self._inflight.discard(proc)
        finally:
            if out_f:
                out_f.close()
        stdout = (stdout_path.read_bytes() if stdout_path else out or b"").decode(
            "utf-8", "replace")
        return CommandResult(node=self.node.name, command=command,
                             rc=None if timed_out else proc.returncode,
                             stdout=stdout, stderr=(err or b"").decode("utf-8", "replace"),
                             duration_s=time.monotonic() - start, timed_out=timed_out)

    def put(self, local: Path, remote: str) -> None:
        dest = Path(os.path.expanduser(remote_path(self.node, remote)))
        tmp = dest.with_name(f"{dest.name}.part-{os.getpid()}-{id(self):x}")
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(local, tmp)
            os.replace(tmp, dest)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            # the node's disk, not the controller's: writing is what failed, on the node side
            raise StepError(f"no space left on the node's filesystem at {dest.parent} "
                            f"({exc.strerror})", node=self.node.name) from None

    def get(self, remote: str, local: Path) -> None:
        src = Path(os.path.expanduser(remote_path(self.node, remote)))
        if not src.is_file():
            raise StepError(f"cannot copy {self.node.name}:{src} to {local}: no such file",
                            node=self.node.name)
        local.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, local)

    def close(self) -> None:
        pass
