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

import io
import os
import shlex
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import paramiko
from fabric import Config, Connection
from invoke.exceptions import CommandTimedOut
from paramiko.ssh_exception import NoValidConnectionsError

from orchestrator.errors import ConnectionFailed, HostKeyError, StepError
from orchestrator.executors.base import (
    ENV_FROM_STDIN,
    CommandResult,
    ExecutorOptions,
    command_env,
    env_script,
)
from orchestrator.inventory import JumpHost, Node

KEEPALIVE_S = 30
KILL_GRACE_S = 2
_known_hosts_lock = threading.Lock()


class _HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Reject unknown keys, or accept and record them when asked to."""

    def __init__(self, executor: SshExecutor, known_hosts: Path, accept_new: bool) -> None:
        self.executor = executor
        self.known_hosts = known_hosts
        self.accept_new = accept_new

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str,
                         key: paramiko.PKey) -> None:
        fp = key.fingerprint if hasattr(key, "fingerprint") else key.get_name()
        if not self.accept_new:
            raise HostKeyError(
                f"host key of {hostname} is not in {self.known_hosts} ({fp})",
                node=self.executor.node.name,
                hint=("verify the fingerprint with the provider, then add it "
                      f"(ssh-keyscan -p PORT HOST >> {self.known_hosts}) "
                      "or rerun with --accept-new-host-keys"))
        with _known_hosts_lock:
            self.known_hosts.parent.mkdir(parents=True, exist_ok=True)
            entry = paramiko.HostKeys()
            entry.add(hostname, key.get_name(), key)
            line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
            with self.known_hosts.open("a", encoding="utf-8") as f:
                f.write(line)
            os.chmod(self.known_hosts, 0o600)
        client.get_host_keys().add(hostname, key.get_name(), key)
        self.executor.host_key_status = "accepted-new"


class SshExecutor:
    def __init__(self, node: Node, options: ExecutorOptions) -> None:
        self.node = node
        self.options = options
        self.host_key_status = "known"
        self._conn: Connection | None = None
        self._lock = threading.Lock()
        self.known_hosts = Path(os.path.expanduser(options.known_hosts))

    # --- connection -----------------------------------------------------------
    def _config(self) -> Config:
        overrides: dict[str, Any] = {"load_ssh_configs": True}
        if self.options.ssh_config:
            overrides["ssh_config_path"] = os.path.expanduser(self.options.ssh_config)
        return Config(overrides=overrides)

    def _secure(self, conn: Connection) -> Connection:
        client = conn.client
        client.set_missing_host_key_policy(
            _HostKeyPolicy(self, self.known_hosts, self.options.accept_new_host_keys))
        if self.known_hosts.is_file():
            client.load_host_keys(str(self.known_hosts))
        return conn

    def _connection_for(self, host: str, user: str | None, port: int | None,
                        identity: str | None, gateway: Connection | None) -> Connection:
        kwargs: dict[str, Any] = {"banner_timeout": 30, "auth_timeout": 30}
        if identity:
            kwargs["key_filename"] = os.path.expanduser(identity)
            kwargs["look_for_keys"] = False
        conn = Connection(host, user=user, port=port, config=self._config(),
                          connect_timeout=self.node.connect_timeout_s,
                          connect_kwargs=kwargs, gateway=gateway)
        return self._secure(conn)

    def _gateway(self) -> Connection | None:
        name = self.node.proxy_jump
        if not name:
            return None
        jump = self.options.jump_hosts.get(name)
        if isinstance(jump, JumpHost):
            return self._connection_for(jump.host, jump.user, jump.port, jump.identity_file, None)
        other = self.options.nodes.get(name)
        if other is not None:
            host = other.ssh_alias or other.host or name
            return self._connection_for(host, other.user, other.port, other.identity_file, None)
        raise ConnectionFailed(f"unknown jump host {name!r}", node=self.node.name,
                               hint="define it under jump_hosts in the inventory")

    def connection(self) -> Connection:
        with self._lock:
            if self._conn is not None and self._conn.is_connected:
                return self._conn
            host = self.node.ssh_alias or self.node.host or self.node.name
            port = None if self.node.ssh_alias and self.node.port == 22 else self.node.port
            conn = self._connection_for(host, self.node.user, port, self.node.identity_file,
                                        self._gateway())
            try:
                conn.open()
            except HostKeyError:
                raise
            except paramiko.BadHostKeyException as exc:
                raise HostKeyError(
                    f"host key of {exc.hostname} CHANGED: expected "
                    f"{exc.expected_key.get_base64()[:16]}..., got "
                    f"{exc.key.get_base64()[:16]}...; connection refused",
                    node=self.node.name,
                    hint=("this can mean a reinstalled node or an attack; confirm with the "
                          f"provider, then remove the old key: ssh-keygen -R {exc.hostname} "
                          f"-f {self.known_hosts}")) from None
            except paramiko.AuthenticationException as exc:
                raise ConnectionFailed(
                    f"authentication failed for {self.node.target}: {exc}",
                    node=self.node.name,
                    hint="check user and identity_file in the inventory") from None
            except (NoValidConnectionsError, TimeoutError, OSError, paramiko.SSHException,
                    EOFError) as exc:
                raise ConnectionFailed(
                    f"cannot connect to {self.node.target}: {exc or type(exc).__name__}",
                    node=self.node.name,
                    hint="check that the node is up, sshd runs and the port is reachable") from None
            transport = conn.transport
            if transport is not None:
                transport.set_keepalive(KEEPALIVE_S)
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

    def run(self, command: str, *, env: Mapping[str, str] | None = None, cwd: str | None = None,
            timeout: float | None = None, stdout_path: Path | None = None) -> CommandResult:
        conn = self.connection()
        pidfile = f"/tmp/.gpuvet-{uuid.uuid4().hex}.pid"
        wrapped, stdin = self._wrap(command, env, cwd, pidfile)
        start = time.monotonic()
        out_f = stdout_path.open("w", encoding="utf-8") if stdout_path else None
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
        finally:
            if out_f:
                out_f.close()

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
        conn = self.connection()
        parent = os.path.dirname(remote) or "."
        self.run(f"mkdir -p {shlex.quote(parent)}", timeout=60).raise_for_status("mkdir")
        # unique: nodes sharing a filesystem (NFS homes) must not trample each other
        part = f"{remote}.part-{uuid.uuid4().hex[:8]}"
        try:
            conn.put(str(local), part)
        except (OSError, paramiko.SSHException) as exc:
            raise StepError(f"copying {local} to {remote} failed: {exc}",
                            node=self.node.name) from None
        self.run(f"mv -f {shlex.quote(part)} {shlex.quote(remote)}",
                 timeout=60).raise_for_status("rename after copy")

    def get(self, remote: str, local: Path) -> None:
        conn = self.connection()
        local.parent.mkdir(parents=True, exist_ok=True)
        part = local.with_name(local.name + ".part")
        try:
            conn.get(remote, str(part))
        except (OSError, paramiko.SSHException) as exc:
            raise StepError(f"copying {remote} from the node failed: {exc}",
                            node=self.node.name) from None
        os.replace(part, local)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
