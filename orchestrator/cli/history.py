"""`gpuvet history -p P`: a provider's nodes and cards across runs, with repeat failures
and replaced cards (`analysis/history.py`)."""

from __future__ import annotations

from pathlib import Path

import click

from orchestrator.cli._common import emit_json, json_option, out, render, results_option
from orchestrator.cli.runs import known_providers
from orchestrator.render import terminal_text


def register(root: click.Group) -> None:
    @root.command("history")
    @results_option
    @click.option("-p", "--provider", "provider", required=True, metavar="NAME",
                  help="The provider whose nodes and cards to list.")
    @json_option
    def history_cmd(results: Path, provider: str, as_json: bool) -> int:
        """List a provider's nodes and cards with their verdicts across every run.

        Each GPU is known by its serial (else its UUID) as preflight recorded it; a run
        without a preflight is read against the node's nearest preflight. A card or node
        that FAILed on the provider's side with the same code in two or more runs is
        named with those runs; a node that came back with other cards is shown as a
        replacement. Setup-side FAILs (TRAIN_OOM, ...) never count. Exits 0: the
        history is listed, not judged again.
        """
        from orchestrator.analysis import history

        known_providers(results, [provider])
        h = history.history(results, provider)
        if as_json:
            emit_json(h.as_json())
            return 0
        render(history.nodes_table(h))
        render(history.cards_table(h))
        for line in h.repeats:
            out.print(terminal_text(f"FAIL again: {line}"), markup=False, highlight=False)
        for line in h.replacements:
            out.print(terminal_text(f"replaced: {line}"), markup=False, highlight=False)
        if not h.repeats:
            out.print("no card or node FAILed twice on the provider's side", markup=False)
        return 0
