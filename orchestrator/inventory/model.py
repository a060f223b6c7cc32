"""The inventory's schema: providers, their nodes, what was ordered and what it costs.

Every model forbids unknown keys, so a misspelt key is a problem at its line
rather than a setting silently ignored. Numbers are strict: ``port: true`` is
not port 1 and ``gpu_hour: .nan`` is not a price.

Values that reach ssh or a shell are checked here, once, for every place
that sets them: hosts must be a hostname, an IPv4/IPv6 address or an
ssh_config alias, never something ssh would read as an option; paths and
programs must not start with '-'; user and environment variable names are
the characters those allow. The models hold the document as written; the
merged view executors use is ``nodes.Node``.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

from orchestrator.bands import Band

ExecutorName = Literal["ssh", "local", "ray", "slurm"]
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"

# --- values that reach ssh or a shell ------------------------------------------------------

_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_USER_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@-]{0,63}\Z")
_LABEL_RE = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?\Z")
_SHELL_CHARS = frozenset(";&|`$<>()\\'\"*?!{}[]#~^,=")


def _not_blank(v: str) -> str:
    """An empty or padded value is a typo, and ssh or a shell would get it as written."""
    if not v.strip():
        raise ValueError("must not be empty")
    if v != v.strip():
        raise ValueError(f"{v!r} has leading or trailing spaces")
    return v


def path_like(v: str) -> str:
    """A path or program: a leading '-' would be read as an option by the command it reaches."""
    _not_blank(v)
    if v.startswith("-"):
        raise ValueError(f"{v!r} starts with '-', which a command would read as an option")
    return v


def _host(v: str) -> str:
    """A host as ssh gets it: a hostname, an IPv4/IPv6 address or an ssh_config alias.

    Nothing else, because the value reaches ssh, ssh_config lookups and command
    lines on the nodes (mpirun's -H): a '-' would be read as an option, '@' as
    a user, a space or ';' as a second word.
    """
    _not_blank(v)
    if v.startswith("-"):
        raise ValueError(f"{v!r} starts with '-', which ssh would read as an option")
    if "@" in v:
        raise ValueError(f"{v!r} holds '@': put the user in `user:`")
    bad = sorted({c for c in v if c.isspace() or c in _SHELL_CHARS or not c.isprintable()})
    if bad:
        raise ValueError(f"{v!r} holds {' '.join(repr(c) for c in bad)}: a host is a hostname, "
                         "an IP address or an ssh_config alias")
    if ":" in v:
        try:
            ipaddress.IPv6Address(v)
        except ValueError:
            raise ValueError(f"{v!r} is not a valid IPv6 address") from None
        return v
    if re.fullmatch(r"[0-9.]+", v):
        try:
            ipaddress.IPv4Address(v)
        except ValueError:
            raise ValueError(f"{v!r} is not a valid IPv4 address") from None
        return v
    name = v[:-1] if v.endswith(".") else v
    if len(name) > 253 or not all(_LABEL_RE.match(label) for label in name.split(".")):
        raise ValueError(f"{v!r} is not a hostname, an IP address or an ssh_config alias "
                         "(letters, digits, '-', '_' in dot-separated labels)")
    return v


def _user(v: str) -> str:
    """A login name ssh accepts on its command line; never an option."""
    _not_blank(v)
    if not _USER_RE.match(v):
        raise ValueError(f"{v!r} is not a user name (letters, digits, '_', '.', '@', '-'; "
                         "not starting with '-')")
    return v


def _env_name(v: str) -> str:
    """The names a shell can export: the value is quoted, the name cannot be."""
    if not _ENV_NAME_RE.match(v):
        raise ValueError(f"{v!r} is not an environment variable name (letters, digits and '_', "
                         "not starting with a digit)")
    return v


def _ray_address(v: str) -> str:
    """What ray.init takes: 'auto' or a [ray://]HOST:PORT whose host passes ``_host``."""
    if v == "auto":
        return v
    hostport = v[len("ray://"):] if v.startswith("ray://") else v
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"{v!r} is not 'auto', HOST:PORT or ray://HOST:PORT")
    _host(host[1:-1] if host.startswith("[") and host.endswith("]") else host)
    return v


def _slurm_word(v: str) -> str:
    """A partition, account, qos or reservation name (a comma list for several): the
    characters Slurm's names use. It reaches srun/salloc as one argv word, quoted where it
    passes a shell (the SSH hop to a login node)."""
    _not_blank(v)
    if not _SLURM_WORD_RE.match(v):
        raise ValueError(f"{v!r} is not a Slurm name (letters, digits, '_', '.', '-'; "
                         "several separated by ','; not starting with '-')")
    return v


def _slurm_constraint(v: str) -> str:
    """A --constraint expression: features joined by & | , with [ ] ( ) and *N counts."""
    _not_blank(v)
    if not _SLURM_CONSTRAINT_RE.match(v):
        raise ValueError(f"{v!r} is not a Slurm constraint (feature names joined by "
                         "'&', '|' or ',', with '[ ]', '( )' and '*N' counts)")
    return v


def _slurm_time(v: str) -> str:
    """A time limit as Slurm writes one: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS."""
    _not_blank(v)
    if not _SLURM_TIME_RE.match(v):
        raise ValueError(f"{v!r} is not a Slurm time limit (minutes, MM:SS, HH:MM:SS, D-HH, "
                         "D-HH:MM or D-HH:MM:SS)")
    return v


_SLURM_WORD_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}(?:,[A-Za-z0-9_][A-Za-z0-9_.-]{0,63})*\Z")
_SLURM_CONSTRAINT_RE = re.compile(r"[A-Za-z0-9_\[(][A-Za-z0-9_.&|,\[\]()*-]{0,255}\Z")
_SLURM_TIME_RE = re.compile(r"(?:\d{1,4}-\d{1,2}(?::\d{1,2}){0,2}|\d{1,7}(?::\d{1,2}){0,2})\Z")

Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
PathStr = Annotated[str, AfterValidator(path_like)]
HostStr = Annotated[str, AfterValidator(_host)]
UserStr = Annotated[str, AfterValidator(_user)]
EnvName = Annotated[str, AfterValidator(_env_name)]


