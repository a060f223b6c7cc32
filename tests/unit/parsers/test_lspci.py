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
