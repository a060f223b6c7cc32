"""nvidia-smi dmon: every -s selection and -o form seen on the H200 host and in other fleets."""

from __future__ import annotations

import pytest

from orchestrator.errors import ParseError
from orchestrator.parsers import get, parse
from orchestrator.parsers.dmon import DmonFacts, parse_dmon


def test_registered() -> None:
    assert get("dmon").func is parse_dmon


def test_real_h200_pucvmet(real) -> None:
    facts = parse("dmon", real("dmon.txt"))
    assert isinstance(facts, DmonFacts)
    assert [c.name for c in facts.columns][:4] == ["pwr", "gtemp", "mtemp", "sm"]
    assert len(facts.columns) == 21 and facts.headers == 1
    units = {c.name: c.unit for c in facts.columns}
    assert (units["pwr"], units["tviol"], units["rxpci"], units["sbecc"]) == (
        "W", "bool", "MB/s", "errs")
    assert facts.gpus == [0, 1] and len(facts.samples) == 8
    s = facts.samples[1]
    assert (s.line_no, s.gpu, s.timestamp) == (4, 1, None)
    assert (s.values["pwr"], s.values["pci"], s.values["mclk"]) == (80, 2, 3201)
    assert facts.series(0, "txpci") == [0, 1, 1, 1]


def test_dashes_are_unknown_not_zero(public) -> None:
    facts = parse_dmon(public("dmon_h200-mig-load_r590.txt"))
    assert facts.series(0, "sm") == [None] * 5  # MIG mode: no whole-GPU utilisation
    assert facts.series(0, "pwr") == [295, 295, 295, 295, 294]
    l40s = parse_dmon(public("dmon_l40s-load_r595.txt"))
    assert l40s.series(0, "mtemp") == [None] * 5 and l40s.series(0, "enc")[0] == 67


def test_date_time_columns_and_blank_lines(public) -> None:
    facts = parse_dmon(public("dmon_s-mutc_o-TD.txt"))
    assert [c.name for c in facts.columns] == ["fb", "bar1", "ccpm", "sm", "mem", "enc", "dec",
                                               "jpg", "ofa", "rxpci", "txpci", "mclk", "pclk"]
    assert len(facts.samples) == 6
    s = facts.samples[1]
    assert (s.date, s.time, s.timestamp, s.line_no) == ("20240104", "13:54:36",
                                                        "20240104 13:54:36", 5)
    assert s.values["rxpci"] == 217 and s.values["txpci"] == 677


def test_memory_only_eight_gpus(public) -> None:
    facts = parse_dmon(public("dmon_s-m_8gpu.txt"))
    assert facts.gpus == list(range(8)) and len(facts.samples) == 16
    assert {c.unit for c in facts.columns} == {"MB"}


def test_repeated_header_and_time_only(real) -> None:
    head = real("dmon.txt").splitlines()[:2]
    rows = real("dmon.txt").splitlines()[2:]
    text = "\n".join(["#Time " + head[0][1:], "#HH:MM:SS" + head[1][1:]]
                     + [f"12:00:0{k} " + r for k, r in enumerate(rows[:2])]
                     + ["#Time " + head[0][1:], "#HH:MM:SS" + head[1][1:]]
                     + [f"12:00:0{k + 2} " + r for k, r in enumerate(rows[2:4])]) + "\n"
    facts = parse_dmon(text)
    assert facts.headers == 2 and len(facts.samples) == 4
    assert [s.time for s in facts.samples] == ["12:00:00", "12:00:01", "12:00:02", "12:00:03"]


def test_nvidia_smi_messages_are_kept() -> None:
    facts = parse_dmon("Not supported on the device(s)\nFailed to process command line\n")
    assert facts.samples == [] and facts.messages == [
        "Not supported on the device(s)", "Failed to process command line"]


@pytest.mark.parametrize("mutate,line_no", [
    (lambda t: t.replace("    0     80     34", "    0     80     hot", 1), 3),
    (lambda t: t.replace("   3201    345      0      0      0      1", "   3201", 1), 3),
    (lambda t: "    0    80\n" + t, 1),
])
def test_malformed_rows_name_their_line(real, mutate, line_no: int) -> None:
    with pytest.raises(ParseError) as exc:
        parse_dmon(mutate(real("dmon.txt")))
    assert exc.value.line_no == line_no


def test_empty_and_headerless() -> None:
    with pytest.raises(ParseError):
        parse_dmon("")
    with pytest.raises(ParseError):
        parse_dmon("# pwr temp\n")


