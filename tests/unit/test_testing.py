"""orchestrator.testing: the scripted executor and pool that unit tests of steps stand on."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrator import payload
from orchestrator.errors import CommandFailed, CommandTimeout, NodeUnreachable, StepError
from orchestrator.executors import fanout, probe
from orchestrator.executors.base import EnvCommand, get_verified, put_verified
from orchestrator.inventory import Node
from orchestrator.testing import (
    Call,
    Reply,
    Script,
    ScriptedExecutor,
    UnexpectedCommand,
    scripted_pool,
)


def node(name: str = "n1", **env: str) -> Node:
    return Node(name=name, provider="p", executor="ssh", host=f"{name}.example", port=22,
                user=None, identity_file=None, ssh_alias=None, proxy_jump=None,
                python="python3", work_dir=f"/w/{name}", ckpt_dir=None, env=env,
                connect_timeout_s=5)


def test_rules_match_exactly_by_regex_or_predicate_in_order() -> None:
    ex = ScriptedExecutor(node())
    ex.on("hostname", stdout="gpu-1\n")
    ex.on(re.compile(r"^nvidia-smi\b"), rc=9, stderr="NVIDIA-SMI has failed\n")
    ex.on(lambda c: c.startswith("echo "), reply=lambda call: Reply(stdout=call.command[5:]))
    assert ex.run("hostname").stdout == "gpu-1\n"
    assert ex.run("nvidia-smi -L").rc == 9
    assert ex.run("echo hi").stdout == "hi"
    with pytest.raises(UnexpectedCommand, match=r"\[n1\] no scripted answer for command "
                       r"'hostname -f' \(rules: 'hostname'; re '\^nvidia-smi\\\\b'; predicate"):
        ex.run("hostname -f")  # exact strings are exact
    assert ex.unexpected == ["hostname -f"]
    with pytest.raises(UnexpectedCommand, match="unscripted commands: 'hostname -f'"):
        ex.check()


def test_times_scripts_successive_answers() -> None:
    ex = ScriptedExecutor(node(), Script().on("x", rc=1, times=1).on("x", rc=0))
    assert [ex.run("x").rc for _ in range(3)] == [1, 0, 0]


def test_calls_are_recorded_with_the_environment_the_command_would_see(tmp_path: Path) -> None:
    ex = ScriptedExecutor(node(NODE="n", BOTH="node"), Script().on(re.compile("."), stdout="out\n"))
    log = tmp_path / "logs" / "x.log"
    ex.run(EnvCommand("mpirun x", {"CTX": "c"}), env={"BOTH": "caller"}, cwd="/tmp",
           timeout=5, stdout_path=log)
    assert ex.calls == [Call("mpirun x", {"NODE": "n", "BOTH": "caller", "CTX": "c"}, "/tmp", 5,
                             log)]
    assert log.read_text() == "out\n" and ex.commands == ["mpirun x"]


def test_replies_can_fail_time_out_or_raise() -> None:
    lost = NodeUnreachable("cannot connect to n1: refused", hop="n1", cause="refused")
    ex = ScriptedExecutor(node(), Script().on("slow", timed_out=True, stdout="partial")
                          .on("bad", rc=2, stderr="no\n").on("gone", raises=lost))
    with pytest.raises(CommandTimeout) as t:
        ex.run("slow").raise_for_status("slow")
    assert t.value.result is not None and t.value.result.stdout == "partial"
    assert t.value.result.rc is None
    with pytest.raises(CommandFailed) as f:
        ex.run("bad").raise_for_status("bad")
    assert f.value.result.rc == 2
    with pytest.raises(NodeUnreachable) as u:
        ex.run("gone")
    assert u.value is lost


def test_files_put_get_and_verified_copies(tmp_path: Path) -> None:
    ex = ScriptedExecutor(node(), files={"/w/n1/in.txt": b"remote\n"})
    src = tmp_path / "src.txt"
    src.write_text("local\n")
    put_verified(ex, src, "sub/out.txt")  # relative: under the node's work_dir
    assert ex.files["/w/n1/sub/out.txt"] == b"local\n" and ex.puts == ["/w/n1/sub/out.txt"]
    get_verified(ex, "/w/n1/in.txt", tmp_path / "in.txt")
    assert (tmp_path / "in.txt").read_text() == "remote\n"
    with pytest.raises(StepError, match="cannot read /w/n1/none"):
        get_verified(ex, "none", tmp_path / "none")
    with pytest.raises(StepError, match="copying /w/n1/none from the node failed"):
        ex.get("none", tmp_path / "none")


def test_probe_on_a_scripted_node() -> None:
    """An existing step function, unit-tested without any node."""
    ex = ScriptedExecutor(node("gpu-7"), Script()
                          .on(re.compile(r"^hostname; python3 -c "), stdout="gpu-7\n3.10.12\n")
                          .on("true"))
    info = probe(ex)
    assert (info.node, info.hostname, info.python_version) == ("gpu-7", "gpu-7", "3.10.12")
    assert ex.commands[1] == "true" and [c.timeout for c in ex.calls] == [60, 60]
    broken = ScriptedExecutor(node("gpu-8"), Script().on(re.compile("^hostname"), rc=127,
                                                         stderr="sh: hostname: not found\n"))
    with pytest.raises(CommandFailed, match="probe failed with exit code 127") as info_err:
        probe(broken)
    assert info_err.value.result.stderr == "sh: hostname: not found\n"


def test_payload_is_pushed_when_the_node_lacks_it(tmp_path: Path) -> None:
    cmd = re.compile(r"-m payload collect")
    ex = ScriptedExecutor(node(), Script()
                          .on(cmd, rc=payload.NEED_PAYLOAD_RC, stdout=payload.NEED_PAYLOAD_MARK,
                              times=1)
                          .on(re.compile(r"python3 -c .*safe_extract"), rc=0)
                          .on(cmd, stdout='{"node": "n1"}\n'))
    res = payload.run(ex, ["collect"], staging=tmp_path, timeout=60)
    assert res.stdout == '{"node": "n1"}\n'
    tgz = f"{payload.remote_dir('/w/n1')}.tar.gz"
    assert ex.puts == [tgz] and ex.files[tgz] == payload.archive()[1]
    assert len([c for c in ex.commands if cmd.search(c)]) == 2


def test_scripted_pool_stands_for_an_executor_pool() -> None:
    nodes = [node("a"), node("b"), node("c")]
    pool = scripted_pool({"b": Script().on("hostname", raises=NodeUnreachable(
        "cannot connect to b", hop="b", cause="timed out"))},
        default=Script().on("hostname", stdout="ok\n"))
    group = fanout(nodes, lambda n: pool(n).run("hostname").stdout)
    assert group.results == {"a": "ok\n", "c": "ok\n"}
    assert isinstance(group.failures["b"], NodeUnreachable)
    assert pool(nodes[0]) is pool.executors["a"] and pool(nodes[0]).node is nodes[0]
    pool.check()
    with pool:
        pass
    assert all(ex.closed for ex in pool.executors.values())
    strict = scripted_pool({"a": Script()})
    with pytest.raises(UnexpectedCommand, match="no script for node 'b'"):
        strict(nodes[1])
    # an unscripted command inside fan-out is that node's failure, and check() still sees it
    group = fanout(nodes[:1], lambda n: strict(n).run("uptime"))
    assert "no scripted answer for command 'uptime'" in str(group.failures["a"])
    with pytest.raises(UnexpectedCommand):
        strict.check()
