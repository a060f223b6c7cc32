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


def test_cuda_opens_the_start_gate_and_not_the_ready_one(tmp_path: Path) -> None:
    """A reference started during health: "cuda" lets it make its context, and it still
    holds at the ready gate until "go"; the start gate passes on "go" as well."""
    gate = tmp_path / "reference.gate-0a1b2c3d"
    env = {startup.GATE_ENV: str(gate), startup.GATE_AT_ENV: "start"}
    assert startup.gate_at(env) == "start" and startup.gate_at({}) is None
    assert startup.gate_at({startup.GATE_ENV: str(gate)}) == "ready"
    gate.write_text(startup.CUDA_WORD)
    assert startup.wait_gate(env, 1, (startup.CUDA_WORD, "go")) is not None
    with pytest.raises(startup.GateStopped, match="not opened within"):
        startup.wait_gate(env, 0.1)  # the ready gate: "cuda" is not "go"
    gate.write_text("go")
    assert startup.wait_gate(env, 1, (startup.CUDA_WORD, "go")) is not None
    assert startup.wait_gate(env, 1) is not None


def test_the_health_links_process_holds_until_go_and_stops_on_stop(tmp_path: Path) -> None:
    """The health step's links process waits at its gate (after `import torch`, before any
    CUDA call) while the GPU processes measure: go lets it measure, stop ends it."""
    from payload.health import links

    gate = tmp_path / ".links.gate"

    def opener(word: str) -> None:
        time.sleep(0.3)
        gate.write_text(word)

    for word, opened in (("go", True), ("stop", False)):
        gate.unlink(missing_ok=True)
        t = threading.Thread(target=opener, args=(word,))
        t0 = time.time()
        t.start()
        assert links.wait_gate(str(gate), 10) is opened
        t.join()
        assert time.time() - t0 >= 0.3  # it held until told
    gate.unlink()
    assert links.wait_gate(str(gate), 0.1) is False  # never opened: it gives up
