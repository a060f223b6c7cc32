"""The datasheet (the shipped gpu_peaks.yaml as typed variants), the variant a GPU's
measurements fit, and the FP8 rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.steps.health import datasheet
from orchestrator.steps.health.variant import Measured, fp8_problem, fp8_supported, name_variant

REF = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "h200x1-health" /
                  "ref.json").read_text())
SHEET = datasheet.shipped()


def _like(name: str, fraction: float = 1.0, **over: object) -> Measured:
    """What a healthy GPU of this variant measures (datasheet x achievable), scaled."""
    v = SHEET.variant(name)
    assert v is not None
    m = dict(memory_mib=v.memory_gb * 0.97 * 1024, copy_gbps=v.memory_gbps *
             v.achievable.memory_copy * fraction, power_limit_w=v.tdp_w, cc=v.cc)
    m.update(over)
    return Measured(**m)  # type: ignore[arg-type]


def test_the_shipped_datasheet_is_whole_and_sourced() -> None:
    names = {v.name for v in SHEET.variants}
    assert {"A100 40 GB PCIe", "A100 40 GB SXM", "A100 80 GB PCIe", "A100 80 GB SXM",
            "H100 PCIe", "H100 SXM", "H100 NVL", "H200 SXM", "H200 NVL", "L40S", "L4", "A10",
            "V100 16 GB SXM2", "V100 32 GB PCIe"} <= names
    for v in SHEET.variants:
        assert v.sources and all(s.url.startswith("https://") for s in v.sources), v.name
        assert v.memory_gbps > 0 and v.tdp_w > 0 and v.pcie.width == 16
        assert v.fp8 == (v.cc >= (8, 9)) == (v.peak("fp8") is not None), v.name
    a100 = {v.name: v for v in SHEET.variants if v.name.startswith("A100")}
    assert [a100[n].memory_gbps for n in ("A100 40 GB PCIe", "A100 80 GB PCIe",
                                          "A100 80 GB SXM")] == [1555, 1935, 2039]
    assert SHEET.variant("H200 SXM").peak("bf16") == 989.5  # type: ignore[union-attr]
    # the achievable fractions are the H200 reference's figures over its datasheet
    h200 = SHEET.variant("H200 SXM")
    assert h200 is not None
    assert h200.achievable.memory_copy == pytest.approx(REF["copy_2GiB_GBps"] / 4800, abs=1e-3)
    assert h200.achievable.bf16 == pytest.approx(REF["mm_bf16_TFLOPs"] / 989.5, abs=1e-3)
    assert h200.achievable.fp8 == pytest.approx(REF["mm_fp8_TFLOPs"] / 1979, abs=1e-3)
    assert h200.achievable.host_copy == pytest.approx(REF["h2d_pinned_1GiB_GBps"] / 63.0,
                                                      abs=1e-3)


def test_names_map_to_variants_as_mfu_reads_them() -> None:
    assert SHEET.for_name("NVIDIA H200").name == "H200 SXM"  # type: ignore[union-attr]
    assert SHEET.for_name("NVIDIA H200 NVL").name == "H200 NVL"  # type: ignore[union-attr]
    assert SHEET.for_name("NVIDIA H100 80GB HBM3").name == "H100 SXM"  # type: ignore[union-attr]
    assert SHEET.for_name("NVIDIA A100-PCIE-40GB").name == "A100 40 GB PCIe"  # type: ignore[union-attr]
    assert SHEET.for_name("NVIDIA A100 80GB PCIe").name == "A100 80 GB PCIe"  # type: ignore[union-attr]
    assert SHEET.for_name("Tesla V100-SXM2-32GB").name == "V100 32 GB SXM2"  # type: ignore[union-attr]
    assert SHEET.for_name("NVIDIA A100-SXM-64GB") is None  # the general A100 row: no datasheet
    assert SHEET.for_name("NVIDIA GeForce GTX 1080") is None


def test_pcie_per_direction() -> None:
    assert datasheet.pcie_gbps(5, 16) == pytest.approx(63.02, abs=0.01)
    assert datasheet.pcie_gbps(4, 16) == pytest.approx(31.51, abs=0.01)
    assert datasheet.pcie_gbps(3, 8) == pytest.approx(7.88, abs=0.01)
    assert datasheet.pcie_gbps(1, 16) == 4.0


def test_the_h200_reference_measures_like_an_h200_sxm() -> None:
    m = Measured(memory_mib=143771, copy_gbps=REF["copy_2GiB_GBps"],
                 read_gbps=REF["read_sum_2GiB_GBps"], power_limit_w=700,
                 bf16_tflops=REF["mm_bf16_TFLOPs"], fp64_tflops=REF["mm_fp64_TFLOPs"],
                 fp8_ran=True, cc=(9, 0))
    n = name_variant(m, ordered="NVIDIA H200")
    assert n.best is not None and n.best.variant.name == "H200 SXM" and n.matches_order
    assert n.runner_up is not None and n.runner_up.variant.name == "H200 NVL"
    # the reference is one of the three runs FP64's fraction is the middle of (gpu_peaks.yaml)
    assert n.best.distance < 0.03 < 0.09 < n.runner_up.distance
    assert n.text == ("measures like H200 SXM: 4.30 TB/s memory read, 140 GiB, 700 W limit, "
                      "771 TFLOP/s bf16")


@pytest.mark.parametrize("name", [v.name for v in SHEET.variants])
def test_every_healthy_variant_is_named_itself(name: str) -> None:
    n = name_variant(_like(name))
    assert n.best is not None and n.best.variant.name == name


def test_a_40gb_pcie_a100_reporting_the_80gb_name() -> None:
    """Memory not measured (MIG, or a read refused), bandwidth and power tell."""
    m = _like("A100 40 GB PCIe", memory_mib=None)
    n = name_variant(m, ordered="NVIDIA A100 80GB PCIe")
    assert n.best is not None and n.best.variant.name == "A100 40 GB PCIe"
    assert n.matches_order is False and n.ordered is not None
    assert n.text == "measures like A100 40 GB PCIe: 1.36 TB/s memory copy, 250 W limit"


def test_a_copy_at_0_7_of_its_variant_is_still_that_variant_and_shows_the_gap() -> None:
    """A slow H100 SXM is still an SXM by its power limit and memory: the shortfall is
    the bandwidth judge's to flag, not a reason to misname it a PCIe card."""
    n = name_variant(_like("H100 SXM", fraction=0.7))
    assert n.best is not None and n.best.variant.name == "H100 SXM"
    (t,) = [t for t in n.best.terms if t.metric == "memory_gbps"]
    assert t.ratio == pytest.approx(0.7)


