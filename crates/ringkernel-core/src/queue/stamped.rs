//! Stamped slot rings: every slot validates itself, so a consumer needs no index.
//!
//! A consumer on the far side of PCIe (a persistent CUDA kernel reading pinned host
//! memory) pays a full round trip for each dependent read. With a plain slot ring it
//! reads the producer's tail, then the slot: two round trips per message. A stamped
//! ring stores each logical slot (64-byte [`MessageHeader`] + payload, `slot_size`
//! bytes) as 16-byte *units*: 12 bytes of the slot and a 4-byte stamp,
//! [`stamp_of`]`(index)`, the low 32 bits of the message's ring index plus one. The
//! producer writes a unit's data before its stamp (a release store), so a reader whose
//! one 16-byte load sees the right stamp also sees that unit's data: a 16-byte aligned
//! load lies in one cache line, which the host's memory system hands out as one
//! snapshot, and stores to it become visible in program order. The consumer reads
//! the whole next slot (or the next several) at once, checks the stamps of the units
//! the header's `payload_len` says are used, and takes the longest valid prefix: one
//! read per message (or per batch) and no index on the critical path.
//!
//! The producer still needs the consumer's progress to reuse slots: the consumer
//! publishes `head` in the ring's [`QueueHeader`] as usual. The producer also stores
//! its `tail` there after each batch, for readers on its own side (metrics, and
//! [`StampedConsumer`], which reads messages back once the device consumer is gone).
//!
//! Several threads can share one half: a producer [`reserve`](StampedProducer::reserve)s
//! slots under its owner's lock and each thread encodes its own through a
//! [`StampedSlotWriter`] outside it, then [`finish`](StampedProducer::finish)es them; a
//! consumer [`claim`](StampedConsumer::claim)s announced slots and reads them through a
//! [`StampedSlotReader`], then [`release`](StampedConsumer::release)s them. Ranges are
//! published (the tail) and freed (the head) in index order, whatever order they finish
//! in.
//!
//! Stamps never repeat within 2^32 messages of one slot position, and a position's old
//! stamp differs from the next expected one (the capacity is below 2^32), so zeroed or
//! stale memory is never mistaken for a message.
//!
//! ```
//! use ringkernel_core::message::MessageHeader;
//! use ringkernel_core::queue::stamped::stamped_channel;
//!
//! let (mut tx, mut rx) = stamped_channel(4, 256).unwrap();
//! tx.try_push(&MessageHeader::new(7, 3), b"abc").unwrap();
//! let env = rx.try_pop().unwrap().unwrap();
//! assert_eq!((env.header.type_id, env.payload.as_slice()), (7, &b"abc"[..]));
//! assert!(rx.try_pop().unwrap().is_none());
//! ```

use super::slot::{check_slot, check_slot_size, fill_slot, AlignedBuf};
use super::{check_capacity, QueueHeader};
use crate::error::{Error, Result};
use crate::message::{check_payload_fits, Envelope, MessageHeader, HEADER_SIZE};
use crate::util::prefetch;
use std::any::Any;
use std::collections::VecDeque;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// Bytes of one unit (12 data bytes and a 4-byte stamp).
pub const UNIT_BYTES: usize = 16;
/// Data bytes of one unit.
pub const UNIT_DATA: usize = 12;

/// Units per slot of `slot_size` logical bytes.
pub const fn units_per_slot(slot_size: usize) -> usize {
    slot_size.div_ceil(UNIT_DATA)
}

/// Bytes one stamped slot of `slot_size` logical bytes takes in memory.
pub const fn stamped_slot_bytes(slot_size: usize) -> usize {
    units_per_slot(slot_size) * UNIT_BYTES
}

/// Units a message of `payload_len` bytes uses (the header's units included).
pub const fn units_used(payload_len: usize) -> usize {
    (HEADER_SIZE + payload_len).div_ceil(UNIT_DATA)
}

/// The stamp of every unit of the message with ring index `index`.
#[inline(always)]
pub const fn stamp_of(index: u64) -> u32 {
    (index as u32).wrapping_add(1)
}

/// How many slots ahead a consumer's batch loop asks for a slot's lines.
const PREFETCH_AHEAD: u64 = 8;

/// Size in bytes of a whole stamped ring: the 128-byte [`QueueHeader`] followed by
/// `capacity` stamped slots. Checks both values as [`slot::ring_bytes`](super::slot::ring_bytes) does.
pub fn stamped_ring_bytes(capacity: usize, slot_size: usize) -> Result<usize> {
    check_capacity(capacity)?;
    check_slot_size(slot_size)?;
    capacity
        .checked_mul(stamped_slot_bytes(slot_size))
        .and_then(|n| n.checked_add(std::mem::size_of::<QueueHeader>()))
        .filter(|&n| n <= isize::MAX as usize)
        .ok_or_else(|| {
            Error::invalid(format!(
                "a stamped ring of {capacity} slots of {slot_size} bytes does not fit in memory"
            ))
        })
}

