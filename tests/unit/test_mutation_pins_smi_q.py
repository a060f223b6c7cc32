"""`nvidia-smi -q` text: GPU records whole, from the H200 capture edited one value at a time.

Pins `orchestrator/parsers/nvidia_smi_q.py` on exact values: every line the parser
reads is given a value of its own, so a fact read from the wrong key, summed into the
wrong counter or taken in the wrong order of precedence shows; the `missing` list of
an excerpt is pinned whole; every refusal word for word (kind, message, line, source).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import ParseError
from orchestrator.parsers.nvidia_smi_q import QMigDevice, QProcess, parse_nvidia_smi_q

FIX = Path(__file__).resolve().parents[1] / "fixtures"
H200 = FIX / "h200x2" / "commands" / "nvidia-smi-q.txt"
MIG = FIX / "public" / "nvidia-smi-q_h200-mig-load_r590.txt"
TITAN = FIX / "public" / "nvidia-smi-q_titan-v_r560.txt"
HINT = ("\n  what to do: check that the file is the unedited output of the command; "
        "report the line if it is")


def edit(text: str, values: dict[int, tuple[str, str]]) -> str:
    """Line N's value set, after checking that line N holds the key named."""
    lines = text.split("\n")
    for no, (key, value) in values.items():
        k, sep, _ = lines[no - 1].partition(":")
        assert sep and k.strip() == key, (no, lines[no - 1])
        lines[no - 1] = f"{k}: {value}"
    return "\n".join(lines)


def refusal(text: str, source: str | None = "q.txt") -> ParseError:
    with pytest.raises(ParseError) as exc:
        parse_nvidia_smi_q(text, source)
    assert exc.value.kind == "nvidia-smi-q" and exc.value.source == source
    assert str(exc.value) == exc.value.what + HINT
    return exc.value


WORN = {
    16: ("Persistence Mode", "Disabled"), 19: ("Current", "Disabled"), 20: ("Pending", "Enabled"),
    75: ("Max", "5"), 76: ("Current", "4"), 77: ("Device Current", "3"), 78: ("Device Max", "2"),
    79: ("Host Max", "1"), 81: ("Max", "16x"), 82: ("Current", "8x"),
    93: ("Performance State", "P2"), 97: ("SW Power Cap", "Active"),
    100: ("HW Power Brake Slowdown", "Active"), 103: ("Display Clock Setting", "Active"),
    113: ("Reserved", "616 MiB"), 114: ("Used", "17 MiB"), 124: ("Compute Mode", "Prohibited"),
    145: ("Pending", "Disabled"),
    148: ("SRAM Correctable", "1"), 149: ("SRAM Uncorrectable Parity", "2"),
    150: ("SRAM Uncorrectable SEC-DED", "4"), 151: ("DRAM Correctable", "8"),
    152: ("DRAM Uncorrectable", "16"), 154: ("SRAM Correctable", "32"),
    155: ("SRAM Uncorrectable Parity", "64"), 156: ("SRAM Uncorrectable SEC-DED", "128"),
    157: ("DRAM Correctable", "256"), 158: ("DRAM Uncorrectable", "512"),
    170: ("Single Bit ECC", "6"), 171: ("Double Bit ECC", "7"),
    172: ("Pending Page Blacklist", "Yes"),
    174: ("Correctable Error", "3"), 175: ("Inactive Correctable Error", "99"),
    176: ("Uncorrectable Error", "5"), 178: ("Pending", "Yes"),
    187: ("GPU Current Temp", "71 C"),
    198: ("Current Power Limit", "650.00 W"), 199: ("Requested Power Limit", "660.00 W"),
    200: ("Default Power Limit", "690.00 W"), 201: ("Min Power Limit", "210.00 W"),
    202: ("Max Power Limit", "720.00 W"),
    219: ("Graphics", "300 MHz"), 220: ("SM", "310 MHz"), 221: ("Memory", "3100 MHz"),
    232: ("Graphics", "1970 MHz"), 233: ("SM", "1965 MHz"), 234: ("Memory", "3200 MHz"),
    244: ("CliqueId", "4"), 245: ("ClusterUUID", "c1"), 247: ("Summary", "Healthy"),
}


