// How a warp's loads of mapped host memory (one PCIe round trip each) interact with the
// rest of its work, and how bulk copies (cp.async.bulk, the copy engine behind TMA)
// compare (issue 12). A: one thread, a device load after a host load still in flight,
// or after a host store. B: another warp (same block, or another block) polling host
// memory. C: one host read by load and by bulk copy. D: a ping-pong with the host,
// polled both ways (does a bulk copy see the host's writes?). E: lane 0's device and
// shared loads and atomics with a host load in flight on lane 0 or lane 5. F: the same
// with a bulk copy in flight. G: two reads of host memory issued `gap` cycles apart:
// when each is back. Results: BENCHMARKS.md, "H200 runs of 2026-11-29, 08:36-09:38 UTC".
// Build and run on the GPU machine:
//   nvcc -O3 -arch=sm_90 -o /tmp/inorder notes/cuda_inorder.cu && /tmp/inorder
#include <cstdint>
#include "cuda_check.h"
#include "../crates/ringkernel-cuda/kernels/ringkernel.cuh"

__device__ __forceinline__ uint64_t ldv(const uint64_t* p) {
    uint64_t v;
    asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ uint64_t ldrel_gpu(const uint64_t* p) {
    uint64_t v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ long long clk() {
    long long t;
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(t)::"memory");
    return t;
}
__device__ __forceinline__ uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

// ---- bulk copy (TMA) of 16..N bytes from global (host-mapped) memory into shared ----
__device__ __forceinline__ void mbar_init(uint64_t* bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(bar)));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
}
__device__ __forceinline__ bool mbar_test(uint64_t* bar, uint32_t phase) {
    uint32_t ok;
    asm volatile(
        "{ .reg .pred p; mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(ok)
        : "r"(smem_u32(bar)), "r"(phase)
        : "memory");
    return ok != 0;
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t phase) {
    while (!mbar_test(bar, phase)) {
    }
}
// One bulk copy of `bytes` into `dst`, waited for (`*phase`: the mbarrier's parity).
__device__ __forceinline__ void bulk_read(void* dst, const void* src, uint32_t bytes, uint64_t* bar, uint32_t* phase) {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    bulk_load(dst, src, bytes, bar);
    mbar_wait(bar, *phase);
    *phase ^= 1;
}

// A chain of `k` dependent device-memory loads (each address from the last value).
__device__ __forceinline__ uint64_t chain(const uint64_t* dev, uint64_t x, int k, bool relaxed) {
    for (int i = 0; i < k; i++) x = relaxed ? ldrel_gpu(dev + (x & 7) * 32) : ldv(dev + (x & 7) * 32);
    return x;
}

// Test A, one thread: each repetition optionally issues a host load (mode 1) or a host
// store (mode 2) whose result is used only at the repetition's end, then times a chain
// of K dependent device loads. out[0] = mean cycles of the chain.
__global__ void test_same_thread(const uint64_t* host, uint64_t* hostw, const uint64_t* dev, long long* out, int reps,
                                 int mode, int k, int relaxed) {
    if (threadIdx.x != 0) return;
    uint64_t x = 0, acc = 0;
    long long sum = 0;
    for (int r = 0; r < reps; r++) {
        uint64_t h = 0;
        if (mode == 1) h = ldv(host + (r & 7) * 16);
        if (mode == 2) ((volatile uint64_t*)hostw)[(r & 7) * 16] = r;
        const long long t0 = clk();
        x = chain(dev, x, k, relaxed);
        if (x == 0x5555) out[7] = 1;  // waits for x
        const long long t1 = clk();
        sum += t1 - t0;
        acc += h;
        if (acc == 0x5555) out[6] = 1;  // waits for h
        // let everything drain between repetitions
        const long long s = clk();
        while (clk() - s < 4000) {
        }
    }
    out[0] = sum / reps;
}

