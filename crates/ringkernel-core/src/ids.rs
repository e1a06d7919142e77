//! Identifiers shared by the runtime, K2K, pub/sub and telemetry.
//!
//! A leaf module: it depends on nothing else in the crate, so every other module can
//! name a kernel or a subscription without importing the runtime. The ids are
//! re-exported where they are used ([`runtime::KernelId`](crate::runtime::KernelId),
//! [`pubsub::SubscriptionId`](crate::pubsub::SubscriptionId)), so either path works.

/// Identifies a kernel within a runtime. `KernelId(0)` is the host.
///
/// ```
/// use ringkernel_core::ids::KernelId;
/// assert_eq!(KernelId::HOST, KernelId(0));
/// assert_eq!(KernelId(7).to_string(), "#7");
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KernelId(pub u32);

impl KernelId {
    /// The host (source of messages sent by
    /// [`KernelHandle::send`](crate::runtime::KernelHandle::send)).
    pub const HOST: KernelId = KernelId(0);
}

impl std::fmt::Display for KernelId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// Identifies one topic subscription (for
/// [`Broker::unsubscribe`](crate::pubsub::Broker::unsubscribe)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SubscriptionId(pub u64);
