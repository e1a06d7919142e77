//! # ringkernel-codegen
//!
//! Write a GPU kernel once, in a subset of Rust, and get CUDA C and WGSL for it (and MSL
//! through naga's WGSL front end). The function is also ordinary Rust: with the [`dsl`]
//! module it runs on the CPU, which is the reference the GPU results are compared with.
//!
//! ```
//! use ringkernel_codegen::{transpile_global_kernel, transpile_global_kernel_wgsl};
//!
//! let kernel: syn::ItemFn = syn::parse_quote! {
//!     fn saxpy(a: f32, x: &[f32], y: &mut [f32], n: i32) {
//!         let i = block_idx_x() * block_dim_x() + thread_idx_x();
//!         if i < n {
//!             y[i as usize] = a.mul_add(x[i as usize], y[i as usize]);
//!         }
//!     }
//! };
//! let cuda = transpile_global_kernel(&kernel).unwrap();
//! assert!(cuda.starts_with(
//!     "extern \"C\" __global__ void saxpy(float a, const float* x, float* y, int n)"
//! ));
//! let wgsl = transpile_global_kernel_wgsl(&kernel).unwrap();
//! assert!(wgsl.source.contains("@compute @workgroup_size(64, 1, 1)"));
//! ```
//!
//! ## The subset
//!
//! * **Kernels**: a plain `fn` (no generics, `self`, `async`, `const`, `unsafe`) that
//!   returns nothing; parameters are scalars, slices (`&[T]` read-only, `&mut [T]`
//!   read-write) of scalars or of `GpuType` structs, and structs by value; stencil kernels
//!   also take one [`dsl::GridPos`] or [`dsl::GridPos3`].
//! * **Structs**: structs that derive `GpuType` (u32, i32, f32, u64, i64 fields and
//!   arrays of them, WGSL's layout without implicit padding), declared at the top of
//!   the kernel's body for the translator (`#[gpu_kernel]` puts there the structs the
//!   kernel names, see below). They are parameters (`p: P`, `&[P]`, `&mut [P]`), locals
//!   (`let mut p = ps[i];`), fields are read and assigned (`p.pos[k] += v`,
//!   `ps[i].mass = m`), and struct literals build them (`P { a: 1.0, ..q }`). On WGSL a
//!   64-bit field is two words (`vec2<u32>`): it can be copied into another field of its
//!   type (`out.id = m.id`, `R { id: m.id, .. }`) and nothing else.
//! * **Statements**: `let` / `let mut` (with or without a type; `let x: T;` then
//!   assignment), `=` and the compound assignments, `if`/`else`, `match` on integers
//!   (literal, `a | b` and `_` patterns; becomes a `switch`), `for` over `a..b`, `a..=b`
//!   and `(a..b).step_by(k)`, `while`, `loop`, `break`, `continue`, early `return;`.
//! * **Expressions**: integer, float and bool literals, arithmetic (`+ - * / %`),
//!   comparisons, `&&`/`||`/`!`, bit operators and shifts, `as` casts between scalars,
//!   indexing of slices and local arrays, `if`/`match`/block values (as `let`
//!   initializers or the right side of `=`; a simple `if c { a } else { b }` anywhere),
//!   local arrays (`[a, b, c]`, `[0.0; 8]`), the constants `f32::MAX`/`MIN`/`EPSILON`/
//!   `INFINITY`/`NEG_INFINITY`, `f32::consts::PI`/`E`, `i32::MAX`/`MIN`, `u32::MAX`.
//! * **Math** (methods, or the `f32::sqrt(x)` form): float `sqrt exp exp2 ln log2 sin cos
//!   tan tanh sinh cosh asin acos atan atan2 abs floor ceil trunc recip powf min max
//!   clamp mul_add`; integer `min max clamp abs (i32) wrapping_add wrapping_sub
//!   wrapping_mul`.
//! * **Indices**: [`dsl::thread_idx_x`], [`dsl::block_idx_x`], [`dsl::block_dim_x`],
//!   [`dsl::grid_dim_x`] and their `y`/`z` forms (global kernels).
//! * **Atomics** on elements of `&mut [u32]` / `&mut [i32]` parameters:
//!   `atomic_add(&mut hist[b], 1)` and `atomic_sub`, `atomic_min`, `atomic_max`,
//!   `atomic_and`, `atomic_or`, `atomic_xor`, `atomic_exchange` ([`dsl`]); each returns
//!   the old value. In WGSL such a slice becomes `array<atomic<T>>`, and its plain reads and
//!   writes become `atomicLoad`/`atomicStore` (a `+=` on it is a load and a store, not one
//!   atomic step, as in Rust).
//! * **Shared memory and barriers** (global kernels): `let mut s = shared_array::<T, N>();`
//!   at the top level of the body declares an array of the block's shared memory (CUDA
//!   `__shared__ T s[N];`, WGSL `var<workgroup> s: array<T, N>;`); `sync_threads();` is
//!   the block's barrier with CUDA's meaning: writes before it, to shared arrays and to
//!   slices, are seen by the block's other threads after it (CUDA `__syncthreads()`,
//!   WGSL `workgroupBarrier()`, with `storageBarrier()` in front where needed: see
//!   "Barriers in WGSL" below). Every thread of a block must reach the same barriers (WGSL's
//!   uniformity analysis rejects a barrier under a condition that depends on the thread,
//!   which surfaces as a compile error at launch). The CPU runs such kernels through
//!   [`dsl::launch_with_barriers`] (see [`dsl`] for how).
//!
//! * **Helper functions**: plain `fn`s defined at the top level of the kernel's body,
//!   with scalar parameters (`mut` allowed) and a scalar result, may be called from the
//!   kernel and from each other (no recursion): CUDA `__device__` functions and WGSL
//!   module functions named `rk_fn_<name>`. They use the same statements and expressions
//!   as kernels (`return value;` and a tail value included), but no thread indices (pass
//!   them as parameters), shared arrays or barriers.
//!
//! Unsuffixed literals take the type of the other operand, of the annotation or of the
//! parameter they are passed to, else `i32`/`f32`; Rust infers a literal's type from later
//! uses too (`let mut k = 0; ... k += n_u32`), the translator does not: write `0u32` there
//! (the mismatch is an error that says so). Rust's shadowing (`let x = ...; let x = ...;`)
//! becomes a new name (`x_1`); names that are keywords or built-ins in CUDA C or WGSL get
//! a trailing `_` (`float` → `float_`).
//!
//! Anything else is a [`syn::Error`] at the construct's span that says what is supported.
//!
//! ```
//! use ringkernel_codegen::{transpile_global_kernel, transpile_global_kernel_wgsl};
//!
//! let kernel: syn::ItemFn = syn::parse_quote! {
//!     fn kick(ps: &mut [Particle], k: Kick) {
//!         struct Particle { id: u64, vel: [f32; 2], mass: f32, hits: u32 }
//!         struct Kick { dv: f32, n: u32 }
//!         let i = block_idx_x() * block_dim_x() + thread_idx_x();
//!         if (i as u32) < k.n {
//!             let mut p = ps[i as usize];
//!             p.vel[0] += k.dv / p.mass;
//!             ps[i as usize] = Particle { hits: p.hits + 1, ..p };
//!         }
//!     }
//! };
//! let cuda = transpile_global_kernel(&kernel).unwrap();
//! assert!(cuda.contains("void kick(Particle* ps, const Kick* rk_ref_k)"));
//! let wgsl = transpile_global_kernel_wgsl(&kernel).unwrap();
//! assert!(wgsl.source.contains("var<storage, read_write> ps: array<Particle>;"));
//! ```
//!
//! ## Launching on every backend
//!
//! `#[gpu_kernel]` (in `ringkernel-derive`, re-exported by the `ringkernel` facade) runs
//! these translators at compile time on a global kernel and adds a [`launch::GpuKernel`]
//! const next to the function: its parameters, CUDA C, WGSL and a CPU entry point that
//! runs the Rust function through [`dsl::launch`]. The facade's `Device::launch` takes it
//! with [`launch::KernelArg`]s ([`args!`]) and runs it on the CPU, CUDA, wgpu or Metal.
//!
//! ## Type mapping
//!
//! | Rust            | CUDA C                 | WGSL                                       |
//! |-----------------|------------------------|--------------------------------------------|
//! | `f32`           | `float`                | `f32`                                      |
//! | `f64`           | `double`               | error: WGSL has no `f64`                   |
//! | `i32`           | `int`                  | `i32`                                      |
//! | `u32`           | `unsigned int`         | `u32`                                      |
//! | `i64`           | `long long`            | error: WGSL has no 64-bit integers         |
//! | `u64`           | `unsigned long long`   | error: WGSL has no 64-bit integers         |
//! | `bool`          | `bool`                 | `bool` (a `u32` 0/1 in the params block)   |
//! | `usize` (local) | `unsigned long long`   | `u32`                                      |
//! | `[T; N]` local  | `T name[N]`            | `array<T, N>`                              |
//! | `shared_array::<T, N>()` | `__shared__ T name[N]` | `var<workgroup> name: array<T, N>` |
//! | `&[T]` param    | `const T* name`        | `var<storage, read> name: array<T>`        |
//! | `&mut [T]` param| `T* name`              | `var<storage, read_write> name: array<T>`  |
//! | scalar param    | `T name`               | a field of the uniform params struct       |
//! | `GpuType` struct `S` | `struct S { .. };` | `struct S { .. }` (64-bit fields `vec2`)  |
//! | `s: S` param    | `const S* rk_ref_s`, copied into `S s` | `var<storage, read> rk_ref_s: S`, copied into `var s` |
//!
//! `usize` is not a parameter or element type (no fixed size on the GPU); `bool` buffers
//! are CUDA only.
//!
//! ## Stencils
//!
//! A stencil kernel takes a [`dsl::GridPos`] (or [`dsl::GridPos3`]) and runs once per
//! interior cell of a grid stored with a halo (see [`dsl`]). The same function runs on the
//! CPU through [`dsl::stencil_2d`]:
//!
//! ```
//! use ringkernel_codegen::dsl::*;
//! use ringkernel_codegen::{transpile_stencil_kernel, transpile_stencil_kernel_wgsl, StencilConfig};
//!
//! fn diffuse(pos: GridPos, p: &[f32], out: &mut [f32], c: f32) {
//!     let lap = pos.north(p) + pos.south(p) + pos.west(p) + pos.east(p) - 4.0 * p[pos.idx()];
//!     out[pos.idx()] = p[pos.idx()] + c * lap;
//! }
//!
//! // On the CPU: a 4 x 3 grid with a halo of 1 (6 x 5 values), a spike in the middle.
//! let mut p = vec![0.0f32; GridPos::buffer_len(4, 3, 1)];
//! p[2 * 6 + 2] = 1.0;
//! let mut out = p.clone();
//! stencil_2d(4, 3, 1, |pos| diffuse(pos, &p, &mut out, 0.25));
//! assert_eq!(out[2 * 6 + 2], 0.0);
//! assert_eq!(out[2 * 6 + 3], 0.25);
//!
//! // The same source for the GPU.
//! let f: syn::ItemFn = syn::parse_quote! {
//!     fn diffuse(pos: GridPos, p: &[f32], out: &mut [f32], c: f32) {
//!         let lap = pos.north(p) + pos.south(p) + pos.west(p) + pos.east(p) - 4.0 * p[pos.idx()];
//!         out[pos.idx()] = p[pos.idx()] + c * lap;
//!     }
//! };
//! let cfg = StencilConfig::new(1);
//! let cuda = transpile_stencil_kernel(&f, &cfg).unwrap();
//! assert!(cuda.contains("void diffuse(const float* p, float* out, float c, int rk_nx, int rk_ny)"));
//! let wgsl = transpile_stencil_kernel_wgsl(&f, &cfg).unwrap();
//! assert_eq!(wgsl.params.len(), 3); // c, rk_nx, rk_ny
//! ```
//!
//! ## CUDA output
//!
//! [`transpile_global_kernel`] gives `extern "C" __global__ void name(params) { ... }`,
//! parameters in the Rust order; launch it with any grid and block. Stencil kernels
//! ([`transpile_stencil_kernel`]) drop the `GridPos` parameter and take `int rk_nx, int
//! rk_ny` (and `int rk_nz` in 3-D) last: the interior size; launch a 2-D (3-D) grid
//! covering it, threads past the end return at once.
//!
//! ## WGSL output and binding layout
//!
//! [`transpile_global_kernel_wgsl`] gives a [`WgslKernel`]: one `@compute` entry point
//! named like the function, with a fixed workgroup size (the `block_dim_*` values). All
//! resources are in group 0:
//!
//! * binding 0: `var<uniform> rk_params: RkParams`, present when the kernel has scalar
//!   parameters (or is a stencil): one 4-byte field per scalar parameter in parameter
//!   order (`bool` as a `u32` 0/1), then the stencil's `rk_nx, rk_ny[, rk_nz]` (`i32`),
//!   padded with `u32` fields to a multiple of 16 bytes ([`WgslKernel::params`],
//!   [`WgslKernel::params_size`], [`WgslKernel::pack_params`]);
//! * bindings 1, 2, ...: the slice parameters in order, `var<storage, read>` for `&[T]`
//!   and `var<storage, read_write>` for `&mut [T]`; a struct passed by value takes its
//!   place in this order too, as a read-only buffer of one struct.
//!
//! Dispatch `grid_dim` workgroups ([`WgslKernel::workgroup_size`] invocations each).
//!
//! ## Barriers in WGSL
//!
//! WGSL's `workgroupBarrier()` orders workgroup memory (the shared arrays) only; slices are
//! storage buffers, ordered by `storageBarrier()`, which costs time. The translator puts
//! `storageBarrier()` in front of every `workgroupBarrier()` of a kernel unless it can
//! show that no thread reads, after a barrier, a slice element another thread of its
//! workgroup wrote before it. It can show that when every `&mut` slice that the kernel
//! both reads and writes is *private to its threads*: every access to it indexes it as
//! `thread_idx_x() + S` (up to multiples of the workgroup's width), with the same `S` at
//! every access, `S` built from values that are the same in every thread (literals,
//! scalar parameters, `block_idx_*()`, `block_dim_*()`, `grid_dim_*()`, immutable locals
//! of those), in a one-dimensional workgroup. The index may go through `as` casts and
//! mutable locals whose every assignment keeps that form (`let mut c = t; ..
//! c += block_dim_x();`, `for k in (t..n).step_by(block_dim_x())`). A slice that atomics
//! touch always takes the storage barrier. A row softmax that reads and rescales its own
//! columns of the output gets `workgroupBarrier()` alone; a kernel whose thread reads
//! what a neighbour wrote gets both (the `barriers` tests run both against the CPU).
//!
//! ## Where the GPU differs from the CPU
//!
//! The CPU runs the Rust, so it panics where the GPU does not: an out-of-bounds index
//! (CUDA: undefined; WGSL: a clamped or zero access), integer overflow in a debug build
//! (GPUs wrap; use `wrapping_*` where it matters), integer division by zero (WGSL gives
//! the dividend; CUDA is undefined). Float results can differ in the last bits (fused
//! multiply-adds, the GPU's `exp`/`sin`/... accuracy) and for NaN inputs to `min`, `max`
//! and `clamp`; WGSL's `pow` of a negative base is undefined (Rust and CUDA give a value
//! for integral exponents), and its float `%` is `x - y * trunc(x / y)` rather than an
//! exact `fmod`. Shift amounts of the bit width or more: Rust (release) and WGSL use the
//! low 5 bits, CUDA is undefined. A NaN cast to an integer is 0 in Rust, unspecified in
//! WGSL. A `for` over `a..=b` with `b` the type's maximum does not end on the GPU.
//! A simple `if` value inside an expression becomes `select` in WGSL, which evaluates
//! both branches.

