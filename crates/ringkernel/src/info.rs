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
    /// Compiled in but not usable here.
    Unavailable {
        /// Why, in words a user can act on.
        reason: String,
    },
    /// Left out of this build: the cargo feature that compiles it in is off.
    NotCompiledIn {
        /// The feature of the `ringkernel` crate to enable (`cuda`, `wgpu`, `metal`).
        feature: &'static str,
    },
}

impl Availability {
    /// One short word for the state: `available`, `unavailable` or `not compiled in`.
    pub fn state(&self) -> &'static str {
        match self {
            Availability::Available { .. } => "available",
            Availability::Unavailable { .. } => "unavailable",
            Availability::NotCompiledIn { .. } => "not compiled in",
        }
    }

    /// The device (available) or the reason (otherwise), in words a user can act on.
    pub fn detail(&self) -> String {
        match self {
            Availability::Available { device } => device.clone(),
            Availability::Unavailable { reason } => reason.clone(),
            Availability::NotCompiledIn { feature } => {
                format!("enable feature `{feature}` of the ringkernel crate")
            }
        }
    }
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
        let a = &self.availability;
        write!(f, "{}: {}, {}", self.backend, a.state(), a.detail())
    }
}

/// Probes every backend (in the order Auto prefers them: Metal, CUDA, WebGPU, CPU),
/// compiled in or not. Never fails: a backend that cannot be used says why.
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

/// Probes one backend. A backend left out of the build is
/// [`Availability::NotCompiledIn`] without probing anything.
pub fn probe_backend(backend: BackendKind) -> BackendProbe {
    if let Some(feature) = backends::backend_feature(backend) {
        if !backends::backend_compiled_in(backend) {
            return BackendProbe {
                backend,
                availability: Availability::NotCompiledIn { feature },
                details: Vec::new(),
            };
        }
    }
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
