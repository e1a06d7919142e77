//! The compute-op trait every backend implements, and the shared argument types.
//!
//! Buffers are f32 arrays that live on their backend's device ([`DeviceBuffer`]), freed
//! when the last [`BufferRef`] goes. Ops take contiguous row-major buffers and explicit
//! dimensions; they are enqueued in order and may run asynchronously: `read` (and
//! `synchronize`) wait for the work before them. Shape checking against tensors is the
//! facade's job; every backend still checks the dimensions and buffer lengths of each
//! op with [`checks`] (written once, with checked arithmetic) so a bad call is an error
//! and never an out-of-bounds access.
//!
//! The f64 reference implementations every backend is tested against are in
//! [`reference`](mod@reference).
//!
//! Buffers hold 32-bit words: one f32 each for the float ops; [`dtype`] says how `f16`,
//! `bf16` and `u32` elements are packed into them and [`quant`] how the block formats of
//! weight matrices are. Such buffers are uploaded and read through the same `upload` /
//! `read` (their words carried as f32 bit patterns, see
//! [`dtype::words_as_f32`]).

use crate::backend::BackendKind;
use crate::error::{Error, Result};
use std::any::Any;
use std::fmt::Debug;
use std::sync::Arc;

pub use decoder::{
    BlockWeights, DecoderDims, DecoderLayer, DecoderScratch, DecoderScratchBuffers, GreedyFeed,
};
pub use dtype::DType;
pub use quant::WeightFormat;

pub mod checks;
pub mod decoder;
pub mod dtype;
pub mod quant;
pub mod reference;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;

/// A device-resident f32 buffer. Each backend downcasts to its own type.
pub trait DeviceBuffer: Send + Sync + Debug + 'static {
    /// Length in f32 elements.
    fn len(&self) -> usize;
    /// Whether the buffer has no elements.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// For downcasting to the backend's buffer type.
    fn as_any(&self) -> &dyn Any;
    /// The backend the buffer belongs to.
    fn backend(&self) -> BackendKind;
}

/// Implements [`DeviceBuffer`] for a backend's buffer type that keeps its length in
/// elements in a `len: usize` field: `impl_device_buffer!(MyBuffer, BackendKind::Cpu)`.
#[macro_export]
macro_rules! impl_device_buffer {
    ($ty:ty, $kind:expr) => {
        impl $crate::compute::DeviceBuffer for $ty {
            fn len(&self) -> usize {
                self.len
            }
            fn as_any(&self) -> &dyn ::std::any::Any {
                self
            }
            fn backend(&self) -> $crate::BackendKind {
                $kind
            }
        }
    };
}

/// A shared reference to a device buffer.
pub type BufferRef = Arc<dyn DeviceBuffer>;

/// Downcasts `buf` to backend type `T`, or [`Error::Device`] naming both backends.
pub fn downcast<T: DeviceBuffer>(buf: &dyn DeviceBuffer, me: BackendKind) -> Result<&T> {
    buf.as_any().downcast_ref::<T>().ok_or_else(|| {
        Error::Device(format!(
            "buffer belongs to the {} backend, not {me}: move it with to_device first",
            buf.backend()
        ))
    })
}

/// [`Error::ShapeMismatch`] unless `buf` holds at least `needed` elements.
pub fn check_len(buf: &dyn DeviceBuffer, needed: usize, what: &str) -> Result<()> {
    if buf.len() < needed {
        Err(Error::shape(format!(
            "{what}: buffer holds {} elements, op needs {needed}",
            buf.len()
        )))
    } else {
        Ok(())
    }
}

/// Elementwise functions of one argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    /// -x
    Neg,
    /// |x|
    Abs,
    /// √x
    Sqrt,
    /// eˣ
    Exp,
    /// ln x
    Log,
    /// sin x
    Sin,
    /// cos x
    Cos,
    /// tanh x
    Tanh,
    /// max(x, 0)
    Relu,
    /// 1 / (1 + e⁻ˣ)
    Sigmoid,
    /// x · sigmoid(x)
    Silu,
    /// GELU, tanh approximation: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))). The same
    /// formula on every backend (WGSL has no erf). Compute it as the equal
    /// `x / (1 + e^(−2u))`, `u = √(2/π)·(x + 0.044715·x³)`: `1 + tanh(u)` cancels for
    /// negative `x` and loses f32 precision there (the testkit's tolerance assumes the
    /// stable form).
    Gelu,
}

