"""One error hierarchy for the whole library.

Every message says what happened, where (node, command, file) and what to do
next. The CLI maps these to exit codes; the library never exits.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

from orchestrator.command import CommandResult
from payload.scrub import scrub_text


class GpuvetError(Exception):
    """Base of every error gpuvet raises on purpose."""

    exit_code = 1

    def __init__(
        self,
        what: str,
        *,
        node: str | None = None,
        command: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.what = what
        self.node = node
        self.command = command
        self.hint = hint
        super().__init__(self.render())

    def render(self) -> str:
        parts = []
        if self.node:
            parts.append(f"[{self.node}]")
        parts.append(self.what)
        text = " ".join(parts)
        if self.command:
            text += f"\n  command: {self.command}"
        if self.hint:
            text += f"\n  what to do: {self.hint}"
        return text


class UsageError(GpuvetError):
    """Bad input from the user (arguments, files): exit code 2."""

    exit_code = 2


class InventoryError(UsageError):
    """An inventory file has one or more problems; each is reported on its own line."""

    def __init__(self, path: str, problems: list[str]) -> None:
        self.path = path
        self.problems = problems
        lines = "\n".join(f"  {p}" for p in problems)
        noun = "problem" if len(problems) == 1 else "problems"
        super().__init__(
            f"inventory {path} has {len(problems)} {noun}:\n{lines}",
            hint="fix the lines above and run `gpuvet inventory check` again",
        )


class ParseError(GpuvetError):
    """A parser met text it does not understand. It never guesses.

    Exit code 2: the text handed to it (a file given to `gpuvet parse`) is bad input.
    """

    exit_code = 2

    def __init__(self, kind: str, what: str, *, line_no: int | None = None, line: str | None = None,
                 source: str | None = None) -> None:
        self.kind = kind
        self.reason = what
        self.line_no = line_no
        self.line = line
        self.source = source
        where = source or "<text>"
        if line_no is not None:
            where += f":{line_no}"
        msg = f"cannot parse {kind} output at {where}: {what}"
        if line is not None:
            msg += f"\n  line: {line.rstrip()[:200]!r}"
        super().__init__(msg, hint="check that the file is the unedited output of the command; "
                         "report the line if it is")


    def scrubbed(self, text: str) -> ParseError:
        """This error as it may be shown, for the text it was raised on: its reason scrubbed,
        and the line it quotes as the scrubbed text has it (a key block's body line is a
        secret only after its BEGIN line). Only the text up to that line is scrubbed, so a
        refusal stays as quick as the parse that made it."""
        line, reason = self.line, self.reason
        if line is not None and self.line_no is not None and self.line_no > 0:
            end, start = -1, 0
            for _ in range(self.line_no):
                start = end + 1
                end = text.find("\n", start)
                if end < 0:
                    end = len(text)
                    break
            as_kept = scrub_text(text[:end]).rsplit("\n", 1)[-1]  # a scrubbed line stays one
            line = as_kept if line.strip() and line.strip() in text[start:end] \
                else scrub_text(line)
            quoted = self.line.strip() if self.line is not None else ""
            if quoted:  # the reason may quote the line too
                reason = reason.replace(quoted, line.strip())
        return ParseError(self.kind, scrub_text(reason), line_no=self.line_no, line=line,
                          source=None if self.source is None else scrub_text(self.source))


class ConnectionFailed(GpuvetError):
    """A node could not be reached."""


class HostKeyError(ConnectionFailed):
    """A host key is unknown or, worse, changed."""


class NodeUnreachable(ConnectionFailed):
    """One hop on the way to a node (a jump host or the node itself) failed.

    `hop` names it as the inventory does and `cause` says why in a word
    ("refused", "timed out", "dns", "auth", ...), so callers can sort failures
    by type instead of reading messages.
    """

    def __init__(self, what: str, *, hop: str, cause: str, node: str | None = None,
                 command: str | None = None, hint: str | None = None) -> None:
        self.hop = hop
        self.cause = cause
        super().__init__(what, node=node, command=command, hint=hint)


class StepError(GpuvetError):
    """A step (preflight, health, nccl, train) could not do its work on a node."""


class CommandTimeout(StepError):
    """A command outlived its timeout and was killed.

    `result` holds what it printed before that, like invoke's `Failure.result`.
    """

    def __init__(self, what: str, *, node: str | None = None, command: str | None = None,
                 hint: str | None = None, result: CommandResult | None = None) -> None:
        self.result = result
        super().__init__(what, node=node, command=command, hint=hint)


class CommandFailed(StepError):
    """A command exited with a non-zero status; `result` holds its output and exit code."""

    def __init__(self, what: str, *, result: CommandResult, node: str | None = None,
                 command: str | None = None, hint: str | None = None) -> None:
        self.result = result
        super().__init__(what, node=node, command=command, hint=hint)


class AllocationEnded(StepError):
    """The Slurm allocation a node was reached through ended under the work (its time limit,
    a preemption, an scancel): the scheduler's doing, not the node's. `state` is Slurm's
    job state (TIMEOUT, PREEMPTED, CANCELLED, ...), `job` the job id."""

    def __init__(self, what: str, *, job: str, state: str, node: str | None = None,
                 command: str | None = None, hint: str | None = None) -> None:
        self.job = job
        self.state = state
        super().__init__(what, node=node, command=command, hint=hint)

    @property
    def code(self) -> str:
        """The finding code the step driver gives it: SLURM_JOB_TIMEOUT, SLURM_JOB_PREEMPTED,
        else SLURM_JOB_ENDED."""
        return f"SLURM_JOB_{self.state}" if self.state in ("TIMEOUT", "PREEMPTED") else \
            "SLURM_JOB_ENDED"


class StoreError(GpuvetError):
    """The controller could not write its own results: not a node's fault (exit 3).
    `full`: the write failed for want of space (ENOSPC, EDQUOT)."""

    exit_code = 3
    full = False


class Terminated(BaseException):
    """SIGTERM, raised in the main thread the way KeyboardInterrupt is raised for SIGINT."""



# C0 controls (ESC starts ANSI CSI and OSC sequences, BEL ends an OSC title), DEL, the C1
# controls (0x9b is a one-byte CSI), the Unicode bidi controls that reorder what a line
# appears to say, and lone surrogates (a file name's bytes that are not UTF-8, as Python
# reads them with surrogateescape), which no terminal or JSON file can be sent
_CONTROLS = "\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff"
_CONTROL_RE = re.compile(f"[\x00-\x1f{_CONTROLS}]")
_CONTROL_BUT_LINES_RE = re.compile(f"[\x00-\x08\x0b-\x1f{_CONTROLS}]")  # tab, newline stay


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group(0))
    if 0xDC80 <= c <= 0xDCFF:  # surrogateescape: the byte it stands for
        return f"\\x{c - 0xDC00:02x}"
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def escaped(text: str, *, keep_lines: bool = False) -> str:
    """Every control character written out (`\\x1b`, `\\x07`, `\\u202e`, a non-UTF-8
    byte as `\\xff`), so that an escape sequence in a name or a node's output is seen,
    never obeyed; with `keep_lines`, tabs and line breaks stay (text shown as it is laid
    out, `render.terminal_text`)."""
    rx = _CONTROL_BUT_LINES_RE if keep_lines else _CONTROL_RE
    return rx.sub(_escape, text) if rx.search(text) else text


def shown(text: str) -> str:
    """A file or user name for a message, on one line: bytes that are not UTF-8 and
    control characters shown as `\\xNN`, never an encoding error or a terminal escape
    when printed or stored."""
    return escaped(text)


def did_you_mean(name: str, known: Iterable[str], cutoff: float = 0.6) -> str:
    """` (did you mean 'x'?)` naming the known name closest to `name`, or '' when none is
    close: one spelling of the suggestion for every "no such ..." message."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=cutoff)
    return f" (did you mean {shown(close[0])!r}?)" if close else ""
