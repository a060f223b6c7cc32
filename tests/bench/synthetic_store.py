"""A synthetic results store: many runs of two (or more) providers, written through
orchestrator.store so the JSONL files and the SQLite index are the real ones.

Benchmarks and analysis tests need a history no capture gives: hundreds of runs
spread over weeks, with preflight facts, nccl-tests builds, busbw per size and
round (single- and multi-node), training results, failed and interrupted runs.
Every number comes from a seeded generator, so a store is the same for the same
arguments on any machine.

What a store holds, run i (oldest first, 30 minutes apart from 2025-01-01):
- provider `providers[i % len(providers)]`, two nodes `<provider>-1`, `<provider>-2`
  of 8 GPUs each, command cycling preflight, nccl, nccl, train;
- preflight: facts.json per node (the parsed-facts layout of the preflight step)
  and PASS findings with their evidence paths;
- nccl: done.json per node with the build document, busbw/algbw/time for 1 MiB to
  8 GiB, three rounds, single (per node) and multi (both nodes); the provider's
  busbw level is `BASE_BUSBW[k]` for the k-th provider, with 1% noise;
- train: step time, throughput, MFU, memory, checkpoint and restart measurements
  and TRAIN_RESTORE_OK;
- every 17th run failed (an NCCL_ROUND_DROP or a restore mismatch), every 53rd was
  interrupted (no records after its start).

`shift` maps a provider to a factor its busbw is multiplied by from the middle of
its runs on: a known regression (factor < 1) or improvement to detect.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from orchestrator import __version__
from orchestrator.records import (
    Finding,
    Measurement,
    finding,
    node_unit_key,
    provider_unit_key,
)
from orchestrator.store import SCHEMA_VERSION, Run, RunMeta, atomic_write, write_json
from orchestrator.suite import Suite

START = datetime(2025, 1, 1, tzinfo=UTC)
SPACING = timedelta(minutes=30)
GPUS_PER_NODE = 8
SIZES = [1 << p for p in range(20, 34)]  # 1 MiB .. 8 GiB
ROUNDS = 3
COMMANDS = ("preflight", "nccl", "nccl", "train")
BASE_BUSBW = (470.0, 410.0, 360.0, 300.0)  # GB/s at the largest size, per provider in order
NCCL_TESTS_COMMIT = "a0b82b2260cf5152b9f8c061bbf7eaf0ba096432"
PRICES = ((3.2, "USD", "minute", 18000.0), (2.9, "USD", "hour", None),
          (2.5, "USD", "second", None), (2.2, "USD", "hour", None))


def _inventory_yaml(providers: Sequence[str]) -> str:
    lines = ["version: 1", "providers:"]
    for k, p in enumerate(providers):
        gpu_hour, cur, gran, month = PRICES[k % len(PRICES)]
        lines += [f"  {p}:", "    executor: local",
                  "    expect: {gpu_model: H100-SXM5-80GB, gpus_per_node: 8, "
                  "memory_per_gpu_gb: 80, form_factor: sxm, interconnect: nvswitch}",
                  f"    pricing: {{gpu_hour: {gpu_hour}, currency: {cur}, "
                  f"billing_granularity: {gran}, node_month: {month or 'null'}, "
                  "storage_gb_month: 0.1, egress_gb: 0.05}",
                  "    nodes:", f"      - {{name: {p}-1}}", f"      - {{name: {p}-2}}"]
    return "\n".join(lines) + "\n"


def _facts(k: int, rng: random.Random) -> dict[str, Any]:
    """The layout of preflight's facts.json, with only the facts the analysis reads."""
    driver = "550.54.15" if k % 2 == 0 else "535.161.08"
    gpus = [{"index": i, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559,
             "mig_enabled": False, "driver_version": driver} for i in range(GPUS_PER_NODE)]
    names = [f"GPU{i}" for i in range(GPUS_PER_NODE)]
    matrix = {a: {b: "X" if a == b else "NV18" for b in names} for a in names}
    return {"facts": {
        "query_gpu": {"gpus": gpus},
        "topo_m": {"gpus": [{"index": i, "name": n} for i, n in enumerate(names)],
                   "matrix": matrix, "nics": []},
        "uname": {"kernel_release": "5.15.0-105-generic" if k % 2 == 0 else "6.5.0-35-generic"},
        "os_release": {"pretty_name": "Ubuntu 22.04.4 LTS"},
        "ibv_devinfo": {"devices": [{"hca_id": f"mlx5_{j}", "transport": "InfiniBand",
                                     "ports": [{"port": 1, "state": "PORT_ACTIVE",
                                                "link_layer": "InfiniBand",
                                                "active_width": "4X",
                                                "active_speed_gbps": 100.0}]}
                                    for j in range(8)]},
    }, "parse_errors": {}, "versions": {
        "driver": driver, "cuda_driver": "12.4" if k % 2 == 0 else "12.2", "nvcc": "12.4",
        "nccl": "2.20.5", "torch": "2.3.0+cu121"}}


