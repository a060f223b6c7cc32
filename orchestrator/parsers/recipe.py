"""The small outputs the acceptance recipe saves beside the big ones.

The PyTorch check the recipe runs by hand (`torch_version: ...` lines, then one
Python dict per GPU), `/proc/mounts`, `nvidia-smi --version`, the nccl-tests
commit, the date, `pip list` / `pip freeze`, and a `command not found` saved in
place of an output. Each is read strictly: a line that is not of its shape is a
ParseError naming it, so a file of another kind is never taken for one of
these.
"""

from __future__ import annotations

import ast
import datetime as dt
import re
from typing import Any

from pydantic import BaseModel, ConfigDict

from orchestrator.errors import ParseError
from orchestrator.parsers import register
from orchestrator.parsers._noise import IgnoredLine, NoiseReader
from orchestrator.parsers.system import TorchDevice, TorchInfoFacts


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _lines(kind: str, text: str, source: str | None) -> list[tuple[int, str]]:
    lines = [(n, ln) for n, ln in enumerate(text.splitlines(), 1) if ln.strip()]
    if not lines:
        raise ParseError(kind, "empty output", source=source)
    return lines


# --------------------------------------------------------------------------- PyTorch check

class TorchCheckFacts(TorchInfoFacts):
    """The recipe's PyTorch check: what PyTorch sees, as the payload's probe says it.

    Memory is printed in GiB rounded to two decimals, so `memory_bytes` is good to
    about 5 MiB; the lines the check did not print (warnings) are listed.
    """

    ignored_lines: list[IgnoredLine] = []


_TORCH_KEYS = {"torch_version": "torch", "torch_cuda": "cuda", "cuda_available": "available",
               "device_count": "count"}
_TORCH_LINE = re.compile(r"(?P<key>torch_version|torch_cuda|cuda_available|device_count):"
                         r"\s*(?P<val>.*?)\s*")


def _device(no: int, line: str, source: str | None) -> TorchDevice:
    kind = "torch-check"
    try:
        d = ast.literal_eval(line.strip())  # a literal only: no name, call or attribute
    except (ValueError, SyntaxError):
        raise ParseError(kind, "not a Python dict literal", line_no=no, line=line,
                         source=source) from None
    keys = {"index", "name", "memory_gib", "compute_capability"}
    if not isinstance(d, dict) or set(d) != keys:
        raise ParseError(kind, f"a device line holds {', '.join(sorted(keys))}", line_no=no,
                         line=line, source=source)
    cc, gib = d["compute_capability"], d["memory_gib"]
    if (not isinstance(d["index"], int) or not isinstance(d["name"], str)
            or not isinstance(gib, (int, float)) or not isinstance(cc, tuple) or len(cc) != 2
            or not all(isinstance(c, int) for c in cc)):
        raise ParseError(kind, "a device value has the wrong type", line_no=no, line=line,
                         source=source)
    return TorchDevice(index=d["index"], name=d["name"], memory_bytes=round(gib * 2**30),
                       cc=list(cc))


def parse_torch_check(text: str, source: str | None = None) -> TorchCheckFacts:
    kind = "torch-check"
    values: dict[str, Any] = {}
    devices: list[TorchDevice] = []
    noise = NoiseReader()
    for no, line in _lines(kind, text, source):
        m = _TORCH_LINE.fullmatch(line.strip())
        if m:
            if devices:
                raise ParseError(kind, f"{m['key']} after the device lines", line_no=no,
                                 line=line, source=source)
            values[_TORCH_KEYS[m["key"]]] = m["val"]
        elif line.lstrip().startswith("{"):
            devices.append(_device(no, line, source))
        elif not values:
            # warnings PyTorch prints before the check's first line
            if not noise.skip(no, line):
                noise.ignore(no, "unknown", line)
        else:
            raise ParseError(kind, "not a line of the PyTorch check", line_no=no, line=line,
                             source=source)
    missing = [k for k in _TORCH_KEYS if _TORCH_KEYS[k] not in values]
    if missing:
        raise ParseError(kind, f"no `{missing[0]}:` line", source=source)
    if values["available"] not in ("True", "False") or not values["count"].isdigit():
        raise ParseError(kind, "cuda_available is True/False and device_count a count",
                         source=source)
    count = int(values["count"])
    if count != len(devices):
        raise ParseError(kind, f"device_count is {count} but {len(devices)} device line(s) "
                         "follow: the output was cut", source=source)
    return TorchCheckFacts(torch=values["torch"],
                           cuda=None if values["cuda"] == "None" else values["cuda"],
                           nccl=None, available=values["available"] == "True", count=count,
                           devices=devices, ignored_lines=noise.ignored)


