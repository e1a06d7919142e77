//! Dispatch plans: how each compute op maps onto the shared WGSL kernels.
//!
//! A [`Plan`] is everything the Metal host needs to run one op, decided without a GPU:
//! which kernels ([`Kernel`]) with which specialisation, the parameter block bytes (bound
//! with `setBytes` at `[[buffer(0)]]`), which operand goes to which `[[buffer(N)]]`, the
//! threadgroup grid, the scratch buffers, and how many elements each operand must hold.
//! The platform layer only turns a plan into `setBuffer`/`dispatchThreadgroups` calls.
//!
//! Plans are tested on Linux: their buffer indices are compared with the `[[buffer(N)]]`
//! attributes of the MSL that naga generates for the same kernel (`tests/msl_bindings.rs`),
//! and their grids are checked to cover the work exactly as the WGSL indexes it.
//! Every index the kernels use is `u32`, so sizes beyond `u32::MAX` are
//! [`Error::InvalidArgument`].

use crate::msl::HostSlot;
use crate::sizing::groups_for;
use ringkernel_core::compute::{
    AttentionDims, BinaryOp, MatmulDims, ReduceDims, ReduceOp, RopeDims, UnaryOp,
};
use ringkernel_core::error::{Error, Result};
use ringkernel_shaders::{
    grid_for, msl_buffer_index, params, Binding, Kernel, Specialization, MATMUL_TILE,
};
use ringkernel_shaders::{ATTENTION_MAX_HEAD_DIM, MAX_WORKGROUPS_PER_DIM, WORKGROUP_SIZE};

/// What a kernel buffer is bound to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operand {
    /// The op's `n`-th buffer argument, in the order of the `ComputeBackend` method
    /// (e.g. `binary(op, a, b, out)`: 0 = a, 1 = b, 2 = out).
    Arg(usize),
    /// The plan's `n`-th scratch buffer ([`Plan::scratch`]).
    Scratch(usize),
}

/// One buffer binding of a dispatch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bind {
    /// WGSL `@binding` (group 0); the Metal index is [`msl_buffer_index`] of it.
    pub binding: u32,
    /// The WGSL global the kernel reads or writes through this binding.
    pub wgsl_name: &'static str,
    /// What is bound.
    pub operand: Operand,
    /// Whether the kernel writes it.
    pub writes: bool,
}

impl Bind {
    /// The `[[buffer(N)]]` index.
    pub fn index(&self) -> u32 {
        msl_buffer_index(&Binding {
            group: 0,
            binding: self.binding,
            name: self.wgsl_name,
            access: ringkernel_shaders::Access::Read,
        }) as u32
    }
}

/// Index of the uniform parameter block (binding 0 of every kernel).
pub const PARAMS_BINDING: u32 = 0;

/// One compute dispatch.
#[derive(Debug, Clone, PartialEq)]
pub struct Dispatch {
    /// The kernel.
    pub kernel: Kernel,
    /// Its `override` values (part of the pipeline cache key).
    pub spec: Specialization,
    /// The parameter block, bound at binding 0.
    pub params: Vec<u8>,
    /// Storage buffers.
    pub binds: Vec<Bind>,
    /// Threadgroups per grid.
    pub groups: [u32; 3],
}

impl Dispatch {
    /// Threads per threadgroup: the kernel's fixed WGSL workgroup size.
    pub fn threads(&self) -> [u32; 3] {
        self.kernel.workgroup_size()
    }

    /// The host binding table of this dispatch, parameter block included (`p`/`rk_params`
    /// style names are the kernel's: see [`params_name`]).
    pub fn host_slots(&self) -> Vec<HostSlot> {
        let mut v = vec![HostSlot {
            index: PARAMS_BINDING,
            name: params_name(self.kernel),
            writes: false,
        }];
        v.extend(self.binds.iter().map(|b| HostSlot {
            index: b.index(),
            name: b.wgsl_name,
            writes: b.writes,
        }));
        v
    }

    /// Total threads launched.
    pub fn total_threads(&self) -> u64 {
        let t = self.threads();
        self.groups
            .iter()
            .chain(t.iter())
            .map(|&v| v as u64)
            .product()
    }
}

/// Name of the WGSL uniform at binding 0 of `kernel`.
pub fn params_name(kernel: Kernel) -> &'static str {
    use Kernel::*;
    match kernel {
        Rope => "rp",
        AttentionScores | AttentionWeightedSum | Attention => "ap",
        Drain | DrainSerial => "rk_params",
        _ => "p",
    }
}

