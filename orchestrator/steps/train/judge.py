"""Turn the training step's saved outputs into measurements and findings.

Reads only files: each node's rank event files (payload/train/protocol.py),
the supervisor's document, torchrun's output and the GPU telemetry. The same
rules judge a live run and captured fixtures. A phase is judged as soon as it
is back, and says whether the protocol can go on (no restore of a run that
never saved).
"""

from __future__ import annotations

import functools
import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from orchestrator.judging import telemetry
from orchestrator.judging.sink import Sink
from orchestrator.records import Finding, Measurement, Severity
from orchestrator.suite import Suite, TrainParams
from payload.train import protocol

STEP = "train"
STDOUT, STDERR = "torchrun.stdout", "torchrun.stderr"
_NCCL_TIMEOUT = re.compile(r"Watchdog caught collective operation timeout|NCCL.*[Tt]imeout|"
                           r"collective operation timeout|DistBackendError.*[Tt]imed out")
_NCCL_WARN = re.compile(r"NCCL WARN")
# what a rank's transport says when its peer on another node was SIGKILLed first
_PEER_LOST = re.compile(r"Connection closed by remote peer|Connection reset by peer|"
                        r"Broken pipe|remote process exited|Connection refused", re.I)
_CUDA_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError")


# --------------------------------------------------------------------------- reading


@dataclass
class NodeOutput:
    """One node's files of one phase."""

    node: str
    dir: Path
    supervise: dict[str, Any]
    events: dict[int, list[dict[str, Any]]]  # global rank -> events

    def file(self, name: str) -> Path:
        return self.dir / name

    def telemetry(self) -> telemetry.NodeTelemetry:
        """The GPU telemetry its supervisor sampled, as the telemetry judge reads it."""
        return telemetry.NodeTelemetry(self.node, self.supervise.get("telemetry") or {},
                                       self.dir, self.file("supervise.json"))


@dataclass
class PhaseOutput:
    phase: str
    nodes: list[NodeOutput]  # in node-rank order

    @property
    def ranks(self) -> dict[int, list[dict[str, Any]]]:
        out: dict[int, list[dict[str, Any]]] = {}
        for n in self.nodes:
            out.update(n.events)
        return dict(sorted(out.items()))

    def node_of(self, rank: int) -> str:
        for n in self.nodes:
            if rank in n.events:
                return n.node
        return "?"

    def rank0(self) -> list[dict[str, Any]]:
        return self.ranks.get(0, [])

    def steps(self, rank: int = 0) -> dict[int, dict[str, Any]]:
        return {int(e["step"]): e for e in self.ranks.get(rank, [])
                if e.get("event") == protocol.STEP}

    def first(self, kind: str, rank: int = 0) -> dict[str, Any] | None:
        return next((e for e in self.ranks.get(rank, []) if e.get("event") == kind), None)

    def all(self, kind: str) -> list[dict[str, Any]]:
        return [e for evs in self.ranks.values() for e in evs if e.get("event") == kind]


def read_node(node: str, folder: Path) -> NodeOutput:
    import json

    sup: dict[str, Any] = {}
    doc = folder / "supervise.json"
    if doc.is_file():
        try:
            loaded = json.loads(doc.read_text())
            sup = loaded if isinstance(loaded, dict) else {}
        except ValueError:
            sup = {}
    events: dict[int, list[dict[str, Any]]] = {}
    for path in sorted(folder.glob("rank*.jsonl")):
        m = re.fullmatch(r"rank(\d+)\.jsonl", path.name)
        if m:
            events[int(m.group(1))] = list(protocol.parse_lines(
                path.read_text(errors="replace")))
    return NodeOutput(node, folder, sup, events)


def read_phase(phase: str, folders: list[tuple[str, Path]]) -> PhaseOutput:
    return PhaseOutput(phase, [read_node(n, d) for n, d in folders])


# --------------------------------------------------------------------------- peaks


@functools.lru_cache(maxsize=1)
def _peak_table() -> list[dict[str, Any]]:
    from ruamel.yaml import YAML

    text = resources.files("orchestrator").joinpath("data/gpu_peaks.yaml").read_text()
    doc = YAML(typ="safe").load(text)
    return list(doc["peaks"])


