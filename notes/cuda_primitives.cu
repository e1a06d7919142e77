// Costs of the device primitives on the persistent kernel's round-trip path, measured
// with %globaltimer over many repetitions by one block of 128 threads. Used for the
// round-trip breakdown in BENCHMARKS.md (issue 12). Build and run on the GPU machine:
//   nvcc -O3 -arch=native -o /tmp/prims notes/cuda_primitives.cu && /tmp/prims
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>

__device__ __forceinline__ uint64_t gt() { uint64_t t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
__device__ __forceinline__ void st_rel_sys(uint64_t* p, uint64_t v) { asm volatile("st.release.sys.global.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory"); }

__global__ void prims(uint64_t* host, uint64_t* dev, double* out, int n) {
  __shared__ uint64_t sh[128];
  const int tid = threadIdx.x;
  uint64_t t0, t1, acc = 0;
  // 1. %globaltimer read
  t0 = gt(); for (int i = 0; i < n; i++) acc += gt(); t1 = gt();
  if (tid == 0) out[0] = (double)(t1 - t0) / n;
  __syncthreads();
  // 2. __syncthreads, 128 threads
  t0 = gt(); for (int i = 0; i < n; i++) { sh[tid] = i; __syncthreads(); } t1 = gt();
  if (tid == 0) out[1] = (double)(t1 - t0) / n;
  // 3. thread 0 writes shared, barrier, everyone reads it (a decide step)
  t0 = gt(); for (int i = 0; i < n; i++) { if (tid == 0) sh[0] = i + acc; __syncthreads(); acc += sh[0]; __syncthreads(); } t1 = gt();
  if (tid == 0) out[2] = (double)(t1 - t0) / n;
  // 4. one 8-byte store to mapped host memory, then st.release.sys (thread 0)
  if (tid == 0) { t0 = gt(); for (int i = 0; i < n; i++) { host[8] = i; st_rel_sys(&host[0], i); } t1 = gt(); out[3] = (double)(t1 - t0) / n; }
  __syncthreads();
  // 5. 16 x 16-byte stores to host memory by 16 threads, barrier, st.release.sys
  t0 = gt();
  for (int i = 0; i < n; i++) {
    if (tid < 16) ((uint4*)(host + 64))[tid] = make_uint4(i, i, i, i);
    __syncthreads();
    if (tid == 0) st_rel_sys(&host[0], i);
    __syncthreads();
  }
  t1 = gt();
  if (tid == 0) out[4] = (double)(t1 - t0) / n;
  // 6. the same with __threadfence_system() + volatile store
  t0 = gt();
  for (int i = 0; i < n; i++) {
    if (tid < 16) ((uint4*)(host + 64))[tid] = make_uint4(i, i, i, i);
    __syncthreads();
    if (tid == 0) { __threadfence_system(); ((volatile uint64_t*)host)[0] = i; }
    __syncthreads();
  }
  t1 = gt();
  if (tid == 0) out[5] = (double)(t1 - t0) / n;
  // 7. a dependent device-memory load (L2) by thread 0
  if (tid == 0) { uint64_t x = 0; t0 = gt(); for (int i = 0; i < n; i++) x = ((volatile uint64_t*)dev)[x & 7]; t1 = gt(); out[6] = (double)(t1 - t0) / n; acc += x; }
  // 8. a dependent load of mapped host memory (one PCIe round trip) by thread 0
  if (tid == 0) { uint64_t x = 0; t0 = gt(); for (int i = 0; i < n / 16; i++) x = ((volatile uint64_t*)host)[16 + (x & 7)]; t1 = gt(); out[7] = (double)(t1 - t0) / (n / 16); acc += x; }
  // 9. %globaltimer resolution: the smallest step between two different readings
  if (tid == 0) {
    uint64_t best = ~0ull, prev = gt();
    for (int i = 0; i < 2000; i++) {
      uint64_t now = gt();
      while (now == prev) now = gt();
      if (now - prev < best) best = now - prev;
      prev = now;
    }
    out[8] = (double)best;
  }
  if (tid == 0 && acc == 42) out[9] = 1;
}

int main() {
  const char* names[] = {"%globaltimer read", "__syncthreads (128 threads)", "thread 0 decides, two barriers",
                         "8-B host store + st.release.sys", "16 x 16-B host stores, barrier, st.release.sys, barrier",
                         "same with __threadfence_system + volatile store", "dependent device-memory load (L2)",
                         "dependent mapped-host load (PCIe round trip)", "%globaltimer resolution (smallest step)"};
  uint64_t *host, *dhost, *dev; double *out, *dout;
  cudaHostAlloc(&host, 1 << 16, cudaHostAllocMapped); cudaHostGetDevicePointer(&dhost, host, 0);
  cudaMalloc(&dev, 4096); cudaMemset(dev, 0, 4096);
  cudaHostAlloc(&out, 16 * sizeof(double), cudaHostAllocMapped); cudaHostGetDevicePointer(&dout, out, 0);
  for (int rep = 0; rep < 2; rep++) {
    prims<<<1, 128>>>(dhost, dev, dout, 20000);
    if (cudaDeviceSynchronize() != cudaSuccess) { printf("kernel failed\n"); return 1; }
  }
  for (int i = 0; i < 9; i++) printf("%-60s %8.1f ns\n", names[i], out[i]);
  return 0;
}
