"""``python3 -m payload health --out DIR --level quick|standard|burn``: test every GPU of
this node at once and write what was measured.

Order: the counters (ECC, remapped rows, clock reasons, PCIe and NVLink error
counters, the kernel log, the processes already on the GPUs) are read; one
``health-gpu`` process per GPU is started (all GPUs at once, each running the
GPU's own phases) with one ``health-links`` process held at its gate; telemetry
starts; when the GPU processes are done telemetry is told to stop and the links
process measures the host links and the peer matrix; ``dcgmi diag`` where it
exists; the samplers are waited for; the counters are read again. Progress is
printed as the events arrive (one JSON object per line, see
``payload.health.protocol``), and ``health.json`` in the output folder is the node
document: what ran, where each file is, each phase's last event.

On a node without a GPU (no nvidia-smi, no GPU listed, or CUDA_VISIBLE_DEVICES
hiding them all) and without ``--device cpu`` the document says "no GPU" and the
exit status is 0. SIGTERM, SIGINT and SIGHUP kill the per-GPU processes' groups,
the samplers and dcgmi, write the document as interrupted and exit 128+signal.

Standard library only, Python 3.8 compatible.
"""

import csv
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

from payload.health import counters, protocol
from payload.health.sampler import ReasonsSampler
from payload.proc import run_command, which
from payload.train.telemetry import Telemetry

POLL_S = 0.2
_PKG_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def add_arguments(p: Any) -> None:
    p.add_argument("--out", required=True, help="output folder (created)")
    p.add_argument("--level", choices=protocol.LEVELS, default="standard")
    p.add_argument("--device", choices=protocol.DEVICES, default=default_device(dict(os.environ)),
                   help="cuda (default) or cpu: the small CPU stand-in (also chosen by "
                   "GPUVET_HEALTH_DEVICE=cpu in the environment)")
    p.add_argument("--gpus", help="comma-separated GPUs to test, as CUDA_VISIBLE_DEVICES or "
                   "nvidia-smi name them (default: all); with --device cpu the names of "
                   "the CPU processes (default: 0)")
    p.add_argument("--sustain-s", type=float, help="override the level's sustained window")
    p.add_argument("--memtest-s", type=float, help="override the level's memory test time")


def default_device(env: Dict[str, str]) -> str:
    """cuda, or what GPUVET_HEALTH_DEVICE names (an inventory's node env: the CPU stand-in
    on a node without GPUs, to try the step there)."""
    want = env.get("GPUVET_HEALTH_DEVICE", "").strip().lower()
    return want if want in protocol.DEVICES else "cuda"


def discover(env: Dict[str, str], wanted: Optional[List[str]]) -> Tuple[List[str], Optional[str]]:
    """The GPUs to test, as CUDA_VISIBLE_DEVICES entries; or none and why."""
    if which("nvidia-smi", env) is None:
        return [], "no GPU: nvidia-smi not found"
    rec = run_command(["nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader"], 30.0,
                      env=env)
    if rec["rc"] != 0:
        tail = (rec["stderr"] or rec["stdout"]).strip().splitlines()[-1:] or ["no message"]
        return [], "no GPU: nvidia-smi failed (exit %s): %s" % (rec["rc"], tail[0][:200])
    rows = [r for r in csv.reader(io.StringIO(rec["stdout"])) if len(r) >= 2]
    if not rows:
        return [], "no GPU: nvidia-smi lists none"
    vis = env.get("CUDA_VISIBLE_DEVICES")
    if vis is not None:
        entries = [e.strip() for e in vis.split(",") if e.strip() and e.strip() != "-1"]
        if not entries:
            return [], "no GPU: CUDA_VISIBLE_DEVICES=%r hides every GPU" % vis
    else:
        entries = [r[0].strip() for r in rows]
    if wanted:
        missing = [g for g in wanted if g not in entries]
        if missing:
            return [], "no GPU: --gpus names %s, this node has %s" % (
                ",".join(missing), ",".join(entries))
        entries = [e for e in entries if e in wanted]
    return entries, None


