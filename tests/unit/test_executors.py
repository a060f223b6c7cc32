import os
import subprocess
import time
from pathlib import Path

import pytest

from orchestrator.errors import (
    CommandFailed,
    CommandTimeout,
    ConnectionFailed,
    GpuvetError,
    HostKeyError,
    NodeUnreachable,
    StepError,
    UsageError,
)
from orchestrator.executors import ExecutorOptions, ExecutorPool, fanout, make_executor, probe
from orchestrator.executors.base import (
    CommandResult,
    EnvCommand,
    env_script,
    get_verified,
    is_unreachable,
    put_verified,
)
from orchestrator.executors.local import LocalExecutor
from orchestrator.inventory import Node


def node(tmp_path: Path, name: str = "n1", **env: str) -> Node:
    return Node(name=name, provider="p", executor="local", host=None, port=22, user=None,
                identity_file=None, ssh_alias=None, proxy_jump=None, python="python3",
                work_dir=str(tmp_path / name), ckpt_dir=None, env=env, connect_timeout_s=5)


def test_local_run_env_cwd_and_node_env(tmp_path: Path) -> None:
    ex = LocalExecutor(node(tmp_path, NCCL_HOSTID="n1"))
    res = ex.run('echo "$NCCL_HOSTID $EXTRA"; pwd; echo err >&2; exit 3', env={"EXTRA": "x y"})
    assert res.rc == 3 and not res.ok and not res.timed_out
    assert res.stdout.splitlines() == ["n1 x y", str(tmp_path / "n1")]
    assert res.stderr.strip() == "err"
    with pytest.raises(StepError, match="exit code 3"):
        res.raise_for_status("demo")


def test_local_timeout_kills_whole_group(tmp_path: Path) -> None:
    ex = LocalExecutor(node(tmp_path))
    marker = tmp_path / "marker"
    t0 = time.monotonic()
    # a background child that ignores TERM: only a KILL of the whole group gets it
    res = ex.run(f"(trap '' TERM; sleep 61.4242; touch {marker}) & sleep 61.4242", timeout=0.5)
    assert res.timed_out and res.rc is None
    assert time.monotonic() - t0 < 10
    assert not [p for p in os.listdir("/proc") if p.isdigit() and "61.4242" in _cmd(p)]
    assert not marker.exists()


def _cmd(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_stdout_streams_to_file(tmp_path: Path) -> None:
    ex = LocalExecutor(node(tmp_path))
    dest = tmp_path / "out.log"
    res = ex.run("echo one; echo two", stdout_path=dest)
    assert dest.read_text() == "one\ntwo\n" == res.stdout


def test_put_get_verified(tmp_path: Path) -> None:
    ex = LocalExecutor(node(tmp_path))
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(300_000))
    remote = str(tmp_path / "n1" / "deep" / "copy.bin")
    digest = put_verified(ex, src, remote)
    back = tmp_path / "back" / "copy.bin"
    assert get_verified(ex, remote, back) == digest
    assert back.read_bytes() == src.read_bytes()
    with pytest.raises(StepError, match="cannot read"):
        get_verified(ex, str(tmp_path / "missing"), tmp_path / "x")


def test_fanout_side_by_side_and_order(tmp_path: Path) -> None:
    nodes = [node(tmp_path, f"n{i}") for i in range(6)]
    events: list[tuple[str, str]] = []

    def work(n: Node) -> int:
        if n.name == "n2":
            raise StepError("boom")
        if n.name == "n4":
            raise ValueError("unexpected")
        time.sleep(0.05 * (6 - int(n.name[1])))
        return int(n.name[1])

    group = fanout(nodes, work, concurrency=3, progress=lambda a, b: events.append((a, b)))
    assert list(group.results) == ["n0", "n1", "n3", "n5"]
    assert set(group.failures) == {"n2", "n4"} and not group.ok
    assert group.failures["n2"].node == "n2" and "[n2] boom" in str(group.failures["n2"])
    assert isinstance(group.failures["n4"], GpuvetError)
    assert ("n2", "failed") in events and ("n0", "done") in events


def test_fanout_runs_in_parallel(tmp_path: Path) -> None:
    nodes = [node(tmp_path, f"n{i}") for i in range(8)]
    t0 = time.monotonic()
    fanout(nodes, lambda n: time.sleep(0.5), concurrency=8)
    assert time.monotonic() - t0 < 2.0


def test_registry_and_pool(tmp_path: Path) -> None:
    n = node(tmp_path)
    with ExecutorPool(ExecutorOptions()) as pool:
        assert pool(n) is pool(n)
        info = probe(pool(n))
    assert info.hostname == os.uname().nodename and info.python_version
    bad = n.model_copy(update={"executor": "telnet"})
    with pytest.raises(UsageError, match="known executors: local, ray, ssh"):
        make_executor(bad, ExecutorOptions())


