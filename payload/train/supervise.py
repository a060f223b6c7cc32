"""``python3 -m payload train-supervise``: run one phase of the training job on
this node, watch it, and SIGKILL it at the chosen point.

It starts torchrun (or the user's own command; a single rank on a single node is
started directly, with the environment torchrun would give it) in a new session, samples GPU
telemetry for as long as the job runs, follows the progress file of this
node's first rank, and kills the whole job when the trigger is seen: after a
given step, or when a given save has started (so the checkpoint is left
half-written). torchrun starts each worker in a session of its own, so a kill
of torchrun's process group alone would leave the workers running: the
supervisor makes itself a child subreaper, collects every descendant and
kills all their process groups at once.

Prints one JSON document (also written to ``supervise.json``): exit status,
whether and when it killed, the telemetry source and the GPUs' clock and power
limits, wall times. Times are this node's clock (``time.time()``); the
controller only subtracts times taken on one node.

Standard library only, Python 3.8 compatible.
"""

import ctypes
import getpass
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Set

from payload.ncclbuild import visible_gpus
from payload.scrub import scrub_argv
from payload.train import protocol
from payload.train.startup import GATE_AT_ENV, GATE_ENV, GATE_TIMEOUT_ENV
from payload.train.telemetry import Telemetry

POLL_S = 0.05
_PR_SET_CHILD_SUBREAPER = 36
STEP_LINE = re.compile(r"\bstep\s*=\s*(\d+)")


def add_arguments(p: Any) -> None:
    p.add_argument("--out", required=True, help="this node's output folder for the phase")
    p.add_argument("--phase", choices=protocol.PHASES, required=True)
    p.add_argument("--ckpt-dir", help="checkpoint root of this run unit")
    p.add_argument("--params", help="the run configuration as JSON (train mode)")
    p.add_argument("--save-at", type=int, action="append", default=[],
                   help="steps after which the job saves a checkpoint")
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--master-addr", default="127.0.0.1")
    p.add_argument("--master-port", type=int, default=29500)
    p.add_argument("--nproc", type=int, default=0, help="ranks on this node (0: one per GPU)")
    p.add_argument("--cpu-procs", type=int, default=2, help="ranks on a node without GPUs")
    p.add_argument("--kill-after-step", type=int, help="SIGKILL once this step is logged")
    p.add_argument("--kill-at-save", type=int, help="SIGKILL once the save of this step began")
    p.add_argument("--kill-at-commit", type=int,
                   help="SIGKILL once the files of this step's save are written, before its "
                   "manifest")
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--telemetry-interval", type=int, default=1)
    p.add_argument("--command", help="the user's own training command (shell), instead of "
                   "the built-in task")
    p.add_argument("--resume-flag", help="appended to --command in the restore phase")
    p.add_argument("--gate", help="started ahead of its turn: the ranks hold, before they "
                   "allocate, until this file says go (or stop)")
    p.add_argument("--gate-at", choices=("ready", "start"), default="ready",
                   help="where the ranks hold: ready (after the CUDA context and the process "
                   "group) or start (before any CUDA call)")
    p.add_argument("--gate-timeout", type=float, help="seconds the gate may stay shut "
                   "(default: --timeout); --timeout counts from its opening")
    p.add_argument("--stop-file", help="one node of a multi-node job: once this file exists "
                   "(the controller writes it when another node's part failed), the job is "
                   "killed and the file's text kept as the reason")


def gate_wait_limit(args: Any) -> float:
    """How long a launch started ahead may wait at its gate."""
    limit = getattr(args, "gate_timeout", None)
    return float(limit) if limit else float(args.timeout)


class JobClock:
    """--timeout counts from the gate's opening: a launch started ahead waits, shut, for as
    long as what runs before it takes, bounded by --gate-timeout (its ranks give up then,
    and this clock too)."""

    def __init__(self, args: Any, start: float) -> None:
        self.gate = getattr(args, "gate", None)
        self.start, self.timeout = start, float(args.timeout)
        self.limit = gate_wait_limit(args)
        self.opened: Optional[float] = None if self.gate else start

    def expired(self, now: float) -> bool:
        if self.opened is None:
            try:
                with open(str(self.gate)) as f:
                    said = f.read().strip()
            except OSError:
                said = ""
            if said != "go":
                return now - self.start > self.limit + self.timeout
            self.opened = now
        return now - self.opened > self.timeout