class Node:
    def __init__(self, args: Any) -> None:
        self.args = args
        self.out = os.path.abspath(args.out)
        os.makedirs(self.out, exist_ok=True)
        self.w = protocol.EventWriter(os.path.join(self.out, protocol.NODE_EVENTS),
                                      echo=sys.stdout)
        self.env = dict(os.environ)
        self.stop: Optional[int] = None
        self.procs: Dict[str, "subprocess.Popen[bytes]"] = {}
        self.samplers: List[Telemetry] = []
        self.plan = protocol.plan(args.level, args.device, 0)
        for key in ("sustain_s", "memtest_s"):
            if getattr(args, key) is not None:
                self.plan[key] = float(getattr(args, key))
        self.doc: Dict[str, Any] = {
            "tool": protocol.TOOL, "schema": protocol.SCHEMA, "level": args.level,
            "device": args.device, "host": socket.gethostname(), "pid": os.getpid(),
            "python": sys.version.split()[0], "start_time": time.time(), "status": None,
            "reason": None, "gpus": [], "labels": {}, "workers": {}, "results": {},
            "links": {}, "node_phases": {}, "counters": {}, "kernel_log": {},
            "telemetry": {}, "plan": self.plan}

    # ------------------------------------------------------------------ processes
    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.stop is None:
            self.stop = signum
            self.kill_all()

    def kill_all(self) -> None:
        for proc in list(self.procs.values()):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass
        for s in self.samplers:
            s.stop()

    def spawn(self, name: str, argv: List[str], env: Dict[str, str]) -> "subprocess.Popen[bytes]":
        with open(os.path.join(self.out, name + ".stdout"), "wb") as out, \
                open(os.path.join(self.out, name + ".stderr"), "wb") as err:
            proc = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                    env=env, cwd=_PKG_ROOT, start_new_session=True)
        self.procs[name] = proc
        self.doc["workers"].setdefault(name, {})["started"] = time.time()
        return proc

    def _child_env(self, visible: Optional[str]) -> Dict[str, str]:
        env = dict(self.env)
        env["PYTHONUNBUFFERED"] = "1"
        env["PYTHONPATH"] = os.pathsep.join([_PKG_ROOT] + (
            [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        if self.args.device == "cpu":
            env["CUDA_VISIBLE_DEVICES"] = ""
            env.setdefault("OMP_NUM_THREADS", "1")
        else:
            env["CUDA_VISIBLE_DEVICES"] = visible or ""
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # CUDA's numbering is nvidia-smi's
        return env

    def follow(self, names: List[str], files: Dict[str, str], timeout_s: float) -> None:
        """Print the processes' events as they come, until they exit or time out."""
        followers = {n: protocol.Follower(files[n]) for n in names}
        deadline = time.time() + timeout_s
        while True:
            for f in followers.values():
                for ev in f.poll():
                    sys.stdout.write(json.dumps(ev, sort_keys=True) + "\n")
            sys.stdout.flush()
            live = [n for n in names if self.procs[n].poll() is None]
            if not live or self.stop is not None:
                break
            if time.time() > deadline:
                for n in live:
                    self.doc["workers"].setdefault(n, {})["timed_out"] = True
                    try:
                        os.killpg(self.procs[n].pid, signal.SIGKILL)
                    except OSError:
                        pass
                break
            time.sleep(POLL_S)
        for n in names:
            proc = self.procs[n]
            rc = proc.wait()
            rec = self.doc["workers"].setdefault(n, {})
            rec.update(pid=proc.pid, rc=rc, file=os.path.basename(files[n]),
                       stderr_tail=_tail(os.path.join(self.out, n + ".stderr")))
            for ev in followers[n].poll():
                sys.stdout.write(json.dumps(ev, sort_keys=True) + "\n")
        sys.stdout.flush()

    # ------------------------------------------------------------------ steps
    def counters(self, when: str) -> None:
        phase = "counters_" + when
        self.w.emit(protocol.START, phase)
        index = counters.Snapshot(self.out, when, self.args.device, self.env).take()
        self.doc["counters"][when] = index
        self.doc["kernel_log"][when] = counters.kernel_log_status(index)
        self.doc["node_phases"][phase] = self.w.emit(
            protocol.DONE, phase, files={k: v.get("file") for k, v in index.items()},
            kernel_log=self.doc["kernel_log"][when])

    def busy(self) -> None:
        apps = self.doc["counters"]["before"].get("compute-apps", {})
        if apps.get("skipped"):
            ev = self.w.emit(protocol.SKIP, "busy", reason=apps.get("note"))
        else:
            ev = self.w.emit(protocol.DONE, "busy", values={"processes": apps.get("processes")},
                             units={"processes": "count"}, file=apps.get("file"))
        self.doc["node_phases"]["busy"] = ev

    def spawn_gpus(self, entries: List[str]) -> Dict[str, str]:
        """One health-gpu process per GPU, started at once; their event files by name."""
        files: Dict[str, str] = {}
        for entry in entries:
            label = protocol.label_of(entry)
            name = "gpu" + label
            self.doc["labels"][label] = entry
            argv = [sys.executable, "-m", "payload", "health-gpu", "--out", self.out,
                    "--label", label, "--level", self.args.level, "--device", self.args.device]
            for key in ("sustain_s", "memtest_s"):
                if getattr(self.args, key) is not None:
                    argv += ["--" + key.replace("_", "-"), str(getattr(self.args, key))]
            files[name] = os.path.join(self.out, protocol.gpu_events(label))
            open(files[name], "a").close()
            self.spawn(name, argv, self._child_env(entry))
        return files

    def gpus(self, files: Dict[str, str]) -> None:
        names = list(files)
        self.follow(names, files, protocol.worker_timeout_s(self.plan))
        for name in names:
            label = name[3:]
            self.doc["results"][label] = protocol.last_by_phase(protocol.read_events(files[name]))

    def links_skipped(self) -> Optional[str]:
        if self.args.device == "cpu":
            return "device cpu: no host links or peers to measure"
        if self.args.level == "quick":
            return "not part of level quick"
        return None

    def spawn_links(self, entries: List[str]) -> Optional[str]:
        """The health-links process, started with the GPU processes and held at its gate
        (after `import torch`, before any CUDA call) until they are done: its interpreter
        and torch load while the GPUs are measured, off the step's path. Its event file,
        or None when the level or device has no link phases."""
        if self.links_skipped():
            return None
        path = os.path.join(self.out, protocol.LINKS_EVENTS)
        open(path, "a").close()
        labels = [protocol.label_of(e) for e in entries]
        argv = [sys.executable, "-m", "payload", "health-links", "--out", self.out,
                "--labels", ",".join(labels), "--level", self.args.level,
                "--gate", self._links_gate()]
        self.spawn("links", argv, self._child_env(",".join(entries)))
        return path

    def _links_gate(self) -> str:
        return os.path.join(self.out, ".links.gate")

    def open_links(self, word: str) -> None:
        tmp = self._links_gate() + ".tmp"
        with open(tmp, "w") as f:
            f.write(word)
        os.replace(tmp, self._links_gate())

    def links(self, path: Optional[str]) -> None:
        why = self.links_skipped()
        if why or path is None:
            for phase in protocol.LINK_PHASES:
                self.doc["links"][phase] = self.w.emit(protocol.SKIP, phase, reason=why)
            return
        self.open_links("go")
        self.follow(["links"], {"links": path}, 900.0)
        self.doc["links"] = protocol.last_by_phase(protocol.read_events(path))
        try:
            os.unlink(self._links_gate())
        except OSError:
            pass

    def dcgmi(self) -> None:
        level = self.plan.get("dcgmi_level")
        why = None
        if self.args.device == "cpu":
            why = "device cpu"
        elif not level:
            why = "not part of level %s" % self.args.level
        exe = which("dcgmi", self.env)
        if why is None and exe is None:
            why = "dcgmi not found"
        if why or exe is None:
            self.doc["node_phases"]["dcgmi"] = self.w.emit(protocol.SKIP, "dcgmi", reason=why)
            return
        self.w.emit(protocol.START, "dcgmi", level=level)
        argv = [exe, "diag", "-r", str(level)]
        t0 = time.time()
        proc = self.spawn("dcgmi", argv, dict(self.env))
        deadline = t0 + (300.0 if level == 1 else 1200.0)
        while proc.poll() is None and self.stop is None and time.time() < deadline:
            time.sleep(POLL_S)
        timed_out = proc.poll() is None and self.stop is None
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
        rc = proc.wait()
        os.replace(os.path.join(self.out, "dcgmi.stdout"), os.path.join(self.out,
                                                                       protocol.DCGMI_FILE))
        self.doc["node_phases"]["dcgmi"] = self.w.emit(
            protocol.DONE, "dcgmi", rc=rc, timed_out=timed_out, argv=argv,
            file=protocol.DCGMI_FILE, wall_s=round(time.time() - t0, 3))

    def telemetry(self, start: bool) -> None:
        if self.args.device != "cuda":
            self.doc["telemetry"] = {"note": "device cpu: no GPU telemetry"}
            return
        if start:
            self.samplers = [Telemetry(self.out, 1, self.env), ReasonsSampler(self.out, self.env)]
            self.doc["telemetry"] = {"dmon": self.samplers[0].start(),
                                     "reasons": self.samplers[1].start()}
        else:
            for sampler in self.samplers:  # both told at once, then each waited for
                sampler.signal_stop()
            self.doc["telemetry"] = {"dmon": self.samplers[0].stop(),
                                     "reasons": self.samplers[1].stop()}

    # ------------------------------------------------------------------ the run
    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        wanted = [g.strip() for g in self.args.gpus.split(",")] if self.args.gpus else None
        if self.args.device == "cpu":
            entries = wanted or ["0"]
        else:
            entries, why = discover(self.env, wanted)
            if why:
                self.doc.update(status="no-gpu", reason=why)
                self.w.emit(protocol.SKIP, None, reason=why)
                return self.finish(0)
        if self.args.device == "cpu":
            entries = ["cpu" + e for e in entries]
        self.doc["gpus"] = entries
        self.w.emit(protocol.HELLO, pid=os.getpid(), gpus=entries, level=self.args.level,
                    device=self.args.device, plan=self.plan)
        started: Dict[str, Any] = {}

        def spawn() -> None:
            # the workers first: their interpreters and torch load (3-4 s) while the
            # samplers check that they started (1.5 s each)
            started["gpus"] = self.spawn_gpus(entries)
            started["links"] = self.spawn_links(entries)

        def gpus_done() -> None:
            self.gpus(started["gpus"])
            # the samplers cover the GPU phases: told to stop now, they end (about 1 s
            # for nvidia-smi's last sample) while the links are measured
            for sampler in self.samplers:
                sampler.signal_stop()

        steps = [lambda: self.counters("before"), self.busy, spawn,
                 lambda: self.telemetry(True), gpus_done,
                 lambda: self.links(started.get("links")), self.dcgmi,
                 lambda: self.telemetry(False), lambda: self.counters("after")]
        for step in steps:
            if self.stop is not None:
                break
            step()
        if self.stop is not None:
            if started.get("links"):
                self.open_links("stop")
            self.kill_all()
            for proc in self.procs.values():
                proc.wait()
            self.doc.update(status="interrupted", reason="signal %d" % self.stop)
            return self.finish(128 + self.stop)
        failed = [n for n, r in self.doc["workers"].items() if r.get("rc") or r.get("timed_out")]
        self.doc.update(status="failed" if failed else "ok",
                        reason=("processes that failed: " + ", ".join(sorted(failed))) if failed
                        else None)
        return self.finish(0)

    def finish(self, rc: int) -> int:
        self.doc["end_time"] = time.time()
        self.doc["wall_s"] = round(self.doc["end_time"] - self.doc["start_time"], 3)
        self.doc["files"] = sorted(_files(self.out))
        protocol.write_json_atomic(os.path.join(self.out, protocol.NODE_DOC), self.doc)
        self.w.emit(protocol.BYE, status=self.doc["status"], reason=self.doc["reason"],
                    doc=protocol.NODE_DOC, wall_s=self.doc["wall_s"], rc=rc)
        self.w.close()
        return rc


def _tail(path: str, n: int = 2000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - n))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _files(root: str) -> List[str]:
    out = []
    for d, _, names in os.walk(root):
        for name in names:
            if not name.startswith("."):
                out.append(os.path.relpath(os.path.join(d, name), root))
    return out


def main(args: Any) -> int:
    return Node(args).run()
