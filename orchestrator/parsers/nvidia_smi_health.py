"""nvidia-smi's health outputs the health step reads before and after its load:
`nvidia-smi nvlink -e` (the error counters of every NVLink) and
`nvidia-smi --query-compute-apps=... --format=csv` (the processes holding GPU memory; with
`csv,noheader` the columns are told apart by what each cell holds), and `nvidia-smi pmon`
(each process's share of the GPU, sample by sample).

`nvlink -e` prints a `GPU N: <name> (UUID: ...)` line, then `Link L: <counter>: <n>`
lines; which counters depend on the driver and the GPU generation, so every counter
is kept by the name printed. A GPU without NVLink prints nothing at all (an empty
output is an answer, not an error). A pasted excerpt's `[...]` is marked elided.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

from orchestrator.errors import ParseError
from orchestrator.parsers import register
from orchestrator.parsers.nvidia_smi import integer, is_na, text_or_none

NVLINK_KIND = "nvlink-e"
APPS_KIND = "nvidia-smi-compute-apps"

_GPU = re.compile(r"GPU (?P<index>\d+): (?P<name>.+?)(?: \(UUID: (?P<uuid>[^)]+)\))?$")
_LINK = re.compile(r"Link (?P<link>\d+): (?P<counter>[A-Za-z][A-Za-z0-9 ./_-]*?): (?P<value>\S.*)$")
_ELISION = re.compile(r"^(?:\[\.\.\.\]|\.\.\.|\[snip\])$")
_MESSAGE = re.compile(r"^(?:NVML: .*|Failed to .*|Unable to .*|No devices were found|"
                      r".*not supported.*|.*inActive.*)$", re.I)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NvlinkErrorsGpu(_Model):
    index: int
    name: str
    uuid: str | None
    links: dict[int, dict[str, int | None]]  # link -> counter name -> count (None: N/A)
    messages: list[str]
    line_no: int

    def total(self, counter: str | None = None) -> int:
        return sum(v or 0 for c in self.links.values() for k, v in c.items()
                   if counter is None or k == counter)


class NvlinkErrorsFacts(_Model):
    gpus: list[NvlinkErrorsGpu]
    elided: bool

    @property
    def empty(self) -> bool:
        return not self.gpus


def parse_nvlink_errors(text: str, source: str | None = None) -> NvlinkErrorsFacts:
    gpus: list[NvlinkErrorsGpu] = []
    elided = False
    for no, raw in enumerate(text.splitlines(), 1):
        s = raw.strip()
        if not s:
            continue
        if _ELISION.match(s):
            elided = True
            continue
        if not raw[:1].isspace() and (m := _GPU.match(s)):
            gpus.append(NvlinkErrorsGpu(index=int(m["index"]), name=m["name"].strip(),
                                        uuid=m["uuid"], links={}, messages=[], line_no=no))
            continue
        if m := _LINK.match(s):
            if not gpus:
                # a fragment that starts inside a GPU's links
                gpus.append(NvlinkErrorsGpu(index=-1, name="", uuid=None, links={},
                                            messages=[], line_no=no))
            value = m["value"].strip()
            try:
                count = None if is_na(value) else integer(value)
            except ValueError:
                raise ParseError(NVLINK_KIND, f"{m['counter']} is not a count", line_no=no,
                                 line=raw, source=source) from None
            gpus[-1].links.setdefault(int(m["link"]), {})[m["counter"].strip()] = count
            continue
        if _MESSAGE.match(s):
            if gpus:
                gpus[-1].messages.append(s)
            else:
                gpus.append(NvlinkErrorsGpu(index=-1, name="", uuid=None, links={},
                                            messages=[s], line_no=no))
            continue
        raise ParseError(NVLINK_KIND, "not a `GPU N:` or `Link L: <counter>: <count>` line",
                         line_no=no, line=raw, source=source)
    return NvlinkErrorsFacts(gpus=gpus, elided=elided)


register(NVLINK_KIND, "nvidia-smi nvlink -e: NVLink error counters per GPU and link",
         example='nvidia-smi nvlink -e')(parse_nvlink_errors)


# --------------------------------------------------------------------------- compute apps

_APPS_COLUMNS = {"gpu_uuid": "gpu_uuid", "pid": "pid", "process_name": "process_name",
                 "name": "process_name", "used_memory": "used_mib", "used_gpu_memory": "used_mib",
                 "gpu_bus_id": "gpu_bus_id", "gpu_name": "gpu_name", "timestamp": "timestamp",
                 "gpu_serial": "gpu_serial"}


class ComputeApp(_Model):
    line_no: int
    pid: int
    process_name: str | None
    used_mib: int | None  # None: [N/A] (some MIG and vGPU setups)
    gpu_uuid: str | None
    gpu_bus_id: str | None
    gpu_name: str | None


class ComputeAppsFacts(_Model):
    fields: list[str]
    apps: list[ComputeApp]

    def on(self, uuid: str) -> list[ComputeApp]:
        return [a for a in self.apps if a.gpu_uuid == uuid]


def parse_compute_apps(text: str, source: str | None = None) -> ComputeAppsFacts:
    rows = [(n, ln) for n, ln in enumerate(text.splitlines(), 1) if ln.strip()]
    if not rows:
        raise ParseError(APPS_KIND, "empty output", source=source)
    hdr_no, hdr = rows[0]
    names = []
    for col in hdr.split(","):
        m = re.fullmatch(r"\s*([a-z_.]+)(?:\s+\[[^\]]+\])?\s*", col)
        if not m or m.group(1) not in _APPS_COLUMNS:
            raise ParseError(APPS_KIND, f"header column {col.strip()!r} is not a compute-apps "
                             "field (the query must use --format=csv with its header)",
                             line_no=hdr_no, line=hdr, source=source)
        names.append(_APPS_COLUMNS[m.group(1)])
    if "pid" not in names:
        raise ParseError(APPS_KIND, "the query has no pid column", line_no=hdr_no, line=hdr,
                         source=source)
    apps = []
    for no, line in rows[1:]:
        if line.strip() == "No running processes found":
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(names):
            raise ParseError(APPS_KIND, f"{len(cells)} columns, header has {len(names)}",
                             line_no=no, line=line, source=source)
        row = dict(zip(names, cells, strict=True))
        try:
            pid = int(row["pid"])
            used = integer(row["used_mib"], "MiB") if "used_mib" in row else None
        except ValueError as exc:
            raise ParseError(APPS_KIND, str(exc), line_no=no, line=line, source=source) from None
        apps.append(ComputeApp(line_no=no, pid=pid, process_name=text_or_none(
            row.get("process_name", "")), used_mib=used, gpu_uuid=text_or_none(
            row.get("gpu_uuid", "")), gpu_bus_id=text_or_none(row.get("gpu_bus_id", "")),
            gpu_name=text_or_none(row.get("gpu_name", ""))))
    return ComputeAppsFacts(fields=names, apps=apps)


register(APPS_KIND, "nvidia-smi --query-compute-apps=... --format=csv: processes on the GPUs",
         example='nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv')(
    parse_compute_apps)


# --------------------------------------------------------------------------- without header

APPS_NOHEADER_KIND = "nvidia-smi-compute-apps-noheader"
_CELL_KINDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("timestamp", re.compile(r"\d{4}/\d\d/\d\d \d\d:\d\d:\d\d(?:\.\d+)?")),
    ("gpu_bus_id", re.compile(r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]")),
    ("gpu_uuid", re.compile(r"(?:GPU|MIG)-[0-9A-Fa-f-]+")),
    ("used_mib", re.compile(r"\d+ MiB|\[N/A\]|N/A|\[Not Supported\]")),
    ("gpu_serial", re.compile(r"0\d+|\d{10,}")),
    ("pid", re.compile(r"\d+")),
    ("gpu_name", re.compile(r"(?:NVIDIA|Tesla|Quadro|GeForce|TITAN)\b.*")),
)


def _noheader_fields(cells: list[str]) -> list[str] | None:
    """What each cell of a headerless compute-apps row is, or None when it cannot be told."""
    if any(re.fullmatch(r"\d+(?:\.\d+)? ?(?:%|W|MHz|C)", c) for c in cells):
        return None  # a --query-gpu row (utilization, power, clocks, temperature)
    fields: list[str] = []
    for c in cells:
        kind = next((k for k, rx in _CELL_KINDS if rx.fullmatch(c)), "process_name")
        fields.append(kind)
    one = ("pid", "process_name", "used_mib", "gpu_uuid", "gpu_bus_id", "gpu_name")
    if any(fields.count(k) > 1 for k in one) or "pid" not in fields:
        return None
    if "process_name" not in fields or int(cells[fields.index("pid")]) == 0:
        return None  # a process has a name and a pid above 0 (a GPU index is not one)
    return fields


def parse_compute_apps_noheader(text: str, source: str | None = None) -> ComputeAppsFacts:
    """`nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader`
    (any order of those fields, with or without the GPU's uuid, bus id, name, serial and the
    timestamp): the columns are told apart by what each cell holds, the same in every row."""
    rows = [(n, ln) for n, ln in enumerate(text.splitlines(), 1) if ln.strip()]
    if not rows:
        raise ParseError(APPS_NOHEADER_KIND, "empty output", source=source)
    names: list[str] | None = None
    apps = []
    for no, line in rows:
        if line.strip() == "No running processes found":
            continue
        cells = [c.strip() for c in line.split(",")]
        fields = _noheader_fields(cells)
        if fields is None:
            raise ParseError(APPS_NOHEADER_KIND, "cannot tell a pid, a process name and its "
                             "memory apart in this row (not --query-compute-apps output)",
                             line_no=no, line=line, source=source)
        if names is not None and fields != names:
            raise ParseError(APPS_NOHEADER_KIND, "this row's columns differ from the first's",
                             line_no=no, line=line, source=source)
        names = fields
        row = dict(zip(fields, cells, strict=True))
        used = row.get("used_mib")
        apps.append(ComputeApp(
            line_no=no, pid=int(row["pid"]), process_name=text_or_none(row.get("process_name", "")),
            used_mib=int(used.split()[0]) if used and used[:1].isdigit() else None,
            gpu_uuid=text_or_none(row.get("gpu_uuid", "")),
            gpu_bus_id=text_or_none(row.get("gpu_bus_id", "")),
            gpu_name=text_or_none(row.get("gpu_name", ""))))
    return ComputeAppsFacts(fields=names or [], apps=apps)


register(APPS_NOHEADER_KIND, "nvidia-smi --query-compute-apps=... --format=csv,noheader: "
         "processes on the GPUs, columns told apart by content",
         example="nvidia-smi --query-compute-apps=pid,process_name,used_memory "
                 "--format=csv,noheader")(parse_compute_apps_noheader)


# --------------------------------------------------------------------------- pmon

PMON_KIND = "nvidia-smi-pmon"


class PmonSample(_Model):
    line_no: int
    gpu: int
    pid: int | None  # None: no process on the GPU in that sample (`-`)
    type: str | None  # C (compute), G (graphics), C+G
    values: dict[str, float | None]  # sm, mem, enc, dec, jpg, ofa, fb, ... as % or MB
    command: str | None


class PmonFacts(_Model):
    columns: list[str]  # as the header names them
    samples: list[PmonSample]

    @property
    def processes(self) -> list[tuple[int, int, str | None]]:
        """(gpu, pid, command) of every process seen, once each."""
        return list(dict.fromkeys((s.gpu, s.pid, s.command) for s in self.samples
                                  if s.pid is not None))


def parse_pmon(text: str, source: str | None = None) -> PmonFacts:
    """`nvidia-smi pmon` (any `-s`, `-o DT`): a `# gpu pid type ... command` header, a units
    line, then one line per process and sample (`-` where there is none)."""
    columns: list[str] | None = None
    samples: list[PmonSample] = []
    seen = False
    for no, raw in enumerate(text.splitlines(), 1):
        s = raw.strip()
        if not s:
            continue
        seen = True
        if s.startswith("#"):
            words = s.lstrip("#").split()
            if "gpu" in words and "pid" in words:
                if columns is not None and words != columns:
                    raise ParseError(PMON_KIND, "a second header with other columns", line_no=no,
                                     line=raw, source=source)
                columns = words
            continue  # the units line, or the header printed again
        if columns is None:
            raise ParseError(PMON_KIND, "a sample before the `# gpu pid ...` header", line_no=no,
                             line=raw, source=source)
        cells = s.split()
        if len(cells) < len(columns):
            raise ParseError(PMON_KIND, f"{len(cells)} cells, the header has {len(columns)}",
                             line_no=no, line=raw, source=source)
        # the command is the last column and may hold spaces
        cells = [*cells[:len(columns) - 1], " ".join(cells[len(columns) - 1:])]
        row = dict(zip(columns, cells, strict=True))
        try:
            gpu = int(row["gpu"])
            pid = None if row["pid"] == "-" else int(row["pid"])
            values = {k: None if v == "-" else float(v) for k, v in row.items()
                      if k not in ("gpu", "pid", "type", "command", "Date", "Time")}
        except ValueError:
            raise ParseError(PMON_KIND, "a cell that is not a number or `-`", line_no=no,
                             line=raw, source=source) from None
        samples.append(PmonSample(
            line_no=no, gpu=gpu, pid=pid, type=None if row.get("type", "-") == "-" else row["type"],
            values=values, command=None if row.get("command", "-") == "-" else row["command"]))
    if not seen:
        raise ParseError(PMON_KIND, "empty output", source=source)
    if columns is None:
        raise ParseError(PMON_KIND, "no `# gpu pid ...` header: not nvidia-smi pmon output",
                         source=source)
    return PmonFacts(columns=columns, samples=samples)


register(PMON_KIND, "nvidia-smi pmon: the processes on each GPU and their share, sample by "
         "sample", example="nvidia-smi pmon -c 5")(parse_pmon)
