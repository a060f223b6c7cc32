"""The fleet step on a resumed run: a provider whose fleet was judged in full keeps its
records; one cut short is dropped and run again from the start (its localisation needs
every pair's samples, which live only in the attempt that measured them; the builds are
cached on the nodes, so preparing again is quick)."""

from __future__ import annotations

from orchestrator.inventory import Node
from orchestrator.records import Finding, Measurement
from orchestrator.steps.fleet.engines import STEP
from orchestrator.store import Run


def judged_key(provider: str) -> str:
    return f"provider:{provider}/fleet-judged"


def restart_unfinished(run: Run, nodes: list[Node]) -> set[str]:
    """A resumed run: the providers whose fleet was judged in full keep their records; any
    other's partial plan is dropped and run again from the start (its localisation needs
    every pair's samples, which live only in the attempt that measured them; the builds
    are cached on the nodes, so preparing again is quick). Returns the providers judged
    in full."""
    providers = list(dict.fromkeys(n.provider for n in nodes))
    complete = {p for p in providers if run.is_done(judged_key(p), STEP)}
    stale = [p for p in providers if p not in complete]
    if not stale:
        return complete
    records: list[Finding | Measurement] = [*run.findings(), *run.measurements()]
    if any(r.step == STEP and r.provider in stale for r in records):
        keep = {r.unit_key for r in records if r.step == STEP and r.unit_key
                and r.provider not in stale}
        run.retract(keep_units=keep, step=STEP)
    for p in stale:
        for done in (run.dir / "providers").glob(f"{p}__fleet__*/{STEP}/done.json"):
            done.unlink(missing_ok=True)
    for n in nodes:
        if n.provider in stale:
            run.clear_done(f"node:{n.name}", STEP)
    return complete
