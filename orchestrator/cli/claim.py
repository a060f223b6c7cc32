"""`gpuvet claim -p P [RUN...] -o DIR`: what the provider's support team needs, for each
FAIL on the provider's side (`report/claim.py`)."""

from __future__ import annotations

from pathlib import Path

import click

from orchestrator.cli._common import out, output_written, results_option
from orchestrator.render import terminal_text


def register(root: click.Group) -> None:
    @root.command("claim")
    @results_option
    @click.option("-p", "--provider", "provider", required=True, metavar="NAME",
                  help="The provider the claim is to.")
    @click.option("-o", "--output", "output", required=True, metavar="DIR",
                  type=click.Path(path_type=Path),
                  help="A new (or empty) folder for the claim and its evidence.")
    @click.argument("run_ids", nargs=-1, metavar="[RUN]...")
    def claim_cmd(results: Path, provider: str, output: Path, run_ids: tuple[str, ...]
                  ) -> int:
        """Write a claim for the provider's support: each FAIL on the provider's side.

        For each one: the node and GPU (index, UUID, serial, PCI bus id), the finding,
        expected against measured with the datasheet or band it came from, when, the
        evidence files copied beside it (scrubbed) with their sha256, the billed hours
        of the node with their price, and for an Xid the action NVIDIA's Xid catalog
        recommends. Setup-side FAILs (TRAIN_OOM, a ckpt_dir the inventory chose) are
        never in a claim. RUN...: the runs to claim from (default: each step's latest
        complete run, as `compare` picks them). DIR must not exist or be empty; the
        claim is made beside it and renamed into place. Exit 1 when the claim holds a
        FAIL, 0 when there was none to claim.
        """
        from orchestrator.report import claim

        c = claim.build(results, provider, run_ids)
        files = output_written(lambda: claim.write(c, results, output), output)
        out.print(terminal_text(f"claim to {provider}: {len(c.items)} FAIL(s) on the "
                                f"provider's side in {output / 'claim.md'} and claim.html, "
                                f"{len(files)} file(s) in all"), markup=False, highlight=False)
        if c.left_out:
            out.print(f"{c.left_out} setup-side FAIL(s) left out (the renter's to fix)",
                      markup=False)
        return 1 if c.items else 0
