#!/usr/bin/env python3
"""``python3 -m payload nodecheck``: is this node fit to take a job, in seconds.

A node-local quick check for Slurm's ``HealthCheckProgram`` or a ``Prolog``
(docs/slurm.md): the GPUs nvidia-smi sees against the expected count (``--gpus``,
else the NVIDIA GPUs on the PCI bus), processes already on the GPUs (the preflight
busy-GPU rule: ``busy_severity``), uncorrectable ECC errors, remapped rows and
retired pages pending or failed, Xid events since boot that point at the GPU, its
memory or a link (``XID_CATALOG``), GPUs fallen off the bus, the NVLink fabric
registration (``fabric_problem``), and InfiniBand ports that are not ACTIVE.

It prints one line per problem (``CODE: what``) and exits 0 when there is none,
1 when there is one (with ``--drain`` it drains its own node with the reason
``gpuvet CODE ...``, as NHC does), 2 for a usage mistake and 4 when this node has
no NVIDIA driver and no NVIDIA GPU, so nothing could be checked (a CPU node; never
drained). A GPU expected (``--gpus N``, or one on the PCI bus) with no driver is a
problem: ``NVIDIA_DRIVER_MISSING``, exit 1.

The judging lives here, not in the controller, because it must run on the node; the
controller imports its rules (``busy_severity``, ``fabric_problem``, ``XID_CATALOG``)
so preflight, health and this check judge alike. Standard library only, Python 3.8
compatible, and it imports nothing else of the payload: the file runs on its own
(``gpuvet nodecheck --write-script /etc/slurm/gpuvet-nodecheck``).
"""

import argparse
import csv
import io
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from typing import Any, Callable, Dict, List, NamedTuple, NoReturn, Optional, Sequence, Tuple

EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_USAGE = 2
EXIT_NO_DRIVER = 4  # no NVIDIA driver and no NVIDIA GPU: nothing was checked

# The busy-GPU rule preflight and health use too (docs/health.md, "A busy GPU").
BUSY_FAIL_MIB = 1024  # more than this held on a GPU: another job is on it
IDLE_USED_MIB = 512  # memory.used of an idle GPU stays under this (driver reserve)

# What NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors) says each common Xid
# means, and whether it points at the GPU, its memory or its links rather than at the
# application: (meaning, category, bad). The controller's kernel-log parser reads it.
XID_CATALOG = {
    8: ("GPU stopped processing (timeout)", "driver", False),
    13: ("graphics engine exception", "application", False),
    31: ("GPU memory page fault", "application", False),
    32: ("invalid or corrupted push buffer stream", "application", False),
    38: ("driver firmware error", "driver", False),
    43: ("GPU stopped processing", "application", False),
    45: ("preemptive cleanup, due to previous errors", "application", False),
    48: ("double bit ECC error", "memory", True),
    61: ("internal micro-controller breakpoint/warning", "firmware", True),
    62: ("internal micro-controller halt", "firmware", True),
    63: ("ECC page retirement or row remapping recording event", "memory", True),
    64: ("ECC page retirement or row remapper recording failure", "memory", True),
    69: ("graphics engine class error", "application", False),
    74: ("NVLink error", "link", True),
    79: ("GPU has fallen off the bus", "bus", True),
    92: ("high single-bit ECC error rate", "memory", True),
    94: ("contained ECC error", "memory", True),
    95: ("uncontained ECC error", "memory", True),
    109: ("context switch timeout", "application", False),
    119: ("GSP RPC timeout", "firmware", True),
    120: ("GSP error", "firmware", True),
    140: ("unrecovered ECC error", "memory", True),
    143: ("GPU initialization failure", "firmware", True),
    144: ("NVLink SAW error", "link", True),
    145: ("NVLink RLW error", "link", True),
    146: ("NVLink TLW error", "link", True),
    147: ("NVLink TREX error", "link", True),
    148: ("NVLink NVLPW control error", "link", True),
    149: ("NVLink NETIR error", "link", True),
    150: ("NVLink MSE error", "link", True),
}  # type: Dict[int, Tuple[str, str, bool]]

CHECKS = ("gpus", "busy", "ecc", "xid", "fabric", "ib")

