//! # ringkernel-shaders
//!
//! The WGSL kernels of RingKernel, written once and used by two backends:
//!
//! * `ringkernel-wgpu` hands the WGSL to wgpu (Vulkan, Metal, DX12, lavapipe);
//! * `ringkernel-metal` translates it to the Metal Shading Language with naga
//!   ([`to_msl`], [`drain_to_msl`]) and compiles that with `newLibraryWithSource`.
//!
//! ## Kernel families and entry points
//!
//! Each [`Family`] is one `.wgsl` file under `kernels/`, embedded with `include_str!`
//! ([`wgsl`]). A [`Kernel`] is one compute entry point of a family. Every kernel has a
//! fixed binding table ([`Kernel::bindings`]): all resources live in bind group 0,
//! binding 0 is always the kernel's uniform parameter block (one of the `#[repr(C)]`
//! structs in [`params`], laid out identically in WGSL), and bindings 1.. are storage
//! buffers of `f32` (or `u32` for the actor queues). There are no push constants, no
//! textures and no samplers, so translation to MSL is a plain buffer mapping.
//!
//! ## Binding → Metal buffer index
//!
//! The MSL translation places `@group(0) @binding(b)` at `[[buffer(b)]]`
//! ([`msl_buffer_index`]); [`MslOutput::buffer_bindings`] lists the mapping that was
//! actually used for the translated entry point, so a Metal host can bind by that table
//! instead of assuming it.
//!
//! ## Specialisation
//!
//! Kernels are specialised with WGSL `override` constants ([`Kernel::overrides`]): the
//! elementwise op code (`OP`) and the reduction op (`OP`). wgpu passes them as pipeline
//! constants; [`to_msl`] resolves them with naga's `process_overrides` before writing MSL,
//! so the Metal source contains plain constants. A pipeline is therefore keyed by
//! `(Kernel, Specialization)`. Workgroup sizes are fixed constants in the sources (see
//! [`Kernel::workgroup_size`]).
//!
//! ## Large dispatches
//!
//! A dispatch is limited to 65535 workgroups per dimension. Kernels that index a flat
//! range (elementwise, RoPE, scores...) compute their linear workgroup index as
//! `wg.x + wg.y * num_workgroups.x`, so the host spreads a large range over a 2-D grid
//! ([`grid_for`]). Row-wise kernels (softmax, norms, reductions) do the same with rows.
//!
//! ## Actor drain passes and the handler ABI
//!
//! See [`drain`] for the template that wraps a message handler written in WGSL, and the
//! ABI a handler follows.

#![warn(missing_docs)]

pub mod drain;
pub mod matmul_tiled;
pub mod params;

pub use matmul_tiled::MatmulTile;

use naga::back::msl;
use naga::valid::{Capabilities, ModuleInfo, ValidationFlags, Validator};
use ringkernel_core::{BackendKind, Error, Result};
use std::collections::BTreeMap;

/// One `.wgsl` source file: a family of related kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// Unary, binary, scalar-binary elementwise ops and SwiGLU (`kernels/elementwise.wgsl`).
    Elementwise,
    /// Workgroup-shared-memory tiled (batched) matmul and matvec (`kernels/matmul.wgsl`).
    Matmul,
    /// The register-tiled matmul, generated per tile shape ([`matmul_tiled`]); as a
    /// family its source is the [`MatmulTile::LARGE`] shape with scalar accesses.
    MatmulTiled,
    /// Tree reductions: sum/max/min/mean along an axis, and dot (`kernels/reduce.wgsl`).
    Reduce,
    /// Row-wise softmax, RMSNorm and LayerNorm (`kernels/norm.wgsl`).
    Norm,
    /// RoPE, attention scores, weighted sum and fused attention (`kernels/attention.wgsl`).
    Attention,
    /// The actor drain template (`kernels/drain.wgsl`), completed with a handler by
    /// [`drain::compose`]. On its own it only validates with a stub handler.
    Drain,
    /// Element-type conversion f32/f16/bf16 on the buffers' words (`kernels/dtype.wgsl`,
    /// after `kernels/half.wgsl`).
    Dtype,
    /// Binary ops under numpy broadcasting (`kernels/broadcast.wgsl`).
    Broadcast,
    /// Products with and lookups in block-format weight matrices (`kernels/quant.wgsl`,
    /// after `kernels/half.wgsl`).
    Quant,
    /// RoPE into a KV cache and attention over it (`kernels/decode.wgsl`).
    Decode,
}

impl Family {
    /// Every family.
    pub const ALL: [Family; 11] = [
        Family::Elementwise,
        Family::Matmul,
        Family::MatmulTiled,
        Family::Reduce,
        Family::Norm,
        Family::Attention,
        Family::Drain,
        Family::Dtype,
        Family::Broadcast,
        Family::Quant,
        Family::Decode,
    ];

    /// Lower-case name (the file stem under `kernels/`).
    pub fn name(self) -> &'static str {
        match self {
            Family::Elementwise => "elementwise",
            Family::Matmul => "matmul",
            Family::MatmulTiled => "matmul_tiled",
            Family::Reduce => "reduce",
            Family::Norm => "norm",
            Family::Attention => "attention",
            Family::Drain => "drain",
            Family::Dtype => "dtype",
            Family::Broadcast => "broadcast",
            Family::Quant => "quant",
            Family::Decode => "decode",
        }
    }
}

/// The WGSL source of a family, as embedded at build time.
///
/// For [`Family::Drain`] this is the template without a handler; use
/// [`drain::compose`] to get a complete module.
pub fn wgsl(family: Family) -> &'static str {
    match family {
        Family::Elementwise => include_str!("../kernels/elementwise.wgsl"),
        Family::Matmul => include_str!("../kernels/matmul.wgsl"),
        Family::MatmulTiled => {
            static SOURCE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
            SOURCE.get_or_init(|| matmul_tiled::generate_source(MatmulTile::LARGE, false, false))
        }
        Family::Reduce => include_str!("../kernels/reduce.wgsl"),
        Family::Norm => include_str!("../kernels/norm.wgsl"),
        Family::Attention => include_str!("../kernels/attention.wgsl"),
        Family::Drain => drain::TEMPLATE,
        Family::Dtype => concat!(
            include_str!("../kernels/half.wgsl"),
            include_str!("../kernels/dtype.wgsl")
        ),
        Family::Broadcast => include_str!("../kernels/broadcast.wgsl"),
        Family::Quant => concat!(
            include_str!("../kernels/half.wgsl"),
            include_str!("../kernels/quant.wgsl")
        ),
        Family::Decode => include_str!("../kernels/decode.wgsl"),
    }
}

/// How a binding is accessed by the shader.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    /// `var<uniform>`: the parameter block (binding 0).
    Uniform,
    /// `var<storage, read>`.
    Read,
    /// `var<storage, read_write>`.
    ReadWrite,
}

/// One entry of a kernel's binding table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Binding {
    /// Bind group (always 0).
    pub group: u32,
    /// Binding number within the group (also the Metal buffer index).
    pub binding: u32,
    /// Name of the WGSL global.
    pub name: &'static str,
    /// Access mode.
    pub access: Access,
}

const fn b(binding: u32, name: &'static str, access: Access) -> Binding {
    Binding {
        group: 0,
        binding,
        name,
        access,
    }
}

use Access::{Read as R, ReadWrite as RW, Uniform as U};

/// Workgroup size (threads) of the 1-D kernels; the host sizes grids with it.
pub const WORKGROUP_SIZE: u32 = 256;
/// Output tile edge of the tiled matmul (each workgroup computes a 64×64 tile; the
/// grid is `(ceil(n/64), ceil(m/64), batch)`).
pub const MATMUL_TILE: u32 = 64;
/// Largest `head_dim` the fused attention kernel supports.
pub const ATTENTION_MAX_HEAD_DIM: usize = 512;
/// Most workgroups per dispatch dimension (WebGPU's default limit).
pub const MAX_WORKGROUPS_PER_DIM: u32 = 65535;

/// One compute entry point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kernel {
    /// `out[i] = OP(x[i])`, `OP` = [`UnaryOp::code`](ringkernel_core::compute::UnaryOp::code).
    /// Params: [`params::Elementwise`].
    Unary,
    /// `out[i] = OP(a[i], b[i])`, `OP` = [`BinaryOp::code`](ringkernel_core::compute::BinaryOp::code).
    Binary,
    /// `out[i] = OP(a[i], scalar)`.
    BinaryScalar,
    /// `out[i] = silu(a[i]) · b[i]`.
    Swiglu,
    /// [`Kernel::Unary`] on `vec4<f32>` (16-byte accesses) over the whole vec4s of a range;
    /// `len` in the params counts vec4s.
    Unary4,
    /// [`Kernel::Binary`] on `vec4<f32>`.
    Binary4,
    /// [`Kernel::BinaryScalar`] on `vec4<f32>`.
    BinaryScalar4,
    /// [`Kernel::Swiglu`] on `vec4<f32>`.
    Swiglu4,
    /// Tiled (batched) matmul, one [`MATMUL_TILE`]² output tile per workgroup, batch in `wg.z`.
    /// Params: [`params::Matmul`].
    Matmul,
    /// `out[m] = A[m, :] · x`, one workgroup per row. Params: [`params::Matmul`] (`n` = 1).
    Matvec,
    /// Register-tiled (batched) matmul, generated per [`MatmulTile`] (the tile shape and
    /// vector flags are its [`Specialization`], see [`MatmulTile::spec`]); grid
    /// [`MatmulTile::grid`]. Params: [`params::Matmul`].
    MatmulTiled,
    /// Reduction of each row chunk of a `[rows, cols]` view (contiguous axis) into
    /// `out[row * chunks + chunk]`, a workgroup per (row, chunk), tree reduction in
    /// workgroup memory, result multiplied by `scale`. `OP` = [`ReduceOp::code`](ringkernel_core::compute::ReduceOp::code)
    /// (Mean reduces as Sum; the host passes `scale = 1/axis` on the final pass).
    /// Params: [`params::Reduce`].
    ReduceRows,
    /// Reduction over the middle axis of `[outer, axis, inner]` with `inner > 1`:
    /// one thread per output, looping over the axis (coalesced across `inner`).
    ReduceStrided,
    /// Partial dot products: `out[chunk] = Σ a[i]·b[i]` over a chunk, per workgroup.
    DotPartial,
    /// `out_u[0]` = the index of the first largest of `x[0..axis]` (NaNs passed over),
    /// one workgroup. Params: [`params::Reduce`].
    Argmax,
    /// Numerically stable softmax, one workgroup per row. Params: [`params::Norm`].
    Softmax,
    /// RMSNorm, one workgroup per row.
    RmsNorm,
    /// LayerNorm, one workgroup per row.
    LayerNorm,
    /// [`Kernel::Softmax`] with `vec4<f32>` accesses, for `cols` divisible by 4.
    Softmax4,
    /// [`Kernel::RmsNorm`] with `vec4<f32>` accesses, for `cols` divisible by 4.
    RmsNorm4,
    /// RoPE, half-split layout, a thread per rotated pair. Params: [`params::Rope`].
    Rope,
    /// `scores = scale · Q·Kᵀ` with causal mask. Params: [`params::Attention`].
    AttentionScores,
    /// `out = P·V`.
    AttentionWeightedSum,
    /// Fused attention with an online softmax, one workgroup per (head, query row).
    Attention,
    /// Actor drain pass, one invocation per message ([`drain`]).
    Drain,
    /// Actor drain pass, one invocation processing the batch in order ([`drain`]).
    DrainSerial,
    /// Element-type conversion, a thread per output word. Params: [`params::Convert`].
    Convert,
    /// `out[i] = OP(a[·], b[·])` under broadcasting, a thread per output element.
    /// Params: [`params::Broadcast`].
    BroadcastBinary,
    /// `x · Wᵀ` on a block-format `W` (`FORMAT` = [`WeightFormat::code`](ringkernel_core::compute::WeightFormat::code)),
    /// or with `GATED = 1` `silu(x·Wᵀ)·(x·W2ᵀ)`; 8 rows a workgroup, 4 tokens in
    /// `wg.z`. Params: [`params::Quant`].
    Qmatmul,
    /// Rows of a block-format table by id, a thread per output element. Params:
    /// [`params::Quant`] (`batch` = ids).
    Embedding,
    /// RoPE of queries and keys into a KV cache, a thread per pair or value. Params:
    /// [`params::Kv`].
    RopeKv,
    /// Grouped-query attention over a KV cache, a workgroup per (token, head). Params:
    /// [`params::Kv`].
    AttentionKv,
}

impl Kernel {
    /// Every kernel.
    pub const ALL: [Kernel; 32] = [
        Kernel::Unary,
        Kernel::Binary,
        Kernel::BinaryScalar,
        Kernel::Swiglu,
        Kernel::Unary4,
        Kernel::Binary4,
        Kernel::BinaryScalar4,
        Kernel::Swiglu4,
        Kernel::Matmul,
        Kernel::Matvec,
        Kernel::MatmulTiled,
        Kernel::ReduceRows,
        Kernel::ReduceStrided,
        Kernel::DotPartial,
        Kernel::Argmax,
        Kernel::Softmax,
        Kernel::RmsNorm,
        Kernel::LayerNorm,
        Kernel::Softmax4,
        Kernel::RmsNorm4,
        Kernel::Rope,
        Kernel::AttentionScores,
        Kernel::AttentionWeightedSum,
        Kernel::Attention,
        Kernel::Drain,
        Kernel::DrainSerial,
        Kernel::Convert,
        Kernel::BroadcastBinary,
        Kernel::Qmatmul,
        Kernel::Embedding,
        Kernel::RopeKv,
        Kernel::AttentionKv,
    ];

    /// The file it lives in.
    pub fn family(self) -> Family {
        use Kernel::*;
        match self {
            Unary | Binary | BinaryScalar | Swiglu | Unary4 | Binary4 | BinaryScalar4 | Swiglu4 => {
                Family::Elementwise
            }
            Matmul | Matvec => Family::Matmul,
            MatmulTiled => Family::MatmulTiled,
            ReduceRows | ReduceStrided | DotPartial | Argmax => Family::Reduce,
            Softmax | RmsNorm | LayerNorm | Softmax4 | RmsNorm4 => Family::Norm,
            Rope | AttentionScores | AttentionWeightedSum | Attention => Family::Attention,
            Drain | DrainSerial => Family::Drain,
            Convert => Family::Dtype,
            BroadcastBinary => Family::Broadcast,
            Qmatmul | Embedding => Family::Quant,
            RopeKv | AttentionKv => Family::Decode,
        }
    }

    /// Name of the WGSL entry point.
    pub fn entry_point(self) -> &'static str {
        use Kernel::*;
        match self {
            Unary => "unary",
            Binary => "binary",
            BinaryScalar => "binary_scalar",
            Swiglu => "swiglu",
            Unary4 => "unary4",
            Binary4 => "binary4",
            BinaryScalar4 => "binary_scalar4",
            Swiglu4 => "swiglu4",
            Matmul => "matmul",
            Matvec => "matvec",
            MatmulTiled => "matmul_tiled",
            ReduceRows => "reduce_rows",
            ReduceStrided => "reduce_strided",
            DotPartial => "dot_partial",
            Argmax => "argmax",
            Softmax => "softmax",
            RmsNorm => "rms_norm",
            LayerNorm => "layer_norm",
            Softmax4 => "softmax4",
            RmsNorm4 => "rms_norm4",
            Rope => "rope",
            AttentionScores => "attention_scores",
            AttentionWeightedSum => "attention_weighted_sum",
            Attention => "attention",
            Drain => "rk_drain",
            DrainSerial => "rk_drain_serial",
            Convert => "convert",
            BroadcastBinary => "broadcast_binary",
            Qmatmul => "qmatmul",
            Embedding => "embedding",
            RopeKv => "rope_kv",
            AttentionKv => "attention_kv",
        }
    }

    /// Workgroup size `[x, y, z]` declared by the entry point.
    pub fn workgroup_size(self) -> [u32; 3] {
        match self {
            Kernel::Drain => [drain::DRAIN_WORKGROUP_SIZE, 1, 1],
            Kernel::DrainSerial => [1, 1, 1],
            _ => [WORKGROUP_SIZE, 1, 1],
        }
    }

    /// Names of the `override` constants the kernel reads (its specialisation).
    pub fn overrides(self) -> &'static [&'static str] {
        use Kernel::*;
        match self {
            Unary | Binary | BinaryScalar | Unary4 | Binary4 | BinaryScalar4 | ReduceRows
            | ReduceStrided | BroadcastBinary => &["OP"],
            Qmatmul => &["FORMAT", "GATED"],
            Embedding => &["FORMAT"],
            _ => &[],
        }
    }

    /// The binding table the host must use (all in group 0, binding 0 = params).
    pub fn bindings(self) -> &'static [Binding] {
        use Kernel::*;
        match self {
            Unary | Unary4 => {
                const T: &[Binding] = &[b(0, "p", U), b(1, "a", R), b(3, "out", RW)];
                T
            }
            Binary | Swiglu | Binary4 | Swiglu4 => {
                const T: &[Binding] = &[b(0, "p", U), b(1, "a", R), b(2, "b", R), b(3, "out", RW)];
                T
            }
            BinaryScalar | BinaryScalar4 => {
                const T: &[Binding] = &[b(0, "p", U), b(1, "a", R), b(3, "out", RW)];
                T
            }
            Matmul | Matvec | MatmulTiled => {
                const T: &[Binding] = &[b(0, "p", U), b(1, "a", R), b(2, "b", R), b(3, "out", RW)];
                T
            }
            ReduceRows | ReduceStrided => {
                const T: &[Binding] = &[b(0, "p", U), b(1, "x", R), b(3, "out", RW)];
                T
            }
            DotPartial => {
                const T: &[Binding] = &[b(0, "p", U), b(1, "x", R), b(2, "y", R), b(3, "out", RW)];
                T
            }
            Argmax => {
                const T: &[Binding] = &[b(0, "p", U), b(1, "x", R), b(5, "out_u", RW)];
                T
            }
            Softmax | Softmax4 => {
                const T: &[Binding] = &[b(0, "p", U), b(1, "x", R), b(4, "out", RW)];
                T
            }
            RmsNorm | RmsNorm4 => {
                const T: &[Binding] = &[b(0, "p", U), b(1, "x", R), b(2, "w", R), b(4, "out", RW)];
                T
            }
            LayerNorm => {
                const T: &[Binding] = &[
                    b(0, "p", U),
                    b(1, "x", R),
                    b(2, "w", R),
                    b(3, "bias", R),
                    b(4, "out", RW),
                ];
                T
            }
            Rope => {
                const T: &[Binding] =
                    &[b(0, "p", U), b(1, "x", R), b(2, "pos", R), b(4, "out", RW)];
                T
            }
            AttentionScores => {
                const T: &[Binding] = &[b(0, "p", U), b(1, "q", R), b(2, "k", R), b(4, "out", RW)];
                T
            }
            AttentionWeightedSum => {
                const T: &[Binding] = &[b(0, "p", U), b(1, "q", R), b(3, "v", R), b(4, "out", RW)];
                T
            }
            Attention => {
                const T: &[Binding] = &[
                    b(0, "p", U),
                    b(1, "q", R),
                    b(2, "k", R),
                    b(3, "v", R),
                    b(4, "out", RW),
                ];
                T
            }
            Drain | DrainSerial => drain::BINDINGS,
            Convert => {
                const T: &[Binding] = &[b(0, "p", U), b(1, "a", R), b(3, "out", RW)];
                T
            }
            BroadcastBinary => {
                const T: &[Binding] = &[b(0, "p", U), b(1, "a", R), b(2, "b", R), b(3, "out", RW)];
                T
            }
            Qmatmul => {
                const T: &[Binding] = &[
                    b(0, "p", U),
                    b(1, "w", R),
                    b(2, "w2", R),
                    b(3, "x", R),
                    b(4, "out", RW),
                ];
                T
            }
            Embedding => {
                const T: &[Binding] =
                    &[b(0, "p", U), b(1, "w", R), b(4, "out", RW), b(5, "ids", R)];
                T
            }
            RopeKv => {
                const T: &[Binding] = &[
                    b(0, "p", U),
                    b(1, "x", R),
                    b(2, "pos", R),
                    b(3, "out", RW),
                    b(4, "kc", RW),
                    b(5, "vc", RW),
                ];
                T
            }
            AttentionKv => {
                const T: &[Binding] = &[
                    b(0, "p", U),
                    b(1, "x", R),
                    b(2, "pos", R),
                    b(3, "out", RW),
                    b(6, "kr", R),
                    b(7, "vr", R),
                ];
                T
            }
        }
    }
}

