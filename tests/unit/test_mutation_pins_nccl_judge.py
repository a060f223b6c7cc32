"""Every finding judge_series makes, whole: code, severity, message, evidence and details.

The findings are what a person reads after `gpuvet nccl` and what reports and
comparisons group by, so each scenario below pins the complete list, not a few
words of it. A deliberate change of wording changes EXPECTED with it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchestrator import inventory
from orchestrator.bands import size_text as _size
from orchestrator.inventory import Inventory, Node
from orchestrator.nccltests import BuildDoc
from orchestrator.records import Finding, Measurement
from orchestrator.steps.nccl.judge import Series, judge_series
from orchestrator.store import Run
from orchestrator.suite import Suite

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
H200 = FIXTURES / "h200x2" / "nccl-tests"
SAMPLES = FIXTURES / "nccl-tests"
ROUNDS = [H200 / f"all_reduce_8B-128M_g2_round{r}.log" for r in (1, 2, 3)]
SUITE = Suite()
Judged = tuple[list[Finding], list[Measurement]]


def node(name: str = "n1") -> Node:
    return Node(name=name, provider="lab", executor="local", host=None, port=22, user=None,
                identity_file=None, ssh_alias=None, proxy_jump=None, python="python3",
                work_dir="/tmp/x", ckpt_dir=None, env={}, connect_timeout_s=1)


def make_inv(tmp: Path, fabric: str = "none", band: str = "", nodes: int = 1) -> Inventory:
    names = "\n".join(f"      - name: lab-{i}" for i in range(nodes))
    path = tmp / f"inv-{fabric}-{nodes}-{abs(hash(band))}.yaml"
    path.write_text(f"version: 1\nproviders:\n  lab:\n    executor: local\n    expect:\n"
                    f"      gpu_model: H200\n      fabric: {{type: {fabric}}}\n{band}\n"
                    f"    nodes:\n{names}\n")
    return inventory.load(path)


def edited(src: Path, dst: Path, old: str, new: str) -> Path:
    text = src.read_text()
    assert old in text
    dst.write_text(text.replace(old, new))
    return dst


def logs(*items: Path | tuple[Path, bool]) -> list[tuple[int, Path, bool]]:
    return [(i, *(it if isinstance(it, tuple) else (it, False))) for i, it in enumerate(items, 1)]


# --- scenarios ------------------------------------------------------------------------

def h200_rounds(run: Run, tmp: Path) -> Judged:
    return judge_series(Series("single", [node()], logs(*ROUNDS)), run, None, SUITE)


def crash_truncated(run: Run, tmp: Path) -> Judged:
    return judge_series(Series("single", [node()], logs(
        SAMPLES / "all_reduce_2node-h100_crash-truncated.log")), run, None, SUITE)


def wrong_and_oob(run: Run, tmp: Path) -> Judged:
    return judge_series(Series("single", [node()], logs(
        SAMPLES / "all_reduce_2.19.1_wrong-oob-failed_a100.log")), run, None, SUITE)


def average_mismatch(run: Run, tmp: Path) -> Judged:
    bad = edited(ROUNDS[0], tmp / "avg.log", "# Avg bus bandwidth    : 58.5009",
                 "# Avg bus bandwidth    : 61.0000")
    return judge_series(Series("single", [node()], logs(bad)), run, None, SUITE)


def hung_and_empty(run: Run, tmp: Path) -> Judged:
    """Round 1 hung before printing anything; round 2's log holds only its header."""
    empty = tmp / "empty.log"
    empty.write_text("")
    head = tmp / "head.log"
    head.write_text("".join(ROUNDS[0].read_text().splitlines(keepends=True)[:30]))
    return judge_series(Series("single", [node()], logs((empty, True), head)), run, None, SUITE)


def drop_at_16m_in_two_rounds(run: Run, tmp: Path) -> Judged:
    """16 MiB is the smallest size judged; 8 MiB drops are jitter."""
    slow = edited(ROUNDS[1], tmp / "slow.log",
                  "79.43  211.22  211.22       0", "158.86  105.61  105.61       0")
    slow = edited(slow, tmp / "slow.log", "49.89  168.15  168.15       0",
                  "99.78  84.08  84.08       0")
    return judge_series(Series("single", [node()], logs(ROUNDS[0], slow)), run, None, SUITE)


def socket_fallback(fabric: str) -> Callable[[Run, Path], Judged]:
    def scenario(run: Run, tmp: Path) -> Judged:
        inv = make_inv(tmp, fabric=fabric, nodes=2)
        return judge_series(Series("multi", inv.select(provider="lab"), logs(
            H200 / "all_reduce_mpi_np2_simulated-2node-socket.log")), run, inv, SUITE)
    return scenario


def ib_gdrdma(run: Run, tmp: Path) -> Judged:
    inv = make_inv(tmp, fabric="ib", nodes=2)
    return judge_series(Series("multi", inv.select(provider="lab"), logs(
        SAMPLES / "all_reduce_2node-h100_ib-gdrdma_nccl-info.log")), run, inv, SUITE)


def inventory_bands(run: Run, tmp: Path) -> Judged:
    band = ("      nccl_busbw:\n"
            "        - {value: 300, lower: 250, upper: 360, size: 128M, note: ordered NVLink}\n"
            "        - {value: 400, lower: 350, upper: 450, size: 4G}")
    inv = make_inv(tmp, band=band)
    return judge_series(Series("single", inv.select(provider="lab"), logs(*ROUNDS)), run, inv,
                        SUITE)


def inventory_band_of_another_size(run: Run, tmp: Path) -> Judged:
    inv = make_inv(tmp, band="      nccl_busbw: {value: 400, lower: 350, upper: 450, size: 4G}")
    return judge_series(Series("single", inv.select(provider="lab"), logs(ROUNDS[0])), run, inv,
                        SUITE)


def nothing_shipped(run: Run, tmp: Path) -> Judged:
    return judge_series(Series("single", [node()], logs(
        SAMPLES / "all_reduce_2.17.6_timestamps_h100.log")), run, None, SUITE)


def imported_torch(run: Run, tmp: Path) -> Judged:
    return judge_series(Series("single", [], logs(ROUNDS[0]), engine="torch", provider="cap",
                               n_nodes=1, imported=True), run, None, SUITE, suite_hash="imp")


