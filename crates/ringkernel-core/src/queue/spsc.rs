//! Typed lock-free single-producer/single-consumer ring.
//!
//! ```
//! let (mut tx, mut rx) = ringkernel_core::queue::spsc::channel::<u64>(8).unwrap();
//! tx.push(7).unwrap();
//! assert_eq!(rx.pop(), Some(7));
//! ```
//!
//! Each slot carries a sequence number next to the item, so neither side reads the
//! other side's index on the hot path: the producer checks that the slot at its tail
//! has been freed, the consumer that the slot at its head has been filled, and each
//! hands the slot over with one release store of its sequence. A push or pop touches
//! one shared cache line, the slot's (several items share a line), where an
//! index-based ring (such as `rtrb`) also bounces the other side's index line whenever
//! the ring runs near empty, the usual state of a consumer that keeps up. Each side
//! also publishes its count on its own cache-line pair for `len`, `free` and `stats`;
//! nothing reads those on the hot path.
//!
//! Sequence encoding, for position `pos` of a slot: `2 pos` = free for `pos`,
//! `2 pos + 1` = holds the item of `pos`; after the pop it becomes
//! `2 (pos + capacity)`. (Doubling keeps the states apart even for capacity 1.)

use super::{check_capacity, QueueStats};
use crate::error::Result;
use crate::sync::{Arc, AtomicU64, AtomicUsize, CachePadded, Ordering, UnsafeCell};
use std::mem::MaybeUninit;

/// Creates a ring of `capacity` items (a power of two).
pub fn channel<T: Send>(capacity: usize) -> Result<(Producer<T>, Consumer<T>)> {
    check_capacity(capacity)?;
    let slots: Box<[Slot<T>]> = (0..capacity)
        .map(|i| Slot {
            seq: AtomicUsize::new(free(i)),
            value: UnsafeCell::new(MaybeUninit::uninit()),
        })
        .collect();
    let shared = Arc::new(Shared {
        head: CachePadded(AtomicUsize::new(0)),
        tail: CachePadded(ProducerLine {
            tail: AtomicUsize::new(0),
            full_rejections: AtomicU64::new(0),
        }),
        slots,
        mask: capacity - 1,
    });
    Ok((
        Producer {
            shared: shared.clone(),
            tail: 0,
        },
        Consumer { shared, head: 0 },
    ))
}

/// Sequence of a slot that is free for position `pos`.
#[inline(always)]
fn free(pos: usize) -> usize {
    pos.wrapping_mul(2)
}

/// Sequence of a slot that holds the item of position `pos`.
#[inline(always)]
fn written(pos: usize) -> usize {
    pos.wrapping_mul(2).wrapping_add(1)
}

struct Slot<T> {
    seq: AtomicUsize,
    value: UnsafeCell<MaybeUninit<T>>,
}

/// The producer's published counters (one cache-line pair, written by the producer).
struct ProducerLine {
    /// Items pushed so far.
    tail: AtomicUsize,
    /// Pushes refused because the ring was full.
    full_rejections: AtomicU64,
}

struct Shared<T> {
    /// Items popped so far (written by the consumer only).
    head: CachePadded<AtomicUsize>,
    /// Items pushed so far and full rejections (written by the producer only).
    tail: CachePadded<ProducerLine>,
    slots: Box<[Slot<T>]>,
    mask: usize,
}

// SAFETY: the ring moves `T`s from the producer's thread to the consumer's, which needs
// `T: Send`; each slot's value is accessed by one side at a time, as handed over by the
// slot's sequence number (release store, acquire load), so sharing `&Shared` across
// threads is sound.
unsafe impl<T: Send> Send for Shared<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for Shared<T> {}

impl<T> Shared<T> {
    #[inline(always)]
    fn capacity(&self) -> usize {
        self.mask + 1
    }

    fn stats(&self) -> QueueStats {
        let dequeued = self.head.load(Ordering::Acquire);
        let enqueued = self.tail.0.tail.load(Ordering::Acquire);
        QueueStats {
            enqueued: enqueued as u64,
            dequeued: dequeued as u64,
            full_rejections: self.tail.0.full_rejections.load(Ordering::Relaxed),
            depth: enqueued.wrapping_sub(dequeued).min(self.capacity()),
            capacity: self.capacity(),
        }
    }
}

impl<T> Drop for Shared<T> {
    fn drop(&mut self) {
        // Both halves are gone (the last Arc is being dropped, which synchronises with
        // the other half's final stores), so `&mut self` is exclusive and the published
        // counts are exact: every push and pop stores its count before returning.
        let head = self.head.load(Ordering::Acquire);
        let tail = self.tail.0.tail.load(Ordering::Acquire);
        let mut pos = head;
        while pos != tail {
            let slot = &self.slots[pos & self.mask];
            debug_assert_eq!(slot.seq.load(Ordering::Relaxed), written(pos));
            // SAFETY: positions in [head, tail) were pushed and never popped, so each
            // slot holds an initialised `T` that nobody else will drop.
            slot.value.with_mut(|p| unsafe { (*p).assume_init_drop() });
            pos = pos.wrapping_add(1);
        }
    }
}

