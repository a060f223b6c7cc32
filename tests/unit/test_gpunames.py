"""Orders as people write them, names as nvidia-smi prints them, and the one catalog of
cards (data/gpu_peaks.yaml) both are placed on: variants, never substrings."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from collectdoc import doc_from, inventory

from orchestrator import bands, cli, gpunames
from orchestrator.steps.health import datasheet
from orchestrator.steps.preflight.step import judge_document

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

# (order as written, name nvidia-smi prints, matches)
SPELLINGS = [
    ("H100 SXM5 80GB", "NVIDIA H100 80GB HBM3", True),
    ("H100-SXM-80G", "NVIDIA H100 80GB HBM3", True),
    ("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3", True),
    ("H100 80GB HBM3", "NVIDIA H100 80GB HBM3", True),
    ("H100", "NVIDIA H100 80GB HBM3", True),
    ("H100 SXM", "NVIDIA H100 80GB HBM3", True),
    ("A100 80GB PCIe", "NVIDIA A100 80GB PCIe", True),
    ("A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB", True),
    ("A100-SXM4-40GB", "A100-SXM4-40GB", True),  # R450 names have no NVIDIA prefix
    ("A100 80 GB", "NVIDIA A100-SXM4-80GB", True),
    ("A100 SXM4", "NVIDIA A100-SXM4-80GB", True),
    ("H200 SXM 141GB", "NVIDIA H200", True),
    ("H200", "NVIDIA H200", True),
    ("H200", "NVIDIA H200 NVL", True),
    ("H200 NVL", "NVIDIA H200 NVL", True),
    ("B200 SXM", "NVIDIA B200", True),
    ("B200 192GB", "NVIDIA B200", True),  # the package's 192 GB; 180 GB usable
    ("GB200 NVL72", "NVIDIA GB200", True),
    ("GH200", "NVIDIA GH200 480GB", True),
    ("GH200 96GB", "NVIDIA GH200 480GB", True),
    ("Tesla V100-SXM2-16GB", "Tesla V100-SXM2-16GB", True),
    ("TeslaV100", "Tesla V100-SXM2-16GB", True),
    ("V100 16GB", "Tesla V100-PCIE-16GB", True),
    ("L40S", "NVIDIA L40S", True),
    ("L4", "NVIDIA L4", True),
    ("A10G", "NVIDIA A10G", True),
    ("A10", "NVIDIA A10", True),
    ("H20", "NVIDIA H20-3e", True),
    ("RTX PRO 6000", "NVIDIA RTX PRO 6000 Blackwell Server Edition", True),
    ("RTX PRO 6000", "NVIDIA RTX PRO 6000 Blackwell Workstation Edition", True),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition",
     "NVIDIA RTX PRO 6000 Blackwell Server Edition", True),
    ("RTX 4090", "NVIDIA GeForce RTX 4090", True),
    ("B300", "NVIDIA B300 SXM6 AC", True),
    # the near misses: never the same card
    ("B200", "NVIDIA GB200", False),
    ("B200 SXM", "NVIDIA GB200", False),
    ("GB200", "NVIDIA B200", False),
    ("H200", "NVIDIA GH200 480GB", False),
    ("GH200", "NVIDIA H200", False),
    ("H100 SXM", "NVIDIA H100 PCIe", False),
    ("H100 PCIe", "NVIDIA H100 80GB HBM3", False),
    ("H100 SXM5 80GB", "NVIDIA H100 NVL", False),
    ("H100 PCIe", "NVIDIA H100 NVL", False),
    ("H100 NVL", "NVIDIA H100 PCIe", False),
    ("A100 80GB", "NVIDIA A100-SXM4-40GB", False),
    ("A100 40GB", "NVIDIA A100-SXM4-80GB", False),
    ("A100 80GB PCIe", "NVIDIA A100-PCIE-40GB", False),
    ("A100 SXM", "NVIDIA A100 80GB PCIe", False),
    ("L4", "NVIDIA L40S", False),
    ("L40S", "NVIDIA L4", False),
    ("L40S", "NVIDIA L40", False),
    ("A10", "NVIDIA A100-SXM4-80GB", False),
    ("A100", "NVIDIA A10", False),
    ("A10", "NVIDIA A10G", False),
    ("H100", "NVIDIA H200", False),
    ("H200", "NVIDIA H100 80GB HBM3", False),
    ("H20", "NVIDIA H200", False),
    ("H200 SXM", "NVIDIA H200 NVL", False),
    ("H100 SXM", "NVIDIA Graphics Device", False),  # unidentified is not a match
    ("TeslaV100", "Tesla P100-PCIE-16GB", False),
    ("RTX PRO 6000 Blackwell Server Edition",
     "NVIDIA RTX PRO 6000 Blackwell Workstation Edition", False),
]


@pytest.mark.parametrize(("order", "name", "ok"), SPELLINGS)
def test_orders_as_people_write_them(order: str, name: str, ok: bool) -> None:
    """Fault caught: tokens of the order looked up as substrings of the name (the old rule
    failed 'H100 SXM5 80GB' against 'NVIDIA H100 80GB HBM3' and read 'B200' in 'GB200')."""
    assert gpunames.model_matches(order, name) is ok
    assert gpunames.order_problem(order) is None  # every order above is placeable


@pytest.mark.parametrize(("order", "variants"), [
    ("H100 SXM5 80GB", "H100 SXM 80GB"),
    ("H100-SXM-80G", "H100 SXM 80GB"),
    ("NVIDIA H100 80GB HBM3", "H100 SXM 80GB"),
    ("A100 80GB PCIe", "A100 PCIe 80GB"),
    ("A100-SXM4-40GB", "A100 SXM 40GB"),
    ("H200 SXM 141GB", "H200 SXM 141GB"),
    ("H200", "H200 NVL 141GB, H200 SXM 141GB"),  # what the order leaves out matches any
    ("B200 SXM", "B200 SXM 180GB"),
    ("Tesla V100-SXM2-16GB", "V100 SXM 16GB"),
    ("A100 80GB", "A100 SXM 80GB, A100 PCIe 80GB"),
    ("GB200", "GB200 186GB"),
    ("H100 NVL", "H100 NVL 94GB"),
])
def test_an_order_means_what_it_says(order: str, variants: str) -> None:
    assert gpunames.place(order).labels == variants


@pytest.mark.parametrize(("order", "why"), [
    ("Tesla K80", "no card family gpuvet knows in it"),
    ("H100 SXM 40GB", "no H100 variant is SXM 40GB (H100 variants: H100 NVL 94GB, H100 PCIe "
     "80GB, H100 SXM 80GB)"),
    ("H200 PCIe", "no H200 variant is PCIe"),
    ("H100 SXM5 80GB turbo", "'turbo' is not a memory size, form factor or model word"),
    ("A100 40GB 80GB", "two memory sizes (40 and 80 GB)"),
    ("H100 SXM PCIe", "two form factors (sxm and pcie)"),
    ("", "names no card"),
])
def test_an_order_gpuvet_cannot_place_says_why(order: str, why: str) -> None:
    problem = gpunames.order_problem(order)
    assert problem is not None and why in problem


def test_the_order_matches_only_when_every_possible_variant_is_ordered() -> None:
    # a bare name that could be several variants proves none of them
    assert gpunames.model_matches("A100", "NVIDIA A100-SXM4-80GB")
    assert not gpunames.model_matches("A100 SXM 80GB", "A100")
    assert gpunames.model_matches("A100", "A100 80GB")  # one order against another (bands)


# --- the catalog --------------------------------------------------------------------------

SHEET = datasheet.shipped()
CATALOG = gpunames.catalog()
# the cards issue 30 lists, each with a whole datasheet (family, what gpunames places)
RENTED = ["B200", "B300", "GB200", "GH200", "H20", "H100", "H200", "L40S", "L4", "A10",
          "A10G", "RTX PRO 6000 Blackwell", "A100", "V100"]


def test_every_card_rented_now_has_its_datasheet() -> None:
    families = {v.family for v in SHEET.variants}
    assert set(RENTED) <= families
    boards = {(v.family, v.board) for v in SHEET.variants}
    assert {("H100", "pcie"), ("H100", "nvl"), ("H100", "sxm"), ("H200", "nvl"),
            ("H200", "sxm")} <= boards


@pytest.mark.parametrize("v", SHEET.variants, ids=lambda v: v.name)
def test_every_shipped_variant_has_its_figures_and_a_source(v: datasheet.Variant) -> None:
    assert v.sources and all(s.url.startswith("https://") and s.title for s in v.sources)
    assert v.memory_gb > 0 and v.memory_gbps > 0 and v.tdp_w > 0
    assert v.pcie.gen in (3, 4, 5, 6) and v.pcie.width == 16
    assert v.form_factor in ("sxm", "pcie") and v.board in ("sxm", "pcie", "nvl", "superchip")
    assert v.fp8 == (v.cc >= (8, 9)) == (v.peak("fp8") is not None)
    # FP4 tensor cores from Blackwell (compute capability 10 and 12) on, and only there
    assert (v.peak("fp4") is not None) == (v.cc[0] >= 10)
    # NVLink: generation, links and bandwidth together, or none of them
    assert (v.nvlink_gbps is None) == (v.nvlink_gen is None) == (v.nvlink_links is None)
    if v.family != "A10G":  # AWS publishes no per-precision figure for it
        assert v.peak("fp16") is not None and v.peak("fp32") is not None
    # the achievable fraction: measured on this variant, or said not to be
    assert v.achievable_measured == (v.name == SHEET.measured_on)
    assert (v.fraction_note == "") == v.achievable_measured
    card = next(c for c in CATALOG.cards if c.name == v.name)
    assert gpunames.place(v.label).cards == (card,), "its own label names it"
    if card.smi_names:
        assert all(gpunames.place(n, strict=False).cards == (card,) for n in card.smi_names)


def test_catalog_cards_without_a_datasheet_are_the_mfu_only_ones() -> None:
    extra = {c.name for c in CATALOG.cards} - {v.name for v in SHEET.variants}
    assert extra == {"B100", "H800 PCIe", "H800", "A800", "RTX A6000", "L40", "RTX 4090"}
    assert all(c.tflops for c in CATALOG.cards if c.name in extra)
    doc = gpunames.catalog_doc()
    assert "pci_ids" in doc["sources"]  # where the device ids come from
    ids = [i for c in CATALOG.cards for i in c.pci_ids]
    assert len(ids) == len(set(ids)) and all(re.fullmatch(r"[0-9a-f]{4}", i) for i in ids)
    labels = [c.label for c in CATALOG.cards]
    assert len(labels) == len(set(labels))


def test_only_the_measured_variant_is_judged_without_a_note() -> None:
    h200, b200 = SHEET.variant("H200 SXM"), SHEET.variant("B200 SXM")
    assert h200 is not None and b200 is not None
    assert h200.achievable_measured and h200.fraction_note == ""
    assert b200.fraction_note == ("; no achievable fraction measured on B200 SXM yet: judged "
                                  "against its datasheet with the H200 SXM's")


# every name an nvidia-smi output (or a tool printing its device names: nccl-tests,
# nvbandwidth) shows in the fixtures; desktop cards no one rents for training stay out
NAME_PATTERNS = [re.compile(p, re.M) for p in (
    r"^GPU \d+: (.+?) \(UUID",  # nvidia-smi -L
    r"^\d+, ((?:NVIDIA|Tesla) [^,\n]+),",  # --query-gpu
    r"^\|\s+\d+\s+((?:NVIDIA|Tesla) \S.*?)\s+(?:On|Off)\s+\|",  # the default table
    r"device\s+\d+ \[[0-9a-fx]+\] ((?:NVIDIA|Tesla) .+?)\s*$",  # nccl-tests rank lines
    r"^Device \d+: ((?:NVIDIA|Tesla) .+?) \(",  # nvbandwidth
    r"^\s*Product Name\s*:\s*(.+?)\s*$",  # nvidia-smi -q
    r"<product_name>(.+?)</product_name>",  # nvidia-smi -q -x
)]
DESKTOP = {"NVIDIA GeForce GTX 1050 Ti", "NVIDIA GeForce GTX 950", "NVIDIA TITAN V"}
# what a driver older than the card prints: no variant by name (the PCI device id or memory
# and SM count identify it, tested below)
GENERIC = {"NVIDIA Graphics Device"}


def fixture_names() -> dict[str, str]:
    names: dict[str, str] = {}
    for p in sorted(FIXTURES.rglob("*")):
        if not p.is_file() or p.stat().st_size > 5_000_000:
            continue
        text = p.read_text(errors="replace")
        for pat in NAME_PATTERNS:
            for m in pat.finditer(text):
                names.setdefault(m.group(1).strip(), str(p.relative_to(FIXTURES)))
    return {n: f for n, f in names.items() if not n.endswith("...")}  # a table cut the name


def test_every_real_name_in_the_fixtures_is_exactly_one_variant() -> None:
    names = fixture_names()
    assert {"NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA L40S",
            "NVIDIA A10G", "NVIDIA H20-3e", "NVIDIA GH200 480GB", "Tesla V100-SXM2-16GB",
            "A100-SXM4-40GB"} <= set(names)
    for name, where in names.items():
        cards = gpunames.place(name, strict=False).cards
        if name in DESKTOP or name in GENERIC:
            assert cards == (), name
            continue
        assert len(cards) == 1, f"{name!r} ({where}) places on {[c.label for c in cards]}"


# --- a card the driver cannot name ---------------------------------------------------------

def test_a_graphics_device_is_identified_by_its_pci_device_id() -> None:
    for dev in ("0x290110DE", "10de:2901", "0x2901"):
        ident = gpunames.identify("NVIDIA Graphics Device", dev)
        assert [c.name for c in ident.cards] == ["B200 SXM"]
        assert ident.how == "by its PCI device id 10de:2901"
    assert gpunames.identify("NVIDIA Graphics Device", "0x123410DE").cards == ()
    assert gpunames.identify("NVIDIA Graphics Device", "8086:2901").cards == ()  # not NVIDIA's
    # by its name first, where the name says it
    assert gpunames.identify("NVIDIA H200", "0x290110DE").how == "by its name"


def test_a_graphics_device_is_identified_by_memory_and_sm_count() -> None:
    ident = gpunames.identify("NVIDIA Graphics Device", None, memory_mib=183359, sms=148)
    assert [c.name for c in ident.cards] == ["B200 SXM"]
    assert ident.how == "by its memory (179 GiB) and SM count (148)"
    # an H100 SXM and an H100 PCIe share 80 GB; the SMs tell them apart
    assert [c.name for c in gpunames.identify(None, None, 81559, 132).cards] == ["H100 SXM"]
    assert [c.name for c in gpunames.identify(None, None, 81559, 114).cards] == ["H100 PCIe"]
    assert gpunames.identify("NVIDIA Graphics Device", None, 81559, 99).cards == ()


def _query(name: str, device_id: str | None) -> dict[str, Any]:
    cols = ["index", "pci.bus_id", "name"] + (["pci.device_id"] if device_id else [])
    row = ["0", "00000000:19:00.0", name] + ([device_id] if device_id else [])
    return doc_from(texts={"query_gpu": ", ".join(cols) + "\n" + ", ".join(row) + "\n"})


def _model(doc: dict[str, Any], order: str) -> tuple[str, str]:
    inv = inventory({"gpu_model": order}, nodes=["node-a"])
    f = next(f for f in judge_document(doc, inv.node("node-a"), inv, "run-1", None).findings
             if f.code == "GPU_MODEL")
    return f.severity, f.message


def test_the_model_check_says_how_a_graphics_device_was_identified() -> None:
    sev, msg = _model(_query("NVIDIA Graphics Device", "0x290110DE"), "B200 SXM")
    assert sev == "PASS"
    assert msg == ("NVIDIA Graphics Device matches B200 SXM 180GB (ordered B200 SXM); GPU0 "
                   "NVIDIA Graphics Device identified by its PCI device id 10de:2901 as B200 SXM "
                   "180GB")
    sev, msg = _model(_query("NVIDIA Graphics Device", "0x294110DE"), "B200 SXM")
    assert sev == "FAIL" and "GPU0 NVIDIA Graphics Device (GB200 186GB)" in msg
    sev, msg = _model(_query("NVIDIA Graphics Device", None), "B200 SXM")
    assert sev == "WARN" and "'NVIDIA Graphics Device' (a driver older than the card)" in msg


def test_the_model_check_names_the_variant_that_matched() -> None:
    assert _model(_query("NVIDIA H100 80GB HBM3", None), "H100 SXM5 80GB") == (
        "PASS", "NVIDIA H100 80GB HBM3 matches H100 SXM 80GB (ordered H100 SXM5 80GB)")
    assert _model(_query("NVIDIA GB200", None), "B200") == (
        "FAIL", "GPU model differs from the order (B200): GPU0 NVIDIA GB200 (GB200 186GB); the "
        "order allows B200 SXM 180GB")


# --- the inventory check -----------------------------------------------------------------

def test_an_order_gpuvet_cannot_place_is_an_inventory_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text("providers:\n"
                   "  good:\n"
                   "    executor: local\n"
                   "    expect: {gpu_model: H100 SXM5 80GB}\n"
                   "    nodes: [{name: a}]\n"
                   "  bad:\n"
                   "    executor: local\n"
                   "    expect:\n"
                   "      gpus_per_node: 8\n"
                   "      gpu_model: Tesla K80\n"
                   "    nodes: [{name: b}]\n")
    assert cli.run(["inventory", "check", str(inv)]) == 2
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if "gpu_model" in x)
    assert line.strip().startswith(f"{inv}:10: providers.bad.expect.gpu_model: gpuvet cannot "
                                   "place the GPU model 'Tesla K80': no card family gpuvet "
                                   "knows in it; known variants: B200 SXM 180GB, ")
    assert "H100 SXM 80GB" in line and "A10G 24GB" in line and "Traceback" not in err
    assert "providers.good" not in err


def test_every_shipped_band_names_cards_gpuvet_can_place() -> None:
    """The shipped reference bands are found for a machine by the same matching as orders."""
    for ref in bands.shipped():
        assert gpunames.order_problem(ref.gpu) is None, ref.gpu
    assert bands.find_shipped("NVIDIA H100 80GB HBM3", 8, 1) is not None
    assert bands.find_shipped("NVIDIA H100 PCIe", 8, 1) is None  # an SXM band is not a PCIe's
