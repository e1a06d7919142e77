// ops.cu: the compute ops of the CUDA backend (everything except matmul, which goes
// through cuBLAS). Compiled by NVRTC for the device's own architecture.
//
// Conventions: every buffer is a contiguous row-major f32 array allocated by
// cuMemAllocAsync (256-byte aligned), so float4 access of a whole buffer is aligned.
// Sizes and strides are kernel parameters (nothing is baked in), so a sequence of ops
// can be captured in a CUDA graph and replayed.

typedef unsigned long long u64;

#define WARP 32
#define FULL_MASK 0xffffffffu
#define NEG_INF (-__int_as_float(0x7f800000))
#define POS_INF (__int_as_float(0x7f800000))

// Every kernel of this file and model.cu starts with rk_pdl_enter(). On sm_90 and newer the
// backend launches them with programmatic dependent launch: a kernel may be scheduled
// while the one before it in the stream still runs, so it first waits for that kernel to
// finish and its writes to be visible (griddepcontrol.wait), then lets the next kernel be
// scheduled (launch_dependents): the launch of kernel n+1 overlaps kernel n instead of
// following it. Launched without the attribute (older GPUs, RINGKERNEL_CUDA_PDL=0) both
// instructions do nothing.
//
// Early loads. Every kernel lets the next one be scheduled only after its own wait, so
// when kernel n+1 starts, kernel n-1 and everything before it have finished. Kernel n+1
// may therefore load, before its wait, any operand that kernel n does not write: the
// weights of a matvec, the residual it adds to, the cached keys and values of earlier
// positions. The host knows what the kernel before wrote and passes `early` = 1 only then
// (compute.rs, `early_loads`); such loads go through L2 (ld.global.cg), the point where
// the finished kernels' writes are visible.
__device__ __forceinline__ void rk_pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void rk_pdl_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void rk_pdl_enter() {
    rk_pdl_wait();
    rk_pdl_launch();
}

// ------------------------------------------------------------------ argmax

// out[0] = the index, as u32 bits, of the first largest of x[0..n]; NaNs are passed over
// and a NaN x[0] gives 0 (ringkernel_core's reference::argmax). One block: each thread
// its strided values, then (value, index) pairs through the warps' shuffles and shared
// memory, the larger value or, at a tie, the smaller index winning.
#define ARGMAX_THREADS 1024
__device__ __forceinline__ void argmax_pick(float& best, unsigned& at, float v, unsigned i) {
    if (v > best || (v == best && i < at)) {
        best = v;
        at = i;
    }
}

// The argmax of x[0..n] by one block of ARGMAX_THREADS threads (rk_argmax, and
// rk_greedy_feed_* in model.cu); the result is valid in thread 0 only.
__device__ __forceinline__ unsigned argmax_block(const float* __restrict__ x, u64 n) {
    __shared__ float sv[ARGMAX_THREADS / WARP];
    __shared__ unsigned si[ARGMAX_THREADS / WARP];
    float best = NEG_INF;
    unsigned at = 0xFFFFFFFFu;
    // 8 values a thread in flight at once, then the rest one at a time.
    u64 i = threadIdx.x;
    for (; i + 7 * ARGMAX_THREADS < n; i += 8 * ARGMAX_THREADS) {
        float v[8];
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = x[i + k * ARGMAX_THREADS];
#pragma unroll
        for (int k = 0; k < 8; k++) argmax_pick(best, at, v[k], (unsigned)(i + k * ARGMAX_THREADS));
    }
    for (; i < n; i += ARGMAX_THREADS) argmax_pick(best, at, x[i], (unsigned)i);
    for (int o = WARP / 2; o > 0; o /= 2)
        argmax_pick(best, at, __shfl_down_sync(FULL_MASK, best, o), __shfl_down_sync(FULL_MASK, at, o));
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    if (lane == 0) {
        sv[warp] = best;
        si[warp] = at;
    }
    __syncthreads();
    if (warp == 0) {
        best = lane < ARGMAX_THREADS / WARP ? sv[lane] : NEG_INF;
        at = lane < ARGMAX_THREADS / WARP ? si[lane] : 0xFFFFFFFFu;
        for (int o = WARP / 2; o > 0; o /= 2)
            argmax_pick(best, at, __shfl_down_sync(FULL_MASK, best, o), __shfl_down_sync(FULL_MASK, at, o));
    }
    return x[0] != x[0] || at == 0xFFFFFFFFu ? 0u : at;
}

extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS) rk_argmax(const float* __restrict__ x, u64 n,
                                                                      unsigned* __restrict__ out) {
    rk_pdl_enter();
    const unsigned t = argmax_block(x, n);
    if (threadIdx.x == 0) out[0] = t;
}

// ------------------------------------------------------------------ counters

// words[i] += by (wrapping) for i < n: a counter on the device (ComputeBackend::increment),
// such as a decode step's position, which a recorded step advances at each replay.
extern "C" __global__ void rk_increment(unsigned* __restrict__ words, u64 n, unsigned by) {
    rk_pdl_enter();
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) words[i] += by;
}

// ------------------------------------------------------------------ elementwise

struct OpNeg { __device__ static float f(float x) { return -x; } };
struct OpAbs { __device__ static float f(float x) { return fabsf(x); } };
struct OpSqrt { __device__ static float f(float x) { return sqrtf(x); } };
struct OpExp { __device__ static float f(float x) { return expf(x); } };
struct OpLog { __device__ static float f(float x) { return logf(x); } };
struct OpSin { __device__ static float f(float x) { return sinf(x); } };
struct OpCos { __device__ static float f(float x) { return cosf(x); } };
struct OpTanh { __device__ static float f(float x) { return tanhf(x); } };
struct OpRelu { __device__ static float f(float x) { return x > 0.0f ? x : 0.0f; } };
struct OpSigmoid { __device__ static float f(float x) { return 1.0f / (1.0f + expf(-x)); } };
struct OpSilu { __device__ static float f(float x) { return x / (1.0f + expf(-x)); } };
struct OpGelu {
    __device__ static float f(float x) {
        const float k = 0.7978845608028654f;  // sqrt(2/pi)
        // 0.5·x·(1 + tanh(u)) written as x / (1 + e^(-2u)): the same value, without the
        // cancellation in 1 + tanh(u) for negative x.
        const float u = k * (x + 0.044715f * x * x * x);
        return x / (1.0f + expf(-2.0f * u));
    }
};

struct OpAdd { __device__ static float f(float a, float b) { return a + b; } };
struct OpSub { __device__ static float f(float a, float b) { return a - b; } };
struct OpMul { __device__ static float f(float a, float b) { return a * b; } };
struct OpDiv { __device__ static float f(float a, float b) { return a / b; } };
struct OpMax { __device__ static float f(float a, float b) { return fmaxf(a, b); } };
struct OpMin { __device__ static float f(float a, float b) { return fminf(a, b); } };

template <class Op>
__device__ __forceinline__ void unary_body(const float* __restrict__ x, float* __restrict__ out, u64 n) {
    const u64 n4 = n / 4;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    const float4* x4 = (const float4*)x;
    float4* o4 = (float4*)out;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
        float4 v = x4[i];
        v.x = Op::f(v.x); v.y = Op::f(v.y); v.z = Op::f(v.z); v.w = Op::f(v.w);
        o4[i] = v;
    }
    for (u64 i = n4 * 4 + (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) out[i] = Op::f(x[i]);
}

template <class Op>
__device__ __forceinline__ void binary_body(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ out, u64 n) {
    const u64 n4 = n / 4;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    const float4* a4 = (const float4*)a;
    const float4* b4 = (const float4*)b;
    float4* o4 = (float4*)out;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
        float4 u = a4[i], v = b4[i];
        u.x = Op::f(u.x, v.x); u.y = Op::f(u.y, v.y); u.z = Op::f(u.z, v.z); u.w = Op::f(u.w, v.w);
        o4[i] = u;
    }
    for (u64 i = n4 * 4 + (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) out[i] = Op::f(a[i], b[i]);
}

template <class Op>
__device__ __forceinline__ void scalar_body(const float* __restrict__ a, float s, float* __restrict__ out, u64 n) {
    const u64 n4 = n / 4;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    const float4* a4 = (const float4*)a;
    float4* o4 = (float4*)out;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
        float4 u = a4[i];
        u.x = Op::f(u.x, s); u.y = Op::f(u.y, s); u.z = Op::f(u.z, s); u.w = Op::f(u.w, s);
        o4[i] = u;
    }
    for (u64 i = n4 * 4 + (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) out[i] = Op::f(a[i], s);
}

#define RK_UNARY(name, Op) \
    extern "C" __global__ void rk_unary_##name(const float* __restrict__ x, float* __restrict__ out, u64 n) { rk_pdl_enter(); unary_body<Op>(x, out, n); }
RK_UNARY(neg, OpNeg)
RK_UNARY(abs, OpAbs)
RK_UNARY(sqrt, OpSqrt)
RK_UNARY(exp, OpExp)
RK_UNARY(log, OpLog)
RK_UNARY(sin, OpSin)
RK_UNARY(cos, OpCos)
RK_UNARY(tanh, OpTanh)
RK_UNARY(relu, OpRelu)
RK_UNARY(sigmoid, OpSigmoid)
RK_UNARY(silu, OpSilu)
RK_UNARY(gelu, OpGelu)

#define RK_BINARY(name, Op)                                                                                     \
    extern "C" __global__ void rk_binary_##name(const float* __restrict__ a, const float* __restrict__ b,       \
                                                float* __restrict__ out, u64 n) { rk_pdl_enter(); binary_body<Op>(a, b, out, n); } \
    extern "C" __global__ void rk_scalar_##name(const float* __restrict__ a, float s, float* __restrict__ out,   \
                                                u64 n) { rk_pdl_enter(); scalar_body<Op>(a, s, out, n); }
RK_BINARY(add, OpAdd)
RK_BINARY(sub, OpSub)
RK_BINARY(mul, OpMul)
RK_BINARY(div, OpDiv)
RK_BINARY(max, OpMax)
RK_BINARY(min, OpMin)

struct Silu2 { __device__ static float f(float g, float u) { return g / (1.0f + expf(-g)) * u; } };
extern "C" __global__ void rk_swiglu(const float* __restrict__ gate, const float* __restrict__ up, float* __restrict__ out, u64 n) { rk_pdl_enter();
    binary_body<Silu2>(gate, up, out, n);
}

// ------------------------------------------------------------------ block reductions

// R::A is what one thread accumulates its share in: double for sums (a float running sum
// over millions of elements drifts by parts per million; the sums across threads are
// trees and stay in float), float for max/min. R::f combines two floats, R::acc adds a
// float into an accumulator.
struct RSum {
    typedef double A;
    __device__ static float id() { return 0.0f; }
    __device__ static float f(float a, float b) { return a + b; }
    __device__ static double acc(double a, float b) { return a + (double)b; }
};
struct RMax {
    typedef float A;
    __device__ static float id() { return NEG_INF; }
    __device__ static float f(float a, float b) { return fmaxf(a, b); }
    __device__ static float acc(float a, float b) { return fmaxf(a, b); }
};
struct RMin {
    typedef float A;
    __device__ static float id() { return POS_INF; }
    __device__ static float f(float a, float b) { return fminf(a, b); }
    __device__ static float acc(float a, float b) { return fminf(a, b); }
};

