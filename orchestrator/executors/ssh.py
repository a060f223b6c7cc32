"""SSH executor on fabric/paramiko.

Host keys are checked against known_hosts by default (fabric's own default
would trust any key). `accept_new_host_keys` trusts a key seen for the first
time and records it, like OpenSSH's StrictHostKeyChecking=accept-new; a key
that changed is always refused. One connection per node is opened lazily and
reused for every command of a run.

Remote commands run in their own session (setsid) whose id is written to a
pid file, so a command that outlives its timeout is killed with its whole
process group: nothing is left running on the node.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import posixpath
import shlex
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import paramiko
from fabric import Config, Connection
from invoke.exceptions import CommandTimedOut, ThreadException

from orchestrator.errors import ConnectionFailed, HostKeyError, StepError, UsageError, shown
from orchestrator.executors import hops, hostkeys
from orchestrator.executors.base import (
    ENV_FROM_STDIN,
    CommandResult,
    ExecutorOptions,
    command_env,
    env_script,
    remote_path,
    shell_path,
)
from orchestrator.executors.hops import Hop
from orchestrator.files import MAX_KEY_BYTES, MAX_SSH_FILE_BYTES, user_file_problem
from orchestrator.inventory import JumpHost, Node

CHANNEL_TIMEOUT_S = 30.0
KEEPALIVE_S = 30

# Paramiko logs each failure from its transport thread with a traceback
# ("Exception (client): ..."), which Python's last-resort handler prints on
# stderr. gpuvet reports every failure once, in its own words, so paramiko's
# records stop here; `logging.getLogger("paramiko").propagate = True` brings
# them back for debugging.
_paramiko_log = logging.getLogger("paramiko")
_paramiko_log.addHandler(logging.NullHandler())
_paramiko_log.propagate = False
KILL_GRACE_S = 2


class SshExecutor:
    def __init__(self, node: Node, options: ExecutorOptions) -> None:
        self.node = node
        self.options = options
        self.host_key_status = "known"
        self._conn: Connection | None = None
        self._lock = threading.Lock()
        self._inflight: set[str] = set()  # pidfiles of the commands running now
        self._users = 0  # run/put/get calls under way: the connection is busy
        self.known_hosts = Path(os.path.expanduser(options.known_hosts))
        self._policies: list[hostkeys.Policy] = []
        self._gateway_failures: hops.ChannelFailures | None = None

    # --- connection -----------------------------------------------------------
    def _config(self) -> Config:
        overrides: dict[str, Any] = {"load_ssh_configs": True}
        if self.options.ssh_config:
            overrides["ssh_config_path"] = self._ssh_file(self.options.ssh_config, "ssh_config",
                                                          MAX_SSH_FILE_BYTES)
        return Config(overrides=overrides)

    def _ssh_file(self, value: str, key: str, max_bytes: int) -> str:
        """A file paramiko or fabric will open and read whole, checked first as `inventory
        check` checks it (it may have changed since): a FIFO would block the worker in open(),
        and the pool's shutdown with it, past SIGINT and SIGTERM; /dev/zero never ends."""
        path = os.path.expanduser(value)
        why = user_file_problem(Path(path), max_bytes)
        if why is not None:
            raise ConnectionFailed(f"{key} {shown(value)} {why}", node=self.node.name,
                                   hint=f"name a regular file as {key} in the inventory")
        return path

    def _secure(self, conn: Connection) -> Connection:
        kh = hostkeys.load(self.known_hosts)
        policy = hostkeys.Policy(kh, self.options.accept_new_host_keys, self.node.name)
        conn.client.set_missing_host_key_policy(policy)
        for name, key in kh.entries:
            conn.client.get_host_keys().add(name, key.get_name(), key)
        self._policies.append(policy)
        return conn

    def _connection_for(self, host: str, user: str | None, port: int | None,
                        identity: str | None, gateway: Connection | None) -> Connection:
        timeout = float(self.node.connect_timeout_s)
        kwargs: dict[str, Any] = {"banner_timeout": max(30.0, timeout),
                                  "auth_timeout": max(30.0, timeout)}
        if identity:
            kwargs["key_filename"] = self._ssh_file(identity, "identity_file", MAX_KEY_BYTES)
            kwargs["look_for_keys"] = False
        conn = Connection(host, user=user, port=port, config=self._config(),
                          connect_kwargs=kwargs, gateway=gateway)
        # fabric rounds connect_timeout down to whole seconds (0.3 would become 0,
        # that is: no timeout at all); paramiko takes the float as given
        conn.connect_timeout = None
        conn.connect_kwargs["timeout"] = timeout
        return self._secure(conn)

    def _gateway(self) -> tuple[Connection, Hop] | None:
        name = self.node.proxy_jump
        if not name:
            return None
        jump = self.options.jump_hosts.get(name)
        if isinstance(jump, JumpHost):
            conn = self._connection_for(jump.host, jump.user, jump.port, jump.identity_file, None)
        elif (other := self.options.nodes.get(name)) is not None:
            host = other.ssh_alias or other.host or name
            conn = self._connection_for(host, other.user, other.port, other.identity_file, None)
        else:
            raise ConnectionFailed(f"unknown jump host {name!r}", node=self.node.name,
                                   hint="define it under jump_hosts in the inventory")
        # the forwarded connection to the node is opened by the jump host: the
        # node's connect timeout bounds it too (paramiko waits an hour otherwise)
        conn.connect_kwargs["channel_timeout"] = float(self.node.connect_timeout_s)
        # its own log channel: the jump host's reason for a refused forward is only logged
        conn.client.set_log_channel(f"paramiko.transport.gpuvet.{self.node.name}")
        return conn, Hop(name, "jump host", conn.host, int(conn.port))

    def _open(self, conn: Connection, hop: Hop, via: Hop | None) -> None:
        """Open one hop; every failure becomes one error naming the hop and the cause."""
        try:
            conn.open()
        except HostKeyError:
            raise
        except paramiko.BadHostKeyException as exc:
            raise hostkeys.changed_error(exc, self._policies[-1].kh, self.node.name) from None
        except (paramiko.SSHException, OSError, EOFError) as exc:
            reason = self._gateway_failures.take() if self._gateway_failures else None
            raise hops.unreachable(hops.with_reason(exc, reason), hop, node=self.node.name,
                                   via=via, timeout=float(self.node.connect_timeout_s)) from None
        key = conn.transport.get_remote_server_key() if conn.transport else None
        kh = self._policies[-1].kh
        if key is not None and key.asbytes() in kh.revoked:
            conn.close()
            raise hostkeys.revoked_error(kh, hop.host, key, self.node.name)

    def connection(self) -> Connection:
        with self._lock:
            if self._conn is not None and self._conn.is_connected:
                return self._conn
            self._policies = []
            gateway = self._gateway()
            via = None
            self._gateway_failures = None
            if gateway is not None:
                self._gateway_failures = hops.channel_failures(
                    f"paramiko.transport.gpuvet.{self.node.name}")
                self._gateway_failures.take()  # nothing left from an earlier attempt
                self._open(gateway[0], gateway[1], None)
                via = gateway[1]
            host = self.node.ssh_alias or self.node.host or self.node.name
            port = None if self.node.ssh_alias and self.node.port == 22 else self.node.port
            conn = self._connection_for(host, self.node.user, port, self.node.identity_file,
                                        gateway[0] if gateway else None)
            self._open(conn, Hop(self.node.name, "node", conn.host, int(conn.port)), via)
            if any(p.accepted for p in self._policies):
                self.host_key_status = "accepted-new"
            transport = conn.transport
            if transport is not None:
                transport.set_keepalive(KEEPALIVE_S)
                # a new channel on a dead link (the kill after a timeout, the next command)
                # must fail in bounded time, not after paramiko's default hour
                transport.channel_timeout = CHANNEL_TIMEOUT_S
            self._conn = conn
            return conn

    # --- commands -------------------------------------------------------------
    def _wrap(self, command: str, env: Mapping[str, str] | None, cwd: str | None,
              pidfile: str) -> tuple[str, str | None]:
        """The command line to send, and the text to feed its stdin (the environment).

        Environment values travel on stdin, never on the command line: any user of
        a shared node reads command lines with `ps`.
        """
        merged = command_env(self.node, command, env)
        stdin = env_script(merged) if merged else None
        load = ENV_FROM_STDIN if stdin is not None else ""
        cd = f"mkdir -p {shlex.quote(cwd)} && cd {shlex.quote(cwd)} && " if cwd else ""
        inner = f"echo $$ > {shlex.quote(pidfile)}; {load}{cd}sh -c {shlex.quote(str(command))}"
        redirect = "" if stdin is not None else " < /dev/null"
        return (f"setsid -w sh -c {shlex.quote(inner)}{redirect}; rc=$?; "
                f"rm -f {shlex.quote(pidfile)}; exit $rc"), stdin

    @contextlib.contextmanager
    def _in_use(self) -> Iterator[None]:
        """Marks the connection busy (counted before it is opened), so that
        `release_if_idle` never closes it under a command or a copy."""
        with self._lock:
            self._users += 1
        try:
            yield
        finally:
            with self._lock:
                self._users -= 1

    def release_if_idle(self) -> bool:
        """Close the connection unless a command or copy is using it; True if closed.

        The next command opens a new one (the pool calls this for nodes it has not
        handed out for a while)."""
        with self._lock:
            if self._users:
                return False
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            return True

    def run(self, command: str, *, env: Mapping[str, str] | None = None, cwd: str | None = None,
            timeout: float | None = None, stdout_path: Path | None = None) -> CommandResult:
        with self._in_use():
            return self._run(command, env=env, cwd=cwd, timeout=timeout, stdout_path=stdout_path)

    def _run(self, command: str, *, env: Mapping[str, str] | None, cwd: str | None,
             timeout: float | None, stdout_path: Path | None) -> CommandResult:
        conn = self.connection()
        pidfile = f"/tmp/.gpuvet-{uuid.uuid4().hex}.pid"
        wrapped, stdin = self._wrap(command, env, cwd, pidfile)
        start = time.monotonic()
        out_f = stdout_path.open("w", encoding="utf-8") if stdout_path else None
        with self._lock:
            self._inflight.add(pidfile)
        try:
            kw: dict[str, Any] = {"warn": True, "timeout": timeout,
                                  "in_stream": io.StringIO(stdin) if stdin is not None else False}
            if out_f:
                kw.update(hide="stderr", out_stream=out_f)
            else:
                kw.update(hide=True)
            res = conn.run(wrapped, **kw)
            elapsed = time.monotonic() - start
            if timeout is not None and res.exited == -1 and elapsed >= timeout * 0.95:
                # invoke closed the channel at the timeout but returned instead of
                # raising (a race seen under load): the remote group may still run
                self._kill(pidfile)
                return CommandResult(node=self.node.name, command=command, rc=None,
                                     stdout=res.stdout, stderr=res.stderr,
                                     duration_s=elapsed, timed_out=True)
            if res.exited == -1:
                # the channel closed without an exit status: sshd or the link died
                raise ConnectionFailed("connection lost while running a command (no exit "
                                       "status came back)", node=self.node.name,
                                       command=command,
                                       hint="check the node: sshd, the link, or a reboot")
            return CommandResult(node=self.node.name, command=command, rc=res.exited,
                                 stdout=res.stdout, stderr=res.stderr, duration_s=elapsed)
        except CommandTimedOut as exc:
            self._kill(pidfile)
            partial = exc.result
            return CommandResult(node=self.node.name, command=command, rc=None,
                                 stdout=partial.stdout if partial else "",
                                 stderr=partial.stderr if partial else "",
                                 duration_s=time.monotonic() - start, timed_out=True)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise ConnectionFailed(f"connection lost while running a command: {exc}",
                                   node=self.node.name, command=command) from None
        except ThreadException as exc:  # an I/O thread of invoke died: the channel broke
            inner = exc.exceptions[0].value if exc.exceptions else exc
            raise ConnectionFailed(f"connection lost while running a command: "
                                   f"{type(inner).__name__}: {inner}",
                                   node=self.node.name, command=command) from None
        finally:
            with self._lock:
                self._inflight.discard(pidfile)
            if out_f:
                out_f.close()

    def cancel(self) -> None:
        """Kill every command this executor has running (an interrupt of the run)."""
        with self._lock:
            pidfiles = list(self._inflight)
        for pidfile in pidfiles:
            self._kill(pidfile)

    def _kill(self, pidfile: str) -> None:
        """Kill the timed-out command's process group on the node."""
        p = shlex.quote(pidfile)
        script = (f"pg=$(cat {p} 2>/dev/null) || exit 0; kill -TERM -- -$pg 2>/dev/null; "
                  f"for i in $(seq 1 {KILL_GRACE_S * 10}); do kill -0 -- -$pg 2>/dev/null || "
                  f"break; sleep 0.1; done; kill -KILL -- -$pg 2>/dev/null; rm -f {p}; true")
        try:
            self.connection().run(script, hide=True, warn=True, in_stream=False, timeout=30)
        except Exception as exc:  # the node may be gone; the caller reports the timeout
            raise StepError(f"could not kill a timed-out command: {exc}", node=self.node.name,
                            hint=f"log in and kill the process group in {pidfile}") from None

    # --- files ----------------------------------------------------------------
    def put(self, local: Path, remote: str) -> None:
        """Copy to a uniquely named partial file, then rename: readers never see half a file.

        A relative `remote` lands under the node's work_dir (a ~/ path in the home).
        """
        with self._in_use():
            self._put(local, remote)

    def _put(self, local: Path, remote: str) -> None:
        path = remote_path(self.node, remote)
        where = f"{self.node.name}:{path}"
        if not local.is_file():
            raise UsageError(f"cannot copy {local} to {where}: no such local file",
                             node=self.node.name)
        conn = self.connection()
        parent = posixpath.dirname(path) or "."
        mk = self.run(f"mkdir -p {shell_path(parent)}", timeout=60)
        if not mk.ok:
            raise StepError(f"cannot copy {local} to {where}: cannot create {parent}: "
                            f"{_last_line(mk)}", node=self.node.name,
                            hint="choose a writable path (a relative one lands in work_dir)")
        # unique: nodes sharing a filesystem (NFS homes) must not trample each other
        part = f"{path}.part-{uuid.uuid4().hex[:8]}"
        try:
            conn.put(str(local), _sftp_path(part))
        except (OSError, paramiko.SSHException) as exc:
            self.run(f"rm -f {shell_path(part)}", timeout=60)
            why = self._space_short(parent, local.stat().st_size) or _why(exc)
            raise StepError(f"cannot copy {local} to {where}: {why}",
                            node=self.node.name,
                            hint="check free space and permissions on the node") from None
        mv = self.run(f"mv -f {shell_path(part)} {shell_path(path)}", timeout=60)
        if not mv.ok:
            raise StepError(f"cannot copy {local} to {where}: renaming the copied file "
                            f"failed: {_last_line(mv)}", node=self.node.name)

    def _space_short(self, parent: str, size: int) -> str | None:
        """SFTP reports a full disk as a short write: say what it is, with the numbers."""
        res = self.run(f"df -Pk {shell_path(parent)} | tail -n 1", timeout=60)
        fields = res.stdout.split()
        if not res.ok or len(fields) < 6 or not fields[3].isdigit():
            return None
        free = int(fields[3]) * 1024
        if free >= size:
            return None
        return (f"no space left on the node's filesystem at {fields[5]} ({free} bytes free, "
                f"{size} needed)")

    def get(self, remote: str, local: Path) -> None:
        """A relative `remote` is read from the node's work_dir (a ~/ path from the home)."""
        with self._in_use():
            self._get(remote, local)

    def _get(self, remote: str, local: Path) -> None:
        path = remote_path(self.node, remote)
        conn = self.connection()
        local.parent.mkdir(parents=True, exist_ok=True)
        part = local.with_name(local.name + ".part")
        try:
            conn.get(_sftp_path(path), str(part))
        except (OSError, paramiko.SSHException) as exc:
            part.unlink(missing_ok=True)
            raise StepError(f"cannot copy {self.node.name}:{path} to {local}: {_why(exc)}",
                            node=self.node.name) from None
        os.replace(part, local)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def _sftp_path(path: str) -> str:
    """SFTP does not expand ~, but resolves relative paths against the login's home."""
    if path == "~":
        return "."
    return path[2:] if path.startswith("~/") else path


def _why(exc: BaseException) -> str:
    """The cause of a failed copy, in words ("permission denied"), without errno noise."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror[0].lower() + exc.strerror[1:]
    return str(exc) or type(exc).__name__


def _last_line(res: CommandResult) -> str:
    lines = (res.stderr or res.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit code {res.rc}"