#![warn(missing_docs)]

pub mod dsl;
pub mod launch;
mod names;
mod structs;
mod translate;
mod types;

pub use types::ScalarType;

use translate::{Kind, Output, Tx};

/// A translation target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Target {
    /// CUDA C for NVRTC.
    Cuda,
    /// WGSL for wgpu/naga (and MSL through naga).
    Wgsl,
}

/// The default WGSL workgroup size of global kernels.
pub const DEFAULT_WORKGROUP_SIZE: [u32; 3] = [64, 1, 1];

/// Settings of a stencil kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StencilConfig {
    /// Halo width in cells (1 to 16): how far `pos.at(..)` may reach, and the margin of
    /// the buffers around the interior.
    pub halo: u32,
    /// WGSL workgroup size (CUDA takes the block size at launch).
    pub workgroup_size: [u32; 3],
}

impl StencilConfig {
    /// A 2-D stencil with `halo` cells of halo and 16×16 workgroups.
    pub fn new(halo: u32) -> Self {
        StencilConfig {
            halo,
            workgroup_size: [16, 16, 1],
        }
    }

    /// A 3-D stencil with `halo` cells of halo and 8×8×4 workgroups.
    pub fn new_3d(halo: u32) -> Self {
        StencilConfig {
            halo,
            workgroup_size: [8, 8, 4],
        }
    }
}

