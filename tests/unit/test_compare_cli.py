"""gpuvet compare and gpuvet report: exit codes, JSON, and bad input writes nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from orchestrator.suite import Suite
from tests.unit.clirun import gpuvet
from tests.unit.comparestore import INVENTORY, build_store


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, str]]]:
    root = tmp_path_factory.mktemp("cmpcli") / "results"
    return root, build_store(root, failed_attempt=True)


def test_compare_json_and_exit_code(store, capsys) -> None:
    root, _ = store
    r = gpuvet(capsys, "compare", "--results", root, "-p", "h200", "-p", "beta", "--json")
    assert r.returncode == 1, r.output  # a NO-GO provider is a failed check
    doc = json.loads(r.stdout)
    assert [v["verdict"] for v in doc["verdicts"]] == ["GO", "NO-GO"]
    titles = [t["title"] for t in doc["tables"]]
    assert "environment" in titles and "PoC cost" in titles and "cost per useful unit" in titles
    r = gpuvet(capsys, "compare", "--results", root, "-p", "h200")
    assert r.returncode == 0 and "GO" in r.stdout and "environment" in r.stdout


def test_report_writes_both_twins(store, capsys, tmp_path) -> None:
    root, _ = store
    out = tmp_path / "rep" / "report.md"
    r = gpuvet(capsys, "report", "--results", root, "-p", "h200", "-p", "beta", "-o", out)
    assert r.returncode == 0, r.output
    assert out.is_file() and out.with_suffix(".html").is_file()
    assert "h200: GO" in r.stderr and "beta: NO-GO" in r.stderr


def _nothing_written(d: Path) -> bool:
    return not d.exists() or not any(d.iterdir())


def test_bad_input_exits_2_and_writes_nothing(store, capsys, tmp_path) -> None:
    root, _ = store
    out = tmp_path / "rep"
    cases = [
        (["--runs", "20990101-000000-beef"], "no run 20990101-000000-beef"),
        (["-p", "gamma"], "no runs of provider gamma"),
        (["--rate", "euro"], "is not CUR=VALUE"),
    ]
    for extra, msg in cases:
        r = gpuvet(capsys, "report", "--results", root, *extra, "-o", out / "r.html")
        assert r.returncode == 2 and msg in r.stderr, r.output
        assert _nothing_written(out)
    r = gpuvet(capsys, "report", "--results", tmp_path / "none", "-o", out / "r.html")
    assert r.returncode == 2 and "no results under" in r.stderr and _nothing_written(out)
    r = gpuvet(capsys, "report", "--results", root, "-o", out / "r.pdf")
    assert r.returncode == 2 and _nothing_written(out)


def test_a_provider_without_a_price(tmp_path, capsys) -> None:
    inv = tmp_path / "inventory.yaml"
    text = INVENTORY.read_text()
    start = text.index("    pricing: {gpu_hour: 2.9")
    inv.write_text(text[:start] + text[text.index("    nodes:", start):])
    root = tmp_path / "results"
    build_store(root, inventory=inv)
    out = tmp_path / "rep"
    # cost is never a gate: beta is compared and reported, its cost "not priced"
    r = gpuvet(capsys, "report", "--results", root, "-o", out / "r.html")
    assert r.returncode == 0, r.output
    assert "not priced (add pricing" in (out / "r.md").read_text()
    doc = json.loads(gpuvet(capsys, "compare", "--results", root, "--json").stdout)
    costs = next(t for t in doc["tables"] if t["title"] == "PoC cost")["rows"]
    beta = [row for row in costs if row["provider"] == "beta"]
    assert beta and all(row["total"] == "not priced" and "0.00" not in json.dumps(row)
                        for row in beta)
    assert [v["verdict"] for v in doc["verdicts"] if v["provider"] == "beta"] == \
        [v["verdict"] for v in json.loads(gpuvet(capsys, "compare", "--results", root,
                                                 "--no-cost", "--json").stdout)["verdicts"]
         if v["provider"] == "beta"]  # the verdict does not depend on the cost
    r = gpuvet(capsys, "compare", "--results", root, "--no-cost", "--json")
    assert r.returncode == 1 and "PoC cost" not in r.stdout
    # prices given on the command line win over the runs' copies
    r = gpuvet(capsys, "compare", "--results", root, "-i", INVENTORY, "--json")
    assert r.returncode == 1 and "PoC cost" in r.stdout


def test_runs_of_different_suites_are_not_compared(tmp_path, capsys) -> None:
    root = tmp_path / "results"
    build_store(root, providers=("h200",))
    other = Suite().model_copy(update={"nccl": Suite().nccl.model_copy(update={"rounds": 5})})
    build_store(root, providers=("beta",), suite=other)
    r = gpuvet(capsys, "compare", "--results", root)
    assert r.returncode == 2
    assert "different suites" in r.stderr and "Suite(" not in r.stderr
    row = next(ln for ln in r.stderr.splitlines() if ln.strip().startswith("nccl.rounds"))
    assert [c.strip() for c in row.split("|")] == ["nccl.rounds", "3", "5"]
    assert len(r.stderr.splitlines()) < 10
    r = gpuvet(capsys, "report", "--results", root, "-o", tmp_path / "rep" / "r.html")
    assert r.returncode == 2 and not (tmp_path / "rep").exists()


def test_currencies_apart_without_a_rate(tmp_path, capsys) -> None:
    inv = tmp_path / "inventory.yaml"
    inv.write_text(INVENTORY.read_text().replace("gpu_hour: 2.9, currency: USD",
                                                 "gpu_hour: 2.9, currency: EUR"))
    root = tmp_path / "results"
    shutil.rmtree(root, ignore_errors=True)
    build_store(root, inventory=inv)
    doc = json.loads(gpuvet(capsys, "compare", "--results", root, "-p", "h200", "-p", "beta",
                            "--json").stdout)
    assert doc["currencies_apart"] == ["EUR"]
    cost = [r for r in next(t for t in doc["tables"] if t["title"] == "PoC cost")["rows"]
            if r["window"] == "gpuvet's steps"]
    assert cost[1]["total in USD"] == "no EUR->USD rate: shown apart"
    doc = json.loads(gpuvet(capsys, "compare", "--results", root, "-p", "h200", "-p", "beta",
                            "--rate", "EUR=1.1", "--json").stdout)
    cost = [r for r in next(t for t in doc["tables"] if t["title"] == "PoC cost")["rows"]
            if r["window"] == "gpuvet's steps"]
    # 2.9 x 2 GPUs x 2 h, x 1.1
    assert doc["currencies_apart"] == [] and cost[1]["total in USD"] == "12.76 USD"


def test_the_inventory_rate_converts_and_the_command_line_wins(tmp_path, capsys) -> None:
    inv = tmp_path / "inventory.yaml"
    text = INVENTORY.read_text().replace("gpu_hour: 2.9, currency: USD",
                                         "gpu_hour: 2.9, currency: EUR")
    inv.write_text(text)
    root = tmp_path / "results"
    build_store(root, inventory=inv)
    rated = tmp_path / "rated.yaml"
    rated.write_text(text.replace("version: 1\n", "version: 1\nsettings: {rates: {EUR: 1.1}}\n",
                                  1))
    doc = json.loads(gpuvet(capsys, "compare", "--results", root, "-p", "h200", "-p", "beta",
                            "-i", rated, "--json").stdout)
    cost = [r for r in next(t for t in doc["tables"] if t["title"] == "PoC cost")["rows"]
            if r["window"] == "gpuvet's steps"]
    assert doc["currencies_apart"] == [] and cost[1]["total in USD"] == "12.76 USD"
    doc = json.loads(gpuvet(capsys, "compare", "--results", root, "-p", "h200", "-p", "beta",
                            "-i", rated, "--rate", "EUR=1.0", "--json").stdout)
    cost = [r for r in next(t for t in doc["tables"] if t["title"] == "PoC cost")["rows"]
            if r["window"] == "gpuvet's steps"]
    assert cost[1]["total in USD"] == "11.60 USD"


def test_runs_takes_several_values_after_one_flag(store, capsys, tmp_path) -> None:
    """`--runs A B C` as the docs write it is the same as `--runs A --runs B --runs C`."""
    root, ids = store
    named = [ids["h200"]["nccl"], ids["beta"]["nccl"], ids["beta"]["train"]]
    one = gpuvet(capsys, "compare", "--results", root, "--runs", *named, "--json")
    many = gpuvet(capsys, "compare", "--results", root,
                  *[a for r in named for a in ("--runs", r)], "--json")
    assert one.returncode == many.returncode == 1, one.output
    assert json.loads(one.stdout) == json.loads(many.stdout)
    chosen = json.loads(one.stdout)["runs"]  # provider -> step -> run
    assert {r for steps in chosen.values() for r in steps.values()} == set(named)
    # the values stop at the next option; report's -o after them is report's
    out = tmp_path / "r.html"
    r = gpuvet(capsys, "report", "--results", root, "--runs", *named, "-o", out)
    assert r.returncode == 0 and out.is_file(), r.output
