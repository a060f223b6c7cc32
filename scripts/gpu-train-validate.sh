#!/usr/bin/env bash
# The training step on a 2-GPU host with the local executor (inventories/h200x2-local.yaml):
# the ~1B preset, bf16, torch.compile, deterministic verification; the whole protocol
# (reference, checkpoint at step K, SIGKILL before the manifest of a second save,
# restore, bit-for-bit check) on
#   host: the 2-GPU node (DDP over NVLink), restored on itself;
#   one:  a one-GPU host as one node (kind nvidia-h200), restored on itself; its
#         checkpoints are kept until the script has timed hashing the step-K checkpoint
#         on one thread and on the payload's IO_THREADS (hash.txt), then removed;
#   sim:  two simulated 1-GPU nodes (CUDA_VISIBLE_DEVICES + NCCL_HOSTID, so NCCL talks
#         over NET/Socket), sharing one checkpoint directory: each node's checkpoint is
#         restored on the other, and the multi-node run resumes with its ranks swapped.
#         Killed after step K+2 rather than inside a second save: a 1B checkpoint is 12 GB
#         (fp32 weights and AdamW moments) and two nodes writing two each would fill a
#         64 GB disk; the host run covers the half-written checkpoint.
# Prints one table row per unit and copies the run folders (rank logs, torchrun output,
# dmon) to $OUT.
#
#   OUT=/tmp/train-validate [STEPS='host sim'] [SUITE=path.yaml] scripts/gpu-train-validate.sh
set -u
OUT=${OUT:-/tmp/gpuvet-train-validate}
mkdir -p "$OUT"
. "$(dirname "$0")/gpu-env.sh"
SUITE=${SUITE:-$OUT/suite-1b.yaml}
if [ ! -f "$SUITE" ]; then
  cat > "$SUITE" <<'EOF'
name: train-1b-h200
train:
  model: 1b            # d=2048, 18 layers, seq 2048, micro-batch 8: 1.01B parameters
  steps: 20
  ckpt_step: 8
  kill: before-manifest
  kill_offset: 2
  dtype: bf16
  compile: true
  deterministic: true
  stats_skip_steps: 3
  timeout_s: 540
EOF
fi
SIM_SUITE=$OUT/suite-1b-sim.yaml
sed 's/^  kill: .*/  kill: after-step/; s/^name: .*/name: train-1b-h200-sim/' "$SUITE" > "$SIM_SUITE"
rm -rf /tmp/gpuvet-local
INV=inventories/h200x2-local.yaml
# the simulated nodes, given one checkpoint directory both see
SIM_INV=$OUT/h200x2-sim-shared.yaml
python3 - "$INV" "$SIM_INV" <<'EOF'
import sys
from ruamel.yaml import YAML
yaml = YAML()
doc = yaml.load(open(sys.argv[1]))
for n in doc["providers"]["h200-sim"]["nodes"]:
    n["ckpt_dir"] = "/tmp/gpuvet-local/sim-shared-ckpt"
yaml.dump(doc, open(sys.argv[2], "w"))
EOF
R=$OUT/results
step() { local name=$1; shift; local t0=$SECONDS
  python3 -m orchestrator train "$@" --results "$R" --json \
    > "$OUT/$name.json" 2> >(stamp > "$OUT/$name.stderr"); local rc=$?
  echo "$name rc=$rc wall=$((SECONDS - t0)) s" | tee -a "$OUT/steps.txt"; }
nvidia-smi -L | tee "$OUT/gpus.txt"
python3 -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version())' \
  | tee "$OUT/torch.txt"
