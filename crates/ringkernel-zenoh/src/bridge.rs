//! The bridge: one Zenoh session per runtime, carrying K2K messages, receipts and
//! publications between runtimes, and watching which peers are alive.

use crate::config::BridgeConfig;
use crate::keyexpr::{check_chunk, filter_key, topic_key};
use crate::proxy::{Carrier, RemoteKernel, RemoteTarget};
use crate::wire::{self, AckFrame, Frame, K2kFrame, RemoteReceipt, TopicFrame};
use ringkernel_core::k2k::{K2kReceipt, KernelTarget};
use ringkernel_core::message::{flags, Envelope, MessageHeader};
use ringkernel_core::options::LaunchOptions;
use ringkernel_core::pubsub::PublishReport;
use ringkernel_core::runtime::{KernelEngine, KernelEvents, KernelHandle, KernelId, RuntimeCore};
use ringkernel_core::telemetry::KernelCounters;
use ringkernel_core::util::lock;
use ringkernel_core::{Error, Result};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::{Duration, Instant};
use tokio::sync::{broadcast, oneshot, Notify};
use zenoh::pubsub::{Publisher, Subscriber};
use zenoh::qos::CongestionControl;
use zenoh::sample::SampleKind;
use zenoh::Wait;

/// A change in the set of peers a bridge sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerEvent {
    /// A bridge with this node name appeared (its session is connected, directly or
    /// through other peers).
    Up {
        /// Its node name.
        node: String,
    },
    /// A bridge disappeared: its process ended, its connection broke, or its lease ran
    /// out. `in_flight_lost` K2K messages sent to it had no receipt yet; they are
    /// counted in [`BridgeStats::k2k_lost`] and their waiters get
    /// [`RemoteReceipt::Lost`].
    Lost {
        /// Its node name.
        node: String,
        /// K2K messages to it that were still waiting for a receipt.
        in_flight_lost: u64,
    },
}

/// Counters of one bridge (a snapshot; see [`ZenohBridge::stats`]).
///
/// For K2K messages sent, at every moment
/// `k2k_sent == k2k_delivered + k2k_refused + k2k_lost + k2k_in_flight`:
/// every message is either confirmed delivered, confirmed not delivered, counted lost,
/// or still waiting for its receipt.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BridgeStats {
    /// K2K messages handed to Zenoh for a peer.
    pub k2k_sent: u64,
    /// ... confirmed in the destination kernel's queue (receipt `Delivered`).
    pub k2k_delivered: u64,
    /// ... confirmed not delivered (receipt `QueueFull`, `NotFound` or `Rejected`).
    pub k2k_refused: u64,
    /// ... without a receipt when their peer disappeared or the ack timeout passed:
    /// they may or may not have reached the destination queue.
    pub k2k_lost: u64,
    /// ... still waiting for a receipt.
    pub k2k_in_flight: u64,
    /// K2K sends refused here, before sending: the peer was not connected.
    pub k2k_unreachable: u64,
    /// K2K sends refused here because `max_in_flight` messages to that peer were
    /// waiting for receipts.
    pub k2k_window_full: u64,
    /// K2K messages that arrived from peers.
    pub k2k_received: u64,
    /// Receipts that arrived after their message had been counted lost.
    pub late_receipts: u64,
    /// Messages missing in a peer's sequence (K2K and publications): a gap means the
    /// transport lost something, which a reliable connection should never do.
    pub sequence_gaps: u64,
    /// Publications sent to peers.
    pub topic_published: u64,
    /// Publications that arrived from peers (each once, however many imported filters
    /// matched).
    pub topic_received: u64,
    /// Deliveries of arrived publications into local kernels' queues.
    pub topic_delivered: u64,
    /// Arrived publications that no local kernel was subscribed to.
    pub topic_unmatched: u64,
    /// Arrived publications not delivered to a subscribed kernel (full queue or
    /// terminated kernel), per kernel.
    pub topic_not_delivered: u64,
    /// Remote timestamps this runtime's clock refused (too far ahead): the message was
    /// not delivered (receipt `Rejected`).
    pub clock_rejected: u64,
    /// Frames that could not be decoded (dropped, logged).
    pub malformed: u64,
    /// Messages out of a served kernel's output queue that were not addressed to a
    /// remote kernel (dropped, logged).
    pub served_unrouted: u64,
    /// Peers that appeared.
    pub peers_up: u64,
    /// Peers that disappeared.
    pub peers_lost: u64,
}

#[derive(Default)]
struct Counters {
    k2k_sent: AtomicU64,
    k2k_delivered: AtomicU64,
    k2k_refused: AtomicU64,
    k2k_lost: AtomicU64,
    k2k_unreachable: AtomicU64,
    k2k_window_full: AtomicU64,
    k2k_received: AtomicU64,
    late_receipts: AtomicU64,
    sequence_gaps: AtomicU64,
    topic_published: AtomicU64,
    topic_received: AtomicU64,
    topic_delivered: AtomicU64,
    topic_unmatched: AtomicU64,
    topic_not_delivered: AtomicU64,
    clock_rejected: AtomicU64,
    malformed: AtomicU64,
    served_unrouted: AtomicU64,
    peers_up: AtomicU64,
    peers_lost: AtomicU64,
}

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// A message waiting for its receipt.
struct Pending {
    seq: u64,
    sent: Instant,
    waiter: Option<oneshot::Sender<RemoteReceipt>>,
}

