//! The size checks of every compute op, written once for all backends.
//!
//! Each function takes an op's dimensions and returns the element count every buffer
//! argument must hold ([`Needs`], in the argument order of the [`ComputeBackend`]
//! method), or [`Error::ShapeMismatch`] when the dimensions are inconsistent or their
//! products overflow `usize` (all arithmetic is checked: nothing wraps in a release
//! build). [`Needs::check`] then compares the lengths with the actual buffers.
//!
//! Limits of a particular device (32-bit GPU indices, grid sizes) are the backend's
//! business and are [`Error::InvalidArgument`].
//!
//! ```
//! use ringkernel_core::compute::{checks, MatmulDims};
//! let needs = checks::matmul(MatmulDims { batch: 2, m: 3, k: 4, n: 5, b_batched: false })?;
//! assert_eq!((needs.elems(0), needs.elems(1), needs.elems(2)), (24, 20, 30));
//! assert!(checks::matmul(MatmulDims { batch: usize::MAX, m: 3, k: 4, n: 5, b_batched: true })
//!     .is_err());
//! # Ok::<(), ringkernel_core::Error>(())
//! ```
//!
//! [`ComputeBackend`]: super::ComputeBackend

use super::{
    check_len, AttentionDims, BroadcastDims, DType, DeviceBuffer, EmbeddingDims, KvDims,
    MatmulDims, QMatmulDims, ReduceDims, RopeDims, WeightFormat, MAX_BROADCAST_RANK,
};
use crate::error::{Error, Result};

/// The minimum length of one buffer argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Need {
    /// Which argument (0-based, in the op method's order, buffers only).
    pub arg: usize,
    /// Elements it must hold at least.
    pub elems: usize,
    /// What it is, for the error message.
    pub what: &'static str,
}

/// The minimum lengths of an op's buffer arguments.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Needs {
    /// The op, for error messages.
    pub op: &'static str,
    /// One entry per buffer argument, in argument order.
    pub args: Vec<Need>,
}

impl Needs {
    fn new(op: &'static str, lens: &[(usize, &'static str)]) -> Self {
        Needs {
            op,
            args: lens
                .iter()
                .enumerate()
                .map(|(arg, &(elems, what))| Need { arg, elems, what })
                .collect(),
        }
    }

    /// Elements argument `arg` must hold (0 for an argument the op does not have).
    pub fn elems(&self, arg: usize) -> usize {
        self.args.get(arg).map_or(0, |n| n.elems)
    }

    /// [`Error::ShapeMismatch`] unless every buffer of `bufs` (in argument order) is
    /// long enough; [`Error::InvalidArgument`] if `bufs` has the wrong count.
    pub fn check(&self, bufs: &[&dyn DeviceBuffer]) -> Result<()> {
        if bufs.len() != self.args.len() {
            return Err(Error::invalid(format!(
                "{}: {} buffers given, the op takes {}",
                self.op,
                bufs.len(),
                self.args.len()
            )));
        }
        for (n, b) in self.args.iter().zip(bufs) {
            check_len(*b, n.elems, &format!("{} {}", self.op, n.what))?;
        }
        Ok(())
    }
}

/// The product of `dims`, or [`Error::ShapeMismatch`] when it overflows `usize`.
pub fn product(dims: &[usize], what: &str) -> Result<usize> {
    dims.iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| Error::shape(format!("{what}: element count of {dims:?} overflows")))
}

/// [`Error::ShapeMismatch`] unless elements `offset..offset + n` lie inside `buf`
/// (for `read`, `write` and `copy`).
pub fn range(buf: &dyn DeviceBuffer, offset: usize, n: usize, what: &str) -> Result<()> {
    let end = offset
        .checked_add(n)
        .ok_or_else(|| Error::shape(format!("{what}: offset {offset} + {n} overflows")))?;
    check_len(buf, end, what)
}