# What the check asks nvidia-smi; a field an older driver refuses is dropped and the
# query asked again (remapped rows came with A100, page retirement went with it).
QUERY_FIELDS = [
    "index", "uuid", "pci.bus_id", "name", "memory.used",
    "ecc.errors.uncorrected.volatile.total", "retired_pages.pending",
    "remapped_rows.pending", "remapped_rows.failure", "remapped_rows.uncorrectable",
]
COMPUTE_APPS = ["nvidia-smi", "--query-compute-apps=gpu_uuid,pid,process_name,used_memory",
                "--format=csv"]
_REFUSED = re.compile(r'Field "([^"]+)" is not a valid field to query', re.I)
# where Slurm's Prolog and HealthCheckProgram run with no search path set
SYSTEM_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
DEFAULT_TIMEOUT_S = 20.0  # per command; Slurm kills a HealthCheckProgram after 60 s
REASON_MAX = 64  # the drain reason as set; `sinfo -R` shows its first 20 characters
# The options a copy written by `gpuvet nodecheck --write-script` runs with (Slurm's
# HealthCheckProgram and Prolog take a path, no arguments); those on the command line follow.
BAKED_ARGS = []  # type: List[str]


class Problem(NamedTuple):
    code: str
    message: str


class Note(NamedTuple):
    """A check that passed or could not be made (shown with --verbose, never a problem)."""

    check: str
    message: str


class Ran(NamedTuple):
    rc: Optional[int]  # None: not found or timed out
    out: str
    err: str
    missing: bool = False
    timed_out: bool = False


# --------------------------------------------------------------------------- rules


def busy_severity(held_mib: int, in_use_mib: Optional[int], processes: int,
                  memory_unknown: bool) -> Optional[str]:
    """One GPU in use before the job: FAIL when processes hold more than BUSY_FAIL_MIB
    (or memory a cell did not show), or, with no process visible, more than that is in
    use; WARN for a small process (a monitoring agent); None when the GPU is free."""
    if processes:
        big = held_mib > BUSY_FAIL_MIB or (in_use_mib or 0) > BUSY_FAIL_MIB or memory_unknown
        return "FAIL" if big else "WARN"
    if in_use_mib is not None and in_use_mib > BUSY_FAIL_MIB:
        return "FAIL"
    return None


def fabric_problem(state: Optional[str], status: Optional[str],
                   health_summary: Optional[str] = None) -> Optional[str]:
    """What is wrong with a GPU's NVLink fabric registration, in nvidia-smi's own words;
    None when it succeeded or there is no fabric (N/A, passed as None)."""
    if state is not None and state.lower() != "completed":
        return "State %s" % state + (", Status %s" % status if status else "")
    if status is not None and status.lower() != "success":
        return "Status %s" % status
    if health_summary is not None and health_summary.lower() not in ("healthy",
                                                                     "not supported"):
        return "Health Summary %s" % health_summary
    return None


def xid_is_bad(xid: int, caused_by: Optional[int] = None) -> bool:
    """Whether an Xid points at the GPU, its memory or a link (itself or its cause)."""
    bad = XID_CATALOG.get(xid, ("", "", False))[2]
    if caused_by is not None:
        bad = bad or XID_CATALOG.get(caused_by, ("", "", False))[2]
    return bad


# --------------------------------------------------------------------------- parsing


def _na(value: Optional[str]) -> bool:
    v = (value or "").strip()
    return v == "" or v.startswith("[") or v.upper() in ("N/A", "NOT SUPPORTED")


def _int(value: Optional[str]) -> Optional[int]:
    if _na(value):
        return None
    m = re.match(r"\s*(\d+)", value or "")
    return int(m.group(1)) if m else None


def parse_csv(text: str) -> List[Dict[str, str]]:
    """nvidia-smi's `--format=csv` (a header with units) as rows keyed by field name."""
    rows = [r for r in csv.reader(io.StringIO(text)) if r]
    if not rows:
        return []
    header = [h.strip().split(" [")[0].lower() for h in rows[0]]
    return [{header[i]: r[i].strip() for i in range(len(header))} for r in rows[1:]
            if len(r) == len(header)]


class Gpu(NamedTuple):
    number: Optional[int]  # nvidia-smi's index
    uuid: str
    bus_id: str
    name: str
    used_mib: Optional[int]
    row: Dict[str, str]

    @property
    def label(self) -> str:
        return "GPU %d" % self.number if self.number is not None else "GPU %s" % (
            self.bus_id or self.uuid or "?")