def peak_tflops(gpu_name: str | None, provider: str,
                params: TrainParams) -> tuple[float | None, str]:
    """(dense bf16 peak, where it came from); None where the GPU is not known."""
    if provider in params.peak_tflops:
        return float(params.peak_tflops[provider]), f"suite train.peak_tflops.{provider}"
    if not gpu_name:
        return None, "no GPU"
    for row in _peak_table():
        if str(row["match"]).lower() in gpu_name.lower():
            if row.get("tflops") is None:
                return None, f"gpu_peaks.yaml lists {row['match']!r} without a figure"
            return float(row["tflops"]), f"gpu_peaks.yaml {row['match']!r}"
    return None, f"{gpu_name!r} is not in gpu_peaks.yaml"


# --------------------------------------------------------------------------- judging


def p90(values: list[float]) -> float:
    """Nearest-rank 90th percentile."""
    ordered = sorted(values)
    return ordered[max(0, -(-9 * len(ordered) // 10) - 1)]


@dataclass
class Subject:
    """Who a unit's records are about: one node (single) or a provider (multi)."""

    provider: str
    node: str | None
    nodes: list[str]
    label: str  # single | multi


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
            parts["init_s"] = round(sum(float(v) for v in init.values()), 4)
    if warm is not None and isinstance(warm.get("seconds"), (int, float)):
        parts["warmup_s"] = float(warm["seconds"])
    if loaded is not None:
        for key in ("verify_s", "load_s"):
            if isinstance(loaded.get(key), (int, float)):
                parts[key] = float(loaded[key])
    return parts


def telemetry_rules(params: TrainParams) -> telemetry.TelemetryRules:
    """The training step's telemetry verdicts: its thresholds, its codes and words."""
    th = params.thresholds
    return telemetry.TelemetryRules(idle_util_pct=th.gpu_idle_util_pct,
                                    power_violation_pct=th.power_violation_pct)


@dataclass
class Judge:
    run_id: str
    suite: Suite
    subject: Subject
    rel: Callable[[Path], str]
    sink: Sink = field(init=False)
    ref: PhaseOutput | None = None
    kill_out: PhaseOutput | None = None
    saved_step: int | None = None  # the newest save the killed run completed
    inexact: list[str] = field(default_factory=list)  # why losses may not match bit for bit
    echoes: list[str] = field(default_factory=list)  # ranks that saw the kill land elsewhere

    def __post_init__(self) -> None:
        s = self.subject
        self.sink = Sink(self.run_id, STEP, self.suite.hash, s.provider, s.node, s.nodes,
                         s.label, self.rel, scope="train", engine="train")

    @property
    def params(self) -> TrainParams:
        return self.suite.train

    @property
    def findings(self) -> list[Finding]:
        return self.sink.findings

    @property
    def measurements(self) -> list[Measurement]:
        return self.sink.measurements

    def add(self, code: str, sev: Severity, msg: str, evidence: list[Path] | None = None,
            **details: Any) -> None:
        self.sink.add(code, sev, msg, evidence, **details)

    def measure(self, metric: str, value: float, unit: str, **tags: Any) -> None:
        self.sink.measure(metric, value, unit, **tags)

    def _rank_file(self, out: PhaseOutput, rank: int) -> Path:
        for n in out.nodes:
            if rank in n.events:
                return n.file(f"rank{rank}.jsonl")
        return out.nodes[0].file(f"rank{rank}.jsonl") if out.nodes else Path("?")

    # ------------------------------------------------------------------ failures

    def failed(self, out: PhaseOutput, *, killed_ok: bool = False) -> bool:
        """Findings for a phase that broke; True when it did."""
        bad = False
        killed = any(n.supervise.get("killed") for n in out.nodes)
        for ev in out.all(protocol.ERROR):
            rank = int(ev.get("rank", -1))
            where = f"rank {rank} on {out.node_of(rank)}"
            if killed_ok and killed and self._past_kill_point(out, rank, ev):
                # a peer on another node was SIGKILLed first: this rank's collective failed
                # before its own supervisor killed it, as the kill meant
                self.echoes.append(f"{where} saw it ({ev.get('type') or ev.get('kind')})")
                continue
            ev_file = self._rank_file(out, rank)
            kind = ev.get("kind")
            if kind == "oom":
                self.add("TRAIN_OOM", "FAIL", f"{out.phase}: CUDA out of memory on {where}: "
                         f"{str(ev.get('message'))[:300]}", [ev_file], phase=out.phase)
            elif kind == "nonfinite":
                self.add("TRAIN_NAN", "FAIL", f"{out.phase}: {ev.get('message')} ({where})",
                         [ev_file], phase=out.phase, first_step=ev.get("step"))
            elif kind == "no_checkpoint":
                continue  # the restore judges this itself
            else:
                self.add("TRAIN_FAILED", "FAIL", f"{out.phase}: {ev.get('type')} on {where}: "
                         f"{str(ev.get('message'))[:300]}", [ev_file], phase=out.phase)
            bad = True
            if rank == 0 or kind in ("oom", "nonfinite"):
                break  # one rank's error is every rank's: report the first
        bad = self._scan_logs(out) or bad
        for n in out.nodes:
            sup = n.supervise
            if not sup:
                self.add("TRAIN_FAILED", "FAIL", f"{out.phase}: no supervisor document from "
                         f"{n.node}", [n.file("supervise.json")], phase=out.phase)
                return True
            if sup.get("timed_out"):
                self.add("TRAIN_TIMEOUT", "FAIL", f"{out.phase}: still running on {n.node} "
                         f"after {self.params.timeout_s:.0f} s; killed", [n.file(STDERR)],
                         phase=out.phase)
                bad = True
        ended = out.first(protocol.END) is not None
        if not bad and not ended and not (killed_ok and killed):
            rcs = {n.node: n.supervise.get("rc") for n in out.nodes}
            tail = _tail(out.nodes[0].file(STDERR))
            self.add("TRAIN_FAILED", "FAIL", f"{out.phase}: the job ended without finishing "
                     f"(exit status {rcs}){': ' + tail if tail else ''}",
                     [n.file(STDERR) for n in out.nodes], phase=out.phase)
            bad = True
        return bad

    def _past_kill_point(self, out: PhaseOutput, rank: int, error: dict[str, Any]) -> bool:
        """Whether `rank` had logged the kill point (the supervisors' trigger) before `error`."""
        K, kill = self.params.kill_step, self.params.kill
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

    def _scan_logs(self, out: PhaseOutput) -> bool:
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
                    self.add("TRAIN_NCCL_TIMEOUT", "FAIL", f"{out.phase}: collective timeout on "
                             f"{n.node} ({name}:{i}): {ln.strip()[:240]}", [path],
                             phase=out.phase, line=i)
                    bad = True
                # after the SIGKILL a surviving rank's transport reports its lost peer
                warns = [(i, ln) for i, ln in enumerate(lines, 1) if _NCCL_WARN.search(ln)
                         and not (killed and _PEER_LOST.search(ln))]
                if warns:
                    i, ln = warns[0]
                    self.add("TRAIN_NCCL_WARN", "WARN", f"{out.phase}: {len(warns)} NCCL WARN "
                             f"line(s) on {n.node}, first at {name}:{i}: {ln.strip()[:240]}",
                             [path], phase=out.phase, line=i, count=len(warns))
                if not out.all(protocol.ERROR):
                    ooms = [(i, ln) for i, ln in enumerate(lines, 1) if _CUDA_OOM.search(ln)]
                    if ooms:
                        i, ln = ooms[0]
                        self.add("TRAIN_OOM", "FAIL", f"{out.phase}: CUDA out of memory on "
                                 f"{n.node} ({name}:{i}): {ln.strip()[:240]}", [path],
                                 phase=out.phase, line=i)
                        bad = True
        return bad

    # ------------------------------------------------------------------ reference

    def reference(self, out: PhaseOutput) -> bool:
        """Performance, health and the losses the restore must reproduce."""
        self.ref = out
        if self.failed(out):
            return False
        self._nondeterministic(out)
        steps = out.steps()
        start = out.first(protocol.START) or {}
        ev = [self._rank_file(out, 0)]
        skip = min(self.params.stats_skip_steps, max(0, len(steps) - 3))
        timed = [s for k, s in sorted(steps.items()) if k > skip]
        fast = [e for e in out.rank0() if e.get("event") == protocol.TSTEP]
        gpu = (start.get("versions") or {}).get("gpu_name")
        cuda = str(start.get("device", "")).startswith("cuda")
        tags = {"world": start.get("world"), "gpu": gpu, "parallel": start.get("parallel"),
                "compiled": start.get("compiled"), "model": self.params.model,
                "params": start.get("params"), "torch": (start.get("versions") or {}).get("torch")}
        peak: float | None = None
        if cuda:
            peak, source = peak_tflops(gpu, self.subject.provider, self.params)
            if peak is None:
                self.add("TRAIN_NO_MFU", "INFO", f"no MFU: {source}; set "
                         f"train.peak_tflops.{self.subject.provider} in the suite", ev, gpu=gpu)
            else:
                tags.update(peak_tflops=peak, peak_source=source)
        det = bool((start.get("deterministic") or {}).get("use_deterministic_algorithms"))
        if fast:  # the headline is the fastest kernels' speed; the verified steps' is kept too
            speed = self._speed(fast, "", start, peak, tags, timed_in="throughput",
                                deterministic=False)
            verified = self._speed(timed, "deterministic_", start, peak, tags,
                                   timed_in="reference", deterministic=det)
            speed_text = (f"{speed} on the fastest kernels ({len(fast)} steps after the "
                          f"verified ones); the verified, deterministic steps: {verified}")
        else:
            speed_text = self._speed(timed, "", start, peak, tags, timed_in="reference",
                                     deterministic=det)
        self._memory(out)
        losses = [float(s["loss"]) for _, s in sorted(steps.items())]
        q = max(1, len(losses) // 4)
        first, last = statistics.fmean(losses[:q]), statistics.fmean(losses[-q:])
        if not last < first - self.params.thresholds.loss_drop_min:
            self.add("TRAIN_LOSS_NOT_DECREASING", "WARN", f"loss did not fall: first quarter "
                     f"mean {first:.4f}, last quarter {last:.4f}", ev, first=first, last=last)
        shares = [float(s["data_wait_s"]) / float(s["step_time_s"]) for s in timed
                  if float(s["step_time_s"]) > 0]
        if shares and statistics.median(shares) > self.params.thresholds.input_bound_share:
            self.add("TRAIN_INPUT_BOUND", "WARN", f"input pipeline: waiting for data takes "
                     f"{statistics.median(shares):.0%} of a step (median)", ev,
                     share=statistics.median(shares))
        if cuda:  # CPU ranks share cores with everything else: their spread is not a GPU's
            self._stragglers(out, skip)
        self._telemetry(out, steps)
        self.add("TRAIN_REFERENCE", "INFO", f"reference: {len(steps)} steps on "
                 f"{start.get('world')} rank(s) ({start.get('device')}, {start.get('parallel')}"
                 f"{', compiled' if start.get('compiled') else ''}), loss {losses[0]:.4f} -> "
                 f"{losses[-1]:.4f}; {speed_text}", ev)
        return True

    def _speed(self, steps: list[dict[str, Any]], prefix: str, start: dict[str, Any],
               peak: float | None, tags: dict[str, Any], **more: Any) -> str:
        """Step time, tokens/s and MFU of these steps as measurements; a line for people."""
        times = [float(s["step_time_s"]) for s in steps]
        med, tail90 = statistics.median(times), p90(times)
        tps = int(steps[0]["tokens"]) / med
        tags = {**tags, **more, "steps_timed": len(times)}
        per = "gpu" if str(start.get("device", "")).startswith("cuda") else "rank"
        self.measure(f"{prefix}step_time_s", med, "s", stat="median", **tags)
        self.measure(f"{prefix}step_time_p90_s", tail90, "s", stat="p90", **tags)
        self.measure(f"{prefix}tokens_per_s_per_{per}", tps, "tokens/s", **tags)
        text = f"step {med:.4g} s median (p90 {tail90:.4g} s), {tps:,.0f} tokens/s per {per}"
        if peak is not None:
            achieved = float(start.get("flops_per_token") or 0) * tps / 1e12
            self.measure(f"{prefix}mfu", achieved / peak, "ratio", achieved_tflops=achieved,
                         **tags)
            text += f", MFU {achieved / peak:.1%} ({achieved:.0f} of {peak:.0f} TFLOP/s)"
        return text

    def _nondeterministic(self, out: PhaseOutput) -> None:
        for ev in out.all("nondeterministic"):
            reason = f"an operation without a deterministic kernel: {ev.get('message')}"
            if reason not in self.inexact:
                self.inexact.append(reason)
        start = out.first(protocol.START) or {}
        if not (start.get("deterministic") or {}).get("use_deterministic_algorithms"):
            reason = "deterministic mode is off (suite train.deterministic: false)"
            if reason not in self.inexact:
                self.inexact.append(reason)

    def _memory(self, out: PhaseOutput) -> None:
        for rank, evs in out.ranks.items():
            last = next((e for e in reversed(evs) if e.get("event") in (protocol.END,
                                                                        protocol.STEP)), None)
            if last is None:
                continue
            node = out.node_of(rank)
            for key, metric in (("mem_alloc_peak", "peak_mem_allocated_bytes"),
                                ("mem_reserved_peak", "peak_mem_reserved_bytes"),
                                ("rss_peak", "peak_rss_bytes")):
                if last.get(key) is not None:
                    self.measure(metric, float(last[key]), "bytes", rank=rank, node=node)

    def _stragglers(self, out: PhaseOutput, skip: int) -> None:
        fwd: dict[int, float] = {}
        for rank in out.ranks:
            vals = [float(s["fwd_s"]) for k, s in sorted(out.steps(rank).items())
                    if k > skip and s.get("fwd_s") is not None]
            if vals:
                fwd[rank] = statistics.median(vals)
        if len(fwd) < 2:
            return
        slow = max(fwd, key=lambda r: fwd[r])
        others = statistics.median([v for r, v in fwd.items() if r != slow])
        if others > 0 and fwd[slow] / others >= self.params.thresholds.straggler_ratio:
            self.add("TRAIN_STRAGGLER", "WARN", f"rank {slow} on {out.node_of(slow)} is slow: "
                     f"forward {fwd[slow]:.4g} s median vs {others:.4g} s on the other ranks "
                     f"({fwd[slow] / others:.2f}x)", [self._rank_file(out, slow)], rank=slow,
                     node_of_rank=out.node_of(slow), ratio=fwd[slow] / others)

    # ------------------------------------------------------------------ telemetry

    def _telemetry(self, out: PhaseOutput, steps: dict[int, dict[str, Any]]) -> None:
        if steps:
            self._telemetry_window(
                out, min(float(s["t"]) - float(s["step_time_s"]) for s in steps.values()),
                max(float(s["t"]) for s in steps.values()))

    def _telemetry_window(self, out: PhaseOutput, t_first: float, t_last: float) -> None:
        telemetry.judge_window(self.sink, telemetry_rules(self.params),
                               [n.telemetry() for n in out.nodes], t_first, t_last)

    # ------------------------------------------------------------------ kill

    def kill(self, out: PhaseOutput) -> bool:
        self.kill_out = out
        if self.failed(out, killed_ok=True):
            return False
        self._nondeterministic(out)
        killers = [n for n in out.nodes if n.supervise.get("killed")]
        if not killers:
            self.add("TRAIN_KILL_MISSED", "FAIL", "kill: the job finished before the kill point "
                     f"({self.params.kill} at step {self.params.kill_step})",
                     [n.file("supervise.json") for n in out.nodes])
            return False
        saved = next((e for e in out.all(protocol.SAVED)
                      if int(e.get("step", -1)) == self.params.ckpt_step and e.get("rank") == 0),
                     None)
        ev = [self._rank_file(out, 0)]
        if saved is None or saved.get("problems"):
            self.add("TRAIN_CKPT_SAVE_FAILED", "FAIL", f"kill: no complete checkpoint of step "
                     f"{self.params.ckpt_step} before the kill"
                     + (f": {saved['problems'][:3]}" if saved and saved.get("problems") else ""),
                     ev)
            return False
        # A kill meant for the middle of a later save can come too late: that save is then
        # complete, and it is what a correct restore loads.
        self.saved_step = max(int(e["step"]) for e in out.all(protocol.SAVED)
                              if e.get("rank") == 0 and not e.get("problems"))
        size, write_s = float(saved["bytes"]), float(saved["write_s"])
        self.measure("ckpt_size_bytes", size, "bytes", files=saved.get("files"))
        self.measure("ckpt_save_s", float(saved["save_s"]), "s")
        if write_s > 0:
            self.measure("ckpt_write_gbs", size / write_s / 1e9, "GB/s", write_s=write_s)
        self._prefix_matches(out)
        kev = killers[0].supervise.get("kill_event") or {}
        self.add("TRAIN_KILLED", "INFO", f"kill: checkpoint of step {self.params.ckpt_step} "
                 f"saved ({size / 1e6:.1f} MB in {saved['save_s']:.3g} s, written at "
                 f"{size / max(write_s, 1e-9) / 1e9:.2f} GB/s); SIGKILLed on "
                 f"{', '.join(n.node for n in killers)} at {kev.get('event')} of step "
                 f"{kev.get('step')}"
                 + (f"; {', '.join(self.echoes)} before its own kill" if self.echoes else ""),
                 ev + [killers[0].file("supervise.json")],
                 **({"peers_saw_kill": self.echoes} if self.echoes else {}))
        return True

    def _prefix_matches(self, out: PhaseOutput) -> None:
        """The killed run repeats the reference up to the kill: if not, the platform itself
        is not deterministic, whatever the restore does."""
        if self.ref is None:
            return
        ref, got = self.ref.steps(), out.steps()
        for k in sorted(got):
            if k in ref and ref[k]["loss_hex"] != got[k]["loss_hex"]:
                reason = (f"two uninterrupted runs from the same seed differ at step {k} "
                          f"({ref[k]['loss']} vs {got[k]['loss']})")
                self.inexact.append(reason)
                return

    # ------------------------------------------------------------------ restore

    def restore(self, out: PhaseOutput, *, saved_on: list[str], restored_on: list[str],
                ) -> None:
        ev = [self._rank_file(out, 0)]
        K, N = self.saved_step or self.params.ckpt_step, self.params.steps
        where = (f"saved on {'+'.join(saved_on)}, restored on {'+'.join(restored_on)}"
                 + ("" if saved_on != restored_on else " (the same node)"))
        no_ckpt = next((e for e in out.all(protocol.ERROR) if e.get("kind") == "no_checkpoint"),
                       None)
        self._skips(out)
        if no_ckpt is not None:
            self.add("TRAIN_RESTORE_FAILED", "FAIL", f"restore: {no_ckpt.get('message')} "
                     f"({where})", ev)
            return
        loaded = [e for e in out.all(protocol.LOADED)]
        if not loaded:
            self.failed(out)
            self.add("TRAIN_RESTORE_FAILED", "FAIL", f"restore: no checkpoint was loaded "
                     f"({where})", ev + [n.file(STDERR) for n in out.nodes])
            return
        self._nondeterministic(out)
        problems: list[str] = []
        lead = min(loaded, key=lambda e: int(e.get("rank", 0)))
        if int(lead["step"]) != K:
            problems.append(f"restored step {lead['step']}, the last complete save was step {K}")
        saved = {int(e["rank"]): e.get("hashes") for e in (self.kill_out.all(protocol.SAVED)
                                                           if self.kill_out else [])
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
        ref_steps = self.ref.steps() if self.ref else {}
        if K in ref_steps and lead.get("lr_last") != ref_steps[K]["lr"]:
            problems.append(f"LR at step {K}: restored {lead.get('lr_last')!r}, reference "
                            f"{ref_steps[K]['lr']!r}")
        if K + 1 in ref_steps and lead.get("lr_next") != ref_steps[K + 1]["lr"]:
            problems.append(f"LR for step {K + 1}: restored {lead.get('lr_next')!r}, reference "
                            f"{ref_steps[K + 1]['lr']!r}")
        got = out.steps()
        failed = self.failed(out)
        mismatch = self._losses(ref_steps, got, K, N)
        if mismatch:
            problems.append(mismatch)
        self.measure("ckpt_load_s", float(lead["load_s"]), "s", verify_s=lead.get("verify_s"))
        self._restart(out, got, K)
        if problems or failed:
            detail = "; ".join(problems) if problems else "the restored run did not finish"
            self.add("TRAIN_RESTORE_MISMATCH", "FAIL", f"restore ({where}): {detail}",
                     ev + [self._rank_file(self.ref, 0)] if self.ref else ev,
                     problems=problems)
            return
        exact = all(ref_steps[k]["loss_hex"] == got[k]["loss_hex"] for k in range(K + 1, N + 1))
        how = (f"losses of steps {K + 1}..{N} equal the reference bit for bit" if exact else
               f"losses of steps {K + 1}..{N} within {self.params.loss_tolerance:g} of the "
               f"reference (not exact: {'; '.join(self.inexact)})")
        lost = self._lost(K)
        restart = next((m.value for m in reversed(self.measurements)
                        if m.metric == "restart_s"), None)
        self.add("TRAIN_RESTORE_OK", "PASS" if exact else "WARN",
                 f"restore verified ({where}): step {K} restored, model/optimizer/RNG state "
                 f"hashes equal on every rank, LR equal, {how}"
                 + (f"; restart {restart:.1f} s" if restart is not None else "")
                 + (f", {lost} step(s) of work lost" if lost is not None else ""),
                 ev, exact=exact, inexact=self.inexact, saved_on=saved_on,
                 restored_on=restored_on)

    def _skips(self, out: PhaseOutput) -> None:
        skips = [e for e in out.ranks.get(0, []) if e.get("event") == protocol.SKIP_CKPT]
        for s in skips:
            self.add("TRAIN_CKPT_SKIPPED", "INFO", f"restore: checkpoint of step {s.get('step')} "
                     f"skipped: {'; '.join(s.get('reasons') or [])}",
                     [self._rank_file(out, 0)], ckpt_step=s.get("step"))
        if self.params.kill == "after-step" or skips:
            return
        late = self.saved_step == self.params.kill_step
        self.add("TRAIN_CKPT_SKIPPED", "INFO", "restore: nothing to skip: the kill landed "
                 + (f"after the save of step {self.params.kill_step} completed (raise "
                    "train.manifest_delay_s to catch it open)" if late else
                    f"before the save of step {self.params.kill_step} wrote its directory"),
                 [self._rank_file(out, 0)], late=late)

    def _losses(self, ref: dict[int, dict[str, Any]], got: dict[int, dict[str, Any]], K: int,
                N: int) -> str | None:
        tol = self.params.loss_tolerance
        for k in range(K + 1, N + 1):
            if k not in got:
                return f"the restored run stopped before step {k}"
            if k not in ref:
                return f"the reference has no step {k}"
            if ref[k]["loss_hex"] == got[k]["loss_hex"]:
                continue
            a, b = float(ref[k]["loss"]), float(got[k]["loss"])
            if self.inexact and tol > 0 and abs(a - b) <= tol * max(abs(a), 1e-12):
                continue
            return (f"first differing step {k}: reference loss {ref[k]['loss']} "
                    f"({ref[k]['loss_hex']}), restored {got[k]['loss']} ({got[k]['loss_hex']})"
                    + (f"; not deterministic here: {'; '.join(self.inexact)}"
                       if self.inexact else ""))
        return None

    def _lost(self, K: int) -> int | None:
        if self.kill_out is None:
            return None
        done = self.kill_out.steps()
        return (max(done) - K) if done else None

    def _restart(self, out: PhaseOutput, got: dict[int, dict[str, Any]], K: int) -> None:
        """SIGKILL until the job was dead (the killing node's clock), plus relaunch until the
        first restored step completed (the restoring node's clock); the controller's own
        time between the two is left out."""
        if self.kill_out is None or K + 1 not in got or not out.nodes:
            return
        deaths = [float(n.supervise["end_time"]) - float(n.supervise["kill_time"])
                  for n in self.kill_out.nodes
                  if n.supervise.get("kill_time") and n.supervise.get("end_time")]
        start = out.nodes[0].supervise.get("start_time")
        if not deaths or not start:
            return
        relaunch = float(got[K + 1]["t"]) - float(start)
        self.measure("restart_s", max(deaths) + relaunch, "s", dying_s=max(deaths),
                     relaunch_to_first_step_s=relaunch, **restart_parts(out))
        lost = self._lost(K)
        if lost is not None:
            self.measure("steps_lost", lost, "steps")


    # ------------------------------------------------------------------ your own command

    def command(self, out: PhaseOutput) -> bool:
        """The user's script: exit status, wall time, telemetry; with the restore contract,
        that the relaunch resumed at or after the last step it saved."""
        n = out.nodes[0]
        sup, log = n.supervise, n.file("command.stdout")
        ev = [log, n.file("command.stderr"), n.file("supervise.json")]
        if not sup:
            self.add("TRAIN_FAILED", "FAIL", f"{out.phase}: no supervisor document from "
                     f"{n.node}", ev, phase=out.phase)
            return False
        steps, saves = command_steps(log)
        self.measure("command_wall_s", float(sup.get("wall_s") or 0), "s", phase=out.phase,
                     rc=sup.get("rc"))
        self._telemetry_window(out, float(sup.get("start_time") or 0),
                               float(sup.get("end_time") or 0))
        if sup.get("timed_out"):
            self.add("TRAIN_TIMEOUT", "FAIL", f"{out.phase}: your command ran past "
                     f"{self.params.timeout_s:.0f} s and was killed", ev, phase=out.phase)
            return False
        if out.phase == "kill":
            if not sup.get("killed"):
                self.add("TRAIN_KILL_MISSED", "FAIL", "kill: your command ended before it logged "
                         f"step={self.params.command_kill_after_step}", ev)
                return False
            self.kill_out = out
            self.add("TRAIN_KILLED", "INFO", f"kill: SIGKILLed after step={max(steps or [0])}"
                     + (f"; last save logged at step={max(saves)}" if saves else
                        "; no `saved ... step=N` line seen"), ev)
            return True
        if sup.get("rc") != 0:
            self.add("TRAIN_COMMAND_FAILED", "FAIL", f"{out.phase}: your command exited with "
                     f"status {sup.get('rc')}: {_tail(n.file('command.stderr'))}", ev)
            return False
        if out.phase == "reference":
            self.add("TRAIN_COMMAND_OK", "INFO", f"your command finished in {sup.get('wall_s')} s"
                     f" ({len(steps)} step lines)", ev)
            return True
        before, saved = command_steps(self.kill_out.nodes[0].file("command.stdout")) \
            if self.kill_out else ([], [])
        first = min(steps) if steps else None
        need = max(saved) if saved else (min(before) + 1 if before else 1)
        if first is None or first < need:
            self.add("TRAIN_RESTORE_MISMATCH", "FAIL", "restore: your command "
                     + (f"started again at step={first}" if first is not None else
                        "logged no step") + f", expected step={need} or later"
                     + (" (the last saved step)" if saved else " (it started over)"), ev,
                     first_step=first, expected=need)
            return True
        lost = (max(before) - first) if before else None
        if lost is not None:
            self.measure("steps_lost", max(lost, 0), "steps")
        self.add("TRAIN_RESTORE_OK", "PASS", f"restore: your command resumed at step={first} "
                 f"(last saved {need if saved else 'unknown'}); finished in "
                 f"{sup.get('wall_s')} s", ev, first_step=first)
        return True


_SAVED = re.compile(r"sav(?:e|ed|ing)\b", re.I)


def command_steps(path: Path) -> tuple[list[int], list[int]]:
    """`step=N` lines of the user's command; those that also say "saved" mark checkpoints."""
    from payload.train.supervise import STEP_LINE

    steps: list[int] = []
    saves: list[int] = []
    if not path.is_file():
        return [], []
    for line in path.read_text(errors="replace").splitlines():
        m = STEP_LINE.search(line)
        if m:
            (saves if _SAVED.search(line) else steps).append(int(m.group(1)))
    return steps, saves


def _tail(path: Path, n: int = 3) -> str:
    if not path.is_file():
        return ""
    lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines()
             if ln.strip() and not ln.startswith("*")]
    return " | ".join(lines[-n:])[-400:]
