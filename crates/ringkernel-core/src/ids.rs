//! Identifiers and the small routing values shared by the runtime, K2K, pub/sub and
//! telemetry: kernel and subscription ids, K2K targets and receipts, publish reports.
//!
//! A leaf module: it depends on nothing else in the crate, so every other module can
//! name a kernel, a target or a subscription without importing the runtime (or K2K and
//! pub/sub importing the handler context that routes through them). The ids are
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

/// Where a K2K message goes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum KernelTarget {
    /// A kernel by id.
    Id(KernelId),
    /// A kernel by instance name.
    Name(String),
}

impl From<KernelId> for KernelTarget {
    fn from(id: KernelId) -> Self {
        KernelTarget::Id(id)
    }
}
impl From<&str> for KernelTarget {
    fn from(s: &str) -> Self {
        KernelTarget::Name(s.to_string())
    }
}
impl From<String> for KernelTarget {
    fn from(s: String) -> Self {
        KernelTarget::Name(s)
    }
}
impl From<&String> for KernelTarget {
    fn from(s: &String) -> Self {
        KernelTarget::Name(s.clone())
    }
}

impl std::fmt::Display for KernelTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KernelTarget::Id(id) => write!(f, "{id}"),
            KernelTarget::Name(n) => write!(f, "{n:?}"),
        }
    }
}

/// What happened to a K2K message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum K2kReceipt {
    /// In the destination's input queue.
    Delivered,
    /// The destination's input queue was full; the message was not delivered.
    QueueFull,
    /// No such kernel (or it has terminated); the message was not delivered.
    NotFound,
}

/// How a publish went.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PublishReport {
    /// Kernels whose input queue received the message.
    pub delivered: usize,
    /// Subscribed kernels whose queue was full (not delivered).
    pub queue_full: Vec<KernelId>,
    /// Subscribed kernels that have terminated (not delivered).
    pub not_found: Vec<KernelId>,
}