def gpus_of(query_csv: str) -> List[Gpu]:
    return [Gpu(_int(r.get("index")), r.get("uuid", ""), r.get("pci.bus_id", ""),
                r.get("name", ""), _int(r.get("memory.used")), r)
            for r in parse_csv(query_csv)]


def bus_key(bus_id: str) -> str:
    """`00000000:3B:00.0`, `0000:3b:00.0`, `0000:3b:00` -> `0000:3b:00`."""
    s = bus_id.strip().lower().split(".")[0]
    dom, _, rest = s.partition(":")
    if len(dom) > 4 and rest:
        s = dom[-4:] + ":" + rest
    return s


_XID = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}"
                  r"(?:\.[0-7])?)\): (?P<xid>\d+)")
_CAUSE = re.compile(r"caused by previous Xid (\d+)")
_GONE = re.compile(r"NVRM: GPU (?:at PCI:)?(?P<pci>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:"
                   r"[0-9a-fA-F]{2}(?:\.[0-7])?):? .*fallen off the bus")


class Xid(NamedTuple):
    xid: int
    pci: str  # domain:bus:device, lower case
    bad: bool
    line: str


def xid_events(kernel_log: str) -> Tuple[List[Xid], List[str]]:
    """The Xid events of a kernel log and the lines saying a GPU fell off the bus."""
    events = []  # type: List[Xid]
    gone = []  # type: List[str]
    for line in kernel_log.splitlines():
        m = _XID.search(line)
        if m:
            cause = _CAUSE.search(line, m.end())
            xid = int(m.group("xid"))
            events.append(Xid(xid, bus_key(m.group("pci")),
                              xid_is_bad(xid, int(cause.group(1)) if cause else None),
                              line.strip()))
        elif _GONE.search(line) or ("NVRM:" in line and "fallen off the bus" in line):
            gone.append(line.strip())
    return events, gone


class Fabric(NamedTuple):
    bus_id: str
    state: Optional[str]
    status: Optional[str]
    summary: Optional[str]


_GPU_HEAD = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$")


def fabric_of(q_text: str) -> List[Fabric]:
    """Each GPU's `Fabric` section in `nvidia-smi -q` (State, Status, Health's Summary;
    N/A read as None). A section cut out of its GPU (a grep) has no bus id."""
    out = []  # type: List[Fabric]
    bus = ""
    cur = None  # type: Optional[Dict[str, Optional[str]]]
    depth = 0

    def flush() -> None:
        if cur is not None:
            out.append(Fabric(bus, cur.get("state"), cur.get("status"), cur.get("summary")))

    for line in q_text.splitlines():
        head = _GPU_HEAD.match(line)
        stripped = line.strip()
        lead = len(line) - len(line.lstrip())
        if head or stripped == "Fabric" or (cur is not None and stripped and stripped != "--"
                                            and lead <= depth):
            flush()
            cur = None
        if head:
            bus = head.group(1)
        elif stripped == "Fabric":
            cur, depth = {}, lead
        elif cur is not None and ":" in stripped:
            key, _, val = stripped.partition(":")
            name = {"State": "state", "Status": "status", "Summary": "summary"}.get(key.strip())
            if name and name not in cur:
                cur[name] = None if _na(val) else val.strip()
    flush()
    return out


class IbPort(NamedTuple):
    hca: str
    port: str
    state: str  # ACTIVE, DOWN, INIT, ARMED, POLLING (the text after "N: ")
    link_layer: str  # InfiniBand | Ethernet


def _read(path: str) -> Optional[str]:
    try:
        with open(path, "r") as f:
            return f.read().strip()
    except OSError:
        return None


def ib_ports(sysfs: str) -> List[IbPort]:
    """Every RDMA port from /sys/class/infiniband/<hca>/ports/<n>/{state,link_layer}."""
    base = os.path.join(sysfs, "class", "infiniband")
    out = []
    for hca in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        pdir = os.path.join(base, hca, "ports")
        for port in sorted(os.listdir(pdir), key=lambda p: (len(p), p)) \
                if os.path.isdir(pdir) else []:
            state = _read(os.path.join(pdir, port, "state")) or "?"
            out.append(IbPort(hca, port, state.split(":", 1)[-1].strip(),
                              _read(os.path.join(pdir, port, "link_layer")) or "?"))
    return out


