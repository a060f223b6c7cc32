"""Shapes shared by the nccl-tests and NCCL debug parsers.

NCCL writes its debug lines into the same stdout as nccl-tests, and under
mpirun or srun several processes share one stream, so both parsers must agree
on what an NCCL line is and on how failures announce themselves. The run model
is one for text and -J JSON input, so a text log and its JSON twin compare
field by field and provider comparisons need not care which one was stored.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict

from orchestrator.parsers._noise import Edit, IgnoredLine

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
        r"|^srun: (?:Job step aborted|Terminating (?:job step|StepId))"
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

class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NcclRank(_Model):
    """One line of the `# Using devices` block (or one JSON device)."""

    rank: int
    group: int | None  # printed since nccl-tests 2.13
    pid: int | None  # printed since nccl-tests 2.0
    host: str
    device: int
    bus_id: str  # as printed: `0000:00:06` (2.16+) or `0x07` (older)
    name: str


class NcclPerIter(_Model):
    """The -I columns: spread of per-iteration times, which an average hides."""

    min_us: float
    max_us: float
    p99_us: float
    cv_pct: float


class NcclResult(_Model):
    """One half (out-of-place or in-place) of a table row."""

    time_us: float  # CPU time instead when the run used -C (see time_kind)
    algbw_gbs: float
    busbw_gbs: float
    # Count of wrong elements (`#wrong`, 2.13+); None where printed N/A (-c 0,
    # alltoall/sendrecv in-place) or where the old layout printed `error`.
    wrong: int | None
    # The old layout's `error` column: largest deviation, not a count.
    max_error: float | None = None
    per_iter: NcclPerIter | None = None
    # Text as printed, kept so a recomputed mean can allow for its rounding.
    busbw_text: str | None = None


class NcclRow(_Model):
    line_no: int | None
    size_bytes: int
    count: int
    type: str
    redop: str | None  # None where the test has no reduction (`none`) or no column
    root: int | None  # None where the test has no root (`-1`) or no column
    out_of_place: NcclResult
    in_place: NcclResult
    timestamp: str | None = None  # -S 1


class NcclOutOfBounds(_Model):
    count: int
    ok: bool


class NcclTestsRun(_Model):
    format: Literal["text", "json"]
    binary: str | None  # e.g. all_reduce_perf, from the banner or the JSON args
    op: str | None  # e.g. all_reduce
    tests_version: str | None  # nccl-tests 2.17.6+ print it
    tests_git_hash: str | None
    nccl_version: str | None  # runtime library, x.y.z
    nccl_cuda: str | None  # from `NCCL version 2.28.9+cuda13.0`
    nccl_headers: str | None  # the NCCL nccl-tests was compiled against
    params: dict[str, int | str]
    header_notes: list[str]  # `# Blocking Enabled...` and similar lines
    time_kind: Literal["time", "cputime"]
    ranks: list[NcclRank]
    rows: list[NcclRow]
    out_of_bounds: NcclOutOfBounds | None
    avg_busbw_reported: float | None
    avg_busbw_check: str | None  # OK/FAILED with NCCL_TESTS_MIN_BW, else None
    avg_busbw_recomputed: float | None
    avg_busbw_agrees: bool | None
    failures: list[Failure]
    truncated: bool
    env_count: int | None = None  # JSON only; the entries may hold secrets
    launcher_prefix: str | None = None  # "srun --label": a prefix stripped from every line
    # Every line read past as launcher/shell noise or unknown text, and the marks of a
    # person's editing (elisions, lost `#`, a table pasted without its header).
    ignored_lines: list[IgnoredLine] = []
    ignored_lines_dropped: int = 0  # read past beyond the first MAX_LISTED, counted only
    edits: list[Edit] = []
    nccl_lines: int = 0  # NCCL's own debug lines, read by the nccl-debug parser
    start_time: str | None = None
    end_time: str | None = None


def busbw_rounding(row: NcclRow) -> float:
    """Largest rounding error of the two busbw figures as printed."""
    total = 0.0
    for res in (row.out_of_place, row.in_place):
        text = res.busbw_text
        if text is None or "e" in text.lower():
            total += 0.0 if text is None else abs(res.busbw_gbs) * 0.05
        elif "." in text:
            total += 0.5 * 10 ** -len(text.split(".")[1])
        else:
            total += 0.5
    return total / 2


def recompute_avg(rows: list[NcclRow]) -> float | None:
    """Mean busbw over every row, in-place and out-of-place alike.

    nccl-tests adds each BenchTime's busbw into one sum and divides by the
    number of calls, so both halves of every row weigh the same.
    """
    if not rows:
        return None
    values = [r.out_of_place.busbw_gbs for r in rows] + [r.in_place.busbw_gbs for r in rows]
    return sum(values) / len(values)


def check_avg(run: NcclTestsRun, tol: float = 0.01) -> bool | None:
    """Whether the reported average matches the rows, allowing for print rounding.

    A mismatch beyond rounding means rows were lost or the log was edited;
    None when either side is missing.
    """
    if run.avg_busbw_reported is None or run.avg_busbw_recomputed is None:
        return None
    rounding = sum(busbw_rounding(r) for r in run.rows) / len(run.rows)
    # %g keeps six significant digits of the reported figure.
    rounding += abs(run.avg_busbw_reported) * 5e-6
    return abs(run.avg_busbw_reported - run.avg_busbw_recomputed) <= tol + rounding