// Test B: warp 0 of block 0 times dependent device loads while a poller keeps host
// loads in flight: mode 0 none, 1 warp 1 of the same block (LDG, dependent polls), 2 a
// warp of block 1 (another SM), 3 warp 1 with bulk copies (TMA) of 64 bytes,
// 4 warp 1 with 32 lanes each polling one 16-byte unit (as the kernel's poll).
__global__ void test_other_warp(const uint64_t* host, const uint64_t* dev, long long* out, int reps, int mode, int k) {
    __shared__ volatile int stop;
    __shared__ __align__(128) uint64_t buf[16];
    __shared__ uint64_t bar;
    __shared__ int polls;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (threadIdx.x == 0) {
        stop = 0;
        polls = 0;
        mbar_init(&bar);
    }
    __syncthreads();
    const bool measurer = blockIdx.x == 0 && warp == 0;
    const bool poller = (mode == 1 || mode == 3 || mode == 4) ? (blockIdx.x == 0 && warp == 1)
                        : mode == 2                          ? (blockIdx.x == 1 && warp == 0)
                                                             : false;
    if (measurer) {
        if (lane == 0) {
            uint64_t x = 0;
            long long sum = 0;
            // warm up, and give the poller time to start
            const long long s0 = clk();
            while (clk() - s0 < 200000) {
            }
            for (int r = 0; r < reps; r++) {
                const long long t0 = clk();
                x = chain(dev, x, k, false);
                if (x == 0x5555) out[7] = 1;
                sum += clk() - t0;
            }
            out[0] = sum / reps;
            // stop the pollers: this block's through shared memory, block 1's through dev[7]
            stop = 1;
            ((volatile uint64_t*)dev)[1024] = 1;
        }
        return;
    }
    if (!poller) return;
    int n = 0;
    if (mode == 3) {
        if (lane == 0) {
            uint32_t phase = 0;
            while (!stop) {
                bulk_read(buf, host + (n & 7) * 16, 64, &bar, &phase);
                n++;
            }
            polls = n;
        }
    } else if (mode == 4) {
        uint64_t acc = 0;
        for (;;) {
            const uint4 v = rk_ld_volatile_v4((const char*)host + (n & 7) * 512 + lane * 16);
            acc += v.x;
            n += 1 + (int)(v.x & 0x10000u);  // the next poll waits for this one
            if (__any_sync(0xffffffffu, stop != 0)) break;
        }
        if (lane == 0) polls = n + (int)(acc & 0);
    } else if (lane == 0) {
        uint64_t acc = 0;
        if (mode == 2) {
            while (ldv(dev + 1024) == 0) {
                acc += ldv(host + (acc & 7) * 16);
                n++;
            }
        } else {
            while (!stop) {
                acc += ldv(host + (acc & 7) * 16);
                n++;
            }
        }
        polls = n + (int)(acc & 0);
    }
    __syncwarp();
    if (lane == 0 && blockIdx.x == 0) out[1] = polls;
}

// Test C: latency of one host-memory read, LDG against a bulk copy (one thread, dependent).
__global__ void test_host_latency(const uint64_t* host, long long* out, int reps) {
    __shared__ __align__(128) uint64_t buf[16];
    __shared__ uint64_t bar;
    if (threadIdx.x != 0) return;
    mbar_init(&bar);
    uint64_t x = 0;
    long long t0 = clk();
    for (int r = 0; r < reps; r++) x = ldv(host + (x & 7) * 16);
    if (x == 0x5555) out[7] = 1;
    out[0] = (clk() - t0) / reps;
    uint32_t phase = 0;
    t0 = clk();
    for (int r = 0; r < reps; r++) {
        bulk_read(buf, host + (x & 7) * 16, 64, &bar, &phase);
        x = buf[0];
    }
    if (x == 0x5555) out[7] = 1;
    out[1] = (clk() - t0) / reps;
}

// Test D: does a bulk copy (TMA) of host memory see what the host writes while the
// kernel runs (no stale copy in the GPU's caches)? Kernel polls host[0] for 1..n,
// echoing each value to host[64]; the host writes the next when it sees the echo.
__global__ void test_tma_pingpong(uint64_t* host, long long* out, int n, int use_tma) {
    __shared__ __align__(128) uint64_t buf[16];
    __shared__ uint64_t bar;
    if (threadIdx.x != 0) return;
    mbar_init(&bar);
    uint32_t phase = 0;
    long long t0 = clk();
    for (int i = 1; i <= n; i++) {
        long long spins = 0;
        for (;;) {
            uint64_t v;
            if (use_tma) {
                bulk_read(buf, host, 64, &bar, &phase);
                v = buf[0];
            } else {
                v = ldv(host);
            }
            if (v == (uint64_t)i) break;
            if (++spins > 20000000) {
                out[0] = -i;
                return;
            }
        }
        ((volatile uint64_t*)host)[64] = i;
    }
    out[0] = clk() - t0;
}

