//! The CPU actor runtime: kernels are tasks on a pool of worker threads (M:N), or, on
//! request, each on a thread of its own.
//!
//! Each kernel owns
//!
//! * one MPSC input ring of message slots per priority level, its *lanes* (the host,
//!   other kernels through K2K and the pub/sub broker all write into them; see
//!   [Priority](#priority)),
//! * an SPSC output ring (the worker writes replies, the host reads them),
//! * its own hybrid logical clock, counters, latency histogram and lifecycle state,
//! * its registered [`CpuHandler`], run on every message.
//!
//! Per-message work is done once per turn where a turn allows it: the destinations of
//! a turn's K2K sends are looked up once, message ids come from a block reserved per
//! kernel, the kernel's physical clock is read once, and `processed`/`emitted` are
//! added when the turn ends. Handler latency is timed for every
//! [`LATENCY_SAMPLE_EVERY`]th message (each sample stands for the messages since the
//! previous one, so `latency.count` still counts every handled message; reading the
//! clock twice per message cost more than the handlers themselves).
//!
//! # Scheduling
//!
//! By default a kernel is a task of the runtime's worker pool: one worker thread per
//! logical core ([`CpuRuntime::with_workers`] sets another count), started with the
//! first launch. A message (or a state change) schedules the kernel; a worker then gives
//! it a *turn* of at most [`TURN_BUDGET`] messages (priority lanes still highest first)
//! and moves on, so a flooded kernel cannot starve the others. A kernel woken by a
//! handler running on a worker (K2K, publish) is queued on that worker and runs there
//! next, without an OS wake-up; idle workers steal queued kernels from busy ones, look
//! for work for a while (200 µs at first; the pool adapts it between 50 µs and 2 ms to
//! how it is fed, [`SchedulerStats::search_window`]), then park (no CPU while idle).
//! A handler
//! that blocks (sleeps, or spins on a full downstream queue like `rk.stage` does) keeps
//! its worker: when every worker is stuck in a long turn while kernels wait, the pool
//! starts an extra worker, which exits again once idle, so blocking cannot deadlock the
//! pool. `DESIGN.md` in this crate explains the choices.
//!
//! [`LaunchOptions::dedicated_thread`] (`with_dedicated_thread()`) gives a kernel its
//! own named OS thread instead (latency-critical kernels, handlers that block for
//! long). Wake-ups there are spin-then-park: after its queue runs dry the thread spins
//! for [`SPIN_BEFORE_PARK`], then parks. Producers only pay for an `unpark` when the
//! worker is actually parked (a `sleeping` flag, checked after a fence).
//!
//! Lifecycle on the CPU:
//!
//! * `Launched`/`Deactivated`: messages queue up and are kept; the worker sleeps.
//! * `Active`: the worker processes messages highest priority first, FIFO within one
//!   priority level. Deactivation takes effect after the message being handled.
//! * `Terminating`: no new messages are accepted. A kernel that was active drains its
//!   input queue (every queued message is processed); one that was not hands its queued
//!   messages back in [`TerminateReport::undelivered`] (highest lane first, in the
//!   order it would have handled them). Then the state becomes `Terminated` and the
//!   kernel's task (or thread) ends.
//!
//! # Priority
//!
//! A message goes into the lane of its header's priority
//! ([`ringkernel_core::priority::lane`]); before each message the worker looks at the
//! lanes from CRITICAL down and takes the oldest message of the first non-empty one.
//! So a message overtakes every lower-priority message waiting (not one already being
//! handled). Each lane holds `queue_capacity` messages: a send into a full lane is
//! [`Error::QueueFull`] (or waits for room) while the other lanes still accept
//! messages. Memory: the NORMAL lane's ring (`queue_capacity × slot_size` bytes) is
//! allocated at launch, each other lane's on its first message, so a kernel that
//! only sees NORMAL traffic costs what it did before lanes existed, and at most four
//! times that. A kernel's replies, K2K sends and publishes carry its
//! [`LaunchOptions::priority`].
//!
//! ```
//! use ringkernel_core::builtin::{Token, ECHO};
//! use ringkernel_core::prelude::*;
//! use ringkernel_cpu::CpuRuntime;
//! use std::time::Duration;
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let rt = CpuRuntime::new().await?;
//! let k = rt.launch(ECHO, LaunchOptions::default()).await?;
//! let reply: Token = k.call(Token::new(1, 21.0), Duration::from_secs(5)).await?;
//! assert_eq!(reply.value, 42.0);
//! rt.shutdown().await?;
//! # Ok::<(), ringkernel_core::Error>(())
//! # }).unwrap();
//! ```

use ringkernel_core::backend::BackendKind;
use ringkernel_core::builtin;
use ringkernel_core::context::{KernelContext, OutputSink, TurnRouter};
use ringkernel_core::error::{Error, Result};
use ringkernel_core::hlc::{HlcClock, HlcTimestamp};
use ringkernel_core::k2k::{K2kReceipt, KernelTarget};
use ringkernel_core::lifecycle::{AtomicLifecycle, LifecycleState};
use ringkernel_core::message::{flags, Envelope, MessageHeader};
use ringkernel_core::options::LaunchOptions;
use ringkernel_core::priority::{self, LANES};
use ringkernel_core::pubsub::PublishReport;
use ringkernel_core::queue::slot::{
    mpsc_slot_channel, slot_channel, SlotConsumer, SlotProducer, SlotReceiver, SlotSender,
};
use ringkernel_core::registry::{CpuHandler, KernelRegistry};
use ringkernel_core::runtime::{
    KernelEngine, KernelEvents, KernelHandle, KernelId, RingKernelRuntime, RuntimeCore,
    ShutdownReport, TerminateReport,
};
use ringkernel_core::telemetry::{KernelCounters, KernelMetrics, LatencyHistogram};
use ringkernel_core::util::CachePadded;
use ringkernel_core::util::{lock, BoxFuture};
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{fence, AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};
use std::thread::{JoinHandle, Thread};

use crate::sched::{Pool, PoolHandle, Runnable, Task, Turn};
use std::time::{Duration, Instant};

/// How long an idle active worker spins (checking its queue) before it parks.
pub const SPIN_BEFORE_PARK: Duration = Duration::from_micros(50);
/// Longest single park of an idle worker. Wake-ups are explicit (unpark); this bound is
/// only a safety net, so it can be long.
const PARK_MAX: Duration = Duration::from_millis(100);
/// Longest single park while waiting for space in a full output queue (the consumer
/// also unparks the worker when it frees a slot).
const OUTPUT_PARK: Duration = Duration::from_millis(1);
/// While terminating, how long the worker waits for space in a full output queue
/// before it gives up and drops outputs (counted in `dropped`, logged).
pub const DRAIN_OUTPUT_GRACE: Duration = Duration::from_millis(50);
/// Messages a dedicated thread handles between two upgrades of the runtime reference.
const BATCH: usize = 256;
/// Messages a pooled kernel handles in one turn before the worker moves on to the next
/// kernel waiting (it goes to the back of the queue if it has more).
pub const TURN_BUDGET: usize = 64;

/// Describes the host CPU: model (where the OS says), architecture, logical cores.
/// Always `Ok`: the CPU backend is always available.
///
/// ```
/// let s = ringkernel_cpu::probe().unwrap();
/// assert!(s.contains("logical cores"));
/// ```
pub fn probe() -> Result<String> {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let model = cpu_model().unwrap_or_else(|| "CPU".to_string());
    Ok(format!(
        "{model} ({} {}, {cores} logical cores)",
        std::env::consts::ARCH,
        std::env::consts::OS
    ))
}

