"""What every command shares: exit codes, options, consoles, the fleet opening, rendering."""

from __future__ import annotations

import contextlib
import difflib
import enum
import errno
import json
import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table as RichTable
from rich.text import Text

from orchestrator.errors import GpuvetError, StoreError, UsageError, shown
from orchestrator.render import scrubbed, terminal_text
from orchestrator.verdicts import Table

if TYPE_CHECKING:  # keep `gpuvet --help` free of the executors' imports
    from orchestrator.executors import ExecutorPool, GroupResult
    from orchestrator.executors.base import Executor, ProgressHook
    from orchestrator.inventory import Inventory, Node


class ExitCode(enum.IntEnum):
    OK = 0
    FAILED = 1  # a node or a check FAILed (regress: a regression)
    USAGE = 2  # bad input: arguments, inventory, files
    INTERNAL = 3  # gpuvet's own failure (a bug, the results disk)
    NOTHING_CHECKED = 4  # nodecheck: no NVIDIA driver and no NVIDIA GPU on this node
    INTERRUPTED = 130  # SIGINT
    TERMINATED = 143  # SIGTERM


# Piped output (logs, CI) gets wide tables instead of rich's 80-column default.
_WIDTH = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160


class SafeConsole(Console):
    """A console that shows text, never obeys it: every string and Text printed goes
    through `render.terminal_text` (an ESC from an inventory value, a PoC file name or a
    node's output is shown as `\\x1b`). Tables are built of escaped cells (`render`)."""

    def print(self, *objects: Any, **kwargs: Any) -> None:  # noqa: A003 - rich's name
        super().print(*(_inert(o) for o in objects), **kwargs)


def _inert(obj: Any) -> Any:
    if isinstance(obj, str):
        return terminal_text(obj)
    if isinstance(obj, Text) and terminal_text(obj.plain) != obj.plain:
        return Text(terminal_text(obj.plain), style=obj.style)  # its spans would not fit
    return obj


# markup and emoji codes off: values from inventories and nodes ("/data/[x]/y",
# "node:a: done") are text, never markup or emoji
out = SafeConsole(highlight=False, soft_wrap=True, width=_WIDTH, markup=False, emoji=False)
err = SafeConsole(stderr=True, highlight=False, soft_wrap=True, markup=False, emoji=False)
STYLE = {"PASS": "green", "INFO": "cyan", "WARN": "yellow", "FAIL": "bold red",
         "REGRESSED": "bold red", "IMPROVED": "green", "UNCHANGED": "green",
         "NOT ENOUGH DATA": "yellow", "GO": "green", "NO-GO": "bold red"}


class State:
    debug = False


# --- click classes: --debug everywhere, "did you mean" for commands ------------------------