def pci_gpus(sysfs: str) -> List[str]:
    """NVIDIA display and 3D controllers on the PCI bus (NVSwitches are bridges: left out),
    as sysfs names them; a GPU fallen off the bus or unbound is still listed here."""
    base = os.path.join(sysfs, "bus", "pci", "devices")
    out = []
    for dev in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        vendor = _read(os.path.join(base, dev, "vendor"))
        klass = _read(os.path.join(base, dev, "class")) or ""
        if vendor == "0x10de" and (klass.startswith("0x0300") or klass.startswith("0x0302")):
            out.append(dev)
    return out


# --------------------------------------------------------------------------- judging


class Inputs(NamedTuple):
    """What the node gave, as text (captured outputs in tests)."""

    query: Optional[Ran]  # the --query-gpu CSV; None where nvidia-smi is missing
    apps: Optional[Ran]
    smi_q: Optional[Ran]  # `nvidia-smi -q`, for the fabric
    kernel_log: Optional[Tuple[str, str]]  # (source, text); None: not readable
    kernel_log_why: str
    pci: List[str]
    ports: List[IbPort]


def judge(inp: Inputs, *, expected_gpus: Optional[int] = None, skip: Sequence[str] = (),
          job_gpus: Optional[Sequence[int]] = None, ib_expected: Optional[int] = None
          ) -> Tuple[List[Problem], List[Note]]:
    """Every check over the node's outputs: the problems, and notes on what passed or
    could not be checked."""
    problems = []  # type: List[Problem]
    notes = []  # type: List[Note]
    want = expected_gpus if expected_gpus is not None else (len(inp.pci) or None)
    gpus = []  # type: List[Gpu]
    smi_ok = False
    if inp.query is None or inp.query.missing:
        if want:
            problems.append(Problem("NVIDIA_DRIVER_MISSING", "nvidia-smi not found: no NVIDIA "
                                    "driver, and %d GPU(s) %s" % (want, "expected" if
                                                                expected_gpus else
                                                                "on the PCI bus")))
    elif inp.query.timed_out:
        problems.append(Problem("NVIDIA_SMI_HUNG", "nvidia-smi did not answer in time: the "
                                "driver or a GPU is in a bad state"))
    elif inp.query.rc != 0:
        tail = (inp.query.err or inp.query.out).strip().splitlines()[-1:] or [""]
        problems.append(Problem("NVIDIA_SMI_FAILED", "nvidia-smi failed (exit %s): %s"
                                % (inp.query.rc, tail[0][:160])))
    else:
        gpus = gpus_of(inp.query.out)
        smi_ok = True
    if "gpus" not in skip and smi_ok:
        if want is not None and len(gpus) != want:
            problems.append(Problem("GPU_COUNT", "nvidia-smi sees %d GPU(s), %d %s" % (
                len(gpus), want, "expected" if expected_gpus is not None else
                "on the PCI bus (a GPU lost by the driver or fallen off the bus)")))
        elif not gpus:
            problems.append(Problem("GPU_COUNT", "nvidia-smi sees no GPU"))
        else:
            notes.append(Note("gpus", "%d GPU(s)%s" % (len(gpus), ", as expected"
                                                       if want is not None else "")))
    if "ecc" not in skip and smi_ok:
        problems += _memory(gpus)
        if not [p for p in problems if p.code in ("ECC_UNCORRECTABLE", "REMAPPED_ROWS",
                                                    "RETIRED_PAGES_PENDING")]:
            notes.append(Note("ecc", "no uncorrectable ECC error, no remap or retirement "
                                     "pending or failed"))
    if "busy" not in skip and smi_ok:
        if inp.apps is None or inp.apps.rc != 0:
            notes.append(Note("busy", "not checked: --query-compute-apps gave nothing"))
        else:
            found = _busy(gpus, parse_csv(inp.apps.out), job_gpus)
            problems += [p for sev, p in found if sev == "FAIL"]
            notes += [Note("busy", "WARN " + p.message) for sev, p in found if sev == "WARN"]
    if "fabric" not in skip and smi_ok:
        problems += _fabric(inp.smi_q, gpus, notes)
    if "xid" not in skip:
        if inp.kernel_log is None:
            notes.append(Note("xid", "not checked: the kernel log is not readable (%s)"
                              % inp.kernel_log_why))
        else:
            problems += _xid(inp.kernel_log, gpus, notes)
    if "ib" not in skip:
        problems += _ib(inp.ports, ib_expected, notes)
    return problems, notes