/// What this bridge knows about one peer, as a destination.
struct Peer {
    live: bool,
    publisher: Option<Publisher<'static>>,
    next_seq: u64,
    pending: VecDeque<Pending>,
}

/// What this bridge knows about one peer, as a source.
#[derive(Default)]
struct Inbound {
    epoch: u64,
    /// The next sequence number expected (`None` until the first frame).
    next_k2k: Option<u64>,
    next_topic: Option<u64>,
}

pub(crate) struct Inner {
    node: String,
    prefix: String,
    epoch: u64,
    core: Arc<RuntimeCore>,
    config: BridgeConfig,
    session: zenoh::Session,
    peers: RwLock<HashMap<String, Arc<Mutex<Peer>>>>,
    inbound: Mutex<HashMap<String, Inbound>>,
    /// Stand-ins by node, then remote kernel name ("" for a host).
    proxies: RwLock<HashMap<String, HashMap<String, Arc<RemoteKernel>>>>,
    /// Stand-ins by local id.
    proxy_ids: RwLock<HashMap<KernelId, Arc<RemoteKernel>>>,
    acks: Mutex<Vec<(String, AckFrame)>>,
    acks_ready: Condvar,
    topic_lock: Mutex<u64>,
    counters: Counters,
    events: broadcast::Sender<PeerEvent>,
    closed: AtomicBool,
    shutdown: Notify,
}

fn zerr(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Device(format!("zenoh: {what}: {e}"))
}

impl Inner {
    fn key(&self, parts: &[&str]) -> String {
        let mut k = self.prefix.clone();
        for p in parts {
            k.push('/');
            k.push_str(p);
        }
        k
    }

    fn peer(&self, node: &str) -> Option<Arc<Mutex<Peer>>> {
        self.peers.read().expect("peers lock").get(node).cloned()
    }

    /// Sends one K2K message to `proxy`'s kernel. The header is the local one (source
    /// is a local kernel id or the host).
    pub(crate) fn send_k2k(
        &self,
        proxy: &RemoteKernel,
        header: &MessageHeader,
        payload: &[u8],
        waiter: Option<oneshot::Sender<RemoteReceipt>>,
    ) -> Result<()> {
        let src_name = match header.source_kernel {
            0 => String::new(),
            id => match self.core.lookup(&KernelTarget::Id(KernelId(id))) {
                Some(e) => e.name().to_string(),
                None => format!("#{id}"),
            },
        };
        let (dest_id, dest_name) = match &proxy.target {
            RemoteTarget::Host => (0, ""),
            RemoteTarget::Name(n) => (0, n.as_str()),
            RemoteTarget::Id(id) => (*id, ""),
        };
        let Some(peer) = self.peer(&proxy.node) else {
            add(&self.counters.k2k_unreachable, 1);
            return Err(proxy_unreachable(proxy));
        };
        let mut p = lock(&peer);
        let Some(publisher) = p.publisher.as_ref().filter(|_| p.live) else {
            add(&self.counters.k2k_unreachable, 1);
            return Err(proxy_unreachable(proxy));
        };
        if p.pending.len() >= self.config.max_in_flight {
            add(&self.counters.k2k_window_full, 1);
            return Err(Error::QueueFull {
                capacity: self.config.max_in_flight,
            });
        }
        let seq = p.next_seq;
        let mut buf = Vec::new();
        wire::encode_k2k(
            &mut buf,
            &K2kFrame {
                epoch: self.epoch,
                seq,
                src_kernel: header.source_kernel,
                src_name: &src_name,
                dest_id,
                dest_name,
                header: *header,
                payload,
            },
        )?;
        publisher
            .put(buf)
            .wait()
            .map_err(|e| zerr("sending a K2K message", e))?;
        p.next_seq += 1;
        p.pending.push_back(Pending {
            seq,
            sent: Instant::now(),
            waiter,
        });
        add(&self.counters.k2k_sent, 1);
        Ok(())
    }

    /// The stand-in of kernel `remote_name` of `node` ("" for its host), made on first
    /// use. `target` says how to address it there.
    fn proxy(
        &self,
        me: &Arc<Inner>,
        node: &str,
        remote_name: &str,
        target: RemoteTarget,
    ) -> Result<Arc<RemoteKernel>> {
        let find = |m: &HashMap<String, HashMap<String, Arc<RemoteKernel>>>| {
            m.get(node).and_then(|k| k.get(remote_name)).cloned()
        };
        if let Some(p) = find(&self.proxies.read().expect("proxies lock")) {
            return Ok(p);
        }
        let mut proxies = self.proxies.write().expect("proxies lock");
        if let Some(p) = find(&proxies) {
            return Ok(p);
        }
        let name = format!("{remote_name}@{node}");
        let id = self.core.reserve(&name)?;
        let proxy = Arc::new(RemoteKernel {
            id,
            name,
            node: node.to_string(),
            target,
            bridge: Arc::downgrade(me) as std::sync::Weak<dyn Carrier>,
            max_payload: self.config.max_payload,
            window: self.config.max_in_flight,
            output: Mutex::new(VecDeque::new()),
            events: KernelEvents::default(),
            counters: KernelCounters::default(),
            terminated: AtomicBool::new(false),
        });
        self.core.insert(proxy.clone() as Arc<dyn KernelEngine>);
        proxies
            .entry(node.to_string())
            .or_default()
            .insert(remote_name.to_string(), proxy.clone());
        self.proxy_ids
            .write()
            .expect("proxies lock")
            .insert(id, proxy.clone());
        Ok(proxy)
    }

