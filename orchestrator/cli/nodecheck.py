"""`gpuvet nodecheck`: the node check Slurm calls (`payload/nodecheck.py`), run here on this
node, or written out as one file for slurm.conf (docs/slurm.md)."""

from __future__ import annotations

import os
from pathlib import Path

import click

from orchestrator.cli._common import ExitCode, out, verbose_option
from orchestrator.errors import UsageError

CHECKS = ("gpus", "busy", "ecc", "xid", "fabric", "ib")  # payload.nodecheck.CHECKS


def register(root: click.Group) -> None:
    @root.command("nodecheck")
    @click.option("--gpus", type=click.IntRange(min=0), default=None, metavar="N",
                  help="GPUs this node must show [default: the NVIDIA GPUs on its PCI bus].")
    @click.option("--ib-ports", type=click.IntRange(min=0), default=None, metavar="N",
                  help="RDMA ports that must be ACTIVE [default: every InfiniBand port "
                       "found].")
    @click.option("--skip", multiple=True, type=click.Choice(CHECKS),
                  help="Leave a check out (repeat it): `busy` where jobs share the node and "
                       "the check runs beside them.")
    @click.option("--drain", is_flag=True,
                  help="On a problem, drain this node: scontrol update nodename=NODE "
                       "state=drain reason=\"gpuvet CODE ...\" (a node someone else drained "
                       "keeps its reason).")
    @click.option("--node", default=None, metavar="NAME",
                  help="This node's Slurm name [default: $SLURMD_NODENAME, else the short "
                       "hostname].")
    @click.option("--timeout", type=click.FloatRange(min=1), default=20.0, show_default=True,
                  metavar="S", help="Seconds each command may take (Slurm kills a "
                                    "HealthCheckProgram after 60).")
    @click.option("--sysfs", default="/sys", show_default=True, metavar="DIR",
                  help="Where sysfs is (the PCI bus and the InfiniBand ports).")
    @click.option("--write-script", type=click.Path(path_type=Path, dir_okay=False),
                  default=None, metavar="PATH",
                  help="Check nothing: write the check as one executable Python file with "
                       "these options built in, for slurm.conf's HealthCheckProgram or "
                       "Prolog (which take a path, no arguments).")
    @verbose_option
    def nodecheck(gpus: int | None, ib_ports: int | None, skip: tuple[str, ...], drain: bool,
                  node: str | None, timeout: float, sysfs: str, write_script: Path | None,
                  verbose: bool) -> int:
        """Check this node in seconds, as Slurm's HealthCheckProgram or a Prolog would.

        GPUs nvidia-smi sees against the expected count, processes already on the GPUs,
        uncorrectable ECC errors, row remaps and page retirements pending or failed, Xid
        events since boot that point at a GPU, its memory or a link, the NVLink fabric
        registration and InfiniBand ports not ACTIVE. One line per problem. Exit 0: no
        problem; 1: a problem (drained with --drain); 4: no NVIDIA driver and no NVIDIA
        GPU here, nothing checked (never drained); 2: bad options. On the node without
        gpuvet: python3 -m payload nodecheck, or the file --write-script writes.
        """
        from payload import nodecheck as nc

        argv = [*(["--gpus", str(gpus)] if gpus is not None else []),
                *(["--ib-ports", str(ib_ports)] if ib_ports is not None else []),
                *[a for s in skip for a in ("--skip", s)], *(["--drain"] if drain else []),
                *(["--node", node] if node else []),
                *(["--timeout", f"{timeout:g}"] if timeout != nc.DEFAULT_TIMEOUT_S else []),
                *(["--sysfs", sysfs] if sysfs != "/sys" else []),
                *(["--verbose"] if verbose else [])]
        args = nc.parse(argv)
        if write_script is not None:
            _write(write_script, nc.baked(Path(nc.__file__).read_text(), argv))
            out.print(f"wrote {write_script} (runs: python3 {write_script} "
                      f"{' '.join(argv)}); in slurm.conf: HealthCheckProgram="
                      f"{write_script.resolve()} (see docs/slurm.md)")
            return ExitCode.OK
        return nc.check(args, write=out.print)


def _write(path: Path, text: str) -> None:
    """The script, executable, in place at once (a node running it never sees half)."""
    from orchestrator.files import atomic_write

    folder = path.resolve().parent
    if not folder.is_dir():
        raise UsageError(f"--write-script {path}: no folder {folder}",
                         hint="create it, or write the script elsewhere and copy it")
    if not os.access(folder, os.W_OK):
        raise UsageError(f"--write-script {path}: {folder} is not writable by you",
                         hint="run as root, or write the script elsewhere and copy it")
    atomic_write(path, text, mode=0o755)
