"""`dcgmi diag` tables as DCGM 3.0 to 3.3 print them, whole and cut short: sections,
results per GPU, messages wrapped mid-word."""

from __future__ import annotations

import pytest

from orchestrator.errors import ParseError
from orchestrator.parsers import get, parse
from orchestrator.parsers.dcgmi import DcgmiDiagFacts, parse_dcgmi_diag


def test_registered() -> None:
    assert get("dcgmi-diag").func is parse_dcgmi_diag


def test_level_3_on_3_0_4_cut_after_deployment(public) -> None:
    facts = parse("dcgmi-diag", public("dcgmi-diag-r3_3.0.4_skipped-cut_dcgm55.txt"))
    assert isinstance(facts, DcgmiDiagFacts)
    assert facts.header is True and facts.complete is False
    assert [t.name for t in facts.tests] == [
        "Denylist", "NVML Library", "CUDA Main Library", "Permissions and OS Blocks",
        "Persistence Mode", "Environment Variables", "Page Retirement/Row Remap",
        "Graphics Processes", "Inforom"]
    assert {t.section for t in facts.tests} == {"Deployment"}
    assert all(t.results[0].status == "Pass" and t.results[0].gpus is None for t in facts.tests)
    assert facts.failed == [] and facts.dcgm_version is None


def test_metadata_of_3_3(public) -> None:
    facts = parse_dcgmi_diag(public("dcgmi-diag-r2_3.3.1_t4-cut_godcgm52.txt"))
    assert (facts.dcgm_version, facts.driver_version, facts.device_ids) == (
        "3.3.1", "535.129.03", ["1eb8"])
    assert len(facts.tests) == 6 and facts.tests[-1].name == "Environment Variables"


def test_an_error_row_wrapped_over_two_lines(public) -> None:
    facts = parse_dcgmi_diag(public("dcgmi-diag_deployment-error_mle.txt"))
    assert facts.tests == []
    (err,) = facts.errors
    assert err.text == "GPU 3 has uncorrectable memory errors and row remappings are pending"
    assert err.line_no == 5


def test_one_gpu_failing_the_memory_test_with_a_thermal_warning(public) -> None:
    facts = parse_dcgmi_diag(public("dcgmi-diag-r2_gpu-memory-fail_mle.txt"))
    (t,) = facts.tests
    assert t.name == "GPU Memory" and t.failed
    assert [(r.status, r.gpus) for r in t.results] == [("Pass", [1, 2, 3, 4, 5, 6, 7]),
                                                       ("Fail", [0])]
    (w,) = t.messages
    assert w.kind == "Warning"
    assert w.text == ("GPU 0 Thermal violations totaling 13.3 seconds started at 9.7 seconds "
                      "into the test for GPU 0 Verify that the cooling on this machine is "
                      "functional, including external, thermal material interface, fans, and "
                      "any other components.")


def test_a_whole_level_1_table(synth) -> None:
    facts = parse_dcgmi_diag(synth("dcgmi-diag-r1_4gpu-complete_3.3.txt"))
    assert facts.complete is True
    assert facts.device_ids == ["20b2"] * 4
    assert [t.name for t in facts.failed] == ["Page Retirement/Row Remap"]
    (err,) = facts.errors
    assert err.text.endswith("Drain the GPU and reset it or reboot the node.")
    pcie = next(t for t in facts.tests if t.name == "PCIe")
    assert pcie.section == "Integration" and not pcie.failed
    assert [(r.status, r.gpus) for r in pcie.results] == [("Pass", [0, 1, 3]), ("Warn", [2])]
    assert next(t for t in facts.tests if t.name == "Inforom").results[0].status == "Skip"
    assert next(t for t in facts.tests if t.name == "GPU Memory").section == "Hardware"


def test_unknown_results_and_lines_name_their_line(synth) -> None:
    text = synth("dcgmi-diag-r1_4gpu-complete_3.3.txt")
    with pytest.raises(ParseError) as exc:
        parse_dcgmi_diag(text.replace("| Inforom                   | Skip ",
                                      "| Inforom                   | Meh  "))
    assert exc.value.line_no == 21
    with pytest.raises(ParseError) as exc:
        parse_dcgmi_diag(text + "Error: unable to connect to host engine\n")
    assert exc.value.line_no == 29
    with pytest.raises(ParseError):
        parse_dcgmi_diag("")


