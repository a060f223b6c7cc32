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


# NCCL WARN lines that report no fault, each with why: NCCL searches for the channel
# layout it prefers and says so when it settles for a simpler one (graph/search.cc). Such
# a line is listed as noise with its reason, never judged a failure.
HARMLESS_WARNINGS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^Could not find a path for pattern \d+, falling back to simple order"),
     "NCCL's topology search did not fit its preferred channel pattern and fell back to a "
     "simpler order (graph/search.cc); a search message, not a fault"),
)


def harmless_warning(msg: str) -> str | None:
    """Why an NCCL WARN message reports no fault, or None when it may."""
    for pattern, why in HARMLESS_WARNINGS:
        if pattern.match(msg.strip()):
            return why
    return None


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


# Collectives whose busbw is algbw x (n-1)/n: zero on one rank, so a non-zero busbw
# says more than one rank ran. broadcast, reduce and sendrecv scale by 1 and say nothing.
BUSBW_ZERO_ON_ONE = frozenset({"all_reduce", "all_gather", "reduce_scatter", "alltoall",
                               "hypercube"})


class RankCount(_Model):
    """How many ranks a log ran with, from every source it has; None where it is silent."""

    shown: int  # `#  Rank` lines listed
    highest: int | None  # the highest rank index listed, plus one
    nccl: int | None  # `nranks`/`nRanks` in NCCL INFO lines
    per_process: int | None  # nThread x nGpus (the parameters line or -t/-g)
    launched: int | None  # the launcher's process count (mpirun -np, srun -n) x per_process
    busbw_nonzero: bool  # a collective whose busbw is 0 on one rank printed a non-zero one
    count: int | None  # the most any source says: the run had at least this many ranks
    one_gpu: bool  # exactly one rank shown and nothing says more
    disagreements: list[str]  # what says more ranks than the rank lines show


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
    nccl_ranks: int | None = None  # the largest `nranks` an NCCL INFO line printed
    nccl_nodes: int | None = None  # the largest `nNodes` an NCCL INFO line printed
    # what the launcher and binary command lines pasted with the log say: `np` (mpirun
    # -np/-n, srun -n/--ntasks), `nodes` (srun -N), `g`/`t` (GPUs and threads per
    # process), `b`/`e` (min and max bytes)
    command: dict[str, int] = {}
    rows_elided: bool = False  # an elision mark inside the table or in place of it
    ranks_total: RankCount | None = None
    start_time: str | None = None
    end_time: str | None = None


def max_bytes(run: NcclTestsRun) -> int | None:
    """The sweep's largest size: `maxBytes` in the parameters line, else `-e`."""
    v = run.params.get("max_bytes")
    return v if isinstance(v, int) else run.command.get("e")


def footer_not_pasted(run: NcclTestsRun) -> bool:
    """The table ends without its footer at the sweep's own last size: the run finished and
    the paste stopped there (a crash leaves the table short of maxBytes)."""
    top = max_bytes(run)
    return (run.truncated and not run.failures and bool(run.rows) and top is not None
            and run.rows[-1].size_bytes == top)


def _busbw_says_several(op: str | None, res: NcclResult) -> bool:
    """On one rank busbw is 0 (all_reduce, all_gather ...) or equals algbw (broadcast,
    reduce, sendrecv): a busbw that is neither was measured between several ranks."""
    if res.busbw_gbs <= 0:
        return False
    if op in BUSBW_ZERO_ON_ONE:
        return True
    return abs(res.busbw_gbs - res.algbw_gbs) > 0.011 + 0.001 * res.algbw_gbs


def count_ranks(run: NcclTestsRun) -> RankCount:
    """The rank count from every source the log has.

    Rank lines can be cut (people paste the last one of 1,440), `nGpus 1` is per process
    and mpirun may have started eight, so no single source decides. One GPU is said only
    when exactly one rank line is shown and no source says more.
    """
    shown = len(run.ranks)
    highest = max((r.rank for r in run.ranks), default=None)
    high = highest + 1 if highest is not None else None
    n_thread = run.params.get("n_thread", run.command.get("t"))
    n_gpus = run.params.get("n_gpus", run.command.get("g"))
    per = None
    if isinstance(n_thread, int) or isinstance(n_gpus, int):
        per = (n_thread if isinstance(n_thread, int) else 1) * (
            n_gpus if isinstance(n_gpus, int) else 1)
    np_ = run.command.get("np")
    launched = np_ * (per or 1) if np_ else None
    busbw = any(_busbw_says_several(run.op, res) for r in run.rows
                for res in (r.out_of_place, r.in_place))
    said = {"the highest rank listed": high, "NCCL INFO (nranks)": run.nccl_ranks,
            "the parameters (nThread x nGpus)": per, "the launcher's process count": launched}
    known = [v for v in (shown or None, *said.values()) if v]
    count = max(known) if known else None
    if busbw and (count is None or count < 2):
        count = 2  # at least two: one rank has nothing to send
    disagree = [f"{what} says {n}" for what, n in said.items() if n and n > shown]
    if busbw and shown == 1:
        disagree.append("the busbw column is not what one rank prints (0, or algbw)")
    if shown and disagree:
        disagree = [f"{shown} rank line(s) listed, but " + "; ".join(disagree)]
    one = (shown == 1 and highest == 0 and not busbw
           and all(v in (None, 1) for v in said.values()))
    return RankCount(shown=shown, highest=high, nccl=run.nccl_ranks, per_process=per,
                     launched=launched, busbw_nonzero=busbw, count=count, one_gpu=one,
                     disagreements=disagree if shown else [])


def count_nodes(run: NcclTestsRun) -> tuple[int | None, list[str]]:
    """How many nodes the log shows, with the hosts its rank lines name.

    NCCL INFO's `nNodes` where printed, else the hosts the rank lines name (at least that
    many); None when the rank list is cut to one host and the run had more ranks than one
    process holds, since the rest of the run is not in the paste. A log with no rank line
    and no nNodes shows one node.
    """
    hosts = list(dict.fromkeys(r.host for r in run.ranks))
    if run.nccl_nodes:
        return max(run.nccl_nodes, len(hosts)), hosts
    if len(hosts) > 1:
        return len(hosts), hosts
    rc = run.ranks_total
    # more ranks than the rank lines show, and more than one process holds (a process runs
    # on one host): the hosts of the others are not in the paste
    if run.ranks and rc is not None and rc.count is not None and rc.count > len(run.ranks) \
            and rc.count > (rc.per_process or 1):
        return None, hosts
    return 1, hosts


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
