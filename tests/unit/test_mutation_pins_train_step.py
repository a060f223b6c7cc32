"""The training step's planning (orchestrator/steps/train/step.py) on exact values: the
checkpoint folders, the supervisor's whole argument list, the kill phase's flags, the
rendezvous port and address, the restore rotation's groups."""

from __future__ import annotations

import json
import typing
import zlib
from pathlib import Path
from types import SimpleNamespace

from orchestrator.inventory import Node
from orchestrator.steps.train import launch, storage
from orchestrator.steps.train import step as train
from orchestrator.store import Run
from orchestrator.suite import TrainParams

RUN = typing.cast(Run, SimpleNamespace(run_id="20261202-0405-ab12"))


def _node(name: str = "n1", executor: str = "ssh", **more: typing.Any) -> Node:
    base: dict[str, typing.Any] = {
        "name": name, "provider": "p", "executor": executor, "host": None, "port": 22,
        "user": None, "identity_file": None, "ssh_alias": None, "proxy_jump": None,
        "python": "python3", "work_dir": "/w/n1/", "ckpt_dir": None, "env": {},
        "connect_timeout_s": 10.0}
    return Node(**{**base, **more})


def test_checkpoints_go_under_the_work_dir_unless_the_node_names_a_folder() -> None:
    assert storage.ckpt_base(_node()) == "/w/n1/ckpt"
    assert storage.ckpt_base(_node(work_dir="/w")) == "/w/ckpt"
    assert storage.ckpt_base(_node(ckpt_dir="/fast/ck/")) == "/fast/ck/"
    assert storage.ckpt_root(_node(ckpt_dir="/fast/ck/"), RUN, "multi-p") == (
        "/fast/ck/gpuvet-train/20261202-0405-ab12/multi-p")
    assert storage.ckpt_root(_node(), RUN, "n1") == "/w/n1/ckpt/gpuvet-train/20261202-0405-ab12/n1"


def test_a_probe_token_is_a_safe_file_name() -> None:
    assert storage._token(RUN, _node("gpu 1/a")) == "gpuvet-20261202-0405-ab12-gpu_1_a"
    assert storage._token(RUN, _node("x.y_z-1")) == "gpuvet-20261202-0405-ab12-x.y_z-1"
    long = storage._token(RUN, _node("n" * 200))
    assert len(long) == 128 and long == ("gpuvet-20261202-0405-ab12-" + "n" * 200)[:128]


def test_the_supervisors_arguments_whole() -> None:
    job = train.Job("n1", _node(), "kill", Path("/l"), "/ck/r/n1", node_rank=1, nnodes=2,
                    master="10.0.0.1", port=29777, extra=["--save-at", "8"])
    assert job.remote_out(RUN) == "/w/n1/train-runs/20261202-0405-ab12/n1/kill"
    params = TrainParams(cpu_procs_per_node=3, timeout_s=61.5, telemetry_interval_s=2)
    head = ["train-supervise", "--out", "/w/n1/train-runs/20261202-0405-ab12/n1/kill",
            "--phase", "kill", "--ckpt-dir", "/ck/r/n1", "--nnodes", "2", "--node-rank", "1",
            "--master-addr", "10.0.0.1", "--master-port", "29777", "--cpu-procs", "3",
            "--timeout", "61.5", "--telemetry-interval", "2"]
    assert launch._supervise_args(job, RUN, params) == [
        *head, "--params", json.dumps(params.payload_params(), sort_keys=True), "--save-at", "8"]
    own = params.model_copy(update={"command": "-x run.sh", "resume_flag": "--resume",
                                    "command_kill_after_step": 3})
    assert launch._supervise_args(job, RUN, own) == [
        *head, "--command=-x run.sh", "--resume-flag=--resume", "--save-at", "8"]
    plain = params.model_copy(update={"command": "run.sh"})
    assert launch._supervise_args(job, RUN, plain) == [*head, "--command=run.sh", "--save-at",
                                                      "8"]
    default = train.Job("u", _node(), "reference", Path("/l"), "/ck")
    assert (default.node_rank, default.nnodes, default.master, default.port, default.extra) == (
        0, 1, "127.0.0.1", 29500, [])


def test_the_kill_phase_of_your_command_kills_after_its_step() -> None:
    own = TrainParams(command="run.sh", resume_flag="-r", command_kill_after_step=6)
    assert train.phase_extra(own, "kill") == ["--kill-after-step", "6"]
    assert train.phase_extra(own, "restore") == []


def test_the_rendezvous_port_and_address() -> None:
    nodes = [_node("a", host="10.1.1.1"), _node("b")]
    want = 29500 + zlib.crc32(b"20261202-0405-ab12/multi-p/kill") % 2000
    assert train._port(nodes, RUN, "multi-p", "kill") == want
    assert train._master(nodes) == "10.1.1.1"
    assert train._master([_node("b"), nodes[0]]) == "b"
    local = [_node("a", executor="local", host="10.1.1.1")]
    assert train._master(local) == "127.0.0.1"
    port = train._port(local, RUN, "multi-p", "kill")
    assert 1024 <= port < 65536


def test_a_node_that_sees_only_one_way_shares_with_nobody() -> None:
    def probe(name: str, sees: set[str], gpus: typing.Any) -> storage.Probe:
        return storage.Probe(_node(name), {"gpus": gpus}, Path("probe.json"), sees)

    a, b, c = probe("a", {"b", "c"}, None), probe("b", {"a"}, 0), probe("c", set(), 0)
    assert [[p.node.name for p in g] for g in storage.share_groups([a, b, c])] == [
        ["a", "b"], ["c"]]
    assert (a.gpus, probe("x", set(), "8").gpus) == (0, 8)
    d = probe("d", {"a", "b"}, 0)
    a.sees.add("d")
    b.sees.add("d")
    assert [[p.node.name for p in g] for g in storage.share_groups([a, b, c, d])] == [
        ["a", "b", "d"], ["c"]]
    e = probe("e", {"a"}, 0)  # sees a, and a sees it, but not b
    a.sees.add("e")
    assert [[p.node.name for p in g] for g in storage.share_groups([a, b, e])] == [
        ["a", "b"], ["e"]]
