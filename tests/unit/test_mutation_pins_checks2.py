"""Which file each preflight finding cites, and values exactly at each limit.

A finding's evidence is where a person goes to check it; a node that answers
the query CSV, `-q -x`, `-L` and the default table may tell each fact in a
different one, so the file cited must be the one that told the fact judged.
Documents here take GPU facts from different outputs per field (a query CSV
with only some columns, as a provider's own tooling writes one, beside the
XML) and put values exactly on each limit, on both sides of it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from collectdoc import H200_FILES, H200_ORDER, doc_from, fixture, h200_doc, h200_text, inventory

from orchestrator.gpunames import model_matches
from orchestrator.parsers import parse
from orchestrator.steps.preflight import checks, gpu
from orchestrator.steps.preflight.checks import NodeFacts
from orchestrator.steps.preflight.facts import driver_present
from orchestrator.steps.preflight.step import judge_document

XML = "raw/nvidia_smi_q_xml.txt"
CSV = "raw/query_gpu.txt"
LIST = "raw/nvidia_smi_L.txt"
TABLE = "raw/nvidia_smi.txt"
H200_BUS = ("00000000:00:06.0", "00000000:00:07.0")


def judge(tmp_path: Path, doc: dict[str, Any], expect: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Findings as (code, severity, message, evidence, details), evidence relative to the run."""
    inv = inventory(expect, nodes=["node-a"])
    rep = judge_document(doc, inv.node("node-a"), inv, "run-1", tmp_path,
                         lambda p: str(p.relative_to(tmp_path)))
    return [(f.code, f.severity, f.message, f.evidence, f.details) for f in rep.findings]


def only(found: list[tuple[Any, ...]], code: str) -> list[tuple[Any, ...]]:
    return [f for f in found if f[0] == code]


def query_csv(columns: list[str], rows: list[list[str]], names: tuple[str, ...] = ()) -> str:
    """A query CSV with index, bus id and name first, then the columns given (one row per GPU)."""
    head = ", ".join(["index", "pci.bus_id", "name"] + columns)
    body = [", ".join([str(i), H200_BUS[i], names[i] if names else "NVIDIA H200"] + r)
            for i, r in enumerate(rows)]
    return head + "\n" + "\n".join(body) + "\n"


def csv_with_xml(columns: list[str], rows: list[list[str]], **kw: Any) -> dict[str, Any]:
    """The H200 host's `-q -x` beside a query CSV that gives only `columns`."""
    texts = {"query_gpu": query_csv(columns, rows), **kw.pop("texts", {})}
    return doc_from({"nvidia_smi_q_xml": H200_FILES["nvidia_smi_q_xml"], **kw.pop("files", {})},
                    texts=texts, **kw)


# --- evidence: the output that told the fact ---------------------------------------------------

@pytest.mark.parametrize("column", ["pcie.link.gen.current", "pcie.link.gen.max",
                                    "pcie.link.width.current", "pcie.link.width.max",
                                    "pcie.link.gen.hostmax"])
def test_a_pcie_finding_cites_every_output_that_told_one_of_its_link_facts(
        tmp_path: Path, column: str) -> None:
    """Fault caught: the PCIe evidence forgets one of the five link facts, so a link judged
    from the CSV's value cites only the XML (where the value is something else)."""
    value = "16" if "width" in column else "5"
    found = only(judge(tmp_path, csv_with_xml([column], [[value], [value]]),
                       {"pcie": {"min_gen": 6}}), "PCIE_BELOW_ORDER")
    assert found == [("PCIE_BELOW_ORDER", "FAIL",
                      f"GPU{i} PCIe Gen5 max, Gen6 ordered: the link can never reach it",
                      [XML, CSV], {}) for i in (0, 1)]


def test_a_slot_as_fast_as_the_card_is_not_blamed(tmp_path: Path) -> None:
    """Fault caught: `<=` for `<` between the slot's and the card's generation blames a Gen5 slot
    for a Gen5 card; a slower slot is named."""
    same = only(judge(tmp_path / "a", csv_with_xml(["pcie.link.gen.hostmax"], [["5"], ["5"]]),
                      {"pcie": {"min_gen": 6}}), "PCIE_BELOW_ORDER")
    assert "slot" not in same[0][2]
    slower = only(judge(tmp_path / "b", csv_with_xml(["pcie.link.gen.hostmax"], [["4"], ["5"]]),
                        {"pcie": {"min_gen": 5}}), "PCIE_BELOW_ORDER")
    assert slower == [("PCIE_BELOW_ORDER", "FAIL", "GPU0 PCIe Gen4 max, Gen5 ordered; the slot "
                       "allows only Gen4: the link can never reach it", [XML, CSV], {})]


def test_a_narrow_link_cites_its_output_and_says_when_only_the_maximum_was_known(
        tmp_path: Path) -> None:
    """Fault caught: the width check reads the maximum even when the current width is known, or
    the message loses ' max' (which says the current width was not reported)."""
    cur = only(judge(tmp_path / "a", doc_from(texts={"query_gpu": query_csv(
        ["pcie.link.width.current", "pcie.link.width.max"], [["8", "16"], ["16", "16"]])}),
        {"pcie": {"min_width": 16}}), "PCIE_BELOW_ORDER")
    assert cur == [("PCIE_BELOW_ORDER", "FAIL", "GPU0 PCIe x8, x16 ordered", [CSV], {})]
    mx = only(judge(tmp_path / "b", doc_from(texts={"query_gpu": query_csv(
        ["pcie.link.width.max"], [["8"], ["16"]])}), {"pcie": {"min_width": 16}}),
        "PCIE_BELOW_ORDER")
    assert mx == [("PCIE_BELOW_ORDER", "FAIL", "GPU0 PCIe x8 max, x16 ordered", [CSV], {})]


