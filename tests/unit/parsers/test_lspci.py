"""`lspci -vvv` links: capability and status, downgrades marked by lspci 3.8+ or
found by comparison on older lspci, excerpts that start inside a device."""

from __future__ import annotations

import pytest

from orchestrator.errors import ParseError
from orchestrator.parsers import get, parse
from orchestrator.parsers.lspci import parse_lspci

SYNTH = "lspci-vvv_h100-x8-a100-gen3_lspci-3.7-3.10.txt"


def test_registered() -> None:
    assert get("lspci-vvv").func is parse_lspci


def test_an_a100_device_line_and_no_link_lines_yet(public) -> None:
    (dev,) = parse("lspci-vvv", public("lspci-vvv_a100-sxm4-40gb-cut_hwloc653.txt")).devices
    assert (dev.bdf, dev.device_class, dev.nvidia_gpu) == ("da:00.0", "3D controller", True)
    assert dev.description is not None and "A100 SXM4 40GB" in dev.description
    assert dev.link_cap is None and dev.speed_downgraded is None


def test_a_quadro_at_x1_in_an_excerpt(public) -> None:
    (dev,) = parse_lspci(public("lspci-vvv_quadro-rtx8000-x1-fragment_rpi480.txt")).devices
    assert dev.bdf is None and dev.link_status is not None
    assert (dev.link_status.speed_gts, dev.link_status.gen, dev.link_status.width) == (5.0, 2, 1)
    assert dev.speed_downgraded is True and dev.width_downgraded is True


def test_a_4090_on_a_riser_trained_at_gen1(public) -> None:
    (dev,) = parse_lspci(public("lspci-vvv_rtx4090-riser-lnk_jan183.txt")).devices
    assert dev.link_cap is not None and (dev.link_cap.gen, dev.link_cap.width) == (4, 16)
    assert dev.speed_downgraded is True and dev.width_downgraded is False


def test_gpus_and_downgrades_of_a_node(synth) -> None:
    facts = parse_lspci(synth(SYNTH))
    assert [d.bdf for d in facts.gpus] == ["17:00.0", "2a:00.0", "3b:00.0"]
    assert [d.bdf for d in facts.downgraded] == ["2a:00.0", "3b:00.0"]
    h100 = facts.devices[1]
    assert h100.link_status is not None and (h100.link_status.gen, h100.link_status.width) == (4, 8)
    # lspci before 3.8 marks nothing: the status is compared with the capability
    a100 = facts.devices[2]
    assert a100.link_status is not None and a100.link_status.speed_marked is None
    assert a100.speed_downgraded is True and a100.width_downgraded is False
    assert facts.devices[0].driver == "nvidia" and facts.devices[3].driver == "mlx5_core"


def test_lines_out_of_shape(synth) -> None:
    with pytest.raises(ParseError) as exc:
        parse_lspci(synth(SYNTH).replace("Speed 16GT/s (downgraded), Width x8",
                                         "Speed fast, Width x8"))
    assert exc.value.line_no == 23
    with pytest.raises(ParseError) as exc:
        parse_lspci("not lspci at all\n")
    assert exc.value.line_no == 1
    with pytest.raises(ParseError):
        parse_lspci("")


def _error(text: str) -> tuple[object, ...]:
    with pytest.raises(ParseError) as exc:
        parse_lspci(text, source="raw/lspci.txt")
    e = exc.value
    return e.kind, e.what, e.line_no, e.line, e.source


def _what(line_no: int | None, what: str, line: str | None = None) -> str:
    at = "raw/lspci.txt" + ("" if line_no is None else f":{line_no}")
    return f"cannot parse lspci-vvv output at {at}: {what}" + (
        "" if line is None else f"\n  line: {line.rstrip()!r}")


def _link(speed: float | None, gen: int | None, width: int, line_no: int) -> dict[str, object]:
    return {"speed_gts": speed, "gen": gen, "width": width, "line_no": line_no}


def test_a_node_whole(synth) -> None:
    devices = [d.model_dump() for d in parse_lspci(synth(SYNTH)).devices]
    h100 = "NVIDIA Corporation GH100 [H100 SXM5 80GB] (rev a1)"
    assert devices[:2] == [
        {"bdf": "17:00.0", "device_class": "3D controller", "description": h100,
         "link_cap": _link(32.0, 5, 16, 8),
         "link_status": {**_link(32.0, 5, 16, 12), "speed_marked": "ok", "width_marked": "ok"},
         "driver": "nvidia", "line_no": 1},
        {"bdf": "2a:00.0", "device_class": "3D controller", "description": h100,
         "link_cap": _link(32.0, 5, 16, 22),
         "link_status": {**_link(16.0, 4, 8, 23), "speed_marked": "downgraded",
                         "width_marked": "downgraded"},
         "driver": "nvidia", "line_no": 19}]
    assert devices[2]["link_status"] == {**_link(8.0, 3, 16, 30), "speed_marked": None,
                                         "width_marked": None}
    assert devices[3]["line_no"] == 33 and devices[3]["device_class"] == "Ethernet controller"


