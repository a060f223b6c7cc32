"""Build nccl-tests on the node at a recorded commit, cached.

``python3 -m payload nccl-build --cache DIR --commit SHA (--url URL | --archive TGZ)``

Source comes from a git clone (nodes that reach the URL) or from an archive
the controller pushed (``git archive`` output, whose commit id sits in the
tar's pax header). The commit actually built must equal the requested one.
Builds are cached by (commit, CUDA, NCCL, MPI, GPU arch): a second run with
the same toolchain reuses the binaries. Prints one JSON document.

Standard library only, Python 3.8 compatible.
"""

import hashlib
import json
import os
import re
import shutil
import sys
import tarfile
import time
from typing import Any, Dict, List, Optional

from payload.probes import count_visible, find_mpi, find_nccl, find_nvcc
from payload.proc import run_command

BINARY = "all_reduce_perf"

# (pattern in the build log, diagnosis) — first match wins.
DIAGNOSES = [
    (r"nvcc: (command )?not found|/bin/nvcc: No such file", "nvcc not found: install the CUDA "
     "toolkit or pass --cuda-home"),
    (r"nccl\.h: No such file", "nccl.h not found: install libnccl-dev or pip {wheel}, "
     "or pass --nccl-home"),
    (r"cannot find -lnccl", "libnccl.so not found for linking: install libnccl-dev (pip wheels "
     "ship only libnccl.so.2)"),
    (r"mpi\.h: No such file", "mpi.h not found: install libopenmpi-dev or pass --mpi-home"),
    (r"cannot find -lmpi", "libmpi not found for linking: check MPI_HOME/lib"),
    (r"Unsupported gpu architecture|unsupported GPU architecture",
     "nvcc does not know this GPU architecture: the CUDA toolkit is too old for the GPU"),
]


def nccl_wheel(cuda_version: Optional[str]) -> str:
    """pip's NCCL for this CUDA major: nvidia-nccl-cu12 for CUDA 12, -cu13 for CUDA 13."""
    major = (cuda_version or "").split(".")[0]
    return "nvidia-nccl-cu%s" % major if major.isdigit() else "nvidia-nccl-cu<CUDA major>"


def diagnose(log: str, cuda_version: Optional[str] = None) -> Optional[str]:
    for pattern, what in DIAGNOSES:
        if re.search(pattern, log):
            return what.replace("{wheel}", nccl_wheel(cuda_version))
    return None


def archive_commit(path: str) -> Optional[str]:
    """The commit id `git archive` records in the pax global header."""
    with tarfile.open(path, "r:*") as tar:
        tar.next()
        comment = tar.pax_headers.get("comment")
    if comment and re.fullmatch(r"[0-9a-f]{40}", comment.strip()):
        return comment.strip()
    return None


def detect_gencode(env: Dict[str, str]) -> Optional[str]:
    res = run_command(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                      30.0, env=env)
    caps = sorted({line.strip().replace(".", "") for line in res["stdout"].splitlines()
                   if re.fullmatch(r"\d+\.\d+", line.strip())})
    if res["rc"] != 0 or not caps:
        return None
    return " ".join("-gencode=arch=compute_%s,code=sm_%s" % (c, c) for c in caps)


def nccl_home_for(cache: str, env: Dict[str, str], explicit: Optional[str]) -> Dict[str, Any]:
    """Where nccl.h and libnccl.so are; a shim dir for pip's wheel (which lacks libnccl.so)."""
    if explicit:
        return {"home": explicit, "version": None, "source": "explicit"}
    info = find_nccl(env=env)
    for h in info["headers"]:
        if h["exists"]:
            home = os.path.dirname(os.path.dirname(h["path"]))
            return {"home": None if home == "/usr" else home, "version": h["version"],
                    "source": "system", "header": h["path"]}
    for pip in info["pip"]:
        if pip["header"] and pip["so2"]:
            shim = os.path.join(cache, "nccl-home-%s" % hashlib.sha256(
                pip["root"].encode()).hexdigest()[:8])
            os.makedirs(os.path.join(shim, "lib"), exist_ok=True)
            inc = os.path.join(shim, "include")
            if not os.path.lexists(inc):
                os.symlink(os.path.dirname(pip["header"]), inc)
            for name in ("libnccl.so", "libnccl.so.2"):
                link = os.path.join(shim, "lib", name)
                if not os.path.lexists(link):
                    os.symlink(os.path.join(pip["lib_dir"], "libnccl.so.2"), link)
            return {"home": shim, "version": pip["header_version"], "source": "pip",
                    "header": pip["header"], "lib_dir": pip["lib_dir"]}
    return {"home": None, "version": None, "source": None}


