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


def _error(text: str) -> tuple[object, ...]:
    with pytest.raises(ParseError) as exc:
        parse_ibstat(text, source="raw/ibstat.txt")
    e = exc.value
    return e.kind, e.what, e.line_no, e.line, e.source


def _what(line_no: int | None, what: str, line: str | None = None) -> str:
    at = "raw/ibstat.txt" + ("" if line_no is None else f":{line_no}")
    return f"cannot parse ibstat output at {at}: {what}" + (
        "" if line is None else f"\n  line: {line.rstrip()!r}")


def test_the_first_adapter_whole(public) -> None:
    facts = parse_ibstat(public("ibstat_8x-cx6_ibpanic.txt"))
    assert facts.cas[0].model_dump() == {
        "name": "mlx5_0", "ca_type": "MT4124", "num_ports": 1, "firmware": "20.41.1000",
        "hardware_version": "0", "node_guid": "0x00155dfffe3411eb",
        "system_image_guid": "0xb83fd203006e2704", "other": {}, "line_no": 1,
        "ports": [{"port": 1, "state": "Active", "physical_state": "LinkUp", "rate_gbps": 200.0,
                   "base_lid": 13247, "lmc": 0, "sm_lid": 1, "capability_mask": "0xa651ec48",
                   "port_guid": "0x00155dfffd3411eb", "link_layer": "InfiniBand",
                   "other": {}}]}
    assert facts.cas[1].line_no == 18 and facts.warnings == []
    assert facts.errors[0].model_dump() == {
        "line_no": 137,
        "text": "ibpanic: [1400444] main: stat of IB device 'mlx5_8' failed: No such file or "
                "directory"}


def test_unknown_keys_are_kept_where_they_were_printed() -> None:
    """A key printed after the port block, at the adapter's indent, is the adapter's; an
    unknown key inside the port block is the port's. Keys keep their printed case."""
    text = ("CA 'mlx5_0'\r\n\tCA type: MT4129\r\n\tPort 1:\r\n\t\tState: Down\r\n"
            "\t\tLink Speed Mode: NDR  \r\n\t\tRate: 400\r\n\tTransport Type: IB\r\n"
            "\tNumber of ports: 2\r\n\tPort 2:\r\n\t\tLMC: 1\r\n")
    (ca,) = parse_ibstat(text).cas
    assert ca.other == {"Transport Type": "IB"} and ca.num_ports == 2
    p1, p2 = ca.ports
    assert (p1.state, p1.rate_gbps, p1.other) == ("Down", 400.0, {"Link Speed Mode": "NDR"})
    assert (p2.port, p2.lmc, p2.state, p2.other) == (2, 1, None, {})


def test_a_port_key_after_an_error_is_not_the_ports(public) -> None:
    """After an error line, indented details belong to the adapter, not to a stale port."""
    text = ("CA 'mlx5_0'\n\tPort 1:\n\t\tState: Active\n"
            "iberror: [77] main: port query failed\n\t\tState: Down\n")
    facts = parse_ibstat(text)
    (ca,) = facts.cas
    assert ca.ports[0].state == "Active" and ca.other == {"State": "Down"}
    assert [(e.line_no, e.text) for e in facts.errors] == [
        (4, "iberror: [77] main: port query failed")]
    warn = parse_ibstat("CA 'mlx5_0'\nibwarn: [1] umad_get_port: x\n").warnings
    assert [(w.line_no, w.text) for w in warn] == [(2, "ibwarn: [1] umad_get_port: x")]


def test_a_second_adapter_starts_without_a_port() -> None:
    text = "CA 'a'\n\tPort 1:\n\t\tState: Active\n\nCA 'b'\n\t\tState: Down\n"
    a, b = parse_ibstat(text).cas
    assert a.ports[0].state == "Active" and b.ports == [] and b.other == {"State": "Down"}


def test_every_error_names_the_kind_the_file_and_the_line() -> None:
    cases = [
        ("CA 'a'\n\tCA 'b'\n", 2, "indented `CA` line", "\tCA 'b'"),
        ("CA 'a'\nhca_id: mlx5_0\n", 2, "not a `CA '<name>'` line or a known error",
         "hca_id: mlx5_0"),
        ("\tState: Active  \n", 1, "adapter details before the first `CA` line",
         "\tState: Active  "),
        ("CA 'a'\n\tno colon here\n", 2, "not a `Key: value` line", "\tno colon here"),
        # a GUID redacted in a paste, its colon lost
        ("CA 'a'\n\tNode GUID 0xXXXXXXXX\n", 2, "not a `Key: value` line",
         "\tNode GUID 0xXXXXXXXX"),
        ("CA 'a'\n\tPort 1:\n\t\tRate: fast\n", 3, "Rate is not a number", "\t\tRate: fast"),
        ("CA 'a'\n\tPort 1:\n\t\tBase lid: 0x1\n", 3, "Base lid is not a number",
         "\t\tBase lid: 0x1"),
        ("CA 'a'\n\tNumber of ports: one\n", 2, "Number of ports is not a number",
         "\tNumber of ports: one"),
    ]
    for text, line_no, what, line in cases:
        assert _error(text) == ("ibstat", _what(line_no, what, line), line_no, line,
                                "raw/ibstat.txt"), what
    assert _error("\n  \n") == ("ibstat", _what(None, "empty output"), None, None,
                                "raw/ibstat.txt")
