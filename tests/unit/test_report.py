"""The report: self-contained HTML (inline SVG, inline CSS, nothing fetched), a Markdown
twin with the same rows, and nothing half-written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrator.analysis import compare
from orchestrator.report import render, write_report
from tests.unit.comparestore import build_store


@pytest.fixture(scope="module")
def comparison(tmp_path_factory: pytest.TempPathFactory) -> compare.Comparison:
    root = tmp_path_factory.mktemp("report") / "results"
    build_store(root, failed_attempt=True)
    return compare.build(root, ["h200", "beta"])


def test_html_is_self_contained(comparison, tmp_path) -> None:
    html, _ = render(comparison, tmp_path / "r.html")
    assert html.startswith("<!DOCTYPE html>")
    assert "<script" not in html and "<link" not in html and "@import" not in html
    # nothing that a browser would fetch: no src= at all, no url(...) outside data:
    assert not re.search(r"\ssrc=", html)
    assert not re.search(r"url\((?!#)", html)
    assert "http://" not in html.replace("http://www.w3.org/", "")
    assert "https://" not in html
    assert "@media print" in html and "default-src 'none'" in html
    assert html.count("<svg") == 6  # busbw, stability, losses, step times, telemetry, cost


def test_key_numbers_and_verdicts_are_in_both_twins(comparison, tmp_path) -> None:
    html, md = render(comparison, tmp_path / "r.html")
    for text in (html, md):
        assert "NO-GO" in text and "GO" in text
        assert "346.69" in text and "277.35" in text  # busbw medians at 4 GiB
        assert "570.133.20" in text and "580.159.04" in text and "DIFFERS" in text
        assert "TRAIN_RESTORE_MISMATCH" in text
        assert "19.93 USD" in text  # h200 PoC compute: 9.8 x 2 x 61 min
        assert "monthly above 612 h/month" in text
    assert md.count("\n## ") >= 8 and "| --- |" in md


def test_evidence_links_lead_to_the_files(comparison, tmp_path) -> None:
    html, _ = render(comparison, tmp_path / "r.html")
    hrefs = re.findall(r'<a href="([^"]+)"', html)
    assert hrefs
    for h in hrefs:
        assert (tmp_path / h).resolve().is_file(), h


def test_provider_names_and_messages_are_escaped(comparison, tmp_path, monkeypatch) -> None:
    f = comparison.findings[0]
    monkeypatch.setattr(f, "message", "<b>not bold</b>")
    monkeypatch.setattr(f, "severity", "FAIL")
    html, _ = render(comparison, tmp_path / "r.html")
    assert "&lt;b&gt;not bold&lt;/b&gt;" in html and "<b>not bold</b>" not in html


def test_an_error_while_rendering_writes_nothing(comparison, tmp_path, monkeypatch) -> None:
    from orchestrator.report import plots

    def boom(*a, **k):  # type: ignore[no-untyped-def]
        raise KeyboardInterrupt

    monkeypatch.setattr(plots, "cost_bars", boom)
    with pytest.raises(KeyboardInterrupt):
        write_report(comparison, tmp_path / "r.html", tmp_path / "r.md")
    assert list(tmp_path.iterdir()) == []


def test_written_files(comparison, tmp_path: Path) -> None:
    h, m = write_report(comparison, tmp_path / "r.html", tmp_path / "r.md")
    assert h.read_text().endswith("</html>\n") and m.read_text().startswith("# gpuvet: h200 vs beta")
