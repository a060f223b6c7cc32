"""Multi-node launches across the namespace cluster: real mpirun and real torchrun/gloo."""

from __future__ import annotations

from pathlib import Path

import pytest
from cluster import Cluster

from orchestrator import inventory, nccltests
from orchestrator.executors import ExecutorPool, options_for
from orchestrator.executors.base import shell_join
from orchestrator.steps.nccl import step as nccl_step
from orchestrator.steps.nccl import torchbench
from orchestrator.steps.nccl.judge import Series, judge_series
from orchestrator.store import Run
from orchestrator.suite import NcclParams, Suite


@pytest.fixture()
def inv(cluster: Cluster, tmp_path: Path) -> inventory.Inventory:
    # gloo and NCCL pick the interface that reaches the peers; in the namespaces that is eth0
    path = cluster.write_inventory(
        tmp_path / "inv.yaml", nodes=["node1", "node2"],
        extra_node_fields={"env": {"GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "eth0"}})
    return inventory.load(path)


def test_mpirun_launches_one_context_per_node(cluster: Cluster,
                                              inv: inventory.Inventory) -> None:
    nodes = inv.nodes
    probe = [cluster.node_python, "-c",
             "import os, socket; print('RANK', os.environ['OMPI_COMM_WORLD_RANK'], "
             "socket.gethostname(), os.environ.get('NCCL_DEBUG'), "
             "os.environ.get('GLOO_SOCKET_IFNAME'))"]
    cmd = nccltests.mpirun_command([(n, probe, 2) for n in nodes],
                                   nccltests.run_env(NcclParams()), local=False)
    with ExecutorPool(options_for(inv)) as pool:
        res = pool(nodes[0]).run(cmd, timeout=120)
    assert res.ok, res.stdout + res.stderr
    ranks = sorted(line.split()[1:4] for line in res.stdout.splitlines()
                   if line.startswith("RANK"))
    assert ranks == [["0", "node1", "INFO"], ["1", "node1", "INFO"],
                     ["2", "node2", "INFO"], ["3", "node2", "INFO"]]
    assert res.stdout.count(" eth0") == 4  # each context's own node env reached its ranks


def test_torch_allreduce_benchmark_gloo_across_nodes(cluster: Cluster,
                                                     inv: inventory.Inventory,
                                                     tmp_path: Path) -> None:
    suite = Suite(nccl=NcclParams(min_bytes="1K", max_bytes="256K", step_factor=4, iters=3,
                                  warmup_iters=1))
    run = Run.create(tmp_path / "results", command="test", suite_hash=suite.hash,
                     suite=suite.model_dump(mode="json"), inventory_path=inv.path)
    out_dir = run.dir / "providers" / "testlab" / "nccl"
    out_dir.mkdir(parents=True)
    with ExecutorPool(options_for(inv)) as pool:
        log = torchbench.run_bench(pool, inv.nodes, run, suite, inv, {}, "torch_multi", out_dir)
    text = log.read_text()
    assert "backend gloo" in text, text
    findings, ms = judge_series(Series("multi", inv.nodes, [(1, log, False)],
                                       engine="torch"), run, inv, suite)
    assert not [f for f in findings if f.severity == "FAIL"], findings
    sizes = sorted({m.size for m in ms if m.metric == "busbw" and m.size is not None})
    assert sizes == [1024, 4096, 16384, 65536, 262144]
    assert all(m.tags["wrong"] == 0 for m in ms)
    # both ranks reported, one per node, under each node's own hostname
    assert "on      node1" in text and "on      node2" in text


def test_nccl_step_reports_build_diagnosis(cluster: Cluster, inv: inventory.Inventory,
                                           tmp_path: Path) -> None:
    """No GPUs, no NCCL on the test nodes: the step must say why, per node, and go on."""
    suite = Suite()
    run = Run.create(tmp_path / "results", command="nccl", suite_hash=suite.hash,
                     suite=suite.model_dump(mode="json"), inventory_path=inv.path)
    driven = nccl_step.run_nccl(inv, inv.nodes, run, suite)
    fails = {f.node: f for f in run.findings() if f.code == "NCCL_BUILD_FAILED"}
    assert set(fails) == {"node1", "node2"}
    assert set(driven.failed) == {"node:node1", "node:node2"}
    for f in fails.values():
        assert "nvcc not found" in f.message or "NCCL not found" in f.message, f.message
        assert f.stage == "prepare"
        assert f"nodes/{f.node}/nccl/build.json" in f.evidence, f.evidence
    assert not run.measurements()
    assert (run.dir / "findings.jsonl").read_text().count("NCCL_BUILD_FAILED") == 2
    # the payload printed its build document; it is kept as evidence
    doc = (run.dir / "nodes" / "node1" / "nccl" / "build.json").read_text()
    assert '"requested_commit": "a0b82b2260cf5152b9f8c061bbf7eaf0ba096432"' in doc


def test_shell_join_survives_hostile_values() -> None:
    assert shell_join(["echo", "a b", "$(x)"]) == "echo 'a b' '$(x)'"