def _memory(gpus: Sequence[Gpu]) -> List[Problem]:
    out = []
    for g in gpus:
        r = g.row
        ecc = _int(r.get("ecc.errors.uncorrected.volatile.total"))
        if ecc:
            out.append(Problem("ECC_UNCORRECTABLE", "%s has %d uncorrectable ECC error(s) "
                               "since the driver loaded" % (g.label, ecc)))
        if (r.get("remapped_rows.failure") or "").lower() == "yes":
            out.append(Problem("REMAPPED_ROWS", "%s memory: a row remapping failed" % g.label))
        elif (r.get("remapped_rows.pending") or "").lower() == "yes":
            out.append(Problem("REMAPPED_ROWS", "%s memory: row remapping pending (takes "
                               "effect at the next GPU reset)" % g.label))
        if (r.get("retired_pages.pending") or "").lower() == "yes":
            out.append(Problem("RETIRED_PAGES_PENDING", "%s has retired pages pending: the "
                               "GPU needs a reset before its memory can be trusted" % g.label))
    return out


def _busy(gpus: Sequence[Gpu], apps: Sequence[Dict[str, str]],
          job_gpus: Optional[Sequence[int]]) -> List[Tuple[str, Problem]]:
    by_key = {}  # type: Dict[str, Gpu]
    for gpu in gpus:
        for k in (gpu.uuid, gpu.bus_id):
            if k:
                by_key[k] = gpu
    procs = {}  # type: Dict[str, List[Tuple[str, Optional[int]]]]
    where = {}  # type: Dict[str, Optional[Gpu]]
    for a in apps:
        key = a.get("gpu_uuid") or a.get("gpu_bus_id") or "?"
        found = by_key.get(key)
        label = found.label if found is not None else "GPU %s" % key
        where[label] = found
        procs.setdefault(label, []).append(("pid %s %s" % (a.get("pid", "?"),
                                                           a.get("process_name") or "?"),
                                            _int(a.get("used_memory")
                                                 or a.get("used_gpu_memory"))))
    for gpu in gpus:
        where.setdefault(gpu.label, gpu)
    out = []
    for label in sorted(where, key=lambda s: (len(s), s)):
        g = where[label]
        if job_gpus is not None and g is not None and g.number not in job_gpus:
            continue  # another job's GPU on a shared node
        mine = procs.get(label, [])
        used = g.used_mib if g is not None else None
        sev = busy_severity(sum(m or 0 for _, m in mine), used, len(mine),
                            any(m is None for _, m in mine))
        if sev is None:
            continue
        shown = "; ".join("%s (%s)" % (p, "%d MiB" % m if m is not None else "memory not shown")
                          for p, m in mine) or "no process this node can see"
        of = " (%d MiB in use)" % used if used is not None else ""
        out.append((sev, Problem("GPU_BUSY", "%s is in use before the job: %s%s"
                                 % (label, shown, of))))
    return out


def _fabric(smi_q: Optional[Ran], gpus: Sequence[Gpu], notes: List[Note]) -> List[Problem]:
    if smi_q is None or smi_q.rc != 0 or not smi_q.out.strip():
        notes.append(Note("fabric", "not checked: nvidia-smi -q gave nothing"))
        return []
    fabrics = fabric_of(smi_q.out)
    label = {bus_key(g.bus_id): g.label for g in gpus}
    known = [f for f in fabrics if f.state is not None or f.status is not None]
    bad = [(f, fabric_problem(f.state, f.status, f.summary)) for f in known]
    bad = [(f, why) for f, why in bad if why]
    if not known:
        notes.append(Note("fabric", "no NVLink fabric to join (N/A on every GPU)"))
        return []
    if not bad:
        notes.append(Note("fabric", "every GPU registered with the NVLink fabric"))
        return []
    return [Problem("FABRIC_STATE", "%s not registered with the NVLink fabric: %s (check "
                    "nvidia-fabricmanager)" % (label.get(bus_key(f.bus_id), f.bus_id), why))
            for f, why in bad]


