"""The executor protocol, the registry of backends, and parallel fan-out.

An executor is bound to one node. Commands are shell strings: callers build
them with `shell_join`/`shlex.quote`, so nothing from an inventory reaches a
shell unquoted. Fan-out returns results and failures side by side, like
fabric's GroupResult: one broken node never stops the others.
"""

from __future__ import annotations

import errno
import hashlib
import importlib
import shlex
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from orchestrator.command import CommandResult as CommandRecord
from orchestrator.errors import (
    CommandFailed,
    CommandTimeout,
    ConnectionFailed,
    GpuvetError,
    StepError,
    StoreError,
    UsageError,
)
from orchestrator.inventory import Inventory, Node, SlurmOptions


class CommandResult(CommandRecord):
    """A command's record as executors return it, and the check that turns a failed one
    into the error that carries it."""

    def raise_for_status(self, what: str) -> CommandResult:
        """Raise CommandTimeout or CommandFailed, both carrying this result, unless it is ok."""
        if self.timed_out:
            raise CommandTimeout(f"{what} timed out after {self.duration_s:.0f} s and was killed",
                                 node=self.node, command=self.command, result=self,
                                 hint="raise the timeout or look at the node's load")
        if self.rc != 0:
            tail = (self.stderr or self.stdout).strip().splitlines()[-5:]
            raise CommandFailed(f"{what} failed with exit code {self.rc}: " + " | ".join(tail),
                                node=self.node, command=self.command, result=self)
        return self


@dataclass
class ConnectionInfo:
    node: str
    hostname: str
    latency_ms: float
    host_key: str  # "known", "accepted-new", "n/a"
    python_version: str | None


class Executor(Protocol):
    node: Node

    def run(self, command: str, *, env: Mapping[str, str] | None = None, cwd: str | None = None,
            timeout: float | None = None, stdout_path: Path | None = None) -> CommandResult: ...

    def put(self, local: Path, remote: str) -> None: ...

    def get(self, remote: str, local: Path) -> None: ...

    def close(self) -> None: ...


@dataclass
class ExecutorOptions:
    """Run-wide options every backend may read."""

    known_hosts: str = "~/.ssh/known_hosts"
    accept_new_host_keys: bool = False
    ssh_config: str | None = None
    jump_hosts: Mapping[str, object] = field(default_factory=dict)
    nodes: Mapping[str, Node] = field(default_factory=dict)
    ray_address: str | None = None
    # connections an ExecutorPool leaves open between uses: beyond this many, idle ones
    # are closed, least recently handed out first (each open SSH connection is a
    # socket and a transport thread for as long as it stays open)
    keep_open: int = 64
    # executor slurm providers: their `slurm:` blocks, and the client each provider's
    # nodes share (made on first use, or handed over by `slurm.allocations`)
    slurm: Mapping[str, SlurmOptions] = field(default_factory=dict)
    slurm_clients: dict[str, Any] = field(default_factory=dict)


KEEP_OPEN_MIN = 64
ExecutorFactory = Callable[[Node, ExecutorOptions], Executor]
# name -> "module:attribute" of the backend's class, imported on first use (as the CLI's
# GROUPS are): a run over local nodes never loads fabric/paramiko, SSH work never ray
_REGISTRY: dict[str, str] = {}


def register(name: str, target: str) -> None:
    _REGISTRY[name] = target


def _load(target: str) -> ExecutorFactory:
    module, _, attr = target.partition(":")
    factory: ExecutorFactory = getattr(importlib.import_module(module), attr)
    return factory


def make_executor(node: Node, options: ExecutorOptions) -> Executor:
    try:
        loader = _REGISTRY[node.executor]
    except KeyError:
        raise UsageError(f"unknown executor {node.executor!r}", node=node.name,
                         hint=f"known executors: {', '.join(sorted(_REGISTRY))}") from None
    return _load(loader)(node, options)


