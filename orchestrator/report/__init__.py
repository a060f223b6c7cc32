"""The report: one self-contained HTML file and its Markdown twin, read as a decision.

Both are rendered from the same comparison (orchestrator.analysis.compare) with
Jinja2 templates and open the same way: each provider's headline (verdict, the
decisive reasons, the PoC cost), then what is not OK with whose side it is on and
the fix, the checks that passed folded away, then the environment as ordered and
delivered, the plots and the tables. The plots are inline SVG, the CSS is inline,
nothing is fetched when the page is opened, and `@media print` keeps it readable on
paper. Every value is escaped for its twin by the template environment itself
(HTML: Jinja's autoescape; Markdown: backslash escapes, never HTML entities), and
control characters are written out as the terminal shows them. Both files are
rendered in memory first and then written atomically: an error or Ctrl-C leaves no
half report.
"""

from __future__ import annotations

import html
import os
import re
import urllib.parse
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from orchestrator.analysis.answer import RANK
from orchestrator.analysis.verdict import NOT_OK
from orchestrator.errors import UsageError
from orchestrator.render import terminal_text
from orchestrator.report import plots
from orchestrator.store import atomic_write

INSTALL = "pip install 'jinja2>=3.1,<4' 'matplotlib>=3.8,<4'"


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


# --- the Markdown twin's autoescape --------------------------------------------------------

class MdRaw(str):
    """Markdown the template wrote itself (a link target already percent-encoded): passed
    through the Markdown autoescape as it is."""


# Markdown syntax a value could carry into the twin: emphasis (* _ ~), code spans (`),
# links and images ([ ]), raw HTML and autolinks (< >), character references (&), table
# cells (|) and the escape itself (\). Each is written with a backslash (CommonMark's
# escape for any ASCII punctuation), which every viewer shows as the character itself.
# An underscore between two letters or digits (CKPT_DIR_UNUSABLE, ckpt_dir) starts no
# emphasis in CommonMark or GitHub's Markdown and stays as it is: codes read as written.
MD_SPECIAL = "\\`*_~[]<>&|"
_MD_RE = re.compile("[" + re.escape(MD_SPECIAL.replace("_", "")) + r"]|(?<![^\W_])_|_(?![^\W_])")


def md_escape(v: Any) -> str:
    """A value as Markdown text: control characters written out as the terminal shows
    them, on one line, and its Markdown syntax backslash-escaped (a provider, file or GPU
    name is data, never a link, a tag or a table cell)."""
    if isinstance(v, MdRaw):
        return v
    text = terminal_text(_cell(v)).replace("\r\n", " ").replace("\r", " ") \
        .replace("\n", " ").replace("\t", " ")
    return _MD_RE.sub(lambda m: "\\" + m.group(0), text)


# --- paths and ids: where a line may break -------------------------------------------------

# a path (two slashes or more, or rooted) or a run id: the tokens that may wrap, after each
# / and -; no other word or number is broken (docs/report.md, "Reading it on a phone")
_WRAPPABLE = re.compile(r"(?<!\S)(?:/[^\s/]+(?:/[^\s/]*)*|[^\s/]+(?:/[^\s/]*){2,}"
                        r"|\d{8}-\d{6}-[0-9a-f]{4})")


_HASH = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


def _wbr_html(text: str) -> str:
    """HTML of a text with <wbr> after every / and - of its paths and run ids."""
    out, last = [], 0
    for m in _WRAPPABLE.finditer(text):
        out.append(html.escape(text[last:m.start()]))
        token = html.escape(m.group(0))  # a break after a leading / would leave it alone
        out.append(token[:1] + re.sub(r"([/-])(?=.)", r"\1<wbr>", token[1:]))
        last = m.end()
    out.append(html.escape(text[last:]))
    return "".join(out)


class Html(str):
    """HTML the report wrote itself, of escaped parts: Jinja's autoescape passes it."""

    def __html__(self) -> str:
        return str(self)


def _env(markdown: bool = False) -> Any:
    try:
        import jinja2  # imported late: only `gpuvet report` renders templates
    except ImportError:
        raise UsageError("the report needs jinja2, a dependency of gpuvet missing from this "
                         "Python environment", hint=INSTALL) from None

    def html_value(v: Any) -> Any:
        # Markup or Html (an SVG, a wrapped path) is the template's own; the rest is data
        return v if hasattr(v, "__html__") else terminal_text(_cell(v))

    def wrap(v: Any) -> Any:
        text = terminal_text(_cell(v))
        if _HASH.fullmatch(text):  # a commit: its first 12 digits, the whole as a tooltip
            return Html(f'<span class="hash" title="{text}">{text[:12]}…</span>')
        return Html(_wbr_html(text))

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("orchestrator.report", "templates"),
        autoescape=not markdown, undefined=jinja2.StrictUndefined,
        finalize=md_escape if markdown else html_value,
        trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.filters["wrap"] = wrap
    # Markdown the template wrote itself: a safe_href link target (percent-encoded), the
    # evidence links built of escaped parts
    env.filters["raw"] = MdRaw
    # a link target in Markdown: a character reference (&...;) in it would be decoded
    env.filters["href"] = lambda h: MdRaw(str(h).replace("&", "%26"))
    return env


def safe_href(href: str) -> str | None:
    """A link target the report may carry: http(s) or a relative path, percent-encoded;
    None for any other scheme (javascript:, data:, file:, ...) or a network path."""
    parts = urllib.parse.urlsplit(href.strip())
    if parts.scheme and parts.scheme.lower() not in ("http", "https"):
        return None
    if not parts.scheme and (parts.netloc or href.strip().startswith(("//", "\\"))):
        return None
    return urllib.parse.quote(href.strip(), safe="/._-~%#?=&:+,@")