/// Values for a kernel's `override` constants, by name. Ordered, so usable as a cache key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Specialization(pub BTreeMap<&'static str, u32>);

impl Specialization {
    /// No overrides (every constant at its default).
    pub fn none() -> Self {
        Self::default()
    }
    /// Only `OP = code`.
    pub fn op(code: u32) -> Self {
        let mut m = BTreeMap::new();
        m.insert("OP", code);
        Specialization(m)
    }
    /// The constants as `(name, value as f64)` pairs (what wgpu's pipeline constants take).
    pub fn constants(&self) -> Vec<(&'static str, f64)> {
        self.0.iter().map(|(k, v)| (*k, *v as f64)).collect()
    }
}

/// The part of `spec` that selects a kernel's source rather than its `override`s: the
/// tile shape and flags of [`Kernel::MatmulTiled`], nothing for every other kernel. A
/// host caches shader modules by `(family, source_key)`.
pub fn source_key(kernel: Kernel, spec: &Specialization) -> Specialization {
    match kernel {
        Kernel::MatmulTiled => spec.clone(),
        _ => Specialization::none(),
    }
}

/// The WGSL `override` values of `spec` for `kernel` (only the names of
/// [`Kernel::overrides`]), as wgpu's pipeline constants take them.
pub fn pipeline_constants(kernel: Kernel, spec: &Specialization) -> Vec<(&'static str, f64)> {
    spec.constants()
        .into_iter()
        .filter(|(k, _)| kernel.overrides().contains(k))
        .collect()
}

/// The WGSL module that holds `kernel` under `spec`: its family's file, or the source
/// generated for the tile shape of a [`Kernel::MatmulTiled`] specialisation.
pub fn kernel_wgsl(
    kernel: Kernel,
    spec: &Specialization,
) -> Result<std::borrow::Cow<'static, str>> {
    match kernel {
        Kernel::MatmulTiled => {
            let (tile, va, vb) = MatmulTile::from_spec(spec)?;
            Ok(tile.wgsl(va, vb)?.into())
        }
        Kernel::Drain | Kernel::DrainSerial => Ok(drain::compose(drain::STUB_HANDLER).into()),
        k => Ok(wgsl(k.family()).into()),
    }
}

/// Parses and validates the module of `kernel` under `spec` ([`kernel_wgsl`]).
pub fn validate_kernel(kernel: Kernel, spec: &Specialization) -> Result<Validated> {
    match kernel {
        Kernel::MatmulTiled => {
            let (tile, ..) = MatmulTile::from_spec(spec)?;
            validate_source(&format!("matmul_tiled {tile}"), &kernel_wgsl(kernel, spec)?)
        }
        k => validate(k.family()),
    }
}

/// The Metal buffer index of a binding: `[[buffer(binding)]]`. Group 0 only.
pub fn msl_buffer_index(binding: &Binding) -> u8 {
    binding.binding as u8
}

