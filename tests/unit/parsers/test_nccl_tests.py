"""nccl-tests text and JSON parsing, against the real H200 captures and version samples."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import ParseError
from orchestrator.parsers import parse
from orchestrator.parsers.nccl_tests import (
    NcclTestsRun,
    check_avg,
    parse_nccl_tests,
    parse_nccl_tests_json,
)

FIX = Path(__file__).resolve().parents[2] / "fixtures"
REAL = FIX / "h200x2" / "nccl-tests"
SAMPLES = FIX / "nccl-tests"
MIB128 = 134217728


def _text(path: Path) -> NcclTestsRun:
    return parse_nccl_tests(path.read_text(), source=str(path))


def _json(path: Path) -> NcclTestsRun:
    return parse_nccl_tests_json(path.read_text(), source=str(path))


@pytest.mark.parametrize("n", [1, 2, 3])
def test_real_rounds_128mib_busbw_and_header(n: int) -> None:
    run = _text(REAL / f"all_reduce_8B-128M_g2_round{n}.log")
    assert run.binary == "all_reduce_perf" and run.op == "all_reduce"
    assert run.tests_version == "2.19.6" and run.nccl_version == "2.28.9"
    assert run.nccl_cuda == "13.0" and run.nccl_headers == "2.28.9"
    assert len(run.rows) == 25
    assert run.rows[0].size_bytes == 8 and run.rows[-1].size_bytes == MIB128
    last = run.rows[-1]
    for res in (last.out_of_place, last.in_place):
        assert 284.0 <= res.busbw_gbs < 286.5  # README: 284-286 GB/s
        assert res.wrong == 0
    assert last.type == "float" and last.redop == "sum" and last.root is None
    assert run.params["n_gpus"] == 2 and run.params["max_bytes"] == MIB128
    assert run.params["step"] == 2 and run.params["step_mode"] == "factor"
    assert run.params["iters"] == 20 and run.params["unalign"] == 0
    assert [(r.rank, r.group, r.host, r.device, r.bus_id, r.name) for r in run.ranks] == [
        (0, 0, "vm", 0, "0000:00:06", "NVIDIA H200"), (1, 0, "vm", 1, "0000:00:07", "NVIDIA H200")]
    assert run.out_of_bounds is not None and run.out_of_bounds.ok and run.out_of_bounds.count == 0
    assert run.failures == [] and not run.truncated
    assert run.avg_busbw_agrees is True and check_avg(run) is True


def test_real_round1_exact_values() -> None:
    run = _text(REAL / "all_reduce_8B-128M_g2_round1.log")
    last = run.rows[-1]
    assert last.line_no == 37 and last.count == 33554432
    assert (last.out_of_place.time_us, last.out_of_place.busbw_gbs) == (471.96, 284.39)
    assert last.in_place.busbw_gbs == 285.63
    assert run.avg_busbw_reported == 58.5009
    assert run.avg_busbw_recomputed == pytest.approx(58.5009, abs=0.005)


def test_avg_mismatch_is_detected() -> None:
    text = (REAL / "all_reduce_8B-128M_g2_round1.log").read_text()
    run = parse_nccl_tests(text.replace("Avg bus bandwidth    : 58.5009", "Avg bus bandwidth    : 58.9"))
    assert run.avg_busbw_agrees is False


def test_json_matches_text_of_same_run() -> None:
    text = _text(REAL / "all_reduce_1G-4G_g2_nccl-debug-info.log")
    js = _json(REAL / "all_reduce_1G-4G_g2_nccl-debug-info.json")
    assert js.format == "json" and text.format == "text"
    assert js.binary == "all_reduce_perf" and js.nccl_version == text.nccl_version == "2.28.9"
    assert len(js.rows) == len(text.rows) == 3
    for a, b in zip(js.rows, text.rows, strict=True):
        assert (a.size_bytes, a.count, a.type, a.redop, a.root) == (
            b.size_bytes, b.count, b.type, b.redop, b.root)
        for ra, rb in ((a.out_of_place, b.out_of_place), (a.in_place, b.in_place)):
            assert round(ra.busbw_gbs, 2) == rb.busbw_gbs
            assert round(ra.algbw_gbs, 2) == rb.algbw_gbs
            assert ra.time_us == pytest.approx(rb.time_us, abs=0.06)
            assert ra.wrong == rb.wrong == 0
    assert js.avg_busbw_reported == pytest.approx(text.avg_busbw_reported, abs=1e-3)
    assert js.avg_busbw_agrees is True
    for key in ("n_thread", "n_gpus", "min_bytes", "max_bytes", "step", "iters", "agg_iters"):
        assert js.params[key] == text.params[key], key
    assert js.rows[-1].in_place.busbw_gbs == 346.080309
    assert 344.0 <= text.rows[-1].out_of_place.busbw_gbs <= 348.0


def test_json_drops_env() -> None:
    raw = (REAL / "all_reduce_1G-4G_g2_nccl-debug-info.json").read_text()
    js = parse_nccl_tests_json(raw)
    assert js.env_count == 8
    dumped = js.model_dump_json()
    assert "NCCL_DEBUG=INFO" not in dumped and "CUDA_HOME" not in dumped
    sample = _json(SAMPLES / "all_reduce_2.19.6_per-iter_h100.json").model_dump_json()
    assert "AWS_SECRET" not in sample and "hf_" not in sample


def test_real_mpi_logs() -> None:
    one = _text(REAL / "all_reduce_mpi_np2_1node.log")
    assert len(one.rows) == 7 and [r.pid for r in one.ranks] == [3402, 3403]
    assert one.rows[-1].out_of_place.busbw_gbs == 347.97 and one.avg_busbw_agrees
    sock = _text(REAL / "all_reduce_mpi_np2_simulated-2node-socket.log")
    assert len(sock.rows) == 6 and not sock.truncated and sock.failures == []
    assert all(1.4 <= r.out_of_place.busbw_gbs <= 3.0 for r in sock.rows)
    assert sock.rows[-1].in_place.time_us == 368196.0
    assert sock.avg_busbw_reported == 2.01661 and sock.avg_busbw_agrees


def test_registry_kinds() -> None:
    path = REAL / "all_reduce_8B-128M_g2_round2.log"
    run = parse("nccl-tests", path.read_text())
    assert isinstance(run, NcclTestsRun) and len(run.rows) == 25


@pytest.mark.parametrize("path", sorted(SAMPLES.glob("*")) + sorted(REAL.glob("*")),
                         ids=lambda p: p.name)
def test_every_fixture_parses(path: Path) -> None:
    if path.suffix == ".md":
        return
    run = _json(path) if path.suffix == ".json" else _text(path)
    assert run.rows
    assert run.truncated or run.avg_busbw_agrees is True


def test_old_error_column_layout() -> None:
    run = _text(SAMPLES / "all_reduce_2.11-era_error-column_dgx-a100.log")
    assert run.tests_version is None and run.nccl_version == "2.10.3"
    assert len(run.rows) == 25 and len(run.ranks) == 8
    assert run.ranks[0].group is None and run.ranks[0].pid == 48213
    assert run.ranks[0].bus_id == "0x07" and run.ranks[0].name == "A100-SXM4-40GB"
    assert run.params["validation"] == 1 and "agg_iters" not in run.params
    row = run.rows[8]
    assert row.root is None and row.redop == "sum"
    assert row.out_of_place.wrong is None and row.out_of_place.max_error == 1e-07
    assert run.failures == [] and run.avg_busbw_agrees


def test_old_broadcast_check0_na() -> None:
    run = _text(SAMPLES / "broadcast_2.11-era_check0_na.log")
    assert run.params["validation"] == 0 and len(run.rows) == 6
    assert all(r.root == 0 and r.redop is None for r in run.rows)
    assert all(r.in_place.wrong is None and r.in_place.max_error is None for r in run.rows)


def test_213_era() -> None:
    run = _text(SAMPLES / "all_reduce_2.13-era_dgx-a100-80g.log")
    assert len(run.rows) == 31 and run.rows[-1].size_bytes == 8589934592
    assert run.ranks[7].group == 0 and run.nccl_version == "2.14.3"
    assert run.rows[-1].out_of_place.time_us >= 10000


def test_timestamps() -> None:
    run = _text(SAMPLES / "all_reduce_2.17.6_timestamps_h100.log")
    assert len(run.rows) == 7
    assert run.rows[0].timestamp == "2025-11-04 16:22:15"
    assert run.nccl_headers == "2.27.3"


def test_per_iteration_text_and_json() -> None:
    text = _text(SAMPLES / "all_reduce_2.19.6_per-iter_h100.log")
    js = _json(SAMPLES / "all_reduce_2.19.6_per-iter_h100.json")
    assert any("Per-Iteration" in n for n in text.header_notes)
    assert len(text.rows) == len(js.rows) == 4
    for a, b in zip(text.rows, js.rows, strict=True):
        assert a.out_of_place.per_iter is not None and b.out_of_place.per_iter is not None
        assert a.out_of_place.per_iter.p99_us == pytest.approx(b.out_of_place.per_iter.p99_us,
                                                                abs=0.01)
        assert a.in_place.busbw_gbs == round(b.in_place.busbw_gbs, 2)
    assert js.params["per_iter_timing"] == "true"


def test_alltoall_inplace_na_and_json_v1_typo_keys() -> None:
    text = _text(SAMPLES / "alltoall_2.17.6_inplace-na_h100.log")
    js = _json(SAMPLES / "alltoall_2.17.6_json-v1.json")
    assert text.op == js.op == "alltoall"
    assert all(r.in_place.wrong is None and r.out_of_place.wrong == 0 for r in text.rows)
    assert all(r.in_place.wrong is None for r in js.rows)
    assert js.avg_busbw_reported == pytest.approx(text.avg_busbw_reported, abs=1e-3)
    assert js.env_count == 3


def test_wrong_and_out_of_bounds_failed() -> None:
    run = _text(SAMPLES / "all_reduce_2.19.1_wrong-oob-failed_a100.log")
    assert run.out_of_bounds is not None and run.out_of_bounds.count == 1
    assert not run.out_of_bounds.ok
    assert [(f.line_no, f.kind) for f in run.failures] == [(25, "wrong"), (30, "out-of-bounds")]
    bad = [r for r in run.rows if r.in_place.wrong]
    assert [r.size_bytes for r in bad] == [67108864]


def test_multinode_info_interleaved_between_rows() -> None:
    run = _text(SAMPLES / "all_reduce_2node-h100_ib-gdrdma_nccl-info.log")
    assert len(run.rows) == 11 and len(run.ranks) == 16
    assert {r.host for r in run.ranks} == {"gpu-node-017", "gpu-node-018"}
    assert run.nccl_version == "2.21.5" and run.failures == []


def test_crash_truncated_mid_table() -> None:
    run = _text(SAMPLES / "all_reduce_2node-h100_crash-truncated.log")
    assert run.truncated and len(run.rows) == 8
    assert run.rows[-1].size_bytes == MIB128
    assert run.avg_busbw_reported is None and run.avg_busbw_agrees is None
    kinds = [f.kind for f in run.failures]
    assert kinds[0] == "nccl-warn" and kinds.count("nccl-failure") == 2
    assert "mpi-abort" in kinds and "test-failure" in kinds
    glued = [f for f in run.failures if f.line_no == 45]
    assert glued and glued[0].kind == "nccl-failure"


def test_socket_fallback_and_efa_text() -> None:
    sock = _text(SAMPLES / "all_reduce_2node-a100_socket-fallback_nccl-info.log")
    assert len(sock.rows) == 6 and sock.failures[0].kind == "nccl-warn"
    efa = _text(SAMPLES / "all_reduce_2node-p4d_aws-ofi-efa_nccl-info.log")
    assert len(efa.rows) == 5 and efa.nccl_version == "2.18.5"


def _round1_lines() -> list[str]:
    return (REAL / "all_reduce_8B-128M_g2_round1.log").read_text().splitlines()


def test_unknown_line_in_table_raises_with_line_number() -> None:
    lines = _round1_lines()
    lines.insert(20, "some stray text")
    with pytest.raises(ParseError) as exc:
        parse_nccl_tests("\n".join(lines), source="x.log")
    assert exc.value.line_no == 21 and "x.log:21" in str(exc.value)


def test_short_row_followed_by_rows_raises() -> None:
    lines = _round1_lines()
    lines[20] = lines[20].rsplit(None, 4)[0]
    with pytest.raises(ParseError) as exc:
        parse_nccl_tests("\n".join(lines))
    assert exc.value.line_no == 21


def test_short_last_row_is_truncation() -> None:
    lines = _round1_lines()[:37]
    lines[-1] = lines[-1].rsplit(None, 4)[0]
    run = parse_nccl_tests("\n".join(lines))
    assert run.truncated and len(run.rows) == 24


def test_bad_number_raises() -> None:
    lines = _round1_lines()
    lines[15] = lines[15].replace("0.00", "x.yz", 1)
    with pytest.raises(ParseError) as exc:
        parse_nccl_tests("\n".join(lines))
    assert exc.value.line_no == 16


def test_second_run_header_raises() -> None:
    lines = _round1_lines()
    lines.insert(22, lines[2])
    with pytest.raises(ParseError) as exc:
        parse_nccl_tests("\n".join(lines))
    assert exc.value.line_no == 23


def test_not_nccl_tests_raises() -> None:
    with pytest.raises(ParseError):
        parse_nccl_tests("hello\nworld\n")
    with pytest.raises(ParseError):
        parse_nccl_tests("")


def test_v1_layout_rejected() -> None:
    text = ("nThread 1 nGpus 8 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 "
            "iters: 20 validation: 1\n"
            "#      bytes             N    type      op     time  algbw  busbw      res     "
            "time  algbw  busbw      res\n")
    with pytest.raises(ParseError) as exc:
        parse_nccl_tests(text)
    assert exc.value.line_no == 2


def test_json_errors() -> None:
    raw = (REAL / "all_reduce_1G-4G_g2_nccl-debug-info.json").read_text()
    with pytest.raises(ParseError) as exc:
        parse_nccl_tests_json(raw[:500])
    assert exc.value.line_no == 1
    with pytest.raises(ParseError):
        parse_nccl_tests_json(raw.replace('"version": 3', '"version": 9'))
    with pytest.raises(ParseError):
        parse_nccl_tests_json(raw.replace('"alg_bw"', '"algbw"'))


# ----------------------------------------------------------------- launchers' line prefixes

PUBLIC = FIX / "public"


def test_srun_label_prefixes_are_stripped() -> None:
    """NVIDIA/nccl-tests#290: every line ` 0: `-prefixed; rejected as not nccl-tests before."""
    run = _text(PUBLIC / "all_reduce_2node-h100_srun-label.log")
    assert run.launcher_prefix == "srun --label"
    assert len(run.ranks) == 16 and {r.host for r in run.ranks} == {"node005", "node007"}
    assert run.params["validation"] == 0 and len(run.rows) == 11
    first = run.rows[0]
    assert (first.line_no, first.size_bytes, first.out_of_place.busbw_gbs) == (24, 8388608, 73.04)
    assert first.out_of_place.wrong is None and first.in_place.wrong is None  # N/A with -c 0
    assert run.failures == [] and not run.truncated
    assert run.avg_busbw_reported == 142.735 and run.avg_busbw_agrees is True


