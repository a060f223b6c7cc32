"""nccl-tests logs as people paste them: every public fixture, and the captures of every op.

Each public log is pinned to the facts read from it (tests/fixtures/public/README.md
says where it comes from); the ones that cannot be read are refused with the true
reason. The captures of tests/fixtures/recipe-h200x1-extras are every collective
nccl-tests builds, `-d all -o all`, and a terminal holding several runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import ParseError
from orchestrator.parsers.nccl_tests import NcclTestsRun, parse_nccl_tests

FIX = Path(__file__).resolve().parents[2] / "fixtures"
PUBLIC = FIX / "public"
EXTRAS = FIX / "recipe-h200x1-extras"
SAMPLES = FIX / "nccl-tests"


def parsed(path: Path) -> NcclTestsRun:
    return parse_nccl_tests(path.read_text(), source=path.name)


def first(run: NcclTestsRun) -> tuple[Any, ...]:
    r = run.rows[0]
    return (r.size_bytes, r.type, r.redop, r.root, r.out_of_place.busbw_gbs,
            r.out_of_place.wrong, r.out_of_place.max_error)


# file: (rows, ranks, tests version/hash, NCCL, failure kinds, noise kinds, edit lines,
#        first row: size, type, redop, root, busbw, #wrong, error)
PINS: dict[str, tuple[Any, ...]] = {
    "all_gather_bfloat16_no-params_nccl-1435.log": (
        7, 0, (None, None), None, [], [], [4], (16777216, "bfloat16", None, None, 77.1, 0, None)),
    "all_gather_rows-only_error-0e+00_nccl-644.log": (
        13, 0, (None, None), None, [], [], [1, 1], (65536, "float", None, None, 1.1, None, 0.0)),
    "all_gather_srun-label_rccl-1490.log": (
        5, 0, (None, None), None, [], [], [3], (65536, "float", None, None, 0.59, 0, None)),
    "all_reduce_2.20.0-hash_2x-gb10_dgx-spark-103.log": (
        4, 2, ("2.20.0", "b4d5bee"), "2.31.2", [], [], [], (8192, "float", "sum", None, 0.23, 0,
                                                          None)),
    "all_reduce_256gpu_check0_nccl-2.8.4_nccl-tests-78.log": (
        6, 0, (None, None), "2.8.4", [], ["command-line"], [8],
        (33554432, "float", "sum", None, 45.65, None, None)),
    "all_reduce_cuda-failure_openmpi-banners_nccl-tests-165.log": (
        0, 0, (None, None), None, ["cuda-failure", "test-failure", "mpi-abort", "mpi-abort"],
        ["command-line", "openmpi-banner"], [], None),
    "all_reduce_error-1e-06_128gpu_nccl-tests-176.log": (
        6, 0, (None, None), None, [], ["unknown"], [6],
        (4096, "float", "sum", None, 0.09, None, 1e-06)),
    "all_reduce_hash-lost_a100-sxm4-40gb_nccl-583.log": (
        0, 8, (None, None), None, [], ["command-line"], [2], None),
    "all_reduce_op-all_rows-only_nccl-tests-167.log": (
        11, 0, (None, None), None, [], [], [1, 1], (199680, "float", "max", None, 2.98, 0, None)),
    "all_reduce_rows-unindented_4x-rtx4090_nccl-tests-280.log": (
        3, 3, (None, None), None, ["nccl-failure"], ["unknown"], [5, 13],
        (8, "float", "sum", None, 0.0, 0, None)),
    "all_reduce_ssh-warning-hash-lost_a10g_nccl-tests-249.log": (
        0, 1, (None, None), None, [], ["ssh"], [2], None),
    "all_reduce_tag-output_p5_aws-k8s-tester-503.log": (
        3, 0, (None, None), None, [], [], [4], (8, "float", "sum", None, 0.0, 0, None)),
    "all_reduce_x11-noise-comment_gtx1050_nccl-tests-131.log": (
        # its one NCCL WARN is the search's `Could not find a path for pattern`: no failure
        0, 2, (None, None), "2.16.5", [], ["comment", "nccl-warn-harmless", "shell-prompt", "x11"],
        [], None),
    "alltoall_2.17.8_mpirun-line_4x-h100_nccl-2169.log": (
        0, 4, ("2.17.8", None), "2.28.3", [], ["command-line"], [], None),
    "alltoall_2x-rtx4090_prompt_tinygrad-17.log": (
        3, 2, (None, None), None, [], ["shell-prompt"], [], (8, "float", None, None, 0.0, 0, None)),
    "alltoall_from-using-devices_8x-h20_nccl-tests-314.log": (
        3, 8, (None, None), None, [], [], [14], (1048576, "float", None, None, 15.78, 0, None)),
    "alltoall_ucx-warn_8x-h20_nccl-tests-313.log": (
        0, 8, (None, None), None, [], ["command-line", "ucx"], [], None),
    "broadcast_old-root-layout_warn_v100_nccl-tests-82.log": (
        1, 2, (None, None), "2.9.6", ["nccl-warn", "nccl-warn"], ["shell-prompt"], [],
        (8, "float", None, 0, 0.0, None, None)),
    "reduce_scatter_zero-rows_2x4gpu_nccl-tests-128.log": (
        7, 0, (None, None), None, [], [], [4], (0, "float", "sum", None, 0.0, 0, None)),
}


@pytest.mark.parametrize("name", sorted(PINS))
def test_a_pasted_log_reads_what_it_holds(name: str) -> None:
    rows, ranks, version, nccl, failures, noise, edits, row = PINS[name]
    run = parsed(PUBLIC / name)
    assert len(run.rows) == rows and len(run.ranks) == ranks
    assert (run.tests_version, run.tests_git_hash) == version
    assert run.nccl_version == nccl
    assert [f.kind for f in run.failures] == failures
    assert sorted({i.kind for i in run.ignored_lines}) == noise
    assert [e.line_no for e in run.edits] == edits
    assert (first(run) if run.rows else None) == row
    assert run.truncated  # every one of these was pasted or cut before its footer


def test_the_noise_lines_are_listed_with_their_numbers() -> None:
    run = parsed(PUBLIC / "all_reduce_x11-noise-comment_gtx1050_nccl-tests-131.log")
    assert [(i.line_no, i.kind) for i in run.ignored_lines] == [
        (1, "shell-prompt"), (3, "comment"), (4, "x11"), (21, "nccl-warn-harmless")]
    assert run.ignored_lines[2].text == "Authorization required, but no authorization protocol " \
                                        "specified"
    assert run.nccl_lines == 9  # NCCL's own lines: the nccl-debug parser reads those


def test_markdown_lost_every_hash_but_the_header_is_read() -> None:
    run = parsed(PUBLIC / "all_reduce_hash-lost_a100-sxm4-40gb_nccl-583.log")
    assert run.params["min_bytes"] == 32 and run.params["max_bytes"] == 8589934592
    assert run.params["single_test"] == 0 and run.params["test_buffer_kind"] == 2
    assert {r.host for r in run.ranks} == {"AI-A100-Beethoven01"}
    assert [r.rank for r in run.ranks] == list(range(8))
    assert "`#`" in run.edits[0].what and "Markdown" in run.edits[0].what


def test_a_headerless_table_says_how_its_columns_were_read() -> None:
    run = parsed(PUBLIC / "all_gather_rows-only_error-0e+00_nccl-644.log")
    assert run.edits[0].what.startswith("no column header above the first row")
    assert "size count type + time algbw busbw error twice" in run.edits[0].what
    last = run.rows[-1]
    assert (last.size_bytes, last.in_place.time_us, last.in_place.busbw_gbs) == (
        268435456, 32081.0, 7.32)


@pytest.mark.parametrize(("name", "line_no", "why"), [
    ("all_reduce_mpirun-2runs-mixed_v100_nccl-tests-107.log", 5,
     "a second run header (the first at line 2): several independent runs wrote into one log"),
    ("all_reduce_every-rank-0_2x-dgx-h100_nccl-tests-254.log", None,
     "rank 0 is listed 12 times (pid 544816 on dgx01, pid 332597 on dgx02"),
])
def test_several_runs_in_one_log_are_refused_with_the_reason(name: str, line_no: int | None,
                                                             why: str) -> None:
    with pytest.raises(ParseError) as exc:
        parsed(PUBLIC / name)
    assert exc.value.line_no == line_no
    assert why in exc.value.what


def test_a_terminal_with_several_runs_is_refused_where_the_second_starts() -> None:
    with pytest.raises(ParseError) as exc:
        parsed(EXTRAS / "recipe-console.txt")
    assert exc.value.line_no == 131
    assert "a second run starts here, after the first run's table ended at line 124" in \
        exc.value.what


@pytest.mark.parametrize(("op", "redop", "in_place_wrong", "avg"), [
    ("all_gather", None, 0, 0.0), ("reduce_scatter", "sum", 0, 0.0),
    ("alltoall", None, None, 0.0), ("broadcast", None, 0, 35.2741), ("reduce", "sum", 0, 48.0421),
    ("sendrecv", "sum", None, 24.4682), ("hypercube", None, 0, 0.0),
])
def test_every_collective_nccl_tests_builds(op: str, redop: str | None,
                                            in_place_wrong: int | None, avg: float) -> None:
    run = parsed(EXTRAS / f"coll-{op}.log")
    assert run.op == op and len(run.rows) == 9 and not run.truncated
    assert {r.redop for r in run.rows} == {redop}
    assert run.rows[1].in_place.wrong == in_place_wrong
    assert run.avg_busbw_reported == avg and run.avg_busbw_agrees
    assert (run.ignored_lines, run.edits) == ([], [])


def test_hypercube_leaves_the_redop_cell_empty() -> None:
    """The header names a redop column; hypercube prints nothing there (12 fields of 13)."""
    run = parsed(EXTRAS / "coll-hypercube.log")
    assert [(r.size_bytes, r.root, r.out_of_place.time_us) for r in run.rows[:2]] == [
        (0, None, 0.19), (32, None, 5.33)]


def test_a_2_11_era_alltoall_with_its_empty_redop_cell() -> None:
    run = parsed(SAMPLES / "alltoall_2.11-era_empty-redop_dgx-a100.log")
    assert len(run.rows) == 4 and run.rows[0].redop is None
    assert run.rows[0].out_of_place.max_error == 0.0 and run.avg_busbw_agrees


def test_several_datatypes_and_ops_in_one_run() -> None:
    run = parsed(EXTRAS / "all-reduce-dall-oall.log")
    assert len(run.rows) == 192
    assert [t for t in dict.fromkeys(r.type for r in run.rows)][:4] == ["int8", "uint8", "int32",
                                                                        "uint32"]
    assert list(dict.fromkeys(r.redop for r in run.rows))[:5] == ["sum", "prod", "max", "min",
                                                                  "avg"]
    # it stops where NCCL refuses a datatype, and says so
    assert run.truncated and run.failures[0].kind == "nccl-failure"
    assert "'invalid argument" in run.failures[0].text


def test_wrong_in_scientific_notation() -> None:
    run = parsed(SAMPLES / "all_reduce_2.19.6_wrong-1.67772e+07_h200.log")
    row = next(r for r in run.rows if r.size_bytes == 67108864)
    assert row.in_place.wrong == 16777200  # `%6g` keeps six digits of 16777216
    assert [f.kind for f in run.failures] == ["wrong", "out-of-bounds"]


def test_openmpi_help_lines_inside_the_table() -> None:
    clean = parsed(FIX / "recipe-h200x1" / "nccl-tests" / "all-reduce-1.log")
    noisy = parsed(SAMPLES / "all_reduce_2.19.6_openmpi-help-in-table_h200.log")
    assert [r.out_of_place for r in noisy.rows] == [r.out_of_place for r in clean.rows]
    assert [(i.line_no, i.kind) for i in noisy.ignored_lines] == [(23, "openmpi-help"),
                                                                  (24, "openmpi-help")]


def test_prose_inside_the_table_is_still_an_error() -> None:
    text = (FIX / "recipe-h200x1" / "nccl-tests" / "all-reduce-1.log").read_text()
    lines = text.splitlines()
    lines.insert(15, "and here the bandwidth drops, see below")
    with pytest.raises(ParseError) as exc:
        parse_nccl_tests("\n".join(lines))
    assert exc.value.line_no == 16 and "neither a row nor known noise" in exc.value.what
