"""The parameters of a run. Their hash makes runs comparable.

Two runs are compared only when their suite hashes match: a different message
size range or iteration count is a different experiment, not a regression.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from orchestrator.errors import UsageError, shown
from orchestrator.inventory.reader import Refused, Source, read_text
from payload.allreduce import parse_size
from payload.scrub import scrub_text
from payload.train.config import PRESETS

NCCL_TESTS_URL = "https://github.com/NVIDIA/nccl-tests.git"
NCCL_TESTS_COMMIT = "a0b82b2260cf5152b9f8c061bbf7eaf0ba096432"  # v2.19.6


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PreflightParams(_M):
    timeout_s: float = Field(default=300.0, gt=0)
    jobs: int = Field(default=8, ge=1, le=64)
    max_temperature_c: float = 85.0


class NcclTestsSource(_M):
    url: str = NCCL_TESTS_URL
    commit: str = Field(default=NCCL_TESTS_COMMIT, pattern=r"^[0-9a-f]{40}$")
    local_path: str | None = None  # a checkout or archive on the controller


# the nccl-tests collectives the nccl step can run, by the name their logs print
# (`<name>_perf`); each one's busbw is nccl-tests' own (payload/allreduce.py BUSBW_FACTORS)
Collective = Literal["all_reduce", "all_gather", "reduce_scatter", "alltoall", "sendrecv",
                     "broadcast"]
COLLECTIVES: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "alltoall",
                                "sendrecv", "broadcast")
# how the nccl step runs its collectives: `normal` as NCCL chooses (NVLink, shared memory
# and the NICs), `network` with NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 so every rank's
# bytes cross the NICs, judged against the order's fabric (steps/nccl/network.py)
Mode = Literal["normal", "network"]
MODES: tuple[str, ...] = ("normal", "network")
# the collectives a fleet job can run: those both of its engines have (nccl-tests'
# `<name>_perf`, the torch benchmark's --op)
FleetCollective = Literal["all_reduce", "all_gather", "reduce_scatter", "alltoall"]
FLEET_COLLECTIVES: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "alltoall")


def _distinct(v: tuple[str, ...], what: str, known: tuple[str, ...]) -> tuple[str, ...]:
    if not v:
        raise ValueError(f"name at least one {what} (" + ", ".join(known) + ")")
    twice = sorted({c for c in v if v.count(c) > 1})
    if twice:
        raise ValueError(f"{', '.join(twice)} named more than once")
    return v


class NcclParams(_M):
    source: NcclTestsSource = NcclTestsSource()
    binary: str = "all_reduce_perf"
    # run in this order, each with the same rounds and parameters, single- and multi-node
    collectives: tuple[Collective, ...] = ("all_reduce",)
    # each mode runs every collective above; `network` alone measures the NICs only
    modes: tuple[Mode, ...] = ("normal",)
    min_bytes: str = "8"
    max_bytes: str = "128M"
    step_factor: int = Field(default=2, ge=2)
    iters: int = Field(default=20, ge=1)
    warmup_iters: int = Field(default=5, ge=0)
    check: int = Field(default=1, ge=0)
    rounds: int = Field(default=3, ge=1)
    datatype: str = "float"
    op: str = "sum"
    ring_only: bool = False
    timeout_s: float = Field(default=900.0, gt=0)
    build_timeout_s: float = Field(default=1800.0, gt=0)
    drop_tolerance: float = Field(default=0.10, ge=0, le=1)

    @field_validator("min_bytes", "max_bytes")
    @classmethod
    def _size(cls, v: str) -> str:
        parse_size(v)  # a typo is caught here, not by nccl-tests on every node
        return v

    @field_validator("collectives")
    @classmethod
    def _collectives(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return _distinct(v, "collective", COLLECTIVES)

    @field_validator("modes")
    @classmethod
    def _modes(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return _distinct(v, "mode", MODES)


class TrainThresholds(_M):
    """When a training run's numbers become findings."""

    straggler_ratio: float = Field(default=1.15, gt=1)  # a rank's forward time vs the median
    gpu_idle_util_pct: float = Field(default=10.0, ge=0, le=100)  # median SM % while training
    input_bound_share: float = Field(default=0.10, gt=0, le=1)  # data wait / step time
    loss_drop_min: float = Field(default=0.0, ge=0)  # last quarter must be below the first by this
    power_violation_pct: float = Field(default=5.0, ge=0, le=100)  # dmon pviol, any sample