def test_a_degraded_link_cites_its_output(tmp_path: Path) -> None:
    found = only(judge(tmp_path, csv_with_xml(["pcie.link.gen.current"], [["4"], ["5"]]), {}),
                 "PCIE_LINK_DEGRADED")
    assert found == [("PCIE_LINK_DEGRADED", "WARN", "GPU0 PCIe link Gen4 x16, capable of Gen5 x16 "
                      "(an idle GPU may lower its generation to save power; a narrower width is "
                      "not that)", [XML, CSV], {})]


@pytest.mark.parametrize(("column", "value"), [("power.limit", "600.00 W"),
                                               ("power.max_limit", "800.00 W")])
def test_a_low_power_cap_cites_where_the_limit_and_the_maximum_came_from(
        tmp_path: Path, column: str, value: str) -> None:
    """Fault caught: the power evidence names only one of the two numbers compared."""
    found = only(judge(tmp_path, csv_with_xml([column], [[value], ["700.00 W"]]), {}),
                 "POWER_LIMIT_LOW")
    assert [f[3] for f in found] == [[XML, CSV]]


@pytest.mark.parametrize(("limit", "warned"), [("693.00 W", False), ("692.00 W", True)])
def test_a_power_cap_exactly_at_99_percent_of_the_maximum_is_full_power(
        tmp_path: Path, limit: str, warned: bool) -> None:
    """Fault caught: `<=` for `<` at 99% of the card's maximum (700 W from the XML)."""
    found = only(judge(tmp_path, csv_with_xml(["power.limit"], [[limit], ["700.00 W"]]), {}),
                 "POWER_LIMIT_LOW")
    assert found == ([("POWER_LIMIT_LOW", "WARN", "GPU0 power limit 692 W, the card allows 700 W: "
                       "expect lower clocks. Under sustained load the GPU is held at 99% of its "
                       "power, so long jobs run slower than on a full-power card of the same "
                       "model; ask for the limit to be raised or price it in", [XML, CSV],
                       {"limit_w": 692.0, "max_w": 700.0})] if warned else [])


@pytest.mark.parametrize(("temp", "warned"), [("85", False), ("86", True)])
def test_a_gpu_exactly_at_the_temperature_limit_is_not_hot(
        tmp_path: Path, temp: str, warned: bool) -> None:
    """Fault caught: `>=` for `>` at the 85 C default; the finding cites the CSV that said it."""
    found = only(judge(tmp_path, csv_with_xml(["temperature.gpu"], [[temp], ["40"]]), {}),
                 "TEMPERATURE_HIGH")
    assert found == ([("TEMPERATURE_HIGH", "WARN", "GPU0 at 86 C (> 85 C) before any load", [CSV],
                       {})] if warned else [])


@pytest.mark.parametrize(("column", "value", "code", "message"), [
    ("clocks_event_reasons.active", "0x0000000000000028", "CLOCKS_HELD_BACK",
     "GPU0 clocks held back: HwSlowdown, SwThermalSlowdown"),
    ("ecc.errors.uncorrected.volatile.total", "3", "ECC_UNCORRECTABLE",
     "GPU0 has 3 uncorrectable ECC error(s): ask the provider for another node"),
    ("retired_pages.pending", "Yes", "RETIRED_PAGES_PENDING",
     "GPU0 has retired pages pending: the GPU needs a reset before its memory can be trusted"),
])
def test_a_health_finding_cites_the_output_that_showed_the_fault(
        tmp_path: Path, column: str, value: str, code: str, message: str) -> None:
    """Fault caught: a health finding cites the wrong output (or none): here only the CSV shows
    the fault, the XML beside it is clean."""
    found = only(judge(tmp_path, csv_with_xml([column], [[value], ["[N/A]"]]), {}), code)
    assert found == [(code, "FAIL" if code != "CLOCKS_HELD_BACK" else "WARN", message, [CSV], {})]


@pytest.mark.parametrize(("column", "value", "what"), [
    ("remapped_rows.pending", "Yes", "row remapping pending"),
    ("remapped_rows.failure", "Yes", "a remapping failure"),
    ("remapped_rows.uncorrectable", "1", "1 uncorrectable remapped row(s)"),
])
def test_remapped_rows_say_which_fault_and_cite_all_three_outputs_of_it(
        tmp_path: Path, column: str, value: str, what: str) -> None:
    """Fault caught: one uncorrectable remapped row not counted (`> 1`), a failure without
    uncorrectable rows missed (`and`), the wrong wording, or evidence missing one of the three
    facts (the CSV tells one, the XML the other two)."""
    found = only(judge(tmp_path, csv_with_xml([column], [[value], ["[N/A]"]]), {}),
                 "REMAPPED_ROWS")
    assert found == [("REMAPPED_ROWS", "FAIL", f"GPU0 memory: {what}", [XML, CSV], {})]


