"""`dcgmi diag -r N`: DCGM's diagnostic table, one row per test, grouped in sections
(Metadata, Deployment, Integration, Hardware, Stress).

A result is `Pass`, `Fail`, `Warn`, `Skip` (with ` - All` or ` - GPU: 0` /
` - GPUs: 1, 2`); a test can take several result rows (passing on some GPUs, failing
on one). `Error`, `Warning` and `Info` rows carry the message of the test above
them, wrapped at the column width mid-word: the pieces are joined as DCGM cut them, and a
piece that ended in a space (lost to the column's padding) gets its space back.
A table cut short (a pasted fragment, a killed run) is read as far as it goes and
marked incomplete; a line that is not part of the table is an error naming it.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel, ConfigDict

from orchestrator.errors import ParseError
from orchestrator.parsers import register

KIND = "dcgmi-diag"

STATUSES = {"pass": "Pass", "fail": "Fail", "warn": "Warn", "warning": "Warn", "skip": "Skip",
            "skipped": "Skip", "not run": "Not Run", "n/a": "N/A"}
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
    body = "\n".join(ln for ln in text.splitlines() if not _PREAMBLE.match(ln.strip()))
    if body.lstrip().startswith("{"):
        return _diag_json(body, source)
    meta: dict[str, str] = {}
    tests: list[DiagTest] = []
    loose: list[DiagMessage] = []
    section: str | None = None
    header = False
    complete = False
    current: DiagTest | None = None
    message: DiagMessage | None = None  # the message a continuation row extends
    last_piece: str | None = None  # its last piece as printed, and the width it was cut at
    piece_width: int | None = None
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
        # DCGM cuts a message every `width` characters and pads the piece: a piece that
        # ended in a space lost it to the padding, and gets it back when joined
        closed = line.endswith("|") and len(line) > len(m["name"]) + 2
        width = len(m["value"]) - 3 if closed else None
        key = name.lower()
        if key == "diagnostic" and value.lower() == "result":
            header = True
            continue
        if not name:  # a continuation row: another result, or more of a message
            if message is not None and not _RESULT.match(value.strip()):
                if (piece_width is not None and last_piece is not None
                        and len(last_piece) < piece_width and value[:1] not in ("", " ")):
                    message.text += " "
                message.text += value
                last_piece, piece_width = value, width
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
            last_piece, piece_width = value, width
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


def _diag_json(text: str, source: str | None) -> DcgmiDiagFacts:
    """`dcgmi diag -j`: DCGM's JSON document (`DCGM GPU Diagnostic` -> `test_categories` ->
    `tests` -> one result per GPU with its warnings and info)."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ParseError(KIND, f"not a JSON document: {str(exc)[:120]}", source=source) from None
    root = (doc.get("DCGM GPU Diagnostic") or doc.get("DCGM Diagnostic")) if isinstance(
        doc, dict) else None
    if not isinstance(root, dict) or not isinstance(root.get("test_categories"), list):
        raise ParseError(KIND, "a JSON document without `DCGM GPU Diagnostic` -> "
                         "`test_categories` (not dcgmi diag -j)", source=source)
    tests: list[DiagTest] = []
    loose = [DiagMessage(kind="Info", text=str(x), line_no=0) for x in _list(root.get("info"))]
    for cat in root["test_categories"]:
        if not isinstance(cat, dict) or not isinstance(cat.get("tests"), list):
            raise ParseError(KIND, "a test category without its `tests`", source=source)
        for t in cat["tests"]:
            if not isinstance(t, dict) or not isinstance(t.get("name"), str):
                raise ParseError(KIND, "a test without its `name`", source=source)
            results: list[DiagResult] = []
            messages: list[DiagMessage] = []
            for r in _list(t.get("results")):
                if not isinstance(r, dict) or str(r.get("status", "")).lower() not in STATUSES:
                    raise ParseError(KIND, f"test {t['name']!r}: a result whose status is not "
                                     "Pass/Fail/Warn/Skip", source=source)
                ids = r.get("gpu_ids", r.get("gpu_id"))
                gpus = ([int(x) for x in str(ids).split(",") if x.strip().isdigit()]
                        if ids is not None else None)
                results.append(DiagResult(status=STATUSES[str(r["status"]).lower()],
                                          gpus=gpus or None))
                for w in _list(r.get("warnings")):
                    msg = w.get("warning") if isinstance(w, dict) else w
                    messages.append(DiagMessage(kind="Warning" if results[-1].status != "Fail"
                                                else "Error", text=str(msg), line_no=0))
                messages += [DiagMessage(kind="Info", text=str(i), line_no=0)
                             for i in _list(r.get("info"))]
            tests.append(DiagTest(section=str(cat.get("category") or "") or None, name=t["name"],
                                  results=results, messages=messages, line_no=0))
    if not tests:
        raise ParseError(KIND, "no tests in the JSON document", source=source)
    ids = root.get("GPU Device IDs") or root.get("GPU Device Serials") or []
    return DcgmiDiagFacts(dcgm_version=_str(root.get("version")),
                          driver_version=_str(root.get("Driver Version Detected")),
                          device_ids=[str(x) for x in _list(ids)], tests=tests, messages=loose,
                          header=True, complete=True)


