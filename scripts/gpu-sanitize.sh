#!/usr/bin/env bash
# Runs the CUDA test binaries under NVIDIA compute-sanitizer (memcheck, racecheck,
# synccheck) on a machine with a GPU, and prints a per-test summary.
#
# Usage (on the GPU machine; the test binaries are built elsewhere and staged with
# ../shared/tools/gpu-bundle.sh -p ringkernel-cuda, which names them
# ringkernel-cuda-<test>):
#
#   scripts/gpu-sanitize.sh [BUNDLE_DIR] [LOG_DIR]     # defaults: .gpu/tests, ./sanitize-logs
#
# What runs:
# * the ops tests (`ringkernel-cuda-ops`: one launch per op) under all three tools;
# * every runtime test (`ringkernel-cuda-runtime`, and the unit tests of the crate's
#   library, `ringkernel_cuda`) one at a time under each tool, with a time limit.
#
# compute-sanitizer instruments every memory access, so a persistent kernel runs far
# slower under it; a test that does not finish within the limit is reported as TIMEOUT,
# separately from failures. Each result is printed as it comes (tool, ok / FAILED /
# TIMEOUT / NO-GPU, binary and test, the sanitizer's error count and, for racecheck, its
# warnings: potential hazards it does not count as errors), then a count per tool and
# outcome.
#
# A test that makes no CUDA call (a host-only unit test) is reported as NO-GPU: the tool
# exits with "terminated before first instrumented API call", which is not a finding.
#
# First, scripts/sanitizer_probe.cu (built with nvcc where there is one) checks three
# shapes RingKernel's tests have on plain CUDA, without the tool and under memcheck:
# memory allocated after a running kernel's launch (memcheck reports the kernel's reads
# of it out of bounds: what the K2K tests showed while each kernel's inbox was allocated at
# its launch; the runtime now takes every inbox from a pool allocated when it opens), a
# kernel waiting for a second one (it finishes under memcheck too: two live kernels
# alone do not stall the tool), and a kernel ending while another runs on (below).
#
# A test that ends one persistent kernel while another keeps running (most tests with
# two kernels: lifecycle, K2K, pub/sub, shutdown) cannot finish under the tool: it sees a
# kernel's end only once every kernel of the device has ended (the probe's end-beside
# mode shows this on plain CUDA), so the first terminate waits for the second kernel,
# which waits for the test. Such a test ends as TIMEOUT here. The K2K tests that end
# their kernels together run to the end under every tool.
#
# Keep SANITIZE_JOBS small (3 ran clean): with 9 or more sanitized processes at once,
# some tests that passed with 0 errors exited with signal 11 after their summary, which
# the same tests never did alone, with or without the tool (H100, driver 580).
#
# Example: only the K2K and lifecycle tests, under memcheck:
#   SANITIZE_TOOLS=memcheck SANITIZE_ONLY='runtime .*(k2k|lifecycle|a_full_inbox)' scripts/gpu-sanitize.sh
#
# Environment: SANITIZE_TIMEOUT (seconds per test and tool, default 120),
# SANITIZE_TOOLS (default "memcheck racecheck synccheck"), SANITIZE_ONLY (an extended
# regular expression: only the "binary test" pairs it matches run), SANITIZE_JOBS (how
# many runs at once, default 1; runs at once share the GPU, so each is slower),
# SANITIZE_STACKS (seconds: a test still running then gets its host threads written
# to LOG_DIR/<run>.stacks: each one's state and kernel wait channel, and its stack
# through gdb where there is one; this tells a test waiting in a CUDA call from one
# polling a slow kernel), SANITIZE_PROBE (0 leaves the probe out).
set -uo pipefail

bundle=${1:-.gpu/tests}
logs=${2:-sanitize-logs}
limit=${SANITIZE_TIMEOUT:-120}
tools=${SANITIZE_TOOLS:-memcheck racecheck synccheck}
mkdir -p "$logs"

