"""`nvidia-smi -q -x`: GPU records whole, from the H200 capture edited one leaf at a time.

Pins `orchestrator/parsers/nvidia_smi_xml.py` on exact values: every leaf the parser
reads is given a value of its own, so a fact read from the wrong tag, summed into the
wrong counter or taken in the wrong order of precedence shows; and every refusal is
pinned word for word (kind, message, line, source).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import ParseError
from orchestrator.parsers.nvidia_smi_xml import GpuXml, ProcessXml, parse_nvidia_smi_xml

FIX = Path(__file__).resolve().parents[1] / "fixtures"
H200 = FIX / "h200x2" / "commands" / "nvidia-smi-q.xml"
R470 = FIX / "synthetic" / "nvidia-smi-q_a100-pcie-40gb_r470.xml"
R535 = FIX / "synthetic" / "nvidia-smi-q_a100-sxm4-40gb-mig_r535.xml"
HINT = ("\n  what to do: check that the file is the unedited output of the command; "
        "report the line if it is")


def edit(text: str, *pairs: tuple[str, str]) -> str:
    """Each `old` replaced once (its first place: GPU 0), and each must be there."""
    for old, new in pairs:
        assert old in text, old
        text = text.replace(old, new, 1)
    return text


def refusal(text: str, source: str | None = "q.xml") -> ParseError:
    with pytest.raises(ParseError) as exc:
        parse_nvidia_smi_xml(text, source)
    assert exc.value.kind == "nvidia-smi-q-xml" and exc.value.source == source
    assert str(exc.value) == exc.value.what + HINT
    return exc.value


WORN = (
    ("<pending_mig>Disabled</pending_mig>", "<pending_mig>Enabled</pending_mig>"),
    ("<persistence_mode>Enabled</persistence_mode>", "<persistence_mode>Disabled</persistence_mode>"),
    ("<max_link_gen>5</max_link_gen>", "<max_link_gen>5</max_link_gen>"
                                       "<max_host_link_gen>2</max_host_link_gen>"),
    ("<current_link_gen>5</current_link_gen>", "<current_link_gen>4</current_link_gen>"),
    ("<max_device_link_gen>5</max_device_link_gen>", "<max_device_link_gen>3</max_device_link_gen>"),
    ("<current_link_width>16x</current_link_width>", "<current_link_width>8x</current_link_width>"),
    ("<clocks_event_reason_sw_power_cap>Not Active", "<clocks_event_reason_sw_power_cap>Active"),
    ("</clocks_event_reasons>", "<clocks_event_reason_new_thing>Active</clocks_event_reason_new_thing>"
                                "<clocks_event_reason_other>N/A</clocks_event_reason_other>"
                                "</clocks_event_reasons>"),
    ("<used>0 MiB</used>", "<used>17 MiB</used>"),
    ("<pending_ecc>Enabled</pending_ecc>", "<pending_ecc>Disabled</pending_ecc>"),
    ("<sram_correctable>0<", "<sram_correctable>1<"),
    ("<sram_uncorrectable_parity>0<", "<sram_uncorrectable_parity>2<"),
    ("<sram_uncorrectable_secded>0<", "<sram_uncorrectable_secded>4<"),
    ("<dram_correctable>0<", "<dram_correctable>8<"),
    ("<dram_uncorrectable>0<", "<dram_uncorrectable>16<"),
    ("<sram_correctable>0<", "<sram_correctable>32<"),
    ("<sram_uncorrectable_parity>0<", "<sram_uncorrectable_parity>64<"),
    ("<sram_uncorrectable_secded>0<", "<sram_uncorrectable_secded>128<"),
    ("<dram_correctable>0<", "<dram_correctable>256<"),
    ("<dram_uncorrectable>0<", "<dram_uncorrectable>512<"),
    ("<retired_count>N/A<", "<retired_count>6<"),
    ("<retired_count>N/A<", "<retired_count>7<"),
    ("<pending_retirement>N/A<", "<pending_retirement>Yes<"),
    ("<remapped_row_corr>0<", "<remapped_row_corr>3<"),
    ("<remapped_row_unc>0<", "<remapped_row_unc>5<"),
    ("<remapped_row_pending>No<", "<remapped_row_pending>Yes<"),
    ("<gpu_temp>34 C<", "<gpu_temp>71 C<"),
    ("<current_power_limit>700.00 W<", "<current_power_limit>650.00 W<"),
    ("<default_power_limit>700.00 W<", "<default_power_limit>690.00 W<"),
    ("<max_power_limit>700.00 W<", "<max_power_limit>720.00 W<"),
    ("<sm_clock>345 MHz<", "<sm_clock>1755 MHz<"),
    ("<sm_clock>1980 MHz<", "<sm_clock>1965 MHz<"),
    ("<cliqueId>0<", "<cliqueId>4<"),
    ("<summary>N/A<", "<summary>Limited Capacity<"),
    ("<performance_state>P0<", "<performance_state>P2<"),
    ("<compute_mode>Default<", "<compute_mode>Exclusive_Process<"),
    ("<processes>", "<processes><process_info><gpu_instance_id>N/A</gpu_instance_id>"
                    "<compute_instance_id>N/A</compute_instance_id><pid>4242</pid><type>C</type>"
                    "<process_name>python3</process_name><used_memory>1536 MiB</used_memory>"
                    "</process_info>"),
)


def test_a_worn_h200_with_every_leaf_its_own_value() -> None:
    facts = parse_nvidia_smi_xml(edit(H200.read_text(), *WORN), "q.xml")
    assert (facts.driver_version, facts.cuda_version, facts.attached_gpus, facts.count) == (
        "580.159.04", "13.0", 2, 2)
    assert facts.gpus[0].model_dump() == {
        "index": 0, "pci_bus_id": "00000000:00:06.0", "product_name": "NVIDIA H200",
        "product_brand": "NVIDIA", "product_architecture": "Hopper",
        "board_part_number": "692-2G520-0282-001", "serial": "1650000000000",
        "uuid": "GPU-00000000-1111-2222-3333-000000000000", "vbios_version": "96.00.A5.00.1A",
        "persistence_mode": False, "mig_enabled": False, "mig_pending_enabled": True,
        "mig_devices": [], "memory_total_mib": 143771, "memory_used_mib": 17,
        "ecc_enabled": True, "ecc_pending_enabled": False,
        "ecc_volatile": {"correctable": 9, "uncorrectable": 22},
        "ecc_aggregate": {"correctable": 288, "uncorrectable": 704},
        "retired_pages": {"single_bit": 6, "double_bit": 7, "pending": True},
        "remapped_rows": {"correctable": 3, "uncorrectable": 5, "pending": True,
                          "failure": False},
        "pcie_gen_current": 4, "pcie_gen_max": 5, "pcie_gen_device_max": 3,
        "pcie_gen_host_max": 2, "pcie_width_current": 8, "pcie_width_max": 16,
        "power_draw_w": 81.25, "power_limit_w": 650.0, "power_default_limit_w": 690.0,
        "power_min_limit_w": 200.0, "power_max_limit_w": 720.0, "temperature_gpu_c": 71,
        "clocks_sm_mhz": 1755, "clocks_max_sm_mhz": 1965,
        "clocks_event_reasons": {"mask": 5, "active": ["GpuIdle", "SwPowerCap", "new_thing"]},
        "fabric": {"state": "Completed", "status": "Success", "clique_id": "4",
                   "cluster_uuid": "00000000-0000-0000-0000-000000000000",
                   "health_summary": "Limited Capacity", "line_no": None},
        "performance_state": "P2", "compute_mode": "Exclusive_Process",
        "processes": [{"gpu_instance_id": None, "compute_instance_id": None, "pid": 4242,
                       "type": "C", "name": "python3", "used_memory_mib": 1536}],
    }
    # GPU 1 kept its own values
    g1 = facts.gpus[1]
    assert (g1.index, g1.pci_bus_id, g1.ecc_volatile.correctable, g1.power_limit_w,
            g1.processes) == (1, "00000000:00:07.0", 0, 700.0, [])


def test_the_r470_layout_whole() -> None:
    text = edit(R470.read_text(),
                ("<enforced_power_limit>200.00 W<", "<enforced_power_limit>195.00 W<"),
                ("<total>0</total>", "<total>3</total>"),
                ("<total>0</total>", "<total>1</total>"),
                ("<pending_retirement>N/A<", "<pending_retirement>No<"))
    facts = parse_nvidia_smi_xml(text)
    assert (facts.driver_version, facts.cuda_version, facts.attached_gpus) == (
        "470.182.03", "11.4", 1)
    assert facts.gpus == [GpuXml.model_validate({
        "index": 0, "pci_bus_id": "00000000:41:00.0", "product_name": "NVIDIA A100-PCIE-40GB",
        "product_brand": "NVIDIA", "serial": "1320521017322",
        "uuid": "GPU-3e2d0b4f-5a6c-7d8e-9f0a-1b2c3d4e5f60", "vbios_version": "92.00.25.00.08",
        "persistence_mode": False, "mig_enabled": False, "mig_pending_enabled": False,
        "memory_total_mib": 40536, "memory_used_mib": 37412, "ecc_enabled": True,
        "ecc_pending_enabled": True, "ecc_volatile": {"correctable": 3, "uncorrectable": 1},
        "ecc_aggregate": {"correctable": 12, "uncorrectable": 2},
        "retired_pages": {"pending": False},
        "remapped_rows": {"correctable": 0, "uncorrectable": 2, "pending": False,
                          "failure": True},
        "pcie_gen_current": 4, "pcie_gen_max": 4, "pcie_width_current": 8, "pcie_width_max": 16,
        "power_draw_w": 199.82, "power_limit_w": 195.0, "power_default_limit_w": 250.0,
        "power_min_limit_w": 150.0, "power_max_limit_w": 250.0, "temperature_gpu_c": 82,
        "clocks_sm_mhz": 1005, "clocks_max_sm_mhz": 1410,
        "clocks_event_reasons": {"mask": 0xA4, "active": [
            "SwPowerCap", "HwPowerBrakeSlowdown", "SwThermalSlowdown"]},
        "performance_state": "P0", "compute_mode": "Default", "processes": []})]


def test_mig_devices_of_r535_whole() -> None:
    text = edit(R535.read_text(), ("<multiprocessor_count>42<", "<multiprocessor_count>14<"),
                ("<compute_instance_id>0<", "<compute_instance_id>1<"))
    g0 = parse_nvidia_smi_xml(text).gpus[0]
    assert [m.model_dump() for m in g0.mig_devices] == [
        {"index": 0, "gpu_instance_id": 1, "compute_instance_id": 1, "multiprocessor_count": 14,
         "memory_total_mib": 19968},
        {"index": 1, "gpu_instance_id": 2, "compute_instance_id": 0, "multiprocessor_count": 42,
         "memory_total_mib": 19968}]


def test_power_draw_and_limit_by_precedence() -> None:
    base = R470.read_text()
    (g,) = parse_nvidia_smi_xml(edit(
        base, ("<power_draw>199.82 W</power_draw>", "<instant_power_draw>190.00 W"
                                                    "</instant_power_draw><average_power_draw>"
                                                    "180.00 W</average_power_draw>"),
        ("<enforced_power_limit>200.00 W<", "<enforced_power_limit>195.00 W<"),
        ("<power_limit>200.00 W<", "<current_power_limit>210.00 W<"),
        ("</power_limit>", "</current_power_limit>"))).gpus
    assert (g.power_draw_w, g.power_limit_w) == (190.0, 210.0)
    (g,) = parse_nvidia_smi_xml(edit(
        base, ("<power_draw>199.82 W</power_draw>", "<average_power_draw>180.00 W"
                                                    "</average_power_draw>"),
        ("<enforced_power_limit>200.00 W</enforced_power_limit>", ""))).gpus
    assert (g.power_draw_w, g.power_limit_w) == (180.0, 200.0)


def test_what_is_absent_or_has_no_leaf() -> None:
    text = edit(H200.read_text(), ("\t<gpu id=\"00000000:00:06.0\">", "\t<gpu>"),
                ("<pci_bus_id>00000000:00:06.0</pci_bus_id>", "<pci_bus_id> 0000:06.0 </pci_bus_id>"),
                ("<product_brand>NVIDIA</product_brand>", "<product_brand/>"),
                ("<product_name>NVIDIA H200</product_name>", "<product_name><x>1</x></product_name>"),
                ("<clocks_event_reasons>", "<clocks_event_reasons_gone>"),
                ("</clocks_event_reasons>", "</clocks_event_reasons_gone>"),
                ("<remapped_rows>", "<remapped_rows/><was>"), ("</remapped_rows>", "</was>"),
                ("<fabric>", "<fabric_gone>"), ("</fabric>", "</fabric_gone>"),
                ("<processes>", "<processes_gone>"), ("</processes>", "</processes_gone>"),
                ("<ecc_errors>", "<ecc_errors_gone>"), ("</ecc_errors>", "</ecc_errors_gone>"))
    g = parse_nvidia_smi_xml(text).gpus[0]
    assert (g.pci_bus_id, g.product_brand, g.product_name) == ("0000:06.0", None, None)
    assert (g.clocks_event_reasons, g.remapped_rows, g.fabric, g.processes) == (
        None, None, None, None)
    assert (g.ecc_volatile.model_dump(), g.ecc_aggregate.model_dump()) == (
        {"correctable": None, "uncorrectable": None},) * 2
    # reasons all N/A: nothing known, so no reasons at all
    text = H200.read_text()
    for state in ("Active", "Not Active"):
        text = text.replace(f">{state}</clocks_event_reason", ">N/A</clocks_event_reason")
    assert parse_nvidia_smi_xml(text).gpus[0].clocks_event_reasons is None


def test_ecc_counters_that_are_na_sum_to_none() -> None:
    text = H200.read_text()
    for leaf in ("sram_correctable", "dram_correctable"):
        text = text.replace(f"<{leaf}>0</{leaf}>", f"<{leaf}>N/A</{leaf}>")
    g = parse_nvidia_smi_xml(text).gpus[0]
    assert g.ecc_volatile.model_dump() == {"correctable": None, "uncorrectable": 0}


def test_the_throttle_spelling_is_read_when_event_is_absent() -> None:
    text = H200.read_text().replace("clocks_event_reason", "clocks_throttle_reason")
    text = text.replace("<clocks_throttle_reason_sw_power_cap>Not Active",
                        "<clocks_throttle_reason_sw_power_cap>Active", 1)
    r = parse_nvidia_smi_xml(text).gpus[0].clocks_event_reasons
    assert r is not None and (r.mask, r.active) == (5, ["GpuIdle", "SwPowerCap"])


def test_a_process_whole() -> None:
    proc = ("<process_info><gpu_instance_id>1</gpu_instance_id>"
            "<compute_instance_id>2</compute_instance_id><pid>77</pid><type>C+G</type>"
            "<process_name>vllm</process_name><used_memory>N/A</used_memory></process_info>")
    g = parse_nvidia_smi_xml(edit(H200.read_text(), ("<processes>", "<processes>" + proc))).gpus[0]
    assert g.processes == [ProcessXml(gpu_instance_id=1, compute_instance_id=2, pid=77,
                                      type="C+G", name="vllm", used_memory_mib=None)]


def test_a_bad_leaf_of_a_process_or_mig_device_names_its_line() -> None:
    proc = ("<process_info><pid>77</pid>\n<used_memory>5 GiB</used_memory>"
            "</process_info>")
    err = refusal(edit(H200.read_text(), ("<processes>", "<processes>" + proc)))
    assert (err.line_no, err.line) == (542, "<used_memory>5 GiB</used_memory></process_info>")
    assert err.what == ("cannot parse nvidia-smi-q-xml output at q.xml:542: <used_memory>: "
                        "expected a number in MiB, got '5 GiB'\n  line: "
                        "'<used_memory>5 GiB</used_memory></process_info>'")
    err = refusal(edit(R535.read_text(), ("<multiprocessor_count>42<", "<multiprocessor_count>x<")))
    assert err.line is not None and err.line.strip() == "<multiprocessor_count>x</multiprocessor_count>"
    assert err.what.startswith(f"cannot parse nvidia-smi-q-xml output at q.xml:{err.line_no}: "
                               "<multiprocessor_count>: expected a number, got 'x'")


def test_a_bad_leaf_names_its_line_and_tag() -> None:
    text = edit(H200.read_text(), ("<gpu_temp>34 C</gpu_temp>", "<gpu_temp>34 F</gpu_temp>"))
    err = refusal(text)
    assert (err.line_no, err.line) == (226, "\t\t\t<gpu_temp>34 F</gpu_temp>")
    assert err.what == ("cannot parse nvidia-smi-q-xml output at q.xml:226: <gpu_temp>: expected "
                        "a number in C, got '34 F'\n  line: '\\t\\t\\t<gpu_temp>34 F</gpu_temp>'")
    # the tag named is the leaf's own, however deep it stands
    text = edit(H200.read_text(), ("<current_link_gen>5<", "<current_link_gen>five<"))
    err = refusal(text)
    assert (err.line_no, err.line) == (86, "\t\t\t\t\t<current_link_gen>five</current_link_gen>")
    assert err.what.startswith("cannot parse nvidia-smi-q-xml output at q.xml:86: "
                               "<current_link_gen>: expected a number, got 'five'\n")
    # a value the text spells with blanks around it: the line cannot be pointed at
    text = edit(H200.read_text(), ("<gpu_temp>34 C</gpu_temp>", "<gpu_temp> hot </gpu_temp>"))
    err = refusal(text, source=None)
    assert (err.line_no, err.line) == (None, None)
    assert err.what == ("cannot parse nvidia-smi-q-xml output at <text>: <gpu_temp>: expected a "
                        "number in C, got 'hot'")


def test_refusals_of_the_document_word_for_word() -> None:
    err = refusal(" \n\t\n")
    assert (err.line_no, err.line) == (None, None)
    assert err.what == "cannot parse nvidia-smi-q-xml output at q.xml: empty output"
    err = refusal("<nvidia_smi_log>\n<gpu>\n</nvidia_smi_log>\n")
    assert (err.line_no, err.line) == (3, "</nvidia_smi_log>")
    assert err.what == ("cannot parse nvidia-smi-q-xml output at q.xml:3: not well-formed XML "
                        "(mismatched tag: line 3, column 2)\n  line: '</nvidia_smi_log>'")
    err = refusal("<nvidia_smi_log>\n")
    assert (err.line_no, err.line) == (2, None)
    assert err.what == ("cannot parse nvidia-smi-q-xml output at q.xml:2: not well-formed XML "
                        "(no element found: line 2, column 0)")
    err = refusal("<log>\n<gpu/>\n</log>\n")
    assert (err.line_no, err.line) == (1, "<log>")
    assert err.what == ("cannot parse nvidia-smi-q-xml output at q.xml:1: root element is <log>, "
                        "not <nvidia_smi_log>\n  line: '<log>'")
    text = H200.read_text().replace("<attached_gpus>2<", "<attached_gpus>two<")
    err = refusal(text)
    assert (err.line_no, err.line) == (7, "\t<attached_gpus>two</attached_gpus>")
    assert err.what == ("cannot parse nvidia-smi-q-xml output at q.xml:7: <attached_gpus> is not "
                        "a count: 'two'\n  line: '\\t<attached_gpus>two</attached_gpus>'")


def test_a_doctype_is_dropped_once_and_top_level_na_is_none() -> None:
    text = ('<?xml version="1.0" ?>\n<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v13.dtd">\n'
            "<nvidia_smi_log><driver_version>N/A</driver_version>"
            "<attached_gpus>0</attached_gpus></nvidia_smi_log>\n")
    facts = parse_nvidia_smi_xml(text)
    assert (facts.driver_version, facts.cuda_version, facts.attached_gpus, facts.gpus) == (
        None, None, 0, [])
    facts = parse_nvidia_smi_xml("<nvidia_smi_log><cuda_version/></nvidia_smi_log>")
    assert (facts.cuda_version, facts.attached_gpus) == (None, None)


def test_retired_pages_pending_from_the_blacklist_tag_of_older_drivers() -> None:
    text = edit(H200.read_text(), ("<pending_retirement>N/A</pending_retirement>", ""),
                ("<pending_blacklist>N/A<", "<pending_blacklist>Yes<"))
    assert parse_nvidia_smi_xml(text).gpus[0].retired_pages.pending is True


def test_the_gpu_id_attribute_wins_over_the_pci_bus_id_leaf() -> None:
    text = edit(H200.read_text(), ("<pci_bus_id>00000000:00:06.0<", "<pci_bus_id>0000:06.0<"))
    assert parse_nvidia_smi_xml(text).gpus[0].pci_bus_id == "00000000:00:06.0"


def test_reasons_and_counters_after_an_na_or_foreign_leaf_are_read() -> None:
    text = edit(H200.read_text(),
                ("<clocks_event_reason_gpu_idle>Active<", "<clocks_event_reason_gpu_idle>N/A<"),
                ("<clocks_event_reason_display_clocks_setting>Not Active<",
                 "<clocks_event_reason_display_clocks_setting>Active<"),
                ("</clocks_event_reasons>", "<clocks_event_reason_new_thing>Active"
                                            "</clocks_event_reason_new_thing></clocks_event_reasons>"),
                ("<volatile>\n", "<volatile>\n<sram_threshold_exceeded>No</sram_threshold_exceeded>"),
                ("<sram_correctable>0<", "<sram_correctable>4<"))
    g = parse_nvidia_smi_xml(text).gpus[0]
    assert g.clocks_event_reasons is not None
    assert (g.clocks_event_reasons.mask, g.clocks_event_reasons.active) == (
        0x100, ["DisplayClockSetting", "new_thing"])
    assert g.ecc_volatile.model_dump() == {"correctable": 4, "uncorrectable": 0}


def test_a_bad_value_is_pointed_at_where_it_first_stands() -> None:
    text = H200.read_text().replace("<persistence_mode>Enabled<", "<persistence_mode>Maybe<")
    err = refusal(text)
    assert (err.line_no, err.line) == (15, "\t\t<persistence_mode>Maybe</persistence_mode>")
    assert err.what == ("cannot parse nvidia-smi-q-xml output at q.xml:15: <persistence_mode>: "
                        "expected Enabled/Disabled or Yes/No, got 'Maybe'\n  line: "
                        "'\\t\\t<persistence_mode>Maybe</persistence_mode>'")
    # a file that starts with a blank line and no declaration: lines still counted from 1
    lines = H200.read_text().split("\n")
    assert lines[1].startswith("<!DOCTYPE")
    text = "\n" + "\n".join(lines[2:]).replace("<gpu_temp>34 C<", "<gpu_temp>hot<", 1)
    err = refusal(text)
    assert (err.line_no, err.line) == (225, "\t\t\t<gpu_temp>hot</gpu_temp>")
