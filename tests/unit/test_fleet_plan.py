"""steps/fleet/plan: disjoint rounds, partners met, no needless repeat, re-planning, re-pairing."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.steps.fleet import plan as P


def names(n: int) -> list[str]:
    return [f"n{i:04d}" for i in range(n)]


def assert_disjoint(rounds: tuple[P.Round, ...] | list[P.Round]) -> None:
    for r in rounds:
        seen = r.nodes
        assert len(seen) == len(set(seen)), f"round {r.index} uses a node twice: {r}"
        assert not set(seen) & set(r.idle), f"round {r.index}: idle nodes also busy"


def pair_counts(rounds: tuple[P.Round, ...] | list[P.Round]) -> Counter[frozenset[str]]:
    return Counter(frozenset(j.nodes) for r in rounds for j in r.jobs if len(j.nodes) == 2)


@settings(max_examples=150, deadline=None)
@given(n=st.integers(2, 160), partners=st.integers(1, 4), seed=st.integers(0, 2**31))
def test_pairs_are_disjoint_meet_enough_partners_and_never_repeat(n: int, partners: int,
                                                                  seed: int) -> None:
    nodes = names(n)
    rounds = P.pair_rounds(nodes, partners=partners, seed=seed)
    assert_disjoint(rounds)
    want = min(partners, n - 1)
    met = P.partners_of(P.jobs_of(rounds))
    assert all(len(met.get(x, ())) >= want for x in nodes)
    assert max(pair_counts(rounds).values()) == 1  # no pair twice
    assert all(len(j.nodes) == 2 for r in rounds for j in r.jobs)
    # few rounds: the circle method's `partners` rounds, one more for odd N
    assert len(rounds) <= want + (n % 2)
    assert all(len(r.jobs) <= n // 2 for r in rounds)
    assert [r.index for r in rounds] == list(range(len(rounds)))
    assert rounds == P.pair_rounds(nodes, partners=partners, seed=seed)  # deterministic


@pytest.mark.parametrize("n", [2, 3, 4, 5, 999, 1000, 1001])
def test_pairs_scale_with_linear_jobs_per_round(n: int) -> None:
    nodes = names(n)
    rounds = P.pair_rounds(nodes, partners=2, seed=3)
    assert_disjoint(rounds)
    met = P.partners_of(P.jobs_of(rounds))
    assert min(len(met[x]) for x in nodes) == min(2, n - 1)
    if n % 2 == 0 and n > 2:
        # every node busy in every circle round: N/2 jobs each, exactly two partners
        assert [len(r.jobs) for r in rounds] == [n // 2, n // 2]
        assert all(len(met[x]) == 2 for x in nodes)
    if n % 2 and n > 3:
        assert [len(r.jobs) for r in rounds[:2]] == [n // 2, n // 2]
        assert rounds[2].stage == "topup" and len(rounds[2].jobs) <= 2  # the two who sat out


def test_two_nodes_have_one_pair_and_it_is_not_repeated() -> None:
    rounds = P.pair_rounds(["a", "b"], partners=3)
    assert [[j.nodes for j in r.jobs] for r in rounds] == [[("a", "b")]]


def test_seed_changes_the_pairing_and_duplicates_are_refused() -> None:
    nodes = names(40)
    assert P.pair_rounds(nodes, seed=1) != P.pair_rounds(nodes, seed=2)
    with pytest.raises(ValueError, match="repeated: n0001"):
        P.pair_rounds(["n0001", "n0002", "n0001"])
    assert P.pair_rounds(["only"]) == ()


@settings(max_examples=100, deadline=None)
@given(n=st.integers(2, 120))
def test_ring_gives_each_node_its_two_neighbours(n: int) -> None:
    nodes = names(n)
    rounds = P.ring_rounds(nodes)
    assert_disjoint(rounds)
    met = P.partners_of(P.jobs_of(rounds))
    for i, x in enumerate(nodes):
        assert met[x] == {nodes[(i - 1) % n], nodes[(i + 1) % n]} - {x}
    assert len(rounds) <= (2 if n % 2 == 0 else 3)
    assert max(pair_counts(rounds).values()) == 1


def test_ring_follows_the_topology_order() -> None:
    topo = {"a": "leaf2", "b": "leaf1", "c": "leaf2", "d": "leaf1"}
    met = P.partners_of(P.jobs_of(P.ring_rounds(["a", "b", "c", "d"], topology=topo)))
    # order b, d, a, c: d sits between b and a
    assert met["d"] == {"b", "a"} and met["c"] == {"a", "b"}


@settings(max_examples=100, deadline=None)
@given(n=st.integers(2, 80), size=st.sampled_from([4, 8, 16]),
       labels=st.integers(1, 6), seed=st.integers(0, 1000))
def test_groups_cover_every_node_once(n: int, size: int, labels: int, seed: int) -> None:
    import random

    nodes = names(n)
    rnd = random.Random(seed)
    topo = {x: f"leaf{rnd.randrange(labels)}" for x in nodes}
    for t in (None, topo):
        groups = P.groups_of(nodes, size, t)
        flat = [x for g in groups for x in g]
        assert sorted(flat) == nodes
        assert all(2 <= len(g) <= size + 1 for g in groups)
        assert sum(len(g) == size + 1 for g in groups) <= 1


def test_groups_stay_under_one_switch_where_they_can() -> None:
    nodes = names(24)
    # 8 nodes per leaf, interleaved in the inventory
    topo = {x: f"leaf{i % 3}" for i, x in enumerate(nodes)}
    for size in (4, 8):
        for g in P.groups_of(nodes, size, topo):
            assert len({topo[x] for x in g}) == 1, g
    # without a hint: by order
    assert P.groups_of(nodes, 8)[0] == tuple(nodes[:8])
    # leaves of 6 and groups of 4: two whole groups, the four left over together
    topo6 = {x: f"leaf{i // 6}" for i, x in enumerate(names(12))}
    groups = P.groups_of(names(12), 4, topo6)
    assert [len({topo6[x] for x in g}) for g in groups] == [1, 1, 2]


def test_group_rounds_skip_sizes_not_smaller_than_the_fleet_then_whole() -> None:
    rounds = P.group_rounds(names(10))
    assert [r.stage for r in rounds] == ["groups4", "groups8", "whole"]
    assert rounds[-1].jobs[0].nodes == tuple(names(10))
    assert [r.index for r in rounds] == [0, 1, 2]
    assert P.group_rounds(["a", "b"]) == ()  # the whole of two nodes is the pair itself
    assert_disjoint(rounds)


def test_fleet_plan_kinds() -> None:
    nodes = names(8)
    assert P.fleet_plan(nodes, "ring").rounds == P.ring_rounds(nodes)
    assert P.fleet_plan(nodes, "groups", seed=5).rounds == P.pair_rounds(nodes, seed=5)
    with pytest.raises(ValueError, match="unknown plan 'mesh'"):
        P.fleet_plan(nodes, "mesh")  # type: ignore[arg-type]


@settings(max_examples=150, deadline=None)
@given(n=st.integers(3, 90), partners=st.integers(1, 3), seed=st.integers(0, 2**20),
       done=st.integers(0, 3), data=st.data())
def test_replan_drops_nodes_and_still_meets_the_partners(n: int, partners: int, seed: int,
                                                         done: int, data: st.DataObject) -> None:
    nodes = names(n)
    plan = P.fleet_plan(nodes, partners=partners, seed=seed)
    done = min(done, len(plan.rounds))
    drop = set(data.draw(st.lists(st.sampled_from(nodes), max_size=max(0, n - 2), unique=True)))
    rest = P.replan(plan, done, drop)
    assert_disjoint(rest)
    assert not drop & {x for r in rest for x in [*r.nodes, *r.idle]}
    alive = [x for x in nodes if x not in drop]
    completed = [j for j in P.jobs_of(plan.rounds[:done]) if not drop & set(j.nodes)]
    everything = [P.Round("done", 0, tuple(completed)), *rest]
    met = P.partners_of(P.jobs_of(everything))
    want = min(partners, len(alive) - 1)
    assert all(len(met.get(x, ())) >= want for x in alive)
    assert max(pair_counts(everything).values(), default=1) == 1  # nothing run twice
    # planned jobs among the nodes left stay where they were
    for r in plan.rounds[done:]:
        kept = next((x for x in rest if x.index == r.index), None)
        for j in r.jobs:
            if not drop & set(j.nodes):
                assert kept is not None and j in kept.jobs


def test_replan_pairs_the_partner_left_alone_in_its_round() -> None:
    nodes = names(6)
    plan = P.fleet_plan(nodes, partners=2, seed=0)
    victim = plan.rounds[1].jobs[0].nodes[0]
    widow = plan.rounds[1].jobs[0].nodes[1]
    rest = P.replan(plan, 1, {victim})
    met = P.partners_of(j for j in [*P.jobs_of(plan.rounds[:1]), *P.jobs_of(rest)]
                        if victim not in j.nodes)
    assert len(met[widow]) >= 2
    # a job that failed (not in `completed`) does not count as met
    first = plan.rounds[0].jobs[0]
    rest2 = P.replan(plan, 1, set(), completed=[j for j in plan.rounds[0].jobs if j != first])
    met2 = P.partners_of([*[j for j in plan.rounds[0].jobs if j != first], *P.jobs_of(rest2)])
    assert all(len(met2[x]) >= 2 for x in nodes)


@settings(max_examples=150, deadline=None)
@given(n=st.integers(3, 60), k=st.integers(1, 6), partners=st.integers(1, 3),
       seed=st.integers(0, 10**6), data=st.data())
def test_repair_pairs_suspects_only_with_passed_nodes(n: int, k: int, partners: int, seed: int,
                                                      data: st.DataObject) -> None:
    nodes = names(n)
    sus = data.draw(st.lists(st.sampled_from(nodes), min_size=1, max_size=min(k, n - 1),
                             unique=True))
    passed = [x for x in nodes if x not in sus]
    first = P.pair_rounds(nodes, partners=2, seed=seed)
    met = P.partners_of(P.jobs_of(first))
    rounds = P.repair_rounds(sus, passed, met=met, partners=partners, seed=seed)
    assert_disjoint(rounds)
    got: dict[str, list[str]] = {s: [] for s in sus}
    for r in rounds:
        assert r.stage == "repair"
        for j in r.jobs:
            a, b = j.nodes
            assert (a in sus) != (b in sus), f"{j} is not a suspect with a passed node"
            s, p = (a, b) if a in sus else (b, a)
            assert p in passed
            got[s].append(p)
    for s in sus:
        assert len(got[s]) == len(set(got[s])) == min(partners, len(passed))
        unmet = [p for p in passed if p not in met.get(s, set())]
        # a partner it met before only once every unmet one is used
        assert len([p for p in got[s] if p in unmet]) == min(len(got[s]), len(unmet))


def test_repair_runs_a_suspect_link_again_and_refuses_overlap() -> None:
    rounds = P.repair_rounds(["x"], ["a", "b", "c"], links=[("a", "b")], partners=1)
    jobs = [j.nodes for r in rounds for j in r.jobs]
    assert ("a", "b") in jobs and ("x", "c") in jobs
    assert_disjoint(rounds)
    with pytest.raises(ValueError, match="both a suspect and passed: a"):
        P.repair_rounds(["a"], ["a", "b"])
    assert P.repair_rounds(["x"], []) == ()  # nobody to confirm with


def test_job_keys_stay_short_and_tell_groups_apart() -> None:
    assert P.pair("a", "b").key == "a+b"
    whole = P.Job(tuple(names(1000)))
    assert len(whole.key) < 40 and whole.key.startswith("n0000+999-")
    other = P.Job(tuple(reversed(names(1000))))
    assert other.key != whole.key
    keys = [j.key for r in P.group_rounds(names(64)) for j in r.jobs]
    assert len(keys) == len(set(keys))
