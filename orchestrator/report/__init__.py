"""The report: one self-contained HTML file and its Markdown twin.

Both are rendered from the same comparison (orchestrator.analysis.compare) with
Jinja2 templates: the tables are the rows the terminal and --json show, the
plots are inline SVG, the CSS is inline, nothing is fetched when the page is
opened, and `@media print` keeps it readable on paper. Both files are rendered
in memory first and then written atomically: an error or Ctrl-C leaves no half
report.
"""

from __future__ import annotations

import html
import os
import urllib.parse
from pathlib import Path
from typing import Any

from orchestrator.errors import UsageError
from orchestrator.report import plots
from orchestrator.store import atomic_write

INSTALL = "pip install 'jinja2>=3.1,<4' 'matplotlib>=3.8,<4'"


def _env() -> Any:
    try:
        import jinja2  # imported late: only `gpuvet report` renders templates
    except ImportError:
        raise UsageError("the report needs jinja2, a dependency of gpuvet missing from this "
                         "Python environment", hint=INSTALL) from None
    return jinja2.Environment(
        loader=jinja2.PackageLoader("orchestrator.report", "templates"),
        autoescape=jinja2.select_autoescape(["html", "html.j2"]), undefined=jinja2.StrictUndefined,
        trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


# Markdown syntax a value could carry into the twin: links and images ([ ]), emphasis (*),
# code spans, table cells, escapes; written as HTML character references, which Markdown
# shows as the characters and never reads as syntax (<, >, & and quotes: html.escape)
_MD_SYNTAX = {c: f"&#{ord(c)};" for c in "[]`|\\*"}


def _md(v: Any) -> str:
    """A cell of the Markdown twin: every viewer renders Markdown as HTML, so the text is
    HTML-escaped and its Markdown syntax neutralised (a provider or file name is data)."""
    text = html.escape(_cell(v).replace("\r", " ").replace("\n", " "), quote=True)
    return "".join(_MD_SYNTAX.get(c, c) for c in text)


def safe_href(href: str) -> str | None:
    """A link target the report may carry: http(s) or a relative path, percent-encoded;
    None for any other scheme (javascript:, data:, file:, ...) or a network path."""
    parts = urllib.parse.urlsplit(href.strip())
    if parts.scheme and parts.scheme.lower() not in ("http", "https"):
        return None
    if not parts.scheme and (parts.netloc or href.strip().startswith(("//", "\\"))):
        return None
    return urllib.parse.quote(href.strip(), safe="/._-~%#?=&:+,@")


def context(c: Any, html_path: Path) -> dict[str, Any]:
    """Everything the templates show: rows and plots, computed once for both twins."""
    train: dict[str, dict[str, list[dict[str, Any]]]] = {}
    tele: dict[str, dict[str, list[float | None]]] = {}
    paths = c.selection.paths
    for p in c.providers:
        rid = c.selection.chosen.get(p, {}).get("train")
        if rid and rid in paths:
            steps = plots.train_steps(paths[rid])
            if steps:
                train[p] = steps
            series = plots.telemetry_series(paths[rid])
            if series:
                tele[p] = series
    figures = [
        ("busbw vs message size", plots.busbw(c.measurements, c.providers)),
        ("round-to-round stability", plots.stability(c.measurements, c.providers)),
        ("loss: reference and restored run", plots.losses(train)),
        ("step-time distribution", plots.step_times(train)),
        ("GPU telemetry while training", plots.telemetry(tele)),
        ("cost per useful unit", plots.cost_bars(c.units)),
    ]
    base = html_path.resolve().parent
    reasons = []
    for v in c.verdicts:
        for r in v.reasons:
            links = [(e, safe_href(os.path.relpath(c.root.resolve() / e, base)))
                     for e in r.evidence]
            reasons.append({"provider": v.provider, "check": r.check, "outcome": r.outcome,
                            "text": r.text, "links": links})
    by_title = {t.title: t for t in c.tables}
    skip = {"verdict reasons", "verdict per provider"}  # the cards and reasons show them
    return {
        "providers": c.providers, "verdicts": c.verdicts, "reasons": reasons,
        "figures": [(t, svg) for t, svg in figures if svg], "runs": c.selection.chosen,
        "left_out": [(t, plots.WHY_LEFT_OUT.get(t, "nothing to plot"))
                     for t, svg in figures if not svg],
        "tables": [t for t in c.tables if t.title not in skip and t.rows],
        "env": by_title.get("environment"), "currencies_apart": c.currencies_apart,
        "empty_sections": [t for t in c.empty_sections if t not in skip],
        "findings": [f for f in c.findings if f.severity in ("WARN", "FAIL")],
        "cell": _cell, "md": _md,
    }


def render(c: Any, html_path: Path) -> tuple[str, str]:
    env = _env()
    ctx = context(c, html_path)
    return (env.get_template("report.html.j2").render(**ctx),
            env.get_template("report.md.j2").render(**ctx))


def write_report(c: Any, html_path: Path, md_path: Path) -> tuple[Path, Path]:
    html, md = render(c, html_path)
    atomic_write(html_path, html)
    atomic_write(md_path, md)
    return html_path, md_path
