//! [`RingKernelBuilder`]: choosing a backend ([`Backend`]) and the handlers a runtime
//! knows, and starting it.

use crate::backends::{self, WgpuAdapter};
use crate::core::builtin::{self, register_cpu_builtins};
use crate::core::context::KernelContext;
use crate::core::message::RingMessage;
use crate::core::registry::{CpuHandler, GpuHandler, HandlerOutput, KernelRegistry};
use crate::runtime::RingKernel;
use crate::selection::{Backend, Selection, Skipped, BACKEND_ENV};
use crate::{BackendKind, Error, Result};
use std::fmt;

impl RingKernel {
    /// A builder: choose a backend and handlers, then `build().await`.
    pub fn builder() -> RingKernelBuilder {
        RingKernelBuilder::new()
    }
}

type Registration = Box<dyn FnOnce(&KernelRegistry) + Send>;

/// Builds a [`RingKernel`] runtime. Made by [`RingKernel::builder`].
///
/// ```
/// use ringkernel::prelude::*;
///
/// #[repr(C)]
/// #[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
/// struct Num(u64);
/// impl ringkernel::core::message::RingMessage for Num {
///     const TYPE_ID: u32 = 0x100;
///     const NAME: &'static str = "Num";
/// }
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let rt = RingKernel::builder()
///     .backend(Backend::Cpu)
///     .register_fn("inc", |_ctx: &mut KernelContext<'_>, n: Num| Some(Num(n.0 + 1)))
///     .build()
///     .await?;
/// let k = rt.launch("inc", LaunchOptions::default()).await?;
/// let out: Num = k.call(Num(41), std::time::Duration::from_secs(5)).await?;
/// assert_eq!(out.0, 42);
/// rt.shutdown().await?;
/// # Ok::<(), ringkernel::Error>(())
/// # }).unwrap();
/// ```
pub struct RingKernelBuilder {
    backend: Backend,
    use_env: bool,
    k2k: bool,
    cuda_device: usize,
    registry: KernelRegistry,
    pending: Vec<Registration>,
}

impl Default for RingKernelBuilder {
    fn default() -> Self {
        RingKernelBuilder {
            backend: Backend::Auto,
            use_env: true,
            k2k: true,
            cuda_device: 0,
            registry: KernelRegistry::new(),
            pending: Vec::new(),
        }
    }
}

impl fmt::Debug for RingKernelBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RingKernelBuilder")
            .field("backend", &self.backend)
            .field("use_env", &self.use_env)
            .field("k2k", &self.k2k)
            .field("cuda_device", &self.cuda_device)
            .field("registry", &self.registry)
            .field("pending_registrations", &self.pending.len())
            .finish()
    }
}

impl RingKernelBuilder {
    /// A builder for [`Backend::Auto`] with an empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Chooses the backend (default [`Backend::Auto`]).
    pub fn backend(mut self, backend: Backend) -> Self {
        self.backend = backend;
        self
    }

    /// Whether [`Backend::Auto`] honours [`BACKEND_ENV`] (default true). Explicit
    /// choices never read it.
    pub fn use_env(mut self, yes: bool) -> Self {
        self.use_env = yes;
        self
    }

    /// Whether kernel-to-kernel messaging is enabled (default true). A runtime built
    /// with `k2k(false)` refuses every K2K send with
    /// [`Error::InvalidArgument`] and has no [`RingKernel::k2k_broker`].
    pub fn k2k(mut self, enabled: bool) -> Self {
        self.k2k = enabled;
        self
    }

    /// The GPU a CUDA runtime runs on, by ordinal (default 0; [`Backend::Auto`] tries
    /// this one too). A GPU that does not exist makes an explicit [`Backend::Cuda`]
    /// fail with [`Error::InvalidArgument`] naming how many there are. For kernels on
    /// several GPUs that message each other, see `ringkernel_cuda::CudaRuntimeGroup`
    /// (re-exported as `ringkernel::CudaRuntimeGroup` with the `cuda` feature).
    pub fn cuda_device(mut self, ordinal: usize) -> Self {
        self.cuda_device = ordinal;
        self
    }

    /// Uses `registry` for handler lookups (it is shared, not copied: handlers added to
    /// it later are found too). Handlers added with the `register_*` methods of this
    /// builder go into it, whichever order the calls come in. Without this call the
    /// builder starts from a fresh, empty registry; pass
    /// `KernelRegistry::global().clone()` to share the process-wide one that the backend
    /// runtimes' `new()` constructors use.
    pub fn registry(mut self, registry: KernelRegistry) -> Self {
        self.registry = registry;
        self
    }

