"""NVIDIA's `nvbandwidth`: for each test, a matrix (CPU or GPU rows, GPU or CPU columns,
GB/s or ns), its SUM and, since v0.10, its coefficient of variation.

Versions differ in their preamble (v0.10 prints none with some options), in the
notes they print and in how they waive a test that does not apply (`Waived:`).
A test that fails mid-run (nvbandwidth checks the copied pattern and asserts)
leaves its error lines: they are kept as errors, the test as incomplete. An excerpt
that elides its preamble (`...`) still gives its matrices: a matrix without a
`Running` line takes its test's name from the SUM line after it. The multi-node form
(`mpirun ... nvbandwidth -p multinode`, the GB200 NVL72 multi-node NVLink check) lists one
`Process N (host): device M: NAME (bus)` line per MPI rank and runs `multinode_*` tests
whose rows and columns are the ranks: each rank's GPU is kept with its host.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

from orchestrator.errors import ParseError
from orchestrator.parsers import register

KIND = "nvbandwidth"

_VERSION = re.compile(r"^nvbandwidth Version: (?P<v>\S+)$")
_HEAD = re.compile(r"^(?P<key>Built from Git version|CUDA Runtime Version|CUDA Driver Version|"
                   r"Driver Version|MPI version): ?(?P<value>.*)$")
_PROCESS = re.compile(r"^Process (?P<rank>\d+) \((?P<host>[^)]*)\): device (?P<index>\d+): "
                      r"(?P<name>.+?) \((?P<bus>[0-9a-fA-F:.]+)\)$")
_DEVICE = re.compile(r"^Device (?P<index>\d+): (?P<name>.+?) \((?P<bus>[0-9a-fA-F:.]+)\)$")
_RUNNING = re.compile(r"^Running (?P<name>\w+)\.$")
_TITLE = re.compile(r"^(?P<title>.+?)(?: bandwidth)? \((?P<unit>GB/s|ns|us)\)$")
_COLUMNS = re.compile(r"^\d+(?:\s+\d+)*$")
_ROW = re.compile(r"^(?P<label>\d+)\s+(?P<values>(?:(?:\d+(?:\.\d+)?|N/A)\s*)+)$")
_SUM = re.compile(r"^SUM (?P<name>\w+) (?P<value>\d+(?:\.\d+)?)$")
_CV = re.compile(r"^COEFFICIENT_OF_VARIATION (?P<name>\w+) (?P<value>\d+(?:\.\d+)?)$")
_NOTES = ("NOTE: ", "Additional system-specific tuning", "Performance can vary with")
_ERRORS = re.compile(r"^(?:ASSERT .*|Invalid value when checking the pattern.*|\[CUDA_ERROR\w*\] .*|"
                     r"Current offset : .*|CUDA_ERROR\w*.*|.*\bfailed\b.*|Error: .*)$")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NvbwDevice(_Model):
    index: int
    name: str
    bus_id: str
    rank: int | None = None  # the MPI rank of a multi-node run (its matrices' row and column)
    host: str | None = None  # the node the rank ran on


class NvbwTest(_Model):
    name: str | None  # e.g. device_to_device_memcpy_read_ce; None until its SUM names it
    title: str | None  # e.g. "memcpy CE GPU(row) <- GPU(column)"
    unit: str | None  # GB/s | ns
    columns: list[int]
    rows: dict[int, list[float | None]]  # row label -> values (None: N/A, the diagonal)
    sum: float | None
    cv: float | None
    errors: list[str]
    line_no: int

    @property
    def complete(self) -> bool:
        return self.sum is not None and not self.errors

    def value(self, row: int, col: int) -> float | None:
        vals = self.rows.get(row)
        if vals is None or col not in self.columns:
            return None
        return vals[self.columns.index(col)]


class NvbandwidthFacts(_Model):
    version: str | None
    cuda_runtime: str | None
    cuda_driver: str | None
    driver: str | None
    devices: list[NvbwDevice]
    tests: list[NvbwTest]
    waived: int
    errors: list[str]  # every error line, wherever it came
    elided: bool
    mpi: str | None = None  # `MPI version:` of a multi-node run

    @property
    def multinode(self) -> bool:
        return any(d.rank is not None for d in self.devices)

    @property
    def hosts(self) -> list[str]:
        return list(dict.fromkeys(d.host for d in self.devices if d.host))

    def test(self, name: str) -> NvbwTest | None:
        return next((t for t in self.tests if t.name == name), None)


def parse_nvbandwidth(text: str, source: str | None = None) -> NvbandwidthFacts:
    head: dict[str, str] = {}
    version: str | None = None
    devices: list[NvbwDevice] = []
    tests: list[NvbwTest] = []
    errors: list[str] = []
    waived = 0
    elided = False
    cur: NvbwTest | None = None
    expect_columns = False
    seen = False
    for no, raw in enumerate(text.splitlines(), 1):
        s = raw.strip()
        if not s:
            continue
        seen = True
        if s == "...":
            elided = True
            continue
        if m := _VERSION.match(s):
            version = m["v"]
            continue
        if m := _HEAD.match(s):
            head[m["key"]] = m["value"].strip()
            continue
        if m := _DEVICE.match(s):
            devices.append(NvbwDevice(index=int(m["index"]), name=m["name"], bus_id=m["bus"]))
            continue
        if m := _PROCESS.match(s):
            devices.append(NvbwDevice(index=int(m["index"]), name=m["name"], bus_id=m["bus"],
                                      rank=int(m["rank"]), host=m["host"]))
            continue
        if s.startswith(_NOTES):
            continue
        if s.startswith("Waived:"):
            waived += 1
            continue
        if m := _RUNNING.match(s):
            cur = NvbwTest(name=m["name"], title=None, unit=None, columns=[], rows={}, sum=None,
                           cv=None, errors=[], line_no=no)
            tests.append(cur)
            continue
        if m := _SUM.match(s):
            cur = _test_for(tests, m["name"], cur, no, raw, source)
            cur.sum = float(m["value"])
            continue
        if m := _CV.match(s):
            t = next((t for t in reversed(tests) if t.name == m["name"]), None)
            if t is None:
                raise ParseError(KIND, "a coefficient of variation for a test not run",
                                 line_no=no, line=raw, source=source)
            t.cv = float(m["value"])
            continue
        if _ERRORS.match(s):
            errors.append(s)
            if cur is not None:
                cur.errors.append(s)
            continue
        if (m := _TITLE.match(s)) and not _ROW.match(s):
            if cur is None or cur.title is not None:  # a matrix whose Running line was elided
                cur = NvbwTest(name=None, title=None, unit=None, columns=[], rows={}, sum=None,
                               cv=None, errors=[], line_no=no)
                tests.append(cur)
            cur.title, cur.unit = m["title"], m["unit"]
            expect_columns = True
            continue
        if expect_columns and _COLUMNS.match(s) and cur is not None:
            cur.columns = [int(x) for x in s.split()]
            expect_columns = False
            continue
        if (m := _ROW.match(s)) and cur is not None and cur.columns:
            vals = m["values"].split()
            if len(vals) != len(cur.columns):
                raise ParseError(KIND, f"{len(vals)} values, the matrix has {len(cur.columns)} "
                                 "columns", line_no=no, line=raw, source=source)
            cur.rows[int(m["label"])] = [None if v == "N/A" else float(v) for v in vals]
            continue
        raise ParseError(KIND, "not an nvbandwidth line (preamble, test, matrix, SUM)",
                         line_no=no, line=raw, source=source)
    if not seen:
        raise ParseError(KIND, "empty output", source=source)
    if not tests and version is None:
        raise ParseError(KIND, "no `nvbandwidth Version` and no test: not nvbandwidth's output",
                         source=source)
    return NvbandwidthFacts(version=version, cuda_runtime=head.get("CUDA Runtime Version"),
                            cuda_driver=head.get("CUDA Driver Version"),
                            driver=head.get("Driver Version"), devices=devices, tests=tests,
                            waived=waived, errors=errors, elided=elided,
                            mpi=head.get("MPI version"))


def _test_for(tests: list[NvbwTest], name: str, cur: NvbwTest | None, no: int, raw: str,
              source: str | None) -> NvbwTest:
    """The test a SUM line closes: the one running, or an unnamed matrix just above."""
    if cur is not None and cur.name in (None, name):
        cur.name = name
        return cur
    raise ParseError(KIND, f"SUM for {name!r} outside its test", line_no=no, line=raw,
                     source=source)


# Registered without decorating, as dmon is: mutmut leaves decorated functions alone,
# so the parser itself would go unmeasured.
register(KIND, "nvbandwidth (and -p multinode): bandwidth/latency matrix, SUM and variation "
         "per test, each MPI rank's GPU and host",
         example='./nvbandwidth  (or ./nvbandwidth -t device_to_device_memcpy_read_ce)')(parse_nvbandwidth)
