#!/usr/bin/env bash
# Issue 16, part 1 (several GPUs of one host) on a machine with 2+ NVIDIA GPUs, from a
# bundle made here (see DEVELOPERS.md "GPU tests"):
#
#   GPU_BUNDLE_BUILD="-p ringkernel-cuda -p ringkernel --features ringkernel/cuda \
#     --example multi_gpu --example multi_gpu_bench --example multi_gpu_tensors" \
#     ../shared/tools/gpu-bundle.sh -p ringkernel-cuda
#
# then on the device machine (the device tool's run, carry [".gpu"]):
#
#   bash .gpu/env.sh bash scripts/multigpu.sh [--quick] [--no-regression]
#
# Runs the multi-GPU tests, the examples, the benchmark and its PyTorch peer
# (scripts/multigpu_torch_allreduce.py), and by default the single-GPU CUDA tests of the
# persistent kernel too (this work changed its route publishing and launch parameters);
# prints one summary. NVLink multicast stays off in everything it starts
# (NCCL_NVLS_ENABLE=0). libnccl comes from PyTorch's wheel (nvidia-nccl-cu13), linked as
# libnccl.so, the name cudarc opens. Files back in $OUT (when set): multigpu.log (every
# step's output), rk_allreduce.json, torch_allreduce.json, summary.txt.
set -u
cd "$(dirname "$0")/.."

export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# The multi-GPU tests fail instead of printing SKIPPED when fewer than 2 GPUs or no NCCL.
export RINGKERNEL_REQUIRE_GPUS=2
export PYTHONUNBUFFERED=1

quick=""
regression=1
for a in "$@"; do
  case "$a" in
    --quick) quick=--quick ;;
    --no-regression) regression=0 ;;
    *) echo "unknown argument $a" >&2; exit 2 ;;
  esac
done

work=$(mktemp -d /tmp/rk-multigpu.XXXXXX)
out=${OUT:-$work}
mkdir -p "$out"
summary=()
failed=0

# libnccl from PyTorch's wheel.
lib=$(python3 - <<'EOF'
import glob, os, site, sys
dirs = list(site.getsitepackages())
try:
    import torch
    dirs.append(os.path.dirname(os.path.dirname(torch.__file__)))
except Exception:
    pass
for d in dirs:
    for p in sorted(glob.glob(os.path.join(d, "nvidia", "nccl", "lib", "libnccl.so*"))):
        print(p)
        sys.exit(0)
EOF
)
if [ -n "$lib" ]; then
  mkdir -p "$work/nccl"
  ln -sf "$lib" "$work/nccl/libnccl.so"
  export LD_LIBRARY_PATH="$work/nccl:$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "libnccl: $lib (linked as $work/nccl/libnccl.so)"
else
  echo "libnccl: not found under python3's site-packages: the NCCL steps will fail"
fi
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
nvidia-smi topo -m 2>/dev/null | head -8

# step NAME LIMIT_S CMD...: runs CMD with a time limit, logs it, records the outcome.
step() {
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  echo
  echo "=== $name: $*"
  if [ ! -x "$1" ] && ! command -v "$1" >/dev/null 2>&1; then
    summary+=("$(printf '%-34s MISSING (%s not in the bundle)' "$name" "$1")")
    failed=1
    return
  fi
  timeout -k 10 "$limit" "$@" 2>&1 | tee "$work/$name.log"
  local rc=${PIPESTATUS[0]}
  local what="ok"
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    what="TIMEOUT after ${limit}s"
  elif [ "$rc" != 0 ]; then
    what="FAILED (exit $rc)"
  elif grep -q "SKIPPED" "$work/$name.log"; then
    what="SKIPPED (see the log)" # this machine is meant to run everything
  fi
  [ "$what" = ok ] || failed=1
  summary+=("$(printf '%-34s %-22s %4ds' "$name" "$what" $((SECONDS - t0)))")
}

step several_gpus_tests 300 .gpu/tests/ringkernel-cuda-several_gpus --include-ignored --test-threads=1
step multi_gpu_example 180 .gpu/bin/ringkernel-cuda-multi_gpu
step multi_gpu_tensors_example 180 .gpu/bin/ringkernel-multi_gpu_tensors
step multi_gpu_bench 400 .gpu/bin/ringkernel-cuda-multi_gpu_bench $quick --json "$work/rk_allreduce.json"
step torch_allreduce 300 python3 scripts/multigpu_torch_allreduce.py --gpus 2 $quick --json "$work/torch_allreduce.json"
if [ "$regression" = 1 ]; then
  step cuda_layout_and_smoke 180 .gpu/tests/ringkernel-cuda-gpu_smoke --include-ignored --test-threads=1
  step cuda_lib 180 .gpu/tests/ringkernel_cuda --include-ignored --test-threads=1
  step cuda_runtime 420 .gpu/tests/ringkernel-cuda-runtime --include-ignored --test-threads=1
fi

echo
echo "=== all_reduce, RingKernel (NcclGroup, one process) vs PyTorch (torch.distributed, one process per GPU)"
python3 - "$work/rk_allreduce.json" "$work/torch_allreduce.json" <<'EOF' | tee "$work/ratio.txt"
import json, sys
try:
    rk = json.load(open(sys.argv[1]))
    pt = json.load(open(sys.argv[2]))
except Exception as e:
    print(f"no comparison: {e}")
    sys.exit(0)
peer = {r["bytes"]: r for r in pt["all_reduce"]}
print(f"NCCL {rk.get('nccl_version')} (ours) / {pt.get('nccl_version')} (torch {pt.get('torch')})")
for r in rk["all_reduce"]:
    p = peer.get(r["bytes"])
    if not p:
        continue
    ratio = r["busbw_gbs"] / p["busbw_gbs"]
    verdict = ""
    if r["bytes"] == 1 << 30:
        verdict = "  target >= 0.90: " + ("met" if ratio >= 0.9 else "MISSED")
    print(f"{r['bytes'] >> 20:>5} MiB: ours {r['busbw_gbs']:7.1f} GB/s, torch {p['busbw_gbs']:7.1f} GB/s busbw: {ratio:.3f}x{verdict}")
for k in rk.get("k2k", []):
    print(f"K2K {k['pair']:<28} one-way {k['one_way_us']:.2f} us, {k['msgs_per_s'] / 1e6:.2f} M msgs/s")
EOF

{
  echo "=== summary (issue 16, several GPUs)"
  printf '%s\n' "${summary[@]}"
  cat "$work/ratio.txt" 2>/dev/null
} | tee "$work/summary.txt"

if [ "$out" != "$work" ]; then
  cat "$work"/*.log >"$out/multigpu.log" 2>/dev/null
  for f in rk_allreduce.json torch_allreduce.json summary.txt; do
    [ -f "$work/$f" ] && cp "$work/$f" "$out/$f"
  done
fi
exit $failed
