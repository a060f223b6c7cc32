"""Parse the text log of any nccl-tests *_perf binary, and (via a helper) its -J JSON.

The table layout changed across nccl-tests releases (an `error` column before
2.13, a `root` column since, `#wrong` counts, -S timestamps, -I per-iteration
columns), so rows are read against the column header the log itself printed
rather than a fixed layout. NCCL debug output and launcher chatter land in the
same stream, even between rows: the shared noise reader (`_noise`) tells them
apart, every line read past is listed in `ignored_lines`, and anything else
inside the table is an error, since a silently dropped row would skew a
comparison. Pastes a person edited (an elision, every leading `#` lost to
Markdown, a table without its header) are read as far as they go and say so in
`edits`; a file holding two runs is refused with that reason.
"""

from __future__ import annotations

import re

from orchestrator.errors import ParseError
from orchestrator.parsers import register
from orchestrator.parsers._nccl_command import command_facts
from orchestrator.parsers._nccl_common import (
    NCCL_LINE,
    NCCL_VERSION,
    Failure,
    NcclOutOfBounds,
    NcclRank,
    NcclRow,
    NcclTestsRun,
    check_avg,
    count_ranks,
    decode_version_code,
    failure_kind,
    harmless_warning,
    recompute_avg,
)
from orchestrator.parsers._nccl_table import KIND, _inferred_columns, _Layout, _row
from orchestrator.parsers._nccl_tests_json import parse_json_run
from orchestrator.parsers._noise import NoiseReader, stream_without_prefix

__all__ = ["NcclRow", "NcclTestsRun", "check_avg", "parse_nccl_tests", "parse_nccl_tests_json"]

# A log holds one table row per message size and round of sizes: a sweep from 8 B to
# 16 GiB is 32 rows, a fine `-i` sweep a few thousand. Past MAX_ROWS a file is no
# nccl-tests run this reads (each row becomes six measurements per round): refused,
# with the line it stopped at, before the rest is read. docs/reliability.md (limits).
MAX_ROWS = 10_000

# Header lines, each with its `#` optional: GitHub Markdown turns a pasted
# `# ...` line into a heading and the `#` is gone from what people copy back.
_VERSION = re.compile(r"^#?\s*nccl-tests version (?P<ver>\S+)(?: \((?P<hash>[0-9a-f]{7,40})\))?"
                      r" nccl-headers=(?P<hdr>\d+) nccl-library=(?P<lib>\d+)")
_STARTING = re.compile(r"^#?\s*Collective test starting: (?P<bin>\S+)")
_CONCLUDED = re.compile(r"^#?\s*Collective test concluded: \S+")
_PARAMS = re.compile(r"^#?\s*nThread \d+ ")
_PARAM = re.compile(r"\s*(?P<key>[A-Za-z][A-Za-z_ ]*?):?\s+(?P<val>-?\d+)(?:\((?P<mode>\w+)\))?")
_RANK = re.compile(
    r"^#?\s*Rank\s+(?P<rank>\d+)(?:\s+Group\s+(?P<group>\d+))?(?:\s+Pid\s+(?P<pid>\d+))?"
    r"\s+on\s+(?P<host>\S+)\s+device\s+(?P<dev>\d+)\s+\[(?P<bus>[^\]]+)\]\s+(?P<name>.*?)\s*$")
_COLUMNS = re.compile(r"^#?\s+(size|bytes)\s+(count|N)\s")
_HEADER_TEXT = re.compile(r"^#?\s*(?:\(B\)\s+\(elements\)|out-of-place\b.*\bin-place|Using devices"
                          r"|Initializing (?!SSH\b)\w+|Writing JSON output to )")