if ! command -v compute-sanitizer >/dev/null 2>&1; then
  for d in /usr/local/cuda/bin /usr/local/cuda/compute-sanitizer; do
    [ -x "$d/compute-sanitizer" ] && PATH="$d:$PATH"
  done
fi
if ! command -v compute-sanitizer >/dev/null 2>&1; then
  echo "SKIPPED: compute-sanitizer not found (it ships with the CUDA toolkit)"
  exit 0
fi

# Lists the tests of a libtest binary (ignored ones included: they are the GPU tests).
list_tests() {
  "$1" --list --include-ignored 2>/dev/null | sed -n 's/: test$//p'
}

# The conformance tests at their smoke scale (a few hundred messages): under the tools a
# persistent kernel handles a message in milliseconds, not microseconds.
export RINGKERNEL_CONFORMANCE_SCALE=${RINGKERNEL_CONFORMANCE_SCALE:-smoke}

# Kernels compiled with source lines, so the reports name lines of the .cu files.
export RINGKERNEL_CUDA_LINEINFO=1

jobs_max=${SANITIZE_JOBS:-1}
stacks_after=${SANITIZE_STACKS:-}
results="$logs/results"
rm -rf "$results"
mkdir -p "$results"
# Records one result line (printed at once, so a run cut short keeps what it found; a
# file per run, as runs may go on in the background).
note() {
  echo "$1" >"$results/$name"
  echo "$1"
}
# Process $1 and all its descendants.
descendants() {
  local c
  echo "$1"
  for c in $(pgrep -P "$1"); do descendants "$c"; done
}
# Writes the host threads' stacks of process $1 and its descendants (compute-sanitizer
# starts the test through a launcher process) to $2.
dump_stacks() {
  local pid=$1 out=$2 dbg p t
  # Plain gdb only: cuda-gdb attaching to a process under the tool ends it ("Could not
  # find CUDA Debugger back-end", H100, driver 580).
  dbg=$(command -v gdb || true)
  for p in $(descendants "$pid"); do
    case "$(cat "/proc/$p/comm" 2>/dev/null)" in timeout | compute-sanitiz* | TreeLauncher*) continue ;; esac
    echo "== process $p: $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | cut -c1-160)"
    for t in /proc/"$p"/task/*; do
      echo "thread $(cat "$t/comm" 2>/dev/null) state $(cut -d' ' -f3 "$t/stat" 2>/dev/null) wchan $(cat "$t/wchan" 2>/dev/null)"
    done
    if [ -n "$dbg" ]; then
      timeout 30 "$dbg" -p "$p" -batch -ex "thread apply all bt 30" 2>&1 | grep -E '^(Thread|#)|ptrace' | cut -c1-220
    fi
  done >"$out" 2>&1
}
run_one() { # tool binary test
  local tool=$1 bin=$2 test=$3 log rc errors pid waited
  name="$(basename "$bin")__${test//::/_}__$tool"
  log="$logs/$name.log"
  timeout --kill-after=10 "$limit" compute-sanitizer --tool "$tool" --error-exitcode 99 \
    --target-processes all "$bin" --include-ignored --exact "$test" --test-threads 1 >"$log" 2>&1 &
  pid=$!
  if [ -n "$stacks_after" ]; then
    waited=0
    while kill -0 "$pid" 2>/dev/null && [ "$waited" -lt "$stacks_after" ]; do
      sleep 1
      waited=$((waited + 1))
    done
    kill -0 "$pid" 2>/dev/null && dump_stacks "$pid" "$logs/$name.stacks"
  fi
  wait "$pid"
  rc=$?
  errors=$(grep -Eo 'ERROR SUMMARY: [0-9]+' "$log" | tail -1 | grep -Eo '[0-9]+' || true)
  # racecheck prints its own summary, with warnings (potential hazards) beside errors.
  local warnings="" race
  race=$(grep -Eo 'RACECHECK SUMMARY: [0-9]+ hazards? displayed \([0-9]+ errors?, [0-9]+ warnings?\)' "$log" | tail -1 || true)
  if [ -n "$race" ]; then
    errors=$(sed -E 's/.*\(([0-9]+) error.*/\1/' <<<"$race")
    warnings=", warnings $(sed -E 's/.*, ([0-9]+) warning.*/\1/' <<<"$race")"
  fi
  if [ "$rc" -eq 255 ] && grep -q 'terminated before first instrumented API call' "$log"; then
    note "$(printf '%-10s NO-GPU   %-60s (no CUDA call: nothing to check)' "$tool" "$(basename "$bin") $test")"
    return
  fi
  case $rc in
    0) note "$(printf '%-10s ok       %-60s errors %s%s' "$tool" "$(basename "$bin") $test" "${errors:-0}" "$warnings")" ;;
    124 | 137) note "$(printf '%-10s TIMEOUT  %-60s (no result within %ss)' "$tool" "$(basename "$bin") $test" "$limit")" ;;
    *)
      note "$(printf '%-10s FAILED   %-60s exit %s, errors %s%s (see %s)' "$tool" "$(basename "$bin") $test" "$rc" "${errors:-?}" "$warnings" "$log")"
      ;;
  esac
}

