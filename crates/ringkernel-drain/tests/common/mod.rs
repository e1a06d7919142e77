//! A CPU stand-in for the GPU side of a drain pass, following the protocol of
//! `ringkernel-shaders`' `kernels/drain.wgsl` and the built-in `Token` handlers
//! (`kernels/handlers/*.wgsl`): read requests from input slots, write each output to the
//! same slot of the output ring (its first 16 bytes, `drain::Output`: flags 0 and a
//! status for no output; the host writes the rest of the header), stamp the
//! pass's HLC into the token, advance the worker line of the control block, and report
//! completion from another thread, as a Metal completion handler does. Every other pass
//! hands its outputs over as bytes ([`PassOutputs::Slots`], as wgpu's readback does)
//! and poisons its slots in the output ring, so that the engine must read them there.

#![allow(dead_code)]

use ringkernel_core::builtin::Token;
use ringkernel_core::control::ControlBlock;
use ringkernel_core::message::{flags, MessageHeader, RingMessage, HEADER_SIZE};
use ringkernel_core::{Error, Result};
use ringkernel_drain::engine::{compact_len, slot_offset, DrainTarget, PassDone, PassOutputs};
use ringkernel_drain::shadow::HostRings;
use ringkernel_shaders::drain::Output;
use ringkernel_shaders::params;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What the stand-in handler does with one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handler {
    /// `rk.echo`: value · 2, hops + 1, reply.
    Echo,
    /// `rk.stage`: value + 1, hops + 1; K2K to `route[hops]` while hops < route_len.
    Stage,
    /// `rk.counter` (serial): value = messages seen so far (state), hops + 1, reply.
    Counter,
    /// Refuses every message with status 7.
    Refuse,
}

struct Mem(Box<[u64]>);

/// A request as the stand-in rebuilt it from a compact pass: its header and bytes.
pub type Request = (MessageHeader, Vec<u8>);

/// Host-visible memory of one kernel and the stand-in "device".
pub struct CpuTarget {
    rings: HostRings,
    state: *mut u8,
    _state: Mem,
    handler: Handler,
    slot_size: usize,
    /// Passes launched.
    pub passes: Arc<AtomicU64>,
    /// Makes every later launch fail.
    pub fail_launch: Arc<AtomicBool>,
    /// While set, a launched pass waits before it runs (a pass kept "in flight").
    pub hold: Arc<AtomicBool>,
    /// Passes allowed in flight (`DrainTarget::max_in_flight`); above 1, passes run in
    /// launch order but every third one reports `done` late, after later passes.
    pub in_flight: usize,
    /// The next pass (in launch order) allowed to run.
    order: Arc<(std::sync::Mutex<u64>, std::sync::Condvar)>,
    /// Passes launched and not done now, and the most seen at once.
    pub running: Arc<AtomicU64>,
    pub most_running: Arc<AtomicU64>,
    /// When set, the engine writes each pass's slots into a staging buffer
    /// (`DrainTarget::stage_input`, poisoned before it is handed out) and `launch`
    /// copies them into the input ring, as wgpu's upload buffers do; every pass must
    /// then come staged.
    pub stage: bool,
    /// When set, every pass is compact (`DrainTarget::stage_compact`, its buffer
    /// poisoned before it is handed out): `launch` rebuilds each request's header from
    /// the run table as the drain template does and writes the slots into the input
    /// ring.
    pub compact: bool,
    /// The requests of every compact pass, as `launch` rebuilt them (header and the
    /// payload's bytes), in pass order.
    pub seen: Arc<std::sync::Mutex<Vec<Request>>>,
    staged: std::sync::Mutex<Option<Vec<u8>>>,
    /// Passes whose slots came staged.
    pub staged_passes: Arc<AtomicU64>,
    /// The launch order (0, 1, ...) of the passes in the order their `done` was called.
    pub done_order: Arc<std::sync::Mutex<Vec<u64>>>,
}

// SAFETY (test stand-in): `state` addresses the boxed memory owned by `_state`, which
// lives as long as the target; host and "device" touch disjoint slots, as on a GPU, and
// passes of one kernel never overlap (the engine runs one at a time).
unsafe impl Send for CpuTarget {}
// SAFETY: as above.
unsafe impl Sync for CpuTarget {}

