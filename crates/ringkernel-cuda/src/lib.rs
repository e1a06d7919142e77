//! # ringkernel-cuda
//!
//! The CUDA backend of RingKernel, on the CUDA driver API through `cudarc` with dynamic
//! loading: it builds without a CUDA toolkit, and on a machine without the NVIDIA
//! driver or a GPU every entry point returns
//! [`Error::BackendUnavailable`](ringkernel_core::Error::BackendUnavailable) with the
//! reason, never a panic.
//!
//! * [`CudaCompute`]: every [`ComputeBackend`](ringkernel_core::compute::ComputeBackend)
//!   op, as CUDA C kernels (`kernels/ops.cu`) compiled by NVRTC for the device's own
//!   architecture and cached on disk, with cuBLAS for matmul.
//! * [`CudaRuntime`]: persistent actors. Each launched kernel is a real persistent GPU
//!   kernel on its own stream, polling its queues in pinned, device-mapped host memory;
//!   kernels on one GPU message each other (K2K) through device-memory inboxes.
//!   The runtime registers the CUDA versions of the built-ins `rk.echo`, `rk.stage` and
//!   `rk.counter` itself ([`register_cuda_builtins`] does the same for a registry
//!   alone), and records handler latency on the device clock ([`metrics`]).
//!
//! * Several GPUs of one host: a runtime or a compute backend on any device
//!   ([`CudaRuntime::on_device`], [`CudaCompute::new`], [`device_count`]);
//!   [`CudaRuntimeGroup`] for kernels on different GPUs that message each other on the
//!   GPU over peer access ([`multi_gpu`]); [`NcclGroup`] for NCCL collectives
//!   (`all_reduce`, `all_gather`, `broadcast`, `send`) on the buffers of several
//!   [`CudaCompute`]s ([`nccl`]; libnccl is loaded at run time).
//!
//! ```no_run
//! match ringkernel_cuda::probe() {
//!     Ok(desc) => println!("CUDA: {desc}"),
//!     Err(e) => println!("no CUDA here: {e}"),
//! }
//! ```

#![warn(missing_docs)]

pub mod baseline;
pub mod compute;
mod driver;
pub mod layout;
pub mod metrics;
pub mod multi_gpu;
pub mod nccl;
pub mod nvrtc;
pub mod runtime;

pub use compute::{CudaArg, CudaBuffer, CudaCompute, CudaFunction, CudaGraph};
pub use driver::{
    driver_library_candidates, driver_library_present, DeviceInfo, DRIVER_LIBRARY_ENV,
};
pub use multi_gpu::{peer_link, CudaRuntimeGroup, PeerLink};
pub use nccl::{ensure_nccl, NcclGroup, Transfer};
pub use runtime::{
    check_launch_options, register_cuda_builtins, CudaRuntime, CudaStreamer, RoundProfile,
    TAKE_MARKS,
};

use ringkernel_core::Result;

/// Checks the driver and describes device 0: name, compute capability, driver
/// version, memory and multiprocessors. [`Error::BackendUnavailable`](ringkernel_core::Error::BackendUnavailable)
/// when there is no usable driver or GPU.
pub fn probe() -> Result<String> {
    probe_device(0)
}

/// As [`probe`], for device `ordinal`.
pub fn probe_device(ordinal: usize) -> Result<String> {
    let i = device_info(ordinal)?;
    Ok(format!(
        "{} (device {}, sm_{}{}, {} SMs, {:.1} GiB, driver {}.{})",
        i.name,
        i.ordinal,
        i.cc.0,
        i.cc.1,
        i.sm_count,
        i.total_mem as f64 / (1u64 << 30) as f64,
        i.driver_version / 1000,
        (i.driver_version % 1000) / 10
    ))
}

/// Facts about device `ordinal` (opens and releases its primary context).
pub fn device_info(ordinal: usize) -> Result<DeviceInfo> {
    driver::device_info(ordinal)
}

/// Number of CUDA devices; [`Error::BackendUnavailable`](ringkernel_core::Error::BackendUnavailable) without a driver.
pub fn device_count() -> Result<usize> {
    driver::ensure_driver()?;
    cudarc::driver::result::device::get_count()
        .map(|n| n.max(0) as usize)
        .map_err(|e| ringkernel_core::Error::Device(format!("cuDeviceGetCount: {e}")))
}
