"""The user's own training command instead of the built-in program: its exit
status, wall time and GPU telemetry; with the restore contract (a resume flag),
that the relaunch after the SIGKILL resumed at or after the last step it saved.

The command says where it is by printing `step=N` lines; a line that also says
"save", "saved" or "saving" (also inside a word, as "autosaved") marks a
checkpoint; "unsaved" does not.
"""

from __future__ import annotations

import re
from pathlib import Path

from orchestrator.judging import telemetry
from orchestrator.judging.sink import Sink
from orchestrator.steps.train.reading import Earlier, PhaseOutput, tail
from orchestrator.suite import TrainParams
from payload.train.supervise import STEP_LINE

_SAVED = re.compile(r"(?<!un)sav(?:e|ed|ing)\b", re.I)  # "autosaved" is one, "unsaved" not


def command_steps(path: Path) -> tuple[list[int], list[int]]:
    """`step=N` lines of the user's command; those that also say "saved" mark checkpoints."""
    steps: list[int] = []
    saves: list[int] = []
    if not path.is_file():
        return [], []
    for line in path.read_text(errors="replace").splitlines():
        m = STEP_LINE.search(line)
        if m:
            (saves if _SAVED.search(line) else steps).append(int(m.group(1)))
    return steps, saves


def command(sink: Sink, params: TrainParams, rules: telemetry.TelemetryRules,
            earlier: Earlier, out: PhaseOutput) -> bool:
    """One phase of the user's command; True where the protocol can go on."""
    n = out.nodes[0]
    sup, log = n.supervise, n.file("command.stdout")
    ev = [log, n.file("command.stderr"), n.file("supervise.json")]
    if not sup:
        sink.add("TRAIN_FAILED", "FAIL", f"{out.phase}: no supervisor document from "
                 f"{n.node}", ev, phase=out.phase)
        return False
    steps, saves = command_steps(log)
    sink.measure("command_wall_s", float(sup.get("wall_s") or 0), "s", phase=out.phase,
                 rc=sup.get("rc"))
    t_first, t_last = float(sup.get("start_time") or 0), float(sup.get("end_time") or 0)
    telemetry.judge_window(sink, rules, [m.telemetry() for m in out.nodes], t_first, t_last)
    if sup.get("timed_out"):
        sink.add("TRAIN_TIMEOUT", "FAIL", f"{out.phase}: your command ran past "
                 f"{params.timeout_s:.0f} s and was killed", ev, phase=out.phase)
        return False
    if out.phase == "kill":
        if not sup.get("killed"):
            sink.add("TRAIN_KILL_MISSED", "FAIL", "kill: your command ended before it logged "
                     f"step={params.command_kill_after_step}", ev)
            return False
        earlier.kill_out = out
        sink.add("TRAIN_KILLED", "INFO", f"kill: SIGKILLed after step={max(steps or [0])}"
                 + (f"; last save logged at step={max(saves)}" if saves else
                    "; no `saved ... step=N` line seen"), ev)
        return True
    if sup.get("rc") != 0:
        sink.add("TRAIN_COMMAND_FAILED", "FAIL", f"{out.phase}: your command exited with "
                 f"status {sup.get('rc')}: {tail(n.file('command.stderr'))}", ev)
        return False
    if out.phase == "reference":
        sink.add("TRAIN_COMMAND_OK", "INFO", f"your command finished in {sup.get('wall_s')} s"
                 f" ({len(steps)} step lines)", ev)
        return True
    before, saved = command_steps(earlier.kill_out.nodes[0].file("command.stdout")) \
        if earlier.kill_out else ([], [])
    first = min(steps) if steps else None
    need = max(saved) if saved else (min(before) + 1 if before else 1)
    if first is None or first < need:
        sink.add("TRAIN_RESTORE_MISMATCH", "FAIL", "restore: your command "
                 + (f"started again at step={first}" if first is not None else
                    "logged no step") + f", expected step={need} or later"
                 + (" (the last saved step)" if saved else " (it started over)"), ev,
                 first_step=first, expected=need)
        return True
    lost = (max(before) - first) if before else None
    if lost is not None:
        sink.measure("steps_lost", max(lost, 0), "steps")
    sink.add("TRAIN_RESTORE_OK", "PASS", f"restore: your command resumed at step={first} "
             f"(last saved {need if saved else 'unknown'}); finished in "
             f"{sup.get('wall_s')} s", ev, first_step=first)
    return True
