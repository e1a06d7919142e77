//! [`WgpuRuntime`]: event-driven actors on wgpu.
//!
//! WebGPU has no persistent kernels, so a kernel here is a WGSL handler run by **drain
//! passes** (see [`ringkernel_shaders::drain`] for the template and the handler ABI).
//! The host side — queues, pass scheduling, completion, stamping, K2K routing with
//! backpressure, lifecycle, metrics — is the shared drain engine
//! ([`ringkernel_drain::engine`]), the same code the Metal backend runs. This module is
//! only the device glue, a [`DrainTarget`]:
//!
//! * Each kernel owns device buffers in the shared binary layout (control block, input
//!   and output ring, handler state) and host copies of the rings and control block
//!   ([`HostRings`]): wgpu has no memory the host and the device share.
//! * A pass ([`DrainTarget::launch`]) uploads the pass's input slots (which the engine
//!   wrote straight into an upload buffer, [`DrainTarget::stage_input`], or where that
//!   is wgpu's mapped buffer on a discrete GPU, into the host ring, copied into the
//!   upload buffer at once: see `stage_directly`; on Vulkan the upload buffers are host
//!   memory of the runtime's own, [`crate::upload`], and a pass there is *compact*:
//!   the engine writes its payloads and one header a run into the upload buffer,
//!   [`DrainTarget::stage_compact`], which the pass binds as its input, so nothing is
//!   copied into the input ring: see `compact_wanted`) and the host line of the control
//!   block, records one dispatch and the copies of the output slots and the
//!   device-written control fields into a readback buffer of its own, submits, and asks
//!   for the bytes of that pass in the readback buffer to be mapped. Up to eight passes
//!   of a kernel are in flight at once ([`DrainTarget::max_in_flight`]); the
//!   device-written control fields live on the device across them.
//! * The engine calls `launch` with its host lock held. For a pass of at least
//!   [`DEFER_MIN`] messages, `launch` only takes what the pass needs from under that lock
//!   (its staged slots, the control block's host line when it changed) and hands the
//!   rest (the upload copy, recording, submission) to the runtime's **launcher** threads
//!   ([`LAUNCHER_THREAD`], [`LAUNCHERS`] of them; none for a software adapter on 2 or 3
//!   CPUs, [`small_host`], where `launch` does it all; several record passes in
//!   parallel),
//!   which submit them in the order they were launched; smaller passes (a `call`) are
//!   launched on the calling thread unless passes wait for the launchers.
//!   So the thread that fills the next pass and the one that finishes the last do not
//!   wait for the lock while a pass's slots cross to the device (on an H200 through
//!   Vulkan the batched echo made 1.26× the messages a second at the median of five
//!   alternating pairs, BENCHMARKS.md, 2026-11-28); on lavapipe, whose submission runs
//!   the pass, they no longer wait for the pass either.
//! * The map callback only hands the completion to the runtime's **poller**, one OS
//!   thread that drives the device (`Device::poll`, waiting for the oldest pass in
//!   flight, so each pass is finished as soon as it is done while the device runs the
//!   later ones) while passes are outstanding and finishes them, beside the
//!   **finisher** threads ([`FINISHER_THREAD`], [`FINISHERS`] of them on a host of
//!   [`FINISHERS_MIN_CPUS`] CPUs or more, else one; none for a software adapter on 2 or
//!   3 CPUs) and any receiver waiting for a reply (small passes only, see
//!   `Poller::help`): each pass is finished on one of them (its control fields
//!   copied into the host copy, its outputs read by the engine's completion, which
//!   queues them in launch order and
//!   may start the next pass), several passes at once. Completions never run inside a
//!   wgpu call made with an engine lock held (a map callback can run on any thread
//!   that polls or submits on the device), and a callback run by another thread's poll
//!   (a [`WgpuCompute`](crate::WgpuCompute) on the same device, another runtime) still
//!   reaches its poller.
//!
//! Priority: within a kernel, the drain engine fills each pass highest priority lane
//! first (see [`ringkernel_drain::engine`]). Across kernels, the poller finishes the
//! passes that completed in one round in the order of their kernels'
//! [`LaunchOptions::priority`] (highest first; among kernels of one priority, in the
//! order their passes completed), and a completion starts that kernel's next pass, so a
//! higher-priority kernel gets its replies and its next pass first.
//!
//! Several runtimes may share one device ([`WgpuRuntime::with_selection`] uses the
//! process-wide [`GpuContext::shared`] one), and one runtime may be used from any number
//! of tasks.

use crate::upload::{host_uploads_wanted, upload_buffers, Upload, UPLOAD_ENV};
use crate::{AdapterSelection, GpuContext};
use event_listener::{Event, Listener};
use ringkernel_core::control::ControlBlock;
use ringkernel_core::options::LaunchOptions;
use ringkernel_core::registry::KernelRegistry;
use ringkernel_core::runtime::RuntimeCore;
use ringkernel_core::util::lock;
use ringkernel_core::{BackendKind, Error, Result};
use ringkernel_drain::engine::{
    compact_len, CompileCache, DrainModule, DrainTarget, PassDone, PassOutputs,
};
use ringkernel_drain::shadow::{slot_runs, HostRings, DEVICE_WRITTEN};
use ringkernel_shaders::{drain, params, Access};
use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

pub use ringkernel_drain::engine::register_builtins as register_wgsl_builtins;

const CB: usize = std::mem::size_of::<ControlBlock>();

/// Drain passes of one kernel in flight at once: while the poller finishes one pass
/// (readback, replies), the launcher uploads another and the device runs a third. Each
/// has its own readback and upload buffer, and takes at most this share of the ring.
/// Six rather than three (the same ring, in smaller passes): the batched echo on an
/// H200 made 1.16x the messages a second (medians of three alternating runs,
/// BENCHMARKS.md, 2026-11-28). Eight rather than six once the upload buffers were host
/// memory ([`crate::upload`]): 1.11x (medians of four alternating runs, H200, call 3 of
/// the 21:53–22:29 runs, BENCHMARKS.md, 2026-11-28); no change on lavapipe.
const PASSES_IN_FLIGHT: usize = 8;

/// Environment variable: passes of a kernel in flight at once (1 to 32;
/// 8 when unset). For measuring the pipeline's depth.
pub const IN_FLIGHT_ENV: &str = "RINGKERNEL_WGPU_IN_FLIGHT";

/// Passes in flight for the value of [`IN_FLIGHT_ENV`] (`None`: unset; a value that is
/// not a number: the default).
fn passes_in_flight(env: Option<&str>) -> usize {
    env.and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(PASSES_IN_FLIGHT)
        .clamp(1, 32)
}

/// Environment variable: `0` makes the drain engine write a pass's slots into the host
/// ring and `launch` copy them into the mapped upload buffer in one go, `1` makes it
/// write them into the mapped buffer directly; unset, the adapter decides
/// ([`stage_directly`]).
const STAGE_ENV: &str = "RINGKERNEL_WGPU_STAGE";

/// Whether the drain engine writes a pass's slots straight into the upload buffer,
/// when [`STAGE_ENV`] does not say: not when `bar` (the upload buffers are wgpu's own,
/// mapped buffers on a `discrete` adapter, [`AdapterSummary::discrete`](crate::AdapterSummary)).
/// There wgpu places buffers mapped for writing in device-local, host-visible memory
/// where the driver offers it (the PCIe BAR on NVIDIA), so the engine's writes of each
/// slot's header and payload there cross the bus as partial lines, while one copy of
/// the pass's whole slots from the (cached) host ring writes full lines. Measured on an
/// H200 host (`wgpu_bench --actors-only --batched-only --msgs 4000000`, two alternating
/// pairs): the batched echo made 14.5 / 14.2 M msgs/s through the host ring against
/// 12.0 / 11.4 directly (BENCHMARKS.md, 2026-11-28). Elsewhere (host-memory upload
/// buffers, [`crate::upload`]; lavapipe, integrated and unified memory) the upload
/// buffer is ordinary host memory and the extra copy costs: on lavapipe 0.89x.
fn stage_directly(bar: bool) -> bool {
    stage_rule(std::env::var(STAGE_ENV).ok().as_deref(), bar)
}

/// [`stage_directly`] for the value of [`STAGE_ENV`] (`None`: unset).
fn stage_rule(env: Option<&str>, bar: bool) -> bool {
    match env {
        Some(v) => v.trim() != "0",
        None => !bar,
    }
}

/// Environment variable: `0` keeps every pass in ring layout; unset or anything else,
/// passes staged in host-memory upload buffers are compact (`compact_wanted`).
pub const COMPACT_ENV: &str = "RINGKERNEL_WGPU_COMPACT";

