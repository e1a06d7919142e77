//! The host side of an event-driven actor: queues in memory the host shares with the
//! device, drain passes dispatched when messages wait, completions that collect the
//! outputs. Written once for every event-driven backend (WebGPU and Metal).
//!
//! WebGPU and Metal have no persistent kernels, so a kernel's handler runs in *drain
//! passes* (`ringkernel-shaders`' drain template): the input ring, output ring, control
//! block and handler state live in device buffers. Accepted messages wait on the host
//! in one FIFO lane per priority level ([`ringkernel_core::priority`]); whenever
//! messages are waiting (and no pass is running) the host copies them into the input
//! slots — highest lane first — and dispatches one pass over all of them. The pass's
//! completion — a Metal completion handler, a wgpu buffer-map callback run by the
//! backend's poller, a plain thread in the tests — reads the outputs, stamps them
//! (message id, HLC timestamp), queues replies for the host, routes K2K sends through
//! the runtime, raises [`KernelEvents`] and starts the next pass if more messages
//! arrived. Nothing waits on an async executor thread.
//!
//! ## Pace
//!
//! The host's work is per pass wherever it can be: one clock reading and one clock
//! merge for the requests of a pass, one block of timestamps for its outputs, one
//! latency update; per message only one copy into its slot (into memory the target
//! stages for the pass where it has some, [`DrainTarget::stage_input`]). A batch sent
//! at once ([`KernelEngine::try_enqueue_run`]) is queued under one lock as a run: one
//! header, then the payloads, each message's header rebuilt from the first as it goes
//! into its slot; when no message waits, the passes that can start at once take the
//! run straight from the caller's payloads (one copy, into the slots) and only the rest
//! is queued. A target may also allow several passes in
//! flight ([`DrainTarget::max_in_flight`]; wgpu does): then, while one pass runs, a
//! further one starts over free slots of the ring once it can take
//! [`OVERLAP_MIN_BATCH`] messages (a quarter of a smaller ring), so the host reads one
//! pass's outputs while the device runs the next. A pass then takes at most the ring's
//! capacity divided by the passes allowed in flight (and never more than [`MAX_PASS`]),
//! so a burst of messages becomes overlapping passes rather than one that holds the
//! whole ring. A pass's outputs are read on the thread that completes it (a target
//! may complete several passes at once on several threads: wgpu does), stamped with
//! timestamps and ids reserved for the pass at launch, and queued in launch order
//! whatever the order of their completions, so replies, a serial handler's state and
//! every count keep the order of a single pass at a time. Completions queue under a
//! lock of their own, not the host lock that a sender holds while it copies a pass's
//! messages into their slots; the next pass a completion would start is started by
//! whoever holds the host lock when it lets go.
//!
//! Runs stay runs on the way out too: a pass's replies join one run in the reply queue
//! (consecutive ids and timestamps), and a receiver takes them a run at a time
//! ([`KernelEngine::try_dequeue_runs_with`], which `receive_batch_into` decodes with one
//! header check a run); a waiting run goes into its slots with one clock check (its
//! last timestamp is its latest).
//!
//! ### Host CPU a message in the batched echo (issue 17, helper i17e, 2026-11-27)
//!
//! Measured with `wgpu_bench --actors-only --batched-only --msgs 2000000` on the
//! 2-core development VM through lavapipe, each build alternating with a build of
//! `main` (e7197e8) in the same minutes, 7 pairs a row, each run under
//! `perf record -e cpu-clock`. "Host threads" is the CPU of the receiver (main thread),
//! the sender (tokio worker) and the wgpu poller, from the samples, leaving out
//! lavapipe's own threads (about half the process CPU here is lavapipe running the
//! shader and the buffer copies, which a GPU does instead). Medians of the pair ratios
//! (after / before):
//!
//! | Change (cumulative) | msgs/s | process CPU a message | host threads a message |
//! |---|---|---|---|
//! | receive a run at a time (`try_dequeue_runs_with`, `Records::pop_runs_with`) | 1.03× | 0.98× | 0.93× |
//! | + `fill_ring` takes waiting runs whole, one clock check a run | 1.04× | 0.96× | 0.92× (154 → 142 ns) |
//! | + batch receives poll at most [`BATCH_RECEIVE_SPIN`](ringkernel_core::runtime::BATCH_RECEIVE_SPIN) (100 µs) for their first message, then sleep on the output event (was up to [`REPLY_WAIT_MAX`], 500 µs, a call) | 1.07× | 0.91× (300 → 265 ns) | 0.78× (169 → 137 ns) |
//!
//! A second set of 8 pairs of the last build against `main`, on a busier machine
//! (16:24), gave 1.04× msgs/s, 0.94× process CPU and 0.90× host threads (170 → 149
//! ns); 8 pairs without `perf` 1.06× msgs/s and 0.98× process CPU (lavapipe's share
//! hides the rest there).
//!
//! In the profiles (10M messages, `perf record -g`), the receiver's polling between
//! passes was the largest receive-side item before (about 15 ns a message here; on
//! the H100, where a pass of the echo takes milliseconds, it could poll 500 µs a
//! `receive_batch_into` call), and decoding the replies fell from about 20 to about
//! 7 ns a message. Tried and not kept (profile only): comparing the header in
//! `Records::push` as 64 bytes (`memcmp`) instead of field by field: the time moved
//! into the `memcmp` call. Left: the poller thread's share
//! (`finish_pass` reading the readback slots and queueing the replies, about 20 ns a
//! message here, and filling the next pass from the lane), the sender's copy of a run
//! into the lane when the ring is full (a second copy, into the slots, follows), one
//! `memcpy` call a payload.
//!
//! ### Which host thread bounds the batched echo (issue 17, helper i17f, 2026-11-27)
//!
//! `wgpu_bench`'s batched echo prints the CPU time of each thread a message
//! (`/proc/self/task/*/schedstat` before and after; "n/a" off Linux): the receiver
//! (the main thread), the sender (the tokio workers, named `bench-worker`), the wgpu
//! poller, and the other threads by name (lavapipe's carry the process's name and
//! show as `unnamed`). On the 2-core development VM through lavapipe, 4M messages,
//! medians of 20 runs of `main` (f29b755, the same bench): receiver 17–19 ns, sender
//! 29–36 ns, **poller 41–46 ns** (the busiest of ours), lavapipe's threads about
//! 150 ns, process 230–260 ns a message. A `perf record -e cpu-clock` profile puts
//! the poller's time in three places, about equal: the copy of the next pass's
//! messages from the lane into the upload buffer (`fill_ring`, after each
//! completion), reading the readback headers (`finish_pass`), and appending the
//! replies (`Records::push`, whose 72-byte `Token` payload is a `memcpy` call). The
//! hot instructions are the stores into the slots and the loads of the readback: a
//! pass of 21,845 messages moves 5.6 MB of 256-byte slots each way, out of cache.
//!
//! Tried, each measured in 20 alternating pairs against `main` (4M messages, median
//! ratios after / before):
//!
//! | Change | msgs/s | process CPU a message | poller a message | sender a message | busiest of ours |
//! |---|---|---|---|---|---|
//! | [`DrainConfig::sender_fills`] on ([`SENDER_FILLS_ENV`]): a sender waiting for lane room starts the passes completions would start, so the lane-to-slot copy runs on its thread | 1.005× | 1.02× | 0.76× (41 → 32 ns) | 1.40× (29 → 41 ns) | 1.03× |
//! | payloads of 8–128 bytes copied inline (two overlapping fixed-size copies) instead of a `memcpy` call, in the lanes, the slots and the replies (not kept) | 1.03× | 1.00× | 0.93× | 1.09× | 0.93× |
//!
//! A second set of 12 pairs of the committed build (17:21, a quieter machine): with the
//! switch off the same as `main` (1.00× msgs/s, 1.01× process CPU, poller 40 → 40
//! ns); on, 1.07× msgs/s, 0.98× process CPU, poller 0.73× (42 → 30 ns), sender 1.23×
//! (30 → 40 ns), busiest of ours 0.95×.
//!
//! Lavapipe is what bounds the rate here (its threads take about 60% of the process
//! CPU), so the rate does not move; moving the fill only moves about 10 ns a message
//! from the poller to the sender at the same total, which is why it stays opt-in
//! until a GPU run shows the poller to be the bottleneck there (on the H100 a pass's
//! launch to completion, ~2.3 ms for 21,845 messages while the device works ~40 µs,
//! is about 105 ns a message: consistent with one host thread bound, which the
//! per-thread line of the next GPU run names). The inline copies
//! removed the `memcpy` calls from the profile but the time moved into the callers
//! (the stores are the cost), with no change of the total measurable here. First
//! try of the switch (not kept): a completion that deferred once and cleared the
//! flag moved a third of the fills only (later completions of the same poller round
//! kicked before the sender woke).
//!
//! On the H100 through Vulkan (2026-11-27, three alternating pairs of `wgpu_bench
//! --actors-only --batched-only --msgs 2000000`, the switch off / on): 6.05 / 9.21,
//! 8.01 / 11.05 and 8.33 / 10.54 M msgs/s, 1.38× at the median, with process CPU 190–260
//! against 165–195 ns a message. With the switch off the busiest of our threads was the
//! sender in two pairs (161, 110 ns a message) and the poller in one (96 ns). Two more
//! pairs on another H100 (on / off): 11.80 / 12.66 and 12.28 / 12.12 M msgs/s (0.93×,
//! 1.01×), the sender the busiest thread either way (about 80 ns a message). Median of
//! the five pairs 1.27×, so the switch is on by default
//! (`RINGKERNEL_DRAIN_SENDER_FILLS=0` turns it off).
//!
//! ### The sender's CPU a message (issue 17, helper i17g, 2026-11-27)
//!
//! `KernelHandle::send_batch` of plain-data messages hands the engine the batch's
//! bytes as one slice ([`MessageCodec::run_bytes`](ringkernel_core::message::MessageCodec::run_bytes),
//! [`KernelEngine::try_enqueue_fixed_run`]): no payload list is built, the payload
//! size is checked once a run, the direct fill reads payload `i` at `i · len`, and a
//! run that waits goes into its lane in one copy a chunk when its length is a multiple
//! of 8 ([`Records::push_fixed_run`]). rkyv messages (a payload each) take the path
//! they took before. Measured with `wgpu_bench --actors-only --batched-only --msgs
//! 4000000` on the 2-core development VM through lavapipe, alternating pairs, the
//! per-thread CPU the bench prints, medians of the pair ratios (after / before):
//!
//! | Change | pairs | msgs/s | process CPU a message | sender a message | poller a message |
//! |---|---|---|---|---|---|
//! | the bench's sender makes its tokens once and changes only `id` and `value` (it built each with `Token::new`, which `perf` showed as a fifth to a third of the sender thread) | 8 | 1.04× | 0.97× | 0.89× (40 → 36 ns) | 0.87× |
//! | the plain-data run as one slice, against `main` with the bench change | 8 | 1.04× | 0.97× | 0.86× (36 → 32 ns) | 1.05× |
//! | the same, a set measured before the header change below was taken out | 8 | 1.01× | 0.99× | 0.92× (38 → 34 ns) | 1.06× |
//! | both (the committed build), against `main` (e6ada05) | 10 | 1.02× | 0.96× | 0.76× (43 → 34 ns) | 0.99× |
//!
//! Tried and not kept: writing a slot's header as the run's first header plus the four
//! fields that differ, instead of a header built per message (`perf` put the sender's
//! hottest instruction on the load of that header from the stack, right after the
//! narrower stores that built it): 8 pairs against the token change gave 1.05× msgs/s,
//! 0.97× process CPU and 0.99× sender (31 → 32 ns), 8 earlier pairs at 2M messages
//! 1.00×, 0.99× and 1.09×: the time moved to the stores into the slots, which are what
//! the fill costs here (they miss the cache). Left: those stores, and the second copy
//! of a run that waits (lane, then slots). In a profile of the committed build (10M
//! messages) the sender thread is about half `fill_ring` (the stores into the slots)
//! and a third the bench writing each batch's `id` and `value` (1.2 MB a batch of
//! 16,384, out of cache): part of the sender's figure is the bench's own.
//!
//! ## Priority
//!
//! The ordering happens on the host, in the step that fills the input ring for a pass
//! (`DrainEngine::fill_ring`): the pass's slots hold the waiting messages highest lane
//! first, FIFO within a lane. So a high-priority message overtakes every lower one
//! that has not been handed to a pass yet (a pass already running is not
//! interrupted); a serial handler (`RK_SERIAL`) sees the messages in that order, and
//! the replies reach the host in that order. Every output of the kernel (reply, K2K
//! send) carries the kernel's [`LaunchOptions::priority`].
//!
//! Capacity and memory: each lane holds up to `queue_capacity` messages
//! ([`Error::QueueFull`] per lane, so a full LOW lane does not hold a HIGH send back);
//! a waiting message costs its header and payload on the host heap (buffers are
//! reused). The device rings keep `queue_capacity` slots each, the most the passes in
//! flight take together.
//!
//! Backpressure: a pass takes at most as many messages as the host's reply queue has
//! room for (`output_capacity`, less the messages of the passes in flight), and while
//! K2K sends wait for a full destination (in order, retried by one helper OS thread
//! with back-off) no new pass starts — the event-driven equivalent of a CPU worker that
//! blocks on a full queue.
//!
//! ## Metrics
//!
//! The same meaning as on the CPU backend (`ringkernel-cpu`); every message taken by a
//! pass ends up counted exactly once, as processed or as dropped:
//!
//! * `received`: messages accepted into the input ring.
//! * `processed`: messages the handler handled successfully (status 0): with a reply,
//!   without output, or with a K2K send that was delivered. A K2K send counts when it is
//!   delivered (it may wait for room at its destination), as a CPU handler's `send_to`
//!   returns only once it is.
//! * `dropped`: messages that were not handled, each logged with its [`DropReason`]: the
//!   handler refused it (non-zero status, e.g. a wrong type), the host refused it before
//!   the pass (its timestamp is too far ahead of the kernel's clock, as on the CPU; the
//!   slot is invalidated and the drain template skips it), its output was corrupt, or its
//!   K2K destination is gone. A refused message is dropped, not processed.
//! * `emitted`: outputs that left the kernel: replies queued for the host and K2K sends
//!   delivered.
//! * latency: one sample per message that reached the handler. A pass cannot time its
//!   messages one by one, so each sample is the pass's time (dispatch to completion)
//!   divided by its message count.
//!
//! Outputs are validated before they are used: an output slot is a message when the
//! device's output unit ([`drain::Output`]) says so, with the `REPLY` or `K2K` flag and
//! a payload length that fits the slot; the host then writes its whole header (the
//! request's correlation id among it: `PassInfo::correlations`). The drain template
//! checks each request's header ([`is_valid`](MessageHeader::is_valid): magic and
//! version) before it runs the handler.
//!
//! The GPU-specific part is one trait, [`DrainTarget`]; everything here is tested on
//! Linux against a CPU stand-in that follows the drain template's protocol, and runs in
//! CI through the WebGPU backend on a software Vulkan adapter.