/// One resource of a [`WgslKernel`] (all in group 0).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WgslBinding {
    /// Binding number.
    pub binding: u32,
    /// Name of the WGSL global (`rk_params` or the slice parameter's name).
    pub name: String,
    /// What it holds.
    pub kind: BindingKind,
}

/// What a [`WgslBinding`] holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BindingKind {
    /// The uniform parameter block (binding 0).
    Params,
    /// A slice of `GpuType` structs, or a struct passed by value (then one element):
    /// a storage buffer of `array<ty>` (`ty` for a value).
    Structs {
        /// The struct's name.
        ty: &'static str,
        /// Its size in bytes.
        size: u32,
        /// `&[T]` or a value (`var<storage, read>`) rather than `&mut [T]`.
        read_only: bool,
    },
    /// A slice parameter: a storage buffer of `elem`.
    Storage {
        /// Element type.
        elem: ScalarType,
        /// `&[T]` (`var<storage, read>`) rather than `&mut [T]`.
        read_only: bool,
        /// The kernel uses atomics on it: declared `array<atomic<T>>` (same memory
        /// layout as `array<T>`).
        atomic: bool,
    },
}

/// One field of the WGSL parameter block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamField {
    /// Field name (the parameter's emitted name, or `rk_nx`/`rk_ny`/`rk_nz`).
    pub name: String,
    /// Its Rust type (`bool` is stored as a `u32`).
    pub ty: ScalarType,
    /// Byte offset in the block.
    pub offset: u32,
}

