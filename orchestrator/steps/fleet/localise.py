"""Which node, which link: suspects named from a table of pair results.

Every pair is judged against the fleet's median pair at each message size
(the median, not the mean: one dead node must not drag the reference down
and hide a second, slower-than-usual one) and against the shipped or
inventory band of a two-node run where there is one. A node all of whose
pairs are slow is a suspect node; a pair slow only together, while both of
its nodes are fine with others, is a suspect link (a cable, a switch port, a
path). Suspects are then re-paired with nodes that passed, and a link is run
again: a suspect node is confirmed only when it is slow with those too, a
link only when it is slow again.

Input is a flat list of `PairSample` (one busbw figure of one job at one
size and repeat); output is typed data, the pair table and each suspect with
its evidence, which the step turns into findings. Pure: no I/O.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from orchestrator.bands import Band, Judged

REPAIR = "repair"
DEFAULT_TOLERANCE = 0.2  # a pair more than 20% below the median pair is slow
DEFAULT_MIN_SIZE = 16 << 20  # below 16 MiB a pair's time is latency and jitter, not bandwidth
Status = Literal["confirmed", "cleared", "unclear", "unconfirmed"]


@dataclass(frozen=True)
class PairSample:
    """One busbw figure of one pair job: a message size in one repeat of its engine."""

    nodes: tuple[str, str]
    stage: str  # the plan round's stage: pairs, ring, topup (first pass) or repair
    round: int  # the plan round
    size: int  # bytes
    busbw: float  # GB/s
    repeat: int = 1  # the engine's own round (nccl-tests' rounds) within the job
    evidence: tuple[str, ...] = ()  # the job's logs, relative to the run directory


@dataclass(frozen=True)
class Reference:
    """The fleet's median pair at one size: what each pair is compared with."""

    size: int
    median: float
    pairs: int  # how many first-pass pairs it is the median of
    band: Judged | None  # the median against the band: below it, the whole fleet is slow


@dataclass(frozen=True)
class SizeVerdict:
    size: int
    value: float  # the median of the job's repeats at this size
    samples: tuple[float, ...]
    reference: float  # the fleet's median pair
    ratio: float  # value / reference
    lower: float  # (1 - tolerance) * reference: below it the pair is slow
    band: Judged | None
    slow: bool


@dataclass(frozen=True)
class PairVerdict:
    """One row of the pair table: one pair job, judged at every judged size."""

    nodes: tuple[str, str]
    stage: str
    round: int
    sizes: tuple[SizeVerdict, ...]
    slow: bool  # slow at most of the judged sizes
    evidence: tuple[str, ...]

    @property
    def key(self) -> str:
        return "+".join(self.nodes)


@dataclass(frozen=True)
class SuspectNode:
    node: str
    pairs: tuple[PairVerdict, ...]  # its first-pass pairs, every one slow
    repairs: tuple[PairVerdict, ...]  # with nodes that passed
    status: Status  # confirmed (slow with them too), cleared, unclear (mixed), unconfirmed


@dataclass(frozen=True)
class SuspectLink:
    nodes: tuple[str, str]
    pair: PairVerdict  # the slow first-pass pair
    fine: tuple[PairVerdict, ...]  # the two nodes' fast pairs with others
    repairs: tuple[PairVerdict, ...]  # the pair run again
    status: Status


@dataclass(frozen=True)
class Localisation:
    references: tuple[Reference, ...]
    table: tuple[PairVerdict, ...]  # every pair job, first pass then repairs
    suspects: tuple[SuspectNode, ...]
    links: tuple[SuspectLink, ...]
    passed: tuple[str, ...]  # judged, not suspect, not the end of a suspect link
    unjudged: tuple[str, ...]  # named in the samples but without a judged pair
    tolerance: float
    bands: tuple[Band, ...] = field(default=())

    @property
    def fleet_below_band(self) -> tuple[Reference, ...]:
        """Sizes at which the median pair itself is below the band: no one node to blame."""
        return tuple(r for r in self.references if r.band is not None and r.band.result == "below")

    def named(self) -> tuple[list[str], list[tuple[str, str]]]:
        """The confirmed suspect nodes and links: what a verdict names."""
        return ([s.node for s in self.suspects if s.status == "confirmed"],
                [lk.nodes for lk in self.links if lk.status == "confirmed"])


