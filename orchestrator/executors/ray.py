"""Run commands on the nodes of an existing Ray cluster.

Each inventory node names its Ray node IP in `host`; commands run as Ray tasks
pinned to that node (NodeAffinitySchedulingStrategy, hard), in their own
process group with the same timeout and kill semantics as the other
executors. Ray is imported only when this executor is used.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator.errors import ConnectionFailed, UsageError
from orchestrator.executors.base import CommandResult, ExecutorOptions
from orchestrator.inventory import Node

_init_lock = threading.Lock()


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UsageError("the ray executor needs the 'ray' package",
                         hint="pip install 'gpuvet[ray]'") from None
    return ray


def _run_on_node(command: str, env: dict[str, str], cwd: str, timeout: float | None) -> dict:
    # Runs inside the Ray worker on the target node.
    import os
    import subprocess
    import time

    from orchestrator.executors.local import kill_group

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
        kill_group(proc)
        out, err = proc.communicate()
    return {"rc": None if timed_out else proc.returncode,
            "stdout": out.decode("utf-8", "replace"), "stderr": err.decode("utf-8", "replace"),
            "duration_s": time.monotonic() - start, "timed_out": timed_out}


def _write_file(path: str, data: bytes) -> None:
    import os

    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path + ".part", "wb") as f:
        f.write(data)
    os.replace(path + ".part", path)


def _read_file(path: str) -> bytes:
    with open(path, "rb") as f:
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
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        return ray, NodeAffinitySchedulingStrategy(node_id=self._node_id, soft=False)

    def _call(self, fn: Any, *args: Any) -> Any:
        ray, strategy = self._target()
        remote = ray.remote(num_cpus=0, scheduling_strategy=strategy)(fn)
        return ray.get(remote.remote(*args))

    def run(self, command: str, *, env: Mapping[str, str] | None = None, cwd: str | None = None,
            timeout: float | None = None, stdout_path: Path | None = None) -> CommandResult:
        out = self._call(_run_on_node, command, {**self.node.env, **(env or {})},
                         cwd or self.node.work_dir, timeout)
        if stdout_path:
            stdout_path.write_text(out["stdout"], encoding="utf-8")
        return CommandResult(node=self.node.name, command=command, **out)

    def put(self, local: Path, remote: str) -> None:
        self._call(_write_file, remote, local.read_bytes())

    def get(self, remote: str, local: Path) -> None:
        data = self._call(_read_file, remote)
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_bytes(data)

    def close(self) -> None:
        pass
