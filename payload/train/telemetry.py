"""GPU telemetry sampled while a training job runs: the recipe's
``nvidia-smi dmon -s pucvmet -d 1 -o T``, or a ``--query-gpu`` loop where dmon
is absent or refuses to run (some vGPU and MIG setups), or a note saying why
there is none. The raw output is the record; the controller parses it. Beside
it, each GPU's maximum SM clock and its power limits (enforced and default),
read once per job: what tells a GPU running at its rated power from one held
back.

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
LIMIT_FIELDS = "index,clocks.max.sm,power.limit,power.default_limit"
LIMIT_KEYS = ("max_sm_clock_mhz", "power_limit_w", "default_power_limit_w")
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


def limits_argv(ids: Optional[str]) -> List[str]:
    argv = ["nvidia-smi", "--query-gpu=" + LIMIT_FIELDS, "--format=csv,noheader,nounits"]
    return argv + (["-i", ids] if ids else [])


def parse_limits(text: str) -> List[Dict[str, Any]]:
    """Rows of the limits query; a value nvidia-smi cannot give ([N/A]) is None."""
    out = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != 1 + len(LIMIT_KEYS) or not cells[0].isdigit():
            continue
        row: Dict[str, Any] = {"index": int(cells[0])}
        for i, key in enumerate(LIMIT_KEYS):
            try:
                row[key] = float(cells[1 + i])
            except ValueError:
                row[key] = None
        out.append(row)
    return out


def read_limits(env: Dict[str, str], timeout_s: float = 15.0) -> Dict[str, Any]:
    try:
        res = subprocess.run(limits_argv(gpu_ids(env)), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env,
                             timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"gpus": [], "error": "%s: %s" % (type(exc).__name__, exc)}
    if res.returncode != 0:
        tail = res.stderr.decode("utf-8", "replace").strip()[-300:]
        return {"gpus": [], "error": "exit %d: %s" % (res.returncode, tail or "no message")}
    return {"gpus": parse_limits(res.stdout.decode("utf-8", "replace")), "error": None}


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
        self.limits: Optional[Dict[str, Any]] = None
        self.stop_requested: Optional[float] = None  # the end of the sampled window

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
                break
        self.limits = read_limits(self.env)
        return self.describe()

    def signal_stop(self) -> None:
        """SIGTERM the sampler without waiting (several samplers stop at once); once: a
        later call does nothing."""
        if self.stop_requested is not None:
            return
        self.stop_requested = time.time()
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except OSError:
                pass

    def stop(self) -> Dict[str, Any]:
        if self.stop_requested is None:
            self.stop_requested = time.time()
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
                "interval_s": self.interval_s, "started": self.started, "limits": self.limits,
                "stop_requested": self.stop_requested}
