"""Collectives beyond all_reduce: the suite names them, each log's busbw is nccl-tests' own
formula for its collective, bands judge only their own collective, and the torch engine
runs all_gather and all_to_all across local nodes."""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest

from orchestrator import bands, inventory, nccltests
from orchestrator.analysis import compare, regress
from orchestrator.errors import UsageError
from orchestrator.inventory import Inventory
from orchestrator.nccltests import BuildDoc
from orchestrator.parsers.nccl_tests import parse_nccl_tests
from orchestrator.records import Finding, Measurement
from orchestrator.steps.nccl import step as nccl_step
from orchestrator.steps.nccl import torchbench
from orchestrator.steps.nccl.judge import Series, busbw_fits, gpu_count, judge_series
from orchestrator.store import Run
from orchestrator.suite import NcclParams, Suite, load_suite
from payload import allreduce
from tests.bench import regress_bench

REPO = Path(__file__).resolve().parents[2]
FIX = REPO / "tests" / "fixtures"
SUITE = Suite()


# --- the suite --------------------------------------------------------------------------------

# the hashes runs were stored under before the suite had `nccl.collectives`: a suite that
# does not set it keeps its hash, its baselines and its regress history
KNOWN_HASHES = {"default.yaml": "719fcba1d20e5499", "train-cpu.yaml": "a58e945508921c6f"}


def test_the_default_suite_and_the_shipped_suites_keep_their_hash() -> None:
    assert Suite().hash == "719fcba1d20e5499"
    for name, want in KNOWN_HASHES.items():
        assert load_suite(REPO / "suites" / name).hash == want, name


def test_collectives_enter_the_hash_only_when_they_differ_from_all_reduce() -> None:
    assert Suite(nccl=NcclParams(collectives=("all_reduce",))).hash == Suite().hash
    more = Suite(nccl=NcclParams(collectives=("all_reduce", "all_gather")))
    other = Suite(nccl=NcclParams(collectives=("all_reduce", "alltoall")))
    assert len({Suite().hash, more.hash, other.hash}) == 3


@pytest.mark.parametrize(("value", "says"), [
    ("[]", "at least one collective"),
    ("[all_reduce, all_reduce]", "all_reduce named more than once"),
    ("[allgather]", "nccl.collectives.0"),
])
def test_a_wrong_collectives_list_is_refused_with_its_place(tmp_path: Path, value: str,
                                                            says: str) -> None:
    p = tmp_path / "s.yaml"
    p.write_text(f"nccl:\n  collectives: {value}\n")
    with pytest.raises(UsageError, match=says):
        load_suite(p)


def test_each_collective_runs_the_binary_beside_the_builds_all_reduce() -> None:
    b = "/w/cache/nccl-tests-a0b82b2260cf-1234/build/all_reduce_perf"
    assert nccltests.collective_binary(b, "all_gather") == \
        "/w/cache/nccl-tests-a0b82b2260cf-1234/build/all_gather_perf"
    assert nccltests.collective_binary("/b/all_reduce_perf_mpi", "alltoall") == \
        "/b/alltoall_perf_mpi"
    assert nccltests.log_label("single", "all_reduce") == "single"  # names runs have
    assert nccltests.log_label("multi", "sendrecv") == "multi_sendrecv"
    assert nccltests.torch_bench_args(NcclParams())[-4:] == ["-c", "1", "--pg-timeout", "900"]
    assert nccltests.torch_bench_args(NcclParams(), "alltoall")[-2:] == ["--op", "alltoall"]


# --- busbw per collective, as nccl-tests computes it -----------------------------------------

@pytest.mark.parametrize(("op", "n", "factor"), [
    ("all_reduce", 8, 1.75), ("all_reduce", 2, 1.0), ("all_gather", 8, 0.875),
    ("reduce_scatter", 16, 0.9375), ("alltoall", 4, 0.75), ("broadcast", 8, 1.0),
    ("sendrecv", 8, 1.0), ("all_gather", 1, 0.0),
])
def test_busbw_factor_is_nccl_tests_own(op: str, n: int, factor: float) -> None:
    assert allreduce.busbw_factor(op, n) == pytest.approx(factor)


