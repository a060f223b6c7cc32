"""What each node was, as a tidy frame: one row per (run, node, key).

Two platforms are compared only next to what they were: GPU model and memory,
count, form factor, MIG, topology, fabric, driver, CUDA, NCCL, the nccl-tests
commit, torch, kernel and image. Those come from what the nodes themselves
reported (preflight's parsed facts, the nccl-tests build document), never from
the inventory: the order says what was promised, not what was delivered. Each
value names the raw file it was read from, relative to its run's directory.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pandas as pd
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from orchestrator.gpunames import form_factor_of, model_matches
from orchestrator.verdicts import Table

KEYS = ("gpu_model", "gpu_memory", "gpu_count", "form_factor", "mig", "topology", "fabric",
        "driver", "cuda", "cuda_toolkit", "nccl", "nccl_torch", "nccl_tests_commit", "torch",
        "kernel", "image")
LABELS = {"gpu_model": "GPU model", "gpu_memory": "GPU memory", "gpu_count": "GPUs per node",
          "form_factor": "form factor", "mig": "MIG", "topology": "topology class",
          "fabric": "fabric", "driver": "driver", "cuda": "CUDA (driver)",
          "cuda_toolkit": "CUDA toolkit (nvcc)", "nccl": "NCCL (nccl-tests build)",
          "nccl_torch": "NCCL (torch)", "nccl_tests_commit":
          "nccl-tests commit", "torch": "torch", "kernel": "kernel", "image": "image"}
COLUMNS = ["run_id", "provider", "node", "key", "value", "evidence"]
UNITS = {"gpu_memory": "GiB"}  # the unit a key's values are written in, for `with_units`
MISSING = "not reported"


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def preflight_docs(run_dir: Path, provider: str) -> Iterator[tuple[str, Path, dict[str, Any]]]:
    """(node, path, facts.json) of each of the provider's nodes whose preflight in this run
    left a readable document: the one reader the boot times, the good GPU-hour and the card
    history share."""
    if not (run_dir / "nodes").is_dir():
        return
    owners = node_providers(run_dir, [provider])
    for f in sorted(run_dir.glob("nodes/*/preflight/facts.json")):
        node = f.parent.parent.name
        if owners.get(node, provider) != provider:
            continue
        doc = _read_json(f)
        if doc is not None:
            yield node, f, doc


def node_providers(run_dir: Path, providers: Iterable[str]) -> dict[str, str]:
    """Node -> provider from the run's own inventory copy (what the run was started with)."""
    provs = list(providers)
    try:
        doc = YAML(typ="safe").load((run_dir / "inventory.yaml").read_text(encoding="utf-8"))
    except (OSError, YAMLError):
        doc = None
    out: dict[str, str] = {}
    if isinstance(doc, dict) and isinstance(doc.get("providers"), dict):
        for pname, prov in doc["providers"].items():
            for spec in (prov or {}).get("nodes") or []:
                if isinstance(spec, dict) and "name" in spec:
                    out[str(spec["name"])] = str(pname)
    if not out and len(provs) == 1:
        nodes_dir = run_dir / "nodes"
        if nodes_dir.is_dir():
            out = {d.name: provs[0] for d in nodes_dir.iterdir() if d.is_dir()}
    return out


def _topology(topo: dict[str, Any]) -> str | None:
    matrix = topo.get("matrix") or {}
    gpus = [g for g in matrix if g.startswith("GPU")]
    kinds = sorted({str(matrix[a].get(b)) for i, a in enumerate(gpus) for b in gpus[i + 1:]
                    if matrix[a].get(b) not in (None, "X")})
    if not kinds:
        return "single GPU" if len(gpus) == 1 else None
    if all(k.startswith("NV") for k in kinds):
        return f"NVLink every pair ({', '.join(kinds)})"
    return f"PCIe/host paths ({', '.join(kinds)})"


def _fabric(ibv: dict[str, Any] | None) -> str:
    if ibv is None:
        return MISSING
    devices = ibv.get("devices") or []
    if not devices:
        return f"none ({ibv.get('message') or 'no RDMA devices'})"
    up: dict[str, int] = {}
    rates: set[str] = set()
    for d in devices:
        for p in d.get("ports") or []:
            if p.get("state") == "PORT_ACTIVE":
                layer = "RoCE" if p.get("link_layer") == "Ethernet" else "InfiniBand"
                up[layer] = up.get(layer, 0) + 1
                width, speed = p.get("active_width"), p.get("active_speed_gbps")
                if width and speed:
                    lanes = int(str(width).rstrip("X") or 1)
                    rates.add(f"{lanes * speed:g} Gb/s")
    if not up:
        return f"{len(devices)} RDMA device(s), no port active"
    parts = [f"{layer} x{n}" for layer, n in sorted(up.items())]
    return ", ".join(parts) + (f" @ {'/'.join(sorted(rates))}" if rates else "")


