"""Checkpoints: torch.distributed.checkpoint for model and optimizer, a file per
rank for the rest (step, data position, LR scheduler, every RNG state), and a
manifest with the sha256 of every file, written last.

A checkpoint directory without a valid manifest is incomplete (the save was
interrupted) and is skipped on restore; so is one whose files do not match
their manifest. A restore reads the files on as many threads as the hashing
uses (:func:`reader`).

The state digests recorded at save time and recomputed after a load prove the
restore bit for bit: every tensor is reduced, where it lives, to two 64-bit
weighted sums of its 32-bit words (exact integer arithmetic, so the result
does not depend on reduction order), and those, with names, dtypes and shapes,
are hashed with sha256. Copying twelve gigabytes to the host to sha256 them
would cost seconds on every save and every restore.

The directories and their manifests are :mod:`payload.train.manifest` (standard
library); torch is imported inside the functions that need it.
"""

import hashlib
import os
import random
import shutil
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from payload.train.manifest import (
    FORMAT,
    IO_THREADS,
    check_share,
    data_files,
    hash_share,
    read_manifest,
    step_dir,
    step_dirs,
    write_manifest,
)

# --------------------------------------------------------------------------
# state digests and RNG (torch inside)


def _words_fingerprint(t: Any) -> Tuple[int, int]:
    import torch

    flat = t.detach().reshape(-1)
    if flat.is_complex():
        flat = torch.view_as_real(flat).reshape(-1)
    raw = flat.contiguous().view(torch.uint8)
    pad = (-raw.numel()) % 4
    if pad:
        raw = torch.cat([raw, raw.new_zeros(pad)])
    elif raw.storage_offset() % 4:
        raw = raw.clone()  # a view into a buffer at an odd offset cannot be read as int32
    words = raw.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    a = b = 0
    step = 1 << 24
    for off in range(0, words.numel(), step):
        w = words[off:off + step]
        idx = torch.arange(off, off + w.numel(), device=w.device, dtype=torch.int64)
        # odd multipliers; int64 arithmetic wraps, which keeps the sums exact mod 2**64
        wa = idx * 0x9E3779B1 + 0x7F4A7C15
        wb = (idx ^ 0x5BD1E995) * 0x27D4EB2F + 0x165667B1
        a = (a + int((w * (wa | 1)).sum().item())) & 0xFFFFFFFFFFFFFFFF
        b = (b + int((w * (wb | 1)).sum().item())) & 0xFFFFFFFFFFFFFFFF
    return a, b


def _walk(obj: Any, prefix: str, h: Any) -> None:
    import torch

    if isinstance(obj, dict):
        for k in sorted(obj, key=str):
            _walk(obj[k], "%s/%s" % (prefix, k), h)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _walk(v, "%s/%d" % (prefix, i), h)
    elif isinstance(obj, torch.Tensor):
        local = obj.to_local() if hasattr(obj, "to_local") else obj
        a, b = _words_fingerprint(local)
        h.update(("%s|%s|%s|%016x%016x\n" % (prefix, local.dtype, tuple(local.shape), a, b)
                  ).encode())
    else:
        h.update(("%s=%r\n" % (prefix, obj)).encode())


def digest(obj: Any) -> str:
    """sha256 over names, dtypes, shapes and exact fingerprints of every tensor."""
    h = hashlib.sha256()
    _walk(obj, "", h)
    return h.hexdigest()


def rng_state(device: Any) -> Dict[str, Any]:
    import torch

    state: Dict[str, Any] = {"python": _jsonable(random.getstate()),
                             "torch": torch.get_rng_state()}
    state["cuda"] = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return state


def set_rng_state(state: Dict[str, Any], device: Any) -> None:
    import torch

    random.setstate(_tupled(state["python"]))
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and state.get("cuda") is not None:
        torch.cuda.set_rng_state(state["cuda"], device)


def _jsonable(v: Any) -> Any:
    return [_jsonable(x) for x in v] if isinstance(v, (list, tuple)) else v


def _tupled(v: Any) -> Any:
    return tuple(_tupled(x) for x in v) if isinstance(v, list) else v


def extra_name(rank: int) -> str:
    return "extra-rank%d.pt" % rank


# --------------------------------------------------------------------------
# save and load (collective: every rank calls them)


