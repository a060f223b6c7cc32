#!/usr/bin/env bash
# The whole pipeline on a one-GPU host (local executor), timed step by step, then the
# busy-GPU case: another process holding 60 GiB and computing while `gpuvet preflight`
# and `gpuvet health --level quick` run. Writes $OUT/table.txt (the figures
# docs/benchmarks.md quotes) and $OUT/results.tar.gz (the run folders, kept as fixtures).
#
#   OUT=/tmp/pb NCCL_SOURCE=.snapshots/nccl-tests.tar.gz [RUNS=2] [BUSY=0] \
#     scripts/gpu-pipeline-bench.sh
# The suite is the one of the earlier measurement (tests/fixtures/h100x1-two-orders):
# standard health, nccl to 128M from a pushed archive, the 1b preset, 20 steps, a
# checkpoint at step 8, killed before the manifest of step 10.
set -u
OUT=${OUT:-/tmp/gpuvet-pipeline-bench}
mkdir -p "$OUT"
. "$(dirname "$0")/gpu-env.sh"
R=$OUT/results W=${WORK:-/tmp/gpuvet-bench}
rm -rf "$W" "$R"; mkdir -p "$W"
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$card" in *H200*) model=H200 ;; *H100*) model=H100 ;; *) model="$card" ;; esac
cat > "$OUT/inventory.yaml" <<YAML
version: 1
providers:
  one:
    executor: local
    expect: {gpu_model: $model, gpus_per_node: 1}
    nodes:
      - name: gpu1
        work_dir: $W/work
        ckpt_dir: $W/ckpt
YAML
cat > "$OUT/suite.yaml" <<YAML
name: pipeline-1b-bench
nccl:
  max_bytes: 128M
  build_timeout_s: 500
  source: {local_path: $(realpath "${NCCL_SOURCE:-.snapshots/nccl-tests.tar.gz}")}
train:
  model: 1b
  steps: 20
  ckpt_step: 8
  kill: before-manifest
  kill_offset: 2
  timeout_s: 540
YAML
INV=$OUT/inventory.yaml SUITE=$OUT/suite.yaml
gv() { "$PY" -m orchestrator "$@"; }
{
echo "card: $card; $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)"
for i in $(seq 1 "${RUNS:-1}"); do
t0=$(date +%s.%N)
gv pipeline -i "$INV" --suite "$SUITE" --results "$R" --json > "$OUT/pipeline$i.json" \
  2> "$OUT/pipeline$i.stderr"
rc=$?
t1=$(date +%s.%N)
echo "pipeline $i rc=$rc wall=$("$PY" -c "print(round($t1 - $t0, 1))") s"
"$PY" - "$R" "$t0" <<'PY'
import json, pathlib, sys
root, t0 = pathlib.Path(sys.argv[1]), float(sys.argv[2])
run = sorted(root.glob("2*"))[-1]
prev = t0
for step in ("preflight", "health", "nccl", "train"):
    done = run / "nodes" / "gpu1" / step / "done.json"
    if done.is_file():
        t = done.stat().st_mtime
        print(f"  {step:9s} {t - prev:6.1f} s (done at {t - t0:6.1f} s)")
        prev = t
col = run / "nodes" / "gpu1" / "preflight" / "collect.json"
if col.is_file():
    c = json.loads(col.read_text())
    slow = sorted(((v.get("duration_s") or 0, k) for k, v in c.get("commands", {}).items()
                   if isinstance(v, dict)), reverse=True)[:2]
    print(f"  preflight on the node {c.get('duration_s')} s; slowest commands {slow}")
meta = json.loads((run / "run.json").read_text())
print("  status", meta["status"], "run", run.name)
nb = run / "nodes" / "gpu1" / "nccl"
for name in ("prebuild/build.json", "build.json"):
    p = nb / name
    if p.is_file():
        d = json.loads(p.read_text())
        print(f"  nccl {name}: cached={d.get('cached')} build_s={d.get('build_s')}")
fs = [json.loads(l) for l in (run / "findings.jsonl").read_text().splitlines()]
for f in fs:
    if f["severity"] in ("WARN", "FAIL") or f["code"] in ("TRAIN_RESTORE_OK", "TRAIN_REFERENCE"):
        print("  ", f["severity"], f["code"], f["message"][:240])
ms = [json.loads(l) for l in (run / "measurements.jsonl").read_text().splitlines()]
for m in ms:
    if m["metric"] in ("restart_s", "mfu", "deterministic_mfu", "ckpt_save_s", "ckpt_load_s",
                       "step_time_s"):
        print(f"  {m['metric']} = {m['value']:.4g} {m['unit']}",
              {k: v for k, v in m["tags"].items() if k.endswith("_s")}
              if m["metric"] == "restart_s" else "")
for sup in sorted((run / "nodes" / "gpu1" / "train").glob("*/gpu1/supervise.json")):
    d = json.loads(sup.read_text())
    gate = d.get("gate_opened")
    print(f"  {sup.parts[-3]:9s} supervise {d.get('start_time', 0) - t0:6.1f} s to "
          f"{d.get('end_time', 0) - t0:6.1f} s after the pipeline's start"
          + (f", gate opened at {gate - t0:6.1f} s" if gate else ""))
    rank = sup.parent / "rank0.jsonl"
    if rank.is_file():
        for line in rank.read_text().splitlines():
            e = json.loads(line)
            if e.get("event") in ("start", "saved", "loaded", "end"):
                keep = {k: e[k] for k in ("init_s", "launch_s", "save_s", "write_s", "verify_s",
                                          "load_s") if k in e}
                print(f"    {e['event']:7s} at {e['t'] - t0:6.1f} s {keep}")
PY
done
if [ "${BUSY:-1}" = 1 ]; then
# the busy GPU: another tenant's job holding 60 GiB and computing
"$PY" - <<'PY' > "$OUT/hog.txt" 2>&1 &
import torch, time
hold = torch.empty(60 << 30, dtype=torch.uint8, device="cuda")
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.time() + 170
while time.time() < end:
    for _ in range(20):
        a @ a
    torch.cuda.synchronize()
PY
hog=$!
sleep 12
gv preflight -i "$INV" --results "$R" --json > "$OUT/busy-preflight.json" 2> "$OUT/busy-preflight.stderr"
echo "busy preflight rc=$?"
gv health -i "$INV" --results "$R" --level quick --json > "$OUT/busy-health.json" 2> "$OUT/busy-health.stderr"
echo "busy health rc=$?"
kill $hog; wait $hog 2>/dev/null
"$PY" - "$OUT" <<'PY'
import json, sys
for name in ("busy-preflight.json", "busy-health.json"):
    try:
        d = json.load(open(f"{sys.argv[1]}/{name}"))
    except Exception as exc:
        print(name, "unreadable:", exc); continue
    for f in d.get("findings", []):
        if f["severity"] in ("WARN", "FAIL"):
            print("  ", name.split(".")[0], f["severity"], f["code"], f["message"][:260])
PY
fi
} 2>&1 | tee "$OUT/table.txt"
tar czf /tmp/results.tar.gz -C "$OUT" results inventory.yaml suite.yaml $(cd "$OUT" && ls \
  pipeline*.json pipeline*.stderr busy-*.json busy-*.stderr 2>/dev/null)
# what comes back: the table and the run folders, nothing else (the device tool returns few files)
find "$OUT" -mindepth 1 -maxdepth 1 ! -name table.txt -exec rm -rf {} +
mv /tmp/results.tar.gz "$OUT/"