def stop_reason(path: Optional[str]) -> Optional[str]:
    """The controller's reason to stop this node's part of a multi-node job, or None."""
    if not path:
        return None
    try:
        with open(path) as f:
            return f.read(500).strip() or "stopped by the controller"
    except OSError:
        return None


class Stopped(Exception):
    """SIGTERM or SIGHUP to the supervisor (the controller interrupted, the SSH session
    went): the job it started dies with it."""

    def __init__(self, signum: int) -> None:
        super().__init__("signal %d" % signum)
        self.signum = signum


def _stop(signum: int, frame: Any) -> None:
    raise Stopped(signum)


def _set_subreaper() -> bool:
    """Orphans of the job (workers whose torchrun died) become our children, not init's."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _ppid_map() -> Dict[int, int]:
    out: Dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry, "rb") as f:
                stat = f.read().decode("ascii", "replace")
        except OSError:
            continue
        # comm may hold spaces and parentheses: the fields start after the last ')'
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 1:
            out[int(entry)] = int(fields[1])
    return out


def descendants(root: int, spare: Optional[int] = None) -> List[int]:
    """Every process below `root`, except `spare` and what runs below it."""
    children: Dict[int, List[int]] = {}
    for pid, ppid in _ppid_map().items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            if c != spare:
                found.append(c)
                todo.append(c)
    return found


def kill_tree(proc: "subprocess.Popen[bytes]", spare: Optional[int] = None) -> List[int]:
    """SIGKILL the job's process group and the groups of all its descendants (the
    telemetry sampler, `spare`, goes on)."""
    pids = [proc.pid] + descendants(os.getpid(), spare)
    groups: Set[int] = set()
    for pid in pids:
        try:
            groups.add(os.getpgid(pid))
        except OSError:
            continue
    groups.discard(os.getpgid(0))  # never ourselves
    if spare is not None:
        groups.discard(spare)  # the sampler leads its own group
    for g in groups:
        try:
            os.killpg(g, signal.SIGKILL)
        except OSError:
            pass
    for pid in pids:  # a descendant that shares our group
        if pid not in (os.getpid(), spare):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    return sorted(groups)


def _reap_orphans() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def nproc_for(args: Any, env: Dict[str, str]) -> int:
    if args.nproc > 0:
        return int(args.nproc)
    gpus = visible_gpus(env)
    return gpus if gpus else max(1, int(args.cpu_procs))


def direct_launch(args: Any, nproc: int) -> bool:
    """One rank per node (a one-GPU node, a CPU node with one process), on one node or
    several: the rank is started directly with the environment torchrun would give it
    (`rank_env`), without torchrun's agent, which imports torch a second time and runs a
    rendezvous: about 3 s of every launch on an H100 host, and a second interpreter's
    memory. Across nodes the ranks meet at the first node's store (env://, the master
    address and port the controller gives every node), as torchrun's static rendezvous
    does."""
    return nproc == 1


def rank_env(args: Any = None) -> Dict[str, str]:
    """What torchrun gives the one rank of this node: --standalone's (a free port for its
    store) on one node, the static rendezvous's across nodes."""
    if args is not None and int(args.nnodes) > 1:
        rank = str(args.node_rank)
        return {"RANK": rank, "LOCAL_RANK": "0", "WORLD_SIZE": str(args.nnodes),
                "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": rank, "ROLE_RANK": rank,
                "MASTER_ADDR": str(args.master_addr), "MASTER_PORT": str(args.master_port)}
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
            "GROUP_RANK": "0", "ROLE_RANK": "0", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port)}


def train_argv(args: Any, nproc: int) -> List[str]:
    rank = ["-m", "payload", "train", "--phase", args.phase, "--out", args.out,
            "--ckpt-dir", args.ckpt_dir or "", "--params", args.params or "{}"]
    for s in args.save_at:
        rank += ["--save-at", str(s)]
    if direct_launch(args, nproc):
        return [sys.executable, *rank]
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc)]
    if args.nnodes == 1:
        argv += ["--standalone"]
    else:
        # static rendezvous over the c10d store on the first node: node ranks are fixed,
        # which the restore on a permuted set of nodes relies on
        argv += ["--nnodes", str(args.nnodes), "--node-rank", str(args.node_rank),
                 "--master-addr", args.master_addr, "--master-port", str(args.master_port)]
    return [*argv, "--max-restarts", "0", *rank]