/// The checks of `copy(src, src_offset, dst, dst_offset, len)`, given as
/// `(src, src_offset)` and `(dst, dst_offset)`: both ranges inside their buffers
/// ([`Error::ShapeMismatch`]) and, within one buffer, not overlapping
/// ([`Error::InvalidArgument`]).
pub fn copy(
    from: (&dyn DeviceBuffer, usize),
    to: (&dyn DeviceBuffer, usize),
    len: usize,
) -> Result<()> {
    let ((src, so), (dst, d)) = (from, to);
    range(src, so, len, "copy source")?;
    range(dst, d, len, "copy destination")?;
    // Both ends are in range, so these sums do not overflow.
    if len > 0 && same(src, dst) && so < d + len && d < so + len {
        return Err(Error::invalid(
            "copy: source and destination ranges of one buffer overlap",
        ));
    }
    Ok(())
}

/// Whether two buffer references are the same buffer.
pub fn same(a: &dyn DeviceBuffer, b: &dyn DeviceBuffer) -> bool {
    std::ptr::addr_eq(a as *const dyn DeviceBuffer, b as *const dyn DeviceBuffer)
}

/// [`Error::InvalidArgument`] if the output `out` is one of `inputs`.
pub fn distinct(op: &str, out: &dyn DeviceBuffer, inputs: &[&dyn DeviceBuffer]) -> Result<()> {
    if inputs.iter().any(|i| same(*i, out)) {
        return Err(Error::invalid(format!(
            "{op}: the output buffer must not alias an input"
        )));
    }
    Ok(())
}

/// [`distinct`] for `bufs[i]` against every other buffer of `bufs` (an op's outputs,
/// checked one at a time against everything else it is given).
pub fn distinct_from_others(op: &str, bufs: &[&dyn DeviceBuffer], i: usize) -> Result<()> {
    let out = bufs[i];
    if bufs
        .iter()
        .enumerate()
        .any(|(j, b)| j != i && same(*b, out))
    {
        return Err(Error::invalid(format!(
            "{op}: the output buffer must not alias an input"
        )));
    }
    Ok(())
}

