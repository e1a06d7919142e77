//! Publish/subscribe with MQTT topic-filter semantics.
//!
//! * Topics are `/`-separated levels; a published topic holds no wildcard.
//! * `+` matches exactly one level; `#` (last level only) matches the rest, including the
//!   parent level (`a/#` matches `a`).
//! * Topics starting with `$` are not matched by a filter whose first level is a wildcard.
//!
//! The [`Broker`] maps filters to kernels; publishing delivers into each subscribed
//! kernel's input queue (see [`RuntimeCore::publish`](crate::runtime::RuntimeCore::publish)).

use crate::error::{Error, Result};
use crate::ids::KernelId;
pub use crate::ids::SubscriptionId;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::RwLock;

/// Longest topic or filter in bytes (the MQTT limit of a UTF-8 string).
pub const MAX_TOPIC_LEN: usize = 65_535;

/// A validated topic filter.
///
/// ```
/// use ringkernel_core::pubsub::TopicFilter;
/// let f = TopicFilter::new("sport/tennis/+").unwrap();
/// assert!(f.matches("sport/tennis/player1"));
/// assert!(!f.matches("sport/tennis/player1/ranking"));
/// assert!(TopicFilter::new("sport/tennis#").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TopicFilter {
    raw: String,
}

/// Checks the rules filters and topics share: not empty, no NUL, at most
/// [`MAX_TOPIC_LEN`] bytes.
fn check_common(s: &str, what: &str) -> Result<()> {
    if s.is_empty() {
        return Err(Error::invalid(format!("{what} must not be empty")));
    }
    if s.len() > MAX_TOPIC_LEN {
        return Err(Error::invalid(format!(
            "{what} of {} bytes exceeds the maximum of {MAX_TOPIC_LEN}",
            s.len()
        )));
    }
    if s.contains('\0') {
        return Err(Error::invalid(format!("{what} must not contain NUL")));
    }
    Ok(())
}

impl TopicFilter {
    /// Parses and validates a filter (`InvalidArgument` for an empty filter, `#` not
    /// last or not alone in its level, `+` not alone in its level).
    pub fn new(filter: &str) -> Result<Self> {
        check_common(filter, "topic filter")?;
        let levels = filter.split('/').count();
        for (i, level) in filter.split('/').enumerate() {
            if level.contains('#') && (level != "#" || i + 1 != levels) {
                return Err(Error::invalid(format!(
                    "topic filter {filter:?}: '#' must be a whole level and the last one"
                )));
            }
            if level.contains('+') && level != "+" {
                return Err(Error::invalid(format!(
                    "topic filter {filter:?}: '+' must be a whole level"
                )));
            }
        }
        Ok(TopicFilter {
            raw: filter.to_string(),
        })
    }

    /// Whether `topic` (a valid topic name) matches. An invalid topic (empty, or holding
    /// a wildcard) matches nothing.
    pub fn matches(&self, topic: &str) -> bool {
        if validate_topic(topic).is_err() {
            return false;
        }
        // `$` topics are reserved: a leading wildcard does not reach into them.
        if topic.starts_with('$') && (self.raw.starts_with('+') || self.raw.starts_with('#')) {
            return false;
        }
        let mut topic_levels = topic.split('/');
        for f in self.raw.split('/') {
            if f == "#" {
                // The rest, including none at all (`a/#` matches `a`).
                return true;
            }
            match topic_levels.next() {
                Some(t) if f == "+" || f == t => {}
                _ => return false,
            }
        }
        topic_levels.next().is_none()
    }

    /// Whether the filter holds a wildcard.
    pub fn has_wildcards(&self) -> bool {
        self.raw.contains(['+', '#'])
    }

    /// The filter text.
    pub fn as_str(&self) -> &str {
        &self.raw
    }
}

impl std::fmt::Display for TopicFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.raw)
    }
}

/// Validates a topic name for publishing (`InvalidArgument` if empty or holding `+`/`#`).
pub fn validate_topic(topic: &str) -> Result<()> {
    check_common(topic, "topic")?;
    if topic.contains(['+', '#']) {
        return Err(Error::invalid(format!(
            "topic {topic:?} must not hold the wildcards '+' or '#'"
        )));
    }
    Ok(())
}

#[derive(Debug, Default)]
struct Inner {
    next_id: u64,
    subs: BTreeMap<SubscriptionId, (TopicFilter, KernelId)>,
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

/// Subscriptions of kernels to topic filters. Thread-safe.
///
/// ```
/// use ringkernel_core::pubsub::Broker;
/// use ringkernel_core::runtime::KernelId;
/// let b = Broker::new();
/// b.subscribe("sensors/+/temp", KernelId(2)).unwrap();
/// b.subscribe("sensors/#", KernelId(1)).unwrap();
/// assert_eq!(b.subscribers("sensors/a/temp").unwrap(), vec![KernelId(1), KernelId(2)]);
/// ```
#[derive(Debug, Default)]
pub struct Broker {
    inner: RwLock<Inner>,
}

impl Broker {
    /// An empty broker.
    pub fn new() -> Self {
        Self::default()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        // A panic while holding the lock cannot leave `Inner` half-updated (every
        // mutation is a single map operation), so a poisoned lock is still usable.
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Subscribes `kernel` to `filter`. Subscribing the same kernel to the same filter
    /// again returns the existing subscription (as in MQTT, where it replaces it).
    pub fn subscribe(&self, filter: &str, kernel: KernelId) -> Result<SubscriptionId> {
        let filter = TopicFilter::new(filter)?;
        let mut inner = self.write();
        if let Some((id, _)) = inner
            .subs
            .iter()
            .find(|(_, (f, k))| *k == kernel && *f == filter)
        {
            return Ok(*id);
        }
        inner.next_id += 1;
        let id = SubscriptionId(inner.next_id);
        inner.subs.insert(id, (filter, kernel));
        Ok(id)
    }

    /// Removes a subscription (`InvalidArgument` if it does not exist).
    pub fn unsubscribe(&self, id: SubscriptionId) -> Result<()> {
        match self.write().subs.remove(&id) {
            Some(_) => Ok(()),
            None => Err(Error::invalid(format!("no subscription with id {}", id.0))),
        }
    }

    /// Removes every subscription of `kernel` (when it terminates).
    pub fn remove_kernel(&self, kernel: KernelId) {
        self.write().subs.retain(|_, (_, k)| *k != kernel);
    }

    /// Kernels subscribed to `topic`, each once, in ascending id order.
    pub fn subscribers(&self, topic: &str) -> Result<Vec<KernelId>> {
        validate_topic(topic)?;
        let set: BTreeSet<KernelId> = self
            .read()
            .subs
            .values()
            .filter(|(f, _)| f.matches(topic))
            .map(|(_, k)| *k)
            .collect();
        Ok(set.into_iter().collect())
    }

    /// Every subscription: id, filter, kernel.
    pub fn subscriptions(&self) -> Vec<(SubscriptionId, String, KernelId)> {
        self.read()
            .subs
            .iter()
            .map(|(id, (f, k))| (*id, f.as_str().to_string(), *k))
            .collect()
    }
}
