//! One constructor and one probe per backend: the only place that names the backend
//! crates' runtime types. Everything else in the facade goes through
//! `Arc<dyn RingKernelRuntime>`.

use crate::core::registry::KernelRegistry;
use crate::core::runtime::RingKernelRuntime;
use crate::{BackendKind, Error, Result};
use std::sync::Arc;

/// A runtime behind the object-safe trait.
pub(crate) type DynRuntime = Arc<dyn RingKernelRuntime>;

/// Whether the wgpu backend may settle for a software adapter (Mesa lavapipe, WARP).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WgpuAdapter {
    /// Only a hardware adapter will do (what `Backend::Auto` asks for).
    HardwareOnly,
    /// The adapter `RINGKERNEL_WGPU_ADAPTER` names, by default the best hardware one
    /// else a software one (what an explicit `Backend::Wgpu` asks for).
    Any,
}

/// Registers the GPU versions of the built-in kernels that `backend` runs.
pub(crate) fn register_gpu_builtins(backend: BackendKind, reg: &KernelRegistry) {
    match backend {
        BackendKind::Cpu => {}
        BackendKind::Wgpu => ringkernel_wgpu::register_wgsl_builtins(reg),
        BackendKind::Metal => ringkernel_metal::runtime::register_builtins(reg),
        BackendKind::Cuda => ringkernel_cuda::register_cuda_builtins(reg),
    }
}

/// Starts the runtime of `backend` on `reg`.
pub(crate) async fn start(
    backend: BackendKind,
    reg: KernelRegistry,
    adapter: WgpuAdapter,
) -> Result<DynRuntime> {
    match backend {
        BackendKind::Cpu => Ok(Arc::new(ringkernel_cpu::CpuRuntime::new(reg).await?)),
        BackendKind::Cuda => Ok(Arc::new(ringkernel_cuda::CudaRuntime::new(reg).await?)),
        BackendKind::Wgpu => wgpu(reg, adapter).await,
        BackendKind::Metal => Ok(Arc::new(ringkernel_metal::MetalRuntime::new(reg).await?)),
    }
}

async fn wgpu(reg: KernelRegistry, adapter: WgpuAdapter) -> Result<DynRuntime> {
    use ringkernel_wgpu::{AdapterSelection, WgpuRuntime};
    let rt = match adapter {
        WgpuAdapter::HardwareOnly => WgpuRuntime::with_selection(reg, AdapterSelection::Hardware)?,
        WgpuAdapter::Any => WgpuRuntime::new(reg).await?,
    };
    Ok(Arc::new(rt))
}

/// Probes `backend` without starting a runtime: the device it would use, or why not,
/// plus backend-specific details (the wgpu adapters seen).
pub(crate) fn probe(backend: BackendKind) -> (std::result::Result<String, String>, Vec<String>) {
    let reason = |e: Error| match e {
        Error::BackendUnavailable { reason, .. } => reason,
        other => other.to_string(),
    };
    match backend {
        BackendKind::Cpu => (ringkernel_cpu::probe().map_err(reason), Vec::new()),
        BackendKind::Cuda => (ringkernel_cuda::probe().map_err(reason), Vec::new()),
        BackendKind::Metal => match ringkernel_metal::MetalCompute::new() {
            Ok(m) => (Ok(m.device().name()), Vec::new()),
            Err(e) => (Err(reason(e)), Vec::new()),
        },
        BackendKind::Wgpu => match ringkernel_wgpu::probe() {
            Err(e) => (Err(reason(e)), Vec::new()),
            Ok(list) if list.is_empty() => (
                Err("no adapters were found (is a Vulkan driver installed? on Linux without a GPU: \
                     apt-get install mesa-vulkan-drivers libvulkan1)"
                    .to_string()),
                Vec::new(),
            ),
            Ok(list) => {
                let details = list
                    .iter()
                    .map(|a| format!("adapter: {a}{}", if a.software { " [software]" } else { "" }))
                    .collect();
                // Explicit `Backend::Wgpu` takes the best hardware adapter, else software.
                let best = list.iter().find(|a| !a.software).or_else(|| list.first());
                let device = match best {
                    Some(a) if a.software => {
                        format!("{a}; a software adapter: Backend::Auto skips it, Backend::Wgpu uses it")
                    }
                    Some(a) => a.to_string(),
                    None => String::new(),
                };
                (Ok(device), details)
            }
        },
    }
}
