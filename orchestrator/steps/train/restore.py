"""The kill and the restore: the checkpoint the killed run saved, and whether the
relaunch restored it exactly.

The kill phase must have saved a complete checkpoint of `ckpt_step` before the
SIGKILL, and repeat the reference up to it (else the platform is not
deterministic, whatever the restore does). The restore must load the newest
complete save, with the model, optimizer and RNG state hashes it was saved
with on every rank, the reference's learning rate, and the reference's losses
after it: bit for bit, or within the suite's tolerance where the losses cannot
be exact (the reasons in `Earlier.inexact`). It also says what the restart
cost: seconds from the SIGKILL to the first restored step, and the steps lost.
"""

from __future__ import annotations

from typing import Any

from orchestrator.judging.sink import Sink
from orchestrator.steps.train.failures import failed
from orchestrator.steps.train.reading import STDERR, Earlier, PhaseOutput
from orchestrator.steps.train.throughput import nondeterministic
from orchestrator.suite import TrainParams
from payload.train import protocol

# the start-up stages a rank runs before its usual gate (payload/train/loop.py: Job), for
# the records of a payload that did not log their order (init_order)
BEFORE_GATE = ("import_torch", "cuda_context", "process_group", "compile_import")


def restart_parts(out: PhaseOutput) -> dict[str, float]:
    """Where a relaunch's seconds went, from rank 0's own records: torchrun and the
    interpreter (launch_s), torch import, CUDA, process group, model, compile set-up,
    wrap and optimizer (init_s), the discarded warm-up pass (warmup_s), and finding,
    verifying and loading the checkpoint (load_s, of which verify_s found and verified
    it). launch + init + warm-up + load + the first step make the relaunch."""
    parts: dict[str, float] = {}
    start, warm, loaded = (out.first(k) for k in (protocol.START, protocol.WARMUP, protocol.LOADED))
    if start is not None:
        if isinstance(start.get("launch_s"), (int, float)):
            parts["launch_s"] = float(start["launch_s"])
        init = start.get("init_s")
        if isinstance(init, dict) and init:
            names = [k for k in init if k not in ("gate_wait", "gate_cuda_wait")]  # waits
            if "gate_wait" in init:
                # started ahead of its turn: what ran before the gate (torchrun, torch, the
                # CUDA context, the process group) was done while the kill phase ran, and
                # only the stages after it are on the relaunch's path
                order = start.get("init_order")
                before = (set(order[:order.index("gate_wait")])
                          if isinstance(order, list) and "gate_wait" in order else
                          set(BEFORE_GATE))  # a record of an older payload: by name
                parts["gate_wait_s"] = float(init["gate_wait"])
                parts["ahead_s"] = round(parts.pop("launch_s", 0.0) + sum(
                    float(init[k]) for k in names if k in before), 4)
                names = [k for k in names if k not in before]
            parts["init_s"] = round(sum(float(init[k]) for k in names), 4)
    if warm is not None and isinstance(warm.get("seconds"), (int, float)):
        parts["warmup_s"] = float(warm["seconds"])
    if loaded is not None:
        for key in ("verify_s", "load_s"):
            if isinstance(loaded.get(key), (int, float)):
                parts[key] = float(loaded[key])
    return parts


# --------------------------------------------------------------------------- kill


def kill(sink: Sink, params: TrainParams, earlier: Earlier, out: PhaseOutput) -> bool:
    """The killed run: its checkpoint of ckpt_step, and that the kill landed."""
    earlier.kill_out = out
    if failed(sink, params, out, killed_ok=True, echoes=earlier.echoes):
        return False
    nondeterministic(out, earlier.inexact)
    killers = [n for n in out.nodes if n.supervise.get("killed")]
    if not killers:
        sink.add("TRAIN_KILL_MISSED", "FAIL", "kill: the job finished before the kill point "
                 f"({params.kill} at step {params.kill_step})",
                 [n.file("supervise.json") for n in out.nodes])
        return False
    saved = next((e for e in out.all(protocol.SAVED)
                  if int(e.get("step", -1)) == params.ckpt_step and e.get("rank") == 0), None)
    ev = [out.rank_file(0)]
    if saved is None or saved.get("problems"):
        sink.add("TRAIN_CKPT_SAVE_FAILED", "FAIL", f"kill: no complete checkpoint of step "
                 f"{params.ckpt_step} before the kill"
                 + (f": {saved['problems'][:3]}" if saved and saved.get("problems") else ""),
                 ev)
        return False
    # A kill meant for the middle of a later save can come too late: that save is then
    # complete, and it is what a correct restore loads.
    earlier.saved_step = max(int(e["step"]) for e in out.all(protocol.SAVED)
                             if e.get("rank") == 0 and not e.get("problems"))
    size, write_s = float(saved["bytes"]), float(saved["write_s"])
    sink.measure("ckpt_size_bytes", size, "bytes", files=saved.get("files"))
    sink.measure("ckpt_save_s", float(saved["save_s"]), "s")
    if write_s > 0:
        sink.measure("ckpt_write_gbs", size / write_s / 1e9, "GB/s", write_s=write_s)
    prefix_matches(earlier, out)
    kev = killers[0].supervise.get("kill_event") or {}
    echoes = earlier.echoes
    sink.add("TRAIN_KILLED", "INFO", f"kill: checkpoint of step {params.ckpt_step} "
             f"saved ({size / 1e6:.1f} MB in {saved['save_s']:.3g} s, written at "
             f"{size / max(write_s, 1e-9) / 1e9:.2f} GB/s); SIGKILLed on "
             f"{', '.join(n.node for n in killers)} at {kev.get('event')} of step "
             f"{kev.get('step')}"
             + (f"; {', '.join(echoes)} before its own kill" if echoes else ""),
             ev + [killers[0].file("supervise.json")],
             **({"peers_saw_kill": echoes} if echoes else {}))
    return True


