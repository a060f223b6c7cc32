"""The Prometheus textfile: parseable by Prometheus' own parser, written atomically."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from orchestrator import prom
from orchestrator.analysis import regress
from orchestrator.errors import UsageError
from orchestrator.records import finding
from orchestrator.store import RunMeta
from tests.bench.regress_bench import make_history

LINE = re.compile(r'^(# (HELP|TYPE) gpuvet_\w+ .*|'
                  r'gpuvet_\w+(\{(\w+="(?:[^"\\\n]|\\.)*",?)*\})? [-+0-9.eInfNa]+)$')


def _families(text: str) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_hostile_label_values_are_escaped_and_parse_back() -> None:
    f = prom.Family("gpuvet_test", 'help with \\ and\nnewline')
    evil = 'a"b\\c\nd}{'
    f.add(1.5, provider=evil, node="n1")
    text = prom.render([f])
    assert all(LINE.match(line) for line in text.splitlines()), text
    (fam,) = text_string_to_metric_families(text)
    (sample,) = fam.samples
    assert sample.labels == {"provider": evil, "node": "n1"} and sample.value == 1.5


def test_names_and_labels_are_checked() -> None:
    with pytest.raises(ValueError, match="not a gpuvet metric name"):
        prom.render([prom.Family("node_load1", "x")])
    bad = prom.Family("gpuvet_x", "x")
    bad.add(1, **{"le-gal": "no"})
    with pytest.raises(ValueError, match="not a label name"):
        prom.render([bad])
    with pytest.raises(ValueError, match="given twice"):
        prom.render([prom.Family("gpuvet_x", "x"), prom.Family("gpuvet_x", "y")])


def test_a_regressed_run_in_the_textfile(tmp_path: Path) -> None:
    root = tmp_path / "results"
    make_history(root, 12, shift_at=11, shift=0.9)
    ev = regress.evaluate(root)
    path = tmp_path / "gpuvet.prom"
    prom.write(path, [*prom.regress_families(ev), prom.written_family()])
    text = path.read_text()
    assert all(LINE.match(line) for line in text.splitlines()), text
    fams = _families(text)
    assert all(name.startswith("gpuvet_") for name in fams)
    for name in fams:
        assert f"# HELP {name} " in text and f"# TYPE {name} gauge" in text
    verdicts = {s.labels["verdict"]: s.value for s in fams["gpuvet_regress_verdict"].samples}
    assert verdicts == {"REGRESSED": 1, "IMPROVED": 0, "UNCHANGED": 0, "NOT ENOUGH DATA": 0}
    (reg,) = fams["gpuvet_regress_regressed"].samples
    assert reg.labels == {"provider": "lab"} and reg.value == 1
    change = [s for s in fams["gpuvet_series_change_ratio"].samples
              if s.labels["node"] == "" and s.labels["size_bytes"] == "134217728"]
    assert len(change) == 1 and -0.12 < change[0].value < -0.08
    # base units in the names, no unit label, no label saying the provider twice
    busbw = [s for s in fams["gpuvet_series_mean_bytes_per_second"].samples
             if s.labels["metric"] == "busbw" and s.labels["size_bytes"] == "134217728"
             and s.labels["node"] == ""]
    assert len(busbw) == 1 and busbw[0].value > 1e9  # GB/s written as bytes per second
    for fam in fams.values():
        for smp in fam.samples:  # type: ignore[attr-defined]
            assert "unit" not in smp.labels and "subject" not in smp.labels
            assert not any(str(v).startswith(("provider:", "node:"))
                           for v in smp.labels.values())
    assert "gpuvet_series_mean " not in text and "gpuvet_series_mean{" not in text
    assert "run_id" not in text  # a label that would start new series at every run
    assert os.stat(path).st_mode & 0o777 == 0o644
    assert [p.name for p in tmp_path.iterdir() if p.name != "results"] == ["gpuvet.prom"]


def test_run_figures() -> None:
    meta = RunMeta(run_id="20260101-000000-abcd", started="2026-01-01T00:00:00Z",
                   finished="2026-01-01T00:10:00Z", command="pipeline", suite_hash="h",
                   suite={}, gpuvet_version="0", path="/x", status="failed")
    fs = [finding(meta.run_id, "nccl", provider="lab", node="n1", code="X", severity="FAIL",
                  message="m"),
          finding(meta.run_id, "nccl", provider="lab", node=None, code="Y", severity="PASS",
                  message="m")]
    fams = _families(prom.render(prom.run_families(meta, fs)))
    (info,) = fams["gpuvet_run_info"].samples
    assert info.labels == {"run_id": meta.run_id, "command": "pipeline", "suite_hash": "h",
                           "status": "failed"}
    assert fams["gpuvet_run_start_timestamp_seconds"].samples[0].value == 1767225600
    assert fams["gpuvet_run_duration_seconds"].samples[0].value == 600
    assert fams["gpuvet_run_success"].samples[0].value == 0
    counts = {s.labels["severity"]: s.value for s in fams["gpuvet_findings"].samples}
    assert counts == {"FAIL": 1, "WARN": 0, "PASS": 1, "INFO": 0}


def test_a_path_the_collector_would_not_read_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="only\\s+files ending in .prom"):
        prom.check_path(tmp_path / "gpuvet.txt")
    with pytest.raises(UsageError, match="no such directory"):
        prom.check_path(tmp_path / "nope" / "gpuvet.prom")
    assert prom.check_path(tmp_path / "gpuvet.prom") == tmp_path / "gpuvet.prom"


def test_a_failed_write_leaves_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                            ) -> None:
    path = tmp_path / "gpuvet.prom"
    path.write_text("# old\n")

    def boom(*a: object, **k: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(Exception, match="disk is full"):
        prom.write(path, [prom.written_family()])
    assert path.read_text() == "# old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpuvet.prom"]
