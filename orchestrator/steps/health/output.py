"""One node's health output as the judge reads it: ``health.json``, each GPU's events,
the counter reads before and after, the topology and the clock reasons sampled
during the load (``payload/health/``, ``python3 -m payload health``).

Reads files only, so a live run and a captured folder are judged the same way. A
document that is missing or not the health tool's is a `StepError` naming the file;
a part that is missing or broken (a process killed mid-write, a counter read that
failed) is carried as absent, never guessed at.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.errors import ParseError, StepError
from orchestrator.parsers.nvidia_smi import CLOCK_EVENT_BITS, SLOWDOWN_REASONS
from orchestrator.parsers.topology import TopoMFacts, parse_topo_m
from orchestrator.steps.health.counters import GpuCounters, Snapshot, read_snapshot
from payload.health import protocol

_NAME_OF = {v.lower(): v for v in CLOCK_EVENT_BITS.values()}


@dataclass
class GpuOutput:
    """One per-GPU process: its label (file-safe), the CUDA_VISIBLE_DEVICES entry it
    ran with, its hello event (name, compute capability, memory, UUID), the last event
    of each phase, its events file and how the process ended."""

    label: str
    entry: str
    hello: dict[str, Any]
    phases: dict[str, dict[str, Any]]
    events_file: Path
    worker: dict[str, Any]
    errors: list[str] = field(default_factory=list)  # errors outside a phase (no torch, ...)

    @property
    def name(self) -> str | None:
        return self.hello.get("name")

    @property
    def cc(self) -> tuple[int, int] | None:
        cc = self.hello.get("cc")
        if isinstance(cc, list) and len(cc) == 2 and all(isinstance(x, int) for x in cc):
            return (cc[0], cc[1])
        return None

    def done(self, phase: str) -> dict[str, Any] | None:
        ev = self.phases.get(phase)
        return ev if ev is not None and ev.get("event") == protocol.DONE else None

    def values(self, phase: str) -> dict[str, Any]:
        ev = self.done(phase)
        return dict(ev.get("values") or {}) if ev else {}


@dataclass
class NodeOutput:
    node: str
    folder: Path
    doc: dict[str, Any]
    gpus: list[GpuOutput]
    links: dict[str, dict[str, Any]]
    before: Snapshot | None
    after: Snapshot | None
    topo: TopoMFacts | None
    reasons: dict[int, dict[str, int]] = field(default_factory=dict)  # index -> reason -> samples
    reason_samples: dict[int, int] = field(default_factory=dict)  # index -> samples read
    problems: list[str] = field(default_factory=list)  # parts that could not be read

    @property
    def doc_file(self) -> Path:
        return self.folder / protocol.NODE_DOC

    @property
    def status(self) -> str:
        return str(self.doc.get("status") or "")

    def file(self, rel: str | None) -> Path | None:
        """A file the node named, inside the folder only (a hostile name stays out)."""
        if not rel:
            return None
        p = (self.folder / rel).resolve()
        try:
            p.relative_to(self.folder.resolve())
        except ValueError:
            return None
        return p

    def counters_of(self, gpu: GpuOutput, snap: Snapshot | None) -> GpuCounters | None:
        """The counters of this GPU in a snapshot: by index, UUID or bus id."""
        if snap is None:
            return None
        entry = gpu.entry
        uuid = str(gpu.hello.get("uuid") or "")
        for g in snap.gpus.values():
            if entry.isdigit() and g.index == int(entry):
                return g
            if g.uuid and (g.uuid == entry or (uuid and g.uuid.endswith(uuid))):
                return g
        if len(snap.gpus) == 1 and len(self.gpus) == 1:
            return next(iter(snap.gpus.values()))
        return None


def load_document(path: Path) -> dict[str, Any]:
    """``health.json``, or a StepError that says what is wrong with it."""
    try:
        doc = json.loads(path.read_text(errors="replace"))
    except FileNotFoundError:
        raise StepError(f"no health document at {path}",
                        hint="the node's health run ended before writing it; see its "
                             "stderr") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise StepError(f"health document {path} is unreadable: {exc}") from None
    if not isinstance(doc, dict) or doc.get("tool") != protocol.TOOL:
        raise StepError(f"{path} is not a {protocol.TOOL} document")
    if doc.get("schema") != protocol.SCHEMA:
        raise StepError(f"{path} has schema {doc.get('schema')!r}, this gpuvet reads "
                        f"{protocol.SCHEMA}", hint="use the same gpuvet on the node and here")
    return doc


def _snapshot(folder: Path, when: str, problems: list[str]) -> Snapshot | None:
    path = folder / protocol.COUNTERS_DIR / when
    if not (path / "index.json").is_file():
        return None
    try:
        return read_snapshot(path)
    except (ParseError, OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        problems.append(f"counters {when}: {getattr(exc, 'what', exc)}")
        return None


def _topo(folder: Path, problems: list[str]) -> TopoMFacts | None:
    path = folder / protocol.COUNTERS_DIR / "before" / "topo-m.txt"
    if not path.is_file() or not path.read_text(errors="replace").strip():
        return None
    try:
        return parse_topo_m(path.read_text(errors="replace"), source=str(path))
    except ParseError as exc:
        problems.append(f"topology: {exc.what}")
        return None


def read_reasons(path: Path) -> tuple[dict[int, dict[str, int]], dict[int, int]]:
    """The slowdown reasons the sampler saw per GPU index, with how many samples showed
    each; rows that do not parse (the sampler killed mid-line) are skipped."""
    reasons: dict[int, dict[str, int]] = {}
    samples: dict[int, int] = {}
    if not path.is_file():
        return reasons, samples
    rows = list(csv.reader(io.StringIO(path.read_text(errors="replace"))))
    if not rows:
        return reasons, samples
    header = [h.strip().split(" [")[0].lower() for h in rows[0]]
    try:
        i_idx = header.index("index")
        i_rsn = next(i for i, h in enumerate(header) if h.endswith("reasons.active"))
    except (ValueError, StopIteration):
        return reasons, samples
    for row in rows[1:]:
        if len(row) != len(header) or row[0].strip().lower() == header[0]:
            continue
        try:
            idx = int(row[i_idx])
            mask = int(row[i_rsn].strip(), 16)
        except ValueError:
            continue
        samples[idx] = samples.get(idx, 0) + 1
        for bit, name in CLOCK_EVENT_BITS.items():
            if mask & bit and name in SLOWDOWN_REASONS:
                reasons.setdefault(idx, {})[name] = reasons.setdefault(idx, {}).get(name, 0) + 1
    return reasons, samples


def read_output(folder: Path, node: str) -> NodeOutput:
    """The node's folder as the payload left it (brought back into the run)."""
    doc = load_document(folder / protocol.NODE_DOC)
    problems: list[str] = []
    gpus = []
    labels, results, workers = (_dict(doc, k) for k in ("labels", "results", "workers"))
    for label in sorted(set(labels) | set(results), key=_label_order):
        label = protocol.label_of(str(label))
        events = folder / protocol.gpu_events(label)
        evs = list(protocol.read_events(str(events))) if events.is_file() else []
        hello = next((e for e in evs if e.get("event") == protocol.HELLO), {})
        phases = protocol.last_by_phase(evs) if evs else dict(results.get(label) or {})
        errors = [str(e.get("error")) for e in evs
                  if e.get("event") == protocol.ERROR and not e.get("phase")]
        gpus.append(GpuOutput(label, str(labels.get(label, label)), hello, phases, events,
                              dict(workers.get("gpu" + label) or {}), errors))
    links_file = folder / protocol.LINKS_EVENTS
    links = (protocol.last_by_phase(list(protocol.read_events(str(links_file))))
             if links_file.is_file() else {})
    links = {**_dict(doc, "links"), **links}
    out = NodeOutput(node=node, folder=folder, doc=doc, gpus=gpus, links=links,
                     before=_snapshot(folder, "before", problems),
                     after=_snapshot(folder, "after", problems),
                     topo=_topo(folder, problems), problems=problems)
    out.reasons, out.reason_samples = read_reasons(folder / protocol.REASONS_FILE)
    return out


def _dict(doc: dict[str, Any], key: str) -> dict[str, Any]:
    v = doc.get(key)
    return v if isinstance(v, dict) else {}


def _label_order(label: Any) -> tuple[int, str]:
    s = str(label)
    digits = "".join(c for c in s if c.isdigit())
    return (int(digits) if digits and len(digits) < 6 else 1 << 30, s)
