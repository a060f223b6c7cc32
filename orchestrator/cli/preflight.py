"""`gpuvet preflight` and `gpuvet payload`."""

from __future__ import annotations

import json
from pathlib import Path

import click

from orchestrator.cli._common import (
    fleet,
    fleet_options,
    json_option,
    out,
    results_option,
    suite_option,
    verbose_option,
)
from orchestrator.cli._steps import drain_option, open_run, show_outcome


def register(root: click.Group) -> None:
    @root.command()
    @fleet_options
    @click.option("--from", "from_", type=click.Path(path_type=Path, dir_okay=False),
                  help="Judge a document collected by hand on a node you cannot reach (see "
                       "`gpuvet payload`) instead of connecting; needs exactly one --node "
                       "where the inventory (or -p) has several.")
    @click.option("--resume", metavar="RUN_ID",
                  help="Finish an interrupted or partly failed run: nodes it completed are "
                       "kept, the others are tried again.")
    @results_option
    @suite_option
    @verbose_option
    @drain_option
    @json_option
    def preflight(inventory: Path, nodes: tuple[str, ...], providers: tuple[str, ...],
                  accept_new_host_keys: bool, from_: Path | None, resume: str | None,
                  results: Path, suite: Path | None, verbose: bool,
                  drain_on_fail: bool, as_json: bool) -> int:
        """Record every node's environment and check it against the order.

        Writes raw outputs, facts and findings to RESULTS/<run_id>/. Exit code 0
        when nothing FAILs, 1 when something does, 2 for bad input.
        """
        from orchestrator.errors import UsageError
        from orchestrator.steps.preflight import step as pf
        from orchestrator.suite import load_suite

        the_suite = load_suite(suite)
        if from_ is not None:
            if len(nodes) > 1 or (not nodes and _selected(inventory, providers) != 1):
                raise UsageError("--from judges one node's document: give exactly one --node")
            if resume is not None:
                raise UsageError("--resume and --from do not go together")
            from orchestrator.errors import shown
            from orchestrator.files import MAX_INPUT_BYTES, read_user_file

            data = read_user_file(from_, MAX_INPUT_BYTES, "collect document")  # no FIFO
            try:
                text = data.decode("utf-8")
                doc = json.loads(text)
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise UsageError(f"cannot read {shown(str(from_))}: {exc}") from None
            except RecursionError:  # `[[[[...`: deeper than Python's stack, never a crash
                raise UsageError(f"cannot read {shown(str(from_))}: JSON nested too deeply",
                                 hint="give the collect document the payload wrote") from None
            if not isinstance(doc, dict):
                raise UsageError(f"{from_} is not a gpuvet collect document (not a JSON object)")
        with fleet(inventory, nodes, providers, "preflight", accept_new_host_keys) as f, \
                open_run(results, "preflight", the_suite, inventory, f.nodes, resume) as run:
            if from_ is not None:
                out_dir = run.node_dir(f.nodes[0].name, pf.STEP)
                from orchestrator.store import atomic_write

                atomic_write(out_dir / "collect.json", text)
                report = pf.judge_document(doc, f.nodes[0], f.inv, run.run_id, out_dir, run.rel,
                                           the_suite)
                run.add_findings(report.findings)
            else:
                pf.run_preflight(f.inv, f.nodes, run, the_suite, pool=f.pool,
                                 progress=f.progress)
            findings = run.findings()
            return show_outcome(run, findings, [n.name for n in f.nodes], verbose=verbose,
                                as_json=as_json, title="preflight findings",
                                drain_from=f if drain_on_fail else None)

    @root.command("payload")
    @click.argument("dest", type=click.Path(path_type=Path, dir_okay=False))
    def payload_archive(dest: Path) -> int:
        """Write the payload archive, for nodes the controller cannot reach.

        On the node: tar xzf ARCHIVE && python3 -m payload collect --out collected.json
        --work-dir DIR --ckpt-dir DIR; then here: gpuvet preflight --from collected.json
        -i INVENTORY --node NAME.
        """
        from orchestrator import payload as payload_mod
        from orchestrator.store import atomic_write

        digest, data = payload_mod.archive()
        atomic_write(dest, data)
        out.print(f"wrote {dest} (payload {digest}, {len(data)} bytes). On the node:\n"
                  f"  tar xzf {dest.name} && python3 -m payload collect --out collected.json "
                  "--work-dir DIR --ckpt-dir DIR\nthen here:\n"
                  "  gpuvet preflight --from collected.json -i INVENTORY --node NAME")
        return 0


def _selected(inventory: Path, providers: tuple[str, ...]) -> int:
    """How many nodes the inventory (of these providers) lists: --from needs no --node
    where it is one."""
    from orchestrator import inventory as inv_mod

    inv = inv_mod.load(inventory)
    if any(getattr(inv.providers.get(p), "executor", None) == "slurm"
           for p in providers or inv.providers):
        return 0  # its nodes come from an allocation: name the one
    return len(inv.select(None, list(providers) or None))

