"""`gpuvet schedule print`: the systemd units and the crontab line that run the pipeline,
and on a Slurm cluster the scrontab entry and a self-resubmitting sbatch script that run it
as a batch job, on nodes the scheduler gives it to itself (docs/slurm.md).

An interval is accepted only where systemd's OnCalendar and cron both express
it exactly; arguments are quoted for each (systemd's specifiers and variables,
the shell's words, cron's '%' and the '%' of Slurm's file name patterns). Nothing
is installed or submitted without the user's hand.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import UsageError

_EVERY_RE = re.compile(r"^(\d+)\s*([mhd])$")
# A run may take the interval less a margin (the timer's next start must find it ended);
# less than 10 minutes is too short for preflight, health and nccl-tests on one node
MARGIN_MIN = 5
MIN_LIMIT_MIN = 10


@dataclass(frozen=True)
class Every:
    """An interval that systemd's OnCalendar and cron both express exactly."""

    minutes: int

    @classmethod
    def parse(cls, text: str) -> Every:
        m = _EVERY_RE.match(text.strip().lower())
        ok = "15m, 20m, 30m, 1h, 2h, 3h, 4h, 6h, 8h, 12h or 1d"
        if not m or int(m.group(1)) == 0:
            raise UsageError(f"--every {text!r} is not an interval like {ok}")
        n, unit = int(m.group(1)), m.group(2)
        minutes = n * {"m": 1, "h": 60, "d": 1440}[unit]
        exact = (minutes < 60 and 60 % minutes == 0) or (minutes % 60 == 0
                                                          and 1440 % minutes == 0)
        if not exact:
            raise UsageError(f"--every {text}: cron can only run at intervals that divide an hour "
                             f"or a day evenly", hint=f"choose one of {ok}")
        if minutes < MIN_LIMIT_MIN + MARGIN_MIN:
            raise UsageError(f"--every {text} is shorter than a run's time limit "
                             f"({MIN_LIMIT_MIN} min at least) plus a {MARGIN_MIN}-minute margin: "
                             "runs would overlap or be killed before they end",
                             hint=f"choose {MIN_LIMIT_MIN + MARGIN_MIN}m or longer ({ok})")
        return cls(minutes)

    @property
    def cron(self) -> str:
        if self.minutes < 60:
            return f"*/{self.minutes} * * * *"
        hours = self.minutes // 60
        return "0 0 * * *" if hours == 24 else "0 * * * *" if hours == 1 else f"0 */{hours} * * *"

    @property
    def calendar(self) -> str:
        if self.minutes < 60:
            return f"*-*-* *:00/{self.minutes}:00"
        hours = self.minutes // 60
        return "*-*-* 00:00:00" if hours == 24 else f"*-*-* 00/{hours}:00:00"

    def __str__(self) -> str:
        return f"{self.minutes} min" if self.minutes < 60 else f"{self.minutes // 60} h"


def systemd_quote(arg: str) -> str:
    """One ExecStart argument: systemd splits on spaces, expands % specifiers and $VARS."""
    arg = arg.replace("%", "%%").replace("$", "$$")
    if re.fullmatch(r"[A-Za-z0-9_@%+=:,./-]+", arg):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def gpuvet_argv() -> list[str]:
    """How this gpuvet is started again from a timer: its own script, absolute."""
    script = Path(sys.executable).with_name("gpuvet")
    if script.is_file():
        return [str(script)]
    return [sys.executable, "-m", "orchestrator"]


ENVIRONMENT = (("COLUMNS", "160"),)  # the service's Environment=, the crontab line's too


def timeout_min(every: Every) -> int:
    """The time one pipeline run may take: the interval less the margin (at least
    MIN_LIMIT_MIN, as `Every.parse` accepts no shorter interval), so a run always ends
    before the timer starts the next."""
    return every.minutes - MARGIN_MIN


