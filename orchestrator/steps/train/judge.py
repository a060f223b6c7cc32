"""Turn the training step's saved outputs into measurements and findings.

Reads only files: each node's rank event files (payload/train/protocol.py),
the supervisor's document, torchrun's output and the GPU telemetry. The same
rules judge a live run and captured fixtures. A phase is judged as soon as it
is back, and says whether the protocol can go on (no restore of a run that
never saved).

`Judge` composes the concerns, each in its own module, writing through one
record sink: a phase that broke (`failures`), speed and MFU (`throughput`),
memory (`memory`), the kill and the restore (`restore`), the user's own
command (`command`), and the judgement shared with other steps: GPU telemetry
(`orchestrator.judging.telemetry`) and checkpoint persistence
(`orchestrator.judging.storage`).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.judging import telemetry
from orchestrator.judging.sink import Sink
from orchestrator.records import Finding, Measurement, Severity
from orchestrator.steps.train import command as command_mod
from orchestrator.steps.train import memory, restore, throughput
from orchestrator.steps.train.failures import failed
from orchestrator.steps.train.reading import Earlier, PhaseOutput
from orchestrator.suite import Suite, TrainParams
from payload.train import protocol

STEP = "train"


@dataclass
class Subject:
    """Who a unit's records are about: one node (single) or a provider (multi)."""

    provider: str
    node: str | None
    nodes: list[str]
    label: str  # single | multi


def telemetry_rules(params: TrainParams) -> telemetry.TelemetryRules:
    """The training step's telemetry verdicts: its thresholds, its codes and words."""
    th = params.thresholds
    return telemetry.TelemetryRules(idle_util_pct=th.gpu_idle_util_pct,
                                    power_violation_pct=th.power_violation_pct)


@dataclass
class Judge:
    """One subject's protocol run, judged phase by phase."""

    run_id: str
    suite: Suite
    subject: Subject
    rel: Callable[[Path], str]
    sink: Sink = field(init=False)
    earlier: Earlier = field(init=False, default_factory=Earlier)

    def __post_init__(self) -> None:
        s = self.subject
        self.sink = Sink(self.run_id, STEP, self.suite.hash, s.provider, s.node, s.nodes,
                         s.label, self.rel, scope="train", engine="train")

    @property
    def params(self) -> TrainParams:
        return self.suite.train

    @property
    def findings(self) -> list[Finding]:
        return self.sink.findings

    @property
    def measurements(self) -> list[Measurement]:
        return self.sink.measurements

    def add(self, code: str, sev: Severity, msg: str, evidence: Iterable[Path] | None = None,
            **details: Any) -> None:
        self.sink.add(code, sev, msg, evidence, **details)

    def measure(self, metric: str, value: float, unit: str, **tags: Any) -> None:
        self.sink.measure(metric, value, unit, **tags)

    # ------------------------------------------------------------------ phases

    def reference(self, out: PhaseOutput) -> bool:
        """Performance, health and the losses the restore must reproduce."""
        sink, params = self.sink, self.params
        self.earlier.ref = out
        if failed(sink, params, out):
            return False
        throughput.nondeterministic(out, self.earlier.inexact)
        steps = out.steps()
        start = out.first(protocol.START) or {}
        ev = [out.rank_file(0)]
        skip = min(params.stats_skip_steps, max(0, len(steps) - 3))
        speed_text = throughput.reference_speed(sink, params, out, skip)
        memory.memory(sink, out)
        losses = [float(s["loss"]) for _, s in sorted(steps.items())]
        q = max(1, len(losses) // 4)
        first, last = statistics.fmean(losses[:q]), statistics.fmean(losses[-q:])
        if not last < first - params.thresholds.loss_drop_min:
            sink.add("TRAIN_LOSS_NOT_DECREASING", "WARN", f"loss did not fall: first quarter "
                     f"mean {first:.4f}, last quarter {last:.4f}", ev, first=first, last=last)
        throughput.input_bound(sink, params, out, skip)
        if str(start.get("device", "")).startswith("cuda"):
            # CPU ranks share cores with everything else: their spread is not a GPU's
            throughput.stragglers(sink, params, out, skip)
        if steps:
            telemetry.judge_window(
                sink, telemetry_rules(params), [n.telemetry() for n in out.nodes],
                min(float(s["t"]) - float(s["step_time_s"]) for s in steps.values()),
                max(float(s["t"]) for s in steps.values()))
        sink.add("TRAIN_REFERENCE", "INFO", f"reference: {len(steps)} steps on "
                 f"{start.get('world')} rank(s) ({start.get('device')}, {start.get('parallel')}"
                 f"{', compiled' if start.get('compiled') else ''}), loss {losses[0]:.4f} -> "
                 f"{losses[-1]:.4f}; {speed_text}", ev)
        return True

    def kill(self, out: PhaseOutput) -> bool:
        """The killed run: a complete checkpoint before the SIGKILL."""
        return restore.kill(self.sink, self.params, self.earlier, out)

    def restore(self, out: PhaseOutput, *, saved_on: list[str], restored_on: list[str],
                ) -> None:
        """The relaunch: the checkpoint restored exactly, the reference's losses after it."""
        restore.restore(self.sink, self.params, self.earlier, out, saved_on=saved_on,
                        restored_on=restored_on)

    def command(self, out: PhaseOutput) -> bool:
        """The user's script: exit status, wall time, telemetry; with the restore contract,
        that the relaunch resumed at or after the last step it saved."""
        return command_mod.command(self.sink, self.params, telemetry_rules(self.params),
                                   self.earlier, out)