// Test E, one warp: lane `hl` (or no lane: hl < 0) issues a host load whose result is
// used only at the repetition's end; lane 0 then times one operation of kind `op`:
// 0 a chain of 4 dependent device loads (ld.volatile), 1 the same with ld.global.nc,
// 2 a chain of 4 dependent shared-memory loads, 3 four dependent shared-memory 64-bit
// atomics, 4 four dependent device-memory 64-bit atomics (atomicAdd), 5 four dependent
// 64-bit compare-and-swaps on device memory. out[0] = mean cycles.
__global__ void test_ops(const uint64_t* host, uint64_t* dev, long long* out, int reps, int op, int hl) {
    __shared__ uint64_t sh[256];
    const int lane = threadIdx.x % 32;
    if (threadIdx.x >= 32) return;
    for (int i = lane; i < 256; i += 32) sh[i] = 0;
    __syncwarp();
    uint64_t x = 0, acc = 0;
    long long sum = 0;
    for (int r = 0; r < reps; r++) {
        uint64_t h = 0;
        if (lane == hl) h = ldv(host + (r & 7) * 16);
        __syncwarp();
        if (lane == 0) {
            const long long t0 = clk();
            for (int i = 0; i < 4; i++) {
                if (op == 0) x = ldv(dev + (x & 7) * 32);
                else if (op == 1) x = __ldg(dev + 2048 + (x & 7) * 32);
                else if (op == 2) x = ((volatile uint64_t*)sh)[(x & 7) * 8];
                else if (op == 3) x = atomicAdd((unsigned long long*)&sh[(x & 7) * 8], 0ull);
                else if (op == 4) x = atomicAdd((unsigned long long*)(dev + 4096 + (x & 7) * 32), 0ull);
                else x = atomicCAS((unsigned long long*)(dev + 4096 + (x & 7) * 32), 1ull, 2ull);
            }
            if (x == 0x5555) out[7] = 1;
            sum += clk() - t0;
        }
        acc += h;
        if (acc == 0x5555) out[6] = 1;
        __syncwarp();
        const long long s = clk();
        while (clk() - s < 4000) {
        }
    }
    if (lane == 0) out[0] = sum / reps;
}

// Test F, one warp, lane 0: a bulk copy (TMA) of host memory into shared memory is
// issued (mode 1) or not (mode 0), then lane 0 times 4 dependent operations `op` (as E:
// 0 device loads, 2 shared loads, 3 shared atomics, 5 device compare-and-swaps), and
// only then waits for the copy. out[0] = mean cycles of the operations, out[1] = mean
// cycles from the copy's issue to its completion seen.
__global__ void test_tma_then(const uint64_t* host, uint64_t* dev, long long* out, int reps, int op, int mode) {
    __shared__ __align__(128) uint64_t buf[64];
    __shared__ uint64_t bar;
    __shared__ uint64_t sh[256];
    if (threadIdx.x != 0) return;
    mbar_init(&bar);
    for (int i = 0; i < 256; i++) sh[i] = 0;
    uint64_t x = 0;
    uint32_t phase = 0;
    long long sum = 0, lat = 0;
    for (int r = 0; r < reps; r++) {
        const long long c0 = clk();
        if (mode) {
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            bulk_load(buf, host + (r & 7) * 64, 256, &bar);
        }
        const long long t0 = clk();
        for (int i = 0; i < 4; i++) {
            if (op == 0) x = ldv(dev + (x & 7) * 32);
            else if (op == 2) x = ((volatile uint64_t*)sh)[(x & 7) * 8];
            else if (op == 3) x = atomicAdd((unsigned long long*)&sh[(x & 7) * 8], 0ull);
            else x = atomicCAS((unsigned long long*)(dev + 4096 + (x & 7) * 32), 1ull, 2ull);
        }
        if (x == 0x5555) out[7] = 1;
        sum += clk() - t0;
        if (mode) {
            mbar_wait(&bar, phase);
            phase ^= 1;
            lat += clk() - c0;
            x += buf[1];
        }
        const long long s = clk();
        while (clk() - s < 6000) {
        }
    }
    out[0] = sum / reps;
    out[1] = lat / reps;
}