_NOTE = re.compile(r"^#?\s*(Blocking|Parallel Init|Per-Iteration|Reducing maxBytes)")
_OOB = re.compile(r"^#? ?Out of bounds values\s*: (?P<n>\d+) (?P<res>OK|FAILED)")
_AVG = re.compile(r"^#? ?Avg bus bandwidth\s*: (?P<bw>\S+)\s*(?P<chk>OK|FAILED)?\s*$")
_ROW_START = re.compile(r"^\s*\d+\s+\d+\s")
# `comm 0x... rank 3 nranks 16 ...` (Init COMPLETE) and `... nRanks 16 nNodes 2 ...`
_NCCL_NRANKS = re.compile(r"\bn[Rr]anks (\d+)\b")
_NCCL_NNODES = re.compile(r"\bnNodes (\d+)\b")
# command lines pasted with the log: the launcher's process count and node count, the
# binary's GPUs and threads per process and its sizes
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
    def __init__(self, source: str | None) -> None:
        self.source = source
        self.binary: str | None = None
        self.tests_version: str | None = None
        self.git_hash: str | None = None
        self.headers: str | None = None
        self.library: str | None = None
        self.nccl_version: str | None = None
        self.nccl_cuda: str | None = None
        self.params: dict[str, int | str] = {}
        self.params_line = 0
        self.notes: list[str] = []
        self.ranks: list[NcclRank] = []
        self.rank_lines: list[int] = []  # where the rank lines are
        self.rows: list[NcclRow] = []
        self.failures: list[Failure] = []
        self.layout: _Layout | None = None
        self.oob: NcclOutOfBounds | None = None
        self.avg: float | None = None
        self.avg_check: str | None = None
        self.footer = 0  # the line the table ended at, 0 while it has not
        self.partial: tuple[int, str] | None = None
        self.noise = NoiseReader()
        self.nccl_lines = 0
        self.nccl_ranks: int | None = None
        self.nccl_nodes: int | None = None
        self.command: dict[str, int] = {}
        self.rows_elided = False
        self.command_binary: str | None = None  # the binary a pasted command line ran

    def fail(self, what: str, line_no: int | None = None, line: str | None = None) -> ParseError:
        return ParseError(KIND, what, line_no=line_no, line=line, source=self.source)

    def hash_lost(self, line: str, line_no: int) -> None:
        if not line.lstrip().startswith("#"):
            self.noise.edit(line_no, "the `#` that starts nccl-tests' header lines is missing "
                            "(GitHub Markdown makes such lines headings)")


def _other(st: _State, line: str, line_no: int) -> bool:
    """Record what a line that is no table row says; False when it is not known at all."""
    stripped = line.strip()
    m = NCCL_LINE.match(line)
    if m:
        st.nccl_lines += 1
        if m["level"] == "WARN" and harmless_warning(m["msg"]):
            st.noise.ignore(line_no, "nccl-warn-harmless", line)
        elif m["level"] in ("WARN", "ABORT", "ERROR"):
            st.failures.append(Failure(line_no=line_no, kind="nccl-warn", text=stripped))
        elif n := _NCCL_NRANKS.search(m["msg"]):
            st.nccl_ranks = max(st.nccl_ranks or 0, int(n[1]))
            if nn := _NCCL_NNODES.search(m["msg"]):
                st.nccl_nodes = max(st.nccl_nodes or 0, int(nn[1]))
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
    if not stripped:
        return True
    if st.noise.skip(line_no, line):
        last = st.noise.ignored[-1] if st.noise.ignored else None
        if last is not None and last.line_no == line_no:
            if last.kind in ("command-line", "shell-prompt", "shell-trace") and not st.footer:
                named, said = command_facts(stripped)
                st.command_binary = st.command_binary or named
                for opt_name, opt_value in said.items():
                    st.command.setdefault(opt_name, opt_value)
            elif last.kind == "elision" and st.layout is not None and not st.footer:
                st.rows_elided = True
        return True
    if _HEADER_TEXT.match(line) or stripped.strip("#").strip() == "":
        return True  # nccl-tests' own decoration: `#`, the column titles' second lines
    if stripped.startswith("#"):
        st.noise.ignore(line_no, "comment", line)
        return True
    return False


def _cuda(suffix: str | None) -> str | None:
    return suffix[4:] if suffix and suffix.startswith("cuda") else None


def _second_run(st: _State, line: str, line_no: int) -> ParseError:
    if st.footer:
        return st.fail(f"a second run starts here, after the first run's table ended at line "
                       f"{st.footer}: several runs were saved into one file; keep one run per "
                       "file", line_no, line)
    return st.fail(f"a second run header (the first at line {st.params_line}): several "
                   "independent runs wrote into one log (a non-MPI build under mpirun?)",
                   line_no, line)


def _header_line(st: _State, line: str, line_no: int) -> bool:
    """Lines before the table: banner, parameters, devices, column header."""
    if m := _VERSION.match(line):
        st.tests_version, st.git_hash = m["ver"], m["hash"]
        st.headers = decode_version_code(int(m["hdr"]))
        st.library = decode_version_code(int(m["lib"]))
    elif m := _STARTING.match(line):
        st.binary = m["bin"]
    elif _PARAMS.match(line):
        if st.params:
            raise _second_run(st, line, line_no)
        st.params, st.params_line = _params(line, line_no, st.source), line_no
    elif m := _RANK.match(line):
        st.rank_lines.append(line_no)
        st.ranks.append(NcclRank(
            rank=int(m["rank"]), group=int(m["group"]) if m["group"] else None,
            pid=int(m["pid"]) if m["pid"] else None, host=m["host"], device=int(m["dev"]),
            bus_id=m["bus"], name=m["name"]))
    elif _COLUMNS.match(line):
        st.layout = _Layout(line.lstrip().lstrip("#").split(), line_no, line, st.source)
    elif _NOTE.match(line):
        st.notes.append(line.lstrip("# ").rstrip())
    elif _HEADER_TEXT.match(line) and line.strip():
        pass
    else:
        return False
    st.hash_lost(line, line_no)
    return True