def _xid(kernel_log: Tuple[str, str], gpus: Sequence[Gpu], notes: List[Note]) -> List[Problem]:
    source, text = kernel_log
    events, gone = xid_events(text)
    label = {bus_key(g.bus_id): g.label for g in gpus}
    out = []
    seen = set()  # one line per (Xid, GPU): a flapping link repeats its Xid thousands of times
    for e in events:
        if not e.bad or (e.xid, e.pci) in seen:
            continue
        seen.add((e.xid, e.pci))
        count = sum(1 for x in events if (x.xid, x.pci) == (e.xid, e.pci))
        meaning = XID_CATALOG.get(e.xid, ("",))[0]
        out.append(Problem("GPU_XID", "Xid %d (%s) on %s since boot%s: %s" % (
            e.xid, meaning, label.get(e.pci, e.pci), " (%d times)" % count if count > 1
            else "", e.line[:200])))
    for line in gone[:4]:
        out.append(Problem("GPU_FELL_OFF_BUS", line[:240]))
    other = sorted({e.xid for e in events if not e.bad})
    if other:
        notes.append(Note("xid", "application or driver Xid(s) since boot, not the GPU's: %s"
                          % ", ".join(str(x) for x in other)))
    if not out:
        notes.append(Note("xid", "no Xid pointing at a GPU, its memory or a link since boot "
                                 "(%s)" % source))
    return out


def _ib(ports: Sequence[IbPort], expected: Optional[int], notes: List[Note]) -> List[Problem]:
    ib = [p for p in ports if p.link_layer == "InfiniBand"]
    out = [Problem("IB_PORT_DOWN", "%s port %s is %s, not ACTIVE" % (p.hca, p.port, p.state))
           for p in ib if p.state != "ACTIVE"]
    active = [p for p in ports if p.state == "ACTIVE"]
    if expected is not None and len(active) < expected:
        out.append(Problem("IB_PORT_COUNT", "%d RDMA port(s) ACTIVE, %d expected" % (
            len(active), expected)))
    if not out:
        notes.append(Note("ib", "%d InfiniBand port(s), all ACTIVE" % len(ib) if ib else
                          "no InfiniBand port"))
    return out


# --------------------------------------------------------------------------- the node


def run(argv: Sequence[str], timeout: float) -> Ran:
    """One command in its own session, killed with its group when it runs over."""
    try:
        proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                env=with_system_path(os.environ))
    except FileNotFoundError:
        return Ran(None, "", "%s: not found" % argv[0], missing=True)
    except OSError as exc:
        return Ran(None, "", "%s: %s" % (argv[0], exc.strerror), missing=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.communicate()
        return Ran(None, "", "", timed_out=True)
    return Ran(proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))


def query_gpus(runner: Callable[[Sequence[str], float], Ran], timeout: float) -> Ran:
    """--query-gpu with the check's fields, each one the driver refuses dropped."""
    fields = list(QUERY_FIELDS)
    ran = Ran(None, "", "")
    for _ in range(len(QUERY_FIELDS)):
        ran = runner(["nvidia-smi", "--query-gpu=" + ",".join(fields), "--format=csv"],
                     timeout)
        if ran.rc == 0 or ran.missing or ran.timed_out:
            return ran
        m = _REFUSED.search(ran.out + "\n" + ran.err)
        if not m or m.group(1) not in fields or m.group(1) in ("index", "pci.bus_id"):
            return ran
        fields.remove(m.group(1))
    return ran