register("torch-check", "the recipe's PyTorch check: version, CUDA, count, each GPU's "
         "name, memory and capability",
         example="python3 - <<'PY' | tee torch.txt  (the recipe's `import torch` check)")(parse_torch_check)


# --------------------------------------------------------------------------- /proc/mounts

class Mount(_Model):
    device: str
    mount_point: str
    fstype: str
    options: list[str]


class MountsFacts(_Model):
    mounts: list[Mount]

    def of(self, path: str) -> Mount | None:
        """The mount holding `path`: the longest mount point above it (the last one wins)."""
        best: Mount | None = None
        for m in self.mounts:
            mp = m.mount_point
            inside = mp == "/" or path == mp or path.startswith(mp.rstrip("/") + "/")
            if inside and (best is None or len(mp) >= len(best.mount_point)):
                best = m
        return best


_MOUNT = re.compile(r"(?P<dev>\S+) (?P<mp>/\S*) (?P<fs>\S+) (?P<opts>\S+) \d+ \d+")


def parse_mounts(text: str, source: str | None = None) -> MountsFacts:
    mounts = []
    for no, line in _lines("mounts", text, source):
        m = _MOUNT.fullmatch(line.strip())
        if m is None:
            raise ParseError("mounts", "not a /proc/mounts line (device, mount point, type, "
                             "options, 0, 0)", line_no=no, line=line, source=source)
        # /proc/mounts escapes blanks in paths as \040
        mounts.append(Mount(device=m["dev"], mount_point=m["mp"].replace("\\040", " "),
                            fstype=m["fs"], options=m["opts"].split(",")))
    return MountsFacts(mounts=mounts)


register("mounts", "/proc/mounts: every mount's device, mount point, type and options",
         example="cat /proc/mounts | tee mounts.txt")(parse_mounts)


# --------------------------------------------------------------------------- small outputs

class SmiVersionFacts(_Model):
    """`nvidia-smi --version` (drivers 535+)."""

    nvidia_smi: str
    driver: str | None
    cuda: str | None
    fields: dict[str, str]


class CommitFacts(_Model):
    """The nccl-tests commit written next to the logs (`git rev-parse HEAD`, `git log -1`)."""

    commit: str


class CheckedAtFacts(_Model):
    """When the PoC outputs were taken (`date`, `date -Iseconds`)."""

    text: str
    iso: str


class PipFacts(_Model):
    """`pip list` / `pip freeze`: the versions that decide what a job runs with."""

    packages: dict[str, str]

    @property
    def torch(self) -> str | None:
        return self.packages.get("torch")

    @property
    def nccl(self) -> str | None:
        return next((v for k, v in sorted(self.packages.items())
                     if re.fullmatch(r"nvidia-nccl-cu\d+", k)), None)


class MissingCommandFacts(_Model):
    """`sh: ibv_devinfo: command not found` saved in place of the output."""

    command: str
    text: str