/// The CPU model name from `/proc/cpuinfo` (Linux only; `None` elsewhere).
fn cpu_model() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    info.lines()
        .find(|l| {
            l.starts_with("model name") || l.starts_with("Model") || l.starts_with("Hardware")
        })
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// The CPU actor runtime: kernels run their registered [`CpuHandler`] as tasks of a
/// worker pool (see [the module docs](self)), or on a dedicated thread each when
/// launched with [`LaunchOptions::with_dedicated_thread`].
///
/// The built-in kernels ([`rk.echo`](builtin::ECHO), [`rk.stage`](builtin::STAGE),
/// [`rk.counter`](builtin::COUNTER)) are registered into the given registry under
/// their names unless the registry already has a handler of that name.
///
/// Call [`shutdown`](RingKernelRuntime::shutdown) to drain and stop every kernel.
/// Dropping the runtime (and every handle) without it stops every kernel and the pool,
/// but whatever was still queued is discarded, since nobody can receive it any more.
pub struct CpuRuntime {
    core: Arc<RuntimeCore>,
    info: String,
    /// Worker threads of the pool (started with the first pooled kernel).
    workers: usize,
    pool: Mutex<Option<Arc<PoolHandle>>>,
    /// This runtime's kernels by id, for the workers' K2K sends.
    kernels: Arc<CpuKernels>,
}

/// A runtime's CPU kernels by id (each entry removed when its engine is dropped): a
/// worker's turn looks its destinations up here once and then calls them directly.
#[derive(Default)]
struct CpuKernels(RwLock<HashMap<KernelId, Weak<CpuEngine>>>);

impl CpuKernels {
    fn get(&self, id: KernelId) -> Option<Arc<CpuEngine>> {
        self.0
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .and_then(Weak::upgrade)
    }

    fn insert(&self, engine: &Arc<CpuEngine>) {
        self.0
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(engine.shared.id, Arc::downgrade(engine));
    }

    fn remove(&self, id: KernelId) {
        self.0
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
    }
}

/// What the CPU runtime's worker pool is doing ([`CpuRuntime::scheduler_stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SchedulerStats {
    /// Worker threads the pool keeps ([`CpuRuntime::with_workers`]; default one per core).
    pub workers: usize,
    /// Worker threads alive now: `workers` plus extras started while turns were blocked
    /// (0 before the first pooled kernel is launched).
    pub threads: usize,
    /// Extra workers started so far because every worker was stuck in a long turn while
    /// other kernels waited (they exit again once idle).
    pub extra_started: usize,
    /// Turns run so far (a turn handles up to [`TURN_BUDGET`] messages of one kernel):
    /// messages processed ÷ turns is how well work is batched.
    pub turns: u64,
    /// Parked workers woken so far (each an OS wake-up).
    pub wakeups: u64,
    /// Time idle workers spent spinning for work before they found some or parked
    /// (wall time; CPU the pool used without running a kernel, unless preempted).
    pub search_time: Duration,
    /// How long an idle worker now looks for work before it parks (the pool adapts it
    /// between 50 µs and 2 ms: longer when workers keep being woken soon after they
    /// parked, shorter while searches find nothing).
    pub search_window: Duration,
}

impl std::fmt::Debug for CpuRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuRuntime")
            .field("core", &self.core)
            .field("device", &self.info)
            .finish()
    }
}

impl CpuRuntime {
    /// A CPU runtime resolving kernel names through the process-wide
    /// [`KernelRegistry::global`] (plus the built-ins and the `#[ring_kernel]`
    /// handlers). Never fails on a working host; async to match the other backends.
    pub async fn new() -> Result<Self> {
        Self::with_registry(KernelRegistry::global().clone()).await
    }

    /// A CPU runtime resolving kernel names through `registry` (plus the built-ins,
    /// added to it where missing, and the `#[ring_kernel]` handlers).
    pub async fn with_registry(registry: KernelRegistry) -> Result<Self> {
        register_missing_builtins(&registry);
        let info = probe().unwrap_or_else(|_| "CPU".to_string());
        Ok(CpuRuntime {
            core: RuntimeCore::new(BackendKind::Cpu, registry),
            info,
            workers: default_workers(),
            pool: Mutex::new(None),
            kernels: Arc::default(),
        })
    }

    /// Sets how many worker threads run the pooled kernels (default: one per logical
    /// core). Only before the first launch: [`Error::InvalidArgument`] afterwards, or
    /// for a count outside `1..=512`.
    ///
    /// ```
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let rt = ringkernel_cpu::CpuRuntime::new().await?.with_workers(2)?;
    /// assert_eq!(rt.scheduler_stats().workers, 2);
    /// # Ok::<(), ringkernel_core::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn with_workers(mut self, workers: usize) -> Result<Self> {
        if workers == 0 || workers > crate::sched::MAX_THREADS {
            return Err(Error::invalid(format!(
                "the CPU worker pool needs 1..={} workers, got {workers}",
                crate::sched::MAX_THREADS
            )));
        }
        if lock(&self.pool).is_some() {
            return Err(Error::invalid(
                "set the CPU worker count before the first launch",
            ));
        }
        self.workers = workers;
        Ok(self)
    }

    /// The worker pool's figures now.
    pub fn scheduler_stats(&self) -> SchedulerStats {
        let pool = lock(&self.pool);
        SchedulerStats {
            workers: self.workers,
            threads: pool.as_ref().map_or(0, |p| p.0.threads()),
            extra_started: pool.as_ref().map_or(0, |p| p.0.extra_started()),
            turns: pool.as_ref().map_or(0, |p| p.0.turns()),
            wakeups: pool.as_ref().map_or(0, |p| p.0.wakeups()),
            search_time: pool.as_ref().map_or(Duration::ZERO, |p| p.0.search_time()),
            search_window: pool
                .as_ref()
                .map_or(crate::sched::SEARCH_SPIN, |p| p.0.search_window()),
        }
    }

    /// The worker pool, started on first use.
    fn pool(&self) -> Result<Arc<PoolHandle>> {
        let mut pool = lock(&self.pool);
        if let Some(p) = pool.as_ref() {
            return Ok(p.clone());
        }
        let p = Pool::start(self.workers)?;
        *pool = Some(p.clone());
        Ok(p)
    }

    fn launch_now(&self, handler: &str, opts: &LaunchOptions) -> Result<KernelHandle> {
        opts.validate()?;
        let factory = self.core.registry().cpu(handler)?;
        let name = opts.name.clone().unwrap_or_else(|| handler.to_string());
        let pool = if opts.dedicated_thread {
            None
        } else {
            Some(self.pool()?)
        };
        let id = self.core.reserve(&name)?;
        let spawned = spawn_kernel(
            &self.core,
            &self.kernels,
            pool,
            id,
            &name,
            handler,
            factory.as_ref(),
            opts,
        );
        match spawned {
            Ok(engine) => {
                self.kernels.insert(&engine);
                let engine: Arc<dyn KernelEngine> = engine;
                self.core.insert(engine.clone());
                tracing::debug!(kernel = %name, %id, "launched");
                Ok(self.core.handle(engine, opts))
            }
            Err(e) => {
                self.core.release(&name);
                Err(e)
            }
        }
    }
}

/// One worker per logical core.
fn default_workers() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(crate::sched::MAX_THREADS)
}

/// Registers the CPU built-ins whose names `registry` does not have yet.
fn register_missing_builtins(registry: &KernelRegistry) {
    let builtins = KernelRegistry::new();
    builtin::register_cpu_builtins(&builtins);
    for name in [builtin::ECHO, builtin::STAGE, builtin::COUNTER] {
        if registry.cpu(name).is_err() {
            if let Ok(f) = builtins.cpu(name) {
                registry.register_cpu(name, move || f());
            }
        }
    }
}

impl RingKernelRuntime for CpuRuntime {
    fn core(&self) -> &Arc<RuntimeCore> {
        &self.core
    }

    fn launch<'a>(
        &'a self,
        handler: &'a str,
        opts: LaunchOptions,
    ) -> BoxFuture<'a, Result<KernelHandle>> {
        Box::pin(async move {
            let span = tracing::info_span!("rk.launch", backend = "cpu", handler);
            let _e = span.enter();
            self.launch_now(handler, &opts)
        })
    }

    fn device_info(&self) -> String {
        self.info.clone()
    }

    /// As the default (every kernel terminated, active ones drained), but every kernel
    /// is told first and the reports are collected afterwards, so the pool's workers
    /// drain the kernels side by side instead of one round trip per kernel.
    fn shutdown(&self) -> BoxFuture<'_, Result<ShutdownReport>> {
        Box::pin(async move {
            let core = &self.core;
            let engines: Vec<_> = core
                .engines()
                .into_iter()
                .filter(|e| {
                    let done = matches!(
                        e.state(),
                        LifecycleState::Terminated | LifecycleState::Terminating
                    );
                    if done {
                        core.remove(e.id());
                    }
                    !done
                })
                .collect();
            // The first poll of `terminate` moves the kernel to `Terminating` and wakes
            // its worker; the futures are awaited (in order) afterwards.
            let pending: Vec<_> = {
                let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
                engines
                    .iter()
                    .map(|e| {
                        let mut f = e.terminate();
                        let first = f.as_mut().poll(&mut cx);
                        (e, f, first)
                    })
                    .collect()
            };
            let mut report = ShutdownReport::default();
            for (e, f, first) in pending {
                let r = match first {
                    std::task::Poll::Ready(r) => r?,
                    std::task::Poll::Pending => f.await?,
                };
                core.remove(e.id());
                report.kernels += 1;
                report.drained += r.drained;
                report.undelivered += r.undelivered.len();
            }
            Ok(report)
        })
    }
}