class TrainParams(_M):
    """The training step: model, optimisation, the save/kill/restore protocol.

    `model` picks a preset (payload/train/config.py); the dimension fields
    override it. Steps are optimizer steps: the checkpoint is saved after step
    `ckpt_step` (K); the kill comes `kill_offset` steps later (after that step, or
    in the save made then); the restore runs to `steps` (N).
    """

    model: Literal["tiny", "350m", "1b"] = "1b"
    d_model: int | None = Field(default=None, ge=8)
    n_layers: int | None = Field(default=None, ge=1)
    n_heads: int | None = Field(default=None, ge=1)
    vocab_size: int | None = Field(default=None, ge=16)
    seq_len: int | None = Field(default=None, ge=8)
    micro_batch: int | None = Field(default=None, ge=1)
    grad_accum: int = Field(default=1, ge=1)
    steps: int = Field(default=20, ge=3)
    ckpt_step: int = Field(default=8, ge=1)
    kill: Literal["after-step", "mid-save", "before-manifest"] = "before-manifest"
    kill_offset: int = Field(default=2, ge=1)
    lr: float = Field(default=3e-4, gt=0)
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1)
    warmup_steps: int = Field(default=5, ge=0)
    weight_decay: float = Field(default=0.1, ge=0)
    beta1: float = Field(default=0.9, ge=0, lt=1)
    beta2: float = Field(default=0.95, ge=0, lt=1)
    grad_clip: float = Field(default=1.0, ge=0)
    dropout: float = Field(default=0.0, ge=0, lt=1)
    seed: int = 1234
    dtype: Literal["bf16", "fp32"] = "bf16"  # autocast on GPU; CPU runs fp32
    compile: bool = True  # torch.compile on GPU; never on CPU
    deterministic: bool = True
    # after the reference's verified steps, this many timed steps on the fastest
    # (non-deterministic) kernels: the speed a training job gets; 0 times the verified ones
    throughput_steps: int = Field(default=10, ge=0)
    parallel: Literal["auto", "ddp", "fsdp"] = "auto"
    cpu_procs_per_node: int = Field(default=2, ge=1, le=64)  # ranks on a node without GPUs
    stats_skip_steps: int = Field(default=3, ge=0)  # first steps left out of step-time stats
    # relative, applied only where a run cannot be exact (an op without a deterministic
    # kernel, or deterministic: false); an exact run must match bit for bit
    loss_tolerance: float = Field(default=1e-4, ge=0)
    manifest_delay_s: float = Field(default=2.0, ge=0)  # holds the killed save open
    collective_timeout_s: float = Field(default=300.0, gt=0)
    timeout_s: float = Field(default=900.0, gt=0)  # per phase
    telemetry_interval_s: int = Field(default=1, ge=1)
    keep_checkpoints: bool = False
    inject_nan_at_step: int | None = Field(default=None, ge=1)  # a test of the NaN finding
    peak_tflops: dict[str, float] = Field(default_factory=dict)  # per provider: dense bf16 peak
    thresholds: TrainThresholds = TrainThresholds()
    # bring your own task: run this command under the same harness instead
    command: str | None = None
    resume_flag: str | None = None  # appended to `command` when it is relaunched
    command_kill_after_step: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _protocol_fits(self) -> TrainParams:
        if self.command is None:
            if self.ckpt_step + self.kill_offset >= self.steps:
                raise ValueError(f"ckpt_step + kill_offset ({self.ckpt_step} + "
                                 f"{self.kill_offset}) must stay below steps ({self.steps})")
            dims = {**PRESETS[self.model], **{k: v for k, v in self.model_dump().items()
                                                 if k in PRESETS[self.model] and v is not None}}
            if dims["d_model"] % dims["n_heads"]:
                raise ValueError(f"d_model {dims['d_model']} is not a multiple of n_heads "
                                 f"{dims['n_heads']}")
        if (self.command_kill_after_step is not None) != (self.resume_flag is not None):
            raise ValueError("the restore contract needs both resume_flag and "
                             "command_kill_after_step")
        return self

    @property
    def kill_step(self) -> int:
        return self.ckpt_step + self.kill_offset

    def payload_params(self) -> dict[str, object]:
        """What the rank program reads (payload/train/config.py DEFAULTS)."""
        keys = ("model", "d_model", "n_layers", "n_heads", "vocab_size", "seq_len",
                "micro_batch", "grad_accum", "steps", "ckpt_step", "lr", "min_lr_ratio",
                "warmup_steps", "weight_decay", "beta1", "beta2", "grad_clip", "dropout", "seed",
                "dtype", "compile", "deterministic", "throughput_steps", "parallel", "collective_timeout_s",
                "inject_nan_at_step", "manifest_delay_s")
        dump = self.model_dump(mode="json")
        # the kept save's hashing overlaps the next save's writes only where the kill
        # lands at that next save's commit: with a kill at a step or at a save's start
        # the kept checkpoint's manifest must be on disk first
        return {**{k: dump[k] for k in keys}, "manifest_behind": self.kill == "before-manifest"}


