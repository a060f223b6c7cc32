import base64
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paramiko
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
from orchestrator.executors import ExecutorOptions, ExecutorPool, fanout, hostkeys, make_executor, probe
from orchestrator.executors.base import (
    CommandResult,
    EnvCommand,
    env_script,
    get_verified,
    is_unreachable,
    put_verified,
    remote_path,
    shell_path,
)
from orchestrator.executors.local import LocalExecutor
from orchestrator.inventory import JumpHost, Node


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
    with pytest.raises(UsageError, match="known executors: local, ray, slurm, ssh"):
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


# --- SSH failures: which hop, why, once ---------------------------------------------

def closed_port() -> int:
    """A local port nothing listens on: connecting is refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture()
def full_backlog() -> Iterator[int]:
    """A port whose accept queue is full: the kernel drops new SYNs, a connect hangs."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    port = int(srv.getsockname()[1])
    held = []
    for _ in range(16):  # fill until a connect times out: the queue is then full
        c = socket.socket()
        c.settimeout(0.5)
        try:
            c.connect(("127.0.0.1", port))
        except TimeoutError:
            c.close()
            break
        held.append(c)
    else:
        pytest.skip("this kernel answers connects beyond the listen backlog")
    yield port
    for c in held:
        c.close()
    srv.close()


def ssh_to(tmp_path: Path, port: int, host: str = "127.0.0.1", **over: Any) -> Node:
    return ssh_node(tmp_path).model_copy(update={"host": host, "port": port, **over})


def unreachable(n: Node, **opts: Any) -> NodeUnreachable:
    from orchestrator.executors.ssh import SshExecutor

    ex = SshExecutor(n, ExecutorOptions(known_hosts=str(n.work_dir) + "/kh", **opts))
    with pytest.raises(NodeUnreachable) as info:
        ex.run("true")
    assert is_unreachable(info.value)
    return info.value


def test_refused_names_the_node_and_the_cause_once(tmp_path: Path) -> None:
    port = closed_port()
    exc = unreachable(ssh_to(tmp_path, port))
    assert (exc.hop, exc.cause) == ("n1", "refused")
    assert exc.what == f"cannot connect to n1 (127.0.0.1:{port}): connection refused"
    assert str(exc).count("refused") == 1 and "Errno" not in str(exc)
    assert exc.hint and "sshd" in exc.hint


@pytest.mark.timeout(60)
def test_connect_timeout_below_one_second_still_times_out(tmp_path: Path,
                                                          full_backlog: int) -> None:
    # fabric would round 0.3 s down to 0, which paramiko reads as "no timeout": the
    # connect would then hang for the kernel's SYN retries (about two minutes)
    exc = unreachable(ssh_to(tmp_path, full_backlog, connect_timeout_s=0.3))
    assert (exc.hop, exc.cause) == ("n1", "timed out")
    assert "timed out after 0.3 s" in exc.what and "connect_timeout_s is 0.3" in (exc.hint or "")


def test_dns_failure_is_named(tmp_path: Path) -> None:
    exc = unreachable(ssh_to(tmp_path, 22, host="no-such-node.invalid"))
    assert (exc.hop, exc.cause) == ("n1", "dns")
    assert "does not resolve (DNS)" in exc.what and "no-such-node.invalid" in (exc.hint or "")


def test_jump_host_failure_names_the_jump_host(tmp_path: Path) -> None:
    port = closed_port()
    n = ssh_to(tmp_path, 22, host="10.255.0.1", proxy_jump="bastion")
    exc = unreachable(n, jump_hosts={"bastion": JumpHost(host="127.0.0.1", port=port)})
    assert (exc.hop, exc.cause) == ("bastion", "refused")
    assert exc.what == (f"cannot connect to jump host bastion (127.0.0.1:{port}) on the way "
                        "to n1: connection refused")
    assert exc.node == "n1"


