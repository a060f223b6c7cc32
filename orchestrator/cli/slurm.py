"""`gpuvet slurm resume RUN_ID`: undo the drains a run's --drain-on-fail made."""

from __future__ import annotations

from pathlib import Path

import click

from orchestrator.cli._common import ExitCode, emit_json, json_option, out, results_option


def register(root: click.Group) -> None:
    @root.group("slurm")
    def slurm_group() -> None:
        """The verdict written back to Slurm (--drain-on-fail), and undone."""

    @slurm_group.command("resume")
    @click.argument("run_id")
    @results_option
    @click.option("-i", "--inventory", type=click.Path(path_type=Path, dir_okay=False),
                  default=None,
                  help="Reach Slurm as this inventory's slurm: blocks say [default: as the "
                       "run did, from what it recorded with each drain].")
    @json_option
    def resume(run_id: str, results: Path, inventory: Path | None, as_json: bool) -> int:
        """Return to service exactly the nodes RUN_ID drained with --drain-on-fail.

        A node is resumed only while it still carries that run's reason: one drained
        since by someone else, with another reason, is left alone and said so; one
        already back in service is said so too. What was done is recorded in the run,
        so resuming twice does nothing the second time. Exit 0 when every drain of the
        run is undone or left alone on purpose, 1 when Slurm did not do one.
        """
        from orchestrator import drain
        from orchestrator.executors import ExecutorOptions
        from orchestrator.executors.slurm_client import SlurmClient
        from orchestrator.inventory import SlurmOptions
        from orchestrator.store import Run

        run = Run.open(results, run_id)
        blocks: dict[str, SlurmOptions] = {}
        if inventory is not None:
            from orchestrator import inventory as inv_mod

            blocks = {p.name: p.slurm for p in inv_mod.load(inventory).providers.values()
                      if p.slurm is not None}
        recorded = {d.provider: d.slurm for d in drain.read(run.dir)}
        clients: dict[str, SlurmClient] = {}

        def client(provider: str) -> SlurmClient:
            if provider not in clients:
                block = blocks.get(provider)
                if block is None:
                    from orchestrator.errors import UsageError

                    raw = recorded.get(provider)
                    if raw is None:
                        raise UsageError(f"run {run_id} recorded no slurm: block for provider "
                                         f"{provider}", hint="give the inventory with -i")
                    block = SlurmOptions.model_validate(raw)
                clients[provider] = SlurmClient(provider, block, ExecutorOptions())
            return clients[provider]

        with run.locked():
            done = drain.resume(run_id, run.dir, client)
        for c in clients.values():
            c.close()
        failed = [d for d in done if (d.resumed or {}).get("outcome") == "failed"]
        if as_json:
            emit_json({"run_id": run_id, "resumed": [d.resumed | {"node": d.node}
                                                     for d in done if d.resumed]})
        else:
            for d in done:
                out.print((d.resumed or {}).get("said", ""))
            if not done:
                out.print(f"run {run_id} has no drain left to undo")
        return ExitCode.FAILED if failed else ExitCode.OK
