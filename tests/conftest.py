"""Settings for the whole test session, with or without pytest-xdist (`make test` runs
the suite on several workers).

xdist's workers are started from the controller's C-level environment, which is not
always what Python sees as ``os.environ``: GNU readline (imported by pytest through
pdb) sets COLUMNS and LINES there when it initialises. A worker would then render
the CLI's tables 80 columns wide where a plain pytest run renders them 160 wide
(orchestrator/cli/_common.py). Each worker gets the controller's own values back.

A shell that starts the suite in the background (``make test &`` without job control)
ignores SIGINT in it, and ignored signals are inherited: the CLI children of the
Ctrl-C tests (tests/faults/test_signals.py) would then never see their SIGINT. The
session puts Python's default handler back, so its children start with SIGINT live.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

TERMINAL_VARS = ("COLUMNS", "LINES")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist, on the controller: hand each worker the terminal variables as Python sees them."""
    node.workerinput["gpuvet_terminal_env"] = {k: os.environ.get(k) for k in TERMINAL_VARS}


def pytest_configure(config: pytest.Config) -> None:
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    env = getattr(config, "workerinput", {}).get("gpuvet_terminal_env")
    if env is None:  # not an xdist worker
        return
    for key, value in env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
