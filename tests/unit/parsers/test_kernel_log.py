"""Xid events, GPUs fallen off the bus and PCIe bandwidth limits in kernel logs of
every form: dmesg, dmesg -T, syslog and journal greps, a real H200 boot."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import ParseError
from orchestrator.parsers import get, parse
from orchestrator.parsers.kernel_log import (
    KernelLogFacts,
    parse_kernel_log,
    parse_pcie_bandwidth,
    stamp_of,
)

H200 = Path(__file__).resolve().parents[2] / "fixtures" / "h200x1-health"
# the driver's line for an Xid 79, as NVIDIA prints it (pid and name since R470)
XID79 = ("[ 4242.125001] NVRM: Xid (PCI:0000:00:06): 79, pid=2211, name=python3, "
         "GPU has fallen off the bus.")


def test_registered() -> None:
    assert get("xid").func is parse_kernel_log
    assert get("pcie-bandwidth").func is parse_pcie_bandwidth


def test_gsp_timeouts_on_an_h100_in_dmesg_T(public) -> None:
    facts = parse("xid", public("dmesg-T_h100-xid119-gsp_gpud.log"))
    assert isinstance(facts, KernelLogFacts)
    assert [e.xid for e in facts.events] == [119] * 5
    first = facts.events[0]
    assert (first.line_no, first.pci, first.pid, first.process) == (3, "0000:9b:00", 2024380,
                                                                    "nvidia-smi")
    assert first.stamp.raw == "Sun Feb 23 16:24:18 2025" and first.stamp.uptime_s is None
    assert first.message.startswith("Timeout after 6s of waiting for RPC response from GPU4 GSP!")
    assert (first.meaning, first.category, first.bad) == ("GSP RPC timeout", "firmware", True)
    assert [e.process for e in facts.events][-2:] == ["cache_mgr_main", "gpud"]
    assert facts.gpus == {"0000:9b:00": "GPU-509665ad-b600-ac93-3616-d754b23d636d"}
    assert facts.lines == 43 and facts.fallen_off_bus == []
    assert facts.count() == {119: 5} and len(facts.bad) == 5


def test_a_row_remap_line_grepped_from_syslog(public) -> None:
    (e,) = parse_kernel_log(public("syslog-grep_a100-xid63_mle.txt")).events
    assert (e.xid, e.pci, e.pid, e.process, e.bad, e.category) == (
        63, "0000:10:1c", 1896, None, True, "memory")
    assert e.message == "Row Remapper: New row marked for remapping, reset gpu to activate."
    assert e.stamp.raw is None


def test_cleanup_after_nvlink_errors_is_bad_through_its_cause(public) -> None:
    facts = parse_kernel_log(public("journal-grep_xid45-after-149_ogkm1150.txt"))
    assert [e.xid for e in facts.events] == [45] * 7
    assert [e.caused_by for e in facts.events] == [149, 145, 145, 145, 149, 145, 145]
    assert all(e.bad for e in facts.events)  # Xid 45 alone is the application's
    assert sorted({e.pci for e in facts.events}) == ["0000:97:00", "0000:ba:00", "0000:dc:00",
                                                     "0000:ed:00"]


def test_fallen_off_the_bus_with_and_without_xid(public) -> None:
    facts = parse_kernel_log(public("dmesg_fallen-off-bus-no-xid_nvsentinel155.txt"))
    assert facts.events == []
    (b,) = facts.fallen_off_bus
    assert (b.pci, b.line_no, b.stamp.uptime_s) == ("0000:b3:00", 1, 1843.308145)
    assert facts.last_uptime_s == 1843.439669
    (e,) = parse_kernel_log(public("xid79-quoted_nvsentinel155.txt")).events
    assert (e.xid, e.pid, e.message, e.bad, e.category) == (
        79, None, "GPU has fallen off the bus", True, "bus")


def test_a_clean_h200_boot_has_no_xid_and_says_when_it_ended() -> None:
    facts = parse_kernel_log((H200 / "dmesg.txt").read_text())
    assert facts.events == [] and facts.fallen_off_bus == []
    assert facts.last_uptime_s == 3.503552 and facts.lines == 50


def test_a_new_xid_79_after_the_load_is_new_and_the_old_lines_are_not() -> None:
    before = parse_kernel_log((H200 / "dmesg.txt").read_text())
    after = parse_kernel_log((H200 / "dmesg.txt").read_text() + XID79 + "\n")
    (new,) = after.new_since(before)
    assert (new.xid, new.pci, new.pid, new.process, new.bad) == (79, "0000:00:06", 2211,
                                                                 "python3", True)
    assert after.new_since(after) == []
    # logs without seconds since boot: compared by their lines
    old = parse_kernel_log("kernel: NVRM: Xid (PCI:0000:01:00): 63, pid=1, x\n")
    grown = parse_kernel_log(old.events[0].line + "\n" + old.events[0].line + "\n")
    assert len(grown.new_since(old)) == 1


@pytest.mark.parametrize("prefix,raw,uptime", [
    ("[ 1843.308145] ", "[ 1843.308145]", 1843.308145),
    ("[Sun Feb 23 16:24:18 2025] ", "Sun Feb 23 16:24:18 2025", None),
    ("Feb 14 05:03:41 000-000-00000-1-gpu-1 kernel: ", "Feb 14 05:03:41", None),
    ("Feb 14 05:03:41 host kernel: [  12.5] ", "Feb 14 05:03:41", 12.5),
    ("2024-01-15T03:00:00,000000+00:00 node kernel: ", "2024-01-15T03:00:00,000000+00:00", None),
    ("[  99.000001] node kernel: ", "[  99.000001]", 99.000001),  # journalctl -o short-monotonic
    ("kernel: ", None, None),
])
def test_stamps_of_every_logger(prefix: str, raw: str | None, uptime: float | None) -> None:
    st = stamp_of(prefix)
    assert (st.raw, st.uptime_s) == (raw, uptime)


def test_an_xid_line_out_of_shape_names_its_line() -> None:
    with pytest.raises(ParseError) as exc:
        parse_kernel_log("[ 1.0] ok\n[ 2.0] NVRM: Xid 79 GPU fell off\n")
    assert exc.value.line_no == 2
    with pytest.raises(ParseError):
        parse_kernel_log("\n\n")


def test_links_limited_by_a_gen4_switch_on_h100s(public) -> None:
    facts = parse("pcie-bandwidth", public("dmesg_limited-by_8x-h100_mle.txt"))
    assert facts.elided is True and len(facts.limited) == 2
    a = facts.links[0]
    assert (a.bdf, a.available_gbps, a.gen, a.width, a.limited_at) == (
        "0000:04:00.0", 252.048, 4, 16, "0000:01:00.0")
    assert (a.capable_gbps, a.capable_gen, a.capable_width) == (504.112, 5, 16)
    assert a.stamp.uptime_s == 10.735323


def test_a_gpu_in_a_x4_slot(public) -> None:
    (link,) = parse_pcie_bandwidth(public("dmesg_gtx-x4-limited_linux-surface374.txt")).links
    assert (link.bdf, link.width, link.capable_width, link.gen, link.line_no) == (
        "0000:02:00.0", 4, 16, 3, 7)


def test_full_bandwidth_lines_and_bad_ones() -> None:
    ok = parse_pcie_bandwidth("[ 1.0] pci 0000:17:00.0: 504.112 Gb/s available PCIe bandwidth "
                              "(32.0 GT/s PCIe x16 link)\n")
    assert ok.limited == [] and ok.links[0].gen == 5
    with pytest.raises(ParseError) as exc:
        parse_pcie_bandwidth("x\npci 0000:17:00.0: lots of available PCIe bandwidth\n")
    assert exc.value.line_no == 2


# ------------------------------------------------ the process, the catalog, what is new

def test_a_process_the_driver_could_not_name() -> None:
    """R535+ prints `pid='<unknown>', name=<unknown>` for an Xid raised outside a process."""
    line = ("[ 812.004221] NVRM: Xid (PCI:0000:3b:00): 31, pid='<unknown>', name=<unknown>, "
            "Ch 00000010, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted")
    (e,) = parse_kernel_log(line + "\n").events
    assert (e.pid, e.process, e.bad, e.category) == (None, None, False, "application")
    assert e.message.startswith("Ch 00000010, intr 00000000. MMU Fault")
    quoted = line.replace("pid='<unknown>', name=<unknown>", "pid=4242, name='pt_main_thread'")
    (q,) = parse_kernel_log(quoted + "\n").events
    assert (q.pid, q.process) == (4242, "pt_main_thread")
    unnamed = line.replace("pid='<unknown>', name=<unknown>", "pid=<unknown>, name=python3")
    (u,) = parse_kernel_log(unnamed + "\n").events
    assert (u.pid, u.process) == (None, "python3")
    # a desktop's X server: only the quotes come off a name
    xorg = line.replace("pid='<unknown>', name=<unknown>", "pid=1377, name=Xorg")
    assert parse_kernel_log(xorg + "\n").events[0].process == "Xorg"


def test_an_xid_the_catalog_does_not_list_is_not_called_bad() -> None:
    text = ("[ 90.1] NVRM: Xid (PCI:0000:01:00): 154, pid=1, name=nvidia-smi, GPU recovery action "
            "changed from 0x0 (None) to 0x1 (GPU Reset Required)\n"
            "[ 91.2] NVRM: Xid (PCI:0000:01:00): 45, pid=7, name=python3, Ch 00000001 caused "
            "by previous Xid 154\n")
    new, cleanup = parse_kernel_log(text).events
    assert (new.xid, new.meaning, new.category, new.bad, new.caused_by) == (
        154, None, None, False, None)
    assert (cleanup.xid, cleanup.caused_by, cleanup.bad, cleanup.category) == (
        45, 154, False, "application")


def test_an_xid_line_cut_after_its_number_has_an_empty_message(public) -> None:
    line = public("xid79-quoted_nvsentinel155.txt").splitlines()[0].split(",")[0]
    (e,) = parse_kernel_log(line + "\n").events
    assert (e.xid, e.pci, e.message, e.pid, e.process) == (79, "0000:44:00", "", None, None)


def test_the_error_and_its_cause_both_name_the_line() -> None:
    bad = "[ 2.0] NVRM: Xid 79 GPU fell off"
    with pytest.raises(ParseError) as exc:
        parse_kernel_log("[ 1.0] ok\n" + bad + "\n", source="dmesg.txt")
    what = ("an `NVRM: Xid` line without `Xid (PCI:<bus id>): <number>`\n"
            "  line: '[ 2.0] NVRM: Xid 79 GPU fell off'")
    err, cause = exc.value, exc.value.__cause__
    assert (err.kind, err.what, err.line_no, err.line, err.source) == (
        "xid", "cannot parse xid output at dmesg.txt:2: " + what, 2, bad, "dmesg.txt")
    assert isinstance(cause, ParseError)
    assert (cause.kind, cause.what, cause.line_no, cause.line) == (
        "xid", "cannot parse xid output at <text>:2: " + what, 2, bad)


def test_new_since_by_seconds_since_boot_when_both_reads_have_them() -> None:
    before = parse_kernel_log((H200 / "dmesg.txt").read_text())
    # an Xid stamped before the first read ended is not new, whatever its text
    early = XID79.replace("[ 4242.125001]", "[    2.000000]")
    after = parse_kernel_log((H200 / "dmesg.txt").read_text() + early + "\n" + XID79 + "\n")
    assert [e.stamp.uptime_s for e in after.new_since(before)] == [4242.125001]
    # the first read had no seconds since boot (journalctl -k): compared by text
    journal = parse_kernel_log("kernel: NVRM: Persistence mode is deprecated\n")
    assert journal.last_uptime_s is None
    assert [e.line for e in after.new_since(journal)] == [early, XID79]


def test_new_since_by_text_counts_repeated_lines() -> None:
    line = "kernel: NVRM: Xid (PCI:0000:01:00): 63, pid=1, Row Remapper"
    other = "kernel: NVRM: Xid (PCI:0000:01:00): 94, pid=1, Contained: SM"
    twice = parse_kernel_log(f"{line}\n{line}\n")
    grown = parse_kernel_log(f"{line}\n{other}\n{line}\n{line}\n")
    new = grown.new_since(twice)
    assert [(e.line_no, e.xid, e.line) for e in new] == [(2, 94, other), (4, 63, line)]


# ------------------------------------------------ the reading loops themselves

def test_empty_logs_are_refused_by_name() -> None:
    for func, kind in ((parse_kernel_log, "xid"), (parse_pcie_bandwidth, "pcie-bandwidth")):
        with pytest.raises(ParseError) as exc:
            func(" \n\n", source="dmesg.txt")
        assert (exc.value.kind, exc.value.what, exc.value.source) == (
            kind, f"cannot parse {kind} output at dmesg.txt: empty output", "dmesg.txt")


def test_a_cut_log_says_so_and_a_whole_one_does_not(public) -> None:
    whole = (H200 / "dmesg.txt").read_text()
    assert parse_kernel_log(whole).elided is False
    lines = whole.splitlines()
    cut = parse_kernel_log("\n".join(lines[:10] + ["[...]"] + lines[40:]) + "\n" + XID79 + "\n")
    assert (cut.elided, cut.lines, [e.line_no for e in cut.events]) == (True, 22, [22])
    ok = "[ 1.0] pci 0000:17:00.0: 504.112 Gb/s available PCIe bandwidth (32.0 GT/s PCIe x16 link)"
    assert parse_pcie_bandwidth(ok + "\n").elided is False


def test_the_latest_stamp_is_the_largest_not_the_last_line() -> None:
    facts = parse_kernel_log("[ 5.000000] a\n[ 3.000000] b\nno stamp\n")
    assert facts.last_uptime_s == 5.0
    assert parse_kernel_log("kernel: no stamp\n").last_uptime_s is None


def test_a_gpu_fallen_off_the_bus_is_named_within_three_lines(public) -> None:
    head = "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0\n"
    tail = "               NVRM: fallen off the bus and is not responding to commands.\n"
    for between, pci, line_no in ((2, "0000:b3:00", 1), (3, None, 5)):
        text = head + "               NVRM: (PCI ID: 10de:26b5) installed\n" * between + tail
        (b,) = parse_kernel_log(text).fallen_off_bus
        assert (b.pci, b.line_no) == (pci, line_no)
    # the message names its GPU once: a second message later names none
    twice = parse_kernel_log(public("dmesg_fallen-off-bus-no-xid_nvsentinel155.txt") + tail)
    assert [(b.pci, b.line_no) for b in twice.fallen_off_bus] == [("0000:b3:00", 1), (None, 6)]


def test_full_bandwidth_lines_whole_and_every_line_read() -> None:
    full = ("[ 1.0] pci 0000:17:00.0: 504.112 Gb/s available PCIe bandwidth (32.0 GT/s PCIe x16 "
            "link)\n[ 2.5] pci 0000:18:00.0: 126.028 Gb/s available PCIe bandwidth (8.0 GT/s "
            "PCIe x16 link)\n")
    facts = parse_pcie_bandwidth(full)
    assert [x.model_dump() for x in facts.links] == [
        {"line_no": 1, "bdf": "0000:17:00.0", "available_gbps": 504.112, "speed_gts": 32.0,
         "width": 16, "gen": 5, "limited": False, "limited_at": None, "capable_gbps": None,
         "capable_speed_gts": None, "capable_width": None, "capable_gen": None,
         "stamp": {"raw": "[ 1.0]", "uptime_s": 1.0}},
        {"line_no": 2, "bdf": "0000:18:00.0", "available_gbps": 126.028, "speed_gts": 8.0,
         "width": 16, "gen": 3, "limited": False, "limited_at": None, "capable_gbps": None,
         "capable_speed_gts": None, "capable_width": None, "capable_gen": None,
         "stamp": {"raw": "[ 2.5]", "uptime_s": 2.5}}]
    assert facts.lines == 2


def test_a_limited_link_whole(public) -> None:
    a = parse_pcie_bandwidth(public("dmesg_limited-by_8x-h100_mle.txt")).links[0]
    assert a.model_dump() == {
        "line_no": 1, "bdf": "0000:04:00.0", "available_gbps": 252.048, "speed_gts": 16.0,
        "width": 16, "gen": 4, "limited": True, "limited_at": "0000:01:00.0",
        "capable_gbps": 504.112, "capable_speed_gts": 32.0, "capable_width": 16,
        "capable_gen": 5, "stamp": {"raw": "[   10.735323]", "uptime_s": 10.735323}}


def test_a_bandwidth_line_out_of_layout_names_its_line() -> None:
    bad = "pci 0000:17:00.0: lots of available PCIe bandwidth"
    with pytest.raises(ParseError) as exc:
        parse_pcie_bandwidth("x\n" + bad + "\n", source="dmesg.txt")
    assert (exc.value.kind, exc.value.what, exc.value.line_no, exc.value.line,
            exc.value.source) == (
        "pcie-bandwidth", "cannot parse pcie-bandwidth output at dmesg.txt:2: an `available PCIe "
        f"bandwidth` line not in the kernel's layout\n  line: {bad!r}", 2, bad, "dmesg.txt")


def test_an_empty_journal_is_a_log_without_events() -> None:
    """`journalctl -k` on a node whose journal holds nothing prints `-- No entries --`: its
    own line, so a log with no event, not a file refused for lacking the kernel's shape (the
    health step reads it before and after the load)."""
    facts = parse_kernel_log("-- No entries --\n", source="journalctl-k")
    assert facts.events == [] and facts.fallen_off_bus == []
    with pytest.raises(ParseError, match="not a kernel log"):
        parse_kernel_log("-- a note --\n", source="notes.md")
