"""Run commands on the nodes of an existing Ray cluster.

Each inventory node names its Ray node IP in `host`; commands run as Ray tasks
pinned to that node (NodeAffinitySchedulingStrategy, hard), in their own
process group with the same timeout and kill semantics as the other
executors. Ray is imported only when this executor is used.

The task functions are shipped by value and import nothing of gpuvet, so the
Ray nodes need no gpuvet installed: only the controller has it.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator.errors import ConnectionFailed, StepError, UsageError
from orchestrator.executors.base import CommandResult, ExecutorOptions, command_env, remote_path
from orchestrator.inventory import Node

_init_lock = threading.Lock()
# Seconds ray.get waits beyond a command's own timeout before the node counts as lost
# (the task kills its command itself; this only catches a task that never reports back).
GET_MARGIN_S = 60.0


class _NotMainThread(logging.Filter):
    """ray.init warns when called off the main thread (fan-out threads always are);
    the SIGTERM handler it would install is not wanted in the controller anyway."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "SIGTERM handler is not set" not in record.getMessage()


def _ray() -> Any:
    try:
        import ray  # optional (gpuvet[ray]): SSH and local work never load it
    except ImportError:
        raise UsageError("the ray executor needs the 'ray' package",
                         hint="pip install 'gpuvet[ray]'") from None
    # ship this module's task functions by value: the Ray nodes need no gpuvet
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    return ray


def _run_on_node(command: str, env: dict[str, str], cwd: str, timeout: float | None) -> dict:
    # Runs inside the Ray worker on the target node; uses nothing of gpuvet (the standard
    # library modules it names travel by reference and are imported there).
    # Kill semantics as orchestrator.executors.local.kill_group: TERM the group, KILL
    # what is left after a grace period.
    os.makedirs(cwd, exist_ok=True)
    start = time.monotonic()
    proc = subprocess.Popen(["/bin/sh", "-c", command], cwd=cwd, env={**os.environ, **env},
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                continue
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # members that ignored TERM
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
    return {"rc": None if timed_out else proc.returncode,
            "stdout": out.decode("utf-8", "replace"), "stderr": err.decode("utf-8", "replace"),
            "duration_s": time.monotonic() - start, "timed_out": timed_out}


def _write_file(path: str, data: bytes) -> None:
    path = os.path.expanduser(path)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path + ".part", "wb") as f:
        f.write(data)
    os.replace(path + ".part", path)


def _read_file(path: str) -> bytes:
    with open(os.path.expanduser(path), "rb") as f:
        return f.read()


class RayExecutor:
    host_key_status = "n/a"

    def __init__(self, node: Node, options: ExecutorOptions) -> None:
        self.node = node
        self.address = options.ray_address or "auto"
        self._node_id: str | None = None

    def _target(self) -> tuple[Any, Any]:
        ray = _ray()
        with _init_lock:
            if not ray.is_initialized():
                logging.getLogger("ray._private.worker").addFilter(_NotMainThread())
                try:
                    ray.init(address=self.address, log_to_driver=False,
                             include_dashboard=False, configure_logging=False)
                except Exception as exc:
                    raise ConnectionFailed(f"cannot join the Ray cluster at {self.address}: "
                                           f"{exc}", node=self.node.name,
                                           hint="start it with `ray start --head` or set "
                                                "ray.address in the inventory") from None
        if self._node_id is None:
            alive = [n for n in ray.nodes() if n.get("Alive")]
            match = [n for n in alive if n.get("NodeManagerAddress") == self.node.host]
            if not match:
                ips = ", ".join(sorted({n.get("NodeManagerAddress", "?") for n in alive}))
                raise ConnectionFailed(f"no live Ray node with IP {self.node.host}",
                                       node=self.node.name, hint=f"live Ray nodes: {ips}")
            self._node_id = match[0]["NodeID"]
        # ray is optional (gpuvet[ray]); _ray() above has said so if it is missing
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        return ray, NodeAffinitySchedulingStrategy(node_id=self._node_id, soft=False)

    def _call(self, fn: Any, *args: Any, timeout: float | None = None,
              command: str | None = None) -> Any:
        ray, strategy = self._target()
        remote = ray.remote(num_cpus=0, scheduling_strategy=strategy, max_retries=0)(fn)
        ref = remote.remote(*args)
        try:
            return ray.get(ref, timeout=None if timeout is None else timeout + GET_MARGIN_S)
        except ray.exceptions.GetTimeoutError:
            ray.cancel(ref, force=True)
            raise ConnectionFailed(f"the Ray task on {self.node.host} did not report back "
                                   f"within {timeout + GET_MARGIN_S:.0f} s"
                                   if timeout is not None else "the Ray task did not report back",
                                   node=self.node.name, command=command,
                                   hint="check the node with `ray status`") from None
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause if getattr(exc, "cause", None) is not None else exc
            raise StepError(f"the Ray task failed on {self.node.host}: "
                            f"{type(cause).__name__}: {cause}", node=self.node.name,
                            command=command) from None
        except ray.exceptions.RayError as exc:
            self._node_id = None  # the node may be gone; look it up again next time
            raise ConnectionFailed(f"lost the Ray node {self.node.host}: "
                                   f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}",
                                   node=self.node.name, command=command,
                                   hint="check the node with `ray status`") from None

    def run(self, command: str, *, env: Mapping[str, str] | None = None, cwd: str | None = None,
            timeout: float | None = None, stdout_path: Path | None = None) -> CommandResult:
        out = self._call(_run_on_node, str(command), command_env(self.node, command, env),
                         cwd or self.node.work_dir, timeout, timeout=timeout, command=command)
        if stdout_path:
            stdout_path.write_text(out["stdout"], encoding="utf-8")
        return CommandResult(node=self.node.name, command=command, **out)

    def put(self, local: Path, remote: str) -> None:
        self._call(_write_file, remote_path(self.node, remote), local.read_bytes())

    def get(self, remote: str, local: Path) -> None:
        data = self._call(_read_file, remote_path(self.node, remote))
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_bytes(data)

    def close(self) -> None:
        pass
