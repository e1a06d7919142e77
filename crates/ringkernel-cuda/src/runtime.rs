//! [`CudaRuntime`]: persistent GPU actors.
//!
//! Every launched kernel is one real persistent CUDA kernel (`LaunchOptions::grid_size`
//! blocks of `LaunchOptions::block_size` threads) on its own non-blocking stream,
//! running the template `kernels/persistent.cu` with the handler's CUDA C source
//! compiled in (the handler ABI is documented in `kernels/ringkernel.cuh`).
//!
//! ## Messages cross PCIe once
//!
//! Host input lanes and the output queue are rings of *stamped slots*
//! ([`ringkernel_core::queue::stamped`]): a slot is stored as 16-byte units of 12 data
//! bytes and a stamp (the message's ring index + 1), so the kernel takes a message with
//! one read of the slot (no index read first) and publishes a reply by writing its
//! units (no fence, no index store before the host may read it). The host validates
//! the stamps of the units a header says are used, then the slot as every ring does
//! (magic, version, length, checksum).
//!
//! Inside the kernel, warp 0 of each block's host group polls one slot at a time and
//! handles a lone message itself (registers and warp votes only); when the lane tails
//! announce a backlog, the whole group takes windows of slots per round (one message
//! per thread). A quarter of the block (at least a warp; `LaunchOptions::inbox_threads`
//! sets it) serves the K2K inbox the same way, concurrently, so device-side K2K never
//! waits behind a PCIe read. The measured
//! costs behind these choices are in BENCHMARKS.md (issue 12) and
//! `notes/cuda_stamped_floor.cu`.
//!
//! ## Memory
//!
//! * Pinned, device-mapped host memory (`cuMemHostAlloc(DEVICEMAP | PORTABLE)`) per
//!   kernel: the [`ControlBlock`] (page 0; the device writes its counters there, the
//!   host its commands), the [`LaneTails`] line on a page of its own (the lanes' tails
//!   and the command, which the kernel polls), the input lanes (one stamped ring per
//!   priority lane), the output ring (stamped), the latency ring (see
//!   [`metrics`](crate::metrics)) and, with `RINGKERNEL_CUDA_PROFILE`, the round
//!   profile ([`CudaRuntime::round_profile`]).
//! * Device memory per kernel: the handler state, the kernel-wide state of a kernel of
//!   several blocks, and staging when it does not fit in shared memory, all allocated on
//!   the kernel's own stream before the kernel is launched on it. Per runtime, allocated
//!   when it opens (before any of its kernels runs): the *inbox pool*, from which every
//!   kernel gets its K2K inbox ([`DeviceInbox`] + stamped slots), so a kernel never
//!   reaches memory allocated after its own launch (compute-sanitizer's memcheck reports
//!   such an access, on plain CUDA too); its size is [`DEFAULT_INBOX_POOL_BYTES`] or
//!   [`CudaRuntime::with_inbox_pool`]'s, and a launch whose inbox no longer fits is an
//!   error. And the routing table
//!   ([`DeviceRoute`] per kernel id, up to [`MAX_DEVICE_ROUTES`]), through which
//!   `rk_send_to` on the device writes straight into another kernel's inbox (no host
//!   hop; `rk_send_many_to` writes several messages with one reservation, see
//!   kernels/ringkernel.cuh). Each kernel writes its own entry when it starts and clears it when told to
//!   terminate, so the host never copies into device memory while kernels run. In a
//!   [`CudaRuntimeGroup`](crate::CudaRuntimeGroup) (several GPUs) a kernel writes its
//!   entry into every GPU's table, so kernels message each other across GPUs
//!   ([`multi_gpu`](crate::multi_gpu)).
//!
//! Kernel memory is kept until the runtime is dropped (a K2K sender on the GPU may
//! still hold a terminated kernel's inbox address), and freed only after every kernel
//! has exited.
//!
//! ## Priority
//!
//! The host input of a kernel is [`LANES`] rings, one per priority level, each of
//! `LaunchOptions::queue_capacity` slots ([`KernelEngine::input_capacity`] counts them
//! all). A message goes into the lane of its header's priority ([`priority::lane`]);
//! the kernel takes every batch from the highest lane holding messages (FIFO within a
//! lane, a batch never mixes lanes), so a HIGH message overtakes any number of waiting
//! LOW ones. The host writes the low 32 bits of each lane's tail into [`LaneTails`],
//! which the kernel reads with one 16-byte load. A K2K message at the head of the
//! inbox waits while a host lane of higher priority holds messages.
//! Messages left in an inactive kernel come back from `terminate` highest lane first.
//!
//! Replies and K2K sends carry the kernel's priority (`LaunchOptions::priority`) in the
//! priority byte and its clock's node id (`RuntimeCore::kernel_node_id`) next to the
//! timestamp; the kernel's stream gets a CUDA stream priority from it
//! ([`stream_priority`]).
//!
//! ## Host side
//!
//! One pump thread per runtime watches every kernel and raises [`KernelEvents`]:
//! `output` when a reply has begun to arrive (the stamp of the next output slot),
//! `input_space` when the device frees input slots. It spins while work is in flight
//! and parks when idle (a send wakes it). Its per-round writes go to lines of its own,
//! and besides device-written words it reads the consumer's head (which the receiving
//! thread writes after every reply) only every 256th round: before, its writes beside
//! the senders' and receivers' fields made every send and receive slower (BENCHMARKS.md,
//! "The CUDA pump off the senders' and receivers' lines"). It also folds the device's handler-latency
//! samples (timed with `%globaltimer`) into each kernel's histogram and logs dropped
//! messages with their reason. The kernel publishes its counters without ordering
//! them after its replies (that would cost a system fence per batch);
//! `KernelHandle::metrics` makes them exact by repeating the last command, whose
//! acknowledgement comes after fenced counters.
//!
//! ## Limits
//!
//! * `block_size` is a multiple of 32, at most [`MAX_BLOCK_SIZE`]; `grid_size` at most
//!   the GPU's multiprocessor count (a kernel of several blocks is launched
//!   cooperatively: all its blocks are resident, or the launch fails). See
//!   [`check_launch_options`].
//! * Kernel ids at or above [`MAX_DEVICE_ROUTES`] cannot receive K2K messages on the GPU.
//! * Persistent kernels occupy hardware work queues for their whole life; the runtime
//!   raises `CUDA_DEVICE_MAX_CONNECTIONS` to 32 (unless set) so other streams rarely
//!   queue behind one. Keep the number of live kernels per GPU well under that.
//! * Loading a CUDA module waits, in the driver, for every kernel running in the
//!   context (measured on an H200, driver 580): with persistent kernels, forever. So
//!   the backend loads modules eagerly (`CUDA_MODULE_LOADING=EAGER` unless set),
//!   refuses to load one while persistent kernels run (an error, never a hang), and
//!   [`CudaRuntime::preload`] loads a handler's module up front. The first launch of a
//!   runtime (while no persistent kernel runs) loads every GPU handler the registry
//!   knows, `#[ring_kernel(gpu)]` ones included, so they can then be launched in any
//!   order; launch a handler registered later, and not preloaded, only while no kernel
//!   runs. Create [`CudaCompute`](crate::CudaCompute) before launching kernels.

use crate::driver::{dev_err, ensure_nvrtc, Device, DeviceMemory, MappedMemory, Module, Stream};
use crate::layout::{DeviceInbox, DeviceRoute, LaneTails, LaunchParams};
use crate::metrics::{drop_reason, LatencyReader, LATENCY_RING_CAPACITY};
use cudarc::driver::{result as cu, sys};
use ringkernel_core::builtin::{COUNTER, ECHO, STAGE};
use ringkernel_core::control::{command, ControlBlock};
use ringkernel_core::hlc::HlcTimestamp;
use ringkernel_core::lifecycle::{AtomicLifecycle, LifecycleState};
use ringkernel_core::message::{check_payload_fits, Envelope, MessageHeader};
use ringkernel_core::options::LaunchOptions;
use ringkernel_core::priority::{self, LANES};
use ringkernel_core::queue::stamped::{
    stamped_slot_bytes, units_per_slot, StampedConsumer, StampedProducer, StampedSlotReader,
    StampedWatcher, UNIT_DATA,
};
use ringkernel_core::queue::QueueHeader;
use ringkernel_core::registry::{check_accepts, GpuHandler, KernelRegistry, MessageInput};
use ringkernel_core::runtime::{
    KernelEngine, KernelEvents, KernelHandle, KernelId, RingKernelRuntime, RuntimeCore,
    TerminateReport,
};
use ringkernel_core::telemetry::{KernelMetrics, LatencyHistogram};
use ringkernel_core::util::{lock, BoxFuture, CachePadded};
use ringkernel_core::{BackendKind, Error, Result};
use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// Entries of the device routing table (kernel ids `0..MAX_DEVICE_ROUTES`).
pub const MAX_DEVICE_ROUTES: usize = 4096;

/// Per-thread stack the runtime reserves for its context (`CU_LIMIT_STACK_SIZE`).
///
/// Launching a kernel that needs more local memory than the context has reserved makes
/// the driver grow the reservation, and it waits for every running kernel to finish
/// first: with persistent kernels running, forever. So the runtime reserves this much
/// up front (before its first kernel runs) and refuses handlers whose kernel needs more.
pub const RUNTIME_STACK_BYTES: usize = 4096;

/// Bytes of the K2K inbox pool a runtime allocates when it opens (see the module docs):
/// 64 MiB, the inboxes of about 180 kernels of the default options (each
/// `128 + queue_capacity × stamped slot bytes`, rounded up to 256). Kernel inboxes are
/// never reused while the runtime lives (a sender on the GPU may still hold a
/// terminated kernel's inbox address), so this bounds the kernels one runtime launches
/// over its life; [`CudaRuntime::with_inbox_pool`] sets another size.
pub const DEFAULT_INBOX_POOL_BYTES: usize = 64 << 20;

const HEADER_LINE: usize = 128;
const PAGE: usize = 4096;
/// Bytes of dynamic shared memory the kernel reserves for its RkShared and for each of
/// its two groups (`RK_SHARED_BYTES`, `RK_GROUP_BYTES` in kernels/persistent.cu).
const SHARED_STATE_BYTES: usize = 256;
const GROUP_BYTES: usize = 512;
/// ... and for each warp's K2K hint (`RK_HINT_BYTES`).
const HINT_BYTES: usize = 1024;
/// Dynamic shared memory a kernel uses at most (of the device's opt-in limit), so a few
/// persistent kernels can share an SM.
const SMEM_BUDGET: usize = 96 * 1024;
/// How long `launch` waits for the kernel to report that it runs.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// How long `terminate` waits for the kernel to exit.
const EXIT_TIMEOUT: Duration = Duration::from_secs(60);
/// A [`CudaStreamer`] batch of at least this many messages (or replies waiting) is
/// encoded (decoded) outside the lanes' (the output's) lock, so that several threads
/// can stream through one kernel at once; a shorter one under it, without the second
/// lock round the split needs.
const SPLIT_BATCH: usize = 256;
/// The most replies one call claims on the split path: a long backlog is shared out
/// between the threads that read it rather than taken by the first.
const SPLIT_CLAIM_MAX: usize = 8192;
/// How long a reader of claimed replies waits for one the device has handed out an
/// index for but not yet written: far beyond any write in flight, so only a kernel
/// that stopped mid-reply reaches it.
const REPLY_WRITE_TIMEOUT: Duration = Duration::from_secs(1);

pub(crate) const HEADER_SRC: &str = include_str!("../kernels/ringkernel.cuh");
pub(crate) const TOKEN_SRC: &str = include_str!("../kernels/token.cuh");
pub(crate) const TEMPLATE_SRC: &str = include_str!("../kernels/persistent.cu");

/// The full source of a persistent kernel for a handler.
pub fn persistent_source(handler_cuda: &str) -> String {
    format!("{HEADER_SRC}\n#line 1 \"handler.cu\"\n{handler_cuda}\n#line 1 \"persistent.cu\"\n{TEMPLATE_SRC}")
}

/// As [`persistent_source`], for a kernel of a multi-GPU group
/// ([`CudaRuntimeGroup`](crate::CudaRuntimeGroup)) when `k2k_system`: K2K inboxes then
/// use system-scope atomics (`RK_K2K_SYSTEM` in kernels/ringkernel.cuh), since kernels
/// on other GPUs write them.
///
/// With a round profile (`RINGKERNEL_CUDA_PROFILE`), the source also defines
/// `RK_PROFILE 1`: the template compiles its profile's code only then.
pub fn persistent_source_for(handler_cuda: &str, k2k_system: bool) -> String {
    let system = if k2k_system {
        "#define RK_K2K_SYSTEM 1\n"
    } else {
        ""
    };
    let profile = if profile_capacity() > 0 {
        "#define RK_PROFILE 1\n"
    } else {
        ""
    };
    format!("{system}{profile}{}", persistent_source(handler_cuda))
}

