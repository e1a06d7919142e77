//! [`RingKernel`]: a started runtime on one backend.

use crate::core::hlc::HlcClock;
use crate::core::k2k::{K2kBroker, KernelTarget};
use crate::core::message::{Envelope, RingMessage};
use crate::core::options::LaunchOptions;
use crate::core::pubsub::{PubSubBroker, SubscriptionId};
use crate::core::registry::KernelRegistry;
use crate::core::runtime::{
    KernelHandle, KernelId, PublishReport, RingKernelRuntime, RuntimeExt, ShutdownReport,
};
use crate::core::telemetry::RuntimeMetrics;
use crate::selection::Selection;
use crate::{BackendKind, Result};
use std::fmt;
use std::sync::Arc;

/// A RingKernel runtime: launches kernels on its backend and routes messages between
/// them and the host. Cheap to clone (shared).
///
/// ```
/// use ringkernel::prelude::*;
/// use std::time::Duration;
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let rt = RingKernel::builder().backend(Backend::Cpu).build().await?;
/// let echo = rt.launch(builtin::ECHO, LaunchOptions::default()).await?;
/// let back: Token = echo.call(Token::new(1, 21.0), Duration::from_secs(5)).await?;
/// assert_eq!(back.value, 42.0);
/// assert_eq!(rt.backend(), BackendKind::Cpu);
/// rt.shutdown().await?;
/// # Ok::<(), ringkernel::Error>(())
/// # }).unwrap();
/// ```
#[derive(Clone)]
pub struct RingKernel {
    inner: Arc<Inner>,
}

struct Inner {
    runtime: Arc<dyn RingKernelRuntime>,
    registry: KernelRegistry,
    selection: Selection,
}

impl fmt::Debug for RingKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RingKernel")
            .field("backend", &self.backend())
            .field("device", &self.device_info())
            .field("selection", &self.inner.selection)
            .finish()
    }
}

impl RingKernel {
    pub(crate) fn from_parts(
        runtime: Arc<dyn RingKernelRuntime>,
        registry: KernelRegistry,
        selection: Selection,
    ) -> Self {
        RingKernel {
            inner: Arc::new(Inner {
                runtime,
                registry,
                selection,
            }),
        }
    }

    /// Launches a kernel running the handler registered as `handler`. Several kernels
    /// can run one handler under different instance names
    /// ([`LaunchOptions::with_name`]).
    ///
    /// Errors: [`Error::KernelNotFound`](crate::Error::KernelNotFound) for an unknown
    /// handler, [`Error::InvalidArgument`](crate::Error::InvalidArgument) for bad
    /// options or an instance name already in use.
    pub async fn launch(&self, handler: &str, opts: LaunchOptions) -> Result<KernelHandle> {
        self.inner.runtime.launch(handler, opts).await
    }

    /// A handle to a live kernel, by id or instance name.
    pub fn kernel(&self, target: impl Into<KernelTarget>) -> Option<KernelHandle> {
        self.inner.runtime.kernel(&target.into())
    }

    /// Subscribes a kernel to an MQTT-style topic filter (`+` one level, `#` the rest).
    /// Published messages matching it arrive in the kernel's input queue.
    pub fn subscribe(&self, kernel: KernelId, filter: &str) -> Result<SubscriptionId> {
        self.inner.runtime.subscribe(kernel, filter)
    }

    /// Removes a subscription.
    pub fn unsubscribe(&self, id: SubscriptionId) -> Result<()> {
        self.inner.runtime.unsubscribe(id)
    }

    /// Publishes a typed message to `topic` from the host. Never waits: the report says
    /// which subscribers got it and which had a full queue.
    pub fn publish<M: RingMessage>(&self, topic: &str, msg: &M) -> Result<PublishReport> {
        self.inner.runtime.publish(topic, msg)
    }

    /// Publishes an already-built message to `topic`.
    pub fn publish_envelope(&self, topic: &str, env: &Envelope) -> Result<PublishReport> {
        self.inner.runtime.publish_envelope(topic, env)
    }

    /// The kernel-to-kernel broker: sends an envelope from one kernel straight into
    /// another's input queue and answers with a receipt. `None` when K2K messaging is
    /// disabled for this runtime ([`RingKernelBuilder::k2k`](crate::RingKernelBuilder::k2k),
    /// [`set_k2k_enabled`](RingKernel::set_k2k_enabled)); enabled by default.
    ///
    /// ```
    /// use ringkernel::prelude::*;
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let rt = RingKernel::builder().backend(Backend::Cpu).build().await?;
    /// let a = rt.launch(builtin::ECHO, LaunchOptions::default().with_name("a")).await?;
    /// let b = rt.launch(builtin::ECHO, LaunchOptions::default().with_name("b")).await?;
    /// let broker = rt.k2k_broker().expect("K2K is on by default");
    /// let receipt = broker.send(a.id(), b.id(), Envelope::new(&Token::new(1, 2.0))).await?;
    /// assert_eq!(receipt, K2kReceipt::Delivered);
    /// rt.shutdown().await?;
    /// # Ok::<(), ringkernel::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn k2k_broker(&self) -> Option<K2kBroker> {
        self.inner.runtime.k2k_broker()
    }

    /// Enables or disables K2K messaging: while disabled every K2K send is refused
    /// with [`Error::InvalidArgument`](crate::Error::InvalidArgument) and
    /// [`k2k_broker`](RingKernel::k2k_broker) is `None`.
    pub fn set_k2k_enabled(&self, enabled: bool) {
        self.inner.runtime.set_k2k_enabled(enabled)
    }

    /// This runtime's topic broker as a [`PubSubBroker`]: subscriptions name live
    /// kernels, publications go into their input queues (the same subscriptions as
    /// [`subscribe`](RingKernel::subscribe)).
    pub fn pubsub(&self) -> PubSubBroker {
        self.inner.runtime.pubsub()
    }

    /// Metrics of every live kernel, with runtime-wide totals.
    pub fn metrics(&self) -> RuntimeMetrics {
        self.inner.runtime.metrics()
    }

    /// Terminates every kernel (active ones drain their queues first) and releases the
    /// backend. Safe to call more than once.
    pub async fn shutdown(&self) -> Result<ShutdownReport> {
        self.inner.runtime.shutdown().await
    }

    /// The backend the runtime runs on.
    pub fn backend(&self) -> BackendKind {
        self.inner.runtime.backend()
    }

    /// A one-line description of the device.
    pub fn device_info(&self) -> String {
        self.inner.runtime.device_info()
    }

    /// How the backend was chosen, with the reason for every backend skipped.
    pub fn selection(&self) -> &Selection {
        &self.inner.selection
    }

    /// The host's hybrid logical clock: it stamps every message the host sends and
    /// merges every reply it receives.
    pub fn clock(&self) -> &HlcClock {
        self.inner.runtime.core().hlc()
    }

    /// The handler registry (shared: handlers registered on it later can be launched).
    pub fn registry(&self) -> &KernelRegistry {
        &self.inner.registry
    }

    /// The backend runtime behind the facade.
    pub fn runtime(&self) -> &Arc<dyn RingKernelRuntime> {
        &self.inner.runtime
    }
}