@dataclass
class _Job:
    nodes: tuple[str, str]
    stage: str
    round: int
    by_size: dict[int, list[float]] = field(default_factory=dict)
    evidence: dict[str, None] = field(default_factory=dict)

    def value(self, size: int) -> float | None:
        vals = self.by_size.get(size)
        return statistics.median(vals) if vals else None


def _jobs(samples: Iterable[PairSample]) -> list[_Job]:
    jobs: dict[tuple[tuple[str, str], str, int], _Job] = {}
    for s in samples:
        if len(s.nodes) != 2 or s.nodes[0] == s.nodes[1]:
            raise ValueError(f"a pair sample names two different nodes, got {s.nodes}")
        key = (s.nodes, s.stage, s.round)
        job = jobs.setdefault(key, _Job(s.nodes, s.stage, s.round))
        job.by_size.setdefault(s.size, []).append(s.busbw)
        job.evidence.update(dict.fromkeys(s.evidence))
    return list(jobs.values())


def judged_sizes(first: Sequence[_Job], min_size: int) -> list[int]:
    """Sizes from min_size up measured by at least half of the pairs; else the largest
    size most pairs have."""
    count: dict[int, int] = {}
    for j in first:
        for size in j.by_size:
            count[size] = count.get(size, 0) + 1
    if not count:
        return []
    common = [s for s, c in count.items() if 2 * c >= len(first)]
    big = sorted(s for s in common if s >= min_size)
    return big or [max(common or count)]


def _band_for(bands: Sequence[Band], size: int) -> Band | None:
    return next((b for b in bands if b.size_bytes == size), None)


def _verdict(job: _Job, refs: dict[int, Reference], bands: Sequence[Band],
             tolerance: float) -> PairVerdict | None:
    rows = []
    for size, ref in refs.items():
        value = job.value(size)
        if value is None:
            continue
        band = _band_for(bands, size)
        judged = band.judge(value) if band is not None else None
        lower = (1.0 - tolerance) * ref.median
        slow = value < lower
        # the band names a pair only while the fleet as a whole meets it: when the median
        # pair is below it too, every pair would be "slow" and no node could be told apart
        if judged is not None and judged.result == "below" and ref.band is not None \
                and ref.band.result != "below":
            slow = True
        rows.append(SizeVerdict(size=size, value=value, samples=tuple(job.by_size[size]),
                                reference=ref.median,
                                ratio=value / ref.median if ref.median > 0 else 0.0,
                                lower=lower, band=judged, slow=slow))
    if not rows:
        return None
    slow_count = sum(r.slow for r in rows)
    return PairVerdict(nodes=job.nodes, stage=job.stage, round=job.round, sizes=tuple(rows),
                       slow=2 * slow_count > len(rows), evidence=tuple(job.evidence))


def judge_pairs(samples: Iterable[PairSample], *, bands: Sequence[Band] = (),
                tolerance: float = DEFAULT_TOLERANCE, min_size: int = DEFAULT_MIN_SIZE,
                ) -> tuple[tuple[Reference, ...], tuple[PairVerdict, ...]]:
    """The references (the first pass's median pair per judged size) and every job's row."""
    if not 0 < tolerance < 1:
        raise ValueError("tolerance is a fraction between 0 and 1")
    jobs = _jobs(samples)
    first = [j for j in jobs if j.stage != REPAIR]
    refs: dict[int, Reference] = {}
    for size in judged_sizes(first, min_size):
        vals = [v for j in first if (v := j.value(size)) is not None]
        med = statistics.median(vals)
        band = _band_for(bands, size)
        refs[size] = Reference(size=size, median=med, pairs=len(vals),
                               band=band.judge(med) if band is not None else None)
    verdicts = (_verdict(j, refs, bands, tolerance)
                for j in [*first, *(j for j in jobs if j.stage == REPAIR)])
    table = [pv for pv in verdicts if pv is not None]
    return tuple(refs[s] for s in sorted(refs)), tuple(table)


def _status(repairs: Sequence[PairVerdict]) -> Status:
    if not repairs:
        return "unconfirmed"
    slow = sum(r.slow for r in repairs)
    return "confirmed" if slow == len(repairs) else "cleared" if slow == 0 else "unclear"