template <class R>
__device__ __forceinline__ float warp_reduce(float v) {
#pragma unroll
    for (int o = WARP / 2; o > 0; o /= 2) v = R::f(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

// Reduces `v` over the block; every thread gets the result. `sh` holds >= 32 floats.
template <class R>
__device__ __forceinline__ float block_reduce(float v, float* sh) {
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, nwarps = (blockDim.x + WARP - 1) / WARP;
    v = warp_reduce<R>(v);
    __syncthreads();  // sh may still be read from a previous call
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    v = lane < nwarps ? sh[lane] : R::id();
    v = warp_reduce<R>(v);
    return v;
}

// One block per row of `x: [rows, cols]`: out[row] = reduce(row) * scale.
template <class R>
__device__ __forceinline__ void reduce_rows_body(const float* __restrict__ x, float* __restrict__ out, u64 rows, u64 cols, float scale) {
    __shared__ float sh[WARP];
    for (u64 row = blockIdx.x; row < rows; row += gridDim.x) {
        const float* r = x + row * cols;
        typename R::A acc = R::id();
        if ((cols & 3) == 0) {
            const float4* r4 = (const float4*)r;
            for (u64 i = threadIdx.x; i < cols / 4; i += blockDim.x) {
                float4 v = r4[i];
                acc = R::acc(R::acc(R::acc(R::acc(acc, v.x), v.y), v.z), v.w);
            }
        } else {
            for (u64 i = threadIdx.x; i < cols; i += blockDim.x) acc = R::acc(acc, r[i]);
        }
        const float total = block_reduce<R>((float)acc, sh);
        if (threadIdx.x == 0) out[row] = total * scale;
    }
}

// Partial reductions of long rows: block (p, row) reduces chunk p of the row into
// partial[row * parts + p].
template <class R>
__device__ __forceinline__ void reduce_partial_body(const float* __restrict__ x, float* __restrict__ partial, u64 cols, u64 parts) {
    __shared__ float sh[WARP];
    const u64 row = blockIdx.y, p = blockIdx.x;
    const u64 chunk = (cols + parts - 1) / parts;
    const u64 begin = p * chunk, end = begin + chunk < cols ? begin + chunk : cols;
    const float* r = x + row * cols;
    typename R::A acc = R::id();
    if ((cols & 3) == 0 && (chunk & 3) == 0) {
        const float4* r4 = (const float4*)(r + begin);
        const u64 n4 = end > begin ? (end - begin) / 4 : 0;
        for (u64 i = threadIdx.x; i < n4; i += blockDim.x) {
            float4 v = r4[i];
            acc = R::acc(R::acc(R::acc(R::acc(acc, v.x), v.y), v.z), v.w);
        }
    } else {
        for (u64 i = begin + threadIdx.x; i < end; i += blockDim.x) acc = R::acc(acc, r[i]);
    }
    const float total = block_reduce<R>((float)acc, sh);
    if (threadIdx.x == 0) partial[row * parts + p] = total;
}

// Reduction over the middle axis of [outer, axis, inner] with inner > 1: one thread per
// (outer, inner) column, coalesced across inner.
template <class R>
__device__ __forceinline__ void reduce_cols_body(const float* __restrict__ x, float* __restrict__ out, u64 outer, u64 axis, u64 inner, float scale) {
    const u64 total = outer * inner;
    for (u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += (u64)gridDim.x * blockDim.x) {
        const u64 o = t / inner, i = t % inner;
        const float* base = x + o * axis * inner + i;
        typename R::A acc = R::id();
        for (u64 a = 0; a < axis; a++) acc = R::acc(acc, base[a * inner]);
        out[t] = (float)acc * scale;
    }
}

#define RK_REDUCE(name, R)                                                                                         \
    extern "C" __global__ void rk_reduce_rows_##name(const float* __restrict__ x, float* __restrict__ out, u64 rows, \
                                                     u64 cols, float scale) { rk_pdl_enter(); reduce_rows_body<R>(x, out, rows, cols, scale); } \
    extern "C" __global__ void rk_reduce_partial_##name(const float* __restrict__ x, float* __restrict__ partial,  \
                                                        u64 cols, u64 parts) { rk_pdl_enter(); reduce_partial_body<R>(x, partial, cols, parts); } \
    extern "C" __global__ void rk_reduce_cols_##name(const float* __restrict__ x, float* __restrict__ out, u64 outer, \
                                                     u64 axis, u64 inner, float scale) { rk_pdl_enter(); reduce_cols_body<R>(x, out, outer, axis, inner, scale); }
RK_REDUCE(sum, RSum)
RK_REDUCE(max, RMax)
RK_REDUCE(min, RMin)

// Dot product, first stage: block p sums a[i]*b[i] over its grid-stride share.
extern "C" __global__ void rk_dot_partial(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ partial, u64 n) { rk_pdl_enter();
    __shared__ float sh[WARP];
    double acc = 0.0;  // see RSum
    const u64 stride = (u64)gridDim.x * blockDim.x;
    const u64 n4 = n / 4;
    const float4* a4 = (const float4*)a;
    const float4* b4 = (const float4*)b;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
        float4 u = a4[i], v = b4[i];
        acc += (double)(u.x * v.x + u.y * v.y + u.z * v.z + u.w * v.w);
    }
    for (u64 i = n4 * 4 + (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) acc += (double)(a[i] * b[i]);
    const float total = block_reduce<RSum>((float)acc, sh);
    if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

// out[m] = A[m, :] . x, one warp per row.
extern "C" __global__ void rk_matvec(const float* __restrict__ A, const float* __restrict__ x, float* __restrict__ out, u64 m, u64 k) { rk_pdl_enter();
    const u64 warps_per_block = blockDim.x / WARP;
    const u64 row = (u64)blockIdx.x * warps_per_block + threadIdx.x / WARP;
    const int lane = threadIdx.x % WARP;
    if (row >= m) return;
    const float* r = A + row * k;
    float acc = 0.0f;
    if ((k & 3) == 0) {
        const float4* r4 = (const float4*)r;
        const float4* x4 = (const float4*)x;
        for (u64 i = lane; i < k / 4; i += WARP) {
            float4 u = r4[i], v = x4[i];
            acc += u.x * v.x + u.y * v.y + u.z * v.z + u.w * v.w;
        }
    } else {
        for (u64 i = lane; i < k; i += WARP) acc += r[i] * x[i];
    }
    acc = warp_reduce<RSum>(acc);
    if (lane == 0) out[row] = acc;
}

// ------------------------------------------------------------------ row ops
//
// One block per row. When the row fits in shared memory (`cached` = 1, dynamic shared
// memory of cols floats), it is read from global memory once and written once;
// otherwise statistics come from a first read pass and the output from a second.

// Online softmax statistics: (m, s) with s = sum exp(x - m).
__device__ __forceinline__ void softmax_combine(float& m, float& s, float m2, float s2) {
    float mn = fmaxf(m, m2);
    if (mn == NEG_INF) { m = mn; s = 0.0f; return; }
    s = s * expf(m - mn) + s2 * expf(m2 - mn);
    m = mn;
}

extern "C" __global__ void rk_softmax(const float* __restrict__ x, float* __restrict__ out, u64 rows, u64 cols, int cached) { rk_pdl_enter();
    extern __shared__ float row_cache[];
    __shared__ float shm[WARP], shs[WARP];
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, nwarps = (blockDim.x + WARP - 1) / WARP;
    for (u64 row = blockIdx.x; row < rows; row += gridDim.x) {
        const float* r = x + row * cols;
        float* o = out + row * cols;
        float m = NEG_INF, s = 0.0f;
        const bool vec = (cols & 3) == 0;
        if (vec) {
            const float4* r4 = (const float4*)r;
            for (u64 i = threadIdx.x; i < cols / 4; i += blockDim.x) {
                float4 v = r4[i];
                if (cached) ((float4*)row_cache)[i] = v;
                float lm = fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w));
                float ls = expf(v.x - lm) + expf(v.y - lm) + expf(v.z - lm) + expf(v.w - lm);
                softmax_combine(m, s, lm, ls);
            }
        } else {
            for (u64 i = threadIdx.x; i < cols; i += blockDim.x) {
                float v = r[i];
                if (cached) row_cache[i] = v;
                softmax_combine(m, s, v, 1.0f);
            }
        }
#pragma unroll
        for (int off = WARP / 2; off > 0; off /= 2) {
            float m2 = __shfl_xor_sync(FULL_MASK, m, off), s2 = __shfl_xor_sync(FULL_MASK, s, off);
            softmax_combine(m, s, m2, s2);
        }
        __syncthreads();
        if (lane == 0) { shm[warp] = m; shs[warp] = s; }
        __syncthreads();
        m = lane < nwarps ? shm[lane] : NEG_INF;
        s = lane < nwarps ? shs[lane] : 0.0f;
#pragma unroll
        for (int off = WARP / 2; off > 0; off /= 2) {
            float m2 = __shfl_xor_sync(FULL_MASK, m, off), s2 = __shfl_xor_sync(FULL_MASK, s, off);
            softmax_combine(m, s, m2, s2);
        }
        const float inv = 1.0f / s;
        const float* src = cached ? row_cache : r;
        if (vec) {
            const float4* s4 = (const float4*)src;
            float4* o4 = (float4*)o;
            for (u64 i = threadIdx.x; i < cols / 4; i += blockDim.x) {
                float4 v = s4[i];
                v.x = expf(v.x - m) * inv; v.y = expf(v.y - m) * inv; v.z = expf(v.z - m) * inv; v.w = expf(v.w - m) * inv;
                o4[i] = v;
            }
        } else {
            for (u64 i = threadIdx.x; i < cols; i += blockDim.x) o[i] = expf(src[i] - m) * inv;
        }
        __syncthreads();  // row_cache is reused by the next row
    }
}

