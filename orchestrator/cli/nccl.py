"""`gpuvet nccl`: nccl-tests single- and multi-node."""

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
                  help="Run on each node's own GPUs.")
    @click.option("--multi/--no-multi", default=True, show_default=True,
                  help="Run across the nodes of each provider (mpirun; torch.distributed "
                       "without MPI).")
    @click.option("--torch", "torch_", is_flag=True,
                  help="Also run the torch.distributed all_reduce benchmark as a second opinion.")
    @click.option("--ring-only", is_flag=True,
                  help="Run with NCCL_ALGO=Ring: the network without tree shortcuts (changes "
                       "the suite, so its hash).")
    @click.option("--network", is_flag=True,
                  help="Also run the network mode: P2P and shared memory off, so every rank "
                       "crosses the NICs, judged against the order's fabric (transport, "
                       "GPUDirect RDMA, busbw per NIC; docs/nccl.md). Adds `network` to the "
                       "suite's nccl.modes, so it changes the suite hash.")
    @click.option("--resume", metavar="RUN_ID",
                  help="Finish an interrupted run: nodes and series it completed are kept.")
    @verbose_option
    @drain_option
    @json_option
    def nccl(inventory: Path, nodes: tuple[str, ...], providers: tuple[str, ...],
             accept_new_host_keys: bool, results: Path, suite: Path | None, single: bool,
             multi: bool, torch_: bool, ring_only: bool, network: bool, resume: str | None,
             verbose: bool, drain_on_fail: bool, as_json: bool) -> int:
        """Build nccl-tests at the suite's commit and run its collectives (all_reduce unless
        it names more): single- and multi-node, in each of the suite's modes.

        Three rounds with identical parameters by default; logs, JSON, build logs,
        measurements and findings land in RESULTS/<run_id>/.
        """
        from orchestrator.steps.nccl import step
        from orchestrator.suite import load_suite

        the_suite = load_suite(suite)
        if ring_only:
            the_suite = the_suite.model_copy(
                update={"nccl": the_suite.nccl.model_copy(update={"ring_only": True})})
        if network:
            the_suite = the_suite.model_copy(update={"nccl": the_suite.nccl.model_copy(
                update={"modes": tuple(dict.fromkeys((*the_suite.nccl.modes, "network")))})})
        with fleet(inventory, nodes, providers, "nccl", accept_new_host_keys) as f, \
                open_run(results, "nccl", the_suite, inventory, f.nodes, resume) as run:
            step.run_nccl(f.inv, f.nodes, run, the_suite, single=single, multi=multi,
                          torch=torch_, pool=f.pool, progress=f.progress)
            return show_outcome(run, run.findings(), [n.name for n in f.nodes], verbose=verbose,
                                as_json=as_json, n_measurements=len(run.measurements()),
                                drain_from=f if drain_on_fail else None)