def test_a_worn_h200_with_every_value_its_own() -> None:
    facts = parse_nvidia_smi_q(edit(H200.read_text(), WORN), "q.txt")
    assert (facts.timestamp, facts.driver_version, facts.cuda_version, facts.attached_gpus,
            facts.elided_gpus, facts.ignored_lines, facts.edits) == (
        "Mon Nov 30 04:53:05 2026", "580.159.04", "13.0", 2, None, [], [])
    g = facts.gpus[0].model_dump()
    sections = g.pop("sections")
    assert sections[:3] == ["Product Name", "Product Brand", "Product Architecture"]
    assert sections[-3:] == ["Fabric", "Processes", "Capabilities"] and len(sections) == 65
    assert g == {
        "bus_id": "00000000:00:06.0", "line_no": 9, "product_name": "NVIDIA H200",
        "product_brand": "NVIDIA", "product_architecture": "Hopper", "serial": "1650000000000",
        "uuid": "GPU-00000000-1111-2222-3333-000000000000", "vbios_version": "96.00.A5.00.1A",
        "persistence_mode": False, "mig_enabled": False, "mig_pending_enabled": True,
        "mig_devices": [], "memory_total_mib": 143771, "memory_used_mib": 17,
        "memory_reserved_mib": 616, "pcie_gen_current": 4, "pcie_gen_max": 5,
        "pcie_gen_device_current": 3, "pcie_gen_device_max": 2, "pcie_gen_host_max": 1,
        "pcie_width_current": 8, "pcie_width_max": 16, "performance_state": "P2",
        "clocks_event_reasons": {"mask": 0x185, "active": [
            "GpuIdle", "SwPowerCap", "HwPowerBrakeSlowdown", "DisplayClockSetting"]},
        "ecc_enabled": True, "ecc_pending_enabled": False,
        "ecc_volatile": {"correctable": 9, "uncorrectable": 22},
        "ecc_aggregate": {"correctable": 288, "uncorrectable": 704},
        "retired_pages": {"single_bit": 6, "double_bit": 7, "pending": True},
        "remapped_rows": {"correctable": 3, "uncorrectable": 5, "pending": True,
                          "failure": False},
        "temperature_gpu_c": 71, "power_draw_w": 80.62, "power_limit_w": 650.0,
        "power_requested_limit_w": 660.0, "power_default_limit_w": 690.0,
        "power_min_limit_w": 210.0, "power_max_limit_w": 720.0, "clocks_graphics_mhz": 300,
        "clocks_sm_mhz": 310, "clocks_mem_mhz": 3100, "clocks_max_graphics_mhz": 1970,
        "clocks_max_sm_mhz": 1965, "clocks_max_mem_mhz": 3200, "compute_mode": "Prohibited",
        "fabric": {"state": "Completed", "status": "Success", "clique_id": "4",
                   "cluster_uuid": "c1", "health_summary": "Healthy", "line_no": 241},
        "processes": [], "missing": [],
    }
    g1 = facts.gpus[1]
    assert (g1.bus_id, g1.line_no, g1.pcie_gen_current, g1.ecc_volatile.correctable) == (
        "00000000:00:07.0", 258, 5, 0)


def test_older_spellings_of_the_same_facts() -> None:
    """Power Draw / Power Limit / Gpu temperature / Pending Page Retirement / Clique ID."""
    text = edit(H200.read_text(), {
        196: ("Average Power Draw", "80.62 W"), 172: ("Pending Page Blacklist", "N/A")})
    lines = text.split("\n")
    lines[186] = "        Gpu                                            : 35 C"  # line 187
    lines[196] = "        Power Draw                                     : 90.00 W"  # 197
    lines[197] = "        Power Limit                                    : 640.00 W"  # 198
    lines[243] = "        Clique ID                                      : 5"  # 244
    lines[244] = "        Cluster UUID                                   : c2"  # 245
    lines[171] = "        Pending Page Retirement                        : No"  # 172
    lines[194] = "    Power Readings"  # 195
    g = parse_nvidia_smi_q("\n".join(lines)).gpus[0]
    assert (g.temperature_gpu_c, g.power_draw_w, g.power_limit_w) == (35, 90.0, 640.0)
    assert g.retired_pages.pending is False
    assert g.fabric is not None and (g.fabric.clique_id, g.fabric.cluster_uuid) == ("5", "c2")
    lines[197] = "        Enforced Power Limit                           : 630.00 W"
    lines[196] = "        Instantaneous Power Draw                       : 91.00 W"
    lines[195] = "        Average Power Draw                             : N/A"
    g = parse_nvidia_smi_q("\n".join(lines)).gpus[0]
    assert (g.power_draw_w, g.power_limit_w) == (None, 630.0)  # the first present wins, N/A
    assert "power draw" not in g.missing
    del lines[195]  # no average at all: the instantaneous draw is read
    g = parse_nvidia_smi_q("\n".join(lines)).gpus[0]
    assert (g.power_draw_w, g.power_limit_w) == (91.0, 630.0)