extern "C" __global__ void rk_rms_norm(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ out,
                                       u64 rows, u64 cols, float eps, int cached) { rk_pdl_enter();
    extern __shared__ float row_cache[];
    __shared__ float sh[WARP];
    for (u64 row = blockIdx.x; row < rows; row += gridDim.x) {
        const float* r = x + row * cols;
        float* o = out + row * cols;
        const bool vec = (cols & 3) == 0;
        float ss = 0.0f;
        if (vec) {
            const float4* r4 = (const float4*)r;
            for (u64 i = threadIdx.x; i < cols / 4; i += blockDim.x) {
                float4 v = r4[i];
                if (cached) ((float4*)row_cache)[i] = v;
                ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
            }
        } else {
            for (u64 i = threadIdx.x; i < cols; i += blockDim.x) {
                float v = r[i];
                if (cached) row_cache[i] = v;
                ss += v * v;
            }
        }
        ss = block_reduce<RSum>(ss, sh);
        const float inv = rsqrtf(ss / (float)cols + eps);
        const float* src = cached ? row_cache : r;
        if (vec) {
            const float4* s4 = (const float4*)src;
            const float4* w4 = (const float4*)w;
            float4* o4 = (float4*)o;
            for (u64 i = threadIdx.x; i < cols / 4; i += blockDim.x) {
                float4 v = s4[i], g = w4[i];
                v.x = v.x * inv * g.x; v.y = v.y * inv * g.y; v.z = v.z * inv * g.z; v.w = v.w * inv * g.w;
                o4[i] = v;
            }
        } else {
            for (u64 i = threadIdx.x; i < cols; i += blockDim.x) o[i] = src[i] * inv * w[i];
        }
        __syncthreads();
    }
}

// Welford/Chan combination of (count, mean, M2).
__device__ __forceinline__ void welford_combine(float& n, float& mean, float& m2, float nb, float meanb, float m2b) {
    float nn = n + nb;
    if (nn == 0.0f) return;
    float d = meanb - mean;
    mean += d * (nb / nn);
    m2 += m2b + d * d * (n * nb / nn);
    n = nn;
}

extern "C" __global__ void rk_layer_norm(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b,
                                         float* __restrict__ out, u64 rows, u64 cols, float eps, int cached) { rk_pdl_enter();
    extern __shared__ float row_cache[];
    __shared__ float shn[WARP], shm[WARP], shq[WARP];
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, nwarps = (blockDim.x + WARP - 1) / WARP;
    for (u64 row = blockIdx.x; row < rows; row += gridDim.x) {
        const float* r = x + row * cols;
        float* o = out + row * cols;
        float n = 0.0f, mean = 0.0f, m2 = 0.0f;
        for (u64 i = threadIdx.x; i < cols; i += blockDim.x) {
            float v = r[i];
            if (cached) row_cache[i] = v;
            n += 1.0f;
            float d = v - mean;
            mean += d / n;
            m2 += d * (v - mean);
        }
#pragma unroll
        for (int off = WARP / 2; off > 0; off /= 2) {
            float nb = __shfl_xor_sync(FULL_MASK, n, off), mb = __shfl_xor_sync(FULL_MASK, mean, off),
                  qb = __shfl_xor_sync(FULL_MASK, m2, off);
            welford_combine(n, mean, m2, nb, mb, qb);
        }
        __syncthreads();
        if (lane == 0) { shn[warp] = n; shm[warp] = mean; shq[warp] = m2; }
        __syncthreads();
        n = lane < nwarps ? shn[lane] : 0.0f;
        mean = lane < nwarps ? shm[lane] : 0.0f;
        m2 = lane < nwarps ? shq[lane] : 0.0f;
#pragma unroll
        for (int off = WARP / 2; off > 0; off /= 2) {
            float nb = __shfl_xor_sync(FULL_MASK, n, off), mb = __shfl_xor_sync(FULL_MASK, mean, off),
                  qb = __shfl_xor_sync(FULL_MASK, m2, off);
            welford_combine(n, mean, m2, nb, mb, qb);
        }
        const float inv = rsqrtf(m2 / (float)cols + eps);
        const float* src = cached ? row_cache : r;
        for (u64 i = threadIdx.x; i < cols; i += blockDim.x) o[i] = (src[i] - mean) * inv * w[i] + b[i];
        __syncthreads();
    }
}

