"""`dcgmi diag -r N`: DCGM's diagnostic table, one row per test, grouped in sections
(Metadata, Deployment, Integration, Hardware, Stress).

A result is `Pass`, `Fail`, `Warn`, `Skip` (with ` - All` or ` - GPU: 0` /
` - GPUs: 1, 2`); a test can take several result rows (passing on some GPUs, failing
on one). `Error`, `Warning` and `Info` rows carry the message of the test above
them, wrapped at the column width mid-word: the pieces are joined as DCGM cut them.
A table cut short (a pasted fragment, a killed run) is read as far as it goes and
marked incomplete; a line that is not part of the table is an error naming it.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

from orchestrator.errors import ParseError
from orchestrator.parsers import register

KIND = "dcgmi-diag"

STATUSES = {"pass": "Pass", "fail": "Fail", "warn": "Warn", "warning": "Warn", "skip": "Skip",
            "not run": "Not Run", "n/a": "N/A"}
MESSAGE_ROWS = {"error": "Error", "warning": "Warning", "info": "Info"}
METADATA = {"dcgm version": "dcgm_version", "driver version detected": "driver_version",
            "gpu device ids detected": "device_ids"}

_BORDER = re.compile(r"^\+[-=]+\+[-=]+\+$")
_SECTION = re.compile(r"^[|+]-+\s+(?P<name>[A-Za-z][A-Za-z ]*?)\s+-+\+-+[|+]$")
_ROW = re.compile(r"^\|(?P<name>[^|]*)\|(?P<value>.*?)(?:\|)?$")
_RESULT = re.compile(r"^(?P<status>Pass|Fail|Warn|Warning|Skip|Not Run|N/A)"
                     r"(?: - (?:(?P<all>All)|GPUs?: (?P<gpus>[\d, ]+)))?$", re.I)
_PREAMBLE = re.compile(r"^(Successfully ran diagnostic for group\.|Running diagnostic.*)$")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DiagResult(_Model):
    status: str  # Pass | Fail | Warn | Skip | Not Run | N/A
    gpus: list[int] | None  # None: all the GPUs of the run (` - All`, or no list)


class DiagMessage(_Model):
    kind: str  # Error | Warning | Info
    text: str
    line_no: int


class DiagTest(_Model):
    section: str | None
    name: str
    results: list[DiagResult]
    messages: list[DiagMessage]
    line_no: int

    @property
    def failed(self) -> bool:
        return any(r.status == "Fail" for r in self.results) or any(
            m.kind == "Error" for m in self.messages)


class DcgmiDiagFacts(_Model):
    dcgm_version: str | None
    driver_version: str | None
    device_ids: list[str]
    tests: list[DiagTest]
    messages: list[DiagMessage]  # rows not under a test (an Error of the Deployment section)
    header: bool  # the `Diagnostic | Result` heading was seen
    complete: bool  # the table's closing border was seen after its last row

    @property
    def failed(self) -> list[DiagTest]:
        return [t for t in self.tests if t.failed]

    @property
    def errors(self) -> list[DiagMessage]:
        return [m for m in self.messages if m.kind == "Error"] + [
            m for t in self.tests for m in t.messages if m.kind == "Error"]


def _cell(text: str) -> str:
    """A cell's text without the separator space and the padding."""
    return (text[1:] if text.startswith(" ") else text).rstrip()


def parse_dcgmi_diag(text: str, source: str | None = None) -> DcgmiDiagFacts:
    meta: dict[str, str] = {}
    tests: list[DiagTest] = []
    loose: list[DiagMessage] = []
    section: str | None = None
    header = False
    complete = False
    current: DiagTest | None = None
    message: DiagMessage | None = None  # the message a continuation row extends
    seen = False
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip()
        if not line.strip():
            continue
        seen = True
        if _PREAMBLE.match(line.strip()):
            continue
        if _BORDER.match(line):
            complete = header or bool(tests)
            continue
        complete = False
        if m := _SECTION.match(line):
            section = m["name"].strip()
            current, message = None, None
            continue
        m = _ROW.match(line)
        if not m:
            raise ParseError(KIND, "not a row of the diagnostic table", line_no=no, line=line,
                             source=source)
        name, value = m["name"].strip(), _cell(m["value"])
        key = name.lower()
        if key == "diagnostic" and value.lower() == "result":
            header = True
            continue
        if not name:  # a continuation row: another result, or more of a message
            if message is not None and not _RESULT.match(value.strip()):
                message.text += value
                continue
            if current is None:
                raise ParseError(KIND, "a continuation row with nothing above it", line_no=no,
                                 line=line, source=source)
            current.results.append(_result(value, no, line, source))
            continue
        if key in METADATA:
            meta[METADATA[key]] = value.strip()
            continue
        if key in MESSAGE_ROWS:
            message = DiagMessage(kind=MESSAGE_ROWS[key], text=value.strip(), line_no=no)
            (current.messages if current is not None else loose).append(message)
            continue
        message = None
        current = DiagTest(section=section, name=name, results=[_result(value, no, line, source)],
                           messages=[], line_no=no)
        tests.append(current)
    if not seen:
        raise ParseError(KIND, "empty output", source=source)
    if not tests and not loose and not meta:
        raise ParseError(KIND, "no diagnostic rows", source=source)
    ids = [x.strip() for x in meta.get("device_ids", "").split(",") if x.strip()]
    return DcgmiDiagFacts(dcgm_version=meta.get("dcgm_version"),
                          driver_version=meta.get("driver_version"), device_ids=ids,
                          tests=tests, messages=loose, header=header, complete=complete)


def _result(value: str, no: int, line: str, source: str | None) -> DiagResult:
    m = _RESULT.match(value.strip())
    if not m:
        raise ParseError(KIND, f"result {value.strip()!r} is not Pass/Fail/Warn/Skip",
                         line_no=no, line=line, source=source)
    status = STATUSES[m["status"].lower()]
    gpus = [int(x) for x in m["gpus"].replace(" ", "").split(",") if x] if m["gpus"] else None
    return DiagResult(status=status, gpus=gpus)


# Registered without decorating, as dmon is: mutmut leaves decorated functions alone,
# so the parser itself would go unmeasured.
register(KIND, "dcgmi diag -r N: DCGM's diagnostic table (tests, results per GPU, messages)",
         example='dcgmi diag -r 1')(parse_dcgmi_diag)
