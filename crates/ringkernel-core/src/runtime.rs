//! The runtime traits and the machinery every backend shares.
//!
//! A backend implements two things:
//!
//! * [`KernelEngine`]: one launched kernel: its queues, worker and lifecycle, with
//!   non-blocking `try_enqueue`/`try_dequeue` and [`KernelEvents`] to wake waiters.
//! * [`RingKernelRuntime`]: `launch` (create an engine from a registered handler) on top
//!   of a shared [`RuntimeCore`] (kernel table, ids, host clock, pub/sub broker, K2K
//!   routing, handler registry).
//!
//! Everything a user calls on a kernel ([`KernelHandle`]: async send with backpressure,
//! receive with timeout, correlated `call`, lifecycle, metrics) is written once here
//! on top of those, so it behaves the same on every backend.

use crate::backend::BackendKind;
use crate::context::MessageRouter;
use crate::error::{Error, Result};
use crate::hlc::{HlcClock, HlcTimestamp};
pub use crate::ids::KernelId;
use crate::k2k::{k2k_disabled, K2kBroker, K2kHost, K2kReceipt, KernelTarget};
use crate::lifecycle::LifecycleState;
use crate::message::{
    check_header, check_payload_fits, Envelope, MessageCodec, MessageHeader, MessageId, Payload,
    RingMessage,
};
use crate::options::LaunchOptions;
use crate::priority;
pub use crate::pubsub::PublishReport;
use crate::pubsub::{validate_topic, Broker, PubSubBroker, PubSubHost, SubscriptionId};
use crate::registry::KernelRegistry;
use crate::telemetry::{KernelMetrics, RuntimeMetrics};
use crate::util::{lock, prefetch, BoxFuture};
use event_listener::{Event, EventListener};
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// Wake-ups a backend raises so async waiters never poll or block.
#[derive(Debug, Default)]
pub struct KernelEvents {
    /// Raised after the worker writes into the output queue.
    pub output: Event,
    /// Raised after the worker frees input slots.
    pub input_space: Event,
    /// Raised after every lifecycle change.
    pub state: Event,
}

impl KernelEvents {
    /// Wakes every waiter of every kind (used on termination).
    pub fn notify_all(&self) {
        self.output.notify(usize::MAX);
        self.input_space.notify(usize::MAX);
        self.state.notify(usize::MAX);
    }
}

/// What termination did with messages still in flight. Nothing is dropped silently:
/// a message was either processed, or it is returned here.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TerminateReport {
    /// Messages the handler processed after termination was requested (the drain).
    pub drained: u64,
    /// Messages that were in the input queue and were not processed (the kernel was not
    /// active, so it did not run its handler on them), handed back to the caller.
    pub undelivered: Vec<Envelope>,
    /// Replies still waiting in the output queue; they can still be received.
    pub replies_waiting: usize,
}

/// Headers the default [`KernelEngine::try_enqueue_run`] builds at a time.
pub const RUN_BLOCK: usize = 1024;

/// What [`KernelEngine::try_dequeue_runs_with`] hands each piece of the output queue
/// to: `(first header, payloads, count)`, returning `(consumed, go on)`. The `count`
/// payloads, `first.payload_len` bytes each, lie at a stride of that length rounded up
/// to 8 bytes: [`run_payload`] takes one out.
pub type TakeRun<'a> = dyn FnMut(&MessageHeader, &[u8], usize) -> (usize, bool) + 'a;

/// Checks the arguments of [`KernelEngine::try_enqueue_fixed_run`]: `len` is not 0
/// and divides `bytes.len()`.
///
/// ```
/// use ringkernel_core::runtime::check_fixed_run;
/// assert!(check_fixed_run(&[0; 144], 72).is_ok());
/// assert!(check_fixed_run(&[0; 144], 0).is_err());
/// assert!(check_fixed_run(&[0; 100], 72).is_err());
/// ```
pub fn check_fixed_run(bytes: &[u8], len: usize) -> Result<()> {
    if len == 0 || !bytes.len().is_multiple_of(len) {
        return Err(Error::invalid(format!(
            "a run of {} bytes cannot hold payloads of {len} bytes each",
            bytes.len()
        )));
    }
    Ok(())
}

/// Payload `i` of a run's `payloads` (see [`TakeRun`]), each `len` bytes long.
#[inline]
pub fn run_payload(payloads: &[u8], len: usize, i: usize) -> &[u8] {
    let at = i * len.next_multiple_of(8);
    &payloads[at..at + len]
}

/// How many payloads ahead of the one it decodes a batch receive prefetches
/// (`KernelHandle::receive_batch_into`): about 1 KiB of 72-byte payloads, which covers
/// a cross-core miss at the ~20 ns a message that decoding takes.
const DECODE_PREFETCH: usize = 16;

/// The payloads of a run of messages (as [`KernelHandle::send_batch`] enqueues
/// them): a list, or plain data back to back
/// ([`KernelEngine::try_enqueue_fixed_run`]).
#[derive(Clone, Copy, Debug)]
pub enum RunPayloads<'a, 'p> {
    /// One payload each.
    Each(&'a [Payload<'p>]),
    /// The bytes, and each payload's length (not 0, dividing the bytes' length).
    Fixed(&'a [u8], usize),
}

impl<'a, 'p> RunPayloads<'a, 'p> {
    /// How many payloads.
    #[inline]
    pub fn count(&self) -> usize {
        match self {
            RunPayloads::Each(p) => p.len(),
            RunPayloads::Fixed(b, len) => b.len() / len,
        }
    }
    /// Payload `i`.
    #[inline]
    pub fn get(&self, i: usize) -> &'a [u8] {
        match *self {
            RunPayloads::Each(p) => &p[i],
            RunPayloads::Fixed(b, len) => &b[i * len..(i + 1) * len],
        }
    }
    /// The length of payload `i`.
    #[inline]
    pub fn len_at(&self, i: usize) -> usize {
        match self {
            RunPayloads::Each(p) => p[i].len(),
            RunPayloads::Fixed(_, len) => *len,
        }
    }
    /// The `n` payloads from `from`.
    #[inline]
    pub fn part(&self, from: usize, n: usize) -> RunPayloads<'a, 'p> {
        match *self {
            RunPayloads::Each(p) => RunPayloads::Each(&p[from..from + n]),
            RunPayloads::Fixed(b, len) => RunPayloads::Fixed(&b[from * len..(from + n) * len], len),
        }
    }
    fn try_enqueue(&self, engine: &dyn KernelEngine, first: &MessageHeader) -> Result<usize> {
        match *self {
            RunPayloads::Each(p) => engine.try_enqueue_run(first, p),
            RunPayloads::Fixed(b, len) => engine.try_enqueue_fixed_run(first, b, len),
        }
    }
}