def test_the_titan_v_whole_old_ecc_layout_and_retired_pages() -> None:
    text = TITAN.read_text()
    lines = text.split("\n")
    assert "Total" in lines[138] and "Total" in lines[147]
    lines[138] = lines[138].replace("N/A", "3")  # Volatile Single Bit Total
    lines[147] = lines[147].replace("N/A", "1")  # Volatile Double Bit Total
    facts = parse_nvidia_smi_q("\n".join(lines))
    (g,) = facts.gpus
    assert (g.ecc_volatile.correctable, g.ecc_volatile.uncorrectable) == (3, 1)
    assert (g.ecc_aggregate.correctable, g.ecc_aggregate.uncorrectable) == (None, None)
    assert g.retired_pages.model_dump() == {"single_bit": None, "double_bit": None,
                                            "pending": None}
    assert g.remapped_rows is None and g.power_draw_w == 29.02
    assert g.mig_enabled is None and g.missing == []  # `Current : N/A` is there: not missing


def test_retired_pages_of_drivers_before_450_and_an_na_section() -> None:
    lines = H200.read_text().split("\n")
    lines[169:172] = ["        Single Bit ECC", "            Retired Count : 2",
                      "        Double Bit ECC", "            Retired Count : N/A",
                      "        Pending : Yes"]
    g = parse_nvidia_smi_q("\n".join(lines)).gpus[0]
    assert g.retired_pages.model_dump() == {"single_bit": 2, "double_bit": None, "pending": True}
    lines[169:174] = ["        Single Bit ECC", "        Double Bit ECC"]
    g = parse_nvidia_smi_q("\n".join(lines)).gpus[0]
    assert g.retired_pages.model_dump() == {"single_bit": None, "double_bit": None,
                                            "pending": None}
    lines[168:170] = ["    Retired Pages : N/A"]
    del lines[169]
    g = parse_nvidia_smi_q("\n".join(lines)).gpus[0]
    assert g.retired_pages.model_dump() == {"single_bit": None, "double_bit": None,
                                            "pending": None}
    assert "retired pages" not in g.missing


def test_an_excerpt_reports_every_fact_it_lacks_in_order() -> None:
    (g,) = parse_nvidia_smi_q("GPU 00000000:01:00.0\n    Product Brand : NVIDIA\n").gpus
    assert (g.bus_id, g.line_no, g.product_brand, g.sections) == (
        "00000000:01:00.0", 1, "NVIDIA", ["Product Brand"])
    assert g.missing == ["Product Name", "MIG mode", "memory total", "PCIe generation",
                         "PCIe link width", "clocks event reasons", "ECC mode", "retired pages",
                         "remapped rows", "temperature", "power draw",
                         "power limit", "max power limit", "clocks", "max clocks", "processes"]


def test_a_remapped_rows_section_without_its_pending_line() -> None:
    (g,) = parse_nvidia_smi_q("GPU 00000000:01:00.0\n    Remapped Rows\n"
                              "        Correctable Error : 1\n").gpus
    assert g.remapped_rows is not None and g.remapped_rows.model_dump() == {
        "correctable": 1, "uncorrectable": None, "pending": None, "failure": None}
    assert "remapped rows pending" in g.missing and "remapped rows" not in g.missing
    (g,) = parse_nvidia_smi_q("GPU 00000000:01:00.0\n    Remapped Rows\n        Pending : No\n"
                              "    Processes : None\n").gpus
    assert g.remapped_rows is not None and g.remapped_rows.model_dump() == {
        "correctable": None, "uncorrectable": None, "pending": False, "failure": None}
    assert g.missing == ["Product Name", "MIG mode", "memory total", "PCIe generation",
                         "PCIe link width", "clocks event reasons", "ECC mode", "retired pages",
                         "temperature", "power draw", "power limit", "max power limit", "clocks",
                         "max clocks"]


