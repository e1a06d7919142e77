//! # ringkernel-core
//!
//! The backend-neutral heart of RingKernel. Everything that a host and a device both
//! touch is defined here once, as `#[repr(C)]` plain data with layout asserts:
//!
//! * [`message`]: the 64-byte [`MessageHeader`](message::MessageHeader), fixed-size slots
//!   and the [`RingMessage`](message::RingMessage) trait.
//! * [`queue`]: lock-free rings (typed SPSC and MPSC, and message-slot rings in the
//!   shared binary layout).
//! * [`control`]: the 128-byte [`ControlBlock`](control::ControlBlock).
//! * [`hlc`]: the hybrid logical clock.
//! * [`lifecycle`]: the kernel state machine.
//! * [`runtime`]: the [`RingKernelRuntime`](runtime::RingKernelRuntime) trait that every
//!   backend implements, [`KernelHandle`](runtime::KernelHandle) and the shared runtime
//!   machinery ([`RuntimeCore`](runtime::RuntimeCore)).
//! * [`k2k`], [`pubsub`], [`telemetry`]: kernel-to-kernel messaging and routing tables,
//!   MQTT-style topics, counters and latency histograms.
//! * [`halo`]: halo exchange for 2-D/3-D tile grids (the copy plan every backend runs).
//! * [`compute`]: the [`ComputeBackend`](compute::ComputeBackend) trait for tensor ops.

#![warn(missing_docs)]

pub mod backend;
pub mod builtin;
pub mod compute;
#[cfg(any(test, feature = "testkit"))]
pub mod conformance;
pub mod context;
pub mod control;
pub mod error;
pub mod gpu_type;
pub mod halo;
pub mod hlc;
pub mod ids;
pub mod k2k;
pub mod lifecycle;
pub mod message;
pub mod options;
pub mod priority;
pub mod pubsub;
pub mod queue;
pub mod registry;
pub mod runtime;
mod state;
mod sync;
pub mod telemetry;
pub mod timer;
pub mod util;

pub use backend::BackendKind;
pub use error::{Error, Result};
/// rkyv 0.8 (the archive format of variable-size messages), for deriving it on structs
/// nested in a message: `#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]`
/// with `#[rkyv(crate = ringkernel_core::rkyv)]`.
pub use rkyv;

/// Re-exports for generated code (`#[derive(RingMessage)]`, `#[ring_kernel]`). Not a
/// public API: may change without notice.
#[doc(hidden)]
pub mod __private {
    pub use bytemuck;
    pub use inventory;
}

/// The items most programs need.
pub mod prelude {
    pub use crate::backend::BackendKind;
    pub use crate::context::KernelContext;
    pub use crate::error::{Error, Result};
    pub use crate::hlc::{HlcClock, HlcTimestamp};
    pub use crate::ids::KernelId;
    pub use crate::k2k::{K2kReceipt, KernelTarget};
    pub use crate::lifecycle::LifecycleState;
    pub use crate::message::{Envelope, MessageHeader, MessageId, RingMessage};
    pub use crate::options::LaunchOptions;
    pub use crate::runtime::{KernelHandle, RingKernelRuntime};
}
