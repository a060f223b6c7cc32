"""`gpuvet import poc`: a folder saved by hand, recognised by content and judged like live."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.steps.poc.files import Identity, PocFile, bus_key, read
from orchestrator.steps.poc.importer import split_nodes
from tests.unit.clirun import CliResult, gpuvet

FIX = Path(__file__).resolve().parents[1] / "fixtures"
POC = FIX / "poc"
ORDERS = POC / "orders.yaml"
H200 = FIX / "h200x2" / "commands"
PUBLIC = FIX / "public"


def run_json(results: Path) -> tuple[Path, dict[str, Any]]:
    runs = [d for d in results.iterdir() if d.is_dir()]
    assert len(runs) == 1, runs
    return runs[0], json.loads((runs[0] / "run.json").read_text())


def findings(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in (run_dir / "findings.jsonl").read_text().splitlines()]


def codes(fs: list[dict[str, Any]], severity: str | None = None) -> set[str]:
    return {f["code"] for f in fs if severity is None or f["severity"] == severity}


def poc(capsys: pytest.CaptureFixture[str], folder: Path, *args: str | Path) -> CliResult:
    return gpuvet(capsys, "import", "poc", folder, *args)


# --------------------------------------------------------------------------- recognition

@pytest.mark.parametrize(("path", "kind"), [
    (H200 / "nvidia-smi.txt", "nvidia-smi-table"),
    (PUBLIC / "nvidia-smi_4x-v100-pcie_r410.txt", "nvidia-smi-table"),
    (PUBLIC / "nvidia-smi_rtx2080s-kmd-umd_r610.txt", "nvidia-smi-table"),
    (H200 / "nvidia-smi-q.txt", "nvidia-smi-q"),
    (PUBLIC / "nvidia-smi-a_8x-a100-sxm4-40gb_r535.txt", "nvidia-smi-q"),
    (PUBLIC / "nvidia-smi-q_h100-cut-short_r535.txt", "nvidia-smi-q"),
    (POC / "h200-mig" / "nvidia-smi-q-mig.txt", "nvidia-smi-q"),
    (H200 / "nvidia-smi-q.xml", "nvidia-smi-q-xml"),
    (H200 / "nvidia-smi-version.txt", "nvidia-smi-version"),
    (H200 / "query-gpu.csv", "nvidia-smi-query-gpu"),
    (PUBLIC / "query-gpu_l40s_r595.csv", "nvidia-smi-query-gpu"),
    (H200 / "nvidia-smi-L.txt", "nvidia-smi-L"),
    (PUBLIC / "nvidia-smi-L_h200-mig_r590.txt", "nvidia-smi-L"),
    (H200 / "nvlink-s.txt", "nvlink-s"),
    (PUBLIC / "nvlink-s_h200-mig_r590.txt", "nvlink-s"),
    (FIX / "synthetic" / "nvlink-s_a100-pcie-no-nvlink_r550.txt", "nvlink-s"),
    (H200 / "topo-m.txt", "topo-m"),
    (PUBLIC / "topo-m_8x-a100-17nic.txt", "topo-m"),
    (H200 / "topo-p2p-r.txt", "topo-p2p"),
    (H200 / "dmon.txt", "dmon"),
    (PUBLIC / "dmon_s-mutc_o-TD.txt", "dmon"),
    (H200 / "uname.txt", "uname"),
    (H200 / "nvcc-version.txt", "nvcc-version"),
    (H200 / "torch-info.txt", "torch-info"),
    (H200 / "os-release.txt", "os-release"),
    (H200 / "lscpu.txt", "lscpu"),
    (H200 / "meminfo.txt", "meminfo"),
    (H200 / "mpirun-version.txt", "mpirun-version"),
    (H200 / "ldconfig-nccl.txt", "ldconfig-nccl"),
    (PUBLIC / "ibstat_8x-cx6_ibpanic.txt", "ibstat"),
    (FIX / "synthetic" / "ibv_devinfo_none.txt", "ibv-devinfo"),
    (H200 / "ibv_devinfo.txt", "command-not-found"),
    (FIX / "h200x2" / "nccl-tests" / "all_reduce_8B-128M_g2_round1.log", "nccl-tests"),
    (PUBLIC / "all_reduce_2node-h100_srun-label.log", "nccl-tests"),
    (FIX / "nccl-tests" / "all_reduce_2node-h100_crash-truncated.log", "nccl-tests"),
    (FIX / "h200x2-gpuvet" / "single_4G_g2_round1.json", "nccl-tests-json"),
    (POC / "samples" / "pip-list_torch-2.6.0-cu126.txt", "pip-list"),
    (POC / "h200x2" / "commit.txt", "commit"),
    (POC / "h200x2" / "checked-at.txt", "checked-at"),
])
def test_recognised_by_content(path: Path, kind: str) -> None:
    f = read(path, "renamed.txt")  # the name says nothing
    assert (f.kind, f.status) == (kind, "recognised"), f.reason


def test_a_lenient_parser_never_takes_what_another_kind_prints() -> None:
    """uname reads any line of five words and lscpu any `Key: value`: signatures decide."""
    assert read(H200 / "ibv_devinfo.txt", "x").facts.command == "ibv_devinfo"
    assert read(H200 / "nvidia-smi-version.txt", "x").facts.driver == "580.159.04"
    assert read(H200 / "nvlink-s.txt", "x").kind == "nvlink-s"  # not -L: same GPU lines


def test_pip_list_gives_torch_and_nccl() -> None:
    f = read(POC / "samples" / "pip-list_torch-2.6.0-cu126.txt", "x")
    assert (f.facts.torch, f.facts.nccl) == ("2.6.0+cu126", "2.21.5")


@pytest.mark.parametrize(("text", "start"), [
    ("notes: node looked fine\nasked for IB\n", "no known command output starts like this"),
    ((H200 / "nvidia-smi.txt").read_text().replace("NVIDIA H200 ", "NVIDIA H200 |", 1),
     "read as nvidia-smi-table: "),
    ((H200 / "query-gpu.csv").read_text().replace(", 16, 16,", ", 16,", 1),
     "read as nvidia-smi-query-gpu: "),
    ((H200 / "uname.txt").read_text() * 2, "no known command output"),
    ('{"tool": "gpuvet-payload", "commands": {}}', "read as gpuvet-collect: this is a gpuvet "
                                                   "collect document"),
])
def test_not_recognised_says_why(tmp_path: Path, text: str, start: str) -> None:
    p = tmp_path / "f.txt"
    p.write_text(text)
    f = read(p, "f.txt")
    assert f.status == "not recognised" and f.kind is None
    assert f.reason is not None and f.reason.startswith(start), f.reason


@pytest.mark.parametrize(("data", "why"), [
    (b"", "empty file"),
    (b"\n  \n", "empty file"),
    (bytes(range(256)) * 8, "binary content (8 NUL byte(s))"),
    (bytes(range(128, 256)) * 20, "binary content (2560 byte(s) that are not UTF-8"),
])
def test_unreadable_bytes(tmp_path: Path, data: bytes, why: str) -> None:
    p = tmp_path / "f.bin"
    p.write_bytes(data)
    f = read(p, "f.bin")
    assert f.status == "unreadable" and f.reason is not None and f.reason.startswith(why), f.reason
    assert f.sha256 is not None


def test_a_link_is_not_followed(tmp_path: Path) -> None:
    (tmp_path / "l").symlink_to(H200 / "uname.txt")
    f = read(tmp_path / "l", "l")
    assert (f.status, f.reason, f.data) == ("unreadable", "a symbolic link: not followed", b"")


# --------------------------------------------------------------------------- which machine

def test_bus_ids_in_every_spelling() -> None:
    assert bus_key("00000000:19:00.0") == bus_key("0000:19:00") == (0x19, 0)
    assert bus_key("0x19") == (0x19, None)
    assert bus_key("N/A") is None


def _f(name: str, **ident: Any) -> PocFile:
    return PocFile(name=name, path=Path(name), status="recognised", kind="x",
                   ident=Identity(**ident))


def test_the_majority_is_the_node_and_the_odd_file_is_another() -> None:
    files = [_f("uname", hosts={"vm"}), _f("log1", hosts={"vm"}, buses={(6, 0), (7, 0)}),
             _f("table", buses={(6, 0), (7, 0)}), _f("L", uuids={"gpu-a", "gpu-b"}),
             _f("q", uuids={"gpu-a"}, buses={(6, 0)}),
             _f("q-other", uuids={"gpu-z"}, buses={(6, 0)}),
             _f("log-other", hosts={"node7"}, buses={(6, 0)}),
             _f("nvcc")]
    split_nodes(files)
    status = {f.name: f.status for f in files}
    assert [n for n, s in status.items() if s == "other node"] == ["q-other", "log-other"]
    other = {f.name: f.reason for f in files}
    # UUIDs outrank the bus ids both print; log-other agrees on bus ids (machines of one
    # model share them) but not on the hostname
    assert other["q-other"] is not None and other["q-other"].startswith(
        "its GPU UUIDs (gpu-z) are not among those the rest of the folder prints (gpu-a")
    assert other["log-other"] is not None and "hostname (node7)" in other["log-other"]


def test_old_nccl_bus_numbers_compare_by_bus_only() -> None:
    files = [_f("table", buses={(0x07, 0), (0x0F, 0)}), _f("old-log", buses={(0x07, None)}),
             _f("other-log", buses={(0x20, None)})]
    split_nodes(files)
    assert [f.status for f in files] == ["recognised", "recognised", "other node"]


# --------------------------------------------------------------------------- whole folders

def test_h200_folder_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "r"
    proc = poc(capsys, POC / "h200x2", "-p", "h200-lab", "-i", ORDERS, "--results", results)
    assert proc.returncode == 0, proc.output
    run_dir, meta = run_json(results)
    assert meta["command"] == "import poc" and meta["status"] == "passed"
    assert meta["nodes"] == ["vm"]  # the hostname uname and the logs print
    src = meta["source"]
    assert src["kind"] == "poc" and src["dir"] == str((POC / "h200x2").resolve())
    assert src["checked_at"] == "2026-11-30T04:53:05"
    status = {n: (f["kind"], f["status"]) for n, f in src["files"].items()}
    assert status == {
        "all-reduce-1.log": ("nccl-tests", "judged"), "all-reduce-2.log": ("nccl-tests", "judged"),
        "all-reduce-3.log": ("nccl-tests", "judged"), "checked-at.txt": ("checked-at", "recorded"),
        "commit.txt": ("commit", "recorded"), "dmon.txt": ("dmon", "recorded"),
        "ibv_devinfo.txt": ("command-not-found", "judged"), "kernel.txt": ("uname", "judged"),
        "nvcc-version.txt": ("nvcc-version", "judged"),
        "nvidia-smi-L.txt": ("nvidia-smi-L", "judged"),
        "nvidia-smi-q.txt": ("nvidia-smi-q", "judged"),
        "nvidia-smi-version.txt": ("nvidia-smi-version", "recorded"),
        "nvidia-smi.txt": ("nvidia-smi-table", "judged"),
        "query-gpu.csv": ("nvidia-smi-query-gpu", "judged"), "topo-m.txt": ("topo-m", "judged"),
        "topo-p2p.txt": ("topo-p2p", "judged"), "torch.txt": ("torch-info", "judged")}
    # every file is in the run byte for byte, and its digest is recorded
    for name, f in src["files"].items():
        copy = run_dir / "nodes" / "vm" / "preflight" / "raw" / "poc" / name
        assert copy.read_bytes() == (POC / "h200x2" / name).read_bytes()
        assert f["sha256"] == __import__("hashlib").sha256(copy.read_bytes()).hexdigest()
    fs = findings(run_dir)
    assert codes(fs, "PASS") >= {"GPU_COUNT", "GPU_MODEL", "GPU_MEMORY", "FORM_FACTOR",
                                 "INTERCONNECT", "TORCH_SEES_GPUS", "NCCL_REFERENCE"}
    assert not codes(fs, "FAIL") and not codes(fs, "WARN")
    # what the folder cannot tell is said, not taken for a missing tool
    assert "BUILD_TOOLS" not in codes(fs)
    nc = next(f for f in fs if f["code"] == "POC_NOT_CHECKED")
    assert nc["details"]["unchecked"] == ["build tools: only a live preflight probes nvcc, NCCL "
                                          "headers and MPI"]
    busbw = next(f for f in fs if f["code"] == "NCCL_BUSBW")
    assert "median 285.3 GB/s over 3 round(s)" in busbw["message"]
    ms = [json.loads(ln) for ln in (run_dir / "measurements.jsonl").read_text().splitlines()]
    assert len(ms) == 450 and {m["round"] for m in ms} == {1, 2, 3}
    assert {m["suite_hash"] for m in ms} == {meta["suite_hash"]}
    assert {m["tags"]["nccl_tests_commit"] for m in ms} == {
        "a0b82b2260cf5152b9f8c061bbf7eaf0ba096432"}
    assert {tuple(m["nodes"]) for m in ms} == {("vm",)}
    # the -q text joins the node's facts; the document is the payload's shape
    facts = json.loads((run_dir / "nodes/vm/preflight/facts.json").read_text())
    assert {"nvidia_smi_q", "query_gpu", "nvidia_smi", "topo_m", "torch"} <= set(facts["facts"])
    assert facts["recorded"]["dmon.txt"]["kind"] == "dmon"
    assert facts["versions"]["driver"] == "580.159.04"
    doc = json.loads((run_dir / "nodes/vm/preflight/collect.json").read_text())
    assert doc["tool"] == "gpuvet-payload" and doc["commands"]["ibv_devinfo"]["missing"] is True
    assert "files of" in proc.stdout and "450 measurements" in proc.stdout


def test_same_nccl_judging_as_import_nccl_tests(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """The same logs give the same suite hash and the same numbers either way."""
    logs = sorted((POC / "h200x2").glob("all-reduce-*.log"))
    assert gpuvet(capsys, "import", "nccl-tests", *logs, "-p", "lab", "--results",
                  tmp_path / "a").returncode == 0
    assert poc(capsys, POC / "h200x2", "-p", "lab", "--results", tmp_path / "b").returncode == 0
    (a_dir, a), (b_dir, b) = run_json(tmp_path / "a"), run_json(tmp_path / "b")
    assert a["suite_hash"] == b["suite_hash"]

    def rows(d: Path) -> list[tuple[Any, ...]]:
        return sorted((m["metric"], m["size"], m["inplace"], m["round"], m["value"])
                      for m in map(json.loads, (d / "measurements.jsonl").read_text().splitlines()))

    assert rows(a_dir) == rows(b_dir)
    nccl = {(f["code"], f["severity"]) for f in findings(a_dir)}
    assert nccl <= {(f["code"], f["severity"]) for f in findings(b_dir)}


def test_an_order_with_infiniband_fails_on_the_missing_command(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`ibv_devinfo: command not found` saved in the folder is a fact, not a gap."""
    proc = poc(capsys, POC / "h200x2", "-p", "h200-ib", "-i", ORDERS, "--results", tmp_path)
    assert proc.returncode == 1, proc.output
    run_dir, _ = run_json(tmp_path)
    ib = next(f for f in findings(run_dir) if f["code"] == "IB_MISSING")
    # filed under the inventory's node of the provider, not the folder's hostname `vm`
    assert ib["severity"] == "FAIL" and ib["node"] == "ib-1"
    assert ib["evidence"] == ["nodes/ib-1/preflight/raw/ibv_devinfo.txt"]


