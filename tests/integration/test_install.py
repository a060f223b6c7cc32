"""`pip install .` into a fresh venv, without extras, gives a working gpuvet.

Working means every README command, the answer included: `report` (jinja2,
matplotlib) and `export --format parquet` (pyarrow) run on imported logs in the
venv that holds gpuvet's declared dependencies alone, as `make demo` builds it
(`pip install torch -e .`; torch is for the demo's training nodes, not these).

This is how the missing `click` was found: it only ever arrived through ray.
The wheel is built from the working tree and installed with its declared
dependencies alone; nothing from the development venv leaks in. The fresh venv
gets no pip of its own: the development venv's pip installs into it
(`pip --python`), without byte-compiling the dependencies (the CLI runs below
compile what they import), which saves most of the test's time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


def _run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    return subprocess.run(argv, capture_output=True, text=True, timeout=900, env=env,
                          **kw)  # type: ignore[call-overload]


def test_wheel_in_a_fresh_venv_runs(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                  "-q", "-w", str(wheels), str(ROOT)])
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = wheels.glob("gpuvet-*.whl")
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    inst = _run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q",
                 "--no-compile", str(wheel)])
    assert inst.returncode == 0, inst.stderr[-2000:]
    gpuvet = env_dir / "bin" / "gpuvet"
    # nothing the CLI imports may come from an undeclared package
    for argv, expect in ((["--help"], "preflight"),
                         (["inventory", "check", str(ROOT / "inventories" / "local.yaml")],
                          "sim-a"),
                         (["parse", "--list"], "nccl-tests"),
                         (["--version"], "gpuvet")):
        res = _run([str(gpuvet), *argv], cwd=tmp_path)
        assert res.returncode == 0, (argv, res.stdout, res.stderr)
        assert expect in res.stdout, (argv, res.stdout)
    bad = _run([str(gpuvet), "prefligt"], cwd=tmp_path)
    assert bad.returncode == 2 and "did you mean 'preflight'" in bad.stderr
    # the answer: report and Parquet export on logs imported without an inventory
    results = tmp_path / "results"
    logs = sorted((ROOT / "tests" / "fixtures" / "h200x2" / "nccl-tests").glob(
        "all_reduce_8B-128M_g2_round*.log"))
    imp = _run([str(gpuvet), "import", "nccl-tests", "-p", "lab", "--results", str(results),
                *map(str, logs)], cwd=tmp_path)
    assert imp.returncode == 0, (imp.stdout, imp.stderr)
    rep = _run([str(gpuvet), "report", "--results", str(results), "-o",
                str(tmp_path / "r.html")], cwd=tmp_path)
    assert rep.returncode == 0, (rep.stdout, rep.stderr)
    assert "<svg" in (tmp_path / "r.html").read_text()  # the plots were drawn
    run_id = json.loads(_run([str(gpuvet), "runs", "--results", str(results), "--json"],
                             cwd=tmp_path).stdout)[0]["run"]
    exp = _run([str(gpuvet), "export", "--results", str(results), run_id, "--format",
                "parquet", "-o", str(tmp_path / "x.parquet")], cwd=tmp_path)
    assert exp.returncode == 0, (exp.stdout, exp.stderr)
    import pandas as pd

    ms = pd.read_parquet(tmp_path / "x.measurements.parquet")
    assert {"metric", "value", "size"} <= set(ms.columns) and len(ms) > 0
