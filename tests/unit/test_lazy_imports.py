"""The controller works over SSH without torch, ray or pandas imported."""

import subprocess
import sys

HEAVY = ("torch", "ray", "pandas")


def test_cli_and_steps_import_no_heavy_packages() -> None:
    code = (
        "import sys\n"
        "import orchestrator.cli, orchestrator.steps.preflight.step\n"
        "orchestrator.cli.build()\n"
        "import orchestrator.steps.nccl.step, orchestrator.executors.ssh, orchestrator.parsers\n"
        "orchestrator.parsers.kinds()\n"
        f"print([m for m in {HEAVY!r} if m in sys.modules])\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"


def test_help_runs_without_heavy_packages() -> None:
    code = (
        "import sys, runpy\n"
        "sys.argv = ['gpuvet', 'ping', '--help']\n"
        "try:\n"
        "    runpy.run_module('orchestrator', run_name='__main__')\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print('HEAVY', [m for m in {HEAVY!r} if m in sys.modules])\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert "HEAVY []" in res.stdout, res.stdout + res.stderr
