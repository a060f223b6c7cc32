"""gpuvet runs / show / export over a store of two providers."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pandas as pd
import pytest

from tests.unit.clirun import gpuvet
from tests.unit.comparestore import build_store


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, str]]]:
    root = tmp_path_factory.mktemp("runs") / "results"
    return root, build_store(root, failed_attempt=True)


def _digest(d: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(d.rglob("*")):
        if p.is_file():
            h.update(str(p).encode() + p.read_bytes())
    return h.hexdigest()


def test_runs_lists_every_run_with_its_verdict(store, capsys) -> None:
    root, ids = store
    r = gpuvet(capsys, "runs", "--results", root, "--json")
    assert r.returncode == 0, r.output
    rows = json.loads(r.stdout)
    assert [x["run"] for x in rows] == [ids["h200"]["preflight"], ids["h200"]["nccl"],
                                        ids["h200"]["train"], ids["beta"]["preflight"],
                                        ids["beta"]["failed"], ids["beta"]["nccl"],
                                        ids["beta"]["train"]]
    by = {x["run"]: x for x in rows}
    assert by[ids["beta"]["train"]]["verdict"] == "FAIL"
    assert by[ids["beta"]["failed"]]["status"] == "interrupted"
    assert by[ids["h200"]["nccl"]]["step"] == "nccl"
    assert by[ids["h200"]["nccl"]]["nodes"] == ["h200-host"]  # arrays, not joined text
    assert by[ids["h200"]["nccl"]]["providers"] == ["h200"]
    assert len(by[ids["h200"]["nccl"]]["inventory"]) == 12
    only = json.loads(gpuvet(capsys, "runs", "--results", root, "-p", "beta", "--json").stdout)
    assert {tuple(x["providers"]) for x in only} == {("beta",)} and len(only) == 4
    late = json.loads(gpuvet(capsys, "runs", "--results", root, "--since",
                             "2026-11-30T07:40:00Z", "--json").stdout)
    assert [x["run"] for x in late] == [ids["beta"]["train"]]
    text = gpuvet(capsys, "runs", "--results", root)
    assert ids["beta"]["train"] in text.stdout and "interrupted" in text.stdout


def test_runs_refuses_a_bad_date_and_an_empty_store(tmp_path, store, capsys) -> None:
    root, _ = store
    r = gpuvet(capsys, "runs", "--results", root, "--since", "yesterday")
    assert r.returncode == 2 and "is not a date" in r.stderr
    r = gpuvet(capsys, "runs", "--results", tmp_path / "none")
    assert r.returncode == 2 and "no results under" in r.stderr


def test_show_shows_again_without_touching_the_run(store, capsys) -> None:
    root, ids = store
    run_dir = root / ids["beta"]["nccl"]
    before = _digest(run_dir)
    r = gpuvet(capsys, "show", "--results", root, ids["beta"]["nccl"])
    assert r.returncode == 0, r.output
    assert "NCCL_REFERENCE" in r.stdout and "busbw" in r.stdout and "beta-1" in r.stdout
    j = json.loads(gpuvet(capsys, "show", "--results", root, ids["beta"]["nccl"],
                          "--json").stdout)
    assert j["verdicts"] == {"beta-1": "WARN"}
    busbw = [m for m in j["measurements"] if m["metric"] == "busbw"]
    assert busbw[0]["size"] == 4 << 30 and busbw[0]["n"] == 3
    assert busbw[0]["min"] <= busbw[0]["median"] <= busbw[0]["max"] < 280
    assert _digest(run_dir) == before
    r = gpuvet(capsys, "show", "--results", root, "20990101-000000-beef")
    assert r.returncode == 2 and "no run 20990101-000000-beef" in r.stderr


@pytest.mark.parametrize(("fmt", "name"), [("csv", "out"), ("parquet", "out"),
                                           ("parquet", "x.parquet"), ("json", "out.json")])
def test_export_tidy_tables(tmp_path, store, capsys, fmt, name) -> None:
    root, ids = store
    runs = [ids["h200"]["preflight"], ids["h200"]["nccl"]]
    dest = tmp_path / name
    r = gpuvet(capsys, "export", "--results", root, *runs, "--format", fmt, "-o", dest)
    assert r.returncode == 0, r.output
    if fmt == "json":
        doc = json.loads(dest.read_text())
        tables = {k: pd.DataFrame(v) for k, v in doc.items()}
        ms_doc = doc["measurements"][0]
        assert isinstance(ms_doc["tags"], dict)  # not JSON inside a string
        assert isinstance(doc["findings"][0]["details"], dict)
        assert isinstance(doc["runs"][0]["providers"], list)
    elif name.endswith(".parquet"):
        # the files --help names: x.<table>.parquet beside -o, each read back as its table
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("x.")) == [
            f"x.{t}.parquet" for t in ("environment", "findings", "measurements", "runs")]
        tables = {t: pd.read_parquet(tmp_path / f"x.{t}.parquet")
                  for t in ("runs", "findings", "measurements", "environment")}
    else:
        read = pd.read_csv if fmt == "csv" else pd.read_parquet
        tables = {p.stem: read(p) for p in dest.iterdir()}
    assert set(tables) == {"runs", "findings", "measurements", "environment"}
    ms = tables["measurements"]
    assert set(ms["run_id"]) == {ids["h200"]["nccl"]}
    # one row per observation: each size x round x in/out-of-place x metric once
    assert len(ms) == len(ms.drop_duplicates(["size", "round", "inplace", "metric"]))
    assert not [c for c in ms.columns if ms[c].isna().all()]  # all-null columns dropped
    if fmt == "json":
        assert "tags" in ms.columns
    else:  # tags spread into typed columns
        assert "tags.gpus" in ms.columns and "tags" not in ms.columns
        assert pd.api.types.is_numeric_dtype(ms["tags.gpus"])
    if fmt == "parquet":
        assert pd.api.types.is_datetime64_any_dtype(tables["runs"]["started"])
        assert list(tables["runs"]["providers"].iloc[0]) == ["h200"]
        assert not any(isinstance(v, str) and v.startswith("{")
                       for c in tables["findings"].columns for v in tables["findings"][c])
    env = tables["environment"]
    assert set(env["run_id"]) == set(runs)
    assert env[(env.key == "driver")]["value"].tolist() == ["580.159.04"]
    fs = tables["findings"]
    assert "GPU_MODEL" in set(fs["code"])
    assert any("raw/query_gpu.txt" in str(e) for e in fs["evidence"])


def test_export_writes_nothing_on_bad_input(tmp_path, store, capsys) -> None:
    root, ids = store
    dest = tmp_path / "out"
    r = gpuvet(capsys, "export", "--results", root, ids["h200"]["nccl"],
               "20990101-000000-beef", "-o", dest)
    assert r.returncode == 2 and "20990101-000000-beef" in r.stderr
    assert not dest.exists()
    dest.mkdir()
    (dest / "keep.txt").write_text("mine")
    r = gpuvet(capsys, "export", "--results", root, ids["h200"]["nccl"], "-o", dest)
    assert r.returncode == 2 and "exists; an export never overwrites" in r.stderr
    assert [p.name for p in dest.iterdir()] == ["keep.txt"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]


def test_an_unknown_provider_or_run_is_exit_2_with_the_nearest_name(store, capsys) -> None:
    root, ids = store
    r = gpuvet(capsys, "runs", "--results", root, "-p", "nosuch")
    assert r.returncode == 2 and r.stdout == ""  # not an empty table with exit 0
    assert r.stderr.startswith(f"error: no runs of provider nosuch under {root} "
                               "(providers with runs: beta, h200)")
    r = gpuvet(capsys, "runs", "--results", root, "-p", "h200", "-p", "betta")
    assert r.returncode == 2 and "provider betta under" in r.stderr
    assert "(did you mean 'beta'?)" in r.stderr
    typo = ids["beta"]["nccl"][:-1] + ("x" if not ids["beta"]["nccl"].endswith("x") else "y")
    for argv in (["show", typo], ["export", typo, "-o", "unused"],
                 ["compare", "--runs", typo]):
        r = gpuvet(capsys, *argv, "--results", root)
        assert r.returncode == 2, (argv, r.output)
        assert f"no run {typo}" in r.stderr and f"(did you mean '{ids['beta']['nccl']}'?)" \
            in r.stderr, (argv, r.stderr)
    r = gpuvet(capsys, "compare", "--results", root, "-p", "h200", "-p", "betaa")
    assert r.returncode == 2 and "betaa (did you mean 'beta'?)" in r.stderr


def test_show_latest_is_the_newest_run(store, capsys) -> None:
    root, ids = store
    newest = json.loads(gpuvet(capsys, "runs", "--results", root, "--json").stdout)[-1]["run"]
    assert newest == ids["beta"]["train"]
    r = gpuvet(capsys, "show", "--results", root, "latest", "--json")
    assert r.returncode == 0, r.output
    assert json.loads(r.stdout)["run_id"] == newest
    text = gpuvet(capsys, "show", "--results", root, "latest")
    assert text.returncode == 0 and text.stdout.startswith(f"run {newest}: ")


@pytest.mark.parametrize("fmt", ["csv", "parquet", "json"])
def test_export_keeps_integers_lists_and_units_apart(tmp_path, store, capsys, fmt) -> None:
    """With training metrics beside nccl rounds (no size, no round), integers stayed
    integers only where every row had one: `size` 8.0, `tags.gpus` 2.0. A measurement's
    nodes were joined text while a run's were a list; "140.4 GiB" held its unit inside."""
    import csv

    root, ids = store
    runs = [ids["h200"]["preflight"], ids["h200"]["nccl"], ids["h200"]["train"]]
    dest = tmp_path / ("out.json" if fmt == "json" else "out")
    r = gpuvet(capsys, "export", "--results", root, *runs, "--format", fmt, "-o", dest)
    assert r.returncode == 0, r.output
    int_columns = ("size", "round", "tags.gpus")
    if fmt == "json":
        doc = json.loads(dest.read_text())
        ms, env = doc["measurements"], doc["environment"]
        nccl = [m for m in ms if m["step"] == "nccl"]
        assert {type(m["size"]) for m in nccl} == {type(m["round"]) for m in nccl} == {int}
        assert {type(m["tags"]["gpus"]) for m in nccl} == {int}
        assert {m["size"] for m in ms if m["step"] == "train"} == {None}
        assert {tuple(m["nodes"]) for m in ms} == {("h200-host",)}
        assert doc["runs"][0]["nodes"] == ["h200-host"]
        mem = [e for e in env if e["key"] == "gpu_memory"]
    elif fmt == "csv":
        with (dest / "measurements.csv").open() as fh:
            rows = list(csv.DictReader(fh))
        for c in int_columns:  # "8", never "8.0"; empty where a row has none
            assert all(v == "" or v.isdigit() for v in (row[c] for row in rows)), c
            assert any(row[c] for row in rows) and any(not row["size"] for row in rows)
        assert {row["nodes"] for row in rows} == {"h200-host"}  # lists joined as runs' are
        with (dest / "environment.csv").open() as fh:
            mem = [e for e in csv.DictReader(fh) if e["key"] == "gpu_memory"]
    else:
        ms = pd.read_parquet(dest / "measurements.parquet")
        for c in int_columns:
            assert str(ms[c].dtype) == "Int64", (c, ms[c].dtype)
        assert ms["size"].isna().any() and ms["size"].max() == 4 << 30
        assert {tuple(v) for v in ms["nodes"]} == {("h200-host",)}
        mem = pd.read_parquet(dest / "environment.parquet").query(
            "key == 'gpu_memory'").to_dict("records")
    assert [(e["value"], e["unit"]) for e in mem] == [("140.4", "GiB")]
