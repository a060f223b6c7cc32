"""The shared noise reader and launcher-prefix handling, on exact values and on their limits."""

from __future__ import annotations

import pytest

from orchestrator.parsers._noise import (
    MAX_LISTED,
    IgnoredLine,
    NoiseReader,
    iter_lines,
    split_by_rank,
    stream_without_prefix,
    strip_launcher_prefix,
)


@pytest.mark.parametrize("text", [
    "", "\n", "a", "a\n", "a\nb", "a\r\nb\r\n", "a\rb\n\nc", "\n\nx\n", "a\vb\fc\x1cd\x1de\x1ef",
    "a\x85b\u2028c\u2029d", "x\r\n\r\ny",
])
def test_lines_are_read_one_at_a_time_as_splitlines_reads_them(text: str) -> None:
    assert list(iter_lines(text)) == text.splitlines()


def test_lines_keep_their_first_character_and_no_empty_line_follows_the_last_newline() -> None:
    assert list(iter_lines("abc\ndef\n")) == ["abc", "def"]
    assert list(iter_lines("abc\ndef")) == ["abc", "def"]


# (lines, the lines once read, the launcher named)
PREFIXED = [
    ([], [], None),
    (["", "  "], ["", "  "], None),
    ([" 0: a", " 1: b", "c"], ["a", "b", "c"], "srun --label"),
    ([" 0: a", "b"], ["a", "b"], "srun --label"),  # exactly half: prefixed
    ([" 0: a", "", "b"], ["a", "", "b"], "srun --label"),  # blank lines do not count
    ([" 0: a", "b", "c"], [" 0: a", "b", "c"], None),  # one in three: not prefixed
    (["a", "b", " 0: c", " 1: d"], ["a", "b", "c", "d"], "srun --label"),
    (["12:", "12: x"], ["", "x"], "srun --label"),
    (["[1,0]<stdout>:x", "[1,1]<stderr>:y", "z"], ["x", "y", "z"], "mpirun --tag-output"),
    (["[1,0]<stdout>:[1,0]<stdout>:x", "y"], ["[1,0]<stdout>:x", "y"], "mpirun --tag-output"),
    ([" 3: 4: x", "y"], ["4: x", "y"], "srun --label"),
]


@pytest.mark.parametrize(("lines", "read", "who"), PREFIXED)
def test_a_launcher_prefix_is_stripped_only_from_half_the_lines_or_more(
        lines: list[str], read: list[str], who: str | None) -> None:
    assert strip_launcher_prefix(lines) == (read, who)
    stream, name = stream_without_prefix("\n".join(lines))
    assert (list(stream), name) == (read, who)


def test_split_by_rank_orders_ranks_as_numbers() -> None:
    text = "".join(f" {r}: line of rank {r}\n" for r in (10, 2, 1))
    split = split_by_rank(text)
    assert split is not None
    who, parts = split
    assert who == "srun --label"
    assert list(parts) == ["1", "2", "10"]
    assert parts == {"1": "line of rank 1\n", "2": "line of rank 2\n", "10": "line of rank 10\n"}


def test_a_fresh_reader_holds_nothing() -> None:
    n = NoiseReader()
    assert (n.ignored, n.dropped, n.edits, n.in_banner) == ([], 0, [], False)


def test_past_max_listed_lines_are_counted_not_listed() -> None:
    n = NoiseReader()
    for i in range(MAX_LISTED):
        n.ignore(i, "unknown", "x")
    assert len(n.ignored) == MAX_LISTED and n.dropped == 0
    n.ignore(MAX_LISTED, "unknown", "x")
    assert len(n.ignored) == MAX_LISTED and n.dropped == 1
    n.ignore(MAX_LISTED + 1, "unknown", "x")
    assert len(n.ignored) == MAX_LISTED and n.dropped == 2
    assert n.ignored[-1] == IgnoredLine(line_no=MAX_LISTED - 1, kind="unknown", text="x")


def test_an_ignored_line_keeps_its_indent_and_300_characters() -> None:
    n = NoiseReader()
    n.ignore(4, "comment", "   # a note   \n")
    n.ignore(5, "unknown", "y" * 301)
    assert n.ignored == [IgnoredLine(line_no=4, kind="comment", text="   # a note"),
                         IgnoredLine(line_no=5, kind="unknown", text="y" * 300)]


def test_an_openmpi_banner_is_named_on_its_rules_and_between_them() -> None:
    n = NoiseReader()
    block = ["-" * 20, "anything at all", "-" * 20, "after"]
    assert [n.kind(ln) for ln in block] == ["openmpi-banner"] * 3 + [None]
    assert not n.in_banner
    n = NoiseReader()
    assert [n.skip(i, ln) for i, ln in enumerate(block, 1)] == [True, True, True, False]
    assert [(i.line_no, i.kind, i.text) for i in n.ignored] == [
        (1, "openmpi-banner", "-" * 20), (2, "openmpi-banner", "anything at all"),
        (3, "openmpi-banner", "-" * 20)]
    assert NoiseReader().kind("-" * 19) is None