/// Whether a producer writes each unit with one 16-byte store (data and stamp at
/// once) rather than the data and then the stamp, and a consumer reads it with one
/// 16-byte load: on x86_64 CPUs with AVX, whose aligned 16-byte `MOVDQA` loads and
/// stores are single-copy atomic (Intel's SDM, vol. 3, "Guaranteed Atomic
/// Operations"; AMD's APM, vol. 2, "Access Atomicity"), so a reader that sees the
/// stamp sees the unit's data. Measured on an H100's host (`cuda_bench --only stream`,
/// each thread's work alone, medians of 4 pairs): the consumer 0.75x the time, the
/// producer 0.91x. Elsewhere, false.
#[inline(always)]
fn whole_units() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Writes the unit at `dst`: the 12 bytes at `src`, then `stamp`, in one 16-byte store.
///
/// # Safety
///
/// `dst` is 16-aligned and writable for 16 bytes, `src` readable for 16 bytes, and
/// [`whole_units`] is true (elsewhere this never runs).
#[inline(always)]
#[allow(unused_variables)]
unsafe fn store_whole_unit(dst: *mut u8, src: *const u8, stamp: u32) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE2 is part of the x86_64 baseline; `src` is readable for 16 bytes and
    // `dst` 16-aligned and writable for 16 bytes (the caller's promise). The store is
    // written as one MOVDQA so the compiler cannot split it (it is atomic only as one
    // aligned 16-byte store, on CPUs with AVX: `whole_units`).
    unsafe {
        use std::arch::x86_64::*;
        let data = _mm_loadu_si128(src.cast());
        let keep = _mm_set_epi32(0, -1, -1, -1);
        let unit = _mm_or_si128(
            _mm_and_si128(data, keep),
            _mm_set_epi32(stamp as i32, 0, 0, 0),
        );
        std::arch::asm!(
            "movdqa xmmword ptr [{p}], {v}",
            p = in(reg) dst,
            v = in(xmm_reg) unit,
            options(nostack, preserves_flags)
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("whole-unit stores are x86_64 only");
}

/// Reads the unit at `src` with one 16-byte load and, if its stamp is `stamp`, writes
/// its 16 bytes to `dst` (the 12 data bytes, and 4 more that the next unit's data, or
/// nothing, will cover); returns whether it did.
///
/// # Safety
///
/// `src` is 16-aligned and readable for 16 bytes, `dst` writable for 16 bytes, and
/// [`whole_units`] is true (elsewhere this never runs).
#[inline(always)]
#[allow(unused_variables)]
unsafe fn load_whole_unit(src: *const u8, dst: *mut u8, stamp: u32) -> bool {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE2 is part of the x86_64 baseline; `src` is 16-aligned and readable and
    // `dst` writable for 16 bytes (the caller's promise). The load is written as one
    // MOVDQA so the compiler cannot split it (one snapshot of data and stamp: see
    // `whole_units`).
    unsafe {
        use std::arch::x86_64::*;
        let unit: __m128i;
        std::arch::asm!(
            "movdqa {v}, xmmword ptr [{p}]",
            p = in(reg) src,
            v = out(xmm_reg) unit,
            options(nostack, preserves_flags, readonly)
        );
        if _mm_cvtsi128_si32(_mm_shuffle_epi32::<0xFF>(unit)) as u32 != stamp {
            return false;
        }
        _mm_storeu_si128(dst.cast(), unit);
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("whole-unit loads are x86_64 only");
}

/// Index ranges handed out in order and finished in any order: what a half may
/// publish is the end of the finished prefix.
#[derive(Debug, Default)]
struct InOrder {
    /// The end of every range handed out and not yet published, in order, and whether
    /// it is finished.
    open: VecDeque<(u64, bool)>,
}

impl InOrder {
    /// The range ending at `end` finished: the new end of the finished prefix, if it
    /// moved. A range nobody handed out (the half's own, taken and finished at once)
    /// is handed out first.
    #[inline]
    fn finish(&mut self, end: u64) -> Option<u64> {
        if self.open.is_empty() {
            // Nothing else open (one thread): published at once.
            return Some(end);
        }
        match self.open.iter_mut().find(|e| e.0 == end) {
            Some(e) => e.1 = true,
            None => self.open.push_back((end, true)),
        }
        let mut moved = None;
        while let Some(&(e, true)) = self.open.front() {
            self.open.pop_front();
            moved = Some(e);
        }
        moved
    }
}

/// Encodes one message into the stamped slot at `slot` (the ring's `slot_size`), each
/// used unit carrying `stamp`: with `whole` ([`whole_units`]) data and stamp in one
/// 16-byte store, else the data, then the stamp with a release store. `staging` holds
/// `units_per_slot(slot_size) * UNIT_DATA + 4` bytes. `MessageTooLarge` (nothing
/// written) for a payload that does not fit.
///
/// # Safety
///
/// `slot` is a 16-aligned stamped slot of `slot_size` logical bytes, writable, and no
/// one else writes it or reads it as complete meanwhile (its index is the caller's
/// until it publishes it).
#[inline(always)]
unsafe fn encode_slot(
    slot: *mut u8,
    staging: &mut [u8],
    slot_size: usize,
    stamp: u32,
    header: &MessageHeader,
    payload: &[u8],
    whole: bool,
) -> Result<()> {
    fill_slot(&mut staging[..slot_size], header, payload)?;
    let used = units_used(payload.len());
    if whole {
        for u in 0..used {
            // SAFETY: unit `u` of the slot is 16 bytes, 16-aligned and the caller's (the
            // contract above); `staging` holds every unit's data and 4 bytes more, so
            // the 16 bytes from unit `u`'s data are in bounds; `whole` is only true
            // where `whole_units` said so.
            unsafe {
                store_whole_unit(
                    slot.add(u * UNIT_BYTES),
                    staging.as_ptr().add(u * UNIT_DATA),
                    stamp,
                )
            };
        }
    } else {
        for u in 0..used {
            // SAFETY: the unit lies inside the caller's slot, and `staging` holds
            // `units_per_slot * UNIT_DATA` bytes, so both ranges are in bounds.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    staging.as_ptr().add(u * UNIT_DATA),
                    slot.add(u * UNIT_BYTES),
                    UNIT_DATA,
                );
            }
            // Release: a reader that sees the stamp sees the data above.
            Ring::stamp(slot, u).store(stamp, Ordering::Release);
        }
    }
    Ok(())
}

/// The view of one stamped ring shared by both halves.
struct Ring {
    header: NonNull<QueueHeader>,
    units: NonNull<u8>,
    capacity: usize,
    slot_size: usize,
    mask: u64,
    _keep: Option<Arc<dyn Any + Send + Sync>>,
}

// SAFETY: the ring memory is only touched through atomics (indices, stamps) and through
// slots the index protocol gives to one side at a time; the constructor's caller
// promised the memory stays valid while `_keep` (or the caller's own guarantee) lives.
unsafe impl Send for Ring {}
// SAFETY: `&Ring` allows atomic loads of the indices only; slot access needs `&mut` of
// the owning half.
unsafe impl Sync for Ring {}

impl Ring {
    /// # Safety
    /// See [`StampedProducer::from_raw_parts`].
    unsafe fn new(
        header: NonNull<QueueHeader>,
        units: NonNull<u8>,
        keep: Option<Arc<dyn Any + Send + Sync>>,
    ) -> Result<Self> {
        if !(header.as_ptr() as usize).is_multiple_of(std::mem::align_of::<QueueHeader>()) {
            return Err(Error::invalid("queue header is not 64-byte aligned"));
        }
        if !(units.as_ptr() as usize).is_multiple_of(UNIT_BYTES) {
            return Err(Error::invalid("stamped slot region is not 16-byte aligned"));
        }
        let h = header.as_ptr();
        // SAFETY: the caller guarantees `header` is valid for reads; these fields are
        // constants nobody writes while the ring is in use.
        let (capacity, slot_size, mask) = unsafe {
            (
                std::ptr::addr_of!((*h).capacity).read(),
                std::ptr::addr_of!((*h).slot_size).read(),
                std::ptr::addr_of!((*h).mask).read(),
            )
        };
        let (capacity, slot_size) = (capacity as usize, slot_size as usize);
        stamped_ring_bytes(capacity, slot_size)?;
        if mask as usize != capacity - 1 {
            return Err(Error::invalid(format!(
                "queue header mask {mask} does not match capacity {capacity}"
            )));
        }
        Ok(Ring {
            header,
            units,
            capacity,
            slot_size,
            mask: mask as u64,
            _keep: keep,
        })
    }

    fn index(&self, head: bool) -> &AtomicU64 {
        let h = self.header.as_ptr();
        // SAFETY: the header is valid and 64-aligned (checked in `new`); both indices are
        // aligned u64 that every party accesses atomically only (caller's guarantee).
        unsafe {
            AtomicU64::from_ptr(if head {
                std::ptr::addr_of_mut!((*h).head)
            } else {
                std::ptr::addr_of_mut!((*h).tail)
            })
        }
    }

