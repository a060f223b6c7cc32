"""A real cluster of sshd "nodes" for integration tests.

Each node is a network namespace on a per-session Linux bridge, with its own
UTS namespace (hostname), PID namespace (pgrep/pkill see only that node) and
mount namespace (its own /etc/hosts and ~/.ssh), running a real sshd with its
own host key. The filesystem is otherwise shared with the host, so every node
sees the repository and the per-node work/ckpt directories.

The controller (the test process, root namespace) reaches the nodes over the
bridge; nodes reach each other as the unprivileged test user with one
per-session key and known_hosts, which is what mpirun needs to launch from
node1 onto node2.

Everything is named after the owning process id (``gv-<pid>-<k>-...``) so that
concurrent sessions do not clash and leftovers of a crashed session can be
recognised and removed by the next one (:func:`cleanup_stale`).

Needs root, ``ip netns`` and /usr/sbin/sshd; see :func:`missing_prerequisites`.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import itertools
import json
import os
import pwd
import re
import select
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SSHD = "/usr/sbin/sshd"
DEFAULT_USER = "gpuvet-test"
BASE_ROOT = Path("/var/tmp")
BASE_PREFIX = "gpuvet-cluster-"
LOCK_FILE = Path("/run/lock/gpuvet-cluster.lock")
FIRST_HOST = 11  # node1 is 10.77.x.11
MAX_NODES = 254 - FIRST_HOST + 1
REPO_ROOT = Path(__file__).resolve().parents[2]

_NETNS_RE = re.compile(r"^gv-(\d+)-(\d+)-\w+$")
_LINK_RE = re.compile(r"^gv(?:br)?([0-9a-f]+)_(\d+)(?:v\d+)?$")
_BASE_RE = re.compile(rf"^{BASE_PREFIX}(\d+)-(\d+)$")
_counter = itertools.count(1)


class ClusterError(RuntimeError):
    """The test cluster could not be built or driven."""


@dataclass
class Node:
    name: str
    ip: str
    port: int
    netns: str
    hostname: str
    host_key_pub: str
    work_dir: str
    ckpt_dir: str


# --------------------------------------------------------------------------- helpers


def _run(argv: Sequence[str], *, check: bool = True, timeout: float = 60,
         input: str | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                          input=input)
    if check and proc.returncode != 0:
        raise ClusterError(f"command failed (rc={proc.returncode}): {shlex.join(argv)}\n"
                           f"{proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def missing_prerequisites() -> list[str]:
    """What keeps this machine from running the cluster; empty when all is there."""
    missing = []
    if os.geteuid() != 0:
        missing.append("not running as root (network namespaces and sshd need root)")
    for tool in ("ip", "nsenter", "unshare", "ssh", "ssh-keygen", "useradd", "runuser"):
        if shutil.which(tool) is None:
            missing.append(f"`{tool}` is not installed (run scripts/test-deps.sh)")
    if not os.access(SSHD, os.X_OK):
        missing.append(f"{SSHD} is missing (apt-get install openssh-server; "
                       "or run scripts/test-deps.sh)")
    if not missing:
        probe = f"gv-{os.getpid()}-0-probe"
        try:
            _run(["ip", "netns", "add", probe], timeout=10)
            _run(["ip", "netns", "exec", probe, "ip", "link", "set", "lo", "up"], timeout=10)
        except (ClusterError, OSError, subprocess.TimeoutExpired) as exc:
            missing.append(f"`ip netns` is unusable here: {exc}")
        finally:
            _run(["ip", "netns", "del", probe], check=False, timeout=10)
    return missing


def _start_time(pid: int) -> int | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(text.rsplit(")", 1)[1].split()[19])


def _pid_ns() -> str:
    return os.readlink("/proc/self/ns/pid")


def _owner_alive(pid: int, base: Path | None) -> bool:
    """Conservative: unknown means alive, so we never tear down a live session."""
    if _start_time(pid) is None:
        return False
    if base is not None:
        with contextlib.suppress(OSError, ValueError, KeyError):
            state = json.loads((base / "state.json").read_text())
            if state["pid_ns"] != _pid_ns():
                return True  # another PID namespace: not ours to judge
            return bool(state["start_time"] == _start_time(pid))
    return True


def _children(pids: set[int]) -> dict[int, list[int]]:
    """Map each parent pid in ``pids`` to its children (no /proc/*/children needed)."""
    found: dict[int, list[int]] = {p: [] for p in pids}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(text.rsplit(")", 1)[1].split()[1])
        if ppid in found:
            found[ppid].append(int(entry))
    return found


def _kill(pid: int, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _netns_pids(ns: str) -> list[int]:
    out = _run(["ip", "netns", "pids", ns], check=False, timeout=10).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def _sessions_in(pids: Sequence[int]) -> set[int]:
    """The sshd processes among `pids` and all their descendants."""
    parent: dict[int, int] = {}
    roots = set()
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        parent[pid] = int(stat.rsplit(")", 1)[1].split()[1])
        if comm.startswith("sshd"):
            roots.add(pid)
    out = set(roots)
    grew = True
    while grew:
        more = {p for p, pp in parent.items() if pp in out and p not in out}
        out |= more
        grew = bool(more)
    return out


def _destroy_netns(ns: str) -> None:
    for _ in range(3):
        pids = _netns_pids(ns)
        if not pids:
            break
        for pid in pids:
            _kill(pid)
        time.sleep(0.05)
    _run(["ip", "netns", "del", ns], check=False, timeout=10)


@contextlib.contextmanager
def _host_lock() -> Iterator[None]:
    path = LOCK_FILE if LOCK_FILE.parent.is_dir() else Path("/tmp/gpuvet-cluster.lock")
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def cleanup_stale() -> list[str]:
    """Remove namespaces, links and base dirs of sessions whose owner process is dead.

    Returns what was removed (for logging).
    """
    removed: list[str] = []
    bases = {}
    if BASE_ROOT.is_dir():
        for entry in BASE_ROOT.iterdir():
            m = _BASE_RE.match(entry.name)
            if m:
                bases[(int(m.group(1)), int(m.group(2)))] = entry

    def dead(pid: int, k: int) -> bool:
        return not _owner_alive(pid, bases.get((pid, k)))

    out = _run(["ip", "netns", "list"], check=False, timeout=10).stdout
    for line in out.splitlines():
        ns = line.split()[0] if line.split() else ""
        m = _NETNS_RE.match(ns)
        if m and dead(int(m.group(1)), int(m.group(2))):
            _destroy_netns(ns)
            removed.append(f"netns {ns}")
    out = _run(["ip", "-o", "link", "show"], check=False, timeout=10).stdout
    for line in out.splitlines():
        parts = line.split(":", 2)
        if len(parts) < 2:
            continue
        name = parts[1].strip().split("@")[0]
        m = _LINK_RE.match(name)
        if m and dead(int(m.group(1), 16), int(m.group(2))):
            _run(["ip", "link", "del", name], check=False, timeout=10)
            removed.append(f"link {name}")
    for (pid, k), base in bases.items():
        if dead(pid, k):
            shutil.rmtree(base, ignore_errors=True)
            removed.append(f"dir {base}")
    return removed


def ensure_user(user: str = DEFAULT_USER) -> pwd.struct_passwd:
    """Create the unprivileged test user once; sshd (UsePAM no) refuses '!'-locked ones."""
    with _host_lock():
        try:
            pw = pwd.getpwnam(user)
        except KeyError:
            _run(["useradd", "-m", "-s", "/bin/bash", user])
            pw = pwd.getpwnam(user)
        shadow = _run(["getent", "shadow", user], check=False).stdout.split(":")
        if len(shadow) > 1 and shadow[1].startswith("!"):
            _run(["usermod", "-p", "*", user])
        home_ssh = Path(pw.pw_dir) / ".ssh"
        if not home_ssh.is_dir():
            Path(pw.pw_dir).mkdir(parents=True, exist_ok=True)
            home_ssh.mkdir(mode=0o700)
            os.chown(home_ssh, pw.pw_uid, pw.pw_gid)
    return pw


def _blocked_dirs(paths: Sequence[str], uid: int, gids: set[int]) -> list[tuple[Path, set[str]]]:
    """Directories on the way to ``paths`` that ``uid`` may not traverse, top-down,
    each with the child names that must stay reachable through it."""
    blocked: dict[Path, set[str]] = {}
    for raw in paths:
        for path in {Path(raw), Path(os.path.realpath(raw))}:
            parts = path.parts
            for i in range(1, len(parts) - 1):
                d = Path(*parts[:i])
                try:
                    st = d.stat()
                except OSError:
                    break
                if st.st_uid == uid:
                    ok = st.st_mode & stat.S_IXUSR
                elif st.st_gid in gids:
                    ok = st.st_mode & stat.S_IXGRP
                else:
                    ok = st.st_mode & stat.S_IXOTH
                if not ok:
                    blocked.setdefault(d, set()).add(parts[i])
    return sorted(blocked.items(), key=lambda kv: len(kv[0].parts))


# --------------------------------------------------------------------------- cluster


def bridge_netns(session_id: str, bridge: str, n: int, veths: list[str]
                 ) -> tuple[int, list[tuple[str, str, str]]]:
    """The session's bridge on a free 10.77.<octet>.0/24 (the controller at .1) and n
    network namespaces on it, each with eth0 on a veth whose host end joins the bridge;
    chosen and made under a host-wide lock so sessions never collide. Appends the host
    ends to `veths` (for teardown); returns the octet and (node, netns, ip) per node."""
    pid, k = session_id.split("-")
    with _host_lock():
        octet = _free_octet(int(pid) * 7 + int(k))
        lines = [f"link add {bridge} type bridge", f"addr add 10.77.{octet}.1/24 dev {bridge}",
                 f"link set {bridge} up"]
        members = []
        for i in range(1, n + 1):
            name, ns, veth = f"node{i}", f"gv-{session_id}-node{i}", f"gv{int(pid):x}_{k}v{i}"
            veths.append(veth)
            lines += [f"netns add {ns}", f"link add {veth} type veth peer name eth0 netns {ns}",
                      f"link set {veth} master {bridge} up"]
            members.append((name, ns, f"10.77.{octet}.{FIRST_HOST + i - 1}"))
        _run(["ip", "-batch", "-"], input="\n".join(lines) + "\n")
    return octet, members


@dataclass
class Cluster:
    """A running set of sshd nodes. Build with :meth:`start`, end with :meth:`stop`."""

    base: Path
    user: str
    client_key: Path
    known_hosts: Path
    ssh_config: Path
    nodes: list[Node]
    session_id: str
    subnet: str  # "10.77.x.0/24"
    bridge: str
    node_python: str = ""  # a python the test user can run on every node (repo venv)
    system_python: str | None = None  # the distribution's python3, if any
    user_ssh_dir: Path = field(default=Path())
    _init: dict[str, int] = field(default_factory=dict, repr=False)  # node -> init pid
    _procs: list[subprocess.Popen[bytes]] = field(default_factory=list, repr=False)
    _sshd: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False)
    _veths: list[str] = field(default_factory=list, repr=False)
    _shadows: list[tuple[Path, set[str]]] = field(default_factory=list, repr=False)
    _stopped: bool = field(default=False, repr=False)

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    def start(cls, n: int = 3, *, user: str = DEFAULT_USER, python: str | None = None,
              base_root: Path | None = None, timeout: float = 60) -> Cluster:
        """Build and start ``n`` nodes; on any failure everything built is torn down."""
        if not 1 <= n <= MAX_NODES:
            raise ClusterError(f"n must be between 1 and {MAX_NODES}, got {n}")
        problems = missing_prerequisites()
        if problems:
            raise ClusterError("cannot build the test cluster: " + "; ".join(problems))
        cleanup_stale()
        pw = ensure_user(user)
        pid, k = os.getpid(), next(_counter)
        sid = f"{pid}-{k}"
        base = (base_root or BASE_ROOT) / f"{BASE_PREFIX}{sid}"
        if base.exists():
            shutil.rmtree(base)
        base.mkdir(mode=0o755, parents=True)
        os.chmod(base, 0o755)
        (base / "state.json").write_text(json.dumps(
            {"pid": pid, "start_time": _start_time(pid), "pid_ns": _pid_ns()}))
        self = cls(base=base, user=user, client_key=base / "client_key",
                   known_hosts=base / "known_hosts", ssh_config=base / "ssh_config",
                   nodes=[], session_id=sid, subnet="", bridge=f"gvbr{pid:x}_{k}",
                   user_ssh_dir=base / "user_ssh")
        atexit.register(self.stop)
        try:
            self._build(n, pw, python or _default_python(), timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _build(self, n: int, pw: pwd.struct_passwd, python: str, timeout: float) -> None:
        octet, members = bridge_netns(self.session_id, self.bridge, n, self._veths)
        self.subnet = f"10.77.{octet}.0/24"
        for name, ns, ip in members:
            node_dir = self.base / "nodes" / name
            self.nodes.append(Node(name=name, ip=ip, port=22, netns=ns, hostname=name,
                                   host_key_pub="", work_dir=str(node_dir / "work"),
                                   ckpt_dir=str(node_dir / "ckpt")))

        # keys: one client key per session, one host key per node (generated in parallel)
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"gpuvet-{self.session_id}",
              "-f", str(self.client_key)])
        keygens = []
        for node in self.nodes:
            d = self._node_dir(node.name)
            for sub in ("work", "ckpt"):
                (d / sub).mkdir(parents=True)
                os.chown(d / sub, pw.pw_uid, pw.pw_gid)
            keygens.append(_keygen(d / "ssh_host_ed25519_key", node.name))
        for proc in keygens:
            if proc.wait(timeout=30) != 0:
                raise ClusterError("ssh-keygen failed for a host key")
        for node in self.nodes:
            node.host_key_pub = self._read_host_key(node.name)

        pub = (self.base / "client_key.pub").read_text()
        (self.base / "authorized_keys").write_text(pub)
        self._write_client_files()
        self._write_user_ssh(pw)
        hosts = "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n" + "".join(
            f"{node.ip} {node.name}\n" for node in self.nodes)
        (self.base / "hosts").write_text(hosts)
        for node in self.nodes:
            self._write_sshd_config(node)
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)

        # let the test user run the controller's python inside the nodes
        self.system_python = next((p for p in ("/usr/bin/python3",) if os.access(p, os.X_OK)),
                                  None)
        gids = {pw.pw_gid, *os.getgrouplist(pw.pw_name, pw.pw_gid)}
        self._shadows = _blocked_dirs([python, str(REPO_ROOT)], pw.pw_uid, gids)
        for idx, (_d, children) in enumerate(self._shadows):
            shadow = self.base / "shadow" / str(idx)
            shadow.mkdir(parents=True, mode=0o755)
            for child in children:
                (shadow / child).mkdir(mode=0o755)
        self.node_python = python

        deadline = time.monotonic() + timeout
        self._start_inits(deadline, pw.pw_dir)
        for node in self.nodes:
            self._spawn_sshd(node.name)
        self._wait_ports([n.name for n in self.nodes], deadline)

        check = self.netns_exec(self.nodes[0].name, [python, "-c", "import sys"], user=self.user)
        if check.returncode != 0:
            if self.system_python is None:
                raise ClusterError(f"the test user cannot run {python} on the nodes: "
                                   f"{check.stderr.strip()}")
            self.node_python = self.system_python

    def stop(self) -> None:
        """Kill everything of this session and remove its namespaces, links and files.

        Idempotent; safe after a partial start.
        """
        if self._stopped:
            return
        self._stopped = True
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)
        for pid in self._init.values():
            _kill(pid)  # PID 1 of a namespace: the kernel kills every process in it
        for proc in [*self._procs, *self._sshd.values()]:
            with contextlib.suppress(Exception):
                proc.kill()
            with contextlib.suppress(Exception):
                proc.wait(timeout=5)
        for node in self.nodes:
            _destroy_netns(node.netns)
        for link in [*self._veths, self.bridge]:
            if link:
                _run(["ip", "link", "del", link], check=False, timeout=10)
        shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ nodes

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(f"no node {name!r}; nodes: {', '.join(n.name for n in self.nodes)}")

    def stop_sshd(self, name: str, timeout: float = 10) -> None:
        """Stop the node's sshd: new connections are refused; open sessions go on."""
        proc = self._sshd.pop(name, None)
        if proc is None:
            return
        for child in _children({proc.pid})[proc.pid]:
            _kill(child, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            for child in _children({proc.pid})[proc.pid]:
                _kill(child)
            proc.kill()
            proc.wait(timeout=5)
        node = self.node(name)
        deadline = time.monotonic() + timeout
        while _port_open(node.ip, node.port) and time.monotonic() < deadline:
            time.sleep(0.05)

    def kill_node(self, name: str, timeout: float = 10) -> None:
        """The node dies: its sshd stops and its SSH sessions are killed with everything
        they started, so connections break at once instead of living on (stopping sshd
        alone leaves open sessions running). :meth:`start_sshd` brings sshd back."""
        self.stop_sshd(name, timeout=timeout)
        ns = self.node(name).netns
        deadline = time.monotonic() + timeout
        while True:
            doomed = _sessions_in(_netns_pids(ns))
            if not doomed:
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"processes of {name} survived SIGKILL: {sorted(doomed)}")
            for pid in doomed:
                _kill(pid)
            time.sleep(0.05)

    def start_sshd(self, name: str, timeout: float = 20) -> None:
        if name in self._sshd and self._sshd[name].poll() is None:
            return
        self._spawn_sshd(name)
        self._wait_ports([name], time.monotonic() + timeout)

    def new_host_key(self, name: str) -> str:
        """Give the node a new host key (known_hosts keeps the old one) and restart sshd.

        Call :meth:`update_known_hosts` afterwards to trust the new key again.
        """
        key = self._node_dir(name) / "ssh_host_ed25519_key"
        self.stop_sshd(name)
        for path in (key, key.with_name(key.name + ".pub")):
            path.unlink(missing_ok=True)
        if _keygen(key, name).wait(timeout=30) != 0:
            raise ClusterError(f"ssh-keygen failed for {name}")
        self.node(name).host_key_pub = self._read_host_key(name)
        self.start_sshd(name)
        return self.node(name).host_key_pub

    def update_known_hosts(self) -> None:
        """Rewrite the controller's and the nodes' known_hosts from the current host keys."""
        self._write_client_files()
        self._write_user_ssh(pwd.getpwnam(self.user))

    # ------------------------------------------------------------------ running things

    def ssh(self, name: str, command: str, timeout: float = 30, *,
            input: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``command`` on the node through the system ssh client and ``ssh_config``."""
        argv = ["ssh", "-F", str(self.ssh_config), name, command]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              input=input, stdin=None if input is not None else subprocess.DEVNULL)

    def netns_exec(self, name: str, argv: Sequence[str], *, user: str | None = None,
                   timeout: float = 60, input: str | None = None,
                   env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside the node's namespaces (net, uts, mount, pid), as root
        unless ``user`` is given."""
        init = self._init.get(name)
        if init is None:
            raise ClusterError(f"node {name} is not running")
        cmd = ["nsenter", "-t", str(init), "-n", "-u", "-m", "-p", "--"]
        if user is not None:
            cmd += ["runuser", "-u", user, "--"]
        return subprocess.run([*cmd, *argv], capture_output=True, text=True, timeout=timeout,
                              input=input, env=dict(env) if env is not None else None,
                              stdin=None if input is not None else subprocess.DEVNULL)

    # ------------------------------------------------------------------ files for others

    def write_inventory(self, path: str | os.PathLike[str], provider: str = "testlab",
                        executor: str = "ssh",
                        extra_node_fields: Mapping[str, Any]
                        | Callable[[Node], Mapping[str, Any]] | None = None,
                        *, nodes: Sequence[str] | None = None,
                        extra_provider_fields: Mapping[str, Any] | None = None,
                        settings: Mapping[str, Any] | None = None) -> Path:
        """Write an inventory (orchestrator/inventory.py format, version 1) with one
        provider holding (some of) the nodes; returns its path.

        Access (user, key, python) is set once on the provider; each node gets
        host, work_dir and ckpt_dir. ``extra_node_fields`` is merged into every
        node entry (a callable gets the Node), ``extra_provider_fields`` into the
        provider (e.g. ``expect``, ``pricing``), ``settings`` into ``settings``.
        """
        from ruamel.yaml import YAML

        chosen = [self.node(n) for n in nodes] if nodes is not None else self.nodes
        entries = []
        for node in chosen:
            entry: dict[str, Any] = {"name": node.name, "host": node.ip,
                                     "work_dir": node.work_dir, "ckpt_dir": node.ckpt_dir}
            if node.port != 22:
                entry["port"] = node.port
            if extra_node_fields is not None:
                extra = (extra_node_fields(node) if callable(extra_node_fields)
                         else extra_node_fields)
                entry.update(extra)
            entries.append(entry)
        prov: dict[str, Any] = {
            "executor": executor,
            "access": {"user": self.user, "identity_file": str(self.client_key),
                       "python": self.node_python},
        }
        prov.update(extra_provider_fields or {})
        prov["nodes"] = entries
        doc: dict[str, Any] = {
            "version": 1,
            "settings": {"known_hosts": str(self.known_hosts), **(settings or {})},
            "providers": {provider: prov},
        }
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        yaml = YAML()
        yaml.default_flow_style = False
        with out.open("w") as fh:
            fh.write(f"# test cluster {self.session_id}: {len(chosen)} sshd nodes on "
                     f"{self.subnet}\n")
            yaml.dump(doc, fh)
        return out

    def write_hostfile(self, path: str | os.PathLike[str], slots: int = 1,
                       *, by: str = "ip") -> Path:
        """An Open MPI hostfile (``<ip|name> slots=N``) readable by the test user."""
        out = Path(path)
        out.write_text("".join(f"{getattr(n, 'ip' if by == 'ip' else 'name')} slots={slots}\n"
                               for n in self.nodes))
        out.chmod(0o644)
        return out

    # ------------------------------------------------------------------ internals

    def _node_dir(self, name: str) -> Path:
        return self.base / "nodes" / name

    def _read_host_key(self, name: str) -> str:
        text = (self._node_dir(name) / "ssh_host_ed25519_key.pub").read_text().split()
        return f"{text[0]} {text[1]}"

    def _write_client_files(self) -> None:
        self.known_hosts.write_text("".join(f"{n.ip} {n.host_key_pub}\n" for n in self.nodes))
        common = (f"  User {self.user}\n  IdentityFile {self.client_key}\n  IdentitiesOnly yes\n"
                  f"  UserKnownHostsFile {self.known_hosts}\n  GlobalKnownHostsFile /dev/null\n"
                  "  StrictHostKeyChecking yes\n  UpdateHostKeys no\n  BatchMode yes\n"
                  "  ConnectTimeout 10\n  ControlMaster no\n  ControlPath none\n")
        text = "".join(f"Host {n.name}\n  HostName {n.ip}\n  Port {n.port}\n{common}\n"
                       for n in self.nodes)
        text += f"Host {self.subnet.rsplit('.', 1)[0]}.*\n{common}"
        self.ssh_config.write_text(text)

    def _write_user_ssh(self, pw: pwd.struct_passwd) -> None:
        """The test user's ~/.ssh as seen inside every node (bind-mounted there)."""
        d = self.user_ssh_dir
        d.mkdir(mode=0o700, exist_ok=True)
        shutil.copyfile(self.client_key, d / "id_ed25519")
        shutil.copyfile(self.base / "client_key.pub", d / "id_ed25519.pub")
        (d / "known_hosts").write_text(
            "".join(f"{n.ip},{n.name} {n.host_key_pub}\n" for n in self.nodes))
        (d / "config").write_text(
            f"Host *\n  User {pw.pw_name}\n  IdentityFile ~/.ssh/id_ed25519\n"
            "  IdentitiesOnly yes\n  UserKnownHostsFile ~/.ssh/known_hosts\n"
            "  GlobalKnownHostsFile /dev/null\n  StrictHostKeyChecking yes\n"
            "  UpdateHostKeys no\n  BatchMode yes\n  ConnectTimeout 10\n")
        (d / "authorized_keys").write_text((self.base / "client_key.pub").read_text())
        for p in [d, *d.iterdir()]:
            os.chown(p, pw.pw_uid, pw.pw_gid)
            p.chmod(0o700 if p.is_dir() else 0o600)

    def _write_sshd_config(self, node: Node) -> None:
        d = self._node_dir(node.name)
        lines = [
            f"ListenAddress {node.ip}", f"Port {node.port}",
            f"HostKey {d / 'ssh_host_ed25519_key'}", f"PidFile {d / 'sshd.pid'}",
            f"AuthorizedKeysFile {self.base / 'authorized_keys'}",
            "StrictModes no", "PubkeyAuthentication yes", "PasswordAuthentication no",
            "KbdInteractiveAuthentication no", "UsePAM no", "PermitRootLogin no",
            f"AllowUsers {self.user}", "MaxStartups 100:30:200", "MaxSessions 64",
            "LogLevel ERROR", "UseDNS no", "PrintMotd no", "PrintLastLog no",
            "X11Forwarding no", "Subsystem sftp internal-sftp",
        ]
        if _openssh_version() >= (9, 8):
            lines.append("PerSourcePenalties no")  # many quick connections are the point
        (d / "sshd_config").write_text("\n".join(lines) + "\n")

    def _start_inits(self, deadline: float, home: str) -> None:
        """One init per node: sets hostname, addresses and mounts, then reaps orphans."""
        mounts = [f"mount --bind {shlex.quote(str(self.base / 'hosts'))} /etc/hosts",
                  f"mount --bind {shlex.quote(str(self.user_ssh_dir))} "
                  f"{shlex.quote(str(Path(home) / '.ssh'))}"]
        for idx, (d, children) in enumerate(self._shadows):
            shadow = self.base / "shadow" / str(idx)
            mounts += [f"mount --rbind {shlex.quote(str(d / c))} {shlex.quote(str(shadow / c))}"
                       for c in sorted(children)]
            mounts.append(f"mount --rbind {shlex.quote(str(shadow))} {shlex.quote(str(d))}")
        script = "\n".join([
            "set -e", 'echo "$1" > /proc/sys/kernel/hostname', "ip link set lo up",
            'ip addr add "$2/24" dev eth0',
            "ip link set eth0 up", *mounts, "echo ready",
            "exec bash -c 'while :; do sleep 3600; done' >/dev/null 2>&1 </dev/null",
        ])
        starting: dict[str, subprocess.Popen[bytes]] = {}
        for node in self.nodes:
            log = open(self._node_dir(node.name) / "init.log", "wb")  # noqa: SIM115
            proc = subprocess.Popen(
                ["ip", "netns", "exec", node.netns, "unshare", "--uts", "--pid", "--fork",
                 "--mount-proc", "sh", "-c", script, "init", node.name, node.ip],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log,
                start_new_session=True)
            log.close()
            self._procs.append(proc)
            starting[node.name] = proc
        for name, proc in starting.items():
            assert proc.stdout is not None
            remaining = max(0.1, deadline - time.monotonic())
            ready, _, _ = select.select([proc.stdout], [], [], remaining)
            line = proc.stdout.readline() if ready else b""
            proc.stdout.close()
            if line.strip() != b"ready":
                log_text = (self._node_dir(name) / "init.log").read_text(errors="replace")
                raise ClusterError(f"node {name} did not come up: {log_text.strip()}")
        kids = _children({p.pid for p in starting.values()})
        for name, proc in starting.items():
            if len(kids[proc.pid]) != 1:
                raise ClusterError(f"node {name}: cannot find its init process")
            self._init[name] = kids[proc.pid][0]

    def _spawn_sshd(self, name: str) -> None:
        d = self._node_dir(name)
        with open(d / "sshd.log", "ab") as log:
            self._sshd[name] = subprocess.Popen(
                ["nsenter", "-t", str(self._init[name]), "-n", "-u", "-m", "-p", "--",
                 SSHD, "-D", "-e", "-f", str(d / "sshd_config")],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)

    def _wait_ports(self, names: Sequence[str], deadline: float) -> None:
        waiting = list(names)
        while waiting:
            for name in list(waiting):
                proc = self._sshd[name]
                if proc.poll() is not None:
                    log = (self._node_dir(name) / "sshd.log").read_text(errors="replace")
                    raise ClusterError(f"sshd on {name} exited with {proc.returncode}: "
                                       f"{log.strip()[-2000:]}")
                node = self.node(name)
                if _port_open(node.ip, node.port):
                    waiting.remove(name)
            if waiting:
                if time.monotonic() > deadline:
                    raise ClusterError(f"sshd did not start listening on: {', '.join(waiting)}")
                time.sleep(0.02)


def _keygen(path: Path, name: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name,
                             "-f", str(path)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _port_open(ip: str, port: int) -> bool:
    try:
        with socket.create_connection((ip, port), timeout=0.5):
            return True
    except OSError:
        return False


def _free_octet(seed: int) -> int:
    out = _run(["ip", "-4", "-o", "addr", "show"], timeout=10).stdout
    used = {int(m.group(1)) for m in re.finditer(r"inet 10\.77\.(\d+)\.", out)}
    for i in range(254):
        octet = (seed + i) % 254 + 1
        if octet not in used:
            return octet
    raise ClusterError("no free 10.77.x.0/24 subnet left")


_ssh_version: tuple[int, int] | None = None


def _openssh_version() -> tuple[int, int]:
    global _ssh_version
    if _ssh_version is None:
        text = _run(["ssh", "-V"], check=False).stderr
        m = re.search(r"OpenSSH_(\d+)\.(\d+)", text)
        _ssh_version = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
    return _ssh_version


def _default_python() -> str:
    venv = REPO_ROOT / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable
