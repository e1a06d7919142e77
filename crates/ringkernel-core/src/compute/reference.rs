//! f64 reference implementations of every op, written for clarity, not speed. Every
//! backend's tests compare against these on fresh random inputs.
//!
//! Each function takes the op's inputs as slices of `f32` (or `f64`, so that a chain of
//! ops can be followed entirely in double precision) and returns a fresh `Vec<f64>`
//! laid out exactly like the op's output buffer. The loops are the plain textbook
//! definitions; they panic on inputs that are too short (they are test oracles, not
//! part of any op path).
//!
//! ```
//! use ringkernel_core::compute::{reference, MatmulDims};
//! let a = [1.0f32, 2.0, 3.0, 4.0];
//! let b = [5.0f32, 6.0, 7.0, 8.0];
//! let dims = MatmulDims { batch: 1, m: 2, k: 2, n: 2, b_batched: false };
//! assert_eq!(reference::matmul(&a, &b, dims), vec![19.0, 22.0, 43.0, 50.0]);
//! ```

use super::{
    dtype, quant, AttentionDims, BinaryOp, BroadcastDims, DType, DecoderDims, EmbeddingDims,
    KvDims, MatmulDims, QMatmulDims, ReduceDims, ReduceOp, RopeDims, UnaryOp, WeightFormat,
};

/// An element type the references accept: `f32` or `f64`.
pub trait Real: Copy + Into<f64> {}
impl Real for f32 {}
impl Real for f64 {}

fn f<T: Real>(x: T) -> f64 {
    x.into()
}

/// Applies one unary op to one value, in f64.
///
/// ```
/// use ringkernel_core::compute::{reference, UnaryOp};
/// assert_eq!(reference::unary_scalar(UnaryOp::Relu, -2.0), 0.0);
/// ```
pub fn unary_scalar(op: UnaryOp, x: f64) -> f64 {
    match op {
        UnaryOp::Neg => -x,
        UnaryOp::Abs => x.abs(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Sin => x.sin(),
        UnaryOp::Cos => x.cos(),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Relu => x.max(0.0),
        UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        UnaryOp::Silu => x / (1.0 + (-x).exp()),
        UnaryOp::Gelu => {
            let c = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
        }
    }
}

/// Applies one binary op to two values, in f64.
///
/// ```
/// use ringkernel_core::compute::{reference, BinaryOp};
/// assert_eq!(reference::binary_scalar_op(BinaryOp::Max, 1.0, 3.0), 3.0);
/// ```
pub fn binary_scalar_op(op: BinaryOp, a: f64, b: f64) -> f64 {
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        BinaryOp::Max => a.max(b),
        BinaryOp::Min => a.min(b),
    }
}

/// `out[i] = op(x[i])`.
pub fn unary<T: Real>(op: UnaryOp, x: &[T]) -> Vec<f64> {
    x.iter().map(|&v| unary_scalar(op, f(v))).collect()
}

/// `out[i] = op(a[i], b[i])`.
pub fn binary<T: Real, U: Real>(op: BinaryOp, a: &[T], b: &[U]) -> Vec<f64> {
    assert_eq!(a.len(), b.len(), "reference::binary: length mismatch");
    a.iter()
        .zip(b)
        .map(|(&x, &y)| binary_scalar_op(op, f(x), f(y)))
        .collect()
}

/// `out[i] = op(a[i], s)`.
pub fn binary_scalar<T: Real>(op: BinaryOp, a: &[T], s: f32) -> Vec<f64> {
    a.iter()
        .map(|&x| binary_scalar_op(op, f(x), s as f64))
        .collect()
}

/// (Batched) matrix product, see [`MatmulDims`].
pub fn matmul<T: Real, U: Real>(a: &[T], b: &[U], dims: MatmulDims) -> Vec<f64> {
    let MatmulDims {
        batch,
        m,
        k,
        n,
        b_batched,
    } = dims;
    let mut out = vec![0.0; batch * m * n];
    for bi in 0..batch {
        let a0 = bi * m * k;
        let b0 = if b_batched { bi * k * n } else { 0 };
        for i in 0..m {
            for j in 0..n {
                let mut acc = 0.0;
                for p in 0..k {
                    acc += f(a[a0 + i * k + p]) * f(b[b0 + p * n + j]);
                }
                out[bi * m * n + i * n + j] = acc;
            }
        }
    }
    out
}