/// One launched kernel, as a backend implements it. All methods are non-blocking.
pub trait KernelEngine: Send + Sync + 'static {
    /// Kernel id.
    fn id(&self) -> KernelId;
    /// Instance name.
    fn name(&self) -> &str;
    /// Current lifecycle state.
    fn state(&self) -> LifecycleState;
    /// Slot size of the queues, bytes.
    fn slot_size(&self) -> usize;
    /// Input capacity in slots of one priority lane (each of the
    /// [`LANES`](crate::priority::LANES) lanes holds this many).
    fn input_capacity(&self) -> usize;
    /// Puts one message (header already stamped) into the input queue.
    /// [`Error::QueueFull`] when there is no slot, [`Error::KernelTerminated`] once the
    /// kernel is terminating or terminated, [`Error::MessageTooLarge`] for an oversized
    /// payload. Counts `received` on success.
    fn try_enqueue(&self, header: &MessageHeader, payload: &[u8]) -> Result<()>;
    /// Puts the messages of `batch` (headers already stamped) into the input queue in
    /// order, as [`try_enqueue`](Self::try_enqueue) would one by one, and returns how
    /// many it took: it stops at the first that does not fit. An error comes back only
    /// when not even the first was taken. The default loops over `try_enqueue`; an
    /// engine that can take a batch under one lock, with one wake-up of its worker,
    /// overrides it.
    fn try_enqueue_batch(&self, batch: &[(MessageHeader, &[u8])]) -> Result<usize> {
        for (i, (h, p)) in batch.iter().enumerate() {
            if let Err(e) = self.try_enqueue(h, p) {
                return if i > 0 { Ok(i) } else { Err(e) };
            }
        }
        Ok(batch.len())
    }
    /// Puts a run of messages of one type, stamped as one block, into the input queue
    /// in order: message `i` has the header [`first.nth_of_run(i,
    /// payloads[i].len())`](MessageHeader::nth_of_run) and the payload `payloads[i]`.
    /// Returns how many it took, with the rules of
    /// [`try_enqueue_batch`](Self::try_enqueue_batch). The default builds the headers
    /// in blocks of [`RUN_BLOCK`] and hands each block to `try_enqueue_batch`; an
    /// engine that keeps waiting messages as bytes (the drain engine) writes each
    /// header straight into its queue instead.
    fn try_enqueue_run(&self, first: &MessageHeader, payloads: &[Payload<'_>]) -> Result<usize> {
        let mut block: Vec<(MessageHeader, &[u8])> =
            Vec::with_capacity(payloads.len().min(RUN_BLOCK));
        let mut done = 0;
        while done < payloads.len() {
            block.clear();
            block.extend(
                payloads[done..]
                    .iter()
                    .take(RUN_BLOCK)
                    .enumerate()
                    .map(|(j, p)| (first.nth_of_run((done + j) as u64, p.len()), &p[..])),
            );
            match self.try_enqueue_batch(&block) {
                Ok(n) => {
                    done += n;
                    if n < block.len() {
                        break;
                    }
                }
                Err(e) if done == 0 => return Err(e),
                Err(_) => break,
            }
        }
        Ok(done)
    }
    /// [`try_enqueue_run`](Self::try_enqueue_run) for a run whose payloads are all
    /// `len` bytes long and lie back to back in `bytes` (payload `i` is
    /// `bytes[i * len..(i + 1) * len]`; plain data, [`MessageCodec::run_bytes`]), so
    /// that no payload list is built. `len` is not 0 and divides `bytes.len()`
    /// ([`Error::InvalidArgument`] otherwise). The default builds the list and calls
    /// `try_enqueue_run`; the drain engine takes the bytes as they are.
    fn try_enqueue_fixed_run(
        &self,
        first: &MessageHeader,
        bytes: &[u8],
        len: usize,
    ) -> Result<usize> {
        check_fixed_run(bytes, len)?;
        let payloads: Vec<Payload<'_>> = bytes.chunks_exact(len).map(Payload::Borrowed).collect();
        self.try_enqueue_run(first, &payloads)
    }
    /// Takes the oldest message out of the output queue.
    fn try_dequeue(&self) -> Result<Option<Envelope>>;
    /// Moves up to `max` of the oldest messages of the output queue to the end of
    /// `out`, in order, and returns how many. The default loops over
    /// [`try_dequeue`](Self::try_dequeue).
    fn try_dequeue_batch(&self, out: &mut Vec<Envelope>, max: usize) -> Result<usize> {
        let mut n = 0;
        while n < max {
            match self.try_dequeue()? {
                Some(env) => out.push(env),
                None => break,
            }
            n += 1;
        }
        Ok(n)
    }
    /// Hands up to `max` of the oldest messages of the output queue to `take`, in
    /// order, each removed from the queue, without building an [`Envelope`] for each
    /// (an engine that keeps replies as bytes reads them in place); stops after a
    /// message for which `take` returns `false`. Returns how many were handed over.
    /// `take` must not call back into this kernel. The default goes through
    /// [`try_dequeue`](Self::try_dequeue).
    fn try_dequeue_batch_with(
        &self,
        max: usize,
        take: &mut dyn FnMut(&MessageHeader, &[u8]) -> bool,
    ) -> Result<usize> {
        let mut n = 0;
        while n < max {
            let Some(env) = self.try_dequeue()? else {
                break;
            };
            n += 1;
            if !take(&env.header, &env.payload) {
                break;
            }
        }
        Ok(n)
    }
    /// As [`try_dequeue_batch_with`](Self::try_dequeue_batch_with), a piece at a time:
    /// `take(first, payloads, count)` gets `count` messages at once (several where the
    /// engine keeps them as a run of one type and size, stamped as one block): message
    /// `i` of the piece has the header [`first.nth_of_run(i,
    /// len)`](MessageHeader::nth_of_run) and the payload `payloads[i * stride..][..len]`,
    /// where `len` is `first.payload_len` and `stride` is `len` rounded up to a
    /// multiple of 8. `take` returns how many of them it consumed, from the front (at
    /// least one; those are removed), and whether to go on; consuming fewer than
    /// `count` ends the call. Returns how many messages were consumed, at most `max`.
    /// `take` must not call back into this kernel. The default hands over one message
    /// at a time through `try_dequeue_batch_with`.
    fn try_dequeue_runs_with(&self, max: usize, take: &mut TakeRun<'_>) -> Result<usize> {
        self.try_dequeue_batch_with(max, &mut |header, payload| take(header, payload, 1).1)
    }
    /// Makes what progress it can on device work in flight without blocking, on the
    /// calling thread (e.g. finishes a drain pass the device has completed, so that its
    /// replies are queued without waking another thread first); returns whether it did
    /// anything. Receivers call it while they look for a reply. The default does
    /// nothing.
    fn progress(&self) -> bool {
        false
    }
    /// How long a receiver should look for a reply (calling
    /// [`progress`](Self::progress)) before it sleeps on the output event: about what a
    /// round trip through this kernel takes. `None` (the default) leaves it to the
    /// handle (a few microseconds).
    fn reply_wait(&self) -> Option<Duration> {
        None
    }
    /// Messages in the output queue.
    fn output_depth(&self) -> usize;
    /// `Launched|Deactivated → Active`.
    fn activate(&self) -> Result<()>;
    /// `Active → Deactivated`: queued messages are kept.
    fn deactivate(&self) -> Result<()>;
    /// `→ Terminating → Terminated`; resolves when the worker has exited.
    fn terminate(&self) -> BoxFuture<'_, Result<TerminateReport>>;
    /// Wake-up events.
    fn events(&self) -> &KernelEvents;
    /// Whether this kernel's handler can read a message with this header, checked on
    /// the host before the message enters the queue (sends and
    /// [`RuntimeCore::deliver`]). The default accepts everything; GPU engines whose
    /// handler declares its inputs ([`GpuHandler::with_input`](crate::registry::GpuHandler::with_input))
    /// answer with [`GpuHandler::accepts`](crate::registry::GpuHandler::accepts), e.g.
    /// [`Error::EncodingMismatch`] for an rkyv message to a plain-data handler.
    fn accepts(&self, _header: &MessageHeader) -> Result<()> {
        Ok(())
    }
    /// Metrics snapshot.
    fn metrics(&self) -> KernelMetrics;
}

