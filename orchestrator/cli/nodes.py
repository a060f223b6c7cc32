"""Commands on every node: ping, exec, put, get."""

from __future__ import annotations

import shlex
from pathlib import Path

import click
from rich.text import Text

from orchestrator.cli._common import (
    emit_json,
    err,
    fleet,
    fleet_options,
    json_option,
    out,
    render,
    report_failures,
)
from orchestrator.verdicts import Table


def register(root: click.Group) -> None:
    @root.command()
    @fleet_options
    @json_option
    def ping(inventory: Path, nodes: tuple[str, ...], providers: tuple[str, ...],
             accept_new_host_keys: bool, as_json: bool) -> int:
        """Connect to every node: hostname seen, latency, host key status, python version."""
        from orchestrator.executors import probe

        with fleet(inventory, nodes, providers, "ping", accept_new_host_keys) as f:
            group = f.fanout(probe)
        rows = []
        for n in f.nodes:
            if n.name in group.results:
                r = group.results[n.name]
                rows.append((n.name, n.provider, r.hostname, round(r.latency_ms, 1), r.host_key,
                             r.python_version or "missing", ""))
            else:
                rows.append((n.name, n.provider, "-", "-", "-", "-", group.failures[n.name].what))
        table = Table("ping", ("node", "provider", "hostname", "latency ms", "host key", "python",
                               "error"), rows)
        if as_json:
            emit_json(table.as_json())
        else:
            render(table)
            report_failures(group)
        return 0 if group.ok else 1

    @root.command("exec", context_settings={"allow_interspersed_args": False})
    @fleet_options
    @click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=600.0,
                  show_default=True, help="Seconds before the command's process group is killed.")
    @click.argument("command", nargs=-1, required=True)
    def exec_(inventory: Path, nodes: tuple[str, ...], providers: tuple[str, ...],
              accept_new_host_keys: bool, timeout: float, command: tuple[str, ...]) -> int:
        """Run one command on every node in parallel and print each node's output.

        Put `--` before the command when it has options of its own.
        """
        cmd = command[0] if len(command) == 1 else shlex.join(command)
        with fleet(inventory, nodes, providers, "exec", accept_new_host_keys) as f:
            group = f.fanout(lambda ex: ex.run(cmd, timeout=timeout))
        bad = False
        for name, res in group.results.items():
            status = ("timed out" if res.timed_out else f"rc={res.rc}")
            out.print(f"--- {name} ({status}, {res.duration_s:.2f} s)")
            if res.stdout:
                out.print(res.stdout.rstrip("\n"))
            if res.stderr:
                err.print(Text(f"[{name} stderr] " + res.stderr.rstrip("\n")))
            bad |= not res.ok
        report_failures(group)
        return 0 if group.ok and not bad else 1

    @root.command()
    @fleet_options
    @click.argument("local", type=click.Path(path_type=Path, dir_okay=False))
    @click.argument("remote")
    def put(inventory: Path, nodes: tuple[str, ...], providers: tuple[str, ...],
            accept_new_host_keys: bool, local: Path, remote: str) -> int:
        """Copy a file to every node and verify its sha256 there.

        A relative REMOTE path is taken relative to each node's work_dir.
        """
        from orchestrator.errors import UsageError
        from orchestrator.executors.base import put_verified

        if not local.is_file():
            raise UsageError(f"no such file: {local}")
        with fleet(inventory, nodes, providers, "put", accept_new_host_keys) as f:
            group = f.fanout(lambda ex: put_verified(ex, local, remote))
        for name, digest in group.results.items():
            out.print(f"{name}: {remote} sha256 {digest} verified")
        report_failures(group)
        return 0 if group.ok else 1

    @root.command()
    @fleet_options
    @click.argument("remote")
    @click.argument("dest", type=click.Path(path_type=Path, file_okay=False))
    def get(inventory: Path, nodes: tuple[str, ...], providers: tuple[str, ...],
            accept_new_host_keys: bool, remote: str, dest: Path) -> int:
        """Copy a file from every node into DEST/<node>/ and verify its sha256.

        A relative REMOTE path is taken relative to each node's work_dir.
        """
        from orchestrator.executors.base import get_verified

        name = Path(remote).name
        with fleet(inventory, nodes, providers, "get", accept_new_host_keys) as f:
            group = f.fanout(lambda ex: get_verified(ex, remote, dest / ex.node.name / name))
        for n, digest in group.results.items():
            out.print(f"{n}: {dest / n / name} sha256 {digest} verified")
        report_failures(group)
        return 0 if group.ok else 1