/// `out[i] = Σⱼ A[i, j] · x[j]` for `A: [m, k]`.
pub fn matvec<T: Real, U: Real>(a: &[T], x: &[U], m: usize, k: usize) -> Vec<f64> {
    (0..m)
        .map(|i| (0..k).map(|j| f(a[i * k + j]) * f(x[j])).sum())
        .collect()
}

/// The index of the largest value of `x` (the first at a tie); 0 for an empty slice. NaNs
/// are passed over (a NaN first value gives 0: nothing compares greater than it). The
/// definition of [`ComputeBackend::argmax`](crate::compute::ComputeBackend::argmax), and the
/// host's greedy sampling.
///
/// Two passes: the largest value over 16 independent lanes (compares a compiler can
/// vectorise, where one running maximum is a chain of dependent branches), then the
/// first index holding it.
pub fn argmax(x: &[f32]) -> usize {
    const LANES: usize = 16;
    let Some(&first) = x.first() else { return 0 };
    if first.is_nan() {
        return 0;
    }
    let mut lane = [first; LANES];
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for (m, &v) in lane.iter_mut().zip(c) {
            if v > *m {
                *m = v;
            }
        }
    }
    let mut best = first;
    for &v in lane.iter().chain(rest) {
        if v > best {
            best = v;
        }
    }
    // `best` is a value of x (not NaN), so the search finds it.
    x.iter().position(|&v| v == best).unwrap_or(0)
}

/// `[Σ a[i]·b[i]]` (one element, like the op's output).
pub fn dot<T: Real, U: Real>(a: &[T], b: &[U]) -> Vec<f64> {
    assert_eq!(a.len(), b.len(), "reference::dot: length mismatch");
    vec![a.iter().zip(b).map(|(&x, &y)| f(x) * f(y)).sum()]
}

/// Reduction of `[outer, axis, inner]` over the middle axis into `[outer, inner]`.
pub fn reduce<T: Real>(op: ReduceOp, x: &[T], dims: ReduceDims) -> Vec<f64> {
    let ReduceDims { outer, axis, inner } = dims;
    assert!(axis > 0, "reference::reduce: empty axis");
    let mut out = vec![0.0; outer * inner];
    for o in 0..outer {
        for i in 0..inner {
            let vals = (0..axis).map(|a| f(x[(o * axis + a) * inner + i]));
            out[o * inner + i] = match op {
                ReduceOp::Sum => vals.sum(),
                ReduceOp::Mean => vals.sum::<f64>() / axis as f64,
                ReduceOp::Max => vals.fold(f64::NEG_INFINITY, f64::max),
                ReduceOp::Min => vals.fold(f64::INFINITY, f64::min),
            };
        }
    }
    out
}

/// Softmax of every row of `[rows, cols]` (computed stably, by subtracting the row max).
pub fn softmax<T: Real>(x: &[T], rows: usize, cols: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        let row: Vec<f64> = x[r * cols..(r + 1) * cols].iter().map(|&v| f(v)).collect();
        let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = row.iter().map(|&v| (v - max).exp()).collect();
        let sum: f64 = e.iter().sum();
        out.extend(e.iter().map(|&v| v / sum));
    }
    out
}

/// `x / √(mean(x²) + eps) · weight` per row of `[rows, cols]`.
pub fn rms_norm<T: Real, U: Real>(
    x: &[T],
    weight: &[U],
    rows: usize,
    cols: usize,
    eps: f32,
) -> Vec<f64> {
    let mut out = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        let row = &x[r * cols..(r + 1) * cols];
        let ms = row.iter().map(|&v| f(v) * f(v)).sum::<f64>() / cols as f64;
        let inv = 1.0 / (ms + eps as f64).sqrt();
        out.extend(row.iter().zip(weight).map(|(&v, &w)| f(v) * inv * f(w)));
    }
    out
}