/// A kernel's input lanes, one per priority level. The sending side of a lane exists
/// once the lane was opened (NORMAL at launch, the others on their first message); a
/// lane opened after launch leaves its receiving side in `handoff` for the worker.
struct Lanes {
    tx: [OnceLock<SlotSender>; LANES],
    handoff: [Mutex<Option<SlotReceiver>>; LANES],
    /// Set (under every `handoff` lock) when the worker closes the lanes for its final
    /// sweep: no lane opens after that.
    closed: AtomicBool,
    /// Bit `lane` is set once the lane is open (its receiver is in place by then).
    opened: AtomicU8,
    capacity: usize,
    slot_size: usize,
}

impl Lanes {
    /// Lanes of `capacity` slots of `slot_size` bytes with the NORMAL lane open; its
    /// receiver is returned for the worker.
    fn new(capacity: usize, slot_size: usize) -> Result<(Self, SlotReceiver)> {
        let (tx, rx) = mpsc_slot_channel(capacity, slot_size)?;
        let lanes = Lanes {
            tx: Default::default(),
            handoff: Default::default(),
            closed: AtomicBool::new(false),
            opened: AtomicU8::new(1 << priority::lane(priority::NORMAL)),
            capacity,
            slot_size,
        };
        let _ = lanes.tx[priority::lane(priority::NORMAL)].set(tx);
        Ok((lanes, rx))
    }

    /// The sending side of `lane`, opening the lane if needed.
    #[inline]
    fn sender(&self, lane: usize) -> Result<&SlotSender> {
        match self.tx[lane].get() {
            Some(tx) => Ok(tx),
            None => self.open(lane),
        }
    }

    #[cold]
    fn open(&self, lane: usize) -> Result<&SlotSender> {
        let mut handoff = lock(&self.handoff[lane]);
        if let Some(tx) = self.tx[lane].get() {
            return Ok(tx);
        }
        if self.closed.load(Ordering::Relaxed) {
            return Err(Error::KernelTerminated("its input queue is closed".into()));
        }
        let (tx, rx) = mpsc_slot_channel(self.capacity, self.slot_size)?;
        // The receiver is in place before the sender becomes visible: a worker that
        // sees the sender finds the receiver (both under this lock).
        *handoff = Some(rx);
        let tx = self.tx[lane].get_or_init(|| tx);
        self.opened.fetch_or(1 << lane, Ordering::Release);
        Ok(tx)
    }

    /// Messages waiting in every lane.
    fn depth(&self) -> usize {
        self.tx
            .iter()
            .filter_map(OnceLock::get)
            .map(|tx| tx.stats().depth)
            .sum()
    }

    /// Messages ever accepted into every lane: each lane's tail counts the slots its
    /// producers claimed, and a claim is only made for a message that is then written,
    /// so this is the kernel's `received` without a counter update per message.
    fn accepted(&self) -> u64 {
        self.tx
            .iter()
            .filter_map(OnceLock::get)
            .map(|tx| tx.stats().enqueued)
            .sum()
    }
}

/// State shared by a kernel's engine (the host side) and its worker thread.
struct Shared {
    id: KernelId,
    name: String,
    state: AtomicLifecycle,
    events: KernelEvents,
    /// Written by the kernel's worker (every turn), and its clock (every message):
    /// each on cache lines of its own, so that a sender's reads of the fields around
    /// them (`id`, `state`, `lanes`: every push reads them) do not miss each time the
    /// receiving kernel runs on another core (false sharing; perf annotate put a third
    /// of a K2K send's samples on those two loads).
    counters: CachePadded<KernelCounters>,
    hlc: CachePadded<HlcClock>,
    /// The input lanes.
    lanes: Lanes,
    /// The kernel's priority, carried by everything it sends.
    priority: u8,
    /// Set by the worker right before it parks; whoever sees it set unparks `sleeper`.
    sleeping: AtomicBool,
    /// The thread that parks when `sleeping` is set (a dedicated kernel's own thread;
    /// for a pooled kernel, the worker waiting for output space).
    sleeper: Mutex<Option<Thread>>,
    /// Whether termination drains (the kernel was active) or hands messages back.
    drain_on_terminate: AtomicBool,
    /// Set when the engine is dropped (nobody can send or receive any more).
    detached: AtomicBool,
    /// A pooled kernel whose output queue filled up ended its turn and waits for the
    /// receiver to take it below half (or to empty it): the receiver then clears this
    /// and schedules the kernel. No worker is held meanwhile.
    out_wait: AtomicBool,
    /// Written by the worker before it moves to `Terminated`.
    report: Mutex<Option<TerminateReport>>,
}

/// One CPU kernel, as the runtime core sees it.
struct CpuEngine {
    shared: Arc<Shared>,
    output: Mutex<SlotConsumer>,
    slot_size: usize,
    input_capacity: usize,
    output_capacity: usize,
    /// How the kernel is woken for a message or a state change.
    kick: Kick,
    join: Mutex<Option<JoinHandle<()>>>,
    /// Keeps the worker pool running while this kernel exists (pooled kernels);
    /// `reply_wait` asks it whether its workers take every core.
    pool: Option<Arc<PoolHandle>>,
    /// The runtime's table of kernels (this one leaves it when dropped).
    kernels: Arc<CpuKernels>,
    /// Serialises the host-side lifecycle changes (activate, deactivate, terminate).
    ctl: Mutex<()>,
}

/// How a kernel's worker is woken.
enum Kick {
    /// A dedicated thread: unparked when it sleeps.
    Thread,
    /// A task of the worker pool: scheduled for a turn.
    Task(Arc<Task>),
}

/// A pooled kernel's worker, run one turn at a time by the pool.
struct PooledKernel(Mutex<Option<Worker>>);

impl Runnable for PooledKernel {
    fn turn(&self) -> Turn {
        let mut slot = lock(&self.0);
        let Some(worker) = slot.as_mut() else {
            return Turn::Done;
        };
        let t = worker.turn(TURN_BUDGET);
        if matches!(t, Turn::Done) {
            // Drops the handler and marks the kernel `Terminated` if it is not yet.
            let w = slot.take();
            drop(slot);
            drop(w);
        }
        t
    }
}