/// Whether passes staged in host-memory upload buffers are *compact*
/// ([`DrainTarget::stage_compact`]; the drain template's "Compact passes"): the engine
/// writes each request's payload and one header a run into the upload buffer, which
/// the pass binds as its input, so nothing is copied into the input ring and a
/// batch's requests cross to the device without their headers (a `Token` request 80
/// bytes instead of 144 in slots of 144). Needs upload buffers the device can bind
/// for storage: the runtime's host memory on Vulkan ([`crate::upload`]), not wgpu's
/// mapped buffers. [`COMPACT_ENV`] `0` turns it off, for measuring it.
fn compact_wanted(env: Option<&str>) -> bool {
    env.is_none_or(|v| v.trim() != "0")
}

/// A drain pass waiting for its readback, finished by the poller (or by a receiver
/// helping it, see [`Poller::help`]).
struct Completion {
    staging: wgpu::Buffer,
    /// Where `staging` goes back once unmapped.
    pool: Arc<Mutex<Vec<wgpu::Buffer>>>,
    /// The pass's upload buffer and its pool, where it goes back for the next pass.
    upload: Option<(Upload, Arc<Mutex<Vec<Upload>>>)>,
    rings: Arc<HostRings>,
    /// The submission order of the kernel's pass whose device-written control fields
    /// are in the host copy (see `finish`): passes of a kernel may finish in parallel,
    /// and an earlier one must not overwrite a later one's fields.
    control_seq: Arc<Mutex<Option<u64>>>,
    /// Where in `staging` the device-written control fields are (after the slots).
    control_at: usize,
    /// The part of `staging` that is mapped: the pass's output slots in pass order,
    /// then the control fields.
    mapped: Range<usize>,
    /// The kernel's priority: the poller finishes higher ones first.
    priority: u8,
    /// Whether the pass is small (under [`DEFER_MIN`] messages: a `call`), which a
    /// waiting receiver polls the device for ([`Poller::help`]).
    small: bool,
    /// Order of submission (set by `watch`): among passes of one priority, the poller
    /// finishes earlier ones first.
    seq: u64,
    done: PassDone,
}

impl Completion {
    /// Hands the mapped outputs to the engine (read in place, no copy into the host
    /// ring), copies the control fields into the host copy, unmaps.
    fn finish(self, mapped: std::result::Result<(), wgpu::BufferAsyncError>) {
        let Completion {
            staging,
            pool,
            upload,
            rings,
            control_seq,
            control_at,
            mapped: range,
            seq,
            done,
            ..
        } = self;
        // The pass is over: its upload buffer may take the next one.
        if let Some((up, uploads)) = upload {
            up.recycle(uploads);
        }
        let view = mapped
            .map_err(|e| Error::Device(format!("readback of a drain pass: {e}")))
            .and_then(|()| {
                staging
                    .get_mapped_range(range.start as u64..range.end as u64)
                    .map_err(|e| Error::Device(format!("readback of a drain pass: {e}")))
            });
        match view {
            Ok(view) => {
                let control =
                    control_at - range.start..control_at - range.start + DEVICE_WRITTEN.len();
                match view.get(control) {
                    Some(src) => {
                        let mut latest = lock(&control_seq);
                        if latest.is_none_or(|l| l < seq) {
                            *latest = Some(seq);
                            // SAFETY: `DEVICE_WRITTEN` lies in the 128-byte control
                            // block and holds only fields the host never writes; the
                            // completions of a kernel's passes write them only here,
                            // under `control_seq` (held), and no other code writes
                            // these bytes.
                            unsafe {
                                std::ptr::copy_nonoverlapping(
                                    src.as_ptr(),
                                    rings.control().add(DEVICE_WRITTEN.start),
                                    src.len(),
                                )
                            };
                        }
                        drop(latest);
                        done(Ok(PassOutputs::Slots(&view[..control_at - range.start])));
                    }
                    None => done(Err(Error::Device("readback buffer too small".into()))),
                }
                drop(view);
                staging.unmap();
            }
            Err(e) => done(Err(e)),
        }
        lock(&pool).push(staging);
    }
}

/// Drives the device for a runtime's passes and finishes them: its thread polls the
/// device and finishes passes, finisher threads ([`FINISHER_THREAD`]) finish passes
/// beside it, and a receiver waiting for a reply finishes small ones too
/// ([`Poller::help`]).
struct Poller {
    ctx: Arc<GpuContext>,
    /// Passes whose readback map callback has run.
    ready: Mutex<Vec<(Completion, std::result::Result<(), wgpu::BufferAsyncError>)>>,
    /// Passes submitted and not finished yet, and how many of them are small
    /// ([`Completion::small`]).
    outstanding: AtomicUsize,
    small: AtomicUsize,
    wake: Event,
    /// Whether the poller and finisher threads run (started with the first pass).
    started: Mutex<bool>,
    /// Held by a receiver polling the device without blocking ([`Poller::help`]): one
    /// at a time.
    polling: Mutex<()>,
    /// Submissions so far (for `Completion::seq`).
    submitted: AtomicU64,
    /// The submissions of the passes in flight, oldest first: the poller waits for the
    /// oldest alone (not for the device's latest submission), so each pass is finished
    /// as soon as it is done and its successor starts while the device still runs the
    /// passes launched after it.
    submissions: Mutex<VecDeque<wgpu::SubmissionIndex>>,
    /// Passes waiting for the launcher threads, in launch order, and how many passes are
    /// being launched (see [`Poller::launch`]).
    launches: Mutex<Launches>,
    launch_wake: Event,
    /// The launch order of the next pass to be submitted: passes are recorded on
    /// several threads at once but submitted in launch order ([`Poller::submit_in_turn`]).
    turn: Mutex<u64>,
    turn_wake: std::sync::Condvar,
    /// Whether the launcher threads run (started with the first deferred pass).
    launcher: Mutex<bool>,
    /// Launcher threads ([`LAUNCHER_ENV`]); 0: every pass is launched on the thread
    /// that starts it.
    launchers: usize,
    /// Finisher threads ([`FINISHER_ENV`]), started with the poller's.
    finishers: usize,
    /// Whether a helping receiver finishes large passes too ([`HELP_ENV`]).
    help_large: bool,
}

/// Environment variable: `1` makes a receiver that waits for a reply finish large
/// passes too (of [`DEFER_MIN`] messages or more), beside the poller and finisher;
/// unset or anything else, small ones only (`Poller::help`). For measuring it.
pub const HELP_ENV: &str = "RINGKERNEL_WGPU_HELP_LARGE";

/// The launcher threads' queue.
#[derive(Default)]
struct Launches {
    /// Jobs waiting, with their launch order.
    jobs: VecDeque<(u64, Job)>,
    /// Jobs taken from `jobs` (or run on the launching thread) and not submitted yet.
    busy: usize,
    /// The launch order of the next job.
    next: u64,
}

impl Poller {
    /// A poller on `ctx`; its thread starts with the first pass and ends once the
    /// poller is unused (no runtime, kernel or pending pass refers to it).
    fn new(ctx: Arc<GpuContext>) -> Arc<Self> {
        // The thread defaults depend on the host and the adapter (`small_host`).
        let (cpus, software) = (host_cpus(), ctx.info.software);
        Arc::new(Poller {
            ctx,
            ready: Mutex::new(Vec::new()),
            outstanding: AtomicUsize::new(0),
            small: AtomicUsize::new(0),
            wake: Event::new(),
            started: Mutex::new(false),
            polling: Mutex::new(()),
            submitted: AtomicU64::new(0),
            submissions: Mutex::new(VecDeque::new()),
            launches: Mutex::new(Launches::default()),
            launch_wake: Event::new(),
            turn: Mutex::new(0),
            turn_wake: std::sync::Condvar::new(),
            launcher: Mutex::new(false),
            launchers: launcher_threads(
                std::env::var(LAUNCHER_ENV).ok().as_deref(),
                cpus,
                software,
            ),
            finishers: finisher_threads(
                std::env::var(FINISHER_ENV).ok().as_deref(),
                cpus,
                software,
            ),
            help_large: std::env::var(HELP_ENV).is_ok_and(|v| v.trim() == "1"),
        })
    }

