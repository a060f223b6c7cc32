"""perftest's bandwidth tools (`ib_write_bw`, `ib_read_bw`, `ib_send_bw`, their
bidirectional and post-list forms): the test's settings and one row per message size.

The unit is what the run printed: `[Gb/sec]` with `--report_gbits`, else `[MB/sec]`.
A run on GPU memory (`--use_cuda`, `--use_cuda_dmabuf`: GPUDirect RDMA, the usual case on
GPU clusters) prints how it set CUDA up first: read, and kept as the GPU it used. A run
that failed (`Completion with error`, `Failed status N`, `Couldn't ...`) is read as a
failure with its status, not refused.
A run in loopback prints the server's and the client's lines into one stream: the
settings and the rows may come twice and interleaved, and a row printed twice is
one result. The table's columns are read from its heading, so a heading perftest
adds later is an error naming the line, not a silent misreading.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

from orchestrator.errors import ParseError
from orchestrator.parsers import register

KIND = "perftest-bw"

_TITLE = re.compile(r"^(?P<title>(?:RDMA_Write|RDMA_Read|Send|Atomic \w+)(?: Bidirectional)?"
                    r"(?: Post List)? BW Test)$")
_KV = re.compile(r"(?P<key>[A-Za-z][A-Za-z0-9*. _-]*?)\s*:\s*(?P<value>\S+(?: \S+)*)")
_HEADING = re.compile(r"^#bytes\s+#iterations\s+BW peak\[(?P<u1>Gb/sec|MB/sec)\]\s+"
                      r"BW average\[(?P<u2>Gb/sec|MB/sec)\]\s+MsgRate\[Mpps\]$")
_ROW = re.compile(r"^(?P<bytes>\d+)\s+(?P<iters>\d+)\s+(?P<peak>\d+(?:\.\d+)?)\s+"
                  r"(?P<avg>\d+(?:\.\d+)?)\s+(?P<rate>\d+(?:\.\d+)?)$")
_IGNORED = re.compile(r"^(?:-{10,}|\*+|\* Waiting for client to connect\.\.\. \*|"
                      r"(?:local|remote) address: .*|GID: .*|WARNING: .*|"
                      r"Perftest doesn't support.*)$")
# How perftest sets CUDA up for --use_cuda (and DMA-BUF), before its settings
_CUDA = re.compile(
    r"^(?:initializing CUDA|Listing all CUDA devices in system:|creating CUDA Ctx|"
    r"making it the current CUDA Ctx|CUDA device (?P<list>\d+): PCIe address is (?P<pcie>\S+)|"
    r"There are \d+ devices supporting CUDA, picking first\.\.\.|"
    r"Picking device No\. (?P<pick>\d+)|"
    r"\[pid = \d+, dev = (?P<dev>\d+)\] device name = \[(?P<name>[^\]]*)\]|"
    r"cuMemAlloc\(\) of a (?P<bytes>\d+) bytes GPU buffer|"
    r"allocated GPU buffer address at \S+ pointer=\S+|"
    r"(?P<dmabuf>using DMA-BUF for GPU buffer.*)|"
    r"CUDA device integrated: .*|Using DMA-BUF.*)$")
# A run that failed: the completion error with its status, and what perftest says around it
_ERROR = re.compile(
    r"^(?:Completion with error at (?:client|server)|"
    r"Failed status (?P<status>\d+): wr_id \d+ syndrom(?:e)? (?P<syndrome>0x[0-9a-fA-F]+).*|"
    r"scnt=\d+, ccnt=\d+|Failed to .*|Couldn't .*|Unable to .*|"
    r"CUDA DMA-BUF cannot be used without CUDA|Parser function exited with Error|"
    r"ERROR: .*|.* failed with error .*)$")
_SETTINGS = {"dual-port": "dual_port", "device": "device", "number of qps": "qps",
             "transport type": "transport", "connection type": "connection",
             "using srq": "srq", "pcie relax order": "pcie_relax_order", "tx depth": "tx_depth",
             "mtu": "mtu", "link type": "link_type", "gid index": "gid_index",
             "post list": "post_list", "cq moderation": "cq_moderation",
             "max inline data": "max_inline", "rdma_cm qps": "rdma_cm",
             "data ex. method": "exchange", "outstand reads": "outstanding_reads",
             "ibv_wr* api": "ibv_wr_api"}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BwRow(_Model):
    line_no: int
    bytes: int
    iterations: int
    bw_peak: float
    bw_average: float
    msg_rate_mpps: float


class GpuBuffer(_Model):
    """The GPU memory a `--use_cuda` run put its buffer in."""

    device: int | None  # the CUDA device picked
    name: str | None  # as CUDA names it (`NVIDIA H100 80GB HBM3`)
    pcie: str | None  # its PCIe address as perftest listed it (`17:00`)
    buffer_bytes: int | None
    dmabuf: bool  # registered through DMA-BUF (`--use_cuda_dmabuf`), not nv_peer_mem


class PerftestError(_Model):
    line_no: int
    text: str


class PerftestBwFacts(_Model):
    test: str | None  # e.g. "RDMA_Write BW Test"
    settings: dict[str, str]  # by the names in _SETTINGS; others under their printed key
    unit: str | None  # "Gb/sec" | "MB/sec"
    rows: list[BwRow]  # one per message size, in order (a size printed twice is kept once)
    repeated: int  # rows printed again by a second process writing to the same stream
    gpu: GpuBuffer | None = None  # the run used GPU memory (--use_cuda)
    errors: list[PerftestError] = []  # what a failed run said, in order
    failed_status: int | None = None  # the work completion status (`Failed status 12`)
    syndrome: str | None = None  # the vendor syndrome (`0x81`)

    @property
    def failed(self) -> bool:
        return bool(self.errors)

    @property
    def bidirectional(self) -> bool:
        return bool(self.test and "Bidirectional" in self.test)

    def average_at(self, size: int) -> float | None:
        return next((r.bw_average for r in self.rows if r.bytes == size), None)

    @property
    def largest(self) -> BwRow | None:
        return max(self.rows, key=lambda r: r.bytes) if self.rows else None


def parse_perftest_bw(text: str, source: str | None = None) -> PerftestBwFacts:
    test: str | None = None
    settings: dict[str, str] = {}
    unit: str | None = None
    rows: list[BwRow] = []
    repeated = 0
    seen = False
    gpu: _Cuda | None = None
    errors: list[PerftestError] = []
    status: int | None = None
    syndrome: str | None = None
    for no, raw in enumerate(text.splitlines(), 1):
        s = raw.strip()
        if not s:
            continue
        seen = True
        if _IGNORED.match(s):
            continue
        if m := _CUDA.match(s):
            gpu = _cuda(gpu, m)
            continue
        if m := _ERROR.match(s):
            errors.append(PerftestError(line_no=no, text=s))
            if m["status"] is not None and status is None:
                status, syndrome = int(m["status"]), m["syndrome"]
            continue
        if m := re.fullmatch(r"(?P<head>Completion with error at (?:client|server))\s+"
                             r"(?P<rest>Failed status .*)", s):  # the two lines on one
            errors.append(PerftestError(line_no=no, text=m["head"]))
            sm = _ERROR.match(m["rest"])
            if sm is not None and sm["status"] is not None and status is None:
                status, syndrome = int(sm["status"]), sm["syndrome"]
            errors.append(PerftestError(line_no=no, text=m["rest"]))
            continue
        if m := _TITLE.match(s):
            test = test or m["title"]
            continue
        if m := _HEADING.match(s):
            if m["u1"] != m["u2"]:
                raise ParseError(KIND, "peak and average in different units", line_no=no,
                                 line=raw, source=source)
            if unit is not None and unit != m["u1"]:
                raise ParseError(KIND, "a second table in another unit", line_no=no, line=raw,
                                 source=source)
            unit = m["u1"]
            continue
        if m := _ROW.match(s):
            if unit is None:
                raise ParseError(KIND, "a result row before the table's heading", line_no=no,
                                 line=raw, source=source)
            row = BwRow(line_no=no, bytes=int(m["bytes"]), iterations=int(m["iters"]),
                        bw_peak=float(m["peak"]), bw_average=float(m["avg"]),
                        msg_rate_mpps=float(m["rate"]))
            same = [r for r in rows if r.bytes == row.bytes]
            if same:
                if (same[0].bw_average, same[0].iterations) != (row.bw_average, row.iterations):
                    raise ParseError(KIND, f"two different results for {row.bytes} bytes",
                                     line_no=no, line=raw, source=source)
                repeated += 1
                continue
            rows.append(row)
            continue
        flat = s.replace("\t", "  ")
        pairs = list(_KV.finditer(flat))
        if pairs and not _KV.sub("", flat).strip():  # the line is settings and nothing else
            for kv in pairs:
                key = kv["key"].strip()
                settings.setdefault(_SETTINGS.get(key.lower(), key), kv["value"].strip())
            continue
        raise ParseError(KIND, "not a perftest setting, heading or result row", line_no=no,
                         line=raw, source=source)
    if not seen:
        raise ParseError(KIND, "empty output", source=source)
    if test is None and not rows and not errors and gpu is None:
        raise ParseError(KIND, "no `... BW Test` title and no results: not perftest's output",
                         source=source)
    return PerftestBwFacts(test=test, settings=settings, unit=unit, rows=rows, repeated=repeated,
                           gpu=gpu.facts() if gpu is not None else None, errors=errors,
                           failed_status=status, syndrome=syndrome)


class _Cuda:
    """What the CUDA lines said, as they come."""

    def __init__(self) -> None:
        self.listed: dict[int, str] = {}
        self.device: int | None = None
        self.name: str | None = None
        self.buffer: int | None = None
        self.dmabuf = False

    def facts(self) -> GpuBuffer:
        pcie = self.listed.get(self.device) if self.device is not None else None
        return GpuBuffer(device=self.device, name=self.name, pcie=pcie, buffer_bytes=self.buffer,
                         dmabuf=self.dmabuf)


def _cuda(gpu: _Cuda | None, m: re.Match[str]) -> _Cuda:
    gpu = gpu or _Cuda()
    if m["list"] is not None:
        gpu.listed[int(m["list"])] = m["pcie"]
    if m["pick"] is not None:
        gpu.device = int(m["pick"])
    if m["dev"] is not None:
        gpu.device, gpu.name = int(m["dev"]), m["name"]
    if m["bytes"] is not None:
        gpu.buffer = int(m["bytes"])
    if m["dmabuf"] is not None or m.group(0).startswith("Using DMA-BUF"):
        gpu.dmabuf = True
    return gpu


# Registered without decorating, as dmon is: mutmut leaves decorated functions alone,
# so the parser itself would go unmeasured.
register(KIND, "perftest ib_write_bw/ib_read_bw/ib_send_bw: settings and bandwidth per size, "
         "the GPU of a --use_cuda run, a failed run's status",
         example='ib_write_bw -d mlx5_0 --report_gbits PEER_HOST')(parse_perftest_bw)
