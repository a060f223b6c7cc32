"""Whether a checkpoint survives: where the checkpoint directory lives.

A checkpoint on a filesystem that dies with the instance (tmpfs, an overlay),
under a path that is scratch by convention (/tmp, /dev/shm, a cloud's
ephemeral mount), or on an instance-store disk does not outlive the node it
was written on. Preflight's CKPT_DIR_EPHEMERAL and the training step's
CKPT_NOT_PERSISTENT judge the same rule from these definitions.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from orchestrator.judging.sink import Sink

EPHEMERAL_FSTYPES = {"tmpfs", "ramfs", "overlay", "overlayfs", "aufs", "devtmpfs", "squashfs"}
EPHEMERAL_PATH = re.compile(r"^/(tmp|dev/shm|run)(/|$)|^/(mnt/)?(ephemeral\d*|local_disk\d*|"
                            r"mnt/resource|mnt/local|nvme\d*)(/|$)")
# block device models of disks that belong to the instance, not to a volume
INSTANCE_STORE = re.compile(r"Instance Storage|EphemeralDisk|nvme_card", re.I)


def storage_findings(sink: Sink, node: str, doc: dict[str, Any], probe_file: Path,
                     configured: bool) -> None:
    """Where the checkpoint directory lives (the payload's train-probe document `doc`,
    read from `probe_file`): a filesystem that dies with the instance. `configured`:
    whether the inventory names a ckpt_dir (else it defaults under the work dir)."""
    path = doc.get("path") or {}
    mount = path.get("mount") or {}
    fstype = mount.get("fstype")
    model = doc.get("block_model") or ""
    where = (f"{doc.get('ckpt_dir')} is on {fstype or '?'} (mount {mount.get('mount_point')}, "
             f"source {mount.get('source')}{', device ' + model if model else ''})")
    if not configured:
        sink.add("CKPT_DIR_DEFAULT", "INFO", f"{node}: no ckpt_dir in the inventory: "
                 f"checkpoints go under the work dir; {where}", [probe_file])
    real = str(path.get("realpath") or doc.get("ckpt_dir") or "")
    if fstype in EPHEMERAL_FSTYPES:
        sink.add("CKPT_NOT_PERSISTENT", "WARN", f"{node}: {where}: the checkpoint would not "
                 "survive the instance", [probe_file], reason="ephemeral-fs", fstype=fstype)
    elif EPHEMERAL_PATH.search(real):
        # the paths preflight's CKPT_DIR_EPHEMERAL names: cleared at boot, or instance scratch
        sink.add("CKPT_NOT_PERSISTENT", "WARN", f"{node}: {where}: under a scratch path "
                 f"({real}), cleared when the instance restarts or goes", [probe_file],
                 reason="scratch-path", fstype=fstype)
    elif INSTANCE_STORE.search(model):
        sink.add("CKPT_NOT_PERSISTENT", "WARN", f"{node}: {where}: an instance store, lost "
                 "when the instance stops", [probe_file], reason="instance-store",
                 fstype=fstype)
