// grid_barrier.cu: what one grid-wide barrier costs on this GPU, for the barrier of
// rk_program (crates/ringkernel-cuda/kernels/program.cu) and its alternatives, with
// cooperative groups' grid.sync() as the peer. One block of 512 threads per SM (as
// rk_program), cooperative launch, 20,000 barriers a kernel; ns per barrier, best of 3.
//
//   nvcc -O3 -arch=native -o grid_barrier scripts/grid_barrier.cu && ./grid_barrier
//
// Variants:
//   fenced   __threadfence, red.release.gpu add, poll ld.acquire.gpu, __threadfence
//            (rk_program's barrier as first written)
//   release  red.release.gpu add, poll ld.acquire.gpu (no extra fences)
//   flag     atom.add.acq_rel; the last block to arrive bumps a generation word on
//            another cache line with st.release, the others poll that word
//   cg       cooperative_groups::this_grid().sync()
#include <cooperative_groups.h>
#include <cstdio>
#include <cuda_runtime.h>
namespace cg = cooperative_groups;

typedef unsigned long long u64;

__device__ __forceinline__ u64 ld_acquire(const u64* p) {
    u64 v;
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

template <int V>
__device__ __forceinline__ void barrier(u64* count, u64* gen, u64 k) {
    if (V == 3) {
        cg::this_grid().sync();
        return;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        const u64 target = (k + 1) * gridDim.x;
        if (V == 0) __threadfence();
        if (V <= 1) {
            asm volatile("red.release.gpu.global.add.u64 [%0], 1;" ::"l"(count) : "memory");
            while (ld_acquire(count) < target) {
            }
        } else {
            u64 old;
            asm volatile("atom.add.acq_rel.gpu.global.u64 %0, [%1], 1;" : "=l"(old) : "l"(count) : "memory");
            if (old + 1 == target) {
                asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(gen), "l"(k + 1) : "memory");
            } else {
                while (ld_acquire(gen) < k + 1) {
                }
            }
        }
        if (V == 0) __threadfence();
    }
    __syncthreads();
}

template <int V>
__global__ void __launch_bounds__(512, 1) bench(u64* count, u64* gen, int iters, int* check) {
    for (int k = 0; k < iters; k++) {
        // a write before and a read after each barrier, as the program's instructions do
        if (threadIdx.x == 0) check[blockIdx.x] = k;
        barrier<V>(count, gen, k);
        if (threadIdx.x == 0 && check[(blockIdx.x + 1) % gridDim.x] < k) check[gridDim.x] = 1;
    }
}

template <int V>
float run(int blocks, int iters, u64* count, u64* gen, int* check) {
    float best = 1e30f;
    for (int rep = 0; rep < 3; rep++) {
        cudaMemset(count, 0, 8);
        cudaMemset(gen, 0, 8);
        cudaMemset(check, 0, sizeof(int) * (blocks + 1));
        cudaEvent_t a, b;
        cudaEventCreate(&a);
        cudaEventCreate(&b);
        void* args[] = {&count, &gen, &iters, &check};
        cudaEventRecord(a);
        cudaError_t e = cudaLaunchCooperativeKernel((void*)bench<V>, blocks, 512, args, 0, 0);
        cudaEventRecord(b);
        cudaEventSynchronize(b);
        if (e != cudaSuccess || cudaGetLastError() != cudaSuccess) {
            std::printf("launch failed: %s\n", cudaGetErrorString(e));
            return -1;
        }
        int bad = 0;
        cudaMemcpy(&bad, check + blocks, sizeof(int), cudaMemcpyDeviceToHost);
        if (bad) {
            std::printf("variant %d: a block passed a barrier early\n", V);
            return -1;
        }
        float ms;
        cudaEventElapsedTime(&ms, a, b);
        best = ms * 1e6f / iters < best ? ms * 1e6f / iters : best;
    }
    return best;
}

int main() {
    int sms;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    u64 *count, *gen;
    int* check;
    cudaMalloc(&count, 256);
    cudaMalloc(&gen, 256);
    cudaMalloc(&check, sizeof(int) * (sms + 1));
    const int iters = 20000;
    for (int blocks : {sms, sms / 2, 32}) {
        std::printf("blocks=%d: fenced %.0f ns, release %.0f ns, flag %.0f ns, cg %.0f ns per barrier\n", blocks,
                    run<0>(blocks, iters, count, gen, check), run<1>(blocks, iters, count, gen, check),
                    run<2>(blocks, iters, count, gen, check), run<3>(blocks, iters, count, gen, check));
    }
    return 0;
}
