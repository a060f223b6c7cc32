"""GPU telemetry sampled while a training job runs: the recipe's
``nvidia-smi dmon -s pucvmet -d 1 -o T``, or a ``--query-gpu`` loop where dmon
is absent or refuses to run (some vGPU and MIG setups), or a note saying why
there is none. The raw output is the record; the controller parses it.

Standard library only, Python 3.8 compatible.
"""

import os
import signal
import subprocess
import time
from typing import Any, Dict, List, Optional

from payload.proc import which

DMON_FIELDS = "pucvmet"
QUERY_FIELDS = ("timestamp,index,utilization.gpu,utilization.memory,power.draw,temperature.gpu,"
                "clocks.sm,clocks.mem,clocks_throttle_reasons.active,memory.used")
# a dmon that dies this fast did not start (unsupported, no permission)
_START_CHECK_S = 1.5


def gpu_ids(env: Dict[str, str]) -> Optional[str]:
    """The -i argument that limits sampling to this node's GPUs (simulated nodes share a host)."""
    vis = env.get("CUDA_VISIBLE_DEVICES")
    if vis is None:
        return None
    ids = [d.strip() for d in vis.split(",") if d.strip() and d.strip() != "-1"]
    return ",".join(ids) or None


def dmon_argv(interval_s: int, ids: Optional[str]) -> List[str]:
    argv = ["nvidia-smi", "dmon", "-s", DMON_FIELDS, "-d", str(interval_s), "-o", "T"]
    return argv + (["-i", ids] if ids else [])


def query_argv(interval_s: int, ids: Optional[str]) -> List[str]:
    argv = ["nvidia-smi", "--query-gpu=" + QUERY_FIELDS, "--format=csv,nounits",
            "-l", str(interval_s)]
    return argv + (["-i", ids] if ids else [])


class Telemetry:
    """One sampler process for the length of a job, writing into ``out_dir``."""

    def __init__(self, out_dir: str, interval_s: int = 1,
                 env: Optional[Dict[str, str]] = None) -> None:
        self.out_dir = out_dir
        self.interval_s = max(1, int(interval_s))
        self.env = dict(os.environ if env is None else env)
        self.proc: Optional["subprocess.Popen[bytes]"] = None
        self.source: Optional[str] = None  # dmon | query | None
        self.file: Optional[str] = None
        self.note: Optional[str] = None
        self.started: Optional[float] = None

    def _spawn(self, argv: List[str], path: str) -> Optional["subprocess.Popen[bytes]"]:
        with open(path, "wb") as out, open(path + ".stderr", "wb") as err:
            try:
                proc = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                        env=self.env, start_new_session=True)
            except OSError as exc:
                self.note = "%s: %s" % (argv[1], exc)
                return None
        deadline = time.monotonic() + _START_CHECK_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                with open(path + ".stderr", "rb") as f:
                    tail = f.read().decode("utf-8", "replace").strip()[-300:]
                self.note = "%s exited with %s: %s" % (" ".join(argv[:2]), proc.returncode,
                                                       tail or "no message")
                return None
            time.sleep(0.1)
        return proc

    def start(self) -> Dict[str, Any]:
        self.started = time.time()
        if which("nvidia-smi", self.env) is None:
            self.note = "no GPU telemetry: nvidia-smi not found"
            return self.describe()
        ids = gpu_ids(self.env)
        for source, argv, name in (("dmon", dmon_argv(self.interval_s, ids), "dmon.txt"),
                                   ("query", query_argv(self.interval_s, ids), "gpu-query.csv")):
            path = os.path.join(self.out_dir, name)
            proc = self._spawn(argv, path)
            if proc is not None:
                self.proc, self.source, self.file = proc, source, name
                return self.describe()
        return self.describe()

    def stop(self) -> Dict[str, Any]:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except OSError:
                    pass
                self.proc.wait()
        return self.describe()

    def describe(self) -> Dict[str, Any]:
        return {"source": self.source, "file": self.file, "note": self.note,
                "interval_s": self.interval_s, "started": self.started}
