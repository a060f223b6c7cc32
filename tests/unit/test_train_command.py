"""The user's own command: its GPU telemetry is judged over the command's own run
(the supervisor's start and end), as the reference's is over its steps."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.steps.train.judge import Judge, Subject
from orchestrator.steps.train.reading import read_phase
from orchestrator.suite import Suite, TrainParams


def test_your_commands_gpus_are_judged_over_its_run(tmp_path: Path) -> None:
    d = tmp_path / "reference" / "n1"
    d.mkdir(parents=True)
    (d / "command.stdout").write_text("step=1\nstep=2\n")
    (d / "command.stderr").write_text("")
    # one sample a second from 12:00:00 (t = 100 s); the command ran from 103 to 110 s
    (d / "dmon.txt").write_text(
        "#Time        gpu    pwr  gtemp     sm   pclk   mclk  pviol  tviol\n"
        "#HH:MM:SS    Idx      W      C      %    MHz    MHz      %   bool\n"
        + "".join(f"12:00:{k:02d}      0     80     40      {2 if 3 <= k <= 10 else 95}   "
                  "1980   3201      0      0\n" for k in range(20)))
    doc = {"rc": 0, "wall_s": 7.0, "start_time": 103, "end_time": 110, "killed": False,
           "telemetry": {"source": "dmon", "file": "dmon.txt", "started": 100.0,
                         "interval_s": 1, "note": None}}
    (d / "supervise.json").write_text(json.dumps(doc))
    j = Judge("r", Suite(train=TrainParams(command="python train.py")),
              Subject("p", "n1", ["n1"], "single"), rel=lambda p: p.name)
    assert j.command(read_phase("reference", [("n1", d)]))
    [util] = [m for m in j.measurements if m.metric == "gpu_util_pct"]
    assert util.tags["samples"] == 10 and util.value == 2.0  # 102..111 s, one s of slack
    [idle] = [f for f in j.findings if f.code == "TRAIN_GPU_IDLE"]
    assert idle.message == ("[single] n1 GPU 0: SM utilisation 2% (median of 10 samples "
                            "while training)") and idle.evidence == ["dmon.txt"]
