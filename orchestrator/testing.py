"""Test doubles that ship with the library, as fabric.testing and invoke's MockContext do.

A `ScriptedExecutor` answers commands from a script instead of a node: each rule
matches a command (the exact string, a compiled regex, or a predicate) and gives
a reply (exit code, output, a timeout, or an exception to raise). Every call is
recorded with its environment, cwd and timeout, so a unit test can assert what a
step would have run. A command no rule matches raises `UnexpectedCommand`, naming
the command and the node: a step that starts doing something new fails its tests
instead of passing on an empty answer. Files copied with put/get live in a dict.

`scripted_pool` stands where steps take an `ExecutorPool` (`pool(node) -> Executor`).

Only for unit tests of code above the executors: the executors themselves are
tested against real sshd nodes (tests/integration).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Union

from orchestrator.errors import StepError
from orchestrator.executors.base import CommandResult, command_env, remote_path, sha256_command
from orchestrator.inventory import Node

Matcher = Union[str, "re.Pattern[str]", Callable[[str], bool]]


class UnexpectedCommand(AssertionError):
    """A command (or node) the script has no answer for.

    An AssertionError, not a GpuvetError: the test is incomplete, the product is
    not at fault. Fan-out still turns it into that node's failure, so executors
    also keep it in `unexpected` for the test to check.
    """


@dataclass(frozen=True)
class Call:
    """One `run` as the executor received it; env is what the command would see."""

    command: str
    env: dict[str, str]
    cwd: str | None
    timeout: float | None
    stdout_path: Path | None


@dataclass(frozen=True)
class Reply:
    rc: int | None = 0
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    raises: BaseException | None = None


@dataclass
class Rule:
    matcher: Matcher
    reply: Reply | Callable[[Call], Reply]
    times: int | None = None  # None: any number of calls

    def matches(self, command: str) -> bool:
        m = self.matcher
        if isinstance(m, str):
            return m == command
        if isinstance(m, re.Pattern):
            return m.search(command) is not None
        return bool(m(command))

    def describe(self) -> str:
        m = self.matcher
        if isinstance(m, str):
            return repr(m)
        if isinstance(m, re.Pattern):
            return f"re {m.pattern!r}"
        return f"predicate {getattr(m, '__name__', repr(m))}"


@dataclass
class Script:
    """Rules, tried in order; the first that matches and has uses left answers."""

    rules: list[Rule] = field(default_factory=list)

    def on(self, matcher: Matcher, *, rc: int | None = 0, stdout: str = "", stderr: str = "",
           timed_out: bool = False, raises: BaseException | None = None,
           reply: Callable[[Call], Reply] | None = None, times: int | None = None) -> Script:
        """Answer commands matching `matcher`; `times=1` twice scripts two different answers."""
        answer: Reply | Callable[[Call], Reply] = reply or Reply(
            rc=None if timed_out else rc, stdout=stdout, stderr=stderr, timed_out=timed_out,
            raises=raises)
        self.rules.append(Rule(matcher, answer, times))
        return self


class ScriptedExecutor:
    """An Executor for unit tests: answers from a script, records every call."""

    host_key_status = "n/a"

    def __init__(self, node: Node, script: Script | None = None, *,
                 files: Mapping[str, bytes] | None = None, answer_checksums: bool = True) -> None:
        self.node = node
        self.script = Script(list(script.rules)) if script else Script()
        self._used = [0] * len(self.script.rules)
        self.files: dict[str, bytes] = dict(files or {})
        self.answer_checksums = answer_checksums
        self.calls: list[Call] = []
        self.puts: list[str] = []
        self.gets: list[str] = []
        self.unexpected: list[str] = []
        self.closed = False

    def on(self, matcher: Matcher, *, rc: int | None = 0, stdout: str = "", stderr: str = "",
           timed_out: bool = False, raises: BaseException | None = None,
           reply: Callable[[Call], Reply] | None = None, times: int | None = None
           ) -> ScriptedExecutor:
        """Add a rule to this executor only (see `Script.on`)."""
        self.script.on(matcher, rc=rc, stdout=stdout, stderr=stderr, timed_out=timed_out,
                       raises=raises, reply=reply, times=times)
        self._used.append(0)
        return self

    @property
    def commands(self) -> list[str]:
        return [c.command for c in self.calls]

    def _checksum_reply(self, command: str) -> Reply | None:
        """put_verified/get_verified ask for a sha256: answer it from the fake files."""
        if not self.answer_checksums:
            return None
        for path, data in self.files.items():
            if command == sha256_command(path):
                return Reply(stdout=hashlib.sha256(data).hexdigest() + "\n")
        if command.startswith("(sha256sum "):
            return Reply(rc=1, stderr="No such file or directory\n")
        return None

    def _reply(self, call: Call) -> Reply:
        rules = self.script.rules
        self._used += [0] * (len(rules) - len(self._used))
        for i, rule in enumerate(rules):
            if rule.times is not None and self._used[i] >= rule.times:
                continue
            if rule.matches(call.command):
                self._used[i] += 1
                return rule.reply(call) if callable(rule.reply) else rule.reply
        checksum = self._checksum_reply(call.command)
        if checksum is not None:
            return checksum
        self.unexpected.append(call.command)
        known = "; ".join(r.describe() for r in rules) or "none"
        shown = call.command if len(call.command) <= 500 else call.command[:500] + "..."
        raise UnexpectedCommand(f"[{self.node.name}] no scripted answer for command "
                                f"{shown!r} (rules: {known})")

    def run(self, command: str, *, env: Mapping[str, str] | None = None, cwd: str | None = None,
            timeout: float | None = None, stdout_path: Path | None = None) -> CommandResult:
        call = Call(str(command), command_env(self.node, command, env), cwd, timeout, stdout_path)
        self.calls.append(call)
        reply = self._reply(call)
        if reply.raises is not None:
            raise reply.raises
        if stdout_path is not None:
            stdout_path.parent.mkdir(parents=True, exist_ok=True)
            stdout_path.write_text(reply.stdout, encoding="utf-8")
        return CommandResult(node=self.node.name, command=str(command), rc=reply.rc,
                             stdout=reply.stdout, stderr=reply.stderr, duration_s=0.0,
                             timed_out=reply.timed_out)

    def put(self, local: Path, remote: str) -> None:
        path = remote_path(self.node, remote)
        self.files[path] = local.read_bytes()
        self.puts.append(path)

    def get(self, remote: str, local: Path) -> None:
        path = remote_path(self.node, remote)
        self.gets.append(path)
        if path not in self.files:
            raise StepError(f"copying {path} from the node failed: no such file",
                            node=self.node.name, hint="script it: files={path!r: b'...'}")
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_bytes(self.files[path])

    def close(self) -> None:
        self.closed = True

    def check(self) -> None:
        """Raise if a command went unanswered (fan-out may have turned it into a failure)."""
        if self.unexpected:
            raise UnexpectedCommand(f"[{self.node.name}] unscripted commands: "
                                    + "; ".join(repr(c) for c in self.unexpected))


class ScriptedPool:
    """Stands for an ExecutorPool: one ScriptedExecutor per node, made on first use."""

    def __init__(self, scripts: Mapping[str, Script], default: Script | None,
                 files: Mapping[str, Mapping[str, bytes]]) -> None:
        self.scripts = dict(scripts)
        self.default = default
        self.files = {k: dict(v) for k, v in files.items()}
        self.executors: dict[str, ScriptedExecutor] = {}

    def __call__(self, node: Node) -> ScriptedExecutor:
        ex = self.executors.get(node.name)
        if ex is None:
            script = self.scripts.get(node.name, self.default)
            if script is None:
                raise UnexpectedCommand(f"no script for node {node.name!r} (scripted: "
                                        f"{', '.join(sorted(self.scripts)) or 'none'})")
            ex = ScriptedExecutor(node, script, files=self.files.get(node.name))
            self.executors[node.name] = ex
        return ex

    def cancel(self) -> None:
        pass

    def close(self) -> None:
        for ex in self.executors.values():
            ex.close()

    def check(self) -> None:
        for ex in self.executors.values():
            ex.check()

    def __enter__(self) -> ScriptedPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def scripted_pool(scripts: Mapping[str, Script] | None = None, *, default: Script | None = None,
                  files: Mapping[str, Mapping[str, bytes]] | None = None) -> ScriptedPool:
    """A pool whose node NAME answers from scripts[NAME], any other node from `default`."""
    return ScriptedPool(scripts or {}, default, files or {})


# --- a scripted Slurm ---------------------------------------------------------------------

SLURM_COMMANDS = ("srun", "salloc", "sbatch", "squeue", "scontrol", "scancel", "sacct",
                  "sbcast")

# One /bin/sh program for every command: record the argv, then answer from the canned
# replies (the most specific key first: "scontrol show job", "scontrol show", "scontrol").
# srun without a canned reply records its step (for squeue --steps and scancel J.S) and
# runs what it was given (its last three words: /bin/sh -c SCRIPT) here, so the
# executor's commands and copies really run; scancel of a step kills that run.
_FAKE = r"""#!/bin/sh
d=__ROOT__
name=$(basename "$0")
{ printf '%s\037' "$name"; for a in "$@"; do printf '%s\037' "$a"; done; printf '\036'; } \
    >> "$d/calls"
