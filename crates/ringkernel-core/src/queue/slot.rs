//! Rings of fixed-size message slots (64-byte header + payload), written in place.
//!
//! [`SlotProducer`]/[`SlotConsumer`] are an SPSC ring in the shared layout
//! ([`QueueHeader`] followed by `capacity * slot_size` bytes), which GPU backends also
//! place in mapped or device memory. [`SlotSender`]/[`SlotReceiver`] are the
//! multi-producer variant used for kernel input queues on the host, where the host,
//! other kernels (K2K) and the pub/sub broker all write.
//!
//! ```
//! use ringkernel_core::message::MessageHeader;
//! use ringkernel_core::queue::slot::slot_channel;
//!
//! let (mut tx, mut rx) = slot_channel(4, 256).unwrap();
//! tx.try_push(&MessageHeader::new(7, 3), b"abc").unwrap();
//! let env = rx.try_pop().unwrap().unwrap();
//! assert_eq!((env.header.type_id, env.payload.as_slice()), (7, &b"abc"[..]));
//! assert!(rx.try_pop().unwrap().is_none());
//! ```
//!
//! Both rings write straight into the slot (no intermediate buffer) and read either
//! into an owned [`Envelope`] ([`SlotConsumer::try_pop`]) or in place
//! ([`SlotConsumer::pop_with`]). A slot whose header is corrupt (bad magic or version,
//! a `payload_len` larger than the slot, a checksum mismatch when flagged) is consumed
//! and reported, so it can never wedge the queue.

use super::{check_capacity, QueueHeader, QueueStats};
use crate::error::{Error, Result};
use crate::message::{
    check_payload_fits, flags, fnv1a32, max_payload, write_slot_fitting, write_slot_owned,
    Envelope, MessageHeader, HEADER_SIZE, MESSAGE_MAGIC, MESSAGE_VERSION,
};
use std::alloc::Layout;
use std::any::Any;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Smallest slot size in bytes (a header plus 64 payload bytes).
pub const MIN_SLOT_SIZE: usize = 128;
/// Largest slot size in bytes.
pub const MAX_SLOT_SIZE: usize = 1 << 24;
/// Alignment of the shared ring layout (header and slot region).
pub const RING_ALIGN: usize = 64;

/// A slot size is a multiple of this many bytes, so every slot (and the payload after
/// its 64-byte header) starts on a 16-byte boundary: the GPU templates move slots in
/// 16-byte units, and a payload of 8-byte fields is read in place.
pub const SLOT_ALIGN: usize = 16;

/// Checks that `slot_size` is a multiple of [`SLOT_ALIGN`] in
/// `MIN_SLOT_SIZE..=MAX_SLOT_SIZE`. It need not be a power of two: a slot fitted to its
/// message (144 bytes for a 72-byte payload, not 256) moves fewer bytes a message.
pub fn check_slot_size(slot_size: usize) -> Result<()> {
    check_slot_size_up_to(slot_size, MAX_SLOT_SIZE)
}

/// [`check_slot_size`] with a lower maximum (`max`, at most [`MAX_SLOT_SIZE`]).
pub fn check_slot_size_up_to(slot_size: usize, max: usize) -> Result<()> {
    if !slot_size.is_multiple_of(SLOT_ALIGN)
        || !(MIN_SLOT_SIZE..=max.min(MAX_SLOT_SIZE)).contains(&slot_size)
    {
        Err(Error::invalid(format!(
            "slot_size must be a multiple of {SLOT_ALIGN} in {MIN_SLOT_SIZE}..={max}, got {slot_size}"
        )))
    } else {
        Ok(())
    }
}

/// Size in bytes of the slot region of a ring (`capacity * slot_size`), after checking
/// both values.
pub fn slot_region_bytes(capacity: usize, slot_size: usize) -> Result<usize> {
    check_capacity(capacity)?;
    check_slot_size(slot_size)?;
    capacity
        .checked_mul(slot_size)
        .filter(|&n| n <= isize::MAX as usize - std::mem::size_of::<QueueHeader>())
        .ok_or_else(|| {
            Error::invalid(format!(
                "a ring of {capacity} slots of {slot_size} bytes does not fit in memory"
            ))
        })
}

/// Size in bytes of a whole ring in the shared layout: the 128-byte [`QueueHeader`]
/// followed by `capacity * slot_size` bytes of slots.
pub fn ring_bytes(capacity: usize, slot_size: usize) -> Result<usize> {
    Ok(std::mem::size_of::<QueueHeader>() + slot_region_bytes(capacity, slot_size)?)
}

/// A fresh header (indices 0) for a ring of `capacity` slots of `slot_size` bytes.
pub fn new_header(capacity: usize, slot_size: usize) -> Result<QueueHeader> {
    slot_region_bytes(capacity, slot_size)?;
    Ok(QueueHeader {
        capacity: capacity as u32,
        slot_size: slot_size as u32,
        mask: (capacity - 1) as u32,
        ..QueueHeader::default()
    })
}

/// Creates an SPSC slot ring: `capacity` slots (power of two) of `slot_size` bytes
/// (a multiple of 16, at least 128).
pub fn slot_channel(capacity: usize, slot_size: usize) -> Result<(SlotProducer, SlotConsumer)> {
    let bytes = ring_bytes(capacity, slot_size)?;
    let header = new_header(capacity, slot_size)?;
    let mem = Arc::new(AlignedBuf::zeroed(bytes)?);
    let base = mem.ptr.as_ptr();
    // SAFETY: `base` points to `bytes` zeroed bytes aligned to 64, of which the first
    // 128 are the header (QueueHeader is 128 bytes, align 64) and nothing else refers to
    // the allocation yet.
    unsafe { base.cast::<QueueHeader>().write(header) };
    let hdr = mem.ptr.cast::<QueueHeader>();
    // SAFETY: the header sits at offset 0 of `mem` (size 128), so slots start in bounds.
    let slots = unsafe { NonNull::new_unchecked(base.add(std::mem::size_of::<QueueHeader>())) };
    let full = Arc::new(AtomicU64::new(0));
    let keep: Arc<dyn Any + Send + Sync> = mem;
    // SAFETY: the region is valid for the lifetime of `keep`, which both halves hold;
    // the header was initialised above; exactly one producer and one consumer are made.
    let ring_p = unsafe { RawRing::new(hdr, slots, Some(keep.clone()), full.clone())? };
    // SAFETY: as above.
    let ring_c = unsafe { RawRing::new(hdr, slots, Some(keep), full)? };
    Ok((
        SlotProducer::from_ring(ring_p),
        SlotConsumer::from_ring(ring_c),
    ))
}