fn elementwise(op: &'static str, inputs: &[&'static str], len: usize) -> Needs {
    let mut lens: Vec<(usize, &'static str)> = inputs.iter().map(|&w| (len, w)).collect();
    lens.push((len, "output"));
    Needs::new(op, &lens)
}

/// `unary(op, x, out, len)`.
pub fn unary(len: usize) -> Needs {
    elementwise("unary", &["input"], len)
}

/// `binary(op, a, b, out, len)`.
pub fn binary(len: usize) -> Needs {
    elementwise("binary", &["lhs", "rhs"], len)
}

/// `binary_scalar(op, a, s, out, len)`.
pub fn binary_scalar(len: usize) -> Needs {
    elementwise("binary_scalar", &["input"], len)
}

/// `swiglu(gate, up, out, len)`.
pub fn swiglu(len: usize) -> Needs {
    elementwise("swiglu", &["gate", "up"], len)
}

/// `argmax(x, len, out)`: at least one element, and an index that fits 32 bits.
pub fn argmax(len: usize) -> Result<Needs> {
    if len == 0 {
        return Err(Error::invalid("argmax of no elements"));
    }
    if u32::try_from(len).is_err() {
        return Err(Error::invalid(format!(
            "argmax of {len} elements: the index is written as 32 bits"
        )));
    }
    Ok(Needs::new("argmax", &[(len, "input"), (1, "output")]))
}

/// `dot(a, b, out, len)`.
pub fn dot(len: usize) -> Needs {
    Needs::new("dot", &[(len, "lhs"), (len, "rhs"), (1, "output")])
}

/// `matmul(a, b, out, dims)`: A `[batch, m, k]`, B `[batch or 1, k, n]`, out
/// `[batch, m, n]`; also `batch · m · n · k` (the work) must fit `usize`.
pub fn matmul(d: MatmulDims) -> Result<Needs> {
    let b_batches = if d.b_batched { d.batch } else { 1 };
    let a = product(&[d.batch, d.m, d.k], "matmul lhs")?;
    let b = product(&[b_batches, d.k, d.n], "matmul rhs")?;
    let c = product(&[d.batch, d.m, d.n], "matmul output")?;
    product(&[d.batch, d.m, d.n, d.k], "matmul work")?;
    Ok(Needs::new(
        "matmul",
        &[(a, "lhs"), (b, "rhs"), (c, "output")],
    ))
}

/// `matvec(a, x, out, m, k)`.
pub fn matvec(m: usize, k: usize) -> Result<Needs> {
    let a = product(&[m, k], "matvec matrix")?;
    Ok(Needs::new(
        "matvec",
        &[(a, "matrix"), (k, "vector"), (m, "output")],
    ))
}

/// `reduce(op, x, out, dims)`; an empty axis is [`Error::ShapeMismatch`].
pub fn reduce(d: ReduceDims) -> Result<Needs> {
    if d.axis == 0 {
        return Err(Error::shape("reduce: the reduced axis is empty"));
    }
    let x = product(&[d.outer, d.axis, d.inner], "reduce input")?;
    let out = product(&[d.outer, d.inner], "reduce output")?;
    Ok(Needs::new("reduce", &[(x, "input"), (out, "output")]))
}

/// `softmax(x, out, rows, cols)`.
pub fn softmax(rows: usize, cols: usize) -> Result<Needs> {
    let n = product(&[rows, cols], "softmax")?;
    Ok(Needs::new("softmax", &[(n, "input"), (n, "output")]))
}

/// `rms_norm(x, weight, out, rows, cols, eps)`.
pub fn rms_norm(rows: usize, cols: usize) -> Result<Needs> {
    let n = product(&[rows, cols], "rms_norm")?;
    Ok(Needs::new(
        "rms_norm",
        &[(n, "input"), (cols, "weight"), (n, "output")],
    ))
}

/// `layer_norm(x, weight, bias, out, rows, cols, eps)`.
pub fn layer_norm(rows: usize, cols: usize) -> Result<Needs> {
    let n = product(&[rows, cols], "layer_norm")?;
    Ok(Needs::new(
        "layer_norm",
        &[
            (n, "input"),
            (cols, "weight"),
            (cols, "bias"),
            (n, "output"),
        ],
    ))
}

/// `rope(x, positions, out, dims)`; an odd `head_dim` is [`Error::ShapeMismatch`].
pub fn rope(d: RopeDims) -> Result<Needs> {
    if !d.head_dim.is_multiple_of(2) {
        return Err(Error::shape(format!(
            "rope: head_dim must be even, got {}",
            d.head_dim
        )));
    }
    let n = product(&[d.seq, d.heads, d.head_dim], "rope")?;
    Ok(Needs::new(
        "rope",
        &[(n, "input"), (d.seq, "positions"), (n, "output")],
    ))
}

/// Element counts of an attention call's tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionSizes {
    /// Q and the output: `batch_heads · q_len · head_dim`.
    pub q: usize,
    /// K and V: `batch_heads · kv_stride · head_dim`.
    pub kv: usize,
    /// Scores / probabilities: `batch_heads · q_len · kv_len`.
    pub scores: usize,
}

/// The tensor sizes of an attention call; `kv_stride < kv_len` is
/// [`Error::ShapeMismatch`].
pub fn attention_sizes(d: &AttentionDims) -> Result<AttentionSizes> {
    if d.kv_stride < d.kv_len {
        return Err(Error::shape(format!(
            "attention: kv_stride {} is smaller than kv_len {}",
            d.kv_stride, d.kv_len
        )));
    }
    Ok(AttentionSizes {
        q: product(&[d.batch_heads, d.q_len, d.head_dim], "attention q")?,
        kv: product(&[d.batch_heads, d.kv_stride, d.head_dim], "attention k/v")?,
        scores: product(&[d.batch_heads, d.q_len, d.kv_len], "attention scores")?,
    })
}

/// `attention_scores(q, k, out, dims)`.
pub fn attention_scores(d: &AttentionDims) -> Result<Needs> {
    let s = attention_sizes(d)?;
    Ok(Needs::new(
        "attention_scores",
        &[(s.q, "q"), (s.kv, "k"), (s.scores, "scores")],
    ))
}