    /// Checks a frame's place in its sender's sequence: `Some(true)` in order,
    /// `Some(false)` a duplicate to skip (publications matched by two imported
    /// filters arrive twice).
    fn sequence(&self, node: &str, epoch: u64, seq: u64, topic: bool) -> bool {
        let mut inbound = lock(&self.inbound);
        if !inbound.contains_key(node) {
            inbound.insert(node.to_string(), Inbound::default());
        }
        let s = inbound.get_mut(node).expect("just inserted");
        if s.epoch != epoch {
            *s = Inbound {
                epoch,
                ..Inbound::default()
            };
        }
        let next = if topic {
            &mut s.next_topic
        } else {
            &mut s.next_k2k
        };
        match *next {
            // The first frame of this sender seen since it appeared: a bridge that
            // joins late has not missed what was sent before it was there.
            None => {}
            Some(n) if seq < n => return false,
            Some(n) if seq > n => {
                add(&self.counters.sequence_gaps, seq - n);
                tracing::warn!(node, seq, expected = n, "sequence gap from a peer");
            }
            Some(_) => {}
        }
        *next = Some(seq + 1);
        true
    }

    fn on_k2k(self: &Arc<Self>, from: &str, f: K2kFrame<'_>) {
        add(&self.counters.k2k_received, 1);
        self.sequence(from, f.epoch, f.seq, false);
        let receipt = self.deliver_k2k(from, &f);
        let mut acks = lock(&self.acks);
        let was_empty = acks.is_empty();
        match acks.iter_mut().rev().find(|(n, _)| n == from) {
            Some((_, a))
                if a.epoch == f.epoch && a.first_seq + a.receipts.len() as u64 == f.seq =>
            {
                a.receipts.push(receipt)
            }
            _ => acks.push((
                from.to_string(),
                AckFrame {
                    epoch: f.epoch,
                    first_seq: f.seq,
                    receipts: vec![receipt],
                },
            )),
        }
        drop(acks);
        // The acknowledger takes everything there is when it wakes: wake it only when
        // it may be asleep.
        if was_empty {
            self.acks_ready.notify_one();
        }
    }

    fn merge_clock(&self, h: &MessageHeader) -> bool {
        match self.core.hlc().update(&h.hlc()) {
            Ok(_) => true,
            Err(e) => {
                add(&self.counters.clock_rejected, 1);
                tracing::warn!("refusing a remote message: {e}");
                false
            }
        }
    }

    fn source_proxy(
        self: &Arc<Self>,
        from: &str,
        src_kernel: u32,
        src_name: &str,
    ) -> Result<Arc<RemoteKernel>> {
        let target = if src_kernel == 0 {
            RemoteTarget::Host
        } else {
            RemoteTarget::Id(src_kernel)
        };
        self.proxy(self, from, src_name, target)
    }