def test_a_gpu_in_error_lists_every_error_and_cites_every_output_about_it(tmp_path: Path) -> None:
    doc = csv_with_xml(["memory.total [MiB]", "temperature.gpu"],
                       [["[GPU requires reset]", "[Unknown Error]"], ["143771 MiB", "30"]])
    found = only(judge(tmp_path, doc, {}), "GPU_ERROR_STATE")
    assert found == [("GPU_ERROR_STATE", "FAIL", "GPU0 reported errors instead of values "
                      "(memory.total: [GPU requires reset]; temperature.gpu: [Unknown Error]): "
                      "the GPU may need a reset", [XML, CSV], {})]


# --- memory ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("mib", "severity"), [("142848", "PASS"), ("142847", "FAIL")])
def test_memory_exactly_at_93_percent_of_the_order_passes(
        tmp_path: Path, mib: str, severity: str) -> None:
    """Fault caught: `<=` for `<` at the tolerance, or MiB read as 1025 per GiB: 142848 MiB is
    exactly 93% of 150 GiB. The finding cites the CSV that told the memory, not the XML."""
    found = only(judge(tmp_path, csv_with_xml(["memory.total [MiB]"],
                                              [[f"{mib} MiB"], ["143771 MiB"]]),
                       {"memory_per_gpu_gb": 150}), "GPU_MEMORY")
    message = ("every GPU has >= 150 GB" if severity == "PASS"
               else "GPU memory below the 150 GB ordered: GPU0 139.5 GiB")
    assert found == [("GPU_MEMORY", severity, message, [CSV], {})]


def test_memory_nobody_reported_is_a_warning_with_no_evidence_to_cite(tmp_path: Path) -> None:
    """Fault caught: GPUs without a memory figure pass, or the finding cites outputs that did
    not tell any memory."""
    doc = doc_from(texts={"query_gpu": query_csv(["temperature.gpu"], [["30"], ["31"]])})
    found = only(judge(tmp_path, doc, {"memory_per_gpu_gb": 141}), "GPU_MEMORY")
    assert found == [("GPU_MEMORY", "WARN", "memory not reported for GPUs [0, 1]", [], {})]


def test_one_gpu_without_a_memory_figure_cites_the_output_that_gave_the_others(
        tmp_path: Path) -> None:
    doc = doc_from(texts={"query_gpu": query_csv(["memory.total [MiB]"],
                                                 [["143771 MiB"], ["[N/A]"]])})
    found = only(judge(tmp_path, doc, {"memory_per_gpu_gb": 141}), "GPU_MEMORY")
    assert found == [("GPU_MEMORY", "WARN", "memory not reported for GPUs [1]", [CSV], {})]


# --- count, model, form factor ---------------------------------------------------------------

def test_with_only_the_xml_the_count_cites_the_xml(tmp_path: Path) -> None:
    """Fault caught: the count cites the listing commands even when neither answered."""
    doc = doc_from({"nvidia_smi_q_xml": H200_FILES["nvidia_smi_q_xml"]})
    found = judge(tmp_path, doc, {"gpus_per_node": 2, "gpu_model": "H200", "form_factor": "sxm"})
    assert found[:3] == [
        ("GPU_COUNT", "PASS", "2 GPU(s) found, 2 ordered", [XML], {"found": 2, "ordered": 2}),
        ("GPU_MODEL", "PASS", "NVIDIA H200 matches H200 SXM 141GB (ordered H200)", [XML],
         {"ordered": ["H200 NVL 141GB", "H200 SXM 141GB"], "matched": ["H200 SXM 141GB"]}),
        ("FORM_FACTOR", "PASS", "SXM as ordered", [XML], {})]


def test_a_table_that_cut_the_name_leaves_the_model_unverified(tmp_path: Path) -> None:
    """Fault caught: a shortened name passes (or fails) the model check instead of a warning."""
    table = h200_text("nvidia_smi").replace("NVIDIA H200       ", "NVIDIA GeForce ...")
    found = judge(tmp_path, doc_from(texts={"nvidia_smi": table}),
                  {"gpu_model": "H200", "form_factor": "sxm"})
    assert only(found, "GPU_MODEL") == [
        ("GPU_MODEL", "WARN", "GPU model not reported in full for GPUs [0, 1] (a shortened table "
         "name): H200 unverified", [TABLE],
         {"ordered": ["H200 NVL 141GB", "H200 SXM 141GB"], "matched": []})]
    assert only(found, "FORM_FACTOR") == [
        ("FORM_FACTOR", "INFO", "form factor not evident from the name (?); see the topology "
         "checks", [TABLE], {})]


def test_names_that_do_not_say_the_form_factor_are_all_listed(tmp_path: Path) -> None:
    doc = doc_from(texts={"query_gpu": query_csv([], [[], []], names=(
        "NVIDIA Graphics Device", "NVIDIA L4"))})
    found = only(judge(tmp_path, doc, {"form_factor": "pcie"}), "FORM_FACTOR")
    assert found == [("FORM_FACTOR", "INFO", "form factor not evident from the name (NVIDIA "
                      "Graphics Device, NVIDIA L4); see the topology checks", [CSV], {})]
    # PCIe-only cards: their variants say what their names do not
    doc = doc_from(texts={"query_gpu": query_csv([], [[], []], names=("NVIDIA L40S", "NVIDIA L4"))})
    found = only(judge(tmp_path, doc, {"form_factor": "pcie"}), "FORM_FACTOR")
    assert found == [("FORM_FACTOR", "PASS", "PCIE as ordered", [CSV], {})]