def preflight_values(facts_doc: dict[str, Any], node_rel: str) -> dict[str, tuple[str, str]]:
    """key -> (value, evidence) from one node's facts.json."""
    facts = facts_doc.get("facts") or {}
    versions = facts_doc.get("versions") or {}
    raw = f"{node_rel}/preflight/raw"
    out: dict[str, tuple[str, str]] = {}
    gpus = (facts.get("query_gpu") or {}).get("gpus") or []
    gpu_src = "query_gpu"
    if not gpus:
        gpus, gpu_src = (facts.get("nvidia_smi_L") or {}).get("gpus") or [], "nvidia_smi_L"
    if gpus:
        ev = f"{raw}/{gpu_src}.txt"
        names = sorted({str(g.get("name") or "?") for g in gpus})
        out["gpu_model"] = (", ".join(names), ev)
        out["gpu_count"] = (str(len(gpus)), ev)
        mems = sorted({g["memory_total_mib"] for g in gpus if g.get("memory_total_mib")})
        if mems:
            unit = UNITS["gpu_memory"]
            out["gpu_memory"] = (", ".join(f"{m / 1024:.1f} {unit}" for m in mems), ev)
        forms = sorted({form_factor_of(n) or "not evident from the name" for n in names})
        out["form_factor"] = (", ".join(f.upper() if len(f) < 5 else f for f in forms), ev)
        mig = [g.get("index") for g in gpus if g.get("mig_enabled")]
        devs = sum(len(g.get("mig_devices") or []) for g in gpus)
        if mig or devs:
            out["mig"] = (f"on (GPUs {', '.join(map(str, mig)) or '?'}; {devs} MIG device(s))",
                          ev)
        elif gpu_src == "query_gpu" and all("mig_enabled" in g for g in gpus):
            out["mig"] = ("off", ev)
    topo = facts.get("topo_m")
    if topo:
        t = _topology(topo)
        if t:
            out["topology"] = (t, f"{raw}/topo_m.txt")
    if "ibv_devinfo" in facts:
        out["fabric"] = (_fabric(facts["ibv_devinfo"]), f"{raw}/ibv_devinfo.txt")
    for key, vkey, cid in (("driver", "driver", "query_gpu"),
                           ("cuda", "cuda_driver", "nvidia_smi_q_xml"),
                           ("cuda_toolkit", "nvcc", "nvcc_version"),
                           ("nccl_torch", "nccl", "torch"), ("torch", "torch", "torch")):
        if versions.get(vkey):
            out[key] = (str(versions[vkey]), f"{raw}/{cid}.txt")
    kernel = (facts.get("uname") or {}).get("kernel_release")
    if kernel:
        out["kernel"] = (str(kernel), f"{raw}/uname.txt")
    image = (facts.get("os_release") or {}).get("pretty_name")
    if image:
        out["image"] = (str(image), f"{raw}/os_release.txt")
    return out


def build_values(done: dict[str, Any], evidence: str) -> dict[str, tuple[str, str]]:
    """key -> (value, evidence) from the nccl step's done.json (the build document)."""
    b = done.get("build") or {}
    build_json = evidence
    out: dict[str, tuple[str, str]] = {}
    if b.get("built_commit"):
        out["nccl_tests_commit"] = (str(b["built_commit"]), build_json)
    version = (b.get("nccl") or {}).get("version")
    if version:
        out["nccl"] = (str(version), build_json)
    return out


def run_environment(run_dir: Path, run_id: str, providers: Iterable[str]) -> list[dict[str, Any]]:
    owners = node_providers(run_dir, providers)
    nodes_dir = run_dir / "nodes"
    rows: list[dict[str, Any]] = []
    if not nodes_dir.is_dir():
        return rows
    for node_dir in sorted(d for d in nodes_dir.iterdir() if d.is_dir()):
        node = node_dir.name
        rel = f"nodes/{node}"
        values: dict[str, tuple[str, str]] = {}
        facts = _read_json(node_dir / "preflight" / "facts.json")
        if facts is not None:
            values.update(preflight_values(facts, rel))
        done = _read_json(node_dir / "nccl" / "done.json")
        if done is not None:
            doc = "build.json" if (node_dir / "nccl" / "build.json").is_file() else "done.json"
            values.update(build_values(done, f"{rel}/nccl/{doc}"))
        for key in KEYS:
            if key in values:
                value, ev = values[key]
                rows.append({"run_id": run_id, "provider": owners.get(node, "?"), "node": node,
                             "key": key, "value": value, "evidence": ev})
    return rows


def environment(runs: pd.DataFrame) -> pd.DataFrame:
    """Tidy environment facts of these runs (a `frames.runs` frame): what the nodes said."""
    rows: list[dict[str, Any]] = []
    for run_id, path, provs in zip(runs["run_id"], runs["path"], runs["providers"], strict=True):
        rows += run_environment(Path(str(path)), str(run_id), list(provs))
    return pd.DataFrame(rows, columns=COLUMNS)