def test_an_unknown_result_is_an_error_naming_the_row_and_the_file(synth) -> None:
    text = synth("dcgmi-diag-r1_4gpu-complete_3.3.txt")
    bad = "| Inforom                   | Meh                                            |"
    with pytest.raises(ParseError) as exc:
        parse_dcgmi_diag(text.replace(
            "| Inforom                   | Skip                                           |", bad),
            source="raw/dcgmi-diag.txt")
    e = exc.value
    assert (e.kind, e.line_no, e.line, e.source) == ("dcgmi-diag", 21, bad, "raw/dcgmi-diag.txt")
    assert e.what == ("cannot parse dcgmi-diag output at raw/dcgmi-diag.txt:21: result 'Meh' is "
                      f"not Pass/Fail/Warn/Skip\n  line: {bad!r}")


def test_a_cell_without_its_separator_space_keeps_its_first_character(synth) -> None:
    """A continuation cell that fills its column starts at the `|`: nothing of it is cut."""
    text = synth("dcgmi-diag-r1_4gpu-complete_3.3.txt").replace(
        "| set it or reboot the node.                     |",
        "|set it or reboot the node.                      |")
    (err,) = parse_dcgmi_diag(text).errors
    assert err.text == ("GPU 2 had uncorrectable memory errors and row remappings are pending. "
                        "Drain the GPU and reset it or reboot the node.")


def _error(text: str) -> tuple[object, ...]:
    with pytest.raises(ParseError) as exc:
        parse_dcgmi_diag(text, source="raw/dcgmi.txt")
    e = exc.value
    return e.kind, e.what, e.line_no, e.line, e.source


def _what(line_no: int | None, what: str, line: str | None = None) -> str:
    at = "raw/dcgmi.txt" + ("" if line_no is None else f":{line_no}")
    return f"cannot parse dcgmi-diag output at {at}: {what}" + (
        "" if line is None else f"\n  line: {line.rstrip()!r}")


def test_a_whole_level_1_table_test_by_test(synth) -> None:
    facts = parse_dcgmi_diag(synth("dcgmi-diag-r1_4gpu-complete_3.3.txt"))
    assert (facts.dcgm_version, facts.driver_version, facts.header, facts.complete) == (
        "3.3.9", "570.133.20", True, True)
    assert facts.messages == []
    dep = ["Denylist", "NVML Library", "CUDA Main Library", "Permissions and OS Blocks",
           "Persistence Mode", "Environment Variables"]
    assert [(t.section, t.name, t.line_no, [(r.status, r.gpus) for r in t.results])
            for t in facts.tests] == [
        *[("Deployment", name, 10 + k, [("Pass", None)]) for k, name in enumerate(dep)],
        ("Deployment", "Page Retirement/Row Remap", 16, [("Fail", None)]),
        ("Deployment", "Graphics Processes", 20, [("Pass", None)]),
        ("Deployment", "Inforom", 21, [("Skip", None)]),
        ("Integration", "PCIe", 23, [("Pass", [0, 1, 3]), ("Warn", [2])]),
        ("Hardware", "GPU Memory", 27, [("Pass", None)])]
    assert [(t.name, [m.model_dump() for m in t.messages]) for t in facts.tests if t.messages] == [
        ("Page Retirement/Row Remap",
         [{"kind": "Error", "line_no": 17,
           "text": "GPU 2 had uncorrectable memory errors and row remappings are pending. "
                   "Drain the GPU and reset it or reboot the node."}]),
        ("PCIe", [{"kind": "Warning", "line_no": 25,
                   "text": "GPU 2 PCIe link is x8, expected x16"}])]
    assert [t.failed for t in facts.tests].count(True) == 1


def test_every_status_and_message_kind(synth) -> None:
    rows = ["| A | pass", "| B | FAIL - GPU: 3", "| C | Warning - All", "| D | Not Run",
            "| E | N/A", "| F | skip - GPUs: 1,2", "| Info | first", "|  | , then more",
            "| G | Pass", "| Warning | careful"]
    facts = parse_dcgmi_diag("\n".join(rows) + "\n")
    assert [(t.name, [(r.status, r.gpus) for r in t.results]) for t in facts.tests] == [
        ("A", [("Pass", None)]), ("B", [("Fail", [3])]), ("C", [("Warn", None)]),
        ("D", [("Not Run", None)]), ("E", [("N/A", None)]), ("F", [("Skip", [1, 2])]),
        ("G", [("Pass", None)])]
    assert [(m.kind, m.text, m.line_no) for m in facts.tests[5].messages] == [
        ("Info", "first, then more", 7)]
    assert [(m.kind, m.text) for m in facts.tests[6].messages] == [("Warning", "careful")]
    assert [t.name for t in facts.failed] == ["B"] and facts.errors == []
    assert (facts.header, facts.complete, facts.tests[0].section) == (False, False, None)


