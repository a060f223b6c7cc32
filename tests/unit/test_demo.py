"""`make demo` as make would run it (`make -n`): what it promises, it does.

It ends with a comparison and a report that gpuvet accepts: both providers are
measured by one pipeline run, so under one suite (the H200 capture it once
announced as a comparison was refused: another suite); that suite has the
training step; every gpuvet line parses; its last line names the next command,
and that command's file exists. The demo itself takes minutes (it trains), so
it is timed by hand (docs/benchmarks.md), not run here.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from orchestrator import inventory
from tests.unit.test_docs_commands import parse

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


@functools.lru_cache(maxsize=1)
def demo_lines() -> list[str]:
    # under `make test` the environment carries make's own variables (MAKELEVEL, MAKEFLAGS):
    # a nested make would then print its "Entering/Leaving directory" lines
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    res = subprocess.run(["make", "--no-print-directory", "-n", "-W", "pyproject.toml", "demo"],
                         cwd=ROOT, capture_output=True, text=True, timeout=30, env=env)
    assert res.returncode == 0, res.stderr
    return res.stdout.replace("\\\n", " ").splitlines()


def gpuvet_calls(lines: list[str]) -> list[list[str]]:
    calls = []
    for line in lines:
        words = shlex.split(line.split("||")[0])
        while words and re.match(r"^[A-Z_]+=", words[0]):  # PATH=... before the command
            words.pop(0)
        if words and words[0].endswith("/gpuvet"):
            calls.append(words[1:])
    return calls


def option(args: list[str], *names: str) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a in names]


def test_demo_compares_two_providers_of_one_pipeline_run_and_trains() -> None:
    calls = gpuvet_calls(demo_lines())
    for args in calls:
        parse(args)
    steps = [a[0] for a in calls]
    assert "pipeline" in steps and "compare" in steps and "report" in steps
    pipe = calls[steps.index("pipeline")]
    assert steps.index("pipeline") < steps.index("compare") < steps.index("report")
    inv = inventory.load(ROOT / option(pipe, "-i")[0])
    suite = YAML(typ="safe").load((ROOT / option(pipe, "--suite")[0]).read_text())
    assert suite.get("train"), "the demo's suite runs the training step"
    for step in ("compare", "report"):
        args = calls[steps.index(step)]
        provs = option(args, "-p")
        assert len(provs) == 2 and set(provs) == set(inv.providers), (step, provs)
        assert not option(args, "--runs"), "each provider's latest runs: the pipeline's"


def test_demo_ends_naming_the_next_command() -> None:
    last = demo_lines()[-1]
    assert last.startswith("echo ")
    m = re.search(r"(cp (\S+) \S+)\"?$", last)
    assert m, last
    assert (ROOT / m.group(2)).is_file()
