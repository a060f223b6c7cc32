"""Parse the text log of any nccl-tests *_perf binary, and (via a helper) its -J JSON.

The table layout changed across nccl-tests releases (an `error` column before
2.13, a `root` column since, `#wrong` counts, -S timestamps, -I per-iteration
columns), so rows are read against the column header the log itself printed
rather than a fixed layout. NCCL debug output and launcher chatter land in the
same stream, even between rows; known noise is skipped, anything else inside
the table is an error, since a silently dropped row would skew a comparison.
"""

from __future__ import annotations

import re

from orchestrator.errors import ParseError
from orchestrator.parsers import register
from orchestrator.parsers._nccl_common import (
    NCCL_LINE,
    NCCL_VERSION,
    Failure,
    NcclOutOfBounds,
    NcclPerIter,
    NcclRank,
    NcclResult,
    NcclRow,
    NcclTestsRun,
    check_avg,
    decode_version_code,
    failure_kind,
    recompute_avg,
    strip_launcher_prefix,
)
from orchestrator.parsers._nccl_tests_json import parse_json_run

__all__ = ["NcclRow", "NcclTestsRun", "check_avg", "parse_nccl_tests", "parse_nccl_tests_json"]

KIND = "nccl-tests"

_VERSION = re.compile(
    r"^# nccl-tests version (?P<ver>\S+) nccl-headers=(?P<hdr>\d+) nccl-library=(?P<lib>\d+)")
_STARTING = re.compile(r"^# Collective test starting: (?P<bin>\S+)")
_PARAMS = re.compile(r"^#? ?nThread \d+ ")
_PARAM = re.compile(r"\s*(?P<key>[A-Za-z][A-Za-z ]*?):?\s+(?P<val>-?\d+)(?:\((?P<mode>\w+)\))?")
_RANK = re.compile(
    r"^#\s+Rank\s+(?P<rank>\d+)(?:\s+Group\s+(?P<group>\d+))?(?:\s+Pid\s+(?P<pid>\d+))?"
    r"\s+on\s+(?P<host>\S+)\s+device\s+(?P<dev>\d+)\s+\[(?P<bus>[^\]]+)\]\s+(?P<name>.*?)\s*$")
_OOB = re.compile(r"^#? ?Out of bounds values\s*: (?P<n>\d+) (?P<res>OK|FAILED)")
_AVG = re.compile(r"^#? ?Avg bus bandwidth\s*: (?P<bw>\S+)\s*(?P<chk>OK|FAILED)?\s*$")
_ROW_START = re.compile(r"^\s*\d+\s+\d+\s")
_MPI_RULE = re.compile(r"^-{20,}$")
_MPI_TAGGED = re.compile(r"^\[[^\]]*:\d+\] ")
_HEX_DUMP = re.compile(r"^(?:[0-9a-f]{8} ){3}[0-9a-f]{8}$")
_LEAD = ("size", "count", "type", "redop", "root")
_PER_ITER = ("i_min", "i_max", "i_p99", "i_cv%")


class _Layout:
    """Column layout read from the `#  size  count  type ...` header line."""

    def __init__(self, names: list[str], line_no: int, line: str, source: str | None) -> None:
        if names[:2] != ["size", "count"]:
            raise ParseError(KIND, "nccl-tests 1.x table layout (bytes/N/op/res) is not "
                             "supported", line_no=line_no, line=line, source=source)
        split = next((i for i, n in enumerate(names) if n in ("time", "cputime")), None)
        if split is None or any(n not in _LEAD for n in names[:split]):
            raise ParseError(KIND, "unknown column header", line_no=line_no, line=line,
                             source=source)
        self.lead = names[:split]
        self.time_kind = names[split]
        self.timestamp = names[-1] == "timestamp"
        body = names[split:-1] if self.timestamp else names[split:]
        half = len(body) // 2
        first = body[:half]
        ok = len(body) % 2 == 0 and body[half:] == first and first[1:3] == ["algbw", "busbw"]
        ok = ok and first[3] in ("#wrong", "error") and tuple(first[4:]) in ((), _PER_ITER)
        if not ok:
            raise ParseError(KIND, "unknown column header", line_no=line_no, line=line,
                             source=source)
        self.half = half
        self.error_col = first[3] == "error"
        self.width = len(self.lead) + 2 * half + (2 if self.timestamp else 0)


def _num(tok: str) -> float:
    return float(tok)


def _result(toks: list[str], layout: _Layout) -> NcclResult:
    wrong: int | None = None
    max_error: float | None = None
    if toks[3] != "N/A":
        if layout.error_col:
            max_error = _num(toks[3])
        else:
            wrong = int(_num(toks[3]))
    per_iter = None
    if layout.half == 8:
        per_iter = NcclPerIter(min_us=_num(toks[4]), max_us=_num(toks[5]),
                               p99_us=_num(toks[6]), cv_pct=_num(toks[7]))
    return NcclResult(time_us=_num(toks[0]), algbw_gbs=_num(toks[1]), busbw_gbs=_num(toks[2]),
                      wrong=wrong, max_error=max_error, per_iter=per_iter, busbw_text=toks[2])