/// The producing half. Not `Clone`: one producer.
pub struct Producer<T> {
    shared: Arc<Shared<T>>,
    /// Items pushed so far (private copy of the published count).
    tail: usize,
}

/// The consuming half. Not `Clone`: one consumer.
pub struct Consumer<T> {
    shared: Arc<Shared<T>>,
    /// Items popped so far (private copy of the published count).
    head: usize,
}

impl<T> std::fmt::Debug for Producer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer")
            .field("stats", &self.shared.stats())
            .finish()
    }
}

impl<T> std::fmt::Debug for Consumer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("stats", &self.shared.stats())
            .finish()
    }
}

impl<T: Send> Producer<T> {
    /// Pushes `value`; when the ring is full it is handed back in `Err`.
    #[inline]
    pub fn push(&mut self, value: T) -> std::result::Result<(), T> {
        let shared = &*self.shared;
        let pos = self.tail;
        let slot = &shared.slots[pos & shared.mask];
        if slot.seq.load(Ordering::Acquire) != free(pos) {
            // Still holds the item of `pos - capacity`: full.
            self.push_full();
            return Err(value);
        }
        // SAFETY: the slot is free for `pos` (acquire load above: the consumer finished
        // moving the previous item out before it released the slot), and no one else
        // writes it: we are the only producer, and the consumer will not read it until
        // we store `written(pos)`.
        slot.value.with_mut(|p| unsafe { (*p).write(value) });
        slot.seq.store(written(pos), Ordering::Release);
        self.tail = pos.wrapping_add(1);
        shared.tail.0.tail.store(self.tail, Ordering::Release);
        Ok(())
    }

    #[cold]
    fn push_full(&self) {
        let c = &self.shared.tail.0.full_rejections;
        // Only the producer writes the counter, so load + store is not a lost update.
        c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }

    /// Free slots (a lower bound: the consumer may free more meanwhile).
    pub fn free(&self) -> usize {
        let head = self.shared.head.load(Ordering::Acquire);
        self.shared
            .capacity()
            .saturating_sub(self.tail.wrapping_sub(head))
    }

    /// Capacity in items.
    pub fn capacity(&self) -> usize {
        self.shared.capacity()
    }

    /// Whether the consumer has been dropped (nothing pushed now will be popped).
    pub fn is_abandoned(&self) -> bool {
        Arc::strong_count(&self.shared) < 2
    }

    /// Counters.
    pub fn stats(&self) -> QueueStats {
        self.shared.stats()
    }
}

impl<T: Send> Consumer<T> {
    /// Pops the oldest item, if any.
    #[inline]
    pub fn pop(&mut self) -> Option<T> {
        let shared = &*self.shared;
        let pos = self.head;
        let slot = &shared.slots[pos & shared.mask];
        if slot.seq.load(Ordering::Acquire) != written(pos) {
            return None;
        }
        // SAFETY: the slot holds the item of `pos` (acquire load of `written(pos)`
        // above), and the producer will not touch it until we free it below; reading
        // moves the value out and the slot counts as uninitialised from then on.
        let value = slot.value.with(|p| unsafe { (*p).assume_init_read() });
        slot.seq
            .store(free(pos.wrapping_add(shared.capacity())), Ordering::Release);
        self.head = pos.wrapping_add(1);
        shared.head.store(self.head, Ordering::Release);
        Some(value)
    }

    /// The oldest item, without removing it.
    pub fn peek(&mut self) -> Option<&T> {
        let shared = &*self.shared;
        let slot = &shared.slots[self.head & shared.mask];
        if slot.seq.load(Ordering::Acquire) != written(self.head) {
            return None;
        }
        // SAFETY: as in `pop`, the slot holds an initialised `T`, which stays put while
        // `&mut self` is borrowed (only `pop` frees the slot).
        Some(slot.value.with(|p| unsafe { (*p).assume_init_ref() }))
    }

    /// Items waiting (a lower bound: the producer may add more meanwhile).
    pub fn len(&self) -> usize {
        self.shared
            .tail
            .0
            .tail
            .load(Ordering::Acquire)
            .wrapping_sub(self.head)
            .min(self.shared.capacity())
    }

    /// Whether no item is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Capacity in items.
    pub fn capacity(&self) -> usize {
        self.shared.capacity()
    }

    /// Whether the producer has been dropped (once empty, nothing more will come).
    pub fn is_abandoned(&self) -> bool {
        Arc::strong_count(&self.shared) < 2
    }

    /// Counters.
    pub fn stats(&self) -> QueueStats {
        self.shared.stats()
    }
}
