"""Executors by name. Backends load lazily: SSH work never imports ray."""

from __future__ import annotations

from orchestrator.executors.base import (
    CommandResult,
    ConnectionInfo,
    Executor,
    ExecutorFactory,
    ExecutorOptions,
    ExecutorPool,
    GroupResult,
    fanout,
    make_executor,
    options_for,
    probe,
    register,
)


def _ssh() -> ExecutorFactory:
    from orchestrator.executors.ssh import SshExecutor

    return SshExecutor


def _local() -> ExecutorFactory:
    from orchestrator.executors.local import LocalExecutor

    return LocalExecutor


def _ray() -> ExecutorFactory:
    from orchestrator.executors.ray import RayExecutor

    return RayExecutor


register("ssh", _ssh)
register("local", _local)
register("ray", _ray)

__all__ = [
    "CommandResult", "ConnectionInfo", "Executor", "ExecutorOptions", "GroupResult",
    "ExecutorPool", "fanout", "make_executor", "options_for", "probe",
]
