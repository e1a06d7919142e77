#!/usr/bin/env bash
# Runs on the GPU machine, from a bundle staged by scripts/gpu-stage.sh (see its header):
#   bash .gpu/env.sh bash scripts/gpu-run.sh 1    # CUDA runtime/ops, codegen, portable_handler, wgpu suites
#   bash .gpu/env.sh bash scripts/gpu-run.sh 2    # LLM, WaveSim, wgpu (after part 1 unpacked)
#   bash .gpu/env.sh bash scripts/gpu-run.sh llm  # the CUDA decode: tests, graph/program, trace, peer
#   bash .gpu/env.sh bash scripts/gpu-run.sh profile  # ncu stall reasons of the decode's kernels
#   bash .gpu/env.sh bash scripts/gpu-run.sh steps    # ncu time of every kernel of a decode step
# Every command has a time limit; its log goes to $OUT/<name>.txt and a summary to stdout.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.."
O=${OUT:-/tmp/gpu-run}
mkdir -p "$O"
T0=$(date +%s)
r() { # r LIMIT NAME CMD...: runs CMD with a time limit, prints its summary lines
  local lim=$1 name=$2 s rc
  shift 2
  s=$(date +%s)
  timeout "$lim" "$@" >"$O/$name.txt" 2>&1
  rc=$?
  echo "=== $name rc=$rc $(($(date +%s) - s))s"
  grep -E "test result|FAILED|panicked|^error" "$O/$name.txt" | head -12
}
for f in .gpu/tests/*.gz .gpu/bin/*.gz; do
  [ -e "$f" ] && gunzip -f "$f" && chmod +x "${f%.gz}"
done
CLI=.gpu/bin/ringkernel-cli-ringkernel
# Sets dir and m: the SmolLM2 model, joined from the two halves gpu-stage.sh's first
# calls keep in /tmp (m exists only when both arrived).
model() {
  dir=/tmp/ringkernel-llm
  m=$dir/model.gguf
  [ -f "$m" ] || { [ -f $dir/part-1 ] && [ -f $dir/part-2 ] && cat $dir/part-1 $dir/part-2 >"$m"; }
}

case "${1:-}" in
1)
  nvcc -O3 -arch=native -o /tmp/pingpong .gpu/pingpong.cu >/dev/null 2>&1 &
  nvcc -O3 -arch=native -o /tmp/wave_floor .gpu/wave_floor.cu >/dev/null 2>&1 &
  r 150 cuda-runtime .gpu/tests/ringkernel-cuda-runtime --include-ignored --test-threads 1
  r 60 cuda-lib .gpu/tests/ringkernel_cuda --include-ignored --test-threads 1
  r 60 cuda-smoke .gpu/tests/ringkernel-cuda-gpu_smoke --include-ignored --test-threads 1
  r 60 cuda-ops .gpu/tests/ringkernel-cuda-ops --include-ignored
  # 180 s: cuda_shared_memory_reduction_matches_cpu simulates its blocks with barriers on
  # the host for random sizes; it took 91 s on one machine (2026-11-28).
  r 180 codegen-cuda .gpu/tests/ringkernel-codegen-cuda --include-ignored
  for t in portable_handler gpu_struct_kernels gpu_kernel_grids; do
    r 60 "facade-$t" ".gpu/tests/ringkernel-$t" --include-ignored --test-threads 1
  done
  for n in 16 4 2; do
    for t in compute concurrent halo_exchange runtime; do
      r 120 "wgpu-$t-$n" ".gpu/tests/ringkernel-wgpu-$t" --include-ignored --test-threads $n
    done
  done
  wait
  RINGKERNEL_CUDA_PROFILE=65536 BENCH_K2K_PROFILE=1 BENCH_WATCHDOG_S=100 r 110 cuda-bench .gpu/bin/ringkernel-cuda-cuda_bench --only actors
  grep -v '^\[bench\]' "$O/cuda-bench.txt" | tail -40
  # K2K at scale: 128 senders on 4 blocks of 64 threads (32 serve the host's input in
  # each), 16 messages a call (rk_send_many_to), into a sink of 8 blocks that gives 480
  # of each block's 512 threads to its inbox (inbox_threads).
  BENCH_K2K_SINK_GRID=8 BENCH_K2K_SINK_INBOX=480 BENCH_K2K_SRC_BLOCK=64 BENCH_K2K_SRC_GRID=4 \
    BENCH_K2K_BATCH=16 BENCH_K2K_PER=20000 BENCH_WATCHDOG_S=60 r 70 cuda-k2k .gpu/bin/ringkernel-cuda-cuda_bench --only k2k
  grep -E "K2K|breakdown|retried" "$O/cuda-k2k.txt"
  timeout 30 /tmp/pingpong 30000 >"$O/pingpong.txt" 2>&1
  cat "$O/pingpong.txt"
  for b in cpu cuda wgpu; do
    timeout 30 .gpu/bin/ringkernel-portable_handler --backend $b >"$O/ph-$b.txt" 2>"$O/ph-$b.err"
    echo "=== portable_handler --backend $b rc=$?"
    grep -i error "$O/ph-$b.err" | head -3
  done
  for b in cuda wgpu; do
    if diff "$O/ph-cpu.txt" "$O/ph-$b.txt" >/dev/null; then
      echo "portable_handler: $b output == cpu output ($(wc -l <"$O/ph-$b.txt") lines)"
    else
      echo "portable_handler: $b output DIFFERS from cpu"
    fi
  done
  for b in cuda wgpu; do
    r 60 "decoder-layers-$b" .gpu/bin/ringkernel-decoder_layers --device $b
    tail -1 "$O/decoder-layers-$b.txt"
  done
  r 120 codegen-bench .gpu/bin/ringkernel-codegen_bench --backends cuda,wgpu --scale large --iters 200
  tail -14 "$O/codegen-bench.txt"
  ;;
2)
  model
  r 60 llm-synthetic .gpu/tests/ringkernel-llm-model_synthetic --include-ignored
  if [ -f "$m" ]; then
    export RINGKERNEL_LLM_MODEL=$m
    r 90 hf-reference python3 scripts/llm_hf_peer.py reference --model "$m" --device cuda --out "$O/generate_reference_transformers.txt"
    [ -s "$O/generate_reference_transformers.txt" ] && cp "$O/generate_reference_transformers.txt" crates/ringkernel-llm/tests/fixtures/
    r 90 llm-reference .gpu/tests/ringkernel-llm-generate_reference --include-ignored --nocapture
    r 60 llm-bench-cuda $CLI bench llm --device cuda --model "$m" --prompt-tokens 128 --new-tokens 256 --runs 5
    tail -1 "$O/llm-bench-cuda.txt"
    r 60 llm-bench-cuda-no-overlap $CLI bench llm --device cuda --model "$m" --prompt-tokens 128 --new-tokens 256 --runs 3 --no-overlap
    tail -1 "$O/llm-bench-cuda-no-overlap.txt"
    r 60 llm-bench-cuda-one-step $CLI bench llm --device cuda --model "$m" --prompt-tokens 128 --new-tokens 256 --runs 3 --steps-per-replay 1
    tail -1 "$O/llm-bench-cuda-one-step.txt"
    r 120 hf-bench python3 scripts/llm_hf_peer.py bench --model "$m" --device cuda --dtypes float32,bfloat16
    tail -2 "$O/hf-bench.txt"
    r 60 llm-bench-wgpu $CLI bench llm --device wgpu --model "$m" --prompt-tokens 128 --new-tokens 128 --runs 2
    tail -1 "$O/llm-bench-wgpu.txt"
  else
    echo "no model in $dir: the LLM runs are skipped (calls 1 and 2 of gpu-stage.sh keep it there)"
  fi
  r 60 wavesim-cuda .gpu/tests/ringkernel-wavesim-cuda --include-ignored
  r 60 wavesim-backends .gpu/tests/ringkernel-wavesim-backends --include-ignored
  r 150 wavesim-bench $CLI wavesim bench --torch --gpu cuda,wgpu --sizes 256 512 1024 4096 --no-numpy
  tail -34 "$O/wavesim-bench.txt"
  [ -x /tmp/wave_floor ] && timeout 40 /tmp/wave_floor >"$O/wave-floor.txt" 2>&1 && cat "$O/wave-floor.txt"
  r 60 wgpu-bench .gpu/bin/ringkernel-wgpu-wgpu_bench --msgs 2000000
  tail -24 "$O/wgpu-bench.txt"
  ;;
llm)
  # The CUDA decode alone: tests (the ops and the reference also with the one-block-a-head
  # attention, RINGKERNEL_CUDA_ATTN_SPLIT=0), then the bench with the step recorded as a
  # CUDA graph (the default, greedy token taken on the device) alternating with the
  # argmax on the host (--host-argmax) and with early loads off (RINGKERNEL_CUDA_EARLY=0),
  # three rounds; the graph without programmatic dependent launch (RINGKERNEL_CUDA_PDL=0)
  # and with the one-block attention, the step as a program (RINGKERNEL_CUDA_PROGRAM=1), a run
  # with the program's per-instruction device timer, scripts/grid_barrier.cu, and the
  # transformers peer (LLM_PEER=0 leaves it out).
  model
  [ -f "$m" ] || { echo "no model in $dir (calls 1 and 2 of gpu-stage.sh keep it there)"; exit 1; }
  export RINGKERNEL_LLM_MODEL=$m
  nvcc -O3 -arch=native -o /tmp/grid_barrier scripts/grid_barrier.cu >"$O/grid-barrier-build.txt" 2>&1 &
  r 60 cuda-ops .gpu/tests/ringkernel-cuda-ops --include-ignored
  RINGKERNEL_CUDA_ATTN_SPLIT=0 r 60 cuda-ops-one-block .gpu/tests/ringkernel-cuda-ops --include-ignored
  r 60 llm-synthetic .gpu/tests/ringkernel-llm-model_synthetic --include-ignored
  r 90 llm-reference .gpu/tests/ringkernel-llm-generate_reference --include-ignored --nocapture
  RINGKERNEL_CUDA_ATTN_SPLIT=0 r 90 llm-reference-one-block .gpu/tests/ringkernel-llm-generate_reference --include-ignored
  bench() { # bench NAME [VAR=VALUE...] [--flag...]: one decode bench (3 runs) with those switches
    local name=$1 vars=() flags=()
    shift
    for a in "$@"; do case $a in --*) flags+=("$a") ;; *) vars+=("$a") ;; esac; done
    env "${vars[@]}" timeout 60 $CLI bench llm --device cuda --model "$m" --prompt-tokens 128 --new-tokens 256 --runs 3 "${flags[@]}" >"$O/llm-bench-$name.txt" 2>&1
    echo "$name ($*): $(tail -1 "$O/llm-bench-$name.txt")"
    grep -h "device step" "$O/llm-bench-$name.txt" | tail -1 | sed 's/^.*tokens\/s; /  /'
  }
  for round in 1 2 3; do
    bench graph-$round RINGKERNEL_CUDA_PROGRAM=0
    bench graph-host-argmax-$round RINGKERNEL_CUDA_PROGRAM=0 --host-argmax
    bench graph-no-overlap-$round RINGKERNEL_CUDA_PROGRAM=0 --no-overlap
    bench graph-no-early-$round RINGKERNEL_CUDA_PROGRAM=0 RINGKERNEL_CUDA_EARLY=0
    bench graph-one-step-$round RINGKERNEL_CUDA_PROGRAM=0 --steps-per-replay=1
    bench graph-feed-ops-$round RINGKERNEL_CUDA_PROGRAM=0 RINGKERNEL_CUDA_FUSED_FEED=0
  done
  bench graph-no-chain RINGKERNEL_CUDA_PROGRAM=0 RINGKERNEL_CUDA_FUSED_CHAIN=0
  bench graph-no-wo RINGKERNEL_CUDA_PROGRAM=0 RINGKERNEL_CUDA_FUSED_WO=0
  bench graph-unfused RINGKERNEL_CUDA_PROGRAM=0 RINGKERNEL_CUDA_FUSED_FFN=0
  bench graph-no-pdl RINGKERNEL_CUDA_PROGRAM=0 RINGKERNEL_CUDA_PDL=0
  bench graph-one-block RINGKERNEL_CUDA_PROGRAM=0 RINGKERNEL_CUDA_ATTN_SPLIT=0
  # (the program has no argmax instruction: a step with it records as a graph)
  bench program RINGKERNEL_CUDA_PROGRAM=1 --host-argmax
  env RINGKERNEL_CUDA_PROGRAM=1 RINGKERNEL_CUDA_PROGRAM_TRACE=1 timeout 60 $CLI bench llm --device cuda --model "$m" --prompt-tokens 128 --new-tokens 256 --runs 1 --host-argmax >"$O/llm-trace.txt" 2>&1
  grep -A 12 "rk_program trace" "$O/llm-trace.txt" | head -14
  wait
  [ -x /tmp/grid_barrier ] && timeout 60 /tmp/grid_barrier >"$O/grid-barrier.txt" 2>&1
  cat "$O/grid-barrier.txt" "$O/grid-barrier-build.txt" 2>/dev/null | head -12
  if [ "${LLM_PEER:-1}" != 0 ]; then
    r 120 hf-bench python3 scripts/llm_hf_peer.py bench --model "$m" --device cuda --dtypes float32,bfloat16
    tail -2 "$O/hf-bench.txt"
  fi
  ;;
steps)
  # Where a decode step's device time goes: ncu's duration of every kernel of two decode
  # steps near position 260 (graph path, kernels 20,000-20,303 of the bench's warm-up
  # run), summed by kernel. ncu runs kernels one at a time, caches and clocks left as
  # they are: the early loads' overlap with the kernel ahead is not in these figures.
  model
  [ -f "$m" ] || { echo "no model in $dir (calls 1 and 2 of gpu-stage.sh keep it there)"; exit 1; }
  timeout 300 ncu --cache-control none --clock-control none --metrics gpu__time_duration.sum \
    --launch-skip 20000 --launch-count 304 --csv \
    $CLI bench llm --device cuda --model "$m" --prompt-tokens 128 --new-tokens 200 --runs 1 >"$O/ncu-steps.csv" 2>&1
  python3 - "$O/ncu-steps.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head = rows[0]
name, unit, value = head.index("Kernel Name"), head.index("Metric Unit"), head.index("Metric Value")
tot = collections.defaultdict(lambda: [0, 0.0])
for r in rows[1:]:
    v = float(r[value].replace(",", ""))
    u = r[unit]
    v = v / 1000 if u in ("ns", "nsecond") else v * 1000 if u in ("ms", "msecond") else v
    t = tot[r[name].split("(")[0]]
    t[0] += 1
    t[1] += v
all_us = sum(t[1] for t in tot.values())
print(f"ncu, {sum(t[0] for t in tot.values())} kernels, {all_us / 2:.1f} us of kernel time a step")
for k, (n, us) in sorted(tot.items(), key=lambda kv: -kv[1][1]):
    print(f"  {k:40s} x{n // 2:<4d} {us / n:7.2f} us each, {us / 2:7.1f} us a step ({100 * us / all_us:4.1f}%)")
PY
  ;;
profile)
  # Why the decode's kernels take what they take: ncu's warp-state (stall reasons),
  # scheduler and memory sections for one launch each of the attention kernel and the
  # norm + QKV matvec during a decode step near position 300 (graph path).
  model
  [ -f "$m" ] || { echo "no model in $dir (calls 1 and 2 of gpu-stage.sh keep it there)"; exit 1; }
  for k in rk_rope_attention_kv rk_qmatmul_norm_q4_1 rk_qmatmul_q4_1; do
    timeout 200 ncu --kernel-name "$k" --launch-skip 150 --launch-count 1 \
      --section LaunchStats --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
      $CLI bench llm --device cuda --model "$m" --prompt-tokens 128 --new-tokens 200 --runs 1 >"$O/ncu-$k.txt" 2>&1
    echo "=== $k"
    grep -E "Duration|Stall|Warp Cycles|Issued Warp|Eligible|Active Warps|Registers|Memory Throughput|L2 Hit|L1/TEX Hit" "$O/ncu-$k.txt" | head -30
  done
  ;;
*)
  echo "usage: scripts/gpu-run.sh 1|2|llm|steps|profile" >&2
  exit 2
  ;;
esac
echo "part ${1} took $(($(date +%s) - T0)) s"