    fn deliver_k2k(self: &Arc<Self>, from: &str, f: &K2kFrame<'_>) -> RemoteReceipt {
        if !self.merge_clock(&f.header) {
            return RemoteReceipt::Rejected;
        }
        let src = match self.source_proxy(from, f.src_kernel, f.src_name) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!("no stand-in for {}@{from}: {e}", f.src_name);
                return RemoteReceipt::Rejected;
            }
        };
        let mut h = f.header;
        h.source_kernel = src.id.0;
        h.message_id = self.core.next_message_id();
        if f.dest_name.is_empty() && f.dest_id == 0 {
            // To this runtime's host: a reply (or any message) from that kernel.
            h.dest_kernel = 0;
            src.push_output(Envelope {
                header: h,
                payload: f.payload.to_vec(),
            });
            return RemoteReceipt::Delivered;
        }
        h.flags |= flags::K2K;
        let target = if f.dest_name.is_empty() {
            KernelTarget::Id(KernelId(f.dest_id))
        } else {
            KernelTarget::Name(f.dest_name.to_string())
        };
        match self.core.deliver(&target, h, f.payload) {
            Ok(K2kReceipt::Delivered) => RemoteReceipt::Delivered,
            Ok(K2kReceipt::QueueFull) => RemoteReceipt::QueueFull,
            Ok(K2kReceipt::NotFound) => RemoteReceipt::NotFound,
            Err(e) => {
                tracing::warn!("refusing a K2K message from {from} to {target}: {e}");
                RemoteReceipt::Rejected
            }
        }
    }

    fn on_ack(&self, from: &str, a: AckFrame) {
        if a.epoch != self.epoch {
            add(&self.counters.late_receipts, a.receipts.len() as u64);
            return;
        }
        let Some(peer) = self.peer(from) else {
            add(&self.counters.late_receipts, a.receipts.len() as u64);
            return;
        };
        let mut p = lock(&peer);
        for (i, r) in a.receipts.iter().enumerate() {
            let seq = a.first_seq + i as u64;
            // Receipts come in sequence order; anything older still pending had its
            // receipt lost, which a reliable link never does: count it lost.
            while p.pending.front().is_some_and(|f| f.seq < seq) {
                let old = p.pending.pop_front().expect("front");
                self.finish(old, RemoteReceipt::Lost);
            }
            match p.pending.front() {
                Some(f) if f.seq == seq => {
                    let done = p.pending.pop_front().expect("front");
                    self.finish(done, *r);
                }
                _ => add(&self.counters.late_receipts, 1),
            }
        }
        drop(p);
        self.wake_senders(from);
    }

    fn finish(&self, p: Pending, r: RemoteReceipt) {
        match r {
            RemoteReceipt::Delivered => add(&self.counters.k2k_delivered, 1),
            RemoteReceipt::Lost => add(&self.counters.k2k_lost, 1),
            _ => add(&self.counters.k2k_refused, 1),
        }
        if let Some(w) = p.waiter {
            let _ = w.send(r);
        }
    }

    /// Wakes host sends waiting for window space towards `node`.
    fn wake_senders(&self, node: &str) {
        if let Some(ps) = self.proxies.read().expect("proxies lock").get(node) {
            for p in ps.values() {
                p.events.input_space.notify(usize::MAX);
            }
        }
    }

    fn on_topic(self: &Arc<Self>, f: TopicFrame<'_>) {
        let from = f.node;
        if from == self.node {
            return; // our own publication (delivered locally when published)
        }
        if !self.sequence(from, f.epoch, f.seq, true) {
            return;
        }
        add(&self.counters.topic_received, 1);
        if !self.merge_clock(&f.header) {
            return;
        }
        let mut h = f.header;
        h.message_id = self.core.next_message_id();
        h.correlation_id = h.message_id;
        match self.source_proxy(from, f.src_kernel, f.src_name) {
            Ok(p) => h.source_kernel = p.id.0,
            Err(_) => h.source_kernel = 0,
        }
        match self.core.publish_raw(f.topic, h, f.payload) {
            Ok(r) => {
                let missed = (r.queue_full.len() + r.not_found.len()) as u64;
                add(&self.counters.topic_delivered, r.delivered as u64);
                add(&self.counters.topic_not_delivered, missed);
                if r.delivered == 0 && missed == 0 {
                    add(&self.counters.topic_unmatched, 1);
                }
            }
            Err(e) => {
                add(&self.counters.topic_not_delivered, 1);
                tracing::warn!("publication from {from} to {:?} refused: {e}", f.topic);
            }
        }
    }

    fn on_liveliness(self: &Arc<Self>, node: &str, up: bool) {
        if node == self.node {
            return;
        }
        if up {
            let publisher = self
                .session
                .declare_publisher(self.key(&["k2k", node, &self.node]))
                .congestion_control(CongestionControl::Block)
                .wait()
                .map_err(|e| tracing::error!("no publisher towards {node}: {e}"))
                .ok();
            let peer = self
                .peers
                .write()
                .expect("peers lock")
                .entry(node.to_string())
                .or_insert_with(|| {
                    Arc::new(Mutex::new(Peer {
                        live: false,
                        publisher: None,
                        next_seq: 0,
                        pending: VecDeque::new(),
                    }))
                })
                .clone();
            let mut p = lock(&peer);
            p.live = true;
            p.publisher = publisher;
            drop(p);
            add(&self.counters.peers_up, 1);
            let _ = self.events.send(PeerEvent::Up {
                node: node.to_string(),
            });
        } else {
            let Some(peer) = self.peer(node) else { return };
            let mut p = lock(&peer);
            if !p.live {
                return;
            }
            p.live = false;
            p.publisher = None;
            let lost: Vec<Pending> = p.pending.drain(..).collect();
            drop(p);
            let n = lost.len() as u64;
            for l in lost {
                self.finish(l, RemoteReceipt::Lost);
            }
            lock(&self.inbound).remove(node);
            add(&self.counters.peers_lost, 1);
            tracing::warn!(node, in_flight_lost = n, "peer lost");
            let _ = self.events.send(PeerEvent::Lost {
                node: node.to_string(),
                in_flight_lost: n,
            });
            self.wake_senders(node);
        }
    }

    /// Handles one frame from the network. K2K and receipt keys end with the sender's
    /// node name; a publication names its sender inside.
    fn on_sample(self: &Arc<Self>, s: &zenoh::sample::Sample) {
        let from = last_chunk(s.key_expr().as_str());
        match wire::decode(&s.payload().to_bytes()) {
            Ok(Frame::K2k(f)) => self.on_k2k(from, f),
            Ok(Frame::Ack(a)) => self.on_ack(from, a),
            Ok(Frame::Topic(f)) => self.on_topic(f),
            Err(e) => {
                add(&self.counters.malformed, 1);
                tracing::warn!("frame on {} dropped: {e}", s.key_expr());
            }
        }
    }

    /// Subscribes to the publications on topics matching `filter`.
    async fn declare_import(self: &Arc<Self>, filter: &str) -> Result<Subscriber<()>> {
        let key = filter_key(&self.key(&["topic"]), filter)?;
        let me = self.clone();
        self.session
            .declare_subscriber(key)
            .callback(move |s| me.on_sample(&s))
            .await
            .map_err(|e| zerr("declaring a topic subscriber", e))
    }

    /// Counts lost the messages whose receipt is overdue.
    fn expire(&self, now: Instant) {
        let peers: Vec<_> = self
            .peers
            .read()
            .expect("peers lock")
            .values()
            .cloned()
            .collect();
        for peer in peers {
            let mut p = lock(&peer);
            while p
                .pending
                .front()
                .is_some_and(|f| now.duration_since(f.sent) > self.config.ack_timeout)
            {
                let old = p.pending.pop_front().expect("front");
                self.finish(old, RemoteReceipt::Lost);
            }
        }
    }

    /// The acknowledger: sends the receipts gathered by the receive callbacks, as
    /// soon as there are any (so they batch by themselves under load), and expires
    /// overdue messages.
    fn ack_loop(self: Arc<Self>) {
        let mut publishers: HashMap<String, Publisher<'static>> = HashMap::new();
        let mut last_expire = Instant::now();
        loop {
            let batch = {
                let mut acks = lock(&self.acks);
                while acks.is_empty() && !self.closed.load(Ordering::Acquire) {
                    let (a, _) = self
                        .acks_ready
                        .wait_timeout(acks, Duration::from_millis(50))
                        .unwrap_or_else(|e| e.into_inner());
                    acks = a;
                    if last_expire.elapsed() > Duration::from_millis(50) {
                        break;
                    }
                }
                std::mem::take(&mut *acks)
            };
            for (node, ack) in batch {
                let publisher = match publishers.entry(node.clone()) {
                    std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
                    std::collections::hash_map::Entry::Vacant(v) => {
                        match self
                            .session
                            .declare_publisher(self.key(&["ack", &node, &self.node]))
                            .congestion_control(CongestionControl::Block)
                            .wait()
                        {
                            Ok(p) => v.insert(p),
                            Err(e) => {
                                tracing::error!("cannot answer {node}: {e}");
                                continue;
                            }
                        }
                    }
                };
                if let Err(e) = publisher.put(wire::encode_ack(&ack)).wait() {
                    tracing::warn!("receipts to {node} not sent: {e}");
                }
            }
            if last_expire.elapsed() > Duration::from_millis(50) {
                last_expire = Instant::now();
                self.expire(last_expire);
            }
            if self.closed.load(Ordering::Acquire) && lock(&self.acks).is_empty() {
                return;
            }
        }
    }
}