    /// First unit of the slot of `index`.
    #[inline(always)]
    fn slot_ptr(&self, index: u64) -> *mut u8 {
        let i = (index & self.mask) as usize;
        // SAFETY: `i < capacity` and the region holds `capacity` stamped slots.
        unsafe {
            self.units
                .as_ptr()
                .add(i * stamped_slot_bytes(self.slot_size))
        }
    }

    /// Asks the CPU for the lines of the slot [`PREFETCH_AHEAD`] slots after `index`: a
    /// consumer's batch loop over a ring too large for the caches (the CUDA backend's
    /// output, which the device writes) otherwise waits for each slot's lines in turn.
    /// (The 2-core development VM, `stamped_alone_64K`: the consumer 0.80-0.90x the time
    /// in 2 pairs; no clear change on an H100's host. The producer showed none either
    /// way, so it has none.)
    #[inline(always)]
    fn prefetch_ahead(&self, index: u64) {
        prefetch(
            self.slot_ptr(index.wrapping_add(PREFETCH_AHEAD)),
            stamped_slot_bytes(self.slot_size),
        );
    }

    /// The stamp word of unit `u` of the slot at `slot`.
    #[inline(always)]
    fn stamp(slot: *mut u8, u: usize) -> &'static AtomicU32 {
        // SAFETY: `slot` is a stamped slot of the ring (16-aligned) and `u` one of its
        // units, so the stamp is an aligned u32 inside the region, accessed atomically
        // by every party. The 'static lifetime never escapes the ring's methods.
        unsafe { AtomicU32::from_ptr(slot.add(u * UNIT_BYTES + UNIT_DATA).cast()) }
    }
}

/// Producing half of a stamped ring (the host side of a device-consumed queue).
pub struct StampedProducer {
    ring: Ring,
    /// The next index to write or reserve.
    tail: u64,
    /// The tail last published (stored in the header).
    published: u64,
    /// Reserved ranges not yet published.
    open: InOrder,
    cached_head: u64,
    /// The logical slot being encoded (`units_per_slot * UNIT_DATA` bytes, and 4 more).
    staging: Vec<u8>,
    /// Units are written with one 16-byte store ([`whole_units`]).
    whole: bool,
}

impl std::fmt::Debug for StampedProducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StampedProducer")
            .field("capacity", &self.ring.capacity)
            .field("slot_size", &self.ring.slot_size)
            .field("tail", &self.tail)
            .finish()
    }
}

impl StampedProducer {
    fn from_ring(ring: Ring) -> Self {
        let tail = ring.index(false).load(Ordering::Relaxed);
        let cached_head = ring.index(true).load(Ordering::Acquire);
        let staging = staging_for(ring.slot_size);
        StampedProducer {
            ring,
            tail,
            published: tail,
            open: InOrder::default(),
            cached_head,
            staging,
            whole: whole_units(),
        }
    }

    /// A producer over a stamped ring whose memory is owned elsewhere (e.g. pinned host
    /// memory a device kernel reads). Capacity and slot size come from the header,
    /// which must be initialised; `InvalidArgument` for bad values or alignment.
    ///
    /// # Safety
    ///
    /// For as long as the producer lives: `header` points to a [`QueueHeader`] and
    /// `units` to `capacity` stamped slots ([`stamped_slot_bytes`] each), valid for
    /// reads and writes and not freed (`keep_alive` may ensure that); the header's
    /// constants are not modified; `tail` is written by this producer only and the
    /// indices and stamps are accessed atomically by every party; the single consumer
    /// reads only slots whose stamps match, and publishes `head` past a slot only
    /// after it has finished reading it.
    pub unsafe fn from_raw_parts(
        header: NonNull<QueueHeader>,
        units: NonNull<u8>,
        keep_alive: Option<Arc<dyn Any + Send + Sync>>,
    ) -> Result<Self> {
        // SAFETY: forwarded from this function's contract.
        Ok(Self::from_ring(unsafe {
            Ring::new(header, units, keep_alive)?
        }))
    }

    /// Free slots from the tail on, at least `want` if there are: the consumer's head
    /// is read only when the cached one says fewer.
    #[inline(always)]
    fn room(&mut self, want: u64) -> u64 {
        let cap = self.ring.capacity as u64;
        let room = cap - self.tail.wrapping_sub(self.cached_head).min(cap);
        if room >= want {
            return room;
        }
        self.cached_head = self.ring.index(true).load(Ordering::Acquire);
        cap - self.tail.wrapping_sub(self.cached_head).min(cap)
    }

    #[inline(always)]
    fn has_room(&mut self) -> bool {
        self.room(1) > 0
    }

    /// Encodes one message into slot `tail` and advances the local tail
    /// ([`encode_slot`]).
    #[inline]
    fn write_next(&mut self, header: &MessageHeader, payload: &[u8], whole: bool) -> Result<()> {
        let slot = self.ring.slot_ptr(self.tail);
        // SAFETY: slot `tail` is free (the caller checked `has_room` against an
        // acquire-loaded head), lies inside the region and is 16-aligned (`Ring::new`
        // checks the region; stamped slots are whole units), and only this producer
        // writes slots at its tail.
        unsafe {
            encode_slot(
                slot,
                &mut self.staging,
                self.ring.slot_size,
                stamp_of(self.tail),
                header,
                payload,
                whole,
            )?
        };
        self.tail = self.tail.wrapping_add(1);
        Ok(())
    }

    /// The range of slots ending at `end` is written (a reserved one, or the producer's
    /// own): publishes the tail once every range before it is ([`InOrder`]).
    fn publish(&mut self, end: u64) {
        if let Some(e) = self.open.finish(end) {
            self.published = e;
            self.ring.index(false).store(e, Ordering::Release);
        }
    }

    /// Writes one message. `MessageTooLarge` if it does not fit a slot, `QueueFull` if
    /// no slot is free; nothing changes in either case.
    pub fn try_push(&mut self, header: &MessageHeader, payload: &[u8]) -> Result<()> {
        check_payload_fits(payload.len(), self.ring.slot_size)?;
        if !self.has_room() {
            return Err(Error::QueueFull {
                capacity: self.ring.capacity,
            });
        }
        self.write_next(header, payload, self.whole)?;
        self.publish(self.tail);
        Ok(())
    }

    /// Writes messages from `msgs` in order until it ends or the ring is full; returns
    /// how many were written (a prefix). As [`SlotProducer::try_push_batch`]: when the
    /// ring fills up, the next item has been taken from the iterator but not written;
    /// an oversized payload is `MessageTooLarge` after the messages before it.
    ///
    /// [`SlotProducer::try_push_batch`]: super::slot::SlotProducer::try_push_batch
    pub fn try_push_batch<'a, I>(&mut self, msgs: I) -> Result<usize>
    where
        I: IntoIterator<Item = (&'a MessageHeader, &'a [u8])>,
    {
        let start = self.tail;
        let mut result = Ok(());
        for (header, payload) in msgs {
            if let Err(e) = check_payload_fits(payload.len(), self.ring.slot_size) {
                result = Err(e);
                break;
            }
            if !self.has_room() {
                break;
            }
            if let Err(e) = self.write_next(header, payload, self.whole) {
                result = Err(e);
                break;
            }
        }
        let written = self.tail.wrapping_sub(start) as usize;
        if written > 0 {
            self.publish(self.tail);
        }
        result.map(|()| written)
    }

