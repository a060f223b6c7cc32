"""One reader of "the tool's output vs known noise", shared by the parsers of pasted text.

What people save and paste is rarely the tool's output alone: mpirun and srun
add their own lines (Open MPI's help aggregation and `----` banner blocks,
`srun:` notices), ssh warns about host keys, the shell prompt and the command
line are copied with the output, UCX and X11 libraries complain on stderr, and
a person cuts a long block with `...` or `[...]`. The nccl-tests, nvidia-smi
and NCCL INFO parsers all read those texts, so what counts as noise is written
once, here. Every line a parser passes over is recorded (`IgnoredLine`), and
marks of a person's editing are recorded as `Edit`s, so nothing disappears
silently and an edited paste is never taken for a whole one.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from pydantic import BaseModel, ConfigDict


class IgnoredLine(BaseModel):
    """A line a parser read past: known noise (`kind` says whose) or text it does not know."""

    model_config = ConfigDict(extra="forbid")

    line_no: int
    kind: str
    text: str


class Edit(BaseModel):
    """A mark that a person edited the text: an elision, a lost `#`, a missing header."""

    model_config = ConfigDict(extra="forbid")

    line_no: int | None
    what: str


# Known noise, by who prints it. A line is tried against these only after the
# parser has found it is none of its tool's own lines and no failure message.
NOISE: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("openmpi-help", re.compile(
        r"^\[[^\]\s]+:\d+\] \d+ more process(?:es)? ha(?:ve|s) sent help message \S+ / \S+"
        r"|^\[[^\]\s]+:\d+\] Set MCA parameter \"\w+\" to 0 to see all help / error messages")),
    ("openmpi", re.compile(r"^\[[^\]\s]*:\d+\] ")),  # `[host:pid] ...` lines of mpirun itself
    ("ssh", re.compile(r"^Warning: Permanently added .+ to the list of known hosts\.?\s*$")),
    ("slurm", re.compile(r"^(?:srun|slurmstepd|salloc|sbatch): ")),
    ("ucx", re.compile(r"^\[\d+\.\d+\] \[[^\]]+\]\s+\S+:\d+\s+UCX\s+[A-Z]+\s")),
    ("x11", re.compile(r"^(?:Authorization required, but no authorization protocol specified"
                       r"|No protocol specified|Invalid MIT-MAGIC-COOKIE-1 key)\s*$")),
    ("shell-prompt", re.compile(
        r"^(?:\(\S+\) )?(?:[\w.-]+@[\w.-]+:\S*|\[[\w.-]+@[\w.-]+ [^\]]*\])\s?[$#] ?\S"
        r"|^\[[\w.-]+@[\w.-]+[ :][^\]]*\][$#]? \S|^[$>] \S")),
    ("command-line", re.compile(
        r"^(?:[A-Z_][A-Z0-9_]*=\S*\s+)*(?:mpirun|mpiexec|srun|torchrun|sbatch|nvidia-smi"
        r"|\S*\w+_perf(?:_mpi)?)(?:\s|$)")),
    ("shell-trace", re.compile(r"^\++ \S")),  # `set -x` echoing a script's commands
    ("markdown", re.compile(r"^```\S*\s*$|^_{10,}\s*$|^~{3,}\s*$")),
    ("hex-dump", re.compile(r"^(?:[0-9a-f]{8} ){3}[0-9a-f]{8}$")),
)

# Open MPI frames its help and abort messages between two rules of dashes; the
# lines between belong to mpirun, whatever they say.
OPENMPI_RULE = re.compile(r"^-{20,}\s*$")

# A person's elision: `...`, `[...]`, `…`, `[snip]`, `<snip>`, `(...)`.
ELISION = re.compile(r"^\s*(?:\.{3,}|…|\(\s*(?:\.{3}|…)\s*\)"
                     r"|[\[<]\s*(?:\.{3}|…|snip(?:ped)?|cut|truncated|omitted)\s*[\]>])\s*$", re.I)


# An author's elision written as a comment: `# ...`, `# [...]`, or a `#` line saying what
# was cut (`# ... (truncated NCCL output for brevity) ...`, `# output omitted`).
ELISION_COMMENT = re.compile(
    r"^\s*#+\s*(?:\.{2,}|…|\[\s*(?:\.{2,}|…)\s*\])"
    r"|^\s*#.*\b(?:truncated|omitted|snipped|elided|trimmed|cut (?:out|here))\b", re.I)

# The preamble of launcher scripts that run nccl-tests, line by line in the order they
# print it. GKE's nccl-tests images (`/usr/local/gib/scripts/run_nccl_tests.sh`,
# `/scripts/allgather.sh`): `Initializing SSH...`, `Hello from HOST` per host, then
# `Generating hostfiles for N hosts:` and the N host names.
_GKE_START = re.compile(r"^Initializing SSH\.\.\.\s*$")
_GKE_HELLO = re.compile(r"^Hello from \S+\s*$")
_GKE_HOSTFILES = re.compile(r"^Generating hostfiles? for (\d+) hosts?:?\s*$")
_HOST_NAME = re.compile(r"^[A-Za-z0-9][\w.:-]*\s*$")

# Lines listed one by one at most: past that they are counted (`dropped`), so a log of
# a million lines of chatter costs a count, not a million records.
MAX_LISTED = 10_000

_LINE_END = re.compile("\r\n|[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]")


def iter_lines(text: str) -> Iterator[str]:
    """`text.splitlines()` one line at a time, without a list of every line."""
    pos = 0
    for m in _LINE_END.finditer(text):
        yield text[pos:m.start()]
        pos = m.end()
    if pos < len(text):
        yield text[pos:]


class NoiseReader:
    """Classifies the lines a parser does not own, and remembers each one it let pass
    (the first MAX_LISTED; the rest are counted in `dropped`)."""

    def __init__(self) -> None:
        self.ignored: list[IgnoredLine] = []
        self.dropped = 0
        self.edits: list[Edit] = []
        self.in_banner = False
        self.gke = False  # inside a GKE nccl-tests script's preamble
        self.gke_hosts = 0  # host names still to come after `Generating hostfiles`

    def kind(self, line: str) -> str | None:
        """The kind of known noise `line` is, or None. Tracks Open MPI's banner blocks."""
        s = line.strip()
        if OPENMPI_RULE.match(s):
            self.in_banner = not self.in_banner
            return "openmpi-banner"
        if self.in_banner:
            return "openmpi-banner"
        for kind, pattern in NOISE:
            if pattern.match(s):
                return kind
        return None

    def skip(self, line_no: int, line: str) -> bool:
        """Record `line` as noise and say True, or say False when it is not known noise.

        An elision mark is noise too, and an edit: the lines it stands for are lost.
        """
        if ELISION.match(line) or ELISION_COMMENT.match(line):
            self.ignore(line_no, "elision", line)
            self.edit(line_no, f"an elision mark ({line.strip()[:80]!r}): lines were cut out "
                      "here")
            return True
        if self.preamble(line):
            self.ignore(line_no, "gke-nccl-script", line)
            return True
        kind = self.kind(line)
        if kind is None:
            return False
        self.ignore(line_no, kind, line)
        return True

    def preamble(self, line: str) -> bool:
        """A line of a known launcher script's preamble (the GKE nccl-tests scripts)."""
        s = line.strip()
        if _GKE_START.match(s):
            self.gke = True
            return True
        if not self.gke:
            return False
        if self.gke_hosts and _HOST_NAME.match(s):
            self.gke_hosts -= 1
            return True
        if _GKE_HELLO.match(s):
            return True
        if m := _GKE_HOSTFILES.match(s):
            self.gke_hosts = int(m[1])
            return True
        return False

    def ignore(self, line_no: int, kind: str, line: str) -> None:
        if len(self.ignored) >= MAX_LISTED:
            self.dropped += 1
            return
        self.ignored.append(IgnoredLine(line_no=line_no, kind=kind, text=line.rstrip()[:300]))

    def edit(self, line_no: int | None, what: str) -> None:
        if not any(e.what == what for e in self.edits):
            self.edits.append(Edit(line_no=line_no, what=what))