/// Creates an MPSC slot ring.
pub fn mpsc_slot_channel(capacity: usize, slot_size: usize) -> Result<(SlotSender, SlotReceiver)> {
    let bytes = slot_region_bytes(capacity, slot_size)?;
    let shared = Arc::new(MpscShared {
        tail: Padded(AtomicU64::new(0)),
        head: Padded(AtomicU64::new(0)),
        full_rejections: Padded(AtomicU64::new(0)),
        seq: (0..capacity as u64)
            .map(|i| AtomicU64::new(seq_free(i)))
            .collect(),
        data: AlignedBuf::zeroed(bytes)?,
        capacity,
        slot_size,
        mask: capacity as u64 - 1,
    });
    Ok((
        SlotSender {
            shared: shared.clone(),
        },
        SlotReceiver { shared, head: 0 },
    ))
}

/// A heap allocation of zeroed bytes aligned to [`RING_ALIGN`].
pub(crate) struct AlignedBuf {
    pub(crate) ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: AlignedBuf is just an owned block of bytes; every access to its contents goes
// through the ring types, which synchronise with atomics.
unsafe impl Send for AlignedBuf {}
// SAFETY: as above; `&AlignedBuf` gives no access to the bytes by itself.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    pub(crate) fn zeroed(bytes: usize) -> Result<Self> {
        let layout = Layout::from_size_align(bytes.max(1), RING_ALIGN)
            .map_err(|e| Error::invalid(format!("ring of {bytes} bytes: {e}")))?;
        // SAFETY: `layout` has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).ok_or_else(|| {
            Error::Device(format!("out of memory allocating a ring of {bytes} bytes"))
        })?;
        Ok(AlignedBuf { ptr, layout })
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `alloc_zeroed` with this very layout and is freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// Aligns its contents to 128 bytes (one index per cache-line pair).
#[repr(C, align(128))]
struct Padded<T>(T);

/// Validates the slot at `bytes` and returns its header. `index` is only for messages.
#[inline(always)]
pub(crate) fn check_slot(bytes: &[u8], index: u64) -> Result<MessageHeader> {
    let header: MessageHeader = bytemuck::pod_read_unaligned(&bytes[..HEADER_SIZE]);
    validate_slot(&header, bytes, index)?;
    Ok(header)
}

/// As [`check_slot`] for a slot of a ring, whose header is read in place (not copied).
///
/// # Safety
/// `bytes` starts 8-aligned (ring slots do: see the callers) and is not written while
/// the returned reference lives.
#[inline(always)]
unsafe fn check_ring_slot(bytes: &[u8], index: u64) -> Result<&MessageHeader> {
    let head = &bytes[..HEADER_SIZE];
    // SAFETY: `head` holds HEADER_SIZE bytes, starts 8-aligned (the caller's promise)
    // and MessageHeader is Pod with align 8 and size HEADER_SIZE.
    let header = unsafe { &*head.as_ptr().cast::<MessageHeader>() };
    validate_slot(header, bytes, index)?;
    Ok(header)
}

/// What [`check_slot`] checks: magic and version, `payload_len` within the slot, and
/// the checksum when flagged.
#[inline(always)]
fn validate_slot(header: &MessageHeader, bytes: &[u8], index: u64) -> Result<()> {
    let len = header.payload_len as usize;
    if header.magic != MESSAGE_MAGIC
        || header.version != MESSAGE_VERSION
        || len > max_payload(bytes.len())
        || (header.flags & flags::CHECKSUM != 0
            && fnv1a32(&bytes[HEADER_SIZE..HEADER_SIZE + len]) != header.checksum)
    {
        return Err(corrupt_slot(header, bytes.len(), index));
    }
    Ok(())
}

/// The error of a slot [`validate_slot`] refuses.
#[cold]
fn corrupt_slot(header: &MessageHeader, slot_len: usize, index: u64) -> Error {
    if header.magic != MESSAGE_MAGIC || header.version != MESSAGE_VERSION {
        return Error::Device(format!(
            "corrupt message slot at index {index}: magic {:#010x} version {} (expected {:#010x} version {})",
            header.magic, header.version, MESSAGE_MAGIC, MESSAGE_VERSION
        ));
    }
    let len = header.payload_len as usize;
    let max = max_payload(slot_len);
    if len > max {
        return Error::Device(format!(
            "corrupt message slot at index {index}: payload_len {len} exceeds the slot's maximum payload of {max} bytes"
        ));
    }
    Error::Device(format!(
        "checksum mismatch on message {} (type {}) at slot index {index}",
        header.message_id, header.type_id
    ))
}

/// Writes `header` + `payload` into `slot`, stamping magic and version (as
/// [`write_slot`](crate::message::write_slot) does with them set, with one copy of the
/// header).
#[inline]
pub(crate) fn fill_slot(slot: &mut [u8], header: &MessageHeader, payload: &[u8]) -> Result<()> {
    let mut h = *header;
    h.magic = MESSAGE_MAGIC;
    h.version = MESSAGE_VERSION;
    write_slot_owned(slot, h, payload)
}

/// [`fill_slot`] for a payload already checked against the slot's size (panics if it
/// does not fit).
#[inline(always)]
fn fill_slot_fitting(slot: &mut [u8], header: &MessageHeader, payload: &[u8]) {
    let mut h = *header;
    h.magic = MESSAGE_MAGIC;
    h.version = MESSAGE_VERSION;
    write_slot_fitting(slot, h, payload);
}

/// The host's view of one ring in the shared layout.
struct RawRing {
    header: NonNull<QueueHeader>,
    slots: NonNull<u8>,
    capacity: usize,
    slot_size: usize,
    mask: u64,
    full_rejections: Arc<AtomicU64>,
    _keep: Option<Arc<dyn Any + Send + Sync>>,
}

// SAFETY: the ring memory is only touched through atomics (indices) and through slots
// that the index protocol hands to exactly one side at a time; `new`'s caller promised
// that the memory stays valid while `_keep` (or the caller's own guarantee) lives.
unsafe impl Send for RawRing {}
// SAFETY: through `&RawRing` (and so `&SlotProducer`/`&SlotConsumer`) only atomic loads of
// the header indices and reads of fields fixed at construction are possible; every slot
// access needs `&mut` of the owning half.
unsafe impl Sync for RawRing {}

