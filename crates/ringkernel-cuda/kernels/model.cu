// model.cu: the ops a language model needs, appended to ops.cu (whose helpers it uses:
// u64, WARP, FULL_MASK, NEG_INF, warp_reduce) and compiled with it by NVRTC.
//
// * rk_convert: f32/f16/bf16 (and u32) conversions on the buffers' 32-bit words (two
//   half-precision elements per word, element 2w in the low half), integer arithmetic on
//   the bits so every backend gets the same results (round to nearest even).
// * rk_broadcast_<op>: binary ops under numpy broadcasting, by strides.
// * rk_qmatmul_<format>[_swiglu], rk_embedding_<format>: weight matrices stored in blocks
//   of 32 values (f32: 32 words; q4_1: 5 words = d, m halves + 16 bytes of nibbles; q8_0:
//   9 words = d + 32 signed bytes), used without dequantizing them first.
// * rk_rope_kv, rk_attention_kv: RoPE into a KV cache and grouped-query attention over
//   it; the positions are read from device memory, so a captured decode step replays at
//   any position.

typedef unsigned int u32;

// ------------------------------------------------------------------ half precision

__device__ __forceinline__ float half_value(u32 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((unsigned short)(h & 0xFFFFu)));
    return f;
}

// The same bit algorithms as kernels/half.wgsl of the WGSL kernels (and the `half` crate
// on the CPU), so NaN payloads agree too.
__device__ __forceinline__ u32 f16_to_f32_bits(u32 h) {
    const u32 sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    if (e == 0x1Fu) return m == 0 ? (sign | 0x7F800000u) : (sign | 0x7FC00000u | (m << 13));
    if (e == 0) {
        if (m == 0) return sign;
        const u32 k = __clz(m) - 22;
        const u32 mm = (m << (k + 1)) & 0x3FFu;
        return sign | ((112u - k) << 23) | (mm << 13);
    }
    return sign | ((e + 112u) << 23) | (m << 13);
}

__device__ __forceinline__ u32 f32_to_f16_bits(u32 x) {
    const u32 sign = (x >> 16) & 0x8000u, e = (x >> 23) & 0xFFu, m = x & 0x7FFFFFu;
    if (e == 0xFFu) return sign | 0x7C00u | (m != 0 ? (0x200u | (m >> 13)) : 0u);
    const int he = (int)e - 127 + 15;
    if (he >= 31) return sign | 0x7C00u;
    if (he <= 0) {
        if (14 - he > 24) return sign;
        const u32 mf = m | 0x800000u, shift = (u32)(14 - he);
        u32 hm = mf >> shift;
        const u32 round_bit = 1u << (shift - 1);
        if ((mf & round_bit) != 0 && (mf & (3u * round_bit - 1u)) != 0) hm += 1;
        return sign | hm;
    }
    const u32 v = sign | ((u32)he << 10) | (m >> 13);
    return ((m & 0x1000u) != 0 && (m & 0x2FFFu) != 0) ? v + 1 : v;
}

__device__ __forceinline__ u32 f32_to_bf16_bits(u32 x) {
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) return (x >> 16) | 0x40u;
    const u32 v = x >> 16;
    return ((x & 0x8000u) != 0 && (x & 0x17FFFu) != 0) ? v + 1 : v;
}

// Element i of `a` (type code 0 f32, 1 f16, 2 bf16, 3 u32) as f32 bits.
__device__ __forceinline__ u32 load_bits(const u32* a, int from, u64 i) {
    if (from == 1) return f16_to_f32_bits((a[i / 2] >> (16 * (i % 2))) & 0xFFFFu);
    if (from == 2) return ((a[i / 2] >> (16 * (i % 2))) & 0xFFFFu) << 16;
    return a[i];
}

// One thread per output word.
extern "C" __global__ void rk_convert(const u32* __restrict__ a, u32* __restrict__ out, u64 len, u64 words,
                                      int from, int to) { rk_pdl_enter();
    for (u64 w = (u64)blockIdx.x * blockDim.x + threadIdx.x; w < words; w += (u64)gridDim.x * blockDim.x) {
        if (to == 0 || to == 3) {
            out[w] = load_bits(a, from, w);
            continue;
        }
        const u64 e0 = 2 * w;
        u32 lo, hi = 0;
        if (from == to) {
            lo = a[w] & 0xFFFFu;
            hi = a[w] >> 16;
        } else {
            const u32 b0 = load_bits(a, from, e0);
            lo = to == 1 ? f32_to_f16_bits(b0) : f32_to_bf16_bits(b0);
            if (e0 + 1 < len) {
                const u32 b1 = load_bits(a, from, e0 + 1);
                hi = to == 1 ? f32_to_f16_bits(b1) : f32_to_bf16_bits(b1);
            }
        }
        if (e0 + 1 >= len) hi = 0;
        out[w] = lo | (hi << 16);
    }
}

// ------------------------------------------------------------------ broadcasting

#define BCAST_RANK 8
struct BroadcastDims {
    u64 rank, len;
    u64 shape[BCAST_RANK], a_strides[BCAST_RANK], b_strides[BCAST_RANK];
};

template <class Op>
__device__ __forceinline__ void broadcast_body(const float* __restrict__ a, const float* __restrict__ b,
                                               float* __restrict__ out, const BroadcastDims& d) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < d.len; i += (u64)gridDim.x * blockDim.x) {
        u64 rest = i, ia = 0, ib = 0;
        for (int k = (int)d.rank - 1; k >= 0; k--) {
            const u64 c = rest % d.shape[k];
            rest /= d.shape[k];
            ia += c * d.a_strides[k];
            ib += c * d.b_strides[k];
        }
        out[i] = Op::f(a[ia], b[ib]);
    }
}

#define BROADCAST(name, Op)                                                                                     \
    extern "C" __global__ void rk_broadcast_##name(const float* __restrict__ a, const float* __restrict__ b,    \
                                                   float* __restrict__ out, BroadcastDims d) { rk_pdl_enter();                   \
        broadcast_body<Op>(a, b, out, d);                                                                       \
    }
BROADCAST(add, OpAdd)
BROADCAST(sub, OpSub)
BROADCAST(mul, OpMul)
BROADCAST(div, OpDiv)
BROADCAST(max, OpMax)
BROADCAST(min, OpMin)

// ------------------------------------------------------------------ block-format weights

// Words per block of 32 values (WORDS), and words of one octet that a dot product reads
// (OCT: f32 the octet's 8 values; q4_1 and q8_0 the scale word and two words of quants).
template <int F> struct Fmt;
template <> struct Fmt<0> { static const int WORDS = 32, OCT = 8; };
template <> struct Fmt<1> { static const int WORDS = 5, OCT = 3; };
template <> struct Fmt<2> { static const int WORDS = 9, OCT = 3; };

// A weight word, through L2 only (CG: the early loads, see rk_pdl_wait in ops.cu) or the
// default path.
template <bool CG>
__device__ __forceinline__ u32 weight_word(const u32* p) { return CG ? __ldcg(p) : *p; }

// The Fmt<F>::OCT words of octet o of the block at blk into r (octet o holds the block's
// values 8o..8o+7).
template <int F, bool CG>
__device__ __forceinline__ void octet_load(const u32* __restrict__ blk, int o, u32* r) {
    if (F == 0) {
        const uint4 a = CG ? __ldcg((const uint4*)(blk + 8 * o)) : *(const uint4*)(blk + 8 * o);
        const uint4 b = CG ? __ldcg((const uint4*)(blk + 8 * o + 4)) : *(const uint4*)(blk + 8 * o + 4);
        r[0] = a.x; r[1] = a.y; r[2] = a.z; r[3] = a.w;
        r[4] = b.x; r[5] = b.y; r[6] = b.z; r[7] = b.w;
    } else {
        // q4_1: octets 0/1 are the low nibbles of bytes 0-7 / 8-15, octets 2/3 the high
        // nibbles of the same bytes; q8_0: the bytes of octet o are words 1 + 2o, 2 + 2o.
        const int at = F == 1 ? 1 + 2 * (o & 1) : 1 + 2 * o;
        r[0] = weight_word<CG>(blk);
        r[1] = weight_word<CG>(blk + at);
        r[2] = weight_word<CG>(blk + at + 1);
    }
}

// Signed byte k (0..3) of w.
__device__ __forceinline__ float sbyte(u32 w, int k) { return (float)(((int)(w << (24 - 8 * k))) >> 24); }

