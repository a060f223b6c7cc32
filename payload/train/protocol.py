"""The JSON-lines events the rank program writes and the supervisor and the
controller read. One place for the names, so the three cannot drift apart.

Every rank appends one JSON object per line to ``rank<R>.jsonl`` in its output
directory and flushes it; rank 0 also prints each line. A line that does not
parse (a process killed mid-write) is skipped by readers, never guessed at.

Standard library only, Python 3.8 compatible.
"""

import json
import os
from typing import Any, Dict, Iterator, List, Optional

START = "start"  # config, versions, devices, deterministic settings, launch_s, init_s
WARMUP = "warmup"  # seconds of the discarded first pass (compilation included)
STEP = "step"  # one optimizer step: loss (hex and repr), lr, times, tokens, memory
SAVING = "saving"  # written before the first byte of a checkpoint
COMMIT = "commit"  # every data file written; their hashes and the manifest come next
SAVED = "saved"  # after the manifest: the checkpoint is complete
SKIP_CKPT = "skip_ckpt"  # a checkpoint found incomplete or corrupt on restore
LOADED = "loaded"  # a checkpoint restored, with the hashes saved and loaded
THROUGHPUT = "throughput"  # the verified steps are done; the fastest kernels take over
TSTEP = "throughput_step"  # a timed step on the fastest kernels (reference phase only)
END = "end"  # the run reached its last step
ERROR = "error"  # oom, nonfinite loss, no checkpoint, ... with a kind

# exit codes of the rank program that say more than "failed"
RC_NONFINITE = 4
RC_OOM = 5
RC_NO_CHECKPOINT = 6
RC_RESTORE_MISMATCH = 7
RC_GATE_STOPPED = 8  # started ahead of its turn and told not to run

PHASES = ("reference", "kill", "restore")
# where the kill phase is SIGKILLed: after a step; when a later save begins (on a large
# checkpoint that lands among its files); or when its files are written but not the manifest
KILL_POINTS = ("after-step", "mid-save", "before-manifest")


def rank_file(out_dir: str, rank: int) -> str:
    return os.path.join(out_dir, "rank%d.jsonl" % rank)


def parse_lines(text: str) -> Iterator[Dict[str, Any]]:
    """Events in order; torn or foreign lines are skipped."""
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if isinstance(ev, dict) and "event" in ev:
            yield ev


def read_events(path: str) -> List[Dict[str, Any]]:
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as f:
            return list(parse_lines(f.read()))
    except OSError:
        return []


class Follower:
    """Reads the events appended to a file since the last call (the supervisor's eye)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._offset = 0
        self._partial = ""

    def new_lines(self) -> str:
        """The whole lines appended since the last call (a line still being written waits)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read().decode("utf-8", "replace")
                self._offset = f.tell()
        except OSError:
            return ""
        complete, sep, self._partial = (self._partial + chunk).rpartition("\n")
        return complete + sep

    def poll(self) -> List[Dict[str, Any]]:
        text = self.new_lines()
        return list(parse_lines(text)) if text else []


def last_of(events: List[Dict[str, Any]], kind: str) -> Optional[Dict[str, Any]]:
    for ev in reversed(events):
        if ev.get("event") == kind:
            return ev
    return None
