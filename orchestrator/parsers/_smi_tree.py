"""`nvidia-smi -q` text as a tree of sections, read by indentation only.

Kept apart from the facts (`nvidia_smi_q`) because excerpts are the rule, not
the exception: `-q -d X`, `-i N`, `grep -A`/`-C` cuts with their `--`
separators, `sed` ranges that start inside a GPU, a section title pasted at
column 0, and `[...]` where a person cut the middle out. The shared noise
reader passes over prompts, command lines and elisions, and records them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from orchestrator.errors import ParseError
from orchestrator.parsers._noise import NoiseReader

KIND = "nvidia-smi-q"

_KV = re.compile(r"^(?P<ind> *)(?P<key>\S(?:.*?\S)?)\s*:(?: (?P<val>.*?))?\s*$")
_TITLE = re.compile(r"^(?P<ind> *)(?P<key>\S(?:.*\S)?)\s*$")
_GPU = re.compile(r"^GPU (?P<bus>[0-9A-Fa-f]+:[0-9A-Fa-f:.]+)\s*$")
BANNER = re.compile(r"^=+NVSMI LOG=+$")
# Sections that may repeat under one GPU, so seeing them again starts no new GPU.
_REPEATABLE = {"mig device"}


class Node:
    """One line of the tree: a title (value None) or a `Key : value` leaf."""

    __slots__ = ("children", "key", "line", "line_no", "value")

    def __init__(self, key: str, value: str | None, line_no: int, line: str = "") -> None:
        self.key, self.value, self.line_no, self.line = key, value, line_no, line
        self.children: list[Node] = []

    def find(self, *path: str) -> Node | None:
        node: Node | None = self
        for name in path:
            if node is None:
                return None
            want = name.lower()
            node = next((c for c in node.children if c.key.lower() == want), None)
        return node

    def first(self, *names: str) -> Node | None:
        """The first child called by any of `names` (drivers spell keys differently)."""
        return next((n for n in (self.find(name) for name in names) if n is not None), None)

    def all(self, name: str) -> list[Node]:
        return [c for c in self.children if c.key.lower() == name.lower()]

    def walk(self) -> Iterator[Node]:
        for c in self.children:
            yield c
            yield from c.walk()


class Tree:
    """Top-level `Key : value` lines, one root per GPU section (or per excerpt block)."""

    def __init__(self) -> None:
        self.top: dict[str, Node] = {}
        self.roots: list[Node] = []
        self.noise = NoiseReader()
        self.banner = False  # the `==NVSMI LOG==` banner was seen


def read_tree(text: str, source: str | None) -> Tree:
    tree = Tree()
    stack: list[tuple[int, Node]] = []
    banners: list[int] = []
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip("\r")
        s = line.strip()
        if not s or s == "--":  # `--`: grep's context separator
            continue
        if BANNER.fullmatch(s):
            banners.append(no)
            tree.banner = True
            if len(banners) > 1:
                raise ParseError(KIND, f"a second `NVSMI LOG` banner (the first at line "
                                 f"{banners[0]}): several nvidia-smi -q outputs in one text; "
                                 "keep one host's output per file", line_no=no, line=line,
                                 source=source)
            continue
        if tree.noise.skip(no, line):
            continue
        indent = len(line) - len(line.lstrip(" "))
        if "\t" in line[:indent + 1]:
            raise ParseError(KIND, "tab in the indentation (not nvidia-smi -q text)", line_no=no,
                             line=line, source=source)
        kv = _KV.match(line)
        if indent == 0:
            if m := _GPU.fullmatch(s):
                root = Node("GPU", m["bus"], no)
                tree.roots.append(root)
                stack = [(-1, root)]
                continue
            if kv is not None:
                tree.top.setdefault(kv["key"].lower(), Node(kv["key"], kv["val"] or "", no, line))
                stack = []
                continue
            # a section title at column 0: a grep or sed cut that starts at the section
        title = _TITLE.match(line) if kv is None else None
        if kv is None and title is None:
            raise ParseError(KIND, "not a `Key : value` line or a section title", line_no=no,
                             line=line, source=source)
        m2 = kv or title
        assert m2 is not None
        node = Node(m2["key"], (kv["val"] or "") if kv else None, no, line)
        if not stack:
            # an excerpt without its `GPU ...` line: one anonymous GPU per block
            stack = _anonymous(tree, no)
        while len(stack) > 1 and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1]
        if (len(stack) == 1 and parent.value is None and parent.children
                and parent.find(node.key) is not None and node.key.lower() not in _REPEATABLE):
            # the same top-level section again in a `GPU`-less excerpt: the next GPU's
            stack = _anonymous(tree, no)
            parent = stack[0][1]
        parent.children.append(node)
        stack.append((indent, node))
    return tree


def _anonymous(tree: Tree, line_no: int) -> list[tuple[int, Node]]:
    root = Node("GPU", None, line_no)
    tree.roots.append(root)
    return [(-1, root)]
