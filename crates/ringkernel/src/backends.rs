//! One constructor and one probe per backend: the only place that names the backend
//! crates. Everything else in the facade goes through `Arc<dyn RingKernelRuntime>` and
//! `Arc<dyn ComputeBackend>` (generated kernels through the concrete compute backends a
//! `Native` carries).
//!
//! The CPU backend is always compiled in; CUDA, WebGPU and Metal each come with a cargo
//! feature of this crate (`cuda`, `wgpu`, `metal`; `full` for all three). A backend left
//! out answers every request with [`Error::BackendUnavailable`] whose reason is
//! [`not_compiled_reason`]: "not compiled in: enable feature `cuda` …".

use crate::core::compute::ComputeBackend;
use crate::core::registry::KernelRegistry;
use crate::core::runtime::RingKernelRuntime;
use crate::{BackendKind, Error, Result};
use std::sync::Arc;

/// A runtime behind the object-safe trait.
pub(crate) type DynRuntime = Arc<dyn RingKernelRuntime>;

/// A compute backend behind the object-safe trait.
pub(crate) type DynCompute = Arc<dyn ComputeBackend>;

/// Whether the wgpu backend may settle for a software adapter (Mesa lavapipe, WARP).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WgpuAdapter {
    /// Only a hardware adapter will do (what `Backend::Auto` asks for).
    HardwareOnly,
    /// The adapter `RINGKERNEL_WGPU_ADAPTER` names, by default the best hardware one
    /// else a software one (what an explicit `Backend::Wgpu` asks for).
    Any,
}

/// The cargo feature of the `ringkernel` crate that compiles `backend` in; `None` for
/// the CPU, which is always there.
///
/// ```
/// use ringkernel::{backend_feature, BackendKind};
/// assert_eq!(backend_feature(BackendKind::Cuda), Some("cuda"));
/// assert_eq!(backend_feature(BackendKind::Cpu), None);
/// ```
pub const fn backend_feature(backend: BackendKind) -> Option<&'static str> {
    match backend {
        BackendKind::Cpu => None,
        BackendKind::Cuda => Some("cuda"),
        BackendKind::Wgpu => Some("wgpu"),
        BackendKind::Metal => Some("metal"),
    }
}

/// Whether `backend` was compiled into this build (its cargo feature is on). Being
/// compiled in says nothing about the machine: see [`probe_backend`](crate::probe_backend).
///
/// ```
/// use ringkernel::{backend_compiled_in, BackendKind};
/// assert!(backend_compiled_in(BackendKind::Cpu));
/// assert_eq!(backend_compiled_in(BackendKind::Wgpu), cfg!(feature = "wgpu"));
/// ```
pub const fn backend_compiled_in(backend: BackendKind) -> bool {
    match backend {
        BackendKind::Cpu => true,
        BackendKind::Cuda => cfg!(feature = "cuda"),
        BackendKind::Wgpu => cfg!(feature = "wgpu"),
        BackendKind::Metal => cfg!(feature = "metal"),
    }
}

/// The reason a backend left out of the build gives: "not compiled in: enable feature
/// `cuda` of the ringkernel crate" (etc.). Empty for a compiled-in backend.
pub(crate) fn not_compiled_reason(backend: BackendKind) -> String {
    match backend_feature(backend) {
        Some(f) if !backend_compiled_in(backend) => {
            format!("not compiled in: enable feature `{f}` of the ringkernel crate")
        }
        _ => String::new(),
    }
}

/// [`Error::BackendUnavailable`] for a backend left out of the build.
#[allow(dead_code)] // unused when every backend is compiled in
fn not_compiled(backend: BackendKind) -> Error {
    Error::unavailable(backend, not_compiled_reason(backend))
}

/// Starts the runtime of `backend` on `reg` (CUDA on GPU `cuda_device`).
pub(crate) async fn start(
    backend: BackendKind,
    reg: KernelRegistry,
    adapter: WgpuAdapter,
    cuda_device: usize,
) -> Result<DynRuntime> {
    let _ = (adapter, cuda_device); // only the wgpu and CUDA backends read them
    match backend {
        BackendKind::Cpu => Ok(Arc::new(
            ringkernel_cpu::CpuRuntime::with_registry(reg).await?,
        )),
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => Ok(Arc::new(
            ringkernel_cuda::CudaRuntime::on_device(reg, cuda_device).await?,
        )),
        #[cfg(feature = "wgpu")]
        BackendKind::Wgpu => {
            use ringkernel_wgpu::{AdapterSelection, WgpuRuntime};
            let rt = match adapter {
                WgpuAdapter::HardwareOnly => {
                    WgpuRuntime::with_selection(reg, AdapterSelection::Hardware)?
                }
                WgpuAdapter::Any => WgpuRuntime::with_registry(reg).await?,
            };
            Ok(Arc::new(rt))
        }
        #[cfg(feature = "metal")]
        BackendKind::Metal => Ok(Arc::new(
            ringkernel_metal::MetalRuntime::with_registry(reg).await?,
        )),
        #[allow(unreachable_patterns)] // every backend compiled in
        other => Err(not_compiled(other)),
    }
}

/// The CPU compute backend on rayon's global pool.
pub(crate) fn cpu_compute() -> DynCompute {
    Arc::new(ringkernel_cpu::CpuCompute::new())
}

/// The CPU compute backend on a dedicated pool of `threads` threads.
pub(crate) fn cpu_compute_with_threads(threads: usize) -> Result<DynCompute> {
    Ok(Arc::new(ringkernel_cpu::CpuCompute::with_threads(threads)?))
}