/// State shared by all backends' runtimes: kernel table, ids, host clock, broker,
/// registry. Backends embed one in an `Arc` and build on it.
pub struct RuntimeCore {
    backend: BackendKind,
    kernels: RwLock<HashMap<KernelId, Arc<dyn KernelEngine>>>,
    names: RwLock<HashMap<String, KernelId>>,
    next_kernel: AtomicU32,
    next_message: AtomicU64,
    node: u32,
    hlc: HlcClock,
    broker: Broker,
    k2k: AtomicBool,
    registry: KernelRegistry,
    started: Instant,
}

impl std::fmt::Debug for RuntimeCore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeCore")
            .field("backend", &self.backend)
            .field(
                "kernels",
                &self.kernels.read().map(|k| k.len()).unwrap_or(0),
            )
            .finish()
    }
}

impl RuntimeCore {
    /// A core for `backend` resolving handler names through `registry`, with a fresh
    /// node number ([`default_node_number`]).
    pub fn new(backend: BackendKind, registry: KernelRegistry) -> Arc<Self> {
        Self::with_node(backend, registry, default_node_number())
    }

    /// A core whose clocks carry node number `node` ([`crate::hlc`]: the host clock's
    /// node id is `node << 32`, kernel `k`'s is `node << 32 | k`). Runtimes that
    /// exchange timestamps need distinct node numbers.
    pub fn with_node(backend: BackendKind, registry: KernelRegistry, node: u32) -> Arc<Self> {
        Arc::new(RuntimeCore {
            backend,
            kernels: RwLock::new(HashMap::new()),
            names: RwLock::new(HashMap::new()),
            next_kernel: AtomicU32::new(1),
            next_message: AtomicU64::new(1),
            node,
            hlc: HlcClock::new(u64::from(node) << 32),
            broker: Broker::new(),
            k2k: AtomicBool::new(true),
            registry,
            started: Instant::now(),
        })
    }

    /// The backend this core serves.
    pub fn backend(&self) -> BackendKind {
        self.backend
    }
    /// The handler registry.
    pub fn registry(&self) -> &KernelRegistry {
        &self.registry
    }
    /// The host's clock.
    pub fn hlc(&self) -> &HlcClock {
        &self.hlc
    }
    /// This runtime's node number (the upper half of its clocks' node ids).
    pub fn node_number(&self) -> u32 {
        self.node
    }
    /// The node id of kernel `id`'s clock: `node << 32 | id`.
    pub fn kernel_node_id(&self, id: KernelId) -> u64 {
        (u64::from(self.node) << 32) | u64::from(id.0)
    }
    /// The pub/sub broker.
    pub fn broker(&self) -> &Broker {
        &self.broker
    }
    /// Whether kernel-to-kernel messaging is enabled (the default).
    #[inline]
    pub fn k2k_enabled(&self) -> bool {
        self.k2k.load(Ordering::Acquire)
    }
    /// Enables or disables kernel-to-kernel messaging. While disabled, every K2K send
    /// (a handler's `send_to`, a GPU pass's routed message, [`K2kBroker::send`]) is
    /// refused with [`Error::InvalidArgument`] naming the switch, and
    /// [`RingKernelRuntime::k2k_broker`] is `None`. Host sends and pub/sub are not
    /// affected.
    pub fn set_k2k_enabled(&self, enabled: bool) {
        self.k2k.store(enabled, Ordering::Release);
    }
    /// A fresh message id (unique within this runtime).
    pub fn next_message_id(&self) -> u64 {
        self.next_message.fetch_add(1, Ordering::Relaxed)
    }

    /// Reserves `n` fresh message ids at once and returns the first: `first..first + n`
    /// are unique within this runtime (a worker or a drain pass hands them out one by
    /// one without touching the shared counter per message). Ids are unique, not
    /// ordered across reservations.
    ///
    /// ```
    /// # use ringkernel_core::{backend::BackendKind, registry::KernelRegistry, runtime::RuntimeCore};
    /// let core = RuntimeCore::new(BackendKind::Cpu, KernelRegistry::new());
    /// let first = core.reserve_message_ids(64);
    /// assert!(core.next_message_id() >= first + 64);
    /// ```
    pub fn reserve_message_ids(&self, n: u64) -> u64 {
        self.next_message.fetch_add(n, Ordering::Relaxed)
    }

    /// Reserves a kernel id for instance `name`. [`Error::InvalidArgument`] if a live
    /// kernel already has that name.
    pub fn reserve(&self, name: &str) -> Result<KernelId> {
        let mut names = self.names.write().expect("names lock");
        if names.contains_key(name) {
            return Err(Error::invalid(format!(
                "a kernel named {name:?} is already running"
            )));
        }
        let id = KernelId(self.next_kernel.fetch_add(1, Ordering::Relaxed));
        names.insert(name.to_string(), id);
        Ok(id)
    }

    /// Releases a reservation whose launch failed.
    pub fn release(&self, name: &str) {
        self.names.write().expect("names lock").remove(name);
    }

    /// Makes a launched engine reachable (K2K, pub/sub, lookups).
    pub fn insert(&self, engine: Arc<dyn KernelEngine>) {
        self.kernels
            .write()
            .expect("kernels lock")
            .insert(engine.id(), engine);
    }

    /// Removes a terminated kernel from the tables and its subscriptions.
    pub fn remove(&self, id: KernelId) {
        let engine = self.kernels.write().expect("kernels lock").remove(&id);
        if let Some(e) = engine {
            let mut names = self.names.write().expect("names lock");
            if names.get(e.name()) == Some(&id) {
                names.remove(e.name());
            }
        }
        self.broker.remove_kernel(id);
    }

    /// Looks a live kernel up by id or name.
    pub fn lookup(&self, target: &KernelTarget) -> Option<Arc<dyn KernelEngine>> {
        let id = match target {
            KernelTarget::Id(id) => *id,
            KernelTarget::Name(n) => *self.names.read().expect("names lock").get(n.as_str())?,
        };
        self.kernels.read().expect("kernels lock").get(&id).cloned()
    }

    /// Every live kernel, by id.
    pub fn engines(&self) -> Vec<Arc<dyn KernelEngine>> {
        let mut v: Vec<_> = self
            .kernels
            .read()
            .expect("kernels lock")
            .values()
            .cloned()
            .collect();
        v.sort_by_key(|e| e.id());
        v
    }

    /// Routes one message into a kernel's input queue (K2K, host-side routing between
    /// GPU passes). Never blocks. `MessageTooLarge` is an error; a missing or
    /// terminated kernel and a full queue are receipts.
    pub fn deliver(
        &self,
        target: &KernelTarget,
        header: MessageHeader,
        payload: &[u8],
    ) -> Result<K2kReceipt> {
        if header.flags & crate::message::flags::K2K != 0 && !self.k2k_enabled() {
            return Err(k2k_disabled());
        }
        let Some(engine) = self.lookup(target) else {
            return Ok(K2kReceipt::NotFound);
        };
        self.deliver_to(engine.as_ref(), header, payload)
    }

