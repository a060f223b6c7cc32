"""What is known of the machine a series ran on, for the shipped bands' assumptions.

From the log itself: the GPU (rank lines), GPUs per node and nodes, NVLink SHARP (NVLS)
as NCCL INFO shows it, the NICs NCCL INFO lists. From preflight's facts in the same run
(`nodes/<node>/preflight/facts.json`), for a live series: NVLink links between GPU pairs
(`nvidia-smi topo -m`'s NV#) and the active RDMA ports with their rate (ibv_devinfo).
Nothing here guesses: what no source says stays None, and the finding calls that
assumption unverified.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from orchestrator.bands import NodeTraits, Trait
from orchestrator.nccltests import RUN_ENV
from orchestrator.parsers.nccl_debug import NcclDebugFacts, nvls_state, p2p_state

_NV = re.compile(r"NV(\d+)")


def series_traits(*, gpu: str | None, gpus: int | None, nodes: int, live: bool,
                  node_names: list[str], run_dir: Path | None, text: str,
                  dbg: NcclDebugFacts | None,
                  node_env: dict[str, dict[str, str]] | None = None) -> NodeTraits:
    """The traits of one series: `live` is a run gpuvet made (its environment known, and
    each node's inventory `env` in `node_env`), else an imported log (only what it
    shows)."""
    if live:
        nvls: Trait | None = Trait(RUN_ENV.get("NCCL_NVLS_ENABLE") != "0",
                                   "gpuvet runs with NCCL_NVLS_ENABLE=0")
    else:
        state = nvls_state(text)
        nvls = Trait(state[0], state[1]) if state is not None else None
    facts = [(n, _facts(run_dir, n)) for n in node_names] if live and run_dir else []
    p2p = p2p_state(text)
    off = [n for n, env in (node_env or {}).items() if env.get("NCCL_P2P_DISABLE") == "1"]
    p2p_trait = (Trait(p2p[0], p2p[1]) if p2p is not None else
                 Trait(False, f"the inventory sets NCCL_P2P_DISABLE=1 for {off[0]}") if off
                 else None)
    return NodeTraits(
        gpu=Trait(gpu, "the log's rank lines") if gpu else None,
        gpus=Trait(gpus, "the log") if gpus else None,
        nodes=Trait(nodes, "the log"),
        nvlink=_nvlink(facts),
        nics=_nics(facts, dbg),
        nic_rate_gbps=_rate(facts),
        nvls=nvls, p2p=p2p_trait)


def _facts(run_dir: Path, node: str) -> dict[str, Any] | None:
    path = run_dir / "nodes" / node / "preflight" / "facts.json"
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # no preflight in this run, or a damaged file: nothing said
    facts = doc.get("facts") if isinstance(doc, dict) else None
    return facts if isinstance(facts, dict) else None


def _nvlink(facts: list[tuple[str, dict[str, Any] | None]]) -> Trait | None:
    """The fewest NVLink links between any GPU pair of any node (NV18 on NVSwitch)."""
    seen: list[tuple[int, str]] = []
    for node, f in facts:
        topo = (f or {}).get("topo_m")
        if not isinstance(topo, dict) or topo.get("pcie_only"):
            continue
        matrix = topo.get("matrix") or {}
        gpus = [g for g in matrix if str(g).startswith("GPU")]
        links = [matrix[a].get(b) for a in gpus for b in gpus if a < b]
        counts = [int(m[1]) if (m := _NV.fullmatch(str(x))) else 0 for x in links]
        if counts:
            seen.append((min(counts), node))
    if not seen:
        return None
    low, node = min(seen)
    return Trait(low, f"preflight's nvidia-smi topo -m of {node}")


def _active_ports(f: dict[str, Any] | None) -> list[dict[str, Any]]:
    ib = (f or {}).get("ibv_devinfo")
    if not isinstance(ib, dict):
        return []
    return [p for d in ib.get("devices") or [] for p in d.get("ports") or []
            if p.get("state") == "PORT_ACTIVE"]


def _nics(facts: list[tuple[str, dict[str, Any] | None]],
          dbg: NcclDebugFacts | None) -> Trait | None:
    counted = [(len(_active_ports(f)), n) for n, f in facts
               if f is not None and isinstance(f.get("ibv_devinfo"), dict)]
    if counted:
        low, node = min(counted)
        return Trait(low, f"active ports in preflight's ibv_devinfo of {node}")
    if dbg is not None:
        per_host: dict[str, int] = {}
        for i in dbg.interfaces:
            if i.kind.startswith("IB"):
                per_host[i.host] = per_host.get(i.host, 0) + 1
        if per_host:
            return Trait(min(per_host.values()), "the NICs NCCL INFO lists (NET/IB : Using)")
    return None


def _rate(facts: list[tuple[str, dict[str, Any] | None]]) -> Trait | None:
    rates = []
    for node, f in facts:
        for p in _active_ports(f):
            m = re.fullmatch(r"(\d+)X", str(p.get("active_width") or ""))
            speed = p.get("active_speed_gbps")
            if m and isinstance(speed, (int, float)):
                rates.append((int(m[1]) * float(speed), node))
    if not rates:
        return None
    low, node = min(rates)
    return Trait(low, f"preflight's ibv_devinfo of {node}")
