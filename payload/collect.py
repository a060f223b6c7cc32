"""``python3 -m payload collect``: gather the facts about one node.

Runs every command of ``payload.commands.COMMANDS`` in parallel (each with its
own timeout; the whole process group is killed when it runs over), adds a few
facts computed in Python (paths, NCCL and MPI installs, tool locations,
a filtered environment) and returns one JSON-serialisable document.

Standard library only, Python 3.8 compatible: this runs with the node's own
python.
"""

import contextlib
import datetime
import json
import os
import platform
import re
import socket
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Mapping, Optional, Sequence

from payload import fabric
from payload.commands import (
    COMMANDS,
    QUERY_GPU_FIELDS_OLD,
    TORCH_PROBE,
    Command,
    query_gpu_argv,
)
from payload.probes import (  # noqa: F401  (re-exported)
    TOOL_NAMES,
    _read_text,
    boot_time,
    find_mount,
    find_mpi,
    find_nccl,
    find_nvcc,
    find_tools,
    parse_mounts,
    path_info,
)
from payload.proc import OUTPUT_CAP_BYTES, empty_record, run_command, which  # noqa: F401
from payload.scrub import scrub_env

SCHEMA = 1
TOOL = "gpuvet-payload"
PAYLOAD_VERSION = "0.1.0"

DEFAULT_JOBS = 8

# Output that means nvidia-smi refused a --query-gpu field name.
_INVALID_FIELD_RE = re.compile(r"not a valid field", re.IGNORECASE)

_PLACEHOLDER_RE = re.compile(r"\{(python|nvcc|work_dir|ckpt_dir|torch_probe)\}")

# Environment variables recorded in the document (then scrubbed).
ENV_NAMES = (
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
    "CUDA_HOME",
    "CUDA_PATH",
    "MPI_HOME",
    "LD_LIBRARY_PATH",
    "PATH",
    "TORCH_CUDA_ARCH_LIST",
    "PYTORCH_CUDA_ALLOC_CONF",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
)
ENV_PREFIXES = ("CUDA_", "NCCL_", "TORCH_NCCL_", "UCX_", "OMPI_", "PMIX_")



# --------------------------------------------------------------------------
# small helpers


def _utc_now() -> str:
    now = datetime.datetime.now(datetime.timezone.utc)
    return now.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def fill_argv(argv: Sequence[str], values: Mapping[str, str]) -> List[str]:
    """Replace {python} {nvcc} {work_dir} {ckpt_dir} {torch_probe} in one pass."""
    return [_PLACEHOLDER_RE.sub(lambda m: values[m.group(1)], a) for a in argv]


def _run_query_gpu(argv: List[str], cmd: Command, cap: int) -> Dict[str, Any]:
    rec = run_command(argv, cmd.timeout_s, cap)
    if rec["missing"] or rec["timed_out"] or rec["rc"] == 0:
        return rec
    if not _INVALID_FIELD_RE.search(rec["stdout"] + "\n" + rec["stderr"]):
        return rec
    old_argv = list(query_gpu_argv(QUERY_GPU_FIELDS_OLD))
    old_argv[0] = argv[0]
    retry = run_command(old_argv, cmd.timeout_s, cap)
    retry["fallback"] = True
    retry["first_attempt"] = {
        "argv": rec["argv"],
        "rc": rec["rc"],
        "stdout": rec["stdout"],
        "stderr": rec["stderr"],
        "duration_s": rec["duration_s"],
    }
    retry["duration_s"] = round(rec["duration_s"] + retry["duration_s"], 3)
    return retry


def _run_one(cmd: Command, values: Mapping[str, str], cap: int) -> Dict[str, Any]:
    try:
        argv = fill_argv(cmd.argv, values)
        if cmd.id == "query_gpu":
            return _run_query_gpu(argv, cmd, cap)
        return run_command(argv, cmd.timeout_s, cap)
    except Exception as exc:  # a bug here must not lose the other commands
        return empty_record(cmd.argv, "%s: %s" % (type(exc).__name__, exc))




