//! The M:N scheduler of the CPU runtime: kernels are [`Task`]s run in turns by a small
//! pool of worker threads (see `DESIGN.md` in this crate for why it is built this way).
//!
//! * Each worker owns a FIFO deque (`crossbeam-deque`); a task woken by a handler running
//!   on a worker goes to that worker's deque and runs there next, without an OS wake-up.
//!   Tasks woken from outside the pool (the host) go to the shared injector queue.
//! * Idle workers look for work (own deque, injector, then steal from the others) for
//!   a search window ([`SEARCH_SPIN`] at first, adapted between [`SEARCH_MIN`] and
//!   [`SEARCH_MAX`], see [`Pool::search`]), then park. Producers unpark a parked worker
//!   only when no worker is searching, so the hot path is a queue push plus a fence and
//!   two loads.
//! * A task whose turn used its whole budget goes to the back of the injector, behind
//!   every task waiting there, and a worker looks at the injector first every
//!   [`GLOBAL_EVERY`] turns: a flooded kernel cannot starve the others.
//! * A monitor thread watches for workers stuck in one turn (a handler that blocks, or
//!   spins waiting for a full downstream queue) while work waits: it then starts an extra
//!   worker, so blocked handlers cannot deadlock the pool. Extra workers retire when idle.
//!   A worker whose thread the OS reports runnable (computing, or preempted on a
//!   machine with more threads than cores) gets help only after [`RUNNABLE_STALL`].

use ringkernel_core::error::{Error, Result};
use ringkernel_core::util::lock;
use std::cell::RefCell;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::Thread;
use std::time::Duration;

use crossbeam_deque::{Injector, Steal, Stealer, Worker as Deque};

/// How long an idle worker keeps looking for work before it parks, at first: the pool
/// adapts it between [`SEARCH_MIN`] and [`SEARCH_MAX`] (see [`Pool::search`]).
pub const SEARCH_SPIN: Duration = Duration::from_micros(200);
/// Shortest search window.
pub const SEARCH_MIN: Duration = Duration::from_micros(50);
/// Longest search window.
pub const SEARCH_MAX: Duration = Duration::from_millis(2);
/// A gap this long between two looks of a searching worker (a look takes well under a
/// microsecond) means the OS preempted it: it stops searching and parks.
const PREEMPTED: Duration = Duration::from_micros(30);
/// A searching worker parks once other workers have been running turns without a
/// pause for this long: such a worker keeps what it produces on its own deque and
/// calls for help when more than one task waits there, so spinning beside it only
/// takes a core from the threads that feed the pool (on a 2-core machine, the host's).
/// Workers that run short turns between pauses (a `call` round trip) do not count, so
/// the searcher stays ready for the host's next request.
const BUSY_SEARCH: Duration = Duration::from_micros(1);
/// A parked worker woken for work within this many search windows of parking had
/// parked too early: the window doubles.
const PREMATURE: u64 = 4;
/// A worker polls the injector before its own deque every this many turns.
const GLOBAL_EVERY: u64 = 31;
/// How often the monitor samples the workers while any of them runs.
const MONITOR_TICK: Duration = Duration::from_millis(1);
/// A turn running this long while other work waits and no worker is free counts as
/// blocked: the monitor starts an extra worker.
pub const STALL: Duration = Duration::from_millis(4);
/// A turn whose thread the OS reports runnable (computing, or preempted on a machine
/// with more threads than cores) counts as blocked only after this long: a worker that
/// waits for a core is not helped by another thread that would wait too.
pub const RUNNABLE_STALL: Duration = Duration::from_millis(50);
/// How long an extra worker stays parked without work before it exits.
pub const RETIRE_AFTER: Duration = Duration::from_millis(100);
/// Most worker threads one pool runs at once (its base workers plus the extras started
/// for blocked turns).
pub const MAX_THREADS: usize = 512;

/// What one turn of a task reports.
pub(crate) enum Turn {
    /// Nothing more to do until the task is woken again.
    Idle,
    /// The turn's budget ran out with work left: run again later.
    More,
    /// The task is finished and is never run again.
    Done,
}

/// The body of a task: one turn at a time, never two at once.
pub(crate) trait Runnable: Send + Sync + 'static {
    /// Runs one bounded turn.
    fn turn(&self) -> Turn;
}

const IDLE: u8 = 0;
/// In a queue, about to run (bit 0 is "someone asked for a turn").
const SCHEDULED: u8 = 1;
/// Running; `RUNNING | SCHEDULED` (3) is running and woken again during the turn.
const RUNNING: u8 = 2;
const DONE: u8 = 4;