use crate::msl::HostSlot;
use crate::records::Records;
use crate::sizing::groups_for;
use ringkernel_core::control::ControlBlock;
use ringkernel_core::error::{Error, Result};
use ringkernel_core::hlc::{HlcClock, HlcTimestamp};
use ringkernel_core::k2k::{K2kReceipt, KernelTarget};
use ringkernel_core::lifecycle::{AtomicLifecycle, LifecycleState};
use ringkernel_core::message::{
    check_payload_fits, flags, Envelope, MessageHeader, Payload, HEADER_SIZE,
};
use ringkernel_core::options::LaunchOptions;
use ringkernel_core::priority;
use ringkernel_core::queue::QueueHeader;
use ringkernel_core::registry::{check_accepts, GpuHandler, KernelRegistry, MessageInput};
use ringkernel_core::runtime::{
    check_fixed_run, run_payload, KernelEngine, KernelEvents, KernelHandle, KernelId, RunPayloads,
    RuntimeCore, TerminateReport,
};
use ringkernel_core::telemetry::{KernelCounters, KernelMetrics};
use ringkernel_core::util::{lock, prefetch, BoxFuture};
use ringkernel_shaders::{drain, grid_for, params, Kernel};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

/// How many slots ahead the host's slot loops (`fill_ring`, `build_pass`) prefetch.
const PREFETCH_SLOTS: usize = 8;

/// Byte offset of slot `index` in a ring of `capacity` slots of `slot_size` bytes.
pub fn slot_offset(index: u64, capacity: usize, slot_size: usize) -> usize {
    std::mem::size_of::<QueueHeader>() + (index as usize & (capacity - 1)) * slot_size
}

/// Bytes of a ring: the 128-byte queue header plus the slots.
pub fn ring_bytes(capacity: usize, slot_size: usize) -> usize {
    std::mem::size_of::<QueueHeader>() + capacity * slot_size
}

/// Bytes of a compact pass of up to `count` requests in slots of `slot_size` bytes
/// ([`DrainTarget::stage_compact`]; the drain template's "Compact passes"), all at
/// offsets fixed by `count`: the payloads, request `j`'s at `j · (slot_size - 64)`; from
/// `count · (slot_size - 64)` up to `count` run headers of 64 bytes; from
/// `count · slot_size` the runs' first indices (`u32`), padded to 16 bytes. A multiple
/// of 16.
pub fn compact_len(count: usize, slot_size: usize) -> usize {
    count * slot_size + (count * 4).next_multiple_of(16)
}

/// Where the drain passes of one kernel run: the memory the host shares with the
/// device, and the dispatch itself.
///
/// # Safety
///
/// The engine reads and writes through the returned pointers without further checks,
/// so an implementation must guarantee, for as long as it lives:
///
/// * `input()` and `output()` each address [`ring_len`](Self::ring_len) bytes, and
///   `control()` 128 bytes, of memory the host may read and write, not aliased by any
///   Rust reference;
/// * the device side writes only what the drain template writes (output slots and the
///   worker line of the control block of the pass being run), and only between
///   `launch` and the call of its `done` callback.
///
/// A backend without memory the host and the device share (wgpu) keeps host copies
/// ([`HostRings`](crate::shadow::HostRings)) and moves the bytes in `launch` (the
/// pass's input slots and the host-written part of the control block up) and before
/// `done` (the pass's output slots and the device-written fields of the control block
/// down).
pub unsafe trait DrainTarget: Send + Sync + 'static {
    /// Bytes of each ring (at least [`ring_bytes`] of the kernel's capacity and slot size).
    fn ring_len(&self) -> usize;
    /// Host address of the input ring.
    fn input(&self) -> *mut u8;
    /// Host address of the output ring (same size).
    fn output(&self) -> *mut u8;
    /// Host address of the control block (128 bytes).
    fn control(&self) -> *mut u8;
    /// Starts one pass with `params` over the input slots `[first, first + count)`.
    /// `done` must be called exactly once when the device has finished, with where the
    /// outputs are ([`PassOutputs`]), or with the error that stopped it, from another
    /// thread or after `launch` returned: the engine calls `launch` with its host lock
    /// held, and `done` takes that lock. When `launch` returns an error, `done` is never
    /// called.
    ///
    /// With [`max_in_flight`](Self::max_in_flight) above 1, `launch` is called again
    /// before earlier passes are done, always over other slots; the passes must then
    /// run on the device in the order they were launched (a serial handler's state
    /// sees them in that order). Their `done` calls may come in any order: the engine
    /// finishes passes in launch order.
    fn launch(&self, params: params::Drain, done: PassDone) -> Result<()>;

    /// How many passes of one kernel may be in flight at once (at least 1; the
    /// default). A target that records each pass with its own parameters and readback
    /// (wgpu) can overlap the host's work on one pass with the device's on the next.
    fn max_in_flight(&self) -> usize {
        1
    }

    /// Where the engine writes the input slots of the pass it is about to launch over
    /// `count` messages, when not into the input ring: the address of
    /// `count · slot_size` bytes the host may write (it never reads them), slot `j` of
    /// the pass at `j · slot_size`; only a slot's header and payload are written. The
    /// engine calls it with its host lock held, writes the slots and calls
    /// [`launch`](Self::launch) for that pass at once (same lock, same thread), which
    /// then moves the slots from there to the device. A target whose `launch` copies
    /// the input slots anyway (wgpu: into an upload buffer) saves a copy of every
    /// message this way. The default, `None`: the slots are written into the input
    /// ring ([`input`](Self::input)).
    fn stage_input(&self, count: usize) -> Option<*mut u8> {
        let _ = count;
        None
    }

    /// Where the engine writes the pass it is about to launch over `count` messages as
    /// a *compact* pass (`ringkernel_shaders::drain`, "Compact passes"), when the
    /// target binds each pass's staged bytes as its input: the address of
    /// [`compact_len`]`(count, slot_size)` bytes the host may write (it never reads
    /// them), in the layout [`compact_len`] describes. As with
    /// [`stage_input`](Self::stage_input), the engine calls it with its host lock held
    /// and calls [`launch`](Self::launch) for that pass at once, whose parameters then
    /// have `in_stride != 0`. Asked before `stage_input`; the default, `None`, asks
    /// for a pass in ring layout.
    fn stage_compact(&self, count: usize) -> Option<*mut u8> {
        let _ = count;
        None
    }

    /// Makes what progress it can on passes in flight without blocking: e.g. looks
    /// whether the device has finished one and, if so, calls its `done` on the calling
    /// thread. Returns whether a pass was finished. Receivers waiting for a reply call
    /// it while they spin ([`KernelEngine::progress`]), so that a short pass is finished
    /// by the thread that waits for it instead of by a thread it then has to wake. The
    /// default does nothing (a target whose completions arrive on their own).
    fn progress(&self) -> bool {
        false
    }
}