def _list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


def _str(v: Any) -> str | None:
    return None if v is None else str(v)


# Registered without decorating, as dmon is: mutmut leaves decorated functions alone,
# so the parser itself would go unmeasured.
register(KIND, "dcgmi diag -r N (table, or -j JSON): DCGM's diagnostics (tests, results per GPU, "
         "messages)",
         example='dcgmi diag -r 1')(parse_dcgmi_diag)


# --------------------------------------------------------------------------- nvlink -s

NVLINK_KIND = "dcgmi-nvlink-s"
LINK_STATES = {"U": "up", "D": "down", "X": "disabled", "_": "not supported"}
_ENTITY = re.compile(r"^\s*(?P<what>gpuId|physicalId)\s+(?P<id>\d+):\s*$")
_LINKS = re.compile(r"^\s*[UDX_](?:\s+[UDX_])*\s*$")
_NVLINK_NOISE = re.compile(r"^\s*(?:[+|][-+ ]*[+|]|\|.*Link Status.*\||GPUs:|NvSwitches:|"
                           r"Key: .*|--)\s*$")


class NvlinkStatusFacts(_Model):
    gpus: dict[int, list[str]]  # gpuId -> one state per link: up | down | disabled | ...
    switches: dict[int, list[str]]  # NvSwitch physicalId -> its link states

    def down(self) -> dict[int, list[int]]:
        """GPU -> the links that are down."""
        return {g: [k for k, st in enumerate(links) if st == "down"]
                for g, links in self.gpus.items() if "down" in links}


def parse_dcgmi_nvlink_status(text: str, source: str | None = None) -> NvlinkStatusFacts:
    """`dcgmi nvlink -s` / `--link-status` (whole, or `| grep -A1 gpuId`): every GPU's and
    NvSwitch's links as U (up), D (down), X (disabled), _ (not supported)."""
    gpus: dict[int, list[str]] = {}
    switches: dict[int, list[str]] = {}
    pending: tuple[str, int, int] | None = None
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip()
        if not line.strip() or _NVLINK_NOISE.match(line):
            continue
        if m := _ENTITY.match(line):
            if pending is not None:
                raise ParseError(NVLINK_KIND, f"{pending[0]} {pending[1]} has no link line",
                                 line_no=no, line=line, source=source)
            pending = (m["what"], int(m["id"]), no)
            continue
        if _LINKS.match(line) and pending is not None:
            states = [LINK_STATES[x] for x in line.split()]
            (gpus if pending[0] == "gpuId" else switches)[pending[1]] = states
            pending = None
            continue
        raise ParseError(NVLINK_KIND, "not a line of dcgmi nvlink's link status", line_no=no,
                         line=line, source=source)
    if pending is not None:
        raise ParseError(NVLINK_KIND, f"{pending[0]} {pending[1]} has no link line",
                         line_no=pending[2], source=source)
    if not gpus and not switches:
        raise ParseError(NVLINK_KIND, "no `gpuId N:` with its links", source=source)
    return NvlinkStatusFacts(gpus=gpus, switches=switches)


register(NVLINK_KIND, "dcgmi nvlink -s / --link-status: every GPU's and NvSwitch's NVLink "
         "links up, down or disabled",
         example="dcgmi nvlink --link-status")(parse_dcgmi_nvlink_status)
