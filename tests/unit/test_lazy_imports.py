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


def test_local_nodes_never_load_the_ssh_or_ray_backends() -> None:
    """Backends load when a node first uses them (the executor registry names them as
    "module:Class"): a host without fabric/paramiko (a GPU image) runs local nodes."""
    code = (
        "import sys\n"
        "from orchestrator import inventory\n"
        "from orchestrator.executors import make_executor, options_for\n"
        "inv = inventory.load('inventories/local.yaml')\n"
        "ex = make_executor(inv.nodes[0], options_for(inv))\n"
        "print(type(ex).__name__, [m for m in ('fabric', 'paramiko', 'invoke', 'ray')"
        " if m in sys.modules])\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "LocalExecutor []"


def test_the_pipeline_loads_the_verdicts_statistics_only_when_asked() -> None:
    """scipy.stats and ruptures (2-4 s of imports) are not loaded with the pipeline: it
    preloads them on a thread while the training step runs (regress.preload)."""
    code = (
        "import sys\n"
        "import orchestrator.pipeline, orchestrator.cli.pipeline\n"
        "late = ('scipy.stats', 'ruptures')\n"
        "print([m for m in late if m in sys.modules])\n"
        "from orchestrator.analysis import regress\n"
        "regress.preload()\n"
        "print([m for m in late if m in sys.modules])\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split("\n")[:2] == ["[]", "['scipy.stats', 'ruptures']"]
