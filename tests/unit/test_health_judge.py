"""The health judge on an H200 node's output built from real captures (healthy: only
PASS and INFO) and on every fault the issue plants: a copy at 0.7 of the variant's
bandwidth, sustained/burst 0.75 with thermal slowdown, one flipped element, a new
Xid 79, a leftover process, an NV# pair at PCIe speed, a Gen3 x8 link on a Gen4 x16
order; and FP8 on an A100, the memory test, dcgmi, an unreadable kernel log, a node
without a GPU and hostile documents."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.errors import StepError
from orchestrator.inventory.model import Expectations
from orchestrator.judging.sink import Sink
from orchestrator.records import Finding
from orchestrator.steps.health.judge import judge_node
from orchestrator.steps.health.output import read_output
from tests.unit.healthnode import FIX, H1, REF, two_gpu_links, write_node


def _judge(folder: Path, expect: Expectations | None = None) -> Sink:
    sink = Sink(run_id="r1", step="health", suite_hash="s", provider="p", node="n1",
                nodes=["n1"], label="", rel=lambda p: str(p), scope="health", engine="health")
    judge_node(sink, read_output(folder, "n1"), expect or Expectations(gpu_model="H200"))
    return sink


def _codes(sink: Sink, severity: str | None = None) -> list[str]:
    return [f.code for f in sink.findings if severity is None or f.severity == severity]


def _one(sink: Sink, code: str, severity: str) -> Finding:
    got = [f for f in sink.findings if f.code == code and f.severity == severity]
    assert got, [(f.code, f.severity, f.message) for f in sink.findings]
    return got[0]


def _not_bad(sink: Sink) -> None:
    bad = [(f.code, f.severity, f.message) for f in sink.findings
           if f.severity in ("WARN", "FAIL")]
    assert not bad, bad


def test_the_h200_reference_figures_judge_healthy(tmp_path: Path) -> None:
    sink = _judge(write_node(tmp_path / "n"))
    _not_bad(sink)
    assert {"HEALTH_MEMBW", "HEALTH_MATMUL", "HEALTH_SUSTAINED", "GPU_SDC", "GPU_MEMTEST",
            "HEALTH_PCIE"} <= set(_codes(sink, "PASS"))
    v = _one(sink, "HEALTH_VARIANT", "INFO")
    assert v.details["variant"] == "H200 SXM" and "measures like H200 SXM" in v.message
    # the achievable fractions were measured on this variant: no stand-in to own up to
    membw = [f for f in sink.findings if f.code == "HEALTH_MEMBW"]
    assert membw and all(f.details["achievable_measured"] and "no achievable fraction" not in
                         f.message for f in membw)
    metrics = {m.metric for m in sink.measurements}
    assert {"health.membw.copy_gbps", "health.membw.read_gbps", "health.matmul.bf16_tflops",
            "health.sustained.tflops", "health.sustained.ratio", "health.pcie.h2d_gbps",
            "health.pcie.d2h_gbps"} <= metrics
    copy = next(m for m in sink.measurements if m.metric == "health.membw.copy_gbps")
    assert copy.value == pytest.approx(REF["copy_2GiB_GBps"]) and copy.tags["gpu"] == "0"
    assert copy.scope == "health"


def test_a_copy_at_0_7_of_the_bandwidth_fails(tmp_path: Path) -> None:
    slow = 0.7 * 4800
    sink = _judge(write_node(tmp_path / "n", phases=[{"memcopy": {"values": {
        "copy_gbps": slow}}}]))
    f = _one(sink, "HEALTH_MEMBW", "FAIL")
    assert f.details["measure"] == "copy" and f.details["ratio"] < 0.85
    assert "3360.0 GB/s" in f.message and "H200" in f.message


def test_a_copy_a_little_slow_warns(tmp_path: Path) -> None:
    sink = _judge(write_node(tmp_path / "n", phases=[{"memcopy": {"values": {
        "copy_gbps": 0.9 * REF["copy_2GiB_GBps"]}}}]))
    _one(sink, "HEALTH_MEMBW", "WARN")
    assert "FAIL" not in [f.severity for f in sink.findings if f.code == "HEALTH_MEMBW"]


THERMAL_CSV = ("timestamp, index, power.draw [W], temperature.gpu, temperature.memory, "
               "clocks.current.sm [MHz], clocks.current.memory [MHz], utilization.gpu [%], "
               "clocks_event_reasons.active\n"
               + "".join(f"2026/12/01 20:00:{s:02d}.000, 0, 690.00 W, 93, 88, 1410 MHz, "
                         f"3201 MHz, 100 %, 0x0000000000000060\n" for s in range(10)))


def test_sustained_at_0_75_of_burst_with_thermal_slowdown_fails(tmp_path: Path) -> None:
    burst = REF["mm_bf16_TFLOPs"]
    sink = _judge(write_node(tmp_path / "n", reasons_csv=THERMAL_CSV, phases=[{"sustained": {
        "values": {"tflops": 0.75 * burst, "ratio_to_burst": 0.75}}}]))
    f = _one(sink, "HEALTH_SUSTAINED", "FAIL")
    assert f.details["thermal"] is True
    assert "SwThermalSlowdown" in f.message and "HwThermalSlowdown" in f.message


def test_sustained_drop_at_the_power_cap_only_warns(tmp_path: Path) -> None:
    csv = THERMAL_CSV.replace("0x0000000000000060", "0x0000000000000004")
    sink = _judge(write_node(tmp_path / "n", reasons_csv=csv, phases=[{"sustained": {
        "values": {"ratio_to_burst": 0.75}}}]))
    f = _one(sink, "HEALTH_SUSTAINED", "WARN")
    assert f.details["reasons"] == ["SwPowerCap"]


def test_one_flipped_element_is_silent_data_corruption(tmp_path: Path) -> None:
    sink = _judge(write_node(tmp_path / "n", phases=[{"matmul": {"values": {
        "bf16_repeat_mismatches": 1}}}]))
    f = _one(sink, "GPU_SDC", "FAIL")
    assert f.details == {"gpu": "0", "bf16_repeat_mismatches": 1}
    assert "silent data corruption" in f.message


def test_a_row_sum_off_and_an_unequal_copy_are_sdc(tmp_path: Path) -> None:
    sink = _judge(write_node(tmp_path / "n", phases=[{"matmul": {"values": {
        "fp16_rows_bad": 1}}, "memcopy": {"check": {"copy_equal": False}}}]))
    f = _one(sink, "GPU_SDC", "FAIL")
    assert f.details["fp16_rows_bad"] == 1 and f.details["copy_unequal"] == 1


def test_a_new_xid_79_fails_with_its_log_line(tmp_path: Path) -> None:
    line = "[ 5123.456789] NVRM: Xid (PCI:0000:00:06): 79, pid=2211, name=python3, GPU has " \
           "fallen off the bus.\n"
    sink = _judge(write_node(tmp_path / "n", dmesg_after=line))
    f = _one(sink, "GPU_XID", "FAIL")
    assert f.details["xid"] == 79 and "fallen off the bus" in f.message
    assert any(e.endswith("after/dmesg.txt") for e in f.evidence)


def test_an_xid_already_in_the_log_before_is_not_new(tmp_path: Path) -> None:
    line = "[ 1.5] NVRM: Xid (PCI:0000:00:06): 79, GPU has fallen off the bus.\n"
    folder = write_node(tmp_path / "n", dmesg_after=line)
    for when in ("before", "after"):
        (folder / "counters" / when / "dmesg.txt").write_text(
            (H1 / "dmesg.txt").read_text() + line)
    assert "GPU_XID" not in _codes(_judge(folder))


def test_an_unreadable_kernel_log_is_info(tmp_path: Path) -> None:
    sink = _judge(write_node(tmp_path / "n", kernel_readable=False))
    f = _one(sink, "KERNEL_LOG_UNREADABLE", "INFO")
    assert "Operation not permitted" in f.message
    _not_bad(sink)


def test_new_uncorrectable_ecc_and_a_remap_pending_fail(tmp_path: Path) -> None:
    q = (H1 / "query-health.csv").read_text()
    after = q.replace("0, 0, 0, 0, [N/A], No, No,", "0, 2, 0, 2, [N/A], Yes, No,")
    assert after != q
    sink = _judge(write_node(tmp_path / "n", query_after=after))
    assert _one(sink, "GPU_ECC_UNCORRECTABLE", "FAIL").details["grew"] == 2
    assert _one(sink, "GPU_REMAP", "FAIL").details["pending"] is True


def test_a_leftover_process_is_gpu_busy(tmp_path: Path) -> None:
    apps = ("gpu_uuid, pid, process_name, used_gpu_memory [MiB]\n"
            "GPU-00000000-1111-2222-3333-000000000000, 4242, /usr/bin/python3, 61440 MiB\n")
    sink = _judge(write_node(tmp_path / "n", gpus=2, compute_apps=apps,
                             links=two_gpu_links()))
    f = _one(sink, "GPU_BUSY", "FAIL")  # 60 GiB held by another job: the GPU is not free
    assert "pid 4242" in f.message and "61440 MiB" in f.message and "GPU 0" in f.message
    assert f.details["used_mib"] == 61440
    small = apps.replace("61440 MiB", "300 MiB")
    sink = _judge(write_node(tmp_path / "m", gpus=2, compute_apps=small,
                             links=two_gpu_links()))
    assert "300 MiB" in _one(sink, "GPU_BUSY", "WARN").message


def test_an_nv_pair_at_pcie_speed_fails(tmp_path: Path) -> None:
    sink = _judge(write_node(tmp_path / "n", gpus=2, links=two_gpu_links(gbps01=52.0)))
    f = _one(sink, "HEALTH_PEER", "FAIL")
    assert (f.details["src"], f.details["dst"], f.details["topo"]) == ("0", "1", "NV18")
    assert "like PCIe" in f.message
    assert ("HEALTH_PEER", "FAIL") not in [(x.code, x.severity) for x in sink.findings
                                          if x.details.get("src") == "1"]


def test_healthy_nv18_pair_passes_and_no_peer_access_fails(tmp_path: Path) -> None:
    sink = _judge(write_node(tmp_path / "a", gpus=2, links=two_gpu_links()))
    _not_bad(sink)
    _one(sink, "HEALTH_PEER", "PASS")
    sink = _judge(write_node(tmp_path / "b", gpus=2, links=two_gpu_links(access=False)))
    assert "without peer access" in _one(sink, "HEALTH_PEER", "FAIL").message


def test_a_gen3_x8_link_on_a_gen4_x16_order_fails(tmp_path: Path) -> None:
    q = (H1 / "query-health.csv").read_text().replace("5, 5, 16, 16,", "3, 4, 8, 16,")
    slow = 7.0  # what pinned copies reach on Gen3 x8
    links = {"pcie": {"event": "done", "values": {"0_h2d_gbps": slow, "0_d2h_gbps": slow}}}
    expect = Expectations(gpu_model="H200", pcie={"min_gen": 4, "min_width": 16})
    sink = _judge(write_node(tmp_path / "n", query_before=q, links=links), expect)
    link = _one(sink, "HEALTH_PCIE_LINK", "FAIL")
    assert "Gen3 x8" in link.message and "Gen4 x16" in link.message
    bw = [f for f in sink.findings if f.code == "HEALTH_PCIE"]
    assert [f.severity for f in bw] == ["FAIL", "FAIL"]
    assert bw[0].details["gen"] == 4 and bw[0].details["width"] == 16


def test_fp8_needed_on_an_a100_fails_before_anything_else(tmp_path: Path) -> None:
    folder = write_node(tmp_path / "n", cc=(8, 0), name="NVIDIA A100-SXM4-80GB")
    sink = _judge(folder, Expectations(gpu_model="A100 80GB", needs_fp8=True))
    assert sink.findings[0].code == "GPU_NO_FP8" and sink.findings[0].severity == "FAIL"
    assert "8.0" in sink.findings[0].message
    sink = _judge(write_node(tmp_path / "h"), Expectations(gpu_model="H200", needs_fp8=True))
    assert "GPU_NO_FP8" not in _codes(sink)


def test_memory_test_mismatches_fail(tmp_path: Path) -> None:
    sink = _judge(write_node(tmp_path / "n", phases=[{"memtest": {"values": {
        "mismatches": 3, "random_mismatches": 3}, "examples": [[1024, 0, 1]]}}]))
    f = _one(sink, "GPU_MEMTEST", "FAIL")
    assert f.details["mismatches"] == 3 and f.details["patterns"] == {"random": 3}


def test_dcgmi_failure_and_absence(tmp_path: Path) -> None:
    text = (FIX / "public" / "dcgmi-diag-r2_gpu-memory-fail_mle.txt").read_text()
    sink = _judge(write_node(tmp_path / "a", dcgmi=text))
    _one(sink, "DCGM_DIAG", "FAIL")
    sink = _judge(write_node(tmp_path / "b"))
    assert "dcgmi not found" in _one(sink, "DCGM_DIAG", "INFO").message


def test_a_phase_error_fails_and_a_slow_80gb_a100_measures_like_a_40gb(tmp_path: Path) -> None:
    sink = _judge(write_node(tmp_path / "a", phases=[{"memtest": {
        "event": "error", "error": "OutOfMemoryError: CUDA out of memory", "kind": "oom"}}]))
    assert "out of memory" in _one(sink, "HEALTH_PHASE_ERROR", "FAIL").message
    # an "A100 80GB" that runs its memory at HBM2 speed
    q = (H1 / "query-health.csv").read_text().replace("700.00 W, 700.00 W, 700.00 W",
                                                        "250.00 W, 250.00 W, 250.00 W")
    q = q.replace("143771 MiB", "40960 MiB")
    sink = _judge(write_node(tmp_path / "b", query_before=q, cc=(8, 0),
                             name="NVIDIA A100 80GB PCIe", phases=[{
                                 "memcopy": {"values": {"copy_gbps": 1360.0}},
                                 "memread": {"values": {"read_gbps": 1390.0}},
                                 "matmul": {"values": {"bf16_tflops": 240.0, "fp64_tflops": 17.0,
                                                       "fp8_tflops": None}}}]),
                  Expectations(gpu_model="A100 80GB PCIe"))
    v = _one(sink, "HEALTH_VARIANT", "WARN")
    assert v.details["variant"] == "A100 40 GB PCIe" and "ordered A100 80 GB PCIe" in v.message
    # its figures are judged with the H200's fractions, and each finding says so
    judged = [f for f in sink.findings if f.code in ("HEALTH_MEMBW", "HEALTH_MATMUL")]
    assert judged and all(
        not f.details["achievable_measured"] and f.message.endswith(
            "; no achievable fraction measured on A100 80 GB PCIe yet: judged against its "
            "datasheet with the H200 SXM's)") for f in judged)


def test_a_card_the_driver_cannot_name_is_told_by_memory_and_sm_count(tmp_path: Path) -> None:
    q = (H1 / "query-health.csv").read_text().replace("143771 MiB", "81559 MiB")
    sink = _judge(write_node(tmp_path / "n", query_before=q, name="NVIDIA Graphics Device",
                             sms=132))
    v = next(f for f in sink.findings if f.code == "HEALTH_VARIANT")
    assert "reports NVIDIA Graphics Device, identified by its memory (80 GiB) and SM count " \
           "(132) as H100 SXM 80GB)" in v.message
    assert {f.details["variant"] for f in sink.findings if f.code == "HEALTH_MEMBW"} == {
        "H100 SXM"}
    # without the SM count nothing tells it: no datasheet, nothing judged against one
    sink = _judge(write_node(tmp_path / "m", query_before=q, name="NVIDIA Graphics Device"))
    assert not [f for f in sink.findings if f.code == "HEALTH_MEMBW"]


def test_a_node_without_a_gpu_says_so_and_nothing_else(tmp_path: Path) -> None:
    folder = tmp_path / "n"
    folder.mkdir()
    (folder / "health.json").write_text(json.dumps({
        "tool": "gpuvet-health", "schema": 1, "status": "no-gpu",
        "reason": "no GPU: nvidia-smi not found", "device": "cuda"}))
    sink = _judge(folder)
    assert [(f.code, f.severity) for f in sink.findings] == [("HEALTH_NO_GPU", "INFO")]
    assert "nvidia-smi not found" in sink.findings[0].message


@pytest.mark.parametrize("text", ["", "{", "[]", json.dumps({"tool": "other"}),
                                  json.dumps({"tool": "gpuvet-health", "schema": 99})])
def test_a_hostile_document_is_a_step_error(tmp_path: Path, text: str) -> None:
    (tmp_path / "health.json").write_text(text)
    with pytest.raises(StepError):
        read_output(tmp_path, "n1")


def test_broken_parts_are_absent_not_guessed(tmp_path: Path) -> None:
    folder = write_node(tmp_path / "n")
    (folder / "gpu0.jsonl").write_text((folder / "gpu0.jsonl").read_text() + '{"event": "do')
    (folder / "counters" / "after" / "index.json").write_text("{not json")
    (folder / "health.json").write_text(json.dumps({
        **json.loads((folder / "health.json").read_text()),
        "node_phases": {"dcgmi": {"event": "done", "file": "../../etc/passwd"}}}))
    sink = _judge(folder)
    assert "HEALTH_COUNTERS_UNREADABLE" in _codes(sink, "WARN")
    assert all("passwd" not in e for f in sink.findings for e in f.evidence)


STEP_CAPTURE = Path(__file__).parent.parent / "fixtures" / "h200x1-health" / "step-standard"


def test_the_captured_h200_standard_run_is_healthy_and_power_capped_is_info() -> None:
    """`gpuvet health --level standard` on a healthy one-GPU H200 (2026-12-02): every
    figure at its expectation, the 700 W cap with the SM clock at 1508 of 1980 MHz under
    the health load is the card's rated power (INFO), the variant is named."""
    sink = _judge(STEP_CAPTURE)
    _not_bad(sink)
    throttled = _one(sink, "HEALTH_THROTTLED", "INFO")
    assert "700 W" in throttled.message and "not a fault" in throttled.message
    assert _one(sink, "HEALTH_VARIANT", "INFO").details["variant"] == "H200 SXM"
    fp64 = next(m for m in sink.measurements if m.metric == "health.matmul.fp64_tflops")
    assert 55 < fp64.value < 62


def test_the_power_cap_with_the_clock_held_far_down_still_warns(tmp_path: Path) -> None:
    """The captured run with its SM clock samples halved (990 of 1980 MHz at the cap):
    the clock alone is then below what a power stress explains."""
    import shutil

    folder = tmp_path / "n"
    shutil.copytree(STEP_CAPTURE, folder)
    dmon = folder / "dmon.txt"
    lines = dmon.read_text().splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("#") and "pclk" in line)
    cols = lines[head].lstrip("#").split()
    k = cols.index("pclk")
    out = []
    for line in lines:
        parts = line.split()
        if line.startswith("#") or len(parts) != len(cols) or not parts[k].isdigit():
            out.append(line)
            continue
        parts[k] = str(int(parts[k]) // 2)
        out.append("  ".join(parts))
    dmon.write_text("\n".join(out) + "\n")
    sink = _judge(folder)
    assert _one(sink, "HEALTH_THROTTLED", "WARN")