for key in "$name $1 $2" "$name $1" "$name"; do
  if [ -f "$d/canned/$key.rc" ]; then
    [ -f "$d/canned/$key.out" ] && cat "$d/canned/$key.out"
    [ -f "$d/canned/$key.err" ] && cat "$d/canned/$key.err" >&2
    exit "$(cat "$d/canned/$key.rc")"
  fi
done
case "$name" in
srun)
  job=0; step=""; node=""
  for a in "$@"; do
    case "$a" in
      --jobid=*) job=${a#--jobid=} ;;
      --job-name=*) step=${a#--job-name=} ;;
      --nodelist=*) node=${a#--nodelist=} ;;
    esac
  done
  n=$(wc -l < "$d/steps" 2>/dev/null || echo 0)
  echo "$job.$n|$node|$step|$$" >> "$d/steps"
  while [ $# -gt 3 ]; do shift; done
  exec 3<&0
  "$@" <&3 3<&- &
  child=$!
  echo "$child" > "$d/step-$job.$n.pid"
  wait "$child"
  rc=$?
  grep -v "^$job\.$n|" "$d/steps" > "$d/steps.new"; mv "$d/steps.new" "$d/steps"
  exit $rc ;;
squeue)
  [ -f "$d/steps" ] && cut -d'|' -f1-3 "$d/steps"
  exit 0 ;;
scancel)
  for a in "$@"; do
    if [ -f "$d/step-$a.pid" ]; then kill -9 "$(cat "$d/step-$a.pid")" 2>/dev/null; fi
  done
  exit 0 ;;