# --- the document as written ---------------------------------------------------------------

class _Model(BaseModel):
    # strict: YAML's true/false are not numbers and numbers are not strings
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class Access(_Model):
    """How to reach a node; set per provider (defaults) and per node (overrides)."""

    host: HostStr | None = None
    port: int | None = Field(default=None, ge=1, le=65535)
    user: UserStr | None = None
    identity_file: PathStr | None = None
    ssh_alias: HostStr | None = None
    proxy_jump: Name | None = None
    python: PathStr | None = None
    work_dir: PathStr | None = None
    ckpt_dir: PathStr | None = None
    env: dict[EnvName, str] | None = None
    connect_timeout_s: float | None = Field(default=None, gt=0, le=3600)


class Fabric(_Model):
    """The network between nodes that was ordered."""

    type: Literal["ib", "roce", "efa", "ethernet", "none"] = "none"
    nics: int | None = Field(default=None, ge=0)
    rate_gbps: float | None = Field(default=None, gt=0)
    # GPUDirect RDMA (the NIC reads and writes GPU memory): true makes its absence in the
    # nccl step's network mode a FAIL; None says nothing (an INFO fact)
    gpudirect: bool | None = None

    @model_validator(mode="after")
    def _gpudirect_needs_rdma(self) -> Fabric:
        if self.gpudirect and self.type not in ("ib", "roce", "efa"):
            raise ValueError(f"gpudirect: true needs an RDMA fabric (type ib, roce or efa), "
                             f"not {self.type}")
        return self