/// `attention_weighted_sum(p, v, out, dims)`.
pub fn attention_weighted_sum(d: &AttentionDims) -> Result<Needs> {
    let s = attention_sizes(d)?;
    Ok(Needs::new(
        "attention_weighted_sum",
        &[(s.scores, "probabilities"), (s.kv, "v"), (s.q, "output")],
    ))
}

/// `attention(q, k, v, out, dims)`.
pub fn attention(d: &AttentionDims) -> Result<Needs> {
    let s = attention_sizes(d)?;
    Ok(Needs::new(
        "attention",
        &[(s.q, "q"), (s.kv, "k"), (s.kv, "v"), (s.q, "output")],
    ))
}

/// `convert(x, from, out, to, len)`: buffer lengths in words; `U32` to or from a float
/// type is [`Error::InvalidArgument`].
pub fn convert(from: DType, to: DType, len: usize) -> Result<Needs> {
    if from.is_float() != to.is_float() {
        return Err(Error::invalid(format!(
            "convert: {from} to {to}: u32 converts only to u32"
        )));
    }
    Ok(Needs::new(
        "convert",
        &[(from.words(len), "input"), (to.words(len), "output")],
    ))
}

/// The shape of `op(a, b)` under numpy's broadcasting rules and the [`BroadcastDims`]
/// that compute it: shapes are aligned at their last dimension; two dimensions agree
/// when they are equal or one of them is 1 (or missing). Neighbouring dimensions that
/// broadcast alike are merged, so `[2, 3, 4] + [4]` is one `[6, 4]` broadcast. Shapes
/// that do not agree, or empty ones, are [`Error::ShapeMismatch`]; more than
/// [`MAX_BROADCAST_RANK`] dimensions left after merging is [`Error::InvalidArgument`].
///
/// ```
/// use ringkernel_core::compute::checks;
/// let (shape, dims) = checks::broadcast(&[2, 3], &[3])?;
/// assert_eq!(shape, vec![2, 3]);
/// assert_eq!((dims.rank, dims.a_strides[..2].to_vec(), dims.b_strides[..2].to_vec()),
///            (2, vec![3, 1], vec![0, 1]));
/// assert!(checks::broadcast(&[2, 3], &[2]).is_err());
/// # Ok::<(), ringkernel_core::Error>(())
/// ```
pub fn broadcast(a: &[usize], b: &[usize]) -> Result<(Vec<usize>, BroadcastDims)> {
    let bad = || {
        Error::shape(format!(
            "broadcast: shapes {a:?} and {b:?} do not broadcast (each dimension, from the \
             last, must be equal or 1)"
        ))
    };
    let rank = a.len().max(b.len());
    let dim = |s: &[usize], i: usize| -> usize {
        // i counts from the front of the output; missing leading dims are 1
        (i + s.len()).checked_sub(rank).map_or(1, |j| s[j])
    };
    let mut shape = Vec::with_capacity(rank);
    for i in 0..rank {
        let (x, y) = (dim(a, i), dim(b, i));
        shape.push(match (x, y) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return Err(bad()),
        });
    }
    product(&shape, "broadcast output")?;
    if shape.contains(&0) {
        return Err(Error::shape(format!(
            "broadcast: shapes {a:?} and {b:?} have no elements"
        )));
    }
    // Merge runs of dimensions (from the last) with the same (a broadcast, b broadcast)
    // pattern; size-1 output dimensions drop out.
    let mut merged: Vec<(usize, bool, bool)> = Vec::new(); // (extent, a real, b real), innermost first
    for i in (0..rank).rev() {
        let n = shape[i];
        if n == 1 {
            continue;
        }
        let key = (dim(a, i) == n, dim(b, i) == n);
        match merged.last_mut() {
            Some(last) if (last.1, last.2) == key => last.0 *= n,
            _ => merged.push((n, key.0, key.1)),
        }
    }
    if merged.is_empty() {
        merged.push((1, true, true));
    }
    if merged.len() > MAX_BROADCAST_RANK {
        return Err(Error::invalid(format!(
            "broadcast: {a:?} and {b:?} need {} dimensions after merging, the kernels take \
             at most {MAX_BROADCAST_RANK}",
            merged.len()
        )));
    }
    let mut d = BroadcastDims {
        rank: merged.len(),
        shape: [1; MAX_BROADCAST_RANK],
        a_strides: [0; MAX_BROADCAST_RANK],
        b_strides: [0; MAX_BROADCAST_RANK],
    };
    let (mut sa, mut sb) = (1usize, 1usize);
    for (k, &(n, ra, rb)) in merged.iter().enumerate() {
        let slot = merged.len() - 1 - k;
        d.shape[slot] = n;
        if ra {
            d.a_strides[slot] = sa;
            sa *= n;
        }
        if rb {
            d.b_strides[slot] = sb;
            sb *= n;
        }
    }
    Ok((shape, d))
}

