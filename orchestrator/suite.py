"""The parameters of a run. Their hash makes runs comparable.

Two runs are compared only when their suite hashes match: a different message
size range or iteration count is a different experiment, not a regression.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from orchestrator.errors import UsageError
from payload.allreduce import parse_size

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


class NcclParams(_M):
    source: NcclTestsSource = NcclTestsSource()
    binary: str = "all_reduce_perf"
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


class Suite(_M):
    name: str = "default"
    preflight: PreflightParams = PreflightParams()
    nccl: NcclParams = NcclParams()

    @property
    def hash(self) -> str:
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def load_suite(path: Path | None) -> Suite:
    if path is None:
        return Suite()
    if not path.is_file():
        raise UsageError(f"no such suite file: {path}")
    from ruamel.yaml import YAML

    try:
        data = YAML(typ="safe").load(path.read_text()) or {}
        return Suite.model_validate(data)
    except Exception as exc:
        raise UsageError(f"suite {path} is invalid: {exc}") from None
