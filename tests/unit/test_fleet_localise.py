"""steps/fleet/localise: planted bad nodes and links in synthetic pair tables."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.bands import Band
from orchestrator.steps.fleet import localise as L
from orchestrator.steps.fleet import plan as P

MiB = 1 << 20
SIZES = (1 * MiB, 16 * MiB, 64 * MiB, 128 * MiB)
GOOD = 40.0  # GB/s of a healthy pair

Model = Callable[[tuple[str, str], str, int, int], float]  # (pair, stage, round, size) -> factor


def names(n: int) -> list[str]:
    return [f"node{i:03d}" for i in range(n)]


def samples(rounds: Sequence[P.Round], model: Model, *, repeats: int = 3, seed: int = 0,
            noise: float = 0.03, sizes: Sequence[int] = SIZES) -> list[L.PairSample]:
    rnd = random.Random(seed)
    out = []
    for r in rounds:
        for j in r.jobs:
            a, b = j.nodes
            for rep in range(1, repeats + 1):
                for size in sizes:
                    f = model((a, b), r.stage, r.index, size)
                    out.append(L.PairSample(nodes=(a, b), stage=r.stage, round=r.index, size=size,
                                            busbw=GOOD * f * (1 + rnd.uniform(-noise, noise)),
                                            repeat=rep, evidence=(f"fleet/{a}+{b}_r{r.index}.log",)))
    return out


def slow_nodes(bad: dict[str, float]) -> Model:
    def model(p: tuple[str, str], stage: str, rnd: int, size: int) -> float:
        return min([bad.get(p[0], 1.0), bad.get(p[1], 1.0)])
    return model


def slow_link(a: str, b: str, factor: float = 0.3) -> Model:
    def model(p: tuple[str, str], stage: str, rnd: int, size: int) -> float:
        return factor if set(p) == {a, b} else 1.0
    return model


def run_with_repair(nodes: list[str], model: Model, *, seed: int = 1,
                    bands: Sequence[Band] = ()) -> tuple[L.Localisation, L.Localisation]:
    first = P.pair_rounds(nodes, partners=2, seed=seed)
    s1 = samples(first, model, seed=seed)
    loc1 = L.localise(s1, bands=bands)
    sus, passed, links = L.repair_inputs(loc1)
    rounds = P.repair_rounds(sus, passed, links=links, partners=2, seed=seed,
                             met=P.partners_of(P.jobs_of(first)), start=len(first))
    loc2 = L.localise(s1 + samples(rounds, model, seed=seed + 1), bands=bands)
    return loc1, loc2


def test_a_healthy_fleet_names_nobody() -> None:
    nodes = names(16)
    loc1, loc2 = run_with_repair(nodes, slow_nodes({}))
    assert loc1.suspects == loc1.links == ()
    assert sorted(loc1.passed) == nodes and loc1.unjudged == ()
    assert [r.size for r in loc1.references] == [16 * MiB, 64 * MiB, 128 * MiB]  # not 1 MiB
    assert loc2.named() == ([], [])


def test_one_slow_node_is_the_suspect_and_the_repair_confirms_it() -> None:
    nodes = names(16)
    loc1, loc2 = run_with_repair(nodes, slow_nodes({"node005": 0.3}))
    assert [s.node for s in loc1.suspects] == ["node005"]
    assert loc1.suspects[0].status == "unconfirmed" and loc1.links == ()
    sus = loc2.suspects[0]
    assert sus.status == "confirmed" and len(sus.repairs) == 2
    assert all(set(r.nodes) - {"node005"} <= set(loc2.passed) for r in sus.repairs)
    assert loc2.named() == (["node005"], [])
    # the evidence: its pairs, each size against the median pair, and the logs
    row = sus.pairs[0].sizes[-1]
    assert row.size == 128 * MiB and row.ratio == pytest.approx(0.3, abs=0.05)
    assert row.reference == pytest.approx(GOOD, rel=0.05) and row.lower == 0.8 * row.reference
    assert len(row.samples) == 3 and row.value == sorted(row.samples)[1]
    assert sus.pairs[0].evidence[0].startswith("fleet/")
    # its partners are not blamed: each is fine with someone else
    partners = {x for p in sus.pairs for x in p.nodes} - {"node005"}
    assert partners <= set(loc2.passed)


def test_a_link_slow_only_together_is_a_link_not_a_node() -> None:
    nodes = names(12)
    first = P.pair_rounds(nodes, partners=2, seed=1)
    a, b = first[0].jobs[2].nodes
    loc1, loc2 = run_with_repair(nodes, slow_link(a, b))
    assert loc1.suspects == ()
    assert [lk.nodes for lk in loc1.links] == [(a, b)]
    link = loc2.links[0]
    assert link.status == "confirmed" and [r.nodes for r in link.repairs] == [(a, b)]
    assert {x for p in link.fine for x in p.nodes} >= {a, b} and not any(p.slow for p in link.fine)
    assert loc2.named() == ([], [(a, b)])
    assert a not in loc2.passed and b not in loc2.passed


def test_a_transient_link_is_cleared_when_run_again() -> None:
    nodes = names(8)
    first = P.pair_rounds(nodes, partners=2, seed=1)
    a, b = first[1].jobs[0].nodes

    def model(p: tuple[str, str], stage: str, rnd: int, size: int) -> float:
        return 0.4 if set(p) == {a, b} and stage != "repair" else 1.0

    _, loc2 = run_with_repair(nodes, model)
    assert loc2.links[0].status == "cleared" and loc2.named() == ([], [])


def test_the_median_pair_not_the_mean_two_dead_nodes_do_not_hide_a_slow_one() -> None:
    nodes = names(16)
    first = P.pair_rounds(nodes, partners=2, seed=4)
    met = P.partners_of(P.jobs_of(first))
    # two dead nodes and a third 30% slow, none of them partners of another
    x1 = nodes[0]
    x2 = next(n for n in nodes if n != x1 and n not in met[x1])
    y = next(n for n in nodes if n not in {x1, x2} and not met[n] & {x1, x2})
    bad = {x1: 0.05, x2: 0.05, y: 0.7}
    _, loc2 = run_with_repair(nodes, slow_nodes(bad), seed=4)
    named, links = loc2.named()
    assert sorted(named) == sorted(bad) and links == []
    ref = loc2.references[-1]
    assert ref.median == pytest.approx(GOOD, rel=0.05)


def test_a_node_whose_partners_were_both_bad_is_cleared_by_the_repair() -> None:
    nodes = names(12)
    first = P.pair_rounds(nodes, partners=2, seed=2)
    met = P.partners_of(P.jobs_of(first))
    victim = nodes[3]
    b1, b2 = sorted(met[victim])
    loc1, loc2 = run_with_repair(nodes, slow_nodes({b1: 0.2, b2: 0.2}), seed=2)
    # after the first pass the victim looks exactly like the bad ones
    assert {s.node for s in loc1.suspects} == {victim, b1, b2}
    status = {s.node: s.status for s in loc2.suspects}
    assert status == {victim: "cleared", b1: "confirmed", b2: "confirmed"}
    assert sorted(loc2.named()[0]) == sorted([b1, b2])


def test_a_suspect_with_nobody_to_confirm_it_stays_unconfirmed() -> None:
    loc = L.localise(samples(P.pair_rounds(["a", "b", "c"], seed=0),
                             slow_nodes({"a": 0.2, "b": 0.2, "c": 0.2})))
    # all pairs equal: nothing is slow against the median of the fleet itself
    assert loc.suspects == ()
    one = [L.PairSample(("a", "b"), "pairs", 0, 128 * MiB, 10.0)]
    band = Band(size="128M", value=40, lower=30, upper=50)
    loc = L.localise(one, bands=[band])
    # two nodes and one pair below the band: the fleet is slow, nobody can be told apart
    assert loc.suspects == () and [r.size for r in loc.fleet_below_band] == [128 * MiB]
    assert loc.table[0].sizes[0].band is not None
    assert loc.table[0].sizes[0].band.result == "below"


def test_a_band_names_a_pair_below_it_while_the_median_pair_meets_it() -> None:
    nodes = names(8)
    first = P.pair_rounds(nodes, partners=2, seed=0)
    band = Band(size="128M", value=40, lower=38, upper=45)
    # 12% slow: within the 20% tolerance of the median, but under the band's lower edge
    loc = L.localise(samples(first, slow_nodes({"node002": 0.88}), sizes=[128 * MiB],
                             noise=0.01), bands=[band])
    assert [s.node for s in loc.suspects] == ["node002"]
    assert loc.fleet_below_band == ()
    row = loc.suspects[0].pairs[0].sizes[0]
    assert row.band is not None and (row.band.lower, row.band.result) == (38, "below")
    assert row.ratio > 0.8  # the median alone would not have named it
    assert L.localise(samples(first, slow_nodes({"node002": 0.88}), sizes=[128 * MiB],
                              noise=0.01)).suspects == ()


def test_sizes_and_repeats_one_blip_is_not_a_slow_pair() -> None:
    nodes = names(8)
    first = P.pair_rounds(nodes, partners=2, seed=0)
    x = nodes[1]

    def small_only(p: tuple[str, str], stage: str, rnd: int, size: int) -> float:
        return 0.2 if x in p and size < 16 * MiB else 1.0

    def one_size(p: tuple[str, str], stage: str, rnd: int, size: int) -> float:
        return 0.2 if x in p and size == 64 * MiB else 1.0

    assert L.localise(samples(first, small_only)).suspects == ()
    assert L.localise(samples(first, one_size)).suspects == ()
    s = samples(first, slow_nodes({}), repeats=3)
    # one bad repeat of three at every size of x's pairs: the median of the repeats holds
    s = [L.PairSample(q.nodes, q.stage, q.round, q.size, q.busbw * 0.1, q.repeat, q.evidence)
         if x in q.nodes and q.repeat == 2 else q for q in s]
    assert L.localise(s).suspects == ()


def test_small_sizes_only_and_missing_sizes() -> None:
    s = [L.PairSample(("a", "b"), "pairs", 0, 1024, 1.0), L.PairSample(("c", "d"), "pairs", 0,
                                                                      1024, 1.1),
         L.PairSample(("a", "c"), "pairs", 1, 1024, 1.0),
         L.PairSample(("b", "e"), "pairs", 1, 4096, 1.0)]
    loc = L.localise(s)
    assert [r.size for r in loc.references] == [1024]  # the largest size most pairs have
    assert loc.unjudged == ("e",)
    with pytest.raises(ValueError, match="two different nodes"):
        L.localise([L.PairSample(("a", "a"), "pairs", 0, 1024, 1.0)])
    with pytest.raises(ValueError, match="tolerance"):
        L.localise(s, tolerance=1.5)


def test_group_results_are_not_pairs() -> None:
    with pytest.raises(ValueError, match="two different nodes"):
        L.localise([L.PairSample(("a", "b", "c"), "groups4", 0, 1024, 1.0)])  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(6, 60), factor=st.floats(0.05, 0.6), seed=st.integers(0, 10**6),
       kind=st.sampled_from(["node", "link"]))
def test_planted_faults_are_found_and_only_they(n: int, factor: float, seed: int,
                                                kind: str) -> None:
    nodes = names(n)
    rnd = random.Random(seed)
    first = P.pair_rounds(nodes, partners=2, seed=seed)
    if kind == "node":
        bad = rnd.choice(nodes)
        model = slow_nodes({bad: factor})
    else:
        a, b = rnd.choice(P.jobs_of(first)).nodes
        model = slow_link(a, b, factor)
    _, loc2 = run_with_repair(nodes, model, seed=seed)
    if kind == "node":
        assert loc2.named() == ([bad], [])
    else:
        assert loc2.named() == ([], [(a, b)])