/// Where naga's buffer-sizes argument goes and what it lists: its Metal buffer index and
/// the `(group, binding)` of each runtime-sized buffer, in the MSL's order.
pub type SizesArg = (u32, Vec<Option<(u32, u32)>>);

/// The contents of naga's buffer-sizes argument (`_buffer_sizes`, bound at
/// [`SIZES_BUFFER_INDEX`](ringkernel_shaders::SIZES_BUFFER_INDEX)): for each
/// `(group, binding)` of `order` (the MSL output's `sizes_order`) the byte size of the
/// buffer bound there, as `u32`s. `size_of` answers for the bindings the host binds;
/// anything else gets 0 (a kernel never reads a runtime array it has no buffer for).
/// [`Error::InvalidArgument`] for a buffer over 4 GiB.
pub fn buffer_sizes(
    order: &[Option<(u32, u32)>],
    size_of: impl Fn(u32) -> Option<usize>,
) -> Result<Vec<u8>> {
    let mut words = Vec::with_capacity(order.len().max(1));
    for entry in order {
        let bytes = match entry {
            Some((0, b)) => size_of(*b).unwrap_or(0),
            _ => 0,
        };
        words.push(u32_of(bytes, "buffer size in bytes")?);
    }
    if words.is_empty() {
        words.push(0);
    }
    Ok(bytemuck::cast_slice(&words).to_vec())
}

/// A minimum length an operand must have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Need {
    /// Which argument.
    pub arg: usize,
    /// Elements it must hold at least.
    pub elems: usize,
    /// What it is, for the error message.
    pub what: &'static str,
}

/// Everything needed to run one op.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Plan {
    /// Dispatches, in order (each sees the previous one's writes).
    pub dispatches: Vec<Dispatch>,
    /// Scratch buffer lengths in elements.
    pub scratch: Vec<usize>,
    /// Length each argument must have.
    pub needs: Vec<Need>,
}

fn u32_of(v: usize, what: &str) -> Result<u32> {
    u32::try_from(v).map_err(|_| {
        Error::invalid(format!(
            "{what} = {v} exceeds the 32-bit indices of the GPU kernels"
        ))
    })
}

fn mul(a: usize, b: usize, what: &str) -> Result<usize> {
    a.checked_mul(b)
        .ok_or_else(|| Error::invalid(format!("{what} overflows")))
}

/// Checks that the largest flat index a kernel computes fits `u32`.
fn fits(total: usize, what: &str) -> Result<u32> {
    u32_of(total, what)
}

fn bind(binding: u32, wgsl_name: &'static str, operand: Operand, writes: bool) -> Bind {
    Bind {
        binding,
        wgsl_name,
        operand,
        writes,
    }
}
fn read(binding: u32, name: &'static str, arg: usize) -> Bind {
    bind(binding, name, Operand::Arg(arg), false)
}
fn write(binding: u32, name: &'static str, arg: usize) -> Bind {
    bind(binding, name, Operand::Arg(arg), true)
}
fn need(arg: usize, elems: usize, what: &'static str) -> Need {
    Need { arg, elems, what }
}

/// Grid for `threads` threads of 256-thread groups, spread over x and y.
fn thread_grid(threads: usize) -> [u32; 3] {
    grid_for(groups_for(threads, WORKGROUP_SIZE as usize) as u64)
}

fn bytes<T: bytemuck::Pod>(p: &T) -> Vec<u8> {
    bytemuck::bytes_of(p).to_vec()
}

fn elementwise(
    kernel: Kernel,
    spec: Specialization,
    len: usize,
    scalar: f32,
    binds: Vec<Bind>,
    n_args: usize,
) -> Result<Plan> {
    let len32 = fits(len, "elementwise length")?;
    let needs = (0..n_args)
        .map(|a| need(a, len, if a + 1 == n_args { "out" } else { "input" }))
        .collect();
    if len == 0 {
        return Ok(Plan {
            needs,
            ..Plan::default()
        });
    }
    let p = params::Elementwise {
        len: len32,
        scalar,
        _pad: [0; 2],
    };
    Ok(Plan {
        dispatches: vec![Dispatch {
            kernel,
            spec,
            params: bytes(&p),
            binds,
            groups: thread_grid(len),
        }],
        scratch: vec![],
        needs,
    })
}

/// `unary(op, x, out, len)`.
pub fn unary(op: UnaryOp, len: usize) -> Result<Plan> {
    elementwise(
        Kernel::Unary,
        Specialization::op(op.code()),
        len,
        0.0,
        vec![read(1, "a", 0), write(3, "out", 1)],
        2,
    )
}