def _job_env(args: Any) -> Dict[str, str]:
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    # cuBLAS needs this before its first handle for bit-exact matmuls
    env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    env["GPUVET_TRAIN_FAST_EXIT"] = "1"  # payload/train/loop.py: FAST_EXIT_ENV
    if args.ckpt_dir:
        # where your own command keeps its checkpoints, to be found again on a relaunch
        env["GPUVET_CKPT_DIR"] = args.ckpt_dir
        os.makedirs(args.ckpt_dir, exist_ok=True)
    if getattr(args, "gate", None):
        env[GATE_ENV] = args.gate
        env[GATE_TIMEOUT_ENV] = str(gate_wait_limit(args))
        env[GATE_AT_ENV] = getattr(args, "gate_at", None) or "ready"
    return env


class Trigger:
    def __init__(self, after_step: Optional[int] = None, at_save: Optional[int] = None,
                 at_commit: Optional[int] = None) -> None:
        self.after_step = after_step
        self.at = [(protocol.SAVING, at_save), (protocol.COMMIT, at_commit)]

    def __bool__(self) -> bool:
        return self.after_step is not None or any(s is not None for _, s in self.at)

    def hit(self, ev: Dict[str, Any]) -> bool:
        kind, step = ev.get("event"), int(ev.get("step", -1))
        if self.after_step is not None and kind == protocol.STEP and step >= self.after_step:
            return True
        return any(kind == k and s == step for k, s in self.at if s is not None)


class StepLines(protocol.Follower):
    """The user's command's progress: `step=N` in its output (the restore contract)."""

    def poll(self) -> List[Dict[str, Any]]:
        out = []
        for line in self.new_lines().splitlines():
            m = STEP_LINE.search(line)
            if m:
                out.append({"event": protocol.STEP, "step": int(m.group(1)), "t": time.time()})
        return out


LAUNCH_TMP = ".tmp"  # dotted: not listed in the document's files, never fetched