/// A schedulable unit (one kernel) of a [`Pool`].
pub(crate) struct Task {
    state: AtomicU8,
    pool: Arc<Pool>,
    body: Box<dyn Runnable>,
}

impl Task {
    /// A new idle task of `pool`.
    pub(crate) fn new(pool: &Arc<Pool>, body: Box<dyn Runnable>) -> Arc<Task> {
        Arc::new(Task {
            state: AtomicU8::new(IDLE),
            pool: pool.clone(),
            body,
        })
    }

    /// Asks for a turn: queues the task if it is idle, or marks a running task to run
    /// again. One atomic read-modify-write when the task is already queued or running.
    #[inline]
    pub(crate) fn schedule(self: &Arc<Self>) {
        // An RMW (not a load): it orders the caller's earlier writes (a pushed message)
        // before the worker's RMW that starts or ends the turn, whichever comes later.
        if self.state.fetch_or(SCHEDULED, Ordering::AcqRel) == IDLE {
            self.pool.push(self.clone());
        }
    }
}

thread_local! {
    /// The deque of the pool worker running on this thread (none elsewhere).
    static LOCAL: RefCell<Option<Local>> = const { RefCell::new(None) };
}

struct Local {
    pool: usize,
    deque: Deque<Arc<Task>>,
}

/// One worker position: its deque's stealing end and what the monitor watches.
#[derive(Default)]
struct Slot {
    in_use: AtomicBool,
    stealer: OnceLock<Stealer<Arc<Task>>>,
    /// The owning end of the deque while no thread holds the slot.
    deque: Mutex<Option<Deque<Arc<Task>>>>,
    thread: Mutex<Option<Thread>>,
    /// Set by whoever takes the worker off the idle list to wake it.
    notified: AtomicBool,
    /// Turn boundaries: odd while a turn runs.
    turns: AtomicU64,
    /// Set by the monitor when the worker has been in one turn for a monitor tick or
    /// more: from then on other workers may take even the last task of its deque.
    stuck: AtomicBool,
    /// When the worker last parked after a search found nothing (ns since the pool's
    /// start; 0: it did not).
    parked_at: AtomicU64,
    /// The worker thread's `/proc` stat file (Linux), for [`Slot::runnable`].
    stat: Mutex<Option<std::path::PathBuf>>,
}

impl Slot {
    /// Whether the OS reports the slot's worker thread runnable (state `R`: running or
    /// waiting for a core) rather than sleeping or blocked. `false` where it cannot
    /// tell (no `/proc`): a long turn then counts as blocked, as it always did.
    fn runnable(&self) -> bool {
        let Some(path) = lock(&self.stat).clone() else {
            return false;
        };
        std::fs::read_to_string(path).is_ok_and(|stat| {
            // `tid (comm) S ...`: the name may hold spaces and parentheses.
            stat.rfind(')')
                .and_then(|i| stat[i + 1..].trim_start().chars().next())
                == Some('R')
        })
    }

    /// Whether another worker may steal from this slot's deque. A lone task is left to
    /// the owner, which runs it right after its current turn with the messages it was
    /// just handed still in its cache (a pipeline's stages then follow each other on
    /// one core); more than one, or any while the owner is stuck in a turn, are fair
    /// game.
    #[inline]
    fn stealable(&self) -> bool {
        self.stealer.get().is_some_and(|s| match s.len() {
            0 => false,
            1 => self.stuck.load(Ordering::Relaxed),
            _ => true,
        })
    }
}

/// A pool of worker threads running [`Task`]s. Shut down (threads exit, queued tasks are
/// dropped) by [`PoolHandle`]'s drop.
pub(crate) struct Pool {
    injector: Injector<Arc<Task>>,
    slots: Box<[Slot]>,
    /// Slots ever used (the stealing loops look at these).
    high: AtomicUsize,
    /// Worker threads alive.
    live: AtomicUsize,
    /// Worker threads the pool keeps when idle.
    target: usize,
    /// Extra workers started for blocked turns (a counter, for tests and metrics).
    extra_started: AtomicUsize,
    /// Parked workers woken so far (OS wake-ups; a counter, for metrics).
    wakeups: AtomicU64,
    /// Nanoseconds idle workers spent looking for work (spinning) before they found
    /// some or parked.
    search_ns: AtomicU64,
    /// The current search window, ns (see [`Pool::search`]).
    window_ns: AtomicU64,
    /// What `parked_at` counts from.
    epoch: std::time::Instant,
    searching: AtomicUsize,
    parked: AtomicUsize,
    idle: Mutex<Vec<usize>>,
    shutdown: AtomicBool,
    monitor: Mutex<Option<Thread>>,
    monitor_parked: AtomicBool,
}

