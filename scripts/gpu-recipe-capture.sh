#!/usr/bin/env bash
# Run the acceptance recipe (../shared/RECIPE.md, "Commands and the files they write") on a
# GPU host, command for command, saving each output under the file name a user would pick,
# as tests/fixtures/recipe-h200x1/ was made. Beyond the recipe it saves what people also
# save: `--format=csv,noheader,nounits`, the `sed -n '/MIG Mode/,+2p'` form of the MIG
# check, /proc/mounts and the build log; and, with EXTRAS=1, every other collective at
# -g 1 and an all_reduce with `-d all -o all` (tests/fixtures/recipe-h200x1-extras/).
# The folder and a tarball of it land in $OUT.
#
#   OUT=/tmp/recipe NCCL_TESTS=path/to/nccl-tests-checkout-or-bundle [EXTRAS=1] \
#     scripts/gpu-recipe-capture.sh
set -u
OUT=${OUT:-/tmp/gpuvet-recipe}
P=$OUT/poc
SRC=${NCCL_TESTS:-https://github.com/NVIDIA/nccl-tests.git}
mkdir -p "$P" && cd "$P" || exit 1
{
date -Iseconds | tee checked-at.txt
uname -a | tee kernel.txt
nvidia-smi | tee nvidia-smi.txt
nvidia-smi --version | tee nvidia-smi-version.txt
if command -v nvcc >/dev/null 2>&1; then nvcc --version | tee nvcc-version.txt; fi
nvidia-smi --query-gpu=index,name,uuid,memory.total,power.limit,driver_version --format=csv \
  | tee gpus.csv
nvidia-smi --query-gpu=index,name,uuid,memory.total,power.limit,driver_version \
  --format=csv,noheader,nounits | tee gpus-noheader.csv
nvidia-smi -L | tee gpu-list.txt
nvidia-smi -q | sed -n '/MIG Mode/,3p' | tee mig.txt
nvidia-smi -q | sed -n '/MIG Mode/,+2p' | tee mig-plus2.txt
nvidia-smi topo -m | tee topo.txt
nvidia-smi topo -p2p n | tee p2p.txt
python3 - <<'PY' | tee torch.txt
import torch
print("torch_version:", torch.__version__)
print("torch_cuda:", torch.version.cuda)
print("cuda_available:", torch.cuda.is_available())
print("device_count:", torch.cuda.device_count())
for index in range(torch.cuda.device_count()):
    props = torch.cuda.get_device_properties(index)
    print({"index": index, "name": props.name,
           "memory_gib": round(props.total_memory / 1024**3, 2),
           "compute_capability": torch.cuda.get_device_capability(index)})
PY
cat /proc/mounts > mounts.txt
git clone --depth 1 "$SRC" nccl-tests && cd nccl-tests || exit 1
git rev-parse HEAD | tee commit.txt
make -j"$(nproc)" CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}" > make-plain.log 2>&1
echo "plain make rc=$?" | tee -a make-plain.log
GPU_COUNT=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l | tr -d ' ')
for round in 1 2 3; do
  NCCL_DEBUG=WARN ./build/all_reduce_perf -b 8 -e 128M -f 2 -g "${GPU_COUNT}" \
    | tee all-reduce-${round}.log
done
if [ "${EXTRAS:-0}" = 1 ]; then
  for c in all_gather reduce_scatter alltoall broadcast reduce sendrecv hypercube; do
    [ -x build/${c}_perf ] && NCCL_DEBUG=WARN ./build/${c}_perf -b 8 -e 1M -f 4 -g 1 \
      > ../coll-${c}.log 2>&1
  done
  ./build/all_reduce_perf -b 1M -e 4M -f 2 -g 1 -d all -o all > ../all-reduce-dall-oall.log 2>&1
fi
cd ..
# the recipe's monitor, sampled while a matmul loads the GPU (the recipe runs it beside the task)
( python3 -c "
import time, torch
x = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)
t = time.time()
while time.time() - t < 8:
    x @ x
torch.cuda.synchronize()" & nvidia-smi dmon -s pucvmet -d 1 -c 8 | tee dmon.txt; wait )
} > "$OUT/recipe-console.txt" 2>&1
# the nccl-tests checkout itself stays out of the tarball: only what the recipe wrote
tar czf "$OUT/recipe.tar.gz" -C "$OUT" --exclude='poc/nccl-tests/.git' \
  --exclude='poc/nccl-tests/build' --exclude='poc/nccl-tests/src' poc recipe-console.txt
