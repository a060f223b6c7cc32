"""The `gpuvet` command: parse arguments, call the library, map errors to exit codes.

Exit codes: 0 all good, 1 something failed on a node (or a check FAILed),
2 bad input (arguments, inventory, files), 3 an internal error.
Tracebacks only with --debug.
"""

from __future__ import annotations

import json
import shlex
import sys
import traceback
from pathlib import Path
from typing import Annotated, Any

import click
import typer
from rich.table import Table

from orchestrator import __version__
from orchestrator import inventory as inv_mod
from orchestrator.cliopts import (
    AcceptOpt,
    InventoryOpt,
    NodeOpt,
    ProviderOpt,
    err,
    out,
    progress,
)
from orchestrator.errors import GpuvetError, UsageError
from orchestrator.executors import ExecutorPool, GroupResult, fanout, options_for, probe
from orchestrator.executors.base import get_verified, put_verified

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="Vet rented GPU nodes before a long job, and compare GPU platforms "
                       "fairly.")
inventory_app = typer.Typer(no_args_is_help=True, help="Inventory files: check and show.")
app.add_typer(inventory_app, name="inventory")

_state: dict[str, Any] = {"debug": False}


def _version(value: bool) -> None:
    if value:
        out.print(f"gpuvet {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors.")] = False,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    _state["debug"] = debug


def _load(path: Path) -> inv_mod.Inventory:
    return inv_mod.load(path)


def _report_failures(group: GroupResult[Any]) -> None:
    for name, exc in group.failures.items():
        err.print(f"[red]FAILED[/red] {name}: {exc.what if isinstance(exc, GpuvetError) else exc}",
                  markup=True)
        if isinstance(exc, GpuvetError) and exc.hint:
            err.print(f"  what to do: {exc.hint}")


# --- inventory ------------------------------------------------------------------

@inventory_app.command("check")
def inventory_check(file: Annotated[Path, typer.Argument(help="Inventory YAML file.")]) -> int:
    """Validate an inventory and print it as a table (or every problem, with line numbers)."""
    inv = _load(file)
    table = Table(title=f"{file} — {len(inv.providers)} provider(s), {len(inv.nodes)} node(s)")
    for col in ("provider", "node", "executor", "target", "python", "work dir", "ordered",
                "price/GPU-h"):
        table.add_column(col)
    for node in inv.nodes:
        prov = inv.provider_of(node)
        e = prov.expect
        ordered = " ".join(str(x) for x in (
            f"{e.gpus_per_node}x" if e.gpus_per_node else None, e.gpu_model,
            f"{e.memory_per_gpu_gb:g}GB" if e.memory_per_gpu_gb else None, e.form_factor,
            e.interconnect, e.fabric.type if e.fabric.type != "none" else None) if x)
        price = (f"{prov.pricing.gpu_hour:g} {prov.pricing.currency}" if prov.pricing else "-")
        target = node.target if node.executor == "ssh" else node.executor
        if node.proxy_jump:
            target += f" via {node.proxy_jump}"
        table.add_row(node.provider, node.name, node.executor, target, node.python,
                      node.work_dir, ordered or "-", price)
    out.print(table)
    return 0


# --- ping -----------------------------------------------------------------------

@app.command()
def ping(inventory: InventoryOpt, node: NodeOpt = None, provider: ProviderOpt = None,
         accept_new_host_keys: AcceptOpt = False) -> int:
    """Connect to every node: hostname seen, latency, host key status, python version."""
    inv = _load(inventory)
    nodes = inv.select(node, provider)
    with ExecutorPool(options_for(inv, accept_new_host_keys)) as pool, \
            progress("ping", len(nodes)) as hook:
        group = fanout(nodes, lambda n: probe(pool(n)), concurrency=inv.settings.concurrency,
                       progress=hook)
    table = Table(title="ping")
    for col in ("node", "provider", "hostname", "latency ms", "host key", "python", "error"):
        table.add_column(col)
    for n in nodes:
        if n.name in group.results:
            r = group.results[n.name]
            table.add_row(n.name, n.provider, r.hostname, f"{r.latency_ms:.1f}", r.host_key,
                          r.python_version or "missing", "")
        else:
            exc = group.failures[n.name]
            what = exc.what if isinstance(exc, GpuvetError) else str(exc)
            table.add_row(n.name, n.provider, "-", "-", "-", "-", what)
    out.print(table)
    _report_failures(group)
    return 0 if group.ok else 1


# --- exec / put / get -----------------------------------------------------------

@app.command("exec", context_settings={"allow_interspersed_args": False})
def exec_(inventory: InventoryOpt,
          command: Annotated[list[str], typer.Argument(help="Command and arguments.")],
          node: NodeOpt = None, provider: ProviderOpt = None,
          timeout: Annotated[float, typer.Option(help="Seconds before the command's process "
                                                 "group is killed.")] = 600.0,
          accept_new_host_keys: AcceptOpt = False) -> int:
    """Run one command on every node in parallel and print each node's output."""
    inv = _load(inventory)
    nodes = inv.select(node, provider)
    cmd = command[0] if len(command) == 1 else shlex.join(command)
    with ExecutorPool(options_for(inv, accept_new_host_keys)) as pool, \
            progress("exec", len(nodes)) as hook:
        group = fanout(nodes, lambda n: pool(n).run(cmd, timeout=timeout),
                       concurrency=inv.settings.concurrency, progress=hook)
    bad = False
    for name, res in group.results.items():
        status = ("timed out" if res.timed_out else f"rc={res.rc}")
        out.print(f"--- {name} ({status}, {res.duration_s:.2f} s)")
        if res.stdout:
            out.print(res.stdout.rstrip("\n"), markup=False)
        if res.stderr:
            err.print(f"[{name} stderr] " + res.stderr.rstrip("\n"), markup=False)
        bad |= not res.ok
    _report_failures(group)
    return 0 if group.ok and not bad else 1


