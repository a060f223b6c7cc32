#!/usr/bin/env bash
# Faults on a one-GPU host, as a user meets them; each must end in a finding that names
# its cause. Never changes a GPU setting.
#   hidden:   the GPU hidden by CUDA_VISIBLE_DEVICES=1 in the shell gpuvet runs from
#             (`gpuvet preflight`);
#   shm:      the checkpoint directory on tmpfs (/dev/shm): it does not outlive the
#             instance (`gpuvet preflight`, then `gpuvet train`);
#   full:     the checkpoint directory on a 2 GiB tmpfs that fills during the first save
#             of the 350m preset (4.2 GB) (`gpuvet train`; skipped where mount is refused);
#   sigkill:  the controller killed with SIGKILL while the training step trains, then
#             `gpuvet train --resume` (what is left running in between, and the verdict).
# Writes $OUT/table.txt and $OUT/results.tar.gz (the run folders and console outputs).
#
#   OUT=/tmp/faults [STEPS='hidden shm full sigkill'] scripts/gpu-faults.sh
set -u
OUT=${OUT:-/tmp/gpuvet-faults}
mkdir -p "$OUT"
. "$(dirname "$0")/gpu-env.sh"
W=${WORK:-/tmp/gpuvet-faults}
R=$W/results L=$W/out
rm -rf "$W"; mkdir -p "$L"
gv() { "$PY" -m orchestrator "$@"; }
inv() {  # file ckpt_dir
  cat > "$1" <<YAML
version: 1
providers:
  one:
    executor: local
    expect: {gpus_per_node: 1}
    nodes:
      - name: gpu1
        work_dir: $W/work
        ckpt_dir: $2
YAML
}
cat > "$L/train.yaml" <<YAML
name: faults-train
train:
  model: 350m
  steps: 12
  ckpt_step: 5
  kill: before-manifest
  kill_offset: 2
  timeout_s: 300
YAML
newest() { ls -d "$R"/2* 2>/dev/null | sort | tail -1; }
show() {  # label rc t0
  echo "$1 rc=$2 wall=$((SECONDS - $3)) s run=$(basename "$(newest)")"
  "$PY" - "$(newest)" <<'PY'
import json, pathlib, sys
run = pathlib.Path(sys.argv[1])
meta = json.loads((run / "run.json").read_text())
print("   status", meta["status"])
for line in (run / "findings.jsonl").read_text().splitlines():
    f = json.loads(line)
    if f["severity"] in ("WARN", "FAIL") or f["code"] == "TRAIN_RESTORE_OK":
        print("  ", f["severity"], f["code"], f["message"][:300])
PY
}
STEPS=${STEPS:-hidden shm full sigkill}
{
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "/dev/shm: $(df -h /dev/shm | tail -1)"
for s in $STEPS; do case $s in
hidden)
  inv "$L/hidden.yaml" "$W/ckpt"
  t0=$SECONDS; CUDA_VISIBLE_DEVICES=1 gv preflight -i "$L/hidden.yaml" --results "$R" \
    > "$L/hidden.txt" 2>&1; show "preflight, CUDA_VISIBLE_DEVICES=1 in the shell" $? $t0 ;;
shm)
  inv "$L/shm.yaml" /dev/shm/gpuvet-ckpt
  t0=$SECONDS; gv preflight -i "$L/shm.yaml" --results "$R" > "$L/shm-preflight.txt" 2>&1
  show "preflight, ckpt_dir on /dev/shm" $? $t0
  t0=$SECONDS; gv train -i "$L/shm.yaml" --suite "$L/train.yaml" --results "$R" \
    > "$L/shm-train.txt" 2>&1; show "train, ckpt_dir on /dev/shm" $? $t0
  rm -rf /dev/shm/gpuvet-ckpt ;;
full)
  mkdir -p "$W/small"
  if mount -t tmpfs -o size=2g tmpfs "$W/small" 2>"$L/mount.err"; then
    inv "$L/full.yaml" "$W/small"
    t0=$SECONDS; gv train -i "$L/full.yaml" --suite "$L/train.yaml" --results "$R" \
      > "$L/full-train.txt" 2>&1; show "train, ckpt_dir on a 2 GiB tmpfs" $? $t0
    df -h "$W/small" | tail -1; umount "$W/small"
  else
    echo "full: skipped, mount refused: $(cat "$L/mount.err")"
  fi ;;
sigkill)
  inv "$L/kill.yaml" "$W/ckpt"
  rm -rf "$W/work/train-runs"  # the rank files of the steps before: not this run's
  t0=$SECONDS
  # exec: $! is the controller itself, not a shell around it
  (exec "$PY" -m orchestrator train -i "$L/kill.yaml" --suite "$L/train.yaml" \
    --results "$R" > "$L/kill1.txt" 2>&1) &
  pid=$!
  for i in $(seq 1 600); do  # until a rank trains
    sleep 0.5
    for f in "$W"/work/train-runs/*/*/*/rank0.jsonl; do
      [ -s "$f" ] && grep -q '"event": "step"' "$f" && break 2
    done
    kill -0 $pid 2>/dev/null || break
  done
  kill -KILL $pid; wait $pid; rc=$?
  show "train, controller SIGKILLed while it trains" $rc $t0
  echo "   left running 2 s after: $(pgrep -f "payload train.*$W" | wc -l) process(es) of the step"
  sleep 20
  echo "   left running 22 s after: $(pgrep -f "payload train.*$W" | wc -l) process(es) of the step"
  id=$(basename "$(newest)")
  t0=$SECONDS; gv train -i "$L/kill.yaml" --suite "$L/train.yaml" --results "$R" \
    --resume "$id" > "$L/kill2.txt" 2>&1; show "train --resume $id" $? $t0
  echo "   left running after the resume: $(pgrep -f "payload train.*$W" | wc -l)" ;;
esac
  tar czf "$OUT/results.tar.gz.tmp" -C "$W" results out && mv "$OUT/results.tar.gz.tmp" \
    "$OUT/results.tar.gz"
done
} 2>&1 | tee "$OUT/table.txt"
