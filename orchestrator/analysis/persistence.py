"""Which filesystems of a node outlive the instance, read from what its preflight saw
mounted, and where the training step's probes of the checkpoint folder are: what the
decision needs to tell a checkpoint folder the tester put on scratch (the setup's side,
with the filesystem to use instead) from a node that has nothing persistent (the
provider's side)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import ParseError
from orchestrator.judging.storage import EPHEMERAL_FSTYPES, EPHEMERAL_PATH
from orchestrator.parsers.recipe import parse_mounts
from orchestrator.records import Finding


@dataclass(frozen=True)
class Persistent:
    """A filesystem of a node that outlives the instance: where a ckpt_dir can go."""

    node: str
    mount_point: str
    fstype: str
    device: str

    def __str__(self) -> str:
        return f"{self.mount_point} ({self.fstype}, {self.device})"


_PSEUDO = {"proc", "sysfs", "cgroup", "cgroup2", "devpts", "mqueue", "debugfs", "tracefs",
           "securityfs", "pstore", "bpf", "configfs", "fusectl", "hugetlbfs", "autofs",
           "binfmt_misc", "nsfs", "efivarfs", "rpc_pipefs", "selinuxfs"}


def persistent_mounts(run_paths: Mapping[str, Path], fs: Sequence[Finding]
                      ) -> dict[str, list[Persistent]]:
    """Per node: the filesystems its preflight saw mounted that outlive the instance
    (a block device or a network filesystem, not under a scratch path). A node whose
    mounts were not read is absent: nothing is known about it."""
    out: dict[str, list[Persistent]] = {}
    for run_id in dict.fromkeys(f.run_id for f in fs if f.step == "preflight"):
        path = run_paths.get(run_id)
        if path is None:
            continue
        for raw in sorted((path / "nodes").glob("*/preflight/raw/mounts.txt")):
            node = raw.parts[-4]
            try:
                facts = parse_mounts(raw.read_text(encoding="utf-8", errors="replace"))
            except (OSError, ParseError):
                continue
            out[node] = [Persistent(node, m.mount_point, m.fstype, m.device)
                         for m in facts.mounts
                         if m.fstype not in EPHEMERAL_FSTYPES and m.fstype not in _PSEUDO
                         and not EPHEMERAL_PATH.search(m.mount_point)
                         and (m.device.startswith("/dev/") or ":" in m.device
                              or m.fstype in ("nfs", "nfs4", "lustre", "gpfs", "beegfs",
                                              "cephfs", "wekafs", "fuse.juicefs"))]
    return out


def where_to(node: str, mounts: Mapping[str, list[Persistent]]) -> Persistent | None:
    """The persistent filesystem to point ckpt_dir at: a shared or dedicated one before
    the root disk."""
    cands = mounts.get(node) or []
    others = [m for m in cands if m.mount_point != "/"]
    return (others or cands)[0] if cands else None


def train_probes(fs: Sequence[Finding], run_paths: Mapping[str, Path]) -> list[str]:
    """The training step's probe documents (nodes/<n>/train/probe.json) of the provider's
    training runs: the node-side record of where checkpoints went."""
    out = []
    for run_id in dict.fromkeys(f.run_id for f in fs if f.step == "train"):
        path = run_paths.get(run_id)
        if path is None:
            continue
        for p in sorted((path / "nodes").glob("*/train/probe.json")):
            out.append(f"{run_id}/{p.relative_to(path)}")
    return out