/// `binary(op, a, b, out, len)`.
pub fn binary(op: BinaryOp, len: usize) -> Result<Plan> {
    let binds = vec![read(1, "a", 0), read(2, "b", 1), write(3, "out", 2)];
    elementwise(
        Kernel::Binary,
        Specialization::op(op.code()),
        len,
        0.0,
        binds,
        3,
    )
}

/// `binary_scalar(op, a, s, out, len)`.
pub fn binary_scalar(op: BinaryOp, s: f32, len: usize) -> Result<Plan> {
    let binds = vec![read(1, "a", 0), write(3, "out", 1)];
    elementwise(
        Kernel::BinaryScalar,
        Specialization::op(op.code()),
        len,
        s,
        binds,
        2,
    )
}

/// `swiglu(gate, up, out, len)`.
pub fn swiglu(len: usize) -> Result<Plan> {
    let binds = vec![read(1, "a", 0), read(2, "b", 1), write(3, "out", 2)];
    elementwise(Kernel::Swiglu, Specialization::none(), len, 0.0, binds, 3)
}

/// `matmul(a, b, out, dims)` on the tiled kernel: a 64×64 output tile per threadgroup,
/// grid `(⌈n/64⌉, ⌈m/64⌉, batch)`.
pub fn matmul(d: MatmulDims) -> Result<Plan> {
    let a_len = mul(mul(d.batch, d.m, "matmul A")?, d.k, "matmul A")?;
    let b_len = if d.b_batched {
        mul(mul(d.batch, d.k, "matmul B")?, d.n, "matmul B")?
    } else {
        mul(d.k, d.n, "matmul B")?
    };
    let c_len = mul(mul(d.batch, d.m, "matmul out")?, d.n, "matmul out")?;
    let needs = vec![
        need(0, a_len, "A"),
        need(1, b_len, "B"),
        need(2, c_len, "out"),
    ];
    fits(a_len.max(b_len).max(c_len), "matmul size")?;
    if c_len == 0 {
        return Ok(Plan {
            needs,
            ..Plan::default()
        });
    }
    let tile = MATMUL_TILE as usize;
    let groups = [groups_for(d.n, tile), groups_for(d.m, tile), d.batch];
    if groups.iter().any(|&g| g > MAX_WORKGROUPS_PER_DIM as usize) {
        return Err(Error::invalid(format!(
            "matmul {d:?} needs a grid of {groups:?} tiles, over 65535 in one dimension"
        )));
    }
    let p = params::Matmul {
        m: d.m as u32,
        k: d.k as u32,
        n: d.n as u32,
        batch: d.batch as u32,
        a_stride: (d.m * d.k) as u32,
        b_stride: if d.b_batched { (d.k * d.n) as u32 } else { 0 },
        c_stride: (d.m * d.n) as u32,
        _pad: 0,
    };
    Ok(Plan {
        dispatches: vec![Dispatch {
            kernel: Kernel::Matmul,
            spec: Specialization::none(),
            params: bytes(&p),
            binds: vec![read(1, "a", 0), read(2, "b", 1), write(3, "out", 2)],
            groups: groups.map(|g| g as u32),
        }],
        scratch: vec![],
        needs,
    })
}

/// Whether a matmul is large enough for Metal Performance Shaders to beat the shared
/// tiled kernel: every dimension at least 32 and at least 64³ multiply-adds per
/// matrix. Below that, launch overhead dominates and the tiled kernel (which batches
/// into the open compute encoder) is used.
pub fn prefer_mps(d: MatmulDims) -> bool {
    let work = (d.m as u128) * (d.n as u128) * (d.k as u128);
    d.batch > 0 && d.m >= 32 && d.n >= 32 && d.k >= 32 && work >= 64 * 64 * 64
}

/// `matvec(a, x, out, m, k)`: one threadgroup per row.
pub fn matvec(m: usize, k: usize) -> Result<Plan> {
    let a_len = mul(m, k, "matvec A")?;
    let needs = vec![need(0, a_len, "A"), need(1, k, "x"), need(2, m, "out")];
    fits(a_len, "matvec size")?;
    if m == 0 {
        return Ok(Plan {
            needs,
            ..Plan::default()
        });
    }
    let p = params::Matmul {
        m: m as u32,
        k: k as u32,
        n: 1,
        batch: 1,
        a_stride: a_len as u32,
        b_stride: 0,
        c_stride: m as u32,
        _pad: 0,
    };
    Ok(Plan {
        dispatches: vec![Dispatch {
            kernel: Kernel::Matvec,
            spec: Specialization::none(),
            params: bytes(&p),
            binds: vec![read(1, "a", 0), read(2, "b", 1), write(3, "out", 2)],
            groups: grid_for(m as u64),
        }],
        scratch: vec![],
        needs,
    })
}

