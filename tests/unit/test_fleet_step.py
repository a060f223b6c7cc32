"""steps/fleet/step: the fleet step driven over scripted nodes (torch engine).

Every node answers from a script: the payload's torchrun launch writes, on the
job's first node, a log in nccl-tests' layout whose busbw follows a model of
the fleet (a slow node, a slow link); a node can stop answering after some
launches. The real plan, driver, store, parser, localisation and verdict run.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator import inventory
from orchestrator.errors import NodeUnreachable
from orchestrator.records import Finding, Measurement
from orchestrator.steps.fleet import step as fleet_step
from orchestrator.store import Run
from orchestrator.suite import FleetParams, Suite
from orchestrator.testing import Call, Reply, Script, scripted_pool
from payload.allreduce import _row

SIZES = [1 << 20, 4 << 20, 16 << 20]
GOOD = 2.0
LABEL = re.compile(r"^(?P<stage>[a-z0-9]+)-r(?P<index>\d+)_(?P<key>.+)\.log$")
HEADER = ["# nThread 1 nGpus 1 minBytes 1048576 maxBytes 16777216 step: 4(factor) warmup iters: 1 "
          "iters: 3 agg iters: 1 validation: 1 graph: 0", "#", "# Using devices",
          "#  Rank  0 Group  0 Pid    100 on      host0 device  0 [0000:00:00] cpu",
          "#  Rank  1 Group  0 Pid    101 on      host1 device  0 [0000:00:00] cpu", "#",
          "#                                                       out-of-place"
          "                       in-place",
          "#       size         count      type   redop    root     time   algbw   busbw "
          " #wrong     time   algbw   busbw  #wrong",
          "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)  "
          "           (us)  (GB/s)  (GB/s)         "]


def log(nodes: int, busbw: float) -> str:
    rows = []
    for size in SIZES:
        t_us = size / (busbw * nodes / (2.0 * (nodes - 1)) * 1e3)
        rows.append(_row(size, size // 4, "float", t_us, t_us, nodes, 0))
    return "\n".join([*HEADER, *rows, "# Out of bounds values : 0 OK",
                      f"# Avg bus bandwidth    : {busbw:g} ", "#"]) + "\n"


Model = Callable[[tuple[str, ...]], float]
# the payload's fabric snapshot of a node whose /sys/class/infiniband is not there
NO_FABRIC = json.dumps({"schema": 1, "root": "/sys/class/infiniband", "present": False,
                        "devices": [], "truncated": False})


def write_inv(tmp_path: Path, n: int, expect: str = "") -> inventory.Inventory:
    lines = ["version: 1", "providers:", "  lab:", "    executor: ssh",
             *([f"    expect: {expect}"] if expect else []), "    nodes:"]
    lines += [f"      - {{name: n{i}, host: 10.0.0.{i + 1}, work_dir: /w/n{i}}}" for i in range(n)]
    p = tmp_path / "inv.yaml"
    p.write_text("\n".join(lines) + "\n")
    return inventory.load(p)


def fleet(tmp_path: Path, n: int, model: Model, *, plan: str = "pairs",
          dead: str | None = None, dead_after: int = 1, hostile: str | None = None,
          run_hook: Callable[[Run], None] | None = None, expect: str = "",
          perftest: str | None = None, noise: str = "",
          resume: Callable[[Run], None] | None = None) -> tuple[list[Finding], Run]:
    inv = write_inv(tmp_path, n, expect)
    suite = Suite(fleet=FleetParams.model_validate(
        {"engine": "torch", "plan": plan, "min_bytes": "1M", "max_bytes": "16M",
         "min_judged_bytes": "1M", "rdma": True}))
    run = Run.create(tmp_path / "results", command="fleet", suite_hash=suite.hash,
                     suite=suite.model_dump(mode="json"), inventory_path=None)
    launches: dict[str, int] = {}

    def launch(node: str) -> Callable[[Call], Reply]:
        def reply(call: Call) -> Reply:
            launches[node] = launches.get(node, 0) + 1
            if node == dead and launches[node] > dead_after:
                raise NodeUnreachable(f"{node}: connection refused", hop=node, cause="refused",
                                      node=node)
            if call.stdout_path is None:
                return Reply()
            m = LABEL.match(call.stdout_path.name)
            assert m, call.stdout_path
            members = tuple(m["key"].split("+"))
            if hostile in members:  # what a compromised or broken node might print
                return Reply(stdout="\x1b[2J\x1b[31m#  Rank 0 ... \x00\x07 $(rm -rf ~)\n" * 50
                             + "     1048576  262144 float sum -1 1e999 nan nan 0\n")
            if len(members) != 2 or not all(x.startswith("n") for x in members):
                members = tuple(f"n{i}" for i in range(n))  # a group: the model sees everyone
            return Reply(stdout=noise + log(len(members), GOOD * model(members)),
                         stderr=noise)
        return reply

    def alive(node: str) -> Callable[[Call], Reply]:
        def reply(call: Call) -> Reply:
            if node == dead and launches.get(node, 0) > dead_after:
                raise NodeUnreachable(f"{node}: refused", hop=node, cause="refused", node=node)
            return Reply()
        return reply

    scripts = {}
    for i in range(n):
        name = f"n{i}"
        scripts[name] = (Script()
                         .on(lambda c: "allreduce-bench --help" in c, rc=0)
                         .on(lambda c: c.startswith("command -v ib_write_bw"),
                             stdout="perftest=yes\nhca=mlx5_0\n" if perftest else
                             "perftest=no\n")
                         .on(lambda c: c.startswith("ib_write_bw") and c.endswith("-D 5"),
                             stdout="server side\n")
                         .on(lambda c: c.startswith("ib_write_bw"), stdout=perftest or "")
                         .on(lambda c: "-m payload fabric" in c, stdout=NO_FABRIC)
                         .on("true", reply=alive(name))
                         .on(lambda c: "allreduce-bench" in c, reply=launch(name)))
    pool = scripted_pool(scripts)
    if run_hook is not None:
        run_hook(run)
    out = fleet_step.run_fleet(inv, inv.nodes, run, suite, pool=pool)
    if resume is not None:  # the same run again, as `--resume` runs it
        resume(run)
        out = fleet_step.run_fleet(inv, inv.nodes, run, suite, pool=pool)
    return out.findings, run


def slow_node(bad: str, f: float = 0.1) -> Model:
    return lambda nodes: f if bad in nodes else 1.0


def by_code(fs: list[Finding], code: str) -> list[Finding]:
    return [f for f in fs if f.code == code]


def test_a_slow_node_is_named_and_confirmed_by_the_re_pairs(tmp_path: Path) -> None:
    fs, run = fleet(tmp_path, 8, slow_node("n5"))
    sus = by_code(fs, "FLEET_SUSPECT_NODE")
    assert [(f.node, f.severity, f.details["status"]) for f in sus] == [("n5", "FAIL",
                                                                         "confirmed")]
    assert len(sus[0].details["repaired_with"]) == 2
    assert not set(sus[0].details["repaired_with"]) & set(sus[0].details["partners"])
    assert not by_code(fs, "FLEET_SUSPECT_LINK")
    # the others are cleared by name: each node has its own verdict
    assert sorted(f.node for f in by_code(fs, "FLEET_NODE_CLEARED")) == [
        f"n{i}" for i in range(8) if i != 5]
    table = json.loads((run.dir / sus[0].evidence[0]).read_text())
    assert {tuple(p["nodes"]) for p in table["pairs"] if p["slow"]} == {
        tuple(p["nodes"]) for p in table["pairs"] if "n5" in p["nodes"]}
    assert all((run.dir / e).is_file() for e in sus[0].evidence)
    # every pair job's rows are in the store, tagged with its stage
    ms = run.measurements()
    assert {m.tags["stage"] for m in ms} == {"pairs", "repair"}
    assert {m.engine for m in ms} == {"torch"} and {m.step for m in ms} == {"fleet"}
    assert by_code(fs, "FLEET_RDMA_SKIPPED")


def test_a_slow_link_is_named_and_neither_of_its_nodes(tmp_path: Path) -> None:
    from orchestrator.steps.fleet import plan as P

    first = P.fleet_plan([f"n{i}" for i in range(8)], partners=2).rounds[0].jobs[1].nodes
    fs, _ = fleet(tmp_path, 8, lambda nodes: 0.2 if set(nodes) == set(first) else 1.0)
    links = by_code(fs, "FLEET_SUSPECT_LINK")
    assert [(sorted(f.details["link"]), f.severity, f.node) for f in links] == [
        (sorted(first), "FAIL", None)]
    assert not by_code(fs, "FLEET_SUSPECT_NODE")


def test_a_node_lost_mid_plan_is_dropped_and_the_plan_goes_on(tmp_path: Path) -> None:
    fs, run = fleet(tmp_path, 8, lambda nodes: 1.0, dead="n2", dead_after=1)
    dropped = by_code(fs, "FLEET_NODE_DROPPED")
    assert [f.node for f in dropped] == ["n2"]
    assert by_code(fs, "FLEET_NO_SUSPECT")
    table = json.loads((run.dir / by_code(fs, "FLEET_PAIRS")[0].evidence[0]).read_text())
    met: dict[str, set[str]] = {}
    for p in table["pairs"]:
        a, b = p["nodes"]
        met.setdefault(a, set()).add(b)
        met.setdefault(b, set()).add(a)
    assert "n2" not in table["passed"]
    # every other node still met two partners: the plan was recomputed without n2
    assert all(len(met[x]) >= 2 for x in met if x != "n2"), met


def test_groups_and_the_whole_fleet_run_after_the_pairs(tmp_path: Path) -> None:
    fs, run = fleet(tmp_path, 8, lambda nodes: 1.0, plan="groups")
    stages = {m.tags["stage"] for m in run.measurements()}
    assert stages == {"pairs", "groups4", "whole"}
    assert {f.details["plan_stage"] for f in by_code(fs, "FLEET_GROUPS")} == {"groups4", "whole"}
    # the scripted nodes wrote no rank times: said, not hidden
    assert by_code(fs, "FLEET_RANK_TIMES_MISSING")


def test_one_node_is_not_a_fleet(tmp_path: Path) -> None:
    fs, _ = fleet(tmp_path, 1, lambda nodes: 1.0)
    assert [(f.code, f.severity) for f in fs] == [("FLEET_NOT_APPLICABLE", "INFO")]


@pytest.mark.parametrize("bad", ["n0", "n7"])
def test_the_reference_is_the_median_pair(tmp_path: Path, bad: str) -> None:
    fs, run = fleet(tmp_path, 8, slow_node(bad, 0.01))
    table = json.loads((run.dir / by_code(fs, "FLEET_PAIRS")[0].evidence[0]).read_text())
    first = [p for p in table["pairs"] if p["stage"] != "repair"]
    for ref in table["references"]:
        vals = sorted(s["busbw"] for p in first for s in p["sizes"] if s["size"] == ref["size"])
        mid = len(vals) // 2
        assert ref["median"] == pytest.approx((vals[mid - 1] + vals[mid]) / 2 if len(vals) % 2
                                              == 0 else vals[mid])


def test_a_node_that_answers_garbage_is_a_suspect_not_a_crash(tmp_path: Path) -> None:
    fs, run = fleet(tmp_path, 8, lambda nodes: 1.0, hostile="n4")
    failed = by_code(fs, "FLEET_JOB_FAILED") or [f for f in run.findings()
                                                  if f.code == "FLEET_JOB_FAILED"]
    assert failed and all("n4" in (f.unit_key or "") for f in failed)
    sus = by_code(fs, "FLEET_SUSPECT_NODE")
    assert [(f.node, f.severity, f.details["status"]) for f in sus] == [("n4", "FAIL",
                                                                         "confirmed")]
    assert not by_code(fs, "FLEET_SUSPECT_LINK")
    text = "".join(f.message for f in run.findings())
    assert "\x1b" not in text and "\x00" not in text


def test_the_results_disk_full_mid_plan_stops_the_step_blaming_no_node(
        tmp_path: Path) -> None:
    from orchestrator.errors import StoreError

    def full_disk(run: Run) -> None:
        real = run.add_measurements
        calls = {"n": 0}

        def add(ms: list[Measurement]) -> None:
            calls["n"] += 1
            if calls["n"] > 2:
                raise StoreError("the results disk is full")
            real(ms)

        run.add_measurements = add

    with pytest.raises(StoreError):
        fleet(tmp_path, 8, lambda nodes: 1.0, run_hook=full_disk)


def test_rdma_per_hca_between_partners_against_the_ordered_rate(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.steps.fleet import rdma

    monkeypatch.setattr(rdma, "SERVER_START_S", 0.0)
    text = (Path(__file__).resolve().parents[1] / "fixtures" / "public"
            / "ib_write_bw_loopback-interleaved_superbench.log").read_text()
    fs, run = fleet(tmp_path, 4, lambda nodes: 1.0, perftest=text,
                    expect="{fabric: {type: ib, rate_gbps: 400}}")
    got = by_code(fs, "FLEET_RDMA_SLOW") or [f for f in run.findings()
                                             if f.code.startswith("FLEET_RDMA")]
    assert len(got) == 2 and all(f.severity == "FAIL" for f in got), got  # 2 pairs, 1 HCA
    assert all(f.details["hca"] == "mlx5_0" and f.details["rate_gbps"] == 400 for f in got)
    assert all(f.details["gbps"] < 360 for f in got)
    assert all((run.dir / e).is_file() for f in got for e in f.evidence)


def test_the_nccl_tests_engine_one_mpirun_per_pair_and_the_transport_from_nccl_info(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each pair is one mpirun on its first node, with a context per node; the transport
    each pair used is read from its NCCL INFO lines: NET/Socket on an InfiniBand order is
    a WARN naming the pairs."""
    from orchestrator.nccltests import BuildDoc
    from orchestrator.steps.fleet import engines

    def built(pool: object, node: inventory.Node, run: Run, params: object,
              archive: object) -> BuildDoc:
        return BuildDoc(ok=True, mpi=True, gpus=1, binary=f"/w/{node.name}/all_reduce_perf")

    monkeypatch.setattr(engines, "build_nccl_tests", built)
    monkeypatch.setattr(fleet_step.nccltests, "source_archive", lambda *a: None)
    socket_log = (Path(__file__).resolve().parents[1] / "fixtures" / "h200x2-gpuvet"
                  / "multi_sim2node_socket_round1.log").read_text()
    inv = write_inv(tmp_path, 4, "{fabric: {type: ib}}")
    suite = Suite(fleet=FleetParams.model_validate({"engine": "nccl-tests", "min_bytes": "8",
                                                    "max_bytes": "128M", "rdma": False,
                                                    "min_judged_bytes": "16M"}))
    run = Run.create(tmp_path / "results", command="fleet", suite_hash=suite.hash,
                     suite=suite.model_dump(mode="json"), inventory_path=None)
    script = (Script().on(lambda c: c.startswith("command -v ib_write_bw"),
                          stdout="perftest=no\n")
              .on(lambda c: "mpirun" in c, stdout=socket_log))
    pool = scripted_pool(default=script)
    out = fleet_step.run_fleet(inv, inv.nodes, run, suite, pool=pool)
    mpiruns = [(name, c) for name, ex in pool.executors.items() for c in ex.commands
               if "mpirun" in c]
    assert len(mpiruns) == 4  # 2 rounds x 2 pairs, no re-pair: the same log for every pair
    for name, cmd in mpiruns:  # run on the pair's first node, one context for each node
        assert cmd.count(" : ") == 1 and f"/w/{name}/all_reduce_perf" in cmd
    (warn,) = by_code(out.findings, "FLEET_TRANSPORT_SOCKET")
    assert warn.severity == "WARN" and len(warn.details["pairs"]) == 4
    assert by_code(out.findings, "FLEET_NO_SUSPECT")