def test_timeout_is_classified_under_srun() -> None:
    run = _text(PUBLIC / "all_reduce_2node-h100_srun-label_timeout-derived.log")
    assert [(f.line_no, f.kind) for f in run.failures] == [(28, "timeout"), (29, "test-failure")]
    assert run.failures[0].text == "node005: Test timeout (300s) common.cu:523"
    assert run.truncated and len(run.rows) == 4


@pytest.mark.parametrize("line,kind", [
    ("node005: Test timeout (300s) common.cu:523", "timeout"),
    ("h100-4: Test NCCL failure common.cu:1057 'internal error / '", "nccl-failure"),
    ("c2211f46f318: Test CUDA failure common.cu:730 'unknown error'", "cuda-failure"),
])
def test_failure_lines_of_nccl_tests_itself(line: str, kind: str) -> None:
    lines = (REAL / "all_reduce_8B-128M_g2_round1.log").read_text().splitlines()
    cut = next(k for k, ln in enumerate(lines) if ln.strip().startswith("1024 "))
    run = parse_nccl_tests("\n".join([*lines[:cut], line]) + "\n")
    assert [(f.kind, f.line_no) for f in run.failures] == [(kind, cut + 1)]


def test_mpirun_tag_output_prefix() -> None:
    text = (REAL / "all_reduce_8B-128M_g2_round1.log").read_text()
    tagged = "".join(f"[1,0]<stdout>:{ln}\n" for ln in text.splitlines())
    run = parse_nccl_tests(tagged)
    assert run.launcher_prefix == "mpirun --tag-output"
    assert run.rows == _text(REAL / "all_reduce_8B-128M_g2_round1.log").rows


def test_a_few_numbered_lines_are_not_a_prefix() -> None:
    run = _text(REAL / "all_reduce_8B-128M_g2_round1.log")
    assert run.launcher_prefix is None


def test_srun_own_lines_have_no_label() -> None:
    """srun's own messages carry no task label; the job's lines still lose theirs."""
    text = (PUBLIC / "all_reduce_2node-h100_srun-label.log").read_text()
    lines = text.splitlines()
    cut = 30  # a few rows in, then one task dies
    broken = "\n".join([*lines[:cut], "srun: error: node007: task 9: Exited with exit code 1",
                        "srun: Job step aborted: Waiting up to 32 seconds for job step to finish."])
    run = parse_nccl_tests(broken + "\n")
    assert run.launcher_prefix == "srun --label" and len(run.rows) == 7
    assert [(f.line_no, f.kind) for f in run.failures] == [(31, "error"), (32, "error")]
    assert run.truncated