# (log, collective, ranks): captured here (recipe-h200x1-extras, one GPU) and published logs
# of several ranks; the collective is the log's own where it prints one
LOGS = [
    (FIX / "h200x2" / "nccl-tests" / "all_reduce_8B-128M_g2_round1.log", "all_reduce", 2),
    (FIX / "public" / "all_reduce_256gpu_check0_nccl-2.8.4_nccl-tests-78.log", "all_reduce", 256),
    (FIX / "public" / "all_gather_gke-script-preamble_2x8-b200_dranet.log", "all_gather", 16),
    (FIX / "recipe-h200x1-extras" / "coll-all_gather.log", "all_gather", 1),
    (FIX / "recipe-h200x1-extras" / "coll-reduce_scatter.log", "reduce_scatter", 1),
    (FIX / "nccl-tests" / "alltoall_2.17.6_inplace-na_h100.log", "alltoall", 8),
    (FIX / "public" / "alltoall_from-using-devices_8x-h20_nccl-tests-314.log", "alltoall", 8),
    (FIX / "recipe-h200x1-extras" / "coll-alltoall.log", "alltoall", 1),
    (FIX / "nccl-tests" / "broadcast_2.11-era_check0_na.log", "broadcast", 4),
    (FIX / "recipe-h200x1-extras" / "coll-broadcast.log", "broadcast", 1),
    (FIX / "public" / "sendrecv_maxbytes-row-no-footer_8x-a100_li-plus.log", "sendrecv", None),
    (FIX / "recipe-h200x1-extras" / "coll-sendrecv.log", "sendrecv", 1),
]


@pytest.mark.parametrize(("path", "op", "ranks"), LOGS, ids=[p.name for p, _, _ in LOGS])
def test_every_collectives_log_parses_into_its_own_busbw(path: Path, op: str,
                                                         ranks: int | None) -> None:
    res = parse_nccl_tests(path.read_text(errors="replace"), source=path.name)
    assert res.op in (op, None) and res.rows
    assert gpu_count(res) == ranks
    assert busbw_fits(res, op) is True
    # each row read as printed: busbw = algbw x nccl-tests' factor, within the printed digits
    factor = allreduce.busbw_factor(op, ranks or 1)
    for row in res.rows:
        r = row.out_of_place
        assert abs(r.busbw_gbs - r.algbw_gbs * factor) <= 0.011 + 0.001 * r.busbw_gbs


def test_a_collectives_busbw_is_not_another_collectives() -> None:
    """The factors tell all_reduce from the (n-1)/n family and from the factor-1 family."""
    def fits(name: str, op: str) -> bool | None:
        p = next(p for p, _, _ in LOGS if p.name == name)
        return busbw_fits(parse_nccl_tests(p.read_text(errors="replace")), op)

    assert fits("all_gather_gke-script-preamble_2x8-b200_dranet.log", "all_reduce") is False
    assert fits("alltoall_2.17.6_inplace-na_h100.log", "broadcast") is False
    assert fits("all_reduce_256gpu_check0_nccl-2.8.4_nccl-tests-78.log", "all_gather") is False
    assert fits("broadcast_2.11-era_check0_na.log", "alltoall") is False


# --- judged per collective --------------------------------------------------------------------

@pytest.fixture
def run(tmp_path: Path) -> Run:
    return Run.create(tmp_path / "results", command="test", suite_hash=SUITE.hash,
                      suite=SUITE.model_dump(mode="json"), inventory_path=None)


def inv_with(tmp_path: Path, band_lines: str, nodes: int = 2) -> Inventory:
    names = "\n".join(f"      - {{name: n{i}, work_dir: {tmp_path / f'w{i}'}, "
                      f"python: {sys.executable}}}" for i in range(nodes))
    p = tmp_path / "inv.yaml"
    p.write_text(f"version: 1\nproviders:\n  lab:\n    executor: local\n    expect:\n"
                 f"      nccl_busbw:\n{band_lines}\n    nodes:\n{names}\n")
    return inventory.load(p)


A2A = FIX / "nccl-tests" / "alltoall_2.17.6_inplace-na_h100.log"
AR = FIX / "nccl-tests" / "all_reduce_2.17.6_timestamps_h100.log"
# the alltoall log's 256 MiB busbw is 155.13 GB/s; an all_reduce band at that size expects
# 8x H100 NVSwitch's 450: judged against it, the alltoall would read as far below
BANDS = ("        - {size: 256M, value: 450, lower: 340, upper: 500}\n"
         "        - {size: 256M, value: 160, lower: 130, upper: 190, collective: alltoall}")