    /// Reserves up to `n` free slots for writers outside this producer (other threads,
    /// through [`slot_writer`](Self::slot_writer)): returns the first index and how
    /// many (0 when the ring is full). Every reserved slot must be written and then
    /// [`finish`](Self::finish)ed: the consumer waits at a slot that never is, and the
    /// slots after it are not published before it.
    ///
    /// ```
    /// use ringkernel_core::message::MessageHeader;
    /// use ringkernel_core::queue::stamped::stamped_channel;
    ///
    /// let (mut tx, mut rx) = stamped_channel(8, 128).unwrap();
    /// let h = MessageHeader::new(1, 1);
    /// // Under the producer's lock: reserve. On any thread: write. Then finish.
    /// let (first, n) = tx.reserve(3);
    /// let mut w = tx.slot_writer();
    /// for i in 0..n as u64 {
    ///     // SAFETY: reserved above and not finished yet; the ring outlives the writer.
    ///     unsafe { w.write(first + i, &h, &[i as u8]).unwrap() };
    /// }
    /// assert_eq!(tx.finish(first, n), 3);
    /// // The consumer side: claim what is announced, read it anywhere, release it.
    /// let (first, n) = rx.claim(usize::MAX, rx.announced());
    /// let mut r = rx.slot_reader();
    /// let mut got = Vec::new();
    /// for i in 0..n as u64 {
    ///     // SAFETY: claimed above and not released yet.
    ///     unsafe { r.try_read_with(first + i, |_, p| got.push(p[0])) }.unwrap();
    /// }
    /// rx.release(first, n);
    /// assert_eq!(got, [0, 1, 2]);
    /// assert_eq!(tx.depth(), 0);
    /// ```
    pub fn reserve(&mut self, n: usize) -> (u64, usize) {
        let got = self.room(n as u64).min(n as u64);
        let first = self.tail;
        if got > 0 {
            self.tail = first.wrapping_add(got);
            self.open.open.push_back((self.tail, false));
        }
        (first, got as usize)
    }

    /// The `count` slots from `first` (one [`reserve`](Self::reserve)d range) are
    /// written: publishes the tail up to the end of every range finished in order.
    /// Returns the published tail.
    pub fn finish(&mut self, first: u64, count: usize) -> u64 {
        if count > 0 {
            self.publish(first.wrapping_add(count as u64));
        }
        self.published
    }

    /// A writer for slots this producer [`reserve`](Self::reserve)d, for use on
    /// another thread.
    pub fn slot_writer(&self) -> StampedSlotWriter {
        StampedSlotWriter(Detached::new(&self.ring, self.whole))
    }

    /// The index the next message gets.
    pub fn position(&self) -> u64 {
        self.tail
    }

    /// The tail published to the consumer: every slot before it is written (at most
    /// [`position`](Self::position), less while reserved ranges are being written).
    pub fn published(&self) -> u64 {
        self.published
    }

    /// Messages written and not yet freed by the consumer.
    pub fn depth(&self) -> usize {
        let head = self.ring.index(true).load(Ordering::Acquire);
        (self.tail.wrapping_sub(head) as usize).min(self.ring.capacity)
    }

    /// Capacity in slots.
    pub fn capacity(&self) -> usize {
        self.ring.capacity
    }

    /// Logical slot size in bytes.
    pub fn slot_size(&self) -> usize {
        self.ring.slot_size
    }
}

/// Consuming half of a stamped ring on the host: reads messages back by their stamps
/// (tests, and the messages a device consumer left behind when it exited).
pub struct StampedConsumer {
    ring: Ring,
    /// The next index to take or claim.
    head: u64,
    /// Claimed ranges not yet freed.
    open: InOrder,
    staging: Vec<u8>,
    /// Units are read with one 16-byte load ([`whole_units`]).
    whole: bool,
}

impl std::fmt::Debug for StampedConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StampedConsumer")
            .field("capacity", &self.ring.capacity)
            .field("head", &self.head)
            .finish()
    }
}

impl StampedConsumer {
    fn from_ring(ring: Ring) -> Self {
        let head = ring.index(true).load(Ordering::Acquire);
        let staging = staging_for(ring.slot_size);
        StampedConsumer {
            ring,
            head,
            open: InOrder::default(),
            staging,
            whole: whole_units(),
        }
    }

    /// A consumer over a stamped ring owned elsewhere, starting at the header's `head`.
    ///
    /// # Safety
    ///
    /// As for [`StampedProducer::from_raw_parts`], and no other consumer exists while
    /// this one lives (e.g. the device kernel that consumed the ring has exited).
    pub unsafe fn from_raw_parts(
        header: NonNull<QueueHeader>,
        units: NonNull<u8>,
        keep_alive: Option<Arc<dyn Any + Send + Sync>>,
    ) -> Result<Self> {
        // SAFETY: forwarded from this function's contract.
        Ok(Self::from_ring(unsafe {
            Ring::new(header, units, keep_alive)?
        }))
    }