def save(root: str, step: int, model: Any, optimizer: Any, extra: Dict[str, Any],
         rank: int, world: int, manifest_delay_s: float = 0.0,
         on_commit: Optional[Callable[[], None]] = None, behind: bool = False,
         before_commit: Optional[Callable[[], None]] = None) -> "Written":
    """Write checkpoint `step`; its manifest is finished by the returned
    :meth:`Written.finish`, which returns what the SAVED event reports.

    `on_commit` runs on every rank once all data files are written (every rank past
    the barrier after its writes), before they are hashed for the manifest rank 0
    writes last: the supervisor's "before-manifest" kill point. The hashing comes
    after it, so a killed save does not spend it (2.2 s of a 12.6 GB checkpoint
    on an H100 host). `before_commit` runs just before it: where an earlier save's
    manifest, hashed `behind` the training, is finished, so that it is on disk
    before this save's kill point.
    """
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    path = step_dir(root, step)
    t0 = time.time()
    if rank == 0 and os.path.isdir(path):
        shutil.rmtree(path)  # a leftover of an earlier, interrupted attempt
    dist.barrier()
    msd, osd = get_state_dict(model, optimizer)
    # one writer thread (DCP's default) leaves a fast disk mostly idle: a 1B model's
    # 12.6 GB took 22 s on an H200 host's local disk
    writer = dcp.FileSystemWriter(path, thread_count=IO_THREADS)
    dcp.save({"model": msd, "optim": osd}, storage_writer=writer)
    tmp = os.path.join(path, ".%s.tmp" % extra_name(rank))
    with open(tmp, "wb") as f:
        torch.save(extra, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(path, extra_name(rank)))
    dist.barrier()
    write_s = time.time() - t0
    if before_commit is not None:
        before_commit()
    if on_commit is not None:
        on_commit()
    names: List[Any] = [data_files(path) if rank == 0 else None]
    dist.broadcast_object_list(names, src=0)
    return Written(path, step, names[0], extra["hashes"], rank, world, write_s,
                   manifest_delay_s, behind)


class Written:
    """A checkpoint whose data files are all written: this rank's share of them is
    hashed, on the spot or `behind` the training (in a thread, while the next steps
    run and the next save writes: hashlib and file reads release the GIL), and
    :meth:`finish` (collective, on the main thread like every collective) gathers the
    shares and has rank 0 write the manifest."""

    def __init__(self, path: str, step: int, names: List[str], hashes: Any, rank: int,
                 world: int, write_s: float, manifest_delay_s: float, behind: bool) -> None:
        self.path, self.step, self.names, self.hashes = path, step, names, hashes
        self.rank, self.world = rank, world
        self.write_s, self.delay, self.behind = write_s, manifest_delay_s, behind
        self.share: Dict[str, Any] = {}
        self.hash_s = 0.0
        self._thread: Optional[threading.Thread] = None
        if behind:
            self._thread = threading.Thread(target=self._hash, name="gpuvet-ckpt-hash",
                                            daemon=True)
            self._thread.start()
        else:
            self._hash()

    def _hash(self) -> None:
        t0 = time.time()
        try:
            self.share = hash_share(self.path, self.names, self.rank, self.world)
        except Exception as exc:  # a problem every rank sees in finish(): no manifest
            self.share = {"(rank %d's share)" % self.rank: {
                "error": "%s: %s" % (type(exc).__name__, exc)}}
        self.hash_s = time.time() - t0

    def finish(self) -> Dict[str, Any]:
        import torch.distributed as dist

        if self._thread is not None:
            self._thread.join()
        joined = time.time()
        shares: List[Any] = [None] * self.world
        dist.all_gather_object(shares, self.share)
        files: Dict[str, Any] = {}
        for s in shares:
            files.update(s)
        problems = ["%s: %s" % (n, r["error"]) for n, r in sorted(files.items())
                    if "error" in r]
        hashes: List[Any] = [None] * self.world
        dist.all_gather_object(hashes, self.hashes)
        total = sum(int(r.get("bytes", 0)) for r in files.values())
        if self.rank == 0 and not problems:
            if self.delay > 0:
                time.sleep(self.delay)  # slow storage stand-in: the kill lands here
            write_manifest(self.path, {"format": FORMAT, "step": self.step,
                                       "world_size": self.world, "files": files,
                                       "hashes": hashes, "created": time.time()})
        dist.barrier()
        # the save's own work: its writes, its hashing (beside the training when behind:
        # the wait for the thread is not counted twice) and the manifest
        own = self.write_s + self.hash_s + (time.time() - joined)
        return {"path": self.path, "bytes": total, "write_s": round(self.write_s, 4),
                "save_s": round(own, 4), "hash_s": round(self.hash_s, 4),
                "behind": self.behind, "files": len(files), "problems": problems,
                "hashes": self.hashes}


def _agree(problems: List[str], world: int) -> List[str]:
    """Every rank's problems, each prefixed with its rank (collective)."""
    import torch.distributed as dist

    gathered: List[Any] = [None] * world
    dist.all_gather_object(gathered, problems)
    return ["rank %d: %s" % (r, p) for r, ps in enumerate(gathered) for p in ps]


def _skip(step: int, path: str, merged: List[str]) -> Dict[str, Any]:
    return {"step": step, "path": path, "reasons": sorted(set(
        p.split(": ", 1)[1] if p.startswith("rank ") else p for p in merged))[:10]}


def _verify_into(verdict: Dict[str, Any], path: str, manifest: Dict[str, Any], rank: int,
                 world: int) -> None:
    t0 = time.time()
    try:
        verdict["problems"] = check_share(path, manifest, rank, world)
    except Exception as exc:  # an unreadable file: a problem, not a crash
        verdict["problems"] = ["hashing failed: %s: %s" % (type(exc).__name__, exc)]
    verdict["seconds"] = time.time() - t0