impl UnaryOp {
    /// Every unary op.
    pub const ALL: [UnaryOp; 12] = [
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Sqrt,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Sin,
        UnaryOp::Cos,
        UnaryOp::Tanh,
        UnaryOp::Relu,
        UnaryOp::Sigmoid,
        UnaryOp::Silu,
        UnaryOp::Gelu,
    ];
    /// Lower-case name (also the kernel entry-point suffix on GPUs).
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Abs => "abs",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Sin => "sin",
            UnaryOp::Cos => "cos",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Relu => "relu",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Silu => "silu",
            UnaryOp::Gelu => "gelu",
        }
    }
    /// Numeric code (shared with GPU kernels that switch on it).
    pub fn code(self) -> u32 {
        self as u32
    }
}

/// Elementwise functions of two arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    /// a + b
    Add,
    /// a − b
    Sub,
    /// a · b
    Mul,
    /// a / b
    Div,
    /// max(a, b)
    Max,
    /// min(a, b)
    Min,
}

impl BinaryOp {
    /// Every binary op.
    pub const ALL: [BinaryOp; 6] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Max,
        BinaryOp::Min,
    ];
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Max => "max",
            BinaryOp::Min => "min",
        }
    }
    /// Numeric code.
    pub fn code(self) -> u32 {
        self as u32
    }
}

/// Reductions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Σ
    Sum,
    /// max
    Max,
    /// min
    Min,
    /// Σ / n
    Mean,
}

impl ReduceOp {
    /// Every reduction.
    pub const ALL: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Mean];
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Mean => "mean",
        }
    }
    /// Numeric code.
    pub fn code(self) -> u32 {
        self as u32
    }
}

/// `out[b] = a[b] · b[b]` with `a: [batch, m, k]`, `b: [batch, k, n]` (or `[k, n]`
/// shared by every batch when `b_batched` is false), `out: [batch, m, n]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatmulDims {
    /// Batch count (1 for a 2-D product).
    pub batch: usize,
    /// Rows of A and out.
    pub m: usize,
    /// Columns of A, rows of B.
    pub k: usize,
    /// Columns of B and out.
    pub n: usize,
    /// Whether B has a batch dimension.
    pub b_batched: bool,
}

/// A reduction over the middle axis of `[outer, axis, inner]` into `[outer, inner]`.
/// A whole-tensor reduction is `outer = inner = 1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReduceDims {
    /// Product of the dimensions before the axis.
    pub outer: usize,
    /// Length of the reduced axis.
    pub axis: usize,
    /// Product of the dimensions after the axis.
    pub inner: usize,
}

/// Rotary position embedding, half-split layout: `x: [seq, heads, head_dim]`; for
/// position `p = positions[s]` and `i < head_dim/2`, with `θᵢ = p · base^(−2i/head_dim)`,
/// `out[i] = x[i]·cos θᵢ − x[i+h]·sin θᵢ`, `out[i+h] = x[i]·sin θᵢ + x[i+h]·cos θᵢ`
/// where `h = head_dim/2`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeDims {
    /// Sequence length (rows; `positions` has this many entries).
    pub seq: usize,
    /// Heads per row.
    pub heads: usize,
    /// Head dimension (even).
    pub head_dim: usize,
    /// Frequency base (10000 in most models).
    pub base: f32,
}

/// Attention over `batch_heads` independent heads.
///
/// * `q: [bh, q_len, head_dim]`
/// * `k, v: [bh, kv_stride, head_dim]`, of which the first `kv_len` rows are used
///   (so a KV cache of capacity `kv_stride` is used in place)
/// * scores / probabilities `[bh, q_len, kv_len]`, output `[bh, q_len, head_dim]`.
///
/// With `causal`, query `i` sits at absolute position `q_offset + i` and sees keys
/// `j <= q_offset + i`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionDims {
    /// Independent (batch × head) slices.
    pub batch_heads: usize,
    /// Query rows.
    pub q_len: usize,
    /// Key/value rows used.
    pub kv_len: usize,
    /// Row stride of K and V in rows (≥ `kv_len`).
    pub kv_stride: usize,
    /// Head dimension.
    pub head_dim: usize,
    /// Score scale (usually `1/√head_dim`).
    pub scale: f32,
    /// Causal masking.
    pub causal: bool,
    /// Absolute position of query row 0 (for causal decoding with a cache).
    pub q_offset: usize,
}