// Test G, one thread: two reads of the same host line, the second issued `gap` cycles
// after the first (LDG: mode 0; bulk copies into two buffers: mode 1; LDG of two
// different lines: mode 2). out[0] = cycles from the first's issue to its result,
// out[1] = from the first's issue to the second's result (means).
__global__ void test_two_reads(const uint64_t* host, long long* out, int reps, int gap, int mode) {
    __shared__ __align__(128) uint64_t buf[2][32];
    __shared__ uint64_t bar[2];
    if (threadIdx.x != 0) return;
    mbar_init(&bar[0]);
    mbar_init(&bar[1]);
    uint32_t phase = 0;
    long long s1 = 0, s2 = 0;
    uint64_t acc = 0;
    for (int r = 0; r < reps; r++) {
        const uint64_t* a = host + (r & 7) * 64;
        const uint64_t* b = mode == 2 ? a + 16 * 64 : a;
        long long c0, c1, c2;
        if (mode == 1) {
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            c0 = clk();
            bulk_load(buf[0], a, 128, &bar[0]);
            while (clk() - c0 < gap) {
            }
            bulk_load(buf[1], b, 128, &bar[1]);
            mbar_wait(&bar[0], phase);
            c1 = clk();
            mbar_wait(&bar[1], phase);
            c2 = clk();
            phase ^= 1;
            acc += buf[0][0] + buf[1][0];
        } else {
            c0 = clk();
            const uint64_t v1 = ldv(a);
            while (clk() - c0 < gap) {
            }
            const uint64_t v2 = ldv(b);
            if (v1 == 0x5555) out[7] = 1;
            c1 = clk();
            if (v2 == 0x5555) out[7] = 1;
            c2 = clk();
        }
        s1 += c1 - c0;
        s2 += c2 - c0;
        const long long s = clk();
        while (clk() - s < 8000) {
        }
    }
    out[0] = s1 / reps;
    out[1] = s2 / reps + (long long)(acc & 0);
}