    /// Registers a typed closure as a CPU handler: it receives `Req` and returns
    /// nothing, `Option<Reply>` or `Result<..>` of those.
    pub fn register_fn<Req, Out, F>(mut self, name: impl Into<String>, f: F) -> Self
    where
        Req: RingMessage,
        Out: HandlerOutput,
        F: FnMut(&mut KernelContext<'_>, Req) -> Out + Clone + Send + Sync + 'static,
    {
        let name = name.into();
        self.pending.push(Box::new(move |r| r.register_fn(name, f)));
        self
    }

    /// Registers a CPU handler factory (one handler value per launched kernel).
    pub fn register_cpu(
        mut self,
        name: impl Into<String>,
        factory: impl Fn() -> Box<dyn CpuHandler> + Send + Sync + 'static,
    ) -> Self {
        let name = name.into();
        self.pending
            .push(Box::new(move |r| r.register_cpu(name, factory)));
        self
    }

    /// Registers a GPU handler (WGSL and/or CUDA C source).
    pub fn register_gpu(mut self, handler: GpuHandler) -> Self {
        self.pending
            .push(Box::new(move |r| r.register_gpu(handler)));
        self
    }

    /// Starts the runtime. The registry gets the built-in kernels (`rk.echo`,
    /// `rk.stage`, `rk.counter`) for the CPU and for the chosen GPU backend, unless a
    /// handler of that name is already there.
    ///
    /// Errors: [`Error::BackendUnavailable`] when an explicitly chosen backend cannot
    /// start (the reason says why), [`Error::InvalidArgument`] when [`BACKEND_ENV`]
    /// holds an unknown name.
    pub async fn build(self) -> Result<RingKernel> {
        let RingKernelBuilder {
            backend,
            use_env,
            k2k,
            cuda_device,
            registry,
            pending,
        } = self;
        // The CPU built-ins go in unless the user registered a handler of that name:
        // they are built in a scratch registry and copied over one by one.
        let existing = registry.cpu_names();
        let missing: Vec<&str> = [builtin::ECHO, builtin::STAGE, builtin::COUNTER]
            .into_iter()
            .filter(|n| !existing.iter().any(|e| e == n))
            .collect();
        if !missing.is_empty() {
            let builtins = KernelRegistry::new();
            register_cpu_builtins(&builtins);
            for name in missing {
                let f = builtins.cpu(name)?;
                registry.register_cpu(name, move || f());
            }
        }
        for p in pending {
            p(&registry);
        }

        let mut env_override = None;
        let mut effective = backend;
        if backend == Backend::Auto && use_env {
            if let Ok(v) = std::env::var(BACKEND_ENV) {
                if !v.trim().is_empty() {
                    effective = v.parse::<Backend>().map_err(|_| {
                        Error::invalid(format!(
                            "{BACKEND_ENV}={v:?} is not a backend: expected auto, cpu, cuda, wgpu or metal"
                        ))
                    })?;
                    env_override = Some(v);
                }
            }
        }

        let mut skipped = Vec::new();
        let (runtime, chosen) = match effective.kind() {
            Some(kind) => {
                let rt =
                    backends::start(kind, registry.clone(), WgpuAdapter::Any, cuda_device).await?;
                (rt, kind)
            }
            None => {
                let mut found = None;
                for kind in [BackendKind::Metal, BackendKind::Cuda, BackendKind::Wgpu] {
                    match backends::start(
                        kind,
                        registry.clone(),
                        WgpuAdapter::HardwareOnly,
                        cuda_device,
                    )
                    .await
                    {
                        Ok(rt) => {
                            found = Some((rt, kind));
                            break;
                        }
                        Err(e) => {
                            let reason = backends::reason(e);
                            tracing::info!(backend = %kind, %reason, "backend skipped by auto selection");
                            skipped.push(Skipped {
                                backend: kind,
                                reason,
                            });
                        }
                    }
                }
                match found {
                    Some(f) => f,
                    None => (
                        backends::start(BackendKind::Cpu, registry.clone(), WgpuAdapter::Any, 0)
                            .await?,
                        BackendKind::Cpu,
                    ),
                }
            }
        };
        runtime.set_k2k_enabled(k2k);
        let selection = Selection {
            requested: backend,
            env_override,
            chosen,
            skipped,
        };
        tracing::info!(selection = %selection, device = %runtime.device_info(), "RingKernel runtime started");
        Ok(RingKernel::from_parts(runtime, registry, selection))
    }
}