def find_cuda_home(nvcc: Optional[str], env: Dict[str, str]) -> Optional[str]:
    """The toolkit root: where include/cuda_runtime.h is (nvcc may be a wrapper script)."""
    candidates = []
    if nvcc:
        candidates.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    candidates += [env.get("CUDA_HOME") or "", "/usr/local/cuda"]
    for c in candidates:
        if c and os.path.isfile(os.path.join(c, "include", "cuda_runtime.h")):
            return c
    return candidates[0] if nvcc else None


def nccl_lib_dir(nccl: Dict[str, Any]) -> Optional[str]:
    if nccl.get("lib_dir"):
        return nccl["lib_dir"]
    if nccl.get("home"):
        return os.path.join(nccl["home"], "lib")
    return None


def mpi_home_for(explicit: Optional[str], env: Dict[str, str]) -> Optional[str]:
    if explicit:
        return explicit
    info = find_mpi(env=env)
    if not info["mpi_h"] or not info["mpirun"]:
        return None
    # /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h -> /usr/lib/x86_64-linux-gnu/openmpi
    return os.path.dirname(os.path.dirname(info["mpi_h"][0]))


def safe_extract(archive: str, dest: str) -> None:
    """Unpack a tar archive into dest, refusing anything that would land outside it.

    Refused before anything is written: absolute or `..` member names, symlinks
    and hardlinks whose target leaves dest, devices and fifos. Each member is
    checked again on disk just before it is written, so a chain of symlinks
    that each look harmless cannot lead out either. Python before 3.12 has no
    tarfile `filter=` (3.8 nodes), hence the checks here; where tarfile has the
    "data" filter it is applied as well.

    Self-contained (imports inside, no module globals): the controller sends this
    function's source to nodes to unpack the payload before the payload exists there.
    """
    import os
    import tarfile

    root = os.path.realpath(dest)

    def inside(path: str) -> bool:
        return path == root or path.startswith(root + os.sep)

    def refuse(member: tarfile.TarInfo, why: str) -> None:
        raise ValueError("unsafe member %r in %s: %s" % (member.name, archive, why))

    with tarfile.open(archive, "r:*") as tar:
        members = tar.getmembers()
        for m in members:
            if os.path.isabs(m.name) or ".." in m.name.replace("\\", "/").split("/"):
                refuse(m, "absolute or '..' path")
            if not (m.isfile() or m.isdir() or m.issym() or m.islnk()):
                refuse(m, "device, fifo or other special file")
            if m.issym():
                where = os.path.dirname(os.path.join(root, m.name))
                if os.path.isabs(m.linkname) or not inside(
                        os.path.normpath(os.path.join(where, m.linkname))):
                    refuse(m, "symlink to %r, outside the archive's directory" % m.linkname)
            if m.islnk() and (os.path.isabs(m.linkname) or not inside(
                    os.path.normpath(os.path.join(root, m.linkname)))):
                refuse(m, "hardlink to %r, outside the archive's directory" % m.linkname)
        kwargs: Dict[str, Any] = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        for m in members:
            target = os.path.join(root, m.name)
            if not inside(os.path.realpath(target)):
                refuse(m, "its path leads outside through a symlink")
            if m.issym() and not inside(os.path.realpath(
                    os.path.join(os.path.dirname(target), m.linkname))):
                refuse(m, "symlink leads outside through another symlink")
            if m.islnk() and not inside(os.path.realpath(os.path.join(root, m.linkname))):
                refuse(m, "hardlink leads outside through a symlink")
            tar.extract(m, root, **kwargs)