int main() {
    uint64_t *host, *dhost, *dev;
    long long *out, *hout;
    CK(cudaSetDeviceFlags(cudaDeviceMapHost));
    CK(cudaHostAlloc(&host, 1 << 20, cudaHostAllocMapped));
    CK(cudaHostGetDevicePointer(&dhost, host, 0));
    for (int i = 0; i < (1 << 17); i++) host[i] = 0;
    CK(cudaMalloc(&dev, 1 << 20));
    CK(cudaMemset(dev, 0, 1 << 20));
    CK(cudaMalloc(&out, 64));
    CK(cudaHostAlloc(&hout, 64, 0));
    int clk_khz;
    CK(cudaDeviceGetAttribute(&clk_khz, cudaDevAttrClockRate, 0));
    printf("SM clock %d MHz (nominal)\n", clk_khz / 1000);
    auto run_a = [&](int mode, int k, int relaxed) {
        cudaMemset(out, 0, 64);
        test_same_thread<<<1, 32>>>(dhost, dhost + 4096, dev, out, 2000, mode, k, relaxed);
        cudaMemcpy(hout, out, 64, cudaMemcpyDeviceToHost);
        return hout[0];
    };
    printf("A. one thread, chain of K dependent device loads (cycles for the chain):\n");
    for (int k : {1, 4}) {
        for (int relaxed : {0, 1}) {
            printf("   K=%d %-14s alone %5lld | after a host load in flight %5lld | after a host store %5lld\n", k,
                   relaxed ? "ld.relaxed.gpu" : "ld.volatile", run_a(0, k, relaxed), run_a(1, k, relaxed),
                   run_a(2, k, relaxed));
        }
    }
    CK(cudaDeviceSynchronize());
    const char* names[] = {"no poller", "warp 1, same block (LDG)", "warp of another block (LDG)",
                           "warp 1, same block (bulk copy)", "warp 1, 32 lanes x 16 B (LDG)"};
    printf("B. warp 0 times 4 dependent device loads while a poller keeps host loads in flight:\n");
    for (int rep = 0; rep < 2; rep++) {
        for (int mode = 0; mode < 5; mode++) {
            cudaMemset(out, 0, 64);
            cudaMemset(dev + 1024, 0, 8);
            test_other_warp<<<mode == 2 ? 2 : 1, 64>>>(dhost, dev, out, 4000, mode, 4);
            CK(cudaDeviceSynchronize());
            cudaMemcpy(hout, out, 64, cudaMemcpyDeviceToHost);
            printf("   %-32s chain %5lld cycles (%lld per load), poller's polls %lld\n", names[mode], hout[0],
                   hout[0] / 4, hout[1]);
        }
    }
    cudaMemset(out, 0, 64);
    test_host_latency<<<1, 32>>>(dhost, out, 2000);
    CK(cudaDeviceSynchronize());
    cudaMemcpy(hout, out, 64, cudaMemcpyDeviceToHost);
    printf("C. one host-memory read: LDG %lld cycles, bulk copy of 64 B %lld cycles\n", hout[0], hout[1]);
    for (int tma = 0; tma < 2; tma++) {
        const int n = 2000;
        host[0] = 0;
        host[64] = 0;
        cudaMemset(out, 0, 64);
        test_tma_pingpong<<<1, 32>>>(dhost, out, n, tma);
        int i = 1;
        volatile uint64_t* vh = host;
        long long guard = 0;
        while (i <= n && guard < 2000000000ll) {
            vh[0] = i;
            while (vh[64] != (uint64_t)i && ++guard < 2000000000ll) {
            }
            i++;
        }
        CK(cudaDeviceSynchronize());
        cudaMemcpy(hout, out, 64, cudaMemcpyDeviceToHost);
        printf("D. ping-pong with the host, kernel polls by %s: %s %.0f cycles a round trip\n",
               tma ? "bulk copy" : "LDG", hout[0] < 0 ? "STUCK at" : "ok,", hout[0] < 0 ? (double)-hout[0] : (double)hout[0] / n);
    }
    printf("E. lane 0 times 4 dependent operations; a host load in flight on lane hl:\n");
    const char* ops[] = {"device ld.volatile", "device ld.global.nc", "shared ld", "shared atomicAdd",
                         "device atomicAdd", "device atomicCAS"};
    for (int op = 0; op < 6; op++) {
        long long r3[3];
        const int hls[3] = {-1, 0, 5};
        for (int j = 0; j < 3; j++) {
            cudaMemset(out, 0, 64);
            test_ops<<<1, 32>>>(dhost, dev, out, 2000, op, hls[j]);
            cudaDeviceSynchronize();
            cudaMemcpy(hout, out, 64, cudaMemcpyDeviceToHost);
            r3[j] = hout[0];
        }
        printf("   %-20s none %5lld | on lane 0 %5lld | on lane 5 %5lld\n", ops[op], r3[0], r3[1], r3[2]);
    }
    printf("F. lane 0: a bulk copy of 256 B of host memory in flight (or not), then 4 dependent operations:\n");
    {
        const int fops[4] = {0, 2, 3, 5};
        const char* fnames[4] = {"device ld.volatile", "shared ld", "shared atomicAdd", "device atomicCAS"};
        for (int j = 0; j < 4; j++) {
            long long r2[2], cl = 0;
            for (int mode = 0; mode < 2; mode++) {
                cudaMemset(out, 0, 64);
                test_tma_then<<<1, 32>>>(dhost, dev, out, 2000, fops[j], mode);
                CK(cudaDeviceSynchronize());
                cudaMemcpy(hout, out, 64, cudaMemcpyDeviceToHost);
                r2[mode] = hout[0];
                if (mode) cl = hout[1];
            }
            printf("   %-20s none %5lld | copy in flight %5lld (the copy: %lld cycles)\n", fnames[j], r2[0], r2[1], cl);
        }
    }
    printf("G. two reads, the second `gap` cycles after the first: cycles to the first's result / the second's\n");
    for (int mode = 0; mode < 3; mode++) {
        for (int gap : {0, 300, 800, 1500}) {
            cudaMemset(out, 0, 64);
            test_two_reads<<<1, 32>>>(dhost, out, 1000, gap, mode);
            CK(cudaDeviceSynchronize());
            cudaMemcpy(hout, out, 64, cudaMemcpyDeviceToHost);
            printf("   %-28s gap %4d: %5lld / %5lld\n",
                   mode == 0 ? "LDG, same line" : mode == 1 ? "bulk copies, same line" : "LDG, two lines", gap, hout[0],
                   hout[1]);
        }
    }
    CK(cudaGetLastError());
    return 0;
}
