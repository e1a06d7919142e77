//! Publish/subscribe with MQTT topic-filter semantics.
//!
//! * Topics are `/`-separated levels; a published topic holds no wildcard.
//! * `+` matches exactly one level; `#` (last level only) matches the rest, including the
//!   parent level (`a/#` matches `a`).
//! * Topics starting with `$` are not matched by a filter whose first level is a wildcard.
//!
//! The [`Broker`] maps filters to kernels; publishing delivers into each subscribed
//! kernel's input queue (see [`RuntimeCore::publish`](crate::runtime::RuntimeCore::publish)).

use crate::error::Result;
use crate::runtime::KernelId;

/// Identifies one subscription (for [`Broker::unsubscribe`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SubscriptionId(pub u64);

/// A validated topic filter.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TopicFilter {
    raw: String,
}

impl TopicFilter {
    /// Parses and validates a filter (`InvalidArgument` for an empty filter, `#` not
    /// last or not alone in its level, `+` not alone in its level).
    pub fn new(filter: &str) -> Result<Self> {
        todo!("pubsub helper")
    }
    /// Whether `topic` (a valid topic name) matches.
    pub fn matches(&self, topic: &str) -> bool {
        todo!()
    }
    /// The filter text.
    pub fn as_str(&self) -> &str {
        &self.raw
    }
}

/// Validates a topic name for publishing (`InvalidArgument` if empty or holding `+`/`#`).
pub fn validate_topic(topic: &str) -> Result<()> {
    todo!()
}

/// Subscriptions of kernels to topic filters. Thread-safe.
#[derive(Debug, Default)]
pub struct Broker {
    _todo: (),
}

impl Broker {
    /// An empty broker.
    pub fn new() -> Self {
        todo!()
    }
    /// Subscribes `kernel` to `filter`.
    pub fn subscribe(&self, filter: &str, kernel: KernelId) -> Result<SubscriptionId> {
        todo!()
    }
    /// Removes a subscription (`InvalidArgument` if it does not exist).
    pub fn unsubscribe(&self, id: SubscriptionId) -> Result<()> {
        todo!()
    }
    /// Removes every subscription of `kernel` (when it terminates).
    pub fn remove_kernel(&self, kernel: KernelId) {
        todo!()
    }
    /// Kernels subscribed to `topic`, each once, in ascending id order.
    pub fn subscribers(&self, topic: &str) -> Result<Vec<KernelId>> {
        todo!()
    }
    /// Every subscription: id, filter, kernel.
    pub fn subscriptions(&self) -> Vec<(SubscriptionId, String, KernelId)> {
        todo!()
    }
}