def judged(run: Run, inv: Inventory, path: Path, collective: str | None
           ) -> tuple[list[Finding], list[Measurement]]:
    s = Series("single", inv.nodes[:1], [(1, path, False)], BuildDoc(), collective=collective)
    return judge_series(s, run, inv, SUITE)


def test_a_band_judges_only_its_own_collective(run: Run, tmp_path: Path) -> None:
    fs, ms = judged(run, inv_with(tmp_path, BANDS), A2A, "alltoall")
    refs = [f for f in fs if f.code.startswith("NCCL_REFERENCE")]
    assert [(f.code, f.severity) for f in refs] == [("NCCL_REFERENCE", "PASS")]
    assert refs[0].details["collective"] == "alltoall"
    assert refs[0].details["judged"]["reference"] == 160
    assert refs[0].message.startswith("[single alltoall] busbw 155.1 GB/s at 256 MiB is within")
    assert {m.tags["op"] for m in ms} == {"alltoall"}


def test_all_reduce_keeps_its_bands_beside_another_collectives(run: Run, tmp_path: Path
                                                               ) -> None:
    fs, _ = judged(run, inv_with(tmp_path, BANDS), AR, "all_reduce")
    refs = [f for f in fs if f.code.startswith("NCCL_REFERENCE")]
    assert [f.code for f in refs] == ["NCCL_REFERENCE"]
    assert refs[0].details["judged"]["reference"] == 450
    assert "collective" not in refs[0].details["judged"]  # an all_reduce reads as before


def test_no_band_of_its_collective_says_none_applies(run: Run, tmp_path: Path) -> None:
    only_ar = "        - {size: 256M, value: 450, lower: 340, upper: 500}"
    fs, _ = judged(run, inv_with(tmp_path, only_ar), A2A, "alltoall")
    refs = [f for f in fs if f.code.startswith("NCCL_REFERENCE")]
    assert [(f.code, f.severity) for f in refs] == [("NCCL_REFERENCE_NONE", "INFO")]
    assert "bands are for all_reduce, never for alltoall" in refs[0].message


def test_a_log_of_another_collective_than_was_run_is_a_failure(run: Run, tmp_path: Path
                                                               ) -> None:
    fs, ms = judged(run, inv_with(tmp_path, BANDS), A2A, "all_gather")
    assert "NCCL_WRONG_COLLECTIVE" in {f.code for f in fs} and not ms


def test_an_unnamed_log_whose_busbw_is_not_all_reduces_gets_no_all_reduce_band(
        run: Run, tmp_path: Path) -> None:
    """rows pasted without the banner: all_reduce's bands only where its busbw fits."""
    log = FIX / "public" / "all_gather_gke-script-preamble_2x8-b200_dranet.log"
    band = "        - {size: 1G, value: 450, lower: 340, upper: 500}"
    fs, _ = judged(run, inv_with(tmp_path, band), log, None)
    refs = [f for f in fs if f.code.startswith("NCCL_REFERENCE")]
    assert [f.code for f in refs] == ["NCCL_REFERENCE_NONE"]
    assert "does not name its collective" in refs[0].message


def test_applicable_filters_by_collective() -> None:
    b_ar = bands.Band(value=10, lower=5, upper=15, size="1M")
    b_ag = bands.Band(value=10, lower=5, upper=15, size="1M", collective="all_gather")
    assert bands.applicable([b_ar, b_ag], [1 << 20]) == [b_ar]
    assert bands.applicable([b_ar, b_ag], [1 << 20], "all_gather") == [b_ag]
    with pytest.raises(ValueError, match="unknown collective"):
        bands.Band(value=10, lower=5, upper=15, collective="allgather")


# --- the torch engine on local nodes (real torchrun, gloo) -----------------------------------