def gather(sysfs: str = "/sys", timeout: float = DEFAULT_TIMEOUT_S,
           runner: Callable[[Sequence[str], float], Ran] = run,
           skip: Sequence[str] = ()) -> Inputs:
    """Ask the node, the commands side by side (the slowest bounds the check)."""
    got = {}  # type: Dict[str, Any]

    def ask(name: str, fn: Callable[[], Any]) -> threading.Thread:
        def body() -> None:
            got[name] = fn()
        t = threading.Thread(target=body, daemon=True)
        t.start()
        return t

    threads = [ask("query", lambda: query_gpus(runner, timeout))]
    if "busy" not in skip:
        threads.append(ask("apps", lambda: runner(COMPUTE_APPS, timeout)))
    if "fabric" not in skip:
        threads.append(ask("smi_q", lambda: runner(["nvidia-smi", "-q"], timeout)))
    if "xid" not in skip:
        threads.append(ask("log", lambda: _kernel_log(runner, timeout)))
    pci = pci_gpus(sysfs)
    ports = ib_ports(sysfs) if "ib" not in skip else []
    for t in threads:
        t.join(timeout * len(QUERY_FIELDS) + 5)
    query = got.get("query")
    if query is not None and query.missing:
        query = None
    log, why = got.get("log") or (None, "skipped")
    return Inputs(query, got.get("apps"), got.get("smi_q"), log, why, pci, ports)


def _kernel_log(runner: Callable[[Sequence[str], float], Ran], timeout: float
                ) -> Tuple[Optional[Tuple[str, str]], str]:
    """dmesg (this boot's ring buffer), else the journal's kernel messages of this boot."""
    whys = []
    for argv in (["dmesg"], ["journalctl", "-k", "-b", "--no-pager", "-q"]):
        ran = runner(argv, timeout)
        if ran.rc == 0:
            return (argv[0], ran.out), ""
        whys.append("%s: %s" % (argv[0], "not found" if ran.missing else "timed out"
                                if ran.timed_out else (ran.err.strip().splitlines()[-1:]
                                                       or ["exit %s" % ran.rc])[0][:120]))
    return None, "; ".join(whys)


def drain_reason(codes: Sequence[str]) -> str:
    """`gpuvet CODE CODE ...`, the codes once each in order, cut at REASON_MAX."""
    words = ["gpuvet"]
    for c in codes:
        if c not in words:
            words.append(c)
    reason = " ".join(words)
    if len(reason) <= REASON_MAX:
        return reason
    kept = "gpuvet"
    for i, c in enumerate(words[1:], 1):
        more = " +%d" % (len(words) - 1 - i)
        if len(kept + " " + c + more) > REASON_MAX:
            return kept + " +%d" % (len(words) - i)
        kept += " " + c
    return kept


def node_state(node: str, runner: Callable[[Sequence[str], float], Ran], timeout: float
               ) -> Tuple[Optional[str], Optional[str]]:
    """(State, Reason) of a node from `scontrol -o show node`; (None, None) unknown."""
    ran = runner(["scontrol", "-o", "show", "node", node], timeout)
    if ran.rc != 0:
        return None, None
    m = re.search(r"\bState=(\S+)", ran.out)
    r = re.search(r"\bReason=(.*?)(?: \[[^\]]*\])?(?: \w+=|$)", ran.out)
    return (m.group(1) if m else None), (r.group(1).strip() if r else None)


def drain(node: str, codes: Sequence[str], runner: Callable[[Sequence[str], float], Ran],
          timeout: float) -> str:
    """Drain this node with the reason, unless someone else already took it out of
    service (a drained, down or failed node with a reason not gpuvet's keeps its own)."""
    reason = drain_reason(codes)
    state, old = node_state(node, runner, timeout)
    if state and re.search(r"DRAIN|DOWN|FAIL", state, re.I) and old and \
            not old.startswith("gpuvet "):
        return "not drained: %s is already %s with the reason %r" % (node, state, old)
    ran = runner(["scontrol", "update", "nodename=" + node, "state=drain",
                  "reason=" + reason], timeout)
    if ran.rc == 0:
        return "drained %s: %s" % (node, reason)
    why = "scontrol not found" if ran.missing else "timed out" if ran.timed_out else (
        (ran.err or ran.out).strip().splitlines()[-1:] or ["exit %s" % ran.rc])[0][:160]
    return "could not drain %s: %s" % (node, why)


def job_gpus(environ: Dict[str, str]) -> Optional[List[int]]:
    """The GPUs of the job a Prolog runs for (SLURM_JOB_GPUS: `0,1`); None outside one."""
    text = environ.get("SLURM_JOB_GPUS")
    if text is None:
        return None
    return [int(x) for x in re.findall(r"\d+", text)]