fn proxy_unreachable(proxy: &RemoteKernel) -> Error {
    Error::KernelTerminated(format!(
        "{} (node {} is not connected)",
        proxy.name, proxy.node
    ))
}

/// The last chunk of a key: the node name of the sender in `…/<to>/<from>` keys.
fn last_chunk(key: &str) -> &str {
    key.rsplit('/').next().unwrap_or("")
}

/// Carries topics and K2K messages between runtimes in different processes or hosts
/// over Zenoh. See the [crate docs](crate) for addressing, the key mapping and the
/// delivery guarantee.
pub struct ZenohBridge {
    inner: Arc<Inner>,
    _subscribers: Mutex<Vec<Subscriber<()>>>,
    _token: Mutex<Option<zenoh::liveliness::LivelinessToken>>,
    acker: Mutex<Option<std::thread::JoinHandle<()>>>,
    tokio: tokio::runtime::Handle,
}

impl std::fmt::Debug for ZenohBridge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZenohBridge")
            .field("node", &self.inner.node)
            .field("prefix", &self.inner.prefix)
            .finish()
    }
}

impl ZenohBridge {
    /// Starts a bridge for the runtime whose core is `core` (`runtime.core().clone()`):
    /// opens the Zenoh session (listening and connecting as configured), then declares
    /// this node's subscriptions and its liveliness token.
    ///
    /// Call it inside a tokio runtime (served kernels are read by tokio tasks).
    ///
    /// Errors: [`Error::InvalidArgument`] for a bad configuration (see
    /// [`BridgeConfig::validate`]), an endpoint that cannot be listened on (a port in
    /// use) or a node name another connected bridge already has; [`Error::Timeout`]
    /// when a `connect` endpoint does not answer within the connect timeout.
    pub async fn start(core: Arc<RuntimeCore>, config: BridgeConfig) -> Result<Self> {
        let tokio = tokio::runtime::Handle::try_current()
            .map_err(|_| Error::invalid("ZenohBridge::start must run inside a tokio runtime"))?;
        let zconfig = config.zenoh_config()?;
        let session = match zenoh::open(zconfig).await {
            Ok(s) => s,
            Err(e) => return Err(open_error(&config, &e.to_string())),
        };
        let epoch = (u64::from(ringkernel_core::runtime::default_node_number()) << 32)
            | u64::from(ringkernel_core::runtime::default_node_number());
        let (events, _) = broadcast::channel(256);
        let inner = Arc::new(Inner {
            node: config.node.clone(),
            prefix: config.prefix.clone(),
            epoch,
            core,
            config,
            session,
            peers: RwLock::new(HashMap::new()),
            inbound: Mutex::new(HashMap::new()),
            proxies: RwLock::new(HashMap::new()),
            proxy_ids: RwLock::new(HashMap::new()),
            acks: Mutex::new(Vec::new()),
            acks_ready: Condvar::new(),
            topic_lock: Mutex::new(0),
            counters: Counters::default(),
            events,
            closed: AtomicBool::new(false),
            shutdown: Notify::new(),
        });
        let node_key = inner.key(&["node", &inner.node]);
        // Another bridge with this name already connected?
        let replies = inner
            .session
            .liveliness()
            .get(&node_key)
            .timeout(Duration::from_millis(500))
            .await
            .map_err(|e| zerr("liveliness query", e))?;
        if let Ok(reply) = replies.recv_async().await {
            if reply.result().is_ok() {
                let _ = inner.session.close().await;
                return Err(Error::invalid(format!(
                    "node name {:?} is already used by a connected bridge",
                    inner.node
                )));
            }
        }
        let mut subs = Vec::new();
        for (kind, what) in [("k2k", "K2K"), ("ack", "receipt")] {
            let me = inner.clone();
            subs.push(
                inner
                    .session
                    .declare_subscriber(inner.key(&[kind, &inner.node, "*"]))
                    .callback(move |s| me.on_sample(&s))
                    .await
                    .map_err(|e| zerr(&format!("declaring the {what} subscriber"), e))?,
            );
        }
        let me = inner.clone();
        subs.push(
            inner
                .session
                .liveliness()
                .declare_subscriber(inner.key(&["node", "*"]))
                .history(true)
                .callback(move |s| {
                    let node = last_chunk(s.key_expr().as_str()).to_string();
                    me.on_liveliness(&node, s.kind() == SampleKind::Put);
                })
                .await
                .map_err(|e| zerr("declaring the liveliness subscriber", e))?,
        );
        for filter in &inner.config.imports {
            subs.push(inner.declare_import(filter).await?);
        }
        let token = inner
            .session
            .liveliness()
            .declare_token(node_key)
            .await
            .map_err(|e| zerr("declaring the liveliness token", e))?;
        let me = inner.clone();
        let acker = std::thread::Builder::new()
            .name(format!("rk-zenoh-ack-{}", inner.node))
            .spawn(move || me.ack_loop())
            .map_err(|e| Error::Device(format!("cannot start the receipt thread: {e}")))?;
        Ok(ZenohBridge {
            inner,
            _subscribers: Mutex::new(subs),
            _token: Mutex::new(Some(token)),
            acker: Mutex::new(Some(acker)),
            tokio,
        })
    }