/// `(x − mean) / √(var + eps) · weight + bias` per row of `[rows, cols]` (biased
/// variance).
pub fn layer_norm<T: Real, U: Real>(
    x: &[T],
    weight: &[U],
    bias: &[U],
    rows: usize,
    cols: usize,
    eps: f32,
) -> Vec<f64> {
    let mut out = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        let row = &x[r * cols..(r + 1) * cols];
        let mean = row.iter().map(|&v| f(v)).sum::<f64>() / cols as f64;
        let var = row.iter().map(|&v| (f(v) - mean).powi(2)).sum::<f64>() / cols as f64;
        let inv = 1.0 / (var + eps as f64).sqrt();
        for c in 0..cols {
            out.push((f(row[c]) - mean) * inv * f(weight[c]) + f(bias[c]));
        }
    }
    out
}

/// Rotary position embedding (half-split layout), see [`RopeDims`].
pub fn rope<T: Real, U: Real>(x: &[T], positions: &[U], dims: RopeDims) -> Vec<f64> {
    let RopeDims {
        seq,
        heads,
        head_dim,
        base,
    } = dims;
    let h = head_dim / 2;
    let mut out = vec![0.0; seq * heads * head_dim];
    for (s, &pos) in positions[..seq].iter().enumerate() {
        let p = f(pos);
        for hd in 0..heads {
            let o = (s * heads + hd) * head_dim;
            for i in 0..h {
                let theta = p * (base as f64).powf(-2.0 * i as f64 / head_dim as f64);
                let (sin, cos) = theta.sin_cos();
                let (x0, x1) = (f(x[o + i]), f(x[o + i + h]));
                out[o + i] = x0 * cos - x1 * sin;
                out[o + i + h] = x0 * sin + x1 * cos;
            }
        }
    }
    out
}

/// Whether query row `i` may see key `j` under `dims` (always true without `causal`).
pub fn visible(dims: &AttentionDims, i: usize, j: usize) -> bool {
    !dims.causal || j <= dims.q_offset + i
}

/// `scale · Q·Kᵀ` as `[bh, q_len, kv_len]`, masked entries `−∞` when causal.
pub fn attention_scores<T: Real, U: Real>(q: &[T], k: &[U], dims: AttentionDims) -> Vec<f64> {
    let AttentionDims {
        batch_heads,
        q_len,
        kv_len,
        kv_stride,
        head_dim,
        scale,
        ..
    } = dims;
    let mut out = vec![0.0; batch_heads * q_len * kv_len];
    for b in 0..batch_heads {
        for i in 0..q_len {
            for j in 0..kv_len {
                let idx = (b * q_len + i) * kv_len + j;
                out[idx] = if visible(&dims, i, j) {
                    let qr = (b * q_len + i) * head_dim;
                    let kr = (b * kv_stride + j) * head_dim;
                    scale as f64
                        * (0..head_dim)
                            .map(|d| f(q[qr + d]) * f(k[kr + d]))
                            .sum::<f64>()
                } else {
                    f64::NEG_INFINITY
                };
            }
        }
    }
    out
}

/// `P·V` as `[bh, q_len, head_dim]` for `P: [bh, q_len, kv_len]`.
pub fn attention_weighted_sum<T: Real, U: Real>(p: &[T], v: &[U], dims: AttentionDims) -> Vec<f64> {
    let AttentionDims {
        batch_heads,
        q_len,
        kv_len,
        kv_stride,
        head_dim,
        ..
    } = dims;
    let mut out = vec![0.0; batch_heads * q_len * head_dim];
    for b in 0..batch_heads {
        for i in 0..q_len {
            for d in 0..head_dim {
                out[(b * q_len + i) * head_dim + d] = (0..kv_len)
                    .map(|j| {
                        f(p[(b * q_len + i) * kv_len + j])
                            * f(v[(b * kv_stride + j) * head_dim + d])
                    })
                    .sum();
            }
        }
    }
    out
}

/// Scaled-dot-product attention `softmax(scale·Q·Kᵀ [+ causal mask])·V`, composed from
/// [`attention_scores`], a row softmax that skips masked keys, and
/// [`attention_weighted_sum`].
pub fn attention<T: Real, U: Real>(q: &[T], k: &[U], v: &[U], dims: AttentionDims) -> Vec<f64> {
    let scores = attention_scores(q, k, dims);
    let kv = dims.kv_len;
    let mut p = vec![0.0; scores.len()];
    for (row, prow) in scores.chunks(kv.max(1)).zip(p.chunks_mut(kv.max(1))) {
        let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        if max == f64::NEG_INFINITY {
            continue; // no visible key: the row stays zero
        }
        let mut sum = 0.0;
        for (o, &s) in prow.iter_mut().zip(row) {
            *o = (s - max).exp();
            sum += *o;
        }
        prow.iter_mut().for_each(|o| *o /= sum);
    }
    attention_weighted_sum(&p, v, dims)
}

