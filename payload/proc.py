"""Running one command on the node: bounded output, a timeout that kills the
whole process group, and where tools live when PATH is thin.

Standard library only, Python 3.8 compatible.
"""

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from payload.scrub import scrub_text

# Per stream; the rest is read and thrown away so the child never blocks.
OUTPUT_CAP_BYTES = 4 * 1024 * 1024
# After a timeout kill: how long to wait for the process and its pipes.
_KILL_GRACE_S = 5.0

# Where sbin tools live when a non-root, non-interactive shell lacks them on PATH.
_SBIN_DIRS = ("/usr/local/sbin", "/usr/sbin", "/sbin")


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


def empty_record(argv: Sequence[str], error: Optional[str] = None) -> Dict[str, Any]:
    """The record of a command before (or instead of) running it."""
    return {
        "argv": list(argv),
        "path": None,
        "rc": None,
        "stdout": "",
        "stderr": "",
        "duration_s": 0.0,
        "missing": False,
        "timed_out": False,
        "truncated": False,
        "error": error,
        "fallback": False,
    }


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
    rec = empty_record(argv)
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