    /// [`deliver`](Self::deliver) to an engine the caller already looked up (with
    /// [`lookup`](Self::lookup), or a backend's own table of its engines; a worker
    /// sending many messages to one kernel keeps it for a while instead of looking it
    /// up per message). Same checks and receipts: a
    /// K2K message while K2K is disabled is an error, a terminated kernel is
    /// [`K2kReceipt::NotFound`].
    #[inline]
    pub fn deliver_to<E: KernelEngine + ?Sized>(
        &self,
        engine: &E,
        mut header: MessageHeader,
        payload: &[u8],
    ) -> Result<K2kReceipt> {
        if header.flags & crate::message::flags::K2K != 0 && !self.k2k_enabled() {
            return Err(k2k_disabled());
        }
        check_payload_fits(payload.len(), engine.slot_size())?;
        engine.accepts(&header)?;
        header.dest_kernel = engine.id().0;
        match engine.try_enqueue(&header, payload) {
            Ok(()) => Ok(K2kReceipt::Delivered),
            Err(Error::QueueFull { .. }) => Ok(K2kReceipt::QueueFull),
            Err(Error::KernelTerminated(_)) => Ok(K2kReceipt::NotFound),
            Err(e) => Err(e),
        }
    }

    /// Publishes one message to `topic`: a copy goes into the input queue of every
    /// kernel subscribed with a matching filter.
    pub fn publish_raw(
        &self,
        topic: &str,
        header: MessageHeader,
        payload: &[u8],
    ) -> Result<PublishReport> {
        validate_topic(topic)?;
        let mut report = PublishReport::default();
        for id in self.broker.subscribers(topic)? {
            let mut h = header;
            h.flags |= crate::message::flags::PUBSUB;
            match self.deliver(&KernelTarget::Id(id), h, payload)? {
                K2kReceipt::Delivered => report.delivered += 1,
                K2kReceipt::QueueFull => report.queue_full.push(id),
                K2kReceipt::NotFound => report.not_found.push(id),
            }
        }
        Ok(report)
    }

    /// Stamps a message the host sends: a fresh message id (also its correlation id)
    /// and a tick of the host clock.
    pub fn stamp_from_host(&self, h: &mut MessageHeader) {
        h.message_id = self.next_message_id();
        h.correlation_id = h.message_id;
        h.set_hlc(self.hlc.tick());
    }

    /// Publishes a typed message from the host (priority [`NORMAL`](priority::NORMAL)).
    pub fn publish<M: RingMessage>(&self, topic: &str, msg: &M) -> Result<PublishReport> {
        let payload = msg.encode_payload()?;
        let mut h = MessageHeader::new(M::TYPE_ID, payload.len());
        h.flags |= M::header_flags();
        h.set_priority(priority::NORMAL);
        self.stamp_from_host(&mut h);
        self.publish_raw(topic, h, &payload)
    }

    /// Metrics of every live kernel.
    pub fn metrics(&self) -> RuntimeMetrics {
        let kernels = self.engines().iter().map(|e| e.metrics()).collect();
        RuntimeMetrics::from_kernels(self.backend, self.started.elapsed(), kernels)
    }

    /// Wraps an engine in a user-facing handle.
    pub fn handle(
        self: &Arc<Self>,
        engine: Arc<dyn KernelEngine>,
        opts: &LaunchOptions,
    ) -> KernelHandle {
        KernelHandle {
            inner: Arc::new(HandleInner {
                engine,
                core: self.clone(),
                stash: Mutex::new(VecDeque::new()),
                wait_when_full: opts.wait_when_full,
            }),
        }
    }

    /// Terminates every live kernel (used by `shutdown`).
    pub async fn terminate_all(&self) -> Result<ShutdownReport> {
        let mut report = ShutdownReport::default();
        for e in self.engines() {
            if matches!(
                e.state(),
                LifecycleState::Terminated | LifecycleState::Terminating
            ) {
                self.remove(e.id());
                continue;
            }
            let r = e.terminate().await?;
            self.remove(e.id());
            report.kernels += 1;
            report.drained += r.drained;
            report.undelivered += r.undelivered.len();
        }
        Ok(report)
    }
}

impl MessageRouter for RuntimeCore {
    fn next_message_id(&self) -> u64 {
        RuntimeCore::next_message_id(self)
    }
    fn deliver(
        &self,
        target: &KernelTarget,
        header: MessageHeader,
        payload: &[u8],
    ) -> Result<K2kReceipt> {
        RuntimeCore::deliver(self, target, header, payload)
    }
    fn publish_raw(
        &self,
        topic: &str,
        header: MessageHeader,
        payload: &[u8],
    ) -> Result<PublishReport> {
        RuntimeCore::publish_raw(self, topic, header, payload)
    }
}

impl K2kHost for RuntimeCore {
    fn k2k_enabled(&self) -> bool {
        RuntimeCore::k2k_enabled(self)
    }
    fn live_kernel(&self, target: &KernelTarget) -> Option<KernelId> {
        self.lookup(target).map(|e| e.id())
    }
    fn tick(&self) -> HlcTimestamp {
        self.hlc.tick()
    }
}

impl PubSubHost for RuntimeCore {
    fn broker(&self) -> &Broker {
        &self.broker
    }
    fn is_live(&self, kernel: KernelId) -> bool {
        self.lookup(&KernelTarget::Id(kernel)).is_some()
    }
    fn merge_timestamp(&self, ts: &HlcTimestamp) -> Result<()> {
        self.hlc.update(ts).map(|_| ())
    }
}

/// A lifecycle request for the state the kernel is already in is a no-op: the engine's
/// `InvalidState { from: s, to: s }` becomes `Ok`.
fn already_there(r: Result<()>, state: LifecycleState) -> Result<()> {
    match r {
        Err(Error::InvalidState { from, to }) if from == state && to == state => Ok(()),
        r => r,
    }
}

/// A node number for a runtime that was given none: process id, a per-process counter
/// and the wall clock, mixed, so runtimes in one process and in different processes get
/// different numbers with overwhelming probability. Never 0.
pub fn default_node_number() -> u32 {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    // splitmix64 finaliser over the three inputs.
    let mut x = t
        ^ (u64::from(std::process::id()) << 32)
        ^ u64::from(n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    (x as u32).max(1)
}

/// What `shutdown` did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Kernels terminated.
    pub kernels: usize,
    /// Messages processed while draining.
    pub drained: u64,
    /// Messages that were queued on inactive kernels and not processed.
    pub undelivered: usize,
}

/// A runtime on one backend: launches kernels and owns their shared state.
pub trait RingKernelRuntime: Send + Sync {
    /// The shared core.
    fn core(&self) -> &Arc<RuntimeCore>;