/// The CUDA built-ins: (name, CUDA source, state bytes).
fn builtin_handlers() -> [(&'static str, String, usize); 3] {
    let with_token = |src: &str| format!("{TOKEN_SRC}\n{src}");
    [
        (
            ECHO,
            with_token(include_str!("../kernels/builtin_echo.cu")),
            0,
        ),
        (
            STAGE,
            with_token(include_str!("../kernels/builtin_stage.cu")),
            0,
        ),
        (
            COUNTER,
            with_token(include_str!("../kernels/builtin_counter.cu")),
            8,
        ),
    ]
}

/// Registers the CUDA versions of the built-in kernels `rk.echo`, `rk.stage` and
/// `rk.counter` (semantics in [`ringkernel_core::builtin`]), replacing CUDA sources
/// registered under those names.
///
/// [`CudaRuntime::new`] already registers them (keeping a CUDA source registered under
/// the same name), so callers need this only to fill a registry before a runtime
/// exists.
pub fn register_cuda_builtins(reg: &KernelRegistry) {
    for (name, src, state) in builtin_handlers() {
        reg.register_gpu(
            GpuHandler::new(name)
                .with_cuda(src)
                .with_state_bytes(state)
                .with_input::<ringkernel_core::builtin::Token>(),
        );
    }
}

/// Registers the built-ins that have no CUDA source in `reg` yet (what the runtime's
/// constructor does, as the other backends' constructors do).
fn register_missing_cuda_builtins(reg: &KernelRegistry) {
    for (name, src, state) in builtin_handlers() {
        if !matches!(reg.gpu(name), Ok(h) if h.cuda.is_some()) {
            reg.register_gpu(
                GpuHandler::new(name)
                    .with_cuda(src)
                    .with_state_bytes(state)
                    .with_input::<ringkernel_core::builtin::Token>(),
            );
        }
    }
}

/// Most threads a persistent kernel's block may have (`RK_MAX_BLOCK` in
/// kernels/persistent.cu): with more, each thread would get too few registers and the
/// kernel's loop would spill to local memory on its critical path.
pub const MAX_BLOCK_SIZE: u32 = 512;

/// The launch options CUDA cannot honour: `block_size` must be a whole number of warps
/// (multiples of 32: a kernel's threads are split into warp groups, see the module
/// docs), at most [`MAX_BLOCK_SIZE`]; so must `inbox_threads`, where set, leaving at
/// least one warp for the host's input. `grid_size` is checked against the device when
/// launching (its blocks must all be resident at once). The options' own checks come
/// first.
pub fn check_launch_options(opts: &LaunchOptions) -> Result<()> {
    opts.validate()?;
    if !opts.block_size.is_multiple_of(32) || opts.block_size > MAX_BLOCK_SIZE {
        return Err(Error::invalid(format!(
            "block_size must be a multiple of 32 (whole warps) and at most {MAX_BLOCK_SIZE} on CUDA, got {} \
             (for more threads, use several blocks: grid_size)",
            opts.block_size
        )));
    }
    if let Some(n) = opts.inbox_threads {
        if !n.is_multiple_of(32) || n + 32 > opts.block_size {
            return Err(Error::invalid(format!(
                "inbox_threads must be a multiple of 32 (whole warps) leaving at least one warp of the block ({}) for the host's input on CUDA, got {n}",
                opts.block_size
            )));
        }
    }
    Ok(())
}

/// How a kernel's block is divided and how much it stages per round (see the module
/// docs): `(host_threads, host_window, inbox_window, stage_stride, smem_bytes,
/// stage_in_shared)`. `smem_limit` is the dynamic shared memory a block may use;
/// `inbox` the threads that serve the K2K inbox (`None`: a quarter of the block, at
/// least a warp), whole warps leaving at least one for the host lanes
/// ([`check_launch_options`] refuses other values; here they are rounded down to whole
/// warps and capped to leave one).
pub fn block_plan(
    block: usize,
    slot_size: usize,
    smem_limit: usize,
    inbox: Option<usize>,
) -> (usize, usize, usize, usize, usize, bool) {
    // One warp: one group serving both sources in turns. Otherwise a quarter of the
    // block (at least a warp), or what the options say, serves the K2K inbox, the rest
    // the host lanes.
    let inbox_threads = if block >= 64 {
        inbox.unwrap_or(block / 4).clamp(32, block / 32 * 32 - 32) / 32 * 32
    } else {
        0
    };
    let host_threads = block - inbox_threads;
    let stride = (units_per_slot(slot_size) * UNIT_DATA).div_ceil(16) * 16;
    let fixed = SHARED_STATE_BYTES + 2 * GROUP_BYTES + HINT_BYTES;
    let per_slot_arrays = 8;
    let mut host_window = host_threads;
    let mut inbox_window = if inbox_threads > 0 { inbox_threads } else { 0 };
    let bytes = |h: usize, i: usize, stage: bool| {
        let arrays = ((h + i) * per_slot_arrays).div_ceil(16) * 16;
        fixed + arrays + if stage { (h + i) * stride * 2 } else { 0 }
    };
    // Shrink the windows until the staging fits in shared memory, keeping at least a
    // few slots each; if even that does not fit, stage in device memory.
    while bytes(host_window, inbox_window, true) > smem_limit && host_window + inbox_window > 8 {
        if host_window >= inbox_window * 3 && host_window > 4 {
            host_window = host_window * 3 / 4;
        } else if inbox_window > 4 {
            inbox_window = inbox_window * 3 / 4;
        } else {
            host_window = host_window * 3 / 4;
        }
    }
    let in_shared = bytes(host_window, inbox_window, true) <= smem_limit;
    if !in_shared {
        host_window = host_threads.min(64);
        inbox_window = inbox_threads.min(32);
    }
    (
        host_threads,
        host_window.max(1),
        inbox_window,
        stride,
        bytes(host_window, inbox_window, in_shared),
        in_shared,
    )
}

/// The CUDA stream priority for a kernel of priority `priority` (core's levels), in a
/// context whose stream priority range is `range = (least, greatest)` (CUDA: lower
/// numbers are higher priorities; `(0, 0)` where the device has none).
///
/// LOW and NORMAL kernels get `least`, the priority every other stream has by default,
/// so an ordinary kernel never outranks other CUDA work; HIGH gets the middle of the
/// range and CRITICAL `greatest`. A persistent kernel is one block that runs for its
/// whole life, so this orders mostly the launches and copies queued on its stream.
///
/// ```
/// use ringkernel_core::priority;
/// use ringkernel_cuda::runtime::stream_priority;
/// assert_eq!(stream_priority(priority::NORMAL, (0, -5)), 0);
/// assert_eq!(stream_priority(priority::HIGH, (0, -5)), -2);
/// assert_eq!(stream_priority(priority::CRITICAL, (0, -5)), -5);
/// assert_eq!(stream_priority(priority::CRITICAL, (0, 0)), 0);
/// ```
pub fn stream_priority(priority: u8, range: (i32, i32)) -> i32 {
    let (least, greatest) = (i64::from(range.0), i64::from(range.1));
    let normal = priority::lane(priority::NORMAL);
    // Steps above NORMAL: 0 for LOW and NORMAL, 1 for HIGH, 2 for CRITICAL.
    let step = priority::lane(priority).saturating_sub(normal) as i64;
    let top = (LANES - 1 - normal) as i64;
    (least + (greatest - least) * step / top) as i32
}

/// Writes as many of `msgs` as fit into `lanes` (one ring per priority lane, index =
/// lane), each message into the lane of its header's priority ([`priority::lane`]).
/// Every run of consecutive messages of one lane is written with one
/// [`StampedProducer::try_push_batch`] (one release store of the ring's tail), after which
/// `published(lane, new_tail)` is called. Stops at the first message whose lane is full,
/// so what is written is always a prefix of `msgs`: returns its length and, for a
/// payload that does not fit a slot, `MessageTooLarge` (the messages before it are
/// written and published). `lanes` must hold [`LANES`] rings.
fn push_into_lanes<'a>(
    lanes: &mut [StampedProducer],
    msgs: impl IntoIterator<Item = (&'a MessageHeader, &'a [u8])>,
    mut published: impl FnMut(usize, u64),
) -> (usize, Result<()>) {
    debug_assert_eq!(lanes.len(), LANES);
    let mut msgs = msgs.into_iter().peekable();
    let mut written = 0usize;
    while let Some(&(first, _)) = msgs.peek() {
        let lane = priority::lane(first.priority());
        let ring = &mut lanes[lane];
        // Local index reads only: the consumer's head is read by the ring only when it
        // looks full.
        let before = ring.position();
        let mut taken = 0usize;
        let run = std::iter::from_fn(|| {
            let m = msgs.next_if(|(h, _)| priority::lane(h.priority()) == lane)?;
            taken += 1;
            Some(m)
        });
        let r = ring.try_push_batch(run);
        let n = ring.position().wrapping_sub(before) as usize;
        if n > 0 {
            // The published tail: below the position while another thread still
            // writes slots it reserved there (`CudaEngine::send_split`).
            published(lane, ring.published());
            written += n;
        }
        match r {
            Err(e) => return (written, Err(e)),
            // The lane is full: the message the ring took and could not write, and
            // everything after it, stay unsent.
            Ok(_) if n < taken => break,
            Ok(_) => {}
        }
    }
    (written, Ok(()))
}

/// Reads the `n` claimed replies from `first` on through `reader`, calling `f` on each
/// in order, and returns how many it read. The device hands out a reply's index (and
/// moves the tail hint) before it writes the reply: without `wait`, the first reply not
/// yet complete ends the read; with it, such a reply is waited for (up to
/// [`REPLY_WRITE_TIMEOUT`]). A corrupt reply is an error, returned with the replies
/// after it (read, not passed to `f`); a reply still incomplete after the timeout is an
/// error too, and it and those after it are lost (the kernel stopped while writing
/// them).
fn read_claimed(
    reader: &mut StampedSlotReader,
    first: u64,
    n: usize,
    wait: bool,
    f: &mut dyn FnMut(&MessageHeader, &[u8]),
) -> std::result::Result<usize, (Error, Vec<Envelope>)> {
    let mut error = None;
    let mut rest = Vec::new();
    for k in 0..n {
        let i = first.wrapping_add(k as u64);
        let mut since: Option<Instant> = None;
        loop {
            // SAFETY: `i` lies in the range the caller claimed and releases only after
            // this returns; the output ring lives as long as its engine, which the
            // caller borrows.
            let r = unsafe {
                reader.try_read_with(i, |h, p| {
                    if error.is_none() {
                        f(h, p);
                    } else {
                        rest.push(Envelope {
                            header: *h,
                            payload: p.to_vec(),
                        });
                    }
                })
            };
            match r {
                Ok(Some(())) => break,
                Err(e) => {
                    error.get_or_insert(e);
                    break;
                }
                Ok(None) if !wait && error.is_none() => return Ok(k),
                Ok(None) => {
                    let t = *since.get_or_insert_with(Instant::now);
                    if t.elapsed() > REPLY_WRITE_TIMEOUT {
                        let e = Error::Device(format!(
                            "reply {i} was not complete {REPLY_WRITE_TIMEOUT:?} after the kernel handed out its slot; it and the {} after it are lost",
                            n - k - 1
                        ));
                        return Err((error.unwrap_or(e), rest));
                    }
                    std::hint::spin_loop();
                }
            }
        }
    }
    match error {
        None => Ok(n),
        Some(e) => Err((e, rest)),
    }
}

/// All memory of one kernel; kept by the runtime until it is dropped.
struct KernelMemory {
    mapped: MappedMemory,
    device: DeviceMemory,
}

/// Lets senders wake the pump thread cheaply (only when it is parked), and tells the
/// pump when to stop and when the list of kernels changed.
#[derive(Default)]
struct PumpWaker {
    thread: Mutex<Option<std::thread::Thread>>,
    parked: AtomicBool,
    /// Set when the runtime goes: the pump returns.
    stop: AtomicBool,
    /// Counts the changes of the runtime's kernel list: the pump keeps its own copy of
    /// the list and takes a new one when this moves (so a round clones no `Arc`s, whose
    /// counts share lines with the engines' fields).
    generation: AtomicU64,
}

impl PumpWaker {
    fn wake(&self) {
        // A plain load first: the swap (a locked instruction, which also waits for this
        // thread's earlier stores to leave its store buffer) only when the pump parks.
        if self.parked.load(Ordering::Relaxed) && self.parked.swap(false, Ordering::AcqRel) {
            if let Some(t) = lock(&self.thread).as_ref() {
                t.unpark();
            }
        }
    }
}

/// The runtime's K2K inbox pool: allocated (zeroed) when the runtime opens, handed out
/// front to back, never reused while the runtime lives.
struct InboxPool {
    mem: DeviceMemory,
    /// Its size in bytes.
    size: usize,
    /// Bytes handed out.
    used: Mutex<usize>,
}

impl InboxPool {
    /// Reserves `len` bytes (256-byte aligned) for a kernel's inbox; an error when the
    /// pool cannot hold them.
    fn reserve(&self, len: usize, kernel: &str) -> Result<usize> {
        let len = len.div_ceil(256) * 256;
        let mut used = lock(&self.used);
        let total = self.size;
        if len > total - *used {
            return Err(Error::Device(format!(
                "the K2K inbox pool of this CUDA runtime is full: kernel {kernel:?} needs {len} bytes for its inbox, \
                 {} of {total} are left (inboxes are not reused while the runtime lives; \
                 CudaRuntime::with_inbox_pool sets a larger pool)",
                total - *used
            )));
        }
        let off = *used;
        *used += len;
        Ok(off)
    }

    /// Gives back the reservation at `off` of `len` bytes if it is the last one (a
    /// launch that failed before its kernel ran).
    fn unreserve(&self, off: usize, len: usize) {
        let mut used = lock(&self.used);
        if off + len.div_ceil(256) * 256 == *used {
            *used = off;
        }
    }
}

/// A kernel's inbox reservation while its launch may still fail: handed back unless
/// kept (once the kernel was launched, its inbox stays reserved).
struct InboxLease<'a> {
    pool: &'a InboxPool,
    off: usize,
    len: usize,
    kept: bool,
}

impl Drop for InboxLease<'_> {
    fn drop(&mut self) {
        if !self.kept {
            self.pool.unreserve(self.off, self.len);
        }
    }
}

struct RtInner {
    core: Arc<RuntimeCore>,
    dev: Arc<Device>,
    routes: DeviceMemory,
    inbox_pool: InboxPool,
    modules: Mutex<HashMap<u64, Arc<Module>>>,
    kernels: Mutex<Vec<Arc<CudaEngine>>>,
    memory: Mutex<Vec<Arc<KernelMemory>>>,
    pump: Mutex<Option<std::thread::JoinHandle<()>>>,
    waker: Arc<PumpWaker>,
    desc: String,
    /// Whether this runtime belongs to a multi-GPU group whose kernels write each
    /// other's inboxes (its kernels are compiled with system-scope K2K atomics).
    k2k_system: bool,
    /// Whether every known handler's module was loaded before the first launch.
    preloaded_all: AtomicBool,
    /// The other GPUs' routing tables (device addresses, in device memory of this GPU)
    /// and their count, set by [`CudaRuntimeGroup`](crate::CudaRuntimeGroup) before any
    /// kernel of the group runs.
    peer_tables: std::sync::OnceLock<(DeviceMemory, usize)>,
}

impl RtInner {
    fn wake_pump(&self) {
        self.waker.parked.store(true, Ordering::Release);
        self.waker.wake();
    }

    fn module_for(&self, handler: &GpuHandler, src: &str) -> Result<Arc<Module>> {
        let key = crate::nvrtc::fnv1a64(&[src.as_bytes()]);
        if let Some(m) = lock(&self.modules).get(&key) {
            return Ok(m.clone());
        }
        let full = persistent_source_for(src, self.k2k_system);
        let cubin = crate::nvrtc::compile_cubin(
            &full,
            &format!("persistent-{}", handler.name),
            self.dev.info.cc,
            self.dev.info.driver_version,
        )?;
        let m = Arc::new(self.dev.load_module(&cubin)?);
        m.function("rk_persistent")?;
        lock(&self.modules).insert(key, m.clone());
        Ok(m)
    }
}

