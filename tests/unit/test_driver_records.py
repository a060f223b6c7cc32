"""The step driver writes each unit's records and keeps only its summary in memory."""

from __future__ import annotations

from pathlib import Path

from orchestrator.records import Measurement, UnitResult, finding
from orchestrator.steps.driver import StageTracker, drive, provider_unit
from orchestrator.store import Run


def test_records_go_to_disk_and_only_the_summary_stays(tmp_path: Path) -> None:
    run = Run.create(tmp_path, command="fleet", suite_hash="h", suite={}, inventory_path=None)

    def work(i: int, stage: StageTracker) -> UnitResult:
        ms = [Measurement(run_id=run.run_id, provider="p", nodes=[f"a{i}", f"b{i}"], step="fleet",
                          metric="busbw", value=float(k), unit="GB/s", suite_hash="h",
                          scope="multi", size=1 << k) for k in range(50)]
        fs = [finding(run.run_id, "fleet", provider="p", node=None, code="X", severity="PASS",
                      message=str(i))]
        return UnitResult(findings=fs, measurements=ms, summary={"log": f"r0_{i}.log"})

    units = [provider_unit("p", f"fleet/r0/j{i}", lambda st, i=i: work(i, st)) for i in range(4)]
    driven = drive(run, "fleet", units, concurrency=2)
    assert len(run.measurements()) == 200 and len(run.findings()) == 4
    assert {m.unit_key for m in run.measurements()} == {u.key for u in units}
    for i, u in enumerate(units):
        kept = driven.done[u.key]
        assert kept.summary == {"log": f"r0_{i}.log"} == run.done_summary(u.key, "fleet")
        assert kept.findings == [] and kept.measurements == []