def test_env_script_quotes_values_and_checks_names() -> None:
    assert env_script({"A": "x; rm -rf /"}) == "export A='x; rm -rf /'\n"
    for bad in ("A;B", "1A", "", "A B", "Ä"):
        with pytest.raises(UsageError, match="invalid environment variable name"):
            env_script({bad: "1"})


def test_a_command_carries_its_own_env_over_the_callers(tmp_path: Path) -> None:
    ex = LocalExecutor(node(tmp_path, A="node", B="node", C="node"))
    cmd = EnvCommand('echo "$A $B $C"', {"C": "command"})
    res = ex.run(cmd, env={"B": "caller", "C": "caller"})
    assert res.stdout == "node caller command\n"
    assert type(res.command) is str and res.command == 'echo "$A $B $C"'


def ssh_node(tmp_path: Path, **env: str) -> Node:
    return node(tmp_path, **env).model_copy(update={"executor": "ssh", "host": "192.0.2.1"})


def test_ssh_wrapper_sends_values_on_stdin_not_on_the_command_line(tmp_path: Path) -> None:
    """The wrapped command is run here by a real sh, stdin fed as the SSH channel would."""
    from orchestrator.executors.ssh import SshExecutor

    secret = "s3cret value; $(touch pwned) 'q'"
    ex = SshExecutor(ssh_node(tmp_path, NODE_TOKEN=secret), ExecutorOptions())
    pidfile = str(tmp_path / "cmd.pid")
    line, stdin = ex._wrap(EnvCommand('printf "%s|%s|%s\\n" "$NODE_TOKEN" "$RUN" "$X"; '
                                      "cat; pwd", {"X": "x y"}),
                           {"RUN": "r"}, str(tmp_path / "cwd"), pidfile)
    assert stdin is not None and secret not in line and "x y" not in line
    res = subprocess.run(["sh", "-c", line], input=stdin, capture_output=True, text=True,
                         timeout=60, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    # the command saw every value, read nothing more from stdin, ran in its cwd
    assert res.stdout == f"{secret}|r|x y\n{tmp_path / 'cwd'}\n"
    assert not (tmp_path / "pwned").exists() and not Path(pidfile).exists()
    # no environment: no stdin to send, the command's stdin is /dev/null as before
    plain = SshExecutor(ssh_node(tmp_path), ExecutorOptions())
    line, stdin = plain._wrap("cat; echo done", None, None, pidfile)
    assert stdin is None
    res = subprocess.run(["sh", "-c", line], capture_output=True, text=True, timeout=60)
    assert res.stdout == "done\n"


# --- errors that carry their result ----------------------------------------------

def test_failed_command_error_holds_its_result(tmp_path: Path) -> None:
    ex = LocalExecutor(node(tmp_path))
    res = ex.run("echo partial; echo why >&2; exit 7")
    with pytest.raises(CommandFailed) as info:
        res.raise_for_status("demo")
    exc = info.value
    assert isinstance(exc, StepError)  # existing `except StepError` keeps working
    assert exc.result is res and exc.result.rc == 7 and exc.result.stdout == "partial\n"
    assert exc.node == "n1" and exc.command == res.command
    assert "exit code 7: why" in str(exc)
    assert res.ok is False and ex.run("true").raise_for_status("fine").ok


def test_timed_out_command_error_holds_its_partial_result(tmp_path: Path) -> None:
    ex = LocalExecutor(node(tmp_path))
    res = ex.run("echo started; sleep 30", timeout=0.5)
    with pytest.raises(CommandTimeout) as info:
        res.raise_for_status("slow thing")
    assert isinstance(info.value, StepError) and not isinstance(info.value, CommandFailed)
    assert info.value.result is res and info.value.result.stdout == "started\n"
    assert "slow thing timed out" in str(info.value)


def test_unreachable_is_decided_by_type_not_by_words() -> None:
    assert is_unreachable(ConnectionFailed("x"))
    assert is_unreachable(HostKeyError("host key of h CHANGED"))
    assert is_unreachable(NodeUnreachable("refused", hop="bastion", cause="refused"))
    # a message that merely mentions connecting is not an unreachable node
    assert not is_unreachable(StepError("cannot connect the dots in collect.json"))
    assert not is_unreachable(CommandFailed("connect failed", result=CommandResult(
        node="n", command="c", rc=1, stdout="", stderr="", duration_s=0)))
    # a step error raised from a lost connection is one
    try:
        try:
            raise NodeUnreachable("gone", hop="n1", cause="timed out")
        except ConnectionFailed as exc:
            raise StepError("collect failed") from exc
    except StepError as wrapped:
        assert is_unreachable(wrapped)
    # an unrelated error raised while handling one (implicit context only) is not
    try:
        try:
            raise ConnectionFailed("gone")
        except ConnectionFailed:
            raise StepError("a bug in the handler") from None
    except StepError as unrelated:
        assert not is_unreachable(unrelated)
