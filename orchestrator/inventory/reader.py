"""An inventory's bytes as plain data that remembers the line of every key and item.

An inventory may come from anyone, so the file is read defensively: at most
``MAX_BYTES``, UTF-8 without NUL or control characters, nesting at most
``MAX_DEPTH`` deep and at most ``MAX_VALUES`` values once aliases are
expanded (a "billion laughs" file is refused in milliseconds). YAML is read
as an event stream with ruamel's pure safe parser, whose time is linear in
the length of comments and whose nesting does not recurse; the round-trip
loader is quadratic on long comments.

Reading builds the data itself rather than asking ruamel for it, so every
key and item keeps the line it is written on: a problem found later, by
pydantic or by a check between values, is reported there. What makes a text
unreadable as a whole (too big, not UTF-8, a syntax error, an alias bomb)
raises ``Refused`` with one problem; what spoils one value (a duplicate key,
a YAML tag, an unreadable scalar) is kept in ``Source.problems`` so that it
is reported together with everything else.

Nothing here knows the inventory's schema: this module is YAML and limits.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any, NamedTuple

from ruamel.yaml import YAML
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.events import (
    AliasEvent,
    CollectionEndEvent,
    DocumentStartEvent,
    MappingStartEvent,
    ScalarEvent,
    SequenceStartEvent,
)
from ruamel.yaml.nodes import ScalarNode

from orchestrator.files import open_regular

MAX_BYTES = 128 * 1024  # ~2500 nodes; ruamel's pure parser reads 100-250 KB/s
MAX_DEPTH = 64
MAX_VALUES = 20_000  # scalars and collections, aliases expanded: ~2500 nodes; ~0.5 s of parsing

Loc = tuple[Any, ...]  # a path in the data: mapping keys and list indexes, from the top


class Problem(NamedTuple):
    """One thing wrong, where it is written: the line (None: the file as a whole) and key path."""

    line: int | None
    loc: Loc
    msg: str


class Refused(Exception):
    """The text cannot be read as an inventory at all: one problem, nothing else checked."""

    def __init__(self, line: int | None, msg: str) -> None:
        super().__init__(msg)
        self.problem = Problem(line, (), msg)


_NOT_YAML_CHARS = re.compile("[^\t\n\r\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def read_text(p: Path, what: str = "an inventory") -> str:
    """The file's text, refused before parsing when it is too big, not UTF-8 or holds NULs.
    `what` names the document in the messages ("a suite" reads the same way)."""
    try:
        st = p.stat()
    except FileNotFoundError:
        raise Refused(None, "no such file") from None
    except OSError as exc:
        raise Refused(None, f"cannot read it: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise Refused(None, "not a regular file")
    too_big = f"larger than {MAX_BYTES // 1024} KiB, far more than {what} needs" + (
        "; split the fleet into several inventories" if what == "an inventory" else "")
    if st.st_size > MAX_BYTES:
        raise Refused(None, too_big)
    try:  # opened without blocking: a FIFO put in its place since the stat is named, not waited on
        with os.fdopen(open_regular(p), "rb") as fh:
            raw = fh.read(MAX_BYTES + 1)
    except OSError as exc:
        raise Refused(None, f"cannot read it: {exc.strerror}") from None
    if len(raw) > MAX_BYTES:
        raise Refused(None, too_big)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        col = exc.start - raw.rfind(b"\n", 0, exc.start)
        raise Refused(line, f"byte {exc.start} (0x{raw[exc.start]:02x}, column {col}) is not "
                            "UTF-8: save the file as UTF-8") from None
    text = text.removeprefix("\ufeff")
    m = _NOT_YAML_CHARS.search(text)
    if m:
        line = text.count("\n", 0, m.start()) + 1
        col = m.start() - text.rfind("\n", 0, m.start())
        char = "a NUL character" if m.group() == "\0" else f"control character U+{ord(m.group()):04X}"
        raise Refused(line, f"{char} at column {col}: {what} is plain text")
    return text


_TAG = "tag:yaml.org,2002:"
_SCALAR_TAGS = frozenset(_TAG + t for t in ("str", "int", "float", "bool", "null"))
_MERGE_TAG = _TAG + "merge"
_PLAIN_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*\Z")
_WORDS = frozenset(["true", "false", "null"])  # the YAML 1.2 core schema's words
_PLAIN_INT = re.compile(r"-?[1-9][0-9]{0,17}\Z")


class _Key:
    """Markers for the state of a mapping being built."""

    NONE = object()  # the next scalar is a key
    SKIP = object()  # the key was refused; drop its value
    MERGE = object()  # '<<'


class _Frame:
    """A mapping or list being built, with what the limits need: its weight and height."""

    __slots__ = ("container", "anchor", "line", "loc", "weight", "height", "key", "key_line",
                 "merges")

    def __init__(self, container: dict[Any, Any] | list[Any], anchor: str | None, line: int,
                 loc: Loc) -> None:
        self.container = container
        self.anchor = anchor
        self.line = line
        self.loc = loc
        self.weight = 1  # values below, aliases expanded
        self.height = 1
        self.key: Any = _Key.NONE
        self.key_line = line
        self.merges: list[tuple[Any, int]] = []


Span = tuple[int, int, "str | None"]  # a scalar's text: start, end, its anchor


class Source:
    """The YAML text as plain data, with the line of every key and item.

    Lines and text spans are kept per container (by identity), so a value
    reached through an alias or a merge key is found where it is written.
    """

    def __init__(self, text: str, what: str = "an inventory") -> None:
        self.text = text
        self.what = what
        self.data: Any = None
        self.root_line = 1
        self.problems: list[Problem] = []
        self._lines: dict[int, dict[Any, int]] = {}
        self._spans: dict[int, dict[Any, Span]] = {}
        self._keep: list[Any] = []  # containers stay alive, so their ids stay theirs
        self._yaml = YAML(typ="safe", pure=True)
        self._build()

    def line_of(self, loc: Loc) -> int:
        """The line of the deepest part of `loc` that is written: a missing key's mapping."""
        node, line = self.data, self.root_line
        for part in loc:
            table = self._lines.get(id(node)) if isinstance(node, (dict, list)) else None
            if table is None or part not in table:
                break
            line, node = table[part], node[part]
        return line

    def span_of(self, container: Any, key: Any) -> Span | None:
        """Where the scalar value of `key` is written, for editing the text in place."""
        return self._spans.get(id(container), {}).get(key)

    def _build(self) -> None:
        """One pass over the parser's events; the limits are checked as each value arrives.

        An alias is counted at its full expanded weight but never copied: it
        is the anchored container itself, so a bomb is refused before it grows.
        """
        anchors: dict[str, tuple[Any, int, int, Span | None]] = {}
        stack: list[_Frame] = []
        total = 0
        line = 1
        try:
            for ev in self._yaml.parse(self.text):
                line = ev.start_mark.line + 1
                if isinstance(ev, ScalarEvent):
                    total += 1
                    value = self._scalar(ev, line, stack)
                    span: Span = (ev.start_mark.index, ev.end_mark.index, ev.anchor)
                    if ev.anchor:
                        anchors[ev.anchor] = (value, 1, 0, span)
                    self._attach(stack, value, line, 1, 0, span)
                elif isinstance(ev, AliasEvent):
                    if ev.anchor not in anchors:
                        why = ("refers to the value that holds it" if any(
                            f.anchor == ev.anchor for f in stack) else "has no anchor before it")
                        raise Refused(line, f"alias *{ev.anchor} {why}")
                    value, weight, height, span_ = anchors[ev.anchor]
                    total += weight
                    if total > MAX_VALUES:
                        raise Refused(line, f"aliases expand the document beyond {MAX_VALUES} "
                                            f"values (alias *{ev.anchor}); write it out plainly")
                    if len(stack) + height > MAX_DEPTH:
                        raise Refused(line, f"alias *{ev.anchor} nests values deeper than "
                                            f"{MAX_DEPTH} levels")
                    self._attach(stack, value, line, weight, height, span_)
                elif isinstance(ev, (MappingStartEvent, SequenceStartEvent)):
                    total += 1
                    if len(stack) >= MAX_DEPTH:
                        raise Refused(line, f"values nested deeper than {MAX_DEPTH} levels")
                    mapping = isinstance(ev, MappingStartEvent)
                    if ev.tag not in (None, "!", _TAG + ("map" if mapping else "seq")):
                        self.problems.append(Problem(line, self._loc_here(stack),
                                                     f"YAML tag {ev.tag} is not allowed here"))
                    container: dict[Any, Any] | list[Any] = {} if mapping else []
                    self._keep.append(container)
                    stack.append(_Frame(container, ev.anchor, line, self._loc_here(stack)))
                elif isinstance(ev, CollectionEndEvent):
                    frame = stack.pop()
                    if frame.merges:
                        self._merge_keys(frame)
                    if frame.anchor:
                        anchors[frame.anchor] = (frame.container, frame.weight, frame.height, None)
                    self._attach(stack, frame.container, frame.line, frame.weight, frame.height,
                                 None)
                elif isinstance(ev, DocumentStartEvent) and (self.data is not None or stack):
                    raise Refused(line, "a second YAML document ('---'): "
                                        f"{self.what} is one document")
                if total > MAX_VALUES:
                    raise Refused(line, f"more than {MAX_VALUES} values (keys, items and "
                                        f"scalars): far more than {self.what} needs; split it")
        except MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            raise Refused(mark.line + 1 if mark is not None else line,
                          f"YAML syntax: {exc.problem or exc.context}") from None
        except YAMLError as exc:
            raise Refused(line, f"YAML: {exc}") from None

    def _loc_here(self, stack: list[_Frame]) -> Loc:
        if not stack:
            return ()
        top = stack[-1]
        if isinstance(top.container, list):
            return (*top.loc, len(top.container))
        if top.key is _Key.NONE:  # a collection used as a key
            return top.loc
        return (*top.loc, top.key)

    def _scalar(self, ev: ScalarEvent, line: int, stack: list[_Frame]) -> Any:
        """A scalar's value as ruamel's safe loader would make it, with quick paths for the
        plain words and integers most of an inventory is."""
        tag = ev.tag
        if tag is not None and tag != "!" and tag not in _SCALAR_TAGS:
            self.problems.append(Problem(line, self._loc_here(stack),
                                         f"YAML tag {tag} is not allowed here"))
            return ev.value
        if tag is None and not ev.implicit[0]:
            tag = _TAG + "str"  # quoted
        elif tag is None and _PLAIN_WORD.match(ev.value) and ev.value.lower() not in _WORDS:
            tag = _TAG + "str"  # most keys and names: skip the resolver's regexes
        elif tag is None and _PLAIN_INT.match(ev.value):
            return int(ev.value)
        elif tag is None or tag == "!":
            tag = str(self._yaml.resolver.resolve(ScalarNode, ev.value, ev.implicit))
        if tag == _MERGE_TAG:
            return _Key.MERGE
        value: Any = ev.value
        if tag != _TAG + "str":
            try:
                value = self._yaml.constructor.construct_object(
                    ScalarNode(tag, ev.value, ev.start_mark, ev.end_mark))
            except (YAMLError, ValueError, OverflowError) as exc:
                self.problems.append(Problem(line, self._loc_here(stack),
                                             f"cannot read {ev.value!r}: {exc}"))
        if isinstance(value, str) and "\0" in value:
            self.problems.append(Problem(line, self._loc_here(stack),
                                         "a NUL character (written as an escape) in a value"))
        return value

    def _attach(self, stack: list[_Frame], value: Any, line: int, weight: int, height: int,
                span: Span | None) -> None:
        """Put a finished value where it belongs: the top, a list item, a key or its value."""
        if not stack:
            self.data, self.root_line = value, line
            return
        top = stack[-1]
        top.weight += weight
        top.height = max(top.height, height + 1)
        c = top.container
        if isinstance(c, list):
            self._lines.setdefault(id(c), {})[len(c)] = line
            c.append("<<" if value is _Key.MERGE else value)
            return
        if top.key is _Key.NONE:
            top.key_line = line
            if isinstance(value, (dict, list)):
                self.problems.append(Problem(line, top.loc, "a key must be a plain value, "
                                                            "not a mapping or a list"))
                top.key = _Key.SKIP
            else:
                top.key = value
            return
        key, key_line = top.key, top.key_line
        top.key = _Key.NONE
        if value is _Key.MERGE:
            value = "<<"
        if key is _Key.SKIP:
            return
        if key is _Key.MERGE:
            top.merges.append((value, key_line))
            return
        lines = self._lines.setdefault(id(c), {})
        if key in c:
            self.problems.append(Problem(key_line, (*top.loc, key),
                                         f"duplicate key {key!r} (first at line {lines[key]})"))
            return
        c[key] = value
        lines[key] = key_line
        if span is not None and not isinstance(value, (dict, list)):
            self._spans.setdefault(id(c), {})[key] = span

    def _merge_keys(self, frame: _Frame) -> None:
        """YAML merge keys ('<<: *defaults'): keys written in the mapping win, then earlier sources."""
        c = frame.container
        assert isinstance(c, dict)
        lines = self._lines.setdefault(id(c), {})
        for value, key_line in frame.merges:
            sources = value if isinstance(value, list) else [value]
            if not all(isinstance(s, dict) for s in sources):
                self.problems.append(Problem(key_line, frame.loc, "'<<' needs a mapping or a list "
                                                                  "of mappings"))
                continue
            for src in sources:
                for key, val in src.items():
                    if key in c:
                        continue
                    c[key] = val
                    lines[key] = self._lines.get(id(src), {}).get(key, key_line)
                    span = self.span_of(src, key)
                    if span is not None:
                        self._spans.setdefault(id(c), {})[key] = span