: > "$OUT/steps.txt"
for s in ${STEPS:-host sim}; do case $s in
  host) step train-host -i "$INV" -p h200 --suite "$SUITE" ;;
  sim) step train-sim -i "$SIM_INV" -p h200-sim --suite "$SIM_SUITE" ;;
  one) ONE_SUITE=$OUT/suite-1b-one.yaml
    sed 's/^name: .*/name: train-1b-h200-one/' "$SUITE" > "$ONE_SUITE"
    echo "  keep_checkpoints: true" >> "$ONE_SUITE"
    step train-one -i inventories/h200-local.yaml -p h200-one --suite "$ONE_SUITE"
    ck=$(ls -d /tmp/gpuvet-local/one/ckpt/gpuvet-train/*/*/step-* | head -1)  # step K: the first
    python3 - "$ck" <<'EOF' | tee "$OUT/hash.txt"
import sys, time
from payload.train import ckpt
path = sys.argv[1]
names = ckpt.data_files(path)
for threads in (1, ckpt.IO_THREADS):
    t0 = time.time()
    got = ckpt.hash_share(path, names, 0, 1, threads=threads)
    dt = time.time() - t0
    gb = sum(r["bytes"] for r in got.values()) / 1e9
    print(f"hash {len(names)} files, {gb:.2f} GB, {threads} thread(s): {dt:.2f} s ({gb / dt:.2f} GB/s)")
EOF
    rm -rf /tmp/gpuvet-local/one/ckpt ;;
esac; done
python3 - "$OUT" <<'EOF'
import json, pathlib, statistics, sys
out = pathlib.Path(sys.argv[1])
walls = dict(l.split(" ", 1)[0:1] + [l.rsplit("wall=", 1)[1].strip()]
             for l in (out / "steps.txt").read_text().splitlines() if "wall=" in l)
cols = ["unit", "step s", "p90 s", "tok/s/GPU", "MFU", "det step s", "det MFU", "peak alloc GB", "ckpt GB", "save s",
        "load s", "restart s", "lost", "restore", "step wall"]
print(" | ".join(cols))
for name in ("train-host", "train-sim", "train-one"):
    f = out / f"{name}.json"
    if not f.is_file() or not f.read_text().strip():
        continue
    run = pathlib.Path(json.loads(f.read_text())["results"])
    ms = [json.loads(l) for l in (run / "measurements.jsonl").read_text().splitlines()]
    fs = [json.loads(l) for l in (run / "findings.jsonl").read_text().splitlines()]
    for nodes in sorted({tuple(m["nodes"]) for m in ms}):
        mine = [m for m in ms if tuple(m["nodes"]) == nodes]
        def v(metric, scale=1.0, fmt="{:.3g}", agg=max):
            vals = [m["value"] for m in mine if m["metric"] == metric]
            return fmt.format(agg(vals) / scale) if vals else "-"
        subj = nodes[0] if len(nodes) == 1 else None
        verdict = [x for x in fs if x["code"].startswith("TRAIN_RESTORE") and
                   (x["node"] == subj)]
        print(" | ".join([
            "+".join(nodes), v("step_time_s"), v("step_time_p90_s"),
            v("tokens_per_s_per_gpu", fmt="{:,.0f}"), v("mfu", fmt="{:.1%}", scale=1),
            v("deterministic_step_time_s"), v("deterministic_mfu", fmt="{:.1%}", scale=1),
            v("peak_mem_allocated_bytes", 1e9), v("ckpt_size_bytes", 1e9), v("ckpt_save_s"),
            v("ckpt_load_s"), v("restart_s"), v("steps_lost", fmt="{:.0f}"),
            ",".join(f"{x['code']}:{x['severity']}" for x in verdict) or "-",
            walls.get(name, "?")]))
    for m in ms:
        if m["metric"] == "restart_s":  # where the relaunch's seconds went
            print("  restart", "+".join(m["nodes"]), f"{m['value']:.1f} s:", ", ".join(
                f"{k} {v:.2f}" for k, v in m["tags"].items() if isinstance(v, (int, float))))
    bad = [x for x in fs if x["severity"] in ("FAIL", "WARN")]
    for x in bad:
        print(f"  {x['severity']} {x['code']} {x.get('node') or 'provider'}: {x['message'][:300]}")
EOF
tar czf "$OUT/results.tar.gz" -C "$OUT" results && rm -rf "$R"
cat "$OUT/steps.txt"