impl CpuTarget {
    /// Memory for rings of `capacity` slots of `slot_size` bytes.
    pub fn new(capacity: usize, slot_size: usize, handler: Handler) -> Self {
        let mut mem = Mem(vec![0u64; 2].into());
        let state = mem.0.as_mut_ptr().cast();
        CpuTarget {
            rings: HostRings::new(capacity, slot_size),
            state,
            _state: mem,
            handler,
            slot_size,
            passes: Arc::new(AtomicU64::new(0)),
            fail_launch: Arc::new(AtomicBool::new(false)),
            hold: Arc::new(AtomicBool::new(false)),
            in_flight: 1,
            order: Arc::new((std::sync::Mutex::new(0), std::sync::Condvar::new())),
            running: Arc::new(AtomicU64::new(0)),
            most_running: Arc::new(AtomicU64::new(0)),
            stage: false,
            compact: false,
            seen: Arc::default(),
            staged: std::sync::Mutex::new(None),
            staged_passes: Arc::new(AtomicU64::new(0)),
            done_order: Arc::default(),
        }
    }
}

#[derive(Clone, Copy)]
struct Ptrs(*mut u8, *mut u8, *mut u8, *mut u8);
// SAFETY: see CpuTarget.
unsafe impl Send for Ptrs {}

fn run_pass(ptrs: Ptrs, p: params::Drain, handler: Handler, slot_size: usize) {
    let Ptrs(input, output, control, state) = ptrs;
    let first = p.first_lo as u64 | ((p.first_hi as u64) << 32);
    let hlc = p.hlc_lo as u64 | ((p.hlc_hi as u64) << 32);
    for j in 0..p.count as u64 {
        let base = 128 + ((first + j) as usize & p.mask as usize) * slot_size;
        // SAFETY: the slot lies in the ring and belongs to this pass.
        let req: MessageHeader = unsafe { std::ptr::read_unaligned(input.add(base).cast()) };
        let mut tok: Token =
            unsafe { std::ptr::read_unaligned(input.add(base + HEADER_SIZE).cast()) };
        // What the template writes of the output's header (the rest is the host's).
        let mut out = Output::Message {
            flags: flags::REPLY,
            type_id: Token::TYPE_ID,
            payload_len: 72,
            dest_kernel: req.source_kernel,
        };
        let is_token = req.type_id == Token::TYPE_ID && req.payload_len == 72;
        if !req.is_valid() {
            // The template skips an invalid request without running the handler.
            out = Output::None {
                status: ringkernel_shaders::drain::ERR_INVALID_REQUEST,
            };
        } else if handler == Handler::Refuse || !is_token {
            out = Output::None {
                status: if is_token {
                    7
                } else {
                    ringkernel_shaders::drain::ERR_TYPE_MISMATCH
                },
            };
        } else {
            tok.stamps[tok.hops.min(3) as usize] = hlc;
            match handler {
                Handler::Echo => {
                    tok.value *= 2.0;
                    tok.hops += 1;
                }
                Handler::Stage => {
                    tok.value += 1.0;
                    tok.hops += 1;
                    if tok.hops < tok.route_len.min(4) {
                        out = Output::Message {
                            flags: flags::K2K,
                            type_id: Token::TYPE_ID,
                            payload_len: 72,
                            dest_kernel: tok.route[tok.hops as usize],
                        };
                    }
                }
                Handler::Counter => {
                    // SAFETY: 16-byte state buffer, one pass at a time.
                    let n = unsafe { std::ptr::read_unaligned(state.cast::<u64>()) } + 1;
                    unsafe { std::ptr::write_unaligned(state.cast::<u64>(), n) };
                    tok.value = n as f64;
                    tok.hops += 1;
                }
                Handler::Refuse => unreachable!(),
            }
        }
        // SAFETY: as above, output ring.
        unsafe {
            std::ptr::write_unaligned(output.add(base).cast(), out.words());
            std::ptr::write_unaligned(output.add(base + HEADER_SIZE).cast(), tok);
        }
    }
    let end = first + p.count as u64;
    // SAFETY: worker line of the control block, written only by passes (one at a time).
    unsafe {
        let cb = control.cast::<ControlBlock>();
        let mut c = std::ptr::read_unaligned(cb);
        c.input_head = end;
        c.output_tail = end;
        c.processed += p.count as u64;
        c.hlc = hlc;
        c.heartbeat += 1;
        std::ptr::write_unaligned(cb, c);
    }
}