    fn ensure_thread(self: &Arc<Self>) -> Result<()> {
        let mut started = lock(&self.started);
        if !*started {
            let weak = Arc::downgrade(self);
            std::thread::Builder::new()
                .name("ringkernel-wgpu-poll".into())
                .spawn(move || Poller::run(weak))
                .map_err(|e| Error::Device(format!("could not start the wgpu poller: {e}")))?;
            *started = true;
            for _ in 0..self.finishers {
                let weak = Arc::downgrade(self);
                let spawned = std::thread::Builder::new()
                    .name(FINISHER_THREAD.into())
                    .spawn(move || Poller::finish_loop(weak));
                if let Err(e) = spawned {
                    // The poller finishes every pass without it.
                    tracing::warn!(error = %e, "no wgpu finisher thread");
                }
            }
        }
        Ok(())
    }

    /// A finisher thread: finishes passes whose readback is mapped, beside the poller
    /// (which also waits on the device) and the other finishers. Ends once the poller
    /// is unused.
    fn finish_loop(weak: Weak<Poller>) {
        loop {
            let Some(p) = weak.upgrade() else { return };
            let listener = p.wake.listen();
            if p.finish_ready() {
                continue;
            }
            drop(p);
            listener.wait_timeout(Duration::from_millis(200));
        }
    }

    /// Queues `job` for the launcher threads when it is a large pass ([`DEFER_MIN`]) or
    /// passes are being launched already (so that a kernel's passes keep their order);
    /// else runs it on the calling thread. A job that cannot be queued (no launcher
    /// thread starts) runs here too. An error of a pass run here comes back with its
    /// `done`, uncalled (nothing was submitted).
    fn launch(self: &Arc<Self>, job: Job) -> std::result::Result<(), (Error, PassDone)> {
        let mut q = lock(&self.launches);
        let seq = q.next;
        q.next += 1;
        let idle = q.jobs.is_empty() && q.busy == 0;
        let here = self.launchers == 0
            || (job.parts.p.count < DEFER_MIN && idle)
            || match self.ensure_launcher() {
                Ok(()) => false,
                Err(e) => {
                    tracing::warn!(error = %e, "no launcher thread: the pass is launched here");
                    true
                }
            };
        if !here {
            q.jobs.push_back((seq, job));
            drop(q);
            self.launch_wake.notify(usize::MAX);
            return Ok(());
        }
        q.busy += 1;
        drop(q);
        let r = job.run(self, seq);
        lock(&self.launches).busy -= 1;
        r
    }

    fn ensure_launcher(self: &Arc<Self>) -> Result<()> {
        let mut started = lock(&self.launcher);
        if !*started {
            for _ in 0..self.launchers {
                let weak = Arc::downgrade(self);
                std::thread::Builder::new()
                    .name(LAUNCHER_THREAD.into())
                    .spawn(move || Poller::launch_loop(weak))
                    .map_err(|e| {
                        Error::Device(format!("could not start the wgpu launcher: {e}"))
                    })?;
                *started = true;
            }
        }
        Ok(())
    }

    /// A launcher thread: takes the deferred jobs in the order they came and records
    /// them, beside the other launcher threads; each job is submitted in its turn. Ends
    /// once the poller is unused (a queued job keeps it alive through its kernel's
    /// buffers).
    fn launch_loop(weak: Weak<Poller>) {
        loop {
            let Some(p) = weak.upgrade() else { return };
            let listener = p.launch_wake.listen();
            let job = {
                let mut q = lock(&p.launches);
                let job = q.jobs.pop_front();
                if job.is_some() {
                    q.busy += 1;
                }
                job
            };
            match job {
                Some((seq, job)) => {
                    job.run_deferred(&p, seq);
                    lock(&p.launches).busy -= 1;
                    drop(p);
                }
                None => {
                    drop(p);
                    listener.wait_timeout(Duration::from_millis(200));
                }
            }
        }
    }

    /// Runs `submit` once every job launched before the one of launch order `seq` has
    /// been submitted (or has failed), then lets the next one go: passes are recorded
    /// in parallel, submitted in launch order.
    fn submit_in_turn<R>(&self, seq: u64, submit: impl FnOnce() -> R) -> R {
        let mut turn = lock(&self.turn);
        while *turn != seq {
            turn = self
                .turn_wake
                .wait(turn)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        // The turn moves on even if `submit` panics (the job's `done` then gets the
        // error, see `Job::run_deferred`).
        struct Next<'a>(std::sync::MutexGuard<'a, u64>, &'a std::sync::Condvar);
        impl Drop for Next<'_> {
            fn drop(&mut self) {
                *self.0 += 1;
                self.1.notify_all();
            }
        }
        let _next = Next(turn, &self.turn_wake);
        submit()
    }

    /// Maps `c.staging` once the pass submitted as `submission` is done; `c` is
    /// finished on the poller's thread.
    fn watch(self: &Arc<Self>, mut c: Completion, submission: wgpu::SubmissionIndex) {
        lock(&self.submissions).push_back(submission);
        self.outstanding.fetch_add(1, Ordering::AcqRel);
        if c.small {
            self.small.fetch_add(1, Ordering::AcqRel);
        }
        c.seq = self.submitted.fetch_add(1, Ordering::Relaxed);
        let staging = c.staging.clone();
        let me = self.clone();
        // The callback runs on whichever thread polls or submits on the device (or at
        // once, on error): it only queues the completion and wakes the poller.
        let range = c.mapped.start as u64..c.mapped.end as u64;
        staging.map_async(wgpu::MapMode::Read, range, move |r| {
            lock(&me.ready).push((c, r));
            me.wake.notify(usize::MAX);
        });
        self.wake.notify(usize::MAX);
    }

    /// Finishes the passes whose readback is mapped, one at a time, the next one
    /// each time ([`serve_order`]: higher kernel priority first, then in submission
    /// order), until none is left; returns whether there were any. Several threads
    /// finish passes at once (the poller, the finisher, a helping receiver): the engine
    /// reads each pass's outputs on the thread that finishes it and queues them in
    /// launch order. Never called with an engine lock held.
    fn finish_ready(&self) -> bool {
        self.finish_ready_of(false)
    }

    /// [`finish_ready`](Self::finish_ready), of small passes only when `small_only`.
    fn finish_ready_of(&self, small_only: bool) -> bool {
        let mut any = false;
        loop {
            let next = {
                let mut ready = lock(&self.ready);
                serve_order(&mut ready, |(c, _)| (c.priority, c.seq));
                ready
                    .iter()
                    .position(|(c, _)| c.small || !small_only)
                    .map(|at| ready.remove(at))
            };
            let Some((c, r)) = next else { return any };
            let small = c.small;
            c.finish(r);
            if small {
                self.small.fetch_sub(1, Ordering::AcqRel);
            }
            self.outstanding.fetch_sub(1, Ordering::AcqRel);
            any = true;
        }
    }

    /// What a receiver waiting for a reply does while it spins
    /// ([`KernelEngine::progress`](ringkernel_core::runtime::KernelEngine::progress)):
    /// looks, without blocking, whether the device has finished a pass, and finishes
    /// the passes whose readback is mapped on the calling thread, so that a short
    /// pass's reply is queued without a hand-off to the poller thread. One receiver at
    /// a time polls (the others only finish what is mapped); the poller and finisher
    /// threads keep finishing passes too, each pass on whichever thread takes it.
    /// Large passes (a batch) are left to them unless [`HELP_ENV`] says otherwise: a
    /// receiver of a batched stream that finishes one spends on it the time it then
    /// lacks for taking the replies the other threads have finished meanwhile (on an
    /// H200 the batched echo made 1.09x the messages a second without, medians of eight
    /// alternating runs, faster in 7 of 8; BENCHMARKS.md, 2026-11-29).
    fn help(&self) -> bool {
        if self.outstanding.load(Ordering::Acquire) == 0 {
            return false;
        }
        // The device is polled for a small pass only (a `call`, whose latency the poll
        // saves): a large one is finished as soon as the poller thread, which waits on
        // the device, has it, and a receiver's poll is a system call. In the batched
        // echo on an H200 this left the rate as it was (BENCHMARKS.md, 2026-11-28).
        if self.small.load(Ordering::Acquire) == 0 {
            return self.finish_ready_of(!self.help_large);
        }
        if let Ok(_polling) = self.polling.try_lock() {
            if let Err(e) = self.ctx.device.poll(wgpu::PollType::Poll) {
                tracing::error!(adapter = %self.ctx.info.name, error = %e, "wgpu poll failed");
            }
        }
        self.finish_ready_of(!self.help_large)
    }

