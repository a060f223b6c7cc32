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
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from payload.commands import (
    COMMANDS,
    QUERY_GPU_FIELDS_OLD,
    TORCH_PROBE,
    Command,
    query_gpu_argv,
)
from payload.scrub import scrub_env, scrub_text

SCHEMA = 1
TOOL = "gpuvet-payload"
PAYLOAD_VERSION = "0.1.0"

# Per stream; the rest is read and thrown away so the child never blocks.
OUTPUT_CAP_BYTES = 4 * 1024 * 1024
DEFAULT_JOBS = 8
# After a timeout kill: how long to wait for the process and its pipes.
_KILL_GRACE_S = 5.0

# Where sbin tools live when a non-root, non-interactive shell lacks them on PATH.
_SBIN_DIRS = ("/usr/local/sbin", "/usr/sbin", "/sbin")
_CUDA_DEFAULT_HOME = "/usr/local/cuda"

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

TOOL_NAMES = (
    "nvcc",
    "nvidia-smi",
    "mpirun",
    "mpicc",
    "make",
    "gcc",
    "g++",
    "git",
    "ibv_devinfo",
    "torchrun",
)


# --------------------------------------------------------------------------
# small helpers


def _utc_now() -> str:
    now = datetime.datetime.now(datetime.timezone.utc)
    return now.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _is_exe(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def which(name: str, env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """``shutil.which`` on the PATH of ``env`` (default os.environ), then sbin dirs."""
    if env is None:
        env = os.environ
    if os.sep in name:
        return name if _is_exe(name) else None
    found = shutil.which(name, path=env.get("PATH", os.defpath))
    if found:
        return found
    for d in _SBIN_DIRS:
        cand = os.path.join(d, name)
        if _is_exe(cand):
            return cand
    return None


def find_nvcc(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """nvcc on PATH, else $CUDA_HOME/bin/nvcc, $CUDA_PATH/bin/nvcc, /usr/local/cuda/bin/nvcc.

    Non-interactive SSH shells often lack CUDA on PATH, hence the fallbacks.
    """
    if env is None:
        env = os.environ
    found = shutil.which("nvcc", path=env.get("PATH", os.defpath))
    if found:
        return found
    for home in (env.get("CUDA_HOME"), env.get("CUDA_PATH"), _CUDA_DEFAULT_HOME):
        if home:
            cand = os.path.join(home, "bin", "nvcc")
            if _is_exe(cand):
                return cand
    return None


def find_tools(env: Optional[Mapping[str, str]] = None) -> Dict[str, Optional[str]]:
    """Path of each of TOOL_NAMES, or None."""
    if env is None:
        env = os.environ
    out: Dict[str, Optional[str]] = {}
    for name in TOOL_NAMES:
        if name == "nvcc":
            out[name] = find_nvcc(env)
            continue
        path = which(name, env)
        if path is None and name == "nvidia-smi":
            cand = "/usr/bin/nvidia-smi"
            path = cand if _is_exe(cand) else None
        if path is None and name == "torchrun":
            # next to the interpreter (a venv whose bin dir is not on PATH)
            cand = os.path.join(os.path.dirname(sys.executable), "torchrun")
            path = cand if _is_exe(cand) else None
        out[name] = path
    return out


def fill_argv(argv: Sequence[str], values: Mapping[str, str]) -> List[str]:
    """Replace {python} {nvcc} {work_dir} {ckpt_dir} {torch_probe} in one pass."""
    return [_PLACEHOLDER_RE.sub(lambda m: values[m.group(1)], a) for a in argv]


# --------------------------------------------------------------------------
# running one command


def _reader(stream: Any, cap: int, sink: List[bytes], total: List[int]) -> None:
    kept = 0
    try:
        while True:
            chunk = stream.read(65536)
            if not chunk:
                break
            total[0] += len(chunk)
            if kept < cap:
                part = chunk[: cap - kept]
                sink.append(part)
                kept += len(part)
    except (OSError, ValueError):
        pass
    finally:
        with contextlib.suppress(OSError):
            stream.close()


def _decode(chunks: List[bytes], total: int, cap: int) -> Tuple[str, bool]:
    text = b"".join(chunks).decode("utf-8", errors="replace")
    if total > cap:
        text += "\n[gpuvet: output cut, kept %d of %d bytes]\n" % (cap, total)
        return text, True
    return text, False


def _kill_group(proc: "subprocess.Popen[bytes]") -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    except OSError:
        with contextlib.suppress(OSError):
            proc.kill()


def run_command(
    argv: Sequence[str],
    timeout_s: float,
    cap: int = OUTPUT_CAP_BYTES,
    env: Optional[Mapping[str, str]] = None,
) -> Dict[str, Any]:
    """Run one argv; never raises. Returns the per-command record.

    Keys: argv, path (the executable that ran), rc, stdout, stderr,
    duration_s, missing, timed_out, truncated, error, fallback.
    rc is None when the command is missing or was killed after its timeout;
    a negative rc means the command died of that signal on its own.
    """
    rec: Dict[str, Any] = {
        "argv": list(argv),
        "path": None,
        "rc": None,
        "stdout": "",
        "stderr": "",
        "duration_s": 0.0,
        "missing": False,
        "timed_out": False,
        "truncated": False,
        "error": None,
        "fallback": False,
    }
    run_env = dict(os.environ if env is None else env)
    # stable, parseable output regardless of the login locale
    run_env["LC_ALL"] = "C"
    run_env["LANG"] = "C"
    exe = which(argv[0], run_env) if argv else None
    if exe is None:
        rec["missing"] = True
        return rec
    rec["path"] = exe
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            list(argv),
            executable=exe,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=run_env,
            start_new_session=True,
            close_fds=True,
        )
    except FileNotFoundError:
        rec["missing"] = True
        rec["duration_s"] = round(time.monotonic() - start, 3)
        return rec
    except OSError as exc:
        rec["error"] = "%s: %s" % (type(exc).__name__, exc)
        rec["duration_s"] = round(time.monotonic() - start, 3)
        return rec

    out_chunks: List[bytes] = []
    err_chunks: List[bytes] = []
    out_total = [0]
    err_total = [0]
    readers = [
        threading.Thread(target=_reader, args=(proc.stdout, cap, out_chunks, out_total)),
        threading.Thread(target=_reader, args=(proc.stderr, cap, err_chunks, err_total)),
    ]
    for t in readers:
        t.daemon = True
        t.start()

    try:
        rc: Optional[int] = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        rec["timed_out"] = True
        _kill_group(proc)
        try:
            proc.wait(timeout=_KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            rec["error"] = "killed after %.1fs timeout but did not exit" % timeout_s
        rc = None
    # The group is gone or done; a grandchild that left the group could still
    # hold the pipes open, so the readers get a bounded wait.
    for t in readers:
        t.join(timeout=_KILL_GRACE_S)
    if rc is not None and any(t.is_alive() for t in readers):
        # exited, but something it started keeps the pipes: kill that too
        _kill_group(proc)
        for t in readers:
            t.join(timeout=_KILL_GRACE_S)
    rec["duration_s"] = round(time.monotonic() - start, 3)
    rec["rc"] = rc
    stdout, cut_out = _decode(list(out_chunks), out_total[0], cap)
    stderr, cut_err = _decode(list(err_chunks), err_total[0], cap)
    rec["stdout"] = scrub_text(stdout)
    rec["stderr"] = scrub_text(stderr)
    rec["truncated"] = cut_out or cut_err
    return rec


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
        return {
            "argv": list(cmd.argv),
            "path": None,
            "rc": None,
            "stdout": "",
            "stderr": "",
            "duration_s": 0.0,
            "missing": False,
            "timed_out": False,
            "truncated": False,
            "error": "%s: %s" % (type(exc).__name__, exc),
            "fallback": False,
        }


# --------------------------------------------------------------------------
# facts computed in Python


def _unescape_mount(field: str) -> str:
    # /proc/mounts writes space, tab, newline and backslash as \040 \011 \012 \134
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_mounts(text: str) -> List[Dict[str, str]]:
    """/proc/mounts lines as dicts: source, mount_point, fstype, options."""
    out: List[Dict[str, str]] = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        out.append(
            {
                "source": _unescape_mount(parts[0]),
                "mount_point": _unescape_mount(parts[1]),
                "fstype": parts[2],
                "options": parts[3],
            }
        )
    return out


def find_mount(path: str, mounts: Sequence[Mapping[str, str]]) -> Optional[Dict[str, str]]:
    """The mount holding ``path``: longest matching mount point, later lines win ties."""
    best: Optional[Mapping[str, str]] = None
    best_len = -1
    for m in mounts:
        mp = m["mount_point"]
        if mp == "/":
            matches = path.startswith("/")
        else:
            mp = mp.rstrip("/")
            matches = path == mp or path.startswith(mp + "/")
        if matches and len(mp) >= best_len:
            best, best_len = m, len(mp)
    return dict(best) if best is not None else None


def _read_text(path: str) -> Optional[str]:
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return None


def _probe_writable(path: str) -> bool:
    """Really create (and remove) a file: os.access is wrong on some network filesystems."""
    try:
        fd, name = tempfile.mkstemp(prefix=".gpuvet-write-test-", dir=path)
    except OSError:
        return False
    try:
        os.close(fd)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(name)
    return True


def path_info(path: str, mounts: Optional[Sequence[Mapping[str, str]]] = None) -> Dict[str, Any]:
    """exists / is_dir / writable / free and total bytes / mount of one directory.

    A missing directory is not created; free space and mount are then those
    of its nearest existing ancestor, named in ``stat_path``.
    """
    if mounts is None:
        mounts = parse_mounts(_read_text("/proc/mounts") or "")
    real = os.path.realpath(path)
    info: Dict[str, Any] = {
        "path": path,
        "realpath": real,
        "exists": os.path.exists(path),
        "is_dir": os.path.isdir(path),
        "writable": False,
        "stat_path": None,
        "free_bytes": None,
        "total_bytes": None,
        "mount": None,
        "error": None,
    }
    if info["is_dir"]:
        info["writable"] = _probe_writable(path)
    probe = real
    while not os.path.exists(probe) and probe != os.path.dirname(probe):
        probe = os.path.dirname(probe)
    info["stat_path"] = probe
    try:
        st = os.statvfs(probe)
        info["free_bytes"] = st.f_bavail * st.f_frsize
        info["total_bytes"] = st.f_blocks * st.f_frsize
    except OSError as exc:
        info["error"] = "%s: %s" % (type(exc).__name__, exc)
    info["mount"] = find_mount(probe, mounts)
    return info


_NCCL_VERSION_RE = re.compile(r"#define\s+NCCL_(MAJOR|MINOR|PATCH|SUFFIX)\s+(\S+)")


def _nccl_header_version(path: str) -> Optional[str]:
    text = _read_text(path)
    if text is None:
        return None
    found = dict(_NCCL_VERSION_RE.findall(text))
    if "MAJOR" not in found or "MINOR" not in found:
        return None
    version = "%s.%s.%s" % (found["MAJOR"], found["MINOR"], found.get("PATCH", "0"))
    suffix = found.get("SUFFIX", '""').strip('"')
    return version + suffix


def _list_libnccl(d: str) -> List[str]:
    try:
        names = os.listdir(d)
    except OSError:
        return []
    return sorted(n for n in names if n.startswith("libnccl.so") or n == "libnccl_static.a")


def _multiarch_dirs() -> List[str]:
    dirs = ["/usr/lib/x86_64-linux-gnu"]
    machine = platform.machine()
    if machine and machine != "x86_64":
        dirs.append("/usr/lib/%s-linux-gnu" % machine)
    return dirs


def find_nccl(
    sys_path: Optional[Sequence[str]] = None, env: Optional[Mapping[str, str]] = None
) -> Dict[str, Any]:
    """NCCL installs: pip's nvidia-nccl in sys.path, system headers, library dirs.

    ``lib_dirs[*].unversioned`` tells whether ``libnccl.so`` (what ``-lnccl``
    links against) exists; pip wheels ship only ``libnccl.so.2``.
    """
    if sys_path is None:
        sys_path = sys.path
    if env is None:
        env = os.environ
    nccl_home = env.get("NCCL_HOME") or None

    pip: List[Dict[str, Any]] = []
    seen = set()
    for entry in sys_path:
        if not entry:
            continue
        root = os.path.join(entry, "nvidia", "nccl")
        if not os.path.isdir(root):
            continue
        real = os.path.realpath(root)
        if real in seen:
            continue
        seen.add(real)
        header = os.path.join(root, "include", "nccl.h")
        has_header = os.path.isfile(header)
        libs = _list_libnccl(os.path.join(root, "lib"))
        pip.append(
            {
                "root": root,
                "lib_dir": os.path.join(root, "lib"),
                "libs": libs,
                "unversioned": "libnccl.so" in libs,
                "so2": "libnccl.so.2" in libs,
                "header": header if has_header else None,
                "header_version": _nccl_header_version(header) if has_header else None,
            }
        )

    header_paths = ["/usr/include/nccl.h", "/usr/local/cuda/include/nccl.h"]
    if nccl_home:
        header_paths.append(os.path.join(nccl_home, "include", "nccl.h"))
    headers = []
    for h in header_paths:
        exists = os.path.isfile(h)
        headers.append(
            {"path": h, "exists": exists, "version": _nccl_header_version(h) if exists else None}
        )

    lib_dir_paths = _multiarch_dirs() + ["/usr/local/cuda/lib64"]
    if nccl_home:
        lib_dir_paths.append(os.path.join(nccl_home, "lib"))
    lib_dirs = []
    for d in lib_dir_paths:
        libs = _list_libnccl(d)
        lib_dirs.append(
            {
                "dir": d,
                "exists": os.path.isdir(d),
                "libs": libs,
                "unversioned": "libnccl.so" in libs,
                "so2": "libnccl.so.2" in libs,
            }
        )
    return {"nccl_home": nccl_home, "pip": pip, "headers": headers, "lib_dirs": lib_dirs}


def find_mpi(env: Optional[Mapping[str, str]] = None, timeout_s: float = 10.0) -> Dict[str, Any]:
    """mpicc / mpirun paths, the MPI flavour, include dirs and where mpi.h is."""
    if env is None:
        env = os.environ
    mpicc = which("mpicc", env)
    info: Dict[str, Any] = {
        "mpicc": mpicc,
        "mpirun": which("mpirun", env),
        "flavor": None,
        "mpicc_version": None,
        "showme_incdirs": None,
        "showme_libdirs": None,
        "mpi_h": [],
    }
    incdirs: List[str] = []
    if mpicc:
        ver = run_command([mpicc, "-showme:version"], timeout_s, cap=65536, env=env)
        text = (ver["stdout"] + ver["stderr"]).strip()
        if ver["rc"] == 0 and "Open MPI" in text:
            info["flavor"] = "openmpi"
            info["mpicc_version"] = text
            inc = run_command([mpicc, "-showme:incdirs"], timeout_s, cap=65536, env=env)
            lib = run_command([mpicc, "-showme:libdirs"], timeout_s, cap=65536, env=env)
            info["showme_incdirs"] = inc["stdout"].strip() if inc["rc"] == 0 else None
            info["showme_libdirs"] = lib["stdout"].strip() if lib["rc"] == 0 else None
            incdirs.extend((info["showme_incdirs"] or "").split())
        else:
            show = run_command([mpicc, "-show"], timeout_s, cap=65536, env=env)
            text = show["stdout"].strip()
            if show["rc"] == 0 and text:
                info["flavor"] = "mpich" if "mpich" in text.lower() else "unknown"
                info["mpicc_version"] = text
                incdirs.extend(a[2:] for a in text.split() if a.startswith("-I"))
        prefix = os.path.dirname(os.path.dirname(os.path.realpath(mpicc)))
        incdirs.append(os.path.join(prefix, "include"))
    mpi_home = env.get("MPI_HOME")
    if mpi_home:
        incdirs.append(os.path.join(mpi_home, "include"))
    incdirs.extend(
        [
            "/usr/include",
            "/usr/local/include",
            "/usr/lib/x86_64-linux-gnu/openmpi/include",
            "/usr/include/x86_64-linux-gnu/mpich",
            "/usr/include/openmpi-x86_64",
            "/opt/hpcx/ompi/include",
            "/usr/local/mpi/include",
        ]
    )
    found: List[str] = []
    for d in incdirs:
        h = os.path.join(d, "mpi.h")
        if h not in found and os.path.isfile(h):
            found.append(h)
    info["mpi_h"] = found
    return info


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
        for key, fn in (("nccl", find_nccl), ("mpi", find_mpi), ("tools", find_tools)):
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
