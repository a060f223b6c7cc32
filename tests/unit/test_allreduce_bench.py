"""payload.allreduce: sizes, the row format, and a real 2-rank run on CPU (gloo)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import parsers
from orchestrator.parsers._nccl_common import NcclTestsRun
from orchestrator.steps.fleet import stragglers
from payload import allreduce

REPO = Path(__file__).resolve().parents[2]
H200_ROUND = REPO / "tests" / "fixtures" / "h200x2" / "nccl-tests" / \
    "all_reduce_8B-128M_g2_round1.log"


@pytest.mark.parametrize(("text", "expected"), [
    ("8", 8), ("1K", 1024), ("64k", 64 << 10), ("128M", 128 << 20), ("1G", 1 << 30),
    ("1GB", 1 << 30), (" 4M ", 4 << 20),
])
def test_parse_size(text: str, expected: int) -> None:
    assert allreduce.parse_size(text) == expected


@pytest.mark.parametrize("bad", ["x", "", "1.5M", "-8", "K"])
def test_parse_size_rejects(bad: str) -> None:
    with pytest.raises(ValueError, match="bad size"):
        allreduce.parse_size(bad)


def test_sizes_factor_steps_and_bounds() -> None:
    assert allreduce.sizes(8, 128, 2, 4) == [8, 16, 32, 64, 128]
    assert allreduce.sizes(1024, 65536, 4, 4) == [1024, 4096, 16384, 65536]
    assert allreduce.sizes(8, 100, 2, 4) == [8, 16, 32, 64]  # max is an upper bound
    assert allreduce.sizes(256, 128, 2, 4) == []


def test_sizes_are_whole_elements() -> None:
    # below one element starts at one element; unaligned sizes round down to elements
    assert allreduce.sizes(1, 16, 2, 4) == [4, 8, 16]
    assert allreduce.sizes(6, 100, 4, 4) == [4, 24, 96]
    assert allreduce.sizes(10, 1000, 3, 8) == [8, 24, 88, 264, 808]
    for s in allreduce.sizes(3, 1 << 20, 3, 8):
        assert s % 8 == 0 and 0 < s <= 1 << 20


def header() -> str:
    lines = H200_ROUND.read_text().splitlines()
    end = next(i for i, ln in enumerate(lines) if ln.startswith("#        (B)"))
    return "\n".join(lines[: end + 1]) + "\n"


def test_row_parses_as_nccl_tests_with_the_same_numbers() -> None:
    specs = [(1048576, 262144, 26.28, 26.02, 8, 0), (134217728, 33554432, 469.57, 469.09, 8, 0),
             (4096, 1024, 22.45, 23.22, 2, 3)]
    rows = [allreduce._row(size, count, "float", t1, t2, n, wrong)
            for size, count, t1, t2, n, wrong in specs]
    res = parsers.parse("nccl-tests", header() + "\n".join(rows) + "\n")
    assert isinstance(res, NcclTestsRun)
    assert len(res.rows) == len(specs)
    for row, (size, count, t1, t2, n, wrong) in zip(res.rows, specs, strict=True):
        assert (row.size_bytes, row.count, row.type, row.redop, row.root) == (
            size, count, "float", "sum", None)
        for half, t in ((row.out_of_place, t1), (row.in_place, t2)):
            algbw = size / t / 1e3
            assert half.time_us == t
            assert half.algbw_gbs == pytest.approx(algbw, abs=0.005)
            assert half.busbw_gbs == pytest.approx(algbw * 2 * (n - 1) / n, abs=0.005)
            assert half.wrong == wrong


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_real_two_rank_run_on_cpu_parses_as_nccl_tests() -> None:
    pytest.importorskip("torch")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
         "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
         "-m", "payload", "allreduce-bench", "-b", "1K", "-e", "64K", "-f", "4", "-n", "3",
         "-w", "1"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = parsers.parse("nccl-tests", proc.stdout)
    assert isinstance(res, NcclTestsRun)
    assert "backend gloo" in proc.stdout
    assert [r.size_bytes for r in res.rows] == [1024, 4096, 16384, 65536]
    assert [r.count for r in res.rows] == [256, 1024, 4096, 16384]
    assert all(r.out_of_place.wrong == 0 and r.in_place.wrong == 0 for r in res.rows)
    assert all(r.out_of_place.time_us > 0 and r.in_place.time_us > 0 for r in res.rows)
    assert sorted(r.rank for r in res.ranks) == [0, 1]
    assert not res.failures and not res.truncated
    assert res.out_of_bounds is not None and res.out_of_bounds.ok and res.out_of_bounds.count == 0
    assert res.avg_busbw_agrees is not False


def torchrun(args: list[str], nproc: int, extra_env: dict[str, str] | None = None,
             script: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(REPO), **(extra_env or {})}
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node",
         str(nproc), "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
         *(script or ["-m", "payload"]), "allreduce-bench", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=180)


def test_rank_times_leave_the_table_as_it_was(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    path = tmp_path / "sub" / "ranks.json"
    args = ["-b", "1K", "-e", "16K", "-f", "4", "-n", "2", "-w", "1"]
    proc = torchrun([*args, "--rank-times", str(path), "--straggler-iters", "5",
                     "--straggler-dim", "32"], 2, {"GPUVET_NODE": "sim-a"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = parsers.parse("nccl-tests", proc.stdout)
    assert isinstance(res, NcclTestsRun)
    assert [r.size_bytes for r in res.rows] == [1024, 4096, 16384]
    assert not res.failures and res.avg_busbw_agrees is not False
    # the same lines as without --rank-times, numbers aside
    plain = torchrun(args, 2)
    assert plain.returncode == 0, plain.stderr[-2000:]

    def shape(text: str) -> list[str]:
        return [" ".join("N" if any(c.isdigit() for c in w) else w for w in ln.split())
                for ln in text.splitlines()]

    assert shape(proc.stdout) == shape(plain.stdout)
    times = stragglers.load_rank_times(path.read_text(), str(path))
    assert (times.world, times.iters, times.dim, times.backend) == (2, 5, 32, "gloo")
    assert [r.rank for r in times.ranks] == [0, 1]
    assert {r.node for r in times.ranks} == {"sim-a"}
    assert all(len(r.wait_us) == len(r.work_us) == 5 for r in times.ranks)
    assert not list(path.parent.glob("*.tmp-*"))


def test_a_slow_rank_is_told_apart_at_the_barrier(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    path = tmp_path / "ranks.json"
    proc = torchrun(["-b", "1K", "-e", "1K", "-n", "1", "-w", "1", "--rank-times", str(path),
                     "--straggler-iters", "12", "--straggler-dim", "64"], 3,
                    {"GPUVET_SLOW_RANK": "1", "GPUVET_SLOW_S": "0.03"},
                    script=[str(REPO / "tests" / "unit" / "payload" / "slow_rank.py")])
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = stragglers.stragglers(stragglers.load_rank_times(path.read_text()))
    assert [r.rank for r in report.stragglers] == [1]
    slow = report.ranks[1]
    assert slow.late_us > 20_000 and slow.late_share >= 0.9
    assert slow.work_us > 25_000  # its own work took the time: the others waited for it


def test_a_rank_whose_peer_never_comes_gives_up_after_pg_timeout() -> None:
    """A node lost mid-plan must not hold its partner until the job's own timeout: rank 0
    of a world of 2 whose rank 1 never starts fails on its own (torch's default would wait
    30 minutes, past the 120 s this test allows)."""
    pytest.importorskip("torch")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "RANK": "0",
           "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port())}
    proc = subprocess.run(
        [sys.executable, "-m", "payload", "allreduce-bench", "-b", "1K", "-e", "1K",
         "--pg-timeout", "3"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "all_reduce_perf" not in proc.stdout  # it never got as far as the table