/// A value for [`WgslKernel::pack_params`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ParamValue {
    /// An `f32` parameter.
    F32(f32),
    /// An `i32` parameter (also the stencil sizes).
    I32(i32),
    /// A `u32` parameter.
    U32(u32),
    /// A `bool` parameter.
    Bool(bool),
}

/// Errors of [`WgslKernel::pack_params`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PackError {
    /// Not one value per field.
    #[error("the parameter block has {expected} fields, {got} values were given")]
    Count {
        /// Fields in the block.
        expected: usize,
        /// Values given.
        got: usize,
    },
    /// A value of the wrong type.
    #[error("parameter `{name}` is a `{expected}`, the value given is not")]
    Type {
        /// The field.
        name: String,
        /// Its Rust type.
        expected: &'static str,
    },
}

/// A kernel translated to WGSL, with its binding layout (see the crate docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WgslKernel {
    /// The complete WGSL module.
    pub source: String,
    /// Name of the `@compute` entry point (the Rust function's name).
    pub entry_point: String,
    /// `@workgroup_size` of the entry point.
    pub workgroup_size: [u32; 3],
    /// Resources in binding order (binding 0 is the parameter block when present).
    pub bindings: Vec<WgslBinding>,
    /// Fields of the parameter block, in order (empty: no block).
    pub params: Vec<ParamField>,
    /// Size of the parameter block in bytes (a multiple of 16; 0 when there is none).
    pub params_size: u32,
}

