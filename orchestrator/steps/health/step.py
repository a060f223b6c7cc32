"""The health step: every GPU of every node measured under load, judged against its
datasheet, its counters read before and after.

One unit of the step driver per node, all nodes in parallel: the payload's
``health`` entry point runs on the node (one process per GPU, then the links,
dcgmi), its output folder comes back into the run directory
(``nodes/<node>/health/``), and ``judge.judge_node`` turns it into findings and
measurements. While the node works, each event it prints moves the progress line
(``GPU 0 sustained``, ``links peer``). A node without a GPU says so (INFO) and is
done; an interrupted unit is not marked done, so ``--resume`` runs it again from
the start (the node's old folder removed first).
"""

from __future__ import annotations

import functools
import json
import re
import shlex
import shutil
import threading
from pathlib import Path

from orchestrator import payload as payload_mod
from orchestrator.errors import GpuvetError, StepError
from orchestrator.executors import ExecutorPool
from orchestrator.executors.base import Executor, ProgressHook
from orchestrator.inventory import Inventory, Node
from orchestrator.judging.sink import Sink
from orchestrator.steps.driver import Driven, StageTracker, UnitResult, drive, node_unit, step_pool
from orchestrator.steps.health.judge import judge_node
from orchestrator.steps.health.judge_checks import fp8_findings
from orchestrator.steps.health.output import read_output
from orchestrator.store import Run, atomic_write
from orchestrator.suite import HealthParams, Suite
from payload.health import protocol
from payload.scrub import scrub_text

STEP = "health"
ENGINE = "health"
_SAFE = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")
_TEXT = (".stdout", ".stderr", ".txt", ".csv", ".xml")


def remote_out(node: Node, run: Run) -> str:
    return f"{node.work_dir.rstrip('/')}/health-runs/{run.run_id}"


def health_args(node: Node, run: Run, params: HealthParams) -> list[str]:
    args = ["health", "--out", remote_out(node, run), "--level", params.level]
    if params.sustain_s is not None:
        args += ["--sustain-s", str(params.sustain_s)]
    if params.memtest_s is not None:
        args += ["--memtest-s", str(params.memtest_s)]
    return args


def describe(ev: dict[str, object]) -> str | None:
    """A progress line's text for one event the node printed."""
    kind, phase, gpu = ev.get("event"), ev.get("phase"), ev.get("gpu")
    if kind not in (protocol.START, protocol.DONE, protocol.SKIP, protocol.ERROR) or not phase:
        return None
    where = f"GPU {gpu} " if gpu is not None else (
        "links " if phase in protocol.LINK_PHASES else "")
    return f"{where}{phase}" + ("" if kind == protocol.START else f" {kind}")


class _Follow:
    """Reads the node's stdout file as it grows and notes each phase on the progress line."""

    def __init__(self, path: Path, stage: StageTracker) -> None:
        self.path, self.stage = path, stage
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> _Follow:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=5)

    def _loop(self) -> None:
        pos = 0
        buf = b""
        while not self.stop.wait(0.5):
            try:
                with self.path.open("rb") as f:
                    f.seek(pos)
                    chunk = f.read()
            except OSError:
                continue
            pos += len(chunk)
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                text = describe(ev) if isinstance(ev, dict) else None
                if text:
                    self.stage.note(text)


def fetch(ex: Executor, node: Node, run: Run, local: Path) -> None:
    """Bring the node's folder back: health.json, then every file it lists."""
    get = ex.get
    remote = remote_out(node, run)
    get(f"{remote}/{protocol.NODE_DOC}", local / protocol.NODE_DOC)
    try:
        doc = json.loads((local / protocol.NODE_DOC).read_text(errors="replace"))
    except (OSError, ValueError):
        return  # read_output says what is wrong with it
    files = doc.get("files") if isinstance(doc, dict) else None
    for name in files if isinstance(files, list) else []:
        name = str(name)
        if name == protocol.NODE_DOC or not _SAFE.match(name) or ".." in name.split("/"):
            continue
        target = local / name
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            get(f"{remote}/{name}", target)
        except GpuvetError:
            continue  # a file that went away: the judge reads what is there
        if name.endswith(_TEXT):
            atomic_write(target, scrub_text(target.read_text(errors="replace")),
                         durable=False)


