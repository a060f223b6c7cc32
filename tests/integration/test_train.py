"""The training step over SSH on two namespace nodes: torchrun with gloo across them,
the tiny model, the whole protocol with a real SIGKILL and a bit-exact restore.

- A checkpoint directory both namespaces share (one path on the host filesystem,
  standing in for NFS): each node's checkpoint is restored on the other node and
  the save killed before its manifest is recognised and skipped; the multi-node
  run, killed after a step, resumes with every rank on the other node.
- A run interrupted (SIGINT) while its restore phase runs and resumed: the new
  attempt reads nothing of the first one's files on the node, and passes.
- Each node's own directory: the step says the checkpoint is node-local; a NaN
  injected by the suite is a FAIL that stops the protocol.
"""

from __future__ import annotations

import os
import pwd
from pathlib import Path

from cluster import Cluster

from orchestrator import inventory
from orchestrator.records import Finding
from orchestrator.steps.train import step as train
from orchestrator.store import Run
from orchestrator.suite import Suite, load_suite
from payload.train import protocol

ROOT = Path(__file__).resolve().parents[2]
SUITE = load_suite(ROOT / "suites" / "train-cpu.yaml")
NODES = ["node1", "node2"]
ENV = {"GLOO_SOCKET_IFNAME": "eth0"}


def _run(inv: inventory.Inventory, suite: Suite, tmp_path: Path, *, single: bool = True,
         multi: bool = True, seen: list[tuple[str, str]] | None = None) -> Run:
    run = Run.create(tmp_path / "results", command="train", suite_hash=suite.hash,
                     suite=suite.model_dump(mode="json"), inventory_path=inv.path)
    driven = train.run_train(inv, inv.nodes, run, suite, single=single, multi=multi,
                             progress=None if seen is None else lambda *ev: seen.append(ev))
    assert not driven.failed, {k: f.message for k, f in driven.failed.items()}
    return run


def _by(run: Run, code: str) -> dict[str | None, Finding]:
    return {f.node: f for f in run.findings() if f.code == code}


def _shared_inventory(cluster: Cluster, tmp_path: Path) -> tuple[inventory.Inventory, Path]:
    # under the cluster's folder: the test user must reach it (pytest's tmp_path is 0700)
    shared = cluster.base / f"shared-ckpt-{tmp_path.name}"
    shared.mkdir()
    pw = pwd.getpwnam(cluster.user)
    os.chown(shared, pw.pw_uid, pw.pw_gid)
    path = cluster.write_inventory(tmp_path / "inv.yaml", nodes=NODES, extra_node_fields={
        "env": ENV, "ckpt_dir": str(shared)})
    return inventory.load(path), shared


def _no_failures(run: Run) -> None:
    fails = [f for f in run.findings() if f.severity in ("FAIL", "WARN")]
    assert not fails, [f.message for f in fails]


def _no_workers_left(cluster: Cluster) -> None:
    """The supervisor's SIGKILL left no worker behind on either node."""
    for n in NODES:
        r = cluster.ssh(n, "pgrep -f '[p]ayload train' || true")
        assert r.stdout.strip() == "", r.stdout


