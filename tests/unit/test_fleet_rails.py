"""Each rail on its own: the fleet step's per-HCA RDMA results as a rail table naming the slow
rail with its NIC, port, netdev and the GPUs near it; and the fabric counters read around
the fleet's load.

The nodes answer from scripts (orchestrator.testing): the prepare probe lists the HCAs and
prints a real `nvidia-smi topo -m` (an 8x A100 node with 17 NICs, tests/fixtures/public),
the fabric snapshot is the payload's reading of a real H100 node's sysfs tree
(tests/unit/fabrictree.py), and each HCA's `ib_write_bw` result is scripted.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from fabrictree import facts, set_counter, snap, tree
from test_fleet_step import GOOD, LABEL, log, write_inv

from orchestrator.parsers.topology import parse_topo_m
from orchestrator.records import Finding
from orchestrator.steps.fleet import rails as R
from orchestrator.steps.fleet import rdma
from orchestrator.steps.fleet import step as fleet_step
from orchestrator.store import Run
from orchestrator.suite import FleetParams, Suite
from orchestrator.testing import Call, Reply, Script, scripted_pool

TOPO = (Path(__file__).resolve().parents[1] / "fixtures" / "public"
        / "topo-m_8x-a100-17nic.txt").read_text()
# HCAs both the topology (mlx5_2..mlx5_17) and the sysfs capture (mlx5_0..mlx5_9) have:
# mlx5_4, mlx5_5 sit next to GPU0/GPU1, mlx5_6..mlx5_9 next to GPU2/GPU3
HCAS = ("mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9")


def test_the_rail_table_names_the_slow_rail_with_its_gpus(tmp_path: Path) -> None:
    topo = parse_topo_m(TOPO)
    results = [R.RailResult("n0", h, "n1", h, 390.0 if h != "mlx5_8" else 250.0)
               for h in HCAS]
    results += [R.RailResult("n2", h, "n3", h, 385.0) for h in HCAS]
    root = tree(tmp_path)
    net = root / "mlx5_8" / "device" / "net" / "ibp166s0"
    net.mkdir(parents=True)
    (net / "dev_port").write_text("0\n")
    t = R.rail_table(results, tolerance=0.2, topo={"n0": topo, "n1": topo},
                     fabric={"n0": facts(root)})
    assert t.median_gbps == pytest.approx(385.0)
    assert [r.name for r in t.slow] == ["n0:mlx5_8 port 1"]
    slow = t.slow[0]
    assert (slow.netdev, slow.rate_gbps, slow.gpus, slow.peer_gpus) == (
        "ibp166s0", 400.0, ["GPU2", "GPU3"], ["GPU2", "GPU3"])
    assert slow.ratio == pytest.approx(250 / 385)
    assert R.rail_words(slow) == ("n0:mlx5_8 port 1 (ibp166s0, 400 Gb/s link, near GPU2, "
                                  "GPU3) -> n1:mlx5_8 (near GPU2, GPU3)")
    # n2's rails have no snapshot or topology: the row says what is known
    other = next(r for r in t.rails if r.node == "n2")
    assert (other.port, other.netdev, other.gpus) == (None, None, [])


def test_a_rail_within_the_tolerance_is_not_slow() -> None:
    results = [R.RailResult("n0", h, "n1", h, g) for h, g in
               zip(HCAS, (390, 390, 390, 390, 390, 313), strict=True)]  # 313 = 80.3%
    assert R.rail_table(results, tolerance=0.2).slow == []
    results[-1] = R.RailResult("n0", HCAS[-1], "n1", HCAS[-1], 311.0)  # 79.7%
    assert [r.hca for r in R.rail_table(results, tolerance=0.2).slow] == ["mlx5_9"]


def test_two_rails_are_not_judged_against_each_other() -> None:
    results = [R.RailResult("n0", "mlx5_4", "n1", "mlx5_4", 390.0),
               R.RailResult("n0", "mlx5_5", "n1", "mlx5_5", 100.0)]
    assert R.rail_table(results, tolerance=0.2).slow == []


# --- through the fleet step -----------------------------------------------------------------

def _fleet(tmp_path: Path, n: int, gbps: Callable[[str, str], float],
           fabric: Callable[[str, int], str]) -> tuple[list[Finding], Run]:
    inv = write_inv(tmp_path, n, "{fabric: {type: ib, rate_gbps: 400}}")
    suite = Suite(fleet=FleetParams.model_validate(
        {"engine": "torch", "min_bytes": "1M", "max_bytes": "16M", "min_judged_bytes": "1M",
         "rdma": True}))
    run = Run.create(tmp_path / "results", command="fleet", suite_hash=suite.hash,
                     suite=suite.model_dump(mode="json"), inventory_path=None)
    probe = "perftest=yes\n" + "".join(f"hca={h}\n" for h in HCAS) + \
        f"{fleet_step.TOPO_MARK}\n{TOPO}"
    reads: dict[str, int] = {}

    def pair_log(call: Call) -> Reply:
        if call.stdout_path is None:
            return Reply()
        m = LABEL.match(call.stdout_path.name)
        assert m, call.stdout_path
        return Reply(stdout=log(2, GOOD))

    def snapshot(node: str) -> Callable[[Call], Reply]:
        def reply(call: Call) -> Reply:
            reads[node] = reads.get(node, 0) + 1
            return Reply(stdout=fabric(node, reads[node]))
        return reply

    scripts = {f"n{i}": (Script()
                         .on(lambda c: "allreduce-bench --help" in c, rc=0)
                         .on(lambda c: c.startswith("command -v ib_write_bw"), stdout=probe)
                         .on(lambda c: "-m payload fabric" in c, reply=snapshot(f"n{i}"))
                         .on("true")
                         .on(lambda c: "allreduce-bench" in c, reply=pair_log))
               for i in range(n)}
    pool = scripted_pool(scripts)
    out = fleet_step.run_fleet(inv, inv.nodes, run, suite, pool=pool)
    assert reads == {f"n{i}": 2 for i in range(n)}  # one before the plan, one after
    return out.findings, run


def test_the_fleet_names_the_slow_rail_and_the_counters_that_grew(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def one(pool: object, a: object, b: object, hca: str, peer_hca: str, seconds: int,
            log: Path) -> float:
        log.write_text(f"ib_write_bw -d {hca}\n")
        return 250.0 if (getattr(a, "name", ""), hca) == ("n2", "mlx5_8") else 392.0

    monkeypatch.setattr(rdma, "_one", one)
    clean = json.dumps(snap(tree(tmp_path, "clean")))
    grown_root = tree(tmp_path, "grown")
    set_counter(grown_root, "mlx5_6", "link_downed", 1)
    grown = json.dumps(snap(grown_root))
    fs, run = _fleet(tmp_path, 4, lambda a, b: 0.0,
                     lambda node, k: grown if node == "n3" and k == 2 else clean)
    table = next(f for f in fs if f.code == "FLEET_RAILS")
    assert len(table.details["rails"]) == 2 * len(HCAS)  # two pairs of the first round
    slow = [f for f in fs if f.code == "FLEET_RAIL_SLOW"]
    assert [(f.node, f.details["hca"], f.details["port"], f.details["gpus"]) for f in slow] \
        == [("n2", "mlx5_8", 1, ["GPU2", "GPU3"])]
    assert slow[0].severity == "WARN" and "near GPU2, GPU3" in slow[0].message
    rails_json = json.loads((run.dir / table.evidence[0]).read_text())
    assert [r["hca"] for r in rails_json["rails"] if r["slow"]] == ["mlx5_8"]
    assert (run.dir / "nodes" / "n0" / "fleet" / "topo_m.txt").read_text() == TOPO
    downed = [f for f in fs if f.code == "RDMA_COUNTER_GREW"]
    assert [(f.node, f.severity, f.details["device"], f.details["counter"]) for f in downed] \
        == [("n3", "FAIL", "mlx5_6", "link_downed")]
    assert downed[0].message.startswith("[fleet] mlx5_6 port 1 link_downed grew by 1")
    assert downed[0].evidence == ["nodes/n3/fleet/fabric_before_fleet.json",
                                  "nodes/n3/fleet/fabric_after_fleet.json"]


def test_the_rail_table_is_shown_by_gpuvet_fleet_and_compare(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The rows FLEET_RAILS carries become the table `gpuvet fleet` prints after its verdicts
    (and `--json`'s `tables`), and compare's (so the report's) where a pipeline ran the fleet."""
    from orchestrator.analysis.compare import fleet_rails_table
    from orchestrator.cli._steps import show_outcome
    from orchestrator.verdicts import rails_table

    monkeypatch.setattr(rdma, "_one", lambda pool, a, b, hca, peer, s, log: (
        250.0 if (a.name, hca) == ("n0", "mlx5_4") else 390.0))
    fs, run = _fleet(tmp_path, 2, lambda a, b: 0.0,
                     lambda node, k: json.dumps(snap(tree(tmp_path, f"{node}{k}"))))
    t = rails_table(fs)
    assert len(t.rows) == len(HCAS)
    assert {r["tool"] for r in t.as_dicts()} == {"ib_write_bw"}
    slow = [r for r in t.as_dicts() if r["slow"]]
    assert [(r["node"], r["HCA"], r["port"], r["link Gb/s"], r["GPUs near"], r["vs median"])
            for r in slow] == [("n0", "mlx5_4", 1, 400.0, "GPU0, GPU1", "64%")]
    assert fleet_rails_table(fs, ["lab"]).rows == t.rows
    assert fleet_rails_table(fs, ["other"]).rows == []
    show_outcome(run, fs, ["n0", "n1"], verbose=False, as_json=False, tables=[t])
    shown = capsys.readouterr().out
    assert "rails, one HCA at a time" in shown and "SLOW" in shown
    assert "FLEET_RAIL_SLOW" in shown and "FLEET_RAILS" in shown


