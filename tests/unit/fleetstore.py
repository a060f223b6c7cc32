"""A store of one provider's fleet written record by record, for the good-GPU-hour cost,
the node and card history and the claim: four nodes of two GPUs each, their preflight
facts (boot time, each GPU's index, UUID, serial and bus id), a health run in which one
node (n3) FAILs (memory bandwidth below the datasheet on GPU 1, and an Xid 79), and a
training run whose out-of-memory FAIL is the setup's (TRAIN_OOM).

The hours, by hand: the nodes booted at 08:00 (n4 at 08:30); preflight ran 09:00-09:06,
health 09:10-10:00, train 10:05-10:20. The billed window is "instance up since boot",
08:00 to 10:20, 2 h 20 min, billed per hour: 3 h. 2.5 USD per GPU-hour.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from orchestrator.rebuild import rebuild_index
from orchestrator.records import Finding, finding
from orchestrator.store import Run
from orchestrator.suite import Suite
from orchestrator.verdicts import run_status

PROVIDER = "acme"
NODES = ("n1", "n2", "n3", "n4")
BOOT = {"n1": "2026-12-01T08:00:00Z", "n2": "2026-12-01T08:00:00Z",
        "n3": "2026-12-01T08:00:00Z", "n4": "2026-12-01T08:30:00Z"}
TIMES = {"preflight": ("2026-12-01T09:00:00Z", "2026-12-01T09:06:00Z"),
         "health": ("2026-12-01T09:10:00Z", "2026-12-01T10:00:00Z"),
         "train": ("2026-12-01T10:05:00Z", "2026-12-01T10:20:00Z")}
PRICE = 2.5
INVENTORY = """\
version: 1
providers:
  acme:
    executor: local
    expect: {gpu_model: H100, gpus_per_node: 2}
    pricing: {gpu_hour: 2.5, currency: USD, billing_granularity: hour}
    env: {HF_TOKEN: "SECRET_IN_INVENTORY"}
    nodes:
      - {name: n1, work_dir: /tmp/gpuvet-local/n1/work}
      - {name: n2, work_dir: /tmp/gpuvet-local/n2/work}
      - {name: n3, work_dir: /tmp/gpuvet-local/n3/work}
      - {name: n4, work_dir: /tmp/gpuvet-local/n4/work}
      - {name: n5, work_dir: /tmp/gpuvet-local/n5/work}
"""


def gpu(node: str, i: int, generation: int = 0) -> dict[str, Any]:
    """GPU i of a node; another generation is another card (a replacement)."""
    n = int(node[1:])
    return {"index": i, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559,
            "uuid": f"GPU-{n:08x}-{generation:04x}-{i:04x}-0000-000000000000",
            "serial": f"16514240{n:02d}{generation}{i:02d}",
            "pci_bus_id": f"00000000:{0x18 + i:02X}:00.0", "mig_enabled": False}


def write_inventory(tmp: Path, secret: str = "SECRET_IN_INVENTORY") -> Path:
    path = tmp / "inventory.yaml"
    path.write_text(INVENTORY.replace("SECRET_IN_INVENTORY", secret))
    return path


def new_run(root: Path, command: str, inventory: Path, nodes: tuple[str, ...] = NODES) -> Run:
    suite = Suite()
    return Run.create(root, command=command, suite_hash=suite.hash,
                      suite=suite.model_dump(mode="json"), inventory_path=inventory,
                      providers=[PROVIDER], nodes=list(nodes))


def close(run: Run, times: tuple[str, str]) -> None:
    run.meta.started, run.meta.finished = times
    run.meta.status = run_status(run.findings())  # type: ignore[assignment]
    run.save_meta()


def write_facts(run: Run, node: str, gpus: list[dict[str, Any]], boot: str) -> str:
    """The node's preflight facts.json and raw query_gpu.txt; returns the raw file."""
    out = run.node_dir(node, "preflight")
    (out / "raw").mkdir(exist_ok=True)
    raw = out / "raw" / "query_gpu.txt"
    raw.write_text("index, name, uuid, pci.bus_id, serial\n" + "".join(
        f"{g['index']}, {g['name']}, {g['uuid']}, {g['pci_bus_id']}, {g['serial']}\n"
        for g in gpus))
    facts = {"boot_time": boot, "collected_at": None, "parse_errors": {}, "versions": {},
             "facts": {"query_gpu": {"fields": [], "gpus": gpus},
                       "uname": {"hostname": f"host-{node}"}}}
    (out / "facts.json").write_text(json.dumps(facts))
    return run.rel(raw)


