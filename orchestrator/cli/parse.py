"""`gpuvet parse` (one parser on a saved output) and `gpuvet import` (earlier manual runs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from orchestrator.cli._common import (
    Group,
    emit_json,
    json_option,
    out,
    render,
    results_option,
    verbose_option,
)
from orchestrator.cli._steps import show_outcome
from orchestrator.errors import UsageError


def transports(text: str, source: str) -> dict[str, Any] | None:
    """What NCCL_DEBUG=INFO lines in an nccl-tests log say about the transports used."""
    from orchestrator.errors import ParseError
    from orchestrator.parsers.nccl_debug import parse_nccl_debug

    try:
        dbg = parse_nccl_debug(text, source=source)
    except ParseError:
        return None  # the log has no NCCL INFO lines
    return {"used": dbg.used, "nccl_version": dbg.nccl_version, "n_ranks": dbg.n_ranks,
            "n_nodes": dbg.n_nodes, "gdrdma": dbg.gdrdma, "networks": dbg.networks,
            "summary": dbg.summary()}


def _read(path: Path) -> str:
    from orchestrator.files import MAX_INPUT_BYTES, read_user_file

    return read_user_file(path, MAX_INPUT_BYTES, "saved output").decode("utf-8", "replace")


def _parse(func: Any, text: str, source: str) -> tuple[str, Any]:
    """The facts as the scrubbed text gives them: what a parser lists (`ignored_lines`)
    holds no secret, a key block's body lines included. A refusal is as quick as before
    (its quoted line scrubbed as the text around it says); a text with nothing to scrub is
    parsed once."""
    from orchestrator.errors import ParseError
    from payload.scrub import scrub_text

    try:
        facts = func(text, source=source)
    except ParseError as exc:
        raise exc.scrubbed(text) from None
    clean = scrub_text(text)
    return (clean, facts) if clean == text else (clean, func(clean, source=source))


def register(root: click.Group) -> None:
    @root.command()
    @click.argument("kind", required=False)
    @click.argument("file", required=False, type=click.Path(path_type=Path, dir_okay=False))
    @click.option("--list", "list_", is_flag=True,
                  help="List parser kinds, each with a command whose output it reads.")
    @json_option
    def parse(kind: str | None, file: Path | None, list_: bool, as_json: bool) -> int:
        """Run one parser on a saved command output and print the facts it finds.

        Pasted text is read as far as it is the tool's: prompts, command lines,
        launcher and ssh noise are read past and listed (`ignored_lines`), marks of
        editing (`...`, a lost `#`) are listed as `edits`. A file may have up to 64 MiB
        (an nccl-tests log up to 10,000 table rows).
        """
        from orchestrator import parsers
        from orchestrator.verdicts import Table

        if list_:
            table = Table("parser kinds", ("kind", "example", "reads"),
                          [(s.kind, s.example, s.description) for s in parsers.kinds()])
            if as_json:
                emit_json(table.as_json())
            else:  # one line per kind, so `grep` finds a kind with its command
                for spec in parsers.kinds():
                    out.print(f"{spec.kind:30} {spec.description}; e.g. `{spec.example}`",
                              markup=False, highlight=False, soft_wrap=True)
            return 0
        if kind is None or file is None:
            raise UsageError("parse needs KIND and FILE", hint="see `gpuvet parse --list`")
        spec = parsers.get(kind)
        from orchestrator.errors import shown

        text, facts = _parse(spec.func, _read(file), shown(str(file)))
        data = parsers.to_jsonable(facts)
        tr = transports(text, shown(str(file))) if kind == "nccl-tests" else None
        if as_json:
            emit_json({**data, "transports": tr} if tr is not None else data)
        else:
            from orchestrator.render import render_facts

            render_facts(out, kind, facts)
            if tr is not None:
                out.print(tr["summary"])
        return 0

    @root.group("import", cls=Group)
    def import_() -> None:
        """Bring results of earlier manual runs into the results store."""

    @import_.command("nccl-tests")
    @click.argument("logs", nargs=-1, required=True,
                    type=click.Path(path_type=Path, dir_okay=False))
    @click.option("-p", "--provider", required=True, help="Provider name to file them under.")
    @click.option("--nodes", "n_nodes", type=click.IntRange(min=1), default=None,
                  help="How many nodes the run spanned [default: from the log: the hosts its "
                       "rank lines name, or NCCL INFO's nNodes; one where it shows no rank]. "
                       "A log whose ranks run on more hosts than --nodes is refused.")
    @results_option
    @verbose_option
    @json_option
    def import_nccl_tests(logs: tuple[Path, ...], provider: str, n_nodes: int | None,
                          results: Path,
                          verbose: bool, as_json: bool) -> int:
        """Import nccl-tests text logs as one series of rounds; judge them like a live run.

        The suite hash comes from the parameters the logs print (sizes, GPUs, iterations,
        check, datatype, op), so imports of different experiments never share one. A log
        may hold up to 10,000 table rows and 64 MiB. Logs already imported are recognised
        by content; an import of them that was cut short (a full disk, Ctrl-C) is done
        again, into the same run.
        """
        from orchestrator.steps.nccl.importer import AlreadyImported, import_logs

        try:
            run, findings, ms = import_logs(list(logs), provider, n_nodes, results)
        except AlreadyImported as exc:
            out.print(f"these logs were already imported, as run {exc.run_id}: nothing new "
                      f"recorded (see gpuvet show {exc.run_id})")
            return 0
        return show_outcome(run, findings, [], verbose=verbose, as_json=as_json,
                            n_measurements=len(ms))

    @import_.command("poc")
    @click.argument("folder", type=click.Path(path_type=Path, file_okay=False))
    @click.option("-p", "--provider", required=True, help="Provider name to file it under.")
    @click.option("-n", "--node", "node", metavar="NAME",
                  help="Node name [default: with -i, the provider's node (its only one, or the "
                       "one the folder's hostname names); else the hostname the outputs "
                       "print, else 'poc'].")
    @click.option("-i", "--inventory", type=click.Path(path_type=Path, dir_okay=False),
                  help="Judge against this provider's order (`expect`); without it nothing "
                       "is compared with an order (GPUVET_INVENTORY is not read here).")
    @results_option
    @verbose_option
    @json_option
    def import_poc(folder: Path, provider: str, node: str | None, inventory: Path | None,
                   results: Path, verbose: bool, as_json: bool) -> int:
        """Judge a folder of outputs collected by hand (the acceptance recipe's files).

        Files are recognised by content, whatever their names: nvidia-smi (table, -L, -q and
        its sed/grep cuts, -q -x, --query-gpu with or without its header), topo -m/-p2p,
        nvlink, uname, nvcc, the recipe's PyTorch check or gpuvet's torch probe, ibstat,
        ibv_devinfo, nccl-tests logs, dmon, /proc/mounts, the build log, pip, the nccl-tests
        commit and the date; and the health outputs of other tools: dcgmi diag, kernel logs
        with Xid lines or the PCI core's "limited by" lines, nvlink -e, lspci -vvv, the
        processes on the GPUs (--query-compute-apps), ib_write_bw and the other perftest
        programs, nvbandwidth, p2pBandwidthLatencyTest. Each file is judged, recorded, or
        reported (not recognised,
        unreadable, from another node); a file of several hosts' outputs is split by rank;
        a source checkout beside the logs is skipped. Exit 2 only when nothing could be
        judged.
        """
        from orchestrator.steps.poc.importer import files_table, import_poc

        res = import_poc(folder, provider, node, inventory, results)
        if not as_json:
            render(files_table(res.files, folder))
            src = res.run.meta.source or {}
            uuids = src.get("gpu_uuids") or []
            out.print(f"filed under node {res.node} of provider {provider}; the folder's "
                      f"hostname: {src.get('hostname') or '(none printed)'}; GPU UUIDs: "
                      f"{', '.join(uuids) if uuids else '(none printed)'}")
        return show_outcome(res.run, res.findings, [res.node], verbose=verbose,
                            as_json=as_json, n_measurements=len(res.measurements),
                            title="PoC findings")

