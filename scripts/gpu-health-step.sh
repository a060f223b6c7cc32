#!/usr/bin/env bash
# `gpuvet health` on a one-GPU host (inventories/h200-local.yaml, the local executor) at
# the standard and the quick level, beside the plain torch reference in the same call
# (scripts/gpu-health-ref.py: 2 GiB copy, 8192^3 bf16 burst and 15 s sustained, pinned
# 1 GiB host copies). $OUT gets table.txt (gpuvet's figures of GPU 0 from the run's
# measurements, the reference's, their ratios against the targets: memory and matrix
# >= 0.97, host copies >= 0.95; the wall time per level, standard <= 60 s), each
# level's findings (FAIL/WARN), the --json output and stderr, and each run folder as
# run-<level>.tar.gz. Every part's failure is logged in steps.txt and the rest goes on.
#
#   OUT=/tmp/health-step scripts/gpu-health-step.sh
#   OUT=/tmp/hs DEVICE=cpu PY=.venv/bin/python NODE_PYTHON=$PWD/.venv/bin/python \
#     scripts/gpu-health-step.sh                     # a dry run on a machine without GPUs
set -u
OUT=${OUT:-/tmp/gpuvet-health-step}
DEVICE=${DEVICE:-cuda}
LEVELS=${LEVELS:-standard quick}
mkdir -p "$OUT"
. "$(dirname "$0")/gpu-env.sh"
: > "$OUT/steps.txt"
log() { echo "$*" | tee -a "$OUT/steps.txt"; }
wall() { awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $1}"; }
INV=${INV:-inventories/h200-local.yaml}
R=$OUT/results
rm -rf "$R" /tmp/gpuvet-local/one/work/health-runs
if [ -n "${NODE_PYTHON:-}" ] || [ "$DEVICE" = cpu ]; then
  "$PY" - "$INV" "$OUT/inv.yaml" "${NODE_PYTHON:-}" "$DEVICE" <<'EOF' \
    || log "inventory copy failed rc=$?"
import sys
from ruamel.yaml import YAML
src, dst, python, device = sys.argv[1:5]
yaml = YAML()
doc = yaml.load(open(src))
for prov in doc["providers"].values():
    for node in prov["nodes"]:
        if python:
            node["python"] = python
        if device == "cpu":
            node.setdefault("env", {})["GPUVET_HEALTH_DEVICE"] = "cpu"
with open(dst, "w") as f:
    yaml.dump(doc, f)
EOF
  INV=$OUT/inv.yaml
fi
if [ "$DEVICE" = cuda ]; then
  nvidia-smi -L > "$OUT/gpus.txt" 2>&1 || log "nvidia-smi -L failed rc=$?"
  cat "$OUT/gpus.txt"
fi

t0=$(date +%s.%N)
DEVICE=$DEVICE "$PY" "$(dirname "$0")/gpu-health-ref.py" "$OUT/ref.json" \
  > "$OUT/ref.stdout" 2> >(stamp > "$OUT/ref.stderr")
log "reference rc=$? wall=$(wall "$t0") s"

for level in $LEVELS; do
  t0=$(date +%s.%N)
  "$PY" -m orchestrator health -i "$INV" --results "$R" --level "$level" --json -v \
    > "$OUT/health-$level.json" 2> >(stamp > "$OUT/health-$level.stderr")
  log "health-$level rc=$? wall=$(wall "$t0") s"
done

"$PY" - "$OUT" $LEVELS <<'EOF' > "$OUT/table.txt" 2> "$OUT/table.stderr"
import json, pathlib, re, sys
out, levels = pathlib.Path(sys.argv[1]), sys.argv[2:]
try:
    ref = json.loads((out / "ref.json").read_text())
except (OSError, ValueError) as exc:
    ref = {"device": f"(no reference: {exc})", "torch": "?"}
