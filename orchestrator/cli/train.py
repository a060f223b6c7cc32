"""`gpuvet train`: a real small training job, a checkpoint, a SIGKILL, a verified restore."""

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
    @click.option("--single/--no-single", default=True, show_default=True,
                  help="Run the protocol on each node's own GPUs (restored on another node "
                       "where nodes share the checkpoint directory).")
    @click.option("--multi/--no-multi", default=True, show_default=True,
                  help="Run it across the nodes of each provider (torchrun, one rendezvous "
                       "on the first node).")
    @click.option("--resume", metavar="RUN_ID",
                  help="Finish an interrupted run: units it completed are kept.")
    @verbose_option
    @drain_option
    @json_option
    def train(inventory: Path, nodes: tuple[str, ...], providers: tuple[str, ...],
              accept_new_host_keys: bool, results: Path, suite: Path | None, single: bool,
              multi: bool, resume: str | None, verbose: bool, drain_on_fail: bool, as_json: bool) -> int:
        """Train the suite's GPT under torchrun, checkpoint it, SIGKILL it, restore it.

        Reference run, killed run (checkpoint at step K, killed later or inside a
        second save), restore from the newest complete checkpoint, verified bit for
        bit against the reference in deterministic mode. Step time, tokens/s and MFU
        (on the fastest kernels, timed after the reference's verified steps), memory,
        checkpoint and restart costs land in RESULTS/<run_id>/ with the raw logs and
        GPU telemetry. docs/training.md describes the protocol.
        """
        from orchestrator.steps.train import step
        from orchestrator.suite import load_suite

        the_suite = load_suite(suite)
        with fleet(inventory, nodes, providers, "train", accept_new_host_keys) as f, \
                open_run(results, "train", the_suite, inventory, f.nodes, resume) as run:
            step.run_train(f.inv, f.nodes, run, the_suite, single=single, multi=multi,
                           pool=f.pool, progress=f.progress)
            return show_outcome(run, run.findings(), [n.name for n in f.nodes], verbose=verbose,
                                as_json=as_json, n_measurements=len(run.measurements()),
                                drain_from=f if drain_on_fail else None)