def prefix_matches(earlier: Earlier, out: PhaseOutput) -> None:
    """The killed run repeats the reference up to the kill: if not, the platform itself
    is not deterministic, whatever the restore does."""
    if earlier.ref is None:
        return
    ref, got = earlier.ref.steps(), out.steps()
    for k in sorted(got):
        if k in ref and ref[k]["loss_hex"] != got[k]["loss_hex"]:
            reason = (f"two uninterrupted runs from the same seed differ at step {k} "
                      f"({ref[k]['loss']} vs {got[k]['loss']})")
            earlier.inexact.append(reason)
            return


# --------------------------------------------------------------------------- restore


def restore(sink: Sink, params: TrainParams, earlier: Earlier, out: PhaseOutput, *,
            saved_on: list[str], restored_on: list[str]) -> None:
    """The relaunch from the killed run's checkpoint, against the reference."""
    ev = [out.rank_file(0)]
    K, N = earlier.saved_step or params.ckpt_step, params.steps
    where = (f"saved on {'+'.join(saved_on)}, restored on {'+'.join(restored_on)}"
             + ("" if saved_on != restored_on else " (the same node)"))
    no_ckpt = next((e for e in out.all(protocol.ERROR) if e.get("kind") == "no_checkpoint"),
                   None)
    skips(sink, params, earlier, out)
    if no_ckpt is not None:
        sink.add("TRAIN_RESTORE_FAILED", "FAIL", f"restore: {no_ckpt.get('message')} "
                 f"({where})", ev)
        return
    loaded = [e for e in out.all(protocol.LOADED)]
    if not loaded:
        failed(sink, params, out)
        sink.add("TRAIN_RESTORE_FAILED", "FAIL", f"restore: no checkpoint was loaded "
                 f"({where})", ev + [n.file(STDERR) for n in out.nodes])
        return
    nondeterministic(out, earlier.inexact)
    problems: list[str] = []
    lead = min(loaded, key=lambda e: int(e.get("rank", 0)))
    if int(lead["step"]) != K:
        problems.append(f"restored step {lead['step']}, the last complete save was step {K}")
    saved = {int(e["rank"]): e.get("hashes") for e in (earlier.kill_out.all(protocol.SAVED)
                                                       if earlier.kill_out else [])
             if int(e.get("step", -1)) == K}
    for e in sorted(loaded, key=lambda e: int(e.get("rank", 0))):
        r = int(e.get("rank", 0))
        for part, want in (e.get("hashes_saved") or {}).items():
            got = (e.get("hashes_loaded") or {}).get(part)
            if got != want:
                problems.append(f"rank {r}: {part} state after load {str(got)[:12]} differs "
                                f"from the saved {str(want)[:12]}")
        if r in saved and saved[r] != e.get("hashes_saved"):
            problems.append(f"rank {r}: the checkpoint's recorded hashes differ from those "
                            "the saving run logged")
    ref_steps = earlier.ref.steps() if earlier.ref else {}
    if K in ref_steps and lead.get("lr_last") != ref_steps[K]["lr"]:
        problems.append(f"LR at step {K}: restored {lead.get('lr_last')!r}, reference "
                        f"{ref_steps[K]['lr']!r}")
    if K + 1 in ref_steps and lead.get("lr_next") != ref_steps[K + 1]["lr"]:
        problems.append(f"LR for step {K + 1}: restored {lead.get('lr_next')!r}, reference "
                        f"{ref_steps[K + 1]['lr']!r}")
    got_steps = out.steps()
    broke = failed(sink, params, out)
    mismatch = losses(params, earlier.inexact, ref_steps, got_steps, K, N)
    if mismatch:
        problems.append(mismatch)
    sink.measure("ckpt_load_s", float(lead["load_s"]), "s", verify_s=lead.get("verify_s"))
    restart(sink, earlier, out, got_steps, K)
    if problems or broke:
        detail = "; ".join(problems) if problems else "the restored run did not finish"
        sink.add("TRAIN_RESTORE_MISMATCH", "FAIL", f"restore ({where}): {detail}",
                 ev + [earlier.ref.rank_file(0)] if earlier.ref else ev, problems=problems)
        return
    exact = all(ref_steps[k]["loss_hex"] == got_steps[k]["loss_hex"] for k in range(K + 1, N + 1))
    inexact = earlier.inexact
    how = (f"losses of steps {K + 1}..{N} equal the reference bit for bit" if exact else
           f"losses of steps {K + 1}..{N} within {params.loss_tolerance:g} of the "
           f"reference (not exact: {'; '.join(inexact)})")
    lost = steps_lost(earlier, K)
    took = sink.last("restart_s")
    sink.add("TRAIN_RESTORE_OK", "PASS" if exact else "WARN",
             f"restore verified ({where}): step {K} restored, model/optimizer/RNG state "
             f"hashes equal on every rank, LR equal, {how}"
             + (f"; restart {took:.1f} s" if took is not None else "")
             + (f", {lost} step(s) of work lost" if lost is not None else ""),
             ev, exact=exact, inexact=inexact, saved_on=saved_on, restored_on=restored_on)