impl RawRing {
    /// # Safety
    /// See [`SlotProducer::from_raw_parts`].
    unsafe fn new(
        header: NonNull<QueueHeader>,
        slots: NonNull<u8>,
        keep: Option<Arc<dyn Any + Send + Sync>>,
        full_rejections: Arc<AtomicU64>,
    ) -> Result<Self> {
        if !(header.as_ptr() as usize).is_multiple_of(std::mem::align_of::<QueueHeader>()) {
            return Err(Error::invalid("queue header is not 64-byte aligned"));
        }
        if !(slots.as_ptr() as usize).is_multiple_of(8) {
            return Err(Error::invalid("slot region is not 8-byte aligned"));
        }
        let h = header.as_ptr();
        // SAFETY: the caller guarantees `header` is valid for reads; these fields are
        // constants that no side writes while the ring is in use.
        let (capacity, slot_size, mask) = unsafe {
            (
                std::ptr::addr_of!((*h).capacity).read(),
                std::ptr::addr_of!((*h).slot_size).read(),
                std::ptr::addr_of!((*h).mask).read(),
            )
        };
        let (capacity, slot_size) = (capacity as usize, slot_size as usize);
        slot_region_bytes(capacity, slot_size)?;
        if mask as usize != capacity - 1 {
            return Err(Error::invalid(format!(
                "queue header mask {mask} does not match capacity {capacity}"
            )));
        }
        Ok(RawRing {
            header,
            slots,
            capacity,
            slot_size,
            mask: mask as u64,
            full_rejections,
            _keep: keep,
        })
    }

    #[inline(always)]
    fn tail(&self) -> &AtomicU64 {
        // SAFETY: the header is valid and 64-aligned (checked in `new`), so `tail` is an
        // aligned u64 that every party accesses atomically only (caller's guarantee).
        unsafe { AtomicU64::from_ptr(std::ptr::addr_of_mut!((*self.header.as_ptr()).tail)) }
    }

    #[inline(always)]
    fn head(&self) -> &AtomicU64 {
        // SAFETY: as for `tail`.
        unsafe { AtomicU64::from_ptr(std::ptr::addr_of_mut!((*self.header.as_ptr()).head)) }
    }

    #[inline(always)]
    fn slot_ptr(&self, index: u64) -> *mut u8 {
        let i = (index & self.mask) as usize;
        // SAFETY: `i < capacity` and the region holds `capacity * slot_size` bytes.
        unsafe { self.slots.as_ptr().add(i * self.slot_size) }
    }

    fn stats(&self) -> QueueStats {
        let dequeued = self.head().load(Ordering::Acquire);
        let enqueued = self.tail().load(Ordering::Acquire);
        QueueStats {
            enqueued,
            dequeued,
            full_rejections: self.full_rejections.load(Ordering::Relaxed),
            depth: enqueued.saturating_sub(dequeued).min(self.capacity as u64) as usize,
            capacity: self.capacity,
        }
    }
}

/// Producing half of an SPSC slot ring.
pub struct SlotProducer {
    ring: RawRing,
    /// Local copy of the tail (only this side writes it).
    tail: u64,
    /// Last head seen; refreshed only when the ring looks full.
    cached_head: u64,
}

/// Consuming half of an SPSC slot ring.
pub struct SlotConsumer {
    ring: RawRing,
    /// Local copy of the head (only this side writes it).
    head: u64,
    /// Last tail seen; refreshed only when the ring looks empty.
    cached_tail: u64,
}

/// A producing handle of an MPSC slot ring (`Clone`).
#[derive(Clone)]
pub struct SlotSender {
    shared: Arc<MpscShared>,
}

/// The consuming handle of an MPSC slot ring.
pub struct SlotReceiver {
    shared: Arc<MpscShared>,
    head: u64,
}

impl std::fmt::Debug for SlotProducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotProducer")
            .field("stats", &self.stats())
            .finish()
    }
}
impl std::fmt::Debug for SlotConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotConsumer")
            .field("stats", &self.stats())
            .finish()
    }
}
impl std::fmt::Debug for SlotSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotSender")
            .field("stats", &self.stats())
            .finish()
    }
}
impl std::fmt::Debug for SlotReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotReceiver")
            .field("stats", &self.stats())
            .finish()
    }
}

impl SlotProducer {
    fn from_ring(ring: RawRing) -> Self {
        let tail = ring.tail().load(Ordering::Relaxed);
        let cached_head = ring.head().load(Ordering::Acquire);
        SlotProducer {
            ring,
            tail,
            cached_head,
        }
    }

    /// A producer over a ring whose memory is owned elsewhere (for example a queue a GPU
    /// backend placed in host-mapped memory, whose consumer is a device kernel).
    /// Capacity and slot size are read from the header, which must already be
    /// initialised (see [`new_header`]); `InvalidArgument` if its values are not valid
    /// or a pointer is misaligned. `keep_alive`, if given, is held as long as the
    /// producer lives (e.g. the mapping that owns the memory).
    ///
    /// # Safety
    ///
    /// The caller guarantees, for as long as the returned producer lives:
    /// * `header` points to a [`QueueHeader`] and `slots` to `capacity * slot_size`
    ///   bytes (the values in that header), both valid for reads and writes from this
    ///   thread and not freed or unmapped (`keep_alive` may be what ensures this);
    /// * `header.capacity`, `slot_size` and `mask` are not modified;
    /// * `tail` is written by no one but this producer, and `tail`/`head` are only
    ///   accessed atomically (naturally aligned 64-bit loads and stores) by every party;
    /// * the single consumer follows the protocol: it only reads slots in
    ///   `[head, tail)`, reads `tail` with acquire semantics and publishes `head` with
    ///   release semantics after it has finished reading a slot;
    /// * no other producer exists for this ring.
    pub unsafe fn from_raw_parts(
        header: NonNull<QueueHeader>,
        slots: NonNull<u8>,
        keep_alive: Option<Arc<dyn Any + Send + Sync>>,
    ) -> Result<Self> {
        // SAFETY: forwarded from this function's contract.
        let ring = unsafe { RawRing::new(header, slots, keep_alive, Arc::new(AtomicU64::new(0)))? };
        Ok(Self::from_ring(ring))
    }

    /// Whether a slot is free for the next push, re-reading the consumer's head only
    /// when the ring looks full (so the common case touches no shared cache line).
    #[inline(always)]
    pub fn has_room(&mut self) -> bool {
        let cap = self.ring.capacity as u64;
        if self.tail.wrapping_sub(self.cached_head) < cap {
            return true;
        }
        self.cached_head = self.ring.head().load(Ordering::Acquire);
        self.tail.wrapping_sub(self.cached_head) < cap
    }