def test_each_node_restores_the_others_checkpoint(cluster: Cluster, tmp_path: Path) -> None:
    inv, shared = _shared_inventory(cluster, tmp_path)
    run = _run(inv, SUITE, tmp_path, multi=False)
    _no_failures(run)
    ok = _by(run, "TRAIN_RESTORE_OK")
    assert set(ok) == set(NODES)
    for f in ok.values():
        assert f.severity == "PASS" and f.details["exact"] is True, f.message
    assert ok["node1"].details["saved_on"] == ["node1"]
    assert ok["node1"].details["restored_on"] == ["node2"]
    assert ok["node2"].details["restored_on"] == ["node1"]
    # the save killed before its manifest was found and skipped on the other node
    skipped = _by(run, "TRAIN_CKPT_SKIPPED")
    assert set(skipped) == set(NODES) and skipped["node1"].details["ckpt_step"] == 7
    assert set(_by(run, "CKPT_SHARED")) == set(NODES)
    restored_on_2 = run.dir / "nodes" / "node1" / "train" / "restore" / "node2" / "rank0.jsonl"
    assert '"host": "node2"' in restored_on_2.read_text()
    ms = {(m.metric, m.nodes[0]): m.value for m in run.measurements()}
    restarts = {m.nodes[0]: m for m in run.measurements() if m.metric == "restart_s"}
    for n in NODES:
        assert ms[("steps_lost", n)] == 2 and ms[("restart_s", n)] > 0
        # where the restart went, as the restoring ranks timed it. The restore was started
        # while the kill phase ran and held at its gate: torchrun, torch and the process
        # group were ready (ahead_s); the stages after the gate, the warm-up pass, finding,
        # verifying and loading the checkpoint are the relaunch
        parts = restarts[n].tags
        assert set(parts) >= {"ahead_s", "gate_wait_s", "init_s", "warmup_s", "verify_s",
                              "load_s"} and "launch_s" not in parts
        assert 0 < parts["verify_s"] < parts["load_s"]
        assert 0 < parts["init_s"] + parts["warmup_s"] + parts[
            "load_s"] < parts["relaunch_to_first_step_s"]
        # the headline speed from the steps after the verified ones, out of deterministic
        # mode; the verified steps' own figures beside it
        speed = sorted((m.metric, m.tags["timed_in"], m.tags["deterministic"],
                        m.tags["steps_timed"]) for m in run.measurements()
                       if m.nodes == [n] and m.metric.endswith("step_time_s"))
        assert speed == [("deterministic_step_time_s", "reference", True, 10),
                         ("step_time_s", "throughput", False, 10)]
    _no_workers_left(cluster)
    assert not any((shared / "gpuvet-train" / run.run_id).glob("*/step-*"))  # cleaned up


def test_multi_node_run_resumes_with_every_rank_on_the_other_node(cluster: Cluster,
                                                                  tmp_path: Path) -> None:
    inv, _shared = _shared_inventory(cluster, tmp_path)
    suite = SUITE.model_copy(update={"train": SUITE.train.model_copy(
        update={"kill": "after-step"})})
    seen: list[tuple[str, str]] = []
    run = _run(inv, suite, tmp_path, single=False, seen=seen)
    _no_failures(run)
    # the multi-node unit shows its phases as they begin
    assert [state for who, state in seen if who == "provider:testlab/multi"
            and state != "start"] == ["queued", "reference on node1+node2",
                                      "kill on node1+node2", "restore on node2+node1", "done"]
    ok = _by(run, "TRAIN_RESTORE_OK")[None]
    assert ok.details["exact"] is True and ok.details["restored_on"] == ["node2", "node1"]
    multi = run.dir / "providers" / "testlab" / "train" / "multi"
    # gloo across the two namespaces: one rank per node, each under its own hostname
    assert '"host": "node2"' in (multi / "reference" / "node2" / "rank1.jsonl").read_text()
    assert '"host": "node1"' in (multi / "restore" / "node1" / "rank1.jsonl").read_text()
    sup = (multi / "kill" / "node2" / "supervise.json").read_text()
    assert '"killed": true' in sup  # each node's supervisor killed its own group
    ms = {m.metric: m.value for m in run.measurements()}
    # killed after step 7 (K + 2): a tiny CPU step can finish inside the supervisor's 50 ms
    # poll, so the ranks may have logged step 8 before the SIGKILL landed; lost is what
    # the killed run completed past K
    done = [e["step"] for e in protocol.read_events(str(multi / "kill" / "node1" / "rank0.jsonl"))
            if e["event"] == protocol.STEP]
    assert max(done) >= 7
    assert ms["steps_lost"] == max(done) - 5 and ms["ckpt_size_bytes"] > 0
    _no_workers_left(cluster)


def test_node_local_directories_and_an_injected_nan(cluster: Cluster,
                                                    tmp_path: Path) -> None:
    path = cluster.write_inventory(tmp_path / "inv.yaml", nodes=NODES,
                                   extra_node_fields={"env": ENV})
    suite = SUITE.model_copy(update={"train": SUITE.train.model_copy(
        update={"inject_nan_at_step": 3})})
    run = _run(inventory.load(path), suite, tmp_path, multi=False)
    local = _by(run, "CKPT_NOT_PERSISTENT")
    assert set(local) == set(NODES)
    assert local["node1"].details["reason"] == "not-shared"
    assert "node2 cannot see its files" in local["node1"].message
    assert local["node1"].evidence == ["nodes/node1/train/probe.json"]
    nan = _by(run, "TRAIN_NAN")
    assert set(nan) == set(NODES)
    assert nan["node1"].severity == "FAIL" and nan["node1"].details["first_step"] == 3
    assert "loss is nan at step 3" in nan["node1"].message
    assert not _by(run, "TRAIN_KILLED")  # no kill, no restore after a broken reference