impl WgslKernel {
    /// The bytes of the parameter block for `values`, one per [`params`](Self::params)
    /// field in order (the stencil sizes included).
    pub fn pack_params(&self, values: &[ParamValue]) -> Result<Vec<u8>, PackError> {
        if values.len() != self.params.len() {
            return Err(PackError::Count {
                expected: self.params.len(),
                got: values.len(),
            });
        }
        let mut out = vec![0u8; self.params_size as usize];
        for (f, v) in self.params.iter().zip(values) {
            let bytes = match (f.ty, v) {
                (ScalarType::F32, ParamValue::F32(x)) => x.to_le_bytes(),
                (ScalarType::I32, ParamValue::I32(x)) => x.to_le_bytes(),
                (ScalarType::U32, ParamValue::U32(x)) => x.to_le_bytes(),
                (ScalarType::Bool, ParamValue::Bool(x)) => (*x as u32).to_le_bytes(),
                _ => {
                    return Err(PackError::Type {
                        name: f.name.clone(),
                        expected: f.ty.rust_name(),
                    })
                }
            };
            let o = f.offset as usize;
            out[o..o + 4].copy_from_slice(&bytes);
        }
        Ok(out)
    }
}

fn run(f: &syn::ItemFn, target: Target, wg: [u32; 3], kind: Kind<'_>) -> syn::Result<Output> {
    Tx::new(target, wg).kernel(f, kind)
}

