"""compare's health table: the median of every GPU per provider, what they measure like,
the FAILs; nothing where the step did not run."""

from __future__ import annotations

import pandas as pd

from orchestrator.analysis.compare import health_table
from orchestrator.records import finding


def _ms(rows: list[tuple[str, str, float]]) -> pd.DataFrame:
    return pd.DataFrame([{"provider": p, "metric": m, "value": v, "scope": "health"}
                         for p, m, v in rows])


def test_medians_variants_and_fails_side_by_side() -> None:
    ms = _ms([("a", "health.membw.copy_gbps", 4200.0), ("a", "health.membw.copy_gbps", 4100.0),
              ("a", "health.membw.copy_gbps", 3000.0), ("b", "health.membw.copy_gbps", 1360.0)])
    fs = [finding("r", "health", provider="a", node="n1", code="HEALTH_VARIANT",
                  severity="INFO", message="m", variant="H200 SXM"),
          finding("r", "health", provider="b", node="n2", code="HEALTH_VARIANT",
                  severity="WARN", message="m", variant="A100 40 GB PCIe"),
          finding("r", "health", provider="b", node="n2", code="GPU_SDC", severity="FAIL",
                  message="m")]
    t = health_table(ms, fs, ["a", "b"])
    rows = {r[0]: r[1:] for r in t.rows}
    assert rows["memory copy (read + written) (GB/s, median of the GPUs)"] == (4100.0, 1360.0)
    assert rows["measures like"] == ("H200 SXM", "A100 40 GB PCIe")
    assert rows["FAIL and WARN findings"] == ("none", "FAIL GPU_SDC; WARN HEALTH_VARIANT")


def test_no_health_step_no_rows() -> None:
    ms = pd.DataFrame([{"provider": "a", "metric": "busbw", "value": 1.0, "scope": "single"}])
    assert health_table(ms, [], ["a"]).rows == []
