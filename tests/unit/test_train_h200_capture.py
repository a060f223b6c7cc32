"""The training step as it ran on a 2 x H200 host (tests/fixtures/h200x2-train) and on
a one-GPU H200 host (tests/fixtures/h200x1-train).

The captured run folders are judged again by the step itself: `run_train` drives the
same units, phases and judge as on the host, its nodes replaced by a scripted pool
that answers each command with the file the node printed then (the probes'
documents, each supervisor's document) and serves the files the supervisor listed.
What it writes must be what the host wrote. The judge's figures are then recomputed
from the raw files (rank event logs, supervisor documents, dmon samples, the shipped
peak table) without the judge's code, and compared with the stored records.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import shutil
import statistics
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path
from typing import Any, cast

import pytest
from ruamel.yaml import YAML

from orchestrator import gpunames, inventory
from orchestrator.executors import ExecutorPool
from orchestrator.parsers.nccl_debug import parse_nccl_debug
from orchestrator.records import Finding, Measurement
from orchestrator.steps.train import step as train
from orchestrator.store import Run
from orchestrator.suite import Suite, load_suite
from orchestrator.testing import Call, Reply, Script, ScriptedPool, scripted_pool

ROOT = Path(__file__).resolve().parents[2]
X2 = ROOT / "tests" / "fixtures" / "h200x2-train"
X1 = ROOT / "tests" / "fixtures" / "h200x1-train"
HOST, SIM, ONE = "host-run", "sim-run", "one-run"
RUN = {HOST: X2 / HOST, SIM: X2 / SIM, ONE: X1 / ONE}
SUITE_FILE = {HOST: X2 / "suite-1b.yaml", SIM: X2 / "suite-1b-sim.yaml",
              ONE: X1 / "suite-1b-one.yaml"}
HOST_UNIT, SIM_SINGLE, SIM_MULTI = ("node:h200-host", "provider:h200-sim/single-sim-a+sim-b",
                                    "provider:h200-sim/multi")
ONE_UNIT = "node:h200-1gpu"
K = 8  # the suite's ckpt_step: the checkpoint every restore must load


# --------------------------------------------------------------------------- replaying a run


@dataclass
class Replayed:
    name: str
    dir: Path  # the copy the step wrote into
    run: Run
    suite: Suite
    pool: ScriptedPool

    def findings(self) -> list[Finding]:
        return self.run.findings()

    def measurements(self) -> list[Measurement]:
        return self.run.measurements()


def _phase_folders(d: Path) -> list[tuple[str, str, Path]]:
    """(unit slug, phase, folder) of every supervisor run in a run directory."""
    out = []
    for sup in sorted(d.glob("*/*/train/**/supervise.json")):
        rel = sup.parent.relative_to(d).parts
        unit = f"multi-{rel[1]}" if rel[0] == "providers" else rel[1]
        out.append((unit, rel[-2], sup.parent))
    return out


def replay(name: str, tmp: Path) -> Replayed:
    """Run the training step over a copy of a captured run, from scratch (no unit done)."""
    meta = json.loads((RUN[name] / "run.json").read_text())
    root = tmp / "results"
    d = root / meta["run_id"]
    shutil.copytree(RUN[name], d)
    for stale in [d / "findings.jsonl", d / "measurements.jsonl", *d.glob("**/done.json")]:
        stale.unlink()
    run = Run.open(root, meta["run_id"])
    inv = inventory.load(d / "inventory.yaml")
    nodes = [inv.node(n) for n in run.meta.nodes]
    suite = Suite.model_validate(run.meta.suite)

    folders = {(unit, phase, f.name): f for unit, phase, f in _phase_folders(d)}
    # read now: the step clears each phase's local folder before its attempt
    docs = {key: (f / "supervise.json").read_text() for key, f in folders.items()}
    files: dict[str, dict[str, bytes]] = {n.name: {} for n in nodes}
    for (unit, phase, node), folder in folders.items():
        job = train.Job(unit, inv.node(node), phase, folder, ckpt_root="")
        for f in json.loads((folder / "supervise.json").read_text())["files"]:
            files[node][f"{job.remote_out(run)}/{f}"] = (folder / f).read_bytes()

    def supervise(node: str) -> Any:
        def reply(call: Call) -> Reply:
            argv = shlex.split(call.command.split(" exec ", 1)[1].rsplit("; else ", 1)[0])
            unit, phase = argv[argv.index("--out") + 1].rsplit("/", 2)[1:]
            return Reply(stdout=docs[unit, phase, node])
        return reply

    def probe(node: str) -> Any:
        def reply(call: Call) -> Reply:
            doc = ("probe-write.json" if " --token " in call.command else
                   "probe-cleanup.json" if " --remove " in call.command else "probe.json")
            return Reply(stdout=(d / "nodes" / node / "train" / doc).read_text())
        return reply

    scripts = {n.name: Script().on(re.compile(r" train-probe "), reply=probe(n.name))
               .on(re.compile(r" train-supervise "), reply=supervise(n.name))
               .on(re.compile(r"^if \[ -e /tmp/gpuvet-local/\S+/gpuvet-train/\S+ \]; then mv -f "),
                   rc=0)
               # the gates of the launches started ahead of their turn
               .on(re.compile(r"^mkdir -p \S+ && printf (go|stop) > \S+\.gate-[0-9a-f]{8}\.tmp && "
                                   r"mv -f "),
                   rc=0)
               for n in nodes}
    pool = scripted_pool(scripts, files=files)
    train.run_train(inv, nodes, run, suite, pool=cast(ExecutorPool, pool))
    pool.check()
    return Replayed(name, d, run, suite, pool)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Replayed]:
    return {n: replay(n, tmp_path_factory.mktemp(n)) for n in (HOST, SIM, ONE)}


# --------------------------------------------------------------------------- raw files


def events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def rank_file(folder: Path, rank: int = 0) -> Path:
    return folder / f"rank{rank}.jsonl"


def first(evs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return next(e for e in evs if e["event"] == kind)


def steps(evs: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {e["step"]: e for e in evs if e["event"] == "step"}


def doc(folder: Path) -> dict[str, Any]:
    return dict(json.loads((folder / "supervise.json").read_text()))


def stored(name: str, kind: str) -> list[dict[str, Any]]:
    return events(RUN[name] / f"{kind}.jsonl")


def one(ms: list[Measurement], unit: str, metric: str, **tags: Any) -> Measurement:
    got = [m for m in ms if m.unit_key == unit and m.metric == metric
           and all(m.tags.get(k) == v for k, v in tags.items())]
    assert len(got) == 1, (unit, metric, tags, got)
    return got[0]


# (run, unit, folder of the phase relative to the run, rank 0's node in it, judge subject node)
H_REF = "nodes/h200-host/train/reference/h200-host"
REFERENCES = [
    (HOST, HOST_UNIT, H_REF, None),
    (SIM, SIM_SINGLE, "nodes/sim-a/train/reference/sim-a", "sim-a"),
    (SIM, SIM_SINGLE, "nodes/sim-b/train/reference/sim-b", "sim-b"),
    (SIM, SIM_MULTI, "providers/h200-sim/train/multi/reference/sim-a", None),
    (ONE, ONE_UNIT, "nodes/h200-1gpu/train/reference/h200-1gpu", None),
]
# (run, unit, kill folder(s), restore folder holding rank 0, subject node, saved_on, restored_on)
PROTOCOLS = [
    (HOST, HOST_UNIT, ["nodes/h200-host/train/kill/h200-host"],
     "nodes/h200-host/train/restore/h200-host", "h200-host", ["h200-host"], ["h200-host"]),
    (SIM, SIM_SINGLE, ["nodes/sim-a/train/kill/sim-a"], "nodes/sim-a/train/restore/sim-b",
     "sim-a", ["sim-a"], ["sim-b"]),
    (SIM, SIM_SINGLE, ["nodes/sim-b/train/kill/sim-b"], "nodes/sim-b/train/restore/sim-a",
     "sim-b", ["sim-b"], ["sim-a"]),
    (SIM, SIM_MULTI, ["providers/h200-sim/train/multi/kill/sim-a",
                      "providers/h200-sim/train/multi/kill/sim-b"],
     "providers/h200-sim/train/multi/restore/sim-b", None, ["sim-a", "sim-b"], ["sim-b", "sim-a"]),
    (ONE, ONE_UNIT, ["nodes/h200-1gpu/train/kill/h200-1gpu"],
     "nodes/h200-1gpu/train/restore/h200-1gpu", "h200-1gpu", ["h200-1gpu"], ["h200-1gpu"]),
]


def mine(ms: list[Measurement], unit: str, node: str | None) -> list[Measurement]:
    """Two single-node protocols share a unit: their records differ by the node they name."""
    return [m for m in ms if m.unit_key == unit and (node is None or m.nodes == [node])]


# --------------------------------------------------------------------------- the records

# What the judge learned after these runs were captured. The restart time now says where
# its seconds went (tags the capture lacks; launch and init only from ranks that time
# their start-up). An NCCL WARN that a surviving rank's transport printed when its peer on
# the other node was SIGKILLed first is the kill's echo, no longer a warning. A checkpoint
# directory under a scratch path (these runs used /tmp) is CKPT_NOT_PERSISTENT, as
# preflight's CKPT_DIR_EPHEMERAL already said.
RESTART_PARTS = {"launch_s", "init_s", "warmup_s", "verify_s", "load_s"}


def scratch(r: dict[str, Any]) -> bool:
    return r.get("code") == "CKPT_NOT_PERSISTENT" and r["details"].get("reason") == "scratch-path"


def as_at_capture(name: str, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    records = [r for r in records if not scratch(r)]
    if name == ONE:  # captured after the other changes
        return records
    return [{**r, "tags": {k: v for k, v in r["tags"].items() if k not in RESTART_PARTS}}
            if r.get("metric") == "restart_s" else r for r in records]


def still_said(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if not (
        r.get("code") == "TRAIN_NCCL_WARN" and r["details"].get("phase") == "kill"
        and "Connection closed by remote peer" in r["message"])]



@pytest.mark.parametrize("name", [HOST, SIM, ONE])
def test_rejudging_the_capture_writes_what_the_host_wrote(runs: dict[str, Replayed],
                                                          name: str) -> None:
    r = runs[name]
    for kind in ("findings", "measurements"):
        still = still_said(stored(name, kind))
        assert len(stored(name, kind)) - len(still) == (
            1 if (name, kind) == (SIM, "findings") else 0)
        assert as_at_capture(name, events(r.dir / f"{kind}.jsonl")) == still, kind
    # every other file too: done markers, the copies fetched and scrubbed, the documents
    for path in sorted(RUN[name].rglob("*")):
        if path.is_file() and path.name not in ("findings.jsonl", "measurements.jsonl"):
            assert (r.dir / path.relative_to(RUN[name])).read_bytes() == path.read_bytes(), path
    # the suite written next to the run is the one it ran with
    own = load_suite(SUITE_FILE[name])
    assert own.hash == r.suite.hash == r.run.meta.suite_hash
    # the step asked each node for the three phases (the next one started ahead of its
    # turn, held at its gate, then told to go), and cleaned up after itself
    for ex in r.pool.executors.values():
        sup = [c.command for c in ex.calls if " train-supervise " in c.command]
        phases = [c.split("--phase ", 1)[1].split()[0] for c in sup]
        assert sorted(phases) == sorted(["reference", "kill", "restore"]
                                        * (2 if name == SIM else 1))
        # a single-node unit's kill and restore are started ahead; a multi-node unit's never
        assert all((" --gate " in c) == (" --phase reference " not in c and "/multi-" not in c)
                   for c in sup)
        # each gate a file of this attempt's own (an earlier attempt's launch never opens)
        gates = [c.command for c in ex.calls if re.search(r"\.gate-[0-9a-f]{8}\.tmp ", c.command)]
        assert len(gates) == 2  # the kill and the restore that run on this node
        assert all(" printf go > " in g for g in gates)
        # the one-GPU run kept its checkpoints (keep_checkpoints) to time their hashing
        assert sum(c.command.startswith("if [ -e ") and " rm -rf " in c.command
                   for c in ex.calls) >= (name != ONE)


def test_nothing_failed_and_the_only_warnings_are_throttling(runs: dict[str, Replayed]) -> None:
    for name in (HOST, SIM, ONE):
        assert runs[name].run.meta.status == "passed"
        fs = runs[name].findings()
        assert not [f for f in fs if f.severity == "FAIL"]
        # the one-GPU run's supervisor read the GPU's limits: its power capping is INFO
        assert {f.code for f in fs if f.severity == "WARN"} == (
            {"CKPT_NOT_PERSISTENT"} if name == ONE else {"TRAIN_THROTTLED",
                                                         "CKPT_NOT_PERSISTENT"})
        # every node's checkpoints were under /tmp: cleared when the instance restarts
        local = [f for f in fs if f.code == "CKPT_NOT_PERSISTENT"]
        assert local and all(f.details["reason"] == "scratch-path"
                             and "under a scratch path (/tmp/gpuvet-local/" in f.message
                             for f in local)
        assert {f.node for f in local} == set(runs[name].run.meta.nodes)
    # the SIGKILL of one multi-node rank closed its peer's socket before the peer's own kill:
    # NCCL said so twice on sim-b, and that is the kill's echo, not a warning
    out = (RUN[SIM] / "providers/h200-sim/train/multi/kill/sim-b/torchrun.stdout").read_text()
    lost = [ln for ln in out.splitlines() if "NCCL WARN" in ln]
    assert len(lost) == 2 and all("Connection closed by remote peer" in ln for ln in lost)
    assert not [f for f in runs[SIM].findings() if f.code == "TRAIN_NCCL_WARN"]


# --------------------------------------------------------------------------- restore


@pytest.mark.parametrize("name,unit,kills,restore,node,saved_on,restored_on", PROTOCOLS)
def test_restore_verdicts_are_bit_exact(runs: dict[str, Replayed], name: str, unit: str,
                                        kills: list[str], restore: str, node: str | None,
                                        saved_on: list[str], restored_on: list[str]) -> None:
    r = runs[name]
    [ok] = [f for f in r.findings() if f.unit_key == unit and f.code.startswith("TRAIN_RESTORE")
            and f.node == node]
    assert ok.code == "TRAIN_RESTORE_OK" and ok.severity == "PASS"
    assert ok.details == {"exact": True, "inexact": [], "saved_on": saved_on,
                          "restored_on": restored_on}
    assert f"step {K} restored" in ok.message
    assert "losses of steps 9..20 equal the reference bit for bit" in ok.message
    assert ok.evidence == [f"{restore}/rank0.jsonl"]
    # from the raw files: every rank loaded step K from the checkpoint its own unit saved,
    # with equal state hashes, and then repeated the reference's losses bit for bit
    ref_dirs = [Path(k.replace("/kill/", "/reference/")) for k in kills]
    restore_dirs = [(r.dir / restore).parent / n for n in restored_on]
    slug = "multi-h200-sim" if node is None else node
    for folder in restore_dirs:
        for path in sorted(folder.glob("rank*.jsonl")):
            evs = events(path)
            loaded = first(evs, "loaded")
            assert loaded["step"] == K and loaded["match"] is True
            assert loaded["hashes_loaded"] == loaded["hashes_saved"]
            assert loaded["path"].endswith(f"/{r.run.run_id}/{slug}/step-0000000{K}")
            ref_path = next(r.dir / d / path.name for d in ref_dirs
                            if (r.dir / d / path.name).is_file())
            ref = steps(events(ref_path))
            got = steps(evs)
            assert sorted(got) == list(range(K + 1, 21))
            assert all(got[k]["loss_hex"] == ref[k]["loss_hex"] for k in got)
    # the restore ran on the other node where storage is shared: rank 0 moved
    assert (r.dir / restore).name == restored_on[0]


@pytest.mark.parametrize("name,node", [(HOST, "h200-host"), (ONE, "h200-1gpu")])
def test_the_half_written_checkpoint_was_skipped(runs: dict[str, Replayed], name: str,
                                                 node: str) -> None:
    kill = RUN[name] / f"nodes/{node}/train/kill/{node}"
    sup = doc(kill)
    assert sup["killed"] is True and sup["trigger"]["at_commit"] == 10
    assert sup["kill_event"]["event"] == "commit" and sup["kill_event"]["step"] == 10
    evs = events(rank_file(kill))
    assert [e["step"] for e in evs if e["event"] == "saved"] == [K]  # step 10 never saved
    [skip] = [f for f in runs[name].findings() if f.code == "TRAIN_CKPT_SKIPPED"]
    assert skip.details == {"ckpt_step": 10}
    assert "no manifest: the save did not finish" in skip.message
    assert f"SIGKILLed on {node} at commit of step 10" in next(
        f.message for f in runs[name].findings() if f.code == "TRAIN_KILLED")
    # the simulated nodes were killed after step K+2 instead (a second 12 GB save each would
    # not fit the host's disk): nothing to skip there
    assert not [f for f in runs[SIM].findings() if f.code == "TRAIN_CKPT_SKIPPED"]


@pytest.mark.parametrize("name,unit,kills,restore,node,saved_on,restored_on", PROTOCOLS)
def test_restart_time_and_steps_lost(runs: dict[str, Replayed], name: str, unit: str,
                                     kills: list[str], restore: str, node: str | None,
                                     saved_on: list[str], restored_on: list[str]) -> None:
    ms = mine(runs[name].measurements(), unit, node)
    # kill to dead on the killing nodes' clock, then relaunch to the first restored step
    dying = max(doc(RUN[name] / k)["end_time"] - doc(RUN[name] / k)["kill_time"]
                for k in kills)
    restored = RUN[name] / restore
    relaunch = steps(events(rank_file(restored)))[K + 1]["t"] - doc(restored)["start_time"]
    [restart] = [m for m in ms if m.metric == "restart_s"]
    assert restart.value == pytest.approx(dying + relaunch, abs=1e-9)
    revs = events(rank_file(restored))
    start, loaded = first(revs, "start"), first(revs, "loaded")
    parts = {"warmup_s": first(revs, "warmup")["seconds"], "verify_s": loaded["verify_s"],
             "load_s": loaded["load_s"]}
    if "launch_s" in start:  # where the relaunch's seconds went, as the ranks timed it
        parts["launch_s"] = start["launch_s"]
        parts["init_s"] = pytest.approx(sum(start["init_s"].values()), abs=1e-3)
    assert restart.tags == {"dying_s": pytest.approx(dying, abs=1e-9),
                            "relaunch_to_first_step_s": pytest.approx(relaunch, abs=1e-9),
                            **parts}
    last = max(steps(events(rank_file(RUN[name] / kills[0]))))
    assert last == 10
    assert [m.value for m in ms if m.metric == "steps_lost"] == [last - K] == [2]
    [load] = [m for m in ms if m.metric == "ckpt_load_s"]
    assert load.value == first(events(rank_file(restored)), "loaded")["load_s"]
    expected = {HOST_UNIT: 34.7, SIM_MULTI: 37.8, ONE_UNIT: 20.9}.get(unit) or {"sim-a": 39.5, "sim-b": 38.2}[
        str(node)]
    assert round(restart.value, 1) == expected


# --------------------------------------------------------------------------- performance


def _peak(gpu: str) -> float:
    """The shipped catalog read directly: the variants the name places on, their figure."""
    rows = YAML(typ="safe").load(resources.files("orchestrator").joinpath(
        "data/gpu_peaks.yaml").read_text())["variants"]
    names = {c.name for c in gpunames.place(gpu, strict=False).cards}
    return float(next(r["tflops"] for r in rows if r["name"] in names))


# (step time median, p90, tokens/s/GPU, MFU) as printed: the verified steps, the fastest kernels
SHOWN = {
    "h200-host": (("0.2365", "0.2436", "69,263", "48.7%"), ("0.2144", "0.2276", "76,425", "53.8%")),
    "sim-a": (("0.2269", "0.2324", "72,207", "50.8%"), ("0.2044", "0.2112", "80,166", "56.4%")),
    "sim-b": (("0.2333", "0.2395", "70,232", "49.4%"), ("0.2083", "0.2177", "78,672", "55.4%")),
    "multi": (("1.372", "1.418", "11,945", "8.4%"), ("1.35", "1.399", "12,137", "8.5%")),
    "h200-1gpu": (("0.2242", "0.2312", "73,089", "51.4%"), ("0.2023", "0.2118", "80,982", "57.0%")),
}


@pytest.mark.parametrize("name,unit,folder,node", REFERENCES)
def test_step_time_tokens_and_mfu_recomputed_from_the_rank_logs(
        runs: dict[str, Replayed], name: str, unit: str, folder: str, node: str | None) -> None:
    """The verified steps 4..20 give the deterministic_* figures; the ten steps on the
    fastest kernels after them give the headline step time, tokens/s and MFU."""
    evs = events(rank_file(RUN[name] / folder))
    start = first(evs, "start")
    cfg = start["config"]
    skip = runs[name].suite.train.stats_skip_steps
    verified = [s for k, s in sorted(steps(evs).items()) if k > skip]
    assert len(verified) == 17  # steps 4..20 after 3 skipped warm-up steps
    # the switch: deterministic mode off after step 20, one discarded step (compiled again)
    switch = first(evs, "throughput")
    assert switch["deterministic"]["use_deterministic_algorithms"] is False
    assert switch["deterministic"]["cudnn.deterministic"] is False
    assert (switch["first_step"], switch["steps"]) == (21, 10)
    fast = [e for e in evs if e["event"] == "throughput_step"]
    assert [e["step"] for e in fast] == list(range(22, 32))
    assert evs.index(switch) < evs.index(fast[0])
    tokens = cfg["micro_batch"] * cfg["seq_len"] * cfg["grad_accum"]
    assert {s["tokens"] for s in verified + fast} == {tokens} == {16384}
    # the FLOPs the MFU counts: 6 N for the matmuls plus 12 L d T for attention
    assert start["flops_per_token"] == 6 * start["params"] + 12 * cfg["n_layers"] * cfg[
        "d_model"] * cfg["seq_len"]
    assert start["params"] == 1009068032 and start["versions"]["gpu_name"] == "NVIDIA H200"
    peak = _peak(start["versions"]["gpu_name"])
    assert peak == 989

    ms = mine(runs[name].measurements(), unit, node)
    shown = []
    for prefix, timed, n in (("deterministic_", verified, 17), ("", fast, 10)):
        times = sorted(s["step_time_s"] for s in timed)
        median = statistics.median(times)
        p90 = times[math.ceil(0.9 * len(times)) - 1]  # nearest rank
        mfu = start["flops_per_token"] * tokens / median / (peak * 1e12)

        def value(metric: str, n: int = n, prefix: str = prefix) -> float:
            [m] = [m for m in ms if m.metric == prefix + metric]
            assert m.tags["steps_timed"] == n and m.tags["world"] == start["world"]
            assert m.tags["timed_in"] == ("reference" if prefix else "throughput")
            assert m.tags["deterministic"] is bool(prefix)
            return m.value

        assert value("step_time_s") == median
        assert value("step_time_p90_s") == p90
        assert value("tokens_per_s_per_gpu") == pytest.approx(tokens / median, rel=1e-12)
        assert value("mfu") == pytest.approx(mfu, rel=1e-12)
        [m] = [m for m in ms if m.metric == prefix + "mfu"]
        assert m.tags["peak_tflops"] == 989 and m.tags["peak_source"] == "gpu_peaks.yaml 'H200'"
        # and the stored record (the host's own judging) holds the same numbers
        [rec] = [x for x in stored(name, "measurements") if x["unit_key"] == unit
                 and x["metric"] == prefix + "mfu" and (node is None or x["nodes"] == [node])]
        assert rec["value"] == pytest.approx(mfu, rel=1e-12)
        shown.append((f"{median:.4g}", f"{p90:.4g}", f"{tokens / median:,.0f}", f"{mfu:.1%}"))
    assert tuple(shown) == SHOWN[node or {HOST: "h200-host", ONE: "h200-1gpu"}.get(name, "multi")]
    [ref] = [f for f in runs[name].findings() if f.unit_key == unit
             and f.code == "TRAIN_REFERENCE" and node in (None, f.node)]
    assert f"{shown[1][3]} (" in ref.message and f"{shown[0][3]} (" in ref.message
    assert "on the fastest kernels (10 steps after the verified ones)" in ref.message


STARTUP = ["import_torch", "cuda_context", "process_group", "model", "compile_setup", "wrap",
           "optimizer"]


def test_each_launch_timed_its_start_up() -> None:
    """The one-GPU run's ranks (payload since the start-up was timed): torchrun's launch
    and every start-up stage, on every launch; the restore's own are the restart's parts."""
    for phase in ("reference", "kill", "restore"):
        folder = RUN[ONE] / f"nodes/h200-1gpu/train/{phase}/h200-1gpu"
        start = first(events(rank_file(folder)), "start")
        assert sorted(start["init_s"]) == sorted(STARTUP)
        assert all(v >= 0 for v in start["init_s"].values())
        # launch: from the supervisor's start of torchrun to the rank's main()
        assert 0 < start["launch_s"] < start["t"] - doc(folder)["start_time"]
        assert start["launch_s"] + sum(start["init_s"].values()) == pytest.approx(
            start["t"] - doc(folder)["start_time"], abs=0.1)
    # the captures from before the start-up was timed carry none of it
    assert "launch_s" not in first(events(rank_file(RUN[HOST] / H_REF)), "start")


def test_a_process_group_bound_to_its_gpu_needs_no_guess() -> None:
    """Ranks that pass device_id to init_process_group (the one-GPU run): no barrier that
    has to guess its device; the 2 x H200 runs, from before, warned on every launch."""
    warning = "barrier(): using the device under current context"
    before = sorted(RUN[HOST].rglob("torchrun.stderr"))
    assert before and all(warning in p.read_text() for p in before)
    after = sorted(RUN[ONE].rglob("torchrun.stderr"))
    assert len(after) == 3 and not any(warning in p.read_text() for p in after)


def test_peak_memory_per_rank(runs: dict[str, Replayed]) -> None:
    ms = runs[HOST].measurements()
    for rank in (0, 1):
        evs = events(rank_file(RUN[HOST] / H_REF, rank))
        last = next(e for e in reversed(evs) if e["event"] in ("end", "step"))
        assert one(ms, HOST_UNIT, "peak_mem_allocated_bytes", rank=rank).value == last[
            "mem_alloc_peak"] == 42120032256
        assert one(ms, HOST_UNIT, "peak_mem_reserved_bytes", rank=rank).value == last[
            "mem_reserved_peak"]


@pytest.mark.parametrize("name,unit,kills,restore,node,saved_on,restored_on", PROTOCOLS)
def test_checkpoint_size_is_the_manifests_total(runs: dict[str, Replayed], name: str, unit: str,
                                                kills: list[str], restore: str,
                                                node: str | None, saved_on: list[str],
                                                restored_on: list[str]) -> None:
    """The checkpoints themselves were deleted after the run; every rank's SAVED event
    carries the byte total of the files the manifest lists (gathered from all ranks)."""
    saved = [e for k in kills for p in sorted((RUN[name] / k).glob("rank*.jsonl"))
             for e in events(p) if e["event"] == "saved" and e["step"] == K]
    assert len(saved) == len(saved_on) * (2 if name == HOST else 1)  # one per rank
    assert len({e["bytes"] for e in saved}) == 1 and not any(e["problems"] for e in saved)
    rank0 = next(e for e in saved if e["rank"] == 0)
    ms = mine(runs[name].measurements(), unit, node)
    [size] = [m for m in ms if m.metric == "ckpt_size_bytes"]
    assert size.value == rank0["bytes"] and size.tags == {"files": rank0["files"]}
    assert round(size.value / 1e9, 1) == 12.6
    [save] = [m for m in ms if m.metric == "ckpt_save_s"]
    assert save.value == rank0["save_s"]
    [gbs] = [m for m in ms if m.metric == "ckpt_write_gbs"]
    assert gbs.value == pytest.approx(rank0["bytes"] / rank0["write_s"] / 1e9, rel=1e-12)


# --------------------------------------------------------------------------- telemetry, transport


def dmon_samples(path: Path) -> list[tuple[int, int, dict[str, float]]]:
    """(line number, GPU, values) of each sample, read with the header's column names."""
    cols: list[str] = []
    out = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("#Time"):
            cols = line[1:].split()
        elif line.strip() and not line.startswith("#"):
            vals = line.split()
            row = dict(zip(cols, vals, strict=True))
            h, m, s = (int(x) for x in row.pop("Time").split(":"))
            out.append((i, int(row.pop("gpu")), {"tod": h * 3600 + m * 60 + s,
                                                 **{k: float(v) for k, v in row.items()}}))
    return out