class PcieExpectation(_Model):
    """The PCIe link each GPU was promised: a GPU that trained down is a finding."""

    min_gen: int | None = Field(default=None, ge=1, le=6)
    min_width: int | None = Field(default=None, ge=1, le=32)


class Expectations(_Model):
    """What was ordered. Every field is optional: unset means 'not checked'."""

    gpu_model: str | None = None
    gpus_per_node: int | None = Field(default=None, ge=1)
    memory_per_gpu_gb: float | None = Field(default=None, gt=0)
    form_factor: Literal["sxm", "pcie"] | None = None
    interconnect: Literal["nvswitch", "nvlink", "pcie"] | None = None
    mig_allowed: bool = False
    fabric: Fabric = Fabric()
    pcie: PcieExpectation = PcieExpectation()
    needs_fp8: bool = False  # the health step fails a GPU without FP8 (compute capability < 8.9)
    # overrides the shipped reference bands: one band or a list, each for one message size
    nccl_busbw: Band | list[Band] | None = None


class Pricing(_Model):
    """What the provider charges: the cost of each result in compare and report."""

    gpu_hour: float = Field(ge=0)
    currency: str = Field(default="USD", pattern=r"^[A-Z]{3}$")
    billing_granularity: Literal["second", "minute", "hour", "day", "month"] = "hour"
    node_month: float | None = Field(default=None, ge=0)
    storage_gb_month: float | None = Field(default=None, ge=0)
    egress_gb: float | None = Field(default=None, ge=0)
    # when the rental's billing started (the instance created), ISO 8601 with a zone:
    # overrides the start of the billed window (else the nodes' boot time, else the runs')
    billed_since: str | None = Field(
        default=None, pattern=r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2})?(Z|[+-]\d{2}:\d{2})$")
    retention_days: float | None = Field(default=None, ge=0)  # how long checkpoints are kept
    dataset_gb: float | None = Field(default=None, ge=0)  # the dataset kept and downloaded
    download_gb: float | None = Field(default=None, ge=0)  # models and other downloads


class RayOptions(_Model):
    """Where the Ray cluster of an ``executor: ray`` provider is."""

    address: Annotated[str, AfterValidator(_ray_address)] = "auto"


def _whole_number_as_text(v: Any) -> Any:
    """`job_id: 123456` and `time_limit: 90` as people write them: a whole number is
    the same text (never a boolean: `true` stays an error)."""
    if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
        return str(v)
    return v


SlurmWord = Annotated[str, AfterValidator(_slurm_word)]


class SlurmLogin(_Model):
    """The login node Slurm's client commands run on, reached over SSH (as a node is)."""

    host: HostStr
    port: int = Field(default=22, ge=1, le=65535)
    user: UserStr | None = None
    identity_file: PathStr | None = None
    proxy_jump: Name | None = None
    connect_timeout_s: float = Field(default=10.0, gt=0, le=3600)


class SlurmOptions(_Model):
    """How an ``executor: slurm`` provider reaches its scheduler and what it asks for.

    Without ``login`` the client commands run where gpuvet runs (a login node). Without
    ``job_id`` gpuvet asks for an allocation (salloc) and releases it when the run ends,
    unless it runs inside one (SLURM_JOB_ID, with a local client): that one is used, and
    like ``job_id``'s it is never cancelled.
    """

    login: SlurmLogin | None = None
    slurm_conf: PathStr | None = None  # SLURM_CONF for the client commands
    partition: SlurmWord | None = None
    account: SlurmWord | None = None
    qos: SlurmWord | None = None
    reservation: SlurmWord | None = None
    constraint: Annotated[str, AfterValidator(_slurm_constraint)] | None = None
    nodes: int | None = Field(default=None, ge=1, le=100000)
    gpus_per_node: int | None = Field(default=None, ge=1, le=64)
    time_limit: Annotated[str, BeforeValidator(_whole_number_as_text),
                          AfterValidator(_slurm_time)] | None = None  # minutes, or D-HH:MM:SS
    job_id: Annotated[str, BeforeValidator(_whole_number_as_text),
                      StringConstraints(pattern=r"^[0-9]{1,12}$")] | None = None

    @model_validator(mode="after")
    def _existing_or_asked(self) -> SlurmOptions:
        asked = [k for k in ("partition", "account", "qos", "reservation", "constraint",
                             "nodes", "gpus_per_node", "time_limit") if getattr(self, k)]
        if self.job_id is not None and asked:
            raise ValueError(f"job_id names an existing allocation; {', '.join(asked)} "
                             "would ask for a new one: keep one or the other")
        return self


