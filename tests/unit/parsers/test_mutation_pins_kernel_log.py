"""Exact-value pins for the kernel-log parsers (orchestrator/parsers/kernel_log.py).

Each parse function's whole record, and each error's kind, place, line and message, so a
changed argument, bound or branch in them fails here.
"""

from __future__ import annotations

import pytest

from orchestrator.errors import ParseError
from orchestrator.parsers.kernel_log import (
    BusEvent,
    KernelLogFacts,
    PcieBandwidthFacts,
    PcieLink,
    Stamp,
    XidEvent,
    parse_kernel_log,
    parse_pcie_bandwidth,
)

XID = "NVRM: Xid (PCI:0000:9B:00): 79, pid=2211, name=python3, GPU has fallen off the bus X"
GONE = ("[ 9.5] NVRM: The NVIDIA GPU 0000:b3:00.0\n"
        "               NVRM: (PCI ID: 10de:26b5) installed in this system has\n")


def test_kernel_log_record() -> None:
    text = ("[ 5.0] boot\r\n"
            f"{XID}\r\n"  # grepped: the line starts with the driver's text
            "[...]\n"
            "[ 3.0] NVRM: GPU at PCI:0000:9B:00: GPU-1234abcd-00ff\n"
            "[ 7.5] NVRM: Xid (PCI:0000:01:00): 63, pid=<unknown>, name=<unknown>, row\n"
            "[ 8.0] usb: fallen off the bus\n")
    assert parse_kernel_log(text) == KernelLogFacts(
        lines=6, events=[
            XidEvent(line_no=2, xid=79, pci="0000:9b:00", pid=2211, process="python3",
                     message="GPU has fallen off the bus X", stamp=Stamp(raw=None, uptime_s=None),
                     meaning="GPU has fallen off the bus", category="bus", bad=True,
                     caused_by=None, line=XID),
            XidEvent(line_no=5, xid=63, pci="0000:01:00", pid=None, process=None, message="row",
                     stamp=Stamp(raw="[ 7.5]", uptime_s=7.5),
                     meaning="ECC page retirement or row remapping recording event",
                     category="memory", bad=True, caused_by=None,
                     line="[ 7.5] NVRM: Xid (PCI:0000:01:00): 63, pid=<unknown>, "
                          "name=<unknown>, row")],
        fallen_off_bus=[], gpus={"0000:9b:00": "GPU-1234abcd-00ff"}, last_uptime_s=8.0,
        elided=True)
    down = parse_kernel_log("[ 9.0] x\n[ 2.0] y\n")
    assert (down.last_uptime_s, down.elided, down.lines) == (9.0, False, 2)


def test_kernel_log_fallen_off_the_bus() -> None:
    fallen = "               NVRM: fallen off the bus and is not responding to commands.\n"
    stamp = Stamp(raw="[ 9.5]", uptime_s=9.5)
    text = "\n" + GONE + fallen + fallen
    assert parse_kernel_log(text).fallen_off_bus == [
        BusEvent(line_no=2, pci="0000:b3:00", stamp=stamp, text=fallen.strip()),
        BusEvent(line_no=5, pci=None, stamp=Stamp(raw=None, uptime_s=None), text=fallen.strip())]
    # the GPU's line at most three lines before the message names it
    far = GONE + "NVRM: filler\n" + fallen
    assert parse_kernel_log(far).fallen_off_bus[0].pci == "0000:b3:00"
    farther = GONE + "NVRM: filler\nNVRM: filler\n" + fallen
    assert parse_kernel_log(farther).fallen_off_bus == [
        BusEvent(line_no=5, pci=None, stamp=Stamp(raw=None, uptime_s=None), text=fallen.strip())]


def test_kernel_log_errors() -> None:
    with pytest.raises(ParseError) as exc:
        parse_kernel_log(" \n\n", source="f.txt")
    assert exc.value.what == "cannot parse xid output at f.txt: empty output"
    bad = "[ 2.0] NVRM: Xid 79 GPU fell off "  # the line as printed, less the \\r of a CRLF
    with pytest.raises(ParseError) as exc:
        parse_kernel_log("[ 1.0] ok\n" + bad + "\r\n", source="f.txt")
    assert (exc.value.what, exc.value.line_no, exc.value.line) == (
        "cannot parse xid output at f.txt:2: an `NVRM: Xid` line without `Xid (PCI:<bus id>): "
        f"<number>`\n  line: {bad.rstrip()!r}", 2, bad)


_LIMITED = ("pci 0000:04:00.0: 252.048 Gb/s available PCIe bandwidth, limited by 16.0 GT/s PCIe "
            "x16 link at 0000:01:00.0 (capable of 504.112 Gb/s with 32.0 GT/s PCIe x16 link)")
_FULL = "pci 0000:17:00.0: 31.504 Gb/s available PCIe bandwidth (8.0 GT/s PCIe x4 link)"


def test_pcie_bandwidth_record() -> None:
    text = f"[ 1.5] {_LIMITED}X\r\nunrelated\n\n{_FULL}\r\n[...]\n"
    assert parse_pcie_bandwidth(text) == PcieBandwidthFacts(links=[
        PcieLink(line_no=1, bdf="0000:04:00.0", available_gbps=252.048, speed_gts=16.0,
                 width=16, gen=4, limited=True, limited_at="0000:01:00.0", capable_gbps=504.112,
                 capable_speed_gts=32.0, capable_width=16, capable_gen=5,
                 stamp=Stamp(raw="[ 1.5]", uptime_s=1.5)),
        PcieLink(line_no=4, bdf="0000:17:00.0", available_gbps=31.504, speed_gts=8.0, width=4,
                 gen=3, limited=False, limited_at=None, capable_gbps=None,
                 capable_speed_gts=None, capable_width=None, capable_gen=None,
                 stamp=Stamp(raw=None, uptime_s=None))], lines=5, elided=True)
    odd = parse_pcie_bandwidth(_FULL.replace("8.0 GT/s", "9.0 GT/s") + "\n")
    assert (odd.links[0].gen, odd.elided, odd.lines) == (None, False, 1)
    odd = parse_pcie_bandwidth(_LIMITED.replace("32.0 GT/s", "33 GT/s") + "\n")
    assert (odd.links[0].capable_gen, odd.links[0].capable_speed_gts) == (None, 33.0)


def test_pcie_bandwidth_errors() -> None:
    with pytest.raises(ParseError) as exc:
        parse_pcie_bandwidth(" \n\n", source="f.txt")
    assert exc.value.what == "cannot parse pcie-bandwidth output at f.txt: empty output"
    bad = "pci 0000:17:00.0: lots of available PCIe bandwidth"
    with pytest.raises(ParseError) as exc:
        parse_pcie_bandwidth("x\n" + bad + "\n", source="f.txt")
    assert (exc.value.what, exc.value.line_no, exc.value.line) == (
        "cannot parse pcie-bandwidth output at f.txt:2: an `available PCIe bandwidth` line not "
        f"in the kernel's layout\n  line: {bad!r}", 2, bad)
    # a CRLF line is reported less its \r only: its own trailing blank or X stays
    for tail in (" ", " X"):
        with pytest.raises(ParseError) as exc:
            parse_pcie_bandwidth(bad + tail + "\r\n")
        assert exc.value.line == bad + tail
