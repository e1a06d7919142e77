// shared_atomics.cu: the latency of the operations on a persistent kernel's take path
// (kernels/persistent.cu, the one-message loop), measured alone: one warp, lane 0, a
// chain of 4,096 dependent operations each, timed with clock64 and %globaltimer. The
// take path's cost is mostly a chain of such operations on shared memory; the
// BENCHMARKS section of 2026-11-29 uses these figures to say why.
//
// Build and run on the GPU machine (no Rust needed):
//
//     nvcc -O3 -arch=native -o /tmp/shared_atomics shared_atomics.cu && /tmp/shared_atomics
//
// Prints cycles and ns an operation (the loop's own cost is the first line).
#include <cstdint>
#include <cstdio>

typedef unsigned long long u64;

__device__ __forceinline__ u64 gt() {
    u64 t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ u64 ld_relaxed_cta(u64* p) {
    u64 v;
    asm volatile("ld.relaxed.cta.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void st_relaxed_cta(u64* p, u64 v) {
    asm volatile("st.relaxed.cta.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

#define N 4096
#define OPS 9

// Times N iterations of `body` (lane 0; each depends on the last through `acc`) into
// out[2r] (cycles) and out[2r + 1] (ns).
#define TIME(body)                                                  \
    {                                                               \
        __syncwarp();                                               \
        const long long c0 = clock64();                             \
        const u64 g0 = gt();                                        \
        for (int i = 0; i < N; i++) {                               \
            if (lane == 0) { body; }                                \
            __syncwarp();                                           \
        }                                                           \
        const long long c1 = clock64();                             \
        const u64 g1 = gt();                                        \
        if (lane == 0) {                                            \
            out[2 * r] = c1 - c0;                                   \
            out[2 * r + 1] = g1 - g0;                               \
        }                                                           \
        r++;                                                        \
    }

__global__ void take_ops(u64* out, u64 off) {
    __shared__ u64 s[64];
    __shared__ unsigned s32[64];
    __shared__ unsigned stage[256];
    if (threadIdx.x < 64) {
        s[threadIdx.x] = 0;
        s32[threadIdx.x] = 0;
    }
    __syncthreads();
    if (threadIdx.x >= 32) return;
    const unsigned lane = threadIdx.x;
    u64 acc = 0;
    int r = 0;
    TIME(acc += 1)                                            // the loop and __syncwarp
    TIME(acc += atomicExch(&s[acc & 7], acc))                 // rk_xg_st64
    TIME(acc += atomicAdd(&s[8 + (acc & 7)], 1ull))           // S->taken
    TIME(acc += atomicCAS(&s[16], s[16], acc))                // rk_hlc_reserve
    TIME(acc += atomicAdd(&s32[acc & 7], 0u))                 // rk_xg_ld32
    TIME(acc += gt())                                         // %globaltimer
    TIME(acc += (gt() + off) / 1000000ull)                    // rk_now_ms
    TIME(st_relaxed_cta(&s[24 + (acc & 7)], acc); acc += ld_relaxed_cta(&s[24 + (acc & 3)]))
    TIME(acc += *(volatile u64*)&s[32 + (acc & 7)]; *(volatile u64*)&s[40] = acc)
    // The staging of a message: every lane stores three words, then __syncwarp.
    __syncwarp();
    const long long c0 = clock64();
    for (int i = 0; i < N; i++) {
        stage[lane * 3 + (i & 1)] = (unsigned)i + lane;
        stage[lane * 3 + 1] = i;
        stage[lane * 3 + 2] = lane;
        __syncwarp();
    }
    const long long c1 = clock64();
    if (lane == 0) {
        out[2 * OPS] = c1 - c0;
        out[2 * OPS + 1] = acc + stage[5];  // keeps the chains
    }
}

int main() {
    u64* d;
    if (cudaMalloc(&d, 64 * sizeof(u64)) != cudaSuccess) {
        fprintf(stderr, "no CUDA device\n");
        return 1;
    }
    u64 h[64];
    for (int rep = 0; rep < 2; rep++) {  // the second launch's figures (warm)
        take_ops<<<1, 256>>>(d, 12345);
        if (cudaDeviceSynchronize() != cudaSuccess) {
            fprintf(stderr, "kernel failed\n");
            return 1;
        }
        cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost);
    }
    int clk = 0;
    cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0);
    const char* names[OPS] = {"loop+syncwarp",        "atomicExch u64 shared", "atomicAdd u64 shared",
                              "atomicCAS u64 shared", "atomicAdd u32 shared",  "globaltimer",
                              "now_ms (gt + div)",    "st+ld relaxed.cta u64", "volatile ld+st u64"};
    printf("clock %d kHz\n", clk);
    for (int i = 0; i < OPS; i++)
        printf("%-26s %7.1f cycles/iter  %6.1f ns/iter (globaltimer)\n", names[i], h[2 * i] / (double)N,
               h[2 * i + 1] / (double)N);
    printf("%-26s %7.1f cycles/iter\n", "staging 3 st + syncwarp", h[2 * OPS] / (double)N);
    return 0;
}