/// `broadcast_binary(op, a, b, out, dims)`: `a` and `b` must reach their largest
/// strided index, `out` holds the product of the shape. A rank outside
/// `1..=`[`MAX_BROADCAST_RANK`] is [`Error::InvalidArgument`].
pub fn broadcast_binary(d: &BroadcastDims) -> Result<Needs> {
    if d.rank == 0 || d.rank > MAX_BROADCAST_RANK {
        return Err(Error::invalid(format!(
            "broadcast_binary: rank {} outside 1..={MAX_BROADCAST_RANK}",
            d.rank
        )));
    }
    let shape = &d.shape[..d.rank];
    let out = product(shape, "broadcast output")?;
    let reach = |strides: &[usize]| -> Result<usize> {
        if out == 0 {
            return Ok(0);
        }
        shape.iter().zip(strides).try_fold(1usize, |acc, (&n, &s)| {
            (n - 1)
                .checked_mul(s)
                .and_then(|v| acc.checked_add(v))
                .ok_or_else(|| Error::shape("broadcast_binary: strides overflow"))
        })
    };
    Ok(Needs::new(
        "broadcast_binary",
        &[
            (reach(&d.a_strides[..d.rank])?, "lhs"),
            (reach(&d.b_strides[..d.rank])?, "rhs"),
            (out, "output"),
        ],
    ))
}

/// `embedding(table, format, ids, out, dims)`.
pub fn embedding(format: WeightFormat, d: EmbeddingDims) -> Result<Needs> {
    let table = format.words(d.rows, d.cols)?;
    let out = product(&[d.count, d.cols], "embedding output")?;
    Ok(Needs::new(
        "embedding",
        &[(table, "table"), (d.count, "ids"), (out, "output")],
    ))
}

/// `greedy_feed`'s buffers (see `decoder::GreedyFeed`): logits `[rows]`, the table,
/// the token word, the next input `[cols]` and the position word; `rows` as for
/// [`argmax`], `cols` as for [`embedding`].
pub fn greedy_feed(format: WeightFormat, rows: usize, cols: usize) -> Result<Needs> {
    argmax(rows)?;
    let e = embedding(
        format,
        EmbeddingDims {
            rows,
            cols,
            count: 1,
        },
    )?;
    Ok(Needs::new(
        "greedy_feed",
        &[
            (rows, "logits"),
            (e.elems(0), "table"),
            (1, "token"),
            (cols, "next input"),
            (1, "position"),
        ],
    ))
}

/// `qmatmul(w, format, x, out, dims)`.
pub fn qmatmul(format: WeightFormat, d: QMatmulDims) -> Result<Needs> {
    let w = format.words(d.rows, d.cols)?;
    let x = product(&[d.batch, d.cols], "qmatmul input")?;
    let out = product(&[d.batch, d.rows], "qmatmul output")?;
    product(&[d.batch, d.rows, d.cols], "qmatmul work")?;
    Ok(Needs::new(
        "qmatmul",
        &[(w, "weights"), (x, "input"), (out, "output")],
    ))
}

