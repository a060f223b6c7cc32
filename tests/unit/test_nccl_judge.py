"""judge_series: nccl-tests logs in, measurements and findings out."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from orchestrator import inventory
from orchestrator.inventory import Inventory, Node
from orchestrator.records import Finding, Measurement
from orchestrator.steps.nccl.judge import Series, judge_series
from orchestrator.store import Run
from orchestrator.suite import Suite

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
H200 = FIXTURES / "h200x2" / "nccl-tests"
SAMPLES = FIXTURES / "nccl-tests"
ROUNDS = [H200 / f"all_reduce_8B-128M_g2_round{r}.log" for r in (1, 2, 3)]
SIZE_128M = 134217728
SUITE = Suite()


@pytest.fixture
def run(tmp_path: Path) -> Run:
    return Run.create(tmp_path / "results", command="test", suite_hash=SUITE.hash,
                      suite=SUITE.model_dump(mode="json"), inventory_path=None)


def make_inv(tmp_path: Path, fabric: str = "none", band: str = "", nodes: int = 1) -> Inventory:
    names = "\n".join(f"      - name: lab-{i}" for i in range(nodes))
    path = tmp_path / f"inv-{fabric}-{nodes}{'-band' if band else ''}.yaml"
    path.write_text(f"""version: 1
providers:
  lab:
    executor: local
    expect:
      gpu_model: H200
      fabric: {{type: {fabric}}}
{band}
    nodes:
{names}
""")
    return inventory.load(path)


def lone_node() -> Node:
    return Node(name="n1", provider="lab", executor="local", host=None, port=22, user=None,
                identity_file=None, ssh_alias=None, proxy_jump=None, python="python3",
                work_dir="/tmp/x", ckpt_dir=None, env={}, connect_timeout_s=1)


def judge(run: Run, scope: str, logs: list[Path | tuple[Path, bool]],
          inv: Inventory | None = None, nodes: list[Node] | None = None
          ) -> tuple[list[Finding], list[Measurement]]:
    series_logs = []
    for i, item in enumerate(logs, 1):
        path, timed_out = item if isinstance(item, tuple) else (item, False)
        series_logs.append((i, path, timed_out))
    return judge_series(Series(scope, nodes or [lone_node()], series_logs), run, inv, SUITE)


def codes(findings: list[Finding], severity: str | None = None) -> set[str]:
    return {f.code for f in findings if severity is None or f.severity == severity}


def one(findings: list[Finding], code: str) -> Finding:
    found = [f for f in findings if f.code == code]
    assert len(found) == 1, (code, [(f.code, f.message) for f in findings])
    return found[0]


def printed_rows(path: Path) -> dict[int, list[str]]:
    """size -> the row's fields, read with a plain split: the raw nccl-tests output."""
    rows = {}
    for line in path.read_text().splitlines():
        fields = line.split()
        if len(fields) == 13 and fields[0].isdigit() and fields[2] == "float":
            rows[int(fields[0])] = fields
    return rows


# --- three real rounds --------------------------------------------------------

def test_real_rounds_measurements_equal_the_printed_numbers(run: Run) -> None:
    findings, ms = judge(run, "single", list(ROUNDS))
    assert len(ms) == 3 * 25 * 2 * 3 == 450
    assert {m.suite_hash for m in ms} == {SUITE.hash}
    assert {m.metric for m in ms} == {"busbw", "algbw", "time"}
    assert {m.round for m in ms} == {1, 2, 3}
    got = {(m.round, m.size, m.inplace, m.metric): m.value for m in ms}
    assert len(got) == 450
    columns = {(False, "time"): 5, (False, "algbw"): 6, (False, "busbw"): 7,
               (True, "time"): 9, (True, "algbw"): 10, (True, "busbw"): 11}
    for rnd, path in enumerate(ROUNDS, 1):
        rows = printed_rows(path)
        assert len(rows) == 25
        for size, fields in rows.items():
            for (inplace, metric), col in columns.items():
                assert got[(rnd, size, inplace, metric)] == float(fields[col])
    # the headline number: 128 MiB out-of-place busbw, exactly as printed
    for rnd, path in enumerate(ROUNDS, 1):
        assert got[(rnd, SIZE_128M, False, "busbw")] == float(printed_rows(path)[SIZE_128M][7])
    m0 = next(m for m in ms if m.metric == "busbw")
    assert m0.unit == "GB/s" and m0.tags["gpus"] == 2 and m0.tags["nccl_version"] == "2.28.9"
    assert m0.tags["wrong"] == 0 and m0.nodes == ["n1"] and m0.provider == "lab"


