"""The third measurement on one H100 (tests/fixtures/README-h100x1.md): the pipeline with
the training reference started during health (h100x1-ahead/, the second pipeline of the
call), and the fleet's groups plan on four simulated nodes, one of them slowed by its own
NCCL settings (h100x1-sims/20261206-120917-f40a). Each is judged from its files here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from orchestrator.judging.sink import Sink
from orchestrator.parsers.nccl_tests import parse_nccl_tests
from orchestrator.steps.fleet.localise import PairSample, localise
from orchestrator.steps.train.reading import Earlier, read_phase
from orchestrator.steps.train.restore import restart
from payload.health import protocol as hp
from payload.train import protocol

FIX = Path(__file__).resolve().parents[1] / "fixtures"
AHEAD = FIX / "h100x1-ahead" / "20261206-120737-b577"
GROUPS = FIX / "h100x1-sims" / "20261206-120917-f40a"
TRAIN = AHEAD / "nodes" / "gpu1" / "train"


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _phase(name: str) -> Any:
    return read_phase(name, [("gpu1", TRAIN / name / "gpu1")])


def test_the_reference_started_during_health_and_made_its_context_after_it() -> None:
    ref = _phase("reference")
    sup = ref.nodes[0].supervise
    health = AHEAD / "nodes" / "gpu1" / "health"
    gpu = _lines(health / hp.gpu_events("0"))
    gpu_bye = [e for e in gpu if e["event"] == hp.BYE][0]["t"]
    start = ref.first(protocol.START) or {}
    order = start["init_order"]
    assert order.index("import_torch") < order.index("compile_import") < order.index(
        "gate_cuda_wait") < order.index("cuda_context") < order.index("gate_wait")
    # the supervisor came up while health still loaded the GPU; the context was made once
    # health was over; the model only when the training step opened the last gate
    assert sup["start_time"] < gpu[0]["t"] < gpu_bye < sup["gate_opened"]
    laps = start["init_s"]
    assert laps["gate_cuda_wait"] > 10 and laps["import_torch"] + laps["compile_import"] > 5
    # after the gate: the model, its compiled regions, the wrap and the optimizer
    assert laps["model"] + laps["compile_setup"] + laps["wrap"] + laps["optimizer"] < 0.5
    assert start["t"] - start["gate_open_t"] < 0.5


def test_the_restart_is_under_ten_seconds_with_the_checkpoint_verified_while_it_loaded() -> None:
    kill, rest = _phase("kill"), _phase("restore")
    got = {int(s["step"]): s for s in rest.ranks[0] if s.get("event") == protocol.STEP}
    sink = Sink(run_id="r", step="train", suite_hash="h", provider="one", node="gpu1",
                nodes=["gpu1"], label="", rel=str, scope="train", engine="train")
    restart(sink, Earlier(kill_out=kill), rest, got, 8)
    mine = {m.metric: m for m in sink.measurements}["restart_s"]
    (stored,) = [m for m in _lines(AHEAD / "measurements.jsonl") if m["metric"] == "restart_s"]
    assert round(mine.value, 6) == round(stored["value"], 6) and mine.value < 8
    loaded = rest.first(protocol.LOADED) or {}
    # the hashes (2.1 s) ran beside the load, not before it: the whole is under their sum
    assert 1 < loaded["verify_s"] < loaded["load_s"] < loaded["verify_s"] + 2.5
    assert loaded["match"] is True and loaded["skipped"] == 1  # the killed save's step 10


def test_the_kill_landed_before_the_hashing_of_its_save() -> None:
    """The commit event (every file written) comes before the hashes: the first save's
    saved event follows its commit by the hashing, and the killed save died at its commit."""
    kill = _phase("kill")
    ev = kill.ranks[0]
    commits = {e["step"]: e["t"] for e in ev if e.get("event") == protocol.COMMIT}
    saved = {e["step"]: e for e in ev if e.get("event") == protocol.SAVED}
    assert sorted(commits) == [8, 10] and sorted(saved) == [8]
    assert 1 < saved[8]["t"] - commits[8] < saved[8]["save_s"] - saved[8]["write_s"] + 0.5
    sup = kill.nodes[0].supervise
    assert sup["kill_event"]["event"] == protocol.COMMIT and sup["kill_event"]["step"] == 10
    assert sup["kill_time"] - commits[10] < 1


def test_the_pipeline_passed_within_a_hundred_seconds() -> None:
    meta = json.loads((AHEAD / "run.json").read_text())
    assert meta["status"] == "passed"
    from datetime import datetime

    took = (datetime.fromisoformat(meta["finished"].replace("Z", "+00:00"))
            - datetime.fromisoformat(meta["started"].replace("Z", "+00:00"))).total_seconds()
    assert took <= 100
    fs = _lines(AHEAD / "findings.jsonl")
    ok = [f for f in fs if f["code"] == "TRAIN_RESTORE_OK"]
    assert len(ok) == 1 and ok[0]["details"]["exact"] is True


def test_the_groups_plan_names_the_slowed_node_and_clears_the_others() -> None:
    table = json.loads((GROUPS / "providers" / "sim" / "fleet" / "pairs.json").read_text())
    samples = []
    for p in table["pairs"]:
        for s in p["sizes"]:
            samples.append(PairSample(nodes=tuple(p["nodes"]), stage=p["stage"],
                                      round=p["round"], size=s["size"], busbw=s["busbw"]))
        # a pair that finished: its figures are its log's own (out-of-place busbw)
        if not p["slow"]:
            log = GROUPS / p["evidence"][0]
            rows = {r.size_bytes: r.out_of_place.busbw_gbs
                    for r in parse_nccl_tests(log.read_text(), source=log.name).rows}
            for s in p["sizes"]:
                assert abs(rows[s["size"]] - s["busbw"]) < 0.02, (log.name, s)
    loc = localise(samples, tolerance=table["tolerance"])
    assert [(s.node, s.status) for s in loc.suspects] == [("s3", "confirmed")]
    assert sorted(loc.passed) == ["s1", "s2", "s4"] and not loc.links
    fs = _lines(GROUPS / "findings.jsonl")
    by = {(f["code"], f["node"]) for f in fs}
    assert ("FLEET_SUSPECT_NODE", "s3") in by
    assert {n for c, n in by if c == "FLEET_NODE_CLEARED"} == {"s1", "s2", "s4"}
    # every job with s3 hung and was ended at the stall bound, then the plan went on
    hung = [f for f in fs if f["code"] == "FLEET_JOB_FAILED"]
    assert len(hung) == 4 and all("s3" in f["message"] and "stall_timeout_s" in f["message"]
                                  for f in hung)
    # the groups plan's whole-fleet job over the nodes that passed
    assert any(f["code"] == "FLEET_GROUPS" for f in fs)
    whole = list((GROUPS / "providers" / "sim" / "fleet").glob("whole-*.log"))
    assert len(whole) == 1
    parsed = parse_nccl_tests(whole[0].read_text(), source=whole[0].name)
    assert len(parsed.ranks) == 3
