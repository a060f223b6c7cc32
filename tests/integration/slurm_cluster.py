"""A real Slurm cluster for integration tests, beside the sshd cluster of cluster.py.

One munged and one slurmctld in the root network namespace (the controller, where the
test process and gpuvet run `srun`/`sbatch`/`scontrol`), and one slurmd per node, each
in its own network namespace on a per-session bridge, with its own hostname (UTS), its
own /etc/hosts and /etc/resolv.conf (a private mount namespace: the host's nameserver
is unreachable from the namespaces and a lookup would hang for 20 s), and per-node
spool, log, pid and TmpFS paths, and its own /tmp (gpuvet's default work_dir is then
node-local, as on a real cluster). Jobs run as root, with the repository's python on
every node (the rest of the filesystem is shared).

Names follow cluster.py (`gv-<pid>-<k>-nodeN` namespaces, `gvbr<pid>_<k>` bridges,
`/var/tmp/gpuvet-cluster-<pid>-<k>`), so its `cleanup_stale` removes a crashed
session's namespaces, links and folder; the daemons in the root namespace are listed in
the folder's `daemons.json` and killed by `cleanup_stale_daemons` first.

Settings and pitfalls: ../../../shared/SLURM.md (Debian's Slurm 22.05 packages:
slurmctld slurmd slurm-client munge, installed by scripts/test-deps.sh).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster import (
    BASE_PREFIX,
    BASE_ROOT,
    ClusterError,
    _counter,
    _default_python,
    _destroy_netns,
    _kill,
    _owner_alive,
    _pid_ns,
    _run,
    _start_time,
    bridge_netns,
    cleanup_stale,
    missing_prerequisites,
)

# the nodes run the controller machine's python and this checkout (the venv's python, the
# payload): both must be visible inside a node whatever its own /tmp hides
_SHARED = (Path(__file__).resolve().parents[2], Path(sys.prefix).resolve())


def _under_tmp(paths: Sequence[Path]) -> list[Path]:
    """The paths under /tmp, outermost only (a venv inside the checkout comes with it)."""
    tmp = Path("/tmp")
    inside = sorted({p for p in paths if tmp in p.parents})
    return [p for p in inside if not any(q in p.parents for q in inside)]


DAEMONS = {"munged": "/usr/sbin/munged", "slurmctld": "/usr/sbin/slurmctld",
           "slurmd": "/usr/sbin/slurmd"}
CLIENTS = ("srun", "sbatch", "salloc", "squeue", "scontrol", "scancel", "sinfo", "sbcast")
CPUS_PER_NODE = 4


def missing_slurm() -> list[str]:
    """What keeps this machine from running the Slurm cluster; empty when all is there."""
    missing = list(missing_prerequisites())
    for path in DAEMONS.values():
        if not os.access(path, os.X_OK):
            missing.append(f"{path} is missing (apt-get install --no-install-recommends "
                           f"slurmctld slurmd slurm-client munge; or scripts/test-deps.sh)")
    for tool in CLIENTS:
        if shutil.which(tool) is None:
            missing.append(f"`{tool}` is not installed (scripts/test-deps.sh)")
    if shutil.which("mungekey") is None and not os.access("/usr/sbin/mungekey", os.X_OK):
        missing.append("`mungekey` is not installed (apt-get install munge)")
    return list(dict.fromkeys(missing))


def cleanup_stale_daemons() -> list[str]:
    """Kill the root-namespace daemons of dead sessions (their folders name them)."""
    removed: list[str] = []
    if not BASE_ROOT.is_dir():
        return removed
    for base in BASE_ROOT.glob(f"{BASE_PREFIX}*-*"):
        listing = base / "daemons.json"
        if not listing.is_file():
            continue
        try:
            owner = int(base.name.rsplit("-", 2)[-2])
        except ValueError:
            continue
        if _owner_alive(owner, base):
            continue
        with contextlib.suppress(OSError, ValueError):
            for pid in json.loads(listing.read_text()):
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                if str(base).encode() in cmdline:
                    _kill(int(pid))
                    removed.append(f"pid {pid}")
    return removed


@dataclass
class SlurmNode:
    name: str
    ip: str
    netns: str


@dataclass
class SlurmCluster:
    """A running Slurm cluster. Build with :meth:`start`, end with :meth:`stop`."""

    base: Path
    session_id: str
    bridge: str
    nodes: list[SlurmNode] = field(default_factory=list)
    subnet: str = ""
    controller_ip: str = ""
    conf: Path = field(default=Path())
    python: str = ""
    _daemons: list[subprocess.Popen[bytes]] = field(default_factory=list, repr=False)
    _veths: list[str] = field(default_factory=list, repr=False)
    _stopped: bool = field(default=False, repr=False)

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    def start(cls, n: int = 2, *, python: str | None = None,
              timeout: float = 30) -> SlurmCluster:
        """Build and start `n` nodes, all idle; on any failure everything is torn down."""
        problems = missing_slurm()
        if problems:
            raise ClusterError("cannot build the Slurm test cluster: " + "; ".join(problems))
        cleanup_stale_daemons()
        cleanup_stale()
        pid, k = os.getpid(), next(_counter)
        sid = f"{pid}-{k}"
        base = BASE_ROOT / f"{BASE_PREFIX}{sid}"
        if base.exists():
            shutil.rmtree(base)
        base.mkdir(mode=0o755, parents=True)
        os.chmod(base, 0o755)
        (base / "state.json").write_text(json.dumps(
            {"pid": pid, "start_time": _start_time(pid), "pid_ns": _pid_ns()}))
        self = cls(base=base, session_id=sid, bridge=f"gvbr{pid:x}_{k}",
                   python=python or _default_python())
        atexit.register(self.stop)
        try:
            self._build(n, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _build(self, n: int, timeout: float) -> None:
        octet, members = bridge_netns(self.session_id, self.bridge, n, self._veths)
        self.subnet = f"10.77.{octet}.0/24"
        self.controller_ip = f"10.77.{octet}.1"
        self.nodes += [SlurmNode(name, ip, ns) for name, ns, ip in members]
        for node in self.nodes:
            _run(["ip", "-n", node.netns, "-batch", "-"], input=(
                f"link set lo up\naddr add {node.ip}/24 dev eth0\nlink set eth0 up\n"))
        self._write_files()
        deadline = time.monotonic() + timeout
        self._start_munged(deadline)
        self._spawn("slurmctld", ["/usr/sbin/slurmctld", "-D", "-f", str(self.conf)],
                    self.base / "slurmctld.out")
        for node in self.nodes:
            d = self.node_dir(node.name)
            slash = d / "slash-tmp"
            # what the nodes run from (the checkout and its venv) stays visible when it
            # lives under /tmp (a CI checkout often does): bound into the node's own /tmp at
            # the same path before that is mounted over /tmp (recursively, with it)
            keep = "".join(
                f"mkdir -p {shlex.quote(str(slash / p.relative_to('/tmp')))} && mount --bind "
                f"{shlex.quote(str(p))} {shlex.quote(str(slash / p.relative_to('/tmp')))}; "
                for p in _under_tmp(_SHARED))
            script = (f"hostname {node.name}; mount --bind {self.base / 'hosts'} /etc/hosts; "
                      f"mount --bind {self.base / 'resolv.conf'} /etc/resolv.conf; "
                      f"{keep}mount --rbind {slash} /tmp; "
                      f"exec /usr/sbin/slurmd -D -f {self.conf} -N {node.name}")
            self._spawn("slurmd", ["ip", "netns", "exec", node.netns, "unshare", "--uts",
                                   "--mount", "--propagation", "private", "sh", "-c", script],
                        d / "slurmd.out")
        self._write_daemons()
        self.wait_idle([n.name for n in self.nodes], deadline)

    def _write_files(self) -> None:
        short = socket.gethostname().split(".")[0]
        ports = _free_ports(2)
        (self.base / "munge").mkdir(mode=0o755)
        os.chmod(self.base / "munge", 0o755)
        (self.base / "ctld").mkdir()
        for node in self.nodes:
            d = self.node_dir(node.name)
            for sub in ("spool", "tmp", "slash-tmp"):
                (d / sub).mkdir(parents=True)
        (self.base / "hosts").write_text(
            "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n"
            f"{self.controller_ip} {short}\n"
            + "".join(f"{n.ip} {n.name}\n" for n in self.nodes))
        (self.base / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
        b = self.base
        nodes = "".join(f"NodeName={n.name} NodeAddr={n.ip} NodeHostname={n.name} "
                        f"CPUs={CPUS_PER_NODE} State=UNKNOWN\n" for n in self.nodes)
        self.conf = b / "slurm.conf"
        self.conf.write_text(f"""\