    /// Launches a kernel running the handler registered as `handler`.
    /// [`Error::KernelNotFound`] if no handler of that name exists for this backend.
    fn launch<'a>(
        &'a self,
        handler: &'a str,
        opts: LaunchOptions,
    ) -> BoxFuture<'a, Result<KernelHandle>>;

    /// A one-line description of the device the runtime runs on.
    fn device_info(&self) -> String;

    /// Terminates every kernel (draining active ones) and releases the backend.
    fn shutdown(&self) -> BoxFuture<'_, Result<ShutdownReport>> {
        Box::pin(async move { self.core().terminate_all().await })
    }

    /// The backend.
    fn backend(&self) -> BackendKind {
        self.core().backend()
    }

    /// A handle to a live kernel, by id or instance name.
    fn kernel(&self, target: &KernelTarget) -> Option<KernelHandle> {
        let e = self.core().lookup(target)?;
        Some(self.core().handle(e, &LaunchOptions::default()))
    }

    /// Subscribes a kernel to an MQTT-style topic filter.
    fn subscribe(&self, kernel: KernelId, filter: &str) -> Result<SubscriptionId> {
        if self.core().lookup(&KernelTarget::Id(kernel)).is_none() {
            return Err(Error::KernelNotFound(format!("kernel {kernel}")));
        }
        self.core().broker().subscribe(filter, kernel)
    }

    /// Removes a subscription.
    fn unsubscribe(&self, id: SubscriptionId) -> Result<()> {
        self.core().broker().unsubscribe(id)
    }

    /// Publishes an already-built message to a topic, at the envelope's priority.
    fn publish_envelope(&self, topic: &str, env: &Envelope) -> Result<PublishReport> {
        let mut h = env.header;
        self.core().stamp_from_host(&mut h);
        self.core().publish_raw(topic, h, &env.payload)
    }

    /// Runtime-wide metrics snapshot.
    fn metrics(&self) -> RuntimeMetrics {
        self.core().metrics()
    }

    /// The kernel-to-kernel broker: sends an envelope from one kernel of this runtime
    /// straight into another's input queue, with a receipt. `None` when K2K messaging
    /// is disabled for this runtime ([`set_k2k_enabled`](RingKernelRuntime::set_k2k_enabled));
    /// it is enabled by default.
    fn k2k_broker(&self) -> Option<K2kBroker> {
        let core = self.core();
        core.k2k_enabled()
            .then(|| K2kBroker::new(core.clone() as Arc<dyn K2kHost>))
    }

    /// Enables or disables K2K messaging on this runtime (see
    /// [`RuntimeCore::set_k2k_enabled`]).
    fn set_k2k_enabled(&self, enabled: bool) {
        self.core().set_k2k_enabled(enabled)
    }

    /// This runtime's topic broker in the form of [`PubSubBroker`]: subscriptions name
    /// live kernels and publications go into their input queues (the same subscriptions
    /// as [`subscribe`](RingKernelRuntime::subscribe)).
    fn pubsub(&self) -> PubSubBroker {
        PubSubBroker::attached(self.core().clone() as Arc<dyn PubSubHost>)
    }
}

struct HandleInner {
    engine: Arc<dyn KernelEngine>,
    core: Arc<RuntimeCore>,
    /// Replies taken out of the output queue while looking for another one (by `call`);
    /// kept in arrival order for later receives.
    stash: Mutex<VecDeque<Envelope>>,
    wait_when_full: bool,
}

/// A user's handle to one kernel. Cheap to clone; every method is non-blocking or
/// async (waiting never blocks an executor thread).
#[derive(Clone)]
pub struct KernelHandle {
    inner: Arc<HandleInner>,
}

impl std::fmt::Debug for KernelHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelHandle")
            .field("id", &self.id())
            .field("name", &self.name())
            .field("state", &self.state())
            .finish()
    }
}

/// Resolves to `true` when the listener fires, `false` when the deadline passes first.
struct Wait {
    listener: EventListener,
    delay: Option<crate::timer::Deadline>,
}

impl Future for Wait {
    type Output = bool;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<bool> {
        if Pin::new(&mut self.listener).poll(cx).is_ready() {
            return Poll::Ready(true);
        }
        if let Some(d) = self.delay.as_mut() {
            if Pin::new(d).poll(cx).is_ready() {
                return Poll::Ready(false);
            }
        }
        Poll::Pending
    }
}

/// How long a receive polls cooperatively before it sleeps on the output event, unless
/// the engine says otherwise ([`KernelEngine::reply_wait`]).
const RECEIVE_SPIN: Duration = Duration::from_micros(20);
/// Looks at the output queue between two yields to the executor while polling.
const RECEIVE_BURST: usize = 8;

/// The longest a receive polls cooperatively, whatever the engine says.
const MAX_RECEIVE_SPIN: Duration = Duration::from_millis(1);

/// The longest a batch receive polls cooperatively for its first message before it
/// sleeps on the output event (about a GPU round trip; see `receive_any`).
pub const BATCH_RECEIVE_SPIN: Duration = Duration::from_micros(100);

/// Yields to the executor once (wakes itself, returns `Pending`, then `Ready`).
struct YieldNow(bool);

impl Future for YieldNow {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            Poll::Ready(())
        } else {
            self.0 = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }
}

async fn wait_for(listener: EventListener, deadline: Option<Instant>) -> bool {
    let delay = match deadline {
        None => None,
        Some(d) => {
            if Instant::now() >= d {
                return false;
            }
            Some(crate::timer::Deadline::at(d))
        }
    };
    Wait { listener, delay }.await
}

impl KernelHandle {
    /// Kernel id.
    pub fn id(&self) -> KernelId {
        self.inner.engine.id()
    }
    /// Instance name.
    pub fn name(&self) -> &str {
        self.inner.engine.name()
    }
    /// Current lifecycle state.
    pub fn state(&self) -> LifecycleState {
        self.inner.engine.state()
    }
    /// Metrics snapshot of this kernel.
    pub fn metrics(&self) -> KernelMetrics {
        self.inner.engine.metrics()
    }
    /// The backend engine (for backend-specific extensions and tests).
    pub fn engine(&self) -> &Arc<dyn KernelEngine> {
        &self.inner.engine
    }

    /// `Launched|Deactivated → Active`. Activating a kernel that is already active
    /// does nothing and succeeds (a default launch activates the kernel, and programs
    /// written for the seed README activate it again); from `Terminating` or
    /// `Terminated` it is [`Error::InvalidState`].
    pub async fn activate(&self) -> Result<()> {
        already_there(self.inner.engine.activate(), LifecycleState::Active)
    }
    /// `Active → Deactivated`. Queued messages are kept and processed after `activate`.
    /// Deactivating a kernel that is already deactivated does nothing and succeeds;
    /// from `Launched`, `Terminating` or `Terminated` it is [`Error::InvalidState`].
    pub async fn deactivate(&self) -> Result<()> {
        already_there(self.inner.engine.deactivate(), LifecycleState::Deactivated)
    }
    /// Terminates the kernel: an active kernel drains its input queue first; messages
    /// queued on an inactive kernel come back in the report. Replies already produced
    /// can still be received afterwards.
    pub async fn terminate(&self) -> Result<TerminateReport> {
        let r = self.inner.engine.terminate().await?;
        self.inner.core.remove(self.id());
        Ok(r)
    }

    fn stamp(&self, type_id: u32, len: usize, priority: u8) -> MessageHeader {
        let mut h = MessageHeader::new(type_id, len);
        h.set_priority(priority);
        h.source_kernel = KernelId::HOST.0;
        h.dest_kernel = self.id().0;
        self.inner.core.stamp_from_host(&mut h);
        h
    }

    /// Sends without waiting: [`Error::QueueFull`] when the input queue is full.
    /// Returns the message id (also its correlation id).
    pub fn try_send<M: RingMessage>(&self, msg: &M) -> Result<u64> {
        let payload = msg.encode_payload()?;
        let mut h = self.stamp(M::TYPE_ID, payload.len(), priority::NORMAL);
        h.flags |= M::header_flags();
        self.inner.engine.accepts(&h)?;
        self.inner.engine.try_enqueue(&h, &payload)?;
        Ok(h.message_id)
    }