def test_paramiko_tracebacks_stay_out_of_the_output(tmp_path: Path) -> None:
    """A server that is not SSH: paramiko's transport thread logs 'Exception (client)'
    with a traceback, which would reach stderr; only gpuvet's one error may come out.
    The client runs in a fresh interpreter, as the CLI does, with no logging set up."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def not_ssh() -> None:
        conn, _ = srv.accept()
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        conn.close()

    t = threading.Thread(target=not_ssh)
    t.start()
    n = ssh_to(tmp_path, int(srv.getsockname()[1]))
    script = (
        "import sys\n"
        "from orchestrator.errors import NodeUnreachable\n"
        "from orchestrator.executors.base import ExecutorOptions\n"
        "from orchestrator.executors.ssh import SshExecutor\n"
        "from orchestrator.inventory import Node\n"
        "node = Node.model_validate_json(sys.argv[1])\n"
        "try:\n"
        "    SshExecutor(node, ExecutorOptions(known_hosts=sys.argv[2])).run('true')\n"
        "except NodeUnreachable as exc:\n"
        "    print('CAUSE', exc.cause)\n"
        "    print(exc)\n")
    try:
        res = subprocess.run([sys.executable, "-c", script, n.model_dump_json(),
                              str(tmp_path / "kh")], capture_output=True, text=True,
                             timeout=120, cwd=Path(__file__).resolve().parents[2])
    finally:
        t.join(30)
        srv.close()
    assert "CAUSE" in res.stdout, res.stdout + res.stderr
    assert res.stderr == ""
    assert "Traceback" not in res.stdout and "Exception (client)" not in res.stdout
    assert res.stdout.count("cannot connect to n1") == 1


# --- host keys ------------------------------------------------------------------------

def new_key(tmp_path: Path, name: str) -> tuple[paramiko.PKey, str, str]:
    """(key, "type base64" as in known_hosts, fingerprint as ssh-keygen -l prints it)."""
    path = tmp_path / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(path)],
                   check=True, capture_output=True, timeout=60)
    kind, b64 = (tmp_path / f"{name}.pub").read_text().split()[:2]
    listed = subprocess.run(["ssh-keygen", "-l", "-f", str(path) + ".pub"], check=True,
                            capture_output=True, text=True, timeout=60).stdout.split()[1]
    return paramiko.PKey.from_type_string(kind, base64.b64decode(b64)), f"{kind} {b64}", listed


def test_fingerprints_are_openssh_sha256(tmp_path: Path) -> None:
    key, _, listed = new_key(tmp_path, "k")
    assert listed.startswith("SHA256:") and hostkeys.fingerprint(key) == listed


def test_malformed_known_hosts_lines_are_named_and_do_not_block_others(tmp_path: Path) -> None:
    a, a_line, _ = new_key(tmp_path, "a")
    c, c_line, _ = new_key(tmp_path, "c")
    r, r_line, r_fp = new_key(tmp_path, "r")
    kh_path = tmp_path / "known_hosts"
    kh_path.write_text("\n".join([
        f"host-a {a_line}",
        "host-b ssh-ed25519 !!!not-base64!!!",
        "two fields",
        f"@revoked * {r_line}",
        f"@cert-authority *.example {a_line}",
        "# a comment",
        f"host-c,10.0.0.3 {c_line}",
    ]) + "\n")
    with pytest.raises(Exception, match="Incorrect padding|Invalid"):
        paramiko.HostKeys(str(kh_path))  # paramiko's own loader gives up on line 2
    kh = hostkeys.load(kh_path)
    assert [(n, k.asbytes()) for n, k in kh.entries] == [
        ("host-a", a.asbytes()), ("host-c", c.asbytes()), ("10.0.0.3", c.asbytes())]
    assert [p.split(": ")[0] for p in kh.problems] == [f"{kh_path}:2", f"{kh_path}:3",
                                                       f"{kh_path}:5"]
    assert r.asbytes() in kh.revoked

    client = paramiko.SSHClient()
    with pytest.raises(HostKeyError) as info:  # an unknown host: the skipped lines are named
        hostkeys.Policy(kh, False, "n1").missing_host_key(client, "host-b", a)
    assert "host-b is not in" in str(info.value) and f"{kh_path}:2" in str(info.value)
    # a revoked key is refused even when new keys are accepted, and not recorded
    with pytest.raises(HostKeyError, match="@revoked") as info:
        hostkeys.Policy(kh, True, "n1").missing_host_key(client, "host-z", r)
    assert r_fp in str(info.value)
    before = kh_path.read_text()
    policy = hostkeys.Policy(kh, True, "n1")
    policy.missing_host_key(client, "[host-n]:2222", c)
    assert kh_path.read_text() == before + f"[host-n]:2222 {c_line}\n"
    assert policy.accepted == ["[host-n]:2222"] and client.get_host_keys().lookup("[host-n]:2222")
    assert oct(kh_path.stat().st_mode & 0o777) == "0o600"


def test_changed_key_shows_both_fingerprints(tmp_path: Path) -> None:
    old, _, old_fp = new_key(tmp_path, "old")
    new, _, new_fp = new_key(tmp_path, "new")
    kh = hostkeys.KnownHosts(tmp_path / "known_hosts")
    err = hostkeys.changed_error(paramiko.BadHostKeyException("10.0.0.7", new, old), kh, "n7")
    assert err.what == (f"host key of 10.0.0.7 CHANGED: {kh.path} has ssh-ed25519 {old_fp}, "
                        f"the host offers ssh-ed25519 {new_fp}; connection refused")
    assert err.node == "n7" and f"ssh-keygen -R 10.0.0.7 -f {kh.path}" in (err.hint or "")
    assert isinstance(err, ConnectionFailed)


# --- copies: where relative and ~/ paths land, what a failure says -------------------

def test_relative_and_home_paths_resolve_the_same_for_copy_and_checksum(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ex = LocalExecutor(node(tmp_path))
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(5000))
    digest = put_verified(ex, src, "sub/copy.bin")
    assert (tmp_path / "n1" / "sub" / "copy.bin").read_bytes() == src.read_bytes()
    assert get_verified(ex, "sub/copy.bin", tmp_path / "back.bin") == digest
    monkeypatch.setenv("HOME", str(tmp_path / "home dir"))
    assert put_verified(ex, src, "~/x/y.bin") == digest
    assert (tmp_path / "home dir" / "x" / "y.bin").is_file()
    with pytest.raises(UsageError, match="~user paths"):
        put_verified(ex, src, "~bob/y.bin")
    with pytest.raises(StepError) as info:
        ex.get("sub/missing.bin", tmp_path / "m.bin")
    assert f"n1:{tmp_path / 'n1' / 'sub' / 'missing.bin'}" in str(info.value)
    assert "no such file" in str(info.value)


def test_remote_and_shell_paths() -> None:
    n = Node(name="n", provider="p", executor="ssh", host="h", port=22, user=None,
             identity_file=None, ssh_alias=None, proxy_jump=None, python="python3",
             work_dir="~/gv/", ckpt_dir=None, env={}, connect_timeout_s=5)
    assert remote_path(n, "a b/c") == "~/gv/a b/c"
    assert remote_path(n, "/abs") == "/abs" and remote_path(n, "~/h") == "~/h"
    assert shell_path("~/gv/a b/c") == "\"$HOME\"/'gv/a b/c'"
    assert shell_path("/x;rm") == "'/x;rm'" and shell_path("~") == '"$HOME"'
    from orchestrator.executors.ssh import _sftp_path

    assert _sftp_path("~/gv/a") == "gv/a" and _sftp_path("/abs") == "/abs"
