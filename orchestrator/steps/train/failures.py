"""A phase that broke: a rank's error, a collective timeout or NCCL warning in
torchrun's output, CUDA running out of memory, a supervisor that had to kill
the job, or a job that ended without finishing.

In the kill phase a rank on another node than the one SIGKILLed first sees its
collective fail before its own supervisor kills it: that is the kill's echo,
noted, not a failure.
"""

from __future__ import annotations

import re
import signal
from typing import Any

from orchestrator.judging.sink import Sink
from orchestrator.steps.train.reading import STDERR, STDOUT, PhaseOutput, tail
from orchestrator.suite import TrainParams
from payload.train import protocol

_NCCL_TIMEOUT = re.compile(r"Watchdog caught collective operation timeout|NCCL.*[Tt]imeout|"
                           r"collective operation timeout|DistBackendError.*[Tt]imed out")
_NCCL_WARN = re.compile(r"NCCL WARN")
# what a rank's transport says when its peer on another node was SIGKILLed first
_PEER_LOST = re.compile(r"Connection closed by remote peer|Connection reset by peer|"
                        r"Broken pipe|remote process exited|Connection refused", re.I)
_CUDA_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError")


def failed(sink: Sink, params: TrainParams, out: PhaseOutput, *, killed_ok: bool = False,
           echoes: list[str] | None = None) -> bool:
    """Findings for a phase that broke; True when it did. With `killed_ok` (the kill
    phase) an error after the kill point is the kill's echo, appended to `echoes`."""
    bad = False
    killed = any(n.supervise.get("killed") for n in out.nodes)
    died = [] if killed_ok and killed else died_of_signal(out)
    if died:
        # a rank killed from outside (the OOM killer, a node going down, someone's kill)
        # says nothing; its peers' errors ("connection reset by peer") are the echo
        echo = next((e for e in out.all(protocol.ERROR)
                     if out.node_of(int(e.get("rank", -1))) not in dict(died)), None)
        then = (f"; then rank {echo.get('rank')} on {out.node_of(int(echo.get('rank', -1)))}: "
                f"{echo.get('cause') or str(echo.get('message'))[:200]}" if echo else "")
        sink.add("TRAIN_FAILED", "FAIL", f"{out.phase}: the job on "
                 + ", ".join(f"{node} died of signal {sig} ({_signal_name(sig)})"
                             for node, sig in died)
                 + " without an error of its own (the kernel's OOM killer, a node or "
                 "container going down, or a kill from outside: see the node's kernel log)"
                 + then, [n.file(STDERR) for n in out.nodes if n.node in dict(died)],
                 phase=out.phase, died=[node for node, _ in died])
        bad = True
    for ev in [] if died else out.all(protocol.ERROR):
        rank = int(ev.get("rank", -1))
        where = f"rank {rank} on {out.node_of(rank)}"
        if killed_ok and killed and past_kill_point(params, out, rank, ev):
            # a peer on another node was SIGKILLed first: this rank's collective failed
            # before its own supervisor killed it, as the kill meant
            if echoes is not None:
                echoes.append(f"{where} saw it ({ev.get('type') or ev.get('kind')})")
            continue
        ev_file = out.rank_file(rank)
        kind = ev.get("kind")
        if kind == "oom":
            sink.add("TRAIN_OOM", "FAIL", f"{out.phase}: CUDA out of memory on {where}: "
                     f"{str(ev.get('message'))[:300]}", [ev_file], phase=out.phase)
        elif kind == "nonfinite":
            sink.add("TRAIN_NAN", "FAIL", f"{out.phase}: {ev.get('message')} ({where})",
                     [ev_file], phase=out.phase, first_step=ev.get("step"))
        elif kind == "no_checkpoint":
            continue  # the restore judges this itself
        elif kind == "no_space":
            saving = [e.get("step") for e in out.ranks.get(rank, [])
                      if e.get("event") == protocol.SAVING]
            what = (f"while saving step {saving[-1]} to {ckpt_dir(out, rank)}" if saving
                    else "writing on the node")
            sink.add("TRAIN_CKPT_NO_SPACE", "FAIL", f"{out.phase}: no space left {what} "
                     f"({where}: {ev.get('cause') or ev.get('message')}); the protocol keeps "
                     "two checkpoints there (CKPT_SPACE_LOW says how much they take)",
                     [ev_file], phase=out.phase, ckpt_step=saving[-1] if saving else None)
        else:
            why = ev.get("cause") or str(ev.get("message"))[:300]
            sink.add("TRAIN_FAILED", "FAIL", f"{out.phase}: {ev.get('type')} on {where}: "
                     f"{why}", [ev_file], phase=out.phase)
        bad = True
        if rank == 0 or kind in ("oom", "nonfinite"):
            break  # one rank's error is every rank's: report the first
    bad = scan_logs(sink, out) or bad
    for n in out.nodes:
        sup = n.supervise
        if not sup:
            sink.add("TRAIN_FAILED", "FAIL", f"{out.phase}: no supervisor document from "
                     f"{n.node}", [n.file("supervise.json")], phase=out.phase)
            return True
        if sup.get("timed_out"):
            sink.add("TRAIN_TIMEOUT", "FAIL", f"{out.phase}: still running on {n.node} "
                     f"after {params.timeout_s:.0f} s; killed", [n.file(STDERR)],
                     phase=out.phase)
            bad = True
        if sup.get("stopped"):
            # a multi-node job's part whose peer failed (launch.PEER_GRACE_S): the cause
            # is the peer's, named by its own findings
            sink.add("TRAIN_PART_STOPPED", "INFO", f"{out.phase}: {n.node} stopped: "
                     f"{sup['stopped']}", [n.file("supervise.json")], phase=out.phase)
    ended = out.first(protocol.END) is not None
    if not bad and not ended and not (killed_ok and killed and not any(
            n.supervise.get("stopped") for n in out.nodes)):
        rcs = {n.node: n.supervise.get("rc") for n in out.nodes}
        # the cause is on a node that failed by itself, not on one stopped after it
        first = next((n for n in out.nodes if not n.supervise.get("stopped")), out.nodes[0])
        last = tail(first.file(STDERR))
        sink.add("TRAIN_FAILED", "FAIL", f"{out.phase}: the job ended without finishing "
                 f"(exit status {rcs}){f'; on {first.node}: ' + last if last else ''}",
                 [n.file(STDERR) for n in out.nodes], phase=out.phase)
        bad = True
    return bad