def test_mixed_form_factors_are_both_named(tmp_path: Path) -> None:
    doc = doc_from(texts={"query_gpu": query_csv([], [[], []], names=(
        "NVIDIA H100 PCIe", "NVIDIA H100 80GB HBM3"))})
    found = only(judge(tmp_path, doc, {"form_factor": "sxm"}), "FORM_FACTOR")
    assert found == [("FORM_FACTOR", "FAIL", "NVIDIA H100 80GB HBM3, NVIDIA H100 PCIe is PCIE/SXM, "
                      "SXM ordered", [CSV], {})]


def test_two_models_that_match_are_both_named(tmp_path: Path) -> None:
    doc = doc_from(texts={"query_gpu": query_csv([], [[], []], names=(
        "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe"))})
    found = only(judge(tmp_path, doc, {"gpu_model": "H100"}), "GPU_MODEL")
    assert found == [("GPU_MODEL", "PASS", "NVIDIA H100 80GB HBM3, NVIDIA H100 PCIe matches H100 "
                      "SXM 80GB, H100 PCIe 80GB (ordered H100)", [CSV],
                      {"ordered": ["H100 NVL 94GB", "H100 PCIe 80GB", "H100 SXM 80GB"],
                       "matched": ["H100 SXM 80GB", "H100 PCIe 80GB"]})]


@pytest.mark.parametrize(("order", "name", "ok"), [
    ("A100", "NVIDIA H100 80GB HBM3", False),       # digits alone must not match
    ("NVIDIA V100", "Tesla V100-SXM2-16GB", True),  # "NVIDIA" in an order is not a token
    ("A100 80 GB", "NVIDIA A100-SXM4-80GB", True),  # a unit after a number
    ("A100 SXM 80GB", "NVIDIA A100-SXM4-80GB", True),
    ("8GB", "NVIDIA A40 48GB", False),              # no digits run on before a number
])
def test_model_tokens(order: str, name: str, ok: bool) -> None:
    """Fault caught: a token split on the wrong characters (a case change), 'nvidia' kept as a
    token, or the digit guards put on letters (or taken off digits)."""
    assert model_matches(order, name) is ok


# --- MIG ------------------------------------------------------------------------------------

def _mig_doc(listing: str) -> dict[str, Any]:
    return doc_from(texts={"query_gpu": query_csv(["mig.mode.current"], [["Enabled"], ["Disabled"]]),
                           "nvidia_smi_L": listing})


def test_mig_on_with_no_instances_cites_the_mode_and_the_listing(tmp_path: Path) -> None:
    """Fault caught: MIG evidence names only where the mode or only where the devices came from;
    the finding keeps the GPUs in its details."""
    listing = "".join(f"GPU {i}: NVIDIA H200 (UUID: GPU-00000000-1111-2222-3333-00000000000{i})\n"
                      for i in (0, 1))
    found = judge(tmp_path, _mig_doc(listing), {"mig_allowed": True})
    assert only(found, "MIG_NO_DEVICES") == [
        ("MIG_NO_DEVICES", "FAIL", "MIG mode is on for GPUs [0] but no MIG device exists there: "
         "CUDA cannot use those GPUs at all until GPU and compute instances are created "
         "(nvidia-smi mig -cgi ... -C) or MIG is turned off", [CSV, LIST], {"gpus": [0]})]
    assert only(found, "MIG_ENABLED") == []


def test_mig_slices_cite_the_mode_and_the_listing(tmp_path: Path) -> None:
    listing = fixture("synthetic/nvidia-smi-L_a100-sxm4-80gb-mig_r535.txt")
    found = only(judge(tmp_path, _mig_doc(listing), {}), "MIG_ENABLED")
    assert [f[3] for f in found] == [[CSV, LIST]]


# --- when nvidia-smi gave too little ----------------------------------------------------------

def _listing_only(**kw: Any) -> dict[str, Any]:
    return doc_from({"nvidia_smi_L": H200_FILES["nvidia_smi_L"]}, **kw)


@pytest.mark.parametrize(("kw", "why"), [
    ({"texts": {"query_gpu": "index, name\nzero, NVIDIA H200\n"}}, None),
    ({"failed": {"query_gpu": (6, "No devices were found\nERROR: query failed\n")}},
     "No devices were found\nERROR: query failed"),
    ({"texts": {"query_gpu": "Field \"x\" is not a valid field to query.\n"},
      "failed": {"query_gpu": (2, "")}}, "Field \"x\" is not a valid field to query."),
    ({"failed": {"query_gpu": (2, "")}}, "no output"),
    ({"failed": {"query_gpu": (2, "x" * 150 + "\n" + "y" * 150)}}, "x" * 49 + "\n" + "y" * 150),
])
def test_a_listing_without_details_says_why_the_query_gave_nothing(
        tmp_path: Path, kw: dict[str, Any], why: str | None) -> None:
    """Fault caught: the reason is lost (parse error, stderr, stdout, the last 200 characters),
    or the finding cites only one of the two nvidia-smi outputs."""
    found = judge(tmp_path, _listing_only(**kw), {"gpus_per_node": 2})
    missing = only(found, "GPU_DETAILS_MISSING")
    assert len(missing) == 1
    code, severity, message, evidence, details = missing[0]
    if why is None:
        why = only(found, "PARSE_ERROR")[0][2].removeprefix("output of query_gpu not understood: ")
    assert message == (f"nvidia-smi lists GPUs but --query-gpu gave nothing usable ({why}): count, "
                       "model, memory and health were not checked")
    assert (severity, evidence) == ("FAIL", [CSV, LIST])