    /// This bridge's node name.
    pub fn node(&self) -> &str {
        &self.inner.node
    }

    /// The underlying Zenoh session (to publish or subscribe to other keys of the
    /// same network).
    pub fn session(&self) -> &zenoh::Session {
        &self.inner.session
    }

    /// Nodes currently connected, sorted.
    pub fn peers(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .inner
            .peers
            .read()
            .expect("peers lock")
            .iter()
            .filter(|(_, p)| lock(p).live)
            .map(|(n, _)| n.clone())
            .collect();
        v.sort();
        v
    }

    /// Waits until a bridge named `node` is connected ([`Error::Timeout`] if it does
    /// not appear within `timeout`).
    pub async fn wait_for_peer(&self, node: &str, timeout: Duration) -> Result<()> {
        let mut events = self.events();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if self.peers().iter().any(|p| p == node) {
                return Ok(());
            }
            match tokio::time::timeout_at(deadline, events.recv()).await {
                Err(_) => return Err(Error::Timeout(timeout)),
                Ok(Err(broadcast::error::RecvError::Closed)) => {
                    return Err(Error::KernelTerminated(format!("bridge {}", self.node())))
                }
                Ok(_) => {}
            }
        }
    }

    /// A stream of peer changes ([`PeerEvent::Up`], [`PeerEvent::Lost`]) from now on.
    /// A receiver that falls more than 256 events behind gets
    /// [`broadcast::error::RecvError::Lagged`] (the counters in [`stats`](Self::stats)
    /// keep the totals).
    pub fn events(&self) -> broadcast::Receiver<PeerEvent> {
        self.inner.events.subscribe()
    }

    /// A snapshot of the bridge's counters.
    pub fn stats(&self) -> BridgeStats {
        let c = &self.inner.counters;
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let in_flight = self
            .inner
            .peers
            .read()
            .expect("peers lock")
            .values()
            .map(|p| lock(p).pending.len() as u64)
            .sum();
        BridgeStats {
            k2k_sent: r(&c.k2k_sent),
            k2k_delivered: r(&c.k2k_delivered),
            k2k_refused: r(&c.k2k_refused),
            k2k_lost: r(&c.k2k_lost),
            k2k_in_flight: in_flight,
            k2k_unreachable: r(&c.k2k_unreachable),
            k2k_window_full: r(&c.k2k_window_full),
            k2k_received: r(&c.k2k_received),
            late_receipts: r(&c.late_receipts),
            sequence_gaps: r(&c.sequence_gaps),
            topic_published: r(&c.topic_published),
            topic_received: r(&c.topic_received),
            topic_delivered: r(&c.topic_delivered),
            topic_unmatched: r(&c.topic_unmatched),
            topic_not_delivered: r(&c.topic_not_delivered),
            clock_rejected: r(&c.clock_rejected),
            malformed: r(&c.malformed),
            served_unrouted: r(&c.served_unrouted),
            peers_up: r(&c.peers_up),
            peers_lost: r(&c.peers_lost),
        }
    }

    /// The local stand-in of kernel `kernel` of node `node`, made on first use: a
    /// kernel of this runtime named `kernel@node`. Local kernels reach it by that name
    /// (`ctx.send_to("worker@b", &msg)`) and the host through the returned handle
    /// (`send`, and `call` when the remote runtime [serves](Self::serve) the kernel).
    /// Sends to it while `node` is not connected fail ([`Error::KernelTerminated`],
    /// or [`K2kReceipt::NotFound`] for a handler) and are counted in
    /// [`BridgeStats::k2k_unreachable`].
    ///
    /// Errors: [`Error::InvalidArgument`] for an invalid node name or an empty
    /// kernel name, or when a local kernel already has the name `kernel@node`.
    pub fn remote_kernel(&self, node: &str, kernel: &str) -> Result<KernelHandle> {
        Ok(self.handle(self.named_proxy(node, kernel)?))
    }

    /// The stand-in of kernel `kernel` of `node`, addressed by name.
    fn named_proxy(&self, node: &str, kernel: &str) -> Result<Arc<RemoteKernel>> {
        check_chunk("node name", node)?;
        if kernel.is_empty() {
            return Err(Error::invalid("a remote kernel name must not be empty"));
        }
        self.inner.proxy(
            &self.inner,
            node,
            kernel,
            RemoteTarget::Name(kernel.to_string()),
        )
    }

    /// [`remote_kernel`](Self::remote_kernel) from an address `kernel@node`.
    ///
    /// ```
    /// assert_eq!(ringkernel_zenoh::parse_address("worker@gpu-1").unwrap(), ("worker", "gpu-1"));
    /// assert!(ringkernel_zenoh::parse_address("worker").is_err());
    /// ```
    pub fn remote(&self, address: &str) -> Result<KernelHandle> {
        let (kernel, node) = parse_address(address)?;
        self.remote_kernel(node, kernel)
    }

    fn handle(&self, proxy: Arc<RemoteKernel>) -> KernelHandle {
        self.inner
            .core
            .handle(proxy as Arc<dyn KernelEngine>, &LaunchOptions::default())
    }

    /// Sends `envelope` from local kernel `source` (or [`KernelId::HOST`]) to the
    /// remote kernel `address` (`kernel@node`) and waits for its receipt: where the
    /// message ended up at the destination, or [`RemoteReceipt::Lost`] if the peer
    /// disappeared (or the ack timeout passed) first.
    ///
    /// The message is stamped here (a fresh message id, also its correlation id, and
    /// a tick of this runtime's clock). Errors: as [`remote`](Self::remote), plus
    /// [`Error::KernelTerminated`] when the node is not connected, [`Error::QueueFull`]
    /// when `max_in_flight` messages to it wait for receipts, [`Error::KernelNotFound`]
    /// for an unknown `source`, [`Error::MessageTooLarge`].
    pub async fn send(
        &self,
        source: impl Into<KernelTarget>,
        address: &str,
        envelope: &Envelope,
    ) -> Result<RemoteReceipt> {
        let source = source.into();
        let src = match &source {
            KernelTarget::Id(id) if *id == KernelId::HOST => KernelId::HOST,
            t => self
                .inner
                .core
                .lookup(t)
                .map(|e| e.id())
                .ok_or_else(|| Error::KernelNotFound(format!("K2K source {t}")))?,
        };
        let (kernel, node) = parse_address(address)?;
        let proxy = self.named_proxy(node, kernel)?;
        ringkernel_core::message::check_payload_fits(envelope.payload.len(), proxy.slot_size())?;
        let mut h = envelope.header;
        h.message_id = self.inner.core.next_message_id();
        h.correlation_id = h.message_id;
        h.source_kernel = src.0;
        h.dest_kernel = proxy.id.0;
        h.payload_len = envelope.payload.len() as u32;
        h.flags |= flags::K2K;
        h.set_hlc(self.inner.core.hlc().tick());
        let (tx, rx) = oneshot::channel();
        self.inner
            .send_k2k(&proxy, &h, &envelope.payload, Some(tx))?;
        Ok(rx.await.unwrap_or(RemoteReceipt::Lost))
    }

    /// Lets remote callers `call` local kernel `kernel`: the bridge takes over its
    /// output queue and sends every message in it that is addressed to a remote
    /// kernel's stand-in (a handler's `ctx.reply` to a request that came over the
    /// bridge) back to that kernel. Anything else in the queue (a reply to a local
    /// host's call) is dropped, logged and counted in
    /// [`BridgeStats::served_unrouted`]: serve kernels that only remote callers call.
    /// Ends when the kernel terminates or the bridge closes.
    ///
    /// [`Error::KernelNotFound`] when there is no live local kernel `kernel`.
    pub fn serve(&self, kernel: impl Into<KernelTarget>) -> Result<()> {
        let target = kernel.into();
        let engine = self
            .inner
            .core
            .lookup(&target)
            .ok_or_else(|| Error::KernelNotFound(format!("cannot serve {target}")))?;
        let handle = self.inner.core.handle(engine, &LaunchOptions::default());
        let inner = self.inner.clone();
        self.tokio.spawn(async move {
            while !inner.closed.load(Ordering::Acquire) {
                let env = tokio::select! {
                    r = handle.receive_envelope(None) => r,
                    _ = inner.shutdown.notified() => return,
                };
                let env = match env {
                    Ok(env) => env,
                    Err(_) => return, // terminated
                };
                let proxy = inner
                    .proxy_ids
                    .read()
                    .expect("proxies lock")
                    .get(&KernelId(env.header.dest_kernel))
                    .cloned();
                let routed = match proxy {
                    Some(p) => inner
                        .send_k2k(&p, &env.header, &env.payload, None)
                        .map_err(|e| e.to_string()),
                    None => Err("not addressed to a remote kernel".into()),
                };
                if let Err(why) = routed {
                    add(&inner.counters.served_unrouted, 1);
                    tracing::warn!(
                        "output of served kernel {} (message {}) dropped: {why}",
                        handle.name(),
                        env.header.message_id
                    );
                }
            }
        });
        Ok(())
    }

    /// Receives publications from other runtimes on topics matching the MQTT filter
    /// `filter` and publishes them into this runtime (to its kernels subscribed with
    /// matching filters, MQTT rules applied here). Importing overlapping filters
    /// delivers each publication once.
    ///
    /// [`Error::InvalidArgument`] for an invalid filter.
    pub async fn import_topics(&self, filter: &str) -> Result<()> {
        let sub = self.inner.declare_import(filter).await?;
        lock(&self._subscribers).push(sub);
        Ok(())
    }

    /// Publishes `envelope` to `topic` on behalf of local kernel `sender` (or
    /// [`KernelId::HOST`]): to this runtime's subscribed kernels (the returned
    /// report) and to every connected runtime that imports a matching filter.
    /// Stamped here as [`RuntimeCore::publish_raw`] expects (a fresh message id,
    /// `sender` as source, the `PUBSUB` flag, a tick of this runtime's clock).
    ///
    /// Errors: [`Error::InvalidArgument`] for an invalid topic,
    /// [`Error::KernelNotFound`] for an unknown sender, [`Error::MessageTooLarge`].
    pub fn publish(
        &self,
        topic: &str,
        sender: KernelId,
        envelope: &Envelope,
    ) -> Result<PublishReport> {
        let key = topic_key(&self.inner.key(&["topic"]), topic)?;
        if sender != KernelId::HOST && self.inner.core.lookup(&KernelTarget::Id(sender)).is_none() {
            return Err(Error::KernelNotFound(format!("publisher {sender}")));
        }
        let mut h = envelope.header;
        h.message_id = self.inner.core.next_message_id();
        h.correlation_id = h.message_id;
        h.source_kernel = sender.0;
        h.payload_len = envelope.payload.len() as u32;
        h.flags |= flags::PUBSUB;
        // One lock orders sequence numbers, timestamps and sends alike.
        let src_name = match sender {
            KernelId::HOST => String::new(),
            id => self
                .inner
                .core
                .lookup(&KernelTarget::Id(id))
                .map(|e| e.name().to_string())
                .unwrap_or_default(),
        };
        let mut seq = lock(&self.inner.topic_lock);
        h.set_hlc(self.inner.core.hlc().tick());
        let mut buf = Vec::new();
        wire::encode_topic(
            &mut buf,
            &TopicFrame {
                epoch: self.inner.epoch,
                seq: *seq,
                src_kernel: sender.0,
                src_name: &src_name,
                node: &self.inner.node,
                topic,
                header: h,
                payload: &envelope.payload,
            },
        )?;
        self.inner
            .session
            .put(key, buf)
            .congestion_control(CongestionControl::Block)
            .wait()
            .map_err(|e| zerr("publishing", e))?;
        *seq += 1;
        drop(seq);
        add(&self.inner.counters.topic_published, 1);
        self.inner.core.publish_raw(topic, h, &envelope.payload)
    }

    /// Closes the bridge: waits up to [`close_timeout`](BridgeConfig::close_timeout)
    /// for the receipts of K2K messages in flight, then stops receiving, withdraws
    /// this node (peers see it [lost](PeerEvent::Lost)), counts every K2K message
    /// still without a receipt as lost, terminates the stand-ins and closes the Zenoh
    /// session. Returns the final counters.
    pub async fn close(&self) -> Result<BridgeStats> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Ok(self.stats());
        }
        // Let the receipts of what was just sent come back first.
        let deadline = Instant::now() + self.inner.config.close_timeout;
        while self.stats().k2k_in_flight > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        if self.inner.closed.swap(true, Ordering::AcqRel) {
            return Ok(self.stats());
        }
        self.inner.shutdown.notify_waiters();
        lock(&self._subscribers).clear();
        lock(&self._token).take();
        let peers: Vec<String> = self
            .inner
            .peers
            .read()
            .expect("peers lock")
            .keys()
            .cloned()
            .collect();
        for node in peers {
            self.inner.on_liveliness(&node, false);
        }
        let proxies: Vec<Arc<RemoteKernel>> = self
            .inner
            .proxy_ids
            .read()
            .expect("proxies lock")
            .values()
            .cloned()
            .collect();
        for p in proxies {
            p.terminated.store(true, Ordering::Release);
            p.events.notify_all();
            self.inner.core.remove(p.id);
        }
        self.inner.acks_ready.notify_all();
        let acker = lock(&self.acker).take();
        if let Some(t) = acker {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
        self.inner
            .session
            .close()
            .await
            .map_err(|e| zerr("closing the session", e))?;
        Ok(self.stats())
    }
}

