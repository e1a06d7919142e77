//! [`KernelContext`]: what a CPU handler sees while it handles one message.

use crate::error::Result;
use crate::hlc::{HlcClock, HlcTimestamp};
use crate::ids::{K2kReceipt, KernelId, KernelTarget, PublishReport};
use crate::message::{check_payload_fits, flags, MessageHeader, RingMessage};
use crate::telemetry::KernelCounters;
use std::sync::atomic::Ordering;

/// Where a kernel's own outputs (replies, emits) go: its output queue. Implemented by
/// each backend's worker.
pub trait OutputSink {
    /// Writes one message into the kernel's output queue (waiting for space as the
    /// backend decides). Errors are reported to the handler.
    fn emit(&mut self, header: &MessageHeader, payload: &[u8]) -> Result<()>;
}

/// What a handler's context needs from its runtime: message ids, K2K delivery and
/// topic publishing. [`RuntimeCore`](crate::runtime::RuntimeCore) implements it (a
/// trait, so that this module does not depend on the runtime module that uses it).
pub trait MessageRouter: Send + Sync {
    /// A fresh message id, unique within the runtime.
    fn next_message_id(&self) -> u64;
    /// Routes one message into a kernel's input queue without blocking (see
    /// [`RuntimeCore::deliver`](crate::runtime::RuntimeCore::deliver)).
    fn deliver(
        &self,
        target: &KernelTarget,
        header: MessageHeader,
        payload: &[u8],
    ) -> Result<K2kReceipt>;
    /// Publishes one message to every kernel subscribed to `topic` (see
    /// [`RuntimeCore::publish_raw`](crate::runtime::RuntimeCore::publish_raw)).
    fn publish_raw(
        &self,
        topic: &str,
        header: MessageHeader,
        payload: &[u8],
    ) -> Result<PublishReport>;
}

/// A router owned by the worker running a handler, for one turn of messages: what
/// [`MessageRouter`] does, but with `&mut self`, so a worker can keep what it looked up
/// (destination kernels, a block of message ids, a clock reading) for its whole turn
/// instead of paying for shared state on every message, and count emitted messages
/// locally. Installed with [`KernelContext::with_turn_router`]; the CPU runtime's
/// worker uses it.
pub trait TurnRouter {
    /// A fresh message id, unique within the runtime.
    fn next_message_id(&mut self) -> u64;
    /// A physical time for this kernel's clock ([`HlcClock::tick_at`]): a reading of
    /// the clock's physical source taken at most one turn ago.
    fn physical_ms(&mut self) -> u64;
    /// A send event on the kernel's clock `hlc` (the timestamp of an outgoing
    /// message). By default [`HlcClock::tick_at`] with [`physical_ms`](Self::physical_ms);
    /// a router whose worker is the only thread advancing the clock during the turn may
    /// use [`HlcClock::tick_at_exclusive`] instead.
    #[inline]
    fn tick(&mut self, hlc: &HlcClock) -> HlcTimestamp {
        hlc.tick_at(self.physical_ms())
    }
    /// As [`MessageRouter::deliver`].
    fn deliver(
        &mut self,
        target: &KernelTarget,
        header: MessageHeader,
        payload: &[u8],
    ) -> Result<K2kReceipt>;
    /// As [`MessageRouter::publish_raw`].
    fn publish_raw(
        &mut self,
        topic: &str,
        header: MessageHeader,
        payload: &[u8],
    ) -> Result<PublishReport>;
    /// Counts `n` messages the handler emitted (replies, K2K sends, publishes); the
    /// router adds them to the kernel's `emitted` counter, at the latest when its turn
    /// ends.
    fn count_emitted(&mut self, n: u64);
}

/// Where a context sends: the runtime's shared router, or a worker's turn router.
enum Route<'a> {
    Shared(&'a dyn MessageRouter),
    Turn(&'a mut dyn TurnRouter),
}

/// The handler's view of its kernel and the runtime while handling one message.
pub struct KernelContext<'a> {
    id: KernelId,
    name: &'a str,
    core: Route<'a>,
    hlc: &'a HlcClock,
    counters: &'a KernelCounters,
    request: MessageHeader,
    slot_size: usize,
    priority: u8,
    sink: &'a mut dyn OutputSink,
}