# The tool's limits on plain CUDA (see the header).
here=$(cd "$(dirname "$0")" && pwd)
if [ "${SANITIZE_PROBE:-1}" = 0 ]; then
  echo "probe: not run (SANITIZE_PROBE=0)"
elif command -v nvcc >/dev/null 2>&1 && nvcc -O2 -o "$logs/sanitizer_probe" "$here/sanitizer_probe.cu" >"$logs/probe-build.log" 2>&1; then
  for mode in early-alloc late-alloc two-kernels end-beside; do
    plain=$(timeout 30 "$logs/sanitizer_probe" "$mode" 2>&1 | tail -1)
    timeout --kill-after=10 60 compute-sanitizer --tool memcheck "$logs/sanitizer_probe" "$mode" >"$logs/probe-$mode.log" 2>&1
    rc=$?
    errors=$(grep -Eo 'ERROR SUMMARY: [0-9]+' "$logs/probe-$mode.log" | tail -1 | grep -Eo '[0-9]+' || true)
    echo "probe $mode: without the tool: $plain"
    echo "probe $mode: under memcheck: exit $rc, errors ${errors:-?}: $(grep -m1 -E 'out of bounds|^[a-z-]+: ' "$logs/probe-$mode.log" | sed 's/^=* *//')"
  done
else
  echo "probe: SKIPPED (no nvcc, or it failed: $logs/probe-build.log)"
fi

shopt -s nullglob
bins=("$bundle"/ringkernel-cuda-ops "$bundle"/ringkernel-cuda-runtime "$bundle"/ringkernel_cuda*)
if [ "${#bins[@]}" -eq 0 ]; then
  echo "no CUDA test binaries under $bundle (stage them with gpu-bundle.sh -p ringkernel-cuda)" >&2
  exit 2
fi
for bin in "${bins[@]}"; do
  [ -x "$bin" ] || continue
  for test in $(list_tests "$bin"); do
    if [ -n "${SANITIZE_ONLY:-}" ] && ! echo "$(basename "$bin") $test" | grep -Eq "$SANITIZE_ONLY"; then
      continue
    fi
    for tool in $tools; do
      while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do
        wait -n
      done
      if [ "$jobs_max" -gt 1 ]; then
        run_one "$tool" "$bin" "$test" &
      else
        run_one "$tool" "$bin" "$test"
      fi
    done
  done
done
wait

runs=$(find "$results" -type f | wc -l)
fails=$(cat "$results"/* 2>/dev/null | awk '$2 == "FAILED"' | wc -l)
echo "==== compute-sanitizer summary ($(date -u +%F)): $runs runs, $fails failed"
cat "$results"/* 2>/dev/null | awk '{print $1, $2}' | sort | uniq -c
[ "$fails" -eq 0 ]