/// `qmatmul_swiglu(w_gate, w_up, format, x, out, dims)`.
pub fn qmatmul_swiglu(format: WeightFormat, d: QMatmulDims) -> Result<Needs> {
    let q = qmatmul(format, d)?;
    Ok(Needs::new(
        "qmatmul_swiglu",
        &[
            (q.elems(0), "gate weights"),
            (q.elems(0), "up weights"),
            (q.elems(1), "input"),
            (q.elems(2), "output"),
        ],
    ))
}

/// The weight matrices of a projection: one, or two (gate and up, SwiGLU).
pub fn projection_matrices(op: &str, count: usize) -> Result<()> {
    if matches!(count, 1 | 2) {
        return Ok(());
    }
    Err(Error::invalid(format!(
        "{op}: {count} weight matrices (one, or gate and up)"
    )))
}

/// Element counts of a [`KvDims`] call's tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvSizes {
    /// `qkv`: `tokens · (heads + 2·kv_heads) · head_dim`.
    pub qkv: usize,
    /// Queries and the attention output: `tokens · heads · head_dim`.
    pub q: usize,
    /// Each cache: `kv_heads · capacity · head_dim`.
    pub cache: usize,
}

/// The sizes of a [`KvDims`] call; an odd `head_dim`, no heads, or `heads` not a multiple
/// of `kv_heads` is [`Error::ShapeMismatch`].
pub fn kv_sizes(d: &KvDims) -> Result<KvSizes> {
    if d.kv_heads == 0 || d.heads == 0 || !d.heads.is_multiple_of(d.kv_heads) {
        return Err(Error::shape(format!(
            "kv attention: {} query heads must be a non-zero multiple of {} key/value heads",
            d.heads, d.kv_heads
        )));
    }
    if !d.head_dim.is_multiple_of(2) {
        return Err(Error::shape(format!(
            "kv attention: head_dim must be even, got {}",
            d.head_dim
        )));
    }
    let width = d
        .kv_heads
        .checked_mul(2)
        .and_then(|k| k.checked_add(d.heads))
        .ok_or_else(|| Error::shape("kv attention: head count overflows"))?;
    Ok(KvSizes {
        qkv: product(&[d.tokens, width, d.head_dim], "qkv")?,
        q: product(&[d.tokens, d.heads, d.head_dim], "queries")?,
        cache: product(&[d.kv_heads, d.capacity, d.head_dim], "kv cache")?,
    })
}

/// `rope_kv(qkv, positions, q, k_cache, v_cache, dims)`.
pub fn rope_kv(d: &KvDims) -> Result<Needs> {
    let s = kv_sizes(d)?;
    Ok(Needs::new(
        "rope_kv",
        &[
            (s.qkv, "qkv"),
            (d.tokens, "positions"),
            (s.q, "queries"),
            (s.cache, "k cache"),
            (s.cache, "v cache"),
        ],
    ))
}

