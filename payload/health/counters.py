"""What the health step reads before and after the load, as raw files: the
controller parses them and the difference is the verdict.

Per node, once before the per-GPU processes start and once after they end:
ECC (volatile and aggregate), retired pages and remapped rows with their pending
flags, clock event reasons and their counters, PCIe links (``--query-gpu``, with
fields the driver refuses dropped one by one); the same and the PCIe replay
counters and processes in ``nvidia-smi -q -x``; NVLink error counters
(``nvidia-smi nvlink -e``); the processes holding GPU memory
(``--query-compute-apps``); the links and AER error counts in sysfs; and the kernel
log (``dmesg``, ``journalctl -k``), where Xid lines land. A source that cannot be
read is recorded as such ("not readable", with the reason), never as empty.

Standard library only, Python 3.8 compatible.
"""

import csv
import io
import json
import os
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from payload.proc import run_command, which

# --query-gpu fields the health step compares before and after. Older drivers refuse
# some (the event-reason counters came in R535, retired_pages.* counts are absent on
# GPUs without page retirement); a refused field is dropped and the query repeated.
HEALTH_FIELDS = [
    "index", "uuid", "pci.bus_id", "name", "memory.total", "memory.used",
    "ecc.mode.current",
    "ecc.errors.corrected.volatile.total", "ecc.errors.uncorrected.volatile.total",
    "ecc.errors.corrected.aggregate.total", "ecc.errors.uncorrected.aggregate.total",
    "retired_pages.single_bit_ecc.count", "retired_pages.double_bit.count",
    "retired_pages.pending",
    "remapped_rows.correctable", "remapped_rows.uncorrectable", "remapped_rows.pending",
    "remapped_rows.failure",
    "clocks_event_reasons.active",
    "clocks_event_reasons_counters.sw_power_cap",
    "clocks_event_reasons_counters.sw_thermal_slowdown",
    "clocks_event_reasons_counters.hw_thermal_slowdown",
    "clocks_event_reasons_counters.hw_power_brake_slowdown",
    "pcie.link.gen.current", "pcie.link.gen.max", "pcie.link.width.current",
    "pcie.link.width.max",
    "power.limit", "power.default_limit", "enforced.power.limit",
    "clocks.max.sm", "clocks.max.memory", "temperature.gpu", "temperature.memory",
]
# the older spelling a driver before R535 knows the event reasons by
FIELD_ALIASES = {"clocks_event_reasons.active": "clocks_throttle_reasons.active"}
COMPUTE_APPS_ARGV = ["nvidia-smi", "--query-compute-apps=gpu_uuid,pid,process_name,used_memory",
                     "--format=csv"]
_REFUSED = re.compile(r'Field "([^"]+)" is not a valid field to query', re.I)
_SYSFS_PCI = "/sys/bus/pci/devices"
_SYSFS_FILES = ("current_link_speed", "current_link_width", "max_link_speed", "max_link_width",
                "aer_dev_correctable", "aer_dev_nonfatal", "aer_dev_fatal")
TIMEOUT_S = 60.0


def query_fields_argv(fields: Sequence[str]) -> List[str]:
    return ["nvidia-smi", "--query-gpu=" + ",".join(fields), "--format=csv"]


def run_health_query(env: Optional[Dict[str, str]] = None) -> Tuple[Dict[str, Any], List[str]]:
    """The health query, repeated without each field the driver refuses.

    Returns the record of the last run and the fields it asked for; the record's
    ``dropped`` lists what was refused (an alias tried first).
    """
    fields = list(HEALTH_FIELDS)
    dropped: List[str] = []
    rec: Dict[str, Any] = {}
    for _ in range(len(HEALTH_FIELDS) + len(FIELD_ALIASES) + 1):
        rec = run_command(query_fields_argv(fields), TIMEOUT_S, env=env)
        if rec["rc"] == 0 or rec["missing"]:
            break
        m = _REFUSED.search(rec["stdout"] + "\n" + rec["stderr"])
        if not m or m.group(1) not in fields:
            break
        bad = m.group(1)
        i = fields.index(bad)
        if bad in FIELD_ALIASES:
            fields[i] = FIELD_ALIASES[bad]
        else:
            del fields[i]
        dropped.append(bad)
    rec["dropped"] = dropped
    return rec, fields


def csv_column(text: str, name: str) -> List[str]:
    """One column of nvidia-smi's CSV (header with units, e.g. `pci.bus_id`)."""
    rows = list(csv.reader(io.StringIO(text)))
    if not rows:
        return []
    header = [h.strip().split(" [")[0].lower() for h in rows[0]]
    if name.lower() not in header:
        return []
    i = header.index(name.lower())
    return [r[i].strip() for r in rows[1:] if len(r) == len(header)]


def sysfs_bus_id(bus_id: str) -> str:
    """`00000000:3B:00.0` (nvidia-smi) -> `0000:3b:00.0` (sysfs)."""
    s = bus_id.strip().lower()
    dom, _, rest = s.partition(":")
    if len(dom) > 4 and rest:
        s = dom[-4:] + ":" + rest
    return s