THROTTLED = [  # (run, unit, reference folder, node, gpu, samples in the steps, throttled, line)
    (HOST, HOST_UNIT, H_REF, "h200-host", 0, 7, 6, 61),
    (HOST, HOST_UNIT, H_REF, "h200-host", 1, 7, 6, 62),
    (SIM, SIM_SINGLE, "nodes/sim-a/train/reference/sim-a", "sim-a", 0, 7, 7, 20),
    (SIM, SIM_SINGLE, "nodes/sim-b/train/reference/sim-b", "sim-b", 1, 7, 6, 21),
    (SIM, SIM_MULTI, "providers/h200-sim/train/multi/reference/sim-a", "sim-a", 0, 28, 26, 28),
    (SIM, SIM_MULTI, "providers/h200-sim/train/multi/reference/sim-b", "sim-b", 1, 28, 27, 27),
    (ONE, ONE_UNIT, "nodes/h200-1gpu/train/reference/h200-1gpu", "h200-1gpu", 0, 6, 6, 29),
]


@pytest.mark.parametrize("name,unit,folder,node,gpu,n,bad,line", THROTTLED)
def test_power_throttling_found_in_the_dmon_samples(runs: dict[str, Replayed], name: str,
                                                    unit: str, folder: str, node: str, gpu: int,
                                                    n: int, bad: int, line: int) -> None:
    ref = RUN[name] / folder
    tele = doc(ref)["telemetry"]
    assert tele["source"] == "dmon" and tele["interval_s"] == 1
    rank0 = ref if (ref / "rank0.jsonl").is_file() else ref.parent / "sim-a"
    st = steps(events(rank_file(rank0)))
    lo = min(s["t"] - s["step_time_s"] for s in st.values()) - tele["interval_s"]
    hi = max(s["t"] for s in st.values()) + tele["interval_s"]
    samples = dmon_samples(ref / tele["file"])
    tod0 = samples[0][2]["tod"]  # the first sample is the sampler's start
    window = [(i, v) for i, g, v in samples
              if g == gpu and lo <= tele["started"] + (v["tod"] - tod0) % 86400 <= hi]
    limit = runs[name].suite.train.thresholds.power_violation_pct
    throttled = [i for i, v in window if v["pviol"] > limit or v["tviol"] > 0]
    assert (len(window), len(throttled), throttled[0]) == (n, bad, line)
    [f] = [f for f in runs[name].findings() if f.unit_key == unit and f.code == "TRAIN_THROTTLED"
           and f.details["gpu"] == gpu]
    counted = {"gpu": gpu, "samples": bad, "line": line}
    limits = tele.get("limits")
    if limits is None:  # captured before the supervisor read the GPUs' limits: a warning
        assert f.details == counted and f.severity == "WARN"
    else:
        # at its default 700 W limit, the median SM clock of the capped samples at 80% or
        # more of the maximum: the rated power of dense bf16 work, not a fault
        [lim] = [g for g in limits["gpus"] if g["index"] == gpu]
        assert (lim["max_sm_clock_mhz"], lim["power_limit_w"], lim["default_power_limit_w"]) \
            == (1980, 700, 700)
        clock = statistics.median(v["pclk"] for i, v in window if i in throttled)
        assert clock >= 0.8 * 1980
        assert f.details == {**counted, "sm_clock_mhz": clock, "max_sm_clock_mhz": 1980,
                             "power_limit_w": 700, "default_power_limit_w": 700}
        assert f.severity == "INFO" and f.message.endswith(
            f"at its full power limit (700 W) with the SM clock at {clock:.0f} of 1980 MHz: "
            "its rated power, not a fault")
    assert f"{node} GPU {gpu}: throttled in {bad} of {n} samples while training (pviol" \
        in f.message
    assert f.evidence == [f"{folder}/dmon.txt"]
    power = one(runs[name].measurements(), unit, "gpu_power_w", node=node, gpu=gpu)
    assert power.value == statistics.median(v["pwr"] for _, v in window)
    assert power.tags["samples"] == n


