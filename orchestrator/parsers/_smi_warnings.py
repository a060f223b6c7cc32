"""nvidia-smi's own warnings, printed after or between its output ("WARNING: infoROM is
corrupted at gpu 0000:1B:00.0", "Unable to determine the device handle for GPU ...", "GPU
requires reset"): read past by the table and --query-gpu parsers and kept as health facts
each with its line."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict


class SmiWarning(BaseModel):
    """A line nvidia-smi prints beside its output about a GPU it cannot trust or reach."""

    model_config = ConfigDict(extra="forbid")

    line_no: int
    kind: str  # inforom-corrupted | reset-required | device-handle
    pci: str | None  # the GPU's bus id as printed
    reason: str | None  # what NVML said (`Unknown Error`, `GPU is lost...`)
    text: str


# (kind, pattern) of the warnings nvidia-smi writes before or after its table (on stderr,
# which people save with 2>&1): the output is still read, the warning kept as a fact.
_WARNINGS = (
    ("inforom-corrupted", re.compile(r"WARNING: infoROM is corrupted at gpu "
                                     r"(?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}"
                                     r"\.[0-7])")),
    ("device-handle", re.compile(r"Unable to (?:determine|detect) the device handle for GPU ?"
                                 r"(?P<pci>[0-9A-Fa-f]{3,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}"
                                 r"\.[0-7]): (?P<why>.+)")),
    ("reset-required", re.compile(r"(?:GPU (?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:"
                                  r"[0-9A-Fa-f]{2}\.[0-7]):? )?(?P<why>GPU requires reset\b[^,|\[\]]*)",
                                  re.I)),  # a line of its own, not a `[GPU requires reset]` cell
)


def smi_warning(no: int, line: str) -> SmiWarning | None:
    s = line.strip()
    if not s or s.startswith(("|", "+")):
        return None
    for kind, rx in _WARNINGS:
        m = rx.fullmatch(s)
        if m is None:
            continue
        why = m.groupdict().get("why")
        if kind == "device-handle" and why and re.search(r"requires reset", why, re.I):
            kind = "reset-required"
        return SmiWarning(line_no=no, kind=kind, pci=m["pci"], reason=why.strip() if why else
                          None, text=s)
    return None


def split_warnings(text: str) -> tuple[list[tuple[int, str]], list[SmiWarning]]:
    """The non-blank lines that are not nvidia-smi's warnings, and the warnings."""
    lines: list[tuple[int, str]] = []
    warnings: list[SmiWarning] = []
    for n, ln in enumerate(text.splitlines(), 1):
        if not ln.strip():
            continue
        w = smi_warning(n, ln)
        if w is not None:
            warnings.append(w)
        else:
            lines.append((n, ln))
    return lines, warnings