impl Drop for ZenohBridge {
    fn drop(&mut self) {
        self.inner.closed.store(true, Ordering::Release);
        self.inner.shutdown.notify_waiters();
        self.inner.acks_ready.notify_all();
    }
}

impl Carrier for Inner {
    fn carry(&self, to: &RemoteKernel, header: &MessageHeader, payload: &[u8]) -> Result<()> {
        self.send_k2k(to, header, payload, None)
    }
}

/// Splits an address `kernel@node` (the last `@` separates them).
pub fn parse_address(address: &str) -> Result<(&str, &str)> {
    match address.rsplit_once('@') {
        Some((k, n)) if !k.is_empty() && !n.is_empty() => Ok((k, n)),
        _ => Err(Error::invalid(format!(
            "remote kernel address {address:?}: expected kernel@node"
        ))),
    }
}

/// Turns a failed `zenoh::open` into an error a caller can act on.
fn open_error(config: &BridgeConfig, msg: &str) -> Error {
    let lower = msg.to_lowercase();
    if lower.contains("address already in use")
        || lower.contains("can not create a new tcp listener")
        || lower.contains("bind")
    {
        Error::invalid(format!("cannot listen on {:?}: {msg}", config.listen))
    } else if !config.connect.is_empty()
        && (lower.contains("connect") || lower.contains("timeout") || lower.contains("unable"))
    {
        tracing::warn!("zenoh open failed: {msg}");
        Error::Timeout(config.connect_timeout)
    } else {
        Error::Device(format!("zenoh: opening the session: {msg}"))
    }
}
