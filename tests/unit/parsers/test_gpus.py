"""Merging every nvidia-smi output of a node into one view per GPU."""

from __future__ import annotations

from dataclasses import asdict

from orchestrator.parsers import parse
from orchestrator.parsers.gpus import merge_gpus, norm_bus
from orchestrator.parsers.nvidia_smi import ClockEventReasons, FabricState
from orchestrator.parsers.nvidia_smi_xml import EccCounts, RemappedRows, RetiredPages


def test_bus_ids_compare_across_spellings() -> None:
    assert norm_bus("00000000:19:00.0") == norm_bus("0000:19:00.0") == "0:19:00.0"
    assert norm_bus("00000000:3B:00.0") == norm_bus("0000:3b:00.0")
    assert norm_bus(None) is None and norm_bus("weird") == "weird"


def test_h200_outputs_agree_and_each_fact_names_its_source(real) -> None:
    views = merge_gpus([("query_gpu", parse("nvidia-smi-query-gpu", real("query-gpu.csv"))),
                        ("xml", parse("nvidia-smi-q-xml", real("nvidia-smi-q.xml"))),
                        ("table", parse("nvidia-smi-table", real("nvidia-smi.txt"))),
                        ("L", parse("nvidia-smi-L", real("nvidia-smi-L.txt")))])
    assert [v.index for v in views] == [0, 1]
    v = views[0]
    assert (v.name, v.memory_total_mib, v.mig_enabled, v.mig_devices) == (
        "NVIDIA H200", 143771, False, 0)
    assert v.told_by["memory_total_mib"] == "query_gpu"
    assert v.told_by["remapped_pending"] == "xml"  # the query asked no remapped_rows field
    assert v.sources == ["L", "query_gpu", "xml"]  # the table added nothing new


def test_table_fills_in_when_it_is_the_only_output(public) -> None:
    views = merge_gpus([("t", parse("nvidia-smi-table",
                                    public("nvidia-smi_rtx4090-fan-err_r525.txt")))])
    (v,) = views
    assert v.name is None  # `NVIDIA GeForce ...` is not a model name
    assert v.memory_total_mib == 23028 and v.errors == ["fan: ERR!"]


def test_listing_with_mig_devices_beats_a_disabled_mode_column(real, synth) -> None:
    csv = real("query-gpu.csv")
    listing = ("GPU 0: NVIDIA H200 (UUID: GPU-00000000-1111-2222-3333-000000000000)\n"
               "  MIG 1g.18gb     Device  0: (UUID: MIG-00000000-0000-0000-0000-000000000000)\n")
    views = merge_gpus([("q", parse("nvidia-smi-query-gpu", csv)),
                        ("L", parse("nvidia-smi-L", listing))])
    assert views[0].mig_enabled is True and views[0].told_by["mig_enabled"] == "L"
    assert views[0].mig_devices == 1 and views[1].mig_enabled is False


def test_outputs_for_different_gpus_stay_apart(synth) -> None:
    views = merge_gpus([
        ("q", parse("nvidia-smi-query-gpu", synth("query-gpu_4x-a100-pcie-40gb_r470.csv"))),
        ("x", parse("nvidia-smi-q-xml", synth("nvidia-smi-q_a100-pcie-40gb_r470.xml")))])
    assert len(views) == 4 and views[1].remapped_failure is True
    assert views[0].remapped_failure is None


# ------------------------------------------------ each output alone, every field of the view
# (the tests above merge outputs that agree: a fact one of them dropped was told by another)

_NONE = {name: None for name in ("bus_id", "name", "pci_device_id", "driver_version",
                                 "memory_total_mib",
                                 "mig_enabled", "mig_devices", "pcie_gen_current",
                                 "pcie_gen_max", "pcie_gen_host_max", "pcie_width_current",
                                 "pcie_width_max", "power_limit_w", "power_max_limit_w",
                                 "temperature_c", "clocks_event_reasons", "ecc_uncorrected",
                                 "retired_pages_pending", "remapped_pending",
                                 "remapped_failure", "remapped_uncorrectable", "fabric")}