def past_kill_point(params: TrainParams, out: PhaseOutput, rank: int,
                    error: dict[str, Any]) -> bool:
    """Whether `rank` had logged the kill point (the supervisors' trigger) before `error`."""
    K, kill = params.kill_step, params.kill
    for e in out.ranks.get(rank, []):
        if e is error:
            return False
        kind, step = e.get("event"), int(e.get("step", -1))
        if kill == "after-step" and kind == protocol.STEP and step >= K:
            return True
        if kill == "mid-save" and kind == protocol.SAVING and step == K:
            return True
        if kill == "before-manifest" and kind == protocol.COMMIT and step == K:
            return True
    return False


def scan_logs(sink: Sink, out: PhaseOutput) -> bool:
    """torchrun's output of every node: collective timeouts, NCCL WARN lines, and CUDA
    out of memory where no rank recorded an error; True for a failure."""
    bad = False
    killed = out.phase == "kill" and any(n.supervise.get("killed") for n in out.nodes)
    for n in out.nodes:
        for name in (STDERR, STDOUT):
            path = n.file(name)
            if not path.is_file():
                continue
            lines = path.read_text(errors="replace").splitlines()
            timeouts = [(i, ln) for i, ln in enumerate(lines, 1) if _NCCL_TIMEOUT.search(ln)]
            if timeouts:
                i, ln = timeouts[0]
                sink.add("TRAIN_NCCL_TIMEOUT", "FAIL", f"{out.phase}: collective timeout on "
                         f"{n.node} ({name}:{i}): {ln.strip()[:240]}", [path],
                         phase=out.phase, line=i)
                bad = True
            # after the SIGKILL a surviving rank's transport reports its lost peer
            warns = [(i, ln) for i, ln in enumerate(lines, 1) if _NCCL_WARN.search(ln)
                     and not (killed and _PEER_LOST.search(ln))]
            if warns:
                i, ln = warns[0]
                sink.add("TRAIN_NCCL_WARN", "WARN", f"{out.phase}: {len(warns)} NCCL WARN "
                         f"line(s) on {n.node}, first at {name}:{i}: {ln.strip()[:240]}",
                         [path], phase=out.phase, line=i, count=len(warns))
            if not out.all(protocol.ERROR):
                ooms = [(i, ln) for i, ln in enumerate(lines, 1) if _CUDA_OOM.search(ln)]
                if ooms:
                    i, ln = ooms[0]
                    sink.add("TRAIN_OOM", "FAIL", f"{out.phase}: CUDA out of memory on "
                             f"{n.node} ({name}:{i}): {ln.strip()[:240]}", [path],
                             phase=out.phase, line=i)
                    bad = True
    return bad


def ckpt_dir(out: PhaseOutput, rank: int) -> str:
    """The checkpoint directory the rank's supervisor gave it (its argv), or a phrase."""
    node = out.node_of(rank)
    sup = next((n.supervise for n in out.nodes if n.node == node), None) or {}
    argv = list(sup.get("argv") or [])
    return argv[argv.index("--ckpt-dir") + 1] if "--ckpt-dir" in argv[:-1] else \
        "the checkpoint directory"


_TORCHRUN_SIGNAL = re.compile(r"exitcode\s*:\s*-(\d+)")


def died_of_signal(out: PhaseOutput) -> list[tuple[str, int]]:
    """(node, signal) of the nodes whose job died of a signal its supervisor did not send:
    a rank started directly exits with -signal, torchrun's footer says `exitcode : -9`."""
    died = []
    for n in out.nodes:
        sup = n.supervise
        if not sup or sup.get("killed") or sup.get("stopped"):
            continue
        rc = sup.get("rc")
        sig = -rc if isinstance(rc, int) and rc < 0 else None
        if sig is None and rc:
            m = _TORCHRUN_SIGNAL.search(tail(n.file(STDERR), 40))
            sig = int(m.group(1)) if m else None
        if sig:
            died.append((n.node, sig))
    return died


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return "unknown signal"