esac
exit 0
"""


@dataclass
class SlurmCall:
    argv: list[str]

    @property
    def command(self) -> str:
        return self.argv[0]


class SlurmDouble:
    """A scripted Slurm for unit tests: fake `srun`, `salloc`, `sbatch`, `squeue`, `scontrol`,
    `scancel`, `sacct` and `sbcast` in `root/bin`, put first on PATH with `env()`.

    Each records its argv (`calls()`) and prints the reply canned for it (`on`), keyed by
    the command and up to two first words; captured real outputs live in
    tests/fixtures/slurm. `srun` without a canned reply runs its command here, as a step
    `squeue --steps` lists and `scancel J.S` kills.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.bin = root / "bin"
        (root / "canned").mkdir(parents=True, exist_ok=True)
        self.bin.mkdir(exist_ok=True)
        program = _FAKE.replace("__ROOT__", _sh_quote(str(root)))
        for name in SLURM_COMMANDS:
            path = self.bin / name
            path.write_text(program)
            path.chmod(0o755)

    def on(self, key: str, *, stdout: str = "", stderr: str = "", rc: int = 0) -> SlurmDouble:
        """Answer `key` ("scontrol show job", "salloc") with this output and exit code."""
        base = self.root / "canned" / key
        base.with_name(key + ".out").write_text(stdout)
        base.with_name(key + ".err").write_text(stderr)
        base.with_name(key + ".rc").write_text(str(rc))
        return self

    def calls(self, command: str | None = None) -> list[SlurmCall]:
        path = self.root / "calls"
        if not path.exists():
            return []
        out = []
        for record in path.read_text().split("\036"):
            if record:
                call = SlurmCall(record.split("\037")[:-1])
                if command is None or call.command == command:
                    out.append(call)
        return out

    def env(self, base: Mapping[str, str]) -> dict[str, str]:
        """`base` with the fake commands first on PATH."""
        return {**base, "PATH": f"{self.bin}:{base.get('PATH', '/usr/bin:/bin')}"}


def _sh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"
