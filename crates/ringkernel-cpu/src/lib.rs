//! # ringkernel-cpu
//!
//! The CPU backend of RingKernel (always available).
//!
//! * [`CpuRuntime`]: persistent actors. Each launched kernel is a dedicated, named OS
//!   thread that runs its registered [`CpuHandler`](ringkernel_core::registry::CpuHandler)
//!   on every message, with spin-then-park wake-ups.
//! * [`CpuCompute`]: the portable tensor ops on the CPU.

#![warn(missing_docs)]

pub mod compute;
pub mod runtime;
mod sched;

pub use compute::CpuCompute;
pub use runtime::{probe, CpuRuntime, SchedulerStats};
