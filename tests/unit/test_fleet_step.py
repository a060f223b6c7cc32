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
from payload.allreduce import _row, busbw_factor

SIZES = [1 << 20, 4 << 20, 16 << 20]
GOOD = 2.0
# a job's log: all_reduce's named after the job, another collective's after both
LABEL = re.compile(r"^(?P<stage>[a-z0-9]+)-r(?P<index>\d+)_(?P<key>.+?)"
                   r"(?:_(?P<coll>all_gather|reduce_scatter|alltoall))?\.log$")
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


def log(nodes: int, busbw: float, op: str = "all_reduce") -> str:
    rows = []
    for size in SIZES:  # the time that gives this busbw by the collective's own factor
        t_us = size / (busbw / busbw_factor(op, nodes) * 1e3)
        rows.append(_row(size, size // 4, "float", t_us, t_us, nodes, 0, op))
    return "\n".join([f"# Collective test starting: {op}_perf", *HEADER, *rows,
                      "# Out of bounds values : 0 OK",
                      f"# Avg bus bandwidth    : {busbw:g} ", "#"]) + "\n"


Model = Callable[[tuple[str, ...]], float]
# a model of each collective: (the job's nodes, the collective) -> its busbw x GOOD
CollModel = Callable[[tuple[str, ...], str], float]
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
          resume: Callable[[Run], None] | None = None,
          collectives: CollModel | tuple[str, ...] | None = None,
          commands: list[str] | None = None) -> tuple[list[Finding], Run]:
    """`collectives`: a model per collective (its names from the model's keys are given
    with `fleet.collectives` below) or None for the default suite (all_reduce only);
    `commands` collects every benchmark launch."""
    inv = write_inv(tmp_path, n, expect)
    wanted: dict[str, object] = {"engine": "torch", "plan": plan, "min_bytes": "1M",
                                 "max_bytes": "16M", "min_judged_bytes": "1M", "rdma": True}
    coll_model: CollModel | None = None
    if isinstance(collectives, tuple):
        wanted["collectives"] = list(collectives)
    elif collectives is not None:
        coll_model = collectives
        wanted["collectives"] = ["all_reduce", "alltoall"]
    suite = Suite(fleet=FleetParams.model_validate(wanted))
    run = Run.create(tmp_path / "results", command="fleet", suite_hash=suite.hash,
                     suite=suite.model_dump(mode="json"), inventory_path=None)
    launches: dict[str, int] = {}

    def launch(node: str) -> Callable[[Call], Reply]:
        def reply(call: Call) -> Reply:
            launches[node] = launches.get(node, 0) + 1
            if node == dead and launches[node] > dead_after:
                raise NodeUnreachable(f"{node}: connection refused", hop=node, cause="refused",
                                      node=node)
            if commands is not None:
                commands.append(call.command)
            if call.stdout_path is None:
                return Reply()
            m = LABEL.match(call.stdout_path.name)
            assert m, call.stdout_path
            coll = m["coll"] or "all_reduce"
            # the benchmark is told the collective its log is named after
            assert ("--op" in call.command) == (coll != "all_reduce"), call.command
            assert coll == "all_reduce" or f"--op {coll}" in call.command
            members = tuple(m["key"].split("+"))
            if hostile in members:  # what a compromised or broken node might print
                return Reply(stdout="\x1b[2J\x1b[31m#  Rank 0 ... \x00\x07 $(rm -rf ~)\n" * 50
                             + "     1048576  262144 float sum -1 1e999 nan nan 0\n")
            if len(members) != 2 or not all(x.startswith("n") for x in members):
                members = tuple(f"n{i}" for i in range(n))  # a group: the model sees everyone
            rate = coll_model(members, coll) if coll_model is not None else model(members)
            return Reply(stdout=noise + log(len(members), GOOD * rate, coll), stderr=noise)
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


def test_a_node_slow_in_alltoall_only_is_named_there_and_cleared_in_all_reduce(
        tmp_path: Path) -> None:
    """A bad rail or adaptive routing off: n5's all_reduce is at the fleet's rate, its
    alltoall at a third of it. Each collective is judged against its own median pair (a
    healthy alltoall here runs at 60% of all_reduce's busbw, so against all_reduce's
    median every alltoall pair would be slow): n5 is named in alltoall, confirmed by
    re-pairs that run both collectives, and passes all_reduce."""
    def model(nodes: tuple[str, ...], coll: str) -> float:
        if coll == "all_reduce":
            return 1.0
        return 0.6 * (0.3 if "n5" in nodes else 1.0)

    commands: list[str] = []
    fs, run = fleet(tmp_path, 8, slow_node("n0"), collectives=model, commands=commands)
    sus = by_code(fs, "FLEET_SUSPECT_NODE")
    assert [(f.node, f.severity, f.details["status"], f.details["collective"]) for f in sus] \
        == [("n5", "FAIL", "confirmed", "alltoall")]
    assert sus[0].message.startswith("[fleet alltoall] n5 is slow with every partner")
    assert len(sus[0].details["repaired_with"]) == 2
    assert not by_code(fs, "FLEET_SUSPECT_LINK")
    # all_reduce clears it: no slow node there, n5 among the nodes that passed
    (ok,) = by_code(fs, "FLEET_NO_SUSPECT")
    assert ok.details["collective"] == "all_reduce" and ok.message.startswith("[fleet] ")
    assert {f.details["collective"] for f in by_code(fs, "FLEET_PAIRS")} == {"all_reduce",
                                                                             "alltoall"}
    out = run.provider_dir("lab", "fleet")
    ar = json.loads((out / "pairs.json").read_text())
    a2a = json.loads((out / "pairs_alltoall.json").read_text())
    assert ar["collective"] == "all_reduce" and "n5" in ar["passed"]
    assert a2a["collective"] == "alltoall" and "n5" not in a2a["passed"]
    assert a2a["suspects"] == [{"node": "n5", "status": "confirmed"}]
    assert {p["collective"] for p in a2a["pairs"]} == {"alltoall"}
    # each collective's median is its own: alltoall's at 60% of all_reduce's
    for r_ar, r_a2a in zip(ar["references"], a2a["references"], strict=True):
        assert r_a2a["median"] == pytest.approx(0.6 * r_ar["median"], rel=1e-3)
    # every job ran both, each into its own log, and the finding's evidence is alltoall's
    logs = {p.name for p in out.glob("*.log")}
    jobs = {m.tags["job"] for m in run.measurements()}
    assert all(any(name.endswith(f"_{j}.log") for name in logs) for j in jobs)
    assert all(any(name.endswith(f"_{j}_alltoall.log") for name in logs) for j in jobs)
    slow_logs = [e for e in sus[0].evidence if e.endswith(".log")]
    assert slow_logs and all(e.endswith("_alltoall.log") for e in slow_logs)
    assert all("alltoall_perf" in (run.dir / e).read_text() for e in slow_logs)
    # the measurements carry the collective in the nccl step's tag, every job both
    ops: dict[str, set[str]] = {}
    for m in run.measurements():
        ops.setdefault(m.tags["job"], set()).add(m.tags["op"])
    assert set(map(frozenset, ops.values())) == {frozenset({"all_reduce", "alltoall"})}
    assert sum("--op alltoall" in c for c in commands) == sum(
        "--op" not in c for c in commands if "allreduce-bench" in c and "--help" not in c)
    # and the store's collective column keeps them apart, as the nccl step's
    from orchestrator.analysis import frames

    df = frames.measurements(tmp_path / "results", [run.run_id])
    assert set(df["collective"]) == {"", "alltoall"}
    assert (df["collective"] == "alltoall").sum() == (df["collective"] == "").sum()


def test_each_collective_is_judged_against_bands_of_its_own_only(tmp_path: Path) -> None:
    """An order's alltoall band (2.5 GB/s at 16 MiB) says the whole fleet's alltoall is
    slow (1.2 GB/s); all_reduce at 2 GB/s, below that figure too, is judged by no band."""
    band = "{nccl_busbw: [{value: 3, lower: 2.5, upper: 4, size: 16M, collective: alltoall}]}"
    fs, _ = fleet(tmp_path, 4, lambda nodes: 1.0, expect=band,
                  collectives=lambda nodes, coll: 1.0 if coll == "all_reduce" else 0.6)
    (below,) = by_code(fs, "FLEET_BELOW_BAND")
    assert below.details["collective"] == "alltoall"
    assert below.message.startswith("[fleet alltoall] the median pair itself is below")
    assert [f.details["collective"] for f in by_code(fs, "FLEET_NO_SUSPECT")] == ["all_reduce"]


def test_the_default_suite_runs_all_reduce_only(tmp_path: Path) -> None:
    commands: list[str] = []
    fs, run = fleet(tmp_path, 4, lambda nodes: 1.0, commands=commands)
    assert by_code(fs, "FLEET_NO_SUSPECT")
    assert commands and not [c for c in commands if "--op" in c]
    assert {m.tags["op"] for m in run.measurements()} == {"all_reduce"}
    out = run.provider_dir("lab", "fleet")
    assert [p.name for p in out.glob("pairs*.json")] == ["pairs.json"]
    assert not [p for p in out.glob("*.log") if p.stem.endswith(("alltoall", "all_gather",
                                                                 "reduce_scatter"))]
    judged = [f for f in fs if "collective" in f.details]
    assert judged and all(f.message.startswith("[fleet] ") and f.details["collective"]
                          == "all_reduce" for f in judged)


def test_a_collective_the_torch_backend_lacks_is_said_once_and_judged_nowhere(
        tmp_path: Path) -> None:
    """gloo without reduce_scatter: the benchmark prints why and no rows; every pair's
    all_reduce is judged as ever, the reduce_scatter is one INFO, never a slow pair."""
    from orchestrator.steps.fleet import step as S

    real = S._Runner._judge

    def skipping(self: S._Runner, r: object, j: object, out: object, coll: str) -> object:
        if coll == "reduce_scatter":
            out.log.write_text("# gpuvet skipped: reduce_scatter is not supported by the gloo "  # type: ignore[attr-defined]
                               "backend\n# Collective test concluded: reduce_scatter_perf\n")
        return real(self, r, j, out, coll)  # type: ignore[arg-type]

    mp = pytest.MonkeyPatch()
    mp.setattr(S._Runner, "_judge", skipping)
    try:
        fs, run = fleet(tmp_path, 4, lambda nodes: 1.0,
                        collectives=("all_reduce", "reduce_scatter"))
    finally:
        mp.undo()
    (skip,) = by_code(fs, "FLEET_COLLECTIVE_SKIPPED")
    assert skip.severity == "INFO" and skip.details["collective"] == "reduce_scatter"
    assert skip.message.startswith("[fleet reduce_scatter] not run: reduce_scatter is not")
    assert [f.details["collective"] for f in by_code(fs, "FLEET_NO_SUSPECT")] == ["all_reduce"]
    assert not by_code(fs, "FLEET_JOB_FAILED") and not by_code(fs, "FLEET_SUSPECT_NODE")


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
    # each collective by nccl-tests' own factor: (n-1)/n for alltoall, all_gather, ...
    assert _busbw_from_time(16 << 20, 700_000.0, 2, 0.01, "alltoall") == pytest.approx(
        0.011984, rel=1e-4)
    assert _busbw_from_time(16 << 20, 700_000.0, 4, 0.02, "all_gather") == pytest.approx(
        0.017976, rel=1e-4)


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


def test_the_nccl_tests_engine_runs_each_collectives_own_binary_in_the_same_mpirun(
        tmp_path: Path) -> None:
    """One mpirun per collective with a context per node, each running the collective's
    `<name>_perf` beside the node's all_reduce_perf (one build makes them all)."""
    from orchestrator.nccltests import BuildDoc
    from orchestrator.steps.fleet import engines

    inv = write_inv(tmp_path, 2)
    a, b = inv.nodes
    builds = {n.name: BuildDoc(ok=True, mpi=True, gpus=8,
                               binary=f"/w/{n.name}/cache/build/all_reduce_perf")
              for n in (a, b)}
    params = engines.nccl_params(FleetParams())
    for coll in ("all_reduce", "all_gather", "reduce_scatter", "alltoall"):
        cmd = str(engines.nccl_command([a, b], params, builds, coll))
        assert cmd.count("mpirun") == 1 and cmd.count(" : ") == 1
        assert f"/w/n0/cache/build/{coll}_perf" in cmd
        assert f"/w/n1/cache/build/{coll}_perf" in cmd
        assert "-np 8" in cmd and "-b 16M -e 1G -f 4" in cmd
        if coll != "all_reduce":
            assert "all_reduce_perf" not in cmd
    assert engines.collective_label("pairs-r0_n0+n1", "all_reduce") == "pairs-r0_n0+n1"
    assert engines.collective_label("pairs-r0_n0+n1", "alltoall") == "pairs-r0_n0+n1_alltoall"


def test_the_nccl_tests_engine_judges_a_real_alltoall_beside_all_reduce(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Real logs of two simulated nodes on one H100 (all_reduce_perf and alltoall_perf):
    each pair runs both, each log is parsed as its own collective, and a log of another
    collective than the one run is the job's failure, never judged as it."""
    from orchestrator.nccltests import BuildDoc
    from orchestrator.steps.fleet import engines

    def built(pool: object, node: inventory.Node, run: Run, params: object,
              archive: object) -> BuildDoc:
        return BuildDoc(ok=True, mpi=True, gpus=1, binary=f"/w/{node.name}/all_reduce_perf")

    monkeypatch.setattr(engines, "build_nccl_tests", built)
    monkeypatch.setattr(fleet_step.nccltests, "source_archive", lambda *a: None)
    logs = (Path(__file__).resolve().parents[1] / "fixtures" / "h100x1-sims"
            / "20261206-091857-f1b9" / "providers" / "sim" / "nccl")
    ar, a2a = ((logs / f"multi_{x}round1.log").read_text() for x in ("", "alltoall_"))

    def go(where: Path, alltoall_log: str) -> tuple[list[Finding], Run, list[str]]:
        inv = write_inv(where, 4)
        suite = Suite(fleet=FleetParams.model_validate({
            "engine": "nccl-tests", "min_bytes": "8", "max_bytes": "16M", "rdma": False,
            "min_judged_bytes": "1M", "collectives": ["all_reduce", "alltoall"]}))
        run = Run.create(where / "results", command="fleet", suite_hash=suite.hash,
                         suite=suite.model_dump(mode="json"), inventory_path=None)
        script = (Script().on(lambda c: c.startswith("command -v ib_write_bw"),
                              stdout="perftest=no\n")
                  .on(lambda c: "mpirun" in c and "alltoall_perf" in c, stdout=alltoall_log)
                  .on(lambda c: "mpirun" in c, stdout=ar).on("true"))
        pool = scripted_pool(default=script)
        out = fleet_step.run_fleet(inv, inv.nodes, run, suite, pool=pool)
        return out.findings, run, [c for ex in pool.executors.values() for c in ex.commands
                                   if "mpirun" in c]

    (tmp_path / "ok").mkdir()
    fs, run, cmds = go(tmp_path / "ok", a2a)
    assert sum("alltoall_perf" in c for c in cmds) == sum("all_reduce_perf" in c for c in cmds)
    assert {f.details["collective"] for f in by_code(fs, "FLEET_NO_SUSPECT")} == {
        "all_reduce", "alltoall"}
    a2a_ms = [m for m in run.measurements() if m.tags["op"] == "alltoall"
              and m.metric == "busbw" and not m.inplace and m.size == 16 << 20]
    assert a2a_ms and {m.value for m in a2a_ms} == {1.15}  # the log's own row, as printed
    table = json.loads((run.provider_dir("lab", "fleet") / "pairs_alltoall.json").read_text())
    # busbw from the time by alltoall's (n-1)/n: 16 MiB in 7321.15 us over 2 ranks
    big = [s for p in table["pairs"] for s in p["sizes"] if s["size"] == 16 << 20]
    assert big and all(s["busbw"] == pytest.approx((16 << 20) / 7321.15e3 / 2) for s in big)
    (tmp_path / "wrong").mkdir()
    fs, run, _ = go(tmp_path / "wrong", ar)  # all_reduce's table where alltoall ran
    failed = [f for f in run.findings() if f.code == "FLEET_JOB_FAILED"]
    assert failed and all(f.details["collective"] == "alltoall" and "the log is of "
                          "all_reduce, not of the alltoall" in f.message for f in failed)
    assert not [m for m in run.measurements() if m.tags["op"] == "alltoall"]
    assert [m for m in run.measurements() if m.tags["op"] == "all_reduce"]  # still counted


def test_gpuvet_fleet_collective_is_repeatable_and_refuses_an_unknown_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator import cli

    seen: list[tuple[str, ...]] = []

    def fake(inv: object, nodes: object, run: Run, suite: Suite, **kw: object) -> object:
        seen.append(suite.fleet_params.collectives)
        return fleet_step.FleetRun()

    monkeypatch.setattr(fleet_step, "run_fleet", fake)
    inv = tmp_path / "inv.yaml"
    inv.write_text("version: 1\nproviders:\n  lab:\n    executor: local\n    nodes:\n"
                   + "".join(f"      - {{name: n{i}, work_dir: '{tmp_path}/n{i}'}}\n"
                             for i in range(2)))
    base = ["fleet", "-i", str(inv), "--results", str(tmp_path / "results")]
    assert cli.run([*base, "--collective", "all_reduce", "--collective", "alltoall"]) == 0
    assert cli.run(base) == 0
    assert seen == [("all_reduce", "alltoall"), ("all_reduce",)]
    capsys.readouterr()
    assert cli.run([*base, "--collective", "sendrecv"]) == 2
    assert "sendrecv" in capsys.readouterr().err