def test_the_multi_node_run_went_over_sockets_and_the_host_over_nvlink_p2p() -> None:
    """The training judge does not record NCCL's transport; NCCL's own INFO lines in the
    captured torchrun output show it, read with the nccl_debug parser."""
    multi = RUN[SIM] / "providers/h200-sim/train/multi/reference"
    for node, rank in (("sim-a", 0), ("sim-b", 1)):
        facts = parse_nccl_debug((multi / node / "torchrun.stdout").read_text(), source=node)
        assert (facts.n_ranks, facts.n_nodes, facts.transports, facts.networks) == (
            2, 2, ["NET"], ["Socket"])
        assert [c.rank for c in facts.comms] == [rank]
        assert first(events(multi / node / f"rank{rank}.jsonl"), "start")["node_hostid"] == node
    host = parse_nccl_debug((RUN[HOST] / H_REF / "torchrun.stdout").read_text(), source="host")
    assert (host.n_ranks, host.n_nodes, host.transports) == (2, 1, ["P2P"])
    assert host.nccl_version == "2.28.9"


def test_strict_determinism_was_on_and_nothing_fell_back() -> None:
    for name in (HOST, SIM, ONE):
        for path in sorted(RUN[name].rglob("rank*.jsonl")):
            evs = events(path)
            assert first(evs, "start")["deterministic"] == {
                "CUBLAS_WORKSPACE_CONFIG": ":4096:8", "cudnn.benchmark": False,
                "cudnn.deterministic": True, "use_deterministic_algorithms": True}, path
            assert not [e for e in evs if e["event"] == "nondeterministic"], path


def test_the_runs_wall_times() -> None:
    """What docs/benchmarks.md reports as the step's wall time: the run's own clock."""
    def wall(name: str) -> float:
        meta = json.loads((RUN[name] / "run.json").read_text())
        t = [datetime.strptime(meta[k], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
             for k in ("started", "finished")]
        return (t[1] - t[0]).total_seconds()

    assert (wall(HOST), wall(SIM), wall(ONE)) == (150, 329, 112)
    assert "train-one rc=0 wall=113 s" in (X1 / "one-console.txt").read_text()
    assert "train-host rc=0 wall=152 s" in (X2 / "host-console.txt").read_text()
    assert "train-sim rc=0 wall=331 s" in (X2 / "sim-console.txt").read_text()
