"""steps/fleet/stragglers: the rank-times document and who is late at the barrier."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from orchestrator.errors import ParseError
from orchestrator.steps.fleet import stragglers as S


def doc(world: int = 8, iters: int = 30, *, late: dict[int, float] | None = None,
        late_every: int = 1, noise: float = 20.0, work: float = 1000.0,
        seed: int = 0, late_in: float | None = None) -> dict[str, Any]:
    """Every rank does `work` µs, a late rank `late[r]` more; all leave the barrier together."""
    rnd = random.Random(seed)
    ranks: list[dict[str, Any]] = [{"rank": r, "local_rank": r % 8, "host": f"h{r // 8}",
                                    "node": f"node{r // 8}", "work_us": [], "wait_us": []}
                                   for r in range(world)]
    for i in range(iters):
        arrive = []
        for r in range(world):
            on = i % 20 < late_in * 20 if late_in is not None else i % late_every == 0
            extra = (late or {}).get(r, 0.0) if on else 0.0
            arrive.append(work + extra + rnd.uniform(0, noise))
        release = max(arrive) + 5.0
        for r in range(world):
            ranks[r]["work_us"].append(round(arrive[r], 1))
            ranks[r]["wait_us"].append(round(release - arrive[r], 1))
    return {"kind": "gpuvet-rank-times", "version": 1, "backend": "nccl", "world": world,
            "iters": iters, "dim": 4096, "ranks": ranks}


def load(d: dict[str, Any]) -> S.RankTimes:
    return S.load_rank_times(json.dumps(d), "ranks.json")


def test_a_rank_late_every_iteration_is_the_straggler() -> None:
    rep = S.stragglers(load(doc(16, late={11: 400.0})))
    assert [(r.rank, r.node) for r in rep.stragglers] == [(11, "node1")]
    r = rep.ranks[11]
    assert r.late_us == pytest.approx(400, abs=30) and r.late_share == 1.0
    assert rep.threshold_us == pytest.approx(0.2 * 1000, rel=0.05)
    assert all(abs(x.late_us) < 30 for x in rep.ranks if x.rank != 11)


def test_noise_and_one_late_iteration_name_nobody() -> None:
    assert S.stragglers(load(doc(16))).stragglers == ()
    # 5 ms late once in 30 iterations: noise, not a straggler
    one = doc(16, late={3: 5000.0}, late_every=30)
    rep = S.stragglers(load(one))
    assert rep.stragglers == () and rep.ranks[3].late_share < 0.6
    # late by less than the threshold every time: not named either
    assert S.stragglers(load(doc(16, late={3: 120.0}))).stragglers == ()
    assert S.stragglers(load(doc(16, late={3: 120.0})), rel=0.05).stragglers[0].rank == 3


def test_late_in_most_iterations_counts_even_where_the_mean_is_low() -> None:
    # 300 µs late (threshold 200) in 65% of iterations: its median lateness is 300
    rep = S.stragglers(load(doc(8, iters=40, late={4: 300.0}, late_in=0.65)))
    assert [r.rank for r in rep.stragglers] == [4]


def test_jitter_as_large_as_the_work_names_only_the_late_rank() -> None:
    # jitter as large as the work time: against the earliest arrival every rank would look late
    rep = S.stragglers(load(doc(16, late={9: 4000.0}, noise=2000.0, work=2000.0, seed=3)))
    assert [r.rank for r in rep.stragglers] == [9]


def test_two_ranks_and_one_rank() -> None:
    rep = S.stragglers(load(doc(2, late={0: 500.0})))
    assert [r.rank for r in rep.stragglers] == [0]
    assert S.stragglers(load(doc(1))).ranks == ()


def test_the_share_matters_late_in_half_the_iterations() -> None:
    half = doc(8, late={2: 800.0}, late_every=2)
    assert S.stragglers(load(half)).stragglers == ()
    assert [r.rank for r in S.stragglers(load(half), share=0.4).stragglers] == [2]


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d.update(kind="x"), "not a gpuvet-rank-times document"),
    (lambda d: d.update(version=2), "version 2, this gpuvet reads 1"),
    (lambda d: d.update(world=3), "ranks: expected 3 entries"),
    (lambda d: d.update(iters=0), "iters: 0 is not a whole number >= 1"),
    (lambda d: d["ranks"][1].update(rank=0), r"ranks\[1\]\.rank is 0, expected 1"),
    (lambda d: d["ranks"][0]["wait_us"].pop(), r"ranks\[0\]\.wait_us: expected a list of 4"),
    (lambda d: d["ranks"][0]["work_us"].__setitem__(0, -1), r"-1 is not a time"),
    (lambda d: d["ranks"][0]["work_us"].__setitem__(0, True), r"True is not a time"),
    (lambda d: d["ranks"].__setitem__(0, 5), r"ranks\[0\] is not an object"),
])
def test_a_bad_document_names_the_field(edit: Any, message: str) -> None:
    d = doc(2, iters=4)
    edit(d)
    with pytest.raises(ParseError, match=message) as err:
        load(d)
    assert "ranks.json" in str(err.value)
    with pytest.raises(ParseError, match=r"ranks.json:1: not JSON"):
        S.load_rank_times("{", "ranks.json")


def test_median_without_one_element_matches_the_plain_median() -> None:
    import statistics

    rnd = random.Random(1)
    for n in range(2, 12):
        xs = sorted(rnd.uniform(0, 100) for _ in range(n))
        for pos in range(n):
            rest = xs[:pos] + xs[pos + 1:]
            assert S._median_without(xs, pos) == pytest.approx(statistics.median(rest))
