//! Publish/subscribe with MQTT topic-filter semantics.
//!
//! * Topics are `/`-separated levels; a published topic holds no wildcard.
//! * `+` matches exactly one level; `#` (last level only) matches the rest, including the
//!   parent level (`a/#` matches `a`).
//! * Topics starting with `$` are not matched by a filter whose first level is a wildcard.
//!
//! The [`Broker`] maps filters to kernels; publishing delivers into each subscribed
//! kernel's input queue (see [`RuntimeCore::publish`](crate::runtime::RuntimeCore::publish)).
//! [`PubSubBroker`] (with [`Topic`] and [`PubSubConfig`]) is the same broker in the
//! shape of the seed README: standalone with bounded mailboxes, or a runtime's own
//! ([`RingKernelRuntime::pubsub`](crate::runtime::RingKernelRuntime::pubsub)).

use crate::context::MessageRouter;
use crate::error::{Error, Result};
use crate::hlc::HlcTimestamp;
use crate::ids::KernelId;
pub use crate::ids::SubscriptionId;
use crate::message::Envelope;
use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

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

pub use crate::ids::PublishReport;

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

// ---------------------------------------------------------------------------------
// The broker in the words of the seed README: `PubSubBroker`, `PubSubConfig`, `Topic`.
// ---------------------------------------------------------------------------------

/// A topic or topic filter as written, for [`PubSubBroker`]. Making one never fails;
/// the text is checked where a mistake can be reported: [`PubSubBroker::subscribe`]
/// checks it as a filter ([`TopicFilter::new`]), [`PubSubBroker::publish`] as a topic
/// name ([`validate_topic`]), both with [`Error::InvalidArgument`].
///
/// ```
/// use ringkernel_core::pubsub::Topic;
/// let t = Topic::new("sensors/+/temperature");
/// assert!(t.filter().unwrap().matches("sensors/room1/temperature"));
/// assert!(t.validate_name().is_err()); // a wildcard cannot be published to
/// assert!(Topic::new("a/#/b").filter().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Topic(String);

impl Topic {
    /// A topic or filter text, unchecked.
    pub fn new(topic: impl Into<String>) -> Self {
        Topic(topic.into())
    }
    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
    /// Parses the text as a subscription filter.
    pub fn filter(&self) -> Result<TopicFilter> {
        TopicFilter::new(&self.0)
    }
    /// Checks the text as a topic name to publish to (no wildcards).
    pub fn validate_name(&self) -> Result<()> {
        validate_topic(&self.0)
    }
}

impl std::fmt::Display for Topic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for Topic {
    fn from(s: &str) -> Self {
        Topic::new(s)
    }
}

impl From<String> for Topic {
    fn from(s: String) -> Self {
        Topic(s)
    }
}

/// Settings of a standalone [`PubSubBroker`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PubSubConfig {
    /// Publications each subscriber's mailbox keeps until the program takes them
    /// (default 1024). When a mailbox is full, further publications to it are not kept
    /// and counted instead ([`PubSubBroker::overflowed`], and the subscriber appears in
    /// [`PublishReport::queue_full`]). 0 keeps nothing: every publication is counted.
    pub mailbox_capacity: usize,
}

impl Default for PubSubConfig {
    fn default() -> Self {
        PubSubConfig {
            mailbox_capacity: 1024,
        }
    }
}

impl PubSubConfig {
    /// Sets [`mailbox_capacity`](PubSubConfig::mailbox_capacity).
    pub fn with_mailbox_capacity(mut self, publications: usize) -> Self {
        self.mailbox_capacity = publications;
        self
    }
}

/// One publication as a standalone broker's mailbox keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Publication {
    /// The topic it was published to.
    pub topic: Topic,
    /// The message: `source_kernel` is the sender, the HLC timestamp the one given to
    /// [`PubSubBroker::publish`], the [`PUBSUB`](crate::message::flags::PUBSUB) flag set.
    pub envelope: Envelope,
}

#[derive(Debug, Default)]
struct Mailbox {
    queue: VecDeque<Publication>,
    overflowed: u64,
}

/// What an attached [`PubSubBroker`] needs from its runtime.
/// [`RuntimeCore`](crate::runtime::RuntimeCore) implements it (a trait, so that this
/// module does not depend on the runtime module that uses it).
pub trait PubSubHost: MessageRouter {
    /// The runtime's subscriptions.
    fn broker(&self) -> &Broker;
    /// Whether `kernel` is a live kernel of the runtime.
    fn is_live(&self, kernel: KernelId) -> bool;
    /// Merges a timestamp into the runtime's clock ([`Error::ClockDrift`] if it is
    /// too far ahead).
    fn merge_timestamp(&self, ts: &HlcTimestamp) -> Result<()>;
}