// ------------------------------------------------------------------ RoPE

// sin and cos of RoPE's angle pos · base^(-2i/d), in double so long positions keep their
// precision. The angle goes in half-turns to sincospi, whose argument reduction is exact
// and short: sincos has a slow path for large angles (a loop over a local-memory table),
// and ncu counted 1,008 local-memory requests a launch of the decode attention with it
// (H100, position about 300).
__device__ __forceinline__ void rope_sincos(double pos, u64 i, u64 d, float base, double* sn, double* cs) {
    const double inv_freq = exp2(-2.0 * (double)i / (double)d * log2((double)base));
    sincospi(pos * inv_freq * 0.318309886183790671538, sn, cs);  // 1/pi
}

// (x0, x1) rotated by the angle whose sine and cosine are sn, cs, in double.
__device__ __forceinline__ void rope_rotate(float x0, float x1, double sn, double cs, float* y0, float* y1) {
    *y0 = (float)((double)x0 * cs - (double)x1 * sn);
    *y1 = (float)((double)x0 * sn + (double)x1 * cs);
}

// x, out: [seq, heads, head_dim]; one thread per (s, h, i < head_dim/2); the angle by
// rope_sincos.
extern "C" __global__ void rk_rope(const float* __restrict__ x, const float* __restrict__ pos, float* __restrict__ out,
                                   u64 seq, u64 heads, u64 head_dim, float base) { rk_pdl_enter();
    const u64 half = head_dim / 2;
    const u64 total = seq * heads * half;
    for (u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += (u64)gridDim.x * blockDim.x) {
        const u64 i = t % half, sh = t / half, s = sh / heads;
        double sn, cs;
        rope_sincos((double)pos[s], i, head_dim, base, &sn, &cs);
        const float* xr = x + sh * head_dim;
        float* orow = out + sh * head_dim;
        rope_rotate(xr[i], xr[i + half], sn, cs, orow + i, orow + i + half);
    }
}

// ------------------------------------------------------------------ attention

// scores[b, i, j] = scale * q[b, i] . k[b, j]; causal: -inf where j > q_offset + i.
// Block: 32 x 8 threads over (j, i); grid.z = batch-heads.
extern "C" __global__ void rk_attn_scores(const float* __restrict__ q, const float* __restrict__ k, float* __restrict__ out,
                                          u64 q_len, u64 kv_len, u64 kv_stride, u64 head_dim, float scale, int causal,
                                          u64 q_offset) { rk_pdl_enter();
    const u64 bh = blockIdx.z;
    const u64 j = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u64 i = (u64)blockIdx.y * blockDim.y + threadIdx.y;
    if (i >= q_len || j >= kv_len) return;
    float* o = out + (bh * q_len + i) * kv_len + j;
    if (causal && j > q_offset + i) { *o = NEG_INF; return; }
    const float* qr = q + (bh * q_len + i) * head_dim;
    const float* kr = k + (bh * kv_stride + j) * head_dim;
    float acc = 0.0f;
    for (u64 d = 0; d < head_dim; d++) acc += qr[d] * kr[d];
    *o = acc * scale;
}