/// Copies the output slots of the pass `p` out of the ring, in pass order, and poisons
/// them there.
fn take_outputs(output: *mut u8, p: &params::Drain, slot: usize) -> Vec<u8> {
    let first = p.first_lo as u64 | ((p.first_hi as u64) << 32);
    let capacity = p.mask as usize + 1;
    let mut bytes = Vec::with_capacity(p.count as usize * slot);
    for j in 0..p.count as u64 {
        let off = slot_offset(first + j, capacity, slot);
        // SAFETY: one output slot of the pass, inside the ring; the pass is over and its
        // `done` has not been called, so nothing else touches it.
        unsafe {
            bytes.extend_from_slice(std::slice::from_raw_parts(output.add(off), slot));
            std::ptr::write_bytes(output.add(off), 0xA5, slot);
        }
    }
    bytes
}

// SAFETY: the pointers address the boxed memory owned by the target: rings of
// `ring_len` bytes, a 128-byte control block. The stand-in "device" writes only output
// slots of the running pass and the worker line, between `launch` and `done`.
unsafe impl DrainTarget for CpuTarget {
    ringkernel_drain::host_rings_memory!(rings);
    fn launch(&self, p: params::Drain, done: PassDone) -> Result<()> {
        if self.fail_launch.load(Ordering::SeqCst) {
            return Err(Error::Device("stand-in launch failure".into()));
        }
        assert_eq!(p.slot_words as usize * 4, self.slot_size);
        let staged = self.staged.lock().unwrap().take();
        assert_eq!(
            staged.is_some(),
            self.stage || self.compact,
            "every pass staged, or none"
        );
        assert_eq!(
            p.in_stride != 0,
            self.compact,
            "compact passes only when asked"
        );
        if let Some(bytes) = staged.as_ref().filter(|_| self.compact) {
            let first = p.first_lo as u64 | ((p.first_hi as u64) << 32);
            let capacity = p.mask as usize + 1;
            let requests = unpack_compact(bytes, &p, self.slot_size);
            self.seen.lock().unwrap().extend(
                requests
                    .iter()
                    .map(|(h, b)| (*h, b[..(h.payload_len as usize).min(b.len())].to_vec())),
            );
            for (j, (header, payload)) in requests.into_iter().enumerate() {
                let off = slot_offset(first + j as u64, capacity, self.slot_size);
                // SAFETY: one input slot of this pass, inside the ring; the engine wrote
                // the compact buffer instead of it, so nothing else touches it.
                unsafe {
                    std::ptr::write_unaligned(self.input().add(off).cast(), header);
                    std::ptr::copy_nonoverlapping(
                        payload.as_ptr(),
                        self.input().add(off + HEADER_SIZE),
                        payload.len(),
                    );
                }
            }
            self.staged_passes.fetch_add(1, Ordering::SeqCst);
        } else if let Some(bytes) = staged {
            let first = p.first_lo as u64 | ((p.first_hi as u64) << 32);
            let capacity = p.mask as usize + 1;
            assert_eq!(bytes.len(), p.count as usize * self.slot_size);
            for (j, slot) in bytes.chunks(self.slot_size).enumerate() {
                let off = slot_offset(first + j as u64, capacity, self.slot_size);
                // SAFETY: one input slot of this pass, inside the ring; the engine wrote
                // the staging buffer instead of it, so nothing else touches it.
                unsafe {
                    std::ptr::copy_nonoverlapping(slot.as_ptr(), self.input().add(off), slot.len())
                };
            }
            self.staged_passes.fetch_add(1, Ordering::SeqCst);
        }
        let ticket = self.passes.fetch_add(1, Ordering::SeqCst);
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_running.fetch_max(now, Ordering::SeqCst);
        assert!(
            now as usize <= self.in_flight,
            "more passes in flight than allowed"
        );
        let ptrs = Ptrs(self.input(), self.output(), self.control(), self.state);
        let (handler, slot) = (self.handler, self.slot_size);
        let (hold, order, running) = (self.hold.clone(), self.order.clone(), self.running.clone());
        let done_order = self.done_order.clone();
        let late = self.in_flight > 1 && ticket.is_multiple_of(3);
        let as_bytes = ticket % 2 == 1;
        std::thread::spawn(move || {
            let ptrs = ptrs;
            std::thread::sleep(Duration::from_micros(100));
            while hold.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_micros(200));
            }
            {
                let (next, cv) = &*order;
                let mut next = cv
                    .wait_while(next.lock().unwrap(), |n| *n != ticket)
                    .unwrap();
                run_pass(ptrs, p, handler, slot);
                *next += 1;
                cv.notify_all();
            }
            let bytes = as_bytes.then(|| take_outputs(ptrs.1, &p, slot));
            if late {
                std::thread::sleep(Duration::from_millis(2));
            }
            running.fetch_sub(1, Ordering::SeqCst);
            done_order.lock().unwrap().push(ticket);
            match &bytes {
                Some(b) => done(Ok(PassOutputs::Slots(b))),
                None => done(Ok(PassOutputs::InRing)),
            }
        });
        Ok(())
    }

    fn max_in_flight(&self) -> usize {
        self.in_flight
    }

    fn stage_compact(&self, count: usize) -> Option<*mut u8> {
        if !self.compact {
            return None;
        }
        let mut bytes = vec![0xA5u8; compact_len(count, self.slot_size)];
        let ptr = bytes.as_mut_ptr();
        // The Vec's heap memory does not move when the Vec itself is moved.
        *self.staged.lock().unwrap() = Some(bytes);
        Some(ptr)
    }

    fn stage_input(&self, count: usize) -> Option<*mut u8> {
        if !self.stage {
            return None;
        }
        let mut bytes = vec![0xA5u8; count * self.slot_size];
        let ptr = bytes.as_mut_ptr();
        // The Vec's heap memory does not move when the Vec itself is moved.
        *self.staged.lock().unwrap() = Some(bytes);
        Some(ptr)
    }
}