// Σ_j W[octet o][j] · x[j] for the 8 values x0, x1, from the octet's words r (octet_load).
template <int F>
__device__ __forceinline__ float octet_dot_words(const u32* r, int o, float4 x0, float4 x1) {
    if (F == 0) {
        float s = __uint_as_float(r[0]) * x0.x;
        s = fmaf(__uint_as_float(r[1]), x0.y, s); s = fmaf(__uint_as_float(r[2]), x0.z, s);
        s = fmaf(__uint_as_float(r[3]), x0.w, s); s = fmaf(__uint_as_float(r[4]), x1.x, s);
        s = fmaf(__uint_as_float(r[5]), x1.y, s); s = fmaf(__uint_as_float(r[6]), x1.z, s);
        s = fmaf(__uint_as_float(r[7]), x1.w, s);
        return s;
    }
    const u32 wa = r[1], wb = r[2];
    float q = 0.0f;
    if (F == 1) {
        // d·Σ nib·x + m·Σ x.
        const int sh = o >= 2 ? 4 : 0;
        q = fmaf((float)((wa >> sh) & 0xFu), x0.x, q);
        q = fmaf((float)((wa >> (8 + sh)) & 0xFu), x0.y, q);
        q = fmaf((float)((wa >> (16 + sh)) & 0xFu), x0.z, q);
        q = fmaf((float)((wa >> (24 + sh)) & 0xFu), x0.w, q);
        q = fmaf((float)((wb >> sh) & 0xFu), x1.x, q);
        q = fmaf((float)((wb >> (8 + sh)) & 0xFu), x1.y, q);
        q = fmaf((float)((wb >> (16 + sh)) & 0xFu), x1.z, q);
        q = fmaf((float)((wb >> (24 + sh)) & 0xFu), x1.w, q);
        const float xs = ((x0.x + x0.y) + (x0.z + x0.w)) + ((x1.x + x1.y) + (x1.z + x1.w));
        return fmaf(half_value(r[0]), q, half_value(r[0] >> 16) * xs);
    }
    // q8_0: d·Σ q·x.
    q = fmaf(sbyte(wa, 0), x0.x, q);
    q = fmaf(sbyte(wa, 1), x0.y, q);
    q = fmaf(sbyte(wa, 2), x0.z, q);
    q = fmaf(sbyte(wa, 3), x0.w, q);
    q = fmaf(sbyte(wb, 0), x1.x, q);
    q = fmaf(sbyte(wb, 1), x1.y, q);
    q = fmaf(sbyte(wb, 2), x1.z, q);
    q = fmaf(sbyte(wb, 3), x1.w, q);
    return half_value(r[0]) * q;
}

// Σ_j W[octet o of the block at blk][j] · x[j] for the 8 values x0, x1.
template <int F>
__device__ __forceinline__ float octet_dot(const u32* __restrict__ blk, int o, float4 x0, float4 x1) {
    u32 r[Fmt<F>::OCT];
    octet_load<F, false>(blk, o, r);
    return octet_dot_words<F>(r, o, x0, x1);
}

#define QM_WARPS 4
#define QM_TOKENS 4
#define QM_OCTETS 4

// out[t, r] (+)= Σ_c W[r, c]·x[t, c] (GATED: silu(W·x)·(W2·x)). A warp per row of W, the
// lanes taking the row's octets in turn; QM_TOKENS tokens per block (grid y), so a
// token tile reads each weight once. x rows are 16-byte aligned: cols is a multiple of
// 32 and buffers are 256-byte aligned. NORM: x is first RMS-normalised with the weights g
// (rms_norm fused in): each warp sums its tokens' x² from the values it reads anyway,
// multiplies x by g on the fly and the sums by 1/rms at the end (the scale is common to
// a whole row).
//
// qmatmul_row is one warp's work: `row` of W for the tokens t0.. t0 + QM_TOKENS - 1. x and
// out are not __restrict__: inside rk_program (program.cu) an earlier instruction of the
// same kernel wrote x, so its loads must not take the read-only (non-coherent) path.
//
// A lane's first QmPre<F, PDL>::N octets (lane, lane + WARP, ...: a row of up to 1,536 quantised
// or 512 f32 columns) have their weight words loaded at once, into registers, and so has
// the output a row adds to; with PDL (an op kernel) they are loaded before the wait on the
// kernel before when `early` (see rk_pdl_wait in ops.cu), so a decode step's matvec meets
// only the latency of its input x after that wait. Octets past those go in rounds of
// QM_OCTETS.
// Inside rk_program (PDL false) none are: its 128 registers a thread would spill.
template <int F, bool PDL> struct QmPre { static const int N = !PDL ? 0 : F == 0 ? 2 : 6; };

// One octet (words r, and r2 of the gate's second matrix) against QM_TOKENS tokens' x.
template <int F, bool GATED, bool NORM>
// copy: when not null, x's values are also stored there (the row-0 warp of
// rk_qmatmul_norm_copy_*: the values it loads anyway).
__device__ __forceinline__ void qm_octet(const u32* r, const u32* r2, const float* x, const float* __restrict__ g,
                                         u64 cols, u64 blk, int o, u64 t0, int nt, float* acc, float* acc2,
                                         float* ss, float* copy) {
    float4 g0, g1;
    if (NORM) {
        g0 = *(const float4*)(g + blk * 32 + o * 8);
        g1 = *(const float4*)(g + blk * 32 + o * 8 + 4);
    }
#pragma unroll
    for (int t = 0; t < QM_TOKENS; t++) {
        if (t < nt) {
            const float* xt = x + (t0 + t) * cols + blk * 32 + o * 8;
            float4 x0 = *(const float4*)xt, x1 = *(const float4*)(xt + 4);
            if (copy) {
                float* ct = copy + (xt - x);
                *(float4*)ct = x0;
                *(float4*)(ct + 4) = x1;
            }
            if (NORM) {
                ss[t] += x0.x * x0.x + x0.y * x0.y + x0.z * x0.z + x0.w * x0.w;
                ss[t] += x1.x * x1.x + x1.y * x1.y + x1.z * x1.z + x1.w * x1.w;
                x0 = make_float4(x0.x * g0.x, x0.y * g0.y, x0.z * g0.z, x0.w * g0.w);
                x1 = make_float4(x1.x * g1.x, x1.y * g1.y, x1.z * g1.z, x1.w * g1.w);
            }
            acc[t] += octet_dot_words<F>(r, o, x0, x1);
            if (GATED) acc2[t] += octet_dot_words<F>(r2, o, x0, x1);
        }
    }
}

//
// The result of token t goes to out[t·rows + at] (at: the row itself unless given), and
// also to keep[...] when keep is not null (a second copy of a residual stream); with copy,
// the warp stores the x rows it reads there (qm_octet).
template <int F, bool GATED, bool NORM, bool PDL = false>
__device__ __forceinline__ void qmatmul_row(const u32* __restrict__ w, const u32* __restrict__ w2,
                                            const float* x, const float* __restrict__ g, float eps,
                                            float* out, u64 batch, u64 rows, u64 cols, int accumulate,
                                            u64 row, u64 t0, int early = 0, float* keep = 0, u64 at = ~0ull,
                                            float* copy = 0) {
    if (at == ~0ull) at = row;
    const int lane = threadIdx.x % WARP;
    const int nt = (int)(batch - t0 < QM_TOKENS ? batch - t0 : QM_TOKENS);
    const u64 nb = cols / 32, noct = nb * 4;
    const u32* wr = w + row * nb * Fmt<F>::WORDS;
    const u32* ur = GATED ? w2 + row * nb * Fmt<F>::WORDS : wr;
    const int NP = QmPre<F, PDL>::N;
    if (PDL && !early) rk_pdl_enter();
    u32 pw[NP > 0 ? NP : 1][Fmt<F>::OCT], pu[GATED && NP > 0 ? NP : 1][Fmt<F>::OCT];
    float old[QM_TOKENS];
#pragma unroll
    for (int k = 0; k < NP; k++) {
        const u64 oc = lane + (u64)k * WARP;
        if (oc < noct) {
            octet_load<F, true>(wr + (oc / 4) * Fmt<F>::WORDS, (int)(oc % 4), pw[k]);
            if (GATED) octet_load<F, true>(ur + (oc / 4) * Fmt<F>::WORDS, (int)(oc % 4), pu[GATED ? k : 0]);
        }
    }
#pragma unroll
    for (int t = 0; t < QM_TOKENS; t++) old[t] = accumulate && lane == 0 && t < nt ? __ldcg(out + (t0 + t) * rows + row) : 0.0f;
    if (PDL && early) rk_pdl_enter();
    // ss: Σx² of the values this lane's octets cover; the warp's octets cover the row
    // once, so the warp's sum is the row's, with no pass of its own.
    float acc[QM_TOKENS], acc2[QM_TOKENS], ss[QM_TOKENS];
#pragma unroll
    for (int t = 0; t < QM_TOKENS; t++) acc[t] = acc2[t] = ss[t] = 0.0f;
#pragma unroll
    for (int k = 0; k < NP; k++) {
        const u64 oc = lane + (u64)k * WARP;
        if (oc < noct)
            qm_octet<F, GATED, NORM>(pw[k], pu[GATED ? k : 0], x, g, cols, oc / 4, (int)(oc % 4), t0, nt, acc, acc2,
                                     ss, copy);
    }
    // QM_OCTETS octets a lane per round, unrolled so that their loads go out together.
#pragma unroll 1
    for (u64 oc0 = (u64)NP * WARP + lane; oc0 < noct; oc0 += WARP * QM_OCTETS)
#pragma unroll
    for (int k = 0; k < QM_OCTETS; k++) {
        const u64 oc = oc0 + (u64)k * WARP;
        if (oc < noct) {
            u32 r[Fmt<F>::OCT], r2[Fmt<F>::OCT];
            octet_load<F, false>(wr + (oc / 4) * Fmt<F>::WORDS, (int)(oc % 4), r);
            if (GATED) octet_load<F, false>(ur + (oc / 4) * Fmt<F>::WORDS, (int)(oc % 4), r2);
            qm_octet<F, GATED, NORM>(r, r2, x, g, cols, oc / 4, (int)(oc % 4), t0, nt, acc, acc2, ss, copy);
        }
    }
#pragma unroll
    for (int t = 0; t < QM_TOKENS; t++) {
        const float inv = NORM ? rsqrtf(warp_reduce<RSum>(ss[t]) / (float)cols + eps) : 1.0f;
        acc[t] = warp_reduce<RSum>(acc[t]) * inv;
        if (GATED) acc2[t] = warp_reduce<RSum>(acc2[t]) * inv;
    }
    if (lane == 0) {
#pragma unroll
        for (int t = 0; t < QM_TOKENS; t++) {
            if (t < nt) {
                float v = acc[t];
                if (GATED) v = v / (1.0f + expf(-v)) * acc2[t];
                v = accumulate ? old[t] + v : v;
                out[(t0 + t) * rows + at] = v;
                if (keep) keep[(t0 + t) * rows + at] = v;
            }
        }
    }
}

// An op kernel's rows (rk_qmatmul_*): `early` as in qmatmul_row.
template <int F, bool GATED, bool NORM>
__device__ __forceinline__ void qmatmul_body(const u32* __restrict__ w, const u32* __restrict__ w2,
                                             const float* __restrict__ x, const float* __restrict__ g, float eps,
                                             float* __restrict__ out, u64 batch, u64 rows, u64 cols, int accumulate,
                                             int early, float* __restrict__ keep = 0, float* copy = 0) {
    const u64 row = (u64)blockIdx.x * QM_WARPS + threadIdx.x / WARP;
    if (row >= rows) return;
    qmatmul_row<F, GATED, NORM, true>(w, w2, x, g, eps, out, batch, rows, cols, accumulate, row,
                                      (u64)blockIdx.y * QM_TOKENS, early, keep, ~0ull, row == 0 ? copy : 0);
}

// rk_qmatmul_<format>[_swiglu], and rk_qmatmul_norm_<format>[_swiglu] with the RMSNorm
// (weights g, epsilon eps) fused in. `early`: see qmatmul_row. rk_qmatmul_keep_<format>
// also writes its output to keep, rk_qmatmul_norm_copy_<format> its input x to copy (the
// decoder layer's second copy of the residual stream).
#define QMATMUL(name, F)                                                                                          \
    extern "C" __global__ void __launch_bounds__(QM_WARPS * WARP) rk_qmatmul_##name(                                \
        const u32* __restrict__ w, const float* __restrict__ x, float* __restrict__ out, u64 batch, u64 rows,     \
        u64 cols, int accumulate, int early) {                                                                    \
        qmatmul_body<F, false, false>(w, w, x, x, 0.0f, out, batch, rows, cols, accumulate, early);               \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(QM_WARPS * WARP) rk_qmatmul_keep_##name(                           \
        const u32* __restrict__ w, const float* __restrict__ x, float* __restrict__ out, u64 batch, u64 rows,     \
        u64 cols, int accumulate, int early, float* __restrict__ keep) {                                          \
        qmatmul_body<F, false, false>(w, w, x, x, 0.0f, out, batch, rows, cols, accumulate, early, keep);         \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(QM_WARPS * WARP) rk_qmatmul_##name##_swiglu(                       \
        const u32* __restrict__ w, const u32* __restrict__ w2, const float* __restrict__ x, float* __restrict__ out, \
        u64 batch, u64 rows, u64 cols, int accumulate, int early) {                                               \
        qmatmul_body<F, true, false>(w, w2, x, x, 0.0f, out, batch, rows, cols, accumulate, early);               \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(QM_WARPS * WARP) rk_qmatmul_norm_##name(                           \
        const u32* __restrict__ w, const float* __restrict__ x, const float* __restrict__ g, float eps,           \
        float* __restrict__ out, u64 batch, u64 rows, u64 cols, int accumulate, int early) {                      \
        qmatmul_body<F, false, true>(w, w, x, g, eps, out, batch, rows, cols, accumulate, early);                 \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(QM_WARPS * WARP) rk_qmatmul_norm_copy_##name(                      \
        const u32* __restrict__ w, const float* __restrict__ x, const float* __restrict__ g, float eps,           \
        float* __restrict__ out, u64 batch, u64 rows, u64 cols, int accumulate, int early,                        \
        float* __restrict__ copy) {                                                                               \
        qmatmul_body<F, false, true>(w, w, x, g, eps, out, batch, rows, cols, accumulate, early, 0, copy);        \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(QM_WARPS * WARP) rk_qmatmul_norm_##name##_swiglu(                  \
        const u32* __restrict__ w, const u32* __restrict__ w2, const float* __restrict__ x,                       \
        const float* __restrict__ g, float eps, float* __restrict__ out, u64 batch, u64 rows, u64 cols,           \
        int accumulate, int early) {                                                                              \
        qmatmul_body<F, true, true>(w, w2, x, g, eps, out, batch, rows, cols, accumulate, early);                 \
    }
QMATMUL(f32, 0)
QMATMUL(q4_1, 1)
QMATMUL(q8_0, 2)

// A decoder layer's feed-forward block for one token in one kernel:
//   out[r] += Σ_j Wd[r, j] · silu((G·n(x))[j]) · (U·n(x))[j],   n(x) = rms_norm(x, g)
// Block b computes the 8 hidden values [8b, 8b + 8) (one octet of Wd's columns), a warp
// each as rk_qmatmul_norm_*_swiglu does, into shared memory; then every thread takes rows
// r = tid, tid + FF_THREADS, ... of Wd against those 8 values and adds its product to
// out[r] with a reduction (red.global.add: the blocks' shares land in no fixed order, so
// the sum's last bits vary from run to run). out must not be x: other blocks may still be
// reading x. With `early`, the block's weights (gate, up, and its octet of each row of
// Wd, the first FF_PRE rows a thread) are loaded before the wait on the kernel ahead.
#define FF_THREADS 256
#define FF_PRE 3
template <int F>
__device__ __forceinline__ void ffn_body(const u32* __restrict__ wg, const u32* __restrict__ wu,
                                         const u32* __restrict__ wd, const float* __restrict__ x,
                                         const float* __restrict__ g, float eps, float* __restrict__ out, u64 dim,
                                         u64 hidden, int early) {
    __shared__ __align__(16) float sh_h[FF_THREADS / WARP];
    const int tid = threadIdx.x, warp = tid / WARP;
    const u64 b = blockIdx.x, nbd = hidden / 32, blk = b / 4;
    const int o = (int)(b % 4);
    if (!early) rk_pdl_enter();
    u32 dw[FF_PRE][Fmt<F>::OCT];
#pragma unroll
    for (int k = 0; k < FF_PRE; k++) {
        const u64 r = tid + (u64)k * FF_THREADS;
        if (r < dim) octet_load<F, true>(wd + (r * nbd + blk) * Fmt<F>::WORDS, o, dw[k]);
    }
    // (with early = 0 the wait above already happened; a second one returns at once)
    qmatmul_row<F, true, true, true>(wg, wu, x, g, eps, sh_h, 1, hidden, dim, 0, b * (FF_THREADS / WARP) + warp, 0,
                                     1, 0, (u64)warp);
    __syncthreads();
    const float4 h0 = *(const float4*)sh_h, h1 = *(const float4*)(sh_h + 4);
#pragma unroll
    for (int k = 0; k < FF_PRE; k++) {
        const u64 r = tid + (u64)k * FF_THREADS;
        if (r < dim) atomicAdd(out + r, octet_dot_words<F>(dw[k], o, h0, h1));
    }
#pragma unroll 1
    for (u64 r = tid + (u64)FF_PRE * FF_THREADS; r < dim; r += FF_THREADS)
        atomicAdd(out + r, octet_dot<F>(wd + (r * nbd + blk) * Fmt<F>::WORDS, o, h0, h1));
}

#define FFN(name, F)                                                                                            \
    extern "C" __global__ void __launch_bounds__(FF_THREADS) rk_ffn_##name(                                     \
        const u32* __restrict__ wg, const u32* __restrict__ wu, const u32* __restrict__ wd,                     \
        const float* __restrict__ x, const float* __restrict__ g, float eps, float* __restrict__ out, u64 dim,  \
        u64 hidden, int early) {                                                                                \
        ffn_body<F>(wg, wu, wd, x, g, eps, out, dim, hidden, early);                                            \
    }
FFN(f32, 0)
FFN(q4_1, 1)
FFN(q8_0, 2)

// A group of n blocks meets here: each goes past only after all n reached it. Thread 0
// takes a ticket from a 64-bit count that is never reset (the group's blocks of one call
// take tickets [k·n, k·n + n)) and waits for the call's last. The barrier before orders
// the block's writes (reductions included) before the ticket's release, and the one after
// orders the acquire before the block's reads. Every block of the group must be resident
// at once (the host checks).
__device__ __forceinline__ void ticket_meet(unsigned long long* ticket, unsigned long long n) {
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned long long t, now;
        asm volatile("atom.acq_rel.gpu.global.add.u64 %0, [%1], 1;" : "=l"(t) : "l"(ticket) : "memory");
        const unsigned long long target = t - t % n + n;
        do {
            asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(now) : "l"(ticket) : "memory");
        } while (now < target);
    }
    __syncthreads();
}

// Every block of the grid meets (ticket_meet over the whole grid; the host checks the
// occupancy).
__device__ __forceinline__ void grid_meet(unsigned long long* ticket) { ticket_meet(ticket, gridDim.x); }

// rk_ffn_<format> of one decoder layer, then the next layer's norm + QKV matvec in the
// same kernel (after grid_meet: it needs every block's share of out): warp w of block b
// takes row 8b + w of Wq (rows_q ≤ the grid's warps, which the host checks: a loop over
// further rows measured 23 µs a decode step slower), normalised with gq, the row-0 warp
// also copying out into copy (as rk_qmatmul_norm_copy_*: the next attention adds to
// both). Each warp prefetches its Wq row into L2 first. x (the FFN's input) and copy may be one buffer:
// every block has read x before the meeting.
template <int F, int FQ>
__device__ __forceinline__ void ffn_qkv_body(const u32* __restrict__ wg, const u32* __restrict__ wu,
                                             const u32* __restrict__ wd, const float* x, const float* __restrict__ g,
                                             float eps, float* out, u64 dim, u64 hidden, int early,
                                             const u32* __restrict__ wq, const float* __restrict__ gq, float* qkv,
                                             u64 rows_q, float* copy, unsigned long long* ticket) {
    const u64 row = (u64)blockIdx.x * (FF_THREADS / WARP) + threadIdx.x / WARP;
    const int lane = threadIdx.x % WARP;
    if (row < rows_q) {
        const u64 bytes = dim / 32 * Fmt<FQ>::WORDS * 4;
        const char* base = (const char*)(wq + row * (dim / 32) * Fmt<FQ>::WORDS);
        for (u64 off = (u64)lane * 128; off < bytes; off += WARP * 128)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(base + off));
    }
    ffn_body<F>(wg, wu, wd, x, g, eps, out, dim, hidden, early);
    grid_meet(ticket);
    if (row < rows_q)
        qmatmul_row<FQ, false, true, false>(wq, wq, out, gq, eps, qkv, 1, rows_q, dim, 0, row, 0, 0, 0, ~0ull,
                                            row == 0 ? copy : 0);
}

#define FFN_QKV(name, F, nameq, FQ)                                                                             \
    extern "C" __global__ void __launch_bounds__(FF_THREADS) rk_ffn_qkv_##name##_##nameq(                       \
        const u32* __restrict__ wg, const u32* __restrict__ wu, const u32* __restrict__ wd, const float* x,     \
        const float* __restrict__ g, float eps, float* out, u64 dim, u64 hidden, int early,                     \
        const u32* __restrict__ wq, const float* __restrict__ gq, float* qkv, u64 rows_q, float* copy,          \
        unsigned long long* ticket) {                                                                           \
        ffn_qkv_body<F, FQ>(wg, wu, wd, x, g, eps, out, dim, hidden, early, wq, gq, qkv, rows_q, copy, ticket); \
    }
FFN_QKV(f32, 0, f32, 0)
FFN_QKV(f32, 0, q4_1, 1)
FFN_QKV(f32, 0, q8_0, 2)
FFN_QKV(q4_1, 1, f32, 0)
FFN_QKV(q4_1, 1, q4_1, 1)
FFN_QKV(q4_1, 1, q8_0, 2)
FFN_QKV(q8_0, 2, f32, 0)
FFN_QKV(q8_0, 2, q4_1, 1)
FFN_QKV(q8_0, 2, q8_0, 2)

// The 8 values of x at octet o of block blk into x0, x1; with NORM multiplied by the
// norm's weights g, their squares (before) added to ss.
template <bool NORM>
__device__ __forceinline__ void octet_x(const float* x, const float* __restrict__ g, u64 blk, int o, float4& x0,
                                        float4& x1, float& ss) {
    x0 = *(const float4*)(x + blk * 32 + o * 8);
    x1 = *(const float4*)(x + blk * 32 + o * 8 + 4);
    if (NORM) {
        const float4 g0 = *(const float4*)(g + blk * 32 + o * 8), g1 = *(const float4*)(g + blk * 32 + o * 8 + 4);
        ss += x0.x * x0.x + x0.y * x0.y + x0.z * x0.z + x0.w * x0.w;
        ss += x1.x * x1.x + x1.y * x1.y + x1.z * x1.z + x1.w * x1.w;
        x0 = make_float4(x0.x * g0.x, x0.y * g0.y, x0.z * g0.z, x0.w * g0.w);
        x1 = make_float4(x1.x * g1.x, x1.y * g1.y, x1.z * g1.z, x1.w * g1.w);
    }
}

// Rows r0, r0 + step, ... (R of them, those below rows) of a matvec (one token, no gate)
// by one warp: x is loaded (and normalised) once for all R rows and their weight loads go
// out together, so a warp with many rows (an output head) waits for memory once per R
// rows instead of once per row.
template <int F, bool NORM, int R>
__device__ __forceinline__ void qmatvec_rows(const u32* __restrict__ w, const float* x, const float* __restrict__ g,
                                             float eps, float* out, u64 rows, u64 cols, int accumulate, u64 r0,
                                             u64 step) {
    const int lane = threadIdx.x % WARP;
    const u64 nb = cols / 32;
    float acc[R], ss = 0.0f;
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
#pragma unroll 1
    for (u64 oc = lane; oc < nb * 4; oc += WARP) {
        const u64 blk = oc / 4;
        const int o = (int)(oc % 4);
        float4 x0, x1;
        octet_x<NORM>(x, g, blk, o, x0, x1, ss);
#pragma unroll
        for (int r = 0; r < R; r++) {
            const u64 row = r0 + r * step;
            if (row < rows) acc[r] += octet_dot<F>(w + (row * nb + blk) * Fmt<F>::WORDS, o, x0, x1);
        }
    }
    const float inv = NORM ? rsqrtf(warp_reduce<RSum>(ss) / (float)cols + eps) : 1.0f;
#pragma unroll
    for (int r = 0; r < R; r++) {
        const u64 row = r0 + r * step;
        const float v = warp_reduce<RSum>(acc[r]) * inv;
        if (lane == 0 && row < rows) out[row] = accumulate ? out[row] + v : v;
    }
}

// qmatvec_rows (step 1) for rows of at most K·WARP octets (a quantised row of up to
// K·256 columns): every weight word of the warp's R rows is loaded into registers first,
// in one round of loads, then x (normalised) meets them, so a row group waits for memory
// once instead of once per K.
template <int F, bool NORM, int R, int K>
__device__ __forceinline__ void qmatvec_rows_pre(const u32* __restrict__ w, const float* x,
                                                 const float* __restrict__ g, float eps, float* out, u64 rows,
                                                 u64 cols, int accumulate, u64 r0) {
    const int lane = threadIdx.x % WARP;
    const u64 nb = cols / 32, noct = nb * 4;
    u32 wr[K][R][Fmt<F>::OCT];
#pragma unroll
    for (int k = 0; k < K; k++) {
        const u64 oc = lane + (u64)k * WARP;
#pragma unroll
        for (int r = 0; r < R; r++)
            if (oc < noct && r0 + r < rows)
                octet_load<F, false>(w + ((r0 + r) * nb + oc / 4) * Fmt<F>::WORDS, (int)(oc % 4), wr[k][r]);
    }
    float acc[R], ss = 0.0f;
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
#pragma unroll
    for (int k = 0; k < K; k++) {
        const u64 oc = lane + (u64)k * WARP;
        if (oc < noct) {
            const u64 blk = oc / 4;
            const int o = (int)(oc % 4);
            float4 x0, x1;
            octet_x<NORM>(x, g, blk, o, x0, x1, ss);
#pragma unroll
            for (int r = 0; r < R; r++)
                if (r0 + r < rows) acc[r] += octet_dot_words<F>(wr[k][r], o, x0, x1);
        }
    }
    const float inv = NORM ? rsqrtf(warp_reduce<RSum>(ss) / (float)cols + eps) : 1.0f;
#pragma unroll
    for (int r = 0; r < R; r++) {
        const u64 row = r0 + r;
        const float v = warp_reduce<RSum>(acc[r]) * inv;
        if (lane == 0 && row < rows) out[row] = accumulate ? out[row] + v : v;
    }
}

#define QM_ROWS 4
#define QM_PRE_K 3

// rk_qmatvec_rows_*: each warp takes the R-row groups q = its index, + the grid's warps,
// ... (a grid of one wave of resident blocks walks the whole matrix).
template <int F, bool NORM, int R>
__device__ __forceinline__ void qmatvec_rows_body(const u32* __restrict__ w, const float* x,
                                                  const float* __restrict__ g, float eps, float* out, u64 rows,
                                                  u64 cols, int accumulate) {
    const u64 first = (u64)blockIdx.x * QM_WARPS + threadIdx.x / WARP, stride = (u64)gridDim.x * QM_WARPS;
    rk_pdl_enter();
    if (F != 0 && cols / 32 * 4 <= (u64)QM_PRE_K * WARP)
        for (u64 q = first; q * R < rows; q += stride)
            qmatvec_rows_pre<F, NORM, R, QM_PRE_K>(w, x, g, eps, out, rows, cols, accumulate, q * R);
    else
        for (u64 q = first; q * R < rows; q += stride)
            qmatvec_rows<F, NORM, R>(w, x, g, eps, out, rows, cols, accumulate, q * R, 1);
}

// rk_qmatvec_rows_<format> and rk_qmatvec_rows_norm_<format>: one token, no gate, QM_ROWS
// consecutive rows a warp at a time (for matrices with many rows, such as an output head).
#define QMATVEC_ROWS(name, F)                                                                                     \
    extern "C" __global__ void __launch_bounds__(QM_WARPS * WARP) rk_qmatvec_rows_##name(                         \
        const u32* __restrict__ w, const float* __restrict__ x, float* __restrict__ out, u64 rows, u64 cols,      \
        int accumulate) {                                                                                         \
        qmatvec_rows_body<F, false, QM_ROWS>(w, x, x, 0.0f, out, rows, cols, accumulate);                         \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(QM_WARPS * WARP) rk_qmatvec_rows_norm_##name(                    \
        const u32* __restrict__ w, const float* __restrict__ x, const float* __restrict__ g, float eps,           \
        float* __restrict__ out, u64 rows, u64 cols, int accumulate) {                                            \
        qmatvec_rows_body<F, true, QM_ROWS>(w, x, g, eps, out, rows, cols, accumulate);                           \
    }
QMATVEC_ROWS(f32, 0)
QMATVEC_ROWS(q4_1, 1)
QMATVEC_ROWS(q8_0, 2)

// Value j (0..31) of the block at blk.
template <int F>
__device__ __forceinline__ float block_value(const u32* __restrict__ blk, int j) {
    if (F == 0) return __int_as_float((int)blk[j]);
    if (F == 1) {
        const u32 q = (blk[1 + (j % 16) / 4] >> (8 * (j % 4))) & 0xFFu;
        const u32 nib = j >= 16 ? q >> 4 : q & 0xFu;
        return fmaf((float)nib, half_value(blk[0]), half_value(blk[0] >> 16));
    }
    return sbyte(blk[1 + j / 4], j % 4) * half_value(blk[0]);
}

// out[t, c] = W[ids[t], c], zeros for an id past the table; a thread per output element.
template <int F>
__device__ __forceinline__ void embedding_body(const u32* __restrict__ w, const u32* __restrict__ ids,
                                               float* __restrict__ out, u64 rows, u64 cols, u64 count) {
    const u64 n = count * cols;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        const u64 t = i / cols, c = i % cols, id = ids[t];
        out[i] = id < rows ? block_value<F>(w + (id * (cols / 32) + c / 32) * Fmt<F>::WORDS, (int)(c % 32)) : 0.0f;
    }
}

#define EMBEDDING(name, F)                                                                                 \
    extern "C" __global__ void rk_embedding_##name(const u32* __restrict__ w, const u32* __restrict__ ids,  \
                                                   float* __restrict__ out, u64 rows, u64 cols, u64 count) { rk_pdl_enter(); \
        embedding_body<F>(w, ids, out, rows, cols, count);                                                 \
    }
EMBEDDING(f32, 0)
EMBEDDING(q4_1, 1)
EMBEDDING(q8_0, 2)

// ComputeBackend::greedy_feed, one block of ARGMAX_THREADS: token[0] = argmax(logits[0..rows]),
// x = that row of the table (the next decode step's input), pos[0] += 1.
#define GREEDY_FEED(name, F)                                                                                  \
    extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS)                                             \
        rk_greedy_feed_##name(const float* __restrict__ logits, u64 rows, const u32* __restrict__ w, u64 cols, \
                              unsigned* __restrict__ token, float* __restrict__ x, unsigned* __restrict__ pos) { \
        rk_pdl_enter();                                                                                      \
        __shared__ unsigned picked;                                                                          \
        const unsigned t = argmax_block(logits, rows);                                                       \
        if (threadIdx.x == 0) {                                                                              \
            picked = t;                                                                                      \
            token[0] = t;                                                                                    \
            pos[0] += 1u;                                                                                    \
        }                                                                                                    \
        __syncthreads();                                                                                     \
        const u32* row = w + (u64)picked * (cols / 32) * Fmt<F>::WORDS;                                      \
        for (u64 c = threadIdx.x; c < cols; c += ARGMAX_THREADS)                                             \
            x[c] = block_value<F>(row + (c / 32) * Fmt<F>::WORDS, (int)(c % 32));                            \
    }
GREEDY_FEED(f32, 0)
GREEDY_FEED(q4_1, 1)
GREEDY_FEED(q8_0, 2)

// ------------------------------------------------------------------ KV cache

// qkv: [tokens, (heads + 2·kv_heads)·hd]. A thread per rotated pair of a query or key head
// (queries to q: [tokens, heads, hd]; keys to row pos[t] of k_cache: [kv_heads, cap, hd])
// or per copied value (to v_cache). Half-split RoPE; the angle in double as rk_rope.
// Pair i of head h (a query head below `heads`, then the key heads) of one token's qkv
// row, rotated to position `at`: half-split RoPE, the angle in double as rk_rope.
__device__ __forceinline__ void rope_pair(const float* row, u64 h, u64 i, u64 hd, u64 at, float base,
                                          float* y0, float* y1) {
    const u64 half = hd / 2;
    double sn, cs;
    rope_sincos((double)at, i, hd, base, &sn, &cs);
    rope_rotate(row[h * hd + i], row[h * hd + i + half], sn, cs, y0, y1);
}

extern "C" __global__ void rk_rope_kv(const float* __restrict__ qkv, const u32* __restrict__ pos,
                                      float* __restrict__ q, float* __restrict__ kc, float* __restrict__ vc,
                                      u64 tokens, u64 heads, u64 kv_heads, u64 hd, u64 cap, float base) {
    rk_pdl_enter();
    const u64 half = hd / 2, rot = (heads + kv_heads) * half, per_token = rot + kv_heads * hd;
    const u64 total = tokens * per_token;
    for (u64 idx = (u64)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += (u64)gridDim.x * blockDim.x) {
        const u64 t = idx / per_token, r = idx % per_token, at = pos[t];
        const float* row = qkv + t * (heads + 2 * kv_heads) * hd;
        if (r < rot) {
            const u64 h = r / half, i = r % half;
            float y0, y1;
            rope_pair(row, h, i, hd, at, base, &y0, &y1);
            if (h < heads) {
                float* o = q + (t * heads + h) * hd;
                o[i] = y0;
                o[i + half] = y1;
            } else if (at < cap) {
                float* o = kc + ((h - heads) * cap + at) * hd;
                o[i] = y0;
                o[i + half] = y1;
            }
        } else if (at < cap) {
            const u64 r2 = r - rot, kh = r2 / hd, i = r2 % hd;
            vc[(kh * cap + at) * hd + i] = row[(heads + kv_heads + kh) * hd + i];
        }
    }
}