impl Drop for RtInner {
    fn drop(&mut self) {
        self.waker.stop.store(true, Ordering::Release);
        self.wake_pump();
        if let Some(h) = lock(&self.pump).take() {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
        // Every kernel must have exited before its memory goes.
        for k in lock(&self.kernels).drain(..) {
            k.force_exit();
        }
    }
}

/// The CUDA runtime: persistent kernels on one GPU. See the [module docs](self).
///
/// ```no_run
/// # async fn demo() -> ringkernel_core::Result<()> {
/// use ringkernel_core::builtin::{Token, ECHO};
/// use ringkernel_core::options::LaunchOptions;
/// use ringkernel_core::registry::KernelRegistry;
/// use ringkernel_core::runtime::RingKernelRuntime;
/// // The runtime registers the CUDA built-ins (rk.echo, rk.stage, rk.counter) itself.
/// let rt = ringkernel_cuda::CudaRuntime::with_registry(KernelRegistry::new()).await?;
/// let k = rt.launch(ECHO, LaunchOptions::default()).await?;
/// let r: Token = k.call(Token::new(1, 21.0), std::time::Duration::from_secs(1)).await?;
/// assert_eq!(r.value, 42.0);
/// rt.shutdown().await?;
/// # Ok(()) }
/// ```
pub struct CudaRuntime {
    inner: Arc<RtInner>,
}

impl std::fmt::Debug for CudaRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaRuntime")
            .field("device", &self.inner.desc)
            .finish()
    }
}

impl CudaRuntime {
    /// A runtime on device 0 resolving handler names through the process-wide
    /// [`KernelRegistry::global`]. The CUDA built-ins (`rk.echo`, `rk.stage`,
    /// `rk.counter`) are added to it unless a CUDA source is already registered under
    /// their name, and their modules are loaded right away (see
    /// [`CudaRuntime::preload`]). [`Error::BackendUnavailable`] without a driver, a GPU
    /// or NVRTC.
    pub async fn new() -> Result<Self> {
        Self::with_registry(KernelRegistry::global().clone()).await
    }

    /// Like [`CudaRuntime::new`], resolving handler names through `registry`.
    pub async fn with_registry(registry: KernelRegistry) -> Result<Self> {
        Self::on_device(registry, 0).await
    }

    /// A runtime on device `ordinal` (any GPU of the machine: see
    /// [`device_count`](crate::device_count)). A missing device is
    /// [`Error::InvalidArgument`] naming how many there are; without a driver or a GPU,
    /// [`Error::BackendUnavailable`]. Kernels of runtimes on different GPUs exchange
    /// K2K messages on the GPU only inside a [`CudaRuntimeGroup`](crate::CudaRuntimeGroup).
    pub async fn on_device(registry: KernelRegistry, ordinal: usize) -> Result<Self> {
        Self::open(registry, ordinal, None).await
    }

    /// A runtime on device `ordinal` whose K2K inbox pool holds `pool_bytes` (instead of
    /// [`DEFAULT_INBOX_POOL_BYTES`]). Every kernel takes its inbox,
    /// `128 + queue_capacity × stamped slot bytes` rounded up to 256, from the pool, and
    /// keeps it while the runtime lives; a launch that no longer fits is an
    /// [`Error::Device`] naming the pool. `pool_bytes` of 0 is [`Error::InvalidArgument`].
    ///
    /// ```no_run
    /// # async fn demo() -> ringkernel_core::Result<()> {
    /// use ringkernel_core::registry::KernelRegistry;
    /// // Room for 512 MiB of inboxes, for a runtime that launches many kernels.
    /// let rt = ringkernel_cuda::CudaRuntime::with_inbox_pool(KernelRegistry::new(), 0, 512 << 20).await?;
    /// # drop(rt);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn with_inbox_pool(
        registry: KernelRegistry,
        ordinal: usize,
        pool_bytes: usize,
    ) -> Result<Self> {
        if pool_bytes == 0 {
            return Err(Error::invalid("the K2K inbox pool needs at least one byte"));
        }
        Self::open_with_pool(registry, ordinal, None, pool_bytes).await
    }

    /// A runtime on device `ordinal`; with `group_core`, a member of a multi-GPU group
    /// sharing that core (kernel ids, names, clock, broker) with the group's other
    /// runtimes, its kernels compiled for cross-GPU K2K.
    pub(crate) async fn open(
        registry: KernelRegistry,
        ordinal: usize,
        group_core: Option<Arc<RuntimeCore>>,
    ) -> Result<Self> {
        Self::open_with_pool(registry, ordinal, group_core, DEFAULT_INBOX_POOL_BYTES).await
    }

    async fn open_with_pool(
        registry: KernelRegistry,
        ordinal: usize,
        group_core: Option<Arc<RuntimeCore>>,
        pool_bytes: usize,
    ) -> Result<Self> {
        let dev = Device::open(ordinal)?;
        ensure_nvrtc()?;
        register_missing_cuda_builtins(&registry);
        dev.bind()?;
        let stack = cu::ctx::get_limit(sys::CUlimit::CU_LIMIT_STACK_SIZE)
            .map_err(dev_err("get stack limit"))?;
        if stack < RUNTIME_STACK_BYTES {
            cu::ctx::set_limit(sys::CUlimit::CU_LIMIT_STACK_SIZE, RUNTIME_STACK_BYTES)
                .map_err(dev_err("set stack limit"))?;
        }
        let mem_stream = Arc::new(dev.new_stream()?);
        let routes = DeviceMemory::zeroed(
            &mem_stream,
            MAX_DEVICE_ROUTES * std::mem::size_of::<DeviceRoute>(),
        )?;
        // Every kernel's inbox comes from here: allocated before any kernel of this
        // runtime runs (see the module docs).
        let inbox_pool = InboxPool {
            mem: DeviceMemory::zeroed(&mem_stream, pool_bytes)?,
            size: pool_bytes,
            used: Mutex::new(0),
        };
        let i = &dev.info;
        let desc = format!(
            "CUDA {} (device {}, sm_{}{}, {} SMs)",
            i.name, i.ordinal, i.cc.0, i.cc.1, i.sm_count
        );
        let k2k_system = group_core.is_some();
        let core = group_core.unwrap_or_else(|| RuntimeCore::new(BackendKind::Cuda, registry));
        let inner = Arc::new(RtInner {
            core,
            dev,
            routes,
            inbox_pool,
            modules: Mutex::new(HashMap::new()),
            preloaded_all: AtomicBool::new(false),
            kernels: Mutex::new(Vec::new()),
            memory: Mutex::new(Vec::new()),
            pump: Mutex::new(None),
            waker: Arc::new(PumpWaker::default()),
            desc,
            k2k_system,
            peer_tables: std::sync::OnceLock::new(),
        });
        let weak = Arc::downgrade(&inner);
        let waker = inner.waker.clone();
        let h = std::thread::Builder::new()
            .name("ringkernel-cuda-pump".into())
            .spawn(move || pump_loop(weak, waker))
            .map_err(|e| Error::Device(format!("cannot start the CUDA pump thread: {e}")))?;
        *lock(&inner.waker.thread) = Some(h.thread().clone());
        *lock(&inner.pump) = Some(h);
        let rt = CudaRuntime { inner };
        // Load the built-ins' modules now, before any kernel runs (see the module docs:
        // a module load waits for running kernels), so they can be launched in any order.
        for name in [ECHO, STAGE, COUNTER] {
            if rt
                .inner
                .core
                .registry()
                .gpu(name)
                .is_ok_and(|h| h.cuda.is_some())
            {
                if let Err(e) = rt.preload(name) {
                    tracing::warn!(handler = name, error = %e, "preloading a built-in CUDA handler failed");
                }
            }
        }
        Ok(rt)
    }

    async fn launch_impl(&self, handler: &str, opts: LaunchOptions) -> Result<KernelHandle> {
        check_launch_options(&opts)?;
        let rt = &self.inner;
        let h = rt.core.registry().gpu(handler)?;
        let src = h.cuda.clone().ok_or_else(|| {
            Error::KernelNotFound(format!("handler {handler:?} has no CUDA source"))
        })?;
        self.preload_all_while_idle();
        let name = opts.name.clone().unwrap_or_else(|| handler.to_string());
        let id = rt.core.reserve(&name)?;
        match self.start_kernel(&h, &src, id, &name, &opts).await {
            Ok(engine) => {
                rt.core.insert(engine.clone());
                lock(&rt.kernels).push(engine.clone());
                rt.waker.generation.fetch_add(1, Ordering::Release);
                rt.wake_pump();
                if opts.auto_activate {
                    engine.activate()?;
                }
                Ok(rt.core.handle(engine, &opts))
            }
            Err(e) => {
                rt.core.release(&name);
                Err(e)
            }
        }
    }

    /// Before the first kernel of this runtime starts (and while no persistent kernel
    /// runs in the process, so a module load cannot wait for one), loads the module of
    /// every GPU handler with CUDA source that the registry knows, `#[ring_kernel(gpu)]`
    /// handlers included: kernels can then be launched in any order, a pipeline's second
    /// stage while its first runs. A handler that fails to compile is logged and left
    /// for its own launch to report.
    fn preload_all_while_idle(&self) {
        let rt = &self.inner;
        if rt.preloaded_all.load(Ordering::Acquire)
            || crate::driver::RUNNING_PERSISTENT_KERNELS.load(Ordering::Acquire) > 0
        {
            return;
        }
        rt.preloaded_all.store(true, Ordering::Release);
        let registry = rt.core.registry();
        for name in registry.gpu_names() {
            let Ok(h) = registry.gpu(&name) else { continue };
            let Some(src) = h.cuda.as_deref() else {
                continue;
            };
            if let Err(e) = rt.module_for(&h, src) {
                tracing::warn!(handler = %name, error = %e, "preloading a CUDA handler failed");
            }
        }
    }

    async fn start_kernel(
        &self,
        h: &GpuHandler,
        src: &str,
        id: KernelId,
        name: &str,
        opts: &LaunchOptions,
    ) -> Result<Arc<CudaEngine>> {
        let rt = &self.inner;
        let module = rt.module_for(h, src)?;
        let func = module.function("rk_persistent")?;
        // SAFETY: valid function handle of a loaded module; reads one attribute.
        let local = unsafe {
            cu::function::get_function_attribute(
                func,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
            )
        }
        .map_err(dev_err("kernel attributes"))?;
        if local as usize > RUNTIME_STACK_BYTES / 2 {
            return Err(Error::invalid(format!(
                "handler {:?} needs {local} bytes of local memory per thread; persistent kernels may use at most {} \
                 (more would make the driver wait for every running kernel when launching it)",
                h.name,
                RUNTIME_STACK_BYTES / 2
            )));
        }
        let slot = opts.slot_size;
        let (in_cap, out_cap) = (opts.queue_capacity, opts.output_capacity);
        let inbox_cap = opts.queue_capacity;
        let block = opts.block_size as usize;
        let grid = opts.grid_size as usize;
        let sms = rt.dev.info.sm_count as usize;
        if grid > sms {
            return Err(Error::invalid(format!(
                "grid_size {grid} is more blocks than the GPU has multiprocessors ({sms}): a persistent kernel's blocks must all run at once"
            )));
        }
        let smem_limit = (rt.dev.info.max_smem_optin as usize).min(SMEM_BUDGET);
        let (host_threads, host_window, inbox_window, stage_stride, smem_bytes, stage_in_shared) =
            block_plan(
                block,
                slot,
                smem_limit,
                opts.inbox_threads.map(|n| n as usize),
            );

        // Mapped host memory: control block | lane tails | input lanes 0..LANES (each a
        // queue header + stamped slots) | output queue (stamped) | latency ring.
        let sslot = stamped_slot_bytes(slot);
        // The lane tails, which the kernel reads every round, get a page of their own:
        // read beside the control block (which the device writes and the host polls),
        // every read of the round took ~2 us longer (H100, measured).
        let tails_off = PAGE;
        let in_off = 2 * PAGE;
        let lane_stride = HEADER_LINE + in_cap * sslot;
        let out_off = in_off + LANES * lane_stride;
        let lat_off = out_off + HEADER_LINE + out_cap * sslot;
        let prof_off = lat_off + LATENCY_RING_CAPACITY * 8;
        let prof_cap = profile_capacity();
        let mapped_len = prof_off + if prof_cap > 0 { prof_cap * 128 + 8 } else { 0 };
        // The inbox first, so a full pool fails before any memory of the kernel is
        // allocated (pinned memory dropped while kernels run is only freed later: see
        // MappedMemory's drop).
        let box_slots = HEADER_LINE;
        // Handed back if this launch fails before the kernel is launched.
        let box_len = box_slots + inbox_cap * sslot;
        let box_off = rt.inbox_pool.reserve(box_len, name)?;
        let mut lease = InboxLease {
            pool: &rt.inbox_pool,
            off: box_off,
            len: box_len,
            kept: false,
        };
        let mapped = MappedMemory::new(&rt.dev, mapped_len)?;
        // Device memory: state | kernel-wide state (several blocks) | staging (when it
        // does not fit in shared memory). The inbox (header line | stamped slots) comes
        // from the runtime's pool, zeroed when the runtime opened and never used before.
        let state_bytes = h.state_bytes.max(opts.state_bytes).max(8).div_ceil(16) * 16;
        let state_off = 0;
        let shared_off = state_off + state_bytes;
        let shared_len = if grid > 1 { SHARED_STATE_BYTES } else { 0 };
        let stage_off = shared_off + shared_len;
        let stage_len = if stage_in_shared {
            0
        } else {
            grid * (host_window + inbox_window) * stage_stride * 2
        };
        // Everything of this kernel is allocated on its own (still empty) stream, so no
        // allocation or copy can queue behind another kernel that never finishes.
        let stream_prio = stream_priority(opts.priority, rt.dev.stream_priority_range()?);
        let stream = Arc::new(rt.dev.new_stream_with_priority(stream_prio)?);
        let device = DeviceMemory::zeroed(&stream, stage_off + stage_len)?;
        let inbox = DeviceInbox {
            capacity: inbox_cap as u32,
            slot_size: slot as u32,
            mask: (inbox_cap - 1) as u32,
            ..Default::default()
        };
        rt.inbox_pool
            .mem
            .write_bytes(box_off, bytemuck::bytes_of(&inbox))?;
        let mem = Arc::new(KernelMemory { mapped, device });
        lock(&rt.memory).push(mem.clone());

        let base = mem.mapped.host_ptr();
        let lane_offs: [usize; LANES] = std::array::from_fn(|l| in_off + l * lane_stride);
        // SAFETY: the mapped block is `mapped_len` bytes, 4 KiB aligned, zeroed, and not
        // yet visible to any kernel; the control block, the lane tails (zero: every lane
        // empty) and the queue headers lie inside it at 128-byte aligned offsets.
        unsafe {
            let cb = &mut *(base as *mut ControlBlock);
            cb.kernel_id = id.0;
            cb.slot_size = slot as u32;
            // Every lane together (in_cap <= 2^24, so this fits).
            cb.input_capacity = (LANES * in_cap) as u32;
            cb.output_capacity = out_cap as u32;
            cb.max_drift_ms = rt.core.hlc().max_drift_ms();
            let queues = lane_offs.iter().map(|&off| (off, in_cap));
            for (off, cap) in queues.chain([(out_off, out_cap)]) {
                let q = &mut *(base.add(off) as *mut QueueHeader);
                q.capacity = cap as u32;
                q.slot_size = slot as u32;
                q.mask = (cap - 1) as u32;
            }
        }
        let keep: Arc<dyn Any + Send + Sync> = mem.clone();
        let mut lanes = Vec::with_capacity(LANES);
        for &off in &lane_offs {
            // SAFETY: each input ring lies inside the mapped block (which `keep` holds),
            // its header was initialised above; the host is its only producer (this
            // value, kept behind a mutex) and the device kernel its only consumer, which
            // takes a slot only when every used unit carries its stamp and frees slots
            // (the lane's head) only after it has copied them.
            lanes.push(unsafe {
                StampedProducer::from_raw_parts(
                    ring_header(base, off),
                    ring_slots(base, off),
                    Some(keep.clone()),
                )?
            });
        }
        // SAFETY: as above for the output ring, roles swapped: the device is the only
        // producer (it writes stamped units only into slots it has promised against the
        // head this consumer publishes), this value the only consumer.
        let consumer = unsafe {
            StampedConsumer::from_raw_parts(
                ring_header(base, out_off),
                ring_slots(base, out_off),
                Some(keep),
            )?
        };
        let consumer_watcher = consumer.watcher();
        let dbase = mem.mapped.device_ptr();
        let ddev = mem.device.ptr();
        let unix_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let mut params = LaunchParams {
            control: dbase,
            in_queue: dbase + in_off as u64,
            out_queue: dbase + out_off as u64,
            inbox: rt.inbox_pool.mem.ptr() + box_off as u64,
            inbox_slots: rt.inbox_pool.mem.ptr() + (box_off + box_slots) as u64,
            routes: rt.routes.ptr(),
            route_count: MAX_DEVICE_ROUTES as u64,
            stage: if stage_in_shared {
                0
            } else {
                ddev + stage_off as u64
            },
            shared: if grid > 1 {
                ddev + shared_off as u64
            } else {
                0
            },
            state: ddev + state_off as u64,
            clock_offset_ns: unix_ns,
            kernel_id: id.0 as u64,
            slot_size: slot as u64,
            in_capacity: in_cap as u64,
            out_capacity: out_cap as u64,
            inbox_capacity: inbox_cap as u64,
            max_drift_ms: rt.core.hlc().max_drift_ms(),
            latency: dbase + lat_off as u64,
            latency_capacity: LATENCY_RING_CAPACITY as u64,
            lane_tails: dbase + tails_off as u64,
            lane_stride: lane_stride as u64,
            node_id: rt.core.kernel_node_id(id),
            priority: u64::from(opts.priority),
            host_threads: host_threads as u64,
            host_window: host_window as u64,
            inbox_window: inbox_window as u64,
            stage_stride: stage_stride as u64,
            profile: if prof_cap > 0 {
                dbase + prof_off as u64
            } else {
                0
            },
            profile_capacity: prof_cap as u64,
            peer_routes: rt.peer_tables.get().map_or(0, |(m, _)| m.ptr()),
            peer_route_count: rt.peer_tables.get().map_or(0, |&(_, n)| n as u64),
        };
        let kernel = Arc::new(CudaEngine {
            id,
            name: name.to_string(),
            slot,
            in_cap,
            out_cap,
            base,
            tails_off,
            in_off,
            lane_stride,
            out_off,
            lat_off,
            prof: (prof_cap > 0).then_some((prof_off, prof_cap)),
            mem: mem.clone(),
            stream,
            _module: module,
            lifecycle: AtomicLifecycle::new(LifecycleState::Created),
            send: CachePadded(SendSide {
                lanes: Mutex::new(lanes),
                received: AtomicU64::new(0),
                writing: AtomicU32::new(0),
            }),
            consumer: CachePadded(Mutex::new(Consumer {
                ring: consumer,
                spill: VecDeque::new(),
            })),
            latency: LatencyHistogram::new(),
            latency_reader: Mutex::new(LatencyReader::new()),
            seen_dropped: AtomicU64::new(0),
            command: Mutex::new(0),
            events: KernelEvents::default(),
            watcher: consumer_watcher,
            seen: CachePadded(PumpSeen {
                next_reply: AtomicU64::new(u64::MAX),
                in_head: AtomicU64::new(0),
                state: AtomicU32::new(0),
            }),
            exited: AtomicBool::new(false),
            counted: AtomicBool::new(false),
            inputs: h.inputs.clone(),
            rt: Arc::downgrade(rt),
            waker: rt.waker.clone(),
        });
        rt.dev.bind()?;
        {
            // SAFETY: valid function handle of a loaded module; the value is within the
            // device's opt-in limit (block_plan keeps smem_bytes under it).
            unsafe {
                cu::function::set_function_attribute(
                    func,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    smem_bytes as i32,
                )
            }
            .map_err(dev_err("shared memory of the persistent kernel"))?;
            let mut args = [&mut params as *mut LaunchParams as *mut c_void];
            // SAFETY: rk_persistent takes one RkLaunchParams by value, whose layout
            // matches LaunchParams (checked by the layout test); every address in it
            // points into memory that the runtime keeps until the kernel has exited
            // (KernelMemory is retained in rt.memory, the routing table in rt); the
            // dynamic shared memory is what the kernel carves (block_plan).
            let launched = unsafe {
                if grid > 1 {
                    // Cooperative: every block resident at once, or an error now (the
                    // blocks wait for each other when the kernel exits).
                    cu::launch_cooperative_kernel(
                        func,
                        (grid as u32, 1, 1),
                        (block as u32, 1, 1),
                        smem_bytes as u32,
                        kernel.stream.raw,
                        &mut args,
                    )
                } else {
                    cu::launch_kernel(
                        func,
                        (1, 1, 1),
                        (block as u32, 1, 1),
                        smem_bytes as u32,
                        kernel.stream.raw,
                        &mut args,
                    )
                }
            };
            launched.map_err(dev_err("launch of the persistent kernel"))?;
            lease.kept = true;
            crate::driver::RUNNING_PERSISTENT_KERNELS.fetch_add(1, Ordering::AcqRel);
            kernel.counted.store(true, Ordering::Release);
        }
        // Wait (without blocking the executor) until the kernel says it runs.
        let start = Instant::now();
        loop {
            if kernel.device_state() >= LifecycleState::Launched as u32 {
                break;
            }
            if kernel.stream.is_idle()? {
                kernel.mark_exited();
                return Err(Error::Device(format!(
                    "persistent kernel {name} exited before it started"
                )));
            }
            if start.elapsed() > START_TIMEOUT {
                kernel.force_exit();
                return Err(Error::Device(format!(
                    "persistent kernel {name} did not start within {START_TIMEOUT:?} (too many persistent kernels on this GPU?)"
                )));
            }
            futures_timer::Delay::new(Duration::from_micros(50)).await;
        }
        // The kernel has published its route entry (it owns it) before reporting Launched.
        kernel.lifecycle.transition(LifecycleState::Launched)?;
        Ok(kernel)
    }
}