# --- what the templates show ---------------------------------------------------------------

GOOD = ("GO", "same", "ok", "PASS", "none")
BAD = ("NO-GO", "no-go", "FAIL", "DIFFERS")
WARN = ("NOT ENOUGH EVIDENCE", "MISSING", "WARN", "missing", "not proven", "not measured")


def cell_class(v: Any) -> str:
    """The class of a table cell: a number is right-aligned; a flag is coloured, a value
    that is not as ordered always red (the provider's side), never green."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return "num"
    text = _cell(v)
    if "NOT AS ORDERED" in text or text in BAD or text.startswith(("FAIL ", "DIFFERS ")):
        return "bad"
    if text in WARN or text.startswith("WARN "):
        return "warn"
    if text in GOOD or text.startswith("PASS "):
        return "good"
    return ""


def _evidence(c: Any, evidence: Iterable[str], base: Path) -> list[dict[str, Any]]:
    """Each evidence file as people read it: its path inside its run (the run id is said
    once, in the title and the runs compared), linked relative to the report."""
    out = []
    for e in dict.fromkeys(evidence):
        run, _, inside = e.partition("/")
        href = safe_href(os.path.relpath(c.root.resolve() / e, base))
        out.append({"path": inside or e, "run": run if inside else "", "href": href})
    return out


def _reasons(c: Any, base: Path, order: Sequence[str]) -> list[dict[str, Any]]:
    rank = {p: i for i, p in enumerate(order)}
    rows = []
    for v in c.verdicts:
        for r in v.reasons:
            rows.append({"provider": v.provider, "check": r.check, "outcome": r.outcome,
                         "side": r.side, "text": r.text, "fix": r.fix, "codes": r.codes,
                         "links": _evidence(c, r.evidence, base)})
    # what is not OK worst first; what passed by provider, in the decision table's order
    rows.sort(key=lambda r: (r["outcome"] not in NOT_OK,
                             RANK.get(r["outcome"], 9) if r["outcome"] in NOT_OK else 0,
                             rank.get(r["provider"], 99)))
    return rows


def _passed_summary(c: Any) -> str:
    parts = []
    for v in c.verdicts:
        n = {o: sum(r.outcome == o for r in v.reasons) for o in ("ok", "not applicable")}
        if n["ok"] or n["not applicable"]:
            parts.append(f"{v.provider} {n['ok']} ok" + (
                f", {n['not applicable']} not applicable" if n["not applicable"] else ""))
    return "; ".join(parts)


def _runs(c: Any) -> list[tuple[str, list[tuple[str, list[str]]]]]:
    """Per provider, each run id once with the steps taken from it."""
    out = []
    for p, steps in c.selection.chosen.items():
        by_run: dict[str, list[str]] = {}
        for step, rid in steps.items():
            by_run.setdefault(rid, []).append(step)
        out.append((p, list(by_run.items())))
    return out


# the PoC cost table's totals first: on a phone they are on screen without scrolling
_FIRST = {"PoC cost": ("provider", "window", "total")}


def _table(t: Any) -> dict[str, Any]:
    cols = list(t.columns)
    lead = _FIRST.get(t.title)
    if lead:
        first = [i for i, col in enumerate(cols) if col in lead or col.startswith("total")]
        idx = first + [i for i in range(len(cols)) if i not in first]
    else:
        idx = list(range(len(cols)))
    return {"title": t.title, "columns": [cols[i] for i in idx],
            # the first column names the row: never coloured as a flag
        "rows": [[(row[i] if i < len(row) else None,
                   cell_class(row[i]) if k and i < len(row) else "")
                  for k, i in enumerate(idx)] for row in t.rows]}


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
        ("busbw vs message size", plots.busbw(c.measurements, c.providers), ""),
        ("round-to-round stability", plots.stability(c.measurements, c.providers), ""),
        ("loss: reference and restored run", plots.losses(train), ""),
        ("step-time distribution", plots.step_times(train),
         plots.step_time_words(plots.step_time_samples(train))),
        ("GPU telemetry while training", plots.telemetry(tele), ""),
        ("cost per useful unit", plots.cost_bars(c.units), ""),
    ]
    base = html_path.resolve().parent
    heads = list(c.headlines)
    order = [h.provider for h in heads] or list(c.providers)
    reasons = _reasons(c, base, order)
    skip = {"verdict reasons", "verdict per provider", "checks that passed"}  # shown above
    tables = [t for t in c.tables if t.title not in skip and t.rows]
    env = [t for t in tables if t.title == "environment"]
    return {
        "providers": c.providers, "headlines": heads,
        "not_ok": [r for r in reasons if r["outcome"] in NOT_OK],
        "passed": [r for r in reasons if r["outcome"] not in NOT_OK],
        "passed_summary": _passed_summary(c),
        "figures": [(t, svg, words) for t, svg, words in figures if svg],
        "runs": _runs(c),
        "left_out": [(t, plots.WHY_LEFT_OUT.get(t, "nothing to plot"))
                     for t, svg, _ in figures if not svg],
        "env": [_table(t) for t in env],
        "tables": [_table(t) for t in tables if t.title != "environment"],
        "currencies_apart": c.currencies_apart,
        "empty_sections": [t for t in c.empty_sections if t not in skip],
        "findings": [f for f in c.findings if f.severity in ("WARN", "FAIL")],
    }


def render(c: Any, html_path: Path) -> tuple[str, str]:
    ctx = context(c, html_path)
    return (_env().get_template("report.html.j2").render(**ctx),
            _env(markdown=True).get_template("report.md.j2").render(**ctx))


def write_report(c: Any, html_path: Path, md_path: Path) -> tuple[Path, Path]:
    html, md = render(c, html_path)
    atomic_write(html_path, html)
    atomic_write(md_path, md)
    return html_path, md_path
