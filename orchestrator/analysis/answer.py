"""The answer a reader needs first: each provider's headline (verdict, decisive reasons,
cost), the order it is judged against, and the decision's tables (the lines that are not
ok, worst first, with whose side each is on; the lines that passed, folded). The terminal,
`--json` and the report render these; `verdict.py` decides, this says it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.analysis import cost
from orchestrator.analysis.verdict import NOT_OK, ProviderVerdict
from orchestrator.verdicts import Table

RANK = {"no-go": 0, "not proven": 1, "missing": 2, "ok": 3, "not applicable": 4}


def verdicts_table(vs: Sequence[ProviderVerdict]) -> Table:
    return Table("verdict per provider", ("provider", "verdict", "why", "no-go", "not proven",
                                          "missing", "ok"),
                 [(v.provider, v.verdict, "; ".join(v.decisive),
                   *(sum(r.outcome == o for r in v.reasons)
                     for o in ("no-go", "not proven", "missing", "ok"))) for v in vs])


def short_evidence(evidence: Iterable[str], most: int = 3) -> str:
    """Evidence as people read it in a table: each file relative to its run (the run id is
    in the runs table), at most `most` named and the rest counted."""
    paths = [e.split("/", 1)[1] if "/" in e else e for e in evidence]
    shown = list(dict.fromkeys(paths))
    return ", ".join(shown[:most]) + (f" (+{len(shown) - most} more)" if len(shown) > most
                                      else "")


def reasons_table(vs: Sequence[ProviderVerdict]) -> Table:
    """The lines that are not ok, worst first (no-go, not proven, missing), with whose side
    each is on and the fix; the ok and not-applicable lines are folded into
    `folded_table`."""
    rows = sorted(((v.provider, r) for v in vs for r in v.reasons if r.outcome in NOT_OK),
                  key=lambda pr: RANK[pr[1].outcome])
    return Table("verdict reasons", ("provider", "check", "outcome", "side", "reason", "fix",
                                     "evidence"),
                 [(p, r.check, r.outcome, r.side, r.text, r.fix, short_evidence(r.evidence))
                  for p, r in rows])


def folded_table(vs: Sequence[ProviderVerdict]) -> Table:
    """The lines that passed or do not apply, one row per provider."""
    rows = []
    for v in vs:
        ok = [r.check for r in v.reasons if r.outcome == "ok"]
        na = [r.check for r in v.reasons if r.outcome == "not applicable"]
        if ok or na:
            rows.append((v.provider, ", ".join(ok) or "-", ", ".join(na) or "-"))
    return Table("checks that passed", ("provider", "ok", "not applicable"), rows)


# --- the order and the headline ------------------------------------------------------------

def orders_of(sel: Any, provider: str) -> dict[str, Any]:
    """The provider's `expect` (what was ordered) from the inventory copy of its newest
    selected run; {} where the copy has none."""
    ids = sel.run_ids(provider)
    mine = sel.runs[sel.runs["run_id"].isin(ids)]
    for path in reversed(list(mine["path"])):
        doc = cost.run_inventory(Path(str(path)))
        prov = ((doc or {}).get("providers") or {}).get(provider)
        if isinstance(prov, dict):
            expect = prov.get("expect")
            return dict(expect) if isinstance(expect, dict) else {}
    return {}


@dataclass(frozen=True)
class Headline:
    """What a reader of the comparison needs first: the verdict, the one to three decisive
    reasons in words, and what the PoC cost."""

    provider: str
    verdict: str
    reasons: tuple[str, ...]
    cost: str  # "" with --no-cost

    @property
    def text(self) -> str:
        return f"{self.provider}: {self.verdict}" + (
            f": {'; '.join(self.reasons)}" if self.reasons else "")

    def as_json(self) -> dict[str, Any]:
        return {"provider": self.provider, "verdict": self.verdict,
                "reasons": list(self.reasons), "cost": self.cost, "text": self.text}


def cost_words(pocs: Sequence[Any], provider: str) -> str:
    """The PoC cost in one line: the widest billed window's total and the price it came
    from ("0.27 USD over 0.11 h (instance up since boot; storage and transfer not priced),
    2.49 USD per GPU-hour, billed per second")."""
    mine = [c for c in pocs if c.provider == provider]
    if not mine:
        return ""
    priced = [c for c in mine if c.total is not None]
    if not priced:
        why = mine[0].why or "no pricing in the inventory"
        return f"cost not priced ({why})"
    c = max(priced, key=lambda c: c.billed_hours or 0.0)
    p = c.pricing
    # "0.21 USD + storage, transfer not priced over 0.06 h" read as a sum over a time
    unpriced = " and ".join(c.unpriced)
    rest = f"; {unpriced} not priced" if c.unpriced else ""
    return (f"PoC cost {c.total:.2f} {c.currency} over {c.billed_hours or 0:.2f} h "
            f"({c.window.name}{rest}), {cost.price_words(p)}")


def headlines(vs: Sequence[Any], pocs: Sequence[Any]) -> list[Headline]:
    """One headline per provider, NO-GO first, then NOT ENOUGH EVIDENCE, then GO."""
    rank = {"NO-GO": 0, "NOT ENOUGH EVIDENCE": 1, "GO": 2}
    return [Headline(v.provider, v.verdict, tuple(v.decisive), cost_words(pocs, v.provider))
            for v in sorted(vs, key=lambda v: rank.get(v.verdict, 3))]