def test_mig_devices_and_processes_of_the_h200_whole() -> None:
    (g,) = parse_nvidia_smi_q(MIG.read_text()).gpus
    assert g.mig_devices == [
        QMigDevice(index=0, gpu_instance_id=2, compute_instance_id=0, multiprocessor_count=16,
                   memory_total_mib=71424),
        QMigDevice(index=1, gpu_instance_id=2, compute_instance_id=1, multiprocessor_count=32,
                   memory_total_mib=71424),
        QMigDevice(index=2, gpu_instance_id=3, compute_instance_id=0, multiprocessor_count=32,
                   memory_total_mib=33280),
        QMigDevice(index=3, gpu_instance_id=9, compute_instance_id=0, multiprocessor_count=16,
                   memory_total_mib=16384),
        QMigDevice(index=4, gpu_instance_id=10, compute_instance_id=0, multiprocessor_count=16,
                   memory_total_mib=16384)]
    assert g.processes == [
        QProcess(gpu_instance_id=2, compute_instance_id=1, pid=12249, type="C",
                 name="/root/tools/memhog", used_memory_mib=2194),
        QProcess(gpu_instance_id=2, compute_instance_id=1, pid=12250, type="C",
                 name="/root/tools/memhog", used_memory_mib=1170),
        QProcess(gpu_instance_id=2, compute_instance_id=1, pid=12267, type="C",
                 name="./gpu_burn", used_memory_mib=13526)]
    assert g.missing == []


def test_mig_devices_under_a_mig_devices_section_with_fb_memory() -> None:
    text = ("GPU 00000000:01:00.0\n    MIG Devices\n        MIG Device\n"
            "            Index : 0\n            GPU Instance ID : 1\n"
            "            Compute Instance ID : 0\n"
            "            FB Memory Usage\n                Total : 9984 MiB\n"
            "        MIG Device\n            Index : 1\n")
    (g,) = parse_nvidia_smi_q(text).gpus
    assert g.mig_devices == [
        QMigDevice(index=0, gpu_instance_id=1, compute_instance_id=0, multiprocessor_count=None,
                   memory_total_mib=9984),
        QMigDevice(index=1, gpu_instance_id=None, compute_instance_id=None,
                   multiprocessor_count=None, memory_total_mib=None)]


def test_processes_keep_their_instance_ids_only_until_the_next_process() -> None:
    text = ("GPU 00000000:01:00.0\n    Processes\n"
            "        GPU instance ID : 1\n        Compute instance ID : 2\n"
            "        Process ID : 10\n            Type : C\n            Name : a\n"
            "            Used GPU Memory : 5 MiB\n"
            "        Process ID : 11\n            Type : G\n"
            "        GPU instance ID : N/A\n        Process ID : 12\n")
    (g,) = parse_nvidia_smi_q(text).gpus
    assert g.processes == [
        QProcess(gpu_instance_id=1, compute_instance_id=2, pid=10, type="C", name="a",
                 used_memory_mib=5),
        QProcess(gpu_instance_id=None, compute_instance_id=None, pid=11, type="G", name=None,
                 used_memory_mib=None),
        QProcess(gpu_instance_id=None, compute_instance_id=None, pid=12, type=None, name=None,
                 used_memory_mib=None)]
    assert "processes" not in g.missing


def test_reasons_of_names_it_does_not_know_and_all_na() -> None:
    text = ("GPU 00000000:01:00.0\n    Clocks Throttle Reasons\n        Idle : Not Active\n"
            "        Some New Reason : Active\n        Sync Boost : Active\n")
    r = parse_nvidia_smi_q(text).gpus[0].clocks_event_reasons
    assert r is not None and (r.mask, r.active) == (0x10, ["Some New Reason", "SyncBoost"])
    text = "GPU 00000000:01:00.0\n    Clocks Event Reasons\n        Idle : N/A\n"
    (g,) = parse_nvidia_smi_q(text).gpus
    assert g.clocks_event_reasons is None and "clocks event reasons" not in g.missing


def test_ecc_leaves_that_are_na_or_not_counters() -> None:
    text = ("GPU 00000000:01:00.0\n    ECC Errors\n        Volatile\n"
            "            SRAM Threshold Exceeded : No\n            Sources\n"
            "                correctable sub : 9\n"
            "            SRAM Correctable : N/A\n            DRAM Uncorrectable : 2\n")
    (g,) = parse_nvidia_smi_q(text).gpus
    assert g.ecc_volatile.model_dump() == {"correctable": None, "uncorrectable": 2}
    assert g.ecc_aggregate.model_dump() == {"correctable": None, "uncorrectable": None}


def test_totals_of_the_old_layout_win_over_counters_beside_them() -> None:
    text = ("GPU 00000000:01:00.0\n    ECC Errors\n        Volatile\n"
            "            Single Bit\n                Total : 3\n"
            "            Double Bit\n                Total : 1\n"
            "            SRAM Correctable : 5\n            DRAM Uncorrectable : 7\n")
    (g,) = parse_nvidia_smi_q(text).gpus
    assert g.ecc_volatile.model_dump() == {"correctable": 3, "uncorrectable": 1}