/// Workgroup grid for `groups` workgroups along a linear range, spread over x and y so
/// neither exceeds [`MAX_WORKGROUPS_PER_DIM`]. Kernels recover the linear index as
/// `wg.x + wg.y * num_workgroups.x` and ignore indices past the end.
pub fn grid_for(groups: u64) -> [u32; 3] {
    let max = MAX_WORKGROUPS_PER_DIM as u64;
    if groups <= max {
        [groups.max(1) as u32, 1, 1]
    } else {
        [max as u32, groups.div_ceil(max) as u32, 1]
    }
}

/// A parsed and validated module.
#[derive(Debug)]
pub struct Validated {
    /// The naga IR.
    pub module: naga::Module,
    /// Validation results (needed by naga's back ends).
    pub info: ModuleInfo,
}

fn compile_err(backend: BackendKind, log: String) -> Error {
    Error::Compile { backend, log }
}

/// Parses and validates WGSL `source` with naga. Parse or validation failures are
/// [`Error::Compile`] (backend `wgpu`) with naga's diagnostic, annotated with `label`.
pub fn validate_source(label: &str, source: &str) -> Result<Validated> {
    let module = naga::front::wgsl::parse_str(source).map_err(|e| {
        compile_err(
            BackendKind::Wgpu,
            format!("{label}: {}", e.emit_to_string_with_path(source, label)),
        )
    })?;
    let info = Validator::new(ValidationFlags::all(), Capabilities::default())
        .validate(&module)
        .map_err(|e| {
            compile_err(
                BackendKind::Wgpu,
                format!("{label}: {}", e.emit_to_string(source)),
            )
        })?;
    Ok(Validated { module, info })
}

/// Parses and validates one family's source. For [`Family::Drain`] a stub handler is
/// added (see [`drain::STUB_HANDLER`]).
pub fn validate(family: Family) -> Result<Validated> {
    match family {
        Family::Drain => validate_source("drain.wgsl", &drain::compose(drain::STUB_HANDLER)),
        f => validate_source(&format!("{}.wgsl", f.name()), wgsl(f)),
    }
}

/// Result of translating one entry point to MSL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MslOutput {
    /// Complete MSL source (one compute function).
    pub source: String,
    /// Name of the MSL function to look up in the library (naga may rename).
    pub entry_point: String,
    /// `(group, binding, msl_buffer_index)` for every resource the entry point uses.
    pub buffer_bindings: Vec<(u32, u32, u8)>,
    /// Threadgroup size declared by the kernel.
    pub workgroup_size: [u32; 3],
    /// The buffer-sizes argument naga adds for runtime-sized arrays: bind a `uint` array
    /// at `[[buffer(SIZES_BUFFER_INDEX)]]` holding, for each entry of
    /// [`sizes_order`](Self::sizes_order), the byte size of the buffer bound at that
    /// `(group, binding)` (0 for `None` or an unbound one). `None` if the kernel needs no
    /// sizes (currently every kernel does, since all use `array<T>` storage).
    pub sizes_buffer: Option<u8>,
    /// Order of the sizes in the sizes buffer (module declaration order of globals that
    /// contain runtime-sized arrays).
    pub sizes_order: Vec<Option<(u32, u32)>>,
}

/// Metal buffer index of the buffer-sizes argument (the last of Metal's 31 slots).
pub const SIZES_BUFFER_INDEX: u8 = 30;

/// MSL language version the translation targets (2.1: macOS 10.14 / iOS 12 and later).
pub const MSL_VERSION: (u8, u8) = (2, 1);