def with_units(env: pd.DataFrame) -> pd.DataFrame:
    """The facts as data: the unit in a column of its own ("79.6 GiB" is value "79.6",
    unit "GiB"; a node of several sizes "79.6, 80.0" GiB), null where a fact has none."""
    def split(key: str, value: str) -> tuple[str, str | None]:
        unit = UNITS.get(key)
        if unit is None:
            return value, None
        parts = value.split(", ")
        if not all(p.endswith(f" {unit}") for p in parts):
            return value, None
        return ", ".join(p[:-len(unit) - 1] for p in parts), unit

    pairs = [split(str(k), str(v)) for k, v in zip(env["key"], env["value"], strict=True)]
    out = env.copy()
    out["value"] = [v for v, _ in pairs]
    out.insert(list(out.columns).index("value") + 1, "unit", [u for _, u in pairs])
    return out


def latest(env: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """The newest value of every (provider, node, key): a later run describes the node now."""
    if env.empty:
        return env
    order = {rid: i for i, rid in enumerate(runs.sort_values(["started", "run_id"])["run_id"])}
    df = env.assign(_order=env["run_id"].map(order)).sort_values("_order")
    return df.groupby(["provider", "node", "key"], as_index=False).last().drop(columns="_order")


def provider_values(env: pd.DataFrame, provider: str, key: str) -> list[str]:
    """The distinct values a provider's nodes reported for a key."""
    sel = env[(env["provider"] == provider) & (env["key"] == key)]
    return sorted(set(sel["value"]))


def gpu_total(env: pd.DataFrame, provider: str) -> int | None:
    """GPUs across a provider's nodes, as the nodes reported them."""
    sel = env[(env["provider"] == provider) & (env["key"] == "gpu_count")]
    if sel.empty:
        return None
    return int(sum(int(v) for v in sel["value"]))


# what the inventory's `expect` says for a key of the table, and how to show it
ORDER_KEYS = {"gpu_model": "gpu_model", "gpu_memory": "memory_per_gpu_gb",
              "gpu_count": "gpus_per_node", "form_factor": "form_factor"}


def ordered_value(order: Mapping[str, Any], key: str) -> str | None:
    """The order for a key of the table as a cell shows it; None where it was not ordered."""
    if key == "mig":
        return "off" if not order.get("mig_allowed") else None
    want = order.get(ORDER_KEYS.get(key, ""))
    if want is None:
        return None
    if key == "gpu_memory":
        return f"{float(want):g} GB"
    if key == "form_factor":
        return str(want).upper() if str(want).lower() == "sxm" else "PCIe"
    return str(want)


_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def as_ordered(key: str, delivered: str, ordered: str) -> bool:
    """Whether a delivered value is what was ordered: the card as a variant, the memory
    within 10% (an "80 GB" card reports 79.6 GiB), the rest as written."""
    if key == "gpu_model":
        return model_matches(ordered, delivered)
    if key == "gpu_memory":
        got, want = _NUMBER.search(delivered), _NUMBER.search(ordered)
        if got is None or want is None:
            return False
        return abs(float(got[0]) - float(want[0])) <= 0.1 * float(want[0])
    return delivered.strip().lower() == ordered.strip().lower()


def diff_table(env: pd.DataFrame, providers: list[str],
               orders: Mapping[str, Mapping[str, Any]] | None = None) -> Table:
    """Key by key, each provider's order and delivered values side by side; differences
    flagged, never hidden.

    A delivered value that is not what the provider ordered is flagged NOT AS ORDERED
    (before any other flag: it is the provider's side), a provider whose nodes disagree
    among themselves is flagged too ("nodes differ"), and a key no node reported is
    "not reported", which is not the same as equal."""
    orders = orders or {}
    rows = []
    for key in KEYS:
        vals = {p: provider_values(env, p, key) for p in providers}
        cells: list[str] = []
        wrong: list[str] = []
        for p, v in vals.items():
            want = ordered_value(orders.get(p) or {}, key)
            cells += [want or "-", " | ".join(v) if v else MISSING]
            if want is not None and v and not all(as_ordered(key, x, want) for x in v):
                wrong.append(p)
        if wrong:
            flag = f"NOT AS ORDERED ({', '.join(wrong)})"
        elif any(len(v) > 1 for v in vals.values()):
            flag = "DIFFERS (nodes differ)"
        elif any(not v for v in vals.values()):
            flag = "MISSING"
        elif len({tuple(v) for v in vals.values()}) > 1:
            flag = "DIFFERS"
        else:
            flag = "same"
        rows.append((LABELS[key], *cells, flag))
    cols = [c for p in providers for c in (f"{p} ordered", p)]
    return Table("environment", ("what", *cols, "flag"), rows)