def test_reasons_after_a_title_or_an_na_reason_are_read() -> None:
    text = ("GPU 00000000:01:00.0\n    Clocks Event Reasons\n        Idle : N/A\n"
            "        Hardware\n            HW Slowdown : Active\n"
            "        SW Power Cap : Active\n")
    r = parse_nvidia_smi_q(text).gpus[0].clocks_event_reasons
    assert r is not None and (r.mask, r.active) == (0xC, ["HwSlowdown", "SwPowerCap"])


def test_bad_values_of_mig_devices_and_processes_name_the_file() -> None:
    err = refusal("GPU 00000000:01:00.0\n    MIG Device\n        Index : first\n")
    assert (err.line_no, err.line) == (3, "        Index : first")
    assert err.what == ("cannot parse nvidia-smi-q output at q.txt:3: Index: expected a number, "
                        "got 'first'\n  line: '        Index : first'")
    err = refusal("GPU 00000000:01:00.0\n    Processes\n        Process ID : 7\n"
                  "            Used GPU Memory : 5 GB\n")
    assert (err.line_no, err.line) == (4, "            Used GPU Memory : 5 GB")
    assert err.what == ("cannot parse nvidia-smi-q output at q.txt:4: Used GPU Memory: expected a "
                        "number in MiB, got '5 GB'\n  line: '            Used GPU Memory : 5 GB'")


def test_a_process_before_any_instance_line_has_none() -> None:
    (g,) = parse_nvidia_smi_q("GPU 00000000:01:00.0\n    Processes\n"
                              "        Process ID : 10\n").gpus
    assert g.processes == [QProcess(gpu_instance_id=None, compute_instance_id=None, pid=10,
                                    type=None, name=None, used_memory_mib=None)]


def test_fabric_of_a_registered_gpu_without_health() -> None:
    text = "GPU 00000000:01:00.0\n    Fabric\n        State : In Progress\n        Status : N/A\n"
    f = parse_nvidia_smi_q(text).gpus[0].fabric
    assert f is not None and f.model_dump() == {
        "state": "In Progress", "status": None, "clique_id": None, "cluster_uuid": None,
        "health_summary": None, "line_no": 2}


def test_counts_of_attached_and_elided_gpus() -> None:
    one = "GPU 00000000:01:00.0\n    Product Name : A\n"
    for attached, elided in (("3", 2), ("1", None), ("0", None)):
        facts = parse_nvidia_smi_q(f"Attached GPUs : {attached}\n" + one)
        assert (facts.attached_gpus, facts.elided_gpus) == (int(attached), elided)
    facts = parse_nvidia_smi_q("Timestamp : N/A\nCUDA Version : 12.4\n")
    assert (facts.timestamp, facts.cuda_version, facts.driver_version, facts.gpus) == (
        None, "12.4", None, [])


def test_refusals_word_for_word() -> None:
    err = refusal(" \n")
    assert (err.line_no, err.line) == (None, None)
    assert err.what == "cannot parse nvidia-smi-q output at q.txt: empty output"
    err = refusal("root@node:~# nvidia-smi -q\n")
    assert (err.line_no, err.line) == (None, None)
    assert err.what == "cannot parse nvidia-smi-q output at q.txt: no `Key : value` line"
    err = refusal("Driver Version : 1\nAttached GPUs : many\n")
    assert (err.line_no, err.line) == (2, "Attached GPUs : many")
    assert err.what == ("cannot parse nvidia-smi-q output at q.txt:2: Attached GPUs is not a "
                        "count\n  line: 'Attached GPUs : many'")
    err = refusal("Attached GPUs :\n")
    assert err.what.startswith("cannot parse nvidia-smi-q output at q.txt:1: Attached GPUs is")
    err = refusal("Timestamp : x\nSomething : 1\nOther : 2\n")
    assert (err.line_no, err.line) == (2, None)
    assert err.what == ("cannot parse nvidia-smi-q output at q.txt:2: no GPU section and no known "
                        "top-level key")
    err = refusal("GPU 00000000:01:00.0\n    Processes\n        Process ID : N/A\n")
    assert (err.line_no, err.line) == (3, None)
    assert err.what == "cannot parse nvidia-smi-q output at q.txt:3: process without a PID"
    err = refusal("GPU 00000000:01:00.0\n    FB Memory Usage\n        Total : 80 GB\n")
    assert (err.line_no, err.line) == (3, "        Total : 80 GB")
    assert err.what == ("cannot parse nvidia-smi-q output at q.txt:3: Total: expected a number "
                        "in MiB, got '80 GB'\n  line: '        Total : 80 GB'")
