"""`gpuvet import nccl-tests`: manual runs into the results store, judged like live ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.clirun import gpuvet

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
ROUNDS = [FIXTURES / "h200x2" / "nccl-tests" / f"all_reduce_8B-128M_g2_round{r}.log"
          for r in (1, 2, 3)]
CRASH = FIXTURES / "nccl-tests" / "all_reduce_2node-h100_crash-truncated.log"


def the_run(results: Path) -> Path:
    runs = [d for d in results.iterdir() if d.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


def test_import_three_rounds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results"
    proc = gpuvet(capsys, "import", "nccl-tests", *ROUNDS, "-p", "lab", "--results", results)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "busbw at 128 MiB: median 285.3 GB/s over 3 round(s)" in proc.stdout
    assert "450 measurements" in proc.stdout
    run_dir = the_run(results)
    lines = (run_dir / "measurements.jsonl").read_text().splitlines()
    assert len(lines) == 450
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["status"] == "passed"
    assert meta["command"] == "import nccl-tests"
    first = json.loads(lines[0])
    assert first["provider"] == "lab" and first["suite_hash"] == meta["suite_hash"]
    assert {json.loads(ln)["round"] for ln in lines} == {1, 2, 3}
    # the logs are copied into the run, as evidence
    copies = sorted(p.name for p in (run_dir / "providers" / "lab" / "imported").iterdir())
    # and the import is marked done once every record is stored
    assert copies == ["done.json"] + [f"round{i}_{p.name}" for i, p in enumerate(ROUNDS, 1)]
    findings = [json.loads(ln) for ln in (run_dir / "findings.jsonl").read_text().splitlines()]
    assert {f["code"] for f in findings} >= {"NCCL_BUSBW", "NCCL_REFERENCE"}
    assert all(f["scope"] == "provider" and f["provider"] == "lab" for f in findings)
    assert not [f for f in findings if f["severity"] == "FAIL"]


def test_import_crash_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results"
    proc = gpuvet(capsys, "import", "nccl-tests", CRASH, "-p", "lab", "--results", results)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "NCCL_TRUNCATED" in proc.stdout
    meta = json.loads((the_run(results) / "run.json").read_text())
    assert meta["status"] == "failed"


def test_import_missing_file_exits_2(tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results"
    missing = tmp_path / "nope.log"
    proc = gpuvet(capsys, "import", "nccl-tests", ROUNDS[0], missing, "-p", "lab", "--results", results)
    assert proc.returncode == 2
    assert "no such file" in proc.stdout + proc.stderr
    assert str(missing) in proc.stdout + proc.stderr
    assert not results.exists() or not [d for d in results.iterdir() if d.is_dir()]


def test_import_derives_the_suite_hash_from_the_logs(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Different experiments never share a hash; the same one always does."""
    results = tmp_path / "results"
    assert gpuvet(capsys, "import", "nccl-tests", ROUNDS[0], "-p", "a", "--results",
                  results).returncode == 0
    other = tmp_path / "iters50.log"
    other.write_text(ROUNDS[1].read_text().replace("iters: 20 ", "iters: 50 "))
    assert gpuvet(capsys, "import", "nccl-tests", other, "-p", "b", "--results",
                  results).returncode == 0
    same = tmp_path / "copy3.log"
    same.write_text(ROUNDS[2].read_text())
    assert gpuvet(capsys, "import", "nccl-tests", same, "-p", "c", "--results",
                  results).returncode == 0
    metas = {json.loads((d / "run.json").read_text())["providers"][0]:
             json.loads((d / "run.json").read_text()) for d in results.iterdir() if d.is_dir()}
    assert metas["a"]["suite_hash"] != metas["b"]["suite_hash"]
    assert metas["a"]["suite_hash"] == metas["c"]["suite_hash"]
    assert metas["b"]["suite"]["imported"]["params"]["iters"] == 50