def default_log_file() -> Path:
    """Where the crontab line logs: the user's own state folder, writable without root."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "gpuvet" / "pipeline.log"


@dataclass(frozen=True)
class Schedule:
    service: str
    timer: str
    cron: str
    name: str
    scrontab: str = ""
    sbatch: str = ""


# Slurm options every scheduled batch job has: a node of its own (the measurements are the
# nodes', not another job's load), its output appended to one log
_OPTION_RE = re.compile(r"^--?[A-Za-z][A-Za-z0-9-]*(?:=[^\s#]*)?$|^-[A-Za-z]$")


def slurm_options(options: Sequence[str]) -> list[str]:
    """The user's `--sbatch-option`s, each one `--name=value` (or `-x`) as sbatch takes it on
    an `#SBATCH` line; anything else is refused."""
    for opt in options:
        if not _OPTION_RE.match(opt):
            raise UsageError(f"--sbatch-option {opt!r} is not one sbatch option as "
                             "--name=value (no spaces, no '#')",
                             hint="e.g. --sbatch-option=--partition=gpu "
                                  "--sbatch-option=--nodes=2")
    return list(options)


def slurm_path(path: Path) -> str:
    """A path in a Slurm file name pattern: '%' doubled, quoted where it has a space."""
    text = str(path).replace("%", "%%")
    return f'"{text}"' if re.search(r"\s", text) else text


def _directives(prefix: str, every: Every, name: str, log_file: Path,
                options: Sequence[str]) -> list[str]:
    return [f"{prefix} --job-name={name}", f"{prefix} --time={timeout_min(every)}",
            f"{prefix} --exclusive", f"{prefix} --output={slurm_path(log_file)}",
            f"{prefix} --open-mode=append", *(f"{prefix} {o}" for o in options)]


def scrontab(every: Every, argv: Sequence[str], *, name: str, workdir: Path, log_file: Path,
             options: Sequence[str]) -> str:
    """The scrontab entry (`scrontab -e`): #SCRON options, then the crontab line. Slurm's
    time limit ends a run (SIGTERM, then SIGKILL), and the next one is queued only once
    the one before has ended."""
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in ENVIRONMENT)
    return "\n".join([
        f"# scrontab -e (needs ScronParameters=enable in slurm.conf); first: mkdir -p "
        f"{shlex.quote(str(log_file.parent))}",
        *_directives("#SCRON", every, name, log_file, options),
        f"{every.cron} cd {shlex.quote(str(workdir))} && {env} {shlex.join(argv)}",
        "",
    ])


def sbatch_script(every: Every, argv: Sequence[str], *, name: str, workdir: Path,
                  log_file: Path, options: Sequence[str], path: Path) -> str:
    """A batch script that queues its own next run (`--begin` at the next multiple of the
    interval since midnight, `--dependency=singleton`: never two at once) before it runs
    the pipeline, so a run its time limit, a node failure or a FAIL ended still has its
    successor queued."""
    script = shlex.quote(str(path))
    env = [f"export {k}={shlex.quote(v)}" for k, v in ENVIRONMENT]
    return "\n".join([
        "#!/bin/bash",
        f"# gpuvet pipeline every {every} as a Slurm batch job that queues its next run.",
        f"# Save as {path}, then submit it once:",
        f"#   mkdir -p {shlex.quote(str(log_file.parent))} && sbatch {script}",
        f"# Stop the series: scancel --name={name} (the run queued next; a running one ends",
        "# at its time limit or its own end). Exit 1 of a run: a check FAILed or a provider",
        "# regressed (sacct shows the job FAILED); the next run is queued all the same.",
        *_directives("#SBATCH", every, name, log_file, options),
        "set -u",
        f"period={every.minutes * 60}",
        "midnight=$(date -d 'today 00:00' +%s)",
        "now=$(date +%s)",
        "next=$(( midnight + ((now - midnight) / period + 1) * period ))",
        'if ! sbatch --begin="$(date -d "@$next" +%Y-%m-%dT%H:%M:%S)" --dependency=singleton '
        f"{script}; then",
        f'    echo "gpuvet: the next run was not queued; submit {script} again" >&2',
        "fi",
        f"cd {shlex.quote(str(workdir))} || exit 2",
        *env,
        f"exec {shlex.join(argv)}",
        "",
    ])


def schedule(every: Every, argv: Sequence[str], *, name: str, workdir: Path, user: str | None,
             log_file: Path, inventory: Path, sbatch_options: Sequence[str] = (),
             sbatch_file: Path | None = None) -> Schedule:
    """The systemd service + timer pair and the crontab line that run `argv` every `every`,
    and the scrontab entry and self-resubmitting sbatch script that do it on Slurm."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise UsageError(f"--name {name!r}: a unit name is letters, digits, '_', '.' and '-'")
    exec_start = " ".join(systemd_quote(a) for a in argv)
    service = "\n".join([
        f"# /etc/systemd/system/{name}.service (or ~/.config/systemd/user/ without User=)",
        "[Unit]",
        f"Description=gpuvet pipeline on {inventory.name}: preflight, health, nccl, train, regress",
        "Wants=network-online.target",
        "After=network-online.target",
        "",
        "[Service]",
        "Type=oneshot",
        *([f"User={user}"] if user else []),
        f"WorkingDirectory={workdir}",
        *(f"Environment={k}={v}" for k, v in ENVIRONMENT),
        f"ExecStart={exec_start}",
        "# exit 1: a check FAILed or a provider regressed (the unit shows as failed: alert on",
        "# it with OnFailure= or `systemctl --failed`); exit 2: bad input, or another pipeline",
        "# still holds the lock on these results",
        "StandardOutput=journal",
        "StandardError=journal",
        f"SyslogIdentifier={name}",
        f"TimeoutStartSec={timeout_min(every)}min",
        "",
    ])
    timer = "\n".join([
        f"# /etc/systemd/system/{name}.timer; then: systemctl daemon-reload && "
        f"systemctl enable --now {name}.timer",
        f"# logs: journalctl -u {name}.service",
        "[Unit]",
        f"Description=Run {name} every {every}",
        "",
        "[Timer]",
        f"OnCalendar={every.calendar}",
        "Persistent=true",
        f"Unit={name}.service",
        "",
        "[Install]",
        "WantedBy=timers.target",
        "",
    ])
    # cron runs the line with /bin/sh; '%' ends the command there unless escaped. The same
    # environment and time limit as the service (TimeoutStartSec: TERM, then KILL), and the
    # log's folder made first: a user's crontab writes where that user can
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in ENVIRONMENT)
    line = (f"mkdir -p {shlex.quote(str(log_file.parent))} && cd {shlex.quote(str(workdir))} "
            f"&& {env} timeout --kill-after=90s {timeout_min(every)}m {shlex.join(argv)} >> "
            f"{shlex.quote(str(log_file))} 2>&1")
    cron = f"{every.cron} {line.replace('%', chr(92) + '%')}"
    options = slurm_options(sbatch_options)
    return Schedule(service, timer, cron, name,
                    scrontab(every, argv, name=name, workdir=workdir, log_file=log_file,
                             options=options),
                    sbatch_script(every, argv, name=name, workdir=workdir, log_file=log_file,
                                  options=options,
                                  path=sbatch_file or workdir / f"{name}.sbatch"))