def options_for(inv: Inventory, accept_new_host_keys: bool = False) -> ExecutorOptions:
    ray = next((p.ray.address for p in inv.providers.values() if p.ray), None)
    return ExecutorOptions(
        known_hosts=inv.settings.known_hosts,
        accept_new_host_keys=accept_new_host_keys,
        ssh_config=inv.settings.ssh_config,
        jump_hosts=dict(inv.doc.jump_hosts),
        nodes={n.name: n for n in inv.nodes},
        ray_address=ray,
        keep_open=max(KEEP_OPEN_MIN, 2 * inv.settings.concurrency),
        slurm={p.name: p.slurm for p in inv.providers.values() if p.slurm is not None},
    )


def is_unreachable(exc: BaseException) -> bool:
    """Whether exc, or an error it was raised from, says the node could not be reached.

    Decided by type (ConnectionFailed and its subclasses: host keys, hops), never by
    the words of a message. Only explicit causes (`raise ... from exc`) are followed:
    an unrelated error raised while handling a lost connection is not a lost node.
    """
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, ConnectionFailed):
            return True
        seen.add(id(cur))
        cur = cur.__cause__
    return False


def shell_join(argv: Iterable[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)


class EnvCommand(str):
    """A command that carries the environment it needs, as `env`.

    Every executor puts `env` into the command's environment (over the node's and
    the caller's), so a command built from values that must stay off its command
    line (mpirun's per-node environment) runs correctly wherever it is handed,
    without each caller threading the values through.
    """

    env: dict[str, str]

    def __new__(cls, command: str, env: Mapping[str, str]) -> EnvCommand:
        obj = super().__new__(cls, command)
        obj.env = dict(env)
        return obj


def command_env(node: Node, command: str, env: Mapping[str, str] | None) -> dict[str, str]:
    """The environment a command runs with: the node's, the caller's, the command's own."""
    own = command.env if isinstance(command, EnvCommand) else {}
    return {**node.env, **(env or {}), **own}


def check_env_names(env: Mapping[str, str]) -> None:
    """Names reach a shell unquoted (`export NAME=...`, mpirun's `-x NAME`): check them."""
    for k in env:
        if not k or not k.replace("_", "a").isalnum() or not k.isascii() or k[0].isdigit():
            raise UsageError(f"invalid environment variable name {k!r}",
                             hint="names may hold letters, digits and '_' only")


def env_script(env: Mapping[str, str]) -> str:
    """Shell lines exporting env, every value quoted, for a remote shell to read from stdin.

    Values never go on a command line: on a shared node any user can read those
    with `ps`. The SSH executor sends this text through the command's own channel
    instead (see `ENV_FROM_STDIN`).
    """
    check_env_names(env)
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())


# Read the lines of `env_script` from stdin (they exist only in this shell's memory,
# never in a file or an argv), then give the command an empty stdin as before.
ENV_FROM_STDIN = 'eval "$(cat)"; exec </dev/null; '


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


REMOTE_SHA256 = ("(sha256sum {p} 2>/dev/null || shasum -a 256 {p}) | cut -d' ' -f1")


def remote_path(node: Node, path: str) -> str:
    """Where a path given for a node points: absolute and ~/ paths as given, others under
    the node's work_dir, so a copy and the commands that check it agree on one place."""
    if path.startswith("/") or path == "~" or path.startswith("~/"):
        return path
    if path.startswith("~"):
        raise UsageError(f"remote path {path!r}: ~user paths are not supported",
                         node=node.name, hint="give the full path")
    return f"{node.work_dir.rstrip('/') or '/'}/{path}"


