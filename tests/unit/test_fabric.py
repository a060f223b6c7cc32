"""The fabric snapshot (payload/fabric.py), its parser and judging/fabric.py, on sysfs trees
built from a real H100 node's `/sys/class/infiniband` (tests/unit/fabrictree.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fabrictree import (
    IB_PORTS,
    counter,
    facts,
    port_dir,
    set_counter,
    set_gids,
    set_pkeys,
    snap,
    tree,
)

from orchestrator import parsers
from orchestrator.errors import ParseError
from orchestrator.judging import fabric as F
from orchestrator.parsers.fabric import parse_fabric
from payload.fabric import snapshot


def codes(vs: list[F.Verdict]) -> list[tuple[str, str]]:
    return [(v.code, v.severity) for v in vs]


# --- the snapshot and its parser ------------------------------------------------------------

def test_the_snapshot_of_a_real_h100_node(tmp_path: Path) -> None:
    f = facts(tree(tmp_path))
    assert f.present and not f.truncated
    assert [p.key for p in f.ports] == [f"{d}:1" for d in (*IB_PORTS, "mlx5_bond_0")]
    ib = f.port("mlx5_0", 1)
    assert ib is not None
    assert (ib.state, ib.phys_state, ib.rate_gbps, ib.link_layer) == (
        "ACTIVE", "LinkUp", 400.0, "InfiniBand")
    assert ib.counters["port_rcv_errors"] == 14 and ib.counters["symbol_error"] == 0
    assert ib.counters["port_xmit_wait"] == 2489603687
    assert set(ib.counters) == {*F.GROWTH_LIMITS, "port_xmit_wait"}
    bond = f.port("mlx5_bond_0", 1)
    assert bond is not None and bond.roce and bond.rate_gbps == 200.0


def test_no_infiniband_is_a_fact_not_an_error(tmp_path: Path) -> None:
    f = facts(tmp_path / "absent")
    assert not f.present and not f.ports
    assert codes(F.describe(f)) == [("RDMA_NONE", "INFO")]
    assert "no InfiniBand/RoCE devices" in F.describe(f)[0].message
    assert codes(F.judge_load(f, f)) == [("RDMA_NONE", "INFO")]


def test_the_snapshot_is_bounded(tmp_path: Path) -> None:
    root = tree(tmp_path)
    set_pkeys(root, ["0xffff"], size=128)
    whole = F.describe(parse_fabric(json.dumps(snap(root))))
    assert "RDMA_SNAPSHOT_CUT" not in {v.code for v in whole}
    doc = snapshot(str(root), str(tmp_path), max_files=50)
    assert doc["truncated"] is True
    assert "RDMA_SNAPSHOT_CUT" in {v.code for v in F.describe(parse_fabric(json.dumps(doc)))}


def test_counters_an_adapter_cannot_read_are_kept_as_read(tmp_path: Path) -> None:
    """iWARP adapters print `N/A (no PMA)` in every counter file (node_exporter#966)."""
    root = tree(tmp_path)
    for c in F.GROWTH_LIMITS:
        set_counter(root, "mlx5_0", c, 0)
        (port_dir(root, "mlx5_0") / "counters" / c).write_text("N/A (no PMA)\n")
    p = facts(root).port("mlx5_0", 1)
    assert p is not None and set(p.counters) == {"port_xmit_wait"}
    assert p.counters_unreadable["link_downed"] == "N/A (no PMA)"
    assert "RDMA_COUNTERS_UNREADABLE" in {v.code for v in F.describe(facts(root))}


@pytest.mark.parametrize("text", ["", "[]", '{"present": true}', '{"present": true, '
                                  '"devices": [{"ports": [{"port": 1}]}]}', "not json"])
def test_a_document_that_is_not_a_snapshot_is_refused(text: str) -> None:
    with pytest.raises(ParseError):
        parsers.parse("sysfs-fabric", text)


# --- the counters around a load -----------------------------------------------------------

def test_errors_that_grew_during_the_load_name_the_device_and_port(tmp_path: Path) -> None:
    root = tree(tmp_path)
    before = facts(root)
    set_counter(root, "mlx5_4", "symbol_error", 57)
    set_counter(root, "mlx5_6", "link_downed", 2)
    set_counter(root, "mlx5_7", "port_xmit_wait", counter(root, "mlx5_7", "port_xmit_wait") + 9)
    after = facts(root)
    vs = F.judge_load(before, after)
    grew = [v for v in vs if v.code == "RDMA_COUNTER_GREW"]
    assert [(v.severity, v.details["device"], v.details["port"], v.details["counter"])
            for v in grew] == [("WARN", "mlx5_4", 1, "symbol_error"),
                               ("FAIL", "mlx5_6", 1, "link_downed")]
    assert grew[0].message.startswith("mlx5_4 port 1 symbol_error grew by 57 during the load "
                                      "(0 -> 57")
    assert "RDMA_COUNTERS_CLEAN" not in {v.code for v in vs}


def test_growth_within_the_threshold_passes(tmp_path: Path) -> None:
    root = tree(tmp_path)
    before = facts(root)
    set_counter(root, "mlx5_4", "symbol_error", F.GROWTH_LIMITS["symbol_error"][0])
    set_counter(root, "mlx5_5", "port_rcv_errors", 14 + F.GROWTH_LIMITS["port_rcv_errors"][0])
    vs = F.judge_load(before, facts(root))
    assert codes(vs)[-1] == ("RDMA_COUNTERS_CLEAN", "PASS")
    assert not [v for v in vs if v.code == "RDMA_COUNTER_GREW"]
    set_counter(root, "mlx5_4", "symbol_error", F.GROWTH_LIMITS["symbol_error"][0] + 1)
    assert "RDMA_COUNTER_GREW" in {v.code for v in F.judge_load(before, facts(root))}


def test_a_counter_that_went_back_is_said_never_a_negative_delta(tmp_path: Path) -> None:
    root = tree(tmp_path)
    before = facts(root)
    set_counter(root, "mlx5_8", "port_rcv_errors", 0)  # 14 before: cleared during the load
    vs = F.judge_load(before, facts(root))
    back = [v for v in vs if v.code == "RDMA_COUNTER_WENT_BACK"]
    assert len(back) == 1 and back[0].details == {
        "device": "mlx5_8", "port": 1, "counter": "port_rcv_errors", "before": 14, "after": 0}
    assert "went back from 14 to 0" in back[0].message
    assert not [v for v in vs if v.code == "RDMA_COUNTER_GREW"]
    assert all(d.grew >= 0 for d in F.deltas(before, facts(root)))


def test_a_counter_at_its_maximum_cannot_show_growth(tmp_path: Path) -> None:
    """The capture's mlx5_1 link_downed is 255, the top of the PMA's 8 bits."""
    root = tree(tmp_path)
    vs = F.judge_load(facts(root), facts(root))
    sat = next(v for v in vs if v.code == "RDMA_COUNTER_SATURATED")
    assert ["mlx5_1:1", "link_downed", 255] in sat.details["counters"]
    assert not [v for v in vs if v.code == "RDMA_COUNTER_GREW"]


def test_a_port_that_went_down_during_the_load_fails(tmp_path: Path) -> None:
    root = tree(tmp_path)
    before = facts(root)
    (port_dir(root, "mlx5_9") / "state").write_text("1: DOWN\n")
    (port_dir(root, "mlx5_9") / "phys_state").write_text("3: Disabled\n")
    vs = F.judge_load(before, facts(root))
    state = next(v for v in vs if v.code == "RDMA_PORT_STATE")
    assert state.severity == "FAIL" and state.message.startswith("mlx5_9 port 1 was ACTIVE")
    assert "DOWN (Disabled)" in state.message


def test_one_snapshot_missing_is_said(tmp_path: Path) -> None:
    before = facts(tree(tmp_path))
    assert codes(F.around(before, "node unreachable")) == [("RDMA_NOT_READ", "INFO")]
    assert codes(F.around(facts(tmp_path / "none"), None)) == [("RDMA_NONE", "INFO")]


# --- P_Keys across nodes --------------------------------------------------------------------

def test_pkeys_that_differ_between_nodes_fail_naming_nodes_and_keys(tmp_path: Path) -> None:
    nodes = {}
    for name, keys in (("n1", ["0xffff", "0x8001"]), ("n2", ["0xffff", "0x8001"]),
                       ("n3", ["0xffff"]), ("n4", ["0xffff", "0x8001"])):
        root = tree(tmp_path, name)
        set_pkeys(root, keys)
        nodes[name] = facts(root)
    vs = F.pkey_mismatch(nodes)
    assert codes(vs) == [("RDMA_PKEY_MISMATCH", "FAIL")]
    assert vs[0].details["differing"] == {"n3": {"lacks": ["0x8001"], "extra": []}}
    assert vs[0].details["nodes_with_them"] == ["n1", "n2", "n4"]
    assert "n3: lacks 0x8001" in vs[0].message


def test_the_last_node_is_compared_too(tmp_path: Path) -> None:
    nodes = {}
    for name, keys in (("n1", ["0xffff"]), ("n2", ["0xffff"]), ("n3", ["0x7fff"])):
        root = tree(tmp_path, name)
        set_pkeys(root, keys)
        nodes[name] = facts(root)
    vs = F.pkey_mismatch(nodes)
    assert vs[0].details["differing"] == {"n3": {"lacks": ["0xffff"], "extra": ["0x7fff"]}}


def test_the_same_pkeys_pass_and_unused_entries_are_not_keys(tmp_path: Path) -> None:
    nodes = {}
    for name in ("n1", "n2"):
        root = tree(tmp_path, name)
        set_pkeys(root, ["0xffff", "0x8001", "0x0000", "0x8000"])
        nodes[name] = facts(root)
    assert nodes["n1"].ports[0].pkeys == ["0xffff", "0x8001"]
    vs = F.pkey_mismatch(nodes)
    assert codes(vs) == [("RDMA_PKEYS_SAME", "PASS")]
    assert vs[0].details["pkeys"] == ["0x8001", "0xffff"]


def test_nodes_without_infiniband_are_not_compared(tmp_path: Path) -> None:
    root = tree(tmp_path, "n1")
    set_pkeys(root, ["0xffff"])
    assert F.pkey_mismatch({"n1": facts(root), "n2": facts(tmp_path / "none"),
                            "n3": None}) == []


# --- RoCE -------------------------------------------------------------------------------------

V4 = "0000:0000:0000:0000:0000:ffff:0a00:0011"
LINK_LOCAL = "fe80:0000:0000:0000:0a5c:2bff:fe3e:11d0"


def test_a_roce_port_with_a_v2_gid_states_its_netdev_and_mtu(tmp_path: Path) -> None:
    root, net = tree(tmp_path), tmp_path / "net"
    set_gids(root, net, "mlx5_bond_0", [(LINK_LOCAL, "IB/RoCE v1"), (LINK_LOCAL, "RoCE v2"),
                                        (V4, "IB/RoCE v1"), (V4, "RoCE v2")])
    f = facts(root, net)
    p = f.port("mlx5_bond_0", 1)
    assert p is not None and [g.index for g in p.gids] == [0, 1, 2, 3]
    assert (p.netdev, p.mtu) == ("bond0", 9000)
    vs = [v for v in F.describe(f, "roce") if v.code.startswith("RDMA_ROCE")]
    assert codes(vs) == [("RDMA_ROCE", "INFO")]
    assert vs[0].message == ("mlx5_bond_0:1 RoCE over bond0, MTU 9000; GIDs: IB/RoCE v1 x2, "
                             "RoCE v2 x2")
    assert vs[0].details["roce_v2_gids"] == [1, 3]


@pytest.mark.parametrize(("order", "severity"), [("roce", "FAIL"), ("ib", "WARN"), (None, "WARN")])
def test_a_roce_port_without_a_v2_gid_is_a_finding(tmp_path: Path, order: str | None,
                                                   severity: str) -> None:
    root, net = tree(tmp_path), tmp_path / "net"
    set_gids(root, net, "mlx5_bond_0", [(LINK_LOCAL, "IB/RoCE v1"), (V4, "IB/RoCE v1")],
             mtu=1500)
    vs = [v for v in F.describe(facts(root, net), order) if v.code.startswith("RDMA_ROCE")]
    assert codes(vs) == [("RDMA_ROCE", "INFO"), ("RDMA_ROCE_NO_V2", severity)]
    assert "MTU 1500" in vs[0].message and "bond0" in vs[1].message


# --- preflight ------------------------------------------------------------------------------

def test_preflight_fails_a_provider_whose_nodes_differ_in_pkeys(tmp_path: Path) -> None:
    """Each node's collect document carries its snapshot; the provider's cross-node judging
    names the node whose P_Keys differ, with the keys, before anything runs."""
    import re
    from typing import Any

    from collectdoc import H200_ORDER, h200_doc, inventory

    from orchestrator.steps.preflight.step import run_preflight
    from orchestrator.store import Run
    from orchestrator.suite import Suite
    from orchestrator.testing import Reply, Script, scripted_pool

    inv = inventory(H200_ORDER, nodes=("node-a", "node-b", "node-c"))
    docs = {}
    for n, keys in (("node-a", ["0xffff", "0x8012"]), ("node-b", ["0xffff"]),
                    ("node-c", ["0xffff", "0x8012"])):
        root = tree(tmp_path, n)
        set_pkeys(root, keys)
        docs[n] = h200_doc() | {"node": n, "fabric": snap(root)}

    def reply(call: Any) -> Reply:
        name = re.search(r"--node (\S+)", call.command)
        assert name is not None
        return Reply(stdout=json.dumps(docs[name.group(1)]))

    pool = scripted_pool(default=Script().on(lambda c: "-m payload collect" in c, reply=reply))
    run = Run.create(tmp_path / "r", command="preflight", suite_hash="h", suite={},
                     inventory_path=None)
    run_preflight(inv, inv.nodes, run, Suite(), pool=pool)  # type: ignore[arg-type]
    fs = run.findings()
    bad = [f for f in fs if f.code == "RDMA_PKEY_MISMATCH"]
    assert [(f.scope, f.severity, f.provider) for f in bad] == [("provider", "FAIL", "prov")]
    assert bad[0].details["differing"] == {"node-b": {"lacks": ["0x8012"], "extra": []}}
    assert "nodes/node-b/preflight/raw/fabric.json" in bad[0].evidence
    ports = [f for f in fs if f.code == "RDMA_PORTS"]
    assert sorted(f.node for f in ports) == ["node-a", "node-b", "node-c"]
    raw = json.loads((run.dir / "nodes/node-b/preflight/raw/fabric.json").read_text())
    assert raw == docs["node-b"]["fabric"]
    facts_json = json.loads((run.dir / "nodes/node-a/preflight/facts.json").read_text())
    assert facts_json["facts"]["fabric"]["ports"][0]["pkeys"] == ["0xffff", "0x8012"]


def test_preflight_of_a_node_without_infiniband_states_it(tmp_path: Path) -> None:
    from collectdoc import H200_ORDER, h200_doc, inventory

    from orchestrator.steps.preflight.step import judge_document

    inv = inventory(H200_ORDER)
    doc = h200_doc() | {"fabric": snapshot(str(tmp_path / "none"), str(tmp_path))}
    report = judge_document(doc, inv.node("node-a"), inv, "run-1", None)
    fab = [(f.code, f.severity) for f in report.findings if f.code.startswith("RDMA_")]
    assert fab == [("RDMA_NONE", "INFO")]


# --- around the nccl step's load ------------------------------------------------------------

def _ssh_inventory(tmp_path: Path, n: int) -> object:
    from orchestrator import inventory

    lines = ["version: 1", "providers:", "  lab:", "    executor: ssh",
             "    expect: {gpus_per_node: 2, fabric: {type: ib}}", "    nodes:"]
    lines += [f"      - {{name: n{i}, host: 10.0.0.{i + 1}, work_dir: /w/n{i}}}"
              for i in range(1, n + 1)]
    p = tmp_path / "inv.yaml"
    p.write_text("\n".join(lines) + "\n")
    return inventory.load(p)


def test_the_nccl_step_reads_the_counters_before_and_after_its_load(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Single-node rounds on n1, then multi-node rounds on n1+n2: n2's mlx5_4 counts
    symbol errors during the multi-node load and is named; n1 stays clean."""
    from orchestrator.nccltests import BuildDoc
    from orchestrator.steps.nccl import step as nccl_step
    from orchestrator.store import Run
    from orchestrator.suite import Suite
    from orchestrator.testing import Script, scripted_pool

    inv = _ssh_inventory(tmp_path, 2)
    built = BuildDoc(ok=True, gpus=2, mpi=True, built_commit="a0b82b2" * 5,
                     binary="/x/all_reduce_perf")
    monkeypatch.setattr(nccl_step, "_build_node", lambda ex, run, suite, archive: built)
    monkeypatch.setattr(nccl_step, "_single", lambda *a, **k: [])
    monkeypatch.setattr(nccl_step, "_multi", lambda *a, **k: [])
    clean = json.dumps(snap(tree(tmp_path, "clean")))
    grown_root = tree(tmp_path, "grown")
    set_counter(grown_root, "mlx5_4", "symbol_error", 57)
    grown = json.dumps(snap(grown_root))
    calls = {"n1": 0, "n2": 0}

    def answers(node: str) -> Script:
        def reply(call: object) -> object:
            from orchestrator.testing import Reply
            calls[node] += 1
            # n2: before single, after single, before multi, after multi (the 4th grows)
            return Reply(stdout=grown if node == "n2" and calls[node] >= 4 else clean)
        return Script().on(lambda c: "-m payload fabric" in c, reply=reply)

    pool = scripted_pool({"n1": answers("n1"), "n2": answers("n2")})
    suite = Suite()
    run = Run.create(tmp_path / "r", command="nccl", suite_hash=suite.hash,
                     suite=suite.model_dump(mode="json"), inventory_path=None)
    nccl_step.run_nccl(inv, inv.nodes, run, suite, pool=pool)  # type: ignore[arg-type]
    assert calls == {"n1": 4, "n2": 4}
    fs = [f for f in run.findings() if f.code.startswith("RDMA_")
          and f.code != "RDMA_COUNTER_SATURATED"]  # the capture's link_downed 255, every time
    got = sorted((f.node, f.code, f.message.split("]")[0] + "]") for f in fs)
    assert got == [("n1", "RDMA_COUNTERS_CLEAN", "[multi]"), ("n1", "RDMA_COUNTERS_CLEAN",
                                                                  "[single]"),
                   ("n2", "RDMA_COUNTERS_CLEAN", "[single]"),
                   ("n2", "RDMA_COUNTER_GREW", "[multi]")]
    bad = next(f for f in fs if f.code == "RDMA_COUNTER_GREW")
    assert bad.severity == "WARN" and bad.details["device"] == "mlx5_4"
    assert bad.message.startswith("[multi] mlx5_4 port 1 symbol_error grew by 57")
    assert bad.evidence == ["nodes/n2/nccl/fabric_before_multi.json",
                            "nodes/n2/nccl/fabric_after_multi.json"]
    assert all((run.dir / e).is_file() for e in bad.evidence)


def test_the_nccl_step_on_nodes_without_infiniband_reads_once_and_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.nccltests import BuildDoc
    from orchestrator.steps.nccl import step as nccl_step
    from orchestrator.store import Run
    from orchestrator.suite import Suite
    from orchestrator.testing import Script, scripted_pool

    inv = _ssh_inventory(tmp_path, 1)
    built = BuildDoc(ok=True, gpus=2, mpi=True, binary="/x/all_reduce_perf")
    monkeypatch.setattr(nccl_step, "_build_node", lambda ex, run, suite, archive: built)
    monkeypatch.setattr(nccl_step, "_single", lambda *a, **k: [])
    none = json.dumps(snapshot(str(tmp_path / "absent"), str(tmp_path)))
    pool = scripted_pool(default=Script().on(lambda c: "-m payload fabric" in c, stdout=none,
                                             times=1))
    suite = Suite()
    run = Run.create(tmp_path / "r", command="nccl", suite_hash=suite.hash,
                     suite=suite.model_dump(mode="json"), inventory_path=None)
    nccl_step.run_nccl(inv, inv.nodes, run, suite, multi=False, pool=pool)  # type: ignore[arg-type]
    fs = [f for f in run.findings() if f.code.startswith("RDMA_")]
    assert [(f.code, f.severity) for f in fs] == [("RDMA_NONE", "INFO")]
    assert "no InfiniBand/RoCE devices" in fs[0].message


@pytest.mark.skipif(Path("/sys/class/infiniband").exists(), reason="this host has InfiniBand")
def test_the_real_payload_on_a_local_node_without_infiniband(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The payload pushed to a local node and run there (as on the netns cluster): its
    snapshot says there is no InfiniBand/RoCE, a fact, and nothing is read after the load."""
    import sys

    from orchestrator import inventory
    from orchestrator.nccltests import BuildDoc
    from orchestrator.steps.nccl import step as nccl_step
    from orchestrator.store import Run
    from orchestrator.suite import Suite

    p = tmp_path / "inv.yaml"
    p.write_text("version: 1\nproviders:\n  lab:\n    executor: local\n    nodes:\n"
                 f"      - {{name: n1, work_dir: {tmp_path / 'w'}, python: {sys.executable}}}\n")
    inv = inventory.load(p)
    built = BuildDoc(ok=True, gpus=2, mpi=True, binary="/x/all_reduce_perf")
    monkeypatch.setattr(nccl_step, "_build_node", lambda ex, run, suite, archive: built)
    monkeypatch.setattr(nccl_step, "_single", lambda *a, **k: [])
    suite = Suite()
    run = Run.create(tmp_path / "r", command="nccl", suite_hash=suite.hash,
                     suite=suite.model_dump(mode="json"), inventory_path=None)
    nccl_step.run_nccl(inv, inv.nodes, run, suite, multi=False)
    fs = [f for f in run.findings() if f.code.startswith("RDMA_")]
    assert [(f.code, f.severity, f.node) for f in fs] == [("RDMA_NONE", "INFO", "n1")]
    assert fs[0].evidence == ["nodes/n1/nccl/fabric_before_single.json"]
    assert not (run.dir / "nodes/n1/nccl/fabric_after_single.json").exists()