def test_n_a_is_unknown_not_an_error_nor_zero() -> None:
    """Some drivers print `N/A` where others print `-`: both are "not available"."""
    text = ("# gpu    pwr  gtemp     sm    mem   pclk\n"
            "# Idx      W      C      %      %    MHz\n"
            "    0    N/A     35    N/A      0   1980\n"
            "    1     81    n/a      7      -   1980\n")
    facts = parse_dmon(text)
    assert facts.series(0, "pwr") == [None] and facts.series(0, "sm") == [None]
    assert facts.series(1, "gtemp") == [None] and facts.series(1, "mem") == [None]
    assert facts.series(0, "gtemp") == [35] and facts.series(1, "pwr") == [81]
    with pytest.raises(ParseError, match=r"pwr: 'NA' is not a number or `-`"):
        parse_dmon(text.replace("N/A     35", "NA      35"))


def _error(exc: pytest.ExceptionInfo[ParseError]) -> tuple[object, ...]:
    e = exc.value
    return e.kind, e.what, e.line_no, e.line, e.source


def _where(line_no: int | None, what: str, line: str | None = None) -> str:
    at = "raw/dmon.txt" + ("" if line_no is None else f":{line_no}")
    return f"cannot parse dmon output at {at}: {what}" + (
        "" if line is None else f"\n  line: {line.rstrip()!r}")


def test_every_error_names_the_kind_the_file_and_the_line_as_printed(real) -> None:
    """dmon pads its lines with a trailing space: the error keeps the line as printed."""
    lines = real("dmon.txt").splitlines()
    head, units, row = lines[0], lines[1], lines[2]
    assert row.endswith(" ")
    cases = [
        # a header line that names no gpu column
        ("\n".join([head.replace(" gpu ", " idx "), units, row]), 1,
         "header line without a `gpu` column", head.replace(" gpu ", " idx ")),
        # a sample before any header
        ("\n".join([row, head, units]), 1, "sample before any `# gpu ...` header line", row),
        # a row one value short
        ("\n".join([head, units, row.replace("    0 ", "", 1)]), 3,
         "21 values, the header names 22 columns", row.replace("    0 ", "", 1)),
        # a gpu index that is not a number
        ("\n".join([head, units, row.replace("    0 ", "    A ", 1)]), 3,
         "gpu index 'A' is not a number", row.replace("    0 ", "    A ", 1)),
        # a value redacted in a paste, at the end of the line
        ("\n".join([head, units, row[:-len("0 ")] + "XXX"]), 3,
         "txpci: 'XXX' is not a number or `-`", row[:-len("0 ")] + "XXX"),
    ]
    for text, line_no, what, line in cases:
        with pytest.raises(ParseError) as exc:
            parse_dmon(text + "\n", source="raw/dmon.txt")
        assert _error(exc) == ("dmon", _where(line_no, what, line), line_no, line,
                               "raw/dmon.txt"), what


def test_no_header_at_all_names_the_file() -> None:
    with pytest.raises(ParseError) as exc:
        parse_dmon("\n\n", source="raw/dmon.txt")
    assert _error(exc) == ("dmon", _where(None, "no `# gpu ...` header line"), None, None,
                           "raw/dmon.txt")


def test_a_value_with_a_decimal_point_is_a_float() -> None:
    facts = parse_dmon("# gpu    pwr  gtemp\n# Idx      W      C\n    0  80.25     34\n"
                       "    1    81.     -\n")
    assert facts.series(0, "pwr") == [80.25] and facts.series(0, "gtemp") == [34]
    assert facts.series(1, "pwr") == [81.0] and facts.series(1, "gtemp") == [None]
    assert isinstance(facts.series(0, "gtemp")[0], int)


def test_a_header_printed_twice_without_samples_between_is_two_headers(real) -> None:
    """A capture that printed its header and was restarted before its first sample."""
    lines = real("dmon.txt").splitlines()
    text = "\n".join(lines[:2] + lines[:2] + lines[2:4]) + "\n"
    facts = parse_dmon(text)
    assert facts.headers == 2 and len(facts.samples) == 2
    assert [(c.name, c.unit) for c in facts.columns][:3] == [("pwr", "W"), ("gtemp", "C"),
                                                             ("mtemp", "C")]
    assert facts.samples[0].values["pwr"] == 80 and facts.samples[0].line_no == 5