/// Keeps a [`Pool`] running; the pool shuts down when the last handle is dropped.
pub(crate) struct PoolHandle(pub(crate) Arc<Pool>);

impl Drop for PoolHandle {
    fn drop(&mut self) {
        self.0.shutdown();
    }
}

impl Pool {
    /// Starts `workers` worker threads and the monitor.
    pub(crate) fn start(workers: usize) -> Result<Arc<PoolHandle>> {
        if workers == 0 || workers > MAX_THREADS {
            return Err(Error::invalid(format!(
                "the CPU worker pool needs 1..={MAX_THREADS} workers, got {workers}"
            )));
        }
        let pool = Arc::new(Pool::new(workers));
        let handle = Arc::new(PoolHandle(pool.clone()));
        for _ in 0..workers {
            pool.spawn_worker()?;
        }
        let p = pool.clone();
        let m = std::thread::Builder::new()
            .name("rk-monitor".into())
            .spawn(move || p.monitor())
            .map_err(|e| Error::Device(format!("cannot start the CPU pool monitor: {e}")))?;
        *lock(&pool.monitor) = Some(m.thread().clone());
        Ok(handle)
    }

    /// A pool of `workers` with no thread started yet.
    fn new(workers: usize) -> Pool {
        Pool {
            injector: Injector::new(),
            slots: (0..MAX_THREADS).map(|_| Slot::default()).collect(),
            high: AtomicUsize::new(0),
            live: AtomicUsize::new(0),
            target: workers,
            extra_started: AtomicUsize::new(0),
            wakeups: AtomicU64::new(0),
            search_ns: AtomicU64::new(0),
            window_ns: AtomicU64::new(SEARCH_SPIN.as_nanos() as u64),
            epoch: std::time::Instant::now(),
            searching: AtomicUsize::new(0),
            parked: AtomicUsize::new(0),
            idle: Mutex::new(Vec::new()),
            shutdown: AtomicBool::new(false),
            monitor: Mutex::new(None),
            monitor_parked: AtomicBool::new(false),
        }
    }

    /// Worker threads alive now.
    pub(crate) fn threads(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }

    /// Extra workers started so far because turns were blocked.
    pub(crate) fn extra_started(&self) -> usize {
        self.extra_started.load(Ordering::Relaxed)
    }

    /// Turns run so far, by every worker.
    pub(crate) fn turns(&self) -> u64 {
        self.slots[..self.high.load(Ordering::Acquire)]
            .iter()
            .map(|s| s.turns.load(Ordering::Relaxed) / 2)
            .sum()
    }

    /// Parked workers woken so far.
    pub(crate) fn wakeups(&self) -> u64 {
        self.wakeups.load(Ordering::Relaxed)
    }

    /// Time idle workers spent spinning for work so far.
    pub(crate) fn search_time(&self) -> Duration {
        Duration::from_nanos(self.search_ns.load(Ordering::Relaxed))
    }

    /// Whether this pool's workers take every core: none parked, and at least as many
    /// awake as the machine has cores. A host thread that polls for a reply then only
    /// takes a core from the workers producing it.
    pub(crate) fn saturated(&self) -> bool {
        static CORES: OnceLock<usize> = OnceLock::new();
        let cores =
            *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        self.parked.load(Ordering::Relaxed) == 0 && self.live.load(Ordering::Relaxed) >= cores
    }

    fn id(&self) -> usize {
        self as *const Pool as usize
    }