def test_each_rail_through_nccl_one_run_per_hca_with_nccl_ib_hca(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`fleet.rails_nccl`: between first-round partners, one nccl-tests mpirun per HCA with
    NCCL_IB_HCA set to `=<that HCA>` on each node; the rail whose busbw is low is named in
    a table of its own (tool nccl), apart from ib_write_bw's."""
    from orchestrator.nccltests import BuildDoc
    from orchestrator.steps.fleet import engines

    monkeypatch.setattr(engines, "build_nccl_tests", lambda pool, node, run, params, archive:
                        BuildDoc(ok=True, mpi=True, gpus=8, binary="/w/all_reduce_perf"))
    monkeypatch.setattr(fleet_step.nccltests, "source_archive", lambda *a: None)
    inv = write_inv(tmp_path, 2, "{fabric: {type: ib}}")
    suite = Suite(fleet=FleetParams.model_validate(
        {"engine": "nccl-tests", "min_bytes": "1M", "max_bytes": "16M", "rdma": False,
         "min_judged_bytes": "1M", "rails_nccl": True}))
    run = Run.create(tmp_path / "results", command="fleet", suite_hash=suite.hash,
                     suite=suite.model_dump(mode="json"), inventory_path=None)
    probe = "perftest=no\n" + "".join(f"hca={h}\n" for h in HCAS) + \
        f"{fleet_step.TOPO_MARK}\n{TOPO}"
    rails: list[set[str]] = []

    def mpirun(call: Call) -> Reply:
        hca = {v for k, v in call.env.items() if "NCCL_IB_HCA" in k}
        if hca:
            rails.append(hca)
        return Reply(stdout=log(2, 20.0 if hca == {"=mlx5_5"} else 48.0 if hca else GOOD))

    none = json.dumps({"present": False, "devices": []})
    pool = scripted_pool(default=Script()
                         .on(lambda c: c.startswith("command -v ib_write_bw"), stdout=probe)
                         .on(lambda c: "-m payload fabric" in c, stdout=none)
                         .on(lambda c: "mpirun" in c, reply=mpirun))
    out = fleet_step.run_fleet(inv, inv.nodes, run, suite, pool=pool)
    assert rails == [{f"={h}"} for h in HCAS]  # the same HCA on both ends, one at a time
    tables = [f for f in out.findings if f.code == "FLEET_RAILS"]
    assert [f.details["tool"] for f in tables] == ["nccl"]
    (slow,) = [f for f in out.findings if f.code == "FLEET_RAIL_SLOW"]
    assert (slow.node, slow.details["hca"], slow.details["gpus"], slow.details["tool"]) == (
        "n0", "mlx5_5", ["GPU0", "GPU1"], "nccl")
    assert slow.details["gbps"] == pytest.approx(20.0 * 8, rel=0.01)
    assert (run.dir / "providers" / "lab" / "fleet" / "rails_nccl.json").is_file()
    assert all((run.dir / e).is_file() for e in slow.evidence)


def test_compare_and_the_report_show_the_rail_table_of_a_pipeline_run(tmp_path: Path) -> None:
    """A pipeline run that ran the fleet step carries FLEET_RAILS: compare (so the report)
    shows its table; a store without one leaves the table out rather than empty."""
    from orchestrator.analysis import compare
    from orchestrator.records import finding
    from orchestrator.report import render
    from tests.unit.comparestore import build_store

    root = tmp_path / "results"
    ids = build_store(root, providers=("h200",))
    title = "fleet: rails, one HCA at a time"
    assert title not in [t.title for t in compare.build(root, ["h200"], with_cost=False).tables]
    run = Run.open(root, ids["h200"]["nccl"])
    rails = [{"node": "n0", "hca": h, "port": 1, "netdev": None, "rate_gbps": 400.0,
              "gbps": 250.0 if h == "mlx5_8" else 390.0, "gbs": 31.25 if h == "mlx5_8" else
              48.75, "ratio": 0.64 if h == "mlx5_8" else 1.0, "slow": h == "mlx5_8",
              "gpus": ["GPU2", "GPU3"], "peer": "n1", "peer_hca": h} for h in HCAS]
    run.add_findings([finding(run.run_id, "fleet", provider="h200", node=None,
                              code="FLEET_RAILS", severity="INFO", message="rails",
                              rails=rails, tool="ib_write_bw")])
    c = compare.build(root, ["h200"], with_cost=False)
    (table,) = [t for t in c.tables if t.title == title]
    assert [(r["HCA"], r["slow"]) for r in table.as_dicts() if r["slow"]] == [("mlx5_8", "SLOW")]
    html, md = render(c, tmp_path / "report.html")
    assert title in html and title in md and "mlx5_8" in md
