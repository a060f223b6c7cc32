"""Environment facts come from what the nodes reported, and differences are flagged."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from orchestrator.analysis import environment as E
from orchestrator.analysis import frames
from tests.unit.comparestore import build_store


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("env") / "results"
    build_store(root)
    return root


def _env(root: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    runs = frames.runs(root)
    return E.latest(E.environment(runs), runs), runs


def test_every_value_names_a_raw_file_that_exists(store: Path) -> None:
    env, runs = _env(store)
    paths = dict(zip(runs["run_id"], runs["path"], strict=True))
    assert set(env["key"]) >= {"gpu_model", "gpu_count", "gpu_memory", "driver", "cuda",
                               "nccl", "nccl_tests_commit", "torch", "kernel", "image", "mig",
                               "topology", "form_factor"}
    for rid, ev in zip(env["run_id"], env["evidence"], strict=True):
        assert (Path(paths[rid]) / ev).is_file(), ev


def test_known_differences_of_the_second_provider(store: Path) -> None:
    env, _ = _env(store)

    def val(p: str, k: str) -> list[str]:
        return E.provider_values(env, p, k)

    assert val("h200", "driver") == ["580.159.04"] and val("beta", "driver") == ["570.133.20"]
    assert val("h200", "cuda") == ["13.0"] and val("beta", "cuda") == ["12.8"]
    assert val("beta", "nccl") == ["2.28.3"]  # the build's NCCL, not torch's 2.28.9
    assert val("beta", "nccl_torch") == ["2.28.9"]
    assert val("h200", "gpu_memory") == ["140.4 GiB"] and val("h200", "gpu_count") == ["2"]
    assert val("h200", "topology") == ["NVLink every pair (NV18)"]
    assert val("h200", "mig") == ["off"]
    assert E.gpu_total(env, "beta") == 2
    rows = {r[0]: r for r in E.diff_table(env, ["h200", "beta"]).rows}
    # nothing was ordered for the driver: its order cells are "-"
    assert rows["driver"][1:] == ("-", "580.159.04", "-", "570.133.20", "DIFFERS")
    assert rows["CUDA (driver)"][-1] == "DIFFERS"
    assert rows["GPU model"][-1] == "same" and rows["nccl-tests commit"][-1] == "same"
    # ibv_devinfo is not installed on the capture host: not reported is not "same"
    assert rows["fabric"][1:] == ("-", "not reported", "-", "not reported", "MISSING")


def test_facts_read_as_the_nodes_said() -> None:
    gpus = [{"index": i, "name": "NVIDIA A100-SXM4-40GB", "memory_total_mib": 40960,
             "mig_enabled": i == 1} for i in range(2)]
    facts = {"facts": {
        "query_gpu": {"gpus": gpus},
        "topo_m": {"matrix": {"GPU0": {"GPU0": "X", "GPU1": "SYS"},
                              "GPU1": {"GPU0": "SYS", "GPU1": "X"}}},
        "ibv_devinfo": {"devices": [{"hca_id": "mlx5_0", "ports": [
            {"port": 1, "state": "PORT_ACTIVE", "link_layer": "Ethernet",
             "active_width": "4X", "active_speed_gbps": 25.0}]}]}},
        "versions": {"driver": "535.1"}}
    v = {k: val for k, (val, _) in E.preflight_values(facts, "nodes/n1").items()}
    assert v["mig"].startswith("on (GPUs 1;")
    assert v["topology"] == "PCIe/host paths (SYS)"
    assert v["fabric"] == "RoCE x1 @ 100 Gb/s"
    assert v["gpu_memory"] == "40.0 GiB" and v["form_factor"] == "SXM"
    assert "cuda" not in v  # not reported is left out, never guessed


def test_nodes_that_disagree_are_flagged() -> None:
    env = pd.DataFrame([
        {"run_id": "r", "provider": "a", "node": "a1", "key": "driver", "value": "1",
         "evidence": "x"},
        {"run_id": "r", "provider": "a", "node": "a2", "key": "driver", "value": "2",
         "evidence": "x"},
        {"run_id": "r", "provider": "b", "node": "b1", "key": "driver", "value": "1",
         "evidence": "x"}], columns=E.COLUMNS)
    rows = {r[0]: r for r in E.diff_table(env, ["a", "b"]).rows}
    assert rows["driver"] == ("driver", "-", "1 | 2", "-", "1", "DIFFERS (nodes differ)")
