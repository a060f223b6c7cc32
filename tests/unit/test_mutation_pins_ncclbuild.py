"""payload.ncclbuild past the early exits: what is compiled, how, and when a build is reused.

A reused build that was compiled for another GPU architecture, CUDA, NCCL or
MPI is the worst outcome: it runs, and its numbers are wrong or it fails with a
message about the GPU. The node's commands are scripted here (nvcc --version,
nvidia-smi, make, the binary's -h); everything else is ncclbuild's own code.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from payload import ncclbuild

COMMIT = "c" * 40
HELP = "USAGE: all_reduce_perf\n\t[-b,--minbytes <min size in bytes>]\n\t[-J,--output_file <file>]\n" \
       "\t[-T,--timeout <time in seconds>]\n\t[-e,--maxbytes <max size in bytes>]\n"


class FakeNode:
    """The commands a build runs, answered as a node with this toolchain would."""

    def __init__(self, caps: tuple[str, ...] = ("9.0",), cuda: str = "12.4") -> None:
        self.caps = caps
        self.cuda = cuda
        self.make_rc = 0
        self.make_output = ""
        self.make_writes_binary = True
        self.make_timed_out = False
        self.calls: list[list[str]] = []
        self.how: list[tuple[str, float, int, str | None]] = []  # argv[0], timeout, cap, marker
        self.make_env: dict[str, str] = {}
        self.nvcc_output: str | None = None

    def run_command(self, argv: list[str], timeout: float, cap: int = 0,
                    env: dict[str, str] | None = None) -> dict[str, Any]:
        self.calls.append(list(argv))
        self.how.append((os.path.basename(argv[0]), timeout, cap,
                         None if env is None else env.get("GPUVET_NODE_ENV")))
        out, rc, timed_out = "", 0, False
        if argv[0].endswith("nvcc") and argv[1:] == ["--version"]:
            out = self.nvcc_output if self.nvcc_output is not None else \
                f"Cuda compilation tools, release {self.cuda}, V{self.cuda}.131\n"
        elif argv == ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"]:
            out = "".join(c + "\n" for c in self.caps)
        elif argv[:2] == ["nvidia-smi", "-L"]:
            out = "".join(f"GPU {i}: NVIDIA H200 (UUID: GPU-{i})\n" for i in range(len(self.caps)))
        elif argv[0] == "make":
            self.make_env = dict(env or {})
            build_dir = next(a.split("=", 1)[1] for a in argv if a.startswith("BUILDDIR="))
            if self.make_writes_binary:
                os.makedirs(build_dir, exist_ok=True)
                Path(build_dir, ncclbuild.BINARY).write_text("binary\n")
            out, rc, timed_out = self.make_output, self.make_rc, self.make_timed_out
            if timed_out:
                rc = None  # type: ignore[assignment]
        elif argv[-1] == "-h":
            out = HELP
        else:
            raise AssertionError(f"unexpected command {argv}")
        return {"argv": argv, "rc": rc, "stdout": out, "stderr": "", "timed_out": timed_out}

    def makes(self) -> list[list[str]]:
        return [c for c in self.calls if c[0] == "make"]


@pytest.fixture
def node(monkeypatch: pytest.MonkeyPatch) -> FakeNode:
    fake = FakeNode()
    monkeypatch.setattr(ncclbuild, "run_command", fake.run_command)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("GPUVET_NODE_ENV", "the node's")

    def fetch(src: str, commit: str, url: str | None, archive: str | None, log: list[str],
              env: dict[str, str]) -> str:
        assert url == "https://nccl-tests.invalid/x.git" and archive is None
        assert env["GPUVET_NODE_ENV"] == "the node's"
        log.append("$ git clone (scripted)")
        os.makedirs(src, exist_ok=True)
        return commit

    monkeypatch.setattr(ncclbuild, "fetch_source", fetch)
    return fake


def args(tmp_path: Path, *extra: str, commit: str = COMMIT) -> argparse.Namespace:
    cuda = tmp_path / "cuda"
    (cuda / "bin").mkdir(parents=True, exist_ok=True)
    nccl = tmp_path / "nccl"
    nccl.mkdir(exist_ok=True)
    p = argparse.ArgumentParser()
    ncclbuild.add_arguments(p)
    return p.parse_args(["--cache", str(tmp_path / "cache"), "--commit", commit,
                         "--url", "https://nccl-tests.invalid/x.git", "--cuda-home", str(cuda),
                         "--nccl-home", str(nccl), "--no-mpi", "--jobs", "3", "--timeout", "60",
                         *extra])


def test_a_build_for_one_gpu_architecture_is_not_reused_for_another(tmp_path: Path,
                                                                    node: FakeNode) -> None:
    """An sm_80 build (A100) in a shared cache must not be run on sm_90 (H100/H200)."""
    node.caps = ("8.0",)
    a100 = ncclbuild.build(args(tmp_path))
    assert a100["ok"] and not a100["cached"]
    assert a100["gencode"] == "-gencode=arch=compute_80,code=sm_80"
    node.caps = ("9.0",)
    h200 = ncclbuild.build(args(tmp_path))
    assert h200["ok"] and not h200["cached"]
    assert h200["cache_key"] != a100["cache_key"]
    assert h200["build_dir"] != a100["build_dir"]
    assert [m[-1] for m in node.makes()] == ["NVCC_GENCODE=-gencode=arch=compute_80,code=sm_80",
                                             "NVCC_GENCODE=-gencode=arch=compute_90,code=sm_90"]
    # an explicit --gencode counts the same as a detected one
    explicit = ncclbuild.build(args(tmp_path, "--gencode=-gencode=arch=compute_80,code=sm_80"))
    assert explicit["cached"] and explicit["cache_key"] == a100["cache_key"]
    assert len(node.makes()) == 2


def test_mixed_gpus_build_for_every_architecture_once(tmp_path: Path, node: FakeNode) -> None:
    node.caps = ("9.0", "8.0", "9.0", "not a number")
    doc = ncclbuild.build(args(tmp_path))
    assert doc["gencode"] == ("-gencode=arch=compute_80,code=sm_80 "
                              "-gencode=arch=compute_90,code=sm_90")


def test_no_compute_capability_builds_without_a_gencode(tmp_path: Path, node: FakeNode) -> None:
    """nvcc's default architectures, rather than a guess."""
    node.caps = ()
    doc = ncclbuild.build(args(tmp_path))
    assert doc["ok"] and doc["gencode"] is None
    assert not any(a.startswith("NVCC_GENCODE") for a in node.makes()[0])


