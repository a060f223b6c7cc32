"""Choosing nodes with -n and -p: what fleet commands run on."""

from pathlib import Path

import pytest

from orchestrator import inventory
from orchestrator.errors import InventoryError, UsageError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def inv() -> inventory.Inventory:
    return inventory.load(REPO / "tests/fixtures/inventories/fleet-32.yaml")


def names(nodes: list[inventory.Node]) -> list[str]:
    return [n.name for n in nodes]


def test_nothing_chosen_is_everything(inv: inventory.Inventory) -> None:
    assert len(inv.select()) == 32 and len(inv.select([], [])) == 32


def test_providers_as_a_list_or_a_single_name(inv: inventory.Inventory) -> None:
    assert names(inv.select(None, "delta-gpu")) == [f"delta-{i:02d}" for i in range(1, 17)]
    assert names(inv.select(providers=["delta-gpu"])) == names(inv.select(provider="delta-gpu"))
    assert len(inv.select(None, ["delta-gpu", "gamma-cloud"])) == 32


def test_names_and_providers_select_their_intersection(inv: inventory.Inventory) -> None:
    got = inv.select(["gamma-01", "delta-02", "delta-01"], ["delta-gpu"])
    assert names(got) == ["delta-01", "delta-02"]  # inventory order, gamma-01 left out


def test_empty_intersection_is_a_usage_error(inv: inventory.Inventory) -> None:
    with pytest.raises(UsageError, match="none of the nodes gamma-01 belongs to provider "
                                         "delta-gpu") as ei:
        inv.select(["gamma-01"], ["delta-gpu"])
    assert ei.value.exit_code == 2


def test_a_node_named_twice_runs_once(inv: inventory.Inventory) -> None:
    assert names(inv.select(["gamma-02", "gamma-01", "gamma-02"])) == ["gamma-01", "gamma-02"]
    assert names(inv.select(None, ["delta-gpu", "delta-gpu"])) == names(inv.select(None, "delta-gpu"))


def test_unknown_provider_says_did_you_mean(inv: inventory.Inventory) -> None:
    with pytest.raises(UsageError) as ei:
        inv.select(None, ["gamma-cloud", "delta-gpus"])
    assert not isinstance(ei.value, InventoryError)
    assert "no provider named 'delta-gpus' (did you mean 'delta-gpu'?)" in str(ei.value)
    assert ei.value.exit_code == 2


def test_unknown_node_is_a_usage_error_not_an_inventory_problem(inv: inventory.Inventory) -> None:
    with pytest.raises(UsageError) as ei:
        inv.select(["gama-01", "gamma-02", "zzz"])
    assert not isinstance(ei.value, InventoryError)
    msg = str(ei.value)
    assert "no node named 'gama-01' (did you mean 'gamma-01'?), 'zzz'" in msg
    assert "problem" not in msg and "fix the lines" not in msg
    with pytest.raises(UsageError, match="did you mean 'delta-03'") as ei2:
        inv.node("detla-03")
    assert not isinstance(ei2.value, InventoryError)
