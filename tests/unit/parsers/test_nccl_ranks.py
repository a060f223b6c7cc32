"""How many ranks and nodes a pasted nccl-tests log ran on, and what launchers and authors add.

Each public log (tests/fixtures/public/README.md says where it comes from) is pinned to the
facts read from it: the rank count from every source the log has, the node count, the
launcher's preamble read past as noise, an author's trim read as an elision with the footer
after it. One GPU is said only when every source agrees on one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.parsers._nccl_common import count_nodes, footer_not_pasted
from orchestrator.parsers._noise import NoiseReader, split_by_rank, strip_launcher_prefix
from orchestrator.parsers.nccl_debug import parse_nccl_debug
from orchestrator.parsers.nccl_tests import NcclTestsRun, parse_nccl_tests

FIX = Path(__file__).resolve().parents[2] / "fixtures"
PUBLIC = FIX / "public"
TWO = FIX / "h200x2" / "nccl-tests" / "all_reduce_8B-128M_g2_round1.log"
ONE = FIX / "recipe-h200x1" / "nccl-tests" / "all-reduce-1.log"


def parsed(name: str) -> NcclTestsRun:
    return parse_nccl_tests((PUBLIC / name).read_text(), source=name)


# file: (rows, rank lines, rank count, one GPU, nodes, hosts shown, truncated, rows elided,
#        footer not pasted, noise kinds, edit count, average reported)
PINS: dict[str, tuple[Any, ...]] = {
    # CoreWeave's published GB200 results show the last rank line only
    "all_reduce_gb200-nvl72-72rank-last-rank-line_coreweave.log": (
        5, 1, 72, False, None, 1, False, False, False, [], 2, 745.53),
    "all_reduce_gb200-2rack-144rank-last-rank-line_coreweave.log": (
        6, 1, 144, False, None, 1, False, False, False, [], 2, 688.487),
    "all_reduce_gb200-20rack-1440rank-last-rank-line_coreweave.log": (
        6, 1, 1440, False, None, 1, False, False, False, [], 2, 297.808),
    # a rank list spanning two hosts, cut by the thread's excerpt before the table
    "all_reduce_2host-rank-list-cut_h100_nccl-tests-294.log": (
        0, 12, 12, False, 2, 2, True, False, False, [], 0, None),
    "all_reduce_2host-rank-list-cut_h100_soperator-428.log": (
        0, 12, 12, False, 2, 2, True, False, False, [], 0, None),
    # GKE's nccl-tests script: its preamble is noise, not a header that lost its `#`
    "all_gather_gke-script-preamble_2x8-b200_dranet.log": (
        24, 16, 16, False, 2, 2, False, False, False, ["gke-nccl-script", "ssh"], 0, 59.3638),
    # the same script, the table cut by the author with a comment, the footer pasted after it
    "all_gather_gke-script-truncated-comment_4x4-b200_dranet.log": (
        0, 16, 16, False, 4, 4, False, True, False, ["elision", "gke-nccl-script"], 1, 22.2173),
    "all_gather_gke-script-ssh-warnings-truncated_4x4-b200_dranet.log": (
        0, 16, 16, False, 4, 4, False, True, False, ["elision", "gke-nccl-script", "ssh"], 1,
        11.2291),
    # `kubectl logs` of an MPIJob launcher: `set -x`'s `+ mpirun`, ssh, Open MPI banners
    "all_reduce_mpijob-launcher-kubectl-logs_2x-h200_dranet.log": (
        24, 2, 2, False, 2, 2, False, False, False, ["openmpi-banner", "shell-trace", "ssh"], 0,
        15.5188),
    "all_reduce_kubectl-logs-elided_h100-64_coreweave.log": (
        5, 0, 2, False, 1, 0, False, False, False, ["elision"], 1, 373.187),
    # the table ends at its maxBytes row (`-e 1G` on the pasted command line), no footer
    "sendrecv_maxbytes-row-no-footer_8x-a100_li-plus.log": (
        4, 0, 8, False, 1, 0, True, False, True, ["command-line"], 1, None),
}


@pytest.mark.parametrize("name", sorted(PINS))
def test_a_public_log_reads_as_the_run_it_was(name: str) -> None:
    (rows, shown, count, one, nodes, hosts, truncated, elided, no_footer, noise, edits,
     avg) = PINS[name]
    run = parsed(name)
    assert run.ranks_total is not None
    assert (len(run.rows), len(run.ranks), run.ranks_total.count) == (rows, shown, count)
    assert run.ranks_total.one_gpu is one
    got_nodes, got_hosts = count_nodes(run)
    assert (got_nodes, len(got_hosts)) == (nodes, hosts)
    assert (run.truncated, run.rows_elided, footer_not_pasted(run)) == (
        truncated, elided, no_footer)
    assert sorted({i.kind for i in run.ignored_lines}) == noise
    assert len(run.edits) == edits
    assert run.avg_busbw_reported == avg
    assert run.failures == []


def test_the_last_rank_line_of_1440_says_1440_ranks_and_that_the_list_was_cut() -> None:
    run = parsed("all_reduce_gb200-20rack-1440rank-last-rank-line_coreweave.log")
    assert run.ranks_total is not None
    assert (run.ranks_total.highest, run.ranks_total.busbw_nonzero) == (1440, True)
    assert run.ranks[0].name == "NVIDIA GB200" and run.rows[-1].in_place.busbw_gbs == 404.77
    assert "1 rank line(s) listed, but the highest rank listed says 1440" in run.edits[1].what
    assert "read as 1440 ranks" in run.edits[1].what


def test_the_gke_preamble_lines_are_listed_with_their_numbers() -> None:
    run = parsed("all_gather_gke-script-preamble_2x8-b200_dranet.log")
    assert [(i.line_no, i.kind) for i in run.ignored_lines] == [
        (1, "gke-nccl-script"), (2, "ssh"), (3, "gke-nccl-script"), (4, "gke-nccl-script"),
        (5, "gke-nccl-script"), (6, "gke-nccl-script"), (7, "gke-nccl-script")]
    assert run.ignored_lines[0].text == "Initializing SSH..."
    assert run.nccl_version == "2.26.6" and run.ranks[15].host == "nccl-gib-test-1"


def test_a_host_name_after_the_preamble_is_not_read_past() -> None:
    """`Generating hostfiles for 2 hosts:` announces two names: a third line is no host."""
    text = (PUBLIC / "all_gather_gke-script-preamble_2x8-b200_dranet.log").read_text()
    lines = text.splitlines()
    lines.insert(7, "stray-word")
    run = parse_nccl_tests("\n".join(lines) + "\n")
    assert [i.kind for i in run.ignored_lines if i.text == "stray-word"] == ["unknown"]


def test_the_trim_comment_is_an_elision_and_the_footer_after_it_is_read() -> None:
    run = parsed("all_gather_gke-script-truncated-comment_4x4-b200_dranet.log")
    assert run.edits[0].line_no == 31 and "truncated NCCL output" in run.edits[0].what
    assert run.out_of_bounds is not None and run.out_of_bounds.ok
    assert run.avg_busbw_agrees is None  # no row left to check it against


def test_a_trim_inside_the_table_marks_the_rows_elided() -> None:
    lines = TWO.read_text().splitlines()
    row = next(i for i, ln in enumerate(lines) if ln.strip().startswith("1024 "))
    del lines[row:row + 4]
    lines.insert(row, "# ... (rows cut for brevity: 1 KiB to 8 KiB were truncated) ...")
    run = parse_nccl_tests("\n".join(lines) + "\n")
    assert run.rows_elided and not run.truncated
    assert run.avg_busbw_agrees is False  # the judge skips this check when rows were elided


def test_an_elision_before_the_table_elides_no_row() -> None:
    run = parsed("all_reduce_kubectl-logs-elided_h100-64_coreweave.log")
    assert not run.rows_elided and run.avg_busbw_agrees is True


def test_the_pasted_command_line_gives_the_sizes_and_gpus() -> None:
    run = parsed("sendrecv_maxbytes-row-no-footer_8x-a100_li-plus.log")
    assert run.command == {"b": 128 << 20, "e": 1 << 30, "g": 8}
    assert (run.binary, run.op) == ("sendrecv_perf", "sendrecv")


def test_the_launcher_counts_processes_and_the_binary_its_own_n_is_iterations() -> None:
    run = parsed("all_reduce_mpijob-launcher-kubectl-logs_2x-h200_dranet.log")
    # `mpirun ... -np 2 ... all_reduce_perf -g 1 -b 1K -e 8G -f 2 -w 5 -n 20`
    assert run.command == {"np": 2, "g": 1, "b": 1024, "e": 8 << 30}
    assert run.ranks_total is not None and run.ranks_total.launched == 2


# ------------------------------------------------------------------ one GPU, sources disagreeing

def _without(text: str, what: str, by: str = "") -> str:
    return text.replace(what, by, 1)


RANK1 = "#  Rank  1 Group  0 Pid   1406 on         vm device  1 [0000:00:07] NVIDIA H200\n"


@pytest.mark.parametrize(("how", "edit"), [
    ("deleted", lambda t: _without(t, RANK1)),
    ("nul byte", lambda t: _without(t, RANK1, RANK1.replace("Group", "Gro\x00up"))),
    ("garbled", lambda t: _without(t, RANK1, RANK1.replace("Rank", "Rnak"))),
    ("renumbered to rank 0", lambda t: _without(t, RANK1, RANK1.replace("Rank  1", "Rank  0"))),
])
def test_a_two_gpu_log_with_one_rank_line_left_is_no_one_gpu_log(how: str, edit: Any) -> None:
    text = edit(TWO.read_text())
    assert text != TWO.read_text(), how
    run = parse_nccl_tests(text)
    assert run.ranks_total is not None
    assert len(run.ranks) == 1 and not run.ranks_total.one_gpu
    assert run.ranks_total.count == 2 and run.ranks_total.busbw_nonzero
    assert any("rank line" in e.what for e in run.edits)


def test_one_gpu_when_every_source_agrees() -> None:
    run = parse_nccl_tests(ONE.read_text())
    assert run.ranks_total is not None
    assert run.ranks_total.one_gpu and run.ranks_total.count == 1 and run.edits == []


@pytest.mark.parametrize(("add", "source"), [
    ("mpirun -np 4 ./build/all_reduce_perf -b 8 -e 128M -f 2 -g 1\n", "launcher"),
    ("vm:1:1 [0] NCCL INFO comm 0x1 rank 0 nranks 8 cudaDev 0 busId 6000 - Init COMPLETE\n",
     "NCCL INFO"),
])
def test_one_rank_line_but_another_source_says_more(add: str, source: str) -> None:
    run = parse_nccl_tests(add + ONE.read_text())
    assert run.ranks_total is not None
    assert not run.ranks_total.one_gpu and run.ranks_total.count in (4, 8)
    assert source in run.edits[-1].what


def test_the_busbw_of_broadcast_on_one_gpu_is_its_algbw_and_says_nothing() -> None:
    run = parse_nccl_tests((FIX / "recipe-h200x1-extras" / "coll-broadcast.log").read_text())
    assert run.ranks_total is not None
    assert run.ranks_total.one_gpu and not run.ranks_total.busbw_nonzero


# ------------------------------------------------------------------ launchers, NCCL WARN

def test_open_mpi_aggregated_help_lines_are_noise() -> None:
    noise = NoiseReader()
    lines = (PUBLIC / "openmpi-help-aggregate_run-err_relion-179.txt").read_text().splitlines()
    assert all(noise.skip(i, ln) for i, ln in enumerate(lines, 1))
    assert [i.kind for i in noise.ignored] == ["openmpi-help", "openmpi-help"]


def test_open_mpi_help_lines_inside_a_table_read_past() -> None:
    lines = TWO.read_text().splitlines()
    row = next(i for i, ln in enumerate(lines) if ln.strip().startswith("1024 "))
    help_lines = (PUBLIC / "openmpi-help-aggregate_run-err_relion-179.txt").read_text()
    lines[row:row] = help_lines.splitlines()
    run = parse_nccl_tests("\n".join(lines) + "\n")
    clean = parse_nccl_tests(TWO.read_text())
    assert [r.out_of_place for r in run.rows] == [r.out_of_place for r in clean.rows]
    assert run.edits == [] and run.avg_busbw_agrees


@pytest.mark.parametrize(("prefix", "who"), [
    ("[pod/nccl-test-launcher-x7k2p/mpi-launcher] ", "kubectl logs --prefix"),
    ("2025-06-12T17:01:57.123456789Z ", "kubectl logs --timestamps"),
    ("[pod/nccl-test-launcher-x7k2p/mpi-launcher] 2025-06-12T17:01:57.123456789Z ",
     "kubectl logs --prefix"),
])
def test_kubectl_log_prefixes_are_stripped(prefix: str, who: str) -> None:
    text = "".join(prefix + ln + "\n" for ln in TWO.read_text().splitlines())
    run = parse_nccl_tests(text)
    clean = parse_nccl_tests(TWO.read_text())
    assert run.launcher_prefix == who
    assert run.rows == clean.rows and run.ranks == clean.ranks and run.edits == []
    assert strip_launcher_prefix(text.splitlines())[1] == who


def test_a_file_of_two_pods_is_split_by_pod_and_timestamps_split_nothing() -> None:
    text = "[pod/a/c] one\n[pod/b/c] two\n[pod/a/c] three\n"
    assert split_by_rank(text) == ("kubectl logs --prefix", {"a": "one\nthree\n", "b": "two\n"})
    assert split_by_rank("2025-06-12T17:01:57Z one\n2025-06-12T17:01:58Z two\n") is None


def test_could_not_find_a_path_for_pattern_is_no_failure() -> None:
    text = (PUBLIC / "nccl-warn-path-pattern_2node_nccl-487.log").read_text()
    run = parse_nccl_tests(text + TWO.read_text())
    assert run.failures == []
    assert [i.kind for i in run.ignored_lines] == ["nccl-warn-harmless"] * 11
    facts = parse_nccl_debug(text + "vm:1:1 [0] NCCL INFO NCCL version 2.28.9+cuda13.0\n")
    assert facts.warnings == [] and len(facts.notices) == 11
    assert facts.notices[0].kind.startswith("harmless: NCCL's topology search")


def test_another_nccl_warn_is_still_a_failure() -> None:
    warn = "vm:1:1 [0] misc/ibvwrap.cc:63 NCCL WARN Failed to open libibverbs.so[.1]\n"
    run = parse_nccl_tests(warn + TWO.read_text())
    assert [f.kind for f in run.failures] == ["nccl-warn"]


@pytest.mark.parametrize("mark", [
    "# ... (truncated NCCL output for brevity) ...", "# [...]", "# …", "#  ...",
    "# output omitted", "# (rows snipped)", "# lines 8 B to 4 KiB trimmed", "# cut here",
])
def test_elision_comments_an_author_writes(mark: str) -> None:
    noise = NoiseReader()
    assert noise.skip(7, mark)
    assert [i.kind for i in noise.ignored] == ["elision"] and noise.edits[0].line_no == 7


@pytest.mark.parametrize("line", [
    "#", "# Using devices", "# Avg bus bandwidth    : 1.2", "# Reducing maxBytes to 1073741824 "
    "due to memory limitation", "# (this message is repeated 6 times but disappears if I pass "
    "`HWLOC_COMPONENTS=-gl`)",
])
def test_other_comments_are_no_elision(line: str) -> None:
    noise = NoiseReader()
    noise.skip(1, line)
    assert noise.edits == []


def test_the_published_kubectl_prefix_form_is_the_one_stripped() -> None:
    lines = (PUBLIC / "kubectl-logs-prefix_nginx_kubernetes-123874.txt").read_text().splitlines()
    stripped, who = strip_launcher_prefix(lines)
    assert who == "kubectl logs --prefix"
    assert stripped[0] == "/docker-entrypoint.sh: Launching /docker-entrypoint.d/10-listen-on-" \
                          "ipv6-by-default.sh"
    # one pod only: nothing to split
    assert split_by_rank("\n".join(lines) + "\n") is None