def parse_smi_version(text: str, source: str | None = None) -> SmiVersionFacts:
    fields: dict[str, str] = {}
    for no, line in _lines("nvidia-smi-version", text, source):
        m = re.fullmatch(r"\s*([A-Za-z][\w -]*?)\s*:\s*(.*?)\s*", line)
        if m is None:
            raise ParseError("nvidia-smi-version", "not `Key : value`", line_no=no, line=line,
                             source=source)
        fields[m.group(1).lower()] = m.group(2)
    if "nvidia-smi version" not in fields:
        raise ParseError("nvidia-smi-version", "no `NVIDIA-SMI version :` line", source=source)
    return SmiVersionFacts(nvidia_smi=fields["nvidia-smi version"],
                           driver=fields.get("driver version"), cuda=fields.get("cuda version"),
                           fields=fields)


register("nvidia-smi-version", "nvidia-smi --version: nvidia-smi, NVML, driver and CUDA",
         example="nvidia-smi --version | tee nvidia-smi-version.txt")(parse_smi_version)


_COMMIT = re.compile(r"(?:commit\s+)?(?=[0-9a-f]*[a-f])([0-9a-f]{7,40})\b(?:\s.*)?")


def parse_commit(text: str, source: str | None = None) -> CommitFacts:
    lines = _lines("commit", text, source)
    no, first = lines[0]
    m = _COMMIT.fullmatch(first.strip())
    if m is None:
        raise ParseError("commit", "not a git commit hash", line_no=no, line=first, source=source)
    for no, line in lines[1:]:  # `git log -1`: the header lines, then the indented message
        if not re.match(r"(Author|AuthorDate|Commit|CommitDate|Date|Merge):|\s", line):
            raise ParseError("commit", "more than one commit line", line_no=no, line=line,
                             source=source)
    return CommitFacts(commit=m.group(1))


register("commit", "the nccl-tests commit (git rev-parse HEAD, or git log -1)",
         example="git rev-parse HEAD | tee commit.txt")(parse_commit)


# `date`'s zone name (UTC, CET, PDT): before the year (C locale) or after AM/PM (en_US)
_TZ_NAME = re.compile(r"\s[A-Z]{2,5}(?=\s\d{4}$)|(?<=[AP]M)\s[A-Z]{2,5}$")


def parse_checked_at(text: str, source: str | None = None) -> CheckedAtFacts:
    lines = _lines("checked-at", text, source)
    no, line = lines[0]
    if len(lines) > 1:
        raise ParseError("checked-at", "more than one line", line_no=lines[1][0],
                         line=lines[1][1], source=source)
    s = line.strip()
    when: dt.datetime | None = None
    try:
        when = dt.datetime.fromisoformat(s.replace("Z", "+00:00").replace(",", "."))
    except ValueError:
        bare = _TZ_NAME.sub("", s)
        for fmt in ("%a %b %d %H:%M:%S %Y", "%a %d %b %Y %I:%M:%S %p", "%a %d %b %H:%M:%S %Y",
                    "%Y-%m-%d %H:%M:%S"):
            try:
                when = dt.datetime.strptime(re.sub(r"\s+", " ", bare), fmt)
                break
            except ValueError:
                continue
    if when is None or not re.search(r"\d{4}", s):
        raise ParseError("checked-at", "not a date and time (`date` or `date -Iseconds`)",
                         line_no=no, line=line, source=source)
    return CheckedAtFacts(text=s, iso=when.isoformat())


register("checked-at", "when the outputs were taken (date, date -Iseconds)",
         example="date -Iseconds | tee checked-at.txt")(parse_checked_at)


PIP_HEADER = re.compile(r"Package\s+Version(\s+\S+.*)?")
FREEZE_ROW = re.compile(r"([A-Za-z0-9][A-Za-z0-9_.-]*)\s*==\s*(\S+)\s*")
_PIP_ROW = re.compile(r"([A-Za-z0-9][A-Za-z0-9_.-]*)\s+(\S+)(?:\s+\S+)?\s*")


