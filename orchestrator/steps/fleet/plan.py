"""Who runs with whom: rounds of disjoint jobs over a fleet's nodes.

One slow NIC makes an all_reduce over 64 nodes slow and names nobody; pairs
name it. A round is a set of disjoint jobs (each node in at most one), so all
of a round's jobs run at once: N/2 pairs for N nodes. Pairs rotate with the
circle method of round-robin tournaments: round r fixes one node and turns
the others one place, so k rounds give every node k different partners (no
pair twice) with O(N) jobs per round. An odd node out sits the round out;
one short round at the end gives those nodes their missing partner.

After pairs, groups of 4, 8 and 16 and the whole fleet show rail- and
switch-level trouble; a topology hint (a label per node: its leaf switch,
rack, "spine/leaf") keeps a group under one switch where it can. A ring pairs
every node with its two neighbours in that order instead.

When nodes drop out (unreachable, failed), the rest of a plan is recomputed
without them; suspects are re-paired only with nodes that passed. Everything
here is pure and deterministic given the node order and the seed.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

PlanKind = Literal["pairs", "groups", "ring"]
PLAN_KINDS: tuple[PlanKind, ...] = ("pairs", "groups", "ring")
GROUP_SIZES = (4, 8, 16)


@dataclass(frozen=True)
class Job:
    """One all_reduce across these nodes (a pair, a group, the whole fleet)."""

    nodes: tuple[str, ...]

    @property
    def key(self) -> str:
        """A name for the job's unit and files: "a+b" for a pair; a group's is its first
        node, how many others and a digest of all of them (a file name of 1,000 node
        names would be longer than any filesystem allows)."""
        if len(self.nodes) <= 2:
            return "+".join(self.nodes)
        digest = hashlib.sha256("\0".join(self.nodes).encode()).hexdigest()[:10]
        return f"{self.nodes[0]}+{len(self.nodes) - 1}-{digest}"


@dataclass(frozen=True)
class Round:
    """Jobs that run at once: no node is in two of them. `idle`: nodes left out."""

    stage: str  # pairs | ring | repair | topup | groups4 | groups8 | groups16 | whole
    index: int
    jobs: tuple[Job, ...]
    idle: tuple[str, ...] = ()

    @property
    def nodes(self) -> list[str]:
        return [n for j in self.jobs for n in j.nodes]


@dataclass(frozen=True)
class Plan:
    kind: PlanKind
    nodes: tuple[str, ...]
    seed: int
    partners: int  # the number of partners each node is meant to meet in pairs
    rounds: tuple[Round, ...]  # pairs (or ring) first; groups run once the pairs pass


def pair(a: str, b: str) -> Job:
    return Job((a, b))


def partners_of(jobs: Iterable[Job]) -> dict[str, set[str]]:
    """Whom each node met in two-node jobs."""
    met: dict[str, set[str]] = {}
    for j in jobs:
        if len(j.nodes) == 2:
            a, b = j.nodes
            met.setdefault(a, set()).add(b)
            met.setdefault(b, set()).add(a)
    return met


def jobs_of(rounds: Iterable[Round]) -> list[Job]:
    return [j for r in rounds for j in r.jobs]


def _check_names(nodes: Sequence[str]) -> list[str]:
    names = list(nodes)
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"node names must be unique, repeated: {', '.join(dup)}")
    return names


# --- pairs ---------------------------------------------------------------------------------

def _circle(order: list[str | None], r: int) -> list[tuple[str | None, str | None]]:
    """Round r of the circle method over an even-length list (None is the bye)."""
    n = len(order)
    rest = order[1:]
    k = r % (n - 1)
    turned = [order[0], *rest[-k:], *rest[:-k]] if k else order
    return [(turned[i], turned[n - 1 - i]) for i in range(n // 2)]


def pair_rounds(nodes: Sequence[str], *, partners: int = 2, seed: int = 0,
                start: int = 0) -> tuple[Round, ...]:
    """Rounds of disjoint pairs in which every node meets min(partners, N-1) partners.

    `partners` rounds of the circle method (over a seeded shuffle of the nodes), then
    for odd N one short round for the nodes that sat one out.
    """
    names = _check_names(nodes)
    if partners < 1:
        raise ValueError("partners must be at least 1")
    if len(names) < 2:
        return ()
    order: list[str | None] = list(names)
    random.Random(seed).shuffle(order)
    if len(order) % 2:
        order.append(None)
    want = min(partners, len(names) - 1)
    rounds = []
    for r in range(min(want, len(order) - 1)):
        jobs, idle = [], []
        for a, b in _circle(order, r):
            if a is None or b is None:
                idle.append(b if a is None else a)
            else:
                jobs.append(pair(a, b))
        rounds.append(Round("pairs", start + r, tuple(jobs), tuple(n for n in idle if n)))
    met = partners_of(jobs_of(rounds))
    rounds += top_up(names, met, want, seed=seed, start=start + len(rounds))
    return tuple(rounds)


def top_up(nodes: Sequence[str], met: Mapping[str, Collection[str]], partners: int, *,
           seed: int = 0, start: int = 0, stage: str = "topup") -> list[Round]:
    """Rounds of new pairs until every node has met min(partners, N-1) partners.

    Greedy per round: the nodes furthest from the target choose first, among
    partners they have not met, preferring partners that still need one too. A
    node always has an unmet partner while it is short, so every round pairs at
    least one short node and the loop ends.
    """
    names = _check_names(nodes)
    want = min(partners, len(names) - 1)
    alive = set(names)
    pos = {n: i for i, n in enumerate(names)}
    have = {n: set(met.get(n, ())) & alive for n in names}
    rng = random.Random(seed + 7919)
    out: list[Round] = []
    while True:
        short = [n for n in names if len(have[n]) < want]
        if not short:
            return out
        short.sort(key=lambda n: len(have[n]))  # stable: inventory order breaks ties
        free = list(names)
        rng.shuffle(free)
        taken: set[str] = set()
        jobs = []
        for a in short:
            if a in taken:
                continue
            b = _pick((b for b in free if b != a and b not in taken and b not in have[a]),
                      lambda x: len(have[x]) < want)
            if b is None:
                continue
            jobs.append(pair(a, b) if pos[a] < pos[b] else pair(b, a))
            taken |= {a, b}
            have[a].add(b)
            have[b].add(a)
        if not jobs:  # cannot happen (see above); never loop forever on a bug
            raise AssertionError("top_up made no progress")
        idle = tuple(n for n in names if n not in taken)
        out.append(Round(stage, start + len(out), tuple(jobs), idle))


def _pick(cands: Iterable[str], prefer: Callable[[str], bool]) -> str | None:
    """The first candidate `prefer` likes, else the first candidate, else None."""
    first = None
    for c in cands:
        if prefer(c):
            return c
        if first is None:
            first = c
    return first


# --- ring ----------------------------------------------------------------------------------

def ordered(nodes: Sequence[str], topology: Mapping[str, str] | None = None) -> list[str]:
    """Nodes in topology order: by label, the given order within a label, unlabelled last."""
    names = _check_names(nodes)
    if not topology:
        return names
    pos = {n: i for i, n in enumerate(names)}
    return sorted(names, key=lambda n: (n not in topology, topology.get(n, ""), pos[n]))


def ring_rounds(nodes: Sequence[str], *, topology: Mapping[str, str] | None = None,
                start: int = 0) -> tuple[Round, ...]:
    """Every node with its two neighbours in (topology) order: 2 rounds, 3 for odd N."""
    order = ordered(nodes, topology)
    n = len(order)
    if n < 2:
        return ()
    if n == 2:
        return (Round("ring", start, (pair(*order),)),)
    edges = [(order[i], order[(i + 1) % n]) for i in range(n)]
    colours = [list(edges[0:n - 1:2]), list(edges[1:n - 1:2])]
    if n % 2:
        colours.append([edges[n - 1]])  # an odd ring needs a third colour for its last edge
    else:
        colours[1].append(edges[n - 1])
    rounds: list[Round] = []
    for c in colours:
        busy = {x for e in c for x in e}
        rounds.append(Round("ring", start + len(rounds), tuple(pair(a, b) for a, b in c),
                            tuple(x for x in order if x not in busy)))
    return tuple(rounds)


# --- groups --------------------------------------------------------------------------------

def _chunks(order: list[str], size: int) -> tuple[list[list[str]], list[str]]:
    full = [order[i:i + size] for i in range(0, len(order) - len(order) % size, size)]
    return full, order[len(order) - len(order) % size:]


def groups_of(nodes: Sequence[str], size: int,
              topology: Mapping[str, str] | None = None) -> list[tuple[str, ...]]:
    """Disjoint groups of `size` covering every node, within one topology label where
    possible: each label is cut into whole groups first and what is left over is
    grouped in topology order. A last group of one joins the group before it."""
    order = ordered(nodes, topology)
    if size < 2:
        raise ValueError("a group needs at least 2 nodes")
    if topology:
        labels: dict[str, list[str]] = {}
        for n in order:
            labels.setdefault(topology.get(n, ""), []).append(n)
        groups, rest = [], []
        for members in labels.values():
            full, left = _chunks(members, size)
            groups += full
            rest += left
    else:
        groups, rest = [], order
    more, left = _chunks(rest, size)
    groups += more
    if len(left) >= 2:
        groups.append(left)
    elif left and groups:
        groups[-1] = groups[-1] + left
    return [tuple(g) for g in groups]


def group_rounds(nodes: Sequence[str], *, sizes: Sequence[int] = GROUP_SIZES,
                 topology: Mapping[str, str] | None = None, whole: bool = True,
                 start: int = 0) -> tuple[Round, ...]:
    """One round per group size smaller than the fleet, then the whole fleet (3+ nodes)."""
    names = _check_names(nodes)
    rounds: list[Round] = []
    for s in sorted(set(sizes)):
        if 2 < s < len(names):
            rounds.append(Round(f"groups{s}", start + len(rounds),
                                tuple(Job(g) for g in groups_of(names, s, topology))))
    if whole and len(names) >= 3:
        rounds.append(Round("whole", start + len(rounds), (Job(tuple(ordered(names, topology))),)))
    return tuple(rounds)


# --- the plan, and its rest when nodes drop out --------------------------------------------

def fleet_plan(nodes: Sequence[str], kind: PlanKind = "pairs", *, partners: int = 2,
               seed: int = 0, topology: Mapping[str, str] | None = None) -> Plan:
    """The first phase of a fleet run: pairs (pairs, groups) or a ring. Groups are
    planned with `group_rounds` over the nodes the pairs passed."""
    if kind not in PLAN_KINDS:
        raise ValueError(f"unknown plan {kind!r}: one of {', '.join(PLAN_KINDS)}")
    names = _check_names(nodes)
    rounds = (ring_rounds(names, topology=topology) if kind == "ring"
              else pair_rounds(names, partners=partners, seed=seed))
    return Plan(kind, tuple(names), seed, 2 if kind == "ring" else partners, rounds)


def replan(plan: Plan, done: int, drop: Collection[str], *,
           completed: Iterable[Job] | None = None) -> tuple[Round, ...]:
    """The rounds still to run after `done` rounds, without the nodes in `drop`.

    Future jobs that touch a dropped node lose it; the partners left alone in a
    round are paired among themselves where they have not met; a short round at
    the end gives any node still short of its partners new ones. `completed`:
    the jobs that gave results (default: every job of the first `done` rounds);
    a pair with a node that was dropped gave none and does not count as met.
    """
    gone = set(drop)
    alive = [n for n in plan.nodes if n not in gone]
    pos = {n: i for i, n in enumerate(alive)}
    jobs = list(completed) if completed is not None else jobs_of(plan.rounds[:done])
    met = partners_of(j for j in jobs if not gone & set(j.nodes))
    # pairs still planned count as met for the re-matching, so it never makes one of them early
    planned = partners_of(j for r in plan.rounds[done:] for j in r.jobs if not gone & set(j.nodes))
    known = {n: met.get(n, set()) | planned.get(n, set()) for n in alive}
    rest = []
    for i, r in enumerate(plan.rounds[done:]):
        keep = [j for j in r.jobs if not gone & set(j.nodes)]
        alone = [n for n in [*r.idle, *(x for j in r.jobs if gone & set(j.nodes) for x in j.nodes)]
                 if n not in gone]
        alone.sort(key=pos.__getitem__)
        for a, b in _rematch(alone, known, seed=plan.seed + i):
            keep.append(pair(a, b) if pos[a] < pos[b] else pair(b, a))
            known[a].add(b)
            known[b].add(a)
        busy = {x for j in keep for x in j.nodes}
        rest.append(Round(r.stage, r.index, tuple(keep), tuple(n for n in alive if n not in busy)))
        for j in keep:
            for x in j.nodes:
                met.setdefault(x, set()).update(y for y in j.nodes if y != x)
    rest += top_up(alive, met, plan.partners, seed=plan.seed,
                   start=(rest[-1].index + 1) if rest else done)
    return tuple(r for r in rest if r.jobs)


def _rematch(alone: list[str], met: Mapping[str, Collection[str]],
             seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    pool = list(alone)
    rng.shuffle(pool)
    out = []
    while pool:
        a = pool.pop(0)
        b = next((x for x in pool if x not in met.get(a, ())), None)
        if b is not None:
            pool.remove(b)
            out.append((a, b))
    return out


def repair_rounds(suspects: Sequence[str], passed: Sequence[str], *,
                  met: Mapping[str, Collection[str]] | None = None, partners: int = 2,
                  links: Sequence[tuple[str, str]] = (), seed: int = 0,
                  start: int = 0) -> tuple[Round, ...]:
    """Each suspect with `partners` nodes that passed (ones it has not met first), each
    suspect link run again as it was. A suspect never meets another suspect; a node
    is in one job per round."""
    sus, ok = _check_names(suspects), _check_names(passed)
    if set(sus) & set(ok):
        raise ValueError("a node cannot be both a suspect and passed: "
                         + ", ".join(sorted(set(sus) & set(ok))))
    want = min(partners, len(ok))
    got: dict[str, list[str]] = {s: [] for s in sus}
    seen = {s: set((met or {}).get(s, ())) for s in sus}
    todo_links = [(a, b) for a, b in links]
    rng = random.Random(seed + 104729)
    rounds: list[Round] = []
    while any(len(got[s]) < want for s in sus) or todo_links:
        jobs: list[Job] = []
        busy: set[str] = set()
        for a, b in list(todo_links):
            if not {a, b} & busy:
                jobs.append(pair(a, b))
                busy |= {a, b}
                todo_links.remove((a, b))
        free = [p for p in ok if p not in busy]
        rng.shuffle(free)
        # the most constrained suspect chooses first: fewest unmet partners left
        order = sorted((s for s in sus if len(got[s]) < want and s not in busy),
                       key=lambda s: sum(p not in seen[s] and p not in got[s] for p in ok))
        for s in order:
            unmet = any(p not in seen[s] and p not in got[s] for p in ok)
            # while an unmet partner exists, wait for it rather than meet a node again
            p = next((p for p in free if p not in busy and p not in got[s]
                      and (p not in seen[s] or not unmet)), None)
            if p is None:
                continue
            jobs.append(pair(s, p))
            busy |= {s, p}
            got[s].append(p)
        if not jobs:
            break
        everyone = [*sus, *ok, *(x for link in links for x in link)]
        idle = tuple(dict.fromkeys(n for n in everyone if n not in busy))
        rounds.append(Round("repair", start + len(rounds), tuple(jobs), idle))
    return tuple(rounds)