def test_two_unreadable_outputs_are_both_named(tmp_path: Path) -> None:
    doc = doc_from(texts={"query_gpu": "index, name\nzero, NVIDIA H200\n",
                          "nvidia_smi_L": "nonsense\n"})
    found = only(judge(tmp_path, doc, {}), "NVIDIA_SMI_UNREADABLE")
    assert len(found) == 1
    msg = found[0][2]
    assert msg.startswith("nvidia-smi answered but its output could not be read (nvidia_smi_L: ")
    assert "'nonsense'; query_gpu: " in msg
    assert msg.endswith("): model, count, memory, MIG and health were not checked; the raw output "
                        "is kept as evidence")
    assert found[0][3] == [LIST, CSV]


@pytest.mark.parametrize(("kw", "message", "evidence"), [
    ({"failed": {"query_gpu": (9, "NVIDIA-SMI has failed\nMake sure the driver is loaded\n")}},
     "nvidia-smi failed (exit 9): Make sure the driver is loaded; GPU checks skipped",
     ["raw/query_gpu.stderr.txt"]),
    ({"texts": {"query_gpu": "Failed to initialize NVML: Driver/library version mismatch\n"},
      "failed": {"query_gpu": (18, "")}},
     "nvidia-smi failed (exit 18): Failed to initialize NVML: Driver/library version mismatch; "
     "GPU checks skipped", [CSV]),
    ({"failed": {"query_gpu": (9, "")}}, "nvidia-smi failed (exit 9): ; GPU checks skipped",
     ["collect.json"]),
    ({"timed_out": ["query_gpu"]}, "nvidia-smi hung (timed out): the driver or a GPU is in a bad "
     "state; GPU checks skipped", ["collect.json"]),
])
def test_a_failed_nvidia_smi_says_its_last_words_and_cites_the_file_holding_them(
        tmp_path: Path, kw: dict[str, Any], message: str, evidence: list[str]) -> None:
    """Fault caught: the wrong line of stderr, stdout ignored, a made-up reason when there is
    none, or evidence pointing at a file that does not say why."""
    found = only(judge(tmp_path, doc_from(**kw), {}), "NVIDIA_DRIVER_MISSING")
    assert found == [("NVIDIA_DRIVER_MISSING", "FAIL", message, evidence, {})]


# --- topology ---------------------------------------------------------------------------------

def topo_matrix(n: int, nvlink: set[tuple[int, int]]) -> str:
    """`nvidia-smi topo -m` for n GPUs: NV12 between the pairs given, SYS elsewhere."""
    head = "\t" + "\t".join(f"GPU{i}" for i in range(n)) + "\tCPU Affinity\tNUMA Affinity\n"
    rows = []
    for i in range(n):
        cells = [" X " if i == j else "NV12" if (min(i, j), max(i, j)) in nvlink else "SYS"
                 for j in range(n)]
        rows.append(f"GPU{i}\t" + "\t".join(cells) + "\t0-31\t0\n")
    return head + "".join(rows) + "\nLegend:\n\n  X    = Self\n"


@pytest.mark.parametrize(("nvlink", "more"), [({(0, 1), (2, 3), (4, 5)}, ""),
                                              ({(0, 1), (2, 3)}, " (+1 more)")])
def test_twelve_pairs_are_shown_whole_and_a_thirteenth_is_counted(
        tmp_path: Path, nvlink: set[tuple[int, int]], more: str) -> None:
    """Fault caught: the '(+N more)' tail at 12 pairs or missing at 13."""
    doc = doc_from(texts={"query_gpu": query_csv([], [[], []]), "topo_m": topo_matrix(6, nvlink)})
    found = only(judge(tmp_path, doc, {"interconnect": "nvswitch"}), "INTERCONNECT")
    assert len(found) == 1
    assert found[0][2].endswith("SYS" + more)
    assert found[0][2].startswith(f"nvswitch ordered but {15 - len(nvlink)} GPU pair(s) do not")
    assert found[0][3] == ["raw/topo_m.txt"]


def test_nvlink_pairs_of_several_kinds_are_all_named(tmp_path: Path) -> None:
    matrix = topo_matrix(3, {(0, 1), (0, 2), (1, 2)}).replace("GPU2\tNV12", "GPU2\tNV18", 1)
    matrix = matrix.replace("GPU0\t X \tNV12\tNV12", "GPU0\t X \tNV12\tNV18")
    doc = doc_from(texts={"query_gpu": query_csv([], [[], []]), "topo_m": matrix})
    found = only(judge(tmp_path, doc, {"interconnect": "nvlink"}), "INTERCONNECT")
    assert found == [("INTERCONNECT", "PASS", "every GPU pair on NVLink (NV12, NV18)",
                      ["raw/topo_m.txt"], {})]


def test_no_matrix_cites_the_topology_command(tmp_path: Path) -> None:
    doc = doc_from(texts={"query_gpu": query_csv([], [[], []])},
                   failed={"topo_m": (255, "topo not supported")})
    found = only(judge(tmp_path, doc, {"interconnect": "nvlink"}), "TOPOLOGY_UNKNOWN")
    assert found == [("TOPOLOGY_UNKNOWN", "WARN", "nvidia-smi topo -m gave no matrix; NVLink "
                      "could not be verified", ["raw/topo_m.txt"], {})]


