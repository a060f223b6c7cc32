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
from tests.unit.twoorders import two_orders_store


@pytest.fixture(scope="module")
def comparison(tmp_path_factory: pytest.TempPathFactory) -> compare.Comparison:
    root = tmp_path_factory.mktemp("report") / "results"
    build_store(root, failed_attempt=True)
    return compare.build(root, ["h200", "beta"])


@pytest.fixture
def no_plots(monkeypatch: pytest.MonkeyPatch) -> None:
    """The text of the twins without drawing (matplotlib takes seconds a report)."""
    from orchestrator.report import plots

    for name in ("busbw", "stability", "losses", "step_times", "telemetry", "cost_bars"):
        monkeypatch.setattr(plots, name, lambda *a, **k: '<svg viewBox="0 0 1 1"></svg>')


@pytest.fixture(scope="module")
def two_orders(tmp_path_factory: pytest.TempPathFactory) -> compare.Comparison:
    root = two_orders_store(tmp_path_factory.mktemp("two-orders") / "results")
    return compare.build(root, ["h100", "h200"])


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


def test_key_numbers_and_verdicts_are_in_both_twins(comparison, tmp_path, no_plots) -> None:
    html, md = render(comparison, tmp_path / "r.html")
    for text in (html, md):
        assert "NO-GO" in text and "GO" in text
        assert "346.69" in text and "277.35" in text  # busbw medians at 4 GiB
        assert "570.133.20" in text and "580.159.04" in text and "DIFFERS" in text
        assert "TRAIN_RESTORE_MISMATCH" in text
        assert "19.93 USD" in text  # h200 PoC compute: 9.8 x 2 x 61 min
        assert "monthly above 612 h/month" in text
    assert md.count("\n## ") >= 8 and "| --- |" in md


def test_evidence_links_lead_to_the_files(comparison, tmp_path, no_plots) -> None:
    html, _ = render(comparison, tmp_path / "r.html")
    hrefs = re.findall(r'<a [^>]*href="([^"]+)"', html)
    assert hrefs
    for h in hrefs:
        assert (tmp_path / h).resolve().is_file(), h


def test_provider_names_and_messages_are_escaped(comparison, tmp_path, no_plots, monkeypatch) -> None:
    f = comparison.findings[0]
    monkeypatch.setattr(f, "message", "<b>not bold</b>")
    monkeypatch.setattr(f, "severity", "FAIL")
    html, _ = render(comparison, tmp_path / "r.html")
    assert "&lt;b&gt;not bold&lt;/b&gt;" in html and "<b>not bold</b>" not in html


HOSTILE = ("<script>alert(1)</script>", '<img src=x onerror="alert(2)">',
           "[x](javascript:alert(3))", "![y](javascript:alert(4))", "`code` | cell *em*",
           "gpuvet's [single] -> _x_ & &amp; ~~no~~ <b>", "a\\ back\\slash")


def _markdown_html(md: str) -> str:
    """What a viewer makes of the twin: CommonMark with GitHub's tables."""
    from markdown_it import MarkdownIt

    return str(MarkdownIt("commonmark").enable("table").render(md))


@pytest.mark.parametrize("text", HOSTILE)
def test_the_markdown_twin_escapes_every_string(comparison, tmp_path, no_plots, monkeypatch,
                                                text) -> None:
    """Every viewer renders Markdown as HTML: an inventory or PoC string (a finding's
    message, a node's GPU name) must reach it as text, never as a tag, a link, emphasis
    or a table cell, and the text must read as written."""
    f = comparison.findings[0]
    monkeypatch.setattr(f, "message", text)
    monkeypatch.setattr(f, "severity", "FAIL")
    i = next(i for i, t in enumerate(comparison.tables) if t.title == "environment")
    env = comparison.tables[i]
    tables = list(comparison.tables)
    tables[i] = dataclasses.replace(env, rows=[("GPU model", "-", text, "-", text, "DIFFERS"),
                                               *env.rows[1:]])
    monkeypatch.setattr(comparison, "tables", tables)
    _, md = render(comparison, tmp_path / "r.html")
    assert text not in md
    shown = _markdown_html(md)
    for tag in ("<script", "<img", "<b>", "<em>", "<del>", "<s>", "<code>", "=\"javascript:"):
        assert tag not in shown, tag
    assert not re.search(r'<a href="(?!\.\.?/|[\w.-]+/)', shown)  # only links to evidence
    # the finding's row: six cells, the value's | split none, and the value reads as written
    rows = re.findall(r"<tr>\s*((?:<td>.*?</td>\s*)+)</tr>", shown, flags=re.S)
    mine = [r for r in rows if "FAIL" in r and "<td>" in r]
    import html as html_mod

    cells = [re.findall(r"<td>(.*?)</td>", r, flags=re.S) for r in mine]
    assert any(len(c) == 6 and html_mod.unescape(c[5]) == text for c in cells), cells
    env_cells = [c for c in (re.findall(r"<td>(.*?)</td>", r, flags=re.S) for r in rows)
                 if c and c[0] == "GPU model"]
    assert env_cells and html_mod.unescape(env_cells[0][2]) == text, env_cells