def test_a100_folder_violates_its_order(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    proc = poc(capsys, POC / "a100-sxm4-40gb", "-p", "alpha", "-i", ORDERS, "--results", tmp_path)
    assert proc.returncode == 1, proc.output
    run_dir, meta = run_json(tmp_path)
    assert meta["nodes"] == ["alpha-1"]  # the inventory's node (nothing prints a hostname)
    fs = findings(run_dir)
    assert codes(fs, "FAIL") == {"GPU_MODEL", "GPU_MEMORY", "PCIE_BELOW_ORDER"}
    mem = next(f for f in fs if f["code"] == "GPU_MEMORY")
    assert "GPU0 40.0 GiB" in mem["message"] and "GPU7 40.0 GiB" in mem["message"]
    assert sum(f["code"] == "PCIE_BELOW_ORDER" for f in fs) == 8  # Host Max Gen3 on all eight
    assert codes(fs, "PASS") >= {"GPU_COUNT", "FORM_FACTOR", "INTERCONNECT"}
    # the -i 0 excerpt merges into GPU 0 of the whole output instead of counting twice
    count = next(f for f in fs if f["code"] == "GPU_COUNT")
    assert count["details"] == {"found": 8, "ordered": 8}
    nc = next(f for f in fs if f["code"] == "POC_NOT_CHECKED")
    assert nc["details"]["unchecked"] == [
        "PyTorch's view of the GPUs: no torch probe output",
        "RDMA ports: no ibv_devinfo or ibstat output",
        "build tools: only a live preflight probes nvcc, NCCL headers and MPI"]
    files = meta["source"]["files"]
    assert {n: f["status"] for n, f in files.items()} == {
        "dmon-gpu0.txt": "recorded", "dmon-s-m.txt": "recorded", "nvidia-smi-a.txt": "judged",
        "nvidia-smi-q-i0.txt": "judged", "topo-m.txt": "judged"}


def test_mig_folder_with_a_sed_excerpt(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    proc = poc(capsys, POC / "h200-mig", "-p", "h200-whole", "-i", ORDERS, "--results", tmp_path)
    assert proc.returncode == 1, proc.output
    run_dir, meta = run_json(tmp_path)
    fs = findings(run_dir)
    assert codes(fs, "FAIL") == {"MIG_ENABLED"}
    # saved while memhog and gpu_burn ran: said, but the tester's own load is no FAIL
    busy = next(f for f in fs if f["code"] == "GPU_BUSY")
    assert busy["severity"] == "WARN" and "pid 12267 ./gpu_burn (13526 MiB)" in busy["message"]
    assert "when these outputs were saved" in busy["message"]
    mig = next(f for f in fs if f["code"] == "MIG_ENABLED")
    assert mig["details"] == {"gpus": [0], "mig_devices": 5}
    assert meta["source"]["files"]["nvidia-smi-q-mig.txt"]["status"] == "judged"


def test_without_an_inventory_nothing_is_ordered(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    proc = poc(capsys, POC / "a100-sxm4-40gb", "-p", "alpha", "--results", tmp_path, "--json")
    assert proc.returncode == 0, proc.output
    out = json.loads(proc.stdout)
    assert out["status"] == "passed"
    assert not {"GPU_MODEL", "GPU_MEMORY", "GPU_COUNT", "PCIE_BELOW_ORDER"} & codes(out["findings"])
    # nothing was ordered, so nothing was judged: not measured, never PASS with 0 checks
    assert out["verdicts"] == {"poc": "NOT MEASURED"}


def test_bad_input_is_reported_per_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "poc"
    shutil.copytree(POC / "h200x2", folder)
    shutil.copy(PUBLIC / "nvidia-smi-q_l40s_r595.txt", folder / "nvidia-smi-q-b.txt")
    shutil.copy(FIX / "nccl-tests" / "all_reduce_2node-h100_crash-truncated.log",
                folder / "all-reduce-other.log")
    (folder / "notes.md").write_text("rented 2026-11-30, asked for IB\n")
    (folder / "core").write_bytes(bytes(range(256)) * 4)
    cut = (folder / "all-reduce-3.log").read_text().splitlines(keepends=True)[:20]
    (folder / "all-reduce-4.log").write_text("".join(cut))
    (folder / "more").mkdir()
    (folder / "more" / "torch-print.txt").write_text("2.11.0+cu130 True 2\n")
    results = tmp_path / "r"
    proc = poc(capsys, folder, "-p", "h200-lab", "-i", ORDERS, "--results", results)
    assert proc.returncode == 1, proc.output  # the truncated round FAILs; nothing crashed
    run_dir, meta = run_json(results)
    files = meta["source"]["files"]
    assert files["nvidia-smi-q-b.txt"]["status"] == "other node"
    assert files["all-reduce-other.log"]["status"] == "other node"
    assert files["notes.md"]["status"] == "not recognised"
    assert files["more/torch-print.txt"]["status"] == "not recognised"
    assert files["core"]["status"] == "unreadable"
    assert files["all-reduce-4.log"]["status"] == "judged"
    fs = findings(run_dir)
    by_file = {f["details"].get("file"): f for f in fs if f["code"].startswith("POC_FILE")
               or f["code"] == "POC_OTHER_NODE"}
    assert set(by_file) == {"nvidia-smi-q-b.txt", "all-reduce-other.log", "notes.md",
                            "more/torch-print.txt", "core"}
    assert all(f["severity"] == "WARN" and f["node"] == "vm" for f in by_file.values())
    other = by_file["nvidia-smi-q-b.txt"]
    assert "GPU UUIDs" in other["message"] and "not judged with vm" in other["message"]
    assert other["evidence"] == ["nodes/vm/preflight/raw/poc/nvidia-smi-q-b.txt"]
    assert "its GPU PCI bus ids (18:00, 2a:00" in by_file["all-reduce-other.log"]["message"]
    trunc = next(f for f in fs if f["code"] == "NCCL_TRUNCATED")
    assert "round 4" in trunc["message"]
    # the L40S never reached the node's facts: the order's checks still pass
    assert codes(fs, "PASS") >= {"GPU_COUNT", "GPU_MODEL", "GPU_MEMORY"}
    facts = json.loads((run_dir / "nodes/vm/preflight/facts.json").read_text())
    assert "nvidia_smi_q_2" not in facts["facts"]


def test_nothing_judged_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "poc"
    folder.mkdir()
    (folder / "notes.txt").write_text("all good\n")
    (folder / "blob").write_bytes(b"\x00\x01\x02")
    shutil.copy(H200 / "dmon.txt", folder / "dmon.txt")
    results = tmp_path / "r"
    proc = poc(capsys, folder, "-p", "lab", "--results", results)
    assert proc.returncode == 2
    assert "nothing in" in proc.output and "could be judged" in proc.output
    for name in ("notes.txt: not recognised", "blob: unreadable", "dmon.txt: recorded"):
        assert name in proc.output
    assert not results.exists() or not [d for d in results.iterdir() if d.is_dir()]


@pytest.mark.parametrize("args", [("-p", "no such"), ("-p", "lab", "-n", "../x"),
                                  ("-p", "nope", "-i", str(ORDERS))])
def test_bad_arguments_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                              args: tuple[str, ...]) -> None:
    proc = poc(capsys, POC / "h200x2", *args, "--results", tmp_path)
    assert proc.returncode == 2, proc.output
    assert not [d for d in tmp_path.iterdir() if d.is_dir()]


def test_missing_or_empty_folder_exits_2(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert poc(capsys, tmp_path / "nope", "-p", "lab", "--results", tmp_path).returncode == 2
    (tmp_path / "empty").mkdir()
    proc = poc(capsys, tmp_path / "empty", "-p", "lab", "--results", tmp_path / "r")
    assert proc.returncode == 2 and "holds no files" in proc.output


def test_node_option_and_duplicates(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "poc"
    shutil.copytree(POC / "h200x2", folder)
    shutil.copy(H200 / "topo-m.txt", folder / "topo-z.txt")
    shutil.copy(H200 / "nvidia-smi-q.xml", folder / "q.xml")
    proc = poc(capsys, folder, "-p", "lab", "-n", "h200-a", "--results", tmp_path / "r",
               "--json", "-v")
    assert proc.returncode == 0, proc.output
    out = json.loads(proc.stdout)
    run_dir, meta = run_json(tmp_path / "r")
    assert meta["nodes"] == ["h200-a"] and meta["source"]["hostname"] == "vm"
    files = meta["source"]["files"]
    assert files["topo-z.txt"]["status"] == "duplicate"
    assert files["q.xml"]["status"] == "judged" and files["q.xml"]["as"] == "nvidia_smi_q_xml"
    dup = next(f for f in out["findings"] if f["code"] == "POC_DUPLICATE")
    assert dup["severity"] == "INFO" and "topo-m.txt is judged" in dup["message"]
    assert {f["node"] for f in out["findings"] if f["scope"] == "node"} == {"h200-a"}


def test_the_closest_parser_is_the_strongest_signature(tmp_path: Path) -> None:
    """A damaged `nvlink -s` also starts like `nvidia-smi -L`; the reason is nvlink's."""
    p = tmp_path / "links.txt"
    p.write_text((H200 / "nvlink-s.txt").read_text().replace("Link 1: 26.562 GB/s",
                                                              "Link 1: fast", 1))
    f = read(p, "links.txt")
    assert f.status == "not recognised"
    assert f.reason is not None and f.reason.startswith("read as nvlink-s: "), f.reason


def test_a_strong_signature_that_does_not_parse_lets_the_next_try(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.errors import ParseError
    from orchestrator.steps.poc import kinds as poc_kinds

    def refuse(text: str, source: str | None = None) -> Any:
        raise ParseError("lookalike", "not quite", source=source)

    lookalike = poc_kinds.Kind("lookalike", lambda text, head: 99, refuse)
    monkeypatch.setattr(poc_kinds, "KINDS", (lookalike, *poc_kinds.KINDS))
    assert read(H200 / "uname.txt", "k").kind == "uname"
    f = read(H200 / "INDEX.txt", "i")
    assert f.reason is not None and f.reason.startswith("read as lookalike: not quite")


def test_excerpts_of_different_gpus_are_one_node() -> None:
    """`-q -i 0` and `-q -i 1` share no UUID, yet both belong to the full listing's node."""
    files = [_f("q-i0", uuids={"gpu-a"}, buses={(6, 0)}), _f("q-i1", uuids={"gpu-b"},
                                                               buses={(7, 0)}),
             _f("L", uuids={"gpu-a", "gpu-b"}), _f("table", buses={(6, 0), (7, 0)})]
    split_nodes(files)
    assert [f.status for f in files] == ["recognised"] * 4


def test_a_folder_without_gpu_outputs_is_not_a_missing_driver(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "poc"
    folder.mkdir()
    for name in ("kernel.txt", "all-reduce-1.log", "all-reduce-2.log", "all-reduce-3.log"):
        shutil.copy(POC / "h200x2" / name, folder / name)
    proc = poc(capsys, folder, "-p", "h200-ib", "-i", ORDERS, "--results", tmp_path / "r")
    assert proc.returncode == 0, proc.output
    run_dir, _ = run_json(tmp_path / "r")
    fs = findings(run_dir)
    assert not {"NVIDIA_DRIVER_MISSING", "IB_MISSING", "TORCH_UNAVAILABLE"} & codes(fs)
    nc = next(f for f in fs if f["code"] == "POC_NOT_CHECKED")
    assert nc["details"]["unchecked"][0].startswith("GPUs (model, count, memory, MIG, health)")
    assert "RDMA ports: no ibv_devinfo or ibstat output" in nc["details"]["unchecked"]


def test_secrets_are_scrubbed_and_binary_is_not_kept(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "poc"
    shutil.copytree(POC / "h200x2", folder)
    log = (folder / "all-reduce-1.log").read_text()
    (folder / "all-reduce-1.log").write_text(
        "HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz0123456789\n" + log)
    (folder / "core").write_bytes(b"\x00\x7fELF" * 64)
    results = tmp_path / "r"
    assert poc(capsys, folder, "-p", "lab", "--results", results).returncode == 0
    run_dir, meta = run_json(results)
    files = meta["source"]["files"]
    assert files["all-reduce-1.log"]["scrubbed"] is True
    kept = (run_dir / files["all-reduce-1.log"]["copy"]).read_text()
    assert "hf_abcdefghijklmnopqrstuvwxyz" not in kept and kept.endswith(log)
    assert "scrubbed" not in files["kernel.txt"]
    assert files["core"]["copy"] is None and files["core"]["sha256"]
    assert not (run_dir / "nodes/vm/preflight/raw/poc/core").exists()
    # the scrubbed log is the one judged: three rounds as before
    assert "hf_abcdefghij" not in (run_dir / "measurements.jsonl").read_text()


SEEDS = sorted(p for d in ("h200x2", "a100-sxm4-40gb", "h200-mig", "samples")
               for p in (POC / d).iterdir())


@settings(max_examples=60, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(seed=st.sampled_from(SEEDS), cut=st.floats(0, 1), junk=st.text(max_size=80),
       where=st.floats(0, 1), raw=st.binary(max_size=64))
def test_damaged_outputs_get_a_status_never_an_exception(seed: Path, cut: float, junk: str,
                                                         where: float, raw: bytes) -> None:
    """Cut short, spliced with junk or bytes: each file ends with a status and a reason."""
    import tempfile

    data = seed.read_bytes()
    data = data[:int(len(data) * cut)]
    at = int(len(data) * where)
    data = data[:at] + junk.encode() + raw + data[at:]
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "f"
        p.write_bytes(data)
        f = read(p, "f")
    assert f.status in ("recognised", "not recognised", "unreadable")
    assert (f.kind is not None) == (f.status == "recognised")
    assert f.status == "recognised" or f.reason


# --------------------------------------------------------------------------- bounded by design

def test_a_folder_is_read_one_file_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                             ) -> None:
    """The import held the whole folder in memory (300 MB of files: 705 MB RSS): now a
    file's bytes and text live only while it is read and its copy kept. At every read no
    other file holds its bytes or text, and the judging that follows reads the kept copies
    (the verdicts are the same as when everything was held: the end-to-end tests)."""
    import gc

    from orchestrator.steps.poc import files as poc_files
    from orchestrator.steps.poc.importer import import_poc

    folder = tmp_path / "poc"
    shutil.copytree(POC / "h200x2", folder)
    for i in range(3):  # files of several ranks: the parts of a split file are kept too
        (folder / f"gpus-{i}.txt").write_text(
            "[1,0]<stdout>:GPU 0: NVIDIA H200 (UUID: GPU-4039dfe4-0c97-4b1e-683e-eb7d42699053)\n"
            "[1,1]<stdout>:GPU 0: NVIDIA H200 (UUID: GPU-dd3b269a-8f3a-d2d5-1518-2713ba03fcf7)\n")
    held_at_read: list[int] = []
    real = poc_files.read

    def counting(*args: Any, **kw: Any) -> PocFile:
        held_at_read.append(sum(1 for o in gc.get_objects() if isinstance(o, PocFile)
                                and (o.data or o.text is not None)))
        return real(*args, **kw)

    monkeypatch.setattr(poc_files, "read", counting)
    res = import_poc(folder, "lab", None, None, tmp_path / "r")
    n_files = sum(1 for p in folder.rglob("*") if p.is_file())
    assert len(held_at_read) == n_files > 10
    assert max(held_at_read) == 0  # the peak of files held while another is read
    assert all(f.data == b"" and f.text is None for f in res.files)
    kept = [f for f in res.files if f.kept is not None]
    assert kept and all(f.kept.is_file() and f.copy and f.kept == res.run.dir / f.copy
                        for f in kept)
    assert not [p for p in (tmp_path / "r").iterdir() if p.name.startswith(".import-poc")]


@pytest.mark.parametrize("limit", ["MAX_FOLDER_BYTES", "MAX_FOLDER_FILES"])
def test_a_folder_past_the_stated_limits_is_refused_unread(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        limit: str) -> None:
    from orchestrator.steps.poc import files as poc_files
    from orchestrator.steps.poc import folder as poc_folder

    folder = POC / "h200x2"
    total = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    count = sum(1 for p in folder.rglob("*") if p.is_file())
    monkeypatch.setattr(poc_folder, limit, total - 1 if limit == "MAX_FOLDER_BYTES" else count - 1)
    reads: list[str] = []
    monkeypatch.setattr(poc_files, "read", lambda *a, **k: reads.append(a[1]))
    proc = poc(capsys, folder, "-p", "lab", "--results", tmp_path / "r")
    assert proc.returncode == 2, proc.output
    what = (f"{(total - 1) / 1024:g} KiB of files" if limit == "MAX_FOLDER_BYTES"
            else f"{count - 1:,} files")
    assert f"error: {folder} holds more than {what}, more than one import reads" in proc.output
    assert reads == [] and not (tmp_path / "r").exists()