def test_real_rounds_findings(run: Run) -> None:
    findings, _ = judge(run, "single", list(ROUNDS))
    assert not codes(findings, "FAIL")
    assert not codes(findings, "WARN")
    busbw = one(findings, "NCCL_BUSBW")
    assert busbw.severity == "INFO"
    printed = [float(printed_rows(p)[SIZE_128M][7]) for p in ROUNDS]
    assert busbw.details["median"] == statistics.median(printed)
    assert 285.0 <= busbw.details["median"] < 286.0
    assert busbw.details["size"] == SIZE_128M
    assert "median 285." in busbw.message and "128 MiB" in busbw.message
    ref = one(findings, "NCCL_REFERENCE")
    assert ref.severity == "PASS"
    assert "within" in ref.message
    assert ref.details["judged"]["reference"] == 285
    assert ref.details["judged"]["result"] == "within" and ref.details["source"] == "shipped"
    assert all(f.node == "n1" and f.step == "nccl" and f.run_id == run.run_id for f in findings)


# --- failures in the log ------------------------------------------------------

def test_crash_truncated_sample_fails_with_line_numbers(run: Run) -> None:
    path = SAMPLES / "all_reduce_2node-h100_crash-truncated.log"
    findings, ms = judge(run, "single", [path])
    assert one(findings, "NCCL_TRUNCATED").severity == "FAIL"
    fails = [f for f in findings if f.code == "NCCL_TEST_FAILURE"]
    assert fails and all(f.severity == "FAIL" for f in fails)
    lines = path.read_text().splitlines()
    for f in fails:
        n = f.details["line"]
        assert f"line {n}:" in f.message
        assert lines[n - 1].strip()[:40] in f.message
    by_line = {f.details["line"]: f.details["kind"] for f in fails}
    test_failure_line = next(i for i, ln in enumerate(lines, 1) if "Test NCCL failure" in ln)
    assert by_line[test_failure_line] == "nccl-failure"
    mpirun_line = next(i for i, ln in enumerate(lines, 1) if ln.startswith("mpirun detected"))
    assert by_line[mpirun_line] == "mpi-abort"
    # rows printed before the crash are still measured
    assert {m.size for m in ms} == {1 << k for k in range(20, 28)}


def test_wrong_and_out_of_bounds_sample_fails(run: Run) -> None:
    findings, _ = judge(run, "single", [SAMPLES / "all_reduce_2.19.1_wrong-oob-failed_a100.log"])
    kinds = {f.details["kind"] for f in findings if f.code == "NCCL_TEST_FAILURE"
             and f.severity == "FAIL"}
    assert {"wrong", "out-of-bounds"} <= kinds


def test_round_with_halved_busbw_is_a_drop(run: Run, tmp_path: Path) -> None:
    text = ROUNDS[1].read_text()
    fields = printed_rows(ROUNDS[1])[SIZE_128M]
    old_line = next(ln for ln in text.splitlines() if ln.split()[:1] == [str(SIZE_128M)])
    half = f"{float(fields[7]) / 2:.2f}"
    # a slow round: twice the time, half the bandwidth (out-of-place columns)
    slow_fields = [*fields[:5], f"{float(fields[5]) * 2:.2f}",
                   f"{float(fields[6]) / 2:.2f}", half, *fields[8:]]
    new_line = "  ".join(slow_fields)
    slow = tmp_path / "round2-slow.log"
    slow.write_text(text.replace(old_line, new_line))
    findings, ms = judge(run, "single", [ROUNDS[0], slow, ROUNDS[2]])
    drop = one(findings, "NCCL_ROUND_DROP")
    assert drop.severity == "WARN"
    assert "round(s) [2]" in drop.message and "128 MiB" in drop.message
    assert drop.details["size"] == SIZE_128M
    assert drop.details["values"][1] == float(half)
    assert not codes(findings, "FAIL")
    assert next(m.value for m in ms if m.round == 2 and m.metric == "busbw"
                and m.size == SIZE_128M and not m.inplace) == float(half)


def test_timed_out_round_fails(run: Run, tmp_path: Path) -> None:
    partial = tmp_path / "round2-partial.log"
    partial.write_text("\n".join(ROUNDS[1].read_text().splitlines()[:20]) + "\n")
    findings, _ = judge(run, "single", [ROUNDS[0], (partial, True), ROUNDS[2]])
    timeout = one(findings, "NCCL_TIMEOUT")
    assert timeout.severity == "FAIL"
    assert "round 2" in timeout.message
    assert timeout.evidence == [str(partial)]
    assert "NCCL_TRUNCATED" in codes(findings, "FAIL")