ClusterName=gv{self.session_id.replace('-', 'x')}
SlurmctldHost={short}({self.controller_ip})
SlurmctldPort={ports[0]}
SlurmdPort={ports[1]}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={b / 'munge' / 'munge.socket'}
SlurmUser=root
SlurmdUser=root
StateSaveLocation={b / 'ctld'}
SlurmctldPidFile={b / 'slurmctld.pid'}
SlurmctldLogFile={b / 'slurmctld.log'}
SlurmdSpoolDir={b / 'nodes' / '%n' / 'spool'}
SlurmdPidFile={b / 'nodes' / '%n' / 'slurmd.pid'}
SlurmdLogFile={b / 'nodes' / '%n' / 'slurmd.log'}
TmpFS={b / 'nodes' / '%n' / 'tmp'}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
KillWait=2
InactiveLimit=0
MinJobAge=600
SchedulerParameters=sched_interval=1
{nodes}PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
        (b / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n")

    def _start_munged(self, deadline: float) -> None:
        m = self.base / "munge"
        mungekey = shutil.which("mungekey") or "/usr/sbin/mungekey"
        _run([mungekey, "--create", "--keyfile", str(m / "munge.key")])
        os.chmod(m / "munge.key", 0o600)
        self._spawn("munged", ["/usr/sbin/munged", "-F", "--force",
                               f"--socket={m / 'munge.socket'}",
                               f"--key-file={m / 'munge.key'}", f"--pid-file={m / 'munged.pid'}",
                               f"--log-file={m / 'munged.log'}",
                               f"--seed-file={m / 'munged.seed'}"], m / "munged.out")
        while not (m / "munge.socket").exists():
            if self._daemons[-1].poll() is not None or time.monotonic() > deadline:
                raise ClusterError("munged did not start: " + (m / "munged.out").read_text(
                    errors="replace")[-2000:] + (m / "munged.log").read_text(
                    errors="replace")[-2000:] if (m / "munged.log").exists() else "")
            time.sleep(0.02)

    def _spawn(self, what: str, argv: Sequence[str], log: Path) -> None:
        with open(log, "ab") as fh:
            self._daemons.append(subprocess.Popen(list(argv), stdin=subprocess.DEVNULL,
                                                  stdout=fh, stderr=fh,
                                                  start_new_session=True))

    def _write_daemons(self) -> None:
        (self.base / "daemons.json").write_text(json.dumps([p.pid for p in self._daemons]))

    def stop(self) -> None:
        """Cancel every job, kill every process in the nodes' namespaces and the daemons,
        remove the namespaces, links and files. Idempotent; safe after a partial start."""
        if self._stopped:
            return
        self._stopped = True
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)
        for node in self.nodes:
            _destroy_netns(node.netns)
        for proc in reversed(self._daemons):
            with contextlib.suppress(Exception):
                proc.kill()
            with contextlib.suppress(Exception):
                proc.wait(timeout=5)
        for link in [*self._veths, self.bridge]:
            _run(["ip", "link", "del", link], check=False, timeout=10)
        shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> SlurmCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ using it

    @property
    def env(self) -> dict[str, str]:
        """The environment Slurm's client commands need here (SLURM_CONF)."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def client(self, *argv: str, timeout: float = 30,
               check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command (`scontrol ...`) against this cluster."""
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                              env=self.env, stdin=subprocess.DEVNULL)
        if check and proc.returncode != 0:
            raise ClusterError(f"{' '.join(argv)} failed ({proc.returncode}): "
                               f"{proc.stderr.strip()}")
        return proc

    def jobs(self) -> list[str]:
        """The ids of the jobs slurmctld holds that are not finished (squeue)."""
        out = self.client("squeue", "--noheader", "--format=%i %T").stdout
        return [line.split()[0] for line in out.splitlines() if line.strip()]

    def steps(self) -> list[str]:
        out = self.client("squeue", "--steps", "--noheader", "--format=%i").stdout
        return [s.strip() for s in out.splitlines() if s.strip()]

    def wait_no_jobs(self, timeout: float = 15) -> list[str]:
        """Poll squeue until no job is left (a cancelled job passes through COMPLETING)."""
        deadline = time.monotonic() + timeout
        while (left := self.jobs()) and time.monotonic() < deadline:
            time.sleep(0.1)
        return left

    def hold(self, nodes: int = 2, name: str = "held") -> str:
        """An allocation made outside gpuvet (`salloc --no-shell`); its job id."""
        err = self.client("salloc", "--no-shell", f"-N{nodes}", f"--job-name={name}").stderr
        m = re.search(r"Granted job allocation (\d+)", err)
        if m is None:
            raise ClusterError(f"salloc granted nothing: {err.strip()}")
        return m.group(1)

    def wait_idle(self, names: Sequence[str], deadline: float) -> None:
        """Poll sinfo until every node named is idle (a resumed node shows idle* first)."""
        want = set(names)
        last = ""
        while time.monotonic() < deadline:
            for proc in self._daemons:
                if proc.poll() is not None:
                    raise ClusterError(f"a Slurm daemon exited ({proc.args}): {self._logs()}")
            res = self.client("sinfo", "--noheader", "-N", "--format=%N %t", check=False)
            last = res.stdout + res.stderr
            states = dict(line.split() for line in res.stdout.splitlines() if len(line.split()) == 2)
            if all(states.get(n) == "idle" for n in want):
                return
            time.sleep(0.05)
        raise ClusterError(f"nodes not idle: {last.strip()}; {self._logs()}")

    def netns_exec(self, name: str, argv: Sequence[str],
                   timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Run `argv` in the node's network namespace (as root; `tc` for shaping)."""
        ns = next(n.netns for n in self.nodes if n.name == name)
        return subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def node_dir(self, name: str) -> Path:
        return self.base / "nodes" / name

    def node_tmp(self, name: str) -> Path:
        """The folder the node sees as /tmp."""
        return self.node_dir(name) / "slash-tmp"

    def write_inventory(self, path: str | os.PathLike[str], provider: str = "slurmlab", *,
                        slurm: Mapping[str, Any] | None = None,
                        access: Mapping[str, Any] | None = None,
                        extra_provider_fields: Mapping[str, Any] | None = None) -> Path:
        """An inventory with one `executor: slurm` provider on this cluster (local client,
        this cluster's slurm.conf); `slurm` adds to or overrides the `slurm:` block."""
        from ruamel.yaml import YAML

        block: dict[str, Any] = {"slurm_conf": str(self.conf), "nodes": 2,
                                 "time_limit": "10:00"}
        block.update(slurm or {})
        prov: dict[str, Any] = {
            "executor": "slurm",
            "access": {"python": self.python, "env": {"GLOO_SOCKET_IFNAME": "eth0"},
                       **(access or {})},
            "slurm": block,
        }
        prov.update(extra_provider_fields or {})
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        yaml = YAML()
        yaml.default_flow_style = False
        with out.open("w") as fh:
            fh.write(f"# Slurm test cluster {self.session_id}: {len(self.nodes)} nodes\n")
            yaml.dump({"version": 1, "providers": {provider: prov}}, fh)
        return out

    def _logs(self) -> str:
        parts = []
        for p in [self.base / "slurmctld.log", self.base / "slurmctld.out",
                  *(self.node_dir(n.name) / "slurmd.out" for n in self.nodes),
                  *(self.node_dir(n.name) / "slurmd.log" for n in self.nodes)]:
            if p.exists():
                parts.append(f"{p.name}: {p.read_text(errors='replace')[-800:]}")
        return " | ".join(parts)


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()