#[allow(clippy::too_many_arguments)]
fn spawn_kernel(
    core: &Arc<RuntimeCore>,
    kernels: &Arc<CpuKernels>,
    pool: Option<Arc<PoolHandle>>,
    id: KernelId,
    name: &str,
    handler_name: &str,
    factory: &(dyn Fn() -> Box<dyn CpuHandler> + Send + Sync),
    opts: &LaunchOptions,
) -> Result<Arc<CpuEngine>> {
    let (lanes, rx) = Lanes::new(opts.queue_capacity, opts.slot_size)?;
    let (tx, output) = slot_channel(opts.output_capacity, opts.slot_size)?;
    let handler = catch_unwind(AssertUnwindSafe(factory)).map_err(|_| {
        Error::Device(format!(
            "the factory of CPU handler {handler_name:?} panicked"
        ))
    })?;
    let shared = Arc::new(Shared {
        id,
        name: name.to_string(),
        state: AtomicLifecycle::new(LifecycleState::Created),
        events: KernelEvents::default(),
        counters: CachePadded(KernelCounters::default()),
        hlc: CachePadded(HlcClock::new(core.kernel_node_id(id))),
        lanes,
        priority: opts.priority,
        sleeping: AtomicBool::new(false),
        sleeper: Mutex::new(None),
        drain_on_terminate: AtomicBool::new(false),
        detached: AtomicBool::new(false),
        out_wait: AtomicBool::new(false),
        report: Mutex::new(None),
    });
    shared.state.transition(LifecycleState::Launched)?;
    if opts.auto_activate {
        shared.state.transition(LifecycleState::Active)?;
    }
    let worker = Worker {
        _exit: ExitGuard(shared.clone()),
        scratch: Envelope {
            header: MessageHeader::default(),
            payload: Vec::new(),
        },
        shared: shared.clone(),
        core: Arc::downgrade(core),
        kernels: kernels.clone(),
        rx: {
            let mut rx_lanes: [Option<SlotReceiver>; LANES] = Default::default();
            rx_lanes[priority::lane(priority::NORMAL)] = Some(rx);
            rx_lanes
        },
        tx,
        handler,
        slot_size: opts.slot_size,
        output_capacity: opts.output_capacity,
        output_stalled: false,
        popped: false,
        space_turns: 0,
        emitted: false,
        pooled: pool.is_some(),
        taken: 1 << priority::lane(priority::NORMAL),
        ids: IdBlock::default(),
        latency: Latency::default(),
        processed: 0,
    };
    let (kick, join) = match &pool {
        Some(p) => (
            Kick::Task(Task::new(
                &p.0,
                Box::new(PooledKernel(Mutex::new(Some(worker)))),
            )),
            None,
        ),
        None => {
            // Thread names may not contain NUL; Linux shows the first 15 bytes.
            let thread_name: String = format!("rk-{name}")
                .chars()
                .map(|c| if c == '\0' { '?' } else { c })
                .collect();
            let join = std::thread::Builder::new()
                .name(thread_name)
                .spawn(move || worker.run())
                .map_err(|e| {
                    Error::Device(format!("cannot start the thread of kernel {name:?}: {e}"))
                })?;
            *lock(&shared.sleeper) = Some(join.thread().clone());
            (Kick::Thread, Some(join))
        }
    };
    let engine = Arc::new(CpuEngine {
        shared,
        output: Mutex::new(output),
        slot_size: opts.slot_size,
        input_capacity: opts.queue_capacity,
        output_capacity: opts.output_capacity,
        kick,
        join: Mutex::new(join),
        pool,
        kernels: kernels.clone(),
        ctl: Mutex::new(()),
    });
    // Nothing to do until the first message or state change: no turn yet.
    Ok(engine)
}

impl CpuEngine {
    /// Unparks the worker if (and only if) it is parked or about to park.
    #[inline]
    fn wake_if_sleeping(&self) {
        // Pairs with the fence in `Worker::park`: either the worker sees what we just
        // did (a pushed message, a freed output slot) before parking, or we see its
        // `sleeping` flag here.
        fence(Ordering::SeqCst);
        if self.shared.sleeping.load(Ordering::Relaxed)
            && self.shared.sleeping.swap(false, Ordering::AcqRel)
        {
            if let Some(t) = lock(&self.shared.sleeper).as_ref() {
                t.unpark();
            }
        }
    }

    /// One message into the lane of its priority, waking the kernel if it needs it
    /// (`KernelEngine::try_enqueue`, and the workers' K2K sends).
    #[inline(always)]
    fn push(&self, header: &MessageHeader, payload: &[u8]) -> Result<()> {
        let s = &self.shared;
        // The fast refusal. A push that races with termination is caught by the lane
        // itself: the worker closes its lanes before its final sweep, and a push either
        // claimed its slot before the close (the sweep waits for it and takes it) or
        // fails (`KernelTerminated`).
        if !s.state.get().accepts_messages() {
            return Err(Error::KernelTerminated(s.name.clone()));
        }
        let lane = priority::lane(header.priority());
        // The lane checks the payload's size.
        let pushed = s
            .lanes
            .sender(lane)
            .and_then(|tx| tx.try_push_wake(header, payload));
        match pushed {
            // `received` is read off the lanes (`Lanes::accepted`).
            Ok(wake) => {
                match &self.kick {
                    // Behind an unread message a pooled kernel needs no new turn: the
                    // turn that reads that one reads this one too, or sees it claimed
                    // before it goes idle (`Worker::turn`'s last look). A dedicated
                    // thread is woken as before.
                    Kick::Task(t) => {
                        if wake {
                            t.schedule();
                        }
                    }
                    Kick::Thread => self.wake_if_sleeping(),
                }
                Ok(())
            }
            Err(e) => Err(self.push_error(e)),
        }
    }

    /// The error of a push into this kernel's input that failed with `e`: a full lane
    /// reports the lane capacity, a closed one the kernel's name.
    #[cold]
    fn push_error(&self, e: Error) -> Error {
        match e {
            Error::QueueFull { .. } => Error::QueueFull {
                capacity: self.input_capacity,
            },
            Error::KernelTerminated(_) => Error::KernelTerminated(self.shared.name.clone()),
            e => e,
        }
    }

    /// After the host took `taken` replies from an output queue that held `before`:
    /// wakes a worker waiting for room, or resumes a pooled kernel that ended its turn
    /// on a full queue.
    #[inline]
    fn after_dequeue(&self, before: usize, taken: usize) {
        let cap = self.output_capacity;
        if taken > 0 {
            if before >= cap {
                // The worker may be parked in a handler waiting for an output slot
                // (it only waits for a full queue, and re-checks for room after
                // announcing it sleeps).
                self.wake_if_sleeping();
            }
            // A pooled kernel waiting for room resumes once the queue is at most half
            // full. Best effort (no fence): the empty case below is the guarantee.
            if fell_to_half(before, taken, cap) && self.shared.out_wait.load(Ordering::Acquire) {
                self.resume_output();
            }
        }
        if taken == 0 {
            // Found the queue empty. Pairs with the fence in `Worker::wait_for_output`.
            fence(Ordering::SeqCst);
            if self.shared.out_wait.load(Ordering::Relaxed) {
                self.resume_output();
            }
        }
    }

    /// Ends a pooled kernel's wait for output room: schedules it for a turn.
    #[cold]
    fn resume_output(&self) {
        if self.shared.out_wait.swap(false, Ordering::AcqRel) {
            self.kick();
        }
    }

    /// Tells the worker there is something new (a message, a state change).
    #[inline]
    fn kick(&self) {
        match &self.kick {
            Kick::Thread => self.wake_if_sleeping(),
            Kick::Task(t) => t.schedule(),
        }
    }

    fn state_changed(&self) {
        self.shared.events.state.notify(usize::MAX);
        match &self.kick {
            Kick::Thread => {
                if let Some(t) = lock(&self.shared.sleeper).as_ref() {
                    t.unpark();
                }
            }
            Kick::Task(t) => t.schedule(),
        }
    }
}

impl Drop for CpuEngine {
    fn drop(&mut self) {
        // Nobody can reach this kernel any more: let the worker exit.
        self.kernels.remove(self.shared.id);
        self.shared.detached.store(true, Ordering::SeqCst);
        self.state_changed();
    }
}

impl KernelEngine for CpuEngine {
    fn id(&self) -> KernelId {
        self.shared.id
    }

    /// No polling for replies while the pool's workers take every core: the poll would
    /// only slow the workers producing the reply (on 2 cores the batched pipeline went
    /// from 4.3-4.7 to 4.7-5.2 M tokens/s). The handle's default otherwise: a `call` to
    /// a pool with a free core is answered within the poll.
    fn reply_wait(&self) -> Option<Duration> {
        match &self.pool {
            Some(p) if p.0.saturated() => Some(Duration::ZERO),
            _ => None,
        }
    }

    fn name(&self) -> &str {
        &self.shared.name
    }

    fn state(&self) -> LifecycleState {
        self.shared.state.get()
    }

    fn slot_size(&self) -> usize {
        self.slot_size
    }

    fn input_capacity(&self) -> usize {
        self.input_capacity
    }

    #[inline]
    fn try_enqueue(&self, header: &MessageHeader, payload: &[u8]) -> Result<()> {
        self.push(header, payload)
    }

