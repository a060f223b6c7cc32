#!/usr/bin/env bash
# The whole pipeline on a one-GPU host with the local executor: preflight, nccl-tests
# (built from a source archive the controller pushes: the host has no network), the
# training step (the 1b preset, bf16, compiled, the full protocol) and regress, in one run;
# then the same pipeline interrupted with SIGINT while it trains, to see the run marked
# interrupted, exit 130, the lock released and no process left behind, and that run
# finished with `gpuvet pipeline --resume` (the training unit's first attempt left on the
# node must not be read by the second).
#
#   OUT=/tmp/pv NCCL_SOURCE=.snapshots/nccl-tests.tar.gz [STEPS='full interrupt'] \
#     scripts/gpu-pipeline-validate.sh
# (a dry run without a GPU: PY=.venv/bin/python NODE_PYTHON=$PWD/.venv/bin/python MODEL=tiny)
set -u
OUT=${OUT:-/tmp/gpuvet-pipeline-validate}
mkdir -p "$OUT"
. "$(dirname "$0")/gpu-env.sh"
rm -rf /tmp/gpuvet-local
INV=inventories/h200-local.yaml SUITE=$OUT/suite-pipeline.yaml R=$OUT/results
if [ -n "${NODE_PYTHON:-}" ]; then
  sed "s#^        work_dir: #        python: $NODE_PYTHON\n&#" "$INV" > "$OUT/one.yaml"
  INV=$OUT/one.yaml
fi
cat > "$SUITE" <<YAML
name: pipeline-1b-h200
nccl:
  max_bytes: 128M
  build_timeout_s: 500
  source: {local_path: $(realpath "${NCCL_SOURCE:-.snapshots/nccl-tests.tar.gz}")}
train:
  model: ${MODEL:-1b}
  steps: 20
  ckpt_step: 8
  kill: before-manifest
  kill_offset: 2
  timeout_s: 540
YAML
nvidia-smi -L | tee "$OUT/gpus.txt"
t0=$SECONDS
runs() { ls -d "$R"/2* 2>/dev/null | wc -l; }
if [[ " ${STEPS:-full interrupt} " == *" full "* ]]; then
  "$PY" -m orchestrator pipeline -i "$INV" --suite "$SUITE" --results "$R" -v --json \
    > "$OUT/pipeline.json" 2> >(stamp > "$OUT/pipeline.stderr")
  echo "pipeline rc=$? wall=$((SECONDS - t0)) s" | tee "$OUT/steps.txt"
fi
[[ " ${STEPS:-full interrupt} " == *" interrupt "* ]] || exit 0
# the same again, interrupted (SIGINT, as Ctrl-C sends) while it trains; job control on,
# or the shell would start the background job with SIGINT ignored
before=$(runs)
set -m
"$PY" -m orchestrator pipeline -i "$INV" --suite "$SUITE" --results "$R" \
  > "$OUT/interrupted.txt" 2>&1 &
pid=$!
set +m
for _ in $(seq 1 400); do  # until the new run's reference has logged a step
  if [ "$(runs)" -gt "$before" ]; then
    id=$(basename "$(ls -d "$R"/2* | sort | tail -1)")
    grep -qs '"event": "step"' /tmp/gpuvet-local/one/work/train-runs/"$id"/*/reference/rank0.jsonl \
      && break
  fi
  sleep 0.5
done
kill -INT $pid; t1=$SECONDS; wait $pid
echo "interrupted rc=$? $((SECONDS - t1)) s after the SIGINT" | tee -a "$OUT/steps.txt"
left() { pgrep -fa 'payload train|torch.distributed.run|all_reduce_perf|nvidia-smi dmon' \
  | grep -v pgrep; }
for _ in $(seq 1 20); do [ -z "$(left)" ] && break; sleep 0.5; done
echo "left behind after $((SECONDS - t1)) s: $(left | wc -l) process(es)" | tee -a "$OUT/steps.txt"
left | cut -c1-200 | tee -a "$OUT/steps.txt"
"$PY" - "$R" <<'PY' | tee -a "$OUT/steps.txt"
import json, pathlib, sys
for run in sorted(pathlib.Path(sys.argv[1]).glob("2*")):
    meta = json.loads((run / "run.json").read_text())
    fs = [json.loads(l) for l in (run / "findings.jsonl").read_text().splitlines()] \
        if (run / "findings.jsonl").is_file() else []
    bad = [f"{f['severity']} {f['code']}" for f in fs if f["severity"] in ("FAIL", "WARN")]
    print(run.name, meta["status"], meta.get("started"), meta.get("finished"),
          "lock" if (run / ".lock").exists() and (run / ".lock").stat().st_size else "",
          sorted(set(bad)))
PY
ls -la "$R" | head; [ -s "$R/pipeline.lock" ] && echo "pipeline.lock: $(cat "$R/pipeline.lock")"
if [ -n "${id:-}" ]; then
  t1=$SECONDS
  "$PY" -m orchestrator pipeline -i "$INV" --suite "$SUITE" --results "$R" --resume "$id" \
    -v --json > "$OUT/resumed.json" 2> >(stamp > "$OUT/resumed.stderr")
  echo "resumed $id rc=$? wall=$((SECONDS - t1)) s" | tee -a "$OUT/steps.txt"
  "$PY" - "$OUT/resumed.json" <<'PY' | tee -a "$OUT/steps.txt"
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as exc:  # the resume's own error is in resumed.stderr
    print("resumed.json unreadable:", exc)
    raise SystemExit(0)
print("resumed:", d.get("status"), d.get("verdict"), d.get("steps"))
for f in d.get("findings", []):
    if f["severity"] in ("FAIL", "WARN") or f["code"].startswith("TRAIN_RESTORE"):
        print(" ", f["severity"], f["code"], (f.get("message") or "")[:150])
PY
fi
"$PY" -m orchestrator pipeline -i "$INV" --suite "$SUITE" --results "$R" --no-train \
  > "$OUT/third.txt" 2>&1
echo "a third pipeline (--no-train) rc=$? (2 would be the lock still held)" | tee -a "$OUT/steps.txt"
tar czf "$OUT/results.tar.gz" -C "$OUT" results $(cd "$OUT" && ls pipeline.json \
  pipeline.stderr interrupted.txt third.txt resumed.json resumed.stderr 2>/dev/null)