// out[t, h] = softmax_j(scale·q[t, h]·k[h/g, j]) · v[h/g, j] over j ≤ pos[t] (clamped to
// the cache). Decode has one row per head (nine for SmolLM2), so the parallelism has to be
// in the keys: one block of KV_THREADS per (token, query head), the keys in tiles of
// KV_TILE. Every thread scores whole keys (a dot over head_dim, no shuffles), the block
// takes the tile's max and sum (an online softmax across tiles), then the threads split
// (head_dim column, key group) for the probability-weighted sum of the values, and the
// groups' sums are added at the end. V = 4 reads float4s (head_dim % 4 == 0 and the caches
// 16-byte aligned), V = 1 floats.
#define KV_THREADS 512
#define KV_TILE 1024
#define KV_BATCH 8
#define KV_MAXD 256

template <int V> struct KvVec;
template <> struct KvVec<4> {
    typedef float4 T;
    __device__ static T zero() { return make_float4(0.0f, 0.0f, 0.0f, 0.0f); }
    __device__ static float dot(T a, T b) { return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w; }
    __device__ static T fma(float p, T v, T acc) {
        return make_float4(fmaf(p, v.x, acc.x), fmaf(p, v.y, acc.y), fmaf(p, v.z, acc.z), fmaf(p, v.w, acc.w));
    }
    __device__ static T scale(T a, float c) { return make_float4(a.x * c, a.y * c, a.z * c, a.w * c); }
};
template <> struct KvVec<1> {
    typedef float T;
    __device__ static T zero() { return 0.0f; }
    __device__ static float dot(T a, T b) { return a * b; }
    __device__ static T fma(float p, T v, T acc) { return fmaf(p, v, acc); }
    __device__ static T scale(T a, float c) { return a * c; }
};

// acc += Σ_j p[j]·v[j] over this thread's keys j = g, g + groups, ... below len (vr: the
// thread's column of the tile's first value row), KV_BATCH keys a round whose loads go out
// together (predicated past the end rather than left to a tail loop of one load at a
// time). FIRST: the first round's values are already in first[] (loaded early), except
// key `fresh` (-1: none), which is read again.
template <int V, bool FIRST>
__device__ __forceinline__ void kv_accumulate(typename KvVec<V>::T& acc, const typename KvVec<V>::T* vr,
                                              const float* p, int len, int g, int groups, int cols,
                                              const typename KvVec<V>::T* first, int fresh) {
    typedef KvVec<V> K;
    typedef typename K::T T;
#pragma unroll 1
    for (int j = g; j < len; j += KV_BATCH * groups) {
        T v[KV_BATCH];
#pragma unroll
        for (int b = 0; b < KV_BATCH; b++) {
            const int jb = j + b * groups;
            v[b] = jb >= len ? K::zero() : FIRST && j == g && jb != fresh ? first[b] : vr[(u64)jb * cols];
        }
#pragma unroll
        for (int b = 0; b < KV_BATCH; b++) {
            const int jb = j + b * groups;
            if (jb < len) acc = K::fma(p[jb], v[b], acc);
        }
    }
}

// q, kc and vc are not __restrict__: rk_rope_attention_kv writes them in the same kernel,
// so their loads must not take the read-only (non-coherent) path.
//
// Split attention (rk_program): with nsplit > 1 the block takes part `split` of the keys
// only and writes, instead of out's row, its partial result to part: the running max m,
// the sum l of exp(score - m) and the unnormalised Σ exp(score - m)·v (hd values);
// attention_combine merges the parts. nsplit = 1 and part = 0 is the whole row.
template <int V>
__device__ __forceinline__ void attention_kv_body(const float* q, const float* kc,
                                                  const float* vc, const u32* __restrict__ pos,
                                                  float* __restrict__ out, u64 heads, u64 kv_heads, u64 hd, u64 cap,
                                                  float scale, u64 rowi, u64 split = 0, u64 nsplit = 1,
                                                  float* part = 0) {
    typedef KvVec<V> K;
    typedef typename K::T T;
    __shared__ __align__(16) float sh_q[KV_MAXD];
    __shared__ float sh_p[KV_TILE];
    __shared__ float sh_red[WARP];
    __shared__ __align__(16) float sh_acc[KV_THREADS * V];
    const u64 t = rowi / heads, h = rowi % heads;
    const u64 kvh = h / (heads / kv_heads);
    const int tid = threadIdx.x;
    const int cols = (int)(hd / V), groups = KV_THREADS / cols, col = tid % cols, g = tid / cols;
    const T* kb = (const T*)(kc + kvh * cap * hd);
    const T* vb = (const T*)(vc + kvh * cap * hd);
    for (u64 d = tid; d < hd; d += KV_THREADS) sh_q[d] = q[rowi * hd + d];
    __syncthreads();
    const T* q4 = (const T*)sh_q;
    const u64 n_all = (pos[t] < cap ? pos[t] : cap - 1) + 1, per = (n_all + nsplit - 1) / nsplit;
    const u64 lo = split * per < n_all ? split * per : n_all;
    const u64 n = lo + per < n_all ? lo + per : n_all;  // keys [lo, n)
    float m = NEG_INF, l = 0.0f;
    T acc = K::zero();
    for (u64 j0 = lo; j0 < n; j0 += KV_TILE) {
        const int len = (int)(n - j0 < KV_TILE ? n - j0 : KV_TILE);
        float tmax = NEG_INF;
        for (int j = tid; j < len; j += KV_THREADS) {
            const T* kr = kb + (j0 + j) * cols;
            float s = 0.0f;
#pragma unroll 8
            for (int c = 0; c < cols; c++) s += K::dot(q4[c], kr[c]);
            s *= scale;
            sh_p[j] = s;
            tmax = fmaxf(tmax, s);
        }
        tmax = block_reduce<RMax>(tmax, sh_red);
        const float mn = fmaxf(m, tmax);
        float ts = 0.0f;
        for (int j = tid; j < len; j += KV_THREADS) {  // each thread its own entries
            const float p = mn == NEG_INF ? 0.0f : expf(sh_p[j] - mn);
            sh_p[j] = p;
            ts += p;
        }
        ts = block_reduce<RSum>(ts, sh_red);  // its barriers publish sh_p
        const float corr = m == NEG_INF ? 0.0f : expf(m - mn);
        l = l * corr + ts;
        m = mn;
        if (g < groups) {
            acc = K::scale(acc, corr);
            kv_accumulate<V, false>(acc, vb + j0 * cols + col, sh_p, len, g, groups, cols, 0, -1);
        }
        __syncthreads();  // the next tile overwrites sh_p
    }
    if (g < groups) ((T*)sh_acc)[g * cols + col] = acc;
    __syncthreads();
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    for (u64 d = tid; d < hd; d += KV_THREADS) {
        float a = 0.0f;
        for (int gi = 0; gi < groups; gi++) a += sh_acc[gi * hd + d];
        if (part)
            part[2 + d] = a;
        else
            out[rowi * hd + d] = a * inv;
    }
    if (part && tid == 0) {
        part[0] = m;
        part[1] = l;
    }
    __syncthreads();  // sh_acc is reused by the block's next call
}

// out[row] from the nsplit parts of attention_kv_body (each hd + 2 floats, `stride` apart)
// by one block: the parts' sums rescaled to the largest max. The parts were written by
// other blocks of the same kernel, so they are read through L2 (ld.cg), not L1. A thread
// loads every part's max, sum and value at once, unrolled over at most KV_COMBINE parts
// (both callers split into no more), so the merge waits for L2 once rather than once a
// part (a loop over a run-time count issues a part's load only after the one before it
// is used).
#define KV_COMBINE 16
__device__ __forceinline__ void attention_combine(const float* part, u64 nsplit, u64 stride, u64 hd,
                                                  float* __restrict__ out) {
    for (u64 d = threadIdx.x; d < hd; d += blockDim.x) {
        float mc[KV_COMBINE], lc[KV_COMBINE], ac[KV_COMBINE];
#pragma unroll
        for (int c = 0; c < KV_COMBINE; c++) {
            if ((u64)c < nsplit) {
                const float* pc = part + c * stride;
                mc[c] = __ldcg(pc);
                lc[c] = __ldcg(pc + 1);
                ac[c] = __ldcg(pc + 2 + d);
            }
        }
        float mx = NEG_INF, a = 0.0f, l = 0.0f;
#pragma unroll
        for (int c = 0; c < KV_COMBINE; c++)
            if ((u64)c < nsplit) mx = fmaxf(mx, mc[c]);
#pragma unroll
        for (int c = 0; c < KV_COMBINE; c++) {
            if ((u64)c < nsplit) {
                const float w = mc[c] == NEG_INF ? 0.0f : expf(mc[c] - mx);
                l = fmaf(w, lc[c], l);
                a = fmaf(w, ac[c], a);
            }
        }
        out[d] = l > 0.0f ? a / l : 0.0f;
    }
}

