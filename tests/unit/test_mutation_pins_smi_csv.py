"""nvidia-smi's typed readers, `--query-gpu` CSV (with and without its header) and `-L`.

Pins `orchestrator/parsers/nvidia_smi.py` on exact values: every column name the
parser knows, read into its own field through its own reader; every word nvidia-smi
prints for "no value"; every clock event reason bit; the fabric's verdicts; and each
refusal word for word (kind, message, line, source).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.errors import ParseError
from orchestrator.parsers.nvidia_smi import (
    FLAG,
    INT,
    LANES,
    MHZ,
    MIB,
    PERCENT,
    REASONS,
    WATTS,
    ClockEventReasons,
    FabricState,
    GpuL,
    MigDeviceL,
    QueryGpu,
    integer,
    is_na,
    noheader_fits,
    number,
    parse_nvidia_smi_l,
    parse_query_gpu,
    parse_query_gpu_noheader,
    text_or_none,
    to_float,
    to_int,
    yes_no,
)

FIX = Path(__file__).resolve().parents[1] / "fixtures"
HINT = ("\n  what to do: check that the file is the unedited output of the command; "
        "report the line if it is")


def refusal(parse: Callable[..., object], text: str, source: str | None = "q.csv") -> ParseError:
    with pytest.raises(ParseError) as exc:
        parse(text, source)
    assert exc.value.source == source
    assert str(exc.value) == exc.value.what + HINT
    return exc.value


def raises(conv: Callable[[str], object], raw: str) -> str:
    with pytest.raises(ValueError) as exc:
        conv(raw)
    return str(exc.value)


# ------------------------------------------------------------------ readers

@pytest.mark.parametrize("raw", [
    "N/A", "[N/A]", " [ n/a ] ", "[Not Supported]", "[Unknown Error]",
    "[Insufficient Permissions]", "", "  ", "[]",
    "[Requested functionality has been deprecated]", "Not Available", "[No Permission]",
])
def test_every_spelling_of_no_value(raw: str) -> None:
    assert is_na(raw) is True
    assert text_or_none(raw) is None
    assert (number(raw, "W"), integer(raw, "MiB"), yes_no(raw), REASONS(raw)) == (
        None, None, None, None)


@pytest.mark.parametrize("raw", ["0", "NA", "None", "[GPU is lost]", "Not Active", "N/A N/A",
                                 "X", "XN/AX"])
def test_values_that_are_not_no_value(raw: str) -> None:
    assert is_na(raw) is False
    assert text_or_none(f" {raw} ") == raw


def test_numbers_with_and_without_their_unit() -> None:
    assert (number("700.00 W", "W"), number("700.00", "W"), number(" -12.5W ", "W")) == (
        700.0, 700.0, -12.5)
    assert number("5 MB/s", "MB/s") == 5.0 and number("87 %", "%") == 87.0
    assert (MIB("81920 MiB"), MHZ("1980 MHz"), LANES("16x"), PERCENT("0 %"), INT("8")) == (
        81920, 1980, 16, 0, 8)
    assert WATTS("80.61 W") == 80.61
    assert raises(WATTS, "700 mW") == "expected a number in W, got '700 mW'"
    assert raises(INT, " 8 GPUs ") == "expected a number, got '8 GPUs'"
    assert raises(INT, "eight") == "expected a number, got 'eight'"
    assert raises(MIB, "8.5 MiB") == "expected a whole number, got '8.5 MiB'"
    assert raises(INT, "1e3") == "expected a number, got '1e3'"


def test_readers_made_for_a_unit() -> None:
    mib, watts, bare = to_int("MiB"), to_float("W"), to_int()
    assert (mib("81920 MiB"), mib("[N/A]"), watts("80.61 W"), watts("7"), bare("8")) == (
        81920, None, 80.61, 7.0, 8)
    assert raises(mib, "80 GiB") == "expected a number in MiB, got '80 GiB'"
    assert raises(watts, "7 mW") == "expected a number in W, got '7 mW'"
    assert raises(bare, "8 MiB") == "expected a number, got '8 MiB'"


@pytest.mark.parametrize(("raw", "value"), [
    ("Enabled", True), (" yes ", True), ("On", True), ("Active", True),
    ("Disabled", False), ("No", False), ("OFF", False), ("Not Active", False),
])
def test_yes_no_words(raw: str, value: bool) -> None:
    assert FLAG(raw) is value


def test_a_flag_that_is_no_word_it_knows() -> None:
    assert raises(FLAG, " Pending ") == "expected Enabled/Disabled or Yes/No, got 'Pending'"


def test_every_clock_event_reason_bit() -> None:
    r = ClockEventReasons.from_mask(0x1FF)
    assert r.active == ["GpuIdle", "ApplicationsClocksSetting", "SwPowerCap", "HwSlowdown",
                        "SyncBoost", "SwThermalSlowdown", "HwThermalSlowdown",
                        "HwPowerBrakeSlowdown", "DisplayClockSetting"]
    assert r.slowdown == ["SwPowerCap", "HwSlowdown", "SwThermalSlowdown", "HwThermalSlowdown",
                          "HwPowerBrakeSlowdown"]
    for bit, name in [(0x1, "GpuIdle"), (0x2, "ApplicationsClocksSetting"),
                      (0x4, "SwPowerCap"), (0x8, "HwSlowdown"), (0x10, "SyncBoost"),
                      (0x20, "SwThermalSlowdown"), (0x40, "HwThermalSlowdown"),
                      (0x80, "HwPowerBrakeSlowdown"), (0x100, "DisplayClockSetting")]:
        assert ClockEventReasons.from_mask(bit).active == [name]
    unknown = ClockEventReasons.from_mask(0x200 | 0x4 | (1 << 63))
    assert unknown == ClockEventReasons(mask=0x200 | 0x4 | (1 << 63),
                                        active=["SwPowerCap", "0x200", "0x8000000000000000"])
    assert ClockEventReasons.from_mask(0).active == []


def test_the_reasons_bitmask_as_printed() -> None:
    assert REASONS(" 0x00000000000001FF ") == ClockEventReasons.from_mask(0x1FF)
    assert REASONS("0x0000000000000000") == ClockEventReasons(mask=0, active=[])
    assert raises(REASONS, " 4 ") == "expected a hex bitmask, got '4'"
    assert raises(REASONS, "0x") == "expected a hex bitmask, got '0x'"


@pytest.mark.parametrize(("state", "status", "summary", "problem", "known"), [
    ("COMPLETED", "SUCCESS", "HEALTHY", None, True),
    ("completed", "success", "not supported", None, True),
    ("In Progress", "Failure", None, "State In Progress, Status Failure", True),
    ("In Progress", None, "Unhealthy", "State In Progress", True),
    (None, "Failure", None, "Status Failure", True),
    (None, None, "Degraded Bandwidth", "Health Summary Degraded Bandwidth", False),
    (None, None, None, None, False),
    ("Completed", None, None, None, True),
])
def test_fabric_verdicts(state: str | None, status: str | None, summary: str | None,
                         problem: str | None, known: bool) -> None:
    f = FabricState(state=state, status=status, health_summary=summary)
    assert (f.problem, f.known) == (problem, known)


# ------------------------------------------------------------------ --query-gpu

# Every primary column name, each with a value only its own field's reader accepts.
PRIMARY = [
    ("index", "3", "index", 3), ("name", "NVIDIA H200", "name", "NVIDIA H200"),
    ("uuid", "GPU-aa", "uuid", "GPU-aa"), ("serial", "165", "serial", "165"),
    ("pci.bus_id", "00000000:00:06.0", "pci_bus_id", "00000000:00:06.0"),
    ("memory.total [MiB]", "143771 MiB", "memory_total_mib", 143771),
    ("memory.used [MiB]", "11 MiB", "memory_used_mib", 11),
    ("memory.reserved [MiB]", "616 MiB", "memory_reserved_mib", 616),
    ("power.limit [W]", "690.00 W", "power_limit_w", 690.0),
    ("power.max_limit [W]", "700.00 W", "power_max_limit_w", 700.0),
    ("power.default_limit [W]", "695.00 W", "power_default_limit_w", 695.0),
    ("power.min_limit [W]", "200.00 W", "power_min_limit_w", 200.0),
    ("enforced.power.limit [W]", "680.00 W", "enforced_power_limit_w", 680.0),
    ("power.draw [W]", "80.61 W", "power_draw_w", 80.61),
    ("driver_version", "580.159.04", "driver_version", "580.159.04"),
    ("vbios_version", "96.00.A5.00.1A", "vbios_version", "96.00.A5.00.1A"),
    ("pcie.link.gen.current", "1", "pcie_gen_current", 1),
    ("pcie.link.gen.max", "2", "pcie_gen_max", 2),
    ("pcie.link.gen.gpumax", "4", "pcie_gen_device_max", 4),
    ("pcie.link.gen.hostmax", "5", "pcie_gen_host_max", 5),
    ("pcie.link.width.current", "8", "pcie_width_current", 8),
    ("pcie.link.width.max", "16", "pcie_width_max", 16),
    ("temperature.gpu", "34", "temperature_gpu_c", 34),
    ("temperature.memory", "39", "temperature_memory_c", 39),
    ("clocks.sm [MHz]", "345 MHz", "clocks_sm_mhz", 345),
    ("clocks.max.sm [MHz]", "1980 MHz", "clocks_max_sm_mhz", 1980),
    ("clocks.mem [MHz]", "3201 MHz", "clocks_mem_mhz", 3201),
    ("clocks_event_reasons.active", "0x0000000000000005", "clocks_event_reasons",
     {"mask": 5, "active": ["GpuIdle", "SwPowerCap"]}),
    ("ecc.mode.current", "Enabled", "ecc_enabled", True),
    ("ecc.errors.uncorrected.volatile.total", "21", "ecc_uncorrected_volatile", 21),
    ("ecc.errors.uncorrected.aggregate.total", "22", "ecc_uncorrected_aggregate", 22),
    ("ecc.errors.corrected.volatile.total", "23", "ecc_corrected_volatile", 23),
    ("ecc.errors.corrected.aggregate.total", "24", "ecc_corrected_aggregate", 24),
    ("retired_pages.pending", "Yes", "retired_pages_pending", True),
    ("remapped_rows.correctable", "25", "remapped_rows_correctable", 25),
    ("remapped_rows.uncorrectable", "26", "remapped_rows_uncorrectable", 26),
    ("remapped_rows.pending", "No", "remapped_rows_pending", False),
    ("remapped_rows.failure", "Yes", "remapped_rows_failure", True),
    ("mig.mode.current", "Disabled", "mig_enabled", False),
    ("mig.mode.pending", "Enabled", "mig_pending_enabled", True),
    ("compute_mode", "Exclusive_Process", "compute_mode", "Exclusive_Process"),
    ("persistence_mode", "Disabled", "persistence_mode", False),
    ("utilization.gpu [%]", "97 %", "utilization_gpu_pct", 97),
]
# The other spellings nvidia-smi and older drivers print for the same fields.
ALIASES = [
    ("gpu_name", "NVIDIA A100", "name", "NVIDIA A100"), ("gpu_uuid", "GPU-bb", "uuid", "GPU-bb"),
    ("gpu_serial", "166", "serial", "166"),
    ("gpu_bus_id", "00000000:07:00.0", "pci_bus_id", "00000000:07:00.0"),
    ("power.draw.average [W]", "61.27 W", "power_draw_w", 61.27),
    ("pcie.link.gen.gpucurrent", "3", "pcie_gen_current", 3),
    ("clocks.current.sm [MHz]", "1410 MHz", "clocks_sm_mhz", 1410),
    ("clocks.current.memory [MHz]", "1215 MHz", "clocks_mem_mhz", 1215),
    ("clocks_throttle_reasons.active", "0x0000000000000008", "clocks_event_reasons",
     {"mask": 8, "active": ["HwSlowdown"]}),
]


@pytest.mark.parametrize("columns", [PRIMARY, ALIASES], ids=["primary", "aliases"])
def test_every_column_name_reads_into_its_field(columns: list[tuple[str, str, str, object]]
                                                ) -> None:
    text = (", ".join(c[0] for c in columns) + "\n" + ", ".join(c[1] for c in columns) + "\n")
    facts = parse_query_gpu(text)
    assert facts.fields == [c[0].split(" [")[0] for c in columns]
    assert facts.header_assumed is None and facts.count == 1
    expected = {**QueryGpu().model_dump(), **{c[2]: c[3] for c in columns}}
    assert facts.gpus[0].model_dump() == expected


def test_the_real_h200_rows_whole() -> None:
    facts = parse_query_gpu((FIX / "h200x2" / "commands" / "query-gpu.csv").read_text())
    g0 = {k: v for k, v in facts.gpus[0].model_dump().items() if v is not None}
    assert g0 == {
        "index": 0, "name": "NVIDIA H200", "uuid": "GPU-00000000-1111-2222-3333-000000000000",
        "serial": "1650000000000", "pci_bus_id": "00000000:00:06.0", "memory_total_mib": 143771,
        "memory_used_mib": 0, "power_limit_w": 700.0, "power_max_limit_w": 700.0,
        "enforced_power_limit_w": 700.0, "power_draw_w": 80.61, "driver_version": "580.159.04",
        "vbios_version": "96.00.A5.00.1A", "pcie_gen_current": 5, "pcie_gen_max": 5,
        "pcie_width_current": 16, "pcie_width_max": 16, "temperature_gpu_c": 34,
        "temperature_memory_c": 39, "clocks_sm_mhz": 345, "clocks_max_sm_mhz": 1980,
        "clocks_mem_mhz": 3201, "clocks_event_reasons": {"mask": 1, "active": ["GpuIdle"]},
        "ecc_enabled": True, "ecc_uncorrected_volatile": 0, "ecc_corrected_volatile": 0,
        "mig_enabled": False, "compute_mode": "Default", "persistence_mode": True,
        "utilization_gpu_pct": 0, "other": {}, "errors": []}


def test_an_alias_fills_a_field_only_while_it_is_unknown() -> None:
    text = ("power.draw [W], power.draw.average [W], name, gpu_name\n"
            "[N/A], 50.00 W, NVIDIA H200, NVIDIA H100\n")
    (g,) = parse_query_gpu(text).gpus
    assert (g.power_draw_w, g.name) == (50.0, "NVIDIA H200")
    assert g.other == {"gpu_name": "NVIDIA H100"}
    (g,) = parse_query_gpu("power.draw.average, power.draw\n60 W, [N/A]\n").gpus
    assert (g.power_draw_w, g.other) == (60.0, {"power.draw": None})


@pytest.mark.parametrize("cell", ["[GPU requires reset]", "[GPU is lost]", "Unknown Error",
                                  " [ gpu is lost ] "])
def test_a_gpu_error_in_a_cell_is_kept_by_its_column(cell: str) -> None:
    (g,) = parse_query_gpu(f"index, memory.total [MiB], fan.speed [%]\n0, {cell}, {cell}\n").gpus
    assert g.memory_total_mib is None and g.index == 0
    assert g.errors == [f"memory.total: {cell.strip()}"]
    assert g.other == {"fan.speed": text_or_none(cell)}


def test_query_gpu_refusals_word_for_word() -> None:
    err = refusal(parse_query_gpu, "\n \n")
    assert (err.kind, err.line_no, err.line) == ("nvidia-smi-query-gpu", None, None)
    assert err.what == "cannot parse nvidia-smi-query-gpu output at q.csv: empty output"
    for hdr, col in [("index, 0", "0"), ("name, -1.5", "-1.5"),
                     ("GPU-00000000-1111, name", "GPU-00000000-1111"),
                     ("index, memory total", "memory total"), ("index,", "")]:
        err = refusal(parse_query_gpu, f"\n{hdr}\n")
        assert (err.line_no, err.line) == (2, hdr)
        assert err.what == (f"cannot parse nvidia-smi-query-gpu output at q.csv:2: header column "
                            f"{col!r} is not a field name (the query must use --format=csv with "
                            f"its header)\n  line: {hdr!r}")
    err = refusal(parse_query_gpu, "index, Index [MiB]\n0, 1\n", source=None)
    assert (err.line_no, err.line) == (1, "index, Index [MiB]")
    assert err.what == ("cannot parse nvidia-smi-query-gpu output at <text>:1: a field appears "
                        "twice in the header\n  line: 'index, Index [MiB]'")
    err = refusal(parse_query_gpu, "index, name\n0, a\n1, b, c\n")
    assert (err.line_no, err.line) == (3, "1, b, c")
    assert err.what == ("cannot parse nvidia-smi-query-gpu output at q.csv:3: 3 columns, header "
                        "has 2\n  line: '1, b, c'")
    err = refusal(parse_query_gpu, "index, memory.total [MiB]\n0, 80 GiB\n")
    assert (err.line_no, err.line) == (2, "0, 80 GiB")
    assert err.what == ("cannot parse nvidia-smi-query-gpu output at q.csv:2: memory.total: "
                        "expected a number in MiB, got '80 GiB'\n  line: '0, 80 GiB'")


def test_header_names_in_any_case_and_with_units() -> None:
    facts = parse_query_gpu("Index,GPU_Name ,  Fabric.CliqueId\n1,A,0\n")
    assert facts.fields == ["Index", "GPU_Name", "Fabric.CliqueId"]
    (g,) = facts.gpus
    assert (g.index, g.name, g.other) == (1, "A", {"Fabric.CliqueId": "0"})


# ------------------------------------------------------------------ noheader

def test_the_recipe_s_noheader_rows_with_and_without_units() -> None:
    text = ("0, NVIDIA H200, GPU-724d78fc-1a5e, 143771 MiB, 700.00 W, 580.159.04\n"
            "\n"
            "1, NVIDIA H200, GPU-724d78fc-1a5f, 143771, [N/A], 580.159\n")
    facts = parse_query_gpu_noheader(text, "n.csv")
    assert facts.fields == ["index", "name", "uuid", "memory.total", "power.limit",
                            "driver_version"]
    assert facts.header_assumed == "index,name,uuid,memory.total,power.limit,driver_version"
    assert [(g.index, g.name, g.uuid, g.memory_total_mib, g.power_limit_w, g.driver_version,
             g.other, g.errors) for g in facts.gpus] == [
        (0, "NVIDIA H200", "GPU-724d78fc-1a5e", 143771, 700.0, "580.159.04", {}, []),
        (1, "NVIDIA H200", "GPU-724d78fc-1a5f", 143771, None, "580.159", {}, [])]


@pytest.mark.parametrize(("line", "fits"), [
    ("0, NVIDIA H200, GPU-1, 143771, 700, 580.159.04", True),
    ("0, H200, GPU-1, 1 MiB, 7.5 W, 1.2", True),
    ("0, GPU-1, GPU-1, 143771, 700, 580.159.04", False),  # a UUID where the name is
    ("0, 12345, GPU-1, 143771, 700, 580.159.04", False),  # a name has a letter
    ("0, NVIDIA H200, GPU-1, 143771, 700, 580", False),  # a driver has a dot
    ("0, NVIDIA H200, GPU-1, 143771, 700, 580.159.04, 5", False),
    ("x, NVIDIA H200, GPU-1, 143771, 700, 580.159.04", False),
    ("0, NVIDIA H200, GPU-1, 143771 GiB, 700, 580.159.04", False),
    ("0, NVIDIA H200, GPU-1, 143771, N/A, 580.159.04", False),
])
def test_what_a_headerless_row_must_look_like(line: str, fits: bool) -> None:
    assert noheader_fits(line) is fits


def test_noheader_refusals_word_for_word() -> None:
    err = refusal(parse_query_gpu_noheader, "\n")
    assert (err.kind, err.line_no) == ("nvidia-smi-query-gpu-noheader", None)
    assert err.what == "cannot parse nvidia-smi-query-gpu-noheader output at q.csv: empty output"
    line = "0, NVIDIA H200, GPU-1, 143771"
    err = refusal(parse_query_gpu_noheader,
                  f"0, NVIDIA H200, GPU-2, 143771, 700, 580.159.04\n\n{line}\n")
    assert (err.line_no, err.line) == (3, line)
    assert err.what == (
        "cannot parse nvidia-smi-query-gpu-noheader output at q.csv:3: a CSV without its header "
        "is read only with the acceptance recipe's fields (index,name,uuid,memory.total,"
        "power.limit,driver_version), each value of its field's shape; save other queries with "
        f"--format=csv (with the header)\n  line: {line!r}")


# ------------------------------------------------------------------ -L

def test_l_with_mig_devices_whole() -> None:
    facts = parse_nvidia_smi_l((FIX / "synthetic" / "nvidia-smi-L_a100-sxm4-40gb-mig_r450.txt")
                               .read_text())
    assert facts.gpus == [GpuL(
        index=0, name="A100-SXM4-40GB", uuid="GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77",
        mig_devices=[
            MigDeviceL(profile="3g.20gb", index=0,
                       uuid="MIG-GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77/1/0"),
            MigDeviceL(profile="3g.20gb", index=1,
                       uuid="MIG-GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77/2/0")])]
    assert (facts.count, facts.mig_device_count) == (1, 2)


def test_l_lines_with_trailing_blanks_and_blank_lines() -> None:
    facts = parse_nvidia_smi_l("\nGPU 7: NVIDIA H200 (UUID: GPU-aB-01)  \n"
                               "  MIG 1g.18gb     Device  3: (UUID: MIG-x1) \n\n")
    assert facts.gpus == [GpuL(index=7, name="NVIDIA H200", uuid="GPU-aB-01", mig_devices=[
        MigDeviceL(profile="1g.18gb", index=3, uuid="MIG-x1")])]
    assert parse_nvidia_smi_l("  No devices were found  \n").gpus == []


def test_l_refusals_word_for_word() -> None:
    err = refusal(parse_nvidia_smi_l, " \n\n")
    assert (err.kind, err.line_no, err.line) == ("nvidia-smi-L", None, None)
    assert err.what == "cannot parse nvidia-smi-L output at q.csv: empty output"
    mig = "  MIG 1g.18gb     Device  0: (UUID: MIG-x1)"
    for text, no, line in [
            (f"\n{mig}\n", 2, mig),  # a MIG device before any GPU
            ("GPU 0: H200 (UUID: GPU-1)\nNo devices were found\n", 2, "No devices were found"),
            ("GPU 0: H200 (UUID: GPU-1)\n" + mig.strip() + "\n", 2, mig.strip()),
            ("  GPU 0: H200 (UUID: GPU-1)\n", 1, "  GPU 0: H200 (UUID: GPU-1)")]:
        err = refusal(parse_nvidia_smi_l, text)
        assert (err.line_no, err.line) == (no, line)
        assert err.what == (f"cannot parse nvidia-smi-L output at q.csv:{no}: not a GPU or MIG "
                            f"device line\n  line: {line!r}")
