"""The `gpuvet` command.

Each command group is a module of this package with a `register(root)`
function, listed once in `GROUPS` (as pytest lists its default plugins); a
module imports what its commands need inside them, so `gpuvet --help` stays
fast. `run(argv)` does the work and returns the exit code; `main()` only
exits with it. Every error and usage mistake is mapped to an `ExitCode` here
and nowhere else: 0 all good, 1 something FAILed, 2 bad input, 3 gpuvet's own
failure, 4 nothing to check (`gpuvet nodecheck` on a node without NVIDIA driver or
GPU), 130/143 interrupted. Tracebacks only with --debug.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import traceback
from collections.abc import Sequence
from typing import Any

import click

from orchestrator import __version__
from orchestrator.cli._common import ExitCode, Group, State, err
from orchestrator.errors import GpuvetError, Terminated
from orchestrator.files import set_warn_sink

GROUPS = (
    "orchestrator.cli.inventory",
    "orchestrator.cli.nodes",
    "orchestrator.cli.preflight",
    "orchestrator.cli.health",
    "orchestrator.cli.nccl",
    "orchestrator.cli.fleet",
    "orchestrator.cli.parse",
    "orchestrator.cli.index",
    "orchestrator.cli.runs",
    "orchestrator.cli.history",
    "orchestrator.cli.claim",
    "orchestrator.cli.compare",
    "orchestrator.cli.regress",
    "orchestrator.cli.pipeline",
    "orchestrator.cli.train",
    "orchestrator.cli.nodecheck",
    "orchestrator.cli.slurm",
)


def build() -> click.Group:
    @click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]},
                 help="Vet rented GPU nodes before a long job, and compare GPU platforms fairly.",
                 epilog="\b\nOn your own nodes (the README's quick start):\n"
                        "  gpuvet inventory check my-nodes.yaml\n"
                        "  gpuvet ping -i my-nodes.yaml --accept-new-host-keys\n"
                        "  gpuvet pipeline -i my-nodes.yaml\n"
                        "  gpuvet compare -p A -p B\n"
                        "  gpuvet report -p A -p B -o report.html\n"
                        "Every command with an example: docs/commands.md; "
                        "gpuvet COMMAND --help.")
    @click.version_option(__version__, "--version", prog_name="gpuvet",
                          message="%(prog)s %(version)s")
    def root() -> None:
        pass

    for name in GROUPS:
        importlib.import_module(name).register(root)
    return root


def _usage_line(exc: click.UsageError) -> str:
    ctx = exc.ctx
    path = ctx.command_path if ctx else "gpuvet"
    return f"usage: {path} --help"


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated()


def run(argv: Sequence[str] | None = None) -> int:
    """Parse, run, map every outcome to an exit code. Never exits the process."""
    args = list(sys.argv[1:] if argv is None else argv)
    State.debug = False
    previous = None
    try:
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main thread (tests call run() from threads too)
        previous = None
    try:
        set_warn_sink(err.print)  # warnings too reach the terminal escaped
        root = build()
        if not args:
            err.print("gpuvet: missing command")
            err.print("usage: gpuvet COMMAND [OPTIONS]; see gpuvet --help for the commands")
            return ExitCode.USAGE
        rv = root.main(args=args, prog_name="gpuvet", standalone_mode=False)
        return int(rv) if isinstance(rv, int) else ExitCode.OK
    except click.exceptions.NoArgsIsHelpError as exc:
        # a group without its subcommand: name the subcommands in one line
        cmd = exc.ctx.command if exc.ctx else None
        subs = ", ".join(cmd.list_commands(exc.ctx)) if isinstance(cmd, click.Group) and exc.ctx \
            else ""
        err.print(f"gpuvet: {exc.ctx.command_path if exc.ctx else 'gpuvet'} needs a command"
                  + (f" ({subs})" if subs else ""))
        err.print(_usage_line(exc))
        return ExitCode.USAGE
    except click.UsageError as exc:
        err.print(f"gpuvet: {exc.format_message()}")
        err.print(_usage_line(exc))
        return ExitCode.USAGE
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.exceptions.Abort:
        err.print("interrupted")
        return ExitCode.INTERRUPTED
    except click.ClickException as exc:  # e.g. a file click could not open
        err.print(f"gpuvet: {exc.format_message()}")
        return ExitCode.USAGE
    except GpuvetError as exc:
        if State.debug:
            err.print(traceback.format_exc().rstrip("\n"))  # scrubbed, escaped
        err.print(f"error: {exc}")
        return exc.exit_code
    except KeyboardInterrupt:
        err.print("interrupted")
        return ExitCode.INTERRUPTED
    except Terminated:
        err.print("terminated")
        return ExitCode.TERMINATED
    except BrokenPipeError:
        # stdout closed (`| head`): nothing more can be shown; the run is already recorded
        _silence_stdout()
        return ExitCode.OK
    except Exception:
        if State.debug:
            err.print(traceback.format_exc().rstrip("\n"))  # scrubbed, escaped
        else:
            exc_type, exc_val, _ = sys.exc_info()
            err.print(f"internal error: {exc_type.__name__ if exc_type else '?'}: {exc_val}\n"
                      "  rerun with --debug for the traceback and report it")
        return ExitCode.INTERNAL
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except OSError:
        pass


def main() -> None:
    sys.exit(run())
