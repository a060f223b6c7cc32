"""Nodes reached through Slurm: the executor and the allocation (the client that runs
Slurm's commands, here or on a login node, is `executors/slurm_client.py`).

`SlurmExecutor` is bound to one node of an allocation: every command is a job step,
`srun --jobid J --overlap -N1 -n1 -w NODE --job-name gpuvet-<id> /bin/sh -c CMD`. A
command past its timeout is killed with its step (`scancel J.S`, the step found by its
unique name), then its srun. Files travel over srun's stdin and stdout (no shared
filesystem needed); `put_verified`/`get_verified` check them by sha256 as for SSH. A
command that fails while the allocation has ended (time limit, preemption, scancel)
raises `AllocationEnded` with Slurm's job state: the step driver files it as the
scheduler's doing, never as the node's FAIL.

`allocations` expands an inventory's executor slurm providers into nodes: it asks for
an allocation (`salloc --no-shell`, a unique job name so an interrupted request is
found and cancelled too), or uses `job_id` / the `SLURM_JOB_ID` gpuvet runs inside,
reads its nodes with `scontrol show hostnames`, and releases on the way out (success,
failure, SIGINT, SIGTERM) only the allocations it asked for.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import re
import shlex
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from orchestrator.errors import (
    AllocationEnded,
    ConnectionFailed,
    GpuvetError,
    StepError,
    UsageError,
)
from orchestrator.executors.base import (
    CommandResult,
    ExecutorOptions,
    command_env,
    remote_path,
    sha256_file,
    shell_join,
    shell_path,
)
from orchestrator.executors.slurm_client import (
    SlurmClient,
    client_for,
)
from orchestrator.inventory import Inventory, Node
from orchestrator.parsers import slurm as parse

STEP_PREFIX = "gpuvet-"
ALLOC_PREFIX = "gpuvet-alloc-"
COMPLETING_WAIT_S = 5.0


class SlurmExecutor:
    host_key_status = "n/a"

    def __init__(self, node: Node, options: ExecutorOptions) -> None:
        if node.slurm_job is None:
            raise UsageError(f"node {node.name} has no Slurm allocation", node=node.name,
                             hint="its nodes come from the provider's allocation")
        self.node = node
        self.job = node.slurm_job
        self.client = client_for(options, node.provider)
        self._lock = threading.Lock()
        self._inflight: set[str] = set()  # the step names running now

    def _srun(self, name: str, script: str) -> list[str]:
        cpus = self.client.cpus_per_node(self.job)
        return ["srun", f"--jobid={self.job}", "--overlap", "--nodes=1", "--ntasks=1",
                f"--nodelist={self.node.name}", f"--job-name={name}", "--chdir=/", "--quiet",
                *([f"--cpus-per-task={cpus}"] if cpus else []), "/bin/sh", "-c", script]

    def run(self, command: str, *, env: Mapping[str, str] | None = None, cwd: str | None = None,
            timeout: float | None = None, stdout_path: Path | None = None) -> CommandResult:
        cd = f"mkdir -p {shlex.quote(cwd)} && cd {shlex.quote(cwd)} && " if cwd else \
            'cd "$HOME" 2>/dev/null; '
        return self._step(f"{cd}{command}", env=command_env(self.node, command, env),
                          timeout=timeout, stdout_path=stdout_path, command=str(command))

    def _step(self, script: str, *, env: Mapping[str, str] | None = None,
              timeout: float | None = None, stdout_path: Path | None = None,
              stdin_path: str | None = None, command: str | None = None,
              read_back: bool = True) -> CommandResult:
        name = f"{STEP_PREFIX}{uuid.uuid4().hex[:16]}"
        with self._lock:
            self._inflight.add(name)
        try:
            res = self.client.run(self._srun(name, script), timeout=timeout, env=env,
                                  stdin_path=stdin_path, stdout_path=stdout_path,
                                  on_timeout=lambda: self._cancel_step(name),
                                  read_back=read_back)
        finally:
            with self._lock:
                self._inflight.discard(name)
        if res.timed_out:
            self._cancel_step(name)  # the hop killed srun; the step may live on
        elif not res.ok:
            self._raise_if_ended(res)
        return CommandResult(node=self.node.name, command=command or script, rc=res.rc,
                             stdout=res.stdout, stderr=res.stderr, duration_s=res.duration_s,
                             timed_out=res.timed_out)

    def _raise_if_ended(self, res: CommandResult) -> None:
        """A failed step whose allocation is gone is the scheduler's doing: say so."""
        try:
            job = self.client.job(self.job)
            # a job being ended shows COMPLETING first: its final state (TIMEOUT,
            # PREEMPTED, CANCELLED) follows within moments
            deadline = time.monotonic() + COMPLETING_WAIT_S
            while job is not None and job.state == "COMPLETING" and \
                    time.monotonic() < deadline:
                time.sleep(0.1)
                job = self.client.job(self.job)
        except GpuvetError:
            return
        if job is None or not (job.ended or job.state == "COMPLETING"):
            if job is None:
                raise AllocationEnded(f"Slurm job {self.job} is gone (neither scontrol nor "
                                      "sacct knows it)", job=self.job, state="UNKNOWN",
                                      node=self.node.name, command=res.command)
            return
        why = f" ({job.reason})" if job.reason else ""
        hint = {"TIMEOUT": "raise slurm.time_limit in the inventory, then --resume",
                "PREEMPTED": "the allocation was preempted: --resume runs the rest in a new "
                             "one (or ask for a qos that is not preempted)"}.get(
            job.state, "--resume runs the rest in a new allocation")
        raise AllocationEnded(f"Slurm job {self.job} ended as {job.state}{why} while a step "
                              f"ran on {self.node.name}", job=self.job, state=job.state,
                              node=self.node.name, command=res.command, hint=hint)

    def _cancel_step(self, name: str) -> None:
        for row in self.client.steps(self.job):
            if row.columns and row.columns[-1] == name:
                self.client.cancel(row.id)

    def cancel(self) -> None:
        """Kill every step this executor has running (an interrupt of the run)."""
        with self._lock:
            names = set(self._inflight)
        if names:
            for row in self.client.steps(self.job):
                if row.columns and row.columns[-1] in names:
                    self.client.cancel(row.id)
        self.client.cancel_inflight()

    def put(self, local: Path, remote: str) -> None:
        """Over the step's stdin into a uniquely named partial file, then renamed."""
        path = remote_path(self.node, remote)
        if not local.is_file():
            raise UsageError(f"cannot copy {local} to {self.node.name}:{path}: no such local "
                             "file", node=self.node.name)
        part = f"{path}.part-{uuid.uuid4().hex[:8]}"
        parent = posixpath.dirname(path) or "."
        script = (f"mkdir -p {shell_path(parent)} && cat > {shell_path(part)} && "
                  f"mv -f {shell_path(part)} {shell_path(path)} || "
                  f"{{ rc=$?; rm -f {shell_path(part)}; exit $rc; }}")
        staged, unstage = self.client.stage(local)
        try:
            res = self._step(script, stdin_path=staged, timeout=600)
        finally:
            unstage()
        if not res.ok:
            raise StepError(f"cannot copy {local} to {self.node.name}:{path}: "
                            f"{_last_line(res)}", node=self.node.name,
                            hint="check free space and permissions on the node")

    def get(self, remote: str, local: Path) -> None:
        path = remote_path(self.node, remote)
        local.parent.mkdir(parents=True, exist_ok=True)
        part = local.with_name(local.name + ".part")
        script = f"cat {shell_path(path)}"
        if self.client.slurm.login is None:
            res = self._get_checked(path, part)
        else:  # through the hop: to a file on the login node, then SFTP
            there = f"~/.gpuvet-stage/{uuid.uuid4().hex}"
            res = self._step_to(script, there)
            if res.ok:
                self.client.fetch(there, part)  # and removes it there
            else:
                self.client._ssh().run(f"rm -f {shell_path(there)}", timeout=60)
        if not res.ok:
            part.unlink(missing_ok=True)
            raise StepError(f"cannot copy {self.node.name}:{path} to {local}: "
                            f"{_last_line(res)}", node=self.node.name)
        os.replace(part, local)

    def _get_checked(self, path: str, part: Path) -> CommandResult:
        """The file over the step's stdout, its sha256 taken on the node in the same step
        (on stderr): a copy that does not match is fetched once more (seen once under
        load on the 2-core test machine), and a second mismatch is an error naming both
        sizes, never a wrong file."""
        q = shell_path(path)
        script = f"{{ sha256sum {q} || shasum -a 256 {q}; }} 2>/dev/null >&2; cat {q}"
        for attempt in (1, 2):
            res = self._step(script, stdout_path=part, timeout=600, read_back=False)
            if not res.ok:
                return res
            sums = re.findall(r"\b[0-9a-f]{64}\b", res.stderr)
            got = sha256_file(part)
            if not sums or sums[-1] == got:  # no hash tool on the node: checked by the caller
                return res
            if attempt == 2:
                size = part.stat().st_size
                part.unlink(missing_ok=True)
                raise StepError(f"copying {self.node.name}:{path} over srun gave a different "
                                f"file twice ({size} bytes, sha256 {got[:12]}, "
                                f"the node's {sums[-1][:12] if sums else 'unknown'})",
                                node=self.node.name, hint="retry; if it persists, copy "
                                "through a shared filesystem or the login node")
        return res

    def _step_to(self, script: str, there: str) -> CommandResult:
        """A step whose stdout lands in a file on the login node (the hop's side)."""
        name = f"{STEP_PREFIX}{uuid.uuid4().hex[:16]}"
        argv = self._srun(name, script)
        ex = self.client._ssh()
        command = (f"mkdir -p ~/.gpuvet-stage && {shell_join(argv)} > {shell_path(there)}")
        res: CommandResult = ex.run(command, env=self.client._env(None),
                                    timeout=600)
        return res

    def close(self) -> None:
        pass