/// Elements one threadgroup of a first reduction pass covers at least (16 per thread),
/// so long rows are split into partials and finished by a second pass.
pub const REDUCE_CHUNK: usize = 16 * WORKGROUP_SIZE as usize;
/// Most partials per row (the second pass reduces them with one threadgroup).
pub const MAX_CHUNKS: usize = 1024;

fn chunking(axis: usize) -> (usize, usize) {
    let chunks = groups_for(axis, REDUCE_CHUNK).clamp(1, MAX_CHUNKS);
    (chunks, axis.div_ceil(chunks))
}

/// The shape of one `ReduceRows` pass: `rows` rows of `axis` elements, each split
/// into `chunks` chunks of `chunk_len`, results multiplied by `scale`.
struct RowPass {
    rows: usize,
    axis: usize,
    chunks: usize,
    chunk_len: usize,
    scale: f32,
}

fn reduce_rows_dispatch(code: u32, r: RowPass, x: Operand, out: Operand) -> Dispatch {
    let p = params::Reduce {
        outer: r.rows as u32,
        axis: r.axis as u32,
        inner: 1,
        chunks: r.chunks as u32,
        chunk_len: r.chunk_len as u32,
        scale: r.scale,
        _pad: [0; 2],
    };
    Dispatch {
        kernel: Kernel::ReduceRows,
        spec: Specialization::op(code),
        params: bytes(&p),
        binds: vec![bind(1, "x", x, false), bind(3, "out", out, true)],
        groups: grid_for((r.rows * r.chunks) as u64),
    }
}

/// `reduce(op, x, out, dims)`: a contiguous axis (`inner == 1`) is reduced by
/// threadgroup tree reductions (two passes for long rows); a strided one by one thread
/// per output. `Mean` reduces as a sum scaled by `1/axis`.
pub fn reduce(op: ReduceOp, d: ReduceDims) -> Result<Plan> {
    if d.axis == 0 {
        return Err(Error::invalid("reduction over an empty axis"));
    }
    let x_len = mul(
        mul(d.outer, d.axis, "reduce input")?,
        d.inner,
        "reduce input",
    )?;
    let out_len = mul(d.outer, d.inner, "reduce output")?;
    let needs = vec![need(0, x_len, "x"), need(1, out_len, "out")];
    fits(x_len, "reduce size")?;
    if out_len == 0 {
        return Ok(Plan {
            needs,
            ..Plan::default()
        });
    }
    let code = op.code();
    let scale = if op == ReduceOp::Mean {
        1.0 / d.axis as f32
    } else {
        1.0
    };
    if d.inner > 1 {
        let p = params::Reduce {
            outer: d.outer as u32,
            axis: d.axis as u32,
            inner: d.inner as u32,
            chunks: 1,
            chunk_len: d.axis as u32,
            scale,
            _pad: [0; 2],
        };
        return Ok(Plan {
            dispatches: vec![Dispatch {
                kernel: Kernel::ReduceStrided,
                spec: Specialization::op(code),
                params: bytes(&p),
                binds: vec![read(1, "x", 0), write(3, "out", 1)],
                groups: thread_grid(out_len),
            }],
            scratch: vec![],
            needs,
        });
    }
    let (chunks, chunk_len) = chunking(d.axis);
    if chunks == 1 {
        let dsp = reduce_rows_dispatch(
            code,
            RowPass {
                rows: d.outer,
                axis: d.axis,
                chunks: 1,
                chunk_len: d.axis,
                scale,
            },
            Operand::Arg(0),
            Operand::Arg(1),
        );
        return Ok(Plan {
            dispatches: vec![dsp],
            scratch: vec![],
            needs,
        });
    }
    let partials = mul(d.outer, chunks, "reduce partials")?;
    let first = reduce_rows_dispatch(
        code,
        RowPass {
            rows: d.outer,
            axis: d.axis,
            chunks,
            chunk_len,
            scale: 1.0,
        },
        Operand::Arg(0),
        Operand::Scratch(0),
    );
    let second = reduce_rows_dispatch(
        code,
        RowPass {
            rows: d.outer,
            axis: chunks,
            chunks: 1,
            chunk_len: chunks,
            scale,
        },
        Operand::Scratch(0),
        Operand::Arg(1),
    );
    Ok(Plan {
        dispatches: vec![first, second],
        scratch: vec![partials],
        needs,
    })
}