def _inductor_cache_dir() -> str:
    """Where torch.compile keeps its cache by default (torch/_inductor/runtime/
    cache_dir_utils.py), from the temp dir this process was given."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError, ImportError):
        user = "uid_%d" % os.getuid()
    return os.path.join(tempfile.gettempdir(),
                        "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


def launch_tmp(args: Any, env: Dict[str, str]) -> str:
    """A temp dir of the launch's own, under the phase's folder (so under the work dir), as
    TMPDIR: torchrun's elastic agent makes a `torchelastic_*` folder per launch with
    mkdtemp and leaves it behind, eight a training run; the supervisor removes this one
    after the job, and the next attempt's `fresh_attempt` any an earlier one left. The
    compile cache keeps the place torch gives it by default (a warm cache across phases,
    as before), since it too is found through the temp dir."""
    path = os.path.join(args.out, LAUNCH_TMP)
    os.makedirs(path, exist_ok=True)
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", _inductor_cache_dir())
    env["TMPDIR"] = path
    return path


def fresh_attempt(args: Any) -> List[str]:
    """Start the phase with nothing of an earlier attempt: the rank programs append to
    their progress files, so an attempt interrupted (a signal, a full disk) and run again
    by ``--resume`` would otherwise find the old events there, and a kill trigger fire on
    them. The reference phase begins the unit's protocol, so the unit's checkpoints of an
    earlier attempt go too: a restore must only ever find this attempt's. Returns what
    was removed."""
    removed = []
    roots = [args.out] + ([args.ckpt_dir] if args.phase == "reference" and args.ckpt_dir
                          else [])
    for root in roots:
        try:
            names = sorted(os.listdir(root))
        except OSError:
            continue
        for name in names:
            path = os.path.join(root, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                try:
                    os.unlink(path)
                except OSError:
                    continue
            removed.append(path)
    return removed


def main(args: Any) -> int:
    stale = fresh_attempt(args)
    os.makedirs(args.out, exist_ok=True)
    env = _job_env(args)
    tmp_dir = launch_tmp(args, env)
    subreaper = _set_subreaper()
    if args.command:
        nproc = 0
        cmd = args.command + ((" " + args.resume_flag) if args.phase == "restore"
                              and args.resume_flag else "")
        argv = ["/bin/sh", "-c", cmd]
        stdout_name = "command.stdout"
        follower: Any = StepLines(os.path.join(args.out, stdout_name))
    else:
        nproc = nproc_for(args, env)
        argv = train_argv(args, nproc)
        if direct_launch(args, nproc):
            env.update(rank_env(args))
        stdout_name = "torchrun.stdout"
        follower = protocol.Follower(protocol.rank_file(args.out, args.node_rank * nproc))
    trigger = Trigger(args.kill_after_step, args.kill_at_save, args.kill_at_commit)
    telemetry = Telemetry(args.out, args.telemetry_interval, env)
    doc: Dict[str, Any] = {"tool": "gpuvet-train-supervise", "phase": args.phase,
                           # the user's command may carry tokens (`env HF_TOKEN=... cmd`)
                           "argv": scrub_argv(argv), "nproc": nproc,
                           "node_rank": args.node_rank,
                           "nnodes": args.nnodes, "subreaper": subreaper,
                           "trigger": {"after_step": args.kill_after_step,
                                       "at_save": args.kill_at_save,
                                       "at_commit": args.kill_at_commit},
                           "killed": False, "kill_time": None, "kill_event": None,
                           "timed_out": False, "last_step": None,
                           "removed_stale": len(stale)}
    # torchrun, its workers and the sampler run in sessions of their own: a signal to our
    # process group does not reach them, so a TERM or HUP (the controller's interrupt, a
    # dropped SSH session) is turned into killing them here
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _stop)
    start = time.time()
    doc["start_time"] = start
    clock = JobClock(args, start)
    env["GPUVET_LAUNCH_T"] = "%.6f" % start  # the ranks log their launch latency from it
    with open(os.path.join(args.out, stdout_name), "wb") as out, \
            open(os.path.join(args.out, stdout_name.replace("stdout", "stderr")), "wb") as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)
        spare: Optional[int] = None
        try:
            # the sampler's start check (1.5 s) runs while torchrun and torch load
            doc["telemetry"] = telemetry.start()
            spare = telemetry.proc.pid if telemetry.proc is not None else None
            ended = False
            while proc.poll() is None:
                for ev in follower.poll():
                    if ev.get("event") == protocol.STEP:
                        doc["last_step"] = ev.get("step")
                    ended = ended or ev.get("event") == protocol.END
                    if trigger and not doc["killed"] and trigger.hit(ev):
                        doc["kill_time"] = time.time()
                        doc["kill_groups"] = kill_tree(proc, spare)
                        doc["killed"], doc["kill_event"] = True, ev
                why = None if doc["killed"] else stop_reason(getattr(args, "stop_file", None))
                if why is not None:
                    doc["stopped"] = why
                    doc["kill_time"] = time.time()
                    doc["kill_groups"] = kill_tree(proc, spare)
                    doc["killed"] = True
                if not doc["killed"] and clock.expired(time.time()):
                    doc["timed_out"] = True
                    doc["kill_time"] = time.time()
                    doc["kill_groups"] = kill_tree(proc, spare)
                    doc["killed"] = True
                if doc["killed"] or ended:
                    # the steps are over: the sampler's last sample (about 1 s) is taken
                    # while the ranks exit, not after them
                    telemetry.signal_stop()
                time.sleep(POLL_S)
        except (KeyboardInterrupt, Stopped) as exc:
            kill_tree(proc, spare)
            telemetry.stop()
            if isinstance(exc, Stopped):
                return 128 + exc.signum  # after the cleanup below
            raise
        finally:
            proc.wait()
            _reap_orphans()
            leftovers = descendants(os.getpid(), spare)
            if leftovers:  # workers that outlived torchrun
                doc["leftover_pids"] = leftovers
                kill_tree(proc, spare)
                time.sleep(POLL_S)
                _reap_orphans()
            shutil.rmtree(tmp_dir, ignore_errors=True)  # the job's temp files: none stay
            if getattr(args, "stop_file", None):
                try:  # the controller's stop file, read: it does not stay either
                    os.unlink(args.stop_file)
                except OSError:
                    pass
    doc["rc"] = proc.returncode
    if getattr(args, "gate", None):
        doc["gate_opened"] = clock.opened
    doc["end_time"] = time.time()
    doc["wall_s"] = round(doc["end_time"] - start, 3)
    doc["telemetry"] = telemetry.stop()
    doc["files"] = sorted(f for f in os.listdir(args.out) if not f.startswith("."))
    for ev in follower.poll():
        if ev.get("event") == protocol.STEP:
            doc["last_step"] = ev.get("step")
    text = json.dumps(doc, indent=1, sort_keys=True)
    tmp = os.path.join(args.out, ".supervise.json.tmp")
    with open(tmp, "w") as f:
        f.write(text + "\n")
    os.replace(tmp, os.path.join(args.out, "supervise.json"))
    sys.stdout.write(text + "\n")
    return 0
