"""nccl-tests planning: source, build on a node, and the exact command lines.

Every parameter is passed explicitly, so a version's defaults never leak into
a comparison. Multi-node runs use mpirun with one application context per
node (MPMD), so each node runs its own binary path and its own environment
(a simulated node's CUDA_VISIBLE_DEVICES and NCCL_HOSTID included).
"""

from __future__ import annotations

import json
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from orchestrator import payload as payload_mod
from orchestrator.errors import StepError, UsageError, shown
from orchestrator.executors.base import EnvCommand, Executor, check_env_names, put_verified
from orchestrator.files import MAX_INPUT_BYTES, user_file_problem
from orchestrator.inventory import Node
from orchestrator.store import atomic_write
from orchestrator.suite import NcclParams
from payload.scrub import scrub_env_list

# Environment every nccl-tests and torch run gets, on every provider alike.
# NVLink SHARP (NVLS) stays off: it is not available on most rented nodes and
# would make runs of the same suite incomparable across providers.
RUN_ENV = {"NCCL_DEBUG": "INFO", "NCCL_NVLS_ENABLE": "0"}
# The network mode: no NVLink peer access and no shared memory, so every rank's bytes go
# through the NICs (NET/IB, NET/Socket, a plugin) even between GPUs of one node; INFO from
# INIT and NET is enough for the transport NCCL chose per channel and GPUDirect RDMA.
NETWORK_ENV = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1",
               "NCCL_DEBUG_SUBSYS": "INIT,NET"}


def cache_dir(node: Node) -> str:
    return f"{node.work_dir.rstrip('/')}/cache"


def source_archive(params: NcclParams, staging: Path) -> Path | None:
    """The source archive to push, made with `git archive` from a local checkout."""
    local = params.source.local_path
    if not local:
        return None
    path = Path(local).expanduser()
    commit = params.source.commit
    if path.is_file():
        # an archive of nccl-tests is about 1 MB; it is hashed and pushed whole
        why = user_file_problem(path, MAX_INPUT_BYTES)
        if why is not None:
            raise UsageError(f"nccl-tests source {shown(str(path))} {why}",
                             hint="point nccl.source.local_path at a clone of NVIDIA/nccl-tests "
                                  "or at `git archive` output")
        return path
    if not (path / ".git").exists() and not (path / "HEAD").is_file():
        raise UsageError(f"nccl-tests source {path} is neither an archive nor a git checkout",
                         hint="point nccl.source.local_path at a clone of NVIDIA/nccl-tests "
                              "or at `git archive` output")
    out = staging / f"nccl-tests-{commit[:12]}.tar.gz"
    if not out.is_file():
        staging.mkdir(parents=True, exist_ok=True)
        res = subprocess.run(["git", "-C", str(path), "archive", "--format=tar.gz",
                              f"--prefix=nccl-tests-{commit[:12]}/", "-o", str(out), commit],
                             capture_output=True, text=True)
        if res.returncode != 0:
            out.unlink(missing_ok=True)  # git creates -o's file before it fails
            raise UsageError(f"git archive of {commit} in {path} failed: {res.stderr.strip()}",
                             hint="fetch that commit into the checkout (git fetch origin)")
    return out


def build_args(node: Node, params: NcclParams, remote_archive: str | None) -> list[str]:
    args = ["nccl-build", "--cache", cache_dir(node), "--commit", params.source.commit,
            "--timeout", str(params.build_timeout_s)]
    if remote_archive:
        args += ["--archive", remote_archive]
    else:
        args += ["--url", params.source.url]
    return args


class NcclInstall(BaseModel):
    model_config = ConfigDict(extra="allow")
    home: str | None = None
    version: str | None = None
    source: str | None = None
    header: str | None = None


class BuildDoc(BaseModel):
    """What `payload nccl-build` printed: validated where it enters the controller."""

    model_config = ConfigDict(extra="allow")
    ok: bool = False
    cached: bool = False
    diagnosis: str | None = None
    requested_commit: str | None = None
    built_commit: str | None = None
    nvcc: str | None = None
    cuda_home: str | None = None
    cuda_version: str | None = None
    nccl: NcclInstall = NcclInstall()
    mpi: bool = False
    mpi_home: str | None = None
    gencode: str | None = None
    cache_key: str | None = None
    binary: str | None = None
    log: str | None = None
    log_local: str | None = None
    gpus: int | None = None
    build_s: float | None = None
    flags: list[str] = []