    /// Decodes units `from..to` of the slot at `slot` into `staging` if all their
    /// stamps are `stamp`; false as soon as one is not. With `whole` ([`whole_units`]),
    /// one 16-byte load a unit.
    #[inline(always)]
    fn decode(
        staging: &mut [u8],
        slot: *mut u8,
        from: usize,
        to: usize,
        stamp: u32,
        whole: bool,
    ) -> bool {
        if whole {
            for u in from..to {
                // SAFETY: the unit lies inside the slot, 16-aligned (`Ring::new` checks
                // the region; units are 16 bytes); `staging` holds every unit's data
                // and 4 bytes more, so 16 bytes from unit `u`'s data are in bounds;
                // `whole` is only true where `whole_units` said so.
                let ok = unsafe {
                    load_whole_unit(
                        slot.add(u * UNIT_BYTES),
                        staging.as_mut_ptr().add(u * UNIT_DATA),
                        stamp,
                    )
                };
                if !ok {
                    return false;
                }
            }
            return true;
        }
        for u in from..to {
            // Acquire: the unit's data after its stamp.
            if Ring::stamp(slot, u).load(Ordering::Acquire) != stamp {
                return false;
            }
            // SAFETY: the unit lies inside the slot and `staging` holds every unit's
            // data; the producer wrote this unit (stamp) and does not write the slot
            // again before `head` passes it.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    slot.add(u * UNIT_BYTES),
                    staging.as_mut_ptr().add(u * UNIT_DATA),
                    UNIT_DATA,
                )
            }
        }
        true
    }

    /// Decodes the slot of `index` into `staging` if every unit its header says is used
    /// carries the stamp of `index`: `Some(payload_len)` then, `None` while it is not
    /// complete (nothing consumed).
    fn decode_slot(&mut self, index: u64) -> Option<usize> {
        decode_slot_at(
            &mut self.staging,
            self.ring.slot_ptr(index),
            self.ring.slot_size,
            stamp_of(index),
            self.whole,
        )
    }

    /// The range of slots ending at `end` is read (a claimed one, or the consumer's
    /// own): frees them once every range before it is ([`InOrder`]).
    fn free(&mut self, end: u64) {
        if let Some(e) = self.open.finish(end) {
            self.ring.index(true).store(e, Ordering::Release);
        }
    }

    /// The producer's tail as it last published it (a device producer stores it
    /// without ordering it after the slots: every slot before it was handed out, not
    /// necessarily written yet).
    pub fn announced(&self) -> u64 {
        self.ring.index(false).load(Ordering::Acquire)
    }

    /// Claims up to `max` slots from [`position`](Self::position) on, but none at or
    /// past `upto` (e.g. [`announced`](Self::announced)), for readers outside this
    /// consumer (other threads, through [`slot_reader`](Self::slot_reader)): returns
    /// the first index and how many (0 when `upto` is not ahead). Every claimed slot
    /// must be [`release`](Self::release)d: the head does not pass it before.
    pub fn claim(&mut self, max: usize, upto: u64) -> (u64, usize) {
        let ahead = upto.wrapping_sub(self.head);
        // (`upto` behind the head reads as a huge distance: nothing to claim.)
        let n = if ahead > self.ring.capacity as u64 {
            0
        } else {
            ahead.min(max as u64)
        };
        let first = self.head;
        if n > 0 {
            self.head = first.wrapping_add(n);
            self.open.open.push_back((self.head, false));
        }
        (first, n as usize)
    }

    /// The `count` slots from `first` (one [`claim`](Self::claim)ed range) are read:
    /// frees them, and what was released in order before them, with one store of the
    /// head.
    pub fn release(&mut self, first: u64, count: usize) {
        if count > 0 {
            self.free(first.wrapping_add(count as u64));
        }
    }

    /// Gives back the end of the last claim, `count` slots from `first`, keeping its
    /// first `keep` (e.g. those read, when the next was not complete yet): true if it
    /// was the last claim, so the rest is claimable again (the caller then releases only
    /// `keep`), false if a later claim follows it (nothing changes).
    pub fn shrink_claim(&mut self, first: u64, count: usize, keep: usize) -> bool {
        let end = first.wrapping_add(count as u64);
        if self.head != end || keep > count {
            return false;
        }
        match self.open.open.back_mut() {
            Some(e) if e.0 == end && !e.1 => {
                if keep == 0 {
                    self.open.open.pop_back();
                } else {
                    e.0 = first.wrapping_add(keep as u64);
                }
            }
            _ => return false,
        }
        self.head = first.wrapping_add(keep as u64);
        true
    }

    /// A reader for slots this consumer [`claim`](Self::claim)ed, for use on another
    /// thread.
    pub fn slot_reader(&self) -> StampedSlotReader {
        StampedSlotReader(Detached::new(&self.ring, self.whole))
    }

    /// Takes the next message if its stamps say it is complete. A complete slot whose
    /// header is corrupt is consumed and reported as an error.
    pub fn try_pop(&mut self) -> Result<Option<Envelope>> {
        let index = self.head;
        if self.decode_slot(index).is_none() {
            return Ok(None);
        }
        let bytes = &self.staging[..self.ring.slot_size];
        let res = check_slot(bytes, index).map(|header| Envelope {
            header,
            payload: bytes[HEADER_SIZE..HEADER_SIZE + header.payload_len as usize].to_vec(),
        });
        self.head = index.wrapping_add(1);
        self.free(self.head);
        res.map(Some)
    }

    /// Calls `f` on up to `max` complete messages in order (header and payload as
    /// decoded, valid during the call), then publishes the new head with one store.
    /// Returns how many were taken. A complete but corrupt slot is consumed and
    /// reported as an error after the messages before it were passed to `f`.
    ///
    /// ```
    /// use ringkernel_core::message::MessageHeader;
    /// use ringkernel_core::queue::stamped::stamped_channel;
    ///
    /// let (mut tx, mut rx) = stamped_channel(8, 128).unwrap();
    /// let h = MessageHeader::new(1, 0);
    /// for i in 0..5u8 {
    ///     tx.try_push(&h, &[i]).unwrap();
    /// }
    /// let mut sum = 0;
    /// assert_eq!(rx.try_pop_batch_with(3, |_, p| sum += p[0]).unwrap(), 3);
    /// assert_eq!(rx.try_pop_batch_with(usize::MAX, |_, p| sum += p[0]).unwrap(), 2);
    /// assert_eq!(sum, 0 + 1 + 2 + 3 + 4);
    /// ```
    pub fn try_pop_batch_with(
        &mut self,
        max: usize,
        mut f: impl FnMut(&MessageHeader, &[u8]),
    ) -> Result<usize> {
        let start = self.head;
        let mut result = Ok(());
        while (self.head.wrapping_sub(start) as usize) < max {
            let index = self.head;
            self.ring.prefetch_ahead(index);
            if self.decode_slot(index).is_none() {
                break;
            }
            self.head = index.wrapping_add(1);
            let bytes = &self.staging[..self.ring.slot_size];
            match check_slot(bytes, index) {
                Ok(h) => {
                    let header: MessageHeader = bytemuck::pod_read_unaligned(&bytes[..HEADER_SIZE]);
                    f(
                        &header,
                        &bytes[HEADER_SIZE..HEADER_SIZE + h.payload_len as usize],
                    );
                }
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        let taken = self.head.wrapping_sub(start);
        if taken > 0 {
            self.free(self.head);
        }
        result.map(|()| taken as usize)
    }

    /// The index of the next message to take.
    pub fn position(&self) -> u64 {
        self.head
    }

    /// Messages the producer says it has written beyond [`position`](Self::position),
    /// from the `tail` it stores in the ring's header (a device producer stores it
    /// without ordering it after the slots: a hint, never a promise that the next
    /// message is complete).
    pub fn len(&self) -> usize {
        let tail = self.ring.index(false).load(Ordering::Acquire);
        (tail.wrapping_sub(self.head) as usize).min(self.ring.capacity)
    }

    /// Whether [`len`](Self::len) is zero.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A read-only view of the ring for a thread that only watches for arrivals (it
    /// shares this consumer's memory, and sees its progress through the header's head).
    pub fn watcher(&self) -> StampedWatcher {
        StampedWatcher {
            header: self.ring.header,
            units: self.ring.units,
            slot_bytes: stamped_slot_bytes(self.ring.slot_size),
            mask: self.ring.mask,
            _keep: self.ring._keep.clone(),
        }
    }
}

/// A staging buffer for one logical slot of `slot_size` bytes: every unit's data and 4
/// spare bytes (a whole-unit store or load moves 16 bytes for each unit's 12).
fn staging_for(slot_size: usize) -> Vec<u8> {
    vec![0u8; units_per_slot(slot_size) * UNIT_DATA + 4]
}

/// Decodes the stamped slot at `slot` into `staging` if every unit its header says is
/// used carries `stamp`: `Some(payload_len)` then, else `None`.
#[inline(always)]
fn decode_slot_at(
    staging: &mut [u8],
    slot: *mut u8,
    slot_size: usize,
    stamp: u32,
    whole: bool,
) -> Option<usize> {
    let header_units = units_used(0);
    if !StampedConsumer::decode(staging, slot, 0, header_units, stamp, whole) {
        return None;
    }
    let h: MessageHeader = bytemuck::pod_read_unaligned(&staging[..HEADER_SIZE]);
    let used = units_used(h.payload_len as usize).min(units_per_slot(slot_size));
    if !StampedConsumer::decode(staging, slot, header_units, used, stamp, whole) {
        return None;
    }
    Some(h.payload_len as usize)
}

/// A ring's slots apart from its half, for a thread outside the half's lock: the
/// region, its shape and a staging buffer of its own (what [`StampedSlotWriter`] and
/// [`StampedSlotReader`] hold).
struct Detached {
    units: NonNull<u8>,
    mask: u64,
    slot_size: usize,
    whole: bool,
    staging: Vec<u8>,
    _keep: Option<Arc<dyn Any + Send + Sync>>,
}

// SAFETY: a writer or reader touches only the slots its caller reserved or claimed (the
// contracts of `write` and `try_read_with`) and keeps the memory alive as its half does
// (`_keep`, or the half's own guarantee, which those contracts extend).
unsafe impl Send for Detached {}

impl std::fmt::Debug for Detached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Detached")
            .field("slot_size", &self.slot_size)
            .finish()
    }
}

