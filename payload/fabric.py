"""``python3 -m payload fabric``: one read-only snapshot of the InfiniBand/RoCE ports.

For each ``/sys/class/infiniband/<dev>/ports/<port>/``: ``state``, ``phys_state``,
``rate``, ``link_layer``, the error counters of ``counters/`` (and ``port_xmit_wait``
where the driver has it), the non-zero entries of ``pkeys/``, and for a RoCE port
(link layer Ethernet) the type of every populated GID (``gid_attrs/types/*``: "RoCE
v2", "IB/RoCE v1") with its netdev and that netdev's MTU. Nothing is written and
nothing is run: only small sysfs files are read, each cut at ``MAX_FILE_BYTES``, at
most ``MAX_DEVICES`` devices, ``MAX_PORTS`` ports each, ``MAX_TABLE`` P_Key and GID
entries per port and ``MAX_FILES`` files in all; a snapshot cut short says so
(``truncated``). A node without the directory is ``present: false``, a fact, not an
error.

Standard library only, Python 3.8 compatible.
"""

import datetime
import json
import os
import re
import sys
import time
from typing import Any, Dict, List, Optional

IB_ROOT = "/sys/class/infiniband"
NET_ROOT = "/sys/class/net"
SCHEMA = 1

# the counters read (in sysfs's names); port_xmit_wait only where it exists
COUNTERS = (
    "symbol_error",
    "link_downed",
    "port_rcv_errors",
    "link_error_recovery",
    "port_xmit_discards",
    "port_rcv_remote_physical_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "port_xmit_wait",
)

MAX_DEVICES = 64
MAX_PORTS = 16
MAX_TABLE = 256  # P_Key and GID entries read per port
MAX_FILES = 40000
MAX_FILE_BYTES = 256
_ZERO_GID = re.compile(r"^[0:]+$")


class _Budget:
    def __init__(self, files: int) -> None:
        self.left = files
        self.truncated = False

    def take(self) -> bool:
        if self.left <= 0:
            self.truncated = True
            return False
        self.left -= 1
        return True


def _read(path: str, budget: _Budget) -> Optional[str]:
    """The file's text, stripped; None when it cannot be read (an unpopulated GID
    type answers EINVAL) or the budget is spent."""
    if not budget.take():
        return None
    try:
        with open(path, "rb") as f:
            return f.read(MAX_FILE_BYTES).decode("utf-8", errors="replace").strip()
    except OSError:
        return None


def _listdir(path: str, limit: int, budget: _Budget) -> List[str]:
    try:
        names = os.listdir(path)
    except OSError:
        return []
    if len(names) > limit:
        budget.truncated = True
    return sorted(names, key=_natural)[:limit]


def _natural(name: str) -> Any:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _netdevs(dev_dir: str, budget: _Budget) -> Dict[int, str]:
    """Port number -> netdev of the device's PCI function (``device/net/*``, each
    netdev's ``dev_port`` is the port number less one)."""
    net_dir = os.path.join(dev_dir, "device", "net")
    out: Dict[int, str] = {}
    names = _listdir(net_dir, MAX_PORTS * 4, budget)
    for name in names:
        dev_port = _read(os.path.join(net_dir, name, "dev_port"), budget)
        port = int(dev_port) + 1 if dev_port and dev_port.isdigit() else 1
        out.setdefault(port, name)
    return out


def _port(port_dir: str, number: int, netdev: Optional[str], net_root: str,
          budget: _Budget) -> Dict[str, Any]:
    rec: Dict[str, Any] = {"port": number}
    for key in ("state", "phys_state", "rate", "link_layer"):
        rec[key] = _read(os.path.join(port_dir, key), budget)
    counters: Dict[str, int] = {}
    unreadable: Dict[str, str] = {}
    for name in COUNTERS:
        text = _read(os.path.join(port_dir, "counters", name), budget)
        if text is None:
            continue
        if text.isdigit():
            counters[name] = int(text)
        else:  # "N/A (no PMA)" on iWARP adapters
            unreadable[name] = text
    rec["counters"] = counters
    if unreadable:
        rec["counters_unreadable"] = unreadable
    pkeys: Dict[str, str] = {}
    for idx in _listdir(os.path.join(port_dir, "pkeys"), MAX_TABLE, budget):
        text = _read(os.path.join(port_dir, "pkeys", idx), budget)
        if text and _pkey_set(text):
            pkeys[idx] = text
    rec["pkeys"] = pkeys
    if (rec.get("link_layer") or "").lower() == "ethernet":
        gids: Dict[str, Dict[str, Optional[str]]] = {}
        for idx in _listdir(os.path.join(port_dir, "gids"), MAX_TABLE, budget):
            gid = _read(os.path.join(port_dir, "gids", idx), budget)
            if not gid or _ZERO_GID.match(gid):
                continue
            gids[idx] = {
                "gid": gid,
                "type": _read(os.path.join(port_dir, "gid_attrs", "types", idx), budget),
                "ndev": _read(os.path.join(port_dir, "gid_attrs", "ndevs", idx), budget),
            }
        rec["gids"] = gids
        if netdev is None:
            netdev = next((g["ndev"] for g in gids.values() if g.get("ndev")), None)
    rec["netdev"] = netdev
    if netdev:
        mtu = _read(os.path.join(net_root, netdev, "mtu"), budget)
        rec["mtu"] = int(mtu) if mtu and mtu.isdigit() else None
    return rec


def _pkey_set(text: str) -> bool:
    """An entry in use: its 15 key bits are not zero (0x0000 and 0x8000 are empty)."""
    try:
        return int(text, 16) & 0x7FFF != 0
    except ValueError:
        return True  # kept as read: the controller says it is not a P_Key


def snapshot(ib_root: str = IB_ROOT, net_root: str = NET_ROOT,
             max_files: int = MAX_FILES) -> Dict[str, Any]:
    """The snapshot document (JSON-ready)."""
    budget = _Budget(max_files)
    now = datetime.datetime.now(datetime.timezone.utc)
    doc: Dict[str, Any] = {
        "schema": SCHEMA,
        "root": ib_root,
        "taken_at": now.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "monotonic_s": round(time.monotonic(), 3),
        "present": os.path.isdir(ib_root),
        "devices": [],
    }
    for name in _listdir(ib_root, MAX_DEVICES, budget):
        dev_dir = os.path.join(ib_root, name)
        netdevs = _netdevs(dev_dir, budget)
        ports = []
        for p in _listdir(os.path.join(dev_dir, "ports"), MAX_PORTS, budget):
            if not p.isdigit():
                continue
            ports.append(_port(os.path.join(dev_dir, "ports", p), int(p),
                               netdevs.get(int(p)), net_root, budget))
        doc["devices"].append({"name": name, "ports": ports})
    doc["truncated"] = budget.truncated
    return doc


def add_arguments(parser: Any) -> None:
    """The ``fabric`` subcommand's options (argparse)."""
    parser.add_argument("--root", default=IB_ROOT, help="the InfiniBand class directory "
                        "(default: %(default)s)")
    parser.add_argument("--net-root", default=NET_ROOT, help="the net class directory "
                        "(default: %(default)s)")


def main(args: Any) -> int:
    """Entry point for ``python3 -m payload fabric``: the snapshot as one JSON document."""
    sys.stdout.write(json.dumps(snapshot(args.root, args.net_root)) + "\n")
    sys.stdout.flush()
    return 0
