"""`gpuvet compare` and `gpuvet report`: providers side by side, with cost and verdicts."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from orchestrator.cli._common import (
    ManyValues,
    emit_json,
    err,
    json_option,
    out,
    output_written,
    render,
    results_option,
)
from orchestrator.errors import UsageError

F = TypeVar("F", bound=Callable[..., Any])
RATE_RE = re.compile(r"^([A-Z]{3})=(\d+(?:\.\d+)?)$")


def _rates(values: tuple[str, ...]) -> dict[str, float]:
    rates = {}
    for v in values:
        m = RATE_RE.match(v)
        if not m:
            raise UsageError(f"--rate {v!r} is not CUR=VALUE",
                             hint="e.g. --rate EUR=1.08: one EUR is 1.08 of the first "
                                  "provider's currency")
        rates[m.group(1)] = float(m.group(2))
    return rates


def _all_rates(inventory: Path | None, values: tuple[str, ...]) -> dict[str, float]:
    """The inventory's `settings.rates`, overridden by --rate on the command line."""
    rates: dict[str, float] = {}
    if inventory is not None:
        from orchestrator import inventory as inv_mod

        rates.update(inv_mod.load(inventory).settings.rates)
    rates.update(_rates(values))
    return rates


def _override(billed_since: str | None, hours: float | None, window: str | None) -> Any:
    from orchestrator.analysis import billing

    return billing.Override(hours, billed_since, billing.parse_window(window))


def _options(f: F) -> F:
    f = click.option("--rate", "rates", multiple=True, metavar="CUR=VALUE",
                     help="Exchange rate into the first provider's currency (repeatable; "
                          "overrides the inventory's settings.rates); "
                          "without one, other currencies are shown apart.")(f)
    f = click.option("--no-cost", is_flag=True,
                     help="Leave the cost tables out (a provider without a price is compared "
                          "anyway; its cost says \"not priced\").")(f)
    f = click.option("--window", metavar="START/END",
                     help="Bill this window (ISO 8601 times) instead of the runs' own.")(f)
    f = click.option("--hours", type=float, metavar="H",
                     help="Bill H hours per provider instead of the windows found.")(f)
    f = click.option("--billed-since", metavar="TIME",
                     help="When billing started (the instance created; ISO 8601): overrides "
                          "pricing.billed_since and the nodes' boot time.")(f)
    f = click.option("-i", "--inventory", type=click.Path(path_type=Path, dir_okay=False),
                     help="Take prices (and settings.rates) from this inventory instead of the "
                          "runs' own copies.")(f)
    f = click.option("--runs", "run_ids", cls=ManyValues, metavar="RUN...",
                     help="Compare these runs (`--runs A B C`, or repeated); default: each "
                          "provider's latest complete run of every step.")(f)
    f = click.option("-p", "--provider", "providers", multiple=True, metavar="NAME",
                     help="A provider to compare (repeatable; the first is the baseline of "
                          "the ratios).")(f)
    return results_option(f)


VERDICT_STYLE = {"GO": "bold green", "NO-GO": "bold red", "NOT ENOUGH EVIDENCE": "bold yellow"}


def show_headline(h: Any) -> None:
    """A provider's verdict, its decisive reasons and its cost, before any table."""
    out.print(f"{h.provider}: {h.verdict}", style=VERDICT_STYLE.get(h.verdict, "bold"))
    for r in h.reasons:
        out.print(f"  - {r}")
    if h.cost:
        out.print(f"  {h.cost}")


def register(root: click.Group) -> None:
    @root.command("compare")
    @_options
    @json_option
    def compare(results: Path, providers: tuple[str, ...], run_ids: tuple[str, ...],
                inventory: Path | None, no_cost: bool, rates: tuple[str, ...],
                billed_since: str | None, hours: float | None, window: str | None,
                as_json: bool) -> int:
        """Compare providers measured with identical parameters: numbers, environment,
        cost and a verdict per provider. Exit 2 when the suites differ or a provider is
        named twice; exit 1 when a provider is NO-GO. The cost is optional: a provider
        without a price is compared, its cost "not priced"."""
        from orchestrator.analysis import compare as cmp

        c = cmp.build(results, providers, run_ids, with_cost=not no_cost, inventory=inventory,
                      rates=_all_rates(inventory, rates),
                      override=_override(billed_since, hours, window))
        if as_json:
            emit_json(c.as_json())
        else:
            for h in c.headlines:
                show_headline(h)
            for t in c.tables:
                if t.rows and t.title != "verdict per provider":  # said by the headlines
                    render(t)
            if c.empty_sections:
                out.print("nothing to show (no such records in the runs compared): "
                          + "; ".join(c.empty_sections))
            if c.currencies_apart:
                out.print(f"currencies shown apart (no rate): {', '.join(c.currencies_apart)}")
        return 1 if any(v.verdict == "NO-GO" for v in c.verdicts) else 0

    @root.command("report")
    @_options
    @click.argument("run_args", metavar="[RUN...]", nargs=-1)
    @click.option("-o", "--output", type=click.Path(path_type=Path, dir_okay=False),
                  required=True, help="report.html or report.md (the other twin is written "
                                      "beside it).")
    def report(results: Path, providers: tuple[str, ...], run_ids: tuple[str, ...],
               inventory: Path | None, no_cost: bool, rates: tuple[str, ...],
               billed_since: str | None, hours: float | None, window: str | None,
               run_args: tuple[str, ...], output: Path) -> int:
        """Write the comparison as one self-contained HTML file and its Markdown twin."""
        from orchestrator.analysis import compare as cmp

        if output.suffix not in (".html", ".md"):
            raise UsageError(f"-o {output}: the report is .html or .md")
        c = cmp.build(results, providers, tuple(run_ids) + run_args, with_cost=not no_cost,
                      inventory=inventory, rates=_all_rates(inventory, rates),
                      override=_override(billed_since, hours, window))
        from orchestrator.report import write_report

        html, md = output_written(lambda: write_report(c, output.with_suffix(".html"),
                                                       output.with_suffix(".md")), output)
        out.print(f"{html}\n{md}")
        for h in c.headlines:  # the report's first lines, so the terminal says it too
            err.print(h.text)
        return 0
