#!/usr/bin/env bash
# The multi-node paths on a one-GPU host, with simulated nodes sharing GPU 0 (each its own
# NCCL_HOSTID, work and checkpoint folder: NCCL counts them as hosts and talks NET/Socket):
#   fleet:  the fleet step, nccl-tests engine, pairs then groups on four nodes, one of them
#           (s3) given NCCL settings that make it slow or fail (NCCL_BUFFSIZE=65536, one
#           socket thread); stall_timeout_s 30 bounds a job that hangs;
#   train:  the training step across two nodes (350m preset): the single-node units (each
#           node's checkpoint restored on the other) and the multi-node unit (reference,
#           kill, restore with the ranks swapped);
#   pipe:   `gpuvet pipeline --fleet` over two nodes, interrupted with SIGINT while it
#           trains, then finished with `--resume`;
#   groups: the fleet's groups plan alone;
#   trainfail: the training step across two nodes with s2's rank of the multi-node
#           reference SIGKILLed once it trains (a node that dies): the step must end
#           within a bound and name the cause.
# Prints one line per step with its exit code and wall time, then the findings that are not
# PASS/INFO; writes $OUT/table.txt and $OUT/results.tar.gz (the run folders, inventories,
# suites and console outputs, as fixtures), the latter after every step.
#
#   OUT=/tmp/sims NCCL_SOURCE=.snapshots/nccl-tests.tar.gz [STEPS='fleet train pipe'] \
#     scripts/gpu-sims.sh
# (a dry run without a GPU: PY=.venv/bin/python NODE_PYTHON=$PWD/.venv/bin/python MODEL=tiny)
set -u
OUT=${OUT:-/tmp/gpuvet-sims}
mkdir -p "$OUT"
. "$(dirname "$0")/gpu-env.sh"
W=${WORK:-/tmp/gpuvet-sims}
R=$W/results L=$W/out  # the run folders and logs; $OUT gets table.txt and results.tar.gz
rm -rf "$W"; mkdir -p "$W/ckpt" "$L"
SRC=$(realpath "${NCCL_SOURCE:-.snapshots/nccl-tests.tar.gz}")
node() {  # name [extra env]
  echo "      - name: $1"
  echo "        work_dir: $W/$1/work"
  echo "        ckpt_dir: $W/ckpt"
  [ -n "${NODE_PYTHON:-}" ] && echo "        python: $NODE_PYTHON"
  echo "        env: {CUDA_VISIBLE_DEVICES: \"0\", NCCL_HOSTID: $1${2:+, $2}}"
}
{ echo "version: 1"; echo "providers:"; echo "  sim:"; echo "    executor: local"
  echo "    expect: {gpus_per_node: 1}"; echo "    nodes:"
  node s1; node s2; node s3 "NCCL_BUFFSIZE: \"65536\", NCCL_SOCKET_NTHREADS: \"1\", NCCL_NSOCKS_PERTHREAD: \"1\""
  node s4; } > "$L/sims4.yaml"
{ echo "version: 1"; echo "providers:"; echo "  sim:"; echo "    executor: local"
  echo "    expect: {gpus_per_node: 1}"; echo "    nodes:"; node s1; node s2; } > "$L/sims2.yaml"
cat > "$L/fleet.yaml" <<YAML
name: sims-fleet
nccl:
  build_timeout_s: 500
  source: {local_path: $SRC}
fleet:
  engine: nccl-tests
  min_bytes: 16M
  max_bytes: 256M
  iters: 10
  warmup_iters: 2
  stall_timeout_s: 30
  timeout_s: 300
  rdma: false
YAML
TRAIN="train:
  model: ${MODEL:-350m}
  steps: 12
  ckpt_step: 5
  kill: after-step
  kill_offset: 2
  timeout_s: 300"  # the same training in the train and pipe steps
printf 'name: sims-train-350m\n%s\n' "$TRAIN" > "$L/train.yaml"
cat > "$L/pipe.yaml" <<YAML
name: sims-pipeline
health: {level: quick}
nccl:
  max_bytes: 64M
  build_timeout_s: 500
  source: {local_path: $SRC}
fleet:
  engine: nccl-tests
  min_bytes: 16M
  max_bytes: 64M
  iters: 10
  stall_timeout_s: 30
  rdma: false
