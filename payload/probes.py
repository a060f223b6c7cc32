"""Facts about a node computed in Python rather than by a command: tool
locations, mounts and free space of the work and checkpoint directories, NCCL
installs (system and pip) and MPI (mpicc, mpi.h).

Standard library only, Python 3.8 compatible.
"""

import contextlib
import datetime
import os
import platform
import re
import shutil
import sys
import tempfile
from typing import Any, Dict, List, Mapping, Optional, Sequence

from payload.proc import _is_exe, run_command, which

_CUDA_DEFAULT_HOME = "/usr/local/cuda"

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



def count_visible(devices: str, gpus: Optional[int] = None) -> int:
    """How many GPUs a CUDA_VISIBLE_DEVICES value leaves visible ("" and "-1": none).

    With the node's GPU count, as CUDA reads the value: up to the first entry that names
    no GPU of the node (an index past the last, -1, anything else); a GPU- or MIG- UUID
    counts, unchecked. Without it, every entry asked for."""
    entries = [d.strip() for d in devices.split(",") if d.strip()]
    if gpus is None:
        return len([d for d in entries if d != "-1"])
    n = 0
    for d in entries:
        if not (d.startswith(("GPU-", "MIG-")) or (d.isdigit() and int(d) < gpus)):
            break
        n += 1
    return n


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


def boot_time(stat_text: Optional[str] = None) -> Optional[str]:
    """When the node booted, UTC ISO 8601, from /proc/stat's `btime` (seconds since the
    epoch); None where there is no /proc/stat. A rental bills from about then."""
    text = _read_text("/proc/stat") if stat_text is None else stat_text
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "btime" and parts[1].isdigit():
            when = datetime.datetime.fromtimestamp(int(parts[1]), datetime.timezone.utc)
            return when.strftime("%Y-%m-%dT%H:%M:%SZ")
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
    of its nearest existing ancestor, named in ``stat_path``, and ``creatable``
    says whether this user may create it there.
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
    if not info["exists"]:  # made by `mkdir -p` as this user: the ancestor must allow it
        info["creatable"] = os.path.isdir(probe) and os.access(probe, os.W_OK | os.X_OK)
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