/// SwiGLU: `silu(gate[i]) · up[i]`.
pub fn swiglu<T: Real, U: Real>(gate: &[T], up: &[U]) -> Vec<f64> {
    assert_eq!(gate.len(), up.len(), "reference::swiglu: length mismatch");
    gate.iter()
        .zip(up)
        .map(|(&g, &u)| unary_scalar(UnaryOp::Silu, f(g)) * f(u))
        .collect()
}

/// `convert`: the first `len` elements of `x` (stored as `from`) stored as `to`, as words
/// (exact: conversions are correctly rounded).
pub fn convert(x: &[u32], from: DType, to: DType, len: usize) -> Vec<u32> {
    if from == DType::U32 || to == DType::U32 {
        assert_eq!(from, to, "reference::convert: u32 converts only to u32");
        return x[..len].to_vec();
    }
    dtype::pack(to, &dtype::unpack(from, x, len))
}

/// `op(a, b)` under broadcasting, see [`BroadcastDims`].
pub fn broadcast_binary<T: Real, U: Real>(
    op: BinaryOp,
    a: &[T],
    b: &[U],
    dims: &BroadcastDims,
) -> Vec<f64> {
    let shape = &dims.shape[..dims.rank];
    let n: usize = shape.iter().product();
    (0..n)
        .map(|i| {
            let (mut rest, mut ia, mut ib) = (i, 0, 0);
            for d in (0..dims.rank).rev() {
                let c = rest % shape[d];
                rest /= shape[d];
                ia += c * dims.a_strides[d];
                ib += c * dims.b_strides[d];
            }
            binary_scalar_op(op, f(a[ia]), f(b[ib]))
        })
        .collect()
}

/// The rows of a weight matrix (`format` words) decoded exactly, `rows × cols`.
fn weights(format: WeightFormat, w: &[u32], rows: usize, cols: usize) -> Vec<f64> {
    quant::dequantize_f64(format, w, rows * cols).expect("reference: weights too short")
}

/// Embedding lookup, see [`EmbeddingDims`] (ids past the table give zero rows).
pub fn embedding(format: WeightFormat, table: &[u32], ids: &[u32], d: EmbeddingDims) -> Vec<f64> {
    let t = weights(format, table, d.rows, d.cols);
    let mut out = vec![0.0; d.count * d.cols];
    for (row, &id) in out.chunks_mut(d.cols.max(1)).zip(&ids[..d.count]) {
        if (id as usize) < d.rows {
            row.copy_from_slice(&t[id as usize * d.cols..(id as usize + 1) * d.cols]);
        }
    }
    out
}

/// `x · Wᵀ` on the exactly decoded weights, see [`QMatmulDims`]; with `accumulate` the
/// products are added to `init` (the output's previous contents).
pub fn qmatmul<T: Real>(
    format: WeightFormat,
    w: &[u32],
    x: &[T],
    init: &[f32],
    d: QMatmulDims,
) -> Vec<f64> {
    let wd = weights(format, w, d.rows, d.cols);
    let mut out = vec![0.0; d.batch * d.rows];
    for t in 0..d.batch {
        for r in 0..d.rows {
            let s: f64 = (0..d.cols)
                .map(|c| wd[r * d.cols + c] * f(x[t * d.cols + c]))
                .sum();
            let i = t * d.rows + r;
            out[i] = s + if d.accumulate { f(init[i]) } else { 0.0 };
        }
    }
    out
}

/// `silu(x·W_gateᵀ) · (x·W_upᵀ)` (plus `init` with `accumulate`).
pub fn qmatmul_swiglu<T: Real>(
    format: WeightFormat,
    w_gate: &[u32],
    w_up: &[u32],
    x: &[T],
    init: &[f32],
    d: QMatmulDims,
) -> Vec<f64> {
    let plain = QMatmulDims {
        accumulate: false,
        ..d
    };
    let g = qmatmul(format, w_gate, x, &[], plain);
    let u = qmatmul(format, w_up, x, &[], plain);
    g.iter()
        .zip(&u)
        .enumerate()
        .map(|(i, (&g, &u))| {
            unary_scalar(UnaryOp::Silu, g) * u + if d.accumulate { f(init[i]) } else { 0.0 }
        })
        .collect()
}