def _set_debug(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        State.debug = True


def debug_option() -> click.Option:
    return click.Option(["--debug"], is_flag=True, expose_value=False, is_eager=True,
                        envvar="GPUVET_DEBUG", callback=_set_debug,
                        help="Show tracebacks on errors (env GPUVET_DEBUG=1).")


class Command(click.Command):
    """Every command takes --debug, wherever it is placed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.params.append(debug_option())


class Group(click.Group):
    command_class = Command

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("no_args_is_help", True)
        super().__init__(*args, **kwargs)
        self.params.append(debug_option())

    def resolve_command(self, ctx: click.Context,
                        args: list[str]) -> tuple[str | None, click.Command | None, list[str]]:
        name = args[0] if args else ""
        if name and not name.startswith("-") and self.get_command(ctx, name) is None:
            close = difflib.get_close_matches(name, self.list_commands(ctx), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise click.UsageError(f"no such command {name!r}{hint}", ctx)
        return super().resolve_command(ctx, args)


Group.group_class = Group


class ManyValues(click.Option):
    """An option of one or more values: `--runs A B C` as well as `--runs A --runs B`.
    The words after it, up to the next option (or `--`), are its values."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["multiple"] = True
        super().__init__(*args, **kwargs)

    def add_to_parser(self, parser: Any, ctx: click.Context) -> None:
        super().add_to_parser(parser, ctx)
        # click's parser takes one value per occurrence; its option objects are reached
        # through the parser's tables (click 8), and each gets the words that follow it
        for name in self.opts:
            opt = parser._long_opt.get(name) or parser._short_opt.get(name)
            if opt is None:
                continue
            one = opt.process

            def process(value: Any, state: Any, one: Callable[[Any, Any], None] = one) -> None:
                one(value, state)
                while state.rargs and not state.rargs[0].startswith("-"):
                    one(state.rargs.pop(0), state)

            opt.process = process

F = TypeVar("F", bound=Callable[..., Any])


# --- options shared by commands -------------------------------------------------------------

def fleet_options(f: F) -> F:
    """-i/-n/-p/--accept-new-host-keys: which nodes, of which inventory."""
    f = click.option("--accept-new-host-keys", is_flag=True,
                     help="Trust host keys seen for the first time and record them in "
                          "known_hosts (like OpenSSH accept-new). A changed key is always "
                          "refused.")(f)
    f = click.option("-p", "--provider", "providers", multiple=True, metavar="NAME",
                     help="Only nodes of this provider (repeatable; with -n: both must match).")(f)
    f = click.option("-n", "--node", "nodes", multiple=True, metavar="NAME",
                     help="Only this node (repeatable).")(f)
    return inventory_option(f)


def inventory_option(f: F) -> F:
    return click.option("-i", "--inventory", required=True, envvar="GPUVET_INVENTORY",
                        type=click.Path(path_type=Path, dir_okay=False),
                        help="Inventory YAML file (env GPUVET_INVENTORY).")(f)


def results_option(f: F) -> F:
    return click.option("--results", type=click.Path(path_type=Path, file_okay=False),
                        default=Path("results"), envvar="GPUVET_RESULTS", show_default=True,
                        help="Results root folder (env GPUVET_RESULTS).")(f)


def suite_option(f: F) -> F:
    return click.option("--suite", type=click.Path(path_type=Path, dir_okay=False),
                        envvar="GPUVET_SUITE",
                        help="Suite YAML (every parameter of a run); default: the built-in "
                             "suite (env GPUVET_SUITE).")(f)


def json_option(f: F) -> F:
    return click.option("--json", "as_json", is_flag=True,
                        help="Print the result as JSON on stdout, for scripts.")(f)


def verbose_option(f: F) -> F:
    return click.option("-v", "--verbose", is_flag=True,
                        help="Show PASS and INFO findings too.")(f)


# --- the fleet: inventory, selection, pool, progress ---------------------------------------

@dataclass
class Fleet:
    inv: Inventory
    nodes: list[Node]
    pool: ExecutorPool
    progress: ProgressHook
    accept_new_host_keys: bool

    def fanout(self, fn: Callable[[Executor], Any]) -> GroupResult[Any]:
        from orchestrator.executors import fanout

        return fanout(self.nodes, lambda n: fn(self.pool(n)),
                      concurrency=self.inv.settings.concurrency, progress=self.progress)


@contextlib.contextmanager
def fleet(inventory: Path, nodes: Sequence[str], providers: Sequence[str], label: str,
          accept_new_host_keys: bool = False) -> Iterator[Fleet]:
    """The opening every fleet command shares: load, select, connect lazily, show progress."""
    from orchestrator import inventory as inv_mod
    from orchestrator.executors import ExecutorPool, options_for
    from orchestrator.executors.slurm import allocations

    loaded = inv_mod.load(inventory)
    options = options_for(loaded, accept_new_host_keys)
    # executor slurm providers: their nodes come from an allocation, released on the way
    # out however the command ends (one named in the inventory is never released)
    with allocations(loaded, options, list(providers) or None,
                     warn=lambda text: err.print(f"warning: {text}")) as inv:
        selected = inv.select(list(nodes) or None, list(providers) or None)
        options.nodes = {n.name: n for n in inv.nodes}
        with ExecutorPool(options) as pool, progress(label, len(selected)) as hook:
            yield Fleet(inv, selected, pool, hook, accept_new_host_keys)


@contextlib.contextmanager
def progress(label: str, total: int) -> Iterator[ProgressHook]:
    """A live progress bar on stderr; plain lines when stderr is not a terminal.

    It counts nodes until a step queues its units (a node's, a provider's multi-node
    run), then units: the steps of a pipeline, and a step's multi-node units after its
    single-node ones, each add to the total as they are queued. Any state other than
    queued/start/done/failed is a note on what a unit is doing now (a training phase).
    """
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), TextColumn("{task.fields[last]}"), console=err,
                   transient=True)
    task = bar.add_task(label, total=total, last="")
    if not err.is_terminal:
        err.print(f"{label}: {total} node(s)")
    def show(c: ProgressCount, last: str | None) -> None:
        bar.update(task, total=c.total, completed=c.done)
        if last:
            bar.update(task, last=last)

    with bar:
        yield ProgressCount(total, show)