// out[b, i, d] = sum_j p[b, i, j] * v[b, j, d]. Block: 32 x 8 over (d, i).
extern "C" __global__ void rk_attn_weighted_sum(const float* __restrict__ p, const float* __restrict__ v, float* __restrict__ out,
                                                u64 q_len, u64 kv_len, u64 kv_stride, u64 head_dim) { rk_pdl_enter();
    const u64 bh = blockIdx.z;
    const u64 d = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u64 i = (u64)blockIdx.y * blockDim.y + threadIdx.y;
    if (i >= q_len || d >= head_dim) return;
    const float* pr = p + (bh * q_len + i) * kv_len;
    const float* vb = v + bh * kv_stride * head_dim + d;
    float acc = 0.0f;
    for (u64 j = 0; j < kv_len; j++) acc += pr[j] * vb[j * head_dim];
    out[(bh * q_len + i) * head_dim + d] = acc;
}

// Fused causal/non-causal scaled-dot-product attention, one block of ATT_WARPS warps per
// (batch-head, query row), a single pass over K and V with an online softmax. Each warp
// takes every ATT_WARPS-th key; lanes split the head dimension (head_dim <= 32 *
// ATT_MAXD). The warps' partial (max, sum, accumulator) are merged at the end.
#define ATT_WARPS 4
#define ATT_MAXD 8
extern "C" __global__ void __launch_bounds__(ATT_WARPS * WARP) rk_attention(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v, float* __restrict__ out,
    u64 q_len, u64 kv_len, u64 kv_stride, u64 head_dim, float scale, int causal, u64 q_offset) { rk_pdl_enter();
    __shared__ float sh_m[ATT_WARPS], sh_l[ATT_WARPS];
    __shared__ float sh_acc[ATT_WARPS][WARP * ATT_MAXD];
    const u64 bh = blockIdx.y, i = blockIdx.x;
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    const float* qr = q + (bh * q_len + i) * head_dim;
    float qv[ATT_MAXD], acc[ATT_MAXD];
#pragma unroll
    for (int c = 0; c < ATT_MAXD; c++) {
        const u64 d = (u64)c * WARP + lane;
        qv[c] = d < head_dim ? qr[d] : 0.0f;
        acc[c] = 0.0f;
    }
    u64 limit = kv_len;
    if (causal) {
        const u64 last = q_offset + i + 1;
        if (last < limit) limit = last;
    }
    float m = NEG_INF, l = 0.0f;
    for (u64 j = warp; j < limit; j += ATT_WARPS) {
        const float* kr = k + (bh * kv_stride + j) * head_dim;
        float s = 0.0f;
#pragma unroll
        for (int c = 0; c < ATT_MAXD; c++) {
            const u64 d = (u64)c * WARP + lane;
            if (d < head_dim) s += qv[c] * kr[d];
        }
        s = warp_reduce<RSum>(s) * scale;
        const float mn = fmaxf(m, s);
        const float corr = expf(m - mn);  // 0 when m was -inf
        const float pj = expf(s - mn);
        l = l * corr + pj;
        const float* vr = v + (bh * kv_stride + j) * head_dim;
#pragma unroll
        for (int c = 0; c < ATT_MAXD; c++) {
            const u64 d = (u64)c * WARP + lane;
            acc[c] = acc[c] * corr + (d < head_dim ? pj * vr[d] : 0.0f);
        }
        m = mn;
    }
    if (lane == 0) { sh_m[warp] = m; sh_l[warp] = l; }
#pragma unroll
    for (int c = 0; c < ATT_MAXD; c++) sh_acc[warp][c * WARP + lane] = acc[c];
    __syncthreads();
    if (warp == 0) {
        float gm = NEG_INF;
        for (int w = 0; w < ATT_WARPS; w++) gm = fmaxf(gm, sh_m[w]);
        float gl = 0.0f;
        float f[ATT_WARPS];
        for (int w = 0; w < ATT_WARPS; w++) {
            f[w] = sh_m[w] == NEG_INF ? 0.0f : expf(sh_m[w] - gm);
            gl += sh_l[w] * f[w];
        }
        const float inv = gl > 0.0f ? 1.0f / gl : 0.0f;
        float* o = out + (bh * q_len + i) * head_dim;
#pragma unroll
        for (int c = 0; c < ATT_MAXD; c++) {
            const u64 d = (u64)c * WARP + lane;
            if (d < head_dim) {
                float a = 0.0f;
                for (int w = 0; w < ATT_WARPS; w++) a += sh_acc[w][c * WARP + lane] * f[w];
                o[d] = a * inv;
            }
        }
    }
}