/// `dot(a, b, out, len)`: partial dot products per chunk, then a sum of the partials.
pub fn dot(len: usize) -> Result<Plan> {
    let needs = vec![need(0, len, "a"), need(1, len, "b"), need(2, 1, "out")];
    fits(len, "dot length")?;
    let (chunks, chunk_len) = chunking(len.max(1));
    let direct = chunks == 1;
    let p = params::Reduce {
        outer: 1,
        axis: len as u32,
        inner: 1,
        chunks: chunks as u32,
        chunk_len: chunk_len as u32,
        scale: 1.0,
        _pad: [0; 2],
    };
    let partial_out = if direct {
        Operand::Arg(2)
    } else {
        Operand::Scratch(0)
    };
    let first = Dispatch {
        kernel: Kernel::DotPartial,
        spec: Specialization::none(),
        params: bytes(&p),
        binds: vec![
            read(1, "x", 0),
            read(2, "y", 1),
            bind(3, "out", partial_out, true),
        ],
        groups: grid_for(chunks as u64),
    };
    if direct {
        return Ok(Plan {
            dispatches: vec![first],
            scratch: vec![],
            needs,
        });
    }
    let second = reduce_rows_dispatch(
        ReduceOp::Sum.code(),
        RowPass {
            rows: 1,
            axis: chunks,
            chunks: 1,
            chunk_len: chunks,
            scale: 1.0,
        },
        Operand::Scratch(0),
        Operand::Arg(2),
    );
    Ok(Plan {
        dispatches: vec![first, second],
        scratch: vec![chunks],
        needs,
    })
}

fn norm(
    kernel: Kernel,
    rows: usize,
    cols: usize,
    eps: f32,
    binds: Vec<Bind>,
    needs: Vec<Need>,
) -> Result<Plan> {
    fits(mul(rows, cols, "norm size")?, "norm size")?;
    if rows == 0 || cols == 0 {
        return Ok(Plan {
            needs,
            ..Plan::default()
        });
    }
    let p = params::Norm {
        rows: rows as u32,
        cols: cols as u32,
        eps,
        _pad: 0,
    };
    Ok(Plan {
        dispatches: vec![Dispatch {
            kernel,
            spec: Specialization::none(),
            params: bytes(&p),
            binds,
            groups: grid_for(rows as u64),
        }],
        scratch: vec![],
        needs,
    })
}

/// `softmax(x, out, rows, cols)`: one threadgroup per row.
pub fn softmax(rows: usize, cols: usize) -> Result<Plan> {
    let n = mul(rows, cols, "softmax size")?;
    norm(
        Kernel::Softmax,
        rows,
        cols,
        0.0,
        vec![read(1, "x", 0), write(4, "out", 1)],
        vec![need(0, n, "x"), need(1, n, "out")],
    )
}

/// `rms_norm(x, weight, out, rows, cols, eps)`.
pub fn rms_norm(rows: usize, cols: usize, eps: f32) -> Result<Plan> {
    let n = mul(rows, cols, "rms_norm size")?;
    norm(
        Kernel::RmsNorm,
        rows,
        cols,
        eps,
        vec![read(1, "x", 0), read(2, "w", 1), write(4, "out", 2)],
        vec![need(0, n, "x"), need(1, cols, "weight"), need(2, n, "out")],
    )
}

/// `layer_norm(x, weight, bias, out, rows, cols, eps)`.
pub fn layer_norm(rows: usize, cols: usize, eps: f32) -> Result<Plan> {
    let n = mul(rows, cols, "layer_norm size")?;
    norm(
        Kernel::LayerNorm,
        rows,
        cols,
        eps,
        vec![
            read(1, "x", 0),
            read(2, "w", 1),
            read(3, "bias", 2),
            write(4, "out", 3),
        ],
        vec![
            need(0, n, "x"),
            need(1, cols, "weight"),
            need(2, cols, "bias"),
            need(3, n, "out"),
        ],
    )
}

/// `rope(x, positions, out, dims)`: a thread per rotated pair. The kernel reads `x`
/// through its global `q` and the positions through `k`.
pub fn rope(d: RopeDims) -> Result<Plan> {
    if !d.head_dim.is_multiple_of(2) {
        return Err(Error::invalid(format!(
            "RoPE needs an even head_dim, got {}",
            d.head_dim
        )));
    }
    let n = mul(mul(d.seq, d.heads, "rope size")?, d.head_dim, "rope size")?;
    let needs = vec![
        need(0, n, "x"),
        need(1, d.seq, "positions"),
        need(2, n, "out"),
    ];
    fits(n, "rope size")?;
    if n == 0 {
        return Ok(Plan {
            needs,
            ..Plan::default()
        });
    }
    let p = params::Rope {
        seq: d.seq as u32,
        heads: d.heads as u32,
        head_dim: d.head_dim as u32,
        base: d.base,
    };
    Ok(Plan {
        dispatches: vec![Dispatch {
            kernel: Kernel::Rope,
            spec: Specialization::none(),
            params: bytes(&p),
            binds: vec![read(1, "q", 0), read(2, "k", 1), write(4, "out", 2)],
            groups: thread_grid(n / 2),
        }],
        scratch: vec![],
        needs,
    })
}