def build(ex: Executor, params: NcclParams, archive: Path | None, staging: Path,
          out_dir: Path) -> BuildDoc:
    """Build (or reuse) nccl-tests on one node; returns the build document."""
    remote_archive = None
    if archive is not None:
        remote_archive = f"{cache_dir(ex.node)}/{archive.name}"
        put_verified(ex, archive, remote_archive)
    res = payload_mod.run(ex, build_args(ex.node, params, remote_archive), staging=staging,
                          timeout=params.build_timeout_s + 120,
                          stdout_path=out_dir / "build.json")
    if res.timed_out:
        raise StepError(f"nccl-tests build timed out after {params.build_timeout_s:.0f} s",
                        node=ex.node.name)
    try:
        doc = BuildDoc.model_validate_json(res.stdout)
    except ValidationError as exc:
        raise StepError(f"nccl-tests build printed no valid result (rc={res.rc}): "
                        f"{exc.errors()[0]['msg']}; {res.stderr.strip()[-400:]}",
                        node=ex.node.name) from None
    if doc.log:
        try:
            ex.get(doc.log, out_dir / "build.log")
            doc.log_local = str(out_dir / "build.log")
        except Exception:  # the log is evidence, not a result: the build verdict stands
            pass
    return doc


def collective_binary(all_reduce_binary: str, collective: str) -> str:
    """The binary of `collective` beside the build's all_reduce_perf: one make builds every
    `<collective>_perf` into the same folder."""
    folder, _, name = all_reduce_binary.rpartition("/")
    # the build's own suffix kept (`all_reduce_perf`, `all_reduce_perf_mpi` in later versions)
    tail = name[len("all_reduce"):] if name.startswith("all_reduce") else "_perf"
    return f"{folder}/{collective}{tail}" if folder else f"{collective}{tail}"


def log_label(scope: str, collective: str, mode: str = "normal") -> str:
    """A series' log name: all_reduce in the normal mode keeps the names runs have on disk
    (`single`); the network mode's are `single_network`, `multi_network_alltoall`."""
    base = scope if mode == "normal" else f"{scope}_{mode}"
    return base if collective == "all_reduce" else f"{base}_{collective}"


@dataclass(frozen=True)
class RunPlan:
    argv: list[str]
    json_path: str | None


def perf_argv(binary: str, params: NcclParams, gpus: int, flags: set[str],
              json_path: str | None) -> RunPlan:
    argv = [binary, "-b", params.min_bytes, "-e", params.max_bytes, "-f", str(params.step_factor),
            "-g", str(gpus), "-c", str(params.check), "-n", str(params.iters),
            "-w", str(params.warmup_iters), "-d", params.datatype, "-o", params.op]
    if "-T" in flags:
        argv += ["-T", str(int(params.timeout_s))]
    use_json = json_path if "-J" in flags else None
    if use_json:
        argv += ["-J", use_json]
    return RunPlan(argv, use_json)


def run_env(params: NcclParams, *, mode: str = "normal", multi: bool = False
            ) -> dict[str, str]:
    """The environment of one run: RUN_ENV, Ring with `ring_only`; the network mode adds
    NETWORK_ENV, and Ring across nodes (a two-node tree's busbw can exceed what the NICs
    carry, so only a ring's reads as the network's)."""
    env = dict(RUN_ENV)
    if params.ring_only:
        env["NCCL_ALGO"] = "Ring"
    if mode == "network":
        env.update(NETWORK_ENV)
        if multi:
            env["NCCL_ALGO"] = "Ring"
    return env


# Prefix of the per-context copies of a name whose value differs between contexts.
CTX_ALIAS = "GPUVET_CTX{index}_{name}"


def _context_wrapper(index: int, names: list[str], aliases: list[str]) -> list[str]:
    """argv prefix that sets NAME from its per-context copy, then execs the real argv.

    `-x NAME` forwards one value for all contexts; names whose values differ between
    nodes travel under per-context names instead. `${X?...}` stops the rank loudly
    when mpirun was started without the command's `env`. Every copy is unset: ranks
    on mpirun's own host inherit all of them.
    """
    lines = []
    for name in names:
        alias = CTX_ALIAS.format(index=index, name=name)
        lines.append(f': "${{{alias}?not set: start mpirun through a gpuvet executor}}"; '
                     f'{name}="${alias}"; export {name}')
    lines.append("unset " + " ".join(aliases))
    return ["sh", "-c", "; ".join(lines) + '; exec "$@"', f"gpuvet-ctx{index}"]


