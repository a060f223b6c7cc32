"""The cost of a good GPU-hour, computed by hand for four nodes of which one is dead."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.analysis import compare
from payload.scrub import scrub_text
from tests.unit.fleetstore import INVENTORY, PRICE, fleet_store


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> compare.Comparison:
    tmp = tmp_path_factory.mktemp("fleet")
    root = tmp / "results"
    fleet_store(root, tmp)
    return compare.build(root, ["acme"])


def test_one_dead_node_of_four_by_hand(fleet: compare.Comparison) -> None:
    (g,) = fleet.good_hours
    # instance up since boot: 08:00 to 10:20, billed per hour: 3 h; 4 nodes x 2 GPUs
    hours, gpus, good_gpus, lost_gpus = 3.0, 8, 6, 2
    assert g.failed_nodes == ["n3"]
    assert g.good_nodes == ["n1", "n2", "n4"]  # n1's TRAIN_OOM is the setup's, not the node's
    assert g.figure("billed GPU-hours").value == hours * gpus == 24
    assert g.figure("good GPU-hours").value == hours * good_gpus == 18
    per = PRICE * gpus * hours / (hours * good_gpus)  # 60 USD / 18 good GPU-h
    assert g.figure("cost of a good GPU-hour").value == pytest.approx(per) == \
        pytest.approx(3.3333, abs=1e-4)
    assert g.figure("GPU-hours lost to failed nodes").value == hours * lost_gpus * PRICE == 15
    assert g.figure("dead on arrival").value == 0.25
    assert g.dead_on_arrival == ["n3"]
    # n1, n2 from 08:00 to preflight's end 09:06 (1.1 h); n4 from 08:30 (0.6 h)
    t = g.figure("time to a healthy node")
    assert t.value == pytest.approx(1.1)
    assert "n4 36 min" in t.inputs and "never healthy in these runs: n3" in t.inputs
    # each figure says what it was computed from
    assert "instance up since boot" in g.figure("billed GPU-hours").inputs
    assert "n3: HEALTH_MEMBW" in g.figure("GPU-hours lost to failed nodes").source


def test_figures_the_runs_cannot_give_say_so(fleet: compare.Comparison) -> None:
    (g,) = fleet.good_hours
    tokens = g.figure("per 1M training tokens")
    assert tokens.value is None and tokens.text.startswith("not known: no training throughput")
    table = next(t for t in fleet.tables if t.title == "cost of a good GPU-hour")
    assert table.rows[2][:3] == \
        ("acme", "cost of a good GPU-hour", "3.33 USD per good GPU-hour")
    doc = fleet.as_json()
    assert doc["good_gpu_hours"][0]["figures"][0]["value"] == 24
    # every cell reads the same after the scrubber every output goes through ("PASS: x"
    # would read as a password)
    for row in table.rows:
        for cell in row:
            assert scrub_text(str(cell)) == str(cell)
    assert "the nodes' first runs: health" in g.figure("dead on arrival").source


def test_without_a_price_or_boot_time_the_figures_say_not_known(tmp_path: Path) -> None:
    root = tmp_path / "results"
    fleet_store(root, tmp_path)
    for facts in root.glob("*/nodes/*/preflight/facts.json"):
        doc = json.loads(facts.read_text())
        doc["boot_time"] = None
        facts.write_text(json.dumps(doc))
    unpriced = tmp_path / "unpriced.yaml"
    unpriced.write_text(INVENTORY.replace(
        "    pricing: {gpu_hour: 2.5, currency: USD, billing_granularity: hour}\n", ""))
    (g,) = compare.build(root, ["acme"], inventory=unpriced).good_hours
    # the window is the runs' own (no boot time): 6 + 50 + 15 min, not rounded
    assert g.figure("good GPU-hours").value == pytest.approx(71 / 60 * 6)
    for name in ("cost of a good GPU-hour", "time to a healthy node",
                 "per 1M training tokens"):
        f = g.figure(name)
        assert f.value is None and f.text.startswith("not known: "), f
    assert "no boot time" in g.figure("time to a healthy node").text
    lost = g.figure("GPU-hours lost to failed nodes")
    assert lost.value is None and lost.text.startswith("2.367 GPU-h, not priced (add pricing")
    c = compare.build(root, ["acme"], with_cost=False)
    assert c.good_hours == []
    assert not any(t.title == "cost of a good GPU-hour" for t in c.tables)
