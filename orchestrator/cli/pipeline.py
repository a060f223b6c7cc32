"""`gpuvet pipeline` (the scheduled run) and `gpuvet schedule print`."""

from __future__ import annotations

import getpass
import shlex
import sys
from pathlib import Path

import click

from orchestrator.cli._common import (
    emit_json,
    fleet,
    fleet_options,
    inventory_option,
    json_option,
    out,
    render,
    results_option,
    suite_option,
    verbose_option,
)
from orchestrator.cli._steps import drain_option, open_run, write_back
from orchestrator.cli.regress import prom_option, regress_options, settings_from, show_evaluation


def register(root: click.Group) -> None:
    @root.command("pipeline")
    @fleet_options
    @results_option
    @suite_option
    @click.option("--torch", "torch_", is_flag=True,
                  help="Also run the torch.distributed all_reduce benchmark; across nodes "
                       "where nccl-tests cannot be built, it measures the fabric alone.")
    @click.option("--train/--no-train", "train", default=None,
                  help="Run the training step [default: when the suite has a train section].")
    @click.option("--health/--no-health", "health", default=True, show_default=True,
                  help="Run the health step (at the suite's level, standard by default) "
                       "between preflight and nccl.")
    @click.option("--fleet/--no-fleet", "fleet_step", default=None,
                  help="Run the fleet step after nccl (pairs, re-pairs: which node, which "
                       "link; providers with one node are skipped) [default: when the suite "
                       "has a fleet section].")
    @click.option("--resume", metavar="RUN_ID",
                  help="Finish an interrupted pipeline run: the steps' finished units are "
                       "kept, the interrupted step resumes where it stopped, the later steps "
                       "run. Same inventory and suite as the run.")
    @regress_options
    @prom_option
    @verbose_option
    @drain_option
    @json_option
    def pipeline(inventory: Path, nodes: tuple[str, ...], providers: tuple[str, ...],
                 accept_new_host_keys: bool, results: Path, suite: Path | None, torch_: bool,
                 train: bool | None, health: bool, fleet_step: bool | None,
                 resume: str | None, test_: str, alpha: float, min_effect: float,
                 min_size: int, last: int, prom_file: Path | None, verbose: bool,
                 drain_on_fail: bool, as_json: bool) -> int:
        """Preflight, health, nccl, fleet and train where asked, then regress: one run.

        nccl-tests builds while health loads the GPUs, and each node's training
        reference starts after preflight, waiting before any CUDA call until health is
        over (docs/training.md). Holds a lock on RESULTS while it runs: a second pipeline on the same results
        says who holds it and exits 2 (a lock left by a process that died is taken
        over with a warning). Exit 0 when nothing FAILed and nothing regressed, 1 when
        something did, 2 for bad input.
        """
        from orchestrator import pipeline as pl
        from orchestrator import prom
        from orchestrator.analysis import regress
        from orchestrator.suite import load_suite
        from orchestrator.verdicts import findings_table, run_status, verdict_table, verdicts

        if prom_file is not None:
            prom.check_path(prom_file)
        the_suite = load_suite(suite)
        settings = settings_from(test_, alpha, min_effect)
        command = "gpuvet " + shlex.join(sys.argv[1:]) if sys.argv[1:2] == ["pipeline"] \
            else f"gpuvet pipeline -i {inventory}"
        with pl.pipeline_lock(results, command), \
                fleet(inventory, nodes, providers, "pipeline", accept_new_host_keys) as f, \
                open_run(results, "pipeline", the_suite, inventory, f.nodes, resume) as run:
            outcome = pl.run_pipeline(f.inv, f.nodes, run, the_suite, pool=f.pool,
                                      progress=f.progress, settings=settings, torch=torch_,
                                      train=train, health=health, fleet=fleet_step,
                                      last=last,
                                      min_size=min_size)
            findings = run.findings()
            status = run_status(findings)
            drains = write_back(run, findings, f) if drain_on_fail else None
            run.finish(status)
            ev = outcome.evaluation
            assert ev is not None
            failed = status == "failed" or ev.regressed
            names = [n.name for n in f.nodes]
            if prom_file is not None:
                prom.write(prom_file, [*prom.run_families(run.meta, findings),
                                       *prom.regress_families(ev), prom.written_family()])
            verdict = "FAIL" if failed else "PASS"
            why = []
            if status == "failed":
                why.append(f"{sum(fd.severity == 'FAIL' for fd in findings)} FAIL finding(s)")
            why += [f"{p.provider} {p.verdict.verdict}" for p in ev.providers]
            if as_json:
                emit_json({"run_id": run.run_id, "status": status, "verdict": verdict,
                           "steps": outcome.steps, "results": str(run.dir),
                           "verdicts": verdicts(findings, names),
                           "findings": [fd.model_dump(mode="json") for fd in findings],
                           "measurements": len(run.measurements()),
                           "regress": regress.as_json(ev),
                           **(drains.as_json() if drains is not None else {})})
            else:
                render(findings_table(findings, f"findings — pipeline run {run.run_id}",
                                      verbose))
                render(verdict_table(findings, names))
                show_evaluation(ev, verbose=verbose, as_json=False)
                for line in drains.lines if drains is not None else []:
                    out.print(line)
                out.print(f"pipeline verdict: {verdict} ({'; '.join(why)}); steps "
                          f"{', '.join(outcome.steps)}; results: {run.dir}")
            return 1 if failed else 0

    @root.group("schedule")
    def schedule_group() -> None:
        """Run the pipeline on a timer (prints what to install; installs nothing)."""

    @schedule_group.command("print")
    @click.option("--every", required=True, metavar="INTERVAL",
                  help="How often: 15m, 20m, 30m, 1h, 2h, 3h, 4h, 6h, 8h, 12h or 1d. A run may take "
                       "the interval less 5 minutes; a shorter interval than 15m is refused.")
    @inventory_option
    @results_option
    @suite_option
    @prom_option
    @click.option("--name", default="gpuvet-pipeline", show_default=True,
                  help="Name of the systemd units.")
    @click.option("--log-file", type=click.Path(path_type=Path, dir_okay=False),
                  default=None,
                  help="Where the crontab line appends its output (systemd: the journal) "
                       "[default: $XDG_STATE_HOME/gpuvet/pipeline.log, else "
                       "~/.local/state/gpuvet/pipeline.log: writable without root].")
    @click.option("--user", "user", default=None,
                  help="User= of the system service [default: you].")
    @click.option("--sbatch-option", "sbatch_options", multiple=True, metavar="OPTION",
                  help="An sbatch option for the Slurm forms, as --name=value (repeat it): "
                       "--sbatch-option=--partition=gpu --sbatch-option=--nodes=2. Each run "
                       "has --exclusive, the interval less 5 minutes as --time, --job-name "
                       "NAME and its output appended to --log-file.")
    @click.option("--sbatch-file", type=click.Path(path_type=Path, dir_okay=False),
                  default=None, metavar="PATH",
                  help="Where the sbatch script is to be saved; it resubmits itself from "
                       "there [default: ./NAME.sbatch].")
    @json_option
    def schedule_print(every: str, inventory: Path, results: Path, suite: Path | None,
                       prom_file: Path | None, name: str, log_file: Path | None,
                       user: str | None, sbatch_options: tuple[str, ...],
                       sbatch_file: Path | None, as_json: bool) -> int:
        """Print a systemd service and timer pair, the equivalent crontab line, and for a
        Slurm cluster a scrontab entry and a self-resubmitting sbatch script.

        All run `gpuvet pipeline` with absolute paths; systemd logs to the journal
        (journalctl -u NAME), cron and Slurm append to --log-file. The Slurm forms run
        the pipeline as a batch job on nodes the scheduler gives it alone (--exclusive),
        so a regression run measures idle nodes, not other jobs' load (docs/slurm.md).
        Nothing is installed or submitted: copy the units to /etc/systemd/system/ and
        enable the timer, add the line with `crontab -e` or the entry with
        `scrontab -e`, or save the script and `sbatch` it once.
        """
        from orchestrator import prom
        from orchestrator import schedule as sc

        when = sc.Every.parse(every)
        log_file = log_file or sc.default_log_file()
        if prom_file is not None:
            prom.check_path(prom_file, here=False)
        if not inventory.is_file():
            from orchestrator.errors import UsageError

            raise UsageError(f"no inventory {inventory}")
        argv = [*sc.gpuvet_argv(), "pipeline", "-i", str(inventory.resolve()), "--results",
                str(results.resolve())]
        if suite is not None:
            argv += ["--suite", str(suite.resolve())]
        if prom_file is not None:
            argv += ["--prom-file", str(prom_file.resolve())]
        sbatch_path = (sbatch_file or Path(f"{name}.sbatch")).resolve()
        sched = sc.schedule(when, argv, name=name, workdir=Path.cwd(),
                            user=user or getpass.getuser(), log_file=log_file.resolve(),
                            inventory=inventory, sbatch_options=sbatch_options,
                            sbatch_file=sbatch_path)
        if as_json:
            emit_json({"service": sched.service, "timer": sched.timer, "cron": sched.cron,
                       "name": sched.name, "scrontab": sched.scrontab,
                       "sbatch": sched.sbatch, "sbatch_file": str(sbatch_path)})
            return 0
        out.print(f"# --- {name}.service\n{sched.service}")
        out.print(f"# --- {name}.timer\n{sched.timer}")
        out.print(f"# --- or one crontab line (crontab -e); output appends to {log_file}\n"
                  f"{sched.cron}")
        out.print(f"# --- on a Slurm cluster: a scrontab entry (scrontab -e)\n{sched.scrontab}")
        out.print(f"# --- or a batch script that queues its next run: {sbatch_path}\n"
                  f"{sched.sbatch}")
        return 0