class ProgressCount:
    """The progress hook's state: nodes, then units once one is queued."""

    def __init__(self, total: int, show: Callable[[ProgressCount, str | None], None]) -> None:
        self.total, self.done, self.units = total, 0, False
        self._show = show
        self._lock = threading.Lock()

    def __call__(self, node: str, state: str) -> None:
        with self._lock:
            if state == "queued":
                if not self.units:  # from now on the bar counts units, not nodes
                    self.total = self.done = 0
                    self.units = True
                self.total += 1
            elif state in ("done", "failed"):
                self.done += 1
            shown = state not in ("queued", "start")
            self._show(self, f"{node} {state}" if shown else None)
        if shown and not err.is_terminal:
            err.print(f"  {node}: {state}")


def report_failures(group: GroupResult[Any]) -> None:
    for name, exc in group.failures.items():
        err.print(Text.assemble(("FAILED", "red"), f" {name}: {exc.what}"))
        if exc.hint:
            err.print(f"  what to do: {exc.hint}")


# --- rendering --------------------------------------------------------------------------------

def render(table: Table) -> None:
    """A verdicts.Table on the terminal; cells are text, never markup."""
    rt = RichTable(title=terminal_text(table.title), title_justify="left")
    for c in table.columns:
        rt.add_column(c, overflow="fold")
    styled = {i for i, c in enumerate(table.columns) if c in ("severity", "verdict", "status")}
    for row in table.rows:
        cells = []
        for i, v in enumerate(row):
            text = "-" if v is None else f"{v:g}" if isinstance(v, float) else terminal_text(
                str(v))
            cells.append(Text(text, style=STYLE.get(text, "") if i in styled else ""))
        rt.add_row(*cells)
    out.print(rt)


def emit_json(obj: Any) -> None:
    """JSON on stdout as it is: written straight to the stream, not laid out by rich (a
    document of 10,000 parsed rows took rich 15 s). Every string in it is scrubbed
    (`payload.scrub.scrub_text`: a file name or a quoted line holding a token)."""
    out.file.write(json.dumps(scrubbed(obj), indent=2, default=str, sort_keys=False) + "\n")
    out.file.flush()


def fail(exc: GpuvetError) -> int:
    """Print a library error the one way every command does; returns its exit code."""
    err.print(f"error: {exc}")
    return exc.exit_code


W = TypeVar("W")


def output_written(write: Callable[[], W], output: Path) -> W:
    """Write to the -o a user named: a place that cannot be written is their input (exit 2,
    one line), not the results disk (exit 3) nor an internal error."""
    try:
        return write()
    except StoreError as exc:
        what = "no space left on its filesystem" if exc.full else exc.what
        raise UsageError(f"-o {shown(str(output))}: {what}",
                         hint="choose another -o (a writable folder with free space)") from None
    except OSError as exc:
        # pyarrow raises OSError without a file name nor an errno (the reason in its text)
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT) or "No space left" in str(exc)
        what = ("no space left on its filesystem" if full else
                f"cannot write {shown(str(exc.filename or output))}: {exc.strerror or exc}")
        raise UsageError(f"-o {shown(str(output))}: {what}",
                         hint="choose another -o (a writable folder with free space)") from None