def _headerless(st: _State, line: str, line_no: int) -> bool:
    """A row before any column header: the table was pasted without it."""
    if not _ROW_START.match(line):
        return False
    names = _inferred_columns(line.split())
    if names is None:
        return False
    st.layout = _Layout(names, line_no, line, st.source)
    st.noise.edit(line_no, f"no column header above the first row: the columns were read "
                  f"from the rows' shape ({' '.join(names[:st.layout.width - 2 * st.layout.half])}"
                  f" + {' '.join(names[-st.layout.half:])} twice)")
    return True


def _table_line(st: _State, line: str, line_no: int) -> None:
    assert st.layout is not None
    if _ROW_START.match(line):
        toks = st.layout.fit(line.split())
        if len(toks) != st.layout.width:
            if failure_kind(line):  # the crash message continued the row's line
                st.failures.append(Failure(line_no=line_no, kind=failure_kind(line) or "",
                                           text=line.strip()))
                st.partial = (line_no, line)
                return
            if st.partial is not None:
                _raise_partial(st)
            st.partial = (line_no, line)  # fine only if nothing but noise follows
            return
        if st.partial is not None:
            _raise_partial(st)
        if len(st.rows) >= MAX_ROWS:
            raise st.fail(f"more than {MAX_ROWS:,} table rows: not one nccl-tests run this "
                          "reads (a sweep of every size prints a few thousand at most); keep "
                          "one run per file", line_no, line)
        try:
            row = _row(toks, st.layout, line_no)
        except ValueError as exc:
            raise st.fail(f"malformed table row ({exc})", line_no, line) from None
        st.rows.append(row)
        for res in (row.out_of_place, row.in_place):
            if res.wrong:
                st.failures.append(Failure(line_no=line_no, kind="wrong", text=line.strip()))
                break
    elif m := _OOB.match(line.strip()):
        if st.partial is not None:
            _raise_partial(st)
        st.oob = NcclOutOfBounds(count=int(m["n"]), ok=m["res"] == "OK")
        st.footer = line_no
        st.hash_lost(line, line_no)
        if m["res"] == "FAILED":
            st.failures.append(Failure(line_no=line_no, kind="out-of-bounds", text=line.strip()))
    elif _PARAMS.match(line) or _COLUMNS.match(line):
        raise _second_run(st, line, line_no)
    elif _HEADER_TEXT.match(line) and line.strip():
        st.hash_lost(line, line_no)
    elif not _other(st, line, line_no):
        raise st.fail("line in the results table is neither a row nor known noise", line_no,
                      line)


def _raise_partial(st: _State) -> None:
    assert st.partial is not None and st.layout is not None
    line_no, line = st.partial
    raise st.fail(f"table row has {len(line.split())} fields, the header announces "
                  f"{st.layout.width}", line_no, line)


def _footer_line(st: _State, line: str, line_no: int) -> None:
    if m := _AVG.match(line.strip()):
        try:
            st.avg = float(m["bw"])
        except ValueError:
            raise st.fail("the average bus bandwidth is not a number", line_no, line) from None
        st.avg_check = m["chk"]
        st.hash_lost(line, line_no)
        if m["chk"] == "FAILED":
            st.failures.append(Failure(line_no=line_no, kind="min-bw", text=line.strip()))
    elif _PARAMS.match(line) or _STARTING.match(line) or _COLUMNS.match(line):
        raise _second_run(st, line, line_no)
    elif _CONCLUDED.match(line):
        st.hash_lost(line, line_no)
    elif not _other(st, line, line_no):
        st.noise.ignore(line_no, "unknown", line)


def parse_nccl_tests(text: str, source: str | None = None) -> NcclTestsRun:
    st = _State(source)
    lines, prefix = stream_without_prefix(text)  # line by line: no list of every line
    for line_no, raw in enumerate(lines, start=1):
        line = raw.rstrip("\r")
        if st.footer:
            _footer_line(st, line, line_no)
        elif st.layout is not None:
            _table_line(st, line, line_no)
        elif _footer_without_table(st, line, line_no) or _header_line(st, line, line_no):
            continue
        elif _headerless(st, line, line_no):
            _table_line(st, line, line_no)
        elif not _other(st, line, line_no):
            st.noise.ignore(line_no, "unknown", line)
    _check_ranks(st)
    if not st.params and st.layout is None:
        raise ParseError(KIND, "no nccl-tests parameters line (`# nThread ...`) or results "
                         "table found", source=source)
    if not st.params and st.rows:
        st.noise.edit(st.rows[0].line_no, "no parameters line (`# nThread ...`): the paste "
                      "starts below it, so the GPU count and iterations are unknown")
    run = _finish(st)
    run.launcher_prefix = prefix
    return run