impl Detached {
    fn new(ring: &Ring, whole: bool) -> Self {
        Detached {
            units: ring.units,
            mask: ring.mask,
            slot_size: ring.slot_size,
            whole,
            staging: staging_for(ring.slot_size),
            _keep: ring._keep.clone(),
        }
    }

    /// The first unit of the slot of `index` (16-aligned: the region is, and stamped
    /// slots are whole units).
    #[inline(always)]
    fn slot(&self, index: u64) -> *mut u8 {
        let i = (index & self.mask) as usize;
        // SAFETY: slot `i` lies inside the region (i <= mask < capacity).
        unsafe {
            self.units
                .as_ptr()
                .add(i * stamped_slot_bytes(self.slot_size))
        }
    }
}

/// Writes slots a [`StampedProducer`] reserved, on any thread (see
/// [`StampedProducer::reserve`]). Holds its own staging buffer.
#[derive(Debug)]
pub struct StampedSlotWriter(Detached);

impl StampedSlotWriter {
    /// Encodes one message into the slot of `index`, as the producer's own pushes do.
    /// `MessageTooLarge` (nothing written) for a payload that does not fit a slot:
    /// check payloads before reserving, since a reserved slot left unwritten stops the
    /// consumer there.
    ///
    /// # Safety
    ///
    /// `index` lies in a range the producer this writer came from
    /// [`reserve`](StampedProducer::reserve)d for the caller and has not yet
    /// [`finish`](StampedProducer::finish)ed, no other writer writes it, and the
    /// ring's memory is still valid (the producer's own contract).
    #[inline]
    pub unsafe fn write(
        &mut self,
        index: u64,
        header: &MessageHeader,
        payload: &[u8],
    ) -> Result<()> {
        let d = &mut self.0;
        // SAFETY: the slot lies inside the region, 16-aligned (`Detached::slot`), and is
        // the caller's alone until it finishes the range (the contract above).
        unsafe {
            encode_slot(
                d.slot(index),
                &mut d.staging,
                d.slot_size,
                stamp_of(index),
                header,
                payload,
                d.whole,
            )
        }
    }
}

/// Reads slots a [`StampedConsumer`] claimed, on any thread (see
/// [`StampedConsumer::claim`]). Holds its own staging buffer.
#[derive(Debug)]
pub struct StampedSlotReader(Detached);

impl StampedSlotReader {
    /// Calls `f` on the message in the slot of `index` (header and payload as decoded,
    /// valid during the call) if its stamps say it is complete: `Ok(Some(_))` then,
    /// `Ok(None)` while it is not (call again). A complete slot with a corrupt header is
    /// an error, as in [`StampedConsumer::try_pop`].
    ///
    /// # Safety
    ///
    /// `index` lies in a range the consumer this reader came from
    /// [`claim`](StampedConsumer::claim)ed for the caller and has not yet
    /// [`release`](StampedConsumer::release)d, and the ring's memory is still valid
    /// (the consumer's own contract).
    pub unsafe fn try_read_with<R>(
        &mut self,
        index: u64,
        f: impl FnOnce(&MessageHeader, &[u8]) -> R,
    ) -> Result<Option<R>> {
        let d = &mut self.0;
        // As the consumer's own batch loop does (`Ring::prefetch_ahead`): a hint only,
        // harmless for a slot nobody claimed.
        prefetch(
            d.slot(index.wrapping_add(PREFETCH_AHEAD)),
            stamped_slot_bytes(d.slot_size),
        );
        // The producer does not reuse this slot before the head passes it, which needs
        // the caller's release (the contract above).
        let slot = d.slot(index);
        if decode_slot_at(&mut d.staging, slot, d.slot_size, stamp_of(index), d.whole).is_none() {
            return Ok(None);
        }
        let bytes = &d.staging[..d.slot_size];
        let h = check_slot(bytes, index)?;
        Ok(Some(f(
            &h,
            &bytes[HEADER_SIZE..HEADER_SIZE + h.payload_len as usize],
        )))
    }
}

/// Watches a stamped ring for its next message without consuming (see
/// [`StampedConsumer::watcher`]).
pub struct StampedWatcher {
    header: NonNull<QueueHeader>,
    units: NonNull<u8>,
    slot_bytes: usize,
    mask: u64,
    _keep: Option<Arc<dyn Any + Send + Sync>>,
}

impl std::fmt::Debug for StampedWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StampedWatcher")
            .field("mask", &self.mask)
            .finish()
    }
}

// SAFETY: the watcher only loads the header's head and unit stamps atomically; the
// memory stays valid as long as `_keep` (or the consumer's own guarantee) lives.
unsafe impl Send for StampedWatcher {}
// SAFETY: as above; `&self` methods only perform atomic loads.
unsafe impl Sync for StampedWatcher {}

impl StampedWatcher {
    /// The consumer's head (the index of the next message it will take).
    pub fn head(&self) -> u64 {
        let h = self.header.as_ptr();
        // SAFETY: the header is valid and aligned (checked when the ring was made); the
        // head is an aligned u64 every party accesses atomically.
        unsafe { AtomicU64::from_ptr(std::ptr::addr_of_mut!((*h).head)) }.load(Ordering::Acquire)
    }