# --------------------------------------------------------------------------- launcher prefixes

# Prefixes launchers put on every line of a job's output. A log is treated as
# prefixed only when most of its lines carry the prefix, so a table row or an
# NCCL line that happens to start with digits is never cut.
LAUNCHER_PREFIXES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("srun --label", re.compile(r"^ *(\d+):(?: |$)")),
    ("mpirun --tag-output", re.compile(r"^\[\d+,(\d+)\]<(?:stdout|stderr)>:")),
    # `kubectl logs --prefix` (with or without --timestamps): the pod names the source
    ("kubectl logs --prefix", re.compile(
        r"^\[pod/([^\]\s/]+)/[^\]\s]+\] (?:\d{4}-\d\d-\d\dT[\d:.]+(?:Z|[+-]\d\d:\d\d) )?")),
    ("kubectl logs --timestamps", re.compile(
        r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)(?: |$)")),
)
# the prefixes that name who wrote the line (a rank, a pod), so a file can be split by them
_SPLITS = frozenset({"srun --label", "mpirun --tag-output", "kubectl logs --prefix"})


def _prefix(lines: list[str]) -> tuple[str, re.Pattern[str]] | None:
    nonempty = [ln for ln in lines if ln.strip()]
    for name, pattern in LAUNCHER_PREFIXES:
        hits = sum(1 for ln in nonempty if pattern.match(ln))
        if nonempty and hits * 2 >= len(nonempty):
            return name, pattern
    return None


def strip_launcher_prefix(lines: list[str]) -> tuple[list[str], str | None]:
    """The lines without their launcher prefix, and which launcher put it there."""
    found = _prefix(lines)
    if found is None:
        return lines, None
    name, pattern = found
    return [pattern.sub("", ln, count=1) for ln in lines], name


def stream_without_prefix(text: str) -> tuple[Iterator[str], str | None]:
    """strip_launcher_prefix on a text, line by line: two passes, no list of lines."""
    for name, pattern in LAUNCHER_PREFIXES:
        nonempty = hits = 0
        for ln in iter_lines(text):
            if ln.strip():
                nonempty += 1
                hits += pattern.match(ln) is not None
        if nonempty and hits * 2 >= nonempty:
            return (pattern.sub("", ln, count=1) for ln in iter_lines(text)), name
    return iter_lines(text), None


def split_by_rank(text: str) -> tuple[str, dict[str, str]] | None:
    """Per-rank texts of a launcher-prefixed output that several ranks wrote into.

    `mpirun --tag-output nvidia-smi` or `srun -l nvidia-smi` interleave one output
    per host; their prefixes tell the lines apart. None when the text carries no
    prefix or one rank only.
    """
    lines = text.splitlines()
    found = _prefix(lines)
    if found is None or found[0] not in _SPLITS:
        return None
    pattern = found[1]
    by_rank: dict[str, list[str]] = {}
    for ln in lines:
        m = pattern.match(ln)
        if m:
            by_rank.setdefault(m.group(1), []).append(ln[m.end():])
    if len(by_rank) < 2:
        return None
    return found[0], {rank: "\n".join(body) + "\n" for rank, body in sorted(
        by_rank.items(), key=lambda kv: (not kv[0].isdigit(), int(kv[0]) if kv[0].isdigit()
                                         else 0, kv[0]))}
