"""nccl-tests planning: explicit argv, run environment, the MPMD mpirun line, sources."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from orchestrator import nccltests
from orchestrator.errors import UsageError
from orchestrator.inventory import Node
from orchestrator.suite import NcclParams, NcclTestsSource
from payload.ncclbuild import archive_commit

PARAMS = NcclParams(min_bytes="1K", max_bytes="2G", step_factor=4, iters=17, warmup_iters=3,
                    check=0, datatype="half", op="max", timeout_s=321.9)


def node(name: str, host: str | None = None, env: dict[str, str] | None = None,
         work_dir: str = "/scratch/gpuvet") -> Node:
    return Node(name=name, provider="p", executor="ssh", host=host, port=22, user=None,
                identity_file=None, ssh_alias=None, proxy_jump=None, python="python3",
                work_dir=work_dir, ckpt_dir=None, env=env or {}, connect_timeout_s=10)


def opts(argv: list[str]) -> dict[str, str]:
    """`-x v` pairs after the binary, as a dict (every option here takes a value)."""
    rest = argv[1:]
    assert len(rest) % 2 == 0, rest
    return dict(zip(rest[::2], rest[1::2], strict=True))


# --- perf_argv ------------------------------------------------------------------

def test_perf_argv_passes_every_parameter_explicitly() -> None:
    plan = nccltests.perf_argv("/c/build/all_reduce_perf", PARAMS, 8, set(), "/c/r.json")
    assert plan.argv[0] == "/c/build/all_reduce_perf"
    assert opts(plan.argv) == {"-b": "1K", "-e": "2G", "-f": "4", "-g": "8", "-c": "0",
                               "-n": "17", "-w": "3", "-d": "half", "-o": "max"}
    assert plan.json_path is None  # this build has no -J


def test_perf_argv_defaults_are_still_spelled_out() -> None:
    plan = nccltests.perf_argv("bin", NcclParams(), 2, set(), None)
    assert opts(plan.argv) == {"-b": "8", "-e": "128M", "-f": "2", "-g": "2", "-c": "1",
                               "-n": "20", "-w": "5", "-d": "float", "-o": "sum"}


def test_perf_argv_adds_timeout_and_json_only_when_the_build_lists_them() -> None:
    both = nccltests.perf_argv("bin", PARAMS, 1, {"-T", "-J", "-I"}, "/c/r1.json")
    o = opts(both.argv)
    assert o["-T"] == "321"
    assert o["-J"] == "/c/r1.json"
    assert both.json_path == "/c/r1.json"
    assert "-I" not in both.argv

    only_t = nccltests.perf_argv("bin", PARAMS, 1, {"-T"}, "/c/r1.json")
    assert "-T" in only_t.argv and "-J" not in only_t.argv and only_t.json_path is None

    only_j = nccltests.perf_argv("bin", PARAMS, 1, {"-J"}, "/c/r1.json")
    assert "-T" not in only_j.argv and opts(only_j.argv)["-J"] == "/c/r1.json"

    no_path = nccltests.perf_argv("bin", PARAMS, 1, {"-J"}, None)
    assert "-J" not in no_path.argv and no_path.json_path is None


# --- run_env --------------------------------------------------------------------

def test_run_env() -> None:
    env = nccltests.run_env(NcclParams())
    assert env["NCCL_DEBUG"] == "INFO"
    assert env["NCCL_NVLS_ENABLE"] == "0"
    assert "NCCL_ALGO" not in env
    ring = nccltests.run_env(NcclParams(ring_only=True))
    assert ring["NCCL_ALGO"] == "Ring"
    assert ring["NCCL_DEBUG"] == "INFO" and ring["NCCL_NVLS_ENABLE"] == "0"
    # the shared default is not modified by a ring-only suite
    assert "NCCL_ALGO" not in nccltests.run_env(NcclParams())
    assert "NCCL_ALGO" not in nccltests.RUN_ENV


# --- mpirun_command -------------------------------------------------------------

EVIL = "a b;rm -rf /"


def split_contexts(tokens: list[str]) -> tuple[list[str], list[list[str]]]:
    first = tokens.index("-np")
    ctxs: list[list[str]] = [[]]
    for t in tokens[first:]:
        if t == ":":
            ctxs.append([])
        else:
            ctxs[-1].append(t)
    return tokens[:first], ctxs


def exports(ctx: list[str]) -> list[str]:
    return [ctx[i + 1] for i, t in enumerate(ctx) if t == "-x"]


def context_env(cmd: nccltests.EnvCommand, index: int, ctx: list[str]) -> dict[str, str]:
    """What a context's ranks get: each `-x NAME` resolved through the command's env,
    per-context copies (GPUVET_CTX<i>_NAME) under their real names."""
    alias = f"GPUVET_CTX{index}_"
    got = {}
    for name in exports(ctx):
        if name in ("LD_LIBRARY_PATH", "PATH"):
            continue
        assert "=" not in name, f"a value on the command line: {name}"
        real = name[len(alias):] if name.startswith(alias) else name
        assert name.startswith(alias) or not name.startswith("GPUVET_CTX"), name
        got[real] = cmd.env[name]
    return got


def test_mpirun_one_context_per_node_with_its_own_host_and_env() -> None:
    a = node("sim-a", host="10.0.0.1", env={"CUDA_VISIBLE_DEVICES": "0", "NCCL_HOSTID": EVIL})
    b = node("sim-b", host="10.0.0.2", env={"CUDA_VISIBLE_DEVICES": "1", "NCCL_HOSTID": "sim-b",
                                            "NCCL_DEBUG": "WARN"})
    c = node("gpu-c", env={})  # no host: the node name is the host
    argv_a = ["/work dir/a/all_reduce_perf", "-g", "1"]
    argv_b = ["/b/all_reduce_perf", "-g", "1"]
    run_env = nccltests.run_env(NcclParams(ring_only=True))
    cmd = nccltests.mpirun_command(
        [(a, argv_a, 4), (b, argv_b, 2), (c, ["/c/all_reduce_perf"], 8)], run_env, local=False)
    tokens = shlex.split(cmd)
    head, ctxs = split_contexts(tokens)

    # Open MPI's root variables go to mpirun's own environment, not to the ranks
    assert head[:4] == ["env", "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
                        "mpirun"]
    assert not any(x.startswith("OMPI_") for x in exports(tokens))
    assert "--oversubscribe" not in head
    assert head[head.index("plm_rsh_agent") + 1] == "ssh -o BatchMode=yes -o ConnectTimeout=15"

    assert len(ctxs) == 3
    for i, (ctx, (n, argv, ranks, host)) in enumerate(zip(ctxs, [
            (a, argv_a, 4, "10.0.0.1"), (b, argv_b, 2, "10.0.0.2"),
            (c, ["/c/all_reduce_perf"], 8, "gpu-c")], strict=True)):
        assert ctx[:4] == ["-np", str(ranks), "-H", f"{host}:{ranks}"]
        assert ctx[-len(argv):] == argv
        xs = exports(ctx)
        assert "LD_LIBRARY_PATH" in xs and "PATH" in xs
        want = {**run_env, **n.env}  # the node's own value wins over the run's
        assert context_env(cmd, i, ctx) == want
        assert len(xs) == len(want) + 2  # each variable exactly once
    # names whose value differs between nodes travel per context and are set by a
    # wrapper that execs the real binary; common ones are forwarded by name
    assert cmd.env["GPUVET_CTX0_NCCL_HOSTID"] == EVIL
    assert cmd.env["GPUVET_CTX1_NCCL_DEBUG"] == "WARN"
    assert cmd.env["GPUVET_CTX2_NCCL_DEBUG"] == "INFO"
    assert cmd.env["NCCL_ALGO"] == "Ring" and "NCCL_ALGO" in exports(ctxs[2])
    assert "NCCL_DEBUG" not in cmd.env and "NCCL_DEBUG" not in exports(tokens)
    assert ctxs[0][-len(argv_a) - 4:-len(argv_a)][:2] == ["sh", "-c"]
    assert not any(x.startswith(("CUDA_VISIBLE_DEVICES", "NCCL_HOSTID")) for x in exports(ctxs[2]))


def test_mpirun_keeps_every_value_off_the_command_line() -> None:
    secret = "hunter2-" + "x" * 8
    a = node("a", host="10.0.0.1", env={"HF_TOKEN": secret, "SHARED": "same-" + secret})
    b = node("b", host="10.0.0.2", env={"HF_TOKEN": secret + "-b", "SHARED": "same-" + secret})
    cmd = nccltests.mpirun_command([(a, ["bin"], 1), (b, ["bin"], 1)], {"E": "v w"},
                                   local=False)
    assert secret not in cmd and "v w" not in cmd
    assert cmd.env["SHARED"] == "same-" + secret and cmd.env["E"] == "v w"
    assert cmd.env["GPUVET_CTX0_HF_TOKEN"] == secret
    assert cmd.env["GPUVET_CTX1_HF_TOKEN"] == secret + "-b"
    with pytest.raises(UsageError, match="invalid environment variable name"):
        nccltests.mpirun_command([(node("c", env={"A;B": "1"}), ["bin"], 1)], {}, local=False)


def test_mpirun_quotes_hostile_inventory_values() -> None:
    n = node("n1", host="h;touch /tmp/pwned", env={"X": EVIL, "Y": "$(id)", "Z": "`id` 'q'"})
    cmd = nccltests.mpirun_command([(n, ["bin"], 1)], {"E": "v w"}, local=False)
    tokens = shlex.split(cmd)
    assert cmd.env == {"X": EVIL, "Y": "$(id)", "Z": "`id` 'q'", "E": "v w"}
    assert {"X", "Y", "Z", "E"} <= set(exports(tokens))
    assert "h;touch /tmp/pwned:1" in tokens
    # nothing of a value reached the command line
    assert "rm" not in cmd and "$(id)" not in cmd and "`id`" not in cmd


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs Open MPI's mpirun")
def test_mpirun_contexts_get_their_own_values_at_run_time(tmp_path: Path) -> None:
    """Real mpirun on this machine: per-node values reach their ranks, names only on argv."""
    from orchestrator.executors.local import LocalExecutor

    sims = [node("sim-a", env={"CUDA_VISIBLE_DEVICES": "0", "TOKEN": "t-a; $(x)"}),
            node("sim-b", env={"CUDA_VISIBLE_DEVICES": "1", "TOKEN": "t-b"})]
    # each rank writes its own file: two ranks printing at once interleave on one line
    probe = [sys.executable, "-c", "import os; e = os.environ; r = e['OMPI_COMM_WORLD_RANK']; "
             f"open(os.path.join({str(tmp_path)!r}, 'rank' + r), 'w').write(' '.join(["
             "r, e['CUDA_VISIBLE_DEVICES'], e['TOKEN'], e['NCCL_DEBUG'], "
             "e.get('GPUVET_CTX0_TOKEN', '-')]))"]
    cmd = nccltests.mpirun_command([(n, probe, 1) for n in sims], nccltests.RUN_ENV, local=True)
    head = sims[0].model_copy(update={"executor": "local", "work_dir": str(tmp_path),
                                      "env": {}})
    res = LocalExecutor(head).run(cmd, timeout=120)
    assert res.ok, res.stdout + res.stderr
    rows = sorted(p.read_text() for p in tmp_path.glob("rank*"))
    assert rows == ["0 0 t-a; $(x) INFO -", "1 1 t-b INFO -"], res.stdout + res.stderr


def test_mpirun_local_uses_localhost_and_oversubscribe() -> None:
    a = node("sim-a", host="10.9.9.9", env={"CUDA_VISIBLE_DEVICES": "0"})
    b = node("sim-b", env={"CUDA_VISIBLE_DEVICES": "1"})
    tokens = shlex.split(nccltests.mpirun_command([(a, ["x"], 1), (b, ["y"], 1)], {}, local=True))
    head, ctxs = split_contexts(tokens)
    assert "--oversubscribe" in head
    assert [c[3] for c in ctxs] == ["localhost:1", "localhost:1"]
    assert "10.9.9.9:1" not in tokens


# --- build_args, torch ----------------------------------------------------------

def test_build_args_archive_or_url() -> None:
    n = node("n1", host="h", work_dir="/scratch/gv/")
    params = NcclParams(build_timeout_s=600)
    with_archive = nccltests.build_args(n, params, "/scratch/gv/cache/src.tar.gz")
    o = dict(zip(with_archive[1::2], with_archive[2::2], strict=True))
    assert with_archive[0] == "nccl-build"
    assert o["--cache"] == "/scratch/gv/cache"
    assert o["--commit"] == params.source.commit
    assert o["--timeout"] == "600.0"
    assert o["--archive"] == "/scratch/gv/cache/src.tar.gz"
    assert "--url" not in with_archive

    with_url = nccltests.build_args(n, params, None)
    assert "--archive" not in with_url
    assert with_url[with_url.index("--url") + 1] == params.source.url


def test_torch_bench_args_and_launcher() -> None:
    args = nccltests.torch_bench_args(PARAMS)
    assert args[0] == "allreduce-bench"
    assert dict(zip(args[1::2], args[2::2], strict=True)) == {
        "-b": "1K", "-e": "2G", "-f": "4", "-n": "17", "-w": "3", "-c": "0",
        "--pg-timeout": f"{PARAMS.timeout_s:g}"}  # a hung collective ends at the suite's bound
    launch = nccltests.torchrun_launcher(2, 1, 8, "10.0.0.1", 29501)
    assert launch[:2] == ["-m", "torch.distributed.run"]
    assert dict(zip(launch[2::2], launch[3::2], strict=True)) == {
        "--nnodes": "2", "--node-rank": "1", "--nproc-per-node": "8",
        "--master-addr": "10.0.0.1", "--master-port": "29501"}


# --- source_archive -------------------------------------------------------------

def git(repo: Path, *args: str) -> str:
    res = subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                          "-c", "commit.gpgsign=false", *args],
                         capture_output=True, text=True, check=True)
    return res.stdout.strip()


@pytest.fixture
def tiny_repo(tmp_path: Path) -> tuple[Path, str]:
    repo = tmp_path / "nccl-tests"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "Makefile").write_text("all:\n\ttrue\n")
    (repo / "src").mkdir()
    (repo / "src" / "all_reduce.cu").write_text("// test\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "one")
    return repo, git(repo, "rev-parse", "HEAD")


def params_for(local: Path | str | None, commit: str = "a" * 40) -> NcclParams:
    return NcclParams(source=NcclTestsSource(local_path=str(local) if local else None,
                                             commit=commit))


def test_source_archive_none_without_local_path(tmp_path: Path) -> None:
    assert nccltests.source_archive(params_for(None), tmp_path) is None


def test_source_archive_file_is_returned_as_is(tmp_path: Path) -> None:
    f = tmp_path / "given.tar.gz"
    f.write_bytes(b"whatever")
    assert nccltests.source_archive(params_for(f), tmp_path / "staging") == f
    assert not (tmp_path / "staging").exists()


def test_source_archive_past_the_input_limit_is_refused_unread(tmp_path: Path) -> None:
    """The archive is hashed and pushed whole: a file of 64 MiB and more is something else."""
    from orchestrator.files import MAX_INPUT_BYTES

    f = tmp_path / "given.tar.gz"
    with f.open("wb") as out:
        out.truncate(MAX_INPUT_BYTES + 1)
    with pytest.raises(UsageError, match=f"{f} is {MAX_INPUT_BYTES + 1:,} bytes, more than the "
                                         "64 MiB limit"):
        nccltests.source_archive(params_for(f), tmp_path / "staging")


def test_source_archive_rejects_plain_directory(tmp_path: Path) -> None:
    d = tmp_path / "not-git"
    d.mkdir()
    with pytest.raises(UsageError, match="neither an archive nor a git checkout"):
        nccltests.source_archive(params_for(d), tmp_path / "staging")


def test_source_archive_of_a_git_checkout_records_the_commit(
        tmp_path: Path, tiny_repo: tuple[Path, str]) -> None:
    repo, commit = tiny_repo
    staging = tmp_path / "staging"
    out = nccltests.source_archive(params_for(repo, commit), staging)
    assert out is not None and out.is_file() and out.parent == staging
    assert archive_commit(str(out)) == commit
    with tarfile.open(out, "r:gz") as tar:
        names = tar.getnames()
    assert f"nccl-tests-{commit[:12]}/src/all_reduce.cu" in names
    assert all(n.startswith(f"nccl-tests-{commit[:12]}") for n in names)
    # a second call in the same staging folder reuses the archive
    assert nccltests.source_archive(params_for(repo, commit), staging) == out


def test_source_archive_unknown_commit_raises_with_hint(
        tmp_path: Path, tiny_repo: tuple[Path, str]) -> None:
    repo, _ = tiny_repo
    staging = tmp_path / "staging"
    with pytest.raises(UsageError) as err:
        nccltests.source_archive(params_for(repo, "0" * 40), staging)
    assert "git archive" in err.value.what
    assert err.value.hint and "git fetch" in err.value.hint
    # no half-made archive is left behind for a later call to pick up
    assert list(staging.glob("*.tar.gz")) == []


def test_mpirun_simulated_nodes_pin_their_one_visible_gpu() -> None:
    sims = [node("sim-a", env={"CUDA_VISIBLE_DEVICES": "0", "NCCL_HOSTID": "sim-a"}),
            node("sim-b", env={"CUDA_VISIBLE_DEVICES": "1", "NCCL_HOSTID": "sim-b"})]
    cmd = nccltests.mpirun_command([(n, ["bin"], 1) for n in sims], {}, local=True)
    _, ctxs = split_contexts(shlex.split(cmd))
    for i, (ctx, sim) in enumerate(zip(ctxs, sims, strict=True)):
        assert context_env(cmd, i, ctx)["NCCL_TESTS_DEVICE"] == "0"
        assert context_env(cmd, i, ctx)["NCCL_HOSTID"] == sim.name
    # over SSH every node is its own host: nccl-tests' local-rank mapping is right there
    cmd = nccltests.mpirun_command([(n, ["bin"], 1) for n in sims], {}, local=False)
    assert "NCCL_TESTS_DEVICE" not in cmd
    with pytest.raises(UsageError, match="one GPU per node"):
        nccltests.mpirun_command([(sims[0], ["bin"], 2)], {}, local=True)


def test_mpirun_ssh_agent_uses_the_inventory_port() -> None:
    a = node("a", host="10.0.0.1").model_copy(update={"port": 2222})
    b = node("b", host="10.0.0.2").model_copy(update={"port": 2222})
    tokens = shlex.split(nccltests.mpirun_command([(a, ["x"], 1), (b, ["x"], 1)], {},
                                                  local=False))
    agent = tokens[tokens.index("plm_rsh_agent") + 1]
    assert agent.endswith(" -p 2222") and "BatchMode=yes" in agent
    c = node("c", host="10.0.0.3")
    with pytest.raises(UsageError, match="different SSH ports"):
        nccltests.mpirun_command([(a, ["x"], 1), (c, ["x"], 1)], {}, local=False)
    plain = nccltests.mpirun_command([(c, ["x"], 1)], {}, local=False)
    assert " -p " not in plain


def test_a_failed_torch_benchmark_is_named_by_the_exception_a_rank_died_of() -> None:
    from orchestrator.steps.nccl.torchbench import bench_failure_cause

    stderr = """[W1206 11:32:02.415 socket.cpp:494] [c10d] waitForInput: socket timed out after 5000ms
Traceback (most recent call last):
  File "/x/payload/allreduce.py", line 210, in main
torch.distributed.DistStoreError: wait timeout after 5000ms, keys: /default_pg/0//cpu/0
E1206 11:32:03.1 torch/distributed/elastic/multiprocessing/api.py:882] failed (exitcode: 1)
Traceback (most recent call last):
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
  error_file: <N/A>
"""
    assert bench_failure_cause(stderr) == (
        "DistStoreError: wait timeout after 5000ms, keys: /default_pg/0//cpu/0")
    gloo = "RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]:1"
    assert bench_failure_cause("noise\n" + gloo + "\n") == gloo
    assert bench_failure_cause("exit 1, nothing said\n") is None