def test_a_device_line_with_a_domain_a_class_id_and_an_unknown_speed() -> None:
    text = ("0000:C1:00.1 3D controller [0302]: NVIDIA Corporation GH100 [H200] [10de:2335]   \n"
            "\t\tLnkCap:\tPort #0, Speed unknown, Width x16\n"
            "\t\tLnkSta:\tSpeed unknown (downgraded), Width x2 (downgraded)\n"
            "\tKernel driver in use: vfio-pci\n")
    (dev,) = parse_lspci(text).devices
    assert dev.model_dump() == {
        "bdf": "0000:c1:00.1", "device_class": "3D controller",
        "description": "NVIDIA Corporation GH100 [H200] [10de:2335]",
        "link_cap": _link(None, None, 16, 2),
        "link_status": {**_link(None, None, 2, 3), "speed_marked": "downgraded",
                        "width_marked": "downgraded"},
        "driver": "vfio-pci", "line_no": 1}
    assert dev.nvidia_gpu and dev.speed_downgraded is True and dev.width_downgraded is True


def test_a_speed_outside_the_known_generations_has_no_generation() -> None:
    text = "01:00.0 VGA compatible controller: X\n\tLnkSta:\tSpeed 20GT/s, Width x4\n"
    (dev,) = parse_lspci(text).devices
    assert dev.link_status is not None
    assert (dev.link_status.speed_gts, dev.link_status.gen) == (20.0, None)
    assert (dev.link_cap, dev.speed_downgraded, dev.width_downgraded) == (None, None, None)


def test_an_excerpt_without_a_device_line_whole(public) -> None:
    (dev,) = parse_lspci("\n\tKernel driver in use: nvidia\n").devices
    assert dev.model_dump() == {"bdf": None, "device_class": None, "description": None,
                                "link_cap": None, "link_status": None, "driver": "nvidia",
                                "line_no": 2}


def test_every_error_names_the_kind_the_file_and_the_line() -> None:
    dev = "17:00.0 3D controller: NVIDIA Corporation GH100 [H100 SXM5 80GB] (rev a1)\n"
    cases = [
        ("not lspci at all   \n", 1, "not a device line (`BB:DD.F class: description`)",
         "not lspci at all"),
        (dev + "\t\tLnkCap:\tPort #0, Speed fast, Width x16\n", 2,
         "LnkCap without `Speed <n>GT/s, Width x<n>`", "\t\tLnkCap:\tPort #0, Speed fast, Width x16"),
        (dev + "\t\tLnkSta:\tSpeed 16GT/s, Width 16\n", 2,
         "LnkSta without `Speed <n>GT/s, Width x<n>`", "\t\tLnkSta:\tSpeed 16GT/s, Width 16"),
    ]
    for text, line_no, what, line in cases:
        assert _error(text) == ("lspci-vvv", _what(line_no, what, line), line_no, line,
                                "raw/lspci.txt"), what
    assert _error(" \n") == ("lspci-vvv", _what(None, "empty output"), None, None,
                             "raw/lspci.txt")


def test_what_counts_as_a_gpu_and_as_downgraded_without_marks() -> None:
    """lspci before 3.8: the status is compared with the capability, equal is not
    downgraded, an unknown speed on either side is not judged. An NVSwitch is an
    NVIDIA bridge, the BMC's VGA is not NVIDIA's: neither is a GPU."""
    text = ("17:00.0 3D controller: NVIDIA Corporation GH100 [H100 SXM5 80GB] (rev a1)\n"
            "\t\tLnkCap:\tPort #0, Speed 32GT/s, Width x16\n\t\tLnkSta:\tSpeed 32GT/s, Width x8\n"
            "2a:00.0 3D controller: NVIDIA Corporation GH100 [H100 SXM5 80GB] (rev a1)\n"
            "\t\tLnkCap:\tPort #0, Speed 16GT/s, Width x16\n\t\tLnkSta:\tSpeed 16GT/s, Width x16\n"
            "3b:00.0 3D controller: NVIDIA Corporation GA100 [A100 PCIe 40GB] (rev a1)\n"
            "\t\tLnkCap:\tPort #0, Speed unknown, Width x16\n\t\tLnkSta:\tSpeed 8GT/s, Width x16\n"
            "05:00.0 Bridge: NVIDIA Corporation Device 22a3 (rev a1)\n"
            "03:00.0 VGA compatible controller: ASPEED Technology, Inc. ASPEED Graphics Family\n")
    facts = parse_lspci(text)
    assert [d.bdf for d in facts.gpus] == ["17:00.0", "2a:00.0", "3b:00.0"]
    assert [(d.speed_downgraded, d.width_downgraded) for d in facts.devices[:3]] == [
        (False, True), (False, False), (None, False)]
    assert [d.bdf for d in facts.downgraded] == ["17:00.0"]
