//! Portable tensor ops: a [`Device`] (CPU, CUDA, WebGPU or Metal, chosen by
//! [`Device::auto`] or explicitly), [`Tensor`]s (f32, with f16/bf16 storage and u32 ids)
//! that stay on it between ops, weight matrices in block formats ([`QuantMatrix`]: f32,
//! Q4_1, Q8_0) and a [`KvCache`] for decoding.
//!
//! ```
//! use ringkernel::compute::{Device, Tensor};
//!
//! let dev = Device::cpu(); // or Device::auto()? for the best validated GPU
//! let x = Tensor::from_slice(&dev, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
//! let w = Tensor::from_slice(&dev, &[1.0, 1.0, 1.0], &[3])?;
//! let y = x.rms_norm(&w, 1e-6)?.softmax()?;
//! let row_sums = y.sum_axis(1)?.to_vec()?;
//! assert!(row_sums.iter().all(|s| (s - 1.0).abs() < 1e-6));
//! # Ok::<(), ringkernel::Error>(())
//! ```
//!
//! Every op of the backend trait ([`ComputeBackend`]) has a method on [`Tensor`] that
//! checks shapes and devices first ([`Error::ShapeMismatch`](crate::Error::ShapeMismatch),
//! [`Error::Device`](crate::Error::Device)). The f64 reference implementations the
//! backends are tested against are in [`reference`](mod@reference); the op test kit every backend
//! runs is `ringkernel_core::compute::testkit` (feature `testkit` of ringkernel-core).
//!
//! Kernels of your own, written once in Rust with [`gpu_kernel`](crate::gpu_kernel),
//! run on every device through [`Device::launch`] (see its example).
//!
//! Several GPUs: [`Device::cuda`] opens any CUDA GPU by ordinal (`Device::from_name("cuda:1")`
//! too), and [`Collectives`] runs NCCL collectives on tensors of several of them.

mod collective;
mod device;
mod kv_cache;
mod launch;
mod quant;
mod tensor;

pub use collective::Collectives;
pub use device::Device;
pub use kv_cache::{KvCache, KvView};
pub use launch::LaunchInfo;
pub use quant::QuantMatrix;
pub use ringkernel_codegen::launch::{GpuKernel, KernelArg};
pub use tensor::Tensor;

pub use ringkernel_core::compute::{
    decoder, reference, AttentionDims, BinaryOp, BlockWeights, BroadcastDims, BufferRef,
    ComputeBackend, DType, DecoderDims, DecoderLayer, DecoderScratch, DecoderScratchBuffers,
    DeviceBuffer, EmbeddingDims, GreedyFeed, KvDims, MatmulDims, QMatmulDims, ReduceDims, ReduceOp,
    Replay, RopeDims, UnaryOp, WeightFormat,
};
