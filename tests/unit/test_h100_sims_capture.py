"""The captures of the second measurement on one H100 (tests/fixtures/README-h100x1.md,
h100x1-fast/ and h100x1-sims/):

- a whole pipeline with the health links process and torch.compile's imports ahead of their
  gates and ranks that leave at once (restart under 10 s);
- the training step across two simulated nodes sharing the GPU (NCCL_HOSTID apart): each
  node's checkpoint restored on the other, and the multi-node unit restored with its ranks
  swapped, bit for bit;
- `gpuvet pipeline --fleet` over those nodes, interrupted with SIGINT while it trained and
  finished with `--resume`.

Each is judged from its files here, not only from what the host wrote."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from orchestrator.judging.sink import Sink
from orchestrator.steps.train.reading import Earlier, read_phase
from orchestrator.steps.train.restore import restart
from payload.health import protocol as hp
from payload.train import protocol

FIX = Path(__file__).resolve().parents[1] / "fixtures"
FAST = FIX / "h100x1-fast" / "20261206-083716-7196"
TRAIN2 = FIX / "h100x1-sims" / "20261206-084536-21c7"
PIPE2 = FIX / "h100x1-sims" / "20261206-085757-4b37"


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _stored(run: Path, metric: str) -> list[dict[str, Any]]:
    return [m for m in _lines(run / "measurements.jsonl") if m["metric"] == metric]


def test_the_pipeline_restarts_under_ten_seconds_with_the_compile_imports_ahead() -> None:
    train = FAST / "nodes" / "gpu1" / "train"
    kill = read_phase("kill", [("gpu1", train / "kill" / "gpu1")])
    rest = read_phase("restore", [("gpu1", train / "restore" / "gpu1")])
    got = {int(s["step"]): s for s in rest.ranks[0] if s.get("event") == protocol.STEP}
    sink = Sink(run_id="r", step="train", suite_hash="h", provider="one", node="gpu1",
                nodes=["gpu1"], label="", rel=str, scope="train", engine="train")
    restart(sink, Earlier(kill_out=kill), rest, got, 8)
    mine = {m.metric: m for m in sink.measurements}["restart_s"]
    (stored,) = _stored(FAST, "restart_s")
    assert round(mine.value, 6) == round(stored["value"], 6) and mine.value < 10
    # torch.compile's imports ran before the gate: after it only the model, its regions,
    # the wrap and the optimizer (0.1 s), where 2.7 s of imports were before
    start = rest.first(protocol.START) or {}
    assert start["init_s"]["compile_import"] > 2 and mine.tags["init_s"] < 0.5
    assert mine.tags["ahead_s"] > 10
    for phase in (kill, rest):  # each started within a moment of its gate opening
        st = phase.first(protocol.START) or {}
        assert st["t"] - st["gate_open_t"] < 0.5


def test_a_rank_leaves_at_once_after_its_record() -> None:
    """The reference's ranks left with os._exit once their record was closed: its
    supervisor saw torchrun end within a second of the last event (3.35 s before)."""
    ref = read_phase("reference", [("gpu1", FAST / "nodes" / "gpu1" / "train" / "reference"
                                     / "gpu1")])
    end = ref.first(protocol.END)
    assert end is not None
    assert ref.nodes[0].supervise["end_time"] - end["t"] < 1.5


def test_the_links_process_loaded_beside_the_gpu_and_measured_after_it() -> None:
    health = FAST / "nodes" / "gpu1" / "health"
    doc = json.loads((health / hp.NODE_DOC).read_text())
    gpu = _lines(health / hp.gpu_events("0"))
    links = _lines(health / hp.LINKS_EVENTS)
    gpu_bye = [e for e in gpu if e["event"] == hp.BYE][0]["t"]
    assert doc["workers"]["links"]["started"] < gpu[0]["t"]  # started with the GPU process
    assert links[0]["t"] >= gpu_bye  # and held at its gate until it was done
    assert {e["phase"] for e in links if e["event"] == hp.DONE} == {"pcie"}
    assert doc["status"] == "ok"


def _restores(run: Path) -> dict[str, tuple[list[str], list[str]]]:
    return {f["unit_key"] + ":" + ",".join(f["details"]["saved_on"]):
            (f["details"]["saved_on"], f["details"]["restored_on"])
            for f in _lines(run / "findings.jsonl") if f["code"] == "TRAIN_RESTORE_OK"}


def _losses(folder: Path) -> dict[int, str]:
    out = {}
    for f in sorted(folder.glob("rank*.jsonl")):
        for e in _lines(f):
            if e.get("event") == protocol.STEP and e.get("rank") == 0:
                out[int(e["step"])] = e["loss_hex"]
    return out


def test_two_simulated_nodes_restore_each_others_checkpoints_and_swap_ranks() -> None:
    assert _restores(TRAIN2) == {
        "provider:sim/single-s1+s2:s1": (["s1"], ["s2"]),
        "provider:sim/single-s1+s2:s2": (["s2"], ["s1"]),
        "provider:sim/multi:s1,s2": (["s1", "s2"], ["s2", "s1"])}
    multi = TRAIN2 / "providers" / "sim" / "train" / "multi"
    ref, rest = _losses(multi / "reference" / "s1"), _losses(multi / "restore" / "s2")
    # rank 0 ran on s2 after the swap; its losses after the checkpoint are the reference's
    assert set(rest) == set(range(6, 13)) and all(rest[k] == ref[k] for k in rest)
    # the two nodes' supervisors both took part in every multi-node phase
    for phase in ("reference", "kill", "restore"):
        docs = [json.loads((multi / phase / n / "supervise.json").read_text())
                for n in ("s1", "s2")]
        assert sorted(d["node_rank"] for d in docs) == [0, 1] and {d["nnodes"] for d in docs} == {2}
    assert json.loads((TRAIN2 / "run.json").read_text())["status"] == "passed"


def test_an_interrupted_pipeline_over_simulated_nodes_was_finished_by_its_resume() -> None:
    meta = json.loads((PIPE2 / "run.json").read_text())
    assert meta["status"] == "passed" and meta["command"] == "pipeline"
    console = (FIX / "h100x1-sims" / "pipe-interrupted-console.txt").read_text()
    assert console.rstrip().endswith("interrupted")
    # the units cut short ran again from their reference, the first attempt's files removed
    # from the nodes (removed_stale), and every restore was verified
    single = PIPE2 / "nodes" / "s1" / "train"
    assert json.loads((single / "reference" / "s1" / "supervise.json").read_text())[
        "removed_stale"] > 0
    assert set(_restores(PIPE2)) == {"provider:sim/single-s1+s2:s1",
                                     "provider:sim/single-s1+s2:s2", "provider:sim/multi:s1,s2"}
    # the fleet step over the two nodes ran once: one pair, no FAIL anywhere
    fs = _lines(PIPE2 / "findings.jsonl")
    assert [f["code"] for f in fs if f["code"] == "FLEET_PAIRS"] == ["FLEET_PAIRS"]
    assert not [f for f in fs if f["severity"] == "FAIL"]


COLL = FIX / "h100x1-sims" / "20261206-091857-f1b9"
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "alltoall")


def _log(mode: str, coll: str, r: int) -> Path:
    parts = ["multi"] + (["network"] if mode == "network" else []) + (
        [coll] if coll != "all_reduce" else [])
    return COLL / "providers" / "sim" / "nccl" / f"{'_'.join(parts)}_round{r}.log"


def test_every_collective_ran_across_the_simulated_nodes_in_both_modes() -> None:
    """all_reduce, all_gather, reduce_scatter and alltoall, three rounds each, normal and
    network mode, two ranks on two simulated nodes over NET/Socket: each log's busbw is
    its algbw times that collective's own factor (nccl-tests' formula, 1 for all_reduce
    and 1/2 for the others over two ranks), row by row."""
    from orchestrator.parsers.nccl_tests import parse_nccl_tests
    from payload.allreduce import busbw_factor

    for mode in ("normal", "network"):
        for coll in COLLECTIVES:
            for r in (1, 2, 3):
                path = _log(mode, coll, r)
                parsed = parse_nccl_tests(path.read_text(), source=path.name)
                assert len(parsed.ranks) == 2 and {x.host for x in parsed.ranks} == {"vm"}
                factor = busbw_factor(coll, 2)
                big = [row for row in parsed.rows if row.size_bytes >= 1 << 20]
                assert big and parsed.rows[-1].size_bytes == 16 << 20
                for row in big:
                    for res in (row.out_of_place, row.in_place):
                        assert abs(res.algbw_gbs * factor - res.busbw_gbs) <= 0.011, (
                            path.name, row.size_bytes)


def test_the_network_mode_says_the_socket_transport_and_judges_no_line_rate() -> None:
    fs = _lines(COLL / "findings.jsonl")
    sockets = [f for f in fs if f["code"] == "NCCL_NET_SOCKET"]
    assert len(sockets) == len(COLLECTIVES)  # one per collective, network mode only
    assert all("per-NIC line-rate judge does not apply" in f["message"] for f in sockets)
    assert not [f for f in fs if f["code"] in ("NCCL_NET_PER_NIC", "NCCL_GPUDIRECT")
                and f["severity"] in ("FAIL", "WARN")]
    labels = {f["message"].split("]")[0] + "]" for f in fs if f["code"] == "NCCL_BUSBW"}
    assert labels == {"[" + " ".join(["multi"] + (["network"] if m == "network" else [])
                                     + ([c] if c != "all_reduce" else [])) + "]"
                      for c in COLLECTIVES for m in ("normal", "network")}
