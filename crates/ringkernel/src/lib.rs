//! # RingKernel
//!
//! Persistent GPU actors and portable compute ops on CPU, CUDA, WebGPU and Metal.
//! (Facade: being assembled.)

pub use ringkernel_core as core;
pub use ringkernel_core::{BackendKind, Error, Result};

pub mod compute;
