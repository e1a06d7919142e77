//! # RingKernel
//!
//! Persistent GPU actors and portable compute ops on CPU, CUDA, WebGPU and Metal.
//!
//! * **Actors.** A *kernel* is a named, long-lived actor with its own state and
//!   lock-free input and output queues. On CUDA it is a persistent GPU kernel; on
//!   WebGPU and Metal the host dispatches a drain pass whenever messages wait; on the CPU
//!   it is a task on a pool of worker threads. Start a runtime with
//!   [`RingKernel::builder`], launch kernels by handler name, and talk to them through
//!   [`KernelHandle`]s: `send`, `receive`,
//!   correlated `call`, lifecycle, metrics. Kernels talk to each other (K2K) and through
//!   MQTT-style topics, all stamped with a hybrid logical clock.
//! * **Compute.** [`compute`] holds the tensor-op library on the same backends.
//!
//! ```
//! use ringkernel::prelude::*;
//! use std::time::Duration;
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let rt = RingKernel::builder().backend(Backend::Auto).build().await?; // CPU if no GPU
//! let echo = rt.launch(builtin::ECHO, LaunchOptions::default()).await?;
//! let reply: Token = echo.call(Token::new(7, 1.5), Duration::from_secs(5)).await?;
//! assert_eq!((reply.id, reply.value, reply.hops), (7, 3.0, 1));
//! rt.shutdown().await?;
//! # Ok::<(), ringkernel::Error>(())
//! # }).unwrap();
//! ```
//!
//! ## Cargo features: one per GPU backend
//!
//! The CPU backend is always built. Each GPU backend is a feature, off by default, so a
//! CPU-only build compiles no GPU stack (no wgpu, naga or cudarc):
//!
//! | Feature | Backend | Brings in |
//! |---|---|---|
//! | (none) | CPU | `ringkernel-cpu` |
//! | `cuda` | CUDA ([`Backend::Cuda`]) | `ringkernel-cuda`, cudarc (driver and NVRTC loaded at run time) |
//! | `wgpu` | WebGPU ([`Backend::Wgpu`]) | `ringkernel-wgpu`, wgpu, naga |
//! | `metal` | Metal ([`Backend::Metal`]) | `ringkernel-metal` (Apple targets; unavailable elsewhere) |
//! | `full` | all three | |
//!
//! A backend left out of the build can still be named: the runtime builder,
//! [`compute::Device`] and `RINGKERNEL_BACKEND` answer with
//! [`Error::BackendUnavailable`] whose reason reads "not compiled in: enable feature
//! `cuda` of the ringkernel crate" (etc.), [`probe_backend`] says
//! [`Availability::NotCompiledIn`], and [`Backend::Auto`] passes over it with that
//! reason in [`Selection::skipped`]. [`backend_compiled_in`] tells in advance.
//!
//! ```
//! use ringkernel::{backend_compiled_in, Backend, BackendKind, RingKernel};
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! if !backend_compiled_in(BackendKind::Cuda) {
//!     let err = RingKernel::builder().backend(Backend::Cuda).build().await.unwrap_err();
//!     assert!(err.to_string().contains("not compiled in: enable feature `cuda`"));
//! }
//! # });
//! ```
//!
//! The backend crates (`ringkernel-cpu`, `-cuda`, `-wgpu`, `-metal`) and the
//! backend-neutral core ([`core`]) can be used directly; this crate ties them together.
//! The backend runtimes are re-exported ([`CpuRuntime`], and `WgpuRuntime`,
//! `CudaRuntime`, `MetalRuntime` with their features): `CpuRuntime::new().await?`
//! starts one on the process-wide handler registry, and the [`RingKernelRuntime`] trait
//! (in the prelude) gives it `launch`, `k2k_broker` and `pubsub`:
//!
//! ```
//! use ringkernel::prelude::*;
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let runtime = CpuRuntime::new().await?;
//! let a = runtime.launch(builtin::ECHO, LaunchOptions::default().with_name("a")).await?;
//! let b = runtime.launch(builtin::ECHO, LaunchOptions::default().with_name("b")).await?;
//! let broker = runtime.k2k_broker().unwrap();
//! let receipt = broker.send(a.id(), b.id(), Envelope::new(&Token::new(1, 2.0))).await?;
//! assert_eq!(receipt, K2kReceipt::Delivered);
//! runtime.shutdown().await?;
//! # Ok::<(), ringkernel::Error>(())
//! # }).unwrap();
//! ```
//!
//! `docs/SEEDS.md` in the repository lists every example of the documents RingKernel
//! was specified from, with the test that runs it.

#![warn(missing_docs)]

mod backends;
mod builder;
mod info;
mod runtime;
mod selection;

pub mod compute;

pub use ringkernel_core as core;
/// rkyv, the zero-copy serialisation behind variable-size messages: derive its traits
/// through this path on structs nested inside a `#[derive(RingMessage)]` message.
pub use ringkernel_core::rkyv;
pub use ringkernel_core::{BackendKind, Error, Result};

pub use backends::{backend_compiled_in, backend_feature};
pub use builder::RingKernelBuilder;
pub use info::{probe_backend, probe_backends, Availability, BackendProbe};
pub use runtime::RingKernel;
pub use selection::{Backend, Selection, Skipped, BACKEND_ENV};

pub use ringkernel_derive::{gpu_fn, gpu_kernel, ring_kernel, GpuType, RingMessage};

/// The Rust-to-CUDA C/WGSL translator behind [`gpu_kernel`]: its `dsl` (the index
/// functions a kernel body calls), the translation functions and the launch types.
pub use ringkernel_codegen as codegen;
/// Launch arguments by position: `args![2.0f32, &x, &mut y, n]` (see
/// [`Device::launch`](compute::Device::launch)).
pub use ringkernel_codegen::args;

pub use ringkernel_core::builtin;
pub use ringkernel_core::context::KernelContext;
pub use ringkernel_core::options::LaunchOptions;
pub use ringkernel_core::priority;
pub use ringkernel_core::runtime::{KernelHandle, KernelId, RingKernelRuntime};

/// The backend runtimes, usable directly (`CpuRuntime::new().await?`) beside the
/// [`RingKernel`] facade. Their `new()` resolves handler names through
/// [`KernelRegistry::global`](crate::core::registry::KernelRegistry::global), their
/// `with_registry(..)` through the registry given.
pub use ringkernel_cpu::CpuRuntime;
#[cfg(feature = "cuda")]
pub use ringkernel_cuda::CudaRuntime;
/// Persistent-kernel runtimes on several GPUs whose kernels message each other on the
/// GPU (feature `cuda`; see `ringkernel_cuda::multi_gpu`).
#[cfg(feature = "cuda")]
pub use ringkernel_cuda::CudaRuntimeGroup;
#[cfg(feature = "metal")]
pub use ringkernel_metal::MetalRuntime;
#[cfg(feature = "wgpu")]
pub use ringkernel_wgpu::WgpuRuntime;
/// Topics and K2K across processes and hosts through Zenoh (the `ringkernel-zenoh`
/// crate; feature `zenoh`, not in the default build nor in `full`).
#[cfg(feature = "zenoh")]
pub use ringkernel_zenoh as zenoh;

/// The README's example, compiled and run as a doctest so it cannot go stale.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeExample;

/// Everything most programs need: `use ringkernel::prelude::*;`.
///
/// It names everything the examples of the seed README use without a path: the
/// facade ([`RingKernel`], [`Backend`](crate::Backend)), the backend runtimes
/// ([`CpuRuntime`], and the GPU ones whose feature is on) with the
/// [`RingKernelRuntime`] trait that gives them `launch`, `shutdown`, `k2k_broker` and
/// `pubsub`, the [`priority`](crate::priority) levels, messages, clocks, K2K and
/// pub/sub types.
pub mod prelude {
    pub use crate::builder::RingKernelBuilder;
    pub use crate::compute::{Device, GpuKernel, KernelArg, KvCache, Tensor};
    pub use crate::runtime::RingKernel;
    pub use crate::selection::{Backend, Selection};
    pub use ringkernel_codegen::args;
    pub use ringkernel_core::backend::BackendKind;
    pub use ringkernel_core::builtin::{self, Token};
    pub use ringkernel_core::context::KernelContext;
    pub use ringkernel_core::error::{Error, Result};
    pub use ringkernel_core::gpu_type::GpuType;
    pub use ringkernel_core::hlc::{HlcClock, HlcTimestamp};
    pub use ringkernel_core::k2k::{K2kBroker, K2kReceipt, KernelTarget};
    pub use ringkernel_core::lifecycle::LifecycleState;
    pub use ringkernel_core::message::{Envelope, MessageHeader, MessageId, RingMessage};
    pub use ringkernel_core::options::LaunchOptions;
    pub use ringkernel_core::priority;
    pub use ringkernel_core::pubsub::{
        PubSubBroker, PubSubConfig, Publication, SubscriptionId, Topic,
    };
    pub use ringkernel_core::registry::{GpuHandler, KernelRegistry};
    pub use ringkernel_core::runtime::{
        KernelHandle, KernelId, PublishReport, RingKernelRuntime, RuntimeExt,
    };
    pub use ringkernel_core::telemetry::{KernelMetrics, LatencySummary, RuntimeMetrics};
    pub use ringkernel_cpu::CpuRuntime;
    #[cfg(feature = "cuda")]
    pub use ringkernel_cuda::CudaRuntime;
    pub use ringkernel_derive::{gpu_fn, gpu_kernel, ring_kernel, GpuType, RingMessage};
    #[cfg(feature = "metal")]
    pub use ringkernel_metal::MetalRuntime;
    #[cfg(feature = "wgpu")]
    pub use ringkernel_wgpu::WgpuRuntime;
}