def _row(toks: list[str], layout: _Layout, line_no: int) -> NcclRow:
    lead = dict(zip(layout.lead, toks, strict=False))
    rest = toks[len(layout.lead):]
    redop = lead.get("redop")
    root = int(lead["root"]) if "root" in lead else None
    return NcclRow(
        line_no=line_no, size_bytes=int(lead["size"]), count=int(lead["count"]),
        type=lead.get("type", "?"), redop=None if redop in (None, "none") else redop,
        root=None if root == -1 else root,
        out_of_place=_result(rest[:layout.half], layout),
        in_place=_result(rest[layout.half:2 * layout.half], layout),
        timestamp=" ".join(rest[2 * layout.half:]) if layout.timestamp else None)


def _params(line: str, line_no: int, source: str | None) -> dict[str, int | str]:
    text = line.lstrip("# ").rstrip()
    out: dict[str, int | str] = {}
    pos = 0
    for m in _PARAM.finditer(text):
        if m.start() != pos:
            break
        key = re.sub(r"(?<=[a-z])([A-Z])", r"_\1", m["key"].strip()).lower().replace(" ", "_")
        out[key] = int(m["val"])
        if m["mode"]:
            out[f"{key}_mode"] = m["mode"]
        pos = m.end()
    if text[pos:].strip():
        raise ParseError(KIND, "unexpected text in the parameters line", line_no=line_no,
                         line=line, source=source)
    return out


class _State:
    def __init__(self) -> None:
        self.binary: str | None = None
        self.tests_version: str | None = None
        self.headers: str | None = None
        self.library: str | None = None
        self.nccl_version: str | None = None
        self.nccl_cuda: str | None = None
        self.params: dict[str, int | str] = {}
        self.notes: list[str] = []
        self.ranks: list[NcclRank] = []
        self.rows: list[NcclRow] = []
        self.failures: list[Failure] = []
        self.layout: _Layout | None = None
        self.oob: NcclOutOfBounds | None = None
        self.avg: float | None = None
        self.avg_check: str | None = None
        self.footer = False
        self.partial: tuple[int, str] | None = None
        self.in_mpi_block = False


def _noise(st: _State, line: str, line_no: int) -> bool:
    """Record what a non-row line says; False when it is not known noise."""
    stripped = line.strip()
    m = NCCL_LINE.match(line)
    if m:
        if m["level"] in ("WARN", "ABORT", "ERROR"):
            st.failures.append(Failure(line_no=line_no, kind="nccl-warn", text=stripped))
        v = NCCL_VERSION.search(m["msg"])
        if v and st.nccl_version is None:
            st.nccl_version, st.nccl_cuda = v["ver"], _cuda(v["suffix"])
        return True
    kind = failure_kind(line)
    if kind:
        st.failures.append(Failure(line_no=line_no, kind=kind, text=stripped))
        return True
    v = NCCL_VERSION.match(stripped)
    if v:
        if st.nccl_version is None:
            st.nccl_version, st.nccl_cuda = v["ver"], _cuda(v["suffix"])
        return True
    if _MPI_RULE.match(stripped):
        st.in_mpi_block = not st.in_mpi_block
        return True
    return (not stripped or stripped.startswith("#") or st.in_mpi_block
            or bool(_MPI_TAGGED.match(stripped)) or bool(_HEX_DUMP.match(stripped)))


def _cuda(suffix: str | None) -> str | None:
    return suffix[4:] if suffix and suffix.startswith("cuda") else None


def _header_line(st: _State, line: str, line_no: int, source: str | None) -> bool:
    """Lines before the table: banner, parameters, devices, column header."""
    if m := _VERSION.match(line):
        st.tests_version = m["ver"]
        st.headers = decode_version_code(int(m["hdr"]))
        st.library = decode_version_code(int(m["lib"]))
    elif m := _STARTING.match(line):
        st.binary = m["bin"]
    elif _PARAMS.match(line):
        if st.params:
            raise ParseError(KIND, "a second run header: several independent runs wrote into "
                             "one log (a non-MPI build under mpirun?)", line_no=line_no,
                             line=line, source=source)
        st.params = _params(line, line_no, source)
    elif m := _RANK.match(line):
        st.ranks.append(NcclRank(
            rank=int(m["rank"]), group=int(m["group"]) if m["group"] else None,
            pid=int(m["pid"]) if m["pid"] else None, host=m["host"], device=int(m["dev"]),
            bus_id=m["bus"], name=m["name"]))
    elif re.match(r"^#\s+(size|bytes)\s+(count|N)\s", line):
        st.layout = _Layout(line.lstrip("#").split(), line_no, line, source)
    elif re.match(r"^# (Blocking|Parallel Init|Per-Iteration|Reducing maxBytes)", line):
        st.notes.append(line.lstrip("# ").rstrip())
    else:
        return False
    return True


