"""`gpuvet parse`: list the parsers, run one on a saved output, refuse bad input cleanly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from orchestrator import parsers
from orchestrator.errors import ParseError, UsageError

REPO = Path(__file__).resolve().parents[2]
GPUVET = Path(sys.executable).with_name("gpuvet")
TOPO = REPO / "tests/fixtures/h200x2/commands/topo-m.txt"
NCCL_LOG = REPO / "tests/fixtures/h200x2/nccl-tests/all_reduce_8B-128M_g2_round1.log"


def gpuvet(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(GPUVET), *map(str, args)], capture_output=True, text=True,
                          timeout=60, cwd=REPO, env={"PATH": "/usr/bin:/bin", "COLUMNS": "200"})


def test_list_names_every_registered_kind() -> None:
    r = gpuvet("parse", "--list")
    assert r.returncode == 0, r.stderr
    listed = {line.split()[0] for line in r.stdout.splitlines() if line.strip()}
    known = {spec.kind for spec in parsers.kinds()}
    assert listed == known
    assert {"topo-m", "nccl-tests", "nvidia-smi-query-gpu", "torch-info"} <= known
    line = next(x for x in r.stdout.splitlines() if x.startswith("topo-m "))
    assert "connection matrix" in line  # with its description


def test_topo_m_as_json() -> None:
    r = gpuvet("parse", "topo-m", TOPO.relative_to(REPO), "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["matrix"]["GPU0"]["GPU1"] == "NV18"
    assert [g["name"] for g in data["gpus"]] == ["GPU0", "GPU1"]
    assert data["gpus"][0]["cpu_affinity"] == "0-31"


def test_nccl_tests_log_prints_rows() -> None:
    r = gpuvet("parse", "nccl-tests", NCCL_LOG)
    assert r.returncode == 0, r.stderr
    assert "all_reduce_perf" in r.stdout and "2.28.9" in r.stdout
    assert "rows: (25)" in r.stdout  # 8 B .. 128 MiB, factor 2
    assert "size_bytes: 8\n" in r.stdout and "size_bytes: 134217728\n" in r.stdout
    j = gpuvet("parse", "nccl-tests", NCCL_LOG, "--json")
    assert j.returncode == 0, j.stderr
    rows = json.loads(j.stdout)["rows"]
    assert [row["size_bytes"] for row in rows] == [8 << i for i in range(25)]
    assert rows[-1]["out_of_place"]["busbw_gbs"] > 100  # NVLink on the H200 pair


def test_unknown_kind_exits_2_suggesting_the_nearest() -> None:
    r = gpuvet("parse", "topo-x", TOPO)
    assert r.returncode == 2
    assert "unknown parser kind 'topo-x' (did you mean 'topo-m'?)" in r.stderr
    assert "gpuvet parse --list` names all" in r.stderr
    assert "Traceback" not in r.stderr
    r = gpuvet("parse", "nccl-test", TOPO)
    assert r.returncode == 2
    assert r.stderr.splitlines()[0] == (
        "error: unknown parser kind 'nccl-test' (did you mean 'nccl-tests'?)")
    # nothing near: no guess, and the 41 kinds are left to --list, not dumped on the line
    r = gpuvet("parse", "zzz", TOPO)
    assert r.returncode == 2 and "did you mean" not in r.stderr
    assert "nvidia-smi-q-xml" not in r.stderr


def test_garbage_exits_2_with_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "topo.txt"
    bad.write_text("\nnvidia-smi: command not found\n")
    r = gpuvet("parse", "topo-m", bad)
    assert r.returncode == 2
    assert f"cannot parse topo-m output at {bad}:2" in r.stderr
    assert "'nvidia-smi: command not found'" in r.stderr  # the offending line
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_missing_file_or_arguments_exit_2(tmp_path: Path) -> None:
    r = gpuvet("parse", "topo-m", tmp_path / "nope.txt")
    assert r.returncode == 2 and "no such file" in r.stderr
    r = gpuvet("parse", "topo-m")
    assert r.returncode == 2 and "parse needs KIND and FILE" in r.stderr


def test_error_exit_codes() -> None:
    assert ParseError("topo-m", "x").exit_code == 2
    assert UsageError("x").exit_code == 2


def test_parse_nccl_tests_reports_transports() -> None:
    log = REPO / "tests/fixtures/h200x2/nccl-tests/all_reduce_mpi_np2_simulated-2node-socket.log"
    res = subprocess.run([GPUVET, "parse", "nccl-tests", str(log), "--json"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    t = json.loads(res.stdout)["transports"]
    assert (t["used"], t["n_nodes"], t["nccl_version"]) == (["NET/Socket"], 2, "2.28.9")
    res = subprocess.run([GPUVET, "parse", "nccl-tests", str(log)], capture_output=True,
                         text=True, timeout=60)
    assert "NCCL 2.28.9, 2 rank(s) on 2 node(s), transports: NET/Socket" in res.stdout
