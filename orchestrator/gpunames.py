"""GPU names: does the card a node reports match the card that was ordered?

Shared by the preflight checks (the order against every GPU), the shipped
reference bands (which bands belong to this machine) and the environment
comparison (form factor per provider), so it sits below all three and
imports nothing of gpuvet. nvidia-smi spells one card several ways
("NVIDIA H100 80GB HBM3", "Tesla V100-SXM2-16GB", "TeslaV100"); an order is
written by a person ("A100 SXM4 80GB"). The rules here decide when they
name the same card.
"""

from __future__ import annotations

import re

_MAKER = re.compile("nvidia|tesla")  # the maker's words say nothing about the model


def _norm(s: str) -> str:
    return re.sub(r"[^a-z0-9]", "", _MAKER.sub("", s.lower()))


def model_matches(expected: str, actual: str) -> bool:
    """Every token of the order ("A100 SXM4 80GB") must appear in the GPU's name.

    A token that starts or ends with a digit must not run on into more digits there:
    "L4" is not "L40S", "A10" is not "A100", "80GB" is not "180GB".
    """
    spaced, squashed = actual.lower(), _norm(actual)
    # the maker's words go, also where they run on into the model ("TeslaV100")
    tokens = [t for t in re.split(r"[^a-z0-9]+", _MAKER.sub(" ", expected.lower())) if t]

    def found(t: str) -> bool:
        pat = ((r"(?<![0-9])" if t[0].isdigit() else "") + re.escape(t)
               + (r"(?![0-9])" if t[-1].isdigit() else ""))
        return re.search(pat, spaced) is not None or re.search(pat, squashed) is not None

    return bool(tokens) and all(found(t) for t in tokens)


def form_factor_of(name: str) -> str | None:
    """"pcie" or "sxm" where the name says so; None where it does not (the topology
    checks decide then)."""
    n = name.lower()
    if "pcie" in n or " nvl" in n:
        return "pcie"
    if "sxm" in n or re.search(r"\bh(100|200|20)\b.*hbm3|^nvidia h200$|^nvidia gh200|^nvidia b200",
                               n):
        return "sxm"
    return None