/// Where the outputs of a finished pass are, as a target's `done` hands them over.
#[derive(Debug)]
pub enum PassOutputs<'a> {
    /// In the output ring ([`DrainTarget::output`]).
    InRing,
    /// In `bytes`: the pass's output slots in pass order, the `j`-th message's at
    /// `j · slot_size` (e.g. a mapped readback buffer the slots were copied into, a run
    /// where the pass wraps around the ring following the run before it), read during
    /// the call with no copy into the output ring first.
    Slots(&'a [u8]),
}

/// The completion of one pass ([`DrainTarget::launch`]).
pub type PassDone = Box<dyn for<'a> FnOnce(Result<PassOutputs<'a>>) + Send>;

/// One pass's outputs as read by [`DrainEngine::build_pass`] (on whichever thread
/// completes the pass, without the host lock): its replies, stamped and ready to append,
/// its K2K sends and its counts. Applied in launch order ([`DrainEngine::apply_pass`]).
struct Built {
    replies: Records,
    routes: Vec<Route>,
    processed: u64,
}

/// What a pass needs once it completes: where it lies in the ring, when it started, and
/// the output stamps reserved for it at launch (so its outputs can be stamped on any
/// thread, in parallel with other passes, and still keep launch order).
struct PassInfo {
    first: u64,
    count: u64,
    started: Instant,
    /// The first of `count` consecutive timestamps for the pass's outputs.
    stamps: HlcTimestamp,
    /// The first of `count` message ids for its outputs (none without a runtime).
    ids: Option<u64>,
    /// The requests' correlation ids, which their outputs carry (the device does not
    /// write them): `(j, c)` where a piece of a run starts at batch index `j` with
    /// correlation id `c`, its later messages following on (`c + 1`, ...); rising `j`,
    /// the first 0.
    correlations: Vec<(u64, u64)>,
}

/// While a pass is in flight, a further one starts only once it can take this many
/// messages (a quarter of the ring for rings smaller than four times this): a
/// completion starts the next pass anyway, so small batches wait for it instead of
/// taking a pass of their own.
pub const OVERLAP_MIN_BATCH: u64 = 256;

/// The shortest a receiver looks for a reply before it sleeps
/// ([`KernelEngine::reply_wait`]), whatever the passes take.
pub const REPLY_WAIT_MIN: std::time::Duration = std::time::Duration::from_micros(20);

/// The longest a receiver looks for a reply before it sleeps: a pass that takes longer
/// is waited for asleep, and woken by its completion.
pub const REPLY_WAIT_MAX: std::time::Duration = std::time::Duration::from_micros(500);

/// Most messages one drain pass takes (a pass is also limited to the ring's free slots
/// and, with several passes in flight, to the ring's capacity divided by their number).
pub const MAX_PASS: u64 = 65_536;

/// A handler's WGSL composed with the drain template and validated by naga: what a
/// backend compiles for a drain kernel.
pub struct DrainModule {
    /// The complete WGSL module (template, f64 library, handler).
    pub source: String,
    /// naga's module and validation info.
    pub validated: ringkernel_shaders::Validated,
    /// Whether the handler asks for in-order processing (`RK_SERIAL`).
    pub serial: bool,
}

impl DrainModule {
    /// Composes and validates `handler`'s WGSL; a handler without WGSL is
    /// [`Error::KernelNotFound`], WGSL that does not validate [`Error::Compile`].
    pub fn compose(handler: &GpuHandler) -> Result<Self> {
        let wgsl = handler.wgsl.as_deref().ok_or_else(|| {
            Error::KernelNotFound(format!("GPU handler {:?} has no WGSL source", handler.name))
        })?;
        let source = drain::compose(wgsl);
        let validated = ringkernel_shaders::validate_source(&handler.name, &source)?;
        let serial = drain::is_serial(&validated.module);
        Ok(DrainModule {
            source,
            validated,
            serial,
        })
    }

    /// The entry point passes run.
    pub fn kernel(&self) -> Kernel {
        if self.serial {
            Kernel::DrainSerial
        } else {
            Kernel::Drain
        }
    }

    /// Workgroups (threadgroups) of a pass over `count` messages.
    pub fn groups(&self, count: u32) -> [u32; 3] {
        if self.serial {
            [1, 1, 1]
        } else {
            grid_for(groups_for(count as usize, drain::DRAIN_WORKGROUP_SIZE as usize) as u64)
        }
    }
}

/// Compiled drain handlers of one runtime, by handler name and WGSL source (a handler
/// registered again with other WGSL compiles anew).
pub struct CompileCache<C> {
    compiled: Mutex<std::collections::HashMap<(String, String), Arc<C>>>,
}

impl<C> Default for CompileCache<C> {
    fn default() -> Self {
        CompileCache {
            compiled: Mutex::new(std::collections::HashMap::new()),
        }
    }
}

impl<C> CompileCache<C> {
    /// The compiled form of `handler`: from the cache, or composed
    /// ([`DrainModule::compose`]) and compiled by `compile` (an error is not cached).
    pub fn get_or_compile(
        &self,
        handler: &GpuHandler,
        compile: impl FnOnce(DrainModule) -> Result<C>,
    ) -> Result<Arc<C>> {
        let key = (
            handler.name.clone(),
            handler.wgsl.clone().unwrap_or_default(),
        );
        if let Some(c) = lock(&self.compiled).get(&key) {
            return Ok(c.clone());
        }
        let c = Arc::new(compile(DrainModule::compose(handler)?)?);
        lock(&self.compiled).insert(key, c.clone());
        Ok(c)
    }
}

/// Bytes of handler state a kernel gets: the larger of what the handler and the launch
/// options ask for, at least [`drain::MIN_STATE_BYTES`], rounded up to whole words.
pub fn state_bytes(handler: &GpuHandler, opts: &LaunchOptions) -> usize {
    opts.state_bytes
        .max(handler.state_bytes)
        .max(drain::MIN_STATE_BYTES)
        .next_multiple_of(4)
}

/// What the host binds for a drain pass, by Metal buffer index: the parameter block,
/// then the control block, input ring, output ring and handler state (the order of
/// the buffers in [`DrainTarget`]). Checked against the generated MSL by the tests.
pub const DRAIN_SLOTS: [HostSlot; 5] = [
    HostSlot {
        index: 0,
        name: "rk_params",
        writes: false,
    },
    HostSlot {
        index: 1,
        name: "rk_control",
        writes: true,
    },
    HostSlot {
        index: 2,
        name: "rk_input",
        writes: false,
    },
    HostSlot {
        index: 3,
        name: "rk_output",
        writes: true,
    },
    HostSlot {
        index: 4,
        name: "rk_state",
        writes: true,
    },
];

/// A K2K send waiting for delivery.
type Route = (KernelTarget, MessageHeader, Vec<u8>);

/// Why a message was dropped (see the [module docs](self#metrics)); logged with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// The handler returned this non-zero status (e.g.
    /// [`ERR_TYPE_MISMATCH`](ringkernel_shaders::drain::ERR_TYPE_MISMATCH)).
    Refused(u32),
    /// The request was not valid when the pass ran: its header was not a message of
    /// this version, or the host refused it before the pass (its timestamp was too far
    /// ahead of the kernel's clock).
    InvalidRequest,
    /// The handler wrote an output whose payload length does not fit the slot.
    CorruptOutput,
    /// A K2K send whose destination is gone (terminated, unknown, or the runtime
    /// was dropped).
    DestinationGone,
}

impl std::fmt::Display for DropReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DropReason::Refused(s) => write!(f, "the handler refused it (status {s})"),
            DropReason::InvalidRequest => f.write_str("the request was not a valid message"),
            DropReason::CorruptOutput => {
                f.write_str("the handler wrote a payload length that does not fit the slot")
            }
            DropReason::DestinationGone => f.write_str("its K2K destination is gone"),
        }
    }
}

/// Registers the WGSL versions of the built-in kernels (`rk.echo`, `rk.stage`,
/// `rk.counter`) on `registry`, with the semantics of the CPU ones in
/// [`ringkernel_core::builtin`]. A handler already registered with WGSL under one of
/// these names is kept. Every event-driven runtime calls this in its constructor.
pub fn register_builtins(registry: &KernelRegistry) {
    for (name, wgsl, state_bytes) in drain::builtin_handlers() {
        let has_wgsl = registry
            .gpu(name)
            .map(|h| h.wgsl.is_some())
            .unwrap_or(false);
        if !has_wgsl {
            registry.register_gpu(
                GpuHandler::new(name)
                    .with_wgsl(wgsl)
                    .with_state_bytes(state_bytes)
                    .with_input::<ringkernel_core::builtin::Token>(),
            );
        }
    }
}

struct Host {
    /// Messages waiting for a pass (accepted by `try_enqueue`, not yet in the input
    /// ring), one FIFO lane per priority level ([`priority::lane`]); a pass takes them
    /// highest lane first.
    lanes: [Records; priority::LANES],
    /// Messages written into the input ring.
    tail: u64,
    /// Messages handed to passes so far.
    dispatched: u64,
    /// Set when an active kernel is terminated: passes keep running until the input is
    /// empty. A kernel terminated while inactive runs no more passes.
    draining: bool,
    failed: Option<Error>,
    /// With [`DrainConfig::sender_fills`], set when `try_enqueue_run` found its lane
    /// full (its caller then waits for `input_space` and enqueues again): completions
    /// leave the passes they would start from the lanes to that sender, which starts
    /// them when it comes back (`try_enqueue_run` kicks first), so the thread
    /// finishing passes does not also copy the next pass's messages into their slots.
    /// Only while other passes are in flight: the completion of the last one kicks,
    /// so a sender that never comes back costs overlap (one pass at a time until the
    /// next enqueue), never progress.
    sender_waiting: bool,
}

/// The passes in flight, under a lock of their own ([`DrainEngine::flight`]): a
/// completion queues its pass's outputs without the host lock, which a sender holds
/// while it copies a pass's messages into their slots (on an H200 the batched echo's
/// completions waited up to 1.2 ms for it while finished passes held their slots;
/// BENCHMARKS.md, 2026-11-28).
#[derive(Default)]
struct Flight {
    /// Passes launched and not completed yet.
    in_flight: usize,
    /// Messages whose pass has completed (their input slots are free again).
    completed: u64,
    /// Passes completed (and built) before earlier ones: (first, count, outputs),
    /// applied in launch order.
    early: Vec<(u64, u64, Result<Built>)>,
    drained_after_terminate: u64,
}

/// The host lock, held ([`DrainEngine::host`]). When it is released, it starts the
/// pass a completion owed while it was held ([`DrainEngine::kick_owed`]): a completion
/// does not wait for the host lock to start the next pass.
struct HostGuard<'a, T: DrainTarget> {
    engine: &'a DrainEngine<T>,
    guard: Option<std::sync::MutexGuard<'a, Host>>,
}

impl<T: DrainTarget> std::ops::Deref for HostGuard<'_, T> {
    type Target = Host;
    fn deref(&self) -> &Host {
        self.guard.as_ref().expect("held until dropped")
    }
}

impl<T: DrainTarget> std::ops::DerefMut for HostGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut Host {
        self.guard.as_mut().expect("held until dropped")
    }
}

