//! # ringkernel-derive
//!
//! Procedural macros of RingKernel. Use them through the `ringkernel` facade (which
//! re-exports them) or next to a direct `ringkernel-core` dependency; the generated code
//! finds whichever of the two your crate depends on.
//!
//! * [`macro@RingMessage`]: a `#[repr(C)]` plain-data struct becomes a message with a
//!   stable type id (`#[message(type_id = N)]`), `bytemuck::Pod` checked at compile time.
//! * [`macro@GpuType`]: a plain-data struct whose layout is checked against WGSL's, with
//!   its WGSL declaration generated.
//! * [`macro@ring_kernel`]: registers a function as a CPU kernel handler under a name, so
//!   `runtime.launch("name", ..)` finds it.

#![warn(missing_docs)]

use proc_macro::TokenStream;
use syn::{parse_macro_input, DeriveInput, ItemFn};

mod gpu;
mod kernel;
mod message;
mod paths;
mod plain;

/// Derives `RingMessage` (and `bytemuck::Zeroable` + `bytemuck::Pod`) for a plain-data
/// struct.
///
/// Requirements, each checked at compile time with a clear error:
///
/// * `#[message(type_id = N)]`: the stable `u32` written into every message header
///   (optionally `name = "..."`, default the type name);
/// * `#[repr(C)]` (or `#[repr(transparent)]`), no generic parameters;
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
#[proc_macro_derive(RingMessage, attributes(message))]
pub fn derive_ring_message(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    message::derive(input)
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

/// Derives `GpuType` for a plain-data struct whose layout is the same in Rust and in a
/// WGSL storage buffer, and writes its WGSL declaration into `GpuType::WGSL_STRUCT`.
///
/// Fields may be `u32`, `i32`, `f32`, `u64`/`i64` (WGSL `vec2<u32>`/`vec2<i32>`, low word
/// first) and arrays `[T; N]` of those with a literal `N`. `f64` is refused (WGSL has
/// none), as are `bool`, 8/16-bit integers and `usize`. Every field must sit at the
/// offset WGSL's alignment rules give it, and the struct's size must be WGSL's size (the
/// end rounded up to the largest member alignment); both are compile-time assertions.
/// See `ringkernel_core::gpu_type` for the rules.
///
/// It also implements `bytemuck::Pod` with the same checks as
/// [`macro@RingMessage`], unless the struct derives `RingMessage` too (which then
/// provides them).
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
/// ```
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
#[proc_macro_attribute]
pub fn ring_kernel(attr: TokenStream, item: TokenStream) -> TokenStream {
    let item = parse_macro_input!(item as ItemFn);
    kernel::expand(attr.into(), item)
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}