struct AttnSizes {
    q: usize,
    kv: usize,
    scores: usize,
    out: usize,
}

fn attn_sizes(d: &AttentionDims) -> Result<AttnSizes> {
    if d.kv_stride < d.kv_len {
        return Err(Error::invalid(format!(
            "kv_stride {} is smaller than kv_len {}",
            d.kv_stride, d.kv_len
        )));
    }
    let rows = mul(d.batch_heads, d.q_len, "attention rows")?;
    let s = AttnSizes {
        q: mul(rows, d.head_dim, "attention q")?,
        kv: mul(
            mul(d.batch_heads, d.kv_stride, "attention kv")?,
            d.head_dim,
            "attention kv",
        )?,
        scores: mul(rows, d.kv_len, "attention scores")?,
        out: mul(rows, d.head_dim, "attention out")?,
    };
    fits(s.q.max(s.kv).max(s.scores).max(s.out), "attention size")?;
    Ok(s)
}

fn attention_params(d: &AttentionDims) -> Vec<u8> {
    bytes(&params::Attention {
        batch_heads: d.batch_heads as u32,
        q_len: d.q_len as u32,
        kv_len: d.kv_len as u32,
        kv_stride: d.kv_stride as u32,
        head_dim: d.head_dim as u32,
        scale: d.scale,
        causal: d.causal as u32,
        q_offset: d.q_offset as u32,
    })
}

fn scores_dispatch(d: &AttentionDims, q: Operand, k: Operand, out: Operand, n: usize) -> Dispatch {
    Dispatch {
        kernel: Kernel::AttentionScores,
        spec: Specialization::none(),
        params: attention_params(d),
        binds: vec![
            bind(1, "q", q, false),
            bind(2, "k", k, false),
            bind(4, "out", out, true),
        ],
        groups: thread_grid(n),
    }
}

fn weighted_sum_dispatch(
    d: &AttentionDims,
    p: Operand,
    v: Operand,
    out: Operand,
    n: usize,
) -> Dispatch {
    Dispatch {
        kernel: Kernel::AttentionWeightedSum,
        spec: Specialization::none(),
        params: attention_params(d),
        binds: vec![
            bind(1, "q", p, false),
            bind(3, "v", v, false),
            bind(4, "out", out, true),
        ],
        groups: thread_grid(n),
    }
}

/// `attention_scores(q, k, out, dims)`: a thread per score.
pub fn attention_scores(d: AttentionDims) -> Result<Plan> {
    let s = attn_sizes(&d)?;
    let needs = vec![
        need(0, s.q, "q"),
        need(1, s.kv, "k"),
        need(2, s.scores, "scores"),
    ];
    if s.scores == 0 {
        return Ok(Plan {
            needs,
            ..Plan::default()
        });
    }
    let dsp = scores_dispatch(
        &d,
        Operand::Arg(0),
        Operand::Arg(1),
        Operand::Arg(2),
        s.scores,
    );
    Ok(Plan {
        dispatches: vec![dsp],
        scratch: vec![],
        needs,
    })
}

/// `attention_weighted_sum(p, v, out, dims)`: a thread per output element (the kernel
/// reads the probabilities through its global `q`).
pub fn attention_weighted_sum(d: AttentionDims) -> Result<Plan> {
    let s = attn_sizes(&d)?;
    let needs = vec![
        need(0, s.scores, "probabilities"),
        need(1, s.kv, "v"),
        need(2, s.out, "out"),
    ];
    if s.out == 0 {
        return Ok(Plan {
            needs,
            ..Plan::default()
        });
    }
    let dsp = weighted_sum_dispatch(&d, Operand::Arg(0), Operand::Arg(1), Operand::Arg(2), s.out);
    Ok(Plan {
        dispatches: vec![dsp],
        scratch: vec![],
        needs,
    })
}