def fetch_source(src: str, commit: str, url: Optional[str], archive: Optional[str],
                 log: List[str], env: Dict[str, str]) -> str:
    """Populate src with the commit; return the commit actually there."""
    if os.path.isfile(os.path.join(src, ".gpuvet-commit")):
        with open(os.path.join(src, ".gpuvet-commit")) as f:
            cached = f.read().strip()
        if cached == commit:  # a wrong source left by an earlier attempt is fetched anew
            return cached
    tmp = src + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    if archive:
        got = archive_commit(archive)
        os.makedirs(tmp)
        safe_extract(archive, tmp)
        entries = os.listdir(tmp)
        if len(entries) == 1 and os.path.isdir(os.path.join(tmp, entries[0])) and not \
                os.path.isdir(os.path.join(tmp, "src")):
            inner = os.path.join(tmp, entries[0])
            os.rename(inner, tmp + ".inner")
            shutil.rmtree(tmp)
            os.rename(tmp + ".inner", tmp)
        if got is None:
            raise ValueError("the archive carries no commit id (make it with `git archive`)")
    else:
        for argv in (["git", "clone", "--quiet", "--no-checkout", url or "", tmp],
                     ["git", "-C", tmp, "checkout", "--quiet", commit],
                     ["git", "-C", tmp, "rev-parse", "HEAD"]):
            res = run_command(argv, 600.0, env=env)
            log.append("$ %s\n%s%s" % (" ".join(argv), res["stdout"], res["stderr"]))
            if res["rc"] != 0:
                raise ValueError("`%s` failed (rc=%s): %s" % (
                    " ".join(argv[:3]), res["rc"], (res["stderr"] or res["stdout"]).strip()[-300:]))
        got = res["stdout"].strip()
    with open(os.path.join(tmp, ".gpuvet-commit"), "w") as f:
        f.write(got + "\n")
    shutil.rmtree(src, ignore_errors=True)
    os.rename(tmp, src)
    return got