def test_unread_nvlink_speeds_list_every_reason_and_cite_nvlink_s(tmp_path: Path) -> None:
    text = ("GPU 0: NVIDIA H200 (UUID: GPU-00000000-1111-2222-3333-000000000000)\n"
            "\tNvlink queries are not supported for Devices in MIG mode\n"
            "GPU 1: NVIDIA H200 (UUID: GPU-00000000-1111-2222-3333-000000000001)\n"
            "\tNvlink queries are not supported for Devices in MIG mode\n")
    found = only(judge(tmp_path, h200_doc(texts={"nvlink_s": text}), H200_ORDER), "NVLINK_UNKNOWN")
    assert found == [("NVLINK_UNKNOWN", "INFO", "NVLink speeds not read for every GPU: GPU 0: "
                      "Nvlink queries are not supported for Devices in MIG mode; GPU 1: Nvlink "
                      "queries are not supported for Devices in MIG mode", ["raw/nvlink_s.txt"], {})]


def test_peer_to_peer_shows_twelve_pairs_and_cites_its_command(tmp_path: Path) -> None:
    """Fault caught: more than twelve pairs printed, or the finding citing another command."""
    p2p = fixture("synthetic/topo-p2p-n_dgx-a100_r535.txt").replace("\tOK", "\tNS")
    doc = doc_from(texts={"query_gpu": query_csv([], [[], []]), "topo_p2p_n": p2p})
    found = only(judge(tmp_path, doc, {}), "P2P_NOT_OK")
    assert len(found) == 1
    assert found[0][2].startswith("peer-to-peer not OK between 28 GPU pair(s): GPU0-GPU1 NS, ")
    assert found[0][2].count("GPU") == 25 and found[0][2].count(", ") == 11
    assert found[0][3] == ["raw/topo_p2p_n.txt"]


# --- torch ----------------------------------------------------------------------------------

def _torch(**over: Any) -> str:
    info = {"torch": "2.3.1+cu121", "cuda": "12.1", "nccl": "2.18.1", "available": True,
            "count": 2, "devices": []}
    return json.dumps({**info, **over}) + "\n"


def test_torch_findings_cite_torch_and_the_query(tmp_path: Path) -> None:
    base = {"query_gpu": query_csv([], [[], []])}
    ok = only(judge(tmp_path / "a", doc_from(texts={**base, "torch": _torch()}), {}),
              "TORCH_SEES_GPUS")
    assert [f[3] for f in ok] == [["raw/torch.txt", CSV]]
    cpu = only(judge(tmp_path / "b", doc_from(texts={**base, "torch": _torch(
        cuda=None, available=False, count=0)}), {}), "TORCH_GPU_COUNT")
    assert cpu == [("TORCH_GPU_COUNT", "FAIL", "PyTorch sees 0 GPU(s), nvidia-smi 2. Likely causes: "
                    "this PyTorch is a CPU-only build; the container mounts only some GPUs (check "
                    "--gpus / NVIDIA_VISIBLE_DEVICES)", ["raw/torch.txt", CSV],
                    {"torch": 0, "nvidia_smi": 2})]
    old = only(judge(tmp_path / "c", doc_from(texts={**base, "torch": _torch(
        available=False, count=0)}), {}), "TORCH_GPU_COUNT")
    assert old[0][2] == ("PyTorch sees 0 GPU(s), nvidia-smi 2. Likely causes: driver/runtime "
                         "mismatch: PyTorch was built for CUDA 12.1; check that the driver supports "
                         "it; the container mounts only some GPUs (check --gpus / "
                         "NVIDIA_VISIBLE_DEVICES)")


def test_torch_that_cannot_import_quotes_the_last_line_of_its_traceback(tmp_path: Path) -> None:
    """Fault caught: a line other than the last quoted (a three-line traceback tells them apart)."""
    doc = doc_from(texts={"query_gpu": query_csv([], [[], []])}, failed={"torch": (
        1, "Traceback (most recent call last):\n  File \"<string>\", line 1\n"
        "ImportError: libcudnn.so.9: cannot open shared object file\n")})
    found = only(judge(tmp_path, doc, {}), "TORCH_UNAVAILABLE")
    assert found == [("TORCH_UNAVAILABLE", "WARN", "PyTorch could not be imported with "
                      "/usr/bin/python3: ImportError: libcudnn.so.9: cannot open shared object file",
                      ["raw/torch.txt"], {})]


def _bare_node(doc: dict[str, Any]) -> NodeFacts:
    return NodeFacts(node="n", provider="p", doc=doc, evidence={"torch": "raw/torch.txt"}, facts={
        "query_gpu": parse("nvidia-smi-query-gpu", query_csv([], [[], []]))})


def test_torch_names_python_when_the_document_does_not_say_which_interpreter() -> None:
    """Fault caught: the fallback name lost for a document (an older payload's) without the
    interpreter's path, or a crash on one that recorded no commands at all."""
    found = checks.check_torch(_bare_node({}), checks.Expectations(), checks.PreflightParams())
    assert [(r.code, r.message, r.evidence) for r in found] == [
        ("TORCH_UNAVAILABLE", "PyTorch could not be imported with python: no output",
         ["raw/torch.txt"])]


def test_a_validated_document_without_the_interpreter_does_not_say_none(tmp_path: Path) -> None:
    doc = doc_from(texts={"query_gpu": query_csv([], [[], []])})
    del doc["python"]["executable"]
    found = only(judge(tmp_path, doc, {}), "TORCH_UNAVAILABLE")
    assert "None" not in found[0][2]