extern "C" __global__ void __launch_bounds__(KV_THREADS) rk_attention_kv(
    const float* __restrict__ q, const float* __restrict__ kc, const float* __restrict__ vc,
    const u32* __restrict__ pos, float* __restrict__ out, u64 heads, u64 kv_heads, u64 hd, u64 cap, float scale) { rk_pdl_enter();
    if (hd % 4 == 0 && ((size_t)kc | (size_t)vc) % 16 == 0)
        attention_kv_body<4>(q, kc, vc, pos, out, heads, kv_heads, hd, cap, scale, blockIdx.x);
    else
        attention_kv_body<1>(q, kc, vc, pos, out, heads, kv_heads, hd, cap, scale, blockIdx.x);
}

// rk_rope_kv then rk_attention_kv for one token (a decode step), in one kernel: block h
// rotates its query head into q, and writes the new key and value rows of its key/value
// head into the caches at pos[0] (when below the capacity) before attending. The blocks of
// one group write the same row with the same bits (each computes it the same way), so
// every block can read it back after its own barrier without waiting for the others.
// The body for query head h (a block's work); qkv is not __restrict__ for rk_program, where
// an earlier instruction wrote it.
__device__ __forceinline__ void rope_attention_kv_body(const float* qkv, const u32* __restrict__ pos, float* q,
                                                       float* kc, float* vc, float* __restrict__ out, u64 heads,
                                                       u64 kv_heads, u64 hd, u64 cap, float base, float scale,
                                                       u64 h, u64 split = 0, u64 nsplit = 1, float* part = 0) {
    const u64 kvh = h / (heads / kv_heads), at = pos[0], half = hd / 2;
    // Threads [0, half) rotate the query head, [half, hd) the key head.
    for (u64 r = threadIdx.x; r < hd; r += blockDim.x) {
        const u64 i = r % half;
        float y0, y1;
        if (r < half) {
            rope_pair(qkv, h, i, hd, at, base, &y0, &y1);
            q[h * hd + i] = y0;
            q[h * hd + i + half] = y1;
        } else if (at < cap) {
            rope_pair(qkv, heads + kvh, i, hd, at, base, &y0, &y1);
            kc[(kvh * cap + at) * hd + i] = y0;
            kc[(kvh * cap + at) * hd + i + half] = y1;
        }
    }
    if (at < cap)
        for (u64 i = threadIdx.x; i < hd; i += blockDim.x)
            vc[(kvh * cap + at) * hd + i] = qkv[(heads + kv_heads + kvh) * hd + i];
    __syncthreads();  // this block's writes, visible to its threads
    if (hd % 4 == 0 && ((size_t)kc | (size_t)vc) % 16 == 0)
        attention_kv_body<4>(q, kc, vc, pos, out, heads, kv_heads, hd, cap, scale, h, split, nsplit, part);
    else
        attention_kv_body<1>(q, kc, vc, pos, out, heads, kv_heads, hd, cap, scale, h, split, nsplit, part);
}

extern "C" __global__ void __launch_bounds__(KV_THREADS) rk_rope_attention_kv(
    const float* __restrict__ qkv, const u32* __restrict__ pos, float* __restrict__ q, float* kc, float* vc,
    float* __restrict__ out, u64 heads, u64 kv_heads, u64 hd, u64 cap, float base, float scale) {
    rk_pdl_enter();
    rope_attention_kv_body(qkv, pos, q, kc, vc, out, heads, kv_heads, hd, cap, base, scale, blockIdx.x);
}

// rk_rope_attention_kv for one token over more of the GPU: `ns` small blocks (AS_THREADS)
// per query head, block (h, s) taking slice s of the keys, with no global round trip for
// q and no reduction wider than four warps. Each block rotates its query head into
// shared memory (split 0 also writes it to q); the block whose slice holds the new key
// appends the key and value rows of its key/value head (the blocks of one group write
// the same bits) and reads them back after its own barrier: no other block reads that
// row. A block writes its partial result (max m, sum l of exp(score - m), the
// unnormalised Σ exp(score - m)·v) to part; the last block of a head to finish (counted
// in done[h], back to 0 after) merges the head's parts into out. Needs hd % 4 == 0,
// hd <= AS_MAXD and 16-byte aligned caches (the host checks).
//
// Before anything of the kernel ahead is needed, a block reads the position, takes its
// RoPE angles and loads the first AS_THREADS keys and values of its slice that earlier
// steps cached (heads up to 4·AS_PRE_COLS wide) into registers; with `early` (the
// kernel ahead writes neither cache, see rk_pdl_wait in ops.cu) all of that happens
// before the wait, so after it a block waits only for its qkv row.
#define AS_THREADS 128
#define AS_MAXD 128
#define AS_PRE_COLS 16

__device__ __forceinline__ float dot4(float4 a, float4 b) { return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w; }

// With WO (rk_rope_attention_wo_split_*), the kernel also applies the layer's output
// projection: x[r] += Σ_c Wo[r, h·hd + c]·att_h[c] for every row r, and the same to x2.
// Block (h, s) takes rows [s·per, (s + 1)·per) of Wo (per = ⌈dim / ns⌉) for its head's hd
// columns, their first WoPre octets loaded early. Every block of a head then needs the
// head's merged row, so instead of the last block merging alone, each block counts its
// part in ticket[h] (a 64-bit count that is never reset: the head's blocks of one call
// take tickets [k·ns, k·ns + ns)) and waits until the count reaches the call's end, then
// merges the parts into shared memory itself and adds its rows' products to x and x2 with
// reductions (their order, and so the sums' last bits, vary from run to run). The host
// launches it only when every block can be resident at once (heads·ns ≤ SMs): a waiting
// block needs the others of its head to run. out is left unwritten.
template <int F> struct WoPre { static const int N = F == 0 ? 2 : 8; };