    /// Starts one worker thread in a free slot.
    fn spawn_worker(self: &Arc<Self>) -> Result<()> {
        let Some(idx) = self.slots.iter().position(|s| {
            s.in_use
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        }) else {
            return Err(Error::Device(format!(
                "the CPU worker pool already runs {MAX_THREADS} threads"
            )));
        };
        let slot = &self.slots[idx];
        let deque = lock(&slot.deque).take().unwrap_or_else(|| {
            let d = Deque::new_fifo();
            let _ = slot.stealer.set(d.stealer());
            d
        });
        self.high.fetch_max(idx + 1, Ordering::AcqRel);
        self.live.fetch_add(1, Ordering::AcqRel);
        let pool = self.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("rk-worker-{idx}"))
            .spawn(move || pool.worker(idx, deque));
        match spawned {
            Ok(j) => {
                *lock(&slot.thread) = Some(j.thread().clone());
                Ok(())
            }
            Err(e) => {
                self.live.fetch_sub(1, Ordering::AcqRel);
                slot.in_use.store(false, Ordering::Release);
                Err(Error::Device(format!("cannot start a CPU worker: {e}")))
            }
        }
    }

    /// Queues a task that asked for a turn.
    fn push(&self, task: Arc<Task>) {
        let me = self.id();
        let mut task = Some(task);
        // `try_with`: a thread being torn down queues through the injector.
        let _ = LOCAL.try_with(|l| {
            if let Some(local) = &*l.borrow() {
                if local.pool == me {
                    local.deque.push(task.take().expect("task"));
                    // The new task runs on this worker after the current turn; call for
                    // help only when more than that one waits here.
                    if local.deque.len() > 1 {
                        self.notify_idle();
                    }
                }
            }
        });
        if let Some(task) = task {
            self.injector.push(task);
            self.notify_idle();
        }
    }

    /// Wakes a parked worker if none is searching (one of those would find the work).
    #[inline]
    fn notify_idle(&self) {
        // Pairs with the fence in `park`: either the parking worker sees the queued task
        // in its final check, or this sees it counted as parked.
        fence(Ordering::SeqCst);
        if self.searching.load(Ordering::SeqCst) == 0 && self.parked.load(Ordering::SeqCst) > 0 {
            self.wake_one();
        }
    }

    #[cold]
    fn wake_one(&self) {
        let idx = {
            let mut idle = lock(&self.idle);
            let Some(idx) = idle.pop() else { return };
            self.parked.fetch_sub(1, Ordering::SeqCst);
            self.slots[idx].notified.store(true, Ordering::Release);
            idx
        };
        self.wakeups.fetch_add(1, Ordering::Relaxed);
        self.parked_too_early(idx);
        if let Some(t) = lock(&self.slots[idx].thread).as_ref() {
            t.unpark();
        }
    }

    /// Worker `idx` is woken for work: if it parked only a few search windows ago, the
    /// window was too short for how this pool is fed (a host that comes back a little
    /// later than the window every time would otherwise pay two OS wake-ups per
    /// request, the worker's and its own): double it.
    fn parked_too_early(&self, idx: usize) {
        let at = self.slots[idx].parked_at.swap(0, Ordering::Relaxed);
        if at == 0 {
            return;
        }
        let window = self.window_ns.load(Ordering::Relaxed);
        let idle = (self.epoch.elapsed().as_nanos() as u64).saturating_sub(at);
        if idle < PREMATURE * window {
            let max = SEARCH_MAX.as_nanos() as u64;
            self.window_ns
                .store((window * 2).min(max), Ordering::Relaxed);
        }
    }

    /// The current search window (adapted as described at [`Pool::search`]).
    pub(crate) fn search_window(&self) -> Duration {
        Duration::from_nanos(self.window_ns.load(Ordering::Relaxed))
    }

    fn shutdown(&self) {
        self.shutdown.store(true, Ordering::SeqCst);
        let woken: Vec<usize> = {
            let mut idle = lock(&self.idle);
            self.parked.store(0, Ordering::SeqCst);
            idle.drain(..).collect()
        };
        for idx in woken {
            self.slots[idx].notified.store(true, Ordering::Release);
        }
        for s in self.slots[..self.high.load(Ordering::Acquire)].iter() {
            if let Some(t) = lock(&s.thread).as_ref() {
                t.unpark();
            }
        }
        if let Some(t) = lock(&self.monitor).as_ref() {
            t.unpark();
        }
    }

    /// Whether a queue holds a task an idle worker may take (see [`Slot::stealable`]).
    fn has_queued(&self) -> bool {
        !self.injector.is_empty()
            || self.slots[..self.high.load(Ordering::Acquire)]
                .iter()
                .any(Slot::stealable)
    }

    /// Whether any queue holds a task at all (a lone one left to its owner included).
    fn has_any_queued(&self) -> bool {
        !self.injector.is_empty()
            || self.slots[..self.high.load(Ordering::Acquire)]
                .iter()
                .filter_map(|s| s.stealer.get())
                .any(|s| !s.is_empty())
    }

    /// The next task for worker `idx`: own deque, injector, then the other deques (the
    /// injector first every [`GLOBAL_EVERY`] turns).
    fn find_task(&self, idx: usize, deque: &Deque<Arc<Task>>, tick: u64) -> Option<Arc<Task>> {
        if tick.is_multiple_of(GLOBAL_EVERY) {
            if let Some(t) = steal_one(|| self.injector.steal()) {
                return Some(t);
            }
        }
        if let Some(t) = deque.pop() {
            return Some(t);
        }
        if let Some(t) = steal_one(|| self.injector.steal_batch_and_pop(deque)) {
            return Some(t);
        }
        let high = self.high.load(Ordering::Acquire);
        for k in 1..high {
            let other = &self.slots[(idx + k) % high];
            if !other.stealable() {
                continue;
            }
            if let Some(s) = other.stealer.get() {
                if let Some(t) = steal_one(|| s.steal_batch_and_pop(deque)) {
                    return Some(t);
                }
            }
        }
        None
    }

    fn worker(self: Arc<Self>, idx: usize, deque: Deque<Arc<Task>>) {
        LOCAL.with(|l| {
            *l.borrow_mut() = Some(Local {
                pool: self.id(),
                deque,
            })
        });
        let slot = &self.slots[idx];
        *lock(&slot.stat) = std::fs::read_link("/proc/thread-self")
            .ok()
            .map(|p| std::path::Path::new("/proc").join(p).join("stat"));
        let mut tick = 0u64;
        let mut searching = false;
        let mut retired = false;
        loop {
            if self.shutdown.load(Ordering::Acquire) {
                break;
            }
            tick = tick.wrapping_add(1);
            let found = LOCAL.with(|l| {
                let l = l.borrow();
                let local = l.as_ref().expect("worker deque");
                self.find_task(idx, &local.deque, tick)
            });
            match found {
                Some(task) => {
                    if searching {
                        searching = false;
                        self.searching.fetch_sub(1, Ordering::SeqCst);
                    }
                    self.run(slot, task);
                }
                None => {
                    if !searching {
                        searching = true;
                        self.searching.fetch_add(1, Ordering::SeqCst);
                    }
                    if !self.search(idx) {
                        searching = false;
                        self.searching.fetch_sub(1, Ordering::SeqCst);
                        // An extra worker parks for a while before it retires, so a
                        // pipeline that keeps blocking does not start a thread per stall.
                        let extra = self.live.load(Ordering::Acquire) > self.target;
                        if !self.park(idx, extra.then_some(RETIRE_AFTER)) && self.retire() {
                            retired = true;
                            break;
                        }
                        // Woken for work: look for it as a searcher.
                        searching = true;
                        self.searching.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
        }
        if searching {
            self.searching.fetch_sub(1, Ordering::SeqCst);
        }
        let deque = LOCAL.with(|l| l.borrow_mut().take()).map(|l| l.deque);
        if let Some(deque) = deque {
            if self.shutdown.load(Ordering::Acquire) {
                // Queued tasks are dropped with the pool (their kernels end `Terminated`).
                while deque.pop().is_some() {}
            } else {
                // Retiring: hand anything left to the others.
                while let Some(t) = deque.pop() {
                    self.injector.push(t);
                }
            }
            *lock(&slot.deque) = Some(deque);
        }
        *lock(&slot.thread) = None;
        slot.in_use.store(false, Ordering::Release);
        let last = !retired && self.live.fetch_sub(1, Ordering::AcqRel) == 1;
        if last && self.shutdown.load(Ordering::Acquire) {
            // The last worker out drops whatever is still queued (this breaks the
            // task -> pool -> queue -> task cycle).
            while steal_one(|| self.injector.steal()).is_some() {}
        } else {
            self.notify_idle();
        }
    }

    /// Looks for queued work (spinning) for up to the pool's search window; whether
    /// some appeared. Only half the workers (at least one) search at once: the others
    /// park at once, leaving the cores to the threads that produce the work (on a small
    /// machine the host's own threads need them).
    ///
    /// The window adapts to how the pool is fed. It starts at [`SEARCH_SPIN`]; it
    /// doubles (up to [`SEARCH_MAX`]) when a worker that parked after a fruitless
    /// search of worker `idx` is woken for work within four windows (it parked too
    /// early: a host that comes back a little later than the window each time would
    /// otherwise pay two OS wake-ups per request); it shrinks by an eighth after each
    /// fruitless search (down to [`SEARCH_MIN`]), so an idle pool spins little.
    ///
    /// A search also ends, and the window drops to [`SEARCH_MIN`], when the worker
    /// notices it was preempted in the middle of it (two looks [`PREEMPTED`] apart): the
    /// machine then runs more threads than it has cores, and a spinning worker only
    /// takes the core from the threads that produce its work (and, having used its
    /// share, is scheduled after them when work comes); a parked one is woken at once.
    fn search(&self, idx: usize) -> bool {
        if self.searching.load(Ordering::SeqCst) > self.target.div_ceil(2) {
            return false;
        }
        self.slots[idx].parked_at.store(0, Ordering::Relaxed);
        let window = Duration::from_nanos(self.window_ns.load(Ordering::Relaxed));
        let start = std::time::Instant::now();
        let mut last = Duration::ZERO;
        let mut preempted = false;
        let mut beside_busy = false;
        // Since when another worker has been in a turn at every look.
        let mut busy_since = None;
        let found = loop {
            for _ in 0..32 {
                if self.has_queued() || self.shutdown.load(Ordering::Relaxed) {
                    break;
                }
                std::hint::spin_loop();
            }
            if self.has_queued() || self.shutdown.load(Ordering::Relaxed) {
                break true;
            }
            let spent = start.elapsed();
            if spent >= window {
                break false;
            }
            if self.another_in_turn(idx) {
                let since = *busy_since.get_or_insert(spent);
                if spent - since >= BUSY_SEARCH {
                    beside_busy = true;
                    break false;
                }
            } else {
                busy_since = None;
            }
            if spent - last >= PREEMPTED {
                // The OS took the core away in the middle of the search: the machine
                // has more runnable threads than cores, and spinning only delays the
                // threads that produce the work. Park now.
                preempted = true;
                break false;
            }
            last = spent;
        };
        let spent = start.elapsed();
        self.search_ns
            .fetch_add(spent.as_nanos() as u64, Ordering::Relaxed);
        if !found && !beside_busy {
            let w = window.as_nanos() as u64;
            let min = SEARCH_MIN.as_nanos() as u64;
            let w = if preempted { min } else { w - w / 8 };
            self.window_ns.store(w.max(min), Ordering::Relaxed);
            // It parks next; `wake_one` looks at how soon it is needed again.
            self.slots[idx].parked_at.store(
                (self.epoch.elapsed().as_nanos() as u64).max(1),
                Ordering::Relaxed,
            );
        }
        found
    }

    /// Whether a worker other than `idx` is in the middle of a turn.
    fn another_in_turn(&self, idx: usize) -> bool {
        self.slots[..self.high.load(Ordering::Acquire)]
            .iter()
            .enumerate()
            .any(|(i, s)| i != idx && !s.turns.load(Ordering::Relaxed).is_multiple_of(2))
    }

    /// Whether this idle worker should exit because the pool runs more threads than it
    /// keeps; a `true` has already taken the worker out of `live`.
    fn retire(&self) -> bool {
        let mut live = self.live.load(Ordering::Acquire);
        while live > self.target {
            match self
                .live
                .compare_exchange(live, live - 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(now) => live = now,
            }
        }
        false
    }

    /// Parks worker `idx` until a producer, the monitor or shutdown wakes it, or (with
    /// `timeout`) until that much time passed without a wake-up; `false` in that case.
    fn park(&self, idx: usize, timeout: Option<Duration>) -> bool {
        let slot = &self.slots[idx];
        {
            let mut idle = lock(&self.idle);
            idle.push(idx);
            self.parked.fetch_add(1, Ordering::SeqCst);
        }
        // Pairs with the fence in `notify_idle`.
        fence(Ordering::SeqCst);
        let woken = if self.has_queued() || self.shutdown.load(Ordering::SeqCst) {
            self.unregister_idle(idx);
            true
        } else {
            let deadline = timeout.map(|t| std::time::Instant::now() + t);
            loop {
                if slot.notified.swap(false, Ordering::AcqRel)
                    || self.shutdown.load(Ordering::Acquire)
                {
                    break true;
                }
                match deadline {
                    None => std::thread::park(),
                    Some(d) => {
                        let now = std::time::Instant::now();
                        if now >= d {
                            // Unless a waker took it off the list meanwhile, this worker
                            // stayed idle for the whole timeout.
                            break !self.unregister_idle(idx);
                        }
                        std::thread::park_timeout(d - now);
                    }
                }
            }
        };
        // The monitor may have seen this worker counted as parked and parked itself.
        self.wake_monitor();
        woken
    }

    /// Takes worker `idx` off the idle list; `true` if it was still there. If a waker
    /// took it off first, its notification is consumed instead.
    fn unregister_idle(&self, idx: usize) -> bool {
        let mut idle = lock(&self.idle);
        if let Some(pos) = idle.iter().position(|&i| i == idx) {
            idle.swap_remove(pos);
            self.parked.fetch_sub(1, Ordering::SeqCst);
            true
        } else {
            // The waker set `notified` under this lock.
            self.slots[idx].notified.store(false, Ordering::Relaxed);
            false
        }
    }

    /// Unparks the monitor if it parked (it does when every worker is parked): a worker
    /// leaving `park` may run a turn that blocks, and only the monitor notices.
    fn wake_monitor(&self) {
        // Pairs with the fence in `monitor`: either it sees this worker no longer
        // counted as parked, or this sees its flag.
        fence(Ordering::SeqCst);
        if self.monitor_parked.load(Ordering::SeqCst)
            && self.monitor_parked.swap(false, Ordering::SeqCst)
        {
            if let Some(t) = lock(&self.monitor).as_ref() {
                t.unpark();
            }
        }
    }

    /// Runs one turn of `task` and requeues it as the turn asks.
    fn run(&self, slot: &Slot, task: Arc<Task>) {
        // An RMW on `state` (see `Task::schedule`): everything a producer did before its
        // `fetch_or` is visible to the turn.
        task.state.swap(RUNNING, Ordering::AcqRel);
        // Only this worker writes its counter: a plain store (no locked instruction).
        let turns = slot.turns.load(Ordering::Relaxed);
        slot.turns.store(turns.wrapping_add(1), Ordering::Relaxed);
        if slot.stuck.load(Ordering::Relaxed) {
            slot.stuck.store(false, Ordering::Relaxed);
        }
        // Handler panics are caught per message; this only guards the pool against a
        // bug in the turn itself: the task ends, the worker goes on.
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| task.body.turn()))
            .unwrap_or_else(|_| {
                tracing::error!("a kernel's turn panicked outside its handler: kernel stopped");
                Turn::Done
            });
        slot.turns.store(turns.wrapping_add(2), Ordering::Relaxed);
        match outcome {
            Turn::Done => task.state.store(DONE, Ordering::Release),
            Turn::More => {
                task.state.store(SCHEDULED, Ordering::Release);
                // Behind everything waiting in the injector: fairness.
                self.injector.push(task);
                self.notify_idle();
            }
            Turn::Idle => {
                if task
                    .state
                    .compare_exchange(RUNNING, IDLE, Ordering::AcqRel, Ordering::Acquire)
                    .is_err()
                {
                    // Woken during the turn: run again, after what waits here.
                    task.state.store(SCHEDULED, Ordering::Release);
                    self.push(task);
                }
            }
        }
    }

    /// The monitor: while workers run, samples them every [`MONITOR_TICK`]; wakes a
    /// parked worker when work waits, and starts an extra worker when every worker is
    /// busy and one has been in the same turn for [`STALL`].
    fn monitor(self: Arc<Self>) {
        // Per slot: the turn counter last seen, and for how many ticks since then work
        // was queued (a turn counts as blocked only while others wait).
        let mut seen = vec![(0u64, 0u32); MAX_THREADS];
        let ticks = |d: Duration| (d.as_micros() / MONITOR_TICK.as_micros()).max(1) as u32;
        let (stall_ticks, runnable_ticks) = (ticks(STALL), ticks(RUNNABLE_STALL));
        loop {
            if self.shutdown.load(Ordering::Acquire) {
                return;
            }
            if self.parked.load(Ordering::SeqCst) >= self.live.load(Ordering::SeqCst) {
                self.monitor_parked.store(true, Ordering::SeqCst);
                // Pairs with the fence in `park`.
                fence(Ordering::SeqCst);
                if self.parked.load(Ordering::SeqCst) >= self.live.load(Ordering::SeqCst)
                    && !self.shutdown.load(Ordering::SeqCst)
                {
                    std::thread::park();
                }
                self.monitor_parked.store(false, Ordering::SeqCst);
                continue;
            }
            std::thread::sleep(MONITOR_TICK);
            // Which workers are in the same turn as a tick ago (their lone queued task
            // becomes stealable), and which have been for `STALL`.
            let high = self.high.load(Ordering::Acquire);
            let queued = self.has_any_queued();
            let mut stalled = 0;
            for (s, seen) in self.slots[..high].iter().zip(seen.iter_mut()) {
                let turns = s.turns.load(Ordering::Relaxed);
                if !turns.is_multiple_of(2) && turns == seen.0 {
                    if !s.stuck.load(Ordering::Relaxed) {
                        s.stuck.store(true, Ordering::Relaxed);
                    }
                    if queued {
                        seen.1 = seen.1.saturating_add(1);
                        if seen.1 >= runnable_ticks || (seen.1 >= stall_ticks && !s.runnable()) {
                            stalled += 1;
                        }
                    }
                } else {
                    *seen = (turns, 0);
                }
            }
            if !queued {
                continue;
            }
            if self.parked.load(Ordering::SeqCst) > 0 {
                if self.searching.load(Ordering::SeqCst) == 0 && self.has_queued() {
                    self.wake_one();
                }
                continue;
            }
            if self.searching.load(Ordering::SeqCst) > 0 {
                continue;
            }
            // Keep `target` workers that are not stuck in a turn.
            let stalled = stalled > 0 && self.live.load(Ordering::Acquire) < self.target + stalled;
            if stalled {
                match self.spawn_worker() {
                    Ok(()) => {
                        self.extra_started.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!(
                            threads = self.threads(),
                            "a worker is blocked in a turn while work waits: extra worker started"
                        );
                    }
                    Err(e) => tracing::warn!(error = %e, "cannot start an extra worker"),
                }
            }
        }
    }
}