impl CudaRuntime {
    /// The device address of this runtime's routing table (for a multi-GPU group).
    pub(crate) fn routes_ptr(&self) -> u64 {
        self.inner.routes.ptr()
    }

    /// Gives this runtime's kernels the routing tables of the other GPUs of its group
    /// (device addresses), where each kernel publishes its route entry too. Once, before
    /// any kernel of the runtime runs.
    pub(crate) fn set_peer_tables(&self, tables: &[u64]) -> Result<()> {
        if !lock(&self.inner.kernels).is_empty() || self.inner.peer_tables.get().is_some() {
            return Err(Error::invalid(
                "peer routing tables are set once, before any kernel runs",
            ));
        }
        let stream = Arc::new(self.inner.dev.new_stream()?);
        let mem = DeviceMemory::zeroed(&stream, tables.len().max(1) * 8)?;
        mem.write_bytes(0, bytemuck::cast_slice(tables))?;
        self.inner
            .peer_tables
            .set((mem, tables.len()))
            .map_err(|_| Error::invalid("peer routing tables are set once"))
    }

    /// Makes every kernel of this runtime exit (blocking), so no kernel of it touches
    /// memory any more (a multi-GPU group calls this on every member before any member's
    /// memory is freed: kernels write into each other's GPUs).
    pub(crate) fn stop_kernels(&self) {
        let kernels: Vec<Arc<CudaEngine>> = lock(&self.inner.kernels).clone();
        for k in kernels {
            k.force_exit();
        }
    }

    /// Compiles (or loads from the cache) and loads the persistent-kernel module of
    /// `handler` now, so a later `launch` does not load a module while other persistent
    /// kernels run (a module load may have to wait for running kernels on some drivers).
    pub fn preload(&self, handler: &str) -> Result<()> {
        let h = self.inner.core.registry().gpu(handler)?;
        let src = h.cuda.clone().ok_or_else(|| {
            Error::KernelNotFound(format!("handler {handler:?} has no CUDA source"))
        })?;
        self.inner.module_for(&h, &src).map(|_| ())
    }

    /// The last rounds of `kernel`'s host group in block 0 (oldest first), when the
    /// runtime was created with `RINGKERNEL_CUDA_PROFILE=<entries>` (a power of two) in
    /// the environment: what each phase of the persistent kernel's loop costs, for
    /// measurements (the benchmark's round-trip breakdown). Empty without a profile.
    /// A handler source that starts with `#define RK_PROFILE_INBOX 1` has its inbox
    /// group's rounds recorded instead (the K2K benchmark's sink).
    pub fn round_profile(&self, kernel: &KernelHandle) -> Result<Vec<RoundProfile>> {
        let k = self.streamer(kernel)?.kernel;
        let Some((off, cap)) = k.prof else {
            return Ok(Vec::new());
        };
        let n = k.u64_at(off + cap * 128).load(Ordering::Acquire) as usize;
        let first = n.saturating_sub(cap);
        Ok((first..n)
            .map(|i| {
                let e = off + (i & (cap - 1)) * 128;
                let w = |j: usize| k.u64_at(e + j * 8).load(Ordering::Acquire);
                let mode = (w(7) >> 16) as u16 as u32;
                RoundProfile {
                    t: std::array::from_fn(w),
                    taken: w(7) as u16 as u32,
                    mode,
                    cycles: (w(7) >> 32) as u32,
                    read: [w(8), w(9), w(10)],
                    // Group rounds leave words 11.. as an earlier entry of the slot had them.
                    marks: if mode == 3 {
                        unpack_marks(&[w(11), w(12), w(13), w(14), w(15)])
                    } else {
                        [0; TAKE_MARKS.len()]
                    },
                }
            })
            .collect())
    }

    /// A batch interface to a kernel of this runtime, for streaming many messages with
    /// one queue-index update per batch (see [`CudaStreamer`]).
    /// [`Error::KernelNotFound`] if `kernel` is not a live kernel of this runtime.
    pub fn streamer(&self, kernel: &KernelHandle) -> Result<CudaStreamer> {
        lock(&self.inner.kernels)
            .iter()
            .find(|k| k.id == kernel.id())
            .cloned()
            .map(|kernel| CudaStreamer { kernel })
            .ok_or_else(|| {
                Error::KernelNotFound(format!(
                    "kernel {} is not a live kernel of this CUDA runtime",
                    kernel.id()
                ))
            })
    }
}

/// Batch access to one kernel's queues: many messages per index update, replies read
/// in place. The same queues as the kernel's [`KernelHandle`]; use one or the other for
/// receiving (both take replies out of the same output queue).
///
/// Clones may send and receive from several threads at once. A batch of at least 256
/// messages is encoded outside the input's lock (its slots are reserved under it, and
/// published in index order once written), and a backlog of at least 256 replies is
/// read outside the output's lock (claimed under it, up to 8,192 a call, and freed in
/// order), so threads share the encoding and decoding work. Messages of one thread keep
/// their order; the replies one thread takes are in the kernel's output order. Which
/// thread takes which reply is not defined.
///
/// ```no_run
/// # async fn demo(rt: &ringkernel_cuda::CudaRuntime, k: &ringkernel_core::runtime::KernelHandle) -> ringkernel_core::Result<()> {
/// use ringkernel_core::message::MessageHeader;
/// let s = rt.streamer(k)?;
/// let h = MessageHeader::new(7, 64);
/// let payload = [0u8; 64];
/// let sent = s.try_send_batch(std::iter::repeat_n((&h, &payload[..]), 1000))?;
/// let got = s.try_receive_batch(usize::MAX, &mut |_hdr, _payload| {})?;
/// # let _ = (sent, got); Ok(()) }
/// ```
#[derive(Clone)]
pub struct CudaStreamer {
    kernel: Arc<CudaEngine>,
}

impl std::fmt::Debug for CudaStreamer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaStreamer")
            .field("kernel", &self.kernel.name)
            .finish()
    }
}

impl CudaStreamer {
    /// Writes as many of `msgs` as the input has room for, each into the lane of its
    /// header's priority, publishing every run of messages of one lane together
    /// (see the [module docs](self)). Stops at the first message whose lane is full, so
    /// the messages written are a prefix of `msgs`; returns how many (0 when the first
    /// one's lane is full).
    /// [`Error::KernelTerminated`] once the kernel is terminating;
    /// [`Error::MessageTooLarge`] for a payload that does not fit a slot (the messages
    /// before it are written).
    pub fn try_send_batch<'a>(
        &self,
        msgs: impl IntoIterator<Item = (&'a MessageHeader, &'a [u8])>,
    ) -> Result<usize> {
        self.kernel.send_batch(msgs)
    }

    /// Calls `f` on up to `max` waiting replies, in order and in place, then frees
    /// their slots with one index store. Returns how many were taken (0 when none is
    /// waiting). Every reply is validated as by [`KernelHandle`]'s receive path (magic,
    /// version, payload length, checksum when flagged): a corrupt one is consumed and
    /// returned as [`Error::Device`], after the replies before it were passed to `f`.
    pub fn try_receive_batch(
        &self,
        max: usize,
        f: &mut dyn FnMut(&MessageHeader, &[u8]),
    ) -> Result<usize> {
        self.kernel.receive_batch(max, f)
    }
}