    /// Writes one message into slot `tail` and advances the local tail without
    /// publishing it. The caller has checked the payload size and [`has_room`].
    ///
    /// [`has_room`]: Self::has_room
    #[inline(always)]
    fn write_next(&mut self, header: &MessageHeader, payload: &[u8]) -> Result<()> {
        // SAFETY: slot `tail` lies in [head, head + capacity) (the caller checked
        // `has_room`, whose head was acquire-loaded), so the consumer has released it and
        // will not read it until we publish a tail past it; the pointer covers
        // `slot_size` bytes of the region.
        let slot = unsafe {
            std::slice::from_raw_parts_mut(self.ring.slot_ptr(self.tail), self.ring.slot_size)
        };
        fill_slot(slot, header, payload)?;
        self.tail = self.tail.wrapping_add(1);
        Ok(())
    }

    /// Writes `header` and `payload` into the next slot. `MessageTooLarge` if the payload
    /// does not fit a slot, `QueueFull` if no slot is free; in both cases nothing changes.
    ///
    /// The queue stamps `magic` and `version`; `payload_len` and (when
    /// [`flags::CHECKSUM`] is set) `checksum` are filled in from `payload`.
    #[inline]
    pub fn try_push(&mut self, header: &MessageHeader, payload: &[u8]) -> Result<()> {
        check_payload_fits(payload.len(), self.ring.slot_size)?;
        if !self.has_room() {
            self.ring.full_rejections.fetch_add(1, Ordering::Relaxed);
            return Err(Error::QueueFull {
                capacity: self.ring.capacity,
            });
        }
        self.write_next(header, payload)?;
        self.ring.tail().store(self.tail, Ordering::Release);
        Ok(())
    }

    /// Writes messages from `msgs`, in order, into free slots and publishes them all
    /// with one release store of the tail (one index update per batch instead of one
    /// per message). Stops at the end of `msgs` or when the ring is full, and returns
    /// how many were written: the first `n` items of `msgs`. When the ring fills up,
    /// the item after them has been taken from the iterator but not written, and one
    /// rejection is counted in [`stats`](Self::stats); `Ok(0)` means the ring was full.
    ///
    /// A payload that does not fit a slot is `MessageTooLarge`: the messages before it
    /// are written and published (they count in `stats().enqueued`), nothing after it
    /// is taken. Each message is stamped as by [`try_push`](Self::try_push).
    ///
    /// ```
    /// use ringkernel_core::message::MessageHeader;
    /// use ringkernel_core::queue::slot::slot_channel;
    ///
    /// let (mut tx, mut rx) = slot_channel(4, 128).unwrap();
    /// let h = MessageHeader::new(1, 0);
    /// let msgs = [b"a", b"b", b"c", b"d", b"e"];
    /// let n = tx.try_push_batch(msgs.iter().map(|p| (&h, &p[..]))).unwrap();
    /// assert_eq!(n, 4); // the ring holds four
    /// let mut got = Vec::new();
    /// rx.try_pop_batch_with(usize::MAX, |_, p| got.push(p[0])).unwrap();
    /// assert_eq!(got, b"abcd");
    /// ```
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
                self.ring.full_rejections.fetch_add(1, Ordering::Relaxed);
                break;
            }
            if let Err(e) = self.write_next(header, payload) {
                result = Err(e);
                break;
            }
        }
        let written = self.tail.wrapping_sub(start) as usize;
        if written > 0 {
            self.ring.tail().store(self.tail, Ordering::Release);
        }
        result.map(|()| written)
    }

    /// The tail index: the index the next message will get (the number pushed so far
    /// when the ring started at 0). A plain read of this side's own copy: no atomic
    /// access to the shared header.
    pub fn position(&self) -> u64 {
        self.tail
    }

    /// Free slots (a lower bound: the consumer may free more meanwhile).
    pub fn free(&self) -> usize {
        let head = self.ring.head().load(Ordering::Acquire);
        self.ring
            .capacity
            .saturating_sub(self.tail.wrapping_sub(head) as usize)
    }

    /// Capacity in slots.
    pub fn capacity(&self) -> usize {
        self.ring.capacity
    }

    /// Slot size in bytes.
    pub fn slot_size(&self) -> usize {
        self.ring.slot_size
    }

    /// Counters.
    pub fn stats(&self) -> QueueStats {
        self.ring.stats()
    }
}

impl SlotConsumer {
    fn from_ring(ring: RawRing) -> Self {
        let head = ring.head().load(Ordering::Relaxed);
        let cached_tail = ring.tail().load(Ordering::Acquire);
        SlotConsumer {
            ring,
            head,
            cached_tail,
        }
    }

    /// A consumer over a ring whose memory is owned elsewhere (for example an output
    /// queue a device kernel produces into). Capacity and slot size are read from the
    /// header; `InvalidArgument` if they are not valid or a pointer is misaligned.
    ///
    /// # Safety
    ///
    /// As for [`SlotProducer::from_raw_parts`], with the roles swapped: `head` is
    /// written by no one but this consumer; the single producer only writes slots in
    /// `[tail, head + capacity)`, finishes writing a slot before it publishes `tail`
    /// with release semantics, and reads `head` with acquire semantics.
    pub unsafe fn from_raw_parts(
        header: NonNull<QueueHeader>,
        slots: NonNull<u8>,
        keep_alive: Option<Arc<dyn Any + Send + Sync>>,
    ) -> Result<Self> {
        // SAFETY: forwarded from this function's contract.
        let ring = unsafe { RawRing::new(header, slots, keep_alive, Arc::new(AtomicU64::new(0)))? };
        Ok(Self::from_ring(ring))
    }

    /// The slot at `head` if one is ready.
    #[inline]
    fn front(&mut self) -> Option<&[u8]> {
        if self.head == self.cached_tail {
            self.cached_tail = self.ring.tail().load(Ordering::Acquire);
            if self.head == self.cached_tail {
                return None;
            }
        }
        // SAFETY: head < tail (acquire-loaded), so the producer has finished writing
        // this slot and will not touch it until we publish head + 1.
        Some(unsafe {
            std::slice::from_raw_parts(self.ring.slot_ptr(self.head), self.ring.slot_size)
        })
    }