impl<T: DrainTarget> Drop for HostGuard<'_, T> {
    fn drop(&mut self) {
        let Some(mut g) = self.guard.take() else {
            return;
        };
        if std::thread::panicking() {
            return;
        }
        let e = self.engine;
        loop {
            if e.kick_owed.swap(false, Ordering::SeqCst) {
                e.kick_after_completion(&mut g);
            }
            drop(g);
            // A completion that owed a kick after the check above found the lock held
            // (by us): take it again to start that pass, unless another thread holds
            // it now (it starts the pass when it releases the lock).
            if !e.kick_owed.load(Ordering::SeqCst) {
                return;
            }
            g = match e.try_host_lock() {
                Some(g) => g,
                None => return,
            };
        }
    }
}

impl Host {
    /// Messages waiting in the lanes.
    fn waiting(&self) -> usize {
        self.lanes.iter().map(Records::len).sum()
    }

    /// Takes every waiting message, in the order a pass would: highest lane first.
    fn take_all_waiting(&mut self, mut take: impl FnMut(&MessageHeader, &[u8])) {
        for lane in self.lanes.iter_mut().rev() {
            lane.pop_with(usize::MAX, |h, p| {
                take(h, p);
                true
            });
        }
    }
}

/// A run being enqueued (`try_enqueue_run`) while no message waits: a pass started
/// now takes its messages straight from the caller's payloads, so they are copied once,
/// into their slots, and never into a waiting lane; what no pass takes is queued after.
struct DirectRun<'a, 'p> {
    first: MessageHeader,
    payloads: RunPayloads<'a, 'p>,
    /// Messages of the run already in slots.
    taken: usize,
}

impl DirectRun<'_, '_> {
    fn left(&self) -> usize {
        self.payloads.count() - self.taken
    }
}

/// Where a compact pass's parts lie ([`compact_len`]), as the pass parameters give
/// them (words); all zero for a pass in ring layout.
#[derive(Clone, Copy, Default)]
struct Compact {
    in_stride: u32,
    runs: u32,
    runs_at: u32,
    starts_at: u32,
}

/// Queues a run in a waiting lane (one header, then the payloads).
fn push_run(lane: &mut Records, first: &MessageHeader, run: RunPayloads<'_, '_>) {
    match run {
        RunPayloads::Each(list) => lane.push_run(first, list),
        RunPayloads::Fixed(bytes, len) => lane.push_fixed_run(first, bytes, len),
    }
}

/// A launched kernel driven by drain passes on a [`DrainTarget`].
pub struct DrainEngine<T: DrainTarget> {
    id: KernelId,
    name: String,
    slot_size: usize,
    capacity: usize,
    output_capacity: usize,
    serial: bool,
    state_words: u32,
    priority: u8,
    inputs: Vec<MessageInput>,
    sender_fills: bool,
    target: T,
    core: Weak<RuntimeCore>,
    lifecycle: AtomicLifecycle,
    events: KernelEvents,
    counters: KernelCounters,
    clock: HlcClock,
    host: Mutex<Host>,
    /// The passes in flight (taken after `host` or `k2k` where both are held).
    flight: Mutex<Flight>,
    /// Set by a completion that could not take the host lock to start the next pass:
    /// whoever holds it starts it on release ([`HostGuard`]).
    kick_owed: AtomicBool,
    /// Replies for the host. A lock of its own, so that receivers do not contend with
    /// senders; taken after `host` where both are held.
    replies: Mutex<Records>,
    /// Recent pass time (launch to completion), nanoseconds, smoothed: how long a
    /// receiver may expect to wait for a reply ([`KernelEngine::reply_wait`]).
    pass_ns: AtomicU64,
    /// Set while messages wait for room in `replies` (a pass is owed after a dequeue).
    starved: AtomicBool,
    /// Set once `Host::failed` is.
    failed: AtomicBool,
    /// K2K sends not delivered yet (destination full), in order.
    k2k: Mutex<VecDeque<Route>>,
    k2k_backlog: AtomicUsize,
    retrying: AtomicBool,
    me: Weak<DrainEngine<T>>,
}

/// Launch-time description of a drain kernel.
#[derive(Debug, Clone)]
pub struct DrainConfig {
    /// Kernel id.
    pub id: KernelId,
    /// Instance name.
    pub name: String,
    /// Ring capacity in slots (input and output, power of two).
    pub capacity: usize,
    /// Replies kept for the host before passes pause (backpressure).
    pub output_capacity: usize,
    /// Slot size in bytes.
    pub slot_size: usize,
    /// Whether the handler runs serially (one invocation per pass).
    pub serial: bool,
    /// Words of handler state.
    pub state_words: u32,
    /// The kernel's priority ([`LaunchOptions::priority`]): every output (reply, K2K
    /// send) carries it.
    pub priority: u8,
    /// The handler's declared inputs ([`GpuHandler::inputs`]): sends it cannot read are
    /// refused on the host.
    pub inputs: Vec<MessageInput>,
    /// Whether a sender waiting for room in a full lane starts the passes that
    /// completions would start from the lanes (the copy of their messages into their
    /// slots then runs on the sender's thread, not on the one finishing passes). The
    /// same messages in the same order either way; [`launch_engine`] sets it (on
    /// unless [`SENDER_FILLS_ENV`] is `0`).
    pub sender_fills: bool,
}

/// Environment variable: `0` makes [`launch_engine`] launch kernels without
/// [`DrainConfig::sender_fills`] (on otherwise, since the H100 pairs of 2026-11-27:
/// the batched echo through Vulkan at 1.27× the median of five pairs, BENCHMARKS.md). A switch for measuring which host thread
/// bounds a batched stream on a given machine (issue 17), not a tuning knob applications
/// should need.
pub const SENDER_FILLS_ENV: &str = "RINGKERNEL_DRAIN_SENDER_FILLS";

impl<T: DrainTarget> DrainEngine<T> {
    /// A kernel in state `Launched`: writes the ring headers and the control block.
    pub fn new(cfg: DrainConfig, target: T, core: &Arc<RuntimeCore>) -> Result<Arc<Self>> {
        ringkernel_core::queue::check_capacity(cfg.capacity)?;
        ringkernel_core::options::check_slot_size(cfg.slot_size)?;
        let need = cfg
            .capacity
            .checked_mul(cfg.slot_size)
            .and_then(|b| b.checked_add(std::mem::size_of::<QueueHeader>()))
            .ok_or_else(|| Error::invalid("ring size overflows"))?;
        if target.ring_len() < need {
            return Err(Error::invalid(format!(
                "drain target rings hold {} bytes, {need} needed for {} slots of {} bytes",
                target.ring_len(),
                cfg.capacity,
                cfg.slot_size
            )));
        }
        let qh = QueueHeader {
            capacity: cfg.capacity as u32,
            slot_size: cfg.slot_size as u32,
            mask: cfg.capacity as u32 - 1,
            ..Default::default()
        };
        let cb = ControlBlock {
            kernel_id: cfg.id.0,
            slot_size: cfg.slot_size as u32,
            input_capacity: cfg.capacity as u32,
            output_capacity: cfg.capacity as u32,
            max_drift_ms: ringkernel_core::hlc::DEFAULT_MAX_DRIFT_MS,
            state: LifecycleState::Launched as u32,
            ..Default::default()
        };
        // SAFETY: by the `DrainTarget` contract `input`/`output` address `ring_len`
        // bytes (checked above to hold at least the 128-byte header) and `control` 128
        // bytes; no pass is running yet, so the host is the only one touching them.
        // Unaligned writes make no alignment claim.
        unsafe {
            std::ptr::write_unaligned(target.input().cast::<QueueHeader>(), qh);
            std::ptr::write_unaligned(target.output().cast::<QueueHeader>(), qh);
            std::ptr::write_unaligned(target.control().cast::<ControlBlock>(), cb);
        }
        let engine = Arc::new_cyclic(|me| DrainEngine {
            id: cfg.id,
            name: cfg.name,
            slot_size: cfg.slot_size,
            capacity: cfg.capacity,
            output_capacity: cfg.output_capacity,
            serial: cfg.serial,
            state_words: cfg.state_words,
            priority: cfg.priority,
            inputs: cfg.inputs,
            sender_fills: cfg.sender_fills,
            target,
            core: Arc::downgrade(core),
            lifecycle: AtomicLifecycle::new(LifecycleState::Created),
            events: KernelEvents::default(),
            counters: KernelCounters::default(),
            clock: HlcClock::new(core.kernel_node_id(cfg.id)),
            host: Mutex::new(Host {
                lanes: Default::default(),
                tail: 0,
                dispatched: 0,
                draining: false,
                failed: None,
                sender_waiting: false,
            }),
            flight: Mutex::new(Flight::default()),
            kick_owed: AtomicBool::new(false),
            replies: Mutex::new(Records::default()),
            pass_ns: AtomicU64::new(0),
            starved: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            k2k: Mutex::new(VecDeque::new()),
            k2k_backlog: AtomicUsize::new(0),
            retrying: AtomicBool::new(false),
            me: me.clone(),
        });
        engine.lifecycle.transition(LifecycleState::Launched)?;
        Ok(engine)
    }

    /// The drain target (for backend-specific inspection).
    pub fn target(&self) -> &T {
        &self.target
    }