/// `attention(q, k, v, out, dims)`: the fused kernel (one threadgroup per head and
/// query row) up to `head_dim` 512; beyond that scores → softmax → weighted sum
/// through a scratch buffer.
pub fn attention(d: AttentionDims) -> Result<Plan> {
    let s = attn_sizes(&d)?;
    let needs = vec![
        need(0, s.q, "q"),
        need(1, s.kv, "k"),
        need(2, s.kv, "v"),
        need(3, s.out, "out"),
    ];
    if s.out == 0 {
        return Ok(Plan {
            needs,
            ..Plan::default()
        });
    }
    if d.head_dim <= ATTENTION_MAX_HEAD_DIM {
        return Ok(Plan {
            dispatches: vec![Dispatch {
                kernel: Kernel::Attention,
                spec: Specialization::none(),
                params: attention_params(&d),
                binds: vec![
                    read(1, "q", 0),
                    read(2, "k", 1),
                    read(3, "v", 2),
                    write(4, "out", 3),
                ],
                groups: grid_for((d.batch_heads * d.q_len) as u64),
            }],
            scratch: vec![],
            needs,
        });
    }
    let rows = d.batch_heads * d.q_len;
    let scores = scores_dispatch(
        &d,
        Operand::Arg(0),
        Operand::Arg(1),
        Operand::Scratch(0),
        s.scores,
    );
    let mut soft = softmax(rows, d.kv_len)?.dispatches.remove(0);
    soft.binds = vec![
        bind(1, "x", Operand::Scratch(0), false),
        bind(4, "out", Operand::Scratch(1), true),
    ];
    let sum = weighted_sum_dispatch(
        &d,
        Operand::Scratch(1),
        Operand::Arg(2),
        Operand::Arg(3),
        s.out,
    );
    Ok(Plan {
        dispatches: vec![scores, soft, sum],
        scratch: vec![s.scores, s.scores],
        needs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p<T: bytemuck::Pod>(d: &Dispatch) -> T {
        bytemuck::pod_read_unaligned(&d.params)
    }

    #[test]
    fn elementwise_grids_cover_the_range() {
        for len in [
            1usize,
            7,
            255,
            256,
            257,
            1023,
            4097,
            65_535 * 256 + 1,
            100_000_000,
        ] {
            let plan = binary(BinaryOp::Add, len).unwrap();
            let d = &plan.dispatches[0];
            assert_eq!(p::<params::Elementwise>(d).len as usize, len);
            assert!(d.total_threads() as usize >= len, "{len}");
            // The kernel's linear index: gid.x + gid.y * nwg.x * 256. The last thread
            // must reach len - 1, and no dimension may exceed 65535 groups.
            let max_index = (d.groups[0] as u64 * 256 - 1)
                + (d.groups[1] as u64 - 1) * d.groups[0] as u64 * 256;
            assert!(max_index + 1 >= len as u64);
            assert!(d.groups.iter().all(|&g| g <= MAX_WORKGROUPS_PER_DIM));
            assert_eq!(plan.needs.len(), 3);
        }
        assert!(unary(UnaryOp::Exp, 0).unwrap().dispatches.is_empty());
        assert!(matches!(
            unary(UnaryOp::Exp, 1 << 33),
            Err(Error::InvalidArgument(_))
        ));
        assert_eq!(
            unary(UnaryOp::Gelu, 5).unwrap().dispatches[0].spec,
            Specialization::op(11)
        );
        let bs = binary_scalar(BinaryOp::Mul, 2.5, 9).unwrap();
        assert_eq!(p::<params::Elementwise>(&bs.dispatches[0]).scalar, 2.5);
    }

    #[test]
    fn matmul_tiles_and_strides() {
        let d = MatmulDims {
            batch: 3,
            m: 65,
            k: 7,
            n: 129,
            b_batched: false,
        };
        let plan = matmul(d).unwrap();
        let dsp = &plan.dispatches[0];
        assert_eq!(dsp.groups, [3, 2, 3]);
        let mp: params::Matmul = p(dsp);
        assert_eq!(
            (mp.a_stride, mp.b_stride, mp.c_stride),
            (65 * 7, 0, 65 * 129)
        );
        assert_eq!(
            plan.needs,
            vec![
                need(0, 3 * 65 * 7, "A"),
                need(1, 7 * 129, "B"),
                need(2, 3 * 65 * 129, "out")
            ]
        );
        let batched = matmul(MatmulDims {
            b_batched: true,
            ..d
        })
        .unwrap();
        assert_eq!(
            p::<params::Matmul>(&batched.dispatches[0]).b_stride,
            7 * 129
        );
        assert!(matmul(MatmulDims {
            batch: 70_000,
            m: 1,
            k: 1,
            n: 1,
            b_batched: false
        })
        .is_err());
        let mv = matvec(100_000, 3).unwrap();
        assert!(
            mv.dispatches[0].groups[0] as usize * mv.dispatches[0].groups[1] as usize >= 100_000
        );
    }

    #[test]
    fn mps_only_for_large_products() {
        let d = |m, k, n| MatmulDims {
            batch: 1,
            m,
            k,
            n,
            b_batched: false,
        };
        assert!(prefer_mps(d(64, 64, 64)));
        assert!(prefer_mps(d(4096, 4096, 4096)));
        assert!(!prefer_mps(d(63, 64, 64)), "just under 64³");
        assert!(
            !prefer_mps(d(16, 100_000, 100_000)),
            "a thin dimension stays on the tiled kernel"
        );
        assert!(!prefer_mps(MatmulDims {
            batch: 0,
            ..d(64, 64, 64)
        }));
    }

    #[test]
    fn long_reductions_take_two_passes() {
        let short = reduce(
            ReduceOp::Mean,
            ReduceDims {
                outer: 4,
                axis: 100,
                inner: 1,
            },
        )
        .unwrap();
        assert_eq!(short.dispatches.len(), 1);
        assert_eq!(p::<params::Reduce>(&short.dispatches[0]).scale, 0.01);
        let long = reduce(
            ReduceOp::Mean,
            ReduceDims {
                outer: 3,
                axis: 1_000_000,
                inner: 1,
            },
        )
        .unwrap();
        assert_eq!(long.dispatches.len(), 2);
        let (a, b): (params::Reduce, params::Reduce) =
            (p(&long.dispatches[0]), p(&long.dispatches[1]));
        assert_eq!(a.scale, 1.0, "the mean is scaled once, at the end");
        assert_eq!(b.scale, 1e-6);
        assert!(a.chunks as usize * a.chunk_len as usize >= 1_000_000);
        assert!(
            (a.chunks as usize - 1) * (a.chunk_len as usize) < 1_000_000,
            "no empty chunk"
        );
        assert_eq!(long.scratch, vec![3 * a.chunks as usize]);
        assert_eq!(b.axis, a.chunks);
        assert_eq!(long.dispatches[1].binds[0].operand, Operand::Scratch(0));
        let strided = reduce(
            ReduceOp::Max,
            ReduceDims {
                outer: 2,
                axis: 5,
                inner: 3,
            },
        )
        .unwrap();
        assert_eq!(strided.dispatches[0].kernel, Kernel::ReduceStrided);
        assert!(reduce(
            ReduceOp::Sum,
            ReduceDims {
                outer: 1,
                axis: 0,
                inner: 1
            }
        )
        .is_err());
        let dp = dot(10_000_000).unwrap();
        assert_eq!(dp.dispatches.len(), 2);
        assert_eq!(dot(10).unwrap().dispatches.len(), 1);
    }

    #[test]
    fn buffer_sizes_follow_the_order() {
        let order = [Some((0, 3)), None, Some((0, 1)), Some((1, 1)), Some((0, 9))];
        let b = buffer_sizes(&order, |b| match b {
            1 => Some(40),
            3 => Some(12),
            _ => None,
        })
        .unwrap();
        let words: Vec<u32> = b
            .chunks(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(words, vec![12, 0, 40, 0, 0]);
        assert_eq!(
            buffer_sizes(&[], |_| None).unwrap().len(),
            4,
            "never an empty setBytes"
        );
        assert!(buffer_sizes(&[Some((0, 1))], |_| Some(1 << 33)).is_err());
    }

    #[test]
    fn attention_variants() {
        let d = AttentionDims {
            batch_heads: 2,
            q_len: 3,
            kv_len: 5,
            kv_stride: 8,
            head_dim: 16,
            scale: 0.25,
            causal: true,
            q_offset: 2,
        };
        let fused = attention(d).unwrap();
        assert_eq!(fused.dispatches[0].kernel, Kernel::Attention);
        assert_eq!(fused.dispatches[0].groups, [6, 1, 1]);
        let ap: params::Attention = p(&fused.dispatches[0]);
        assert_eq!((ap.causal, ap.q_offset, ap.kv_stride), (1, 2, 8));
        let wide = attention(AttentionDims { head_dim: 640, ..d }).unwrap();
        let kinds: Vec<_> = wide.dispatches.iter().map(|d| d.kernel).collect();
        assert_eq!(
            kinds,
            vec![
                Kernel::AttentionScores,
                Kernel::Softmax,
                Kernel::AttentionWeightedSum
            ]
        );
        assert_eq!(wide.scratch, vec![30, 30]);
        assert!(attention(AttentionDims { kv_stride: 4, ..d }).is_err());
        assert!(rope(RopeDims {
            seq: 2,
            heads: 2,
            head_dim: 3,
            base: 1e4
        })
        .is_err());
    }
}