    fn run(weak: Weak<Poller>) {
        loop {
            let Some(p) = weak.upgrade() else { return };
            let listener = p.wake.listen();
            if p.finish_ready() {
                continue;
            }
            if p.outstanding.load(Ordering::Acquire) == 0 {
                // Nothing in flight: park until a pass is submitted (`watch`). The next
                // pass does not wait for this wake-up: a receiver spinning for its
                // reply finishes it itself (`help`), and otherwise the wake-up overlaps
                // the pass. The submissions left were finished by receivers (`help`);
                // one dropped here by a race with `watch` only makes the poller wait
                // for the device's latest submission, as it would without the list.
                lock(&p.submissions).clear();
                drop(p);
                listener.wait_timeout(Duration::from_millis(200));
                continue;
            }
            // The oldest pass in flight, not the latest submission: waiting for the
            // latest would finish the passes in flight all at once, after the last, and
            // leave the device idle while the host reads them and launches the next.
            let oldest = lock(&p.submissions).front().cloned();
            let waited = oldest.is_some();
            let wait = wgpu::PollType::Wait {
                submission_index: oldest,
                timeout: Some(Duration::from_secs(1)),
            };
            match p.ctx.device.poll(wait) {
                Ok(_) => {
                    if waited {
                        // Done, and its map callback has run (wgpu's `Wait` contract).
                        lock(&p.submissions).pop_front();
                    }
                }
                Err(wgpu::PollError::Timeout) => {}
                Err(e) => {
                    tracing::error!(adapter = %p.ctx.info.name, error = %e, "wgpu poll failed");
                }
            }
            if lock(&p.ready).is_empty() {
                // The callbacks of our passes were taken by another thread's poll or
                // submit and are about to run there: they wake us.
                drop(p);
                listener.wait_timeout(Duration::from_millis(2));
            }
        }
    }
}

/// Orders the passes finished in one poller round: higher kernel priority first, in
/// submission order among kernels of one priority; `key` gives (priority, sequence).
fn serve_order<T>(ready: &mut [T], key: impl Fn(&T) -> (u8, u64)) {
    ready.sort_by_key(|c| {
        let (priority, seq) = key(c);
        (std::cmp::Reverse(priority), seq)
    });
}

/// Passes of at least this many messages are recorded and submitted on the runtime's
/// launcher threads instead of the launching one (see the [module docs](self)): their
/// upload copy and submission (on lavapipe the submission runs the pass) then happen
/// outside the drain engine's host lock. Smaller passes (a single `call`) are launched
/// at once, on the calling thread, unless passes are queued for the launcher (order).
pub const DEFER_MIN: u32 = 1024;

/// Name of the launcher threads (under the 15 bytes Linux keeps of a thread's name).
pub const LAUNCHER_THREAD: &str = "rk-wgpu-launch";

/// Name of the finisher threads, which finish passes beside the poller (see the
/// [module docs](self)).
pub const FINISHER_THREAD: &str = "rk-wgpu-finish";

/// Environment variable: the number of finisher threads beside the poller
/// ([`FINISHERS`] when unset; `0` runs none: the poller and helping receivers finish
/// every pass); for measuring them.
pub const FINISHER_ENV: &str = "RINGKERNEL_WGPU_FINISHER";

/// Finisher threads a runtime starts beside the poller on a host of at least
/// [`FINISHERS_MIN_CPUS`] CPUs (one on a smaller host, none for a software adapter on
/// a [`small_host`]). Two rather than one: each pass's outputs are read on one thread
/// (its headers from the readback buffer, its replies into the reply queue), and with
/// one finisher the poller and it were the
/// busiest threads of the batched echo; on an H200 host (16 vCPUs) two made 1.22x the
/// messages a second (medians of eight alternating runs, faster in 7 of 8; three:
/// 1.18x). On the 2-vCPU development VM (lavapipe) a second one made 0.89x (4 of 4
/// slower), hence the CPU rule (BENCHMARKS.md, 2026-11-29).
pub const FINISHERS: usize = 2;

/// Hosts with fewer CPUs than this start one finisher thread ([`FINISHERS`]).
pub const FINISHERS_MIN_CPUS: usize = 8;

/// A software adapter (lavapipe) on a host of two CPUs up to this (excluded) gets
/// neither finisher nor launcher threads ([`small_host`]): the poller finishes every
/// pass and each pass is launched on the thread that starts it. There the adapter's own
/// threads run the passes on the same CPUs. On the 2-vCPU development VM the batched
/// echo on lavapipe made 1.14x the messages a second without those two threads (medians
/// of five alternating runs, 5 of 5 faster). Not on one CPU (pinned to one of them it
/// made 0.94x without, 3 of 3 slower), nor with a GPU (an H200 host pinned to two CPUs:
/// 0.94x without, 3 of 3 slower): BENCHMARKS.md, 2026-11-29, "output units".
pub const SMALL_HOST_CPUS: usize = 4;

/// Whether a runtime on a `software` adapter (or not) on a host of `cpus` CPUs starts
/// no finisher or launcher threads ([`SMALL_HOST_CPUS`]).
pub fn small_host(cpus: usize, software: bool) -> bool {
    software && (2..SMALL_HOST_CPUS).contains(&cpus)
}

/// Finisher threads for the value of [`FINISHER_ENV`] (`None`: unset; a value that is
/// not a number: the default for a `software` adapter or not on a host of `cpus` CPUs),
/// at most 8.
fn finisher_threads(env: Option<&str>, cpus: usize, software: bool) -> usize {
    let default = if cpus >= FINISHERS_MIN_CPUS {
        FINISHERS
    } else if small_host(cpus, software) {
        0
    } else {
        1
    };
    env.and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(default)
        .min(8)
}

/// Environment variable: the number of launcher threads ([`LAUNCHERS`] when unset);
/// `0` launches every pass on the thread that starts it (under the drain engine's host
/// lock), as before the launcher threads. For measuring them.
pub const LAUNCHER_ENV: &str = "RINGKERNEL_WGPU_LAUNCHER";

/// Launcher threads a runtime starts (none for a software adapter on a [`small_host`]).
/// Several record passes in parallel (each copies its pass's slots into the mapped
/// upload buffer) and submit them in launch order, but
/// on an H200 two or three made no difference to the batched echo, against one
/// (BENCHMARKS.md, 2026-11-28): their copies into the mapped buffer, which lies across
/// the PCIe bus, share the same 7–13 GB/s.
pub const LAUNCHERS: usize = 1;

/// Launcher threads for the value of [`LAUNCHER_ENV`] (`None`: unset; a value that is
/// not a number: the default for a `software` adapter or not on a host of `cpus` CPUs),
/// at most 8.
fn launcher_threads(env: Option<&str>, cpus: usize, software: bool) -> usize {
    let default = if small_host(cpus, software) {
        0
    } else {
        LAUNCHERS
    };
    env.and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(default)
        .min(8)
}

/// The host's CPUs, as the thread defaults count them.
fn host_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// A pass prepared by `launch` under the drain engine's host lock (its staged slots and
/// the control block's host line taken there), then recorded, submitted and handed to
/// the poller by [`run`](Job::run): on the launching thread, or for a large pass on one
/// of the runtime's launcher threads ([`Poller::launch`]). Jobs are recorded in
/// parallel and submitted in the order they were launched
/// ([`Poller::submit_in_turn`]), so a kernel's passes reach the device in launch order
/// either way.
struct Job {
    parts: Parts,
    done: PassDone,
}

impl Job {
    /// Records the pass of launch order `seq` on the calling thread and submits it in
    /// its turn. An error, or a panic while the pass is recorded or submitted, comes
    /// back with `done` uncalled when nothing was submitted; the turn moves on either
    /// way, so the passes launched after this one are not held up.
    fn run(self, poller: &Poller, seq: u64) -> std::result::Result<(), (Error, PassDone)> {
        use std::panic::{catch_unwind, AssertUnwindSafe};
        let panicked = || Error::Device("the launch of a drain pass panicked".into());
        let mut done = Some(self.done);
        let parts = self.parts;
        let recorded =
            catch_unwind(AssertUnwindSafe(|| parts.record())).unwrap_or_else(|_| Err(panicked()));
        let r = poller.submit_in_turn(seq, || {
            catch_unwind(AssertUnwindSafe(|| {
                recorded.and_then(|rec| rec.submit(&mut done))
            }))
            .unwrap_or_else(|_| Err(panicked()))
        });
        match (r, done) {
            (Ok(()), _) => Ok(()),
            (Err(e), Some(done)) => Err((e, done)),
            (Err(e), None) => {
                // `submit` takes `done` only once nothing can fail any more; only a panic
                // in `watch` gets here, and then the pass's `done` is gone with it.
                tracing::error!(error = %e, "drain pass could not be handed to the poller");
                Ok(())
            }
        }
    }