/// Most dimensions a [`BroadcastDims`] describes (after merging neighbours that
/// broadcast alike, see [`checks::broadcast`]).
pub const MAX_BROADCAST_RANK: usize = 8;

/// A binary op between two row-major operands under numpy's broadcasting rules,
/// described by strides: output element `i`, written as the multi-index `(i_0, …,
/// i_{rank-1})` over `shape` (last index fastest), reads `a[Σ i_d·a_strides[d]]` and
/// `b[Σ i_d·b_strides[d]]`. A broadcast dimension has stride 0. Build it with
/// [`checks::broadcast`] from the two shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BroadcastDims {
    /// Dimensions used (1 to [`MAX_BROADCAST_RANK`]).
    pub rank: usize,
    /// The output shape; entries past `rank` are 1.
    pub shape: [usize; MAX_BROADCAST_RANK],
    /// Element strides into `a` (0 where `a` is broadcast).
    pub a_strides: [usize; MAX_BROADCAST_RANK],
    /// Element strides into `b` (0 where `b` is broadcast).
    pub b_strides: [usize; MAX_BROADCAST_RANK],
}

/// `out[t, :] = table[ids[t], :]` for `t < count`, the table a `rows × cols` weight
/// matrix ([`WeightFormat`]) decoded to f32, `ids` `u32` words. An id `≥ rows` gives a
/// row of zeros (callers check ids they take from users; the kernels never read out of
/// bounds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EmbeddingDims {
    /// Rows of the table (the vocabulary).
    pub rows: usize,
    /// Columns (a multiple of 32).
    pub cols: usize,
    /// Ids to look up.
    pub count: usize,
}

/// `out[t, r] (+)= Σ_c W[r, c] · x[t, c]`: `batch` input rows `x: [batch, cols]` times
/// the transpose of a weight matrix `W: [rows, cols]` stored in a [`WeightFormat`]
/// (a linear layer; `batch = 1` is a matrix-vector product), into `out: [batch, rows]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QMatmulDims {
    /// Input rows (tokens).
    pub batch: usize,
    /// Rows of W (outputs per input row).
    pub rows: usize,
    /// Columns of W and of x (a multiple of 32).
    pub cols: usize,
    /// Add to `out` instead of overwriting it (a residual connection).
    pub accumulate: bool,
}

/// A decoder's attention over a KV cache kept on the device, for
/// [`ComputeBackend::rope_kv`] and [`ComputeBackend::attention_kv`].
///
/// * `qkv: [tokens, (heads + 2·kv_heads)·head_dim]`: per token the query heads, then the
///   key heads, then the value heads (one projection's output);
/// * `positions: [tokens]` (`u32` words): each token's absolute position, below
///   `capacity`;
/// * `q: [tokens, heads, head_dim]`, rotated queries; the attention output has the same
///   shape;
/// * `k_cache, v_cache: [kv_heads, capacity, head_dim]`.
///
/// RoPE is the half-split layout of [`RopeDims`] with frequency base `rope_base`. Query
/// head `h` attends key/value head `h / (heads / kv_heads)` (grouped-query attention),
/// at the cache rows `0..=positions[t]`, with scores scaled by `scale`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvDims {
    /// New tokens (rows of `qkv`).
    pub tokens: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (divides `heads`).
    pub kv_heads: usize,
    /// Head width (even).
    pub head_dim: usize,
    /// Positions the cache holds.
    pub capacity: usize,
    /// RoPE frequency base.
    pub rope_base: f32,
    /// Score scale (usually `1/√head_dim`).
    pub scale: f32,
}

/// A read queued by [`ComputeBackend::read_async`]: [`PendingRead::wait`] returns the
/// elements as they were when the work queued before the read had finished.
pub struct PendingRead(Box<dyn FnOnce() -> Result<Vec<f32>> + Send>);

