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
