"""Merging every nvidia-smi output of a node into one view per GPU."""

from __future__ import annotations

from orchestrator.parsers import parse
from orchestrator.parsers.gpus import merge_gpus, norm_bus


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
