//! Which backend a runtime runs on: what was asked for ([`Backend`]) and how the choice
//! was made ([`Selection`]).

use crate::{BackendKind, Error, Result};
use std::fmt;
use std::str::FromStr;

/// Environment variable that overrides [`Backend::Auto`]: `cpu`, `cuda`, `wgpu` or
/// `metal` (the same variable `Device::auto()` reads for compute).
pub const BACKEND_ENV: &str = "RINGKERNEL_BACKEND";

/// Which backend a [`RingKernel`] runtime runs on.
///
/// `Auto` takes the first hardware GPU backend that starts, in the order Metal, CUDA,
/// WebGPU (on a hardware adapter only), and falls back to the CPU. The reason each
/// skipped backend gave is kept in [`RingKernel::selection`]. An explicit choice that
/// cannot start is [`Error::BackendUnavailable`] with that reason. The GPU backends are
/// cargo features of this crate (`cuda`, `wgpu`, `metal`, `full`); one left out of the
/// build is skipped by `Auto`, and chosen explicitly it is `BackendUnavailable` with
/// the reason "not compiled in: enable feature `…`".
///
/// ```
/// use ringkernel::Backend;
/// let b: Backend = "wgpu".parse().unwrap();
/// assert_eq!(b, Backend::Wgpu);
/// assert_eq!(Backend::default(), Backend::Auto);
/// assert_eq!("auto".parse::<Backend>().unwrap().to_string(), "auto");
/// assert!("tpu".parse::<Backend>().is_err());
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Backend {
    /// The best available backend: Metal > CUDA > WebGPU (hardware adapter) > CPU.
    #[default]
    Auto,
    /// Kernel threads on the host CPU. Always available.
    Cpu,
    /// Persistent kernels on an NVIDIA GPU (feature `cuda`).
    Cuda,
    /// Event-driven kernels through WebGPU (wgpu); any adapter, software included
    /// (feature `wgpu`).
    Wgpu,
    /// Event-driven kernels on an Apple GPU (feature `metal`).
    Metal,
}

impl Backend {
    /// The concrete backend, or `None` for [`Backend::Auto`].
    pub fn kind(self) -> Option<BackendKind> {
        match self {
            Backend::Auto => None,
            Backend::Cpu => Some(BackendKind::Cpu),
            Backend::Cuda => Some(BackendKind::Cuda),
            Backend::Wgpu => Some(BackendKind::Wgpu),
            Backend::Metal => Some(BackendKind::Metal),
        }
    }

    /// Lower-case name (`auto`, `cpu`, `cuda`, `wgpu`, `metal`).
    pub fn as_str(self) -> &'static str {
        match self.kind() {
            None => "auto",
            Some(k) => k.as_str(),
        }
    }
}

impl From<BackendKind> for Backend {
    fn from(k: BackendKind) -> Self {
        match k {
            BackendKind::Cpu => Backend::Cpu,
            BackendKind::Cuda => Backend::Cuda,
            BackendKind::Wgpu => Backend::Wgpu,
            BackendKind::Metal => Backend::Metal,
        }
    }
}

impl FromStr for Backend {
    type Err = Error;
    /// Parses `auto`, `cpu`, `cuda`, `wgpu` (or `webgpu`) and `metal`, any case.
    fn from_str(s: &str) -> Result<Self> {
        if s.trim().eq_ignore_ascii_case("auto") {
            return Ok(Backend::Auto);
        }
        BackendKind::parse(s).map(Backend::from).ok_or_else(|| {
            Error::invalid(format!(
                "unknown backend {s:?}: expected auto, cpu, cuda, wgpu or metal"
            ))
        })
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A backend that was not chosen, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// The backend.
    pub backend: BackendKind,
    /// Why it was not used, in words a user can act on.
    pub reason: String,
}

/// How the backend of a runtime was chosen.
///
/// ```no_run
/// # async fn f() -> ringkernel::Result<()> {
/// use ringkernel::{Backend, RingKernel};
/// let rt = RingKernel::builder().backend(Backend::Auto).build().await?;
/// for s in &rt.selection().skipped {
///     println!("skipped {}: {}", s.backend, s.reason);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    /// What was asked for.
    pub requested: Backend,
    /// Set when `Auto` was overridden by [`BACKEND_ENV`]: the variable's value.
    pub env_override: Option<String>,
    /// The backend the runtime runs on.
    pub chosen: BackendKind,
    /// Backends tried (or ruled out) before `chosen`, in order, with their reasons.
    pub skipped: Vec<Skipped>,
}

impl fmt::Display for Selection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (requested {}", self.chosen, self.requested)?;
        if let Some(v) = &self.env_override {
            write!(f, ", {BACKEND_ENV}={v}")?;
        }
        f.write_str(")")?;
        for s in &self.skipped {
            write!(f, "; skipped {}: {}", s.backend, s.reason)?;
        }
        Ok(())
    }
}