fn cuda(out: Output) -> String {
    match out {
        Output::Cuda(s) => s,
        Output::Wgsl(_) => unreachable!("CUDA target gives CUDA output"),
    }
}

fn wgsl(out: Output) -> WgslKernel {
    match out {
        Output::Wgsl(k) => k,
        Output::Cuda(_) => unreachable!("WGSL target gives WGSL output"),
    }
}

/// Translates a global kernel to CUDA C: `extern "C" __global__ void name(...) { ... }`.
pub fn transpile_global_kernel(f: &syn::ItemFn) -> syn::Result<String> {
    run(f, Target::Cuda, DEFAULT_WORKGROUP_SIZE, Kind::Global).map(cuda)
}

/// Translates a global kernel to a WGSL compute entry point with the default workgroup
/// size ([`DEFAULT_WORKGROUP_SIZE`]).
pub fn transpile_global_kernel_wgsl(f: &syn::ItemFn) -> syn::Result<WgslKernel> {
    transpile_global_kernel_wgsl_with(f, DEFAULT_WORKGROUP_SIZE)
}

/// Translates a global kernel to WGSL with the given workgroup size (each dimension at
/// least 1, z at most 64, at most 256 invocations).
pub fn transpile_global_kernel_wgsl_with(
    f: &syn::ItemFn,
    workgroup_size: [u32; 3],
) -> syn::Result<WgslKernel> {
    run(f, Target::Wgsl, workgroup_size, Kind::Global).map(wgsl)
}

/// Translates a global kernel to WGSL for a one-dimensional grid of more workgroups
/// than a dimension takes (WebGPU guarantees 65,535): the launcher dispatches
/// `(x, y, 1)` workgroups with `x · y` at least the grid and puts the grid's size in the
/// parameter block's last field, `rk_grid_x` (a `u32`, after the scalar parameters); the
/// kernel takes `block_idx_x()` as the linear workgroup index `x + y · x_count`, returns at
/// once past the grid (the whole workgroup: barriers stay valid), and sees
/// `grid_dim_x()` as the grid's size, `block_idx_y()` / `block_idx_z()` as 0.
///
/// ```
/// use ringkernel_codegen::transpile_global_kernel_wgsl_folded;
/// let f: syn::ItemFn = syn::parse_quote! {
///     fn fill(out: &mut [u32]) {
///         let i = block_idx_x() * block_dim_x() + thread_idx_x();
///         out[i as usize] = (grid_dim_x() - block_idx_x()) as u32;
///     }
/// };
/// let k = transpile_global_kernel_wgsl_folded(&f, [64, 1, 1]).unwrap();
/// assert_eq!(k.params.last().unwrap().name, "rk_grid_x");
/// assert!(k.source.contains("if (rk_bx >= rk_grid_x) { return; }"));
/// ```
pub fn transpile_global_kernel_wgsl_folded(
    f: &syn::ItemFn,
    workgroup_size: [u32; 3],
) -> syn::Result<WgslKernel> {
    let mut tx = Tx::new(Target::Wgsl, workgroup_size);
    tx.fold = true;
    tx.kernel(f, Kind::Global).map(wgsl)
}

/// Translates a stencil kernel (one `GridPos`/`GridPos3` parameter) to CUDA C; the
/// interior size is passed as trailing `int` parameters (see the crate docs).
pub fn transpile_stencil_kernel(f: &syn::ItemFn, config: &StencilConfig) -> syn::Result<String> {
    run(
        f,
        Target::Cuda,
        config.workgroup_size,
        Kind::Stencil(config),
    )
    .map(cuda)
}

/// Translates a stencil kernel to WGSL; the interior size is in the parameter block.
pub fn transpile_stencil_kernel_wgsl(
    f: &syn::ItemFn,
    config: &StencilConfig,
) -> syn::Result<WgslKernel> {
    run(
        f,
        Target::Wgsl,
        config.workgroup_size,
        Kind::Stencil(config),
    )
    .map(wgsl)
}

