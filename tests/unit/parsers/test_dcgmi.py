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