    /// The host lock when no other thread holds it (a poisoned lock is taken as it is,
    /// as `lock` does).
    fn try_host_lock(&self) -> Option<std::sync::MutexGuard<'_, Host>> {
        match self.host.try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// Takes the host lock (see [`HostGuard`]).
    fn host(&self) -> HostGuard<'_, T> {
        HostGuard {
            engine: self,
            guard: Some(lock(&self.host)),
        }
    }

    /// The kick a completion owes ([`kick_owed`](Self::kick_owed)): a sender waiting for
    /// room in a full lane starts the next pass itself when it wakes (see
    /// `Host::sender_waiting`), while passes are still in flight (their completions
    /// kick, should it not come back).
    fn kick_after_completion(&self, h: &mut Host) {
        let in_flight = lock(&self.flight).in_flight;
        if !(self.sender_fills && h.sender_waiting && in_flight > 0) {
            self.kick(h);
        }
    }

    /// [`Error::KernelTerminated`] once the kernel no longer takes messages, the
    /// failure once it has failed. Called with the host lock held.
    fn check_accepting(&self, h: &Host) -> Result<()> {
        if !self.lifecycle.get().accepts_messages() {
            return Err(Error::KernelTerminated(self.name.clone()));
        }
        if let Some(e) = &h.failed {
            return Err(e.clone());
        }
        Ok(())
    }

    /// Queues one message (payload size already checked) in its priority lane, or
    /// [`Error::QueueFull`]. Called with the host lock held.
    fn push_waiting(&self, h: &mut Host, header: &MessageHeader, payload: &[u8]) -> Result<()> {
        let lane = priority::lane(header.priority());
        if h.lanes[lane].len() >= self.capacity {
            return Err(Error::QueueFull {
                capacity: self.capacity,
            });
        }
        let mut hdr = *header;
        hdr.payload_len = payload.len() as u32;
        if hdr.flags & flags::CHECKSUM != 0 {
            hdr.checksum = ringkernel_core::message::fnv1a32(payload);
        }
        h.lanes[lane].push(&hdr, payload);
        Ok(())
    }

    /// After a dequeue of `n` replies: a pass owed may start; when there were none,
    /// the kernel's failure, if it has failed.
    fn dequeued(&self, n: usize) -> Result<usize> {
        if n > 0 {
            self.kick_if_starved();
        } else if self.failed.load(Ordering::Acquire) {
            if let Some(e) = &self.host().failed {
                return Err(e.clone());
            }
        }
        Ok(n)
    }

    /// After replies were taken: a pass paused for want of reply room may start.
    fn kick_if_starved(&self) {
        if self.starved.load(Ordering::SeqCst) {
            let mut h = self.host();
            self.kick(&mut h);
        }
    }

    /// Starts a pass if the kernel is active (or draining), fewer than the target's
    /// [`max_in_flight`](DrainTarget::max_in_flight) passes run, messages wait, and the
    /// host's reply queue has room for the outputs of every pass in flight. Called with
    /// the host lock held.
    fn kick(&self, h: &mut Host) {
        self.kick_with(h, &mut None);
    }

    /// [`kick`](Self::kick), with the messages of `direct` (if any) waiting after those
    /// of the lanes.
    fn kick_with(&self, h: &mut Host, direct: &mut Option<DirectRun<'_, '_>>) {
        // A batch that arrives at once may fill several passes.
        while self.kick_once(h, direct) {}
    }

    /// Most messages one pass takes: [`MAX_PASS`], and with several passes in flight a
    /// share of the ring, so that a burst (a `send_batch`) becomes passes that overlap
    /// instead of one that holds the whole ring.
    fn pass_limit(&self) -> u64 {
        let in_flight = self.target.max_in_flight().max(1) as u64;
        (self.capacity as u64 / in_flight).clamp(1, MAX_PASS)
    }

    /// One step of [`kick`](Self::kick): whether it launched a pass.
    fn kick_once(&self, h: &mut Host, direct: &mut Option<DirectRun<'_, '_>>) -> bool {
        let state = self.lifecycle.get();
        let backlog = self.k2k_backlog.load(Ordering::Acquire) > 0;
        let runs = !backlog
            && (state == LifecycleState::Active
                || (state == LifecycleState::Terminating && h.draining));
        let (in_flight, completed) = {
            let f = lock(&self.flight);
            (f.in_flight, f.completed)
        };
        if !runs || in_flight >= self.target.max_in_flight().max(1) || h.failed.is_some() {
            return false;
        }
        let waiting = (h.waiting() + direct.as_ref().map_or(0, DirectRun::left)) as u64;
        if waiting == 0 {
            return false;
        }
        // Slots of the passes in flight stay theirs until they complete.
        let busy = h.tail - completed;
        let ring_room = self.capacity as u64 - busy;
        // While a pass runs, a further one must be worth it (else the completion,
        // which starts the next pass anyway, takes these messages).
        // (Never more than a pass may take: with many passes in flight over a small
        // ring, a quarter of the ring is more than one pass's share.)
        let min_batch = if in_flight > 0 {
            OVERLAP_MIN_BATCH
                .min((self.capacity as u64 / 4).max(1))
                .min(self.pass_limit())
        } else {
            1
        };
        if waiting < min_batch || ring_room < min_batch {
            return false;
        }
        let room = {
            let replies = lock(&self.replies);
            // Every message in flight may still add a reply.
            let room = (self.output_capacity as u64).saturating_sub(replies.len() as u64 + busy);
            // Set inside the replies lock: a dequeue after this sees it.
            self.starved.store(room == 0, Ordering::SeqCst);
            room
        };
        let count = waiting.min(room).min(ring_room).min(self.pass_limit());
        if count < min_batch {
            return false;
        }
        let first = h.dispatched;
        let mut correlations = Vec::new();
        let compact = self
            .fill_ring(h, count, direct, &mut correlations)
            .unwrap_or_default();
        let count = h.tail - first;
        // One receive timestamp per message of the batch (the drain template adds j).
        let hlc = self.clock.reserve(count as u32).packed();
        let p = params::Drain {
            kernel_id: self.id.0,
            count: count as u32,
            first_lo: first as u32,
            first_hi: (first >> 32) as u32,
            hlc_lo: hlc as u32,
            hlc_hi: (hlc >> 32) as u32,
            slot_words: (self.slot_size / 4) as u32,
            mask: self.capacity as u32 - 1,
            state_words: self.state_words,
            node_lo: self.clock.node_id() as u32,
            node_hi: (self.clock.node_id() >> 32) as u32,
            in_stride: compact.in_stride,
            runs: compact.runs,
            runs_at: compact.runs_at,
            starts_at: compact.starts_at,
            _pad: 0,
        };
        // The outputs' timestamps and ids, taken now (after the requests' clocks were
        // merged in `fill_ring` and after their receive timestamps), in launch order.
        let pass = PassInfo {
            first,
            count,
            started: Instant::now(),
            stamps: self.clock.reserve(u32::try_from(count).unwrap_or(u32::MAX)),
            ids: self.core.upgrade().map(|c| c.reserve_message_ids(count)),
            correlations,
        };
        lock(&self.flight).in_flight += 1;
        h.dispatched = first + count;
        let me = self.me.clone();
        let done: PassDone = Box::new(move |r| {
            if let Some(e) = me.upgrade() {
                e.complete(pass, r);
            }
        });
        if let Err(e) = self.target.launch(p, done) {
            lock(&self.flight).in_flight -= 1;
            h.dispatched = first;
            tracing::error!(kernel = %self.name, error = %e, "drain pass could not be launched");
            self.fail(h, e);
            self.events.notify_all();
            return false;
        }
        true
    }

    /// Moves `count` waiting messages into the free input slots at `tail`, highest
    /// lane first and FIFO within a lane, then those of `direct` (which waits only
    /// while the lanes are empty): this is where priority ordering happens, so
    /// a pass's slots, a serial handler's order and the order of the replies all
    /// follow it. Each message's header and payload are written into its slot once:
    /// into the input ring, or where the target stages the pass's slots
    /// ([`DrainTarget::stage_input`]); or, in a compact pass
    /// ([`DrainTarget::stage_compact`]), its payload at its stride and one header for
    /// each piece of a run (and for each message refused or of another size), whose
    /// table the returned [`Compact`] locates. The requests' clocks are merged into the
    /// kernel's clock once per pass, with the latest of them; a request too far ahead
    /// of the kernel's physical clock (checked on the way, against one clock reading)
    /// is refused, as the CPU backend does: its header gets magic 0, so the drain
    /// template skips it (counted at completion). Each piece's first batch index and
    /// correlation id go to `correlations` (see `PassInfo`). Called with the host lock
    /// held; the slots `[tail, tail + count)` belong to no pass in flight (`kick` checks
    /// the room).
    fn fill_ring(
        &self,
        h: &mut Host,
        count: u64,
        direct: &mut Option<DirectRun<'_, '_>>,
        correlations: &mut Vec<(u64, u64)>,
    ) -> Option<Compact> {
        let input = self.target.input();
        // Where the slots go: a compact pass's buffer, a staged buffer in slot layout,
        // or the input ring.
        let compact = self.target.stage_compact(count as usize);
        let staged = match compact {
            Some(_) => None,
            None => self.target.stage_input(count as usize),
        };
        // A compact pass: payload stride, run headers and run starts (`compact_len`).
        let stride = self.slot_size - HEADER_SIZE;
        let runs_at = count as usize * stride;
        let starts_at = count as usize * self.slot_size;
        // Run entries written so far, and the payload length of the last one.
        let mut runs = 0usize;
        let mut run_len = usize::MAX;
        let pt = self.clock.physical_ms();
        let too_far = pt.saturating_add(self.clock.max_drift_ms());
        // The latest request timestamp of the pass (shared by the two closures below).
        let latest: std::cell::Cell<Option<HlcTimestamp>> = std::cell::Cell::new(None);
        let Host { lanes, tail, .. } = h;
        let mut left = count as usize;
        let mut j = 0usize;
        // Writes message `i` of the run stamped from `first` (its header
        // `first.nth_of_run(i, payload.len())`) into the next slot; with `check`,
        // refuses it when its timestamp is too far ahead and keeps the latest. `fresh`:
        // the first message of a piece handed over (in a compact pass, where a run
        // entry starts; so does a message of another size, and every checked one).
        let mut put = |first: &MessageHeader, i: u64, payload: &[u8], check: bool, fresh: bool| {
            if fresh {
                correlations.push((j as u64, first.correlation_id.wrapping_add(i)));
            }
            // Where the message's header went: its slot, or its own run entry in a
            // compact pass (`None`: it joined the entry of the run before it, unchecked).
            let header_at = if let Some(base) = compact {
                if j + PREFETCH_SLOTS < count as usize {
                    prefetch(
                        base.wrapping_add((j + PREFETCH_SLOTS) * stride),
                        payload.len(),
                    );
                }
                // SAFETY: `stage_compact` returned `compact_len(count, slot_size)`
                // writable bytes: payload `j < count` lies below `runs_at` (the payload
                // fits `stride`, checked in `try_enqueue*`), entry `runs < count` (at
                // most one a message) below `starts_at`, and its start below
                // `starts_at + 4 · count`. Nothing else addresses them; the header is
                // written in place (see `write_nth_of_run`). A checked message always
                // gets an entry of its own, so a refusal touches it alone.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        payload.as_ptr(),
                        base.add(j * stride),
                        payload.len(),
                    );
                    (fresh || check || payload.len() != run_len).then(|| {
                        let entry = base.add(runs_at + runs * HEADER_SIZE);
                        first.write_nth_of_run(entry, i, payload.len());
                        std::ptr::write_unaligned(
                            base.add(starts_at + runs * 4).cast::<u32>(),
                            j as u32,
                        );
                        runs += 1;
                        run_len = payload.len();
                        entry
                    })
                }
            } else {
                // The slot PREFETCH_SLOTS ahead (of this pass), so its lines are in the
                // cache when it is written (see `prefetch`).
                if j + PREFETCH_SLOTS < count as usize {
                    let ahead = match staged {
                        Some(base) => base.wrapping_add((j + PREFETCH_SLOTS) * self.slot_size),
                        None => input.wrapping_add(slot_offset(
                            *tail + PREFETCH_SLOTS as u64,
                            self.capacity,
                            self.slot_size,
                        )),
                    };
                    prefetch(ahead, HEADER_SIZE + payload.len());
                }
                let slot = match staged {
                    // SAFETY: `stage_input` returned `count · slot_size` writable bytes
                    // and `j < count` (the lanes' `pop_runs_with` and the direct run below
                    // hand over at most `left` in all).
                    Some(base) => unsafe { base.add(j * self.slot_size) },
                    // SAFETY: the slot at `tail` belongs to no pass in flight (`kick`
                    // hands out at most the free slots, so they are distinct and inside
                    // the ring) and the device reads input slots only during their own
                    // pass.
                    None => unsafe { input.add(slot_offset(*tail, self.capacity, self.slot_size)) },
                };
                // SAFETY: `slot` addresses `slot_size` writable bytes (above), apart from
                // `first` and `payload` (host-side records and the caller's buffers), and
                // the header and payload fit them (the payload was checked in
                // `try_enqueue*`). The header is written in place, not built and copied
                // (see `write_nth_of_run`).
                unsafe {
                    first.write_nth_of_run(slot, i, payload.len());
                    std::ptr::copy_nonoverlapping(
                        payload.as_ptr(),
                        slot.add(HEADER_SIZE),
                        payload.len(),
                    );
                }
                Some(slot)
            };
            if let Some(at) = header_at.filter(|_| check) {
                let ts = first.nth_hlc(i);
                if ts.physical_ms() > too_far {
                    let header = first.nth_of_run(i, payload.len());
                    // SAFETY: as above: the message's header was just written at `at`.
                    unsafe { self.refuse(&header, at, pt) };
                } else if latest.get().is_none_or(|l| ts > l) {
                    latest.set(Some(ts));
                }
            }
            *tail += 1;
            j += 1;
        };
        // The clock check of a piece stamped as one run, whose timestamps rise: when
        // its last (its latest) is not too far ahead, none is, and that one is kept
        // here; else its messages are checked one by one (`put`). Returns whether they
        // must be.
        let one_by_one = |last: HlcTimestamp| {
            if last.physical_ms() > too_far {
                return true;
            }
            if latest.get().is_none_or(|l| last > l) {
                latest.set(Some(last));
            }
            false
        };
        for lane in lanes.iter_mut().rev() {
            if left == 0 {
                break;
            }
            left -= lane.pop_runs_with(left, |first, payloads, n| {
                let len = first.payload_len as usize;
                let check = one_by_one(first.nth_of_run(n as u64 - 1, len).hlc());
                for i in 0..n {
                    let p = run_payload(payloads, len, i);
                    put(first, i as u64, p, check, i == 0);
                }
                (n, true)
            });
        }
        if let Some(d) = direct.as_mut() {
            let n = left.min(d.left());
            if n > 0 {
                let check = one_by_one(d.first.nth_of_run((d.taken + n - 1) as u64, 0).hlc());
                for i in d.taken..d.taken + n {
                    put(&d.first, i as u64, d.payloads.get(i), check, i == d.taken);
                }
            }
            d.taken += n;
        }
        if let Some(l) = latest.get() {
            // Within the drift bound of `pt` (checked above), so this merge succeeds.
            if let Err(e) = self.clock.update_at(&l, pt) {
                tracing::warn!(kernel = %self.name, error = %e, "request timestamps not merged into the kernel clock");
            }
        }
        // SAFETY: the ring's first 8 bytes are its queue header's tail and `input_tail`
        // lies in the 128-byte control block; the drain template reads neither (it
        // takes its slots from the pass parameters).
        unsafe {
            std::ptr::write_unaligned(self.target.input().cast::<u64>(), h.tail);
            let tail_at = std::mem::offset_of!(ControlBlock, input_tail);
            std::ptr::write_unaligned(self.target.control().add(tail_at).cast::<u64>(), h.tail);
        }
        compact.map(|_| Compact {
            in_stride: (stride / 4) as u32,
            runs: runs as u32,
            runs_at: (runs_at / 4) as u32,
            starts_at: (starts_at / 4) as u32,
        })
    }

    /// Refuses the request `hdr` just written into the input slot at `slot`: its
    /// timestamp is too far ahead of the kernel's physical clock `pt` (see
    /// `fill_ring`). Its magic becomes 0, so the drain template skips it.
    ///
    /// # Safety
    ///
    /// `slot` addresses the slot's header, writable (as `fill_ring` has it).
    #[cold]
    unsafe fn refuse(&self, hdr: &MessageHeader, slot: *mut u8, pt: u64) {
        let drift_ms = hdr.hlc().physical_ms().saturating_sub(pt);
        tracing::warn!(kernel = %self.name, message_id = hdr.message_id, drift_ms, "request timestamp too far ahead: message refused");
        let magic = std::mem::offset_of!(MessageHeader, magic);
        // SAFETY: the magic field lies in the slot's header (the caller's contract).
        unsafe { std::ptr::write_unaligned(slot.add(magic).cast::<u32>(), 0) };
    }

    /// Stops the kernel for good with `e` (reported by every later call).
    fn fail(&self, h: &mut Host, e: Error) {
        h.failed = Some(e);
        self.failed.store(true, Ordering::Release);
    }

    /// Counts and logs one dropped message.
    fn drop_message(&self, reason: DropReason) {
        self.counters.dropped.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(kernel = %self.name, %reason, "message dropped");
    }

    /// The `slot_size` bytes of the output slot of the pass's `j`-th message (queue
    /// index `first + j`), or `None` when `out` does not cover it (a target error).
    fn output_slot<'a>(&'a self, out: &PassOutputs<'a>, first: u64, j: u64) -> Option<&'a [u8]> {
        match out {
            // SAFETY: the pass over this slot has completed, so the device no longer
            // writes it, and the next pass over the same slot cannot start before
            // `completed` advances past it (under the host lock, after the caller is
            // done with the slice); `off + slot_size` lies inside the ring.
            PassOutputs::InRing => Some(unsafe {
                let off = slot_offset(first + j, self.capacity, self.slot_size);
                std::slice::from_raw_parts(self.target.output().add(off), self.slot_size)
            }),
            PassOutputs::Slots(bytes) => {
                let at = usize::try_from(j).ok()?.checked_mul(self.slot_size)?;
                bytes.get(at..at.checked_add(self.slot_size)?)
            }
        }
    }

    /// Reads the outputs of one completed pass: replies are stamped with the timestamps
    /// and ids reserved for the pass at launch and built into a queue of their own
    /// (one record each), K2K sends collected, drops and latency counted. Runs on the
    /// thread that completes the pass, without the host lock, so the passes in flight
    /// are read in parallel; [`apply_pass`](Self::apply_pass) then queues the result in
    /// launch order. The pass's slots stay its own meanwhile: until `completed`
    /// advances past them (in `apply_pass`), no pass takes them (`kick` counts them as
    /// busy).
    fn build_pass(
        &self,
        pass: &PassInfo,
        elapsed: std::time::Duration,
        out: PassOutputs<'_>,
    ) -> Result<Built> {
        let PassInfo {
            first,
            count,
            stamps,
            ids,
            ref correlations,
            ..
        } = *pass;
        // The correlation ids' piece that output `i` belongs to (a cursor: `i` rises).
        let mut piece = 0usize;
        // The last reply appended: type, size, flags, destination, correlation id and
        // its place among the outputs (see `push_next` below).
        let mut last: Option<(u32, usize, u32, u32, u64, u64)> = None;
        let mut replies = lock(&self.replies).builder(count as usize * self.slot_size);
        let (mut processed, mut handled) = (0u64, 0u64);
        let mut routes: Vec<Route> = Vec::new();
        let mut stamped = 0u64;
        for i in 0..count {
            // A later slot of this pass, so that its lines arrive while this one is read
            // (the reads of a pass's outputs otherwise wait for each slot in turn).
            if i + (PREFETCH_SLOTS as u64) < count {
                if let Some(ahead) = self.output_slot(&out, first, i + PREFETCH_SLOTS as u64) {
                    prefetch(ahead.as_ptr(), ahead.len());
                }
            }
            let Some(slot) = self.output_slot(&out, first, i) else {
                return Err(Error::Device(format!(
                    "the outputs of a drain pass of {} do not cover slot {}",
                    self.name,
                    first + i
                )));
            };
            let (flags, type_id, len, dest) = match drain::Output::read(slot) {
                drain::Output::Message {
                    flags,
                    type_id,
                    payload_len,
                    dest_kernel,
                } => (flags, type_id, payload_len as usize, dest_kernel),
                drain::Output::None { status: 0 } => {
                    // Handled, no output.
                    handled += 1;
                    processed += 1;
                    continue;
                }
                drain::Output::None {
                    status: drain::ERR_INVALID_REQUEST,
                } => {
                    self.drop_message(DropReason::InvalidRequest);
                    continue;
                }
                drain::Output::None { status } => {
                    handled += 1;
                    self.drop_message(DropReason::Refused(status));
                    continue;
                }
            };
            handled += 1;
            if (flags != flags::REPLY && flags != flags::K2K)
                || check_payload_fits(len, self.slot_size).is_err()
            {
                self.drop_message(DropReason::CorruptOutput);
                continue;
            }
            let payload = &slot[HEADER_SIZE..HEADER_SIZE + len];
            while correlations.get(piece + 1).is_some_and(|&(j, _)| j <= i) {
                piece += 1;
            }
            let correlation = correlations
                .get(piece)
                .map_or(0, |&(j, c)| c.wrapping_add(i - j));
            let s = stamped;
            stamped += 1;
            // A reply whose header is the next of the last reply's (ids, timestamps and
            // correlation ids one further, the rest the same) joins its run without a
            // header built (a header written field by field and read back at once, to
            // compare, waits for those stores: ~5 ns a message on the H200's host).
            let key = (type_id, len, flags, dest, correlation, s);
            // The device wrote what it decided (see "Outputs" in the drain template's
            // docs); the rest of the header is the host's: the id, the timestamp, the
            // request's correlation id.
            let header = || {
                let mut hdr = MessageHeader::new(type_id, len);
                hdr.flags = flags;
                hdr.dest_kernel = dest;
                hdr.source_kernel = self.id.0;
                hdr.correlation_id = correlation;
                hdr.message_id = ids.map_or(0, |ids| ids + s);
                hdr.set_hlc(HlcTimestamp::from_parts(stamps.packed() + s, stamps.node()));
                hdr.set_priority(self.priority);
                hdr
            };
            if flags == flags::REPLY
                && ids.is_some()
                && last.is_some_and(|(t, l, f, d, c, ls): (u32, usize, u32, u32, u64, u64)| {
                    (t, l, f, d) == (type_id, len, flags, dest)
                        && c.wrapping_add(1) == correlation
                        && ls + 1 == s
                })
                && replies.push_next(payload, header)
            {
                processed += 1;
                last = Some(key);
                continue;
            }
            let hdr = header();
            if flags == flags::K2K {
                // Processed and emitted once delivered (see `route`).
                let dest = KernelTarget::Id(KernelId(hdr.dest_kernel));
                routes.push((dest, hdr, payload.to_vec()));
            } else {
                processed += 1;
                replies.push(&hdr, payload);
                last = Some(key);
            }
        }
        // A pass cannot time its messages one by one: each message that reached the
        // handler gets the pass time shared over the pass.
        let per = u64::try_from(elapsed.as_nanos() / u128::from(count.max(1))).unwrap_or(u64::MAX);
        self.counters.latency.record_n(per, handled);
        Ok(Built {
            replies,
            routes,
            processed,
        })
    }

    /// Queues the outputs of the pass over `[first, first + count)`, the next in launch
    /// order, and marks it complete (a pass that failed stops the kernel). Both queues
    /// are extended in the step that marks the pass complete, so a later pass applied
    /// on another thread queues after this one.
    fn apply_pass(&self, first: u64, count: u64, built: Result<Built>) {
        let built = match built {
            Ok(b) => b,
            Err(e) => return self.fail_pass(first, count, e),
        };
        // The K2K queue first: `route` holds it while it delivers, which may take a
        // destination's host lock (this kernel's too), so it is never taken inside the
        // host lock. Not the host lock: a sender may hold it for a whole fill.
        let mut k2k = lock(&self.k2k);
        let mut f = lock(&self.flight);
        f.in_flight -= 1;
        f.completed = first + count;
        // (`terminate` changes the state under this lock too.)
        if self.lifecycle.get() == LifecycleState::Terminating {
            f.drained_after_terminate += count;
        }
        self.counters
            .emitted
            .fetch_add(built.replies.len() as u64, Ordering::Relaxed);
        self.counters
            .processed
            .fetch_add(built.processed, Ordering::Relaxed);
        lock(&self.replies).append(built.replies);
        if !built.routes.is_empty() {
            k2k.extend(built.routes);
            self.k2k_backlog.store(k2k.len(), Ordering::Release);
        }
    }

    /// A pass that failed: the kernel stops with `e`.
    fn fail_pass(&self, first: u64, count: u64, e: Error) {
        tracing::error!(kernel = %self.name, error = %e, "drain pass failed");
        let mut h = self.host();
        {
            let mut f = lock(&self.flight);
            f.in_flight -= 1;
            f.completed = first + count;
        }
        self.fail(&mut h, e);
        drop(h);
        self.events.notify_all();
    }

    /// Completion of `pass`. Its outputs are read at once, on the completing thread
    /// (so the passes in flight are read in parallel where the target completes them
    /// on several threads), and queued in launch order: a pass read before an earlier
    /// one waits in `Flight::early` and is queued right after it, by the thread that
    /// queues that one.
    fn complete(&self, pass: PassInfo, result: Result<PassOutputs<'_>>) {
        let elapsed = pass.started.elapsed();
        // Smoothed pass time (1/8 of the new sample), for `reply_wait`.
        let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        let old = self.pass_ns.load(Ordering::Relaxed);
        let new = if old == 0 { ns } else { old - old / 8 + ns / 8 };
        self.pass_ns.store(new, Ordering::Relaxed);
        let built = result.and_then(|out| self.build_pass(&pass, elapsed, out));
        {
            let mut f = lock(&self.flight);
            if pass.first != f.completed {
                f.early.push((pass.first, pass.count, built));
                return;
            }
        }
        self.apply_pass(pass.first, pass.count, built);
        loop {
            // A completion that arrives meanwhile either sees `completed` at its
            // `first` (and applies itself: this pass's replies are queued by then) or
            // was parked in `early` before `completed` advanced and is found here.
            let (first, count, built) = {
                let mut f = lock(&self.flight);
                let Some(i) = f.early.iter().position(|e| e.0 == f.completed) else {
                    break;
                };
                f.early.swap_remove(i)
            };
            self.apply_pass(first, count, built);
        }
        // Route K2K sends without holding the host lock (the destination may be us).
        let delivered_all = self.route();
        // The next pass: started here when the host lock is free, else by the thread
        // holding it, when it releases it (`HostGuard`), so that this thread goes on
        // finishing passes instead of waiting for a sender's fill.
        self.kick_owed.store(true, Ordering::SeqCst);
        if let Some(g) = self.try_host_lock() {
            // Released at once: the release starts the pass owed.
            drop(HostGuard {
                engine: self,
                guard: Some(g),
            });
        }
        if !delivered_all {
            self.retry_k2k_later();
        }
        self.events.output.notify(usize::MAX);
        self.events.input_space.notify(usize::MAX);
        self.events.state.notify(usize::MAX);
    }

    /// Delivers the K2K queue (the sends of finished passes, queued by `apply_pass` in
    /// pass order, whichever thread finished them) in order, stopping at the first
    /// full destination (so messages keep their order). Returns whether nothing is
    /// left. While a backlog exists no new pass starts (backpressure, as a full output
    /// queue does).
    fn route(&self) -> bool {
        let mut q = lock(&self.k2k);
        if let Some(core) = self.core.upgrade() {
            while let Some((target, hdr, payload)) = q.front() {
                match core.deliver(target, *hdr, payload) {
                    Ok(K2kReceipt::QueueFull) => break,
                    Ok(K2kReceipt::Delivered) => {
                        self.counters.processed.fetch_add(1, Ordering::Relaxed);
                        self.counters.emitted.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(K2kReceipt::NotFound) | Err(_) => {
                        tracing::warn!(kernel = %self.name, ?target, "K2K destination gone");
                        self.drop_message(DropReason::DestinationGone);
                    }
                }
                q.pop_front();
            }
        } else {
            for _ in q.drain(..) {
                self.drop_message(DropReason::DestinationGone);
            }
        }
        self.k2k_backlog.store(q.len(), Ordering::Release);
        q.is_empty()
    }

    /// K2K sends to a full destination are retried from one helper thread (a plain OS
    /// thread, never an executor thread) with a growing back-off, until the backlog is
    /// delivered or the kernel is gone; then passes resume.
    fn retry_k2k_later(&self) {
        if self.retrying.swap(true, Ordering::AcqRel) {
            return;
        }
        let me = self.me.clone();
        std::thread::spawn(move || {
            let mut wait = std::time::Duration::from_micros(50);
            loop {
                std::thread::sleep(wait);
                wait = (wait * 2).min(std::time::Duration::from_millis(10));
                let Some(e) = me.upgrade() else { return };
                if e.route() {
                    e.retrying.store(false, Ordering::Release);
                    let mut h = e.host();
                    e.kick(&mut h);
                    drop(h);
                    e.events.notify_all();
                    // A backlog that formed after the flag was taken needs a new helper.
                    if e.k2k_backlog.load(Ordering::Acquire) > 0 {
                        e.retry_k2k_later();
                    }
                    return;
                }
            }
        });
    }

    /// Mirrors `state` into the control block. Called with the host lock held, so a
    /// target that copies the control block in `launch` (also under that lock) sees
    /// whole values.
    fn sync_state_to_control(&self, _held: &mut Host, state: LifecycleState) {
        // SAFETY: `state` lies in the worker line of the 128-byte control block; the
        // drain template never reads or writes it, so the host writing it cannot race
        // a pass.
        unsafe {
            let p = self
                .target
                .control()
                .add(std::mem::offset_of!(ControlBlock, state))
                .cast::<u32>();
            std::ptr::write_unaligned(p, state as u32);
        }
    }

    /// `try_enqueue_run` and `try_enqueue_fixed_run`: one host lock and one pass kick
    /// for the whole run.
    fn enqueue_run(&self, first: &MessageHeader, payloads: RunPayloads<'_, '_>) -> Result<usize> {
        let mut h = self.host();
        self.check_accepting(&h)?;
        // A pass a completion left to this sender (`Host::sender_waiting`): started
        // before the run is queued, so it takes the messages waiting ahead of it and
        // makes room in the lane.
        if self.sender_fills {
            h.sender_waiting = false;
            if h.waiting() > 0 {
                self.kick(&mut h);
            }
        }
        let lane = priority::lane(first.priority());
        let room = self.capacity - h.lanes[lane].len().min(self.capacity);
        // The messages that fit the lane and a slot, from the front.
        let mut taken = 0;
        match payloads {
            RunPayloads::Fixed(_, len) => {
                check_payload_fits(len, self.slot_size)?;
                taken = payloads.count().min(room);
            }
            RunPayloads::Each(list) => {
                for p in list.iter().take(room) {
                    if let Err(e) = check_payload_fits(p.len(), self.slot_size) {
                        if taken == 0 {
                            return Err(e);
                        }
                        break;
                    }
                    taken += 1;
                }
            }
        }
        if taken == 0 && payloads.count() > 0 {
            // The caller may wait for room and come back (see `Host::sender_waiting`).
            h.sender_waiting = self.sender_fills && room == 0;
            return Err(Error::QueueFull {
                capacity: self.capacity,
            });
        }
        // Counted before any of them can reach a pass (and be processed).
        self.counters
            .received
            .fetch_add(taken as u64, Ordering::Relaxed);
        let run = payloads.part(0, taken);
        let direct = first.flags & flags::CHECKSUM == 0 && first.is_valid() && h.waiting() == 0;
        if direct && taken > 0 {
            // Nothing waits: the passes that can start now take the run from `run`
            // itself, and only the rest is queued (in order: it waits alone).
            let mut direct = Some(DirectRun {
                first: *first,
                payloads: run,
                taken: 0,
            });
            self.kick_with(&mut h, &mut direct);
            let done = direct.map_or(0, |d| d.taken);
            if done < taken {
                let rest = first.nth_of_run(done as u64, run.len_at(done));
                push_run(&mut h.lanes[lane], &rest, run.part(done, taken - done));
            }
        } else if first.flags & flags::CHECKSUM != 0 || !first.is_valid() {
            // Headers of their own (a checksum each; an invalid header kept as it is).
            for i in 0..taken {
                let p = run.get(i);
                let mut hdr = first.nth_of_run(i as u64, p.len());
                if hdr.flags & flags::CHECKSUM != 0 {
                    hdr.checksum = ringkernel_core::message::fnv1a32(p);
                }
                h.lanes[lane].push(&hdr, p);
            }
        } else {
            push_run(&mut h.lanes[lane], first, run);
        }
        self.kick(&mut h);
        Ok(taken)
    }
}