def clear(local: Path) -> None:
    """What an earlier, unfinished attempt left in the node's folder (a resumed run)."""
    for child in local.iterdir():
        if child.name == "done.json":
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


FP8_QUERY = "nvidia-smi --query-gpu=index,name,compute_cap --format=csv,noheader"


def fp8_first(ex: Executor, node: Node, run: Run, suite: Suite, local: Path
              ) -> UnitResult | None:
    """An order that needs FP8, on GPUs without it: FAIL before anything runs (the
    unit's result), or None to go on (FP8 there, or nothing to tell it by)."""
    res = ex.run(FP8_QUERY, timeout=60)
    if not res.ok:
        return None  # no nvidia-smi: the run says what there is
    evidence = local / "compute-cap.csv"
    atomic_write(evidence, res.stdout, durable=False)
    sink = Sink(run_id=run.run_id, step=STEP, suite_hash=suite.hash, provider=node.provider,
                node=node.name, nodes=[node.name], label="", rel=run.rel, scope="health",
                engine=ENGINE)
    for line in res.stdout.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != 3 or not re.fullmatch(r"\d+\.\d+", cells[2]):
            continue
        major, minor = (int(x) for x in cells[2].split("."))
        fp8_findings(sink, node.name, True, cells[1], (major, minor), f"GPU {cells[0]}",
                     [evidence])
    if not sink.findings:
        return None
    sink.add("HEALTH_NOT_RUN", "INFO", f"{node.name}: the order needs FP8 and these GPUs have "
             "none: nothing else was measured", [evidence])
    return sink.result({"status": "no-fp8", "findings": len(sink.findings)})


def run_node(pool: ExecutorPool, node: Node, inv: Inventory, run: Run, suite: Suite,
             stage: StageTracker) -> UnitResult:
    params = suite.health
    local = run.node_dir(node.name, STEP)
    clear(local)
    ex = pool(node)
    stdout = local / "health.stdout"
    expect = inv.provider_of(node).expect
    if expect.needs_fp8:
        with stage("prepare"):
            early = fp8_first(ex, node, run, suite, local)
        if early is not None:
            return early
    with stage("execute"):
        stage.note("starting")
        ex.run(f"rm -rf {shlex.quote(remote_out(node, run))}", timeout=120)
        with _Follow(stdout, stage):
            res = payload_mod.run(ex, health_args(node, run, params),
                                  staging=run.dir / ".staging", timeout=params.timeout(),
                                  stdout_path=stdout)
        if res.stderr:
            atomic_write(local / "health.stderr", scrub_text(res.stderr), durable=False)
        stage.note("fetching")
        try:
            fetch(ex, node, run, local)
        except GpuvetError:
            res.raise_for_status("payload health")  # the node's failure says more
            raise
        if not (local / protocol.NODE_DOC).is_file():
            res.raise_for_status("payload health")
            raise StepError(f"the node wrote no {protocol.NODE_DOC}", node=node.name,
                            hint=f"see {run.rel(stdout)}")
    with stage("judge"):
        out = read_output(local, node.name)
        sink = Sink(run_id=run.run_id, step=STEP, suite_hash=suite.hash,
                    provider=node.provider, node=node.name, nodes=[node.name], label="",
                    rel=run.rel, scope="health", engine=ENGINE)
        summary = judge_node(sink, out, expect)
        summary["findings"] = len(sink.findings)
        if not params.keep_remote:
            try:
                ex.run(f"rm -rf {shlex.quote(remote_out(node, run))}", timeout=120)
            except GpuvetError:
                pass  # a node that went away keeps its folder; the verdict stands
        return sink.result(summary)


def run_health(inv: Inventory, nodes: list[Node], run: Run, suite: Suite, *,
               pool: ExecutorPool | None = None, accept_new_host_keys: bool = False,
               progress: ProgressHook | None = None) -> Driven:
    """Every node in parallel, one unit each; units already done (a resumed run) are kept."""
    with step_pool(inv, pool, accept_new_host_keys) as p:
        units = [node_unit(n, functools.partial(run_node, p, n, inv, run, suite)) for n in nodes]
        run.retract(keep_units={u.key for u in units if run.is_done(u.key, STEP)}, step=STEP)
        return drive(run, STEP, units, concurrency=inv.settings.concurrency, progress=progress)
