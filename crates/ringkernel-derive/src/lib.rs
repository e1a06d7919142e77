//! # ringkernel-derive
//!
//! Procedural macros of RingKernel. Use them through the `ringkernel` facade (which
//! re-exports them) or next to a direct `ringkernel-core` dependency; the generated code
//! finds whichever of the two your crate depends on.
//!
//! * [`macro@RingMessage`]: a struct becomes a message with a stable type id
//!   (`#[message(type_id = N)]`): plain data for a `#[repr(C)]` struct (`bytemuck::Pod`
//!   checked at compile time), an rkyv archive (`Vec`, `String`, nested structs)
//!   otherwise.
//! * [`macro@GpuType`]: a struct whose WGSL storage-buffer layout is fixed and checked,
//!   with its WGSL declaration generated (with or without `#[repr(C)]`).
//! * [`macro@ring_kernel`]: registers a function as a CPU kernel handler under a name, so
//!   `runtime.launch("name", ..)` finds it; with `gpu`, also its CUDA and WGSL
//!   translations, so every runtime runs it.
//! * [`macro@gpu_kernel`]: a function in the Rust kernel subset of `ringkernel-codegen`
//!   becomes a kernel every backend launches (CPU: the Rust itself; CUDA and WGSL:
//!   translated at compile time).

#![warn(missing_docs)]

use proc_macro::TokenStream;
use syn::{parse_macro_input, DeriveInput, ItemFn};

mod gpu;
mod gpu_fn;
mod gpu_kernel;
mod kernel;
mod message;
mod paths;
mod plain;

