"""compare, cost and report on the inputs people bring: imported logs without an
inventory, PoC folders with and without nccl-tests logs, a rental's own windows."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from orchestrator.analysis import billing, compare
from orchestrator.cli import run as cli
from orchestrator.suite import Suite
from tests.unit.clirun import gpuvet
from tests.unit.comparestore import _close, build_store, nccl

FIX = Path(__file__).resolve().parents[1] / "fixtures"
LOGS = sorted((FIX / "h200x2" / "nccl-tests").glob("all_reduce_8B-128M_g2_round*.log"))
POC = FIX / "poc"
PICKED = ("nvidia-smi.txt", "nvidia-smi-q.txt", "query-gpu.csv", "kernel.txt", "topo-m.txt",
          "torch.txt", "checked-at.txt")


def _tables(doc: dict[str, Any], title: str) -> list[dict[str, Any]]:
    return next(t for t in doc["tables"] if t["title"] == title)["rows"]


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two providers of `gpuvet import nccl-tests` logs: no inventory, so no price."""
    base = tmp_path_factory.mktemp("imported")
    root = base / "results"
    other = base / "b"
    other.mkdir()
    for log in LOGS:  # the same numbers, another file (imports are recognised by content)
        (other / log.name).write_text(log.read_text() + "\n")
    for p, logs in (("A", LOGS), ("B", sorted(other.iterdir()))):
        assert cli([str(a) for a in ("import", "nccl-tests", "-p", p, "--results", root,
                                     *logs)]) == 0
    return root


def test_imported_logs_without_a_price_are_compared_and_reported(imported, tmp_path,
                                                                 capsys) -> None:
    r = gpuvet(capsys, "compare", "--results", imported, "-p", "A", "-p", "B", "--json")
    assert r.returncode in (0, 1), r.output  # a verdict, never "has no price"
    doc = json.loads(r.stdout)
    busbw = _tables(doc, "busbw (all_reduce, out-of-place)")
    assert busbw and all(row["B/A"] == pytest.approx(1.0) for row in busbw)
    cost = _tables(doc, "PoC cost")
    assert {row["total"] for row in cost} == {"not priced"}
    assert all(row["hours"] == "unknown" for row in cost)  # imported logs: never a silent 0
    assert "0.00" not in json.dumps(cost)
    src = _tables(doc, "PoC cost: where each number came from")
    assert src[-1]["price"].startswith("not priced (add pricing:")
    out = tmp_path / "rep" / "r.html"
    r = gpuvet(capsys, "report", "--results", imported, "-p", "A", "-p", "B", "-o", out)
    assert r.returncode == 0, r.output
    assert "not priced" in out.with_suffix(".md").read_text()


def test_a_provider_is_not_compared_with_itself(imported, capsys) -> None:
    r = gpuvet(capsys, "compare", "--results", imported, "-p", "A", "-p", "A")
    assert r.returncode == 2 and "named twice" in r.stderr
    assert len(r.stderr.strip().splitlines()) <= 2


def _poc_folder(dest: Path, *, times: bool = True) -> Path:
    """A PoC folder of nvidia-smi outputs only (no nccl-tests logs), its files' times
    spread over 1.5 hours as `tar` or `rsync -a` keep them."""
    dest.mkdir(parents=True)
    for name in PICKED:
        shutil.copyfile(POC / "h200x2" / name, dest / name)
    (dest / "checked-at.txt").write_text("2026-11-30T04:00:00+00:00\n")
    base = 1_796_011_200.0  # 2026-11-30T04:00:00Z
    for i, name in enumerate(PICKED):
        t = base + (5400.0 if name == "torch.txt" else 60.0 * i) if times else base
        os.utime(dest / name, (t, t))
    return dest


@pytest.fixture(scope="module")
def pocs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("pocs")
    root = base / "results"
    inv = base / "inv.yaml"
    inv.write_text((POC / "orders.yaml").read_text().replace(
        "    nodes:\n      - {name: ib-1}",
        "    pricing: {gpu_hour: 9.8, currency: CNY, billing_granularity: second}\n"
        "    nodes:\n      - {name: ib-1}"))
    for p, folder in (("h200-lab", _poc_folder(base / "a")), ("h200-ib", _poc_folder(base / "b"))):
        assert cli([str(a) for a in ("import", "poc", folder, "-p", p, "-i", inv,
                                     "--results", root)]) in (0, 1)
    return root