def test_compute_capability_and_fp8_narrow_the_candidates() -> None:
    # an Ampere card that measures like an L40S on paper is not named one
    m = _like("L40S", cc=(8, 6))
    n = name_variant(m)
    assert n.best is not None and n.best.variant.cc == (8, 6)
    assert set(n.candidates) == {"A10", "A10G", "A40"}
    assert all(SHEET.variant(c).fp8 for c in name_variant(  # type: ignore[union-attr]
        Measured(copy_gbps=700, fp8_ran=True)).candidates)
    assert name_variant(Measured()).best is None


def test_the_fp8_rule() -> None:
    assert fp8_supported((8, 0)) is False and fp8_supported((8, 9)) is True
    assert fp8_supported((9, 0)) is True and fp8_supported(None) is None
    assert fp8_problem(True, (8, 0)) == ("compute capability 8.0: FP8 needs 8.9 or more "
                                         "(Ada, Hopper), and the order needs FP8")
    assert fp8_problem(True, (9, 0)) is None
    assert fp8_problem(False, (7, 0)) is None and fp8_problem(None, (8, 0)) is None
    assert fp8_problem(True, None) is None


def test_a_variant_row_without_its_datasheet_is_refused() -> None:
    doc = {"achievable": SHEET.achievable.model_dump(), "variants": [
        {"name": "X1", "family": "X1", "tflops": 1, "memory_gb": 8}]}
    with pytest.raises(ValueError, match="lacks memory_gbps"):
        datasheet.parse_datasheet(doc)
    with pytest.raises(ValueError, match="lacks sources"):  # an MFU-only card still cites
        datasheet.parse_datasheet({"achievable": SHEET.achievable.model_dump(), "variants": [
            {"name": "X1", "family": "X1", "tflops": 1, "mfu_only": True}]})
    with pytest.raises(ValueError):
        datasheet.parse_datasheet({"achievable": SHEET.achievable.model_dump(),
                                   "variants": [{"name": "X", "family": "X", "tflopz": 1}]})
