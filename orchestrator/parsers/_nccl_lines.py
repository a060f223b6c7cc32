"""Line shapes shared by the nccl-tests and NCCL debug parsers.

NCCL writes its debug lines into the same stdout as nccl-tests, and under
mpirun or srun several processes share one stream, so both parsers must agree
on what an NCCL line is and on how failures announce themselves.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

# `host:pid:tid [cudaDev] [file.cc:line ]NCCL LEVEL message`. Launchers may tag
# each line (`[1,0]<stdout>:` from mpirun --tag-output, `0: ` from srun -l).
NCCL_LINE = re.compile(
    r"^(?:\[\d+,\d+\]<\w+>:|\d+: )?"
    r"(?P<host>[^\s:]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] "
    r"(?:(?P<loc>\S+:\d+) )?NCCL (?P<level>INFO|WARN|TRACE|ABORT|ERROR)\b ?(?P<msg>.*)$"
)

# Printed by NCCL itself at init, bare or as the message of an INFO line.
NCCL_VERSION = re.compile(r"\bNCCL version (?P<ver>\d+\.\d+\.\d+)(?:[-+](?P<suffix>\S+))?")

# Failure lines nccl-tests, the CUDA runtime, MPI and the shell print, with the
# kind gpuvet files them under. Order matters: the first match wins.
FAILURE_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("nccl-failure", re.compile(r"\b(?:Test )?NCCL failure \S+:\d+")),
    ("cuda-failure", re.compile(r"\bTest CUDA failure \S+:\d+")),
    ("timeout", re.compile(r"\bTest timeout \(\d+s\)")),
    ("test-failure", re.compile(r"^ \.\. \S+ pid \d+: Test failure \S+:\d+")),
    ("nccl-error", re.compile(r"^# error: \S")),
    ("mpi-abort", re.compile(
        r"^(?:Primary job\s+terminated normally|mpirun detected that one or more processes"
        r"|mpirun noticed that process rank|MPI_ABORT was invoked|\S+ has exited due to process)")),
    ("signal", re.compile(
        r"\*\*\* Process received signal \*\*\*|^(?:Segmentation fault|Aborted|Bus error|Killed)"
        r"(?: \(core dumped\))?$|^terminate called after throwing")),
    ("error", re.compile(
        r"^\[Rank \d+\].*\b(?:[Ee]rror|[Aa]bort)|^(?:srun|slurmstepd): error:"
        r"|^mlx5: \S+: got completion with error")),
)


class Failure(BaseModel):
    """A line that says the run went wrong; line_no is None for JSON input."""

    model_config = ConfigDict(extra="forbid")

    line_no: int | None
    kind: str
    text: str


def failure_kind(line: str) -> str | None:
    """Classify a non-NCCL line as a failure, or None when it is not one."""
    for kind, pattern in FAILURE_PATTERNS:
        if pattern.search(line):
            return kind
    return None


def decode_version_code(code: int) -> str:
    """Turn NCCL_VERSION_CODE into x.y.z; the encoding changed at 2.9."""
    if code >= 10000:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"