def _build(k: int) -> dict[str, Any]:
    return {"ok": True, "built_commit": NCCL_TESTS_COMMIT, "cuda_version": "12.4",
            "nccl": {"version": "2.20.5" if k % 2 == 0 else "2.19.3"}, "mpi": True,
            "gpus": GPUS_PER_NODE, "cached": True}


def _series(run_id: str, provider: str, nodes: list[str], scope: str, level: float,
            rng: random.Random, suite_hash: str, drop_round: int | None) -> list[Measurement]:
    out = []
    for rnd in range(1, ROUNDS + 1):
        for size in SIZES:
            # a saturation curve: small messages are latency-bound
            ideal = level * size / (size + (64 << 20))
            busbw = ideal * rng.gauss(1.0, 0.01)
            if drop_round == rnd and size >= 16 << 20:
                busbw *= 0.7
            algbw = busbw * (GPUS_PER_NODE * len(nodes)) / (2 * (GPUS_PER_NODE * len(nodes) - 1))
            time_us = size / (algbw * 1e3) if algbw > 0 else 0.0
            for inplace in (False, True):
                for metric, value, unit in (("busbw", busbw, "GB/s"), ("algbw", algbw, "GB/s"),
                                            ("time", time_us, "us")):
                    out.append(Measurement(
                        run_id=run_id, provider=provider, nodes=nodes, step="nccl",
                        metric=metric, value=round(value, 3), unit=unit, suite_hash=suite_hash,
                        scope=scope,  # type: ignore[arg-type]
                        engine="nccl-tests", size=size, inplace=inplace, round=rnd,
                        unit_key=node_unit_key(nodes[0]) if scope == "single"
                        else provider_unit_key(provider, "multi"),
                        tags={"op": "sum", "type": "float", "wrong": 0,
                              "nccl_tests_commit": NCCL_TESTS_COMMIT}))
    return out


def _train(run_id: str, provider: str, nodes: list[str], level: float, rng: random.Random,
           suite_hash: str) -> list[Measurement]:
    speed = level / BASE_BUSBW[0]
    step = 0.42 / speed
    vals = [("step_time_s", step * rng.gauss(1.0, 0.01), "s", {"stat": "p50"}),
            ("step_time_s", step * 1.04 * rng.gauss(1.0, 0.01), "s", {"stat": "p90"}),
            ("tokens_per_s_per_gpu", 9800 * speed * rng.gauss(1.0, 0.01), "tokens/s", {}),
            ("mfu", 0.41 * speed, "fraction", {}),
            ("peak_mem_allocated_bytes", 52e9, "B", {}),
            ("ckpt_size_bytes", 12.1e9, "B", {}),
            ("ckpt_save_s", 8.0 / speed, "s", {}), ("ckpt_load_s", 6.5 / speed, "s", {}),
            ("restart_s", 41.0 * rng.gauss(1.0, 0.05), "s", {}), ("steps_lost", 3.0, "steps", {})]
    return [Measurement(run_id=run_id, provider=provider, nodes=nodes, step="train",
                        metric=m, value=round(v, 4), unit=u, suite_hash=suite_hash,
                        scope="train", engine="train", tags=t) for m, v, u, t in vals]


def _create(root: Path, run_id: str, started: datetime, command: str, suite: Suite,
            provider: str, nodes: list[str], inventory: str) -> Run:
    run = Run(root, run_id)
    run.dir.mkdir(parents=True)
    atomic_write(run.dir / "inventory.yaml", inventory, durable=False)
    run.meta = RunMeta(run_id=run_id, started=started.strftime("%Y-%m-%dT%H:%M:%SZ"),
                       command=command, suite_hash=suite.hash,
                       suite=suite.model_dump(mode="json"), gpuvet_version=__version__,
                       schema_version=SCHEMA_VERSION, path=str(run.dir),
                       providers=[provider], nodes=nodes)
    run.save_meta()
    return run


