"""`gpuvet baseline set|show` and `gpuvet regress`: is this provider still what it was?"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from orchestrator.cli._common import (
    ManyValues,
    emit_json,
    err,
    json_option,
    out,
    render,
    results_option,
)

if TYPE_CHECKING:  # the statistics load scipy: only the commands that judge import them
    from orchestrator.analysis.significance import Settings

F = TypeVar("F", bound=Callable[..., Any])


def _size(ctx: click.Context, param: click.Parameter, value: str) -> int:
    from payload.allreduce import parse_size

    try:
        return parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _fraction(lo: float, hi: float) -> click.FloatRange:
    return click.FloatRange(lo, hi, min_open=True, max_open=True)


def regress_options(f: F) -> F:
    """How runs are judged; `gpuvet pipeline` takes the same."""
    f = click.option("--last", type=click.IntRange(1), default=10, show_default=True,
                     help="Without a baseline set by hand: judge against this many of the "
                          "provider's last complete runs.")(f)
    f = click.option("--min-size", default="16M", show_default=True, callback=_size,
                     help="Smallest nccl message size judged (below it a round lasts "
                          "microseconds: latency jitter).")(f)
    f = click.option("--min-effect", type=click.FloatRange(0, 1, max_open=True), default=0.03,
                     show_default=True, help="Smallest relative change called a regression or "
                                             "an improvement.")(f)
    f = click.option("--alpha", type=_fraction(0, 1), default=0.05, show_default=True,
                     help="False discovery rate over all tests of a run (Benjamini-Hochberg).")(f)
    f = click.option("--test", "test_", type=click.Choice(["mwu", "welch"]), default="mwu",
                     show_default=True,
                     help="Mann-Whitney U, or Welch's t (liberal with few samples).")(f)
    return f


def settings_from(test_: str, alpha: float, min_effect: float) -> Settings:
    from orchestrator.analysis.significance import TESTS, Settings

    return Settings(test=TESTS[test_], alpha=alpha, min_effect=min_effect)


def prom_option(f: F) -> F:
    return click.option("--prom-file", type=click.Path(path_type=Path, dir_okay=False),
                        help="Also write the key figures and verdicts in the Prometheus "
                             "textfile format (for node_exporter; atomically).")(f)


def show_evaluation(ev: Any, *, verbose: bool, as_json: bool, extra: dict[str, Any] | None = None
                    ) -> None:
    from orchestrator.analysis import regress

    if as_json:
        emit_json({**(extra or {}), **regress.as_json(ev)})
        return
    tests = regress.tests_table(ev, verbose)
    if tests.rows:
        render(tests)
    shifts = regress.shifts_table(ev)
    if shifts.rows:
        render(shifts)
    render(regress.verdict_table(ev))


def register(root: click.Group) -> None:
    @root.group("baseline")
    def baseline_group() -> None:
        """Baselines: the accepted history a provider's runs are judged against."""

    @baseline_group.command("set")
    @click.option("-p", "--provider", required=True, metavar="NAME",
                  help="The provider whose baseline this is.")
    @click.option("--runs", "run_ids", cls=ManyValues, metavar="RUN...",
                  help="Accept these runs (`--runs A B C`, or repeated).")
    @click.option("--last", type=int, default=None, metavar="N",
                  help="Accept the provider's last N complete runs (passed, no FAIL finding).")
    @click.option("--min-size", default="16M", show_default=True, callback=_size,
                  help="Smallest nccl message size kept.")
    @results_option
    @json_option
    def baseline_set(provider: str, run_ids: tuple[str, ...], last: int | None, min_size: int,
                     results: Path, as_json: bool) -> int:
        """Record a provider's baseline from named runs or its last N complete runs.

        Stored per GPU model, GPU count, suite hash and series, with the runs it came
        from, when and by whom; a later set replaces it. Exit 2 for unknown runs or runs
        of different suites or machines.
        """
        from orchestrator.analysis import baseline

        recs = baseline.set_baseline(results, provider, runs=run_ids, last=last,
                                     min_size=min_size)
        newest = baseline.newest_measured(results, provider, min_size)
        if newest is not None and newest in recs[0].runs:
            err.print(f"note: the baseline holds {newest}, {provider}'s newest measured run; "
                      "`gpuvet regress` judging it leaves it out (a run is never its own "
                      "baseline): the next run is judged against all of them")
        if as_json:
            emit_json({"baseline": [r.model_dump(mode="json") for r in recs]})
            return 0
        render(baseline.records_table(results, recs, f"baseline of {provider} set"))
        out.print(f"{len(recs)} series from {len(recs[0].runs)} run(s): "
                  f"{', '.join(recs[0].runs)}")
        return 0

    @baseline_group.command("show")
    @click.option("-p", "--provider", "providers", multiple=True, metavar="NAME",
                  help="Only this provider (repeatable).")
    @results_option
    @json_option
    def baseline_show(providers: tuple[str, ...], results: Path, as_json: bool) -> int:
        """The baselines set by hand, with the reference band of each size beside them.

        A band is an expectation (shipped, or the inventory's expect.nccl_busbw); a
        baseline is measured history. Providers without one are judged against their
        last complete runs.
        """
        from orchestrator.analysis import baseline, frames
        from orchestrator.store import Index

        frames.runs(results)  # no store: exit 2 with the usual message
        idx = Index(results)
        recs = [r for r in idx.baselines() if not providers or r.provider in providers]
        if as_json:
            emit_json({"baselines": [r.model_dump(mode="json") for r in recs]})
            return 0
        if not recs:
            out.print("no baseline set by hand" + (f" for {', '.join(providers)}"
                                                   if providers else "")
                      + ": regress judges each run against its provider's last complete runs")
            return 0
        render(baseline.records_table(results, recs, "baselines"))
        return 0

    @root.command("regress")
    @click.argument("run_id", required=False, metavar="[RUN]")
    @click.option("-p", "--provider", "providers", multiple=True, metavar="NAME",
                  help="Only this provider (repeatable).")
    @results_option
    @regress_options
    @prom_option
    @click.option("-v", "--verbose", is_flag=True, help="Show every node's test, not only "
                                                        "those that changed.")
    @json_option
    def regress_cmd(run_id: str | None, providers: tuple[str, ...], results: Path, test_: str,
                    alpha: float, min_effect: float, min_size: int, last: int,
                    prom_file: Path | None, verbose: bool, as_json: bool) -> int:
        """Judge RUN (default: each provider's latest measured run) against its baseline.

        Per series (metric, message size, scope; the provider and each node) a
        Mann-Whitney or Welch test, Benjamini-Hochberg over the whole run, a minimum
        effect; every verdict states the change, its 95% interval and the smallest
        change the samples could have detected. Change points over the history mark
        slow drifts.

        Exit codes: 0 UNCHANGED, IMPROVED or NOT ENOUGH DATA (no baseline yet is not
        an error), 1 REGRESSED, 2 bad input (an unknown run or provider).
        """
        from orchestrator import prom
        from orchestrator.analysis import regress

        if prom_file is not None:
            prom.check_path(prom_file)
        ev = regress.evaluate(results, run_id, providers,
                              settings=settings_from(test_, alpha, min_effect), last=last,
                              min_size=min_size)
        if prom_file is not None:
            prom.write(prom_file, [*prom.regress_families(ev), prom.written_family()])
        show_evaluation(ev, verbose=verbose, as_json=as_json)
        return 1 if ev.regressed else 0