/// The wgpu compute backend: on a hardware adapter only for `Auto` (`hardware_only`),
/// which will not settle for a software one; else on the adapter that
/// `RINGKERNEL_WGPU_ADAPTER` picks (any when unset).
pub(crate) fn wgpu_compute(hardware_only: bool) -> Result<Native> {
    #[cfg(feature = "wgpu")]
    {
        let b = if hardware_only {
            ringkernel_wgpu::WgpuCompute::new_hardware()?
        } else {
            ringkernel_wgpu::WgpuCompute::new()?
        };
        Ok(Native::Wgpu(Arc::new(b)))
    }
    #[cfg(not(feature = "wgpu"))]
    {
        let _ = hardware_only;
        Err(not_compiled(BackendKind::Wgpu))
    }
}

/// The CUDA compute backend on device `ordinal`.
pub(crate) fn cuda_compute(ordinal: usize) -> Result<Native> {
    #[cfg(feature = "cuda")]
    {
        Ok(Native::Cuda(Arc::new(ringkernel_cuda::CudaCompute::new(
            ordinal,
        )?)))
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = ordinal;
        Err(not_compiled(BackendKind::Cuda))
    }
}

/// The Metal compute backend.
pub(crate) fn metal_compute() -> Result<Native> {
    #[cfg(feature = "metal")]
    {
        Ok(Native::Metal(Arc::new(
            ringkernel_metal::MetalCompute::new()?,
        )))
    }
    #[cfg(not(feature = "metal"))]
    {
        Err(not_compiled(BackendKind::Metal))
    }
}

/// What probing a compiled-in backend found: the device it would use, or why not.
pub(crate) type ProbeResult = std::result::Result<String, String>;

/// Probes a compiled-in `backend` without starting a runtime: the device it would use,
/// or why not, plus backend-specific details (the wgpu adapters seen). A backend left
/// out of the build gives [`not_compiled_reason`].
pub(crate) fn probe(backend: BackendKind) -> (ProbeResult, Vec<String>) {
    match backend {
        BackendKind::Cpu => (ringkernel_cpu::probe().map_err(reason), Vec::new()),
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => (ringkernel_cuda::probe().map_err(reason), Vec::new()),
        #[cfg(feature = "metal")]
        BackendKind::Metal => match ringkernel_metal::MetalCompute::new() {
            Ok(m) => (Ok(m.device().name()), Vec::new()),
            Err(e) => (Err(reason(e)), Vec::new()),
        },
        #[cfg(feature = "wgpu")]
        BackendKind::Wgpu => probe_wgpu(),
        #[allow(unreachable_patterns)] // every backend compiled in
        other => (Err(not_compiled_reason(other)), Vec::new()),
    }
}

/// The reason in an error, without the "backend … unavailable" wrapping.
pub(crate) fn reason(e: Error) -> String {
    match e {
        Error::BackendUnavailable { reason, .. } => reason,
        other => other.to_string(),
    }
}

#[cfg(feature = "wgpu")]
fn probe_wgpu() -> (ProbeResult, Vec<String>) {
    match ringkernel_wgpu::probe() {
        Err(e) => (Err(reason(e)), Vec::new()),
        Ok(list) if list.is_empty() => (
            Err(
                "no adapters were found (is a Vulkan driver installed? on Linux without a GPU: \
                 apt-get install mesa-vulkan-drivers libvulkan1)"
                    .to_string(),
            ),
            Vec::new(),
        ),
        Ok(list) => {
            let details = list
                .iter()
                .map(|a| {
                    format!(
                        "adapter: {a}{}",
                        if a.software { " [software]" } else { "" }
                    )
                })
                .collect();
            // Explicit `Backend::Wgpu` takes the best hardware adapter, else software.
            let best = list.iter().find(|a| !a.software).or_else(|| list.first());
            let device = match best {
                Some(a) if a.software => {
                    format!(
                        "{a}; a software adapter: Backend::Auto skips it, Backend::Wgpu uses it"
                    )
                }
                Some(a) => a.to_string(),
                None => String::new(),
            };
            (Ok(device), details)
        }
    }
}

/// The backend behind a [`Device`](crate::compute::Device) as its concrete type, for what the object-safe
/// [`ComputeBackend`] does not cover (running generated kernels).
#[derive(Clone)]
pub(crate) enum Native {
    /// The CPU.
    Cpu,
    /// wgpu.
    #[cfg(feature = "wgpu")]
    Wgpu(std::sync::Arc<ringkernel_wgpu::WgpuCompute>),
    /// CUDA.
    #[cfg(feature = "cuda")]
    Cuda(std::sync::Arc<ringkernel_cuda::CudaCompute>),
    /// Metal.
    #[cfg(feature = "metal")]
    Metal(std::sync::Arc<ringkernel_metal::MetalCompute>),
    /// A backend handed to
    /// [`Device::from_backend`](crate::compute::Device::from_backend): no generated
    /// kernels.
    Opaque,
}

impl Native {
    /// The backend behind the object-safe trait (`None` for [`Native::Cpu`] and
    /// [`Native::Opaque`], whose trait object the caller has).
    pub(crate) fn dyn_backend(&self) -> Option<std::sync::Arc<dyn ComputeBackend>> {
        match self {
            #[cfg(feature = "wgpu")]
            Native::Wgpu(b) => Some(b.clone()),
            #[cfg(feature = "cuda")]
            Native::Cuda(b) => Some(b.clone()),
            #[cfg(feature = "metal")]
            Native::Metal(b) => Some(b.clone()),
            Native::Cpu | Native::Opaque => None,
        }
    }
}
