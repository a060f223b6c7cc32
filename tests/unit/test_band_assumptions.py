"""Shipped bands state what they assume of the machine (GPU and count, nodes, NVLink, NICs
and their rate, NVLS) and where their figure comes from; a band whose assumption the run
breaks is not applied, and the finding says which assumption differed and where the
run's value was read (the log, NCCL INFO, preflight's facts of the same run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from orchestrator import bands, inventory
from orchestrator.bands import NodeTraits, ShippedBands, Trait
from orchestrator.inventory import Inventory
from orchestrator.nccltests import BuildDoc
from orchestrator.parsers.nccl_debug import nvls_state
from orchestrator.parsers.nccl_tests import parse_nccl_tests
from orchestrator.records import Finding
from orchestrator.steps.nccl.judge import Series, _bands, judge_series
from orchestrator.store import Run
from orchestrator.suite import Suite

FIX = Path(__file__).resolve().parents[1] / "fixtures"
# hand-written samples (tests/fixtures/nccl-tests/README.md): 8x A100 80GB to 8 GiB, and
# two 8x H100 nodes over eight NET/IB NICs to 8 GiB
A100_8 = FIX / "nccl-tests" / "all_reduce_2.13-era_dgx-a100-80g.log"
H100_2NODE = FIX / "nccl-tests" / "all_reduce_2node-h100_ib-gdrdma_nccl-info.log"
# NVIDIA/nccl-tests issue 290: two 8x H100 nodes, 155.57 GB/s at 8 GiB, no NCCL INFO
H100_2NODE_PUBLIC = FIX / "public" / "all_reduce_2node-h100_srun-label.log"
SUITE = Suite()


@pytest.fixture
def run(tmp_path: Path) -> Run:
    return Run.create(tmp_path / "results", command="test", suite_hash=SUITE.hash,
                      suite=SUITE.model_dump(mode="json"), inventory_path=None)


def inv(tmp_path: Path, nodes: int) -> Inventory:
    names = "\n".join(f"      - name: lab-{i}" for i in range(nodes))
    p = tmp_path / f"inv{nodes}.yaml"
    p.write_text(f"version: 1\nproviders:\n  lab:\n    executor: local\n    nodes:\n{names}\n")
    return inventory.load(p)


def preflight(run: Run, node: str, *, nv: str | None = None, ports: int = 0,
              lane_gbps: float = 100.0) -> None:
    """A preflight facts.json as the step writes it: topo -m's matrix of 8 GPUs with `nv`
    between every pair, and `ports` active 4X ports of `lane_gbps` in ibv_devinfo."""
    facts: dict[str, object] = {}
    if nv is not None:
        gpus = [f"GPU{i}" for i in range(8)]
        facts["topo_m"] = {"gpus": [], "nics": [], "nic_legend": {}, "pcie_only": False,
                           "matrix": {a: {b: "X" if a == b else nv for b in gpus}
                                      for a in gpus}}
    if ports:
        facts["ibv_devinfo"] = {"devices": [
            {"hca_id": f"mlx5_{i}", "ports": [{"port": 1, "state": "PORT_ACTIVE",
                                               "link_layer": "InfiniBand", "active_width": "4X",
                                               "active_speed_gbps": lane_gbps}]}
            for i in range(ports)]}
    out = run.node_dir(node, "preflight")
    out.mkdir(parents=True, exist_ok=True)
    (out / "facts.json").write_text(json.dumps({"facts": facts}))


def refs(fs: list[Finding]) -> list[Finding]:
    return [f for f in fs if f.code.startswith("NCCL_REFERENCE")]


# --- the model --------------------------------------------------------------------------

def test_a_shipped_band_without_its_source_is_refused() -> None:
    with pytest.raises(ValidationError, match="needs its source"):
        ShippedBands(gpu="H100 SXM", gpus=8, nodes=1,
                     bands=(bands.Band(value=370, lower=300, upper=400, size="8G"),))


def test_differing_names_the_assumption_both_values_and_where() -> None:
    ref = next(r for r in bands.of_gpu("NVIDIA H100 80GB HBM3") if r.nodes == 2)
    traits = NodeTraits(gpus=Trait(8, "the log"), nodes=Trait(2, "the log"),
                        nics=Trait(8, "ibv_devinfo"), nic_rate_gbps=Trait(200.0, "ibv_devinfo"),
                        nvls=Trait(False, "env"))
    assert bands.differing(ref, traits) == [
        "NIC rate (Gb/s): the band assumes 400, this run 200 (ibv_devinfo)"]
    # 4X x 106.25 Gb/s lanes print as 425: the same NDR port, not another rate
    ndr = NodeTraits(**{**traits.__dict__, "nic_rate_gbps": Trait(425.0, "ibv_devinfo")})
    assert bands.differing(ref, ndr) == []
    assert bands.unverified(ref, NodeTraits(gpus=Trait(8, "x"), nodes=Trait(2, "x"))) == [
        "NICs per node", "NIC rate (Gb/s)", "NVLS"]


def test_nvls_is_read_from_what_nccl_echoes() -> None:
    text = (FIX / "h200x2" / "nccl-tests" / "all_reduce_1G-4G_g2_nccl-debug-info.log").read_text()
    assert nvls_state(text) == (False, "NCCL_NVLS_ENABLE=0, log line 34")
    assert nvls_state(A100_8.read_text()) is None
    assert nvls_state("h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via NVLS\n") == (
        True, "NVLS in NCCL INFO, log line 1")


# --- through the judge ----------------------------------------------------------------------

def test_a_band_whose_nic_rate_differs_is_not_applied_and_says_why(run: Run, tmp_path: Path
                                                                   ) -> None:
    """Two H100 nodes whose preflight found 200G ports: the NDR band (8x 400G) is not
    theirs, and the finding says which assumption differed and where it was read."""
    the_inv = inv(tmp_path, 2)
    preflight(run, "lab-0", ports=8, lane_gbps=50.0)
    preflight(run, "lab-1", ports=8, lane_gbps=50.0)
    s = Series("multi", the_inv.nodes, [(1, H100_2NODE, False)], BuildDoc())
    fs, _ = judge_series(s, run, the_inv, SUITE)
    [ref] = refs(fs)
    assert ref.code == "NCCL_REFERENCE_NONE"
    assert ("8x H100 SXM on 2 nodes, 8x 400G NICs, NVLS off: NIC rate (Gb/s): the band "
            "assumes 400, this run 200 (preflight's ibv_devinfo of lab-0)") in ref.message
    assert ref.details["assumptions_differ"]


def test_a_band_whose_assumptions_hold_is_applied_with_its_source(run: Run, tmp_path: Path
                                                                  ) -> None:
    the_inv = inv(tmp_path, 2)
    for n in ("lab-0", "lab-1"):
        preflight(run, n, ports=8, lane_gbps=100.0)
    s = Series("multi", the_inv.nodes, [(1, H100_2NODE, False)], BuildDoc())
    fs, _ = judge_series(s, run, the_inv, SUITE)
    [ref] = refs(fs)
    assert (ref.code, ref.severity) == ("NCCL_REFERENCE", "PASS")
    assert ref.details["reference_source"] == "https://github.com/NVIDIA/nccl-tests/issues/290"
    assert "unverified" not in ref.details  # NICs and rate from preflight, NVLS from the env
    assert "source: https://github.com/NVIDIA/nccl-tests/issues/290" in ref.message


def test_fewer_nvlinks_than_the_band_assumes_is_named(run: Run, tmp_path: Path) -> None:
    the_inv = inv(tmp_path, 1)
    preflight(run, "lab-0", nv="NV8")
    fs, _ = judge_series(Series("single", the_inv.nodes, [(1, A100_8, False)], BuildDoc()),
                         run, the_inv, SUITE)
    [ref] = refs(fs)
    assert ref.code == "NCCL_REFERENCE_NONE"
    assert ("NVLink links per GPU pair: the band assumes NV12, this run NV8 (preflight's "
            "nvidia-smi topo -m of lab-0)") in ref.message


def test_nvlink_as_assumed_applies_the_sourced_a100_band(run: Run, tmp_path: Path) -> None:
    the_inv = inv(tmp_path, 1)
    preflight(run, "lab-0", nv="NV12")
    fs, _ = judge_series(Series("single", the_inv.nodes, [(1, A100_8, False)], BuildDoc()),
                         run, the_inv, SUITE)
    [ref] = refs(fs)
    assert (ref.code, ref.severity) == ("NCCL_REFERENCE", "PASS")
    assert ref.message.startswith("[single] busbw 232.6 GB/s at 8 GiB is within the reference "
                                  "band 185-250 GB/s (expected about 230, shipped; sjeaugey")
    assert ref.details["reference_source"] == "https://github.com/NVIDIA/nccl-tests/issues/149"


def test_without_preflight_the_band_applies_and_says_what_was_not_verified(
        run: Run, tmp_path: Path) -> None:
    the_inv = inv(tmp_path, 1)
    fs, _ = judge_series(Series("single", the_inv.nodes, [(1, A100_8, False)], BuildDoc()),
                         run, the_inv, SUITE)
    [ref] = refs(fs)
    assert ref.code == "NCCL_REFERENCE" and ref.details["unverified"] == [
        "NVLink links per GPU pair"]
    assert ref.message.endswith("; unverified: NVLink links per GPU pair)")


def test_a_published_two_node_h100_log_is_below_the_ndr_band(run: Run) -> None:
    """NVIDIA/nccl-tests issue 290's two-node run, imported: 155.6 GB/s at 8 GiB, where the
    same thread expects 46-48 GB/s per NDR NIC; what its log cannot say is named."""
    s = Series("multi", [], [(1, H100_2NODE_PUBLIC, False)], BuildDoc(), provider="cap",
               n_nodes=2, imported=True)
    fs, _ = judge_series(s, run, None, SUITE)
    [ref] = refs(fs)
    assert (ref.code, ref.severity) == ("NCCL_REFERENCE", "WARN")
    assert ref.details["judged"]["value"] == pytest.approx(155.57)
    assert ref.details["unverified"] == ["NICs per node", "NIC rate (Gb/s)", "NVLS"]


def test_two_classes_that_fit_and_disagree_judge_nothing(tmp_path: Path) -> None:
    """8x H100 with NVLS unknown (a log that does not say): 370 with NVLS off, 480 with it
    on. Neither is applied, and the finding says NVLS is what is not known."""
    res = parse_nccl_tests(A100_8.read_text().replace("NVIDIA A100-SXM4-80GB",
                                                      "NVIDIA H100 80GB HBM3"))
    s = Series("single", [], [], BuildDoc(), provider="cap", n_nodes=1, imported=True)
    traits = NodeTraits(gpus=Trait(8, "the log"), nodes=Trait(1, "the log"))
    choice = _bands(s, res, None, traits)
    assert not [b for b in choice.bands if b.collective == "all_reduce"]
    assert choice.ambiguous == [
        "all_reduce at 8 GiB: 8x H100 SXM on 1 node, NVLS off (370) and 8x H100 SXM on 1 "
        "node, NVLS on (480) both fit, as NVLS, NVLink links per GPU pair is not known for "
        "this run"]
    # the other collectives have one band each: applied
    assert {b.collective for b in choice.bands} == {"all_gather", "reduce_scatter", "alltoall"}
    known = NodeTraits(gpus=Trait(8, "the log"), nodes=Trait(1, "the log"),
                       nvls=Trait(True, "NCCL INFO"))
    on = _bands(s, res, None, known)
    assert [b.value for b in on.bands if b.collective == "all_reduce"] == [480]


def test_a_run_without_peer_access_is_not_judged_against_nvlink_bands(
        run: Run, tmp_path: Path) -> None:
    """Peer access off (the inventory's env, or NCCL's own echo in a log): the A100 band,
    measured over NVLink peer access, is not this run's."""
    p = tmp_path / "inv-p2p.yaml"
    p.write_text("version: 1\nproviders:\n  lab:\n    executor: local\n    nodes:\n"
                 "      - {name: lab-0, env: {NCCL_P2P_DISABLE: '1'}}\n")
    the_inv = inventory.load(p)
    fs, _ = judge_series(Series("single", the_inv.nodes, [(1, A100_8, False)], BuildDoc()),
                         run, the_inv, SUITE)
    [ref] = refs(fs)
    assert ref.code == "NCCL_REFERENCE_NONE"
    assert ("peer access (P2P): the band assumes on, this run off (the inventory sets "
            "NCCL_P2P_DISABLE=1 for lab-0)") in ref.message
    log = tmp_path / "p2p-off.log"
    lines = A100_8.read_text().splitlines(keepends=True)
    log.write_text("".join(lines[:5]) + "a100-node-3:112904:112904 [0] NCCL INFO "
                   "NCCL_P2P_LEVEL set by environment to LOC\n" + "".join(lines[5:]))
    s = Series("single", [], [(1, log, False)], BuildDoc(), provider="cap", n_nodes=1,
               imported=True)
    [ref] = refs(judge_series(s, run, None, SUITE)[0])
    assert "this run off (NCCL_P2P_LEVEL=LOC, log line 6)" in ref.message