/// `rope_kv`: the rotated queries, and the caches after the writes (starting from
/// `k_cache`/`v_cache`), see [`KvDims`].
pub fn rope_kv<T: Real>(
    qkv: &[T],
    positions: &[u32],
    k_cache: &[f32],
    v_cache: &[f32],
    d: KvDims,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let hd = d.head_dim;
    let width = (d.heads + 2 * d.kv_heads) * hd;
    let rot = |x: &[T], pos: f64| -> Vec<f64> {
        rope(
            x,
            &[pos],
            RopeDims {
                seq: 1,
                heads: x.len() / hd,
                head_dim: hd,
                base: d.rope_base,
            },
        )
    };
    let mut q = Vec::with_capacity(d.tokens * d.heads * hd);
    let mut kc: Vec<f64> = k_cache.iter().map(|&v| f(v)).collect();
    let mut vc: Vec<f64> = v_cache.iter().map(|&v| f(v)).collect();
    for t in 0..d.tokens {
        let row = &qkv[t * width..(t + 1) * width];
        let pos = positions[t] as usize;
        q.extend(rot(&row[..d.heads * hd], pos as f64));
        if pos >= d.capacity {
            continue;
        }
        let k = rot(&row[d.heads * hd..(d.heads + d.kv_heads) * hd], pos as f64);
        for h in 0..d.kv_heads {
            let at = (h * d.capacity + pos) * hd;
            kc[at..at + hd].copy_from_slice(&k[h * hd..(h + 1) * hd]);
            for i in 0..hd {
                vc[at + i] = f(row[(d.heads + d.kv_heads + h) * hd + i]);
            }
        }
    }
    (q, kc, vc)
}

