# Sourced by the scripts/gpu-*.sh that run gpuvet on a GPU host (see KINDS.md on the host):
# NVLink multicast off, unbuffered and wide output, the controller's packages from carried
# wheels (.whl) where the host's Python lacks them, and `stamp`, which prefixes each line
# of its input with the time it came. $PY is the controller's Python (default python3).
PY=${PY:-python3}
export NCCL_NVLS_ENABLE=0 NCCL_MNNVL_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
  NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 COLUMNS=200
if [ -d .whl ] && ! "$PY" -c 'import pydantic, ruamel.yaml, click' 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
fi
stamp() { while IFS= read -r line; do printf '%s %s\n' "$EPOCHREALTIME" "$line"; done; }
