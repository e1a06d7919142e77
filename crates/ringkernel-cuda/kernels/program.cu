// program.cu: rk_program, a recorded sequence of ops run by one resident grid (appended
// to ops.cu and model.cu, whose op bodies it calls).
//
// A decode step is ~150 small ops. rk_program runs them all in one cooperative launch:
// every block walks the instruction list, does its share of each instruction (the same
// bodies as the op kernels, over virtual blocks or warps), and the grid meets at a barrier
// before the next instruction. Measured on an H100 it is slower than the same ops as a
// CUDA graph (0.88x: the bodies' memory latency, not the launches, dominates), so it is
// opt-in; `compute/program.rs` records the instructions, launches the kernel and has the
// figures. `RkInstr` matches its `Instr`.

#define PROG_THREADS 512
static_assert(PROG_THREADS == KV_THREADS, "rk_program runs the attention body, which needs KV_THREADS threads");

struct RkInstr {
    u32 op, a, b, c, d, pad;
    float f0, f1;
    u64 p[8];
};

// Op codes. A qmatmul is PROG_QM + 4·format + 2·gated + norm (format 0 f32, 1 q4_1,
// 2 q8_0); an embedding PROG_EMBED + format.
#define PROG_EMBED 1
#define PROG_ROPE_ATT 8
#define PROG_QM 16

// The grid barrier. `count` counts arrivals, monotonic over the program's launches
// (launch `epoch` passes its k-th barrier at (epoch·barriers + k)·grid), so it is never
// reset. Thread 0 of each block adds its arrival with release semantics and polls with
// acquire; the bar.sync before orders the block's writes before thread 0's release, the
// one after orders thread 0's acquire before the block's reads (scripts/grid_barrier.cu
// measured 1.31 us a barrier on an H100, as cooperative groups' grid.sync(), against
// 2.04 us with a __threadfence on either side).
__device__ __forceinline__ void grid_barrier(unsigned long long* count, unsigned long long target) {
    __syncthreads();
    if (threadIdx.x == 0) {
        asm volatile("red.release.gpu.global.add.u64 [%0], 1;" ::"l"(count) : "memory");
        unsigned long long seen;
        do {
            asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(seen) : "l"(count) : "memory");
        } while (seen < target);
    }
    __syncthreads();
}

// One qmatmul instruction: every warp of the grid takes (row, token tile) items in turn.
template <int F, bool GATED, bool NORM>
__device__ __forceinline__ void prog_qmatmul(const RkInstr& in) {
    const u64 batch = in.a, rows = in.b, cols = in.c;
    const u64 warps = blockDim.x / WARP, gw = blockIdx.x * warps + threadIdx.x / WARP, tw = gridDim.x * warps;
    if (!GATED && batch == 1 && rows > 2 * tw) {
        for (u64 r0 = gw; r0 < rows; r0 += QM_ROWS * tw)
            qmatvec_rows<F, NORM, QM_ROWS>((const u32*)in.p[0], (const float*)in.p[2], (const float*)in.p[3],
                                             in.f0, (float*)in.p[4], rows, cols, (int)in.d, r0, tw);
        return;
    }
    const u64 items = rows * ((batch + QM_TOKENS - 1) / QM_TOKENS);
    for (u64 it = gw; it < items; it += tw)
        qmatmul_row<F, GATED, NORM>((const u32*)in.p[0], (const u32*)in.p[1], (const float*)in.p[2],
                                    (const float*)in.p[3], in.f0, (float*)in.p[4], batch, rows, cols, (int)in.d,
                                    it % rows, it / rows * QM_TOKENS);
}

template <int F>
__device__ __forceinline__ void prog_qm_format(const RkInstr& in, int variant) {
    switch (variant) {
        case 0: prog_qmatmul<F, false, false>(in); break;
        case 1: prog_qmatmul<F, false, true>(in); break;
        case 2: prog_qmatmul<F, true, false>(in); break;
        default: prog_qmatmul<F, true, true>(in); break;
    }
}

#define PROG_SPLIT_KEYS 512