def parse_pip(text: str, source: str | None = None) -> PipFacts:
    lines = _lines("pip-list", text, source)
    packages: dict[str, str] = {}
    listed = PIP_HEADER.fullmatch(lines[0][1].strip()) is not None
    body = lines[2:] if listed else lines
    if listed and (len(lines) < 2 or not re.fullmatch(r"-+(\s+-+)+", lines[1][1].strip())):
        raise ParseError("pip-list", "no `----` line under the `Package Version` header",
                         line_no=lines[0][0], line=lines[0][1], source=source)
    for no, line in body:
        m = (_PIP_ROW if listed else FREEZE_ROW).fullmatch(line.strip())
        if m is None:
            if not listed and (line.startswith("#") or " @ " in line or line.startswith("-e ")):
                continue  # pip freeze: comments, direct references, editable installs
            raise ParseError("pip-list", "not a package and its version", line_no=no, line=line,
                             source=source)
        packages[m.group(1).lower().replace("_", "-")] = m.group(2)
    if not packages:
        raise ParseError("pip-list", "no package listed", source=source)
    return PipFacts(packages=packages)


register("pip-list", "pip list / pip freeze: installed packages and versions",
         example="pip list | tee pip.txt")(parse_pip)


_NOT_FOUND = re.compile(r"(?:.*:\s*)?(?:line \d+:\s*)?(?P<cmd>[\w.+-]+): (?:command )?not found\s*")


def parse_missing_command(text: str, source: str | None = None) -> MissingCommandFacts:
    lines = _lines("command-not-found", text, source)
    cmds = []
    for no, line in lines:
        m = _NOT_FOUND.fullmatch(line)
        if m is None:
            raise ParseError("command-not-found", "not a `command not found` message",
                             line_no=no, line=line, source=source)
        cmds.append(m["cmd"])
    if len(set(cmds)) != 1:
        raise ParseError("command-not-found", f"several commands missing ({', '.join(cmds)}): "
                         "cannot tell which output this file stands for", source=source)
    return MissingCommandFacts(command=cmds[0], text=text.strip())


register("command-not-found", "a shell's `X: command not found`, saved in place of X's output",
         example="nvcc --version > nvcc-version.txt 2>&1  (on a node without the toolkit)")(
    parse_missing_command)


# --------------------------------------------------------------------------- the build log

class BuildLogFacts(_Model):
    """`make` of nccl-tests: what was built and which lines say something went wrong."""

    binaries: list[str]  # the *_perf programs linked
    compiled: int
    errors: list[str]  # `error` lines of the compiler or make, as printed
    ignored_lines: list[IgnoredLine] = []


_BUILD_OK = re.compile(r"make(?:\[\d+\])?: |make -C |Compiling +\S|Linking +\S|Creating archive "
                       r"|Archiving |nvcc |g\+\+ |gcc |ar |mkdir ")
_BUILD_ERROR = re.compile(r"\berror\b|\bError \d+|No such file or directory|: (?:command )?not found"
                          r"|cannot find -l", re.I)


def parse_build_log(text: str, source: str | None = None) -> BuildLogFacts:
    kind = "nccl-tests-build"
    binaries: list[str] = []
    compiled = 0
    errors: list[str] = []
    noise = NoiseReader()
    for no, line in _lines(kind, text, source):
        s = line.strip()
        if _BUILD_ERROR.search(s):
            errors.append(s)
        elif m := re.match(r"Linking +\S+ > (\S+)", s):
            binaries.append(m.group(1).rsplit("/", 1)[-1])
        elif s.startswith("Compiling"):
            compiled += 1
        elif not _BUILD_OK.match(s) and not noise.skip(no, line):
            noise.ignore(no, "unknown", line)
    if not (binaries or compiled or errors):
        raise ParseError(kind, "no Compiling, Linking or error line of a make", source=source)
    return BuildLogFacts(binaries=binaries, compiled=compiled, errors=errors,
                         ignored_lines=noise.ignored)


register("nccl-tests-build", "make of nccl-tests: the programs linked and the error lines",
         example="make -j$(nproc) CUDA_HOME=/usr/local/cuda 2>&1 | tee make.log")(parse_build_log)
