"""The files of a PoC folder, recognised by what they hold rather than by their names.

People name the outputs of an acceptance recipe as they like (`kernel.txt`,
`gpu.txt`, `all-reduce-1.log`), so a file's name decides nothing. Several
parsers accept more than they should on their own (`uname` reads any line of
five words, `lscpu` any `Key: value` text), so a parser is tried only where a
signature of its output is seen, strongest signature first; the first parser
that reads the file names its kind. A file no parser accepts is "not
recognised", with the reason the closest parser gave.

Each recognised file also says which machine it describes where it can
(hostname, GPU UUIDs, PCI bus ids, InfiniBand node GUIDs): a file pasted from
another node is told apart by that, never by its name.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from orchestrator import parsers
from orchestrator.errors import ParseError

# Larger than any command output of a node (an 8-GPU `nvidia-smi -q` is ~80 KB,
# an NCCL_DEBUG=INFO log of a big job a few MB): a bigger file is something else.
MAX_BYTES = 16 << 20
HEAD_LINES = 60  # signatures look at the start of a file only


# --------------------------------------------------------------------------- small outputs

class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SmiVersionFacts(_Model):
    """`nvidia-smi --version` (drivers 535+)."""

    nvidia_smi: str
    driver: str | None
    cuda: str | None
    fields: dict[str, str]


class CommitFacts(_Model):
    """The nccl-tests commit written next to the logs (`git rev-parse HEAD`, `git log -1`)."""

    commit: str


class CheckedAtFacts(_Model):
    """When the PoC outputs were taken (`date`, `date -Iseconds`)."""

    text: str
    iso: str


class PipFacts(_Model):
    """`pip list` / `pip freeze`: the versions that decide what a job runs with."""

    packages: dict[str, str]

    @property
    def torch(self) -> str | None:
        return self.packages.get("torch")

    @property
    def nccl(self) -> str | None:
        return next((v for k, v in sorted(self.packages.items())
                     if re.fullmatch(r"nvidia-nccl-cu\d+", k)), None)


class MissingCommandFacts(_Model):
    """`sh: ibv_devinfo: command not found` saved in place of the output."""

    command: str
    text: str


def _lines(text: str) -> list[tuple[int, str]]:
    return [(n, ln) for n, ln in enumerate(text.splitlines(), 1) if ln.strip()]


def _empty(kind: str, text: str, source: str | None) -> list[tuple[int, str]]:
    lines = _lines(text)
    if not lines:
        raise ParseError(kind, "empty output", source=source)
    return lines


def parse_smi_version(text: str, source: str | None = None) -> SmiVersionFacts:
    fields: dict[str, str] = {}
    for no, line in _empty("nvidia-smi-version", text, source):
        m = re.fullmatch(r"\s*([A-Za-z][\w -]*?)\s*:\s*(.*?)\s*", line)
        if m is None:
            raise ParseError("nvidia-smi-version", "not `Key : value`", line_no=no, line=line,
                             source=source)
        fields[m.group(1).lower()] = m.group(2)
    if "nvidia-smi version" not in fields:
        raise ParseError("nvidia-smi-version", "no `NVIDIA-SMI version :` line", source=source)
    return SmiVersionFacts(nvidia_smi=fields["nvidia-smi version"],
                           driver=fields.get("driver version"), cuda=fields.get("cuda version"),
                           fields=fields)


_COMMIT = re.compile(r"(?:commit\s+)?(?=[0-9a-f]*[a-f])([0-9a-f]{7,40})\b(?:\s.*)?")


def parse_commit(text: str, source: str | None = None) -> CommitFacts:
    lines = _empty("commit", text, source)
    no, first = lines[0]
    m = _COMMIT.fullmatch(first.strip())
    if m is None:
        raise ParseError("commit", "not a git commit hash", line_no=no, line=first, source=source)
    for no, line in lines[1:]:  # `git log -1`: the header lines, then the indented message
        if not re.match(r"(Author|AuthorDate|Commit|CommitDate|Date|Merge):|\s", line):
            raise ParseError("commit", "more than one commit line", line_no=no, line=line,
                             source=source)
    return CommitFacts(commit=m.group(1))


_TZ_NAME = re.compile(r"\s[A-Z]{2,5}(?=\s\d{4}$)")  # `date`'s zone name: UTC, CET, PDT


def parse_checked_at(text: str, source: str | None = None) -> CheckedAtFacts:
    lines = _empty("checked-at", text, source)
    no, line = lines[0]
    if len(lines) > 1:
        raise ParseError("checked-at", "more than one line", line_no=lines[1][0],
                         line=lines[1][1], source=source)
    s = line.strip()
    when: dt.datetime | None = None
    try:
        when = dt.datetime.fromisoformat(s.replace("Z", "+00:00").replace(",", "."))
    except ValueError:
        bare = _TZ_NAME.sub("", s)
        for fmt in ("%a %b %d %H:%M:%S %Y", "%a %d %b %Y %H:%M:%S %p", "%a %d %b %H:%M:%S %Y",
                    "%Y-%m-%d %H:%M:%S"):
            try:
                when = dt.datetime.strptime(re.sub(r"\s+", " ", bare), fmt)
                break
            except ValueError:
                continue
    if when is None or not re.search(r"\d{4}", s):
        raise ParseError("checked-at", "not a date and time (`date` or `date -Iseconds`)",
                         line_no=no, line=line, source=source)
    return CheckedAtFacts(text=s, iso=when.isoformat())


_PIP_ROW = re.compile(r"([A-Za-z0-9][A-Za-z0-9_.-]*)\s+(\S+)(?:\s+\S+)?\s*")
_FREEZE_ROW = re.compile(r"([A-Za-z0-9][A-Za-z0-9_.-]*)\s*==\s*(\S+)\s*")


def parse_pip(text: str, source: str | None = None) -> PipFacts:
    lines = _empty("pip-list", text, source)
    packages: dict[str, str] = {}
    listed = re.fullmatch(r"Package\s+Version(\s+\S+.*)?", lines[0][1].strip()) is not None
    body = lines[2:] if listed else lines
    if listed and (len(lines) < 2 or not re.fullmatch(r"-+(\s+-+)+", lines[1][1].strip())):
        raise ParseError("pip-list", "no `----` line under the `Package Version` header",
                         line_no=lines[0][0], line=lines[0][1], source=source)
    for no, line in body:
        m = (_PIP_ROW if listed else _FREEZE_ROW).fullmatch(line.strip())
        if m is None:
            if not listed and (line.startswith("#") or " @ " in line or line.startswith("-e ")):
                continue  # pip freeze: comments, direct references, editable installs
            raise ParseError("pip-list", "not a package and its version", line_no=no, line=line,
                             source=source)
        packages[m.group(1).lower().replace("_", "-")] = m.group(2)
    if not packages:
        raise ParseError("pip-list", "no package listed", source=source)
    return PipFacts(packages=packages)


_NOT_FOUND = re.compile(r"(?:.*:\s*)?(?:line \d+:\s*)?(?P<cmd>[\w.+-]+): (?:command )?not found\s*")


def parse_missing_command(text: str, source: str | None = None) -> MissingCommandFacts:
    lines = _empty("command-not-found", text, source)
    cmds = []
    for no, line in lines:
        m = _NOT_FOUND.fullmatch(line)
        if m is None:
            raise ParseError("command-not-found", "not a `command not found` message",
                             line_no=no, line=line, source=source)
        cmds.append(m["cmd"])
    if len(set(cmds)) != 1:
        raise ParseError("command-not-found", f"several commands missing ({', '.join(cmds)}): "
                         "cannot tell which output this file stands for", source=source)
    return MissingCommandFacts(command=cmds[0], text=text.strip())


# --------------------------------------------------------------------------- signatures

# Keys and titles only `nvidia-smi -q` prints (an excerpt holds at least two of them).
_Q_KEYS = frozenset({
    "Product Name", "Product Brand", "Product Architecture", "GPU UUID", "MIG Mode",
    "MIG Device", "FB Memory Usage", "BAR1 Memory Usage", "Persistence Mode", "Bus Id",
    "Retired Pages", "Remapped Rows", "GPU Current Temp", "GPU Power Readings", "Power Readings",
    "Max Clocks", "Compute Mode", "Attached GPUs", "GPU instance ID", "Compute instance ID",
    "Device Attributes", "Multiprocessor count", "ECC Errors", "Clocks Event Reasons",
    "Clocks Throttle Reasons", "GPU Link Info", "VBIOS Version", "Minor Number",
})
_QUERY_FIELD = re.compile(r"[A-Za-z_][\w.]*(?: \[[^\]]+\])?")


def _q_score(text: str, head: list[str]) -> int:
    if re.search(r"^=+NVSMI LOG=+\s*$", text[:2000], re.M):
        return 95
    keys = {m.group(1) for ln in head
            for m in [re.match(r"\s*([A-Za-z][\w ()/-]*?)\s*(?::|$)", ln)] if m}
    known = keys & _Q_KEYS
    if any(re.match(r"GPU [0-9A-Fa-f]+:[0-9A-Fa-f]+:", ln) for ln in head) and known:
        return 85
    return 60 if len(known) >= 2 else 0


def _query_score(text: str, head: list[str]) -> int:
    cells = [c.strip() for c in head[0].split(",")] if head else []
    if len(cells) < 2 or not all(_QUERY_FIELD.fullmatch(c) for c in cells):
        return 0
    names = {c.split(" [")[0] for c in cells}
    return 90 if names & {"index", "name", "uuid", "pci.bus_id", "memory.total",
                          "driver_version", "gpu_name", "gpu_uuid"} or any("." in n for n in names) \
        else 0


def _l_score(text: str, head: list[str]) -> int:
    if not head or not re.match(r"GPU \d+: .*\(UUID: ", head[0]):
        return 0
    if re.search(r"^\s+Link \d+:|nvlink", text, re.M | re.I):
        return 40  # nvidia-smi nvlink prints the same GPU lines, then its links
    return 90


def _nvlink_score(text: str, head: list[str]) -> int:
    if head and re.match(r"NVML: .*NVLink", head[0], re.I):
        return 80  # a card whose links are all inactive or absent says only that
    if not head or not re.match(r"GPU \d+: ", head[0]):
        return 0
    return 92 if re.search(r"^\s+Link \d+:|nvlink", text, re.M | re.I) else 0


def _has(pattern: str, score: int, *, whole: bool = False) -> Callable[[str, list[str]], int]:
    """A pattern in the first lines, or anywhere (`whole`: launchers and NCCL print first)."""
    rx = re.compile(pattern, re.M)
    return lambda text, head: score if rx.search(text if whole else "\n".join(head)) else 0


def _uname_score(text: str, head: list[str]) -> int:
    if len(head) != 1:
        return 0
    tok = head[0].split()
    return 85 if len(tok) >= 5 and tok[0] in ("Linux", "GNU/Linux") and tok[2][:1].isdigit() else 0


def _one_line(parse: Callable[..., Any], score: int) -> Callable[[str, list[str]], int]:
    def sig(text: str, head: list[str]) -> int:
        if not 1 <= len(head) <= 8 or len(text) > 4096:
            return 0
        try:
            parse(text)
        except ParseError:
            return 0
        return score
    return sig


def _pip_score(text: str, head: list[str]) -> int:
    if head and re.fullmatch(r"Package\s+Version(\s+\S+.*)?", head[0].strip()):
        return 90
    freeze = [ln for ln in head if _FREEZE_ROW.fullmatch(ln.strip())]
    return 70 if len(freeze) >= 3 and len(freeze) * 2 >= len(head) else 0


def _json_score(key: str, score: int) -> Callable[[str, list[str]], int]:
    """A JSON document holding `key` near its start, or a JSON line holding it (torch's probe
    prints warnings before its line)."""
    def sig(text: str, head: list[str]) -> int:
        if text.lstrip().startswith("{") and key in text[:4096]:
            return score
        return score if any(ln.lstrip().startswith("{") and key in ln for ln in head) else 0
    return sig


def parse_collect_doc(text: str, source: str | None = None) -> Any:
    raise ParseError("gpuvet-collect", "this is a gpuvet collect document, not a command output: "
                     "judge it with `gpuvet preflight --from FILE -i INVENTORY --node NAME`",
                     source=source)


@dataclass(frozen=True)
class Kind:
    """One kind of output: how it shows itself and what reads it."""

    name: str
    signature: Callable[[str, list[str]], int]  # 0: does not look like it; higher: stronger
    parse: Callable[..., Any]


def _registered(kind: str) -> Callable[..., Any]:
    return lambda text, source=None: parsers.parse(kind, text, source=source)


KINDS: tuple[Kind, ...] = (
    Kind("nvidia-smi-q-xml", _has(r"<nvidia_smi_log\b", 100), _registered("nvidia-smi-q-xml")),
    Kind("nvidia-smi-table", _has(r"^\|\s*NVIDIA-SMI \d", 95), _registered("nvidia-smi-table")),
    Kind("nvidia-smi-q", _q_score, _registered("nvidia-smi-q")),
    Kind("nvidia-smi-version", _has(r"^NVIDIA-SMI version\s*:", 95), parse_smi_version),
    Kind("nvidia-smi-query-gpu", _query_score, _registered("nvidia-smi-query-gpu")),
    Kind("gpuvet-collect", _json_score('"tool": "gpuvet-payload"', 99), parse_collect_doc),
    Kind("nvidia-smi-L", _l_score, _registered("nvidia-smi-L")),
    Kind("nvlink-s", _nvlink_score, _registered("nvlink-s")),
    Kind("topo-m", _has(r"CPU Affinity|= Connection traversing", 90), _registered("topo-m")),
    Kind("topo-p2p", _has(r"= Status Ok|= Chipset not supported", 90), _registered("topo-p2p")),
    Kind("dmon", _has(r"^#\s*(?:Date\s+)?(?:Time\s+)?gpu\b", 95), _registered("dmon")),
    Kind("nccl-tests", _has(r"# nThread \d|# Collective test starting|nccl-tests version "
                            r"|# Using devices|# Avg bus bandwidth", 95, whole=True),
         _registered("nccl-tests")),
    Kind("nccl-tests-json", _json_score('"args"', 90), _registered("nccl-tests-json")),
    Kind("torch-info", _json_score('"torch"', 90), _registered("torch-info")),
    Kind("nvcc-version", _has(r"Cuda compilation tools, release|nvcc: NVIDIA \(R\)", 95),
         _registered("nvcc-version")),
    Kind("uname", _uname_score, _registered("uname")),
    Kind("os-release", _has(r"^ID=", 85), _registered("os-release")),
    Kind("lscpu", _has(r"^Architecture:", 85), _registered("lscpu")),
    Kind("meminfo", _has(r"^MemTotal:\s+\d+ kB", 90), _registered("meminfo")),
    Kind("df", _has(r"^Filesystem\s.*Mounted on", 85), _registered("df")),
    Kind("ldconfig-nccl", _has(r"libnccl\S* \(.*\) => |libs found in cache", 85),
         _registered("ldconfig-nccl")),
    Kind("mpirun-version", _has(r"\(Open MPI\)|HYDRA build details|Intel\(R\) MPI Library", 90),
         _registered("mpirun-version")),
    Kind("ibstat", _has(r"^CA '", 95), _registered("ibstat")),
    Kind("ibv-devinfo", _has(r"^hca_id:|^No IB devices found", 95), _registered("ibv-devinfo")),
    Kind("pip-list", _pip_score, parse_pip),
    Kind("commit", _one_line(parse_commit, 80), parse_commit),
    Kind("checked-at", _one_line(parse_checked_at, 80), parse_checked_at),
    Kind("command-not-found", _has(r": (?:command )?not found\s*$", 90), parse_missing_command),
)


# --------------------------------------------------------------------------- identity

@dataclass
class Identity:
    """What names the machine a file came from; empty where the output says nothing."""

    hosts: set[str] = field(default_factory=set)
    uuids: set[str] = field(default_factory=set)
    guids: set[str] = field(default_factory=set)
    buses: set[tuple[int, int | None]] = field(default_factory=set)

    # UUIDs and GUIDs name one device each: they alone decide where both files print
    # them. Bus ids repeat on machines of one model and hostnames on cloud images
    # (`ubuntu`): agreeing on those is weak, disagreeing on either is not.
    ORDER = (("uuids", "GPU UUIDs"), ("guids", "InfiniBand node GUIDs"),
             ("buses", "GPU PCI bus ids"), ("hosts", "hostname"))

    def __bool__(self) -> bool:
        return bool(self.hosts or self.uuids or self.guids or self.buses)

    def _overlap(self, other: Identity, attr: str) -> bool:
        mine, theirs = getattr(self, attr), getattr(other, attr)
        if attr == "buses" and any(d is None for _, d in mine | theirs):
            return bool({b for b, _ in mine} & {b for b, _ in theirs})
        return bool(mine & theirs)

    def differs(self, other: Identity) -> str | None:
        """The attribute that shows `other` is another machine, or None."""
        for attr in ("uuids", "guids"):
            if getattr(self, attr) and getattr(other, attr):
                return None if self._overlap(other, attr) else attr
        return next((a for a in ("buses", "hosts") if getattr(self, a) and getattr(other, a)
                     and not self._overlap(other, a)), None)

    def relation(self, other: Identity) -> int:
        """+1 the same machine as far as both tell, -1 another, 0 nothing to compare."""
        if self.differs(other) is not None:
            return -1
        both = any(getattr(self, a) and getattr(other, a) for a, _ in self.ORDER)
        return 1 if both else 0

    def add(self, other: Identity) -> None:
        for a, _ in self.ORDER:
            getattr(self, a).update(getattr(other, a))

    def shown(self, attr: str) -> str:
        vals = getattr(self, attr)
        if attr == "buses":
            return ", ".join(f"{b:02x}:{d:02x}" if d is not None else f"{b:02x}"
                             for b, d in sorted(vals, key=lambda x: (x[0], x[1] or 0))[:4])
        return ", ".join(sorted(vals)[:4]) + (" ..." if len(vals) > 4 else "")


def bus_key(bus: str | None) -> tuple[int, int | None] | None:
    """`00000000:19:00.0`, `0000:19:00` (nccl-tests 2.16+) and `0x19` (older) as (bus, device)."""
    s = (bus or "").strip().lower()
    m = re.fullmatch(r"(?:[0-9a-f]+:)?([0-9a-f]{1,2}):([0-9a-f]{1,2})(?:\.[0-7])?", s)
    if m:
        return int(m.group(1), 16), int(m.group(2), 16)
    m = re.fullmatch(r"0x([0-9a-f]{1,2})", s)
    return (int(m.group(1), 16), None) if m else None


def _guid(g: str | None) -> str | None:
    digits = re.sub(r"[^0-9a-f]", "", (g or "").lower().removeprefix("0x"))
    return digits.lstrip("0") or None


def identity(facts: Any) -> Identity:
    ident = Identity()
    d = facts.model_dump() if isinstance(facts, BaseModel) else {}
    if "hostname" in d and "kernel_release" in d:  # uname
        ident.hosts.add(d["hostname"].lower().split(".")[0])
    for r in d.get("ranks") or []:  # nccl-tests, text or -J
        ident.hosts.add(str(r["host"]).lower().split(".")[0])
        if (k := bus_key(r.get("bus_id"))) is not None:
            ident.buses.add(k)
    for g in d.get("gpus") or []:
        if not isinstance(g, dict):
            continue
        u = str(g.get("uuid") or "").lower()
        if u.startswith("gpu-"):
            ident.uuids.add(u)
        for key in ("bus_id", "pci_bus_id"):
            if (k := bus_key(g.get(key))) is not None:
                ident.buses.add(k)
    for dev in (d.get("devices") or []) + (d.get("cas") or []):
        if isinstance(dev, dict) and (g := _guid(dev.get("node_guid"))):
            ident.guids.add(g)
    return ident


# --------------------------------------------------------------------------- reading a file

Status = str  # judged | recorded | not recognised | unreadable | other node | duplicate


@dataclass
class PocFile:
    name: str  # relative to the folder, with `/`
    path: Path
    data: bytes = b""
    sha256: str | None = None
    text: str | None = None
    kind: str | None = None
    facts: Any = None
    status: Status = "not recognised"
    reason: str | None = None
    ident: Identity = field(default_factory=Identity)
    target: str | None = None  # the command id or fact id it fills
    copy: str | None = None  # where the run keeps it (run-relative)
    scrubbed: bool = False  # the copy had secrets taken out

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "sha256": self.sha256, "status": self.status}
        if self.target:
            out["as"] = self.target
        out["copy"] = self.copy
        if self.scrubbed:
            out["scrubbed"] = True
        if self.reason:
            out["reason"] = self.reason
        return out


def _decode(data: bytes) -> tuple[str | None, str | None]:
    """The text, or why the bytes are not a command's text output."""
    if not data.strip():
        return None, "empty file"
    if b"\x00" in data:
        return None, f"binary content ({data.count(0)} NUL byte(s)): not a command's text output"
    text = data.decode("utf-8", errors="replace")
    bad = text.count("\ufffd")
    ctrl = sum(1 for c in text if ord(c) < 32 and c not in "\t\n\r\x1b\x0c")
    if bad > max(3, len(text) // 100) or ctrl > max(3, len(text) // 100):
        return None, (f"binary content ({bad} byte(s) that are not UTF-8, {ctrl} control "
                      "character(s)): not a command's text output")
    return text, None


def read(path: Path, name: str) -> PocFile:
    """Read and recognise one file; every outcome is a status, never an exception."""
    f = PocFile(name=name, path=path)
    if path.is_symlink():
        f.status, f.reason = "unreadable", "a symbolic link: not followed"
        return f
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            f.status, f.reason = "unreadable", (f"{size} bytes, more than {MAX_BYTES >> 20} MiB: "
                                                "not a command output this import reads")
            return f
        f.data = path.read_bytes()
    except OSError as exc:
        f.status, f.reason = "unreadable", f"cannot read it: {exc.strerror or exc}"
        return f
    f.sha256 = hashlib.sha256(f.data).hexdigest()
    text, why = _decode(f.data)
    if text is None:
        f.status, f.reason = "unreadable", why
        return f
    f.text = text
    recognise(f)
    return f


def recognise(f: PocFile) -> None:
    """Try the parsers whose signature fits, strongest first; the first that reads it wins."""
    assert f.text is not None
    head = [ln for ln in f.text.splitlines() if ln.strip()][:HEAD_LINES]
    scored = sorted(((k.signature(f.text, head), i, k) for i, k in enumerate(KINDS)),
                    key=lambda s: (-s[0], s[1]))
    tried: list[tuple[str, str]] = []
    for score, _, kind in scored:
        if score <= 0:
            break
        try:
            f.facts = kind.parse(f.text, source=f.name)
        except ParseError as exc:
            tried.append((kind.name, _why(exc)))
            continue
        f.kind = kind.name
        f.ident = identity(f.facts)
        f.status, f.reason = "recognised", None
        return
    first = head[0].strip()[:80] if head else ""
    f.reason = (f"read as {tried[0][0]}: {tried[0][1]}" if tried else
                f"no known command output starts like this ({first!r})")


def _why(exc: ParseError) -> str:
    """The parser's reason without its `cannot parse ... at FILE:LINE` frame, with the line."""
    where = (exc.source or "<text>") + (f":{exc.line_no}" if exc.line_no is not None else "")
    frame = f"cannot parse {exc.kind} output at {where}: "
    what = exc.what.split("\n")[0]
    what = what[len(frame):] if what.startswith(frame) else what
    if exc.line_no is not None:
        what += f" (line {exc.line_no}" + (f": {exc.line.strip()[:60]!r})" if exc.line else ")")
    return what


def describe(f: PocFile) -> str:
    """One line for messages: the file and what it was taken for."""
    return f"{f.name} ({f.kind})" if f.kind else f.name


def as_json(facts: Any) -> Any:
    if isinstance(facts, BaseModel):
        return facts.model_dump(mode="json")
    return json.loads(json.dumps(facts, default=str))