@pytest.mark.parametrize("change", ["cuda", "commit", "nccl_home", "nccl_version", "mpi_home"])
def test_cache_key_follows_every_part_of_the_toolchain(tmp_path: Path, node: FakeNode,
                                                       change: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    first = ncclbuild.build(args(tmp_path))
    again = ncclbuild.build(args(tmp_path))
    assert again["cached"] and again["cache_key"] == first["cache_key"]
    extra: list[str] = []
    commit = COMMIT
    if change == "cuda":
        node.cuda = "12.8"
    elif change == "commit":
        commit = "d" * 40
    elif change == "nccl_home":
        other = tmp_path / "nccl-2.21"
        other.mkdir()
        extra = ["--nccl-home", str(other)]
    elif change == "nccl_version":  # the same folder, upgraded in place
        monkeypatch.setattr(ncclbuild, "nccl_home_for", lambda cache, env, explicit: {
            "home": explicit, "version": "2.23.4", "source": "explicit"})
    else:
        extra = ["--mpi-home", "/opt/openmpi"]
    a = args(tmp_path, *extra, commit=commit)
    if change == "mpi_home":
        a.no_mpi = False
    other_doc = ncclbuild.build(a)
    assert not other_doc["cached"]
    assert other_doc["cache_key"] != first["cache_key"]
    assert len(node.makes()) == 2


def test_make_line_and_runpath(tmp_path: Path, node: FakeNode) -> None:
    a = args(tmp_path, "--mpi-home", "/opt/openmpi")
    a.no_mpi = False
    doc = ncclbuild.build(a)
    (make,) = node.makes()
    cache = tmp_path / "cache"
    assert make[:3] == ["make", "-j3", "-C"]
    assert make[3] == str(cache / f"src-{COMMIT}")
    assert make[4] == "BUILDDIR=" + doc["build_dir"]
    assert Path(doc["build_dir"]) == cache / f"nccl-tests-{COMMIT[:12]}-{doc['cache_key']}" / "build"
    assert len(doc["cache_key"]) == 12
    assert make[5:] == [f"CUDA_HOME={tmp_path / 'cuda'}", f"NCCL_HOME={tmp_path / 'nccl'}",
                        "MPI=1", "MPI_HOME=/opt/openmpi",
                        "NVCC_GENCODE=-gencode=arch=compute_90,code=sm_90"]
    assert doc["make"] == make and doc["mpi"] is True and doc["mpi_home"] == "/opt/openmpi"
    # the binary finds libnccl through its RUNPATH, under mpirun too
    assert node.make_env["LD_RUN_PATH"] == str(tmp_path / "nccl" / "lib") == doc["rpath"]
    assert doc["cuda_version"] == "12.4" and doc["built_commit"] == COMMIT
    assert doc["binary"] == os.path.join(doc["build_dir"], ncclbuild.BINARY)
    assert doc["log"] == os.path.join(Path(doc["build_dir"]).parent, "build.log")
    assert Path(doc["log"]).read_text() == "$ git clone (scripted)\n$ " + " ".join(make) + "\n\n"
    assert doc["nvcc"] == str(tmp_path / "cuda" / "bin" / "nvcc")
    assert doc["cuda_home"] == str(tmp_path / "cuda")


def test_without_mpi_or_nccl_home_the_make_line_says_neither(tmp_path: Path, node: FakeNode,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """NCCL from /usr: no NCCL_HOME, no runpath; --no-mpi: no MPI=1."""
    monkeypatch.setattr(ncclbuild, "nccl_home_for", lambda cache, env, explicit: {
        "home": None, "version": "2.21.5", "source": "system", "header": "/usr/include/nccl.h"})
    a = args(tmp_path)
    doc = ncclbuild.build(a)
    (make,) = node.makes()
    assert not any(x.startswith(("NCCL_HOME", "MPI")) for x in make)
    assert "LD_RUN_PATH" not in node.make_env and doc["rpath"] is None
    assert doc["mpi"] is False and doc["mpi_home"] is None


def test_a_finished_build_is_recorded_and_reused_with_todays_gpu_count(
        tmp_path: Path, node: FakeNode, monkeypatch: pytest.MonkeyPatch) -> None:
    first = ncclbuild.build(args(tmp_path))
    assert first["flags"] == ["-J", "-T", "-b", "-e"]
    assert first["gpus"] == 1
    assert first["diagnosis"] is None and first["tool"] == "gpuvet-nccl-build"
    assert first["requested_commit"] == COMMIT
    recorded = json.loads((Path(first["build_dir"]).parent / "build.json").read_text())
    assert recorded == json.loads(json.dumps(first))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")
    again = ncclbuild.build(args(tmp_path))
    assert again["cached"] is True and again["gpus"] == 3
    assert {k: v for k, v in again.items() if k not in ("cached", "gpus")} == \
        {k: v for k, v in recorded.items() if k not in ("cached", "gpus")}
    # the binary gone (a cleaned cache) means building again, not trusting build.json
    os.remove(first["binary"])
    third = ncclbuild.build(args(tmp_path))
    assert third["cached"] is False and len(node.makes()) == 2


def test_failed_builds_say_why_and_are_not_recorded(tmp_path: Path, node: FakeNode) -> None:
    node.make_rc, node.make_writes_binary = 2, False
    node.make_output = "src/common.h:9:10: fatal error: nccl.h: No such file or directory\n"
    doc = ncclbuild.build(args(tmp_path))
    assert doc["ok"] is False and doc["diagnosis"].startswith("nccl.h not found")
    build_json = Path(doc["build_dir"]).parent / "build.json"
    assert not build_json.exists()
    assert "nccl.h: No such file" in Path(doc["log"]).read_text()
    node.make_output = "something else\n"
    doc = ncclbuild.build(args(tmp_path))
    assert doc["diagnosis"] == f"make failed (rc=2); see {doc['log']}"
    # rc 0 without the binary is a failure too
    node.make_rc = 0
    doc = ncclbuild.build(args(tmp_path))
    assert doc["ok"] is False and doc["diagnosis"] == f"make failed (rc=0); see {doc['log']}"
    node.make_timed_out = True
    doc = ncclbuild.build(args(tmp_path))
    assert doc["diagnosis"] == "build timed out after 60 s"
    assert not build_json.exists()
    assert len(node.makes()) == 4


def test_no_nccl_anywhere_stops_before_fetching(tmp_path: Path, node: FakeNode,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ncclbuild, "nccl_home_for", lambda cache, env, explicit: {
        "home": None, "version": None, "source": None})
    doc = ncclbuild.build(args(tmp_path))
    assert doc["ok"] is False and doc["diagnosis"] == (
        "NCCL not found (looked in /usr/include, /usr/local/cuda/include, $NCCL_HOME and pip's "
        "nvidia-nccl): install libnccl-dev or pip install nvidia-nccl-cu12")
    assert not node.makes() and "cache_key" not in doc


def test_every_node_command_has_a_timeout_and_the_nodes_environment(
        tmp_path: Path, node: FakeNode) -> None:
    """A hung nvidia-smi or make must not hang the node's payload; and the node's own
    environment (PATH, CUDA_HOME, ...) is what every command sees."""
    ncclbuild.build(args(tmp_path))
    assert node.how == [("nvidia-smi", 30.0, 0, "the node's"),  # compute capability
                        ("nvcc", 60.0, 0, "the node's"),
                        ("nvidia-smi", 30.0, 0, "the node's"),  # GPUs visible
                        ("make", 60.0, 8 << 20, "the node's"),
                        (ncclbuild.BINARY, 60.0, 0, "the node's")]


def test_build_time_is_measured_around_make(tmp_path: Path, node: FakeNode,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([1000.0, 1012.34])
    monkeypatch.setattr(ncclbuild, "time", type("Clock", (), {"time": staticmethod(lambda: next(clock))}))
    assert ncclbuild.build(args(tmp_path))["build_s"] == 12.3


def test_an_nvcc_without_a_release_line_leaves_the_version_unknown(tmp_path: Path,
                                                                   node: FakeNode) -> None:
    node.nvcc_output = "nvcc: wrapper script, no version here\n"
    doc = ncclbuild.build(args(tmp_path))
    assert doc["cuda_version"] is None


def test_a_source_that_cannot_be_fetched_is_the_diagnosis(tmp_path: Path, node: FakeNode,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(src: str, commit: str, url: str | None, archive: str | None, log: list[str],
             env: dict[str, str]) -> str:
        log.append("$ git clone x\nfatal: unable to access")
        log.append("second line")
        raise ValueError("`git clone --quiet --no-checkout` failed (rc=128): unable to access")

    monkeypatch.setattr(ncclbuild, "fetch_source", fail)
    doc = ncclbuild.build(args(tmp_path))
    assert doc["diagnosis"] == ("could not get nccl-tests source: `git clone --quiet --no-checkout` "
                                "failed (rc=128): unable to access")
    assert Path(doc["log"]).read_text() == "$ git clone x\nfatal: unable to access\nsecond line"
    assert not node.makes()


def test_a_diagnosis_reads_the_whole_log_line_by_line(tmp_path: Path, node: FakeNode) -> None:
    """The compiler error is on a line of its own, after the make line."""
    node.make_rc, node.make_writes_binary = 2, False
    node.make_output = "nvcc fatal   : Unsupported gpu architecture 'compute_100'"
    doc = ncclbuild.build(args(tmp_path))
    assert doc["diagnosis"].startswith("nvcc does not know this GPU architecture")


def test_nccl_from_the_system_or_a_prefix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict[str, str]] = []

    def find(headers: list[dict[str, Any]], pip: list[dict[str, Any]]) -> Any:
        def find_nccl(env: dict[str, str]) -> dict[str, Any]:
            seen.append(env)
            return {"headers": headers, "pip": pip}
        return find_nccl

    env = {"NCCL_HOME": "/opt/nccl"}
    usr = {"exists": True, "path": "/usr/include/nccl.h", "version": "2.21.5"}
    monkeypatch.setattr(ncclbuild, "find_nccl", find([{"exists": False, "path": "/x/include/nccl.h",
                                                       "version": None}, usr], []))
    assert ncclbuild.nccl_home_for(str(tmp_path), env, None) == {
        "home": None, "version": "2.21.5", "source": "system", "header": "/usr/include/nccl.h"}
    assert seen == [env]
    opt = {"exists": True, "path": "/opt/nccl/include/nccl.h", "version": "2.23.4"}
    monkeypatch.setattr(ncclbuild, "find_nccl", find([opt], []))
    assert ncclbuild.nccl_home_for(str(tmp_path), env, None)["home"] == "/opt/nccl"
    # a pip wheel without its header, or without libnccl.so.2, cannot be built against
    half = [{"header": "/site/nvidia/nccl/include/nccl.h", "so2": None, "root": "/site",
             "lib_dir": "/site/nvidia/nccl/lib", "header_version": "2.21.5"},
            {"header": None, "so2": "/site2/libnccl.so.2", "root": "/site2",
             "lib_dir": "/site2", "header_version": None}]
    monkeypatch.setattr(ncclbuild, "find_nccl", find([], half))
    assert ncclbuild.nccl_home_for(str(tmp_path), env, None) == {
        "home": None, "version": None, "source": None}
    assert not list(tmp_path.iterdir())


def test_nccl_lib_dir_prefers_the_wheels_own_folder() -> None:
    assert ncclbuild.nccl_lib_dir({"lib_dir": "/site/nvidia/nccl/lib", "home": "/shim"}) == \
        "/site/nvidia/nccl/lib"
    assert ncclbuild.nccl_lib_dir({"home": "/opt/nccl", "lib_dir": None}) == "/opt/nccl/lib"
    assert ncclbuild.nccl_lib_dir({"home": None}) is None


def test_cuda_home_is_where_the_runtime_header_is(tmp_path: Path) -> None:
    real = tmp_path / "cuda-12.4"
    (real / "bin").mkdir(parents=True)
    (real / "include").mkdir()
    (real / "include" / "cuda_runtime.h").write_text("")
    (real / "bin" / "nvcc").write_text("")
    link = tmp_path / "bin"
    link.mkdir()
    (link / "nvcc").symlink_to(real / "bin" / "nvcc")
    # nvcc reached through a symlink: its real folder's parent
    assert ncclbuild.find_cuda_home(str(link / "nvcc"), {}) == str(real)
    # a wrapper script without a toolkit around it: CUDA_HOME says where
    wrapper = tmp_path / "wrap" / "bin"
    wrapper.mkdir(parents=True)
    (wrapper / "nvcc").write_text("")
    assert ncclbuild.find_cuda_home(str(wrapper / "nvcc"), {"CUDA_HOME": str(real)}) == str(real)
    if not os.path.isfile("/usr/local/cuda/include/cuda_runtime.h"):
        # nothing found: nvcc's own root is the best guess, and no nvcc is no CUDA
        assert ncclbuild.find_cuda_home(str(wrapper / "nvcc"), {"CUDA_HOME": str(tmp_path)}) == \
            str(tmp_path / "wrap")
        assert ncclbuild.find_cuda_home(None, {"CUDA_HOME": str(tmp_path)}) is None
        assert ncclbuild.find_cuda_home(None, {}) is None


def test_mpi_needs_both_the_header_and_mpirun(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict[str, str]] = []

    def find(mpi_h: list[str], mpirun: str | None) -> Any:
        def find_mpi(env: dict[str, str]) -> dict[str, Any]:
            seen.append(env)
            return {"mpi_h": mpi_h, "mpirun": mpirun}
        return find_mpi

    env = {"PATH": "/opt/openmpi/bin"}
    header = "/usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h"
    monkeypatch.setattr(ncclbuild, "find_mpi", find([header], None))
    assert ncclbuild.mpi_home_for(None, env) is None
    monkeypatch.setattr(ncclbuild, "find_mpi", find([], "/usr/bin/mpirun"))
    assert ncclbuild.mpi_home_for(None, env) is None
    assert seen == [env, env]


def test_visible_gpus_from_nvidia_smi(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[list[str], float, dict[str, str] | None]] = []

    def smi(rc: int, out: str) -> Any:
        def run(argv: list[str], timeout: float, env: dict[str, str] | None = None) -> dict[str, Any]:
            calls.append((argv, timeout, env))
            return {"rc": rc, "stdout": out}
        return run

    env = {"PATH": "/usr/bin"}
    monkeypatch.setattr(ncclbuild, "run_command", smi(0, "GPU 0: H200 (UUID: a)\n  MIG 1g.18gb\n"
                                                        "GPU 1: H200 (UUID: b)\n"))
    assert ncclbuild.visible_gpus(env) == 2
    monkeypatch.setattr(ncclbuild, "run_command", smi(9, "GPU 0: H200 (UUID: a)\n"))
    assert ncclbuild.visible_gpus(env) is None
    assert calls[0] == (["nvidia-smi", "-L"], 30.0, env)


def test_command_line_requires_cache_commit_and_one_source() -> None:
    p = argparse.ArgumentParser()
    ncclbuild.add_arguments(p)
    for argv in (["--commit", COMMIT, "--url", "u"], ["--cache", "c", "--url", "u"],
                 ["--cache", "c", "--commit", COMMIT],
                 ["--cache", "c", "--commit", COMMIT, "--url", "u", "--archive", "a"]):
        with pytest.raises(SystemExit):
            p.parse_args(argv)
    a = p.parse_args(["--cache", "c", "--commit", COMMIT, "--archive", "a.tgz"])
    assert (a.archive, a.url, a.no_mpi, a.gencode) == ("a.tgz", None, False, None)
    assert a.jobs == (os.cpu_count() or 4) and a.timeout == 1800.0


def test_main_prints_the_document_and_exits_by_its_outcome(
        tmp_path: Path, node: FakeNode, capsys: pytest.CaptureFixture[str]) -> None:
    assert ncclbuild.main(args(tmp_path)) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is True and doc["binary"].endswith(ncclbuild.BINARY)
    node.make_rc, node.make_writes_binary = 2, False
    assert ncclbuild.main(args(tmp_path, "--gencode=-gencode=arch=compute_80,code=sm_80")) == 1
    out = capsys.readouterr().out
    assert out.endswith("}\n") and json.loads(out)["ok"] is False


def test_discovery_reads_the_nodes_environment(tmp_path: Path, node: FakeNode,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Without --cuda-home, --nccl-home or --mpi-home everything is found from the node's
    own environment, and NCCL's shim goes into the build cache."""
    seen: dict[str, Any] = {}
    cuda = tmp_path / "cuda"

    def find_nvcc(env: dict[str, str]) -> str:
        seen["nvcc"] = env.get("GPUVET_NODE_ENV")
        return str(cuda / "bin" / "nvcc")

    def find_cuda_home(nvcc: str | None, env: dict[str, str]) -> str:
        seen["cuda"] = (nvcc, env.get("GPUVET_NODE_ENV"))
        return str(cuda)

    def nccl_home_for(cache: str, env: dict[str, str], explicit: str | None) -> dict[str, Any]:
        seen["nccl"] = (cache, env.get("GPUVET_NODE_ENV"), explicit)
        return {"home": None, "version": "2.21.5", "source": "system"}

    def mpi_home_for(explicit: str | None, env: dict[str, str]) -> str:
        seen["mpi"] = (explicit, env.get("GPUVET_NODE_ENV"))
        return "/usr/lib/x86_64-linux-gnu/openmpi"

    for name, fn in (("find_nvcc", find_nvcc), ("find_cuda_home", find_cuda_home),
                     ("nccl_home_for", nccl_home_for), ("mpi_home_for", mpi_home_for)):
        monkeypatch.setattr(ncclbuild, name, fn)
    p = argparse.ArgumentParser()
    ncclbuild.add_arguments(p)
    doc = ncclbuild.build(p.parse_args(["--cache", str(tmp_path / "cache"), "--commit", COMMIT,
                                        "--url", "https://nccl-tests.invalid/x.git"]))
    assert doc["ok"] and doc["nvcc"] == str(cuda / "bin" / "nvcc")
    assert seen == {"nvcc": "the node's", "cuda": (str(cuda / "bin" / "nvcc"), "the node's"),
                    "nccl": (str(tmp_path / "cache"), "the node's", None),
                    "mpi": (None, "the node's")}
    assert doc["mpi_home"] == "/usr/lib/x86_64-linux-gnu/openmpi"


def test_cuda_home_falls_back_to_usr_local_cuda_then_to_nvccs_root(
        monkeypatch: pytest.MonkeyPatch) -> None:
    present: set[str] = set()
    monkeypatch.setattr(ncclbuild.os.path, "isfile", lambda p: p in present)
    monkeypatch.setattr(ncclbuild.os.path, "realpath", lambda p: p)
    present.add("/usr/local/cuda/include/cuda_runtime.h")
    assert ncclbuild.find_cuda_home("/wrap/bin/nvcc", {}) == "/usr/local/cuda"
    assert ncclbuild.find_cuda_home(None, {}) == "/usr/local/cuda"
    present.clear()
    assert ncclbuild.find_cuda_home("/wrap/bin/nvcc", {"CUDA_HOME": "/opt/cuda"}) == "/wrap"
    assert ncclbuild.find_cuda_home(None, {"CUDA_HOME": "/opt/cuda"}) is None


def test_pip_nccl_gets_a_shim_folder_named_after_the_wheel(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    lib = tmp_path / "site" / "nvidia" / "nccl" / "lib"
    lib.mkdir(parents=True)
    (lib / "libnccl.so.2").write_text("")
    inc = tmp_path / "site" / "nvidia" / "nccl" / "include"
    inc.mkdir()
    (inc / "nccl.h").write_text("")
    root = str(tmp_path / "site")
    monkeypatch.setattr(ncclbuild, "find_nccl", lambda env: {"headers": [], "pip": [
        {"header": str(inc / "nccl.h"), "so2": str(lib / "libnccl.so.2"), "root": root,
         "lib_dir": str(lib), "header_version": "2.21.5"}]})
    cache = tmp_path / "cache"
    got = ncclbuild.nccl_home_for(str(cache), {}, None)
    shim = cache / ("nccl-home-" + hashlib.sha256(root.encode()).hexdigest()[:8])
    assert got == {"home": str(shim), "version": "2.21.5", "source": "pip",
                   "header": str(inc / "nccl.h"), "lib_dir": str(lib)}
    assert (shim / "include").resolve() == inc
    assert (shim / "lib" / "libnccl.so").resolve() == lib / "libnccl.so.2"
