"""payload.ncclbuild: diagnoses, NCCL/MPI discovery, GPU count, the build's early exits."""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from payload import collect, ncclbuild

REAL_FIND_NCCL = collect.find_nccl


@pytest.mark.parametrize(("log", "expected"), [
    ("src/common.h:9:10: fatal error: nccl.h: No such file or directory\n"
     "compilation terminated.", "nccl.h not found"),
    ("/usr/bin/ld: cannot find -lnccl: No such file or directory\n"
     "collect2: error: ld returned 1 exit status", "libnccl.so not found for linking"),
    ("src/common.h:12:10: fatal error: mpi.h: No such file or directory", "mpi.h not found"),
    ("make: nvcc: not found", "nvcc not found"),
    ("/bin/sh: 1: nvcc: not found", "nvcc not found"),
    ("make[1]: /usr/local/cuda/bin/nvcc: No such file or directory", "nvcc not found"),
    ("/usr/bin/ld: cannot find -lmpi", "libmpi not found for linking"),
    ("nvcc fatal   : Unsupported gpu architecture 'compute_90'", "too old for the GPU"),
])
def test_diagnose_maps_compiler_lines(log: str, expected: str) -> None:
    diagnosis = ncclbuild.diagnose("Compiling all_reduce.cu\n" + log + "\nmake: *** Error 1\n")
    assert diagnosis is not None and expected in diagnosis


def test_diagnose_unknown_log_is_none() -> None:
    assert ncclbuild.diagnose("make: *** [Makefile:12: all] Error 2") is None
    assert ncclbuild.diagnose("") is None


# --- NCCL and MPI discovery ---------------------------------------------------