    /// As `try_enqueue` one by one, with one state check, one claim of slots per lane
    /// run ([`SlotSender::try_push_batch`]), one update of `received` and one wake-up
    /// of the kernel.
    fn try_enqueue_batch(&self, batch: &[(MessageHeader, &[u8])]) -> Result<usize> {
        let s = &self.shared;
        if batch.is_empty() {
            return Ok(0);
        }
        if !s.state.get().accepts_messages() {
            return Err(Error::KernelTerminated(s.name.clone()));
        }
        let mut done = 0;
        let mut failed = None;
        while done < batch.len() {
            // A run of messages of one priority goes into its lane at once.
            let lane = priority::lane(batch[done].0.priority());
            let run = batch[done..]
                .iter()
                .position(|(h, _)| priority::lane(h.priority()) != lane)
                .unwrap_or(batch.len() - done);
            let pushed = s
                .lanes
                .sender(lane)
                .and_then(|tx| tx.try_push_batch(&batch[done..done + run]));
            match pushed {
                Ok(n) => {
                    done += n;
                    if n < run {
                        // The lane is full (or the message after them does not fit a
                        // slot: the next call reports it).
                        break;
                    }
                }
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        if done > 0 {
            self.kick();
            return Ok(done);
        }
        Err(self.push_error(failed.unwrap_or(Error::QueueFull {
            capacity: self.input_capacity,
        })))
    }

    fn try_dequeue(&self) -> Result<Option<Envelope>> {
        let mut out = lock(&self.output);
        let before = out.len();
        let r = out.try_pop();
        drop(out);
        let taken = matches!(r, Ok(Some(_))) as usize;
        if r.is_ok() {
            self.after_dequeue(before, taken);
        }
        r
    }

    /// As `try_dequeue` up to `max` times, under one lock of the output queue and with
    /// one look at the kernel's wait for room.
    fn try_dequeue_batch(&self, out: &mut Vec<Envelope>, max: usize) -> Result<usize> {
        self.try_dequeue_batch_with(max, &mut |h, p| {
            out.push(Envelope {
                header: *h,
                payload: p.to_vec(),
            });
            true
        })
    }

    /// In place: each message is read straight out of its output slot.
    fn try_dequeue_batch_with(
        &self,
        max: usize,
        f: &mut dyn FnMut(&MessageHeader, &[u8]) -> bool,
    ) -> Result<usize> {
        if max == 0 {
            return Ok(0);
        }
        let mut q = lock(&self.output);
        let before = q.len();
        let mut taken = 0;
        let mut failed = None;
        while taken < max {
            match q.try_pop_with(|h, p| f(h, p)) {
                Ok(Some(more)) => {
                    taken += 1;
                    if !more {
                        break;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    // A corrupt slot: consumed and reported (after what came before it).
                    failed = Some(e);
                    break;
                }
            }
        }
        drop(q);
        self.after_dequeue(before, taken);
        match failed {
            Some(e) if taken == 0 => Err(e),
            _ => Ok(taken),
        }
    }

    fn output_depth(&self) -> usize {
        lock(&self.output).len()
    }

    fn activate(&self) -> Result<()> {
        let _g = lock(&self.ctl);
        self.shared.state.transition(LifecycleState::Active)?;
        self.state_changed();
        Ok(())
    }

    fn deactivate(&self) -> Result<()> {
        let _g = lock(&self.ctl);
        self.shared.state.transition(LifecycleState::Deactivated)?;
        self.state_changed();
        Ok(())
    }

    fn terminate(&self) -> BoxFuture<'_, Result<TerminateReport>> {
        Box::pin(async move {
            let span =
                tracing::info_span!("rk.terminate", backend = "cpu", kernel = %self.shared.name);
            {
                let _e = span.enter();
                let _g = lock(&self.ctl);
                let from = self.shared.state.get();
                from.check_transition(LifecycleState::Terminating)?;
                self.shared
                    .drain_on_terminate
                    .store(from == LifecycleState::Active, Ordering::Relaxed);
                // The CAS publishes `drain_on_terminate` to the worker (release/acquire).
                self.shared.state.transition(LifecycleState::Terminating)?;
                tracing::debug!(from = ?from, "terminating");
            }
            self.state_changed();
            // Wait (without blocking the executor thread) for the worker to finish.
            loop {
                let listener = self.shared.events.state.listen();
                if self.shared.state.get() == LifecycleState::Terminated {
                    break;
                }
                listener.await;
            }
            // Join only a thread that has already exited; otherwise detach it (it is
            // past its last use of the kernel and only dropping its handler remains).
            let join = lock(&self.join).take();
            if let Some(j) = join {
                if j.is_finished() {
                    if j.join().is_err() {
                        tracing::error!(kernel = %self.shared.name, "kernel thread panicked while exiting");
                    }
                } else {
                    drop(j);
                }
            }
            let mut report = lock(&self.shared.report).take().unwrap_or_default();
            report.replies_waiting = self.output_depth();
            let _e = span.enter();
            tracing::debug!(
                drained = report.drained,
                undelivered = report.undelivered.len(),
                replies_waiting = report.replies_waiting,
                "terminated"
            );
            Ok(report)
        })
    }

    fn events(&self) -> &KernelEvents {
        &self.shared.events
    }

    fn metrics(&self) -> KernelMetrics {
        let s = &self.shared;
        let mut m = s.counters.snapshot(
            s.id,
            &s.name,
            s.state.get(),
            s.lanes.depth(),
            self.output_depth(),
        );
        m.received = s.lanes.accepted();
        m
    }
}

/// The worker's side of a kernel: run by its dedicated thread, or in turns by the pool.
struct Worker {
    /// Reused for every message: no allocation per message on the hot path.
    scratch: Envelope,
    shared: Arc<Shared>,
    core: Weak<RuntimeCore>,
    /// The runtime's kernels, where K2K destinations are looked up.
    kernels: Arc<CpuKernels>,
    /// The receiving side of each open lane the worker has taken over.
    rx: [Option<SlotReceiver>; LANES],
    tx: SlotProducer,
    handler: Box<dyn CpuHandler>,
    slot_size: usize,
    output_capacity: usize,
    /// Set once, while terminating, the output queue stayed full past the grace period:
    /// from then on outputs that do not fit are dropped at once (counted, logged).
    output_stalled: bool,
    /// Inputs were taken since the last `input_space` notification (senders waiting for
    /// room are told once per turn, not once per message: each notification is a fence).
    popped: bool,
    /// Turns that took inputs since the last `input_space` notification.
    space_turns: u32,
    /// Outputs were written since the last `output` notification (likewise).
    emitted: bool,
    /// Run in turns by the pool (a full output queue then ends the turn instead of
    /// blocking the worker; see `Shared::out_wait`).
    pooled: bool,
    /// Bit `lane` is set when `rx[lane]` is taken over.
    taken: u8,
    /// Message ids reserved for this kernel, handed out one by one.
    ids: IdBlock,
    /// Handler latency, sampled.
    latency: Latency,
    /// Messages processed since the last [`Worker::flush_counts`].
    processed: u64,
    /// Dropped last: the kernel ends `Terminated` however the worker goes away.
    _exit: ExitGuard,
}

/// Makes sure a kernel ends `Terminated` (with waiters woken) however its worker ends.
struct ExitGuard(Arc<Shared>);

impl Drop for ExitGuard {
    fn drop(&mut self) {
        let s = &self.0;
        if s.state.get() != LifecycleState::Terminated {
            // Only reached on an abnormal exit (runtime dropped, internal panic).
            let _ = s.state.transition(LifecycleState::Terminating);
            let _ = s.state.transition(LifecycleState::Terminated);
        }
        s.events.notify_all();
    }
}

/// Message ids a worker reserved from the runtime ([`RuntimeCore::reserve_message_ids`]),
/// `next..end`.
#[derive(Default)]
struct IdBlock {
    next: u64,
    end: u64,
}

/// Message ids reserved at a time.
const ID_BLOCK: u64 = 256;

/// Senders waiting for input room are told at the latest after this many turns that
/// took inputs, however full the lanes still are (see [`Worker::notify_events`]).
const SPACE_EVERY: u32 = 8;

/// How many times a turn looks again for a message whose slot a producer has claimed
/// but not written yet, before it ends.
const IN_FLIGHT_WAITS: u32 = 64;

/// Destination kernels a turn keeps after looking them up.
const ROUTES: usize = 4;

/// What a handler's context sends through during one turn (or one drain): it keeps the
/// kernels it looked up for the rest of the turn (no lookup in the shared table, no
/// reference count per message), hands out message ids from a reserved block, reads
/// the kernel's physical clock once, and counts emitted messages locally. Dropped at
/// the end of the turn, so it holds no kernel beyond it.
struct Router<'t> {
    core: &'t RuntimeCore,
    kernels: &'t CpuKernels,
    shared: &'t Shared,
    ids: IdBlock,
    physical_ms: Option<u64>,
    routes: [Option<(KernelId, Arc<CpuEngine>)>; ROUTES],
    /// Where the next looked-up kernel goes (round robin).
    evict: usize,
    emitted: u64,
}

impl<'t> Router<'t> {
    fn new(
        core: &'t RuntimeCore,
        kernels: &'t CpuKernels,
        shared: &'t Shared,
        ids: IdBlock,
    ) -> Self {
        Router {
            core,
            kernels,
            shared,
            ids,
            physical_ms: None,
            routes: Default::default(),
            evict: 0,
            emitted: 0,
        }
    }