def shell_path(path: str) -> str:
    """`path` quoted for a shell, a leading ~/ still meaning the home directory."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def sha256_command(path: str) -> str:
    return REMOTE_SHA256.format(p=shell_path(path))


def put_verified(ex: Executor, local: Path, remote: str) -> str:
    """Copy a file and prove it arrived whole: the sha256 on both sides must match."""
    remote = remote_path(ex.node, remote)
    digest = sha256_file(local)
    ex.put(local, remote)
    res = ex.run(sha256_command(remote), timeout=120)
    got = res.stdout.strip()
    if not res.ok or got != digest:
        raise StepError(f"checksum mismatch after copying {local} to {remote}: "
                        f"local {digest[:12]}, remote {got[:12] or res.stderr.strip()}",
                        node=ex.node.name, hint="check free disk space on the node and retry")
    return digest


def get_verified(ex: Executor, remote: str, local: Path) -> str:
    remote = remote_path(ex.node, remote)
    res = ex.run(sha256_command(remote), timeout=120)
    if not res.ok or not res.stdout.strip():
        raise StepError(f"cannot read {remote}: {res.stderr.strip() or 'no such file'}",
                        node=ex.node.name)
    want = res.stdout.strip()
    local.parent.mkdir(parents=True, exist_ok=True)
    ex.get(remote, local)
    got = sha256_file(local)
    if got != want:
        raise StepError(f"checksum mismatch after copying {remote} to {local}",
                        node=ex.node.name, hint="retry; if it persists the file is changing")
    return got


T = TypeVar("T")


@dataclass
class GroupResult(Generic[T]):
    """Per-node results and failures, side by side."""

    results: dict[str, T] = field(default_factory=dict)
    failures: dict[str, GpuvetError] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.failures


# (node or unit, state): "queued" (a unit joins the work: the bar counts units from then
# on), "start", "done", "failed", or any other text: what the unit is doing now
ProgressHook = Callable[[str, str], None]


class Named(Protocol):
    @property
    def name(self) -> str: ...


N = TypeVar("N", bound=Named)
_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)
_LIVE_POOLS: weakref.WeakSet[ExecutorPool] = weakref.WeakSet()
# set by an interrupt until the next top-level fanout: workers still running see it, start
# no more commands, and the step driver writes no records of theirs
_INTERRUPTED = threading.Event()


def interrupted() -> bool:
    """Whether an interrupt (SIGINT, SIGTERM) is stopping the work in progress."""
    return _INTERRUPTED.is_set()


def cancel_all() -> None:
    """Kill every command in flight on every node (an interrupt: nothing else will wait)."""
    _INTERRUPTED.set()
    pools = list(_LIVE_POOLS)
    threads = [threading.Thread(target=p.cancel, daemon=True) for p in pools]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)


def fanout(nodes: Sequence[N], fn: Callable[[N], T], *, concurrency: int = 32,
           progress: ProgressHook | None = None) -> GroupResult[T]:
    """Run fn on every node in parallel; exceptions become per-node failures.

    On SIGINT/SIGTERM (raised in the calling thread) no further node is started,
    the commands running on the nodes are killed with their process groups, and
    the interrupt goes on up once the workers have returned. A fanout inside a
    worker (a unit's own phases) starts nothing more once an interrupt is on.
    """
    group: GroupResult[T] = GroupResult()
    lock = threading.Lock()
    if threading.current_thread() is threading.main_thread():
        _INTERRUPTED.clear()  # a new operation; nested fanouts run in worker threads

    def one(node: N) -> None:
        if _INTERRUPTED.is_set():
            return  # interrupted before this node started: nothing to record
        if progress:
            progress(node.name, "start")
        try:
            value = fn(node)
        except GpuvetError as exc:
            if exc.node is None:
                exc.node = node.name
                exc.args = (exc.render(),)
            with lock:
                group.failures[node.name] = exc
            if progress:
                progress(node.name, "failed")
            return
        except Exception as exc:  # a bug or a library error: keep the others going
            if isinstance(exc, OSError) and exc.errno in _DISK_ERRNOS:
                err: GpuvetError = StoreError(
                    f"the controller cannot write ({exc.strerror}: {exc.filename})",
                    hint="free space on the results disk (or use --results elsewhere); "
                         "--resume finishes the run")
            else:
                err = GpuvetError(f"{type(exc).__name__}: {exc}", node=node.name)
            with lock:
                group.failures[node.name] = err
            if progress:
                progress(node.name, "failed")
            return
        with lock:
            group.results[node.name] = value
        if progress:
            progress(node.name, "done")

    if not nodes:
        return group
    pool = ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(nodes))))
    try:
        futures = [pool.submit(one, n) for n in nodes]
        for f in as_completed(futures):
            f.result()
    except BaseException:  # KeyboardInterrupt, Terminated: stop starting, kill, then go on up
        _INTERRUPTED.set()  # before the pool lets a queued node start
        pool.shutdown(wait=False, cancel_futures=True)
        cancel_all()
        raise
    finally:
        pool.shutdown(wait=True)
    # keep inventory order, whatever order they finished in
    group.results = {n.name: group.results[n.name] for n in nodes if n.name in group.results}
    group.failures = {n.name: group.failures[n.name] for n in nodes if n.name in group.failures}
    return group


def probe(ex: Executor) -> ConnectionInfo:
    """Connect, then measure what `gpuvet ping` shows: hostname, latency, python."""
    py = shlex.quote(ex.node.python)
    res = ex.run(f"hostname; {py} -c 'import platform; print(platform.python_version())' "
                 "2>/dev/null || echo", timeout=60)
    res.raise_for_status("probe")
    lines = res.stdout.splitlines() + ["", ""]
    t0 = time.monotonic()
    ex.run("true", timeout=60).raise_for_status("latency probe")
    latency = (time.monotonic() - t0) * 1000
    return ConnectionInfo(node=ex.node.name, hostname=lines[0].strip(), latency_ms=latency,
                          host_key=getattr(ex, "host_key_status", "n/a"),
                          python_version=lines[1].strip() or None)


class ExecutorPool:
    """One executor per node for the length of a run; connections are reused.

    At most `options.keep_open` connections stay open between uses: once more nodes
    have been handed out, the least recently handed out idle ones are closed (an
    executor with a `release_if_idle` method says whether it was idle and closed its
    connection; it opens a new one when used again). A fleet of 1,000 nodes then
    holds about as many connections, sockets and transport threads as it has work
    in flight, not one per node for the whole run.
    """

    def __init__(self, options: ExecutorOptions) -> None:
        self.options = options
        self._executors: dict[str, Executor] = {}
        self._open: OrderedDict[str, None] = OrderedDict()  # handed out, maybe connected
        self._lock = threading.Lock()
        _LIVE_POOLS.add(self)

    def cancel(self) -> None:
        """Kill the commands running through this pool's executors (best effort)."""
        with self._lock:
            executors = list(self._executors.values())
        for ex in executors:
            cancel = getattr(ex, "cancel", None)
            if cancel is not None:
                try:
                    cancel()
                except Exception:  # the node may be gone; the interrupt is reported anyway
                    pass

    def __call__(self, node: Node) -> Executor:
        with self._lock:
            ex = self._executors.get(node.name)
            if ex is None:
                ex = make_executor(node, self.options)
                self._executors[node.name] = ex
            self._open[node.name] = None
            self._open.move_to_end(node.name)
            excess = len(self._open) - max(1, self.options.keep_open)
            victims = [n for n in self._open if n != node.name][:excess] if excess > 0 else []
            for name in victims:
                del self._open[name]
        for name in victims:  # outside the pool's lock: closing a connection takes a while
            self._release(name)
        return ex

    def _release(self, name: str) -> None:
        ex = self._executors[name]
        release = getattr(ex, "release_if_idle", None)
        try:
            released = bool(release()) if release is not None else True
        except Exception:  # a connection that fails to close is closed enough
            released = True
        if not released:  # busy: it stays open and counts again
            with self._lock:
                self._open.setdefault(name, None)
                self._open.move_to_end(name, last=False)

    @property
    def open_count(self) -> int:
        """Nodes handed out whose connections may be open now."""
        with self._lock:
            return len(self._open)

    def close(self) -> None:
        with self._lock:
            for ex in self._executors.values():
                try:
                    ex.close()
                except Exception:  # closing is best effort; the run's result stands
                    pass
            self._executors.clear()
            self._open.clear()

    def __enter__(self) -> ExecutorPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
