"""A node's health output folder as ``python3 -m payload health`` writes it on a GPU
host, built from real captures: the counter reads of the one- and two-GPU H200 hosts
(tests/fixtures/h200x1-health, h200x2/commands) and the figures the plain torch
reference measured on the H200 (h200x1-health/ref.json). Tests change one thing
(a planted fault) and judge the folder."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

FIX = Path(__file__).resolve().parents[1] / "fixtures"
H1 = FIX / "h200x1-health"
H2 = FIX / "h200x2" / "commands"
REF = json.loads((H1 / "ref.json").read_text())
T0 = 1_796_000_000.0


def gpu_values(ref: dict[str, Any] = REF) -> dict[str, dict[str, Any]]:
    """Each phase's `done` event of one healthy H200, from the reference figures."""
    mm: dict[str, Any] = {}
    for p in ("bf16", "fp16", "tf32", "fp32", "fp64", "fp8"):
        mm[f"{p}_tflops"] = ref[f"mm_{p}_TFLOPs"]
        mm.update({f"{p}_rows_bad": 0, f"{p}_cols_bad": 0, f"{p}_repeat_mismatches": 0})
    burst, sus = ref["mm_bf16_TFLOPs"], ref["mm_bf16_sustained15s_TFLOPs"]
    return {
        "memcopy": {"values": {"copy_gbps": ref["copy_2GiB_GBps"]},
                    "check": {"copy_equal": True}, "params": {"bytes": 2 << 30}},
        "memread": {"values": {"read_gbps": ref["read_sum_2GiB_GBps"]}},
        "matmul": {"values": mm, "params": {"n": 8192}},
        "sustained": {"values": {"tflops": sus, "burst_tflops": burst,
                                 "ratio_to_burst": sus / burst, "min_tflops": sus * 0.98,
                                 "last_tflops": sus, "repeat_mismatches": 0},
                      "params": {"window_s": 15.0}},
        "memtest": {"values": {"mismatches": 0, "passes": 1, "bytes_tested": 120 << 30,
                               "fraction_of_free": 0.9}, "examples": []},
    }


def _index(names: list[str], folder: str) -> dict[str, Any]:
    return {n: {"file": f"counters/{folder}/{f}", "readable": True, "rc": 0}
            for n, f in [x.split("|") for x in names]}


