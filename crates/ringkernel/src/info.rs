//! What each backend would run on, without starting anything: [`probe_backends`].

use crate::backends;
use crate::BackendKind;
use std::fmt;

/// Whether a backend can be used here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Availability {
    /// Usable, on this device.
    Available {
        /// The device it would use.
        device: String,
    },
    /// Not usable here.
    Unavailable {
        /// Why, in words a user can act on.
        reason: String,
    },
}

/// The result of probing one backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendProbe {
    /// The backend.
    pub backend: BackendKind,
    /// Available (and on what) or not (and why).
    pub availability: Availability,
    /// Further lines worth showing (the wgpu backend lists every adapter it saw).
    pub details: Vec<String>,
}

impl BackendProbe {
    /// Whether the backend can be used.
    pub fn is_available(&self) -> bool {
        matches!(self.availability, Availability::Available { .. })
    }
}

impl fmt::Display for BackendProbe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.availability {
            Availability::Available { device } => {
                write!(f, "{}: available, {device}", self.backend)
            }
            Availability::Unavailable { reason } => {
                write!(f, "{}: unavailable, {reason}", self.backend)
            }
        }
    }
}

/// Probes every backend (in the order Auto prefers them: Metal, CUDA, WebGPU, CPU).
/// Never fails: a backend that cannot be used says why.
///
/// ```
/// let probes = ringkernel::probe_backends();
/// assert_eq!(probes.len(), 4);
/// let cpu = probes.iter().find(|p| p.backend == ringkernel::BackendKind::Cpu).unwrap();
/// assert!(cpu.is_available());
/// ```
pub fn probe_backends() -> Vec<BackendProbe> {
    BackendKind::ALL.iter().map(|&b| probe_backend(b)).collect()
}

/// Probes one backend.
pub fn probe_backend(backend: BackendKind) -> BackendProbe {
    let (status, details) = backends::probe(backend);
    let availability = match status {
        Ok(device) => Availability::Available { device },
        Err(reason) => Availability::Unavailable { reason },
    };
    BackendProbe {
        backend,
        availability,
        details,
    }
}
