//! # ringkernel-cpu
//!
//! The CPU backend of RingKernel (always available).
//!
//! * [`CpuRuntime`]: persistent actors. Launched kernels are tasks on a pool of worker
//!   threads (one per core, work stealing, bounded turns), each running its registered
//!   [`CpuHandler`](ringkernel_core::registry::CpuHandler) on every message; a kernel
//!   may ask for a dedicated thread instead. `DESIGN.md` beside this crate's manifest
//!   says why the scheduler is built the way it is.
//! * [`CpuCompute`]: the portable tensor ops on the CPU.

#![warn(missing_docs)]

pub mod compute;
pub mod runtime;
mod sched;

pub use compute::CpuCompute;
pub use runtime::{probe, CpuRuntime, SchedulerStats};