# --- build tools -----------------------------------------------------------------------------

@pytest.mark.parametrize(("files", "wheel"), [
    ({"nvcc_version": "synthetic/nvcc-version_12.4.txt",
      "nvidia_smi_q_xml": H200_FILES["nvidia_smi_q_xml"]}, "nvidia-nccl-cu12"),
    ({"nvidia_smi_q_xml": H200_FILES["nvidia_smi_q_xml"]}, "nvidia-nccl-cu13"),
])
def test_the_nccl_wheel_follows_the_toolkit_else_the_driver(
        tmp_path: Path, files: dict[str, str], wheel: str) -> None:
    """Fault caught: the wheel named for the driver's CUDA when a toolkit is installed (12.4
    toolkit, driver for 13.0), or for neither; evidence is nvcc's and ldconfig's output."""
    found = only(judge(tmp_path, doc_from(files), {}), "BUILD_TOOLS")
    assert len(found) == 1
    assert f"NCCL headers (libnccl-dev, or pip {wheel})" in found[0][2]
    assert found[0][3] == ["raw/nvcc_version.txt", "raw/ldconfig.txt"]


def test_build_tools_present_cite_nvcc_and_ldconfig(tmp_path: Path) -> None:
    found = only(judge(tmp_path, h200_doc(), H200_ORDER), "BUILD_TOOLS")
    assert found == [("BUILD_TOOLS", "PASS", "nvcc, NCCL headers and MPI present",
                      ["raw/nvcc_version.txt", "raw/ldconfig.txt"], {})]


# --- storage --------------------------------------------------------------------------------

def test_checkpoint_directory_findings_cite_df(tmp_path: Path) -> None:
    ok = only(judge(tmp_path / "a", h200_doc(), H200_ORDER), "CKPT_DIR")
    assert [f[3] for f in ok] == [["raw/df.txt"]]
    doc = h200_doc()
    doc["paths"]["ckpt_dir"].update(path=None, realpath="/mnt/data/ckpt",
                                    mount={"fstype": None, "mount_point": None})
    vague = only(judge(tmp_path / "b", doc, H200_ORDER), "CKPT_DIR")
    assert vague == [("CKPT_DIR", "PASS", "checkpoint directory ? on ? (?)", ["raw/df.txt"], {})]
    doc = h200_doc()
    doc["paths"]["ckpt_dir"]["mount"].update(fstype="tmpfs", mount_point="/dev/shm")
    gone = only(judge(tmp_path / "c", doc, H200_ORDER), "CKPT_DIR_EPHEMERAL")
    assert [f[3] for f in gone] == [["raw/df.txt"]]


# --- providers ------------------------------------------------------------------------------

def _node(name: str, driver: str, torch: str | None) -> NodeFacts:
    csv = ("index, name, driver_version\n" f"0, NVIDIA H200, {driver}\n")
    facts = {"query_gpu": parse("nvidia-smi-query-gpu", csv)}
    if torch is not None:
        facts["torch"] = parse("torch-info", _torch(torch=torch, count=1))
    return NodeFacts(node=name, provider="p", doc={"commands": {}}, facts=facts,
                     evidence={"query_gpu": f"{name}/q.csv", "torch": f"{name}/t.json"})


def test_version_drift_between_one_gpu_nodes_cites_both_nodes(tmp_path: Path) -> None:
    """Fault caught: drift evidence missing a node's query or torch output, the details keys
    renamed, a node without torch crashing the comparison, or the driver read off a second GPU
    a one-GPU node does not have."""
    found = checks.provider_results([_node("a", "580.1", "2.3.1"), _node("b", "580.2", None)])
    assert [(r.code, r.message, r.evidence, r.details) for r in found] == [
        ("VERSION_DRIFT", "nodes differ in driver: a=580.1, b=580.2",
         ["a/q.csv", "a/t.json", "b/q.csv", "b/t.json"],
         {"component": "driver", "versions": {"a": "580.1", "b": "580.2"}}),
        ("VERSION_DRIFT", "nodes differ in nccl: a=2.18.1, b=missing",
         ["a/q.csv", "a/t.json", "b/q.csv", "b/t.json"],
         {"component": "nccl", "versions": {"a": "2.18.1", "b": None}}),
        ("VERSION_DRIFT", "nodes differ in torch: a=2.3.1, b=missing",
         ["a/q.csv", "a/t.json", "b/q.csv", "b/t.json"],
         {"component": "torch", "versions": {"a": "2.3.1", "b": None}}),
    ]


# --- RDMA fabric ----------------------------------------------------------------------------

def ibv_devinfo(n: int) -> str:
    """The DGX's plain `ibv_devinfo` (no rates), first n adapters."""
    blocks = fixture("synthetic/ibv_devinfo_dgx-a100.txt").split("\n\n")
    return "\n\n".join(blocks[:n]).rstrip("\n") + "\n"


def ibstat(ports: list[tuple[str, str, str | None]], tail: str = "") -> str:
    """`ibstat` for one-port adapters: (name, state, rate or None)."""
    out = []
    for name, state, rate in ports:
        out += [f"CA '{name}'", "        CA type: MT4123", "        Number of ports: 1",
                "        Port 1:", f"                State: {state}",
                "                Physical state: LinkUp"]
        out += [f"                Rate: {rate}"] if rate is not None else []
        out += ["                Link layer: InfiniBand"]
    return "\n".join(out) + "\n" + tail


