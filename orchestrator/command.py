"""What one command did on one node: the record every executor returns.

It sits below `errors`: `CommandFailed` and `CommandTimeout` carry one of
these (as invoke's `Failure.result` does), so the error hierarchy needs the
record and the record needs nothing. Raising from a result is the executors'
part (`orchestrator.executors.base.CommandResult.raise_for_status`), one
layer up, where both are known.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class CommandResult:
    node: str
    command: str
    rc: int | None
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False

    def __post_init__(self) -> None:
        self.command = str(self.command)  # the text only, never an EnvCommand's values

    @property
    def ok(self) -> bool:
        return self.rc == 0 and not self.timed_out