def test_garbage_in_the_table_is_unreadable_not_an_exception(run: Run, tmp_path: Path) -> None:
    lines = ROUNDS[0].read_text().splitlines()
    i = next(k for k, ln in enumerate(lines) if ln.split()[:1] == ["4096"])
    lines[i] = "  4096  1024  float  sum  -1  @@garbage@@ lorem ipsum"
    bad = tmp_path / "garbage.log"
    bad.write_text("\n".join(lines) + "\n")
    findings, ms = judge(run, "single", [bad, ROUNDS[1]])
    unreadable = one(findings, "NCCL_OUTPUT_UNREADABLE")
    assert unreadable.severity == "FAIL" and "round 1" in unreadable.message
    # the readable round is still measured and summarised
    assert ms and {m.round for m in ms} == {2}
    assert "over 1 round(s)" in one(findings, "NCCL_BUSBW").message


def test_missing_log_is_unreadable(run: Run, tmp_path: Path) -> None:
    findings, ms = judge(run, "single", [tmp_path / "never-written.log"])
    assert one(findings, "NCCL_OUTPUT_UNREADABLE").severity == "FAIL"
    assert ms == []


# --- transports and fabric ----------------------------------------------------

SOCKET_LOG = H200 / "all_reduce_mpi_np2_simulated-2node-socket.log"


def test_socket_fallback_fails_when_ib_was_ordered(run: Run, tmp_path: Path) -> None:
    inv = make_inv(tmp_path, fabric="ib", nodes=2)
    findings, _ = judge(run, "multi", [SOCKET_LOG], inv, inv.select(provider="lab"))
    fb = one(findings, "NCCL_SOCKET_FALLBACK")
    assert fb.severity == "FAIL"
    assert fb.scope == "provider" and fb.node is None and fb.subject == "provider:lab"
    lines = SOCKET_LOG.read_text().splitlines()
    assert fb.details["lines"]
    for n in fb.details["lines"]:
        assert "NET/Socket" in lines[n - 1]
        assert str(n) in fb.message
    assert "NET/Socket" in one(findings, "NCCL_TRANSPORTS").details["transports"]


def test_socket_is_fine_when_no_fabric_was_ordered(run: Run, tmp_path: Path) -> None:
    inv = make_inv(tmp_path, fabric="none", nodes=2)
    findings, _ = judge(run, "multi", [SOCKET_LOG], inv, inv.select(provider="lab"))
    assert "NCCL_SOCKET_FALLBACK" not in codes(findings)
    assert not codes(findings, "FAIL")


def test_socket_in_single_scope_is_not_judged_as_fallback(run: Run, tmp_path: Path) -> None:
    inv = make_inv(tmp_path, fabric="ib", nodes=1)
    findings, _ = judge(run, "single", [SOCKET_LOG], inv, inv.select(provider="lab"))
    assert "NCCL_SOCKET_FALLBACK" not in codes(findings)


def test_ib_gdrdma_sample_has_no_fallback(run: Run, tmp_path: Path) -> None:
    inv = make_inv(tmp_path, fabric="ib", nodes=2)
    findings, _ = judge(run, "multi", [SAMPLES / "all_reduce_2node-h100_ib-gdrdma_nccl-info.log"],
                        inv, inv.select(provider="lab"))
    assert "NCCL_SOCKET_FALLBACK" not in codes(findings)
    tr = one(findings, "NCCL_TRANSPORTS")
    assert "GPUDirect RDMA" in tr.message
    assert "NET/IB" in tr.details["transports"]
    assert tr.details["n_nodes"] == 2


def test_inventory_band_above_measurement_warns_below(run: Run, tmp_path: Path) -> None:
    band = "      nccl_busbw: {value: 400, lower: 380, upper: 450, note: ordered NVSwitch}"
    inv = make_inv(tmp_path, band=band)
    findings, _ = judge(run, "single", list(ROUNDS), inv, inv.select(provider="lab"))
    ref = one(findings, "NCCL_REFERENCE")
    assert ref.severity == "WARN"
    assert "below" in ref.message and "380-450" in ref.message
    assert ref.details["judged"]["reference"] == 400
    assert ref.details["source"] == "inventory"
    assert 285 <= ref.details["judged"]["value"] < 286


def test_inventory_band_overrides_shipped_reference_upwards(run: Run, tmp_path: Path) -> None:
    inv = make_inv(tmp_path, band="      nccl_busbw: {value: 100, lower: 50, upper: 150}")
    findings, _ = judge(run, "single", list(ROUNDS), inv, inv.select(provider="lab"))
    ref = one(findings, "NCCL_REFERENCE")
    # faster than the band is said, not hidden, and is no fault of the node
    assert ref.severity == "INFO" and "above the reference band" in ref.message
    assert ref.details["judged"]["result"] == "above"