impl RingKernelRuntime for CudaRuntime {
    fn core(&self) -> &Arc<RuntimeCore> {
        &self.inner.core
    }

    fn launch<'a>(
        &'a self,
        handler: &'a str,
        opts: LaunchOptions,
    ) -> BoxFuture<'a, Result<KernelHandle>> {
        Box::pin(self.launch_impl(handler, opts))
    }

    fn device_info(&self) -> String {
        self.inner.desc.clone()
    }
}

/// The header of the ring at byte `off` of the mapped block at `base`.
///
/// # Safety
/// `base` is the (non-null) host address of a kernel's mapped block and a ring's
/// header and slots lie inside it from byte `off` on (the queue offsets of
/// `start_kernel`).
unsafe fn ring_header(base: *mut u8, off: usize) -> NonNull<QueueHeader> {
    // SAFETY: in bounds of a non-null allocation (the caller's promise).
    unsafe { NonNull::new_unchecked(base.add(off).cast()) }
}

/// The slots of the ring at byte `off` of the mapped block at `base`.
///
/// # Safety
/// As for [`ring_header`].
unsafe fn ring_slots(base: *mut u8, off: usize) -> NonNull<u8> {
    // SAFETY: as in `ring_header`; the slots follow the 128-byte header.
    unsafe { NonNull::new_unchecked(base.add(off + HEADER_LINE)) }
}

/// Entries of the round profile each kernel keeps: `RINGKERNEL_CUDA_PROFILE` (a power
/// of two; 0 or unset: no profile). See [`CudaRuntime::round_profile`].
fn profile_capacity() -> usize {
    std::env::var("RINGKERNEL_CUDA_PROFILE")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|n| n.is_power_of_two())
        .unwrap_or(0)
}

/// One round of a kernel's host group (block 0), as its profile recorded it: the
/// device time (`%globaltimer`, ns) when the round began and after each of its phases,
/// and what it took (see [`CudaRuntime::round_profile`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RoundProfile {
    /// Round start, then after: plan, read (the PCIe round trip), validate, decide,
    /// handle, place (0 for the last two when the round took no message).
    pub t: [u64; 7],
    /// Messages the round took.
    pub taken: u32,
    /// 0: read nothing (lane tails only), 1: one slot speculatively, 2: a claimed window.
    pub mode: u32,
    /// SM clock cycles from the round's start to after its replies (the SM clock rate
    /// is this over `t[6] - t[0]` and some more).
    pub cycles: u32,
    /// Inside the read phase: when the announcements (lane tails, command line) were
    /// in, when the leader's own unit was staged, when the lane tails were processed.
    /// In the one-message loop's entries (mode 3), inside the take instead: when it
    /// decided to take the message, when it held an output slot, when it had taken the
    /// message index and issued the clock's compare-and-swap (whose result is checked
    /// after the staging, so the span from there to `t[2]` includes that check).
    pub read: [u64; 3],
    /// One-message loop entries (mode 3): the SM cycles each step of the take cost its
    /// lane 0 ([`TAKE_MARKS`] names them; 0 when not measured, 0xFFFF when longer).
    /// All 0 in other entries.
    pub marks: [u16; TAKE_MARKS.len()],
}

/// Unpacks [`RoundProfile::marks`] from the profile entry's words 11.. (four 16-bit
/// differences a word, the first in the low bits; `persistent.cu` packs them).
fn unpack_marks(words: &[u64]) -> [u16; TAKE_MARKS.len()] {
    std::array::from_fn(|i| (words[i / 4] >> (16 * (i % 4))) as u16)
}

/// The steps that [`RoundProfile::marks`] times, in order: each ends at its mark.
pub const TAKE_MARKS: [&str; 17] = [
    "announcements and the decision",
    "output credit",
    "claim stores",
    "clock compare-and-swap issued",
    "message index",
    "drift check",
    "action to the warp",
    "staging, clock checked",
    "request fields",
    "reply header",
    "handler",
    "latency store",
    "result to the warp",
    "output index",
    "index to the warp",
    "reply stores",
    "processed count, head and tail stores",
];

/// The senders' side of a kernel's input.
struct SendSide {
    /// The producer side of the input lanes ([`LANES`] rings, index = lane).
    lanes: Mutex<Vec<StampedProducer>>,
    /// Messages the lanes took (written under `lanes`' lock).
    received: AtomicU64,
    /// Senders writing slots they reserved, outside the lock (changed under it).
    writing: AtomicU32,
}

/// What the pump thread last saw of a kernel. Only the pump reads and writes it.
struct PumpSeen {
    /// The next output index whose reply the pump has not announced (`u64::MAX`: not
    /// yet read from the consumer's head).
    next_reply: AtomicU64,
    in_head: AtomicU64,
    state: AtomicU32,
}

/// The host side of the output queue.
struct Consumer {
    ring: StampedConsumer,
    /// Replies moved out of the ring while terminating (so the device never waits on
    /// a full output queue nobody reads).
    spill: VecDeque<Envelope>,
}

/// One persistent kernel (the [`KernelEngine`] of the CUDA backend).
struct CudaEngine {
    id: KernelId,
    name: String,
    slot: usize,
    in_cap: usize,
    out_cap: usize,
    /// Host address of the mapped block (control block at 0).
    base: *mut u8,
    /// Offset of the [`LaneTails`] line.
    tails_off: usize,
    /// Offset of input lane 0's queue; lane `l`'s is at `in_off + l * lane_stride`.
    in_off: usize,
    lane_stride: usize,
    out_off: usize,
    /// Offset of the latency ring in the mapped block.
    lat_off: usize,
    /// Offset and entries of the round profile, when profiling.
    prof: Option<(usize, usize)>,
    mem: Arc<KernelMemory>,
    stream: Arc<Stream>,
    _module: Arc<Module>,
    lifecycle: AtomicLifecycle,
    /// The producer side of the input lanes, and what they took.
    send: CachePadded<SendSide>,
    consumer: CachePadded<Mutex<Consumer>>,
    /// Handler latency measured by the device (`%globaltimer`), folded in from the
    /// latency ring.
    latency: LatencyHistogram,
    latency_reader: Mutex<LatencyReader>,
    /// `dropped` as last reported in the log.
    seen_dropped: AtomicU64,
    /// Last command_seq written.
    command: Mutex<u32>,
    events: KernelEvents,
    /// Watches the output ring for the next reply (the pump thread).
    watcher: StampedWatcher,
    /// What the pump last saw (only the pump touches it).
    seen: CachePadded<PumpSeen>,
    exited: AtomicBool,
    /// Whether this kernel is counted in RUNNING_PERSISTENT_KERNELS.
    counted: AtomicBool,
    rt: Weak<RtInner>,
    waker: Arc<PumpWaker>,
    /// The handler's declared inputs (host-side check of sends).
    inputs: Vec<MessageInput>,
}

// SAFETY: `base` points into `mem.mapped`, which this value keeps alive; all shared
// fields in it are accessed through atomics, and slot bytes only by the side that owns
// the slot at that moment (guarded by the producer/consumer mutexes on the host).
unsafe impl Send for CudaEngine {}
// SAFETY: as above.
unsafe impl Sync for CudaEngine {}