def test_the_torch_engine_runs_all_gather_and_all_to_all_across_local_nodes(
        run: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """nccl-tests built without MPI: the multi-node rounds are the torch benchmark's, one
    per collective, across two local nodes of one rank each."""
    inv = inv_with(tmp_path, BANDS)
    built = BuildDoc(ok=True, gpus=1, mpi=False, binary="/x/all_reduce_perf")
    monkeypatch.setattr(nccl_step, "_build_node", lambda ex, run, suite, archive: built)
    suite = Suite(nccl=NcclParams(collectives=("all_gather", "alltoall", "sendrecv"),
                                  min_bytes="64K", max_bytes="256K", step_factor=4, iters=2,
                                  warmup_iters=1, rounds=1, timeout_s=120))
    nccl_step.run_nccl(inv, inv.nodes, run, suite, single=False)
    fs, ms = run.findings(), run.measurements()
    assert not [f for f in fs if f.severity == "FAIL"], [f.message for f in fs]
    skipped = next(f for f in fs if f.code == "TORCH_OP_SKIPPED")
    assert skipped.details["collectives"] == ["sendrecv"]
    busbw = {(m.tags["op"], m.size): m for m in ms if m.metric == "busbw" and not m.inplace}
    assert {op for op, _ in busbw} == {"all_gather", "alltoall"}
    assert {m.engine for m in busbw.values()} == {"torch"}
    algbw = {(m.tags["op"], m.size): m.value for m in ms
             if m.metric == "algbw" and not m.inplace}
    for key, m in busbw.items():  # two ranks: (n-1)/n = 0.5, nccl-tests' factor
        assert m.value == pytest.approx(algbw[key] * 0.5, abs=0.011)
        assert m.tags["wrong"] == 0
    logs = sorted(p.name for p in run.provider_dir("lab", "nccl").glob("torch_*.log"))
    assert logs == ["torch_multi_all_gather.log", "torch_multi_alltoall.log"]


def test_a_collective_the_backend_lacks_is_skipped_with_its_reason(tmp_path: Path) -> None:
    log = tmp_path / "t.log"
    log.write_text("# Collective test starting: reduce_scatter_perf\n" + allreduce.SKIPPED
                   + "reduce_scatter is not supported by the gloo backend in torch 2.1\n")
    assert torchbench.torch_skipped(log) == ("reduce_scatter is not supported by the gloo "
                                            "backend in torch 2.1")
    assert allreduce.unsupported(RuntimeError("ProcessGroupGloo does not support "
                                              "reduce_scatter"))
    assert not allreduce.unsupported(RuntimeError("Connection reset by peer"))


# --- compare and regress per collective -------------------------------------------------------

def _gathers(run_id: str, provider: str, values: dict[tuple[int, int], float]
             ) -> list[Measurement]:
    """all_gather busbw of one node's GPUs beside the all_reduce rows write_run stores."""
    return [Measurement(run_id=run_id, provider=provider, nodes=["n1"], step="nccl",
                        metric="busbw", value=v, unit="GB/s", suite_hash=regress_bench.SUITE_HASH,
                        scope="single", engine="nccl-tests", size=size, inplace=False, round=r,
                        tags={"op": "all_gather"})
            for (size, r), v in values.items()]


def _history(root: Path, n: int, *, gather_level: Callable[[int], float]) -> list[str]:
    """`n` runs of provider lab: all_reduce at a steady 300 GB/s, all_gather at
    `gather_level(i)`, both at regress_bench's sizes and three rounds."""
    rng = np.random.default_rng(1)
    ids = []
    for i in range(n):
        ar = regress_bench.busbw_values(rng, ["n1"], 3, 300.0, 0.01)
        # the id write_run gives the i-th run
        run_id = (regress_bench.T0 + timedelta(hours=6 * i)).strftime("%Y%m%d-%H%M%S") + \
            f"-{i:04x}"
        level = gather_level(i)
        gathers = {(size, r): float(level * rng.normal(1, 0.01))
                   for size in regress_bench.SIZES for r in (1, 2, 3)}
        assert regress_bench.write_run(root, i, "lab", ar,
                                       extra=_gathers(run_id, "lab", gathers)) == run_id
        ids.append(run_id)
    return ids


def test_regress_tracks_each_collective_as_its_own_series(tmp_path: Path) -> None:
    """all_gather drops by 30% in the last run; all_reduce does not. Mixed into one series,
    the drop would be halved into all_reduce's and all_gather's keys would not exist."""
    root = tmp_path / "results"
    _history(root, 8, gather_level=lambda i: 150.0 if i < 7 else 105.0)
    ev = regress.evaluate(root)
    rows = [r for r in ev.rows if not r.is_node]
    by = {(r.key.collective, r.key.size): r for r in rows}
    assert set(by) == {(c, s) for c in ("", "all_gather") for s in regress_bench.SIZES}
    for s in regress_bench.SIZES:
        assert by[("", s)].result.verdict == "UNCHANGED"
        assert by[("", s)].result.base_mean == pytest.approx(300, rel=0.03)
        assert by[("all_gather", s)].result.verdict == "REGRESSED"
        assert by[("all_gather", s)].result.change == pytest.approx(-0.30, abs=0.03)
    tests = regress.as_json(ev)["tests"]
    # an all_reduce series keeps the key it had; another collective's names itself
    assert all("collective" not in t for t in tests if t["series"].startswith("busbw single"))
    assert {t["collective"] for t in tests if "collective" in t} == {"all_gather"}
    assert any(t["series"].startswith("busbw all_gather single") for t in tests)


def test_compare_shows_one_busbw_block_per_collective(tmp_path: Path) -> None:
    root = tmp_path / "results"
    _history(root, 2, gather_level=lambda i: 150.0)
    c = compare.build(root, ["lab"], with_cost=False)
    blocks = {t.title: t for t in c.tables if t.title.startswith("busbw (")}
    assert list(blocks) == ["busbw (all_reduce, out-of-place)",
                            "busbw (all_gather, out-of-place)"]
    ar = blocks["busbw (all_reduce, out-of-place)"].rows
    ag = blocks["busbw (all_gather, out-of-place)"].rows
    assert [r[0] for r in ar] == ["single"] * len(regress_bench.SIZES)
    assert all(r[2] == pytest.approx(300, rel=0.03) for r in ar)
    assert all(r[2] == pytest.approx(150, rel=0.03) for r in ag)


def test_show_summarises_each_collective_apart(tmp_path: Path) -> None:
    from orchestrator.analysis import frames
    from orchestrator.cli.runs import measurement_summary

    root = tmp_path / "results"
    ids = _history(root, 1, gather_level=lambda i: 150.0)
    t = measurement_summary(frames.measurements(root, ids))
    medians = {r[4]: r[7] for r in t.rows}
    assert set(medians) == {"busbw", "busbw (all_gather)"}
    assert medians["busbw"] == pytest.approx(300, rel=0.03)
    assert medians["busbw (all_gather)"] == pytest.approx(150, rel=0.03)


def test_a_baseline_keeps_each_collective_apart(tmp_path: Path) -> None:
    from orchestrator.analysis import baseline
    from orchestrator.index import Index

    root = tmp_path / "results"
    _history(root, 2, gather_level=lambda i: 150.0)
    recs = baseline.set_baseline(root, "lab", last=2, who="t")
    means = {(r.collective, r.size): r.mean for r in recs if r.metric == "busbw"}
    assert set(means) == {(c, s) for c in ("", "all_gather") for s in regress_bench.SIZES}
    assert all(v == pytest.approx(150 if c else 300, rel=0.03) for (c, _), v in means.items())
    stored = Index(root).baselines("lab")
    assert {r.collective for r in stored} == {"", "all_gather"}
    labels = {row[3] for row in baseline.records_table(root, stored, "b").rows}
    assert "busbw all_gather single 64 MiB" in labels and "busbw single 64 MiB" in labels


def test_change_points_are_found_in_the_collectives_own_history(tmp_path: Path) -> None:
    root = tmp_path / "results"
    ids = _history(root, 24, gather_level=lambda i: 150.0 if i < 16 else 120.0)
    (p,) = regress.evaluate(root).providers
    assert p.shifts and {s.run_id for s in p.shifts} == {ids[16]}
    assert {s.key.collective for s in p.shifts} == {"all_gather"}
    assert all(s.change == pytest.approx(-0.20, abs=0.03) for s in p.shifts)


def test_an_imported_alltoall_is_its_own_collective_in_compare(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]
                                                               ) -> None:
    """`gpuvet import nccl-tests` of an alltoall log: tagged alltoall, judged against no
    all_reduce band, shown in its own compare block."""
    from tests.unit.clirun import gpuvet

    results = tmp_path / "results"
    proc = gpuvet(capsys, "import", "nccl-tests", A2A, "-p", "lab", "--results", results)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    c = compare.build(results, ["lab"], with_cost=False)
    blocks = {t.title: t for t in c.tables if t.title.startswith("busbw (")}
    assert not blocks["busbw (all_reduce, out-of-place)"].rows
    rows = blocks["busbw (alltoall, out-of-place)"].rows
    assert [(r[0], r[1], r[2]) for r in rows][-1] == ("single", "256 MiB", 155.13)
