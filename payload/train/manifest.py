"""A checkpoint's directory and its manifest: the sha256 and size of every file, written
last, so that a directory without a valid manifest is an incomplete save.

The ranks split the hashing between them, on save and on verify, and each hashes its
share of the files on several threads (hashlib releases the GIL), so a large checkpoint
costs each rank a fraction of one core's sha256 rate: a 12.6 GB checkpoint took 11 s to
hash on one thread. Standard library only (the payload's rule); the checkpoints
themselves are written and read by :mod:`payload.train.ckpt`.
"""

import hashlib
import json
import os
from typing import Any, Dict, List, Optional, Tuple

MANIFEST = "manifest.json"
FORMAT = "gpuvet-ckpt/1"
STEP_PREFIX = "step-"
_CHUNK = 8 << 20


def step_dir(root: str, step: int) -> str:
    return os.path.join(root, "%s%08d" % (STEP_PREFIX, step))


def step_dirs(root: str) -> List[Tuple[int, str]]:
    """(step, path) of every checkpoint directory under root, newest first."""
    out = []
    try:
        names = os.listdir(root)
    except OSError:
        return []
    for name in names:
        if name.startswith(STEP_PREFIX) and name[len(STEP_PREFIX):].isdigit():
            out.append((int(name[len(STEP_PREFIX):]), os.path.join(root, name)))
    return sorted(out, reverse=True)


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            chunk = f.read(_CHUNK)
            if not chunk:
                break
            h.update(chunk)
    return h.hexdigest()


def data_files(path: str) -> List[str]:
    """Every file of a checkpoint except the manifest and temporaries, sorted."""
    out = []
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            rel = os.path.relpath(os.path.join(dirpath, name), path)
            if rel == MANIFEST or (name.startswith(".") and name.endswith(".tmp")):
                continue
            out.append(rel)
    return sorted(out)


# threads per rank for checkpoint I/O: DCP's writer threads, and hashing
IO_THREADS = max(1, min(8, (os.cpu_count() or 1) // 2))


def _hash_one(full: str) -> Dict[str, Any]:
    try:
        return {"sha256": sha256_file(full), "bytes": os.path.getsize(full)}
    except OSError as exc:
        return {"error": "%s: %s" % (type(exc).__name__, exc)}


def hash_share(path: str, names: List[str], rank: int, world: int,
               threads: int = IO_THREADS) -> Dict[str, Any]:
    """sha256 and size of this rank's share of the files (every world-th one)."""
    mine = [name for i, name in enumerate(names) if i % world == rank]
    if threads <= 1 or len(mine) <= 1:
        return {name: _hash_one(os.path.join(path, name)) for name in mine}
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(threads, len(mine))) as pool:
        futures = [(name, pool.submit(_hash_one, os.path.join(path, name))) for name in mine]
        return {name: fut.result() for name, fut in futures}


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_manifest(path: str, doc: Dict[str, Any]) -> None:
    """Temp file, fsync, rename, fsync the directory: the manifest appears whole or not at all."""
    tmp = os.path.join(path, ".%s.tmp" % MANIFEST)
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(path, MANIFEST))
    _fsync_dir(path)


def read_manifest(path: str) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
    """(manifest, None) or (None, why it is not usable)."""
    mpath = os.path.join(path, MANIFEST)
    if not os.path.isfile(mpath):
        return None, "no manifest: the save did not finish"
    try:
        with open(mpath) as f:
            doc = json.load(f)
    except (OSError, ValueError) as exc:
        return None, "manifest unreadable: %s" % exc
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(
            doc.get("files"), dict):
        return None, "manifest is not a %s document" % FORMAT
    return doc, None


def check_share(path: str, manifest: Dict[str, Any], rank: int, world: int) -> List[str]:
    """Problems with this rank's share of the manifest's files (empty: all good)."""
    names = sorted(manifest["files"])
    problems = []
    if rank == 0:
        extra = sorted(set(data_files(path)) - set(names))
        if extra:
            problems.append("files not in the manifest: %s" % ", ".join(extra[:5]))
    got = hash_share(path, names, rank, world)
    for name, rec in got.items():
        want = manifest["files"][name]
        if "error" in rec:
            problems.append("%s: %s" % (name, rec["error"]))
        elif rec["bytes"] != want.get("bytes"):
            problems.append("%s: %d bytes, manifest says %s" % (name, rec["bytes"],
                                                                  want.get("bytes")))
        elif rec["sha256"] != want.get("sha256"):
            problems.append("%s: sha256 %s, manifest says %s" % (
                name, rec["sha256"][:12], str(want.get("sha256"))[:12]))
    return problems
