"""nccl-tests text logs edited one thing at a time: the exact refusal each edit earns, or
what it changes in the run read.

The base log is the real capture `h200x2/nccl-tests/all_reduce_8B-128M_g2_round1.log`
(nccl-tests 2.19.6, 2 x H200); tests/unit/test_mutation_pins_nccl_parsers.py pins every
capture whole.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import ParseError
from orchestrator.parsers import nccl_tests
from orchestrator.parsers.nccl_tests import NcclTestsRun, parse_nccl_tests

FIX = Path(__file__).resolve().parents[1] / "fixtures"
BASE = (FIX / "h200x2" / "nccl-tests" / "all_reduce_8B-128M_g2_round1.log").read_text().splitlines()
SRC = "edited.log"
HEADER = 11  # the line of the column names
ROW1 = 13  # the first table row
OOB = 38  # `# Out of bounds values : 0 OK`


def _lines() -> list[str]:
    return list(BASE)


def _read(lines: list[str]) -> NcclTestsRun:
    return parse_nccl_tests("\n".join(lines) + "\n", source=SRC)


def _refusal(lines: list[str]) -> tuple[str, int | None, str | None, str | None]:
    with pytest.raises(ParseError) as info:
        _read(lines)
    exc = info.value
    return str(exc).splitlines()[0], exc.line_no, exc.line, exc.source


def _at(n: int | None) -> str:
    return f"cannot parse nccl-tests output at {SRC}{'' if n is None else f':{n}'}: "


def _replace(n: int, text: str) -> list[str]:
    lines = _lines()
    lines[n - 1] = text
    return lines


def _insert(n: int, text: str) -> list[str]:
    lines = _lines()
    lines.insert(n - 1, text)
    return lines


_COLS = BASE[HEADER - 1]


def _cols(old: str, new: str, count: int = -1) -> str:
    return _COLS.replace(old, new, count)


UNKNOWN_HEADERS = [
    _cols("time", "foo", 1),  # no time column before the halves
    _cols("time", "foo"),  # no time column at all
    _cols("redop", "color"),  # a lead column nccl-tests never printed
    _COLS.rstrip().rsplit(None, 1)[0],  # an odd number of columns
    _COLS.rstrip().rsplit(None, 1)[0] + "  error",  # halves that differ
    _cols("algbw   busbw", "busbw   algbw"),
    _cols("#wrong", "#right"),
    _cols("#wrong", "#wrong  i_min"),  # per-iteration columns cut short
]


@pytest.mark.parametrize("header", UNKNOWN_HEADERS)
def test_a_column_header_nccl_tests_never_printed_is_refused(header: str) -> None:
    assert _refusal(_replace(HEADER, header)) == (
        _at(HEADER) + "unknown column header", HEADER, header, SRC)


def test_the_1x_layout_is_refused_as_such() -> None:
    header = "#  bytes    N    type      op     time  algbw  busbw    res"
    assert _refusal(_replace(HEADER, header)) == (
        _at(HEADER) + "nccl-tests 1.x table layout (bytes/N/op/res) is not supported", HEADER,
        header, SRC)


def test_a_cputime_header_and_a_timestamp_column() -> None:
    lines = _replace(HEADER, BASE[HEADER - 1].replace("time", "cputime"))
    assert _read(lines).time_kind == "cputime"
    lines = _replace(HEADER, BASE[HEADER - 1].rstrip() + "  timestamp")
    lines[ROW1 - 1] += "  2026-11-30 04:30:26"
    for n in range(ROW1, ROW1 + 25):
        if n != ROW1:
            lines[n - 1] += "  2026-11-30 04:30:27"
    run = _read(lines)
    assert [r.timestamp for r in run.rows[:2]] == ["2026-11-30 04:30:26", "2026-11-30 04:30:27"]
    assert run.rows[0].in_place.wrong == 0


def test_unexpected_text_in_the_parameters_line() -> None:
    line = BASE[2] + " colour: blue"
    assert _refusal(_replace(3, line)) == (
        _at(3) + "unexpected text in the parameters line", 3, line, SRC)


def test_the_parameters_line_keys_and_modes() -> None:
    run = _read(_lines())
    assert run.params == {"n_thread": 1, "n_gpus": 2, "min_bytes": 8, "max_bytes": 134217728,
                          "step": 2, "step_mode": "factor", "warmup_iters": 1, "iters": 20,
                          "agg_iters": 1, "validation": 1, "graph": 0, "unalign": 0}


def test_a_malformed_row_is_refused_with_what_broke() -> None:
    line = BASE[15].replace("0.00", "x.yz", 1)
    assert _refusal(_replace(16, line)) == (
        _at(16) + "malformed table row (could not convert string to float: 'x.yz')", 16, line, SRC)


def test_a_short_row_with_rows_after_it() -> None:
    short = BASE[20].rsplit(None, 4)[0]
    assert _refusal(_replace(21, short)) == (
        _at(21) + "table row has 9 fields, the header announces 13", 21, short, SRC)
    lines = _replace(21, short)
    lines[21] = lines[21].rsplit(None, 4)[0]
    assert _refusal(lines) == (
        _at(21) + "table row has 9 fields, the header announces 13", 21, short, SRC)
    lines = _replace(37, BASE[36].rsplit(None, 4)[0])
    assert _refusal(lines)[:2] == (_at(37) + "table row has 9 fields, the header announces 13", 37)


def test_a_second_run_inside_the_table_and_after_it() -> None:
    assert _refusal(_insert(20, BASE[2])) == (
        _at(20) + "a second run header (the first at line 3): several independent runs wrote "
        "into one log (a non-MPI build under mpirun?)", 20, BASE[2], SRC)
    assert _refusal(_insert(20, BASE[HEADER - 1]))[:2] == (
        _at(20) + "a second run header (the first at line 3): several independent runs wrote "
        "into one log (a non-MPI build under mpirun?)", 20)
    for line in (BASE[1], BASE[2], BASE[HEADER - 1]):
        assert _refusal(_insert(OOB + 2, line)) == (
            _at(OOB + 2) + f"a second run starts here, after the first run's table ended at line "
            f"{OOB}: several runs were saved into one file; keep one run per file", OOB + 2,
            line, SRC)


def test_an_average_that_is_no_number() -> None:
    line = "# Avg bus bandwidth    : fast "
    assert _refusal(_replace(OOB + 1, line)) == (
        _at(OOB + 1) + "the average bus bandwidth is not a number", OOB + 1, line, SRC)


def test_the_average_s_check_word() -> None:
    ok = _read(_replace(OOB + 1, "# Avg bus bandwidth    : 58.5009 OK"))
    assert (ok.avg_busbw_reported, ok.avg_busbw_check, ok.failures) == (58.5009, "OK", [])
    bad = _read(_replace(OOB + 1, "# Avg bus bandwidth    : 58.5009 FAILED"))
    assert bad.avg_busbw_check == "FAILED"
    assert [f.model_dump() for f in bad.failures] == [
        {"line_no": OOB + 1, "kind": "min-bw", "text": "# Avg bus bandwidth    : 58.5009 FAILED"}]


def test_prose_inside_the_table() -> None:
    assert _refusal(_insert(20, "some stray text")) == (
        _at(20) + "line in the results table is neither a row nor known noise", 20,
        "some stray text", SRC)


def test_text_without_parameters_or_table() -> None:
    assert _refusal(["hello", "world"]) == (
        _at(None) + "no nccl-tests parameters line (`# nThread ...`) or results table found",
        None, None, SRC)


def test_a_table_without_its_parameters_line_says_so() -> None:
    lines = _lines()
    del lines[2]
    run = _read(lines)
    assert [(e.line_no, e.what) for e in run.edits] == [
        (ROW1 - 1, "no parameters line (`# nThread ...`): the paste starts below it, so the GPU "
         "count and iterations are unknown")]


def _rank_line(rank: int, pid: int, host: str) -> str:
    return f"#  Rank  {rank} Group  0 Pid {pid:6d} on {host:>10} device  0 [0000:00:06] NVIDIA H200"


@pytest.mark.parametrize(("copies", "shown"), [
    (2, "pid 100 on a, pid 101 on b"),
    (4, "pid 100 on a, pid 101 on b, pid 102 on a, pid 103 on b"),
    (5, "pid 100 on a, pid 101 on b, pid 102 on a, pid 103 on b ..."),
])
def test_the_same_rank_from_several_processes(copies: int, shown: str) -> None:
    lines = _lines()
    lines[5:7] = [_rank_line(0, 100 + i, "ab"[i % 2]) for i in range(copies)]
    assert _refusal(lines) == (
        _at(None) + f"rank 0 is listed {copies} times ({shown}): independent single-process "
        "runs wrote into one log; build nccl-tests with MPI=1 to run across processes",
        None, None, SRC)


def test_rows_up_to_the_limit_are_read_and_one_more_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nccl_tests, "MAX_ROWS", 25)
    assert len(_read(_lines()).rows) == 25
    monkeypatch.setattr(nccl_tests, "MAX_ROWS", 24)
    assert _refusal(_lines()) == (
        _at(37) + "more than 24 table rows: not one nccl-tests run this reads (a sweep of every "
        "size prints a few thousand at most); keep one run per file", 37, BASE[36], SRC)
    monkeypatch.setattr(nccl_tests, "MAX_ROWS", 1000)
    lines = _lines()
    lines[ROW1 - 1:ROW1 - 1] = [BASE[ROW1 - 1]] * 976
    assert _refusal(lines)[0].startswith(_at(ROW1 + 1000) + "more than 1,000 table rows")


def test_hash_lost_on_every_header_line_is_one_edit() -> None:
    lines = [ln[1:] if ln.startswith("#") else ln for ln in _lines()]
    run = _read(lines)
    assert len(run.rows) == 25 and run.tests_version == "2.19.6"
    assert [(e.line_no, e.what) for e in run.edits] == [
        (1, "the `#` that starts nccl-tests' header lines is missing (GitHub Markdown makes such "
         "lines headings)")]
    assert (run.out_of_bounds is not None, run.avg_busbw_reported, run.truncated) == (
        True, 58.5009, False)


def test_the_tests_version_with_its_hash_glued_on() -> None:
    for ver in ("2.19.6+g1a2b3c4", "2.19.6-1a2b3c4d"):
        run = _read(_replace(1, BASE[0].replace("2.19.6", ver)))
        assert (run.tests_version, run.tests_git_hash) == ("2.19.6", ver[-7:] if "+" in ver
                                                           else "1a2b3c4d")
    run = _read(_replace(1, BASE[0].replace("2.19.6", "2.19.6 (0123abc)")))
    assert (run.tests_version, run.tests_git_hash) == ("2.19.6", "0123abc")
    run = _read(_replace(1, BASE[0].replace("2.19.6", "2.19.6-rc1")))
    assert (run.tests_version, run.tests_git_hash) == ("2.19.6-rc1", None)


def test_the_nccl_version_line_and_the_library_code() -> None:
    lines = _lines()
    del lines[7]  # `NCCL version 2.28.9+cuda13.0`
    run = _read(lines)
    assert (run.nccl_version, run.nccl_cuda, run.nccl_headers) == ("2.28.9", None, "2.28.9")
    run = _read(_replace(8, "NCCL version 2.28.9+cuda13.0 extra"))
    assert (run.nccl_version, run.nccl_cuda) == ("2.28.9", "13.0")
    run = _read(_replace(8, "NCCL version 2.27.3"))
    assert (run.nccl_version, run.nccl_cuda) == ("2.27.3", None)
    run = _read(_replace(8, "NCCL version 2.27.3-1"))
    assert (run.nccl_version, run.nccl_cuda) == ("2.27.3", None)


NEW = ["time", "algbw", "busbw", "#wrong"]
OLD = ["time", "algbw", "busbw", "error"]
_HALF_NEW_ROW = "23.67 0.00 0.00 0 25.68 0.00 0.00 0"
_HALF_OLD_ROW = "23.67 0.00 0.00 0e+00 25.68 0.00 0.00 0e+00"


@pytest.mark.parametrize(("row", "names"), [
    (f"8 2 float sum -1 {_HALF_NEW_ROW}", ["size", "count", "type", "redop", "root", *NEW, *NEW]),
    (f"8 2 float sum {_HALF_OLD_ROW}", ["size", "count", "type", "redop", *OLD, *OLD]),
    (f"8 2 float 0 {_HALF_OLD_ROW}", ["size", "count", "type", "root", *OLD, *OLD]),
    (f"8 2 float -1 {_HALF_OLD_ROW}", ["size", "count", "type", "root", *OLD, *OLD]),
    (f"8 2 float {_HALF_OLD_ROW}", ["size", "count", "type", *OLD, *OLD]),
    (f"8 2 float sum x {_HALF_NEW_ROW}", None),  # 13 fields, no root where it belongs
    (f"8 2 float 0 -1 {_HALF_NEW_ROW}", None),  # 13 fields, a number where the redop is
    (f"8 2 float 1.5 {_HALF_OLD_ROW}", None),  # 12 fields, no root and no redop
    (f"8 2 float sum -1 {_HALF_NEW_ROW} 2026-11-30 04:30:26", None),  # a timestamp: 15
    (f"8 2 float sum -1 {_HALF_NEW_ROW} 0", None),  # 14
    ("8 2 float 23.67 0.00 0.00 0e+00 25.68 0.00 0.00", None),  # 10
    (f"x 2 float {_HALF_OLD_ROW}", None),
    (f"8 x float {_HALF_OLD_ROW}", None),
    (f"8 2 3 sum {_HALF_OLD_ROW}", None),  # a number for the type
])
def test_the_columns_of_a_headerless_row_from_its_shape(row: str, names: list[str] | None) -> None:
    assert nccl_tests._inferred_columns(row.split()) == names


def test_a_table_pasted_without_its_header_says_how_it_was_read() -> None:
    lines = _lines()[ROW1 - 1:ROW1 + 24]
    run = _read(lines)
    assert (len(run.rows), run.rows[0].redop, run.rows[0].root, run.rows[0].line_no) == (
        25, "sum", None, 1)
    assert [(e.line_no, e.what) for e in run.edits] == [
        (1, "no column header above the first row: the columns were read from the rows' shape "
         "(size count type redop root + time algbw busbw #wrong twice)"),
        (1, "no parameters line (`# nThread ...`): the paste starts below it, so the GPU count "
         "and iterations are unknown")]


def test_text_between_two_parameters_is_refused() -> None:
    line = BASE[2].replace(" graph: 0", " colour: blue graph: 0")
    assert _refusal(_replace(3, line)) == (
        _at(3) + "unexpected text in the parameters line", 3, line, SRC)


@pytest.mark.parametrize(("banner", "binary", "op"), [
    ("# Collective test starting: ./build/all_reduce_perf", "./build/all_reduce_perf",
     "all_reduce"),
    ("# Collective test starting: /opt/nccl-tests/build/sendrecv_perf_mpi",
     "/opt/nccl-tests/build/sendrecv_perf_mpi", "sendrecv"),
    ("# Collective test starting: mytest", "mytest", None),
])
def test_the_op_is_the_binary_s_name_before_perf(banner: str, binary: str, op: str | None) -> None:
    run = _read(_replace(2, banner))
    assert (run.binary, run.op) == (binary, op)


def test_a_short_last_row_without_a_redop_column_is_a_truncation() -> None:
    lines = (FIX / "nccl-tests" / "broadcast_2.11-era_check0_na.log").read_text().splitlines()[:17]
    lines[-1] = lines[-1].rsplit(None, 1)[0]  # one field short, and no redop cell to blame
    run = _read(lines)
    assert (len(run.rows), run.truncated, run.rows[-1].size_bytes) == (5, True, 268435456)


def test_nccl_s_own_lines_in_the_table_and_their_levels() -> None:
    lines = _lines()
    lines[19:19] = [
        "vm:1406:1410 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM",
        "vm:1406:1410 [0] NCCL TRACE proxy.cc:77 progress",
        "vm:1406:1410 [0] NCCL ABORT transport/net_ib.cc:1696 cqe error",
        "vm:1406:1410 [1] NCCL ERROR init.cc:1120 -> 3",
        "vm:1406:1410 [1] misc/socket.cc:484 NCCL WARN socketStartConnect: timed out",
    ]
    run = _read(lines)
    assert run.nccl_lines == 5 and len(run.rows) == 25
    assert [(f.line_no, f.kind, f.text) for f in run.failures] == [
        (22, "nccl-warn", "vm:1406:1410 [0] NCCL ABORT transport/net_ib.cc:1696 cqe error"),
        (23, "nccl-warn", "vm:1406:1410 [1] NCCL ERROR init.cc:1120 -> 3"),
        (24, "nccl-warn", "vm:1406:1410 [1] misc/socket.cc:484 NCCL WARN socketStartConnect: "
         "timed out")]


def test_the_nccl_version_from_an_info_line_only_once() -> None:
    lines = _lines()
    lines[7] = "vm:1406:1406 [0] NCCL INFO NCCL version 2.27.3+cuda12.9"
    lines.insert(8, "vm:1406:1406 [1] NCCL INFO NCCL version 2.28.9+cuda13.0")
    run = _read(lines)
    assert (run.nccl_version, run.nccl_cuda, run.nccl_lines) == ("2.27.3", "12.9", 2)
    lines = _lines()
    lines.insert(8, "NCCL version 2.27.3+cuda12.9")
    assert (_read(lines).nccl_version, _read(lines).nccl_cuda) == ("2.28.9", "13.0")


def test_comments_and_decoration_around_the_table() -> None:
    lines = _lines()
    lines.insert(3, "# a note someone added")
    lines.insert(4, "####")
    lines.append("# after the end")
    lines.append("trailing words")
    run = _read(lines)
    assert [(i.line_no, i.kind, i.text) for i in run.ignored_lines] == [
        (4, "comment", "# a note someone added"), (len(lines) - 1, "comment", "# after the end"),
        (len(lines), "unknown", "trailing words")]
    assert run.edits == [] and len(run.rows) == 25


def test_each_per_iteration_column_is_read_from_its_own_place() -> None:
    lines = (FIX / "nccl-tests" / "all_reduce_2.19.6_per-iter_h100.log").read_text().splitlines()
    row = lines[20].split()
    row[11] = "91.00"  # out-of-place i_p99, below its i_max of 91.46
    lines[20] = "  ".join(row)
    per = _read(lines).rows[0].out_of_place.per_iter
    assert per is not None
    assert (per.min_us, per.max_us, per.p99_us, per.cv_pct) == (86.87, 91.46, 91.00, 1.52)


def test_indented_footer_lines_are_read_and_are_no_edit() -> None:
    lines = _lines()
    lines[OOB - 1] = "  " + lines[OOB - 1]
    lines[OOB] = "  " + lines[OOB]
    run = _read(lines)
    assert (run.out_of_bounds is not None, run.avg_busbw_reported, run.edits) == (
        True, 58.5009, [])


_LOST = ("the `#` that starts nccl-tests' header lines is missing (GitHub Markdown makes such "
         "lines headings)")


@pytest.mark.parametrize("n", [12, OOB, OOB + 1, OOB + 3])
def test_one_header_line_without_its_hash_is_an_edit_at_that_line(n: int) -> None:
    run = _read(_replace(n, BASE[n - 1].lstrip("#")))
    assert [(e.line_no, e.what) for e in run.edits] == [(n, _LOST)]


def test_a_rank_line_without_a_pid() -> None:
    run = _read(_replace(6, "#   Rank  0 on         vm device  0 [0x06] NVIDIA H200"))
    assert [(r.rank, r.group, r.pid, r.host, r.device, r.bus_id) for r in run.ranks] == [
        (0, None, None, "vm", 0, "0x06"), (1, 0, 1406, "vm", 1, "0000:00:07")]


def test_numbers_before_the_header_that_are_no_row() -> None:
    run = _read(_insert(4, "12 34 hello"))
    assert [(i.line_no, i.kind, i.text) for i in run.ignored_lines] == [(4, "unknown", "12 34 hello")]
    assert len(run.rows) == 25


def test_a_row_with_a_crash_glued_on_then_another_row() -> None:
    glued = BASE[20] + "vm: Test NCCL failure common.cu:477 'unhandled cuda error'"
    lines = _replace(21, glued)
    assert _refusal(lines) == (
        _at(21) + "table row has 20 fields, the header announces 13", 21, glued, SRC)
    run = _read(lines[:21])
    assert (len(run.rows), run.truncated) == (8, True)
    assert [(f.line_no, f.kind) for f in run.failures] == [(21, "nccl-failure")]


def test_a_last_row_one_field_short_is_a_truncation_not_an_empty_redop() -> None:
    lines = _lines()[:37]
    lines[-1] = lines[-1].rsplit(None, 1)[0]
    run = _read(lines)
    assert (len(run.rows), run.truncated) == (24, True)


def test_a_line_ending_in_capital_x_and_a_line_of_them() -> None:
    lines = [*_lines(), "XXX", "see rank X"]
    run = _read(lines)
    assert [(i.kind, i.text) for i in run.ignored_lines] == [
        ("unknown", "XXX"), ("unknown", "see rank X")]


def test_past_the_listed_limit_ignored_lines_are_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.parsers import _noise
    monkeypatch.setattr(_noise, "MAX_LISTED", 2)
    run = _read([*_lines(), "one", "two", "three", "four"])
    assert ([i.text for i in run.ignored_lines], run.ignored_lines_dropped) == (["one", "two"], 2)