def select_env(environ: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The recorded environment variables (ENV_NAMES, ENV_PREFIXES), scrubbed."""
    if environ is None:
        environ = os.environ
    picked = {
        k: environ[k]
        for k in sorted(environ)
        if k in ENV_NAMES or k.startswith(ENV_PREFIXES)
    }
    return scrub_env(picked)


# --------------------------------------------------------------------------
# the document


def collect(
    work_dir: Optional[str] = None,
    ckpt_dir: Optional[str] = None,
    node: Optional[str] = None,
    jobs: int = DEFAULT_JOBS,
    commands: Optional[Sequence[Command]] = None,
    cap: int = OUTPUT_CAP_BYTES,
) -> Dict[str, Any]:
    """Run the commands and return the collect document (a JSON-ready dict)."""
    cwd = os.getcwd()
    work_dir = os.path.abspath(os.path.expanduser(work_dir or cwd))
    ckpt_dir = os.path.abspath(os.path.expanduser(ckpt_dir or cwd))
    if commands is None:
        commands = COMMANDS
    started_at = _utc_now()
    t0 = time.monotonic()
    values = {
        "python": sys.executable or "python3",
        "nvcc": find_nvcc() or "nvcc",
        "work_dir": work_dir,
        "ckpt_dir": ckpt_dir,
        "torch_probe": TORCH_PROBE,
    }
    results: Dict[str, Dict[str, Any]] = {}
    with ThreadPoolExecutor(max_workers=max(1, int(jobs))) as pool:
        futures = [(c.id, pool.submit(_run_one, c, values, cap)) for c in commands]
        # computed while the commands run
        mounts = parse_mounts(_read_text("/proc/mounts") or "")
        paths = {
            "work_dir": path_info(work_dir, mounts),
            "ckpt_dir": path_info(ckpt_dir, mounts),
        }
        extras: Dict[str, Any] = {}
        for key, fn in (("nccl", find_nccl), ("mpi", find_mpi), ("tools", find_tools),
                        ("fabric", fabric.snapshot)):
            try:
                extras[key] = fn()
            except Exception as exc:  # recorded, never fatal
                extras[key] = {"error": "%s: %s" % (type(exc).__name__, exc)}
        for cid, fut in futures:
            results[cid] = fut.result()
    return {
        "schema": SCHEMA,
        "tool": TOOL,
        "payload_version": PAYLOAD_VERSION,
        "node": node,
        "hostname": socket.gethostname(),
        "boot_time": boot_time(),
        "started_at": started_at,
        "finished_at": _utc_now(),
        "duration_s": round(time.monotonic() - t0, 3),
        "python": {
            "executable": sys.executable,
            "version": platform.python_version(),
        },
        "work_dir": work_dir,
        "ckpt_dir": ckpt_dir,
        "commands": results,
        "env": select_env(),
        "paths": paths,
        "nccl": extras["nccl"],
        "mpi": extras["mpi"],
        "tools": extras["tools"],
        "fabric": extras["fabric"],
    }


def write_json_atomic(doc: Mapping[str, Any], out: str) -> None:
    """Write ``doc`` to ``out`` through a temp file in the same dir and os.replace."""
    data = (json.dumps(doc, indent=1, sort_keys=False) + "\n").encode("utf-8")
    directory = os.path.dirname(os.path.abspath(out))
    prefix = "." + os.path.basename(out) + "."
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def add_arguments(parser: Any) -> None:
    """The ``collect`` subcommand's options (argparse)."""
    parser.add_argument("--work-dir", default=None, help="working directory (default: cwd)")
    parser.add_argument(
        "--ckpt-dir", default=None, help="checkpoint directory, not created (default: cwd)"
    )
    parser.add_argument("--node", default=None, help="node name as the controller knows it")
    parser.add_argument("--out", default=None, help="write the JSON here (default: stdout)")
    parser.add_argument(
        "--jobs", type=int, default=DEFAULT_JOBS, help="commands run at once (default: 8)"
    )


def main(args: Any) -> int:
    """Entry point for ``python3 -m payload collect`` (parsed argparse namespace)."""
    doc = collect(args.work_dir, args.ckpt_dir, args.node, args.jobs)
    if args.out:
        write_json_atomic(doc, args.out)
    else:
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
        sys.stdout.flush()
    return 0