    #[inline]
    fn advance(&mut self) {
        self.head = self.head.wrapping_add(1);
        self.ring.head().store(self.head, Ordering::Release);
    }

    /// Takes the oldest message out, if any. A slot whose header is corrupt is consumed
    /// and reported as an error (so one bad slot cannot wedge the queue).
    pub fn try_pop(&mut self) -> Result<Option<Envelope>> {
        let index = self.head;
        let Some(bytes) = self.front() else {
            return Ok(None);
        };
        let res = check_slot(bytes, index).map(|header| Envelope {
            header,
            payload: bytes[HEADER_SIZE..HEADER_SIZE + header.payload_len as usize].to_vec(),
        });
        self.advance();
        res.map(Some)
    }

    /// As [`pop_with`](Self::pop_with), but a corrupt slot is consumed and returned as
    /// an error (without calling `f`).
    #[inline]
    pub fn try_pop_with<R>(
        &mut self,
        f: impl FnOnce(&MessageHeader, &[u8]) -> R,
    ) -> Result<Option<R>> {
        let index = self.head;
        let Some(bytes) = self.front() else {
            return Ok(None);
        };
        // SAFETY: slots start 8-aligned (checked at construction; slot_size is a
        // multiple of 64), and the slot stays ours (the producer does not write it)
        // until `advance`.
        let res = unsafe { check_ring_slot(bytes, index) }.map(|header| {
            f(
                header,
                &bytes[HEADER_SIZE..HEADER_SIZE + header.payload_len as usize],
            )
        });
        self.advance();
        res.map(Some)
    }

