"""Run the gpuvet CLI in-process, capturing what it prints (faster than a subprocess)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator.cli import run


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def gpuvet(capsys: pytest.CaptureFixture[str], *args: str | Path) -> CliResult:
    capsys.readouterr()
    rc = run([str(a) for a in args])
    captured = capsys.readouterr()
    return CliResult(int(rc), captured.out, captured.err)