def test_import_refuses_mixed_experiments(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results"
    other = tmp_path / "g4.log"
    other.write_text(ROUNDS[1].read_text().replace("nGpus 2 ", "nGpus 4 "))
    proc = gpuvet(capsys, "import", "nccl-tests", ROUNDS[0], other, "-p", "lab", "--results",
                  results)
    assert proc.returncode == 2
    assert "another experiment" in proc.output and "n_gpus" in proc.output
    assert not results.exists() or not [d for d in results.iterdir() if d.is_dir()]


def test_import_twice_is_recognised(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results"
    first = gpuvet(capsys, "import", "nccl-tests", *ROUNDS, "-p", "lab", "--results", results)
    assert first.returncode == 0
    again = gpuvet(capsys, "import", "nccl-tests", ROUNDS[1], "-p", "lab", "--results", results)
    assert again.returncode == 0
    assert "already imported" in again.output and "nothing new" in again.output
    assert len([d for d in results.iterdir() if d.is_dir()]) == 1


def test_logs_imported_under_one_provider_are_refused_under_another(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # one log measures one platform: under a second name it would be compared with itself
    results = tmp_path / "results"
    assert gpuvet(capsys, "import", "nccl-tests", *ROUNDS, "-p", "a", "--results",
                  results).returncode == 0
    run = the_run(results)
    other = gpuvet(capsys, "import", "nccl-tests", ROUNDS[2], "-p", "b", "--results", results)
    assert other.returncode == 2
    assert f"already imported under provider a (run {run.name}), not b" in other.output
    assert "another --results folder" in other.output
    assert the_run(results) == run and not (run / "providers" / "b").exists()


@pytest.mark.parametrize("content", ["hello world\n", "\x00\x01\x02garbage", "{\"version\": 1}"])
def test_import_of_something_else_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               content: str) -> None:
    results = tmp_path / "results"
    bad = tmp_path / "notalog.txt"
    bad.write_text(content)
    proc = gpuvet(capsys, "import", "nccl-tests", bad, "-p", "lab", "--results", results)
    assert proc.returncode == 2, proc.output
    assert str(bad) in proc.output
    assert not results.exists() or not [d for d in results.iterdir() if d.is_dir()]


def test_an_imported_log_keeps_no_secret(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                         ) -> None:
    """A log saved from a shell session: the environment it printed is scrubbed in the copy
    the run keeps, in the finding that quotes the line and in the index."""
    hf = "hf_" + "Zy9Xw8Vu7Ts6" * 2
    wandb = "wb" + "0a1b2c3d" * 3
    log = tmp_path / "round1.log"
    log.write_text(f"+ export HF_TOKEN={hf} WANDB_API_KEY={wandb}\n"
                   + ROUNDS[0].read_text())
    results = tmp_path / "results"
    res = gpuvet(capsys, "import", "nccl-tests", "-p", "lab", "--results", results, log)
    assert res.returncode == 0, res.output
    files = [p for p in results.rglob("*") if p.is_file()]
    assert any(b"HF_TOKEN=***" in p.read_bytes() for p in files)  # the line was kept
    for secret in (hf, wandb):
        assert [p for p in files if secret.encode() in p.read_bytes()] == [], secret
        assert secret not in res.output


def _runs_row(capsys: pytest.CaptureFixture[str], results: Path, run_id: str) -> dict[str, str]:
    proc = gpuvet(capsys, "runs", "--results", results, "--json")
    assert proc.returncode == 0, proc.output
    (row,) = [r for r in json.loads(proc.stdout) if r["run"] == run_id]
    return row


def test_an_import_cut_short_is_not_done_and_is_completed_again(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk fills after part of the measurements: exit 3, the run is not done, `runs`
    gives it no verdict; the same import again stores every measurement and finishes it."""
    import errno

    from orchestrator import store
    from orchestrator.files import append_lines, store_error

    def half_then_full(path: Path, lines: list[str], *, sync: bool = True) -> None:
        if path.name == "measurements.jsonl":
            append_lines(path, lines[:len(lines) // 2], sync=sync)
            raise store_error(OSError(errno.ENOSPC, "No space left on device"), path)
        append_lines(path, lines, sync=sync)

    results = tmp_path / "results"
    monkeypatch.setattr(store, "append_lines", half_then_full)
    cut = gpuvet(capsys, "import", "nccl-tests", *ROUNDS, "-p", "lab", "--results", results)
    assert cut.returncode == 3, cut.output
    assert "results disk is full" in cut.output
    run_dir = the_run(results)
    assert len((run_dir / "measurements.jsonl").read_text().splitlines()) == 225
    assert not (run_dir / "providers" / "lab" / "imported" / "done.json").exists()
    row = _runs_row(capsys, results, run_dir.name)
    assert row["status"] == "error" and row["verdict"] == "-"  # never PASS

    monkeypatch.setattr(store, "append_lines", append_lines)  # space is free again
    again = gpuvet(capsys, "import", "nccl-tests", *ROUNDS, "-p", "lab", "--results", results)
    assert again.returncode == 0, again.output
    assert "did not finish" in again.output and "450 measurements" in again.output
    assert the_run(results) == run_dir  # the same run, completed
    lines = (run_dir / "measurements.jsonl").read_text().splitlines()
    assert len(lines) == 450 and len(set(lines)) == 450
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["status"] == "passed"
    assert (run_dir / "providers" / "lab" / "imported" / "done.json").is_file()
    from orchestrator.index import Index

    assert Index(results).counts(run_dir.name)[1] == 450
    row = _runs_row(capsys, results, run_dir.name)
    assert row["status"] == "passed" and row["verdict"] in ("PASS", "WARN")
    third = gpuvet(capsys, "import", "nccl-tests", *ROUNDS, "-p", "lab", "--results", results)
    assert third.returncode == 0 and "already imported" in third.output