/// `attention_kv`, see [`KvDims`].
pub fn attention_kv<T: Real, U: Real>(
    q: &[T],
    k_cache: &[U],
    v_cache: &[U],
    positions: &[u32],
    d: KvDims,
) -> Vec<f64> {
    let hd = d.head_dim;
    let group = d.heads / d.kv_heads;
    let mut out = vec![0.0; d.tokens * d.heads * hd];
    for t in 0..d.tokens {
        let last = (positions[t] as usize).min(d.capacity - 1);
        for h in 0..d.heads {
            let qr = &q[(t * d.heads + h) * hd..][..hd];
            let kvh = h / group;
            let s: Vec<f64> = (0..=last)
                .map(|j| {
                    let kr = &k_cache[(kvh * d.capacity + j) * hd..][..hd];
                    qr.iter().zip(kr).map(|(&a, &b)| f(a) * f(b)).sum::<f64>() * f64::from(d.scale)
                })
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = s.iter().map(|v| (v - m).exp()).sum();
            let o = &mut out[(t * d.heads + h) * hd..][..hd];
            for (j, sv) in s.iter().enumerate() {
                let p = (sv - m).exp() / z;
                let vr = &v_cache[(kvh * d.capacity + j) * hd..][..hd];
                for (a, &b) in o.iter_mut().zip(vr) {
                    *a += p * f(b);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_cases_by_hand() {
        assert_eq!(
            reduce(
                ReduceOp::Sum,
                &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0],
                ReduceDims {
                    outer: 1,
                    axis: 2,
                    inner: 3
                }
            ),
            vec![5.0, 7.0, 9.0]
        );
        assert_eq!(
            reduce(
                ReduceOp::Max,
                &[1.0f32, 5.0, 3.0, 4.0],
                ReduceDims {
                    outer: 2,
                    axis: 2,
                    inner: 1
                }
            ),
            vec![5.0, 4.0]
        );
        let s = softmax(&[0.0f32, 0.0, 1000.0, 1000.0], 2, 2);
        assert_eq!(s, vec![0.5, 0.5, 0.5, 0.5]);
        assert_eq!(
            matvec(&[1.0f32, 2.0, 3.0, 4.0], &[1.0f32, 1.0], 2, 2),
            vec![3.0, 7.0]
        );
        assert_eq!(dot(&[1.0f32, 2.0], &[3.0f32, 4.0]), vec![11.0]);
        // position 0 is the identity
        let x = [1.0f32, 2.0, 3.0, 4.0];
        let r = rope(
            &x,
            &[0.0f32],
            RopeDims {
                seq: 1,
                heads: 1,
                head_dim: 4,
                base: 10000.0,
            },
        );
        assert_eq!(r, vec![1.0, 2.0, 3.0, 4.0]);
        // rotating by a quarter turn on the first pair (i = 0 has θ = p)
        let r = rope(
            &[1.0f32, 0.0],
            &[std::f32::consts::FRAC_PI_2],
            RopeDims {
                seq: 1,
                heads: 1,
                head_dim: 2,
                base: 10000.0,
            },
        );
        assert!((r[0] - 0.0).abs() < 1e-7 && (r[1] - 1.0).abs() < 1e-7);
    }

    #[test]
    fn causal_attention_first_row_copies_first_value() {
        let dims = AttentionDims {
            batch_heads: 1,
            q_len: 2,
            kv_len: 2,
            kv_stride: 3,
            head_dim: 1,
            scale: 1.0,
            causal: true,
            q_offset: 0,
        };
        let out = attention(
            &[1.0f32, 1.0],
            &[0.5f32, 0.5, 9.0],
            &[7.0f32, 3.0, 9.0],
            dims,
        );
        assert_eq!(out[0], 7.0);
        assert!((out[1] - 5.0).abs() < 1e-12);
        let s = attention_scores(&[1.0f32, 1.0], &[0.5f32, 0.5, 9.0], dims);
        assert_eq!(s[1], f64::NEG_INFINITY);
    }
}

/// One decoder layer's weights on the host, for [`decoder_layer`] (shapes as
/// [`DecoderLayer`](crate::compute::DecoderLayer)'s).
#[derive(Debug, Clone, Copy)]
pub struct HostDecoderLayer<'a> {
    /// RMSNorm weights before the attention.
    pub attn_norm: &'a [f32],
    /// The QKV projection's blocks.
    pub qkv: (WeightFormat, &'a [u32]),
    /// The output projection's blocks.
    pub wo: (WeightFormat, &'a [u32]),
    /// RMSNorm weights before the feed-forward block.
    pub ffn_norm: &'a [f32],
    /// The gate's blocks.
    pub gate: (WeightFormat, &'a [u32]),
    /// The up projection's blocks, in the gate's format.
    pub up: &'a [u32],
    /// The down projection's blocks.
    pub down: (WeightFormat, &'a [u32]),
}

/// `decoder_layer`: the residual stream after the layer, then both caches after its
/// writes (see [`crate::compute::decoder`]).
pub fn decoder_layer(
    x: &[f32],
    positions: &[u32],
    l: &HostDecoderLayer,
    k_cache: &[f32],
    v_cache: &[f32],
    d: DecoderDims,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let t = d.kv.tokens;
    let plain = |m: QMatmulDims| QMatmulDims {
        accumulate: false,
        ..m
    };
    let [pqkv, po, pgu, pdown] = d.projections().map(plain);
    let xn = rms_norm(x, l.attn_norm, t, d.dim, d.eps);
    let qkv = qmatmul(l.qkv.0, l.qkv.1, &xn, &[], pqkv);
    let (q, kc, vc) = rope_kv(&qkv, positions, k_cache, v_cache, d.kv);
    let att = attention_kv(&q, &kc, &vc, positions, d.kv);
    let add =
        |a: &[f64], b: Vec<f64>| -> Vec<f64> { a.iter().zip(b).map(|(a, b)| a + b).collect() };
    let x0: Vec<f64> = x.iter().map(|&v| f(v)).collect();
    let x1 = add(&x0, qmatmul(l.wo.0, l.wo.1, &att, &[], po));
    let xn = rms_norm(&x1, l.ffn_norm, t, d.dim, d.eps);
    let h = qmatmul_swiglu(l.gate.0, l.gate.1, l.up, &xn, &[], pgu);
    let x2 = add(&x1, qmatmul(l.down.0, l.down.1, &h, &[], pdown));
    (x2, kc, vc)
}