class NodeSpec(Access):
    """A node as written: its name and the Access keys it sets over its provider's."""

    name: Name


class Provider(_Model):
    """One seller's nodes, with the access defaults and the order (``expect``) they share."""

    name: Name  # always its key in `providers`
    executor: ExecutorName = "ssh"
    access: Access = Access()
    expect: Expectations = Expectations()
    pricing: Pricing | None = None
    ray: RayOptions | None = None
    slurm: SlurmOptions | None = None
    # required except for ``executor: slurm``, whose nodes come from the allocation
    nodes: list[NodeSpec] = []

    @model_validator(mode="after")
    def _nodes_or_allocation(self) -> Provider:
        if self.executor == "slurm":
            if self.slurm is None:
                raise ValueError("executor slurm needs a `slurm:` block (at least `{}` for a "
                                 "local client and an allocation of the defaults)")
            if self.nodes:
                raise ValueError("the nodes of an executor slurm provider come from its "
                                 "allocation: drop `nodes:` (ask for a count with "
                                 "slurm.nodes)")
        elif self.slurm is not None:
            raise ValueError(f"a `slurm:` block needs `executor: slurm` (this provider's is "
                             f"{self.executor})")
        elif not self.nodes:
            raise ValueError("at least one node is needed under `nodes:`")
        return self


class JumpHost(_Model):
    """A bastion that ``proxy_jump`` names (a node may be named there too)."""

    host: HostStr
    port: int = Field(default=22, ge=1, le=65535)
    user: UserStr | None = None
    identity_file: PathStr | None = None


class Settings(_Model):
    """Settings of the whole file: ssh's files, nodes worked on at once, exchange rates."""

    known_hosts: PathStr = DEFAULT_KNOWN_HOSTS
    ssh_config: PathStr | None = None
    concurrency: int = Field(default=32, ge=1, le=1024)
    # exchange rates for comparing prices: one unit of the key currency is this many of
    # the first compared provider's currency (`gpuvet compare`, `gpuvet report`)
    rates: dict[Annotated[str, StringConstraints(pattern=r"^[A-Z]{3}$")],
                Annotated[float, Field(gt=0, allow_inf_nan=False)]] = {}


class InventoryFile(_Model):
    """The document as written: providers keyed by name."""

    version: Literal[1] = 1
    settings: Settings = Settings()
    jump_hosts: dict[Name, JumpHost] = {}
    providers: dict[str, Provider]

    @model_validator(mode="before")
    @classmethod
    def _names_from_keys(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("providers"), dict):
            provs = {}
            for key, prov in data["providers"].items():
                if isinstance(prov, dict) and "name" not in prov:
                    prov = {"name": key, **prov}
                provs[key] = prov
            data = {**data, "providers": provs}
        return data

    @field_validator("version", mode="before")
    @classmethod
    def _version_not_bool(cls, v: Any) -> Any:
        if isinstance(v, bool):  # True == 1 would pass Literal[1]
            raise ValueError(f"version must be the number 1, got {str(v).lower()}")
        return v

    @field_validator("providers")
    @classmethod
    def _not_empty(cls, v: dict[str, Provider]) -> dict[str, Provider]:
        if not v:
            raise ValueError("at least one provider is needed")
        return v
