//! Dispatch plans: how each compute op maps onto the shared WGSL kernels, decided
//! once for both event-driven backends.
//!
//! A [`Plan`] is everything a host needs to run one op, decided without a GPU: which
//! kernels ([`Kernel`]) with which specialisation, the parameter block bytes (bound at
//! WGSL `@binding(0)`, Metal `[[buffer(0)]]`), which operand goes to which binding, the
//! workgroup grid, the scratch buffers, and how many elements each operand must hold
//! (from [`checks`], the op checks every backend shares). The WebGPU and Metal backends
//! run plans through [`exec`](crate::exec); they only turn dispatches into their API's
//! calls.
//!
//! Plans are tested on Linux: the WebGPU backend runs them on lavapipe in CI, their
//! buffer indices are compared with the `[[buffer(N)]]` attributes of the MSL that naga
//! generates for the same kernel (`tests/msl_bindings.rs`), and their grids are checked
//! to cover the work exactly as the WGSL indexes it. Inconsistent shapes are
//! [`Error::ShapeMismatch`]; every index the kernels use is `u32`, so sizes beyond
//! `u32::MAX` (and grids beyond 65535 groups in one dimension) are
//! [`Error::InvalidArgument`].

use crate::msl::HostSlot;
use crate::sizing::groups_for;
use ringkernel_core::compute::checks::{self, Needs};
use ringkernel_core::compute::{
    AttentionDims, BinaryOp, MatmulDims, ReduceDims, ReduceOp, RopeDims, UnaryOp,
};
use ringkernel_core::error::{Error, Result};
use ringkernel_shaders::{
    grid_for, msl_buffer_index, params, Binding, Kernel, MatmulTile, Specialization, MATMUL_TILE,
};
use ringkernel_shaders::{ATTENTION_MAX_HEAD_DIM, MAX_WORKGROUPS_PER_DIM, WORKGROUP_SIZE};

mod model;
pub use model::{
    attention_kv, broadcast_binary, convert, embedding, qmatmul, rope_kv, KV_MAX_HEAD_DIM,
    QMATMUL_ROWS, QMATMUL_TOKENS,
};

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

/// Everything needed to run one op.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Plan {
    /// Dispatches, in order (each sees the previous one's writes).
    pub dispatches: Vec<Dispatch>,
    /// Scratch buffer lengths in elements.
    pub scratch: Vec<usize>,
    /// Length each argument must have ([`checks`]).
    pub needs: Needs,
}

impl Plan {
    fn empty(needs: Needs) -> Plan {
        Plan {
            needs,
            ..Plan::default()
        }
    }

    fn one(needs: Needs, dispatch: Dispatch) -> Plan {
        Plan {
            dispatches: vec![dispatch],
            scratch: vec![],
            needs,
        }
    }

    /// Whether some dispatch writes argument `arg`.
    pub fn writes_arg(&self, arg: usize) -> bool {
        self.dispatches
            .iter()
            .flat_map(|d| &d.binds)
            .any(|b| b.writes && b.operand == Operand::Arg(arg))
    }
}

