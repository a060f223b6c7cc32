"""What the step commands (preflight, health, nccl, train, pipeline) share: open or resume a run,
finish it, show its verdicts."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from orchestrator.cli._common import Fleet, emit_json, out, render
from orchestrator.errors import UsageError
from orchestrator.records import Finding
from orchestrator.verdicts import Table, findings_table, run_status, verdict_table, verdicts

if TYPE_CHECKING:  # the step commands import this module; --help needs neither
    from orchestrator.drain import DrainReport
    from orchestrator.store import Run
    from orchestrator.suite import Suite

F = TypeVar("F", bound=Callable[..., Any])


def drain_option(f: F) -> F:
    return click.option(
        "--drain-on-fail", "drain_on_fail", is_flag=True,
        help="Write the verdict back to Slurm: drain each node of an executor slurm provider "
             "that has a FAIL on the provider's side, with the reason `gpuvet CODE run "
             "RUN_ID` (never for a setup problem or a node not measured); `gpuvet slurm "
             "resume RUN_ID` undoes exactly these drains.")(f)


def write_back(run: Run, findings: Sequence[Finding], fleet: Fleet) -> DrainReport:
    """--drain-on-fail: the run's provider-side FAILs as drains, recorded in the run."""
    from orchestrator import drain
    from orchestrator.executors.slurm_client import client_for

    opts = fleet.pool.options
    settings = {p: s.model_dump(mode="json") for p, s in opts.slurm.items()}
    return drain.drain_failed(run.run_id, run.dir, findings, fleet.nodes,
                              lambda provider: client_for(opts, provider), settings)


@contextlib.contextmanager
def open_run(results: Path, command: str, suite: Suite, inventory: Path | None,
             nodes: Sequence[Any], resume: str | None = None) -> Iterator[Run]:
    """A new run, or the run to resume: same command, suite and inventory, locked."""
    from orchestrator.store import Run, file_sha256

    if resume is None:
        run = Run.create(results, command=command, suite_hash=suite.hash,
                         suite=suite.model_dump(mode="json"), inventory_path=inventory,
                         providers=[n.provider for n in nodes], nodes=[n.name for n in nodes])
        with run.locked(), run.guard():
            yield run
        return
    run = Run.open(results, resume)
    if run.meta.command != command:
        raise UsageError(f"run {resume} is a {run.meta.command!r} run, not {command!r}",
                         hint=f"resume it with `gpuvet {run.meta.command} --resume {resume}`")
    if run.meta.suite_hash != suite.hash:
        raise UsageError(f"run {resume} used suite {run.meta.suite_hash}, this one is "
                         f"{suite.hash}", hint="resume with the run's own --suite, or start a "
                         "new run")
    if inventory is not None and run.meta.inventory_sha256 not in (None,
                                                                   file_sha256(inventory)):
        raise UsageError(f"{inventory} is not the inventory run {resume} was started with "
                         "(its content differs)", hint="resume with the run's own inventory, "
                         "or start a new run")
    holder, left = run.last_holder(), run.meta.status == "running"
    with run.locked():
        if left:  # its lock is free: whoever ran it is gone without saying how it ended
            from orchestrator.files import warn

            warn(f"run {resume} was left running by {holder}, which ended without finishing "
                 "it (killed, its session lost or its host down); the units it finished are "
                 "kept, the rest run again from a clean start")
        run.meta.status = "running"
        run.meta.finished = None
        run.save_meta()
        with run.guard():
            yield run


def show_outcome(run: Run, findings: list[Finding], node_names: Sequence[str], *, verbose: bool,
                 as_json: bool, n_measurements: int | None = None, title: str = "findings",
                 tables: Sequence[Table] = (), drain_from: Fleet | None = None) -> int:
    """Finish the run, then show it: a closed stdout cannot leave a run "running". `tables`
    (a step's own, such as the fleet's rails) are shown after the verdicts where they
    have rows, and are in `--json` as `tables`. With `drain_from` (--drain-on-fail) the
    verdict is written back to Slurm first."""
    report = write_back(run, findings, drain_from) if drain_from is not None else None
    status = run_status(findings)
    run.finish(status)
    if as_json:
        emit_json({"run_id": run.run_id, "status": status, "results": str(run.dir),
                   "verdicts": verdicts(findings, node_names),
                   "findings": [f.model_dump(mode="json") for f in findings],
                   "measurements": n_measurements,
                   **({"tables": [t.as_json() for t in tables]} if tables else {}),
                   **(report.as_json() if report is not None else {})})
    else:
        render(findings_table(findings, f"{title} — run {run.run_id}", verbose))
        render(verdict_table(findings, node_names))
        for t in tables:
            if t.rows:
                render(t)
        for line in report.lines if report is not None else []:
            out.print(line)
        tail = f"{n_measurements} measurements; " if n_measurements is not None else ""
        out.print(f"{tail}results: {run.dir}")
    return 1 if status == "failed" else 0
