//! Typed lock-free multi-producer/single-consumer ring (bounded).
//!
//! ```
//! let (tx, mut rx) = ringkernel_core::queue::mpsc::channel::<u32>(4).unwrap();
//! let tx2 = tx.clone();
//! tx.push(1).unwrap();
//! tx2.push(2).unwrap();
//! assert_eq!(rx.pop(), Some(1));
//! assert_eq!(rx.pop(), Some(2));
//! ```
//!
//! This is Dmitry Vyukov's bounded queue specialised to one consumer: every slot carries
//! a sequence number. Slot `i` is free for position `pos` when its sequence is `2 pos`,
//! holds the item of `pos` when it is `2 pos + 1`, and is handed to the next lap
//! (`2 (pos + capacity)`) once the consumer has taken the item out. (Vyukov's original
//! uses `pos`, `pos + 1` and `pos + capacity`, which coincide when the capacity is 1;
//! doubling keeps the three states distinct for every capacity, and `loom` found the
//! difference.) Producers claim positions with a CAS on `tail`; the consumer needs no
//! read-modify-write at all. Items of one producer come out in the order that producer
//! pushed them.

use super::{check_capacity, QueueStats};
use crate::error::Result;
use crate::sync::{Arc, AtomicU64, AtomicUsize, CachePadded, Ordering, UnsafeCell};
use std::mem::MaybeUninit;

/// Creates a ring of `capacity` items (a power of two).
pub fn channel<T: Send>(capacity: usize) -> Result<(Sender<T>, Receiver<T>)> {
    check_capacity(capacity)?;
    let slots: Box<[Slot<T>]> = (0..capacity)
        .map(|i| Slot {
            seq: AtomicUsize::new(i.wrapping_mul(2)),
            value: UnsafeCell::new(MaybeUninit::uninit()),
        })
        .collect();
    let shared = Arc::new(Shared {
        tail: CachePadded(AtomicUsize::new(0)),
        head: CachePadded(AtomicUsize::new(0)),
        full_rejections: CachePadded(AtomicU64::new(0)),
        slots,
        mask: capacity - 1,
    });
    Ok((
        Sender {
            shared: shared.clone(),
        },
        Receiver { shared, head: 0 },
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

struct Shared<T> {
    /// Next position to claim.
    tail: CachePadded<AtomicUsize>,
    /// Positions consumed (written by the receiver only).
    head: CachePadded<AtomicUsize>,
    full_rejections: CachePadded<AtomicU64>,
    slots: Box<[Slot<T>]>,
    mask: usize,
}

// SAFETY: items move from producer threads to the consumer thread (`T: Send`); every
// slot's contents are accessed by exactly one party at a time, as handed over by the
// slot's sequence number (release stores, acquire loads).
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
        let enqueued = self.tail.load(Ordering::Acquire);
        QueueStats {
            enqueued: enqueued as u64,
            dequeued: dequeued as u64,
            full_rejections: self.full_rejections.load(Ordering::Relaxed),
            depth: enqueued.wrapping_sub(dequeued).min(self.capacity()),
            capacity: self.capacity(),
        }
    }
}

impl<T> Drop for Shared<T> {
    fn drop(&mut self) {
        // Every handle is gone, so every claimed position was also filled (a push
        // cannot stop between claiming and publishing) and `&mut self` is exclusive.
        let mut pos = self.head.load(Ordering::Acquire);
        let tail = self.tail.load(Ordering::Acquire);
        while pos != tail {
            let slot = &self.slots[pos & self.mask];
            if slot.seq.load(Ordering::Acquire) == written(pos) {
                // SAFETY: sequence 2 pos + 1 means the slot holds the initialised item of
                // position `pos`, which was never popped.
                slot.value.with_mut(|p| unsafe { (*p).assume_init_drop() });
            }
            pos = pos.wrapping_add(1);
        }
    }
}

/// A producing handle; clone it for more producers.
pub struct Sender<T> {
    shared: Arc<Shared<T>>,
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        Sender {
            shared: self.shared.clone(),
        }
    }
}

/// The single consuming handle.
pub struct Receiver<T> {
    shared: Arc<Shared<T>>,
    /// Private copy of `shared.head`.
    head: usize,
}

impl<T> std::fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sender")
            .field("stats", &self.shared.stats())
            .finish()
    }
}

impl<T> std::fmt::Debug for Receiver<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiver")
            .field("stats", &self.shared.stats())
            .finish()
    }
}

impl<T: Send> Sender<T> {
    /// Pushes `value`; when the ring is full it is handed back in `Err`.
    pub fn push(&self, value: T) -> std::result::Result<(), T> {
        let s = &*self.shared;
        let mut pos = s.tail.load(Ordering::Relaxed);
        let slot = loop {
            let slot = &s.slots[pos & s.mask];
            let seq = slot.seq.load(Ordering::Acquire);
            let diff = seq.wrapping_sub(free(pos)) as isize;
            if diff == 0 {
                match s.tail.compare_exchange_weak(
                    pos,
                    pos.wrapping_add(1),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => break slot,
                    Err(now) => pos = now,
                }
            } else if diff < 0 {
                // The slot still holds the item of the previous lap: the ring is full.
                s.full_rejections.fetch_add(1, Ordering::Relaxed);
                return Err(value);
            } else {
                // Another producer took `pos`; catch up with the tail.
                pos = s.tail.load(Ordering::Relaxed);
            }
        };
        // SAFETY: the CAS made this thread the only owner of position `pos`; the slot's
        // sequence (acquired) says the consumer has released it, and nobody reads it
        // until we publish `written(pos)` below.
        slot.value.with_mut(|p| unsafe { (*p).write(value) });
        slot.seq.store(written(pos), Ordering::Release);
        Ok(())
    }

    /// Capacity in items.
    pub fn capacity(&self) -> usize {
        self.shared.capacity()
    }

    /// Counters.
    pub fn stats(&self) -> QueueStats {
        self.shared.stats()
    }
}

impl<T: Send> Receiver<T> {
    /// Pops the oldest item, if any. An item whose producer has claimed its position
    /// but not finished writing it is not visible yet, and holds back later ones.
    pub fn pop(&mut self) -> Option<T> {
        let s = &*self.shared;
        let pos = self.head;
        let slot = &s.slots[pos & s.mask];
        if slot.seq.load(Ordering::Acquire) != written(pos) {
            return None;
        }
        // SAFETY: sequence `written(pos)` (acquired) means the producer of `pos` finished
        // writing; no producer touches the slot until we hand it to the next lap.
        let value = slot.value.with(|p| unsafe { (*p).assume_init_read() });
        slot.seq
            .store(free(pos.wrapping_add(s.capacity())), Ordering::Release);
        self.head = pos.wrapping_add(1);
        s.head.store(self.head, Ordering::Release);
        Some(value)
    }

    /// Items waiting now (including ones whose producers are still writing them).
    pub fn len(&self) -> usize {
        self.shared
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

    /// Counters.
    pub fn stats(&self) -> QueueStats {
        self.shared.stats()
    }
}