/// An actor handler (`#[ring_kernel(name = "..", gpu)]`) translated for the GPU
/// templates: CUDA C for the persistent kernel of `ringkernel-cuda` and WGSL for the drain
/// template of `ringkernel-shaders` (wgpu and Metal). See [`transpile_handler`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerSource {
    /// The function's name.
    pub name: String,
    /// CUDA C defining `__device__ int handle(..)` (the persistent template's ABI).
    pub cuda: String,
    /// WGSL defining `fn handle(..)` (the drain template's ABI), or why there is none (a
    /// type WGSL lacks, say).
    pub wgsl: Result<String, String>,
    /// Messages are handled one at a time in order (the handler has state or sends K2K
    /// messages): `RK_HANDLER_SERIAL` / `RK_SERIAL` are set.
    pub serial: bool,
    /// The message struct's name.
    pub message: String,
    /// The reply struct's name (`-> Option<R>`).
    pub reply: Option<String>,
    /// The state's type name and size in bytes (`None`: no state).
    pub state: Option<(String, u32)>,
    /// Every message struct whose type id the sources use (`RK_TID_<Name>`): the message,
    /// the reply, the K2K messages.
    pub type_ids: Vec<String>,
    /// Every struct with the size the translation gives it.
    pub structs: Vec<(String, u32)>,
}

/// Translates an actor handler to the GPU templates' handler ABI (the same Rust function
/// is the CPU handler; see `#[ring_kernel]` in `ringkernel-derive`).
///
/// The handler is `fn name(ctx: &mut KernelContext<'_>, msg: M) -> R` or
/// `fn name(ctx: &mut KernelContext<'_>, state: &mut S, msg: M) -> R`: `M` a
/// `#[repr(C)]` message that derives `GpuType`, `S` a `GpuType` struct or a `u32`, `i32`,
/// `f32` (zeroed at launch on the GPU: its `Default` must be all zeros), `R` either `()`
/// or `Option<Reply>` with `Reply` a `GpuType` message. The structs are declared at the
/// top of the body, as for kernels. The body is the kernel subset without thread indices,
/// shared memory and atomics, plus:
///
/// * `Some(reply)` / `None` as the value of the body (or of `return`);
/// * `ctx.send_to(KernelId(dest), &msg)` as a statement (also `let _ = ..;` or
///   `.ok();`): a K2K send to kernel `dest` (a `u32`). On the GPU it waits while the
///   destination's queue is full (the CPU's `send_to` returns `QueueFull` instead); on
///   wgpu and Metal a message has at most one output (a reply or one send): a second one
///   drops the message (status [`ERR_SECOND_OUTPUT`]);
/// * `ctx.kernel_id().0`: this kernel's id;
/// * `*state` and `state.field` for the state.
///
/// A reply or K2K message larger than the kernel's slots carry drops the request with an
/// error on the GPU (status [`ERR_OUTPUT_TOO_LARGE`] on wgpu and Metal), as the CPU's
/// `reply` and `send_to` fail with `MessageTooLarge`.
///
/// The sources use the type id of each message struct as `RK_TID_<Name>`: put
/// [`handler_prelude`] with the ids (`RingMessage::TYPE_ID`) in front of them.
///
/// ```
/// use ringkernel_codegen::{handler_prelude, transpile_handler, Target};
///
/// let f: syn::ItemFn = syn::parse_quote! {
///     fn count(_ctx: &mut KernelContext<'_>, total: &mut Total, m: Sample) -> Option<Total> {
///         struct Sample { value: f32 }
///         struct Total { n: u32, sum: f32 }
///         total.n += 1;
///         total.sum += m.value;
///         Some(*total)
///     }
/// };
/// let h = transpile_handler(&f).unwrap();
/// assert!(h.serial);
/// assert_eq!(h.state, Some(("Total".to_string(), 8)));
/// assert!(h.cuda.contains("__device__ int handle(RkContext* ctx"));
/// assert!(h.wgsl.as_ref().unwrap().contains("fn handle(ctx: ptr<function, RkContext>"));
/// let ids = [("Sample", 7), ("Total", 8)];
/// assert_eq!(handler_prelude(Target::Cuda, &ids), "#define RK_TID_Sample 0x00000007u\n#define RK_TID_Total 0x00000008u\n");
/// ```
pub fn transpile_handler(f: &syn::ItemFn) -> syn::Result<HandlerSource> {
    let cuda = Tx::new(Target::Cuda, [1, 1, 1]).handler(f)?;
    let wgsl = Tx::new(Target::Wgsl, [1, 1, 1])
        .handler(f)
        .map(|w| w.text)
        .map_err(|e| {
            e.into_iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("; ")
        });
    let mut type_ids = vec![cuda.message.clone()];
    for o in &cuda.outputs {
        if !type_ids.contains(o) {
            type_ids.push(o.clone());
        }
    }
    Ok(HandlerSource {
        name: f.sig.ident.to_string(),
        cuda: cuda.text,
        wgsl,
        serial: cuda.serial,
        message: cuda.message,
        reply: cuda.reply,
        state: cuda.state,
        type_ids,
        structs: cuda.structs,
    })
}

