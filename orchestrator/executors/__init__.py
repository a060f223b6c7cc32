"""Executors by name. Each backend loads when a node first uses it: a run over local nodes
never imports fabric or paramiko, SSH work never imports ray."""

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

register("ssh", "orchestrator.executors.ssh:SshExecutor")
register("local", "orchestrator.executors.local:LocalExecutor")
register("ray", "orchestrator.executors.ray:RayExecutor")
register("slurm", "orchestrator.executors.slurm:SlurmExecutor")

__all__ = [
    "CommandResult", "ConnectionInfo", "Executor", "ExecutorOptions", "GroupResult",
    "ExecutorPool", "fanout", "make_executor", "options_for", "probe",
]