def fake_pip_nccl(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    root = site / "nvidia" / "nccl"
    (root / "include").mkdir(parents=True)
    (root / "lib").mkdir()
    (root / "include" / "nccl.h").write_text(
        "#ifndef NCCL_H_\n#define NCCL_H_\n#define NCCL_MAJOR 2\n#define NCCL_MINOR 28\n"
        "#define NCCL_PATCH 9\n#define NCCL_SUFFIX \"\"\n#endif\n")
    (root / "lib" / "libnccl.so.2").write_bytes(b"\x7fELF")
    return site


def test_nccl_home_for_pip_wheel_makes_a_shim(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    site = fake_pip_nccl(tmp_path)
    monkeypatch.setattr("sys.path", [str(site)])
    # hide any NCCL installed on the machine running the tests: only the wheel counts
    monkeypatch.setattr(ncclbuild, "find_nccl",
                        lambda env: {**REAL_FIND_NCCL(env=env), "headers": []})
    cache = tmp_path / "cache"
    cache.mkdir()
    info = ncclbuild.nccl_home_for(str(cache), {}, None)
    assert info["source"] == "pip"
    assert info["version"] == "2.28.9"
    home = Path(info["home"])
    assert home.parent == cache
    lib_so = home / "lib" / "libnccl.so"
    assert lib_so.is_symlink()
    assert Path(os.readlink(lib_so)) == site / "nvidia" / "nccl" / "lib" / "libnccl.so.2"
    assert (home / "lib" / "libnccl.so.2").resolve() == lib_so.resolve()
    assert (home / "include" / "nccl.h").is_file()
    assert "NCCL_MINOR 28" in (home / "include" / "nccl.h").read_text()
    # a second call reuses the same shim
    assert ncclbuild.nccl_home_for(str(cache), {}, None)["home"] == info["home"]


def test_nccl_home_for_explicit_and_nothing_found(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    assert ncclbuild.nccl_home_for(str(tmp_path), {}, "/opt/nccl") == {
        "home": "/opt/nccl", "version": None, "source": "explicit"}
    monkeypatch.setattr("sys.path", [str(tmp_path / "empty-site")])
    monkeypatch.setattr(ncclbuild, "find_nccl",
                        lambda env: {**REAL_FIND_NCCL(env=env), "headers": []})
    assert ncclbuild.nccl_home_for(str(tmp_path), {}, None)["source"] is None


def test_mpi_home_for(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ncclbuild.mpi_home_for("/opt/mpi", {}) == "/opt/mpi"
    monkeypatch.setattr(ncclbuild, "find_mpi", lambda env: {
        "mpi_h": ["/usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h"], "mpirun": "/usr/bin/mpirun"})
    assert ncclbuild.mpi_home_for(None, {}) == "/usr/lib/x86_64-linux-gnu/openmpi"
    monkeypatch.setattr(ncclbuild, "find_mpi", lambda env: {"mpi_h": [], "mpirun": None})
    assert ncclbuild.mpi_home_for(None, {}) is None


@pytest.mark.parametrize(("value", "count"), [("0,1", 2), ("", 0), ("-1", 0), ("3", 1),
                                              ("GPU-aa,GPU-bb,GPU-cc", 3)])
def test_visible_gpus_honours_cuda_visible_devices(value: str, count: int) -> None:
    assert ncclbuild.visible_gpus({"CUDA_VISIBLE_DEVICES": value, "PATH": ""}) == count


# --- build ----------------------------------------------------------------------

def git(repo: Path, *args: str) -> str:
    res = subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                          "-c", "commit.gpgsign=false", *args],
                         capture_output=True, text=True, check=True)
    return res.stdout.strip()


def two_commit_repo(tmp_path: Path) -> tuple[Path, str, str]:
    repo = tmp_path / "nccl-tests"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "src").mkdir()
    (repo / "src" / "a.cu").write_text("// one\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "one")
    first = git(repo, "rev-parse", "HEAD")
    (repo / "src" / "a.cu").write_text("// two\n")
    git(repo, "commit", "-q", "-am", "two")
    return repo, first, git(repo, "rev-parse", "HEAD")


def archive(repo: Path, commit: str, out: Path) -> Path:
    git(repo, "archive", "--format=tar.gz", f"--prefix=nccl-tests-{commit[:12]}/", "-o",
        str(out), commit)
    return out


def build_args(tmp_path: Path, **over: Any) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    ncclbuild.add_arguments(p)
    argv = ["--cache", str(tmp_path / "cache"), "--commit", over.pop("commit", "a" * 40),
            "--no-mpi", "--gencode=-gencode=arch=compute_90,code=sm_90", "--jobs", "1",
            "--timeout", "60"]
    if "archive" in over:
        argv += ["--archive", str(over.pop("archive"))]
    else:
        argv += ["--url", "https://nccl-tests.invalid/nccl-tests.git"]
    for key, value in over.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    return p.parse_args(argv)


def fake_cuda(tmp_path: Path) -> Path:
    home = tmp_path / "cuda"
    (home / "bin").mkdir(parents=True)
    nvcc = home / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'nvcc: NVIDIA (R) Cuda compiler driver'\n"
                    "echo 'Cuda compilation tools, release 12.4, V12.4.131'\n")
    nvcc.chmod(0o755)
    return home


def test_build_without_nvcc_stops_early_and_offline(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setattr(ncclbuild, "find_nvcc", lambda env: None)
    calls: list[list[str]] = []

    def no_commands(argv: list[str], *a: Any, **k: Any) -> dict[str, Any]:
        calls.append(list(argv))
        return {"rc": 127, "stdout": "", "stderr": "", "timed_out": False}

    def no_fetch(*a: Any, **k: Any) -> str:
        raise AssertionError("the source must not be fetched without a compiler")

    monkeypatch.setattr(ncclbuild, "run_command", no_commands)
    monkeypatch.setattr(ncclbuild, "fetch_source", no_fetch)
    doc = ncclbuild.build(build_args(tmp_path))
    assert doc["ok"] is False
    assert doc["nvcc"] is None and doc["cuda_version"] is None
    assert doc["diagnosis"] == ncclbuild.DIAGNOSES[0][1]
    assert "nvcc not found" in doc["diagnosis"]
    assert not any("git" in c[0] for c in calls)
    assert not list((tmp_path / "cache").glob("src-*"))


def test_build_rejects_an_archive_of_another_commit(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    repo, first, second = two_commit_repo(tmp_path)
    tgz = archive(repo, first, tmp_path / "src.tar.gz")
    nccl_home = tmp_path / "nccl"
    nccl_home.mkdir()
    args = build_args(tmp_path, commit=second, archive=tgz, cuda_home=fake_cuda(tmp_path),
                      nccl_home=nccl_home)
    doc = ncclbuild.build(args)
    assert doc["ok"] is False
    assert doc["cuda_version"] == "12.4"
    assert doc["nccl"]["source"] == "explicit"
    assert doc["gpus"] == 2
    assert doc["built_commit"] == first
    assert doc["diagnosis"] == f"source is at commit {first}, {second} was requested"
    assert "make" not in doc  # nothing was compiled


def test_build_after_a_wrong_archive_takes_the_right_one(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    repo, first, second = two_commit_repo(tmp_path)
    nccl_home = tmp_path / "nccl"
    nccl_home.mkdir()
    common = {"commit": second, "cuda_home": fake_cuda(tmp_path), "nccl_home": nccl_home}
    wrong = ncclbuild.build(build_args(tmp_path, archive=archive(repo, first, tmp_path / "w.tgz"),
                                       **common))
    assert "source is at commit" in wrong["diagnosis"]
    # the wrong source must not stick in the cache: the right archive gets past the check
    right = ncclbuild.build(build_args(tmp_path, archive=archive(repo, second, tmp_path / "r.tgz"),
                                       **common))
    assert right["built_commit"] == second
    assert "source is at commit" not in (right["diagnosis"] or "")
    assert "make" in right  # got as far as compiling (the tiny repo has no Makefile)
    src = tmp_path / "cache" / f"src-{second}"
    assert (src / "src" / "a.cu").read_text() == "// two\n"


def test_archive_commit_reads_git_archive_header(tmp_path: Path) -> None:
    repo, first, second = two_commit_repo(tmp_path)
    assert ncclbuild.archive_commit(str(archive(repo, first, tmp_path / "a.tgz"))) == first
    assert ncclbuild.archive_commit(str(archive(repo, second, tmp_path / "b.tgz"))) == second
    # a tree (not a commit) carries no commit id
    git(repo, "archive", "--format=tar.gz", "-o", str(tmp_path / "t.tgz"), f"{second}^{{tree}}")
    assert ncclbuild.archive_commit(str(tmp_path / "t.tgz")) is None


# --- archives: nothing lands outside the source directory -----------------------

def evil_tar(path: Path, members: list[tarfile.TarInfo], commit: str = "c" * 40) -> Path:
    """A `git archive`-like tar (commit id in the pax header) with hand-made members."""
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT,
                      pax_headers={"comment": commit}) as tar:
        for m in members:
            data = b"x\n" if m.isfile() else b""
            m.size = len(data)
            tar.addfile(m, io.BytesIO(data) if data else None)
    return path


def member(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    m = tarfile.TarInfo(name)
    m.type, m.linkname, m.mode = kind, linkname, 0o755 if kind == tarfile.DIRTYPE else 0o644
    return m


def test_build_refuses_an_archive_member_with_dotdot(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    nccl_home = tmp_path / "nccl"
    nccl_home.mkdir()
    # the source lands in <cache>/src-<commit>.tmp: ../../ is tmp_path itself
    tgz = evil_tar(tmp_path / "evil.tgz", [member("nccl-tests/src/a.cu"),
                                            member("nccl-tests/../../escape.txt")])
    doc = ncclbuild.build(build_args(tmp_path, commit="c" * 40, archive=tgz,
                                     cuda_home=fake_cuda(tmp_path), nccl_home=nccl_home))
    assert doc["ok"] is False
    assert "could not get nccl-tests source: unsafe member 'nccl-tests/../../escape.txt'" in \
        doc["diagnosis"]
    assert "'..' path" in doc["diagnosis"]
    assert not (tmp_path / "escape.txt").exists()
    assert not list(tmp_path.rglob("escape.txt"))
    assert "make" not in doc and not (tmp_path / "cache" / f"src-{'c' * 40}").exists()


@pytest.mark.parametrize(("members", "why"), [
    ([member("/etc/cron.d/x")], "absolute or '..' path"),
    ([member("a/../../x")], "absolute or '..' path"),
    ([member("etc", tarfile.SYMTYPE, "/etc"), member("etc/passwd")], "symlink to '/etc'"),
    ([member("d", tarfile.DIRTYPE), member("d/up", tarfile.SYMTYPE, "../../outside")],
     "symlink to '../../outside'"),
    ([member("passwd", tarfile.LNKTYPE, "/etc/passwd")], "hardlink to '/etc/passwd'"),
    ([member("x", tarfile.LNKTYPE, "../outside/file")], "hardlink to '../outside/file'"),
    ([member("null", tarfile.CHRTYPE)], "device, fifo"),
    # each link looks harmless on its own; together they lead out of the directory
    ([member("a", tarfile.DIRTYPE), member("a/l1", tarfile.SYMTYPE, ".."),
      member("a/l1/l2", tarfile.SYMTYPE, "..")], "symlink leads outside"),
])
def test_safe_extract_refuses_what_leaves_the_directory(tmp_path: Path,
                                                        members: list[tarfile.TarInfo],
                                                        why: str) -> None:
    dest = tmp_path / "box" / "src"
    dest.mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "file").write_text("keep\n")
    tgz = evil_tar(tmp_path / "evil.tgz", members)
    with pytest.raises(ValueError, match="unsafe member") as info:
        ncclbuild.safe_extract(str(tgz), str(dest))
    assert why in str(info.value)
    assert (tmp_path / "outside" / "file").read_text() == "keep\n"
    assert not (tmp_path / "l2").exists() and not (tmp_path / "box" / "l2").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["box", "evil.tgz", "outside"]


def test_safe_extract_keeps_links_that_stay_inside(tmp_path: Path) -> None:
    tgz = evil_tar(tmp_path / "ok.tgz", [
        member("top", tarfile.DIRTYPE), member("top/src/a.cu"),
        member("top/latest", tarfile.SYMTYPE, "src/a.cu"),
        member("top/same", tarfile.LNKTYPE, "top/src/a.cu"),
        member("top/src/up", tarfile.SYMTYPE, "../src")])
    dest = tmp_path / "dest"
    dest.mkdir()
    ncclbuild.safe_extract(str(tgz), str(dest))
    assert (dest / "top" / "latest").read_text() == "x\n"
    assert (dest / "top" / "same").read_text() == "x\n"
    assert os.readlink(dest / "top" / "latest") == "src/a.cu"
    assert (dest / "top" / "src" / "up" / "a.cu").is_file()


@pytest.mark.parametrize(("cuda", "wheel"), [("13.0", "nvidia-nccl-cu13"),
                                             ("12.8", "nvidia-nccl-cu12"),
                                             (None, "nvidia-nccl-cu<CUDA major>")])
def test_the_nccl_hint_names_the_wheel_for_the_cuda_found(cuda: str | None, wheel: str) -> None:
    log = "src/common.h:9:10: fatal error: nccl.h: No such file or directory"
    diagnosis = ncclbuild.diagnose(log, cuda)
    assert diagnosis is not None and f"pip {wheel}," in diagnosis
    assert ncclbuild.nccl_wheel(cuda) == wheel