def find_and_load(root: str, model: Any, optimizer: Any, rank: int, world: int
                  ) -> Tuple[Optional[Dict[str, Any]], List[Dict[str, Any]]]:
    """Load the newest checkpoint whose manifest verifies on every rank, and say what was
    skipped.

    Candidates go newest first. One without a manifest (a save cut short), or saved by
    another world size, is skipped at once, all ranks agreeing before any of them loads.
    The one that is loaded is verified while it loads: this rank's share of its files is
    hashed on threads beside DCP's reader (the two reads of a file share the page
    cache), and the ranks then agree on the hashes. A checkpoint whose files do not match
    its manifest is skipped, and the next older one is loaded over it, so nothing of it
    stays in the model. The first restored step runs only after the hashes agreed.

    Returns ({"step", "path", "extra", "verify_s"}, skipped) or (None, skipped)."""
    import threading

    import torch.distributed as dist

    skipped: List[Dict[str, Any]] = []
    cands: List[Any] = [step_dirs(root) if rank == 0 else None]
    dist.broadcast_object_list(cands, src=0)
    for step, path in cands[0]:
        manifest, why = read_manifest(path)
        problems = [why] if why else []
        if manifest is not None and int(manifest.get("world_size", -1)) != world:
            problems.append("saved by %s ranks, this run has %d" % (manifest.get("world_size"),
                                                                     world))
        merged = _agree(problems, world)
        if merged or manifest is None:
            skipped.append(_skip(step, path, merged or ["no manifest"]))
            continue
        verdict: Dict[str, Any] = {}
        hasher = threading.Thread(target=_verify_into, args=(verdict, path, manifest, rank, world),
                                  name="gpuvet-ckpt-verify", daemon=True)
        hasher.start()
        failure: Optional[BaseException] = None
        extra: Optional[Dict[str, Any]] = None
        try:
            extra = load(path, model, optimizer, rank)
        except Exception as exc:  # judged below: a corrupt file explains it
            failure = exc
        hasher.join()
        merged = _agree(list(verdict.get("problems", ["not verified"])), world)
        if merged:
            skipped.append(_skip(step, path, merged))
            continue
        if failure is not None:  # files as the manifest says, and still not loadable
            raise failure
        return {"step": step, "path": path, "extra": extra,
                "verify_s": round(float(verdict.get("seconds", 0.0)), 4)}, skipped
    return None, skipped


def reader(path: str, threads: int = IO_THREADS) -> Any:
    """DCP's FileSystemReader, reading its files on `threads` threads.

    DCP reads a rank's files one after the other on one thread, each tensor
    deserialised and copied to its device in turn: 10.6 s of a 12.6 GB restore on an
    H200 host. Each file's items are handed to the stock reader on a thread of their own
    (file reads, deserialisation and copies release the GIL); each item is still read
    by DCP's own code. Where the reader lacks what this needs, it reads as it always has.
    """
    import dataclasses

    from torch.distributed.checkpoint import FileSystemReader

    class ThreadedReader(FileSystemReader):
        def read_data(self, plan: Any, planner: Any) -> Any:
            storage = getattr(self, "storage_data", None)
            if threads <= 1 or storage is None or not hasattr(plan, "__dataclass_fields__"):
                return super().read_data(plan, planner)
            per_file: Dict[str, List[Any]] = {}
            for item in plan.items:
                per_file.setdefault(storage[item.storage_index].relative_path, []).append(item)
            if len(per_file) <= 1:
                return super().read_data(plan, planner)
            from concurrent.futures import ThreadPoolExecutor

            read = super().read_data
            with ThreadPoolExecutor(max_workers=min(threads, len(per_file))) as pool:
                done = [pool.submit(read, dataclasses.replace(plan, items=items), planner)
                        for items in per_file.values()]
                for fut in done:
                    fut.result().wait()
            from torch.futures import Future

            out: Any = Future()
            out.set_result(None)
            return out

    return ThreadedReader(path)


def load(path: str, model: Any, optimizer: Any, rank: int) -> Dict[str, Any]:
    """Load model and optimizer in place; returns this rank's extra state."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    msd, osd = get_state_dict(model, optimizer)
    state: Dict[str, Any] = {"model": msd, "optim": osd}
    dcp.load(state, storage_reader=reader(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    with open(os.path.join(path, extra_name(rank)), "rb") as f:
        try:
            return torch.load(f, map_location="cpu", weights_only=True)
        except TypeError:  # torch before 1.13 has no weights_only
            f.seek(0)
            return torch.load(f, map_location="cpu")


def state_hashes(model: Any, optimizer: Any, rng: Dict[str, Any],
                 extra: Dict[str, Any]) -> Dict[str, str]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, optimizer)
    return {"model": digest(msd), "optimizer": digest(osd), "rng": digest(rng),
            "progress": digest(extra)}