/// The requests of a compact pass (`bytes`, `compact_len` of the pass's requested
/// count), as the drain template reads them: for each request its header, rebuilt
/// from its run's entry, and its payload (the whole stride). Asserts the layout: at
/// least one run, the first starting at 0, starts rising and inside the pass.
pub fn unpack_compact(bytes: &[u8], p: &params::Drain, slot_size: usize) -> Vec<Request> {
    let stride = p.in_stride as usize * 4;
    assert_eq!(stride, slot_size - HEADER_SIZE, "payload stride");
    let (runs, runs_at, starts_at) = (
        p.runs as usize,
        p.runs_at as usize * 4,
        p.starts_at as usize * 4,
    );
    assert!(
        runs >= 1 && runs <= p.count as usize,
        "{runs} runs for {} requests",
        p.count
    );
    assert!(runs_at >= p.count as usize * stride && starts_at >= runs_at + runs * HEADER_SIZE);
    assert!(starts_at + runs * 4 <= bytes.len());
    let start = |r: usize| {
        u32::from_le_bytes(
            bytes[starts_at + 4 * r..starts_at + 4 * r + 4]
                .try_into()
                .unwrap(),
        ) as usize
    };
    assert_eq!(start(0), 0, "the first run starts the pass");
    assert!(
        (1..runs).all(|r| start(r) > start(r - 1) && start(r) < p.count as usize),
        "run starts rise"
    );
    (0..p.count as usize)
        .map(|j| {
            let r = (0..runs).rev().find(|&r| start(r) <= j).unwrap();
            let entry: MessageHeader =
                bytemuck::pod_read_unaligned(&bytes[runs_at + r * HEADER_SIZE..][..HEADER_SIZE]);
            let i = (j - start(r)) as u64;
            let mut h = entry;
            h.message_id = entry.message_id.wrapping_add(i);
            h.correlation_id = entry.correlation_id.wrapping_add(i);
            h.timestamp = entry.timestamp.wrapping_add(i);
            (h, bytes[j * stride..(j + 1) * stride].to_vec())
        })
        .collect()
}