fn u32_of(v: usize, what: &str) -> Result<u32> {
    u32::try_from(v).map_err(|_| {
        Error::invalid(format!(
            "{what} = {v} exceeds the 32-bit indices of the GPU kernels"
        ))
    })
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

/// Grid for `threads` threads of 256-thread groups, spread over x and y.
fn thread_grid(threads: usize) -> [u32; 3] {
    grid_for(groups_for(threads, WORKGROUP_SIZE as usize) as u64)
}

fn bytes<T: bytemuck::Pod>(p: &T) -> Vec<u8> {
    bytemuck::bytes_of(p).to_vec()
}

/// Vec4s each invocation of an elementwise `*4` kernel handles (`VEC4_PER_THREAD` in
/// `elementwise.wgsl`): several 16-byte loads per thread in flight.
pub const VEC4_PER_THREAD: usize = 4;

/// An elementwise op over `len` elements: the `vec4` kernel (16-byte accesses,
/// [`VEC4_PER_THREAD`] of them per invocation, closer to the memory bandwidth) over the
/// whole vec4s, then, when `len` is not a multiple of 4, the scalar kernel over the
/// last `len % 4` elements. The inputs are bound at 1 (and 2), the output at 3.
fn elementwise(
    kernels: (Kernel, Kernel),
    spec: Specialization,
    needs: Needs,
    scalar: f32,
) -> Result<Plan> {
    let len = needs.elems(0);
    u32_of(len, "elementwise length")?;
    if len == 0 {
        return Ok(Plan::empty(needs));
    }
    let inputs = needs.args.len() - 1;
    // (kernel, binding names, indices in the kernel's units, first index, units per
    // invocation)
    let vec4 = (kernels.1, ["a4", "b4", "out4"], len / 4, 0, VEC4_PER_THREAD);
    let tail = (kernels.0, ["a", "b", "out"], len, len / 4 * 4, 1);
    let parts = [vec4, tail]
        .into_iter()
        .filter(|&(_, _, end, first, _)| end > first);
    let dispatches = parts
        .map(|(kernel, names, end, first, per_thread)| {
            let mut binds: Vec<Bind> = (0..inputs)
                .map(|i| read(1 + i as u32, names[i], i))
                .collect();
            binds.push(write(3, names[2], inputs));
            let p = params::Elementwise {
                len: end as u32,
                scalar,
                first: first as u32,
                _pad: 0,
            };
            Dispatch {
                kernel,
                spec: spec.clone(),
                params: bytes(&p),
                binds,
                groups: thread_grid((end - first).div_ceil(per_thread)),
            }
        })
        .collect();
    Ok(Plan {
        dispatches,
        scratch: vec![],
        needs,
    })
}

/// `unary(op, x, out, len)`.
pub fn unary(op: UnaryOp, len: usize) -> Result<Plan> {
    let kernels = (Kernel::Unary, Kernel::Unary4);
    elementwise(
        kernels,
        Specialization::op(op.code()),
        checks::unary(len),
        0.0,
    )
}

/// `binary(op, a, b, out, len)`.
pub fn binary(op: BinaryOp, len: usize) -> Result<Plan> {
    let kernels = (Kernel::Binary, Kernel::Binary4);
    elementwise(
        kernels,
        Specialization::op(op.code()),
        checks::binary(len),
        0.0,
    )
}

/// `binary_scalar(op, a, s, out, len)`.
pub fn binary_scalar(op: BinaryOp, s: f32, len: usize) -> Result<Plan> {
    let kernels = (Kernel::BinaryScalar, Kernel::BinaryScalar4);
    let needs = checks::binary_scalar(len);
    elementwise(kernels, Specialization::op(op.code()), needs, s)
}

/// `swiglu(gate, up, out, len)`.
pub fn swiglu(len: usize) -> Result<Plan> {
    let kernels = (Kernel::Swiglu, Kernel::Swiglu4);
    elementwise(kernels, Specialization::none(), checks::swiglu(len), 0.0)
}

/// `matmul(a, b, out, dims)` on the tiled kernel: a 64×64 output tile per threadgroup,
/// grid `(⌈n/64⌉, ⌈m/64⌉, batch)`. `k = 0` writes zeros.
pub fn matmul(d: MatmulDims) -> Result<Plan> {
    let tile = MATMUL_TILE as usize;
    matmul_on(d, Kernel::Matmul, Specialization::none(), [tile, tile])
}

/// `matmul(a, b, out, dims)` on the register-tiled kernel ([`Kernel::MatmulTiled`]) with
/// the tile shape `tile`. `vec_a` reads A with 16-byte loads (taken only when `k % 4 ==
/// 0`), `vec_b` reads B and writes out that way (taken only when `n % 4 == 0`); a host
/// passes `false` where a bound buffer's length is not a multiple of 4 elements.
/// `k = 0` writes zeros. An unsupported shape is [`Error::InvalidArgument`].
pub fn matmul_tiled(d: MatmulDims, tile: MatmulTile, vec_a: bool, vec_b: bool) -> Result<Plan> {
    tile.check()?;
    let spec = tile.spec(
        vec_a && d.k.is_multiple_of(4),
        vec_b && d.n.is_multiple_of(4),
    );
    let edge = [tile.bm as usize, tile.bn as usize];
    matmul_on(d, Kernel::MatmulTiled, spec, edge)
}

/// A matmul on `kernel`, one `edge[0] × edge[1]` output tile per threadgroup, grid
/// `(⌈n/edge[1]⌉, ⌈m/edge[0]⌉, batch)`.
fn matmul_on(
    d: MatmulDims,
    kernel: Kernel,
    spec: Specialization,
    edge: [usize; 2],
) -> Result<Plan> {
    let needs = checks::matmul(d)?;
    let (a_len, b_len, c_len) = (needs.elems(0), needs.elems(1), needs.elems(2));
    u32_of(a_len.max(b_len).max(c_len), "matmul size")?;
    if c_len == 0 {
        return Ok(Plan::empty(needs));
    }
    let groups = [groups_for(d.n, edge[1]), groups_for(d.m, edge[0]), d.batch];
    if groups.iter().any(|&g| g > MAX_WORKGROUPS_PER_DIM as usize) {
        return Err(Error::invalid(format!(
            "matmul {d:?} needs a grid of {groups:?} tiles, over 65535 in one dimension"
        )));
    }
    // Every product below is at most one of the lengths checked above.
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
    let dsp = Dispatch {
        kernel,
        spec,
        params: bytes(&p),
        binds: vec![read(1, "a", 0), read(2, "b", 1), write(3, "out", 2)],
        groups: groups.map(|g| g as u32),
    };
    Ok(Plan::one(needs, dsp))
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
    let needs = checks::matvec(m, k)?;
    let a_len = u32_of(needs.elems(0), "matvec size")?;
    if m == 0 {
        return Ok(Plan::empty(needs));
    }
    let p = params::Matmul {
        m: m as u32,
        k: k as u32,
        n: 1,
        batch: 1,
        a_stride: a_len,
        b_stride: 0,
        c_stride: m as u32,
        _pad: 0,
    };
    let dsp = Dispatch {
        kernel: Kernel::Matvec,
        spec: Specialization::none(),
        params: bytes(&p),
        binds: vec![read(1, "a", 0), read(2, "b", 1), write(3, "out", 2)],
        groups: grid_for(m as u64),
    };
    Ok(Plan::one(needs, dsp))
}

/// Elements one threadgroup of a row-reduction pass covers at most: 64 per thread,
/// summed in short pairwise runs (see `reduce.wgsl`), then a tree over the 256 threads. Longer rows take further passes
/// over the partials (one chunking rule for every reduction and `dot`), so every sum
/// is short serial runs joined by trees and stays accurate at any length.
pub const REDUCE_CHUNK: usize = 64 * WORKGROUP_SIZE as usize;

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

/// Appends the `ReduceRows` passes that reduce `rows` rows of `axis` elements at `src`
/// (already split into chunks of [`REDUCE_CHUNK`]) into `out`, the last pass scaled.
fn reduce_passes(
    plan: &mut Plan,
    code: u32,
    rows: usize,
    axis: usize,
    src: Operand,
    out: Operand,
    scale: f32,
) {
    let (mut src, mut len) = (src, axis);
    loop {
        let chunks = len.div_ceil(REDUCE_CHUNK);
        let last = chunks == 1;
        let dst = if last {
            out
        } else {
            plan.scratch.push(rows * chunks);
            Operand::Scratch(plan.scratch.len() - 1)
        };
        let pass = RowPass {
            rows,
            axis: len,
            chunks,
            chunk_len: if last { len } else { REDUCE_CHUNK },
            scale: if last { scale } else { 1.0 },
        };
        plan.dispatches
            .push(reduce_rows_dispatch(code, pass, src, dst));
        if last {
            return;
        }
        (src, len) = (dst, chunks);
    }
}

/// Elements of the axis one thread of a strided reduction pass covers at most; a
/// longer axis takes further passes over the partials.
pub const STRIDED_CHUNK: usize = 1024;

/// Appends the `ReduceStrided` passes of `[outer, axis, inner]` (`inner > 1`): each
/// reduces chunks of at most [`STRIDED_CHUNK`] into `[outer, chunks, inner]` partials,
/// until one chunk is left; the last pass writes `out`, scaled.
fn strided_passes(plan: &mut Plan, code: u32, d: ReduceDims, scale: f32) {
    let (mut src, mut axis) = (Operand::Arg(0), d.axis);
    loop {
        let chunks = axis.div_ceil(STRIDED_CHUNK);
        let last = chunks == 1;
        // At most the input's length, which fits u32.
        let outputs = d.outer * chunks * d.inner;
        let dst = if last {
            Operand::Arg(1)
        } else {
            plan.scratch.push(outputs);
            Operand::Scratch(plan.scratch.len() - 1)
        };
        let p = params::Reduce {
            outer: d.outer as u32,
            axis: axis as u32,
            inner: d.inner as u32,
            chunks: chunks as u32,
            chunk_len: if last { axis } else { STRIDED_CHUNK } as u32,
            scale: if last { scale } else { 1.0 },
            _pad: [0; 2],
        };
        plan.dispatches.push(Dispatch {
            kernel: Kernel::ReduceStrided,
            spec: Specialization::op(code),
            params: bytes(&p),
            binds: vec![bind(1, "x", src, false), bind(3, "out", dst, true)],
            groups: thread_grid(outputs),
        });
        if last {
            return;
        }
        (src, axis) = (dst, chunks);
    }
}

/// `reduce(op, x, out, dims)`: a contiguous axis (`inner == 1`) is reduced by
/// threadgroup tree reductions over chunks of at most [`REDUCE_CHUNK`] (one pass per
/// factor of 16384 in the length); a strided one by one thread per output and chunk
/// of at most [`STRIDED_CHUNK`] (likewise in passes). Every thread accumulates
/// pairwise. `Mean` reduces as a sum scaled by `1/axis`.
pub fn reduce(op: ReduceOp, d: ReduceDims) -> Result<Plan> {
    let needs = checks::reduce(d)?;
    u32_of(needs.elems(0), "reduce size")?;
    let out_len = needs.elems(1);
    let mut plan = Plan::empty(needs);
    if out_len == 0 {
        return Ok(plan);
    }
    let code = op.code();
    let scale = if op == ReduceOp::Mean {
        1.0 / d.axis as f32
    } else {
        1.0
    };
    if d.inner > 1 {
        strided_passes(&mut plan, code, d, scale);
        return Ok(plan);
    }
    reduce_passes(
        &mut plan,
        code,
        d.outer,
        d.axis,
        Operand::Arg(0),
        Operand::Arg(1),
        scale,
    );
    Ok(plan)
}

/// `argmax(x, len, out)`: one workgroup, each invocation its strided values, then a tree.
pub fn argmax(len: usize) -> Result<Plan> {
    let needs = checks::argmax(len)?;
    let p = params::Reduce {
        outer: 1,
        axis: len as u32,
        inner: 1,
        chunks: 1,
        chunk_len: len as u32,
        scale: 1.0,
        _pad: [0; 2],
    };
    let dsp = Dispatch {
        kernel: Kernel::Argmax,
        spec: Specialization::none(),
        params: bytes(&p),
        binds: vec![read(1, "x", 0), write(5, "out_u", 1)],
        groups: [1, 1, 1],
    };
    Ok(Plan::one(needs, dsp))
}

/// `dot(a, b, out, len)`: partial dot products per chunk of [`REDUCE_CHUNK`], then sums
/// of the partials as in [`reduce`].
pub fn dot(len: usize) -> Result<Plan> {
    let mut plan = Plan::empty(checks::dot(len));
    u32_of(len, "dot length")?;
    let chunks = len.div_ceil(REDUCE_CHUNK).max(1);
    let direct = chunks == 1;
    let p = params::Reduce {
        outer: 1,
        axis: len as u32,
        inner: 1,
        chunks: chunks as u32,
        chunk_len: if direct { len } else { REDUCE_CHUNK } as u32,
        scale: 1.0,
        _pad: [0; 2],
    };
    let partial_out = if direct {
        Operand::Arg(2)
    } else {
        plan.scratch.push(chunks);
        Operand::Scratch(0)
    };
    plan.dispatches.push(Dispatch {
        kernel: Kernel::DotPartial,
        spec: Specialization::none(),
        params: bytes(&p),
        binds: vec![
            read(1, "x", 0),
            read(2, "y", 1),
            bind(3, "out", partial_out, true),
        ],
        groups: grid_for(chunks as u64),
    });
    if !direct {
        let sum = ReduceOp::Sum.code();
        reduce_passes(&mut plan, sum, 1, chunks, partial_out, Operand::Arg(2), 1.0);
    }
    Ok(plan)
}

/// A one-threadgroup-per-row kernel over `[rows, cols]` (`Norm` params).
fn norm(
    kernel: Kernel,
    needs: Needs,
    rows: usize,
    cols: usize,
    eps: f32,
    binds: Vec<Bind>,
) -> Result<Plan> {
    u32_of(needs.elems(0), "norm size")?;
    if rows == 0 || cols == 0 {
        return Ok(Plan::empty(needs));
    }
    let p = params::Norm {
        rows: rows as u32,
        cols: cols as u32,
        eps,
        _pad: 0,
    };
    let dsp = Dispatch {
        kernel,
        spec: Specialization::none(),
        params: bytes(&p),
        binds,
        groups: grid_for(rows as u64),
    };
    Ok(Plan::one(needs, dsp))
}

/// `softmax(x, out, rows, cols)`: one threadgroup per row (`vec4` accesses when `cols`
/// is a multiple of 4).
pub fn softmax(rows: usize, cols: usize) -> Result<Plan> {
    let needs = checks::softmax(rows, cols)?;
    let (kernel, binds) = if cols.is_multiple_of(4) {
        (
            Kernel::Softmax4,
            vec![read(1, "x4", 0), write(4, "out4", 1)],
        )
    } else {
        (Kernel::Softmax, vec![read(1, "x", 0), write(4, "out", 1)])
    };
    norm(kernel, needs, rows, cols, 0.0, binds)
}

/// `rms_norm(x, weight, out, rows, cols, eps)` (`vec4` accesses when `cols` is a
/// multiple of 4).
pub fn rms_norm(rows: usize, cols: usize, eps: f32) -> Result<Plan> {
    let needs = checks::rms_norm(rows, cols)?;
    let (kernel, n) = if cols.is_multiple_of(4) {
        (Kernel::RmsNorm4, ["x4", "w4", "out4"])
    } else {
        (Kernel::RmsNorm, ["x", "w", "out"])
    };
    let binds = vec![read(1, n[0], 0), read(2, n[1], 1), write(4, n[2], 2)];
    norm(kernel, needs, rows, cols, eps, binds)
}

/// `layer_norm(x, weight, bias, out, rows, cols, eps)`.
pub fn layer_norm(rows: usize, cols: usize, eps: f32) -> Result<Plan> {
    let needs = checks::layer_norm(rows, cols)?;
    let binds = vec![
        read(1, "x", 0),
        read(2, "w", 1),
        read(3, "bias", 2),
        write(4, "out", 3),
    ];
    norm(Kernel::LayerNorm, needs, rows, cols, eps, binds)
}

/// `rope(x, positions, out, dims)`: a thread per rotated pair. The kernel reads `x`
/// through its global `q` and the positions through `k`.
pub fn rope(d: RopeDims) -> Result<Plan> {
    let needs = checks::rope(d)?;
    let n = needs.elems(0);
    u32_of(n, "rope size")?;
    if n == 0 {
        return Ok(Plan::empty(needs));
    }
    let p = params::Rope {
        seq: d.seq as u32,
        heads: d.heads as u32,
        head_dim: d.head_dim as u32,
        base: d.base,
    };
    let dsp = Dispatch {
        kernel: Kernel::Rope,
        spec: Specialization::none(),
        params: bytes(&p),
        binds: vec![read(1, "q", 0), read(2, "k", 1), write(4, "out", 2)],
        groups: thread_grid(n / 2),
    };
    Ok(Plan::one(needs, dsp))
}

/// The tensor sizes of an attention call, within the kernels' 32-bit indices.
fn attn_sizes(d: &AttentionDims) -> Result<checks::AttentionSizes> {
    let s = checks::attention_sizes(d)?;
    u32_of(s.q.max(s.kv).max(s.scores), "attention size")?;
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
    let needs = checks::attention_scores(&d)?;
    let s = attn_sizes(&d)?;
    if s.scores == 0 {
        return Ok(Plan::empty(needs));
    }
    let (q, k, out) = (Operand::Arg(0), Operand::Arg(1), Operand::Arg(2));
    Ok(Plan::one(needs, scores_dispatch(&d, q, k, out, s.scores)))
}

/// `attention_weighted_sum(p, v, out, dims)`: a thread per output element (the kernel
/// reads the probabilities through its global `q`).
pub fn attention_weighted_sum(d: AttentionDims) -> Result<Plan> {
    let needs = checks::attention_weighted_sum(&d)?;
    let s = attn_sizes(&d)?;
    if s.q == 0 {
        return Ok(Plan::empty(needs));
    }
    let (p, v, out) = (Operand::Arg(0), Operand::Arg(1), Operand::Arg(2));
    Ok(Plan::one(needs, weighted_sum_dispatch(&d, p, v, out, s.q)))
}

/// `attention(q, k, v, out, dims)`: the fused kernel (one threadgroup per head and
/// query row) up to `head_dim` 512; beyond that scores → softmax → weighted sum
/// through scratch buffers. `kv_len = 0` (a softmax over no keys) is
/// [`Error::InvalidArgument`].
pub fn attention(d: AttentionDims) -> Result<Plan> {
    let needs = checks::attention(&d)?;
    let s = attn_sizes(&d)?;
    if s.q == 0 {
        return Ok(Plan::empty(needs));
    }
    if d.kv_len == 0 {
        return Err(Error::invalid(
            "attention: kv_len must be at least 1 (softmax over no keys)",
        ));
    }
    if d.head_dim <= ATTENTION_MAX_HEAD_DIM {
        let dsp = Dispatch {
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
        };
        return Ok(Plan::one(needs, dsp));
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
    for b in &mut soft.binds {
        b.operand = Operand::Scratch(if b.writes { 1 } else { 0 });
    }
    let sum = weighted_sum_dispatch(
        &d,
        Operand::Scratch(1),
        Operand::Arg(2),
        Operand::Arg(3),
        s.q,
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
    fn vec4_per_thread_matches_the_wgsl() {
        let src = ringkernel_shaders::wgsl(ringkernel_shaders::Family::Elementwise);
        let line = format!("const VEC4_PER_THREAD: u32 = {VEC4_PER_THREAD}u;");
        assert!(src.contains(&line), "elementwise.wgsl lacks {line:?}");
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
            // The vec4 kernel, a thread per VEC4_PER_THREAD vec4s, over the whole vec4s;
            // the scalar one over the last len % 4 elements.
            let mut expect = Vec::new();
            if len >= 4 {
                expect.push((Kernel::Binary4, 0, len / 4));
            }
            if !len.is_multiple_of(4) {
                expect.push((Kernel::Binary, len / 4 * 4, len));
            }
            assert_eq!(plan.dispatches.len(), expect.len(), "{len}");
            for (d, &(kernel, first, end)) in plan.dispatches.iter().zip(&expect) {
                assert_eq!(d.kernel, kernel);
                let pe = p::<params::Elementwise>(d);
                assert_eq!((pe.first as usize, pe.len as usize), (first, end));
                let per = if kernel == Kernel::Binary4 {
                    VEC4_PER_THREAD
                } else {
                    1
                };
                let threads = (end - first).div_ceil(per);
                assert!(d.total_threads() as usize >= threads, "{len}");
                // The kernel's linear index: first + gid.x + gid.y * nwg.x * 256, and
                // the vec4 kernel's k-th unit one grid (all its threads) further. The
                // last thread must reach end - 1, and no dimension may exceed 65535
                // groups.
                let max_index = (d.groups[0] as u64 * 256 - 1)
                    + (d.groups[1] as u64 - 1) * d.groups[0] as u64 * 256;
                assert!(max_index + 1 >= threads as u64);
                assert!(d.total_threads() * per as u64 >= (end - first) as u64);
                assert!(d.groups.iter().all(|&g| g <= MAX_WORKGROUPS_PER_DIM));
            }
            assert_eq!(plan.needs.args.len(), 3);
        }
        assert!(unary(UnaryOp::Exp, 0).unwrap().dispatches.is_empty());
        assert!(matches!(
            unary(UnaryOp::Exp, 1 << 33),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            matvec(usize::MAX, 2),
            Err(Error::ShapeMismatch(_))
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
        let lens: Vec<usize> = plan.needs.args.iter().map(|n| n.elems).collect();
        assert_eq!(lens, vec![3 * 65 * 7, 7 * 129, 3 * 65 * 129]);
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
    fn long_reductions_take_passes_of_one_chunk_rule() {
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
        // 10^6 → 62 partials → 1; 10^9 → 61,036 → 4 → 1.
        let c = REDUCE_CHUNK;
        for (axis, passes) in [(c, 1), (c + 1, 2), (1_000_000, 2), (1_000_000_000, 3)] {
            let outer = if axis > 1_000_000 { 1 } else { 3 };
            let plan = reduce(
                ReduceOp::Mean,
                ReduceDims {
                    outer,
                    axis,
                    inner: 1,
                },
            )
            .unwrap();
            assert_eq!(plan.dispatches.len(), passes, "axis {axis}");
            assert_eq!(plan.scratch.len(), passes - 1);
            let ps: Vec<params::Reduce> = plan.dispatches.iter().map(p).collect();
            let mut len = axis;
            for (i, rp) in ps.iter().enumerate() {
                let last = i + 1 == passes;
                assert_eq!(rp.axis as usize, len);
                assert!(rp.chunk_len as usize <= REDUCE_CHUNK);
                assert!(rp.chunks as usize * rp.chunk_len as usize >= len);
                assert!(
                    (rp.chunks as usize - 1) * (rp.chunk_len as usize) < len,
                    "no empty chunk"
                );
                assert_eq!(
                    rp.scale,
                    if last { 1.0 / axis as f32 } else { 1.0 },
                    "scaled once"
                );
                if !last {
                    assert_eq!(plan.scratch[i], outer * rp.chunks as usize);
                    assert_eq!(plan.dispatches[i + 1].binds[0].operand, Operand::Scratch(i));
                }
                len = rp.chunks as usize;
            }
            assert_eq!(len, 1);
        }
        let strided = |axis| {
            reduce(
                ReduceOp::Max,
                ReduceDims {
                    outer: 2,
                    axis,
                    inner: 3,
                },
            )
            .unwrap()
        };
        assert_eq!(strided(5).dispatches.len(), 1);
        assert_eq!(strided(5).dispatches[0].kernel, Kernel::ReduceStrided);
        let long = strided(3000);
        assert_eq!(long.dispatches.len(), 2);
        assert_eq!(long.scratch, vec![2 * 3 * 3]);
        let first: params::Reduce = p(&long.dispatches[0]);
        assert_eq!((first.chunks, first.chunk_len), (3, STRIDED_CHUNK as u32));
        assert!(matches!(
            reduce(
                ReduceOp::Sum,
                ReduceDims {
                    outer: 1,
                    axis: 0,
                    inner: 1
                }
            ),
            Err(Error::ShapeMismatch(_))
        ));
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
