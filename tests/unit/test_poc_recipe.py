"""`gpuvet import poc` of the acceptance recipe's own folder, run verbatim on a one-GPU host.

tests/fixtures/recipe-h200x1 holds every file the recipe writes (README-recipe-h200x1.md):
each must be recognised, the PyTorch check judged against the order, the one-GPU
nccl-tests rounds said to be not applicable, and the clone of nccl-tests that sits
beside the logs in a real folder passed over quietly.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from orchestrator.analysis.verdict import provider_verdict
from orchestrator.records import Finding
from orchestrator.steps.poc.importer import scan
from tests.unit.clirun import CliResult, gpuvet

FIX = Path(__file__).resolve().parents[1] / "fixtures"
RECIPE = FIX / "recipe-h200x1"
ORDERS = FIX / "poc" / "orders.yaml"

EVERY_FILE = {
    "checked-at.txt": ("checked-at", "recorded"), "dmon.txt": ("dmon", "recorded"),
    "gpu-list.txt": ("nvidia-smi-L", "judged"),
    "gpus-noheader.csv": ("nvidia-smi-query-gpu-noheader", "judged"),
    "gpus.csv": ("nvidia-smi-query-gpu", "judged"), "kernel.txt": ("uname", "judged"),
    "mig-plus2.txt": ("nvidia-smi-q", "judged"), "mig.txt": ("nvidia-smi-q", "recorded"),
    "mounts.txt": ("mounts", "recorded"),
    "nccl-tests/all-reduce-1.log": ("nccl-tests", "judged"),
    "nccl-tests/all-reduce-2.log": ("nccl-tests", "judged"),
    "nccl-tests/all-reduce-3.log": ("nccl-tests", "judged"),
    "nccl-tests/commit.txt": ("commit", "recorded"),
    "nccl-tests/make-plain.log": ("nccl-tests-build", "recorded"),
    "nvcc-version.txt": ("nvcc-version", "judged"),
    "nvidia-smi-version.txt": ("nvidia-smi-version", "recorded"),
    "nvidia-smi.txt": ("nvidia-smi-table", "judged"), "p2p.txt": ("topo-p2p", "judged"),
    "topo.txt": ("topo-m", "judged"), "torch.txt": ("torch-check", "judged"),
}


def imported(capsys: pytest.CaptureFixture[str], folder: Path, results: Path,
             *args: str | Path) -> tuple[CliResult, Path, dict[str, Any], list[dict[str, Any]]]:
    proc = gpuvet(capsys, "import", "poc", folder, "--results", results, *args)
    (run_dir,) = [d for d in results.iterdir() if d.is_dir()]
    meta = json.loads((run_dir / "run.json").read_text())
    fs = [json.loads(ln) for ln in (run_dir / "findings.jsonl").read_text().splitlines()]
    return proc, run_dir, meta, fs


def one(fs: list[dict[str, Any]], code: str) -> dict[str, Any]:
    got = [f for f in fs if f["code"] == code]
    assert len(got) == 1, (code, [(f["code"], f["message"]) for f in fs])
    return got[0]


def test_every_file_the_recipe_writes_is_recognised(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    proc, run_dir, meta, fs = imported(capsys, RECIPE, tmp_path / "r", "-p", "h200-one",
                                       "-n", "vm-one", "-i", ORDERS)
    assert proc.returncode == 0, proc.output
    status = {n: (f["kind"], f["status"]) for n, f in meta["source"]["files"].items()}
    assert status == EVERY_FILE
    assert "holds only the `MIG Mode` heading" in meta["source"]["files"]["mig.txt"]["reason"]
    assert not [f for f in fs if f["severity"] in ("WARN", "FAIL")], fs
    # the recipe's central point: PyTorch sees every GPU of the order, with its memory
    torch = one(fs, "TORCH_ORDER")
    assert (torch["severity"], torch["message"]) == (
        "PASS", "PyTorch 2.11.0+cu130 sees GPU0 NVIDIA H200 139.8 GiB as ordered (1 GPU(s), "
                "H200, >= 141 GB)")
    assert torch["evidence"] == ["nodes/vm-one/preflight/raw/torch.txt"]
    assert (run_dir / torch["evidence"][0]).read_text() == (RECIPE / "torch.txt").read_text()
    assert {"GPU_COUNT", "GPU_MODEL", "GPU_MEMORY", "TORCH_SEES_GPUS"} <= {
        f["code"] for f in fs if f["severity"] == "PASS"}


def test_one_gpu_nccl_rounds_are_not_applicable(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    _, run_dir, meta, fs = imported(capsys, RECIPE, tmp_path / "r", "-p", "h200-one")
    na = one(fs, "NCCL_NOT_APPLICABLE")
    assert na["severity"] == "INFO"
    assert na["message"] == (
        "[single] one GPU (vm, NVIDIA H200): nothing to all_reduce with, busbw is 0 by "
        "definition and is not judged; algbw 1998.1 GB/s at 128 MiB (median of 3 round(s)) is "
        "the device-local copy rate, kept as such")
    assert len(na["evidence"]) == 3
    assert not {"NCCL_BUSBW", "NCCL_REFERENCE", "NCCL_REFERENCE_NONE", "NCCL_ROUND_DROP"} & {
        f["code"] for f in fs}
    ms = [json.loads(ln) for ln in (run_dir / "measurements.jsonl").read_text().splitlines()]
    assert {m["metric"] for m in ms} == {"algbw", "time"}  # no busbw of 0 to compare
    assert all(m["tags"]["local_copy"] for m in ms) and len(ms) == 300


def test_the_verdict_says_not_applicable_not_missing() -> None:
    f = Finding(run_id="r1", step="nccl", scope="provider", provider="h200-one", node=None,
                code="NCCL_NOT_APPLICABLE", severity="INFO", message="[single] one GPU",
                evidence=["providers/h200-one/nccl/x.log"])
    v = provider_verdict("h200-one", [f], pd.DataFrame(), pd.DataFrame())
    nccl = next(r for r in v.reasons if r.check == "NCCL stable over three rounds")
    assert (nccl.outcome, nccl.evidence) == ("not applicable",
                                             ("r1/providers/h200-one/nccl/x.log",))
    bare = provider_verdict("h200-one", [], pd.DataFrame(), pd.DataFrame())
    assert next(r for r in bare.reasons if r.check == nccl.check).outcome == "missing"


def test_pytorch_judged_against_an_order_it_does_not_meet(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    proc, _, _, fs = imported(capsys, RECIPE, tmp_path / "r", "-p", "a100-two", "-n", "a100-1",
                              "-i", ORDERS)
    assert proc.returncode == 1
    torch = one(fs, "TORCH_ORDER")
    assert torch["severity"] == "FAIL"
    assert torch["details"]["wrong"] == ["1 GPU(s), 2 ordered",
                                         "GPU0 is NVIDIA H200, A100-SXM4-80GB ordered"]


def _checkout(folder: Path) -> None:
    """Stand-ins for what the clone of nccl-tests leaves beside the logs."""
    nt = folder / "nccl-tests"
    (nt / ".git" / "objects" / "pack").mkdir(parents=True)
    (nt / ".git" / "HEAD").write_text("ref: refs/heads/master\n")
    (nt / ".git" / "objects" / "pack" / "pack-1.pack").write_bytes(b"PACK\x00\x00\x00\x02" * 64)
    (nt / "Makefile").write_text("# Copyright (c) 2016-2025, NVIDIA CORPORATION.\n"
                                 "BUILDDIR ?= build\n.PHONY : all clean\n\ndefault : src.build\n")
    (nt / "src").mkdir()
    (nt / "src" / "common.cu").write_text('#include "common.h"\n\nint main(int argc, char* '
                                          'argv[]) {\n  return 0;\n}\n')
    (nt / "README.md").write_text("# NCCL Tests\n\nThese tests check both the performance and "
                                  "the correctness of NCCL operations.\n")
    (nt / "build").mkdir()
    (nt / "build" / "all_reduce_perf").write_bytes(b"\x7fELF\x02\x01\x01" + b"\x00" * 200)
    (nt / "build" / "common.o").write_bytes(b"\x7fELF\x02\x01\x01" + b"\x00" * 100)


def test_the_nccl_tests_checkout_beside_the_logs_is_passed_over_quietly(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "a100-poc"
    shutil.copytree(RECIPE, folder)
    _checkout(folder)
    proc, run_dir, meta, fs = imported(capsys, folder, tmp_path / "r", "-p", "h200-one",
                                       "-n", "vm-one", "-i", ORDERS)
    assert proc.returncode == 0, proc.output
    files = meta["source"]["files"]
    skipped = sorted(n for n, f in files.items() if f["status"] == "skipped")
    assert skipped == ["nccl-tests/.git/", "nccl-tests/Makefile", "nccl-tests/README.md",
                       "nccl-tests/build/all_reduce_perf", "nccl-tests/build/common.o",
                       "nccl-tests/src/common.cu"]
    assert files["nccl-tests/build/common.o"]["reason"] == "a compiled program, object or archive"
    assert files["nccl-tests/Makefile"]["reason"] == "part of the source checkout nccl-tests/"
    # the logs beside the sources are read as before, and nothing is a warning
    assert {n: (f["kind"], f["status"]) for n, f in files.items()
            if f["status"] != "skipped"} == EVERY_FILE
    assert not [f for f in fs if f["severity"] in ("WARN", "FAIL")]
    skip = one(fs, "POC_FILES_SKIPPED")
    assert skip["severity"] == "INFO" and skip["message"].startswith("6 file(s) skipped")
    assert not (run_dir / "nodes/vm-one/preflight/raw/poc/nccl-tests/src").exists()


def test_a_whole_folder_cloned_into_is_a_checkout_too(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / "main.c").write_text("int main(void) { return 0; }\n")
    shutil.copy(RECIPE / "kernel.txt", tmp_path / "kernel.txt")
    by_name = {f.name: f for f in scan(tmp_path)}
    assert by_name[".git/"].status == "skipped"
    assert (by_name["main.c"].status, by_name["main.c"].reason) == (
        "skipped", f"part of the source checkout {tmp_path.name}/")
    assert by_name["kernel.txt"].kind == "uname"


def test_one_file_of_two_hosts_is_split_by_its_tags(tmp_path: Path) -> None:
    (tmp_path / "gpus.txt").write_text(
        "[1,0]<stdout>:GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-4039dfe4-0c97-4b1e-683e-eb7d42699053)\n"
        "[1,1]<stdout>:GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-dd3b269a-8f3a-d2d5-1518-2713ba03fcf7)\n")
    shutil.copy(FIX / "h200x2" / "commands" / "uname.txt", tmp_path / "kernel.txt")
    files = {f.name: f for f in scan(tmp_path)}
    assert files["gpus.txt"].status == "split"
    assert files["gpus.txt"].reason == ("holds the output of ranks 0, 1 (mpirun --tag-output "
                                        "prefixes): read as gpus.txt.rank0, gpus.txt.rank1")
    assert [(files[n].kind, files[n].status) for n in ("gpus.txt.rank0", "gpus.txt.rank1")] == [
        ("nvidia-smi-L", "recognised")] * 2
    assert files["gpus.txt.rank1"].ident.uuids == {"gpu-dd3b269a-8f3a-d2d5-1518-2713ba03fcf7"}
