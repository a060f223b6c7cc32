"""ibstat on published outputs of H100 and A100 fleets, healthy, half down, and dying midway."""

from __future__ import annotations

import pytest

from orchestrator.errors import ParseError
from orchestrator.parsers import get, parse
from orchestrator.parsers.ibstat import IbstatFacts, parse_ibstat


def test_registered() -> None:
    assert get("ibstat").func is parse_ibstat


def test_h100_node_with_ports_down(public) -> None:
    facts = parse("ibstat", public("ibstat_12x-cx7-cx6_some-down.txt"))
    assert isinstance(facts, IbstatFacts)
    assert [ca.name for ca in facts.cas][:3] == ["mlx5_0", "mlx5_1", "mlx5_10"]
    assert len(facts.cas) == 12 and facts.errors == []
    ca0 = facts.cas[0]
    assert (ca0.ca_type, ca0.num_ports, ca0.firmware, ca0.node_guid) == (
        "MT4129", 1, "28.39.1002", "0x946dae0300cde72c")
    (p,) = ca0.ports
    assert (p.port, p.state, p.physical_state, p.rate_gbps, p.link_layer) == (
        1, "Active", "LinkUp", 400.0, "InfiniBand")
    assert (p.base_lid, p.lmc, p.sm_lid, p.capability_mask) == (75, 0, 334, "0xa751e848")
    down = [(name, p.state, p.physical_state, p.link_layer) for name, p in facts.ports
            if p.state != "Active"]
    assert down == [("mlx5_2", "Down", "Disabled", "Ethernet"),
                    ("mlx5_7", "Down", "Disabled", "Ethernet"),
                    ("mlx5_8", "Down", "Disabled", "Ethernet")]
    ib = [p.rate_gbps for _, p in facts.ports if p.link_layer == "InfiniBand"]
    assert ib == [400.0] * 8


def test_error_at_the_end_keeps_what_came_before(public) -> None:
    facts = parse_ibstat(public("ibstat_8x-cx6_ibpanic.txt"))
    assert len(facts.cas) == 8 and facts.cas[-1].name == "mlx5_7"
    assert all(p.state == "Active" and p.rate_gbps == 200.0 for _, p in facts.ports)
    (err,) = facts.errors
    assert err.line_no == 137 and "stat of IB device 'mlx5_8' failed" in err.text


def test_ibwarn_lines_and_fractional_rate() -> None:
    text = ("ibwarn: [168988] umad_init: umad_init\n"
            "CA 'mlx5_2'\n\tCA type: MT4125\n\tNumber of ports: 1\n\tPort 1:\n"
            "\t\tState: Active\n\t\tRate: 2.5\n\t\tLink layer: Ethernet\n")
    facts = parse_ibstat(text)
    assert facts.warnings[0].line_no == 1 and facts.cas[0].ports[0].rate_gbps == 2.5


def test_garbage_raises_with_line(public) -> None:
    text = public("ibstat_8x-cx6_ibpanic.txt").replace("Rate: 200", "Rate: fast", 1)
    with pytest.raises(ParseError) as exc:
        parse_ibstat(text)
    assert exc.value.line_no == 11
    with pytest.raises(ParseError):
        parse_ibstat("")
    with pytest.raises(ParseError) as exc:
        parse_ibstat("hca_id: mlx5_0\n")
    assert exc.value.line_no == 1
    with pytest.raises(ParseError):
        parse_ibstat("\tState: Active\n")