impl CudaEngine {
    fn u64_at(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off.is_multiple_of(8) && off + 8 <= self.mem.mapped.len());
        // SAFETY: `off` is an 8-aligned offset of a u64 field inside the mapped block,
        // which lives as long as self; AtomicU64 has the layout of u64.
        unsafe { &*(self.base.add(off) as *const AtomicU64) }
    }
    fn u32_at(&self, off: usize) -> &AtomicU32 {
        debug_assert!(off.is_multiple_of(4) && off + 4 <= self.mem.mapped.len());
        // SAFETY: as u64_at, for a 4-aligned u32 field.
        unsafe { &*(self.base.add(off) as *const AtomicU32) }
    }
    // Control block fields (offsets from ringkernel-core's ControlBlock).
    fn cb_command(&self) -> &AtomicU32 {
        self.u32_at(std::mem::offset_of!(ControlBlock, command))
    }
    fn cb_command_seq(&self) -> &AtomicU32 {
        self.u32_at(std::mem::offset_of!(ControlBlock, command_seq))
    }
    fn cb_command_ack(&self) -> &AtomicU32 {
        self.u32_at(std::mem::offset_of!(ControlBlock, command_ack))
    }
    fn device_state(&self) -> u32 {
        self.u32_at(std::mem::offset_of!(ControlBlock, state))
            .load(Ordering::Acquire)
    }
    fn cb_u64(&self, off: usize) -> u64 {
        self.u64_at(off).load(Ordering::Acquire)
    }
    /// Offset of input lane `lane`'s queue header.
    fn lane_off(&self, lane: usize) -> usize {
        debug_assert!(lane < LANES);
        self.in_off + lane * self.lane_stride
    }
    /// Messages the device has taken from every input lane (the sum of the lanes'
    /// device-written heads).
    fn input_taken(&self) -> u64 {
        (0..LANES)
            .map(|l| {
                self.u64_at(self.lane_off(l) + std::mem::offset_of!(QueueHeader, head))
                    .load(Ordering::Acquire)
            })
            .fold(0u64, u64::wrapping_add)
    }
    /// Lane `lane`'s word of the [`LaneTails`] line (host-written, device-polled).
    fn lane_tail_word(&self, lane: usize) -> &AtomicU32 {
        debug_assert!(lane < LANES);
        self.u32_at(self.tails_off + std::mem::offset_of!(LaneTails, tail) + 4 * lane)
    }
    fn out_tail(&self) -> &AtomicU64 {
        self.u64_at(self.out_off + std::mem::offset_of!(QueueHeader, tail))
    }
    /// The latency ring (written by the device, one 64-bit store per entry).
    fn latency_ring(&self) -> &[AtomicU64] {
        debug_assert!(self.lat_off + LATENCY_RING_CAPACITY * 8 <= self.mem.mapped.len());
        // SAFETY: the ring is LATENCY_RING_CAPACITY 8-aligned u64 inside the mapped
        // block, which lives as long as self; the device only stores whole words.
        unsafe {
            std::slice::from_raw_parts(
                self.base.add(self.lat_off).cast::<AtomicU64>(),
                LATENCY_RING_CAPACITY,
            )
        }
    }

    /// Folds the device's new latency samples into the histogram and logs newly
    /// dropped messages with their reason. Cheap when nothing changed (host reads of
    /// mapped host memory only).
    fn collect_metrics(&self) {
        let folded = lock(&self.latency_reader).fold(self.latency_ring(), &self.latency);
        if folded.lost > 0 {
            tracing::debug!(kernel = %self.name, lost = folded.lost, "latency samples overwritten before the host read them");
        }
        let dropped = self.cb_u64(std::mem::offset_of!(ControlBlock, dropped));
        let before = self.seen_dropped.swap(dropped, Ordering::AcqRel);
        if dropped > before {
            let code = self
                .u32_at(std::mem::offset_of!(ControlBlock, last_error))
                .load(Ordering::Acquire);
            tracing::warn!(
                kernel = %self.name,
                count = dropped - before,
                reason = %drop_reason(code),
                "messages dropped on the device"
            );
        }
    }

    /// Records that the kernel has exited (its stream is idle).
    fn mark_exited(&self) {
        self.exited.store(true, Ordering::Release);
        if self.counted.swap(false, Ordering::AcqRel) {
            crate::driver::RUNNING_PERSISTENT_KERNELS.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// The `command` / `command_seq` words of the [`LaneTails`] line, where the kernel
    /// polls them (the control block keeps its copy for the record).
    fn polled_command(&self) -> (&AtomicU32, &AtomicU32) {
        (
            self.u32_at(self.tails_off + std::mem::offset_of!(LaneTails, command)),
            self.u32_at(self.tails_off + std::mem::offset_of!(LaneTails, command_seq)),
        )
    }

    fn send_command(&self, cmd: u32) -> u32 {
        let mut seq = lock(&self.command);
        *seq = seq.wrapping_add(1);
        self.cb_command().store(cmd, Ordering::Relaxed);
        self.cb_command_seq().store(*seq, Ordering::Relaxed);
        let (c, s) = self.polled_command();
        c.store(cmd, Ordering::Relaxed);
        // Release: the device reads command_seq, then (after a fence) command.
        s.store(*seq, Ordering::Release);
        *seq
    }

    fn wait_ack(&self, seq: u32, timeout: Duration) -> bool {
        let start = Instant::now();
        let mut spins = 0u32;
        // Acknowledged once the device's ack reaches `seq` (a later command's ack counts).
        while (self
            .cb_command_ack()
            .load(Ordering::Acquire)
            .wrapping_sub(seq) as i32)
            < 0
        {
            if self.exited.load(Ordering::Acquire) || start.elapsed() > timeout {
                return false;
            }
            spins += 1;
            if spins < 1000 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        true
    }

    /// Moves every reply in the output ring into the host-side spill queue (corrupt
    /// ones are logged and dropped: the ring validates every slot).
    fn spill(&self) {
        let mut c = lock(&self.consumer);
        let Consumer { ring, spill } = &mut *c;
        loop {
            let r = ring.try_pop_batch_with(usize::MAX, |header, payload| {
                spill.push_back(Envelope {
                    header: *header,
                    payload: payload.to_vec(),
                })
            });
            match r {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(kernel = %self.name, error = %e, "dropping a corrupt reply")
                }
            }
        }
    }

    /// Makes sure the kernel has exited (used on drop and failed launches): asks it to
    /// terminate, keeps its output queue drained, waits for the stream. Blocking.
    fn force_exit(&self) {
        if self.exited.load(Ordering::Acquire) {
            return;
        }
        if self.device_state() != LifecycleState::Terminated as u32 {
            self.send_command(command::TERMINATE);
        }
        let start = Instant::now();
        while self.device_state() != LifecycleState::Terminated as u32 {
            self.spill();
            match self.stream.is_idle() {
                Ok(true) | Err(_) => break,
                Ok(false) => {}
            }
            if start.elapsed() > EXIT_TIMEOUT {
                tracing::error!(kernel = %self.name, "persistent kernel did not exit; its memory is leaked");
                if let Some(rt) = self.rt.upgrade() {
                    // Never free memory a running kernel may touch.
                    std::mem::forget(rt.memory.lock().map(|mut m| std::mem::take(&mut *m)));
                }
                return;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        let _ = self.stream.synchronize();
        self.mark_exited();
    }

    /// Makes the device's counters exact for the caller: the kernel writes them after
    /// each batch without a fence (off the reply path), so a reply can be seen before
    /// the counts that include it; every command is acknowledged only after the
    /// counters, fenced. So this repeats the last command (the device applies it again:
    /// no change) and waits for the acknowledgement: microseconds while the kernel runs
    /// (a handler that runs long delays it, up to 100 ms); nothing once it has exited.
    fn flush_counters(&self) {
        if self.exited.load(Ordering::Acquire)
            || self.device_state() == LifecycleState::Terminated as u32
        {
            return;
        }
        let seq = {
            let mut seq = lock(&self.command);
            *seq = seq.wrapping_add(1);
            self.cb_command_seq().store(*seq, Ordering::Relaxed);
            self.polled_command().1.store(*seq, Ordering::Release);
            *seq
        };
        if !self.wait_ack(seq, Duration::from_millis(100)) {
            tracing::debug!(kernel = %self.name, "counters not flushed within 100 ms");
        }
    }

    /// Writes the host-side indices into the control block's host line (they are not
    /// written per message: the device polls that line for commands).
    fn mirror_host_indices(&self) {
        let tail = lock(&self.send.lanes)
            .iter()
            .map(StampedProducer::published)
            .fold(0u64, u64::wrapping_add);
        let head = lock(&self.consumer).ring.position();
        self.u64_at(std::mem::offset_of!(ControlBlock, input_tail))
            .store(tail, Ordering::Relaxed);
        self.u64_at(std::mem::offset_of!(ControlBlock, output_head))
            .store(head, Ordering::Relaxed);
    }

    /// Writes as many of `msgs` as fit into the input lanes ([`push_into_lanes`]) and
    /// mirrors each lane's new tail into its [`LaneTails`] word, which the device polls.
    /// Returns how many were written (a prefix of `msgs`). A payload that does not fit
    /// a slot is `MessageTooLarge` (messages before it stay written).
    fn send_batch<'a>(
        &self,
        msgs: impl IntoIterator<Item = (&'a MessageHeader, &'a [u8])>,
    ) -> Result<usize> {
        let msgs: Vec<(&MessageHeader, &[u8])> = msgs.into_iter().collect();
        if msgs.len() >= SPLIT_BATCH {
            return self.send_split(&msgs);
        }
        let mut lanes = lock(&self.send.lanes);
        if !self.lifecycle.get().accepts_messages() {
            return Err(Error::KernelTerminated(self.name.clone()));
        }
        let (written, result) = push_into_lanes(&mut lanes, msgs, |lane, tail| {
            // After the ring's own release store of its tail (its slots are published);
            // the low 32 bits are what the device compares with its head of the lane.
            self.lane_tail_word(lane)
                .store(tail as u32, Ordering::Release);
        });
        if written > 0 {
            // Under the lock, so a load and a store (no locked instruction).
            let r = &self.send.received;
            r.store(
                r.load(Ordering::Relaxed) + written as u64,
                Ordering::Relaxed,
            );
        }
        drop(lanes);
        if written > 0 {
            self.waker.wake();
        }
        result.map(|()| written)
    }

    /// [`send_batch`](Self::send_batch) for a long batch: each run of one lane is
    /// reserved under the lanes' lock, encoded outside it (so several threads encode at
    /// once), then published under it again, in index order ([`StampedProducer::finish`]:
    /// a run finished before an earlier one waits for it). Same result as the short
    /// path: a prefix, stopped by a full lane or an oversized payload.
    fn send_split(&self, msgs: &[(&MessageHeader, &[u8])]) -> Result<usize> {
        let mut written = 0usize;
        while written < msgs.len() {
            let lane = priority::lane(msgs[written].0.priority());
            // The run: this lane's messages, up to the first that does not fit a slot
            // (checked before reserving: a reserved slot must be written).
            let mut end = written;
            let mut too_large = None;
            while end < msgs.len() && priority::lane(msgs[end].0.priority()) == lane {
                if let Err(e) = check_payload_fits(msgs[end].1.len(), self.slot) {
                    too_large = Some(e);
                    break;
                }
                end += 1;
            }
            let run = end - written;
            if run == 0 {
                // The first message of the run does not fit a slot.
                return too_large.map_or(Ok(written), Err);
            }
            let (first, n, mut writer) = {
                let mut lanes = lock(&self.send.lanes);
                if !self.lifecycle.get().accepts_messages() {
                    return if written == 0 {
                        Err(Error::KernelTerminated(self.name.clone()))
                    } else {
                        Ok(written)
                    };
                }
                let ring = &mut lanes[lane];
                let (first, n) = ring.reserve(run);
                if n == 0 {
                    // The lane is full.
                    return Ok(written);
                }
                self.send.writing.fetch_add(1, Ordering::Relaxed);
                (first, n, ring.slot_writer())
            };
            let mut failed = None;
            for (k, (h, p)) in msgs[written..written + n].iter().enumerate() {
                // SAFETY: `first + k` lies in the range reserved above, finished only
                // below; the ring lives in `self.mem` as long as `self`.
                if let Err(e) = unsafe { writer.write(first + k as u64, h, p) } {
                    // Not reached: every payload of the run was checked to fit.
                    failed.get_or_insert(e);
                }
            }
            {
                let mut lanes = lock(&self.send.lanes);
                let tail = lanes[lane].finish(first, n);
                self.lane_tail_word(lane)
                    .store(tail as u32, Ordering::Release);
                let r = &self.send.received;
                r.store(r.load(Ordering::Relaxed) + n as u64, Ordering::Relaxed);
                self.send.writing.fetch_sub(1, Ordering::Release);
            }
            self.waker.wake();
            written += n;
            if let Some(e) = failed {
                return Err(e);
            }
            if n < run {
                // The lane filled up before the run's end.
                return Ok(written);
            }
            if let Some(e) = too_large {
                return Err(e);
            }
        }
        Ok(written)
    }

    /// Takes up to `max` replies out of the output queue, calling `f` on each in place
    /// (no copy), and frees their slots with one store. Every slot is validated as on
    /// [`try_dequeue`](KernelEngine::try_dequeue) (core's
    /// [`StampedConsumer::try_pop_batch_with`]): a corrupt one is consumed and reported
    /// as an error after the replies before it. Returns how many were taken.
    ///
    /// The latest timestamp of the replies taken is merged into the host clock (one
    /// `update` per batch: a kernel's reply stamps increase, so the latest covers the
    /// others), as `KernelHandle`'s receive path merges each reply.
    fn receive_batch(&self, max: usize, f: &mut dyn FnMut(&MessageHeader, &[u8])) -> Result<usize> {
        let mut latest: Option<HlcTimestamp> = None;
        let mut g = |h: &MessageHeader, payload: &[u8]| {
            latest = latest.max(Some(h.hlc()));
            f(h, payload)
        };
        let mut c = lock(&self.consumer);
        let mut taken = 0usize;
        while taken < max {
            let Some(env) = c.spill.pop_front() else {
                break;
            };
            g(&env.header, &env.payload);
            taken += 1;
        }
        // The device's tail hint: every slot before it has been handed out (a hint
        // behind the head, which a slower block's store can leave, reads as far ahead).
        let upto = c.ring.announced();
        let ahead = upto.wrapping_sub(c.ring.position());
        let result = if taken == max {
            drop(c);
            Ok(0)
        } else if (SPLIT_BATCH as u64..=self.out_cap as u64).contains(&ahead) {
            // A long backlog: claimed under the lock, read outside it, so several
            // threads read replies at once.
            let (first, n) = c.ring.claim((max - taken).min(SPLIT_CLAIM_MAX), upto);
            let mut reader = c.ring.slot_reader();
            drop(c);
            let mut r = read_claimed(&mut reader, first, n, false, &mut g);
            let mut c = lock(&self.consumer);
            let mut count = n;
            if let Ok(done) = r {
                if done < n {
                    // The rest is still being written: give it back if no later claim
                    // follows, else wait for it (a later claim's replies cannot be freed
                    // before these).
                    if c.ring.shrink_claim(first, n, done) {
                        count = done;
                    } else {
                        drop(c);
                        let start = first.wrapping_add(done as u64);
                        r = read_claimed(&mut reader, start, n - done, true, &mut g)
                            .map(|more| done + more);
                        c = lock(&self.consumer);
                    }
                }
            }
            c.ring.release(first, count);
            match r {
                Ok(done) => Ok(done),
                Err((e, rest)) => {
                    // Replies after a corrupt one wait in the spill, first in line.
                    for env in rest.into_iter().rev() {
                        c.spill.push_front(env);
                    }
                    Err(e)
                }
            }
        } else {
            c.ring.try_pop_batch_with(max - taken, &mut g)
        };
        if let (Some(ts), Some(rt)) = (latest, self.rt.upgrade()) {
            if let Err(e) = rt.core.hlc().update(&ts) {
                tracing::warn!(kernel = %self.name, error = %e, "reply timestamp not merged into the host clock");
            }
        }
        Ok(taken + result?)
    }

    /// The messages left in the input lanes once the kernel has exited, read (and
    /// validated) through consumers over the input rings that take the exited device's
    /// place; highest lane first, FIFO within a lane (the order the kernel would have
    /// handled them in).
    fn take_undelivered(&self) -> Result<Vec<Envelope>> {
        debug_assert!(self.exited.load(Ordering::Acquire));
        // Senders that reserved slots before the kernel began terminating may still be
        // writing them outside the lock (`send_split`): what they write is handed back
        // too, so wait for them (no new reservation is made once terminating).
        let _lanes = loop {
            let lanes = lock(&self.send.lanes);
            if self.send.writing.load(Ordering::Acquire) == 0 {
                break lanes;
            }
            drop(lanes);
            std::thread::yield_now();
        };
        let mut undelivered = Vec::new();
        for lane in (0..LANES).rev() {
            let off = self.lane_off(lane);
            // SAFETY: the kernel has exited (its stream is idle), so the device consumer
            // is gone and this is the only consumer of the lane's ring, which lies
            // inside the mapped block that `self.mem` keeps; the producers are locked
            // above, so no slot is written meanwhile.
            let mut ring = unsafe {
                StampedConsumer::from_raw_parts(
                    ring_header(self.base, off),
                    ring_slots(self.base, off),
                    None,
                )?
            };
            loop {
                match ring.try_pop() {
                    Ok(Some(env)) => undelivered.push(env),
                    Ok(None) => break,
                    Err(e) => {
                        tracing::warn!(kernel = %self.name, lane, error = %e, "corrupt undelivered message")
                    }
                }
            }
        }
        Ok(undelivered)
    }

    async fn terminate_impl(&self) -> Result<TerminateReport> {
        let prev = {
            let _lanes = lock(&self.send.lanes);
            self.lifecycle.transition(LifecycleState::Terminating)?
        };
        self.events.state.notify(usize::MAX);
        // Drained: every message taken during the drain, handled or dropped.
        let taken = || {
            self.cb_u64(std::mem::offset_of!(ControlBlock, processed))
                + self.cb_u64(std::mem::offset_of!(ControlBlock, dropped))
        };
        self.flush_counters();
        let taken_before = taken();
        let _ = prev;
        self.send_command(command::TERMINATE);
        let start = Instant::now();
        // The kernel has returned once its stream is idle. That is polled, not waited
        // for with a blocking synchronise, which would hold this executor thread for as
        // long as the kernel drains, and gives up after EXIT_TIMEOUT. (Under
        // compute-sanitizer the stream does not go idle while any other kernel of the
        // device runs: scripts/sanitizer_probe.cu, mode end-beside.)
        loop {
            match self.stream.is_idle() {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) => {
                    self.mark_exited();
                    return Err(e);
                }
            }
            // Keep the output ring drained so a draining kernel never waits for space.
            if lock(&self.consumer).ring.len() >= self.out_cap / 2 {
                self.spill();
                self.events.output.notify(usize::MAX);
            }
            if start.elapsed() > EXIT_TIMEOUT {
                return Err(Error::Timeout(EXIT_TIMEOUT));
            }
            futures_timer::Delay::new(Duration::from_micros(100)).await;
        }
        self.mark_exited();
        let taken_after = taken();
        // Whatever is still in the input queue was not processed: hand it back.
        let undelivered = self.take_undelivered()?;
        self.collect_metrics();
        let replies_waiting = self.output_depth();
        self.mirror_host_indices();
        self.lifecycle.transition(LifecycleState::Terminated)?;
        if let Some(rt) = self.rt.upgrade() {
            lock(&rt.kernels).retain(|k| k.id != self.id);
            rt.waker.generation.fetch_add(1, Ordering::Release);
        }
        self.events.notify_all();
        Ok(TerminateReport {
            drained: taken_after.saturating_sub(taken_before),
            undelivered,
            replies_waiting,
        })
    }
}

impl Drop for CudaEngine {
    fn drop(&mut self) {
        self.force_exit();
    }
}

impl KernelEngine for CudaEngine {
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
        self.slot
    }
    /// Every input lane together: [`LANES`] × `queue_capacity`.
    fn input_capacity(&self) -> usize {
        self.in_cap
    }

    /// Into the lane of `header.priority()`; [`Error::QueueFull`] (with the lane's
    /// capacity, `queue_capacity`) when that lane is full, whatever the other lanes hold.
    fn try_enqueue(&self, header: &MessageHeader, payload: &[u8]) -> Result<()> {
        // The ring checks the size before the space, so an oversized payload is
        // `MessageTooLarge`, never `QueueFull`.
        if self.send_batch(std::iter::once((header, payload)))? == 0 {
            return Err(Error::QueueFull {
                capacity: self.in_cap,
            });
        }
        Ok(())
    }

    fn try_dequeue(&self) -> Result<Option<Envelope>> {
        let mut c = lock(&self.consumer);
        if let Some(env) = c.spill.pop_front() {
            return Ok(Some(env));
        }
        c.ring.try_pop()
    }

    fn output_depth(&self) -> usize {
        let c = lock(&self.consumer);
        c.spill.len() + c.ring.len()
    }

    fn activate(&self) -> Result<()> {
        self.lifecycle.transition(LifecycleState::Active)?;
        self.send_command(command::ACTIVATE);
        self.events.state.notify(usize::MAX);
        Ok(())
    }

    fn deactivate(&self) -> Result<()> {
        self.lifecycle.transition(LifecycleState::Deactivated)?;
        let seq = self.send_command(command::DEACTIVATE);
        // Wait for the device to acknowledge (microseconds), so no message sent after
        // this returns is processed before the next activate.
        if !self.wait_ack(seq, Duration::from_secs(5)) {
            tracing::warn!(kernel = %self.name, "the device did not acknowledge deactivate within 5 s");
        }
        self.events.state.notify(usize::MAX);
        Ok(())
    }

    fn terminate(&self) -> BoxFuture<'_, Result<TerminateReport>> {
        Box::pin(self.terminate_impl())
    }

    fn accepts(&self, header: &MessageHeader) -> Result<()> {
        check_accepts(&self.name, &self.inputs, header)
    }

    fn events(&self) -> &KernelEvents {
        &self.events
    }

    fn metrics(&self) -> KernelMetrics {
        self.flush_counters();
        let processed = self.cb_u64(std::mem::offset_of!(ControlBlock, processed));
        let dropped = self.cb_u64(std::mem::offset_of!(ControlBlock, dropped));
        let emitted = self.out_tail().load(Ordering::Acquire);
        let queue_depth = lock(&self.send.lanes)
            .iter()
            .map(StampedProducer::depth)
            .sum();
        self.mirror_host_indices();
        self.collect_metrics();
        KernelMetrics {
            id: self.id,
            name: self.name.clone(),
            state: self.state(),
            received: self.send.received.load(Ordering::Relaxed),
            processed,
            dropped,
            emitted,
            queue_depth,
            output_depth: self.output_depth(),
            latency: self.latency.summary(),
        }
    }
}