    /// [`run`](Self::run) on a launcher thread: an error goes to the pass's `done` (so
    /// its kernel fails instead of waiting for it), and the thread goes on with the next
    /// job.
    fn run_deferred(self, poller: &Poller, seq: u64) {
        if let Err((e, done)) = self.run(poller, seq) {
            tracing::error!(error = %e, "drain pass could not be launched");
            done(Err(e));
        }
    }
}

/// What a [`Job`] records, without its `done` (which [`Recorded::submit`] takes only
/// when it hands the pass to the poller).
struct Parts {
    inner: Arc<Inner>,
    p: params::Drain,
    /// The mapped upload buffer the engine wrote this pass's slots into, if any.
    staged: Option<Staged>,
    /// The host line of the control block, when it changed since the last upload.
    control: Option<Vec<u8>>,
}

/// A pass recorded into a command buffer, ready to submit (on the thread that recorded
/// it: its error scope is the thread's).
struct Recorded {
    inner: Arc<Inner>,
    small: bool,
    /// Writes to queue just before the submission ([`Inner::write_up`]): the
    /// parameters and input runs when no upload buffer carried them, and the control
    /// block's host line when it changed.
    write_up: Option<(params::Drain, Vec<Range<usize>>)>,
    control: Option<Vec<u8>>,
    cmd: wgpu::CommandBuffer,
    scope: wgpu::ErrorScopeGuard,
    staging: wgpu::Buffer,
    upload: Option<Upload>,
    control_at: usize,
    mapped: Range<usize>,
}

impl Parts {
    /// Records the pass: its input slots and parameters up (the upload copy into a
    /// mapped upload buffer happens here, on the recording thread), the dispatch, its
    /// output slots and the device-written control fields into a readback buffer of its
    /// own. Writes through the queue wait for the submission ([`Recorded::submit`]).
    fn record(self) -> Result<Recorded> {
        let Parts {
            inner: me,
            p,
            staged,
            control,
        } = self;
        let first = u64::from(p.first_lo) | (u64::from(p.first_hi) << 32);
        let runs = slot_runs(first, u64::from(p.count), me.capacity, me.slot_size);
        let dev = &me.ctx.device;
        let scope = dev.push_error_scope(wgpu::ErrorFilter::Validation);
        // The engine launches at most `max_in_flight` passes at once, and a finishing
        // pass gives its readback buffer back just after its `done`: one buffer more
        // than that is kept, and another made should they all be in use (or a pass be
        // larger than they are).
        let need = (p.count as usize * me.slot_size + DEVICE_WRITTEN.len()) as u64;
        let staging = match lock(&me.staging).pop() {
            Some(b) if b.size() >= need => b,
            _ => readback_buffer(dev, need.max(me.readback_len as u64)),
        };
        let mut enc = dev.create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("rk drain"),
        });
        let upload = match me.upload(&runs, bytemuck::bytes_of(&p), staged, &mut enc) {
            Ok(u) => u,
            Err(e) => {
                lock(&me.staging).push(staging);
                return Err(e);
            }
        };
        let write_up = upload.is_none().then(|| (p, runs.clone()));
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("rk drain"),
                timestamp_writes: None,
            });
            pass.set_pipeline(&me.compiled.pipeline);
            // A compact pass reads its requests from its upload buffer.
            let bind = match &upload {
                _ if p.in_stride == 0 => Some(&me.bind),
                Some(Upload::Host(h)) => h.bind.as_ref(),
                _ => None,
            };
            let Some(bind) = bind else {
                drop(pass);
                lock(&me.staging).push(staging);
                return Err(Error::Device(
                    "a compact drain pass without its upload buffer's bind group".into(),
                ));
            };
            pass.set_bind_group(0, bind, &[]);
            let [x, y, z] = me.compiled.module.groups(p.count);
            pass.dispatch_workgroups(x, y, z);
        }
        // The pass's output slots go to the readback buffer in pass order (a run where
        // the pass wraps follows the one before it), the device-written control fields
        // after them, and only those bytes are mapped.
        let mut control_at = 0;
        for run in &runs {
            enc.copy_buffer_to_buffer(
                &me.output,
                run.start as u64,
                &staging,
                control_at as u64,
                run.len() as u64,
            );
            control_at += run.len();
        }
        let mapped = 0..control_at + DEVICE_WRITTEN.len();
        enc.copy_buffer_to_buffer(
            &me.control,
            DEVICE_WRITTEN.start as u64,
            &staging,
            control_at as u64,
            DEVICE_WRITTEN.len() as u64,
        );
        Ok(Recorded {
            small: p.count < DEFER_MIN,
            cmd: enc.finish(),
            write_up,
            control,
            inner: me,
            scope,
            staging,
            upload,
            control_at,
            mapped,
        })
    }
}

impl Recorded {
    /// Submits the pass and hands its completion, with `done`, to the poller. On an
    /// error nothing was submitted and `done` is left where it was.
    fn submit(self, done: &mut Option<PassDone>) -> Result<()> {
        let Recorded {
            inner: me,
            small,
            write_up,
            control,
            cmd,
            scope,
            staging,
            upload,
            control_at,
            mapped,
        } = self;
        if let Some(control) = control {
            me.ctx.queue.write_buffer(&me.control, 0, &control);
        }
        if let Some((p, runs)) = write_up {
            me.write_up(&runs, bytemuck::bytes_of(&p));
        }
        let submission = me.ctx.queue.submit([cmd]);
        if let Some(e) = pollster::block_on(scope.pop()) {
            lock(&me.staging).push(staging);
            // A mapped buffer goes back once the device is done with it (its map
            // waits); host memory has no such wait, so it is dropped (wgpu frees it
            // after the device), not handed to a later pass while this one may read it.
            if let Some(u @ Upload::Mapped(_)) = upload {
                u.recycle(me.uploads.clone());
            }
            return Err(Error::Device(format!(
                "drain pass on {}: {e}",
                me.ctx.info.name
            )));
        }
        let Some(done) = done.take() else {
            return Err(Error::Device("a drain pass launched twice".into()));
        };
        me.poller.watch(
            Completion {
                staging,
                pool: me.staging.clone(),
                upload: upload.map(|u| (u, me.uploads.clone())),
                rings: me.rings.clone(),
                control_seq: me.control_seq.clone(),
                control_at,
                mapped,
                priority: me.priority,
                small,
                seq: 0,
                done,
            },
            submission,
        );
        Ok(())
    }
}

/// The bind group layout of every drain pass, from the template's binding table
/// ([`drain::BINDINGS`]): what a compiled drain module is bound with. Public for tools
/// that dispatch a drain module themselves (`wgpu_bench` times the echo kernel alone
/// with it).
pub fn drain_bind_group_layout(dev: &wgpu::Device) -> wgpu::BindGroupLayout {
    let entries: Vec<wgpu::BindGroupLayoutEntry> = drain::BINDINGS
        .iter()
        .map(|b| wgpu::BindGroupLayoutEntry {
            binding: b.binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: match b.access {
                    Access::Uniform => wgpu::BufferBindingType::Uniform,
                    access => wgpu::BufferBindingType::Storage {
                        read_only: access == Access::Read,
                    },
                },
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        })
        .collect();
    dev.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
        label: Some("rk drain"),
        entries: &entries,
    })
}

/// A compiled drain handler: pipeline and bind group layout.
struct Compiled {
    pipeline: wgpu::ComputePipeline,
    layout: wgpu::BindGroupLayout,
    module: DrainModule,
}

/// An upload buffer handed to the engine for the slots of the pass it is filling. For
/// a buffer wgpu maps, the view keeps the mapped range registered until the pass is
/// recorded (`Inner::upload` writes the parameters after the slots and unmaps it);
/// host memory needs none.
struct Staged {
    up: Upload,
    view: Option<wgpu::BufferViewMut>,
    /// Bytes of slots (`count · slot_size`), or of a compact pass (`compact_len`).
    slots: usize,
    /// A compact pass ([`DrainTarget::stage_compact`]): `up` is host memory with a
    /// bind group of its own.
    compact: bool,
}

