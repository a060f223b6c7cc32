"""Exact-value pins of the nvidia-smi -q -x parse function (its top level).

Each test starts from the real capture of the 2x H200 host and edits one thing,
then asserts the top-level record or the exact error: message, line number, line.
"""
from __future__ import annotations

from orchestrator.errors import ParseError
from orchestrator.parsers.nvidia_smi_xml import parse_nvidia_smi_xml
from tests.unit.parsers.refusal import is_refusal, refused

KIND = "nvidia-smi-q-xml"


def _err(text: str) -> ParseError:
    return refused(parse_nvidia_smi_xml, text)


def _is(e: ParseError, what: str, line_no: int | None, line: str | None) -> None:
    is_refusal(e, KIND, what, line_no, line)


def test_xml_top_level_of_the_real_h200(real) -> None:
    facts = parse_nvidia_smi_xml(real("nvidia-smi-q.xml"))
    assert (facts.driver_version, facts.cuda_version, facts.attached_gpus) == ("580.159.04",
                                                                              "13.0", 2)
    assert len(facts.gpus) == 2
    assert [g.index for g in facts.gpus] == [0, 1]


def test_xml_top_level_na_and_absent(real) -> None:
    text = real("nvidia-smi-q.xml").replace("<cuda_version>13.0</cuda_version>",
                                            "<cuda_version>N/A</cuda_version>")
    text = text.replace("\t<attached_gpus>2</attached_gpus>\n", "")
    text = text.replace("<driver_version>580.159.04</driver_version>", "<driver_version/>")
    facts = parse_nvidia_smi_xml(text)
    assert (facts.driver_version, facts.cuda_version, facts.attached_gpus) == (None, None, None)


def test_xml_without_its_doctype(real) -> None:
    text = real("nvidia-smi-q.xml")
    doctype = '<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v13.dtd">'
    assert len(parse_nvidia_smi_xml(text.replace(doctype + "\n", "")).gpus) == 2


def test_xml_errors(real) -> None:
    text = real("nvidia-smi-q.xml")
    _is(_err(" \n\n"), "empty output", None, None)
    _is(_err(""), "empty output", None, None)
    lines = text.splitlines()
    bad = "\n".join(lines[:5] + ["\t<cuda_version>13.0</cuda>"] + lines[6:])
    _is(_err(bad), "not well-formed XML (mismatched tag: line 6, column 21)", 6,
        "\t<cuda_version>13.0</cuda>")
    _is(_err("<nvidia_smi_log>\n<x>\n"), "not well-formed XML (no element found: line 3, "
        "column 0)", 3, None)
    _is(_err("<nvidia_smi_log>\n<x>"), "not well-formed XML (no element found: line 2, "
        "column 3)", 2, "<x>")
    _is(_err("<other>\n</other>\n"), "root element is <other>, not <nvidia_smi_log>", 1,
        "<other>")
    bad = text.replace("<attached_gpus>2</attached_gpus>", "<attached_gpus>two</attached_gpus>")
    _is(_err(bad), "<attached_gpus> is not a count: 'two'", 7,
        "\t<attached_gpus>two</attached_gpus>")


def test_xml_error_on_the_first_line_names_it() -> None:
    _is(_err("<nvidia_smi_log><x></y></nvidia_smi_log>"),
        "not well-formed XML (mismatched tag: line 1, column 21)", 1,
        "<nvidia_smi_log><x></y></nvidia_smi_log>")


def test_xml_gpu_error_names_the_file(real) -> None:
    text = real("nvidia-smi-q.xml")
    line = next(ln for ln in text.splitlines() if "<total>" in ln and "MiB" in ln)
    e = _err(text.replace(line, line.replace(" MiB", " lots"), 1))
    assert (e.source, e.line) == ("f.txt", line.replace(" MiB", " lots"))


def test_xml_undefined_entity_is_reported_by_the_parser_once_the_doctype_is_dropped(real) -> None:
    # with the DOCTYPE kept, ElementTree itself would word it ("undefined entity &nbsp;")
    text = real("nvidia-smi-q.xml").replace("NVIDIA H200</product_name>", "&nbsp;</product_name>",
                                            1)
    _is(_err(text), "not well-formed XML (undefined entity: line 9, column 16)", 9,
        "\t\t<product_name>&nbsp;</product_name>")
