//! Typed lock-free single-producer/single-consumer ring.
//!
//! ```
//! let (mut tx, mut rx) = ringkernel_core::queue::spsc::channel::<u64>(8).unwrap();
//! tx.push(7).unwrap();
//! assert_eq!(rx.pop(), Some(7));
//! ```

use super::QueueStats;
use crate::error::Result;

/// Creates a ring of `capacity` items (a power of two).
pub fn channel<T: Send>(capacity: usize) -> Result<(Producer<T>, Consumer<T>)> {
    todo!("queue helper: implement")
}

/// The producing half. Not `Clone`: one producer.
pub struct Producer<T> {
    _p: std::marker::PhantomData<T>,
}

/// The consuming half. Not `Clone`: one consumer.
pub struct Consumer<T> {
    _p: std::marker::PhantomData<T>,
}

impl<T: Send> Producer<T> {
    /// Pushes `value`; when the ring is full it is handed back in `Err`.
    pub fn push(&mut self, value: T) -> std::result::Result<(), T> {
        todo!()
    }
    /// Free slots (a lower bound: the consumer may free more meanwhile).
    pub fn free(&self) -> usize {
        todo!()
    }
    /// Capacity in items.
    pub fn capacity(&self) -> usize {
        todo!()
    }
    /// Counters.
    pub fn stats(&self) -> QueueStats {
        todo!()
    }
}

impl<T: Send> Consumer<T> {
    /// Pops the oldest item, if any.
    pub fn pop(&mut self) -> Option<T> {
        todo!()
    }
    /// Items waiting (a lower bound: the producer may add more meanwhile).
    pub fn len(&self) -> usize {
        todo!()
    }
    /// Whether no item is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Counters.
    pub fn stats(&self) -> QueueStats {
        todo!()
    }
}