impl<T: DrainTarget> KernelEngine for DrainEngine<T> {
    fn id(&self) -> KernelId {
        self.id
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn state(&self) -> LifecycleState {
        self.lifecycle.get()
    }
    fn slot_size(&self) -> usize {
        self.slot_size
    }
    fn input_capacity(&self) -> usize {
        self.capacity
    }

    fn try_enqueue(&self, header: &MessageHeader, payload: &[u8]) -> Result<()> {
        check_payload_fits(payload.len(), self.slot_size)?;
        let mut h = self.host();
        self.check_accepting(&h)?;
        self.push_waiting(&mut h, header, payload)?;
        self.counters.received.fetch_add(1, Ordering::Relaxed);
        self.kick(&mut h);
        Ok(())
    }

    /// One host lock and one pass kick for the whole batch.
    fn try_enqueue_batch(&self, batch: &[(MessageHeader, &[u8])]) -> Result<usize> {
        let mut h = self.host();
        self.check_accepting(&h)?;
        let mut taken = 0;
        for (header, payload) in batch {
            let r = check_payload_fits(payload.len(), self.slot_size)
                .and_then(|()| self.push_waiting(&mut h, header, payload));
            if let Err(e) = r {
                if taken == 0 {
                    return Err(e);
                }
                break;
            }
            taken += 1;
        }
        self.counters
            .received
            .fetch_add(taken as u64, Ordering::Relaxed);
        self.kick(&mut h);
        Ok(taken)
    }

    /// One host lock and one pass kick for the whole run, kept in the waiting lane as a
    /// run ([`Records::push_run`]: one header, then the payloads).
    fn try_enqueue_run(&self, first: &MessageHeader, payloads: &[Payload<'_>]) -> Result<usize> {
        self.enqueue_run(first, RunPayloads::Each(payloads))
    }

    /// As `try_enqueue_run`, with one payload size check for the run and, where the
    /// run waits, one copy of its bytes ([`Records::push_fixed_run`]).
    fn try_enqueue_fixed_run(
        &self,
        first: &MessageHeader,
        bytes: &[u8],
        len: usize,
    ) -> Result<usize> {
        check_fixed_run(bytes, len)?;
        self.enqueue_run(first, RunPayloads::Fixed(bytes, len))
    }

    fn try_dequeue(&self) -> Result<Option<Envelope>> {
        let mut env = None;
        lock(&self.replies).pop_with(1, |header, payload| {
            env = Some(Envelope {
                header: *header,
                payload: payload.to_vec(),
            });
            true
        });
        if env.is_some() {
            self.kick_if_starved();
        } else if self.failed.load(Ordering::Acquire) {
            if let Some(e) = &self.host().failed {
                return Err(e.clone());
            }
        }
        Ok(env)
    }

    /// One lock of the reply queue for the whole batch.
    fn try_dequeue_batch(&self, out: &mut Vec<Envelope>, max: usize) -> Result<usize> {
        self.try_dequeue_batch_with(max, &mut |header, payload| {
            out.push(Envelope {
                header: *header,
                payload: payload.to_vec(),
            });
            true
        })
    }

    /// One lock of the reply queue for the whole batch; the replies are read in place.
    fn try_dequeue_batch_with(
        &self,
        max: usize,
        take: &mut dyn FnMut(&MessageHeader, &[u8]) -> bool,
    ) -> Result<usize> {
        let n = lock(&self.replies).pop_with(max, take);
        self.dequeued(n)
    }

    /// One lock of the reply queue for the whole batch; a run of replies (a pass's,
    /// see `build_pass`) is handed over as one piece, read in place.
    fn try_dequeue_runs_with(
        &self,
        max: usize,
        take: &mut ringkernel_core::runtime::TakeRun<'_>,
    ) -> Result<usize> {
        let n = lock(&self.replies).pop_runs_with(max, take);
        self.dequeued(n)
    }

    fn output_depth(&self) -> usize {
        lock(&self.replies).len()
    }

    fn activate(&self) -> Result<()> {
        let mut h = self.host();
        self.lifecycle.transition(LifecycleState::Active)?;
        self.sync_state_to_control(&mut h, LifecycleState::Active);
        self.kick(&mut h);
        drop(h);
        self.events.state.notify(usize::MAX);
        Ok(())
    }

    fn deactivate(&self) -> Result<()> {
        let mut h = self.host();
        self.lifecycle.transition(LifecycleState::Deactivated)?;
        self.sync_state_to_control(&mut h, LifecycleState::Deactivated);
        drop(h);
        self.events.state.notify(usize::MAX);
        Ok(())
    }

    fn terminate(&self) -> BoxFuture<'_, Result<TerminateReport>> {
        Box::pin(async move {
            let prev = {
                // Under the host lock, so a completing pass sees state and flag together.
                let mut h = self.host();
                let _flight = lock(&self.flight);
                let prev = self.lifecycle.transition(LifecycleState::Terminating)?;
                h.draining = prev == LifecycleState::Active;
                self.sync_state_to_control(&mut h, LifecycleState::Terminating);
                prev
            };
            self.events.notify_all();
            let mut undelivered = Vec::new();
            if prev == LifecycleState::Active {
                // Drain: wait (asynchronously) until every queued message was processed.
                loop {
                    let listener = self.events.state.listen();
                    {
                        let mut h = self.host();
                        self.kick(&mut h);
                        let routed = self.k2k_backlog.load(Ordering::Acquire) == 0;
                        let (in_flight, completed) = {
                            let f = lock(&self.flight);
                            (f.in_flight, f.completed)
                        };
                        let empty = completed == h.tail && h.waiting() == 0;
                        if h.failed.is_some() || (empty && in_flight == 0 && routed) {
                            break;
                        }
                    }
                    listener.await;
                }
            } else {
                // Not active: let a pass started before the deactivation finish, then
                // hand the messages no pass has taken back.
                loop {
                    let listener = self.events.state.listen();
                    if lock(&self.flight).in_flight == 0 {
                        break;
                    }
                    listener.await;
                }
                // In the order a pass would have taken them: highest lane first.
                let mut h = self.host();
                h.take_all_waiting(|header, payload| {
                    if header.is_valid() {
                        undelivered.push(Envelope {
                            header: *header,
                            payload: payload.to_vec(),
                        });
                    } else {
                        self.drop_message(DropReason::InvalidRequest);
                    }
                });
            }
            let mut h = self.host();
            self.lifecycle.transition(LifecycleState::Terminated)?;
            self.sync_state_to_control(&mut h, LifecycleState::Terminated);
            let report = TerminateReport {
                drained: lock(&self.flight).drained_after_terminate,
                undelivered,
                replies_waiting: self.output_depth(),
            };
            let failed = h.failed.clone();
            drop(h);
            self.events.notify_all();
            match failed {
                Some(e) => Err(e),
                None => Ok(report),
            }
        })
    }

    fn accepts(&self, header: &MessageHeader) -> Result<()> {
        check_accepts(&self.name, &self.inputs, header)
    }

    fn events(&self) -> &KernelEvents {
        &self.events
    }

    fn progress(&self) -> bool {
        self.target.progress()
    }

    /// About twice the recent pass time (launch to completion), within
    /// [`REPLY_WAIT_MIN`]..=[`REPLY_WAIT_MAX`].
    fn reply_wait(&self) -> Option<std::time::Duration> {
        let ns = self.pass_ns.load(Ordering::Relaxed).saturating_mul(2);
        Some(std::time::Duration::from_nanos(ns).clamp(REPLY_WAIT_MIN, REPLY_WAIT_MAX))
    }

    fn metrics(&self) -> KernelMetrics {
        let h = self.host();
        let depth = (h.tail - lock(&self.flight).completed) as usize + h.waiting();
        drop(h);
        let out = self.output_depth();
        self.counters
            .snapshot(self.id, &self.name, self.lifecycle.get(), depth, out)
    }
}

/// Launches a drain kernel on `core`: checks the options, reserves the instance name
/// (the handler name unless `opts.name` says otherwise), builds the target with
/// `make_target(id)`, makes the engine reachable and activates it if asked. The name is
/// released again if anything fails. Shared by the Metal and WebGPU runtimes
/// and the Linux tests, which run it with a CPU stand-in target.
pub fn launch_engine<T: DrainTarget>(
    core: &Arc<RuntimeCore>,
    handler: &str,
    opts: &LaunchOptions,
    serial: bool,
    state_bytes: usize,
    make_target: impl FnOnce(KernelId) -> Result<T>,
) -> Result<KernelHandle> {
    opts.validate()?;
    let name = opts.name.clone().unwrap_or_else(|| handler.to_string());
    let id = core.reserve(&name)?;
    let built = make_target(id).and_then(|target| {
        let cfg = DrainConfig {
            id,
            name: name.clone(),
            capacity: opts.queue_capacity,
            output_capacity: opts.output_capacity,
            slot_size: opts.slot_size,
            serial,
            state_words: u32::try_from(state_bytes / 4)
                .map_err(|_| Error::invalid("state_bytes too large"))?,
            priority: opts.priority,
            inputs: core
                .registry()
                .gpu(handler)
                .map(|g| g.inputs)
                .unwrap_or_default(),
            sender_fills: std::env::var(SENDER_FILLS_ENV).map_or(true, |v| v.trim() != "0"),
        };
        DrainEngine::new(cfg, target, core)
    });
    let engine = match built {
        Ok(e) => e,
        Err(e) => {
            core.release(&name);
            return Err(e);
        }
    };
    core.insert(engine.clone());
    if opts.auto_activate {
        engine.activate()?;
    }
    Ok(core.handle(engine, opts))
}

/// Launches the WGSL handler registered as `handler` as a drain kernel, as both
/// event-driven runtimes do: checks the options, looks the handler up, compiles it once
/// per source through `cache` (`compile` turns the composed drain module into the
/// backend's pipeline; `serial` tells whether that module runs serially), sizes the
/// handler state, and hands over to [`launch_engine`] with the target
/// `make_target(compiled, state_bytes)` builds.
pub fn launch_gpu_handler<C, T: DrainTarget>(
    core: &Arc<RuntimeCore>,
    cache: &CompileCache<C>,
    handler: &str,
    opts: &LaunchOptions,
    compile: impl FnOnce(&str, DrainModule) -> Result<C>,
    serial: impl FnOnce(&C) -> bool,
    make_target: impl FnOnce(Arc<C>, usize) -> Result<T>,
) -> Result<KernelHandle> {
    opts.validate()?;
    let gpu = core.registry().gpu(handler)?;
    let compiled = cache.get_or_compile(&gpu, |module| compile(&gpu.name, module))?;
    let state = state_bytes(&gpu, opts);
    let serial = serial(&compiled);
    launch_engine(core, handler, opts, serial, state, |_id| {
        make_target(compiled, state)
    })
}

/// Implements [`RingKernelRuntime`](ringkernel_core::runtime::RingKernelRuntime) for an event-driven runtime, the same way for every
/// backend. The type needs the fields `core: Arc<RuntimeCore>` and
/// `compiled: CompileCache<C>` (where `C` has a field `module: DrainModule`), and the
/// methods `compile_module(&self, &str, DrainModule) -> Result<C>`,
/// `target(&self, Arc<C>, &LaunchOptions, usize) -> Result<impl DrainTarget>` (the
/// device buffers of one kernel, with that many bytes of handler state) and
/// `info(&self) -> String`. Launching goes through [`launch_gpu_handler`].
#[macro_export]
macro_rules! drain_runtime {
    ($ty:ty) => {
        impl ::ringkernel_core::runtime::RingKernelRuntime for $ty {
            fn core(&self) -> &::std::sync::Arc<::ringkernel_core::runtime::RuntimeCore> {
                &self.core
            }

            fn launch<'a>(
                &'a self,
                handler: &'a str,
                opts: ::ringkernel_core::options::LaunchOptions,
            ) -> ::ringkernel_core::util::BoxFuture<
                'a,
                ::ringkernel_core::Result<::ringkernel_core::runtime::KernelHandle>,
            > {
                Box::pin(async move {
                    $crate::engine::launch_gpu_handler(
                        &self.core,
                        &self.compiled,
                        handler,
                        &opts,
                        |name, module| self.compile_module(name, module),
                        |c| c.module.serial,
                        |compiled, state| self.target(compiled, &opts, state),
                    )
                })
            }

            fn device_info(&self) -> String {
                self.info()
            }
        }
    };
}

impl<T: DrainTarget> std::fmt::Debug for DrainEngine<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DrainEngine")
            .field("id", &self.id)
            .field("name", &self.name)
            .field("serial", &self.serial)
            .finish()
    }
}

impl<T: DrainTarget> DrainEngine<T> {
    /// Whether passes run the serial drain entry point.
    pub fn is_serial(&self) -> bool {
        self.serial
    }
}