/// The device buffers of one kernel and its host copies (shared with the runtime's
/// launcher threads, which record and submit large passes, see [`Job`]).
struct Inner {
    ctx: Arc<GpuContext>,
    poller: Arc<Poller>,
    compiled: Arc<Compiled>,
    rings: Arc<HostRings>,
    capacity: usize,
    slot_size: usize,
    priority: u8,
    params: wgpu::Buffer,
    control: wgpu::Buffer,
    input: wgpu::Buffer,
    output: wgpu::Buffer,
    /// Readback buffers not in use by a pass (one per pass in flight, and one more).
    staging: Arc<Mutex<Vec<wgpu::Buffer>>>,
    /// Upload buffers writable by the host and not in use by a pass (see `upload` and
    /// [`crate::upload`]).
    uploads: Arc<Mutex<Vec<Upload>>>,
    /// Bytes of each upload buffer's slots: the largest pass the engine hands out.
    upload_len: usize,
    /// The most messages of a compact pass ([`DrainTarget::stage_compact`]); 0 where
    /// passes are never compact ([`compact_wanted`]).
    compact_max: usize,
    /// Passes in flight at once ([`DrainTarget::max_in_flight`]).
    in_flight: usize,
    /// Bytes of each readback buffer: the largest pass's slots and the control fields.
    readback_len: usize,
    /// The upload buffer the engine is writing the next pass's slots into
    /// ([`DrainTarget::stage_input`]), taken by that pass's `launch`.
    staged: Mutex<Option<Staged>>,
    /// Whether the engine writes slots straight into a mapped upload buffer
    /// (`stage_input`); without, it writes them into the host ring and `upload` copies
    /// each pass's runs into the mapped buffer at once ([`stage_directly`]).
    stage: bool,
    /// The host line of the control block as last uploaded.
    control_sent: Mutex<Option<Vec<u8>>>,
    /// The pass whose device-written control fields the host copy holds
    /// ([`Completion::control_seq`]).
    control_seq: Arc<Mutex<Option<u64>>>,
    bind: wgpu::BindGroup,
}

/// A kernel's drain target: its buffers, shared with the launcher threads.
struct WgpuDrainTarget {
    rings: Arc<HostRings>,
    inner: Arc<Inner>,
}

// SAFETY: `input`/`output`/`control` are the host copies in `rings` (owned through an
// `Arc`, alive as long as the target and every pending completion): rings of `ring_len`
// bytes and a 128-byte control block, addressed only through raw pointers. The "device"
// side (a completion's copy-out) writes only the device-written control fields (under
// the kernel's `control_seq`), after the pass finished and before `done`. `done` runs on
// the poller, the finisher or a helping receiver (or, for a pass whose deferred launch
// failed, on a launcher thread), never inside `launch`. `stage_input` hands out the
// mapped range of an upload buffer taken from the pool (so no pass in flight uses it),
// whose view stays in `staged` until the following `launch` takes it into that pass's
// job, which unmaps it: `count · slot_size` bytes the host may write, nothing else
// addressing them meanwhile. `stage_compact` hands out a host-memory upload buffer taken
// from the pool the same way: its first `compact_len(count, slot_size)` bytes (the
// buffer was made at least that large for any pass up to `compact_max`), mapped for the
// buffer's life, which the device reads only in the pass that `launch` then records, and
// which goes back to the pool only once that pass is done. A job reads the pass's input
// slots of the host ring (`Inner::upload`) after `launch` returned, possibly on a
// launcher thread: those slots stay the pass's until its `done` (the engine counts them
// busy), so nothing writes them meanwhile.
unsafe impl DrainTarget for WgpuDrainTarget {
    ringkernel_drain::host_rings_memory!(rings);

    fn launch(&self, p: params::Drain, done: PassDone) -> Result<()> {
        let inner = &self.inner;
        inner.poller.ensure_thread()?;
        // Taken now, under the engine's host lock: the slots the engine staged for this
        // pass, and the host line of the control block when it changed.
        let staged = lock(&inner.staged).take();
        let control = inner.control_to_send();
        let job = Job {
            parts: Parts {
                inner: inner.clone(),
                p,
                staged,
                control,
            },
            done,
        };
        inner.poller.launch(job).map_err(|(e, _)| e)
    }

    fn max_in_flight(&self) -> usize {
        self.inner.in_flight
    }

    /// A host-memory upload buffer with its own bind group (when compact passes are
    /// on, one is free and the pass fits it): the engine writes the pass there in the
    /// compact layout, and the pass binds it as its input.
    fn stage_compact(&self, count: usize) -> Option<*mut u8> {
        if count == 0 || count > self.inner.compact_max {
            return None;
        }
        let mut uploads = lock(&self.inner.uploads);
        // Host buffers only, which all have a bind group where `compact_max > 0`.
        let at = uploads
            .iter()
            .position(|u| matches!(u, Upload::Host(h) if h.bind.is_some()))?;
        let up = uploads.swap_remove(at);
        drop(uploads);
        let ptr = up.host_ptr()?.as_ptr();
        *lock(&self.inner.staged) = Some(Staged {
            up,
            view: None,
            slots: compact_len(count, self.inner.slot_size),
            compact: true,
        });
        Some(ptr)
    }

    /// A mapped upload buffer (when one is free and the pass fits it): the engine
    /// writes the pass's slots there, not into the host ring, and `launch` copies them
    /// to the device ring from it (see [`upload`](WgpuDrainTarget::upload)).
    fn stage_input(&self, count: usize) -> Option<*mut u8> {
        let slots = count * self.inner.slot_size;
        if !self.inner.stage || slots == 0 || slots > self.inner.upload_len {
            return None;
        }
        let up = lock(&self.inner.uploads).pop()?;
        let (view, ptr) = match &up {
            Upload::Host(_) => (None, up.host_ptr()?.as_ptr()),
            Upload::Mapped(buf) => {
                let end = (slots + std::mem::size_of::<params::Drain>()) as u64;
                let mut view = match buf.get_mapped_range_mut(..end) {
                    Ok(v) => v,
                    Err(e) => {
                        tracing::warn!(error = %e, "upload buffer not mapped: the pass goes through the host ring");
                        lock(&self.inner.uploads).push(up);
                        return None;
                    }
                };
                let ptr = view.slice(..slots).as_raw_element_ptr().as_ptr();
                (Some(view), ptr)
            }
        };
        *lock(&self.inner.staged) = Some(Staged {
            up,
            view,
            slots,
            compact: false,
        });
        Some(ptr)
    }

    fn progress(&self) -> bool {
        self.inner.poller.help()
    }
}

impl Inner {
    /// The host-written part of the control block, when it changed since it last went
    /// up (a lifecycle change): the drain template reads none of it, so the input tail
    /// the engine writes before each pass (which the pass gets in its parameters) is
    /// not worth an upload of its own. The device-written part lives on the device
    /// across passes (a pass in flight may be updating it). Called by `launch`, with
    /// the engine's host lock held.
    fn control_to_send(&self) -> Option<Vec<u8>> {
        // SAFETY: the host writes the control block only under the engine's host lock
        // (held now); the copy-out of a completion writes only `DEVICE_WRITTEN`.
        let control =
            unsafe { std::slice::from_raw_parts(self.rings.control(), DEVICE_WRITTEN.start) };
        let mut sent = lock(&self.control_sent);
        let tail = std::mem::offset_of!(ControlBlock, input_tail);
        let same = |a: &[u8], b: &[u8]| a[..tail] == b[..tail] && a[tail + 8..] == b[tail + 8..];
        if sent.as_deref().is_some_and(|s| same(s, control)) {
            return None;
        }
        *sent = Some(control.to_vec());
        Some(control.to_vec())
    }