ENTITY = re.compile(r"&(#\d+|#x[0-9a-fA-F]+|[A-Za-z][A-Za-z0-9]*);")


def test_the_markdown_twin_holds_no_html_entity(two_orders, tmp_path, no_plots) -> None:
    """The twin of a real comparison: an apostrophe, brackets and an arrow as written,
    escaped for Markdown where they are syntax, never as HTML character references."""
    _, md = render(two_orders, tmp_path / "r.html")
    assert not ENTITY.search(md), ENTITY.search(md)
    assert "gpuvet's steps" in md and "\\[single\\]" in md and "-\\> 8.1143" in md
    assert "CKPT_NOT_PERSISTENT" in md  # a code reads as written: _ between letters stays
    shown = _markdown_html(md)
    assert "[single]" in shown and "-&gt; 8.1143" in shown  # the viewer shows the characters


CONTROLS = "GPU\x1b[31mred\x07 \x9b2J \u202eevil\u2066 \x00"
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def test_control_characters_are_written_out_in_both_twins(comparison, tmp_path, no_plots,
                                                          monkeypatch) -> None:
    """An escape sequence, a bell, a C1 control or a bidi override in a GPU name of a PoC
    folder or a finding reaches neither twin raw: both show it as the terminal does."""
    from orchestrator.render import terminal_text

    f = comparison.findings[0]
    monkeypatch.setattr(f, "message", CONTROLS)
    monkeypatch.setattr(f, "code", CONTROLS)  # a cell no path may be in
    monkeypatch.setattr(f, "severity", "FAIL")
    i = next(i for i, t in enumerate(comparison.tables) if t.title == "environment")
    tables = list(comparison.tables)
    tables[i] = dataclasses.replace(tables[i], rows=[
        ("GPU model", "-", CONTROLS, "-", "x", "DIFFERS"), *tables[i].rows[1:]])
    monkeypatch.setattr(comparison, "tables", tables)
    html, md = render(comparison, tmp_path / "r.html")
    for text in (html, md):
        assert not RAW.search(text), RAW.search(text)
    written = terminal_text(CONTROLS)
    assert written.count("\\") == 6
    assert html.count("GPU\\x1b[31mred\\x07 \\x9b2J \\u202eevil\\u2066 \\x00") == 3
    assert "GPU\\x1b[31mred\\x07 \\x9b2J \\u202eevil\\u2066 \\x00" in \
        _markdown_html(md)  # what a Markdown viewer shows


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


def test_written_files(comparison, tmp_path, no_plots: Path) -> None:
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


def _text(html: str) -> str:
    """The HTML's text: tags dropped, references read."""
    import html as html_mod

    return html_mod.unescape(re.sub(r"<[^>]+>", "", html))


def test_the_headlines_open_both_twins(two_orders, tmp_path, no_plots) -> None:
    """Each provider's verdict, its decisive reasons and its cost come first, NO-GO
    first; then what is not OK with whose side it is and the fix; what passed is folded."""
    html, md = render(two_orders, tmp_path / "r.html")
    body = html.split("<body>", 1)[1]
    assert body.index('id="headlines"') < body.index('id="not-ok"') < body.index(
        'id="passed"') < body.index("<table")
    heads = _text(body.split('id="headlines"', 1)[1].split("</section>", 1)[0])
    assert heads.index("h200: NO-GO") < heads.index("h100: NOT ENOUGH EVIDENCE")
    assert "delivered NVIDIA H100 80GB HBM3, ordered H200" in heads
    assert "point ckpt_dir of h100-n1 at a directory outside /tmp" in heads
    assert heads.count("PoC cost") == 2 and "2.49 USD per GPU-hour, billed per second" in heads
    assert re.search(r'<details id="passed"><summary>Checks that passed: ', body)
    not_ok = _text(body.split('id="not-ok"', 1)[1].split('id="passed"', 1)[0])
    assert "card and memory as ordered: no-go (the provider's side)" in not_ok
    assert "storage persistent: not proven (the setup's side)" in not_ok
    assert "Fix: point ckpt_dir of h200-n1" in not_ok
    assert "MIG as ordered" not in not_ok  # an ok line is folded away
    sections = [ln for ln in md.splitlines() if ln.startswith("## ")]
    assert sections[:3] == ["## h200: NO-GO", "## h100: NOT ENOUGH EVIDENCE",
                            "## What is not OK"], sections
    head = md.split("## What is not OK", 1)[0]
    assert "delivered NVIDIA H100 80GB HBM3, ordered H200 (GPU_MODEL, TORCH_ORDER)" in head
    assert "3.79 USD per GPU-hour, billed per second" in head