impl PendingRead {
    /// A read whose data is already on the host.
    pub fn ready(data: Vec<f32>) -> Self {
        Self(Box::new(move || Ok(data)))
    }

    /// A read that `wait` finishes (a backend's own completion: an event, a fence).
    pub fn from_fn(wait: impl FnOnce() -> Result<Vec<f32>> + Send + 'static) -> Self {
        Self(Box::new(wait))
    }

    /// Blocks until the data is on the host and returns it.
    pub fn wait(self) -> Result<Vec<f32>> {
        (self.0)()
    }
}

impl std::fmt::Debug for PendingRead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PendingRead")
    }
}

/// Ops recorded by [`ComputeBackend::record`], replayed as one unit.
pub trait Replay: Send + Sync {
    /// Queues the recorded ops again, in order, like any op (asynchronously).
    fn replay(&self) -> Result<()>;
    /// What the recording became, for logs and benchmarks (for example "CUDA graph").
    fn describe(&self) -> String {
        "recorded".into()
    }
}

/// Tensor operations on one device. Object-safe; held as `Arc<dyn ComputeBackend>`.
///
/// Buffers passed to an op must belong to this backend (else [`Error::Device`]) and be
/// long enough (else [`Error::ShapeMismatch`]). `out` must not alias an input unless the
/// op says so.
pub trait ComputeBackend: Send + Sync + 'static {
    /// Which backend.
    fn kind(&self) -> BackendKind;
    /// Human-readable device name (adapter, GPU model, CPU).
    fn device_name(&self) -> String;

    /// Allocates `len` elements (contents unspecified).
    fn alloc(&self, len: usize) -> Result<BufferRef>;
    /// Allocates and fills from host data.
    fn upload(&self, data: &[f32]) -> Result<BufferRef>;
    /// Writes host data at `offset` (elements) into an existing buffer.
    fn write(&self, buf: &dyn DeviceBuffer, offset: usize, data: &[f32]) -> Result<()>;
    /// Reads `out.len()` elements from `offset`, after all queued work.
    fn read(&self, buf: &dyn DeviceBuffer, offset: usize, out: &mut [f32]) -> Result<()>;
    /// Queues a read of `len` elements from `offset`, taken after all work queued so far,
    /// and returns without waiting for it; [`PendingRead::wait`] returns them. Work
    /// queued after this call does not delay the wait where the backend can keep them
    /// apart (CUDA: a copy into pinned memory and an event), so a host can queue the
    /// next step before it looks at this one's result. The default reads at once.
    fn read_async(&self, buf: &dyn DeviceBuffer, offset: usize, len: usize) -> Result<PendingRead> {
        let mut out = vec![0f32; len];
        self.read(buf, offset, &mut out)?;
        Ok(PendingRead::ready(out))
    }
    /// Adds `by` (wrapping) to each of the `len` words at `offset` of `buf`, read as
    /// `u32` bit patterns (as [`ComputeBackend::argmax`] writes them): a counter on the
    /// device, such as a decode step's position, that a recorded step advances itself at
    /// every replay. The default goes through the host (a read, then a write), which
    /// waits for queued work and cannot be recorded; CUDA runs it as a kernel.
    fn increment(&self, buf: &dyn DeviceBuffer, offset: usize, len: usize, by: u32) -> Result<()> {
        checks::range(buf, offset, len, "increment")?;
        if len == 0 {
            return Ok(());
        }
        let mut words = vec![0f32; len];
        self.read(buf, offset, &mut words)?;
        for w in &mut words {
            *w = f32::from_bits(w.to_bits().wrapping_add(by));
        }
        self.write(buf, offset, &words)
    }
    /// Copies `len` elements between (or within non-overlapping parts of) buffers.
    fn copy(
        &self,
        src: &dyn DeviceBuffer,
        src_offset: usize,
        dst: &dyn DeviceBuffer,
        dst_offset: usize,
        len: usize,
    ) -> Result<()>;
    /// Waits until all queued work has finished.
    fn synchronize(&self) -> Result<()>;

    /// `out[i] = op(x[i])` for `i < len`.
    fn unary(
        &self,
        op: UnaryOp,
        x: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        len: usize,
    ) -> Result<()>;
    /// `out[i] = op(a[i], b[i])`.
    fn binary(
        &self,
        op: BinaryOp,
        a: &dyn DeviceBuffer,
        b: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        len: usize,
    ) -> Result<()>;
    /// `out[i] = op(a[i], s)`.
    fn binary_scalar(
        &self,
        op: BinaryOp,
        a: &dyn DeviceBuffer,
        s: f32,
        out: &dyn DeviceBuffer,
        len: usize,
    ) -> Result<()>;
    /// (Batched) matrix product, see [`MatmulDims`].
    fn matmul(
        &self,
        a: &dyn DeviceBuffer,
        b: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        dims: MatmulDims,
    ) -> Result<()>;
    /// `out[m] = A[m, k] · x[k]`.
    fn matvec(
        &self,
        a: &dyn DeviceBuffer,
        x: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        m: usize,
        k: usize,
    ) -> Result<()>;
    /// `out[0] = Σ a[i]·b[i]`.
    fn dot(
        &self,
        a: &dyn DeviceBuffer,
        b: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        len: usize,
    ) -> Result<()>;
    /// `out[0]` = the index of the largest of `x[0..len]` (the first at a tie; NaNs are
    /// passed over, and a NaN first value gives 0), as a `u32` bit pattern (read it with
    /// `f32::to_bits`): greedy sampling on the device, which reads back one word instead
    /// of the logits. `len` must be at least 1. [`reference::argmax`] is the definition.
    fn argmax(&self, x: &dyn DeviceBuffer, len: usize, out: &dyn DeviceBuffer) -> Result<()>;
    /// Reduction, see [`ReduceDims`]. `axis` must be at least 1.
    fn reduce(
        &self,
        op: ReduceOp,
        x: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        dims: ReduceDims,
    ) -> Result<()>;
    /// Numerically stable softmax over the last dimension of `[rows, cols]`.
    fn softmax(
        &self,
        x: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        rows: usize,
        cols: usize,
    ) -> Result<()>;
    /// `out = x / √(mean(x²) + eps) · weight` per row of `[rows, cols]`.
    fn rms_norm(
        &self,
        x: &dyn DeviceBuffer,
        weight: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        rows: usize,
        cols: usize,
        eps: f32,
    ) -> Result<()>;
    /// `out = (x − mean) / √(var + eps) · weight + bias` per row (biased variance).
    #[allow(clippy::too_many_arguments)]
    fn layer_norm(
        &self,
        x: &dyn DeviceBuffer,
        weight: &dyn DeviceBuffer,
        bias: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        rows: usize,
        cols: usize,
        eps: f32,
    ) -> Result<()>;
    /// RoPE, see [`RopeDims`]; `positions` holds `seq` positions as f32.
    fn rope(
        &self,
        x: &dyn DeviceBuffer,
        positions: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        dims: RopeDims,
    ) -> Result<()>;
    /// `scores = scale · Q·Kᵀ` (causal entries above the diagonal set to −∞).
    fn attention_scores(
        &self,
        q: &dyn DeviceBuffer,
        k: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        dims: AttentionDims,
    ) -> Result<()>;
    /// `out = P·V` for probabilities `P: [bh, q_len, kv_len]`.
    fn attention_weighted_sum(
        &self,
        p: &dyn DeviceBuffer,
        v: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        dims: AttentionDims,
    ) -> Result<()>;
    /// Fused scaled-dot-product attention `softmax(scale·Q·Kᵀ [+ causal mask])·V`.
    fn attention(
        &self,
        q: &dyn DeviceBuffer,
        k: &dyn DeviceBuffer,
        v: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        dims: AttentionDims,
    ) -> Result<()>;
    /// SwiGLU: `out[i] = silu(gate[i]) · up[i]`.
    fn swiglu(
        &self,
        gate: &dyn DeviceBuffer,
        up: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        len: usize,
    ) -> Result<()>;

    /// `len` elements of `x` stored as `from` written to `out` as `to` (see [`dtype`]:
    /// round to nearest even, the padding half of an odd half-precision output zeroed).
    /// Float types convert among themselves; `U32` only to `U32`
    /// ([`Error::InvalidArgument`] otherwise).
    fn convert(
        &self,
        x: &dyn DeviceBuffer,
        from: DType,
        out: &dyn DeviceBuffer,
        to: DType,
        len: usize,
    ) -> Result<()>;
    /// `out[i] = op(a[·], b[·])` under numpy broadcasting, see [`BroadcastDims`].
    fn broadcast_binary(
        &self,
        op: BinaryOp,
        a: &dyn DeviceBuffer,
        b: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        dims: &BroadcastDims,
    ) -> Result<()>;
    /// Embedding lookup, see [`EmbeddingDims`].
    fn embedding(
        &self,
        table: &dyn DeviceBuffer,
        format: WeightFormat,
        ids: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        dims: EmbeddingDims,
    ) -> Result<()>;
    /// `x · Wᵀ` on the stored blocks of `W`, see [`QMatmulDims`].
    fn qmatmul(
        &self,
        w: &dyn DeviceBuffer,
        format: WeightFormat,
        x: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        dims: QMatmulDims,
    ) -> Result<()>;
    /// A feed-forward gate: `out[t, r] (+)= silu((x·W_gateᵀ)[t, r]) · (x·W_upᵀ)[t, r]`,
    /// both matrices `rows × cols` in `format` (see [`QMatmulDims`]).
    #[allow(clippy::too_many_arguments)]
    fn qmatmul_swiglu(
        &self,
        w_gate: &dyn DeviceBuffer,
        w_up: &dyn DeviceBuffer,
        format: WeightFormat,
        x: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        dims: QMatmulDims,
    ) -> Result<()>;
    /// A pre-norm projection, as a decoder layer starts its attention and its feed-forward
    /// block: `rms_norm(x, norm, normed, dims.batch, dims.cols, eps)`, then
    /// [`qmatmul`](Self::qmatmul) of `normed` with `w[0]` (one matrix) or
    /// [`qmatmul_swiglu`](Self::qmatmul_swiglu) with `w[0]` (gate) and `w[1]` (up), into
    /// `out`. `normed` (`batch × cols`) is scratch: a backend that fuses the two steps may
    /// leave it unwritten (CUDA does for up to 4 tokens: one kernel instead of two). The
    /// default runs the two ops. Any other number of matrices is
    /// [`Error::InvalidArgument`].
    #[allow(clippy::too_many_arguments)]
    fn rms_norm_qmatmul(
        &self,
        x: &dyn DeviceBuffer,
        norm: &dyn DeviceBuffer,
        eps: f32,
        normed: &dyn DeviceBuffer,
        w: &[&dyn DeviceBuffer],
        format: WeightFormat,
        out: &dyn DeviceBuffer,
        dims: QMatmulDims,
    ) -> Result<()> {
        checks::projection_matrices("rms_norm_qmatmul", w.len())?;
        self.rms_norm(x, norm, normed, dims.batch, dims.cols, eps)?;
        match w {
            [w] => self.qmatmul(*w, format, normed, out, dims),
            _ => self.qmatmul_swiglu(w[0], w[1], format, normed, out, dims),
        }
    }
    /// Rotates the query and key heads of `qkv` (RoPE at each token's position), writes
    /// the queries to `q` and the keys and values into row `positions[t]` of each head of
    /// the caches; see [`KvDims`]. A position `≥ capacity` writes nothing to the caches.
    #[allow(clippy::too_many_arguments)]
    fn rope_kv(
        &self,
        qkv: &dyn DeviceBuffer,
        positions: &dyn DeviceBuffer,
        q: &dyn DeviceBuffer,
        k_cache: &dyn DeviceBuffer,
        v_cache: &dyn DeviceBuffer,
        dims: KvDims,
    ) -> Result<()>;
    /// Causal grouped-query attention of `q` over the cache rows `0..=positions[t]`
    /// (numerically stable softmax), see [`KvDims`]; positions past the cache are
    /// clamped to its last row. The lengths come from the device buffer `positions`,
    /// so a recorded decode step ([`ComputeBackend::record`]) replays at any position.
    #[allow(clippy::too_many_arguments)]
    fn attention_kv(
        &self,
        q: &dyn DeviceBuffer,
        k_cache: &dyn DeviceBuffer,
        v_cache: &dyn DeviceBuffer,
        positions: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        dims: KvDims,
    ) -> Result<()>;
    /// [`rope_kv`](Self::rope_kv), then [`attention_kv`](Self::attention_kv) of the rotated
    /// queries `q` into `out`: a decoder layer's attention after its QKV projection. The
    /// default runs the two ops; CUDA runs one kernel for a single token (a decode step).
    #[allow(clippy::too_many_arguments)]
    fn rope_attention_kv(
        &self,
        qkv: &dyn DeviceBuffer,
        positions: &dyn DeviceBuffer,
        q: &dyn DeviceBuffer,
        k_cache: &dyn DeviceBuffer,
        v_cache: &dyn DeviceBuffer,
        out: &dyn DeviceBuffer,
        dims: KvDims,
    ) -> Result<()> {
        self.rope_kv(qkv, positions, q, k_cache, v_cache, dims)?;
        self.attention_kv(q, k_cache, v_cache, positions, out, dims)
    }

    /// One pre-norm decoder layer of a llama-style model over `dims.kv.tokens` tokens at
    /// `positions`: `x` (`tokens × dim`, the residual stream) gets the attention's and
    /// the feed-forward block's outputs added, and the new keys and values go into the
    /// layer's caches (see [`decoder`]). The default runs the five ops of
    /// [`decoder::run_ops`]; CUDA runs a decode step (one token) in three kernels. The
    /// scratch buffers' contents afterwards are unspecified.
    fn decoder_layer(
        &self,
        x: &dyn DeviceBuffer,
        positions: &dyn DeviceBuffer,
        layer: &DecoderLayer,
        scratch: &DecoderScratch,
        dims: DecoderDims,
    ) -> Result<()> {
        decoder::check(x, scratch, &dims)?;
        decoder::run_ops(self, x, positions, layer, scratch, dims)
    }

    /// [`decoder_layer`](Self::decoder_layer) for each of `layers` in turn, on the same
    /// `x`, scratch and sizes (a model's stack of layers). The default calls it once a
    /// layer; CUDA runs a decode step's stack with one kernel fewer a layer boundary (the
    /// feed-forward block of a layer and the next layer's norm + QKV projection in one).
    fn decoder_layers(
        &self,
        x: &dyn DeviceBuffer,
        positions: &dyn DeviceBuffer,
        layers: &[DecoderLayer],
        scratch: &DecoderScratch,
        dims: DecoderDims,
    ) -> Result<()> {
        layers
            .iter()
            .try_for_each(|l| self.decoder_layer(x, positions, l, scratch, dims))
    }

    /// The end of a greedy decode step that feeds the next one (see
    /// [`decoder::GreedyFeed`]): the argmax of the logits to the token word, that
    /// token's row of the embedding table to the next input, and the position advanced
    /// by one. The size and aliasing checks are made before anything runs
    /// ([`decoder::GreedyFeed::check`]). The default is `argmax`,
    /// `embedding` and `increment`; CUDA runs one kernel.
    fn greedy_feed(&self, feed: &decoder::GreedyFeed) -> Result<()> {
        feed.run_ops(self)
    }

    /// Records the ops that `ops` queues on this backend into a [`Replay`] (a CUDA
    /// graph), or returns `Ok(None)` when the backend has no such thing; the ops are then
    /// not run (call them directly instead). Recorded ops keep their buffers and scalar
    /// arguments: what changes between replays must live in device buffers (written
    /// with [`ComputeBackend::write`] before [`Replay::replay`]). Ops that allocate
    /// temporaries or read back cannot be recorded ([`Error::InvalidArgument`]).
    fn record(&self, ops: &mut dyn FnMut() -> Result<()>) -> Result<Option<Box<dyn Replay>>> {
        let _ = ops;
        Ok(None)
    }

    /// Runs `ops` (several of this backend's ops, e.g. one decode step) as one batch.
    /// The default just calls it; the CPU backend runs it on its worker pool, so the ops
    /// inside do not each hand their work over to the pool and wait for it.
    fn batch(&self, ops: &mut (dyn FnMut() -> Result<()> + Send)) -> Result<()> {
        ops()
    }

    /// Device memory free for new buffers, in bytes, where the backend can tell.
    fn memory_available(&self) -> Option<u64> {
        None
    }
}
