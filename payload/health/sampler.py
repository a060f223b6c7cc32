"""A second GPU sampler for the health step: power, temperatures, clocks and the clock
event reasons twice a second (``nvidia-smi --query-gpu ... -lms 500``), beside the
training step's dmon sampler. dmon has no clock reasons; this file says why a
sustained rate fell (power cap, thermal or hardware slowdown) at the moment it fell.

Standard library only, Python 3.8 compatible.
"""

import os
import time
from typing import Any, Dict, List, Optional

from payload.health import protocol
from payload.proc import which
from payload.train.telemetry import Telemetry, gpu_ids

FIELDS = ("timestamp,index,power.draw,temperature.gpu,temperature.memory,clocks.sm,"
          "clocks.mem,utilization.gpu,")
REASON_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")


def reasons_argv(reason_field: str, interval_ms: int, ids: Optional[str]) -> List[str]:
    argv = ["nvidia-smi", "--query-gpu=" + FIELDS + reason_field, "--format=csv",
            "-lms", str(interval_ms)]
    return argv + (["-i", ids] if ids else [])


class ReasonsSampler(Telemetry):
    """Runs for the length of the GPU phases, writing ``gpu-reasons.csv``."""

    def __init__(self, out_dir: str, env: Optional[Dict[str, str]] = None,
                 interval_ms: int = 500) -> None:
        super().__init__(out_dir, 1, env)
        self.interval_ms = interval_ms

    def start(self) -> Dict[str, Any]:
        self.started = time.time()
        if which("nvidia-smi", self.env) is None:
            self.note = "no clock reasons: nvidia-smi not found"
            return self.describe()
        path = os.path.join(self.out_dir, protocol.REASONS_FILE)
        for field in REASON_FIELDS:  # the event spelling since R535, the throttle one before
            proc = self._spawn(reasons_argv(field, self.interval_ms, gpu_ids(self.env)), path)
            if proc is not None:
                self.proc, self.source, self.file = proc, "query-reasons", protocol.REASONS_FILE
                self.note = None
                break
        return self.describe()

    def describe(self) -> Dict[str, Any]:
        d = super().describe()
        d["interval_ms"] = self.interval_ms
        return d
