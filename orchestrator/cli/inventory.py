"""`gpuvet inventory check`: validate an inventory and show it."""

from __future__ import annotations

from pathlib import Path

import click

from orchestrator.cli._common import Group, emit_json, json_option, render
from orchestrator.verdicts import Table


def inventory_table(path: Path) -> Table:
    from orchestrator import inventory as inv_mod

    inv = inv_mod.load(path)
    rows = []
    for prov in inv.providers.values():
        e = prov.expect
        ordered = " ".join(str(x) for x in (
            f"{e.gpus_per_node}x" if e.gpus_per_node else None, e.gpu_model,
            f"{e.memory_per_gpu_gb:g}GB" if e.memory_per_gpu_gb else None, e.form_factor,
            e.interconnect, e.fabric.type if e.fabric.type != "none" else None) if x)
        price = (f"{prov.pricing.gpu_hour:g} {prov.pricing.currency}" if prov.pricing else "-")
        if prov.slurm is not None:  # its nodes come from the allocation, at run time
            s = prov.slurm
            nodes = (f"(job {s.job_id})" if s.job_id else
                     f"(salloc: {s.nodes or 'default'} node(s))")
            target = "slurm " + (f"via {s.login.user + '@' if s.login.user else ''}"
                                 f"{s.login.host}" if s.login else "here")
            node = inv_mod.allocated_node(prov, "-", "node")  # the access every node gets
            rows.append((prov.name, nodes, "slurm", target, node.python, node.work_dir,
                         ordered or "-", price))
            continue
        for node in (n for n in inv.nodes if n.provider == prov.name):
            target = node.target if node.executor == "ssh" else node.executor
            if node.proxy_jump:
                target += f" via {node.proxy_jump}"
            rows.append((node.provider, node.name, node.executor, target, node.python,
                         node.work_dir, ordered or "-", price))
    return Table(f"{path} — {len(inv.providers)} provider(s), {len(inv.nodes)} node(s)",
                 ("provider", "node", "executor", "target", "python", "work dir", "ordered",
                  "price/GPU-h"), rows)


def register(root: click.Group) -> None:
    @root.group("inventory", cls=Group)
    def inventory() -> None:
        """Inventory files: check and show."""

    @inventory.command("check")
    @click.argument("file", type=click.Path(path_type=Path, dir_okay=False))
    @json_option
    def check(file: Path, as_json: bool) -> int:
        """Validate an inventory and print it as a table (or every problem, with line numbers)."""
        table = inventory_table(file)
        if as_json:
            emit_json(table.as_json())
        else:
            render(table)
        return 0