def _footer_without_table(st: _State, line: str, line_no: int) -> bool:
    """The footer where no table was pasted: the rows were cut, by an elision that stands
    for them (`# ... (truncated NCCL output for brevity) ...`) or without a mark, below the
    run's own header (parameters or rank lines). A crash leaves no footer."""
    marked = any(i.kind == "elision" for i in st.noise.ignored)
    if not marked and not (st.params or st.ranks):
        return False
    m = _OOB.match(line.strip())
    if m:
        st.oob = NcclOutOfBounds(count=int(m["n"]), ok=m["res"] == "OK")
        if m["res"] == "FAILED":
            st.failures.append(Failure(line_no=line_no, kind="out-of-bounds", text=line.strip()))
    elif not _AVG.match(line.strip()):
        return False
    st.footer = line_no
    st.rows_elided = True
    if not marked:
        st.noise.edit(line_no, "the footer is pasted without the table above it: the rows "
                      "were cut out")
    if not m:
        _footer_line(st, line, line_no)
    return True


def _check_ranks(st: _State) -> None:
    """Every rank once: the same rank from several processes is several runs in one log.

    The same rank twice from one process (same host and pid) is no second run: a rank line
    was altered by hand, and is read as an edit.
    """
    seen: dict[int, list[NcclRank]] = {}
    for r in st.ranks:
        seen.setdefault(r.rank, []).append(r)
    for rs in seen.values():
        if len(rs) > 1 and rs[0].pid is not None and len({(r.host, r.pid) for r in rs}) == 1:
            st.noise.edit(None, f"rank {rs[0].rank} is listed {len(rs)} times by one process "
                          f"(pid {rs[0].pid} on {rs[0].host}): a rank line was altered")
            for extra in rs[1:]:
                st.ranks.remove(extra)
            seen[rs[0].rank] = rs[:1]
    dup = next((rs for rs in seen.values() if len(rs) > 1), None)
    if dup is not None:
        shown = ", ".join(f"pid {r.pid} on {r.host}" for r in dup[:4])
        raise st.fail(f"rank {dup[0].rank} is listed {len(dup)} times ({shown}"
                      f"{' ...' if len(dup) > 4 else ''}): independent single-process runs "
                      "wrote into one log; build nccl-tests with MPI=1 to run across processes")


def _finish(st: _State) -> NcclTestsRun:
    st.binary = st.binary or st.command_binary
    nccl = st.nccl_version or st.library
    git_hash = st.git_hash
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
        avg_busbw_agrees=None, failures=st.failures, truncated=not st.footer,
        ignored_lines=st.noise.ignored, ignored_lines_dropped=st.noise.dropped,
        edits=st.noise.edits, nccl_lines=st.nccl_lines, nccl_ranks=st.nccl_ranks,
        nccl_nodes=st.nccl_nodes, command=st.command, rows_elided=st.rows_elided)
    run.avg_busbw_agrees = check_avg(run)
    run.ranks_total = count_ranks(run)
    for what in run.ranks_total.disagreements:
        st.noise.edit(st.rank_lines[0] if st.rank_lines else None,
                      f"{what}: rank lines were cut or altered; the run is read as "
                      f"{run.ranks_total.count} ranks")
    run.edits = list(st.noise.edits)
    return run


def _op(binary: str | None) -> str | None:
    if not binary:
        return None
    name = binary.rsplit("/", 1)[-1]
    return name.split("_perf")[0] if "_perf" in name else None


def parse_nccl_tests_json(text: str, source: str | None = None) -> NcclTestsRun:
    return parse_json_run(text, source, op_of=_op)


# Registered without decorating, so callers keep the precise return type.
register(KIND, "text log of an nccl-tests *_perf run (any version since 2.0)",
          example="./build/all_reduce_perf -b 8 -e 128M -f 2 -g 8 | tee all-reduce-1.log")(parse_nccl_tests)
register("nccl-tests-json", "the -J JSON output of an nccl-tests *_perf run (2.17.6+)",
          example="./build/all_reduce_perf -b 8 -e 128M -f 2 -g 8 -J all-reduce-1.json")(
    parse_nccl_tests_json)