def mpirun_command(contexts: list[tuple[Node, list[str], int]], env: dict[str, str],
                   *, local: bool) -> EnvCommand:
    """One mpirun with an application context per node: (node, argv, ranks).

    No value is on the command line (any user of a node reads those with `ps`):
    the values travel as the command's `env`, which the executor puts into the
    mpirun process's environment, and each context forwards names only
    (`-x NAME`: Open MPI sends mpirun's current value). Run it on the first
    context's node.
    """
    # The head node reaches the others with its own ssh, non-interactively, on the
    # port the inventory names (one port for all: mpirun's agent takes one).
    agent = "ssh -o BatchMode=yes -o ConnectTimeout=15"
    ports = {node.port for node, _, _ in contexts}
    if not local and len(ports) > 1:
        raise UsageError(f"nodes of one multi-node run listen on different SSH ports "
                         f"({', '.join(map(str, sorted(ports)))})",
                         hint="mpirun's ssh agent takes one port: use one port per provider")
    if not local and ports != {22}:
        agent += f" -p {ports.pop()}"
    # Open MPI refuses root unless told; nodes rented as root are common.
    parts = ["env", "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
             "mpirun", "--bind-to", "none", "--mca", "plm_rsh_agent", agent]
    if local:
        parts.append("--oversubscribe")
    cmd = " ".join(shlex.quote(p) for p in parts)
    wanted: list[dict[str, str]] = []
    for node, _argv, ranks in contexts:
        extra: dict[str, str] = {}
        if local and "CUDA_VISIBLE_DEVICES" in node.env:
            # Simulated nodes share one hostname, so nccl-tests counts their ranks as
            # local ranks of one host and picks GPU <local rank>, beyond what this
            # node's CUDA_VISIBLE_DEVICES shows. NCCL_TESTS_DEVICE pins the first one.
            if ranks != 1:
                raise UsageError(f"simulated node {node.name} has {ranks} GPUs: multi-node "
                                 "nccl-tests on simulated nodes needs one GPU per node",
                                 node=node.name, hint="give each simulated node one GPU with "
                                 "CUDA_VISIBLE_DEVICES")
            extra["NCCL_TESTS_DEVICE"] = "0"
        want = {**env, **node.env, **extra}
        check_env_names(want)
        wanted.append(want)
    values: dict[str, set[str]] = {}
    for want in wanted:
        for k, v in want.items():
            values.setdefault(k, set()).add(v)
    differing = {k for k, vs in values.items() if len(vs) > 1}
    mpirun_env = {k: next(iter(vs)) for k, vs in values.items() if k not in differing}
    aliases = sorted(CTX_ALIAS.format(index=i, name=k)
                     for i, want in enumerate(wanted) for k in want if k in differing)
    ctxs = []
    for i, ((node, argv, ranks), want) in enumerate(zip(contexts, wanted, strict=True)):
        host = "localhost" if local else (node.host or node.name)
        # -x given before the first context reaches that context only (Open MPI MPMD):
        # every context names every variable it needs itself.
        ctx = ["-np", str(ranks), "-H", f"{host}:{ranks}", "-x", "LD_LIBRARY_PATH", "-x", "PATH"]
        own = sorted(k for k in want if k in differing)
        for k in sorted(want):
            name = CTX_ALIAS.format(index=i, name=k) if k in differing else k
            if k in differing:
                mpirun_env[name] = want[k]
            ctx += ["-x", name]
        prefix = _context_wrapper(i, own, aliases) if aliases else []
        ctxs.append(" ".join(shlex.quote(p) for p in [*ctx, *prefix, *argv]))
    return EnvCommand(cmd + " " + " : ".join(ctxs), mpirun_env)