def test_evidence_is_a_path_inside_its_run(two_orders, tmp_path, no_plots) -> None:
    """Evidence reads as the file's path inside its run, with <wbr> after each / and -,
    and links to the file; the run id is said once, in the runs compared."""
    html, md = render(two_orders, tmp_path / "r.html")
    link = re.search(r'<a class="path" href="([^"]+)" title="20261206-034503-cf89">'
                     r'([^<]*(?:<wbr>[^<]*)*)</a>', html)
    assert link, "no evidence link"
    assert link.group(2).replace("<wbr>", "") == "nodes/h200-n1/preflight/raw/query_gpu.txt"
    assert link.group(2).startswith("nodes/<wbr>h200-<wbr>n1/<wbr>preflight/")
    assert (tmp_path / link.group(1)).resolve().is_file()
    assert ">20261206-034503-cf89/nodes" not in html and "[20261206-" not in md
    assert "[nodes/h200-n1/preflight/raw/query_gpu.txt](" in md


def test_only_paths_and_ids_may_break() -> None:
    """<wbr> goes after / and - inside paths and run ids only: numbers, units, codes and
    words keep no break opportunity of their own."""
    from orchestrator.report import _wbr_html

    assert _wbr_html("0.043 / 3 GB/s CKPT_DIR_UNUSABLE prefligh") == \
        "0.043 / 3 GB/s CKPT_DIR_UNUSABLE prefligh"
    assert _wbr_html("on /tmp/gv/ckpt, see nodes/a-1/x.txt") == \
        "on /tmp/<wbr>gv/<wbr>ckpt, see nodes/<wbr>a-<wbr>1/<wbr>x.txt"
    assert _wbr_html("run 20261206-034503-cf89 <b>") == \
        "run 20261206-<wbr>034503-<wbr>cf89 &lt;b&gt;"


def test_no_word_or_number_may_be_broken_by_the_css(two_orders, tmp_path, no_plots) -> None:
    """The stylesheet never lets a line break inside a word (the browser test checks the
    computed style and the rendered lines)."""
    html, _ = render(two_orders, tmp_path / "r.html")
    css = html.split("<style>", 1)[1].split("</style>", 1)[0]
    assert "anywhere" not in css and "break-all" not in css and "break-word" not in css


def test_not_as_ordered_is_red_never_green(two_orders, tmp_path, no_plots) -> None:
    from orchestrator.report import cell_class

    assert cell_class("NOT AS ORDERED (h200)") == "bad"
    assert cell_class("H100 SXM (ordered H200 SXM: NOT AS ORDERED)") == "bad"
    assert cell_class("same") == "good" and cell_class("WARN HEALTH_VARIANT") == "warn"
    html, _ = render(two_orders, tmp_path / "r.html")
    assert '<td class="bad">NOT AS ORDERED (h200)</td>' in html
    assert '<td class="bad">H100 SXM (ordered H200 SXM: NOT AS ORDERED)</td>' in html


def test_the_cost_reads_per_gpu_hour_billed_per_second(two_orders, tmp_path, no_plots) -> None:
    html, md = render(two_orders, tmp_path / "r.html")
    for text in (_text(html), md):
        assert "2.49 USD per GPU-hour, billed per second" in text
        assert "GPU-h per" not in text and "USD/GPU-h" not in text
    # the PoC cost table's totals come right after the provider and the window
    assert "| provider | window | total | total in USD |" in md


def test_the_step_time_box_plot_starts_at_zero_and_states_the_difference(monkeypatch
                                                                          ) -> None:
    """A 0.2% difference drawn on an axis of 0.205-0.228 s looks large: the axis starts
    at zero and the medians' difference is said in words, in the plot and beside it."""
    from orchestrator.report import plots

    figs = []
    monkeypatch.setattr(plots, "_svg", lambda fig: figs.append(fig) or "<svg/>")
    a = [0.2134, 0.2130, 0.2138, 0.2205, 0.2131]
    b = [0.2129, 0.2125, 0.2133, 0.2280, 0.2126]
    train = {p: {"throughput": [{"step": i, "loss": "1", "step_time_s": t}
                                for i, t in enumerate(v)]} for p, v in (("h100", a),
                                                                          ("h200", b))}
    assert plots.step_times(train) == "<svg/>"
    ax = figs[0].axes[0]
    assert ax.get_xlim()[0] == 0
    words = plots.step_time_words(plots.step_time_samples(train))
    assert words == ("median step time h100 0.2134 s; h200 0.2129 s, 0.2% below h100's")
    assert ax.get_title() == words.replace("; ", "\n")
    assert plots.step_time_words({"a": [1.0], "b": [1.0002]}) == \
        "median step time a 1 s; b 1.0002 s, the same as a's within 0.1%"


def test_plots_fill_their_box(two_orders, tmp_path) -> None:
    """Every plot is as wide as its box (a phone's screen) with its viewBox's aspect."""
    html, _ = render(two_orders, tmp_path / "r.html")
    heads = re.findall(r"<svg[^>]*>", html)
    assert len(heads) == 4  # losses, step times, telemetry, cost
    for head in heads:
        assert 'width="100%"' in head and "viewBox=" in head and "height=" not in head
    assert "<!--" not in html.split("<body>", 1)[1]