def test_a_store_of_poc_folders_compares_what_it_has(pocs, tmp_path, capsys) -> None:
    r = gpuvet(capsys, "compare", "--results", pocs, "-p", "h200-lab", "-p", "h200-ib",
               "--json")
    assert r.returncode in (0, 1), r.output
    doc = json.loads(r.stdout)
    assert {v["provider"] for v in doc["verdicts"]} == {"h200-lab", "h200-ib"}
    assert "busbw (all_reduce, out-of-place)" in doc["empty_sections"]
    env = {row["what"]: row for row in _tables(doc, "environment")}
    assert env["GPUs per node"]["h200-ib"] == "2"
    text = gpuvet(capsys, "compare", "--results", pocs, "-p", "h200-lab", "-p", "h200-ib")
    assert "nothing to show" in text.stdout and "busbw" in text.stdout
    out = tmp_path / "r.html"
    r = gpuvet(capsys, "report", "--results", pocs, "-p", "h200-lab", "-p", "h200-ib", "-o",
               out, "--no-cost")
    assert r.returncode == 0, r.output


def test_a_poc_is_filed_under_the_inventory_node_and_priced_over_its_own_window(
        pocs, capsys) -> None:
    """The folder's hostname (`vm`) is a fact, the node is the inventory's (`ib-1`): compare
    finds its GPU count, and the cost runs over checked-at.txt to the newest file time."""
    runs = json.loads(gpuvet(capsys, "runs", "--results", pocs, "--json").stdout)
    ib = next(r for r in runs if r["providers"] == ["h200-ib"])
    assert ib["nodes"] == ["ib-1"]
    meta = json.loads((pocs / ib["run"] / "run.json").read_text())
    assert meta["source"]["hostname"] == "vm"
    assert meta["source"]["gpu_uuids"] and all(u.startswith("gpu-")
                                               for u in meta["source"]["gpu_uuids"])
    c = compare.build(pocs, ["h200-ib"])
    (poc,) = c.costs
    assert poc.gpus == 2 and poc.window.name == "PoC folder"
    assert poc.window.hours == pytest.approx(1.5)
    assert "checked-at.txt" in poc.window.source and "newest file" in poc.window.source
    assert poc.compute == pytest.approx(9.8 * 2 * 1.5)
    # --hours overrides it, and says so
    (h,) = compare.build(pocs, ["h200-ib"], override=billing.Override(hours=0.5)).costs
    assert h.window.name == "--hours" and h.compute == pytest.approx(9.8 * 2 * 0.5)


def test_a_poc_copied_without_its_file_times_has_no_window(tmp_path, capsys) -> None:
    folder = _poc_folder(tmp_path / "f", times=False)
    root = tmp_path / "results"
    assert gpuvet(capsys, "import", "poc", folder, "-p", "x", "--results",
                  root).returncode in (0, 1)
    (c,) = compare.build(root, ["x"]).costs
    assert c.window.hours is None and "rsync -a" in c.window.source
    assert c.compute is None and c.total is None


def test_a_provider_of_several_nodes_asks_for_the_node(tmp_path, capsys) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text((POC / "orders.yaml").read_text().replace(
        "      - {name: ib-1}", "      - {name: ib-1}\n      - {name: ib-2}"))
    folder = _poc_folder(tmp_path / "f")
    r = gpuvet(capsys, "import", "poc", folder, "-p", "h200-ib", "-i", inv, "--results",
               tmp_path / "r")
    assert r.returncode == 2 and "-n NAME" in r.stderr and "ib-1, ib-2" in r.stderr
    r = gpuvet(capsys, "import", "poc", folder, "-p", "h200-ib", "-i", inv, "-n", "ib-2",
               "--results", tmp_path / "r")
    assert r.returncode in (0, 1) and "filed under node ib-2" in r.stdout
    assert "hostname: vm" in r.stdout


# --------------------------------------------------------------------------- live windows

@pytest.fixture()
def rental(tmp_path: Path) -> tuple[Path, dict[str, dict[str, str]]]:
    """The pair of providers, beta with an interrupted attempt before its first good run
    (06:40-06:50) and one between (07:02-07:08)."""
    root = tmp_path / "results"
    early = nccl(root, "beta", Suite(), rounds=1)
    _close(early, ("2026-11-30T06:40:00Z", "2026-11-30T06:50:00Z"), "interrupted")
    return root, build_store(root, failed_attempt=True)


def _boot(root: Path, run_id: str, node: str, when: str) -> None:
    path = root / run_id / "nodes" / node / "preflight" / "facts.json"
    doc = json.loads(path.read_text())
    doc["boot_time"] = when
    path.write_text(json.dumps(doc))