__device__ __forceinline__ void prog_run(const RkInstr& in) {
    if (in.op >= PROG_QM) {
        const int k = (int)(in.op - PROG_QM), variant = k % 4;
        switch (k / 4) {
            case 0: prog_qm_format<0>(in, variant); break;
            case 1: prog_qm_format<1>(in, variant); break;
            default: prog_qm_format<2>(in, variant); break;
        }
    } else if (in.op == PROG_ROPE_ATT) {
        // Split attention: `ns` blocks per query head, each over a slice of the keys, its
        // partial result in p[6] (`part`, hd + 2 floats a block); the last block of a head
        // to finish (counted in p[7]) combines the head's parts into out. Without `part`
        // (or with fewer blocks than two per head), a block per head as rk_rope_attention_kv.
        const u64 heads = in.a, hd = in.c, stride = hd + 2;
        float* part = (float*)in.p[6];
        u32* done = (u32*)in.p[7];
        // Split only where each block still gets PROG_SPLIT_KEYS keys or more: below that
        // the parts' merge costs more than the keys it spreads (H100, 2026-11-27).
        const u64 at = *(const u32*)in.p[1], nkeys = (at < in.d ? at : in.d - 1) + 1;
        u64 ns = part ? gridDim.x / heads : 1;
        if (ns > nkeys / PROG_SPLIT_KEYS) ns = nkeys / PROG_SPLIT_KEYS;
        if (ns > KV_COMBINE) ns = KV_COMBINE;  // what attention_combine merges
        if (ns < 1) ns = 1;
        __shared__ int sh_last;
        for (u64 w = blockIdx.x; w < heads * ns; w += gridDim.x) {
            const u64 h = w / ns;
            rope_attention_kv_body((const float*)in.p[0], (const u32*)in.p[1], (float*)in.p[2], (float*)in.p[3],
                                   (float*)in.p[4], (float*)in.p[5], heads, in.b, hd, in.d, in.f0, in.f1, h,
                                   w % ns, ns, ns > 1 ? part + w * stride : 0);
            if (ns > 1) {
                __threadfence();  // this block's part, device-wide, before its count
                __syncthreads();
                if (threadIdx.x == 0) sh_last = atomicAdd(done + h, 1u) == ns - 1;
                __syncthreads();
                if (sh_last) {
                    __threadfence();
                    attention_combine(part + h * ns * stride, ns, stride, hd, (float*)in.p[5] + h * hd);
                    if (threadIdx.x == 0) done[h] = 0;  // for the next layer, after the grid barrier
                }
            }
            __syncthreads();  // the block's shared memory is reused by its next head
        }
    } else if (in.op >= PROG_EMBED && in.op < PROG_EMBED + 3) {
        const u32* w = (const u32*)in.p[0];
        const u32* ids = (const u32*)in.p[1];
        float* out = (float*)in.p[2];
        switch (in.op - PROG_EMBED) {
            case 0: embedding_body<0>(w, ids, out, in.a, in.b, in.c); break;
            case 1: embedding_body<1>(w, ids, out, in.a, in.b, in.c); break;
            default: embedding_body<2>(w, ids, out, in.a, in.b, in.c); break;
        }
    }
}

__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Runs instructions [0, n) of `prog`, a grid barrier between two. `trace`, when not null, gets
// timestamps (global timer, ns): trace[i] when block 0 starts instruction i (trace[n]:
// when it is done with the last), and trace[n + 1 + i] the latest time a block finished
// its share of instruction i (atomicMax: the host zeroes these before the launch).
extern "C" __global__ void __launch_bounds__(PROG_THREADS, 1)
    rk_program(const RkInstr* __restrict__ prog, u32 n, unsigned long long* count, unsigned long long epoch,
               unsigned long long* trace) {
    const unsigned long long base = epoch * (unsigned long long)(n > 0 ? n - 1 : 0) * gridDim.x;
    const bool lead = blockIdx.x == 0 && threadIdx.x == 0;
    if (trace && lead) trace[0] = global_ns();
    for (u32 i = 0; i < n; i++) {
        const RkInstr in = prog[i];
        prog_run(in);
        if (trace) {
            __syncthreads();
            if (threadIdx.x == 0) atomicMax(trace + n + 1 + i, global_ns());
        }
        if (i + 1 < n) {
            grid_barrier(count, base + (unsigned long long)(i + 1) * gridDim.x);
        }
        if (trace && lead) trace[i + 1] = global_ns();
    }
}
