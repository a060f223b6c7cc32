"""CLI commands of the steps (preflight, nccl, ...), attached to the main app."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
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
        table.add_row(f.node, f"[{_STYLE[f.severity]}]{f.severity}[/]", f.code, f.message)
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
    @app.command()
    def preflight(
        inventory: InventoryOpt,
        node: NodeOpt = None,
        provider: ProviderOpt = None,
        from_: Annotated[Path | None, typer.Option(
            "--from", help="Judge a document collected by hand (`python3 -m payload collect "
            "--out F` on the node) instead of connecting; needs exactly one --node.")] = None,
        results: ResultsOpt = DEFAULT_ROOT,
        suite: SuiteOpt = None,
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
        run = Run.create(results, command="preflight", suite_hash=the_suite.hash,
                         suite=the_suite.model_dump(mode="json"), inventory_path=inventory)
        if from_ is not None:
            if not node or len(node) != 1:
                raise UsageError("--from judges one node's document: give exactly one --node")
            try:
                doc = json.loads(from_.read_text())
            except (OSError, json.JSONDecodeError) as exc:
                raise UsageError(f"cannot read {from_}: {exc}") from None
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
