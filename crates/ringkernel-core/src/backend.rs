//! Which backend a runtime or a compute device runs on.

use std::fmt;

/// One of the four RingKernel backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BackendKind {
    /// Threads on the host CPU; always available.
    Cpu,
    /// NVIDIA GPUs through the CUDA driver API.
    Cuda,
    /// WebGPU through `wgpu` (Vulkan, Metal, DX12 or a software adapter).
    Wgpu,
    /// Apple GPUs through Metal.
    Metal,
}

impl BackendKind {
    /// All backends, in the order `Auto` selection prefers them for compute
    /// (Metal > CUDA > wgpu > CPU).
    pub const ALL: [BackendKind; 4] = [
        BackendKind::Metal,
        BackendKind::Cuda,
        BackendKind::Wgpu,
        BackendKind::Cpu,
    ];

    /// Lower-case name, as accepted by `RINGKERNEL_BACKEND`.
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Cpu => "cpu",
            BackendKind::Cuda => "cuda",
            BackendKind::Wgpu => "wgpu",
            BackendKind::Metal => "metal",
        }
    }

    /// Parses a lower-case backend name (`cpu`, `cuda`, `wgpu`, `metal`).
    pub fn parse(s: &str) -> Option<BackendKind> {
        match s.trim().to_ascii_lowercase().as_str() {
            "cpu" => Some(BackendKind::Cpu),
            "cuda" => Some(BackendKind::Cuda),
            "wgpu" | "webgpu" => Some(BackendKind::Wgpu),
            "metal" => Some(BackendKind::Metal),
            _ => None,
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