/// Derives `RingMessage` for a struct: plain data when it is `#[repr(C)]`, an rkyv
/// archive (variable size) otherwise.
///
/// Always: `#[message(type_id = N)]`, the stable `u32` written into every message
/// header (optionally `name = "..."`, default the type name), and no generic
/// parameters. Optionally one field of type `MessageId` marked `#[message(id)]`: it is
/// ignored on send (the runtime assigns the id) and set from the header's
/// `message_id` on receive (see `ringkernel_core::message::RingMessage`).
///
/// **`#[repr(C)]` (or `#[repr(transparent)]`): plain data.** The value's bytes are the
/// payload (no serialisation; GPU handlers can read it). `bytemuck::Zeroable + Pod`
/// are implemented; each requirement is checked at compile time with a clear error:
///
/// * every field `Pod` (integers, floats, arrays of them, other `Pod` structs);
/// * no padding: the size equals the sum of the field sizes (order fields largest
///   alignment first, or add explicit padding fields);
/// * `Clone + Copy`, which you derive yourself.
///
/// ```
/// use ringkernel_core::message::{Envelope, RingMessage};
/// use ringkernel_derive::RingMessage;
///
/// #[derive(Clone, Copy, Debug, PartialEq, RingMessage)]
/// #[message(type_id = 1)]
/// #[repr(C)]
/// struct Scale { id: u64, factor: f32, value: f32 }
///
/// assert_eq!(Scale::TYPE_ID, 1);
/// let m = Scale { id: 7, factor: 2.0, value: 21.0 };
/// assert_eq!(Envelope::new(&m).decode::<Scale>().unwrap(), m);
/// ```
///
/// **Any other struct: rkyv.** The payload is an rkyv 0.8 archive (header flag
/// `RKYV`), so fields may be `Vec`, `String`, `Option`, `Box`, maps and nested structs.
/// The derive makes the struct itself `rkyv::Archive + Serialize + Deserialize` (no
/// other derive needed); its archived form is `rkyv::Archived<TheStruct>`. A nested
/// struct of your own derives rkyv itself through the re-export:
/// `#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]` with
/// `#[rkyv(crate = ringkernel::rkyv)]` (`ringkernel_core::rkyv` without the facade),
/// or is itself a `#[derive(RingMessage)]` struct without `#[repr(C)]`.
///
/// ```
/// use ringkernel_core::message::{Envelope, MessageId, RingMessage};
/// use ringkernel_core::rkyv;
/// use ringkernel_derive::RingMessage;
///
/// #[derive(Debug, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
/// #[rkyv(crate = ringkernel_core::rkyv)]
/// struct Meta { source: String, scale: Option<f32> }
///
/// #[derive(Debug, PartialEq, RingMessage)]
/// #[message(type_id = 2)]
/// struct Batch { #[message(id)] id: MessageId, meta: Meta, data: Vec<f32> }
///
/// let b = Batch {
///     id: MessageId::default(),
///     meta: Meta { source: "sensor".into(), scale: Some(0.5) },
///     data: vec![1.0, 2.0],
/// };
/// let mut env = Envelope::new(&b);
/// env.header.message_id = 9; // what the runtime does on send
/// let back: Batch = env.decode().unwrap();
/// assert_eq!(back.id, MessageId(9));
/// assert_eq!((back.meta, back.data), (b.meta, b.data));
/// ```
#[proc_macro_derive(RingMessage, attributes(message))]
pub fn derive_ring_message(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    message::derive(input)
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

/// Derives `GpuType` for a struct of scalars and arrays that a WGSL shader reads from a
/// storage buffer, and writes its WGSL declaration into `GpuType::WGSL_STRUCT`.
///
/// Fields may be `u32`, `i32`, `f32`, `u64`/`i64` (WGSL `vec2<u32>`/`vec2<i32>`, low word
/// first) and arrays `[T; N]` of those with a literal `N`. `f64` is refused (WGSL has
/// none), as are `bool`, 8/16-bit integers and `usize`. Every field must sit at the
/// offset WGSL's alignment rules give it and the size must be WGSL's size (the end
/// rounded up to the largest member alignment), with no implicit padding; a violation
/// is a compile error naming the padding field to add. See `ringkernel_core::gpu_type`.
///
/// * With `#[repr(C)]` the Rust layout is checked against WGSL (`offset_of!`
///   assertions) and `bytemuck::Pod` is implemented with the same checks as
///   [`macro@RingMessage`] (unless the struct derives `RingMessage` too, which then
///   provides them): the value's bytes are its WGSL form.
/// * Without `repr` the derive does not depend on the Rust layout: it fixes the WGSL
///   offsets itself and `write_bytes`/`read_bytes` copy field by field, so the struct
///   need not be `Copy`.
///
/// ```
/// use ringkernel_core::gpu_type::GpuType;
/// use ringkernel_derive::GpuType;
///
/// #[derive(Clone, Copy, GpuType)]
/// #[repr(C)]
/// struct Particle { id: u64, pos: [f32; 3], mass: f32 }
///
/// assert_eq!(
///     Particle::WGSL_STRUCT,
///     "struct Particle {\n    id: vec2<u32>,\n    pos: array<f32, 3>,\n    mass: f32,\n}\n"
/// );
/// assert_eq!((Particle::SIZE, Particle::ALIGN), (24, 8));
///
/// #[derive(GpuType)]
/// struct Matrix4x4 { data: [f32; 16] }
///
/// assert_eq!((Matrix4x4::SIZE, Matrix4x4::ALIGN), (64, 4));
/// let bytes = Matrix4x4 { data: [2.0; 16] }.to_bytes();
/// assert_eq!(Matrix4x4::read_bytes(&bytes).unwrap().data, [2.0; 16]);
/// ```
///
/// A `GpuType` struct can be used in [`macro@gpu_kernel`] functions (parameters, locals,
/// fields, struct literals) and is the message and state type of
/// [`macro@ring_kernel`]`(gpu)` handlers. The derive also defines a hidden macro,
/// `__rk_gpu_type_<Name>`, that hands the struct's fields to those attributes; Rust makes
/// it visible only below the struct, so define the struct above the functions that use
/// it, in the same module (else: "cannot find macro `__rk_gpu_type_<Name>`").
#[proc_macro_derive(GpuType)]
pub fn derive_gpu_type(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    gpu::derive(input)
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

/// Registers a function as a CPU kernel handler under a name (default: the function's
/// name), so that `runtime.launch("name", ..)` on the CPU backend finds it.
///
/// The function keeps working as a normal function. Its signature is one of
///
/// * `fn f(ctx: &mut KernelContext<'_>, msg: Req) -> Out`
/// * `fn f(ctx: &mut KernelContext<'_>, state: &mut S, msg: Req) -> Out`, where
///   `S: Default + Send + 'static` is the kernel's state (one per launched kernel,
///   starting at `S::default()`),
///
/// with `Req: RingMessage` and `Out` one of `()`, `Option<Resp>` (a reply) or
/// `Result<...>` of those (an `Err` drops the message, counted and logged).
///
/// For an rkyv message (a `RingMessage` struct without `#[repr(C)]`) the message
/// parameter may also be `msg: &Archived<M>` (`rkyv::Archived`, written with that
/// name): the handler then reads the archived form in place, validated but not
/// deserialised (`registry::archived_fn`, or `registry::stateful_archived_fn` with a
/// state argument).
///
/// ```
/// use ringkernel_core::context::KernelContext;
/// use ringkernel_core::registry::KernelRegistry;
/// use ringkernel_derive::{ring_kernel, RingMessage};
///
/// #[derive(Clone, Copy, RingMessage)]
/// #[message(type_id = 10)]
/// #[repr(C)]
/// struct Scale { id: u64, factor: f32, value: f32 }
///
/// #[derive(Clone, Copy, RingMessage)]
/// #[message(type_id = 11)]
/// #[repr(C)]
/// struct Scaled { id: u64, value: f32, calls: u32 }
///
/// #[ring_kernel(name = "scale")]
/// fn scale(_ctx: &mut KernelContext<'_>, calls: &mut u32, m: Scale) -> Option<Scaled> {
///     *calls += 1;
///     Some(Scaled { id: m.id, value: m.value * m.factor, calls: *calls })
/// }
///
/// // `CpuRuntime::launch("scale", ..)` finds it through any registry:
/// assert!(KernelRegistry::new().cpu("scale").is_ok());
/// ```
///
/// **On GPUs too: `#[ring_kernel(name = "...", gpu)]`.** A handler written in the kernel
/// subset of `ringkernel-codegen` is also translated at compile time to the CUDA handler
/// of the persistent kernel and to the WGSL handler of the drain template (wgpu and
/// Metal), registered as the GPU handler of the same name: every runtime then runs the
/// same Rust function (`runtime.launch("name", ..)` on CPU, CUDA, wgpu or Metal). Its
/// messages are `#[repr(C)]` structs that derive `RingMessage` and [`macro@GpuType`]
/// (defined above the handler in the same module), the state a `GpuType` struct (or a
/// `u32`, `i32`, `f32`) whose `Default` is all zeros (a GPU starts it zeroed; otherwise
/// the GPU registration reports it), the result `()` or `Option<Reply>`. In the body:
/// `ctx.send_to(KernelId(dest), &msg)` as a statement (a K2K send), `ctx.kernel_id().0`,
/// `*state` and `state.field`; see `ringkernel_codegen::transpile_handler` for the whole
/// subset and where the GPUs differ (a full K2K destination is waited for; wgpu and Metal
/// carry one output per message). A construct outside the subset is a compile error at
/// its span; without `gpu` the handler is CPU-only, as before. The registration calls
/// into `ringkernel-codegen`, so the crate depends on it or on the `ringkernel` facade.
///
/// ```
/// use ringkernel_core::context::KernelContext;
/// use ringkernel_core::registry::KernelRegistry;
/// use ringkernel_derive::{ring_kernel, GpuType, RingMessage};
///
/// #[derive(Clone, Copy, Default, RingMessage, GpuType)]
/// #[message(type_id = 20)]
/// #[repr(C)]
/// struct Reading { id: u64, value: f32, _pad: u32 }
///
/// #[derive(Clone, Copy, Default, GpuType)]
/// #[repr(C)]
/// struct Peak { max: f32, seen: u32 }
///
/// #[ring_kernel(name = "peak", gpu)]
/// fn peak(_ctx: &mut KernelContext<'_>, p: &mut Peak, r: Reading) -> Option<Reading> {
///     p.seen += 1;
///     if p.seen == 1 || r.value > p.max {
///         p.max = r.value;
///         return Some(r); // a new peak
///     }
///     None
/// }
///
/// let gpu = KernelRegistry::new().gpu("peak").unwrap();
/// assert!(gpu.cuda.unwrap().contains("__device__ int handle("));
/// assert!(gpu.wgsl.unwrap().contains("fn handle(ctx: ptr<function, RkContext>"));
/// ```
#[proc_macro_attribute]
pub fn ring_kernel(attr: TokenStream, item: TokenStream) -> TokenStream {
    let item = parse_macro_input!(item as ItemFn);
    let attr: proc_macro2::TokenStream = attr.into();
    let gpu_only = attr.to_string().contains("__rk_gpu_only");
    match kernel::expand(attr, item.clone()) {
        Err(e) if gpu_only => e.into_compile_error().into(),
        Ok(t) => t.into(),
        // Keep the function itself, so the error is the only one.
        Err(e) => {
            let mut t = e.into_compile_error();
            t.extend(quote::quote!(#item));
            t.into()
        }
    }
}

/// Turns a function in the kernel subset of `ringkernel-codegen` into a kernel that
/// `Device::launch` runs on any backend. The function stays as written (the CPU runs it
/// through `dsl::launch`); next to it comes a const named like the function in upper
/// case, a `GpuKernel` with the parameters, the CUDA C and the WGSL, translated at
/// compile time: a construct outside the subset is a compile error at its span.
///
/// A stencil kernel takes one `GridPos` (or `GridPos3`) parameter and names its halo
/// width: `#[gpu_kernel(halo = 1)]`; `Device::launch_stencil` runs it over a grid.
///
/// The function's parameters are scalars (`f32`, `f64`, `i32`, `u32`, `bool`),
/// slices (`&[T]`, `&mut [T]` of `f32`, `f64`, `i32`, `u32`) and `#[repr(C)]` structs
/// that derive [`macro@GpuType`] (by value, `&[S]`, `&mut [S]`; pass them with
/// `KernelArg::value`, `KernelArg::structs`, `KernelArg::structs_mut`); a kernel with an
/// `f64` has no WGSL form and runs on the CPU and CUDA only. The body uses the index functions
/// of `dsl` (bring them in with `use ringkernel_codegen::dsl::*`, or
/// `ringkernel::codegen::dsl::*` through the facade).
///
/// ```
/// use ringkernel_codegen::dsl::*;
/// use ringkernel_derive::gpu_kernel;
///
/// #[gpu_kernel]
/// fn saxpy(a: f32, x: &[f32], y: &mut [f32], n: i32) {
///     let i = block_idx_x() * block_dim_x() + thread_idx_x();
///     if i < n {
///         y[i as usize] = a * x[i as usize] + y[i as usize];
///     }
/// }
///
/// assert_eq!(SAXPY.name, "saxpy");
/// assert!(SAXPY.cuda_source.contains("__global__ void saxpy("));
/// assert!(SAXPY.wgsl_source.unwrap().contains("fn saxpy("));
///
/// // The CPU entry point runs the Rust function over a grid:
/// let x = vec![1.0f32; 100];
/// let mut y = vec![2.0f32; 100];
/// (SAXPY.cpu)([2, 1, 1], [64, 1, 1], &mut ringkernel_codegen::args![3.0f32, &x, &mut y, 100])
///     .unwrap();
/// assert!(y.iter().all(|&v| v == 5.0));
/// ```
#[proc_macro_attribute]
pub fn gpu_kernel(attr: TokenStream, item: TokenStream) -> TokenStream {
    let item = parse_macro_input!(item as ItemFn);
    match gpu_kernel::expand(attr.into(), item.clone()) {
        Ok(t) => t.into(),
        // Keep the function itself, so the error is the only one (no "cannot find
        // function" at its callers).
        Err(e) => {
            let mut t = e.into_compile_error();
            t.extend(quote::quote!(#item));
            t.into()
        }
    }
}

/// A helper function that `#[gpu_kernel]` functions may call: the kernels below it in the
/// same module translate it with themselves (a CUDA `__device__` function, a WGSL
/// function). It takes scalar parameters and returns a scalar, in the subset of
/// `ringkernel-codegen`, and may call other `#[gpu_fn]` helpers defined before the
/// kernel (no recursion). The function itself stays ordinary Rust (the CPU calls it).
///
/// Define helpers above the kernels that call them (the kernel finds each helper through
/// a macro the helper defines, which Rust makes visible only below the helper; a call of
/// a function without `#[gpu_fn]` fails with "cannot find macro `__rk_gpu_fn_<name>`").
/// Helpers can also be written inside the kernel's body, at its top level.
///
/// ```
/// use ringkernel_codegen::dsl::*;
/// use ringkernel_derive::{gpu_fn, gpu_kernel};
///
/// #[gpu_fn]
/// fn softplus(v: f32) -> f32 {
///     if v > 20.0 {
///         return v;
///     }
///     (1.0 + v.exp()).ln()
/// }
///
/// #[gpu_kernel]
/// fn activate(x: &mut [f32], n: i32) {
///     let i = block_idx_x() * block_dim_x() + thread_idx_x();
///     if i < n {
///         x[i as usize] = softplus(x[i as usize]);
///     }
/// }
///
/// assert!(ACTIVATE.cuda_source.contains("__device__ float rk_fn_softplus(float v)"));
/// assert!(ACTIVATE.wgsl_source.unwrap().contains("fn rk_fn_softplus(v: f32) -> f32"));
/// let mut x = vec![0.0f32, 30.0];
/// (ACTIVATE.cpu)([1, 1, 1], [2, 1, 1], &mut ringkernel_codegen::args![&mut x, 2]).unwrap();
/// assert_eq!(x, [2.0f32.ln(), 30.0]);
/// ```
#[proc_macro_attribute]
pub fn gpu_fn(attr: TokenStream, item: TokenStream) -> TokenStream {
    let item = parse_macro_input!(item as ItemFn);
    match gpu_fn::expand(attr.into(), item.clone()) {
        Ok(t) => t.into(),
        Err(e) => {
            let mut t = e.into_compile_error();
            t.extend(quote::quote!(#item));
            t.into()
        }
    }
}
