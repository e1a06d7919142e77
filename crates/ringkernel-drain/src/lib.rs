//! # ringkernel-drain
//!
//! The host logic of RingKernel's event-driven backends, written once. WebGPU and Metal
//! have no persistent kernels: a kernel's handler runs in *drain passes* dispatched
//! whenever messages wait, and every tensor op is a short sequence of dispatches of the
//! shared WGSL kernels (`ringkernel-shaders`). Everything about that which does not need
//! a GPU lives here, so that the WebGPU backend runs it in CI (on a software Vulkan
//! adapter) and the Metal backend runs the very same code on Apple GPUs:
//!
//! * [`engine`]: the drain host ([`DrainEngine`](engine::DrainEngine)): queues, pass
//!   scheduling, completion, lifecycle, K2K routing with backpressure, metrics. A backend
//!   implements only [`DrainTarget`](engine::DrainTarget): where the rings live and how
//!   to run one pass.
//! * [`shadow`]: host copies of the rings for a target without shared memory (wgpu).
//! * [`plan`]: the dispatch plan of every op (kernels, parameter bytes, bindings, grid).
//! * [`exec`]: running plans ([`PlanDevice`](exec::PlanDevice), [`planned_ops!`]), the
//!   compute-op host both backends share.
//! * [`pool`]: a bounded buffer pool, generic over the allocator.
//! * [`records`]: messages packed in reused byte chunks (the engine's lanes and replies).
//! * [`sizing`]: workgroup/threadgroup sizing and grid geometry.
//! * [`msl`]: a reader for naga's MSL entry points, so binding indices are checked
//!   without a Mac.

#![warn(missing_docs)]

pub mod engine;
pub mod exec;
pub mod msl;
pub mod plan;
pub mod pool;
pub mod records;
pub mod shadow;
pub mod sizing;
