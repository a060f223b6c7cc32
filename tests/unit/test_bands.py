"""Reference bands: one model, per message size, for shipped and inventory bands."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError
from ruamel.yaml import YAML

from orchestrator.bands import Band, applicable, find_shipped, of_gpu, shipped
from orchestrator.inventory import InventoryFile
from payload.allreduce import parse_size

ROOT = Path(__file__).resolve().parents[2]


def test_shipped_bands_load_and_are_ordered() -> None:
    refs = shipped()
    assert len(refs) >= 5
    for r in refs:
        assert r.gpu and r.gpus and r.nodes
        for b in r.bands:
            assert b.lower <= b.value <= b.upper
            assert b.size_bytes == parse_size(b.size)
            # a figure nobody published is not shipped
            assert b.source and (b.source.startswith("https://github.com/NVIDIA/")
                                 or b.source.startswith("gpuvet's capture, tests/fixtures/"))


def test_find_shipped_matches_gpu_count_and_nodes() -> None:
    """The sourced figures (references.yaml) replaced the unsourced 128M ones of 8-GPU
    nodes: 8x A100 at 8G after NVIDIA/nccl-tests issue 149, 8x H100/H200 at 8G after 212."""
    a100 = find_shipped("NVIDIA A100-SXM4-80GB", 8, 1)
    assert a100 is not None
    assert [(b.collective, b.size, b.value, b.lower, b.upper) for b in a100.bands] == [
        ("all_reduce", "8G", 230, 185, 250), ("all_gather", "8G", 230, 185, 250),
        ("reduce_scatter", "8G", 230, 185, 250)]
    h200 = find_shipped("NVIDIA H200", 2, 1)
    assert h200 is not None
    assert {b.size: b.value for b in h200.bands} == {"128M": 285, "4G": 346}
    h200x8 = find_shipped("NVIDIA H200", 8, 1)
    assert h200x8 is not None and h200x8.bands[0].value == 370 and h200x8.nvls is False
    # a class that assumes NICs needs the node's facts: the nccl step checks them, callers
    # that know only GPU and count (fleet pairs, baselines) do not get it
    assert find_shipped("NVIDIA A100-SXM4-80GB", 8, 2) is None
    hdr = next(r for r in of_gpu("NVIDIA A100-SXM4-80GB") if r.nodes == 2)
    assert (hdr.nics, hdr.nic_rate_gbps) == (8, 200)
    assert {b.collective: b.value for b in hdr.bands} == {"all_reduce": 192, "alltoall": 48}


@pytest.mark.parametrize(("gpu", "gpus", "nodes"), [
    ("NVIDIA A100-SXM4-80GB", 4, 1),  # unknown GPU count
    ("NVIDIA A100-SXM4-80GB", 8, 4),  # unknown node count
    ("NVIDIA A100-SXM4-80GB", 8, 2),  # assumes 8x 200G NICs: not for a caller without facts
    ("NVIDIA H200", 1, 2),
    ("Tesla V100-SXM2-32GB", 8, 1),  # unknown GPU
    ("NVIDIA H100 PCIe", 8, 1),  # H100 band is for HBM3 (SXM5) only
    ("NVIDIA H200 NVL", 8, 1),  # NVSwitch figures are SXM's, not the NVL's bridges
])
def test_find_shipped_no_match(gpu: str, gpus: int, nodes: int) -> None:
    assert find_shipped(gpu, gpus, nodes) is None


def test_band_judges_below_within_above_at_the_edges() -> None:
    band = Band(value=285, lower=250, upper=360)
    assert band.judge(249.9).result == "below"
    assert band.judge(250).result == "within"
    assert band.judge(360).result == "within"
    j = band.judge(360.1)
    assert j.result == "above"
    assert (j.value, j.reference, j.lower, j.upper, j.unit, j.size) == (360.1, 285, 250, 360,
                                                                        "GB/s", 128 << 20)


def test_band_rejects_nonsense() -> None:
    with pytest.raises(ValidationError):
        Band(value=0, lower=0, upper=1)
    with pytest.raises(ValidationError):
        Band.model_validate({"value": 1, "lower": 0, "upper": 2, "typo": 1})
    with pytest.raises(ValidationError, match="lower <= value <= upper"):
        Band(value=300, lower=310, upper=400)
    with pytest.raises(ValidationError):
        Band(value=1, lower=0, upper=float("inf"))
    with pytest.raises(ValidationError, match="bad size"):
        Band(value=1, lower=0, upper=2, size="12Q")


def test_only_bands_of_measured_sizes_apply() -> None:
    """A 4 GiB result is never judged against the 128 MiB band."""
    h200 = find_shipped("NVIDIA H200", 2, 1)
    assert h200 is not None
    up_to_128m = [1 << k for k in range(3, 28)]
    assert [b.size for b in applicable(h200.bands, up_to_128m)] == ["128M"]
    big = [1 << 30, 2 << 30, 4 << 30]
    assert [b.size for b in applicable(h200.bands, big)] == ["4G"]
    assert applicable(h200.bands, [1 << 20]) == []


def test_references_file_names_the_key_the_inventory_accepts() -> None:
    text = (ROOT / "orchestrator/data/references.yaml").read_text()
    keys = set(re.findall(r"`expect\.(\w+)`", text))
    assert keys, "the comment should name the inventory key"
    for key in keys:
        assert key in InventoryFile.model_json_schema()["$defs"]["Expectations"]["properties"]


def test_docs_inventory_example_is_accepted(tmp_path: Path) -> None:
    """The inventory example of docs/inventory.md is documentation: it must load as
    written."""
    readme = (ROOT / "docs" / "inventory.md").read_text()
    m = re.search(r"## An inventory\s+```yaml\n(.*?)```", readme, re.S)
    assert m, "docs/inventory.md has an inventory example"
    data = YAML(typ="safe").load(m.group(1))
    doc = InventoryFile.model_validate(data)
    band = doc.providers["alpha-cloud"].expect.nccl_busbw
    assert band is not None


def test_judged_value_keeps_the_band_note() -> None:
    """The note says where a shipped figure came from; a report shows it beside the verdict."""
    band = Band(value=285, lower=250, upper=360, note="H200 x2, NVLink, capture of 2025")
    assert band.judge(300).note == "H200 x2, NVLink, capture of 2025"
    assert Band(value=285, lower=250, upper=360).judge(300).note is None


def test_applicable_bands_come_smallest_size_first_whatever_their_order() -> None:
    bands = [Band(value=360, lower=300, upper=400, size="4G"),
             Band(value=285, lower=250, upper=360, size="128M"),
             Band(value=100, lower=50, upper=150, size="1M")]
    assert [b.size for b in applicable(bands, [1 << 20, 128 << 20, 4 << 30])] == ["1M", "128M", "4G"]
    assert [b.size for b in applicable(bands, [4 << 30, 1 << 20])] == ["1M", "4G"]
