"""The result table of an nccl-tests log: its column layout (every release's header, the
per-iteration columns, a table whose header was lost inferred from its rows) and one row
read against it. `nccl_tests.py` reads the log around it."""

from __future__ import annotations

import re

from orchestrator.errors import ParseError
from orchestrator.parsers._nccl_common import (
    NcclPerIter,
    NcclResult,
    NcclRow,
)

KIND = "nccl-tests"

_LEAD = ("size", "count", "type", "redop", "root")
_PER_ITER = ("i_min", "i_max", "i_p99", "i_cv%")
_HALF_NEW = ["time", "algbw", "busbw", "#wrong"]
_HALF_OLD = ["time", "algbw", "busbw", "error"]


def _is_num(tok: str) -> bool:
    try:
        float(tok)
    except ValueError:
        return tok == "N/A"
    return True


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
        # alltoall and all_gather before 2.13, and hypercube since, print nothing in the
        # redop cell the header names: such a row is one field short
        self.redop_at = self.lead.index("redop") if "redop" in self.lead else None

    def fit(self, toks: list[str]) -> list[str]:
        """The row's tokens, with the empty redop cell put back where the tool left it."""
        if (len(toks) == self.width - 1 and self.redop_at is not None
                and _is_num(toks[self.redop_at])):
            return toks[:self.redop_at] + ["none"] + toks[self.redop_at:]
        return toks


def _inferred_columns(toks: list[str]) -> list[str] | None:
    """The column names of a row pasted without its header, from the row's own shape.

    Only the layouts nccl-tests has printed are considered: 2.13+ (`redop root ...
    #wrong`), and the older ones with an `error` column with a `redop`, a `root`, or
    neither. A shape that fits none of them stays unread.
    """
    if len(toks) < 11 or not (toks[0].isdigit() and toks[1].isdigit()) or _is_num(toks[2]):
        return None
    third = toks[3]
    if len(toks) == 13 and not _is_num(third) and re.fullmatch(r"-?\d+", toks[4]):
        return ["size", "count", "type", "redop", "root", *_HALF_NEW, *_HALF_NEW]
    if len(toks) == 12 and not _is_num(third):
        return ["size", "count", "type", "redop", *_HALF_OLD, *_HALF_OLD]
    if len(toks) == 12 and re.fullmatch(r"-?\d+", third):
        return ["size", "count", "type", "root", *_HALF_OLD, *_HALF_OLD]
    if len(toks) == 11:
        return ["size", "count", "type", *_HALF_OLD, *_HALF_OLD]
    return None


def _num(tok: str) -> float:
    return float(tok)


def _result(toks: list[str], layout: _Layout) -> NcclResult:
    wrong: int | None = None
    max_error: float | None = None
    if toks[3] != "N/A":
        if layout.error_col:
            max_error = _num(toks[3])
        else:
            wrong = int(_num(toks[3]))  # `%6g`: a large count prints as 1.67772e+07
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