walls = {m.group(1): (m.group(2), m.group(3)) for line in (out / "steps.txt").read_text()
         .splitlines() if (m := re.match(r"(\S+) rc=(\S+) wall=(\S+) s", line))}
ROWS = [("copy GB/s (read+written)", "copy_gbps", "health.membw.copy_gbps", 0.97),
        ("read GB/s", "read_gbps", "health.membw.read_gbps", 0.97),
        ("bf16 TFLOP/s burst", "bf16_tflops", "health.matmul.bf16_tflops", 0.97),
        ("bf16 TFLOP/s sustained", "bf16_sustained_tflops", "health.sustained.tflops", 0.97),
        ("fp16 TFLOP/s", None, "health.matmul.fp16_tflops", None),
        ("tf32 TFLOP/s", None, "health.matmul.tf32_tflops", None),
        ("fp32 TFLOP/s", None, "health.matmul.fp32_tflops", None),
        ("fp64 TFLOP/s", None, "health.matmul.fp64_tflops", None),
        ("fp8 TFLOP/s", None, "health.matmul.fp8_tflops", None),
        ("host->device GB/s", "h2d_gbps", "health.pcie.h2d_gbps", 0.95),
        ("device->host GB/s", "d2h_gbps", "health.pcie.d2h_gbps", 0.95)]
docs, figures = {}, {}
for level in levels:
    try:
        docs[level] = json.loads((out / f"health-{level}.json").read_text())
    except (OSError, ValueError) as exc:
        docs[level] = {"error": str(exc)}
        continue
    run = pathlib.Path(docs[level].get("results", ""))
    rows = [json.loads(x) for x in (run / "measurements.jsonl").read_text().splitlines()] \
        if (run / "measurements.jsonl").is_file() else []
    figures[level] = {r["metric"]: r["value"] for r in rows
                      if str((r.get("tags") or {}).get("gpu")) in ("0", "cpu0")}
print(f"reference on {ref.get('device')}, torch {ref.get('torch')}")
print(" | ".join(["figure", "reference"] + [f"{lv} (ratio)" for lv in levels] + ["target"]))
bad = []
for name, rkey, metric, target in ROWS:
    r = ref.get(rkey) if rkey else None
    cells = [name, f"{r:.1f}" if r else "-"]
    for level in levels:
        v = figures.get(level, {}).get(metric)
        if v is None:
            cells.append("-")
            continue
        ratio = v / r if r else None
        if ratio is not None and target and ratio < target:
            bad.append(f"{level} {name}: {ratio:.3f} < {target}")
        cells.append(f"{v:.1f}" + (f" ({ratio:.3f})" if ratio else ""))
    cells.append(f">= {target}" if target else "")
    print(" | ".join(cells))
for level in levels:
    doc = docs[level]
    rc, w = walls.get(f"health-{level}", ("?", "?"))
    print(f"{level}: gpuvet rc {rc}, status {doc.get('status')}, wall {w} s"
          + (" (target <= 60 s)" if level == "standard" else ""))
    if level == "standard" and w != "?" and float(w) > 60:
        bad.append(f"standard took {w} s > 60 s")
    for f in doc.get("findings") or []:
        if f["severity"] in ("FAIL", "WARN"):
            print(f"  {f['severity']} {f['code']}: {f['message'][:220]}")
        if f["severity"] == "FAIL":
            bad.append(f"{level} {f['code']}")
    if doc.get("error"):
        bad.append(f"{level}: no --json output ({doc['error']})")
print("below target or failed:" if bad else "every figure at its target")
for b in bad:
    print("  " + b)
EOF
log "table rc=$?"
cat "$OUT/table.txt"
for level in $LEVELS; do
  run=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["results"])' \
    "$OUT/health-$level.json" 2>/dev/null) || { log "health-$level: no run folder"; continue; }
  tar czf "$OUT/run-$level.tar.gz" -C "$(dirname "$run")" "$(basename "$run")" \
    || log "health-$level: tar failed rc=$?"
done
cat "$OUT/steps.txt"