def _alone(cid: str, facts) -> list[dict]:
    """Each view of one output, as a dict; told_by must name that output for every fact."""
    out = []
    for v in merge_gpus([(cid, facts)]):
        d = asdict(v)
        told = d.pop("told_by")
        assert told == {k: cid for k, val in d.items()
                        if k not in ("index", "errors") and val is not None}
        out.append(d)
    return out


def _expect(index: int, errors: list[str] | None = None, **known) -> dict:
    assert set(known) <= set(_NONE)
    return {"index": index, **_NONE, **known, "errors": errors or []}


def test_query_csv_alone_gives_every_field_it_has(public) -> None:
    facts = parse("nvidia-smi-query-gpu", public("query-gpu_l40s_r595.csv"))
    # the capture edited at the facts: a host maximum and a retirement answer it printed as
    # N/A, a volatile count the aggregate does not have yet, a cell with a GPU error
    g = facts.gpus[0].model_copy(update={
        "pcie_gen_host_max": 4, "retired_pages_pending": False, "ecc_uncorrected_volatile": 2,
        "ecc_uncorrected_aggregate": None, "errors": ["power.draw: [GPU requires reset]"]})
    facts = facts.model_copy(update={"gpus": [g]})
    assert _alone("q", facts) == [_expect(
        0, errors=["power.draw: [GPU requires reset]"], bus_id="00000000:01:00.0",
        name="NVIDIA L40S", pci_device_id="0x26B910DE", driver_version="595.80",
        memory_total_mib=46068,
        pcie_gen_current=4, pcie_gen_max=4, pcie_gen_host_max=4, pcie_width_current=16,
        pcie_width_max=16, power_limit_w=350.0, power_max_limit_w=350.0, temperature_c=63,
        clocks_event_reasons=ClockEventReasons(mask=0, active=[]), ecc_uncorrected=2,
        retired_pages_pending=False, remapped_pending=False, remapped_failure=False,
        remapped_uncorrectable=0)]
    # the larger of the two counts, whichever of them is known
    g2 = g.model_copy(update={"ecc_uncorrected_volatile": None, "ecc_uncorrected_aggregate": 3})
    assert merge_gpus([("q", facts.model_copy(update={"gpus": [g2]}))])[0].ecc_uncorrected == 3
    g3 = g.model_copy(update={"ecc_uncorrected_volatile": 1, "ecc_uncorrected_aggregate": 4})
    assert merge_gpus([("q", facts.model_copy(update={"gpus": [g3]}))])[0].ecc_uncorrected == 4


def test_query_csv_index_column_else_the_row_s_position(real) -> None:
    facts = parse("nvidia-smi-query-gpu", real("query-gpu.csv"))
    # `--query-gpu ... -i 1`: one row, GPU 1
    one = facts.model_copy(update={"gpus": [facts.gpus[1]]})
    assert [v.index for v in merge_gpus([("q", one)])] == [1]
    # a field list without `index`: the rows in order
    unindexed = facts.model_copy(update={"gpus": [g.model_copy(update={"index": None})
                                                  for g in facts.gpus]})
    views = merge_gpus([("q", unindexed)])
    assert [(v.index, v.bus_id) for v in views] == [(0, "00000000:00:06.0"),
                                                    (1, "00000000:00:07.0")]


