"""Stragglers: ranks consistently late at the barrier of a whole-fleet run.

The torch benchmark (`allreduce-bench --rank-times`) has every rank do the
same local work, then meet at a barrier, for a number of iterations; each
rank notes how long its work took and how long it then waited. The last rank
to arrive waits least, so a rank's lateness in one iteration is the median
rank's wait among the others minus its own: no two nodes' clocks are ever
compared. A straggler is late in most iterations (`share`) by more than a threshold
(`rel` of the median work time, and at least `min_late_us`): one slow
iteration is noise, the same rank late again and again is a slow GPU, a busy
host or a throttled clock.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import ParseError

KIND = "rank-times"
DOC_KIND = "gpuvet-rank-times"  # payload/allreduce.py RANK_TIMES_KIND
DOC_VERSION = 1
DEFAULT_REL = 0.2
DEFAULT_MIN_LATE_US = 50.0
DEFAULT_SHARE = 0.6


@dataclass(frozen=True)
class RankTime:
    rank: int
    local_rank: int
    host: str
    node: str  # the inventory's name where the launch set GPUVET_NODE, else ""
    work_us: tuple[float, ...]
    wait_us: tuple[float, ...]


@dataclass(frozen=True)
class RankTimes:
    backend: str
    world: int
    iters: int
    dim: int
    ranks: tuple[RankTime, ...]  # by rank


@dataclass(frozen=True)
class RankLateness:
    rank: int
    node: str
    host: str
    late_us: float  # median over iterations of (the other ranks' median wait - its own)
    late_share: float  # share of iterations in which it was later than the threshold
    work_us: float  # median local work time
    straggler: bool


@dataclass(frozen=True)
class StragglerReport:
    ranks: tuple[RankLateness, ...]
    threshold_us: float  # late_us above this, in at least `share` of iterations: a straggler
    share: float
    iters: int

    @property
    def stragglers(self) -> tuple[RankLateness, ...]:
        return tuple(r for r in self.ranks if r.straggler)


def _fail(what: str, source: str) -> ParseError:
    return ParseError(KIND, what, source=source)


def _floats(v: Any, n: int, where: str, source: str) -> tuple[float, ...]:
    if not isinstance(v, list) or len(v) != n:
        raise _fail(f"{where}: expected a list of {n} numbers", source)
    out = []
    for x in v:
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not x >= 0:
            raise _fail(f"{where}: {x!r} is not a time in microseconds", source)
        out.append(float(x))
    return tuple(out)


def _int(doc: dict[str, Any], key: str, where: str, source: str, low: int = 0) -> int:
    v = doc.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise _fail(f"{where}{key}: {v!r} is not a whole number >= {low}", source)
    return v


def load_rank_times(text: str, source: str = "<text>") -> RankTimes:
    """The benchmark's --rank-times document, checked field by field."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ParseError(KIND, f"not JSON ({exc.msg})", line_no=exc.lineno, source=source) from None
    if not isinstance(doc, dict) or doc.get("kind") != DOC_KIND:
        raise _fail(f"not a {DOC_KIND} document", source)
    if doc.get("version") != DOC_VERSION:
        raise _fail(f"version {doc.get('version')!r}, this gpuvet reads {DOC_VERSION}", source)
    world = _int(doc, "world", "", source, 1)
    iters = _int(doc, "iters", "", source, 1)
    ranks = doc.get("ranks")
    if not isinstance(ranks, list) or len(ranks) != world:
        raise _fail(f"ranks: expected {world} entries (world)", source)
    out = []
    for i, r in enumerate(ranks):
        where = f"ranks[{i}]."
        if not isinstance(r, dict):
            raise _fail(f"ranks[{i}] is not an object", source)
        if _int(r, "rank", where, source) != i:
            raise _fail(f"{where}rank is {r.get('rank')!r}, expected {i} (ranks in order)", source)
        out.append(RankTime(rank=i, local_rank=_int(r, "local_rank", where, source),
                            host=str(r.get("host", "")), node=str(r.get("node", "")),
                            work_us=_floats(r.get("work_us"), iters, where + "work_us", source),
                            wait_us=_floats(r.get("wait_us"), iters, where + "wait_us", source)))
    return RankTimes(backend=str(doc.get("backend", "")), world=world, iters=iters,
                     dim=_int(doc, "dim", "", source), ranks=tuple(out))


def _median_without(xs: list[float], pos: int) -> float:
    """The median of sorted `xs` without its element at `pos` (one pass per rank would be
    quadratic in the world size; 8,000 ranks are 8,000 ranks)."""

    def at(i: int) -> float:  # index into xs with pos taken out
        return xs[i] if i < pos else xs[i + 1]

    n = len(xs) - 1
    return at(n // 2) if n % 2 else (at(n // 2 - 1) + at(n // 2)) / 2


def stragglers(times: RankTimes, *, rel: float = DEFAULT_REL,
               min_late_us: float = DEFAULT_MIN_LATE_US,
               share: float = DEFAULT_SHARE) -> StragglerReport:
    """Each rank's lateness against the median rank, and which ranks are stragglers."""
    ranks = times.ranks
    if len(ranks) < 2:
        return StragglerReport(ranks=(), threshold_us=min_late_us, share=share, iters=times.iters)
    late: list[list[float]] = [[] for _ in ranks]
    for i in range(times.iters):
        order = sorted((r.wait_us[i], k) for k, r in enumerate(ranks))
        waits = [w for w, _ in order]
        for pos, (w, k) in enumerate(order):
            late[k].append(_median_without(waits, pos) - w)
    work = statistics.median(x for r in ranks for x in r.work_us)
    threshold = max(min_late_us, rel * work)
    rows = []
    for r, lat in zip(ranks, late, strict=True):
        med_late = statistics.median(lat)
        frac = sum(x > threshold for x in lat) / len(lat)
        rows.append(RankLateness(rank=r.rank, node=r.node, host=r.host, late_us=med_late,
                                 late_share=frac, work_us=statistics.median(r.work_us),
                                 straggler=med_late > threshold and frac >= share))
    return StragglerReport(ranks=tuple(rows), threshold_us=threshold, share=share,
                           iters=times.iters)