/// `attention_kv(q, k_cache, v_cache, positions, out, dims)`; an empty cache
/// (`capacity = 0`) with tokens to attend is [`Error::ShapeMismatch`].
pub fn attention_kv(d: &KvDims) -> Result<Needs> {
    let s = kv_sizes(d)?;
    if d.capacity == 0 && d.tokens > 0 {
        return Err(Error::shape("attention_kv: the cache holds no positions"));
    }
    Ok(Needs::new(
        "attention_kv",
        &[
            (s.q, "queries"),
            (s.cache, "k cache"),
            (s.cache, "v cache"),
            (d.tokens, "positions"),
            (s.q, "output"),
        ],
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HUGE: usize = usize::MAX / 2 + 1;

    fn shape<T: std::fmt::Debug>(r: Result<T>) {
        assert!(matches!(r, Err(Error::ShapeMismatch(_))), "{r:?}");
    }

    #[test]
    fn products_overflow_into_errors() {
        assert_eq!(product(&[3, 4, 5], "x").unwrap(), 60);
        assert_eq!(product(&[], "x").unwrap(), 1);
        assert_eq!(product(&[HUGE, 0], "x").unwrap(), 0);
        shape(product(&[HUGE, 2], "x"));
        let mm = |batch, m, k, n| MatmulDims {
            batch,
            m,
            k,
            n,
            b_batched: true,
        };
        shape(matmul(mm(HUGE, 2, 1, 1)));
        shape(matmul(mm(1, 1, HUGE, 2)));
        shape(matmul(mm(1 << 20, 1 << 20, 1 << 20, 1 << 20)));
        shape(matvec(HUGE, 4));
        shape(reduce(ReduceDims {
            outer: 3,
            axis: HUGE,
            inner: 1,
        }));
        shape(reduce(ReduceDims {
            outer: 1,
            axis: 0,
            inner: 1,
        }));
        shape(softmax(HUGE, 2));
        shape(rms_norm(2, HUGE));
        shape(layer_norm(HUGE, HUGE));
        shape(rope(RopeDims {
            seq: HUGE,
            heads: 2,
            head_dim: 2,
            base: 1e4,
        }));
        shape(rope(RopeDims {
            seq: 1,
            heads: 1,
            head_dim: 3,
            base: 1e4,
        }));
        let ad = AttentionDims {
            batch_heads: HUGE,
            q_len: 2,
            kv_len: 1,
            kv_stride: 1,
            head_dim: 1,
            scale: 1.0,
            causal: false,
            q_offset: 0,
        };
        shape(attention(&ad));
        shape(attention_scores(&AttentionDims {
            batch_heads: 1,
            kv_len: HUGE,
            kv_stride: HUGE,
            ..ad
        }));
        shape(attention_weighted_sum(&AttentionDims {
            batch_heads: 1,
            kv_len: 2,
            ..ad
        }));
    }

    #[test]
    fn needs_follow_argument_order() {
        let n = matmul(MatmulDims {
            batch: 2,
            m: 3,
            k: 4,
            n: 5,
            b_batched: false,
        })
        .unwrap();
        assert_eq!(
            n.args.iter().map(|a| a.elems).collect::<Vec<_>>(),
            [24, 20, 30]
        );
        let a = attention(&AttentionDims {
            batch_heads: 2,
            q_len: 3,
            kv_len: 4,
            kv_stride: 6,
            head_dim: 8,
            scale: 1.0,
            causal: true,
            q_offset: 0,
        })
        .unwrap();
        assert_eq!(
            a.args.iter().map(|a| a.elems).collect::<Vec<_>>(),
            [48, 96, 96, 48]
        );
        assert_eq!(layer_norm(3, 7).unwrap().elems(2), 7);
        assert_eq!(dot(9).elems(2), 1);
        assert_eq!(swiglu(5).args.len(), 3);
        assert_eq!(unary(5).elems(9), 0);
    }

    #[derive(Debug)]
    struct Buf(usize);
    impl DeviceBuffer for Buf {
        fn len(&self) -> usize {
            self.0
        }
        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
        fn backend(&self) -> crate::BackendKind {
            crate::BackendKind::Cpu
        }
    }

    #[test]
    fn buffers_are_checked_against_needs() {
        let (a, b, short) = (Buf(10), Buf(10), Buf(9));
        binary(10).check(&[&a, &b, &Buf(10)]).unwrap();
        shape(binary(10).check(&[&a, &short, &b]));
        assert!(matches!(
            binary(10).check(&[&a, &b]),
            Err(Error::InvalidArgument(_))
        ));
        range(&a, 4, 6, "read").unwrap();
        shape(range(&a, 5, 6, "read"));
        shape(range(&a, usize::MAX, 2, "read"));
        copy((&a, 0), (&a, 5), 5).unwrap();
        assert!(matches!(
            copy((&a, 0), (&a, 4), 5),
            Err(Error::InvalidArgument(_))
        ));
        copy((&a, 0), (&b, 0), 10).unwrap();
        shape(copy((&a, 1), (&b, 0), 10));
        distinct("unary", &b, &[&a]).unwrap();
        assert!(distinct("unary", &a, &[&b, &a]).is_err());
    }
}