def skips(sink: Sink, params: TrainParams, earlier: Earlier, out: PhaseOutput) -> None:
    """The checkpoints the restore passed over, and why; or why there was none to skip."""
    skipped = [e for e in out.ranks.get(0, []) if e.get("event") == protocol.SKIP_CKPT]
    for s in skipped:
        sink.add("TRAIN_CKPT_SKIPPED", "INFO", f"restore: checkpoint of step {s.get('step')} "
                 f"skipped: {'; '.join(s.get('reasons') or [])}",
                 [out.rank_file(0)], ckpt_step=s.get("step"))
    if params.kill == "after-step" or skipped:
        return
    late = earlier.saved_step == params.kill_step
    sink.add("TRAIN_CKPT_SKIPPED", "INFO", "restore: nothing to skip: the kill landed "
             + (f"after the save of step {params.kill_step} completed (raise "
                "train.manifest_delay_s to catch it open)" if late else
                f"before the save of step {params.kill_step} wrote its directory"),
             [out.rank_file(0)], late=late)


def losses(params: TrainParams, inexact: list[str], ref: dict[int, dict[str, Any]],
           got: dict[int, dict[str, Any]], K: int, N: int) -> str | None:
    """The first step after K whose loss differs from the reference's, in words; None
    where all match (within the tolerance, where there is a reason they cannot be exact)."""
    tol = params.loss_tolerance
    for k in range(K + 1, N + 1):
        if k not in got:
            return f"the restored run stopped before step {k}"
        if k not in ref:
            return f"the reference has no step {k}"
        if ref[k]["loss_hex"] == got[k]["loss_hex"]:
            continue
        a, b = float(ref[k]["loss"]), float(got[k]["loss"])
        if inexact and tol > 0 and abs(a - b) <= tol * max(abs(a), 1e-12):
            continue
        return (f"first differing step {k}: reference loss {ref[k]['loss']} "
                f"({ref[k]['loss_hex']}), restored {got[k]['loss']} ({got[k]['loss_hex']})"
                + (f"; not deterministic here: {'; '.join(inexact)}" if inexact else ""))
    return None


def steps_lost(earlier: Earlier, K: int) -> int | None:
    """Steps the killed run completed after the checkpoint the restore loaded."""
    if earlier.kill_out is None:
        return None
    done = earlier.kill_out.steps()
    return (max(done) - K) if done else None


def restart(sink: Sink, earlier: Earlier, out: PhaseOutput, got: dict[int, dict[str, Any]],
            K: int) -> None:
    """SIGKILL until the job was dead (the killing node's clock), plus relaunch until the
    first restored step completed (the restoring node's clock); the controller's own
    time between the two is left out."""
    if earlier.kill_out is None or K + 1 not in got or not out.nodes:
        return
    deaths = [float(n.supervise["end_time"]) - float(n.supervise["kill_time"])
              for n in earlier.kill_out.nodes
              if n.supervise.get("kill_time") and n.supervise.get("end_time")]
    start = out.nodes[0].supervise.get("start_time")
    if not deaths or not start:
        return
    # a restore started ahead (held at its gate while the kill phase ran) relaunches from
    # the moment its gate opened: its interpreter, torch and CUDA context were ready
    opened = (out.first(protocol.START) or {}).get("gate_open_t")
    if isinstance(opened, (int, float)) and float(opened) > float(start):
        start = opened
    relaunch = float(got[K + 1]["t"]) - float(start)
    sink.measure("restart_s", max(deaths) + relaunch, "s", dying_s=max(deaths),
                 relaunch_to_first_step_s=relaunch, **restart_parts(out))
    lost = steps_lost(earlier, K)
    if lost is not None:
        sink.measure("steps_lost", lost, "steps")