enum Backing {
    /// Standalone: its own subscriptions and one bounded mailbox per subscriber.
    Standalone {
        config: PubSubConfig,
        broker: Broker,
        mailboxes: Mutex<HashMap<KernelId, Mailbox>>,
        next_message: AtomicU64,
    },
    /// A runtime's: its subscriptions, delivery into kernel input queues.
    Runtime(Arc<dyn PubSubHost>),
}

/// Topic-based publish/subscribe with MQTT wildcards (`+` one level, `#` the rest), in
/// the shape of the seed README. It comes in two forms:
///
/// * **standalone**, [`PubSubBroker::new`]: not attached to a runtime. Each subscribed
///   kernel id gets a bounded mailbox ([`PubSubConfig::mailbox_capacity`]) that the
///   program drains with [`take`](PubSubBroker::take) and hands on as it likes
///   (for example with [`KernelHandle::send_envelope`](crate::runtime::KernelHandle::send_envelope)).
///   Nothing is lost silently: a publication that does not fit a full mailbox is
///   counted ([`overflowed`](PubSubBroker::overflowed)) and reported.
/// * **a runtime's**, [`RingKernelRuntime::pubsub`](crate::runtime::RingKernelRuntime::pubsub):
///   subscriptions name live kernels and publications go straight into their input
///   queues; a full queue is reported in [`PublishReport::queue_full`].
///
/// Subscribing a kernel to two filters that both match a topic delivers once.
///
/// ```
/// use ringkernel_core::builtin::Token;
/// use ringkernel_core::hlc::HlcClock;
/// use ringkernel_core::message::Envelope;
/// use ringkernel_core::pubsub::{PubSubBroker, PubSubConfig, Topic};
/// use ringkernel_core::runtime::KernelId;
///
/// let broker = PubSubBroker::new(PubSubConfig::default());
/// broker.subscribe(KernelId(3), Topic::new("sensors/+/temperature"))?;
/// let clock = HlcClock::new(1);
/// let report = broker.publish(
///     Topic::new("sensors/room1/temperature"),
///     KernelId::HOST,
///     Envelope::new(&Token::new(1, 21.5)),
///     clock.tick(),
/// )?;
/// assert_eq!(report.delivered, 1);
/// let got = broker.take(KernelId(3))?;
/// assert_eq!(got[0].envelope.decode::<Token>()?.value, 21.5);
/// # Ok::<(), ringkernel_core::Error>(())
/// ```
pub struct PubSubBroker {
    backing: Backing,
}

impl std::fmt::Debug for PubSubBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("PubSubBroker");
        match &self.backing {
            Backing::Standalone { config, .. } => d.field("standalone", config),
            Backing::Runtime(_) => d.field("attached", &true),
        };
        d.field("subscriptions", &self.broker().subscriptions().len())
            .finish()
    }
}

impl PubSubBroker {
    /// A standalone broker (see the type docs for what it does with a publication).
    pub fn new(config: PubSubConfig) -> Self {
        PubSubBroker {
            backing: Backing::Standalone {
                config,
                broker: Broker::new(),
                mailboxes: Mutex::new(HashMap::new()),
                next_message: AtomicU64::new(1),
            },
        }
    }

    /// A broker attached to a runtime (normally made by
    /// [`RingKernelRuntime::pubsub`](crate::runtime::RingKernelRuntime::pubsub)).
    pub fn attached(host: Arc<dyn PubSubHost>) -> Self {
        PubSubBroker {
            backing: Backing::Runtime(host),
        }
    }

    /// Whether this broker delivers into a runtime's kernel queues.
    pub fn is_attached(&self) -> bool {
        matches!(self.backing, Backing::Runtime(_))
    }

    fn broker(&self) -> &Broker {
        match &self.backing {
            Backing::Standalone { broker, .. } => broker,
            Backing::Runtime(host) => host.broker(),
        }
    }

    /// Subscribes `kernel` to the filter `topic`. Subscribing again to the same filter
    /// returns the existing subscription.
    ///
    /// Errors: [`Error::InvalidArgument`] for an invalid filter (empty, `#` not last or
    /// not a whole level, `+` not a whole level); on a runtime's broker,
    /// [`Error::KernelNotFound`] when `kernel` is not a live kernel of it.
    pub fn subscribe(&self, kernel: KernelId, topic: Topic) -> Result<SubscriptionId> {
        if let Backing::Runtime(host) = &self.backing {
            if !host.is_live(kernel) {
                return Err(Error::KernelNotFound(format!(
                    "kernel {kernel} cannot subscribe to {topic:?}: it is not a live kernel of this runtime"
                )));
            }
        }
        self.broker().subscribe(topic.as_str(), kernel)
    }

