"""Every command-line mistake: exit 2, one clear line and the usage hint, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.clirun import gpuvet

ROOT = Path(__file__).resolve().parents[2]
INV = str(ROOT / "inventories" / "local.yaml")
LOG = str(ROOT / "tests/fixtures/h200x2/nccl-tests/all_reduce_8B-128M_g2_round1.log")


@pytest.mark.parametrize(("argv", "says"), [
    ([], "missing command"),
    (["prefligt"], "did you mean 'preflight'"),
    (["frobnicate"], "no such command 'frobnicate'"),
    (["inventory"], "needs a command (check)"),
    (["import"], "needs a command (nccl-tests, poc)"),
    (["ping"], "Missing option '-i'"),
    (["inventory", "check"], "Missing argument 'FILE'"),
    (["ping", "-i", INV, "--bogus"], "No such option '--bogus'"),
    (["inventory", "check", INV, "extra"], "unexpected extra argument (extra)"),
    (["import", "nccl-tests", LOG], "Missing option '-p'"),
    (["exec", "-i", INV], "Missing argument 'COMMAND...'"),
    (["nccl", "-i", INV, "--ring-onyl"], "'--ring-only'"),  # among click's suggestions
])
def test_usage_mistakes_exit_2_with_one_line_and_a_hint(capsys: pytest.CaptureFixture[str],
                                                         argv: list[str], says: str) -> None:
    res = gpuvet(capsys, *argv)
    assert res.returncode == 2, res.output
    assert says in res.stderr, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 2, lines  # what is wrong, and where to read more
    assert lines[1].startswith("usage: gpuvet")
    assert "Traceback" not in res.output and "internal error" not in res.output


def test_debug_is_accepted_after_the_subcommand(capsys: pytest.CaptureFixture[str],
                                                tmp_path: Path) -> None:
    before = gpuvet(capsys, "--debug", "inventory", "check", INV)
    after = gpuvet(capsys, "inventory", "check", INV, "--debug")
    assert before.returncode == after.returncode == 0
    assert "sim-a" in after.stdout
    missing = gpuvet(capsys, "inventory", "check", str(tmp_path / "nope.yaml"), "--debug")
    assert missing.returncode == 2
    assert "Traceback" in missing.stderr  # --debug shows where a bad-input error came from


def test_results_takes_the_environment(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUVET_RESULTS", str(tmp_path / "from-env"))
    res = gpuvet(capsys, "import", "nccl-tests", LOG, "-p", "lab")
    assert res.returncode == 0, res.output
    assert [p.name for p in (tmp_path / "from-env").iterdir() if p.is_dir()]


def test_version_and_help_exit_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert gpuvet(capsys, "--version").returncode == 0
    res = gpuvet(capsys, "--help")
    assert res.returncode == 0 and "preflight" in res.stdout
    assert gpuvet(capsys, "nccl", "--help").returncode == 0


def test_values_with_brackets_are_not_markup(capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text("version: 1\nproviders:\n  p:\n    executor: local\n    nodes:\n"
                   "      - {name: n1, work_dir: '/data/[x]/y', python: '[bold]py'}\n")
    res = gpuvet(capsys, "inventory", "check", str(inv))
    assert res.returncode == 0, res.output
    assert "/data/[x]/y" in res.stdout and "[bold]py" in res.stdout
