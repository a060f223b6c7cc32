"""The judgement shared by the steps, used the way a step other than training uses it:
a sink of its own (scope, engine, label, a node or a provider), telemetry rules with
its own codes and words. The training step's use is covered by test_train_judge.py
and test_train_h200_capture.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.judging.sink import Sink, combined
from orchestrator.judging.telemetry import NodeTelemetry, TelemetryRules, judge_window

RULES = TelemetryRules(idle_util_pct=10.0, power_violation_pct=5.0, prefix="HEALTH",
                       during="under load", span="the stress test", more="stress for longer")


def sink(root: Path, node: str | None = "n1", label: str = "stress") -> Sink:
    return Sink("run-1", "health", "hash-1", "p", node, ["n1", "n2"], label,
                lambda p: str(p.relative_to(root)), scope="single", engine="health")


def test_the_sink_stamps_its_subject_and_keeps_the_evidence_that_exists(tmp_path: Path) -> None:
    (tmp_path / "out.txt").write_text("x")
    s = sink(tmp_path)
    f = s.add("HEALTH_X", "WARN", "something", [tmp_path / "out.txt", tmp_path / "gone.txt"],
              gpu=3)
    assert f is s.findings[0]
    assert (f.run_id, f.step, f.provider, f.node, f.scope) == ("run-1", "health", "p", "n1",
                                                                "node")
    assert f.message == "[stress] something"
    assert f.evidence == ["out.txt"] and f.details == {"gpu": 3}
    m = s.measure("busbw", 7, "GB/s", size=8)
    assert (m.scope, m.engine, m.suite_hash, m.nodes, m.step) == ("single", "health", "hash-1",
                                                                   ["n1", "n2"], "health")
    assert m.value == 7.0 and isinstance(m.value, float) and m.tags == {"size": 8}


def test_a_provider_subject_without_a_label(tmp_path: Path) -> None:
    s = sink(tmp_path, node=None, label="")
    f = s.add("FLEET_X", "INFO", "all pairs")
    assert (f.scope, f.node, f.message, f.evidence) == ("provider", None, "all pairs", [])


def test_the_unit_result_is_what_was_recorded_then(tmp_path: Path) -> None:
    a, b = sink(tmp_path), sink(tmp_path, node="n2")
    a.measure("t", 1, "s")
    a.measure("t", 2, "s")
    b.add("B", "PASS", "b")
    a.add("A", "PASS", "a")
    assert a.last("t") == 2.0 and a.last("other") is None
    res = a.result({"nodes": ["n1"]})
    a.add("LATER", "INFO", "after the result")
    assert [f.code for f in res.findings] == ["A"] and res.summary == {"nodes": ["n1"]}
    both = combined([b, a], {"k": 1})
    assert [f.code for f in both.findings] == ["B", "A", "LATER"]
    assert [m.value for m in both.measurements] == [1.0, 2.0] and both.summary == {"k": 1}


def dmon(sm: int, pviol_at: int | None = None, samples: int = 14) -> str:
    """GPU 0 at `sm` % SM, one sample a second from 12:00:00, the power-violation
    column at 40 % in sample `pviol_at` (file line pviol_at + 3)."""
    return ("#Time        gpu    pwr  gtemp     sm   pclk   mclk  pviol  tviol\n"
            "#HH:MM:SS    Idx      W      C      %    MHz    MHz      %   bool\n"
            + "".join(f"12:00:{k:02d}      0    690     71     {sm}   1980   3201      "
                      f"{40 if k == pviol_at else 0}      0\n" for k in range(samples)))


def node(root: Path, text: str | None, **doc: object) -> NodeTelemetry:
    folder = root / "n1"
    folder.mkdir(exist_ok=True)
    tele: dict[str, object] = {"source": "dmon", "file": "dmon.txt", "started": 1000.0,
                               "interval_s": 1, "note": None, **doc}
    if text is not None:
        (folder / "dmon.txt").write_text(text)
    (folder / "sampler.json").write_text(json.dumps(tele))
    return NodeTelemetry("n1", tele, folder, folder / "sampler.json")


def test_another_step_gets_its_own_codes_and_words(tmp_path: Path) -> None:
    s = sink(tmp_path)
    # samples at 1000..1013 s; the window 1003..1008 with a second of slack holds 1002..1009
    judge_window(s, RULES, [node(tmp_path, dmon(3, pviol_at=4))], 1003.0, 1008.0)
    by = {f.code: f for f in s.findings}
    assert set(by) == {"HEALTH_GPU_IDLE", "HEALTH_THROTTLED"}
    assert by["HEALTH_GPU_IDLE"].message == ("[stress] n1 GPU 0: SM utilisation 3% "
                                             "(median of 8 samples under load)")
    assert by["HEALTH_THROTTLED"].message == ("[stress] n1 GPU 0: throttled in 1 of 8 samples "
                                              "under load (pviol, line 7)")
    assert by["HEALTH_THROTTLED"].evidence == ["n1/dmon.txt"]
    util = [m for m in s.measurements if m.metric == "gpu_util_pct"]
    assert [(m.value, m.tags) for m in util] == [
        (3.0, {"stat": "median", "node": "n1", "gpu": 0, "samples": 8})]


def test_a_short_window_and_no_idle_verdict(tmp_path: Path) -> None:
    s = sink(tmp_path)
    judge_window(s, RULES, [node(tmp_path, dmon(3))], 1004.0, 1005.0)  # 4 samples
    [f] = s.findings
    assert f.code == "HEALTH_TELEMETRY_SHORT" and f.message.endswith(
        "over only 4 sample(s) under load: too few to call the GPU idle (at least 5; "
        "stress for longer)")
    off = sink(tmp_path)
    judge_window(off, TelemetryRules(idle_util_pct=0, power_violation_pct=5.0, prefix="FLEET"),
                 [node(tmp_path, dmon(0))], 1000.0, 1013.0)
    assert off.findings == [] and off.last("gpu_util_pct") == 0.0


def test_a_window_outside_the_samples(tmp_path: Path) -> None:
    s = sink(tmp_path)
    judge_window(s, RULES, [node(tmp_path, dmon(90))], 2000.0, 2010.0)
    [f] = s.findings
    assert (f.code, f.severity) == ("HEALTH_TELEMETRY_SHORT", "INFO")
    assert "none of 14 telemetry samples fell inside the stress test" in f.message
    assert s.measurements == []


@pytest.mark.parametrize("text,doc,code,evidence", [
    (None, {"source": None, "file": None, "note": "dmon exited with 3"}, "HEALTH_NO_TELEMETRY",
     ["n1/sampler.json"]),
    ("this is not dmon output\n", {}, "HEALTH_TELEMETRY_UNREADABLE", ["n1/dmon.txt"]),
    (None, {}, "HEALTH_TELEMETRY_UNREADABLE", []),  # the file it names is missing
])
def test_no_telemetry_or_none_that_can_be_read(tmp_path: Path, text: str | None,
                                               doc: dict[str, object], code: str,
                                               evidence: list[str]) -> None:
    s = sink(tmp_path)
    judge_window(s, RULES, [node(tmp_path, text, **doc)], 1000.0, 1013.0)
    [f] = s.findings
    assert (f.code, f.evidence) == (code, evidence)
    if code == "HEALTH_NO_TELEMETRY":
        assert f.message == "[stress] n1: dmon exited with 3" and f.details == {
            "node_of_sample": "n1"}


def probe_doc(fstype: str, model: str | None = None, real: str = "/ck") -> dict[str, object]:
    return {"ckpt_dir": "/ck", "block_model": model,
            "path": {"realpath": real, "mount": {"fstype": fstype, "source": "/dev/x",
                                                 "mount_point": "/"}}}


@pytest.mark.parametrize("doc,reason", [
    (probe_doc("squashfs"), "ephemeral-fs"),
    (probe_doc("ext4", real="/dev/shm/ck"), "scratch-path"),
    (probe_doc("ext4", real="/ephemeral0/ck"), "scratch-path"),
    (probe_doc("ext4", real="/mnt/local_disk1/ck"), "scratch-path"),
    (probe_doc("ext4", real="/nvme2/ck"), "scratch-path"),
    (probe_doc("ext4", real="/runner/ck"), None),  # /run is scratch, /runner is not
    (probe_doc("xfs", "Amazon EC2 NVMe Instance Storage"), "instance-store"),
    (probe_doc("ext4", "Virtual_Disk EphemeralDisk"), "instance-store"),
    (probe_doc("ext4", "nvme_card0"), "instance-store"),  # a GCE local SSD
    (probe_doc("ext4", "PersistentDisk"), None),
])
def test_where_a_checkpoint_would_not_survive(tmp_path: Path, doc: dict[str, object],
                                              reason: str | None) -> None:
    from orchestrator.judging.storage import storage_findings

    probe = tmp_path / "probe.json"
    probe.write_text("{}")
    s = sink(tmp_path)
    storage_findings(s, "n1", doc, probe, configured=True)
    assert [f.details["reason"] for f in s.findings] == ([reason] if reason else [])
    assert all(f.code == "CKPT_NOT_PERSISTENT" and f.evidence == ["probe.json"]
               for f in s.findings)
