"""`gpuvet health`: every GPU measured under load against its datasheet."""

from __future__ import annotations

from pathlib import Path

import click

from orchestrator.cli._common import (
    fleet,
    fleet_options,
    json_option,
    results_option,
    suite_option,
    verbose_option,
)
from orchestrator.cli._steps import drain_option, open_run, show_outcome


def register(root: click.Group) -> None:
    @root.command()
    @fleet_options
    @results_option
    @suite_option
    @click.option("--level", type=click.Choice(["quick", "standard", "burn"]), default=None,
                  help="quick: counters, busy check, one copy and one product (seconds); "
                       "standard: every measurement, about a minute per node; burn: minutes "
                       "of sustained load and memory test [default: the suite's, standard]. "
                       "Changes the suite, so its hash.")
    @click.option("--resume", metavar="RUN_ID",
                  help="Finish an interrupted run: nodes it completed are kept, the others "
                       "run again.")
    @verbose_option
    @drain_option
    @json_option
    def health(inventory: Path, nodes: tuple[str, ...], providers: tuple[str, ...],
               accept_new_host_keys: bool, results: Path, suite: Path | None,
               level: str | None, resume: str | None, verbose: bool, drain_on_fail: bool,
               as_json: bool) -> int:
        """Measure every GPU of every node under load: memory bandwidth, matrix
        throughput per precision (burst and sustained), silent data corruption, a
        memory test, PCIe and peer bandwidth, ECC, remapped rows and Xid events
        before and after, and the variant the GPU measures like.

        All GPUs of a node at once, the nodes in parallel. Files, measurements and
        findings land in RESULTS/<run_id>/. Exit 0 when nothing FAILs, 1 when
        something does, 2 for bad input.
        """
        from orchestrator.steps.health import step
        from orchestrator.suite import load_suite

        the_suite = load_suite(suite)
        if level is not None:
            the_suite = the_suite.model_copy(
                update={"health": the_suite.health.model_copy(update={"level": level})})
        with fleet(inventory, nodes, providers, "health", accept_new_host_keys) as f, \
                open_run(results, "health", the_suite, inventory, f.nodes, resume) as run:
            step.run_health(f.inv, f.nodes, run, the_suite, pool=f.pool, progress=f.progress)
            return show_outcome(run, run.findings(), [n.name for n in f.nodes], verbose=verbose,
                                as_json=as_json, n_measurements=len(run.measurements()),
                                drain_from=f if drain_on_fail else None)