def test_xml_alone_gives_every_field_it_has(synth) -> None:
    facts = parse("nvidia-smi-q-xml", synth("nvidia-smi-q_a100-sxm4-40gb-mig_r535.xml"))
    common = {"driver_version": "535.129.03", "name": "NVIDIA A100-SXM4-40GB",
              "memory_total_mib": 40960, "pcie_gen_max": 4, "pcie_gen_host_max": 4,
              "pcie_width_max": 16, "power_limit_w": 400.0, "power_max_limit_w": 400.0}
    assert _alone("x", facts) == [
        _expect(0, bus_id="00000000:07:00.0", mig_enabled=True, mig_devices=2,
                pcie_gen_current=4, pcie_width_current=16, temperature_c=30,
                clocks_event_reasons=ClockEventReasons(mask=1, active=["GpuIdle"]),
                ecc_uncorrected=0, remapped_pending=False, remapped_failure=False,
                remapped_uncorrectable=0, **common),
        _expect(1, bus_id="00000000:0F:00.0", mig_enabled=False, pcie_gen_current=3,
                pcie_width_current=8, temperature_c=31,
                clocks_event_reasons=ClockEventReasons(mask=12, active=["SwPowerCap",
                                                                        "HwSlowdown"]),
                ecc_uncorrected=1, remapped_pending=True, remapped_failure=False,
                remapped_uncorrectable=1, **common)]


def test_xml_counts_retirement_remapping_and_fabric_as_the_gpu_reports_them(real) -> None:
    facts = parse("nvidia-smi-q-xml", real("nvidia-smi-q.xml"))
    g0, g1 = facts.gpus
    assert g0.fabric is not None and g0.fabric.known
    edited = [
        # a GPU without row remapping, a pending retirement, only a volatile count
        g0.model_copy(update={"remapped_rows": None, "retired_pages": RetiredPages(pending=True),
                              "ecc_volatile": EccCounts(uncorrectable=2),
                              "ecc_aggregate": EccCounts()}),
        # a fabric block that says nothing, only an aggregate count, remapped rows given
        g1.model_copy(update={"fabric": FabricState(), "ecc_volatile": EccCounts(),
                              "ecc_aggregate": EccCounts(uncorrectable=5),
                              "remapped_rows": RemappedRows(uncorrectable=3, pending=True,
                                                            failure=True)})]
    v0, v1 = merge_gpus([("x", facts.model_copy(update={"gpus": edited}))])
    assert (v0.remapped_pending, v0.remapped_failure, v0.remapped_uncorrectable) == (None,) * 3
    assert (v0.retired_pages_pending, v0.ecc_uncorrected) == (True, 2)
    assert v0.fabric == g0.fabric and v0.told_by["fabric"] == "x"
    assert (v1.fabric, v1.ecc_uncorrected) == (None, 5)
    assert (v1.remapped_pending, v1.remapped_failure, v1.remapped_uncorrectable) == (
        True, True, 3)
    assert (v0.index, v1.index, v0.driver_version) == (0, 1, "580.159.04")


def test_q_text_alone_gives_every_field_it_has(public) -> None:
    facts = parse("nvidia-smi-q", public("nvidia-smi-q_h200-mig-load_r590.txt"))
    assert _alone("q", facts) == [_expect(
        0, bus_id="00000000:83:00.0", name="NVIDIA H200", driver_version="590.48.01",
        memory_total_mib=143771, mig_enabled=True, mig_devices=5, pcie_gen_current=5,
        pcie_gen_max=5, pcie_width_current=16, pcie_width_max=16, power_limit_w=700.0,
        power_max_limit_w=700.0, temperature_c=36,
        clocks_event_reasons=ClockEventReasons(mask=0, active=[]), ecc_uncorrected=0,
        fabric=FabricState(state="Completed", status="Success", clique_id="0",
                           cluster_uuid="00000000-0000-0000-0000-000000000000",
                           line_no=350))]
    titan = parse("nvidia-smi-q", public("nvidia-smi-q_titan-v_r560.txt"))
    assert _alone("q", titan) == [_expect(
        0, bus_id="00000000:01:00.0", name="NVIDIA TITAN V", driver_version="560.35.03",
        memory_total_mib=12288, pcie_gen_current=1, pcie_gen_max=3, pcie_gen_host_max=3,
        pcie_width_current=16, pcie_width_max=16, power_limit_w=250.0,
        power_max_limit_w=300.0, temperature_c=44,
        clocks_event_reasons=ClockEventReasons(mask=1, active=["GpuIdle"]))]


