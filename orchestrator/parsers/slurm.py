"""Slurm's client commands as the Slurm executor reads them: pure functions, text in.

- `scontrol show hostnames EXPR`: one host name per line, the nodes of an allocation;
- `scontrol show job [--oneliner] J`: `Key=Value` words (a value may hold spaces, as
  `JobName=gpuvet test` does: the words up to the next `Key=` belong to it), one job
  or several, each starting at `JobId=`;
- `squeue --noheader --format=%i|%T|...`: `|`-separated rows, the last column may hold
  `|` itself (a job name); jobs or, with `--steps`, steps (`123.0`, `123.batch`);
- `sacct --parsable2 --noheader --format=JobID,State,ExitCode,...`: the accounting
  record of a job that slurmctld no longer holds (`CANCELLED by 0` keeps its words).

A line the format does not allow is a ParseError naming it: the executor never guesses
which node it runs on or whether its allocation ended.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

from orchestrator.errors import ParseError
from orchestrator.parsers import register

KIND_HOSTNAMES = "scontrol-show-hostnames"
KIND_JOB = "scontrol-show-job"
KIND_SQUEUE = "squeue"
KIND_SACCT = "sacct"

# a node name as Slurm prints it: a host name (NodeName) without spaces or shell characters
_HOST = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,252})\Z")
_KEY = re.compile(r"([A-Za-z][A-Za-z0-9_/:]*)=(.*)\Z", re.S)
_JOB_ID = re.compile(r"\d+(?:_\d+|_\[[^\]]*\]|\+\d+)?\Z")
_STEP_ID = re.compile(r"\d+(?:_\d+)?(?:\+\d+)?(?:\.(?:\d+|batch|extern|interactive))?\Z")
_STATE = re.compile(r"[A-Z_]+\Z")
_EXIT = re.compile(r"\d+:\d+\Z")

# job states after which the allocation is gone
ENDED_STATES = frozenset({"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED",
                          "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT", "REVOKED",
                          "SPECIAL_EXIT"})


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Hostnames(_Model):
    names: list[str]


class SlurmJob(_Model):
    job_id: str
    name: str | None = None
    state: str  # JobState: RUNNING, PENDING, TIMEOUT, PREEMPTED, CANCELLED, ...
    reason: str | None = None  # Reason=TimeLimit, Resources, None
    node_list: str | None = None  # NodeList as printed (node[1-2]), None while pending
    num_nodes: int | None = None
    time_limit: str | None = None
    exit_code: str | None = None
    fields: dict[str, str]  # every Key=Value as printed

    @property
    def ended(self) -> bool:
        return self.state in ENDED_STATES


class Jobs(_Model):
    jobs: list[SlurmJob]


class QueueRow(_Model):
    id: str  # a job (123, 123_4) or a step (123.0, 123.batch)
    columns: list[str]  # the other columns, in the order the format named them


class Queue(_Model):
    rows: list[QueueRow]


class AcctRow(_Model):
    job_id: str
    state: str  # the first word: CANCELLED of "CANCELLED by 0"
    state_text: str  # as printed
    exit_code: str | None = None
    columns: list[str]  # the columns after JobID, State and ExitCode


class Acct(_Model):
    rows: list[AcctRow]


def _lines(text: str) -> list[tuple[int, str]]:
    return [(i, line.rstrip("\r")) for i, line in enumerate(text.splitlines(), 1)
            if line.strip()]


def parse_hostnames(text: str, source: str | None = None) -> Hostnames:
    """`scontrol show hostnames`: a host name per line, each once, at least one."""
    names: list[str] = []
    for no, line in _lines(text):
        name = line.strip()
        if not _HOST.match(name):
            raise ParseError(KIND_HOSTNAMES, "not a node name", line_no=no, line=line)
        if name in names:
            raise ParseError(KIND_HOSTNAMES, f"node {name} listed twice", line_no=no, line=line)
        names.append(name)
    if not names:
        raise ParseError(KIND_HOSTNAMES, "no node names in the output")
    return Hostnames(names=names)


def _words(text: str) -> list[tuple[int, str, str]]:
    """Key=Value pairs with their line; words without '=' continue the value before."""
    pairs: list[tuple[int, str, str]] = []
    for no, line in _lines(text):
        for word in line.split():
            m = _KEY.match(word)
            if m is None:
                if not pairs:
                    raise ParseError(KIND_JOB, "text before the first Key=Value", line_no=no,
                                     line=line)
                no0, key, value = pairs[-1]
                pairs[-1] = (no0, key, f"{value} {word}")
                continue
            pairs.append((no, m.group(1), m.group(2)))
    return pairs


def parse_job(text: str, source: str | None = None) -> Jobs:
    """`scontrol show job`, multi-line or `--oneliner`: one record per `JobId=`."""
    records: list[tuple[int, dict[str, str]]] = []
    for no, key, value in _words(text):
        if key == "JobId":
            records.append((no, {}))
        elif not records:
            raise ParseError(KIND_JOB, f"{key}= before JobId=", line_no=no)
        fields = records[-1][1]
        if key in fields and key != "JobId":
            raise ParseError(KIND_JOB, f"{key}= twice in one job", line_no=no)
        fields[key] = value
    jobs = []
    for no, fields in records:
        job_id, state = fields.get("JobId", ""), fields.get("JobState", "")
        if not _JOB_ID.match(job_id):
            raise ParseError(KIND_JOB, f"JobId={job_id!r} is not a job id", line_no=no)
        if not _STATE.match(state):
            raise ParseError(KIND_JOB, f"job {job_id} has no JobState (got {state!r})",
                             line_no=no)
        nodes = fields.get("NumNodes", "")
        node_list = fields.get("NodeList")
        jobs.append(SlurmJob(
            job_id=job_id, name=fields.get("JobName"), state=state,
            reason=_null(fields.get("Reason")), node_list=_null(node_list),
            num_nodes=int(nodes.split("-")[0]) if nodes.split("-")[0].isdigit() else None,
            time_limit=_null(fields.get("TimeLimit")), exit_code=fields.get("ExitCode"),
            fields=fields))
    if not jobs:
        raise ParseError(KIND_JOB, "no JobId= in the output")
    return Jobs(jobs=jobs)


def _null(value: str | None) -> str | None:
    return None if value in (None, "", "(null)", "None") else value


def parse_squeue(text: str, source: str | None = None) -> Queue:
    """`squeue --noheader --format` with `|` between columns, the id first; a header line
    (JOBID|...) is read past."""
    rows: list[QueueRow] = []
    width: int | None = None
    for no, line in _lines(text):
        cols = [c.strip() for c in line.split("|")]
        if not rows and cols[0].upper() in ("JOBID", "STEPID"):
            width = len(cols)
            continue
        if not _STEP_ID.match(cols[0]):
            raise ParseError(KIND_SQUEUE, "not a job or step id in the first column",
                             line_no=no, line=line)
        if width is None:
            width = len(cols)
        if len(cols) < width:
            raise ParseError(KIND_SQUEUE, f"{len(cols)} columns where the first row has "
                             f"{width}", line_no=no, line=line)
        # the last column (a job name) may hold '|': its parts are joined back
        rest = cols[1:width - 1] + (["|".join(cols[width - 1:])] if width > 1 else [])
        rows.append(QueueRow(id=cols[0], columns=rest))
    return Queue(rows=rows)


def parse_sacct(text: str, source: str | None = None) -> Acct:
    """`sacct --parsable2 --format=JobID,State,ExitCode[,...]`, with or without its header."""
    rows: list[AcctRow] = []
    for no, line in _lines(text):
        cols = line.split("|")
        if not rows and cols[0] == "JobID":
            continue
        if len(cols) < 2 or not _STEP_ID.match(cols[0]):
            raise ParseError(KIND_SACCT, "not a JobID|State row", line_no=no, line=line)
        state = cols[1].split(" ")[0]
        if not _STATE.match(state):
            raise ParseError(KIND_SACCT, f"{cols[1]!r} is not a job state", line_no=no,
                             line=line)
        code = cols[2] if len(cols) > 2 else None
        if code is not None and code and not _EXIT.match(code):
            raise ParseError(KIND_SACCT, f"{code!r} is not an exit code (N:S)", line_no=no,
                             line=line)
        rows.append(AcctRow(job_id=cols[0], state=state, state_text=cols[1],
                            exit_code=code or None, columns=cols[3:]))
    return Acct(rows=rows)


# Registered without decorating, as dmon is: mutmut leaves decorated functions alone.
register(KIND_HOSTNAMES, "Slurm: the nodes of an allocation, one name per line",
         example="scontrol show hostnames node[1-4]")(parse_hostnames)
register(KIND_JOB, "Slurm: a job's state, reason, nodes and limits (JobState, Reason, NodeList, ...)",
         example="scontrol show job 1234")(parse_job)
register(KIND_SQUEUE, "Slurm: jobs or steps, one '|'-separated row each, the id first",
         example="squeue --noheader --steps --format='%i|%j|%N'")(parse_squeue)
register(KIND_SACCT, "Slurm accounting: a job's state and exit code after it ended",
         example="sacct -X --parsable2 --format=JobID,State,ExitCode -j 1234")(parse_sacct)