/// Translates a validated module's entry point `entry` to MSL with the explicit
/// binding table `bindings` and the override values `spec`.
pub fn module_to_msl(
    v: &Validated,
    entry: &str,
    bindings: &[Binding],
    spec: &Specialization,
) -> Result<MslOutput> {
    let msl_err = |what: &str, e: String| {
        compile_err(
            BackendKind::Metal,
            format!("MSL translation of {entry}: {what}: {e}"),
        )
    };
    let ep = v
        .module
        .entry_points
        .iter()
        .find(|ep| ep.name == entry)
        .ok_or_else(|| Error::invalid(format!("no entry point {entry:?} in the module")))?;
    let workgroup_size = ep.workgroup_size;
    let mut constants = naga::back::PipelineConstants::default();
    for (k, val) in spec.constants() {
        constants.insert(k.to_string(), val);
    }
    let (module, info) = naga::back::pipeline_constants::process_overrides(
        &v.module,
        &v.info,
        Some((naga::ShaderStage::Compute, entry)),
        &constants,
    )
    .map_err(|e| msl_err("override constants", e.to_string()))?;

    let mut resources = msl::BindingMap::default();
    let mut table = Vec::new();
    for bnd in bindings {
        let slot = msl_buffer_index(bnd);
        resources.insert(
            naga::ResourceBinding {
                group: bnd.group,
                binding: bnd.binding,
            },
            msl::BindTarget {
                buffer: Some(slot),
                mutable: bnd.access == Access::ReadWrite,
                ..Default::default()
            },
        );
        table.push((bnd.group, bnd.binding, slot));
    }
    let mut per_entry_point_map = msl::EntryPointResourceMap::default();
    per_entry_point_map.insert(
        entry.to_string(),
        msl::EntryPointResources {
            resources,
            immediates_buffer: None,
            sizes_buffer: Some(SIZES_BUFFER_INDEX),
        },
    );
    let options = msl::Options {
        lang_version: MSL_VERSION,
        per_entry_point_map,
        // A binding missing from the table is an error, never silently wrong MSL.
        fake_missing_bindings: false,
        zero_initialize_workgroup_memory: true,
        ..Default::default()
    };
    let pipeline = msl::PipelineOptions {
        entry_point: Some((naga::ShaderStage::Compute, entry.to_string())),
        ..Default::default()
    };
    let (source, tinfo) = msl::write_string(&module, &info, &options, &pipeline)
        .map_err(|e| msl_err("writer", e.to_string()))?;
    let sizes_order: Vec<Option<(u32, u32)>> = module
        .global_variables
        .iter()
        .filter(|(_, var)| {
            module.types[var.ty]
                .inner
                .needs_host_buffer_byte_size(&module.types)
        })
        .map(|(_, var)| var.binding.as_ref().map(|b| (b.group, b.binding)))
        .collect();
    let sizes_buffer = if source.contains("_buffer_sizes") {
        Some(SIZES_BUFFER_INDEX)
    } else {
        None
    };
    let entry_point = match tinfo.entry_point_names.into_iter().next() {
        Some(Ok(name)) => name,
        Some(Err(e)) => return Err(msl_err("entry point", e.to_string())),
        None => return Err(msl_err("entry point", "not written".into())),
    };
    Ok(MslOutput {
        source,
        entry_point,
        buffer_bindings: table,
        workgroup_size,
        sizes_buffer,
        sizes_order,
    })
}

/// Translates one kernel to MSL with its binding table ([`Kernel::bindings`]) and the
/// given specialisation. For [`Kernel::Drain`]/[`Kernel::DrainSerial`] use
/// [`drain_to_msl`] (the drain needs a handler); here they get the stub handler.
pub fn to_msl(kernel: Kernel, spec: &Specialization) -> Result<MslOutput> {
    let v = validate_kernel(kernel, spec)?;
    let overrides = Specialization(
        spec.0
            .iter()
            .filter(|(k, _)| kernel.overrides().contains(k))
            .map(|(k, v)| (*k, *v))
            .collect(),
    );
    module_to_msl(&v, kernel.entry_point(), kernel.bindings(), &overrides)
}

/// Composes the drain template with `handler_wgsl` and translates the parallel
/// (`serial = false`) or in-order (`serial = true`) drain entry point to MSL.
pub fn drain_to_msl(handler_wgsl: &str, serial: bool) -> Result<MslOutput> {
    let v = validate_source("drain+handler", &drain::compose(handler_wgsl))?;
    let k = if serial {
        Kernel::DrainSerial
    } else {
        Kernel::Drain
    };
    module_to_msl(&v, k.entry_point(), k.bindings(), &Specialization::none())
}
