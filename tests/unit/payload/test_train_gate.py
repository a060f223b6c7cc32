"""The gate of a launch started ahead of its turn (payload/train/startup.wait_gate): it
holds until the file says go, stops on stop or when it was never opened in time, and
passes at once without a gate."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from payload.train import startup


def test_no_gate_no_wait() -> None:
    assert startup.wait_gate({}, 0.01) is None


def test_it_holds_until_go(tmp_path: Path) -> None:
    gate = tmp_path / "restore.gate"
    env = {startup.GATE_ENV: str(gate)}

    def opener() -> None:
        time.sleep(0.3)
        gate.write_text("go")

    t = threading.Thread(target=opener)
    t0 = time.time()
    t.start()
    opened = startup.wait_gate(env, 10)
    t.join()
    assert opened is not None and opened - t0 >= 0.3


def test_stop_and_a_gate_never_opened_stop_the_launch(tmp_path: Path) -> None:
    gate = tmp_path / "kill.gate"
    gate.write_text("stop")
    with pytest.raises(startup.GateStopped, match="told to stop"):
        startup.wait_gate({startup.GATE_ENV: str(gate)}, 10)
    with pytest.raises(startup.GateStopped, match="not opened within"):
        startup.wait_gate({startup.GATE_ENV: str(tmp_path / "never.gate")}, 0.1)
