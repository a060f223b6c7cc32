"""A parser's refusal, pinned whole: the ParseError of a text given as file `f.txt`, and
its kind, line number, line, source and the first line of its message."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from orchestrator.errors import ParseError

SOURCE = "f.txt"


def refused(fn: Callable[..., object], text: str) -> ParseError:
    """The ParseError `fn` raises on `text` (read as from `f.txt`)."""
    with pytest.raises(ParseError) as exc:
        fn(text, source=SOURCE)
    return exc.value


def is_refusal(e: ParseError, kind: str, what: str, line_no: int | None,
               line: str | None) -> None:
    """`e` is `kind`'s refusal of `line` (line `line_no` of f.txt) for `what`."""
    assert (e.kind, e.line_no, e.line, e.source) == (kind, line_no, line, SOURCE)
    where = SOURCE if line_no is None else f"{SOURCE}:{line_no}"
    assert str(e).split("\n")[0] == f"cannot parse {kind} output at {where}: {what}", str(e)