fn pump_loop(rt: Weak<RtInner>, waker: Arc<PumpWaker>) {
    let mut idle_since = Instant::now();
    // Indices of the kernels that took messages in this round (reused: no allocation
    // per round).
    let mut moved: Vec<usize> = Vec::new();
    // The pump's copy of the runtime's kernels, taken again when their list changes.
    let mut kernels: Vec<Arc<CudaEngine>> = Vec::new();
    let mut generation = u64::MAX;
    // After a park: read every consumer's head this round (replies may have gone by).
    let mut woke = false;
    // Rounds since the pump last read the consumers' heads (every 256th round).
    let mut rounds = 0u32;
    loop {
        if waker.stop.load(Ordering::Acquire) {
            return;
        }
        let g = waker.generation.load(Ordering::Acquire);
        if g != generation {
            let Some(inner) = rt.upgrade() else { return };
            kernels = lock(&inner.kernels).clone();
            generation = g;
        }
        let mut activity = false;
        moved.clear();
        // The pump writes only its own lines (`PumpSeen`), and reads the words the
        // device writes; the consumer's head (which the receiving thread writes after
        // every reply) only every 256th round.
        for (i, k) in kernels.iter().enumerate() {
            let mut m = false;
            let seen = &k.seen;
            // A reply that has begun to arrive (stamps, not an index: the device
            // publishes no index ordered after its replies), followed index by index
            // from where the pump last looked, one slot a round (each slot the pump
            // reads is one more cache line the device's next write there must take
            // back). The consumer's head only says where to start, and lets a pump that
            // fell behind (streaming, or parked) catch up.
            let mut next = seen.next_reply.load(Ordering::Relaxed);
            if next == u64::MAX || rounds == 0 || woke {
                let head = k.watcher.head();
                if next == u64::MAX || head > next {
                    next = head;
                }
            }
            if k.watcher.started(next) {
                next += 1;
                k.events.output.notify(usize::MAX);
                m = true;
            }
            seen.next_reply.store(next, Ordering::Relaxed);
            let h = k.input_taken();
            if seen.in_head.load(Ordering::Relaxed) != h {
                seen.in_head.store(h, Ordering::Relaxed);
                k.events.input_space.notify(usize::MAX);
                m = true;
            }
            let s = k.device_state();
            if seen.state.load(Ordering::Relaxed) != s {
                seen.state.store(s, Ordering::Relaxed);
                k.events.state.notify(usize::MAX);
            }
            if m {
                moved.push(i);
                activity = true;
            }
        }
        woke = false;
        rounds = (rounds + 1) % 256;
        // After every notification (off the reply path): fold the latency samples of
        // the kernels that took messages. `metrics()` folds too, so samples that
        // become visible after this pass are never missed.
        for &i in &moved {
            kernels[i].collect_metrics();
        }
        let now = Instant::now();
        if activity {
            idle_since = now;
        }
        let idle = now - idle_since;
        if idle < Duration::from_millis(2) {
            std::hint::spin_loop();
        } else if idle < Duration::from_millis(20) {
            std::thread::yield_now();
        } else {
            // A send wakes us (PumpWaker); the timeout bounds the latency of replies
            // that arrive without a send (K2K pipelines, long handlers).
            waker.parked.store(true, Ordering::Release);
            std::thread::park_timeout(Duration::from_millis(1));
            woke = true;
            // `parked` already false: a sender woke us, so work is coming: spin again.
            if !waker.parked.swap(false, Ordering::AcqRel) {
                idle_since = Instant::now();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringkernel_core::builtin::Token;
    use ringkernel_core::message::{flags, RingMessage};

    #[test]
    fn block_size_must_be_whole_warps() {
        check_launch_options(&LaunchOptions::default()).unwrap();
        check_launch_options(&LaunchOptions::default().with_grid_size(4)).unwrap();
        for bad in [48, 544, 1024] {
            match check_launch_options(&LaunchOptions::default().with_block_size(bad)) {
                Err(Error::InvalidArgument(m)) => assert!(m.contains("multiple of 32"), "{m}"),
                other => panic!("block_size {bad} must be refused, got {other:?}"),
            }
        }
        // inbox_threads: whole warps, one warp left for the host's input.
        let sink = LaunchOptions::default().with_block_size(512);
        check_launch_options(&sink.clone().with_inbox_threads(480)).unwrap();
        for bad in [48, 500, 512] {
            match check_launch_options(&sink.clone().with_inbox_threads(bad)) {
                Err(Error::InvalidArgument(m)) => assert!(m.contains("inbox_threads"), "{m}"),
                other => panic!("inbox_threads {bad} must be refused, got {other:?}"),
            }
        }
        // The options' own checks still come first.
        assert!(matches!(
            check_launch_options(&LaunchOptions::default().with_block_size(0)),
            Err(Error::InvalidArgument(_))
        ));
    }

    #[test]
    fn take_marks_match_the_kernel_and_unpack_in_order() {
        // The kernel keeps RK_MARKS clock readings and sends their differences.
        let n: usize = TEMPLATE_SRC
            .lines()
            .find_map(|l| l.strip_prefix("#define RK_MARKS "))
            .expect("RK_MARKS in persistent.cu")
            .trim()
            .parse()
            .unwrap();
        assert_eq!(n - 1, TAKE_MARKS.len());
        // Every reading is taken somewhere: 10 and 11 inside rk_run_handler.
        for i in (0..n).filter(|i| ![10, 11].contains(i)) {
            assert!(
                TEMPLATE_SRC.contains(&format!("RK_MARK({i});")),
                "no RK_MARK({i})"
            );
        }
        assert!(TEMPLATE_SRC.contains("mk + 10"));
        // Four a word from the low bits, in words 11..=15 of a 16-word entry.
        assert!(TAKE_MARKS.len().div_ceil(4) <= 5);
        let words: Vec<u64> = (0..5u64)
            .map(|w| (0..4u64).map(|j| (w * 4 + j + 1) << (16 * j)).sum())
            .collect();
        let m = unpack_marks(&words);
        assert!(
            m.iter().enumerate().all(|(i, &c)| c as usize == i + 1),
            "{m:?}"
        );
    }

    #[test]
    fn builtins_are_registered_without_replacing_a_users_cuda_source() {
        let reg = KernelRegistry::new();
        reg.register_gpu(GpuHandler::new(ECHO).with_cuda("// mine"));
        reg.register_gpu(GpuHandler::new(STAGE).with_wgsl("// wgsl only"));
        register_missing_cuda_builtins(&reg);
        assert_eq!(reg.gpu(ECHO).unwrap().cuda.as_deref(), Some("// mine"));
        let stage = reg.gpu(STAGE).unwrap();
        assert!(stage.cuda.unwrap().contains("handle("));
        assert_eq!(stage.wgsl.as_deref(), Some("// wgsl only"));
        let counter = reg.gpu(COUNTER).unwrap();
        assert_eq!(counter.state_bytes, 8);
        // The explicit registration replaces CUDA sources.
        register_cuda_builtins(&reg);
        assert_ne!(reg.gpu(ECHO).unwrap().cuda.as_deref(), Some("// mine"));
    }

    fn lanes(cap: usize) -> (Vec<StampedProducer>, Vec<StampedConsumer>) {
        (0..LANES)
            .map(|_| ringkernel_core::queue::stamped::stamped_channel(cap, 128).unwrap())
            .unzip()
    }

    #[test]
    fn the_block_plan_splits_warps_and_fits_its_staging() {
        // (host threads, host window, inbox window, stride, bytes, in shared memory)
        let (h, hw, iw, stride, bytes, shared) = block_plan(128, 256, 96 * 1024, None);
        assert_eq!((h, hw, iw, stride, shared), (96, 96, 32, 272, true));
        assert!(bytes <= 96 * 1024);
        // One warp: one group, no inbox group.
        let (h, _, iw, ..) = block_plan(32, 256, 96 * 1024, None);
        assert_eq!((h, iw), (32, 0));
        // A quarter of a big block serves the inbox; windows shrink to fit.
        let (h, hw, iw, _, bytes, shared) = block_plan(512, 256, 64 * 1024, None);
        assert_eq!(h, 384);
        assert!(
            shared && bytes <= 64 * 1024 && hw < 384 && iw <= 128 && hw > iw,
            "{hw} {iw}"
        );
        // A K2K sink (inbox_threads 480 of 512): the inbox's window is the larger, and
        // larger than the default split gives it, in the same budget.
        let (_, _, iw_default, ..) = block_plan(512, 128, 96 * 1024, None);
        let (h, hw, iw, _, bytes, shared) = block_plan(512, 128, 96 * 1024, Some(480));
        assert_eq!(h, 32);
        assert!(
            shared && bytes <= 96 * 1024 && iw > hw && iw > 2 * iw_default && iw <= 480,
            "{hw} {iw} (default {iw_default})"
        );
        // Values the launch refuses are not trusted here either: whole warps, one left
        // for the host lanes, none of the sizes underflowing.
        for (inbox, host) in [
            (Some(1000), 32),
            (Some(500), 32),
            (Some(0), 96),
            (Some(40), 96),
        ] {
            assert_eq!(block_plan(128, 256, 96 * 1024, inbox).0, host, "{inbox:?}");
        }
        // Slots too big for shared memory: staged in device memory, a small window.
        let (_, hw, iw, _, bytes, shared) = block_plan(128, 1 << 16, 96 * 1024, None);
        assert!(
            !shared && hw >= 1 && iw >= 1 && bytes <= 96 * 1024,
            "{hw} {iw} {bytes}"
        );
    }

    fn with_priority(p: u8, id: u64) -> MessageHeader {
        let mut h = MessageHeader::new(7, 8);
        h.message_id = id;
        h.set_priority(p);
        h
    }

    /// The message ids waiting in a lane, in order.
    fn ids(c: &mut StampedConsumer) -> Vec<u64> {
        let mut v = Vec::new();
        c.try_pop_batch_with(usize::MAX, |h, _| v.push(h.message_id))
            .unwrap();
        v
    }

    #[test]
    fn messages_go_to_the_lane_of_their_priority_in_runs() {
        let (mut tx, mut rx) = lanes(8);
        let ps = [
            priority::LOW,
            priority::LOW,
            priority::HIGH,
            priority::NORMAL - 1, // still the low lane
            priority::CRITICAL,
            255,
            priority::NORMAL,
            priority::HIGH - 1, // still the normal lane
        ];
        let hs: Vec<MessageHeader> = ps
            .iter()
            .enumerate()
            .map(|(i, &p)| with_priority(p, i as u64))
            .collect();
        let payload = [0u8; 8];
        let mut published = Vec::new();
        let (n, r) = push_into_lanes(
            &mut tx,
            hs.iter().map(|h| (h, &payload[..])),
            |lane, tail| published.push((lane, tail)),
        );
        r.unwrap();
        assert_eq!(n, 8);
        // One publish per run of one lane, with the ring's new tail.
        assert_eq!(
            published,
            vec![(0, 2), (2, 1), (0, 3), (3, 2), (1, 2)],
            "runs: LOW LOW | HIGH | 63 | CRITICAL 255 | NORMAL 127"
        );
        assert_eq!(ids(&mut rx[0]), vec![0, 1, 3]);
        assert_eq!(ids(&mut rx[1]), vec![6, 7]);
        assert_eq!(ids(&mut rx[2]), vec![2]);
        assert_eq!(ids(&mut rx[3]), vec![4, 5]);
    }

    #[test]
    fn a_full_lane_stops_the_batch_so_a_prefix_is_written() {
        let (mut tx, mut rx) = lanes(2);
        let hs: Vec<MessageHeader> = [priority::LOW; 3]
            .into_iter()
            .chain([priority::HIGH])
            .enumerate()
            .map(|(i, p)| with_priority(p, i as u64))
            .collect();
        let payload = [0u8; 8];
        let mut published = Vec::new();
        let (n, r) = push_into_lanes(
            &mut tx,
            hs.iter().map(|h| (h, &payload[..])),
            |lane, tail| published.push((lane, tail)),
        );
        r.unwrap();
        // The low lane holds two; the HIGH message after the third is not sent either
        // (senders get a prefix of their batch, never a gap).
        assert_eq!(n, 2);
        assert_eq!(published, vec![(0, 2)]);
        assert_eq!(ids(&mut rx[0]), vec![0, 1]);
        assert!(ids(&mut rx[2]).is_empty());
        // A full lane does not block the others.
        let (n, r) = push_into_lanes(&mut tx, [(&hs[3], &payload[..])], |_, _| {});
        r.unwrap();
        assert_eq!(n, 1);
        assert_eq!(ids(&mut rx[2]), vec![3]);
        // The low lane was emptied above: two fit again.
        let (n, r) = push_into_lanes(
            &mut tx,
            [(&hs[0], &payload[..]), (&hs[0], &payload[..])],
            |_, _| {},
        );
        r.unwrap();
        assert_eq!(n, 2);
        // Nothing at all fits: 0, no publish.
        let (n, r) = push_into_lanes(&mut tx, [(&hs[0], &payload[..])], |_, _| {
            panic!("nothing written, nothing published")
        });
        assert_eq!((n, r.is_ok()), (0, true));
    }

    #[test]
    fn an_oversized_payload_is_an_error_after_the_messages_before_it() {
        let (mut tx, mut rx) = lanes(4);
        let small = with_priority(priority::NORMAL, 1);
        let big = with_priority(priority::CRITICAL, 2);
        let after = with_priority(priority::NORMAL, 3);
        let big_payload = [0u8; 128]; // a 128-byte slot holds 64 payload bytes
        let mut published = Vec::new();
        let (n, r) = push_into_lanes(
            &mut tx,
            [
                (&small, &[1u8; 8][..]),
                (&big, &big_payload[..]),
                (&after, &[3u8; 8][..]),
            ],
            |lane, tail| published.push((lane, tail)),
        );
        assert!(matches!(r, Err(Error::MessageTooLarge { .. })), "{r:?}");
        assert_eq!(n, 1);
        assert_eq!(published, vec![(1, 1)]);
        assert_eq!(ids(&mut rx[1]), vec![1]);
        assert!(ids(&mut rx[3]).is_empty());
    }

    #[test]
    fn stream_priorities_follow_the_kernel_priority() {
        for range in [(0, -5), (0, -2), (0, 0), (3, 0)] {
            let at = |p| stream_priority(p, range);
            // LOW and NORMAL keep the default (least) priority.
            assert_eq!(at(priority::LOW), range.0, "{range:?}");
            assert_eq!(at(priority::NORMAL), range.0, "{range:?}");
            assert_eq!(at(priority::CRITICAL), range.1, "{range:?}");
            assert_eq!(at(255), range.1, "{range:?}");
            // HIGH lies in between, never past either end.
            let (lo, hi) = (range.0.min(range.1), range.0.max(range.1));
            assert!((lo..=hi).contains(&at(priority::HIGH)), "{range:?}");
        }
        assert_eq!(stream_priority(priority::HIGH, (0, -4)), -2);
    }

    /// Every persistent-kernel source of the built-ins and the layout kernel compile
    /// with NVRTC (a syntax error in the CUDA C would otherwise show only on a GPU
    /// machine). Needs NVRTC, not a GPU: `LD_LIBRARY_PATH=<dir of libnvrtc.so> cargo
    /// test -p ringkernel-cuda --lib -- --ignored kernel_sources`.
    #[test]
    #[ignore = "needs NVRTC"]
    fn kernel_sources_compile_with_nvrtc() {
        // Each built-in as on one GPU and as in a multi-GPU group (system-scope K2K).
        let mut srcs: Vec<(String, String)> = builtin_handlers()
            .into_iter()
            .flat_map(|(name, src, _)| {
                [false, true].map(|group| {
                    (
                        format!("{name}{}", if group { "-group" } else { "" }),
                        persistent_source_for(&src, group),
                    )
                })
            })
            .collect();
        srcs.push(("layout".into(), crate::layout::layout_source()));
        // Turing (the oldest architecture CUDA 13 compiles for) and Hopper.
        for cc in [(7, 5), (9, 0)] {
            for (name, src) in &srcs {
                let cubin = crate::nvrtc::compile_cubin(src, name, cc, 0)
                    .unwrap_or_else(|e| panic!("{name} for sm_{}{}: {e}", cc.0, cc.1));
                assert!(cubin.starts_with(b"\x7fELF"), "{name}: not a cubin");
            }
        }
    }

    // ---- GPU tests (run with `cargo test -p ringkernel-cuda --lib -- --ignored`) ----

    fn on_gpu<F, Fut>(reg: KernelRegistry, f: F)
    where
        F: FnOnce(CudaRuntime) -> Fut,
        Fut: std::future::Future<Output = Result<()>>,
    {
        let exec = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap();
        exec.block_on(async {
            let rt = CudaRuntime::with_registry(reg).await.expect("CUDA runtime");
            f(rt).await.unwrap();
        });
    }

    /// Polls `cond` for up to 10 s.
    async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
        let start = Instant::now();
        while !cond() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "timed out waiting: {what}"
            );
            futures_timer::Delay::new(Duration::from_millis(1)).await;
        }
    }

    /// Host address of byte `byte` of the logical slot that holds message `index` of
    /// the stamped ring at `off` (unit `byte / 12`, after the units before it).
    fn slot_byte_addr(e: &CudaEngine, off: usize, cap: usize, index: u64, byte: usize) -> *mut u8 {
        let i = index as usize & (cap - 1);
        let unit = byte / UNIT_DATA;
        let at = i * stamped_slot_bytes(e.slot) + unit * 16 + byte % UNIT_DATA;
        // SAFETY: i < cap and byte < slot size, so the byte lies inside that ring of the
        // mapped block.
        unsafe { e.base.add(off + HEADER_LINE + at) }
    }

    fn token_header(flags_: u32) -> MessageHeader {
        let mut h = MessageHeader::new(Token::TYPE_ID, std::mem::size_of::<Token>());
        h.flags = flags_;
        h
    }

    /// `rk_hlc_next` (the persistent kernel's clock merge in closed form) gives what
    /// `rk_hlc_update` (no drift bound) or, for a remote time of 0, `rk_hlc_tick` give,
    /// over times around counter overflow, equal and crossing milliseconds, and a
    /// physical clock behind, equal to and ahead of both.
    #[test]
    #[ignore = "needs CUDA GPU"]
    fn hlc_next_matches_the_merge() {
        let reg = KernelRegistry::new();
        reg.register_gpu(GpuHandler::new("hlc.check").with_cuda(
            r#"
// Payload: triples (state, remote, pt_ms). Reply: {mismatches, then the first one's
// state, remote, pt_ms, merged, next}.
__device__ int handle(RkContext* ctx, const RkMessageHeader* in_hdr, const unsigned char* in_payload,
                      RkMessageHeader* out_hdr, unsigned char* out_payload, void* state) {
    (void)ctx; (void)state;
    const rk_u64* in = (const rk_u64*)in_payload;
    rk_u64* out = (rk_u64*)out_payload;
    rk_u64 bad = 0;
    for (rk_u32 i = 0; i < 6u; i++) out[i] = 0;
    for (rk_u32 i = 0; i + 3u <= in_hdr->payload_len / 8u; i += 3u) {
        const rk_u64 old = in[i], remote = in[i + 1], pt = in[i + 2];
        rk_u64 merged = old;
        if (remote == 0 || !rk_hlc_update(&merged, remote, pt, ~0ull >> 1)) merged = rk_hlc_tick(old, pt);
        const rk_u64 next = rk_hlc_next(old, remote, pt);
        if (merged != next) {
            if (bad == 0) {
                out[1] = old; out[2] = remote; out[3] = pt; out[4] = merged; out[5] = next;
            }
            bad++;
        }
    }
    out[0] = bad;
    out_hdr->payload_len = 48;
    return 1;
}
"#,
        ));
        on_gpu(reg, |rt| async move {
            let k = rt.launch("hlc.check", LaunchOptions::default()).await?;
            // Packed times around one millisecond `ms`: counters 0, 1, a middle one, the
            // last two before overflow.
            const BITS: u32 = 20;
            const MASK: u64 = (1 << BITS) - 1;
            let ms = 1_790_000_000_000u64;
            let times: Vec<u64> = (0..3)
                .flat_map(|dl| [0, 1, 77_777, MASK - 1, MASK].map(move |c| ((ms + dl) << BITS) | c))
                .collect();
            let mut triples = Vec::new();
            for &old in &times {
                for remote in std::iter::once(0).chain(times.iter().copied()) {
                    for pt in ms - 1..=ms + 3 {
                        triples.extend([old, remote, pt]);
                    }
                }
            }
            let mut checked = 0;
            for chunk in triples.chunks(24) {
                let bytes: Vec<u8> = chunk.iter().flat_map(|v| v.to_le_bytes()).collect();
                k.send_envelope(Envelope::from_bytes(0x51, &bytes)).await?;
                let r = k.receive_envelope(Some(Duration::from_secs(10))).await?;
                let w: Vec<u64> = r
                    .payload
                    .chunks(8)
                    .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
                    .collect();
                assert_eq!(
                    w[0],
                    0,
                    "rk_hlc_next differs (state, remote, pt_ms, merge, next): {:?}",
                    &w[1..6]
                );
                checked += chunk.len() / 3;
            }
            assert_eq!(checked, times.len() * (times.len() + 1) * 5);
            rt.shutdown().await?;
            Ok(())
        });
    }

    #[test]
    #[ignore = "needs CUDA GPU"]
    fn device_latency_samples_reach_the_histogram() {
        let reg = KernelRegistry::new();
        reg.register_gpu(GpuHandler::new("spin20us").with_cuda(
            r#"
__device__ int handle(RkContext* ctx, const RkMessageHeader* in_hdr, const unsigned char* in_payload,
                      RkMessageHeader* out_hdr, unsigned char* out_payload, void* state) {
    unsigned long long t0 = rk_globaltimer_ns();
    while (rk_globaltimer_ns() - t0 < 20000ull) {}
    for (unsigned i = 0; i < in_hdr->payload_len; i++) out_payload[i] = in_payload[i];
    (void)ctx; (void)out_hdr; (void)state;
    return 1;
}
"#,
        ));
        on_gpu(reg, |rt| async move {
            rt.preload("spin20us")?;
            let echo = rt.launch(ECHO, LaunchOptions::default()).await?;
            let spin = rt.launch("spin20us", LaunchOptions::default()).await?;
            for i in 0..1000 {
                echo.send(Token::new(i, 1.0)).await?;
            }
            for _ in 0..1000 {
                let _: Token = echo.receive_timeout_as(Duration::from_secs(10)).await?;
            }
            // Every reply was published after its sample: all 1000 are there.
            let m = echo.metrics();
            assert_eq!((m.processed, m.latency.count), (1000, 1000), "{m:?}");
            for i in 0..50 {
                spin.send(Token::new(i, 1.0)).await?;
            }
            for _ in 0..50 {
                let _: Token = spin.receive_timeout_as(Duration::from_secs(10)).await?;
            }
            let l = spin.metrics().latency;
            assert_eq!(l.count, 50, "{l:?}");
            assert!(l.p50_ns >= 20_000, "a 20 us handler measured {l:?}");
            assert!(l.max_ns < 100_000_000, "{l:?}");
            rt.shutdown().await?;
            Ok(())
        });
    }

    #[test]
    #[ignore = "needs CUDA GPU"]
    fn corrupt_replies_are_rejected_on_the_batch_and_single_read_paths() {
        on_gpu(KernelRegistry::new(), |rt| async move {
            let k = rt.launch(ECHO, LaunchOptions::default()).await?;
            let s = rt.streamer(&k)?;
            let e = s.kernel.clone();
            let h = token_header(0);
            for round in 0..2u64 {
                let toks: Vec<Token> = (0..3).map(|i| Token::new(round * 10 + i, 1.0)).collect();
                let msgs: Vec<_> = toks.iter().map(|t| (&h, bytemuck::bytes_of(t))).collect();
                assert_eq!(s.try_send_batch(msgs)?, 3);
                eventually("three replies", || e.output_depth() == 3).await;
                // The depth is a hint written beside the replies: let their units land.
                futures_timer::Delay::new(Duration::from_millis(20)).await;
                let head = lock(&e.consumer).ring.position();
                let bad = slot_byte_addr(&e, e.out_off, e.out_cap, head + 1, 0);
                // SAFETY: the reply is published and not being read (this test is the
                // only consumer); flipping the magic byte corrupts it in host memory.
                unsafe { *bad ^= 0xFF };
                let mut ids = Vec::new();
                let mut take = |_: &MessageHeader, p: &[u8]| {
                    ids.push(bytemuck::pod_read_unaligned::<Token>(p).id)
                };
                let err = if round == 0 {
                    s.try_receive_batch(usize::MAX, &mut take)
                        .expect_err("a corrupt reply fails the batch read")
                } else {
                    let first = e.try_dequeue()?.expect("first reply");
                    take(&first.header, &first.payload);
                    e.try_dequeue()
                        .expect_err("a corrupt reply fails try_dequeue")
                };
                assert!(
                    matches!(&err, Error::Device(m) if m.contains("magic")),
                    "{err}"
                );
                assert_eq!(s.try_receive_batch(usize::MAX, &mut take)?, 1);
                assert_eq!(ids, vec![round * 10, round * 10 + 2], "round {round}");
            }
            rt.shutdown().await?;
            Ok(())
        });
    }

    #[test]
    #[ignore = "needs CUDA GPU"]
    fn the_device_checks_flagged_checksums() {
        on_gpu(KernelRegistry::new(), |rt| async move {
            let k = rt.launch(ECHO, LaunchOptions::default()).await?;
            let s = rt.streamer(&k)?;
            let e = s.kernel.clone();
            let h = token_header(flags::CHECKSUM);
            let t = Token::new(1, 2.0);
            // A valid checksum passes (the device computes FNV-1a as the host does).
            assert_eq!(s.try_send_batch([(&h, bytemuck::bytes_of(&t))])?, 1);
            let r: Token = k.receive_timeout_as(Duration::from_secs(10)).await?;
            assert_eq!((r.id, r.value), (1, 4.0));
            // A payload changed after the checksum was taken is dropped with its reason.
            k.deactivate().await?;
            assert_eq!(s.try_send_batch([(&h, bytemuck::bytes_of(&t))])?, 1);
            let lane = priority::lane(h.priority());
            let idx = lock(&e.send.lanes)[lane].position() - 1;
            let byte = slot_byte_addr(
                &e,
                e.lane_off(lane),
                e.in_cap,
                idx,
                ringkernel_core::message::HEADER_SIZE,
            );
            // SAFETY: the kernel is deactivated, so the device does not take the slot
            // now; the payload's first byte lies inside it (its stamp is unchanged).
            unsafe { *byte ^= 1 };
            k.activate().await?;
            eventually("the corrupt message is dropped", || {
                k.metrics().dropped == 1
            })
            .await;
            let code = e
                .u32_at(std::mem::offset_of!(ControlBlock, last_error))
                .load(Ordering::Acquire);
            assert_eq!(code, crate::metrics::device_error::CHECKSUM);
            assert!(
                k.try_receive::<Token>()?.is_none(),
                "no reply for a dropped message"
            );
            // processed counts handled messages only, as on the other backends.
            let m = k.metrics();
            assert_eq!(
                (m.processed, m.dropped, m.latency.count),
                (1, 1, 1),
                "{m:?}"
            );
            rt.shutdown().await?;
            Ok(())
        });
    }
}
