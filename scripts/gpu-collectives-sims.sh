#!/usr/bin/env bash
# The nccl step's collectives and its network mode across two simulated nodes sharing the
# one GPU (each its own NCCL_HOSTID: NCCL talks NET/Socket between them): all_reduce,
# all_gather, reduce_scatter and alltoall, three rounds each, in the normal and the network
# mode. Writes $OUT/table.txt (the findings that are not PASS) and $OUT/results.tar.gz.
#
#   OUT=/tmp/coll NCCL_SOURCE=.snapshots/nccl-tests.tar.gz scripts/gpu-collectives-sims.sh
set -u
OUT=${OUT:-/tmp/gpuvet-collectives}
mkdir -p "$OUT"
. "$(dirname "$0")/gpu-env.sh"
W=${WORK:-/tmp/gpuvet-coll}
rm -rf "$W"; mkdir -p "$W"
SRC=$(realpath "${NCCL_SOURCE:-.snapshots/nccl-tests.tar.gz}")
cat > "$W/inv.yaml" <<YAML
version: 1
providers:
  sim:
    executor: local
    expect: {gpus_per_node: 1, fabric: {type: ethernet}}
    nodes:
      - {name: s1, work_dir: $W/s1, env: {CUDA_VISIBLE_DEVICES: "0", NCCL_HOSTID: s1}}
      - {name: s2, work_dir: $W/s2, env: {CUDA_VISIBLE_DEVICES: "0", NCCL_HOSTID: s2}}
YAML
cat > "$W/suite.yaml" <<YAML
name: sims-collectives
nccl:
  collectives: [all_reduce, all_gather, reduce_scatter, alltoall]
  modes: [normal, network]
  max_bytes: 16M
  build_timeout_s: 500
  timeout_s: 120
  source: {local_path: $SRC}
YAML
t0=$SECONDS
"$PY" -m orchestrator nccl -i "$W/inv.yaml" --suite "$W/suite.yaml" --results "$W/results" \
  --json > "$W/nccl.json" 2> "$W/nccl.stderr"
rc=$?
{
echo "gpuvet nccl (2 simulated nodes, 4 collectives, normal + network) rc=$rc $((SECONDS - t0)) s"
"$PY" - "$W/nccl.json" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as exc:
    print("no JSON:", exc); sys.exit()
for f in d.get("findings", []):
    if f["severity"] != "PASS" or f["code"].startswith(("NCCL_MULTI", "NCCL_NET", "NCCL_GPU")):
        print(" ", f["severity"], f["code"], (f["message"] or "")[:200])
PY
} | tee "$OUT/table.txt"
tar czf "$OUT/results.tar.gz" -C "$W" results inv.yaml suite.yaml nccl.json nccl.stderr