    /// Removes a subscription ([`Error::InvalidArgument`] if it does not exist).
    pub fn unsubscribe(&self, id: SubscriptionId) -> Result<()> {
        self.broker().unsubscribe(id)
    }

    /// Every subscription: id, filter, kernel.
    pub fn subscriptions(&self) -> Vec<(SubscriptionId, String, KernelId)> {
        self.broker().subscriptions()
    }

    /// Publishes `envelope` to `topic` on behalf of `sender`, stamped with `timestamp`
    /// (its type id, payload and priority are kept; it gets a fresh message id, the
    /// sender as source and the `PUBSUB` flag). Never waits. The report says which
    /// subscribers got it and which did not (full mailbox or queue, terminated kernel).
    ///
    /// On a runtime's broker the runtime's clock first merges `timestamp`, so later
    /// timestamps of the runtime are ordered after the publication.
    ///
    /// Errors: [`Error::InvalidArgument`] for an invalid topic name (empty, holding a
    /// wildcard); on a runtime's broker, [`Error::KernelNotFound`] when `sender` is
    /// neither [`KernelId::HOST`] nor a live kernel, [`Error::ClockDrift`] when
    /// `timestamp` is too far ahead of the clock, [`Error::MessageTooLarge`] when the
    /// payload does not fit a subscriber's slots.
    pub fn publish(
        &self,
        topic: Topic,
        sender: KernelId,
        envelope: impl Borrow<Envelope>,
        timestamp: HlcTimestamp,
    ) -> Result<PublishReport> {
        topic.validate_name()?;
        let env = envelope.borrow();
        let mut h = env.header;
        h.source_kernel = sender.0;
        h.flags |= crate::message::flags::PUBSUB;
        h.set_hlc(timestamp);
        match &self.backing {
            Backing::Runtime(host) => {
                if sender != KernelId::HOST && !host.is_live(sender) {
                    return Err(Error::KernelNotFound(format!(
                        "publisher {sender} is neither the host nor a live kernel of this runtime"
                    )));
                }
                host.merge_timestamp(&timestamp)?;
                h.message_id = host.next_message_id();
                h.correlation_id = h.message_id;
                host.publish_raw(topic.as_str(), h, &env.payload)
            }
            Backing::Standalone {
                config,
                broker,
                mailboxes,
                next_message,
            } => {
                h.message_id = next_message.fetch_add(1, Ordering::Relaxed);
                h.correlation_id = h.message_id;
                let mut report = PublishReport::default();
                let subscribers = broker.subscribers(topic.as_str())?;
                let mut boxes = crate::util::lock(mailboxes);
                for id in subscribers {
                    let mb = boxes.entry(id).or_default();
                    if mb.queue.len() < config.mailbox_capacity {
                        mb.queue.push_back(Publication {
                            topic: topic.clone(),
                            envelope: Envelope {
                                header: h,
                                payload: env.payload.clone(),
                            },
                        });
                        report.delivered += 1;
                    } else {
                        mb.overflowed += 1;
                        report.queue_full.push(id);
                    }
                }
                Ok(report)
            }
        }
    }

    /// Takes every publication waiting in `kernel`'s mailbox, oldest first (empty if
    /// none). [`Error::InvalidArgument`] on a runtime's broker, whose publications are
    /// in the kernels' input queues.
    pub fn take(&self, kernel: KernelId) -> Result<Vec<Publication>> {
        match &self.backing {
            Backing::Standalone { mailboxes, .. } => Ok(crate::util::lock(mailboxes)
                .get_mut(&kernel)
                .map(|mb| mb.queue.drain(..).collect())
                .unwrap_or_default()),
            Backing::Runtime(_) => Err(attached_error()),
        }
    }

    /// Publications waiting in `kernel`'s mailbox (0 on a runtime's broker).
    pub fn pending(&self, kernel: KernelId) -> usize {
        match &self.backing {
            Backing::Standalone { mailboxes, .. } => crate::util::lock(mailboxes)
                .get(&kernel)
                .map_or(0, |mb| mb.queue.len()),
            Backing::Runtime(_) => 0,
        }
    }

    /// Publications to `kernel` that found its mailbox full and were not kept, since
    /// the broker was made (0 on a runtime's broker: its kernels' metrics count those).
    pub fn overflowed(&self, kernel: KernelId) -> u64 {
        match &self.backing {
            Backing::Standalone { mailboxes, .. } => crate::util::lock(mailboxes)
                .get(&kernel)
                .map_or(0, |mb| mb.overflowed),
            Backing::Runtime(_) => 0,
        }
    }
}