def parameters_only(run: Run, tmp: Path) -> Judged:
    """A log that stops after its parameter lines: nothing failed, nothing measured."""
    head = tmp / "params.log"
    head.write_text("".join(ROUNDS[0].read_text().splitlines(keepends=True)[:9]))
    return judge_series(Series("single", [node()], logs(head)), run, None, SUITE)


def latin1_byte(run: Run, tmp: Path) -> Judged:
    bad = tmp / "latin1.log"
    bad.write_bytes(ROUNDS[0].read_bytes().replace(b"# nThread", b"# caf\xe9\n# nThread", 1))
    return judge_series(Series("single", [node()], logs(bad)), run, None, SUITE)


def no_version_line(run: Run, tmp: Path) -> Judged:
    src = H200 / "all_reduce_mpi_np2_simulated-2node-socket.log"
    lines = [ln for ln in src.read_text().splitlines(keepends=True) if "NCCL version" not in ln]
    log = tmp / "noversion.log"
    log.write_text("".join(lines))
    return judge_series(Series("single", [node()], logs(log)), run, None, SUITE)


def imported_multi_with_inventory(run: Run, tmp: Path) -> Judged:
    """An imported series names no inventory node: no fabric to hold it to."""
    inv = make_inv(tmp, fabric="ib", nodes=2)
    return judge_series(Series("multi", [], logs(H200 / "all_reduce_mpi_np2_simulated-2node-socket.log"),
                               provider="lab", n_nodes=2, imported=True), run, inv, SUITE)


def band_below_and_above(run: Run, tmp: Path) -> Judged:
    band = ("      nccl_busbw:\n"
            "        - {value: 400, lower: 350, upper: 450, size: 128M, note: ordered NVSwitch}\n"
            "        - {value: 2, lower: 1, upper: 3, size: 16M}")
    inv = make_inv(tmp, band=band)
    return judge_series(Series("single", inv.select(provider="lab"), logs(ROUNDS[0])), run, inv,
                        SUITE)


SCENARIOS: dict[str, Callable[[Run, Path], Judged]] = {
    "parameters_only": parameters_only, "latin1_byte": latin1_byte,
    "no_version_line": no_version_line,
    "imported_multi_with_inventory": imported_multi_with_inventory,
    "band_below_and_above": band_below_and_above,
    "h200_rounds": h200_rounds, "crash_truncated": crash_truncated,
    "wrong_and_oob": wrong_and_oob, "average_mismatch": average_mismatch,
    "hung_and_empty": hung_and_empty, "drop_at_16m_in_two_rounds": drop_at_16m_in_two_rounds,
    "socket_fallback_ib": socket_fallback("ib"), "socket_fallback_roce": socket_fallback("roce"),
    "socket_fallback_efa": socket_fallback("efa"), "ib_gdrdma": ib_gdrdma,
    "inventory_bands": inventory_bands,
    "inventory_band_of_another_size": inventory_band_of_another_size,
    "nothing_shipped": nothing_shipped, "imported_torch": imported_torch,
}


def described(findings: list[Finding], tmp: Path) -> list[dict[str, Any]]:
    def path(p: str) -> str:
        return p.replace(str(H200), "H200").replace(str(SAMPLES), "SAMPLES").replace(str(tmp), "TMP")

    return [{"code": f.code, "severity": f.severity, "node": f.node, "message": path(f.message),
             "evidence": [path(e) for e in f.evidence], "details": f.details} for f in findings]


@pytest.fixture
def run(tmp_path: Path) -> Run:
    return Run.create(tmp_path / "results", command="test", suite_hash=SUITE.hash,
                      suite=SUITE.model_dump(mode="json"), inventory_path=None)


def pinned(findings: list[Finding]) -> list[Finding]:
    """Of the failure lines the parser reports, the first stands for the rest: which lines
    are failures is the parser's to decide (and its tests' to pin)."""
    failures = [f for f in findings if f.code == "NCCL_TEST_FAILURE"]
    return [f for f in findings if f.code != "NCCL_TEST_FAILURE" or f is failures[0]]


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_findings_are_exactly(name: str, run: Run, tmp_path: Path) -> None:
    findings, _ = SCENARIOS[name](run, tmp_path)
    assert all(f.run_id == run.run_id and f.step == "nccl" for f in findings)
    assert described(pinned(findings), tmp_path) == EXPECTED[name]


def test_measurements_carry_their_context(run: Run, tmp_path: Path) -> None:
    _, ms = h200_rounds(run, tmp_path)
    assert len(ms) == 3 * 25 * 2 * 3  # rounds x sizes x (out-of-place, in-place) x metrics
    first = ms[0]
    assert (first.provider, first.nodes, first.step, first.scope, first.engine, first.round,
            first.size, first.inplace, first.suite_hash) == (
        "lab", ["n1"], "nccl", "single", "nccl-tests", 1, 8, False, SUITE.hash)
    assert [(m.metric, m.unit, m.inplace) for m in ms[:6]] == [
        ("busbw", "GB/s", False), ("algbw", "GB/s", False), ("time", "us", False),
        ("busbw", "GB/s", True), ("algbw", "GB/s", True), ("time", "us", True)]
    assert first.tags == {"op": "all_reduce", "nccl_version": "2.28.9", "nccl_tests_commit": None,
                          "nccl_tests_version": "2.19.6", "gpus": 2, "n_nodes": 1,
                          "type": "float", "wrong": 0}
    built = judge_series(Series("single", [node()], logs(ROUNDS[0]),
                                build=BuildDoc(built_commit="c" * 40)), run, None, SUITE)[1]
    assert built[0].tags["nccl_tests_commit"] == "c" * 40
    _, imported = imported_torch(run, tmp_path)
    assert imported[0].tags["imported"] is True and imported[0].tags["n_nodes"] == 1
    assert (imported[0].provider, imported[0].nodes, imported[0].engine,
            imported[0].suite_hash) == ("cap", [], "torch", "imp")


@pytest.mark.parametrize(("n", "text"), [
    (8, "8 B"), (1000, "1000 B"), (1024, "1 KiB"), (3 << 10, "3 KiB"), (1 << 20, "1 MiB"),
    (16 << 20, "16 MiB"), (1536 << 10, "1536 KiB"), (1 << 30, "1 GiB"), (4 << 30, "4 GiB"),
])
def test_sizes_are_written_in_the_largest_whole_unit(n: int, text: str) -> None:
    assert _size(n) == text


