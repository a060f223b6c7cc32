"""`gpuvet import nccl-tests` of logs as they are published: the verdict each one gets.

Large runs read as large runs, a rank list over two hosts is a multi-node run (or `--nodes`
is refused), launcher preambles are noise, an author's trim is an elision whose footer is
read, a table that reaches maxBytes without its footer is no crash, and NCCL's harmless
search message is no failure. The parsed facts of the same logs are pinned in
tests/unit/parsers/test_nccl_ranks.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.unit.clirun import gpuvet

FIX = Path(__file__).resolve().parents[1] / "fixtures"
PUBLIC = FIX / "public"
TWO = FIX / "h200x2" / "nccl-tests" / "all_reduce_8B-128M_g2_round1.log"


def imported(capsys: pytest.CaptureFixture[str], tmp_path: Path, log: Path,
             *extra: str) -> tuple[int, dict[str, Any], str]:
    proc = gpuvet(capsys, "import", "nccl-tests", log, "-p", "lab", "--results",
                  tmp_path / "results", "--json", *extra)
    try:
        doc = json.loads(proc.stdout)
    except json.JSONDecodeError:
        doc = {}
    return proc.returncode, doc, proc.output


def codes(doc: dict[str, Any]) -> dict[str, str]:
    return {f["code"]: f["severity"] for f in doc["findings"]}


def busbw(doc: dict[str, Any]) -> str:
    return next(f["message"] for f in doc["findings"] if f["code"] == "NCCL_BUSBW")


def stored(tmp_path: Path) -> list[dict[str, Any]]:
    run = next(d for d in (tmp_path / "results").iterdir() if d.is_dir())
    return [json.loads(ln) for ln in (run / "measurements.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(("name", "nodes", "ranks", "median"), [
    ("all_reduce_gb200-nvl72-72rank-last-rank-line_coreweave.log", "18", 72,
     "busbw at 8 GiB: median 834.6 GB/s"),
    ("all_reduce_gb200-2rack-144rank-last-rank-line_coreweave.log", "36", 144,
     "busbw at 16 GiB: median 810.4 GB/s"),
    ("all_reduce_gb200-20rack-1440rank-last-rank-line_coreweave.log", "360", 1440,
     "busbw at 16 GiB: median 405.7 GB/s"),
])
def test_a_large_run_pasted_with_its_last_rank_line_is_a_large_run(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str, nodes: str, ranks: int,
        median: str) -> None:
    rc, doc, out = imported(capsys, tmp_path, PUBLIC / name, "--nodes", nodes)
    assert rc == 0, out
    got = codes(doc)
    assert "NCCL_NOT_APPLICABLE" not in got and median in busbw(doc)
    assert got["NCCL_LOG_EDITED"] == "WARN"  # the rank list was cut by its author
    ms = stored(tmp_path)
    assert {m["tags"]["gpus"] for m in ms} == {ranks} and {m["scope"] for m in ms} == {"multi"}
    assert "busbw" in {m["metric"] for m in ms}
    assert not any(m["tags"].get("local_copy") for m in ms)


def test_a_cut_rank_list_of_one_host_needs_nodes(capsys: pytest.CaptureFixture[str],
                                                 tmp_path: Path) -> None:
    name = "all_reduce_gb200-20rack-1440rank-last-rank-line_coreweave.log"
    rc, _, out = imported(capsys, tmp_path, PUBLIC / name)
    assert rc == 2
    assert "shows 1440 ranks but rank lines of one host only (slurm-gb200-218-073)" in out
    assert "give --nodes N" in out and "Traceback" not in out


@pytest.mark.parametrize(("name", "hosts"), [
    ("all_gather_gke-script-preamble_2x8-b200_dranet.log", 2),
    ("all_reduce_mpijob-launcher-kubectl-logs_2x-h200_dranet.log", 2),
    ("all_reduce_2.20.0-hash_2x-gb10_dgx-spark-103.log", 2),
    ("all_reduce_2host-rank-list-cut_h100_nccl-tests-294.log", 2),
    ("all_reduce_2host-rank-list-cut_h100_soperator-428.log", 2),
])
def test_a_rank_list_over_two_hosts_is_a_multi_node_run(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str, hosts: int) -> None:
    rc, doc, out = imported(capsys, tmp_path, PUBLIC / name)
    assert rc in (0, 1), out
    run = next(d for d in (tmp_path / "results").iterdir() if d.is_dir())
    meta = json.loads((run / "run.json").read_text())
    assert meta["suite"]["imported"]["nodes"] == hosts
    assert all(f["message"].startswith("[multi] ") for f in doc["findings"])
    # and --nodes 1 is refused with what the log shows
    rc, _, out = imported(capsys, tmp_path / "again", PUBLIC / name, "--nodes", "1")
    assert rc == 2 and "--nodes 1 disagrees with" in out
    assert f"its ranks run on {hosts} hosts" in out and f"give --nodes {hosts}" in out


@pytest.mark.parametrize("name", ["all_gather_gke-script-preamble_2x8-b200_dranet.log",
                                  "all_reduce_mpijob-launcher-kubectl-logs_2x-h200_dranet.log"])
def test_a_launcher_preamble_is_no_edit(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                        name: str) -> None:
    rc, doc, out = imported(capsys, tmp_path, PUBLIC / name)
    assert rc == 0, out
    got = codes(doc)
    assert "NCCL_LOG_EDITED" not in got and "NCCL_LOG_NOISE" not in got
    assert not [s for s in got.values() if s == "FAIL"]


@pytest.mark.parametrize(("name", "avg"), [
    ("all_gather_gke-script-truncated-comment_4x4-b200_dranet.log", "22.2173"),
    ("all_gather_gke-script-ssh-warnings-truncated_4x4-b200_dranet.log", "11.2291"),
])
def test_an_authors_trim_is_an_elision_and_its_footer_is_read(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str, avg: str) -> None:
    rc, doc, out = imported(capsys, tmp_path, PUBLIC / name)
    assert rc == 0, out
    got = codes(doc)
    assert got["NCCL_LOG_EDITED"] == "WARN" and got["NCCL_ROWS_ELIDED"] == "INFO"
    assert "NCCL_TRUNCATED" not in got and "NCCL_NO_RESULTS" not in got
    assert avg in next(f["message"] for f in doc["findings"] if f["code"] == "NCCL_ROWS_ELIDED")


def test_rows_trimmed_inside_the_table_skip_the_average_check(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    lines = TWO.read_text().splitlines()
    row = next(i for i, ln in enumerate(lines) if ln.strip().startswith("1024 "))
    del lines[row:row + 4]
    lines.insert(row, "# ... (truncated NCCL output for brevity) ...")
    log = tmp_path / "trimmed.log"
    log.write_text("\n".join(lines) + "\n")
    rc, doc, out = imported(capsys, tmp_path, log)
    assert rc == 0, out
    got = codes(doc)
    assert "NCCL_AVG_MISMATCH" not in got and got["NCCL_AVG_NOT_CHECKED"] == "INFO"
    assert "NCCL_TRUNCATED" not in got and got["NCCL_LOG_EDITED"] == "WARN"


def test_a_table_ending_at_max_bytes_without_its_footer_is_no_crash(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, doc, out = imported(capsys, tmp_path,
                            PUBLIC / "sendrecv_maxbytes-row-no-footer_8x-a100_li-plus.log")
    assert rc == 0, out
    got = codes(doc)
    assert got["NCCL_FOOTER_NOT_PASTED"] == "INFO" and "NCCL_TRUNCATED" not in got
    assert "busbw at 1 GiB: median 195.1 GB/s" in busbw(doc)


def test_a_table_ending_short_of_max_bytes_is_still_a_crash(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    lines = (PUBLIC / "sendrecv_maxbytes-row-no-footer_8x-a100_li-plus.log").read_text()
    log = tmp_path / "short.log"
    log.write_text("\n".join(lines.splitlines()[:-1]) + "\n")
    rc, doc, _ = imported(capsys, tmp_path, log)
    assert rc == 1 and codes(doc)["NCCL_TRUNCATED"] == "FAIL"


RANK1 = "#  Rank  1 Group  0 Pid   1406 on         vm device  1 [0000:00:07] NVIDIA H200\n"


@pytest.mark.parametrize("edited", [
    "", RANK1.replace("Group", "Gro\x00up"), RANK1.replace("Rank  1", "Rank  0"),
])
def test_a_two_gpu_log_missing_a_rank_line_is_judged_on_its_busbw(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, edited: str) -> None:
    log = tmp_path / "edited.log"
    log.write_text(TWO.read_text().replace(RANK1, edited, 1))
    rc, doc, out = imported(capsys, tmp_path, log)
    assert rc == 0, out
    got = codes(doc)
    assert "NCCL_NOT_APPLICABLE" not in got and got["NCCL_LOG_EDITED"] == "WARN"
    assert "busbw at 128 MiB: median" in busbw(doc)
    assert "NCCL_REFERENCE" in got  # judged against the 2 x H200 band, as the whole log is
    assert "busbw" in {m["metric"] for m in stored(tmp_path)}


def test_nccls_search_warning_is_info_not_a_failure(capsys: pytest.CaptureFixture[str],
                                                    tmp_path: Path) -> None:
    log = tmp_path / "warn.log"
    log.write_text((PUBLIC / "nccl-warn-path-pattern_2node_nccl-487.log").read_text()
                   + TWO.read_text())
    rc, doc, out = imported(capsys, tmp_path, log)
    assert rc == 0, out
    got = codes(doc)
    assert got["NCCL_WARN_HARMLESS"] == "INFO" and "NCCL_TEST_FAILURE" not in got
    msg = next(f["message"] for f in doc["findings"] if f["code"] == "NCCL_WARN_HARMLESS")
    assert "11 NCCL WARN line(s) report no fault" in msg and "not a fault" in msg


def test_the_footer_missing_after_the_max_bytes_row_of_the_parameters_line(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """maxBytes from `# nThread ... maxBytes 134217728`: the 128 MiB row is the last."""
    lines = TWO.read_text().splitlines()
    last = max(i for i, ln in enumerate(lines) if ln.strip().startswith("134217728 "))
    log = tmp_path / "no-footer.log"
    log.write_text("\n".join(lines[:last + 1]) + "\n")
    rc, doc, out = imported(capsys, tmp_path, log)
    assert rc == 0, out
    got = codes(doc)
    assert got["NCCL_FOOTER_NOT_PASTED"] == "INFO" and "NCCL_TRUNCATED" not in got
    assert "128 MiB, maxBytes" in next(f["message"] for f in doc["findings"]
                                       if f["code"] == "NCCL_FOOTER_NOT_PASTED")


def test_a_footer_without_its_table_and_without_a_mark_is_a_cut_not_a_crash(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    text = (PUBLIC / "all_gather_gke-script-truncated-comment_4x4-b200_dranet.log").read_text()
    log = tmp_path / "unmarked.log"
    log.write_text(text.replace("# ... (truncated NCCL output for brevity) ...\n", ""))
    rc, doc, out = imported(capsys, tmp_path, log)
    assert rc == 0, out
    got = codes(doc)
    assert got["NCCL_ROWS_ELIDED"] == "INFO" and "NCCL_TRUNCATED" not in got
    edited = next(f["message"] for f in doc["findings"] if f["code"] == "NCCL_LOG_EDITED")
    assert "the footer is pasted without the table above it" in edited


def test_nccl_info_nnodes_counts_the_nodes_where_the_host_names_are_one(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Two simulated nodes on one host (NCCL_HOSTID): the rank lines name one host, NCCL INFO
    says nNodes 2."""
    log = FIX / "h200x2" / "nccl-tests" / "all_reduce_mpi_np2_simulated-2node-socket.log"
    rc, doc, out = imported(capsys, tmp_path, log)
    assert rc in (0, 1), out
    run = next(d for d in (tmp_path / "results").iterdir() if d.is_dir())
    assert json.loads((run / "run.json").read_text())["suite"]["imported"]["nodes"] == 2
    rc, _, out = imported(capsys, tmp_path / "again", log, "--nodes", "1")
    assert rc == 2 and "--nodes 1 disagrees with" in out and "NCCL INFO says nNodes 2" in out
