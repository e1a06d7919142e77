// program.cu: rk_program, a recorded sequence of ops run by one resident grid (appended
// to ops.cu and model.cu, whose op bodies it calls).
//
// A decode step is ~150 small ops; as separate kernels each pays a launch and the drain
// of the one before it, which is most of its time. rk_program runs them all in one
// cooperative launch: every block walks the instruction list, does its share of each
// instruction (the same bodies as the op kernels, over virtual blocks or warps), and the
// grid meets at a barrier before the next instruction. `compute/program.rs` records the
// instructions and launches the kernel; `RkInstr` matches its `Instr`.

#define PROG_THREADS 512
static_assert(PROG_THREADS == KV_THREADS, "rk_program runs the attention body, which needs KV_THREADS threads");

struct RkInstr {
    u32 op, a, b, c, d, flags;
    float f0, f1;
    u64 p[8];
};

// Op codes. A qmatmul is PROG_QM + 4·format + 2·gated + norm (format 0 f32, 1 q4_1,
// 2 q8_0); an embedding PROG_EMBED + format.
#define PROG_EMBED 1
#define PROG_ROPE_ATT 8
#define PROG_QM 16

// Arrival counter of the grid barrier: monotonic over the program's launches (launch
// `epoch` passes its barriers at epoch·barriers·grid + k·grid), so it is never reset.
__device__ __forceinline__ void grid_barrier(unsigned long long* count, unsigned long long target) {
    __syncthreads();  // the block's writes of this instruction are done
    if (threadIdx.x == 0) {
        // Release: the block's writes (ordered before by bar.sync) before the arrival.
        __threadfence();
        asm volatile("red.release.gpu.global.add.u64 [%0], 1;" ::"l"(count) : "memory");
        unsigned long long seen;
        do {
            asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(seen) : "l"(count) : "memory");
        } while (seen < target);
        __threadfence();
    }
    __syncthreads();  // the other threads wait for thread 0's acquire
}

// One qmatmul instruction: every warp of the grid takes (row, token tile) items in turn.
template <int F, bool GATED, bool NORM>
__device__ __forceinline__ void prog_qmatmul(const RkInstr& in) {
    const u64 batch = in.a, rows = in.b, cols = in.c;
    const u64 warps = blockDim.x / WARP, gw = blockIdx.x * warps + threadIdx.x / WARP, tw = gridDim.x * warps;
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

__device__ __forceinline__ void prog_run(const RkInstr& in) {
    if (in.op >= PROG_QM) {
        const int k = (int)(in.op - PROG_QM), variant = k % 4;
        switch (k / 4) {
            case 0: prog_qm_format<0>(in, variant); break;
            case 1: prog_qm_format<1>(in, variant); break;
            default: prog_qm_format<2>(in, variant); break;
        }
    } else if (in.op == PROG_ROPE_ATT) {
        // A block per query head (the heads are few; the other blocks go on to the barrier).
        for (u64 h = blockIdx.x; h < in.a; h += gridDim.x) {
            rope_attention_kv_body((const float*)in.p[0], (const u32*)in.p[1], (float*)in.p[2], (float*)in.p[3],
                                   (float*)in.p[4], (float*)in.p[5], in.a, in.b, in.c, in.d, in.f0, in.f1, h);
            __syncthreads();  // the block's shared memory is reused by the next head
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

// Runs instructions [0, n) of `prog`, a grid barrier between two. `trace`, when not null,
// gets the global timer (ns) after each instruction, from block 0: trace[0] is the start.
extern "C" __global__ void __launch_bounds__(PROG_THREADS, 1)
    rk_program(const RkInstr* __restrict__ prog, u32 n, unsigned long long* count, unsigned long long epoch,
               unsigned long long* trace) {
    const unsigned long long base = epoch * (unsigned long long)(n > 0 ? n - 1 : 0) * gridDim.x;
    const bool tracing = trace != 0 && blockIdx.x == 0 && threadIdx.x == 0;
    if (tracing) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(trace[0]));
    for (u32 i = 0; i < n; i++) {
        const RkInstr in = prog[i];
        prog_run(in);
        if (i + 1 < n) grid_barrier(count, base + (unsigned long long)(i + 1) * gridDim.x);
        if (tracing) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(trace[i + 1]));
    }
}