template <int F, bool WO>
__device__ __forceinline__ void split_attention_body(
    const float* __restrict__ qkv, const u32* __restrict__ pos, float* __restrict__ q, float* kc, float* vc,
    float* __restrict__ out, u64 heads, u64 kv_heads, u64 hd, u64 cap, float base, float scale, float* part,
    u32* done, u64 ns, int early, const u32* __restrict__ wo, float* x, float* x2, u64 dim,
    unsigned long long* ticket) {
    const u64 h0 = blockIdx.x / ns, s0 = blockIdx.x % ns;
    // WO: this block's rows of Wo, and their first octets (one row a thread).
    // (dim is 0 without WO)
    const u64 wo_per = (dim + ns - 1) / ns, wo_r0 = s0 * wo_per;
    const u64 wo_r1 = wo_r0 + wo_per < dim ? wo_r0 + wo_per : dim;
    const u64 wo_nb = heads * hd / 32, wo_oct = hd / 8, wo_c0 = h0 * hd / 8;
    u32 ww[WO ? WoPre<F>::N : 1][Fmt<F>::OCT];
    if (WO && early) {
        const u64 r = wo_r0 + threadIdx.x;
#pragma unroll
        for (int j = 0; j < WoPre<F>::N; j++)
            if (r < wo_r1 && (u64)j < wo_oct)
                octet_load<F, true>(wo + (r * wo_nb + (wo_c0 + j) / 4) * Fmt<F>::WORDS, (int)((wo_c0 + j) % 4), ww[j]);
    }
    if (!early) rk_pdl_enter();
    __shared__ __align__(16) float sh_q[AS_MAXD];
    __shared__ float sh_p[AS_THREADS];
    __shared__ float sh_red[AS_THREADS / WARP];
    __shared__ __align__(16) float sh_acc[AS_THREADS * 4];
    __shared__ int sh_last;
    const u64 h = blockIdx.x / ns, s = blockIdx.x % ns;
    const u64 kvh = h / (heads / kv_heads), at = __ldcg(pos), half = hd / 2;
    const int tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP, nwarps = AS_THREADS / WARP;
    const u64 n = (at < cap ? at : cap - 1) + 1, per = (n + ns - 1) / ns;
    const u64 lo = s * per < n ? s * per : n, hi = lo + per < n ? lo + per : n;  // keys [lo, hi)
    const bool appends = at < cap && lo <= at && at < hi;
    const int cols = (int)(hd / 4), groups = AS_THREADS / cols, col = tid % cols, g = tid / cols;
    const float4* kb = (const float4*)(kc + kvh * cap * hd);
    const float4* vb = (const float4*)(vc + kvh * cap * hd);
    // Threads [0, half) rotate pair tid of the query head, [half, hd) pair tid - half of
    // the new key: the same angles.
    double sn = 0.0, cs = 1.0;
    if ((u64)tid < hd) rope_sincos((double)at, (u64)tid % half, hd, base, &sn, &cs);
    const bool pre = cols <= AS_PRE_COLS;
    const int len0 = (int)(hi - lo < AS_THREADS ? hi - lo : AS_THREADS);
    float4 kr[AS_PRE_COLS], vr[KV_BATCH];
    if (pre) {
        if (tid < len0 && lo + tid != at) {
#pragma unroll
            for (int c = 0; c < AS_PRE_COLS; c++)
                if (c < cols) kr[c] = __ldcg(kb + (lo + tid) * cols + c);
        }
        if (g < groups) {
#pragma unroll
            for (int b = 0; b < KV_BATCH; b++) {
                const int jb = g + b * groups;
                if (jb < len0 && lo + jb != at) vr[b] = __ldcg(vb + (lo + jb) * cols + col);
            }
        }
    }
    if (early) rk_pdl_enter();
    if ((u64)tid < hd) {
        const u64 i = (u64)tid % half;
        float y0, y1;
        if ((u64)tid < half) {
            rope_rotate(qkv[h * hd + i], qkv[h * hd + i + half], sn, cs, &y0, &y1);
            sh_q[i] = y0;
            sh_q[i + half] = y1;
            if (s == 0) {
                q[h * hd + i] = y0;
                q[h * hd + i + half] = y1;
            }
        } else if (appends) {
            const float* kr0 = qkv + (heads + kvh) * hd;
            rope_rotate(kr0[i], kr0[i + half], sn, cs, &y0, &y1);
            kc[(kvh * cap + at) * hd + i] = y0;
            kc[(kvh * cap + at) * hd + i + half] = y1;
        }
    }
    if (appends)
        for (u64 i = tid; i < hd; i += AS_THREADS) vc[(kvh * cap + at) * hd + i] = qkv[(heads + kv_heads + kvh) * hd + i];
    __syncthreads();  // sh_q, and the appended row for this block's threads
    const float4* q4 = (const float4*)sh_q;
    float m = NEG_INF, l = 0.0f;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (u64 j0 = lo; j0 < hi; j0 += AS_THREADS) {
        const int len = (int)(hi - j0 < AS_THREADS ? hi - j0 : AS_THREADS);
        const bool first = pre && j0 == lo;
        // The new key's index in this tile (its row was written above, not loaded early).
        const int fresh = at >= j0 && at < j0 + len ? (int)(at - j0) : -1;
        float sc = NEG_INF;
        if (tid < len) {
            float d = 0.0f;
            if (first && tid != fresh) {
#pragma unroll
                for (int c = 0; c < AS_PRE_COLS; c++)
                    if (c < cols) d += dot4(q4[c], kr[c]);
            } else {
                const float4* krow = kb + (j0 + tid) * cols;
#pragma unroll 8
                for (int c = 0; c < cols; c++) d += dot4(q4[c], krow[c]);
            }
            sc = d * scale;
        }
        float tmax = warp_reduce<RMax>(sc);
        if (lane == 0) sh_red[warp] = tmax;
        __syncthreads();
        tmax = sh_red[0];
        for (int w = 1; w < nwarps; w++) tmax = fmaxf(tmax, sh_red[w]);
        const float mn = fmaxf(m, tmax);
        const float p = tid < len ? expf(sc - mn) : 0.0f;
        sh_p[tid] = p;
        float ts = warp_reduce<RSum>(p);
        __syncthreads();  // every thread has read sh_red's maxima; sh_p is written
        if (lane == 0) sh_red[warp] = ts;
        __syncthreads();
        ts = 0.0f;
        for (int w = 0; w < nwarps; w++) ts += sh_red[w];
        const float corr = m == NEG_INF ? 0.0f : expf(m - mn);
        l = l * corr + ts;
        m = mn;
        if (g < groups) {
            acc = make_float4(acc.x * corr, acc.y * corr, acc.z * corr, acc.w * corr);
            if (first)
                kv_accumulate<4, true>(acc, vb + j0 * cols + col, sh_p, len, g, groups, cols, vr, fresh);
            else
                kv_accumulate<4, false>(acc, vb + j0 * cols + col, sh_p, len, g, groups, cols, 0, -1);
        }
        __syncthreads();  // sh_p and sh_red are rewritten by the next slice of keys
    }
    if (g < groups) ((float4*)sh_acc)[g * cols + col] = acc;
    __syncthreads();
    const u64 stride = hd + 2;
    float* mine = part + (h * ns + s) * stride;
    for (u64 d = tid; d < hd; d += AS_THREADS) {
        float a = 0.0f;
        for (int gi = 0; gi < groups; gi++) a += sh_acc[gi * hd + d];
        if (ns == 1 && !WO)
            out[h * hd + d] = l > 0.0f ? a / l : 0.0f;
        else
            mine[2 + d] = a;
    }
    if (ns == 1 && !WO) return;
    if (tid == 0) {
        mine[0] = m;
        mine[1] = l;
    }
    if (WO) {
        // The head's blocks meet: their parts are written before, read after.
        ticket_meet(ticket + h, ns);
        float* sh_att = sh_acc;  // free again: the sums above were read before the barrier
        attention_combine(part + h * ns * stride, ns, stride, hd, sh_att);
        __syncthreads();
        const float4* a4 = (const float4*)sh_att;
#pragma unroll 1
        for (u64 r = wo_r0 + tid; r < wo_r1; r += AS_THREADS) {
            const bool first = early && r == wo_r0 + tid;
            float v = 0.0f;
#pragma unroll
            for (int j = 0; j < WoPre<F>::N; j++) {
                if ((u64)j < wo_oct) {
                    const u64 c = wo_c0 + j;
                    v += first ? octet_dot_words<F>(ww[j], (int)(c % 4), a4[2 * j], a4[2 * j + 1])
                               : octet_dot<F>(wo + (r * wo_nb + c / 4) * Fmt<F>::WORDS, (int)(c % 4), a4[2 * j],
                                              a4[2 * j + 1]);
                }
            }
#pragma unroll 1
            for (u64 j = WoPre<F>::N; j < wo_oct; j++) {
                const u64 c = wo_c0 + j;
                v += octet_dot<F>(wo + (r * wo_nb + c / 4) * Fmt<F>::WORDS, (int)(c % 4), a4[2 * j], a4[2 * j + 1]);
            }
            atomicAdd(x + r, v);
            atomicAdd(x2 + r, v);
        }
        return;
    }
    // The block's part before its count: the barrier orders every thread's writes before
    // thread 0's release (cumulative, as rk_program's grid barrier), and thread 0's
    // acquire before the block's reads of the other parts; one acq_rel atomic instead of
    // a fence in every thread on either side.
    __syncthreads();
    if (tid == 0) {
        u32 before;
        asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(before) : "l"(done + h) : "memory");
        sh_last = before == ns - 1;
    }
    __syncthreads();
    if (sh_last) {
        attention_combine(part + h * ns * stride, ns, stride, hd, out + h * hd);
        if (tid == 0) done[h] = 0;  // for the next call, which waits for this kernel
    }
}

extern "C" __global__ void __launch_bounds__(AS_THREADS) rk_rope_attention_kv_split(
    const float* __restrict__ qkv, const u32* __restrict__ pos, float* __restrict__ q, float* kc, float* vc,
    float* __restrict__ out, u64 heads, u64 kv_heads, u64 hd, u64 cap, float base, float scale, float* part,
    u32* done, u64 ns, int early) {
    split_attention_body<1, false>(qkv, pos, q, kc, vc, out, heads, kv_heads, hd, cap, base, scale, part, done, ns,
                                   early, 0, 0, 0, 0, 0);
}

#define ATTENTION_WO(name, F)                                                                                    \
    extern "C" __global__ void __launch_bounds__(AS_THREADS) rk_rope_attention_wo_split_##name(                  \
        const float* __restrict__ qkv, const u32* __restrict__ pos, float* __restrict__ q, float* kc, float* vc, \
        float* __restrict__ out, u64 heads, u64 kv_heads, u64 hd, u64 cap, float base, float scale, float* part, \
        u32* done, u64 ns, int early, const u32* __restrict__ wo, float* x, float* x2, u64 dim,                  \
        unsigned long long* ticket) {                                                                            \
        split_attention_body<F, true>(qkv, pos, q, kc, vc, out, heads, kv_heads, hd, cap, base, scale, part,     \
                                      done, ns, early, wo, x, x2, dim, ticket);                                  \
    }
ATTENTION_WO(f32, 0)
ATTENTION_WO(q4_1, 1)
ATTENTION_WO(q8_0, 2)
