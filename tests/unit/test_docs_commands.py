"""Every gpuvet command the README and docs/commands.md show is one gpuvet accepts.

Each line of their ```sh blocks that starts with `gpuvet` is split as a shell
would and parsed by gpuvet's own command line (click), group by group down to
the command, with every option and argument checked as it would be on a real
run (types, choices, callbacks), without running the command. A file of the
repository it names (an inventory, a suite, a fixture) must exist. The quick
start itself runs against real sshd nodes in tests/integration/test_quickstart.py.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from orchestrator.cli import build

ROOT = Path(__file__).resolve().parents[2]
PAGES = ("README.md", "docs/commands.md")
REPO_PATH = re.compile(r"^(inventories|suites|tests/fixtures|scripts)/")


def shown_commands(page: str) -> list[list[str]]:
    text = (ROOT / page).read_text()
    lines: list[list[str]] = []
    for block in re.findall(r"^```sh\n(.*?)^```", text, re.S | re.M):
        for line in block.splitlines():
            words = shlex.split(line, comments=True)
            if words[:1] == ["gpuvet"]:
                lines.append(words[1:])
    return lines


def parse(args: list[str]) -> click.Command:
    """Resolve and parse `gpuvet ARGS` as the command line would; return the command."""
    cmd: click.Command = build()
    name = "gpuvet"
    while True:
        ctx = cmd.make_context(name, list(args), resilient_parsing=False)
        if not isinstance(cmd, click.Group):
            return cmd
        rest = [*ctx._protected_args, *ctx.args]
        sub_name, sub, args = cmd.resolve_command(ctx, rest)
        assert sub is not None and sub_name is not None, rest
        cmd, name = sub, f"{name} {sub_name}"


@pytest.mark.parametrize("page", PAGES)
def test_every_command_shown_parses_as_written(page: str) -> None:
    commands = shown_commands(page)
    assert commands, f"{page} shows no gpuvet command"
    for args in commands:
        try:
            parse(args)
        except click.ClickException as exc:
            pytest.fail(f"{page}: `gpuvet {shlex.join(args)}`: {exc.format_message()}")
        for word in args:
            if REPO_PATH.match(word):
                assert (ROOT / word).exists(), f"{page}: `gpuvet {shlex.join(args)}`: no {word}"


def test_every_command_has_an_example_in_docs_commands() -> None:
    """docs/commands.md is the reference: each command of `gpuvet --help` has a line there."""
    shown = {" ".join(a[:2]) if a[0] in GROUPS else a[0]
             for a in shown_commands("docs/commands.md")}
    root = build()
    ctx = click.Context(root)
    every = set()
    for name in root.list_commands(ctx):
        cmd = root.get_command(ctx, name)
        if isinstance(cmd, click.Group):
            every |= {f"{name} {sub}" for sub in cmd.list_commands(ctx)}
        else:
            every.add(name)
    assert every - shown == set()


GROUPS = ("inventory", "import", "baseline", "schedule", "index", "slurm")


def test_a_wrong_command_line_is_caught() -> None:
    """The check itself can fail: the command line as the README wrote it before `--runs`
    took several values, a flag gpuvet does not have, a misspelt command."""
    parse(["compare", "--runs", "A", "B", "C"])
    for bad in (["ping", "-i", "x.yaml", "--accept-new-keys"], ["comapre", "-p", "a"],
                ["schedule", "print", "--every"]):
        with pytest.raises(click.ClickException):
            parse(bad)


def test_the_quick_start_of_gpuvet_help_parses_and_is_the_readme_s() -> None:
    epilog = build().epilog or ""
    shown = [shlex.split(line)[1:] for line in epilog.splitlines()
             if line.strip().startswith("gpuvet ")]
    assert len(shown) == 5
    for args in shown:
        parse(args)
    readme = [a for a in shown_commands("README.md") if a[0] in ("inventory", "ping", "pipeline")]
    assert readme == shown[:3]