    /// Calls `f` on up to `max` waiting messages, in order and in place (no copy), then
    /// frees all their slots with one release store of the head. Returns how many were
    /// passed to `f` (`Ok(0)` when the ring is empty or `max` is 0).
    ///
    /// Every slot is validated exactly as by [`try_pop`](Self::try_pop) (magic and
    /// version, `payload_len` within the slot, checksum when flagged). A corrupt slot
    /// ends the batch: it is consumed (so it cannot wedge the ring), the messages
    /// before it have been passed to `f` and are freed too, and its error is returned.
    ///
    /// ```
    /// use ringkernel_core::message::MessageHeader;
    /// use ringkernel_core::queue::slot::slot_channel;
    ///
    /// let (mut tx, mut rx) = slot_channel(8, 128).unwrap();
    /// for i in 0..5u8 {
    ///     tx.try_push(&MessageHeader::new(2, 0), &[i]).unwrap();
    /// }
    /// let mut sum = 0;
    /// assert_eq!(rx.try_pop_batch_with(3, |_, p| sum += p[0]).unwrap(), 3);
    /// assert_eq!(sum, 0 + 1 + 2);
    /// assert_eq!(rx.try_pop_batch_with(usize::MAX, |_, p| sum += p[0]).unwrap(), 2);
    /// assert_eq!(rx.try_pop_batch_with(usize::MAX, |_, _| unreachable!()).unwrap(), 0);
    /// ```
    pub fn try_pop_batch_with(
        &mut self,
        max: usize,
        mut f: impl FnMut(&MessageHeader, &[u8]),
    ) -> Result<usize> {
        if max == 0 {
            return Ok(0);
        }
        let mut avail = self.cached_tail.wrapping_sub(self.head);
        if avail < max as u64 {
            self.cached_tail = self.ring.tail().load(Ordering::Acquire);
            avail = self.cached_tail.wrapping_sub(self.head);
        }
        let n = avail.min(max as u64);
        let start = self.head;
        let mut result = Ok(());
        while self.head.wrapping_sub(start) < n {
            let index = self.head;
            // SAFETY: head < tail (acquire-loaded above or when cached), so the producer
            // has finished writing this slot and will not touch it until we publish a
            // head past it; the pointer covers `slot_size` bytes of the region.
            let bytes = unsafe {
                std::slice::from_raw_parts(self.ring.slot_ptr(index), self.ring.slot_size)
            };
            self.head = index.wrapping_add(1);
            match check_slot(bytes, index) {
                Ok(h) => {
                    // SAFETY: as in `try_pop_with`: 8-aligned, Pod, ours until published.
                    let header = unsafe { &*bytes.as_ptr().cast::<MessageHeader>() };
                    f(
                        header,
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
            self.ring.head().store(self.head, Ordering::Release);
        }
        result.map(|()| taken as usize)
    }

    /// Calls `f` on the oldest slot's header and payload in place (no copy), then frees
    /// the slot. Returns `None` when empty. Corrupt slots are consumed, logged with
    /// `tracing::warn!` and skipped; use [`try_pop_with`](Self::try_pop_with) to see
    /// them.
    pub fn pop_with<R>(&mut self, f: impl FnOnce(&MessageHeader, &[u8]) -> R) -> Option<R> {
        let mut f = Some(f);
        loop {
            let index = self.head;
            let bytes = self.front()?;
            match check_slot(bytes, index) {
                Ok(h) => {
                    // SAFETY: as in `try_pop_with`.
                    let header = unsafe { &*bytes.as_ptr().cast::<MessageHeader>() };
                    let f = f.take()?;
                    let r = f(
                        header,
                        &bytes[HEADER_SIZE..HEADER_SIZE + h.payload_len as usize],
                    );
                    self.advance();
                    return Some(r);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "dropping corrupt message slot");
                    self.advance();
                }
            }
        }
    }

    /// The head index: the index of the next message to take (the number taken so far
    /// when the ring started at 0). A plain read of this side's own copy.
    pub fn position(&self) -> u64 {
        self.head
    }

    /// Messages waiting.
    pub fn len(&self) -> usize {
        let tail = self.ring.tail().load(Ordering::Acquire);
        (tail.wrapping_sub(self.head) as usize).min(self.ring.capacity)
    }

    /// Whether no message is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Capacity in slots.
    pub fn capacity(&self) -> usize {
        self.ring.capacity
    }

    /// Slot size in bytes.
    pub fn slot_size(&self) -> usize {
        self.ring.slot_size
    }

    /// Counters.
    pub fn stats(&self) -> QueueStats {
        self.ring.stats()
    }
}

/// State of an MPSC slot ring (Vyukov's bounded queue: one sequence number per slot).
///
/// Slot `i` is free for position `pos` when `seq[i] == 2 pos`, holds the message of
/// position `pos` when `seq[i] == 2 pos + 1`, and is handed back to producers for the
/// next lap by setting `seq[i] = 2 (pos + capacity)`. Doubling keeps the three states
/// distinct even for a capacity of 1 (see [`mpsc`](super::mpsc)).
struct MpscShared {
    /// Next position to claim (producers CAS it).
    tail: Padded<AtomicU64>,
    /// Positions consumed (written by the receiver only; read for stats).
    head: Padded<AtomicU64>,
    full_rejections: Padded<AtomicU64>,
    seq: Box<[AtomicU64]>,
    data: AlignedBuf,
    capacity: usize,
    slot_size: usize,
    mask: u64,
}

/// Set in an MPSC ring's tail once the receiver closed the ring: producers see it in
/// the tail they claim positions from, so a claim after the close fails.
const CLOSED: u64 = 1 << 63;

/// The error of a push into a closed ring: the kernel reading it is gone.
#[cold]
fn closed() -> Error {
    Error::KernelTerminated("its input queue is closed".into())
}

/// Sequence of a slot that is free for position `pos`.
#[inline(always)]
fn seq_free(pos: u64) -> u64 {
    pos.wrapping_mul(2)
}

/// Sequence of a slot that holds the message of position `pos`.
#[inline(always)]
fn seq_written(pos: u64) -> u64 {
    pos.wrapping_mul(2).wrapping_add(1)
}

impl MpscShared {
    #[inline(always)]
    fn slot_ptr(&self, pos: u64) -> *mut u8 {
        let i = (pos & self.mask) as usize;
        // SAFETY: `i < capacity` and `data` holds `capacity * slot_size` bytes.
        unsafe { self.data.ptr.as_ptr().add(i * self.slot_size) }
    }

    fn stats(&self) -> QueueStats {
        let dequeued = self.head.0.load(Ordering::Acquire);
        let enqueued = self.tail.0.load(Ordering::Acquire) & !CLOSED;
        QueueStats {
            enqueued,
            dequeued,
            full_rejections: self.full_rejections.0.load(Ordering::Relaxed),
            depth: enqueued.saturating_sub(dequeued).min(self.capacity as u64) as usize,
            capacity: self.capacity,
        }
    }
}

impl SlotSender {
    /// As [`SlotProducer::try_push`], callable from any number of threads. Once the
    /// receiver has [closed](SlotReceiver::close) the ring: [`Error::KernelTerminated`].
    pub fn try_push(&self, header: &MessageHeader, payload: &[u8]) -> Result<()> {
        self.try_push_wake(header, payload).map(|_| ())
    }

    /// As [`try_push`](Self::try_push), and tells whether the receiver needs a wake-up
    /// for this message: `Ok(false)` only when the message before it (position − 1)
    /// was still waiting, unread, when this one was claimed. The receiver then reads
    /// that one first and, after it, either this one, or (if it looks again before this
    /// one is written) sees this claim: a receiver that checks
    /// [`is_empty`](SlotReceiver::is_empty) after a `SeqCst` fence before it goes idle
    /// cannot miss it. A producer that skips the wake-up on `false` saves a
    /// read-modify-write per message while a batch flows into a busy receiver.
    ///
    /// ```
    /// use ringkernel_core::message::MessageHeader;
    /// use ringkernel_core::queue::slot::mpsc_slot_channel;
    ///
    /// let (tx, mut rx) = mpsc_slot_channel(4, 128).unwrap();
    /// let h = MessageHeader::new(1, 0);
    /// assert!(tx.try_push_wake(&h, b"").unwrap()); // into an empty ring: wake
    /// assert!(!tx.try_push_wake(&h, b"").unwrap()); // behind an unread one: no need
    /// rx.try_pop().unwrap();
    /// rx.try_pop().unwrap();
    /// assert!(tx.try_push_wake(&h, b"").unwrap()); // everything read again: wake
    /// ```
    #[inline]
    pub fn try_push_wake(&self, header: &MessageHeader, payload: &[u8]) -> Result<bool> {
        let s = &*self.shared;
        check_payload_fits(payload.len(), s.slot_size)?;
        let mut pos = s.tail.0.load(Ordering::Relaxed);
        loop {
            if pos & CLOSED != 0 {
                return Err(closed());
            }
            let seq = s.seq[(pos & s.mask) as usize].load(Ordering::Acquire);
            let diff = seq.wrapping_sub(seq_free(pos)) as i64;
            if diff == 0 {
                // Fails (and retries) if the receiver closed the ring meanwhile: the
                // close bit changes the tail.
                // SeqCst: the claim and the look at the previous slot below pair with
                // the receiver's fence before it goes idle (see `try_push_wake`).
                match s.tail.0.compare_exchange_weak(
                    pos,
                    pos.wrapping_add(1),
                    Ordering::SeqCst,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => break,
                    Err(now) => pos = now,
                }
            } else if diff < 0 {
                // The slot still holds the message of the previous lap: full.
                s.full_rejections.0.fetch_add(1, Ordering::Relaxed);
                return Err(Error::QueueFull {
                    capacity: s.capacity,
                });
            } else {
                // Another producer claimed `pos` already; catch up.
                pos = s.tail.0.load(Ordering::Relaxed);
            }
        }
        // Whether the message before this one was still unread after our claim: then the
        // receiver reads it, and after it this one or our claim (its fence), so it needs
        // no wake-up for this one. Position 0 has no predecessor.
        let prev = pos.wrapping_sub(1);
        let wake =
            pos == 0 || s.seq[(prev & s.mask) as usize].load(Ordering::SeqCst) != seq_written(prev);
        // SAFETY: the CAS made us the only owner of position `pos`; its slot was
        // released by the consumer (seq == 2 pos, acquire) and nobody reads it until we
        // publish seq = 2 pos + 1. The payload fits: checked above.
        unsafe { self.write_claimed(pos, header, payload) };
        Ok(wake)
    }

    /// Writes one message into the slot of position `pos` and publishes it. Nothing
    /// can fail here (the caller checked the payload's size), so a claimed position is
    /// always published and never blocks the ring.
    ///
    /// # Safety
    /// The caller claimed position `pos` (moved the tail past it) and the consumer has
    /// released its slot for this lap (`seq == seq_free(pos)`, seen with acquire).
    /// The payload fits a slot (`check_payload_fits` with the ring's slot size).
    #[inline(always)]
    unsafe fn write_claimed(&self, pos: u64, header: &MessageHeader, payload: &[u8]) {
        let s = &*self.shared;
        debug_assert!(payload.len() <= max_payload(s.slot_size));
        // SAFETY: per this function's contract the slot is ours until we publish it; it
        // spans `slot_size` bytes of `data`.
        let slot = unsafe { std::slice::from_raw_parts_mut(s.slot_ptr(pos), s.slot_size) };
        fill_slot_fitting(slot, header, payload);
        s.seq[(pos & s.mask) as usize].store(seq_written(pos), Ordering::Release);
    }

    /// Pushes the messages of `batch` in order, claiming as many free slots as it can
    /// with one update of the shared tail (instead of one per message), and returns how
    /// many it wrote: the first `n`. `Ok(0)` when the ring is full. A payload that does
    /// not fit a slot ends the batch before it (`MessageTooLarge` if it is the first).
    /// Messages of one batch stay together and in order; other producers' messages
    /// come before or after them. Once the receiver closed the ring:
    /// [`Error::KernelTerminated`].
    ///
    /// ```
    /// use ringkernel_core::message::MessageHeader;
    /// use ringkernel_core::queue::slot::mpsc_slot_channel;
    ///
    /// let (tx, mut rx) = mpsc_slot_channel(4, 128).unwrap();
    /// let h = MessageHeader::new(1, 1);
    /// let batch: Vec<(MessageHeader, &[u8])> = (0..6u8).map(|_| (h, &b"x"[..])).collect();
    /// assert_eq!(tx.try_push_batch(&batch).unwrap(), 4); // the ring holds four
    /// let mut n = 0;
    /// while rx.try_pop().unwrap().is_some() { n += 1; }
    /// assert_eq!(n, 4);
    /// ```
    pub fn try_push_batch(&self, batch: &[(MessageHeader, &[u8])]) -> Result<usize> {
        let s = &*self.shared;
        let fits = batch
            .iter()
            .position(|(_, p)| p.len() > max_payload(s.slot_size))
            .unwrap_or(batch.len());
        if fits == 0 {
            if let Some((_, p)) = batch.first() {
                check_payload_fits(p.len(), s.slot_size)?;
            }
            return Ok(0);
        }
        let batch = &batch[..fits];
        let (pos, n) = loop {
            let pos = s.tail.0.load(Ordering::Relaxed);
            if pos & CLOSED != 0 {
                return Err(closed());
            }
            // The receiver frees a slot (its sequence) before it publishes the head
            // (both release), so every position below `head + capacity` is free.
            let head = s.head.0.load(Ordering::Acquire);
            let free = (s.capacity as u64).saturating_sub(pos.wrapping_sub(head));
            if pos.wrapping_sub(head) > s.capacity as u64 {
                // `pos` is stale (the head moved past it meanwhile): look again.
                std::hint::spin_loop();
                continue;
            }
            if free == 0 {
                // The head may lag its slots by a moment: one message the usual way.
                return match self.try_push(&batch[0].0, batch[0].1) {
                    Ok(()) => Ok(1),
                    Err(Error::QueueFull { .. }) => Ok(0),
                    Err(e) => Err(e),
                };
            }
            let n = free.min(batch.len() as u64);
            if s.tail
                .0
                .compare_exchange_weak(
                    pos,
                    pos.wrapping_add(n),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
            {
                break (pos, n);
            }
        };
        for (i, (h, p)) in batch[..n as usize].iter().enumerate() {
            let at = pos.wrapping_add(i as u64);
            // SAFETY: the CAS claimed positions `pos..pos + n` for us alone, and each is
            // below `head + capacity` for a head read with acquire, so the receiver has
            // released its slot (see above). The payload fits (checked above).
            unsafe { self.write_claimed(at, h, p) };
        }
        Ok(n as usize)
    }

    /// Whether the receiver has closed the ring.
    pub fn is_closed(&self) -> bool {
        self.shared.tail.0.load(Ordering::Acquire) & CLOSED != 0
    }

    /// Slot size in bytes.
    pub fn slot_size(&self) -> usize {
        self.shared.slot_size
    }

    /// Capacity in slots.
    pub fn capacity(&self) -> usize {
        self.shared.capacity
    }

    /// Counters.
    pub fn stats(&self) -> QueueStats {
        self.shared.stats()
    }
}

impl SlotReceiver {
    /// The slot at `head` if its message is complete.
    #[inline]
    fn front(&self) -> Option<&[u8]> {
        let s = &*self.shared;
        let seq = s.seq[(self.head & s.mask) as usize].load(Ordering::Acquire);
        if seq != seq_written(self.head) {
            return None;
        }
        // SAFETY: seq == 2 head + 1 (acquire) means the producer of position `head` has
        // finished writing the slot; no producer touches it until we set the next lap's
        // sequence in `advance`.
        Some(unsafe { std::slice::from_raw_parts(s.slot_ptr(self.head), s.slot_size) })
    }

    #[inline]
    fn advance(&mut self) {
        let s = &*self.shared;
        let pos = self.head;
        s.seq[(pos & s.mask) as usize].store(
            seq_free(pos.wrapping_add(s.capacity as u64)),
            Ordering::Release,
        );
        self.head = pos.wrapping_add(1);
        s.head.0.store(self.head, Ordering::Release);
    }

    /// As [`SlotConsumer::try_pop`]. A message whose producer has claimed its slot but
    /// not finished writing it is not visible yet (`Ok(None)`), and it holds back later
    /// ones so that each producer's order is kept.
    pub fn try_pop(&mut self) -> Result<Option<Envelope>> {
        let index = self.head;
        let Some(bytes) = self.front() else {
            return Ok(None);
        };
        let res = check_slot(bytes, index).map(|header| Envelope {
            header,
            payload: bytes[HEADER_SIZE..HEADER_SIZE + header.payload_len as usize].to_vec(),
        });
        self.advance();
        res.map(Some)
    }

    /// As [`try_pop`](Self::try_pop), into `env`: its header is overwritten and its
    /// payload buffer reused (no allocation once it has grown to the message size).
    /// `Ok(false)` when no message is waiting; a corrupt slot is consumed and reported
    /// as an error (`env` is then unspecified).
    ///
    /// ```
    /// use ringkernel_core::message::{Envelope, MessageHeader};
    /// use ringkernel_core::queue::slot::mpsc_slot_channel;
    ///
    /// let (tx, mut rx) = mpsc_slot_channel(4, 128).unwrap();
    /// tx.try_push(&MessageHeader::new(7, 2), b"hi").unwrap();
    /// let mut env = Envelope::from_bytes(0, &[]);
    /// assert!(rx.try_pop_into(&mut env).unwrap());
    /// assert_eq!((env.header.type_id, &env.payload[..]), (7, &b"hi"[..]));
    /// assert!(!rx.try_pop_into(&mut env).unwrap());
    /// ```
    #[inline]
    pub fn try_pop_into(&mut self, env: &mut Envelope) -> Result<bool> {
        let index = self.head;
        let Some(bytes) = self.front() else {
            return Ok(false);
        };
        // SAFETY: slots are 64-aligned (`data` is, slot_size is a multiple of 64) and
        // the slot stays ours (nobody writes it) until `advance`.
        let res = unsafe { check_ring_slot(bytes, index) }.map(|header| {
            env.header = *header;
            env.payload.clear();
            env.payload
                .extend_from_slice(&bytes[HEADER_SIZE..HEADER_SIZE + header.payload_len as usize]);
        });
        self.advance();
        res.map(|()| true)
    }

    /// As [`SlotConsumer::try_pop_with`].
    pub fn try_pop_with<R>(
        &mut self,
        f: impl FnOnce(&MessageHeader, &[u8]) -> R,
    ) -> Result<Option<R>> {
        let index = self.head;
        let Some(bytes) = self.front() else {
            return Ok(None);
        };
        // SAFETY: slots are 64-aligned (`data` is, slot_size is a multiple of 64) and
        // the slot stays ours (nobody writes it) until `advance`.
        let res = unsafe { check_ring_slot(bytes, index) }.map(|header| {
            f(
                header,
                &bytes[HEADER_SIZE..HEADER_SIZE + header.payload_len as usize],
            )
        });
        self.advance();
        res.map(Some)
    }

    /// As [`SlotConsumer::pop_with`]: in place, corrupt slots logged and skipped.
    pub fn pop_with<R>(&mut self, f: impl FnOnce(&MessageHeader, &[u8]) -> R) -> Option<R> {
        let mut f = Some(f);
        loop {
            match self.try_pop_with(|h, p| f.take().map(|f| f(h, p))) {
                Ok(Some(r)) => return r,
                Ok(None) => return None,
                Err(e) => tracing::warn!(error = %e, "dropping corrupt message slot"),
            }
        }
    }

    /// Closes the ring: from now on every push fails with [`Error::KernelTerminated`].
    /// Returns how many messages are still to take: those waiting, and those whose
    /// producers claimed a slot before the close and are still writing them (they
    /// become visible shortly; [`is_complete`](Self::is_complete) says when all are).
    /// Closing twice changes nothing.
    ///
    /// ```
    /// use ringkernel_core::message::MessageHeader;
    /// use ringkernel_core::queue::slot::mpsc_slot_channel;
    ///
    /// let (tx, mut rx) = mpsc_slot_channel(4, 128).unwrap();
    /// tx.try_push(&MessageHeader::new(1, 0), b"").unwrap();
    /// assert_eq!(rx.close(), 1);
    /// assert!(tx.try_push(&MessageHeader::new(1, 0), b"").is_err());
    /// assert!(rx.is_complete() && rx.try_pop().unwrap().is_some());
    /// ```
    pub fn close(&mut self) -> usize {
        let tail = self.shared.tail.0.fetch_or(CLOSED, Ordering::AcqRel) & !CLOSED;
        tail.wrapping_sub(self.head) as usize
    }

    /// Whether every message whose slot was claimed so far is written (after
    /// [`close`](Self::close): whether popping until empty takes every message the ring
    /// will ever hold).
    pub fn is_complete(&self) -> bool {
        let s = &*self.shared;
        let tail = s.tail.0.load(Ordering::Acquire) & !CLOSED;
        let mut pos = self.head;
        while pos != tail {
            if s.seq[(pos & s.mask) as usize].load(Ordering::Acquire) != seq_written(pos) {
                return false;
            }
            pos = pos.wrapping_add(1);
        }
        true
    }

    /// Messages waiting (including ones whose producers are still writing them).
    pub fn len(&self) -> usize {
        let tail = self.shared.tail.0.load(Ordering::Acquire) & !CLOSED;
        (tail.wrapping_sub(self.head) as usize).min(self.shared.capacity)
    }

    /// Whether no message is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Capacity in slots.
    pub fn capacity(&self) -> usize {
        self.shared.capacity
    }

    /// Slot size in bytes.
    pub fn slot_size(&self) -> usize {
        self.shared.slot_size
    }

    /// Counters.
    pub fn stats(&self) -> QueueStats {
        self.shared.stats()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hdr(id: u64) -> MessageHeader {
        let mut h = MessageHeader::new(9, 0);
        h.message_id = id;
        h
    }

    #[test]
    fn spsc_fills_and_drains_in_order() {
        let (mut tx, mut rx) = slot_channel(4, 128).unwrap();
        for i in 0..4u64 {
            tx.try_push(&hdr(i), &i.to_le_bytes()).unwrap();
        }
        assert_eq!(
            tx.try_push(&hdr(9), b"x"),
            Err(Error::QueueFull { capacity: 4 })
        );
        assert_eq!(rx.len(), 4);
        let s = rx.stats();
        assert_eq!(
            (s.enqueued, s.dequeued, s.full_rejections, s.depth),
            (4, 0, 1, 4)
        );
        for i in 0..4u64 {
            let e = rx.try_pop().unwrap().unwrap();
            assert_eq!(e.header.message_id, i);
            assert_eq!(e.payload, i.to_le_bytes());
        }
        assert!(rx.try_pop().unwrap().is_none());
        assert_eq!(tx.free(), 4);
    }

    #[test]
    fn too_large_changes_nothing() {
        let (mut tx, rx) = slot_channel(2, 128).unwrap();
        let big = [0u8; 65];
        assert_eq!(
            tx.try_push(&hdr(1), &big),
            Err(Error::MessageTooLarge { size: 65, max: 64 })
        );
        assert_eq!(rx.stats().enqueued, 0);
        let (tx, rx) = mpsc_slot_channel(2, 128).unwrap();
        assert_eq!(
            tx.try_push(&hdr(1), &big),
            Err(Error::MessageTooLarge { size: 65, max: 64 })
        );
        assert_eq!(rx.stats().enqueued, 0);
        assert!(rx.is_empty());
    }

    #[test]
    fn bad_sizes_are_rejected() {
        assert!(matches!(
            slot_channel(3, 256),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            slot_channel(4, 100),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            slot_channel(4, 64),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            mpsc_slot_channel(0, 256),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            mpsc_slot_channel(8, 96),
            Err(Error::InvalidArgument(_))
        ));
    }
}