EXPECTED: dict[str, list[dict[str, Any]]] = {'parameters_only': [{'code': 'NCCL_TRUNCATED',
                      'severity': 'FAIL',
                      'node': 'n1',
                      'message': '[single] round 1: output ends inside the table (the run crashed '
                                 'or was killed)',
                      'evidence': ['TMP/params.log'],
                      'details': {'scope': 'single', 'engine': 'nccl-tests'}},
                     {'code': 'NCCL_NO_RESULTS',
                      'severity': 'FAIL',
                      'node': 'n1',
                      'message': '[single] round 1: no result rows',
                      'evidence': ['TMP/params.log'],
                      'details': {'scope': 'single', 'engine': 'nccl-tests'}}],
 'latin1_byte': [{'code': 'NCCL_BUSBW',
                  'severity': 'INFO',
                  'node': 'n1',
                  'message': '[single] busbw at 128 MiB: median 284.4 GB/s over 1 round(s) (min '
                             '284.4, max 284.4, cv 0.0%)',
                  'evidence': ['TMP/latin1.log'],
                  'details': {'scope': 'single',
                              'engine': 'nccl-tests',
                              'size': 134217728,
                              'median': 284.39}},
                 {'code': 'NCCL_REFERENCE',
                  'severity': 'PASS',
                  'node': 'n1',
                  'message': '[single] busbw 284.4 GB/s at 128 MiB is within the reference band '
                             '250-320 GB/s (expected about 285, shipped; 2x H200 SXM, NV18 between '
                             'them; measured 284-286 at 128 MiB, 345-348 at 4 GiB; source: '
                             "gpuvet's capture, tests/fixtures/h200x2 (README-h200x2.md); "
                             'unverified: NVLink links per GPU pair)',
                  'evidence': ['TMP/latin1.log'],
                  'details': {'scope': 'single',
                              'engine': 'nccl-tests',
                              'size': 134217728,
                              'judged': {'value': 284.39,
                                         'reference': 285.0,
                                         'lower': 250.0,
                                         'upper': 320.0,
                                         'unit': 'GB/s',
                                         'size': 134217728,
                                         'result': 'within',
                                         'note': '2x H200 SXM, NV18 between them; measured 284-286 '
                                                 'at 128 MiB, 345-348 at 4 GiB'},
                              'source': 'shipped',
                              'reference_source': "gpuvet's capture, tests/fixtures/h200x2 "
                                                  '(README-h200x2.md)',
                              'unverified': ['NVLink links per GPU pair']}}],
 'no_version_line': [{'code': 'NCCL_TRANSPORTS',
                      'severity': 'INFO',
                      'node': 'n1',
                      'message': '[single] NCCL ?, 2 rank(s) on 2 node(s), transports: NET/Socket; '
                                 'NICs Socket:eth0',
                      'evidence': ['TMP/noversion.log'],
                      'details': {'scope': 'single',
                                  'engine': 'nccl-tests',
                                  'transports': ['NET/Socket'],
                                  'n_nodes': 2,
                                  'interfaces': ['Socket:eth0'],
                                  'networks': ['Socket']}},
                     {'code': 'NCCL_BUSBW',
                      'severity': 'INFO',
                      'node': 'n1',
                      'message': '[single] busbw at 1 GiB: median 2.4 GB/s over 1 round(s) (min '
                                 '2.4, max 2.4, cv 0.0%)',
                      'evidence': ['TMP/noversion.log'],
                      'details': {'scope': 'single',
                                  'engine': 'nccl-tests',
                                  'size': 1073741824,
                                  'median': 2.39}},
                     {'code': 'NCCL_REFERENCE_NONE',
                      'severity': 'INFO',
                      'node': 'n1',
                      'message': '[single] no reference band applies to this run: the shipped '
                                 'bands are for 128M, 4G, which this run did not measure',
                      'evidence': ['TMP/noversion.log'],
                      'details': {'scope': 'single', 'engine': 'nccl-tests'}}],
 'imported_multi_with_inventory': [{'code': 'NCCL_TRANSPORTS',
                                    'severity': 'INFO',
                                    'node': None,
                                    'message': '[multi] NCCL 2.28.9, 2 rank(s) on 2 node(s), '
                                               'transports: NET/Socket; NICs Socket:eth0',
                                    'evidence': ['H200/all_reduce_mpi_np2_simulated-2node-socket.log'],
                                    'details': {'scope': 'multi',
                                                'engine': 'nccl-tests',
                                                'transports': ['NET/Socket'],
                                                'n_nodes': 2,
                                                'interfaces': ['Socket:eth0'],
                                                'networks': ['Socket']}},
                                   {'code': 'NCCL_BUSBW',
                                    'severity': 'INFO',
                                    'node': None,
                                    'message': '[multi] busbw at 1 GiB: median 2.4 GB/s over 1 '
                                               'round(s) (min 2.4, max 2.4, cv 0.0%)',
                                    'evidence': ['H200/all_reduce_mpi_np2_simulated-2node-socket.log'],
                                    'details': {'scope': 'multi',
                                                'engine': 'nccl-tests',
                                                'size': 1073741824,
                                                'median': 2.39}},
                                   {'code': 'NCCL_REFERENCE_NONE',
                                    'severity': 'INFO',
                                    'node': None,
                                    'message': '[multi] no reference band applies to this run: the '
                                               'shipped bands of this GPU assume another machine: '
                                               'they are for 2x H200 SXM on 1 node, 8x H200 SXM on '
                                               '1 node, 8x H200 SXM on 2 nodes; this run has 1 '
                                               'GPU(s) per node on 2 node(s) (the log)',
                                    'evidence': ['H200/all_reduce_mpi_np2_simulated-2node-socket.log'],
                                    'details': {'scope': 'multi',
                                                'engine': 'nccl-tests',
                                                'assumptions_differ': ['they are for 2x H200 SXM '
                                                                       'on 1 node, 8x H200 SXM on '
                                                                       '1 node, 8x H200 SXM on 2 '
                                                                       'nodes; this run has 1 '
                                                                       'GPU(s) per node on 2 '
                                                                       'node(s) (the log)']}}],
 'band_below_and_above': [{'code': 'NCCL_BUSBW',
                           'severity': 'INFO',
                           'node': 'lab-0',
                           'message': '[single] busbw at 128 MiB: median 284.4 GB/s over 1 '
                                      'round(s) (min 284.4, max 284.4, cv 0.0%)',
                           'evidence': ['H200/all_reduce_8B-128M_g2_round1.log'],
                           'details': {'scope': 'single',
                                       'engine': 'nccl-tests',
                                       'size': 134217728,
                                       'median': 284.39}},
                          {'code': 'NCCL_REFERENCE',
                           'severity': 'INFO',
                           'node': 'lab-0',
                           'message': '[single] busbw 212.9 GB/s at 16 MiB is above the reference '
                                      'band (faster than the band expects: check that the band '
                                      'describes this machine) 1-3 GB/s (expected about 2, '
                                      'inventory)',
                           'evidence': ['H200/all_reduce_8B-128M_g2_round1.log'],
                           'details': {'scope': 'single',
                                       'engine': 'nccl-tests',
                                       'size': 16777216,
                                       'judged': {'value': 212.89,
                                                  'reference': 2.0,
                                                  'lower': 1.0,
                                                  'upper': 3.0,
                                                  'unit': 'GB/s',
                                                  'size': 16777216,
                                                  'result': 'above',
                                                  'note': None},
                                       'source': 'inventory'}},
                          {'code': 'NCCL_REFERENCE',
                           'severity': 'WARN',
                           'node': 'lab-0',
                           'message': '[single] busbw 284.4 GB/s at 128 MiB is below the reference '
                                      'band 350-450 GB/s (expected about 400, inventory; ordered '
                                      'NVSwitch)',
                           'evidence': ['H200/all_reduce_8B-128M_g2_round1.log'],
                           'details': {'scope': 'single',
                                       'engine': 'nccl-tests',
                                       'size': 134217728,
                                       'judged': {'value': 284.39,
                                                  'reference': 400.0,
                                                  'lower': 350.0,
                                                  'upper': 450.0,
                                                  'unit': 'GB/s',
                                                  'size': 134217728,
                                                  'result': 'below',
                                                  'note': 'ordered NVSwitch'},
                                       'source': 'inventory'}}],
 'h200_rounds': [{'code': 'NCCL_BUSBW',
                  'severity': 'INFO',
                  'node': 'n1',
                  'message': '[single] busbw at 128 MiB: median 285.3 GB/s over 3 round(s) (min '
                             '284.4, max 285.8, cv 0.3%)',
                  'evidence': ['H200/all_reduce_8B-128M_g2_round1.log',
                               'H200/all_reduce_8B-128M_g2_round2.log',
                               'H200/all_reduce_8B-128M_g2_round3.log'],
                  'details': {'scope': 'single',
                              'engine': 'nccl-tests',
                              'size': 134217728,
                              'median': 285.29}},
                 {'code': 'NCCL_REFERENCE',
                  'severity': 'PASS',
                  'node': 'n1',
                  'message': '[single] busbw 285.3 GB/s at 128 MiB is within the reference band '
                             '250-320 GB/s (expected about 285, shipped; 2x H200 SXM, NV18 between '
                             'them; measured 284-286 at 128 MiB, 345-348 at 4 GiB; source: '
                             "gpuvet's capture, tests/fixtures/h200x2 (README-h200x2.md); "
                             'unverified: NVLink links per GPU pair)',
                  'evidence': ['H200/all_reduce_8B-128M_g2_round1.log',
                               'H200/all_reduce_8B-128M_g2_round2.log',
                               'H200/all_reduce_8B-128M_g2_round3.log'],
                  'details': {'scope': 'single',
                              'engine': 'nccl-tests',
                              'size': 134217728,
                              'judged': {'value': 285.29,
                                         'reference': 285.0,
                                         'lower': 250.0,
                                         'upper': 320.0,
                                         'unit': 'GB/s',
                                         'size': 134217728,
                                         'result': 'within',
                                         'note': '2x H200 SXM, NV18 between them; measured 284-286 '
                                                 'at 128 MiB, 345-348 at 4 GiB'},
                              'source': 'shipped',
                              'reference_source': "gpuvet's capture, tests/fixtures/h200x2 "
                                                  '(README-h200x2.md)',
                              'unverified': ['NVLink links per GPU pair']}}],
 'crash_truncated': [{'code': 'NCCL_TEST_FAILURE',
                      'severity': 'FAIL',
                      'node': 'n1',
                      'message': '[single] round 1, line 36: nccl-warn: gpu-node-018:52006:52101 '
                                 '[3] transport/net_ib.cc:2104 NCCL WARN NET/IB: Got completion '
                                 'from peer 10.20.1.17<48211> with status=IBV_WC_RETRY_EXC_ERR(12) '
                                 'opcode=IBV_WC_SEND(0) reqSize=0 vendor_err=129 r',
                      'evidence': ['SAMPLES/all_reduce_2node-h100_crash-truncated.log'],
                      'details': {'scope': 'single',
                                  'engine': 'nccl-tests',
                                  'line': 36,
                                  'kind': 'nccl-warn'}},
                     {'code': 'NCCL_TRUNCATED',
                      'severity': 'FAIL',
                      'node': 'n1',
                      'message': '[single] round 1: output ends inside the table (the run crashed '
                                 'or was killed)',
                      'evidence': ['SAMPLES/all_reduce_2node-h100_crash-truncated.log'],
                      'details': {'scope': 'single', 'engine': 'nccl-tests'}},
                     {'code': 'NCCL_TRANSPORTS',
                      'severity': 'INFO',
                      'node': 'n1',
                      'message': '[single] NCCL 2.26.5, ? rank(s) on ? node(s), transports: none '
                                 'seen',
                      'evidence': ['SAMPLES/all_reduce_2node-h100_crash-truncated.log'],
                      'details': {'scope': 'single',
                                  'engine': 'nccl-tests',
                                  'transports': [],
                                  'n_nodes': None,
                                  'interfaces': [],
                                  'networks': []}},
                     {'code': 'NCCL_BUSBW',
                      'severity': 'INFO',
                      'node': 'n1',
                      'message': '[single] busbw at 128 MiB: median 340.2 GB/s over 1 round(s) '
                                 '(min 340.2, max 340.2, cv 0.0%)',
                      'evidence': ['SAMPLES/all_reduce_2node-h100_crash-truncated.log'],
                      'details': {'scope': 'single',
                                  'engine': 'nccl-tests',
                                  'size': 134217728,
                                  'median': 340.23}},
                     {'code': 'NCCL_REFERENCE_NONE',
                      'severity': 'INFO',
                      'node': 'n1',
                      'message': '[single] no reference band applies to this run: the shipped '
                                 'bands of this GPU assume another machine: they are for 8x H100 '
                                 'SXM on 1 node, 8x H100 SXM on 2 nodes; this run has 16 GPU(s) '
                                 'per node on 1 node(s) (the log)',
                      'evidence': ['SAMPLES/all_reduce_2node-h100_crash-truncated.log'],
                      'details': {'scope': 'single',
                                  'engine': 'nccl-tests',
                                  'assumptions_differ': ['they are for 8x H100 SXM on 1 node, 8x '
                                                         'H100 SXM on 2 nodes; this run has 16 '
                                                         'GPU(s) per node on 1 node(s) (the '
                                                         'log)']}}],
 'wrong_and_oob': [{'code': 'NCCL_TEST_FAILURE',
                    'severity': 'FAIL',
                    'node': 'n1',
                    'message': '[single] round 1, line 25: wrong: 67108864      16777216     '
                               'float     sum      -1   540.56  124.15  217.26       0   534.91  '
                               '125.46  219.55       1',
                    'evidence': ['SAMPLES/all_reduce_2.19.1_wrong-oob-failed_a100.log'],
                    'details': {'scope': 'single',
                                'engine': 'nccl-tests',
                                'line': 25,
                                'kind': 'wrong'}},
                   {'code': 'NCCL_BUSBW',
                    'severity': 'INFO',
                    'node': 'n1',
                    'message': '[single] busbw at 1 GiB: median 231.2 GB/s over 1 round(s) (min '
                               '231.2, max 231.2, cv 0.0%)',
                    'evidence': ['SAMPLES/all_reduce_2.19.1_wrong-oob-failed_a100.log'],
                    'details': {'scope': 'single',
                                'engine': 'nccl-tests',
                                'size': 1073741824,
                                'median': 231.15}},
                   {'code': 'NCCL_REFERENCE_NONE',
                    'severity': 'INFO',
                    'node': 'n1',
                    'message': '[single] no reference band applies to this run: the shipped bands '
                               'are for 8G, which this run did not measure',
                    'evidence': ['SAMPLES/all_reduce_2.19.1_wrong-oob-failed_a100.log'],
                    'details': {'scope': 'single', 'engine': 'nccl-tests'}}],
 'average_mismatch': [{'code': 'NCCL_AVG_MISMATCH',
                       'severity': 'WARN',
                       'node': 'n1',
                       'message': '[single] round 1: reported average bus bandwidth 61.0 differs '
                                  "from the rows' mean 58.500",
                       'evidence': ['TMP/avg.log'],
                       'details': {'scope': 'single', 'engine': 'nccl-tests'}},
                      {'code': 'NCCL_BUSBW',
                       'severity': 'INFO',
                       'node': 'n1',
                       'message': '[single] busbw at 128 MiB: median 284.4 GB/s over 1 round(s) '
                                  '(min 284.4, max 284.4, cv 0.0%)',
                       'evidence': ['TMP/avg.log'],
                       'details': {'scope': 'single',
                                   'engine': 'nccl-tests',
                                   'size': 134217728,
                                   'median': 284.39}},
                      {'code': 'NCCL_REFERENCE',
                       'severity': 'PASS',
                       'node': 'n1',
                       'message': '[single] busbw 284.4 GB/s at 128 MiB is within the reference '
                                  'band 250-320 GB/s (expected about 285, shipped; 2x H200 SXM, '
                                  'NV18 between them; measured 284-286 at 128 MiB, 345-348 at 4 '
                                  "GiB; source: gpuvet's capture, tests/fixtures/h200x2 "
                                  '(README-h200x2.md); unverified: NVLink links per GPU pair)',
                       'evidence': ['TMP/avg.log'],
                       'details': {'scope': 'single',
                                   'engine': 'nccl-tests',
                                   'size': 134217728,
                                   'judged': {'value': 284.39,
                                              'reference': 285.0,
                                              'lower': 250.0,
                                              'upper': 320.0,
                                              'unit': 'GB/s',
                                              'size': 134217728,
                                              'result': 'within',
                                              'note': '2x H200 SXM, NV18 between them; measured '
                                                      '284-286 at 128 MiB, 345-348 at 4 GiB'},
                                   'source': 'shipped',
                                   'reference_source': "gpuvet's capture, tests/fixtures/h200x2 "
                                                       '(README-h200x2.md)',
                                   'unverified': ['NVLink links per GPU pair']}}],
 'hung_and_empty': [{'code': 'NCCL_TIMEOUT',
                     'severity': 'FAIL',
                     'node': 'n1',
                     'message': '[single] round 1 hung and was killed after 900 s',
                     'evidence': ['TMP/empty.log'],
                     'details': {'scope': 'single', 'engine': 'nccl-tests'}},
                    {'code': 'NCCL_OUTPUT_UNREADABLE',
                     'severity': 'FAIL',
                     'node': 'n1',
                     'message': '[single] round 1: cannot parse nccl-tests output at '
                                'TMP/empty.log: no nccl-tests parameters line (`# nThread ...`) or '
                                'results table found',
                     'evidence': ['TMP/empty.log'],
                     'details': {'scope': 'single', 'engine': 'nccl-tests'}},
                    {'code': 'NCCL_TRUNCATED',
                     'severity': 'FAIL',
                     'node': 'n1',
                     'message': '[single] round 2: output ends inside the table (the run crashed '
                                'or was killed)',
                     'evidence': ['TMP/head.log'],
                     'details': {'scope': 'single', 'engine': 'nccl-tests'}},
                    {'code': 'NCCL_BUSBW',
                     'severity': 'INFO',
                     'node': 'n1',
                     'message': '[single] busbw at 1 MiB: median 53.1 GB/s over 1 round(s) (min '
                                '53.1, max 53.1, cv 0.0%)',
                     'evidence': ['TMP/head.log'],
                     'details': {'scope': 'single',
                                 'engine': 'nccl-tests',
                                 'size': 1048576,
                                 'median': 53.13}},
                    {'code': 'NCCL_REFERENCE_NONE',
                     'severity': 'INFO',
                     'node': 'n1',
                     'message': '[single] no reference band applies to this run: the shipped bands '
                                'are for 128M, 4G, which this run did not measure',
                     'evidence': ['TMP/head.log'],
                     'details': {'scope': 'single', 'engine': 'nccl-tests'}}],
 'drop_at_16m_in_two_rounds': [{'code': 'NCCL_AVG_MISMATCH',
                                'severity': 'WARN',
                                'node': 'n1',
                                'message': '[single] round 2: reported average bus bandwidth '
                                           "57.9194 differs from the rows' mean 54.126",
                                'evidence': ['TMP/slow.log'],
                                'details': {'scope': 'single', 'engine': 'nccl-tests'}},
                               {'code': 'NCCL_ROUND_DROP',
                                'severity': 'WARN',
                                'node': 'n1',
                                'message': '[single] 16 MiB: round(s) [2] more than 10% below the '
                                           'median 159.2 GB/s (212.9, 105.6)',
                                'evidence': ['H200/all_reduce_8B-128M_g2_round1.log',
                                             'TMP/slow.log'],
                                'details': {'scope': 'single',
                                            'engine': 'nccl-tests',
                                            'size': 16777216,
                                            'values': [212.89, 105.61]}},
                               {'code': 'NCCL_BUSBW',
                                'severity': 'INFO',
                                'node': 'n1',
                                'message': '[single] busbw at 128 MiB: median 285.1 GB/s over 2 '
                                           'round(s) (min 284.4, max 285.8, cv 0.4%)',
                                'evidence': ['H200/all_reduce_8B-128M_g2_round1.log',
                                             'TMP/slow.log'],
                                'details': {'scope': 'single',
                                            'engine': 'nccl-tests',
                                            'size': 134217728,
                                            'median': 285.11}},
                               {'code': 'NCCL_REFERENCE',
                                'severity': 'PASS',
                                'node': 'n1',
                                'message': '[single] busbw 285.1 GB/s at 128 MiB is within the '
                                           'reference band 250-320 GB/s (expected about 285, '
                                           'shipped; 2x H200 SXM, NV18 between them; measured '
                                           "284-286 at 128 MiB, 345-348 at 4 GiB; source: gpuvet's "
                                           'capture, tests/fixtures/h200x2 (README-h200x2.md); '
                                           'unverified: NVLink links per GPU pair)',
                                'evidence': ['H200/all_reduce_8B-128M_g2_round1.log',
                                             'TMP/slow.log'],
                                'details': {'scope': 'single',
                                            'engine': 'nccl-tests',
                                            'size': 134217728,
                                            'judged': {'value': 285.11,
                                                       'reference': 285.0,
                                                       'lower': 250.0,
                                                       'upper': 320.0,
                                                       'unit': 'GB/s',
                                                       'size': 134217728,
                                                       'result': 'within',
                                                       'note': '2x H200 SXM, NV18 between them; '
                                                               'measured 284-286 at 128 MiB, '
                                                               '345-348 at 4 GiB'},
                                            'source': 'shipped',
                                            'reference_source': "gpuvet's capture, "
                                                                'tests/fixtures/h200x2 '
                                                                '(README-h200x2.md)',
                                            'unverified': ['NVLink links per GPU pair']}}],
 'socket_fallback_ib': [{'code': 'NCCL_TRANSPORTS',
                         'severity': 'INFO',
                         'node': None,
                         'message': '[multi] NCCL 2.28.9, 2 rank(s) on 2 node(s), transports: '
                                    'NET/Socket; NICs Socket:eth0',
                         'evidence': ['H200/all_reduce_mpi_np2_simulated-2node-socket.log'],
                         'details': {'scope': 'multi',
                                     'engine': 'nccl-tests',
                                     'transports': ['NET/Socket'],
                                     'n_nodes': 2,
                                     'interfaces': ['Socket:eth0'],
                                     'networks': ['Socket']}},
                        {'code': 'NCCL_SOCKET_FALLBACK',
                         'severity': 'FAIL',
                         'node': None,
                         'message': '[multi] round 1: ib was ordered but NCCL talks between nodes '
                                    'over TCP sockets (NET/Socket, log lines 80, 82, 83, 84, 85); '
                                    'check the RDMA devices, NCCL_IB_HCA and the network plugin',
                         'evidence': ['H200/all_reduce_mpi_np2_simulated-2node-socket.log'],
                         'details': {'scope': 'multi',
                                     'engine': 'nccl-tests',
                                     'lines': [80, 82, 83, 84, 85]}},
                        {'code': 'NCCL_BUSBW',
                         'severity': 'INFO',
                         'node': None,
                         'message': '[multi] busbw at 1 GiB: median 2.4 GB/s over 1 round(s) (min '
                                    '2.4, max 2.4, cv 0.0%)',
                         'evidence': ['H200/all_reduce_mpi_np2_simulated-2node-socket.log'],
                         'details': {'scope': 'multi',
                                     'engine': 'nccl-tests',
                                     'size': 1073741824,
                                     'median': 2.39}},
                        {'code': 'NCCL_REFERENCE_NONE',
                         'severity': 'INFO',
                         'node': None,
                         'message': '[multi] no reference band applies to this run: the shipped '
                                    'bands of this GPU assume another machine: they are for 2x '
                                    'H200 SXM on 1 node, 8x H200 SXM on 1 node, 8x H200 SXM on 2 '
                                    'nodes; this run has 1 GPU(s) per node on 2 node(s) (the log)',
                         'evidence': ['H200/all_reduce_mpi_np2_simulated-2node-socket.log'],
                         'details': {'scope': 'multi',
                                     'engine': 'nccl-tests',
                                     'assumptions_differ': ['they are for 2x H200 SXM on 1 node, '
                                                            '8x H200 SXM on 1 node, 8x H200 SXM on '
                                                            '2 nodes; this run has 1 GPU(s) per '
                                                            'node on 2 node(s) (the log)']}}],
 'socket_fallback_roce': [{'code': 'NCCL_TRANSPORTS',
                           'severity': 'INFO',
                           'node': None,
                           'message': '[multi] NCCL 2.28.9, 2 rank(s) on 2 node(s), transports: '
                                      'NET/Socket; NICs Socket:eth0',
                           'evidence': ['H200/all_reduce_mpi_np2_simulated-2node-socket.log'],
                           'details': {'scope': 'multi',
                                       'engine': 'nccl-tests',
                                       'transports': ['NET/Socket'],
                                       'n_nodes': 2,
                                       'interfaces': ['Socket:eth0'],
                                       'networks': ['Socket']}},
                          {'code': 'NCCL_SOCKET_FALLBACK',
                           'severity': 'FAIL',
                           'node': None,
                           'message': '[multi] round 1: roce was ordered but NCCL talks between '
                                      'nodes over TCP sockets (NET/Socket, log lines 80, 82, 83, '
                                      '84, 85); check the RDMA devices, NCCL_IB_HCA and the '
                                      'network plugin',
                           'evidence': ['H200/all_reduce_mpi_np2_simulated-2node-socket.log'],
                           'details': {'scope': 'multi',
                                       'engine': 'nccl-tests',
                                       'lines': [80, 82, 83, 84, 85]}},
                          {'code': 'NCCL_BUSBW',
                           'severity': 'INFO',
                           'node': None,
                           'message': '[multi] busbw at 1 GiB: median 2.4 GB/s over 1 round(s) '
                                      '(min 2.4, max 2.4, cv 0.0%)',
                           'evidence': ['H200/all_reduce_mpi_np2_simulated-2node-socket.log'],
                           'details': {'scope': 'multi',
                                       'engine': 'nccl-tests',
                                       'size': 1073741824,
                                       'median': 2.39}},
                          {'code': 'NCCL_REFERENCE_NONE',
                           'severity': 'INFO',
                           'node': None,
                           'message': '[multi] no reference band applies to this run: the shipped '
                                      'bands of this GPU assume another machine: they are for 2x '
                                      'H200 SXM on 1 node, 8x H200 SXM on 1 node, 8x H200 SXM on 2 '
                                      'nodes; this run has 1 GPU(s) per node on 2 node(s) (the '
                                      'log)',
                           'evidence': ['H200/all_reduce_mpi_np2_simulated-2node-socket.log'],
                           'details': {'scope': 'multi',
                                       'engine': 'nccl-tests',
                                       'assumptions_differ': ['they are for 2x H200 SXM on 1 node, '
                                                              '8x H200 SXM on 1 node, 8x H200 SXM '
                                                              'on 2 nodes; this run has 1 GPU(s) '
                                                              'per node on 2 node(s) (the log)']}}],
 'socket_fallback_efa': [{'code': 'NCCL_TRANSPORTS',
                          'severity': 'INFO',
                          'node': None,
                          'message': '[multi] NCCL 2.28.9, 2 rank(s) on 2 node(s), transports: '
                                     'NET/Socket; NICs Socket:eth0',
                          'evidence': ['H200/all_reduce_mpi_np2_simulated-2node-socket.log'],
                          'details': {'scope': 'multi',
                                      'engine': 'nccl-tests',
                                      'transports': ['NET/Socket'],
                                      'n_nodes': 2,
                                      'interfaces': ['Socket:eth0'],
                                      'networks': ['Socket']}},
                         {'code': 'NCCL_SOCKET_FALLBACK',
                          'severity': 'FAIL',
                          'node': None,
                          'message': '[multi] round 1: efa was ordered but NCCL talks between '
                                     'nodes over TCP sockets (NET/Socket, log lines 80, 82, 83, '
                                     '84, 85); check the RDMA devices, NCCL_IB_HCA and the network '
                                     'plugin',
                          'evidence': ['H200/all_reduce_mpi_np2_simulated-2node-socket.log'],
                          'details': {'scope': 'multi',
                                      'engine': 'nccl-tests',
                                      'lines': [80, 82, 83, 84, 85]}},
                         {'code': 'NCCL_BUSBW',
                          'severity': 'INFO',
                          'node': None,
                          'message': '[multi] busbw at 1 GiB: median 2.4 GB/s over 1 round(s) (min '
                                     '2.4, max 2.4, cv 0.0%)',
                          'evidence': ['H200/all_reduce_mpi_np2_simulated-2node-socket.log'],
                          'details': {'scope': 'multi',
                                      'engine': 'nccl-tests',
                                      'size': 1073741824,
                                      'median': 2.39}},
                         {'code': 'NCCL_REFERENCE_NONE',
                          'severity': 'INFO',
                          'node': None,
                          'message': '[multi] no reference band applies to this run: the shipped '
                                     'bands of this GPU assume another machine: they are for 2x '
                                     'H200 SXM on 1 node, 8x H200 SXM on 1 node, 8x H200 SXM on 2 '
                                     'nodes; this run has 1 GPU(s) per node on 2 node(s) (the log)',
                          'evidence': ['H200/all_reduce_mpi_np2_simulated-2node-socket.log'],
                          'details': {'scope': 'multi',
                                      'engine': 'nccl-tests',
                                      'assumptions_differ': ['they are for 2x H200 SXM on 1 node, '
                                                             '8x H200 SXM on 1 node, 8x H200 SXM '
                                                             'on 2 nodes; this run has 1 GPU(s) '
                                                             'per node on 2 node(s) (the log)']}}],
 'ib_gdrdma': [{'code': 'NCCL_TRANSPORTS',
                'severity': 'INFO',
                'node': None,
                'message': '[multi] NCCL 2.21.5, 16 rank(s) on 2 node(s), transports: NET/IB, P2P, '
                           'GPUDirect RDMA; NICs IB:mlx5_0, IB:mlx5_10, IB:mlx5_11, IB:mlx5_3, '
                           'IB:mlx5_4, IB:mlx5_5, IB:mlx5_6, IB:mlx5_9',
                'evidence': ['SAMPLES/all_reduce_2node-h100_ib-gdrdma_nccl-info.log'],
                'details': {'scope': 'multi',
                            'engine': 'nccl-tests',
                            'transports': ['NET/IB', 'P2P'],
                            'n_nodes': 2,
                            'interfaces': ['IB:mlx5_0',
                                           'IB:mlx5_10',
                                           'IB:mlx5_11',
                                           'IB:mlx5_3',
                                           'IB:mlx5_4',
                                           'IB:mlx5_5',
                                           'IB:mlx5_6',
                                           'IB:mlx5_9'],
                            'networks': ['IB']}},
               {'code': 'NCCL_BUSBW',
                'severity': 'INFO',
                'node': None,
                'message': '[multi] busbw at 8 GiB: median 376.9 GB/s over 1 round(s) (min 376.9, '
                           'max 376.9, cv 0.0%)',
                'evidence': ['SAMPLES/all_reduce_2node-h100_ib-gdrdma_nccl-info.log'],
                'details': {'scope': 'multi',
                            'engine': 'nccl-tests',
                            'size': 8589934592,
                            'median': 376.92}},
               {'code': 'NCCL_REFERENCE',
                'severity': 'PASS',
                'node': None,
                'message': '[multi] busbw 376.9 GB/s at 8 GiB is within the reference band 300-450 '
                           "GB/s (expected about 370, shipped; worked out: 'For NDR @ 400Gbps you "
                           "should see 46-48GB/s per NIC' (AddyLaddy, NVIDIA, two nodes, "
                           'NCCL_ALGO=RING) x 8 NICs; a two-node tree can read above it; source: '
                           'https://github.com/NVIDIA/nccl-tests/issues/290; unverified: NIC rate '
                           '(Gb/s))',
                'evidence': ['SAMPLES/all_reduce_2node-h100_ib-gdrdma_nccl-info.log'],
                'details': {'scope': 'multi',
                            'engine': 'nccl-tests',
                            'size': 8589934592,
                            'judged': {'value': 376.92,
                                       'reference': 370.0,
                                       'lower': 300.0,
                                       'upper': 450.0,
                                       'unit': 'GB/s',
                                       'size': 8589934592,
                                       'result': 'within',
                                       'note': "worked out: 'For NDR @ 400Gbps you should see "
                                               "46-48GB/s per NIC' (AddyLaddy, NVIDIA, two nodes, "
                                               'NCCL_ALGO=RING) x 8 NICs; a two-node tree can read '
                                               'above it'},
                            'source': 'shipped',
                            'reference_source': 'https://github.com/NVIDIA/nccl-tests/issues/290',
                            'unverified': ['NIC rate (Gb/s)']}}],
 'inventory_bands': [{'code': 'NCCL_BUSBW',
                      'severity': 'INFO',
                      'node': 'lab-0',
                      'message': '[single] busbw at 128 MiB: median 285.3 GB/s over 3 round(s) '
                                 '(min 284.4, max 285.8, cv 0.3%)',
                      'evidence': ['H200/all_reduce_8B-128M_g2_round1.log',
                                   'H200/all_reduce_8B-128M_g2_round2.log',
                                   'H200/all_reduce_8B-128M_g2_round3.log'],
                      'details': {'scope': 'single',
                                  'engine': 'nccl-tests',
                                  'size': 134217728,
                                  'median': 285.29}},
                     {'code': 'NCCL_REFERENCE',
                      'severity': 'PASS',
                      'node': 'lab-0',
                      'message': '[single] busbw 285.3 GB/s at 128 MiB is within the reference '
                                 'band 250-360 GB/s (expected about 300, inventory; ordered '
                                 'NVLink)',
                      'evidence': ['H200/all_reduce_8B-128M_g2_round1.log',
                                   'H200/all_reduce_8B-128M_g2_round2.log',
                                   'H200/all_reduce_8B-128M_g2_round3.log'],
                      'details': {'scope': 'single',
                                  'engine': 'nccl-tests',
                                  'size': 134217728,
                                  'judged': {'value': 285.29,
                                             'reference': 300.0,
                                             'lower': 250.0,
                                             'upper': 360.0,
                                             'unit': 'GB/s',
                                             'size': 134217728,
                                             'result': 'within',
                                             'note': 'ordered NVLink'},
                                  'source': 'inventory'}}],
 'inventory_band_of_another_size': [{'code': 'NCCL_BUSBW',
                                     'severity': 'INFO',
                                     'node': 'lab-0',
                                     'message': '[single] busbw at 128 MiB: median 284.4 GB/s over '
                                                '1 round(s) (min 284.4, max 284.4, cv 0.0%)',
                                     'evidence': ['H200/all_reduce_8B-128M_g2_round1.log'],
                                     'details': {'scope': 'single',
                                                 'engine': 'nccl-tests',
                                                 'size': 134217728,
                                                 'median': 284.39}},
                                    {'code': 'NCCL_REFERENCE_NONE',
                                     'severity': 'INFO',
                                     'node': 'lab-0',
                                     'message': '[single] no reference band applies to this run: '
                                                'the inventory bands are for 4G, which this run '
                                                'did not measure',
                                     'evidence': ['H200/all_reduce_8B-128M_g2_round1.log'],
                                     'details': {'scope': 'single', 'engine': 'nccl-tests'}}],
 'nothing_shipped': [{'code': 'NCCL_BUSBW',
                      'severity': 'INFO',
                      'node': 'n1',
                      'message': '[single] busbw at 4 GiB: median 484.6 GB/s over 1 round(s) (min '
                                 '484.6, max 484.6, cv 0.0%)',
                      'evidence': ['SAMPLES/all_reduce_2.17.6_timestamps_h100.log'],
                      'details': {'scope': 'single',
                                  'engine': 'nccl-tests',
                                  'size': 4294967296,
                                  'median': 484.55}},
                     {'code': 'NCCL_REFERENCE_NONE',
                      'severity': 'INFO',
                      'node': 'n1',
                      'message': '[single] no reference band applies to this run: the shipped '
                                 'bands are for 8G, which this run did not measure',
                      'evidence': ['SAMPLES/all_reduce_2.17.6_timestamps_h100.log'],
                      'details': {'scope': 'single', 'engine': 'nccl-tests'}}],
 'imported_torch': [{'code': 'NCCL_BUSBW',
                     'severity': 'INFO',
                     'node': None,
                     'message': '[torch single] busbw at 128 MiB: median 284.4 GB/s over 1 '
                                'round(s) (min 284.4, max 284.4, cv 0.0%)',
                     'evidence': ['H200/all_reduce_8B-128M_g2_round1.log'],
                     'details': {'scope': 'single',
                                 'engine': 'torch',
                                 'size': 134217728,
                                 'median': 284.39}}]}