def srun_mpi_command(contexts: list[tuple[Node, list[str], int]], env: dict[str, str],
                     *, mpi: str = "pmix") -> EnvCommand | None:
    """One `srun --mpi=pmix` step across the nodes of their Slurm allocation: Slurm
    starts every rank and wires them (PMIx), no ssh between the nodes. Run it on the first
    node (a step of the same job). None when the nodes need different programs or rank
    counts (a one-program step cannot say so): mpirun's MPMD does that.

    The values travel as the command's `env` (srun's own environment, `--export=ALL`),
    never on its command line.
    """
    nodes = [node for node, _, _ in contexts]
    job = nodes[0].slurm_job
    if job is None or any(n.slurm_job != job for n in nodes):
        return None
    if len({tuple(argv) for _, argv, _ in contexts}) != 1 or \
            len({ranks for _, _, ranks in contexts}) != 1:
        return None
    want = {**env}
    for node in nodes:
        want.update(node.env)
    check_env_names(want)
    argv, ranks = contexts[0][1], contexts[0][2]
    parts = ["srun", f"--jobid={job}", "--overlap", f"--mpi={mpi}", f"--nodes={len(nodes)}",
             f"--ntasks={len(nodes) * ranks}", f"--ntasks-per-node={ranks}",
             f"--nodelist={','.join(n.name for n in nodes)}",
             "--kill-on-bad-exit=1", "--quiet", *argv]
    # the step this runs in exports its own shape (SLURM_NNODES=1, SLURM_JOB_NODELIST of
    # its one node, SLURM_NTASKS=1), which srun would read as this job's: drop it first
    return EnvCommand(STEP_ENV_RESET + " ".join(shlex.quote(p) for p in parts), want)


# the SLURM_* variables of the step a command runs in, but SLURM_CONF
STEP_ENV_RESET = ("for v in $(env | sed -n 's/^\\(SLURM_[A-Za-z0-9_]*\\)=.*/\\1/p'); do "
                  '[ "$v" = SLURM_CONF ] || unset "$v"; done; ')


# nccl-tests' -J output carries the node's whole environment, secrets included.
# Kept: what explains a run; everything kept is scrubbed again by value.
KEPT_ENV_PREFIXES = ("NCCL_", "CUDA_", "NVIDIA_", "UCX_", "OMPI_", "PMIX_", "TORCH_", "GLOO_")
KEPT_ENV_NAMES = {"LD_LIBRARY_PATH", "PATH"}


def scrub_json_env(path: Path) -> None:
    """Rewrite a fetched -J file with its `env` cut down and scrubbed."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return  # not JSON: the parser reports it; nothing to scrub
    env = doc.get("env")
    if isinstance(env, list):
        kept = [e for e in env if isinstance(e, str) and (
            e.partition("=")[0] in KEPT_ENV_NAMES or e.startswith(KEPT_ENV_PREFIXES))]
        doc["env"] = scrub_env_list(kept)
        doc["env_dropped"] = len(env) - len(kept)
    atomic_write(path, json.dumps(doc, indent=1) + "\n")


# the collectives the torch engine has (payload/allreduce.py TORCH_OPS), by nccl-tests' name
TORCH_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "alltoall")


def torch_bench_args(params: NcclParams, collective: str = "all_reduce") -> list[str]:
    # a collective that hangs (a link down mid-run) fails after the suite's timeout_s, as
    # nccl-tests' own -T does: the run ends then, not at the command's outer bound
    args = ["allreduce-bench", "-b", params.min_bytes, "-e", params.max_bytes,
            "-f", str(params.step_factor), "-n", str(params.iters),
            "-w", str(params.warmup_iters), "-c", str(params.check),
            "--pg-timeout", f"{params.timeout_s:g}"]
    if collective != "all_reduce":
        args += ["--op", collective]  # an older payload knows no --op: all_reduce says none
    return args


def rank_launch(nnodes: int, node_rank: int, nproc: int, master: str, port: int, *,
                one_each: bool) -> tuple[list[str], dict[str, str]]:
    """How one node's ranks of a torch.distributed run start: (launcher, env). Where every
    node runs one rank (`one_each`), the rank itself is started with the rendezvous in its
    environment (env://), without torchrun's agent, which would import torch a second
    time on every node of every launch; otherwise torchrun."""
    if one_each and nproc == 1:
        return [], {"RANK": str(node_rank), "WORLD_SIZE": str(nnodes), "LOCAL_RANK": "0",
                    "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": master, "MASTER_PORT": str(port)}
    return torchrun_launcher(nnodes, node_rank, nproc, master, port), {}


def torchrun_launcher(nnodes: int, node_rank: int, nproc: int, master: str,
                      port: int) -> list[str]:
    return ["-m", "torch.distributed.run", "--nnodes", str(nnodes), "--node-rank",
            str(node_rank), "--nproc-per-node", str(nproc), "--master-addr", master,
            "--master-port", str(port)]
