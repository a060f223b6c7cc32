#!/usr/bin/env bash
# Validate gpuvet on a 2-GPU host with the local executor (inventories/h200x2-local.yaml):
# preflight, nccl-tests single node (-g 2, up to 4 GiB, with the torch benchmark),
# and two simulated nodes over NET/Socket with mpirun (and torch). Writes a
# tarball of the results folder and the console outputs to $OUT.
#
#   OUT=/tmp/validate GPUVET_NCCL_SOURCE=path/to/nccl-tests.tar.gz [STEPS='preflight multi'] \
#     scripts/gpu-validate.sh
set -u
OUT=${OUT:-/tmp/gpuvet-validate}
mkdir -p "$OUT"
. "$(dirname "$0")/gpu-env.sh"
SRC=${GPUVET_NCCL_SOURCE:-}
suite() {  # $1 file, $2 max bytes
  { echo "nccl:"; echo "  max_bytes: $2"; echo "  timeout_s: 300"; echo "  build_timeout_s: 500"
    [ -n "$SRC" ] && { echo "  source:"; echo "    local_path: $SRC"; }; } > "$1"
}
suite /tmp/suite-single.yaml 4G
suite /tmp/suite-multi.yaml 128M
rm -rf /tmp/gpuvet-local
INV=inventories/h200x2-local.yaml
R=$OUT/results
step() { local name=$1; shift; local t0=$SECONDS
  python3 -m orchestrator "$@" > "$OUT/$name.txt" 2>&1; local rc=$?
  echo "$name rc=$rc $((SECONDS - t0)) s" | tee -a "$OUT/steps.txt"; }
STEPS=${STEPS:-preflight single multi cached}
nvidia-smi -L | tee "$OUT/gpus.txt"
for s in $STEPS; do case $s in
  preflight) step preflight preflight -i $INV --results "$R" -v ;;
  single) step nccl-single nccl -i $INV -p h200 --suite /tmp/suite-single.yaml --no-multi \
            --torch -v --results "$R" ;;
  multi) step nccl-multi nccl -i $INV -p h200-sim --suite /tmp/suite-multi.yaml --no-single \
           --torch -v --results "$R" ;;
  cached) step nccl-single-cached nccl -i $INV -p h200 --suite /tmp/suite-multi.yaml \
            --no-multi -v --results "$R" ;;
esac; done
tar czf "$OUT/results.tar.gz" -C "$OUT" results && rm -rf "$R"
tail -n 40 "$OUT"/nccl-*.txt | cut -c1-220
cat "$OUT/steps.txt"
