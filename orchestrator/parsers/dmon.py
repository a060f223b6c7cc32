"""`nvidia-smi dmon`: per-GPU samples, whatever `-s` and `-o` chose.

The columns depend on `-s` (p u c v m e t ...) and the driver (jpg, ofa,
ccpm and mtemp came later), `-o T`/`-o D` add time and date columns, and dmon
repeats its two header lines every screenful. So the header the output itself
printed defines the columns, and a later header may redefine them. `-` is
dmon's "not available": it becomes None, never 0.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

from orchestrator.errors import ParseError
from orchestrator.parsers import register

KIND = "dmon"

_TIME_COLS = {"date": "date", "time": "time"}
# Messages nvidia-smi prints instead of (or after) samples.
_MESSAGE = re.compile(r"(?:Not supported on the device\(s\)|Failed to .*|Unable to .*|"
                      r"No devices were found|Error: .*)")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DmonColumn(_Model):
    name: str  # as printed: pwr, gtemp, sm, fb, rxpci, ...
    unit: str | None  # W, C, %, MHz, MB, MB/s, errs, bool; None without a units line


class DmonSample(_Model):
    line_no: int
    gpu: int
    date: str | None  # YYYYMMDD with -o D
    time: str | None  # HH:MM:SS with -o T
    values: dict[str, float | int | None]  # by column name; None where dmon printed `-`

    @property
    def timestamp(self) -> str | None:
        parts = [p for p in (self.date, self.time) if p]
        return " ".join(parts) or None


class DmonFacts(_Model):
    columns: list[DmonColumn]  # value columns (gpu index, date and time excluded)
    samples: list[DmonSample]
    headers: int  # how many header blocks the text held
    messages: list[str]  # nvidia-smi's own errors, e.g. "Not supported on the device(s)"

    @property
    def gpus(self) -> list[int]:
        return sorted({s.gpu for s in self.samples})

    def series(self, gpu: int, column: str) -> list[float | int | None]:
        return [s.values.get(column) for s in self.samples if s.gpu == gpu]


def _value(tok: str) -> float | int | None:
    if tok == "-" or tok.upper() == "N/A":
        return None
    if re.fullmatch(r"-?\d+", tok):
        return int(tok)
    if re.fullmatch(r"-?\d+\.\d*", tok):
        return float(tok)
    raise ValueError(tok)


def parse_dmon(text: str, source: str | None = None) -> DmonFacts:
    """Samples of `nvidia-smi dmon [-s ...] [-o DT]`; the training step reads these."""
    names: list[str] | None = None
    units: list[str] | None = None
    columns: list[DmonColumn] = []
    samples: list[DmonSample] = []
    messages: list[str] = []
    headers = 0
    expect_units = False
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip("\r")
        s = line.strip()
        if not s:
            continue
        if s.startswith("#"):
            toks = s.lstrip("#").split()
            if expect_units and names is not None and len(toks) == len(names):
                units = toks
                expect_units = False
            else:
                if "gpu" not in [t.lower() for t in toks]:
                    raise ParseError(KIND, "header line without a `gpu` column", line_no=no,
                                     line=line, source=source)
                names, units, expect_units = toks, None, True
                headers += 1
            columns = _columns(names, units)
            continue
        if _MESSAGE.fullmatch(s):
            messages.append(s)
            continue
        if names is None:
            raise ParseError(KIND, "sample before any `# gpu ...` header line", line_no=no,
                             line=line, source=source)
        expect_units = False
        toks = s.split()
        if len(toks) != len(names):
            raise ParseError(KIND, f"{len(toks)} values, the header names {len(names)} columns",
                             line_no=no, line=line, source=source)
        values: dict[str, float | int | None] = {}
        sample: dict[str, object] = {"line_no": no, "date": None, "time": None, "values": values}
        for name, tok in zip(names, toks, strict=True):
            low = name.lower()
            if low in _TIME_COLS:
                sample[_TIME_COLS[low]] = tok
            elif low == "gpu":
                if not tok.isdigit():
                    raise ParseError(KIND, f"gpu index {tok!r} is not a number", line_no=no,
                                     line=line, source=source)
                sample["gpu"] = int(tok)
            else:
                try:
                    values[name] = _value(tok)
                except ValueError:
                    raise ParseError(KIND, f"{name}: {tok!r} is not a number or `-`", line_no=no,
                                     line=line, source=source) from None
        samples.append(DmonSample.model_validate(sample))
    if names is None and not messages:
        raise ParseError(KIND, "no `# gpu ...` header line", source=source)
    return DmonFacts(columns=columns, samples=samples, headers=headers, messages=messages)


def _columns(names: list[str], units: list[str] | None) -> list[DmonColumn]:
    out = []
    for k, name in enumerate(names):
        if name.lower() in ("gpu", *_TIME_COLS):
            continue
        out.append(DmonColumn(name=name, unit=units[k] if units else None))
    return out


# Registered without decorating, so callers keep the precise return type.
register(KIND, "nvidia-smi dmon with any -s selection and -o D/T: per-GPU samples",
          example="nvidia-smi dmon -s pucvmet -d 1 | tee dmon.txt")(parse_dmon)