    /// Whether the message of `index` has begun to arrive (its first unit carries its
    /// stamp). Cheap: one load of host memory.
    pub fn started(&self, index: u64) -> bool {
        let i = (index & self.mask) as usize;
        // SAFETY: slot `i` lies inside the region (i <= mask < capacity); its first
        // unit's stamp is an aligned u32 accessed atomically by every party.
        let stamp = unsafe {
            AtomicU32::from_ptr(
                self.units
                    .as_ptr()
                    .add(i * self.slot_bytes + UNIT_DATA)
                    .cast(),
            )
        };
        stamp.load(Ordering::Acquire) == stamp_of(index)
    }
}

/// A stamped ring in host memory: `capacity` slots (power of two) of `slot_size`
/// logical bytes (a multiple of 16, at least 128).
pub fn stamped_channel(
    capacity: usize,
    slot_size: usize,
) -> Result<(StampedProducer, StampedConsumer)> {
    let bytes = stamped_ring_bytes(capacity, slot_size)?;
    let header = super::slot::new_header(capacity, slot_size)?;
    let mem = Arc::new(AlignedBuf::zeroed(bytes)?);
    let base = mem.ptr.as_ptr();
    // SAFETY: `base` points to `bytes` zeroed bytes aligned to 64, the first 128 of
    // which are the header; nothing else refers to the allocation yet.
    unsafe { base.cast::<QueueHeader>().write(header) };
    let hdr = mem.ptr.cast::<QueueHeader>();
    // SAFETY: the units start right after the 128-byte header, in bounds.
    let units = unsafe { NonNull::new_unchecked(base.add(std::mem::size_of::<QueueHeader>())) };
    let keep: Arc<dyn Any + Send + Sync> = mem;
    // SAFETY: the region lives as long as `keep`, which both halves hold; the header was
    // initialised above; exactly one producer and one consumer are made.
    let (p, c) = unsafe {
        (
            Ring::new(hdr, units, Some(keep.clone()))?,
            Ring::new(hdr, units, Some(keep))?,
        )
    };
    Ok((StampedProducer::from_ring(p), StampedConsumer::from_ring(c)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::flags;

    #[test]
    fn whole_units_write_and_read_what_the_unit_loops_do() {
        let (mut a, mut ra) = stamped_channel(8, 128).unwrap();
        let (mut b, mut rb) = stamped_channel(8, 128).unwrap();
        let mut h = MessageHeader::new(3, 0);
        for (i, len) in [0usize, 1, 11, 12, 13, 64].into_iter().enumerate() {
            h.message_id = i as u64;
            let payload: Vec<u8> = (0..len).map(|j| (j * 7 + i) as u8).collect();
            assert!(a.has_room() && b.has_room());
            a.write_next(&h, &payload, false).unwrap();
            b.write_next(&h, &payload, whole_units()).unwrap();
        }
        let n = 8 * stamped_slot_bytes(128);
        // SAFETY: each region holds 8 stamped slots (`stamped_channel`), written above
        // and not written meanwhile.
        let (x, y) = unsafe {
            (
                std::slice::from_raw_parts(a.ring.units.as_ptr(), n),
                std::slice::from_raw_parts(b.ring.units.as_ptr(), n),
            )
        };
        assert_eq!(x, y);
        // Read back unit by unit from one ring and whole units from the other.
        ra.whole = false;
        rb.whole = whole_units();
        let mut got: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        let n = ra
            .try_pop_batch_with(usize::MAX, |h, p| {
                got.push((bytemuck::bytes_of(h).to_vec(), p.to_vec()))
            })
            .unwrap();
        let mut i = 0;
        let m = rb
            .try_pop_batch_with(usize::MAX, |h, p| {
                assert_eq!((bytemuck::bytes_of(h), p), (&got[i].0[..], &got[i].1[..]));
                i += 1;
            })
            .unwrap();
        assert_eq!((n, m, i), (6, 6, 6));
        #[cfg(target_arch = "x86_64")]
        assert_eq!(whole_units(), std::arch::is_x86_feature_detected!("avx"));
    }

    #[test]
    fn layout_sizes() {
        assert_eq!(units_per_slot(256), 22);
        assert_eq!(stamped_slot_bytes(256), 352);
        assert_eq!(units_used(0), 6);
        assert_eq!(units_used(64), 11);
        assert_eq!(stamp_of(u32::MAX as u64), 0);
        assert!(stamped_ring_bytes(3, 256).is_err());
        assert!(stamped_ring_bytes(4, 100).is_err());
    }

    #[test]
    fn messages_round_trip_in_order_across_laps_and_sizes() {
        let (mut tx, mut rx) = stamped_channel(8, 256).unwrap();
        let mut next = 0u32;
        for round in 0..40usize {
            let n = 1 + round % 8;
            let payloads: Vec<Vec<u8>> = (0..n)
                .map(|i| {
                    let len = (round * 37 + i * 11) % 193;
                    (0..len)
                        .map(|b| (b as u8) ^ (next + i as u32) as u8)
                        .collect()
                })
                .collect();
            let headers: Vec<MessageHeader> = (0..n)
                .map(|i| {
                    let mut h = MessageHeader::new(next + i as u32, 0);
                    if i % 2 == 0 {
                        h.flags |= flags::CHECKSUM;
                    }
                    h
                })
                .collect();
            let sent = tx
                .try_push_batch(headers.iter().zip(&payloads).map(|(h, p)| (h, &p[..])))
                .unwrap();
            assert_eq!(sent, n);
            for (i, p) in payloads.iter().enumerate() {
                let env = rx.try_pop().unwrap().expect("a complete message");
                assert_eq!(env.header.type_id, next + i as u32);
                assert_eq!(&env.payload, p);
            }
            assert!(rx.try_pop().unwrap().is_none());
            next += n as u32;
        }
    }

    #[test]
    fn a_full_ring_refuses_and_an_oversized_payload_is_an_error() {
        let (mut tx, mut rx) = stamped_channel(4, 128).unwrap();
        let h = MessageHeader::new(1, 0);
        let msgs = [b"a", b"b", b"c", b"d", b"e"];
        assert_eq!(
            tx.try_push_batch(msgs.iter().map(|p| (&h, &p[..])))
                .unwrap(),
            4
        );
        assert!(matches!(
            tx.try_push(&h, b"x"),
            Err(Error::QueueFull { .. })
        ));
        assert!(matches!(
            tx.try_push(&h, &[0u8; 65]),
            Err(Error::MessageTooLarge { .. })
        ));
        assert_eq!(tx.depth(), 4);
        assert_eq!(rx.try_pop().unwrap().unwrap().payload, b"a");
        assert_eq!(tx.depth(), 3);
        tx.try_push(&h, b"f").unwrap();
        let rest: Vec<u8> = std::iter::from_fn(|| rx.try_pop().unwrap())
            .map(|e| e.payload[0])
            .collect();
        assert_eq!(rest, b"bcdf");
    }

    #[test]
    fn reserved_ranges_publish_in_order_and_claimed_ranges_free_in_order() {
        let (mut tx, mut rx) = stamped_channel(8, 128).unwrap();
        let h = MessageHeader::new(1, 0);
        let (a, na) = tx.reserve(2);
        let (b, nb) = tx.reserve(3);
        assert_eq!((a, na, b, nb), (0, 2, 2, 3));
        // Only 3 free slots are left of 8.
        assert_eq!(tx.reserve(4), (5, 3));
        tx.finish(5, 3);
        let (mut wa, mut wb) = (tx.slot_writer(), tx.slot_writer());
        // SAFETY: each index lies in a range reserved above and not yet finished; the
        // ring outlives the writers.
        unsafe {
            for i in 0..3 {
                wb.write(b + i, &h, &[b'b', i as u8]).unwrap();
            }
        }
        // B is written and finished, but A before it is not: nothing is published, and
        // the consumer sees nothing at its head.
        assert_eq!(tx.finish(b, nb), 0);
        assert_eq!(rx.announced(), 0);
        assert!(rx.try_pop().unwrap().is_none());
        unsafe {
            for i in 0..2 {
                wa.write(a + i, &h, &[b'a', i as u8]).unwrap();
            }
        }
        // A's end publishes B's and the last range's (finished before it was written:
        // its slots are not stamped, so the consumer stops there).
        assert_eq!(tx.finish(a, na), 8);
        assert_eq!(rx.announced(), 8);
        let (c1, n1) = rx.claim(2, rx.announced());
        let (c2, n2) = rx.claim(2, rx.announced());
        assert_eq!((c1, n1, c2, n2), (0, 2, 2, 2));
        let mut r = rx.slot_reader();
        let mut read = |i: u64| {
            // SAFETY: `i` lies in a range claimed above and not yet released.
            unsafe { r.try_read_with(i, |_, p| p.to_vec()) }.unwrap()
        };
        assert_eq!(read(2), Some(b"b\0".to_vec()));
        // Not the last claim: it cannot shrink. The last one can.
        assert!(!rx.shrink_claim(c1, n1, 1));
        let (c3, n3) = rx.claim(4, 8);
        assert_eq!((c3, n3), (4, 4));
        assert!(rx.shrink_claim(c3, n3, 0));
        assert_eq!(rx.position(), 4);
        assert_eq!(read(0), Some(b"a\0".to_vec()));
        // The second claim is released first: the head stays until the first is.
        rx.release(c2, n2);
        assert_eq!(tx.depth(), 8);
        rx.release(c1, n1);
        assert_eq!(tx.depth(), 4);
        // A pop goes on from the claims' end, and frees in order too.
        assert_eq!(rx.try_pop().unwrap().unwrap().payload, b"b\x02");
        assert_eq!(tx.depth(), 3);
        assert!(
            rx.try_pop().unwrap().is_none(),
            "slot 5 was reserved, never written"
        );
    }

    #[test]
    fn several_threads_write_and_read_one_ring_without_loss() {
        use std::sync::Mutex;
        const PER: u64 = 20_000;
        const THREADS: u64 = 3;
        let (tx, rx) = stamped_channel(64, 128).unwrap();
        let (tx, rx) = (Arc::new(Mutex::new(tx)), Arc::new(Mutex::new(rx)));
        let seen = Arc::new(Mutex::new(vec![0u8; (PER * THREADS) as usize]));
        let taken = Arc::new(AtomicU64::new(0));
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let tx = tx.clone();
                s.spawn(move || {
                    let mut w = tx.lock().unwrap().slot_writer();
                    let mut next = 0u64;
                    while next < PER {
                        let want = ((t + 1) * 3).min(PER - next) as usize;
                        let (first, n) = tx.lock().unwrap().reserve(want);
                        for k in 0..n as u64 {
                            let id = t * PER + next + k;
                            let h = MessageHeader::new(2, 8);
                            // SAFETY: reserved above, finished below; the ring lives
                            // in the scope.
                            unsafe { w.write(first + k, &h, &id.to_le_bytes()).unwrap() };
                        }
                        next += n as u64;
                        tx.lock().unwrap().finish(first, n);
                        if n == 0 {
                            std::thread::yield_now();
                        }
                    }
                });
            }
            for _ in 0..2 {
                let (rx, seen, taken) = (rx.clone(), seen.clone(), taken.clone());
                s.spawn(move || {
                    let mut r = rx.lock().unwrap().slot_reader();
                    let total = (PER * THREADS) as usize;
                    while (taken.load(Ordering::Relaxed) as usize) < total {
                        let (first, n) = {
                            let mut c = rx.lock().unwrap();
                            let upto = c.announced();
                            c.claim(5, upto)
                        };
                        for k in 0..n as u64 {
                            // SAFETY: claimed above, released below.
                            let id = loop {
                                if let Some(id) = unsafe {
                                    r.try_read_with(first + k, |_, p| {
                                        u64::from_le_bytes(p.try_into().unwrap())
                                    })
                                }
                                .unwrap()
                                {
                                    break id;
                                }
                            };
                            seen.lock().unwrap()[id as usize] += 1;
                        }
                        rx.lock().unwrap().release(first, n);
                        taken.fetch_add(n as u64, Ordering::Relaxed);
                        if n == 0 {
                            std::thread::yield_now();
                        }
                    }
                });
            }
        });
        // Every message arrived exactly once.
        assert!(seen.lock().unwrap().iter().all(|&c| c == 1));
        assert_eq!(taken.load(Ordering::Relaxed), PER * THREADS);
        assert_eq!(rx.lock().unwrap().announced(), PER * THREADS);
        assert_eq!(tx.lock().unwrap().depth(), 0);
    }

    #[test]
    fn a_unit_with_a_stale_stamp_hides_the_message_until_it_is_written() {
        let (mut tx, mut rx) = stamped_channel(4, 256).unwrap();
        tx.try_push(&MessageHeader::new(3, 0), &[7u8; 100]).unwrap();
        // Tear the message: the last used unit still carries the previous lap's stamp.
        let slot = rx.ring.slot_ptr(0);
        let last = units_used(100) - 1;
        Ring::stamp(slot, last).store(stamp_of(0).wrapping_sub(4), Ordering::Release);
        assert!(rx.try_pop().unwrap().is_none());
        Ring::stamp(slot, last).store(stamp_of(0), Ordering::Release);
        assert_eq!(rx.try_pop().unwrap().unwrap().payload, vec![7u8; 100]);
    }

    #[test]
    fn a_complete_but_corrupt_slot_is_consumed_and_reported() {
        let (mut tx, mut rx) = stamped_channel(4, 256).unwrap();
        tx.try_push(&MessageHeader::new(3, 0), b"abc").unwrap();
        tx.try_push(&MessageHeader::new(4, 0), b"def").unwrap();
        // Break the magic of the first message (unit 0's first word), keeping its stamp.
        let slot = rx.ring.slot_ptr(0);
        // SAFETY: unit 0 of slot 0, inside the ring, not being written by the producer.
        unsafe { slot.cast::<u32>().write(0xdead_beef) };
        assert!(rx.try_pop().is_err());
        assert_eq!(rx.try_pop().unwrap().unwrap().header.type_id, 4);
    }
}
