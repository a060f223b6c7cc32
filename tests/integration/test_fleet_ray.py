"""The fleet plan through the Ray executor: 4 nodes on a real local Ray head.

Fleets that outgrow SSH fan-out run Ray; the same `gpuvet fleet` must work
there. The head is test_ray_executor's (its own session and temp dir, workers
that cannot import gpuvet); the four inventory nodes are four work dirs on
the head's one Ray node, each job's ranks Ray tasks that meet over loopback
(torch engine, gloo).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

import test_ray_executor as rx  # noqa: E402
from test_ray_executor import Head, _cli  # noqa: E402

head = rx.head  # the Ray head fixture of test_ray_executor, started once for this module

SUITE = """name: fleet-ray
fleet:
  engine: torch
  plan: pairs
  min_bytes: 256K
  max_bytes: 1M
  step_factor: 4
  iters: 2
  warmup_iters: 1
  check: 1
  min_judged_bytes: 256K
  tolerance: 0.95
  timeout_s: 120
"""


def test_the_pairs_plan_runs_through_ray(head: Head) -> None:
    names = [f"r{i}" for i in range(1, 5)]
    doc = {"version": 1, "providers": {"raylab": {
        "executor": "ray", "ray": {"address": head.address},
        "access": {"python": sys.executable},
        "nodes": [{"name": n, "host": head.node_ip, "work_dir": str(head.dir / "fleet" / n)}
                  for n in names]}}}
    inv = head.dir / "inv-fleet.yaml"
    inv.write_text(json.dumps(doc))
    suite = head.dir / "suite-fleet.yaml"
    suite.write_text(SUITE)
    res = _cli(head, "fleet", "-i", str(inv), "--suite", str(suite), "--results",
               str(head.dir / "results"), "--json", timeout=240)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = json.loads(res.stdout)
    codes = {f["code"] for f in out["findings"]}
    assert "FLEET_NO_SUSPECT" in codes and not codes & {"FLEET_JOB_FAILED",
                                                         "FLEET_NODE_DROPPED"}, codes
    (pairs,) = [f for f in out["findings"] if f["code"] == "FLEET_PAIRS"]
    table = json.loads((Path(out["results"]) / pairs["evidence"][0]).read_text())
    met: dict[str, set[str]] = {}
    for p in table["pairs"]:
        a, b = p["nodes"]
        met.setdefault(a, set()).add(b)
        met.setdefault(b, set()).add(a)
    assert sorted(met) == names and all(len(v) == 2 for v in met.values()), met
    assert out["measurements"] == 4 * 2 * 2 * 3  # pairs x sizes x (out/in place) x metrics