def test_steps_window_counts_attempts_before_the_first_good_run(rental) -> None:
    root, _ = rental
    by = {(c.provider, c.window.name): c for c in compare.build(root, ["beta"]).costs}
    steps = by[("beta", "gpuvet's steps")]
    assert steps.window.attempts == 2  # 06:40 (before preflight) and 07:02
    assert steps.window.failed_hours == pytest.approx(10 / 60 + 6 / 60)
    assert ("beta", "instance up since boot") not in by  # no boot time reported


def test_instance_window_from_boot_time_and_billed_since(rental) -> None:
    """A rental bills since the instance came up: boot (preflight's /proc/stat btime) to
    the last run's end, 06:30 to 08:15 = 1.75 h, billed per hour as 2 h."""
    root, ids = rental
    _boot(root, ids["beta"]["preflight"], "beta-1", "2026-11-30T06:30:00Z")
    by = {(c.provider, c.window.name): c for c in compare.build(root, ["beta"]).costs}
    boot = by[("beta", "instance up since boot")]
    assert boot.window.hours == pytest.approx(1.75)
    assert "boot time" in boot.window.source and boot.window.attempts == 2
    assert boot.billed_hours == pytest.approx(2.0)
    assert boot.compute is not None and boot.reruns is not None
    assert boot.compute + boot.reruns == pytest.approx(2.9 * 2 * 2)
    steps = by[("beta", "gpuvet's steps")]
    assert steps.window.hours < boot.window.hours  # both windows side by side
    since = compare.build(root, ["beta"], override=billing.Override(
        billed_since="2026-11-30T05:15:00Z")).costs
    (s,) = [c for c in since if c.window.name == "billed since"]
    assert s.window.hours == pytest.approx(3.0) and "--billed-since" in s.window.source
    (w,) = compare.build(root, ["beta"], override=billing.Override(
        window=("2026-11-30T06:00:00Z", "2026-11-30T10:00:00Z"))).costs
    assert w.window.hours == pytest.approx(4.0)


def test_pricing_billed_since_in_the_inventory(tmp_path) -> None:
    from tests.unit.comparestore import INVENTORY

    inv = tmp_path / "inv.yaml"
    inv.write_text(INVENTORY.read_text().replace(
        "storage_gb_month: 0.08, egress_gb: 0.0}",
        "storage_gb_month: 0.08, egress_gb: 0.0,\n              "
        "billed_since: '2026-11-30T06:15:00Z'}"))
    root = tmp_path / "results"
    build_store(root, providers=("beta",), inventory=inv)
    (s,) = [c for c in compare.build(root, ["beta"]).costs if c.window.name == "billed since"]
    assert s.window.hours == pytest.approx(2.0) and "pricing.billed_since" in s.window.source


def test_override_mistakes_are_usage_errors(rental, capsys) -> None:
    root, _ = rental
    for extra, msg in ((["--window", "2026-11-30T06:00:00Z"], "START/END"),
                       (["--window", "2026-11-30T09:00:00Z/2026-11-30T06:00:00Z"], "ends before"),
                       (["--billed-since", "yesterday"], "not a date"),
                       (["--hours", "-1"], "negative")):
        r = gpuvet(capsys, "compare", "--results", root, "-p", "beta", *extra)
        assert r.returncode == 2 and msg in r.stderr, (extra, r.output)


def test_boot_time_from_proc_stat() -> None:
    from payload.probes import boot_time

    assert boot_time("cpu  1 2 3\nbtime 1796011200\nprocesses 9\n") == "2026-11-30T04:00:00Z"
    assert boot_time("cpu 1 2 3\n") is None and boot_time("") is None


def test_a_store_written_with_a_relative_results_path_is_read_from_anywhere(
        tmp_path, capsys, monkeypatch) -> None:
    """`--results results` from one directory, compare from another with the absolute
    path: the environment facts of the runs are still found (the index stored the run
    folders relative to where the import ran)."""
    folder = _poc_folder(tmp_path / "a")
    monkeypatch.chdir(tmp_path)
    assert cli(["import", "poc", str(folder), "-p", "lab", "--results", "results"]) in (0, 1)
    assert cli(["import", "poc", str(_poc_folder(tmp_path / "b")), "-p", "other",
                "--results", "results"]) in (0, 1)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    r = gpuvet(capsys, "compare", "--results", tmp_path / "results", "-p", "lab", "-p",
               "other", "--json")
    assert r.returncode in (0, 1), r.output
    env = {row["what"]: row for row in _tables(json.loads(r.stdout), "environment")}
    assert env["GPUs per node"]["lab"] == "2", env