def make_store(root: Path, n_runs: int, *, providers: Sequence[str] = ("alpha", "beta"),
               seed: int = 0, shift: Mapping[str, float] | None = None) -> list[str]:
    """Write `n_runs` runs under `root`; returns their ids, oldest first."""
    rng = random.Random(seed)
    suite = Suite()
    inventory = _inventory_yaml(providers)
    per_provider = {p: 0 for p in providers}
    totals = {p: sum(1 for i in range(n_runs) if providers[i % len(providers)] == p)
              for p in providers}
    ids: list[str] = []
    for i in range(n_runs):
        k = i % len(providers)
        provider = providers[k]
        nth = per_provider[provider]
        per_provider[provider] += 1
        level = BASE_BUSBW[k % len(BASE_BUSBW)]
        if shift and provider in shift and nth >= totals[provider] // 2:
            level *= shift[provider]
        command = COMMANDS[(i // len(providers)) % len(COMMANDS)]
        started = START + i * SPACING
        run_id = started.strftime("%Y%m%d-%H%M%S") + f"-{i % 65536:04x}"
        nodes = [f"{provider}-1", f"{provider}-2"]
        run = _create(root, run_id, started, command, suite, provider, nodes, inventory)
        ids.append(run_id)
        if i % 53 == 52:
            run.meta.finished = (started + timedelta(minutes=3)).strftime("%Y-%m-%dT%H:%M:%SZ")
            run.meta.status = "interrupted"
            run.save_meta()
            continue
        bad = i % 17 == 16
        findings: list[Finding] = []
        ms: list[Measurement] = []
        if command == "preflight":
            for n in nodes:
                d = run.node_dir(n, "preflight")
                write_json(d / "facts.json", _facts(k, rng))
                ev = [f"nodes/{n}/preflight/raw/query_gpu.txt"]
                for code, msg in (("GPU_COUNT", "8 GPU(s) found, 8 ordered"),
                                  ("GPU_MODEL", "NVIDIA H100 80GB HBM3 matches H100-SXM5-80GB"),
                                  ("GPU_MEMORY", "every GPU has >= 80 GB"),
                                  ("FORM_FACTOR", "SXM as ordered")):
                    findings.append(finding(run_id, "preflight", provider=provider, node=n,
                                            code=code, severity="PASS", message=msg,
                                            evidence=ev))
                findings.append(finding(run_id, "preflight", provider=provider, node=n,
                                        code="INTERCONNECT", severity="PASS",
                                        message="every GPU pair on NVLink (NV18)",
                                        evidence=[f"nodes/{n}/preflight/raw/topo_m.txt"]))
                findings.append(finding(run_id, "preflight", provider=provider, node=n,
                                        code="CKPT_DIR", severity="PASS",
                                        message="checkpoint directory /mnt/ckpt on nfs4",
                                        evidence=[f"nodes/{n}/preflight/raw/df.txt"]))
        elif command == "nccl":
            drop = 2 if bad else None
            for n in nodes:
                run.mark_done(f"node:{n}", "nccl", {"build": _build(k)})
                ms += _series(run_id, provider, [n], "single", level, rng, suite.hash, drop)
                ev = [f"nodes/{n}/nccl/single_round{r}.log" for r in range(1, ROUNDS + 1)]
                findings.append(finding(run_id, "nccl", provider=provider, node=n,
                                        code="NCCL_BUSBW", severity="INFO",
                                        message=f"[single] busbw at 8 GiB: median {level:.1f}",
                                        evidence=ev, scope="single"))
                findings.append(finding(run_id, "nccl", provider=provider, node=n,
                                        code="NCCL_TRANSPORTS", severity="INFO",
                                        message="[single] transports: P2P/CUMEM",
                                        evidence=ev[:1], transports=["P2P/CUMEM"]))
                if bad:
                    findings.append(finding(run_id, "nccl", provider=provider, node=n,
                                            code="NCCL_ROUND_DROP", severity="WARN",
                                            message="[single] 1 GiB: round(s) [2] more than "
                                                    "10% below the median", evidence=ev))
            ms += _series(run_id, provider, nodes, "multi", level * 0.45, rng, suite.hash, None)
            findings.append(finding(run_id, "nccl", provider=provider, node=None,
                                    code="NCCL_TRANSPORTS", severity="INFO",
                                    message="[multi] transports: NET/IB, P2P/CUMEM",
                                    evidence=[f"providers/{provider}/nccl/multi_round1.log"],
                                    transports=["NET/IB", "P2P/CUMEM"]))
        else:
            ms += _train(run_id, provider, nodes, level, rng, suite.hash)
            code, sev = ("TRAIN_RESTORE_MISMATCH", "FAIL") if bad else ("TRAIN_RESTORE_OK",
                                                                       "PASS")
            findings.append(finding(run_id, "train", provider=provider, node=None, code=code,
                                    severity=sev, message="restored run vs reference",
                                    evidence=[f"providers/{provider}/train/restore.json"]))
        run.add_findings(findings)
        run.add_measurements(ms)
        # the run's own clock: minutes, not the moment this generator ran
        run.meta.finished = (started + timedelta(minutes=5 + rng.randint(0, 35))).strftime(
            "%Y-%m-%dT%H:%M:%SZ")
        run.meta.status = "failed" if bad else "passed"
        run.save_meta()
    return ids


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", type=Path)
    ap.add_argument("-n", "--runs", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    ids = make_store(a.root, a.runs, seed=a.seed)
    print(json.dumps({"root": str(a.root), "runs": len(ids)}))


if __name__ == "__main__":
    main()