def localise(samples: Iterable[PairSample], *, bands: Sequence[Band] = (),
             tolerance: float = DEFAULT_TOLERANCE,
             min_size: int = DEFAULT_MIN_SIZE) -> Localisation:
    """Suspect nodes and links from the first pass, confirmed by the re-pair results.

    Call it after the first pass (every suspect "unconfirmed"; plan the re-pairs
    with `plan.repair_rounds(*repair_inputs(loc))`) and again with the re-pair
    samples added.
    """
    samples = list(samples)
    refs, table = judge_pairs(samples, bands=bands, tolerance=tolerance, min_size=min_size)
    first = [v for v in table if v.stage != REPAIR]
    repairs = [v for v in table if v.stage == REPAIR]
    by_node: dict[str, list[PairVerdict]] = {}
    for v in first:
        for n in v.nodes:
            by_node.setdefault(n, []).append(v)
    suspect = {n for n, pairs in by_node.items() if all(p.slow for p in pairs)}
    link_pairs = [v for v in first if v.slow and not suspect & set(v.nodes)]
    link_ends = {n for v in link_pairs for n in v.nodes}
    passed = [n for n in by_node if n not in suspect and n not in link_ends]
    ok = set(passed)

    suspects = []
    for n in (x for x in by_node if x in suspect):
        mine = tuple(r for r in repairs if n in r.nodes and _other(r, n) in ok)
        suspects.append(SuspectNode(node=n, pairs=tuple(by_node[n]), repairs=mine,
                                    status=_status(mine)))
    links = []
    seen: set[tuple[str, ...]] = set()
    for v in link_pairs:
        key = tuple(sorted(v.nodes))
        if key in seen:
            continue
        seen.add(key)
        fine = tuple(p for n in v.nodes for p in by_node[n] if not p.slow)
        again = tuple(r for r in repairs if sorted(r.nodes) == list(key))
        links.append(SuspectLink(nodes=v.nodes, pair=v, fine=fine, repairs=again,
                                 status=_status(again)))
    named = {n for s in samples for n in s.nodes}
    unjudged = sorted(named - set(by_node))
    return Localisation(references=refs, table=table, suspects=tuple(suspects),
                        links=tuple(links), passed=tuple(passed), unjudged=tuple(unjudged),
                        tolerance=tolerance, bands=tuple(bands))


def _other(v: PairVerdict, node: str) -> str:
    a, b = v.nodes
    return b if a == node else a


def repair_inputs(loc: Localisation) -> tuple[list[str], list[str], list[tuple[str, str]]]:
    """(suspect nodes, passed nodes, suspect links) for `plan.repair_rounds`."""
    return ([s.node for s in loc.suspects], list(loc.passed), [lk.nodes for lk in loc.links])


def repair_inputs_all(locs: Mapping[str, Localisation]
                  ) -> tuple[list[str], list[str], list[tuple[str, str]]]:
    """(suspect nodes, passed nodes, suspect links) over every collective: the suspects and
    links of any collective, re-paired with nodes that passed every collective."""
    sus: dict[str, None] = {}
    links: dict[tuple[str, ...], tuple[str, str]] = {}
    passed: list[str] | None = None
    for loc in locs.values():
        s, p, lk = repair_inputs(loc)
        sus.update(dict.fromkeys(s))
        for x in lk:
            links.setdefault(tuple(sorted(x)), x)
        passed = p if passed is None else [n for n in passed if n in set(p)]
    return list(sus), [n for n in passed or [] if n not in sus], list(links.values())


def healthy_all(locs: Mapping[str, Localisation]) -> list[str]:
    """The nodes healthy in every collective (`healthy`), in the first one's order."""
    each = [healthy(loc) for loc in locs.values()]
    if not each:
        return []
    return [n for n in each[0] if all(n in h for h in each[1:])]


def healthy(loc: Localisation) -> list[str]:
    """The nodes groups run over: those that passed, suspects the re-pairs cleared and
    the ends of links that were fast when run again."""
    cleared = {s.node for s in loc.suspects if s.status == "cleared"}
    cleared |= {n for lk in loc.links if lk.status == "cleared" for n in lk.nodes}
    blamed = {s.node for s in loc.suspects if s.status != "cleared"}
    blamed |= {n for lk in loc.links if lk.status != "cleared" for n in lk.nodes}
    order = [*loc.passed, *(n for v in loc.table for n in v.nodes)]
    return [n for n in dict.fromkeys(order) if n in cleared | set(loc.passed) and n not in blamed]
