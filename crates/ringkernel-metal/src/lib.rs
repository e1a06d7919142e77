//! # ringkernel-metal
//!
//! The native Apple Metal backend of RingKernel: tensor ops ([`MetalCompute`], a
//! [`ComputeBackend`](ringkernel_core::compute::ComputeBackend)) and event-driven actors
//! ([`MetalRuntime`], a [`RingKernelRuntime`](ringkernel_core::runtime::RingKernelRuntime)).
//!
//! ## What is verified, and where
//!
//! * **Compiles for Apple targets in CI**: `cargo check` and `cargo clippy` for
//!   `aarch64-apple-darwin` run on Linux (objc2 is plain Rust, so every Metal and MPS
//!   call is type-checked against the real framework bindings).
//! * **Shares its kernels with the tested WebGPU backend**: every kernel comes from
//!   `ringkernel-shaders` (WGSL, validated by naga, translated to MSL by naga — the
//!   translator wgpu itself uses on every Mac), and the WebGPU backend runs the same WGSL
//!   in CI on a software Vulkan adapter.
//! * **Shares its host logic with the WebGPU backend** through `ringkernel-drain`, where
//!   it is tested on Linux:
//!   - the MSL of every kernel the backend loads (each op's kernels with every
//!     specialisation, the drain pass of each built-in actor) has its `[[buffer(N)]]`
//!     parameters compared with what the host binds there ([`plan`], [`msl`]),
//!     including naga's buffer-sizes argument;
//!   - the dispatch plan of every op: entry point, parameter bytes, buffers, grid
//!     ([`plan`]);
//!   - the bounded buffer pool ([`pool`]) and threadgroup sizing ([`sizing`]);
//!   - the host side of the actor runtime ([`engine`]: queues in shared memory, drain
//!     scheduling, completion handling, lifecycle, K2K routing with backpressure) against
//!     a CPU stand-in for the GPU passes, including the cross-backend behavioural suite;
//! * **Tested here**: the `BackendUnavailable` path (`tests/unavailable.rs`).
//! * **Not executed by CI**: no Apple GPU is available to CI, so the objc2 glue (device,
//!   buffers, pipeline compilation, command encoding, MPS matmul, completion handlers)
//!   has never run in this project's tests. It is deliberately thin: it only turns the
//!   plans above into Metal calls.
//!
//! On every non-Apple target [`is_metal_available`] is `false` and
//! [`MetalRuntime::new`] / [`MetalCompute::new`] return
//! `BackendUnavailable`.
//!
//! ```
//! use ringkernel_metal::{is_metal_available, MetalCompute};
//! match MetalCompute::new() {
//!     Ok(m) => println!("Metal device: {}", m.device().name()),
//!     Err(e) => {
//!         assert!(!is_metal_available());
//!         println!("no Metal: {e}");
//!     }
//! }
//! ```

#![warn(missing_docs)]

pub mod compute;
pub mod halo;
pub mod runtime;
mod sys;

/// The platform-independent pieces Metal runs, shared with the WebGPU backend and
/// tested in CI: the drain host, the op plans, the buffer pool and threadgroup sizing.
pub use ringkernel_drain::{engine, msl, plan, pool, sizing};

pub use compute::{MetalCompute, MslPipeline};
pub use halo::{HaloExchangeConfig, MetalHaloExchange};
pub use runtime::MetalRuntime;
pub use sys::{MetalBuffer, MetalDevice};

use ringkernel_core::{BackendKind, Error, Result};

/// Whether a Metal device can be used: an Apple target with a system default device.
/// Always `false` elsewhere.
pub fn is_metal_available() -> bool {
    sys::MetalDevice::system_default().is_ok()
}

/// Why Metal cannot be used here, or `None` when it can.
pub fn unavailable_reason() -> Option<String> {
    match sys::MetalDevice::system_default() {
        Ok(_) => None,
        Err(Error::BackendUnavailable { reason, .. }) => Some(reason),
        Err(e) => Some(e.to_string()),
    }
}

pub(crate) fn unavailable(reason: impl Into<String>) -> Error {
    Error::unavailable(BackendKind::Metal, reason)
}

pub(crate) fn device_err(what: impl std::fmt::Display) -> Error {
    Error::Device(format!("metal: {what}"))
}

/// Opens the system default device (shared by [`MetalCompute::new`] and
/// [`MetalRuntime::new`]).
pub(crate) fn open_device() -> Result<std::sync::Arc<MetalDevice>> {
    MetalDevice::system_default().map(std::sync::Arc::new)
}