def _table_line(st: _State, line: str, line_no: int, source: str | None) -> None:
    assert st.layout is not None
    if _ROW_START.match(line):
        toks = line.split()
        if len(toks) != st.layout.width:
            if failure_kind(line):  # the crash message continued the row's line
                st.failures.append(Failure(line_no=line_no, kind=failure_kind(line) or "",
                                           text=line.strip()))
                st.partial = (line_no, line)
                return
            if st.partial is not None:
                _raise_partial(st, source)
            st.partial = (line_no, line)  # fine only if nothing but noise follows
            return
        if st.partial is not None:
            _raise_partial(st, source)
        try:
            row = _row(toks, st.layout, line_no)
        except ValueError as exc:
            raise ParseError(KIND, f"malformed table row ({exc})", line_no=line_no, line=line,
                             source=source) from None
        st.rows.append(row)
        for res in (row.out_of_place, row.in_place):
            if res.wrong:
                st.failures.append(Failure(line_no=line_no, kind="wrong", text=line.strip()))
                break
    elif m := _OOB.match(line.strip()):
        if st.partial is not None:
            _raise_partial(st, source)
        st.oob = NcclOutOfBounds(count=int(m["n"]), ok=m["res"] == "OK")
        st.footer = True
        if m["res"] == "FAILED":
            st.failures.append(Failure(line_no=line_no, kind="out-of-bounds", text=line.strip()))
    elif _PARAMS.match(line):
        _header_line(st, line, line_no, source)  # raises: a second run's header
    elif not _noise(st, line, line_no):
        raise ParseError(KIND, "line in the results table is neither a row nor known noise",
                         line_no=line_no, line=line, source=source)


def _raise_partial(st: _State, source: str | None) -> None:
    assert st.partial is not None and st.layout is not None
    line_no, line = st.partial
    raise ParseError(KIND, f"table row has {len(line.split())} fields, the header announces "
                     f"{st.layout.width}", line_no=line_no, line=line, source=source)


def _footer_line(st: _State, line: str, line_no: int, source: str | None) -> None:
    if m := _AVG.match(line.strip()):
        try:
            st.avg = float(m["bw"])
        except ValueError:
            raise ParseError(KIND, "the average bus bandwidth is not a number", line_no=line_no,
                             line=line, source=source) from None
        st.avg_check = m["chk"]
        if m["chk"] == "FAILED":
            st.failures.append(Failure(line_no=line_no, kind="min-bw", text=line.strip()))
    else:
        _noise(st, line, line_no)


def parse_nccl_tests(text: str, source: str | None = None) -> NcclTestsRun:
    st = _State()
    lines, prefix = strip_launcher_prefix(text.splitlines())
    for line_no, raw in enumerate(lines, start=1):
        line = raw.rstrip("\r")
        if st.footer:
            _footer_line(st, line, line_no, source)
        elif st.layout is not None:
            _table_line(st, line, line_no, source)
        elif not _header_line(st, line, line_no, source):
            _noise(st, line, line_no)
    if not st.params and st.layout is None:
        raise ParseError(KIND, "no nccl-tests parameters line (`# nThread ...`) or results "
                         "table found", source=source)
    run = _finish(st)
    run.launcher_prefix = prefix
    return run


def _finish(st: _State) -> NcclTestsRun:
    nccl = st.nccl_version or st.library
    git_hash = None
    ver = st.tests_version
    if ver and (m := re.match(r"^(\d+(?:\.\d+)*)[+-]g?([0-9a-f]{7,40})$", ver)):
        ver, git_hash = m[1], m[2]
    run = NcclTestsRun(
        format="text", binary=st.binary, op=_op(st.binary), tests_version=ver,
        tests_git_hash=git_hash, nccl_version=nccl, nccl_cuda=st.nccl_cuda,
        nccl_headers=st.headers, params=st.params, header_notes=st.notes,
        time_kind="cputime" if st.layout and st.layout.time_kind == "cputime" else "time",
        ranks=st.ranks, rows=st.rows, out_of_bounds=st.oob, avg_busbw_reported=st.avg,
        avg_busbw_check=st.avg_check, avg_busbw_recomputed=recompute_avg(st.rows),
        avg_busbw_agrees=None, failures=st.failures, truncated=not st.footer)
    run.avg_busbw_agrees = check_avg(run)
    return run


def _op(binary: str | None) -> str | None:
    if not binary:
        return None
    name = binary.rsplit("/", 1)[-1]
    return name.split("_perf")[0] if "_perf" in name else None


def parse_nccl_tests_json(text: str, source: str | None = None) -> NcclTestsRun:
    return parse_json_run(text, source, op_of=_op)


# Registered without decorating, so callers keep the precise return type.
register(KIND, "text log of an nccl-tests *_perf run (any version since 2.0)")(parse_nccl_tests)
register("nccl-tests-json", "the -J JSON output of an nccl-tests *_perf run (2.17.6+)")(
    parse_nccl_tests_json)