    /// The kernel's physical clock, read again.
    fn refresh_physical_ms(&mut self) -> u64 {
        let pt = self.shared.hlc.physical_ms();
        self.physical_ms = Some(pt);
        pt
    }

    /// Ends the turn: adds the emitted count to the kernel's counter and gives the
    /// unused ids back to the worker.
    fn finish(self) -> IdBlock {
        if self.emitted > 0 {
            self.shared
                .counters
                .emitted
                .fetch_add(self.emitted, Ordering::Relaxed);
        }
        self.ids
    }
}

impl TurnRouter for Router<'_> {
    #[inline]
    fn next_message_id(&mut self) -> u64 {
        if self.ids.next == self.ids.end {
            self.ids.next = self.core.reserve_message_ids(ID_BLOCK);
            self.ids.end = self.ids.next + ID_BLOCK;
        }
        self.ids.next += 1;
        self.ids.next - 1
    }

    #[inline]
    fn physical_ms(&mut self) -> u64 {
        match self.physical_ms {
            Some(pt) => pt,
            None => self.refresh_physical_ms(),
        }
    }

    /// The kernel's clock is only advanced by the thread running the kernel's turn
    /// (its handler's context hands out `&` to it for the call only, and a turn runs
    /// on one thread at a time): no read-modify-write needed.
    #[inline]
    fn tick(&mut self, hlc: &HlcClock) -> HlcTimestamp {
        hlc.tick_at_exclusive(self.physical_ms())
    }

    fn deliver(
        &mut self,
        target: &KernelTarget,
        mut header: MessageHeader,
        payload: &[u8],
    ) -> Result<K2kReceipt> {
        let KernelTarget::Id(id) = target else {
            return self.core.deliver(target, header, payload);
        };
        let hit = self
            .routes
            .iter()
            .flatten()
            .find(|(k, _)| k == id)
            .map(|(_, e)| e);
        let engine = match hit {
            Some(e) => e,
            None => {
                // Not looked up this turn; a kernel that is not there is answered by
                // the runtime as usual (not found, or K2K switched off).
                let Some(e) = self.kernels.get(*id) else {
                    return self.core.deliver(target, header, payload);
                };
                let i = self.evict;
                self.evict = (i + 1) % ROUTES;
                &self.routes[i].insert((*id, e)).1
            }
        };
        if header.flags & flags::K2K != 0 && !self.core.k2k_enabled() {
            // The runtime's answer (K2K switched off).
            return self.core.deliver_to(&**engine, header, payload);
        }
        // What `RuntimeCore::deliver_to` does, without its checks that the push itself
        // makes again (payload size; a CPU engine accepts every header).
        header.dest_kernel = engine.shared.id.0;
        match engine.push(&header, payload) {
            Ok(()) => Ok(K2kReceipt::Delivered),
            Err(Error::QueueFull { .. }) => Ok(K2kReceipt::QueueFull),
            Err(Error::KernelTerminated(_)) => Ok(K2kReceipt::NotFound),
            Err(e) => Err(e),
        }
    }

    fn publish_raw(
        &mut self,
        topic: &str,
        header: MessageHeader,
        payload: &[u8],
    ) -> Result<PublishReport> {
        self.core.publish_raw(topic, header, payload)
    }

    #[inline]
    fn count_emitted(&mut self, n: u64) {
        self.emitted += n;
    }
}

/// Messages between two timed handler calls of a kernel (the first is always timed).
pub const LATENCY_SAMPLE_EVERY: u64 = 16;

/// A kernel's handler latency, sampled: reading the clock twice per message costs
/// more than many handlers (about 75 ns on the development VM), so every
/// [`LATENCY_SAMPLE_EVERY`]th handler call is timed, and each sample stands for the
/// calls since the previous one (they are recorded with its value). The histogram
/// still counts every handled message (`latency.count` is the number of handler calls,
/// as before); its percentiles come from a 1-in-16 systematic sample of them.
#[derive(Default)]
struct Latency {
    /// Handler calls so far.
    calls: u64,
    /// The last sample, ns.
    last: u64,
    /// Calls since the last sample that are not recorded yet.
    pending: u64,
}

impl Latency {
    /// Whether the next handler call is timed.
    #[inline]
    fn due(&self) -> bool {
        self.calls.is_multiple_of(LATENCY_SAMPLE_EVERY)
    }

    /// One handler call ended; `start` is when it began if it was timed.
    #[inline]
    fn handled(&mut self, start: Option<Instant>, hist: &LatencyHistogram) {
        self.calls += 1;
        match start {
            Some(t) => {
                self.flush(hist);
                self.last = t.elapsed().as_nanos() as u64;
                hist.record(self.last);
            }
            None => self.pending += 1,
        }
    }

    /// Records the calls not recorded yet (with the last sample's value).
    fn flush(&mut self, hist: &LatencyHistogram) {
        let n = std::mem::take(&mut self.pending);
        hist.record_n(self.last, n);
    }
}

/// Output sink of one handler call: writes into the kernel's output ring.
struct Sink<'w> {
    tx: &'w mut SlotProducer,
    shared: &'w Shared,
    capacity: usize,
    stalled: &'w mut bool,
    /// Set when an output was written (the turn notifies receivers when it ends).
    emitted: &'w mut bool,
    /// Whether an output of this call was dropped (already counted in `dropped`).
    dropped: bool,
}

impl Sink<'_> {
    /// Whether to keep waiting for output space; `deadline` starts the drain grace.
    fn keep_waiting(&mut self, deadline: &mut Option<Instant>) -> bool {
        if self.shared.detached.load(Ordering::Relaxed) {
            return false;
        }
        match self.shared.state.get() {
            LifecycleState::Terminating | LifecycleState::Terminated => {
                if *self.stalled {
                    return false;
                }
                let d = *deadline.get_or_insert_with(|| Instant::now() + DRAIN_OUTPUT_GRACE);
                if Instant::now() >= d {
                    *self.stalled = true;
                    return false;
                }
                true
            }
            _ => true,
        }
    }
}

