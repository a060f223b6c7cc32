"""CLI commands of the steps (preflight, nccl, ...), attached to the main app."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from orchestrator import inventory as inv_mod
from orchestrator.cliopts import AcceptOpt, InventoryOpt, NodeOpt, ProviderOpt, out, progress
from orchestrator.errors import UsageError
from orchestrator.records import SEVERITY_ORDER, Finding, worst
from orchestrator.store import DEFAULT_ROOT, Run
from orchestrator.suite import load_suite

ResultsOpt = Annotated[Path, typer.Option("--results", help="Results root folder.")]
SuiteOpt = Annotated[Path | None, typer.Option("--suite", help="Suite YAML (parameters); "
                                               "default: the built-in suite.")]
_STYLE = {"PASS": "green", "INFO": "cyan", "WARN": "yellow", "FAIL": "bold red"}


def findings_table(findings: list[Finding], title: str, verbose: bool = False) -> Table:
    table = Table(title=title, show_lines=False)
    for col in ("node", "severity", "code", "message"):
        table.add_column(col, overflow="fold")
    shown = [f for f in findings if verbose or f.severity in ("WARN", "FAIL")]
    shown.sort(key=lambda f: (f.node, -SEVERITY_ORDER[f.severity], f.code))
    for f in shown:
        table.add_row(escape(f.node), f"[{_STYLE[f.severity]}]{f.severity}[/]", f.code,
                      escape(f.message))
    return table


def summary_table(findings: list[Finding], nodes: list[str]) -> Table:
    table = Table(title="verdict per node")
    for col in ("node", "verdict", "FAIL", "WARN", "PASS"):
        table.add_column(col)
    for n in nodes:
        fs = [f for f in findings if f.node == n]
        v = worst(fs)
        table.add_row(n, f"[{_STYLE[v]}]{v}[/]", *(str(sum(f.severity == s for f in fs))
                                                   for s in ("FAIL", "WARN", "PASS")))
    return table


def register(app: typer.Typer) -> None:
    register_preflight(app)
    register_nccl(app)

    @app.command("payload")
    def payload_archive(
        dest: Annotated[Path, typer.Argument(help="Where to write the archive (.tar.gz).")],
    ) -> int:
        """Write the payload archive, for nodes the controller cannot reach.

        On the node: tar xzf ARCHIVE && python3 -m payload collect --out collected.json
        --work-dir DIR --ckpt-dir DIR; then here: gpuvet preflight --from collected.json
        -i INVENTORY --node NAME.
        """
        from orchestrator import payload as payload_mod
        from orchestrator.store import atomic_write

        digest, data = payload_mod.archive()
        atomic_write(dest, data)
        out.print(f"wrote {dest} (payload {digest}, {len(data)} bytes). On the node:\n"
                  f"  tar xzf {dest.name} && python3 -m payload collect --out collected.json "
                  "--work-dir DIR --ckpt-dir DIR\nthen here:\n"
                  "  gpuvet preflight --from collected.json -i INVENTORY --node NAME", markup=False)
        return 0


def register_preflight(app: typer.Typer) -> None:
    @app.command()
    def preflight(
        inventory: InventoryOpt,
        node: NodeOpt = None,
        provider: ProviderOpt = None,
        from_: Annotated[Path | None, typer.Option(
            "--from", help="Judge a document collected by hand on a node you cannot reach "
            "(see `gpuvet payload`) instead of connecting; needs exactly one --node.")] = None,
        results: ResultsOpt = DEFAULT_ROOT,
        suite: SuiteOpt = None,
        resume: Annotated[str | None, typer.Option(
            "--resume", help="Finish an interrupted or partly failed run RUN_ID: nodes it "
            "completed are kept, the others are tried again.")] = None,
        verbose: Annotated[bool, typer.Option("--verbose", "-v",
                                              help="Show PASS findings too.")] = False,
        accept_new_host_keys: AcceptOpt = False,
    ) -> int:
        """Record every node's environment and check it against the order.

        Writes raw outputs, facts and findings to RESULTS/<run_id>/. Exit code 0
        when nothing FAILs, 1 when something does, 2 for bad input.
        """
        from orchestrator.steps import preflight as pf

        inv = inv_mod.load(inventory)
        the_suite = load_suite(suite)
        nodes = inv.select(node, provider)
        doc = None
        if from_ is not None:
            if not node or len(node) != 1:
                raise UsageError("--from judges one node's document: give exactly one --node")
            try:
                doc = json.loads(from_.read_text())
            except (OSError, json.JSONDecodeError) as exc:
                raise UsageError(f"cannot read {from_}: {exc}") from None
        if resume is not None:
            if from_ is not None:
                raise UsageError("--resume and --from do not go together")
            run = Run.open(results, resume)
            if run.meta.get("command") != "preflight" or run.meta.get("suite_hash") != \
                    the_suite.hash:
                raise UsageError(f"run {resume} is not a preflight run with this suite "
                                 f"(hash {the_suite.hash})", hint="resume with the same "
                                 "--suite, or start a new run")
            run.meta["status"] = "running"
            run.save_meta()
        else:
            run = Run.create(results, command="preflight", suite_hash=the_suite.hash,
                             suite=the_suite.model_dump(mode="json"), inventory_path=inventory)
        with run.guard():
            if from_ is not None and doc is not None:
                out_dir = run.node_dir(nodes[0].name, pf.STEP)
                (out_dir / "collect.json").write_text(from_.read_text())
                report = pf.judge_document(doc, nodes[0], inv, run.run_id, out_dir, run.rel,
                                           the_suite)
                run.add_findings(report.findings)
                findings = report.findings
            else:
                with progress("preflight", len(nodes)) as hook:
                    pf.run_preflight(inv, nodes, run, the_suite,
                                     accept_new_host_keys=accept_new_host_keys, progress=hook)
                findings = run.findings()
        names = [n.name for n in nodes] + sorted({f.node for f in findings
                                                  if f.node.startswith("provider:")})
        out.print(findings_table(findings, f"preflight findings — run {run.run_id}", verbose))
        out.print(summary_table(findings, names))
        failed = any(f.severity == "FAIL" for f in findings)
        run.finish("failed" if failed else "passed")
        out.print(f"results: {run.dir}")
        return 1 if failed else 0


def register_nccl(app: typer.Typer) -> None:
    @app.command()
    def nccl(
        inventory: InventoryOpt,
        node: NodeOpt = None,
        provider: ProviderOpt = None,
        results: ResultsOpt = DEFAULT_ROOT,
        suite: SuiteOpt = None,
        single: Annotated[bool, typer.Option(help="Run on each node's own GPUs.")] = True,
        multi: Annotated[bool, typer.Option(help="Run across the nodes of each provider "
                                            "(mpirun; torch.distributed without MPI).")] = True,
        torch: Annotated[bool, typer.Option(help="Also run the torch.distributed all_reduce "
                                            "benchmark as a second opinion.")] = False,
        ring_only: Annotated[bool, typer.Option(
            "--ring-only", help="Run with NCCL_ALGO=Ring: the network without tree shortcuts "
            "(changes the suite, so its hash).")] = False,
        verbose: Annotated[bool, typer.Option("--verbose", "-v",
                                              help="Show PASS and INFO findings too.")] = False,
        accept_new_host_keys: AcceptOpt = False,
    ) -> int:
        """Build nccl-tests at the suite's commit and run all_reduce: single- and multi-node.

        Three rounds with identical parameters by default; logs, JSON, build logs,
        measurements and findings land in RESULTS/<run_id>/.
        """
        from orchestrator.steps import nccl as step

        inv = inv_mod.load(inventory)
        the_suite = load_suite(suite)
        if ring_only:
            the_suite = the_suite.model_copy(
                update={"nccl": the_suite.nccl.model_copy(update={"ring_only": True})})
        nodes = inv.select(node, provider)
        run = Run.create(results, command="nccl", suite_hash=the_suite.hash,
                         suite=the_suite.model_dump(mode="json"), inventory_path=inventory)
        with run.guard(), progress("nccl", len(nodes)) as hook:
            outcome = step.run_nccl(inv, nodes, run, the_suite, single=single, multi=multi,
                                    torch=torch, accept_new_host_keys=accept_new_host_keys,
                                    progress=hook)
        _print_outcome(run, outcome.findings, outcome.measurements, [n.name for n in nodes],
                       verbose)
        return _finish(run, outcome.findings)

    imp = typer.Typer(no_args_is_help=True, help="Bring results of earlier manual runs into "
                      "the results store.")
    app.add_typer(imp, name="import")

    @imp.command("nccl-tests")
    def import_nccl_tests(
        logs: Annotated[list[Path], typer.Argument(help="nccl-tests text logs: the rounds of "
                                                   "one series, in order.")],
        provider: Annotated[str, typer.Option("--provider", "-p", help="Provider name to "
                                              "file them under.")],
        nodes: Annotated[int, typer.Option(help="How many nodes the run spanned.")] = 1,
        results: ResultsOpt = DEFAULT_ROOT,
        suite: SuiteOpt = None,
        verbose: Annotated[bool, typer.Option("--verbose", "-v",
                                              help="Show PASS and INFO findings too.")] = False,
    ) -> int:
        """Import nccl-tests logs as one series of rounds; judge them like a live run."""
        from orchestrator.steps.nccl_judge import Series, judge_series

        for p in logs:
            if not p.is_file():
                raise UsageError(f"no such file: {p}")
        the_suite = load_suite(suite)
        run = Run.create(results, command="import nccl-tests", suite_hash=the_suite.hash,
                         suite=the_suite.model_dump(mode="json"), inventory_path=None)
        dest = run.dir / "providers" / provider / "imported"
        dest.mkdir(parents=True, exist_ok=True)
        series_logs = []
        for i, p in enumerate(logs, 1):
            copy = dest / f"round{i}_{p.name}"
            copy.write_bytes(p.read_bytes())
            series_logs.append((i, copy, False))
        fake_nodes = [inv_mod.Node(
            name=f"{provider}-node{k}", provider=provider, executor="local", host=None, port=22,
            user=None, identity_file=None, ssh_alias=None, proxy_jump=None, python="python3",
            work_dir="-", ckpt_dir=None, env={}, connect_timeout_s=1) for k in range(nodes)]
        findings, ms = judge_series(Series("imported", fake_nodes, series_logs,
                                           provider=provider), run, None, the_suite)
        run.add_findings(findings)
        run.add_measurements(ms)
        _print_outcome(run, findings, ms, [f"provider:{provider}"], verbose)
        return _finish(run, findings)


def _print_outcome(run: Run, findings: list[Finding], ms: Sequence[object], names: list[str],
                   verbose: bool) -> None:
    names = names + sorted({f.node for f in findings if f.node not in names})
    shown = [f for f in findings if verbose or f.severity in ("WARN", "FAIL")
             or f.code in ("NCCL_BUSBW", "NCCL_TRANSPORTS", "NCCL_REFERENCE")]
    out.print(findings_table(shown, f"findings — run {run.run_id}", verbose=True))
    out.print(summary_table(findings, names))
    out.print(f"{len(ms)} measurements; results: {run.dir}")


def _finish(run: Run, findings: list[Finding]) -> int:
    failed = any(f.severity == "FAIL" for f in findings)
    run.finish("failed" if failed else "passed")
    return 1 if failed else 0
