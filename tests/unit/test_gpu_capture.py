"""What gpuvet itself produced on a 2 x H200 host, judged again here."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from collectdoc import inventory

from orchestrator import parsers
from orchestrator.parsers._nccl_common import NcclTestsRun
from orchestrator.steps.nccl.judge import Series, judge_series
from orchestrator.steps.preflight.step import judge_document
from orchestrator.store import Run
from orchestrator.suite import Suite

CAP = Path(__file__).resolve().parents[1] / "fixtures" / "h200x2-gpuvet"


def run_in(tmp_path: Path) -> Run:
    suite = Suite()
    return Run.create(tmp_path, command="test", suite_hash=suite.hash,
                      suite=suite.model_dump(mode="json"), inventory_path=None)


def parse(name: str) -> NcclTestsRun:
    res = parsers.parse("nccl-tests", (CAP / name).read_text(), source=name)
    assert isinstance(res, NcclTestsRun)
    return res


def test_preflight_document_of_the_whole_host_passes_its_order() -> None:
    doc = json.loads((CAP / "collect_h200-host.json").read_text())
    inv = inventory({"gpu_model": "H200", "gpus_per_node": 2, "memory_per_gpu_gb": 139,
                     "form_factor": "sxm", "interconnect": "nvlink"})
    report = judge_document(doc, inv.nodes[0], inv, "r", None)
    by = {f.code: f for f in report.findings}
    assert not [f for f in report.findings if f.severity == "FAIL"], report.findings
    assert by["INTERCONNECT"].message == "every GPU pair on NVLink (NV18)"
    assert by["TORCH_SEES_GPUS"].severity == "PASS" and "sees 2 GPU(s)" in by["TORCH_SEES_GPUS"].message
    assert by["BUILD_TOOLS"].severity == "PASS"
    assert doc["duration_s"] < 30  # one round trip, seconds


def test_simulated_node_sees_its_one_gpu() -> None:
    doc = json.loads((CAP / "collect_sim-a.json").read_text())
    assert doc["env"]["CUDA_VISIBLE_DEVICES"] == "0"
    inv = inventory({"gpu_model": "H200"})
    sim = inv.nodes[0].model_copy(update={"env": {"CUDA_VISIBLE_DEVICES": "0",
                                                  "NCCL_HOSTID": "sim-a"}})
    codes = {f.code: f.severity for f in judge_document(doc, sim, inv, "r", None).findings}
    assert codes["TORCH_SEES_GPUS"] == "PASS" and "FAIL" not in codes.values()


def test_single_node_rounds_are_the_raw_numbers(tmp_path: Path) -> None:
    logs = [(r, CAP / f"single_4G_g2_round{r}.log", False) for r in (1, 2, 3)]
    inv = inventory({"gpu_model": "H200", "gpus_per_node": 2})
    findings, ms = judge_series(Series("single", inv.nodes, logs), run_in(tmp_path), inv, Suite())
    top = [m.value for m in ms if m.metric == "busbw" and m.size == 4 << 30
           and not m.inplace]
    raw = [float(line.split()[7]) for r in (1, 2, 3)
           for line in (CAP / f"single_4G_g2_round{r}.log").read_text().splitlines()
           if line.strip().startswith("4294967296 ")]
    assert top == raw and len(raw) == 3
    assert 340 < statistics.median(raw) < 352
    by = {f.code: f for f in findings}
    assert by["NCCL_REFERENCE"].severity == "PASS"
    assert "transports: P2P" in by["NCCL_TRANSPORTS"].message
    assert not [f for f in findings if f.severity in ("WARN", "FAIL")], findings


def test_json_output_agrees_with_the_text_log() -> None:
    text = parse("single_4G_g2_round1.log")
    js = parsers.parse("nccl-tests-json", (CAP / "single_4G_g2_round1.json").read_text())
    assert isinstance(js, NcclTestsRun)
    # the JSON keeps full precision, the text rounds to two decimals
    assert [r.size_bytes for r in js.rows] == [r.size_bytes for r in text.rows]
    for a, b in zip(js.rows, text.rows, strict=True):
        assert abs(a.out_of_place.busbw_gbs - b.out_of_place.busbw_gbs) <= 0.005 + 1e-9
    env = json.loads((CAP / "single_4G_g2_round1.json").read_text())["env"]
    assert all(e.split("=")[0].startswith(("NCCL_", "CUDA_", "NVIDIA_", "OMPI_", "PMIX_", "TORCH_",
                                           "GLOO_", "UCX_")) or e.split("=")[0] in
               ("PATH", "LD_LIBRARY_PATH") for e in env)


def test_torch_benchmark_agrees_with_nccl_tests_within_5_percent() -> None:
    nccl = [parse(f"single_4G_g2_round{r}.log") for r in (1, 2, 3)]
    torch = parse("torch_single_4G_g2.log")
    big = [row for row in torch.rows if row.size_bytes >= 256 << 20]
    assert len(big) == 5
    for row in big:
        ref = statistics.median(r.out_of_place.busbw_gbs for run in nccl for r in run.rows
                                if r.size_bytes == row.size_bytes)
        assert abs(row.out_of_place.busbw_gbs - ref) / ref < 0.05, (row.size_bytes, ref)


def test_two_simulated_nodes_talk_over_sockets(tmp_path: Path) -> None:
    logs = [(r, CAP / f"multi_sim2node_socket_round{r}.log", False) for r in (1, 2, 3)]
    ib = inventory({"fabric": {"type": "ib"}}, nodes=("sim-a", "sim-b"))
    findings, _ = judge_series(Series("multi", ib.nodes, logs), run_in(tmp_path), ib, Suite())
    by = {f.code: f for f in findings}
    assert "2 rank(s) on 2 node(s), transports: NET/Socket" in by["NCCL_TRANSPORTS"].message
    assert by["NCCL_SOCKET_FALLBACK"].severity == "FAIL"
    plain = inventory({}, nodes=("sim-a", "sim-b"))
    findings, _ = judge_series(Series("multi", plain.nodes, logs), run_in(tmp_path / "b"), plain,
                               Suite())
    assert not [f for f in findings if f.severity == "FAIL"]
    torch = parse("torch_multi_sim2node.log")
    assert len(torch.ranks) == 2 and torch.rows[-1].size_bytes == 128 << 20
