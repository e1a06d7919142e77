//! Uniform parameter blocks (binding 0 of every kernel), `#[repr(C)]` and laid out
//! exactly like the WGSL structs of the same name (checked by the layout tests).
//! Every block is a multiple of 16 bytes (uniform buffer rules).

use bytemuck::{Pod, Zeroable};

/// `ElementwiseParams` in `elementwise.wgsl` (Unary, Binary, BinaryScalar, Swiglu).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
pub struct Elementwise {
    /// Elements (vec4s for the `*4` kernels) in all: the kernels process indices
    /// `first..len`.
    pub len: u32,
    /// Scalar operand of `BinaryScalar`.
    pub scalar: f32,
    /// First index processed (the scalar kernels finish the last `len % 4` elements
    /// after a `*4` kernel did the rest).
    pub first: u32,
    /// Padding.
    pub _pad: u32,
}

/// `MatmulParams` in `matmul.wgsl` (Matmul, Matvec).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
pub struct Matmul {
    /// Rows of A and out.
    pub m: u32,
    /// Columns of A, rows of B.
    pub k: u32,
    /// Columns of B and out.
    pub n: u32,
    /// Batch count.
    pub batch: u32,
    /// Elements between batches of A (`m*k`).
    pub a_stride: u32,
    /// Elements between batches of B (`k*n`, or 0 when B is shared).
    pub b_stride: u32,
    /// Elements between batches of out (`m*n`).
    pub c_stride: u32,
    /// Padding.
    pub _pad: u32,
}

/// `ReduceParams` in `reduce.wgsl` (ReduceRows, ReduceStrided, DotPartial).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
pub struct Reduce {
    /// Rows (`outer`) of the reduction.
    pub outer: u32,
    /// Length of the reduced axis.
    pub axis: u32,
    /// Elements after the axis (1 for ReduceRows and DotPartial).
    pub inner: u32,
    /// Chunks each row is split into (ReduceRows, DotPartial); output is
    /// `[outer, chunks]`.
    pub chunks: u32,
    /// Elements per chunk.
    pub chunk_len: u32,
    /// Factor applied to each result (1, or `1/n` for a mean's last pass).
    pub scale: f32,
    /// Padding.
    pub _pad: [u32; 2],
}

/// `NormParams` in `norm.wgsl` (Softmax, RmsNorm, LayerNorm).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
pub struct Norm {
    /// Rows.
    pub rows: u32,
    /// Columns (the normalised dimension).
    pub cols: u32,
    /// Epsilon of the norms.
    pub eps: f32,
    /// Padding.
    pub _pad: u32,
}

/// `RopeParams` in `attention.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
pub struct Rope {
    /// Sequence length.
    pub seq: u32,
    /// Heads per row.
    pub heads: u32,
    /// Head dimension (even).
    pub head_dim: u32,
    /// Frequency base.
    pub base: f32,
}

/// `AttentionParams` in `attention.wgsl` (AttentionScores, AttentionWeightedSum,
/// Attention); see [`AttentionDims`](ringkernel_core::compute::AttentionDims).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
pub struct Attention {
    /// Independent heads.
    pub batch_heads: u32,
    /// Query rows.
    pub q_len: u32,
    /// Key/value rows used.
    pub kv_len: u32,
    /// Row stride of K and V, in rows.
    pub kv_stride: u32,
    /// Head dimension.
    pub head_dim: u32,
    /// Score scale.
    pub scale: f32,
    /// 1 for causal masking.
    pub causal: u32,
    /// Absolute position of query row 0.
    pub q_offset: u32,
}

/// `RkDrainParams` in `drain.wgsl`: one drain pass.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct Drain {
    /// Id of the kernel being drained.
    pub kernel_id: u32,
    /// Messages in this batch.
    pub count: u32,
    /// Queue index of the first message, low word.
    pub first_lo: u32,
    /// Queue index of the first message, high word.
    pub first_hi: u32,
    /// The kernel's HLC at the start of the pass (packed), low word.
    pub hlc_lo: u32,
    /// HLC high word.
    pub hlc_hi: u32,
    /// Slot size in 32-bit words.
    pub slot_words: u32,
    /// `capacity - 1` of the input and output rings (equal capacities).
    pub mask: u32,
    /// Words of handler state (`rk_state` length).
    pub state_words: u32,
    /// Node id of the kernel's clock (`ctx.node_id`; with `hlc`, the kernel's full
    /// HLC timestamp), low word.
    pub node_lo: u32,
    /// Node id, high word.
    pub node_hi: u32,
    /// Zero: the pass's requests are in the input ring, slot by slot. Otherwise the
    /// pass is *compact* (see [`crate::drain`]'s "Compact passes"): the input binding
    /// holds the pass alone, request `j`'s payload at word `j · in_stride`, and the
    /// headers come from the run table.
    pub in_stride: u32,
    /// Compact passes: entries of the run table (at least 1).
    pub runs: u32,
    /// Compact passes: word of the run table's first header (16 words an entry).
    pub runs_at: u32,
    /// Compact passes: word of the runs' first batch indices (`runs` words, rising).
    pub starts_at: u32,
    /// Padding.
    pub _pad: u32,
}