impl OutputSink for Sink<'_> {
    fn emit(&mut self, header: &MessageHeader, payload: &[u8]) -> Result<()> {
        let mut spins = 0u32;
        let mut deadline = None;
        loop {
            match self.tx.try_push(header, payload) {
                Ok(()) => {
                    *self.emitted = true;
                    return Ok(());
                }
                Err(Error::QueueFull { .. }) => {
                    if !self.keep_waiting(&mut deadline) {
                        self.shared.counters.dropped.fetch_add(1, Ordering::Relaxed);
                        self.dropped = true;
                        tracing::warn!(
                            kernel = %self.shared.name,
                            type_id = header.type_id,
                            correlation_id = header.correlation_id,
                            "output queue full while terminating: output dropped"
                        );
                        return Err(Error::QueueFull {
                            capacity: self.capacity,
                        });
                    }
                    // Wake anyone who could drain the output queue (and senders waiting
                    // for the input room this turn freed: the host may be both), then
                    // back off.
                    self.shared.events.output.notify(usize::MAX);
                    self.shared.events.input_space.notify(usize::MAX);
                    spins += 1;
                    if spins < 64 {
                        std::hint::spin_loop();
                    } else if spins < 128 {
                        std::thread::yield_now();
                    } else {
                        *lock(&self.shared.sleeper) = Some(std::thread::current());
                        self.shared.sleeping.store(true, Ordering::SeqCst);
                        // Pairs with the fence in `CpuEngine::wake_if_sleeping`, which
                        // the receiver runs after taking from a full queue: either it
                        // sees `sleeping`, or this sees the room it made.
                        fence(Ordering::SeqCst);
                        if self.tx.free() == 0 {
                            std::thread::park_timeout(OUTPUT_PARK);
                        }
                        self.shared.sleeping.store(false, Ordering::Relaxed);
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }
}

impl Worker {
    /// A dedicated thread's loop: turns, and spin-then-park while idle.
    fn run(mut self) {
        let span = tracing::info_span!("rk.kernel", backend = "cpu", id = %self.shared.id, kernel = %self.shared.name);
        let _e = span.enter();
        tracing::debug!("worker started");
        *lock(&self.shared.sleeper) = Some(std::thread::current());
        loop {
            let observed = self.shared.state.get();
            match self.turn(BATCH) {
                Turn::Done => break,
                Turn::More => {}
                Turn::Idle => self.idle(observed),
            }
        }
    }

    /// Handles up to `budget` messages (or finishes termination).
    fn turn(&mut self, budget: usize) -> Turn {
        if self.shared.detached.load(Ordering::Acquire) {
            tracing::debug!(kernel = %self.shared.name, "engine dropped: worker exits");
            return Turn::Done;
        }
        match self.shared.state.get() {
            LifecycleState::Active => {
                if self.pooled && self.shared.out_wait.load(Ordering::Acquire) {
                    // Still waiting for the receiver to make room.
                    return Turn::Idle;
                }
                let Some(core) = self.core.upgrade() else {
                    tracing::debug!(kernel = %self.shared.name, "runtime dropped: worker exits");
                    return Turn::Done;
                };
                let shared = self.shared.clone();
                let kernels = self.kernels.clone();
                let mut router =
                    Router::new(&core, &kernels, &shared, std::mem::take(&mut self.ids));
                let mut env = std::mem::replace(
                    &mut self.scratch,
                    Envelope {
                        header: MessageHeader::default(),
                        payload: Vec::new(),
                    },
                );
                let mut n = 0;
                let mut drained = false;
                let mut waits = 0;
                while n < budget
                    && shared.state.get() == LifecycleState::Active
                    && !(self.pooled && !self.tx.has_room() && self.wait_for_output())
                {
                    if !self.pop_into(&mut env) {
                        // A producer that claimed the next slot is writing it right now
                        // (a stream from another core): wait a moment for it instead of
                        // ending the turn.
                        if waits < IN_FLIGHT_WAITS && self.has_input() {
                            waits += 1;
                            std::hint::spin_loop();
                            continue;
                        }
                        drained = true;
                        break;
                    }
                    self.handle_one(&mut router, &env);
                    n += 1;
                }
                self.scratch = env;
                self.ids = router.finish();
                self.flush_counts();
                self.notify_events();
                if n == budget {
                    Turn::More
                } else if drained && self.claimed_meanwhile() {
                    // A message is being written behind the last one read, and its
                    // producer skipped the wake-up (`CpuEngine::try_enqueue`): run again.
                    Turn::More
                } else {
                    Turn::Idle
                }
            }
            LifecycleState::Terminating => {
                self.finish();
                Turn::Done
            }
            LifecycleState::Terminated => Turn::Done,
            LifecycleState::Created | LifecycleState::Launched | LifecycleState::Deactivated => {
                Turn::Idle
            }
        }
    }

    /// The receiving side of `lane`, taking it over from the host side if the lane
    /// was opened after launch; `None` while the lane is not open.
    #[inline]
    fn lane_rx<'r>(
        rx: &'r mut [Option<SlotReceiver>; LANES],
        lanes: &Lanes,
        lane: usize,
    ) -> Option<&'r mut SlotReceiver> {
        if rx[lane].is_none() {
            lanes.tx[lane].get()?;
            rx[lane] = lock(&lanes.handoff[lane]).take();
        }
        rx[lane].as_mut()
    }

    /// Copies the next input message (the oldest of the highest non-empty lane) into
    /// `env`, reusing its buffer; `false` when every lane is empty. A corrupt slot is
    /// counted as dropped and skipped.
    fn pop_into(&mut self, env: &mut Envelope) -> bool {
        let opened = self.shared.lanes.opened.load(Ordering::Acquire);
        if opened != self.taken {
            self.take_lanes(opened);
        }
        let shared = &*self.shared;
        // The lanes this worker reads, highest first.
        let mut lanes = self.taken;
        while lanes != 0 {
            let lane = (u8::BITS - 1 - lanes.leading_zeros()) as usize;
            lanes &= !(1 << lane);
            let Some(rx) = self.rx[lane].as_mut() else {
                continue;
            };
            loop {
                match rx.try_pop_into(env) {
                    Ok(true) => {
                        self.popped = true;
                        return true;
                    }
                    Ok(false) => break,
                    Err(e) => {
                        self.popped = true;
                        shared.counters.dropped.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(error = %e, "corrupt input slot dropped");
                    }
                }
            }
        }
        false
    }

    /// Takes over the receivers of lanes opened since the last look (`opened` is the
    /// lanes' open mask).
    #[cold]
    fn take_lanes(&mut self, opened: u8) {
        for lane in 0..LANES {
            if opened & !self.taken & (1 << lane) != 0
                && Self::lane_rx(&mut self.rx, &self.shared.lanes, lane).is_some()
            {
                self.taken |= 1 << lane;
            }
        }
    }

    /// Closes every lane (no push succeeds afterwards, no lane opens) and waits until
    /// the messages of producers that claimed a slot before the close are written, so
    /// that popping until empty takes every message the kernel will ever get.
    fn close_lanes(&mut self) {
        let lanes = &self.shared.lanes;
        for lane in 0..LANES {
            // Under the lane's lock: a lane being opened right now is open (and taken
            // over below) or stays shut.
            let _g = lock(&lanes.handoff[lane]);
            lanes.closed.store(true, Ordering::Relaxed);
        }
        for lane in 0..LANES {
            if let Some(rx) = Self::lane_rx(&mut self.rx, lanes, lane) {
                rx.close();
                let mut spins = 0u32;
                while !rx.is_complete() {
                    spins += 1;
                    if spins < 64 {
                        std::hint::spin_loop();
                    } else {
                        std::thread::yield_now();
                    }
                }
            }
        }
    }

    /// Takes the next input message, highest lane first (see [`Worker::pop_into`]).
    fn pop(&mut self) -> Option<Envelope> {
        let mut env = Envelope {
            header: MessageHeader::default(),
            payload: Vec::new(),
        };
        self.pop_into(&mut env).then_some(env)
    }

    /// Whether a message waits in any lane (a lane opened but not taken over yet
    /// counts: it was opened for a message).
    fn has_input(&self) -> bool {
        self.rx
            .iter()
            .zip(&self.shared.lanes.tx)
            .any(|(rx, tx)| match rx {
                Some(rx) => !rx.is_empty(),
                None => tx.get().is_some(),
            })
    }

    /// Whether no lane this worker reads holds more than half its capacity.
    fn lanes_at_most_half(&self) -> bool {
        self.rx
            .iter()
            .flatten()
            .all(|rx| rx.len() <= rx.capacity() / 2)
    }

    /// The lanes looked empty: whether a producer claimed a slot meanwhile (its
    /// message may not be written yet). Pairs with the claim and the look at the
    /// previous slot in [`SlotSender::try_push_wake`]: either the producer saw the
    /// message before its own still unread and skipped the wake-up, and then this sees
    /// its claim, or it saw everything read and wakes the kernel itself.
    fn claimed_meanwhile(&self) -> bool {
        fence(Ordering::SeqCst);
        self.has_input()
    }

    /// Whether there is something to react to, having last seen `observed`.
    fn has_work(&self, observed: LifecycleState) -> bool {
        self.shared.detached.load(Ordering::Relaxed)
            || self.shared.state.get() != observed
            || (observed == LifecycleState::Active && self.has_input())
    }

    /// Waits for work: spins briefly when active, then parks.
    fn idle(&self, observed: LifecycleState) {
        if observed == LifecycleState::Active {
            let start = Instant::now();
            loop {
                for _ in 0..64 {
                    if self.has_work(observed) {
                        return;
                    }
                    std::hint::spin_loop();
                }
                if start.elapsed() >= SPIN_BEFORE_PARK {
                    break;
                }
            }
        }
        self.shared.sleeping.store(true, Ordering::SeqCst);
        // Pairs with the fence in `CpuEngine::wake_if_sleeping`.
        fence(Ordering::SeqCst);
        if !self.has_work(observed) {
            std::thread::park_timeout(PARK_MAX);
        }
        self.shared.sleeping.store(false, Ordering::Relaxed);
    }

    /// The output queue is full: announces that this (pooled) kernel waits for room;
    /// `true` when it must wait (its turn ends), `false` when the receiver made room
    /// meanwhile (below half full).
    fn wait_for_output(&mut self) -> bool {
        let s = &self.shared;
        s.out_wait.store(true, Ordering::SeqCst);
        // Pairs with the fence in `CpuEngine::try_dequeue` (taken on an empty queue):
        // either the receiver sees `out_wait`, or this sees the room it made.
        fence(Ordering::SeqCst);
        if self.tx.free() >= self.output_capacity - self.output_capacity / 2 {
            s.out_wait.store(false, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Tells waiting senders and receivers about the room and the outputs of this turn.
    /// Senders waiting for input room are told once no lane is more than half full (a
    /// sender that filled a lane then refills half of it per wake-up, not one turn's
    /// worth: on the 2-core machine the host's sender was woken, an OS wake-up each,
    /// after every 64-message turn of a pipeline's first stage), or at the latest after
    /// [`SPACE_EVERY`] turns that took inputs (other producers may keep a lane above
    /// half).
    fn notify_events(&mut self) {
        if self.popped {
            self.space_turns += 1;
            if self.space_turns >= SPACE_EVERY || self.lanes_at_most_half() {
                self.popped = false;
                self.space_turns = 0;
                self.shared.events.input_space.notify(usize::MAX);
            }
        }
        if std::mem::take(&mut self.emitted) {
            self.shared.events.output.notify(usize::MAX);
        }
    }

    /// Runs the handler on one message and counts it: `processed` (added to the
    /// shared counter when the turn ends, [`Worker::flush_counts`]), or `dropped`
    /// (counted at once, logged). Every [`LATENCY_SAMPLE_EVERY`]th message of the
    /// kernel is timed; see [`Latency`].
    fn handle_one(&mut self, router: &mut Router<'_>, env: &Envelope) {
        let s = &*self.shared;
        let remote = env.header.hlc();
        // The turn's clock reading; an old reading only makes the drift check
        // stricter, so a refusal is checked again against a fresh one.
        // Only this thread advances the kernel's clock during the turn (see
        // `Router::tick`).
        let merged = s
            .hlc
            .update_at_exclusive(&remote, router.physical_ms())
            .or_else(|_| {
                s.hlc
                    .update_at_exclusive(&remote, router.refresh_physical_ms())
            });
        let merged = match merged {
            Ok(ts) => ts,
            Err(e) => {
                s.counters.dropped.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    error = %e,
                    message_id = env.header.message_id,
                    "message dropped: its timestamp is too far ahead of this kernel's clock"
                );
                return;
            }
        };
        let start = self.latency.due().then(Instant::now);
        let mut sink = Sink {
            tx: &mut self.tx,
            shared: s,
            capacity: self.output_capacity,
            stalled: &mut self.output_stalled,
            emitted: &mut self.emitted,
            dropped: false,
        };
        let handler = &mut self.handler;
        // The handler's error, taken inside the unwinding closure: only a panic crosses
        // `catch_unwind` (a `Result` of a few words, in registers). Moving the handler's
        // whole `Result<(), Error>` out through it read back what the handler had just
        // written, another store-forwarding stall per message.
        let mut failed: Option<Error> = None;
        let panicked = {
            let mut ctx = KernelContext::in_turn(
                s.id,
                &s.name,
                router,
                &s.hlc,
                &s.counters,
                env.header,
                self.slot_size,
                s.priority,
                &mut sink,
            );
            // The request as the handler sees it: the merged timestamp in place of the
            // sender's, set in the context itself. Setting it in a copy of the header
            // that was then moved into the context read the two fields back (16 bytes
            // at a time) while they were still in the store buffer: a store-forwarding
            // stall on every message (perf annotate).
            ctx.set_request_timestamp(merged);
            catch_unwind(AssertUnwindSafe(|| {
                if let Err(e) = handler.handle(&mut ctx, env) {
                    failed = Some(e);
                }
            }))
        };
        self.latency.handled(start, &s.counters.latency);
        match (panicked, failed) {
            (Ok(()), None) => self.processed += 1,
            (Ok(()), Some(e)) => {
                if !sink.dropped {
                    s.counters.dropped.fetch_add(1, Ordering::Relaxed);
                }
                tracing::warn!(
                    error = %e,
                    message_id = env.header.message_id,
                    type_id = env.header.type_id,
                    "handler error: message dropped"
                );
            }
            (Err(panic), _) => {
                if !sink.dropped {
                    s.counters.dropped.fetch_add(1, Ordering::Relaxed);
                }
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "non-string panic".to_string());
                tracing::error!(
                    panic = %what,
                    message_id = env.header.message_id,
                    "handler panicked: message dropped, kernel goes on"
                );
            }
        }
    }

    /// Adds what this worker counted locally to the kernel's shared counters: the
    /// latency samples first, then `processed` (so a reader that sees `processed`
    /// reach `n` finds `n` latency samples too).
    fn flush_counts(&mut self) {
        let c = &self.shared.counters;
        self.latency.flush(&c.latency);
        let n = std::mem::take(&mut self.processed);
        if n > 0 {
            c.processed.fetch_add(n, Ordering::Release);
        }
    }

    /// Termination: drain (the kernel was active) or hand the queue back, then move to
    /// `Terminated`.
    fn finish(&mut self) {
        self.close_lanes();
        let mut report = TerminateReport::default();
        let core = if self.shared.drain_on_terminate.load(Ordering::Relaxed) {
            self.core.upgrade()
        } else {
            None
        };
        let shared = self.shared.clone();
        let kernels = self.kernels.clone();
        let mut router = core
            .as_ref()
            .map(|c| Router::new(c, &kernels, &shared, std::mem::take(&mut self.ids)));
        while let Some(env) = self.pop() {
            match router.as_mut() {
                Some(router) => {
                    self.handle_one(router, &env);
                    report.drained += 1;
                }
                None => report.undelivered.push(env),
            }
        }
        if let Some(router) = router {
            self.ids = router.finish();
        }
        self.flush_counts();
        drop(core);
        *lock(&self.shared.report) = Some(report);
        if let Err(e) = self.shared.state.transition(LifecycleState::Terminated) {
            tracing::error!(error = %e, "unexpected state at the end of termination");
        }
        self.shared.events.notify_all();
    }
}

/// Whether an output queue that held `before` replies (a snapshot taken before the
/// dequeue) fell from over half of `cap` to at most half by the host taking `taken`.
/// The worker keeps writing meanwhile, so `taken` may exceed `before`: everything of
/// the snapshot was taken, which counts as having fallen to half (a best-effort signal:
/// the caller's empty-queue check is the guarantee).
fn fell_to_half(before: usize, taken: usize, cap: usize) -> bool {
    before > cap / 2 && before.saturating_sub(taken) <= cap / 2
}

#[cfg(test)]
mod tests {
    use super::fell_to_half;

    #[test]
    fn more_taken_than_the_snapshot_held_is_not_an_overflow() {
        // The worker added replies between the snapshot and the dequeue.
        assert!(fell_to_half(3, 4, 4));
        assert!(fell_to_half(3, 9, 4));
        // The ordinary cases.
        assert!(fell_to_half(4, 2, 4));
        assert!(!fell_to_half(4, 1, 4));
        assert!(!fell_to_half(2, 1, 4));
        assert!(!fell_to_half(2, 5, 4));
    }
}