def with_system_path(environ: Any) -> Dict[str, str]:
    """The environment with the system's folders after its PATH: Slurm starts a Prolog
    and the HealthCheckProgram with no search path."""
    have = [p for p in environ.get("PATH", "").split(os.pathsep) if p]
    env = dict(environ)
    env["PATH"] = os.pathsep.join(have + [p for p in SYSTEM_PATH if p not in have])
    return env


# --------------------------------------------------------------------------- command


class UsageFailure(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageFailure(message)


def _count(text: str) -> int:
    if not re.fullmatch(r"\d+", text.strip()):
        raise argparse.ArgumentTypeError("%r is not a count (0, 1, 8 ...)" % text)
    return int(text)


def add_arguments(parser: Any) -> None:
    """The ``nodecheck`` subcommand's options (argparse)."""
    parser.add_argument("--gpus", type=_count, default=None, metavar="N",
                        help="GPUs this node must show (default: the NVIDIA GPUs on its PCI "
                             "bus)")
    parser.add_argument("--ib-ports", type=_count, default=None, metavar="N",
                        help="RDMA ports that must be ACTIVE (default: every InfiniBand port "
                             "found)")
    parser.add_argument("--skip", action="append", default=[], choices=CHECKS,
                        help="leave a check out (repeat it): busy on a node shared by jobs")
    parser.add_argument("--drain", action="store_true",
                        help="on a problem, drain this node: scontrol update nodename=NODE "
                             "state=drain reason=\"gpuvet CODE ...\"")
    parser.add_argument("--node", default=None,
                        help="this node's Slurm name (default: SLURMD_NODENAME, else the short "
                             "hostname)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                        help="seconds each command may take (default: 20)")
    parser.add_argument("--sysfs", default="/sys", metavar="DIR",
                        help="where sysfs is (default: /sys)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="also say what passed and what could not be checked")


def check(args: Any, *, runner: Callable[[Sequence[str], float], Ran] = run,
          environ: Optional[Dict[str, str]] = None,
          write: Callable[[str], None] = print) -> int:
    """The whole check with parsed options; returns the exit code."""
    env = dict(os.environ if environ is None else environ)
    inp = gather(args.sysfs, args.timeout, runner, args.skip)
    if inp.query is None and not inp.pci and not args.gpus:
        write("no NVIDIA driver (nvidia-smi not found) and no NVIDIA GPU on the PCI bus: "
              "nothing checked (exit %d)" % EXIT_NO_DRIVER)
        return EXIT_NO_DRIVER
    problems, notes = judge(inp, expected_gpus=args.gpus, skip=args.skip,
                            job_gpus=job_gpus(env), ib_expected=args.ib_ports)
    for p in problems:
        write("%s: %s" % (p.code, p.message))
    if args.verbose:
        for n in notes:
            write("ok %s: %s" % (n.check, n.message) if not n.message.startswith(
                ("not checked", "WARN")) else "%s: %s" % (n.check, n.message))
    if not problems:
        return EXIT_OK
    if args.drain:
        node = args.node or env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
        write(drain(node, [p.code for p in problems], runner, args.timeout))
    return EXIT_PROBLEM


def main(args: Any) -> int:
    """Entry point for ``python3 -m payload nodecheck`` (parsed argparse namespace)."""
    return check(args)


def baked(source: str, argv: Sequence[str]) -> str:
    """This file's source with `argv` as the options it runs with (BAKED_ARGS)."""
    at = re.compile(r"^BAKED_ARGS = \[\]  # type: List\[str\]$", re.M)
    if len(at.findall(source)) != 1:
        raise ValueError("BAKED_ARGS not found once in the node check's source")
    return at.sub(lambda m: "BAKED_ARGS = %r  # type: List[str]" % (list(argv),), source)


def parse(argv: Sequence[str]) -> Any:
    """The options of a standalone run; UsageFailure for a mistake."""
    parser = _Parser(prog="gpuvet-nodecheck", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return parser.parse_args(list(argv))


if __name__ == "__main__":  # the file on its own: python3 nodecheck.py [options]
    try:
        _args = parse(BAKED_ARGS + sys.argv[1:])
    except UsageFailure as _exc:
        sys.stderr.write("gpuvet-nodecheck: %s\n" % _exc)
        sys.exit(EXIT_USAGE)
    sys.exit(check(_args))