def test_a_secret_a_node_prints_is_not_stored(tmp_path: Path) -> None:
    """A job's log and stderr stream into the run as they come (a launcher that echoes its
    environment, say): the secret is scrubbed out of every file the fleet step keeps."""
    secret = "hf_" + "Q" * 34
    fs, run = fleet(tmp_path, 4, lambda nodes: 1.0, noise=f"env: HF_TOKEN={secret}\n")
    assert by_code(fs, "FLEET_NO_SUSPECT"), [f.code for f in fs]
    kept = [p for p in run.dir.rglob("*") if p.is_file()]
    assert any(p.suffix == ".log" for p in kept)
    assert not [p for p in kept if secret in p.read_text(errors="replace")]


def test_pairs_are_compared_on_busbw_from_the_time_not_its_two_printed_decimals() -> None:
    """16 MiB in 700,000 us between two ranks is 0.02397 GB/s, printed "0.02"; nccl-tests'
    own formula on the time keeps the digits that tell 0.024 from 0.016."""
    from orchestrator.steps.fleet.step import _busbw_from_time

    assert _busbw_from_time(16 << 20, 700_000.0, 2, 0.02) == pytest.approx(0.023968, rel=1e-4)
    assert _busbw_from_time(16 << 20, 700_000.0, 4, 0.04) == pytest.approx(0.035951, rel=1e-4)
    assert _busbw_from_time(16 << 20, 0.0, 2, 0.02) == 0.02  # no usable time: the printed one