    /// Sends a message. When the input queue is full it waits for space (without
    /// blocking the thread) or, with `LaunchOptions::wait_when_full(false)`, returns
    /// [`Error::QueueFull`]. Returns the message id (also its correlation id).
    pub async fn send<M: RingMessage>(&self, msg: M) -> Result<u64> {
        self.send_with_priority(msg, priority::NORMAL).await
    }

    /// Sends a message with priority `priority` ([`crate::priority`]): it is handled
    /// before every lower-priority message waiting in the kernel's input, after those
    /// of its own level already waiting. Backpressure is per level (a full LOW lane
    /// does not hold a HIGH send back). Otherwise as [`send`](Self::send).
    ///
    /// ```
    /// # use ringkernel_core::builtin::Token;
    /// # async fn demo(k: ringkernel_core::runtime::KernelHandle) -> ringkernel_core::Result<()> {
    /// use ringkernel_core::priority;
    /// k.send_with_priority(Token::new(1, 2.0), priority::HIGH).await?;
    /// # Ok(()) }
    /// ```
    pub async fn send_with_priority<M: RingMessage>(&self, msg: M, priority: u8) -> Result<u64> {
        let payload = msg.encode_payload()?;
        self.send_bytes(M::TYPE_ID, M::header_flags(), &payload, priority, None)
            .await
    }

    /// Sends an already-built message (by value or by reference): its type id, payload,
    /// encoding flag ([`flags::RKYV`](crate::message::flags::RKYV)) and priority
    /// ([`Envelope::with_priority`]; [`NORMAL`](priority::NORMAL) for envelopes made by
    /// [`Envelope::new`]/[`Envelope::from_bytes`]) are kept; ids, timestamp and
    /// destination are filled in as for [`KernelHandle::send`].
    pub async fn send_envelope(&self, env: impl std::borrow::Borrow<Envelope>) -> Result<u64> {
        let env = env.borrow();
        self.send_bytes(
            env.header.type_id,
            env.header.flags & crate::message::flags::RKYV,
            &env.payload,
            env.header.priority(),
            None,
        )
        .await
    }