def _last_line(res: CommandResult) -> str:
    lines = (res.stderr or res.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit code {res.rc}"


# --- the allocation -------------------------------------------------------------------------

@contextlib.contextmanager
def allocations(inv: Inventory, options: ExecutorOptions,
                providers: Sequence[str] | None = None,
                warn: Callable[[str], None] | None = None) -> Iterator[Inventory]:
    """The inventory with its executor slurm providers' nodes, from their allocations.

    Only the providers chosen (all when none is) are allocated. An allocation asked for
    here is cancelled when the block ends, however it ends; one named by `job_id`, or
    the SLURM_JOB_ID gpuvet runs inside, is used and never cancelled.
    """
    chosen = [p for p in inv.providers.values() if p.executor == "slurm" and p.slurm
              and (not providers or p.name in providers) and p.name not in inv.allocated]
    if not chosen:
        yield inv
        return
    created: list[tuple[SlurmClient, str]] = []
    try:
        found: dict[str, tuple[str, Sequence[str]]] = {}
        for prov in chosen:
            assert prov.slurm is not None
            client = client_for(options, prov.name)
            job = prov.slurm.job_id
            if job is None and prov.slurm.login is None and _inside_job():
                job = os.environ["SLURM_JOB_ID"]
            try:
                if job is None:
                    job = client.allocate(f"{ALLOC_PREFIX}{uuid.uuid4().hex[:12]}")
                    created.append((client, job))
                found[prov.name] = (job, client.hostnames(job))
            except ConnectionFailed as exc:  # nothing ran yet: the setup to fix (exit 2)
                raise UsageError(f"provider {prov.name}: {exc.what}", command=exc.command,
                                 hint=exc.hint) from None
        yield inv.with_allocations(found)
    finally:
        for client, job in created:
            res = None
            with contextlib.suppress(Exception):
                res = client.cancel(job)
            if res is not None and not res.ok and _ended(client, job):
                continue  # Slurm ended it already (time limit, preemption, an operator)
            if (res is None or not res.ok) and warn is not None:
                warn(f"could not cancel Slurm job {job} that gpuvet asked for: "
                     f"{_last_line(res) if res else 'scancel did not run'}; "
                     f"cancel it with `scancel {job}`")


def _ended(client: SlurmClient, job: str) -> bool:
    try:
        state = client.job_state(job)
    except GpuvetError:
        return False
    return state is not None and (state in parse.ENDED_STATES or state == "COMPLETING")


def _inside_job() -> bool:
    return bool(re.fullmatch(r"[0-9]{1,12}", os.environ.get("SLURM_JOB_ID", "")))