def test_a_result_row_after_a_message_is_another_result_of_the_test() -> None:
    text = ("| PCIe | Pass - GPU: 0\n| Warning | GPU 1 link is x8\n|  | Fail - GPU: 1\n"
            "|  | , expected x16\n")
    (t,) = parse_dcgmi_diag(text).tests
    assert [(r.status, r.gpus) for r in t.results] == [("Pass", [0]), ("Fail", [1])]
    assert [m.text for m in t.messages] == ["GPU 1 link is x8, expected x16"]


def test_a_section_closes_the_test_and_the_message_above_it() -> None:
    text = ("| Denylist | Pass\n| Info | note\n|-----  Integration  ----+-----|\n"
            "| Error | the host engine is gone\n|  |  for good\n| Dup | Pass\n"
            "| Dup | Fail\n")
    facts = parse_dcgmi_diag(text)
    assert [(m.kind, m.text, m.line_no) for m in facts.messages] == [
        ("Error", "the host engine is gone for good", 4)]
    assert facts.tests[0].messages[0].text == "note"
    assert [(t.section, t.name) for t in facts.tests] == [
        (None, "Denylist"), ("Integration", "Dup"), ("Integration", "Dup")]
    assert [m.text for m in facts.errors] == ["the host engine is gone for good"]
    assert [t.name for t in facts.failed] == ["Dup"] and facts.tests[1].failed is False
    with pytest.raises(ParseError, match="a continuation row with nothing above it"):
        parse_dcgmi_diag("|-----  Integration  ----+-----|\n|  | Pass\n")


def test_completeness_follows_the_last_border(synth) -> None:
    text = synth("dcgmi-diag-r1_4gpu-complete_3.3.txt")
    assert parse_dcgmi_diag(text + "\n\n").complete is True
    assert parse_dcgmi_diag(text + "| Late | Pass\n").complete is False
    assert parse_dcgmi_diag(text + "|-----  Late  ---+----|\n").complete is False
    border = "+---------------------------+------------------------------------------------+"
    heading = "| Diagnostic                | Result                                         |"
    loose = parse_dcgmi_diag(heading + "\n" + border + "\n| Error | no GPUs\n" + border + "\n")
    assert (loose.complete, loose.header, loose.tests, loose.errors[0].text) == (
        True, True, [], "no GPUs")
    only_meta = "| DCGM Version              | 3.3.1 \n" + border + "\n"
    meta = parse_dcgmi_diag(only_meta)
    assert (meta.complete, meta.header, meta.dcgm_version, meta.device_ids) == (
        False, False, "3.3.1", [])
    ids = parse_dcgmi_diag("| GPU Device IDs Detected | 20b2, ,2330 \n")
    assert ids.device_ids == ["20b2", "2330"]
    pre = parse_dcgmi_diag("  Running diagnostic... \nSuccessfully ran diagnostic for group.\n"
                           + border + "\n| A | Pass\n" + border + "\n")
    assert (pre.complete, [t.name for t in pre.tests]) == (True, ["A"])


def test_every_error_of_the_table_names_the_kind_the_file_and_the_line() -> None:
    cases = [
        ("| A | Pass\nError: unable to connect to host engine  \n", 2,
         "not a row of the diagnostic table", "Error: unable to connect to host engine"),
        ("|                           | Pass - GPU: 1 \n", 1,
         "a continuation row with nothing above it",
         "|                           | Pass - GPU: 1"),
        ("|                           |  remappings are pending \n", 1,
         "a continuation row with nothing above it",
         "|                           |  remappings are pending"),
        # a continuation row under a test, neither a result nor the rest of a message
        ("| PCIe | Pass - GPU: 0\n\n|  | GPU 1 is slow\n", 3,
         "result 'GPU 1 is slow' is not Pass/Fail/Warn/Skip", "|  | GPU 1 is slow"),
    ]
    for text, line_no, what, line in cases:
        assert _error(text) == ("dcgmi-diag", _what(line_no, what, line), line_no, line,
                                "raw/dcgmi.txt"), what
    assert _error(" \n\n") == ("dcgmi-diag", _what(None, "empty output"), None, None,
                               "raw/dcgmi.txt")
    assert _error("Successfully ran diagnostic for group.\n+----+----+\n") == (
        "dcgmi-diag", _what(None, "no diagnostic rows"), None, None, "raw/dcgmi.txt")
