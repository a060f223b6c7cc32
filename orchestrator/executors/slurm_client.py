"""The Slurm client: Slurm's commands (srun, salloc, scontrol, squeue, scancel, sacct) run
from an argv list, either here (gpuvet on a login node; `SLURM_CONF` from the environment
or the inventory's `slurm_conf`) or on a login node through the SSH executor (host, user,
proxy_jump as SSH nodes have), the argv quoted with `shell_join`. Environment values never
go on a command line: srun gets them in its own environment (`--export=ALL`, Slurm's
default), which the SSH executor sends over its channel. The executor bound to one node
of an allocation, and the allocations themselves, are in `executors/slurm.py`.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from orchestrator.errors import (
    ConnectionFailed,
    GpuvetError,
    ParseError,
    UsageError,
)
from orchestrator.executors.base import (
    CommandResult,
    Executor,
    ExecutorOptions,
    check_env_names,
    make_executor,
    shell_join,
    shell_path,
)
from orchestrator.executors.local import kill_group, wait_bounded
from orchestrator.inventory import Node, SlurmOptions
from orchestrator.parsers import slurm as parse

CLIENT_TIMEOUT_S = 60.0
_GRANTED = re.compile(r"(?:Granted job allocation|Pending job allocation) (\d+)")
_lock = threading.Lock()


def _login_node(provider: str, slurm: SlurmOptions) -> Node:
    """The login node as a Node the SSH executor can reach."""
    login = slurm.login
    assert login is not None
    return Node(name=f"{provider}-login", provider=provider, executor="ssh", host=login.host,
                port=login.port, user=login.user, identity_file=login.identity_file,
                ssh_alias=None, proxy_jump=login.proxy_jump, python="python3",
                work_dir="/tmp/gpuvet", ckpt_dir=None, env={},
                connect_timeout_s=login.connect_timeout_s)



def _said(res: CommandResult) -> str:
    """The last lines a failed client command printed, or its exit code."""
    tail = (res.stderr or res.stdout).strip().splitlines()[-3:]
    return " | ".join(tail) or f"exit code {res.rc}"

class SlurmClient:
    """Slurm's client commands for one provider, here or on its login node."""

    def __init__(self, provider: str, slurm: SlurmOptions,
                 options: ExecutorOptions | None = None) -> None:
        self.provider = provider
        self.slurm = slurm
        self.options = options or ExecutorOptions()
        self._hop: Executor | None = None  # the SSH executor to the login node, once opened
        self._lock = threading.Lock()
        self._inflight: set[subprocess.Popen[bytes]] = set()
        self._cpus: dict[str, int | None] = {}  # job id -> CPUs it holds on each node

    # --- running a command ----------------------------------------------------------------
    @property
    def where(self) -> str:
        login = self.slurm.login
        return f"login node {login.host}" if login is not None else "this machine"

    def _env(self, env: Mapping[str, str] | None) -> dict[str, str]:
        out = dict(env or {})
        if self.slurm.slurm_conf:
            out["SLURM_CONF"] = self.slurm.slurm_conf
        check_env_names(out)
        return out

    def _ssh(self) -> Executor:
        """The SSH executor to the login node (through the registry: paramiko is loaded
        only where a login hop is used)."""
        with self._lock:
            if self._hop is None:
                self._hop = make_executor(_login_node(self.provider, self.slurm), self.options)
            return self._hop

    def run(self, argv: Sequence[str], *, timeout: float | None = CLIENT_TIMEOUT_S,
            env: Mapping[str, str] | None = None, stdin_path: str | None = None,
            stdout_path: Path | None = None, on_timeout: Callable[[], None] | None = None,
            read_back: bool = True) -> CommandResult:
        """Run one client command; `stdin_path` is a file where the command runs (here, or
        on the login node), `stdout_path` a local file for its output (bytes as sent;
        read back into the result's stdout unless `read_back` is off: a copied file).
        On timeout `on_timeout` runs first (the step's scancel), then the command is
        killed with its process group."""
        argv = [str(a) for a in argv]
        if not argv or argv[0].startswith("-"):
            raise UsageError(f"not a Slurm command: {shell_join(argv)!r}")
        if self.slurm.login is not None:
            return self._run_hop(argv, timeout, env, stdin_path, stdout_path, on_timeout)
        return self._run_local(argv, timeout, env, stdin_path, stdout_path, on_timeout,
                               read_back)

    def _run_local(self, argv: list[str], timeout: float | None,
                   env: Mapping[str, str] | None, stdin_path: str | None,
                   stdout_path: Path | None, on_timeout: Callable[[], None] | None,
                   read_back: bool) -> CommandResult:
        command = shell_join(argv)
        start = time.monotonic()
        with contextlib.ExitStack() as stack:
            stdin = (stack.enter_context(open(stdin_path, "rb")) if stdin_path  # noqa: SIM115
                     else subprocess.DEVNULL)
            out_f = stack.enter_context(stdout_path.open("wb")) if stdout_path else None
            try:
                proc = subprocess.Popen(argv, env={**os.environ, **self._env(env)},
                                        stdin=stdin, stdout=out_f or subprocess.PIPE,
                                        stderr=subprocess.PIPE, start_new_session=True)
            except OSError as exc:  # not installed here: the inventory's setting to fix
                raise UsageError(f"cannot run {argv[0]} on {self.where}: "
                                       f"{exc.strerror or exc}", command=command,
                                       hint="install Slurm's client commands here (or set "
                                            "slurm.login to run them on a login node)"
                                       ) from None
            with self._lock:
                self._inflight.add(proc)
            try:  # an interrupt takes the command with it (salloc waiting)
                out, err, timed_out = wait_bounded(proc, timeout, on_timeout)
            finally:
                with self._lock:
                    self._inflight.discard(proc)
        return CommandResult(node=self.where, command=command,
                             rc=None if timed_out else proc.returncode,
                             stdout=(stdout_path.read_bytes() if stdout_path and read_back
                                     else out or b"").decode("utf-8", "replace"),
                             stderr=(err or b"").decode("utf-8", "replace"),
                             duration_s=time.monotonic() - start, timed_out=timed_out)

    def _run_hop(self, argv: list[str], timeout: float | None,
                 env: Mapping[str, str] | None, stdin_path: str | None,
                 stdout_path: Path | None,
                 on_timeout: Callable[[], None] | None) -> CommandResult:
        ex = self._ssh()
        command = shell_join(argv) + (f" < {shell_path(stdin_path)}" if stdin_path else "")
        res: CommandResult = ex.run(command, env=self._env(env),
                                    timeout=timeout, stdout_path=stdout_path)
        if res.timed_out and on_timeout is not None:
            with contextlib.suppress(Exception):
                on_timeout()
        return res

    def stage(self, local: Path) -> tuple[str, Callable[[], None]]:
        """Where `local` can be read by the client commands, and how to remove that copy:
        the file itself here, a copy in the login node's home through the hop."""
        if self.slurm.login is None:
            return str(local), lambda: None
        ex = self._ssh()
        remote = f"~/.gpuvet-stage/{uuid.uuid4().hex}"
        ex.put(local, remote)

        def unstage() -> None:
            ex.run(f"rm -f {shell_path(remote)}", timeout=60)

        return remote, unstage

    def fetch(self, remote: str, local: Path) -> None:
        """Copy a file the client commands wrote on the login node here (through the hop)."""
        ex = self._ssh()
        try:
            ex.get(remote, local)
        finally:
            ex.run(f"rm -f {shell_path(remote)}", timeout=60)

    def cancel_inflight(self) -> None:
        """Kill the client commands running here (an interrupt); the hop kills its own."""
        with self._lock:
            procs = list(self._inflight)
            hop = self._hop
        for proc in procs:
            kill_group(proc)
        if hop is not None:
            cancel = getattr(hop, "cancel", None)
            if cancel is not None:
                with contextlib.suppress(Exception):
                    cancel()

    def close(self) -> None:
        with self._lock:
            hop, self._hop = self._hop, None
        if hop is not None:
            hop.close()

    # --- typed helpers ----------------------------------------------------------------------
    def _checked(self, argv: Sequence[str], what: str,
                 timeout: float | None = CLIENT_TIMEOUT_S) -> CommandResult:
        res = self.run(argv, timeout=timeout)
        if not res.ok:
            raise ConnectionFailed(f"{what} failed on {self.where}: {_said(res)}",
                                   command=res.command,
                                   hint="check that Slurm answers there (sinfo) and the "
                                        "inventory's slurm: block")
        return res

    def job(self, job_id: str) -> parse.SlurmJob | None:
        """The job as slurmctld holds it, else its accounting record (sacct); None when
        neither knows it."""
        res = self.run(["scontrol", "show", "job", "--oneliner", job_id])
        if res.ok:
            try:
                jobs = parse.parse_job(res.stdout).jobs
            except ParseError as exc:
                raise ConnectionFailed(f"scontrol show job {job_id}: {exc}",
                                       command=res.command) from None
            return next((j for j in jobs if j.job_id == job_id), jobs[0])
        acct = self.run(["sacct", "-X", "--noheader", "--parsable2",
                         "--format=JobID,State,ExitCode,Reason", "-j", job_id])
        if not acct.ok:
            return None
        try:
            rows = [r for r in parse.parse_sacct(acct.stdout).rows if r.job_id == job_id]
        except ParseError:
            return None
        if not rows:
            return None
        r = rows[0]
        reason = r.columns[0] if r.columns and r.columns[0] not in ("", "None") else None
        return parse.SlurmJob(job_id=job_id, state=r.state, reason=reason,
                              exit_code=r.exit_code, fields={"JobState": r.state_text})

    def cpus_per_node(self, job_id: str) -> int | None:
        """The CPUs the job holds on each of its nodes (NumCPUs / NumNodes when even), so
        a step can ask for all of them: a step's task gets one CPU otherwise, and where
        Slurm confines tasks to their cores (task/affinity, task/cgroup) a health or
        training step would run on one core. None when unknown or uneven."""
        with self._lock:
            if job_id in self._cpus:
                return self._cpus[job_id]
        per: int | None = None
        try:
            job = self.job(job_id)
        except GpuvetError:
            job = None
        if job is not None:
            cpus, nodes = job.fields.get("NumCPUs", ""), job.num_nodes
            if cpus.isdigit() and nodes and int(cpus) % nodes == 0:
                per = int(cpus) // nodes or None
        with self._lock:
            self._cpus[job_id] = per
        return per

    def job_state(self, job_id: str) -> str | None:
        """Slurm's state of the job (RUNNING, PENDING, TIMEOUT, PREEMPTED, ...), None if
        unknown to both slurmctld and accounting."""
        job = self.job(job_id)
        return job.state if job is not None else None

    def hostnames(self, job_id: str) -> list[str]:
        """The nodes of a running allocation, in Slurm's order."""
        job = self.job(job_id)
        if job is None:
            raise UsageError(f"Slurm job {job_id} is not known on {self.where}",
                             hint="check slurm.job_id (squeue lists the jobs)")
        if job.state != "RUNNING" or not job.node_list:
            raise UsageError(f"Slurm job {job_id} is {job.state}"
                             + (f" ({job.reason})" if job.reason else "")
                             + ", not a running allocation",
                             hint="name a running job's id, or drop job_id to let gpuvet "
                                  "ask for an allocation")
        res = self._checked(["scontrol", "show", "hostnames", job.node_list],
                            f"scontrol show hostnames {job.node_list}")
        try:
            return parse.parse_hostnames(res.stdout).names
        except ParseError as exc:
            raise ConnectionFailed(f"scontrol show hostnames: {exc}",
                                   command=res.command) from None

    def update_node(self, name: str, state: str, reason: str | None = None) -> CommandResult:
        """`scontrol update NodeName=N State=S [Reason=R]` (a drain needs a reason)."""
        argv = ["scontrol", "update", f"NodeName={name}", f"State={state}"]
        if reason is not None:
            argv.append(f"Reason={reason}")
        return self._checked(argv, f"scontrol update of node {name}")

    def steps(self, job_id: str) -> list[parse.QueueRow]:
        """The job's steps running now: id, then name and nodes."""
        res = self.run(["squeue", "--steps", "--noheader", "--jobs", job_id,
                        "--format=%i|%N|%j"])
        if not res.ok:
            return []
        try:
            return parse.parse_squeue(res.stdout).rows
        except ParseError:
            return []

    def cancel(self, job_id: str) -> CommandResult:
        """scancel a job or a step (J.S)."""
        return self.run(["scancel", job_id])

    def allocate(self, name: str, *, timeout: float | None = None) -> str:
        """Ask for an allocation as the inventory says (salloc --no-shell); its job id.

        Waits while the job is pending. Whatever ends the wait (an interrupt, a
        failure), a job of this unique name that was granted or is still pending is
        cancelled before the error goes on.
        """
        argv = ["salloc", "--no-shell", f"--job-name={name}", *allocation_args(self.slurm)]
        try:
            res = self.run(argv, timeout=timeout)
        except BaseException:
            self.cancel_named(name)
            raise
        m = _GRANTED.search(res.stderr)
        if not res.ok or m is None or "Granted" not in res.stderr:
            self.cancel_named(name)
            raise UsageError(f"salloc granted no allocation on {self.where}: {_said(res)}",
                             command=res.command,
                             hint="check the slurm: block (partition, account, qos, "
                                  "reservation, constraint, nodes) against sinfo and sacctmgr")
        return m.group(1)

    def cancel_named(self, name: str) -> None:
        """Cancel this user's jobs of the name gpuvet gave an allocation request."""
        with contextlib.suppress(Exception):
            self.run(["scancel", f"--name={name}"], timeout=CLIENT_TIMEOUT_S)


def allocation_args(slurm: SlurmOptions) -> list[str]:
    """salloc's options for what the inventory asks for, each one argv word."""
    args = []
    for key, opt in (("partition", "--partition"), ("account", "--account"), ("qos", "--qos"),
                     ("reservation", "--reservation"), ("constraint", "--constraint"),
                     ("nodes", "--nodes"), ("gpus_per_node", "--gpus-per-node"),
                     ("time_limit", "--time")):
        value = getattr(slurm, key)
        if value is not None:
            args.append(f"{opt}={value}")
    return args


def client_for(options: ExecutorOptions, provider: str) -> SlurmClient:
    """The provider's client, shared by its nodes' executors (one SSH hop, not one a node)."""
    with _lock:
        client: SlurmClient | None = options.slurm_clients.get(provider)
        if client is None:
            slurm = options.slurm.get(provider)
            if slurm is None:
                raise UsageError(f"provider {provider} has no slurm: block",
                                 hint="give it one, with executor: slurm")
            client = SlurmClient(provider, slurm, options)
            options.slurm_clients[provider] = client
        return client

