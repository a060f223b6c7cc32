"""Executors by name. Ray itself loads only when a node uses the ray executor."""

from __future__ import annotations

from orchestrator.executors.base import (
    CommandResult,
    ConnectionInfo,
    Executor,
    ExecutorOptions,
    ExecutorPool,
    GroupResult,
    fanout,
    make_executor,
    options_for,
    probe,
    register,
)
from orchestrator.executors.local import LocalExecutor
from orchestrator.executors.ray import RayExecutor
from orchestrator.executors.ssh import SshExecutor

register("ssh", lambda: SshExecutor)
register("local", lambda: LocalExecutor)
register("ray", lambda: RayExecutor)

__all__ = [
    "CommandResult", "ConnectionInfo", "Executor", "ExecutorOptions", "GroupResult",
    "ExecutorPool", "fanout", "make_executor", "options_for", "probe",
]