def test_table_alone_gives_every_field_it_has(public, real) -> None:
    mig = parse("nvidia-smi-table", public("nvidia-smi_h200-mig-load_r590.txt"))
    assert _alone("t", mig) == [_expect(
        0, bus_id="00000000:83:00.0", name="NVIDIA H200", driver_version="590.48.01",
        memory_total_mib=143771, mig_enabled=True, mig_devices=5, power_limit_w=700.0,
        temperature_c=36)]
    # MIG on, no instance made yet: 0 devices, not unknown
    (empty,) = merge_gpus([("t", parse("nvidia-smi-table",
                                       public("nvidia-smi_a100-pcie-mig-no-devices_r510.txt")))])
    assert (empty.mig_enabled, empty.mig_devices, empty.name) == (True, 0, None)
    # a card without MIG prints N/A: unknown, not "disabled"
    (l40s,) = merge_gpus([("t", parse("nvidia-smi-table", public("nvidia-smi_l40s_r595.txt")))])
    assert (l40s.mig_enabled, l40s.mig_devices, l40s.name) == (None, None, "NVIDIA L40S")
    off = merge_gpus([("t", parse("nvidia-smi-table", real("nvidia-smi.txt")))])
    assert [(v.mig_enabled, v.mig_devices) for v in off] == [(False, None), (False, None)]
    (v100, *_) = merge_gpus([("t", parse("nvidia-smi-table",
                                         public("nvidia-smi_4x-v100-pcie_r410.txt")))])
    assert (v100.mig_enabled, v100.ecc_uncorrected, v100.driver_version) == (None, 0, "410.48")


def test_listing_alone_names_the_gpu(public) -> None:
    facts = parse("nvidia-smi-L", public("nvidia-smi-L_h200-mig_r590.txt"))
    assert _alone("L", facts) == [_expect(0, name="NVIDIA H200", mig_enabled=True,
                                          mig_devices=5)]


def test_errors_of_every_output_add_up(public) -> None:
    table = parse("nvidia-smi-table", public("nvidia-smi_rtx4090-fan-err_r525.txt"))
    listing = parse("nvidia-smi-L", "GPU 0: NVIDIA GeForce RTX 4090 (UUID: GPU-0)\n")
    (v,) = merge_gpus([("t", table), ("L", listing)])
    assert v.errors == ["fan: ERR!"] and v.name == "NVIDIA GeForce RTX 4090"
    assert v.source("name", "memory_total_mib", "fabric") == ["L", "t"]
    assert v.source("fabric") == []


def test_a_bus_id_no_earlier_output_has_is_another_gpu(real) -> None:
    """`-i 0` asked of one tool and `-i 1` of another: both say index 0, the bus ids differ."""
    q = parse("nvidia-smi-query-gpu", real("query-gpu.csv"))
    x = parse("nvidia-smi-q-xml", real("nvidia-smi-q.xml"))
    views = merge_gpus([("q", q.model_copy(update={"gpus": q.gpus[:1]})),
                        ("x", x.model_copy(update={"gpus": x.gpus[1:]}))])
    assert [(v.index, v.bus_id, v.sources) for v in views] == [
        (0, "00000000:00:06.0", ["q"]), (0, "00000000:00:07.0", ["x"])]


def test_bus_ids_are_read_as_hex_in_every_part() -> None:
    # Hyper-V guests put GPUs in PCI domains such as 8b5a; device numbers run to 1f
    assert norm_bus("00008B5A:00:00.0") == norm_bus("8b5a:00:00.0") == "8b5a:00:00.0"
    assert norm_bus("00000000:10:1C.0") == "0:10:1c.0"
    assert norm_bus("0000:00:1c.1") == "0:00:1c.1"