@app.command()
def put(inventory: InventoryOpt,
        local: Annotated[Path, typer.Argument(help="Local file.")],
        remote: Annotated[str, typer.Argument(help="Path on the nodes.")],
        node: NodeOpt = None, provider: ProviderOpt = None,
        accept_new_host_keys: AcceptOpt = False) -> int:
    """Copy a file to every node and verify its sha256 there."""
    if not local.is_file():
        raise UsageError(f"no such file: {local}")
    inv = _load(inventory)
    nodes = inv.select(node, provider)
    with ExecutorPool(options_for(inv, accept_new_host_keys)) as pool, \
            progress("put", len(nodes)) as hook:
        group = fanout(nodes, lambda n: put_verified(pool(n), local, remote),
                       concurrency=inv.settings.concurrency, progress=hook)
    for name, digest in group.results.items():
        out.print(f"{name}: {remote} sha256 {digest} verified")
    _report_failures(group)
    return 0 if group.ok else 1


@app.command()
def get(inventory: InventoryOpt,
        remote: Annotated[str, typer.Argument(help="Path on the nodes.")],
        dest: Annotated[Path, typer.Argument(help="Local folder; each node's copy lands in "
                                             "DEST/<node>/.")],
        node: NodeOpt = None, provider: ProviderOpt = None,
        accept_new_host_keys: AcceptOpt = False) -> int:
    """Copy a file from every node into DEST/<node>/ and verify its sha256."""
    inv = _load(inventory)
    nodes = inv.select(node, provider)
    name = Path(remote).name
    with ExecutorPool(options_for(inv, accept_new_host_keys)) as pool, \
            progress("get", len(nodes)) as hook:
        group = fanout(nodes, lambda n: get_verified(pool(n), remote, dest / n.name / name),
                       concurrency=inv.settings.concurrency, progress=hook)
    for n, digest in group.results.items():
        out.print(f"{n}: {dest / n / name} sha256 {digest} verified")
    _report_failures(group)
    return 0 if group.ok else 1


# --- parse ----------------------------------------------------------------------

@app.command()
def parse(kind: Annotated[str | None, typer.Argument(help="Parser kind.")] = None,
          file: Annotated[Path | None, typer.Argument(help="Saved output to parse.")] = None,
          as_json: Annotated[bool, typer.Option("--json", help="Print facts as JSON.")] = False,
          list_: Annotated[bool, typer.Option("--list", help="List parser kinds.")] = False,
          ) -> int:
    """Run one parser on a saved command output and print the facts it finds."""
    from orchestrator import parsers

    if list_:
        for spec in parsers.kinds():
            out.print(f"{spec.kind:24} {spec.description}")
        return 0
    if kind is None or file is None:
        raise UsageError("parse needs KIND and FILE", hint="see `gpuvet parse --list`")
    if not file.is_file():
        raise UsageError(f"no such file: {file}")
    text = file.read_text(encoding="utf-8", errors="replace")
    facts = parsers.parse(kind, text, source=str(file))
    data = parsers.to_jsonable(facts)
    transports = _transports(text, str(file)) if kind == "nccl-tests" else None
    if as_json:
        if transports is not None:
            data = {**data, "transports": transports}
        out.print(json.dumps(data, indent=2), markup=False)
    else:
        from orchestrator.render import render_facts

        render_facts(out, kind, facts)
        if transports is not None:
            out.print(f"transports: {', '.join(transports['used']) or 'none seen'}; NCCL "
                      f"{transports['nccl_version'] or '?'}, {transports['n_ranks'] or '?'} "
                      f"rank(s) on {transports['n_nodes'] or '?'} node(s)"
                      + ("; GPUDirect RDMA" if transports["gdrdma"] else ""), markup=False)
    return 0


def _transports(text: str, source: str) -> dict[str, Any] | None:
    """What NCCL_DEBUG=INFO lines in an nccl-tests log say about the transports used."""
    from orchestrator import parsers
    from orchestrator.errors import ParseError

    try:
        dbg: Any = parsers.parse("nccl-debug", text, source=source)
    except ParseError:
        return None  # the log has no NCCL INFO lines
    used = sorted({f"{c.transport}/{c.net}" if c.net else c.transport for c in dbg.connections})
    return {"used": used, "nccl_version": dbg.nccl_version, "n_ranks": dbg.n_ranks,
            "n_nodes": dbg.n_nodes, "gdrdma": dbg.gdrdma, "networks": dbg.networks}


def _register_steps() -> None:
    """Step commands live beside their steps; registering them keeps this module thin."""
    from orchestrator.steps import commands

    commands.register(app)


def main(argv: list[str] | None = None) -> None:
    _register_steps()
    try:
        rv = app(args=argv, prog_name="gpuvet", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show(file=sys.stderr)
        sys.exit(2)
    except click.exceptions.Abort:
        err.print("interrupted")
        sys.exit(130)
    except GpuvetError as exc:
        if _state["debug"]:
            traceback.print_exc()
        err.print(f"error: {exc}", markup=False)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
    except Exception:
        if _state["debug"]:
            traceback.print_exc()
        else:
            exc_type, exc_val, _ = sys.exc_info()
            err.print(f"internal error: {exc_type.__name__ if exc_type else '?'}: {exc_val}\n"
                      "  rerun with --debug for the traceback and report it", markup=False)
        sys.exit(3)
    sys.exit(rv if isinstance(rv, int) else 0)