/// Retries a steal until it succeeds or finds the queue empty.
fn steal_one(mut f: impl FnMut() -> Steal<Arc<Task>>) -> Option<Arc<Task>> {
    loop {
        match f() {
            Steal::Success(t) => return Some(t),
            Steal::Empty => return None,
            Steal::Retry => std::hint::spin_loop(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(p: &Pool) -> u64 {
        p.window_ns.load(Ordering::Relaxed)
    }

    /// A worker woken soon after it parked doubles the search window (up to the
    /// maximum); one woken long after leaves it; a fruitless search shrinks it.
    #[test]
    fn the_search_window_adapts() {
        let p = Pool::new(2);
        let w0 = window(&p);
        assert_eq!(w0, SEARCH_SPIN.as_nanos() as u64);
        let now = || p.epoch.elapsed().as_nanos() as u64;
        // Parked a moment ago and needed again: too early.
        p.slots[0].parked_at.store(now().max(1), Ordering::Relaxed);
        p.parked_too_early(0);
        assert_eq!(window(&p), 2 * w0);
        assert_eq!(p.slots[0].parked_at.load(Ordering::Relaxed), 0, "consumed");
        // No record (it did not park after a search): unchanged.
        p.parked_too_early(0);
        assert_eq!(window(&p), 2 * w0);
        // Parked long ago (more than four windows): unchanged.
        std::thread::sleep(Duration::from_nanos(5 * window(&p)));
        p.slots[1].parked_at.store(1, Ordering::Relaxed);
        p.parked_too_early(1);
        assert_eq!(window(&p), 2 * w0);
        // Never beyond the maximum.
        for _ in 0..20 {
            p.slots[0].parked_at.store(now().max(1), Ordering::Relaxed);
            p.parked_too_early(0);
        }
        assert_eq!(window(&p), SEARCH_MAX.as_nanos() as u64);
        // A search that finds nothing shrinks it (by an eighth, or to the minimum if
        // the OS preempted the search) and records when the worker parks.
        p.searching.store(1, Ordering::SeqCst);
        let before = window(&p);
        assert!(!p.search(0));
        let after = window(&p);
        assert!(
            after == before - before / 8 || after == SEARCH_MIN.as_nanos() as u64,
            "{before} -> {after}"
        );
        assert_ne!(p.slots[0].parked_at.load(Ordering::Relaxed), 0);
        // And never below the minimum.
        p.window_ns
            .store(SEARCH_MIN.as_nanos() as u64, Ordering::Relaxed);
        assert!(!p.search(0));
        assert_eq!(window(&p), SEARCH_MIN.as_nanos() as u64);
    }

    /// The OS's view of a worker thread: runnable while it computes, not while it
    /// sleeps; unknown (no `/proc` file) reads as not runnable.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_slot_tells_a_computing_thread_from_a_sleeping_one() {
        use std::sync::atomic::AtomicU8;
        let slot = Arc::new(Slot::default());
        assert!(!slot.runnable(), "no thread recorded yet");
        // 0: record the stat file; 1: spin; 2: sleep; 3: exit.
        let phase = Arc::new(AtomicU8::new(0));
        let (s, ph) = (slot.clone(), phase.clone());
        let t = std::thread::spawn(move || {
            *lock(&s.stat) = std::fs::read_link("/proc/thread-self")
                .ok()
                .map(|p| std::path::Path::new("/proc").join(p).join("stat"));
            ph.store(1, Ordering::SeqCst);
            while ph.load(Ordering::SeqCst) == 1 {
                std::hint::spin_loop();
            }
            while ph.load(Ordering::SeqCst) == 2 {
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        while phase.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        assert!(slot.runnable(), "a spinning thread is runnable");
        phase.store(2, Ordering::SeqCst);
        // Asleep most of the time from here on: some of the looks see it so.
        let asleep = (0..200).any(|_| {
            std::thread::sleep(Duration::from_millis(5));
            !slot.runnable()
        });
        assert!(asleep, "a sleeping thread never read as sleeping");
        phase.store(3, Ordering::SeqCst);
        t.join().unwrap();
    }

    /// A pool is saturated only while none of its workers is parked and it has a
    /// worker for every core.
    #[test]
    fn saturation_counts_parked_workers_and_cores() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let p = Pool::new(cores);
        p.live.store(cores, Ordering::Relaxed);
        assert!(p.saturated());
        p.parked.store(1, Ordering::Relaxed);
        assert!(!p.saturated(), "a parked worker leaves a core free");
        p.parked.store(0, Ordering::Relaxed);
        p.live.store(cores - 1, Ordering::Relaxed);
        assert!(!p.saturated(), "fewer workers than cores");
    }
}
