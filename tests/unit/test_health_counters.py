"""The health step's before/after counters on real reads (a 1 x H200 and a 2 x H200
host) and what grows between two reads: planted ECC errors, a remap pending, PCIe
replays, NVLink CRC errors, a new Xid 79 after the load, a GPU gone."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.steps.health.counters import delta, read_snapshot, snapshot_from

FIX = Path(__file__).resolve().parents[1] / "fixtures"
H1 = FIX / "h200x1-health"
H2 = FIX / "h200x2" / "commands"
XID79 = ("[ 4242.125001] NVRM: Xid (PCI:0000:00:06): 79, pid=2211, name=python3, "
         "GPU has fallen off the bus.\n")


def _h1() -> dict[str, str]:
    return {"query-gpu": (H1 / "query-health.csv").read_text(),
            "nvlink-e": (H1 / "nvlink-e.txt").read_text(),
            "compute-apps": (H1 / "compute-apps.csv").read_text(),
            "dmesg": (H1 / "dmesg.txt").read_text()}


def _h2() -> dict[str, str]:
    return {"query-gpu": (H2 / "query-gpu.csv").read_text(),
            "nvidia-smi-q": (H2 / "nvidia-smi-q.xml").read_text()}


def test_the_h200_hosts_read_clean() -> None:
    snap = snapshot_from(_h1())
    (g,) = snap.gpus.values()
    assert g.key == "0" and g.uuid is None  # that query asked for no UUID
    assert (g.ecc_uncorrected_volatile, g.ecc_corrected_volatile, g.ecc_uncorrected_aggregate) == (
        0, 0, 0)
    assert (g.remapped_pending, g.remapped_failure, g.retired_pending) == (False, False, None)
    assert (g.pcie_gen, g.pcie_width, g.power_limit_w, g.memory_total_mib) == (5, 16, 700.0,
                                                                               143771)
    assert g.clock_reasons == ()
    assert snap.nvlink is not None and snap.nvlink.empty
    assert snap.apps is not None and snap.apps.apps == []
    assert snap.kernel["dmesg"].events == []
    two = snapshot_from(_h2())
    assert sorted((g.bus_id, g.replays) for g in two.gpus.values()) == [
        ("00000000:00:06.0", 0), ("00000000:00:07.0", 2)]
    assert {g.clock_reasons for g in two.gpus.values()} == {("GpuIdle",)}


def test_two_identical_reads_change_nothing() -> None:
    d = delta(snapshot_from(_h1()), snapshot_from(_h1()))
    (g,) = d.gpus.values()
    assert (g.ecc_uncorrected_volatile, g.ecc_corrected_volatile, g.replays) == (0, 0, None)
    assert not (g.new_remap_pending or g.new_remap_failure or g.new_retired_pending)
    assert g.nvlink == {} and d.new_xids == [] and d.kernel_log == "dmesg"
    assert d.missing_after == []


def test_planted_faults_between_the_reads() -> None:
    before = _h1()
    after = dict(before)
    # one uncorrectable and three corrected ECC errors, a row remap pending, a new Xid 79
    after["query-gpu"] = before["query-gpu"].replace("0, 0, 0, 0, [N/A], No, No,",
                                                     "0, 1, 3, 1, [N/A], Yes, No,")
    after["dmesg"] = before["dmesg"] + XID79
    d = delta(snapshot_from(before), snapshot_from(after))
    (g,) = d.gpus.values()
    assert (g.ecc_uncorrected_volatile, g.ecc_corrected_volatile) == (1, 3)
    assert g.ecc_uncorrected_aggregate == 1 and g.new_remap_pending and not g.new_remap_failure
    (x,) = d.new_xids
    assert (x.xid, x.pci, x.bad, x.process) == (79, "0000:00:06", True, "python3")


def test_replays_and_nvlink_errors_that_grow() -> None:
    before, after = _h2(), _h2()
    after["nvidia-smi-q"] = after["nvidia-smi-q"].replace("<replay_counter>2</replay_counter>",
                                                          "<replay_counter>9</replay_counter>")
    link = ("GPU {i}: NVIDIA H200 (UUID: GPU-00000000-1111-2222-3333-00000000000{i})\n"
            "\t Link 0: Replay Errors: 0\n\t Link 0: Recovery Errors: 0\n"
            "\t Link 0: CRC Errors: {crc}\n")
    before["nvlink-e"] = link.format(i=0, crc=0) + link.format(i=1, crc=5)
    after["nvlink-e"] = link.format(i=0, crc=4) + link.format(i=1, crc=5)
    d = delta(snapshot_from(before), snapshot_from(after))
    g0 = d.gpus["GPU-00000000-1111-2222-3333-000000000000"]
    g1 = d.gpus["GPU-00000000-1111-2222-3333-000000000001"]
    assert (g0.replays, g1.replays) == (0, 7)
    assert g0.nvlink == {"0/CRC Errors": 4} and g1.nvlink == {}


def test_a_gpu_gone_after_and_an_unreadable_log() -> None:
    before, after = _h2(), _h2()
    after["query-gpu"] = "\n".join(after["query-gpu"].splitlines()[:2]) + "\n"
    d = delta(snapshot_from(before), snapshot_from(after))
    assert d.missing_after == ["GPU-00000000-1111-2222-3333-000000000001"]
    assert d.kernel_log is None and d.new_xids == []  # no log: no claim
    # a log read only after the load is compared with nothing: no Xid is called new
    after_only = _h1()
    before_without = {k: v for k, v in after_only.items() if k != "dmesg"}
    after_only["dmesg"] += XID79
    d = delta(snapshot_from(before_without), snapshot_from(after_only))
    assert d.kernel_log is None and d.new_xids == []


def test_a_payload_folder_is_read_with_what_it_could_not_read(tmp_path: Path) -> None:
    folder = tmp_path / "counters" / "before"
    folder.mkdir(parents=True)
    (folder / "dmesg.txt").write_text((H1 / "dmesg.txt").read_text())
    (folder / "query-gpu.csv").write_text((H1 / "query-health.csv").read_text())
    (folder / "journalctl-k.txt").write_text("")
    index = {
        "dmesg": {"readable": True, "file": "counters/before/dmesg.txt", "rc": 0},
        "query-gpu": {"readable": True, "file": "counters/before/query-gpu.csv", "rc": 0},
        "journalctl-k": {"readable": False, "file": "counters/before/journalctl-k.txt",
                         "rc": None, "note": "not readable: journalctl not found"},
        "nvlink-e": {"readable": False, "skipped": True, "note": "device cpu", "file": None},
    }
    (folder / "index.json").write_text(json.dumps(index))
    snap = read_snapshot(folder)
    assert set(snap.kernel) == {"dmesg"} and len(snap.gpus) == 1
    assert snap.unreadable == {"journalctl-k": "not readable: journalctl not found",
                               "nvlink-e": "device cpu"}