class FleetParams(_M):
    """The fleet step (`gpuvet fleet`, the pipeline's `fleet` step): which node, which link.

    Every pair (group, the whole fleet) runs each of `collectives` in turn (all_reduce
    unless it says more) from `min_bytes` to `max_bytes`; per collective, a pair more than
    `tolerance` below the fleet's median pair of that collective, at most of the sizes
    from `min_judged_bytes` up, is slow.
    """

    engine: Literal["nccl-tests", "torch"] = "nccl-tests"
    plan: Literal["pairs", "groups", "ring"] = "pairs"
    partners: int = Field(default=2, ge=1, le=16)  # partners each node meets in pairs
    repair_partners: int = Field(default=2, ge=1, le=16)  # passed nodes each suspect meets
    seed: int = Field(default=0, ge=0)
    min_bytes: str = "16M"
    max_bytes: str = "1G"
    step_factor: int = Field(default=4, ge=2)
    iters: int = Field(default=20, ge=1)
    warmup_iters: int = Field(default=5, ge=0)
    check: int = Field(default=1, ge=0)  # check the all_reduce's result (0: time only)
    min_judged_bytes: str = "16M"
    tolerance: float = Field(default=0.2, gt=0, lt=1)
    timeout_s: float = Field(default=600.0, gt=0)  # per job
    # a job whose rank-0 output has not grown for this long is hung (a collective or the
    # set-up waiting on a peer that will never answer): it is killed and recorded failed,
    # and the plan goes on without waiting for `timeout_s`
    stall_timeout_s: float = Field(default=120.0, gt=0)
    # torch engine: a rank gives up on a peer that stops answering after this long
    collective_timeout_s: float = Field(default=300.0, gt=0)
    master_port: int = Field(default=29600, ge=1024, le=60000)  # torch engine: base port
    straggler_iters: int = Field(default=20, ge=1)
    rdma: bool = True  # ib_write_bw per HCA between partners where perftest is installed
    rdma_seconds: int = Field(default=5, ge=1, le=600)
    # each rail through NCCL too: one nccl-tests run per HCA between first-round partners,
    # NCCL_IB_HCA set to that HCA on each node (the nccl-tests engine only)
    rails_nccl: bool = False
    # run by every job in this order, each localised on its own (a node slow in alltoall
    # only, a bad rail or adaptive routing off, is named while all_reduce clears it)
    collectives: tuple[FleetCollective, ...] = ("all_reduce",)

    @field_validator("collectives")
    @classmethod
    def _collectives(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return _distinct(v, "collective", FLEET_COLLECTIVES)

    @field_validator("min_bytes", "max_bytes", "min_judged_bytes")
    @classmethod
    def _size(cls, v: str) -> str:
        parse_size(v)
        return v


class HealthParams(_M):
    """The health step: the level (quick, standard, burn) and its windows.

    `sustain_s` and `memtest_s` override the level's sustained window and memory
    test time; `timeout_s` bounds one node's whole run (default by level)."""

    level: Literal["quick", "standard", "burn"] = "standard"
    sustain_s: float | None = Field(default=None, ge=0)
    memtest_s: float | None = Field(default=None, ge=0)
    timeout_s: float | None = Field(default=None, gt=0)
    keep_remote: bool = False  # leave the node's output folder on the node

    def timeout(self) -> float:
        if self.timeout_s is not None:
            return self.timeout_s
        extra = 3 * ((self.sustain_s or 0) + (self.memtest_s or 0))
        return {"quick": 300.0, "standard": 900.0, "burn": 3600.0}[self.level] + extra


# sections added to the suite after runs were stored: at their defaults they stay out of
# the suite hash (Suite.hash)
LATER_SECTIONS = ("health", "fleet")
# fields added to a section after runs were stored: at their defaults they stay out of the
# suite hash too (a suite that runs all_reduce only keeps the hash it had)
LATER_FIELDS: tuple[tuple[str, str], ...] = (("nccl", "collectives"), ("nccl", "modes"),
                                             ("fleet", "stall_timeout_s"),
                                             ("fleet", "rails_nccl"),
                                             ("fleet", "collectives"))


class Suite(_M):
    name: str = "default"
    preflight: PreflightParams = PreflightParams()
    health: HealthParams = HealthParams()
    nccl: NcclParams = NcclParams()
    train: TrainParams = TrainParams()
    # None: the suite says nothing about the fleet step (the pipeline leaves it out and
    # `gpuvet fleet` uses the defaults); left out of the hash then, so suites written
    # before the step existed keep their hash
    fleet: FleetParams | None = None

    @property
    def fleet_params(self) -> FleetParams:
        return self.fleet or FleetParams()

    @property
    def hash(self) -> str:
        """The suite's identity for baselines and regress. A section added after runs were
        stored (LATER_SECTIONS) enters it only when it differs from its defaults, so a
        suite that leaves it alone keeps the hash, and the baseline, it had before."""
        dump = self.model_dump(mode="json")
        for name in LATER_SECTIONS:
            if name in dump and getattr(self, name) == type(self).model_fields[name].get_default(
                    call_default_factory=True):
                del dump[name]
        for section, fld in LATER_FIELDS:
            params = getattr(self, section)
            if params is None or not isinstance(dump.get(section), dict):
                continue  # a section left out (fleet: None) or already dropped above
            if getattr(params, fld) == type(params).model_fields[fld].get_default(
                    call_default_factory=True):
                dump[section].pop(fld, None)
        blob = json.dumps(dump, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def load_suite(path: Path | None) -> Suite:
    """The suite file, read with the inventory's limits (`inventory.reader`): a regular file
    of at most 128 KiB, UTF-8 without control characters, nesting and aliases bounded (an
    alias bomb is refused in milliseconds, not after gigabytes), one document; a duplicate
    key or a YAML tag is named with its line."""
    if path is None:
        return Suite()
    name = shown(str(path))
    try:
        source = Source(read_text(path, what="a suite"), what="a suite")
    except Refused as exc:
        if exc.problem.msg == "no such file":
            raise UsageError(f"no such suite file: {name}") from None
        line = f":{exc.problem.line}" if exc.problem.line is not None else ""
        raise UsageError(f"suite {name}{line}: {exc.problem.msg}",
                         hint="see docs/reliability.md (limits)") from None
    if source.problems:
        first = source.problems[0]
        more = f" (and {len(source.problems) - 1} more)" if len(source.problems) > 1 else ""
        raise UsageError(f"suite {name}:{first.line}: {first.msg}{more}")
    try:
        data = source.data if source.data is not None else {}
        return Suite.model_validate(data)
    except Exception as exc:
        raise UsageError(f"suite {path} is invalid: {_problems(exc)}") from None


def _problems(exc: Exception) -> str:
    """What is wrong with a suite, without the values it quotes: pydantic cuts a long
    value to its ends (`'env HF_TO...123 python t.py'`), and a cut token is no longer
    one the scrubber knows, so each problem is its place and message only."""
    if not isinstance(exc, ValidationError):
        return scrub_text(str(exc))
    return "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
                     for e in exc.errors(include_input=False, include_url=False))