def fabric(tmp_path: Path, texts: dict[str, str], order: dict[str, Any]) -> list[tuple[Any, ...]]:
    found = judge(tmp_path, doc_from(texts=texts), {"fabric": {"type": "ib", **order}})
    return [f for f in found if f[0].startswith("IB_")]


IB_EV = ["raw/ibv_devinfo.txt", "raw/ibstat.txt"]


def test_ibstat_fills_in_the_rates_but_ibv_devinfo_keeps_the_state(tmp_path: Path) -> None:
    """Fault caught: ibstat's port replacing ibv_devinfo's (the two listings, taken moments
    apart, disagree on the state: ibv_devinfo's stands), a rate ibstat knows left out, or a
    port with a rate counted as unknown (only mlx5_1's rate is unknown, so no warning)."""
    found = fabric(tmp_path, {"ibv_devinfo": ibv_devinfo(2),
                              "ibstat": ibstat([("mlx5_0", "Initializing", "200")])},
                   {"rate_gbps": 200})
    assert found == [("IB_PORTS", "PASS", "2 InfiniBand port(s) ACTIVE", IB_EV, {})]


def test_ibstat_alone_reads_its_states_in_ibv_devinfo_words(tmp_path: Path) -> None:
    """Fault caught: a state ibstat prints that has no ibv_devinfo name lost (shown as None)."""
    found = fabric(tmp_path, {"ibstat": ibstat([("mlx5_0", "Active", "400"), ("mlx5_1", "Down", None),
                                                ("mlx5_2", "Polling", None)])}, {"nics": 3})
    assert found == [
        ("IB_PORT_DOWN", "FAIL", "RDMA ports not ACTIVE: mlx5_1:1 PORT_DOWN, mlx5_2:1 Polling", IB_EV,
         {}),
        ("IB_PORT_COUNT", "FAIL", "1 active InfiniBand port(s), 3 ordered", IB_EV, {})]


def test_a_port_at_exactly_95_percent_of_the_ordered_rate_is_not_slow(tmp_path: Path) -> None:
    """Fault caught: `<=` for `<` at 95% (190 of 200 Gb/s); every slow port is listed."""
    found = fabric(tmp_path, {"ibstat": ibstat([("mlx5_0", "Active", "190"),
                                                ("mlx5_1", "Active", "189"),
                                                ("mlx5_2", "Active", "100")])}, {"rate_gbps": 200})
    assert found == [("IB_RATE_LOW", "FAIL", "ports slower than the 200 Gb/s ordered: mlx5_1:1 189 "
                      "Gb/s, mlx5_2:1 100 Gb/s", IB_EV, {})]


def test_no_rate_anywhere_is_a_warning_beside_the_pass(tmp_path: Path) -> None:
    """Fault caught: the warning not raised, or it suppressing the pass (it is no failure)."""
    found = fabric(tmp_path, {"ibv_devinfo": ibv_devinfo(2)}, {"rate_gbps": 200})
    assert found == [
        ("IB_RATE_UNKNOWN", "WARN", "no output gave the rate of mlx5_0:1, mlx5_1:1 (plain "
         "ibv_devinfo prints none; ibstat or ibv_devinfo -v do): 200 Gb/s unverified", IB_EV, {}),
        ("IB_PORTS", "PASS", "2 InfiniBand port(s) ACTIVE", IB_EV, {})]


def test_an_ibstat_that_stopped_early_cites_ibstat(tmp_path: Path) -> None:
    text = ibstat([("mlx5_0", "Active", "200")],
                  "ibpanic: [12] main: stat of IB device 'mlx5_1' failed: No such file or directory\n")
    found = fabric(tmp_path, {"ibstat": text}, {})
    assert found == [
        ("IB_LISTING_INCOMPLETE", "WARN", "ibstat stopped with `ibpanic: [12] main: stat of IB "
         "device 'mlx5_1' failed: No such file or directory`: adapters after it were not listed",
         ["raw/ibstat.txt"], {}),
        ("IB_PORTS", "PASS", "1 InfiniBand port(s) ACTIVE", IB_EV, {})]


def test_no_rdma_device_cites_both_listings(tmp_path: Path) -> None:
    found = fabric(tmp_path, {}, {})
    assert found == [("IB_MISSING", "FAIL", "ib ordered but no RDMA device found (ibv_devinfo "
                      "missing or empty): NCCL will fall back to TCP sockets", IB_EV, {})]


def test_without_the_collect_document_on_disk_a_failed_query_cites_its_own_output() -> None:
    """Fault caught: the fallback evidence names no command when collect.json was not written
    (a document judged in memory)."""
    nf = NodeFacts(node="n", provider="p", doc={"commands": {"query_gpu": {
        "missing": False, "timed_out": False, "rc": 9, "stdout": "", "stderr": ""}}},
        evidence={"query_gpu": "raw/query_gpu.txt"})
    found = gpu.check_driver(nf, checks.Expectations(), checks.PreflightParams())
    assert [(r.code, r.evidence) for r in found] == [("NVIDIA_DRIVER_MISSING", ["raw/query_gpu.txt"])]


def test_the_driver_counts_as_present_when_any_output_described_a_gpu() -> None:
    assert driver_present(_bare_node({})) is True
    assert driver_present(NodeFacts(node="n", provider="p", doc={})) is False
