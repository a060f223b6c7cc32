"""`nvidia-smi -q` text read as a tree: the nodes whole, and every refusal word for word.

Pins `orchestrator/parsers/_smi_tree.py` on exact values: each node's key, value,
line number and line as read, the anonymous GPU an excerpt gets, and the message,
line and source of every ParseError.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import ParseError
from orchestrator.parsers._smi_tree import Node, read_tree
from orchestrator.parsers.nvidia_smi_q import parse_nvidia_smi_q

FIX = Path(__file__).resolve().parents[1] / "fixtures"
H200_Q = FIX / "h200x2" / "commands" / "nvidia-smi-q.txt"
MIG_Q = FIX / "public" / "nvidia-smi-q_h200-mig-load_r590.txt"

Dump = tuple[str, str | None, int, str, list["Dump"]]


def dump(node: Node) -> Dump:
    return (node.key, node.value, node.line_no, node.line, [dump(c) for c in node.children])


def refusal(text: str, source: str | None = "smi-q.txt") -> ParseError:
    with pytest.raises(ParseError) as exc:
        read_tree(text, source)
    assert exc.value.kind == "nvidia-smi-q"
    assert exc.value.source == source
    return exc.value


def test_a_whole_small_output_as_nodes() -> None:
    text = ("==============NVSMI LOG==============\n"
            "\n"
            "Timestamp                 : Wed Dec  2 04:00:00 2026\n"
            "Driver Version            :\n"
            "Attached GPUs             : 1\n"
            "GPU 00000000:01:00.0\n"
            "    Product Name          : NVIDIA TITAN X\n"
            "    Serial Number         :\n"
            "    MIG Mode\n"
            "        Current           : N/A\n"
            "    Product Brand         : NVIDIA\n"
            "    GPU Memory Power Readings \n")  # the trailing blank as the H200 prints it
    tree = read_tree(text, None)
    assert {k: (n.key, n.value, n.line_no, n.line) for k, n in tree.top.items()} == {
        "timestamp": ("Timestamp", "Wed Dec  2 04:00:00 2026", 3,
                      "Timestamp                 : Wed Dec  2 04:00:00 2026"),
        "driver version": ("Driver Version", "", 4, "Driver Version            :"),
        "attached gpus": ("Attached GPUs", "1", 5, "Attached GPUs             : 1"),
    }
    assert [dump(r) for r in tree.roots] == [("GPU", "00000000:01:00.0", 6, "", [
        ("Product Name", "NVIDIA TITAN X", 7, "    Product Name          : NVIDIA TITAN X", []),
        ("Serial Number", "", 8, "    Serial Number         :", []),
        ("MIG Mode", None, 9, "    MIG Mode", [
            ("Current", "N/A", 10, "        Current           : N/A", [])]),
        ("Product Brand", "NVIDIA", 11, "    Product Brand         : NVIDIA", []),
        ("GPU Memory Power Readings", None, 12, "    GPU Memory Power Readings ", []),
    ])]
    # an empty value is "", which every reader takes for N/A
    facts = parse_nvidia_smi_q(text)
    assert facts.driver_version is None and facts.gpus[0].serial is None
    assert facts.gpus[0].product_name == "NVIDIA TITAN X"


def test_an_excerpt_without_its_gpu_line_gets_an_anonymous_gpu_per_block() -> None:
    text = ("    MIG Mode\n"
            "        Current : Enabled\n"
            "--\n"
            "    MIG Mode\n"
            "        Current : Disabled\n")
    tree = read_tree(text, None)
    assert tree.top == {}
    assert [dump(r) for r in tree.roots] == [
        ("GPU", None, 1, "", [("MIG Mode", None, 1, "    MIG Mode", [
            ("Current", "Enabled", 2, "        Current : Enabled", [])])]),
        ("GPU", None, 4, "", [("MIG Mode", None, 4, "    MIG Mode", [
            ("Current", "Disabled", 5, "        Current : Disabled", [])])]),
    ]


def test_a_top_level_line_ends_an_excerpt_block() -> None:
    text = ("    Product Name : A\n"
            "Driver Version : 580.159.04\n"
            "    Product Name : B\n")
    tree = read_tree(text, None)
    assert [dump(r) for r in tree.roots] == [
        ("GPU", None, 1, "", [("Product Name", "A", 1, "    Product Name : A", [])]),
        ("GPU", None, 3, "", [("Product Name", "B", 3, "    Product Name : B", [])]),
    ]


def test_repeated_mig_devices_of_a_gpu_less_excerpt_stay_one_gpu() -> None:
    """`sed -n '/MIG Device/,/BAR1/p'` of the H200 MIG capture: five devices, one GPU."""
    lines = MIG_Q.read_text().splitlines()
    first = lines.index("    MIG Device")
    last = max(i for i, ln in enumerate(lines) if ln.startswith("        Shared BAR1 Memory"))
    text = "\n".join(lines[first:last + 4]) + "\n"
    tree = read_tree(text, None)
    assert len(tree.roots) == 1
    assert [c.key for c in tree.roots[0].children] == ["MIG Device"] * 5
    (gpu,) = parse_nvidia_smi_q(text).gpus
    assert [(d.index, d.gpu_instance_id, d.memory_total_mib) for d in gpu.mig_devices] == [
        (0, 2, 71424), (1, 2, 71424), (2, 3, 33280), (3, 9, 16384), (4, 10, 16384)]


def test_first_takes_the_first_spelling_present() -> None:
    tree = read_tree("GPU 0000:01:00.0\n    Clique ID : 7\n    CliqueId : 3\n", None)
    root = tree.roots[0]
    node = root.first("ClusterUUID", "CliqueId", "Clique ID")
    assert node is not None and (node.key, node.value) == ("CliqueId", "3")
    assert root.first("ClusterUUID", "Cluster UUID") is None


def test_a_second_banner_is_refused_naming_both_lines() -> None:
    text = H200_Q.read_text()
    n = len(text.splitlines())
    err = refusal(text + text)
    assert err.line_no == n + 2  # a blank line, then the banner
    assert err.line == "==============NVSMI LOG=============="
    assert err.what == (
        f"cannot parse nvidia-smi-q output at smi-q.txt:{n + 2}: a second `NVSMI LOG` banner "
        "(the first at line 2): several nvidia-smi -q outputs in one text; keep one host's "
        "output per file\n  line: '==============NVSMI LOG=============='")


def test_a_tab_in_the_indentation_is_refused() -> None:
    err = refusal("GPU 00000000:01:00.0\n  \tProduct Name : A\n")
    assert (err.line_no, err.line) == (2, "  \tProduct Name : A")
    assert err.what == ("cannot parse nvidia-smi-q output at smi-q.txt:2: tab in the indentation "
                        "(not nvidia-smi -q text)\n  line: '  \\tProduct Name : A'")
    err = refusal("\tProduct Name : A\n", source=None)
    assert err.what.startswith("cannot parse nvidia-smi-q output at <text>:1: tab in the "
                               "indentation")
    # a tab after the first character of the key is the line's own business
    tree = read_tree("GPU 00000000:01:00.0\n  A\t: 1\n", None)
    assert [(c.key, c.value) for c in tree.roots[0].children] == [("A", "1")]


def test_a_line_indented_by_no_break_spaces_is_refused() -> None:
    """Pasted through a web page, the indentation can come back as U+00A0."""
    err = refusal("GPU 00000000:01:00.0\n  \xa0Product Name : A\n")
    assert (err.line_no, err.line) == (2, "  \xa0Product Name : A")
    assert err.what == ("cannot parse nvidia-smi-q output at smi-q.txt:2: not a `Key : value` "
                        "line or a section title\n  line: '  \\xa0Product Name : A'")


def test_noise_lines_are_recorded_with_their_numbers_and_reading_goes_on() -> None:
    text = ("root@node1:~# nvidia-smi -q\n"
            "GPU 00000000:01:00.0\n"
            "    Product Name : A\n"
            "    [...]\n"
            "    Product Brand : NVIDIA\n")
    tree = read_tree(text, None)
    assert [(i.line_no, i.kind) for i in tree.noise.ignored] == [(1, "shell-prompt"),
                                                                 (4, "elision")]
    assert [e.line_no for e in tree.noise.edits] == [4]
    assert [c.key for c in tree.roots[0].children] == ["Product Name", "Product Brand"]