$TRAIN
YAML
gv() { "$PY" -m orchestrator "$@"; }
newest() { ls -d "$R"/2* 2>/dev/null | tail -1; }
show() {  # name rc t0: one line, then the run's WARN/FAIL findings
  local run; run=$(newest)
  echo "$1 rc=$2 wall=$((SECONDS - $3)) s run=$(basename "${run:-none}")"
  [ -n "$run" ] && "$PY" - "$run" <<'PY'
import json, pathlib, sys
run = pathlib.Path(sys.argv[1])
meta = json.loads((run / "run.json").read_text())
print("   status", meta.get("status"))
p = run / "findings.jsonl"
for line in (p.read_text().splitlines() if p.is_file() else []):
    f = json.loads(line)
    if f["severity"] in ("WARN", "FAIL") or f["code"].startswith(("FLEET_", "TRAIN_RESTORE",
                                                                    "TRAIN_PART", "TRAIN_MULTI")):
        print("  ", f["severity"], f["code"], (f.get("node") or f.get("provider") or ""),
              f["message"][:230])
PY
}
STEPS=${STEPS:-fleet train pipe}
{
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for s in $STEPS; do case $s in
fleet)
  t0=$SECONDS; gv fleet -i "$L/sims4.yaml" --suite "$L/fleet.yaml" --results "$R" \
    > "$L/fleet-pairs.txt" 2>&1; show "fleet pairs (4 nodes, s3 bad)" $? $t0
  t0=$SECONDS; gv fleet -i "$L/sims4.yaml" --suite "$L/fleet.yaml" --results "$R" \
    --plan groups > "$L/fleet-groups.txt" 2>&1; show "fleet groups (4 nodes, s3 bad)" $? $t0 ;;
trainfail)  # a node of the multi-node reference dies while it trains
  t0=$SECONDS
  gv train -i "$L/sims2.yaml" --suite "$L/train.yaml" --results "$R" > "$L/trainfail.txt" 2>&1 &
  pid=$!
  for i in $(seq 1 900); do  # until s2's rank of the multi-node reference has stepped
    sleep 0.2
    for f in "$W"/s2/work/train-runs/*/multi-*/reference/rank*.jsonl; do
      [ -s "$f" ] && grep -q '"event": "step"' "$f" && break 2
    done
    kill -0 $pid 2>/dev/null || break
  done
  pkill -KILL -f "payload train --phase reference --out $W/s2/work/train-runs/[^ ]*/multi-"
  echo "   s2's multi-node rank SIGKILLed $((SECONDS - t0)) s in"
  k=$SECONDS; wait $pid; rc=$?
  echo "   the step ended $((SECONDS - k)) s after the kill"
  show "train (2 nodes), s2's multi-node rank killed" $rc $t0
  echo "   processes of the step left: $(pgrep -f "payload train.*$W" | wc -l)" ;;
groups)  # the groups plan alone
  t0=$SECONDS; gv fleet -i "$L/sims4.yaml" --suite "$L/fleet.yaml" --results "$R" \
    --plan groups > "$L/fleet-groups.txt" 2>&1; show "fleet groups (4 nodes, s3 bad)" $? $t0 ;;
train)
  t0=$SECONDS; gv train -i "$L/sims2.yaml" --suite "$L/train.yaml" --results "$R" \
    > "$L/train.txt" 2>&1; show "train (2 nodes, 350m)" $? $t0 ;;
pipe)
  t0=$SECONDS
  # job control on, or the shell starts the background job with SIGINT ignored
  set -m
  "$PY" -m orchestrator pipeline -i "$L/sims2.yaml" --suite "$L/pipe.yaml" --results "$R" \
    --fleet > "$L/pipe1.txt" 2>&1 &
  pid=$!
  set +m
  # SIGINT once the training step trains: a rank has logged its start (the references
  # are started during health, and log nothing until their gate opens)
  for i in $(seq 1 600); do
    sleep 0.5
    for f in "$W"/s*/work/train-runs/*/*/*/rank0.jsonl; do [ -s "$f" ] && break 2; done
    kill -0 $pid 2>/dev/null || break
  done
  sleep 5; kill -INT $pid; wait $pid; rc=$?
  show "pipeline --fleet, SIGINT in train" $rc $t0
  left=$(pgrep -f "payload train.*$W" | wc -l); echo "   processes of the training step left: $left"
  id=$(basename "$(newest)")
  t0=$SECONDS; gv pipeline -i "$L/sims2.yaml" --suite "$L/pipe.yaml" --results "$R" \
    --fleet --resume "$id" > "$L/pipe2.txt" 2>&1; show "pipeline --resume $id" $? $t0 ;;
esac
  # after every step: what a timeout would otherwise lose
  tar czf "$OUT/results.tar.gz.tmp" -C "$W" results out && mv "$OUT/results.tar.gz.tmp" \
    "$OUT/results.tar.gz"
done
} 2>&1 | tee "$OUT/table.txt"
