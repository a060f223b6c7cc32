#!/usr/bin/env bash
# The health step's node side on a GPU host, beside a plain torch reference in the same
# run: `python3 -m payload health` at the quick and the standard level, then a table of
# gpuvet's figures (GPU 0), the reference's and their ratios, with the targets
# (memory and matrix >= 0.97 of the reference, host copies >= 0.95; standard <= 60 s
# wall per node), and each level's wall time.
#
# The reference: a copy of 2 GiB buffers (bytes read plus written), a read-only sum,
# an 8192^3 bf16 product (median of 10, CUDA events) and 15 s of them back to back,
# pinned 1 GiB host copies each way. On one H200 the whole script takes about 2-3 minutes.
#
#   OUT=/tmp/health-validate scripts/gpu-health-validate.sh
#   OUT=/tmp/hv DEVICE=cpu scripts/gpu-health-validate.sh      # dry run on a CPU machine
#
# $OUT gets ref.json, table.txt, steps.txt and health-<level>.tar.gz (each level's output
# folder: node document, events, counters, telemetry).
set -u
OUT=${OUT:-/tmp/gpuvet-health-validate}
DEVICE=${DEVICE:-cuda}
LEVELS=${LEVELS:-quick standard}
mkdir -p "$OUT"
. "$(dirname "$0")/gpu-env.sh"
: > "$OUT/steps.txt"
if [ "$DEVICE" = cuda ]; then
  nvidia-smi -L | tee "$OUT/gpus.txt"
fi

t0=$(date +%s.%N)
DEVICE=$DEVICE "$PY" "$(dirname "$0")/gpu-health-ref.py" "$OUT/ref.json" \
  2> >(stamp > "$OUT/ref.stderr")
echo "reference rc=$? wall=$(awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $t0}") s" | tee -a "$OUT/steps.txt"

for level in $LEVELS; do
  rm -rf "$OUT/health-$level"
  t0=$(date +%s.%N)
  "$PY" -m payload health --out "$OUT/health-$level" --level "$level" --device "$DEVICE" \
    > "$OUT/health-$level.events" 2> >(stamp > "$OUT/health-$level.stderr")
  rc=$?
  echo "health-$level rc=$rc wall=$(awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $t0}") s" | tee -a "$OUT/steps.txt"
  mv "$OUT/health-$level.events" "$OUT/health-$level.stderr" "$OUT/health-$level/" 2>/dev/null
done

"$PY" - "$OUT" $LEVELS <<'EOF' | tee "$OUT/table.txt"
import json, pathlib, re, sys
out, levels = pathlib.Path(sys.argv[1]), sys.argv[2:]
ref = json.loads((out / "ref.json").read_text())
walls = dict(re.match(r"(\S+) rc=\S+ wall=(\S+) s", l).groups()
             for l in (out / "steps.txt").read_text().splitlines())
# (row, the reference's key, where gpuvet has it: phase, value key, target ratio)
ROWS = [("copy GB/s (read+written)", "copy_gbps", "memcopy", "copy_gbps", 0.97),
        ("read GB/s", "read_gbps", "memread", "read_gbps", 0.97),
        ("bf16 TFLOP/s burst", "bf16_tflops", "matmul", "bf16_tflops", 0.97),
        ("bf16 TFLOP/s sustained", "bf16_sustained_tflops", "sustained", "tflops", 0.97),
        ("fp16 TFLOP/s", None, "matmul", "fp16_tflops", None),
        ("tf32 TFLOP/s", None, "matmul", "tf32_tflops", None),
        ("fp32 TFLOP/s", None, "matmul", "fp32_tflops", None),
        ("fp64 TFLOP/s", None, "matmul", "fp64_tflops", None),
        ("fp8 TFLOP/s", None, "matmul", "fp8_tflops", None),
        ("host->device GB/s", "h2d_gbps", "pcie", "{g}_h2d_gbps", 0.95),
        ("device->host GB/s", "d2h_gbps", "pcie", "{g}_d2h_gbps", 0.95)]
docs = {}
for level in levels:
    path = out / f"health-{level}" / "health.json"
    docs[level] = json.loads(path.read_text()) if path.is_file() else {}
print(f"reference on {ref['device']}, torch {ref['torch']}")
print(" | ".join(["figure", "reference"] + [f"{lv} (ratio)" for lv in levels] + ["target"]))
bad = []
for name, rkey, phase, vkey, target in ROWS:
    r = ref.get(rkey) if rkey else None
    cells = [name, f"{r:.1f}" if r else "-"]
    for level in levels:
        doc = docs[level]
        gpu = (doc.get("gpus") or [None])[0]
        label = (gpu or "").replace("/", "_")
        ev = (doc.get("links", {}) if phase == "pcie" else
              doc.get("results", {}).get(label, {})).get(phase, {})
        v = (ev.get("values") or {}).get(vkey.format(g=label))
        if v is None:
            cells.append(ev.get("event", "-") if ev.get("event") != "done" else "-")
            continue
        ratio = v / r if r else None
        if ratio is not None and target and ratio < target:
            bad.append(f"{level} {name}: {ratio:.3f} < {target}")
        cells.append(f"{v:.1f}" + (f" ({ratio:.3f})" if ratio else ""))
    cells.append(f">= {target}" if target else "")
    print(" | ".join(cells))
for level in levels:
    doc = docs[level]
    w = walls.get(f"health-{level}", "?")
    print(f"{level}: status {doc.get('status')}, wall {w} s (node document {doc.get('wall_s')} s)"
          + (" (target <= 60 s)" if level == "standard" else ""))
    if level == "standard" and w != "?" and float(w) > 60:
        bad.append(f"standard took {w} s > 60 s")
    for label, phases in (doc.get("results") or {}).items():
        for phase, ev in phases.items():
            if ev.get("event") == "error":
                bad.append(f"{level} gpu{label} {phase}: {ev.get('error')}")
            checks = ev.get("values") or {}
            for k, v in checks.items():
                if (k.endswith(("_rows_bad", "_cols_bad", "repeat_mismatches")) or
                        k == "mismatches") and v:
                    bad.append(f"{level} gpu{label} {phase} {k} = {v}")
print("below target or failed:" if bad else "every figure at its target")
for b in bad:
    print("  " + b)
EOF
for level in $LEVELS; do
  [ -d "$OUT/health-$level" ] && tar czf "$OUT/health-$level.tar.gz" -C "$OUT" "health-$level" \
    && rm -rf "$OUT/health-$level"
done
cat "$OUT/steps.txt"