    /// Moves the pass's input slots (`runs` of the host ring) and its parameter block to
    /// the device: written into an upload buffer that stays allocated (mapped for
    /// writing while no pass uses it) and copied by `enc` ahead of the dispatch, so that
    /// a pass allocates no staging memory (and faults in no fresh pages) of its own, and
    /// its submission carries no separate command buffer of queued writes. Returns the
    /// buffer, which goes back to the pool once its pass is done ([`remap_upload`]).
    /// When none is mapped yet, or the pass is larger than one, it returns `None`, and
    /// [`write_up`](Self::write_up) moves the bytes with `queue.write_buffer` just before
    /// the pass's submission.
    fn upload(
        &self,
        runs: &[Range<usize>],
        params: &[u8],
        staged: Option<Staged>,
        enc: &mut wgpu::CommandEncoder,
    ) -> Result<Option<Upload>> {
        let total: usize = runs.iter().map(|r| r.len()).sum();
        if let Some(Staged {
            mut up,
            view: None,
            slots,
            compact: true,
        }) = staged
        {
            // The engine wrote the whole pass into `up` (`stage_compact`), which the
            // pass binds as its input: only the parameters are copied, from after it.
            // (Copying the pass into device memory first, its payloads, run headers
            // and run starts, made no difference on an H200: BENCHMARKS.md,
            // 2026-11-29.)
            if let Err(e) = up.fill(slots + params.len(), |put| put(slots, params)) {
                up.recycle(self.uploads.clone());
                return Err(Error::Device(format!(
                    "upload of a compact drain pass: {e}"
                )));
            }
            enc.copy_buffer_to_buffer(
                up.buffer(),
                slots as u64,
                &self.params,
                0,
                params.len() as u64,
            );
            return Ok(Some(up));
        }
        if let Some(Staged {
            mut up,
            view,
            slots,
            ..
        }) = staged
        {
            // The engine wrote the pass's slots into `up` already (`stage_input`).
            if slots != total {
                if let Some(view) = view {
                    drop(view);
                    up.buffer().unmap();
                }
                up.recycle(self.uploads.clone());
                return Err(Error::Device(format!(
                    "staged {slots} bytes of slots for a pass of {total}"
                )));
            }
            let end = total + params.len();
            match view {
                Some(mut view) => {
                    view.slice(total..end).copy_from_slice(params);
                    drop(view);
                    up.buffer().unmap();
                }
                None => up
                    .fill(end, |put| put(total, params))
                    .map_err(|e| Error::Device(format!("upload of a drain pass: {e}")))?,
            }
            self.copy_up(up.buffer(), runs, total, params.len(), enc);
            return Ok(Some(up));
        }
        let up = (total > 0 && total <= self.upload_len)
            .then(|| lock(&self.uploads).pop())
            .flatten();
        let Some(mut up) = up else {
            return Ok(None);
        };
        // Slots first (a multiple of the 16-byte aligned slot size), then the parameters.
        let end = total + params.len();
        up.fill(end, |put| {
            let mut at = 0;
            for run in runs {
                // SAFETY: `run` lies in the input ring and holds this pass's slots, which
                // the engine wrote before `launch` and writes again only after the
                // pass's `done` (its slots stay busy until then); other passes' slots,
                // which the engine may be writing meanwhile, lie outside `run`.
                let bytes = unsafe {
                    std::slice::from_raw_parts(self.rings.input().add(run.start), run.len())
                };
                put(at, bytes);
                at += run.len();
            }
            put(total, params);
        })
        .map_err(|e| Error::Device(format!("upload of a drain pass: {e}")))?;
        self.copy_up(up.buffer(), runs, total, params.len(), enc);
        Ok(Some(up))
    }

    /// The pass's parameters and input slots (`runs` of the host ring) through
    /// `queue.write_buffer`, which the next submission carries ahead of its commands:
    /// called in the pass's turn, just before it is submitted, so that no other pass's
    /// submission takes these writes (the parameters buffer is shared by the kernel's
    /// passes).
    fn write_up(&self, runs: &[Range<usize>], params: &[u8]) {
        self.ctx.queue.write_buffer(&self.params, 0, params);
        for run in runs {
            // SAFETY: as in `upload`: the pass's own slots, not written until its `done`.
            let bytes =
                unsafe { std::slice::from_raw_parts(self.rings.input().add(run.start), run.len()) };
            self.ctx
                .queue
                .write_buffer(&self.input, run.start as u64, bytes);
        }
    }

    /// Records the copies out of an upload buffer holding the pass's slots in pass
    /// order (`total` bytes) and then the `params_len` bytes of its parameters.
    fn copy_up(
        &self,
        buf: &wgpu::Buffer,
        runs: &[Range<usize>],
        total: usize,
        params_len: usize,
        enc: &mut wgpu::CommandEncoder,
    ) {
        enc.copy_buffer_to_buffer(buf, total as u64, &self.params, 0, params_len as u64);
        let mut at = 0;
        for run in runs {
            enc.copy_buffer_to_buffer(
                buf,
                at as u64,
                &self.input,
                run.start as u64,
                run.len() as u64,
            );
            at += run.len();
        }
    }
}

/// A readback buffer of `size` bytes for the passes of a kernel.
fn readback_buffer(dev: &wgpu::Device, size: u64) -> wgpu::Buffer {
    dev.create_buffer(&wgpu::BufferDescriptor {
        label: Some("rk readback"),
        size,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    })
}

/// The wgpu implementation of [`RingKernelRuntime`](ringkernel_core::runtime::RingKernelRuntime). See the [module docs](self).
pub struct WgpuRuntime {
    core: Arc<RuntimeCore>,
    ctx: Arc<GpuContext>,
    poller: Arc<Poller>,
    compiled: CompileCache<Compiled>,
}

impl std::fmt::Debug for WgpuRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WgpuRuntime")
            .field("adapter", &self.ctx.info)
            .finish()
    }
}

impl WgpuRuntime {
    /// A runtime on the adapter chosen by `RINGKERNEL_WGPU_ADAPTER`, resolving kernel
    /// names through the process-wide [`KernelRegistry::global`] (the WGSL built-ins are
    /// added to it where missing). `BackendUnavailable` without a usable adapter.
    pub async fn new() -> Result<Self> {
        Self::with_registry(KernelRegistry::global().clone()).await
    }

    /// Like [`WgpuRuntime::new`], resolving kernel names through `registry` (the WGSL
    /// built-ins are added where missing).
    pub async fn with_registry(registry: KernelRegistry) -> Result<Self> {
        Self::with_selection(registry, AdapterSelection::from_env())
    }

    /// A runtime on the adapter chosen by `sel`, on the process-wide device of that
    /// adapter ([`GpuContext::shared`]).
    pub fn with_selection(registry: KernelRegistry, sel: AdapterSelection) -> Result<Self> {
        Ok(Self::with_context(registry, GpuContext::shared(&sel)?))
    }

    /// A runtime on an existing device (e.g. shared with a [`WgpuCompute`](crate::WgpuCompute)).
    pub fn with_context(registry: KernelRegistry, ctx: Arc<GpuContext>) -> Self {
        register_wgsl_builtins(&registry);
        WgpuRuntime {
            core: RuntimeCore::new(BackendKind::Wgpu, registry),
            poller: Poller::new(ctx.clone()),
            ctx,
            compiled: CompileCache::default(),
        }
    }

    /// The device the runtime runs on.
    pub fn context(&self) -> &Arc<GpuContext> {
        &self.ctx
    }

    fn info(&self) -> String {
        format!("wgpu: {}", self.ctx.info)
    }

