"""``python3 -m payload train-probe``: where this node's checkpoint directory
lives, and which other nodes see the same storage.

The controller runs it twice on every node: first each node leaves a token
file in ``<ckpt_dir>/.gpuvet-share/``; then each lists the tokens it sees. A
node that sees another's token shares its storage (NFS, a cluster filesystem),
so a checkpoint saved on one can be restored on the other. The mount, the
filesystem type and, for NVMe devices, the device model (cloud instance
stores name themselves there) tell whether the directory dies with the
instance.

Standard library only, Python 3.8 compatible.
"""

import importlib.util
import json
import os
import re
import sys
from typing import Any, Dict, Optional

from payload.ncclbuild import visible_gpus
from payload.probes import path_info

SHARE_DIR = ".gpuvet-share"
_TOKEN = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


def add_arguments(p: Any) -> None:
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--token", help="leave this token in the share folder")
    p.add_argument("--remove", help="remove this token after listing")


def block_model(source: Optional[str]) -> Optional[str]:
    """The model string of the block device behind a mount source like /dev/nvme1n1p1."""
    if not source or not source.startswith("/dev/"):
        return None
    name = os.path.basename(os.path.realpath(source))
    node = os.path.realpath(os.path.join("/sys/class/block", name))
    for _ in range(3):  # a partition's model sits with its parent disk
        path = os.path.join(node, "device", "model")
        if os.path.isfile(path):
            try:
                with open(path) as f:
                    return f.read().strip() or None
            except OSError:
                return None
        node = os.path.dirname(node)
    return None


def probe(ckpt_dir: str, token: Optional[str], remove: Optional[str]) -> Dict[str, Any]:
    doc: Dict[str, Any] = {"tool": "gpuvet-train-probe", "ckpt_dir": ckpt_dir,
                           "existed": os.path.isdir(ckpt_dir), "error": None, "tokens": []}
    share = os.path.join(ckpt_dir, SHARE_DIR)
    try:
        os.makedirs(share, exist_ok=True)
        if token:
            if not _TOKEN.match(token):
                raise ValueError("bad token %r" % token)
            with open(os.path.join(share, token), "w") as f:
                f.write(token + "\n")
                f.flush()
                os.fsync(f.fileno())
        doc["tokens"] = sorted(os.listdir(share))
        if remove and _TOKEN.match(remove):
            try:
                os.unlink(os.path.join(share, remove))
            except FileNotFoundError:
                pass
    except (OSError, ValueError) as exc:
        doc["error"] = "%s: %s" % (type(exc).__name__, exc)
    info = path_info(ckpt_dir)
    doc["path"] = info
    mount = info.get("mount") or {}
    doc["block_model"] = block_model(mount.get("source"))
    doc["gpus"] = visible_gpus(dict(os.environ))
    # found, not imported: importing torch costs seconds and the probe runs on every node
    doc["torch"] = importlib.util.find_spec("torch") is not None
    return doc


def main(args: Any) -> int:
    doc = probe(args.ckpt_dir, args.token, args.remove)
    sys.stdout.write(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return 0
