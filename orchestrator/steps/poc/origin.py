"""Which node a PoC folder is filed under, and when it ran.

The inventory's node of the provider (its only one, or the one the folder's
hostname names; `-n` chooses among several), never the hostname a cloud image
prints (`vm`, `ubuntu`): that and the GPU UUIDs are kept as facts of the run.
The folder's time window (checked-at.txt or file modification times) is what
the cost of an imported PoC is billed over.
"""

from __future__ import annotations

import contextlib
from datetime import datetime, timezone
from pathlib import Path

from orchestrator import inventory as inventory_mod
from orchestrator.errors import UsageError
from orchestrator.steps.poc.files import PocFile


def inventory_node(inventory: Path | None, provider: str, found: str | None) -> str | None:
    """The inventory's node of `provider` a PoC folder is filed under: its only node, or the
    one whose name or host is the folder's hostname; None without an inventory. A provider
    of several nodes that the hostname does not decide is a UsageError asking for -n: the
    folder's hostname (a cloud image's `vm`, `ubuntu`) is a fact about it, not a node name."""
    if inventory is None:
        return None
    nodes = [n for n in inventory_mod.load(inventory).select(providers=[provider])
             if n.provider == provider]
    if len(nodes) == 1:
        return nodes[0].name
    low = (found or "").lower()
    same = [n for n in nodes if low and low in (n.name.lower(), (n.host or "").lower(),
                                                (n.host or "").lower().split(".")[0])]
    if len(same) == 1:
        return same[0].name
    raise UsageError(f"provider {provider} has {len(nodes)} nodes in {inventory} "
                     f"({', '.join(n.name for n in nodes[:8])}) and the folder's hostname "
                     f"{found or '(none printed)'} names none of them",
                     hint="choose the node with -n NAME")


def folder_uuids(files: list[PocFile]) -> list[str]:
    """The GPU UUIDs the node's files print (kept with the run as facts of the machine)."""
    return sorted({u for f in files if f.status in ("recognised", "judged")
                   for u in f.ident.uuids})


def _utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def folder_window(files: list[PocFile], checked_at: str | None) -> dict[str, str | None]:
    """When the PoC ran, as the folder tells: from checked-at.txt (`date -Iseconds`; a date
    without a zone is read as UTC) or the oldest file's modification time, to the newest
    file's (`tar`, `rsync -a` and `scp -p` keep them). Files whose times all fall within
    two seconds were copied without them: the end is then unknown (`why`), never guessed."""
    # the times were taken as each file was read (a regular file's; never a link's)
    stamps = [f.mtime for f in files if f.status != "skipped" and f.mtime is not None]
    start: str | None = None
    start_from = "no checked-at.txt and no file times"
    if stamps:
        start, start_from = _utc(min(stamps)), "the oldest file's modification time"
    if checked_at:
        with contextlib.suppress(ValueError):
            at = datetime.fromisoformat(checked_at.replace("Z", "+00:00"))
            zone = "" if at.tzinfo else " (no zone: read as UTC)"
            at = at if at.tzinfo else at.replace(tzinfo=timezone.utc)
            start, start_from = _utc(at.timestamp()), f"checked-at.txt{zone}"
    if len(stamps) < 2 or max(stamps) - min(stamps) < 2:
        why = ("the files' modification times are all within two seconds (copied without "
               "them: use tar, rsync -a or scp -p)") if stamps else "no file times"
        return {"start": start, "end": None, "start_from": start_from, "end_from": None,
                "why": why}
    end = _utc(max(stamps))
    if start is not None and end < start:
        return {"start": start, "end": None, "start_from": start_from, "end_from": None,
                "why": f"the newest file ({end}) is older than {start_from} ({start})"}
    return {"start": start, "end": end, "start_from": start_from,
            "end_from": "the newest file's modification time", "why": None}