def write_node(root: Path, *, gpus: int = 1, phases: list[dict[str, dict[str, Any]]] | None
               = None, query_after: str | None = None, dmesg_after: str = "",
               compute_apps: str | None = None, links: dict[str, Any] | None = None,
               reasons_csv: str | None = None, query_before: str | None = None,
               device: str = "cuda", status: str = "ok", dcgmi: str | None = None,
               kernel_readable: bool = True, cc: tuple[int, int] = (9, 0),
               name: str = "NVIDIA H200", sms: int | None = None) -> Path:
    """The folder of one node; `phases[i]` overrides GPU i's done events (merged)."""
    root.mkdir(parents=True, exist_ok=True)
    src = H1 if gpus == 1 else H2
    q = (src / ("query-health.csv" if gpus == 1 else "query-gpu.csv")).read_text()
    before = query_before or q
    after = query_after or before
    dmesg = (H1 / "dmesg.txt").read_text()
    apps = compute_apps or "gpu_uuid, pid, process_name, used_gpu_memory [MiB]\n"
    for when, query, log in (("before", before, dmesg), ("after", after, dmesg + dmesg_after)):
        d = root / "counters" / when
        d.mkdir(parents=True, exist_ok=True)
        (d / "query-gpu.csv").write_text(query)
        (d / "compute-apps.csv").write_text(apps)
        (d / "nvlink-e.txt").write_text("")
        (d / "dmesg.txt").write_text(log)
        names = ["query-gpu|query-gpu.csv", "compute-apps|compute-apps.csv",
                 "nvlink-e|nvlink-e.txt"]
        if kernel_readable:
            names.append("dmesg|dmesg.txt")
        index = _index(names, when)
        if not kernel_readable:
            index["dmesg"] = {"readable": False, "rc": 1, "file": f"counters/{when}/dmesg.txt",
                              "note": "not readable: exit 1: dmesg: read kernel buffer "
                                      "failed: Operation not permitted"}
        index["journalctl-k"] = {"readable": False, "rc": 127, "missing": True,
                                 "note": "not readable: journalctl not found"}
        if when == "before" and gpus > 1:
            (d / "topo-m.txt").write_text((H2 / "topo-m.txt").read_text())
            index["topo-m"] = {"file": f"counters/{when}/topo-m.txt", "readable": True, "rc": 0}
        (d / "index.json").write_text(json.dumps(index))
    labels = {str(i): str(i) for i in range(gpus)}
    results: dict[str, Any] = {}
    for i in range(gpus):
        ph = gpu_values()
        for k, v in ((phases or [])[i] if phases and i < len(phases) else {}).items():
            merged = copy.deepcopy(ph.get(k, {}))
            for kk, vv in v.items():
                if isinstance(vv, dict) and isinstance(merged.get(kk), dict):
                    merged[kk] = {**merged[kk], **vv}
                else:
                    merged[kk] = vv
            ph[k] = merged
        evs = [{"event": "hello", "gpu": str(i), "t": T0, "name": name, "cc": list(cc),
                "total_bytes": 143771 << 20, "uuid": None,
                **({"sms": sms} if sms is not None else {})}]
        for n, (phase, ev) in enumerate(ph.items()):
            event = ev.pop("event", "done")
            evs.append({"event": event, "phase": phase, "gpu": str(i), "t": T0 + 2 + 3 * n,
                        "wall_s": 2.0, **ev})
        (root / f"gpu{i}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evs))
        results[str(i)] = {e["phase"]: e for e in evs if "phase" in e}
    if links is None:
        links = {"pcie": {"event": "done", "phase": "pcie", "values": {
            **{f"{i}_h2d_gbps": REF["h2d_pinned_1GiB_GBps"] for i in range(gpus)},
            **{f"{i}_d2h_gbps": REF["d2h_pinned_1GiB_GBps"] for i in range(gpus)}}}}
    (root / "links.jsonl").write_text("".join(json.dumps({"phase": k, **v}) + "\n"
                                              for k, v in links.items()))
    if reasons_csv is not None:
        (root / "gpu-reasons.csv").write_text(reasons_csv)
    phases_doc: dict[str, Any] = {}
    if dcgmi is not None:
        (root / "dcgmi-diag.txt").write_text(dcgmi)
        phases_doc["dcgmi"] = {"event": "done", "phase": "dcgmi", "rc": 0,
                               "file": "dcgmi-diag.txt", "argv": ["dcgmi", "diag", "-r", "1"]}
    else:
        phases_doc["dcgmi"] = {"event": "skip", "phase": "dcgmi", "reason": "dcgmi not found"}
    doc = {"tool": "gpuvet-health", "schema": 1, "level": "standard", "device": device,
           "status": status, "reason": None, "gpus": list(labels), "labels": labels,
           "workers": {f"gpu{i}": {"rc": 0, "pid": 100 + i} for i in range(gpus)},
           "results": results, "links": links, "node_phases": phases_doc, "wall_s": 41.0,
           "telemetry": {}}
    (root / "health.json").write_text(json.dumps(doc))
    return root


def two_gpu_links(gbps01: float = 370.0, gbps10: float = 370.0,
                  access: bool = True) -> dict[str, Any]:
    """The links of a two-GPU NV18 host: pcie per GPU, both at once, the peer matrix."""
    h2d, d2h = REF["h2d_pinned_1GiB_GBps"], REF["d2h_pinned_1GiB_GBps"]
    return {
        "pcie": {"event": "done", "values": {"0_h2d_gbps": h2d, "0_d2h_gbps": d2h,
                                             "1_h2d_gbps": h2d, "1_d2h_gbps": d2h}},
        "pcie_all": {"event": "done", "values": {"sum_h2d_gbps": 2 * h2d * 0.98,
                                                 "sum_d2h_gbps": 2 * d2h * 0.98}},
        "peer": {"event": "done", "values": {"min_gbps": min(gbps01, gbps10),
                                             "median_gbps": (gbps01 + gbps10) / 2},
                 "matrix": {"labels": ["0", "1"], "can_access_peer": [[True, access],
                                                                      [access, True]],
                            "gbps": [[None, gbps01], [gbps10, None]]}},
    }