def build(args: Any) -> Dict[str, Any]:
    env = dict(os.environ)
    cache = os.path.abspath(os.path.expanduser(args.cache))
    os.makedirs(cache, exist_ok=True)
    doc: Dict[str, Any] = {"tool": "gpuvet-nccl-build", "requested_commit": args.commit,
                           "ok": False, "cached": False, "diagnosis": None}
    nvcc = os.path.join(args.cuda_home, "bin", "nvcc") if args.cuda_home else find_nvcc(env)
    cuda_home = args.cuda_home or find_cuda_home(nvcc, env)
    nccl = nccl_home_for(cache, env, args.nccl_home)
    mpi_home = None if args.no_mpi else mpi_home_for(args.mpi_home, env)
    gencode = args.gencode or detect_gencode(env)
    cuda_version = None
    if nvcc:
        res = run_command([nvcc, "--version"], 60.0, env=env)
        m = re.search(r"release (\d+\.\d+)", res["stdout"])
        cuda_version = m.group(1) if m else None
    doc.update(nvcc=nvcc, cuda_home=cuda_home, cuda_version=cuda_version, nccl=nccl,
               mpi_home=mpi_home, mpi=bool(mpi_home), gencode=gencode)
    if not nvcc:
        doc["diagnosis"] = DIAGNOSES[0][1]
        return doc
    if not nccl["source"]:
        doc["diagnosis"] = ("NCCL not found (looked in /usr/include, /usr/local/cuda/include, "
                            "$NCCL_HOME and pip's nvidia-nccl): install libnccl-dev or "
                            "pip install %s" % nccl_wheel(cuda_version))
        return doc
    # The binary finds libnccl through its RUNPATH (ld reads LD_RUN_PATH at link
    # time): pip's NCCL is on no default library path, on the node or under mpirun.
    rpath = nccl_lib_dir(nccl)
    key_src = json.dumps([args.commit, cuda_version, nccl.get("version"), nccl.get("home"),
                          mpi_home, gencode, rpath], sort_keys=True)
    key = hashlib.sha256(key_src.encode()).hexdigest()[:12]
    out_dir = os.path.join(cache, "nccl-tests-%s-%s" % (args.commit[:12], key))
    build_dir = os.path.join(out_dir, "build")
    log_path = os.path.join(out_dir, "build.log")
    doc.update(cache_key=key, build_dir=build_dir, binary=os.path.join(build_dir, BINARY),
               log=log_path)
    done = os.path.join(out_dir, "build.json")
    doc["gpus"] = visible_gpus(env)
    if os.path.isfile(done) and os.path.isfile(doc["binary"]):
        with open(done) as f:
            prev = json.load(f)
        prev.update(cached=True, gpus=doc["gpus"])
        return prev
    os.makedirs(out_dir, exist_ok=True)
    log: List[str] = []
    src = os.path.join(cache, "src-%s" % args.commit)
    try:
        got = fetch_source(src, args.commit, args.url, args.archive, log, env)
    except (ValueError, OSError, tarfile.TarError) as exc:
        doc["diagnosis"] = "could not get nccl-tests source: %s" % exc
        _write(log_path, "\n".join(log))
        return doc
    doc["built_commit"] = got
    if got != args.commit:
        doc["diagnosis"] = "source is at commit %s, %s was requested" % (got, args.commit)
        return doc
    make = ["make", "-j%d" % args.jobs, "-C", src, "BUILDDIR=%s" % build_dir]
    make += ["CUDA_HOME=%s" % cuda_home]
    if nccl.get("home"):
        make.append("NCCL_HOME=%s" % nccl["home"])
    if mpi_home:
        make += ["MPI=1", "MPI_HOME=%s" % mpi_home]
    if gencode:
        make.append("NVCC_GENCODE=%s" % gencode)
    doc["make"] = make
    t0 = time.time()
    make_env = dict(env)
    if rpath:
        make_env["LD_RUN_PATH"] = rpath
    doc["rpath"] = rpath
    res = run_command(make, args.timeout, cap=8 << 20, env=make_env)
    doc["build_s"] = round(time.time() - t0, 1)
    log.append("$ %s\n%s\n%s" % (" ".join(make), res["stdout"], res["stderr"]))
    _write(log_path, "\n".join(log))
    if res["timed_out"]:
        doc["diagnosis"] = "build timed out after %.0f s" % args.timeout
    elif res["rc"] != 0 or not os.path.isfile(doc["binary"]):
        doc["diagnosis"] = diagnose("\n".join(log), cuda_version) or (
            "make failed (rc=%s); see %s" % (res["rc"], log_path))
    else:
        doc["ok"] = True
        doc["flags"] = supported_flags(doc["binary"], env)
        _write(done, json.dumps(doc, indent=1))
    return doc


def supported_flags(binary: str, env: Dict[str, str]) -> List[str]:
    """Options this build's help lists (e.g. -J, -T appeared in later versions)."""
    res = run_command([binary, "-h"], 60.0, env=env)
    return sorted(set(re.findall(r"\[(-[A-Za-z]),--", res["stdout"] + res["stderr"])))


def visible_gpus(env: Dict[str, str]) -> Optional[int]:
    """GPUs this node's processes see: CUDA_VISIBLE_DEVICES wins over nvidia-smi's count."""
    vis = env.get("CUDA_VISIBLE_DEVICES")
    if vis is not None:
        return count_visible(vis)
    res = run_command(["nvidia-smi", "-L"], 30.0, env=env)
    if res["rc"] != 0:
        return None
    return len([ln for ln in res["stdout"].splitlines() if ln.startswith("GPU ")])


def _write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def add_arguments(p: Any) -> None:
    p.add_argument("--cache", required=True, help="cache folder on the node")
    p.add_argument("--commit", required=True, help="40-hex commit to build")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--url", help="git URL to clone")
    src.add_argument("--archive", help="source archive made by `git archive`")
    p.add_argument("--cuda-home")
    p.add_argument("--nccl-home")
    p.add_argument("--mpi-home")
    p.add_argument("--no-mpi", action="store_true", help="build without MPI")
    p.add_argument("--gencode", help="NVCC_GENCODE, written --gencode=-gencode=arch=compute_90,code=sm_90 "
                   "(default: from the GPUs present)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 4)
    p.add_argument("--timeout", type=float, default=1800.0)


def main(args: Any) -> int:
    doc = build(args)
    sys.stdout.write(json.dumps(doc, indent=1) + "\n")
    return 0 if doc["ok"] else 1