fn attached_error() -> Error {
    Error::invalid(
        "this broker belongs to a runtime: its publications are in the subscribed \
         kernels' input queues, not in mailboxes",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hlc::HlcClock;
    use crate::message::flags;

    /// A message whose payload is `v`'s bytes.
    fn env(v: f64) -> Envelope {
        Envelope::from_bytes(0x5EED, &v.to_le_bytes())
    }

    fn value(e: &Envelope) -> f64 {
        f64::from_le_bytes(e.payload[..8].try_into().unwrap())
    }

    #[test]
    fn topic_is_checked_where_it_is_used() {
        let t = Topic::new("a/+/c");
        assert_eq!(t.as_str(), "a/+/c");
        assert_eq!(t.to_string(), "a/+/c");
        assert!(t.filter().is_ok());
        assert!(matches!(t.validate_name(), Err(Error::InvalidArgument(_))));
        assert_eq!(Topic::from("x"), Topic::new(String::from("x")));
        let long = Topic::new("a".repeat(MAX_TOPIC_LEN + 1));
        assert!(long.filter().is_err());
        assert!(long.validate_name().is_err());
    }

    #[test]
    fn overlapping_filters_deliver_once_and_stamp_the_header() {
        let b = PubSubBroker::new(PubSubConfig::default());
        let k = KernelId(5);
        b.subscribe(k, Topic::new("s/#")).unwrap();
        b.subscribe(k, Topic::new("s/+")).unwrap();
        b.subscribe(k, Topic::new("s/x")).unwrap();
        let ts = HlcClock::new(3).tick();
        let mut e = env(2.0);
        e.header.set_priority(crate::priority::HIGH);
        let r = b.publish(Topic::new("s/x"), KernelId(8), &e, ts).unwrap();
        assert_eq!((r.delivered, r.queue_full.len()), (1, 0));
        let got = b.take(k).unwrap();
        assert_eq!(got.len(), 1);
        let h = got[0].envelope.header;
        assert_eq!(h.source_kernel, 8);
        assert_eq!(h.hlc(), ts);
        assert_eq!(h.priority(), crate::priority::HIGH, "priority kept");
        assert_ne!(h.flags & flags::PUBSUB, 0);
        assert_ne!(h.message_id, 0);
        assert_eq!(got[0].envelope.payload, e.payload);
        // Message ids are fresh per publication.
        b.publish(Topic::new("s/x"), KernelId(8), &e, ts).unwrap();
        assert_ne!(
            b.take(k).unwrap()[0].envelope.header.message_id,
            h.message_id
        );
    }

    #[test]
    fn bad_inputs_leave_the_broker_unchanged() {
        let b = PubSubBroker::new(PubSubConfig::default().with_mailbox_capacity(1));
        let ts = HlcClock::new(3).tick();
        for f in ["", "#/a", "a+", "+a/b", "a/#/"] {
            assert!(b.subscribe(KernelId(1), Topic::new(f)).is_err(), "{f:?}");
        }
        assert!(b.subscriptions().is_empty());
        b.subscribe(KernelId(1), Topic::new("#")).unwrap();
        for t in ["", "+", "a/#", "a/+/b"] {
            assert!(b.publish(Topic::new(t), KernelId(2), env(1.0), ts).is_err());
        }
        assert_eq!((b.pending(KernelId(1)), b.overflowed(KernelId(1))), (0, 0));
        // `#` does not reach into `$` topics.
        let r = b
            .publish(Topic::new("$SYS/x"), KernelId(2), env(1.0), ts)
            .unwrap();
        assert_eq!(r.delivered, 0);
        // Unknown subscriptions and kernels.
        assert!(b.unsubscribe(SubscriptionId(99)).is_err());
        assert!(b.take(KernelId(42)).unwrap().is_empty());
        assert_eq!(
            (b.pending(KernelId(42)), b.overflowed(KernelId(42))),
            (0, 0)
        );
    }

    #[test]
    fn unsubscribing_stops_delivery_but_keeps_the_mailbox() {
        let b = PubSubBroker::new(PubSubConfig::default());
        let ts = HlcClock::new(3).tick();
        let id = b.subscribe(KernelId(1), Topic::new("t")).unwrap();
        b.publish(Topic::new("t"), KernelId::HOST, env(1.0), ts)
            .unwrap();
        b.unsubscribe(id).unwrap();
        let r = b
            .publish(Topic::new("t"), KernelId::HOST, env(2.0), ts)
            .unwrap();
        assert_eq!(r, PublishReport::default());
        let got = b.take(KernelId(1)).unwrap();
        assert_eq!(got.len(), 1, "what was delivered before stays until taken");
        assert_eq!(value(&got[0].envelope), 1.0);
    }
}