    async fn send_bytes(
        &self,
        type_id: u32,
        extra_flags: u32,
        payload: &[u8],
        priority: u8,
        deadline: Option<Instant>,
    ) -> Result<u64> {
        let mut h = self.stamp(type_id, payload.len(), priority);
        h.flags |= extra_flags;
        self.inner.engine.accepts(&h)?;
        loop {
            match self.inner.engine.try_enqueue(&h, payload) {
                Ok(()) => return Ok(h.message_id),
                Err(Error::QueueFull { capacity }) if self.inner.wait_when_full => {
                    let listener = self.inner.engine.events().input_space.listen();
                    match self.inner.engine.try_enqueue(&h, payload) {
                        Ok(()) => return Ok(h.message_id),
                        Err(Error::QueueFull { .. }) => {}
                        Err(e) => return Err(e),
                    }
                    if !wait_for(listener, deadline).await {
                        return Err(match deadline {
                            Some(_) => Error::Timeout(Duration::ZERO),
                            None => Error::QueueFull { capacity },
                        });
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Sends every message of `msgs` in order with priority [`NORMAL`](priority::NORMAL)
    /// and returns their message ids, which are consecutive (`first..first + len`).
    /// The host work is done once per batch where the engine allows it: one id block
    /// and one clock reservation for all headers, and the engine takes as many as fit
    /// in one call ([`KernelEngine::try_enqueue_batch`]; the drain engines of the GPU
    /// backends under one lock with one pass kick, the others one by one). When the
    /// input queue fills up it waits for space as [`send`](Self::send) does and goes on
    /// with the rest; with `wait_when_full(false)` it returns [`Error::QueueFull`]
    /// after enqueueing what fitted (the ids of those are lost to the caller: send
    /// smaller batches when that matters). An empty slice sends nothing.
    ///
    /// ```
    /// # use ringkernel_core::builtin::Token;
    /// # async fn demo(k: ringkernel_core::runtime::KernelHandle) -> ringkernel_core::Result<()> {
    /// let batch: Vec<Token> = (0..1000).map(|i| Token::new(i, 1.0)).collect();
    /// let ids = k.send_batch(&batch).await?;
    /// assert_eq!(ids.end - ids.start, 1000);
    /// let replies = k.receive_batch(1000, Some(std::time::Duration::from_secs(5))).await?;
    /// # let _ = replies; Ok(()) }
    /// ```
    pub async fn send_batch<M: RingMessage>(&self, msgs: &[M]) -> Result<std::ops::Range<u64>> {
        // Plain data is borrowed from `msgs` (no copy): as one slice when the messages'
        // bytes are their payloads back to back (no payload list at all); rkyv
        // archives one buffer each.
        let payloads;
        let run = match M::run_bytes(msgs) {
            Some(bytes) if !msgs.is_empty() => RunPayloads::Fixed(bytes, bytes.len() / msgs.len()),
            _ => {
                payloads = msgs
                    .iter()
                    .map(RingMessage::encode_payload)
                    .collect::<Result<Vec<_>>>()?;
                RunPayloads::Each(&payloads)
            }
        };
        let count = run.count();
        if count == 0 {
            return Ok(0..0);
        }
        // One header for the whole run: every message of the batch has the same type,
        // flags, priority and destination; ids and timestamps follow from the first
        // (`MessageHeader::nth_of_run`), so nothing is built per message here.
        let mut first = MessageHeader::new(M::TYPE_ID, run.len_at(0));
        first.set_priority(priority::NORMAL);
        first.source_kernel = KernelId::HOST.0;
        first.dest_kernel = self.id().0;
        first.flags |= M::header_flags();
        self.inner.engine.accepts(&first)?;
        let ids = self.inner.core.reserve_message_ids(count as u64);
        // A clock reservation counts in u32: very large batches take several.
        let mut c = 0;
        while c * (u32::MAX as usize) < count {
            let from = c * u32::MAX as usize;
            let chunk = run.part(from, (count - from).min(u32::MAX as usize));
            let start = ids + from as u64;
            first.message_id = start;
            first.correlation_id = start;
            first.set_hlc(self.inner.core.hlc().reserve(chunk.count() as u32));
            self.enqueue_run(&first, chunk).await?;
            c += 1;
        }
        Ok(ids..ids + count as u64)
    }

    /// Enqueues a run stamped from `first` ([`KernelEngine::try_enqueue_run`]), waiting
    /// for room as [`send_batch`](Self::send_batch) documents.
    async fn enqueue_run(&self, first: &MessageHeader, run: RunPayloads<'_, '_>) -> Result<()> {
        let engine = &self.inner.engine;
        let count = run.count();
        let mut done = 0;
        while done < count {
            let at = first.nth_of_run(done as u64, run.len_at(done));
            let rest = run.part(done, count - done);
            match rest.try_enqueue(engine.as_ref(), &at) {
                Ok(n) => done += n,
                Err(Error::QueueFull { capacity }) if self.inner.wait_when_full => {
                    let listener = engine.events().input_space.listen();
                    match rest.try_enqueue(engine.as_ref(), &at) {
                        Ok(n) => {
                            done += n;
                            continue;
                        }
                        Err(Error::QueueFull { .. }) => {}
                        Err(e) => return Err(e),
                    }
                    if !wait_for(listener, None).await {
                        return Err(Error::QueueFull { capacity });
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Receives up to `max` messages in arrival order: waits up to `timeout` (forever
    /// with `None`) for the first ([`Error::Timeout`] when none comes), then takes
    /// whatever else is already waiting, up to `max`, without waiting for more. Messages
    /// kept from earlier receives come first. The host clock merges the batch's latest
    /// timestamp once. `max = 0` returns an empty vector at once.
    pub async fn receive_batch(
        &self,
        max: usize,
        timeout: Option<Duration>,
    ) -> Result<Vec<Envelope>> {
        let mut out = Vec::new();
        if max == 0 {
            return Ok(out);
        }
        out.push(self.receive_any(timeout, BATCH_RECEIVE_SPIN).await?);
        {
            let mut stash = lock(&self.inner.stash);
            while out.len() < max {
                match stash.pop_front() {
                    Some(env) => out.push(env),
                    None => break,
                }
            }
        }
        let before = out.len();
        if before < max {
            self.inner
                .engine
                .try_dequeue_batch(&mut out, max - before)?;
        }
        if let Some(latest) = out[before..].iter().map(|e| e.header.hlc()).max() {
            if let Err(e) = self.inner.core.hlc().update(&latest) {
                tracing::warn!(kernel = %self.name(), error = %e, "reply timestamp not merged into the host clock");
            }
        }
        Ok(out)
    }

    /// Receives up to `max` messages of type `M` into `out` (appended) and returns how
    /// many: as [`receive_batch`](Self::receive_batch), but decoded straight from the
    /// output queue where the engine allows it
    /// ([`KernelEngine::try_dequeue_batch_with`]), with no envelope allocated per
    /// message. Waits up to `timeout` (forever with `None`) for the first
    /// ([`Error::Timeout`]). A message of another type ends the batch and stays queued
    /// for the next receive, in its place; when it is the first,
    /// [`Error::TypeMismatch`] as [`receive_timeout_as`](Self::receive_timeout_as)
    /// gives.
    ///
    /// ```
    /// # use ringkernel_core::builtin::Token;
    /// # async fn demo(k: ringkernel_core::runtime::KernelHandle) -> ringkernel_core::Result<()> {
    /// let batch: Vec<Token> = (0..1000).map(|i| Token::new(i, 1.0)).collect();
    /// k.send_batch(&batch).await?;
    /// let mut replies: Vec<Token> = Vec::with_capacity(1000);
    /// while replies.len() < 1000 {
    ///     let left = 1000 - replies.len();
    ///     k.receive_batch_into(&mut replies, left, Some(std::time::Duration::from_secs(5))).await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn receive_batch_into<M: RingMessage>(
        &self,
        out: &mut Vec<M>,
        max: usize,
        timeout: Option<Duration>,
    ) -> Result<usize> {
        if max == 0 {
            return Ok(0);
        }
        // Messages already waiting in the queue (and none kept from earlier receives)
        // are decoded in place at once: no envelope for the first, one clock merge.
        if lock(&self.inner.stash).is_empty() {
            match self.dequeue_decoded(out, max)? {
                (0, Some(e)) => return Err(e),
                (0, None) => {}
                (n, _) => return Ok(n),
            }
        }
        let first = self.receive_any(timeout, BATCH_RECEIVE_SPIN).await?;
        out.push(self.decode_or_keep(first)?);
        let mut n = 1;
        {
            let mut stash = lock(&self.inner.stash);
            while n < max {
                let Some(env) = stash.pop_front() else {
                    break;
                };
                match env.decode::<M>() {
                    Ok(m) => out.push(m),
                    Err(_) => {
                        stash.push_front(env);
                        return Ok(n);
                    }
                }
                n += 1;
            }
        }
        if n == max {
            return Ok(n);
        }
        // A message that does not decode stays queued for the next receive.
        Ok(n + self.dequeue_decoded(out, max - n)?.0)
    }

    /// The queue part of [`receive_batch_into`](Self::receive_batch_into): decodes up
    /// to `max` waiting messages straight from the output queue into `out` and merges
    /// the latest timestamp into the host clock once. A message of another type ends
    /// the batch and is kept (in the stash, first); its decode error comes back with
    /// the count. `(0, None)` when nothing is waiting.
    fn dequeue_decoded<M: RingMessage>(
        &self,
        out: &mut Vec<M>,
        max: usize,
    ) -> Result<(usize, Option<Error>)> {
        // Room for what is waiting now, at once (not `max`, which may be far more).
        out.reserve(max.min(self.inner.engine.output_depth()));
        let mut latest: Option<HlcTimestamp> = None;
        let mut kept: Option<(Envelope, Error)> = None;
        // A run shares its type, flags and size: its header is checked once, then
        // each payload read as `M::decode` would (`from_payload`, the message id).
        let n = self
            .inner
            .engine
            .try_dequeue_runs_with(max, &mut |first, payloads, count| {
                let len = first.payload_len as usize;
                let mut used = count;
                let mut bad =
                    check_header(first, M::TYPE_ID, M::NAME, <M as MessageCodec>::ENCODING)
                        .err()
                        .map(|e| (0, e));
                let before = out.len();
                if bad.is_none() && M::extend_from_run(out, payloads, len, count) {
                    // Plain data copied at once; the ids as `M::decode` sets them.
                    for (i, m) in out[before..].iter_mut().enumerate() {
                        m.set_message_id(MessageId(first.message_id.wrapping_add(i as u64)));
                    }
                } else if bad.is_none() {
                    out.reserve(count);
                    let stride = len.next_multiple_of(8);
                    for i in 0..count {
                        // A later payload of the run, so that its lines (written by
                        // another thread, often in another core's cache) arrive while
                        // this one is decoded.
                        if i + DECODE_PREFETCH < count {
                            prefetch(
                                payloads
                                    .as_ptr()
                                    .wrapping_add((i + DECODE_PREFETCH) * stride),
                                stride,
                            );
                        }
                        match M::from_payload(run_payload(payloads, len, i), M::NAME) {
                            Ok(mut m) => {
                                m.set_message_id(MessageId(
                                    first.message_id.wrapping_add(i as u64),
                                ));
                                out.push(m);
                            }
                            Err(e) => {
                                bad = Some((i, e));
                                break;
                            }
                        }
                    }
                }
                if let Some((i, e)) = bad {
                    let header = first.nth_of_run(i as u64, len);
                    let payload = run_payload(payloads, len, i).to_vec();
                    kept = Some((Envelope { header, payload }, e));
                    used = i + 1;
                }
                // Timestamps rise along a run: its last one is its latest.
                let ts = first.nth_of_run(used as u64 - 1, len).hlc();
                if latest.is_none_or(|l| ts > l) {
                    latest = Some(ts);
                }
                (used, kept.is_none())
            })?;
        if let Some(latest) = latest {
            if let Err(e) = self.inner.core.hlc().update(&latest) {
                tracing::warn!(kernel = %self.name(), error = %e, "reply timestamp not merged into the host clock");
            }
        }
        Ok(match kept {
            Some((env, e)) => {
                lock(&self.inner.stash).push_front(env);
                (n - 1, Some(e))
            }
            None => (n, None),
        })
    }

    /// Takes the first message (stash first, then the queue) that `pred` accepts,
    /// stashing the others. `Ok(None)` when none is there now.
    fn take_matching(&self, pred: &(dyn Fn(&Envelope) -> bool + Sync)) -> Result<Option<Envelope>> {
        let mut stash = lock(&self.inner.stash);
        if let Some(pos) = stash.iter().position(pred) {
            return Ok(stash.remove(pos));
        }
        let mut stashed = false;
        let found = loop {
            match self.inner.engine.try_dequeue()? {
                Some(env) if pred(&env) => break Some(env),
                Some(env) => {
                    stash.push_back(env);
                    stashed = true;
                }
                None => break None,
            }
        };
        drop(stash);
        if stashed {
            // Another caller may be waiting for what was just stashed.
            self.inner.engine.events().output.notify(usize::MAX);
        }
        if let Some(env) = &found {
            if let Err(e) = self.inner.core.hlc().update(&env.header.hlc()) {
                tracing::warn!(kernel = %self.name(), error = %e, "reply timestamp not merged into the host clock");
            }
        }
        Ok(found)
    }

    async fn receive_where(
        &self,
        pred: &(dyn Fn(&Envelope) -> bool + Sync),
        deadline: Option<Instant>,
        timeout: Duration,
    ) -> Result<Envelope> {
        self.receive_where_spinning(pred, deadline, timeout, MAX_RECEIVE_SPIN)
            .await
    }

    /// [`receive_where`](Self::receive_where), polling at most `max_spin` before it
    /// sleeps on the output event.
    async fn receive_where_spinning(
        &self,
        pred: &(dyn Fn(&Envelope) -> bool + Sync),
        deadline: Option<Instant>,
        timeout: Duration,
        max_spin: Duration,
    ) -> Result<Envelope> {
        // Replies to a request usually arrive within a round trip of the kernel. Before
        // registering a listener (whose wake-up costs a scheduler round trip), poll
        // cooperatively for about that long (the engine's `reply_wait`), helping the
        // engine along (`progress`, e.g. finishing a completed pass on this thread):
        // each round hands the thread back to the executor, so other tasks keep
        // running and nothing blocks.
        let engine = &self.inner.engine;
        let spin = engine.reply_wait().unwrap_or(RECEIVE_SPIN).min(max_spin);
        let spin_until = Instant::now() + spin;
        loop {
            // A short burst of looks between yields: a yield costs a scheduler round trip
            // (about as long as a GPU reply takes to cross PCIe), and a reply that lands
            // just after a look would otherwise wait for it.
            for _ in 0..RECEIVE_BURST {
                if let Some(env) = self.take_matching(pred)? {
                    return Ok(env);
                }
                std::hint::spin_loop();
            }
            if engine.progress() {
                continue;
            }
            let now = Instant::now();
            if now >= spin_until
                || deadline.is_some_and(|d| now >= d)
                || self.state() == LifecycleState::Terminated
            {
                break;
            }
            YieldNow(false).await;
        }
        loop {
            if let Some(env) = self.take_matching(pred)? {
                return Ok(env);
            }
            let listener = self.inner.engine.events().output.listen();
            let terminated = self.state() == LifecycleState::Terminated;
            if let Some(env) = self.take_matching(pred)? {
                return Ok(env);
            }
            if terminated {
                return Err(Error::KernelTerminated(self.name().to_string()));
            }
            if !wait_for(listener, deadline).await {
                // One last look: the reply may have landed exactly at the deadline.
                if let Some(env) = self.take_matching(pred)? {
                    return Ok(env);
                }
                return Err(Error::Timeout(timeout));
            }
        }
    }

    /// The next message, as [`receive_envelope`](Self::receive_envelope), polling at
    /// most `max_spin` before sleeping on the output event. The batch receives
    /// ([`receive_batch`](Self::receive_batch),
    /// [`receive_batch_into`](Self::receive_batch_into)) wait for their first message
    /// with [`BATCH_RECEIVE_SPIN`]: one that finds the queue empty usually waits for a
    /// whole pass of a kernel busy with a stream, which can take milliseconds, and
    /// polling all along only burns a core.
    async fn receive_any(&self, timeout: Option<Duration>, max_spin: Duration) -> Result<Envelope> {
        // A message already waiting is taken without reading the clock.
        if let Some(env) = self.take_matching(&|_| true)? {
            return Ok(env);
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        self.receive_where_spinning(&|_| true, deadline, timeout.unwrap_or_default(), max_spin)
            .await
    }

    /// Receives the next message from the output queue as an envelope, waiting up to
    /// `timeout` (forever with `None`).
    pub async fn receive_envelope(&self, timeout: Option<Duration>) -> Result<Envelope> {
        self.receive_any(timeout, MAX_RECEIVE_SPIN).await
    }

    fn decode_or_keep<M: RingMessage>(&self, env: Envelope) -> Result<M> {
        match env.decode::<M>() {
            Ok(m) => Ok(m),
            Err(e) => {
                // Not what the caller expected: keep it for a later receive.
                lock(&self.inner.stash).push_front(env);
                Err(e)
            }
        }
    }

    /// Receives the next message, waiting as long as it takes. A message of another
    /// type is [`Error::TypeMismatch`] and stays queued.
    pub async fn receive<M: RingMessage>(&self) -> Result<M> {
        let env = self.receive_envelope(None).await?;
        self.decode_or_keep(env)
    }

    /// Receives the next message as an [`Envelope`] (any type), waiting at most
    /// `timeout` ([`Error::Timeout`]). [`KernelHandle::receive_timeout_as`] decodes it.
    pub async fn receive_timeout(&self, timeout: Duration) -> Result<Envelope> {
        self.receive_envelope(Some(timeout)).await
    }

    /// Receives the next message as an `M`, waiting at most `timeout`
    /// ([`Error::Timeout`]). A message of another type is [`Error::TypeMismatch`] and
    /// stays queued.
    pub async fn receive_timeout_as<M: RingMessage>(&self, timeout: Duration) -> Result<M> {
        let env = self.receive_envelope(Some(timeout)).await?;
        self.decode_or_keep(env)
    }

    /// Receives a message if one is waiting, without waiting.
    pub fn try_receive<M: RingMessage>(&self) -> Result<Option<M>> {
        match self.take_matching(&|_| true)? {
            Some(env) => self.decode_or_keep(env).map(Some),
            None => Ok(None),
        }
    }

    /// Sends `req` and waits up to `timeout` for the reply with its correlation id.
    /// Other messages arriving meanwhile are kept for later receives.
    pub async fn call<Req: RingMessage, Resp: RingMessage>(
        &self,
        req: Req,
        timeout: Duration,
    ) -> Result<Resp> {
        let deadline = Instant::now() + timeout;
        let payload = req.encode_payload()?;
        let id = self
            .send_bytes(
                Req::TYPE_ID,
                Req::header_flags(),
                &payload,
                priority::NORMAL,
                Some(deadline),
            )
            .await
            .map_err(|e| match e {
                Error::Timeout(_) => Error::Timeout(timeout),
                e => e,
            })?;
        let env = self
            .receive_where(
                &|e: &Envelope| {
                    e.header.correlation_id == id
                        && e.header.flags & crate::message::flags::REPLY != 0
                },
                Some(deadline),
                timeout,
            )
            .await?;
        self.decode_or_keep(env)
    }
}

/// Typed publishing on any runtime (kept off [`RingKernelRuntime`] so that trait stays
/// object-safe).
pub trait RuntimeExt {
    /// Publishes a typed message to `topic` from the host.
    fn publish<M: RingMessage>(&self, topic: &str, msg: &M) -> Result<PublishReport>;
}

impl<T: RingKernelRuntime + ?Sized> RuntimeExt for T {
    fn publish<M: RingMessage>(&self, topic: &str, msg: &M) -> Result<PublishReport> {
        self.core().publish(topic, msg)
    }
}
