"""`gpuvet fleet`: which node, which link: pairs, re-pairs, groups, stragglers."""

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
from orchestrator.suite import FLEET_COLLECTIVES
from orchestrator.verdicts import rails_table


def register(root: click.Group) -> None:
    @root.command("fleet")
    @fleet_options
    @results_option
    @suite_option
    @click.option("--engine", type=click.Choice(["nccl-tests", "torch"]),
                  help="What each job runs: one mpirun of nccl-tests across its nodes, or "
                       "the torch.distributed benchmark under torchrun on each (gloo on CPU "
                       "nodes). Default: the suite's fleet.engine (nccl-tests).")
    @click.option("--plan", type=click.Choice(["pairs", "groups", "ring"]),
                  help="pairs: disjoint pairs rotated so each node meets fleet.partners "
                       "partners; groups: the pairs, then groups of 4/8/16 and the whole "
                       "fleet over the nodes that passed (stragglers from the whole run); "
                       "ring: each node with its two neighbours. Default: the suite's.")
    @click.option("--partners", type=click.IntRange(1, 16),
                  help="Partners each node meets in the pairs plan (default: the suite's, 2).")
    @click.option("--rails-nccl", "rails_nccl", is_flag=True, default=None,
                  help="Also measure each rail through NCCL: one nccl-tests run per HCA "
                       "between first-round partners with NCCL_IB_HCA set to that HCA "
                       "(nccl-tests engine; the suite's fleet.rails_nccl).")
    @click.option("--collective", "collectives", multiple=True,
                  type=click.Choice(list(FLEET_COLLECTIVES)),
                  help="A collective every job runs, each localised on its own (repeat it: "
                       "--collective all_reduce --collective alltoall, run in that order). "
                       "Default: the suite's fleet.collectives (all_reduce).")
    @verbose_option
    @drain_option
    @json_option
    def fleet_cmd(inventory: Path, nodes: tuple[str, ...], providers: tuple[str, ...],
                  accept_new_host_keys: bool, results: Path, suite: Path | None,
                  engine: str | None, plan: str | None, partners: int | None,
                  rails_nccl: bool | None, collectives: tuple[str, ...], verbose: bool,
                  drain_on_fail: bool, as_json: bool) -> int:
        """Find the one bad node or link among a provider's nodes.

        Disjoint pairs of nodes run a two-node all_reduce at once, round after
        round; a node slow with every partner is a suspect node, a pair slow only
        together a suspect link, both judged against the fleet's median pair (and
        the inventory's or shipped band). With --collective each job runs every
        collective named (alltoall, all_gather, reduce_scatter), each judged
        against its own median pair: a node slow in alltoall only is named so.
        Suspects are re-paired with nodes that passed: only those slow again are
        named (FAIL). A node that cannot be reached is dropped and the rest of
        the plan recomputed without it.
        Providers with fewer than two selected nodes are skipped (INFO).
        Where perftest is installed, each HCA is measured on its own between
        partners (ib_write_bw) and shown as a rail table: a rail more than the
        fleet tolerance below the median rail is named with its NIC, port and
        the GPUs near it. InfiniBand/RoCE error counters are read from sysfs
        before and after the plan.
        """
        from orchestrator.steps.fleet import step
        from orchestrator.suite import load_suite

        the_suite = load_suite(suite)
        update = {k: v for k, v in (("engine", engine), ("plan", plan),
                                    ("partners", partners), ("rails_nccl", rails_nccl),
                                    ("collectives", tuple(dict.fromkeys(collectives)) or None))
                  if v is not None}
        if update:
            params = the_suite.fleet_params.model_copy(update=update)
            the_suite = the_suite.model_copy(update={"fleet": params})
        with fleet(inventory, nodes, providers, "fleet", accept_new_host_keys) as f, \
                open_run(results, "fleet", the_suite, inventory, f.nodes) as run:
            step.run_fleet(f.inv, f.nodes, run, the_suite, pool=f.pool, progress=f.progress)
            fs = run.findings()
            return show_outcome(run, fs, [n.name for n in f.nodes], verbose=verbose,
                                as_json=as_json, n_measurements=len(run.measurements()),
                                tables=[rails_table(fs)],
                                drain_from=f if drain_on_fail else None)
