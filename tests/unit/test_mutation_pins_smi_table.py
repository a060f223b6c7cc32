"""The default `nvidia-smi` table: records whole, and every refusal word for word.

Pins `orchestrator/parsers/nvidia_smi_table.py` on exact values: the H200 capture
and published tables read whole, each cell's reader, and each shape a row can fail
(kind, message, line, source), made by editing one line of a real table.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import ParseError
from orchestrator.parsers.nvidia_smi_table import (
    TableGpu,
    TableMigDevice,
    TableProcess,
    _cells,
    parse_nvidia_smi_table,
)

FIX = Path(__file__).resolve().parents[1] / "fixtures"
H200 = (FIX / "h200x2" / "commands" / "nvidia-smi.txt").read_text()
H100_MIG = (FIX / "public" / "nvidia-smi_h100-mig-load_r590.txt").read_text()
V100 = (FIX / "public" / "nvidia-smi_4x-v100-pcie_r410.txt").read_text()
HINT = ("\n  what to do: check that the file is the unedited output of the command; "
        "report the line if it is")


def lines_of(text: str, changes: dict[int, str | None]) -> str:
    """Line N (1-based) replaced, or dropped where the change is None."""
    lines = text.split("\n")
    for no in sorted(changes, reverse=True):
        new = changes[no]
        if new is None:
            del lines[no - 1]
        else:
            lines[no - 1] = new
    return "\n".join(lines)


def refusal(text: str, source: str | None = "t.txt") -> ParseError:
    with pytest.raises(ParseError) as exc:
        parse_nvidia_smi_table(text, source)
    assert exc.value.kind == "nvidia-smi-table" and exc.value.source == source
    assert str(exc.value) == exc.value.what + HINT
    return exc.value


def says(err: ParseError, no: int | None, line: str | None, what: str) -> None:
    assert (err.line_no, err.line) == (no, line)
    at = f"t.txt:{no}" if no is not None else "t.txt"
    assert err.what == (f"cannot parse nvidia-smi-table output at {at}: {what}"
                        + (f"\n  line: {line.rstrip()[:200]!r}" if line is not None else ""))


def test_the_h200_table_whole() -> None:
    facts = parse_nvidia_smi_table(H200)
    assert facts.model_dump() == {
        "timestamp": "Mon Nov 30 04:53:05 2026", "smi_version": "580.159.04",
        "driver_version": "580.159.04", "cuda_version": "13.0", "layout": "3-row",
        "gpus": [TableGpu(
            index=i, name="NVIDIA H200", name_truncated=False, persistence_mode=True,
            bus_id=f"00000000:00:0{6 + i}.0", display_active="Off", ecc_uncorrected=0,
            ecc_cell=None, fan_pct=None, temperature_c=34 - i, performance_state="P0",
            power_draw_w=80.0, power_cap_w=700.0, memory_used_mib=0, memory_total_mib=143771,
            utilization_pct=0, compute_mode="Default", mig_mode="Disabled", errors=[],
            line_no=9 + 4 * i).model_dump() for i in (0, 1)],
        "mig_devices": [], "processes": [], "missing": [], "ignored_lines": [], "edits": [],
        "warnings": [], "exit_status": None}


def test_an_h100_with_mig_devices_and_processes_whole() -> None:
    facts = parse_nvidia_smi_table(H100_MIG)
    assert facts.gpus == [TableGpu(
        index=0, name="NVIDIA H100 80GB HBM3", name_truncated=False, persistence_mode=True,
        bus_id="00000000:00:09.0", display_active="Off", ecc_uncorrected=None, ecc_cell="On",
        fan_pct=None, temperature_c=52, performance_state="P0", power_draw_w=432.0,
        power_cap_w=700.0, memory_used_mib=11125, memory_total_mib=81559, utilization_pct=None,
        compute_mode="Default", mig_mode="Enabled", errors=[], line_no=9)]
    assert facts.mig_devices == [
        TableMigDevice(gpu=0, gpu_instance_id=gi, compute_instance_id=0, mig_device=dev,
                       memory_used_mib=used, memory_total_mib=total, bar1_used_mib=0,
                       bar1_total_mib=bar1, sm_count=sm, ecc_uncorrected=0,
                       engines={"CE": e, "ENC": 0, "DEC": e, "OFA": 0, "JPG": e}, line_no=no)
        for gi, dev, used, total, bar1, sm, e, no in [
            (2, 0, 11091, 40448, 24739, 60, 3, 21), (3, 1, 17, 20096, 12369, 32, 2, 24),
            (9, 2, 9, 9984, 6184, 16, 1, 27), (10, 3, 9, 9984, 6184, 16, 1, 30)]]
    assert facts.processes == [
        TableProcess(gpu=0, gpu_instance_id=2, compute_instance_id=0, pid=pid, type="C",
                     name=name, memory_mib=mem, line_no=no)
        for pid, name, mem, no in [(21180, "/root/tools/memhog", 2296, 39),
                                   (21181, "/root/tools/memhog", 1272, 40),
                                   (21198, "./gpu_burn", 7484, 41)]]
    assert (facts.layout, facts.mig_device_count, facts.missing) == ("3-row", 4, [])


def test_the_two_row_layout_whole() -> None:
    facts = parse_nvidia_smi_table(V100)
    assert (facts.timestamp, facts.smi_version, facts.driver_version, facts.cuda_version,
            facts.layout) == (None, "410.48", "410.48", None, "2-row")
    assert [(g.index, g.bus_id, g.persistence_mode, g.temperature_c, g.power_draw_w,
             g.power_cap_w, g.memory_used_mib, g.utilization_pct, g.mig_mode, g.line_no)
            for g in facts.gpus] == [
        (0, "00000000:18:00.0", False, 40, 55.0, 250.0, 31194, 44, None, 7),
        (1, "00000000:3B:00.0", False, 40, 36.0, 250.0, 30884, 0, None, 10),
        (2, "00000000:86:00.0", False, 41, 39.0, 250.0, 30884, 0, None, 13),
        (3, "00000000:AF:00.0", False, 39, 37.0, 250.0, 30884, 0, None, 16)]
    assert facts.processes == [TableProcess(gpu=0, gpu_instance_id=None, compute_instance_id=None,
                                            pid=305892, type="C", name="/usr/bin/python",
                                            memory_mib=31181, line_no=24)]


def test_cells_printed_as_err_na_or_blank() -> None:
    text = lines_of(H200, {
        9: "|   0  NVIDIA GeForce RTX ...         N/A |   00000000:00:06.0 N/A |                  N/A |",
        10: "|ERR!  ERR!    P8     ERR! / ERR! |     N/A                | 7%      E. Process |",
        11: "|                                         |                        |                      |",
    })
    g = parse_nvidia_smi_table(text).gpus[0]
    assert (g.name, g.name_truncated, g.persistence_mode, g.display_active) == (
        "NVIDIA GeForce RTX ...", True, None, None)
    assert (g.ecc_uncorrected, g.ecc_cell, g.memory_used_mib, g.memory_total_mib) == (
        None, None, None, None)
    assert g.errors == ["fan", "temp", "draw", "cap"]
    assert (g.fan_pct, g.temperature_c, g.power_draw_w, g.power_cap_w) == (None,) * 4
    assert (g.performance_state, g.utilization_pct, g.compute_mode, g.mig_mode) == (
        "P8", 7, "E. Process", None)


def test_process_rows_with_na_ids_and_memory() -> None:
    text = lines_of(H100_MIG, {
        39: "|    0  N/A  N/A            21180      C+G /usr/bin/app two words           N/A |"})
    p = parse_nvidia_smi_table(text).processes[0]  # type: ignore[index]
    assert p == TableProcess(gpu=0, gpu_instance_id=None, compute_instance_id=None, pid=21180,
                             type="C+G", name="/usr/bin/app two words", memory_mib=None,
                             line_no=39)


def test_a_mig_table_with_one_header_row_names_its_engines_by_position() -> None:
    text = lines_of(H100_MIG, {17: None, 18: None})
    facts = parse_nvidia_smi_table(text)
    assert facts.mig_devices[0].engines == {"engine0": 3, "engine1": 0, "engine2": 3,
                                            "engine3": 0, "engine4": 3}


def test_what_a_cut_or_partial_text_is_missing() -> None:
    cut = "\n".join(H200.split("\n")[:14]) + "\n"
    facts = parse_nvidia_smi_table(cut)
    assert [g.index for g in facts.gpus] == [0]
    assert facts.missing == ["the rest of the GPU block at line 13 (text cut off)",
                             "processes table"]
    cut2 = "\n".join(V100.split("\n")[:13]) + "\n"
    facts = parse_nvidia_smi_table(cut2)
    assert [g.index for g in facts.gpus] == [0, 1]
    assert facts.missing == ["the rest of the GPU block at line 13 (text cut off)",
                             "processes table"]
    header_only = "\n".join(H200.split("\n")[:8]) + "\n"
    facts = parse_nvidia_smi_table(header_only)
    assert facts.gpus == [] and facts.missing == ["processes table", "GPU rows"]
    procs_only = "\n".join(H200.split("\n")[17:]) + "\n"
    facts = parse_nvidia_smi_table(procs_only)
    assert (facts.driver_version, facts.layout, facts.processes) == (None, "3-row", [])
    assert facts.missing == ["the GPU table (the paste starts at the Processes table)"]


def test_gpu_rows_that_fit_no_shape_are_refused_by_line() -> None:
    row1 = "|   0  NVIDIA H200                    On  |   00000000:00:06.0 Off |                    0 |"
    row2 = "| N/A   34C    P0             80W /  700W |       0MiB / 143771MiB |      0%      Default |"
    for changes, no, what in [
            ({9: row1.replace("   0  ", "   x  ")}, 9,
             "first GPU cell is not `index  name  persistence`"),
            ({9: row1.replace("00000000:00:06.0 Off", "00000000:00:06.0    ")}, 9,
             "second GPU cell is not `bus-id  display`"),
            ({9: "|   0  NVIDIA H200                    On  |   00000000:00:06.0 Off |"}, 9,
             "GPU row does not have the three cells of the header"),
            ({10: "| N/A   34C    P0             80W /  700W |       0MiB / 143771MiB |"}, 9,
             "GPU row does not have the three cells of the header"),
            ({10: row2.replace("80W /", "80W  ")}, 10, "GPU cell is not `fan  temp  perf  usage / cap`"),
            ({10: row2.replace("0MiB / 1", "0MiB of 1")}, 10, "memory cell is not `used MiB / total MiB`"),
            ({10: row2.replace("0%      Default", "   0%         ")}, 10,
             "cell is not `GPU-util  compute mode`"),
            ({10: row2.replace(" 34C", "hotC")}, 10, "expected a number in C, got 'hotC'"),
            ({10: row2.replace("  0%", "0.5%")}, 10, "expected a whole number, got '0.5%'"),
            ({11: None}, 10, "GPU block lacks its MIG M. row"),
            ({11: "|                                         |             Disabled |"}, 10,
             "GPU block lacks its MIG M. row"),
            ({10: None, 11: None}, 9, "GPU block has one row; the header announces two or three"),
            ({12: "   some words"}, 12, "line inside a table is neither a row nor a rule"),
            ({6: "  Fan  Temp"}, 6, "table header row expected"),
    ]:
        text = lines_of(H200, changes)
        err = refusal(text)
        says(err, no, text.split("\n")[no - 1], what)


def test_a_two_row_block_with_a_third_row_is_refused() -> None:
    extra = "|                               |                      |          N/A |"
    text = lines_of(V100, {8: V100.split("\n")[7] + "\n" + extra})
    err = refusal(text)
    says(err, 9, extra, "GPU block has more rows than the header announces")


def test_tables_around_the_gpu_table_are_refused_by_line() -> None:
    err = refusal(H200 + "extra words\n")
    says(err, 25, "extra words", "expected the MIG devices or processes table")
    text = H200 + "\n+-----+\n| Clocks:        |\n|=====|\n"
    err = refusal(text)
    says(err, 27, "| Clocks:        |", "unknown table after the GPU table")
    err = refusal("\n".join(H200.split("\n")[:7]) + "\n")
    says(err, 8, "", "table header row expected")  # the empty line after the last newline
    err = refusal("\n".join(H200.split("\n")[:7]))
    says(err, 7, H200.split("\n")[6], "the text ends inside a table header")


def test_mig_and_process_rows_that_fit_no_shape_are_refused_by_line() -> None:
    row = "|  0    2   0   0  |           11091MiB / 40448MiB    | 60      0 |  3   0    3    0    3 |"
    for new, what in [
            ("|  0    2   0   0  |           11091MiB / 40448MiB    | 60      0 |",
             "MIG device row does not have four cells"),
            (row.replace("  0    2   0   0  ", "  0    2   0      "),
             "MIG device row does not start with `GPU GI CI MIG`"),
            (row.replace("  0    2   0   0  ", "  0    2   x   0  "),
             "MIG device row does not start with `GPU GI CI MIG`"),
            (row.replace("11091MiB / 40448MiB", "11091MiB of 40448MiB"),
             "MIG device row does not match its header"),
            (row.replace("| 60      0 |", "| 60  0   0 |"), "MIG device row does not match its header"),
            (row.replace("    0    3 |", "    0      |"), "MIG device row does not match its header"),
            (row.replace("| 60      0 |", "| 60    two |"), "expected a number, got 'two'"),
    ]:
        assert row in H100_MIG
        text = H100_MIG.replace(row, new)
        err = refusal(text)
        says(err, 21, new, what)
    proc = "|    0    2    0            21180      C   /root/tools/memhog                     2296MiB |"
    bad = "|    0            21180      C   /root/tools/memhog                     2296MiB |"
    err = refusal(H100_MIG.replace(proc, bad))
    says(err, 39, bad, "process row does not match the processes header")
    v100 = "|    0    305892      C   /usr/bin/python                            31181MiB |"
    bad = "|    0    1    2    305892      C   /usr/bin/python                  31181MiB |"
    err = refusal(V100.replace(v100, bad))
    says(err, 24, bad, "process row does not match the processes header")


def test_texts_that_are_no_table_are_refused_by_line() -> None:
    err = refusal("\n \n")
    says(err, None, None, "empty output")
    err = refusal("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n")
    says(err, 1, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
         "not an nvidia-smi table (no box above the NVIDIA-SMI banner)")
    err = refusal("Mon Nov 30 04:53:05 2026\n")
    says(err, 2, "", "not an nvidia-smi table (no box above the NVIDIA-SMI banner)")
    err = refusal("+------+\n| GPU stats |\n")
    says(err, 2, "| GPU stats |", "no `NVIDIA-SMI ... Driver Version:` banner")
    err = refusal("+------+")
    says(err, None, None, "no `NVIDIA-SMI ... Driver Version:` banner")


def test_several_banners_are_refused_naming_six_of_their_lines() -> None:
    err = refusal("\n".join([H200.rstrip("\n")] * 7) + "\n")
    says(err, 27, "| NVIDIA-SMI 580.159.04             Driver Version: 580.159.04     CUDA "
                  "Version: 13.0     |",
         "7 nvidia-smi banners (lines 3, 27, 51, 75, 99, 123): several outputs in one text, "
         "interleaved (mpirun or srun running nvidia-smi on several hosts) or appended; keep one "
         "host's output per file, or run it with `mpirun --tag-output` / `srun -l` so the lines "
         "say whose they are")


def test_a_banner_of_the_kmd_and_umd_versions() -> None:
    text = H200.replace("Driver Version: 580.159.04     CUDA Version: 13.0  ",
                        "KMD Version: 610.57.04     CUDA UMD Version: 13.3 ")
    facts = parse_nvidia_smi_table(text)
    assert (facts.smi_version, facts.driver_version, facts.cuda_version) == (
        "580.159.04", "610.57.04", "13.3")
    assert facts.timestamp == "Mon Nov 30 04:53:05 2026"
    facts = parse_nvidia_smi_table(H200.replace("Mon Nov 30 04:53:05 2026", "Mon Nov  3 04:53:05 2026"))
    assert facts.timestamp == "Mon Nov  3 04:53:05 2026"


def test_a_table_saved_with_crlf_line_ends_or_trailing_blanks_reads_the_same() -> None:
    plain = parse_nvidia_smi_table(H200).model_dump()
    assert parse_nvidia_smi_table(H200.replace("\n", "\r\n")).model_dump() == plain
    assert parse_nvidia_smi_table(H200.replace("|\n", "|   \n")).model_dump() == plain


def test_the_cells_of_a_row() -> None:
    assert _cells("| a | b |  ") == [" a ", " b "]
    assert _cells("||") == [""]
    assert (_cells("|"), _cells(" | a |"), _cells("| a"), _cells("a |")) == (None,) * 4


def test_bad_fan_draw_and_cap_cells_are_refused_by_line() -> None:
    row2 = "| N/A   34C    P0             80W /  700W |       0MiB / 143771MiB |      0%      Default |"
    for new, what in [(row2.replace("N/A ", "lots"), "expected a number in %, got 'lots'"),
                      (row2.replace(" 80W", "80kW"), "expected a number in W, got '80kW'"),
                      (row2.replace(" 700W", "700kW"), "expected a number in W, got '700kW'")]:
        err = refusal(lines_of(H200, {10: new}))
        says(err, 10, new, what)
    g = parse_nvidia_smi_table(lines_of(H200, {10: row2.replace("N/A ", "30% ")})).gpus[0]
    assert (g.fan_pct, g.temperature_c, g.errors) == (30, 34, [])


def test_bad_sm_and_engine_counts_of_a_mig_device_are_refused_by_line() -> None:
    row = "|  0    2   0   0  |           11091MiB / 40448MiB    | 60      0 |  3   0    3    0    3 |"
    for new, what in [(row.replace("| 60 ", "| 6x "), "expected a number, got '6x'"),
                      (row.replace("  3 |", " x3 |"), "expected a number, got 'x3'")]:
        err = refusal(H100_MIG.replace(row, new))
        says(err, 21, new, what)


def test_a_mig_header_of_two_rows_still_names_the_engines() -> None:
    facts = parse_nvidia_smi_table(lines_of(H100_MIG, {19: None}))
    assert facts.mig_devices[0].engines == {"CE": 3, "ENC": 0, "DEC": 3, "OFA": 0, "JPG": 3}


def test_a_first_gpu_row_that_is_no_row_is_refused() -> None:
    err = refusal(lines_of(H200, {9: "   0  NVIDIA H200"}))
    says(err, 9, "   0  NVIDIA H200", "line inside a table is neither a row nor a rule")


def test_a_crlf_table_refused_names_its_line_without_the_cr() -> None:
    text = lines_of(H200, {12: "   some words"}).replace("\n", "\r\n")
    err = refusal(text)
    says(err, 12, "   some words", "line inside a table is neither a row nor a rule")