def evidence(run: Run, node: str, step: str, name: str, text: str) -> str:
    path = run.node_dir(node, step) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return run.rel(path)


def preflight(root: Path, inventory: Path, times: tuple[str, str],
              cards: dict[str, list[dict[str, Any]]], boot: dict[str, str] | None = None
              ) -> Run:
    run = new_run(root, "preflight", inventory, tuple(cards))
    fs = []
    for node, gpus in cards.items():
        raw = write_facts(run, node, gpus, (boot or BOOT)[node])
        fs.append(finding(run.run_id, "preflight", provider=PROVIDER, node=node,
                          code="GPU_COUNT", severity="PASS", message=f"{len(gpus)} GPUs",
                          evidence=[raw]))
    run.add_findings(fs)
    close(run, times)
    return run


def membw_fail(run: Run, node: str, index: int, log_secret: str = "") -> list[Finding]:
    ev = evidence(run, node, "health", f"gpu{index}.jsonl",
                  '{"event": "membw", "copy_gbps": 1210.4}\n')
    fs = [finding(run.run_id, "health", provider=PROVIDER, node=node, code="HEALTH_MEMBW",
                  severity="FAIL", message=f"{node} GPU {index}: memory copy 1210.4 GB/s, "
                  "below 0.8 x the datasheet's 3350 GB/s", evidence=[ev], gpu=str(index),
                  value=1210.4, expected=2680.0, datasheet=3350.0, variant="H100 SXM5 80GB")]
    if log_secret:
        log = evidence(run, node, "health", "counters/after/dmesg.txt",
                       "[ 812.1] NVRM: Xid (PCI:0000:19:00): 79, pid=1234, GPU has fallen off "
                       f"the bus.\nexport HF_TOKEN={log_secret}\n")
        fs.append(finding(run.run_id, "health", provider=PROVIDER, node=node, code="GPU_XID",
                          severity="FAIL", message=f"{node}: Xid 79 (GPU has fallen off the bus)"
                          " on 0000:19:00 during the load", evidence=[log], xid=79,
                          pci="0000:19:00", category="bus", line_no=1))
    return fs


def health(root: Path, inventory: Path, times: tuple[str, str], nodes: tuple[str, ...],
           failing: dict[str, int], log_secret: str = "") -> Run:
    run = new_run(root, "health", inventory, nodes)
    fs = []
    for node in nodes:
        if node in failing:
            fs += membw_fail(run, node, failing[node], log_secret)
        else:
            ev = evidence(run, node, "health", "gpu0.jsonl", '{"event": "membw"}\n')
            fs.append(finding(run.run_id, "health", provider=PROVIDER, node=node,
                              code="HEALTH_MEMBW", severity="PASS", message="memory copy "
                              "3010 GB/s", evidence=[ev], gpu="0", value=3010.0))
    run.add_findings(fs)
    close(run, times)
    return run


def train_oom(root: Path, inventory: Path, times: tuple[str, str]) -> Run:
    run = new_run(root, "train", inventory, ("n1",))
    ev = evidence(run, "n1", "train", "reference/rank0.log", "CUDA out of memory\n")
    run.add_findings([finding(run.run_id, "train", provider=PROVIDER, node="n1",
                              code="TRAIN_OOM", severity="FAIL", message="n1: out of memory "
                              "with preset large", evidence=[ev])])
    close(run, times)
    return run


def fleet_store(root: Path, tmp: Path, log_secret: str = "",
                inventory_secret: str = "SECRET_IN_INVENTORY") -> dict[str, str]:
    """Four nodes, n3 failing its health run; returns run ids by step."""
    inv = write_inventory(tmp, inventory_secret)
    cards = {n: [gpu(n, 0), gpu(n, 1)] for n in NODES}
    ids = {"preflight": preflight(root, inv, TIMES["preflight"], cards).run_id,
           "health": health(root, inv, TIMES["health"], NODES, {"n3": 1}, log_secret).run_id,
           "train": train_oom(root, inv, TIMES["train"]).run_id}
    rebuild_index(root)
    return ids