/// One entry of [`LAYOUTS`]: WGSL struct name, size, `(field, offset)` pairs.
pub type LayoutEntry = (&'static str, usize, &'static [(&'static str, usize)]);

/// Field tables of every parameter block (see the module docs).
pub const LAYOUTS: &[LayoutEntry] = &[
    (
        "ElementwiseParams",
        std::mem::size_of::<Elementwise>(),
        &[("len", 0), ("scalar", 4), ("first", 8), ("_pad1", 12)],
    ),
    (
        "MatmulParams",
        std::mem::size_of::<Matmul>(),
        &[
            ("m", 0),
            ("k", 4),
            ("n", 8),
            ("batch", 12),
            ("a_stride", 16),
            ("b_stride", 20),
            ("c_stride", 24),
            ("_pad", 28),
        ],
    ),
    (
        "ReduceParams",
        std::mem::size_of::<Reduce>(),
        &[
            ("outer", 0),
            ("axis", 4),
            ("inner", 8),
            ("chunks", 12),
            ("chunk_len", 16),
            ("scale", 20),
            ("_pad0", 24),
            ("_pad1", 28),
        ],
    ),
    (
        "NormParams",
        std::mem::size_of::<Norm>(),
        &[("rows", 0), ("cols", 4), ("eps", 8), ("_pad", 12)],
    ),
    (
        "RopeParams",
        std::mem::size_of::<Rope>(),
        &[("seq", 0), ("heads", 4), ("head_dim", 8), ("base", 12)],
    ),
    (
        "AttentionParams",
        std::mem::size_of::<Attention>(),
        &[
            ("batch_heads", 0),
            ("q_len", 4),
            ("kv_len", 8),
            ("kv_stride", 12),
            ("head_dim", 16),
            ("scale", 20),
            ("causal", 24),
            ("q_offset", 28),
        ],
    ),
    (
        "RkDrainParams",
        std::mem::size_of::<Drain>(),
        &[
            ("kernel_id", 0),
            ("count", 4),
            ("first", 8),
            ("hlc", 16),
            ("slot_words", 24),
            ("mask", 28),
            ("state_words", 32),
            ("node_lo", 36),
            ("node_hi", 40),
            ("in_stride", 44),
            ("runs", 48),
            ("runs_at", 52),
            ("starts_at", 56),
            ("_pad", 60),
        ],
    ),
    (
        "ConvertParams",
        std::mem::size_of::<Convert>(),
        &[("len", 0), ("words", 4), ("src_type", 8), ("dst_type", 12)],
    ),
    (
        "BroadcastParams",
        std::mem::size_of::<Broadcast>(),
        &[
            ("rank", 0),
            ("len", 4),
            ("_pad0", 8),
            ("_pad1", 12),
            ("shape", 16),
            ("a_strides", 48),
            ("b_strides", 80),
        ],
    ),
    (
        "QuantParams",
        std::mem::size_of::<Quant>(),
        &[("batch", 0), ("rows", 4), ("cols", 8), ("accumulate", 12)],
    ),
    (
        "KvParams",
        std::mem::size_of::<Kv>(),
        &[
            ("tokens", 0),
            ("heads", 4),
            ("kv_heads", 8),
            ("head_dim", 12),
            ("capacity", 16),
            ("rope_base", 20),
            ("scale", 24),
            ("_pad", 28),
        ],
    ),
];

const _: () = {
    use std::mem::size_of;
    assert!(size_of::<Elementwise>() == 16);
    assert!(size_of::<Matmul>() == 32);
    assert!(size_of::<Reduce>() == 32);
    assert!(size_of::<Norm>() == 16);
    assert!(size_of::<Rope>() == 16);
    assert!(size_of::<Attention>() == 32);
    assert!(size_of::<Drain>() == 64);
};

/// `ConvertParams` in `dtype.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
pub struct Convert {
    /// Elements converted.
    pub len: u32,
    /// Words of the output (one thread each).
    pub words: u32,
    /// Input [`DType`](ringkernel_core::compute::DType) code.
    pub src_type: u32,
    /// Output type code.
    pub dst_type: u32,
}

/// `BroadcastParams` in `broadcast.wgsl` (the arrays are WGSL `array<vec4<u32>, 2>`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
pub struct Broadcast {
    /// Dimensions used.
    pub rank: u32,
    /// Output elements.
    pub len: u32,
    /// Padding.
    pub _pad: [u32; 2],
    /// Output shape (1 past `rank`).
    pub shape: [u32; 8],
    /// Strides into `a`.
    pub a_strides: [u32; 8],
    /// Strides into `b`.
    pub b_strides: [u32; 8],
}

/// `QuantParams` in `quant.wgsl` (Qmatmul, Embedding).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
pub struct Quant {
    /// Input rows (tokens), or ids for Embedding.
    pub batch: u32,
    /// Rows of the weight matrix.
    pub rows: u32,
    /// Columns (a multiple of 32).
    pub cols: u32,
    /// 1: add to the output.
    pub accumulate: u32,
}

/// `KvParams` in `decode.wgsl` (RopeKv, AttentionKv).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
pub struct Kv {
    /// New tokens.
    pub tokens: u32,
    /// Query heads.
    pub heads: u32,
    /// Key/value heads.
    pub kv_heads: u32,
    /// Head width.
    pub head_dim: u32,
    /// Positions the cache holds.
    pub capacity: u32,
    /// RoPE frequency base.
    pub rope_base: f32,
    /// Score scale.
    pub scale: f32,
    /// Padding.
    pub _pad: u32,
}