def read_sysfs_links(bus_ids: Sequence[str], root: str = _SYSFS_PCI) -> Dict[str, Any]:
    """Link speed and width, and the AER error counts, per GPU from sysfs."""
    out: Dict[str, Any] = {}
    for bid in bus_ids:
        dev = sysfs_bus_id(bid)
        entry: Dict[str, Any] = {"path": os.path.join(root, dev)}
        for name in _SYSFS_FILES:
            try:
                with open(os.path.join(root, dev, name), "r") as f:
                    entry[name] = f.read().strip()
            except OSError as exc:
                entry[name] = None
                entry.setdefault("unreadable", []).append("%s: %s" % (name, exc.strerror))
        out[bid] = entry
    return out


def count_processes(compute_apps_csv: str) -> int:
    return len(csv_column(compute_apps_csv, "pid"))


class Snapshot:
    """One moment's counters, written as files under ``<out>/counters/<when>/``."""

    def __init__(self, out_dir: str, when: str, device: str,
                 env: Optional[Dict[str, str]] = None) -> None:
        self.dir = os.path.join(out_dir, "counters", when)
        self.when = when
        self.device = device
        self.env = env
        self.index: Dict[str, Any] = {}
        os.makedirs(self.dir, exist_ok=True)

    def _keep(self, name: str, rec: Dict[str, Any], ext: str = "txt") -> Dict[str, Any]:
        fname = "%s.%s" % (name, ext)
        text = rec.get("stdout") or ""
        if rec.get("stderr"):
            with open(os.path.join(self.dir, name + ".stderr"), "w") as f:
                f.write(rec["stderr"])
        with open(os.path.join(self.dir, fname), "w") as f:
            f.write(text)
        entry = {k: rec.get(k) for k in ("argv", "rc", "missing", "timed_out", "error",
                                          "duration_s", "truncated")}
        entry["file"] = os.path.join("counters", self.when, fname)
        entry["readable"] = bool(rec.get("rc") == 0 and not rec.get("missing"))
        for extra in ("dropped", "fields", "note"):
            if extra in rec:
                entry[extra] = rec[extra]
        self.index[name] = entry
        return entry

    def _skip(self, name: str, note: str) -> None:
        self.index[name] = {"readable": False, "skipped": True, "note": note, "file": None}

    def take(self) -> Dict[str, Any]:
        if self.device == "cuda" and which("nvidia-smi", self.env) is not None:
            rec, fields = run_health_query(self.env)
            rec["fields"] = fields
            self._keep("query-gpu", rec, "csv")
            self._keep("nvidia-smi-q", run_command(["nvidia-smi", "-q", "-x"], TIMEOUT_S,
                                                   env=self.env), "xml")
            self._keep("nvlink-e", run_command(["nvidia-smi", "nvlink", "-e"], TIMEOUT_S,
                                               env=self.env))
            if self.when == "before":  # the topology the peer matrix is judged against
                self._keep("topo-m", run_command(["nvidia-smi", "topo", "-m"], TIMEOUT_S,
                                                 env=self.env))
            apps = run_command(COMPUTE_APPS_ARGV, TIMEOUT_S, env=self.env)
            self._keep("compute-apps", apps, "csv")
            self.index["compute-apps"]["processes"] = count_processes(apps["stdout"])
            links = read_sysfs_links(csv_column(rec["stdout"], "pci.bus_id"))
            with open(os.path.join(self.dir, "pcie-sysfs.json"), "w") as f:
                f.write(json.dumps(links, indent=1, sort_keys=True) + "\n")
            self.index["pcie-sysfs"] = {"file": os.path.join("counters", self.when,
                                                             "pcie-sysfs.json"),
                                        "readable": bool(links), "gpus": len(links)}
        else:
            why = ("device cpu" if self.device == "cpu" else "nvidia-smi not found")
            for name in ("query-gpu", "nvidia-smi-q", "nvlink-e", "compute-apps", "pcie-sysfs"):
                self._skip(name, why)
        self._kernel_log()
        with open(os.path.join(self.dir, "index.json"), "w") as f:
            f.write(json.dumps(self.index, indent=1, sort_keys=True) + "\n")
        return self.index

    def _kernel_log(self) -> None:
        """dmesg with its monotonic stamps and the journal's kernel messages of this boot
        (the same stamps), each kept as it came; a refusal is kept as the reason."""
        for name, argv in (("dmesg", ["dmesg"]),
                           ("journalctl-k", ["journalctl", "-k", "-b", "--no-pager",
                                             "-o", "short-monotonic"])):
            rec = run_command(argv, TIMEOUT_S, env=self.env)
            entry = self._keep(name, rec)
            if rec["missing"]:
                entry["note"] = "not readable: %s not found" % argv[0]
            elif rec["rc"] != 0:
                tail = (rec["stderr"] or rec["stdout"]).strip().splitlines()[-1:] or [""]
                entry["note"] = "not readable: exit %s: %s" % (rec["rc"], tail[0][:200])


def kernel_log_status(index: Dict[str, Any]) -> Dict[str, Any]:
    """Which kernel log sources could be read, for the node document."""
    readable = [n for n in ("dmesg", "journalctl-k") if index.get(n, {}).get("readable")]
    notes = {n: index[n].get("note") for n in ("dmesg", "journalctl-k")
             if n in index and not index[n].get("readable")}
    return {"readable": readable, "not_readable": notes}