def test_a_resumed_run_keeps_a_judged_fleet_and_redoes_a_cut_one_whole(tmp_path: Path) -> None:
    """The localisation needs every pair's samples, which live only in the attempt that
    measured them: a fleet judged in full is kept as it is on resume, and one cut short is
    dropped and run again from the start, never judged on the pairs of the second attempt
    alone (which named nobody: every node dropped, "0 of 8 left to pair")."""
    (tmp_path / "kept").mkdir()
    (tmp_path / "cut").mkdir()
    fs, run = fleet(tmp_path / "kept", 8, slow_node("n5"), resume=lambda run: None)
    assert fs == []  # nothing ran again
    stored = run.findings()
    assert [f.node for f in by_code(stored, "FLEET_SUSPECT_NODE")] == ["n5"]
    assert not by_code(stored, "FLEET_NOT_RUN")

    def cut(run: Run) -> None:  # interrupted after the pairs, before the verdict
        run.clear_done("provider:lab/fleet-judged", "fleet")
        run.retract(keep_units={f.unit_key for f in run.findings() if f.unit_key and
                                "fleet-judged" not in f.unit_key}, step="fleet")
    fs, run = fleet(tmp_path / "cut", 8, slow_node("n5"), resume=cut)
    assert [f.node for f in by_code(fs, "FLEET_SUSPECT_NODE")] == ["n5"]
    stored = run.findings()
    assert [f.node for f in by_code(stored, "FLEET_SUSPECT_NODE")] == ["n5"]
    assert not by_code(stored, "FLEET_NOT_RUN") and not by_code(stored, "FLEET_NODE_DROPPED")
    # one attempt's measurements, not two
    per_job: dict[tuple, list] = {}
    for m in run.measurements():
        per_job.setdefault((m.unit_key, m.metric, m.size, m.inplace), []).append(m)
    assert all(len(v) == 1 for v in per_job.values())