    fn compile_module(&self, name: &str, module: DrainModule) -> Result<Compiled> {
        let dev = &self.ctx.device;
        let scope = dev.push_error_scope(wgpu::ErrorFilter::Validation);
        let layout = drain_bind_group_layout(dev);
        let pipeline_layout = dev.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some("rk drain"),
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let shader = dev.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(name),
            source: wgpu::ShaderSource::Wgsl(module.source.as_str().into()),
        });
        let pipeline = dev.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(name),
            layout: Some(&pipeline_layout),
            module: &shader,
            entry_point: Some(module.kernel().entry_point()),
            compilation_options: Default::default(),
            cache: None,
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(Error::Compile {
                backend: BackendKind::Wgpu,
                log: format!("{name}: {e}"),
            });
        }
        Ok(Compiled {
            pipeline,
            layout,
            module,
        })
    }

    /// The buffers of one kernel; its state starts zeroed.
    fn target(
        &self,
        compiled: Arc<Compiled>,
        opts: &LaunchOptions,
        state_bytes: usize,
    ) -> Result<WgpuDrainTarget> {
        let dev = &self.ctx.device;
        let rings = Arc::new(HostRings::new(opts.queue_capacity, opts.slot_size));
        let ring_len = rings.ring_len() as u64;
        let limits = dev.limits();
        let max = limits
            .max_buffer_size
            .min(limits.max_storage_buffer_binding_size);
        if ring_len > max || state_bytes as u64 > max {
            return Err(Error::invalid(format!(
                "a queue of {} slots of {} bytes does not fit the device's storage-buffer limit ({max} bytes)",
                opts.queue_capacity, opts.slot_size
            )));
        }
        let storage = wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_DST
            | wgpu::BufferUsages::COPY_SRC;
        let mk = |label: &str, size: u64, usage: wgpu::BufferUsages| {
            dev.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size,
                usage,
                mapped_at_creation: false,
            })
        };
        let scope = dev.push_error_scope(wgpu::ErrorFilter::Validation);
        let params = mk(
            "rk params",
            std::mem::size_of::<params::Drain>() as u64,
            wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        );
        let control = mk("rk control", CB as u64, storage);
        let input = mk("rk input", ring_len, storage);
        let output = mk("rk output", ring_len, storage);
        let state = mk("rk state", state_bytes as u64, storage);
        // The engine hands a pass at most a share of the ring (`pass_limit`).
        let in_flight = passes_in_flight(std::env::var(IN_FLIGHT_ENV).ok().as_deref());
        let upload_len = opts
            .queue_capacity
            .div_ceil(in_flight)
            .min(ringkernel_drain::engine::MAX_PASS as usize)
            .max(1)
            * opts.slot_size;
        let readback_len = upload_len + DEVICE_WRITTEN.len();
        let staging = (0..=in_flight)
            .map(|_| readback_buffer(dev, readback_len as u64))
            .collect();
        // Room for the largest pass in slots or compact (a compact pass of singles
        // needs 4 bytes a message more than its slots).
        let pass_max = upload_len / opts.slot_size;
        let upload_size = upload_len.max(compact_len(pass_max, opts.slot_size))
            + std::mem::size_of::<params::Drain>();
        let mut uploads = upload_buffers(
            dev,
            in_flight + 1,
            upload_size as u64,
            self.ctx.info.discrete,
            host_uploads_wanted(std::env::var(UPLOAD_ENV).ok().as_deref()),
        );
        let host_uploads = matches!(uploads.first(), Some(Upload::Host(_)));
        // Buffers start zeroed in WebGPU; the state is written anyway so that nothing
        // depends on how the allocator initialises memory.
        self.ctx
            .queue
            .write_buffer(&state, 0, &vec![0u8; state_bytes]);
        let bind_with = |input: &wgpu::Buffer| {
            dev.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("rk drain"),
                layout: &compiled.layout,
                entries: &[
                    (0, &params),
                    (1, &control),
                    (2, input),
                    (3, &output),
                    (4, &state),
                ]
                .map(|(binding, buf)| wgpu::BindGroupEntry {
                    binding,
                    resource: buf.as_entire_binding(),
                }),
            })
        };
        let bind = bind_with(&input);
        let stage = stage_directly(self.ctx.info.discrete && !host_uploads);
        // Compact passes bind their upload buffer as the input: host memory only,
        // within the device's storage-binding limit.
        let compact = stage
            && host_uploads
            && upload_size as u64 <= max
            && compact_wanted(std::env::var(COMPACT_ENV).ok().as_deref());
        if compact {
            for up in &mut uploads {
                if let Upload::Host(h) = up {
                    h.bind = Some(bind_with(&h.buf));
                }
            }
        }
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(Error::Device(format!(
                "buffers of a kernel on {}: {e}",
                self.ctx.info.name
            )));
        }
        let inner = Arc::new(Inner {
            ctx: self.ctx.clone(),
            poller: self.poller.clone(),
            compiled,
            rings: rings.clone(),
            capacity: opts.queue_capacity,
            slot_size: opts.slot_size,
            priority: opts.priority,
            params,
            control,
            input,
            output,
            staging: Arc::new(Mutex::new(staging)),
            uploads: Arc::new(Mutex::new(uploads)),
            upload_len,
            compact_max: if compact { pass_max } else { 0 },
            in_flight,
            readback_len,
            staged: Mutex::new(None),
            stage,
            control_sent: Mutex::new(None),
            control_seq: Arc::new(Mutex::new(None)),
            bind,
        });
        Ok(WgpuDrainTarget { rings, inner })
    }
}

ringkernel_drain::drain_runtime!(WgpuRuntime);

#[allow(dead_code)]
fn _assert_send_sync() {
    fn ok<T: Send + Sync>() {}
    ok::<WgpuRuntime>();
    ok::<WgpuDrainTarget>();
}

#[cfg(test)]
mod tests {
    use super::{
        finisher_threads, launcher_threads, passes_in_flight, serve_order, stage_rule, FINISHERS,
        LAUNCHERS, PASSES_IN_FLIGHT,
    };

    #[test]
    fn thread_and_pass_counts_follow_the_environment() {
        assert_eq!(launcher_threads(None, 16, true), LAUNCHERS);
        assert_eq!(launcher_threads(None, 4, true), LAUNCHERS);
        assert_eq!(launcher_threads(None, 2, true), 0);
        assert_eq!(launcher_threads(None, 2, false), LAUNCHERS);
        assert_eq!(launcher_threads(None, 3, true), 0);
        assert_eq!(launcher_threads(None, 1, true), LAUNCHERS);
        assert_eq!(launcher_threads(Some("0"), 16, true), 0);
        assert_eq!(launcher_threads(Some(" 3 "), 2, true), 3);
        assert_eq!(launcher_threads(Some("64"), 16, true), 8);
        assert_eq!(launcher_threads(Some("many"), 16, true), LAUNCHERS);
        assert_eq!(finisher_threads(None, 16, true), FINISHERS);
        assert_eq!(finisher_threads(None, 16, false), FINISHERS);
        assert_eq!(finisher_threads(None, 4, true), 1);
        assert_eq!(finisher_threads(None, 2, true), 0);
        assert_eq!(finisher_threads(None, 2, false), 1);
        assert_eq!(finisher_threads(None, 1, true), 1);
        assert_eq!(finisher_threads(Some("1"), 2, true), 1);
        assert_eq!(finisher_threads(Some("0"), 16, true), 0);
        assert_eq!(finisher_threads(Some(" 3 "), 2, true), 3);
        assert_eq!(finisher_threads(Some("64"), 16, true), 8);
        assert_eq!(finisher_threads(Some("two"), 16, true), FINISHERS);
        assert_eq!(passes_in_flight(None), PASSES_IN_FLIGHT);
        assert_eq!(passes_in_flight(Some("12")), 12);
        assert_eq!(passes_in_flight(Some("0")), 1);
        assert_eq!(passes_in_flight(Some("100")), 32);
    }

    /// Where the upload buffers are the runtime's host memory (Vulkan), the engine is
    /// offered compact passes up to the upload buffers' size, each in a buffer with a
    /// bind group of its own; elsewhere (wgpu's mapped buffers, `COMPACT_ENV=0`) never.
    #[test]
    fn host_memory_uploads_take_compact_passes() {
        use super::{compact_wanted, WgpuRuntime, COMPACT_ENV};
        use crate::upload::Upload;
        use ringkernel_core::options::LaunchOptions;
        use ringkernel_core::registry::{GpuHandler, KernelRegistry};
        use ringkernel_drain::engine::{DrainModule, DrainTarget};
        use ringkernel_shaders::drain;
        use std::sync::Arc;
        let Some(ctx) = crate::test_context() else {
            return;
        };
        let rt = WgpuRuntime::with_context(KernelRegistry::default(), ctx);
        let (name, wgsl, state) = drain::builtin_handlers()
            .into_iter()
            .find(|h| h.0 == "rk.echo")
            .unwrap();
        let mut handler = GpuHandler::new(name);
        handler.wgsl = Some(wgsl);
        let module = DrainModule::compose(&handler).unwrap();
        let compiled = Arc::new(rt.compile_module(name, module).unwrap());
        let opts = LaunchOptions::default()
            .with_queue_capacity(64)
            .with_slot_size(144);
        let t = rt.target(compiled, &opts, state.max(16)).unwrap();
        let host = matches!(super::lock(&t.inner.uploads).first(), Some(Upload::Host(_)));
        let want =
            host && t.inner.stage && compact_wanted(std::env::var(COMPACT_ENV).ok().as_deref());
        let max = t.inner.compact_max;
        assert_eq!(max > 0, want, "{}", rt.ctx.info);
        if !want {
            assert!(t.stage_compact(1).is_none());
            return;
        }
        assert_eq!(
            max,
            64usize.div_ceil(t.inner.in_flight),
            "a pass's share of the ring"
        );
        assert!(
            t.stage_compact(max + 1).is_none(),
            "larger than an upload buffer"
        );
        for count in [1, max] {
            assert!(t.stage_compact(count).is_some());
            let staged = super::lock(&t.inner.staged).take().unwrap();
            assert!(staged.compact);
            assert_eq!(
                staged.slots,
                ringkernel_drain::engine::compact_len(count, 144)
            );
            assert!(matches!(&staged.up, Upload::Host(h) if h.bind.is_some()));
            staged.up.recycle(t.inner.uploads.clone());
        }
    }

    #[test]
    fn bar_uploads_stage_through_the_host_ring_unless_told() {
        assert!(!stage_rule(None, true));
        assert!(stage_rule(None, false));
        assert!(stage_rule(Some("1"), true));
        assert!(!stage_rule(Some(" 0 "), false));
    }

    #[test]
    fn passes_of_higher_priority_kernels_are_finished_first() {
        use ringkernel_core::priority::{CRITICAL, HIGH, LOW, NORMAL};
        // (kernel priority, submission order)
        let mut ready = vec![(LOW, 0), (NORMAL, 3), (CRITICAL, 2), (NORMAL, 1), (HIGH, 4)];
        serve_order(&mut ready, |r| (r.0, r.1 as u64));
        let order: Vec<u32> = ready.iter().map(|r| r.1).collect();
        assert_eq!(order, vec![2, 4, 1, 3, 0]);
    }
}