impl<'a> KernelContext<'a> {
    /// Built by a backend's worker for each message.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: KernelId,
        name: &'a str,
        core: &'a dyn MessageRouter,
        hlc: &'a HlcClock,
        counters: &'a KernelCounters,
        request: MessageHeader,
        slot_size: usize,
        sink: &'a mut dyn OutputSink,
    ) -> Self {
        let normal = crate::priority::NORMAL;
        let core = Route::Shared(core);
        Self::build(
            id, name, core, hlc, counters, request, slot_size, normal, sink,
        )
    }

    /// As [`new`](Self::new) followed by [`with_priority`](Self::with_priority) and
    /// [`with_turn_router`](Self::with_turn_router), built in one go: what a worker
    /// running a turn of messages calls for each of them.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub fn in_turn(
        id: KernelId,
        name: &'a str,
        router: &'a mut dyn TurnRouter,
        hlc: &'a HlcClock,
        counters: &'a KernelCounters,
        request: MessageHeader,
        slot_size: usize,
        priority: u8,
        sink: &'a mut dyn OutputSink,
    ) -> Self {
        let core = Route::Turn(router);
        Self::build(
            id, name, core, hlc, counters, request, slot_size, priority, sink,
        )
    }

    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn build(
        id: KernelId,
        name: &'a str,
        core: Route<'a>,
        hlc: &'a HlcClock,
        counters: &'a KernelCounters,
        request: MessageHeader,
        slot_size: usize,
        priority: u8,
        sink: &'a mut dyn OutputSink,
    ) -> Self {
        KernelContext {
            id,
            name,
            core,
            hlc,
            counters,
            request,
            slot_size,
            priority,
            sink,
        }
    }

    /// Sets the priority of everything the handler sends (replies, emits, K2K sends,
    /// publishes): the kernel's [`LaunchOptions::priority`](crate::options::LaunchOptions::priority).
    /// [`NORMAL`](crate::priority::NORMAL) unless a backend sets it.
    pub fn with_priority(mut self, priority: u8) -> Self {
        self.priority = priority;
        self
    }

    /// Routes everything the handler sends through `router` (a worker's per-turn
    /// router) instead of the runtime's shared one: message ids, clock readings, K2K
    /// delivery, publishing and the `emitted` count then go through it.
    pub fn with_turn_router(mut self, router: &'a mut dyn TurnRouter) -> Self {
        self.core = Route::Turn(router);
        self
    }

    /// The priority this kernel's outputs carry.
    pub fn priority(&self) -> u8 {
        self.priority
    }

    /// This kernel's id.
    pub fn kernel_id(&self) -> KernelId {
        self.id
    }
    /// This kernel's instance name.
    pub fn name(&self) -> &str {
        self.name
    }
    /// Header of the message being handled.
    pub fn request(&self) -> &MessageHeader {
        &self.request
    }
    /// HLC timestamp of the message being handled (as merged into this kernel's clock).
    pub fn request_timestamp(&self) -> HlcTimestamp {
        self.request.hlc()
    }
    /// Sets the timestamp [`request_timestamp`](Self::request_timestamp) returns (and
    /// the request header carries): for a backend's worker, which builds the context
    /// from the header as it arrived and then stamps it with the time merged into the
    /// kernel's clock. Stamping the context in place, not a copy of the header that is
    /// then moved into it, spares the CPU worker a store-forwarding stall per message.
    #[inline]
    pub fn set_request_timestamp(&mut self, ts: HlcTimestamp) {
        self.request.set_hlc(ts);
    }
    /// This kernel's clock.
    pub fn clock(&self) -> &HlcClock {
        self.hlc
    }

    /// A header for an `M` of `size` payload bytes (its encoding flag included).
    #[inline(always)]
    fn header_for<M: RingMessage>(
        &mut self,
        extra_flags: u32,
        size: usize,
    ) -> Result<MessageHeader> {
        check_payload_fits(size, self.slot_size)?;
        let (id, ts) = match &mut self.core {
            Route::Shared(r) => (r.next_message_id(), self.hlc.tick()),
            Route::Turn(r) => (r.next_message_id(), r.tick(self.hlc)),
        };
        // Every field written once (no default header overwritten field by field).
        Ok(MessageHeader {
            magic: crate::message::MESSAGE_MAGIC,
            version: crate::message::MESSAGE_VERSION,
            type_id: M::TYPE_ID,
            payload_len: size as u32,
            message_id: id,
            correlation_id: self.request.correlation_id,
            source_kernel: self.id.0,
            dest_kernel: 0,
            timestamp: ts.packed(),
            checksum: 0,
            flags: ((extra_flags | M::header_flags()) & !flags::PRIORITY_MASK)
                | (u32::from(self.priority) << flags::PRIORITY_SHIFT),
            node_id: ts.node(),
        })
    }

    /// Replies to the current message: into this kernel's output queue, with the
    /// request's `correlation_id` (so [`KernelHandle::call`](crate::runtime::KernelHandle::call)
    /// finds it) and the REPLY flag.
    #[inline]
    pub fn reply<M: RingMessage>(&mut self, msg: &M) -> Result<()> {
        let payload = msg.encode_payload()?;
        let mut h = self.header_for::<M>(flags::REPLY, payload.len())?;
        h.dest_kernel = self.request.source_kernel;
        self.sink.emit(&h, &payload)?;
        self.count_emitted(1);
        Ok(())
    }

    /// Writes a message into this kernel's output queue without marking it a reply
    /// (the request's correlation id is still carried).
    pub fn emit<M: RingMessage>(&mut self, msg: &M) -> Result<()> {
        let payload = msg.encode_payload()?;
        let h = self.header_for::<M>(0, payload.len())?;
        self.sink.emit(&h, &payload)?;
        self.count_emitted(1);
        Ok(())
    }

    /// Sends to another kernel's input queue (K2K), by id or instance name. The
    /// request's correlation id travels along, so the last stage of a pipeline can
    /// reply to the host's original call. Never blocks: a full destination is
    /// [`K2kReceipt::QueueFull`]. A payload too large for this kernel's slots is
    /// [`Error::MessageTooLarge`](crate::Error::MessageTooLarge).
    #[inline]
    pub fn send_to<M: RingMessage>(
        &mut self,
        target: impl Into<KernelTarget>,
        msg: &M,
    ) -> Result<K2kReceipt> {
        let payload = msg.encode_payload()?;
        let h = self.header_for::<M>(flags::K2K, payload.len())?;
        let target = target.into();
        let r = match &mut self.core {
            Route::Shared(c) => c.deliver(&target, h, &payload)?,
            Route::Turn(c) => c.deliver(&target, h, &payload)?,
        };
        if r == K2kReceipt::Delivered {
            self.count_emitted(1);
        }
        Ok(r)
    }

    /// Publishes to a topic: delivered into every subscribed kernel's input queue.
    /// Returns how many kernels received it.
    pub fn publish<M: RingMessage>(&mut self, topic: &str, msg: &M) -> Result<usize> {
        let payload = msg.encode_payload()?;
        let h = self.header_for::<M>(flags::PUBSUB, payload.len())?;
        let report = match &mut self.core {
            Route::Shared(c) => c.publish_raw(topic, h, &payload)?,
            Route::Turn(c) => c.publish_raw(topic, h, &payload)?,
        };
        self.count_emitted(report.delivered as u64);
        Ok(report.delivered)
    }

    fn count_emitted(&mut self, n: u64) {
        match &mut self.core {
            Route::Shared(_) => {
                self.counters.emitted.fetch_add(n, Ordering::Relaxed);
            }
            Route::Turn(r) => r.count_emitted(n),
        }
    }
}
