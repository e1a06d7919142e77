// Instruction fetch cost for one warp (issue 12: is the one-message take fetch-bound?):
// N straight-line IMADs in 4 independent chains against the same work in a rolled loop,
// timed with clock64, with and without a spin between executions. Build and run on the
// GPU machine: nvcc -O3 -arch=native -o /tmp/icache notes/cuda_icache.cu && /tmp/icache
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>
template <int N, bool ROLL>
__global__ void blk(uint32_t* io, long long* out, int reps, int spin) {
  uint32_t a0 = io[0], a1 = io[1], a2 = io[2], a3 = io[3], b = io[4], c = io[5];
  long long best = 1ll << 60, sum = 0;
  for (int r = 0; r < reps; r++) {
    long long t0 = clock64();
    if (ROLL) {
#pragma unroll 1
      for (int i = 0; i < N / 64; i++) {
#pragma unroll
        for (int j = 0; j < 16; j++) { a0 = a0 * b + c; a1 = a1 * b + c; a2 = a2 * b + c; a3 = a3 * b + c; }
      }
    } else {
#pragma unroll
      for (int i = 0; i < N / 4; i++) { a0 = a0 * b + c; a1 = a1 * b + c; a2 = a2 * b + c; a3 = a3 * b + c; }
    }
    // consume so the timer waits for the work
    asm volatile("" :: "r"(a0), "r"(a1), "r"(a2), "r"(a3));
    long long t1 = clock64();
    long long d = t1 - t0;
    if (r > 0) { sum += d; if (d < best) best = d; }
    long long s0 = clock64();
    while (clock64() - s0 < spin) {}
  }
  if (threadIdx.x == 0) { out[0] = best; out[1] = sum / (reps - 1); }
  io[6 + threadIdx.x] = a0 ^ a1 ^ a2 ^ a3;
}
template <int N, bool ROLL>
void run(uint32_t* io, long long* out, int spin) {
  blk<N, ROLL><<<1, 32>>>(io, out, 200, spin);
  cudaDeviceSynchronize();
  long long h[2];
  cudaMemcpy(h, out, 16, cudaMemcpyDeviceToHost);
  printf("N %5d %s spin %5d: best %6lld cycles (%.2f/instr) mean %6lld (%.2f/instr), code %5d B\n", N, ROLL ? "rolled  " : "unrolled",
         spin, h[0], (double)h[0] / N, h[1], (double)h[1] / N, N * 16);
}
int main() {
  uint32_t* io; long long* out;
  cudaMalloc(&io, 4096); cudaMalloc(&out, 64);
  uint32_t init[8] = {1, 2, 3, 4, 1664525u, 1013904223u, 0, 0};
  cudaMemcpy(io, init, 32, cudaMemcpyHostToDevice);
  for (int spin : {0, 4000}) {
    run<256, false>(io, out, spin); run<256, true>(io, out, spin);
    run<512, false>(io, out, spin); run<512, true>(io, out, spin);
    run<1024, false>(io, out, spin); run<1024, true>(io, out, spin);
    run<2048, false>(io, out, spin); run<2048, true>(io, out, spin);
    run<4096, false>(io, out, spin); run<4096, true>(io, out, spin);
    run<8192, false>(io, out, spin); run<8192, true>(io, out, spin);
  }
  return 0;
}
