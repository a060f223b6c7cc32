"""`gpuvet history`: a card that FAILs twice is named with both runs, a replaced card is
shown, setup-side FAILs never count."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.analysis import history
from orchestrator.rebuild import rebuild_index
from tests.unit import fleetstore as F
from tests.unit.clirun import gpuvet
from tests.unit.twoorders import two_orders_store


def _day(d: int) -> dict[str, tuple[str, str]]:
    return {k: (a.replace("12-01", f"12-0{d}"), b.replace("12-01", f"12-0{d}"))
            for k, (a, b) in F.TIMES.items()}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    tmp = tmp_path_factory.mktemp("hist")
    root = tmp / "results"
    inv = F.write_inventory(tmp)
    ids: dict[str, str] = {}
    cards = {n: [F.gpu(n, 0), F.gpu(n, 1)] for n in F.NODES}
    for day in (1, 2):  # n3's GPU 1 FAILs its memory bandwidth on both days
        t = _day(day)
        ids[f"pre{day}"] = F.preflight(root, inv, t["preflight"], cards).run_id
        ids[f"health{day}"] = F.health(root, inv, t["health"], F.NODES, {"n3": 1}).run_id
    ids["train"] = F.train_oom(root, inv, _day(2)["train"]).run_id  # the setup's, twice
    ids["train2"] = F.train_oom(root, inv, _day(3)["train"]).run_id
    # day 4: n3 came back with other cards, and they pass
    replaced = {**cards, "n3": [F.gpu("n3", 0, 1), F.gpu("n3", 1, 1)]}
    t = _day(4)
    ids["pre4"] = F.preflight(root, inv, t["preflight"], replaced).run_id
    ids["health4"] = F.health(root, inv, t["health"], F.NODES, {}).run_id
    rebuild_index(root)
    return root, ids


def test_a_card_failing_twice_is_named_with_both_runs(store) -> None:
    root, ids = store
    h = history.history(root, "acme")
    serial = F.gpu("n3", 1)["serial"]
    (line,) = [r for r in h.repeats if serial in r]
    assert f"GPU serial {serial}" in line and "n3 GPU 1" in line
    assert "FAILed HEALTH_MEMBW in 2 of its 4 runs since 2026-12-01" in line
    assert ids["health1"] in line and ids["health2"] in line
    assert not any("TRAIN_OOM" in r for r in h.repeats)  # the setup's, not the node's
    assert len(h.repeats) == 1
    # the health runs read the cards of the preflight before them
    row = next(r for r in h.runs if r.run_id == ids["health2"] and r.node == "n3")
    assert row.cards_from is not None and row.cards_from.run_id == ids["pre2"]
    assert row.card_fails == {f"serial {serial}": ["HEALTH_MEMBW"]}


def test_a_node_back_with_other_cards_is_a_replacement(store) -> None:
    root, ids = store
    h = history.history(root, "acme")
    (line,) = h.replacements
    assert line.startswith(f"node n3 came back with other cards in run {ids['pre4']}")
    assert f"GPU 1 serial {F.gpu('n3', 1)['serial']} gone" in line
    assert f"GPU 1 serial {F.gpu('n3', 1, 1)['serial']} new" in line
    cards = {r[0]: r for r in history.cards_table(h).rows}
    new = cards[F.gpu("n3", 1, 1)["serial"]]
    assert new[4] == 2 and "FAIL" not in new[5]  # pre4 and health4, both clean


def test_the_command_lists_and_refuses_an_unknown_provider(store, capsys) -> None:
    root, ids = store
    r = gpuvet(capsys, "history", "-p", "acme", "--results", root)
    assert r.returncode == 0, r.output
    assert "FAIL again: GPU serial" in r.stdout and "replaced: node n3" in r.stdout
    r = gpuvet(capsys, "history", "-p", "acm", "--results", root, "--json")
    assert r.returncode == 2 and "did you mean 'acme'" in r.stderr.replace('"', "'")
    r = gpuvet(capsys, "history", "-p", "acme", "--results", root, "--json")
    doc = json.loads(r.stdout)
    assert doc["provider"] == "acme" and len(doc["repeats"]) == 1
    assert {c["serial"] for x in doc["runs"] for c in x["cards"]} >= {F.gpu("n3", 1)["serial"]}


def test_bus_ids_in_their_forms_are_one() -> None:
    assert history.bus_key("00000000:19:00.0") == history.bus_key("0000:19:00") == "19:00"
    assert history.bus_key("nothing") is None


def test_serials_of_the_real_runs_come_from_the_xml_query(tmp_path) -> None:
    """The fixture's --query-gpu predates the serial field: nvidia-smi -q -x gives it."""
    root = two_orders_store(tmp_path / "results")
    h = history.history(root, "h200")
    (card,) = h.cards.values()
    assert (card.index, card.serial, card.uuid, card.pci_bus_id) == (
        0, "1651424018701", "GPU-635aa559-342d-fd8a-25a8-4c949a188422", "00000000:00:06.0")
    assert h.repeats == [] and h.replacements == []