/// The status a generated WGSL handler gives a message that would have a second output
/// (the drain template carries one per message): the message is dropped, counted with
/// this code. The same value as `ringkernel_shaders::drain::ERR_SECOND_OUTPUT`.
pub const ERR_SECOND_OUTPUT: u32 = 3;

/// The status a generated WGSL handler gives a message whose reply or K2K message does
/// not fit the kernel's slots (the same value as
/// `ringkernel_shaders::drain::ERR_OUTPUT_TOO_LARGE`).
pub const ERR_OUTPUT_TOO_LARGE: u32 = 4;

/// The type id constants a handler's sources use ([`HandlerSource::type_ids`]), for
/// `target`: CUDA `#define RK_TID_<Name> <id>u`, WGSL `const RK_TID_<Name>: u32 = <id>u;`.
pub fn handler_prelude(target: Target, type_ids: &[(&str, u32)]) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    for (name, id) in type_ids {
        let _ = match target {
            Target::Cuda => writeln!(s, "#define RK_TID_{name} 0x{id:08X}u"),
            Target::Wgsl => writeln!(s, "const RK_TID_{name}: u32 = 0x{id:08X}u;"),
        };
    }
    s
}

/// One parameter of a kernel, as a launcher binds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelParam {
    /// The Rust name.
    pub name: String,
    /// What it is.
    pub kind: ParamKind,
}

/// What a [`KernelParam`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamKind {
    /// A scalar passed by value (CUDA) or in the parameter block (WGSL).
    Scalar(ScalarType),
    /// A slice: a device pointer (CUDA) or a storage buffer (WGSL).
    Slice {
        /// Element type.
        elem: ScalarType,
        /// `&mut [T]` rather than `&[T]`.
        mutable: bool,
    },
    /// A `GpuType` struct passed by value. Launchers bind it as a one-element read-only
    /// buffer (CUDA `const T*`, WGSL `var<storage, read>`), which the kernel copies into
    /// a local of the parameter's name.
    Struct {
        /// The struct's name.
        name: &'static str,
        /// Its size in bytes (its WGSL and `#[repr(C)]` size).
        size: u32,
    },
    /// A slice of `GpuType` structs: a device pointer (CUDA) or a storage buffer of
    /// `array<T>` (WGSL).
    StructSlice {
        /// The struct's name.
        name: &'static str,
        /// Size of one element in bytes.
        size: u32,
        /// `&mut [T]` rather than `&[T]`.
        mutable: bool,
    },
    /// The cell of a stencil kernel (2 or 3 dimensions): not passed; the launcher passes
    /// the interior size instead (see the crate docs).
    GridPos {
        /// 2 or 3.
        dims: u8,
    },
}

/// The parameters of a kernel in order, checked as the translators check them (types of
/// the subset; `f64` allowed, since it is valid on CUDA). For launchers that bind
/// arguments by position.
pub fn kernel_params(f: &syn::ItemFn) -> syn::Result<Vec<KernelParam>> {
    let structs = structs::Structs::of(f)?;
    let mut out = Vec::new();
    for arg in &f.sig.inputs {
        let (pi, kind) = types::parse_param(arg, Target::Cuda, &structs)?;
        out.push(KernelParam {
            name: pi.ident.to_string(),
            kind,
        });
    }
    Ok(out)
}

/// A `&'static` copy of `s`, made once per distinct string (struct names in
/// [`ParamKind`] and [`BindingKind`], which are `Copy`).
pub(crate) fn intern(s: &str) -> &'static str {
    use std::collections::HashSet;
    use std::sync::{Mutex, OnceLock};
    static NAMES: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
    let mut set = NAMES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(&n) = set.get(s) {
        return n;
    }
    let n: &'static str = Box::leak(s.to_string().into_boxed_str());
    set.insert(n);
    n
}
