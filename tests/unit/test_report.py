"""The report: self-contained HTML (inline SVG, inline CSS, nothing fetched), a Markdown
twin with the same rows, and nothing half-written."""

from __future__ import annotations

import dataclasses
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


HOSTILE = ("<script>alert(1)</script>", '<img src=x onerror="alert(2)">',
           "[x](javascript:alert(3))", "![y](javascript:alert(4))", "`code` | cell *em*")


@pytest.mark.parametrize("text", HOSTILE)
def test_the_markdown_twin_escapes_every_string(comparison, tmp_path, monkeypatch,
                                                text) -> None:
    """Every viewer renders Markdown as HTML: an inventory or PoC string (a finding's
    message, a node's GPU name) must reach it as text, never as a tag or a link."""
    f = comparison.findings[0]
    monkeypatch.setattr(f, "message", text)
    monkeypatch.setattr(f, "severity", "FAIL")
    i = next(i for i, t in enumerate(comparison.tables) if t.title == "environment")
    env = comparison.tables[i]
    tables = list(comparison.tables)
    tables[i] = dataclasses.replace(env, rows=[("GPU model", text, text, "DIFFERS"),
                                               *env.rows[1:]])
    monkeypatch.setattr(comparison, "tables", tables)
    _, md = render(comparison, tmp_path / "r.html")
    line = next(ln for ln in md.splitlines() if ln.startswith("| ") and "FAIL" in ln
                and ("&lt;" in ln or "&#91;" in ln or "&#96;" in ln))
    assert text not in md
    assert "<script" not in md and "<img" not in md and "onerror=\"" not in md
    assert "](javascript:" not in md and "javascript:" not in md.replace(
        "&#91;x&#93;(javascript:", "").replace("&#91;y&#93;(javascript:", "")
    assert line.count(" | ") == 5  # the findings row: the value's | split no cell
    import html as html_mod

    shown = html_mod.unescape(md)  # what a viewer shows: the characters, as text
    assert text.replace("|", "") in shown.replace("|", "")


def test_links_are_http_or_relative_only() -> None:
    from orchestrator.report import safe_href

    assert safe_href("../results/run/nodes/a/preflight/raw/query_gpu.txt") == \
        "../results/run/nodes/a/preflight/raw/query_gpu.txt"
    assert safe_href("https://example.org/x") == "https://example.org/x"
    assert safe_href("a b/(c).txt") == "a%20b/%28c%29.txt"
    for bad in ("javascript:alert(1)", "JavaScript:alert(1)", " javascript:x", "data:text/html,x",
                "file:///etc/passwd", "//evil.example/x", "vbscript:x"):
        assert safe_href(bad) is None, bad


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


def test_step_time_plot_shows_the_fastest_kernels_steps_where_the_run_has_them(tmp_path
                                                                                ) -> None:
    """The plot shows the steps the headline figures come from: the reference's steps on
    the fastest kernels, else (an older run, or throughput_steps: 0) its verified steps."""
    import json

    from orchestrator.report import plots

    def write(run: Path, events: list[dict]) -> None:
        d = run / "nodes" / "a" / "train" / "reference" / "a"
        d.mkdir(parents=True)
        (d / "rank0.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))

    verified = [{"event": "step", "step": k, "loss": "1.0", "step_time_s": 0.3}
                for k in (1, 2, 3)]
    fast = [{"event": "throughput_step", "step": k, "loss": "1.0", "step_time_s": 0.2}
            for k in (5, 6)]
    write(tmp_path / "new", [*verified, {"event": "throughput", "first_step": 4}, *fast])
    write(tmp_path / "old", verified)
    new, old = plots.train_steps(tmp_path / "new"), plots.train_steps(tmp_path / "old")
    assert [s["step"] for s in new["reference"]] == [1, 2, 3]
    assert [s["step"] for s in new["throughput"]] == [5, 6]
    assert "throughput" not in old
    assert plots.step_time_samples({"p": new, "q": old}) == {"p": [0.2, 0.2],
                                                            "q": [0.3, 0.3, 0.3]}
